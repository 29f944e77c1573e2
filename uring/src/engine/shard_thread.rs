//! Engine threads (decision 0036): each owns one shard ring (`shard.rs`)
//! and submits there the entries of the lanes dealt to it.
//!
//! The caller-driven driver (decision 0007) still decides everything: it
//! places pieces, builds each lane's send and receive entries as before,
//! and *hands* them to the lane's thread instead of pushing them to its own
//! ring. The thread submits them on its ring, so the kernel copies the
//! bytes, and runs a socket's retries, on the thread's core, not the
//! waiting caller's. Every completion is passed on whole (result and flags)
//! into the driver's ring by MSG_RING, where the driver takes it exactly as
//! if it had submitted the entry itself: the lanes' bookkeeping (slots,
//! notifications, placement, counters) stays in one place, on one thread at
//! a time, and needs no locks.
//!
//! Waking: a message (MSG_RING) from the driver's ring, submitted with
//! the rest of the driver's turn. Its own completion in the driver's ring
//! may be completion work the kernel leaves to the caller thread that
//! submitted it (before Linux 6.11), so a caller that leaves the engine
//! waits for the wakes it sent (`Driver::release`). An eventfd the thread's
//! ring polls measured no better and costs a system call (decision 0036).
//!
//! Memory: an entry names driver memory or a parked caller's, and the
//! driver keeps it valid until the entry's last completion reaches its own
//! ring, as for its own entries. A thread stops only when the driver has
//! taken every completion it waited for, or, past a deadline, abandons its
//! ring; the driver then leaks what is still named (its `Drop`).
#![allow(unsafe_code)]

