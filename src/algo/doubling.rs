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
    let pow2 = 1usize << (usize::BITS - 1 - world.leading_zeros());
    let rem = world - pow2;
    let all = 0..len;
    let mut step = 0u32;
    // Fold the extra ranks into their odd neighbours.
    let new_rank = if rank < 2 * rem {
        if rank % 2 == 0 {
            super::push_sends(out, rank + 1, all.clone(), chunk, step);
            None
        } else {
            super::push_recvs(out, rank - 1, all.clone(), chunk, step, Action::Reduce);
            Some(rank / 2)
        }
    } else {
        Some(rank - rem)
    };
    step += 1;
    let real = |v: usize| if v < rem { v * 2 + 1 } else { v + rem };
    if let Some(v) = new_rank {
        let mut mask = 1;
        while mask < pow2 {
            let partner = real(v ^ mask);
            super::push_sends(out, partner, all.clone(), chunk, step);
            super::push_recvs(out, partner, all.clone(), chunk, step, Action::Reduce);
            mask <<= 1;
            step += 1;
        }
    } else {
        step += pow2.trailing_zeros();
    }
    // Unfold: odd ranks return the result.
    if rank < 2 * rem {
        if rank % 2 == 0 {
            super::push_recvs(out, rank + 1, all, chunk, step, Action::Copy);
        } else {
            super::push_sends(out, rank - 1, all, chunk, step);
        }
    }
}
