//! Collectives on the shared-memory arena (issue 31, part 3; decision
//! 0030): communicators whose members share this host, with local links on
//! shared memory, vote in their first small op to stage it in the arena,
//! and then every small collective runs there, and larger all-reduces,
//! all-gathers and broadcasts in chunks (decision 0032). Checked against
//! the reference at several world sizes, with lengths 0, 1, p-1, uneven
//! and across chunks; more communicators than the arena has slots; a
//! mismatched collective.
//! (The whole collectives sweep, every dtype and reduce op, runs on
//! shared-memory links too, the default: `tests/collectives.rs`.)

mod common;

use common::{local_group, on_all, seed};
use ringwire::testing::{Rng, check_close, random_data, reference_reduce};
use ringwire::{Communicator, Error, LocalLinks, ReduceOp};

fn shm_group(world: usize) -> (ringwire::store::StoreServer, Vec<Communicator>) {
    local_group(world, |b| b.local_links(LocalLinks::Shm))
}

/// Every kind of collective the arena runs, on lengths around the world
/// size, against the reference; and the communicator says it ran there.
fn every_op_on_the_arena(world: usize) {
    let seed = seed();
    let (_store, comms) = shm_group(world);
    for c in &comms {
        assert_eq!(c.shared_memory_arena(), None, "no vote before any op");
    }
    let results = on_all(&comms, |c| {
        let (rank, p) = (c.rank(), c.world_size());
        for len in [0usize, 1, p - 1, p + 1, 7 * p + 3, 1000, 60_000] {
            let ins: Vec<Vec<f32>> = (0..p)
                .map(|r| {
                    random_data(
                        &mut Rng::new(seed ^ (r as u64) << 8 ^ len as u64),
                        len,
                        ReduceOp::Sum,
                    )
                })
                .collect();
            let what = |op: &str| format!("seed {seed} world {p} len {len} rank {rank}: {op}");
            for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg] {
                let reference = reference_reduce(&ins, op);
                let got = c.all_reduce(ins[rank].clone(), op).wait().unwrap();
                check_close(&got, &reference, p)
                    .map_err(|e| format!("{}: {e}", what("all_reduce")))?;
                let root = len % p;
                let got = c.reduce(ins[rank].clone(), root, op).wait().unwrap();
                if rank == root {
                    check_close(&got, &reference, p)
                        .map_err(|e| format!("{}: {e}", what("reduce")))?;
                } else if got != ins[rank] {
                    return Err(what("reduce changed a non-root's buffer"));
                }
                let mine = ringwire::algo::block(len, p, rank);
                let mut out = vec![0f32; mine.len()];
                c.reduce_scatter_slice(&ins[rank], &mut out, op).unwrap();
                check_close(&out, &reference[mine], p)
                    .map_err(|e| format!("{}: {e}", what("reduce_scatter")))?;
            }
            let root = (len + 1) % p;
            let got = c.broadcast(ins[rank].clone(), root).wait().unwrap();
            if got != ins[root] {
                return Err(what("broadcast"));
            }
            let mut all = vec![0f32; len * p];
            c.all_gather_slice(&ins[rank], &mut all).unwrap();
            if all != ins.concat() {
                return Err(what("all_gather"));
            }
            let mut gathered = vec![0f32; if rank == root { len * p } else { 0 }];
            c.gather_slice(&ins[rank], &mut gathered, root).unwrap();
            if rank == root && gathered != ins.concat() {
                return Err(what("gather"));
            }
            let whole: Vec<f32> = ins.concat();
            let mut part = vec![0f32; len];
            let src: &[f32] = if rank == root { &whole } else { &[] };
            c.scatter_slice(src, &mut part, root).unwrap();
            if part != ins[rank] {
                return Err(what("scatter"));
            }
            // All-to-all: rank r's block j goes to rank j's block r.
            let per = len;
            let input: Vec<f32> = (0..p * per)
                .map(|i| (rank * 1_000_000 + i) as f32)
                .collect();
            let mut output = vec![0f32; p * per];
            c.all_to_all_slice(&input, &mut output).unwrap();
            for from in 0..p {
                for i in 0..per {
                    let want = (from * 1_000_000 + rank * per + i) as f32;
                    if output[from * per + i] != want {
                        return Err(what("all_to_all"));
                    }
                }
            }
            c.barrier().wait().unwrap();
        }
        Ok::<(), String>(())
    });
    for r in results {
        r.unwrap();
    }
    for c in &comms {
        assert_eq!(c.shared_memory_arena(), Some(true), "rank {}", c.rank());
        for peer in (0..world).filter(|&q| q != c.rank()) {
            assert_eq!(c.link_kind(peer), Some("shm"));
        }
    }
}

