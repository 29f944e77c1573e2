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
//! Two limits: one per peer, and one over all peers (so a rank that many
//! peers run ahead of, a slow root of a wide communicator, holds at most
//! that much, not the per-peer limit times the peers). While the total is
//! over its limit, every peer that has anything held is paused; peers with
//! nothing held (not ahead) are read as ever.
//!
//! Sans-IO: the transport records each data frame of an op not begun here
//! with [`RunAhead::filed`] (which ops have begun it keeps in atomics beside
//! its inboxes, so a frame of a running op costs no lock), calls
//! [`RunAhead::begin`] when an op starts, and pauses a peer's link from
//! when `filed` says it is over a limit until `begin` (or `forget`) says
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
    /// Communicators gone here (their frames are dropped, not held), in
    /// two generations of at most [`FORGOTTEN_GENERATION`]: an id stays
    /// known for at least that many later forgets, long past any frame of
    /// it still on its way, and a program that agrees every step (an
    /// agreement is a communicator) keeps a bounded set.
    forgotten: [HashSet<u64>; 2],
}

/// How many forgotten communicators a generation holds.
const FORGOTTEN_GENERATION: usize = 1024;

/// What `held` adds up to, kept apart so it can change while `held` is
/// walked.
#[derive(Debug)]
struct Counts {
    /// Bytes per peer past which its link pauses; 0 never pauses.
    limit: usize,
    /// Bytes over all peers past which every peer holding any pauses; 0
    /// for no such limit (nor is there one when `limit` is 0).
    total_limit: usize,
    /// Bytes held per peer, and over all peers.
    bytes: Vec<usize>,
    total: usize,
    /// Frames held, over all peers.
    frames: usize,
}

impl Counts {
    /// Whether the bytes held over all peers pass the total limit.
    fn total_over(&self) -> bool {
        self.limit > 0 && self.total_limit > 0 && self.total > self.total_limit
    }

    /// Whether `peer`'s link pauses: it has more bytes held for unstarted
    /// ops than the per-peer limit, or some while the total is over.
    fn over(&self, peer: usize) -> bool {
        self.over_given(peer, self.total_over())
    }

    fn over_given(&self, peer: usize, total_over: bool) -> bool {
        let held = self.bytes.get(peer).copied().unwrap_or(0);
        self.limit > 0 && held > 0 && (held > self.limit || total_over)
    }

    /// Calls `changed` with every peer other than `peer` whose pause the
    /// total limit changed (the total crossed it, from `was_total_over`):
    /// their own bytes did not move.
    fn others_crossed(&self, peer: usize, was_total_over: bool, changed: &mut impl FnMut(usize)) {
        let now = self.total_over();
        if now == was_total_over {
            return;
        }
        for p in (0..self.bytes.len()).filter(|&p| p != peer) {
            if self.over_given(p, was_total_over) != self.over_given(p, now) {
                changed(p);
            }
        }
    }

    /// `frames` frames of `bytes` bytes from `peer` stop counting; calls
    /// `resumed` with each peer that brings back under the limits.
    fn release(
        &mut self,
        peer: usize,
        bytes: usize,
        frames: usize,
        resumed: &mut impl FnMut(usize),
    ) {
        let (was_over, was_total_over) = (self.over(peer), self.total_over());
        self.bytes[peer] -= bytes;
        self.total -= bytes;
        self.frames -= frames;
        if was_over && !self.over(peer) {
            resumed(peer);
        }
        self.others_crossed(peer, was_total_over, resumed);
    }
}

impl RunAhead {
    pub(crate) fn new(world: usize, limit: usize, total_limit: usize) -> RunAhead {
        RunAhead {
            held: HashMap::new(),
            counts: Counts {
                limit,
                total_limit,
                bytes: vec![0; world],
                total: 0,
                frames: 0,
            },
            peak: 0,
            forgotten: [HashSet::new(), HashSet::new()],
        }
    }

