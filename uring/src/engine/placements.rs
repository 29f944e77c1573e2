//! Receives posted ahead of their turn.
//!
//! What: a caller names the frames it will take last from one link (their
//! keys and lengths, tiling one region of its memory in order), goes on
//! with other work, then takes them one by one. A frame that arrives after
//! it was posted lands straight in its piece; one that came earlier waits
//! in the sink as usual.
//!
//! Why: in a ring's all-gather phase a peer's chunks arrive while this
//! rank is still reducing and sending. Posted only when reached, most of
//! them have arrived already and cost a second copy out of a pooled buffer
//! (about a twentieth of the CPU of a large all-reduce over TCP).
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
    /// In posting order; the storage goes back to the engine for reuse.
    posted: Vec<Posted>,
    /// Index of the next piece to take.
    next: usize,
}

/// The caller's handle on posted receives (see
/// [`FrameEngine::with_placements`]).
pub struct Placements<'s, 'r> {
    scope: &'s mut Scope<'r>,
}

impl FrameEngine {
    /// Posts a receive for each of `pieces` (a frame key and its payload
    /// length; the pieces tile `region` from its start, in order, as far
    /// as they fit), runs `body`, and returns once the kernel no longer
    /// writes to `region`: pieces `body` did not take are withdrawn (one
    /// being filled is waited for). `body` takes the pieces in posting
    /// order with [`Placements::take`], and may drive the engine for other
    /// work meanwhile.
    pub fn with_placements<R>(
        &self,
        link: usize,
        region: &mut [u8],
        pieces: &mut dyn Iterator<Item = (FrameKey, usize)>,
        sink: &dyn FrameSink,
        body: impl FnOnce(Placements<'_, '_>) -> R,
    ) -> R {
        let mut posted = std::mem::take(&mut *lock(&self.spare_posted));
        {
            let mut st = lock(&self.state);
            let mut offset = 0;
            for (key, len) in pieces {
                if len > region.len() - offset {
                    break;
                }
                let id = st.next_id;
                st.next_id += 1;
                st.queued.placements.push(PlaceRequest {
                    id,
                    link,
                    key,
                    ptr: region[offset..].as_mut_ptr(),
                    len,
                });
                posted.push(Posted {
                    id,
                    key,
                    offset,
                    len,
                });
                offset += len;
            }
            self.poke_if_driving(&st);
        }
        let mut scope = Scope {
            engine: self,
            sink,
            region,
            posted,
            next: 0,
        };
        body(Placements { scope: &mut scope })
    }
}

impl Placements<'_, '_> {
    /// Waits for the next posted piece, which must be the frame `key` of
    /// `len` bytes, and returns how it ended (as
    /// [`FrameEngine::receive_in_place`]: `Stopped` once `stop` answers,
    /// unless the frame was being received already) with the piece's
    /// memory. The piece is taken either way. Asking for any other frame
    /// fails without taking anything.
    pub fn take<S>(
        &mut self,
        key: FrameKey,
        len: usize,
        until: Instant,
        stop: &mut dyn FnMut() -> Option<S>,
    ) -> (Placement<S>, &mut [u8]) {
        let scope = &mut *self.scope;
        let Some(piece) = scope.posted.get(scope.next) else {
            return (
                Placement::Failed("no posted receive is left to take".into()),
                &mut [],
            );
        };
        if piece.key != key || piece.len != len {
            return (
                Placement::Failed(format!(
                    "the next posted receive is frame {:?} of {} bytes, not {key:?} of {len}",
                    piece.key, piece.len
                )),
                &mut [],
            );
        }
        let (id, offset) = (piece.id, piece.offset);
        scope.next += 1;
        let outcome = scope.engine.await_placement(id, until, scope.sink, stop);
        (outcome, &mut scope.region[offset..offset + len])
    }
}

impl Drop for Scope<'_> {
    fn drop(&mut self) {
        let untaken = &self.posted[self.next..];
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
        let mut posted = std::mem::take(&mut self.posted);
        posted.clear();
        let mut spare = lock(&self.engine.spare_posted);
        if spare.capacity() < posted.capacity() {
            *spare = posted;
        }
    }
}
