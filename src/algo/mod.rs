//! Collective algorithms as schedules: pure functions from (rank, world size,
//! element count, chunk size) to the ordered list of steps that rank takes,
//! appended to a caller's `Vec<Step>` (so an executor reuses one list and
//! building a schedule allocates nothing once it has grown).
//!
//! No sockets, no clocks, no threads: a schedule is data, so every algorithm is
//! tested against a reference by the in-memory simulator in [`sim`] and the same
//! schedule then runs unchanged on any transport.
//!
//! Every step addresses element ranges of one *work buffer* (what that buffer is
//! per collective is documented on each schedule function). Sends never block
//! on the receiver (transports buffer incoming frames), so a rank may run its
//! steps strictly in order: this is what makes the schedules deadlock-free.
//!
//! Frames between one pair of ranks are FIFO, and the receiver checks every
//! frame's `(step, chunk)` against what its own schedule expects next from that
//! peer: the order of sends to a peer and of receives from it is the same by
//! construction, so a mismatch means the ranks disagree about the collective.

#![forbid(unsafe_code)]

mod alltoall;
mod broadcast;
mod doubling;
mod gather;
pub mod levels;
mod pacing;
mod reduce;
mod ring;
pub mod select;
// The simulator runs every schedule in the tests.
#[cfg(any(test, feature = "internals"))]
pub mod sim;

pub use alltoall::{all_to_all_v, barrier, exchange, recv, send};
#[cfg(any(test, feature = "internals"))]
pub use alltoall::all_to_all;
pub use broadcast::{broadcast_chain, broadcast_tree};
pub use doubling::{all_reduce_doubling, all_reduce_halving, all_reduce_halving_pays};
pub use gather::{gather, gather_in_turn_pays, scatter};
#[cfg(any(test, feature = "internals"))]
pub use gather::GATHER_IN_TURN_BYTES;
pub use pacing::{pace, pacing_pays};
#[cfg(any(test, feature = "internals"))]
pub use pacing::{HERE_STEP, PACE_BELOW_BYTES, PACE_FROM_BYTES, READY_STEP};
pub use reduce::{
    all_reduce_tree, reduce_chain, reduce_chain_from, reduce_chain_pays, reduce_tree,
    reduce_tree_from,
};
pub use ring::{
    all_gather_ring, all_gather_v_ring, all_reduce_ring, reduce_scatter_ring_from, reduce_scatter_ring_into, reduce_scatter_slot,
};
#[cfg(any(test, feature = "internals"))]
pub use ring::reduce_scatter_ring;

use std::ops::Range;

/// What a receive does with the incoming elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Overwrite the range.
    Copy,
    /// Combine into the range with the collective's reduce operator.
    Reduce,
    /// Overwrite the range with the incoming elements combined with the
    /// range `back` elements before it, in the read-only input that starts
    /// the schedule's index space: a range's first touch, so the input need
    /// not be copied into the work buffer beforehand.
    ReduceFrom { back: usize },
}

impl Action {
    /// Applies received elements to their range of the work buffer;
    /// `source` is the input range a [`Action::ReduceFrom`] combines them
    /// with (the others ignore it).
    pub fn apply<T: crate::Element>(
        self,
        dst: &mut [T],
        source: &[T],
        incoming: &[T],
        op: crate::ReduceOp,
    ) {
        match self {
            Action::Copy => dst.copy_from_slice(incoming),
            Action::Reduce => T::reduce_into(dst, incoming, op),
            Action::ReduceFrom { .. } => T::combine_into(dst, source, incoming, op),
        }
    }

    /// Where a [`Action::ReduceFrom`] into `range` reads its input.
    pub fn source(self, range: &Range<usize>) -> Option<Range<usize>> {
        match self {
            Action::ReduceFrom { back } => {
                Some(range.start.checked_sub(back)?..range.end.checked_sub(back)?)
            }
            _ => None,
        }
    }
}

/// One step of a rank's schedule. `step` and `chunk` are carried in the frame
/// header and checked by the receiver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Send `range` of the work buffer to `peer`.
    Send {
        peer: usize,
        range: Range<usize>,
        step: u32,
        chunk: u32,
    },
    /// Receive `range.len()` elements from `peer` into `range`.
    Recv {
        peer: usize,
        range: Range<usize>,
        step: u32,
        chunk: u32,
        action: Action,
    },
}

