//! Job secret, TLS and mutual TLS: jobs that match work, every mismatch is
//! refused with an error that says which, and an authenticated job keeps
//! running while strangers knock on its ports. Certificates are made here
//! with rcgen. Everything runs over loopback in this process.

mod common;

use rcgen::{CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use ringwire::store::{StoreClient, StoreError, StoreServer};
use ringwire::wire::{self, FrameKind, HEADER_LEN, Header, Hello, HelloAck};
use ringwire::{Communicator, ReduceOp, Security, TlsConfig, TlsMode};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// A throwaway certificate authority.
struct Pki {
    ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Pki {
    fn new(name: &str) -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Pki {
            ca_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A leaf certificate for 127.0.0.1 (PEM cert, PEM key).
    fn leaf(&self, expired: bool) -> (String, String) {
        let mut params = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "ringwire rank");
        if expired {
            params.not_before = rcgen::date_time_ymd(2000, 1, 1);
            params.not_after = rcgen::date_time_ymd(2001, 1, 1);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// TLS settings trusting this CA, with a fresh leaf from `issuer`.
    fn tls(&self, mode: TlsMode, issuer: &Pki, expired: bool) -> TlsConfig {
        let (cert, key) = issuer.leaf(expired);
        TlsConfig::from_pem(
            mode,
            self.ca_pem.as_bytes(),
            cert.as_bytes(),
            key.as_bytes(),
        )
        .unwrap()
    }
}

fn sec(tls: Option<TlsConfig>, secret: Option<&str>) -> Security {
    Security::none()
        .with_tls(tls)
        .with_secret(secret.unwrap_or(""))
}

/// Builds `world` ranks in this process with a store secured by
/// `store_sec`, rank r using `rank_sec(r)`.
fn group(
    world: usize,
    store_sec: Security,
    rank_sec: impl Fn(usize) -> Security + Sync,
    timeout: Duration,
) -> (StoreServer, Vec<Result<Communicator, ringwire::Error>>) {
    common::init_logging();
    let store = StoreServer::bind_with("127.0.0.1:0".parse().unwrap(), store_sec).unwrap();
    let addr = store.local_addr();
    let comms = std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let b = Communicator::builder()
                    .rank(rank)
                    .world_size(world)
                    .store_addr(addr)
                    .host_store(false)
                    .timeout(timeout)
                    .connect_timeout(Duration::from_secs(10))
                    .security(rank_sec(rank));
                s.spawn(move || b.build().wait())
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    (store, comms)
}

fn ok(comms: Vec<Result<Communicator, ringwire::Error>>) -> Vec<Communicator> {
    let errors: Vec<String> = comms
        .iter()
        .enumerate()
        .filter_map(|(rank, c)| c.as_ref().err().map(|e| format!("rank {rank}: {e}")))
        .collect();
    assert!(errors.is_empty(), "build failed:\n{}", errors.join("\n"));
    comms.into_iter().map(Result::unwrap).collect()
}

/// Every rank all-reduces `n` copies of its rank + 1; checks the sums.
fn check_all_reduce(comms: &[Communicator], n: usize) {
    let world = comms.len();
    let want = (world * (world + 1) / 2) as f32;
    let results = common::on_all(comms, |c| {
        c.all_reduce(vec![(c.rank() + 1) as f32; n], ReduceOp::Sum)
            .wait()
    });
    for r in results {
        let v = r.expect("all_reduce");
        assert!(v.iter().all(|&x| x == want), "wrong sum");
    }
}

/// What rank `rank` published in the store under `what` (`addr`, `local`).
fn published(store: &StoreServer, sec: &Security, what: &str, rank: usize) -> String {
    let c = StoreClient::connect_with(&[store.local_addr()], Duration::from_secs(5), sec).unwrap();
    let raw = c
        .get(
            &format!("ringwire/default/{what}/{rank}"),
            Duration::from_secs(5),
        )
        .unwrap();
    String::from_utf8(raw).unwrap()
}

/// A rank's published listen address.
fn rank_addr(store: &StoreServer, sec: &Security, rank: usize) -> SocketAddr {
    published(store, sec, "addr", rank).parse().unwrap()
}

/// One whole control frame, checked by `decode_frame`; its header and payload.
fn read_frame(s: &mut impl Read) -> std::io::Result<(Header, Vec<u8>)> {
    let mut frame = vec![0u8; HEADER_LEN];
    s.read_exact(&mut frame)?;
    let h = Header::decode(&frame, wire::MAX_CONTROL_PAYLOAD).map_err(std::io::Error::other)?;
    frame.resize(h.frame_len(), 0);
    s.read_exact(&mut frame[HEADER_LEN..])?;
    wire::decode_frame(&frame, wire::MAX_CONTROL_PAYLOAD).map_err(std::io::Error::other)?;
    let start = h.payload_offset();
    Ok((h, frame[start..start + h.payload_len_usize()].to_vec()))
}

#[test]
fn mtls_job_of_three_ranks_runs_collectives() {
    let pki = Pki::new("job CA");
    let store_sec = sec(Some(pki.tls(TlsMode::Mutual, &pki, false)), Some("s3cret"));
    let (_store, comms) = group(
        3,
        store_sec,
        |_| sec(Some(pki.tls(TlsMode::Mutual, &pki, false)), Some("s3cret")),
        Duration::from_secs(20),
    );
    let comms = ok(comms);
    check_all_reduce(&comms, 10);
    // Large enough for the ring, many TLS records, both directions at once.
    check_all_reduce(&comms, 3 << 20);
    // TLS sessions run over TCP, even between ranks on one host.
    assert_eq!(comms[0].link_kind(1), Some("tcp"));
}

#[test]
fn right_secret_works_without_tls() {
    let (_store, comms) = group(
        2,
        sec(None, Some("k")),
        |_| sec(None, Some("k")),
        Duration::from_secs(20),
    );
    check_all_reduce(&ok(comms), 1 << 16);
}

#[test]
fn rank_with_foreign_ca_is_refused() {
    let pki = Pki::new("job CA");
    let other = Pki::new("someone else's CA");
    // One-way TLS, so the store (which sees no client certificates) lets
    // rank 1 in; its link certificate is from another CA.
    let store_sec = sec(Some(pki.tls(TlsMode::Tls, &pki, false)), None);
    let (_store, comms) = group(
        2,
        store_sec,
        |r| {
            let issuer = if r == 1 { &other } else { &pki };
            sec(Some(pki.tls(TlsMode::Tls, issuer, false)), None)
        },
        Duration::from_secs(3),
    );
    let comms = ok(comms);
    let results = common::on_all(&comms, |c| {
        c.all_reduce(vec![1f32; 4], ReduceOp::Sum).wait()
    });
    let e0 = results[0].as_ref().unwrap_err().to_string();
    assert!(e0.contains("not signed by this job's CA"), "{e0}");
    // The accepting side's op names the refused connection, not only a timeout.
    let e1 = results[1].as_ref().unwrap_err().to_string();
    eprintln!("rank 1: {e1}");
    assert!(
        e1.contains("meanwhile") && e1.contains("at rank 1's link listener"),
        "{e1}"
    );
    // Why: the certificate, or (when the dialer's alert is lost to the
    // connection's reset) the dialer hanging up mid-TLS, which names it.
    assert!(e1.contains("certificate"), "{e1}");
}

#[test]
fn plaintext_and_wrong_secret_dialers_are_refused_by_links() {
    let pki = Pki::new("job CA");
    let tls_sec = sec(Some(pki.tls(TlsMode::Mutual, &pki, false)), None);
    let (store, comms) = group(
        2,
        tls_sec.clone(),
        |_| sec(Some(pki.tls(TlsMode::Mutual, &pki, false)), None),
        Duration::from_secs(20),
    );
    let comms = ok(comms);
    let addr = rank_addr(&store, &tls_sec, 1);
    // A plaintext hello at a TLS rank: refused in plaintext, saying why.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&wire::encode_hello(0, 0, &Hello::new(1, 0, 2)).unwrap())
        .unwrap();
    let (h, p) = read_frame(&mut s).unwrap();
    assert_eq!(h.kind, FrameKind::HandshakeAck);
    let ack = HelloAck::decode(&p).unwrap();
    assert!(!ack.accepted);
    assert!(ack.reason.contains("requires TLS"), "{}", ack.reason);
    check_all_reduce(&comms, 100);

    // A dialer with the wrong secret at a secret job: refused after the
    // challenge-response.
    let (store, comms) = group(
        2,
        sec(None, Some("right")),
        |_| sec(None, Some("right")),
        Duration::from_secs(20),
    );
    let comms = ok(comms);
    let addr = rank_addr(&store, &sec(None, Some("right")), 1);
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // A hello from rank 0 of the right job (the job id is in the store,
    // but a stranger cannot read it without the secret either: use 0 and
    // expect a refusal for the job or for the secret).
    let hello = Hello {
        security: wire::handshake::SECURITY_SECRET,
        auth: vec![7; 32],
        ..Hello::new(0, 0, 2)
    };
    s.write_all(&wire::encode_hello(0, 0, &hello).unwrap())
        .unwrap();
    let (_, p) = read_frame(&mut s).unwrap();
    let ack = HelloAck::decode(&p).unwrap();
    if ack.accepted {
        // Right job id by chance: then the proof must fail.
        let answer = HelloAck::accept()
            .with_security(wire::handshake::SECURITY_SECRET)
            .with_auth(vec![0; 32]);
        s.write_all(&wire::encode_hello_ack(0, 0, &answer)).unwrap();
        let (_, p) = read_frame(&mut s).unwrap();
        let fin = HelloAck::decode(&p).unwrap();
        assert!(
            !fin.accepted && fin.reason.contains("secret"),
            "{}",
            fin.reason
        );
    } else {
        assert!(!ack.reason.is_empty());
    }
    // A plaintext hello without the secret: refused for the mode.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&wire::encode_hello(0, 0, &Hello::new(0, 0, 2)).unwrap())
        .unwrap();
    let (_, p) = read_frame(&mut s).unwrap();
    let ack = HelloAck::decode(&p).unwrap();
    assert!(!ack.accepted);
    check_all_reduce(&comms, 100);
}

#[test]
fn rank_with_wrong_secret_cannot_join() {
    let (_store, comms) = group(
        2,
        sec(None, Some("right")),
        |r| sec(None, Some(if r == 1 { "wrong" } else { "right" })),
        Duration::from_secs(3),
    );
    let e = comms[1].as_ref().unwrap_err().to_string();
    assert!(e.contains("secret"), "{e}");
}

#[test]
fn store_refuses_wrong_or_missing_secret() {
    let store =
        StoreServer::bind_with("127.0.0.1:0".parse().unwrap(), sec(None, Some("a"))).unwrap();
    let addrs = [store.local_addr()];
    let t = Duration::from_secs(5);
    let e = StoreClient::connect_with(&addrs, t, &sec(None, Some("b"))).unwrap_err();
    assert!(matches!(e, StoreError::Security { .. }), "{e}");
    assert!(
        e.to_string().contains("does not know this job's secret"),
        "{e}"
    );
    let plain = StoreClient::connect(&addrs, t).unwrap();
    let e = plain.num_keys().unwrap_err().to_string();
    assert!(e.contains("requires the job secret"), "{e}");
    let good = StoreClient::connect_with(&addrs, t, &sec(None, Some("a"))).unwrap();
    good.set("k", b"v").unwrap();
    assert_eq!(good.get("k", t).unwrap(), b"v");
    // A client with a secret at a store without one.
    let open = StoreServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let e = StoreClient::connect_with(&[open.local_addr()], t, &sec(None, Some("a")))
        .unwrap_err()
        .to_string();
    assert!(e.contains("does not run the job-secret check"), "{e}");
}

#[test]
fn store_refuses_tls_mismatches_and_bad_certificates() {
    let pki = Pki::new("job CA");
    let other = Pki::new("other CA");
    let t = Duration::from_secs(5);
    let store = StoreServer::bind_with(
        "127.0.0.1:0".parse().unwrap(),
        sec(Some(pki.tls(TlsMode::Mutual, &pki, false)), None),
    )
    .unwrap();
    let addrs = [store.local_addr()];
    // Plaintext client at a TLS store.
    let plain = StoreClient::connect(&addrs, t).unwrap();
    let e = plain.num_keys().unwrap_err().to_string();
    assert!(e.contains("requires TLS"), "{e}");
    // The right CA and a fresh certificate: works.
    let good = StoreClient::connect_with(
        &addrs,
        t,
        &sec(Some(pki.tls(TlsMode::Mutual, &pki, false)), None),
    )
    .unwrap();
    assert_eq!(good.num_keys().unwrap(), 0);
    // Refusals surface at connect or at the first request (TLS 1.3 clients
    // finish their handshake before the server has checked them).
    let refused = |s: Security| -> String {
        match StoreClient::connect_with(&addrs, t, &s) {
            Err(e) => e.to_string(),
            Ok(c) => c.num_keys().unwrap_err().to_string(),
        }
    };
    let e = refused(sec(Some(pki.tls(TlsMode::Mutual, &other, false)), None));
    assert!(
        e.contains("not signed by its CA") || e.contains("certificate"),
        "{e}"
    );
    let e = refused(sec(Some(pki.tls(TlsMode::Mutual, &pki, true)), None));
    assert!(e.contains("expired"), "{e}");
    let e = refused(sec(Some(pki.tls(TlsMode::Tls, &pki, false)), None));
    assert!(
        e.contains("mutual TLS") || e.contains("no certificate"),
        "{e}"
    );
    // A client trusting another CA refuses the store's certificate.
    let e = refused(sec(Some(other.tls(TlsMode::Mutual, &other, false)), None));
    assert!(e.contains("not signed by this job's CA"), "{e}");
    // A TLS client at a plaintext store.
    let open = StoreServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let e = StoreClient::connect_with(
        &[open.local_addr()],
        t,
        &sec(Some(pki.tls(TlsMode::Mutual, &pki, false)), None),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("has TLS off"), "{e}");
}

#[test]
fn authenticated_job_keeps_working_while_strangers_hammer_its_ports() {
    let pki = Pki::new("job CA");
    let mk = || sec(Some(pki.tls(TlsMode::Mutual, &pki, false)), Some("k"));
    let store_sec = mk();
    let (store, comms) = group(3, store_sec.clone(), |_| mk(), Duration::from_secs(20));
    let comms = ok(comms);
    let mut targets: Vec<SocketAddr> = (0..3).map(|r| rank_addr(&store, &store_sec, r)).collect();
    targets.push(store.local_addr());
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let hello = wire::encode_hello(0, 0, &Hello::new(0, 0, 3)).unwrap();
            let client_hello_ish = [22u8, 3, 1, 0, 5, 1, 0, 0, 1, 0];
            let deadline = Instant::now() + Duration::from_secs(8);
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline && i < 2000 {
                let target = targets[i % targets.len()];
                if let Ok(mut c) = TcpStream::connect_timeout(&target, Duration::from_millis(200)) {
                    let _ = c.set_read_timeout(Some(Duration::from_millis(50)));
                    let _ = match i % 4 {
                        0 => c.write_all(&hello),
                        1 => c.write_all(&client_hello_ish),
                        2 => c.write_all(b"GET / HTTP/1.0\r\n\r\n"),
                        _ => Ok(()), // connect and hang up
                    };
                    let _ = c.read(&mut [0u8; 256]);
                }
                i += 1;
            }
        });
        for round in 0..20 {
            check_all_reduce(&comms, 1000 + round * 997);
        }
        check_all_reduce(&comms, 1 << 20);
        stop.store(true, Ordering::Relaxed);
    });
}

