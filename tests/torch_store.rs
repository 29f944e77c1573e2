//! ringwire's TCPStore client against a real `torch.distributed.TCPStore`
//! hosted by a Python process (both of torch's servers: libuv, its default,
//! and the classic one), and a rendezvous of several ranks through it, as
//! under torchrun. Hostile and silent servers are Rust stand-ins.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use ringwire::env::StoreKind;
use ringwire::store::tcpstore::protocol::TcpStoreError;
use ringwire::store::{StoreError, StoreServer, TcpStoreClient};
use ringwire::{Builder, ReduceOp};

/// A Python process hosting a TCPStore, and a line-based channel to its own
/// torch client.
struct TorchStore {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    addr: SocketAddr,
}

impl TorchStore {
    fn start(backend: &str) -> Option<TorchStore> {
        let python = common::launchers::python_with(&["torch.distributed"])?;
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/tcpstore_host.py");
        let mut child = Command::new(python)
            .args([script, backend])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start python");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut port = String::new();
        stdout.read_line(&mut port).expect("port line");
        let port: u16 = port
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("port: {port:?}"));
        Some(TorchStore {
            child,
            stdin,
            stdout,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        })
    }

    /// Runs one command through torch's own client; its answer.
    fn py(&mut self, command: &str) -> String {
        writeln!(self.stdin, "{command}").unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim().to_owned()
    }

    fn client(&self) -> TcpStoreClient {
        TcpStoreClient::connect(&[self.addr], Duration::from_secs(10)).expect("connect")
    }
}

impl Drop for TorchStore {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn every_request(backend: &str) {
    let Some(mut torch) = TorchStore::start(backend) else {
        return;
    };
    let c = torch.client();
    let t = Duration::from_secs(5);

    // What ringwire sets, torch reads, and the other way round.
    c.set("a", b"one").unwrap();
    assert_eq!(torch.py("get a"), "one");
    assert_eq!(torch.py("set b xyz"), "ok");
    assert_eq!(c.get("b", t).unwrap(), b"xyz");
    assert_eq!(c.try_get("b").unwrap().as_deref(), Some(&b"xyz"[..]));
    assert_eq!(c.try_get("nope").unwrap(), None);

    assert_eq!(c.add("n", 5).unwrap(), 5);
    assert_eq!(c.add("n", -2).unwrap(), 3);
    assert_eq!(torch.py("add n 10"), "13");
    assert_eq!(c.add("n", 0).unwrap(), 13);

    assert_eq!(c.compare_set("c", b"", b"first").unwrap(), b"first");
    assert_eq!(c.compare_set("c", b"wrong", b"x").unwrap(), b"first");
    assert_eq!(c.compare_set("c", b"first", b"second").unwrap(), b"second");
    assert_eq!(torch.py("get c"), "second");
    assert!(c.delete("c").unwrap());
    assert!(!c.delete("c").unwrap());
    assert_eq!(torch.py("check c"), "False");

    c.wait(&["a", "b"], t).unwrap();
    assert_eq!(
        c.multi_get(&["b", "a"], t).unwrap(),
        [b"xyz".to_vec(), b"one".to_vec()]
    );

    // A timed-out wait names what is missing, takes about its timeout, and
    // leaves the connection usable (the wait was cancelled on the server).
    let start = Instant::now();
    match c.wait(&["a", "missing"], Duration::from_millis(300)) {
        Err(StoreError::Timeout { keys, .. }) => assert_eq!(keys, ["missing"]),
        other => panic!("expected a timeout, got {other:?}"),
    }
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(5),
        "{took:?}"
    );
    match c.get("missing", Duration::from_millis(100)) {
        Err(StoreError::Timeout { keys, .. }) => assert_eq!(keys, ["missing"]),
        other => panic!("expected a timeout, got {other:?}"),
    }
    c.set("after", b"ok").unwrap();
    assert_eq!(c.get("after", t).unwrap(), b"ok");

    // A wait parked on the server wakes when torch's client sets the key.
    let addr = torch.addr;
    std::thread::scope(|s| {
        let waiter = s.spawn(move || torch_client_for(addr).get("late", Duration::from_secs(20)));
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(torch.py("set late here"), "ok");
        assert_eq!(waiter.join().unwrap().unwrap(), b"here");
    });

