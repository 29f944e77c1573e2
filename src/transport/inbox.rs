//! Inboxes: the frames each peer sent on each communicator, kept until an op
//! takes them, and the run-ahead rules on filing them (decision 0019).
//!
//! A frame of an op this rank has begun is filed without a lock on the
//! ledger (the usual case); one of an op not begun counts in the
//! [`RunAhead`] ledger, and past its limits the peer's link is paused (not
//! read) until this rank catches up. Whoever reads links (a portable
//! reader thread, or the engine's driver) asks [`Inboxes::paused`] between
//! frames. No sockets here: the planes file frames and wait on inboxes
//! through this, and its rules are tested without any.

use super::pool::Pool;
use super::run_ahead::RunAhead;
use super::{AlignedBuf, Incoming, lock};
use crate::wire::{Header, OpKind};
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

/// Communicator ids are already mixed 64-bit values (splitmix): they hash
/// as themselves.
#[derive(Default)]
struct CommIdHasher(u64);

impl Hasher for CommIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, id: u64) {
        self.0 ^= id;
    }
}

type CommIds = BuildHasherDefault<CommIdHasher>;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Wakes whatever reads links when a paused link may be read again, or a
/// waiter must look again (the engine's drivers; portable readers wait on
/// the ledger's condition variable instead).
pub(crate) type Wake = Arc<dyn Fn() + Send + Sync>;

/// The frames of one (communicator, peer).
pub(crate) struct Inbox {
    queue: Mutex<VecDeque<Incoming>>,
    arrived: Condvar,
    /// The highest collective op of this communicator begun here (shared
    /// by the communicator's inboxes), and the highest point-to-point
    /// receive from this peer: frames up to them are not run ahead
    /// (decision 0019), which a reader learns without a lock.
    begun: Arc<AtomicU64>,
    begun_p2p: AtomicU64,
    /// Threads waiting for a frame of this inbox.
    waiters: AtomicUsize,
}

impl Inbox {
    /// The oldest frame, if one is here.
    pub(crate) fn pop(&self) -> Option<Incoming> {
        lock(&self.queue).pop_front()
    }

    pub(crate) fn is_empty(&self) -> bool {
        lock(&self.queue).is_empty()
    }

