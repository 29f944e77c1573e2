//! The communicator's job queue, run in submission order by its executor
//! thread or by a thread that waits for one of the jobs.
//!
//! Why waiters run jobs: a collective handed to another thread costs a
//! wake-up to start it and one to report it done. For small messages those
//! wake-ups are most of the op's time (decision 0008), so a thread blocked
//! in `PendingCollective::wait` takes the oldest queued job itself when no
//! job is running (one at a time, oldest first, so the op order every rank
//! relies on is unchanged).
//!
//! Why small jobs do not wake the executor: the wake-up would be wasted when
//! a waiter runs the job. While the communicator is busy the executor polls
//! the queue instead, every [`HOT_POLL`] at first, so a small op nobody
//! waits for still starts soon (overlap with compute keeps working), and a
//! waiter that does not block in `wait` (`.await`, `is_completed`,
//! `wait_timeout`) kicks the executor at once. Large jobs always wake it.
//!
//! Why the polls back off: where every op is waited for, waiters run them
//! all and each poll finds nothing, but it still wakes the executor thread
//! on a core a rank is using; a thousand such wake-ups a second put a third
//! of a 2-rank 8-byte all-reduce's mean in its slowest percent. So each
//! poll that finds nothing to run doubles the interval, up to
//! [`HOT_POLL_MAX`], and one that finds a job resets it.

use crate::clock::coarse_now;
use std::collections::VecDeque;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Work queued to run once with the shared context `C`. Shared (not boxed)
/// so an op's handle and its queued work can live in one reusable
/// allocation (see `pending::CellPool`).
pub(crate) trait Runnable<C>: Send + Sync {
    /// Runs the work (called at most once).
    fn run(&self, context: &C);
    /// The work will never run (the runner closed before it).
    fn abandon(&self);
    /// The queue is done with it (after `run` or `abandon`).
    fn let_go(self: Arc<Self>);
}

/// A queued job. Dropped without running, its work is abandoned.
pub(crate) struct Job<C>(Option<Arc<dyn Runnable<C>>>);

impl<C> Job<C> {
    pub(crate) fn new(work: Arc<dyn Runnable<C>>) -> Job<C> {
        Job(Some(work))
    }

    pub(crate) fn run(mut self, context: &C) {
        if let Some(work) = self.0.take() {
            // A panic skips `let_go`: the cell is then freed, not reused.
            work.run(context);
            work.let_go();
        }
    }
}

impl<C> Drop for Job<C> {
    fn drop(&mut self) {
        if let Some(work) = self.0.take() {
            work.abandon();
            work.let_go();
        }
    }
}

/// How often a busy communicator's idle executor looks for jobs nobody
/// woke it for, at first.
pub(crate) const HOT_POLL: Duration = Duration::from_millis(1);
/// ... and at most, after polls that found nothing to run (see the module
/// docs).
const HOT_POLL_MAX: Duration = Duration::from_millis(32);
/// How long after the last job the executor keeps polling before it sleeps
/// until woken.
const HOT_WINDOW: Duration = Duration::from_millis(100);

/// What jobs run with.
pub(crate) trait Context: Send + Sync {
    /// The calling thread stops running jobs for now.
    fn idle(&self);
    /// The core a thread running these jobs polls from (see
    /// `ringwire_uring::poll_yield`).
    fn home_core(&self) -> Option<usize> {
        None
    }
}

/// What the executor thread is doing, for whoever queues a job.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ExecutorIs {
    /// Running a job or about to look at the queue: needs no wake-up.
    Busy,
    /// In a timed wait: looks at the queue within [`HOT_POLL`].
    Polling,
    /// Asleep until woken.
    Asleep,
}

struct Jobs<C> {
    queue: VecDeque<Job<C>>,
    /// A thread is running a job (at most one at a time).
    running: bool,
    /// No more jobs will come; the executor exits once the queue is empty.
    closed: bool,
    executor: ExecutorIs,
    last_activity: Duration,
    /// Timed waits of the executor so far (tests watch the back-off).
    polls: u64,
}

/// Jobs and the context they run with.
pub(crate) struct Runner<C> {
    jobs: Mutex<Jobs<C>>,
    /// The executor sleeps on it.
    wake_executor: Condvar,
    context: C,
}

/// What a waiting handle needs from its runner, without its type.
pub(crate) trait Help: Send + Sync {
    /// Runs the oldest queued job on this thread if no job is running;
    /// whether it ran one.
    fn help(&self) -> bool;
    /// The calling thread stops helping (after `help` ran something):
    /// release what it holds and hand remaining jobs to the executor.
    fn done_helping(&self);
    /// Make sure the executor will run queued jobs soon (for waiters that
    /// do not run jobs themselves).
    fn kick(&self);
}

