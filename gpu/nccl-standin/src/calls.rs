//! The NCCL entry points, safe: argument checks, comm handles, and the
//! building of ops. `abi` converts C's pointers and calls these.

use crate::codes::{
    self, DataType, IN_PROGRESS, INVALID_ARGUMENT, NcclResult, RedOp, SUCCESS, SYSTEM_ERROR,
    UNHANDLED_CUDA_ERROR,
};
use crate::comm::{COMMS, Comm};
use crate::envcfg;
use crate::fault::{self, RankFaults};
use crate::group;
use crate::hostmem::{HostIn, HostOut};
use crate::lasterror;
use crate::ops::{Op, OpKind};
use crate::rendezvous::{self, BootstrapId};
use crate::setup;
use crate::shrink::{self, Publish};
use crate::stream::Stream;
use std::ffi::{CStr, c_int, c_void};
use std::sync::Arc;

/// Logs "stand-in NCCL: `what`: `text`" and returns `ncclInvalidArgument`.
fn invalid(what: &str, text: &str) -> NcclResult {
    lasterror::set(&format!("stand-in NCCL: {what}: {text}"));
    INVALID_ARGUMENT
}

/// What `ncclGetVersion` reports.
pub(crate) fn version() -> c_int {
    let version = envcfg::var(envcfg::VERSION)
        .and_then(|v| codes::parse_version(&v))
        .unwrap_or(codes::DEFAULT_VERSION);
    codes::version_code(version)
}

/// `ncclGetUniqueId`: starts a bootstrap root.
pub(crate) fn unique_id() -> Result<[u8; 128], NcclResult> {
    rendezvous::start_root()
        .map(BootstrapId::to_bytes)
        .map_err(|e| {
            lasterror::set(&format!(
                "stand-in NCCL: cannot start a bootstrap root: {e}"
            ));
            SYSTEM_ERROR
        })
}

/// `ncclCommInitRank(Config)`: the new handle and the call's result
/// (in-progress for a non-blocking comm), or an error and no comm.
pub(crate) fn init_rank(
    nranks: c_int,
    id: &[u8; 128],
    rank: c_int,
    blocking: bool,
) -> Result<(*mut c_void, NcclResult), NcclResult> {
    let what = "ncclCommInitRank";
    let nranks = usize::try_from(nranks)
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| invalid(what, &format!("invalid nranks {nranks}")))?;
    let rank = usize::try_from(rank)
        .ok()
        .filter(|r| *r < nranks)
        .ok_or_else(|| invalid(what, &format!("invalid rank {rank} of {nranks}")))?;
    let id = BootstrapId::parse(id).ok_or_else(|| {
        invalid(
            what,
            "the unique id was not made by this stand-in's ncclGetUniqueId",
        )
    })?;
    let faults = match envcfg::var(envcfg::FAULT) {
        Some(text) => {
            fault::parse(&text).map_err(|e| invalid(what, &format!("{}: {e}", envcfg::FAULT)))?
        }
        None => Vec::new(),
    };
    let faults = RankFaults::for_rank(&faults, rank);
    if faults.init_fail {
        lasterror::set("stand-in NCCL: injected init failure (no CUDA device)");
        return Err(UNHANDLED_CUDA_ERROR);
    }
    let polls = envcfg::inprogress_polls();
    let comm = Arc::new(Comm::new(nranks, rank, blocking, id.nonce, faults, polls));
    if blocking && !group::active() {
        setup::run(&comm, id);
        return match comm.wait_setup() {
            SUCCESS => Ok((COMMS.insert(comm), SUCCESS)),
            code => Err(code),
        };
    }
    let handle = COMMS.insert(Arc::clone(&comm));
    let worker = Arc::clone(&comm);
    let started = std::thread::Builder::new()
        .name("standin-setup".into())
        .spawn(move || setup::run(&worker, id));
    if let Err(e) = started {
        COMMS.remove(handle);
        comm.abort();
        lasterror::set(&format!("stand-in NCCL: cannot start a setup thread: {e}"));
        return Err(SYSTEM_ERROR);
    }
    if blocking {
        group::defer_init(comm);
        Ok((handle, SUCCESS))
    } else {
        Ok((handle, IN_PROGRESS))
    }
}

