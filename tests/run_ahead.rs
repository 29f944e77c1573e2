//! How far peers may run ahead of a slow rank (decision 0019): a rank stops
//! reading a peer that has delivered more than the run-ahead limit for ops
//! it has not started, so the peer waits in its send instead of this rank
//! buffering without bound; and nothing that used to work deadlocks for it
//! (another communicator's frame behind held ones, all-to-all blocks past
//! the limit, a paused link's silence, a sender held past its timeout).

mod common;

use common::{local_group, on_all};
use ringwire::testing::Rng;
use ringwire::{Communicator, Error, ReduceOp};
use std::sync::atomic::Ordering;
use std::time::Duration;

const LIMIT: usize = 1 << 20;

fn limited(bytes: usize) -> impl Fn(ringwire::Builder) -> ringwire::Builder + Sync {
    move |b| b.run_ahead_bytes(bytes)
}

/// Ranks 0-2 loop over `reduce`s to rank 0, which is slow. Rank 3 keeps
/// rank 0's transport reading meanwhile (it answers rank 0's receive only
/// at the end), as a root that is busy in other ops would: the engine reads
/// only while some thread waits on it.
#[test]
fn a_slow_root_holds_the_leaves_back_near_the_limit() {
    common::init_logging();
    let (_store, comms) = local_group(4, limited(LIMIT));
    let ops = 40;
    let len = 64 << 10; // 256 KiB of f32 per op: 10 MiB per leaf in all
    let results = on_all(&comms, |c| {
        let group = c.split((c.rank() < 3).then_some(0), 0).unwrap();
        let Some(group) = group else {
            std::thread::sleep(Duration::from_secs(3));
            c.send(vec![1u8], 0).wait().unwrap();
            return None;
        };
        let keep_reading = (c.rank() == 0).then(|| c.recv(vec![0u8], 3));
        let mut sums = Vec::new();
        for i in 0..ops {
            if c.rank() == 0 {
                // Without the bound each leaf would be all 40 ops ahead
                // within milliseconds.
                std::thread::sleep(Duration::from_millis(15));
            }
            let mut data = vec![(c.rank() + i) as f32; len];
            group.reduce_slice(&mut data, 0, ReduceOp::Sum).unwrap();
            sums.push(data[len - 1]);
        }
        if let Some(pending) = keep_reading {
            pending.wait().unwrap();
        }
        Some(sums)
    });
    let sums = results[0].as_ref().unwrap();
    for (i, &s) in sums.iter().enumerate() {
        assert_eq!(s, (3 * i + 3) as f32, "op {i}");
    }
    let held = comms[0].stats().held_ahead_peak_bytes as usize;
    // Each leaf stops at the limit plus what was in flight when it passed
    // it (a frame, and what a posted receive had already taken in).
    let bound = 2 * (LIMIT + (2 << 20));
    assert!(
        held <= bound,
        "the root held {held} bytes ahead (bound {bound})"
    );
    assert!(
        held >= LIMIT,
        "the leaves never ran ahead ({held} bytes): the test proves nothing"
    );
}

