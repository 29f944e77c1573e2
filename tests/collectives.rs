//! Every collective, dtype and reduce op against an f64 reference, on random
//! data, over real sockets with ranks as threads of this process (world
//! sizes 1 to 8), including lengths 0, 1, p-1, lengths not divisible by p,
//! and multi-MiB buffers.

mod common;

use common::sweep::{every_dtype, inputs};
use common::{local_group, local_group_per_rank, on_all, seed};
use ringwire::ReduceOp;
use ringwire::testing::{Rng, check_close, random_data, reference_reduce};
use std::sync::atomic::Ordering;
use std::time::Duration;

fn sweep(world: usize) {
    let seed = seed();
    // A small chunk and threshold so that short buffers also take the
    // chunked ring and chain paths; the large test covers the defaults.
    for (chunk, small) in [
        (64, 64),
        (
            ringwire::DEFAULT_CHUNK_BYTES,
            ringwire::DEFAULT_SMALL_MESSAGE_BYTES,
        ),
    ] {
        let (_store, comms) =
            local_group(world, |b| b.chunk_bytes(chunk).small_message_bytes(small));
        for r in on_all(&comms, |c| every_dtype(c, seed)) {
            r.unwrap_or_else(|e| panic!("seed {seed} chunk {chunk}: {e}"));
        }
    }
}

#[test]
fn world_1() {
    sweep(1);
}
#[test]
fn world_2() {
    sweep(2);
}
#[test]
fn world_3() {
    sweep(3);
}
#[test]
fn world_4() {
    sweep(4);
}
#[test]
fn world_5() {
    sweep(5);
}
#[test]
fn world_8() {
    sweep(8);
}

/// Tests that count the bytes a schedule sends over the links: on shared
/// memory (the default) small ops would run on the arena instead
/// (tests/arena.rs), so these keep Unix sockets unless the run asks for TCP.
fn schedules_over_links(b: ringwire::Builder) -> ringwire::Builder {
    match std::env::var("RINGWIRE_LOCAL_LINKS").as_deref() {
        Ok("tcp") => b,
        _ => b.local_links(ringwire::LocalLinks::Unix),
    }
}

/// Where one host runs more ranks than it has cores, every rank runs small
/// all-reduces as a tree reduce and broadcast (decision 0013). Only rank 0
/// says its host is crowded here: the others must still choose as it does.
#[test]
fn a_crowded_host_switches_every_rank_to_the_tree() {
    let seed = seed();
    for world in [3, 4, 8] {
        for (chunk, small) in [(64, 1 << 20), (ringwire::DEFAULT_CHUNK_BYTES, 1 << 20)] {
            let (_store, comms) = local_group_per_rank(world, |rank, b| {
                let b = schedules_over_links(b.chunk_bytes(chunk).small_message_bytes(small));
                // More ranks than any machine has cores.
                if rank == 0 {
                    b.local_ranks(0, 1 << 16)
                } else {
                    b
                }
            });
            for r in on_all(&comms, |c| every_dtype(c, seed)) {
                r.unwrap_or_else(|e| panic!("seed {seed} p={world} chunk {chunk}: {e}"));
            }
            // Rank 1 is a leaf of both trees: it sends its buffer once (to
            // rank 0); recursive doubling would send it log2(p) times.
            let len = 1000;
            let sent = on_all(&comms, |c| {
                let before = c.stats().bytes_sent;
                c.all_reduce(vec![1f32; len], ReduceOp::Sum).wait().unwrap();
                c.stats().bytes_sent - before
            });
            assert_eq!(sent[1], (len * 4) as u64, "p={world}: rank 1 sent {sent:?}");
        }
    }
}

