//! Device memory for the sweep: allocate zeroed, upload check data, read a
//! result back, for the stand-in NCCL's [`HostBuffer`] and (feature `cuda`)
//! cudarc's `CudaSlice`. The runner is written once over [`DeviceMem`],
//! so both devices run the same ops and the same checks.

use ringwire::Element;
use ringwire_gpu::{DeviceBuffer, DeviceElement, HostBuffer};

/// An element the device sweep moves: ringwire's (check data and its
/// reference), NCCL's and, with `cuda`, cudarc's. All seven `-d` types are.
#[cfg(feature = "cuda")]
pub(crate) trait GpuElem:
    Element + DeviceElement + cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits
{
}

#[cfg(feature = "cuda")]
impl<T> GpuElem for T where
    T: Element + DeviceElement + cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits
{
}

/// An element the device sweep moves: ringwire's (check data and its
/// reference) and NCCL's. All seven `-d` types are.
#[cfg(not(feature = "cuda"))]
pub(crate) trait GpuElem: Element + DeviceElement {}

#[cfg(not(feature = "cuda"))]
impl<T: Element + DeviceElement> GpuElem for T {}

/// Where a device runner's buffers come from.
pub(crate) trait DeviceMem {
    /// A buffer of `T`s on this device.
    type Buf<T: GpuElem>: DeviceBuffer<Elem = T>;
    /// `len` zeroed elements (`len` > 0).
    fn zeros<T: GpuElem>(&self, len: usize) -> Result<Self::Buf<T>, String>;
    /// Copies `data` (as long as `buf`) into `buf`, done when it returns.
    fn write<T: GpuElem>(&self, buf: &mut Self::Buf<T>, data: &[T]) -> Result<(), String>;
    /// `buf`'s contents on the host. Only called after the ops that wrote
    /// it were waited for.
    fn read<T: GpuElem>(&self, buf: &Self::Buf<T>) -> Result<Vec<T>, String>;
}

fn same_len(buf: usize, data: usize) -> Result<(), String> {
    if buf == data {
        Ok(())
    } else {
        Err(format!(
            "internal: {data} elements of check data for a buffer of {buf}"
        ))
    }
}

/// The stand-in's host "device": buffers are host vectors.
pub(crate) struct HostMem;

impl DeviceMem for HostMem {
    type Buf<T: GpuElem> = HostBuffer<T>;
    fn zeros<T: GpuElem>(&self, len: usize) -> Result<HostBuffer<T>, String> {
        Ok(HostBuffer::new(vec![T::default(); len]))
    }
    fn write<T: GpuElem>(&self, buf: &mut HostBuffer<T>, data: &[T]) -> Result<(), String> {
        same_len(DeviceBuffer::len(buf), data.len())?;
        buf.copy_from_slice(data);
        Ok(())
    }
    fn read<T: GpuElem>(&self, buf: &HostBuffer<T>) -> Result<Vec<T>, String> {
        Ok(buf.to_vec())
    }
}

/// A CUDA device: buffers are `CudaSlice`s on one stream of its primary
/// context, which the GPU communicator's ops order themselves after.
#[cfg(feature = "cuda")]
pub(crate) struct CudaMem {
    stream: std::sync::Arc<cudarc::driver::CudaStream>,
}

#[cfg(feature = "cuda")]
impl CudaMem {
    /// The default stream of device `ordinal`'s primary context (the one
    /// `ringwire_gpu::Device::cuda` opens): call after that succeeded,
    /// since cudarc panics where there is no driver.
    pub(crate) fn open(ordinal: usize) -> Result<CudaMem, String> {
        let context = cudarc::driver::CudaContext::new(ordinal)
            .map_err(|e| format!("cuda:{ordinal}: cannot open its context: {e:?}"))?;
        Ok(CudaMem {
            stream: context.default_stream(),
        })
    }

    fn sync(&self) -> Result<(), String> {
        self.stream
            .synchronize()
            .map_err(|e| format!("cuda stream synchronize: {e:?}"))
    }
}

#[cfg(feature = "cuda")]
impl DeviceMem for CudaMem {
    type Buf<T: GpuElem> = cudarc::driver::CudaSlice<T>;
    fn zeros<T: GpuElem>(&self, len: usize) -> Result<Self::Buf<T>, String> {
        let buf = self.stream.alloc_zeros::<T>(len).map_err(|e| {
            format!(
                "cannot allocate {len} elements of {} on the device: {e:?}",
                T::NAME
            )
        })?;
        self.sync()?;
        Ok(buf)
    }
    fn write<T: GpuElem>(&self, buf: &mut Self::Buf<T>, data: &[T]) -> Result<(), String> {
        // cudarc asserts the lengths; check them first so a mistake is an
        // error, not a panic.
        same_len(DeviceBuffer::len(buf), data.len())?;
        self.stream
            .memcpy_htod(data, buf)
            .map_err(|e| format!("copying check data to the device: {e:?}"))?;
        self.sync()
    }
    fn read<T: GpuElem>(&self, buf: &Self::Buf<T>) -> Result<Vec<T>, String> {
        let host = self
            .stream
            .clone_dtoh(buf)
            .map_err(|e| format!("copying a result to the host: {e:?}"))?;
        // The copy is queued on the stream: the vector is filled only once
        // the stream has run it.
        self.sync()?;
        Ok(host)
    }
}