    /// A data frame of op `seq` (`p2p`: a point-to-point send) from `peer`,
    /// whose op has not begun here, went into an inbox. Calls `paused` with
    /// each peer that is now over a limit and was not before (`peer`, or,
    /// when this frame takes the total over its limit, every peer holding
    /// any).
    pub(crate) fn filed(
        &mut self,
        comm: u64,
        peer: usize,
        seq: u64,
        p2p: bool,
        bytes: usize,
        mut paused: impl FnMut(usize),
    ) {
        let counts = &mut self.counts;
        if peer >= counts.bytes.len() {
            return;
        }
        self.held
            .entry((comm, peer))
            .or_default()
            .push(Held { seq, p2p, bytes });
        let (was_over, was_total_over) = (counts.over(peer), counts.total_over());
        counts.bytes[peer] += bytes;
        counts.total += bytes;
        counts.frames += 1;
        self.peak = self.peak.max(counts.total);
        if !was_over && counts.over(peer) {
            paused(peer);
        }
        counts.others_crossed(peer, was_total_over, &mut paused);
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
    pub(crate) fn forget(&mut self, comm: u64, resumed: impl FnMut(usize)) -> usize {
        if self.forgotten[0].len() >= FORGOTTEN_GENERATION {
            self.forgotten[1] = std::mem::take(&mut self.forgotten[0]);
        }
        self.forgotten[0].insert(comm);
        self.release_where(|c, _| c == comm, resumed)
    }

    /// `peer`'s link failed: what it delivered stops counting (its ops
    /// fail here; held, it would keep the total over its limit and pause
    /// the other peers). `resumed` is called as by `begin`. Returns how
    /// many frames stopped counting.
    pub(crate) fn drop_peer(&mut self, peer: usize, resumed: impl FnMut(usize)) -> usize {
        self.release_where(|_, p| p == peer, resumed)
    }

    /// Stops counting every held frame of the (communicator, peer) pairs
    /// `which` picks; returns how many.
    fn release_where(
        &mut self,
        which: impl Fn(u64, usize) -> bool,
        mut resumed: impl FnMut(usize),
    ) -> usize {
        let before = self.counts.frames;
        let counts = &mut self.counts;
        self.held.retain(|&(comm, peer), frames| {
            let release = which(comm, peer);
            if release {
                let bytes = frames.iter().map(|h| h.bytes).sum();
                counts.release(peer, bytes, frames.len(), &mut resumed);
            }
            !release
        });
        before - self.counts.frames
    }

    pub(crate) fn is_forgotten(&self, comm: u64) -> bool {
        self.forgotten.iter().any(|gone| gone.contains(&comm))
    }

    /// Bytes held now, over all peers.
    pub(crate) fn held(&self) -> usize {
        self.counts.total
    }

    /// Bytes `peer` has delivered for ops this rank has not started.
    #[cfg(test)]
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

    pub(crate) fn total_limit(&self) -> usize {
        self.counts.total_limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Files a frame; the peers it paused.
    fn file(
        r: &mut RunAhead,
        comm: u64,
        peer: usize,
        seq: u64,
        p2p: bool,
        bytes: usize,
    ) -> Vec<usize> {
        let mut paused = Vec::new();
        r.filed(comm, peer, seq, p2p, bytes, |p| paused.push(p));
        paused
    }

    fn begin(r: &mut RunAhead, comm: u64, seq: u64, from: Option<usize>) -> Vec<usize> {
        let mut resumed = Vec::new();
        r.begin(comm, seq, from, |p| resumed.push(p));
        resumed
    }

    #[test]
    fn frames_count_until_their_op_begins() {
        let mut r = RunAhead::new(3, 100, 0);
        assert!(file(&mut r, 7, 1, 2, false, 80).is_empty());
        assert_eq!(
            file(&mut r, 7, 1, 3, false, 80),
            vec![1],
            "160 bytes ahead passes 100"
        );
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
        let mut r = RunAhead::new(2, 10, 0);
        file(&mut r, 1, 1, 5, false, 8);
        file(&mut r, 2, 1, 1, false, 8);
        file(&mut r, 1, 1, 1, true, 8);
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
        let mut r = RunAhead::new(2, 0, 0);
        assert!(file(&mut r, 1, 1, 9, false, 1 << 40).is_empty());
        assert!(!r.counts.over(1));
        assert!(file(&mut r, 1, 5, 9, false, 10).is_empty(), "no such peer");
        assert_eq!(
            r.begin(1, 9, None, |_| ()),
            1,
            "only the real frame counted"
        );
        assert_eq!(r.held_from(5), 0);
    }

    #[test]
    fn a_failed_peer_stops_counting_and_resumes_the_others() {
        // Total limit 100: peers 1 and 2 together pass it and both pause.
        let mut r = RunAhead::new(3, 1000, 100);
        file(&mut r, 1, 1, 1, false, 60);
        let mut paused = file(&mut r, 1, 2, 1, false, 60);
        paused.sort();
        assert_eq!(paused, vec![1, 2]);
        let mut resumed = Vec::new();
        assert_eq!(r.drop_peer(1, |p| resumed.push(p)), 1);
        resumed.sort();
        assert_eq!(resumed, vec![1, 2], "both are under the total again");
        assert_eq!((r.held(), r.held_from(1), r.held_from(2)), (60, 0, 60));
    }

    #[test]
    fn a_forgotten_communicator_releases_what_it_held() {
        let mut r = RunAhead::new(3, 100, 0);
        file(&mut r, 1, 1, 2, false, 90);
        file(&mut r, 1, 2, 2, false, 30);
        assert_eq!(
            file(&mut r, 4, 1, 1, true, 60),
            vec![1],
            "150 bytes from rank 1"
        );
        let mut resumed = Vec::new();
        assert_eq!(r.forget(4, |p| resumed.push(p)), 1);
        assert_eq!(resumed, vec![1], "back at 90");
        assert!(r.is_forgotten(4) && !r.is_forgotten(1));
        assert_eq!(r.held(), 120);
        assert_eq!(r.forget(1, |_| ()), 2);
        assert_eq!(r.held(), 0);
    }

    #[test]
    fn what_is_forgotten_stays_bounded_and_the_latest_are_kept() {
        let mut r = RunAhead::new(2, 0, 0);
        let n = 3 * FORGOTTEN_GENERATION as u64 + 7;
        for comm in 0..n {
            r.forget(comm, |_| ());
        }
        let kept: usize = r.forgotten.iter().map(HashSet::len).sum();
        assert!(kept <= 2 * FORGOTTEN_GENERATION, "{kept}");
        let recent = n - FORGOTTEN_GENERATION as u64;
        assert!(
            (recent..n).all(|c| r.is_forgotten(c)),
            "the latest generation's"
        );
        assert!(!r.is_forgotten(0), "the oldest went");
    }

    #[test]
    fn the_total_limit_pauses_every_peer_holding_any_until_back_under() {
        // 100 per peer, 150 in all, 5 peers.
        let mut r = RunAhead::new(5, 100, 150);
        assert!(file(&mut r, 1, 1, 2, false, 60).is_empty());
        assert!(file(&mut r, 1, 2, 2, false, 60).is_empty(), "120 in all");
        let mut paused = file(&mut r, 1, 3, 2, false, 60);
        paused.sort();
        assert_eq!(paused, vec![1, 2, 3], "180 in all: every holder pauses");
        assert!(!r.counts.over(4), "a peer holding nothing is read");
        assert_eq!(
            file(&mut r, 1, 4, 2, false, 10),
            vec![4],
            "one that starts holding while the total is over pauses at once"
        );
        // A holder that empties resumes even while the total is over...
        file(&mut r, 2, 1, 1, false, 50);
        assert_eq!(
            begin(&mut r, 2, 1, None),
            Vec::<usize>::new(),
            "still 240 > 150"
        );
        // ...and the total coming back under resumes the rest.
        let mut resumed = begin(&mut r, 1, 2, None);
        resumed.sort();
        assert_eq!(resumed, vec![1, 2, 3, 4]);
        assert_eq!(r.held(), 0);
        assert!((0..5).all(|p| !r.counts.over(p)));
    }

    #[test]
    fn the_per_peer_limit_still_pauses_under_the_total() {
        let mut r = RunAhead::new(3, 100, 1000);
        assert_eq!(file(&mut r, 1, 1, 2, false, 150), vec![1]);
        assert!(!r.counts.total_over());
        assert!(file(&mut r, 1, 2, 2, false, 50).is_empty());
        // The total passing its limit adds the other holder only.
        assert_eq!(file(&mut r, 1, 1, 3, false, 900), vec![2]);
        // Back under the total: rank 2 resumes, rank 1 (over its own) not.
        assert_eq!(begin(&mut r, 1, 2, None), vec![2]);
        assert!(r.counts.over(1));
    }

    #[test]
    fn no_total_limit_and_no_limit_at_all() {
        let mut r = RunAhead::new(3, 100, 0);
        file(&mut r, 1, 1, 2, false, 90);
        assert!(
            file(&mut r, 1, 2, 2, false, 90).is_empty(),
            "no total limit"
        );
        let mut r = RunAhead::new(3, 0, 10);
        assert!(
            file(&mut r, 1, 1, 2, false, 1 << 30).is_empty(),
            "0 turns both off"
        );
    }
}
