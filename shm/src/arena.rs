//! The arena's layout and its publish protocol: how ranks of one
//! communicator hand each other small payloads through shared memory
//! (ringwire's collectives native to it; its decision 0030). The policy
//! around it (how long to spin, what else to look at while waiting) is
//! ringwire's; the counters are here, generic over the memory, so that the
//! protocol is model-checked with loom as the rings are.
//!
//! Each process owns one arena and is its only writer: a header line
//! (magic, abort word), then [`SLOTS`] slots, one per communicator using
//! it. A slot has [`DEPTH`] buffers, each a control line (step word, tag
//! word, [`INLINE_BYTES`] of payload) and a staging area of
//! [`STAGE_BYTES`], and a sleep word on a line of its own.
//!
//! Op `k` uses buffer `k % DEPTH`. Its owner *publishes* it: the payload
//! (in the line when it fits, else in the staging area), then the op's
//! tag, then the step word `k + 1` with release ordering. A reader that
//! loads the step word with acquire ordering and finds `k + 1` (or more)
//! reads the payload whole. The rule that makes [`DEPTH`] buffers enough:
//! **publish op `k` only after every peer has published op
//! `k - (DEPTH - 1)`** ([`must_see`]): each peer publishes an op only after
//! reading everything of the op before it, so it has read op `k - DEPTH`,
//! whose buffer op `k` overwrites. A rank that waits for no one's current
//! op (a broadcast's root) runs at most `DEPTH - 1` ops ahead.
//! A peer that breaks the rule can garble data, not this process's memory.
//!
//! A rank that stops spinning says so on its slot's sleep word, fences,
//! and looks again before it sleeps; a publisher fences after its step
//! word and rings every peer whose sleep word is set (ringwire rings on
//! the link's socket). With a full fence on both sides one of them sees
//! the other: nobody sleeps through a publish (Dekker, as the rings).

#[cfg(loom)]
use loom::sync::atomic::{Ordering, fence};
#[cfg(not(loom))]
use std::sync::atomic::{Ordering, fence};

/// A cache line: the unit of one writer.
pub const LINE: usize = 64;
/// Communicators of one process that can use the arena at once.
pub const SLOTS: usize = 16;
/// Bytes one rank stages per op, in each buffer: small ops stage up to
/// 8 KiB, the chunked all-reduce a chunk of this size per op (64 KiB was
/// 1.06-2.25x faster than 16 KiB chunks on a 16-core host, docs/perf.md),
/// so 16 slots cost about 4 MiB per process.
pub const STAGE_BYTES: usize = 64 << 10;
/// Buffers per slot: a rank runs at most `DEPTH - 1` ops ahead of its
/// slowest peer.
pub const DEPTH: u64 = 4;
const DEPTH_USIZE: usize = DEPTH as usize;
/// Payload bytes that travel in the control line itself.
pub const INLINE_BYTES: usize = LINE - 16;

/// The header's words: a magic (the layout's version) and the abort word.
pub const MAGIC_WORD: usize = 0;
/// See [`MAGIC_WORD`]: non-zero once any member gave up on the arena.
pub const ABORT_WORD: usize = 8;
/// What [`MAGIC_WORD`] holds in an arena of this layout.
pub const MAGIC: u64 = u64::from_le_bytes(*b"RWARENA2");

const HEADER_BYTES: usize = LINE;
const SLOT_BYTES: usize = (DEPTH_USIZE + 1) * LINE + DEPTH_USIZE * STAGE_BYTES;
/// An arena's size.
pub const ARENA_BYTES: usize = HEADER_BYTES + SLOTS * SLOT_BYTES;

/// Offset of the control line of `slot` for op `k`: its step word, then
/// its tag word, then [`INLINE_BYTES`] of payload.
pub fn line(slot: usize, k: u64) -> usize {
    HEADER_BYTES + slot * SLOT_BYTES + (k % DEPTH) as usize * LINE
}

