//! Links: the peer table, and how links are made.
//!
//! Links are made on demand, always by the lower rank dialing the higher:
//! every schedule is symmetric (when rank a needs b in an op, b needs a in
//! the same op), so the higher rank simply waits for the dial. One link
//! carries every communicator of the process (frames name theirs). A link
//! to a peer on this host and network namespace is a Unix-domain socket,
//! else TCP (decision 0009). Dialing (`dial`) and accepting (`accept`) run
//! the handshake (TLS if configured, hello, job-secret proofs, lanes) and
//! hand back an [`Established`] link; they never start its plane, which the
//! transport picks and starts (`Planes::make`) before it registers the link
//! here.

mod accept;
mod dial;
pub(crate) mod open_files;

pub(crate) use accept::{Accepted, accept_loop};

use super::conn::{Conn, ConnKind};
use super::framing::read_control;
use super::plane::{LinkPlane, PlaneKind};
use super::{LinkError, lock};
use crate::error::link::{LinkFailure, Loss};
use crate::refusals::Place;
use crate::security::Security;
use crate::wire::{self, Channel, FrameKind, HEADER_LEN, Header, HelloAck};
use std::collections::HashMap;
use std::io::{self, Read};
use std::net::SocketAddr;
use std::os::unix::net::SocketAddr as UnixAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

pub(crate) use super::plane::{Established, Halves, LaneConns};

/// An established link: what carries it, and its plane.
pub(crate) struct Link {
    pub(crate) kind: ConnKind,
    pub(crate) plane: Box<dyn LinkPlane>,
}

enum PeerState {
    Absent,
    /// Absent, the rank's process replaced (decision 0040): what its old
    /// link's plane reports late is not about the replacement's link.
    Replaced,
    Dialing,
    Ready(Arc<Link>),
    Failed(Loss),
}

/// What [`PeerTable::find`] found.
pub(crate) enum Found {
    /// The link is up.
    Ready(Arc<Link>),
    /// Nobody has dialed the peer, and this thread now must: dial, then
    /// [`PeerTable::register`] the link or [`PeerTable::unclaim`].
    Claimed,
}

/// Each peer's link, or where making it stands.
pub(crate) struct PeerTable {
    me: usize,
    states: Mutex<Vec<PeerState>>,
    /// Each peer's process (its incarnation, decision 0040): what a link
    /// made now links to. A link's failure counts only while it matches.
    incarnations: Vec<AtomicU32>,
    changed: Condvar,
    closing: AtomicBool,
}

impl PeerTable {
    /// A table of `world` peers; `incarnations` says each's current
    /// process (0 where it says nothing).
    pub(crate) fn new(me: usize, world: usize, incarnations: &[u32]) -> PeerTable {
        PeerTable {
            me,
            states: Mutex::new((0..world).map(|_| PeerState::Absent).collect()),
            incarnations: (0..world)
                .map(|p| AtomicU32::new(incarnations.get(p).copied().unwrap_or(0)))
                .collect(),
            changed: Condvar::new(),
            closing: AtomicBool::new(false),
        }
    }

    /// The process of `peer` that links are made to now.
    pub(crate) fn incarnation(&self, peer: usize) -> u32 {
        self.incarnations
            .get(peer)
            .map_or(0, |i| i.load(Ordering::Acquire))
    }

    /// Whether a link made to `peer`'s process `incarnation` is still the
    /// peer's (not a replaced process's, reporting late).
    pub(crate) fn is_current(&self, peer: usize, incarnation: u32) -> bool {
        self.incarnation(peer) == incarnation
    }

    /// [`PeerTable::fail`] for a failure a link to process `incarnation`
    /// reported: ignored (false) once the peer's place went to another
    /// process, whatever the state of the link to that one (being dialed,
    /// up, or failed for its own reason).
    pub(crate) fn fail_from(&self, loss: Loss, incarnation: u32) -> bool {
        if !self.is_current(loss.peer, incarnation) {
            tracing::debug!(
                rank = self.me,
                peer = loss.peer,
                incarnation,
                "a replaced process's link failed late; ignored"
            );
            return false;
        }
        self.fail(loss)
    }

