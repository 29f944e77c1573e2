//! The forms every collective comes in, written once for all of them:
//! owned buffers in, a [`PendingCollective`] out (queued on the
//! communicator, run by its executor or by a waiter, decision 0008); and
//! blocking over borrowed slices (run right here on the caller's slices
//! when nothing else of the communicator is queued or running, the usual
//! case for blocking code: no copies in or out, no allocation; else queued
//! behind the others on copies of the slices). Ops are numbered here, in
//! queue order, which is the order every rank must call them in.

use super::context::OpPlan;
use super::execute::{LATENCY_BOUND_BYTES, P2p, Ticket, execute};
use super::ops::{InPlace, InToOut, Member};
use super::{Communicator, Queue, lock};
use crate::Element;
use crate::buffer::CollectiveBuffer;
use crate::comm::context::{Ctx, Executor};
use crate::error::Error;
use crate::pending::{PendingCollective, queued};
use crate::runner::Help;
use std::sync::Arc;

impl Communicator {
    /// This rank's place in the communicator.
    pub(super) fn member(&self) -> Member {
        Member {
            rank: self.inner.rank,
            size: self.inner.size,
        }
    }

    /// `op` on an owned buffer, queued.
    pub(super) fn owned_in_place<T, B, C>(&self, op: C, mut buf: B) -> PendingCollective<B>
    where
        T: Element,
        B: CollectiveBuffer<T>,
        C: InPlace<T>,
    {
        let plan = op.plan(self.member(), buf.as_slice().len());
        self.submit_checked(plan, None, move |cx| {
            op.run(cx, buf.as_mut_slice())?;
            Ok(buf)
        })
    }

    /// `op` on a borrowed slice, blocking.
    pub(super) fn blocking_in_place<T, C>(&self, op: C, data: &mut [T]) -> Result<(), Error>
    where
        T: Element,
        C: InPlace<T>,
    {
        let plan = op.plan(self.member(), data.len())?;
        if let Some(done) = self.run_now(plan, |cx| op.run(cx, data)) {
            return done;
        }
        let out = self.owned_in_place(op, data.to_vec()).wait()?;
        data.copy_from_slice(&out);
        Ok(())
    }

    /// `op` from an owned input into an owned output, queued.
    pub(super) fn owned_in_to_out<T, B, O, C>(
        &self,
        op: C,
        input: B,
        mut output: O,
    ) -> PendingCollective<(B, O)>
    where
        T: Element,
        B: CollectiveBuffer<T>,
        O: CollectiveBuffer<T>,
        C: InToOut<T>,
    {
        let (n, out) = (input.as_slice().len(), output.as_slice().len());
        let plan = op.plan(self.member(), n, out);
        self.submit_checked(plan, None, move |cx| {
            op.run(cx, input.as_slice(), output.as_mut_slice())?;
            Ok((input, output))
        })
    }

    /// `op` from a borrowed input into a borrowed output, blocking. Queued
    /// behind other ops, it runs on copies of what this rank uses (a
    /// rooted op's other buffer is neither copied nor written).
    pub(super) fn blocking_in_to_out<T, C>(
        &self,
        op: C,
        input: &[T],
        output: &mut [T],
    ) -> Result<(), Error>
    where
        T: Element,
        C: InToOut<T>,
    {
        let plan = op.plan(self.member(), input.len(), output.len())?;
        if let Some(done) = self.run_now(plan, |cx| op.run(cx, input, output)) {
            return done;
        }
        let (reads, writes) = op.uses(self.inner.rank);
        let copy_in = if reads { input.to_vec() } else { Vec::new() };
        let room = if writes { output.len() } else { 0 };
        let (_, out) = self
            .owned_in_to_out(op, copy_in, vec![T::default(); room])
            .wait()?;
        if writes {
            output.copy_from_slice(&out);
        }
        Ok(())
    }

