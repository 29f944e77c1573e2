//! The trainer layer: what a data-parallel or sharded trainer needs on top
//! of the collectives, with no tensor library.
//!
//! - [`GradReducer`]: PyTorch DDP's reducer. Gradients live in bucket memory
//!   (reused every step); buckets are all-reduced in bucket order as
//!   backward marks their parameters ready, so communication overlaps the
//!   rest of backward; `finish` names parameters that never got a
//!   gradient instead of hanging; `no_sync` accumulates; hooks put bf16 or
//!   f16 on the wire, or weigh an uneven last batch; the layout is checked
//!   across ranks; per-step times as DDP logs them ([`StepStats`]).
//! - [`ShardedParams`]: ZeRO/FSDP-style shards: gradients reduce-scattered
//!   into this rank's shard, the optimizer on the shard, units all-gathered
//!   ahead of use with a window of gathers in flight, on a [`CommPair`] so
//!   gathers and reductions overlap.
//!
//! A framework adapter walks its parameters in a fixed order into a
//! [`Layout`] and copies gradients in and out (see `adapters/` and
//! `examples/ddp.rs`).
//!
//! ```no_run
//! use ringwire::train::{GradReducer, Layout, ReducerConfig};
//! use ringwire::{Communicator, DType};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let comm = Communicator::from_env().wait()?;
//! let mut layout = Layout::new(); // every parameter, in definition order
//! let w1 = layout.push("layer1.weight", 64 * 128, DType::F32);
//! let b1 = layout.push("layer1.bias", 128, DType::F32);
//! // Checks that every rank registered the same parameters.
//! let mut ddp = GradReducer::new(&comm, layout, ReducerConfig::default())?;
//! for _step in 0..10 {
//!     // Backward, last layer first: write each gradient into bucket
//!     // memory and mark it ready; a full bucket is all-reduced at once.
//!     ddp.grad_mut::<f32>(b1)?.fill(0.5);
//!     ddp.mark_ready(b1)?;
//!     ddp.grad_mut::<f32>(w1)?.fill(0.25);
//!     ddp.mark_ready(w1)?;
//!     ddp.finish()?; // waits: averaged gradients in place
//!     let _g = ddp.grad::<f32>(w1)?; // ... the optimizer step ...
//!     ddp.zero_grads();
//! }
//! # Ok(())
//! # }
//! ```

mod check;
mod grads;
mod layout;
mod reducer;
mod shard;
mod state;
mod stats;

pub use grads::GradElement;
pub use layout::{Caps, Layout, Param, ParamId};
pub use reducer::{BucketInfo, CommHook, GradReducer, ReducerConfig, Unused};
pub use shard::{CommPair, Direction, Padding, Recovered, ShardLayout, ShardedParams};
#[cfg(any(test, feature = "internals"))]
pub(crate) use state::broadcast_state_in_pieces;
pub use state::{STATE_PIECE_BYTES, broadcast_state};
pub use stats::StepStats;

use crate::DType;

