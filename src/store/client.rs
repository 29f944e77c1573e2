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
use super::server::{AUTH_CONTEXT, AUTH_MAGIC};
use crate::security::secret::{self, NONCE_LEN, PROOF_LEN, Role};
use crate::security::{self, ReadHalf, Security, WriteHalf};

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
    /// How long a request that does not wait server-side may take.
    pub(super) reply_timeout: Duration,
}

struct Conn {
    /// The socket, for timeouts and shutdown.
    stream: TcpStream,
    /// Its byte streams: plain clones, or a TLS session's halves.
    reader: ReadHalf,
    writer: WriteHalf,
    /// Why the connection was abandoned, if it was.
    broken: Option<String>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("stream", &self.stream)
            .field("broken", &self.broken)
            .finish_non_exhaustive()
    }
}

// The whole protocol, though rendezvous uses part of it; the tests and the
// bench use the rest.
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
impl StoreClient {
    /// Connects to the first of `addrs` that accepts, trying them all in turn
    /// and retrying with a short backoff until `timeout` has passed (the store
    /// may start after its clients). Plaintext, no job secret; see
    /// [`StoreClient::connect_with`].
    pub fn connect(addrs: &[SocketAddr], timeout: Duration) -> Result<StoreClient, StoreError> {
        StoreClient::connect_with(addrs, timeout, &Security::none())
    }

    /// As [`StoreClient::connect`], then runs TLS and the job-secret check
    /// of `security` (which must match the server's). A mismatch is a
    /// [`StoreError::Security`] at once, not retried.
    pub fn connect_with(
        addrs: &[SocketAddr],
        timeout: Duration,
        security: &Security,
    ) -> Result<StoreClient, StoreError> {
        let (stream, addr) = dial(addrs, timeout)?;
        let (reader, writer) = secure_connect(&stream, addr, security)?;
        debug!(%addr, "connected to rendezvous store");
        Ok(StoreClient {
            addr,
            reply_timeout: REPLY_TIMEOUT,
            conn: Mutex::new(Conn {
                stream,
                reader,
                writer,
                broken: None,
            }),
        })
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

    /// Uses `timeout` instead of [`REPLY_TIMEOUT`] for requests that do not
    /// wait on the server (set, try_get, add, ...): for callers that must
    /// not block long on a store that has become unreachable.
    pub fn with_reply_timeout(mut self, timeout: Duration) -> StoreClient {
        self.reply_timeout = timeout;
        self
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
        let reply_timeout = waits.map_or(self.reply_timeout, |w| w.saturating_add(REPLY_MARGIN));
        let result = exchange(&mut conn, &frame, reply_timeout);
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
            ExchangeError::Io(e, _) if security::is_tls_error(&e) => StoreError::Security {
                addr,
                detail: security::describe_io(&e, "the store"),
            },
            ExchangeError::Io(e, op) => io_failure(addr, e, op, waited),
        }
    }
}

