//! How far peers have run ahead of this rank (decision 0019): the bytes
//! each peer has delivered for ops this rank has not started, and whether
//! that passes the limit, at which point the link stops being read (unless
//! someone waits on it) and TCP's window holds the sender back.
//!
//! Only frames of unstarted ops count. Frames of an op this rank is in are
//! always read: counting them too would let a large all-to-all stall with
//! every rank blocked sending to a paused peer. Collective frames start
//! with their communicator's op (`seq`); point-to-point frames carry the
//! sender's count of sends to this rank and start with this rank's receive
//! of the same number from that peer.
//!
//! Sans-IO: the transport records each data frame of an op not begun here
//! with [`RunAhead::filed`] (which ops have begun it keeps in atomics beside
//! its inboxes, so a frame of a running op costs no lock), calls
//! [`RunAhead::begin`] when an op starts, and pauses a peer's link from
//! when `filed` says it is over the limit until `begin` (or `forget`) says
//! it is back under.

use std::collections::{HashMap, HashSet};

/// A frame held for an op not started yet.
#[derive(Clone, Copy, Debug)]
struct Held {
    seq: u64,
    p2p: bool,
    bytes: usize,
}

/// The run-ahead ledger of one process's transport.
#[derive(Debug)]
pub(crate) struct RunAhead {
    /// Frames of unstarted ops per (communicator, peer), in arrival order
    /// (emptied lists stay, so steady state allocates nothing).
    held: HashMap<(u64, usize), Vec<Held>>,
    counts: Counts,
    /// Most bytes held at once, over all peers.
    peak: usize,
    /// Communicators gone here (their frames are dropped, not held).
    forgotten: HashSet<u64>,
}

/// What `held` adds up to, kept apart so it can change while `held` is
/// walked.
#[derive(Debug)]
struct Counts {
    /// Bytes per peer past which its link pauses; 0 never pauses.
    limit: usize,
    /// Bytes held per peer, and over all peers.
    bytes: Vec<usize>,
    total: usize,
    /// Frames held, over all peers.
    frames: usize,
}

impl Counts {
    /// Whether `peer` has more bytes held for unstarted ops than the limit.
    fn over(&self, peer: usize) -> bool {
        self.limit > 0 && self.bytes.get(peer).is_some_and(|&b| b > self.limit)
    }

    /// `frames` frames of `bytes` bytes from `peer` stop counting; calls
    /// `resumed` if that brings the peer back under the limit.
    fn release(
        &mut self,
        peer: usize,
        bytes: usize,
        frames: usize,
        resumed: &mut impl FnMut(usize),
    ) {
        let was_over = self.over(peer);
        self.bytes[peer] -= bytes;
        self.total -= bytes;
        self.frames -= frames;
        if was_over && !self.over(peer) {
            resumed(peer);
        }
    }
}

impl RunAhead {
    pub(crate) fn new(world: usize, limit: usize) -> RunAhead {
        RunAhead {
            held: HashMap::new(),
            counts: Counts {
                limit,
                bytes: vec![0; world],
                total: 0,
                frames: 0,
            },
            peak: 0,
            forgotten: HashSet::new(),
        }
    }

    /// A data frame of op `seq` (`p2p`: a point-to-point send) from `peer`,
    /// whose op has not begun here, went into an inbox. Returns whether
    /// `peer`'s link is now over the limit.
    pub(crate) fn filed(
        &mut self,
        comm: u64,
        peer: usize,
        seq: u64,
        p2p: bool,
        bytes: usize,
    ) -> bool {
        let counts = &mut self.counts;
        if peer >= counts.bytes.len() {
            return false;
        }
        self.held
            .entry((comm, peer))
            .or_default()
            .push(Held { seq, p2p, bytes });
        counts.bytes[peer] += bytes;
        counts.total += bytes;
        counts.frames += 1;
        self.peak = self.peak.max(counts.total);
        counts.over(peer)
    }

    /// This rank starts op `seq` of communicator `comm`: a collective, or
    /// (`from` a peer) its `seq`-th point-to-point receive from that peer.
    /// Frames of that op and earlier ones no longer count; `resumed` is
    /// called with each peer whose link was over the limit and is not any
    /// more. Returns how many frames stopped counting. Allocates nothing.
    pub(crate) fn begin(
        &mut self,
        comm: u64,
        seq: u64,
        from: Option<usize>,
        mut resumed: impl FnMut(usize),
    ) -> usize {
        let before = self.counts.frames;
        if before == 0 {
            return 0;
        }
        for (&(c, peer), frames) in self.held.iter_mut() {
            if c != comm || from.is_some_and(|f| f != peer) || frames.is_empty() {
                continue;
            }
            let (mut bytes, mut count) = (0, 0);
            frames.retain(|h| {
                let starts = h.p2p == from.is_some() && h.seq <= seq;
                if starts {
                    bytes += h.bytes;
                    count += 1;
                }
                !starts
            });
            self.counts.release(peer, bytes, count, &mut resumed);
        }
        before - self.counts.frames
    }

