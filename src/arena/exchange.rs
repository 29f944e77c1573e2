//! How ranks of one communicator exchange data through their arenas: the
//! protocol every arena collective runs (`comm::arena` builds each on it).
//!
//! Op `k` of a communicator (its arena ops counted alike on every rank)
//! uses buffer `k % DEPTH` of each rank's slot. A rank *publishes* op `k`:
//! it writes what it stages (in the control line itself when it fits, else
//! in the staging area), then the op's tag, then the step word `k + 1`
//! with release ordering; a reader loads the step word with acquire
//! ordering, so what it reads after is whole. Before publishing op `k` a
//! rank waits until every member has published op `k - (DEPTH - 1)`
//! (`ringwire_shm::arena::must_see`): each did so only after reading
//! everything of the op `DEPTH` back, whose buffer op `k` overwrites. No
//! line has two writers, nothing is locked, and a broadcast's root runs up
//! to `DEPTH - 1` ops ahead of its slowest receiver.
//!
//! Waiting spins on the step words (not at all on crowded hosts), then
//! yields until the spin budget (RINGWIRE_SPIN_US) is spent, then sleeps
//! on the waited ranks' link sockets, said on its slot's sleep word: a
//! publisher rings those asleep (`ringwire_shm::arena`). All along it
//! files what the links bring (an abort arrives as a frame), and past the
//! spin budget it also checks the links' sockets (a dead peer's closes);
//! a peer's abort word makes it look at once.

use super::{Peer, Slot, abort_word};
use crate::transport::{LinkError, Transport};
use ringwire_shm::arena;
use std::cell::Cell;
use std::time::{Duration, Instant};

/// Pure spinning before a wait starts yielding (a cache line crosses
/// cores in well under a microsecond).
const PURE_SPIN: Duration = Duration::from_micros(20);
/// Spins between looks at the clock, the links and the abort words.
const SPINS: u32 = 64;
/// A sleeper looks again at least this often (a doorbell may be read by
/// another thread of this rank, which reads the link's socket too).
const NAP: Duration = Duration::from_millis(2);

/// A communicator's arena, as one rank sees it: its own slot, and every
/// member's arena and slot (by rank in the communicator; its own too).
pub(crate) struct CommArena {
    /// Held so the slot stays this communicator's; retired when it goes.
    slot: Option<Slot>,
    /// Every member (this rank too), by rank in the communicator.
    members: Vec<Peer>,
    me: usize,
    /// Arena ops this communicator ran.
    ops: u64,
}

impl Drop for CommArena {
    /// A peer may not have read this rank's last op yet: the slot waits
    /// for every peer to be done with the communicator before another
    /// takes it (`Slot::retire`).
    fn drop(&mut self) {
        let Some(slot) = self.slot.take() else { return };
        let me = self.me;
        let peers = std::mem::take(&mut self.members)
            .into_iter()
            .enumerate()
            .filter_map(|(r, p)| (r != me).then_some(p))
            .collect();
        slot.retire(peers);
    }
}

/// Why a wait ended without its data.
#[derive(Debug)]
pub(crate) enum WaitError {
    /// The deadline passed; the first rank (of the communicator) that had
    /// not published.
    Timeout(usize),
    /// A rank published another collective (its tag differs).
    Mismatch { rank: usize },
    /// The op must stop: an abort, or the link to `rank` failed.
    Link(LinkError, usize),
}

/// What a wait needs besides the arena.
pub(crate) struct Waiting<'a> {
    pub(crate) transport: &'a dyn Transport,
    pub(crate) comm_id: u64,
    /// World ranks of the communicator's members.
    pub(crate) members: &'a [usize],
    pub(crate) deadline: Instant,
    /// This host runs more ranks than cores: no pure spinning.
    pub(crate) crowded: bool,
    /// How long to poll before napping (RINGWIRE_SPIN_US).
    pub(crate) spin: Duration,
}

