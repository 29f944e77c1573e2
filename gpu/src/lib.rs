//! ringwire's NCCL path: collectives on device buffers among the ranks of
//! a ringwire [`Communicator`](ringwire::Communicator).
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use ringwire::{Communicator, ReduceOp};
//! use ringwire_gpu::{Device, GpuCommunicator};
//! let cpu = Communicator::from_env().wait()?;
//! let device = Device::cuda(cpu.local_rank().unwrap_or(0))?;
//! let gpu = GpuCommunicator::new(&cpu, &device)?;
//! # #[cfg(feature = "cuda")] {
//! let stream = cudarc::driver::CudaContext::new(0)?.default_stream();
//! let grads = stream.clone_htod(&vec![1.0f32; 1 << 20])?;
//! let grads = gpu.all_reduce(grads, ReduceOp::Avg).wait()?;
//! # }
//! # Ok(()) }
//! ```
//!
//! - NCCL is opened at run time ([`NcclLibrary`]: `RINGWIRE_NCCL_LIB`,
//!   `libnccl.so.2`, `libnccl.so`, the nvidia-nccl wheel of a Python on
//!   `PATH`); nothing CUDA is needed to build. [`available`] says why not.
//! - CUDA comes through cudarc's driver API (feature `cuda`); cudarc's
//!   `CudaSlice` is a [`DeviceBuffer`].
//! - Communicators are always non-blocking, so abort is always possible; a
//!   watchdog thread fails ops on NCCL errors and timeouts, aborts NCCL on
//!   a helper thread under a deadline, and carries the failure to every
//!   rank through the CPU communicator. Nothing panics or ends the process.
//! - Every op returns a [`PendingCollective`]: `wait`, `.await`,
//!   `is_completed`, or `stream_wait` (a stream waits, the host does not).
//!
//! Tests without a GPU load `ringwire-nccl-standin` (the stand-in libnccl
//! in `gpu/nccl-standin`) through the same loader, with
//! [`Device::standin_host`] and [`HostBuffer`].

mod buffer;
mod communicator;
mod enqueue;
mod error;
mod flight;
mod hierarchical;
mod init;
mod nccl;
mod pending;
mod runtime;
mod watchdog;

pub use buffer::{DeviceBuffer, DeviceElement, HostBuffer, RawDeviceSlice};
pub use communicator::{GpuBuilder, GpuCommunicator, Group};
pub use error::{GpuError, GpuOp, OpAt, Unavailable};
pub use hierarchical::{HierarchicalAllReduce, HierarchicalBuilder};
pub use nccl::codes::{NcclResult, NcclVersion};
pub use nccl::library::{NcclLibrary, UniqueId};
pub use pending::PendingCollective;
pub use runtime::{Device, Memory, Stream};

/// Whether device collectives can run here on CUDA device `ordinal`: the
/// NCCL found (its version) or why not (no library, how to install it; no
/// driver; no device; built without `cuda`).
pub fn available(ordinal: usize) -> Result<Arc<NcclLibrary>, Unavailable> {
    let lib = NcclLibrary::global()?;
    Device::cuda(ordinal)?;
    Ok(lib)
}

use std::sync::Arc;
