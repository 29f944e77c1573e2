//! The TCP transports: one TCP connection per pair of ranks that talk.
//! Two data planes share everything else here (dialing, handshakes,
//! heartbeats, aborts, inboxes): the portable one (plain blocking sockets,
//! one reader thread per connection) and the uring one (every socket on one
//! io_uring, `ringwire_uring::FrameEngine`, driven by the thread that waits:
//! no reader threads, one wake-up per frame).
//!
//! Connections are made on demand, always by the lower rank dialing the
//! higher: every schedule is symmetric (when rank a needs b in an op, b needs
//! a in the same op), so the higher rank simply waits for the dial. One
//! connection carries every communicator of the process (frames name their
//! communicator), and the reader thread (or the engine) files each frame
//! into the inbox of (communicator, peer). Receiving never stops while a
//! rank waits (the engine keeps a receive posted on every link and whoever
//! waits drives it), so a send never waits for the peer's executor: this is
//! what lets each rank run its schedule strictly in order without deadlock.

use super::conn::{Conn, ConnKind};
use super::open_files;
use super::run_ahead::RunAhead;
use super::{AlignedBuf, Incoming, LinkError, PostedRecvs, Received, Transport};
use crate::error::Error;
use crate::refusals::{self, Place, Reason};
use crate::security::secret::{self, NONCE_LEN, Role};
use crate::security::{self, Opening, Security};
use crate::wire::handshake::security_mismatch;
use crate::wire::{self, Channel, FrameKind, HEADER_LEN, Header, Hello, HelloAck, OpKind};
use ringwire_uring::{
    EngineConfig, FrameEngine, FrameKey, FrameSink, Lanes, LinkFault, PayloadAt, Placement,
    Placements, Sent, SharedFd,
};
use std::collections::{HashMap, VecDeque};
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Settings of the portable transport.
#[derive(Clone, Debug)]
pub(crate) struct TcpConfig {
    /// Largest data payload a peer may announce (bytes).
    pub(crate) max_payload: u32,
    /// How long a new connection may take to say hello.
    pub(crate) handshake_timeout: Duration,
    /// A send blocked longer than this fails (the peer stopped reading).
    pub(crate) write_timeout: Duration,
    /// SO_SNDBUF / SO_RCVBUF; `None` keeps the kernel's autotuning, which
    /// on Linux grows further than an explicit size capped by wmem_max
    /// (but the engine's Unix links get one: `conn::ENGINE_UNIX_SOCKET_BUFFER`);
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
    /// Dial TCP links with lanes when the engine runs (decision 0018).
    pub(crate) lanes: bool,
    /// Bytes a peer may deliver for ops this rank has not started before
    /// its link stops being read (0: never stop; decision 0019).
    pub(crate) run_ahead_limit: usize,
    /// The same over all peers together (0: no total limit).
    pub(crate) run_ahead_total_limit: usize,
}

enum PeerState {
    Absent,
    Dialing,
    Ready(Arc<Link>),
    Failed(String),
}

/// The byte streams of one established link: plain TCP, or a TLS session
/// over it (see `crate::security`). The reader belongs to the link's reader
/// thread; the writer is shared by every executor sending on the link.
pub(crate) type LinkReader = Box<dyn Read + Send>;
pub(crate) type LinkWriter = Box<dyn Write + Send>;
/// Both streams of a link, as the handshake hands them to `install`.
type LinkHalves = (LinkReader, LinkWriter);

struct Link {
    kind: ConnKind,
    plane: LinkPlane,
}

/// How a link's bytes move, and what the transport keeps of its sockets.
enum LinkPlane {
    /// A reader thread owns a clone of the socket; executors share the
    /// writer; `control` is kept for shutdown.
    Portable {
        writer: Mutex<LinkWriter>,
        control: Conn,
    },
    /// The engine moves every byte. These are the sockets it shares (the
    /// link's, then its lanes, decision 0018), kept to shut them down: no
    /// duplicate descriptors, so a TCP link with lanes holds three.
    Engine { sockets: Vec<SharedFd> },
}

impl Link {
    /// Shuts every connection of the link down, which ends what is in
    /// flight on them.
    fn shut_down(&self) {
        match &self.plane {
            LinkPlane::Portable { control, .. } => {
                let _ = control.shutdown(Shutdown::Both);
            }
            LinkPlane::Engine { sockets } => {
                for socket in sockets {
                    let _ = nix::sys::socket::shutdown(
                        socket.as_raw_fd(),
                        nix::sys::socket::Shutdown::Both,
                    );
                }
            }
        }
    }

    /// Sets a portable-plane link's socket write timeout (its writer's
    /// socket is the same one).
    fn set_write_timeout(&self, timeout: Duration) {
        if let LinkPlane::Portable { control, .. } = &self.plane {
            let _ = control.set_write_timeout(Some(timeout));
        }
    }

    /// Whether a portable-plane link's socket takes a few bytes now
    /// without blocking (engine links: always; the engine never blocks).
    fn writable_now(&self) -> bool {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        match &self.plane {
            LinkPlane::Portable { control, .. } => {
                let mut fds = [PollFd::new(control.as_fd(), PollFlags::POLLOUT)];
                matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
            }
            LinkPlane::Engine { .. } => true,
        }
    }

    /// The shared writer of a portable-plane link; engine links send
    /// through the engine.
    fn writer(&self) -> Option<&Mutex<LinkWriter>> {
        match &self.plane {
            LinkPlane::Portable { writer, .. } => Some(writer),
            LinkPlane::Engine { .. } => None,
        }
    }

    fn has_lanes(&self) -> bool {
        matches!(&self.plane, LinkPlane::Engine { sockets } if sockets.len() > 1)
    }
}

/// A link's lanes as one end sees them: the one it writes, the one it reads.
struct LaneConns {
    send: Conn,
    recv: Conn,
}

struct Inbox {
    queue: Mutex<VecDeque<Incoming>>,
    arrived: Condvar,
    /// The highest collective op of this communicator begun here (shared
    /// by the communicator's inboxes), and the highest point-to-point
    /// receive from this peer: frames up to them are not run ahead
    /// (decision 0019), which a reader learns without a lock.
    begun: Arc<AtomicU64>,
    begun_p2p: AtomicU64,
    /// Threads waiting for a frame of this inbox.
    waiters: AtomicUsize,
}

struct Shared {
    me: usize,
    world: usize,
    job_id: u64,
    addrs: Vec<SocketAddr>,
    config: TcpConfig,
    peers: Mutex<Vec<PeerState>>,
    peers_changed: Condvar,
    inboxes: Mutex<HashMap<(u64, usize), Arc<Inbox>>>,
    pool: Mutex<Pool>,
    closing: AtomicBool,
    /// Communicators some rank aborted: comm id -> what it said.
    aborted: Mutex<HashMap<u64, AbortNote>>,
    /// Set once `aborted` has an entry: every op checks for an abort
    /// several times, and while none happened (nearly always) that costs
    /// one load instead of a lock.
    any_aborted: AtomicBool,
    /// Milliseconds since `epoch` of the last frame sent to / read from each peer.
    last_send: Vec<AtomicU64>,
    last_recv: Vec<AtomicU64>,
    epoch: Instant,
    /// Handshakes in progress; capped so a flood of connections cannot
    /// spawn unbounded threads.
    handshakes: AtomicUsize,
    /// Peers on this host (same kernel and network namespace) that accept
    /// on a Unix socket: its address, dialed instead of TCP (decision 0009).
    local_peers: Vec<Option<UnixAddr>>,
    /// The uring data plane, if it runs (links are numbered by peer rank).
    engine: Option<FrameEngine>,
    /// Links accepted with lanes, waiting for them: peer -> the lane from
    /// the dialer and the lane to it, as they arrive.
    pending_lanes: Mutex<HashMap<usize, [Option<Conn>; 2]>>,
    lanes_arrived: Condvar,
    /// What each peer delivered for ops not started yet (decision 0019).
    run_ahead: Mutex<RunAhead>,
    /// Signalled when a peer's link may be read again (portable readers
    /// wait on it).
    run_ahead_changed: Condvar,
    /// Per peer: over the run-ahead limit (kept with `run_ahead`).
    over: Vec<AtomicBool>,
    /// Per peer: its link failed. Frames its reader still files then do
    /// not count as run ahead (`fail` released what it held).
    dead: Vec<AtomicBool>,
    /// Frames `run_ahead` holds, readable without its lock.
    held_frames: AtomicUsize,
    /// Each communicator's highest collective op begun (see `Inbox::begun`).
    comm_begun: Mutex<HashMap<u64, Arc<AtomicU64>>>,
    /// Per peer: threads waiting for a frame of it to be placed in their
    /// memory (those waiting on an inbox are counted there). Either kind
    /// keeps a paused link read until its frame is in: it may sit behind
    /// held ones.
    placing: Vec<AtomicUsize>,
    /// Per peer: threads waiting for a frame of it (inbox or placement).
    /// The portable plane's reader polls its socket while any does.
    awaited: Vec<AtomicUsize>,
}

/// An abort as first heard of by this rank.
#[derive(Clone, Debug)]
struct AbortNote {
    origin: usize,
    seq: u64,
    reason: String,
    /// Set once the abort has been written to every peer (or failed to).
    forwarded: Arc<(Mutex<bool>, Condvar)>,
}

/// At most this many connections may be mid-handshake at once.
const MAX_PENDING_HANDSHAKES: usize = 128;

/// Received payload buffers kept for reuse, in bytes. In steady state a
/// rank holds at most what a peer can send ahead of it (an op's frames from
/// each peer), so with this much pooled receiving allocates nothing; beyond
/// it buffers are freed, which bounds resident memory.
const POOL_BYTES: usize = 256 << 20;

/// Payload buffers for reuse (see `POOL_BYTES`).
#[derive(Default)]
struct Pool {
    bufs: Vec<AlignedBuf>,
    bytes: usize,
}

/// Payloads from this size try SEND_ZC on the uring plane, once per link:
/// the kernel's report says whether it sent in place, and links where it
/// copied (loopback, veth, NICs without offload; every link here) send
/// plainly from then on. The kernel's MSG_ZEROCOPY notes put the break-even
/// near 10 KB; this stays above it because an in-place send completes only
/// at the notification (see decision 0007).
const ZERO_COPY_FROM: usize = 64 << 10;

/// Per-link staging buffer of the uring plane: frames up to this size
/// (headers, small messages, heartbeats) arrive many per receive; larger
/// payloads are received in place.
const STAGING_BYTES: usize = 64 << 10;

