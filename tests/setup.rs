//! Setup paths: IPv6, interface choice, a store that is unreachable or goes
//! away during rendezvous, world-size disagreement.

mod common;

use common::on_all;
use ringwire::store::StoreServer;
use ringwire::testing::in_a_child;
use ringwire::{Communicator, Error, ReduceOp};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

fn group_at(
    store: SocketAddr,
    world: usize,
    ifname: Option<&str>,
) -> Vec<Result<Communicator, Error>> {
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..world)
            .map(|rank| {
                let mut b = Communicator::builder()
                    .rank(rank)
                    .world_size(world)
                    .store_addr(store)
                    .host_store(false)
                    .connect_timeout(Duration::from_secs(10));
                if let Some(i) = ifname {
                    b = b.socket_ifname(i);
                }
                s.spawn(move || b.build().wait())
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn ipv6_loopback_works_end_to_end() {
    let Ok(store) = StoreServer::bind("[::1]:0".parse().unwrap()) else {
        eprintln!("SKIP: ::1 is not available here");
        return;
    };
    let comms: Vec<_> = group_at(store.local_addr(), 3, None)
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let sums = on_all(&comms, |c| {
        c.all_reduce(vec![c.rank() as i64 + 1; 100], ReduceOp::Sum)
            .wait()
            .unwrap()
    });
    assert!(sums.iter().all(|s| s == &vec![6i64; 100]));
}

#[test]
fn interface_by_name_and_a_wrong_name_is_explained() {
    let store = StoreServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let comms: Vec<_> = group_at(store.local_addr(), 2, Some("lo"))
        .into_iter()
        .map(Result::unwrap)
        .collect();
    on_all(&comms, |c| c.barrier().wait().unwrap());
    drop(comms);

    let store = StoreServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let err = Communicator::builder()
        .rank(0)
        .world_size(2)
        .store_addr(store.local_addr())
        .host_store(false)
        .socket_ifname("nosuchif0")
        .connect_timeout(Duration::from_secs(2))
        .build()
        .wait()
        .unwrap_err()
        .to_string();
    assert!(err.contains("nosuchif0") && err.contains("lo"), "{err}");
}

#[test]
fn unreachable_store_fails_after_the_connect_timeout_naming_the_address() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let start = Instant::now();
    let err = Communicator::builder()
        .rank(1)
        .world_size(2)
        .store("127.0.0.1", port)
        .connect_timeout(Duration::from_millis(500))
        .build()
        .wait()
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Store(_)), "{msg}");
    assert!(
        msg.contains(&port.to_string()) && msg.contains("MASTER_ADDR"),
        "{msg}"
    );
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[test]
fn store_gone_before_rendezvous_completes_is_a_clear_error() {
    let store = StoreServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = store.local_addr();
    // Ranks 0 and 1 of 3 join; rank 2 never does; then the store goes away.
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        drop(store);
    });
    let results = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|rank| {
                s.spawn(move || {
                    Communicator::builder()
                        .rank(rank)
                        .world_size(3)
                        .store_addr(addr)
                        .host_store(false)
                        .connect_timeout(Duration::from_secs(30))
                        .build()
                        .wait()
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    killer.join().unwrap();
    for r in results {
        let msg = r.unwrap_err().to_string();
        assert!(
            msg.contains("closed the connection") || msg.contains("rank 0"),
            "{msg}"
        );
    }
}

#[test]
fn a_rank_that_never_joins_is_named() {
    let store = StoreServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let err = Communicator::builder()
        .rank(0)
        .world_size(2)
        .store_addr(store.local_addr())
        .host_store(false)
        .connect_timeout(Duration::from_millis(400))
        .build()
        .wait()
        .unwrap_err()
        .to_string();
    assert!(err.contains("rank 1 did not join"), "{err}");
}

#[test]
fn world_size_disagreement_is_named() {
    let store = StoreServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = store.local_addr();
    let errs = std::thread::scope(|s| {
        let a = s.spawn(move || {
            Communicator::builder()
                .rank(0)
                .world_size(2)
                .store_addr(addr)
                .host_store(false)
                .connect_timeout(Duration::from_secs(2))
                .build()
                .wait()
        });
        std::thread::sleep(Duration::from_millis(100));
        let b = s.spawn(move || {
            Communicator::builder()
                .rank(1)
                .world_size(3)
                .store_addr(addr)
                .host_store(false)
                .connect_timeout(Duration::from_secs(2))
                .build()
                .wait()
        });
        (a.join().unwrap(), b.join().unwrap())
    });
    let msg = errs.1.unwrap_err().to_string();
    assert!(
        msg.contains("WORLD_SIZE=3") && msg.contains("WORLD_SIZE=2"),
        "{msg}"
    );
    // Rank 0 learns why from the store instead of waiting for rank 1.
    let msg = errs.0.unwrap_err().to_string();
    assert!(
        msg.contains("rank 1 could not join") && msg.contains("WORLD_SIZE=3"),
        "{msg}"
    );
}

#[test]
fn ranks_with_different_schedule_settings_all_fail_naming_the_setting() {
    // Each of these settings picks how collectives cut and route their
    // data; a rank that differs from rank 0 would pair frames of different
    // schedules. Every rank fails at setup, naming the setting and values.
    type Set = fn(ringwire::Builder) -> ringwire::Builder;
    let cases: [(&str, &str, Set); 3] = [
        ("RINGWIRE_CHUNK_BYTES", "4096", |b| b.chunk_bytes(4096)),
        ("RINGWIRE_SMALL_MESSAGE_BYTES", "64", |b| {
            b.small_message_bytes(64)
        }),
        ("RINGWIRE_DEBUG", "detail", |b| b.debug_checks(true)),
    ];
    for (setting, value, set) in cases {
        let store = StoreServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = store.local_addr();
        let results: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..3)
                .map(|rank| {
                    let mut b = Communicator::builder()
                        .rank(rank)
                        .world_size(3)
                        .store_addr(addr)
                        .host_store(false)
                        // Far longer than the test may take: a rank that
                        // waited for the odd one out would fail the
                        // message checks below, not just be slow.
                        .connect_timeout(Duration::from_secs(60));
                    if rank == 2 {
                        b = set(b);
                    }
                    s.spawn(move || b.build().wait())
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (rank, r) in results.into_iter().enumerate() {
            let msg = r.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(
                msg.contains(setting) && msg.contains("rank 2 has") && msg.contains(value),
                "rank {rank}, {setting}: {msg}"
            );
            if rank != 2 {
                assert!(msg.contains("rank 2 could not join"), "{msg}");
            }
        }
    }
}

#[test]
fn env_errors_reach_the_user_unchanged() {
    // Builder-level checks that do not need the environment.
    let e = Communicator::builder()
        .rank(3)
        .world_size(2)
        .build()
        .wait()
        .unwrap_err()
        .to_string();
    assert!(e.contains("rank 3 is out of range for world size 2"), "{e}");
    let e = Communicator::builder()
        .rank(0)
        .world_size(2)
        .build()
        .wait()
        .unwrap_err()
        .to_string();
    assert!(e.contains("MASTER_ADDR"), "{e}");
}

/// Every other test of this file, again on the portable transport (the
/// default run uses the io_uring engine where it works).
#[test]
fn on_the_portable_transport_too() {
    common::rerun_on_portable("on_the_portable_transport_too");
}

/// A one-rank communicator on a standalone store, asking for `kind`.
fn single(store: &StoreServer, kind: ringwire::TransportKind) -> Result<Communicator, Error> {
    Communicator::builder()
        .rank(0)
        .world_size(1)
        .store_addr(store.local_addr())
        .host_store(false)
        .transport(kind)
        .build()
        .wait()
}

#[test]
fn where_io_uring_is_refused_auto_falls_back_and_forcing_uring_says_why() {
    // As under Docker's default seccomp profile: io_uring_setup gets EPERM
    // (on this thread and the threads it starts, so other tests still have
    // io_uring).
    std::thread::spawn(|| {
        ringwire_uring::testing::refuse_io_uring_on_this_thread().unwrap();
        let store = StoreServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let auto = single(&store, ringwire::TransportKind::Auto).unwrap();
        assert_eq!(auto.transport_name(), "portable");
        let mut buf = vec![1.0f32; 10];
        auto.all_reduce_slice(&mut buf, ReduceOp::Sum).unwrap();
        let err = single(&store, ringwire::TransportKind::Uring)
            .expect_err("uring cannot start here")
            .to_string();
        assert!(
            err.contains("seccomp") && err.contains("RINGWIRE_TRANSPORT=portable"),
            "{err}"
        );
    })
    .join()
    .unwrap();
}

#[test]
fn where_shared_memory_is_refused_local_links_stay_unix_sockets() {
    // As in a sandbox that forbids memfd_create: the dialer cannot make a
    // segment, says so, and both ends keep the Unix link (with a warning).
    std::thread::spawn(|| {
        ringwire_uring::testing::refuse_memfd_on_this_thread().unwrap();
        let (_store, comms) = common::local_group(2, |b| b.local_links(ringwire::LocalLinks::Shm));
        let sums = on_all(&comms, |c| {
            c.all_reduce(vec![c.rank() as f32 + 1.0; 1000], ReduceOp::Sum)
                .wait()
                .unwrap()
        });
        assert!(sums.iter().all(|s| s.iter().all(|&v| v == 3.0)));
        for c in &comms {
            let peer = 1 - c.rank();
            assert_eq!(c.link_kind(peer), Some("unix"), "rank {}", c.rank());
        }
    })
    .join()
    .unwrap();
    // Elsewhere in the process, the same settings share memory.
    let (_store, comms) = common::local_group(2, |b| b.local_links(ringwire::LocalLinks::Shm));
    on_all(&comms, |c| c.barrier().wait().unwrap());
    assert_eq!(comms[0].link_kind(1), Some("shm"));
}

/// Set in the child process of the test below.
const AS_NOBODY: &str = "RINGWIRE_TEST_AS_NOBODY";

#[test]
fn as_an_unprivileged_user_the_engine_runs_within_the_locked_memory_limit() {
    // For users without CAP_IPC_LOCK the kernel charges io_uring rings to
    // RLIMIT_MEMLOCK (the engine registers no buffers: decision 0007).
    // Shown as `nobody` in a child process (CI runs as root, whose
    // CAP_IPC_LOCK would hide the limit): with systemd's default 8 MiB the
    // engine runs; with none, auto falls back to the portable transport and
    // forcing uring fails naming the limit and how to raise it.
    if std::env::var_os(AS_NOBODY).is_some() {
        use nix::sys::resource::{Resource, setrlimit};
        use nix::unistd::{Gid, Uid, User, setgid, setuid};
        // systemd's default for users (set while still root, who may raise
        // it); rings are charged to the user across processes and freed
        // asynchronously, so far less is flaky. A non-root developer whose
        // hard limit is lower keeps their limit and tests the refusal only.
        let roomy = setrlimit(Resource::RLIMIT_MEMLOCK, 8 << 20, 8 << 20).is_ok();
        if Uid::effective().is_root() {
            let nobody = User::from_name("nobody").unwrap().expect("user nobody");
            setgid(Gid::from_raw(nobody.gid.as_raw())).unwrap();
            setuid(nobody.uid).unwrap();
        }
        assert!(!Uid::effective().is_root());
        if roomy {
            let (_store, comms) =
                common::local_group(2, |b| b.transport(ringwire::TransportKind::Uring));
            let sums = on_all(&comms, |c| {
                let mut v = vec![c.rank() as f32 + 1.0; 300_000];
                c.all_reduce_slice(&mut v, ReduceOp::Sum).unwrap();
                (c.transport_name(), v.iter().all(|x| *x == 3.0))
            });
            assert_eq!(sums, vec![("uring", true), ("uring", true)]);
        } else {
            eprintln!(
                "note: the hard RLIMIT_MEMLOCK is below 8 MiB here; only the refusal is tested"
            );
        }

        setrlimit(Resource::RLIMIT_MEMLOCK, 0, 0).expect("lower RLIMIT_MEMLOCK");
        let store = StoreServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let auto = single(&store, ringwire::TransportKind::Auto).unwrap();
        assert_eq!(auto.transport_name(), "portable");
        drop(auto);
        let store = StoreServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let err = single(&store, ringwire::TransportKind::Uring)
            .expect_err("no ring fits in no locked memory")
            .to_string();
        assert!(
            err.contains("RLIMIT_MEMLOCK is 0 KiB") && err.contains("ulimit -l"),
            "{err}"
        );
        return;
    }
    in_a_child(
        "as_an_unprivileged_user_the_engine_runs_within_the_locked_memory_limit",
        AS_NOBODY,
    );
}

/// Set in the child of `a_low_open_file_limit_is_raised_so_every_peer_links`.
const LOW_NOFILE: &str = "RINGWIRE_TEST_LOW_NOFILE";

#[test]
fn a_low_open_file_limit_is_raised_so_every_peer_links() {
    // A child process starts with a soft RLIMIT_NOFILE of 64, below what
    // six ranks in one process need with every pair linked over TCP (three
    // descriptors per link end, plus listeners, rings and the store's): the
    // transports raise it, and an all-to-all over every link runs.
    if std::env::var_os(LOW_NOFILE).is_some() {
        use nix::sys::resource::{Resource, getrlimit, setrlimit};
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        setrlimit(Resource::RLIMIT_NOFILE, 64, hard).expect("lower the soft limit");
        let world = 6;
        let (_store, comms) =
            common::local_group(world, |b| b.local_links(ringwire::LocalLinks::Tcp));
        let per = 3;
        let got = on_all(&comms, |c| {
            let input: Vec<i32> = (0..world * per)
                .map(|i| (c.rank() * 1000 + i) as i32)
                .collect();
            let mut output = vec![0i32; world * per];
            c.all_to_all_slice(&input, &mut output).map(|()| output)
        });
        for (rank, out) in got.into_iter().enumerate() {
            let out = out.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
            let want: Vec<i32> = (0..world)
                .flat_map(|src| (0..per).map(move |k| (src * 1000 + rank * per + k) as i32))
                .collect();
            assert_eq!(out, want, "rank {rank}");
        }
        let (soft, _) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        assert!(soft > 64, "the soft limit stayed at {soft}");
        return;
    }
    in_a_child(
        "a_low_open_file_limit_is_raised_so_every_peer_links",
        LOW_NOFILE,
    );
}

/// Set in the child of `an_engine_link_holds_one_descriptor_per_connection`.
const COUNT_FDS: &str = "RINGWIRE_TEST_COUNT_FDS";

#[test]
fn an_engine_link_holds_one_descriptor_per_connection() {
    // The engine shares each connection's descriptor with the transport
    // (no duplicates): a TCP link with its two lanes costs each end three,
    // a Unix link one. Counted in a child, where no other test opens files.
    if std::env::var_os(COUNT_FDS).is_some() {
        let open = || std::fs::read_dir("/proc/self/fd").unwrap().count();
        use ringwire::LocalLinks;
        for (links, kind, per_end) in [(LocalLinks::Tcp, "tcp", 3), (LocalLinks::Unix, "unix", 1)] {
            let (_store, comms) = common::local_group(2, |b| {
                b.local_links(links)
                    .transport(ringwire::TransportKind::Uring)
            });
            let before = open();
            // Large enough to use the lanes, which are made with the link.
            let n = 1 << 20;
            let sums = on_all(&comms, |c| {
                c.all_reduce(vec![1.0f32; n], ReduceOp::Sum).wait().unwrap()
            });
            assert!(sums.iter().all(|s| s.iter().all(|&v| v == 2.0)));
            assert_eq!(comms[0].link_kind(1), Some(kind));
            assert_eq!(open() - before, 2 * per_end, "{links:?} link, both ends");
        }
        return;
    }
    if ringwire::uring_status().starts_with("io_uring cannot run") {
        eprintln!("note: io_uring is unavailable here; the engine's links are not counted");
        return;
    }
    in_a_child(
        "an_engine_link_holds_one_descriptor_per_connection",
        COUNT_FDS,
    );
}
