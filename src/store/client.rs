//! The rendezvous store client: one TCP connection, one request at a time.
//!
//! Every read has a timeout: for requests that wait on the server (`get`,
//! `wait`) it is the request's own timeout plus [`REPLY_MARGIN`], for the rest
//! [`REPLY_TIMEOUT`]. So a dead or hung server gives an error, never a hang.
//! After any failure in the middle of an exchange the connection's state is
//! unknown, so the client refuses further requests with
//! [`StoreError::Broken`] instead of reading someone else's answer.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use tracing::debug;

use super::error::StoreError;
use super::protocol::{self, ProtocolError, Request, Response};

/// How long a request that does not wait may take to be answered.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(60);
/// Added to a waiting request's timeout to get the socket read timeout, so the
/// server's own `Timeout` answer arrives before the socket gives up.
pub const REPLY_MARGIN: Duration = Duration::from_secs(5);
/// Longest single connection attempt while connecting.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(1);
/// Pause between connection rounds: starts here, doubles up to the max.
const BACKOFF_MIN: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_millis(250);

/// A connection to a rendezvous store. Methods take `&self`; concurrent calls
/// from several threads are serialised on the one connection.
#[derive(Debug)]
pub struct StoreClient {
    addr: SocketAddr,
    conn: Mutex<Conn>,
}

#[derive(Debug)]
struct Conn {
    stream: TcpStream,
    /// Why the connection was abandoned, if it was.
    broken: Option<String>,
}

impl StoreClient {
    /// Connects to the first of `addrs` that accepts, trying them all in turn
    /// and retrying with a short backoff until `timeout` has passed (the store
    /// may start after its clients).
    pub fn connect(addrs: &[SocketAddr], timeout: Duration) -> Result<StoreClient, StoreError> {
        let start = Instant::now();
        let mut backoff = BACKOFF_MIN;
        let mut last_error = if addrs.is_empty() {
            io::Error::new(io::ErrorKind::InvalidInput, "no addresses to try")
        } else {
            io::Error::new(
                io::ErrorKind::TimedOut,
                "timed out before the first attempt",
            )
        };
        loop {
            for &addr in addrs {
                let left = timeout.saturating_sub(start.elapsed());
                if left.is_zero() {
                    break;
                }
                match TcpStream::connect_timeout(&addr, left.min(ATTEMPT_TIMEOUT)) {
                    Ok(stream) => {
                        stream.set_nodelay(true).map_err(|source| StoreError::Io {
                            addr,
                            op: "setting TCP_NODELAY",
                            source,
                        })?;
                        debug!(%addr, "connected to rendezvous store");
                        return Ok(StoreClient {
                            addr,
                            conn: Mutex::new(Conn {
                                stream,
                                broken: None,
                            }),
                        });
                    }
                    Err(e) => last_error = e,
                }
            }
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() || addrs.is_empty() {
                return Err(StoreError::Connect {
                    addrs: addrs.to_vec(),
                    timeout,
                    last_error,
                });
            }
            thread::sleep(backoff.min(left));
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    /// The address of the store this client is connected to.
    pub fn server_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stores `value` under `key`, replacing any previous value.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let req = Request::Set {
            key: key.to_owned(),
            value: value.to_vec(),
        };
        match self.call(&req, None)? {
            Response::Done => Ok(()),
            other => Err(unexpected(&req, &other)),
        }
    }

    /// Waits up to `timeout` for `key` to exist and returns its value.
    pub fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreError> {
        let req = Request::Get {
            key: key.to_owned(),
            timeout_ms: millis(timeout),
        };
        match self.call(&req, Some(timeout))? {
            Response::Value(v) => Ok(v),
            other => Err(unexpected(&req, &other)),
        }
    }

    /// The value of `key`, or `None` if it does not exist (does not wait).
    pub fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let req = Request::TryGet {
            key: key.to_owned(),
        };
        match self.call(&req, None)? {
            Response::Value(v) => Ok(Some(v)),
            Response::NotFound => Ok(None),
            other => Err(unexpected(&req, &other)),
        }
    }

