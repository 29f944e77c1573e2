//! A framed-socket engine on one io_uring, driven by the threads that wait
//! on it.
//!
//! What: every link (a connected stream socket, registered as a fixed file)
//! always has one receive in flight, and at most one send (so bytes of two
//! frames never interleave on a socket). Frames are a fixed-size header and
//! a payload whose length the header announces; the [`FrameSink`] parses
//! headers and takes whole frames. Small frames are cut out of a per-link
//! staging buffer (one receive can carry many); a large payload is received
//! straight into its final buffer with `MSG_WAITALL`.
//!
//! Why no engine thread of its own: on the machines this is tuned for
//! (fewer cores than ranks' threads), a thread that only moves bytes between
//! the kernel and the executor costs a wake-up per frame, which is what the
//! portable transport already pays. Here the thread that waits for a frame
//! (or for its send to finish) *is* the engine: it sleeps in `io_uring_enter`
//! and the kernel wakes it with the completion. When several threads wait
//! (several communicators, the heartbeat), one drives at a time and the
//! others sleep on a condition variable until the driver ends its turn (an
//! eventcount: [`FrameEngine::generation`] then [`FrameEngine::progress`]).
//! A thread that queues work while another drives pokes an eventfd the ring
//! always reads, so the driver ends its turn and the work goes in promptly.
//! See docs/decisions/0007.

mod driver;
#[doc(hidden)]
pub mod fuzzing;
mod head_slots;
mod lanes;
mod placements;
pub(crate) mod shard;
mod shard_thread;

pub use placements::Placements;
pub use shard_thread::ThreadCounters;

use crate::AlignedBuf;
use driver::{DIRECT_SEND_BYTES, Driver};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Longest header an engine frames (bytes), with the pad a sender may put
/// between header and payload.
pub const MAX_HEADER: usize = 128;

/// Largest [`EngineConfig::frame_align`].
pub const MAX_FRAME_ALIGN: usize = 64;

/// Where a frame's payload is, as its header says: `pad` bytes after the
/// header, `len` bytes long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PayloadAt {
    /// Bytes between the header and the payload.
    pub pad: usize,
    /// The payload's length.
    pub len: usize,
}

/// What the engine needs from the protocol above it. Called by whichever
/// thread drives, outside the engine's own locks.
pub trait FrameSink {
    /// Where the payload a header announces is (its pad below
    /// [`EngineConfig::frame_align`]), or why the header is refused (the
    /// link is then failed with that reason).
    fn payload(&self, link: usize, header: &[u8]) -> Result<PayloadAt, String>;
    /// An empty buffer to receive a payload into (so the sink can pool them).
    fn buffer(&self) -> AlignedBuf;
    /// A whole frame arrived on `link`.
    fn frame(&self, link: usize, header: &[u8], payload: AlignedBuf);
    /// What identifies this frame for [`FrameEngine::receive_in_place`]
    /// (`None`: never placed, e.g. control frames).
    fn frame_key(&self, _link: usize, _header: &[u8]) -> Option<FrameKey> {
        None
    }
    /// Whether `link` is not to be read for now (its peer ran too far
    /// ahead). The engine then posts no new receive on it between frames
    /// (a frame begun is finished), posted placements or not: the sink
    /// must say false while a caller waits for a frame of the link.
    /// Call [`FrameEngine::notify`] when this turns false.
    fn paused(&self, _link: usize) -> bool {
        false
    }
    /// `link` is dead: the peer closed it, it was reset, or it sent a header
    /// [`FrameSink::payload`] refused.
    fn link_failed(&self, link: usize, fault: LinkFault);
}

/// Why the engine gave up on a link.
#[derive(Debug)]
pub enum LinkFault {
    /// The peer closed the connection (end of stream).
    Closed,
    /// A receive failed.
    Io(std::io::Error),
    /// The sink refused a header.
    BadFrame(String),
}