    /// Sleeps on the inbox until `check` (called under its lock, first at
    /// once and then whenever a frame is filed or [`Inboxes::wake`] names
    /// it) returns an answer, or `deadline` passes (`None`).
    pub(crate) fn wait_until<R>(
        &self,
        deadline: Instant,
        mut check: impl FnMut(&mut VecDeque<Incoming>) -> Option<R>,
    ) -> Option<R> {
        let mut queue = lock(&self.queue);
        loop {
            if let Some(answer) = check(&mut queue) {
                return Some(answer);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            queue = self
                .arrived
                .wait_timeout(queue, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// Where a waiting thread's frame lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Await {
    /// In the inbox of its (communicator, peer).
    Inbox,
    /// In the caller's memory, placed by the engine.
    Placement,
}

/// Every inbox of the process, the run-ahead ledger, and the payload pool.
pub(crate) struct Inboxes {
    me: usize,
    inboxes: Mutex<HashMap<(u64, usize), Arc<Inbox>>>,
    pool: Pool,
    /// What each peer delivered for ops not started yet (decision 0019).
    run_ahead: Mutex<RunAhead>,
    /// Signalled when a peer's link may be read again (portable readers
    /// wait on it).
    run_ahead_changed: Condvar,
    /// Per peer: over the run-ahead limit (kept with `run_ahead`).
    over: Vec<AtomicBool>,
    /// Per peer: its link failed. Frames its reader still files then do
    /// not count as run ahead (`peer_lost` released what it held).
    dead: Vec<AtomicBool>,
    /// Frames `run_ahead` holds, readable without its lock.
    held_frames: AtomicUsize,
    /// Each communicator's highest collective op begun (see `Inbox::begun`).
    comm_begun: Mutex<HashMap<u64, Arc<AtomicU64>, CommIds>>,
    /// Per peer: threads waiting for a frame of it to be placed in their
    /// memory (those waiting on an inbox are counted there). Either kind
    /// keeps a paused link read until its frame is in: it may sit behind
    /// held ones.
    placing: Vec<AtomicUsize>,
    /// Per peer: threads waiting for a frame of it (inbox or placement).
    /// The portable plane's reader polls its socket while any does.
    awaited: Vec<AtomicUsize>,
    /// The transport is closing: nothing is paused any more.
    closing: AtomicBool,
    wake: Wake,
}

impl Inboxes {
    /// Inboxes of rank `me` among `world`, with run-ahead limits per peer
    /// and in all (0: none); `wake` is called when links may be read again.
    pub(crate) fn new(
        me: usize,
        world: usize,
        (limit, total_limit): (usize, usize),
        wake: Wake,
    ) -> Inboxes {
        let flags = || (0..world).map(|_| AtomicBool::new(false)).collect();
        let counts = || (0..world).map(|_| AtomicUsize::new(0)).collect();
        Inboxes {
            me,
            inboxes: Mutex::new(HashMap::new()),
            pool: Pool::default(),
            run_ahead: Mutex::new(RunAhead::new(world, limit, total_limit)),
            run_ahead_changed: Condvar::new(),
            over: flags(),
            dead: flags(),
            held_frames: AtomicUsize::new(0),
            comm_begun: Mutex::new(HashMap::default()),
            placing: counts(),
            awaited: counts(),
            closing: AtomicBool::new(false),
            wake,
        }
    }

    /// The inbox of (`comm_id`, `peer`), made if needed.
    pub(crate) fn inbox(&self, comm_id: u64, peer: usize) -> Arc<Inbox> {
        lock(&self.inboxes)
            .entry((comm_id, peer))
            .or_insert_with(|| {
                Arc::new(Inbox {
                    queue: Mutex::new(VecDeque::new()),
                    arrived: Condvar::new(),
                    begun: self.comm_begun(comm_id),
                    begun_p2p: AtomicU64::new(0),
                    waiters: AtomicUsize::new(0),
                })
            })
            .clone()
    }

    /// The inbox a frame for `comm_id` from `peer` goes to, made if needed,
    /// unless that communicator was dropped here: a late frame for it must
    /// not make its inbox (and count) again, to be kept for nobody. Checked
    /// under the ledger's lock, which `forget` marks the communicator under
    /// before it removes the inboxes.
    fn inbox_for_frame(&self, comm_id: u64, peer: usize) -> Option<Arc<Inbox>> {
        if let Some(inbox) = lock(&self.inboxes).get(&(comm_id, peer)) {
            return Some(inbox.clone());
        }
        let ahead = lock(&self.run_ahead);
        (!ahead.is_forgotten(comm_id)).then(|| self.inbox(comm_id, peer))
    }

    fn comm_begun(&self, comm_id: u64) -> Arc<AtomicU64> {
        lock(&self.comm_begun).entry(comm_id).or_default().clone()
    }

    /// Files a data frame from `peer` in its inbox (waking a receive
    /// sleeping on it if `wake`) and counts it if its op has not begun here
    /// (decision 0019).
    pub(crate) fn file(&self, peer: usize, header: Header, payload: AlignedBuf, wake: bool) {
        let (comm_id, seq, bytes) = (header.comm_id, header.seq, payload.len());
        let p2p = header.op == OpKind::SendRecv;
        let Some(inbox) = self.inbox_for_frame(comm_id, peer) else {
            // Its communicator is gone here: nobody will take it.
            return self.recycle(payload);
        };
        let begun = || match p2p {
            true => inbox.begun_p2p.load(Ordering::SeqCst),
            false => inbox.begun.load(Ordering::SeqCst),
        };
        let put = |incoming| {
            lock(&inbox.queue).push_back(incoming);
            if wake {
                inbox.arrived.notify_one();
            }
        };
        if seq <= begun() {
            // The op runs here: the usual case, and lock-free.
            return put(Incoming { header, payload });
        }
        let mut ahead = lock(&self.run_ahead);
        // Counted before looking again, so a `begin` that raised `begun`
        // meanwhile either is seen here or sees the count and takes the
        // lock to release the frame.
        self.held_frames.fetch_add(1, Ordering::SeqCst);
        if seq <= begun() {
            self.held_frames.fetch_sub(1, Ordering::SeqCst);
            return put(Incoming { header, payload });
        }
        if ahead.is_forgotten(comm_id) {
            // Its communicator is gone here: nobody will take it.
            self.held_frames.fetch_sub(1, Ordering::SeqCst);
            drop(ahead);
            return self.recycle(payload);
        }
        if self.dead[peer].load(Ordering::SeqCst) {
            // Drained from a failed link: kept for whoever reads it, but
            // it holds nobody back.
            self.held_frames.fetch_sub(1, Ordering::SeqCst);
            drop(ahead);
            return put(Incoming { header, payload });
        }
        put(Incoming { header, payload });
        let (limit, total_limit) = (ahead.limit(), ahead.total_limit());
        ahead.filed(comm_id, peer, seq, p2p, bytes, |p| {
            if !self.over[p].swap(true, Ordering::SeqCst) {
                tracing::debug!(
                    rank = self.me,
                    peer = p,
                    limit,
                    total_limit,
                    "rank {p} ran ahead past a run-ahead limit (its own, or all peers' together): its link waits until this rank catches up"
                );
            }
        });
    }

    /// Communicator `comm_id` is gone here: its inboxes go, and frames
    /// peers sent ahead for it stop counting (and later ones are dropped).
    pub(crate) fn forget(&self, comm_id: u64) {
        self.release_held(|ahead, resumed| ahead.forget(comm_id, resumed));
        let mut gone = Vec::new();
        lock(&self.inboxes).retain(|&(c, _), inbox| {
            if c == comm_id {
                gone.push(inbox.clone());
            }
            c != comm_id
        });
        lock(&self.comm_begun).remove(&comm_id);
        for inbox in gone {
            let frames = std::mem::take(&mut *lock(&inbox.queue));
            for frame in frames {
                self.recycle(frame.payload);
            }
        }
    }

    /// This rank begins op `seq` of `comm_id` (see `Transport::begin`).
    pub(crate) fn begin(&self, comm_id: u64, seq: u64, from: Option<usize>) {
        match from {
            Some(peer) => self
                .inbox(comm_id, peer)
                .begun_p2p
                .fetch_max(seq, Ordering::SeqCst),
            // Every op begins here: no Arc taken, no SipHash.
            None => lock(&self.comm_begun)
                .entry(comm_id)
                .or_default()
                .fetch_max(seq, Ordering::SeqCst),
        };
        if self.held_frames.load(Ordering::SeqCst) == 0 {
            return;
        }
        self.release_held(|ahead, resumed| ahead.begin(comm_id, seq, from, resumed));
    }

    /// Runs `release` on the ledger (a `begin` or `forget`, which return
    /// how many frames stopped counting and call back each peer back under
    /// the limit), and reads those peers' links again.
    fn release_held(&self, release: impl FnOnce(&mut RunAhead, &mut dyn FnMut(usize)) -> usize) {
        let mut any = false;
        {
            let mut ahead = lock(&self.run_ahead);
            let released = release(&mut ahead, &mut |peer| {
                self.over[peer].store(false, Ordering::SeqCst);
                tracing::debug!(rank = self.me, peer, "caught up: reading its link again");
                any = true;
            });
            self.held_frames.fetch_sub(released, Ordering::SeqCst);
        }
        if any {
            self.resume_reading();
        }
    }

    /// Whether `peer`'s link is not read for now: it delivered more than the
    /// run-ahead limit for ops this rank has not started, and no thread
    /// here waits for a frame of it that has not arrived.
    pub(crate) fn paused(&self, peer: usize) -> bool {
        if !self
            .over
            .get(peer)
            .is_some_and(|o| o.load(Ordering::SeqCst))
            || self.closing.load(Ordering::SeqCst)
        {
            return false;
        }
        if self.placing[peer].load(Ordering::SeqCst) > 0 {
            return false; // served when it returns
        }
        // A waiter whose frame is in the inbox is served; its thread may
        // not have run yet, and reading on for it would let the peer run
        // ahead.
        !lock(&self.inboxes).iter().any(|(&(_, p), inbox)| {
            p == peer && inbox.waiters.load(Ordering::SeqCst) > 0 && lock(&inbox.queue).is_empty()
        })
    }

    /// Whether `peer` is over its run-ahead limit (its link not read on
    /// purpose, so its silence proves nothing).
    pub(crate) fn over(&self, peer: usize) -> bool {
        self.over[peer].load(Ordering::SeqCst)
    }

    /// Whether some thread here waits for a frame of `peer`.
    pub(crate) fn awaited(&self, peer: usize) -> bool {
        self.awaited[peer].load(Ordering::SeqCst) > 0
    }

    /// Counts the calling thread as waiting for a frame of `peer` in
    /// `inbox` (or, `at` a placement, straight into its memory) until the
    /// guard drops; a paused link is read again until that frame is in.
    pub(crate) fn waiting_on<'a>(
        &'a self,
        inbox: &'a Inbox,
        peer: usize,
        at: Await,
    ) -> Waiting<'a> {
        inbox.waiters.fetch_add(1, Ordering::SeqCst);
        self.awaited[peer].fetch_add(1, Ordering::SeqCst);
        if at == Await::Placement {
            self.placing[peer].fetch_add(1, Ordering::SeqCst);
        }
        if self.over[peer].load(Ordering::SeqCst) {
            self.resume_reading();
        }
        Waiting {
            inboxes: self,
            inbox,
            peer,
            at,
        }
    }

    /// Wakes whatever reads links to re-check which are paused.
    fn resume_reading(&self) {
        {
            let _ahead = lock(&self.run_ahead);
            self.run_ahead_changed.notify_all();
        }
        (self.wake)();
    }

    /// Holds the calling reader of `peer`'s link while the link is paused;
    /// true if it was.
    pub(crate) fn wait_while_paused(&self, peer: usize) -> bool {
        if !self.paused(peer) {
            return false;
        }
        let mut ahead = lock(&self.run_ahead);
        while self.paused(peer) {
            ahead = self
                .run_ahead_changed
                .wait_timeout(ahead, Duration::from_millis(100))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    /// Wakes every receive waiting on an inbox `(comm, peer)` that matches,
    /// so it re-checks for failures and aborts.
    pub(crate) fn wake(&self, matches: impl Fn(u64, usize) -> bool) {
        let inboxes: Vec<_> = lock(&self.inboxes)
            .iter()
            .filter(|((c, p), _)| matches(*c, *p))
            .map(|(_, i)| i.clone())
            .collect();
        for inbox in inboxes {
            // Taking the lock orders the wake-up after a waiter's check.
            let _guard = lock(&inbox.queue);
            inbox.arrived.notify_all();
        }
        (self.wake)();
    }

    /// `peer`'s link failed: its waiters wake to see it, what it sent
    /// ahead no longer holds anyone back, and a paused reader of its link
    /// wakes to see the link gone. Marked dead under the ledger's lock
    /// first, so a frame its reader files meanwhile is either released
    /// here or not counted (`file`).
    pub(crate) fn peer_lost(&self, peer: usize) {
        self.wake(|_, p| p == peer);
        if let Some(dead) = self.dead.get(peer) {
            let _ahead = lock(&self.run_ahead);
            dead.store(true, Ordering::SeqCst);
        }
        if self.held_frames.load(Ordering::SeqCst) > 0 {
            self.release_held(|ahead, resumed| ahead.drop_peer(peer, resumed));
        }
        if let Some(over) = self.over.get(peer) {
            over.store(false, Ordering::SeqCst);
        }
        self.resume_reading();
    }

    /// A replacement took `peer`'s place (decision 0040): its frames count
    /// again.
    pub(crate) fn peer_back(&self, peer: usize) {
        if let Some(dead) = self.dead.get(peer) {
            let _ahead = lock(&self.run_ahead);
            dead.store(false, Ordering::SeqCst);
        }
    }

    /// The transport is closing: no link is paused any more.
    pub(crate) fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
        self.resume_reading();
    }

    /// A buffer to receive a payload into.
    pub(crate) fn buffer(&self) -> AlignedBuf {
        self.pool.take()
    }

    /// Returns a payload buffer for reuse.
    pub(crate) fn recycle(&self, buf: AlignedBuf) {
        self.pool.recycle(buf);
    }

    /// Bytes peers delivered for ops not begun here, now and at most.
    pub(crate) fn held_ahead(&self) -> (usize, usize) {
        let ahead = lock(&self.run_ahead);
        (ahead.held(), ahead.peak())
    }

    /// How many inboxes are kept.
    pub(crate) fn count(&self) -> usize {
        lock(&self.inboxes).len()
    }
}

/// A thread waiting for a frame of a peer (see `Inboxes::waiting_on`).
pub(crate) struct Waiting<'a> {
    inboxes: &'a Inboxes,
    inbox: &'a Inbox,
    peer: usize,
    at: Await,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.inbox.waiters.fetch_sub(1, Ordering::SeqCst);
        self.inboxes.awaited[self.peer].fetch_sub(1, Ordering::SeqCst);
        if self.at == Await::Placement {
            self.inboxes.placing[self.peer].fetch_sub(1, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use std::sync::atomic::AtomicUsize;

    /// Inboxes of rank 0 among 3 with a per-peer limit of 100 bytes (no
    /// total limit), and a count of the wake-ups they asked for.
    fn inboxes() -> (Inboxes, Arc<AtomicUsize>) {
        let woken = Arc::new(AtomicUsize::new(0));
        let count = woken.clone();
        let wake: Wake = Arc::new(move || {
            count.fetch_add(1, Ordering::SeqCst);
        });
        (Inboxes::new(0, 3, (100, 0), wake), woken)
    }

    fn frame(comm: u64, seq: u64, op: OpKind, bytes: usize) -> (Header, AlignedBuf) {
        let header = Header::data(comm, seq, op, DType::U8).with_payload_len(bytes as u32);
        let mut buf = AlignedBuf::default();
        buf.prepare(bytes).fill(seq as u8);
        (header, buf)
    }

    fn file(inboxes: &Inboxes, peer: usize, comm: u64, seq: u64, bytes: usize) {
        let (header, payload) = frame(comm, seq, OpKind::AllReduce, bytes);
        inboxes.file(peer, header, payload, true);
    }

    #[test]
    fn frames_of_a_begun_op_hold_nobody_back() {
        let (inboxes, _) = inboxes();
        inboxes.begin(7, 3, None);
        for seq in 1..=3 {
            file(&inboxes, 1, 7, seq, 80);
        }
        assert_eq!(inboxes.held_ahead(), (0, 0));
        assert!(!inboxes.paused(1));
        let inbox = inboxes.inbox(7, 1);
        let seqs: Vec<u64> = std::iter::from_fn(|| inbox.pop().map(|f| f.header.seq)).collect();
        assert_eq!(seqs, [1, 2, 3], "in arrival order");
    }

    #[test]
    fn a_peer_past_its_limit_pauses_until_its_op_begins() {
        let (inboxes, woken) = inboxes();
        file(&inboxes, 1, 7, 1, 60);
        assert_eq!(inboxes.held_ahead(), (60, 60));
        assert!(!inboxes.paused(1), "60 of 100 bytes");
        file(&inboxes, 1, 7, 2, 60);
        assert!(inboxes.paused(1) && inboxes.over(1), "120 of 100 bytes");
        assert!(!inboxes.paused(2), "only the peer that ran ahead");
        let before = woken.load(Ordering::SeqCst);
        inboxes.begin(7, 1, None);
        assert_eq!(inboxes.held_ahead(), (60, 120));
        assert!(!inboxes.paused(1), "back under the limit");
        assert!(woken.load(Ordering::SeqCst) > before, "readers told");
        // Every frame stays in the inbox whatever it counted as.
        assert_eq!(inboxes.inbox(7, 1).pop().map(|f| f.header.seq), Some(1));
    }

    #[test]
    fn a_waiter_keeps_a_paused_link_read_until_its_frame_is_in() {
        let (inboxes, _) = inboxes();
        file(&inboxes, 1, 9, 5, 200);
        assert!(inboxes.paused(1));
        // A thread waits for communicator 8's frame from rank 1: it may sit
        // behind the held ones, so the link is read while its inbox is empty.
        let inbox = inboxes.inbox(8, 1);
        {
            let _waiting = inboxes.waiting_on(&inbox, 1, Await::Inbox);
            assert!(!inboxes.paused(1) && inboxes.awaited(1));
            inboxes.begin(8, 1, None);
            file(&inboxes, 1, 8, 1, 10);
            assert!(inboxes.paused(1), "its frame is in: paused again");
        }
        assert!(!inboxes.awaited(1));
        // Waiting for a placement keeps it read whatever the inboxes hold.
        let _placing = inboxes.waiting_on(&inbox, 1, Await::Placement);
        assert!(!inboxes.paused(1));
    }

    #[test]
    fn point_to_point_frames_begin_with_their_receive_from_that_peer() {
        let (inboxes, _) = inboxes();
        let (header, payload) = frame(7, 1, OpKind::SendRecv, 150);
        inboxes.file(2, header, payload, true);
        assert!(inboxes.paused(2));
        inboxes.begin(7, 1, None);
        assert!(inboxes.paused(2), "a collective begins no receive");
        inboxes.begin(7, 1, Some(1));
        assert!(inboxes.paused(2), "a receive from another peer neither");
        inboxes.begin(7, 1, Some(2));
        assert!(!inboxes.paused(2));
        assert_eq!(inboxes.held_ahead().0, 0);
    }

    #[test]
    fn a_forgotten_communicator_drops_what_it_held_and_what_comes_later() {
        let (inboxes, _) = inboxes();
        file(&inboxes, 1, 7, 4, 150);
        file(&inboxes, 2, 6, 1, 10);
        assert!(inboxes.paused(1));
        assert_eq!(inboxes.count(), 2);
        inboxes.forget(7);
        assert!(!inboxes.paused(1));
        assert_eq!(inboxes.held_ahead().0, 10, "communicator 6's frame stays");
        assert_eq!(inboxes.count(), 1);
        file(&inboxes, 1, 7, 5, 150);
        assert_eq!(inboxes.count(), 1, "no inbox made again for a late frame");
        assert!(!inboxes.paused(1));
    }

    #[test]
    fn a_lost_peer_stops_counting_but_its_frames_stay_readable() {
        let (inboxes, _) = inboxes();
        file(&inboxes, 1, 7, 4, 150);
        assert!(inboxes.paused(1));
        inboxes.peer_lost(1);
        assert!(!inboxes.paused(1) && !inboxes.over(1));
        assert_eq!(inboxes.held_ahead().0, 0);
        // Drained from its socket after the failure: kept, not counted.
        file(&inboxes, 1, 7, 5, 150);
        assert_eq!(inboxes.held_ahead().0, 0);
        let inbox = inboxes.inbox(7, 1);
        assert_eq!(inbox.pop().map(|f| f.header.seq), Some(4));
        assert_eq!(inbox.pop().map(|f| f.header.seq), Some(5));
    }

    #[test]
    fn a_closing_transport_pauses_nothing() {
        let (inboxes, _) = inboxes();
        file(&inboxes, 1, 7, 4, 150);
        assert!(inboxes.paused(1));
        inboxes.close();
        assert!(!inboxes.paused(1));
        assert!(!inboxes.wait_while_paused(1));
    }

    #[test]
    fn a_sleeping_receive_wakes_for_a_frame_or_gives_up_at_its_deadline() {
        let (inboxes, _) = inboxes();
        let inboxes = Arc::new(inboxes);
        inboxes.begin(7, 1, None);
        let inbox = inboxes.inbox(7, 1);
        let late = Instant::now() + Duration::from_millis(20);
        assert!(inbox.wait_until(late, |q| q.pop_front()).is_none());
        let filer = inboxes.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            file(&filer, 1, 7, 1, 8);
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        let got = inbox.wait_until(deadline, |q| q.pop_front());
        assert_eq!(got.map(|f| f.payload.len()), Some(8));
        t.join().unwrap();
        // `wake` makes a sleeper look again (an abort, a failed link).
        let flag = Arc::new(AtomicBool::new(false));
        let (waker, seen) = (inboxes.clone(), flag.clone());
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            seen.store(true, Ordering::SeqCst);
            waker.wake(|c, p| (c, p) == (7, 1));
        });
        let got = inbox.wait_until(deadline, |_| flag.load(Ordering::SeqCst).then_some(()));
        assert_eq!(got, Some(()));
        assert!(Instant::now() < deadline);
        t.join().unwrap();
    }

    #[test]
    fn payload_buffers_are_reused() {
        let (inboxes, _) = inboxes();
        let mut buf = inboxes.buffer();
        buf.prepare(4096);
        let at = buf.bytes().as_ptr();
        inboxes.recycle(buf);
        let mut again = inboxes.buffer();
        assert_eq!(again.prepare(4096).as_ptr(), at as *mut u8);
    }
}
