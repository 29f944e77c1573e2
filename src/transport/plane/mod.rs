//! Data planes: how one link's bytes move.
//!
//! Each link gets its plane when it is made ([`Planes::make`]), so one job
//! can carry different planes to different peers. A plane sends frames,
//! waits for them, and reports what arrives and how its link fails through
//! [`Fabric`], which the transport above implements (dispatch, inboxes,
//! control): planes never reach into the peer table, the abort flood or
//! the dial logic, and adding a plane touches none of them.
//!
//! - `portable`: a reader thread per link and blocking writes; runs
//!   wherever sockets do, and with TLS.
//! - `uring`: every link on one io_uring (`ringwire_uring::FrameEngine`),
//!   driven by the thread that waits (decision 0007).

mod peer_process;
mod portable;
mod shm;
mod uring;

use super::conn::{Conn, ConnKind};
use super::inbox::{Inbox, Inboxes, Wake};
use super::{AlignedBuf, Incoming, LinkError, PostedRecvs, Received};
use crate::error::Error;
use crate::error::link::{LinkFailure, Loss};
use crate::security::{ReadHalf, WriteHalf};
use crate::wire::Header;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a plane needs from the transport above it. Called from reader
/// threads and from whichever thread drives the engine.
pub(crate) trait Fabric: Send + Sync {
    /// Checks a frame's header as it arrives from `peer` (which also shows
    /// the peer alive): the header, or why the link must fail.
    fn header(&self, peer: usize, head: &[u8]) -> Result<Header, LinkFailure>;
    /// A whole frame from `peer` whose header passed [`Fabric::header`];
    /// `wake` a receive sleeping on its inbox (the portable plane's are).
    fn arrived(&self, peer: usize, header: Header, payload: AlignedBuf, wake: bool);
    /// The link to `peer` failed (the first failure recorded stands).
    fn failed(&self, peer: usize, failure: LinkFailure);
    /// The abort of communicator `comm_id`, if some rank aborted it.
    fn aborted(&self, comm_id: u64) -> Option<LinkError>;
    /// Why the link to `peer` is gone, if it is.
    fn failure(&self, peer: usize) -> Option<Loss>;
    /// A frame went out to `peer` (idle links carry heartbeats).
    fn sent(&self, peer: usize);
    /// `peer` is alive, or its silence does not count (a paused link).
    fn heard(&self, peer: usize);
    /// The inboxes frames are filed in and receives wait on.
    fn inboxes(&self) -> &Inboxes;
}

/// A link's established connections, as the handshake leaves them: the
/// socket, the byte streams the handshake ran over (plain or TLS), and the
/// lanes a TCP link of the engine carries large payloads on (decision 0018).
pub(crate) struct Established {
    /// This end dialed (the other accepted).
    pub(crate) dialed: bool,
    /// Both ends agreed in the handshake to put the link on shared memory
    /// (the dialer then offers a segment, which may still fail).
    pub(crate) shm: bool,
    pub(crate) conn: Conn,
    pub(crate) halves: Halves,
    pub(crate) lanes: Option<LaneConns>,
}

/// A link's byte streams: its reader belongs to whoever reads the link,
/// its writer to every sender.
pub(crate) type Halves = (ReadHalf, WriteHalf);

/// A link's lanes as one end sees them: those it writes, those it reads
/// (as many each way).
pub(crate) struct LaneConns {
    pub(crate) send: Vec<Conn>,
    pub(crate) recv: Vec<Conn>,
}

/// How a control frame (heartbeat, abort) went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ControlSent {
    /// Out, or queued where it will go without anyone waiting.
    Sent,
    /// Not tried: the link's writer or socket was busy.
    Busy,
    /// The write failed (a link left half-written is shut down).
    Failed,
}