/// Sizes of an engine.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Links are numbered `0..links`.
    pub links: usize,
    /// Bytes of every frame header (at most [`MAX_HEADER`]).
    pub header_len: usize,
    /// Every frame ends with zeros up to a multiple of this many bytes (1:
    /// none; at most [`MAX_FRAME_ALIGN`]). The engine adds them to what it
    /// sends and skips them in what it receives; a sender's pad before the
    /// payload is part of the header it passes to [`FrameEngine::send`].
    pub frame_align: usize,
    /// Per-link staging buffer for small frames; payloads that do not fit
    /// are received in place.
    pub staging: usize,
    /// Sends of at least this many bytes try SEND_ZC, once per connection
    /// (a link's socket, each send lane) with a usage report: if the
    /// kernel copied anyway, that connection sends plainly from then on
    /// (a lane also stops where a later report says it copied). `None`:
    /// plain sends only.
    pub zero_copy_from: Option<usize>,
    /// Keep sending zero-copy where the kernel reports it copied. For
    /// tests: loopback always copies, and this drives the notification
    /// path there.
    pub zero_copy_always: bool,
    /// A driver polls this long for a completion before it sleeps. Worth it
    /// only while this process's waiting thread has a core to itself: zero
    /// when ranks outnumber cores.
    pub spin: Duration,
    /// Most lanes a link has each way ([`FrameEngine::add_link_with_lanes`]
    /// takes no more): each has a slot in the ring's file table.
    pub max_lanes: usize,
    /// Engine threads that lanes are dealt to (decision 0036): each owns a
    /// ring of its own and submits its lanes' sends and receives there, so
    /// their copies run on its core. 0: lanes run on the caller-driven
    /// ring. Where the kernel cannot run them (before Linux 6.3) the
    /// engine starts without, and says so.
    pub engine_threads: usize,
    /// The core each engine thread is pinned to, in order; threads past
    /// its end (all, if empty) are not pinned.
    pub thread_cores: Vec<usize>,
}

/// A link's lanes: connections to its peer that this end only writes
/// (`send`) and only reads (`recv`). Frames whose payload is at least
/// `from` bytes send their header on the link's socket and their payload
/// in pieces over the send lanes; the receiver takes the same rule to the
/// header it reads. Both ends of a link must use the same `from`, and each
/// end's `send` count must be the other's `recv` count.
pub struct Lanes {
    /// The lanes this end writes.
    pub send: Vec<SharedFd>,
    /// The lanes this end reads.
    pub recv: Vec<SharedFd>,
    /// Payloads of this many bytes and more go over the lanes.
    pub from: usize,
}

/// What one send lane of a link has carried, updated by the engine as it
/// goes (relaxed atomics: counters, not synchronisation).
#[derive(Debug, Default)]
pub struct LaneCounter {
    /// Bytes the kernel took on the lane (piece headers included).
    pub bytes: std::sync::atomic::AtomicU64,
    /// Pieces wholly sent on it.
    pub pieces: std::sync::atomic::AtomicU64,
    /// Bytes its socket held unacknowledged when last looked at (before
    /// a placement, with more than one lane): its queue depth.
    pub unacked: std::sync::atomic::AtomicU64,
    /// Sends by SEND_ZC (each owes a notification).
    pub zero_copy_sends: std::sync::atomic::AtomicU64,
    /// Notifications that said the kernel copied the bytes after all
    /// (loopback, veth, a NIC without the offload): the lane's fallbacks
    /// to plain sends.
    pub copied_sends: std::sync::atomic::AtomicU64,
    /// The lane's delivery rate (bytes/s) as placement last kept it: bytes
    /// acknowledged over the kernel's busy time of the lane, so not what
    /// the lane was fed (links with more than one TCP lane; 0: none yet).
    pub delivery_rate: std::sync::atomic::AtomicU64,
}

/// A link's send lanes' counters, in lane order.
pub type LaneCounters = Arc<[LaneCounter]>;

/// A link's lanes as queued for the driver, with the counters it keeps.
pub(crate) type LanesToInstall = (Lanes, LaneCounters);

/// A socket the engine shares with whoever handed it over: they keep a
/// clone to shut it down (which ends what is in flight on it) without a
/// duplicate descriptor, and it closes when both are done with it. A link
/// with lanes then costs three descriptors, not one per holder of each.
pub type SharedFd = Arc<OwnedFd>;

/// How a send ended.
pub type SendResult = Result<(), String>;

/// How [`FrameEngine::send`] ended.
#[derive(Debug)]
pub enum Sent<S> {
    /// The kernel took the whole frame.
    Out,
    /// `stop` answered while none of the frame had gone out: the engine
    /// withdrew it, and the link carries on as if it had never been asked.
    Stopped(S),
    /// The link failed (or `on_stall` shut it down).
    Failed(String),
}

/// Identifies one expected frame (the sink derives it from a header).
pub type FrameKey = [u64; 3];