/// Offset of the sleep word of `slot` (on a line of its own): non-zero
/// while its owner sleeps until a peer publishes.
pub fn sleep_word(slot: usize) -> usize {
    HEADER_BYTES + slot * SLOT_BYTES + DEPTH_USIZE * LINE
}

/// Offset of the epoch word of `slot` (on the sleep word's line): how many
/// times a communicator took the slot ([`open`]).
fn epoch_word(slot: usize) -> usize {
    sleep_word(slot) + 8
}

/// Offset of the closed word of `slot`: the last epoch whose communicator
/// its owner closed ([`close`]).
fn closed_word(slot: usize) -> usize {
    sleep_word(slot) + 16
}

/// Offset of the staging area of `slot` for op `k`.
pub fn stage(slot: usize, k: u64) -> usize {
    sleep_word(slot) + LINE + (k % DEPTH) as usize * STAGE_BYTES
}

/// The op every peer must have published before op `k` may be (the rule
/// above); `None` for the first ops.
pub fn must_see(k: u64) -> Option<u64> {
    k.checked_sub(DEPTH - 1)
}

/// One process's arena as another (or the owner) sees it.
pub trait ArenaMemory {
    /// The 8-byte word at `off` (a step, tag, magic or abort word).
    fn load(&self, off: usize, order: Ordering) -> u64;
    /// Stores the 8-byte word at `off`.
    fn store(&self, off: usize, value: u64, order: Ordering);
    /// Copies into the arena at `at`.
    fn write(&self, at: usize, src: &[u8]);
    /// Copies out of the arena at `at`.
    fn read(&self, at: usize, dst: &mut [u8]);
}

/// Where the payload of op `k` of `slot` is, for a payload of `staged`
/// bytes.
fn payload_at(slot: usize, k: u64, staged: usize) -> usize {
    match staged <= INLINE_BYTES {
        true => line(slot, k) + 16,
        false => stage(slot, k),
    }
}

/// Makes `slot` fresh in its owner's arena: no op published, nobody
/// asleep.
pub fn reset<M: ArenaMemory>(own: &M, slot: usize) {
    for k in 0..DEPTH {
        own.store(line(slot, k), 0, Ordering::Release);
        own.store(line(slot, k) + 8, 0, Ordering::Release);
    }
    own.store(sleep_word(slot), 0, Ordering::Release);
}

/// Gives `slot` to a new communicator: fresh ([`reset`]), in a new epoch,
/// which it returns (members tell each other their slot's epoch).
pub fn open<M: ArenaMemory>(own: &M, slot: usize) -> u64 {
    reset(own, slot);
    let epoch = own.load(epoch_word(slot), Ordering::Relaxed) + 1;
    own.store(epoch_word(slot), epoch, Ordering::Release);
    epoch
}

/// The owner's communicator of `slot`'s epoch is gone: it reads nothing
/// more of its peers' slots of that communicator. A peer waits for this
/// ([`done_with`]) before it gives its own slot to another communicator,
/// since until then the owner may still read that slot's last op.
pub fn close<M: ArenaMemory>(own: &M, slot: usize) {
    let epoch = own.load(epoch_word(slot), Ordering::Relaxed);
    // Release: every read of the peers' slots comes before.
    own.store(closed_word(slot), epoch, Ordering::Release);
}

/// Whether the owner of `arena`'s `slot` is done with epoch `epoch`: it
/// closed it, or gave the slot to another communicator since.
pub fn done_with<M: ArenaMemory>(arena: &M, slot: usize, epoch: u64) -> bool {
    arena.load(closed_word(slot), Ordering::Acquire) == epoch
        || arena.load(epoch_word(slot), Ordering::Acquire) != epoch
}

/// The owner of `slot` is about to sleep: it must look again after this
/// (a publish it missed has seen the word, and rings).
pub fn arm<M: ArenaMemory>(own: &M, slot: usize) {
    own.store(sleep_word(slot), 1, Ordering::Relaxed);
    fence(Ordering::SeqCst);
}