/// Four ranks each send rank 0 2 MiB of messages it is slow to receive.
/// The per-peer limit alone lets each hold its 1 MiB there, 4 MiB in all;
/// the total limit (1 MiB) pauses every sender once they hold that much
/// together. Rank 5 keeps rank 0's transport reading meanwhile, as in the
/// slow-root test above.
#[test]
fn the_total_limit_bounds_what_many_peers_hold_together() {
    common::init_logging();
    let (_store, comms) = local_group(6, |b| {
        b.run_ahead_bytes(LIMIT)
            .run_ahead_total_bytes(LIMIT)
            .chunk_bytes(64 << 10)
    });
    let (messages, len) = (32usize, 64usize << 10);
    let results = on_all(&comms, |c| match c.rank() {
        0 => {
            let keep_reading = c.recv(vec![0u8], 5);
            for leaf in 1..5 {
                // Links are made on first use, by the lower rank.
                c.recv(vec![0u8], leaf).wait().unwrap();
            }
            std::thread::sleep(Duration::from_millis(1500));
            for leaf in 1..5 {
                for m in 0..messages {
                    let got = c.recv(vec![0u8; len], leaf).wait().unwrap();
                    let want = (leaf * messages + m) as u8;
                    if got.iter().any(|&b| b != want) {
                        return Err(format!("message {m} of rank {leaf} arrived wrong"));
                    }
                }
            }
            keep_reading.wait().unwrap();
            Ok(())
        }
        5 => {
            std::thread::sleep(Duration::from_millis(3000));
            c.send(vec![1u8], 0).wait().unwrap();
            Ok(())
        }
        leaf => {
            c.send(vec![0u8], 0).wait().unwrap();
            for m in 0..messages {
                let data = vec![(leaf * messages + m) as u8; len];
                c.send(data, 0).wait().unwrap();
            }
            Ok(())
        }
    });
    for r in results {
        r.unwrap();
    }
    let held = comms[0].stats().held_ahead_peak_bytes as usize;
    // The total plus what each sender had in flight when it was paused (a
    // frame, and what a posted receive had taken in).
    let bound = LIMIT + 4 * (3 * len);
    assert!(
        held <= bound,
        "rank 0 held {held} bytes ahead (bound {bound}; per-peer limits alone allow 4 MiB)"
    );
    assert!(
        held >= LIMIT,
        "the senders never ran ahead ({held} bytes): the test proves nothing"
    );
}

/// Rank 1 runs far ahead on the world communicator, then joins a small
/// all-reduce on a second one, which rank 0 joined first. Rank 1's part of
/// it sits on the shared link behind more held frames than the limit, so
/// rank 0 must read past the limit to get it.
#[test]
fn a_frame_of_another_communicator_behind_held_ones_still_arrives() {
    common::init_logging();
    let (_store, comms) = local_group(2, limited(256 << 10));
    on_all(&comms, |c| {
        let other = c.split(Some(0), 0).unwrap().expect("every rank is in");
        let mut data = vec![0u8; 1 << 20];
        let mut small = vec![c.rank() as f32 + 1.0; 300];
        if c.rank() == 1 {
            for i in 0..24u8 {
                data.fill(i);
                c.broadcast_slice(&mut data, 1).unwrap();
            }
            other.all_reduce_slice(&mut small, ReduceOp::Sum).unwrap();
        } else {
            other.all_reduce_slice(&mut small, ReduceOp::Sum).unwrap();
            for i in 0..24u8 {
                c.broadcast_slice(&mut data, 1).unwrap();
                assert!(data.iter().all(|&b| b == i), "broadcast {i}");
            }
        }
        assert!(small.iter().all(|&v| v == 3.0));
    });
}