    /// Queues `job`; `p2p` says which peers a point-to-point op sends to
    /// and receives from (they count their sequence numbers per peer pair).
    pub(super) fn submit<R: Send + 'static>(
        &self,
        plan: OpPlan,
        p2p: Option<P2p>,
        job: impl FnOnce(&mut Ctx<'_>) -> Result<R, Error> + Send + 'static,
    ) -> PendingCollective<R> {
        let helper: Arc<dyn Help> = self.inner.runner.clone();
        // Large ops start on the executor at once; a small one is usually
        // run by its waiter (see `runner`).
        let urgent = plan.count * plan.dtype.size() as u64 >= LATENCY_BOUND_BYTES;
        let mut queue = lock(&self.inner.queue);
        let kind = plan.kind;
        let ticket = self.ticket(&mut queue, plan, p2p);
        let (seq, peer) = (ticket.seq, ticket.peer);
        let (handle, queued_job) = queued(
            kind,
            self.inner.tunables.spin,
            helper,
            &self.inner.cells,
            move |ex: &Executor| execute(ex, ticket, job),
        );
        // Under the queue lock, so jobs queue in sequence order. Refused
        // after `shutdown`: the dropped job fails the handle.
        if !self.inner.runner.push(queued_job, urgent) {
            let why = "not run: communicator shut down".to_string();
            self.inner.recorder.ended(kind, seq, peer, Some(why));
        }
        handle
    }

    /// [`Communicator::submit`] for a plan that passed its argument checks;
    /// a handle that has already failed with the check's error otherwise.
    pub(super) fn submit_checked<R: Send + 'static>(
        &self,
        plan: Result<OpPlan, Error>,
        p2p: Option<P2p>,
        job: impl FnOnce(&mut Ctx<'_>) -> Result<R, Error> + Send + 'static,
    ) -> PendingCollective<R> {
        match plan {
            Ok(plan) => self.submit(plan, p2p, job),
            Err(e) => PendingCollective::ready(Err(e)),
        }
    }

    /// Runs `job` on the calling thread right away if this communicator has
    /// nothing queued or running (the blocking forms: no job box, no
    /// handle, and the caller's slices are used in place); `None`, without
    /// calling `job`, if it is busy.
    fn run_now<R>(
        &self,
        plan: OpPlan,
        job: impl FnOnce(&mut Ctx<'_>) -> Result<R, Error>,
    ) -> Option<Result<R, Error>> {
        let mut queue = lock(&self.inner.queue);
        let claim = self.inner.runner.claim()?;
        let ticket = self.ticket(&mut queue, plan, None);
        drop(queue);
        let result = execute(claim.context(), ticket, job);
        drop(claim);
        Some(result)
    }

    /// Numbers an op (under the queue lock) and records it as queued.
    fn ticket(&self, queue: &mut Queue, plan: OpPlan, p2p: Option<P2p>) -> Ticket {
        let mut count = |key: (usize, bool)| {
            let s = queue.p2p_seq.entry(key).or_insert(0);
            *s += 1;
            *s
        };
        // A receive's frames carry the sender's count, matched here; an
        // exchange is numbered as its receive, its send carries its own.
        let (seq, send_seq, peer, from) = match p2p {
            None => {
                queue.next_seq += 1;
                (queue.next_seq, None, None, None)
            }
            Some(P2p::Send(to)) => (count((to, true)), None, Some(to), None),
            Some(P2p::Recv(from)) => (count((from, false)), None, Some(from), Some(from)),
            Some(P2p::Exchange { to, from }) => {
                let send_seq = count((to, true));
                (count((from, false)), Some(send_seq), Some(from), Some(from))
            }
        };
        self.inner.recorder.queued(
            plan.kind,
            seq,
            plan.dtype.name(),
            plan.count,
            plan.count * plan.dtype.size() as u64,
            peer,
        );
        Ticket {
            plan,
            seq,
            peer,
            receives_from: from.map(|p| self.inner.members[p]),
            send_seq,
            timeout: self.timeout,
        }
    }
}