/// The owner of `slot` is awake again.
pub fn disarm<M: ArenaMemory>(own: &M, slot: usize) {
    own.store(sleep_word(slot), 0, Ordering::Relaxed);
}

/// Whether the owner of `arena`'s `slot` sleeps (read by a publisher
/// after [`publish`], which fences): ring it.
pub fn sleeping<M: ArenaMemory>(arena: &M, slot: usize) -> bool {
    arena.load(sleep_word(slot), Ordering::Relaxed) != 0
}

/// Publishes op `k` of `slot` in the owner's arena `own`: `bytes` (at most
/// [`STAGE_BYTES`]) staged, then `tag`, then the step word. The caller has
/// seen every peer publish op [`must_see`]`(k)` (see the module docs).
pub fn publish<M: ArenaMemory>(own: &M, slot: usize, k: u64, tag: u64, bytes: &[u8]) {
    assert!(
        bytes.len() <= STAGE_BYTES,
        "staged more than the arena holds"
    );
    own.write(payload_at(slot, k, bytes.len()), bytes);
    let at = line(slot, k);
    own.store(at + 8, tag, Ordering::Relaxed);
    own.store(at, k + 1, Ordering::Release);
    // Before the caller reads its peers' sleep words (see `arm`).
    fence(Ordering::SeqCst);
}

/// [`publish`], staging all of `bytes` but the range `skip` (bytes no
/// reader reads: a chunked all-reduce's own share). Readers address what
/// was staged as if all of `bytes` were.
pub fn publish_except<M: ArenaMemory>(
    own: &M,
    slot: usize,
    k: u64,
    tag: u64,
    bytes: &[u8],
    skip: std::ops::Range<usize>,
) {
    assert!(
        bytes.len() <= STAGE_BYTES && skip.start <= skip.end && skip.end <= bytes.len(),
        "staged more than the arena holds"
    );
    let at = payload_at(slot, k, bytes.len());
    own.write(at, &bytes[..skip.start]);
    own.write(at + skip.end, &bytes[skip.end..]);
    let at = line(slot, k);
    own.store(at + 8, tag, Ordering::Relaxed);
    own.store(at, k + 1, Ordering::Release);
    fence(Ordering::SeqCst);
}

/// The tag of op `k` of `slot` if `arena`'s owner has published it (then
/// what it staged may be read).
pub fn published<M: ArenaMemory>(arena: &M, slot: usize, k: u64) -> Option<u64> {
    let at = line(slot, k);
    (arena.load(at, Ordering::Acquire) > k).then(|| arena.load(at + 8, Ordering::Relaxed))
}

/// Copies `dst.len()` bytes at `offset` of what op `k` of `slot` staged
/// (`staged` bytes in all), once [`published`].
pub fn read<M: ArenaMemory>(
    arena: &M,
    slot: usize,
    k: u64,
    staged: usize,
    offset: usize,
    dst: &mut [u8],
) {
    arena.read(payload_at(slot, k, staged) + offset, dst);
}