/// Blocks far larger than the limit, ranks skewed at random, and every
/// kind of op mixed: frames of the op a rank is in always get read.
#[test]
fn every_op_completes_with_a_tiny_limit_and_skewed_ranks() {
    common::init_logging();
    let seed = common::seed();
    let world = 4;
    let (_store, comms) = local_group(world, limited(4 << 10));
    on_all(&comms, |c| {
        let (rank, size) = (c.rank(), c.world_size());
        let mut rng = Rng::new(seed ^ rank as u64);
        for round in 0..6 {
            let skew = rng.below(20);
            std::thread::sleep(Duration::from_millis(skew));
            let block = 100_003 + round * 7; // not a multiple of anything
            let input: Vec<f32> = (0..block * size)
                .map(|i| (rank * 1000 + i % 1000) as f32)
                .collect();
            let mut output = vec![0f32; block * size];
            c.all_to_all_slice(&input, &mut output).unwrap();
            for from in 0..size {
                let got = &output[from * block..(from + 1) * block];
                let want = |i: usize| (from * 1000 + (rank * block + i) % 1000) as f32;
                assert!(
                    got.iter().enumerate().all(|(i, &v)| v == want(i)),
                    "all-to-all from {from}"
                );
            }
            let mut sum = vec![rank as f32 + 1.0; block];
            c.all_reduce_slice(&mut sum, ReduceOp::Sum).unwrap();
            assert!(sum.iter().all(|&v| v == (size * (size + 1) / 2) as f32));
            let root = round % size;
            let mut b = vec![if rank == root { round as u8 } else { 0 }; block];
            c.broadcast_slice(&mut b, root).unwrap();
            assert!(b.iter().all(|&v| v == round as u8));
            let mut r = vec![1i32; block];
            c.reduce_slice(&mut r, root, ReduceOp::Sum).unwrap();
            if rank == root {
                assert!(r.iter().all(|&v| v == size as i32));
            }
            let mine = vec![rank as i64; block];
            let mut all = vec![0i64; block * size];
            c.all_gather_slice(&mine, &mut all).unwrap();
            assert!((0..size).all(|p| {
                all[p * block..(p + 1) * block]
                    .iter()
                    .all(|&v| v == p as i64)
            }));
            let mut part = vec![0f64; block];
            c.reduce_scatter_slice(&vec![1f64; block * size], &mut part, ReduceOp::Sum)
                .unwrap();
            assert!(part.iter().all(|&v| v == size as f64));
            // Gather and scatter: every leaf sends the root far more than
            // the limit at once.
            let mut gathered = vec![0i64; if rank == root { block * size } else { 0 }];
            c.gather_slice(&mine, &mut gathered, root).unwrap();
            if rank == root {
                assert_eq!(gathered, all, "gather to {root}");
            }
            let mut back = vec![-1i64; block];
            c.scatter_slice(&all, &mut back, root).unwrap();
            assert_eq!(back, mine, "scatter from {root}");
            // A ring of point-to-point transfers, each larger than the
            // limit: even ranks send first, odd ones receive first.
            let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);
            let send = vec![rank as u8; block];
            let recv = |c: &Communicator| c.recv(vec![0u8; block], prev).wait().unwrap();
            let got = if rank % 2 == 0 {
                c.send(send, next).wait().unwrap();
                recv(c)
            } else {
                let got = recv(c);
                c.send(send, next).wait().unwrap();
                got
            };
            assert!(got.iter().all(|&v| v == prev as u8), "from {prev}");
        }
    });
}

/// Two ranks that each send far more than the limit to the other before
/// receiving: on one communicator that waits for the timeout (ops run in
/// order), so the README says to give each direction its own. That works.
#[test]
fn an_exchange_with_a_communicator_per_direction_completes() {
    common::init_logging();
    let (_store, comms) = local_group(2, limited(64 << 10));
    on_all(&comms, |c| {
        // Direction "to rank 1" and "to rank 0", each its own communicator.
        let to_1 = c.split(Some(0), 0).unwrap().unwrap();
        let to_0 = c.split(Some(0), 0).unwrap().unwrap();
        let (mine, theirs) = match c.rank() {
            0 => (&to_1, &to_0),
            _ => (&to_0, &to_1),
        };
        trade_rounds(c, 3, |_, out, peer| {
            let sent = mine.send(out, peer);
            let got = theirs.recv(vec![0u8; EXCHANGED], peer);
            sent.wait().unwrap();
            got.wait().unwrap()
        });
    });
}

/// Bytes each of two ranks sends the other per round in the exchange tests.
const EXCHANGED: usize = 8 << 20;

/// Two ranks trade `EXCHANGED` bytes each way for `rounds` rounds, each
/// by `trade(round, what to send, peer)`, and check what arrived.
fn trade_rounds(c: &Communicator, rounds: u8, trade: impl Fn(u8, Vec<u8>, usize) -> Vec<u8>) {
    let peer = 1 - c.rank();
    for round in 0..rounds {
        let got = trade(round, vec![c.rank() as u8 + round; EXCHANGED], peer);
        assert!(
            got.iter().all(|&b| b == peer as u8 + round),
            "round {round}"
        );
    }
}

