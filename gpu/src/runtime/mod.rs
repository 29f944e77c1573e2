//! Devices, streams and events: CUDA through cudarc ([`cuda`], feature
//! `cuda`), or the stand-in NCCL's host streams ([`host`]) for tests
//! without a GPU. The communicator sees only the traits here, as PyTorch's
//! `NcclApi`/`CudaApi` seams let its tests run without hardware.

pub(crate) mod host;

#[cfg(feature = "cuda")]
pub(crate) mod cuda;

use crate::nccl::library::RawStream;
use std::any::Any;
use std::sync::Arc;

/// Where a buffer's memory is, so an op can refuse memory its device
/// cannot reach (a host vector handed to real NCCL would crash the GPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    /// Host memory: only the stand-in NCCL's host device reads it.
    Host,
    /// Memory of CUDA device `ordinal`.
    Cuda {
        /// The device's CUDA ordinal.
        ordinal: usize,
    },
}

impl std::fmt::Display for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Memory::Host => f.write_str("host memory"),
            Memory::Cuda { ordinal } => write!(f, "cuda:{ordinal} memory"),
        }
    }
}

/// A device's side of the runtime.
pub(crate) trait DeviceImpl: Send + Sync {
    fn describe(&self) -> String;
    fn memory(&self) -> Memory;
    /// Makes the device current on this thread (NCCL finds its device
    /// that way).
    fn bind(&self) -> Result<(), String>;
    fn new_stream(&self) -> Result<Stream, String>;
    /// The stream ops follow when a buffer names none.
    fn default_stream(&self) -> Stream;
    /// `bytes` of device memory, zeroed, owned by the returned value.
    fn alloc(&self, bytes: usize) -> Result<Box<dyn DeviceMemory>, String>;
    /// `bytes` of host memory for staging device data, page-aligned:
    /// pinned for CUDA (asynchronous copies at full speed), plain for the
    /// stand-in.
    fn alloc_staging(&self, bytes: usize) -> Result<Box<dyn HostStaging>, String>;
}

/// Host memory the crate owns for staging. Freed only when no copy into
/// or out of it can still be queued (its owner synchronises first).
pub(crate) trait HostStaging: Send + Sync {
    fn ptr(&self) -> *mut u8;
    fn len(&self) -> usize;
}

/// Device memory the crate owns (the barrier's element).
pub(crate) trait DeviceMemory: Send + Sync {
    fn ptr(&self) -> u64;
}

pub(crate) trait StreamImpl: Send + Sync {
    fn raw(&self) -> RawStream;
    fn record(&self) -> Result<Arc<dyn EventImpl>, String>;
    fn wait_event(&self, event: &dyn EventImpl) -> Result<(), String>;
    fn synchronize(&self) -> Result<(), String>;
    /// Queues a copy of `bytes` from device address `src` into
    /// `dst[offset..]`.
    ///
    /// # Safety
    /// `src` addresses `bytes` of device memory that stays allocated until
    /// the stream has run the copy, and `dst` is not read, written or
    /// freed by anyone else until then. (The range in `dst` is checked.)
    #[allow(unsafe_code)]
    unsafe fn copy_to_host(
        &self,
        dst: &dyn HostStaging,
        offset: usize,
        src: u64,
        bytes: usize,
    ) -> Result<(), String>;
    /// Queues a copy of `src[offset..offset + bytes]` to device address
    /// `dst`.
    ///
    /// # Safety
    /// As [`StreamImpl::copy_to_host`], the other way round.
    #[allow(unsafe_code)]
    unsafe fn copy_to_device(
        &self,
        dst: u64,
        src: &dyn HostStaging,
        offset: usize,
        bytes: usize,
    ) -> Result<(), String>;
}

/// Checks that `offset..offset + bytes` lies inside `staging`.
pub(crate) fn staging_range(
    staging: &dyn HostStaging,
    offset: usize,
    bytes: usize,
) -> Result<(), String> {
    match offset.checked_add(bytes) {
        Some(end) if end <= staging.len() => Ok(()),
        _ => Err(format!(
            "a copy of {bytes} bytes at offset {offset} does not fit a staging buffer of {}",
            staging.len()
        )),
    }
}

pub(crate) trait EventImpl: Send + Sync {
    /// Whether the work recorded has run.
    fn query(&self) -> Result<bool, String>;
    fn as_any(&self) -> &dyn Any;
}

/// A GPU (or the stand-in's host device): where a communicator's buffers
/// live and its streams run.
#[derive(Clone)]
pub struct Device(pub(crate) Arc<dyn DeviceImpl>);

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.describe())
    }
}

impl Device {
    /// CUDA device `ordinal` (its primary context), through cudarc. An
    /// error, never a panic, when the driver or the device is missing, or
    /// when the crate was built without its `cuda` feature.
    pub fn cuda(ordinal: usize) -> Result<Device, crate::Unavailable> {
        #[cfg(feature = "cuda")]
        {
            cuda::CudaDevice::open(ordinal).map(|d| Device(Arc::new(d)))
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = ordinal;
            Err(crate::Unavailable::NoCudaFeature)
        }
    }

    /// The device of an existing cudarc context (candle's and burn's).
    #[cfg(feature = "cuda")]
    pub fn from_cuda_context(context: Arc<cudarc::driver::CudaContext>) -> Device {
        Device(Arc::new(cuda::CudaDevice::from_context(context)))
    }

    /// The stand-in NCCL's host "device": host memory ([`crate::HostBuffer`])
    /// and host streams that `library` (which must be the stand-in)
    /// exports. For tests without a GPU.
    pub fn standin_host(library: &crate::NcclLibrary) -> Result<Device, crate::Unavailable> {
        host::HostDevice::open(library).map(|d| Device(Arc::new(d)))
    }

    /// Where this device's buffers live.
    pub fn memory(&self) -> Memory {
        self.0.memory()
    }

    /// A new stream on the device.
    pub fn new_stream(&self) -> Result<Stream, String> {
        self.0.new_stream()
    }

    /// The stream ops follow when a buffer names none: CUDA's default
    /// (legacy) stream, or the stand-in's default.
    pub fn default_stream(&self) -> Stream {
        self.0.default_stream()
    }
}

/// A stream of device work (CUDA's, or the stand-in's).
#[derive(Clone)]
pub struct Stream(pub(crate) Arc<dyn StreamImpl>);

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Stream({:#x})", self.0.raw().0)
    }
}

impl Stream {
    /// A cudarc stream.
    #[cfg(feature = "cuda")]
    pub fn from_cuda(stream: Arc<cudarc::driver::CudaStream>) -> Stream {
        Stream(Arc::new(cuda::CudaStreamHandle(stream)))
    }

    /// Blocks until the stream's work so far has run.
    pub fn synchronize(&self) -> Result<(), String> {
        self.0.synchronize()
    }

    pub(crate) fn same(&self, other: &Stream) -> bool {
        self.0.raw().0 == other.0.raw().0
    }
}
