//! NCCL's collectives and point-to-point calls: checked, their buffers
//! wrapped for the stream's worker, and submitted.

use super::{CudaStream, NcclComm, guard};
use crate::calls::{self, RawKind};
use crate::codes::{NcclResult, SUCCESS};
use crate::hostmem::{HostIn, HostOut};
use std::ffi::{c_int, c_void};

/// Checks a call, wraps its buffers and submits it.
///
/// # Safety
/// `send` and `recv` must be valid for the reads and writes the call makes
/// (nccl.h's sizes for it) until its stream has run it.
#[allow(clippy::too_many_arguments)]
unsafe fn enqueue(
    what: &str,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    kind: RawKind,
    comm: NcclComm,
    stream: CudaStream,
) -> NcclResult {
    guard(|| {
        let checked = match calls::check(
            what,
            comm,
            stream,
            count,
            dtype,
            kind,
            send.is_null(),
            recv.is_null(),
        ) {
            Ok(Some(checked)) => checked,
            Ok(None) => return SUCCESS,
            Err(code) => return code,
        };
        // SAFETY: the caller's contract; `check` computed the lengths from
        // nccl.h's rules for this call and rejected NULL buffers it uses.
        let input = checked
            .input_len
            .map(|len| unsafe { HostIn::new(send, len) });
        // SAFETY: as above, for the buffer the call writes.
        let output = checked
            .output_len
            .map(|len| unsafe { HostOut::new(recv, len) });
        calls::submit(checked, input, output)
    })
}

/// `ncclAllReduce`.
///
/// # Safety
/// `sendbuff` and `recvbuff` must hold `count` elements of `datatype`
/// (they may be the same) and stay valid until `stream` has run the op.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    op: c_int,
    comm: NcclComm,
    stream: CudaStream,
) -> NcclResult {
    let kind = RawKind::AllReduce { op };
    // SAFETY: the caller's contract, which is `enqueue`'s.
    unsafe {
        enqueue(
            "ncclAllReduce",
            sendbuff,
            recvbuff,
            count,
            datatype,
            kind,
            comm,
            stream,
        )
    }
}

/// `ncclBroadcast`.
///
/// # Safety
/// `recvbuff` (and on the root `sendbuff`) must hold `count` elements and
/// stay valid until `stream` has run the op.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    root: c_int,
    comm: NcclComm,
    stream: CudaStream,
) -> NcclResult {
    let kind = RawKind::Broadcast { root };
    // SAFETY: the caller's contract, which is `enqueue`'s.
    unsafe {
        enqueue(
            "ncclBroadcast",
            sendbuff,
            recvbuff,
            count,
            datatype,
            kind,
            comm,
            stream,
        )
    }
}

/// `ncclReduce`: `recvbuff` is only written (and only needed) on `root`.
///
/// # Safety
/// `sendbuff` (and on the root `recvbuff`) must hold `count` elements and
/// stay valid until `stream` has run the op.
#[allow(clippy::too_many_arguments)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    op: c_int,
    root: c_int,
    comm: NcclComm,
    stream: CudaStream,
) -> NcclResult {
    let kind = RawKind::Reduce { op, root };
    // SAFETY: the caller's contract, which is `enqueue`'s.
    unsafe {
        enqueue(
            "ncclReduce",
            sendbuff,
            recvbuff,
            count,
            datatype,
            kind,
            comm,
            stream,
        )
    }
}

/// `ncclAllGather`: rank r's `sendcount` elements land at `r * sendcount`.
///
/// # Safety
/// `sendbuff` must hold `sendcount` elements and `recvbuff` `nranks *
/// sendcount`, valid until `stream` has run the op.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: c_int,
    comm: NcclComm,
    stream: CudaStream,
) -> NcclResult {
    let kind = RawKind::AllGather;
    // SAFETY: the caller's contract, which is `enqueue`'s.
    unsafe {
        enqueue(
            "ncclAllGather",
            sendbuff,
            recvbuff,
            sendcount,
            datatype,
            kind,
            comm,
            stream,
        )
    }
}

/// `ncclReduceScatter`: rank r gets the reduction of every rank's block r.
///
/// # Safety
/// `sendbuff` must hold `nranks * recvcount` elements and `recvbuff`
/// `recvcount`, valid until `stream` has run the op.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: c_int,
    op: c_int,
    comm: NcclComm,
    stream: CudaStream,
) -> NcclResult {
    let kind = RawKind::ReduceScatter { op };
    // SAFETY: the caller's contract, which is `enqueue`'s.
    unsafe {
        enqueue(
            "ncclReduceScatter",
            sendbuff,
            recvbuff,
            recvcount,
            datatype,
            kind,
            comm,
            stream,
        )
    }
}

/// `ncclSend`.
///
/// # Safety
/// `sendbuff` must hold `count` elements, valid until `stream` has run it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: c_int,
    peer: c_int,
    comm: NcclComm,
    stream: CudaStream,
) -> NcclResult {
    let kind = RawKind::Send { peer };
    let no_recv = std::ptr::null_mut();
    // SAFETY: the caller's contract, which is `enqueue`'s; a send writes
    // nothing.
    unsafe {
        enqueue(
            "ncclSend", sendbuff, no_recv, count, datatype, kind, comm, stream,
        )
    }
}

/// `ncclRecv`.
///
/// # Safety
/// `recvbuff` must hold `count` elements, valid until `stream` has run it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    peer: c_int,
    comm: NcclComm,
    stream: CudaStream,
) -> NcclResult {
    let kind = RawKind::Recv { peer };
    let no_send = std::ptr::null();
    // SAFETY: the caller's contract, which is `enqueue`'s; a receive reads
    // nothing.
    unsafe {
        enqueue(
            "ncclRecv", no_send, recvbuff, count, datatype, kind, comm, stream,
        )
    }
}