#[cfg(not(loom))]
impl ArenaMemory for crate::Mapping {
    fn load(&self, off: usize, order: Ordering) -> u64 {
        self.atomic(off).load(order)
    }
    fn store(&self, off: usize, value: u64, order: Ordering) {
        self.atomic(off).store(value, order);
    }
    fn write(&self, at: usize, src: &[u8]) {
        crate::Mapping::write(self, at, src);
    }
    fn read(&self, at: usize, dst: &mut [u8]) {
        crate::Mapping::read(self, at, dst);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn lines_and_stages_of_every_slot_are_apart_and_inside_the_arena() {
        let last = DEPTH - 1;
        for s in 0..SLOTS {
            for k in 0..last {
                assert_eq!(line(s, k) + LINE, line(s, k + 1));
                assert_eq!(stage(s, k) + STAGE_BYTES, stage(s, k + 1));
            }
            assert_eq!(line(s, last) + LINE, sleep_word(s));
            assert_eq!(sleep_word(s) + LINE, stage(s, 0));
            assert!(stage(s, last) + STAGE_BYTES <= ARENA_BYTES);
            if s + 1 < SLOTS {
                assert_eq!(stage(s, last) + STAGE_BYTES, line(s + 1, 0));
            }
            assert_eq!(line(s, DEPTH), line(s, 0));
        }
        assert_eq!(line(0, 0), LINE);
        assert_eq!(must_see(DEPTH - 2), None);
        assert_eq!(must_see(DEPTH - 1), Some(0));
    }
}

/// The protocol under loom: `RUSTFLAGS="--cfg loom" cargo test -p
/// ringwire-shm --release arena::loom_model`.
#[cfg(all(test, loom))]
mod loom_model {
    use super::*;
    use crate::loom_bell::Bell;
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;
    use loom::sync::atomic::AtomicU64;

    /// Slot 0 of an arena as loom sees it: the step and tag words of both
    /// parities, and the payload bytes as cells (the first 64 of each
    /// staging area), so that reading a byte its owner is writing is a race
    /// loom reports.
    struct Mem {
        words: [AtomicU64; 2 * DEPTH_USIZE + 1],
        inline: Vec<UnsafeCell<u8>>,
        staged: Vec<UnsafeCell<u8>>,
    }

    impl Mem {
        fn new() -> Arc<Mem> {
            Arc::new(Mem {
                words: std::array::from_fn(|_| AtomicU64::new(0)),
                inline: (0..DEPTH_USIZE * INLINE_BYTES)
                    .map(|_| UnsafeCell::new(0))
                    .collect(),
                staged: (0..DEPTH_USIZE * LINE)
                    .map(|_| UnsafeCell::new(0))
                    .collect(),
            })
        }

        fn word(&self, off: usize) -> &AtomicU64 {
            if off == sleep_word(0) {
                return &self.words[2 * DEPTH_USIZE];
            }
            let buffer = (off - line(0, 0)) / LINE;
            let tag = usize::from(off % LINE == 8);
            &self.words[2 * buffer + tag]
        }

        fn cell(&self, off: usize) -> &UnsafeCell<u8> {
            for k in 0..DEPTH {
                let (l, s) = (line(0, k) + 16, stage(0, k));
                if (l..l + INLINE_BYTES).contains(&off) {
                    return &self.inline[k as usize * INLINE_BYTES + off - l];
                }
                if (s..s + LINE).contains(&off) {
                    return &self.staged[k as usize * LINE + off - s];
                }
            }
            unreachable!("the model holds slot 0's payloads only")
        }
    }

    impl ArenaMemory for Arc<Mem> {
        fn load(&self, off: usize, order: Ordering) -> u64 {
            self.word(off).load(order)
        }
        fn store(&self, off: usize, value: u64, order: Ordering) {
            self.word(off).store(value, order)
        }
        #[allow(unsafe_code)]
        fn write(&self, at: usize, src: &[u8]) {
            for (i, &b) in src.iter().enumerate() {
                // SAFETY: loom checks, in every interleaving, that no other
                // access to this byte runs at the same time (the property
                // under test); the pointer is its cell's, valid here.
                self.cell(at + i).with_mut(|p| unsafe { *p = b });
            }
        }
        #[allow(unsafe_code)]
        fn read(&self, at: usize, dst: &mut [u8]) {
            for (i, d) in dst.iter_mut().enumerate() {
                // SAFETY: as for `write`.
                *d = self.cell(at + i).with(|p| unsafe { *p });
            }
        }
    }

    /// What rank `r` stages for op `k`: alternately inline and in the
    /// staging area.
    fn payload(k: u64, r: u8) -> Vec<u8> {
        let len = if k % 2 == 0 { 2 } else { INLINE_BYTES + 1 };
        vec![(k as u8) * 16 + r; len]
    }

