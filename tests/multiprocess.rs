//! The collective sweep with every rank in its own process, launched the way
//! torchrun launches ranks (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT),
//! with rank 0 hosting the store: world sizes 1 to 4.
//!
//! The parent test re-runs this test binary once per rank with
//! `--exact child_rank --include-ignored`; `child_rank` does the rank's work
//! and is ignored in a normal run.

mod common;
#[path = "netns/mod.rs"]
mod netns;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CHILD_VAR: &str = "RINGWIRE_TEST_CHILD";

/// A port for rank 0's store that no socket uses, below the kernel's
/// ephemeral range.
///
/// Rank 0 once failed to bind a port found free (EADDRINUSE, in CI and in
/// 2 of 3 local full runs, while this binary's tests and its two re-runs
/// loaded the machine). Two ways explain it:
/// - a port from `bind(0)` is free again once released, so any concurrent
///   `bind(0)` or `connect()` may take it; the kernel hands out none below
///   `ip_local_port_range` by itself;
/// - a socket the test opens to try the port is inherited by any child
///   another test thread spawns in that instant, and stays open, listening,
///   until that child's `exec` (late, on two loaded cores).
///
/// So no socket is opened here: the ports in use are read from
/// /proc/net/tcp{,6}. A per-process counter started at an offset from the
/// pid keeps this binary's tests and its re-runs apart; `spawn_rank_0`
/// retries the rare collision left.
fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ephemeral_low: u32 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768);
    let span = 8000.min(ephemeral_low.saturating_sub(10_000));
    assert!(
        span >= 100,
        "ip_local_port_range starts at {ephemeral_low}: no room below it for test ports"
    );
    let low = ephemeral_low - span;
    let in_use = ports_in_use();
    let offset = std::process::id().wrapping_mul(97);
    for _ in 0..span {
        let i = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (low + offset.wrapping_add(i) % span) as u16;
        if !in_use.contains(&port) {
            return port;
        }
    }
    panic!("no free port in {low}..{ephemeral_low}");
}

/// Local ports of every TCP socket on this host's network namespace, in
/// any state (listening, connected, TIME_WAIT), from /proc/net/tcp{,6}.
fn ports_in_use() -> std::collections::HashSet<u16> {
    let mut ports = std::collections::HashSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(table) = std::fs::read_to_string(table) else {
            continue;
        };
        // "  sl  local_address rem_address st ...": the local address is
        // HEXADDR:HEXPORT.
        ports.extend(table.lines().skip(1).filter_map(|line| {
            let local = line.split_whitespace().nth(1)?;
            u16::from_str_radix(local.rsplit_once(':')?.1, 16).ok()
        }));
    }
    ports
}

fn launch(world: usize, seed: u64, extra_env: &[(&str, String)]) -> Vec<std::process::Output> {
    spawn_ranks(world, seed, extra_env)
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect()
}

/// A command that runs this test binary as `rank` of `world` (its
/// `child_rank` test), with the store of rank 0 at 127.0.0.1:`port`.
fn rank_command(rank: usize, world: usize, port: u16, seed: u64) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "child_rank",
        "--include-ignored",
        "--nocapture",
        "--test-threads",
        "1",
    ])
    .env(CHILD_VAR, "1")
    .env("RANK", rank.to_string())
    .env("WORLD_SIZE", world.to_string())
    .env("LOCAL_RANK", rank.to_string())
    .env("LOCAL_WORLD_SIZE", world.to_string())
    .env("MASTER_ADDR", "127.0.0.1")
    .env("MASTER_PORT", port.to_string())
    .env("RINGWIRE_TEST_SEED", seed.to_string())
    .env("RINGWIRE_TIMEOUT", "60")
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    cmd
}