/// On a TCP link with lanes, frames whose payload is at least this many
/// bytes carry it on a lane (decision 0018): whole chunks of the default
/// size. Both ends must agree, so this is part of the protocol (version 3),
/// not a setting.
const LANE_FROM: usize = 1 << 20;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The handle communicators hold. Dropping the last one closes every link
/// and stops the threads.
pub(crate) struct TcpTransport {
    shared: Arc<Shared>,
    local_addr: SocketAddr,
    /// Where the Unix listener for local peers is, if one runs.
    local_addr_unix: Option<UnixAddr>,
}

impl TcpTransport {
    /// Starts accepting on `listener` (already bound and published).
    pub(crate) fn start(
        listener: TcpListener,
        local: Option<LocalPeers>,
        me: usize,
        job_id: u64,
        addrs: Vec<SocketAddr>,
        config: TcpConfig,
    ) -> io::Result<TcpTransport> {
        let (local_listener, local_peers) = match local {
            Some(l) => (Some(l.listener), l.peers),
            None => (None, vec![None; addrs.len()]),
        };
        let local_addr = listener.local_addr()?;
        let world = addrs.len();
        open_files::make_room_for_links(me, world);
        let engine = match config.uring {
            false => None,
            true => match FrameEngine::new(EngineConfig {
                links: world,
                header_len: HEADER_LEN,
                frame_align: wire::FRAME_ALIGN,
                staging: STAGING_BYTES,
                zero_copy_from: Some(ZERO_COPY_FROM),
                spin: config.spin,
                lane_from: LANE_FROM,
            }) {
                Ok(engine) => Some(engine),
                Err(e) if config.uring_required => return Err(e),
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
        let (run_ahead_limit, run_ahead_total) =
            (config.run_ahead_limit, config.run_ahead_total_limit);
        let shared = Arc::new(Shared {
            me,
            world,
            job_id,
            addrs,
            config,
            peers: Mutex::new((0..world).map(|_| PeerState::Absent).collect()),
            peers_changed: Condvar::new(),
            inboxes: Mutex::new(HashMap::new()),
            pool: Mutex::new(Pool::default()),
            closing: AtomicBool::new(false),
            aborted: Mutex::new(HashMap::new()),
            any_aborted: AtomicBool::new(false),
            last_send: (0..world).map(|_| AtomicU64::new(0)).collect(),
            last_recv: (0..world).map(|_| AtomicU64::new(0)).collect(),
            epoch: Instant::now(),
            handshakes: AtomicUsize::new(0),
            local_peers,
            engine,
            pending_lanes: Mutex::new(HashMap::new()),
            lanes_arrived: Condvar::new(),
            run_ahead: Mutex::new(RunAhead::new(world, run_ahead_limit, run_ahead_total)),
            run_ahead_changed: Condvar::new(),
            over: (0..world).map(|_| AtomicBool::new(false)).collect(),
            dead: (0..world).map(|_| AtomicBool::new(false)).collect(),
            held_frames: AtomicUsize::new(0),
            comm_begun: Mutex::new(HashMap::new()),
            placing: (0..world).map(|_| AtomicUsize::new(0)).collect(),
            awaited: (0..world).map(|_| AtomicUsize::new(0)).collect(),
        });
        let s = shared.clone();
        std::thread::Builder::new()
            .name(format!("ringwire-accept-{me}"))
            .spawn(move || accept_loop(&s, || listener.accept().map(|(c, _)| Conn::Tcp(c))))?;
        let local_addr_unix = match local_listener {
            Some(l) => {
                let addr = l.local_addr()?;
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("ringwire-accept-local-{me}"))
                    .spawn(move || accept_loop(&s, || l.accept().map(|(c, _)| Conn::Unix(c))))?;
                Some(addr)
            }
            None => None,
        };
        let s = shared.clone();
        std::thread::Builder::new()
            .name(format!("ringwire-heartbeat-{me}"))
            .spawn(move || heartbeat_loop(&s))?;
        Ok(TcpTransport {
            shared,
            local_addr,
            local_addr_unix,
        })
    }
}

/// A Unix listener for peers on this host, and which peers are (their
/// listeners' addresses); see decision 0009.
pub(crate) struct LocalPeers {
    pub(crate) listener: UnixListener,
    pub(crate) peers: Vec<Option<UnixAddr>>,
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        let s = &self.shared;
        s.closing.store(true, Ordering::SeqCst);
        // Wake the accept loops so they see `closing`.
        let _ = TcpStream::connect_timeout(&self.local_addr, Duration::from_millis(200));
        if let Some(addr) = &self.local_addr_unix {
            let _ = UnixStream::connect_addr(addr);
        }
        let peers = std::mem::take(&mut *lock(&s.peers));
        for p in peers {
            if let PeerState::Ready(link) = p {
                link.shut_down();
            }
        }
        s.peers_changed.notify_all();
    }
}

impl Shared {
    /// Sends every abort this rank knows of to `peer`'s link, just made
    /// ready. Aborts are flooded once, to the links ready at that moment, so
    /// a link made later (the peer dials only now) hears them here. Called
    /// after the link is registered: an abort recorded after this snapshot
    /// finds the link in `ready_links` and is flooded to it, one recorded
    /// before is in the snapshot (the receiver ignores a second copy).
    fn replay_aborts(&self, peer: usize, link: &Link) {
        let known: Vec<Vec<u8>> = lock(&self.aborted)
            .iter()
            .map(|(comm, n)| {
                let abort = wire::Abort::new(n.origin as u32, n.seq, n.reason.clone());
                wire::encode_abort(*comm, n.seq, &abort)
            })
            .collect();
        if known.is_empty() {
            return;
        }
        if let Some(engine) = &self.engine {
            for frame in known {
                engine.send_owned(peer, frame);
            }
            engine.notify();
            return;
        }
        // Engine links were served above.
        let Some(writer) = link.writer() else { return };
        let mut w = lock(writer);
        for frame in known {
            if let Err(e) = w.write_all(&frame).and_then(|()| w.flush()) {
                tracing::debug!(rank = self.me, peer, error = %e, "could not replay an abort");
                return;
            }
        }
    }

    /// The error for ops of an aborted communicator.
    fn aborted_error(&self, comm_id: u64) -> Option<LinkError> {
        if !self.any_aborted.load(Ordering::Acquire) {
            return None;
        }
        lock(&self.aborted)
            .get(&comm_id)
            .map(|a| LinkError::Aborted {
                origin: a.origin,
                seq: a.seq,
                reason: a.reason.clone(),
            })
    }

    /// This rank's listeners in the refusal ledger.
    fn place(&self) -> Place {
        Place::Link {
            rank: self.me,
            port: self.addrs.get(self.me).map_or(0, SocketAddr::port),
        }
    }

    /// Every established link, with its peer.
    fn ready_links(&self) -> Vec<(usize, Arc<Link>)> {
        lock(&self.peers)
            .iter()
            .enumerate()
            .filter_map(|(p, st)| match st {
                PeerState::Ready(l) => Some((p, l.clone())),
                _ => None,
            })
            .collect()
    }

