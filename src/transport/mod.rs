//! Transports move frames between ranks. The executor only needs two calls:
//! send a frame to a peer (never blocking on that peer's progress: transports
//! buffer what arrives), and receive the next frame a peer sent on a given
//! communicator, with a deadline.
//!
//! One implementation serves: the [`mesh::Mesh`], a link per peer (TCP, or
//! a Unix socket to a rank on the same host), each with its data plane
//! (`plane/`: the portable one, or the io_uring engine). Its rooms, from
//! the top: `mesh` (the `Transport`: finds or dials a peer's link, picks
//! its plane), `dispatch` (every arriving frame), `control` (aborts,
//! heartbeats), `link/` (the peer table; dialing and accepting), `plane/`,
//! `inbox` (frames kept for ops, run-ahead gating), and below them
//! `framing`, `conn`, `run_ahead`, `pool` and `failure`.

pub(crate) mod conn;
mod control;
mod dispatch;
pub(crate) mod engine_cores;
mod framing;
mod inbox;
pub(crate) mod link;
pub(crate) mod mesh;
mod plane;
mod pool;
pub(crate) mod run_ahead;

use crate::arena::Arena;
use crate::error::Error;
use crate::error::link::{LinkFailure, Loss};
use crate::wire::Header;
use std::sync::Arc;
use std::time::Instant;

pub(crate) use ringwire_uring::AlignedBuf;

/// Where a rank is, as this one knows it, and which of its processes
/// links with this one.
#[derive(Clone, Debug)]
pub(crate) struct PeerPlace {
    /// Its TCP listener.
    pub(crate) addr: std::net::SocketAddr,
    /// Its Unix listener, for a peer on this host (same kernel and network
    /// namespace): dialed instead of TCP (decision 0009).
    pub(crate) local: Option<std::os::unix::net::SocketAddr>,
    /// The process of the rank this one links with: 0 at launch, one more
    /// for each replacement admitted (decision 0040). A hello from any
    /// other is refused.
    pub(crate) incarnation: u32,
}

/// One frame received from a peer.
pub(crate) struct Incoming {
    pub(crate) header: Header,
    pub(crate) payload: AlignedBuf,
}

/// What [`Transport::recv_into`] got.
pub(crate) enum Received {
    /// The payload is already in the destination; the frame's header.
    Placed(Header),
    /// The frame, in a buffer of its own (to copy, then recycle).
    Frame(Incoming),
}

/// Receives posted by [`Transport::with_posted_recvs`], and the region
/// they land in.
pub(crate) trait PostedRecvs {
    /// Posts the receive of frame `expected` (`seq`, `step`, `chunk`),
    /// whose `len`-byte payload goes at `offset`: from now on the caller
    /// must not touch those bytes until it takes the frame with `next`.
    /// Refused if the piece leaves the region or overlaps an untaken one.
    fn post(&mut self, expected: (u64, u32, u32), offset: usize, len: usize) -> Result<(), String>;
    /// Waits for the posted frame `expected`, posted with a `len`-byte
    /// payload at `offset`. Returns it as [`Transport::recv_into`] does,
    /// with its piece of the region (where a [`Received::Frame`] is to be
    /// copied).
    fn next(
        &mut self,
        expected: (u64, u32, u32),
        offset: usize,
        len: usize,
        deadline: Instant,
    ) -> Result<(Received, &mut [u8]), LinkError>;
    /// The `len` bytes at `offset` of the region, unless they leave it or
    /// overlap a piece posted and not yet taken.
    fn region(&mut self, offset: usize, len: usize) -> Option<&mut [u8]>;
}

/// Runs `body` with "posted" receives that are received only when taken.
pub(crate) fn in_turn<T: Transport + ?Sized>(
    transport: &T,
    comm_id: u64,
    peer: usize,
    region: &mut [u8],
    body: &mut dyn FnMut(&mut dyn PostedRecvs) -> Result<(), Error>,
) -> Result<(), Error> {
    body(&mut InTurn {
        transport,
        comm_id,
        peer,
        region,
    })
}

/// Posted receives of a transport that receives each only when asked.
struct InTurn<'a, T: ?Sized> {
    transport: &'a T,
    comm_id: u64,
    peer: usize,
    region: &'a mut [u8],
}