/// What moves one link's bytes.
pub(crate) trait LinkPlane: Send + Sync {
    /// Sends one data frame to `peer` (`header` with its pad chosen). An op
    /// past its `deadline`, or whose communicator was aborted, stops a
    /// frame none of which went out ([`LinkError::Unread`], or the abort)
    /// and the link stays; any other failure fails the link.
    fn send(
        &self,
        fabric: &dyn Fabric,
        peer: usize,
        header: &Header,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<(), LinkError>;

    /// Waits for the next frame of `inbox` (communicator `comm_id`, from
    /// `peer`) until `deadline`; an abort of the communicator or the
    /// link's failure ends the wait.
    fn recv(
        &self,
        fabric: &dyn Fabric,
        inbox: &Inbox,
        comm_id: u64,
        peer: usize,
        deadline: Instant,
    ) -> Result<Incoming, LinkError>;

    /// [`LinkPlane::recv`] for a frame known exactly (`expected`: its op,
    /// step and chunk) whose payload the caller copies into `dest` whole:
    /// a plane may place it there itself.
    #[allow(clippy::too_many_arguments)] // the receive's whole identity
    fn recv_into(
        &self,
        fabric: &dyn Fabric,
        inbox: &Inbox,
        comm_id: u64,
        peer: usize,
        expected: (u64, u32, u32),
        dest: &mut [u8],
        deadline: Instant,
    ) -> Result<Received, LinkError> {
        let _ = (expected, dest);
        self.recv(fabric, inbox, comm_id, peer, deadline)
            .map(Received::Frame)
    }

    /// Runs `body` with receives posted ahead into `region` (see
    /// [`crate::transport::Transport::with_posted_recvs`]); `None` (without
    /// calling `body`) where this plane receives each in its turn.
    #[allow(clippy::too_many_arguments)] // the receive's whole identity
    fn with_posted_recvs(
        &self,
        fabric: &dyn Fabric,
        inbox: &Inbox,
        comm_id: u64,
        peer: usize,
        region: &mut [u8],
        deadline: Instant,
        body: &mut dyn FnMut(&mut dyn PostedRecvs) -> Result<(), Error>,
    ) -> Option<Result<(), Error>> {
        let _ = (fabric, inbox, comm_id, peer, region, deadline, body);
        None
    }

    /// Sends a whole control frame (its bytes, padded): at once or not at
    /// all unless `wait`, then waiting for the link's writer. Never waits
    /// for the peer to read: a full socket is [`ControlSent::Busy`].
    fn send_control(&self, peer: usize, frame: &[u8], wait: bool) -> ControlSent;

    /// Shuts the link's connections down, which ends what is in flight.
    fn shut_down(&self);

    /// A send found the link's connection broken: shuts its writing side
    /// down and leaves the receiving side to read what the peer sent before
    /// (a peer that lives reads the end and closes too); the plane fails
    /// the link when its receiving side ends. A plane that cannot do this
    /// half shuts the whole link down.
    fn stop_sending(&self) {
        self.shut_down();
    }

    /// How many lanes each way beside the link carry large payloads
    /// (0018, 0034).
    fn lanes(&self) -> usize {
        0
    }

    /// What each lane this end writes has carried (empty without lanes).
    fn lane_stats(&self) -> Vec<crate::stats::LaneStats> {
        Vec::new()
    }

    /// What carries the link when it is not its socket's kind (`shm`).
    fn kind(&self) -> Option<&'static str> {
        None
    }

    /// The peer's arena, when the link passed one (`crate::arena`).
    fn peer_arena(&self) -> Option<Arc<ringwire_shm::Mapping>> {
        None
    }

    /// Rings the peer's doorbell (shared-memory links: a byte on the
    /// socket, never blocking).
    fn ring_doorbell(&self) {}

    /// The socket a thread sleeping for this link's doorbell polls.
    fn doorbell(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }

    /// What turns readable when the peer's process exits, for a sleeper
    /// to poll beside `doorbell` (shared-memory links: its pidfd).
    fn death_watch(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }

    /// Reads the doorbells the socket holds and notices the peer's end
    /// (then files what the link holds, unless another thread reads it).
    fn hear_doorbell(&self, fabric: &dyn Fabric) {
        let _ = fabric;
    }
}

/// Which plane a link gets; chosen before its handshake, whose socket
/// options and lanes depend on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PlaneKind {
    Portable,
    Uring,
    /// Shared memory, over a Unix link (the other plane where it cannot).
    Shm,
}

