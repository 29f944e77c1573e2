//! The mesh: the one [`Transport`], a link to each peer it talks to.
//!
//! It owns the peer table and link making (`link/`), the inboxes
//! (`inbox`), control traffic (`control`) and the planes (`plane/`), and
//! composes them: an op's send or receive finds the peer's link (waiting
//! for its dial, or dialing it) and hands the frame to the link's plane;
//! a link made (dialed or accepted) gets its plane from [`Planes::make`]
//! and is registered, then hears every abort known; what planes report
//! comes back through [`Fabric`], which routes arriving frames
//! (`dispatch`) and fails links.
//!
//! Receiving never stops while a rank waits (a reader thread per portable
//! link; the engine keeps a receive posted on every link and whoever waits
//! drives it), so a send never waits for the peer's executor: this is what
//! lets each rank run its schedule strictly in order without deadlock.

use super::conn::Conn;
use super::control::Control;
use super::dispatch;
use super::inbox::Inboxes;
use super::link::{
    Accepted, Established, Found, Link, LinkConfig, Linker, PeerTable, PlaneKinds, Slot,
    accept_loop, open_files,
};
use super::plane::{Fabric, PlaneConfig, Planes};
use super::{
    AlignedBuf, Incoming, LinkError, PeerPlace, PostedRecvs, Received, Transport, framing,
};
use crate::error::Error;
use crate::error::link::{LinkFailure, Loss};
use crate::refusals;
use crate::security::Security;
use crate::wire::{self, Header};
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Settings of the transport.
#[derive(Clone, Debug)]
pub(crate) struct MeshConfig {
    /// Largest data payload a peer may announce (bytes).
    pub(crate) max_payload: u32,
    /// How long a new connection may take to say hello.
    pub(crate) handshake_timeout: Duration,
    /// A send blocked longer than this fails (the peer stopped reading).
    pub(crate) write_timeout: Duration,
    /// SO_SNDBUF / SO_RCVBUF; `None` keeps the kernel's autotuning, which
    /// on Linux grows further than an explicit size capped by wmem_max
    /// (but the engine's Unix links get one: `conn::LARGE_UNIX_SOCKET_BUFFER`);
    /// `Some(0)` asks for the kernel's defaults there too.
    pub(crate) socket_buffer: Option<usize>,
    /// Idle links carry a heartbeat this often.
    pub(crate) heartbeat_interval: Duration,
    /// A link that carries nothing (not even heartbeats) for this long is
    /// declared dead: the peer process is stopped or the network partitioned.
    pub(crate) heartbeat_timeout: Duration,
    /// Job secret and TLS (see `crate::security`); the handshake checks
    /// both sides use the same.
    pub(crate) security: Security,
    /// Move bytes with the io_uring engine instead of reader threads
    /// (plaintext links only: TLS records need the portable plane).
    pub(crate) uring: bool,
    /// If the engine cannot start, fail (the user asked for it) instead of
    /// falling back to the portable plane with a warning.
    pub(crate) uring_required: bool,
    /// How long a receive polls (the uring plane for a completion, the
    /// portable plane for its reader thread's frame) before sleeping
    /// (RINGWIRE_SPIN_US, default 1 ms; polls yield the core, decision
    /// 0008).
    pub(crate) spin: Duration,
    /// Lanes each way to dial TCP links with when the engine runs
    /// (decisions 0018, 0034; 0: none).
    pub(crate) lanes: u8,
    /// Engine threads the TCP lanes run on, and the cores to pin them to
    /// (decision 0036; `engine_cores.rs`).
    pub(crate) engine_threads: usize,
    pub(crate) thread_cores: Vec<usize>,
    /// Links to ranks on this host run on shared memory where they can.
    pub(crate) shm: bool,
    /// Bytes a peer may deliver for ops this rank has not started before
    /// its link stops being read (0: never stop; decision 0019).
    pub(crate) run_ahead_limit: usize,
    /// The same over all peers together (0: no total limit).
    pub(crate) run_ahead_total_limit: usize,
}

/// How long telling an unlinked member of an abort may spend dialing it.
const TELL_DIAL: Duration = Duration::from_millis(100);

/// A Unix listener for peers on this host, and which peers are (their
/// listeners' addresses); see decision 0009.
pub(crate) struct LocalPeers {
    pub(crate) listener: UnixListener,
    pub(crate) peers: Vec<Option<UnixAddr>>,
    /// This host runs more ranks than it has cores: waits yield from the
    /// start instead of spinning.
    pub(crate) crowded: bool,
}

