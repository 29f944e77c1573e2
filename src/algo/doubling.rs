//! Recursive doubling all-reduce for small messages: ceil(log2 p) rounds of
//! whole-buffer exchanges instead of the ring's 2(p-1) latency-bound steps.
//!
//! For p not a power of two (Thakur, Rabenseifner and Gropp, 2005): with
//! p' the largest power of two <= p and rem = p - p', each even rank below
//! 2*rem first hands its data to the odd rank above it and sits out; the p'
//! remaining ranks run recursive doubling; then each odd rank hands the result
//! back. Both partners of an exchange compute `a + b` and `b + a`, which are
//! bitwise equal in IEEE arithmetic, so every rank ends with the same bits.

use super::{Action, Step};
use std::ops::Range;

/// How ranks beyond the largest power of two `pow2` take part: each even
/// rank below `2 * rem` hands its buffer to the odd rank above it and sits
/// out; the `pow2` others run the rounds as virtual ranks; then the odd
/// ranks hand the result back.
struct Fold {
    pow2: usize,
    rem: usize,
}

impl Fold {
    fn new(world: usize) -> Fold {
        let pow2 = 1usize << (usize::BITS - 1 - world.leading_zeros());
        Fold {
            pow2,
            rem: world - pow2,
        }
    }

    /// Rounds of the power-of-two part.
    fn rounds(&self) -> u32 {
        self.pow2.trailing_zeros()
    }

    /// `rank`'s virtual rank, or `None` if it sits out.
    fn virtual_rank(&self, rank: usize) -> Option<usize> {
        match rank < 2 * self.rem {
            true => (rank % 2 == 1).then_some(rank / 2),
            false => Some(rank - self.rem),
        }
    }

    /// The rank behind virtual rank `v`.
    fn real(&self, v: usize) -> usize {
        if v < self.rem {
            v * 2 + 1
        } else {
            v + self.rem
        }
    }

    /// The fold before the rounds: even ranks below `2 * rem` send, the odd
    /// rank above each reduces.
    fn push_in(&self, out: &mut Vec<Step>, rank: usize, len: usize, chunk: usize, step: u32) {
        if rank < 2 * self.rem {
            match rank % 2 {
                0 => super::push_sends(out, rank + 1, 0..len, chunk, step),
                _ => super::push_recvs(out, rank - 1, 0..len, chunk, step, Action::Reduce),
            }
        }
    }

    /// The unfold after the rounds: the odd ranks return the result.
    fn push_out(&self, out: &mut Vec<Step>, rank: usize, len: usize, chunk: usize, step: u32) {
        if rank < 2 * self.rem {
            match rank % 2 {
                0 => super::push_recvs(out, rank + 1, 0..len, chunk, step, Action::Copy),
                _ => super::push_sends(out, rank - 1, 0..len, chunk, step),
            }
        }
    }
}

/// Recursive-doubling all-reduce of `len` elements. Work buffer: the user's
/// buffer. `chunk` only cuts frames; it does not change the algorithm.
pub fn all_reduce_doubling(
    out: &mut Vec<Step>,
    rank: usize,
    world: usize,
    len: usize,
    chunk: usize,
) {
    if world <= 1 || len == 0 {
        return;
    }
    let fold = Fold::new(world);
    fold.push_in(out, rank, len, chunk, 0);
    if let Some(v) = fold.virtual_rank(rank) {
        for round in 0..fold.rounds() {
            let partner = fold.real(v ^ (1 << round));
            super::push_sends(out, partner, 0..len, chunk, 1 + round);
            super::push_recvs(out, partner, 0..len, chunk, 1 + round, Action::Reduce);
        }
    }
    fold.push_out(out, rank, len, chunk, 1 + fold.rounds());
}

/// Whether an all-reduce of `bytes` over `world` ranks runs
/// [`all_reduce_halving`] instead of the ring, the tree or recursive
/// doubling: from 256 KiB to below 8 MiB on 3 or more ranks, when some link
/// of the job is TCP (`tcp_links`, the same on every rank). There it beat
/// the others over TCP on 3, 4 and 8 ranks (1.07-1.37x at 4 ranks); over
/// Unix links it was 0.80-0.88x from 2 MiB, so a job without TCP links
/// keeps them (decision 0022). Two ranks keep their ring, which is this
/// exchange already.
pub fn all_reduce_halving_pays(world: usize, bytes: usize, tcp_links: bool) -> bool {
    tcp_links && world >= 3 && (HALVING_FROM..HALVING_UNTIL).contains(&bytes)
}

const HALVING_FROM: usize = 256 << 10;
const HALVING_UNTIL: usize = 8 << 20;

