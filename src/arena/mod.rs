//! The arena: this process's shared memory for collectives that run on
//! shared memory natively (issue 31, part 3; decision 0030).
//!
//! One sealed memfd per process (`ringwire_shm::Segment`), passed to each
//! local peer together with its shm link's rings; only this process writes
//! it (every line has one writer), peers map it and read. It holds a
//! header line (magic, abort word) and [`SLOTS`] slots, one per
//! communicator that uses the arena; a slot holds, for each parity of the
//! communicator's arena op count, a control line (step word, signature
//! tag, inline payload) and a staging area. How ops use them is
//! `exchange`'s business.

pub(crate) mod exchange;

use ringwire_shm::{Mapping, Segment};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// A cache line: the unit of one writer.
pub(crate) const LINE: usize = 64;
/// Communicators of one process that can use the arena at once; one more
/// runs its ops over the links (the vote says so, `comm::arena`).
pub(crate) const SLOTS: usize = 16;
/// Bytes one rank stages per op (each parity has its own area): ops whose
/// largest staged input is larger run over the links.
pub(crate) const STAGE_BYTES: usize = 256 << 10;
/// Payload bytes that travel in the control line itself.
pub(crate) const INLINE_BYTES: usize = LINE - 16;

const MAGIC: u64 = u64::from_le_bytes(*b"RWARENA1");
const MAGIC_WORD: usize = 0;
const ABORT_WORD: usize = 8;
const HEADER_BYTES: usize = LINE;
const SLOT_BYTES: usize = 2 * LINE + 2 * STAGE_BYTES;
/// The arena's size; a peer's is checked against it when mapped.
pub(crate) const ARENA_BYTES: usize = HEADER_BYTES + SLOTS * SLOT_BYTES;

/// Offset of the control line of `slot` for ops of `parity` (0 or 1):
/// its step word, then its tag word, then [`INLINE_BYTES`] of payload.
pub(crate) fn line(slot: usize, parity: u64) -> usize {
    HEADER_BYTES + slot * SLOT_BYTES + (parity as usize & 1) * LINE
}

/// Offset of the staging area of `slot` for ops of `parity`.
pub(crate) fn stage(slot: usize, parity: u64) -> usize {
    HEADER_BYTES + slot * SLOT_BYTES + 2 * LINE + (parity as usize & 1) * STAGE_BYTES
}

/// The abort word of an arena: it changes whenever its owner aborts a
/// communicator, so ranks waiting on the owner's lines look at once.
pub(crate) fn abort_word(arena: &Mapping) -> u64 {
    arena.atomic(ABORT_WORD).load(Ordering::Acquire)
}

/// Whether `arena` (a peer's, just mapped) is laid out as this build's.
pub(crate) fn is_arena(arena: &Mapping) -> bool {
    arena.len() == ARENA_BYTES && arena.atomic(MAGIC_WORD).load(Ordering::Acquire) == MAGIC
}

/// This process's arena and which of its slots are taken.
pub(crate) struct Arena {
    mapping: Arc<Mapping>,
    fd: OwnedFd,
    taken: Mutex<[bool; SLOTS]>,
}

impl Arena {
    /// Makes the arena (its pages committed now: a memory limit fails
    /// here, not as a fault later).
    pub(crate) fn create() -> io::Result<Arc<Arena>> {
        let mut segment = Segment::create(ARENA_BYTES)?;
        let fd = segment.take_fd().expect("a segment made here has its fd");
        let mapping = Arc::new(segment.into_mapping());
        mapping.atomic(MAGIC_WORD).store(MAGIC, Ordering::Release);
        Ok(Arc::new(Arena {
            mapping,
            fd,
            taken: Mutex::new([false; SLOTS]),
        }))
    }

    /// The descriptor, to pass to a local peer.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Takes a free slot for a communicator, its step words zeroed (none of
    /// its ops published yet); `None` when all are taken.
    pub(crate) fn take_slot(self: &Arc<Self>) -> Option<Slot> {
        let mut taken = crate::transport::lock(&self.taken);
        let index = taken.iter().position(|t| !t)?;
        taken[index] = true;
        for parity in 0..2 {
            let at = line(index, parity);
            self.mapping.atomic(at).store(0, Ordering::Release);
            self.mapping.atomic(at + 8).store(0, Ordering::Release);
        }
        Some(Slot {
            arena: self.clone(),
            index,
        })
    }

    /// Says on the abort word that this process aborted a communicator.
    pub(crate) fn mark_abort(&self) {
        self.mapping
            .atomic(ABORT_WORD)
            .fetch_add(1, Ordering::AcqRel);
    }
}

/// A slot of this process's arena, freed when dropped.
pub(crate) struct Slot {
    arena: Arc<Arena>,
    index: usize,
}

impl Slot {
    pub(crate) fn index(&self) -> usize {
        self.index
    }

    pub(crate) fn mapping(&self) -> &Arc<Mapping> {
        &self.arena.mapping
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        crate::transport::lock(&self.arena.taken)[self.index] = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_taken_once_freed_when_dropped_and_lines_do_not_overlap_stages() {
        let arena = Arena::create().unwrap();
        assert!(is_arena(&arena.mapping));
        let slots: Vec<Slot> = (0..SLOTS).map(|_| arena.take_slot().unwrap()).collect();
        assert!(arena.take_slot().is_none());
        let freed = slots[3].index();
        drop(slots);
        assert_eq!(arena.take_slot().unwrap().index(), 0);
        assert!(freed < SLOTS);
        for s in 0..SLOTS {
            assert!(line(s, 1) + LINE <= stage(s, 0));
            assert!(stage(s, 0) + STAGE_BYTES <= stage(s, 1));
            assert!(stage(s, 1) + STAGE_BYTES <= ARENA_BYTES);
            if s + 1 < SLOTS {
                assert_eq!(stage(s, 1) + STAGE_BYTES, line(s + 1, 0));
            }
        }
        let before = abort_word(&arena.mapping);
        arena.mark_abort();
        assert_eq!(abort_word(&arena.mapping), before + 1);
    }
}