/// What the transport's threads share: the owners of each concern.
struct Hub {
    me: usize,
    max_payload: u32,
    peers: PeerTable,
    linker: Linker,
    inboxes: Inboxes,
    control: Control,
    planes: Planes,
}

/// The handle communicators hold. Dropping the last one closes every link
/// and stops the threads.
pub(crate) struct Mesh {
    hub: Arc<Hub>,
    local_addr: SocketAddr,
    /// Where the Unix listener for local peers is, if one runs.
    local_addr_unix: Option<UnixAddr>,
}

impl Mesh {
    /// Starts accepting on `listener` (already bound and published), and
    /// on the Unix listener for local peers.
    pub(crate) fn start(
        listener: TcpListener,
        local: Option<LocalPeers>,
        me: usize,
        job_id: u64,
        addrs: Vec<SocketAddr>,
        incarnations: Vec<u32>,
        config: MeshConfig,
    ) -> io::Result<Mesh> {
        let (local_listener, local_peers, crowded) = match local {
            Some(l) => (Some(l.listener), l.peers, l.crowded),
            None => (None, vec![None; addrs.len()], false),
        };
        let local_addr = listener.local_addr()?;
        let world = addrs.len();
        open_files::make_room_for_links(me, world, config.lanes);
        let plane_config = PlaneConfig {
            write_timeout: config.write_timeout,
            spin: config.spin,
            engine_threads: config.engine_threads,
            thread_cores: config.thread_cores.clone(),
            crowded,
            tls: config.security.tls.is_some(),
            shm: config.shm,
            handshake_timeout: config.handshake_timeout,
        };
        let planes = Planes::start(me, world, plane_config, config.uring, config.uring_required)?;
        let epoch = Instant::now();
        let kinds = PlaneKinds {
            tcp: planes.kind_for(super::conn::ConnKind::Tcp),
            unix: planes.kind_for(super::conn::ConnKind::Unix),
        };
        let link_config = LinkConfig {
            handshake_timeout: config.handshake_timeout,
            socket_buffer: config.socket_buffer,
            security: config.security.clone(),
            lanes: config.lanes,
        };
        let limits = (config.run_ahead_limit, config.run_ahead_total_limit);
        let hub = Arc::new(Hub {
            me,
            max_payload: config.max_payload,
            peers: PeerTable::new(me, world, &incarnations),
            linker: Linker::new(
                (me, incarnations.get(me).copied().unwrap_or(0)),
                job_id,
                addrs
                    .iter()
                    .enumerate()
                    .map(|(q, &addr)| Slot {
                        addr,
                        local: local_peers.get(q).cloned().flatten(),
                        incarnation: incarnations.get(q).copied().unwrap_or(0),
                    })
                    .collect(),
                link_config,
                kinds,
                epoch,
            ),
            inboxes: Inboxes::new(me, world, limits, planes.waker()),
            control: Control::new(
                me,
                world,
                epoch,
                (config.heartbeat_interval, config.heartbeat_timeout),
            ),
            planes,
        });
        let h = hub.clone();
        std::thread::Builder::new()
            .name(format!("ringwire-accept-{me}"))
            .spawn(move || accept_loop(&h, || listener.accept().map(|(c, _)| Conn::Tcp(c))))?;
        let local_addr_unix = match local_listener {
            Some(l) => {
                let addr = l.local_addr()?;
                let h = hub.clone();
                std::thread::Builder::new()
                    .name(format!("ringwire-accept-local-{me}"))
                    .spawn(move || accept_loop(&h, || l.accept().map(|(c, _)| Conn::Unix(c))))?;
                Some(addr)
            }
            None => None,
        };
        let h = hub.clone();
        std::thread::Builder::new()
            .name(format!("ringwire-heartbeat-{me}"))
            .spawn(move || h.control.heartbeats(&h.peers, &h.inboxes, &h.planes, &*h))?;
        Ok(Mesh {
            hub,
            local_addr,
            local_addr_unix,
        })
    }
}

impl Drop for Mesh {
    fn drop(&mut self) {
        let hub = &self.hub;
        hub.peers.close();
        hub.inboxes.close();
        // The arena goes with the links, not with the last thread to let
        // go of the hub.
        hub.planes.close();
        // Wake the accept loops so they see the table closed.
        let _ = TcpStream::connect_timeout(&self.local_addr, Duration::from_millis(200));
        if let Some(addr) = &self.local_addr_unix {
            let _ = UnixStream::connect_addr(addr);
        }
    }
}

