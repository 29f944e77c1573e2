//! `PendingCollective`: the handle every collective returns at once.
//!
//! It is runtime-agnostic: a mutex-protected slot plus a condvar (for
//! `wait`) and a stored waker (for `.await` under any executor). Whoever
//! runs the op (the communicator's executor thread, or a thread blocked in
//! `wait`, see `runner`) fills the slot exactly once.
//!
//! Dropping a `PendingCollective` before it completes *detaches* it: the op
//! still runs to the end on the communicator's executor (so the ranks stay in
//! step and the next op is not desynchronised), and the buffer it owns is
//! dropped by the executor when the op ends. Nothing is cancelled mid-wire,
//! nothing leaks, and nothing waits for the handle.

use crate::error::Error;
use crate::runner::Help;
use crate::wire::OpKind;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

enum Slot<R> {
    Running(Option<Waker>),
    Done(Result<R, Error>),
    Taken,
}

struct Shared<R> {
    slot: Mutex<Slot<R>>,
    done: Condvar,
    /// Threads asleep on `done`; changed and read under `slot`'s lock.
    sleepers: AtomicUsize,
    /// How long `wait` polls before it sleeps.
    spin: Duration,
}

impl<R> Shared<R> {
    fn lock(&self) -> MutexGuard<'_, Slot<R>> {
        // A poisoned lock only means a panic elsewhere while holding it; the
        // slot itself is always in a valid state.
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The executor's end: completes the matching [`PendingCollective`] once.
/// Dropped without completing (a job that never ran because the communicator
/// shut down), it completes the handle with [`Error::ShutDown`], so no
/// waiter is left hanging.
pub(crate) struct Completer<R> {
    shared: Option<Arc<Shared<R>>>,
    op: OpKind,
}

impl<R> Completer<R> {
    pub(crate) fn complete(mut self, result: Result<R, Error>) {
        if let Some(shared) = self.shared.take() {
            fill(&shared, result);
        }
    }
}

impl<R> Drop for Completer<R> {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            fill(&shared, Err(Error::ShutDown(self.op)));
        }
    }
}

fn fill<R>(shared: &Shared<R>, result: Result<R, Error>) {
    let (waker, sleepers) = {
        let mut slot = shared.lock();
        let waker = match std::mem::replace(&mut *slot, Slot::Done(result)) {
            Slot::Running(waker) => waker,
            _ => None,
        };
        (waker, shared.sleepers.load(Relaxed))
    };
    if sleepers > 0 {
        shared.done.notify_all();
    }
    if let Some(w) = waker {
        w.wake();
    }
}

/// The result of a collective that is still running. Await it, [`wait`] for
/// it from a plain thread, or poll [`is_completed`].
///
/// [`wait`]: PendingCollective::wait
/// [`is_completed`]: PendingCollective::is_completed
#[must_use = "a collective runs anyway, but its result (and buffer) is lost unless awaited"]
pub struct PendingCollective<R> {
    shared: Arc<Shared<R>>,
    /// The queue the op waits in, so `wait` can run it (see `runner`).
    helper: Option<Arc<dyn Help>>,
}

impl<R> std::fmt::Debug for PendingCollective<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingCollective")
            .field("completed", &self.is_completed())
            .finish()
    }
}

pub(crate) fn pending<R>(op: OpKind) -> (PendingCollective<R>, Completer<R>) {
    pending_in(op, Duration::ZERO, None)
}

/// A handle for an op queued in `helper`, whose `wait` runs queued jobs
/// while nobody else does and polls for `spin` before it sleeps.
pub(crate) fn pending_in<R>(
    op: OpKind,
    spin: Duration,
    helper: Option<Arc<dyn Help>>,
) -> (PendingCollective<R>, Completer<R>) {
    let shared = Arc::new(Shared {
        slot: Mutex::new(Slot::Running(None)),
        done: Condvar::new(),
        sleepers: Default::default(),
        spin,
    });
    (
        PendingCollective {
            shared: shared.clone(),
            helper,
        },
        Completer {
            shared: Some(shared),
            op,
        },
    )
}

impl<R> PendingCollective<R> {
    /// A handle that is already complete.
    pub(crate) fn ready(result: Result<R, Error>) -> PendingCollective<R> {
        let (p, c) = pending(OpKind::None);
        c.complete(result);
        p
    }

    /// True once the result is available (`wait` will not block).
    pub fn is_completed(&self) -> bool {
        let done = self.done();
        if !done {
            self.kick();
        }
        done
    }

    /// Makes sure the executor runs the op soon, for callers that poll
    /// instead of waiting.
    fn kick(&self) {
        if let Some(helper) = &self.helper {
            helper.kick();
        }
    }

