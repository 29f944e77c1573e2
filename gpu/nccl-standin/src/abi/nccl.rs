//! NCCL's version, error, id, communicator and group functions.

use super::{CONFIG_MAGIC, NcclComm, NcclConfig, NcclUniqueId, guard, put};
use crate::calls;
use crate::codes::{self, INVALID_ARGUMENT, NcclResult};
use crate::group;
use crate::lasterror;
use std::ffi::{c_char, c_int, c_uint};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// `ncclGetVersion`.
///
/// # Safety
/// `version` must be NULL or point to a writable `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetVersion(version: *mut c_int) -> NcclResult {
    // SAFETY: the caller's contract on `version`.
    guard(|| unsafe { put(version, calls::version()) })
}

/// `ncclGetErrorString`: NCCL 2.30's text for `code`.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGetErrorString(code: NcclResult) -> *const c_char {
    codes::error_string(code).as_ptr()
}

/// `ncclGetLastError`: `comm`'s last error, else the process's ("" if
/// none). The string lives as long as the process.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGetLastError(comm: NcclComm) -> *const c_char {
    catch_unwind(AssertUnwindSafe(|| calls::last_error(comm)))
        .unwrap_or(c"")
        .as_ptr()
}

/// `ncclGetUniqueId`: starts a bootstrap root on 127.0.0.1.
///
/// # Safety
/// `unique_id` must be NULL or point to a writable `ncclUniqueId`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetUniqueId(unique_id: *mut NcclUniqueId) -> NcclResult {
    guard(|| {
        if unique_id.is_null() {
            return calls_invalid("ncclGetUniqueId: uniqueId is NULL");
        }
        match calls::unique_id() {
            Ok(bytes) => {
                let id = NcclUniqueId {
                    internal: bytes.map(|b| b as c_char),
                };
                // SAFETY: non-NULL, and writable by the caller's contract.
                unsafe { put(unique_id, id) }
            }
            Err(code) => code,
        }
    })
}

pub(super) fn calls_invalid(text: &str) -> NcclResult {
    lasterror::set(&format!("stand-in NCCL: {text}"));
    INVALID_ARGUMENT
}

/// Reads `blocking` from a config as NCCL does: `Err` for a bad magic.
///
/// # Safety
/// `config` must be NULL or point to a readable `ncclConfig_t` whose
/// `size` bytes (at least its `size` field) are readable.
unsafe fn read_blocking(config: *const NcclConfig) -> Result<bool, NcclResult> {
    if config.is_null() {
        return Ok(true);
    }
    let mut bytes = [0u8; size_of::<NcclConfig>()];
    // SAFETY: the caller's contract makes the `size` field readable.
    let size = unsafe { config.cast::<usize>().read_unaligned() };
    let len = size.min(bytes.len());
    // SAFETY: `len` is at most `size`, which the caller vouches for, and at
    // most our buffer's length; the buffer is ours, so they cannot overlap.
    unsafe { std::ptr::copy_nonoverlapping(config.cast::<u8>(), bytes.as_mut_ptr(), len) };
    let field = |at: usize| -> Option<[u8; 4]> { bytes[at..at + 4].try_into().ok() };
    let magic = field(8)
        .filter(|_| len >= 12)
        .map_or(0, c_uint::from_ne_bytes);
    if magic != CONFIG_MAGIC {
        return Err(calls_invalid(&format!(
            "ncclCommInitRankConfig: config magic is {magic:#x}, not 0xcafebeef \
             (use NCCL_CONFIG_INITIALIZER)"
        )));
    }
    let blocking = field(16)
        .filter(|_| len >= 20)
        .map_or(1, c_int::from_ne_bytes);
    Ok(blocking != 0)
}

/// `ncclCommInitRank`: a blocking init.
///
/// # Safety
/// `comm` must be NULL or point to a writable `ncclComm_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommInitRank(
    comm: *mut NcclComm,
    nranks: c_int,
    comm_id: NcclUniqueId,
    rank: c_int,
) -> NcclResult {
    // SAFETY: the caller's contract on `comm`; NULL is a valid config.
    unsafe { ncclCommInitRankConfig(comm, nranks, comm_id, rank, std::ptr::null_mut()) }
}

/// `ncclCommInitRankConfig`: blocking unless `config->blocking == 0`, when
/// it returns `ncclInProgress` with `*comm` set and sets up in the
/// background. On failure `*comm` is NULL.
///
/// # Safety
/// `comm` must be NULL or point to a writable `ncclComm_t`; `config` NULL
/// or as `NCCL_CONFIG_INITIALIZER` makes it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommInitRankConfig(
    comm: *mut NcclComm,
    nranks: c_int,
    comm_id: NcclUniqueId,
    rank: c_int,
    config: *mut NcclConfig,
) -> NcclResult {
    guard(|| {
        if comm.is_null() {
            return calls_invalid("ncclCommInitRank: comm is NULL");
        }
        // SAFETY: the caller's contract on `config`.
        let blocking = match unsafe { read_blocking(config) } {
            Ok(blocking) => blocking,
            Err(code) => return code,
        };
        let id = comm_id.internal.map(|c| c as u8);
        let (handle, code) = match calls::init_rank(nranks, &id, rank, blocking) {
            Ok(made) => made,
            Err(code) => (std::ptr::null_mut(), code),
        };
        // SAFETY: non-NULL, and writable by the caller's contract.
        unsafe { comm.write(handle) };
        code
    })
}

/// `NCCL_SHRINK_DEFAULT`: shrink the parent as it is.
pub const SHRINK_DEFAULT: c_int = 0x00;
/// `NCCL_SHRINK_ABORT`: end the parent's queued ops first, then shrink.
pub const SHRINK_ABORT: c_int = calls::SHRINK_ABORT;

