//! Control traffic: aborts and heartbeats.
//!
//! An abort of a communicator is recorded once, wakes every op of that
//! communicator, and is flooded to every linked peer once, so it reaches
//! ranks that are not neighbours of the failure; a link made later hears
//! every abort known when it is registered (`replay`). Heartbeats keep idle
//! links busy, and silence past the heartbeat timeout fails a link: a
//! stopped process still has a kernel that ACKs, so only silence at this
//! level reveals it.

use super::inbox::Inboxes;
use super::link::{Link, PeerTable};
use super::plane::{ControlSent, Fabric, Planes};
use super::{LinkError, lock};
use crate::error::link::LinkFailure;
use crate::wire;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// An abort as first heard of by this rank.
#[derive(Clone, Debug)]
struct AbortNote {
    origin: usize,
    seq: u64,
    reason: String,
    /// Set once the abort has been written to every peer (or failed to).
    forwarded: Arc<(Mutex<bool>, Condvar)>,
}

/// Aborts heard of, and when each link last carried something.
pub(crate) struct Control {
    me: usize,
    /// Communicators some rank aborted: comm id -> what it said.
    aborted: Mutex<HashMap<u64, AbortNote>>,
    /// Communicators that run inside another's ops (a two-level op's
    /// groups, decision 0033): parent comm id -> theirs. An abort of the
    /// parent aborts them too, so an op waiting in one of them wakes.
    nested: Mutex<HashMap<u64, Vec<u64>>>,
    /// Set once `aborted` has an entry: every op checks for an abort
    /// several times, and while none happened (nearly always) that costs
    /// one load instead of a lock.
    any_aborted: AtomicBool,
    /// Milliseconds since `epoch` of the last frame sent to / read from
    /// each peer.
    last_send: Vec<AtomicU64>,
    last_recv: Vec<AtomicU64>,
    epoch: Instant,
    heartbeat_interval: Duration,
    heartbeat_timeout: Duration,
}