/// Rank `rank`'s Unix socket for same-host peers, as it published it.
fn rank_unix_addr(
    store: &StoreServer,
    sec: &Security,
    rank: usize,
) -> std::os::unix::net::SocketAddr {
    use std::os::linux::net::SocketAddrExt;
    let text = published(store, sec, "local", rank);
    let (_host, name) = text.split_once(' ').expect("host identity, then the name");
    std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap()
}

#[test]
fn strangers_on_the_local_unix_socket_get_the_same_checks() {
    use std::os::unix::net::UnixStream;
    let right = sec(None, Some("right"));
    let (store, comms) = group(2, right.clone(), |_| right.clone(), Duration::from_secs(20));
    let comms = ok(comms);
    check_all_reduce(&comms, 100);
    assert_eq!(comms[0].link_kind(1), Some(common::expected_local_link()));
    let addr = rank_unix_addr(&store, &right, 1);
    // A hello without the secret: refused for the mode, in plaintext.
    let mut s = UnixStream::connect_addr(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&wire::encode_hello(0, 0, &Hello::new(0, 0, 2)).unwrap())
        .unwrap();
    let (h, p) = read_frame(&mut s).unwrap();
    assert_eq!(h.kind, FrameKind::HandshakeAck);
    let ack = HelloAck::decode(&p).unwrap();
    assert!(!ack.accepted, "a stranger was accepted");
    // A TLS ClientHello: told this job has TLS off.
    let mut s = UnixStream::connect_addr(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&[22u8, 3, 1, 0, 5, 1, 0, 0, 1, 0]).unwrap();
    let (_, p) = read_frame(&mut s).unwrap();
    let ack = HelloAck::decode(&p).unwrap();
    assert!(
        !ack.accepted && ack.reason.contains("TLS off"),
        "{}",
        ack.reason
    );
    // Many strangers at once (garbage, silence, hang-ups) while the job runs.
    let stop = AtomicBool::new(false);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) && i < 500 {
                if let Ok(mut c) = UnixStream::connect_addr(&addr) {
                    let _ = c.set_read_timeout(Some(Duration::from_millis(50)));
                    let _ = match i % 3 {
                        0 => c.write_all(b"GET / HTTP/1.0\r\n\r\n"),
                        1 => c.write_all(&[0xff; 64]),
                        _ => Ok(()),
                    };
                    let _ = c.read(&mut [0u8; 256]);
                }
                i += 1;
            }
        });
        for round in 0..10 {
            check_all_reduce(&comms, 1000 + round * 997);
        }
        stop.store(true, Ordering::Relaxed);
    });
}