/// The same exchange on one communicator with `send_recv`, whose receive
/// has begun while it sends, so the peer's frames are always read; and
/// paired with a plain `send` then `recv`, or `recv` then `send`, on the
/// other side.
#[test]
fn send_recv_exchanges_more_than_the_limit_on_one_communicator() {
    common::init_logging();
    let (_store, comms) = local_group(2, limited(64 << 10));
    on_all(&comms, |c| {
        trade_rounds(c, 4, |round, out, peer| {
            let recv = || c.recv(vec![0u8; EXCHANGED], peer).wait().unwrap();
            match (round, c.rank()) {
                (2, 1) => {
                    c.send(out, peer).wait().unwrap();
                    recv()
                }
                (3, 1) => {
                    let got = recv();
                    c.send(out, peer).wait().unwrap();
                    got
                }
                _ => {
                    let exchanged = c.send_recv(out, peer, vec![0u8; EXCHANGED], peer);
                    exchanged.wait().unwrap().1
                }
            }
        });
    });
}

/// Rank 1 broadcasts on a communicator rank 0 never uses (ranks that
/// disagree) and rank 0 drops it: what was held for it is released, rank 1
/// is read again, and later frames for it are dropped, not kept.
#[test]
fn what_a_dropped_communicator_held_is_released() {
    common::init_logging();
    let (_store, comms) = local_group(2, limited(64 << 10));
    on_all(&comms, |c| {
        let sub = c.split(Some(0), 0).unwrap().expect("every rank is in");
        if c.rank() == 1 {
            let pending: Vec<_> = (0..6)
                .map(|_| sub.broadcast(vec![7u8; 1 << 20], 1))
                .collect();
            for p in pending {
                p.wait()
                    .expect("rank 0 reads again once it dropped the communicator");
            }
        } else {
            let start = std::time::Instant::now();
            while c.stats().held_ahead_bytes < 64 << 10 {
                assert!(
                    start.elapsed() < Duration::from_secs(20),
                    "rank 1 never ran ahead"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            drop(sub);
            assert_eq!(
                c.stats().held_ahead_bytes,
                0,
                "released with the communicator"
            );
        }
        c.barrier().wait().unwrap();
        assert_eq!(
            c.stats().held_ahead_bytes,
            0,
            "frames that came later were kept"
        );
        // Rank 0 keeps inboxes for the world communicator's peer only: the
        // dropped one's late frames made none again.
        if c.rank() == 0 {
            assert_eq!(c.stats().inboxes, 1, "a late frame remade an inbox");
        }
    });
}

/// As above, but rank 0 revokes the communicator instead of dropping it
/// (what a rank whose op failed does before the survivors agree): its ops
/// end at once from then on, so what rank 1 sent ahead for it stops
/// counting, and the link that carries the agreement is read again. It
/// stayed paused before, and the agreement after a failure waited behind
/// it until the op timeout (seen in debug chaos trials).
#[test]
fn what_a_revoked_communicator_held_is_released() {
    common::init_logging();
    let (_store, comms) = local_group(2, limited(64 << 10));
    on_all(&comms, |c| {
        let sub = c.split(Some(0), 0).unwrap().expect("every rank is in");
        if c.rank() == 1 {
            // One frame past the limit (too large for the arena): the
            // broadcast ends here once rank 0's transport took it in,
            // held there, its link paused.
            sub.broadcast(vec![7u8; 1 << 20], 1).wait().unwrap();
        } else {
            let start = std::time::Instant::now();
            while c.stats().held_ahead_bytes < 64 << 10 {
                assert!(
                    start.elapsed() < Duration::from_secs(20),
                    "rank 1 never ran ahead"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            sub.revoke();
            assert_eq!(
                c.stats().held_ahead_bytes,
                0,
                "released when the communicator was revoked"
            );
        }
        // The world communicator's link is read again: the two agree.
        let agreed = c.agree(1).wait().unwrap();
        assert_eq!(agreed.members, [0, 1]);
        c.barrier().wait().unwrap();
        assert_eq!(
            c.stats().held_ahead_bytes,
            0,
            "frames that came later were kept"
        );
    });
}

/// A rank's own sends begin nothing it receives: after rank 0 sent 8
/// messages, the broadcasts rank 1 runs ahead with (ops 1-8 of the
/// communicator, not started on rank 0) still count against its limit.
#[test]
fn sends_do_not_count_as_begun_collectives() {
    common::init_logging();
    let (_store, comms) = local_group(2, limited(64 << 10));
    on_all(&comms, |c| {
        const N: usize = 8;
        if c.rank() == 0 {
            for _ in 0..N {
                c.send(vec![1u8; 16], 1).wait().unwrap();
            }
            let start = std::time::Instant::now();
            while c.stats().held_ahead_bytes < 64 << 10 {
                assert!(
                    start.elapsed() < Duration::from_secs(20),
                    "rank 1's broadcasts were taken as begun"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            for _ in 0..N {
                c.broadcast(vec![0u8; 1 << 20], 1).wait().unwrap();
            }
        } else {
            for _ in 0..N {
                c.recv(vec![0u8; 16], 0).wait().unwrap();
            }
            let pending: Vec<_> = (0..N).map(|_| c.broadcast(vec![7u8; 1 << 20], 1)).collect();
            for p in pending {
                p.wait().unwrap();
            }
        }
    });
}

/// Debug signature checks exchange their frames on a communicator of their
/// own; they must not pile up as run ahead.
#[test]
fn debug_signature_checks_leave_nothing_held() {
    common::init_logging();
    let (_store, comms) = local_group(3, |b| b.debug_checks(true));
    on_all(&comms, |c| {
        for _ in 0..20 {
            c.all_reduce_slice(&mut [1f32; 10], ReduceOp::Sum).unwrap();
        }
    });
    for c in &comms {
        assert_eq!(c.stats().held_ahead_bytes, 0, "rank {}", c.rank());
    }
    // A dropped communicator's side communicator goes with it.
    on_all(&comms, |c| c.barrier().wait().unwrap());
    let before: Vec<u64> = comms.iter().map(|c| c.stats().inboxes).collect();
    on_all(&comms, |c| {
        let sub = c.split(Some(0), 0).unwrap().expect("every rank is in");
        sub.all_reduce_slice(&mut [1f32; 10], ReduceOp::Sum)
            .unwrap();
        drop(sub);
        c.barrier().wait().unwrap();
    });
    let after: Vec<u64> = comms.iter().map(|c| c.stats().inboxes).collect();
    assert_eq!(after, before, "inboxes of a dropped communicator stayed");
}

/// A link this rank leaves unread longer than the heartbeat timeout is not
/// declared dead: the silence is its own doing.
#[test]
fn a_link_paused_past_the_heartbeat_timeout_is_not_declared_dead() {
    common::init_logging();
    let (_store, comms) = local_group(2, |b| {
        b.run_ahead_bytes(64 << 10)
            .heartbeat_timeout(Duration::from_millis(800))
    });
    on_all(&comms, |c| {
        c.barrier().wait().unwrap(); // links up
        let mut data = vec![0u8; 1 << 20];
        if c.rank() == 0 {
            std::thread::sleep(Duration::from_millis(2500));
        }
        for i in 0..16u8 {
            if c.rank() == 1 {
                data.fill(i);
            }
            c.broadcast_slice(&mut data, 1).unwrap();
            assert!(data.iter().all(|&b| b == i));
        }
    });
}

/// A sender held back longer than its op timeout fails, and says that the
/// receiver stopped reading and why that may be.
#[test]
fn a_sender_held_past_its_timeout_names_the_rank_behind() {
    common::init_logging();
    let (_store, comms) = local_group(2, |b| {
        b.run_ahead_bytes(64 << 10).timeout(Duration::from_secs(2))
    });
    let sender_done = std::sync::atomic::AtomicBool::new(false);
    let results = on_all(&comms, |c| {
        c.barrier().wait().unwrap(); // links up
        let mut data = vec![1u8; 1 << 20];
        if c.rank() == 0 {
            // Away until the sender gives up (or long past its timeout).
            let start = std::time::Instant::now();
            while !sender_done.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(20) {
                std::thread::sleep(Duration::from_millis(10));
            }
            // What had arrived may still make whole broadcasts here, but
            // the rest must fail, not hang.
        }
        let failed = (0..64)
            .map(|_| c.broadcast_slice(&mut data, 1))
            .find_map(Result::err);
        if c.rank() == 1 {
            sender_done.store(true, Ordering::SeqCst);
        }
        failed
    });
    let sender = results[1]
        .as_ref()
        .expect("the sender was held back and failed");
    // Held part way through a frame, the link fails after the write
    // timeout ("stopped reading"); held before a frame started, the op
    // times out alone. Either way the error says why a peer stops reading.
    let text = sender.to_string();
    assert!(
        (text.contains("rank 0 stopped reading") || text.contains("rank 0 to read"))
            && text.contains("run-ahead"),
        "{text}"
    );
    assert!(
        results[0].is_some(),
        "rank 0 completed every broadcast the sender gave up on"
    );
    assert!(!matches!(sender, Error::InvalidArgument { .. }));
}

/// A held send fails at its op's timeout, and the link outlives the op.
/// Rank 0 stops reading; rank 1 broadcasts small frames until one is held
/// back. Its op fails in about its timeout (a handle's 2 s, not the
/// communicator's 30; or the communicator's own 2 s), as a timeout that
/// names rank 0, and only its communicator fails: once rank 0 reads again,
/// another communicator over the same link works. (Frames here go whole
/// or not at all on the Unix links between local ranks; a TCP socket
/// takes part of a frame, which then must wait out the write timeout and
/// fails the link, so TCP runs skip the test.)
#[test]
fn a_held_send_fails_at_its_timeout_and_the_link_stays() {
    common::init_logging();
    let two = Duration::from_secs(2);
    for (communicator, handle) in [(Duration::from_secs(30), Some(two)), (two, None)] {
        held_send_fails_and_the_link_stays(communicator, handle);
    }
}

fn held_send_fails_and_the_link_stays(communicator: Duration, handle: Option<Duration>) {
    let (_store, comms) = local_group(2, |b| b.run_ahead_bytes(64 << 10).timeout(communicator));
    let sender_done = std::sync::atomic::AtomicBool::new(false);
    let results = on_all(&comms, |c| {
        let other = c
            .split(Some(0), 0)
            .unwrap()
            .expect("in the group")
            .with_timeout(Duration::from_secs(30));
        other.barrier().wait().unwrap(); // links up
        if c.link_kind(1 - c.rank()) != Some("unix") {
            return None;
        }
        let frame = [1u8; 1 << 10];
        if c.rank() == 0 {
            let start = std::time::Instant::now();
            while !sender_done.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(40) {
                std::thread::sleep(Duration::from_millis(10));
            }
            // Takes what the sender got out, then hears its abort.
            let mut data = frame;
            let failed = (0..1_000_000).find_map(|_| c.broadcast_slice(&mut data, 1).err());
            assert!(matches!(failed, Some(Error::Aborted { .. })), "{failed:?}");
        } else {
            let short = handle.map_or_else(|| c.clone(), |t| c.with_timeout(t));
            let mut data = frame;
            let start = std::time::Instant::now();
            let failed = (0..1_000_000).find_map(|_| short.broadcast_slice(&mut data, 1).err());
            let took = start.elapsed();
            sender_done.store(true, Ordering::SeqCst);
            let failed = failed.expect("the sender was never held back");
            assert!(matches!(failed, Error::Timeout { peer: 0, .. }), "{failed}");
            assert!(failed.to_string().contains("run-ahead"), "{failed}");
            assert!(
                took < Duration::from_secs(10),
                "held for {took:?}: {failed}"
            );
        }
        let sum = other.all_reduce(vec![1i32; 4], ReduceOp::Sum).wait();
        Some(sum.map_err(|e| e.to_string()))
    });
    for (rank, r) in results.into_iter().enumerate() {
        if let Some(sum) = r {
            assert_eq!(
                sum,
                Ok(vec![2i32; 4]),
                "rank {rank} ({communicator:?}, {handle:?})"
            );
        }
    }
}

/// Every other test of this file, again on the portable transport.
#[test]
fn on_the_portable_transport_too() {
    common::rerun_on_portable("on_the_portable_transport_too");
}

/// Every other test of this file, again with local ranks linked over TCP.
#[test]
fn over_tcp_local_links_too() {
    common::rerun_over_tcp_local_links("over_tcp_local_links_too");
}

/// Every other test of this file, again with local ranks on shared memory.
#[test]
fn over_unix_links_too() {
    common::rerun_over_unix_links("over_unix_links_too");
}
