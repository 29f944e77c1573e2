//! The rendezvous store: a small key-value store over TCP through which ranks
//! find each other before any collective runs (like torch's `TCPStore`).
//!
//! Rank 0 (or a standalone `ringwire-store` process) runs a [`StoreServer`];
//! every rank connects a [`StoreClient`] and publishes and looks up addresses,
//! counters and barrier keys. `get` and `wait` block on the server until keys
//! appear, so ranks that start at different times still meet.
//!
//! - [`protocol`]: the wire format, pure and public so it can be fuzzed.
//! - `table`: what each request does to the key-value table (no I/O).
//! - `server` / `client`: the sockets and threads around them.

mod client;
mod error;
pub mod protocol;
mod server;
mod table;

pub use client::{REPLY_MARGIN, REPLY_TIMEOUT, StoreClient};
pub use error::StoreError;
pub use protocol::{MAX_KEY_LEN, MAX_KEYS_IN_WAIT, MAX_VALUE_LEN, ProtocolError};
pub use server::StoreServer;
