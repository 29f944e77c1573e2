//! PyTorch's `TCPStore`, as a client: the store torchrun's agent hosts.
//!
//! - [`protocol`]: requests and replies as bytes (sans-IO, fuzzed).
//! - `client`: [`TcpStoreClient`], the socket around it.

#[cfg_attr(not(feature = "internals"), allow(unreachable_pub))]
mod client;
pub mod protocol;

pub use client::TcpStoreClient;
pub use protocol::TcpStoreError;