/// Spawns rank 0 on a `free_port`, as `command(port)` makes it, and waits
/// until its store listens, so the other ranks start against a store that
/// is there. If rank 0 could not bind the port (see `free_port`) it tries
/// another. A rank 0 without a store (world 1) is returned as it runs.
fn spawn_rank_0(world: usize, command: impl Fn(u16) -> Command) -> (Child, u16) {
    for _ in 0..5 {
        let port = free_port();
        let mut child = command(port).spawn().expect("spawn rank 0");
        if world == 1 {
            return (child, port);
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return (child, port);
            }
            if child.try_wait().expect("rank 0's status").is_some() {
                let out = child.wait_with_output().expect("rank 0's output");
                let text = String::from_utf8_lossy(&out.stdout).into_owned()
                    + &String::from_utf8_lossy(&out.stderr);
                assert!(
                    text.contains("could not start the store"),
                    "rank 0 ended before its store listened:\n{text}"
                );
                eprintln!("rank 0 could not bind port {port}; trying another");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "rank 0's store did not listen on {port} within a minute"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    panic!("rank 0 could not start its store on any of 5 ports");
}

fn spawn_ranks(world: usize, seed: u64, extra_env: &[(&str, String)]) -> Vec<Child> {
    spawn_ranks_at(world, seed, extra_env).0
}

/// [`spawn_ranks`], and the port of rank 0's store.
fn spawn_ranks_at(world: usize, seed: u64, extra_env: &[(&str, String)]) -> (Vec<Child>, u16) {
    let command = |rank: usize, port: u16| {
        let mut cmd = rank_command(rank, world, port, seed);
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        cmd
    };
    let (first, port) = spawn_rank_0(world, |port| command(0, port));
    let children = std::iter::once(first)
        .chain((1..world).map(|rank| command(rank, port).spawn().expect("spawn rank")))
        .collect();
    (children, port)
}

/// Copies of every socket of process `pid` (pidfd_getfd), as a child it
/// forked (a data loader's worker, say) would hold them: while they are
/// open, its peers see none of its sockets close when it dies.
fn hold_sockets_of(pid: u32) -> Vec<std::os::fd::OwnedFd> {
    use rustix::process::{Pid, PidfdFlags, PidfdGetfdFlags, pidfd_getfd, pidfd_open};
    let pidfd = pidfd_open(Pid::from_raw(pid as i32).unwrap(), PidfdFlags::empty()).unwrap();
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().starts_with("socket:"))
        })
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter_map(|fd| pidfd_getfd(&pidfd, fd, PidfdGetfdFlags::empty()).ok())
        .collect()
}

fn unix_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// (unix ms when the rank saw its error, the error) from a child's output.
fn child_error(out: &std::process::Output) -> Option<(u128, String)> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("CHILD-LOOP-ERR ").map(|x| x.1.to_string()))?;
    let (ms, msg) = line.split_once(' ')?;
    Some((ms.parse().ok()?, msg.to_string()))
}

fn run_world(world: usize) {
    let seed = common::seed();
    let start = Instant::now();
    let outputs = launch(world, seed, &[]);
    for (rank, out) in outputs.iter().enumerate() {
        assert!(
            out.status.success(),
            "seed {seed}: rank {rank} of {world} failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("CHILD-OK"),
            "rank {rank} did not run the sweep"
        );
    }
    eprintln!("world {world}: {:?}", start.elapsed());
}

