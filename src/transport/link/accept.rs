//! The accepting side of link making: a thread accepts on each listener
//! (TCP, and Unix for local peers), and each newcomer's handshake runs on a
//! short-lived thread of its own, bounded by a watchdog, so a stranger that
//! connects and never speaks cannot hold up real peers. Refusals go to the
//! refusal ledger with their reason.

use super::{
    Established, Halves, LaneConns, Linker, PeerTable, PendingLanes, link_context, plain_halves,
};
use crate::refusals::{self, Reason};
use crate::security::secret::{self, NONCE_LEN, Role};
use crate::security::{self, Opening};
use crate::transport::conn::Conn;
use crate::transport::framing::{control_header, read_control, write_frame};
use crate::transport::link::open_files;
use crate::transport::lock;
use crate::transport::plane::PlaneKind;
use crate::wire::handshake::security_mismatch;
use crate::wire::{self, Channel, FrameKind, Hello, HelloAck};
use std::io::{self, Read};
use std::net::Shutdown;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// At most this many connections may be mid-handshake at once.
const MAX_PENDING_HANDSHAKES: usize = 128;

/// What the accepting side hands an established link to.
pub(crate) trait Accepted: Send + Sync + 'static {
    fn linker(&self) -> &Linker;
    fn peers(&self) -> &PeerTable;
    /// Starts the plane of a link accepted from `peer` and registers it.
    fn accepted(self: &Arc<Self>, peer: usize, link: Established) -> io::Result<()>;
}

/// Why a dialer was refused: the kind (for the refusal ledger) and the
/// words it was told.
type Refused = (Reason, String);

impl Linker {
    /// Files a lane the dialer opened for a link accepted with lanes.
    fn file_lane(&self, peer: usize, channel: Channel, lane: Conn) {
        let mut pending = lock(&self.pending_lanes);
        match pending.get_mut(&peer).and_then(|p| p.slot(channel)) {
            Some(slot) if slot.is_none() => {
                *slot = Some(lane);
                drop(pending);
                self.lanes_arrived.notify_all();
            }
            // Given up on meanwhile: dropping the lane closes it.
            _ => tracing::warn!(rank = self.me, peer, ?channel, "a lane came too late"),
        }
    }