impl Hub {
    /// The link to `peer`, dialing it (lower rank) or waiting for its dial
    /// (higher rank) until `deadline`.
    fn link(
        self: &Arc<Self>,
        peer: usize,
        deadline: Instant,
        comm_id: u64,
    ) -> Result<Arc<Link>, LinkError> {
        let late = || LinkError::Connect {
            addr: self.linker.addr(peer).to_string(),
            detail: format!(
                "rank {peer} did not connect to this rank (rank {}) in time (is it running and calling the same collectives?){}",
                self.me,
                // A refused dialer is usually that peer.
                refusals::suffix_since_at(self.linker.epoch(), self.linker.place())
            ),
            failure: LinkFailure::NotDialed,
        };
        match self
            .peers
            .find(peer, deadline, || self.control.aborted_error(comm_id), late)?
        {
            Found::Ready(link) => Ok(link),
            Found::Claimed => self.dial_claimed(peer, deadline),
        }
    }

    /// Dials `peer`, which this thread claimed, and records the outcome:
    /// the link (which then hears every abort this rank knows of), or the
    /// peer absent again.
    fn dial_claimed(
        self: &Arc<Self>,
        peer: usize,
        deadline: Instant,
    ) -> Result<Arc<Link>, LinkError> {
        self.dial_claimed_with(peer, deadline, true)
    }

    /// [`Hub::dial_claimed`], retrying a refused connection only if
    /// `retry`.
    fn dial_claimed_with(
        self: &Arc<Self>,
        peer: usize,
        deadline: Instant,
        retry: bool,
    ) -> Result<Arc<Link>, LinkError> {
        let made = self
            .linker
            .dial_with(peer, deadline, retry)
            .and_then(|link| {
                self.start_link(peer, link).map_err(|e| LinkError::Connect {
                    addr: self.linker.addr(peer).to_string(),
                    detail: e.to_string(),
                    failure: LinkFailure::of_io(&e, false),
                })
            });
        match made {
            Ok(link) if self.register(peer, &link) => Ok(link),
            Ok(_) => Err(LinkError::Lost(Loss::new(
                peer,
                LinkFailure::TransportClosed,
            ))),
            Err(e) => {
                self.peers.unclaim(peer);
                Err(e)
            }
        }
    }

    /// Starts the plane of an established link to `peer`.
    fn start_link(self: &Arc<Self>, peer: usize, link: Established) -> io::Result<Arc<Link>> {
        let kind = link.conn.kind();
        // Made to the peer's current process (a dial goes to its place, an
        // accepted hello was checked against it).
        let fabric: Arc<dyn Fabric> = Arc::new(LinkFabric {
            hub: self.clone(),
            peer,
            incarnation: self.peers.incarnation(peer),
        });
        let plane = self.planes.make(&fabric, peer, link)?;
        Ok(Arc::new(Link { kind, plane }))
    }

    /// Registers `link` as the link to `peer` and sends it every abort
    /// this rank knows of; false (the link shut down) if the transport
    /// closed meanwhile.
    fn register(&self, peer: usize, link: &Arc<Link>) -> bool {
        let ready = self.peers.register(peer, link);
        if ready {
            self.control.replay(peer, link);
        }
        ready
    }

    /// Marks the link to `peer` failed and wakes everyone waiting on it;
    /// but a send that found the connection broken stops only the link's
    /// sending: what the peer sent before it exited is still read (an op
    /// here may need its last frames, which another communicator's send or
    /// a heartbeat meeting the closed socket first must not throw away),
    /// and the link fails when its receiving side ends.
    fn fail(&self, peer: usize, failure: LinkFailure) {
        self.fail_link(peer, failure, None);
    }

    /// [`Hub::fail`], for a failure the link to `peer`'s process `from`
    /// reported (`None`: not a link's): a replaced process's link
    /// reporting late changes nothing.
    fn fail_link(&self, peer: usize, failure: LinkFailure, from: Option<u32>) {
        if from.is_some_and(|inc| !self.peers.is_current(peer, inc)) {
            tracing::debug!(
                rank = self.me,
                peer,
                ?failure,
                "a replaced process's link failed late; ignored"
            );
            return;
        }
        // (A link this rank stopped reading, its peer far ahead, might
        // not see its end: it fails now.)
        if matches!(failure, LinkFailure::Io { sending: true, .. })
            && !self.inboxes.paused(peer)
            && let Some(link) = self.peers.ready(peer)
        {
            tracing::debug!(
                rank = self.me,
                peer,
                ?failure,
                "a send failed; reading what came before"
            );
            link.plane.stop_sending();
            return;
        }
        let loss = Loss::new(peer, failure);
        let failed = match from {
            Some(incarnation) => self.peers.fail_from(loss, incarnation),
            None => self.peers.fail(loss),
        };
        if failed {
            self.inboxes.peer_lost(peer);
        }
    }