impl<C: Context> Runner<C> {
    /// The shared context (for reads that need no job slot).
    pub(crate) fn context(&self) -> &C {
        &self.context
    }

    pub(crate) fn new(context: C) -> Runner<C> {
        Runner {
            jobs: Mutex::new(Jobs {
                queue: VecDeque::new(),
                running: false,
                closed: false,
                executor: ExecutorIs::Busy,
                last_activity: coarse_now(),
                polls: 0,
            }),
            wake_executor: Condvar::new(),
            context,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Jobs<C>> {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `job` as the last (nothing is queued after it), unless the
    /// runner is closed already; false then.
    pub(crate) fn push_last(&self, job: Job<C>) -> bool {
        let mut jobs = self.lock();
        if jobs.closed {
            return false;
        }
        jobs.queue.push_back(job);
        jobs.closed = true;
        drop(jobs);
        self.wake_executor.notify_one();
        true
    }

    /// Queues `job`. `urgent` jobs wake the executor; others only if it
    /// is not polling. False (and the job is dropped, which fails its
    /// handle) once the runner is closed.
    pub(crate) fn push(&self, job: Job<C>, urgent: bool) -> bool {
        let mut jobs = self.lock();
        if jobs.closed {
            return false;
        }
        jobs.queue.push_back(job);
        jobs.last_activity = coarse_now();
        let wake = match jobs.executor {
            ExecutorIs::Busy => false,
            ExecutorIs::Polling => urgent,
            ExecutorIs::Asleep => true,
        };
        drop(jobs);
        if wake {
            self.wake_executor.notify_one();
        }
        true
    }

    /// Lets the executor finish the queue and exit.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.wake_executor.notify_one();
    }

    /// Takes the oldest job if none runs.
    fn take(jobs: &mut Jobs<C>) -> Option<Job<C>> {
        if jobs.running {
            return None;
        }
        let job = jobs.queue.pop_front()?;
        jobs.running = true;
        Some(job)
    }

    /// Runs `job` on the calling thread. A job's own panics end in its
    /// handle; one that escapes (a buffer whose `Drop` panics when a
    /// detached op lets it go) is logged and stops here: it must not end
    /// the executor, or later ops nobody blocks on would never run, nor
    /// reach a waiter that only helped.
    fn run(&self, job: Job<C>) {
        /// Frees the queue and restores the home core after the job.
        struct Finish<'a, C: Context>(&'a Runner<C>, Option<usize>);
        impl<C: Context> Drop for Finish<'_, C> {
            fn drop(&mut self) {
                ringwire_uring::set_home_core(self.1);
                self.0.job_ended();
            }
        }
        let _finish = Finish(
            self,
            ringwire_uring::set_home_core(self.context.home_core()),
        );
        if panic::catch_unwind(AssertUnwindSafe(|| job.run(&self.context))).is_err() {
            tracing::error!("a job panicked after its op ended; its runner goes on");
        }
    }

    /// Frees the job slot.
    fn job_ended(&self) {
        let mut jobs = self.lock();
        jobs.running = false;
        jobs.last_activity = coarse_now();
        // A closing runner's executor waits for the last job.
        let wake = jobs.closed && jobs.executor != ExecutorIs::Busy;
        drop(jobs);
        if wake {
            self.wake_executor.notify_one();
        }
    }

    /// Claims the right to run a job on the calling thread now, if nothing
    /// is queued or running; the claim ends (and the thread releases what
    /// it holds) when the returned guard drops.
    pub(crate) fn claim(&self) -> Option<Claim<'_, C>> {
        let mut jobs = self.lock();
        if jobs.running || !jobs.queue.is_empty() || jobs.closed {
            return None;
        }
        jobs.running = true;
        let home = ringwire_uring::set_home_core(self.context.home_core());
        Some(Claim(self, home))
    }

    /// The executor thread's loop: runs jobs until closed and drained.
    /// Polls for `spin` after each job before it sleeps.
    pub(crate) fn executor_loop(&self, spin: Duration) {
        let mut ran = false;
        let mut poll = HOT_POLL;
        loop {
            let job = match crate::spin::poll_for(spin, || Self::take(&mut self.lock())) {
                Some(job) => job,
                None => {
                    if std::mem::take(&mut ran) {
                        self.context.idle();
                    }
                    let mut jobs = self.lock();
                    loop {
                        if let Some(job) = Self::take(&mut jobs) {
                            break job;
                        }
                        if jobs.closed && jobs.queue.is_empty() && !jobs.running {
                            return;
                        }
                        let hot = coarse_now().saturating_sub(jobs.last_activity) < HOT_WINDOW;
                        jobs.executor = if hot {
                            ExecutorIs::Polling
                        } else {
                            ExecutorIs::Asleep
                        };
                        jobs = if hot {
                            let mut jobs = self
                                .wake_executor
                                .wait_timeout(jobs, poll)
                                .map_or_else(|e| e.into_inner().0, |r| r.0);
                            jobs.polls += 1;
                            // Nothing for this thread (empty, or a waiter
                            // runs it): look less often.
                            poll = match jobs.running || jobs.queue.is_empty() {
                                true => (poll * 2).min(HOT_POLL_MAX),
                                false => HOT_POLL,
                            };
                            jobs
                        } else {
                            self.wake_executor
                                .wait(jobs)
                                .unwrap_or_else(|e| e.into_inner())
                        };
                        jobs.executor = ExecutorIs::Busy;
                    }
                }
            };
            self.run(job);
            ran = true;
            poll = HOT_POLL;
        }
    }
}

