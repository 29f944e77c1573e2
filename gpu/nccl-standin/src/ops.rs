//! Running ops. A unit (one call, or a whole group) runs on a stream's
//! worker in three passes: every op sends its contributions, then every op
//! receives what it needs, then every op computes its result and writes
//! it. Inputs are copied before any output is written, so in-place calls
//! work, and a group's sends never wait for its receives.
//!
//! The algorithms are the simplest correct ones, not fast ones: each rank
//! sends its whole contribution to every rank that needs it and reduces
//! all contributions itself, in rank order.

use crate::codes::{DataType, RedOp};
use crate::comm::{Comm, RecvError, Sequence};
use crate::fault::OpFault;
use crate::hostmem::{HostIn, HostOut};
use crate::mesh::Mesh;
use crate::reduce::reduce;
use crate::wire::{KIND_P2P, Tag};
use std::sync::Arc;

/// What an op does, with its validated arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OpKind {
    AllReduce(RedOp),
    Broadcast { root: usize },
    Reduce { op: RedOp, root: usize },
    AllGather,
    ReduceScatter(RedOp),
    Send { peer: usize },
    Recv { peer: usize },
}

impl OpKind {
    /// The sequence that numbers this op's frames.
    pub(crate) fn sequence(self) -> Sequence {
        match self {
            OpKind::Send { peer } => Sequence::SendTo(peer),
            OpKind::Recv { peer } => Sequence::RecvFrom(peer),
            _ => Sequence::Collective,
        }
    }

    fn wire_kind(self) -> u8 {
        match self {
            OpKind::AllReduce(_) => 1,
            OpKind::Broadcast { .. } => 2,
            OpKind::Reduce { .. } => 3,
            OpKind::AllGather => 4,
            OpKind::ReduceScatter(_) => 5,
            OpKind::Send { .. } | OpKind::Recv { .. } => KIND_P2P,
        }
    }
}

/// One enqueued call.
pub(crate) struct Op {
    pub(crate) comm: Arc<Comm>,
    /// Its number among the comm's ops (what faults name).
    pub(crate) index: u64,
    /// Its number in its frame sequence.
    pub(crate) seq: u64,
    pub(crate) kind: OpKind,
    pub(crate) dtype: DataType,
    /// Bytes of one message: `count` elements as the call gave it.
    pub(crate) bytes: usize,
    pub(crate) input: Option<HostIn>,
    pub(crate) output: Option<HostOut>,
}

impl Op {
    fn tag(&self) -> Tag {
        let kind = self.kind.wire_kind();
        Tag {
            kind,
            // Point-to-point matches on bytes alone, as NCCL's does.
            dtype: if kind == KIND_P2P {
                0
            } else {
                self.dtype as u8
            },
            seq: self.seq,
            len: self.bytes as u64,
        }
    }
}

/// Ops run together on one stream. Counted as pending on their comms from
/// creation until dropped, whether they ran or not.
pub(crate) struct Unit {
    ops: Vec<Op>,
}

/// An op past its fault check, with what it sent and received.
struct Live<'a> {
    op: &'a Op,
    mesh: Arc<Mesh>,
    input: Vec<u8>,
    received: Vec<Option<Vec<u8>>>,
    failed: bool,
}

impl Unit {
    pub(crate) fn new(ops: Vec<Op>) -> Unit {
        for op in &ops {
            op.comm.begin_op();
        }
        Unit { ops }
    }

    /// Runs the unit on the calling (worker) thread.
    pub(crate) fn run(self) {
        let mut live: Vec<Live<'_>> = Vec::new();
        for op in &self.ops {
            let Some(mesh) = op.comm.wait_ready() else {
                continue;
            };
            if let Some(fault) = op.comm.faults.op(op.index) {
                if let OpFault::Error(code) = fault {
                    let text = format!(
                        "stand-in NCCL: injected error {code} at op {} on rank {}",
                        op.index, op.comm.rank
                    );
                    op.comm.set_async_error(code, &text);
                }
                op.comm.wait_aborted();
                continue;
            }
            let received = vec![None; op.comm.nranks];
            live.push(Live {
                op,
                mesh,
                input: Vec::new(),
                received,
                failed: false,
            });
        }
        for l in &mut live {
            l.input = l.op.input.map(|i| i.read()).unwrap_or_default();
            send(l);
        }
        for l in &mut live {
            l.failed = !receive(l);
        }
        for l in &live {
            if !l.failed && !l.op.comm.is_aborted() {
                finish(l);
            }
        }
    }
}