    /// Records an abort (see [`Control::on_abort`]).
    fn on_abort(&self, from: Option<usize>, comm_id: u64, abort: wire::Abort) {
        self.control
            .on_abort(from, comm_id, abort, &self.peers, &self.inboxes);
    }

    /// After this rank aborted a communicator: dials each of its `members`
    /// above this rank that has no link yet, so that the link's first frame
    /// tells it (`register` replays aborts). Without this a member this
    /// rank never exchanged a frame with (its first op failed here, or
    /// `abort` came first) would wait for its own timeout. Members below
    /// dial this rank when they next need it and hear the abort then. Best
    /// effort, until `deadline`.
    fn tell_unlinked(self: &Arc<Self>, members: &[usize], deadline: Instant) {
        for &peer in members.iter().filter(|&&p| p > self.me) {
            if Instant::now() >= deadline {
                return;
            }
            if !self.peers.claim_absent(peer) {
                continue;
            }
            // A member that is up accepts at once (it has listened since
            // it joined); one that refuses is dead (often why the
            // communicator was aborted), and retrying it would hold up
            // telling the others, and this rank's own error (about 100 ms
            // over TCP before, from the kill to the survivors' errors).
            let soon = (Instant::now() + TELL_DIAL).min(deadline);
            if let Err(e) = self.dial_claimed_with(peer, soon, false) {
                tracing::debug!(rank = self.me, peer, error = ?e, "could not reach a rank to tell it of an abort");
            }
        }
    }
}

impl Fabric for Hub {
    fn header(&self, peer: usize, head: &[u8]) -> Result<Header, LinkFailure> {
        self.control.heard(peer);
        dispatch::check_header(head, self.max_payload).map_err(LinkFailure::from)
    }

    fn arrived(&self, peer: usize, header: Header, payload: AlignedBuf, wake: bool) {
        dispatch::deliver(
            &self.inboxes,
            peer,
            header,
            payload,
            wake,
            |abort| self.on_abort(Some(peer), header.comm_id, abort),
            |e| self.fail(peer, LinkFailure::from(e)),
        );
    }

    fn failed(&self, peer: usize, failure: LinkFailure) {
        self.fail(peer, failure);
    }

    fn aborted(&self, comm_id: u64) -> Option<LinkError> {
        self.control.aborted_error(comm_id)
    }

    fn failure(&self, peer: usize) -> Option<Loss> {
        self.peers.failure(peer)
    }

    fn sent(&self, peer: usize) {
        self.control.sent(peer);
    }

    fn heard(&self, peer: usize) {
        self.control.heard(peer);
    }

    fn inboxes(&self) -> &Inboxes {
        &self.inboxes
    }
}

/// The hub as the plane of one link sees it: the link's failures are
/// tagged with the process it was made to, so that a replaced rank's old
/// link, failing late, cannot fail the link to its replacement. Only its
/// own peer's: the shared-memory and io_uring planes also drain other
/// links through a link's fabric, and those reports go by index alone
/// (decision 0040 says what is left open).
struct LinkFabric {
    hub: Arc<Hub>,
    peer: usize,
    incarnation: u32,
}

impl Fabric for LinkFabric {
    fn header(&self, peer: usize, head: &[u8]) -> Result<Header, LinkFailure> {
        self.hub.header(peer, head)
    }

    fn arrived(&self, peer: usize, header: Header, payload: AlignedBuf, wake: bool) {
        self.hub.arrived(peer, header, payload, wake);
    }

    fn failed(&self, peer: usize, failure: LinkFailure) {
        let from = (peer == self.peer).then_some(self.incarnation);
        self.hub.fail_link(peer, failure, from);
    }

    fn aborted(&self, comm_id: u64) -> Option<LinkError> {
        self.hub.aborted(comm_id)
    }

    fn failure(&self, peer: usize) -> Option<Loss> {
        self.hub.failure(peer)
    }