impl<T: Transport + ?Sized> PostedRecvs for InTurn<'_, T> {
    fn post(&mut self, _: (u64, u32, u32), _: usize, _: usize) -> Result<(), String> {
        Ok(())
    }

    fn next(
        &mut self,
        expected: (u64, u32, u32),
        offset: usize,
        len: usize,
        deadline: Instant,
    ) -> Result<(Received, &mut [u8]), LinkError> {
        let size = self.region.len();
        let Some(piece) = self.region.get_mut(offset..offset.saturating_add(len)) else {
            return Err(LinkError::Lost(Loss::new(
                self.peer,
                LinkFailure::Internal {
                    detail: format!(
                        "a posted receive of {len} bytes at {offset} leaves its {size}-byte region"
                    ),
                },
            )));
        };
        let received =
            self.transport
                .recv_into(self.comm_id, self.peer, expected, piece, deadline)?;
        Ok((received, piece))
    }

    fn region(&mut self, offset: usize, len: usize) -> Option<&mut [u8]> {
        self.region.get_mut(offset..offset.checked_add(len)?)
    }
}

/// Why a transport call failed. The executor adds the op context.
#[derive(Debug)]
pub(crate) enum LinkError {
    /// Nothing arrived before the deadline.
    Timeout,
    /// The peer did not take a frame this rank sends before the deadline
    /// (none of it went out; the link stays).
    Unread,
    /// The link is gone (closed, reset, silent, a bad frame), and why.
    Lost(Loss),
    /// Could not establish the link: where it was dialed (or waited for),
    /// the words, and the kind of failure.
    Connect {
        addr: String,
        detail: String,
        failure: LinkFailure,
    },
    /// Some rank aborted the communicator (`origin` is its world rank).
    Aborted {
        origin: usize,
        seq: u64,
        reason: String,
    },
}

pub(crate) use crate::locks::lock;