/// The live comm of `handle`, or `ncclInvalidArgument` (logged).
pub(crate) fn comm(handle: *const c_void, what: &str) -> Result<Arc<Comm>, NcclResult> {
    if handle.is_null() {
        return Err(invalid(what, "comm is NULL"));
    }
    COMMS
        .get(handle)
        .ok_or_else(|| invalid(what, "not a live communicator"))
}

/// `ncclGetLastError`: the comm's last error if it has one, else the
/// process's.
pub(crate) fn last_error(handle: *const c_void) -> &'static CStr {
    COMMS
        .get(handle)
        .and_then(|c| c.last_error())
        .unwrap_or_else(lasterror::process_last)
}

/// `ncclCommAbort` and `ncclCommDestroy` (NULL is a no-op, as in NCCL).
pub(crate) fn close(handle: *const c_void, abort: bool) -> NcclResult {
    if handle.is_null() {
        return SUCCESS;
    }
    let what = if abort {
        "ncclCommAbort"
    } else {
        "ncclCommDestroy"
    };
    match COMMS.remove(handle) {
        Some(comm) if abort => comm.abort(),
        Some(comm) => comm.destroy(),
        None => return invalid(what, "not a live communicator"),
    }
    SUCCESS
}

/// `NCCL_SHRINK_ABORT`.
pub(crate) const SHRINK_ABORT: c_int = 0x01;

/// The first release with `ncclCommShrink`: 2.27.3.
const SHRINK_SINCE: c_int = 22703;

/// `ncclCommShrink`, after the ABI layer has read its arguments: `exclude`
/// is the caller's list (sorted in place, as NCCL does), `blocking` the
/// config's (`None`: inherit the parent's), and `publish` writes
/// `*newcomm` (at once for a blocking parent, else from the setup thread
/// before the parent stops reporting in progress).
pub(crate) fn shrink(
    handle: *const c_void,
    exclude: Option<&mut [c_int]>,
    blocking: Option<bool>,
    flags: c_int,
    publish: Publish,
) -> NcclResult {
    let what = "ncclCommShrink";
    let version = version();
    if version < SHRINK_SINCE {
        lasterror::set(&format!(
            "stand-in NCCL: {what} is not in NCCL {version} (it came in 2.27.3)"
        ));
        return codes::INVALID_USAGE;
    }
    let parent = match comm(handle, what) {
        Ok(parent) => parent,
        Err(code) => return code,
    };
    // NCCL stops the parent's kernels before it looks at the arguments.
    if flags & SHRINK_ABORT != 0 {
        parent.revoke_and_drain();
    }
    let Some(exclude) = exclude else {
        return invalid(what, "excludeRanksList is NULL");
    };
    if exclude.is_empty() {
        return invalid(what, "excludeRanksCount must be positive");
    }
    exclude.sort_unstable();
    if exclude.binary_search(&(parent.rank as c_int)).is_ok() {
        return invalid(
            what,
            &format!(
                "rank {} is in excludeRanksList: excluded ranks must not call it",
                parent.rank
            ),
        );
    }
    if let Err((code, why)) = parent.ready_to_shrink() {
        parent.set_last_error(&format!(
            "stand-in NCCL: {what}: the parent cannot shrink: {why}"
        ));
        return code;
    }
    let faults = match envcfg::var(envcfg::FAULT) {
        Some(text) => match fault::parse(&text) {
            Ok(faults) => faults,
            Err(e) => return invalid(what, &format!("{}: {e}", envcfg::FAULT)),
        },
        None => Vec::new(),
    };
    let excluded: Vec<usize> = exclude
        .iter()
        .filter_map(|&r| usize::try_from(r).ok())
        .collect();
    let blocking = blocking.unwrap_or(parent.blocking);
    shrink::start(&parent, excluded, blocking, &faults, publish)
}

/// A call's arguments as C gave them, before checks.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RawKind {
    AllReduce { op: c_int },
    Broadcast { root: c_int },
    Reduce { op: c_int, root: c_int },
    AllGather,
    ReduceScatter { op: c_int },
    Send { peer: c_int },
    Recv { peer: c_int },
}

