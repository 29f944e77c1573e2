//! The ring itself: submission entries for receives, sends and the wake-up
//! eventfd, and what each completion means. The only module of the engine
//! that hands memory to the kernel, so every `unsafe` block is here.
//!
//! The rule that keeps it sound: memory named by an entry in flight stays
//! valid until that entry's completion is taken. Staging buffers, payload
//! buffers, `msghdr`/`iovec`s and the eventfd word are owned by `Driver`
//! (boxed, so they never move) and are only dropped after their completion
//! or, when the ring is torn down with entries still in flight, leaked.
//! Borrowed send payloads belong to a caller that `FrameEngine::send` keeps
//! waiting until the completion has been recorded.
//!
//! Split by what each part holds: this file the `Driver` (its turn,
//! `release`, reaping, failing links, `Drop`); `install.rs` a link's
//! sockets and lanes put in place; `link_io.rs` a link's state; `post.rs`
//! the entries a turn posts; `receive.rs` and `send.rs` what a completion
//! means; `sockets.rs` the socket calls beside the ring; `threads.rs` the
//! hand-off to engine threads.
#![allow(unsafe_code)]

use super::head_slots::{HEAD_SLOTS, HeadSlots};
use super::lanes::{self, LaneLoad, PIECE_HEADER, PieceFit, PieceHeader};
use super::shard_thread::{EngineThread, ThreadCounters};
use super::{
    Body, EngineConfig, FrameSink, LaneCounters, Lanes, LanesToInstall, LinkFault, MAX_FRAME_ALIGN,
    MAX_HEADER, Outcome, PlaceRequest, Queued, SendRequest, SharedFd,
};
use crate::AlignedBuf;
use io_uring::{IoUring, opcode, squeue, types};
use nix::sys::socket::{Shutdown, shutdown};
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

mod install;
mod link_io;
mod post;
mod receive;
mod send;
mod sockets;
mod threads;

use link_io::*;
use send::*;
#[cfg(test)]
pub(crate) use sockets::pace_for_tests;
use sockets::*;
use threads::*;

// SAFETY: a `SendRequest` is plain data except for `Body::Borrowed`'s
// pointer, which is only read by the kernel (through an entry built in this
// module) while the caller that owns the memory is parked in
// `FrameEngine::send`; moving the request between threads does not touch it.
unsafe impl Send for SendRequest {}

// SAFETY: as for `SendRequest`: the pointer is written only by the kernel
// or this module while its owner is parked in
// `FrameEngine::receive_in_place`.
unsafe impl Send for PlaceRequest {}

/// What a completion is for: the low four bits of `user_data`; the next
/// four name a send lane's header slot (`HeadSlots`), the next byte the
/// connection of the link (0: its main one; `1 + i`: lane `i`), and the
/// link is above that.
const KIND: u64 = 0x0f;
const RECV: u64 = 1;
const SEND: u64 = 2;
const WAKE: u64 = 3;
const CANCEL: u64 = 4;
/// The message that wakes an engine thread (`shard_thread.rs`); its link
/// field names the slot in `Driver::wakers` of the thread that sent it.
const THREAD_WAKE: u64 = 5;

/// `IORING_SEND_ZC_REPORT_USAGE` (sqe ioprio of a SEND_ZC) and
/// `IORING_NOTIF_USAGE_ZC_COPIED` (in the notification's result).
const SEND_ZC_REPORT_USAGE: u16 = 1 << 3;
const NOTIF_USAGE_ZC_COPIED: u32 = 1 << 31;

/// Whether a link's large sends go zero-copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ZeroCopy {
    /// The next large send tries SEND_ZC and asks the kernel to report.
    Untried,
    /// That send is in flight.
    Probing,
    /// The kernel sent without copying: keep using SEND_ZC.
    On,
    /// The kernel copied (loopback, veth, NICs without offload) or refused
    /// SEND_ZC on this socket: plain sends.
    Off,
}

/// Frames with at most this many bytes left (and below the zero-copy
/// threshold) go out by a plain `sendmsg` when the socket takes them at
/// once (`Driver::send_directly`).
pub(crate) const DIRECT_SEND_BYTES: usize = 64 << 10;

/// The zeros that end frames (sends point at them; nothing writes here).
static ZEROS: [u8; MAX_FRAME_ALIGN] = [0; MAX_FRAME_ALIGN];

fn tag(kind: u64, link: usize) -> u64 {
    lane_tag(kind, link, 0)
}