    fn sent(&self, peer: usize) {
        self.hub.sent(peer);
    }

    fn heard(&self, peer: usize) {
        self.hub.heard(peer);
    }

    fn inboxes(&self) -> &Inboxes {
        self.hub.inboxes()
    }
}

impl Accepted for Hub {
    fn linker(&self) -> &Linker {
        &self.linker
    }

    fn peers(&self) -> &PeerTable {
        &self.peers
    }

    fn accepted(self: &Arc<Self>, peer: usize, link: Established) -> io::Result<()> {
        let link = self.start_link(peer, link)?;
        self.register(peer, &link);
        Ok(())
    }
}

impl Transport for Mesh {
    fn abort_notice(&self, comm_id: u64) -> Option<(usize, u64, String)> {
        self.hub.control.notice(comm_id)
    }

    fn send(
        &self,
        peer: usize,
        header: &Header,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<(), LinkError> {
        let link = self.hub.link(peer, deadline, header.comm_id)?;
        let header = &framing::aligned_for(header, payload);
        link.plane.send(&*self.hub, peer, header, payload, deadline)
    }

    fn recv(&self, comm_id: u64, peer: usize, deadline: Instant) -> Result<Incoming, LinkError> {
        let inbox = self.hub.inboxes.inbox(comm_id, peer);
        // Make sure the link exists (the lower rank dials on first use). A
        // peer that sent its last frame and exited has a closed link but
        // still a frame for us: deliver queued frames before reporting.
        match self.hub.link(peer, deadline, comm_id) {
            Ok(link) => link.plane.recv(&*self.hub, &inbox, comm_id, peer, deadline),
            // The op is over, whatever came before.
            Err(e @ LinkError::Aborted { .. }) => Err(e),
            Err(e) => inbox.pop().ok_or(e),
        }
    }

    fn recv_into(
        &self,
        comm_id: u64,
        peer: usize,
        expected: (u64, u32, u32),
        dest: &mut [u8],
        deadline: Instant,
    ) -> Result<Received, LinkError> {
        let inbox = self.hub.inboxes.inbox(comm_id, peer);
        match self.hub.link(peer, deadline, comm_id) {
            Ok(link) => link
                .plane
                .recv_into(&*self.hub, &inbox, comm_id, peer, expected, dest, deadline),
            Err(e @ LinkError::Aborted { .. }) => Err(e),
            Err(e) => inbox.pop().map(Received::Frame).ok_or(e),
        }
    }

    fn with_posted_recvs(
        &self,
        comm_id: u64,
        peer: usize,
        region: &mut [u8],
        deadline: Instant,
        body: &mut dyn FnMut(&mut dyn PostedRecvs) -> Result<(), Error>,
    ) -> Result<(), Error> {
        // A link that is not up is reported by the first receive.
        if let Ok(link) = self.hub.link(peer, deadline, comm_id) {
            let inbox = self.hub.inboxes.inbox(comm_id, peer);
            let hub = &*self.hub;
            if let Some(done) = link.plane.with_posted_recvs(
                hub,
                &inbox,
                comm_id,
                peer,
                &mut *region,
                deadline,
                &mut *body,
            ) {
                return done;
            }
        }
        super::in_turn(self, comm_id, peer, region, body)
    }

    fn recycle(&self, buf: AlignedBuf) {
        self.hub.inboxes.recycle(buf);
    }

    fn begin(&self, comm_id: u64, seq: u64, from: Option<usize>) {
        self.hub.inboxes.begin(comm_id, seq, from);
    }

    fn held_ahead(&self) -> (usize, usize) {
        self.hub.inboxes.held_ahead()
    }

    fn inboxes(&self) -> usize {
        self.hub.inboxes.count()
    }

    fn forget(&self, comm_id: u64) {
        self.hub.inboxes.forget(comm_id);
        self.hub.control.forget_nested(comm_id);
    }

    fn nest(&self, outer: u64, inner: u64) {
        let hub = &self.hub;
        hub.control.nest(outer, inner, &hub.peers, &hub.inboxes);
    }

    fn abort(&self, comm_id: u64, seq: u64, reason: &str, members: &[usize]) {
        let hub = &self.hub;
        hub.on_abort(None, comm_id, wire::Abort::new(hub.me as u32, seq, reason));
        hub.planes.mark_abort();
        let limit = Duration::from_secs(1);
        let deadline = Instant::now() + limit;
        // Dials run on a thread of their own, waited for at most `limit`: a
        // stopped member's handshake would hold this one far longer.
        let me = hub.me;
        let unlinked = members.iter().any(|&p| p > me && hub.peers.is_absent(p));
        if unlinked {
            let (hub, members) = (hub.clone(), members.to_vec());
            let (told, done) = std::sync::mpsc::channel();
            let spawned = std::thread::Builder::new()
                .name(format!("ringwire-tell-{me}"))
                .spawn(move || {
                    hub.tell_unlinked(&members, deadline);
                    let _ = told.send(());
                });
            if spawned.is_ok() {
                let _ = done.recv_timeout(limit);
            }
        }
        hub.control
            .wait_forwarded(comm_id, limit, &hub.planes, &**hub);
    }

    fn listen_addr(&self) -> SocketAddr {
        self.local_addr
    }

    fn link_kind(&self, peer: usize) -> Option<&'static str> {
        self.hub
            .peers
            .ready(peer)
            .map(|link| link.plane.kind().unwrap_or(link.kind.name()))
    }