impl CommArena {
    /// The arena of a communicator whose rank `me` holds `slot`, with
    /// `members[r]` rank `r`'s world rank, arena, slot and the slot's epoch.
    pub(crate) fn new(slot: Slot, members: Vec<Peer>, me: usize) -> CommArena {
        CommArena {
            slot: Some(slot),
            members,
            me,
            ops: 0,
        }
    }

    /// Starts the next op, whose signature is `tag`.
    pub(crate) fn op(&mut self, tag: u64) -> ArenaOp<'_> {
        let k = self.ops;
        ArenaOp {
            arena: self,
            k,
            tag,
            staged: Cell::new(0),
            read: Cell::new(0),
        }
    }
}

/// One arena op in progress; [`ArenaOp::finish`] counts it.
pub(crate) struct ArenaOp<'a> {
    arena: &'a mut CommArena,
    k: u64,
    tag: u64,
    /// Bytes this rank staged, and read from other ranks' staging (the
    /// op's traffic, for the stats).
    staged: Cell<u64>,
    read: Cell<u64>,
}

impl ArenaOp<'_> {
    fn size(&self) -> usize {
        self.arena.members.len()
    }

    /// Every other rank, as a bit mask.
    pub(crate) fn others(&self) -> u64 {
        let all = if self.size() == 64 {
            u64::MAX
        } else {
            (1u64 << self.size()) - 1
        };
        all & !(1u64 << self.arena.me)
    }

    /// Publishes this rank's part of the op: `bytes` (at most
    /// `STAGE_BYTES`), after waiting for every member's op `DEPTH - 1` back.
    pub(crate) fn publish(&self, bytes: &[u8], w: &Waiting<'_>) -> Result<(), WaitError> {
        self.publish_except(bytes, 0..0, w)
    }

    /// [`ArenaOp::publish`], staging all of `bytes` but the range `skip`,
    /// which no member reads.
    pub(crate) fn publish_except(
        &self,
        bytes: &[u8],
        skip: std::ops::Range<usize>,
        w: &Waiting<'_>,
    ) -> Result<(), WaitError> {
        if let Some(seen) = arena::must_see(self.k) {
            self.wait_for(self.others(), seen, None, w)?;
        }
        let Peer {
            arena: own, slot, ..
        } = &self.arena.members[self.arena.me];
        let staged = bytes.len() - skip.len();
        match skip.is_empty() {
            true => arena::publish(&**own, *slot, self.k, self.tag, bytes),
            false => arena::publish_except(&**own, *slot, self.k, self.tag, bytes, skip),
        }
        self.staged.set(self.staged.get() + staged as u64);
        // Wake the members asleep on their sleep words (`arena::arm`).
        let mut left = self.others();
        while left != 0 {
            let r = left.trailing_zeros() as usize;
            left &= left - 1;
            let Peer {
                arena: mapping,
                slot,
                ..
            } = &self.arena.members[r];
            if arena::sleeping(&**mapping, *slot) {
                w.transport.arena_ring(w.members[r]);
            }
        }
        Ok(())
    }

    /// Waits until every rank in `ranks` (a bit mask) has published this op
    /// with this op's tag.
    pub(crate) fn wait(&self, ranks: u64, w: &Waiting<'_>) -> Result<(), WaitError> {
        self.wait_for(ranks, self.k, Some(self.tag), w)
    }

    /// Copies `dst.len()` bytes at `offset` of what `rank` staged for this
    /// op (`staged` bytes in all) into `dst`; once [`ArenaOp::wait`]ed for.
    pub(crate) fn read(&self, rank: usize, staged: usize, offset: usize, dst: &mut [u8]) {
        let Peer {
            arena: mapping,
            slot,
            ..
        } = &self.arena.members[rank];
        arena::read(&**mapping, *slot, self.k, staged, offset, dst);
        if rank != self.arena.me {
            self.read.set(self.read.get() + dst.len() as u64);
        }
    }

    /// Bytes staged and bytes read from other ranks so far.
    pub(crate) fn traffic(&self) -> (u64, u64) {
        (self.staged.get(), self.read.get())
    }

    /// The op is done on this rank.
    pub(crate) fn finish(self) {
        self.arena.ops += 1;
    }

    fn wait_for(
        &self,
        mut ranks: u64,
        k: u64,
        tag: Option<u64>,
        w: &Waiting<'_>,
    ) -> Result<(), WaitError> {
        let members = &self.arena.members;
        let look = |ranks: &mut u64| -> Result<(), WaitError> {
            let mut left = *ranks;
            while left != 0 {
                let r = left.trailing_zeros() as usize;
                left &= left - 1;
                let Peer {
                    arena: mapping,
                    slot,
                    ..
                } = &members[r];
                if let Some(theirs) = arena::published(&**mapping, *slot, k) {
                    if tag.is_some_and(|t| theirs != t) {
                        return Err(WaitError::Mismatch { rank: r });
                    }
                    *ranks &= !(1u64 << r);
                }
            }
            Ok(())
        };
        look(&mut ranks)?;
        if ranks == 0 {
            return Ok(());
        }
        let aborts = |ranks: u64| -> u64 {
            let mut sum = 0u64;
            let mut left = ranks;
            while left != 0 {
                let r = left.trailing_zeros() as usize;
                left &= left - 1;
                sum = sum.wrapping_add(abort_word(&members[r].arena));
            }
            sum
        };
        let aborts_at_start = aborts(ranks);
        // The clock is read from the first look at it on: most waits end
        // within the first spins, and a clock read costs as much as a look.
        let mut start = None;
        let pure_spin = if w.crowded { Duration::ZERO } else { PURE_SPIN };
        let mut spins = 0u32;
        loop {
            look(&mut ranks)?;
            if ranks == 0 {
                return Ok(());
            }
            spins += 1;
            if spins < SPINS && !w.crowded {
                std::hint::spin_loop();
                continue;
            }
            spins = 0;
            let now = Instant::now();
            let start = *start.get_or_insert(now);
            let waited = now.saturating_duration_since(start);
            let deep = waited >= w.spin || aborts(ranks) != aborts_at_start;
            self.poll(ranks, deep, w)?;
            if now >= w.deadline {
                return Err(WaitError::Timeout(ranks.trailing_zeros() as usize));
            }
            if waited < pure_spin {
                continue;
            }
            if waited < w.spin {
                // Moves to the rank's home core if it shares this one
                // with another poller (two ranks' spinners on one core
                // would take a time slice per op).
                ringwire_uring::poll_yield();
            } else {
                // Sleep on the links' doorbells, said on the sleep word
                // first and looked again after (a publish rings then).
                let Peer {
                    arena: own, slot, ..
                } = &members[self.arena.me];
                arena::arm(&**own, *slot);
                let looked = look(&mut ranks);
                if looked.is_ok() && ranks != 0 {
                    let mut peers = Vec::with_capacity(ranks.count_ones() as usize);
                    let mut left = ranks;
                    while left != 0 {
                        let r = left.trailing_zeros() as usize;
                        left &= left - 1;
                        peers.push(w.members[r]);
                    }
                    let until = w.deadline.saturating_duration_since(now).min(NAP);
                    w.transport.arena_sleep(&peers, until);
                }
                arena::disarm(&**own, *slot);
                looked?;
            }
        }
    }

    /// Hears what the links bring while waiting on `ranks`: an abort of
    /// the communicator, or a failed link to one of them.
    fn poll(&self, ranks: u64, deep: bool, w: &Waiting<'_>) -> Result<(), WaitError> {
        let first = ranks.trailing_zeros() as usize;
        w.transport
            .arena_poll(w.comm_id, deep)
            .map_err(|e| WaitError::Link(e, first))?;
        let mut left = ranks;
        while left != 0 {
            let r = left.trailing_zeros() as usize;
            left &= left - 1;
            if let Some(e) = w.transport.link_failure(w.members[r]) {
                return Err(WaitError::Link(e, r));
            }
        }
        Ok(())
    }
}