/// A job slot taken by [`Runner::claim`] (and the thread's home core
/// before it).
pub(crate) struct Claim<'a, C: Context>(&'a Runner<C>, Option<usize>);

impl<C: Context> Claim<'_, C> {
    pub(crate) fn context(&self) -> &C {
        &self.0.context
    }
}

impl<C: Context> Drop for Claim<'_, C> {
    fn drop(&mut self) {
        ringwire_uring::set_home_core(self.1);
        self.0.job_ended();
        self.0.done_helping();
    }
}

impl<C: Context> Help for Runner<C> {
    fn help(&self) -> bool {
        let job = Self::take(&mut self.lock());
        match job {
            Some(job) => {
                self.run(job);
                true
            }
            None => false,
        }
    }

    fn done_helping(&self) {
        self.context.idle();
        self.kick();
    }

    fn kick(&self) {
        let jobs = self.lock();
        let waiting = !jobs.queue.is_empty() && !jobs.running && jobs.executor != ExecutorIs::Busy;
        drop(jobs);
        if waiting {
            self.wake_executor.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::thread::ThreadId;
    use std::time::Instant;

    #[derive(Default)]
    struct Log {
        ran: Mutex<Vec<(usize, ThreadId)>>,
        idles: AtomicUsize,
    }

    impl Context for Log {
        fn idle(&self) {
            self.idles.fetch_add(1, Ordering::SeqCst);
        }

        fn home_core(&self) -> Option<usize> {
            Some(7)
        }
    }

    /// A job from a closure (the communicator's come from `pending`).
    struct FnJob<F>(Mutex<Option<F>>);

    impl<F: FnOnce(&Log) + Send> Runnable<Log> for FnJob<F> {
        fn run(&self, log: &Log) {
            let f = self.0.lock().unwrap().take();
            f.expect("run once")(log);
        }
        fn abandon(&self) {}
        fn let_go(self: Arc<Self>) {}
    }

    fn from_fn(f: impl FnOnce(&Log) + Send + 'static) -> Job<Log> {
        Job::new(Arc::new(FnJob(Mutex::new(Some(f)))))
    }

    fn record(i: usize) -> impl FnOnce(&Log) + Send + 'static {
        move |log: &Log| {
            log.ran
                .lock()
                .unwrap()
                .push((i, std::thread::current().id()))
        }
    }

    fn job(i: usize) -> Job<Log> {
        from_fn(record(i))
    }

    fn ran(runner: &Runner<Log>) -> Vec<usize> {
        runner
            .context
            .ran
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.0)
            .collect()
    }

    #[test]
    fn a_waiter_runs_queued_jobs_oldest_first_on_its_own_thread() {
        // No executor thread: only the helping caller can run them.
        let runner = Runner::new(Log::default());
        for i in 0..3 {
            assert!(runner.push(job(i), false));
        }
        assert!(runner.help());
        assert!(runner.help());
        runner.done_helping();
        assert_eq!(ran(&runner), [0, 1]);
        let me = std::thread::current().id();
        assert!(runner.context.ran.lock().unwrap().iter().all(|r| r.1 == me));
        assert_eq!(runner.context.idles.load(Ordering::SeqCst), 1);
        assert!(runner.help());
        assert!(!runner.help(), "the queue is empty");
        assert_eq!(ran(&runner), [0, 1, 2]);
    }