impl PlaneKind {
    /// Whether a link of this plane over `conn` may carry lanes (only TCP
    /// links of the engine gain from them; Unix links lost, decision 0018).
    pub(crate) fn takes_lanes(self, conn: ConnKind) -> bool {
        self == PlaneKind::Uring && conn == ConnKind::Tcp
    }

    /// Whether its Unix links want large socket buffers (decision 0015).
    pub(crate) fn large_unix_buffers(self) -> bool {
        self != PlaneKind::Portable
    }
}

/// Settings the planes share.
#[derive(Clone, Debug)]
pub(crate) struct PlaneConfig {
    /// A send blocked longer than this fails the link.
    pub(crate) write_timeout: Duration,
    /// How long a wait polls before it sleeps (RINGWIRE_SPIN_US).
    pub(crate) spin: Duration,
    /// Engine threads for the lanes, and their cores (decision 0036).
    pub(crate) engine_threads: usize,
    pub(crate) thread_cores: Vec<usize>,
    /// This host runs more ranks than it has cores.
    pub(crate) crowded: bool,
    /// Links run TLS: byte streams may hold bytes their socket does not.
    pub(crate) tls: bool,
    /// Links to ranks on this host run on shared memory where they can.
    pub(crate) shm: bool,
    /// How long making a link may take (the shared-memory offer included).
    pub(crate) handshake_timeout: Duration,
}

/// The planes of this process: what serves every link of each kind, and
/// which kind a new link gets.
pub(crate) struct Planes {
    config: PlaneConfig,
    /// The io_uring engine, when it runs.
    uring: Option<uring::Engine>,
    /// The shared-memory links, when local links use them.
    shm: Option<Arc<shm::ShmLinks>>,
}

impl Planes {
    /// Starts the planes for rank `me` among `world`: the engine when
    /// `use_uring` (and it starts; else a warning and the portable plane,
    /// unless `uring_required`).
    pub(crate) fn start(
        me: usize,
        world: usize,
        config: PlaneConfig,
        use_uring: bool,
        uring_required: bool,
    ) -> io::Result<Planes> {
        let uring = match use_uring {
            false => None,
            true => match uring::Engine::start(world, &config) {
                Ok(engine) => Some(engine),
                Err(e) if uring_required => return Err(e),
                Err(e) => {
                    tracing::warn!(
                        rank = me,
                        error = %e,
                        "the io_uring engine could not start (a ring could not be set up); \
                         running the portable transport"
                    );
                    None
                }
            },
        };
        let shm = config.shm.then(|| Arc::new(shm::ShmLinks::new(me)));
        Ok(Planes { config, uring, shm })
    }

    /// The plane a new link over `conn` gets. (One place decides; a
    /// shared-memory plane for local peers would be picked here.)
    pub(crate) fn kind_for(&self, conn: ConnKind) -> PlaneKind {
        match (conn, &self.shm, &self.uring) {
            (ConnKind::Unix, Some(_), _) => PlaneKind::Shm,
            (_, _, Some(_)) => PlaneKind::Uring,
            (_, _, None) => PlaneKind::Portable,
        }
    }

    /// The plane of a link to `peer` just established, started.
    pub(crate) fn make(
        &self,
        fabric: &Arc<dyn Fabric>,
        peer: usize,
        link: Established,
    ) -> io::Result<Box<dyn LinkPlane>> {
        link.conn.set_read_timeout(None)?;
        link.conn
            .set_write_timeout(Some(self.config.write_timeout))?;
        let mut link = link;
        if let (true, Some(links)) = (link.shm, &self.shm) {
            let timeout = self.config.handshake_timeout;
            match shm::start(links, fabric, peer, link, &self.config, timeout) {
                Ok(plane) => return Ok(plane),
                Err((back, e)) => {
                    tracing::debug!(peer, error = %e, "the link to a local peer stays a Unix socket");
                    link = back;
                    link.conn.set_read_timeout(None)?;
                }
            }
        }
        match &self.uring {
            Some(engine) => engine.add(fabric, peer, link, &self.config),
            None => portable::PortableLink::start(fabric, peer, link, &self.config),
        }
    }