    /// Wakes every receive waiting on an inbox `(comm, peer)` that matches,
    /// so it re-checks for failures and aborts.
    fn wake_inboxes(&self, matches: impl Fn(u64, usize) -> bool) {
        let inboxes: Vec<_> = lock(&self.inboxes)
            .iter()
            .filter(|((c, p), _)| matches(*c, *p))
            .map(|(_, i)| i.clone())
            .collect();
        for inbox in inboxes {
            // Taking the lock orders the wake-up after a waiter's check.
            let _guard = lock(&inbox.queue);
            inbox.arrived.notify_all();
        }
        if let Some(engine) = &self.engine {
            engine.notify();
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Records an abort of communicator `comm_id` (from `from`, or from this
    /// rank when `None`), wakes every op of that communicator, and floods the
    /// abort to every other linked peer once, so it reaches ranks that are
    /// not neighbours of the failure.
    fn on_abort(&self, from: Option<usize>, comm_id: u64, abort: wire::Abort) {
        let forwarded = Arc::new((Mutex::new(false), Condvar::new()));
        {
            let mut aborted = lock(&self.aborted);
            if aborted.contains_key(&comm_id) {
                return;
            }
            self.any_aborted.store(true, Ordering::Release);
            aborted.insert(
                comm_id,
                AbortNote {
                    origin: abort.origin_rank as usize,
                    seq: abort.seq,
                    reason: abort.reason.clone(),
                    forwarded: forwarded.clone(),
                },
            );
        }
        let mark_forwarded = move || {
            *lock(&forwarded.0) = true;
            forwarded.1.notify_all();
        };
        tracing::debug!(
            rank = self.me,
            comm_id,
            origin = abort.origin_rank,
            seq = abort.seq,
            "abort"
        );
        self.peers_changed.notify_all();
        self.wake_inboxes(|c, _| c == comm_id);
        // Forward from a separate thread: a writer blocked on a stopped peer
        // must not stall this reader (or the caller).
        let mut links = self.ready_links();
        links.retain(|(p, _)| Some(*p) != from);
        if links.is_empty() {
            mark_forwarded();
            return;
        }
        let frame = wire::encode_abort(comm_id, abort.seq, &abort);
        if let Some(engine) = &self.engine {
            // Queued, not awaited: this may run inside a driver's turn.
            // `wait_forwarded` flushes.
            for (peer, _) in links {
                engine.send_owned(peer, frame.clone());
            }
            engine.notify();
            mark_forwarded();
            return;
        }
        let me = self.me;
        // A TLS writer may have put part of a record out while reporting
        // nothing written (see `portable_send`).
        let plain = self.config.security.tls.is_none();
        let spawned = std::thread::Builder::new()
            .name(format!("ringwire-abort-{me}"))
            .spawn(move || {
                // A write that fails after part of the frame went out
                // tears the link, so it is shut down (its reader then
                // reports it lost); one that put nothing out leaves it.
                let write = |peer: usize, link: &Link, w: &mut LinkWriter| {
                    let mut written = 0;
                    let result = write_counted(&mut **w, &frame, &mut written);
                    if let Err(e) = result.and_then(|()| w.flush()) {
                        tracing::debug!(rank = me, peer, error = %e, "could not forward abort");
                        if written > 0 || !plain {
                            link.shut_down();
                        }
                    }
                };
                // Links whose writer is free and whose socket takes the
                // frame at once first: one blocked behind a peer that
                // stopped reading must not keep the rest from hearing.
                let mut busy = Vec::new();
                for (peer, link) in links {
                    let Some(writer) = link.writer() else {
                        continue;
                    };
                    let written = match writer.try_lock() {
                        Ok(mut w) if link.writable_now() => {
                            write(peer, &link, &mut w);
                            true
                        }
                        _ => false,
                    };
                    if !written {
                        busy.push((peer, link));
                    }
                }
                mark_forwarded();
                for (peer, link) in busy {
                    if let Some(writer) = link.writer() {
                        write(peer, &link, &mut lock(writer));
                    }
                }
            });
        if spawned.is_err() {
            tracing::warn!(rank = me, "could not start a thread to forward an abort");
        }
    }

    /// Waits (at most `limit`) until the abort of `comm_id` has been written
    /// to every peer: a program that exits right after its op failed must
    /// still warn the others first.
    fn wait_forwarded(&self, comm_id: u64, limit: Duration) {
        if let Some(engine) = &self.engine {
            engine.flush(Instant::now() + limit, self);
            engine.release(self);
        }
        let Some(flag) = lock(&self.aborted)
            .get(&comm_id)
            .map(|n| n.forwarded.clone())
        else {
            return;
        };
        let deadline = Instant::now() + limit;
        let mut done = lock(&flag.0);
        while !*done {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            done = flag
                .1
                .wait_timeout(done, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn inbox(&self, comm_id: u64, peer: usize) -> Arc<Inbox> {
        lock(&self.inboxes)
            .entry((comm_id, peer))
            .or_insert_with(|| {
                Arc::new(Inbox {
                    queue: Mutex::new(VecDeque::new()),
                    arrived: Condvar::new(),
                    begun: self.comm_begun(comm_id),
                    begun_p2p: AtomicU64::new(0),
                    waiters: AtomicUsize::new(0),
                })
            })
            .clone()
    }

    /// The inbox a frame for `comm_id` from `peer` goes to, made if needed,
    /// unless that communicator was dropped here: a late frame for it must
    /// not make its inbox (and count) again, to be kept for nobody. Checked
    /// under the ledger's lock, which `forget` marks the communicator under
    /// before it removes the inboxes.
    fn inbox_for_frame(&self, comm_id: u64, peer: usize) -> Option<Arc<Inbox>> {
        if let Some(inbox) = lock(&self.inboxes).get(&(comm_id, peer)) {
            return Some(inbox.clone());
        }
        let ahead = lock(&self.run_ahead);
        (!ahead.is_forgotten(comm_id)).then(|| self.inbox(comm_id, peer))
    }

    fn comm_begun(&self, comm_id: u64) -> Arc<AtomicU64> {
        lock(&self.comm_begun).entry(comm_id).or_default().clone()
    }

    /// Files a data frame from `peer` in its inbox (waking a portable
    /// receive sleeping on it if `wake`) and counts it if its op has not
    /// begun here (decision 0019).
    fn file(&self, peer: usize, header: Header, payload: AlignedBuf, wake: bool) {
        let (comm_id, seq, bytes) = (header.comm_id, header.seq, payload.len());
        let p2p = header.op == OpKind::SendRecv;
        let Some(inbox) = self.inbox_for_frame(comm_id, peer) else {
            // Its communicator is gone here: nobody will take it.
            return self.recycle_buf(payload);
        };
        let begun = || match p2p {
            true => inbox.begun_p2p.load(Ordering::SeqCst),
            false => inbox.begun.load(Ordering::SeqCst),
        };
        let put = |incoming| {
            lock(&inbox.queue).push_back(incoming);
            if wake {
                inbox.arrived.notify_one();
            }
        };
        if seq <= begun() {
            // The op runs here: the usual case, and lock-free.
            return put(Incoming { header, payload });
        }
        let mut ahead = lock(&self.run_ahead);
        // Counted before looking again, so a `begin` that raised `begun`
        // meanwhile either is seen here or sees the count and takes the
        // lock to release the frame.
        self.held_frames.fetch_add(1, Ordering::SeqCst);
        if seq <= begun() {
            self.held_frames.fetch_sub(1, Ordering::SeqCst);
            return put(Incoming { header, payload });
        }
        if ahead.is_forgotten(comm_id) {
            // Its communicator is gone here: nobody will take it.
            self.held_frames.fetch_sub(1, Ordering::SeqCst);
            drop(ahead);
            return self.recycle_buf(payload);
        }
        if self.dead[peer].load(Ordering::SeqCst) {
            // Drained from a failed link: kept for whoever reads it, but
            // it holds nobody back.
            self.held_frames.fetch_sub(1, Ordering::SeqCst);
            drop(ahead);
            return put(Incoming { header, payload });
        }
        put(Incoming { header, payload });
        let (limit, total_limit) = (ahead.limit(), ahead.total_limit());
        ahead.filed(comm_id, peer, seq, p2p, bytes, |p| {
            if !self.over[p].swap(true, Ordering::SeqCst) {
                tracing::debug!(
                    rank = self.me,
                    peer = p,
                    limit,
                    total_limit,
                    "rank {p} ran ahead past a run-ahead limit (its own, or all peers' together): its link waits until this rank catches up"
                );
            }
        });
    }

    /// Communicator `comm_id` is gone here: its inboxes go, and frames
    /// peers sent ahead for it stop counting (and later ones are dropped).
    fn forget(&self, comm_id: u64) {
        self.release_held(|ahead, resumed| ahead.forget(comm_id, resumed));
        let mut gone = Vec::new();
        lock(&self.inboxes).retain(|&(c, _), inbox| {
            if c == comm_id {
                gone.push(inbox.clone());
            }
            c != comm_id
        });
        lock(&self.comm_begun).remove(&comm_id);
        for inbox in gone {
            let frames = std::mem::take(&mut *lock(&inbox.queue));
            for frame in frames {
                self.recycle_buf(frame.payload);
            }
        }
    }

    /// This rank begins op `seq` of `comm_id` (see `Transport::begin`).
    fn begin(&self, comm_id: u64, seq: u64, from: Option<usize>) {
        match from {
            Some(peer) => self
                .inbox(comm_id, peer)
                .begun_p2p
                .fetch_max(seq, Ordering::SeqCst),
            None => self.comm_begun(comm_id).fetch_max(seq, Ordering::SeqCst),
        };
        if self.held_frames.load(Ordering::SeqCst) == 0 {
            return;
        }
        self.release_held(|ahead, resumed| ahead.begin(comm_id, seq, from, resumed));
    }

    /// Runs `release` on the ledger (a `begin` or `forget`, which return
    /// how many frames stopped counting and call back each peer back under
    /// the limit), and reads those peers' links again.
    fn release_held(&self, release: impl FnOnce(&mut RunAhead, &mut dyn FnMut(usize)) -> usize) {
        let mut any = false;
        {
            let mut ahead = lock(&self.run_ahead);
            let released = release(&mut ahead, &mut |peer| {
                self.over[peer].store(false, Ordering::SeqCst);
                tracing::debug!(rank = self.me, peer, "caught up: reading its link again");
                any = true;
            });
            self.held_frames.fetch_sub(released, Ordering::SeqCst);
        }
        if any {
            self.resume_reading();
        }
    }

    /// Whether `peer`'s link is not read for now: it delivered more than the
    /// run-ahead limit for ops this rank has not started, and no thread
    /// here waits for a frame of it that has not arrived.
    fn paused(&self, peer: usize) -> bool {
        if !self
            .over
            .get(peer)
            .is_some_and(|o| o.load(Ordering::SeqCst))
            || self.closing.load(Ordering::SeqCst)
        {
            return false;
        }
        if self.placing[peer].load(Ordering::SeqCst) > 0 {
            return false; // served when it returns
        }
        // A waiter whose frame is in the inbox is served; its thread may
        // not have run yet, and reading on for it would let the peer run
        // ahead.
        !lock(&self.inboxes).iter().any(|(&(_, p), inbox)| {
            p == peer && inbox.waiters.load(Ordering::SeqCst) > 0 && lock(&inbox.queue).is_empty()
        })
    }

    /// Counts the calling thread as waiting for a frame of `peer` in
    /// `inbox` (or, `at` a placement, straight into its memory) until the
    /// guard drops; a paused link is read again until that frame is in.
    fn waiting_on<'a>(&'a self, inbox: &'a Inbox, peer: usize, at: Await) -> Waiting<'a> {
        inbox.waiters.fetch_add(1, Ordering::SeqCst);
        self.awaited[peer].fetch_add(1, Ordering::SeqCst);
        if at == Await::Placement {
            self.placing[peer].fetch_add(1, Ordering::SeqCst);
        }
        if self.over[peer].load(Ordering::SeqCst) {
            self.resume_reading();
        }
        Waiting {
            shared: self,
            inbox,
            peer,
            at,
        }
    }

    /// Wakes whatever reads links to re-check which are paused.
    fn resume_reading(&self) {
        {
            let _ahead = lock(&self.run_ahead);
            self.run_ahead_changed.notify_all();
        }
        if let Some(engine) = &self.engine {
            engine.notify();
        }
    }

    /// Portable plane, after a small frame of `peer`: polls the link's
    /// socket (yielding between polls) instead of sleeping in `read`, for
    /// [`READER_GRACE`] and, while a thread here waits for a frame of
    /// `peer`, up to the spin budget, so the next frame of a latency-bound
    /// exchange is read without waking this reader thread. (The grace
    /// covers the time its op thread takes to finish the op and wait for
    /// the next frame.)
    fn poll_for_next_frame(&self, peer: usize, socket: &Conn) {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let start = Instant::now();
        let awaited = || self.awaited[peer].load(Ordering::SeqCst) > 0;
        // Bytes, end of stream or an error: the read will not block. (A
        // poll, not a peek: it takes no socket lock that arriving segments
        // would wait for.)
        let readable = || {
            let mut fds = [PollFd::new(socket.as_fd(), PollFlags::POLLIN)];
            !matches!(poll(&mut fds, PollTimeout::ZERO), Ok(0))
        };
        crate::spin::poll_for(self.config.spin, || {
            let give_up = !awaited() && start.elapsed() >= READER_GRACE;
            (readable() || give_up).then_some(())
        });
    }

    /// Portable plane: holds `peer`'s reader thread while its link is paused.
    fn wait_while_paused(&self, peer: usize) {
        if !self.paused(peer) {
            return;
        }
        let mut ahead = lock(&self.run_ahead);
        while self.paused(peer) {
            ahead = self
                .run_ahead_changed
                .wait_timeout(ahead, Duration::from_millis(100))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        drop(ahead);
        // The pause was this rank's doing: the silence does not count.
        self.last_recv[peer].store(self.now_ms(), Ordering::Relaxed);
    }

    fn failure(&self, peer: usize) -> Option<String> {
        match lock(&self.peers).get(peer) {
            Some(PeerState::Failed(r)) => Some(r.clone()),
            None => Some("transport closed".into()),
            _ => None,
        }
    }

    /// Marks the link to `peer` dead and wakes everyone waiting on it.
    fn fail(&self, peer: usize, reason: String) {
        {
            let mut peers = lock(&self.peers);
            if let Some(state) = peers.get_mut(peer) {
                if let PeerState::Ready(link) = state {
                    link.shut_down();
                }
                if !matches!(state, PeerState::Failed(_)) {
                    // Debug, not warn: a peer that finished and exited closes
                    // its links too; an op that needed the link reports it.
                    tracing::debug!(rank = self.me, peer, %reason, "link closed");
                    *state = PeerState::Failed(reason);
                }
            }
        }
        self.peers_changed.notify_all();
        self.wake_inboxes(|_, p| p == peer);
        // What it sent ahead no longer holds anyone back, and a paused
        // reader of its link must wake to see the link gone. Marked dead
        // under the ledger's lock first, so a frame its reader files
        // meanwhile is either released here or not counted (`file`).
        if let Some(dead) = self.dead.get(peer) {
            let _ahead = lock(&self.run_ahead);
            dead.store(true, Ordering::SeqCst);
        }
        if self.held_frames.load(Ordering::SeqCst) > 0 {
            self.release_held(|ahead, resumed| ahead.drop_peer(peer, resumed));
        }
        if let Some(over) = self.over.get(peer) {
            over.store(false, Ordering::SeqCst);
        }
        self.resume_reading();
    }

    /// Files a lane the dialer opened for a link accepted with lanes.
    fn file_lane(&self, peer: usize, channel: Channel, lane: Conn) {
        let mut pending = lock(&self.pending_lanes);
        match pending.get_mut(&peer) {
            Some(slots) if slots[lane_slot(channel)].is_none() => {
                slots[lane_slot(channel)] = Some(lane);
                drop(pending);
                self.lanes_arrived.notify_all();
            }
            // Given up on meanwhile: dropping the lane closes it.
            _ => tracing::warn!(rank = self.me, peer, ?channel, "a lane came too late"),
        }
    }

    /// For a link accepted with lanes (`Channel::MainWithLanes`), waits
    /// until the dialer has opened both, at most the handshake timeout;
    /// for any other, nothing.
    fn await_lanes(&self, peer: usize, channel: Channel) -> Result<Option<LaneConns>, String> {
        if channel != Channel::MainWithLanes {
            return Ok(None);
        }
        let until = Instant::now() + self.config.handshake_timeout;
        let mut pending = lock(&self.pending_lanes);
        loop {
            let complete = pending
                .get(&peer)
                .is_some_and(|slots| slots.iter().all(Option::is_some));
            let now = Instant::now();
            if complete || now >= until || self.closing.load(Ordering::SeqCst) {
                break;
            }
            pending = self
                .lanes_arrived
                .wait_timeout(pending, (until - now).min(Duration::from_millis(100)))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        match pending.remove(&peer) {
            Some([Some(from_dialer), Some(to_dialer)]) => Ok(Some(LaneConns {
                send: to_dialer,
                recv: from_dialer,
            })),
            _ => Err(format!(
                "rank {peer} asked for lanes but did not open both within {:?}",
                self.config.handshake_timeout
            )),
        }
    }

    fn configure(&self, stream: &Conn) -> io::Result<()> {
        stream.configure(self.config.socket_buffer, self.engine.is_some())
    }

    /// Installs an established connection (its socket, for control, and
    /// the byte streams the handshake ran over) and starts its reader.
    fn install(
        self: &Arc<Self>,
        peer: usize,
        stream: Conn,
        (reader, writer): LinkHalves,
        lanes: Option<LaneConns>,
    ) -> io::Result<Arc<Link>> {
        stream.set_read_timeout(None)?;
        stream.set_write_timeout(Some(self.config.write_timeout))?;
        let kind = stream.kind();
        if let Some(engine) = &self.engine {
            // The handshake read exactly its frames (no read-ahead), so the
            // engine starts at a frame boundary. Its byte streams were
            // clones of `stream`: dropped, the engine shares the one left.
            drop((reader, writer));
            let main: SharedFd = Arc::new(stream.into());
            let mut sockets = vec![main.clone()];
            match lanes {
                Some(LaneConns { send, recv }) => {
                    for lane in [&send, &recv] {
                        lane.set_read_timeout(None)?;
                        lane.set_write_timeout(Some(self.config.write_timeout))?;
                    }
                    let (send, recv): (SharedFd, SharedFd) =
                        (Arc::new(send.into()), Arc::new(recv.into()));
                    sockets.extend([send.clone(), recv.clone()]);
                    engine.add_link_with_lanes(peer, main, Lanes { send, recv });
                }
                None => engine.add_link(peer, main),
            }
            let link = Arc::new(Link {
                kind,
                plane: LinkPlane::Engine { sockets },
            });
            self.last_recv[peer].store(self.now_ms(), Ordering::Relaxed);
            engine.notify();
            return Ok(link);
        }
        let link = Arc::new(Link {
            kind,
            plane: LinkPlane::Portable {
                control: stream,
                writer: Mutex::new(writer),
            },
        });
        let s = self.clone();
        // Plaintext reads come straight from the socket, so its readiness
        // says whether a read would block (TLS may hold decrypted bytes).
        let polled = self.config.security.tls.is_none().then(|| link.clone());
        std::thread::Builder::new()
            .name(format!("ringwire-rx-{}-{peer}", self.me))
            .spawn(move || read_loop(&s, peer, reader, polled))?;
        Ok(link)
    }

    /// The link to `peer`, dialing it (lower rank) or waiting for its dial
    /// (higher rank) until `deadline`.
    fn link(
        self: &Arc<Self>,
        peer: usize,
        deadline: Instant,
        comm_id: u64,
    ) -> Result<Arc<Link>, LinkError> {
        let mut peers = lock(&self.peers);
        loop {
            if let Some(e) = self.aborted_error(comm_id) {
                return Err(e);
            }
            match peers.get(peer) {
                None => return Err(LinkError::Lost("transport closed".into())),
                Some(PeerState::Ready(link)) => return Ok(link.clone()),
                Some(PeerState::Failed(reason)) => return Err(LinkError::Lost(reason.clone())),
                Some(PeerState::Absent) if self.me < peer => {
                    peers[peer] = PeerState::Dialing;
                    drop(peers);
                    return self.dial_claimed(peer, deadline);
                }
                Some(_) => {
                    let now = Instant::now();
                    if now >= deadline {
                        let addr = self.addrs[peer].to_string();
                        return Err(LinkError::Connect {
                            addr,
                            detail: format!(
                                "rank {peer} did not connect to this rank (rank {}) in time (is it running and calling the same collectives?){}",
                                self.me,
                                // A refused dialer is usually that peer.
                                refusals::suffix_since_at(self.epoch, self.place())
                            ),
                        });
                    }
                    peers = self
                        .peers_changed
                        .wait_timeout(peers, deadline - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        }
    }

    /// Dials `peer`, whose state this thread has set to `Dialing`, and
    /// records the outcome: the link (which then hears every abort this
    /// rank knows of), or `Absent` again.
    fn dial_claimed(
        self: &Arc<Self>,
        peer: usize,
        deadline: Instant,
    ) -> Result<Arc<Link>, LinkError> {
        match self.dial(peer, deadline) {
            Ok(link) if self.register(peer, &link) => Ok(link),
            Ok(_) => Err(LinkError::Lost("transport closed".into())),
            Err(e) => {
                if let Some(slot) = lock(&self.peers).get_mut(peer) {
                    *slot = PeerState::Absent;
                }
                self.peers_changed.notify_all();
                Err(e)
            }
        }
    }

    /// Makes `link` the ready link to `peer` and sends it every abort this
    /// rank knows of; false (the link shut down) if the transport closed
    /// meanwhile, since nobody would shut it (and its reader) down later.
    fn register(&self, peer: usize, link: &Arc<Link>) -> bool {
        let mut peers = lock(&self.peers);
        let ready = match peers.get_mut(peer) {
            Some(slot) if !self.closing.load(Ordering::SeqCst) => {
                *slot = PeerState::Ready(link.clone());
                true
            }
            _ => false,
        };
        drop(peers);
        match ready {
            true => self.replay_aborts(peer, link),
            false => link.shut_down(),
        }
        self.peers_changed.notify_all();
        ready
    }

    /// After this rank aborted a communicator: dials each of its `members`
    /// above this rank that has no link yet, so that the link's first frame
    /// tells it (`dial_claimed` replays aborts). Without this a member this
    /// rank never exchanged a frame with (its first op failed here, or
    /// `abort` came first) would wait for its own timeout. Members below
    /// dial this rank when they next need it and hear the abort then. Best
    /// effort, until `deadline`.
    fn tell_unlinked(self: &Arc<Self>, members: &[usize], deadline: Instant) {
        for &peer in members.iter().filter(|&&p| p > self.me) {
            if Instant::now() >= deadline {
                return;
            }
            {
                let mut peers = lock(&self.peers);
                match peers.get(peer) {
                    Some(PeerState::Absent) => peers[peer] = PeerState::Dialing,
                    _ => continue,
                }
            }
            if let Err(e) = self.dial_claimed(peer, deadline) {
                tracing::debug!(rank = self.me, peer, error = ?e, "could not reach a rank to tell it of an abort");
            }
        }
    }

    /// Where `peer` is dialed (its Unix listener when local, else TCP),
    /// as shown in errors.
    fn dial_address(&self, peer: usize) -> (Option<&UnixAddr>, String) {
        let addr = self.addrs[peer];
        let local = self.local_peers.get(peer).and_then(Option::as_ref);
        let shown = match local {
            Some(a) => describe_unix(a),
            None => addr.to_string(),
        };
        (local, shown)
    }

    /// A connection to `peer`, retried with backoff until `deadline`.
    fn connect(&self, peer: usize, deadline: Instant) -> Result<Conn, LinkError> {
        let addr = self.addrs[peer];
        let (local, shown) = self.dial_address(peer);
        let mut backoff = Duration::from_millis(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let connected = match local {
                Some(unix) => UnixStream::connect_addr(unix).map(Conn::Unix),
                None => TcpStream::connect_timeout(
                    &addr,
                    left.clamp(Duration::from_millis(1), Duration::from_secs(5)),
                )
                .map(Conn::Tcp),
            };
            match connected {
                Ok(s) => return Ok(s),
                // Out of descriptors is not a peer that is still starting:
                // say so now rather than at the deadline.
                Err(e) if Instant::now() + backoff < deadline && !open_files::ran_out(&e) => {
                    tracing::debug!(peer, addr = %shown, error = %e, "connect failed, retrying");
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                }
                Err(e) => {
                    return Err(LinkError::Connect {
                        addr: shown,
                        detail: open_files::describe(&e)
                            + &refusals::suffix_since_at(self.epoch, self.place()),
                    });
                }
            }
        }
    }

    fn dial(self: &Arc<Self>, peer: usize, deadline: Instant) -> Result<Arc<Link>, LinkError> {
        let (local, shown) = self.dial_address(peer);
        let connect_err = |detail: String| LinkError::Connect {
            addr: shown.clone(),
            detail,
        };
        let stream = self.connect(peer, deadline)?;
        let who = format!("rank {peer} ({shown})");
        // Lanes only help TCP (Unix links lost with them, decision 0018),
        // and only the engine reads them.
        let channel = if self.config.lanes && self.engine.is_some() && local.is_none() {
            Channel::MainWithLanes
        } else {
            Channel::Main
        };
        let (halves, lanes) = self
            .dial_handshake(peer, &stream, &who, channel)
            .map_err(connect_err)?;
        let lanes = if lanes {
            let open = |channel| -> Result<Conn, LinkError> {
                let lane = self.connect(peer, deadline)?;
                self.dial_handshake(peer, &lane, &who, channel)
                    .map_err(|detail| connect_err(format!("opening a lane: {detail}")))?;
                Ok(lane)
            };
            Some(LaneConns {
                send: open(Channel::LaneFromDialer)?,
                recv: open(Channel::LaneToDialer)?,
            })
        } else {
            None
        };
        self.install(peer, stream, halves, lanes)
            .map_err(|e| connect_err(e.to_string()))
    }

    /// The dialing side of a handshake on `stream` (TLS if configured,
    /// hello as `channel`, secret check); the link's byte streams, and
    /// whether the acceptor takes the lanes a main connection asked for.
    fn dial_handshake(
        &self,
        peer: usize,
        stream: &Conn,
        who: &str,
        channel: Channel,
    ) -> Result<(LinkHalves, bool), String> {
        let addr = self.addrs[peer];
        let hs = |e: io::Error| handshake_error(&e, who);
        self.configure(stream).map_err(hs)?;
        stream
            .set_read_timeout(Some(self.config.handshake_timeout))
            .map_err(hs)?;
        let sec = &self.config.security;
        let mine = sec.flags();
        let (mut reader, mut writer) = match (&sec.tls, &stream) {
            (Some(tls), Conn::Tcp(tcp)) => security::tls_connect(tls, tcp, addr.ip(), who)
                .map_err(
                    |e| match e.plaintext.as_deref().and_then(plaintext_refusal) {
                        Some(reason) => format!("{}; it said: {reason}", e.detail),
                        None => e.detail,
                    },
                )?,
            (Some(_), Conn::Unix(_)) => {
                return Err("TLS runs over TCP links only (unix links are plaintext)".into());
            }
            (None, _) => plain_halves(stream).map_err(hs)?,
        };
        let client_nonce = match &sec.secret {
            Some(_) => Some(secret::nonce().map_err(hs)?),
            None => None,
        };
        let hello = Hello {
            security: mine,
            channel,
            auth: client_nonce.map(|n| n.to_vec()).unwrap_or_default(),
            ..Hello::new(self.job_id, self.me as u32, self.world as u32)
        };
        let payload = hello.encode().map_err(|e| e.to_string())?;
        write_frame(
            &mut *writer,
            &control_header(FrameKind::Handshake, payload.len()),
            &payload,
        )
        .map_err(hs)?;
        let ack = read_ack(&mut *reader).map_err(hs)??;
        let lanes = ack.lanes && channel == Channel::MainWithLanes;
        if !ack.accepted {
            return Err(format!(
                "rank {peer} refused the connection: {}",
                ack.reason
            ));
        }
        if let Some(why) = security_mismatch(ack.security, mine) {
            return Err(format!("rank {peer} answered, but {why}"));
        }
        if let (Some(secret), Some(client_nonce)) = (&sec.secret, client_nonce) {
            let context = link_context(self.job_id, self.me, peer);
            let server_ok = ack.auth.len() == 2 * NONCE_LEN && {
                let (server_nonce, proof) = ack.auth.split_at(NONCE_LEN);
                secret.verify(Role::Server, &context, &client_nonce, server_nonce, proof)
            };
            // Without a valid proof from the acceptor, send none back:
            // it refuses and logs, and this side reports the mismatch.
            let proof = if server_ok {
                secret
                    .proof(
                        Role::Client,
                        &context,
                        &client_nonce,
                        &ack.auth[..NONCE_LEN],
                    )
                    .to_vec()
            } else {
                Vec::new()
            };
            let answer = HelloAck::accept()
                .with_security(mine)
                .with_auth(proof)
                .encode();
            write_frame(
                &mut *writer,
                &control_header(FrameKind::HandshakeAck, answer.len()),
                &answer,
            )
            .map_err(hs)?;
            let verdict = read_ack(&mut *reader).map_err(hs)??;
            if !server_ok {
                return Err(format!(
                    "rank {peer} failed the job-secret check: it does not know this job's secret (RINGWIRE_SECRET differs between ranks?)"
                ));
            }
            if !verdict.accepted {
                return Err(format!(
                    "rank {peer} refused the connection: {}",
                    verdict.reason
                ));
            }
        }
        Ok(((reader, writer), lanes))
    }

    /// Runs the accepting side of a handshake (TLS if configured, hello,
    /// secret check); returns the peer's rank and the link's byte streams,
    /// or why the dialer was refused (its kind, and the words it was told).
    /// `Channel::MainWithLanes` comes back only if this side takes the
    /// lanes (it then waits for them, `await_lanes`).
    fn accept_hello(
        &self,
        stream: &mut Conn,
    ) -> io::Result<Result<(usize, Channel, LinkHalves), Refused>> {
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
        let can_take_lanes = self.engine.is_some() && matches!(stream, Conn::Tcp(_));
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
                            } else if peer > self.me {
                                unexpected(format!(
                                    "rank {peer} dialed rank {}, but only lower ranks dial",
                                    self.me
                                ))
                            } else if hello.channel.is_lane() {
                                match lock(&self.pending_lanes).get(&peer) {
                                    Some(slots) if slots[lane_slot(hello.channel)].is_none() => {
                                        Ok(peer)
                                    }
                                    _ => unexpected(format!(
                                        "rank {peer} opened a lane ({:?}) that rank {} is not \
                                         waiting for",
                                        hello.channel, self.me
                                    )),
                                }
                            } else if lock(&self.pending_lanes).contains_key(&peer)
                                || !matches!(lock(&self.peers).get(peer), Some(PeerState::Absent))
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
                                    Channel::MainWithLanes if !can_take_lanes => Channel::Main,
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
            if let (Ok(peer), Channel::MainWithLanes) = (&verdict, channel) {
                // Waited for from now on, so the lanes the dialer opens on
                // reading this ack find their place.
                lock(&self.pending_lanes).insert(*peer, [None, None]);
                awaiting = Some(*peer);
                ack = ack.with_lanes(true);
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

/// Why a dialer was refused: the kind (for the refusal ledger) and the
/// words it was told.
type Refused = (Reason, String);

/// Where a lane waits in `Shared::pending_lanes`.
fn lane_slot(channel: Channel) -> usize {
    match channel {
        Channel::LaneToDialer => 1,
        _ => 0,
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

/// A dial-side handshake failure, readable.
fn handshake_error(e: &io::Error, who: &str) -> String {
    if security::is_tls_error(e) {
        security::describe_io(e, who)
    } else {
        format!("handshake with {who} failed: {e}")
    }
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
fn plain_halves(conn: &Conn) -> io::Result<LinkHalves> {
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

fn control_header(kind: FrameKind, len: usize) -> Header {
    Header::control(kind, 0, 0, len as u32)
}

/// Zeros for the padding around payloads.
static ZEROS: [u8; wire::FRAME_ALIGN] = [0; wire::FRAME_ALIGN];

/// Payloads from this size on are sent at their own alignment (the header's
/// `pad`, decision 0016); below it a slow copy costs less than the pad.
const ALIGN_PAYLOADS_FROM: usize = 1024;

/// `header` with the pad that keeps `payload`'s alignment in the socket's
/// buffer, for payloads large enough to be worth it.
fn aligned_for(header: &Header, payload: &[u8]) -> Header {
    match payload.len() >= ALIGN_PAYLOADS_FROM {
        true => header.with_pad(wire::aligning_pad(payload.as_ptr() as usize)),
        false => header.with_pad(0),
    }
}

/// The header and its pad, as the frame starts.
fn padded_head(header: &Header) -> ([u8; HEADER_LEN + wire::FRAME_ALIGN], usize) {
    let mut head = [0; HEADER_LEN + wire::FRAME_ALIGN];
    head[..HEADER_LEN].copy_from_slice(&header.encode());
    (head, header.payload_offset())
}

/// Writes a whole frame (header, pad, payload, trailing zeros) with one
/// `writev` (retried on short writes): one syscall per frame and no copy
/// into a staging buffer.
fn write_frame(stream: &mut dyn Write, header: &Header, payload: &[u8]) -> io::Result<()> {
    write_frame_from(stream, header, payload, &mut 0)
}

/// `write_all`, counting in `*written` what went out.
fn write_counted(stream: &mut dyn Write, bytes: &[u8], written: &mut usize) -> io::Result<()> {
    while *written < bytes.len() {
        match stream.write(&bytes[*written..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => *written += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes the frame from byte `*written` on, counting in `*written` what
/// went out (so a caller can tell whether any of it did, and resume).
fn write_frame_from(
    stream: &mut dyn Write,
    header: &Header,
    payload: &[u8],
    written: &mut usize,
) -> io::Result<()> {
    let (head, head_len) = padded_head(header);
    let mut slices = [
        IoSlice::new(&head[..head_len]),
        IoSlice::new(payload),
        IoSlice::new(&ZEROS[..header.trail_len()]),
    ];
    let mut bufs = &mut slices[..];
    // Drops empty slices too: a write of nothing but them would return 0.
    IoSlice::advance_slices(&mut bufs, *written);
    while !bufs.is_empty() {
        match stream.write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                *written += n;
                IoSlice::advance_slices(&mut bufs, n);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads one control frame (bounded by the control payload cap).
fn read_control(stream: &mut dyn Read) -> io::Result<(Header, Vec<u8>)> {
    let mut head = [0u8; HEADER_LEN];
    stream.read_exact(&mut head)?;
    let header = Header::decode(&head, wire::MAX_CONTROL_PAYLOAD).map_err(io::Error::other)?;
    let mut payload = vec![0u8; header.payload_len_usize()];
    read_payload(stream, &header, &mut payload)?;
    Ok((header, payload))
}

/// Reads the rest of a frame after its header: the pad, the payload (into
/// `payload`, as long as the header says) and the trailing zeros, with as
/// few reads as the stream allows.
fn read_payload(stream: &mut dyn Read, header: &Header, payload: &mut [u8]) -> io::Result<()> {
    let mut pad = [0u8; wire::FRAME_ALIGN];
    let mut tail = [0u8; wire::FRAME_ALIGN];
    let mut slices = [
        IoSliceMut::new(&mut pad[..usize::from(header.pad)]),
        IoSliceMut::new(payload),
        IoSliceMut::new(&mut tail[..header.trail_len()]),
    ];
    let mut bufs = &mut slices[..];
    IoSliceMut::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        match stream.read_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => IoSliceMut::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Accepts connections (from `accept`: the TCP or the Unix listener) until
/// the transport closes, and runs each one's handshake on its own thread.
fn accept_loop(s: &Arc<Shared>, accept: impl Fn() -> io::Result<Conn>) {
    let mut failing = false;
    loop {
        let accepted = accept();
        if s.closing.load(Ordering::SeqCst) {
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
                    tracing::warn!(rank = s.me, "accept failed: {}", open_files::describe(&e));
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
        while s.handshakes.load(Ordering::SeqCst) >= MAX_PENDING_HANDSHAKES {
            if s.closing.load(Ordering::SeqCst) {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        s.handshakes.fetch_add(1, Ordering::SeqCst);
        let s2 = s.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("ringwire-hello-{}", s.me))
            .spawn(move || {
                let _pending = PendingHandshake(&s2.handshakes);
                let from = stream.refusal_peer();
                let place = s2.place();
                let deadline = HandshakeDeadline::arm(&stream, s2.config.handshake_timeout);
                let hello = s2.accept_hello(&mut stream);
                let hello = match deadline.map(HandshakeDeadline::disarm) {
                    Some(true) => Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "the handshake took longer than {:?}; the connection was closed",
                            s2.config.handshake_timeout
                        ),
                    )),
                    _ => hello,
                };
                match hello {
                    Ok(Ok((peer, channel, _))) if channel.is_lane() => {
                        s2.file_lane(peer, channel, stream);
                    }
                    Ok(Ok((peer, channel, halves))) => match s2
                        .await_lanes(peer, channel)
                        .map_err(|e| (Reason::Timeout, e))
                        .and_then(|lanes| {
                            s2.install(peer, stream, halves, lanes)
                                .map_err(|e| (Reason::of_io(&e), e.to_string()))
                        }) {
                        Ok(link) => {
                            s2.register(peer, &link);
                        }
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
            s.handshakes.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!(rank = s.me, error = %e, "could not spawn handshake thread");
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

/// Where a waiting thread's frame lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Await {
    /// In the inbox of its (communicator, peer).
    Inbox,
    /// In the caller's memory, placed by the engine.
    Placement,
}

/// A thread waiting for a frame of a peer (see `Shared::waiting_on`).
struct Waiting<'a> {
    shared: &'a Shared,
    inbox: &'a Inbox,
    peer: usize,
    at: Await,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.inbox.waiters.fetch_sub(1, Ordering::SeqCst);
        self.shared.awaited[self.peer].fetch_sub(1, Ordering::SeqCst);
        if self.at == Await::Placement {
            self.shared.placing[self.peer].fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Sends heartbeats on idle links and declares links dead that have been
/// silent past the heartbeat timeout (a stopped process still has a kernel
/// that ACKs, so only silence at this level reveals it).
fn heartbeat_loop(s: &Arc<Shared>) {
    let interval = s.config.heartbeat_interval.max(Duration::from_millis(10));
    let beat = wire::encode_heartbeat(0, 0);
    while !s.closing.load(Ordering::SeqCst) {
        std::thread::park_timeout(interval / 2);
        if s.closing.load(Ordering::SeqCst) {
            return;
        }
        let now = s.now_ms();
        let links = s.ready_links();
        for (peer, link) in links {
            if s.over[peer].load(Ordering::SeqCst) {
                // Not read on purpose (decision 0019): silence proves nothing.
                s.last_recv[peer].store(now, Ordering::Relaxed);
            }
            let silent = now.saturating_sub(s.last_recv[peer].load(Ordering::Relaxed));
            if silent > s.config.heartbeat_timeout.as_millis() as u64 {
                s.fail(
                    peer,
                    format!(
                        "rank {peer} sent nothing, not even heartbeats, for {:.1} s (process stopped or hung, \
                         or the network partitioned?)",
                        silent as f64 / 1e3
                    ),
                );
                continue;
            }
            if now.saturating_sub(s.last_send[peer].load(Ordering::Relaxed))
                >= interval.as_millis() as u64
            {
                if let Some(engine) = &s.engine {
                    engine.send_owned(peer, beat.to_vec());
                    s.last_send[peer].store(now, Ordering::Relaxed);
                    continue;
                }
                // A busy writer is traffic enough; never wait for it here,
                // nor for a full socket (a peer that stopped reading this
                // link): blocked, this thread would beat for no other link.
                let Some(writer) = link.writer() else {
                    continue;
                };
                if !link.writable_now() {
                    continue;
                }
                if let Ok(mut w) = writer.try_lock() {
                    if w.write_all(&beat).and_then(|()| w.flush()).is_ok() {
                        s.last_send[peer].store(now, Ordering::Relaxed);
                    }
                }
            }
        }
        // Sends the beats and takes in what arrived, unless a waiting
        // executor is driving the engine already.
        if let Some(engine) = &s.engine {
            engine.tick(&**s);
            engine.release(&**s);
        }
    }
}

/// The portable reader polls for the next frame only after one of at most
/// this many payload bytes (see `read_loop`).
const POLLED_FRAME_BYTES: usize = 64 << 10;

/// How long the portable reader polls after a small frame even while no
/// thread waits for the next one (see `Shared::poll_for_next_frame`).
const READER_GRACE: Duration = Duration::from_micros(50);

fn read_loop(s: &Arc<Shared>, peer: usize, mut stream: LinkReader, polled: Option<Arc<Link>>) {
    s.last_recv[peer].store(s.now_ms(), Ordering::Relaxed);
    // Polling pays where frames are small (latency-bound exchanges); with
    // large ones the peer is busy writing a payload, and a polling reader
    // would only take turns on the core with it.
    let mut last_small = true;
    let socket = polled.as_ref().and_then(|l| match &l.plane {
        LinkPlane::Portable { control, .. } => Some(control),
        LinkPlane::Engine { .. } => None,
    });
    let reason = loop {
        s.wait_while_paused(peer);
        if let Some(socket) = socket.filter(|_| last_small) {
            s.poll_for_next_frame(peer, socket);
        }
        let mut head = [0u8; HEADER_LEN];
        if let Err(e) = stream.read_exact(&mut head) {
            break describe_read_error(peer, &e);
        }
        s.last_recv[peer].store(s.now_ms(), Ordering::Relaxed);
        let header = match Header::decode(&head, s.config.max_payload) {
            Ok(h) => h,
            Err(e) => break format!("rank {peer} sent a bad frame header: {e}"),
        };
        last_small = header.payload_len_usize() <= POLLED_FRAME_BYTES;
        match header.kind {
            FrameKind::Data => {
                let mut buf = s.take_buf();
                let payload = buf.prepare(header.payload_len_usize());
                if let Err(e) = read_payload(&mut stream, &header, payload) {
                    break describe_read_error(peer, &e);
                }
                s.file(peer, header, buf, true);
            }
            FrameKind::Heartbeat | FrameKind::Abort => {
                if header.payload_len > wire::MAX_CONTROL_PAYLOAD {
                    break format!("rank {peer} sent an oversized control frame");
                }
                let mut payload = vec![0u8; header.payload_len_usize()];
                if let Err(e) = read_payload(&mut stream, &header, &mut payload) {
                    break describe_read_error(peer, &e);
                }
                if header.kind == FrameKind::Abort {
                    match wire::Abort::decode(&payload) {
                        Ok(a) => s.on_abort(Some(peer), header.comm_id, a),
                        Err(e) => break format!("rank {peer} sent a bad abort frame: {e}"),
                    }
                }
            }
            other => break format!("rank {peer} sent an unexpected {} frame", other.name()),
        }
    };
    s.fail(peer, reason);
}

/// The uring plane hands frames here, whichever thread drives it; the
/// checks and messages are the reader thread's (`read_loop`).
impl FrameSink for Shared {
    fn payload(&self, peer: usize, head: &[u8]) -> Result<PayloadAt, String> {
        self.last_recv[peer].store(self.now_ms(), Ordering::Relaxed);
        let header = Header::decode(head, self.config.max_payload)
            .map_err(|e| format!("rank {peer} sent a bad frame header: {e}"))?;
        let at = PayloadAt {
            pad: usize::from(header.pad),
            len: header.payload_len_usize(),
        };
        match header.kind {
            FrameKind::Data => Ok(at),
            FrameKind::Heartbeat | FrameKind::Abort => {
                if header.payload_len > wire::MAX_CONTROL_PAYLOAD {
                    return Err(format!("rank {peer} sent an oversized control frame"));
                }
                Ok(at)
            }
            other => Err(format!(
                "rank {peer} sent an unexpected {} frame",
                other.name()
            )),
        }
    }

    fn buffer(&self) -> AlignedBuf {
        self.take_buf()
    }

    fn frame(&self, peer: usize, head: &[u8], payload: AlignedBuf) {
        // `payload` accepted this header already.
        let Ok(header) = Header::decode(head, self.config.max_payload) else {
            return;
        };
        match header.kind {
            FrameKind::Data => self.file(peer, header, payload, false),
            FrameKind::Abort => {
                match wire::Abort::decode(payload.bytes()) {
                    Ok(a) => self.on_abort(Some(peer), header.comm_id, a),
                    Err(e) => self.fail(peer, format!("rank {peer} sent a bad abort frame: {e}")),
                }
                self.recycle_buf(payload);
            }
            _ => self.recycle_buf(payload),
        }
    }

    fn paused(&self, peer: usize) -> bool {
        Shared::paused(self, peer)
    }

    fn frame_key(&self, _peer: usize, head: &[u8]) -> Option<FrameKey> {
        let h = Header::decode(head, self.config.max_payload).ok()?;
        (h.kind == FrameKind::Data).then(|| frame_key(h.comm_id, h.seq, h.step, h.chunk))
    }

    fn link_failed(&self, peer: usize, fault: LinkFault) {
        let reason = match fault {
            LinkFault::Closed => describe_read_error(peer, &io::ErrorKind::UnexpectedEof.into()),
            LinkFault::Io(e) => describe_read_error(peer, &e),
            LinkFault::BadFrame(reason) => reason,
        };
        self.fail(peer, reason);
    }
}

impl Shared {
    fn take_buf(&self) -> AlignedBuf {
        let mut pool = lock(&self.pool);
        let buf = pool.bufs.pop().unwrap_or_default();
        pool.bytes -= buf.capacity();
        buf
    }

    fn recycle_buf(&self, buf: AlignedBuf) {
        let mut pool = lock(&self.pool);
        if pool.bytes + buf.capacity() <= POOL_BYTES {
            pool.bytes += buf.capacity();
            pool.bufs.push(buf);
        }
    }

    /// The uring plane's send: the engine writes the frame, and this
    /// thread drives it (or waits for the driver) until it is out. An op
    /// past its deadline, or whose communicator was aborted, withdraws a
    /// frame none of which went out and fails alone; the link stays. A
    /// frame stuck part way out fails the link after the write timeout.
    fn engine_send(
        &self,
        engine: &FrameEngine,
        peer: usize,
        header: &Header,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<(), LinkError> {
        let give_up = Instant::now() + self.config.write_timeout;
        let mut on_stall = || self.fail(peer, stopped_reading(peer));
        let mut stop = || self.send_stop(header.comm_id, deadline);
        let (head, head_len) = padded_head(header);
        let result = engine.send(
            peer,
            &head[..head_len],
            payload,
            give_up,
            &mut on_stall,
            self,
            deadline,
            &mut stop,
        );
        if !matches!(result, Sent::Stopped(_)) {
            self.last_send[peer].store(self.now_ms(), Ordering::Relaxed);
        }
        match result {
            Sent::Out => Ok(()),
            Sent::Stopped(e) => Err(e),
            Sent::Failed(e) => {
                self.fail(peer, format!("send to rank {peer} failed: {e}"));
                // An abort, or else the first reason recorded, explains it.
                Err(self
                    .aborted_error(header.comm_id)
                    .unwrap_or_else(|| LinkError::Lost(self.failure(peer).unwrap_or(e))))
            }
        }
    }

    /// The portable plane's write of one frame. Until a byte of it has
    /// gone out it stops, leaving the link whole, when its communicator is
    /// aborted or its op's deadline passes while it waits for the link's
    /// writer; and a write that times out with nothing of the frame out
    /// ends the op alone too. Late in an op (or under a handle's shorter
    /// timeout) the socket's write timeout is bounded by what the op has
    /// left; otherwise it is the write timeout, which is the op timeout, so
    /// such an op ends at most a second late (and one with more time than
    /// that, under a handle's longer timeout, tries again). Once bytes went out, the
    /// frame is finished or the link fails, each write bounded by the
    /// write timeout as always. A TLS writer may have put part of a record
    /// out even when it reports nothing written, so on TLS links any timed
    /// out write fails the link, as before. `Err` is the stop; `Ok`
    /// carries the write's own result.
    fn portable_send(
        &self,
        link: &Link,
        writer: &Mutex<LinkWriter>,
        header: &Header,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<io::Result<()>, LinkError> {
        let mut w = self.lock_writer(writer, header.comm_id, deadline)?;
        let plain = self.config.security.tls.is_none();
        let write_timeout = self.config.write_timeout;
        let mut written = 0;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            // Setting the socket option twice per frame is for the rare op
            // with less than the write timeout left by more than a second.
            let bounded = plain && left + Duration::from_secs(1) < write_timeout;
            if bounded {
                link.set_write_timeout(left.max(Duration::from_millis(1)));
            }
            let result = write_frame_from(&mut **w, header, payload, &mut written);
            if bounded {
                link.set_write_timeout(write_timeout);
            }
            if !(plain && result.as_ref().is_err_and(write_timed_out)) {
                return Ok(result);
            }
            if written > 0 {
                // Part of it is out: the rest must follow, as for any
                // frame, under the write timeout (already, if unbounded).
                return Ok(match bounded {
                    true => write_frame_from(&mut **w, header, payload, &mut written),
                    false => result,
                });
            }
            if let Some(stop) = self.send_stop(header.comm_id, deadline) {
                return Err(stop);
            }
            // Nothing out and time left (a handle's timeout longer than the
            // write timeout): try again.
        }
    }

    /// Takes a portable link's writer, waiting while another op's frame is
    /// going out, but only until this op must stop (see `send_stop`). A
    /// frame usually takes microseconds, so it yields a few times before
    /// it naps, and naps stay short.
    fn lock_writer<'w>(
        &self,
        writer: &'w Mutex<LinkWriter>,
        comm_id: u64,
        deadline: Instant,
    ) -> Result<MutexGuard<'w, LinkWriter>, LinkError> {
        let mut tries = 0u32;
        loop {
            match writer.try_lock() {
                Ok(w) => return Ok(w),
                Err(std::sync::TryLockError::Poisoned(p)) => return Ok(p.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => {}
            }
            if let Some(stop) = self.send_stop(comm_id, deadline) {
                return Err(stop);
            }
            tries += 1;
            match tries {
                ..=16 => std::thread::yield_now(),
                _ => std::thread::sleep(Duration::from_micros(50 << (tries - 16).min(2))),
            }
        }
    }

    /// Why a send that has not started should not: its communicator was
    /// aborted, or its op's deadline passed (the peer did not read).
    fn send_stop(&self, comm_id: u64, deadline: Instant) -> Option<LinkError> {
        self.aborted_error(comm_id)
            .or_else(|| (Instant::now() >= deadline).then_some(LinkError::Unread))
    }

    /// The uring plane's receive into `dest`: the engine places the payload
    /// there if the frame has not arrived yet; otherwise (or on failure)
    /// this is `engine_recv`.
    #[allow(clippy::too_many_arguments)]
    fn engine_recv_into(
        &self,
        engine: &FrameEngine,
        inbox: &Inbox,
        comm_id: u64,
        peer: usize,
        (seq, step, chunk): (u64, u32, u32),
        dest: &mut [u8],
        deadline: Instant,
    ) -> Result<Received, LinkError> {
        let mut stop = || self.stop_waiting(inbox, comm_id, peer, deadline);
        if stop().is_some() {
            // Queued already, aborted, lost or late: the plain path says which.
            return self
                .engine_recv(engine, inbox, comm_id, peer, deadline)
                .map(Received::Frame);
        }
        let key = frame_key(comm_id, seq, step, chunk);
        let _waiting = self.waiting_on(inbox, peer, Await::Placement);
        let placement = engine.receive_in_place(peer, key, dest, deadline, self, &mut stop);
        self.placed(engine, inbox, comm_id, peer, deadline, placement)
    }

    /// Why a thread waiting for a frame to be placed should stop waiting,
    /// if it should.
    fn stop_waiting(
        &self,
        inbox: &Inbox,
        comm_id: u64,
        peer: usize,
        deadline: Instant,
    ) -> Option<StopWaiting> {
        if let Some(e) = self.aborted_error(comm_id) {
            return Some(StopWaiting::Failed(e));
        }
        if !lock(&inbox.queue).is_empty() {
            return Some(StopWaiting::Queued);
        }
        if let Some(reason) = self.failure(peer) {
            return Some(StopWaiting::Failed(LinkError::Lost(reason)));
        }
        (Instant::now() >= deadline).then_some(StopWaiting::Failed(LinkError::Timeout))
    }

    /// What a placement's end means for the receive that waited for it.
    fn placed(
        &self,
        engine: &FrameEngine,
        inbox: &Inbox,
        comm_id: u64,
        peer: usize,
        deadline: Instant,
        placement: Placement<StopWaiting>,
    ) -> Result<Received, LinkError> {
        match placement {
            Placement::Placed(head) => Header::decode(&head[..HEADER_LEN], self.config.max_payload)
                .map(Received::Placed)
                .map_err(|e| LinkError::Lost(format!("rank {peer} sent a bad frame header: {e}"))),
            Placement::Stopped(StopWaiting::Queued) => self
                .engine_recv(engine, inbox, comm_id, peer, deadline)
                .map(Received::Frame),
            Placement::Stopped(StopWaiting::Failed(e)) => Err(e),
            // A peer that aborted and then exited: its abort came first on
            // the link and explains more than the closed connection.
            Placement::Failed(reason) => Err(self
                .aborted_error(comm_id)
                .unwrap_or_else(|| LinkError::Lost(self.failure(peer).unwrap_or(reason)))),
        }
    }

    /// The uring plane's receive: waits for the frame, driving the engine
    /// whenever no other thread does.
    fn engine_recv(
        &self,
        engine: &FrameEngine,
        inbox: &Inbox,
        comm_id: u64,
        peer: usize,
        deadline: Instant,
    ) -> Result<Incoming, LinkError> {
        let _waiting = self.waiting_on(inbox, peer, Await::Inbox);
        loop {
            let seen = engine.generation();
            if let Some(e) = self.aborted_error(comm_id) {
                return Err(e);
            }
            if let Some(frame) = lock(&inbox.queue).pop_front() {
                return Ok(frame);
            }
            if let Some(reason) = self.failure(peer) {
                return Err(LinkError::Lost(reason));
            }
            if Instant::now() >= deadline {
                return Err(LinkError::Timeout);
            }
            engine.progress(seen, deadline, self);
        }
    }
}

/// The uring plane's posted receives: the engine places each frame that
/// arrives after posting; one that came before is taken from the inbox.
struct PlacedAhead<'a, 's, 'r> {
    shared: &'a Shared,
    engine: &'a FrameEngine,
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
        let (shared, engine, inbox) = (self.shared, self.engine, self.inbox);
        let (comm_id, peer) = (self.comm_id, self.peer);
        let mut stop = || shared.stop_waiting(inbox, comm_id, peer, deadline);
        let key = frame_key(comm_id, seq, step, chunk);
        let _waiting = shared.waiting_on(inbox, peer, Await::Placement);
        let (placement, piece) = self.placements.take(key, offset, len, deadline, &mut stop);
        let received = shared.placed(engine, inbox, comm_id, peer, deadline, placement)?;
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

/// Whether a blocking write failed for its socket's write timeout.
fn write_timed_out(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Why a send blocked past the write timeout (the op timeout).
fn stopped_reading(peer: usize) -> String {
    format!(
        "rank {peer} stopped reading (a send blocked past the op timeout): {}",
        super::WHY_A_PEER_STOPS_READING
    )
}

fn describe_read_error(peer: usize, e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::UnexpectedEof => {
            format!("rank {peer} closed the connection (did its process exit or crash?)")
        }
        _ => format!("connection to rank {peer} failed: {e}"),
    }
}

impl Transport for TcpTransport {
    fn abort_notice(&self, comm_id: u64) -> Option<(usize, u64, String)> {
        match self.shared.aborted_error(comm_id)? {
            LinkError::Aborted {
                origin,
                seq,
                reason,
            } => Some((origin, seq, reason)),
            _ => None,
        }
    }

    fn send(
        &self,
        peer: usize,
        header: &Header,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<(), LinkError> {
        let link = self.shared.link(peer, deadline, header.comm_id)?;
        let header = &aligned_for(header, payload);
        if let Some(engine) = &self.shared.engine {
            return self
                .shared
                .engine_send(engine, peer, header, payload, deadline);
        }
        let Some(writer) = link.writer() else {
            // Only engine links lack a writer, and they were served above.
            return Err(LinkError::Lost(format!(
                "the link to rank {peer} belongs to the io_uring engine, but this transport runs \
                 none (a bug in ringwire: please report it)"
            )));
        };
        // Err: nothing of the frame went out; the op ends, the link stays.
        let result = self
            .shared
            .portable_send(&link, writer, header, payload, deadline)?;
        self.shared.last_send[peer].store(self.shared.now_ms(), Ordering::Relaxed);
        result.map_err(|e| {
            let reason = match write_timed_out(&e) {
                true => stopped_reading(peer),
                false => format!("send to rank {peer} failed: {e}"),
            };
            self.shared.fail(peer, reason.clone());
            // An abort that came while the write was blocked explains it.
            self.shared
                .aborted_error(header.comm_id)
                .unwrap_or(LinkError::Lost(reason))
        })
    }

    fn recv(&self, comm_id: u64, peer: usize, deadline: Instant) -> Result<Incoming, LinkError> {
        let inbox = self.shared.inbox(comm_id, peer);
        // Make sure the link exists (the lower rank dials on first use). A
        // peer that sent its last frame and exited has a closed link but
        // still a frame for us: deliver queued frames before reporting.
        if let Err(e) = self.shared.link(peer, deadline, comm_id) {
            if matches!(e, LinkError::Aborted { .. }) {
                return Err(e); // the op is over, whatever came before
            }
            return lock(&inbox.queue).pop_front().ok_or(e);
        }
        if let Some(engine) = &self.shared.engine {
            return self
                .shared
                .engine_recv(engine, &inbox, comm_id, peer, deadline);
        }
        let _waiting = self.shared.waiting_on(&inbox, peer, Await::Inbox);
        // Poll briefly before sleeping: a frame the link's reader thread
        // files within the spin is taken without a second wake-up (the
        // reader's own is unavoidable on this plane). An abort still ends
        // the op first, as in the loop below.
        let budget =
            (self.shared.config.spin).min(deadline.saturating_duration_since(Instant::now()));
        if let Some(polled) =
            crate::spin::poll_for(budget, || match self.shared.aborted_error(comm_id) {
                Some(e) => Some(Err(e)),
                None => lock(&inbox.queue).pop_front().map(Ok),
            })
        {
            return polled;
        }
        let mut queue = lock(&inbox.queue);
        loop {
            // An abort ends the op at once, even with frames queued: the
            // op cannot complete on every rank any more.
            if let Some(e) = self.shared.aborted_error(comm_id) {
                return Err(e);
            }
            if let Some(frame) = queue.pop_front() {
                return Ok(frame);
            }
            if let Some(reason) = self.shared.failure(peer) {
                return Err(LinkError::Lost(reason));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(LinkError::Timeout);
            }
            queue = inbox
                .arrived
                .wait_timeout(queue, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
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
        let Some(engine) = &self.shared.engine else {
            return self.recv(comm_id, peer, deadline).map(Received::Frame);
        };
        let inbox = self.shared.inbox(comm_id, peer);
        if let Err(e) = self.shared.link(peer, deadline, comm_id) {
            if matches!(e, LinkError::Aborted { .. }) {
                return Err(e); // the op is over, whatever came before
            }
            return lock(&inbox.queue).pop_front().map(Received::Frame).ok_or(e);
        }
        self.shared
            .engine_recv_into(engine, &inbox, comm_id, peer, expected, dest, deadline)
    }

    fn with_posted_recvs(
        &self,
        comm_id: u64,
        peer: usize,
        region: &mut [u8],
        deadline: Instant,
        body: &mut dyn FnMut(&mut dyn PostedRecvs) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let shared = &*self.shared;
        let engine = match &shared.engine {
            // A link that is not up is reported by the first receive.
            Some(engine) if self.shared.link(peer, deadline, comm_id).is_ok() => engine,
            _ => return super::in_turn(self, comm_id, peer, region, body),
        };
        let inbox = shared.inbox(comm_id, peer);
        engine.with_placements(peer, region, shared, |placements| {
            body(&mut PlacedAhead {
                shared,
                engine,
                inbox: &inbox,
                comm_id,
                peer,
                placements,
            })
        })
    }

    fn recycle(&self, buf: AlignedBuf) {
        self.shared.recycle_buf(buf);
    }

    fn begin(&self, comm_id: u64, seq: u64, from: Option<usize>) {
        self.shared.begin(comm_id, seq, from);
    }

    fn held_ahead(&self) -> (usize, usize) {
        let ahead = lock(&self.shared.run_ahead);
        (ahead.held(), ahead.peak())
    }

    fn inboxes(&self) -> usize {
        lock(&self.shared.inboxes).len()
    }

    fn forget(&self, comm_id: u64) {
        self.shared.forget(comm_id);
    }

    fn abort(&self, comm_id: u64, seq: u64, reason: &str, members: &[usize]) {
        let abort = wire::Abort::new(self.shared.me as u32, seq, reason);
        self.shared.on_abort(None, comm_id, abort);
        let limit = Duration::from_secs(1);
        let deadline = Instant::now() + limit;
        // Dials run on a thread of their own, waited for at most `limit`: a
        // stopped member's handshake would hold this one far longer.
        let me = self.shared.me;
        let unlinked = {
            let peers = lock(&self.shared.peers);
            members
                .iter()
                .any(|&p| p > me && matches!(peers.get(p), Some(PeerState::Absent)))
        };
        if unlinked {
            let (shared, members) = (self.shared.clone(), members.to_vec());
            let (told, done) = std::sync::mpsc::channel();
            let spawned = std::thread::Builder::new()
                .name(format!("ringwire-tell-{me}"))
                .spawn(move || {
                    shared.tell_unlinked(&members, deadline);
                    let _ = told.send(());
                });
            if spawned.is_ok() {
                let _ = done.recv_timeout(limit);
            }
        }
        self.shared.wait_forwarded(comm_id, limit);
    }

    fn listen_addr(&self) -> SocketAddr {
        self.local_addr
    }

    fn link_kind(&self, peer: usize) -> Option<&'static str> {
        match lock(&self.shared.peers).get(peer) {
            Some(PeerState::Ready(link)) => Some(link.kind.name()),
            _ => None,
        }
    }

    fn link_has_lanes(&self, peer: usize) -> bool {
        matches!(lock(&self.shared.peers).get(peer), Some(PeerState::Ready(link)) if link.has_lanes())
    }

    fn name(&self) -> &'static str {
        if self.shared.engine.is_some() {
            "uring"
        } else {
            "portable"
        }
    }

    fn release(&self) {
        if let Some(engine) = &self.shared.engine {
            engine.release(&*self.shared);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::wire::OpKind;

    fn data_header(len: usize) -> Header {
        Header::data(1, 2, OpKind::Broadcast, DType::U8).with_payload_len(len as u32)
    }

    #[test]
    fn large_payloads_keep_their_alignment_and_small_ones_get_no_pad() {
        let memory = vec![7u8; 8192];
        for offset in 0..128 {
            let payload = &memory[offset..offset + 4096];
            let h = aligned_for(&data_header(4096), payload);
            assert_eq!(
                h.payload_offset() % wire::FRAME_ALIGN,
                payload.as_ptr() as usize % wire::FRAME_ALIGN,
                "offset {offset}"
            );
            let small = &memory[offset..offset + ALIGN_PAYLOADS_FROM - 1];
            assert_eq!(aligned_for(&data_header(small.len()), small).pad, 0);
        }
    }

    #[test]
    fn a_written_frame_is_whole_lines_with_the_payload_at_its_own_alignment() {
        let memory: Vec<u8> = (0..8192).map(|i| (i % 251 + 1) as u8).collect();
        for (offset, len) in [(0, 5000), (9, 1024), (40, 1500), (63, 3000), (5, 100)] {
            let payload = &memory[offset..offset + len];
            let header = aligned_for(&data_header(len), payload);
            let mut wire_bytes = Vec::new();
            write_frame(&mut wire_bytes, &header, payload).unwrap();
            let at = header.payload_offset();
            assert_eq!(wire_bytes.len() % wire::FRAME_ALIGN, 0, "{offset}/{len}");
            assert_eq!(wire_bytes.len(), header.frame_len());
            assert_eq!(Header::decode(&wire_bytes, u32::MAX), Ok(header));
            assert!(wire_bytes[HEADER_LEN..at].iter().all(|&b| b == 0));
            assert!(wire_bytes[at..at + len] == *payload);
            assert!(wire_bytes[at + len..].iter().all(|&b| b == 0));
            if len >= ALIGN_PAYLOADS_FROM {
                assert_eq!(at % 64, payload.as_ptr() as usize % 64, "{offset}/{len}");
            } else {
                assert_eq!(at, HEADER_LEN);
            }
        }
    }

    #[test]
    fn frames_written_padded_read_back_whole_over_a_socket() {
        let (a, b) = UnixStream::pair().unwrap();
        let (mut writer, mut reader) = (Conn::Unix(a), Conn::Unix(b));
        let memory: Vec<u8> = (0..20_000).map(|i| (i * 7 + 3) as u8).collect();
        let cases: Vec<(usize, usize)> = (0..64)
            .map(|i| (i * 5 % 64, [0, 1, 63, 64, 1000, 1024, 4099, 12_345][i % 8]))
            .collect();
        let expected = cases.clone();
        let sender = std::thread::spawn(move || {
            for (offset, len) in cases {
                let payload = &memory[offset..offset + len];
                let header = aligned_for(&data_header(len), payload);
                write_frame(&mut writer, &header, payload).unwrap();
            }
            // Then a control frame: the stream is still in step.
            let abort = wire::Abort::new(0, 1, "done").encode();
            write_frame(
                &mut writer,
                &control_header(FrameKind::Abort, abort.len()),
                &abort,
            )
            .unwrap();
            memory
        });
        let mut got = Vec::new();
        for _ in &expected {
            let mut head = [0u8; HEADER_LEN];
            reader.read_exact(&mut head).unwrap();
            let header = Header::decode(&head, u32::MAX).unwrap();
            let mut payload = vec![0u8; header.payload_len_usize()];
            read_payload(&mut reader, &header, &mut payload).unwrap();
            got.push(payload);
        }
        let (header, payload) = read_control(&mut reader).unwrap();
        assert_eq!(header.kind, FrameKind::Abort);
        assert_eq!(wire::Abort::decode(&payload).unwrap().reason, "done");
        let memory = sender.join().unwrap();
        for ((offset, len), payload) in expected.into_iter().zip(got) {
            assert!(
                payload == memory[offset..offset + len],
                "offset {offset}, len {len}"
            );
        }
    }
}
