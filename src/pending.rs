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
use crate::runner::{Help, Job, Runnable};
use crate::wire::OpKind;
use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::{AcqRel, Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
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
    fn new(spin: Duration) -> Shared<R> {
        Shared {
            slot: Mutex::new(Slot::Running(None)),
            done: Condvar::new(),
            sleepers: Default::default(),
            spin,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Slot<R>> {
        // A poisoned lock only means a panic elsewhere while holding it; the
        // slot itself is always in a valid state.
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What a handle and a completer hold: the slot, in a cell that may also
/// carry the op's queued work (see [`OpCell`]).
trait HoldsSlot<R>: Send + Sync {
    fn shared(&self) -> &Shared<R>;
    /// One of the cell's holders is done with it.
    fn let_go(self: Arc<Self>);
}

/// A bare slot, for handles completed by other means than a queued job
/// (the rendezvous thread, argument checks).
impl<R: Send> HoldsSlot<R> for Shared<R> {
    fn shared(&self) -> &Shared<R> {
        self
    }

    fn let_go(self: Arc<Self>) {}
}

/// The executor's end: completes the matching [`PendingCollective`] once.
/// Dropped without completing (a job that never ran because the communicator
/// shut down), it completes the handle with [`Error::ShutDown`], so no
/// waiter is left hanging.
pub(crate) struct Completer<R> {
    shared: Option<Arc<dyn HoldsSlot<R>>>,
    op: OpKind,
}

impl<R> Completer<R> {
    pub(crate) fn complete(mut self, result: Result<R, Error>) {
        if let Some(shared) = self.shared.take() {
            fill(shared.shared(), result);
        }
    }
}

impl<R> Drop for Completer<R> {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            fill(shared.shared(), Err(Error::ShutDown(self.op)));
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

/// Cells kept for reuse by one communicator, so an op on owned buffers
/// allocates nothing in steady state: its handle's slot and its queued work
/// share one allocation ([`OpCell`]), returned here when both the handle
/// and the queue are done with it. Cells are typed by the op's result and
/// work; the pool keeps a few of each kind it has seen.
pub(crate) struct CellPool {
    cells: Mutex<Vec<Arc<dyn Any + Send + Sync>>>,
}

/// Cells a pool keeps at most (a handful per kind of op a program submits).
const POOLED_CELLS: usize = 32;

impl CellPool {
    pub(crate) fn new() -> Arc<CellPool> {
        Arc::new(CellPool {
            cells: Mutex::new(Vec::with_capacity(POOLED_CELLS)),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Arc<dyn Any + Send + Sync>>> {
        self.cells.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A pooled cell of type `T` that nothing else holds any more.
    fn take<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        let mut cells = self.lock();
        // Unique: the last holder's `Arc` may still be on its way out.
        let i = cells
            .iter()
            .position(|c| c.is::<T>() && Arc::strong_count(c) == 1)?;
        cells.swap_remove(i).downcast::<T>().ok()
    }

    fn put(&self, cell: Arc<dyn Any + Send + Sync>) {
        let mut cells = self.lock();
        if cells.len() < POOLED_CELLS {
            cells.push(cell);
        }
    }
}

/// One queued op: its handle's slot and the work that fills it, in one
/// allocation that the handle and the runner's queue share.
struct OpCell<R, W> {
    shared: Shared<R>,
    work: Mutex<Option<W>>,
    op: OpKind,
    /// The handle and the queued job; the last to let go pools the cell.
    holders: AtomicUsize,
    pool: Weak<CellPool>,
}

impl<R: Send + 'static, W: Send + 'static> HoldsSlot<R> for OpCell<R, W> {
    fn shared(&self) -> &Shared<R> {
        &self.shared
    }

    fn let_go(self: Arc<Self>) {
        if self.holders.fetch_sub(1, AcqRel) != 1 {
            return;
        }
        // A detached op's result (its buffer) must not wait in the pool.
        *self.shared.lock() = Slot::Taken;
        if let Some(pool) = self.pool.upgrade() {
            pool.put(self);
        }
    }
}

impl<C, R, W> Runnable<C> for OpCell<R, W>
where
    R: Send + 'static,
    W: FnOnce(&C) -> Result<R, Error> + Send + 'static,
{
    fn run(&self, context: &C) {
        let work = self.work.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(work) = work else { return };
        /// Fails the handle if the work panics, so no waiter hangs.
        struct Unwinding<'a, R>(&'a Shared<R>, OpKind);
        impl<R> Drop for Unwinding<'_, R> {
            fn drop(&mut self) {
                fill(self.0, Err(Error::ShutDown(self.1)));
            }
        }
        let guard = Unwinding(&self.shared, self.op);
        let result = work(context);
        std::mem::forget(guard);
        fill(&self.shared, result);
    }

    fn abandon(&self) {
        let work = self.work.lock().unwrap_or_else(|e| e.into_inner()).take();
        if work.is_some() {
            fill(&self.shared, Err(Error::ShutDown(self.op)));
        }
    }

    fn let_go(self: Arc<Self>) {
        HoldsSlot::let_go(self);
    }
}

/// The result of a collective that is still running. Await it, [`wait`] for
/// it from a plain thread, or poll [`is_completed`].
///
/// The op runs whether or not anyone waits: dropping the handle detaches it
/// (its buffer is freed when it ends), so every rank stays in step. Its
/// timeout is the communicator's (see [`Communicator::with_timeout`]).
///
/// ```no_run
/// # use ringwire::{Communicator, ReduceOp};
/// # async fn step(comm: &Communicator, grads: Vec<f32>) -> Result<Vec<f32>, ringwire::Error> {
/// let pending = comm.all_reduce(grads, ReduceOp::Avg);
/// while !pending.is_completed() {
///     // ... compute something else ...
/// #   break;
/// }
/// let grads = pending.await?; // or pending.wait()? from a plain thread
/// # Ok(grads)
/// # }
/// ```
///
/// [`wait`]: PendingCollective::wait
/// [`is_completed`]: PendingCollective::is_completed
/// [`Communicator::with_timeout`]: crate::Communicator::with_timeout
#[must_use = "a collective runs anyway, but its result (and buffer) is lost unless awaited"]
pub struct PendingCollective<R> {
    cell: Option<Arc<dyn HoldsSlot<R>>>,
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

impl<R> Drop for PendingCollective<R> {
    fn drop(&mut self) {
        if let Some(cell) = self.cell.take() {
            cell.let_go();
        }
    }
}

/// A handle and the completer that fills it (no queued work).
pub(crate) fn pending<R: Send + 'static>(op: OpKind) -> (PendingCollective<R>, Completer<R>) {
    let shared: Arc<dyn HoldsSlot<R>> = Arc::new(Shared::new(Duration::ZERO));
    (
        PendingCollective {
            cell: Some(shared.clone()),
            helper: None,
        },
        Completer {
            shared: Some(shared),
            op,
        },
    )
}

/// A handle for `work` and the job that runs it, queued in `helper`:
/// the handle's `wait` runs queued jobs while nobody else does and polls
/// for `spin` before it sleeps. The two share a cell from `pool` when one
/// of this kind is free (no allocation), else a new one.
pub(crate) fn queued<C, R, W>(
    op: OpKind,
    spin: Duration,
    helper: Arc<dyn Help>,
    pool: &Arc<CellPool>,
    work: W,
) -> (PendingCollective<R>, Job<C>)
where
    R: Send + 'static,
    W: FnOnce(&C) -> Result<R, Error> + Send + 'static,
{
    let cell = match pool.take::<OpCell<R, W>>() {
        Some(mut cell) => {
            let fresh = Arc::get_mut(&mut cell).expect("pooled cells are unique");
            *fresh
                .shared
                .slot
                .get_mut()
                .unwrap_or_else(|e| e.into_inner()) = Slot::Running(None);
            fresh.shared.spin = spin;
            *fresh.work.get_mut().unwrap_or_else(|e| e.into_inner()) = Some(work);
            fresh.op = op;
            *fresh.holders.get_mut() = 2;
            cell
        }
        None => Arc::new(OpCell {
            shared: Shared::new(spin),
            work: Mutex::new(Some(work)),
            op,
            holders: AtomicUsize::new(2),
            pool: Arc::downgrade(pool),
        }),
    };
    (
        PendingCollective {
            cell: Some(cell.clone()),
            helper: Some(helper),
        },
        Job::new(cell),
    )
}

impl<R: Send + 'static> PendingCollective<R> {
    /// A handle that is already complete.
    pub(crate) fn ready(result: Result<R, Error>) -> PendingCollective<R> {
        let (p, c) = pending(OpKind::None);
        c.complete(result);
        p
    }
}

impl<R> PendingCollective<R> {
    fn shared(&self) -> &Shared<R> {
        self.cell.as_ref().expect("held until drop").shared()
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
        self.help_then_poll(self.shared().spin);
        let mut slot = self.shared().lock();
        loop {
            match std::mem::replace(&mut *slot, Slot::Taken) {
                Slot::Done(r) => return r,
                Slot::Taken => return Err(Error::ResultTaken),
                running @ Slot::Running(_) => {
                    *slot = running;
                    self.shared().sleepers.fetch_add(1, Relaxed);
                    slot = self
                        .shared()
                        .done
                        .wait(slot)
                        .unwrap_or_else(|e| e.into_inner());
                    self.shared().sleepers.fetch_sub(1, Relaxed);
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
        !matches!(*self.shared().lock(), Slot::Running(_))
    }

    /// Waits at most `timeout`; `None` if the collective is still running (the
    /// handle stays usable), `Some(result)` once it ended. Unlike `wait`,
    /// it never runs the op on this thread (that could outlast `timeout`):
    /// it makes sure the executor has it.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<Result<R, Error>> {
        let deadline = Instant::now() + timeout;
        self.kick();
        crate::spin::poll_for(self.shared().spin.min(timeout), || {
            self.done().then_some(())
        });
        let mut slot = self.shared().lock();
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
                    self.shared().sleepers.fetch_add(1, Relaxed);
                    slot = self
                        .shared()
                        .done
                        .wait_timeout(slot, deadline - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                    self.shared().sleepers.fetch_sub(1, Relaxed);
                }
            }
        }
    }
}

impl<R> Future for PendingCollective<R> {
    type Output = Result<R, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut slot = self.shared().lock();
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

    /// A queue nobody helps with: jobs run only when a test runs them.
    struct NoHelp;
    impl Help for NoHelp {
        fn help(&self) -> bool {
            false
        }
        fn done_helping(&self) {}
        fn kick(&self) {}
    }

    type Work = Box<dyn FnOnce(&()) -> Result<Vec<u8>, Error> + Send>;

    fn queue_one(pool: &Arc<CellPool>, work: Work) -> (PendingCollective<Vec<u8>>, Job<()>) {
        queued(
            OpKind::AllReduce,
            Duration::ZERO,
            Arc::new(NoHelp),
            pool,
            work,
        )
    }

    fn cell_address<R>(p: &PendingCollective<R>) -> *const () {
        Arc::as_ptr(p.cell.as_ref().unwrap()).cast()
    }

    #[test]
    fn a_cell_is_reused_once_handle_and_job_let_go() {
        let pool = CellPool::new();
        let (p, job) = queue_one(&pool, Box::new(|_| Ok(vec![1])));
        let first = cell_address(&p);
        let (p2, job2) = queue_one(&pool, Box::new(|_| Ok(vec![2])));
        assert_ne!(first, cell_address(&p2), "a cell in use is not handed out");
        job.run(&());
        assert_eq!(p.wait().unwrap(), [1]);
        job2.run(&());
        assert_eq!(p2.wait().unwrap(), [2]);
        let (p3, job3) = queue_one(&pool, Box::new(|_| Ok(vec![3])));
        assert_eq!(first, cell_address(&p3), "the freed cell is reused");
        assert!(!p3.is_completed(), "a reused cell starts empty");
        job3.run(&());
        assert_eq!(p3.wait().unwrap(), [3]);
    }

    #[test]
    fn a_detached_ops_result_is_dropped_not_pooled() {
        let pool = CellPool::new();
        let buffer = Arc::new(());
        let held = buffer.clone();
        let (p, job) = queued(
            OpKind::AllReduce,
            Duration::ZERO,
            Arc::new(NoHelp),
            &pool,
            move |_: &()| Ok(held),
        );
        drop(p);
        job.run(&());
        assert_eq!(
            Arc::strong_count(&buffer),
            1,
            "the pooled cell kept the result"
        );
        assert_eq!(pool.lock().len(), 1);
    }

    #[test]
    fn a_job_that_never_runs_or_panics_fails_its_handle() {
        let pool = CellPool::new();
        let (p, job) = queue_one(&pool, Box::new(|_| Ok(vec![1])));
        drop(job);
        assert!(matches!(p.wait(), Err(Error::ShutDown(OpKind::AllReduce))));

        let (p, job) = queue_one(&pool, Box::new(|_| panic!("op body failed")));
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.run(&())));
        assert!(caught.is_err());
        assert!(matches!(p.wait(), Err(Error::ShutDown(OpKind::AllReduce))));
    }

    #[test]
    fn completing_a_dropped_handle_is_harmless() {
        let (p, c) = pending::<Vec<u8>>(OpKind::Barrier);
        drop(p);
        c.complete(Ok(vec![1, 2, 3]));
    }
}
