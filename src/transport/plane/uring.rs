//! The io_uring plane: every link's sockets on one ring
//! (`ringwire_uring::FrameEngine`), driven by whichever thread waits, so no
//! reader threads and one wake-up per frame (decision 0007). Payloads the
//! caller expects land straight in its memory where they have not arrived
//! yet (decisions 0010, 0012).

use super::{
    ControlSent, Established, Fabric, LaneConns, LinkPlane, PlaneConfig, lost, recv_ready,
    send_stop,
};
use crate::error::Error;
use crate::error::link::{LinkFailure, Loss};
use crate::stats::LaneStats;
use crate::transport::conn::Conn;
use crate::transport::framing::padded_head;
use crate::transport::inbox::{Await, Inbox, Wake};
use crate::transport::{AlignedBuf, Incoming, LinkError, PostedRecvs, Received};
use crate::wire::{self, FrameKind, HEADER_LEN, Header};
use ringwire_uring::{
    EngineConfig, FrameEngine, FrameKey, FrameSink, LaneCounters, Lanes, LinkFault, PayloadAt,
    Placement, Placements, Sent, SharedFd,
};
use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Payloads (and lanes' pieces) from this size try SEND_ZC, once per
/// connection (a link's socket, each send lane): the kernel's report says
/// whether it sent in place, and connections where it copied (loopback,
/// veth, NICs without offload; every link here) send plainly from then on.
/// The kernel's MSG_ZEROCOPY notes put the break-even near 10 KB; this
/// stays above it because an in-place send completes only at the
/// notification (see decision 0007).
const ZERO_COPY_FROM: usize = 64 << 10;

/// Per-link staging buffer: frames up to this size (headers, small
/// messages, heartbeats) arrive many per receive; larger payloads are
/// received in place.
const STAGING_BYTES: usize = 64 << 10;

/// On a TCP link with one lane each way, frames whose payload is at least
/// this many bytes carry it on the lane (decision 0018): whole chunks of
/// the default size. Both ends must agree, so this is part of the protocol
/// (version 4), not a setting.
const LANE_FROM: usize = 1 << 20;

/// With more lanes, payloads from this size travel in pieces over them
/// (decision 0034): a piece per lane is worth its header once the link is
/// faster than one stream.
const LANES_FROM: usize = 256 << 10;

/// The laned-payload threshold of a link with `lanes` lanes each way.
fn lane_from(lanes: usize) -> usize {
    if lanes > 1 { LANES_FROM } else { LANE_FROM }
}

/// The process's engine (links are numbered by peer rank).
pub(super) struct Engine {
    engine: Arc<FrameEngine>,
}

impl Engine {
    pub(super) fn start(world: usize, config: &PlaneConfig) -> io::Result<Engine> {
        let engine = FrameEngine::new(EngineConfig {
            links: world,
            header_len: HEADER_LEN,
            frame_align: wire::FRAME_ALIGN,
            staging: STAGING_BYTES,
            zero_copy_from: Some(ZERO_COPY_FROM),
            zero_copy_always: false,
            spin: config.spin,
            max_lanes: usize::from(wire::MAX_LANES),
            engine_threads: config.engine_threads,
            thread_cores: config.thread_cores.clone(),
        })?;
        Ok(Engine {
            engine: Arc::new(engine),
        })
    }

    /// Hands an established link's sockets to the engine. The handshake
    /// read exactly its frames (no read-ahead), so the engine starts at a
    /// frame boundary; its byte streams were clones of the socket, dropped
    /// here, so the engine shares the one left (a TCP link with lanes
    /// holds three descriptors).
    pub(super) fn add(
        &self,
        fabric: &Arc<dyn Fabric>,
        peer: usize,
        link: Established,
        config: &PlaneConfig,
    ) -> io::Result<Box<dyn LinkPlane>> {
        let Established {
            conn,
            halves,
            lanes,
            ..
        } = link;
        drop(halves);
        let main: SharedFd = Arc::new(conn.into());
        let mut sockets = vec![main.clone()];
        let mut counters = None;
        match lanes {
            Some(LaneConns { send, recv }) => {
                for lane in send.iter().chain(&recv) {
                    lane.set_read_timeout(None)?;
                    lane.set_write_timeout(Some(config.write_timeout))?;
                }
                let shared = |conns: Vec<Conn>| -> Vec<SharedFd> {
                    conns.into_iter().map(|c| Arc::new(c.into())).collect()
                };
                let (send, recv) = (shared(send), shared(recv));
                sockets.extend(send.iter().chain(&recv).cloned());
                let from = lane_from(send.len());
                counters = Some(self.engine.add_link_with_lanes(
                    peer,
                    main,
                    Lanes { send, recv, from },
                ));
            }
            None => self.engine.add_link(peer, main),
        }
        fabric.heard(peer);
        self.engine.notify();
        Ok(Box::new(UringLink {
            engine: self.engine.clone(),
            sockets,
            counters,
            write_timeout: config.write_timeout,
        }))
    }

    /// What each engine thread has done.
    pub(super) fn thread_stats(&self) -> Vec<crate::stats::EngineThreadStats> {
        let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        self.engine
            .thread_counters()
            .iter()
            .map(|c| crate::stats::EngineThreadStats {
                core: load(&c.core).checked_sub(1).map(|core| core as usize),
                entries: load(&c.entries),
                bytes: load(&c.bytes),
                wakeups: load(&c.wakeups),
                cpu: Duration::from_nanos(load(&c.cpu_ns)),
            })
            .collect()
    }

    pub(super) fn waker(&self) -> Wake {
        let engine = self.engine.clone();
        Arc::new(move || engine.notify())
    }

    pub(super) fn tick(&self, fabric: &dyn Fabric) {
        let sink = Sink(fabric);
        self.engine.tick(&sink);
        self.engine.release(&sink);
    }

    pub(super) fn flush(&self, until: Instant, fabric: &dyn Fabric) {
        self.engine.flush(until, &Sink(fabric));
    }

    pub(super) fn release(&self, fabric: &dyn Fabric) {
        self.engine.release(&Sink(fabric));
    }
}

/// A link of the engine: the sockets it shares with it, kept to shut them
/// down (the link's, then its lanes).
struct UringLink {
    engine: Arc<FrameEngine>,
    sockets: Vec<SharedFd>,
    /// What its send lanes have carried, as the engine counts.
    counters: Option<LaneCounters>,
    write_timeout: Duration,
}

impl UringLink {
    /// Why a thread waiting for a frame to be placed should stop waiting,
    /// if it should.
    fn stop_waiting(
        fabric: &dyn Fabric,
        inbox: &Inbox,
        comm_id: u64,
        peer: usize,
        deadline: Instant,
    ) -> Option<StopWaiting> {
        if let Some(e) = fabric.aborted(comm_id) {
            return Some(StopWaiting::Failed(e));
        }
        if !inbox.is_empty() {
            return Some(StopWaiting::Queued);
        }
        if let Some(loss) = fabric.failure(peer) {
            return Some(StopWaiting::Failed(LinkError::Lost(loss)));
        }
        (Instant::now() >= deadline).then_some(StopWaiting::Failed(LinkError::Timeout))
    }

    /// What a placement's end means for the receive that waited for it.
    fn placed(
        &self,
        fabric: &dyn Fabric,
        inbox: &Inbox,
        comm_id: u64,
        peer: usize,
        deadline: Instant,
        placement: Placement<StopWaiting>,
    ) -> Result<Received, LinkError> {
        match placement {
            Placement::Placed(head) => Header::decode(&head[..HEADER_LEN], u32::MAX)
                .map(Received::Placed)
                .map_err(|e| LinkError::Lost(Loss::new(peer, LinkFailure::from(e)))),
            Placement::Stopped(StopWaiting::Queued) => self
                .recv(fabric, inbox, comm_id, peer, deadline)
                .map(Received::Frame),
            Placement::Stopped(StopWaiting::Failed(e)) => Err(e),
            // A peer that aborted and then exited: its abort came first on
            // the link and explains more than the closed connection.
            Placement::Failed(reason) => Err(lost(
                fabric,
                comm_id,
                peer,
                LinkFailure::Internal { detail: reason },
            )),
        }
    }
}

impl LinkPlane for UringLink {
    /// The engine writes the frame, and this thread drives it (or waits
    /// for the driver) until it is out. A frame stuck part way out fails
    /// the link after the write timeout.
    fn send(
        &self,
        fabric: &dyn Fabric,
        peer: usize,
        header: &Header,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<(), LinkError> {
        let give_up = Instant::now() + self.write_timeout;
        let mut on_stall = || fabric.failed(peer, LinkFailure::StoppedReading);
        let mut stop = || send_stop(fabric, header.comm_id, deadline);
        let (head, head_len) = padded_head(header);
        let result = self.engine.send(
            peer,
            &head[..head_len],
            payload,
            give_up,
            &mut on_stall,
            &Sink(fabric),
            deadline,
            &mut stop,
        );
        if !matches!(result, Sent::Stopped(_)) {
            fabric.sent(peer);
        }
        match result {
            Sent::Out => Ok(()),
            Sent::Stopped(e) => Err(e),
            Sent::Failed(e) => {
                let failure = LinkFailure::Io {
                    sending: true,
                    errno: None,
                    message: e,
                };
                fabric.failed(peer, failure.clone());
                // An abort, or else the first reason recorded, explains it.
                Err(lost(fabric, header.comm_id, peer, failure))
            }
        }
    }

    /// Waits for the frame, driving the engine whenever no other thread
    /// does.
    fn recv(
        &self,
        fabric: &dyn Fabric,
        inbox: &Inbox,
        comm_id: u64,
        peer: usize,
        deadline: Instant,
    ) -> Result<Incoming, LinkError> {
        let _waiting = fabric.inboxes().waiting_on(inbox, peer, Await::Inbox);
        let sink = Sink(fabric);
        loop {
            let seen = self.engine.generation();
            if let Some(done) = recv_ready(fabric, inbox, comm_id, peer, deadline) {
                return done;
            }
            self.engine.progress(seen, deadline, &sink);
        }
    }

    /// The engine places the payload in `dest` if the frame has not
    /// arrived yet; otherwise (or on failure) this is `recv`.
    fn recv_into(
        &self,
        fabric: &dyn Fabric,
        inbox: &Inbox,
        comm_id: u64,
        peer: usize,
        (seq, step, chunk): (u64, u32, u32),
        dest: &mut [u8],
        deadline: Instant,
    ) -> Result<Received, LinkError> {
        let mut stop = || Self::stop_waiting(fabric, inbox, comm_id, peer, deadline);
        if stop().is_some() {
            // Queued already, aborted, lost or late: `recv` says which.
            return self
                .recv(fabric, inbox, comm_id, peer, deadline)
                .map(Received::Frame);
        }
        let key = frame_key(comm_id, seq, step, chunk);
        let _waiting = fabric.inboxes().waiting_on(inbox, peer, Await::Placement);
        let placement =
            self.engine
                .receive_in_place(peer, key, dest, deadline, &Sink(fabric), &mut stop);
        self.placed(fabric, inbox, comm_id, peer, deadline, placement)
    }

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
        let _ = deadline; // each `next` has its own
        let sink = Sink(fabric);
        Some(
            self.engine
                .with_placements(peer, region, &sink, |placements| {
                    body(&mut PlacedAhead {
                        link: self,
                        fabric,
                        inbox,
                        comm_id,
                        peer,
                        placements,
                    })
                }),
        )
    }

    /// Queued, not awaited: this may run inside a driver's turn; the
    /// driver, or a flush, sends it.
    fn send_control(&self, peer: usize, frame: &[u8], _wait: bool) -> ControlSent {
        self.engine.send_owned(peer, frame.to_vec());
        self.engine.notify();
        ControlSent::Sent
    }

    /// The engine shut the writing side down itself when the send failed
    /// (`FrameEngine`'s sending stops, its receiving goes on).
    fn stop_sending(&self) {}

    fn shut_down(&self) {
        for socket in &self.sockets {
            let _ =
                nix::sys::socket::shutdown(socket.as_raw_fd(), nix::sys::socket::Shutdown::Both);
        }
    }

    fn lanes(&self) -> usize {
        (self.sockets.len() - 1) / 2
    }

    fn lane_stats(&self) -> Vec<LaneStats> {
        let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        self.counters
            .iter()
            .flat_map(|c| c.iter())
            .map(|c| LaneStats {
                bytes_sent: load(&c.bytes),
                pieces_sent: load(&c.pieces),
                unacked_bytes: load(&c.unacked),
                zero_copy_sends: load(&c.zero_copy_sends),
                copied_sends: load(&c.copied_sends),
                delivery_rate: load(&c.delivery_rate),
            })
            .collect()
    }
}

/// Receives posted ahead: the engine places each frame that arrives after
/// posting; one that came before is taken from the inbox.
struct PlacedAhead<'a, 's, 'r> {
    link: &'a UringLink,
    fabric: &'a dyn Fabric,
    inbox: &'a Inbox,
    comm_id: u64,
    peer: usize,
    placements: Placements<'s, 'r>,
}

