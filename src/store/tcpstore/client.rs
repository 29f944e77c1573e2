//! A client of PyTorch's `TCPStore`: what a rank launched by torchrun uses
//! to meet the others at the store torchrun's agent already hosts on
//! MASTER_ADDR:MASTER_PORT (`TORCHELASTIC_USE_AGENT_STORE=True`).
//!
//! One connection, one request at a time, like torch's own client. Every
//! key gets torch's client prefix `/`, so a Python `TCPStore` client sees
//! the same keys. A timed wait is torch's: `WAIT`, the reply awaited for the
//! timeout, then `CANCEL_WAIT` (whose reply may follow a late
//! `STOP_WAITING`). Any other read or write that fails or takes longer than
//! the reply timeout leaves the connection in an unknown state, so later
//! requests fail with [`StoreError::Broken`] instead of reading someone
//! else's reply. The TCPStore has no authentication: with a job secret the
//! links stay authenticated, the store does not.

use std::io::{self, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::protocol::{self, Reply, Request, TcpStoreError};
use crate::store::client::{REPLY_TIMEOUT, dial, io_failure};
use crate::store::error::StoreError;

/// A connection to a PyTorch `TCPStore`.
#[derive(Debug)]
pub struct TcpStoreClient {
    addr: SocketAddr,
    conn: Mutex<Conn>,
    pub(in crate::store) reply_timeout: Duration,
}

#[derive(Debug)]
struct Conn {
    stream: TcpStream,
    /// Reply bytes read but not yet decoded.
    inbox: Vec<u8>,
    /// Why the connection was abandoned, if it was.
    broken: Option<String>,
}

/// How a request's reply came out.
enum Outcome {
    Reply(Reply),
    /// The request has no reply, and went out.
    Sent,
    /// The deadline passed with no whole reply (only asked of `WAIT`).
    Late,
}

// The whole client; rendezvous uses part of it.
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
impl TcpStoreClient {
    /// Connects to the first of `addrs` that accepts, retrying until
    /// `timeout` (the agent may start its store after its workers), and
    /// checks that a TCPStore answers there.
    pub fn connect(addrs: &[SocketAddr], timeout: Duration) -> Result<TcpStoreClient, StoreError> {
        let (stream, addr) = dial(addrs, timeout)?;
        let mut client = TcpStoreClient {
            addr,
            conn: Mutex::new(Conn {
                stream,
                inbox: Vec::new(),
                broken: None,
            }),
            reply_timeout: REPLY_TIMEOUT.min(timeout.max(Duration::from_secs(1))),
        };
        client.send_only(&Request::Validate)?;
        // A CHECK of no keys is answered "ready" by every version: proof that
        // a TCPStore (not some other server) listens there.
        match client.call(&Request::Check { keys: &[] }) {
            Ok(Reply::Ready(true)) => {}
            Ok(other) => return Err(client.unexpected("CHECK", &other)),
            Err(e) => {
                return Err(StoreError::NotTcpStore {
                    addr,
                    detail: e.to_string(),
                });
            }
        }
        client.reply_timeout = REPLY_TIMEOUT;
        tracing::debug!(%addr, "connected to a PyTorch TCPStore");
        Ok(client)
    }

    /// The address of the store.
    pub fn server_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Uses `timeout` for requests that do not wait on the server.
    pub fn with_reply_timeout(mut self, timeout: Duration) -> TcpStoreClient {
        self.reply_timeout = timeout;
        self
    }

    /// Stores `value` under `key`.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.send_only(&Request::Set {
            key: &prefixed(key),
            value,
        })
    }

    /// Waits up to `timeout` for `key` and returns its value.
    pub fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreError> {
        self.wait(&[key], timeout)?;
        self.get_present(&prefixed(key))
    }

    /// The value of `key`, or `None` if it does not exist (does not wait).
    pub fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let key = prefixed(key);
        match self.call(&Request::Check { keys: &[&key] })? {
            Reply::Ready(true) => self.get_present(&key).map(Some),
            Reply::Ready(false) => Ok(None),
            other => Err(self.unexpected("CHECK", &other)),
        }
    }

    /// Adds `delta` to the number at `key` (missing counts as 0); returns
    /// the sum.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        match self.call(&Request::Add {
            key: &prefixed(key),
            delta,
        })? {
            Reply::Int(n) => Ok(n),
            other => Err(self.unexpected("ADD", &other)),
        }
    }

    /// Sets `key` to `desired` if it holds `expected`, or if it is missing
    /// and `expected` is empty; returns the value afterwards (torch's
    /// quirk: `expected` itself when the key is missing and `expected` is
    /// not empty).
    pub fn compare_set(
        &self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
    ) -> Result<Vec<u8>, StoreError> {
        match self.call(&Request::CompareSet {
            key: &prefixed(key),
            expected,
            desired,
        })? {
            Reply::Bytes(v) => Ok(v),
            other => Err(self.unexpected("COMPARE_SET", &other)),
        }
    }

    /// Removes `key`; whether it existed.
    pub fn delete(&self, key: &str) -> Result<bool, StoreError> {
        match self.call(&Request::DeleteKey {
            key: &prefixed(key),
        })? {
            Reply::Int(n) => Ok(n > 0),
            other => Err(self.unexpected("DELETE_KEY", &other)),
        }
    }

    /// Waits up to `timeout` until every key exists. On a timeout the error
    /// names the keys still missing.
    pub fn wait(&self, keys: &[&str], timeout: Duration) -> Result<(), StoreError> {
        let full: Vec<String> = keys.iter().map(|k| prefixed(k)).collect();
        let refs: Vec<&str> = full.iter().map(String::as_str).collect();
        if self.wait_for(&refs, timeout)? {
            return Ok(());
        }
        let mut missing = Vec::new();
        for (key, name) in refs.iter().zip(keys) {
            if let Reply::Ready(false) = self.call(&Request::Check { keys: &[key] })? {
                missing.push((*name).to_owned());
            }
        }
        // The keys may have come just after the wait was cancelled.
        if missing.is_empty() {
            return Ok(());
        }
        Err(StoreError::Timeout {
            keys: missing,
            waited: timeout,
        })
    }

    /// The values of `keys`, waiting up to `timeout` for all of them.
    pub fn multi_get(&self, keys: &[&str], timeout: Duration) -> Result<Vec<Vec<u8>>, StoreError> {
        self.wait(keys, timeout)?;
        let full: Vec<String> = keys.iter().map(|k| prefixed(k)).collect();
        let refs: Vec<&str> = full.iter().map(String::as_str).collect();
        match self.call(&Request::MultiGet { keys: &refs })? {
            Reply::Values(v) if v.len() == keys.len() => Ok(v),
            other => Err(self.unexpected("MULTI_GET", &other)),
        }
    }

    /// `GET` of a key known to exist (torch's servers fail a `GET` of a
    /// missing key).
    fn get_present(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        match self.call(&Request::Get { key })? {
            Reply::Bytes(v) => Ok(v),
            other => Err(self.unexpected("GET", &other)),
        }
    }

    /// torch's timed wait: true once every key exists, false when `timeout`
    /// passed first (the server's wait then cancelled).
    fn wait_for(&self, keys: &[&str], timeout: Duration) -> Result<bool, StoreError> {
        let mut conn = self.lock()?;
        let deadline = far_deadline(timeout);
        match self.exchange(&mut conn, &Request::Wait { keys }, Some(deadline))? {
            Outcome::Reply(reply) => return self.stop_waiting(&mut conn, reply, "WAIT"),
            Outcome::Sent => return Err(self.unexpected_silence("WAIT")),
            Outcome::Late => {}
        }
        // Late: cancel. A STOP_WAITING may already be on its way; then the
        // cancel's own reply follows it, and the keys are there after all.
        let reply = self.expect_reply(&mut conn, &Request::CancelWait)?;
        match reply {
            Reply::StopWaiting(false) => Ok(false),
            Reply::StopWaiting(true) => {
                let then =
                    self.read_reply(&mut conn, protocol::ReplyShape::Wait, None, "CANCEL_WAIT")?;
                self.stop_waiting(&mut conn, then, "CANCEL_WAIT")
                    .map(|_| true)
            }
            other => Err(self.fail(&mut conn, self.unexpected("CANCEL_WAIT", &other))),
        }
    }

    /// Checks a wait reply; anything but `STOP_WAITING`/`WAIT_CANCELED` fails
    /// the connection.
    fn stop_waiting(
        &self,
        conn: &mut Conn,
        reply: Reply,
        request: &'static str,
    ) -> Result<bool, StoreError> {
        match reply {
            Reply::StopWaiting(stop) => Ok(stop),
            other => Err(self.fail(conn, self.unexpected(request, &other))),
        }
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Conn>, StoreError> {
        let conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        match &conn.broken {
            Some(cause) => Err(StoreError::Broken {
                addr: self.addr,
                cause: cause.clone(),
            }),
            None => Ok(conn),
        }
    }

    /// Sends a request that has no reply.
    fn send_only(&self, req: &Request<'_>) -> Result<(), StoreError> {
        let mut conn = self.lock()?;
        match self.exchange(&mut conn, req, None)? {
            Outcome::Reply(reply) => Err(self.unexpected(req.name(), &reply)),
            // Without a deadline nothing comes back late.
            Outcome::Sent | Outcome::Late => Ok(()),
        }
    }

    /// Sends a request and returns its reply.
    fn call(&self, req: &Request<'_>) -> Result<Reply, StoreError> {
        let mut conn = self.lock()?;
        self.expect_reply(&mut conn, req)
    }

    fn expect_reply(&self, conn: &mut Conn, req: &Request<'_>) -> Result<Reply, StoreError> {
        match self.exchange(conn, req, None)? {
            Outcome::Reply(reply) => Ok(reply),
            Outcome::Sent => Err(self.unexpected_silence(req.name())),
            Outcome::Late => Err(self.fail(
                conn,
                StoreError::NoReply {
                    addr: self.addr,
                    waited: self.reply_timeout,
                },
            )),
        }
    }

    /// Writes `req`, then reads its reply (if it has one) until `deadline`,
    /// else the reply timeout. Only a request given a deadline may come back
    /// `Late`; any other failure breaks the connection.
    fn exchange(
        &self,
        conn: &mut Conn,
        req: &Request<'_>,
        deadline: Option<Instant>,
    ) -> Result<Outcome, StoreError> {
        let mut bytes = Vec::new();
        // Over-long keys or values are refused before anything is sent.
        protocol::encode_request(req, &mut bytes).map_err(|e| self.protocol(e))?;
        let written = conn
            .stream
            .set_write_timeout(Some(self.reply_timeout.max(Duration::from_millis(1))))
            .and_then(|()| conn.stream.write_all(&bytes));
        if let Err(e) = written {
            let e = io_failure(self.addr, e, "sending a request", self.reply_timeout);
            return Err(self.fail(conn, e));
        }
        let Some(shape) = req.reply_shape() else {
            return Ok(Outcome::Sent);
        };
        match deadline {
            None => self
                .read_reply(conn, shape, None, req.name())
                .map(Outcome::Reply),
            Some(_) => self.read_until(conn, shape, deadline, req.name()),
        }
    }

    /// Reads one reply of `shape` within the reply timeout.
    fn read_reply(
        &self,
        conn: &mut Conn,
        shape: protocol::ReplyShape,
        deadline: Option<Instant>,
        request: &'static str,
    ) -> Result<Reply, StoreError> {
        match self.read_until(conn, shape, deadline, request)? {
            Outcome::Reply(reply) => Ok(reply),
            Outcome::Sent => Err(self.unexpected_silence(request)),
            Outcome::Late => Err(self.fail(
                conn,
                StoreError::NoReply {
                    addr: self.addr,
                    waited: self.reply_timeout,
                },
            )),
        }
    }

    /// Reads until a whole reply of `shape` is in, or `deadline` (else the
    /// reply timeout from now) passes with none: `Late`, the bytes read so
    /// far kept. Bad bytes, a closed or failed socket break the connection.
    fn read_until(
        &self,
        conn: &mut Conn,
        shape: protocol::ReplyShape,
        deadline: Option<Instant>,
        request: &'static str,
    ) -> Result<Outcome, StoreError> {
        let deadline = deadline.unwrap_or_else(|| far_deadline(self.reply_timeout));
        let mut chunk = [0u8; 16 * 1024];
        loop {
            match protocol::decode_reply(shape, &conn.inbox) {
                Ok(Some((reply, used))) => {
                    conn.inbox.drain(..used);
                    return Ok(Outcome::Reply(reply));
                }
                Ok(None) => {}
                Err(e) => {
                    let e = self.protocol(e);
                    return Err(self.fail(conn, e));
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(Outcome::Late);
            }
            // A zero timeout means "none" to the OS; keep it at least 1 ms.
            let read = conn
                .stream
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .and_then(|()| crate::net::read_restarting(&mut conn.stream, &mut chunk));
            match read {
                Ok(0) => {
                    let e = io_failure(
                        self.addr,
                        io::ErrorKind::UnexpectedEof.into(),
                        request,
                        left,
                    );
                    return Err(self.fail(conn, e));
                }
                Ok(n) => conn.inbox.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => {
                    let e = io_failure(self.addr, e, "reading a reply", left);
                    return Err(self.fail(conn, e));
                }
            }
        }
    }

    /// Marks the connection broken by `e` (and shuts it), returning `e`.
    fn fail(&self, conn: &mut Conn, e: StoreError) -> StoreError {
        conn.broken = Some(e.to_string());
        let _ = conn.stream.shutdown(Shutdown::Both);
        e
    }

    fn protocol(&self, e: TcpStoreError) -> StoreError {
        StoreError::TcpStore {
            addr: self.addr,
            source: e,
        }
    }

    /// Only requests without a reply come back `Sent`; a caller that
    /// expected one has mixed up its requests.
    fn unexpected_silence(&self, request: &'static str) -> StoreError {
        self.protocol(TcpStoreError::Unexpected {
            request,
            reply: "no reply".into(),
        })
    }

    fn unexpected(&self, request: &'static str, reply: &Reply) -> StoreError {
        self.protocol(TcpStoreError::Unexpected {
            request,
            reply: format!("{reply:?}").chars().take(80).collect(),
        })
    }
}

/// Now plus `timeout`, or a day from now where that overflows (a timeout
/// of "forever" from a setting).
fn far_deadline(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .unwrap_or_else(|| now + Duration::from_secs(86_400))
}

/// torch's client puts `/` before every key (`TCPStore::keyPrefix_`).
fn prefixed(key: &str) -> String {
    format!("/{key}")
}
