//! Receives posted ahead of their turn.
//!
//! What: a caller names the frames it will take last from one link (their
//! keys, and where each goes in one region of its memory), goes on with
//! other work, then takes them one by one in that order. A frame that
//! arrives after it was posted lands straight in its piece; one that came
//! earlier waits in the sink as usual.
//!
//! Why: in a ring's all-gather phase (and a broadcast chain) a peer's
//! chunks arrive while this rank is still reducing or forwarding earlier
//! ones. Posted only when reached, most of them have arrived already and
//! cost a second copy out of a pooled buffer (about a twentieth of the CPU
//! of a large all-reduce over TCP).
//!
//! Sound without `unsafe` here: the region stays borrowed for the whole
//! scope, and the scope ends (on unwinding too) only once every piece is
//! taken or withdrawn and the kernel no longer writes to it. The caller's
//! body holds a handle, never the scope itself, so it cannot move the
//! scope's state out of it.

use super::{FrameEngine, FrameKey, FrameSink, MAX_TURN, PlaceRequest, Placement, lock};
use std::time::Instant;

/// One posted piece of the region.
pub(crate) struct Posted {
    id: u64,
    key: FrameKey,
    offset: usize,
    len: usize,
}

struct Scope<'r> {
    engine: &'r FrameEngine,
    sink: &'r dyn FrameSink,
    region: &'r mut [u8],
    /// `spare.posted`: the pieces in posting order. The storage goes back
    /// to the engine for reuse.
    spare: Spare,
    /// Index of the next piece to take.
    next: usize,
    /// Why nothing was posted (pieces outside the region or overlapping).
    refused: Option<String>,
}

/// Storage the scopes reuse, so steady-state ops allocate nothing.
#[derive(Default)]
pub(crate) struct Spare {
    posted: Vec<Posted>,
    /// The pieces' (offset, len), sorted to check that none overlap.
    sorted: Vec<(usize, usize)>,
}

/// The caller's handle on posted receives (see
/// [`FrameEngine::with_placements`]).
pub struct Placements<'s, 'r> {
    scope: &'s mut Scope<'r>,
}

impl FrameEngine {
    /// Posts a receive for each of `pieces` (a frame key, and the offset
    /// and length of its piece of `region`; pieces must not overlap), runs
    /// `body`, and returns once the kernel no longer writes to `region`:
    /// pieces `body` did not take are withdrawn (one being filled is waited
    /// for). `body` takes the pieces in posting order with
    /// [`Placements::take`], and may drive the engine for other work
    /// meanwhile. Pieces that leave the region or overlap are refused as a
    /// whole: nothing is posted and every take fails saying why.
    pub fn with_placements<R>(
        &self,
        link: usize,
        region: &mut [u8],
        pieces: &mut dyn Iterator<Item = (FrameKey, usize, usize)>,
        sink: &dyn FrameSink,
        body: impl FnOnce(Placements<'_, '_>) -> R,
    ) -> R {
        let mut spare = std::mem::take(&mut *lock(&self.spare_placements));
        spare.posted.extend(pieces.map(|(key, offset, len)| Posted {
            id: 0,
            key,
            offset,
            len,
        }));
        let refused = refusal(&spare.posted, region.len(), &mut spare.sorted);
        if refused.is_some() {
            spare.posted.clear();
        }
        {
            let mut st = lock(&self.state);
            for p in &mut spare.posted {
                p.id = st.next_id;
                st.next_id += 1;
                st.queued.placements.push(PlaceRequest {
                    id: p.id,
                    link,
                    key: p.key,
                    ptr: region[p.offset..].as_mut_ptr(),
                    len: p.len,
                });
            }
            self.poke_if_driving(&st);
        }
        let mut scope = Scope {
            engine: self,
            sink,
            region,
            spare,
            next: 0,
            refused,
        };
        body(Placements { scope: &mut scope })
    }
}

/// Why `pieces` cannot be posted in a region of `size` bytes, if they
/// cannot: one leaves it, or two overlap (`sorted` is scratch space).
fn refusal(pieces: &[Posted], size: usize, sorted: &mut Vec<(usize, usize)>) -> Option<String> {
    sorted.clear();
    sorted.extend(pieces.iter().map(|p| (p.offset, p.len)));
    sorted.sort_unstable();
    let mut end = 0;
    for &(offset, len) in sorted.iter() {
        let Some(this_end) = offset.checked_add(len).filter(|&e| e <= size) else {
            return Some(format!(
                "a piece of {len} bytes at {offset} leaves the {size}-byte region"
            ));
        };
        if len > 0 && offset < end {
            return Some(format!("the piece at {offset} overlaps the one before it"));
        }
        end = end.max(this_end);
    }
    None
}

impl Placements<'_, '_> {
    /// Waits for the next posted piece, which must be the frame `key` of
    /// `len` bytes at `offset`, and returns how it ended (as
    /// [`FrameEngine::receive_in_place`]: `Stopped` once `stop` answers,
    /// unless the frame was being received already) with the piece's
    /// memory. The piece is taken either way. Asking for any other frame
    /// fails without taking anything.
    pub fn take<S>(
        &mut self,
        key: FrameKey,
        offset: usize,
        len: usize,
        until: Instant,
        stop: &mut dyn FnMut() -> Option<S>,
    ) -> (Placement<S>, &mut [u8]) {
        let scope = &mut *self.scope;
        if let Some(why) = &scope.refused {
            return (
                Placement::Failed(format!("nothing was posted: {why}")),
                &mut [],
            );
        }
        let Some(piece) = scope.spare.posted.get(scope.next) else {
            return (
                Placement::Failed("no posted receive is left to take".into()),
                &mut [],
            );
        };
        if (piece.key, piece.offset, piece.len) != (key, offset, len) {
            return (
                Placement::Failed(format!(
                    "the next posted receive is frame {:?} of {} bytes at {}, not {key:?} of {len} at {offset}",
                    piece.key, piece.len, piece.offset
                )),
                &mut [],
            );
        }
        let id = piece.id;
        scope.next += 1;
        let outcome = scope.engine.await_placement(id, until, scope.sink, stop);
        (outcome, &mut scope.region[offset..offset + len])
    }
}

impl Drop for Scope<'_> {
    fn drop(&mut self) {
        let untaken = &self.spare.posted[self.next..];
        if !untaken.is_empty() {
            let mut st = lock(&self.engine.state);
            st.queued.withdrawals.extend(untaken.iter().map(|p| p.id));
            self.engine.poke_if_driving(&st);
        }
        for p in untaken {
            // Withdrawn, placed or failed: whichever, the kernel is done
            // with the piece once its outcome is in.
            while let Err(seen) = self.engine.take_done(p.id) {
                self.engine
                    .progress(seen, Instant::now() + MAX_TURN, self.sink);
            }
        }
        let mut spare = std::mem::take(&mut self.spare);
        spare.posted.clear();
        let mut kept = lock(&self.engine.spare_placements);
        if kept.posted.capacity() < spare.posted.capacity() {
            *kept = spare;
        }
    }
}