#[test]
#[ignore = "runs only as a child of the multi-process tests"]
fn child_rank() {
    if std::env::var(CHILD_VAR).is_err() {
        return;
    }
    common::init_logging();
    let seed: u64 = std::env::var("RINGWIRE_TEST_SEED")
        .unwrap()
        .parse()
        .unwrap();
    let comm = ringwire::Communicator::from_env()
        .wait()
        .expect("join from env");
    if let Ok(mode) = std::env::var("RINGWIRE_TEST_MODE") {
        if mode == "loop" {
            // All-reduce (or broadcast, RINGWIRE_TEST_OP) until something
            // fails (or a minute passes). 4 MiB: at 4 ranks its 1 MiB
            // blocks go on lanes over TCP links (decision 0018), so a peer
            // killed mid-op is seen there too.
            let start = Instant::now();
            let len = std::env::var("RINGWIRE_TEST_LEN").map_or(1 << 20, |v| v.parse().unwrap());
            let broadcast = std::env::var("RINGWIRE_TEST_OP").is_ok_and(|op| op == "broadcast");
            let mut buf = vec![1.0f32; len];
            while start.elapsed() < Duration::from_secs(60) {
                let op = match broadcast {
                    true => comm.broadcast(buf, 0),
                    false => comm.all_reduce(buf, ringwire::ReduceOp::Max),
                };
                match op.wait() {
                    Ok(b) => buf = b,
                    Err(e) => {
                        println!("CHILD-LOOP-ERR {} {e}", unix_ms());
                        if std::env::var_os("RINGWIRE_TEST_RECOVER").is_some() {
                            // The survivors go on without the lost rank.
                            let shrunk = comm.shrink().wait().expect("shrink");
                            let sums = shrunk
                                .all_reduce(vec![1.0f32; 1024], ringwire::ReduceOp::Sum)
                                .wait()
                                .expect("an all-reduce on the shrunk communicator");
                            println!(
                                "CHILD-RECOVERED {} {} {} {}",
                                unix_ms(),
                                shrunk.rank(),
                                shrunk.world_size(),
                                sums[0]
                            );
                            // Exits at once: the others still finishing
                            // their op must get what this one sent.
                            return;
                        }
                        // Stay linked a moment: a survivor that exited at
                        // once could fail another, still in a send to it,
                        // with its own end ("lost rank 2: broken pipe")
                        // before that one read the abort naming the cause.
                        std::thread::sleep(Duration::from_millis(500));
                        if std::env::var_os("RINGWIRE_TEST_EXPECT_ARENA").is_some() {
                            println!("CHILD-ARENA {:?}", comm.shared_memory_arena());
                        }
                        // Shared memory goes with the communicator: no
                        // mapping is left in this survivor.
                        // (The transport's threads may hold a link for the
                        // tick they are in: a leak stays, they do not.)
                        drop(comm);
                        let mappings = || {
                            let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
                            maps.lines().filter(|l| l.contains("ringwire-shm")).count()
                        };
                        let mut left = mappings();
                        for _ in 0..50 {
                            if left == 0 {
                                break;
                            }
                            std::thread::sleep(Duration::from_millis(20));
                            left = mappings();
                        }
                        println!("CHILD-SHM-MAPPINGS {left}");
                        return;
                    }
                }
            }
            println!("CHILD-LOOP-END");
            return;
        }
        if mode == "netem" {
            // A short correctness sweep that tolerates a slow, lossy network.
            let (rank, world) = (comm.rank(), comm.world_size());
            for len in [0usize, 1, 1000, 1 << 20] {
                let ins: Vec<Vec<f32>> = (0..world)
                    .map(|r| {
                        ringwire::testing::random_data(
                            &mut ringwire::testing::Rng::new(seed ^ r as u64 ^ len as u64),
                            len,
                            ringwire::ReduceOp::Sum,
                        )
                    })
                    .collect();
                let reference = ringwire::testing::reference_reduce(&ins, ringwire::ReduceOp::Sum);
                let got = comm
                    .all_reduce(ins[rank].clone(), ringwire::ReduceOp::Sum)
                    .wait()
                    .unwrap();
                ringwire::testing::check_close(&got, &reference, world).unwrap();
                let got = comm.broadcast(ins[rank].clone(), world - 1).wait().unwrap();
                assert_eq!(got, ins[world - 1]);
                let (_, got) = comm
                    .all_gather(ins[rank].clone(), vec![0f32; len * world])
                    .wait()
                    .unwrap();
                assert_eq!(got, ins.concat());
                if len == 1000 {
                    // A peer in another network namespace, whose abstract
                    // Unix sockets are out of reach, is linked over TCP;
                    // one in this namespace as local links are asked
                    // for. (A barrier links every pair at 2 and 4 ranks;
                    // checked while ops remain, so no peer has exited.)
                    comm.barrier().wait().unwrap();
                    let per_ns: usize =
                        std::env::var("RINGWIRE_TEST_PER_NS").map_or(1, |v| v.parse().unwrap());
                    for q in (0..world).filter(|&q| q != rank) {
                        let want = match q / per_ns == rank / per_ns {
                            true => common::expected_local_link(),
                            false => "tcp",
                        };
                        assert_eq!(comm.link_kind(q), Some(want), "rank {rank} to {q}");
                    }
                }
            }
            if std::env::var_os("RINGWIRE_TEST_EXPECT_TWO_LEVEL").is_some() {
                // Two levels ran (decision 0033): the stats say so.
                let before = comm.stats().two_level_ops;
                let got = comm.all_reduce(vec![1i32; 1 << 20], ringwire::ReduceOp::Sum);
                assert!(got.wait().unwrap().iter().all(|&x| x == world as i32));
                assert_eq!(comm.stats().two_level_ops, before + 1, "rank {rank}");
            }
            if let Ok(lanes) = std::env::var("RINGWIRE_TEST_EXPECT_LANES") {
                // Links across namespaces have the lanes asked for, and
                // every lane carried pieces of the sweep's large payloads
                // (decision 0034); the portable transport has none.
                let want = match comm.transport_name() {
                    "uring" => lanes.parse().unwrap(),
                    _ => 0,
                };
                let per_ns: usize =
                    std::env::var("RINGWIRE_TEST_PER_NS").map_or(1, |v| v.parse().unwrap());
                for q in (0..world).filter(|&q| q / per_ns != rank / per_ns) {
                    assert_eq!(comm.link_lanes(q), want, "rank {rank} to {q}");
                    let stats = comm.lane_stats(q);
                    assert_eq!(stats.len(), want, "rank {rank} to {q}");
                    assert!(
                        stats.iter().all(|l| l.pieces_sent > 0),
                        "rank {rank} to {q}: {stats:?}"
                    );
                }
            }
            println!("CHILD-OK rank {rank}");
            return;
        }
        if mode == "slowroot" {
            // A slow root in a loop of reduces, with a small run-ahead
            // limit: the leaves are held back, finish, and exit at once,
            // some of their last frames still unread in the root's socket.
            let rank = comm.rank();
            let world = comm.world_size();
            for i in 0..30usize {
                if rank == 0 {
                    std::thread::sleep(Duration::from_millis(20));
                }
                let len = 1 << 18;
                let got = comm
                    .reduce(vec![(rank + i) as f32; len], 0, ringwire::ReduceOp::Sum)
                    .wait()
                    .unwrap_or_else(|e| panic!("reduce {i}: {e}"));
                let want = (0..world).map(|r| (r + i) as f32).sum::<f32>();
                assert!(rank != 0 || got.iter().all(|&v| v == want), "reduce {i}");
            }
            if rank == 0 {
                let held = comm.stats().held_ahead_peak_bytes;
                assert!(
                    held > 0,
                    "the leaves never ran ahead: the test proves nothing"
                );
            }
            println!("CHILD-OK rank {rank}");
            return;
        }
        if mode == "rejoin" {
            rejoin_child(comm);
            return;
        }
        if mode == "mismatch" {
            // Ranks pass different lengths: every rank must fail naming both.
            let n = 1000 - comm.rank();
            let err = comm
                .all_reduce(vec![1.0f32; n], ringwire::ReduceOp::Sum)
                .wait()
                .unwrap_err();
            println!("CHILD-ERR {err}");
            return;
        }
    }
    common::sweep::every_dtype(&comm, seed).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    // Sub-groups across processes too.
    let sub = comm
        .split(Some((comm.rank() % 2) as u32), 0)
        .unwrap()
        .unwrap();
    let got = sub
        .all_reduce(vec![1i64; 5], ringwire::ReduceOp::Sum)
        .wait()
        .unwrap();
    assert_eq!(got[0] as usize, sub.world_size());
    println!("CHILD-OK rank {}", comm.rank());
}

