//! Errors of the rendezvous store's server and client.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use thiserror::Error;

use super::protocol::ProtocolError;

/// What went wrong talking to (or running) the rendezvous store.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StoreError {
    /// No connection to the store could be made before the timeout.
    #[error(
        "could not connect to the rendezvous store at {} within {timeout:?} (last error: \
         {last_error}); check that its host is running (rank 0, a ringwire-store, or \
         torchrun's agent) and that MASTER_ADDR/MASTER_PORT point at it",
        AddrList(addrs)
    )]
    Connect {
        /// The addresses tried.
        addrs: Vec<SocketAddr>,
        /// How long they were tried.
        timeout: Duration,
        /// The last attempt's error.
        last_error: io::Error,
    },
    /// The server could not listen on the requested address.
    #[error(
        "could not listen on {addr} for the rendezvous store: {source}; check that {} is an \
         address of this machine and that no other process (or an earlier run) uses port {} \
         (choose another MASTER_PORT)",
        addr.ip(),
        addr.port()
    )]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The operating system's error.
        source: io::Error,
    },
    /// Some other I/O failure.
    #[error("rendezvous store at {addr}: I/O error while {op}: {source}")]
    Io {
        /// The store's address.
        addr: SocketAddr,
        /// What was being done.
        op: &'static str,
        /// The operating system's error.
        source: io::Error,
    },
    /// A `get` or `wait` gave up because keys were still missing.
    #[error(
        "timed out after {waited:?} waiting for rendezvous store key(s) {}; another rank may \
         have failed before publishing them, or the timeout is too short",
        KeyList(keys)
    )]
    Timeout {
        /// The keys still missing.
        keys: Vec<String>,
        /// How long the wait lasted.
        waited: Duration,
    },
    /// The server closed the connection.
    #[error(
        "rendezvous store at {addr} closed the connection (did its host, rank 0, a \
         ringwire-store or torchrun's agent, exit or crash?)"
    )]
    ServerGone {
        /// The store's address.
        addr: SocketAddr,
    },
    /// The server did not answer in time.
    #[error(
        "rendezvous store at {addr} did not answer within {waited:?} (is its host, rank 0, a \
         ringwire-store or torchrun's agent, hung, or the network between the hosts down?)"
    )]
    NoReply {
        /// The store's address.
        addr: SocketAddr,
        /// How long this side waited.
        waited: Duration,
    },
    /// An earlier error left the connection in an unknown state.
    #[error(
        "connection to the rendezvous store at {addr} is unusable after an earlier error \
         ({cause}); connect a new client"
    )]
    Broken {
        /// The store's address.
        addr: SocketAddr,
        /// The earlier error.
        cause: String,
    },
    /// The peer sent bytes that are not a valid store message.
    #[error("rendezvous store protocol error: {0}")]
    Protocol(ProtocolError),
    /// A key, value or key list is over the store's limits.
    #[error(
        "{what} {len} exceeds the rendezvous store's limit of {cap}; the store is for small \
         rendezvous metadata, send bulk data through a collective instead"
    )]
    TooLarge {
        /// What is too large (a key, a value, a key list).
        what: &'static str,
        /// Its size.
        len: usize,
        /// The limit.
        cap: usize,
    },
    /// The server refused the request.
    #[error("rendezvous store refused the request: {0}")]
    Remote(String),
    /// What answers at the store's address is not a PyTorch TCPStore (with
    /// `RINGWIRE_STORE=torch` or torchrun's agent store).
    #[error(
        "no PyTorch TCPStore answers at {addr} ({detail}); torchrun's agent hosts one at \
         MASTER_ADDR:MASTER_PORT when it sets TORCHELASTIC_USE_AGENT_STORE=True (torch 2.2 or \
         newer: older servers speak an older protocol). If rank 0 \
         should host ringwire's own store there instead, set RINGWIRE_STORE=ringwire"
    )]
    NotTcpStore {
        /// The store's address.
        addr: SocketAddr,
        /// What answered instead, in words.
        detail: String,
    },
    /// A PyTorch TCPStore sent bytes that do not answer the request.
    #[error("PyTorch TCPStore at {addr}: {source}")]
    TcpStore {
        /// The store's address.
        addr: SocketAddr,
        /// What was wrong with its answer.
        source: super::tcpstore::protocol::TcpStoreError,
    },
    /// TLS or job-secret authentication with the store failed (a different
    /// CA, secret or TLS mode on the two sides).
    #[error("rendezvous store at {addr}: {detail}")]
    Security {
        /// The store's address.
        addr: SocketAddr,
        /// Which check failed, in words.
        detail: String,
    },
}

impl From<ProtocolError> for StoreError {
    fn from(e: ProtocolError) -> StoreError {
        match e {
            ProtocolError::TooLarge { what, len, cap } => StoreError::TooLarge { what, len, cap },
            other => StoreError::Protocol(other),
        }
    }
}

/// `a, b` for addresses.
struct AddrList<'a>(&'a [SocketAddr]);

impl fmt::Display for AddrList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("(no addresses)");
        }
        for (i, a) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{a}")?;
        }
        Ok(())
    }
}

/// `"a", "b"` for keys, cut short after a few.
struct KeyList<'a>(&'a [String]);

impl fmt::Display for KeyList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 8;
        for (i, k) in self.0.iter().take(SHOWN).enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{k:?}")?;
        }
        if self.0.len() > SHOWN {
            write!(f, " and {} more", self.0.len() - SHOWN)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_what_and_where() {
        let addr: SocketAddr = "10.0.0.1:29500".parse().unwrap();
        let e = StoreError::ServerGone { addr };
        assert_eq!(
            e.to_string(),
            "rendezvous store at 10.0.0.1:29500 closed the connection (did its host, rank 0, a \
             ringwire-store or torchrun's agent, exit or crash?)"
        );
        let e = StoreError::Connect {
            addrs: vec![addr, "[::1]:29500".parse().unwrap()],
            timeout: Duration::from_secs(1),
            last_error: io::ErrorKind::ConnectionRefused.into(),
        };
        let msg = e.to_string();
        assert!(msg.contains("10.0.0.1:29500, [::1]:29500"), "{msg}");
        assert!(msg.contains("MASTER_ADDR/MASTER_PORT"), "{msg}");
        let keys: Vec<String> = (0..10).map(|i| format!("k{i}")).collect();
        let msg = StoreError::Timeout {
            keys,
            waited: Duration::from_millis(5),
        }
        .to_string();
        assert!(
            msg.contains("\"k0\", \"k1\"") && msg.contains("and 2 more"),
            "{msg}"
        );
    }

    #[test]
    fn too_large_protocol_error_becomes_too_large() {
        let e = StoreError::from(ProtocolError::TooLarge {
            what: "value length",
            len: 9,
            cap: 8,
        });
        assert!(matches!(e, StoreError::TooLarge { len: 9, cap: 8, .. }));
        let e = StoreError::from(ProtocolError::BadBool(3));
        assert!(matches!(e, StoreError::Protocol(ProtocolError::BadBool(3))));
    }
}
