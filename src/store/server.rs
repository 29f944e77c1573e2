//! The rendezvous store server: a TCP listener, one thread per client, and a
//! shared table guarded by a mutex, with a condvar for requests that wait.
//!
//! One thread per client is plenty for the dozens to hundreds of ranks that
//! rendezvous through one store, and keeps blocking `Get`/`Wait` requests
//! simple. No thread can be pinned forever: every socket read has a short
//! timeout after which the thread checks whether the server is stopping,
//! waits on the condvar are woken by [`StoreServer::shutdown`], and shutdown
//! also shuts down every client socket so blocked writes end too.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use socket2::{Domain, SockRef, Socket, Type};
use tracing::{debug, warn};

use super::error::StoreError;
use super::protocol::{self, Request, Response};
use super::table::Table;
use crate::Error;
use crate::refusals::{self, Peer, Place, Reason};
use crate::security::secret::{self, NONCE_LEN, PROOF_LEN, Role};
use crate::security::{self, Opening, ReadHalf, Security, WriteHalf};

/// How often a blocked accept or read wakes up to check for shutdown.
const POLL: Duration = Duration::from_millis(100);
/// How long a response write may block before the client is given up on.
const WRITE_TIMEOUT: Duration = Duration::from_secs(60);
/// How often a waiting request checks whether its client is still there.
const LIVENESS_CHECK: Duration = Duration::from_secs(1);
/// Socket read size.
const CHUNK: usize = 64 * 1024;
/// Listen backlog: every rank connects at once at startup.
const BACKLOG: i32 = 1024;
/// How long a new client may take over TLS and the secret check.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// First bytes of every message of the store's job-secret exchange: a client
/// `MAGIC + nonce`, the server `MAGIC + nonce + proof`, the client `proof`,
/// then the server's verdict as a `Done` or `Error` response. As a request
/// frame, `MAGIC` declares a body far over the cap, so a store without a
/// secret refuses it at once.
pub(crate) const AUTH_MAGIC: [u8; 8] = *b"RWSAUTH1";
/// The context store proofs are bound to.
pub(crate) const AUTH_CONTEXT: &[u8] = b"store";

/// A running rendezvous store. Dropping it (or calling
/// [`shutdown`](StoreServer::shutdown)) stops it.
pub struct StoreServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Mutex<Option<JoinHandle<()>>>,
}

/// State shared by the accept thread and the client threads.
struct Shared {
    table: Mutex<Table>,
    /// Signalled when a key is added or changed, and on shutdown.
    changed: Condvar,
    /// Set (under the `table` lock, so no waiter misses it) on shutdown.
    stopping: AtomicBool,
    /// Clones of live client sockets, to shut them down on shutdown.
    conns: Mutex<HashMap<u64, TcpStream>>,
    next_conn: AtomicU64,
    /// Job secret and TLS every client must match.
    security: Security,
}

impl Shared {
    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn conns(&self) -> MutexGuard<'_, HashMap<u64, TcpStream>> {
        self.conns.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }
}

impl StoreServer {
    /// Listens on exactly `addr` (port 0 picks a free port) and starts serving.
    ///
    /// A store of its own lets every rank be a client (`RINGWIRE_HOST_STORE=0`,
    /// or [`Builder::host_store`](crate::Builder::host_store)):
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = ringwire::store::StoreServer::bind("127.0.0.1:0".parse()?)?;
    /// let comm = ringwire::Communicator::builder()
    ///     .rank(0)
    ///     .world_size(1)
    ///     .store_addr(store.local_addr())
    ///     .host_store(false)
    ///     .build()
    ///     .wait()?;
    /// # let _ = comm;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// Only the given address is bound: an unspecified address (`0.0.0.0` or
    /// `::`) is bound only if given, and an IPv6 address is bound with
    /// `IPV6_V6ONLY`, so `[::]` does not also take IPv4.
    ///
    /// Clients are not authenticated; see [`StoreServer::bind_with`].
    pub fn bind(addr: SocketAddr) -> Result<StoreServer, StoreError> {
        StoreServer::bind_with(addr, Security::none())
    }

