//! End-to-end tests of the rendezvous store over real sockets.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use ringwire::store::protocol::{self, Request, Response};
use ringwire::store::{MAX_KEY_LEN, MAX_VALUE_LEN, StoreClient, StoreError, StoreServer};

const SHORT: Duration = Duration::from_secs(2);

fn local_server() -> StoreServer {
    StoreServer::bind((Ipv4Addr::LOCALHOST, 0).into()).unwrap()
}

fn client(server: &StoreServer) -> StoreClient {
    StoreClient::connect(&[server.local_addr()], SHORT).unwrap()
}

/// Reads one response frame from a raw socket.
fn read_response(stream: &mut TcpStream) -> Option<Response> {
    stream.set_read_timeout(Some(SHORT)).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Ok(Some((resp, _))) = protocol::decode_response(&buf) {
            return Some(resp);
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Whether the server closed a raw connection (EOF or reset within `SHORT`).
fn closed_by_peer(stream: &mut TcpStream) -> bool {
    stream.set_read_timeout(Some(SHORT)).unwrap();
    let mut sink = [0u8; 4096];
    loop {
        match stream.read(&mut sink) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) => {
                return !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                );
            }
        }
    }
}

#[test]
fn set_get_try_get_delete_num_keys() {
    let server = local_server();
    let c = client(&server);
    assert_eq!(c.num_keys().unwrap(), 0);
    c.set("a", b"alpha").unwrap();
    c.set("b", b"").unwrap();
    assert_eq!(c.get("a", SHORT).unwrap(), b"alpha");
    assert_eq!(c.try_get("b").unwrap(), Some(Vec::new()));
    assert_eq!(c.try_get("c").unwrap(), None);
    assert_eq!(c.num_keys().unwrap(), 2);
    assert!(c.delete("a").unwrap());
    assert!(!c.delete("a").unwrap());
    assert_eq!(c.try_get("a").unwrap(), None);
    assert_eq!(c.num_keys().unwrap(), 1);
}