/// How [`FrameEngine::receive_in_place`] ended.
#[derive(Debug)]
pub enum Placement<S> {
    /// The frame is in the caller's memory; its header.
    Placed([u8; MAX_HEADER]),
    /// `stop` asked to stop before the frame came (or it went elsewhere).
    Stopped(S),
    /// The link failed first.
    Failed(String),
}

/// A caller's memory waiting for one frame. Its caller stays inside
/// [`FrameEngine::receive_in_place`] or [`FrameEngine::with_placements`]
/// until the engine reports the placement finished, which is what keeps
/// `ptr` valid for the kernel.
pub(crate) struct PlaceRequest {
    pub(crate) id: u64,
    pub(crate) link: usize,
    pub(crate) key: FrameKey,
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
}

/// How work the driver took ended.
pub(crate) enum Outcome {
    Sent(SendResult),
    Placed([u8; MAX_HEADER]),
    Withdrawn,
    Failed(String),
}

/// A send the driver has not finished: its bytes (borrowed or owned), and
/// how far it got.
pub(crate) struct SendRequest {
    pub(crate) id: u64,
    pub(crate) link: usize,
    pub(crate) head: [u8; MAX_HEADER],
    pub(crate) head_len: usize,
    pub(crate) body: Body,
    /// Zeros after the body, up to a whole frame; for a laned send, after
    /// the head (the lanes carry the body alone).
    pub(crate) tail: usize,
    pub(crate) sent: usize,
    /// The head and its zeros go on the link's socket, the body in pieces
    /// on its send lanes (set by the driver when the send starts).
    pub(crate) laned: bool,
}

pub(crate) enum Body {
    /// Memory of a caller blocked in [`FrameEngine::send`] until the send
    /// completes; `driver` is the only module that dereferences it.
    Borrowed { ptr: *const u8, len: usize },
    /// A control frame the engine owns until it is sent.
    Owned(Vec<u8>),
}

impl SendRequest {
    pub(crate) fn body_len(&self) -> usize {
        match &self.body {
            Body::Borrowed { len, .. } => *len,
            Body::Owned(v) => v.len(),
        }
    }

    pub(crate) fn total(&self) -> usize {
        self.head_len + self.body_len() + self.tail
    }

    /// The head and the zeros after it: what a laned send puts on the
    /// link's socket before its body goes on the lane.
    pub(crate) fn lead(&self) -> usize {
        self.head_len + self.tail
    }

    /// Where the bytes for the link's socket end: a laned send puts only
    /// its head and zeros there.
    pub(crate) fn main_end(&self) -> usize {
        match self.laned {
            true => self.lead(),
            false => self.total(),
        }
    }
}

/// Work queued for the next driver turn.
#[derive(Default)]
pub(crate) struct Queued {
    pub(crate) links: Vec<(usize, SharedFd, Option<LanesToInstall>)>,
    pub(crate) sends: Vec<SendRequest>,
    pub(crate) placements: Vec<PlaceRequest>,
    pub(crate) withdrawals: Vec<u64>,
}

struct State {
    /// Bumped at the end of every driver turn and by [`FrameEngine::notify`].
    generation: u64,
    /// Some thread holds the driver (and may sleep in the kernel).
    driving: bool,
    next_id: u64,
    queued: Queued,
    /// Finished borrowed sends and placements, collected by their callers.
    done: Vec<(u64, Outcome)>,
    /// Owned (control) sends not yet finished.
    owned_pending: usize,
    /// Threads asleep on `turn_ended` (a notify with none is a wasted
    /// system call, and turns end several times per op).
    sleepers: usize,
}

/// The engine: one ring, its links, and the turn-taking between the threads
/// that drive it.
pub struct FrameEngine {
    state: Mutex<State>,
    turn_ended: Condvar,
    driver: Mutex<Driver>,
    wake: nix::sys::eventfd::EventFd,
    /// Shared with the driver: see `Driver::poked`.
    poked: Arc<AtomicBool>,
    /// Whether the ring had nothing in flight when the last turn ended:
    /// then `release` has nothing to withdraw, and a small op's end skips
    /// its locks and turn.
    quiet: AtomicBool,
    fixed_files: bool,
    /// Each engine thread's counters (empty: none run).
    thread_counters: Vec<Arc<ThreadCounters>>,
    /// Storage of [`FrameEngine::with_placements`], kept for reuse.
    spare_placements: Mutex<Vec<placements::Posted>>,
    frame_align: usize,
}