use super::shard::{Completion, ShardIo, shard_ring};
use io_uring::{opcode, squeue, types};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What one engine thread has done, updated as it goes (relaxed atomics:
/// counters, not synchronisation).
#[derive(Debug, Default)]
pub struct ThreadCounters {
    /// The core it is pinned to, plus one (0: not pinned).
    pub core: AtomicU64,
    /// Entries it submitted (lanes' sends and receives).
    pub entries: AtomicU64,
    /// Bytes those entries moved (sent or received; piece headers too).
    pub bytes: AtomicU64,
    /// Completions it passed on to the driver.
    pub completions: AtomicU64,
    /// Times it woke from waiting on its ring.
    pub wakeups: AtomicU64,
    /// CPU nanoseconds the thread has used, user and system: its busy
    /// time. (Time outside its waits would not be: with DEFER_TASKRUN the
    /// kernel copies a socket's bytes inside the wait, as system time.)
    pub cpu_ns: AtomicU64,
}

/// `user_data` of the message that says "entries handed" (in the
/// thread's ring). The driver's own `user_data`s stay below bit 56.
const INBOX: u64 = 1 << 62;
/// Bit of a forwarding message's own `user_data` (the rest: its slot).
const FORWARD: u64 = 1 << 63;

/// How long a thread with nothing to do waits before it looks at its inbox
/// and stop flag unasked (the driver wakes it for both; this is a
/// backstop). Tests wait longer than they would for anything, so a wake
/// that is lost fails them rather than being covered.
const IDLE_WAIT: Duration = if cfg!(test) {
    Duration::from_secs(60)
} else {
    Duration::from_millis(200)
};
/// How long a stopping thread waits for entries still in flight.
const STOP_WAIT: Duration = Duration::from_secs(2);
/// How long a thread whose ring failed it waits before it tries again
/// (an error that lasts must not become a spinning core).
const AFTER_ERROR: Duration = Duration::from_millis(1);

struct Shared {
    /// Entries handed over and not yet submitted.
    inbox: Mutex<Vec<squeue::Entry>>,
    stop: AtomicBool,
    counters: Arc<ThreadCounters>,
}

/// An engine thread and what the driver needs to reach it.
pub(crate) struct EngineThread {
    shared: Arc<Shared>,
    /// The thread's ring, by a descriptor of the driver's own: the ring
    /// outlives the thread while the driver may still message it (the
    /// number could otherwise name another file, or ring, once the thread
    /// closed its own).
    ring: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

impl EngineThread {
    /// Starts thread `index`, pinned to `core` if given, with a ring of
    /// `entries`; it passes completions on to the ring of descriptor
    /// `driver_ring`. Fails where the kernel refuses the ring's flags or
    /// cannot pass completion flags through MSG_RING (before Linux 6.3).
    pub(crate) fn start(
        index: usize,
        driver_ring: RawFd,
        entries: u32,
        core: Option<usize>,
    ) -> io::Result<EngineThread> {
        let shared = Arc::new(Shared {
            inbox: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            counters: Arc::default(),
        });
        let (ready, ring) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(format!("ringwire-engine-{index}"))
            .spawn({
                let shared = shared.clone();
                move || run(&shared, driver_ring, entries, core, ready)
            })?;
        match ring.recv() {
            Ok(Ok(ring)) => Ok(EngineThread {
                shared,
                ring,
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(io::Error::other("an engine thread ended while starting"))
            }
        }
    }

    pub(crate) fn counters(&self) -> Arc<ThreadCounters> {
        self.shared.counters.clone()
    }

    /// Moves `entries` (emptied) to the thread; it submits them once
    /// woken by `wake_entry`'s message.
    ///
    /// # Safety
    /// Memory each entry names must stay valid until the entry's last
    /// completion has been taken from the driver's ring.
    pub(crate) unsafe fn hand(&self, entries: &mut Vec<squeue::Entry>) {
        let mut inbox = self.shared.inbox.lock().unwrap_or_else(|p| p.into_inner());
        inbox.append(entries);
    }

    /// The driver's entry that wakes the thread (a message into its ring);
    /// its own completion in the driver's ring carries `user_data`.
    pub(crate) fn wake_entry(&self, user_data: u64) -> squeue::Entry {
        opcode::MsgRingData::new(types::Fd(self.ring.as_raw_fd()), 0, INBOX, None)
            .build()
            .user_data(user_data)
    }

    /// Asks the thread to stop once nothing it submitted is in flight
    /// (wake it after, with `wake_entry`).
    pub(crate) fn ask_to_stop(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
    }

    /// Waits for the thread to end (`ask_to_stop` first).
    pub(crate) fn join(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for EngineThread {
    fn drop(&mut self) {
        self.ask_to_stop();
        self.join();
    }
}

/// The thread: set up, then serve until stopped.
fn run(
    shared: &Shared,
    driver_ring: RawFd,
    entries: u32,
    core: Option<usize>,
    ready: mpsc::Sender<io::Result<OwnedFd>>,
) {
    if let Some(core) = core
        && pin_to(core)
    {
        shared
            .counters
            .core
            .store(core as u64 + 1, Ordering::Relaxed);
    }
    let mut ring = match shard_ring(entries) {
        Ok(ring) => ring,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    // SAFETY: the descriptor is `ring`'s, open for as long as `ring`
    // lives in this frame, which outlasts the borrow (cloned at once).
    let ring_fd = unsafe { BorrowedFd::borrow_raw(ring.as_raw_fd()) };
    let ring_for_driver = match ring_fd.try_clone_to_owned() {
        Ok(fd) => fd,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let mut io = ShardIo::new(&mut ring);
    if let Err(e) = passes_flags(&mut io) {
        let _ = ready.send(Err(e));
        return;
    }
    tracing::debug!(
        core,
        registered_fd = io.registered_fd(),
        "an engine thread runs"
    );
    if ready.send(Ok(ring_for_driver)).is_err() {
        return;
    }
    // A panic here (a bug) would close the ring under entries that name
    // callers' memory, the kernel still writing, while the driver waits
    // for their completions forever: nothing sound is left to do.
    let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        serve(&mut io, driver_ring, shared)
    }));
    if served.is_err() {
        tracing::error!("an engine thread panicked with entries in flight; aborting");
        eprintln!("ringwire: an engine thread panicked with entries in flight; aborting");
        std::process::abort();
    }
}

/// Pins the calling thread to `core`; false if the kernel refused.
fn pin_to(core: usize) -> bool {
    let mut set = nix::sched::CpuSet::new();
    set.set(core).is_ok()
        && nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).is_ok()
}

/// Whether a message carries completion flags through (IORING_MSG_RING_
/// FLAGS_PASS, Linux 6.3+): the driver reads a SEND_ZC's "more" and
/// "notification" flags off the completions passed on to it.
fn passes_flags(io: &mut ShardIo<'_>) -> io::Result<()> {
    const HELLO: u64 = INBOX | 1;
    const FLAGS: u32 = 1 << 3;
    io.forward(io.fd(), (HELLO, 7, FLAGS), FORWARD)?;
    let until = Instant::now() + Duration::from_secs(5);
    let mut got = Vec::new();
    while Instant::now() < until {
        io.wait(Duration::from_millis(100), &mut got)?;
        for &(user_data, result, flags) in &got {
            match user_data {
                FORWARD if result < 0 => return Err(io::Error::from_raw_os_error(-result)),
                HELLO if (result, flags) == (7, FLAGS) => return Ok(()),
                HELLO => return Err(io::Error::other("MSG_RING dropped a completion's flags")),
                _ => {}
            }
        }
        got.clear();
    }
    Err(io::Error::other("a message to its own ring never came"))
}

/// Completions being passed on, by slot (the forwarding message's
/// `user_data` names it), kept until delivered so a failed delivery can
/// be retried.
#[derive(Default)]
struct InTransit {
    slots: Vec<Option<Completion>>,
    free: Vec<usize>,
    len: usize,
}

impl InTransit {
    fn add(&mut self, c: Completion) -> u64 {
        self.len += 1;
        match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(c);
                i as u64
            }
            None => {
                self.slots.push(Some(c));
                (self.slots.len() - 1) as u64
            }
        }
    }

    /// The completion in slot `i`, taken out.
    fn take(&mut self, i: usize) -> Option<Completion> {
        let c = self.slots.get_mut(i)?.take()?;
        self.free.push(i);
        self.len -= 1;
        Some(c)
    }
}

/// The thread's loop: submit what was handed over, wait, pass every
/// completion on; until asked to stop with nothing left in flight.
fn serve(io: &mut ShardIo<'_>, driver_ring: RawFd, shared: &Shared) {
    let counters = &shared.counters;
    // Handed entries whose last completion has not come.
    let mut outstanding = 0usize;
    let mut handed = Vec::new();
    let mut got = Vec::new();
    let mut in_transit = InTransit::default();
    let mut retry: Vec<Completion> = Vec::new();
    let mut stopping: Option<Instant> = None;
    loop {
        std::mem::swap(
            &mut *shared.inbox.lock().unwrap_or_else(|p| p.into_inner()),
            &mut handed,
        );
        for entry in handed.drain(..) {
            // SAFETY: `EngineThread::hand`'s contract: what the entry names
            // stays valid until its last completion reaches the driver,
            // which is after this ring gave it up.
            match unsafe { io.push(&entry) } {
                Ok(()) => {
                    outstanding += 1;
                    counters.entries.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    // The ring takes entries whatever its queue holds
                    // (SUBMIT_ALL, a submit before a retry): this is a
                    // ring that no longer works. The driver learns of it
                    // as the entry's failure.
                    tracing::error!(error = %e, "an engine thread could not submit");
                    let failed = (entry.get_user_data(), -libc::EIO, 0);
                    pass_on(io, driver_ring, failed, &mut in_transit, &mut retry);
                }
            }
        }
        if !retry.is_empty() {
            // What failed may fail again at once: not in a tight loop.
            std::thread::sleep(AFTER_ERROR);
        }
        for c in std::mem::take(&mut retry) {
            pass_on(io, driver_ring, c, &mut in_transit, &mut retry);
        }
        if shared.stop.load(Ordering::SeqCst) {
            let since = *stopping.get_or_insert_with(Instant::now);
            let all_passed = outstanding == 0 && in_transit.len == 0 && retry.is_empty();
            if all_passed || since.elapsed() > STOP_WAIT {
                if outstanding > 0 {
                    tracing::warn!(
                        outstanding,
                        "an engine thread stopped with entries in flight"
                    );
                }
                return;
            }
        }
        counters.cpu_ns.store(thread_cpu_ns(), Ordering::Relaxed);
        let wait = match stopping {
            Some(_) => Duration::from_millis(10),
            None => IDLE_WAIT,
        };
        if let Err(e) = io.wait(wait, &mut got) {
            tracing::error!(error = %e, "an engine thread's wait failed");
            std::thread::sleep(AFTER_ERROR);
        }
        counters.wakeups.fetch_add(1, Ordering::Relaxed);
        let mut passed = 0u64;
        for c in got.drain(..) {
            let (user_data, result, flags) = c;
            if user_data == INBOX {
                continue;
            }
            if user_data & FORWARD != 0 {
                let delivered = in_transit.take((user_data & !FORWARD) as usize);
                if let Some(lost) = delivered.filter(|_| result < 0) {
                    tracing::warn!(result, "passing a completion on failed; again");
                    retry.push(lost);
                }
                continue;
            }
            // A SEND_ZC's first completion says "more": its entry is in
            // flight until the notification.
            if !io_uring::cqueue::more(flags) {
                outstanding = outstanding.saturating_sub(1);
            }
            if result > 0 && !io_uring::cqueue::notif(flags) {
                counters.bytes.fetch_add(result as u64, Ordering::Relaxed);
            }
            passed += 1;
            pass_on(io, driver_ring, c, &mut in_transit, &mut retry);
        }
        counters.completions.fetch_add(passed, Ordering::Relaxed);
    }
}

/// Queues `c`'s message to the driver's ring, kept in `in_transit` until
/// delivered; one that cannot even be queued waits in `retry` (never
/// dropped: the driver would wait on it forever). A SEND_ZC's notification
/// waits there too while its entry's result does, so the driver takes them
/// in order. (Messages queued together are delivered in order; a delivery
/// that fails, which the kernel does only where it cannot post at all,
/// is retried, and a notification queued behind it may overtake it.)
fn pass_on(
    io: &mut ShardIo<'_>,
    driver_ring: RawFd,
    c: Completion,
    in_transit: &mut InTransit,
    retry: &mut Vec<Completion>,
) {
    if io_uring::cqueue::notif(c.2) && retry.iter().any(|r| r.0 == c.0) {
        retry.push(c);
        return;
    }
    let slot = in_transit.add(c);
    if let Err(e) = io.forward(driver_ring, c, FORWARD | slot) {
        tracing::error!(error = %e, "an engine thread could not pass a completion on");
        in_transit.take(slot as usize);
        retry.push(c);
    }
}

/// CPU time of the calling thread, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID).map_or(0, |t| {
        t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use io_uring::IoUring;
    use std::io::Read;

    const MORE: u32 = 1 << 1; // IORING_CQE_F_MORE
    const NOTIF: u32 = 1 << 3; // IORING_CQE_F_NOTIF

    /// Takes completions off `ring` until `want` of them came (10 s at most).
    fn take(ring: &mut IoUring, want: usize) -> Vec<Completion> {
        let until = Instant::now() + Duration::from_secs(10);
        let mut got = Vec::new();
        while got.len() < want {
            assert!(Instant::now() < until, "only {got:?} in 10 s");
            let ts = types::Timespec::from(Duration::from_millis(50));
            let args = types::SubmitArgs::new().timespec(&ts);
            let _ = ring.submitter().submit_with_args(1, &args);
            got.extend(
                ring.completion()
                    .map(|c| (c.user_data(), c.result(), c.flags())),
            );
        }
        got
    }

    /// Asks `t` to stop, wakes it from `ring` and waits for it (as the
    /// driver's `Drop` does; unwoken, it would wait out its idle wait).
    fn stop(mut t: EngineThread, ring: &mut IoUring) {
        t.ask_to_stop();
        hand_and_wake(&t, ring, Vec::new());
        t.join();
    }

    /// Hands `entries` to `t` and wakes it from `ring`.
    fn hand_and_wake(t: &EngineThread, ring: &mut IoUring, mut entries: Vec<squeue::Entry>) {
        // SAFETY: the tests keep what the entries name until their
        // completions came back.
        unsafe { t.hand(&mut entries) };
        let wake = t.wake_entry(99);
        // SAFETY: a message names no memory.
        unsafe { ring.submission().push(&wake) }.unwrap();
        ring.submit().unwrap();
    }

    #[test]
    fn a_thread_submits_what_it_is_handed_and_passes_each_completion_on_whole() {
        // The driver's side is a plain ring, as the driver's is. A SEND_ZC
        // completes twice (its result flagged "more", then a notification):
        // both must arrive with their flags, after a NOP's.
        let mut ring = IoUring::builder().setup_coop_taskrun().build(16).unwrap();
        let t = EngineThread::start(0, ring.as_raw_fd(), 16, None).unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut b, _) = listener.accept().unwrap();
        let bytes = vec![5u8; 100_000];
        let send = opcode::SendZc::new(types::Fd(a.as_raw_fd()), bytes.as_ptr(), 100_000)
            .build()
            .user_data(7);
        let nop = opcode::Nop::new().build().user_data(42);
        hand_and_wake(&t, &mut ring, vec![nop, send]);
        let reader = std::thread::spawn(move || {
            let mut got = vec![0u8; 100_000];
            b.read_exact(&mut got).unwrap();
            got
        });
        let mut got = take(&mut ring, 4);
        got.sort_by_key(|c| (c.0, c.2));
        assert_eq!(got[0], (7, 100_000, MORE), "{got:?}");
        assert_eq!((got[1].0, got[1].2), (7, NOTIF), "{got:?}");
        assert_eq!(got[2], (42, 0, 0), "{got:?}");
        assert_eq!(got[3], (99, 0, 0), "the wake's own completion: {got:?}");
        assert!(reader.join().unwrap() == bytes);
        let c = t.counters();
        assert_eq!(c.entries.load(Ordering::Relaxed), 2);
        assert_eq!(c.completions.load(Ordering::Relaxed), 3);
        assert_eq!(c.bytes.load(Ordering::Relaxed), 100_000);
        assert!(c.cpu_ns.load(Ordering::Relaxed) > 0);
        stop(t, &mut ring);
    }

    #[test]
    fn a_thread_asked_to_stop_waits_for_what_is_in_flight() {
        // A receive that nothing answers yet: the thread stays until the
        // socket ends it, passes that on, and only then stops.
        let mut ring = IoUring::builder().setup_coop_taskrun().build(16).unwrap();
        let mut t = EngineThread::start(0, ring.as_raw_fd(), 16, None).unwrap();
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut buf = [0u8; 64];
        let recv = opcode::Recv::new(types::Fd(a.as_raw_fd()), buf.as_mut_ptr(), 64)
            .build()
            .user_data(3);
        hand_and_wake(&t, &mut ring, vec![recv]);
        assert_eq!(take(&mut ring, 1), vec![(99, 0, 0)]);
        t.ask_to_stop();
        hand_and_wake(&t, &mut ring, Vec::new());
        assert_eq!(take(&mut ring, 1), vec![(99, 0, 0)]);
        std::thread::sleep(Duration::from_millis(100));
        assert!(ring.completion().is_empty(), "the receive still waits");
        assert!(!t.thread.as_ref().unwrap().is_finished());
        drop(b);
        assert_eq!(take(&mut ring, 1), vec![(3, 0, 0)], "end of stream");
        t.join();
        assert_eq!(buf, [0u8; 64]);
    }

    #[test]
    fn a_notification_waits_behind_its_send_result_when_that_waits_for_a_retry() {
        // The result of SEND_ZC 7 could not be queued and waits in
        // `retry`: its notification queues behind it, while another
        // entry's completion goes on; once the result goes, so can it.
        let mut driver = IoUring::builder().setup_coop_taskrun().build(16).unwrap();
        let mut ring = shard_ring(8).unwrap();
        let mut io = ShardIo::new(&mut ring);
        let (mut in_transit, mut retry) = (InTransit::default(), vec![(7, 4096, MORE)]);
        let fd = driver.as_raw_fd();
        pass_on(&mut io, fd, (7, 0, NOTIF), &mut in_transit, &mut retry);
        pass_on(&mut io, fd, (8, 10, 0), &mut in_transit, &mut retry);
        assert_eq!(retry, vec![(7, 4096, MORE), (7, 0, NOTIF)]);
        for c in std::mem::take(&mut retry) {
            pass_on(&mut io, fd, c, &mut in_transit, &mut retry);
        }
        assert!(retry.is_empty());
        io.submit().unwrap();
        let got = take(&mut driver, 3);
        assert_eq!(got, vec![(8, 10, 0), (7, 4096, MORE), (7, 0, NOTIF)]);
    }

    #[test]
    fn a_wake_after_the_thread_ended_still_names_its_ring() {
        // The driver holds a descriptor of its own for the thread's ring:
        // the number cannot come to name another file once the thread
        // closed its ring, and a late wake lands in the ring unread.
        let mut ring = IoUring::builder().setup_coop_taskrun().build(8).unwrap();
        let mut t = EngineThread::start(0, ring.as_raw_fd(), 8, None).unwrap();
        t.ask_to_stop();
        hand_and_wake(&t, &mut ring, Vec::new());
        t.join();
        assert_eq!(take(&mut ring, 1), vec![(99, 0, 0)]);
        hand_and_wake(&t, &mut ring, Vec::new());
        assert_eq!(take(&mut ring, 1), vec![(99, 0, 0)], "the ring is gone");
    }

    #[test]
    fn a_thread_pinned_to_a_core_says_which() {
        let mut ring = IoUring::new(8).unwrap();
        let core = *crate::usable_core_ids().last().unwrap();
        let t = EngineThread::start(0, ring.as_raw_fd(), 8, Some(core)).unwrap();
        assert_eq!(t.counters().core.load(Ordering::Relaxed), core as u64 + 1);
        stop(t, &mut ring);
    }
}
