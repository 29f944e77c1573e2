//! How one op runs, whoever runs it (the executor thread, or a caller
//! running it in place): numbered ([`Ticket`]) and wrapped by [`execute`]
//! (the failed-communicator check, run-ahead `begin`, flight record, span,
//! the debug signature check, stats, and on failure the diagnosis and the
//! abort flood).

use super::context::{Ctx, Executor, OpPlan};
use super::diagnose;
use crate::error::{Error, OpContext};
use crate::exec::OpSignature;
use crate::locks::lock;
use crate::stats::Traffic;
use std::panic::{self, AssertUnwindSafe};
use std::time::{Duration, Instant};

/// A numbered op, ready to run.
pub(super) struct Ticket {
    pub(super) plan: OpPlan,
    pub(super) seq: u64,
    pub(super) peer: Option<usize>,
    /// A point-to-point receive's source (world rank).
    pub(super) receives_from: Option<usize>,
    /// An exchange's send number (its `seq` is its receive's).
    pub(super) send_seq: Option<u64>,
    pub(super) timeout: Duration,
}

/// Whom a point-to-point op sends to and receives from (ranks of the
/// communicator).
#[derive(Clone, Copy, Debug)]
pub(super) enum P2p {
    Send(usize),
    Recv(usize),
    Exchange { to: usize, from: usize },
}

/// Ops below this many bytes are latency-bound: queued, they do not wake
/// the executor (their waiter usually runs them, decision 0008), and on a
/// crowded host they run from a home core. Larger ones wake the executor at
/// once, so work nobody waits for yet starts before anyone does. (Which
/// algorithm an op uses is `small_message_bytes`, a separate threshold.)
pub(super) const LATENCY_BOUND_BYTES: u64 = 64 << 10;

/// The executor polls at most this long after a job for the next one
/// (`RINGWIRE_SPIN_US` may be longer: it is sized for waits on peers).
pub(super) const EXECUTOR_SPIN: Duration = Duration::from_micros(200);

/// Restores the thread's home core when an op that cleared it ends.
pub(super) struct HomeCleared(Option<usize>);

impl Drop for HomeCleared {
    fn drop(&mut self) {
        ringwire_uring::set_home_core(self.0);
    }
}

/// Runs one op on the calling thread (the executor, or a caller running it
/// itself) with everything around it: the failed-communicator check, the
/// flight record, the span, debug signature checks, stats, and on failure
/// who is missing, the abort flood and the flight-record dump.
pub(super) fn execute<R>(
    ex: &Executor,
    ticket: Ticket,
    job: impl FnOnce(&mut Ctx<'_>) -> Result<R, Error>,
) -> Result<R, Error> {
    let Ticket {
        plan,
        seq,
        peer,
        receives_from,
        send_seq,
        timeout,
    } = ticket;
    if let Some(first) = lock(&ex.state).clone() {
        ex.recorder.ended(
            plan.kind,
            seq,
            peer,
            Some("not run: communicator failed".into()),
        );
        let refused = Error::Failed { first };
        ex.stats.failed(&refused);
        return Err(refused);
    }
    let recorded_start = ex.recorder.started(plan.kind, seq, peer);
    // Peers' frames for this op stop counting as run ahead (decision 0019).
    // A send receives nothing, and its number counts sends to one peer, not
    // collectives: it begins nothing.
    let sends_only = peer.is_some() && receives_from.is_none();
    if !sends_only {
        ex.world.transport.begin(ex.comm_id, seq, receives_from);
    }
    // On a crowded host (more local ranks than cores) a home core steadies
    // latency-bound ops (no two ranks of a recursive-doubling round stacked
    // on one core), but large ones ran faster where the scheduler put them
    // (measured, docs/perf.md): drop the home for the op.
    let bytes = plan.count * plan.dtype.size() as u64;
    let _placement = (ex.world.crowded && bytes >= LATENCY_BOUND_BYTES)
        .then(|| HomeCleared(ringwire_uring::set_home_core(None)));
    let span = tracing::debug_span!(
        "collective",
        op = %plan.kind,
        seq,
        rank = ex.rank,
        bytes
    );
    let _entered = span.enter();
    let mut ctx = Ctx {
        ex,
        sig: OpSignature {
            comm_id: ex.comm_id,
            seq,
            op: plan.kind,
            dtype: plan.dtype,
            reduce_op: plan.reduce_op,
            root: plan.root,
            count: plan.uniform_count.then_some(plan.count),
            send_seq,
            send_count: None,
        },
        op: OpContext {
            op: plan.kind,
            seq,
            dtype: plan.dtype.name(),
            count: plan.count,
            rank: ex.rank,
        },
        started: Instant::now(),
        timeout,
        traffic: Traffic::default(),
        pace: false,
    };
    let mut result = match (ex.tunables.debug_checks && peer.is_none())
        .then(|| diagnose::check_signature(&mut ctx, &plan))
    {
        Some(Err(e)) => Err(e),
        // A panic (a bug of ringwire's, or of a caller's buffer type) must
        // not leave the peers waiting in step with an op this rank dropped:
        // it fails the communicator as an internal error would.
        _ => panic::catch_unwind(AssertUnwindSafe(|| job(&mut ctx))).unwrap_or_else(|panic| {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            Err(Error::Internal {
                ctx: ctx.op.clone(),
                detail: format!(
                    "the op panicked (in ringwire or in the caller's buffer type): {what}"
                ),
            })
        }),
    };
    // A two-level op's error comes from one of its groups, whose own op
    // already asked the store who was missing: that answer names them.
    let asked = ctx.traffic.two_level;
    if !asked
        && let Err(Error::Timeout {
            ctx: op_ctx,
            peer,
            waited,
            detail,
        }) = result
    {
        // After what the op said (a send's "to take a frame").
        let detail = detail + &diagnose::who_is_missing(ex, seq);
        result = Err(Error::Timeout {
            ctx: op_ctx,
            peer,
            waited,
            detail,
        });
    } else if result.as_ref().is_err_and(Error::is_fatal) {
        // Ranks that failed otherwise did reach the op: say so, for the
        // ranks that time out.
        diagnose::report_progress(ex, seq);
    }
    // One clock read for the stats, the flight record and the log.
    let took = ctx.started.elapsed();
    ex.recorder.ended_after(
        (plan.kind, seq, peer),
        result.as_ref().err().map(ToString::to_string),
        recorded_start,
        took,
    );
    match &result {
        Ok(_) => {
            ex.stats.record(plan.kind, took, ctx.traffic);
            tracing::debug!(elapsed_us = took.as_micros() as u64, "done");
        }
        Err(e) => {
            ex.stats.failed(e);
            tracing::error!(error = %e, "collective failed");
            if e.is_fatal() {
                lock(&ex.state).get_or_insert_with(|| e.to_string());
                // Tell every rank, not only the neighbours of the failure,
                // so none waits for its timeout.
                ex.world
                    .transport
                    .abort(ex.comm_id, seq, &e.to_string(), &ex.members);
                diagnose::dump_flight_record(ex);
            }
        }
    }
    result
}