/// `tag` for a link's connection `conn` (0: main; `1 + i`: lane `i`).
fn lane_tag(kind: u64, link: usize, conn: usize) -> u64 {
    kind | ((conn as u64) << 8) | ((link as u64) << 16)
}

pub(crate) struct Driver {
    ring: IoUring,
    links: Vec<Option<Box<LinkIo>>>,
    header_len: usize,
    /// Every frame is a multiple of this many bytes.
    frame_align: usize,
    staging: usize,
    fixed_files: bool,
    wake_fd: RawFd,
    wake_word: Box<u64>,
    wake_in_flight: bool,
    wake_owner: Option<ThreadId>,
    /// Set (under the engine's state lock) when work is queued or waiters
    /// are notified during a turn; a spinning driver ends its turn on it,
    /// so the eventfd read is only needed while it sleeps in the kernel.
    poked: Arc<AtomicBool>,
    /// The thread driving the current turn.
    me: Option<ThreadId>,
    /// What `release` withdraws (kept to reuse its storage).
    cancels: Vec<u64>,
    /// Entries submitted whose completion has not been taken.
    in_flight: usize,
    /// Entries ever pushed (the engine's tests count them).
    pub(crate) pushed: u64,
    completions: Vec<(u64, i32, u32)>,
    touched: Vec<usize>,
    /// Sends finished this turn (id 0: an owned send), for the engine.
    pub(crate) finished: Vec<(u64, Outcome)>,
    /// The other half of the engine's double-buffered work queue.
    pub(crate) spare: Queued,
    /// Sends with at least this many bytes left try SEND_ZC.
    zero_copy_from: Option<usize>,
    zero_copy_always: bool,
    /// How long a driver polls before it sleeps.
    spin: Duration,
    /// Lanes a link may have each way (their slots in the file table).
    max_lanes: usize,
    /// Lane entries built in `post_entries` (kept to reuse its storage).
    lane_entries: Vec<(squeue::Entry, u64, bool, Option<usize>)>,
    /// SEND_ZC notifications owed on lanes, all links together: when none
    /// are, `release` looks no further.
    lane_notifications: usize,
    /// Engine threads that lanes are dealt to (decision 0036); none: every
    /// entry goes on this ring.
    threads: Vec<EngineThread>,
    /// Entries built for each thread this turn, handed over together.
    handed: Vec<Vec<squeue::Entry>>,
    /// Threads that sent engine threads wake messages, and how many of
    /// those have not completed here: a message's own completion may be
    /// completion work left to its sender (before Linux 6.11), so a thread
    /// leaving the engine waits for its own (`release`). A slot whose
    /// count is 0 is free for any thread.
    wakers: Vec<(Option<ThreadId>, u32)>,
    /// Threads handed entries whose wake found the queue full.
    wake_owed: Vec<bool>,
    /// Wakes `Drop` sent to stop the threads, not yet completed.
    stop_wakes: u32,
    /// Set by `Drop` if entries were still in flight and it leaked what
    /// they name (tests look: a clean end leaks nothing).
    leaked: Arc<AtomicBool>,
    /// Lanes dealt to threads so far (the next goes to `dealt % threads`).
    dealt: usize,
}

// SAFETY: the raw pointers in `msghdr`/`iovec` point into this driver's own
// boxes or into borrowed payloads (see `SendRequest`); the driver is only
// used under `FrameEngine`'s mutex, one thread at a time.
unsafe impl Send for Driver {}