impl PostedRecvs for PlacedAhead<'_, '_, '_> {
    fn post(
        &mut self,
        (seq, step, chunk): (u64, u32, u32),
        offset: usize,
        len: usize,
    ) -> Result<(), String> {
        let key = frame_key(self.comm_id, seq, step, chunk);
        self.placements.post(key, offset, len)
    }

    fn region(&mut self, offset: usize, len: usize) -> Option<&mut [u8]> {
        self.placements.region_mut(offset, len)
    }

    fn next(
        &mut self,
        (seq, step, chunk): (u64, u32, u32),
        offset: usize,
        len: usize,
        deadline: Instant,
    ) -> Result<(Received, &mut [u8]), LinkError> {
        let (fabric, inbox) = (self.fabric, self.inbox);
        let (comm_id, peer) = (self.comm_id, self.peer);
        let mut stop = || UringLink::stop_waiting(fabric, inbox, comm_id, peer, deadline);
        let key = frame_key(comm_id, seq, step, chunk);
        let _waiting = fabric.inboxes().waiting_on(inbox, peer, Await::Placement);
        let (placement, piece) = self.placements.take(key, offset, len, deadline, &mut stop);
        let received = self
            .link
            .placed(fabric, inbox, comm_id, peer, deadline, placement)?;
        Ok((received, piece))
    }
}