/// `ncclCommShrink` (NCCL 2.27.3): a comm of the parent's ranks that are
/// not in `exclude_ranks_list` (sorted in place), renumbered in order, set
/// up over the parent's connections. Collective over the staying ranks; an
/// excluded rank must not call it. `*newcomm` is NULL until the child is
/// made: at once for a blocking one, else written when the parent's async
/// error stops reporting `ncclInProgress` (a failed child is written too,
/// its own async error saying why). A NULL config inherits the parent's.
///
/// # Safety
/// `newcomm` must be NULL or point to a writable `ncclComm_t` that stays
/// writable until the parent no longer reports `ncclInProgress`;
/// `exclude_ranks_list` NULL or `exclude_ranks_count` writable ints;
/// `config` as for [`ncclCommInitRankConfig`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommShrink(
    comm: NcclComm,
    exclude_ranks_list: *mut c_int,
    exclude_ranks_count: c_int,
    newcomm: *mut NcclComm,
    config: *mut NcclConfig,
    shrink_flags: c_int,
) -> NcclResult {
    guard(|| {
        if newcomm.is_null() {
            return calls_invalid("ncclCommShrink: newcomm is NULL");
        }
        // SAFETY: non-NULL, and writable by the caller's contract.
        unsafe { newcomm.write(std::ptr::null_mut()) };
        let blocking = if config.is_null() {
            None
        } else {
            // SAFETY: the caller's contract on `config`.
            match unsafe { read_blocking(config) } {
                Ok(blocking) => Some(blocking),
                Err(code) => return code,
            }
        };
        let exclude = match usize::try_from(exclude_ranks_count) {
            _ if exclude_ranks_list.is_null() => None,
            Ok(len) if len > 0 => {
                // SAFETY: the caller vouches for `len` writable ints; the
                // slice lives only for this call (the job copies it).
                Some(unsafe { std::slice::from_raw_parts_mut(exclude_ranks_list, len) })
            }
            _ => Some(&mut [][..]),
        };
        let slot = newcomm.expose_provenance();
        let publish: crate::shrink::Publish = Box::new(move |handle| {
            let newcomm = std::ptr::with_exposed_provenance_mut::<NcclComm>(slot);
            // SAFETY: the caller keeps `*newcomm` writable until the
            // parent stops reporting in progress, which happens only after
            // this write (NCCL's contract for a non-blocking shrink).
            unsafe { newcomm.write(handle) };
        });
        calls::shrink(comm, exclude, blocking, shrink_flags, publish)
    })
}

/// `ncclCommFinalize`: blocking comms wait for their queued ops;
/// non-blocking ones return `ncclInProgress` (poll the async error).
#[unsafe(no_mangle)]
pub extern "C" fn ncclCommFinalize(comm: NcclComm) -> NcclResult {
    guard(|| match calls::comm(comm, "ncclCommFinalize") {
        Ok(comm) => comm.finalize(),
        Err(code) => code,
    })
}

/// `ncclCommDestroy`: frees the comm; with ops still queued it aborts.
#[unsafe(no_mangle)]
pub extern "C" fn ncclCommDestroy(comm: NcclComm) -> NcclResult {
    guard(|| calls::close(comm, false))
}

/// `ncclCommAbort`: wakes and ends everything the comm is doing, closes
/// its connections and frees it; returns at once.
#[unsafe(no_mangle)]
pub extern "C" fn ncclCommAbort(comm: NcclComm) -> NcclResult {
    guard(|| calls::close(comm, true))
}

/// `ncclCommGetAsyncError`.
///
/// # Safety
/// `async_error` must be NULL or point to a writable `ncclResult_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommGetAsyncError(
    comm: NcclComm,
    async_error: *mut NcclResult,
) -> NcclResult {
    guard(|| match calls::comm(comm, "ncclCommGetAsyncError") {
        // SAFETY: the caller's contract on `async_error`.
        Ok(comm) => unsafe { put(async_error, comm.async_error()) },
        Err(code) => code,
    })
}

/// `ncclCommCount`.
///
/// # Safety
/// `count` must be NULL or point to a writable `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommCount(comm: NcclComm, count: *mut c_int) -> NcclResult {
    guard(|| match calls::comm(comm, "ncclCommCount") {
        // SAFETY: the caller's contract on `count`.
        Ok(comm) => unsafe { put(count, c_int::try_from(comm.nranks).unwrap_or(c_int::MAX)) },
        Err(code) => code,
    })
}

/// `ncclCommUserRank`.
///
/// # Safety
/// `rank` must be NULL or point to a writable `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommUserRank(comm: NcclComm, rank: *mut c_int) -> NcclResult {
    guard(|| match calls::comm(comm, "ncclCommUserRank") {
        // SAFETY: the caller's contract on `rank`.
        Ok(comm) => unsafe { put(rank, c_int::try_from(comm.rank).unwrap_or(c_int::MAX)) },
        Err(code) => code,
    })
}

/// `ncclCommCuDevice`: always device 0.
///
/// # Safety
/// `device` must be NULL or point to a writable `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommCuDevice(comm: NcclComm, device: *mut c_int) -> NcclResult {
    guard(|| match calls::comm(comm, "ncclCommCuDevice") {
        // SAFETY: the caller's contract on `device`.
        Ok(_) => unsafe { put(device, 0) },
        Err(code) => code,
    })
}

/// `ncclGroupStart`.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGroupStart() -> NcclResult {
    guard(group::start)
}

/// `ncclGroupEnd`: the outermost end puts the group on its stream.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGroupEnd() -> NcclResult {
    guard(group::end)
}
