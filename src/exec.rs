//! Runs a schedule on a transport: the I/O driver for the sans-IO
//! algorithms in [`crate::algo`].
//!
//! Each send becomes one data frame whose header carries the op's signature
//! (communicator, sequence number, kind, dtype, reduce op, root, count) and
//! the schedule position (step, chunk). Each receive checks all of it against
//! what this rank expects before touching the buffer, so ranks that disagree
//! about a collective fail with an error naming both sides instead of
//! producing garbage.

use crate::algo::{Action, Step};
use crate::error::{Error, OpContext};
use crate::transport::{LinkError, Received, Transport};
use crate::wire::{Header, OpKind};
use crate::{DType, Element, ReduceOp};
use std::time::{Duration, Instant};
use zerocopy::IntoBytes;

/// Everything a frame of this op must agree on.
pub(crate) struct OpSignature {
    pub(crate) comm_id: u64,
    pub(crate) seq: u64,
    pub(crate) op: OpKind,
    pub(crate) dtype: DType,
    pub(crate) reduce_op: Option<ReduceOp>,
    pub(crate) root: u32,
    /// Checked only when every rank passes the same count.
    pub(crate) count: Option<u64>,
}

impl OpSignature {
    fn header(&self) -> Header {
        let mut h = Header::data(self.comm_id, self.seq, self.op, self.dtype)
            .with_root(self.root)
            .with_count(self.count.unwrap_or(0));
        h.reduce_op = self.reduce_op;
        h
    }

    fn describe(
        op: OpKind,
        seq: u64,
        dtype: Option<DType>,
        count: u64,
        root: u32,
        reduce: Option<ReduceOp>,
    ) -> String {
        let dtype = dtype.map_or("?", DType::name);
        let mut s = format!("{op} #{seq} ({dtype}, {count} elements");
        if let Some(r) = reduce {
            s += &format!(", {r}");
        }
        if matches!(op, OpKind::Broadcast | OpKind::Reduce) {
            s += &format!(", root {root}");
        }
        s + ")"
    }

    /// Compares an incoming header with this op; a description of the
    /// difference if they disagree.
    fn mismatch(&self, h: &Header, my_rank: usize, peer: usize) -> Option<String> {
        let same = h.comm_id == self.comm_id
            && h.seq == self.seq
            && h.op == self.op
            && h.dtype == Some(self.dtype)
            && h.reduce_op == self.reduce_op
            && h.root == self.root
            && self.count.is_none_or(|c| c == h.count);
        (!same).then(|| {
            format!(
                "rank {my_rank} called {} but rank {peer} called {}",
                Self::describe(
                    self.op,
                    self.seq,
                    Some(self.dtype),
                    self.count.unwrap_or(0),
                    self.root,
                    self.reduce_op
                ),
                Self::describe(h.op, h.seq, h.dtype, h.count, h.root, h.reduce_op),
            )
        })
    }
}

/// Bytes moved by one op, for stats.
#[derive(Default, Clone, Copy)]
pub(crate) struct Traffic {
    pub(crate) sent: u64,
    pub(crate) received: u64,
}

/// Runs `steps` on `work`. `members` maps communicator ranks to the
/// transport's (world) ranks.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run<T: Element>(
    transport: &dyn Transport,
    members: &[usize],
    sig: &OpSignature,
    ctx: &OpContext,
    steps: &[Step],
    work: &mut [T],
    started: Instant,
    timeout: Duration,
    traffic: &mut Traffic,
) -> Result<(), Error> {
    let deadline = started + timeout;
    let template = sig.header();
    let elem = size_of::<T>();
    for step in steps {
        match step {
            Step::Send {
                peer,
                range,
                step,
                chunk,
            } => {
                let payload = work[range.clone()].as_bytes();
                let header = template
                    .with_step(*step, *chunk)
                    .with_payload_len(payload.len() as u32);
                transport
                    .send(members[*peer], &header, payload, deadline)
                    .map_err(|e| link_error(e, ctx, *peer, started, members))?;
                traffic.sent += payload.len() as u64;
            }
            Step::Recv {
                peer,
                range,
                step,
                chunk,
                action,
            } => {
                let dest = &mut work[range.clone()];
                let received = match action {
                    // Copies may land in place: no buffer, no second copy.
                    Action::Copy => transport.recv_into(
                        sig.comm_id,
                        members[*peer],
                        (sig.seq, *step, *chunk),
                        dest.as_mut_bytes(),
                        deadline,
                    ),
                    Action::Reduce => transport
                        .recv(sig.comm_id, members[*peer], deadline)
                        .map(Received::Frame),
                }
                .map_err(|e| link_error(e, ctx, *peer, started, members))?;
                let (h, payload_len) = match &received {
                    Received::Placed(h) => (h, h.payload_len_usize()),
                    Received::Frame(incoming) => (&incoming.header, incoming.payload.len()),
                };
                let mismatch = |detail: String| Error::Mismatch {
                    ctx: ctx.clone(),
                    peer: *peer,
                    detail,
                };
                if let Some(detail) = sig.mismatch(h, ctx.rank, *peer) {
                    return Err(mismatch(detail));
                }
                if (h.step, h.chunk) != (*step, *chunk) || payload_len != range.len() * elem {
                    return Err(mismatch(format!(
                        "expected step {step} chunk {chunk} with {} elements, got step {} chunk {} with {} bytes \
                         (the ranks disagree on the element count or chunk size)",
                        range.len(),
                        h.step,
                        h.chunk,
                        payload_len
                    )));
                }
                traffic.received += payload_len as u64;
                let Received::Frame(incoming) = received else {
                    continue; // already in place
                };
                let Some(data) = incoming.payload.as_slice::<T>() else {
                    return Err(mismatch("payload is not a whole number of elements".into()));
                };
                // Copy steps ignore the operator; reducing ops always carry one.
                let op = sig.reduce_op.unwrap_or(ReduceOp::Sum);
                action.apply(dest, data, op);
                transport.recycle(incoming.payload);
            }
        }
    }
    Ok(())
}

fn link_error(
    e: LinkError,
    ctx: &OpContext,
    peer: usize,
    started: Instant,
    members: &[usize],
) -> Error {
    match e {
        LinkError::Aborted {
            origin,
            seq,
            reason,
        } => Error::Aborted {
            ctx: ctx.clone(),
            // Name the origin by its rank in this communicator when it is one.
            origin: members.iter().position(|&w| w == origin).unwrap_or(origin),
            origin_seq: seq,
            reason,
        },
        LinkError::Timeout => Error::Timeout {
            ctx: ctx.clone(),
            peer,
            waited: started.elapsed(),
            detail: String::new(),
        },
        LinkError::Lost(reason) => Error::PeerLost {
            ctx: ctx.clone(),
            peer,
            reason,
        },
        LinkError::Connect { addr, detail } => Error::Connect {
            peer,
            addr,
            detail: format!("during {ctx}: {detail}"),
        },
    }
}
