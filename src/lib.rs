//! Collective communication for distributed training: all-reduce,
//! broadcast, reduce, all-gather, reduce-scatter, all-to-all, gather,
//! scatter, barrier and send/recv between processes on one host or many.
//!
//! A [`Communicator`] joins the job the launcher describes (torchrun,
//! mpirun, srun, or `RINGWIRE_*` variables) and runs collectives over
//! shared memory between ranks of one host and TCP between hosts. Every
//! collective returns a [`PendingCollective`] at once: await it, or
//! [`wait`](PendingCollective::wait) for it from a plain thread, and
//! compute in between.
//!
//! ```no_run
//! use ringwire::{Communicator, ReduceOp};
//!
//! # fn main() -> Result<(), ringwire::Error> {
//! let comm = Communicator::from_env().wait()?;
//! let grads = vec![comm.rank() as f32; 1 << 20];
//! let pending = comm.all_reduce(grads, ReduceOp::Avg); // starts now
//! // ... compute ...
//! let grads = pending.wait()?; // every rank's average
//! # let _ = grads;
//! # Ok(())
//! # }
//! ```
//!
//! Where to go next:
//! - [`Communicator`]: every collective, in an owned form (buffers go in and
//!   come back) and a blocking slice form; [`Builder`] for settings in code.
//! - [`train`]: data-parallel and sharded training on top of the collectives
//!   (`GradReducer`, `ShardedParams`).
//! - [`Error`]: what fails and how it names the op, the peer and the cause.
//! - [`metrics`], [`logging`], [`error_file`]: observing a running job.
//! - The user guide (`docs/guide/` in the repository) teaches launching,
//!   failures, security and tuning; `docs/reference/` lists every variable.
#![warn(missing_docs, unnameable_types)]
#![cfg_attr(docsrs, feature(doc_cfg))]

/// Declares a module that only the `internals` feature makes public: the
/// wire format, the schedules, the store's protocol and the test helpers,
/// which ringwire's own bench, fuzz targets and tests reach into. Without
/// the feature they are private, so nothing outside the crate depends on
/// them.
macro_rules! internal_module {
    ($(#[$attr:meta])* $name:ident) => {
        $(#[$attr])*
        #[cfg(feature = "internals")]
        #[doc(hidden)]
        pub mod $name;
        $(#[$attr])*
        #[cfg(not(feature = "internals"))]
        #[allow(unreachable_pub)]
        pub(crate) mod $name;
    };
}

/// Re-exports an item publicly under the `internals` feature, and to the
/// crate only without it.
macro_rules! internal_use {
    ($($path:tt)*) => {
        #[cfg(feature = "internals")]
        #[doc(hidden)]
        pub use $($path)*;
        #[cfg(not(feature = "internals"))]
        #[allow(unused_imports)]
        pub(crate) use $($path)*;
    };
}

/// Declares an item public under the `internals` feature, and
/// crate-visible without it.
macro_rules! internal_item {
    ($(#[$attr:meta])* pub $($item:tt)*) => {
        $(#[$attr])*
        #[cfg(feature = "internals")]
        #[doc(hidden)]
        pub $($item)*
        $(#[$attr])*
        #[cfg(not(feature = "internals"))]
        pub(crate) $($item)*
    };
}

pub mod error_file;
#[cfg(feature = "logging")]
pub mod logging;
pub mod metrics;
pub mod store;
pub mod train;

internal_module!(agree);
internal_module!(algo);
internal_module!(dtype);
internal_module!(env);
internal_module!(net);
internal_module!(refusals);
internal_module!(security);
internal_module!(wire);
internal_module!(
    /// Test helpers; compiled for the crate's own tests and `internals`.
    #[cfg(any(test, feature = "internals"))]
    testing
);

mod arena;
mod buffer;
mod clock;
mod comm;
internal_module!(config);
mod error;
mod exec;
mod locks;
mod pending;
mod recorder;
mod rendezvous;
mod runner;
mod slots;
mod spin;
mod stats;
mod transport;
mod world;

pub use buffer::{Buffer, CollectiveBuffer};
pub use comm::{Agreed, Communicator};
pub use config::{
    DEFAULT_CHUNK_BYTES, DEFAULT_HEARTBEAT_TIMEOUT, DEFAULT_INTER_HOST_GBPS,
    DEFAULT_SMALL_MESSAGE_BYTES, DEFAULT_SPIN, DEFAULT_TIMEOUT, LocalLinks, TransportKind,
    TwoLevel, uring_status,
};
pub use dtype::{DType, Element, ReduceOp};
pub use env::{EnvError, StoreKind};
pub use error::{Error, LinkFailure, OpContext, Result};
/// The `half` crate whose `f16` and `bf16` are ringwire's half-precision
/// element types, so a caller needs no matching dependency of its own.
pub use half;
pub use net::NetError;
pub use pending::PendingCollective;
pub use recorder::{DEFAULT_FLIGHT_RECORDER_OPS, OpRecord, OpState};
pub use rendezvous::Builder;
pub use security::{Security, SecurityError, TlsConfig, TlsMode};
pub use stats::{EngineThreadStats, LaneStats, Stats};
pub use wire::{FrameKind, OpKind, WireError};

/// The README's and the guide's examples, compiled (and the ones not
/// marked `no_run` run) as doctests, so the docs a user copies from stay
/// true.
#[cfg(doctest)]
mod docs_examples {
    #[doc = include_str!("../README.md")]
    struct Readme;
    #[doc = include_str!("../docs/guide/01-launching.md")]
    struct Launching;
    #[doc = include_str!("../docs/guide/02-collectives.md")]
    struct Collectives;
    #[doc = include_str!("../docs/guide/03-training.md")]
    struct Training;
    #[doc = include_str!("../docs/guide/04-gpus.md")]
    struct Gpus;
    #[doc = include_str!("../docs/guide/05-across-hosts.md")]
    struct AcrossHosts;
    #[doc = include_str!("../docs/guide/06-failures.md")]
    struct Failures;
    #[doc = include_str!("../docs/guide/07-security.md")]
    struct Security;
    #[doc = include_str!("../docs/guide/08-observing.md")]
    struct Observing;
    #[doc = include_str!("../docs/guide/09-tuning.md")]
    struct Tuning;
    #[doc = include_str!("../docs/guide/10-benchmarking.md")]
    struct Benchmarking;
}