    /// Communicator `comm` is gone here: its held frames stop counting
    /// (the caller drops them) and later ones are not to be kept
    /// ([`RunAhead::is_forgotten`]). `resumed` is called as by `begin`.
    /// Returns how many frames stopped counting.
    pub(crate) fn forget(&mut self, comm: u64, mut resumed: impl FnMut(usize)) -> usize {
        self.forgotten.insert(comm);
        let before = self.counts.frames;
        let counts = &mut self.counts;
        self.held.retain(|&(c, peer), frames| {
            if c == comm {
                let bytes = frames.iter().map(|h| h.bytes).sum();
                counts.release(peer, bytes, frames.len(), &mut resumed);
            }
            c != comm
        });
        before - self.counts.frames
    }

    pub(crate) fn is_forgotten(&self, comm: u64) -> bool {
        self.forgotten.contains(&comm)
    }

    /// Bytes held now, over all peers.
    pub(crate) fn held(&self) -> usize {
        self.counts.total
    }

    /// Bytes `peer` has delivered for ops this rank has not started.
    pub(crate) fn held_from(&self, peer: usize) -> usize {
        self.counts.bytes.get(peer).copied().unwrap_or(0)
    }

    /// Most bytes held at once, over all peers.
    pub(crate) fn peak(&self) -> usize {
        self.peak
    }

    pub(crate) fn limit(&self) -> usize {
        self.counts.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn begin(r: &mut RunAhead, comm: u64, seq: u64, from: Option<usize>) -> Vec<usize> {
        let mut resumed = Vec::new();
        r.begin(comm, seq, from, |p| resumed.push(p));
        resumed
    }

    #[test]
    fn frames_count_until_their_op_begins() {
        let mut r = RunAhead::new(3, 100);
        assert!(!r.filed(7, 1, 2, false, 80));
        assert!(r.filed(7, 1, 3, false, 80), "160 bytes ahead passes 100");
        assert_eq!(r.held_from(1), 160);
        assert!(!r.counts.over(2), "only the peer that ran ahead is over");
        assert_eq!(begin(&mut r, 7, 2, None), vec![1], "back at 80: resumed");
        assert_eq!(r.held_from(1), 80);
        assert!(begin(&mut r, 7, 3, None).is_empty(), "was not over");
        assert_eq!(r.held_from(1), 0);
        assert_eq!(r.peak(), 160);
    }

    #[test]
    fn communicators_and_point_to_point_are_counted_apart() {
        let mut r = RunAhead::new(2, 10);
        r.filed(1, 1, 5, false, 8);
        r.filed(2, 1, 1, false, 8);
        r.filed(1, 1, 1, true, 8);
        assert_eq!(r.held_from(1), 24);
        begin(&mut r, 1, 5, None);
        assert_eq!(
            r.held_from(1),
            16,
            "comm 2's op and the p2p receive still count"
        );
        begin(&mut r, 1, 1, Some(0));
        assert_eq!(
            r.held_from(1),
            16,
            "a receive from another peer frees nothing"
        );
        begin(&mut r, 1, 1, Some(1));
        assert_eq!(r.held_from(1), 8);
        begin(&mut r, 2, 1, None);
        assert_eq!(r.held_from(1), 0);
    }

    #[test]
    fn a_zero_limit_never_pauses_and_strangers_are_ignored() {
        let mut r = RunAhead::new(2, 0);
        assert!(!r.filed(1, 1, 9, false, 1 << 40));
        assert!(!r.counts.over(1));
        assert!(!r.filed(1, 5, 9, false, 10), "no such peer");
        assert_eq!(
            r.begin(1, 9, None, |_| ()),
            1,
            "only the real frame counted"
        );
        assert_eq!(r.held_from(5), 0);
    }

    #[test]
    fn a_forgotten_communicator_releases_what_it_held() {
        let mut r = RunAhead::new(3, 100);
        r.filed(1, 1, 2, false, 90);
        r.filed(1, 2, 2, false, 30);
        assert!(r.filed(4, 1, 1, true, 60), "150 bytes from rank 1");
        let mut resumed = Vec::new();
        assert_eq!(r.forget(4, |p| resumed.push(p)), 1);
        assert_eq!(resumed, vec![1], "back at 90");
        assert!(r.is_forgotten(4) && !r.is_forgotten(1));
        assert_eq!(r.held(), 120);
        assert_eq!(r.forget(1, |_| ()), 2);
        assert_eq!(r.held(), 0);
    }
}
