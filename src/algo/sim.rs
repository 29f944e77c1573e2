//! A deterministic, single-threaded network simulator that runs one schedule
//! per rank against per-link FIFO mailboxes. It checks what a transport
//! checks (each frame's step, chunk and length match what the receiver
//! expects) and reports a deadlock when no rank can make progress.

use super::Step;
use crate::{Element, ReduceOp};
use std::collections::{HashMap, VecDeque};

/// Why a simulated run failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SimError {
    /// No rank could progress; lists (rank, waiting-for peer).
    Deadlock(Vec<(usize, usize)>),
    /// A frame did not match the receiver's expectation.
    Mismatch {
        rank: usize,
        peer: usize,
        detail: String,
    },
    /// Frames were left unread in a mailbox at the end.
    Leftover {
        from: usize,
        to: usize,
        frames: usize,
    },
}

struct Frame<T> {
    step: u32,
    chunk: u32,
    data: Vec<T>,
}

/// Runs `schedules[r]` on `works[r]` for every rank, reducing with `op`.
/// A schedule with a read-only input ([`super::Action::ReduceFrom`]) runs
/// on the input followed by its work buffer.
pub fn run<T: Element>(
    schedules: &[Vec<Step>],
    works: &mut [Vec<T>],
    op: ReduceOp,
) -> Result<(), SimError> {
    let world = schedules.len();
    let mut mail: HashMap<(usize, usize), VecDeque<Frame<T>>> = HashMap::new();
    let mut pc = vec![0usize; world];
    loop {
        let mut progressed = false;
        for rank in 0..world {
            while let Some(step) = schedules[rank].get(pc[rank]) {
                match step {
                    Step::Send {
                        peer,
                        range,
                        step,
                        chunk,
                    } => {
                        mail.entry((rank, *peer)).or_default().push_back(Frame {
                            step: *step,
                            chunk: *chunk,
                            data: works[rank][range.clone()].to_vec(),
                        });
                    }
                    Step::Recv {
                        peer,
                        range,
                        step,
                        chunk,
                        action,
                    } => {
                        let Some(frame) =
                            mail.get_mut(&(*peer, rank)).and_then(VecDeque::pop_front)
                        else {
                            break;
                        };
                        if (frame.step, frame.chunk, frame.data.len())
                            != (*step, *chunk, range.len())
                        {
                            return Err(SimError::Mismatch {
                                rank,
                                peer: *peer,
                                detail: format!(
                                    "expected step {step} chunk {chunk} len {}, got step {} chunk {} len {}",
                                    range.len(),
                                    frame.step,
                                    frame.chunk,
                                    frame.data.len()
                                ),
                            });
                        }
                        let source = match action {
                            super::Action::ReduceFrom { .. } => {
                                match action.source(range).and_then(|from| works[rank].get(from)) {
                                    Some(s) => s.to_vec(),
                                    None => {
                                        return Err(SimError::Mismatch {
                                            rank,
                                            peer: *peer,
                                            detail: format!(
                                                "{range:?} reduces from outside the buffer"
                                            ),
                                        });
                                    }
                                }
                            }
                            _ => Vec::new(),
                        };
                        action.apply(&mut works[rank][range.clone()], &source, &frame.data, op);
                    }
                }
                pc[rank] += 1;
                progressed = true;
            }
        }
        if (0..world).all(|r| pc[r] == schedules[r].len()) {
            break;
        }
        if !progressed {
            let waiting = (0..world)
                .filter_map(|r| schedules[r].get(pc[r]).map(|s| (r, s.peer())))
                .collect();
            return Err(SimError::Deadlock(waiting));
        }
    }
    if let Some(((from, to), q)) = mail.iter().find(|(_, q)| !q.is_empty()) {
        return Err(SimError::Leftover {
            from: *from,
            to: *to,
            frames: q.len(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use super::run;
    use crate::testing::{Rng, check_close, random_data, reference_reduce};
    use crate::{DType, Element, ReduceOp};
    use half::{bf16, f16};

    fn lengths(world: usize) -> Vec<usize> {
        vec![0, 1, world.saturating_sub(1), world + 1, 3 * world + 2, 257]
    }

    const CHUNKS: [usize; 3] = [1, 7, 1 << 20];

    fn check_all_reduce<T: Element>(rng: &mut Rng, seed: u64) {
        for world in 1..=9 {
            for len in lengths(world) {
                for op in ReduceOp::ALL {
                    for chunk in CHUNKS {
                        let inputs: Vec<Vec<T>> =
                            (0..world).map(|_| random_data(rng, len, op)).collect();
                        let reference = reference_reduce(&inputs, op);
                        for (name, algo) in [
                            (
                                "ring",
                                all_reduce_ring as fn(&mut Vec<Step>, usize, usize, usize, usize),
                            ),
                            ("doubling", all_reduce_doubling),
                            ("tree", all_reduce_tree),
                            ("halving", all_reduce_halving),
                        ] {
                            let scheds: Vec<_> = (0..world)
                                .map(|r| schedule(|o| algo(o, r, world, len, chunk)))
                                .collect();
                            let mut works = inputs.clone();
                            run(&scheds, &mut works, op).unwrap_or_else(|e| {
                                panic!("seed {seed}: {name} p={world} n={len} {op}: {e:?}")
                            });
                            for (r, w) in works.iter_mut().enumerate() {
                                if op == ReduceOp::Avg {
                                    T::finish_avg(w, world);
                                }
                                check_close(w, &reference, world).unwrap_or_else(|e| {
                                    panic!("seed {seed}: {name} {} p={world} n={len} {op} chunk={chunk} rank {r}: {e}", T::DTYPE)
                                });
                            }
                            // Every rank must hold the same bits.
                            assert!(
                                works.windows(2).all(|w| w[0] == w[1]),
                                "seed {seed}: {name} ranks differ"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn all_reduce_matches_reference_for_every_dtype() {
        let seed = Rng::fresh_seed();
        let mut rng = Rng::new(seed);
        check_all_reduce::<f32>(&mut rng, seed);
        check_all_reduce::<f64>(&mut rng, seed);
        check_all_reduce::<f16>(&mut rng, seed);
        check_all_reduce::<bf16>(&mut rng, seed);
        check_all_reduce::<i32>(&mut rng, seed);
        check_all_reduce::<i64>(&mut rng, seed);
        check_all_reduce::<u8>(&mut rng, seed);
        assert_eq!(DType::ALL.len(), 7, "a new dtype needs a line above");
    }

    /// Calls `check(seed, world, len, chunk, inputs, reference)` for every
    /// world size 1-9, length and chunk, on random inputs per rank and their
    /// reduction by `op`.
    fn each_reduce_scatter_case(
        op: ReduceOp,
        mut check: impl FnMut(u64, usize, usize, usize, &[Vec<f64>], &[f64]),
    ) {
        let seed = Rng::fresh_seed();
        let mut rng = Rng::new(seed);
        for world in 1..=9 {
            for len in lengths(world) {
                for chunk in CHUNKS {
                    let inputs: Vec<Vec<f64>> =
                        (0..world).map(|_| random_data(&mut rng, len, op)).collect();
                    let reference = reference_reduce(&inputs, op);
                    check(seed, world, len, chunk, &inputs, &reference);
                }
            }
        }
    }

    #[test]
    fn reduce_scatter_gives_each_rank_its_block() {
        each_reduce_scatter_case(
            ReduceOp::Sum,
            |seed, world, len, chunk, inputs, reference| {
                let scheds: Vec<_> = (0..world)
                    .map(|r| schedule(|o| reduce_scatter_ring(o, r, world, len, chunk)))
                    .collect();
                let mut works = inputs.to_vec();
                run(&scheds, &mut works, ReduceOp::Sum).unwrap();
                for (r, w) in works.iter().enumerate() {
                    let b = block(len, world, r);
                    check_close(&w[b.clone()], &reference[b], world)
                        .unwrap_or_else(|e| panic!("seed {seed} p={world} n={len} rank {r}: {e}"));
                }
            },
        );
    }

    /// Where `rank`'s work space puts block `b` (index space: the input, then
    /// the work space), as comm.rs lays it out.
    type Layout = fn(usize, usize, usize, usize) -> Range<usize>;

    /// A work space laid out like the input.
    fn mirror(len: usize, world: usize, _rank: usize, b: usize) -> Range<usize> {
        let b = block(len, world, b);
        len + b.start..len + b.end
    }

    /// This rank's block alone (two ranks: the output).
    fn own_block(len: usize, world: usize, rank: usize, _b: usize) -> Range<usize> {
        len..len + block(len, world, rank).len()
    }

    #[test]
    fn reduce_scatter_from_the_input_gives_each_rank_its_block_and_leaves_the_input() {
        each_reduce_scatter_case(
            ReduceOp::Prod,
            |seed, world, len, chunk, inputs, reference| {
                let layouts: Vec<(&str, Layout)> = if world == 2 {
                    vec![("mirror", mirror), ("own block", own_block)]
                } else {
                    vec![("mirror", mirror)]
                };
                for (name, layout) in layouts {
                    let scheds: Vec<_> = (0..world)
                        .map(|r| {
                            schedule(|o| {
                                reduce_scatter_ring_from(o, r, world, len, chunk, |b| {
                                    layout(len, world, r, b)
                                })
                            })
                        })
                        .collect();
                    if world == 1 {
                        // Nothing to exchange: the caller copies its input.
                        assert!(scheds[0].is_empty(), "p=1 needs no steps");
                        continue;
                    }
                    // Input, then a work space of garbage.
                    let mut works: Vec<Vec<f64>> = (0..world)
                        .map(|r| {
                            let end = (0..world).map(|b| layout(len, world, r, b).end).max();
                            let mut w = inputs[r].clone();
                            w.resize(end.unwrap_or(len).max(len), f64::NAN);
                            w
                        })
                        .collect();
                    run(&scheds, &mut works, ReduceOp::Prod).unwrap();
                    for (r, w) in works.iter().enumerate() {
                        let why = |e: String| {
                            panic!(
                                "seed {seed} p={world} n={len} chunk {chunk} {name} rank {r}: {e}"
                            )
                        };
                        if w[..len] != inputs[r][..] {
                            why("the input changed".into());
                        }
                        let mine = block(len, world, r);
                        check_close(&w[layout(len, world, r, r)], &reference[mine], world)
                            .unwrap_or_else(why);
                    }
                }
            },
        );
    }

    #[test]
    fn reduce_scatter_into_the_output_through_one_slot() {
        each_reduce_scatter_case(
            ReduceOp::Sum,
            |seed, world, len, chunk, inputs, reference| {
                // Index space: input, this rank's block, and the slot (at the
                // block's tail where it fits, else after it), as comm.rs runs it.
                let place = |r: usize| reduce_scatter_slot(len, world, r, chunk);
                let scheds: Vec<_> = (0..world)
                    .map(|r| {
                        schedule(|o| reduce_scatter_ring_into(o, r, world, len, chunk, place(r).0))
                    })
                    .collect();
                let mut works: Vec<Vec<f64>> = (0..world)
                    .map(|r| {
                        let mut w = inputs[r].clone();
                        w.resize(len + place(r).1, f64::NAN); // work starts as garbage
                        w
                    })
                    .collect();
                if world == 1 {
                    assert!(scheds[0].is_empty(), "p=1 needs no steps");
                    return;
                }
                run(&scheds, &mut works, ReduceOp::Sum).unwrap();
                for (r, w) in works.iter().enumerate() {
                    let why = |e: String| {
                        panic!("seed {seed} p={world} n={len} chunk {chunk} rank {r}: {e}")
                    };
                    if w[..len] != inputs[r][..] {
                        why("the input changed".into());
                    }
                    let mine = block(len, world, r);
                    check_close(&w[len..len + mine.len()], &reference[mine], world)
                        .unwrap_or_else(why);
                }
            },
        );
    }

    #[test]
    fn all_gather_concatenates_in_rank_order() {
        let seed = Rng::fresh_seed();
        let mut rng = Rng::new(seed);
        for world in 1..=9 {
            for per in [0, 1, 2, 5, 33] {
                for chunk in CHUNKS {
                    let inputs: Vec<Vec<i64>> = (0..world)
                        .map(|_| random_data(&mut rng, per, ReduceOp::Sum))
                        .collect();
                    let expected: Vec<i64> = inputs.concat();
                    let mut works: Vec<Vec<i64>> = (0..world)
                        .map(|r| {
                            let mut w = vec![0; per * world];
                            w[r * per..(r + 1) * per].copy_from_slice(&inputs[r]);
                            w
                        })
                        .collect();
                    let scheds: Vec<_> = (0..world)
                        .map(|r| schedule(|o| all_gather_ring(o, r, world, per, chunk)))
                        .collect();
                    run(&scheds, &mut works, ReduceOp::Sum).unwrap();
                    assert!(
                        works.iter().all(|w| *w == expected),
                        "seed {seed} p={world} per={per}"
                    );
                }
            }
        }
    }

    #[test]
    fn all_gather_v_concatenates_uneven_blocks_in_rank_order() {
        let seed = Rng::fresh_seed();
        let mut rng = Rng::new(seed);
        for world in 1..=9 {
            for pattern in 0..4 {
                // Empty blocks, one long one, ragged, all equal.
                let counts: Vec<usize> = (0..world)
                    .map(|r| match pattern {
                        0 => (r % 3) * (r % 2),
                        1 => usize::from(r == world / 2) * 70,
                        2 => (r * 7 + 3) % 11,
                        _ => 5,
                    })
                    .collect();
                for chunk in CHUNKS {
                    let inputs: Vec<Vec<i64>> = counts
                        .iter()
                        .map(|&n| random_data(&mut rng, n, ReduceOp::Sum))
                        .collect();
                    let expected: Vec<i64> = inputs.concat();
                    let mut works: Vec<Vec<i64>> = (0..world)
                        .map(|r| {
                            let mut w = vec![0; expected.len()];
                            let start: usize = counts[..r].iter().sum();
                            w[start..start + counts[r]].copy_from_slice(&inputs[r]);
                            w
                        })
                        .collect();
                    let scheds: Vec<_> = (0..world)
                        .map(|r| schedule(|o| all_gather_v_ring(o, r, &counts, chunk)))
                        .collect();
                    run(&scheds, &mut works, ReduceOp::Sum).unwrap();
                    assert!(
                        works.iter().all(|w| *w == expected),
                        "seed {seed} p={world} counts {counts:?} chunk {chunk}"
                    );
                }
            }
        }
    }

    /// Gather to every root lands each rank's block in its place at the
    /// root; scatter from every root gives each rank its block. Work
    /// buffers as `gather` and `scatter` say: the root's holds all blocks,
    /// another rank's only its own.
    #[test]
    fn gather_and_scatter_move_every_block_for_every_root() {
        let seed = Rng::fresh_seed();
        let mut rng = Rng::new(seed);
        for world in 1..=9 {
            for per in [0, 1, 2, 5, 33] {
                for chunk in CHUNKS {
                    for root in 0..world {
                        let blocks: Vec<Vec<i32>> = (0..world)
                            .map(|_| random_data(&mut rng, per, ReduceOp::Sum))
                            .collect();
                        let all = blocks.concat();
                        let case = format!("seed {seed} p={world} per={per} root {root}");

                        let works: Vec<Vec<i32>> = (0..world)
                            .map(|r| match r == root {
                                true => {
                                    let mut w = vec![0; per * world];
                                    w[r * per..(r + 1) * per].copy_from_slice(&blocks[r]);
                                    w
                                }
                                false => blocks[r].clone(),
                            })
                            .collect();
                        for in_turn in [false, true] {
                            let mut works = works.clone();
                            let scheds: Vec<_> = (0..world)
                                .map(|r| {
                                    schedule(|o| gather(o, (r, world, root), per, chunk, in_turn))
                                })
                                .collect();
                            run(&scheds, &mut works, ReduceOp::Sum).unwrap();
                            assert_eq!(works[root], all, "gather {case} in turn {in_turn}");
                        }

                        let mut works: Vec<Vec<i32>> = (0..world)
                            .map(|r| match r == root {
                                true => all.clone(),
                                false => vec![0; per],
                            })
                            .collect();
                        let scheds: Vec<_> = (0..world)
                            .map(|r| schedule(|o| scatter(o, r, world, root, per, chunk)))
                            .collect();
                        run(&scheds, &mut works, ReduceOp::Sum).unwrap();
                        for r in (0..world).filter(|&r| r != root) {
                            assert_eq!(works[r], blocks[r], "scatter {case}: rank {r}");
                        }
                    }
                }
            }
        }
    }

    /// Every rank's schedule from `build(steps, rank)`, paced (decision
    /// 0024) with the rank's `split`.
    fn paced(
        world: usize,
        build: impl Fn(&mut Vec<Step>, usize),
        split: impl Fn(usize) -> usize,
    ) -> Vec<Vec<Step>> {
        let (mut spare, mut marks) = (Vec::new(), Vec::new());
        (0..world)
            .map(|r| {
                let mut s = schedule(|o| build(o, r));
                pace(&mut s, &mut spare, &mut marks, world, split(r));
                s
            })
            .collect()
    }

    /// Paced schedules (decision 0024) of the rooted ops still deliver:
    /// every rank's words match its peers', for every root.
    #[test]
    fn paced_rooted_ops_still_deliver() {
        let seed = Rng::fresh_seed();
        let mut rng = Rng::new(seed);
        for world in 1..=9 {
            for chunk in CHUNKS {
                for root in 0..world {
                    let per = 5;
                    let len = per * world;
                    let data: Vec<i32> = random_data(&mut rng, len, ReduceOp::Sum);
                    let case = format!("seed {seed} p={world} chunk {chunk} root {root}");
                    let root_has = |whole: &[i32], other: usize| -> Vec<Vec<i32>> {
                        (0..world)
                            .map(|r| match r == root {
                                true => whole.to_vec(),
                                false => vec![0; other],
                            })
                            .collect()
                    };
                    for tree in [true, false] {
                        let mut works = root_has(&data, len);
                        let scheds = paced(
                            world,
                            |o, r| match tree {
                                true => broadcast_tree(o, r, world, root, len, chunk),
                                false => broadcast_chain(o, r, world, root, len, chunk),
                            },
                            |_| 0,
                        );
                        run(&scheds, &mut works, ReduceOp::Sum).unwrap();
                        assert!(
                            works.iter().all(|w| *w == data),
                            "broadcast {case} tree {tree}"
                        );
                    }
                    let inputs: Vec<Vec<i32>> = (0..world)
                        .map(|_| random_data(&mut rng, len, ReduceOp::Sum))
                        .collect();
                    let reference = reference_reduce(&inputs, ReduceOp::Sum);
                    let mut works = inputs.clone();
                    let scheds = paced(
                        world,
                        |o, r| reduce_tree(o, r, world, root, len, chunk),
                        |_| 0,
                    );
                    run(&scheds, &mut works, ReduceOp::Sum).unwrap();
                    check_close(&works[root], &reference, world)
                        .unwrap_or_else(|e| panic!("reduce {case}: {e}"));
                    // As the ops run them: other ranks read their input in
                    // place (their words land after it, with a slot of
                    // garbage beyond).
                    let scheds = paced(
                        world,
                        |o, r| match r == root {
                            true => reduce_tree(o, r, world, root, len, chunk),
                            false => reduce_tree_from(o, r, world, root, len, chunk),
                        },
                        |r| if r == root { 0 } else { len },
                    );
                    let mut works: Vec<Vec<i32>> = (0..world)
                        .map(|r| {
                            let mut w = inputs[r].clone();
                            if r != root {
                                w.resize(len + chunk.min(len), 12345);
                            }
                            w
                        })
                        .collect();
                    run(&scheds, &mut works, ReduceOp::Sum).unwrap();
                    check_close(&works[root], &reference, world)
                        .unwrap_or_else(|e| panic!("reduce_from {case}: {e}"));
                    // The scatter root sends from its read-only input: its
                    // words land after it (an empty work buffer).
                    let mut works = root_has(&data, per);
                    let scheds = paced(
                        world,
                        |o, r| scatter(o, r, world, root, per, chunk),
                        |r| if r == root { len } else { 0 },
                    );
                    run(&scheds, &mut works, ReduceOp::Sum).unwrap();
                    for r in (0..world).filter(|&r| r != root) {
                        assert_eq!(
                            works[r],
                            data[r * per..(r + 1) * per],
                            "scatter {case} rank {r}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn broadcast_and_reduce_reach_every_root() {
        let seed = Rng::fresh_seed();
        let mut rng = Rng::new(seed);
        for world in 1..=9 {
            for len in lengths(world) {
                for root in 0..world {
                    for chunk in CHUNKS {
                        let inputs: Vec<Vec<i32>> = (0..world)
                            .map(|_| random_data(&mut rng, len, ReduceOp::Sum))
                            .collect();
                        for algo in [
                            broadcast_tree as fn(&mut Vec<Step>, usize, usize, usize, usize, usize),
                            broadcast_chain,
                        ] {
                            let scheds: Vec<_> = (0..world)
                                .map(|r| schedule(|o| algo(o, r, world, root, len, chunk)))
                                .collect();
                            let mut works = inputs.clone();
                            run(&scheds, &mut works, ReduceOp::Sum).unwrap();
                            assert!(
                                works.iter().all(|w| *w == inputs[root]),
                                "seed {seed} bcast p={world} root={root}"
                            );
                        }
                        let reference = reference_reduce(&inputs, ReduceOp::Max);
                        type Build = fn(&mut Vec<Step>, usize, usize, usize, usize, usize);
                        let reduces: [(&str, Build, Build); 2] = [
                            ("tree", reduce_tree, reduce_tree_from),
                            ("chain", reduce_chain, reduce_chain_from),
                        ];
                        for (name, reduce, reduce_from) in reduces {
                            let scheds: Vec<_> = (0..world)
                                .map(|r| schedule(|o| reduce(o, r, world, root, len, chunk)))
                                .collect();
                            let mut works = inputs.clone();
                            run(&scheds, &mut works, ReduceOp::Max).unwrap();
                            check_close(&works[root], &reference, world).unwrap_or_else(|e| {
                                panic!("seed {seed} {name} reduce p={world} root={root}: {e}")
                            });
                            // Again with the other ranks reading their input
                            // in place, through one chunk's slot of garbage
                            // after it.
                            let scheds: Vec<_> = (0..world)
                                .map(|r| match r == root {
                                    true => schedule(|o| reduce(o, r, world, root, len, chunk)),
                                    false => {
                                        schedule(|o| reduce_from(o, r, world, root, len, chunk))
                                    }
                                })
                                .collect();
                            let mut works: Vec<Vec<i32>> = (0..world)
                                .map(|r| {
                                    let mut w = inputs[r].clone();
                                    if r != root {
                                        // Garbage that would win a max.
                                        w.resize(len + chunk.min(len), i32::MAX);
                                    }
                                    w
                                })
                                .collect();
                            run(&scheds, &mut works, ReduceOp::Max).unwrap();
                            check_close(&works[root], &reference, world).unwrap_or_else(|e| {
                                panic!("seed {seed} {name} reduce_from p={world} root={root}: {e}")
                            });
                            for r in (0..world).filter(|&r| r != root) {
                                assert!(
                                    works[r][..len] == inputs[r][..],
                                    "seed {seed} {name} reduce_from p={world} root={root}: rank {r}'s input changed"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn all_to_all_v_routes_every_block() {
        let seed = Rng::fresh_seed();
        let mut rng = Rng::new(seed);
        for world in 1..=9 {
            for chunk in CHUNKS {
                // counts[i][j]: what rank i sends to rank j (uneven, some zero).
                let counts: Vec<Vec<usize>> = (0..world)
                    .map(|_| (0..world).map(|_| rng.below(5) as usize).collect())
                    .collect();
                let mut blocks: Vec<Vec<Vec<u8>>> = Vec::new();
                let mut works = Vec::new();
                let mut scheds = Vec::new();
                #[allow(clippy::needless_range_loop)] // i is a rank, indexing several tables
                for i in 0..world {
                    let mine: Vec<Vec<u8>> = (0..world)
                        .map(|j| random_data(&mut rng, counts[i][j], ReduceOp::Sum))
                        .collect();
                    let recv_counts: Vec<usize> = (0..world).map(|j| counts[j][i]).collect();
                    let out_len: usize = recv_counts.iter().sum();
                    let mut w = mine.concat();
                    w.resize(w.len() + out_len, 0);
                    works.push(w);
                    scheds.push(schedule(|o| {
                        all_to_all_v(o, i, &counts[i], &recv_counts, chunk)
                    }));
                    blocks.push(mine);
                }
                run(&scheds, &mut works, ReduceOp::Sum).unwrap();
                for i in 0..world {
                    let input_len: usize = counts[i].iter().sum();
                    let mut at = input_len;
                    for j in 0..world {
                        let got = &works[i][at..at + counts[j][i]];
                        if j != i {
                            assert_eq!(got, &blocks[j][i][..], "seed {seed} p={world}: {j}->{i}");
                        }
                        at += counts[j][i];
                    }
                }
            }
        }
    }

    #[test]
    fn barrier_and_p2p_complete() {
        for world in 1..=9 {
            let scheds: Vec<_> = (0..world)
                .map(|r| schedule(|o| barrier(o, r, world)))
                .collect();
            let mut works = vec![Vec::<u8>::new(); world];
            run(&scheds, &mut works, ReduceOp::Sum).unwrap();
        }
        let scheds = vec![
            schedule(|o| send(o, 1, 10, 3)),
            schedule(|o| recv(o, 0, 10, 3)),
        ];
        let mut works = vec![(0..10u8).collect::<Vec<_>>(), vec![0u8; 10]];
        run(&scheds, &mut works, ReduceOp::Sum).unwrap();
        assert_eq!(works[0], works[1]);
    }

    #[test]
    fn simulator_reports_deadlock_and_mismatch() {
        // Both ranks wait first: a deadlock the simulator must name.
        let scheds = vec![
            schedule(|o| recv(o, 1, 4, 4)),
            schedule(|o| recv(o, 0, 4, 4)),
        ];
        let mut works = vec![vec![0u8; 4]; 2];
        assert!(matches!(
            run(&scheds, &mut works, ReduceOp::Sum),
            Err(super::SimError::Deadlock(_))
        ));
        // Lengths disagree: the receiver must notice.
        let scheds = vec![
            schedule(|o| send(o, 1, 4, 4)),
            schedule(|o| recv(o, 0, 3, 4)),
        ];
        let mut works = vec![vec![0u8; 4]; 2];
        assert!(matches!(
            run(&scheds, &mut works, ReduceOp::Sum),
            Err(super::SimError::Mismatch { .. })
        ));
    }
}
