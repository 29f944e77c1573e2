//! The stand-in NCCL's host device: streams, events and memory that the
//! stand-in library exports beside NCCL's symbols (`standinStreamCreate`
//! and friends, in the shape of CUDA's), so tests without a GPU run the
//! very code paths CUDA runs: ops queue on a stream, finish later, and the
//! watchdog learns it from an event.

#![allow(unsafe_code)]

use super::{
    DeviceImpl, DeviceMemory, EventImpl, HostStaging, Memory, Stream, StreamImpl, staging_range,
};
use crate::Unavailable;
use crate::nccl::library::{NcclLibrary, RawStream, symbol};
use std::any::Any;
use std::ffi::{c_int, c_void};
use std::sync::Arc;

type Create = unsafe extern "C" fn(*mut *mut c_void) -> c_int;
type Handle = unsafe extern "C" fn(*mut c_void) -> c_int;
type Pair = unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int;
type Memcpy = unsafe extern "C" fn(*mut c_void, *const c_void, usize, *mut c_void) -> c_int;

/// `cudaErrorNotReady`, which the stand-in's event query also returns.
const NOT_READY: c_int = 600;

struct Api {
    stream_create: Create,
    stream_destroy: Handle,
    stream_synchronize: Handle,
    stream_wait_event: Pair,
    event_create: Create,
    event_destroy: Handle,
    event_record: Pair,
    event_query: Handle,
    memcpy_async: Memcpy,
}

pub(crate) struct HostDevice {
    api: Arc<Api>,
    default: Stream,
}

impl HostDevice {
    pub(crate) fn open(library: &NcclLibrary) -> Result<HostDevice, Unavailable> {
        let lib = library.library;
        let not_standin = |e: libloading::Error| Unavailable::NotStandIn {
            path: library.path().display().to_string(),
            detail: e.to_string(),
        };
        // SAFETY: the prototypes match the stand-in's exports
        // (gpu/nccl-standin/src/abi.rs); the library is never unloaded.
        let api = unsafe {
            Api {
                stream_create: symbol(lib, "standinStreamCreate").map_err(not_standin)?,
                stream_destroy: symbol(lib, "standinStreamDestroy").map_err(not_standin)?,
                stream_synchronize: symbol(lib, "standinStreamSynchronize").map_err(not_standin)?,
                stream_wait_event: symbol(lib, "standinStreamWaitEvent").map_err(not_standin)?,
                event_create: symbol(lib, "standinEventCreate").map_err(not_standin)?,
                event_destroy: symbol(lib, "standinEventDestroy").map_err(not_standin)?,
                event_record: symbol(lib, "standinEventRecord").map_err(not_standin)?,
                event_query: symbol(lib, "standinEventQuery").map_err(not_standin)?,
                memcpy_async: symbol(lib, "standinMemcpyAsync").map_err(not_standin)?,
            }
        };
        let api = Arc::new(api);
        let default = new_stream(&api).map_err(|detail| Unavailable::Broken {
            path: library.path().display().to_string(),
            detail,
        })?;
        Ok(HostDevice { api, default })
    }
}

fn new_stream(api: &Arc<Api>) -> Result<Stream, String> {
    let mut raw: *mut c_void = std::ptr::null_mut();
    // SAFETY: writes one handle through the pointer.
    let code = unsafe { (api.stream_create)(&mut raw) };
    if code != 0 || raw.is_null() {
        return Err(format!("standinStreamCreate returned {code}"));
    }
    Ok(Stream(Arc::new(HostStream {
        api: api.clone(),
        raw: raw as usize,
    })))
}

impl DeviceImpl for HostDevice {
    fn describe(&self) -> String {
        "stand-in NCCL host device".into()
    }
    fn memory(&self) -> Memory {
        Memory::Host
    }
    fn bind(&self) -> Result<(), String> {
        Ok(())
    }
    fn new_stream(&self) -> Result<Stream, String> {
        new_stream(&self.api)
    }
    fn default_stream(&self) -> Stream {
        self.default.clone()
    }
    fn alloc(&self, bytes: usize) -> Result<Box<dyn DeviceMemory>, String> {
        Ok(Box::new(HostMemory(
            vec![0u8; bytes.max(1)].into_boxed_slice(),
        )))
    }
    fn alloc_staging(&self, bytes: usize) -> Result<Box<dyn HostStaging>, String> {
        Ok(Box::new(PlainStaging::new(bytes)))
    }
}

