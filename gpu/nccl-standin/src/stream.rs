//! Host streams and events: the stand-in's CUDA. A stream is a FIFO of
//! closures run in order by one worker thread; an event is a marker put
//! on a stream that completes when the worker reaches it. NCCL calls
//! enqueue their work here and return, so the consumer observes completion
//! the way it does on a GPU: through an event recorded after the op.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// A unit of work on a stream.
pub(crate) type Work = Box<dyn FnOnce() + Send>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A flag set once, that threads can wait for.
#[derive(Default)]
pub(crate) struct Completion {
    done: Mutex<bool>,
    cv: Condvar,
}

impl Completion {
    pub(crate) fn complete(&self) {
        *lock(&self.done) = true;
        self.cv.notify_all();
    }

    pub(crate) fn is_done(&self) -> bool {
        *lock(&self.done)
    }

    pub(crate) fn wait(&self) {
        let mut done = lock(&self.done);
        while !*done {
            done = self.cv.wait(done).unwrap_or_else(|e| e.into_inner());
        }
    }
}

#[derive(Default)]
struct Queue {
    state: Mutex<QueueState>,
    cv: Condvar,
}

#[derive(Default)]
struct QueueState {
    items: VecDeque<Work>,
    closing: bool,
}

/// A FIFO of work run by its own thread.
pub(crate) struct Stream {
    queue: Arc<Queue>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl Stream {
    /// A new stream with its worker thread.
    pub(crate) fn new() -> std::io::Result<Arc<Stream>> {
        let queue = Arc::new(Queue::default());
        let worker_queue = Arc::clone(&queue);
        let worker = std::thread::Builder::new()
            .name("standin-stream".into())
            .spawn(move || run_worker(&worker_queue))?;
        Ok(Arc::new(Stream {
            queue,
            worker: Mutex::new(Some(worker)),
        }))
    }

    /// The process's default stream (what a NULL stream means), made on
    /// first use and never destroyed.
    pub(crate) fn default_stream() -> Option<Arc<Stream>> {
        static DEFAULT: Mutex<Option<Arc<Stream>>> = Mutex::new(None);
        let mut default = lock(&DEFAULT);
        if default.is_none() {
            *default = Stream::new().ok();
        }
        default.clone()
    }

    /// Appends `work`; false if the stream is being destroyed.
    pub(crate) fn enqueue(&self, work: Work) -> bool {
        let mut state = lock(&self.queue.state);
        if state.closing {
            return false;
        }
        state.items.push_back(work);
        self.queue.cv.notify_all();
        true
    }

    /// Blocks until everything enqueued so far has run.
    pub(crate) fn synchronize(&self) -> bool {
        let marker = Arc::new(Completion::default());
        let done = Arc::clone(&marker);
        if !self.enqueue(Box::new(move || done.complete())) {
            return false;
        }
        marker.wait();
        true
    }

    /// Runs what is queued, then stops and joins the worker.
    pub(crate) fn shutdown(&self) {
        lock(&self.queue.state).closing = true;
        self.queue.cv.notify_all();
        let worker = lock(&self.worker).take();
        if let Some(worker) = worker
            && worker.thread().id() != std::thread::current().id()
        {
            let _ = worker.join();
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // Not joined here: the worker finishes what is queued on its own.
        lock(&self.queue.state).closing = true;
        self.queue.cv.notify_all();
    }
}

fn run_worker(queue: &Queue) {
    loop {
        let work = {
            let mut state = lock(&queue.state);
            loop {
                if let Some(work) = state.items.pop_front() {
                    break work;
                }
                if state.closing {
                    return;
                }
                state = queue.cv.wait(state).unwrap_or_else(|e| e.into_inner());
            }
        };
        // A panicking item must not take the stream (and every later
        // event on it) down with it.
        let _ = catch_unwind(AssertUnwindSafe(work));
    }
}

/// A marker that tracks its latest recording.
#[derive(Default)]
pub(crate) struct Event {
    current: Mutex<Option<Arc<Completion>>>,
}

impl Event {
    /// Enqueues a new marker on `stream` and tracks it from now on.
    pub(crate) fn record(&self, stream: &Stream) -> bool {
        let marker = Arc::new(Completion::default());
        let done = Arc::clone(&marker);
        if !stream.enqueue(Box::new(move || done.complete())) {
            return false;
        }
        *lock(&self.current) = Some(marker);
        true
    }

    /// Whether the current recording has run (true if never recorded).
    pub(crate) fn is_complete(&self) -> bool {
        lock(&self.current).as_ref().is_none_or(|m| m.is_done())
    }

    /// Blocks until the current recording has run.
    pub(crate) fn synchronize(&self) {
        let marker = lock(&self.current).clone();
        if let Some(marker) = marker {
            marker.wait();
        }
    }

    /// Makes work enqueued on `stream` from now on wait for the current
    /// recording (later recordings do not matter).
    pub(crate) fn make_wait(&self, stream: &Stream) -> bool {
        let marker = lock(&self.current).clone();
        match marker {
            Some(marker) if !marker.is_done() => stream.enqueue(Box::new(move || marker.wait())),
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn runs_in_order_and_survives_a_panic() {
        let stream = Stream::new().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        for i in 0..5 {
            let log = Arc::clone(&log);
            assert!(stream.enqueue(Box::new(move || {
                assert!(i != 2, "item 2 panics on purpose");
                lock(&log).push(i);
            })));
        }
        assert!(stream.synchronize());
        assert_eq!(*lock(&log), vec![0, 1, 3, 4]);
        stream.shutdown();
        assert!(!stream.enqueue(Box::new(|| {})));
    }

    #[test]
    fn shutdown_runs_what_is_queued() {
        let stream = Stream::new().unwrap();
        let ran = Arc::new(AtomicUsize::new(0));
        for _ in 0..3 {
            let ran = Arc::clone(&ran);
            stream.enqueue(Box::new(move || {
                ran.fetch_add(1, Ordering::SeqCst);
            }));
        }
        stream.shutdown();
        assert_eq!(ran.load(Ordering::SeqCst), 3);
    }
}
