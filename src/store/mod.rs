//! The rendezvous store: a small key-value store over TCP through which ranks
//! find each other before any collective runs (like torch's `TCPStore`).
//!
//! Rank 0 (or a standalone `ringwire-store` process) runs a [`StoreServer`];
//! every rank connects a `StoreClient` and publishes and looks up addresses,
//! counters and barrier keys. `get` and `wait` block on the server until keys
//! appear, so ranks that start at different times still meet. Under torchrun,
//! whose agent already hosts a PyTorch `TCPStore` on MASTER_PORT, every rank
//! is instead a `TcpStoreClient` of that store. Rendezvous sees either
//! through the one `Store` interface.
//!
//! Public here: [`StoreServer`], to host a store in a process of your own
//! (the `ringwire-store` binary is one), and [`StoreError`]. Inside:
//! - `protocol`: the wire format, pure so it can be fuzzed.
//! - `table`: what each request does to the key-value table (no I/O).
//! - `server` / `client`: the sockets and threads around them.
//! - `tcpstore`: PyTorch's TCPStore protocol and client.

#[cfg_attr(not(feature = "internals"), allow(unreachable_pub))]
mod client;
mod error;
internal_module!(protocol);
mod server;
mod table;
internal_module!(tcpstore);

use std::fmt::Debug;
use std::net::SocketAddr;
use std::time::Duration;

pub use error::StoreError;
pub use protocol::ProtocolError;
pub use server::StoreServer;
pub use tcpstore::TcpStoreError;
internal_use!(client::{REPLY_MARGIN, REPLY_TIMEOUT, StoreClient});
internal_use!(protocol::{MAX_KEY_LEN, MAX_KEYS_IN_WAIT, MAX_VALUE_LEN});
internal_use!(tcpstore::TcpStoreClient);

internal_item! {
/// What rendezvous asks of a store, whichever serves it: ringwire's own
/// (`StoreClient`) or PyTorch's (`TcpStoreClient`). Calls from several
/// threads are serialised on one connection.
pub trait Store: Send + Sync + Debug {
    /// The address of the store.
    fn server_addr(&self) -> SocketAddr;
    /// Stores `value` under `key`, replacing any previous value.
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError>;
    /// Waits up to `timeout` for `key` to exist and returns its value.
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreError>;
    /// The value of `key`, or `None` if it does not exist (does not wait).
    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// Adds `delta` to the decimal integer at `key` (missing counts as 0)
    /// and returns the new value.
    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError>;
    /// Sets `key` to `desired` if its value is `expected`, or if it does
    /// not exist and `expected` is empty; returns the value afterwards.
    fn compare_set(
        &self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
    ) -> Result<Vec<u8>, StoreError>;
    /// Removes `key`; returns whether it existed.
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    fn delete(&self, key: &str) -> Result<bool, StoreError>;
    /// Waits up to `timeout` until every key of `keys` exists.
    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<(), StoreError>;
    /// How long a request that does not wait on the server may take to be
    /// answered, from now on ([`REPLY_TIMEOUT`] at first).
    fn set_reply_timeout(&mut self, timeout: Duration);
}
}

/// Forwards each [`Store`] method to the inherent method of that name.
macro_rules! forward_store {
    ($client:ty) => {
        impl Store for $client {
            fn server_addr(&self) -> SocketAddr {
                <$client>::server_addr(self)
            }
            fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
                <$client>::set(self, key, value)
            }
            fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreError> {
                <$client>::get(self, key, timeout)
            }
            fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
                <$client>::try_get(self, key)
            }
            fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
                <$client>::add(self, key, delta)
            }
            fn compare_set(
                &self,
                key: &str,
                expected: &[u8],
                desired: &[u8],
            ) -> Result<Vec<u8>, StoreError> {
                <$client>::compare_set(self, key, expected, desired)
            }
            fn delete(&self, key: &str) -> Result<bool, StoreError> {
                <$client>::delete(self, key)
            }
            fn wait(&self, keys: &[&str], timeout: Duration) -> Result<(), StoreError> {
                <$client>::wait(self, keys, timeout)
            }
            fn set_reply_timeout(&mut self, timeout: Duration) {
                self.reply_timeout = timeout;
            }
        }
    };
}

forward_store!(StoreClient);
forward_store!(TcpStoreClient);