impl Control {
    /// Control of rank `me` among `world`; times count from `epoch`.
    pub(crate) fn new(
        me: usize,
        world: usize,
        epoch: Instant,
        (heartbeat_interval, heartbeat_timeout): (Duration, Duration),
    ) -> Control {
        let stamps = || (0..world).map(|_| AtomicU64::new(0)).collect();
        Control {
            me,
            aborted: Mutex::new(HashMap::new()),
            nested: Mutex::new(HashMap::new()),
            any_aborted: AtomicBool::new(false),
            last_send: stamps(),
            last_recv: stamps(),
            epoch,
            heartbeat_interval,
            heartbeat_timeout,
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// A frame went out to `peer`.
    pub(crate) fn sent(&self, peer: usize) {
        self.last_send[peer].store(self.now_ms(), Ordering::Relaxed);
    }

    /// Something came from `peer` (or its silence does not count).
    pub(crate) fn heard(&self, peer: usize) {
        self.last_recv[peer].store(self.now_ms(), Ordering::Relaxed);
    }

    /// The error for ops of an aborted communicator.
    pub(crate) fn aborted_error(&self, comm_id: u64) -> Option<LinkError> {
        if !self.any_aborted.load(Ordering::Acquire) {
            return None;
        }
        lock(&self.aborted)
            .get(&comm_id)
            .map(|a| LinkError::Aborted {
                origin: a.origin,
                seq: a.seq,
                reason: a.reason.clone(),
            })
    }

    /// Records an abort of communicator `comm_id` (from `from`, or from this
    /// rank when `None`), wakes every op of that communicator, and floods the
    /// abort to every other linked peer once, so it reaches ranks that are
    /// not neighbours of the failure.
    pub(crate) fn on_abort(
        &self,
        from: Option<usize>,
        comm_id: u64,
        abort: wire::Abort,
        peers: &PeerTable,
        inboxes: &Inboxes,
    ) {
        let forwarded = Arc::new((Mutex::new(false), Condvar::new()));
        {
            let mut aborted = lock(&self.aborted);
            if aborted.contains_key(&comm_id) {
                return;
            }
            self.any_aborted.store(true, Ordering::Release);
            aborted.insert(
                comm_id,
                AbortNote {
                    origin: abort.origin_rank as usize,
                    seq: abort.seq,
                    reason: abort.reason.clone(),
                    forwarded: forwarded.clone(),
                },
            );
        }
        let mark_forwarded = move || {
            *lock(&forwarded.0) = true;
            forwarded.1.notify_all();
        };
        tracing::debug!(
            rank = self.me,
            comm_id,
            origin = abort.origin_rank,
            seq = abort.seq,
            "abort"
        );
        peers.notify();
        inboxes.wake(|c, _| c == comm_id);
        // Its ops end at once from now on, so what peers sent ahead for it
        // will never be taken: held, it would keep their links paused past
        // the run-ahead limit (decision 0019), with the agreement the
        // survivors need next queued behind it.
        inboxes.forget(comm_id);
        let nested = lock(&self.nested)
            .get(&comm_id)
            .cloned()
            .unwrap_or_default();
        for inner in nested {
            let again = wire::Abort::new(abort.origin_rank, abort.seq, abort.reason.clone());
            self.on_abort(from, inner, again, peers, inboxes);
        }
        let mut links = peers.ready_links();
        links.retain(|(p, _)| Some(*p) != from);
        let frame = wire::encode_abort(comm_id, abort.seq, &abort);
        // Links whose writer is free and whose socket takes the frame at
        // once first (engine links always: their frames are queued), here:
        // none of them waits. One blocked behind a peer that stopped
        // reading must not keep the rest from hearing, nor stall this
        // caller (a reader thread, a driver's turn): those go from a
        // thread of their own.
        let mut busy = Vec::new();
        for (peer, link) in links {
            if link.plane.send_control(peer, &frame, false) == ControlSent::Busy {
                busy.push((peer, link));
            }
        }
        mark_forwarded();
        if busy.is_empty() {
            return;
        }
        let me = self.me;
        let spawned = std::thread::Builder::new()
            .name(format!("ringwire-abort-{me}"))
            .spawn(move || {
                for (peer, link) in busy {
                    link.plane.send_control(peer, &frame, true);
                }
            });
        if spawned.is_err() {
            tracing::warn!(rank = me, "could not start a thread to forward an abort");
        }
    }

    /// Communicator `inner` runs inside `outer`'s ops: an abort of `outer`
    /// (already heard of, or later) aborts `inner` too.
    pub(crate) fn nest(&self, outer: u64, inner: u64, peers: &PeerTable, inboxes: &Inboxes) {
        lock(&self.nested).entry(outer).or_default().push(inner);
        if let Some(LinkError::Aborted {
            origin,
            seq,
            reason,
        }) = self.aborted_error(outer)
        {
            let abort = wire::Abort::new(origin as u32, seq, reason);
            self.on_abort(None, inner, abort, peers, inboxes);
        }
    }

    /// Communicator `outer` is gone here: nothing is nested in it any more.
    pub(crate) fn forget_nested(&self, outer: u64) {
        lock(&self.nested).remove(&outer);
    }

    /// Sends every abort this rank knows of to `peer`'s link, just made
    /// ready. Aborts are flooded once, to the links ready at that moment, so
    /// a link made later (the peer dials only now) hears them here. Called
    /// after the link is registered: an abort recorded after this snapshot
    /// finds the link in `ready_links` and is flooded to it, one recorded
    /// before is in the snapshot (the receiver ignores a second copy).
    pub(crate) fn replay(&self, peer: usize, link: &Link) {
        let known: Vec<Vec<u8>> = lock(&self.aborted)
            .iter()
            .map(|(comm, n)| {
                let abort = wire::Abort::new(n.origin as u32, n.seq, n.reason.clone());
                wire::encode_abort(*comm, n.seq, &abort)
            })
            .collect();
        for frame in known {
            if link.plane.send_control(peer, &frame, true) == ControlSent::Failed {
                tracing::debug!(rank = self.me, peer, "could not replay an abort");
                return;
            }
        }
    }

    /// What the abort of `comm_id` said: its origin (world rank), op
    /// number and reason.
    pub(crate) fn notice(&self, comm_id: u64) -> Option<(usize, u64, String)> {
        match self.aborted_error(comm_id)? {
            LinkError::Aborted {
                origin,
                seq,
                reason,
            } => Some((origin, seq, reason)),
            _ => None,
        }
    }

    /// Waits (at most `limit`) until the abort of `comm_id` has been written
    /// to every peer: a program that exits right after its op failed must
    /// still warn the others first.
    pub(crate) fn wait_forwarded(
        &self,
        comm_id: u64,
        limit: Duration,
        planes: &Planes,
        fabric: &dyn Fabric,
    ) {
        planes.flush(Instant::now() + limit, fabric);
        planes.release(fabric);
        let Some(flag) = lock(&self.aborted)
            .get(&comm_id)
            .map(|n| n.forwarded.clone())
        else {
            return;
        };
        let deadline = Instant::now() + limit;
        let mut done = lock(&flag.0);
        while !*done {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            done = flag
                .1
                .wait_timeout(done, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Sends heartbeats on idle links and fails links that have been silent
    /// past the heartbeat timeout, until the peer table closes. The
    /// heartbeat thread's body.
    pub(crate) fn heartbeats(
        &self,
        peers: &PeerTable,
        inboxes: &Inboxes,
        planes: &Planes,
        fabric: &dyn Fabric,
    ) {
        let interval = self.heartbeat_interval.max(Duration::from_millis(10));
        let beat = wire::encode_heartbeat(0, 0);
        while !peers.closing() {
            std::thread::park_timeout(interval / 2);
            if peers.closing() {
                return;
            }
            let now = self.now_ms();
            for (peer, link) in peers.ready_links() {
                if inboxes.over(peer) {
                    // Not read on purpose (decision 0019): silence proves nothing.
                    self.last_recv[peer].store(now, Ordering::Relaxed);
                }
                let silent = now.saturating_sub(self.last_recv[peer].load(Ordering::Relaxed));
                if silent > self.heartbeat_timeout.as_millis() as u64 {
                    let silent = Duration::from_millis(silent);
                    fabric.failed(peer, LinkFailure::HeartbeatTimeout { silent });
                    continue;
                }
                let idle = now.saturating_sub(self.last_send[peer].load(Ordering::Relaxed));
                // A busy writer is traffic enough; never wait for it here,
                // nor for a full socket (a peer that stopped reading this
                // link): blocked, this thread would beat for no other link.
                if idle >= interval.as_millis() as u64
                    && link.plane.send_control(peer, &beat, false) == ControlSent::Sent
                {
                    self.last_send[peer].store(now, Ordering::Relaxed);
                }
            }
            // Sends the beats and takes in what arrived, unless a waiting
            // executor is driving the engine already.
            planes.tick(fabric);
        }
    }
}