/// A reduce of several chunks takes the chain: its root receives the
/// buffer once (a binomial tree's root, from ceil(log2 p) children), and
/// the result is right for every root. A one-chunk reduce stays on the
/// tree. Ranks as threads, so one small chunk keeps the buffers small.
#[test]
fn a_reduce_of_many_chunks_reaches_its_root_once() {
    let seed = seed();
    let chunk = 4096;
    for world in [3usize, 4, 5] {
        let depth = world.next_power_of_two().trailing_zeros() as u64;
        let (_store, comms) = local_group(world, |b| {
            schedules_over_links(b.chunk_bytes(chunk).small_message_bytes(chunk))
        });
        for (len, root_gets) in [(8 * chunk / 4 + 3, 1), (chunk / 4, depth)] {
            for root in 0..world {
                let results = on_all(&comms, |c| {
                    let ins = inputs::<f32>(seed, root as u64, world, len, ReduceOp::Sum);
                    let before = c.stats().bytes_received;
                    let got = c
                        .reduce(ins[c.rank()].clone(), root, ReduceOp::Sum)
                        .wait()
                        .map_err(|e| e.to_string())?;
                    let received = c.stats().bytes_received - before;
                    if c.rank() == root {
                        check_close(&got, &reference_reduce(&ins, ReduceOp::Sum), world)?;
                        let want = root_gets * (len * 4) as u64;
                        if received != want {
                            return Err(format!("root received {received} bytes, not {want}"));
                        }
                    }
                    Ok(())
                });
                for r in results {
                    r.unwrap_or_else(|e| {
                        panic!("seed {seed} p={world} len={len} root={root}: {e}")
                    });
                }
            }
        }
    }
}

/// Where some link of the job is TCP, a mid-size all-reduce runs
/// halving-doubling (decision 0022): right at every world size here, an
/// uneven length, and at 4 ranks rank 1 exchanges with rank 3, its
/// second-round partner, which the ring never links it with. With Unix
/// links only, the ring runs.
#[test]
fn mid_size_all_reduces_run_halving_doubling_where_links_are_tcp() {
    use ringwire::LocalLinks::{Tcp, Unix};
    let seed = seed();
    for (links, world) in [(Tcp, 3), (Tcp, 4), (Tcp, 5), (Unix, 4)] {
        let (_store, comms) = local_group(world, |b| b.local_links(links));
        let len = (1 << 20) / 4 + 3;
        let results = on_all(&comms, |c| {
            let ins = inputs::<f32>(seed, world as u64, world, len, ReduceOp::Sum);
            let got = c
                .all_reduce(ins[c.rank()].clone(), ReduceOp::Sum)
                .wait()
                .map_err(|e| e.to_string())?;
            check_close(&got, &reference_reduce(&ins, ReduceOp::Sum), world)?;
            Ok::<_, String>(c.link_kind(3).is_some())
        });
        let linked: Vec<bool> = results
            .into_iter()
            .map(|r| r.unwrap_or_else(|e| panic!("seed {seed} {links:?} p={world}: {e}")))
            .collect();
        if world == 4 {
            assert_eq!(
                linked[1],
                links == Tcp,
                "{links:?}: rank 1 linked with rank 3"
            );
        }
    }
}

/// A gather of large blocks to a root of 3+ ranks goes in turn (decision
/// 0023): a leaf sends only when the root asks, so its op is still under
/// way while the root has not reached the gather. A small block goes at
/// once, as its leaf's op shows by completing meanwhile. (A large one of 2
/// ranks goes at once too, but whether it completes depends on socket
/// buffers: a root that is away does not read.) Blocks arrive right either
/// way.
#[test]
fn large_gathers_come_when_the_root_asks() {
    let seed = seed();
    let large = ringwire::algo::GATHER_IN_TURN_BYTES / 4;
    let cases = [
        (3, large, Some(true)),
        (4, large + 5, Some(true)),
        (3, 1000, Some(false)),
        (2, large, None),
    ];
    for (world, len, in_turn) in cases {
        let (_store, comms) = local_group(world, |b| b);
        let root = 1;
        // The root stays away until every leaf has looked at its op.
        let looked = std::sync::atomic::AtomicUsize::new(0);
        let results = on_all(&comms, |c| {
            let ins = inputs::<f32>(seed, len as u64, world, len, ReduceOp::Sum);
            let room = if c.rank() == root { len * world } else { 0 };
            // Every pair linked first (a lower rank dials on first use).
            c.all_to_all(vec![0u8; world], vec![0u8; world])
                .wait()
                .map_err(|e| e.to_string())?;
            if c.rank() == root {
                let away = std::time::Instant::now();
                while looked.load(Ordering::SeqCst) < world - 1
                    && away.elapsed() < Duration::from_secs(30)
                {
                    std::thread::sleep(Duration::from_millis(5));
                }
                let (_, got) = c
                    .gather(ins[root].clone(), vec![0f32; room], root)
                    .wait()
                    .map_err(|e| e.to_string())?;
                return match got == ins.concat() {
                    true => Ok(None),
                    false => Err("not the concatenation".to_string()),
                };
            }
            let mut pending = c.gather(ins[c.rank()].clone(), vec![0f32; room], root);
            // A direct gather's leaf finishes on its own: give it long.
            let wait = match in_turn {
                Some(false) => Duration::from_secs(10),
                _ => Duration::from_millis(150),
            };
            let early = pending.wait_timeout(wait);
            looked.fetch_add(1, Ordering::SeqCst);
            let done_early = early.is_some();
            match early {
                Some(result) => result,
                None => pending.wait(),
            }
            .map_err(|e| e.to_string())?;
            Ok(Some(done_early))
        });
        for (rank, r) in results.into_iter().enumerate() {
            let r = r.unwrap_or_else(|e| panic!("seed {seed} p={world} n={len}: {e}"));
            if let (Some(done_early), Some(in_turn)) = (r, in_turn) {
                assert_eq!(
                    done_early, !in_turn,
                    "p={world} n={len}: rank {rank}'s gather done before the root came"
                );
            }
        }
    }
}

