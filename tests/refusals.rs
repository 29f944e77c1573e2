//! Refused connections are named where the job waits (issue 28): the store
//! and a rank's link listener record each refusal (with the address and
//! why), and an op whose wait times out says what was refused meanwhile.
//! Everything runs over loopback in this process; the ledger is
//! process-wide, so assertions look for this test's own entries.

mod common;

use ringwire::refusals::describe_since;
use ringwire::store::{StoreClient, StoreServer};
use ringwire::wire::{self, Hello};
use ringwire::{Communicator, ReduceOp, Security};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// The ledger's text since `since` once it holds `wanted` (a refusal is
/// recorded when its connection's handshake thread ends, just after the
/// refused side has been answered).
fn refusals_naming(since: Instant, wanted: &[&str]) -> String {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let text = describe_since(since).unwrap_or_default();
        if wanted.iter().all(|w| text.contains(w)) || Instant::now() >= until {
            return text;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The ledger is one per process and keys peers by IP: the two tests whose
/// refused clients are 127.0.0.1 at the store take turns, so the latest
/// port of that entry is the running test's own. (The link tests' strangers
/// come from 127.0.0.2.)
static LEDGER: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    LEDGER
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn assert_names(text: &str, wanted: &[&str]) {
    for w in wanted {
        assert!(text.contains(w), "{w:?} not in: {text}");
    }
}

/// The user's case at the store: its clients with another secret, none,
/// or one the store lacks are refused, and the ledger names each address
/// and why.
#[test]
fn the_store_names_clients_it_refused_and_why() {
    let _turn = one_at_a_time();
    common::init_logging();
    let t = Duration::from_secs(3);
    let secret_a = Security::none().with_secret("secret A");
    let store = StoreServer::bind_with("127.0.0.1:0".parse().unwrap(), secret_a).unwrap();
    let addr = store.local_addr();
    let start = Instant::now();

    // The real client with secret B: refused.
    let secret_b = Security::none().with_secret("secret B");
    assert!(StoreClient::connect_with(&[addr], t, &secret_b).is_err());
    // A raw client that answers the challenge with a bad proof, so its
    // address (port included) is known: refused for the secret too.
    let mut raw = TcpStream::connect(addr).unwrap();
    raw.set_read_timeout(Some(t)).unwrap();
    let me = raw.local_addr().unwrap();
    raw.write_all(&[&b"RWSAUTH1"[..], &[7u8; 32]].concat())
        .unwrap();
    let mut challenge = [0u8; 8 + 32 + 32];
    raw.read_exact(&mut challenge).unwrap();
    assert_eq!(&challenge[..8], b"RWSAUTH1");
    raw.write_all(&[0u8; 32]).unwrap();
    let mut answer = Vec::new();
    let _ = raw.read_to_end(&mut answer);
    drop(raw);
    // Both were refused (the entry counts every refusal of one address,
    // place and reason, so earlier tests of this process may add to it).
    let text = refusals_naming(start, &[&format!("{me} at the store (")]);
    assert_names(
        &text,
        &[
            &format!("{me} at the store ("),
            " times",
            "last ",
            "wrong job secret",
            "RINGWIRE_SECRET",
        ],
    );

    // A client without a secret: refused for having none.
    let plain = StoreClient::connect(&[addr], t).unwrap();
    assert!(plain.num_keys().is_err());
    let text = refusals_naming(start, &["no job secret"]);
    assert_names(&text, &["127.0.0.1:", "at the store", "no job secret"]);

    // A client with a secret at a store without one.
    let open = StoreServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    assert!(StoreClient::connect_with(&[open.local_addr()], t, &secret_b).is_err());
    let text = refusals_naming(start, &["unexpected job secret"]);
    assert_names(&text, &["at the store", "unexpected job secret"]);
    assert!(text.starts_with("meanwhile "), "{text}");
}

/// Two ranks (no secret) linked in this process, with a short op timeout.
fn two_ranks() -> (StoreServer, Vec<Communicator>) {
    common::init_logging();
    common::local_group(2, |b| {
        b.timeout(Duration::from_secs(2))
            .connect_timeout(Duration::from_secs(10))
    })
}

/// A stranger's hello with another job id at rank 1's TCP listener, from
/// `from` (a loopback address of its own: the ledger keeps a count per
/// address, place and reason, and the tests of this file run at once): it
/// is refused. Returns the stranger's address.
fn hello_from_another_job(store: &StoreServer, from: [u8; 4]) -> SocketAddr {
    let c = StoreClient::connect(&[store.local_addr()], Duration::from_secs(5)).unwrap();
    let raw = c
        .get("ringwire/default/addr/1", Duration::from_secs(5))
        .unwrap();
    let addr: SocketAddr = String::from_utf8(raw).unwrap().parse().unwrap();
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.bind(&SocketAddr::from((from, 0)).into()).unwrap();
    sock.connect(&addr.into()).unwrap();
    let mut s: TcpStream = sock.into();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let me = s.local_addr().unwrap();
    // Job ids are random 64-bit numbers: this one is another job's.
    let hello = Hello::new(0x0123_4567_89ab_cdef, 0, 2);
    s.write_all(&wire::encode_hello(0, 0, &hello).unwrap())
        .unwrap();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    assert!(!answer.is_empty(), "no refusal came back");
    me
}

/// A rank waiting for a link that never comes (rank 0 never dials: it
/// calls nothing) times out naming the connection its listener refused.
#[test]
fn a_link_wait_names_the_refused_dialer() {
    let (store, comms) = two_ranks();
    let stranger = hello_from_another_job(&store, [127, 0, 0, 2]);
    let e = comms[1]
        .recv(vec![0f32; 4], 0)
        .wait()
        .unwrap_err()
        .to_string();
    eprintln!("rank 1: {e}");
    assert_names(
        &e,
        &[
            "did not connect to this rank",
            "meanwhile",
            &format!("{stranger} at rank 1's link listener"),
            "another job id",
        ],
    );
}

/// A rank waiting for a frame on a live link (rank 0 calls nothing) times
/// out naming a connection refused while it waited.
#[test]
fn a_frame_wait_names_what_was_refused_meanwhile() {
    let (store, comms) = two_ranks();
    // Links up.
    let sums = common::on_all(&comms, |c| {
        c.all_reduce(vec![1f32; 4], ReduceOp::Sum).wait()
    });
    for s in sums {
        assert_eq!(s.unwrap(), vec![2f32; 4]);
    }
    let waiting = comms[1].recv(vec![0f32; 4], 0);
    std::thread::sleep(Duration::from_millis(300));
    let stranger = hello_from_another_job(&store, [127, 0, 0, 3]);
    let e = waiting.wait().unwrap_err();
    assert!(matches!(e, ringwire::Error::Timeout { .. }), "{e}");
    let e = e.to_string();
    eprintln!("rank 1: {e}");
    assert_names(
        &e,
        &[
            "timed out",
            "meanwhile",
            &format!("{stranger} at rank 1's link listener"),
            "another job id",
        ],
    );
}

/// The user's case end to end: rank 0 hosts the store with secret A, rank
/// 1 has secret B. Rank 1 fails at once (the store refuses it); rank 0
/// waits for rank 1 and must say that a connection was refused for its
/// secret, not only that rank 1 never published its address.
#[test]
fn rank_0_hosting_the_store_names_a_rank_refused_for_its_secret() {
    let _turn = one_at_a_time();
    common::init_logging();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let results = std::thread::scope(|s| {
        let handles: Vec<_> = [("secret A", 0), ("secret B", 1)]
            .into_iter()
            .map(|(secret, rank)| {
                let b = Communicator::builder()
                    .rank(rank)
                    .world_size(2)
                    .store("127.0.0.1", port)
                    .timeout(Duration::from_secs(3))
                    .connect_timeout(Duration::from_secs(3))
                    .secret(secret);
                s.spawn(move || b.build().wait())
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    let e1 = results[1].as_ref().unwrap_err().to_string();
    assert!(e1.contains("secret"), "{e1}");
    let e0 = results[0].as_ref().unwrap_err().to_string();
    eprintln!("rank 0: {e0}");
    assert_names(&e0, &["meanwhile", "at the store", "wrong job secret"]);
}
