//! Errors: why the NCCL path cannot run here ([`Unavailable`]), and why an
//! op failed ([`GpuError`]), each naming what, where and what to do.

use crate::nccl::codes::{NcclResult, NcclVersion};
use std::time::Duration;

/// Why NCCL (or a device) cannot be used in this process.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Unavailable {
    /// No NCCL library was found.
    #[error(
        "no NCCL library found (tried {}; last error: {last_error}). Install it with \
         `pip install nvidia-nccl-cu12` (or cu13, matching your driver) or your distribution's \
         libnccl2, or point RINGWIRE_NCCL_LIB at a libnccl.so.2",
        tried.join(", ")
    )]
    NoLibrary {
        /// The names and paths tried, in order.
        tried: Vec<String>,
        /// The last attempt's error.
        last_error: String,
    },

    /// The library lacks a function ringwire calls.
    #[error("{path} is not a usable NCCL: it lacks {symbol} ({detail})")]
    MissingSymbol {
        /// The library's path.
        path: String,
        /// The function missing.
        symbol: String,
        /// The loader's error.
        detail: String,
    },

    /// The library is older than ringwire supports.
    #[error(
        "{path} is NCCL {found}; ringwire needs {minimum} or newer (non-blocking communicators, \
         which abort needs)"
    )]
    TooOld {
        /// The library's path.
        path: String,
        /// Its version.
        found: NcclVersion,
        /// The oldest ringwire supports.
        minimum: NcclVersion,
    },

    /// The library loaded but its first call failed.
    #[error("{path} loaded but does not work: {detail}")]
    Broken {
        /// The library's path.
        path: String,
        /// What failed.
        detail: String,
    },

    /// No CUDA driver (`libcuda.so.1`) could be loaded.
    #[error("no CUDA driver: {detail}")]
    NoDriver {
        /// The loader's error.
        detail: String,
    },

    /// The driver loaded but there is no such device.
    #[error("no CUDA device {ordinal}: {detail}")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// The driver's answer.
        detail: String,
    },

    /// ringwire-gpu was built without its `cuda` feature.
    #[error("ringwire-gpu was built without the `cuda` feature, so it cannot use CUDA devices")]
    NoCudaFeature,

    /// The loaded library is not ringwire's stand-in, which alone offers
    /// host-memory devices.
    #[error(
        "{path} does not export the stand-in's host streams ({detail}); host devices need ringwire's stand-in NCCL"
    )]
    NotStandIn {
        /// The library's path.
        path: String,
        /// What it lacks.
        detail: String,
    },
}

/// A GPU collective, for errors and the flight of ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum GpuOp {
    /// Making the communicator.
    Init,
    /// `all_reduce`.
    AllReduce,
    /// `broadcast`.
    Broadcast,
    /// `reduce`.
    Reduce,
    /// `all_gather`.
    AllGather,
    /// `reduce_scatter`.
    ReduceScatter,
    /// `all_to_all`.
    AllToAll,
    /// `gather`.
    Gather,
    /// `scatter`.
    Scatter,
    /// `send`.
    Send,
    /// `recv`.
    Recv,
    /// `barrier`.
    Barrier,
    /// A `group()` of ops launched together.
    Group,
    /// [`HierarchicalAllReduce`](crate::HierarchicalAllReduce)'s op.
    HierarchicalAllReduce,
}

impl GpuOp {
    /// The op's name as in the CPU API.
    pub fn name(self) -> &'static str {
        match self {
            GpuOp::Init => "init",
            GpuOp::AllReduce => "all_reduce",
            GpuOp::Broadcast => "broadcast",
            GpuOp::Reduce => "reduce",
            GpuOp::AllGather => "all_gather",
            GpuOp::ReduceScatter => "reduce_scatter",
            GpuOp::AllToAll => "all_to_all",
            GpuOp::Gather => "gather",
            GpuOp::Scatter => "scatter",
            GpuOp::Send => "send",
            GpuOp::Recv => "recv",
            GpuOp::Barrier => "barrier",
            GpuOp::Group => "group",
            GpuOp::HierarchicalAllReduce => "hierarchical_all_reduce",
        }
    }
}

