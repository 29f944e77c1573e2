#![doc = include_str!("../README.md")]

pub mod algo;
pub mod dtype;
#[doc(hidden)]
pub mod testing;
// helper-owned modules (each line added by whoever owns the module):
pub mod env;
pub mod error_file;
#[cfg(feature = "logging")]
pub mod logging;
pub mod metrics;
pub mod net;
pub mod refusals;
pub mod security;
pub mod store;
pub mod train;
pub mod wire;

mod arena;
mod buffer;
mod clock;
mod comm;
mod config;
mod error;
mod exec;
mod pending;
mod recorder;
mod rendezvous;
mod runner;
mod spin;
mod stats;
mod transport;
mod world;

/// A gather of blocks this large (bytes per rank) to a root of 3+ ranks
/// goes in turn: each rank sends when the root asks (decision 0023).
pub use algo::GATHER_IN_TURN_BYTES;
pub use buffer::{Buffer, CollectiveBuffer};
pub use comm::Communicator;
pub use config::{
    DEFAULT_CHUNK_BYTES, DEFAULT_HEARTBEAT_TIMEOUT, DEFAULT_INTER_HOST_GBPS,
    DEFAULT_SMALL_MESSAGE_BYTES, DEFAULT_SPIN, DEFAULT_TIMEOUT, LocalLinks, TransportKind,
    TwoLevel, uring_status,
};
pub use dtype::{DType, Element, ReduceOp};
pub use error::{Error, LinkFailure, OpContext, Result};
/// The `half` crate whose `f16` and `bf16` are ringwire's half-precision
/// element types, so a caller needs no matching dependency of its own.
pub use half;
pub use pending::PendingCollective;
pub use recorder::{DEFAULT_FLIGHT_RECORDER_OPS, OpRecord, OpState};
pub use rendezvous::Builder;
pub use security::{Security, SecurityError, TlsConfig, TlsMode};
pub use stats::{EngineThreadStats, LaneStats, Stats};
pub use wire::OpKind;