/// One data frame's identity: communicator, op, schedule position.
fn frame_key(comm_id: u64, seq: u64, step: u32, chunk: u32) -> FrameKey {
    [comm_id, seq, (u64::from(step) << 32) | u64::from(chunk)]
}

/// Why a receive in place stopped waiting.
enum StopWaiting {
    /// The frame is in the inbox (it arrived before the request).
    Queued,
    Failed(LinkError),
}

/// The engine hands frames to the transport through this, whichever thread
/// drives it.
struct Sink<'a>(&'a dyn Fabric);

impl FrameSink for Sink<'_> {
    fn payload(&self, peer: usize, head: &[u8]) -> Result<PayloadAt, String> {
        match self.0.header(peer, head) {
            Ok(header) => Ok(PayloadAt {
                pad: usize::from(header.pad),
                len: header.payload_len_usize(),
            }),
            Err(failure) => {
                // Recorded with its type first; the engine then fails the
                // link with the words, which changes nothing.
                let words = Loss::new(peer, failure.clone()).to_string();
                self.0.failed(peer, failure);
                Err(words)
            }
        }
    }

    fn buffer(&self) -> AlignedBuf {
        self.0.inboxes().buffer()
    }

    fn frame(&self, peer: usize, head: &[u8], payload: AlignedBuf) {
        // `payload` accepted this header already.
        match Header::decode(head, u32::MAX) {
            Ok(header) => self.0.arrived(peer, header, payload, false),
            Err(_) => self.0.inboxes().recycle(payload),
        }
    }

    fn paused(&self, peer: usize) -> bool {
        self.0.inboxes().paused(peer)
    }

    fn frame_key(&self, _peer: usize, head: &[u8]) -> Option<FrameKey> {
        let h = Header::decode(head, u32::MAX).ok()?;
        (h.kind == FrameKind::Data).then(|| frame_key(h.comm_id, h.seq, h.step, h.chunk))
    }

    fn link_failed(&self, peer: usize, fault: LinkFault) {
        let failure = match fault {
            LinkFault::Closed => LinkFailure::Closed,
            LinkFault::Io(e) => LinkFailure::of_io(&e, false),
            LinkFault::BadFrame(reason) => LinkFailure::Internal { detail: reason },
        };
        self.0.failed(peer, failure);
    }
}