impl std::fmt::Display for GpuOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Which op, on which rank: the head of every op error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpAt {
    /// Which op.
    pub op: GpuOp,
    /// The op's number on its communicator (0 for init).
    pub seq: u64,
    /// This rank.
    pub rank: usize,
    /// The communicator's size.
    pub world_size: usize,
}

impl std::fmt::Display for OpAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "GPU {} #{} on rank {} of {}",
            self.op, self.seq, self.rank, self.world_size
        )
    }
}

/// Why a GPU op (or making a communicator) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GpuError {
    /// NCCL or the device cannot be used here.
    #[error(transparent)]
    Unavailable(#[from] Unavailable),

    /// NCCL returned an error, at the call or later (its async error).
    #[error("{at}: NCCL error {code}: {text}{}", last_error_suffix(last_error))]
    Nccl {
        /// Which op, on which rank.
        at: OpAt,
        /// NCCL's result code.
        code: NcclResult,
        /// `ncclGetErrorString(code)`.
        text: String,
        /// `ncclGetLastError`: NCCL's own detail, often the real cause.
        last_error: String,
    },

    /// The op did not finish within its timeout; the communicator was
    /// aborted on every rank.
    #[error(
        "{at}: timed out after {waited:?} ({state}); the communicator was aborted on every rank"
    )]
    Timeout {
        /// Which op, on which rank.
        at: OpAt,
        /// How long it ran.
        waited: Duration,
        /// What the op was doing: "NCCL still initialising", "enqueued,
        /// not finished on the device; last finished op #N".
        state: String,
    },

    /// The communicator was aborted: by another rank (after its own
    /// failure), by this rank's earlier failure, or by `abort()`.
    #[error("{at}: communicator aborted: {reason}")]
    Aborted {
        /// Which op, on which rank.
        at: OpAt,
        /// Why, as the aborting side said.
        reason: String,
    },

    /// A CUDA call failed.
    #[error("{at}: CUDA error in {call}: {detail}")]
    Cuda {
        /// Which op, on which rank.
        at: OpAt,
        /// The CUDA call.
        call: &'static str,
        /// Its error.
        detail: String,
    },

    /// The caller passed arguments the op cannot take.
    #[error("{at}: invalid argument: {detail}")]
    InvalidArgument {
        /// Which op, on which rank.
        at: OpAt,
        /// What is wrong with the arguments.
        detail: String,
    },

    /// Ranks called different collectives (RINGWIRE_DEBUG=detail).
    #[error("{at}: ranks disagree about the collective: {detail}")]
    Mismatch {
        /// Which op, on which rank.
        at: OpAt,
        /// Both sides' calls.
        detail: String,
    },

    /// The CPU communicator under the GPU one failed (making it, the
    /// unique id's exchange, a debug check).
    #[error("{at}: CPU side: {source}")]
    Cpu {
        /// Which op, on which rank.
        at: OpAt,
        /// The CPU communicator's error.
        #[source]
        source: Box<ringwire::Error>,
    },
}

fn last_error_suffix(last: &str) -> String {
    if last.is_empty() {
        String::new()
    } else {
        format!("; NCCL's last error: {last}")
    }
}

impl GpuError {
    /// A short stable name for the kind of error (for metrics and logs).
    pub fn kind(&self) -> &'static str {
        match self {
            GpuError::Unavailable(_) => "unavailable",
            GpuError::Nccl { .. } => "nccl",
            GpuError::Timeout { .. } => "timeout",
            GpuError::Aborted { .. } => "aborted",
            GpuError::Cuda { .. } => "cuda",
            GpuError::InvalidArgument { .. } => "invalid_argument",
            GpuError::Mismatch { .. } => "mismatch",
            GpuError::Cpu { .. } => "cpu",
        }
    }
}