/// Every other test of this file, again on the portable transport (the
/// default run uses the io_uring engine where it works).
#[test]
fn on_the_portable_transport_too() {
    common::rerun_on_portable("on_the_portable_transport_too");
}

#[test]
fn tls_runs_on_the_portable_transport_and_forcing_uring_says_why() {
    let pki = Pki::new("job CA");
    let tls = || sec(Some(pki.tls(TlsMode::Mutual, &pki, false)), None);
    let store = StoreServer::bind_with("127.0.0.1:0".parse().unwrap(), tls()).unwrap();
    let build = |kind| {
        Communicator::builder()
            .rank(0)
            .world_size(1)
            .store_addr(store.local_addr())
            .host_store(false)
            .security(tls())
            .transport(kind)
            .build()
            .wait()
    };
    let auto = build(ringwire::TransportKind::Auto).unwrap();
    assert_eq!(auto.transport_name(), "portable");
    let err = build(ringwire::TransportKind::Uring)
        .expect_err("TLS cannot run on the engine")
        .to_string();
    assert!(err.contains("TLS") && err.contains("portable"), "{err}");
}

/// A secret job whose ranks link over TCP on the engine opens lanes
/// (decision 0018), each through the whole challenge-response, and runs
/// collectives over them.
#[test]
fn lanes_pass_the_secret_check_like_their_link() {
    let right = sec(None, Some("lanes"));
    let store = StoreServer::bind_with("127.0.0.1:0".parse().unwrap(), right.clone()).unwrap();
    let comms: Vec<Communicator> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                let b = Communicator::builder()
                    .rank(rank)
                    .world_size(2)
                    .store_addr(store.local_addr())
                    .host_store(false)
                    .timeout(Duration::from_secs(20))
                    .security(right.clone())
                    .local_links(ringwire::LocalLinks::Tcp);
                s.spawn(move || b.build().wait().unwrap())
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    check_all_reduce(&comms, 1 << 20);
    let engine = comms[0].transport_name() == "uring";
    assert_eq!(comms[0].link_has_lanes(1), engine);
    assert_eq!(comms[1].link_has_lanes(0), engine);
}