    /// Two ranks run three ops, each reading the other's payload: no byte
    /// is read before it is published or overwritten before it is read
    /// (loom reports such a race), and every payload arrives whole.
    #[test]
    fn payloads_are_never_read_early_nor_overwritten_before_read() {
        loom::model(|| {
            let arenas = [Mem::new(), Mem::new()];
            let rank = |me: u8, arenas: [Arc<Mem>; 2]| {
                let (own, peer) = (&arenas[me as usize], &arenas[1 - me as usize]);
                for k in 0..3u64 {
                    if let Some(seen) = must_see(k) {
                        while published(peer, 0, seen).is_none() {
                            loom::thread::yield_now();
                        }
                    }
                    publish(own, 0, k, 100 + k, &payload(k, me));
                    let tag = loop {
                        match published(peer, 0, k) {
                            Some(tag) => break tag,
                            None => loom::thread::yield_now(),
                        }
                    };
                    assert_eq!(tag, 100 + k);
                    let want = payload(k, 1 - me);
                    let mut got = vec![0u8; want.len()];
                    read(peer, 0, k, want.len(), 0, &mut got);
                    assert_eq!(got, want);
                }
            };
            let other = arenas.clone();
            let one = loom::thread::spawn(move || rank(1, other));
            rank(0, arenas);
            one.join().unwrap();
        });
    }

    /// A rank that sleeps until its peer publishes (sleep word, look
    /// again, sleep) is always rung: loom reports a deadlock if it can
    /// sleep through the publish.
    #[test]
    fn a_sleeper_is_always_rung() {
        loom::model(|| {
            let (waiter, publisher) = (Mem::new(), Mem::new());
            let bell = Arc::new(Bell::default());
            let (w2, p2, bell2) = (waiter.clone(), publisher.clone(), bell.clone());
            let other = loom::thread::spawn(move || {
                publish(&p2, 0, 0, 1, &[5]);
                if sleeping(&w2, 0) {
                    bell2.ring();
                }
            });
            loop {
                if published(&publisher, 0, 0).is_some() {
                    break;
                }
                arm(&waiter, 0);
                if published(&publisher, 0, 0).is_none() {
                    bell.sleep();
                }
                disarm(&waiter, 0);
            }
            other.join().unwrap();
        });
    }

    /// A broadcast's root waits for no one's current op, only for every
    /// peer's op `DEPTH - 1` back (the rule): running ahead it still never
    /// overwrites a payload its peer is reading. (Without the rule loom
    /// finds the race: all ranks reading each other's ops, as above, imply
    /// it.) One op more than the buffers, so the root wraps around.
    #[test]
    fn a_root_that_waits_for_no_ones_current_op_never_overwrites_a_payload_being_read() {
        const OPS: u64 = DEPTH + 1;
        loom::model(|| {
            let (root, leaf) = (Mem::new(), Mem::new());
            let (root2, leaf2) = (root.clone(), leaf.clone());
            let root_thread = loom::thread::spawn(move || {
                for k in 0..OPS {
                    if let Some(seen) = must_see(k) {
                        while published(&leaf2, 0, seen).is_none() {
                            loom::thread::yield_now();
                        }
                    }
                    publish(&root2, 0, k, 7, &payload(k, 0));
                }
            });
            for k in 0..OPS {
                if let Some(seen) = must_see(k) {
                    while published(&root, 0, seen).is_none() {
                        loom::thread::yield_now();
                    }
                }
                publish(&leaf, 0, k, 7, &[]);
                while published(&root, 0, k).is_none() {
                    loom::thread::yield_now();
                }
                let want = payload(k, 0);
                let mut got = vec![0u8; want.len()];
                read(&root, 0, k, want.len(), 0, &mut got);
                assert_eq!(got, want);
            }
            root_thread.join().unwrap();
        });
    }
}