    #[test]
    fn jobs_nobody_waits_for_run_on_the_executor_in_order() {
        let runner = Arc::new(Runner::new(Log::default()));
        let executor = {
            let runner = runner.clone();
            std::thread::spawn(move || runner.executor_loop(Duration::ZERO))
        };
        // Small jobs, some while the executor sleeps, some while it polls:
        // none is waited for, all must run, in order, on the executor.
        for i in 0..50 {
            assert!(runner.push(job(i), false));
            if i % 10 == 0 {
                std::thread::sleep(Duration::from_millis(3));
            }
        }
        // Without a close (which would wake it) or a waiter's kick.
        let until = Instant::now() + Duration::from_secs(20);
        while ran(&runner).len() < 50 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(ran(&runner), (0..50).collect::<Vec<_>>());
        runner.close();
        executor.join().unwrap();
        let me = std::thread::current().id();
        assert!(runner.context.ran.lock().unwrap().iter().all(|r| r.1 != me));
        assert!(runner.context.idles.load(Ordering::SeqCst) >= 1);
        assert!(!runner.push(job(99), true), "a closed runner takes no jobs");
    }

    #[test]
    fn the_executor_polls_less_while_waiters_run_every_job() {
        let runner = Arc::new(Runner::new(Log::default()));
        let executor = {
            let runner = runner.clone();
            std::thread::spawn(move || runner.executor_loop(Duration::ZERO))
        };
        // A trainer's loop of small ops, each waited for: the waiter runs
        // every one, so the executor's polls find nothing.
        let start = Instant::now();
        let mut i = 0;
        while start.elapsed() < Duration::from_millis(400) {
            assert!(runner.push(job(i), false));
            while runner.help() {}
            i += 1;
            std::thread::sleep(Duration::from_micros(20));
        }
        let polls = runner.lock().polls;
        // Every HOT_POLL, that is 400 in 400 ms; backing off to HOT_POLL_MAX,
        // 5 polls to reach it and then one per 32 ms, under 20.
        assert!(polls < 60, "the executor polled {polls} times in 400 ms");
        // A job nobody waits for still runs on the executor, within
        // HOT_POLL_MAX.
        let n = ran(&runner).len();
        assert!(runner.push(job(i), false));
        let until = Instant::now() + Duration::from_secs(10);
        while ran(&runner).len() == n && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        let last = runner.context.ran.lock().unwrap().last().copied().unwrap();
        assert_eq!(last.0, i, "the unwaited job ran");
        assert_ne!(last.1, std::thread::current().id(), "on the executor");
        runner.close();
        executor.join().unwrap();
    }

    #[test]
    fn waiters_and_the_executor_never_run_two_jobs_at_once() {
        let running = Arc::new(AtomicUsize::new(0));
        let runner = Arc::new(Runner::new(Log::default()));
        let executor = {
            let runner = runner.clone();
            std::thread::spawn(move || runner.executor_loop(Duration::from_micros(20)))
        };
        let helpers: Vec<_> = (0..3)
            .map(|_| {
                let runner = runner.clone();
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        runner.help();
                    }
                    runner.done_helping();
                })
            })
            .collect();
        for i in 0..300 {
            let running = running.clone();
            let inner = record(i);
            runner.push(
                from_fn(move |log: &Log| {
                    assert_eq!(
                        running.fetch_add(1, Ordering::SeqCst),
                        0,
                        "two jobs at once"
                    );
                    inner(log);
                    running.fetch_sub(1, Ordering::SeqCst);
                }),
                i % 7 == 0,
            );
        }
        for h in helpers {
            h.join().unwrap();
        }
        runner.close();
        executor.join().unwrap();
        assert_eq!(ran(&runner), (0..300).collect::<Vec<_>>());
    }

    #[test]
    fn a_thread_polls_from_the_home_core_only_while_it_runs_jobs() {
        let runner = Runner::new(Log::default());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let during = seen.clone();
        runner.push(
            from_fn(move |_: &Log| {
                // Read it by swapping it out and back.
                let home = ringwire_uring::set_home_core(None);
                ringwire_uring::set_home_core(home);
                during.lock().unwrap().push(home);
            }),
            false,
        );
        assert_eq!(ringwire_uring::set_home_core(Some(3)), None);
        assert!(runner.help());
        let claim = runner.claim().expect("nothing queued");
        assert_eq!(
            ringwire_uring::set_home_core(Some(7)),
            Some(7),
            "claimed: home"
        );
        drop(claim);
        assert_eq!(*seen.lock().unwrap(), [Some(7)], "running a job: home");
        assert_eq!(
            ringwire_uring::set_home_core(None),
            Some(3),
            "afterwards: the thread's own setting again"
        );
    }

    #[test]
    fn a_panicking_job_does_not_block_the_queue() {
        let runner = Runner::new(Log::default());
        runner.push(from_fn(|_: &Log| panic!("job failed")), false);
        runner.push(job(1), false);
        // The panic stays in the runner (logged): the helping thread
        // goes on, and so does the queue.
        assert!(runner.help(), "the panicking job was taken");
        assert!(runner.help(), "the next job still runs");
        assert_eq!(ran(&runner), [1]);
    }
}
