//! PyTorch's `TCPStore`, as a client: the store torchrun's agent hosts.
//!
//! - [`protocol`]: requests and replies as bytes (sans-IO, fuzzed).
//! - `client`: [`TcpStoreClient`], the socket around it.

mod client;
pub mod protocol;

pub use client::TcpStoreClient;