    // Over torch's limits: refused before sending, the connection stays.
    let long = "k".repeat(9 * 1024);
    assert!(matches!(
        c.set(&long, b"v"),
        Err(StoreError::TcpStore {
            source: TcpStoreError::TooLarge { .. },
            ..
        })
    ));
    assert_eq!(c.get("a", t).unwrap(), b"one");
}

fn torch_client_for(addr: SocketAddr) -> TcpStoreClient {
    TcpStoreClient::connect(&[addr], Duration::from_secs(10)).expect("connect")
}

#[test]
fn every_request_against_torchs_default_libuv_store() {
    every_request("libuv");
}

#[test]
fn every_request_against_torchs_classic_store() {
    every_request("classic");
}

#[test]
fn a_store_that_goes_away_fails_requests_and_waits() {
    let Some(mut torch) = TorchStore::start("libuv") else {
        return;
    };
    let c = torch.client();
    c.set("x", b"1").unwrap();
    let waiter = torch_client_for(torch.addr);
    std::thread::scope(|s| {
        let parked = s.spawn(|| {
            let start = Instant::now();
            (
                waiter.wait(&["never"], Duration::from_secs(60)),
                start.elapsed(),
            )
        });
        std::thread::sleep(Duration::from_millis(300));
        torch.child.kill().unwrap();
        torch.child.wait().unwrap();
        let (result, took) = parked.join().unwrap();
        assert!(
            matches!(result, Err(StoreError::ServerGone { .. })),
            "{result:?}"
        );
        assert!(took < Duration::from_secs(10), "{took:?}");
    });
    let start = Instant::now();
    let err = c.get("x", Duration::from_secs(30)).unwrap_err();
    assert!(
        matches!(err, StoreError::ServerGone { .. } | StoreError::Io { .. }),
        "{err:?}"
    );
    assert!(start.elapsed() < Duration::from_secs(10));
    // The connection is now known broken: later requests say so at once.
    assert!(matches!(c.set("y", b"2"), Err(StoreError::Broken { .. })));
}

#[test]
fn a_ringwire_store_or_a_silent_server_is_not_taken_for_a_tcpstore() {
    let ours = StoreServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let err = TcpStoreClient::connect(&[ours.local_addr()], Duration::from_secs(5)).unwrap_err();
    assert!(matches!(err, StoreError::NotTcpStore { .. }), "{err:?}");
    assert!(err.to_string().contains("RINGWIRE_STORE=ringwire"), "{err}");

    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    let start = Instant::now();
    let err = TcpStoreClient::connect(&[addr], Duration::from_secs(1)).unwrap_err();
    assert!(matches!(err, StoreError::NotTcpStore { .. }), "{err:?}");
    assert!(start.elapsed() < Duration::from_secs(5));
    drop(silent);
}

/// A stand-in server that answers the handshake's CHECK, then sends
/// `reply` to the next request.
fn hostile_server(reply: Vec<u8>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        // VALIDATE (5 bytes) and CHECK of no keys (9 bytes).
        let mut hello = [0u8; 14];
        s.read_exact(&mut hello).unwrap();
        s.write_all(&[0]).unwrap();
        let mut request = [0u8; 64];
        let _ = s.read(&mut request);
        let _ = s.write_all(&reply);
        std::thread::sleep(Duration::from_secs(2));
    });
    addr
}

#[test]
fn hostile_replies_are_typed_errors() {
    // A value declaring 2^64-1 bytes: refused from its length alone.
    let c = torch_client_for(hostile_server(u64::MAX.to_le_bytes().to_vec()));
    let err = c.compare_set("k", b"", b"v").unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::TcpStore {
                source: TcpStoreError::TooLarge { .. },
                ..
            }
        ),
        "{err:?}"
    );
    // A check byte that is neither 0 nor 1.
    let c = torch_client_for(hostile_server(vec![9]));
    let err = c.try_get("k").unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::TcpStore {
                source: TcpStoreError::BadStatus { byte: 9, .. },
                ..
            }
        ),
        "{err:?}"
    );
    // A reply cut short, then the connection closed.
    let c = torch_client_for(hostile_server(vec![5, 0, 0]));
    let err = c.add("k", 1).unwrap_err();
    assert!(matches!(err, StoreError::ServerGone { .. }), "{err:?}");
}