/// Connects to the first of `addrs` that accepts, trying them all in turn
/// and retrying with a short backoff until `timeout` has passed (the store
/// may start after its clients), with TCP_NODELAY set.
pub(super) fn dial(
    addrs: &[SocketAddr],
    timeout: Duration,
) -> Result<(TcpStream, SocketAddr), StoreError> {
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
                    return Ok((stream, addr));
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

/// What an I/O error talking to the store at `addr` means to a caller:
/// the server went away, did not answer within `waited`, or something else
/// failed while doing `op`.
pub(super) fn io_failure(
    addr: SocketAddr,
    e: io::Error,
    op: &'static str,
    waited: Duration,
) -> StoreError {
    match e.kind() {
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::NotConnected => StoreError::ServerGone { addr },
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => StoreError::NoReply { addr, waited },
        _ => StoreError::Io {
            addr,
            op,
            source: e,
        },
    }
}

enum ExchangeError {
    Io(io::Error, &'static str),
    Protocol(ProtocolError),
}

/// How long the TLS handshake and the job-secret check may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs TLS and the job-secret check of `sec` on a new connection.
fn secure_connect(
    stream: &TcpStream,
    addr: SocketAddr,
    sec: &Security,
) -> Result<(ReadHalf, WriteHalf), StoreError> {
    let fail = |detail: String| StoreError::Security { addr, detail };
    let io = |e: io::Error| {
        if security::is_tls_error(&e) {
            fail(security::describe_io(&e, "the store"))
        } else {
            StoreError::Io {
                addr,
                op: "authenticating",
                source: e,
            }
        }
    };
    stream
        .set_read_timeout(Some(HANDSHAKE_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(HANDSHAKE_TIMEOUT)))
        .map_err(io)?;
    let (mut reader, mut writer) = match &sec.tls {
        Some(tls) => security::tls_connect(tls, stream, addr.ip(), "the store").map_err(|e| {
            // A plaintext store answers a ClientHello with an Error response.
            let said = e
                .plaintext
                .as_deref()
                .and_then(|b| match protocol::decode_response(b) {
                    Ok(Some((Response::Error(msg), _))) => Some(msg),
                    _ => None,
                });
            fail(match said {
                Some(msg) => format!("{}; it said: {msg}", e.detail),
                None => e.detail,
            })
        })?,
        None => security::plain_halves(stream).map_err(io)?,
    };
    if let Some(secret) = &sec.secret {
        let client_nonce = secret::nonce().map_err(io)?;
        writer
            .write_all(&[&AUTH_MAGIC[..], &client_nonce].concat())
            .map_err(io)?;
        let mut magic = [0u8; AUTH_MAGIC.len()];
        reader.read_exact(&mut magic).map_err(io)?;
        if magic != AUTH_MAGIC {
            // Not the exchange: an Error response (a store without a secret
            // refusing our opening as a request, or a TLS store).
            let said = read_response_after(&mut *reader, &magic);
            return Err(fail(format!(
                "the store does not run the job-secret check (is RINGWIRE_SECRET set where the store runs?); it said: {said}"
            )));
        }
        let mut challenge = [0u8; NONCE_LEN + PROOF_LEN];
        reader.read_exact(&mut challenge).map_err(io)?;
        let (server_nonce, proof) = challenge.split_at(NONCE_LEN);
        let server_ok = secret.verify(
            Role::Server,
            AUTH_CONTEXT,
            &client_nonce,
            server_nonce,
            proof,
        );
        let answer = if server_ok {
            secret.proof(Role::Client, AUTH_CONTEXT, &client_nonce, server_nonce)
        } else {
            [0u8; PROOF_LEN]
        };
        writer.write_all(&answer).map_err(io)?;
        let verdict = read_response_after(&mut *reader, &[]);
        if !server_ok {
            return Err(fail(
                "the store failed the job-secret check: it does not know this job's secret (RINGWIRE_SECRET differs)".into(),
            ));
        }
        if verdict != "done" {
            return Err(fail(format!("the store refused this client: {verdict}")));
        }
    }
    Ok((reader, writer))
}

/// Reads one response frame whose first bytes are `start`; `"done"` for
/// `Done`, the message of an `Error`, or a description of anything else.
fn read_response_after(reader: &mut dyn Read, start: &[u8]) -> String {
    let mut buf = start.to_vec();
    let mut chunk = [0u8; 1024];
    loop {
        match protocol::decode_response(&buf) {
            Ok(Some((Response::Done, _))) => return "done".into(),
            Ok(Some((Response::Error(msg), _))) => return msg,
            Ok(Some((other, _))) => return format!("an unexpected {} response", other.name()),
            Err(e) => return format!("an unreadable answer ({e})"),
            Ok(None) => {}
        }
        if buf.len() > 128 * 1024 {
            return "an over-long answer".into();
        }
        match crate::net::read_restarting(reader, &mut chunk) {
            Ok(0) => return "nothing (it closed the connection)".into(),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => return security::describe_io(&e, "the store"),
        }
    }
}

/// Writes one request frame and reads one response frame.
fn exchange(
    conn: &mut Conn,
    frame: &[u8],
    reply_timeout: Duration,
) -> Result<Response, ExchangeError> {
    let io = |op| move |e| ExchangeError::Io(e, op);
    conn.stream
        .set_write_timeout(Some(REPLY_TIMEOUT))
        .map_err(io("setting the write timeout"))?;
    // A zero timeout means "none" to the OS; the margin keeps it nonzero.
    conn.stream
        .set_read_timeout(Some(reply_timeout.max(Duration::from_millis(1))))
        .map_err(io("setting the read timeout"))?;
    let stream = &mut *conn.reader;
    conn.writer
        .write_all(frame)
        .map_err(io("sending a request"))?;
    conn.writer.flush().map_err(io("sending a request"))?;
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
