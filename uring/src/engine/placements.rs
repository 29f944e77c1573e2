//! Receives posted ahead of their turn.
//!
//! What: a caller lends one region of its memory for a scope, posts the
//! frames it will take from one link (each frame's key and its piece of the
//! region) whenever it knows nothing it does before taking a frame touches
//! that piece, and takes them in any order. A frame that arrives after it
//! was posted lands straight in its piece; one that came earlier waits in
//! the sink as usual. Meanwhile the caller reaches the rest of the region
//! through the scope, which refuses any part an untaken piece overlaps.
//!
//! Why: in a ring's all-gather phase (and a broadcast chain) a peer's
//! chunks arrive while this rank is still reducing or forwarding earlier
//! ones. Posted only when reached, most of them have arrived already and
//! cost a second copy out of a pooled buffer (about a twentieth of the CPU
//! of a large all-reduce over TCP). With more than two ranks those receives
//! interleave with reductions into the same region, so pieces are posted one
//! by one as each becomes free, not all at the start.
//!
//! Sound without `unsafe` here: the region stays borrowed for the whole
//! scope; the caller gets `&mut` access only to parts no untaken piece
//! overlaps (checked on every access), and to a piece only once it is taken
//! and the kernel is done with it; the scope ends (on unwinding too) only
//! once every piece is taken or withdrawn and the kernel no longer writes
//! to it. The caller's body holds a handle, never the scope itself, so it
//! cannot move the scope's state out of it.

use super::{FrameEngine, FrameKey, FrameSink, MAX_TURN, PlaceRequest, Placement, lock};
use std::time::Instant;

/// One posted piece of the region.
pub(crate) struct Posted {
    id: u64,
    key: FrameKey,
    offset: usize,
    len: usize,
}

impl Posted {
    fn overlaps(&self, offset: usize, len: usize) -> bool {
        self.len > 0 && len > 0 && offset < self.offset + self.len && self.offset < offset + len
    }
}

struct Scope<'r> {
    engine: &'r FrameEngine,
    sink: &'r dyn FrameSink,
    link: usize,
    region: &'r mut [u8],
    /// The pieces posted and not yet taken. The storage goes back to the
    /// engine for reuse, so steady-state ops allocate nothing.
    posted: Vec<Posted>,
}

/// The caller's handle on posted receives (see
/// [`FrameEngine::with_placements`]).
pub struct Placements<'s, 'r> {
    scope: &'s mut Scope<'r>,
}

impl FrameEngine {
    /// Lends `region` for receives posted on `link` while `body` runs, and
    /// returns once the kernel no longer writes to it: pieces `body` did not
    /// take are withdrawn (one being filled is waited for). `body` posts
    /// pieces with [`Placements::post`], takes them with
    /// [`Placements::take`], reaches the rest of the region with
    /// [`Placements::region_mut`], and may drive the engine for other work
    /// meanwhile.
    pub fn with_placements<R>(
        &self,
        link: usize,
        region: &mut [u8],
        sink: &dyn FrameSink,
        body: impl FnOnce(Placements<'_, '_>) -> R,
    ) -> R {
        let posted = std::mem::take(&mut *lock(&self.spare_placements));
        let mut scope = Scope {
            engine: self,
            sink,
            link,
            region,
            posted,
        };
        body(Placements { scope: &mut scope })
    }
}

impl Placements<'_, '_> {
    /// Posts a receive of frame `key` into the `len` bytes at `offset`: from
    /// now on the frame lands there if it has not arrived yet. Refused (and
    /// nothing posted) if the piece leaves the region or overlaps a piece
    /// posted and not yet taken.
    pub fn post(&mut self, key: FrameKey, offset: usize, len: usize) -> Result<(), String> {
        let scope = &mut *self.scope;
        let size = scope.region.len();
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(format!(
                "a piece of {len} bytes at {offset} leaves the {size}-byte region"
            ));
        }
        if let Some(p) = scope.posted.iter().find(|p| p.overlaps(offset, len)) {
            return Err(format!(
                "the piece of {len} bytes at {offset} overlaps the untaken one of {} at {}",
                p.len, p.offset
            ));
        }
        if scope.posted.iter().any(|p| p.key == key) {
            return Err(format!("frame {key:?} is posted already"));
        }
        let mut st = lock(&scope.engine.state);
        let id = st.next_id;
        st.next_id += 1;
        st.queued.placements.push(PlaceRequest {
            id,
            link: scope.link,
            key,
            ptr: scope.region[offset..].as_mut_ptr(),
            len,
        });
        scope.engine.poke_if_driving(&st);
        drop(st);
        scope.posted.push(Posted {
            id,
            key,
            offset,
            len,
        });
        Ok(())
    }

    /// Waits for the posted frame `key`, which must have been posted as
    /// `len` bytes at `offset`, and returns how it ended (as
    /// [`FrameEngine::receive_in_place`]: `Stopped` once `stop` answers,
    /// unless the frame was being received already) with the piece's
    /// memory. The piece is taken either way. Asking for a frame not posted
    /// so fails without taking anything.
    pub fn take<S>(
        &mut self,
        key: FrameKey,
        offset: usize,
        len: usize,
        until: Instant,
        stop: &mut dyn FnMut() -> Option<S>,
    ) -> (Placement<S>, &mut [u8]) {
        let scope = &mut *self.scope;
        let Some(i) = scope.posted.iter().position(|p| p.key == key) else {
            return (
                Placement::Failed(format!("frame {key:?} was not posted")),
                &mut [],
            );
        };
        let piece = &scope.posted[i];
        if (piece.offset, piece.len) != (offset, len) {
            return (
                Placement::Failed(format!(
                    "frame {key:?} was posted as {} bytes at {}, not {len} at {offset}",
                    piece.len, piece.offset
                )),
                &mut [],
            );
        }
        let id = piece.id;
        scope.posted.swap_remove(i);
        let outcome = scope.engine.await_placement(id, until, scope.sink, stop);
        (outcome, &mut scope.region[offset..offset + len])
    }

    /// The `len` bytes at `offset`, unless they leave the region or a
    /// piece posted and not yet taken overlaps them (the kernel may be
    /// writing there).
    pub fn region_mut(&mut self, offset: usize, len: usize) -> Option<&mut [u8]> {
        let scope = &mut *self.scope;
        let end = offset
            .checked_add(len)
            .filter(|&end| end <= scope.region.len())?;
        if scope.posted.iter().any(|p| p.overlaps(offset, len)) {
            return None;
        }
        scope.region.get_mut(offset..end)
    }
}

impl Drop for Scope<'_> {
    fn drop(&mut self) {
        let untaken = &self.posted;
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
        let mut kept = lock(&self.engine.spare_placements);
        if kept.capacity() < posted.capacity() {
            *kept = posted;
        }
    }
}