/// Step numbers of [`all_reduce_halving`] start here, so a rank that chose
/// another all-reduce meets a mismatch on the first frame.
const HALVING_STEP: u32 = 3 << 20;

/// Rabenseifner's all-reduce of `len` elements: a reduce-scatter by
/// recursive halving (each round a rank sends the half of its range its
/// partner keeps and reduces the half it keeps), then an all-gather by
/// recursive doubling in the reverse order. It moves the ring's bytes,
/// 2(p-1)/p of the buffer per rank, in 2 log2(p) rounds of pairwise
/// exchanges instead of 2(p-1) steps. Extra ranks of a p that is not a
/// power of two are folded in as in [`all_reduce_doubling`]. Partners
/// always hold the same range when they split it, so both cut it alike.
pub fn all_reduce_halving(
    out: &mut Vec<Step>,
    rank: usize,
    world: usize,
    len: usize,
    chunk: usize,
) {
    if world <= 1 || len == 0 {
        return;
    }
    let fold = Fold::new(world);
    let rounds = fold.rounds();
    fold.push_in(out, rank, len, chunk, HALVING_STEP);
    if let Some(v) = fold.virtual_rank(rank) {
        // Round r splits halved(r) into halved(r + 1), this rank's half,
        // and the partner's; the all-gather retraces the rounds backwards.
        let halves = |r: u32| {
            let (whole, mine) = (halved(len, v, r), halved(len, v, r + 1));
            let theirs = match mine.start == whole.start {
                true => mine.end..whole.end,
                false => whole.start..mine.start,
            };
            (fold.real(v ^ (1 << r)), mine, theirs)
        };
        for round in 0..rounds {
            let (partner, mine, theirs) = halves(round);
            let step = HALVING_STEP + 1 + round;
            super::push_sends(out, partner, theirs, chunk, step);
            super::push_recvs(out, partner, mine, chunk, step, Action::Reduce);
        }
        for (i, round) in (0..rounds).rev().enumerate() {
            let (partner, mine, theirs) = halves(round);
            let step = HALVING_STEP + 1 + rounds + i as u32;
            super::push_sends(out, partner, mine, chunk, step);
            super::push_recvs(out, partner, theirs, chunk, step, Action::Copy);
        }
    }
    fold.push_out(out, rank, len, chunk, HALVING_STEP + 1 + 2 * rounds);
}

/// The range virtual rank `v` keeps of `0..len` after `rounds` halvings:
/// round r keeps the lower half where bit r of `v` is 0, else the upper.
/// Recomputed rather than kept, so the schedule allocates nothing.
fn halved(len: usize, v: usize, rounds: u32) -> Range<usize> {
    (0..rounds).fold(0..len, |range, round| {
        let mid = range.start + range.len() / 2;
        match v & (1 << round) {
            0 => range.start..mid,
            _ => mid..range.end,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::schedule;

    #[test]
    fn halving_doubling_runs_at_mid_sizes_on_jobs_with_tcp_links() {
        for world in [3, 4, 8, 9] {
            assert!(all_reduce_halving_pays(world, 256 << 10, true), "p={world}");
            assert!(
                all_reduce_halving_pays(world, (8 << 20) - 1, true),
                "p={world}"
            );
            assert!(!all_reduce_halving_pays(world, (256 << 10) - 1, true));
            assert!(!all_reduce_halving_pays(world, 8 << 20, true));
            assert!(
                !all_reduce_halving_pays(world, 1 << 20, false),
                "Unix links only"
            );
        }
        assert!(
            !all_reduce_halving_pays(2, 1 << 20, true),
            "two ranks keep the ring"
        );
    }

    #[test]
    fn halving_doubling_sends_the_rings_bytes_in_2_log2_p_rounds() {
        let (world, len) = (8, 1000);
        for rank in 0..world {
            let steps = schedule(|o| all_reduce_halving(o, rank, world, len, len));
            let sent: usize = steps
                .iter()
                .map(|s| match s {
                    Step::Send { range, .. } => range.len(),
                    Step::Recv { .. } => 0,
                })
                .sum();
            // 2 (p-1)/p of the buffer, as the ring: 1750 of 1000 elements.
            assert_eq!(sent, 2 * len * (world - 1) / world, "rank {rank}");
            let rounds: std::collections::BTreeSet<u32> = steps
                .iter()
                .map(|s| match s {
                    Step::Send { step, .. } | Step::Recv { step, .. } => *step,
                })
                .collect();
            assert_eq!(rounds.len(), 6, "rank {rank}: 2 log2 8 rounds");
            assert!(
                rounds.iter().all(|&r| r > HALVING_STEP),
                "its own step numbers"
            );
        }
    }
}
