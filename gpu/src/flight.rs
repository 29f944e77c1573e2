//! A GPU communicator's shared state and the life of its ops: queueing
//! ([`CommShared::launch`]), noticing that they finished or failed
//! ([`CommShared::progress`], run by the watchdog and by waiters), and
//! failing the communicator ([`CommShared::fail`]): every pending op ends
//! with an error naming it, `ncclCommAbort` runs on a helper thread under
//! its own deadline, the CPU communicator's abort carries the failure to
//! every rank (whose watchdogs then abort too: NCCL peers hang otherwise),
//! and buffers are freed only once the stream has drained.
//!
//! Where the library has `ncclCommShrink`, a communicator failed by a
//! lost or hung peer (not by NCCL's own error, nor by a user's abort) is
//! *parked* instead of aborted: NCCL can shrink only a parent that is
//! still there. `shrink` takes it (decision 0041); if nobody does within
//! the op timeout plus [`PARK_GRACE`] (or `abort()` is called, or the
//! communicator is dropped), it is aborted as above.

use crate::enqueue::{Call, enqueue};
use crate::error::{GpuError, GpuOp, OpAt};
use crate::nccl::codes::NcclResult;
use crate::nccl::library::{NcclLibrary, RawComm};
use crate::pending::{Completion, OpsComm, PendingCollective, Slot};
use crate::runtime::{Device, DeviceMemory, EventImpl, Stream};
use crate::watchdog::Watched;
use ringwire::Communicator;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long `ncclCommAbort` may take before the communicator (and the
/// memory its ops used) is given up as leaked.
pub(crate) const ABORT_DEADLINE: Duration = Duration::from_secs(30);
/// How long an aborted communicator's stream may take to drain before its
/// ops' buffers are leaked rather than freed under a possible writer.
const DRAIN_DEADLINE: Duration = Duration::from_secs(10);
/// How long ops may stay in flight, none finishing, after a member's
/// links have failed before the communicator fails: ops the lost rank had
/// already served finish within it.
const LOST_GRACE: Duration = Duration::from_secs(2);
/// How often the watchdog looks for lost members while ops are in flight.
const LOST_CHECK_EVERY: Duration = Duration::from_millis(100);

/// How long a failed communicator stays parked for a shrink, beyond its
/// op timeout (the survivors' CPU shrink may take that long first).
pub(crate) const PARK_GRACE: Duration = Duration::from_secs(30);

/// An op queued on the device.
pub(crate) struct InFlight {
    pub(crate) at: OpAt,
    pub(crate) end: Arc<dyn EventImpl>,
    pub(crate) started: Instant,
    pub(crate) deadline: Instant,
    pub(crate) slot: Arc<dyn Completion>,
}

/// A failed NCCL communicator kept for `ncclCommShrink`, with the ops it
/// failed (their buffers wait for its abort and drain).
pub(crate) struct Parked {
    pub(crate) comm: RawComm,
    pub(crate) inflight: Vec<InFlight>,
    /// When the watchdog aborts it if no shrink has taken it.
    pub(crate) until: Instant,
}

/// How the NCCL communicator was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MadeBy {
    /// `ncclCommInitRankConfig` with a unique id.
    UniqueId,
    /// `ncclCommShrink` of the parent.
    Shrink,
}

pub(crate) struct State {
    /// `None` once aborted, destroyed or parked.
    pub(crate) comm: Option<RawComm>,
    /// Failed, and kept for a shrink.
    pub(crate) parked: Option<Parked>,
    pub(crate) inflight: VecDeque<InFlight>,
    pub(crate) next_seq: u64,
    /// The last op seen finished, for timeout messages.
    pub(crate) last_done: Option<u64>,
    /// Why the communicator failed, once it has.
    pub(crate) failure: Option<String>,
    /// When the watchdog last looked for lost members, and since when it
    /// has seen some while ops were in flight and none finished (with the
    /// last finished op then).
    pub(crate) lost_check: Option<Instant>,
    pub(crate) lost_since: Option<(Instant, Option<u64>)>,
}

/// Why a communicator fails.
pub(crate) enum Cause {
    /// NCCL's async error.
    Nccl(NcclResult, String),
    /// The front op passed its deadline.
    Timeout,
    /// The CPU communicator failed or was aborted by a peer.
    Remote(String),
    /// A CUDA call failed (event query).
    Cuda(String),
    /// `abort()` on this rank.
    Local(String),
    /// Members' links failed with ops in flight (told to every rank).
    Lost(String),
    /// `shrink()` on this rank: the communicator is kept for it.
    Shrink(String),
}