    /// For a link accepted with lanes (`Channel::MainWithLanes`), waits
    /// until the dialer has opened them all, at most the handshake timeout;
    /// for any other, nothing.
    fn await_lanes(
        &self,
        peer: usize,
        channel: Channel,
        closing: &dyn Fn() -> bool,
    ) -> Result<Option<LaneConns>, String> {
        let Channel::MainWithLanes(lanes) = channel else {
            return Ok(None);
        };
        let until = Instant::now() + self.config.handshake_timeout;
        let mut pending = lock(&self.pending_lanes);
        loop {
            let complete = pending.get(&peer).is_some_and(PendingLanes::complete);
            let now = Instant::now();
            if complete || now >= until || closing() {
                break;
            }
            pending = self
                .lanes_arrived
                .wait_timeout(pending, (until - now).min(Duration::from_millis(100)))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        match pending.remove(&peer).and_then(PendingLanes::into_conns) {
            Some(conns) => Ok(Some(conns)),
            None => Err(format!(
                "rank {peer} asked for {lanes} lanes each way but did not open them all \
                 within {:?}",
                self.config.handshake_timeout
            )),
        }
    }

    /// Why a hello from `peer`'s process `incarnation` is refused: another
    /// process holds the rank (decision 0040); `None` if it is the one.
    fn stale(&self, peer: usize, incarnation: u32) -> Option<String> {
        let current = self.slot(peer).incarnation;
        match incarnation.cmp(&current) {
            std::cmp::Ordering::Equal => None,
            std::cmp::Ordering::Less => Some(format!(
                "rank {peer} (incarnation {incarnation}) was replaced by incarnation {current}: \
                 the job went on without this process"
            )),
            std::cmp::Ordering::Greater => Some(format!(
                "rank {peer} (incarnation {incarnation}) is not admitted at rank {} yet \
                 (it knows incarnation {current})",
                self.me
            )),
        }
    }

    /// Runs the accepting side of a handshake (TLS if configured, hello,
    /// secret check); returns the peer's rank and the link's byte streams,
    /// or why the dialer was refused (its kind, and the words it was told).
    /// `Channel::MainWithLanes` comes back only if this side takes the
    /// lanes (it then waits for them, `await_lanes`).
    fn accept_hello(
        &self,
        peers: &PeerTable,
        stream: &mut Conn,
    ) -> io::Result<Result<(usize, Channel, Halves), Refused>> {
        self.configure(stream)?;
        stream.set_read_timeout(Some(self.config.handshake_timeout))?;
        let who = format!("the dialer at {}", stream.describe_peer());
        let sec = &self.config.security;
        let mine = sec.flags();
        let opening = match stream.peek_byte() {
            Ok(Some(first)) => security::opening_of(first),
            _ => Opening::Nothing,
        };
        let (mut reader, mut writer) = match (&sec.tls, opening) {
            (_, Opening::Nothing) => {
                return Ok(Err((
                    Reason::Timeout,
                    "it sent nothing before the handshake timeout".into(),
                )));
            }
            (Some(_), Opening::Plain) => {
                // A plaintext dialer at a TLS job: say so in its own language.
                let reason =
                    "this job requires TLS (RINGWIRE_TLS), but the peer connected in plaintext"
                        .to_string();
                let _ = read_control(stream);
                let ack = HelloAck::reject(reason.clone())
                    .with_security(mine)
                    .encode();
                let _ = write_frame(
                    stream,
                    &control_header(FrameKind::HandshakeAck, ack.len()),
                    &ack,
                );
                return Ok(Err((Reason::TlsRequired, reason)));
            }
            (None, Opening::Tls) => {
                // A TLS dialer at a plaintext job: take its ClientHello (so
                // closing does not reset the answer away), answer in plaintext.
                let reason =
                    "this job has TLS off (RINGWIRE_TLS), but the peer started a TLS handshake"
                        .to_string();
                let _ = stream.read(&mut [0u8; 4096]);
                let ack = HelloAck::reject(reason.clone())
                    .with_security(mine)
                    .encode();
                let _ = write_frame(
                    stream,
                    &control_header(FrameKind::HandshakeAck, ack.len()),
                    &ack,
                );
                let _ = stream.shutdown(Shutdown::Write);
                return Ok(Err((Reason::TlsUnexpected, reason)));
            }
            (Some(tls), Opening::Tls) => match stream.tcp() {
                Some((tcp, from)) => match security::tls_accept(tls, tcp, from.ip(), &who) {
                    Ok(halves) => halves,
                    Err(e) => return Ok(Err((e.reason, e.detail))),
                },
                None => return Ok(Err((Reason::Tls, "TLS runs over TCP links only".into()))),
            },
            (None, Opening::Plain) => plain_halves(stream)?,
        };
        // Lanes help TCP links of the engine only (decision 0018).
        let can_take_lanes = self.plane(stream.kind()).takes_lanes(stream.kind());
        let can_share_memory = self.plane(stream.kind()) == PlaneKind::Shm;
        let mut channel = Channel::Main;
        let mut awaiting = None;
        let exchange = (|| -> io::Result<Result<usize, Refused>> {
            let (header, payload) = read_control(&mut *reader)?;
            let mut client_nonce: &[u8] = &[];
            let verdict = if header.kind != FrameKind::Handshake {
                Err((
                    Reason::Malformed,
                    format!("expected a handshake, got a {} frame", header.kind.name()),
                ))
            } else {
                match Hello::decode(&payload) {
                    Err(e) => Err((Reason::of_hello(&e), e.to_string())),
                    Ok(hello) => match wire::validate_hello(
                        &hello,
                        self.job_id,
                        self.world as u32,
                        self.me as u32,
                    ) {
                        Err(e) => Err((Reason::of_hello(&e), e.to_string())),
                        Ok(()) => {
                            let peer = hello.rank as usize;
                            let unexpected = |why| Err((Reason::UnexpectedRank, why));
                            let checked = if let Some(why) = security_mismatch(hello.security, mine)
                            {
                                let reason = Reason::of_security(hello.security, mine);
                                Err((reason.unwrap_or(Reason::Malformed), why))
                            } else if sec.secret.is_some() && hello.auth.len() != NONCE_LEN {
                                Err((
                                    Reason::Malformed,
                                    format!(
                                        "expected a {NONCE_LEN}-byte nonce in the hello, got {} bytes",
                                        hello.auth.len()
                                    ),
                                ))
                            } else if hello.channel == Channel::Probe {
                                // Any rank may ask whether this one lives.
                                Ok(peer)
                            } else if let Some(why) = self.stale(peer, hello.incarnation) {
                                Err((Reason::UnexpectedRank, why))
                            } else if peer > self.me {
                                unexpected(format!(
                                    "rank {peer} dialed rank {}, but only lower ranks dial",
                                    self.me
                                ))
                            } else if hello.channel.is_lane() {
                                match lock(&self.pending_lanes).get(&peer) {
                                    Some(slots) if slots.is_free(hello.channel) => Ok(peer),
                                    _ => unexpected(format!(
                                        "rank {peer} opened a lane ({:?}) that rank {} is not \
                                         waiting for",
                                        hello.channel, self.me
                                    )),
                                }
                            } else if lock(&self.pending_lanes).contains_key(&peer)
                                || !peers.is_absent(peer)
                            {
                                unexpected(format!(
                                    "rank {peer} is already connected to rank {}",
                                    self.me
                                ))
                            } else {
                                Ok(peer)
                            };
                            if checked.is_ok() {
                                client_nonce = &payload[payload.len() - hello.auth.len()..];
                                channel = match hello.channel {
                                    Channel::MainWithLanes(_) if !can_take_lanes => Channel::Main,
                                    Channel::MainWithShm if !can_share_memory => Channel::Main,
                                    asked => asked,
                                };
                            }
                            checked
                        }
                    },
                }
            };
            let mut ack = match &verdict {
                Ok(_) => HelloAck::accept(),
                Err((_, reason)) => HelloAck::reject(reason.clone()),
            }
            .with_security(mine);
            if let (Ok(_), Channel::MainWithShm) = (&verdict, channel) {
                ack = ack.with_lanes(1);
            }
            if let (Ok(peer), Channel::MainWithLanes(lanes)) = (&verdict, channel) {
                // Waited for from now on, so the lanes the dialer opens on
                // reading this ack find their place. The dialer decides how
                // many (decision 0034).
                lock(&self.pending_lanes).insert(*peer, PendingLanes::new(lanes));
                awaiting = Some(*peer);
                ack = ack.with_lanes(lanes);
            }
            let mut challenge = None;
            if let (Some(secret), Ok(peer)) = (&sec.secret, &verdict) {
                let server_nonce = secret::nonce()?;
                let context = link_context(self.job_id, *peer, self.me);
                let proof = secret.proof(Role::Server, &context, client_nonce, &server_nonce);
                ack = ack.with_auth([server_nonce.as_slice(), proof.as_slice()].concat());
                challenge = Some((context, server_nonce));
            }
            let payload = ack.encode();
            write_frame(
                &mut *writer,
                &control_header(FrameKind::HandshakeAck, payload.len()),
                &payload,
            )?;
            let (Some(secret), Some((context, server_nonce))) = (&sec.secret, challenge) else {
                return Ok(verdict);
            };
            let client_nonce = client_nonce.to_vec();
            let (header, payload) = read_control(&mut *reader)?;
            let proven = header.kind == FrameKind::HandshakeAck
                && HelloAck::decode(&payload).is_ok_and(|a| {
                    secret.verify(
                        Role::Client,
                        &context,
                        &client_nonce,
                        &server_nonce,
                        &a.auth,
                    )
                });
            let verdict = if proven {
                verdict
            } else {
                Err((Reason::WrongSecret, "job-secret check failed: the peer does not know this job's secret (RINGWIRE_SECRET)".to_string()))
            };
            let last = match &verdict {
                Ok(_) => HelloAck::accept(),
                Err((_, reason)) => HelloAck::reject(reason.clone()),
            }
            .with_security(mine)
            .encode();
            write_frame(
                &mut *writer,
                &control_header(FrameKind::HandshakeAck, last.len()),
                &last,
            )?;
            Ok(verdict)
        })();
        if let (Some(peer), false) = (awaiting, matches!(exchange, Ok(Ok(_)))) {
            // Refused after the first ack (the secret check): no lanes come.
            lock(&self.pending_lanes).remove(&peer);
        }
        match exchange {
            Ok(Ok(peer)) => Ok(Ok((peer, channel, (reader, writer)))),
            Ok(Err(reason)) => Ok(Err(reason)),
            Err(e) if security::is_tls_error(&e) => {
                Ok(Err((Reason::of_io(&e), security::describe_io(&e, &who))))
            }
            Err(e) => Err(e),
        }
    }
}

/// Accepts connections (from `accept`: the TCP or the Unix listener) until
/// the transport closes, and runs each one's handshake on its own thread.
pub(crate) fn accept_loop<A: Accepted>(s: &Arc<A>, accept: impl Fn() -> io::Result<Conn>) {
    let linker = s.linker();
    let mut failing = false;
    loop {
        let accepted = accept();
        if s.peers().closing() {
            return;
        }
        let mut stream = match accepted {
            Ok(x) => {
                failing = false;
                x
            }
            Err(e) => {
                // Once per run of failures: out of descriptors, this would
                // otherwise say the same a hundred times a second.
                if !failing {
                    tracing::warn!(
                        rank = linker.me,
                        "accept failed: {}",
                        open_files::describe(&e)
                    );
                }
                failing = true;
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        // Each newcomer gets its own short-lived thread, so a stranger that
        // connects and never speaks cannot hold up real peers. At the cap (a
        // flood), accepting pauses until a handshake ends or times out: real
        // peers wait in the listen backlog instead of being turned away.
        while linker.handshakes.load(Ordering::SeqCst) >= MAX_PENDING_HANDSHAKES {
            if s.peers().closing() {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        linker.handshakes.fetch_add(1, Ordering::SeqCst);
        let s2 = s.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("ringwire-hello-{}", linker.me))
            .spawn(move || {
                let linker = s2.linker();
                let _pending = PendingHandshake(&linker.handshakes);
                let from = stream.refusal_peer();
                let place = linker.place();
                let limit = linker.config.handshake_timeout;
                let deadline = HandshakeDeadline::arm(&stream, limit);
                let hello = linker.accept_hello(s2.peers(), &mut stream);
                let hello = match deadline.map(HandshakeDeadline::disarm) {
                    Some(true) => Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "the handshake took longer than {:?}; the connection was closed",
                            limit
                        ),
                    )),
                    _ => hello,
                };
                match hello {
                    // Answered: dropping the stream closes it.
                    Ok(Ok((_, Channel::Probe, _))) => {}
                    Ok(Ok((peer, channel, _))) if channel.is_lane() => {
                        linker.file_lane(peer, channel, stream);
                    }
                    Ok(Ok((peer, channel, halves))) => match linker
                        .await_lanes(peer, channel, &|| s2.peers().closing())
                        .map_err(|e| (Reason::Timeout, e))
                        .and_then(|lanes| {
                            let link = Established {
                                dialed: false,
                                shm: channel == Channel::MainWithShm,
                                conn: stream,
                                halves,
                                lanes,
                            };
                            s2.accepted(peer, link)
                                .map_err(|e| (Reason::of_io(&e), e.to_string()))
                        }) {
                        Ok(()) => {}
                        // The lanes did not come in time, or a local error.
                        Err((reason, e)) => {
                            let detail = format!("could not start the link with rank {peer}: {e}");
                            refusals::record(from, place, reason, &detail);
                        }
                    },
                    Ok(Err((reason, detail))) => refusals::record(from, place, reason, &detail),
                    Err(e) => {
                        let detail = format!("handshake failed: {e}");
                        refusals::record(from, place, Reason::of_io(&e), &detail);
                    }
                }
            });
        if let Err(e) = spawned {
            linker.handshakes.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!(rank = linker.me, error = %e, "could not spawn handshake thread");
        }
    }
}

/// Closes a newcomer's connection if its handshake is still running when
/// the handshake timeout has passed. The socket's read timeout bounds each
/// read, not the handshake, so without this a stranger sending a byte now
/// and then could hold a handshake slot (of `MAX_PENDING_HANDSHAKES`) for
/// hours.
struct HandshakeDeadline {
    /// Set when the handshake ended; then whether the deadline struck.
    state: Arc<(Mutex<(bool, bool)>, Condvar)>,
}

impl HandshakeDeadline {
    /// Starts the clock on `stream` (a watchdog thread with a clone of the
    /// socket); `None` if neither could be made (the read timeouts still
    /// bound each read).
    fn arm(stream: &Conn, limit: Duration) -> Option<HandshakeDeadline> {
        let socket = stream.try_clone().ok()?;
        let state = Arc::new((Mutex::new((false, false)), Condvar::new()));
        let watched = state.clone();
        let deadline = Instant::now() + limit;
        std::thread::Builder::new()
            .name("ringwire-hello-deadline".into())
            .spawn(move || {
                let mut st = lock(&watched.0);
                while !st.0 {
                    let now = Instant::now();
                    if now >= deadline {
                        st.1 = true;
                        let _ = socket.shutdown(Shutdown::Both);
                        return;
                    }
                    st = watched
                        .1
                        .wait_timeout(st, deadline - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            })
            .ok()?;
        Some(HandshakeDeadline { state })
    }

    /// Stops the clock; true if the deadline had struck (the connection is
    /// shut down, whatever the handshake returned).
    fn disarm(self) -> bool {
        let mut st = lock(&self.state.0);
        st.0 = true;
        self.state.1.notify_all();
        st.1
    }
}

/// Counts a handshake in progress until dropped.
struct PendingHandshake<'a>(&'a AtomicUsize);

impl Drop for PendingHandshake<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