/// Where ranks share cores, a broadcast, reduce or scatter of 256 KiB to
/// below 16 MiB is paced (decision 0024): a sender waits for its
/// receiver's word, so a broadcast's root is still in its op while a
/// receiver stays away (a root that is not paced has written its 512 KiB
/// into the socket buffers and finished). Results are right for every root
/// and world size.
#[test]
fn rooted_ops_on_a_crowded_host_wait_for_their_receivers() {
    let seed = seed();
    for world in [3, 4] {
        // Rank 0 says its host runs more ranks than any has cores.
        let (_store, comms) = local_group_per_rank(world, |rank, b| match rank {
            0 => b.local_ranks(0, 1 << 16),
            _ => b,
        });
        let len = (ringwire::algo::PACE_FROM_BYTES / 4) * 2 + 3; // 512 KiB and a bit
        let looked = std::sync::atomic::AtomicBool::new(false);
        let results = on_all(&comms, |c| {
            let (rank, root) = (c.rank(), 1);
            let ins = inputs::<f32>(seed, world as u64, world, len, ReduceOp::Sum);
            // Every pair linked first (a lower rank dials on first use).
            c.all_to_all(vec![0u8; world], vec![0u8; world])
                .wait()
                .map_err(|e| e.to_string())?;
            // The root's broadcast waits while rank 2, one it sends to
            // itself (the next rank is a child of the root in the tree), is
            // away.
            let mut still_waiting = None;
            if rank == root {
                let mut pending = c.broadcast(ins[root].clone(), root);
                let early = pending.wait_timeout(Duration::from_millis(150));
                still_waiting = Some(early.is_none());
                looked.store(true, Ordering::SeqCst);
                match early {
                    Some(result) => result,
                    None => pending.wait(),
                }
                .map_err(|e| e.to_string())?;
            } else {
                if rank == 2 {
                    let away = std::time::Instant::now();
                    while !looked.load(Ordering::SeqCst) && away.elapsed() < Duration::from_secs(30)
                    {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
                let got = c
                    .broadcast(vec![0f32; len], root)
                    .wait()
                    .map_err(|e| e.to_string())?;
                if got != ins[root] {
                    return Err("broadcast: not the root's buffer".to_string());
                }
            }
            for root in 0..world {
                let got = c
                    .reduce(ins[rank].clone(), root, ReduceOp::Sum)
                    .wait()
                    .map_err(|e| e.to_string())?;
                if rank == root {
                    check_close(&got, &reference_reduce(&ins, ReduceOp::Sum), world)?;
                }
                let per = len / world;
                let whole: Vec<f32> = ins[root][..per * world].to_vec();
                let input = if rank == root {
                    whole.clone()
                } else {
                    Vec::new()
                };
                let (_, got) = c
                    .scatter(input, vec![0f32; per], root)
                    .wait()
                    .map_err(|e| e.to_string())?;
                if got[..] != whole[rank * per..(rank + 1) * per] {
                    return Err(format!("scatter from {root}: not this rank's block"));
                }
            }
            Ok(still_waiting)
        });
        for (rank, r) in results.into_iter().enumerate() {
            let r = r.unwrap_or_else(|e| panic!("seed {seed} p={world} rank {rank}: {e}"));
            if let Some(still_waiting) = r {
                assert!(
                    still_waiting,
                    "p={world}: the root's broadcast ended while rank 2 was away"
                );
            }
        }
    }
}

#[test]
fn large_buffers_across_chunks() {
    let seed = seed();
    for world in [2, 3, 4] {
        let (_store, comms) = local_group(world, |b| b);
        let len = (3 << 20) / 4 + 7; // ~3 MiB of f32, not divisible by p
        let results = on_all(&comms, |c| {
            let ins = inputs::<f32>(seed, 1, world, len, ReduceOp::Sum);
            let reference = reference_reduce(&ins, ReduceOp::Sum);
            let got = c
                .all_reduce(ins[c.rank()].clone(), ReduceOp::Sum)
                .wait()
                .map_err(|e| e.to_string())?;
            check_close(&got, &reference, world)?;
            let got = c
                .broadcast(ins[c.rank()].clone(), world - 1)
                .wait()
                .map_err(|e| e.to_string())?;
            if got != ins[world - 1] {
                return Err("broadcast".to_string());
            }
            let (_, got) = c
                .all_gather(ins[c.rank()].clone(), vec![0f32; len * world])
                .wait()
                .map_err(|e| e.to_string())?;
            if got != ins.concat() {
                return Err("all_gather".to_string());
            }
            // Reduce-scatter combines each block with the input as it
            // arrives (two ranks: straight into the output).
            let mine = c.block_len(len, c.rank());
            let start: usize = (0..c.rank()).map(|r| c.block_len(len, r)).sum();
            let (back, got) = c
                .reduce_scatter(ins[c.rank()].clone(), vec![0f32; mine], ReduceOp::Sum)
                .wait()
                .map_err(|e| e.to_string())?;
            check_close(&got, &reference[start..start + mine], world)?;
            if back != ins[c.rank()] {
                return Err("reduce_scatter: the input changed".to_string());
            }
            // Rooted reduce: the other ranks read their buffer in place.
            let root = world - 1;
            let got = c
                .reduce(ins[c.rank()].clone(), root, ReduceOp::Min)
                .wait()
                .map_err(|e| e.to_string())?;
            if c.rank() == root {
                check_close(&got, &reference_reduce(&ins, ReduceOp::Min), world)?;
            } else if got != ins[c.rank()] {
                return Err("reduce: a non-root buffer changed".to_string());
            }
            let mut out = vec![f32::NAN; mine];
            c.reduce_scatter_slice(&ins[c.rank()], &mut out, ReduceOp::Max)
                .map_err(|e| e.to_string())?;
            let max = reference_reduce(&ins, ReduceOp::Max);
            check_close(&out, &max[start..start + mine], world)?;
            large_all_to_all(c, seed)
        });
        for r in results {
            r.unwrap_or_else(|e| panic!("seed {seed} p={world}: {e}"));
        }
    }
}

/// All-to-all whose blocks span several chunks: sends read the input where
/// it is and receives land in the output (with two ranks, posted ahead), so
/// a block sent from or received into the wrong place shows here. Owned
/// and blocking forms, and an uneven split with some empty blocks.
fn large_all_to_all(c: &ringwire::Communicator, seed: u64) -> Result<(), String> {
    let (rank, world) = (c.rank(), c.world_size());
    // Block j of rank i's input: distinct random data per (i, j).
    let block = |i: usize, j: usize, len: usize| -> Vec<f32> {
        let mut rng = Rng::new(seed ^ (((i * world + j) as u64 + 1) << 32));
        random_data(&mut rng, len, ReduceOp::Sum)
    };
    let len = (3 << 20) / 4 + 5;
    let input: Vec<f32> = (0..world).flat_map(|j| block(rank, j, len)).collect();
    let expected: Vec<f32> = (0..world).flat_map(|i| block(i, rank, len)).collect();
    let (back, got) = c
        .all_to_all(input.clone(), vec![0f32; len * world])
        .wait()
        .map_err(|e| e.to_string())?;
    if got != expected {
        return Err("all_to_all: blocks misrouted".to_string());
    }
    if back != input {
        return Err("all_to_all: the input changed".to_string());
    }
    let mut out = vec![0f32; len * world];
    c.all_to_all_slice(&input, &mut out)
        .map_err(|e| e.to_string())?;
    if out != expected {
        return Err("all_to_all_slice: blocks misrouted".to_string());
    }
    // Uneven: rank i sends count(i, j) elements to rank j; every third is empty.
    let count = |i: usize, j: usize| {
        if (i + 2 * j) % 3 == 1 {
            0
        } else {
            (1 << 18) + 1000 * (i + 1) + 7 * j
        }
    };
    let send_counts: Vec<usize> = (0..world).map(|j| count(rank, j)).collect();
    let recv_counts: Vec<usize> = (0..world).map(|i| count(i, rank)).collect();
    let input: Vec<f32> = (0..world)
        .flat_map(|j| block(rank, j, count(rank, j)))
        .collect();
    let expected: Vec<f32> = (0..world)
        .flat_map(|i| block(i, rank, count(i, rank)))
        .collect();
    let (_, got) = c
        .all_to_all_v(
            input,
            &send_counts,
            vec![0f32; recv_counts.iter().sum()],
            &recv_counts,
        )
        .wait()
        .map_err(|e| e.to_string())?;
    if got != expected {
        return Err("all_to_all_v: blocks misrouted".to_string());
    }
    Ok(())
}

/// Voluntary context switches so far of this process's threads whose name
/// starts with `prefix` (Linux: /proc/self/task).
fn voluntary_switches(prefix: &str) -> u64 {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let path = task.path();
        let name = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if !name.starts_with(prefix) {
            continue;
        }
        let status = std::fs::read_to_string(path.join("status")).unwrap_or_default();
        total += status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    total
}

/// On the portable transport a link's reader thread polls its socket after
/// a small frame instead of sleeping in `read` for the next, which cost a
/// wake-up per frame (decision 0021). So a stream of small ops leaves the
/// readers nearly without sleeps (a few in 4000 frames here); without the
/// polling nearly every frame was one (3896 in 4000).
#[test]
fn portable_readers_poll_while_an_op_waits_for_a_small_frame() {
    // Reader threads of other tests' communicators (same names) would
    // count too: measure in a process of its own.
    const ALONE: &str = "RINGWIRE_TEST_ALONE";
    let name = "portable_readers_poll_while_an_op_waits_for_a_small_frame";
    if std::env::var_os(ALONE).is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .env(ALONE, "1")
            .args(["--exact", name, "--test-threads", "1"])
            .output()
            .expect("run the test binary again");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let (_store, comms) = local_group(2, |b| b.transport(ringwire::TransportKind::Portable));
    let ops = 2000;
    on_all(&comms, |c| c.barrier().wait().unwrap()); // links up, readers running
    let before = voluntary_switches("ringwire-rx-");
    on_all(&comms, |c| {
        for _ in 0..ops {
            c.all_reduce(vec![1f32; 2], ReduceOp::Sum).wait().unwrap();
        }
    });
    let slept = voluntary_switches("ringwire-rx-") - before;
    // Each of the two readers took `ops` frames; a busy machine may make
    // some waits outlast the spin, but nowhere near half.
    assert!(
        slept < ops as u64,
        "the readers slept {slept} times for {} frames",
        2 * ops
    );
}

/// Every other test of this file, again on the portable transport (the
/// default run uses the io_uring engine where it works).
#[test]
fn on_the_portable_transport_too() {
    common::rerun_on_portable("on_the_portable_transport_too");
}

/// Every other test of this file, again with local ranks linked over TCP
/// (the path between hosts; the default links them with Unix sockets).
#[test]
fn over_tcp_local_links_too() {
    common::rerun_over_tcp_local_links("over_tcp_local_links_too");
}

/// Every other test of this file, again with local ranks on shared memory.
#[test]
fn over_unix_links_too() {
    common::rerun_over_unix_links("over_unix_links_too");
}
