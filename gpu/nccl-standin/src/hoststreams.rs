//! The host stream API by handle (what `standin*` exports do): a NULL
//! stream is the process's default stream, as stream 0 is in CUDA.

use crate::codes::{CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_READY, CUDA_SUCCESS};
use crate::handles::Table;
use crate::stream::{Event, Stream, Work};
use std::ffi::{c_int, c_void};
use std::sync::Arc;

/// Live streams, by handle.
pub(crate) static STREAMS: Table<Stream> = Table::new();
/// Live events, by handle.
pub(crate) static EVENTS: Table<Event> = Table::new();

fn code(ok: bool) -> c_int {
    if ok {
        CUDA_SUCCESS
    } else {
        CUDA_ERROR_INVALID_VALUE
    }
}

/// The stream of `handle` (NULL: the default one).
fn stream(handle: *const c_void) -> Option<Arc<Stream>> {
    if handle.is_null() {
        Stream::default_stream()
    } else {
        STREAMS.get(handle)
    }
}

pub(crate) fn stream_create() -> Option<*mut c_void> {
    Stream::new().ok().map(|s| STREAMS.insert(s))
}

/// Runs what is queued, joins the worker, frees the handle.
pub(crate) fn stream_destroy(handle: *const c_void) -> c_int {
    let Some(stream) = STREAMS.remove(handle) else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    stream.shutdown();
    CUDA_SUCCESS
}

pub(crate) fn stream_synchronize(handle: *const c_void) -> c_int {
    code(stream(handle).is_some_and(|s| s.synchronize()))
}

pub(crate) fn enqueue(handle: *const c_void, work: Work) -> c_int {
    code(stream(handle).is_some_and(|s| s.enqueue(work)))
}

pub(crate) fn event_create() -> *mut c_void {
    EVENTS.insert(Arc::new(Event::default()))
}

pub(crate) fn event_destroy(handle: *const c_void) -> c_int {
    code(EVENTS.remove(handle).is_some())
}

pub(crate) fn event_record(event: *const c_void, on: *const c_void) -> c_int {
    match (EVENTS.get(event), stream(on)) {
        (Some(e), Some(s)) => code(e.record(&s)),
        _ => CUDA_ERROR_INVALID_VALUE,
    }
}

pub(crate) fn event_query(event: *const c_void) -> c_int {
    match EVENTS.get(event) {
        Some(e) if e.is_complete() => CUDA_SUCCESS,
        Some(_) => CUDA_ERROR_NOT_READY,
        None => CUDA_ERROR_INVALID_VALUE,
    }
}

pub(crate) fn event_synchronize(event: *const c_void) -> c_int {
    let Some(event) = EVENTS.get(event) else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    event.synchronize();
    CUDA_SUCCESS
}

pub(crate) fn stream_wait_event(on: *const c_void, event: *const c_void) -> c_int {
    match (stream(on), EVENTS.get(event)) {
        (Some(s), Some(e)) => code(e.make_wait(&s)),
        _ => CUDA_ERROR_INVALID_VALUE,
    }
}
