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
//! [`RunAhead::begin`] when an op starts, and pauses reading by what
//! [`RunAhead::over`] says.

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
    /// Bytes per peer past which its link pauses; 0 never pauses.
    limit: usize,
    /// Frames of unstarted ops per (communicator, peer), in arrival order
    /// (emptied lists stay, so steady state allocates nothing).
    held: HashMap<(u64, usize), Vec<Held>>,
    /// Their bytes per peer.
    bytes: Vec<usize>,
    /// How many frames are held, over all peers.
    frames: usize,
    /// Most bytes held at once, over all peers.
    peak: usize,
    /// Communicators gone here (their frames are dropped, not held).
    forgotten: HashSet<u64>,
}

impl RunAhead {
    pub(crate) fn new(world: usize, limit: usize) -> RunAhead {
        RunAhead {
            limit,
            held: HashMap::new(),
            bytes: vec![0; world],
            frames: 0,
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
        if peer >= self.bytes.len() {
            return false;
        }
        self.held
            .entry((comm, peer))
            .or_default()
            .push(Held { seq, p2p, bytes });
        self.bytes[peer] += bytes;
        self.frames += 1;
        let total: usize = self.bytes.iter().sum();
        self.peak = self.peak.max(total);
        self.over(peer)
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
        if self.frames == 0 {
            return 0;
        }
        let (limit, mut released) = (self.limit, 0);
        for (&(c, peer), frames) in self.held.iter_mut() {
            if c != comm || from.is_some_and(|f| f != peer) || frames.is_empty() {
                continue;
            }
            let before = self.bytes[peer];
            let (mut freed, mut count) = (0, 0);
            frames.retain(|h| {
                let starts = h.p2p == from.is_some() && h.seq <= seq;
                if starts {
                    freed += h.bytes;
                    count += 1;
                }
                !starts
            });
            self.frames -= count;
            released += count;
            self.bytes[peer] -= freed;
            let over = |b: usize| limit > 0 && b > limit;
            if over(before) && !over(self.bytes[peer]) {
                resumed(peer);
            }
        }
        released
    }

    /// Communicator `comm` is gone here: its held frames stop counting
    /// (the caller drops them) and later ones are not to be kept
    /// ([`RunAhead::is_forgotten`]). `resumed` is called as by `begin`.
    /// Returns how many frames stopped counting.
    pub(crate) fn forget(&mut self, comm: u64, mut resumed: impl FnMut(usize)) -> usize {
        self.forgotten.insert(comm);
        let limit = self.limit;
        let over = |b: usize| limit > 0 && b > limit;
        let mut released = 0;
        let keys: Vec<(u64, usize)> = self.held.keys().filter(|k| k.0 == comm).copied().collect();
        for key in keys {
            let Some(frames) = self.held.remove(&key) else {
                continue;
            };
            let peer = key.1;
            let before = self.bytes[peer];
            self.bytes[peer] -= frames.iter().map(|h| h.bytes).sum::<usize>();
            self.frames -= frames.len();
            released += frames.len();
            if over(before) && !over(self.bytes[peer]) {
                resumed(peer);
            }
        }
        released
    }

    pub(crate) fn is_forgotten(&self, comm: u64) -> bool {
        self.forgotten.contains(&comm)
    }

    /// Bytes held now, over all peers.
    pub(crate) fn held(&self) -> usize {
        self.bytes.iter().sum()
    }

    /// Whether `peer` has more bytes held for unstarted ops than the limit.
    pub(crate) fn over(&self, peer: usize) -> bool {
        self.limit > 0 && self.bytes.get(peer).is_some_and(|&b| b > self.limit)
    }

    /// Bytes `peer` has delivered for ops this rank has not started.
    pub(crate) fn held_from(&self, peer: usize) -> usize {
        self.bytes.get(peer).copied().unwrap_or(0)
    }

    /// Most bytes held at once, over all peers.
    pub(crate) fn peak(&self) -> usize {
        self.peak
    }

    pub(crate) fn limit(&self) -> usize {
        self.limit
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
        assert!(!r.over(2), "only the peer that ran ahead is over");
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
        assert!(!r.over(1));
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
