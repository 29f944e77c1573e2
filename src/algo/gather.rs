//! Gather and scatter: the root receives from, or sends to, every other
//! rank directly, as Gloo does. Each rank's block crosses one link once;
//! a binomial tree would save the root frames at small sizes but forward
//! blocks through intermediate ranks, log2(p) times for the farthest.
//! Large gathers to a root of 3+ ranks go in turn (decision 0023).

use super::{Action, Step};

/// Gather of `n` elements per rank to `root`. Work buffer: at the root, the
/// output (`n * world` elements, block r from rank r; its own block is a
/// copy the caller makes); at any other rank, its input, which it sends.
///
/// With `in_turn`, the root asks each rank for its block in turn (an empty
/// frame, step 1) and a rank sends only when asked, so blocks arrive one
/// after another into place instead of all at once into buffers the root
/// must hold and copy from (Open MPI's "linear sync" gather). A rank first
/// says it is there (an empty frame, step 2, sent at once): a root that
/// chose the other form (its ranks disagree on the length) then fails on
/// that frame at once, naming both, instead of each side waiting for the
/// other until the timeout.
pub fn gather(
    out: &mut Vec<Step>,
    (rank, world, root): (usize, usize, usize),
    n: usize,
    chunk: usize,
    in_turn: bool,
) {
    if rank != root {
        if in_turn {
            out.push(Step::Send {
                peer: root,
                range: 0..0,
                step: 2,
                chunk: 0,
            });
            // An empty range where the work buffer starts, after the input.
            out.push(Step::Recv {
                peer: root,
                range: n..n,
                step: 1,
                chunk: 0,
                action: Action::Copy,
            });
        }
        super::push_sends(out, root, 0..n, chunk, 0);
        return;
    }
    for k in 1..world {
        let from = (root + k) % world;
        if in_turn {
            // Asks first: the rank's "here" came at once, and waiting for it
            // before asking would cost a wake-up per rank.
            out.push(Step::Send {
                peer: from,
                range: 0..0,
                step: 1,
                chunk: 0,
            });
            out.push(Step::Recv {
                peer: from,
                range: 0..0,
                step: 2,
                chunk: 0,
                action: Action::Copy,
            });
        }
        super::push_recvs(out, from, from * n..(from + 1) * n, chunk, 0, Action::Copy);
    }
}

/// Whether a gather of `block_bytes` per rank over `world` ranks goes in
/// turn: with 3+ ranks, blocks from 128 KiB. Below that the round trip per
/// rank costs more than the copies it saves; with 2 ranks one block comes
/// at a time anyway. (4 ranks on 2 cores: 1.4-2.4x from 32 KiB blocks, 0.4x
/// at 16 KiB; 3 ranks: 1.0x at 128 KiB, 1.1-1.7x above; decision 0023.)
pub fn gather_in_turn_pays(world: usize, block_bytes: usize) -> bool {
    world >= 3 && block_bytes >= GATHER_IN_TURN_BYTES
}

/// Blocks from this size go in turn (see [`gather_in_turn_pays`]).
pub const GATHER_IN_TURN_BYTES: usize = 128 << 10;

/// Scatter of `n` elements per rank from `root`. Work buffer: at the root,
/// the input (`n * world` elements, block r for rank r; its own block is a
/// copy the caller makes); at any other rank, its output.
pub fn scatter(
    out: &mut Vec<Step>,
    rank: usize,
    world: usize,
    root: usize,
    n: usize,
    chunk: usize,
) {
    if rank != root {
        super::push_recvs(out, root, 0..n, chunk, 0, Action::Copy);
        return;
    }
    for k in 1..world {
        let to = (root + k) % world;
        super::push_sends(out, to, to * n..(to + 1) * n, chunk, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_gathers_of_three_or_more_ranks_go_in_turn() {
        assert!(gather_in_turn_pays(3, GATHER_IN_TURN_BYTES));
        assert!(gather_in_turn_pays(64, 1 << 30));
        assert!(!gather_in_turn_pays(3, GATHER_IN_TURN_BYTES - 1));
        assert!(!gather_in_turn_pays(2, 1 << 30));
        let steps = super::super::schedule(|o| gather(o, (1, 4, 0), 8, 8, true));
        let [first, second, ..] = &steps[..] else {
            panic!("{steps:?}");
        };
        assert!(
            matches!(
                first,
                Step::Send {
                    peer: 0,
                    step: 2,
                    ..
                }
            ),
            "{steps:?}"
        );
        assert!(
            matches!(
                second,
                Step::Recv {
                    peer: 0,
                    step: 1,
                    ..
                }
            ),
            "{steps:?}"
        );
    }
}
