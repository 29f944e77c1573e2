//! The one place outside the C bindings that hands memory to NCCL: a
//! planned op's calls, between `ncclGroupStart` and `ncclGroupEnd`, on the
//! communicator's stream.
//!
//! Why the addresses stay valid: a [`Call`] is made only by the ops in
//! `communicator.rs`, from buffers whose lengths they checked against the
//! counts and which `flight::launch` has already moved into the op's slot
//! before calling [`enqueue`]. The slot frees them only after the end event
//! recorded behind these calls has completed, or never (after an abort
//! whose stream did not drain).

#![allow(unsafe_code)]

use crate::nccl::codes::{NcclDataType, NcclRedOp, NcclResult};
use crate::nccl::library::{NcclLibrary, RawComm, RawStream};

/// One NCCL call of a planned op; addresses are device pointers.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Call {
    AllReduce {
        send: u64,
        recv: u64,
        count: usize,
        dtype: NcclDataType,
        op: NcclRedOp,
    },
    Broadcast {
        send: u64,
        recv: u64,
        count: usize,
        dtype: NcclDataType,
        root: usize,
    },
    Reduce {
        send: u64,
        recv: u64,
        count: usize,
        dtype: NcclDataType,
        op: NcclRedOp,
        root: usize,
    },
    AllGather {
        send: u64,
        recv: u64,
        count: usize,
        dtype: NcclDataType,
    },
    ReduceScatter {
        send: u64,
        recv: u64,
        count: usize,
        dtype: NcclDataType,
        op: NcclRedOp,
    },
    Send {
        buf: u64,
        count: usize,
        dtype: NcclDataType,
        peer: usize,
    },
    Recv {
        buf: u64,
        count: usize,
        dtype: NcclDataType,
        peer: usize,
    },
}

/// Queues `calls` as one NCCL group. Returns `ncclGroupEnd`'s result
/// (usually success or in progress), or the first failing call's result
/// (the group is still closed).
pub(crate) fn enqueue(
    lib: &NcclLibrary,
    comm: &RawComm,
    stream: RawStream,
    calls: &[Call],
) -> NcclResult {
    let started = lib.group_start();
    if started != NcclResult::SUCCESS {
        return started;
    }
    let mut failed = None;
    for call in calls {
        // SAFETY: see the module docs: every address lies in a buffer the
        // op owns until its end event has completed, and each count was
        // checked against that buffer's length.
        let result = unsafe {
            match *call {
                Call::AllReduce {
                    send,
                    recv,
                    count,
                    dtype,
                    op,
                } => lib.all_reduce(send, recv, count, dtype, op, comm, stream),
                Call::Broadcast {
                    send,
                    recv,
                    count,
                    dtype,
                    root,
                } => lib.broadcast(send, recv, count, dtype, root, comm, stream),
                Call::Reduce {
                    send,
                    recv,
                    count,
                    dtype,
                    op,
                    root,
                } => lib.reduce(send, recv, count, dtype, op, root, comm, stream),
                Call::AllGather {
                    send,
                    recv,
                    count,
                    dtype,
                } => lib.all_gather(send, recv, count, dtype, comm, stream),
                Call::ReduceScatter {
                    send,
                    recv,
                    count,
                    dtype,
                    op,
                } => lib.reduce_scatter(send, recv, count, dtype, op, comm, stream),
                Call::Send {
                    buf,
                    count,
                    dtype,
                    peer,
                } => lib.send(buf, count, dtype, peer, comm, stream),
                Call::Recv {
                    buf,
                    count,
                    dtype,
                    peer,
                } => lib.recv(buf, count, dtype, peer, comm, stream),
            }
        };
        if result != NcclResult::SUCCESS && result != NcclResult::IN_PROGRESS {
            failed = Some(result);
            break;
        }
    }
    let ended = lib.group_end();
    failed.unwrap_or(ended)
}
