//! The exported C ABI: NCCL's functions with nccl.h's prototypes, and the
//! `standin*` host stream API that stands in for CUDA's streams and events.
//!
//! Each export only converts C's pointers (reading and writing the caller's
//! arguments, wrapping buffers for later use) and calls the safe modules,
//! inside `catch_unwind`: a panic becomes `ncclInternalError` (999,
//! `cudaErrorUnknown`, for the stream API) and never crosses into C.
//! Handles are numbers (see `handles`), never dereferenced.

#![allow(unsafe_code, non_snake_case)]

mod collectives;
mod nccl;
mod streams;

pub use collectives::*;
pub use nccl::*;
pub use streams::*;

use crate::codes::{INTERNAL_ERROR, INVALID_ARGUMENT, NcclResult, SUCCESS};
use crate::lasterror;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// `ncclUniqueId`: 128 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NcclUniqueId {
    /// The bytes: here, the bootstrap root's address.
    pub internal: [c_char; 128],
}

/// `ncclConfig_t` as of NCCL 2.17 (48 bytes on x86-64). Only `size`,
/// `magic`, `version` and `blocking` are read, and only the first
/// `min(size, 48)` bytes, as NCCL copies them.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NcclConfig {
    /// `sizeof(ncclConfig_t)` as the caller compiled it.
    pub size: usize,
    /// [`CONFIG_MAGIC`].
    pub magic: c_uint,
    /// The caller's `NCCL_VERSION_CODE`.
    pub version: c_uint,
    /// 0: non-blocking calls (they may return `ncclInProgress`).
    pub blocking: c_int,
    /// Not read.
    pub cga_cluster_size: c_int,
    /// Not read.
    pub min_ctas: c_int,
    /// Not read.
    pub max_ctas: c_int,
    /// Not read.
    pub net_name: *const c_char,
    /// Not read.
    pub split_share: c_int,
}

/// `NCCL_CONFIG_INITIALIZER`'s magic.
pub const CONFIG_MAGIC: c_uint = 0xcafe_beef;

/// `ncclComm_t`.
pub type NcclComm = *mut c_void;

/// `cudaStream_t` (a stand-in stream, or NULL for the default one).
pub type CudaStream = *mut c_void;

/// A host callback for `standinLaunchHostFunc` (`cudaHostFn_t`).
pub type HostFn = Option<unsafe extern "C" fn(*mut c_void)>;

pub(crate) fn guard(f: impl FnOnce() -> NcclResult) -> NcclResult {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        lasterror::set("stand-in NCCL: internal error (a panic was caught)");
        INTERNAL_ERROR
    })
}

/// `cudaErrorUnknown`, for a panic in the stream API.
pub(crate) const CUDA_ERROR_UNKNOWN: c_int = 999;

pub(crate) fn guard_cuda(f: impl FnOnce() -> c_int) -> c_int {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(CUDA_ERROR_UNKNOWN)
}

/// Writes `value` through `out`, or reports NULL.
///
/// # Safety
/// `out` must be NULL or valid for a write of one `T`.
pub(crate) unsafe fn put<T>(out: *mut T, value: T) -> NcclResult {
    if out.is_null() {
        lasterror::set("stand-in NCCL: an output pointer is NULL");
        return INVALID_ARGUMENT;
    }
    // SAFETY: non-NULL here, and valid for a write by the caller's contract.
    unsafe { out.write(value) };
    SUCCESS
}