/// The zeros that round a frame of `len` bytes up to a multiple of `align`.
pub(crate) fn tail_len(len: usize, align: usize) -> usize {
    (align - len % align) % align
}

/// How long an unwinding caller waits for the kernel to let go of its
/// request's memory before the process aborts instead.
const UNWIND_LIMIT: Duration = Duration::from_secs(30);

/// A request whose memory (a send's payload, a placement's destination) the
/// kernel may still read or write. Disarmed by [`InFlight::done`] once its
/// outcome is taken; dropped armed (only by a panic unwinding past the
/// caller: a `stop` or `on_stall` closure, a sink, the driver), it
/// withdraws the request and drives the engine until the kernel is done
/// with it, so the caller's buffer is never freed under the kernel. If that
/// does not happen within [`UNWIND_LIMIT`] the process aborts: memory the
/// kernel may still write must not be handed back.
struct InFlight<'a> {
    engine: &'a FrameEngine,
    id: u64,
    sink: &'a dyn FrameSink,
    armed: bool,
}

impl<'a> InFlight<'a> {
    fn new(engine: &'a FrameEngine, id: u64, sink: &'a dyn FrameSink) -> InFlight<'a> {
        InFlight {
            engine,
            id,
            sink,
            armed: true,
        }
    }

    /// The request's outcome was taken: the kernel is done with its memory.
    fn done(mut self) {
        self.armed = false;
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        {
            let mut st = lock(&self.engine.state);
            st.queued.withdrawals.push(self.id);
            self.engine.poke_if_driving(&st);
        }
        let limit = Instant::now() + UNWIND_LIMIT;
        // Withdrawn, finished or failed: whichever, the kernel is done with
        // the memory once the outcome is in.
        while let Err(seen) = self.engine.take_done(self.id) {
            if Instant::now() >= limit {
                eprintln!(
                    "ringwire-uring: a panic left request {} with the kernel for {UNWIND_LIMIT:?}; \
                     aborting rather than freeing memory the kernel may still use",
                    self.id
                );
                std::process::abort();
            }
            self.engine
                .progress(seen, Instant::now() + MAX_TURN, self.sink);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How long a stopped send's withdrawal may take before `give_up` applies.
const WITHDRAWAL_GRACE: Duration = Duration::from_secs(1);

/// A driver turn never sleeps longer than this, so a stuck turn cannot hide
/// queued work for long even if a poke were lost.
/// (The engine's own tests make it long, so a lost wake-up shows as a
/// stall instead of hiding behind the cap.)
const MAX_TURN: Duration = if cfg!(test) {
    Duration::from_secs(10)
} else {
    Duration::from_millis(200)
};

impl FrameEngine {
    /// Sets up a ring sized for `config.links` links.
    pub fn new(config: EngineConfig) -> std::io::Result<FrameEngine> {
        assert!(config.header_len > 0 && config.header_len <= MAX_HEADER);
        assert!(config.frame_align > 0 && config.frame_align <= MAX_FRAME_ALIGN);
        let wake = nix::sys::eventfd::EventFd::from_flags(
            nix::sys::eventfd::EfdFlags::EFD_CLOEXEC | nix::sys::eventfd::EfdFlags::EFD_NONBLOCK,
        )?;
        let poked = Arc::new(AtomicBool::new(false));
        let driver = Driver::new(&config, &wake, poked.clone())?;
        let fixed_files = driver.uses_fixed_files();
        let thread_counters = driver.thread_counters();
        Ok(FrameEngine {
            state: Mutex::new(State {
                generation: 0,
                driving: false,
                next_id: 1,
                queued: Queued::default(),
                done: Vec::new(),
                owned_pending: 0,
                sleepers: 0,
            }),
            turn_ended: Condvar::new(),
            driver: Mutex::new(driver),
            wake,
            poked,
            quiet: AtomicBool::new(false),
            fixed_files,
            thread_counters,
            spare_placements: Mutex::default(),
            frame_align: config.frame_align,
        })
    }

    /// Whether links are registered as fixed files (kernel support varies).
    pub fn uses_fixed_files(&self) -> bool {
        self.fixed_files
    }

    /// The counters of each engine thread that runs
    /// ([`EngineConfig::engine_threads`]; empty where none do).
    pub fn thread_counters(&self) -> &[Arc<ThreadCounters>] {
        &self.thread_counters
    }

    /// Set once the engine is dropped if its driver had to leak memory
    /// entries still named (their completions never came).
    #[cfg(test)]
    pub(crate) fn leak_flag(&self) -> Arc<AtomicBool> {
        self.look(Driver::leak_flag)
    }

    /// Whether receive lane `lane` of `link` has read its end (ends the
    /// current driver's turn early and takes a turn of its own).
    #[cfg(test)]
    pub(crate) fn recv_lane_ended(&self, link: usize, lane: usize) -> bool {
        self.look(|driver| driver.recv_lane_ended(link, lane))
    }

    /// What `f` reads of the driver, in a turn of its own once no other
    /// thread drives (as `release`: a driver asleep in the kernel is woken).
    /// Locking the driver instead would lose, again and again, to the
    /// driving thread's next turn.
    fn look<R>(&self, f: impl FnOnce(&Driver) -> R) -> R {
        loop {
            let st = lock(&self.state);
            if !st.driving {
                let mut seen = None;
                self.drive(st, |driver| seen = Some(f(driver)));
                return seen.expect("`drive` runs its closure");
            }
            self.poke_if_driving(&st);
            self.sleep(st, MAX_TURN);
        }
    }

    /// Links whose zero-copy probe has run: `(link, true)` if SEND_ZC sends
    /// in place on it, `false` if the kernel copied (or refused) and the
    /// link sends plainly. Ends a driver's turn early and takes one.
    pub fn zero_copy_links(&self) -> Vec<(usize, bool)> {
        self.look(Driver::zero_copy)
            .into_iter()
            .filter_map(|(link, zc)| match zc {
                driver::ZeroCopy::On => Some((link, true)),
                driver::ZeroCopy::Off => Some((link, false)),
                _ => None,
            })
            .collect()
    }

    /// Hands a connected socket to the engine as `link`. Its receives start
    /// with the next driver turn.
    pub fn add_link(&self, link: usize, socket: SharedFd) {
        let mut st = lock(&self.state);
        st.queued.links.push((link, socket, None));
        self.poke_if_driving(&st);
    }

    /// As [`FrameEngine::add_link`], for a link with lanes: more
    /// connections to the same peer, each carrying bytes one way only, that
    /// take the payloads of large frames (see [`Lanes`]). A socket written
    /// by both ends at once makes each end's sends process the other's
    /// arriving data under the socket's lock; one-way lanes keep bulk data
    /// off that path (docs/decisions/0018), and several spread a link's
    /// payloads over more TCP streams, each piece to the lane with the
    /// fewest bytes yet to deliver (0034).
    ///
    /// Returns the send lanes' counters, which the engine keeps current.
    pub fn add_link_with_lanes(&self, link: usize, socket: SharedFd, lanes: Lanes) -> LaneCounters {
        let counters: LaneCounters = (0..lanes.send.len())
            .map(|_| LaneCounter::default())
            .collect();
        let mut st = lock(&self.state);
        st.queued
            .links
            .push((link, socket, Some((lanes, counters.clone()))));
        self.poke_if_driving(&st);
        counters
    }

    /// The current generation; read it *before* checking a condition, then
    /// pass it to [`FrameEngine::progress`] so no wake-up is lost.
    pub fn generation(&self) -> u64 {
        lock(&self.state).generation
    }

    /// Wakes every waiter to re-check its condition (something outside the
    /// engine changed: an abort, a failed link, a new link).
    pub fn notify(&self) {
        let mut st = lock(&self.state);
        st.generation += 1;
        self.poke_if_driving(&st);
        self.wake_sleepers(st);
    }

    /// Sleeps until a turn ends (or `wait` passes).
    fn sleep(&self, mut st: MutexGuard<'_, State>, wait: Duration) {
        st.sleepers += 1;
        let mut st = self
            .turn_ended
            .wait_timeout(st, wait)
            .map_or_else(|e| e.into_inner().0, |r| r.0);
        st.sleepers -= 1;
    }

    fn wake_sleepers(&self, st: MutexGuard<'_, State>) {
        let any = st.sleepers > 0;
        drop(st);
        if any {
            self.turn_ended.notify_all();
        }
    }

    fn poke_if_driving(&self, st: &State) {
        if st.driving {
            self.poked.store(true, Ordering::SeqCst);
            // A full counter (never here: the driver reads it every time it
            // sleeps) would only mean a wake-up is already pending.
            let _ = self.wake.write(1);
        }
    }

    /// Makes progress until something may have changed since `seen`: drives
    /// one turn if no other thread does (sleeping in the kernel until a
    /// completion arrives, at most until `until`), or else waits for the
    /// current driver's turn to end.
    pub fn progress(&self, seen: u64, until: Instant, sink: &dyn FrameSink) {
        let st = lock(&self.state);
        if st.generation != seen {
            return;
        }
        if st.driving {
            let wait = until
                .saturating_duration_since(Instant::now())
                .min(MAX_TURN);
            self.sleep(st, wait);
            return;
        }
        let wait = until
            .saturating_duration_since(Instant::now())
            .min(MAX_TURN);
        self.turn(st, wait, sink);
    }

    /// Drives one turn without sleeping, if no other thread is driving:
    /// submits queued work and takes in what has completed. For threads
    /// that do not wait on the engine themselves (the heartbeat).
    pub fn tick(&self, sink: &dyn FrameSink) {
        let st = lock(&self.state);
        if !st.driving {
            self.turn(st, Duration::ZERO, sink);
        }
    }

    /// Withdraws what the calling thread's turns left in flight, so the
    /// kernel never runs completion work in it once it returns to code that
    /// is not ringwire's (see `Driver::release`). Call it when a thread
    /// stops waiting on the engine. Waits for another driver's turn to end.
    pub fn release(&self, sink: &dyn FrameSink) {
        // Entries are made only in turns, and every turn sets `quiet` as it
        // ends: if it is set, the caller's last turn left nothing in flight.
        // (A turn another thread is driving now may have made entries it
        // has not reported yet; they are that thread's to withdraw.)
        if self.quiet.load(Ordering::Acquire) {
            return;
        }
        loop {
            let st = lock(&self.state);
            if !st.driving {
                self.drive(st, |driver| driver.release(sink));
                return;
            }
            self.poke_if_driving(&st);
            self.sleep(st, MAX_TURN);
        }
    }

    /// One driver turn; `st` must show nobody driving. Queues are swapped,
    /// not re-made, so a steady stream of sends allocates nothing.
    fn turn(&self, st: MutexGuard<'_, State>, wait: Duration, sink: &dyn FrameSink) {
        self.drive(st, |driver| {
            let mut work = std::mem::take(&mut driver.spare);
            {
                let mut st = lock(&self.state);
                std::mem::swap(&mut work, &mut st.queued);
                // Pokes until now are answered by this turn taking the work.
                self.poked.store(false, Ordering::SeqCst);
            }
            driver.turn(&mut work, wait, sink);
            driver.spare = work;
        });
    }

    /// Runs `f` with the driver (`st` must show nobody driving), then hands
    /// out what finished and ends the turn.
    fn drive(&self, mut st: MutexGuard<'_, State>, f: impl FnOnce(&mut Driver)) {
        /// Ends the turn if the driver panics, so the other waiters see the
        /// panic's effects (or take over) instead of sleeping forever on a
        /// turn that never ends.
        struct Unwinding<'a>(&'a FrameEngine);
        impl Drop for Unwinding<'_> {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    let mut st = lock(&self.0.state);
                    st.driving = false;
                    st.generation += 1;
                    self.0.wake_sleepers(st);
                }
            }
        }
        st.driving = true;
        drop(st);
        let _unwinding = Unwinding(self);
        let mut driver = lock(&self.driver);
        f(&mut driver);
        self.quiet
            .store(driver.nothing_in_flight(), Ordering::Release);
        let mut st = lock(&self.state);
        for (id, outcome) in driver.finished.drain(..) {
            match id {
                0 => st.owned_pending -= 1,
                _ => st.done.push((id, outcome)),
            }
        }
        st.driving = false;
        st.generation += 1;
        drop(driver);
        self.wake_sleepers(st);
    }

    /// Sends one frame (`header` then `payload`, then zeros up to
    /// [`EngineConfig::frame_align`]) on `link` and returns when the kernel
    /// has taken all of it.
    ///
    /// `stop` is asked on every wake-up, and at `stop_by` at the latest.
    /// Once it answers, a frame none of which has gone out is withdrawn
    /// (from the link's queue, or by cancelling its send if the kernel has
    /// not moved a byte of it yet) and the call returns `Stopped`: the link
    /// stays whole. A frame partly out cannot be taken back; the call then
    /// waits on as if `stop` had not answered. If the frame is still not
    /// out by `give_up` (or a second after `stop` answered, if that is
    /// later: a withdrawal takes a turn), `on_stall` runs once (it should shut the link
    /// down, which makes the kernel finish the send with an error). Either
    /// way the call returns only once the kernel is done with `payload`.
    #[allow(clippy::too_many_arguments)]
    pub fn send<S>(
        &self,
        link: usize,
        header: &[u8],
        payload: &[u8],
        give_up: Instant,
        on_stall: &mut dyn FnMut(),
        sink: &dyn FrameSink,
        stop_by: Instant,
        stop: &mut dyn FnMut() -> Option<S>,
    ) -> Sent<S> {
        let mut head = [0u8; MAX_HEADER];
        head[..header.len()].copy_from_slice(header);
        let tail = tail_len(header.len() + payload.len(), self.frame_align);
        let request = |id| SendRequest {
            id,
            link,
            head,
            head_len: header.len(),
            body: Body::Borrowed {
                ptr: payload.as_ptr(),
                len: payload.len(),
            },
            tail,
            sent: 0,
            laned: false,
        };
        let sent = |outcome: Option<Outcome>| match outcome {
            Some(Outcome::Sent(Ok(()))) => Some(Sent::Out),
            Some(Outcome::Sent(Err(reason))) => Some(Sent::Failed(reason)),
            Some(_) => Some(Sent::Failed("the engine mixed up its work".into())),
            None => None,
        };
        // Declared before the state lock, so that an unwind drops the lock
        // first and the guard can take it.
        let in_flight;
        let id = {
            let mut st = lock(&self.state);
            let id = st.next_id;
            st.next_id += 1;
            in_flight = InFlight::new(self, id, sink);
            // A small frame with nothing queued before it and no turn
            // running goes out from here, without the queue and a turn.
            let small = header.len() + payload.len() + tail <= DIRECT_SEND_BYTES;
            if small && !st.driving && st.queued.sends.is_empty() && st.queued.links.is_empty() {
                let mut outcome = None;
                self.drive(st, |driver| outcome = driver.send_now(request(id)));
                if let Some(done) = sent(outcome) {
                    in_flight.done();
                    return done; // else it waits on its link's queue for the next turn
                }
            } else {
                st.queued.sends.push(request(id));
                self.poke_if_driving(&st);
            }
            id
        };
        let result = self.await_send(id, give_up, on_stall, sink, stop_by, stop, sent);
        in_flight.done();
        result
    }

    /// The rest of [`FrameEngine::send`]: waits for send `id`'s outcome.
    #[allow(clippy::too_many_arguments)]
    fn await_send<S>(
        &self,
        id: u64,
        mut give_up: Instant,
        on_stall: &mut dyn FnMut(),
        sink: &dyn FrameSink,
        stop_by: Instant,
        stop: &mut dyn FnMut() -> Option<S>,
        sent: impl Fn(Option<Outcome>) -> Option<Sent<S>>,
    ) -> Sent<S> {
        let mut stalled = false;
        let mut stopped = None;
        loop {
            let seen = match self.take_done(id) {
                Ok(Outcome::Withdrawn) => match stopped.take() {
                    Some(s) => return Sent::Stopped(s),
                    None => return Sent::Failed("the engine withdrew a send unasked".into()),
                },
                Ok(outcome) => return sent(Some(outcome)).expect("an outcome"),
                Err(generation) => generation,
            };
            if stopped.is_none()
                && !stalled
                && let Some(s) = stop()
            {
                stopped = Some(s);
                // The withdrawal needs a turn: `give_up` (often just
                // after `stop_by`) must not shut the link meanwhile.
                give_up = give_up.max(Instant::now() + WITHDRAWAL_GRACE);
                let mut st = lock(&self.state);
                st.queued.withdrawals.push(id);
                self.poke_if_driving(&st);
                continue;
            }
            let now = Instant::now();
            let until = if stalled {
                now + MAX_TURN
            } else if now >= give_up {
                stalled = true;
                on_stall();
                continue;
            } else if stopped.is_none() && now < stop_by {
                stop_by.min(give_up)
            } else {
                give_up
            };
            self.progress(seen, until, sink);
        }
    }

    /// Waits for the frame `key` on `link` and receives its payload straight
    /// into `dest` if it is exactly `dest.len()` bytes (a frame that arrived
    /// before the call went to the sink as usual). `stop` is asked on every
    /// wake-up; once it answers, the engine withdraws the request, and the
    /// call returns `Stopped` unless the frame was being received already.
    /// Either way it returns only once the kernel no longer writes to
    /// `dest`.
    pub fn receive_in_place<S>(
        &self,
        link: usize,
        key: FrameKey,
        dest: &mut [u8],
        until: Instant,
        sink: &dyn FrameSink,
        stop: &mut dyn FnMut() -> Option<S>,
    ) -> Placement<S> {
        let id = self.queue(|st, id| {
            st.queued.placements.push(PlaceRequest {
                id,
                link,
                key,
                ptr: dest.as_mut_ptr(),
                len: dest.len(),
            })
        });
        self.await_placement(id, until, sink, stop)
    }

    /// Waits for placement `id` as [`FrameEngine::receive_in_place`]
    /// describes; returns only once the kernel no longer writes to its
    /// memory.
    fn await_placement<S>(
        &self,
        id: u64,
        until: Instant,
        sink: &dyn FrameSink,
        stop: &mut dyn FnMut() -> Option<S>,
    ) -> Placement<S> {
        let in_flight = InFlight::new(self, id, sink);
        let placed = self.placement_outcome(id, until, sink, stop);
        in_flight.done();
        placed
    }

    /// The loop of [`FrameEngine::await_placement`].
    fn placement_outcome<S>(
        &self,
        id: u64,
        until: Instant,
        sink: &dyn FrameSink,
        stop: &mut dyn FnMut() -> Option<S>,
    ) -> Placement<S> {
        let mut stopped = None;
        loop {
            let seen = match (self.take_done(id), stopped) {
                (Ok(Outcome::Placed(head)), _) => return Placement::Placed(head),
                (Ok(_), Some(s)) => return Placement::Stopped(s),
                (Ok(Outcome::Failed(reason)), None) => return Placement::Failed(reason),
                (Ok(_), None) => return Placement::Failed("the engine mixed up its work".into()),
                (Err(generation), s) => {
                    stopped = s;
                    generation
                }
            };
            if stopped.is_none()
                && let Some(s) = stop()
            {
                stopped = Some(s);
                let mut st = lock(&self.state);
                st.queued.withdrawals.push(id);
                self.poke_if_driving(&st);
                continue;
            }
            let until = if stopped.is_some() {
                Instant::now() + MAX_TURN
            } else {
                until
            };
            self.progress(seen, until, sink);
        }
    }

    /// Queues work under a fresh id (`push` adds it to the queue) and wakes
    /// the driver if one sleeps.
    fn queue(&self, push: impl FnOnce(&mut State, u64)) -> u64 {
        let mut st = lock(&self.state);
        let id = st.next_id;
        st.next_id += 1;
        push(&mut st, id);
        self.poke_if_driving(&st);
        id
    }

    /// The outcome of work `id` if it is done, else the generation to wait
    /// past (read under the same lock, so no wake-up is lost).
    fn take_done(&self, id: u64) -> Result<Outcome, u64> {
        let mut st = lock(&self.state);
        match st.done.iter().position(|(d, _)| *d == id) {
            Some(i) => Ok(st.done.swap_remove(i).1),
            None => Err(st.generation),
        }
    }

    /// Queues a control frame (whole, header included; zeros are added up
    /// to [`EngineConfig::frame_align`]) on `link`; it goes out with the
    /// next driver turn. [`FrameEngine::flush`] waits for it. It always
    /// goes whole on the link's socket, so its payload must be shorter than
    /// the link's [`Lanes::from`] (a receiver reads a longer one's payload
    /// from the lanes).
    pub fn send_owned(&self, link: usize, frame: Vec<u8>) {
        let tail = tail_len(frame.len(), self.frame_align);
        let mut st = lock(&self.state);
        st.owned_pending += 1;
        st.queued.sends.push(SendRequest {
            id: 0,
            link,
            head: [0; MAX_HEADER],
            head_len: 0,
            body: Body::Owned(frame),
            tail,
            sent: 0,
            laned: false,
        });
        self.poke_if_driving(&st);
    }

    /// Waits (driving if needed, at most until `until`) until every control
    /// frame queued so far has been sent or has failed.
    pub fn flush(&self, until: Instant, sink: &dyn FrameSink) {
        loop {
            let seen = {
                let st = lock(&self.state);
                if st.owned_pending == 0 {
                    return;
                }
                st.generation
            };
            if Instant::now() >= until {
                return;
            }
            self.progress(seen, until, sink);
        }
    }
}

#[cfg(test)]
mod tests;