    /// What each of the engine's threads has done (empty: none run).
    pub(crate) fn engine_thread_stats(&self) -> Vec<crate::stats::EngineThreadStats> {
        self.uring
            .as_ref()
            .map_or_else(Vec::new, uring::Engine::thread_stats)
    }

    /// A short name for logs: the plane links get.
    pub(crate) fn name(&self) -> &'static str {
        match self.uring {
            Some(_) => "uring",
            None => "portable",
        }
    }

    /// What wakes the planes' readers when a paused link may be read again.
    pub(crate) fn waker(&self) -> Wake {
        match &self.uring {
            Some(engine) => engine.waker(),
            None => Arc::new(|| {}),
        }
    }

    /// Moves what is queued and takes in what arrived, unless a waiting
    /// thread already does (the heartbeat thread's turn).
    pub(crate) fn tick(&self, fabric: &dyn Fabric) {
        if let Some(engine) = &self.uring {
            engine.tick(fabric);
        }
        if let Some(links) = &self.shm {
            links.tick(fabric);
        }
    }

    /// Files what waits in the shared-memory links nobody reads.
    pub(crate) fn drain_shm(&self, fabric: &dyn Fabric) {
        if let Some(links) = &self.shm {
            links.drain_all(fabric);
        }
    }

    /// This process's arena, if local links run on shared memory and it
    /// could be made.
    pub(crate) fn arena(&self) -> Option<Arc<crate::arena::Arena>> {
        self.shm.as_ref()?.arena()
    }

    /// The transport closes: the arena is unmapped here (a link made
    /// after this gets none).
    pub(crate) fn close(&self) {
        if let Some(links) = &self.shm {
            links.close();
        }
    }

    /// Marks an abort on the arena's abort word (ranks waiting on this
    /// one's arena lines look at their links at once).
    pub(crate) fn mark_abort(&self) {
        if let Some(arena) = self.arena() {
            arena.mark_abort();
        }
    }

    /// Sends what is queued, until `until` at most.
    pub(crate) fn flush(&self, until: Instant, fabric: &dyn Fabric) {
        if let Some(engine) = &self.uring {
            engine.flush(until, fabric);
        }
    }

    /// The calling thread stops waiting for now: it leaves no kernel work
    /// behind that would later run in it.
    pub(crate) fn release(&self, fabric: &dyn Fabric) {
        if let Some(engine) = &self.uring {
            engine.release(fabric);
        }
    }
}

/// Why a send that has not started should not: its communicator was
/// aborted, or its op's deadline passed (the peer did not read).
fn send_stop(fabric: &dyn Fabric, comm_id: u64, deadline: Instant) -> Option<LinkError> {
    fabric
        .aborted(comm_id)
        .or_else(|| (Instant::now() >= deadline).then_some(LinkError::Unread))
}

/// What ends a wait for a frame before any more waiting: an abort of the
/// communicator, the frame itself, the link's failure, or the deadline.
fn recv_ready(
    fabric: &dyn Fabric,
    inbox: &Inbox,
    comm_id: u64,
    peer: usize,
    deadline: Instant,
) -> Option<Result<Incoming, LinkError>> {
    if let Some(e) = fabric.aborted(comm_id) {
        return Some(Err(e));
    }
    if let Some(frame) = inbox.pop() {
        return Some(Ok(frame));
    }
    if let Some(loss) = fabric.failure(peer) {
        return Some(Err(LinkError::Lost(loss)));
    }
    (Instant::now() >= deadline).then_some(Err(LinkError::Timeout))
}

/// The error of an op whose link to `peer` failed with `failure` (as this
/// plane saw it): an abort of its communicator explains more, and else the
/// first failure recorded for the link.
fn lost(fabric: &dyn Fabric, comm_id: u64, peer: usize, failure: LinkFailure) -> LinkError {
    fabric.aborted(comm_id).unwrap_or_else(|| {
        LinkError::Lost(
            fabric
                .failure(peer)
                .unwrap_or_else(|| Loss::new(peer, failure)),
        )
    })
}