/// What can go wrong in the trainer layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TrainError {
    /// Ranks registered different parameters (or in another order).
    #[error("parameter layouts differ across ranks at parameter #{index}: {detail}")]
    LayoutMismatch {
        /// The first parameter that differs, by position.
        index: usize,
        /// Both sides' name, length and type.
        detail: String,
    },

    /// `finish` found parameters whose gradients were never marked ready.
    #[error(
        "rank {rank}: these parameters never got a gradient this step (mark each ready once per \
         step, or set ReducerConfig::unused = Unused::Zero for parameters a step may not use): {}",
        params.join(", ")
    )]
    NeverReady {
        /// The rank that found them.
        rank: usize,
        /// Their names.
        params: Vec<String>,
    },

    /// A parameter was marked ready twice in one step.
    #[error("parameter {param:?} was marked ready twice in one step")]
    MarkedTwice {
        /// The parameter's name.
        param: String,
    },

    /// Its memory is in a collective: wait for `finish`.
    #[error("{param}: its memory is being reduced; reach it after finish()")]
    InFlight {
        /// The parameter's name.
        param: String,
    },

    /// A gradient asked for as another type than it has.
    #[error(
        "parameter {param:?} holds {is} gradients, not {asked} (its bucket has {len} elements)"
    )]
    WrongType {
        /// The parameter's name.
        param: String,
        /// The type asked for.
        asked: DType,
        /// The type it has.
        is: DType,
        /// Its bucket's length.
        len: usize,
    },

    /// A gradient of another length than the parameter's.
    #[error("{param}: expected {expected} elements, got {got}")]
    WrongLength {
        /// The parameter's name.
        param: String,
        /// Its length.
        expected: usize,
        /// The length given.
        got: usize,
    },

    /// No parameter has this id in the layout.
    #[error("no parameter #{id} in the layout")]
    UnknownParam {
        /// The id given.
        id: usize,
    },

    /// Gradients of this type cannot be averaged.
    #[error("parameter {param:?} has type {dtype}: gradients must be f32, f64, f16 or bf16")]
    Unsupported {
        /// The parameter's name.
        param: String,
        /// Its type.
        dtype: DType,
    },

    /// `set_sample_count` came after a bucket launched, or twice.
    #[error("set_sample_count must come once per step, before the first gradient is marked ready")]
    WeightTooLate,

    /// The parameters given do not match the layout's of that type.
    #[error("the {dtype} parameters given have lengths {got:?}, the layout's are {expected:?}")]
    ParamsDoNotMatch {
        /// The element type.
        dtype: DType,
        /// The layout's lengths of that type.
        expected: Vec<usize>,
        /// The lengths given.
        got: Vec<usize>,
    },

    /// The state [`broadcast_state`] was given differs across ranks: in
    /// how many parts, or their lengths.
    #[error(
        "the state to broadcast differs across ranks: this rank has {parts} parts of {elements} \
         elements in all, another rank has other parts or lengths"
    )]
    StateDiffers {
        /// This rank's parts.
        parts: usize,
        /// This rank's elements in all.
        elements: usize,
    },

    /// A replacement's [`ReducerConfig`] differs from the members': its
    /// buckets would not match theirs.
    #[error(
        "the GradReducer config differs across ranks: rank {rank} has {theirs}, rank {root} \
         (whose bucket order the others take) has {reference}"
    )]
    ConfigDiffers {
        /// The first rank whose config differs.
        rank: usize,
        /// Its config.
        theirs: String,
        /// The rank whose config the others were checked against.
        root: usize,
        /// That rank's config.
        reference: String,
    },

    /// Ranks that do not make whole shard groups.
    #[error("{ranks} ranks do not make groups of {group}: the group size must divide the ranks")]
    BadGroups {
        /// The group size asked for.
        group: usize,
        /// The communicator's ranks.
        ranks: usize,
    },

    /// Memory lost to an op that failed earlier.
    #[error("{what} are gone")]
    Lost {
        /// What was lost.
        what: String,
    },

    /// The collective underneath failed (and with it the communicator).
    /// Boxed: results stay small on the success path.
    #[error("{context}{source}")]
    Comm {
        /// What the trainer layer was doing.
        context: String,
        /// The communicator's error.
        #[source]
        source: Box<crate::Error>,
    },
}

impl From<crate::Error> for TrainError {
    fn from(source: crate::Error) -> TrainError {
        TrainError::Comm {
            context: String::new(),
            source: Box::new(source),
        }
    }
}

impl TrainError {
    /// Says what the failed collective was for.
    pub(crate) fn context(self, what: String) -> TrainError {
        match self {
            TrainError::Comm { source, .. } => TrainError::Comm {
                context: format!("{what}: "),
                source,
            },
            other => other,
        }
    }
}