/// torch's cancel race: the keys appear just as the wait times out, so a
/// STOP_WAITING is on its way when CANCEL_WAIT goes out and the cancel's
/// own WAIT_CANCELED follows it. The wait succeeds (the keys are there),
/// and the next request reads its own reply, not a stale wait byte.
#[test]
fn a_wait_answered_as_it_is_cancelled_succeeds_and_stays_in_step() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut hello = [0u8; 14]; // VALIDATE, CHECK of no keys
        s.read_exact(&mut hello).unwrap();
        s.write_all(&[0]).unwrap();
        // WAIT of one key "/k": command, count, length, 2 bytes. No answer.
        let mut wait = [0u8; 1 + 8 + 8 + 2];
        s.read_exact(&mut wait).unwrap();
        assert_eq!(wait[0], 6, "a WAIT");
        let mut cancel = [0u8; 1];
        s.read_exact(&mut cancel).unwrap();
        assert_eq!(cancel[0], 12, "a CANCEL_WAIT");
        // STOP_WAITING (late), then WAIT_CANCELED.
        s.write_all(&[0, 1]).unwrap();
        // ADD "/n" 1: command, length, 2 bytes, delta.
        let mut add = [0u8; 1 + 8 + 2 + 8];
        s.read_exact(&mut add).unwrap();
        assert_eq!(add[0], 4, "an ADD");
        s.write_all(&41i64.to_le_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(200));
    });
    let c = torch_client_for(addr);
    c.wait(&["k"], Duration::from_millis(200))
        .expect("the keys came as the wait was cancelled");
    assert_eq!(c.add("n", 1).unwrap(), 41);
    server.join().unwrap();
}

/// `world` ranks (threads) meet at the TCPStore as attempt `attempt` of run
/// "run", all-reduce and broadcast, and check the results.
fn ranks_meet(addr: SocketAddr, world: usize, attempt: u64) {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                s.spawn(move || {
                    let comm = Builder::new()
                        .rank(rank)
                        .world_size(world)
                        .store_addr(addr)
                        .store_kind(StoreKind::Torch)
                        .elastic_attempt("run", attempt)
                        .connect_timeout(Duration::from_secs(20))
                        .build()
                        .wait()
                        .expect("rendezvous through the TCPStore");
                    let n = 1001;
                    let mine: Vec<f64> = (0..n).map(|i| (i * (rank + 1)) as f64).collect();
                    let sum = comm.all_reduce(mine, ReduceOp::Sum).wait().unwrap();
                    let factor = (world * (world + 1) / 2) as f64;
                    for (i, v) in sum.iter().enumerate() {
                        assert_eq!(*v, i as f64 * factor, "rank {rank} element {i}");
                    }
                    let root = world - 1;
                    let data = if rank == root {
                        vec![7i32; 33]
                    } else {
                        vec![0i32; 33]
                    };
                    assert_eq!(comm.broadcast(data, root).wait().unwrap(), vec![7i32; 33]);
                })
            })
            .collect();
        for h in handles {
            h.join().expect("rank thread");
        }
    });
}

#[test]
fn ranks_meet_at_a_torch_store_once_per_attempt() {
    let Some(mut torch) = TorchStore::start("libuv") else {
        return;
    };
    ranks_meet(torch.addr, 3, 0);
    // The keys are where torch's own client sees them.
    assert_eq!(
        torch.py("check ringwire/default/run/attempt_0/world_3/addr/2"),
        "True"
    );
    // A second attempt in the same store claims the same ranks again: it
    // works only because its keys are apart from the first attempt's.
    ranks_meet(torch.addr, 3, 1);
    assert_eq!(
        torch.py("check ringwire/default/run/attempt_1/world_3/addr/2"),
        "True"
    );
}
