//! CUDA through cudarc's driver API (feature `cuda`), dlopened at run time
//! so the crate builds where no CUDA is installed. cudarc panics when
//! `libcuda` is missing, so [`CudaDevice::open`] checks for it first and
//! returns [`Unavailable::NoDriver`] instead.

#![allow(unsafe_code)]

use super::{
    DeviceImpl, DeviceMemory, EventImpl, HostStaging, Memory, Stream, StreamImpl, staging_range,
};
use crate::Unavailable;
use crate::buffer::{DeviceBuffer, DeviceElement};
use crate::nccl::library::RawStream;
use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr, DeviceRepr};
use std::any::Any;
use std::sync::Arc;

pub(crate) struct CudaDevice {
    context: Arc<CudaContext>,
}

impl CudaDevice {
    pub(crate) fn open(ordinal: usize) -> Result<CudaDevice, Unavailable> {
        // SAFETY: only tries to dlopen the driver's candidate names.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(Unavailable::NoDriver {
                detail: "libcuda.so.1 could not be loaded (is an NVIDIA driver installed?)".into(),
            });
        }
        let count = CudaContext::device_count().map_err(|e| Unavailable::NoDriver {
            detail: format!("cuInit/cuDeviceGetCount failed: {e:?}"),
        })?;
        if ordinal >= count.max(0) as usize {
            return Err(Unavailable::NoDevice {
                ordinal,
                detail: format!("the driver sees {count} device(s)"),
            });
        }
        let context = CudaContext::new(ordinal).map_err(|e| Unavailable::NoDevice {
            ordinal,
            detail: format!("could not make its context: {e:?}"),
        })?;
        Ok(CudaDevice { context })
    }

    pub(crate) fn from_context(context: Arc<CudaContext>) -> CudaDevice {
        CudaDevice { context }
    }
}

impl DeviceImpl for CudaDevice {
    fn describe(&self) -> String {
        let name = self.context.name().unwrap_or_else(|_| "?".into());
        format!("cuda:{} ({name})", self.context.ordinal())
    }
    fn memory(&self) -> Memory {
        Memory::Cuda {
            ordinal: self.context.ordinal(),
        }
    }
    fn bind(&self) -> Result<(), String> {
        self.context.bind_to_thread().map_err(|e| format!("{e:?}"))
    }
    fn new_stream(&self) -> Result<Stream, String> {
        let stream = self.context.new_stream().map_err(|e| format!("{e:?}"))?;
        Ok(Stream(Arc::new(CudaStreamHandle(stream))))
    }
    fn default_stream(&self) -> Stream {
        Stream(Arc::new(CudaStreamHandle(self.context.default_stream())))
    }
    fn alloc(&self, bytes: usize) -> Result<Box<dyn DeviceMemory>, String> {
        let stream = self.context.default_stream();
        let slice = stream
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(|e| format!("{e:?}"))?;
        stream.synchronize().map_err(|e| format!("{e:?}"))?;
        Ok(Box::new(CudaMemory(slice)))
    }
    fn alloc_staging(&self, bytes: usize) -> Result<Box<dyn HostStaging>, String> {
        self.context
            .bind_to_thread()
            .map_err(|e| format!("{e:?}"))?;
        // SAFETY: allocates page-locked host memory; freed in Drop.
        let ptr = unsafe { cudarc::driver::result::malloc_host(bytes.max(1), 0) }
            .map_err(|e| format!("cuMemHostAlloc of {bytes} bytes: {e:?}"))?;
        Ok(Box::new(PinnedStaging {
            ptr: ptr.cast(),
            len: bytes.max(1),
        }))
    }
}