    /// The link to `peer`, or the claim to dial it (a lower rank's job),
    /// or waits until `deadline` for the peer's dial (a higher rank's).
    /// `interrupt` ends the wait early (an abort); `late` is the error
    /// when the peer did not dial in time.
    pub(crate) fn find(
        &self,
        peer: usize,
        deadline: Instant,
        interrupt: impl Fn() -> Option<LinkError>,
        late: impl FnOnce() -> LinkError,
    ) -> Result<Found, LinkError> {
        let mut states = lock(&self.states);
        loop {
            if let Some(e) = interrupt() {
                return Err(e);
            }
            match states.get(peer) {
                None => return Err(closed(peer)),
                Some(PeerState::Ready(link)) => return Ok(Found::Ready(link.clone())),
                Some(PeerState::Failed(loss)) => return Err(LinkError::Lost(loss.clone())),
                Some(PeerState::Absent | PeerState::Replaced) if self.me < peer => {
                    states[peer] = PeerState::Dialing;
                    return Ok(Found::Claimed);
                }
                Some(_) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(late());
                    }
                    states = self
                        .changed
                        .wait_timeout(states, deadline - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        }
    }

    /// Claims an absent peer for dialing (as [`Found::Claimed`]); false if
    /// its link is up, being made, or failed.
    pub(crate) fn claim_absent(&self, peer: usize) -> bool {
        let mut states = lock(&self.states);
        match states.get(peer) {
            Some(PeerState::Absent | PeerState::Replaced) => {
                states[peer] = PeerState::Dialing;
                true
            }
            _ => false,
        }
    }

    /// A claimed dial failed: the peer is absent again (the next op dials).
    pub(crate) fn unclaim(&self, peer: usize) {
        if let Some(slot) = lock(&self.states).get_mut(peer) {
            *slot = PeerState::Absent;
        }
        self.changed.notify_all();
    }

    /// Makes `link` the ready link to `peer`; false (the link shut down) if
    /// the table closed meanwhile, since nobody would shut it down later.
    pub(crate) fn register(&self, peer: usize, link: &Arc<Link>) -> bool {
        let mut states = lock(&self.states);
        let ready = match states.get_mut(peer) {
            Some(slot) if !self.closing() => {
                *slot = PeerState::Ready(link.clone());
                true
            }
            _ => false,
        };
        drop(states);
        if !ready {
            link.plane.shut_down();
        }
        self.changed.notify_all();
        ready
    }

    /// Marks the link to `peer` failed (shutting it down) unless it failed
    /// already: the first failure is the one reported. False if the rank
    /// was replaced since its link was made: the failure is the old
    /// link's, reported late, and changes nothing.
    pub(crate) fn fail(&self, loss: Loss) -> bool {
        {
            let mut states = lock(&self.states);
            if let Some(state) = states.get_mut(loss.peer) {
                if let PeerState::Replaced = state {
                    return false;
                }
                if let PeerState::Ready(link) = state {
                    link.plane.shut_down();
                }
                if !matches!(state, PeerState::Failed(_)) {
                    // Debug, not warn: a peer that finished and exited closes
                    // its links too; an op that needed the link reports it.
                    tracing::debug!(rank = self.me, peer = loss.peer, reason = %loss, "link closed");
                    *state = PeerState::Failed(loss);
                }
            }
        }
        self.changed.notify_all();
        true
    }

    /// Forgets the link to `peer` (shutting it down if it is up): a
    /// replacement (process `incarnation`) takes the rank's place, and the
    /// next op dials it or waits for its dial (decision 0040).
    pub(crate) fn reset(&self, peer: usize, incarnation: u32) -> Result<(), LinkError> {
        {
            let mut states = lock(&self.states);
            let Some(state) = states.get_mut(peer) else {
                return Err(closed(peer));
            };
            // Under the lock: a dial that finds the peer absent sees the
            // new process's number.
            self.incarnations[peer].store(incarnation, Ordering::Release);
            if let PeerState::Ready(link) = state {
                link.plane.shut_down();
            }
            *state = PeerState::Replaced;
        }
        self.changed.notify_all();
        Ok(())
    }

    /// Why the link to `peer` is gone, if it is.
    pub(crate) fn failure(&self, peer: usize) -> Option<Loss> {
        match lock(&self.states).get(peer) {
            Some(PeerState::Failed(loss)) => Some(loss.clone()),
            None => Some(Loss::new(peer, LinkFailure::TransportClosed)),
            _ => None,
        }
    }

    /// The ready link to `peer`, if it is up.
    pub(crate) fn ready(&self, peer: usize) -> Option<Arc<Link>> {
        match lock(&self.states).get(peer) {
            Some(PeerState::Ready(link)) => Some(link.clone()),
            _ => None,
        }
    }

    /// Whether no link to `peer` is up, being made, or failed.
    pub(crate) fn is_absent(&self, peer: usize) -> bool {
        matches!(
            lock(&self.states).get(peer),
            Some(PeerState::Absent | PeerState::Replaced)
        )
    }

    /// Every established link, with its peer.
    pub(crate) fn ready_links(&self) -> Vec<(usize, Arc<Link>)> {
        lock(&self.states)
            .iter()
            .enumerate()
            .filter_map(|(p, st)| match st {
                PeerState::Ready(l) => Some((p, l.clone())),
                _ => None,
            })
            .collect()
    }

    /// Wakes every thread waiting for a peer's dial, to re-check.
    pub(crate) fn notify(&self) {
        self.changed.notify_all();
    }

    /// Closes the table: no link registers any more, and every link is
    /// shut down.
    pub(crate) fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
        let states = std::mem::take(&mut *lock(&self.states));
        for state in states {
            if let PeerState::Ready(link) = state {
                link.plane.shut_down();
            }
        }
        self.changed.notify_all();
    }