#[test]
fn world_2() {
    every_op_on_the_arena(2);
}

#[test]
fn world_3() {
    every_op_on_the_arena(3);
}

#[test]
fn world_5() {
    every_op_on_the_arena(5);
}

/// All-reduces past the small tier run on the arena in chunks of its
/// staging (the large tier): every dtype and reduce op, on lengths with a
/// short last chunk, a last chunk of fewer elements than ranks, and many
/// chunks, against the reference at 2, 3 and 5 ranks; at 3 and 5 the
/// bytes each rank staged say they ran there.
#[test]
fn large_all_reduces_run_on_the_arena_in_chunks() {
    let seed = seed();
    for world in [2, 3, 5] {
        let (_store, comms) = shm_group(world);
        let results = on_all(&comms, |c| {
            // The vote (its frames count as sent) in an op of its own.
            c.barrier().wait().map_err(|e| e.to_string())?;
            let mut case = 0;
            chunked_all_reduces::<f32>(c, seed, &mut case)?;
            chunked_all_reduces::<f64>(c, seed, &mut case)?;
            chunked_all_reduces::<half::f16>(c, seed, &mut case)?;
            chunked_all_reduces::<half::bf16>(c, seed, &mut case)?;
            chunked_all_reduces::<i32>(c, seed, &mut case)?;
            chunked_all_reduces::<i64>(c, seed, &mut case)?;
            chunked_all_reduces::<u8>(c, seed, &mut case)
        });
        for r in results {
            r.unwrap();
        }
        for c in &comms {
            assert_eq!(c.shared_memory_arena(), Some(true));
        }
    }
}

fn chunked_all_reduces<T: ringwire::Element>(
    c: &Communicator,
    seed: u64,
    case: &mut u64,
) -> Result<(), String> {
    let (rank, p) = (c.rank(), c.world_size());
    // Elements per chunk: the arena's staging of one op.
    let per = ringwire_shm::arena::STAGE_BYTES / size_of::<T>();
    for len in [per + 1, 2 * per + p - 1, 5 * per] {
        for op in ReduceOp::ALL {
            *case += 1;
            let ins = common::sweep::inputs::<T>(seed, *case, p, len, op);
            let what = format!("seed {seed} {} p={p} n={len} {op} rank {rank}", T::DTYPE);
            let before = c.stats().bytes_sent;
            let got = c
                .all_reduce(ins[rank].clone(), op)
                .wait()
                .map_err(|e| format!("{what}: {e}"))?;
            check_close(&got, &reference_reduce(&ins, op), p)
                .map_err(|e| format!("{what}: {e}"))?;
            // Each rank stages its chunks but its own share, then its
            // reduced share: its input's bytes in all. A ring over the links
            // sends 2(p-1)/p of them: as much at 2 ranks (there only the
            // results say), 4/3 at 3, 8/5 at 5.
            let sent = c.stats().bytes_sent - before;
            let staged = size_of_val(&ins[rank][..]) as u64;
            if sent != staged {
                return Err(format!(
                    "{what}: sent {sent} bytes, the chunked arena stages {staged}"
                ));
            }
        }
    }
    Ok(())
}