#[test]
fn processes_world_1() {
    run_world(1);
}

#[test]
fn processes_world_2() {
    run_world(2);
}

#[test]
fn processes_world_3() {
    run_world(3);
}

#[test]
fn processes_world_4() {
    run_world(4);
}

/// Leaves held back by a slow root (decision 0019) finish and exit while
/// their last frames may still sit unread in the root's socket: the root
/// must still get every one.
#[test]
fn processes_a_slow_root_gets_everything_from_leaves_that_exit() {
    let seed = common::seed();
    let env = [
        ("RINGWIRE_TEST_MODE", "slowroot".to_string()),
        ("RINGWIRE_RUN_AHEAD_BYTES", "256K".to_string()),
        // Each rank says it has its host to itself: on a crowded host
        // rooted ops are paced (decision 0024) and leaves cannot run ahead,
        // which this test needs.
        ("LOCAL_RANK", "0".to_string()),
        ("LOCAL_WORLD_SIZE", "1".to_string()),
    ];
    for (rank, out) in launch(3, seed, &env).iter().enumerate() {
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("CHILD-OK"),
            "rank {rank} failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn processes_mismatch_fails_on_every_rank() {
    let outputs = launch(
        2,
        1,
        &[
            ("RINGWIRE_TEST_MODE", "mismatch".into()),
            ("RINGWIRE_TIMEOUT", "10".into()),
        ],
    );
    for (rank, out) in outputs.iter().enumerate() {
        let stdout = String::from_utf8_lossy(&out.stdout);
        let line = stdout
            .lines()
            .find_map(|l| l.split_once("CHILD-ERR").map(|x| x.1))
            .unwrap_or_else(|| {
                panic!(
                    "rank {rank} printed no error:\n{stdout}\n{}",
                    String::from_utf8_lossy(&out.stderr)
                )
            });
        assert!(
            line.contains("1000") && line.contains("999"),
            "rank {rank}: {line}"
        );
    }
}

#[test]
fn a_second_process_claiming_a_rank_is_refused() {
    let command = |rank: usize, port: u16| {
        // Long enough for both claimants to reach the store while the
        // other tests of this binary load the machine (3 s failed once).
        let mut cmd = rank_command(rank, 3, port, 1);
        cmd.env("RINGWIRE_CONNECT_TIMEOUT", "8");
        cmd
    };
    let (first, port) = spawn_rank_0(3, |port| command(0, port));
    let a = command(1, port).spawn().unwrap();
    let b = command(1, port).spawn().unwrap();
    let outs: Vec<_> = [first, a, b]
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let all: String = outs
        .iter()
        .map(|o| {
            String::from_utf8_lossy(&o.stderr).into_owned() + &String::from_utf8_lossy(&o.stdout)
        })
        .collect();
    assert!(all.contains("two processes claim rank 1"), "{all}");
    assert!(
        outs.iter().all(|o| !o.status.success()),
        "nobody may succeed without rank 2"
    );
}

#[test]
fn processes_kill_9_one_of_four_fails_every_other_rank() {
    let env = [
        ("RINGWIRE_TEST_MODE", "loop".to_string()),
        ("RINGWIRE_TIMEOUT", "60".into()),
    ];
    for (rank, took, msg, _) in kill_9_rank_2_of_4(&env, Duration::from_millis(1500)) {
        assert!(
            msg.contains("all_reduce #"),
            "rank {rank} must name the op: {msg}"
        );
        assert!(took < 60_000, "rank {rank} waited for its op timeout");
    }
}

/// Issue 45: rank 2 of four killed mid-loop; each survivor sees its op fail
/// naming rank 2, shrinks with the others to a communicator of three (old
/// order, renumbered) and runs an all-reduce there whose result is right.
#[test]
fn processes_kill_9_one_of_four_the_survivors_shrink_and_go_on() {
    let env = [
        ("RINGWIRE_TEST_MODE", "loop".to_string()),
        ("RINGWIRE_TEST_RECOVER", "1".to_string()),
        ("RINGWIRE_TIMEOUT", "60".into()),
    ];
    let killed_at = unix_ms();
    let survivors = kill_9_rank_2_of_4(&env, Duration::from_millis(1500));
    let mut ranks = Vec::new();
    for (rank, _, _, stdout) in &survivors {
        let line = stdout
            .lines()
            .find_map(|l| l.strip_prefix("CHILD-RECOVERED "))
            .unwrap_or_else(|| panic!("rank {rank} did not go on:\n{stdout}"));
        let fields: Vec<&str> = line.split(' ').collect();
        let (at, new_rank, size, sum): (u128, usize, usize, f32) = (
            fields[0].parse().unwrap(),
            fields[1].parse().unwrap(),
            fields[2].parse().unwrap(),
            fields[3].parse().unwrap(),
        );
        assert_eq!((size, sum), (3, 3.0), "rank {rank}: {line}");
        // Old order: 0, 1, 3 are 0, 1, 2 now.
        assert_eq!(new_rank, if *rank == 3 { 2 } else { *rank });
        eprintln!(
            "rank {rank} (now {new_rank} of 3) finished its first op on the shrunk communicator \
             {} ms after the kill",
            at.saturating_sub(killed_at + 1500)
        );
        ranks.push(new_rank);
    }
    ranks.sort();
    assert_eq!(ranks, [0, 1, 2]);
}

/// In `kill_9_rank_2_of_4`'s env: this process holds copies of rank 2's
/// sockets while it dies (the child sees no such variable).
const HOLD_RANK_2_SOCKETS: &str = "RINGWIRE_TEST_HOLD_RANK_2_SOCKETS";

/// Starts four ranks with `env`, kills rank 2 with SIGKILL after `settle`,
/// and checks that every other rank failed naming rank 2; returns each
/// one's rank, how long after the kill it failed (ms), its error and its
/// stdout.
fn kill_9_rank_2_of_4(
    env: &[(&str, String)],
    settle: Duration,
) -> Vec<(usize, u128, String, String)> {
    let mut children = spawn_ranks(4, 1, env);
    std::thread::sleep(settle);
    let victim = children.remove(2);
    let hold = env.iter().any(|(k, _)| *k == HOLD_RANK_2_SOCKETS);
    let held = match hold {
        true => hold_sockets_of(victim.id()),
        false => Vec::new(),
    };
    // Its links to 3 peers and the store, at least, or the kill closes
    // them and the pidfd is not what the others see.
    assert!(
        !hold || held.len() >= 4,
        "held {} of rank 2's sockets",
        held.len()
    );
    let killed_at = unix_ms();
    let pid = nix::unistd::Pid::from_raw(victim.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
    let _ = victim.wait_with_output();
    let mut survivors = Vec::new();
    for (i, child) in children.into_iter().enumerate() {
        let rank = if i >= 2 { i + 1 } else { i };
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let (at, msg) = child_error(&out).unwrap_or_else(|| {
            panic!(
                "rank {rank} reported no error:\n{stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        let took = at.saturating_sub(killed_at);
        eprintln!("rank {rank} failed {took} ms after the kill: {msg}");
        assert!(
            msg.contains("rank 2"),
            "rank {rank} must name the lost rank: {msg}"
        );
        survivors.push((rank, took, msg, stdout));
    }
    // Open until every survivor failed.
    drop(held);
    survivors
}

/// Ranks on shared memory: one of four killed in the middle of 64 MiB
/// all-reduces (on the arena, in chunks), then of 64 MiB broadcasts (over
/// the links' rings); every other rank fails within about a second naming
/// it (its socket's end, then the abort flood), and nothing is left
/// behind: no mapping in the survivors once their communicator is gone,
/// nothing in /dev/shm (the segments never had a name).
#[test]
fn processes_kill_9_on_shared_memory_fails_the_others_within_a_second() {
    kill_9_on_shared_memory(16 << 20, Loop::AllReduce, false);
    kill_9_on_shared_memory(16 << 20, Loop::Broadcast, false);
}

/// The same during small all-reduces, which run on the shared-memory arena
/// (ranks spin on each other's step words, not on frames): the others
/// still fail within about a second naming rank 2 (its link's socket
/// closes; their waits look at the links), and let go of every mapping.
#[test]
fn processes_kill_9_during_arena_all_reduces_fails_the_others_within_a_second() {
    kill_9_on_shared_memory(16, Loop::AllReduce, false);
}

/// Another process holds rank 2's sockets open while it dies (as a data
/// loader's forked workers hold every socket of their trainer: here the
/// test takes copies with pidfd_getfd), so none of them closes: the others
/// still fail within about a second, from its pidfd, not after the 10 s
/// heartbeat timeout; on the rings and on the arena.
#[test]
fn processes_kill_9_of_a_rank_whose_forked_child_holds_its_links_is_seen_within_a_second() {
    kill_9_on_shared_memory(16 << 20, Loop::Broadcast, true);
    kill_9_on_shared_memory(16, Loop::AllReduce, true);
}

/// What the ranks of `kill_9_on_shared_memory` run in a loop.
#[derive(Clone, Copy, PartialEq)]
enum Loop {
    /// All-reduces: on the arena (checked).
    AllReduce,
    /// Broadcasts of more than the arena's 4 KiB: over the links' rings.
    Broadcast,
}

/// Rank 2 of 4 killed during `ops` of `len` elements on shared memory
/// (with a forked child of rank 2 holding its links open, if `held`).
fn kill_9_on_shared_memory(len: usize, ops: Loop, held: bool) {
    if std::env::var_os("RINGWIRE_LOCAL_LINKS").is_some()
        || std::env::var_os("RINGWIRE_TRANSPORT").is_some()
    {
        return; // a parametrised run: this one sets its own links
    }
    let dev_shm = || -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir("/dev/shm")
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    };
    let before = dev_shm();
    let mut env = vec![
        ("RINGWIRE_TEST_MODE", "loop".to_string()),
        ("RINGWIRE_TEST_LEN", len.to_string()),
        ("RINGWIRE_LOCAL_LINKS", "shm".into()),
        ("RINGWIRE_TIMEOUT", "60".into()),
    ];
    let arena = ops == Loop::AllReduce;
    match ops {
        Loop::AllReduce => env.push(("RINGWIRE_TEST_EXPECT_ARENA", "1".into())),
        Loop::Broadcast => env.push(("RINGWIRE_TEST_OP", "broadcast".into())),
    }
    if held {
        env.push((HOLD_RANK_2_SOCKETS, "1".into()));
    }
    for (rank, took, msg, stdout) in kill_9_rank_2_of_4(&env, Duration::from_millis(2500)) {
        assert!(
            took < 2_000,
            "rank {rank} took {took} ms to see rank 2 die: {msg}"
        );
        assert!(
            !arena || stdout.contains("CHILD-ARENA Some(true)"),
            "rank {rank} did not run on the arena:\n{stdout}"
        );
        assert!(
            stdout.contains("CHILD-SHM-MAPPINGS 0"),
            "rank {rank} kept shared memory mapped:\n{stdout}"
        );
    }
    assert_eq!(dev_shm(), before, "something was left in /dev/shm");
}

#[test]
fn processes_sigstop_is_caught_by_heartbeats() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let env = [
        ("RINGWIRE_TEST_MODE", "loop".to_string()),
        ("RINGWIRE_TIMEOUT", "60".into()),
        ("RINGWIRE_HEARTBEAT_TIMEOUT", "2".into()),
    ];
    let mut children = spawn_ranks(3, 1, &env);
    std::thread::sleep(Duration::from_millis(1500));
    let stopped = children.remove(1);
    let pid = Pid::from_raw(stopped.id() as i32);
    kill(pid, Signal::SIGSTOP).unwrap();
    let stopped_at = unix_ms();
    for (i, child) in children.into_iter().enumerate() {
        let rank = if i >= 1 { i + 1 } else { i };
        let out = child.wait_with_output().unwrap();
        let (at, msg) =
            child_error(&out).unwrap_or_else(|| panic!("rank {rank} reported no error"));
        let took = at.saturating_sub(stopped_at);
        eprintln!("rank {rank} failed {took} ms after SIGSTOP: {msg}");
        assert!(msg.contains("rank 1"), "rank {rank}: {msg}");
    }
    kill(pid, Signal::SIGCONT).unwrap();
    kill(pid, Signal::SIGKILL).ok();
    let _ = stopped.wait_with_output();
}

/// The `rejoin` mode (decision 0040). A member all-reduces until an op
/// fails, shrinks, waits for a replacement and admits it, then
/// all-reduces on the whole world again for two seconds. The replacement
/// (RINGWIRE_REJOIN) joins in `from_env` and does the same. A process that
/// was stopped and excluded meanwhile, woken, finds its op failed and
/// cannot go on: its shrink fails (nobody agrees with it any more).
fn rejoin_child(comm: ringwire::Communicator) {
    let rank = comm.rank();
    // A fixed number of ops (every member runs the same), then a pause in
    // which the woken zombie tries to come back, then one more.
    let go_on = |c: &ringwire::Communicator| {
        for op in 0..=200 {
            if op == 200 {
                std::thread::sleep(Duration::from_secs(2));
            }
            let got = c
                .all_reduce(vec![1.0f32; 4096], ringwire::ReduceOp::Sum)
                .wait()
                .unwrap_or_else(|e| panic!("rank {rank}: all-reduce {op} after the rejoin: {e}"));
            assert!(got.iter().all(|&v| v == c.world_size() as f32));
        }
    };
    if std::env::var_os("RINGWIRE_REJOIN").is_some() {
        println!("CHILD-REJOINED rank {rank} of {}", comm.world_size());
        go_on(&comm);
        println!("CHILD-OK rank {rank}");
        return;
    }
    let err = loop {
        if let Err(e) = comm
            .all_reduce(vec![1.0f32; 4096], ringwire::ReduceOp::Sum)
            .wait()
        {
            break e;
        }
    };
    println!("CHILD-LOOP-ERR {} {err}", unix_ms());
    let shrunk = match comm.shrink().wait() {
        Ok(s) => s,
        Err(e) => {
            // The process that was stopped: the others went on without it.
            println!("CHILD-SHRINK-FAILED rank {rank}: {e}");
            return;
        }
    };
    let until = Instant::now() + Duration::from_secs(60);
    while shrunk.joiners_waiting().expect("joiners_waiting") == 0 {
        assert!(Instant::now() < until, "rank {rank}: no replacement came");
        std::thread::sleep(Duration::from_millis(10));
    }
    let whole = shrunk.admit().wait().expect("admit");
    println!("CHILD-ADMITTED rank {rank} of {}", whole.world_size());
    go_on(&whole);
    println!("CHILD-OK rank {rank}");
}

/// Decision 0040: rank 2 of 4 is stopped (SIGSTOP); the others find it by
/// its silence, shrink, and admit a replacement started in its place;
/// then it is woken (SIGCONT), a zombie: the job goes on undisturbed, and
/// its own attempt to go on fails (its links went silent while it slept:
/// it is cut off from the majority). Were it to dial a member, its old
/// incarnation would be refused (tests/rejoin.rs).
#[test]
fn processes_a_stopped_rank_is_replaced_and_cannot_come_back() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    use std::io::BufRead;
    let env = [
        ("RINGWIRE_TEST_MODE", "rejoin".to_string()),
        ("RINGWIRE_TIMEOUT", "5".into()),
        ("RINGWIRE_HEARTBEAT_TIMEOUT", "1".into()),
    ];
    let (mut children, port) = spawn_ranks_at(4, 1, &env);
    std::thread::sleep(Duration::from_millis(1000));
    let zombie = children.remove(2);
    let pid = Pid::from_raw(zombie.id() as i32);
    kill(pid, Signal::SIGSTOP).unwrap();
    // The store is rank 0's, which stays: the replacement finds it there.
    let mut replacement = rank_command(2, 4, port, 1);
    for (k, v) in &env {
        replacement.env(k, v);
    }
    let mut replacement = replacement
        .env("RINGWIRE_REJOIN", "1")
        .spawn()
        .expect("spawn the replacement");
    // Woken once the replacement is in (its output read to the end
    // meanwhile: a closed pipe would fail its prints).
    let stdout = replacement.stdout.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line.clone());
        }
    });
    let mut said = Vec::new();
    while let Ok(line) = lines.recv_timeout(Duration::from_secs(60)) {
        let rejoined = line.contains("CHILD-REJOINED");
        said.push(line);
        if rejoined {
            break;
        }
    }
    kill(pid, Signal::SIGCONT).unwrap();
    let zombie = zombie.wait_with_output().unwrap();
    let zombie_said = String::from_utf8_lossy(&zombie.stdout).into_owned();
    let rest = replacement.wait_with_output().unwrap();
    reader.join().unwrap();
    said.extend(lines.try_iter());
    let said = said.join("\n");
    assert!(
        said.contains("CHILD-OK rank 2"),
        "the replacement:\n{said}\n{}",
        String::from_utf8_lossy(&rest.stderr)
    );
    for (rank, child) in [0, 1, 3].into_iter().zip(children) {
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            text.contains(&format!("CHILD-ADMITTED rank {rank} of 4"))
                && text.contains(&format!("CHILD-OK rank {rank}")),
            "rank {rank}:\n{text}\n{err}"
        );
    }
    assert!(
        zombie_said.contains("CHILD-SHRINK-FAILED rank 2"),
        "the zombie:\n{zombie_said}\n{}",
        String::from_utf8_lossy(&zombie.stderr)
    );
}

/// Every other test of this file, again on the portable transport (the
/// default run uses the io_uring engine where it works).
#[test]
fn on_the_portable_transport_too() {
    common::rerun_on_portable("on_the_portable_transport_too");
}

/// Every other test of this file, again with local ranks linked over TCP
/// (how ranks on different hosts fail; the default links them with Unix
/// sockets).
#[test]
fn over_tcp_local_links_too() {
    common::rerun_over_tcp_local_links("over_tcp_local_links_too");
}

/// Every other test of this file, again with local ranks on shared memory.
#[test]
fn over_unix_links_too() {
    common::rerun_over_unix_links("over_unix_links_too");
}