    pub(crate) fn closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }
}

/// The error of a transport that closed (the table is empty).
fn closed(peer: usize) -> LinkError {
    LinkError::Lost(Loss::new(peer, LinkFailure::TransportClosed))
}

/// Settings of link making.
#[derive(Clone, Debug)]
pub(crate) struct LinkConfig {
    /// How long a new connection may take to say hello.
    pub(crate) handshake_timeout: Duration,
    /// SO_SNDBUF / SO_RCVBUF (see `conn::Conn::configure`).
    pub(crate) socket_buffer: Option<usize>,
    /// Job secret and TLS (see `crate::security`); the handshake checks
    /// both sides use the same.
    pub(crate) security: Security,
    /// Lanes each way to dial TCP links with where the plane takes them
    /// (decisions 0018, 0034; 0: none).
    pub(crate) lanes: u8,
}

/// What making links needs: who the ranks are, where they listen, and the
/// handshake's settings; and the accepting side's state (handshakes in
/// progress, lanes awaited).
pub(crate) struct Linker {
    pub(crate) me: usize,
    world: usize,
    job_id: u64,
    /// Which process of its rank this one is (decision 0040).
    incarnation: u32,
    /// Where each rank listens, and which process of it links.
    slots: Mutex<Vec<Slot>>,
    config: LinkConfig,
    /// Which plane a link over TCP or Unix sockets gets.
    planes: PlaneKinds,
    /// When the transport started: refusals since then are named in errors.
    epoch: Instant,
    /// Handshakes in progress; capped so a flood of connections cannot
    /// spawn unbounded threads.
    handshakes: AtomicUsize,
    /// Links accepted with lanes, waiting for them, as they arrive.
    pending_lanes: Mutex<HashMap<usize, PendingLanes>>,
    lanes_arrived: Condvar,
}

pub(crate) use super::PeerPlace as Slot;

/// The lanes of a link accepted with them, as the dialer opens them: those
/// it writes, those it reads, by index.
pub(crate) struct PendingLanes {
    from_dialer: Vec<Option<Conn>>,
    to_dialer: Vec<Option<Conn>>,
}

impl PendingLanes {
    fn new(lanes: u8) -> PendingLanes {
        let none = || (0..lanes).map(|_| None).collect();
        PendingLanes {
            from_dialer: none(),
            to_dialer: none(),
        }
    }

    /// Where lane `channel` goes, if it is a lane this link awaits.
    fn slot(&mut self, channel: Channel) -> Option<&mut Option<Conn>> {
        match channel {
            Channel::LaneFromDialer(i) => self.from_dialer.get_mut(usize::from(i)),
            Channel::LaneToDialer(i) => self.to_dialer.get_mut(usize::from(i)),
            _ => None,
        }
    }

    fn is_free(&self, channel: Channel) -> bool {
        let (slots, i) = match channel {
            Channel::LaneFromDialer(i) => (&self.from_dialer, i),
            Channel::LaneToDialer(i) => (&self.to_dialer, i),
            _ => return false,
        };
        slots.get(usize::from(i)).is_some_and(Option::is_none)
    }

    fn complete(&self) -> bool {
        self.from_dialer
            .iter()
            .chain(&self.to_dialer)
            .all(Option::is_some)
    }

    /// The acceptor's view: it writes the lanes to the dialer.
    fn into_conns(self) -> Option<LaneConns> {
        Some(LaneConns {
            send: self.to_dialer.into_iter().collect::<Option<_>>()?,
            recv: self.from_dialer.into_iter().collect::<Option<_>>()?,
        })
    }
}

/// The plane each kind of socket gets, as the transport chose at start.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PlaneKinds {
    pub(crate) tcp: PlaneKind,
    pub(crate) unix: PlaneKind,
}

impl Linker {
    pub(crate) fn new(
        (me, incarnation): (usize, u32),
        job_id: u64,
        slots: Vec<Slot>,
        config: LinkConfig,
        planes: PlaneKinds,
        epoch: Instant,
    ) -> Linker {
        Linker {
            me,
            world: slots.len(),
            job_id,
            incarnation,
            slots: Mutex::new(slots),
            config,
            planes,
            epoch,
            handshakes: AtomicUsize::new(0),
            pending_lanes: Mutex::new(HashMap::new()),
            lanes_arrived: Condvar::new(),
        }
    }