    /// As [`StoreServer::bind`], and every client must pass `security`'s
    /// TLS and job-secret checks before its first request is read. Clients
    /// that fail are refused (with an `Error` response they can read, where
    /// possible) and logged with their address.
    pub fn bind_with(addr: SocketAddr, security: Security) -> Result<StoreServer, StoreError> {
        security.warn_if_unauthenticated();
        let bind_err = |source| StoreError::Bind { addr, source };
        let listener = listen(addr).map_err(bind_err)?;
        let local = listener.local_addr().map_err(bind_err)?;
        // Wake accept() periodically to notice shutdown (Linux applies
        // SO_RCVTIMEO to accept; elsewhere shutdown's wake-up connection does).
        SockRef::from(&listener)
            .set_read_timeout(Some(POLL))
            .map_err(bind_err)?;
        let shared = Arc::new(Shared {
            table: Mutex::new(Table::default()),
            changed: Condvar::new(),
            stopping: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(0),
            security,
        });
        let accept_shared = Arc::clone(&shared);
        let accept = thread::Builder::new()
            .name("ringwire-store-accept".into())
            .spawn(move || accept_loop(&listener, &accept_shared))
            .map_err(|source| StoreError::Io {
                addr: local,
                op: "starting the accept thread",
                source,
            })?;
        debug!(addr = %local, "rendezvous store listening");
        Ok(StoreServer {
            addr: local,
            shared,
            accept: Mutex::new(Some(accept)),
        })
    }

    /// Resolves `host` (a name, or an IPv4 or IPv6 address, brackets and
    /// `%zone` allowed) and listens on the first of its addresses that
    /// binds, as [`StoreServer::bind_with`]. What the `ringwire-store`
    /// binary runs.
    pub fn bind_host(host: &str, port: u16, security: Security) -> Result<StoreServer, Error> {
        let mut last = None;
        for addr in crate::net::resolve(host, port)? {
            match StoreServer::bind_with(addr, security.clone()) {
                Ok(server) => return Ok(server),
                Err(e) => last = Some(e),
            }
        }
        // resolve returns at least one address, so some bind failed.
        Err(last.map_or_else(
            || Error::Rendezvous(format!("{host} has no address")),
            Error::from,
        ))
    }

    /// The address the server listens on (with the real port if bound to 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, closes every client connection (clients see
    /// [`StoreError::ServerGone`]) and joins the server's threads. Calling it
    /// again does nothing.
    pub fn shutdown(&self) {
        let handle = self
            .accept
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Some(handle) = handle else {
            return;
        };
        {
            let _table = self.shared.table();
            self.shared.stopping.store(true, Ordering::Release);
            self.shared.changed.notify_all();
        }
        // Wake a blocked accept() where SO_RCVTIMEO does not apply to it.
        let _ = TcpStream::connect_timeout(&connectable(self.addr), POLL);
        // The accept thread shuts down and joins every client thread on exit.
        if handle.join().is_err() {
            warn!(addr = %self.addr, "rendezvous store accept thread panicked");
        }
        debug!(addr = %self.addr, "rendezvous store stopped");
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl fmt::Debug for StoreServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreServer")
            .field("addr", &self.addr)
            .field("stopping", &self.shared.stopping())
            .finish_non_exhaustive()
    }
}

fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    // Lets a restarted store rebind a port whose old connections are in
    // TIME_WAIT; it does not let two live listeners share the port.
    #[cfg(unix)]
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    Ok(socket.into())
}

/// An address to connect to in order to reach a listener on `addr`.
fn connectable(addr: SocketAddr) -> SocketAddr {
    let mut addr = addr;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    addr
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    let mut workers: Vec<JoinHandle<()>> = Vec::new();
    while !shared.stopping() {
        workers.retain(|w| !w.is_finished());
        let (stream, peer) = match listener.accept() {
            Ok(conn) => conn,
            Err(e) if is_timeout(&e) || e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // E.g. out of file descriptors: back off instead of spinning.
                warn!(error = %e, "rendezvous store: accept failed");
                thread::sleep(POLL);
                continue;
            }
        };
        if shared.stopping() {
            break;
        }
        if let Some(worker) = start_client(stream, peer, shared) {
            workers.push(worker);
        }
    }
    for (_, stream) in shared.conns().drain() {
        let _ = stream.shutdown(Shutdown::Both);
    }
    for worker in workers {
        let _ = worker.join();
    }
}

