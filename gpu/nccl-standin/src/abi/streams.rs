//! The host stream API (`standin*`), standing in for CUDA's streams,
//! events, `cudaMemcpyAsync` and `cudaLaunchHostFunc`.

use super::{CUDA_ERROR_UNKNOWN, HostFn, guard_cuda};
use crate::codes;
use crate::hostmem::HostCopy;
use crate::hoststreams;
use std::ffi::{c_int, c_void};

/// Creates a stream (a FIFO run by its own thread) into `*stream`.
///
/// # Safety
/// `stream` must be NULL or point to a writable `void*`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn standinStreamCreate(stream: *mut *mut c_void) -> c_int {
    guard_cuda(|| {
        if stream.is_null() {
            return codes::CUDA_ERROR_INVALID_VALUE;
        }
        let Some(handle) = hoststreams::stream_create() else {
            return CUDA_ERROR_UNKNOWN;
        };
        // SAFETY: non-NULL, and writable by the caller's contract.
        unsafe { stream.write(handle) };
        codes::CUDA_SUCCESS
    })
}

/// Runs what is queued on `stream`, stops its thread and frees it.
#[unsafe(no_mangle)]
pub extern "C" fn standinStreamDestroy(stream: *mut c_void) -> c_int {
    guard_cuda(|| hoststreams::stream_destroy(stream))
}

/// Creates an event (complete until first recorded) into `*event`.
///
/// # Safety
/// `event` must be NULL or point to a writable `void*`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn standinEventCreate(event: *mut *mut c_void) -> c_int {
    guard_cuda(|| {
        if event.is_null() {
            return codes::CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: non-NULL, and writable by the caller's contract.
        unsafe { event.write(hoststreams::event_create()) };
        codes::CUDA_SUCCESS
    })
}

/// Frees an event (streams waiting on it still wait for its recording).
#[unsafe(no_mangle)]
pub extern "C" fn standinEventDestroy(event: *mut c_void) -> c_int {
    guard_cuda(|| hoststreams::event_destroy(event))
}

/// Records `event` on `stream` (NULL: the default stream).
#[unsafe(no_mangle)]
pub extern "C" fn standinEventRecord(event: *mut c_void, stream: *mut c_void) -> c_int {
    guard_cuda(|| hoststreams::event_record(event, stream))
}

/// 0 if `event`'s recording has run (or it was never recorded), 600
/// (`cudaErrorNotReady`) if not yet.
#[unsafe(no_mangle)]
pub extern "C" fn standinEventQuery(event: *mut c_void) -> c_int {
    guard_cuda(|| hoststreams::event_query(event))
}

/// Blocks until `event`'s recording has run.
#[unsafe(no_mangle)]
pub extern "C" fn standinEventSynchronize(event: *mut c_void) -> c_int {
    guard_cuda(|| hoststreams::event_synchronize(event))
}

/// Work put on `stream` after this waits for `event`'s current recording.
#[unsafe(no_mangle)]
pub extern "C" fn standinStreamWaitEvent(stream: *mut c_void, event: *mut c_void) -> c_int {
    guard_cuda(|| hoststreams::stream_wait_event(stream, event))
}

/// Blocks until everything put on `stream` so far has run.
#[unsafe(no_mangle)]
pub extern "C" fn standinStreamSynchronize(stream: *mut c_void) -> c_int {
    guard_cuda(|| hoststreams::stream_synchronize(stream))
}

/// Puts a copy of `bytes` bytes from `src` to `dst` on `stream`.
///
/// # Safety
/// `src` must be readable and `dst` writable for `bytes` bytes until
/// `stream` has run the copy.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn standinMemcpyAsync(
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
    stream: *mut c_void,
) -> c_int {
    guard_cuda(|| {
        if bytes > 0 && (dst.is_null() || src.is_null()) {
            return codes::CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: the caller's contract, passed on to the stream's worker.
        let copy = unsafe { HostCopy::new(dst, src, bytes) };
        hoststreams::enqueue(stream, Box::new(move || copy.run()))
    })
}

/// Puts a call of `fn_(user_data)` on `stream` (`cudaLaunchHostFunc`).
///
/// # Safety
/// `fn_` must be safe to call with `user_data` on another thread once the
/// stream reaches it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn standinLaunchHostFunc(
    stream: *mut c_void,
    fn_: HostFn,
    user_data: *mut c_void,
) -> c_int {
    guard_cuda(|| {
        let Some(f) = fn_ else {
            return codes::CUDA_ERROR_INVALID_VALUE;
        };
        let data = user_data.expose_provenance();
        let call = move || {
            let data = std::ptr::with_exposed_provenance_mut::<c_void>(data);
            // SAFETY: the caller vouched that `f` may be called with its
            // `user_data` on the stream's thread.
            unsafe { f(data) }
        };
        hoststreams::enqueue(stream, Box::new(call))
    })
}