impl Driver {
    pub(crate) fn new(
        config: &EngineConfig,
        wake: &nix::sys::eventfd::EventFd,
        poked: Arc<AtomicBool>,
    ) -> io::Result<Driver> {
        // Every connection of a link (main and lanes) has at most one
        // receive and one send in flight, plus the eventfd read: size the
        // queues so completions never overflow.
        let per_link = 2 + 2 * config.max_lanes;
        let entries = ((per_link * config.links) as u32 + 8)
            .next_power_of_two()
            .clamp(64, 8192);
        // Cooperative task running: completions run when a driver next
        // enters the kernel instead of interrupting a thread that is busy
        // reducing (measured against the default in decision 0007).
        let ring = crate::probe::on_a_passing_thread(move || {
            IoUring::builder()
                .setup_coop_taskrun()
                .setup_cqsize(entries * 2)
                .build(entries)
                .or_else(|_| IoUring::builder().setup_cqsize(entries * 2).build(entries))
        })
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENOMEM) => io::Error::new(e.kind(), crate::probe::memlock_refusal(&e)),
            _ => e,
        })?;
        // A slot for every lane a link may have; if the kernel refuses that
        // many (RLIMIT_NOFILE bounds the table), one lane each way, as
        // before lanes multiplied (a lane past the table runs unregistered).
        let links = config.links.max(1);
        let fixed_files = [1 + 2 * config.max_lanes, 3].iter().any(|per_link| {
            ring.submitter()
                .register_files_sparse((per_link * links) as u32)
                .is_ok()
        });
        let threads = start_threads(config, ring.as_raw_fd(), entries);
        Ok(Driver {
            handed: threads.iter().map(|_| Vec::new()).collect(),
            wakers: Vec::new(),
            wake_owed: vec![false; threads.len()],
            stop_wakes: 0,
            leaked: Arc::default(),
            threads,
            dealt: 0,
            ring,
            links: (0..config.links).map(|_| None).collect(),
            header_len: config.header_len,
            frame_align: config.frame_align,
            staging: config
                .staging
                .max(4 * (config.header_len + config.frame_align)),
            fixed_files,
            wake_fd: wake.as_fd().as_raw_fd(),
            wake_word: Box::new(0),
            wake_in_flight: false,
            wake_owner: None,
            poked,
            me: None,
            cancels: Vec::new(),
            in_flight: 0,
            pushed: 0,
            completions: Vec::with_capacity(entries as usize * 2),
            touched: Vec::new(),
            finished: Vec::new(),
            spare: Queued::default(),
            zero_copy_from: config.zero_copy_from,
            zero_copy_always: config.zero_copy_always,
            spin: config.spin,
            max_lanes: config.max_lanes,
            lane_entries: Vec::new(),
            lane_notifications: 0,
        })
    }

    pub(crate) fn uses_fixed_files(&self) -> bool {
        self.fixed_files
    }

    /// The counters of each engine thread that runs.
    pub(crate) fn thread_counters(&self) -> Vec<Arc<ThreadCounters>> {
        self.threads.iter().map(EngineThread::counters).collect()
    }

    /// Each installed link's zero-copy state.
    pub(crate) fn zero_copy(&self) -> Vec<(usize, ZeroCopy)> {
        self.links
            .iter()
            .enumerate()
            .filter_map(|(i, l)| l.as_ref().map(|l| (i, l.zero_copy)))
            .collect()
    }

    /// Whether receive lane `lane` of `link` has read its end.
    #[cfg(test)]
    pub(crate) fn recv_lane_ended(&self, link: usize, lane: usize) -> bool {
        let l = self.links.get(link).and_then(|l| l.as_ref());
        l.and_then(|l| l.recv_lanes.get(lane))
            .is_some_and(|r| r.ended)
    }

    /// One turn: take in `queued` (left empty), submit what can go, wait
    /// up to `wait` for at least one completion, and handle every
    /// completion there is. Finished sends go to `self.finished`.
    pub(crate) fn turn(&mut self, queued: &mut Queued, wait: Duration, sink: &dyn FrameSink) {
        self.me = Some(std::thread::current().id());
        let mut finished = std::mem::take(&mut self.finished);
        self.turn_inner(queued, wait, sink, &mut finished);
        self.finished = finished;
    }

    fn turn_inner(
        &mut self,
        queued: &mut Queued,
        wait: Duration,
        sink: &dyn FrameSink,
        finished: &mut Vec<(u64, Outcome)>,
    ) {
        for (link, socket, lanes) in queued.links.drain(..) {
            self.install(link, socket, lanes);
        }
        for target in queued.placements.drain(..) {
            let link = target.link;
            match self.links.get_mut(link).and_then(|l| l.as_mut()) {
                Some(l) if l.dead.is_none() => l.targets.push(target),
                Some(l) => finished.push((
                    target.id,
                    Outcome::Failed(l.dead.clone().unwrap_or_default()),
                )),
                None => finished.push((
                    target.id,
                    Outcome::Failed(format!("link {link} is not connected")),
                )),
            }
        }
        // Sends join their links' queues before withdrawals are looked at,
        // so a send withdrawn before any turn took it is found there.
        for req in queued.sends.drain(..) {
            self.take_send(req, finished);
        }
        for id in queued.withdrawals.drain(..) {
            self.withdraw(id, finished);
        }
        for link in 0..self.links.len() {
            self.send_directly(link, finished);
        }
        // Work that ended already (a withdrawn placement, a send to a dead
        // link) must reach its caller now, not after a sleep.
        let ended = !finished.is_empty();
        // A driver that will poll reads small frames itself, so staging
        // links get no ring receive; nor do they in a turn that ends at once
        // because its work is done (its caller polls again if it still
        // waits). Only a turn asked not to wait (the heartbeat's tick)
        // leaves receives in flight for the ring.
        let direct = !wait.is_zero() && self.receives_directly();
        for link in 0..self.links.len() {
            let receive = (!direct || !self.is_staging(link)) && !self.held_back(link, sink);
            self.post_entries(link, receive);
        }
        self.touched.clear();
        let wait = if ended { Duration::ZERO } else { wait };
        self.enter(wait, direct, sink, finished);
        // Take what completed. Sends that went out in part continue at
        // once; receives are posted again by the next turn (whoever still
        // waits takes one at once), so a thread whose wait this completion
        // ended leaves no fresh receive behind for `release` to withdraw.
        for _ in 0..8 {
            if !self.reap(sink, finished) {
                break;
            }
            let touched = std::mem::take(&mut self.touched);
            for &link in &touched {
                self.post_send(link);
            }
            self.touched = touched;
            self.touched.clear();
            if self.ring.submission().is_empty() {
                break; // nothing new went in; later completions are the next turn's
            }
            self.enter(Duration::ZERO, false, sink, finished);
        }
        self.fail_dead_work(finished);
    }

    /// Withdraws work `id` if none of it has happened yet: a placement not
    /// being filled (one that is completes as placed), or a send none of
    /// whose bytes went out. A queued send leaves its link's queue; the
    /// send being written, if the kernel has not moved a byte of it, is
    /// cancelled, and `sent` finishes it as withdrawn if the cancel comes
    /// first. A SEND_ZC in flight is left alone (its notification must
    /// still come), and so is a send partly out: both end as they would
    /// have.
    fn withdraw(&mut self, id: u64, finished: &mut Vec<(u64, Outcome)>) {
        let mut cancel = None;
        for (link, l) in self.links.iter_mut().enumerate() {
            let Some(l) = l else { continue };
            if let Some(i) = l.targets.iter().position(|t| t.id == id) {
                l.targets.swap_remove(i);
                finished.push((id, Outcome::Withdrawn));
                return;
            }
            if let Some(i) = l.queue.iter().position(|r| r.id == id) {
                l.queue.remove(i);
                finished.push((id, Outcome::Withdrawn));
                return;
            }
            if !l
                .sending
                .as_ref()
                .is_some_and(|r| r.id == id && r.sent == 0)
            {
                continue;
            }
            if !l.send_in_flight {
                l.take_unsent();
                finished.push((id, Outcome::Withdrawn));
            } else if !l.send_zero_copy {
                l.withdrawing = true;
                cancel = Some(link);
            }
            break;
        }
        let Some(link) = cancel else { return };
        let entry = opcode::AsyncCancel::new(tag(SEND, link))
            .build()
            .user_data(tag(CANCEL, 0));
        // SAFETY: a cancel names no memory.
        if !unsafe { self.push(&entry) } {
            // No room in the ring: the send ends as it would have.
            self.links[link].as_mut().expect("link present").withdrawing = false;
        }
    }

    /// Puts `req` at the back of its link's queue, or fails it at once if
    /// the link is dead or unknown.
    fn take_send(&mut self, req: SendRequest, finished: &mut Vec<(u64, Outcome)>) {
        let link = req.link;
        match self.links.get_mut(link).and_then(|l| l.as_mut()) {
            Some(l) if l.send_failure().is_none() => {
                l.queue.push_back(req);
                self.touched.push(link);
            }
            Some(l) => finished.push((
                req.id,
                Outcome::Sent(Err(l.send_failure().cloned().unwrap_or_default())),
            )),
            None => finished.push((
                req.id,
                Outcome::Sent(Err(format!("link {link} is not connected"))),
            )),
        }
    }

    /// Outside a turn: queues `req` on its link and writes what the link's
    /// socket takes at once by plain `sendmsg` calls (`send_directly`),
    /// making no ring entry. Returns `req`'s outcome if it finished; if not,
    /// it waits in its link's queue for the next turn. Anything else that
    /// finished is left in `finished` for the caller to hand out. A small
    /// op's send then costs one system call and none of a turn's queue
    /// hand-over or polling set-up.
    pub(crate) fn send_now(&mut self, req: SendRequest) -> Option<Outcome> {
        let (id, link) = (req.id, req.link);
        let mut finished = std::mem::take(&mut self.finished);
        self.take_send(req, &mut finished);
        self.send_directly(link, &mut finished);
        let outcome = finished
            .iter()
            .position(|(done, _)| *done == id)
            .map(|i| finished.swap_remove(i).1);
        self.finished = finished;
        outcome
    }

    /// Whether no entry is in the ring (its last completion taken).
    pub(crate) fn nothing_in_flight(&self) -> bool {
        self.in_flight == 0
    }

    /// Withdraws every entry this thread's turns put in flight (receives,
    /// plain sends, the eventfd read) and waits, at most a second, until the
    /// kernel has finished them. Nothing is posted again: the next turn of
    /// whichever thread drives does that. Bytes a cancelled entry had moved
    /// are accounted as usual (see `received`), so no frame is torn.
    ///
    /// Why: the kernel runs an entry's completion work in the thread that
    /// submitted it, interrupting that thread's own timed system calls
    /// (EINTR) or, while it runs user code, leaving the completion until its
    /// next kernel entry. A thread that stops waiting on the engine (a
    /// caller whose op is done, an idle executor) must leave nothing behind.
    pub(crate) fn release(&mut self, sink: &dyn FrameSink) {
        let me = Some(std::thread::current().id());
        self.me = me;
        let mut finished = std::mem::take(&mut self.finished);
        let mut cancels = std::mem::take(&mut self.cancels);
        cancels.clear();
        for (link, l) in self.links.iter().enumerate() {
            let Some(l) = l else { continue };
            if l.recv_in_flight && l.recv_owner == me {
                cancels.push(tag(RECV, link));
            }
            // A SEND_ZC is left alone: its notification must still come.
            if l.send_in_flight && l.send_owner == me && !l.send_zero_copy {
                cancels.push(tag(SEND, link));
            }
            for (i, lane) in l.recv_lanes.iter().enumerate() {
                if lane.in_flight && lane.owner == me {
                    cancels.push(lane_tag(RECV, link, 1 + i));
                }
            }
            for lane in &l.send_lanes {
                if lane.in_flight && lane.owner == me && !lane.posted_zero_copy {
                    cancels.push(lane.posted);
                }
            }
        }
        if self.wake_in_flight && self.wake_owner == me {
            cancels.push(tag(WAKE, 0));
        }
        let mine = |d: &Driver, what: u64| {
            let (link, conn) = ((what >> 16) as usize, ((what >> 8) & 0xff) as usize);
            match what & KIND {
                WAKE => d.wake_in_flight && d.wake_owner == me,
                RECV => d.links[link].as_ref().is_some_and(|l| l.receiving(conn)),
                _ => d.links[link].as_ref().is_some_and(|l| l.sending_on(conn)),
            }
        };
        for &what in &cancels {
            let cancel = opcode::AsyncCancel::new(what)
                .build()
                .user_data(tag(CANCEL, 0));
            // SAFETY: a cancel names no memory.
            let _ = unsafe { self.push(&cancel) };
        }
        // A SEND_ZC's notification is completion work the kernel runs in
        // the thread that posted it, and this ring's (COOP_TASKRUN) does
        // not wake a thread asleep elsewhere for it: one that leaves with
        // notifications owed could hold their callers until it next enters
        // the kernel. It waits for them here, as for the cancels (0035).
        let owes_mine = |d: &Driver| {
            d.links.iter().flatten().any(|l| {
                (l.send_in_flight && l.send_zero_copy && l.send_owner == me)
                    || (d.lane_notifications > 0
                        && l.send_lanes.iter().any(|lane| {
                            (0..HEAD_SLOTS).any(|i| lane.slots.owes(i) && lane.zc_owners[i] == me)
                        }))
            })
        };
        let deadline = Instant::now() + Duration::from_secs(1);
        while (cancels.iter().any(|&what| mine(self, what)) || owes_mine(self) || self.wakes_owed())
            && Instant::now() < deadline
        {
            // Not `enter`: that would post the eventfd read anew.
            if self.ring.completion().is_empty() {
                self.sleep_in_kernel(Duration::from_millis(10));
            }
            self.reap(sink, &mut finished);
            self.touched.clear();
        }
        self.fail_dead_work(&mut finished);
        self.finished = finished;
        self.cancels = cancels;
    }

    fn post_wake(&mut self) {
        if self.wake_in_flight {
            return;
        }
        let entry = opcode::Read::new(
            types::Fd(self.wake_fd),
            (&mut *self.wake_word as *mut u64).cast::<u8>(),
            8,
        )
        .build()
        .user_data(tag(WAKE, 0));
        // SAFETY: `wake_word` is boxed and owned by the driver, which leaks
        // it rather than free it while this read is in flight (see `Drop`);
        // the eventfd is dropped after the driver (field order in
        // `FrameEngine`).
        if unsafe { self.push(&entry) } {
            self.wake_in_flight = true;
            self.wake_owner = self.me;
        }
    }

    /// Submits, and sleeps up to `wait` for a completion unless one is
    /// already there or work was queued meanwhile. Every kernel entry also
    /// runs this thread's pending completion work; entries are kept to one
    /// per call where possible (a small op's turn is a handful of system
    /// calls, each a few microseconds on a VM). With `direct`, links whose
    /// receive is not in flight are read directly while polling, and get
    /// their receive only before the driver sleeps.
    fn enter(
        &mut self,
        wait: Duration,
        direct: bool,
        sink: &dyn FrameSink,
        finished: &mut Vec<(u64, Outcome)>,
    ) {
        if !self.ring.completion().is_empty() {
            if !self.ring.submission().is_empty() {
                let _ = self.ring.submit();
            }
            return;
        }
        if wait.is_zero() || self.poked.load(Ordering::SeqCst) {
            // With nothing to submit and nothing in flight, entering the
            // kernel would take nothing in (a small op's send turn, whose
            // frame went out by `send_directly`).
            if !self.ring.submission().is_empty() || self.in_flight > 0 {
                let _ = self.ring.submit();
            }
            return;
        }
        if !self.spin.is_zero() {
            // Poll before sleeping, yielding the core between polls, so a
            // frame that lands within the spin is taken without a sleep
            // and a wake-up (decision 0008).
            let start = Instant::now();
            loop {
                // Completion work also runs on the way out of the yield and
                // the direct receives, so a poll that has nothing to submit
                // needs no `io_uring_enter` of its own.
                if !direct || !self.ring.submission().is_empty() {
                    let _ = self.ring.submit();
                }
                if !self.ring.completion().is_empty() || self.poked.load(Ordering::SeqCst) {
                    return;
                }
                if direct && self.receive_directly(sink, finished) {
                    return;
                }
                if start.elapsed() >= self.spin.min(wait) {
                    break;
                }
                crate::poll_yield();
            }
        }
        if direct {
            // Asleep, the driver learns of frames only from the ring.
            for link in 0..self.links.len() {
                let receive = !self.held_back(link, sink);
                self.post_entries(link, receive);
            }
        }
        // Only a driver asleep in the kernel needs the eventfd to learn of
        // queued work: posting its read here, not every turn, spares a
        // small op the read's arming and `release`'s cancel of it. A poke
        // that came before the read was posted left the counter set, so
        // the read completes at once.
        self.post_wake();
        self.sleep_in_kernel(wait);
    }

    /// Submits and sleeps up to `wait` for one completion.
    fn sleep_in_kernel(&mut self, wait: Duration) {
        let ts = types::Timespec::from(wait);
        let args = types::SubmitArgs::new().timespec(&ts);
        // ETIME: the wait ran out; EINTR: a signal; EBUSY: completions to
        // take first. Anything else leaves entries queued for the next turn.
        let _ = self.ring.submitter().submit_with_args(1, &args);
    }

    /// # Safety
    /// Memory `entry` names must stay valid until its completion is taken.
    unsafe fn push(&mut self, entry: &squeue::Entry) -> bool {
        if self.ring.submission().is_full() {
            let _ = self.ring.submit();
        }
        // SAFETY: the caller's contract, passed on.
        let pushed = unsafe { self.ring.submission().push(entry) }.is_ok();
        if pushed {
            self.in_flight += 1;
            self.pushed += 1;
        }
        pushed
    }

    /// What `Drop` sets if it had to leak (entries still in flight).
    #[cfg(test)]
    pub(crate) fn leak_flag(&self) -> Arc<AtomicBool> {
        self.leaked.clone()
    }

    /// Takes every completion there is; false if there was none.
    fn reap(&mut self, sink: &dyn FrameSink, finished: &mut Vec<(u64, Outcome)>) -> bool {
        let mut batch = std::mem::take(&mut self.completions);
        batch.clear();
        batch.extend(
            self.ring
                .completion()
                .map(|cqe| (cqe.user_data(), cqe.result(), cqe.flags())),
        );
        self.in_flight = settled(self.in_flight, batch.iter().map(|c| c.2));
        for &(user_data, result, flags) in &batch {
            let link = (user_data >> 16) as usize;
            let conn = ((user_data >> 8) & 0xff) as usize;
            let slot = ((user_data >> 4) & 0x0f) as usize;
            match (user_data & KIND, conn) {
                (WAKE, _) => self.wake_in_flight = false,
                (THREAD_WAKE, _) => {
                    if result < 0 {
                        tracing::warn!(result, "waking an engine thread failed");
                    }
                    self.wake_done(user_data);
                    continue; // it names no link
                }
                (RECV, 0) => self.received(link, result, sink, finished),
                (SEND, 0) => self.sent(link, result, flags, finished),
                (RECV, lane) => self.lane_received(link, lane - 1, result, sink, finished),
                (SEND, lane) => {
                    let done = (lane - 1, slot);
                    self.lane_sent(link, done, result, flags, finished)
                }
                _ => {}
            }
            if link < self.links.len() {
                self.touched.push(link);
            }
        }
        let any = !batch.is_empty();
        self.completions = batch;
        any
    }

    /// Marks `link` dead and shuts its socket down, which makes the kernel
    /// finish whatever is still in flight on it. Queued sends fail at the
    /// next turn; one in flight fails when its completion comes.
    fn fail(&mut self, link: usize, fault: LinkFault, sink: &dyn FrameSink) {
        let Some(l) = self.links.get_mut(link).and_then(|l| l.as_mut()) else {
            return;
        };
        if l.dead.is_some() {
            return;
        }
        l.dead = Some(match &fault {
            LinkFault::Closed => "the peer closed the connection".to_string(),
            LinkFault::Io(e) => e.to_string(),
            LinkFault::BadFrame(r) => r.clone(),
        });
        l.shut_down();
        // A shut-down socket still sends what it holds, from callers'
        // memory where it went zero-copy: those sockets are reset instead,
        // which drops what they hold and brings the notifications owed, so
        // their callers can be let go before they write that memory again
        // (and without waiting on a dead peer's acknowledgements).
        if l.send_in_flight && l.send_zero_copy {
            reset(&l.socket);
        }
        for lane in l.send_lanes.iter().filter(|lane| lane.slots.owed()) {
            reset(&lane.socket);
        }
        sink.link_failed(link, fault);
    }

    /// A send on `link` failed with `error`: the peer is gone, or the
    /// connection broke. Sends fail from now on, but the link's receiving
    /// side goes on until it ends, and only then does the link fail: a peer
    /// that finished its part and exited may have left frames in this
    /// socket that an op here still needs (another communicator's late
    /// send, or a heartbeat, meeting the closed socket first must not
    /// throw them away). The write side is shut down, so a peer that lives
    /// reads its end and closes too.
    pub(super) fn stop_sending(&mut self, link: usize, error: io::Error) {
        let Some(l) = self.links.get_mut(link).and_then(|l| l.as_mut()) else {
            return;
        };
        if l.send_failure().is_some() {
            return;
        }
        tracing::debug!(link, %error, "a send failed; reading what the peer sent before");
        l.send_error = Some(error.to_string());
        l.shut_down_sending();
        // Pieces whose SEND_ZC notifications a lane owes: a reset brings
        // them (lanes only send, so nothing is lost to reading).
        for lane in l.send_lanes.iter().filter(|lane| lane.slots.owed()) {
            reset(&lane.socket);
        }
        self.touched.push(link);
    }

    /// Work of failed links, failed: every send of a link that failed or
    /// whose sending stopped (`stop_sending`), and the receives of a link
    /// that failed. Called each turn so their callers are released.
    fn fail_dead_work(&mut self, finished: &mut Vec<(u64, Outcome)>) {
        for l in self.links.iter_mut().flatten() {
            if let Some(reason) = &l.dead {
                for t in l.targets.drain(..) {
                    finished.push((t.id, Outcome::Failed(reason.clone())));
                }
                // A caller's memory is let go only once no receive (on the
                // socket or a lane) can still write into it.
                let writing = l.recv_in_flight || l.lanes_receiving();
                let placing = matches!(
                    l.rx,
                    Rx::Placing { .. }
                        | Rx::Laned {
                            dest: Dest::Target(_),
                            ..
                        }
                );
                if !writing && placing {
                    match std::mem::replace(&mut l.rx, Rx::Staging) {
                        Rx::Placing { target, .. }
                        | Rx::Laned {
                            dest: Dest::Target(target),
                            ..
                        } => finished.push((target.id, Outcome::Failed(reason.clone()))),
                        _ => {}
                    }
                }
            }
            if let Some(reason) = l.send_failure().cloned() {
                for req in l.queue.drain(..) {
                    finished.push((req.id, Outcome::Sent(Err(reason.clone()))));
                }
                // Likewise a send's: not while its head or a piece is out,
                // nor while the kernel may still read a piece of it.
                let frame = l.spread.as_ref().map(|s| s.frame);
                let held = frame.is_some_and(|f| l.send_lanes.iter().any(|s| s.slots.holds(f)));
                if !l.send_in_flight && !l.lanes_sending() && !held {
                    l.spread = None;
                    if let Some(req) = l.sending.take() {
                        finished.push((req.id, Outcome::Sent(Err(reason.clone()))));
                    }
                }
                // Frames owed notifications once these came (`fail` and
                // `stop_sending` reset their lanes, which brings them).
                while let Some(req) = take_notified(&mut l.notified_later, &l.send_lanes) {
                    finished.push((req.id, Outcome::Sent(Err(reason.clone()))));
                }
            }
        }
    }
}

