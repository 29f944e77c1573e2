//! The handle every GPU op returns: wait on the host, `.await`, ask
//! whether it is done, or make a stream wait for it without blocking the
//! host ([`PendingCollective::stream_wait`], PyTorch's `work.wait()`).
//!
//! The op's buffers live in a [`Slot`] shared by the handle and the op's
//! entry in flight. A dropped handle detaches: the buffers are freed only
//! once the watchdog has seen the op's end event (or never, when an
//! aborted communicator's stream does not drain), so memory NCCL may still
//! write is not freed early.

use crate::error::GpuError;
use crate::runtime::{EventImpl, Stream};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

struct SlotState<R> {
    value: Option<R>,
    outcome: Option<Result<(), GpuError>>,
    waker: Option<Waker>,
}

/// The communicator an op runs on, as its handle needs it.
pub(crate) trait OpsComm: Send + Sync {
    /// Completes the ops that finished (waiters drive progress too).
    fn progress(&self);
    /// The error of a failed CUDA call made for one of its ops.
    fn cuda_error(&self, call: &'static str, detail: String) -> GpuError;
}

/// An op's buffers and, once known, how it ended.
pub(crate) struct Slot<R> {
    state: Mutex<SlotState<R>>,
    done: Condvar,
}

/// The watchdog's end of a slot, without its type.
pub(crate) trait Completion: Send + Sync {
    /// Records how the op ended (the first call wins) and wakes waiters.
    fn complete(&self, outcome: Result<(), GpuError>);
}

impl<R> Slot<R> {
    /// Takes the value back out (a failed op's buffers, to free or leak).
    pub(crate) fn take_value(&self) -> Option<R> {
        self.lock().value.take()
    }
}

impl<R> Slot<R> {
    pub(crate) fn new(value: R) -> Slot<R> {
        Slot {
            state: Mutex::new(SlotState {
                value: Some(value),
                outcome: None,
                waker: None,
            }),
            done: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, SlotState<R>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<R: Send> Completion for Slot<R> {
    fn complete(&self, outcome: Result<(), GpuError>) {
        let waker = {
            let mut state = self.lock();
            if state.outcome.is_some() {
                return;
            }
            state.outcome = Some(outcome);
            state.waker.take()
        };
        self.done.notify_all();
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// A GPU op under way. See the module docs.
#[must_use = "an op's buffers come back through its handle"]
pub struct PendingCollective<R> {
    slot: Arc<Slot<R>>,
    /// Drives progress while waiting; `None` for handles that failed
    /// before their op was queued.
    comm: Option<Arc<dyn OpsComm>>,
    end: Option<Arc<dyn EventImpl>>,
    /// Streams the buffers belong to: `stream_wait` orders them too, so a
    /// buffer freed on its own stream is freed after the op.
    streams: Vec<Stream>,
}

impl<R: Send + 'static> PendingCollective<R> {
    pub(crate) fn queued(
        slot: Arc<Slot<R>>,
        comm: Arc<dyn OpsComm>,
        end: Arc<dyn EventImpl>,
        streams: Vec<Stream>,
    ) -> PendingCollective<R> {
        PendingCollective {
            slot,
            comm: Some(comm),
            end: Some(end),
            streams,
        }
    }

    /// A handle completed by another thread (the hierarchical all-reduce's
    /// worker), which holds the slot until it is done.
    pub(crate) fn worker(slot: Arc<Slot<R>>) -> PendingCollective<R> {
        PendingCollective {
            slot,
            comm: None,
            end: None,
            streams: Vec::new(),
        }
    }

    /// A handle that has already failed (bad arguments, a failed
    /// communicator).
    pub(crate) fn failed(error: GpuError) -> PendingCollective<R> {
        let slot = Arc::new(Slot {
            state: Mutex::new(SlotState {
                value: None,
                outcome: Some(Err(error)),
                waker: None,
            }),
            done: Condvar::new(),
        });
        PendingCollective {
            slot,
            comm: None,
            end: None,
            streams: Vec::new(),
        }
    }

    /// The outcome if known: Ok(value), Err(error), or None (running).
    fn take_outcome(&self) -> Option<Result<R, GpuError>> {
        let mut state = self.slot.lock();
        match state.outcome.take()? {
            Ok(()) => Some(state.value.take().ok_or_else(unreachable_taken)),
            Err(e) => Some(Err(e)),
        }
    }

    fn progress(&self) {
        if let Some(comm) = &self.comm {
            comm.progress();
        }
    }

    /// Blocks until the op has finished on the device (or failed: an NCCL
    /// error, its timeout, an abort) and gives the buffers back.
    pub fn wait(self) -> Result<R, GpuError> {
        let mut polls = 0u32;
        loop {
            if let Some(outcome) = self.take_outcome() {
                return outcome;
            }
            self.progress();
            polls += 1;
            if polls < 200 {
                std::thread::yield_now();
                continue;
            }
            let state = self.slot.lock();
            if state.outcome.is_none() {
                // The watchdog completes the slot; progress() above does
                // too when this thread finds the end event first.
                let _ = self
                    .slot
                    .done
                    .wait_timeout(state, Duration::from_micros(500));
            }
        }
    }

    /// Whether the op has ended (finished or failed), without blocking.
    pub fn is_completed(&self) -> bool {
        if self.slot.lock().outcome.is_some() {
            return true;
        }
        self.progress();
        self.slot.lock().outcome.is_some()
    }

    /// Makes `stream` (and the buffers' own streams) wait for the op on
    /// the device, and gives the buffers back at once: work queued on
    /// `stream` afterwards sees the op's results, and the host never
    /// blocks. An error already known is returned; a later one fails the
    /// communicator's next op.
    pub fn stream_wait(self, stream: &Stream) -> Result<R, GpuError> {
        if let Some(outcome) = self.take_outcome() {
            return outcome;
        }
        let (Some(end), Some(comm)) = (&self.end, &self.comm) else {
            // Not one NCCL launch (a hierarchical all-reduce): no single
            // event to wait for, so the host waits.
            return self.wait();
        };
        let mut waiting = vec![stream.clone()];
        for s in &self.streams {
            if !waiting.iter().any(|w| w.same(s)) {
                waiting.push(s.clone());
            }
        }
        for s in &waiting {
            s.0.wait_event(end.as_ref())
                .map_err(|detail| comm.cuda_error("cuStreamWaitEvent", detail))?;
        }
        let mut state = self.slot.lock();
        if let Some(Err(e)) = state.outcome.take() {
            return Err(e);
        }
        state.value.take().ok_or_else(unreachable_taken)
    }
}

fn unreachable_taken() -> GpuError {
    GpuError::InvalidArgument {
        at: crate::error::OpAt {
            op: crate::error::GpuOp::Group,
            seq: 0,
            rank: 0,
            world_size: 0,
        },
        detail: "the op's buffers were already taken".into(),
    }
}

impl<R: Send + 'static> Future for PendingCollective<R> {
    type Output = Result<R, GpuError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let Some(outcome) = this.take_outcome() {
            return Poll::Ready(outcome);
        }
        this.progress();
        let mut state = this.slot.lock();
        if state.outcome.is_some() {
            drop(state);
            return match this.take_outcome() {
                Some(outcome) => Poll::Ready(outcome),
                None => Poll::Pending,
            };
        }
        state.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl<R> std::fmt::Debug for PendingCollective<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PendingCollective(gpu)")
    }
}