impl Cause {
    /// Whether the communicator is kept for `ncclCommShrink` (where the
    /// library has it) rather than aborted: failures a lost or hung peer
    /// caused, which a shrink is the answer to. A user's `abort()`, NCCL's
    /// own errors and CUDA's abort at once.
    fn parks(&self) -> bool {
        matches!(
            self,
            Cause::Remote(_) | Cause::Timeout | Cause::Lost(_) | Cause::Shrink(_)
        )
    }
}

pub(crate) struct CommShared {
    pub(crate) lib: Arc<NcclLibrary>,
    pub(crate) device: Device,
    /// The GPU communicator's own CPU communicator (split from the user's):
    /// carries the unique id, debug checks and the abort.
    pub(crate) cpu: Communicator,
    pub(crate) rank: usize,
    pub(crate) size: usize,
    /// The same on every rank of this NCCL communicator, and different
    /// for another (from the unique id, or from the parent's and the
    /// excluded ranks): tells a shrink that all its ranks shrink one
    /// parent.
    pub(crate) lineage: u64,
    pub(crate) made_by: MadeBy,
    pub(crate) timeout: Duration,
    /// How long NCCL may take to make a communicator (a shrink's too).
    pub(crate) init_timeout: Duration,
    pub(crate) compute: Stream,
    pub(crate) stream: Stream,
    pub(crate) scratch: Box<dyn DeviceMemory>,
    pub(crate) debug_checks: bool,
    pub(crate) state: Mutex<State>,
    /// Serialises submissions, so seq order is queue order.
    pub(crate) submit: Mutex<()>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl CommShared {
    pub(crate) fn at(&self, op: GpuOp, seq: u64) -> OpAt {
        OpAt {
            op,
            seq,
            rank: self.rank,
            world_size: self.size,
        }
    }

    pub(crate) fn cuda_error(&self, call: &'static str, detail: String) -> GpuError {
        GpuError::Cuda {
            at: self.at(GpuOp::Group, lock(&self.state).next_seq),
            call,
            detail,
        }
    }

    fn nccl_error(&self, at: OpAt, code: NcclResult, comm: Option<&RawComm>) -> GpuError {
        GpuError::Nccl {
            at,
            code,
            text: self.lib.error_string(code),
            last_error: self.lib.last_error(comm),
        }
    }

    /// Queues one op: orders the communicator's stream after the callers'
    /// streams, moves `value` (the buffers) into the op's slot, enqueues
    /// `calls` as one group, records the end event, and hands the op to
    /// the watchdog.
    pub(crate) fn launch<R: Send + 'static>(
        self: &Arc<Self>,
        op: GpuOp,
        value: R,
        streams: Vec<Stream>,
        calls: Vec<Call>,
    ) -> PendingCollective<R> {
        let _submit = lock(&self.submit);
        let mut state = lock(&self.state);
        let seq = state.next_seq;
        let at = self.at(op, seq);
        if let Some(reason) = &state.failure {
            return PendingCollective::failed(GpuError::Aborted {
                at,
                reason: reason.clone(),
            });
        }
        state.next_seq += 1;
        let cuda = |call: &'static str, detail: String| GpuError::Cuda {
            at: at.clone(),
            call,
            detail,
        };
        if let Err(detail) = self.device.0.bind() {
            return PendingCollective::failed(cuda("cuCtxSetCurrent", detail));
        }
        let callers = if streams.is_empty() {
            vec![self.compute.clone()]
        } else {
            streams.clone()
        };
        for caller in &callers {
            let ordered = caller
                .0
                .record()
                .and_then(|event| self.stream.0.wait_event(event.as_ref()));
            if let Err(detail) = ordered {
                return PendingCollective::failed(cuda("cuEventRecord/cuStreamWaitEvent", detail));
            }
        }
        let slot = Arc::new(Slot::new(value));
        let started = Instant::now();
        let deadline = started + self.timeout;
        let result = match state.comm.as_ref() {
            Some(comm) => {
                let mut result = enqueue(&self.lib, comm, self.stream.0.raw(), &calls);
                while result == NcclResult::IN_PROGRESS {
                    // A non-blocking comm takes no other call until this settles.
                    result = self.lib.async_error(comm);
                    if result == NcclResult::IN_PROGRESS {
                        if Instant::now() > deadline {
                            result = NcclResult::TIMEOUT;
                            break;
                        }
                        std::thread::yield_now();
                    }
                }
                result
            }
            None => {
                return PendingCollective::failed(GpuError::Aborted {
                    at,
                    reason: "the communicator was destroyed".into(),
                });
            }
        };
        // Recorded even after a failed enqueue: part of a group may have
        // reached the stream, and the event says when it has drained.
        let end = match self.stream.0.record() {
            Ok(end) => end,
            Err(detail) => {
                // Without an end event nothing can say when the buffers are
                // free: fail the comm and keep them forever.
                std::mem::forget(slot.clone());
                let error = cuda("cuEventRecord", detail);
                self.fail_locked(&mut state, Cause::Cuda(error.to_string()));
                return PendingCollective::failed(error);
            }
        };
        state.inflight.push_back(InFlight {
            at: at.clone(),
            end: end.clone(),
            started,
            deadline,
            slot: slot.clone(),
        });
        if result != NcclResult::SUCCESS {
            let error = self.nccl_error(at, result, state.comm.as_ref());
            self.fail_locked(&mut state, Cause::Nccl(result, error.to_string()));
        }
        drop(state);
        crate::watchdog::wake();
        PendingCollective::queued(slot, self.clone(), end, streams)
    }

    /// Completes the ops whose end events have passed, and fails the
    /// communicator on NCCL's async error, a passed deadline or a failed
    /// CPU communicator. Cheap; never blocks on a busy communicator.
    pub(crate) fn progress(&self) {
        let Ok(mut state) = self.state.try_lock() else {
            return;
        };
        if state.failure.is_some() {
            if state
                .parked
                .as_ref()
                .is_some_and(|p| Instant::now() > p.until)
            {
                tracing::warn!(
                    rank = self.rank,
                    "no shrink took the failed GPU communicator within its grace; aborting it"
                );
                self.release_parked(&mut state);
            }
            return;
        }
        while let Some(front) = state.inflight.front() {
            match front.end.query() {
                Ok(true) => {
                    let done = state.inflight.pop_front().expect("front exists");
                    state.last_done = Some(done.at.seq);
                    done.slot.complete(Ok(()));
                }
                Ok(false) => break,
                Err(detail) => {
                    let why = format!("cuEventQuery failed: {detail}");
                    self.fail_locked(&mut state, Cause::Cuda(why));
                    return;
                }
            }
        }
        if let Some(comm) = state.comm.as_ref() {
            let async_error = self.lib.async_error(comm);
            if async_error != NcclResult::SUCCESS && async_error != NcclResult::IN_PROGRESS {
                let at = state
                    .inflight
                    .front()
                    .map_or_else(|| self.at(GpuOp::Group, state.next_seq), |f| f.at.clone());
                let error = self.nccl_error(at, async_error, Some(comm));
                self.fail_locked(&mut state, Cause::Nccl(async_error, error.to_string()));
                return;
            }
        }
        if state
            .inflight
            .front()
            .is_some_and(|f| Instant::now() > f.deadline)
        {
            self.fail_locked(&mut state, Cause::Timeout);
            return;
        }
        if let Some(reason) = self.cpu.failure() {
            self.fail_locked(&mut state, Cause::Remote(reason));
            return;
        }
        self.check_lost(&mut state);
    }

    /// Fails the communicator when ops are still in flight [`LOST_GRACE`]
    /// after a member's links failed: NCCL would wait for it forever.
    fn check_lost(&self, state: &mut State) {
        let now = Instant::now();
        if state.inflight.is_empty() {
            state.lost_since = None;
            return;
        }
        if state
            .lost_check
            .is_some_and(|at| now < at + LOST_CHECK_EVERY)
        {
            return;
        }
        state.lost_check = Some(now);
        let lost = self.cpu.lost_ranks();
        if lost.is_empty() {
            state.lost_since = None;
            return;
        }
        // Ops still finishing (those the lost rank served, or others among
        // the rest) restart the count.
        let last_done = state.last_done;
        let since = match state.lost_since {
            Some((since, done)) if done == last_done => since,
            _ => {
                state.lost_since = Some((now, last_done));
                now
            }
        };
        if now >= since + LOST_GRACE {
            let why = format!(
                "lost rank(s) {lost:?}: their links failed and no op finished for {LOST_GRACE:?}"
            );
            self.fail_locked(state, Cause::Lost(why));
        }
    }

    /// Whether ops are queued (the watchdog polls faster then).
    pub(crate) fn busy(&self) -> bool {
        self.state
            .try_lock()
            .map_or(true, |s| !s.inflight.is_empty())
    }

    /// Fails the communicator on purpose (every rank's ops end with
    /// [`GpuError::Aborted`]) and aborts NCCL's, also one a failure had
    /// kept for a shrink.
    pub(crate) fn abort(&self, reason: &str) {
        let mut state = lock(&self.state);
        if state.failure.is_none() {
            let why = format!("rank {} called abort(): {reason}", self.rank);
            self.fail_locked(&mut state, Cause::Local(why));
        }
        self.release_parked(&mut state);
    }

    /// Fails the communicator for a shrink (every rank's ops end with
    /// [`GpuError::Aborted`]) and hands over NCCL's, if it was kept (see
    /// the module docs).
    pub(crate) fn park_for_shrink(&self) -> Option<Parked> {
        let mut state = lock(&self.state);
        if state.failure.is_none() {
            let why = format!(
                "rank {} shrank it: a new communicator goes on without the lost ranks",
                self.rank
            );
            self.fail_locked(&mut state, Cause::Shrink(why));
        }
        state.parked.take()
    }

    /// See the module docs.
    pub(crate) fn fail_locked(&self, state: &mut State, cause: Cause) {
        if state.failure.is_some() {
            return;
        }
        let last = state
            .last_done
            .map_or("none yet".to_string(), |s| format!("#{s}"));
        let reason = match &cause {
            Cause::Nccl(_, text)
            | Cause::Cuda(text)
            | Cause::Local(text)
            | Cause::Lost(text)
            | Cause::Shrink(text) => text.clone(),
            Cause::Remote(text) => format!("the CPU communicator failed: {text}"),
            Cause::Timeout => {
                let f = state.inflight.front().expect("a timeout has a front op");
                format!(
                    "{} timed out after {:?} (enqueued, not finished on the device; last \
                     finished op {last})",
                    f.at,
                    f.started.elapsed()
                )
            }
        };
        tracing::error!(rank = self.rank, %reason, "GPU communicator failed; aborting it");
        state.failure = Some(reason.clone());
        let inflight: Vec<InFlight> = state.inflight.drain(..).collect();
        for (i, op) in inflight.iter().enumerate() {
            let error = match &cause {
                Cause::Timeout if i == 0 => GpuError::Timeout {
                    at: op.at.clone(),
                    waited: op.started.elapsed(),
                    state: format!("enqueued, not finished on the device; last finished op {last}"),
                },
                Cause::Nccl(code, _) if i == 0 => GpuError::Nccl {
                    at: op.at.clone(),
                    code: *code,
                    text: self.lib.error_string(*code),
                    last_error: self.lib.last_error(state.comm.as_ref()),
                },
                _ => GpuError::Aborted {
                    at: op.at.clone(),
                    reason: reason.clone(),
                },
            };
            op.slot.complete(Err(error));
        }
        if !matches!(cause, Cause::Remote(_)) {
            // Every rank must abort: NCCL peers of an aborted comm hang.
            self.cpu.abort(&format!("GPU communicator: {reason}"));
        }
        let comm = state.comm.take();
        if cause.parks()
            && self.lib.has_shrink()
            && let Some(comm) = comm
        {
            state.parked = Some(Parked {
                comm,
                inflight,
                until: Instant::now() + self.timeout + PARK_GRACE,
            });
            return;
        }
        spawn_abort(&self.lib, &self.device, comm, inflight, self.rank);
    }

    fn release_parked(&self, state: &mut State) {
        if let Some(parked) = state.parked.take() {
            let Parked { comm, inflight, .. } = parked;
            spawn_abort(&self.lib, &self.device, Some(comm), inflight, self.rank);
        }
    }

    /// Ends the communicator at drop: waits for queued ops (each bounded by
    /// its deadline, which the watchdog enforces), then finalizes and
    /// destroys it; a failed one was already aborted.
    fn close(&self) {
        loop {
            self.progress();
            let state = lock(&self.state);
            if state.failure.is_some() || state.inflight.is_empty() {
                break;
            }
            drop(state);
            std::thread::sleep(Duration::from_micros(200));
        }
        let mut state = lock(&self.state);
        self.release_parked(&mut state);
        let Some(comm) = state.comm.take() else {
            return;
        };
        drop(state);
        let _ = self.device.0.bind();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut result = self.lib.finalize(&comm);
        while result == NcclResult::IN_PROGRESS && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(200));
            result = self.lib.async_error(&comm);
        }
        if result == NcclResult::SUCCESS {
            let destroyed = self.lib.destroy(comm);
            if destroyed != NcclResult::SUCCESS {
                tracing::warn!(rank = self.rank, code = %destroyed, "ncclCommDestroy failed");
            }
        } else {
            tracing::warn!(rank = self.rank, code = %result, "ncclCommFinalize did not finish; aborting");
            spawn_abort(&self.lib, &self.device, Some(comm), Vec::new(), self.rank);
        }
    }
}