/// A call that passed its checks: which buffers it reads and writes, and
/// how many bytes of each.
pub(crate) struct Checked {
    comm: Arc<Comm>,
    stream: Arc<Stream>,
    kind: OpKind,
    dtype: DataType,
    bytes: usize,
    pub(crate) input_len: Option<usize>,
    pub(crate) output_len: Option<usize>,
}

/// Checks a collective or point-to-point call. `Ok(None)`: a valid call
/// with `count == 0`, discarded as NCCL does.
#[allow(clippy::too_many_arguments)]
pub(crate) fn check(
    what: &str,
    comm: *const c_void,
    stream: *const c_void,
    count: usize,
    dtype: c_int,
    kind: RawKind,
    send_null: bool,
    recv_null: bool,
) -> Result<Option<Checked>, NcclResult> {
    let comm = self::comm(comm, what)?;
    let fail = |text: String| {
        comm.set_last_error(&format!("stand-in NCCL: {what}: {text}"));
        INVALID_ARGUMENT
    };
    let dtype_raw = dtype;
    let dtype =
        DataType::from_raw(dtype).ok_or_else(|| fail(format!("invalid data type {dtype_raw}")))?;
    let red = |op: c_int| {
        RedOp::from_raw(op).ok_or_else(|| fail(format!("invalid reduction operation {op}")))
    };
    let rank_of = |value: c_int, name: &str| {
        usize::try_from(value)
            .ok()
            .filter(|r| *r < comm.nranks)
            .ok_or_else(|| {
                fail(format!(
                    "invalid {name} {value} (the comm has {} ranks)",
                    comm.nranks
                ))
            })
    };
    let kind = match kind {
        RawKind::AllReduce { op } => OpKind::AllReduce(red(op)?),
        RawKind::Broadcast { root } => OpKind::Broadcast {
            root: rank_of(root, "root")?,
        },
        RawKind::Reduce { op, root } => OpKind::Reduce {
            op: red(op)?,
            root: rank_of(root, "root")?,
        },
        RawKind::AllGather => OpKind::AllGather,
        RawKind::ReduceScatter { op } => OpKind::ReduceScatter(red(op)?),
        RawKind::Send { peer } => OpKind::Send {
            peer: rank_of(peer, "peer")?,
        },
        RawKind::Recv { peer } => OpKind::Recv {
            peer: rank_of(peer, "peer")?,
        },
    };
    let stream = if stream.is_null() {
        Stream::default_stream().ok_or_else(|| fail("cannot start the default stream".into()))?
    } else {
        crate::hoststreams::STREAMS
            .get(stream)
            .ok_or_else(|| fail("not a live stand-in stream".into()))?
    };
    let (bytes, all) = count
        .checked_mul(dtype.size())
        .and_then(|b| Some((b, b.checked_mul(comm.nranks)?)))
        .ok_or_else(|| fail(format!("count {count} is too large")))?;
    let rank = comm.rank;
    let (input_len, output_len) = match kind {
        OpKind::AllReduce(_) => (Some(bytes), Some(bytes)),
        OpKind::Broadcast { root } => ((root == rank).then_some(bytes), Some(bytes)),
        OpKind::Reduce { root, .. } => (Some(bytes), (root == rank).then_some(bytes)),
        OpKind::AllGather => (Some(bytes), Some(all)),
        OpKind::ReduceScatter(_) => (Some(all), Some(bytes)),
        OpKind::Send { .. } => (Some(bytes), None),
        OpKind::Recv { .. } => (None, Some(bytes)),
    };
    if count == 0 {
        return Ok(None);
    }
    if input_len.is_some() && send_null {
        return Err(fail("sendbuff is NULL".into()));
    }
    if output_len.is_some() && recv_null {
        return Err(fail("recvbuff is NULL".into()));
    }
    Ok(Some(Checked {
        comm,
        stream,
        kind,
        dtype,
        bytes,
        input_len,
        output_len,
    }))
}

/// Numbers the checked call and puts it on its stream (or the group).
pub(crate) fn submit(call: Checked, input: Option<HostIn>, output: Option<HostOut>) -> NcclResult {
    let (index, seq) = call.comm.next_op(call.kind.sequence());
    let op = Op {
        comm: call.comm,
        index,
        seq,
        kind: call.kind,
        dtype: call.dtype,
        bytes: call.bytes,
        input,
        output,
    };
    group::submit(op, call.stream)
}