    /// Blocks the calling thread until the collective ends. The collective's
    /// own timeout bounds the wait.
    ///
    /// If the op (or an op submitted before it on the same communicator)
    /// has not started yet, the calling thread runs it itself, which saves
    /// the hand-offs to and from the communicator's executor thread; it
    /// polls briefly (`RINGWIRE_SPIN_US`) before sleeping.
    pub fn wait(self) -> Result<R, Error> {
        self.help_then_poll(self.shared.spin);
        let mut slot = self.shared.lock();
        loop {
            match std::mem::replace(&mut *slot, Slot::Taken) {
                Slot::Done(r) => return r,
                Slot::Taken => return Err(Error::ResultTaken),
                running @ Slot::Running(_) => {
                    *slot = running;
                    self.shared.sleepers.fetch_add(1, Relaxed);
                    slot = self
                        .shared
                        .done
                        .wait(slot)
                        .unwrap_or_else(|e| e.into_inner());
                    self.shared.sleepers.fetch_sub(1, Relaxed);
                }
            }
        }
    }

    /// Runs queued jobs of the op's communicator on this thread while none
    /// runs elsewhere (this op's and any before it), then polls for the
    /// `spin`; returns when the op is done or sleeping is all that is left.
    /// See `runner` for why.
    fn help_then_poll(&self, spin: Duration) {
        let Some(helper) = &self.helper else {
            return;
        };
        let mut helped = false;
        let mut progress = || {
            while !self.done() && helper.help() {
                helped = true;
            }
            self.done().then_some(())
        };
        if progress().is_none() {
            crate::spin::poll_for(spin, &mut progress);
        }
        if helped {
            helper.done_helping();
        }
    }

    fn done(&self) -> bool {
        !matches!(*self.shared.lock(), Slot::Running(_))
    }

    /// Waits at most `timeout`; `None` if the collective is still running (the
    /// handle stays usable), `Some(result)` once it ended. Unlike `wait`,
    /// it never runs the op on this thread (that could outlast `timeout`):
    /// it makes sure the executor has it.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<Result<R, Error>> {
        let deadline = Instant::now() + timeout;
        self.kick();
        crate::spin::poll_for(self.shared.spin.min(timeout), || self.done().then_some(()));
        let mut slot = self.shared.lock();
        loop {
            match std::mem::replace(&mut *slot, Slot::Taken) {
                Slot::Done(r) => return Some(r),
                Slot::Taken => return Some(Err(Error::ResultTaken)),
                running @ Slot::Running(_) => {
                    *slot = running;
                    let now = Instant::now();
                    if now >= deadline {
                        return None;
                    }
                    self.shared.sleepers.fetch_add(1, Relaxed);
                    slot = self
                        .shared
                        .done
                        .wait_timeout(slot, deadline - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                    self.shared.sleepers.fetch_sub(1, Relaxed);
                }
            }
        }
    }
}

impl<R> Future for PendingCollective<R> {
    type Output = Result<R, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut slot = self.shared.lock();
        match std::mem::replace(&mut *slot, Slot::Taken) {
            Slot::Done(r) => Poll::Ready(r),
            Slot::Taken => Poll::Ready(Err(Error::ResultTaken)),
            Slot::Running(_) => {
                *slot = Slot::Running(Some(cx.waker().clone()));
                drop(slot);
                self.kick();
                Poll::Pending
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completes_across_threads_for_wait_and_await() {
        let (p, c) = pending::<u32>(OpKind::Barrier);
        assert!(!p.is_completed());
        let t = std::thread::spawn(move || c.complete(Ok(7)));
        assert_eq!(p.wait().unwrap(), 7);
        t.join().unwrap();

        let (p, c) = pending::<u32>(OpKind::Barrier);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            c.complete(Ok(9));
        });
        assert_eq!(futures::executor::block_on(p).unwrap(), 9);
        t.join().unwrap();
    }

    #[test]
    fn wait_timeout_keeps_the_handle_usable() {
        let (mut p, c) = pending::<u32>(OpKind::Barrier);
        assert!(p.wait_timeout(Duration::from_millis(5)).is_none());
        c.complete(Ok(3));
        assert!(p.is_completed());
        assert_eq!(p.wait_timeout(Duration::ZERO).unwrap().unwrap(), 3);
        assert!(matches!(
            p.wait_timeout(Duration::ZERO),
            Some(Err(Error::ResultTaken))
        ));
    }

    #[test]
    fn a_dropped_completer_ends_the_wait() {
        let (p, c) = pending::<u32>(OpKind::AllReduce);
        drop(c);
        assert!(matches!(p.wait(), Err(Error::ShutDown(OpKind::AllReduce))));
    }

    #[test]
    fn completing_a_dropped_handle_is_harmless() {
        let (p, c) = pending::<Vec<u8>>(OpKind::Barrier);
        drop(p);
        c.complete(Ok(vec![1, 2, 3]));
    }
}