impl OpsComm for CommShared {
    fn progress(&self) {
        CommShared::progress(self);
    }

    fn cuda_error(&self, call: &'static str, detail: String) -> GpuError {
        CommShared::cuda_error(self, call, detail)
    }
}

impl Watched for CommShared {
    fn progress(&self) {
        CommShared::progress(self);
    }

    fn busy(&self) -> bool {
        CommShared::busy(self)
    }
}

impl Drop for CommShared {
    fn drop(&mut self) {
        self.close();
    }
}

/// [`abort_and_drain`] on a thread of its own.
pub(crate) fn spawn_abort(
    lib: &Arc<NcclLibrary>,
    device: &Device,
    comm: Option<RawComm>,
    inflight: Vec<InFlight>,
    rank: usize,
) {
    spawn_abort_then(lib, device, comm, inflight, rank, |_| {});
}

/// [`abort_and_drain`] on a thread of its own, then `then` with whether
/// `ncclCommAbort` returned in time.
pub(crate) fn spawn_abort_then(
    lib: &Arc<NcclLibrary>,
    device: &Device,
    comm: Option<RawComm>,
    inflight: Vec<InFlight>,
    rank: usize,
    then: impl FnOnce(bool) + Send + 'static,
) {
    let (lib, device) = (lib.clone(), device.clone());
    let spawned = std::thread::Builder::new()
        .name("ringwire-gpu-abort".into())
        .spawn(move || then(abort_and_drain(lib, device, comm, inflight, rank)));
    if let Err(e) = spawned {
        tracing::error!(error = %e, "could not start the abort thread; the communicator leaks");
    }
}