    /// Adds `delta` to the integer at `key` (a missing key counts as 0) and
    /// returns the new value. The value is stored as decimal ASCII, so
    /// `get` returns e.g. `b"42"`.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        let req = Request::Add {
            key: key.to_owned(),
            delta,
        };
        match self.call(&req, None)? {
            Response::Int(n) => Ok(n),
            other => Err(unexpected(&req, &other)),
        }
    }

    /// Sets `key` to `desired` if its value is `expected`, or if it does not
    /// exist and `expected` is empty. Returns the value stored afterwards:
    /// `desired` if the swap happened, the current value if not, and empty if
    /// the key does not exist (and `expected` was not empty).
    pub fn compare_set(
        &self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
    ) -> Result<Vec<u8>, StoreError> {
        let req = Request::CompareSet {
            key: key.to_owned(),
            expected: expected.to_vec(),
            desired: desired.to_vec(),
        };
        match self.call(&req, None)? {
            Response::Value(v) => Ok(v),
            other => Err(unexpected(&req, &other)),
        }
    }

    /// Removes `key`; returns whether it existed.
    pub fn delete(&self, key: &str) -> Result<bool, StoreError> {
        let req = Request::Delete {
            key: key.to_owned(),
        };
        match self.call(&req, None)? {
            Response::Bool(b) => Ok(b),
            other => Err(unexpected(&req, &other)),
        }
    }

    /// Waits up to `timeout` until every key of `keys` exists.
    pub fn wait(&self, keys: &[&str], timeout: Duration) -> Result<(), StoreError> {
        let req = Request::Wait {
            keys: keys.iter().map(|&k| k.to_owned()).collect(),
            timeout_ms: millis(timeout),
        };
        match self.call(&req, Some(timeout))? {
            Response::Done => Ok(()),
            other => Err(unexpected(&req, &other)),
        }
    }

    /// The number of keys in the store.
    pub fn num_keys(&self) -> Result<u64, StoreError> {
        let req = Request::NumKeys;
        match self.call(&req, None)? {
            Response::Count(n) => Ok(n),
            other => Err(unexpected(&req, &other)),
        }
    }

    /// Sends `req` and reads its response. `waits` is the request's own
    /// timeout if the server may hold it that long. `Timeout` and `Error`
    /// responses become errors here.
    fn call(&self, req: &Request, waits: Option<Duration>) -> Result<Response, StoreError> {
        // Over-long fields are refused before anything is sent.
        let frame = protocol::encode_request(req)?;
        let mut conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(cause) = &conn.broken {
            return Err(StoreError::Broken {
                addr: self.addr,
                cause: cause.clone(),
            });
        }
        let reply_timeout = waits.map_or(REPLY_TIMEOUT, |w| w.saturating_add(REPLY_MARGIN));
        let result = exchange(&mut conn.stream, &frame, reply_timeout);
        let resp = match result {
            Ok(resp) => resp,
            Err(e) => {
                let e = self.io_error(e, reply_timeout);
                conn.broken = Some(e.to_string());
                let _ = conn.stream.shutdown(std::net::Shutdown::Both);
                return Err(e);
            }
        };
        drop(conn);
        match resp {
            Response::Timeout { missing } => {
                let keys = if missing.is_empty() {
                    req.awaited_keys()
                        .map(|(k, _)| k.to_vec())
                        .unwrap_or_default()
                } else {
                    missing
                };
                Err(StoreError::Timeout {
                    keys,
                    waited: waits.unwrap_or_default(),
                })
            }
            Response::Error(msg) => Err(StoreError::Remote(msg)),
            other => Ok(other),
        }
    }

    fn io_error(&self, e: ExchangeError, waited: Duration) -> StoreError {
        let addr = self.addr;
        match e {
            ExchangeError::Protocol(p) => StoreError::Protocol(p),
            ExchangeError::Io(e, op) => match e.kind() {
                io::ErrorKind::UnexpectedEof
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe
                | io::ErrorKind::NotConnected => StoreError::ServerGone { addr },
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                    StoreError::NoReply { addr, waited }
                }
                _ => StoreError::Io {
                    addr,
                    op,
                    source: e,
                },
            },
        }
    }
}

enum ExchangeError {
    Io(io::Error, &'static str),
    Protocol(ProtocolError),
}

/// Writes one request frame and reads one response frame.
fn exchange(
    stream: &mut TcpStream,
    frame: &[u8],
    reply_timeout: Duration,
) -> Result<Response, ExchangeError> {
    let io = |op| move |e| ExchangeError::Io(e, op);
    stream
        .set_write_timeout(Some(REPLY_TIMEOUT))
        .map_err(io("setting the write timeout"))?;
    // A zero timeout means "none" to the OS; the margin keeps it nonzero.
    stream
        .set_read_timeout(Some(reply_timeout.max(Duration::from_millis(1))))
        .map_err(io("setting the read timeout"))?;
    stream.write_all(frame).map_err(io("sending a request"))?;
    let mut header = [0u8; protocol::HEADER_LEN];
    stream
        .read_exact(&mut header)
        .map_err(io("reading a response"))?;
    let total = match protocol::response_frame_len(&header) {
        Ok(Some(total)) => total,
        // Cannot happen with a full header; reported rather than panicking.
        Ok(None) => {
            return Err(ExchangeError::Protocol(ProtocolError::Truncated {
                what: "header",
            }));
        }
        Err(e) => return Err(ExchangeError::Protocol(e)),
    };
    let body_len = total - protocol::HEADER_LEN;
    let mut buf = header.to_vec();
    // `take` + `read_to_end` grows the buffer as bytes arrive rather than
    // trusting the declared length up front.
    let read = Read::take(&mut *stream, u64::try_from(body_len).unwrap_or(u64::MAX))
        .read_to_end(&mut buf)
        .map_err(io("reading a response"))?;
    if read < body_len {
        return Err(ExchangeError::Io(
            io::ErrorKind::UnexpectedEof.into(),
            "reading a response",
        ));
    }
    match protocol::decode_response(&buf) {
        Ok(Some((resp, _))) => Ok(resp),
        Ok(None) => Err(ExchangeError::Io(
            io::ErrorKind::UnexpectedEof.into(),
            "reading a response",
        )),
        Err(e) => Err(ExchangeError::Protocol(e)),
    }
}

fn unexpected(req: &Request, resp: &Response) -> StoreError {
    StoreError::Protocol(ProtocolError::UnexpectedResponse {
        request: req.name(),
        response: resp.name(),
    })
}

/// `d` in whole milliseconds, rounded up so a sub-millisecond timeout still
/// waits, saturating at `u64::MAX`.
fn millis(d: Duration) -> u64 {
    let ms = d.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_rounds_up_and_saturates() {
        assert_eq!(millis(Duration::ZERO), 0);
        assert_eq!(millis(Duration::from_micros(1)), 1);
        assert_eq!(millis(Duration::from_millis(1500)), 1500);
        assert_eq!(millis(Duration::MAX), u64::MAX);
    }
}
