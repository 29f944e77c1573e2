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
    slots: Mutex<Slots>,
}

/// Which slots are taken, and which of those wait for peers to be done
/// with them.
struct Slots {
    taken: [bool; SLOTS],
    /// Slots of communicators gone here that a peer may still read: a
    /// peer reads a member's last op after that member finished it, so the
    /// slot stays as it is until every peer closed its own slot of the
    /// communicator, or gave it to another, or is gone.
    retired: Vec<Retired>,
}

struct Retired {
    index: usize,
    /// Every other member: its world rank, arena, slot and the slot's
    /// epoch in the communicator.
    peers: Vec<Peer>,
}

/// A member of a communicator as its arena is seen: its world rank, its
/// arena, and its slot and the slot's epoch there.
pub(crate) struct Peer {
    pub(crate) rank: usize,
    pub(crate) arena: Arc<Mapping>,
    pub(crate) slot: usize,
    pub(crate) epoch: u64,
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
            slots: Mutex::new(Slots {
                taken: [false; SLOTS],
                retired: Vec::new(),
            }),
        }))
    }

    /// The descriptor, to pass to a local peer.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Takes a free slot for a communicator, fresh and in a new epoch
    /// (none of its ops published yet); first frees the retired slots
    /// every peer is done with (`gone`: whether a world rank's process is
    /// gone, so it reads nothing more). `None` when all are taken.
    pub(crate) fn take_slot(self: &Arc<Self>, gone: impl Fn(usize) -> bool) -> Option<Slot> {
        let mut slots = crate::locks::lock(&self.slots);
        let Slots { taken, retired } = &mut *slots;
        retired.retain(|r| {
            let done = r.peers.iter().all(|p| {
                ringwire_shm::arena::done_with(&*p.arena, p.slot, p.epoch) || gone(p.rank)
            });
            if done {
                taken[r.index] = false;
            }
            !done
        });
        let index = taken.iter().position(|t| !t)?;
        taken[index] = true;
        let epoch = ringwire_shm::arena::open(&*self.mapping, index);
        Some(Slot {
            arena: self.clone(),
            index,
            epoch,
            retired: false,
        })
    }

    /// Says on the abort word that this process aborted a communicator.
    pub(crate) fn mark_abort(&self) {
        self.mapping
            .atomic(ABORT_WORD)
            .fetch_add(1, Ordering::AcqRel);
    }
}

/// A slot of this process's arena, freed when dropped unless retired
/// ([`Slot::retire`]).
pub(crate) struct Slot {
    arena: Arc<Arena>,
    index: usize,
    epoch: u64,
    /// Handed to the retired list, which frees it.
    retired: bool,
}

impl Slot {
    pub(crate) fn index(&self) -> usize {
        self.index
    }

    /// Its epoch: how many communicators have had it.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The communicator that ran ops in this slot is gone here: says so
    /// to its `peers` (its other members) and keeps the slot as it is
    /// until they are done reading it ([`Arena::take_slot`] frees it then).
    pub(crate) fn retire(mut self, peers: Vec<Peer>) {
        ringwire_shm::arena::close(&*self.arena.mapping, self.index);
        crate::locks::lock(&self.arena.slots).retired.push(Retired {
            index: self.index,
            peers,
        });
        self.retired = true;
    }

    pub(crate) fn mapping(&self) -> &Arc<Mapping> {
        &self.arena.mapping
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if !self.retired {
            crate::locks::lock(&self.arena.slots).taken[self.index] = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_taken_once_and_freed_when_dropped() {
        let arena = Arena::create().unwrap();
        assert!(is_arena(&arena.mapping));
        let slots: Vec<Slot> = (0..SLOTS)
            .map(|_| arena.take_slot(none_gone).unwrap())
            .collect();
        assert!(arena.take_slot(none_gone).is_none());
        let freed = slots[3].index();
        drop(slots);
        assert_eq!(arena.take_slot(none_gone).unwrap().index(), 0);
        assert!(freed < SLOTS);
        let before = abort_word(&arena.mapping);
        arena.mark_abort();
        assert_eq!(abort_word(&arena.mapping), before + 1);
    }

    /// No peer's process is gone.
    fn none_gone(_: usize) -> bool {
        false
    }

    /// Arena `ours` takes slot 0 and `theirs` slot 0 for one communicator;
    /// ours retires it.
    fn retired_pair() -> (Arc<Arena>, Arc<Arena>, Slot) {
        let (ours, theirs) = (Arena::create().unwrap(), Arena::create().unwrap());
        let mine = ours.take_slot(none_gone).unwrap();
        let peer = theirs.take_slot(none_gone).unwrap();
        let (slot, epoch) = (peer.index(), peer.epoch());
        mine.retire(vec![Peer {
            rank: 7,
            arena: theirs.mapping.clone(),
            slot,
            epoch,
        }]);
        (ours, theirs, peer)
    }

    #[test]
    fn a_retired_slot_waits_until_its_peers_are_done_with_it() {
        // The peer still has the communicator: the slot is not taken again.
        let (ours, _theirs, peer) = retired_pair();
        let all: Vec<Slot> = std::iter::from_fn(|| ours.take_slot(none_gone)).collect();
        assert_eq!(all.len(), SLOTS - 1);
        assert!(all.iter().all(|s| s.index() != 0));
        // It leaves it: now it is.
        peer.retire(Vec::new());
        drop(all.into_iter().next());
        let again = ours.take_slot(none_gone).unwrap();
        assert_eq!((again.index(), again.epoch()), (0, 2));

        // The peer gave its slot to another communicator since: done too.
        let (ours, theirs, peer) = retired_pair();
        drop(peer);
        let _other = theirs.take_slot(none_gone).unwrap();
        assert_eq!(ours.take_slot(none_gone).unwrap().index(), 0);

        // Or its process is gone.
        let (ours, _theirs, _peer) = retired_pair();
        assert_ne!(ours.take_slot(none_gone).unwrap().index(), 0);
        assert_eq!(ours.take_slot(|rank| rank == 7).unwrap().index(), 0);
    }
}