/// `ncclCommAbort` under [`ABORT_DEADLINE`], then the drain of the failed
/// ops' stream: their buffers are dropped once their end events pass, or
/// leaked if they do not within [`DRAIN_DEADLINE`]. False if the abort
/// did not return in time.
fn abort_and_drain(
    lib: Arc<NcclLibrary>,
    device: Device,
    comm: Option<RawComm>,
    inflight: Vec<InFlight>,
    rank: usize,
) -> bool {
    if let Some(comm) = comm {
        let (tx, rx) = std::sync::mpsc::channel();
        let lib2 = lib.clone();
        let device2 = device.clone();
        let spawned = std::thread::Builder::new()
            .name("ringwire-nccl-abort".into())
            .spawn(move || {
                let _ = device2.0.bind();
                let _ = tx.send(lib2.abort(comm));
            });
        match spawned.map(|_| rx.recv_timeout(ABORT_DEADLINE)) {
            Ok(Ok(code)) if code == NcclResult::SUCCESS => {}
            Ok(Ok(code)) => tracing::warn!(rank, %code, "ncclCommAbort returned an error"),
            _ => {
                tracing::error!(
                    rank,
                    "ncclCommAbort did not return within {ABORT_DEADLINE:?}; leaking the \
                     communicator and the buffers of its {} pending ops",
                    inflight.len()
                );
                std::mem::forget(inflight);
                return false;
            }
        }
    }
    let deadline = Instant::now() + DRAIN_DEADLINE;
    let mut pending = inflight;
    while !pending.is_empty() && Instant::now() < deadline {
        pending.retain(|op| !matches!(op.end.query(), Ok(true)));
        if !pending.is_empty() {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    if !pending.is_empty() {
        tracing::error!(
            rank,
            "the stream of an aborted GPU communicator did not drain within {DRAIN_DEADLINE:?}; \
             leaking the buffers of {} ops rather than freeing memory the device may write",
            pending.len()
        );
        std::mem::forget(pending);
    }
    true
}