/// Page-aligned plain host memory.
struct PlainStaging {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

// SAFETY: the block is owned by the value; access is coordinated by its
// owner (copies are queued on streams and waited for).
unsafe impl Send for PlainStaging {}
// SAFETY: as for Send; `&self` hands out only the address.
unsafe impl Sync for PlainStaging {}

impl PlainStaging {
    fn new(bytes: usize) -> PlainStaging {
        let layout =
            std::alloc::Layout::from_size_align(bytes.max(1), 4096).expect("a valid layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        PlainStaging { ptr, layout }
    }
}

impl Drop for PlainStaging {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

impl HostStaging for PlainStaging {
    fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.layout.size()
    }
}

struct HostMemory(Box<[u8]>);

impl DeviceMemory for HostMemory {
    fn ptr(&self) -> u64 {
        self.0.as_ptr() as u64
    }
}

struct HostStream {
    api: Arc<Api>,
    raw: usize,
}

impl StreamImpl for HostStream {
    fn raw(&self) -> RawStream {
        RawStream(self.raw)
    }
    fn record(&self) -> Result<Arc<dyn EventImpl>, String> {
        let mut event: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one handle through the pointer.
        let code = unsafe { (self.api.event_create)(&mut event) };
        if code != 0 || event.is_null() {
            return Err(format!("standinEventCreate returned {code}"));
        }
        let event = HostEvent {
            api: self.api.clone(),
            raw: event as usize,
        };
        // SAFETY: both handles are live (the event is owned above, the
        // stream by self).
        let code = unsafe { (self.api.event_record)(event.raw as _, self.raw as _) };
        if code != 0 {
            return Err(format!("standinEventRecord returned {code}"));
        }
        Ok(Arc::new(event))
    }
    fn wait_event(&self, event: &dyn EventImpl) -> Result<(), String> {
        let event = event
            .as_any()
            .downcast_ref::<HostEvent>()
            .ok_or("a CUDA event cannot order a stand-in stream")?;
        // SAFETY: both handles are live.
        let code = unsafe { (self.api.stream_wait_event)(self.raw as _, event.raw as _) };
        if code != 0 {
            return Err(format!("standinStreamWaitEvent returned {code}"));
        }
        Ok(())
    }
    fn synchronize(&self) -> Result<(), String> {
        // SAFETY: a live stream.
        let code = unsafe { (self.api.stream_synchronize)(self.raw as _) };
        if code != 0 {
            return Err(format!("standinStreamSynchronize returned {code}"));
        }
        Ok(())
    }
    unsafe fn copy_to_host(
        &self,
        dst: &dyn HostStaging,
        offset: usize,
        src: u64,
        bytes: usize,
    ) -> Result<(), String> {
        staging_range(dst, offset, bytes)?;
        // SAFETY: the range is inside `dst` (checked); the caller keeps
        // both ends alive and untouched until the stream has run the copy.
        let code = unsafe {
            (self.api.memcpy_async)(
                dst.ptr().add(offset).cast(),
                src as *const c_void,
                bytes,
                self.raw as _,
            )
        };
        if code != 0 {
            return Err(format!("standinMemcpyAsync returned {code}"));
        }
        Ok(())
    }
    unsafe fn copy_to_device(
        &self,
        dst: u64,
        src: &dyn HostStaging,
        offset: usize,
        bytes: usize,
    ) -> Result<(), String> {
        staging_range(src, offset, bytes)?;
        // SAFETY: as in copy_to_host.
        let code = unsafe {
            (self.api.memcpy_async)(
                dst as *mut c_void,
                src.ptr().add(offset).cast_const().cast(),
                bytes,
                self.raw as _,
            )
        };
        if code != 0 {
            return Err(format!("standinMemcpyAsync returned {code}"));
        }
        Ok(())
    }
}

impl Drop for HostStream {
    fn drop(&mut self) {
        // SAFETY: the stream is live and dropped once; destroy waits for
        // its queued work.
        unsafe { (self.api.stream_destroy)(self.raw as _) };
    }
}

struct HostEvent {
    api: Arc<Api>,
    raw: usize,
}

impl EventImpl for HostEvent {
    fn query(&self) -> Result<bool, String> {
        // SAFETY: a live event.
        match unsafe { (self.api.event_query)(self.raw as _) } {
            0 => Ok(true),
            NOT_READY => Ok(false),
            code => Err(format!("standinEventQuery returned {code}")),
        }
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for HostEvent {
    fn drop(&mut self) {
        // SAFETY: a live event, dropped once.
        unsafe { (self.api.event_destroy)(self.raw as _) };
    }
}