/// A lane (decision 0018) is only taken for a link that asked for lanes and
/// waits for them: one opened out of the blue is refused, saying so, and
/// the job goes on. With a secret, a lane runs the whole challenge first.
#[test]
fn a_lane_nobody_waits_for_is_refused_and_the_job_goes_on() {
    for secret in [None, Some("lanes")] {
        let (store, comms) = group(
            2,
            sec(None, secret),
            |_| sec(None, secret),
            Duration::from_secs(20),
        );
        let comms = ok(comms);
        check_all_reduce(&comms, 1 << 20);
        let addr = rank_addr(&store, &sec(None, secret), 1);
        let c = StoreClient::connect_with(
            &[store.local_addr()],
            Duration::from_secs(5),
            &sec(None, secret),
        )
        .unwrap();
        let job = c
            .get("ringwire/default/job", Duration::from_secs(5))
            .unwrap();
        let job = u64::from_le_bytes(job.try_into().unwrap());
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let hello = Hello {
            channel: wire::Channel::LaneFromDialer(0),
            security: if secret.is_some() {
                wire::handshake::SECURITY_SECRET
            } else {
                0
            },
            auth: if secret.is_some() {
                vec![7; 32]
            } else {
                vec![]
            },
            ..Hello::new(job, 0, 2)
        };
        s.write_all(&wire::encode_hello(0, 0, &hello).unwrap())
            .unwrap();
        let (_, p) = read_frame(&mut s).unwrap();
        let ack = HelloAck::decode(&p).unwrap();
        assert!(!ack.accepted, "a stray lane was accepted");
        assert!(
            ack.reason.contains("lane") && ack.reason.contains("not waiting"),
            "{}",
            ack.reason
        );
        check_all_reduce(&comms, 1 << 20);
    }
}