    /// The plane a link over `conn` will get.
    fn plane(&self, conn: ConnKind) -> PlaneKind {
        match conn {
            ConnKind::Tcp => self.planes.tcp,
            ConnKind::Unix => self.planes.unix,
        }
    }

    /// This rank's listeners in the refusal ledger.
    pub(crate) fn place(&self) -> Place {
        Place::Link {
            rank: self.me,
            port: lock(&self.slots).get(self.me).map_or(0, |s| s.addr.port()),
        }
    }

    /// When the transport started.
    pub(crate) fn epoch(&self) -> Instant {
        self.epoch
    }

    /// Where `peer` listens for TCP links.
    pub(crate) fn addr(&self, peer: usize) -> SocketAddr {
        lock(&self.slots)[peer].addr
    }

    /// Where `peer` is and which of its processes links.
    pub(crate) fn slot(&self, peer: usize) -> Slot {
        lock(&self.slots)[peer].clone()
    }

    /// `peer`'s slot is taken by a replacement (decision 0040): its links
    /// from now on go to, and come from, that process only.
    pub(crate) fn replace(&self, peer: usize, slot: Slot) {
        lock(&self.slots)[peer] = slot;
    }

    /// Sets a new connection's socket options for the plane it will get.
    fn configure(&self, stream: &Conn) -> io::Result<()> {
        let plane = self.plane(stream.kind());
        stream.configure(self.config.socket_buffer, plane.large_unix_buffers())
    }
}

/// What a link's secret proofs are bound to: the job and the two ranks.
fn link_context(job_id: u64, dialer: usize, acceptor: usize) -> Vec<u8> {
    let mut c = b"link".to_vec();
    c.extend_from_slice(&job_id.to_le_bytes());
    c.extend_from_slice(&(dialer as u64).to_le_bytes());
    c.extend_from_slice(&(acceptor as u64).to_le_bytes());
    c
}

/// Reads a `HandshakeAck` frame (`Ok(Err)`: something else arrived).
fn read_ack(stream: &mut dyn Read) -> io::Result<Result<HelloAck, String>> {
    let (header, payload) = read_control(stream)?;
    if header.kind != FrameKind::HandshakeAck {
        return Ok(Err(format!(
            "expected a handshake answer, got a {} frame",
            header.kind.name()
        )));
    }
    Ok(HelloAck::decode(&payload).map_err(|e| format!("bad handshake answer: {e}")))
}

/// The reason in a plaintext refusal (a `HandshakeAck` frame) that a
/// plaintext peer sent in answer to a TLS ClientHello.
fn plaintext_refusal(bytes: &[u8]) -> Option<String> {
    let header = Header::decode(bytes.get(..HEADER_LEN)?, wire::MAX_CONTROL_PAYLOAD).ok()?;
    let start = header.payload_offset();
    let payload = bytes.get(start..start + header.payload_len_usize())?;
    (header.kind == FrameKind::HandshakeAck)
        .then(|| HelloAck::decode(payload).ok().map(|a| a.reason))
        .flatten()
}

/// Plain halves of a link's socket (two handles to it).
fn plain_halves(conn: &Conn) -> io::Result<Halves> {
    Ok((Box::new(conn.try_clone()?), Box::new(conn.try_clone()?)))
}

/// A Unix socket address for messages (abstract names start with `@`).
pub(crate) fn describe_unix(addr: &UnixAddr) -> String {
    use std::os::linux::net::SocketAddrExt;
    match (addr.as_abstract_name(), addr.as_pathname()) {
        (Some(name), _) => format!("unix:@{}", String::from_utf8_lossy(name)),
        (None, Some(path)) => format!("unix:{}", path.display()),
        (None, None) => "unix:(unnamed)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loss(peer: usize) -> Loss {
        Loss::new(peer, LinkFailure::TransportClosed)
    }

    /// Decision 0040's window: the replaced process's old link reports
    /// its failure after the link to the replacement is being made.
    #[test]
    fn a_replaced_processs_late_failure_leaves_the_new_link_alone() {
        let table = PeerTable::new(0, 3, &[]);
        assert!(table.claim_absent(2));
        table.reset(2, 1).unwrap();
        assert_eq!(table.incarnation(2), 1);
        assert!(table.claim_absent(2), "the replacement is dialed");
        assert!(!table.fail_from(loss(2), 0), "the old link's failure");
        assert!(table.failure(2).is_none());
        assert!(!table.is_absent(2), "still being dialed");
        // The replacement's own link failing does count.
        assert!(table.fail_from(loss(2), 1));
        assert!(table.failure(2).is_some());
        // Other peers are untouched by either.
        assert!(table.is_absent(1));
        assert!(table.fail_from(loss(1), 0));
    }
}