impl Drop for Unit {
    fn drop(&mut self) {
        for op in &self.ops {
            op.comm.end_op();
        }
    }
}

/// The ranks other than `rank`.
fn others(comm: &Comm) -> impl Iterator<Item = usize> + '_ {
    (0..comm.nranks).filter(move |&p| p != comm.rank)
}

fn send(l: &Live<'_>) {
    let (op, comm, tag) = (l.op, &l.op.comm, l.op.tag());
    let to = |peer: usize, payload: &[u8]| comm.send(&l.mesh, peer, tag, payload);
    match op.kind {
        OpKind::AllReduce(_) | OpKind::AllGather => others(comm).for_each(|p| to(p, &l.input)),
        OpKind::Broadcast { root } if root == comm.rank => {
            others(comm).for_each(|p| to(p, &l.input));
        }
        OpKind::Reduce { root, .. } if root != comm.rank => to(root, &l.input),
        OpKind::ReduceScatter(_) => {
            for p in others(comm) {
                to(p, &l.input[p * op.bytes..(p + 1) * op.bytes]);
            }
        }
        OpKind::Send { peer } => to(peer, &l.input),
        _ => {}
    }
}

/// Receives what the op needs; false if it gave up (abort or mismatch).
fn receive(l: &mut Live<'_>) -> bool {
    let (op, comm) = (l.op, &l.op.comm);
    let from: Vec<usize> = match op.kind {
        OpKind::AllReduce(_) | OpKind::AllGather | OpKind::ReduceScatter(_) => {
            others(comm).collect()
        }
        OpKind::Broadcast { root } if root != comm.rank => vec![root],
        OpKind::Reduce { root, .. } if root == comm.rank => others(comm).collect(),
        OpKind::Recv { peer } => vec![peer],
        _ => Vec::new(),
    };
    for peer in from {
        match comm.recv(peer, op.tag()) {
            Ok(payload) => l.received[peer] = Some(payload),
            Err(RecvError::Aborted | RecvError::Mismatch) => return false,
        }
    }
    true
}

/// Computes the op's result from its input and what it received, and
/// writes it.
fn finish(l: &Live<'_>) {
    let (op, comm) = (l.op, &l.op.comm);
    let bytes = op.bytes;
    // Rank r's contribution: our own `mine`, or what r sent.
    let contributions = |mine: &'_ [u8]| -> Vec<Vec<u8>> {
        (0..comm.nranks)
            .map(|r| match &l.received[r] {
                _ if r == comm.rank => mine.to_vec(),
                Some(payload) => payload.clone(),
                None => Vec::new(),
            })
            .collect()
    };
    let reduced = |red: RedOp, mine: &[u8]| {
        let all = contributions(mine);
        let refs: Vec<&[u8]> = all.iter().map(Vec::as_slice).collect();
        reduce(op.dtype, red, &refs, comm.nranks)
    };
    let result = match op.kind {
        OpKind::AllReduce(red) => reduced(red, &l.input),
        OpKind::Reduce { op: red, root } if root == comm.rank => reduced(red, &l.input),
        OpKind::ReduceScatter(red) => {
            reduced(red, &l.input[comm.rank * bytes..(comm.rank + 1) * bytes])
        }
        OpKind::Broadcast { root } if root == comm.rank => l.input.clone(),
        OpKind::AllGather => contributions(&l.input).concat(),
        OpKind::Broadcast { root: peer } | OpKind::Recv { peer } => {
            l.received[peer].clone().unwrap_or_default()
        }
        OpKind::Reduce { .. } | OpKind::Send { .. } => return,
    };
    if let Some(output) = op.output {
        output.write_at(0, &result);
    }
}