/// Page-locked host memory from `cuMemHostAlloc`.
struct PinnedStaging {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the block is owned by the value; its owner orders access.
unsafe impl Send for PinnedStaging {}
// SAFETY: as for Send; `&self` hands out only the address.
unsafe impl Sync for PinnedStaging {}

impl HostStaging for PinnedStaging {
    fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for PinnedStaging {
    fn drop(&mut self) {
        // SAFETY: from malloc_host, freed once; the owner waited for every
        // copy that used it.
        if let Err(e) = unsafe { cudarc::driver::result::free_host(self.ptr.cast()) } {
            tracing::warn!(error = ?e, "cuMemFreeHost failed");
        }
    }
}

struct CudaMemory(CudaSlice<u8>);

impl DeviceMemory for CudaMemory {
    fn ptr(&self) -> u64 {
        let (ptr, _sync) = DevicePtr::device_ptr(&self.0, self.0.stream());
        ptr
    }
}

pub(crate) struct CudaStreamHandle(pub(crate) Arc<CudaStream>);

impl StreamImpl for CudaStreamHandle {
    fn raw(&self) -> RawStream {
        RawStream(self.0.cu_stream() as usize)
    }
    fn record(&self) -> Result<Arc<dyn EventImpl>, String> {
        let event = self.0.record_event(None).map_err(|e| format!("{e:?}"))?;
        Ok(Arc::new(CudaEventHandle(event)))
    }
    fn wait_event(&self, event: &dyn EventImpl) -> Result<(), String> {
        let event = event
            .as_any()
            .downcast_ref::<CudaEventHandle>()
            .ok_or("a stand-in event cannot order a CUDA stream")?;
        self.0.wait(&event.0).map_err(|e| format!("{e:?}"))
    }
    fn synchronize(&self) -> Result<(), String> {
        self.0.synchronize().map_err(|e| format!("{e:?}"))
    }
    unsafe fn copy_to_host(
        &self,
        dst: &dyn HostStaging,
        offset: usize,
        src: u64,
        bytes: usize,
    ) -> Result<(), String> {
        staging_range(dst, offset, bytes)?;
        self.0
            .context()
            .bind_to_thread()
            .map_err(|e| format!("{e:?}"))?;
        // SAFETY: the range is inside `dst` (checked) and nothing else
        // touches it until the copy has run; `src` is live device memory
        // (the caller's contract).
        unsafe {
            let dst = std::slice::from_raw_parts_mut(dst.ptr().add(offset), bytes);
            cudarc::driver::result::memcpy_dtoh_async(dst, src, self.0.cu_stream())
        }
        .map_err(|e| format!("cuMemcpyDtoHAsync: {e:?}"))
    }
    unsafe fn copy_to_device(
        &self,
        dst: u64,
        src: &dyn HostStaging,
        offset: usize,
        bytes: usize,
    ) -> Result<(), String> {
        staging_range(src, offset, bytes)?;
        self.0
            .context()
            .bind_to_thread()
            .map_err(|e| format!("{e:?}"))?;
        // SAFETY: as in copy_to_host, the other way round.
        unsafe {
            let src = std::slice::from_raw_parts(src.ptr().add(offset).cast_const(), bytes);
            cudarc::driver::result::memcpy_htod_async(dst, src, self.0.cu_stream())
        }
        .map_err(|e| format!("cuMemcpyHtoDAsync: {e:?}"))
    }
}

struct CudaEventHandle(CudaEvent);

impl EventImpl for CudaEventHandle {
    fn query(&self) -> Result<bool, String> {
        self.0.try_is_complete().map_err(|e| format!("{e:?}"))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

// SAFETY: a CudaSlice owns its allocation (freed on drop, stream-ordered
// on its own stream, which ops wait for and which `PendingCollective`
// makes wait for them), and its pointer does not change when it moves.
unsafe impl<T: DeviceElement + DeviceRepr> DeviceBuffer for CudaSlice<T> {
    type Elem = T;
    fn len(&self) -> usize {
        cudarc::driver::DeviceSlice::len(self)
    }
    fn device_ptr(&self) -> u64 {
        let (ptr, _sync) = DevicePtr::device_ptr(self, self.stream());
        ptr
    }
    fn memory(&self) -> Memory {
        Memory::Cuda {
            ordinal: self.ordinal(),
        }
    }
    fn stream(&self) -> Option<Stream> {
        Some(Stream(Arc::new(CudaStreamHandle(
            cudarc::driver::DeviceSlice::stream(self).clone(),
        ))))
    }
}
