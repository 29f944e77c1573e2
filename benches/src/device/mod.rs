//! `--device cuda` and `--device standin`: the sweep on device buffers,
//! moved by NCCL through ringwire-gpu's [`GpuCommunicator`] (made over the
//! rank's CPU communicator, which then only carries NCCL's start and the
//! harness's own result gathering). `cuda` is each rank's GPU (its local
//! rank) with the NCCL ringwire-gpu finds; `standin` is the stand-in NCCL
//! named by `RINGWIRE_NCCL_LIB` on its host "device", so the device path
//! runs, and is tested, without a GPU.
//!
//! Ops, columns and checks are the host path's: [`runner`] is `ops::Runner`
//! over device buffers, [`memory`] the buffers of each device.

mod memory;
mod runner;

use crate::args::{Args, DeviceChoice};
use crate::bench_op::Shape;
use crate::ops::Bench;
pub(crate) use memory::GpuElem;
use memory::HostMem;
use ringwire::Communicator;
use ringwire_gpu::{Device, GpuCommunicator, NcclLibrary};
use runner::GpuRunner;
use std::sync::Arc;

/// The variable naming the stand-in's `.so` for `--device standin`.
pub(crate) const STANDIN_VAR: &str = "RINGWIRE_NCCL_LIB";

/// A rank's GPU communicator and where its buffers come from.
pub(crate) enum Gpu {
    Standin {
        gpu: GpuCommunicator,
        mem: HostMem,
    },
    #[cfg(feature = "cuda")]
    Cuda {
        gpu: GpuCommunicator,
        mem: memory::CudaMem,
    },
}

/// Opens the device `choice` names (`None` for `cpu`) and makes the GPU
/// communicator over `cpu`'s ranks (collective: every rank calls it).
/// Every failure is an error saying why, never a panic; it also aborts
/// `cpu`, so ranks that opened their device do not wait for this one in
/// NCCL's init until their timeout.
pub(crate) fn open(a: &Args, cpu: &Communicator) -> Result<Option<Gpu>, String> {
    open_on_this_rank(a, cpu).inspect_err(|e| cpu.abort(e))
}

fn open_on_this_rank(a: &Args, cpu: &Communicator) -> Result<Option<Gpu>, String> {
    let build = |device: &Device, lib: Arc<NcclLibrary>| {
        GpuCommunicator::builder(cpu, device)
            .library(lib)
            .timeout(a.op_timeout().unwrap_or_else(|| cpu.timeout()))
            .build()
            .map_err(|e| format!("cannot make the GPU communicator: {e}"))
    };
    match a.device {
        DeviceChoice::Cpu => Ok(None),
        DeviceChoice::Standin => {
            let path = std::env::var_os(STANDIN_VAR).ok_or_else(|| {
                format!(
                    "--device standin needs {STANDIN_VAR} set to the stand-in NCCL's \
                     libringwire_nccl_standin.so (cargo build -p ringwire-nccl-standin)"
                )
            })?;
            let lib = NcclLibrary::open(&path).map_err(|e| format!("--device standin: {e}"))?;
            let device =
                Device::standin_host(&lib).map_err(|e| format!("--device standin: {e}"))?;
            Ok(Some(Gpu::Standin {
                gpu: build(&device, lib)?,
                mem: HostMem,
            }))
        }
        #[cfg(feature = "cuda")]
        DeviceChoice::Cuda => {
            let ordinal = cpu.local_rank().unwrap_or(0);
            // Device::cuda first: it finds a missing driver or device
            // without cudarc's panics.
            let device = Device::cuda(ordinal).map_err(|e| format!("--device cuda: {e}"))?;
            let lib = NcclLibrary::global().map_err(|e| format!("--device cuda: {e}"))?;
            let mem = memory::CudaMem::open(ordinal)?;
            Ok(Some(Gpu::Cuda {
                gpu: build(&device, lib)?,
                mem,
            }))
        }
        #[cfg(not(feature = "cuda"))]
        DeviceChoice::Cuda => Err(crate::args::CUDA_FEATURE_MISSING.into()),
    }
}

impl Gpu {
    fn comm(&self) -> &GpuCommunicator {
        match self {
            Gpu::Standin { gpu, .. } => gpu,
            #[cfg(feature = "cuda")]
            Gpu::Cuda { gpu, .. } => gpu,
        }
    }

    /// This rank's device, e.g. `cuda:0 (NVIDIA H100 80GB HBM3)`.
    pub(crate) fn device(&self) -> String {
        format!("{:?}", self.comm().device())
    }

    /// The NCCL in use: `NCCL 2.21.5 at /path/libnccl.so.2`.
    pub(crate) fn library(&self) -> String {
        format!("{:?}", self.comm().library())
    }

    /// `a.op` at `shape` on this device, its buffers allocated.
    pub(crate) fn bench<'g, T: GpuElem>(
        &'g self,
        a: &Args,
        shape: Shape,
    ) -> Result<Box<dyn Bench + 'g>, String> {
        let op = (a.op, a.redop, a.root);
        Ok(match self {
            Gpu::Standin { gpu, mem } => Box::new(GpuRunner::<T, _>::new(gpu, mem, op, shape)?),
            #[cfg(feature = "cuda")]
            Gpu::Cuda { gpu, mem } => Box::new(GpuRunner::<T, _>::new(gpu, mem, op, shape)?),
        })
    }
}