#[test]
fn concurrent_adds_on_one_key_are_exact() {
    let server = local_server();
    let threads = 16;
    let adds = 50;
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let addr = server.local_addr();
            thread::spawn(move || {
                let c = StoreClient::connect(&[addr], SHORT).unwrap();
                for _ in 0..adds {
                    c.add("counter", 1).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let c = client(&server);
    assert_eq!(c.add("counter", 0).unwrap(), threads * adds);
    assert_eq!(
        c.try_get("counter").unwrap().unwrap(),
        (threads * adds).to_string().as_bytes()
    );
}

#[test]
fn one_client_shared_by_threads() {
    let server = local_server();
    let c = Arc::new(client(&server));
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let c = Arc::clone(&c);
            thread::spawn(move || {
                for j in 0..20 {
                    c.set(&format!("k{i}/{j}"), &[i, j]).unwrap();
                    assert_eq!(c.add("n", 2).unwrap() % 2, 0);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(c.num_keys().unwrap(), 81);
    assert_eq!(c.get("k3/19", SHORT).unwrap(), [3, 19]);
}

#[test]
fn get_waits_for_a_later_set() {
    let server = local_server();
    let addr = server.local_addr();
    let waiter = thread::spawn(move || {
        let c = StoreClient::connect(&[addr], SHORT).unwrap();
        let start = Instant::now();
        let v = c.get("late", SHORT).unwrap();
        (v, start.elapsed())
    });
    thread::sleep(Duration::from_millis(150));
    client(&server).set("late", b"here").unwrap();
    let (v, waited) = waiter.join().unwrap();
    assert_eq!(v, b"here");
    assert!(waited >= Duration::from_millis(100), "{waited:?}");
}

#[test]
fn wait_returns_once_all_keys_exist() {
    let server = local_server();
    let addr = server.local_addr();
    let waiter = thread::spawn(move || {
        let c = StoreClient::connect(&[addr], SHORT).unwrap();
        c.wait(&["x", "y"], SHORT)
    });
    let c = client(&server);
    c.set("x", b"1").unwrap();
    thread::sleep(Duration::from_millis(50));
    c.set("y", b"2").unwrap();
    waiter.join().unwrap().unwrap();
    c.wait(&[], Duration::ZERO).unwrap();
}

#[test]
fn wait_timeout_names_the_missing_key() {
    let server = local_server();
    let c = client(&server);
    c.set("present", b"1").unwrap();
    let start = Instant::now();
    let e = c
        .wait(&["present", "absent"], Duration::from_millis(200))
        .unwrap_err();
    let elapsed = start.elapsed();
    let StoreError::Timeout { keys, waited } = &e else {
        panic!("expected Timeout, got {e:?}");
    };
    assert_eq!(keys, &["absent"]);
    assert_eq!(*waited, Duration::from_millis(200));
    assert!(e.to_string().contains("\"absent\""), "{e}");
    assert!(
        elapsed >= Duration::from_millis(190) && elapsed < SHORT,
        "{elapsed:?}"
    );
    // The connection is still usable after a timeout.
    assert_eq!(c.get("present", SHORT).unwrap(), b"1");
    let e = c.get("absent", Duration::from_millis(20)).unwrap_err();
    assert!(matches!(e, StoreError::Timeout { ref keys, .. } if keys == &["absent"]));
}

#[test]
fn compare_set_semantics() {
    let server = local_server();
    let c = client(&server);
    // Missing key with non-empty expected: nothing stored.
    assert_eq!(c.compare_set("k", b"old", b"new").unwrap(), b"");
    assert_eq!(c.try_get("k").unwrap(), None);
    // Missing key with empty expected: set.
    assert_eq!(c.compare_set("k", b"", b"first").unwrap(), b"first");
    // Mismatch: unchanged, current value returned.
    assert_eq!(c.compare_set("k", b"wrong", b"second").unwrap(), b"first");
    assert_eq!(c.compare_set("k", b"", b"second").unwrap(), b"first");
    // Match: swapped.
    assert_eq!(c.compare_set("k", b"first", b"second").unwrap(), b"second");
    assert_eq!(c.get("k", SHORT).unwrap(), b"second");
}

#[test]
fn compare_set_wakes_waiters() {
    let server = local_server();
    let addr = server.local_addr();
    let waiter = thread::spawn(move || {
        StoreClient::connect(&[addr], SHORT)
            .unwrap()
            .get("cas", SHORT)
    });
    thread::sleep(Duration::from_millis(50));
    client(&server).compare_set("cas", b"", b"v").unwrap();
    assert_eq!(waiter.join().unwrap().unwrap(), b"v");
}

#[test]
fn add_on_a_non_integer_is_a_remote_error() {
    let server = local_server();
    let c = client(&server);
    c.set("s", b"text").unwrap();
    let e = c.add("s", 1).unwrap_err();
    assert!(matches!(e, StoreError::Remote(ref m) if m.contains("not a decimal integer")));
    // The connection survives a refused request.
    assert_eq!(c.add("n", 3).unwrap(), 3);
}

#[test]
fn too_large_is_refused_by_the_client_before_sending() {
    let server = local_server();
    let c = client(&server);
    let e = c.set("big", &vec![0; MAX_VALUE_LEN + 1]).unwrap_err();
    assert!(
        matches!(e, StoreError::TooLarge { len, cap, .. } if len == MAX_VALUE_LEN + 1 && cap == MAX_VALUE_LEN),
        "{e:?}"
    );
    let e = c.try_get(&"k".repeat(MAX_KEY_LEN + 1)).unwrap_err();
    assert!(matches!(e, StoreError::TooLarge { .. }), "{e:?}");
    // Nothing was sent, so the connection is fine.
    c.set("small", b"ok").unwrap();
    assert_eq!(c.num_keys().unwrap(), 1);
}

#[test]
fn hostile_length_is_refused_by_the_server() {
    let server = local_server();
    let mut raw = TcpStream::connect(server.local_addr()).unwrap();
    raw.write_all(&u32::MAX.to_le_bytes()).unwrap();
    let Some(Response::Error(msg)) = read_response(&mut raw) else {
        panic!("expected an error response");
    };
    assert!(msg.contains("over the limit"), "{msg}");
    assert!(closed_by_peer(&mut raw));

    // The error survives junk the server never reads (no reset before it).
    let mut raw = TcpStream::connect(server.local_addr()).unwrap();
    let mut junk = u32::MAX.to_le_bytes().to_vec();
    junk.resize(300 * 1024, 0xab);
    raw.write_all(&junk).unwrap();
    assert!(matches!(read_response(&mut raw), Some(Response::Error(_))));

    // A value over the cap inside a frame under the frame cap.
    let mut raw = TcpStream::connect(server.local_addr()).unwrap();
    let mut body = vec![1u8]; // Set
    body.extend_from_slice(&1u32.to_le_bytes());
    body.push(b'k');
    body.extend_from_slice(&u32::try_from(MAX_VALUE_LEN + 1).unwrap().to_le_bytes());
    let mut frame = u32::try_from(body.len()).unwrap().to_le_bytes().to_vec();
    frame.extend_from_slice(&body);
    raw.write_all(&frame).unwrap();
    let Some(Response::Error(msg)) = read_response(&mut raw) else {
        panic!("expected an error response");
    };
    assert!(msg.contains("value length"), "{msg}");
    assert!(closed_by_peer(&mut raw));

    // Others are still served.
    let c = client(&server);
    c.set("k", b"v").unwrap();
    assert_eq!(c.num_keys().unwrap(), 1);
}

#[test]
fn garbage_does_not_break_the_server_for_others() {
    let server = local_server();
    let good = client(&server);
    good.set("before", b"1").unwrap();

    let mut http = TcpStream::connect(server.local_addr()).unwrap();
    http.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    assert!(closed_by_peer(&mut http));

    let mut unknown = TcpStream::connect(server.local_addr()).unwrap();
    unknown.write_all(&[3, 0, 0, 0, 0xff, 1, 2]).unwrap();
    assert!(matches!(
        read_response(&mut unknown),
        Some(Response::Error(_))
    ));

    // Vanishing mid-request.
    let mut partial = TcpStream::connect(server.local_addr()).unwrap();
    let frame = protocol::encode_request(&Request::Set {
        key: "half".into(),
        value: vec![7; 1000],
    })
    .unwrap();
    partial.write_all(&frame[..frame.len() / 2]).unwrap();
    drop(partial);

    // Connected and silent.
    let _silent = TcpStream::connect(server.local_addr()).unwrap();

    good.set("after", b"2").unwrap();
    assert_eq!(good.get("before", SHORT).unwrap(), b"1");
    let other = client(&server);
    assert_eq!(other.num_keys().unwrap(), 2);
    assert_eq!(other.try_get("half").unwrap(), None);
}

#[test]
fn pipelined_requests_on_a_raw_socket() {
    let server = local_server();
    let mut raw = TcpStream::connect(server.local_addr()).unwrap();
    let mut frames = Vec::new();
    for req in [
        Request::Add {
            key: "n".into(),
            delta: 2,
        },
        Request::Add {
            key: "n".into(),
            delta: 3,
        },
        Request::NumKeys,
    ] {
        req.encode(&mut frames).unwrap();
    }
    raw.write_all(&frames).unwrap();
    raw.set_read_timeout(Some(SHORT)).unwrap();
    let mut buf = Vec::new();
    let mut got = Vec::new();
    let mut chunk = [0u8; 256];
    while got.len() < 3 {
        while let Ok(Some((resp, used))) = protocol::decode_response(&buf) {
            got.push(resp);
            buf.drain(..used);
        }
        if got.len() < 3 {
            let n = raw.read(&mut chunk).unwrap();
            assert_ne!(n, 0);
            buf.extend_from_slice(&chunk[..n]);
        }
    }
    assert_eq!(
        got,
        [Response::Int(2), Response::Int(5), Response::Count(1)]
    );
}

#[test]
fn dropped_server_gives_server_gone_not_a_hang() {
    let server = local_server();
    let addr = server.local_addr();
    let idle = client(&server);
    let waiting = thread::spawn(move || {
        let c = StoreClient::connect(&[addr], SHORT).unwrap();
        c.set("ready", b"").unwrap();
        c.get("never", Duration::from_secs(30))
    });
    client(&server).get("ready", SHORT).unwrap();
    thread::sleep(Duration::from_millis(50));

    let start = Instant::now();
    drop(server);
    assert!(
        start.elapsed() < SHORT,
        "shutdown took {:?}",
        start.elapsed()
    );

    let e = waiting.join().unwrap().unwrap_err();
    assert!(
        matches!(e, StoreError::ServerGone { addr: a } if a == addr),
        "{e:?}"
    );
    assert!(e.to_string().contains("closed the connection"), "{e}");
    let e = idle.num_keys().unwrap_err();
    assert!(matches!(e, StoreError::ServerGone { .. }), "{e:?}");
    // Later calls keep failing fast.
    assert!(idle.num_keys().is_err());
}

#[test]
fn shutdown_is_prompt_with_idle_and_half_sent_clients() {
    let server = local_server();
    let _silent = TcpStream::connect(server.local_addr()).unwrap();
    let mut half = TcpStream::connect(server.local_addr()).unwrap();
    half.write_all(&100u32.to_le_bytes()).unwrap();
    let _c = client(&server);
    thread::sleep(Duration::from_millis(50));
    let start = Instant::now();
    server.shutdown();
    assert!(
        start.elapsed() < SHORT,
        "shutdown took {:?}",
        start.elapsed()
    );
    assert!(closed_by_peer(&mut half));
    server.shutdown(); // idempotent
}

#[test]
fn connect_to_nothing_fails_after_the_timeout() {
    // A port that was free a moment ago.
    let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: SocketAddr = (Ipv4Addr::LOCALHOST, port).into();
    let timeout = Duration::from_millis(300);
    let start = Instant::now();
    let e = StoreClient::connect(&[addr], timeout).unwrap_err();
    let elapsed = start.elapsed();
    assert!(elapsed >= timeout && elapsed < SHORT, "{elapsed:?}");
    let StoreError::Connect { addrs, .. } = &e else {
        panic!("expected Connect, got {e:?}");
    };
    assert_eq!(addrs, &[addr]);
    let msg = e.to_string();
    assert!(
        msg.contains(&addr.to_string()) && msg.contains("MASTER_ADDR"),
        "{msg}"
    );

    let e = StoreClient::connect(&[], timeout).unwrap_err();
    assert!(matches!(e, StoreError::Connect { .. }), "{e:?}");
}

#[test]
fn connect_retries_until_the_server_starts() {
    let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: SocketAddr = (Ipv4Addr::LOCALHOST, port).into();
    let starter = thread::spawn(move || {
        thread::sleep(Duration::from_millis(200));
        StoreServer::bind(addr).unwrap()
    });
    let c = StoreClient::connect(&[addr], SHORT).unwrap();
    let server = starter.join().unwrap();
    c.set("k", b"v").unwrap();
    assert_eq!(server.local_addr(), addr);
}

#[test]
fn ipv6_loopback() {
    let server = match StoreServer::bind((Ipv6Addr::LOCALHOST, 0).into()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("skipped: cannot listen on [::1] here: {e}");
            return;
        }
    };
    let c = client(&server);
    c.set("v6", b"yes").unwrap();
    assert_eq!(c.get("v6", SHORT).unwrap(), b"yes");
    assert!(c.server_addr().is_ipv6());
}

#[test]
fn client_tries_every_address() {
    let server = local_server();
    let dead: SocketAddr = {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        l.local_addr().unwrap()
    };
    let c = StoreClient::connect(&[dead, server.local_addr()], SHORT).unwrap();
    assert_eq!(c.server_addr(), server.local_addr());
}

#[test]
fn server_binds_only_the_given_address() {
    let server = local_server();
    let port = server.local_addr().port();
    // Linux routes all of 127/8 to lo, so 127.0.0.2 is a distinct local
    // address on which nothing listens.
    let other: SocketAddr = (Ipv4Addr::new(127, 0, 0, 2), port).into();
    match TcpStream::connect_timeout(&other, Duration::from_millis(500)) {
        Ok(_) => panic!("server bound to 127.0.0.1 accepted on 127.0.0.2"),
        Err(e) => eprintln!("127.0.0.2:{port}: {e} (as expected)"),
    }
}

#[test]
fn ipv6_wildcard_does_not_take_ipv4() {
    let server = match StoreServer::bind((Ipv6Addr::UNSPECIFIED, 0).into()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("skipped: cannot listen on [::] here: {e}");
            return;
        }
    };
    let port = server.local_addr().port();
    let v4: SocketAddr = (Ipv4Addr::LOCALHOST, port).into();
    assert!(
        TcpStream::connect_timeout(&v4, Duration::from_millis(500)).is_err(),
        "[::] listener with IPV6_V6ONLY accepted IPv4"
    );
}

#[test]
fn bind_error_names_the_address() {
    let server = local_server();
    let e = StoreServer::bind(server.local_addr()).unwrap_err();
    assert!(matches!(e, StoreError::Bind { .. }), "{e:?}");
    assert!(
        e.to_string().contains(&server.local_addr().to_string()),
        "{e}"
    );
}

#[test]
fn large_value_round_trip() {
    let server = local_server();
    let c = client(&server);
    let value: Vec<u8> = (0..4 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
    c.set("big", &value).unwrap();
    assert_eq!(c.get("big", SHORT).unwrap(), value);
}

/// A first request whose length starts with the byte a TLS record starts
/// with (22) is a plaintext request all the same: it was refused as a TLS
/// handshake once (a `try_get` of a 17-byte key).
#[test]
fn a_first_request_that_starts_like_a_tls_record_is_served() {
    let server = local_server();
    client(&server).set("elastic/killed_at", b"7").unwrap();
    for key in ["elastic/killed_at", &"k".repeat(273)] {
        let mut request = Vec::new();
        Request::TryGet { key: key.into() }
            .encode(&mut request)
            .unwrap();
        assert_eq!(request[0], 22, "{key}: the first byte of the length");
        let mut raw = TcpStream::connect(server.local_addr()).unwrap();
        raw.write_all(&request).unwrap();
        let want = match key {
            "elastic/killed_at" => Some(b"7".to_vec()),
            _ => None,
        };
        match read_response(&mut raw) {
            Some(Response::Value(v)) => assert_eq!(Some(v), want, "{key}"),
            Some(Response::NotFound) => assert_eq!(want, None, "{key}"),
            other => panic!("{key}: {other:?}"),
        }
    }
}