/// Broadcasts and all-gathers past the small tier run on the arena in
/// chunks too (broadcasts at 2 ranks only up to 64 KiB): lengths with a
/// short last chunk and many chunks, u8 and f64, against the inputs at 2,
/// 3 and 5 ranks. From 3 ranks the bytes sent say where they ran: on the
/// arena only the root stages a broadcast (over the links every rank but
/// the root receives it, so as much again was sent at least), and each
/// rank stages its all-gather input once (a ring sends p-1 blocks).
#[test]
fn large_broadcasts_and_all_gathers_run_on_the_arena_in_chunks() {
    let seed = seed();
    for world in [2, 3, 5] {
        let (_store, comms) = shm_group(world);
        let sent =
            |comms: &[Communicator]| -> u64 { comms.iter().map(|c| c.stats().bytes_sent).sum() };
        let results = on_all(&comms, |c| {
            c.barrier().wait().map_err(|e| e.to_string())?;
            chunked_copies::<u8>(c, seed)?;
            chunked_copies::<f64>(c, seed)
        });
        for r in results {
            r.unwrap();
        }
        // One more of each, counted across ranks (all are done between).
        let len = 3 * ringwire_shm::arena::STAGE_BYTES / 8 + 1;
        let bytes = (len * 8) as u64;
        let before = sent(&comms);
        on_all(&comms, |c| {
            c.broadcast(vec![c.rank() as f64; len], 1).wait().unwrap()
        });
        let broadcast = sent(&comms) - before;
        let before = sent(&comms);
        on_all(&comms, |c| {
            let mut out = vec![0f64; len * world];
            c.all_gather_slice(&vec![1f64; len], &mut out).unwrap()
        });
        let all_gather = sent(&comms) - before;
        if world > 2 {
            assert_eq!(
                broadcast, bytes,
                "world {world}: the broadcast's root alone stages"
            );
            assert_eq!(
                all_gather,
                bytes * world as u64,
                "world {world}: each rank stages once"
            );
        }
    }
}

fn chunked_copies<T: ringwire::Element>(c: &Communicator, seed: u64) -> Result<(), String> {
    let (rank, p) = (c.rank(), c.world_size());
    let per = ringwire_shm::arena::STAGE_BYTES / size_of::<T>();
    for (case, len) in [per + 1, 2 * per + p - 1, 5 * per].into_iter().enumerate() {
        let ins = common::sweep::inputs::<T>(seed, case as u64, p, len, ReduceOp::Sum);
        let what = format!("seed {seed} {} p={p} n={len} rank {rank}", T::DTYPE);
        let root = (case + 1) % p;
        let got = c
            .broadcast(ins[rank].clone(), root)
            .wait()
            .map_err(|e| format!("{what}: {e}"))?;
        if got != ins[root] {
            return Err(format!("{what}: broadcast"));
        }
        let mut all = vec![T::default(); len * p];
        c.all_gather_slice(&ins[rank], &mut all)
            .map_err(|e| format!("{what}: {e}"))?;
        if all != ins.concat() {
            return Err(format!("{what}: all_gather"));
        }
    }
    Ok(())
}

/// Links that are Unix sockets (the default) never vote: no arena.
#[test]
fn over_unix_sockets_there_is_no_arena() {
    let (_store, comms) = local_group(2, |b| b.local_links(LocalLinks::Unix));
    on_all(&comms, |c| {
        c.all_reduce(vec![1f32; 4], ReduceOp::Sum).wait().unwrap()
    });
    for c in &comms {
        assert_eq!(c.shared_memory_arena(), None);
    }
}

/// More communicators than the arena has slots: the ones without a slot
/// vote no and run over the links, and every result is right.
#[test]
fn communicators_beyond_the_arenas_slots_run_over_the_links() {
    let (_store, comms) = shm_group(2);
    let results = on_all(&comms, |c| {
        let subs: Vec<Communicator> = (0..20)
            .map(|_| c.split(Some(0), 0).unwrap().unwrap())
            .collect();
        let mut votes = Vec::new();
        for (i, sub) in subs.iter().enumerate() {
            let got = sub
                .all_reduce(vec![(sub.rank() + i) as f64; 3], ReduceOp::Sum)
                .wait()
                .unwrap();
            assert_eq!(got, vec![(2 * i + 1) as f64; 3], "communicator {i}");
            votes.push(sub.shared_memory_arena());
        }
        votes
    });
    assert_eq!(results[0], results[1], "both ranks saw the same votes");
    let yes = results[0].iter().filter(|v| **v == Some(true)).count();
    let no = results[0].iter().filter(|v| **v == Some(false)).count();
    assert!(yes >= 10 && no >= 1 && yes + no == 20, "{:?}", results[0]);
}

