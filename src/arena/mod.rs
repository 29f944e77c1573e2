//! The arena: this process's shared memory for collectives that run on
//! shared memory natively (issue 31, part 3; decision 0030).
//!
//! One sealed memfd per process (`ringwire_shm::Segment`), passed to each
//! local peer together with its shm link's rings; only this process writes
//! it (every line has one writer), peers map it and read. Its layout and
//! the publish protocol (model-checked) are `ringwire_shm::arena`'s; the
//! slots and the abort word are here, how ops wait is `exchange`'s.

pub(crate) mod exchange;

use ringwire_shm::arena::{ABORT_WORD, ARENA_BYTES, MAGIC, MAGIC_WORD, SLOTS};
use ringwire_shm::{Mapping, Segment};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

pub(crate) use ringwire_shm::arena::STAGE_BYTES;

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
        let mut taken = crate::locks::lock(&self.taken);
        let index = taken.iter().position(|t| !t)?;
        taken[index] = true;
        ringwire_shm::arena::reset(&*self.mapping, index);
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
        crate::locks::lock(&self.arena.taken)[self.index] = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_taken_once_and_freed_when_dropped() {
        let arena = Arena::create().unwrap();
        assert!(is_arena(&arena.mapping));
        let slots: Vec<Slot> = (0..SLOTS).map(|_| arena.take_slot().unwrap()).collect();
        assert!(arena.take_slot().is_none());
        let freed = slots[3].index();
        drop(slots);
        assert_eq!(arena.take_slot().unwrap().index(), 0);
        assert!(freed < SLOTS);
        let before = abort_word(&arena.mapping);
        arena.mark_abort();
        assert_eq!(abort_word(&arena.mapping), before + 1);
    }
}