impl Step {
    /// The peer this step talks to.
    #[cfg(any(test, feature = "internals"))]
    pub fn peer(&self) -> usize {
        match self {
            Step::Send { peer, .. } | Step::Recv { peer, .. } => *peer,
        }
    }
}

/// Splits `len` elements into `parts` contiguous blocks whose sizes differ by
/// at most one (the first `len % parts` blocks get the extra element), and
/// returns block `index`. This is the block rank `index` owns in
/// reduce-scatter.
pub fn block(len: usize, parts: usize, index: usize) -> Range<usize> {
    debug_assert!(parts > 0 && index < parts);
    let base = len / parts;
    let extra = len % parts;
    let start = index * base + index.min(extra);
    let size = base + usize::from(index < extra);
    start..start + size
}

/// Splits `range` into consecutive chunks of at most `chunk` elements (no
/// chunk at all for an empty range).
pub fn chunks(range: Range<usize>, chunk: usize) -> impl Iterator<Item = Range<usize>> {
    let chunk = chunk.max(1);
    let Range { start, end } = range;
    (start..end)
        .step_by(chunk)
        .map(move |s| s..(s + chunk).min(end))
}

/// Runs `build` on an empty step list and returns it (tests, tools).
pub fn schedule(build: impl FnOnce(&mut Vec<Step>)) -> Vec<Step> {
    let mut out = Vec::new();
    build(&mut out);
    out
}

/// Pushes sends of every chunk of `range` to `peer`.
fn push_sends(out: &mut Vec<Step>, peer: usize, range: Range<usize>, chunk: usize, step: u32) {
    for (i, r) in chunks(range, chunk).enumerate() {
        out.push(Step::Send {
            peer,
            range: r,
            step,
            chunk: i as u32,
        });
    }
}

/// Pushes receives of every chunk of `range` from `peer`.
fn push_recvs(
    out: &mut Vec<Step>,
    peer: usize,
    range: Range<usize>,
    chunk: usize,
    step: u32,
    action: Action,
) {
    for (i, r) in chunks(range, chunk).enumerate() {
        out.push(Step::Recv {
            peer,
            range: r,
            step,
            chunk: i as u32,
            action,
        });
    }
}

/// Pushes `rank`'s steps of a pipelined chain over every rank in ring
/// order from `first`: each chunk of `0..len` goes `first` -> `first + 1`
/// -> ... -> `first - 1`; every rank but `first` receives it from its
/// predecessor (applying `action`), every rank but the last sends it on.
/// A broadcast chain starts at its root, a reduce chain right after it.
#[allow(clippy::too_many_arguments)]
fn push_chain(
    out: &mut Vec<Step>,
    rank: usize,
    world: usize,
    first: usize,
    len: usize,
    chunk: usize,
    step: u32,
    action: Action,
) {
    if world <= 1 {
        return;
    }
    let place = (rank + world - first) % world;
    let prev = (rank + world - 1) % world;
    let next = (rank + 1) % world;
    for (c, r) in chunks(0..len, chunk).enumerate() {
        if place > 0 {
            out.push(Step::Recv {
                peer: prev,
                range: r.clone(),
                step,
                chunk: c as u32,
                action,
            });
        }
        if place + 1 < world {
            out.push(Step::Send {
                peer: next,
                range: r,
                step,
                chunk: c as u32,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_the_range_in_order() {
        for len in [0, 1, 2, 5, 7, 64, 1001] {
            for parts in 1..=9 {
                let mut next = 0;
                for i in 0..parts {
                    let b = block(len, parts, i);
                    assert_eq!(b.start, next);
                    assert!(b.len() == len / parts || b.len() == len / parts + 1);
                    next = b.end;
                }
                assert_eq!(next, len);
            }
        }
    }

    #[test]
    fn chunks_cover_the_range() {
        let c: Vec<_> = chunks(3..10, 3).collect();
        assert_eq!(c, vec![3..6, 6..9, 9..10]);
        assert_eq!(chunks(4..4, 3).count(), 0);
    }
}