    fn link_lanes(&self, peer: usize) -> usize {
        self.hub
            .peers
            .ready(peer)
            .map_or(0, |link| link.plane.lanes())
    }

    fn engine_thread_stats(&self) -> Vec<crate::stats::EngineThreadStats> {
        self.hub.planes.engine_thread_stats()
    }

    fn link_lane_stats(&self, peer: usize) -> Vec<crate::stats::LaneStats> {
        self.hub
            .peers
            .ready(peer)
            .map_or_else(Vec::new, |link| link.plane.lane_stats())
    }

    fn name(&self) -> &'static str {
        self.hub.planes.name()
    }

    fn release(&self) {
        self.hub.planes.release(&*self.hub);
    }

    fn arena(&self) -> Option<Arc<crate::arena::Arena>> {
        self.hub.planes.arena()
    }

    fn peer_arena(
        &self,
        peer: usize,
        comm_id: u64,
        deadline: Instant,
    ) -> Result<Option<Arc<ringwire_shm::Mapping>>, LinkError> {
        Ok(self.hub.link(peer, deadline, comm_id)?.plane.peer_arena())
    }

    fn arena_poll(&self, comm_id: u64, deep: bool) -> Result<(), LinkError> {
        let hub = &*self.hub;
        match deep {
            true => hub.planes.tick(hub),
            false => hub.planes.drain_shm(hub),
        }
        match hub.control.aborted_error(comm_id) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn arena_ring(&self, peer: usize) {
        if let Some(link) = self.hub.peers.ready(peer) {
            link.plane.ring_doorbell();
        }
    }

    fn arena_sleep(&self, peers: &[usize], timeout: Duration) {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let links: Vec<_> = peers
            .iter()
            .filter_map(|&p| self.hub.peers.ready(p))
            .collect();
        let mut fds: Vec<PollFd<'_>> = links
            .iter()
            .flat_map(|l| [l.plane.doorbell(), l.plane.death_watch()])
            .flatten()
            .map(|fd| PollFd::new(fd, PollFlags::POLLIN))
            .collect();
        if fds.is_empty() {
            std::thread::sleep(timeout);
            return;
        }
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        let _ = poll(
            &mut fds,
            PollTimeout::try_from(ms).unwrap_or(PollTimeout::ZERO),
        );
        drop(fds);
        for link in &links {
            link.plane.hear_doorbell(&*self.hub);
        }
    }

    fn link_failure(&self, peer: usize) -> Option<LinkError> {
        self.hub.peers.failure(peer).map(LinkError::Lost)
    }

    fn probe(&self, peer: usize, deadline: Instant) -> Result<(), LinkError> {
        self.hub.linker.probe(peer, deadline)
    }

    fn replace_peer(&self, peer: usize, place: PeerPlace) -> Result<(), LinkError> {
        let hub = &self.hub;
        // The new place first: a dial or hello from now on meets it.
        let incarnation = place.incarnation;
        hub.linker.replace(peer, place);
        // The old process's link is over (shut down if this rank still
        // held it); what it left in the inboxes of its communicators, run
        // ahead or pausing its link, holds nobody back.
        hub.peers.reset(peer, incarnation)?;
        hub.inboxes.peer_lost(peer);
        hub.inboxes.peer_back(peer);
        hub.control.heard(peer);
        Ok(())
    }

    fn incarnation(&self, peer: usize) -> u32 {
        self.hub.linker.slot(peer).incarnation
    }
}