/// Registers the client's socket and starts its thread.
fn start_client(
    stream: TcpStream,
    peer: SocketAddr,
    shared: &Arc<Shared>,
) -> Option<JoinHandle<()>> {
    let setup = stream
        .set_read_timeout(Some(POLL))
        .and_then(|()| stream.set_write_timeout(Some(WRITE_TIMEOUT)))
        .and_then(|()| stream.set_nodelay(true))
        .and_then(|()| stream.try_clone());
    let registered = match setup {
        Ok(clone) => clone,
        Err(e) => {
            warn!(%peer, error = %e, "rendezvous store: could not set up connection");
            return None;
        }
    };
    let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
    shared.conns().insert(id, registered);
    let worker_shared = Arc::clone(shared);
    let spawned = thread::Builder::new()
        .name(format!("ringwire-store-{peer}"))
        .spawn(move || {
            debug!(%peer, "rendezvous store: client connected");
            serve_client(stream, peer, &worker_shared);
            worker_shared.conns().remove(&id);
            debug!(%peer, "rendezvous store: client disconnected");
        });
    match spawned {
        Ok(handle) => Some(handle),
        Err(e) => {
            warn!(%peer, error = %e, "rendezvous store: could not start a client thread");
            if let Some(s) = shared.conns().remove(&id) {
                let _ = s.shutdown(Shutdown::Both);
            }
            None
        }
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Runs TLS and the job-secret check (whichever are configured) on a new
/// client; `Err` says why it was refused, and whether the client was sent
/// an error (then the connection is closed with `close_after_error`).
fn secure_accept(
    stream: &mut TcpStream,
    peer: SocketAddr,
    sec: &Security,
) -> Result<(ReadHalf, WriteHalf), (Reason, String, bool)> {
    let io = |e: io::Error| (Reason::of_io(&e), e.to_string(), false);
    stream
        .set_read_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(io)?;
    let mut out = Vec::new();
    let (mut reader, mut writer) = match (&sec.tls, security::peek_opening(stream)) {
        (_, Opening::Nothing) => return Err((Reason::Timeout, "it sent nothing".into(), false)),
        (Some(_), Opening::Plain) => {
            let reason =
                "this store requires TLS (RINGWIRE_TLS), but the client connected in plaintext";
            let _ = send(stream, &mut out, &Response::Error(reason.into()));
            return Err((Reason::TlsRequired, reason.into(), true));
        }
        (None, Opening::Tls) => {
            let reason =
                "this store has TLS off (RINGWIRE_TLS), but the client started a TLS handshake";
            let _ = stream.read(&mut [0u8; 4096]);
            let _ = send(stream, &mut out, &Response::Error(reason.into()));
            return Err((Reason::TlsUnexpected, reason.into(), true));
        }
        (Some(tls), Opening::Tls) => {
            let who = format!("the store client at {peer}");
            security::tls_accept(tls, stream, peer.ip(), &who)
                .map_err(|e| (e.reason, e.detail, false))?
        }
        (None, Opening::Plain) => security::plain_halves(stream).map_err(io)?,
    };
    if let Some(secret) = &sec.secret {
        // Compare the opening byte by byte, so that a client without the
        // secret (whose first request may be shorter than the magic) is
        // answered at once instead of waited for.
        let mut first = [0u8; AUTH_MAGIC.len() + NONCE_LEN];
        let mut got = 0;
        while got < first.len() {
            let n = reader.read(&mut first[got..]).map_err(io)?;
            if n == 0 {
                return Err((
                    Reason::HungUp,
                    "it closed the connection during the job-secret check".into(),
                    false,
                ));
            }
            got += n;
            let magic = got.min(AUTH_MAGIC.len());
            if first[..magic] != AUTH_MAGIC[..magic] {
                let reason = "this store requires the job secret (RINGWIRE_SECRET), but the client did not authenticate";
                let _ = send(&mut *writer, &mut out, &Response::Error(reason.into()));
                return Err((Reason::MissingSecret, reason.into(), true));
            }
        }
        let client_nonce = &first[AUTH_MAGIC.len()..];
        let server_nonce = secret::nonce().map_err(io)?;
        let proof = secret.proof(Role::Server, AUTH_CONTEXT, client_nonce, &server_nonce);
        writer
            .write_all(&[&AUTH_MAGIC[..], &server_nonce, &proof].concat())
            .map_err(io)?;
        let mut answer = [0u8; PROOF_LEN];
        reader.read_exact(&mut answer).map_err(io)?;
        if !secret.verify(
            Role::Client,
            AUTH_CONTEXT,
            client_nonce,
            &server_nonce,
            &answer,
        ) {
            let reason = "job-secret check failed: the client does not know this store's secret (RINGWIRE_SECRET)";
            let _ = send(&mut *writer, &mut out, &Response::Error(reason.into()));
            return Err((Reason::WrongSecret, reason.into(), true));
        }
        send(&mut *writer, &mut out, &Response::Done).map_err(io)?;
    }
    stream.set_read_timeout(Some(POLL)).map_err(io)?;
    Ok((reader, writer))
}

/// Reads requests and answers them until the client leaves, misbehaves, or
/// the server stops.
fn serve_client(mut stream: TcpStream, peer: SocketAddr, shared: &Shared) {
    let (mut reader, mut writer) = match secure_accept(&mut stream, peer, &shared.security) {
        Ok(halves) => halves,
        Err((reason, detail, answered)) => {
            // Recorded (and logged) before the wait for the client to
            // read its answer and close.
            refusals::record(Peer::Tcp(peer), Place::Store, reason, &detail);
            if answered {
                close_after_error(&mut stream, shared);
            }
            return;
        }
    };
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; CHUNK];
    let mut out = Vec::new();
    loop {
        // Answer every complete request already buffered.
        loop {
            let (req, used) = match protocol::decode_request(&buf) {
                Ok(Some(decoded)) => decoded,
                Ok(None) => break,
                Err(e) => {
                    // A client with a job secret at a store without one
                    // opens with the exchange's magic.
                    let reason = if buf.starts_with(&AUTH_MAGIC) {
                        Reason::UnexpectedSecret
                    } else {
                        Reason::Malformed
                    };
                    let detail = format!("bad request: {e}; closing the connection");
                    refusals::record(Peer::Tcp(peer), Place::Store, reason, &detail);
                    let _ = send(&mut *writer, &mut out, &Response::Error(e.to_string()));
                    close_after_error(&mut stream, shared);
                    return;
                }
            };
            buf.drain(..used);
            let Some(resp) = handle(shared, req, || peer_left(&stream)) else {
                return; // stopping, or the client left while waiting
            };
            if let Err(e) = send(&mut *writer, &mut out, &resp) {
                debug!(%peer, error = %e, "rendezvous store: could not answer; closing connection");
                return;
            }
        }
        // Then read more. Growing `buf` only by what arrives means a hostile
        // declared length costs nothing until the bytes are actually sent.
        match reader.read(&mut chunk) {
            Ok(0) => {
                if !buf.is_empty() {
                    debug!(%peer, pending = buf.len(), "rendezvous store: client left mid-request");
                }
                return;
            }
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if is_timeout(&e) || e.kind() == io::ErrorKind::Interrupted => {
                if shared.stopping() {
                    return;
                }
            }
            Err(e) => {
                debug!(%peer, error = %e, "rendezvous store: read failed; closing connection");
                return;
            }
        }
    }
}

/// Closes a connection whose client misbehaved without losing the error just
/// sent: closing a socket with unread input makes the kernel send a reset,
/// which can discard the error before the client reads it. So: half-close,
/// then discard input until the client closes too (bounded in time and
/// bytes).
fn close_after_error(stream: &mut TcpStream, shared: &Shared) {
    const LINGER: Duration = Duration::from_secs(1);
    const MAX_DISCARD: usize = 1024 * 1024;
    // Reads wake up often enough to keep to LINGER (a refused client's
    // socket still has the handshake's long timeout).
    if stream.shutdown(Shutdown::Write).is_err() || stream.set_read_timeout(Some(POLL)).is_err() {
        return;
    }
    let start = Instant::now();
    let mut discarded = 0;
    let mut sink = [0u8; 4096];
    while start.elapsed() < LINGER && discarded < MAX_DISCARD && !shared.stopping() {
        match stream.read(&mut sink) {
            Ok(0) => return,
            Ok(n) => discarded += n,
            Err(e) if is_timeout(&e) || e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

fn send(stream: &mut dyn Write, out: &mut Vec<u8>, resp: &Response) -> io::Result<()> {
    out.clear();
    if let Err(e) = resp.encode(out) {
        // Only a value over the cap can fail, and the table never holds one.
        out.clear();
        Response::Error(e.to_string())
            .encode(out)
            .map_err(io::Error::other)?;
    }
    stream.write_all(out)?;
    stream.flush()?;
    // Do not keep a 64 MiB buffer around per idle client.
    if out.capacity() > CHUNK {
        *out = Vec::new();
    }
    Ok(())
}

/// Whether the client has closed its end (checked without blocking). Used
/// while a request waits, so a client that vanished does not keep its thread
/// waiting out a long timeout.
fn peer_left(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return true;
    }
    let left = match stream.peek(&mut [0u8; 1]) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !(is_timeout(&e) || e.kind() == io::ErrorKind::Interrupted),
    };
    stream.set_nonblocking(false).is_err() || left
}

/// Runs one request, waiting first if it is a `Get` or `Wait`. `None` means
/// the server is stopping or `peer_left` reported the client gone while the
/// request waited; the connection should just be closed.
fn handle(shared: &Shared, req: Request, peer_left: impl Fn() -> bool) -> Option<Response> {
    let mut table = shared.table();
    if let Some((keys, timeout_ms)) = req.awaited_keys() {
        // A deadline too far to represent is no deadline.
        let deadline = Instant::now().checked_add(Duration::from_millis(timeout_ms));
        let mut last_check = Instant::now();
        while !table.has_all(keys) {
            if shared.stopping() {
                return None;
            }
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => Duration::MAX,
            };
            if left.is_zero() {
                return Some(Response::Timeout {
                    missing: table.missing(keys),
                });
            }
            if last_check.elapsed() >= LIVENESS_CHECK {
                if peer_left() {
                    return None;
                }
                last_check = Instant::now();
            }
            let wait = left.min(LIVENESS_CHECK);
            table = shared
                .changed
                .wait_timeout(table, wait)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
    if shared.stopping() {
        return None;
    }
    let (resp, changed) = table.execute(req);
    if changed {
        shared.changed.notify_all();
    }
    Some(resp)
}