/// A member that leaves a communicator right after its last op (a
/// broadcast's root, which waits for no one) keeps its slot as it is until
/// the others are done with it: its next communicator takes another slot,
/// and the slow member still reads the broadcast, not the next
/// communicator's op that a reused slot would show it (the same tag: the
/// wrong data, silently).
#[test]
fn a_communicator_dropped_after_its_last_op_leaves_its_slot_to_slow_readers() {
    let (_store, comms) = shm_group(3);
    let on = |set: [usize; 2], c: &Communicator| {
        // Rank 1 first in both: root 0 of each broadcast.
        let key = if c.rank() == 1 { 0 } else { 1 };
        c.split(set.contains(&c.rank()).then_some(0), key).unwrap()
    };
    let mut a = on_all(&comms, |c| on([0, 1], c));
    let mut b = on_all(&comms, |c| on([1, 2], c));
    let (a0, a1) = (a[0].take().unwrap(), a[1].take().unwrap());
    let (b1, b2) = (b[1].take().unwrap(), b[2].take().unwrap());
    // `a` votes for the arena (each member takes a slot) in a first op.
    on_all(&[a0.clone(), a1.clone()], |c| c.barrier().wait().unwrap());
    assert_eq!(a1.shared_memory_arena(), Some(true));
    let sent_on_a = vec![1.5f32; 256];
    let sent_on_b = vec![2.5f32; 256];
    std::thread::scope(|s| {
        s.spawn(|| {
            a1.broadcast(sent_on_a.clone(), 0).wait().unwrap();
            drop(a1);
            // `b` votes now: a slot `a` left would be the first free.
            for _ in 0..3 {
                b1.broadcast(sent_on_b.clone(), 0).wait().unwrap();
            }
            assert_eq!(b1.shared_memory_arena(), Some(true));
        });
        s.spawn(|| {
            for _ in 0..3 {
                let got = b2.broadcast(vec![0f32; 256], 0).wait().unwrap();
                assert_eq!(got, sent_on_b);
            }
        });
        s.spawn(|| {
            // Late: rank 1 has left `a` and gone on on `b` by now.
            std::thread::sleep(std::time::Duration::from_millis(300));
            let got = a0.broadcast(vec![0f32; 256], 0).wait().unwrap();
            assert_eq!(got, sent_on_a, "rank 0 read another communicator's op");
        });
    });
}

/// Communicators made and dropped one after another, far more than the
/// arena has slots: each one's slot comes back once every member left it,
/// so every one runs on the arena.
#[test]
fn slots_of_communicators_every_member_left_are_taken_again() {
    let (_store, comms) = shm_group(2);
    let results = on_all(&comms, |c| {
        (0..40)
            .map(|i| {
                let sub = c.split(Some(0), 0).unwrap().unwrap();
                let got = sub
                    .all_reduce(vec![(sub.rank() + i) as f64; 3], ReduceOp::Sum)
                    .wait()
                    .unwrap();
                assert_eq!(got, vec![(2 * i + 1) as f64; 3], "communicator {i}");
                sub.shared_memory_arena()
            })
            .collect::<Vec<_>>()
    });
    for votes in results {
        assert!(votes.iter().all(|v| *v == Some(true)), "{votes:?}");
    }
}

/// Two ranks that call different collectives on the arena: the op fails
/// naming the other rank, not with a hang or garbage.
#[test]
fn a_mismatched_collective_on_the_arena_is_named() {
    let (_store, comms) = local_group(2, |b| {
        b.local_links(LocalLinks::Shm)
            .timeout(std::time::Duration::from_secs(10))
    });
    // A first op votes (and must agree).
    on_all(&comms, |c| c.barrier().wait().unwrap());
    let errs = on_all(&comms, |c| match c.rank() {
        0 => c
            .all_reduce(vec![1f32; 4], ReduceOp::Sum)
            .wait()
            .map(|_| ()),
        _ => c
            .all_reduce(vec![1f64; 2], ReduceOp::Sum)
            .wait()
            .map(|_| ()),
    });
    let mut mismatches = 0;
    for (rank, e) in errs.into_iter().enumerate() {
        match e {
            Err(Error::Mismatch { peer, .. }) => {
                assert_eq!(peer, 1 - rank);
                mismatches += 1;
            }
            Err(Error::Aborted { .. }) => {}
            other => panic!("rank {rank}: {other:?}"),
        }
    }
    assert!(mismatches >= 1);
}