/// Entries still in flight after taking completions with these flags from
/// `in_flight`: each completion ends its entry, except one flagged "more"
/// (a SEND_ZC's result), whose entry stays until its notification. Counted
/// over the whole batch, since both can arrive in one.
fn settled(in_flight: usize, flags: impl Iterator<Item = u32>) -> usize {
    let (done, more) = flags.fold((0, 0), |(d, m), f| {
        (d + 1, m + usize::from(io_uring::cqueue::more(f)))
    });
    in_flight + more - done
}

impl Drop for Driver {
    fn drop(&mut self) {
        for l in self.links.iter().flatten() {
            l.shut_down();
        }
        if self.wake_in_flight {
            let cancel = opcode::AsyncCancel::new(tag(WAKE, 0))
                .build()
                .user_data(tag(CANCEL, 0));
            // SAFETY: a cancel names no memory.
            let _ = unsafe { self.push(&cancel) };
        }
        // Shut-down sockets finish their entries promptly; wait for them so
        // the buffers can be freed, but never forever.
        let deadline = Instant::now() + Duration::from_secs(1);
        while self.in_flight > self.wakes_in_flight() && Instant::now() < deadline {
            self.sleep_in_kernel(Duration::from_millis(50));
            self.settle_for_drop();
        }
        // Engine threads stop once what they submitted is done: after the
        // wait above, which needed them to pass completions on.
        for t in 0..self.threads.len() {
            self.threads[t].ask_to_stop();
            let wake = self.threads[t].wake_entry(tag(THREAD_WAKE, STOPPING_WAKER));
            // SAFETY: a message names no memory.
            if unsafe { self.push(&wake) } {
                self.stop_wakes += 1;
            }
        }
        let _ = self.ring.submit();
        for t in &mut self.threads {
            t.join();
        }
        // The wake messages' own completions (posted at submit), and any
        // the threads passed on while stopping: taken, or the count above
        // would leak the links for nothing.
        self.settle_for_drop();
        // Wakes name no memory: one whose completion is still owed (work
        // left to a thread that sent it, before Linux 6.11) leaks nothing.
        if self.in_flight > self.wakes_in_flight() {
            self.leaked.store(true, Ordering::SeqCst);
            // SAFETY-relevant: the kernel may still write into these, so
            // they must outlive it: leak them.
            std::mem::forget(std::mem::take(&mut self.links));
            std::mem::forget(std::mem::replace(&mut self.wake_word, Box::new(0)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::settled;

    const MORE: u32 = 1 << 1; // IORING_CQE_F_MORE
    const NOTIF: u32 = 1 << 3; // IORING_CQE_F_NOTIF

    #[test]
    fn a_zero_copy_send_settles_whether_its_two_completions_come_together_or_apart() {
        // One SEND_ZC in flight: its result ("more") and its notification
        // in one batch (the case that used to count below zero), or apart.
        assert_eq!(settled(1, [MORE, NOTIF].into_iter()), 0);
        let after_result = settled(1, [MORE].into_iter());
        assert_eq!(after_result, 1, "still in flight until the notification");
        assert_eq!(settled(after_result, [NOTIF].into_iter()), 0);
        // Plain completions each end their entry.
        assert_eq!(settled(3, [0, 0].into_iter()), 1);
    }
}