/// What the executor needs from a transport. Peers are world ranks.
pub(crate) trait Transport: Send + Sync {
    /// Sends one frame; `header.payload_len` must equal `payload.len()`.
    fn send(
        &self,
        peer: usize,
        header: &Header,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<(), LinkError>;
    /// The next data frame from `peer` on communicator `comm_id`.
    fn recv(&self, comm_id: u64, peer: usize, deadline: Instant) -> Result<Incoming, LinkError>;
    /// Like `recv`, for a frame the caller knows exactly (its op `seq`,
    /// `step` and `chunk`) and will copy into `dest` whole: a transport may
    /// receive the payload straight into `dest` instead (the uring plane
    /// does when the frame has not arrived yet), saving a copy. The caller
    /// checks the header either way.
    fn recv_into(
        &self,
        comm_id: u64,
        peer: usize,
        expected: (u64, u32, u32),
        dest: &mut [u8],
        deadline: Instant,
    ) -> Result<Received, LinkError> {
        let _ = (expected, dest);
        self.recv(comm_id, peer, deadline).map(Received::Frame)
    }
    /// Runs `body` with `region` lent for receives from `peer` that `body`
    /// posts ahead of their turn ([`PostedRecvs::post`]), so a transport may
    /// receive each straight into its piece while `body` does other work
    /// first (the uring plane does). `body` reaches the rest of the region
    /// through [`PostedRecvs::region`] and takes each posted frame with
    /// [`PostedRecvs::next`]; here each is received only then.
    fn with_posted_recvs(
        &self,
        comm_id: u64,
        peer: usize,
        region: &mut [u8],
        deadline: Instant,
        body: &mut dyn FnMut(&mut dyn PostedRecvs) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let _ = deadline;
        in_turn(self, comm_id, peer, region, body)
    }
    /// Returns a payload buffer for reuse.
    fn recycle(&self, buf: AlignedBuf);
    /// Fails every op of communicator `comm_id` on every reachable rank:
    /// marks it here and floods an abort to the peers, making links to
    /// those of its `members` (world ranks) it may dial and has none with.
    fn abort(&self, comm_id: u64, seq: u64, reason: &str, members: &[usize]);
    /// Where this rank accepts links.
    fn listen_addr(&self) -> std::net::SocketAddr;
    /// What carries the link to `peer` (`tcp`, `unix`), once it is up.
    fn link_kind(&self, peer: usize) -> Option<&'static str> {
        let _ = peer;
        None
    }
    /// How many lanes each way carry the large payloads of the link to
    /// `peer` (decisions 0018, 0034; 0: none, or no link yet).
    fn link_lanes(&self, peer: usize) -> usize {
        let _ = peer;
        0
    }
    /// What each engine thread of this process has done (empty: none run;
    /// decision 0036).
    fn engine_thread_stats(&self) -> Vec<crate::stats::EngineThreadStats> {
        Vec::new()
    }
    /// What each lane this rank writes to `peer` has carried (empty
    /// without lanes, or no link yet).
    fn link_lane_stats(&self, peer: usize) -> Vec<crate::stats::LaneStats> {
        let _ = peer;
        Vec::new()
    }
    /// This rank starts op `seq` of communicator `comm_id` (a collective;
    /// or, `from` a peer's world rank, its `seq`-th point-to-point receive
    /// from that peer): frames of that op no longer count as run ahead
    /// (decision 0019).
    fn begin(&self, comm_id: u64, seq: u64, from: Option<usize>) {
        let _ = (comm_id, seq, from);
    }
    /// Whether some rank aborted communicator `comm_id`: its world rank,
    /// op number and reason, as the abort frame said.
    fn abort_notice(&self, comm_id: u64) -> Option<(usize, u64, String)> {
        let _ = comm_id;
        None
    }
    /// Bytes peers have delivered for ops this rank has not started, now
    /// and at most so far (decision 0019).
    fn held_ahead(&self) -> (usize, usize) {
        (0, 0)
    }
    /// How many (communicator, peer) inboxes the transport keeps.
    fn inboxes(&self) -> usize {
        0
    }
    /// Communicator `comm_id` is gone on this rank: drop what it holds.
    fn forget(&self, comm_id: u64) {
        let _ = comm_id;
    }
    /// Communicator `inner` runs inside the ops of `outer` (decision
    /// 0033): an abort of `outer`, heard of already or later, aborts
    /// `inner` here too.
    fn nest(&self, outer: u64, inner: u64) {
        let _ = (outer, inner);
    }
    /// A short name for logs (`portable`, `uring`).
    fn name(&self) -> &'static str;
    /// The calling thread stops waiting on the transport for now (its ops
    /// are done): it must leave no kernel work behind that would later run
    /// in it (the uring plane withdraws the receives its turns posted).
    fn release(&self) {}
    /// This process's arena (shared memory for collectives native to it,
    /// `crate::arena`), where local links run on shared memory and it could
    /// be made.
    fn arena(&self) -> Option<Arc<Arena>> {
        None
    }
    /// The arena of `peer`, mapped, if the link to it (found, or dialed
    /// now) carries one.
    fn peer_arena(
        &self,
        peer: usize,
        comm_id: u64,
        deadline: Instant,
    ) -> Result<Option<Arc<ringwire_shm::Mapping>>, LinkError> {
        let _ = (peer, comm_id, deadline);
        Ok(None)
    }
    /// For a thread waiting on arena words: files what the shared-memory
    /// links hold (`deep`: also checks their sockets, as the heartbeat
    /// thread does), and says whether communicator `comm_id` was aborted.
    fn arena_poll(&self, comm_id: u64, deep: bool) -> Result<(), LinkError> {
        let _ = (comm_id, deep);
        Ok(())
    }
    /// Rings `peer`'s doorbell (a byte on its shared-memory link's socket):
    /// a rank sleeping on an arena word wakes.
    fn arena_ring(&self, peer: usize) {
        let _ = peer;
    }
    /// Sleeps until a link to one of `peers` rings (or carries anything,
    /// or closes), or `timeout` passes; then hears what their sockets say.
    fn arena_sleep(&self, peers: &[usize], timeout: std::time::Duration) {
        let _ = peers;
        std::thread::sleep(timeout);
    }
    /// Why the link to `peer` is gone, if it is.
    fn link_failure(&self, peer: usize) -> Option<LinkError> {
        let _ = peer;
        None
    }
    /// Whether `peer`'s process is alive, asked without making a link (one
    /// connection attempt and a probe handshake, within `deadline`): what
    /// a rank waiting for a lower rank's dial uses to tell "not yet" from
    /// "gone" (decision 0039).
    fn probe(&self, peer: usize, deadline: Instant) -> Result<(), LinkError> {
        let _ = (peer, deadline);
        Ok(())
    }
    /// A replacement takes `peer`'s place (decision 0040): the old
    /// process's link is forgotten (shut down if this rank still held it:
    /// the members decided that process is gone), and links from now on
    /// go to and come from the process at `place` only. Fails only if the
    /// transport closed.
    fn replace_peer(&self, peer: usize, place: PeerPlace) -> Result<(), LinkError> {
        let _ = place;
        Err(LinkError::Lost(Loss::new(
            peer,
            LinkFailure::TransportClosed,
        )))
    }
    /// Which process of `peer`'s rank links with this one (0 at launch).
    fn incarnation(&self, peer: usize) -> u32 {
        let _ = peer;
        0
    }
}
