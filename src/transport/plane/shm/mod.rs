//! The shared-memory plane: a link to a rank on this host as two byte rings
//! in one sealed memfd segment (`ringwire_shm`), one per direction, made
//! over the link's Unix socket once its handshake passed (the dialer makes
//! the segment and passes it with SCM_RIGHTS; the acceptor checks and maps
//! it). Frames travel through the rings laid out as on a socket, so every
//! schedule runs on it unchanged, with no system call on the way.
//!
//! The Unix socket stays: a sleeper is woken by a one-byte doorbell on it,
//! sent only when the sleeper said it sleeps (the rings' armed words), and
//! its end of stream is how a dead peer is seen (and the peer's pidfd,
//! `peer_process`, where a child it forked holds the socket open). A thread that waits for a
//! frame of this link reads the ring itself and files what it finds (one
//! at a time: others wait on their inboxes); the heartbeat thread drains it
//! when nobody waits, so heartbeats and aborts are heard.
//!
//! Where a segment cannot be made or mapped (memfd or mmap refused, a
//! memory limit), the link stays a plain Unix link on the other plane; the
//! log says so once.

mod offer;
mod reader;

use super::peer_process::PeerProcess;
use super::{
    ControlSent, Established, Fabric, LinkPlane, PlaneConfig, lost, recv_ready, send_stop,
};
use crate::arena::Arena;
use crate::error::link::LinkFailure;
use crate::transport::conn::Conn;
use crate::transport::framing::padded_head;
use crate::transport::inbox::{Await, Inbox};
use crate::transport::{Incoming, LinkError, Received, lock};
use crate::wire::{HEADER_LEN, Header};
use offer::{give_arena, offer, take, take_arena};
use reader::{Partial, Place, Rx};
use ringwire_shm::{Consumer, MappedRing, Producer, RING_HEADER};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// Data bytes of each direction's ring: two chunks of the default size in
/// flight, so a sender of large frames keeps a frame ahead.
const RING_BYTES: usize = 4 << 20;

/// Doorbell bytes (their value is only for debugging: any byte wakes).
const DATA: u8 = b'D';
const SPACE: u8 = b'S';

/// Pure spinning (no yield) before a wait starts yielding: a round trip
/// between two cores is well under a microsecond.
const PURE_SPIN: Duration = Duration::from_micros(20);

/// A sleeper wakes at least this often to look again (a doorbell meant
/// for the other direction may have been drained by its thread) and to
/// check the socket for a dead peer.
const NAP: Duration = Duration::from_millis(2);

/// The shm links of the process, for the heartbeat thread to drain, and
/// the process's arena, passed to every local peer with its link's rings.
pub(super) struct ShmLinks {
    links: Mutex<Vec<Weak<Shared>>>,
    /// Taken when the transport closes.
    arena: Mutex<Option<Arc<Arena>>>,
}

impl ShmLinks {
    /// The links of rank `me`, and its arena (made now; where it cannot be,
    /// collectives run over the links, and the log says so once).
    pub(super) fn new(me: usize) -> ShmLinks {
        let arena = match Arena::create() {
            Ok(arena) => Some(arena),
            Err(e) => {
                tracing::warn!(rank = me, error = %e, "no shared-memory arena (memfd or mmap refused?): collectives run over the links");
                None
            }
        };
        ShmLinks {
            links: Mutex::default(),
            arena: Mutex::new(arena),
        }
    }

    pub(super) fn arena(&self) -> Option<Arc<Arena>> {
        lock(&self.arena).clone()
    }

    /// Lets go of the arena (unmapped once no communicator holds a slot).
    pub(super) fn close(&self) {
        lock(&self.arena).take();
    }

    fn live(&self) -> Vec<Arc<Shared>> {
        let mut all = lock(&self.links);
        all.retain(|w| w.strong_count() > 0);
        all.iter().filter_map(Weak::upgrade).collect()
    }

    /// Files whatever waits in every link nobody is reading, and notices
    /// dead peers (the heartbeat thread's turn).
    pub(super) fn tick(&self, fabric: &dyn Fabric) {
        for link in self.live() {
            link.hear(fabric);
        }
    }

    /// Files what waits in every link with bytes that nobody is reading.
    /// Every waiting thread does this now and then: a rank keeps receiving
    /// while it waits for anything, so a peer blocked on a full ring
    /// towards it always gets room (two ranks sending to each other at
    /// once cannot block each other), as a socket's reader would.
    pub(super) fn drain_all(&self, fabric: &dyn Fabric) {
        // Under the list's lock (only a new link waits for it), and without
        // collecting the list: this runs in every wait, which allocates
        // nothing.
        let Ok(all) = self.links.try_lock() else {
            return;
        };
        for link in all.iter().filter_map(Weak::upgrade) {
            if link.rx_has_bytes()
                && let Ok(mut rx) = link.rx.try_lock()
            {
                link.drain(&mut rx, fabric);
            }
        }
    }
}

/// Makes a link's shm plane over its Unix socket, or says why not (the
/// caller then gives it its other plane). Both ends call this right after
/// the handshake: the dialer offers a segment, the acceptor takes it.
pub(super) fn start(
    links: &Arc<ShmLinks>,
    fabric: &Arc<dyn Fabric>,
    peer: usize,
    link: Established,
    config: &PlaneConfig,
    handshake_timeout: Duration,
) -> Result<Box<dyn LinkPlane>, (Established, io::Error)> {
    let Some(sock) = link.conn.unix() else {
        return Err((link, io::Error::other("not a Unix link")));
    };
    let segment = match sock
        .set_read_timeout(Some(handshake_timeout))
        .and_then(|()| match link.dialed {
            true => offer(sock),
            false => take(sock),
        }) {
        Ok(Some(segment)) => segment,
        Ok(None) => return Err((link, io::Error::other("the peer has no shared memory"))),
        Err(e) => return Err((link, e)),
    };
    let own_arena = links.arena();
    let own_arena = own_arena.as_deref();
    let peer_arena = match link.dialed {
        true => give_arena(sock, own_arena).and_then(|()| take_arena(sock)),
        false => take_arena(sock).and_then(|got| give_arena(sock, own_arena).map(|()| got)),
    };
    let peer_arena = match peer_arena {
        Ok(arena) => arena,
        Err(e) => return Err((link, e)),
    };
    let _ = sock.set_read_timeout(None);
    let peer_process = PeerProcess::of(sock);
    let dialed = link.dialed;
    let sock = match link.conn {
        Conn::Unix(s) => s,
        Conn::Tcp(_) => unreachable!("checked above"),
    };
    drop(link.halves);
    let shared = shared(
        Arc::new(segment.into_mapping()),
        dialed,
        (sock, peer_process),
        peer,
        config,
        links,
    );
    fabric.heard(peer);
    lock(&links.links).push(Arc::downgrade(&shared));
    Ok(Box::new(ShmLink { shared, peer_arena }))
}

/// One end of a link on `mapping`'s rings (ring 0 carries dialer ->
/// acceptor, ring 1 the other way), signalling over `sock`, to the peer
/// `process` (where it can be watched).
fn shared(
    mapping: Arc<ringwire_shm::Mapping>,
    dialed: bool,
    (sock, process): (UnixStream, Option<PeerProcess>),
    peer: usize,
    config: &PlaneConfig,
    links: &Arc<ShmLinks>,
) -> Arc<Shared> {
    let ring =
        |i: usize| MappedRing::new(mapping.clone(), i * (RING_HEADER + RING_BYTES), RING_BYTES);
    let (send, recv) = match dialed {
        true => (ring(0), ring(1)),
        false => (ring(1), ring(0)),
    };
    // A second reading end that only looks (`unread`), never reads, so
    // others can see bytes waiting without the reader's lock.
    let recv_view = Consumer::new(recv.clone());
    Arc::new(Shared {
        peer,
        tx: Mutex::new(Producer::new(send)),
        rx: Mutex::new(Rx {
            ring: Consumer::new(recv),
            frame: Partial::Head(0, [0; HEADER_LEN]),
            scratch: [0; 64],
        }),
        sock,
        dead: AtomicBool::new(false),
        eof: AtomicBool::new(false),
        process,
        exited: AtomicBool::new(false),
        config: config.clone(),
        links: Arc::downgrade(links),
        rx_bytes: recv_view,
    })
}

/// What the link's senders and readers share.
struct Shared {
    peer: usize,
    tx: Mutex<Producer<MappedRing>>,
    rx: Mutex<Rx>,
    sock: UnixStream,
    dead: AtomicBool,
    /// The peer closed its end: what it wrote before is still read (a
    /// peer that sent its last frame and exited), then the link fails.
    eof: AtomicBool,
    /// The peer's process, watched by its pidfd where it could be opened.
    process: Option<PeerProcess>,
    /// That process exited while its socket stays open (a child it forked
    /// holds it): read what it wrote, then fail the link, as on `eof`.
    exited: AtomicBool,
    config: PlaneConfig,
    /// The process's shm links, drained by this link's waiting threads.
    links: Weak<ShmLinks>,
    /// A reading end that only looks (`unread`), never reads: whether bytes
    /// wait, without the reader's lock.
    rx_bytes: Consumer<MappedRing>,
}

struct ShmLink {
    shared: Arc<Shared>,
    /// The peer's arena, if it passed one.
    peer_arena: Option<Arc<ringwire_shm::Mapping>>,
}

impl Shared {
    /// Whether bytes wait to be read (read without the reader's lock:
    /// racy, a hint for `drain_all`).
    fn rx_has_bytes(&self) -> bool {
        self.rx_bytes.unread() > 0
    }

    /// Drains the process's other shm links (see `ShmLinks::drain_all`).
    fn drain_others(&self, fabric: &dyn Fabric) {
        if let Some(links) = self.links.upgrade() {
            links.drain_all(fabric);
        }
    }

    /// Whether the peer is gone (its socket closed or its process exited):
    /// what it wrote before is read, then the link fails.
    fn ended(&self) -> bool {
        self.eof.load(Ordering::Relaxed) || self.exited.load(Ordering::Relaxed)
    }

    /// Whether the peer is known gone: the link failed, its socket closed
    /// or its process exited (asked of its pidfd now).
    fn gone(&self) -> bool {
        self.dead.load(Ordering::Relaxed)
            || self.ended()
            || self.process.as_ref().is_some_and(PeerProcess::exited)
    }

    /// What wakes a sleeper when the peer's process exits: its pidfd, or
    /// (where it has none) the socket again, which its end wakes.
    fn death_watch(&self) -> std::os::fd::BorrowedFd<'_> {
        match &self.process {
            Some(process) => process.fd(),
            None => self.sock.as_fd(),
        }
    }

    /// Why the link fails once the ended peer's bytes are read.
    fn end_failure(&self) -> LinkFailure {
        let eof = self.eof.load(Ordering::SeqCst);
        match &self.process {
            Some(process) if !eof && self.exited.load(Ordering::SeqCst) => {
                LinkFailure::Exited { pid: process.pid() }
            }
            // (A link already failed for another reason keeps that one:
            // the fabric holds the first failure.)
            _ => LinkFailure::Closed,
        }
    }

    /// Rings the peer's doorbell (never blocking: a full socket already
    /// holds a doorbell it has not read).
    fn ring(&self, which: u8) {
        use nix::sys::socket::{MsgFlags, send};
        use std::os::fd::AsRawFd;
        let _ = send(
            self.sock.as_raw_fd(),
            &[which],
            MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
        );
    }

    /// Files every whole frame waiting in the ring (not while the link is
    /// paused, decision 0019); whether any byte was read.
    fn drain(&self, rx: &mut Rx, fabric: &dyn Fabric) -> bool {
        self.drain_into(rx, fabric, None)
    }

    /// `drain`, reading the frame `place` takes into its destination (and
    /// stopping there) if it comes.
    fn drain_into(&self, rx: &mut Rx, fabric: &dyn Fabric, place: Option<&mut Place>) -> bool {
        let any = match rx.read(self.peer, fabric, place, &self.dead) {
            Ok(any) => any,
            Err(failure) => {
                self.fail(fabric, failure);
                return true;
            }
        };
        if any && rx.ring.producer_sleeping() {
            self.ring(SPACE);
        }
        // Everything the peer wrote before it closed is read: now it is gone.
        if self.ended() && rx.ring.available() == 0 {
            self.fail(fabric, self.end_failure());
        }
        any
    }

    /// Reads the socket's doorbells (noticing a dead peer), and files what
    /// the ring holds unless another thread reads it.
    fn hear(&self, fabric: &dyn Fabric) {
        self.check_alive(fabric);
        if let Ok(mut rx) = self.rx.try_lock() {
            self.drain(&mut rx, fabric);
        }
    }

    /// Reads what the socket holds (doorbells) without waiting; notices a
    /// broken socket (and fails the link), or a closed one or an exited
    /// process (and says so: the reader fails the link once it has read
    /// what came before).
    fn check_alive(&self, fabric: &dyn Fabric) {
        let mut buf = [0u8; 64];
        loop {
            match nix::sys::socket::recv(
                std::os::fd::AsRawFd::as_raw_fd(&self.sock),
                &mut buf,
                nix::sys::socket::MsgFlags::MSG_DONTWAIT,
            ) {
                Ok(0) => {
                    self.eof.store(true, Ordering::SeqCst);
                    return;
                }
                Ok(_) => continue,
                Err(nix::errno::Errno::EAGAIN) => break,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return self.fail(fabric, LinkFailure::of_io(&io::Error::from(e), false)),
            }
        }
        // The socket is open: is the process? (A sleeper's poll wakes on
        // its pidfd too, so a death is seen at once, not at the next tick.)
        if let Some(process) = &self.process
            && !self.exited.load(Ordering::Relaxed)
            && process.exited()
        {
            self.exited.store(true, Ordering::SeqCst);
        }
    }

    fn fail(&self, fabric: &dyn Fabric, failure: LinkFailure) {
        if !self.dead.swap(true, Ordering::SeqCst) {
            let _ = self.sock.shutdown(std::net::Shutdown::Both);
        }
        fabric.failed(self.peer, failure);
    }

    /// Sleeps on the socket until a doorbell, the peer's end, or `until`
    /// (at most a nap); reads the doorbells.
    fn nap(&self, fabric: &dyn Fabric, until: Instant) {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let wait = until.saturating_duration_since(Instant::now()).min(NAP);
        let mut fds =
            [self.sock.as_fd(), self.death_watch()].map(|fd| PollFd::new(fd, PollFlags::POLLIN));
        let ms = PollTimeout::try_from(wait.as_millis().max(1) as i32).unwrap_or(PollTimeout::ZERO);
        let _ = poll(&mut fds, ms);
        self.check_alive(fabric);
    }

    /// Waits for bytes in the reader's `ring` (or an abort of `comm_id`).
    fn wait_for_bytes(
        &self,
        ring: &Consumer<MappedRing>,
        fabric: &dyn Fabric,
        comm_id: u64,
        deadline: Instant,
    ) {
        self.wait(
            fabric,
            deadline,
            || ring.available() > 0 || fabric.aborted(comm_id).is_some(),
            || ring.arm(),
            || ring.disarm(),
        );
    }

    /// Waits for `ready`: spins, then yields (the spin budget), then naps
    /// on the socket with `arm` said (until `deadline`). `arm` returns
    /// whether `ready` holds after all once armed; `disarm` undoes it.
    fn wait(
        &self,
        fabric: &dyn Fabric,
        deadline: Instant,
        mut ready: impl FnMut() -> bool,
        arm: impl Fn() -> bool,
        disarm: impl Fn(),
    ) {
        // On a crowded host the core may be the peer's: yield from the
        // start (poll_for does).
        let pure_spin = if self.config.crowded {
            Duration::ZERO
        } else {
            PURE_SPIN
        };
        let start = Instant::now();
        while start.elapsed() < pure_spin {
            if ready() {
                return;
            }
            std::hint::spin_loop();
        }
        let polled = crate::spin::poll_for(self.config.spin, || {
            self.drain_others(fabric);
            ready().then_some(())
        });
        if polled.is_some() {
            return;
        }
        while !ready()
            && Instant::now() < deadline
            && !self.dead.load(Ordering::Relaxed)
            && !self.ended()
        {
            if !arm() {
                self.nap(fabric, deadline);
            }
            disarm();
            self.drain_others(fabric);
        }
    }
}

impl LinkPlane for ShmLink {
    fn send(
        &self,
        fabric: &dyn Fabric,
        peer: usize,
        header: &Header,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<(), LinkError> {
        let s = &*self.shared;
        // The link's writer, waited for only until the op must stop.
        let mut tx = loop {
            match s.tx.try_lock() {
                Ok(tx) => break tx,
                Err(std::sync::TryLockError::Poisoned(p)) => break p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {}
            }
            if let Some(stop) = send_stop(fabric, header.comm_id, deadline) {
                return Err(stop);
            }
            std::thread::yield_now();
        };
        let (head, head_len) = padded_head(header);
        let zeros = [0u8; 64];
        let parts: [&[u8]; 3] = [&head[..head_len], payload, &zeros[..header.trail_len()]];
        let give_up = Instant::now() + s.config.write_timeout;
        let mut written = 0usize;
        for part in parts {
            let mut at = 0;
            while at < part.len() {
                if s.dead.load(Ordering::Relaxed) || s.ended() {
                    let failure = s.end_failure();
                    s.fail(fabric, failure.clone());
                    return Err(lost(fabric, header.comm_id, peer, failure));
                }
                let n = tx.push(&part[at..]);
                at += n;
                written += n;
                if n > 0 {
                    if tx.consumer_sleeping() {
                        s.ring(DATA);
                    }
                    continue;
                }
                // Full: nothing of the frame out yet stops at the op's
                // deadline or abort (the link stays); a frame part way out
                // finishes or fails the link at the write timeout.
                let until = if written == 0 {
                    if let Some(stop) = send_stop(fabric, header.comm_id, deadline) {
                        return Err(stop);
                    }
                    deadline.min(give_up)
                } else {
                    give_up
                };
                // An abort of the op's communicator while part of the frame
                // is out: the peer stopped reading this op, and a torn frame
                // cannot be taken back, so the link goes too.
                let aborted = written > 0 && fabric.aborted(header.comm_id).is_some();
                if aborted || Instant::now() >= give_up {
                    fabric.failed(peer, LinkFailure::StoppedReading);
                    return Err(lost(
                        fabric,
                        header.comm_id,
                        peer,
                        LinkFailure::StoppedReading,
                    ));
                }
                let tx_ref = &*tx;
                let comm_id = header.comm_id;
                s.wait(
                    fabric,
                    until,
                    || tx_ref.free() > 0 || fabric.aborted(comm_id).is_some(),
                    || tx_ref.arm(),
                    || tx_ref.disarm(),
                );
            }
        }
        fabric.sent(peer);
        Ok(())
    }

    fn recv(
        &self,
        fabric: &dyn Fabric,
        inbox: &Inbox,
        comm_id: u64,
        peer: usize,
        deadline: Instant,
    ) -> Result<Incoming, LinkError> {
        let s = &*self.shared;
        let _waiting = fabric.inboxes().waiting_on(inbox, peer, Await::Inbox);
        loop {
            if let Some(done) = recv_ready(fabric, inbox, comm_id, peer, deadline) {
                return done;
            }
            match s.rx.try_lock() {
                Ok(mut rx) => {
                    if s.drain(&mut rx, fabric) {
                        continue;
                    }
                    // Nothing here yet: wait for bytes (or our frame, filed
                    // by nobody else while we hold the reader).
                    s.wait_for_bytes(&rx.ring, fabric, comm_id, deadline);
                }
                Err(_) => {
                    // Another thread reads this link and files our frame.
                    let soon = Instant::now() + NAP;
                    if let Some(frame) = inbox.wait_until(soon.min(deadline), |q| q.pop_front()) {
                        return Ok(frame);
                    }
                }
            }
        }
    }

    /// Reads the frame straight into `dest` if it is the next one this
    /// thread reads from the ring; else as `recv`.
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
        let s = &*self.shared;
        let _waiting = fabric.inboxes().waiting_on(inbox, peer, Await::Placement);
        let mut place = Place {
            key: (comm_id, seq, step, chunk),
            dest,
            placed: None,
        };
        loop {
            if let Some(done) = recv_ready(fabric, inbox, comm_id, peer, deadline) {
                return done.map(Received::Frame);
            }
            let Ok(mut rx) = s.rx.try_lock() else {
                // Another thread reads this link and files our frame.
                let soon = Instant::now() + NAP;
                if let Some(frame) = inbox.wait_until(soon.min(deadline), |q| q.pop_front()) {
                    return Ok(Received::Frame(frame));
                }
                continue;
            };
            // The reader is held while a frame is part way into `dest`:
            // nobody else may read on from there.
            loop {
                let progressed = s.drain_into(&mut rx, fabric, Some(&mut place));
                if let Some(header) = place.placed {
                    return Ok(Received::Placed(header));
                }
                let placing = rx.placing();
                if !placing && progressed {
                    break; // frames filed: look in the inbox
                }
                if placing
                    && (fabric.aborted(comm_id).is_some()
                        || fabric.failure(peer).is_some()
                        || s.dead.load(Ordering::Relaxed)
                        || Instant::now() >= deadline)
                {
                    rx.detach(place.dest, fabric);
                    break;
                }
                s.wait_for_bytes(&rx.ring, fabric, comm_id, deadline);
                if !placing {
                    break;
                }
            }
        }
    }

    fn send_control(&self, peer: usize, frame: &[u8], wait: bool) -> ControlSent {
        let s = &*self.shared;
        let _ = peer;
        let mut tx = match (wait, s.tx.try_lock()) {
            (_, Ok(tx)) => tx,
            (false, Err(_)) => return ControlSent::Busy,
            (true, Err(_)) => lock(&s.tx),
        };
        // A full ring is busy; waiting (an abort's own thread), the peer
        // gets a second to make room (it reads whenever it waits, and its
        // heartbeat thread drains it), never more: a peer that stopped
        // reading must not hold the abort of the others, nor one that is
        // gone (its ring full of what it will never read).
        let until = Instant::now() + Duration::from_secs(1);
        while tx.free() < frame.len() {
            if !wait || s.gone() || Instant::now() >= until {
                return ControlSent::Busy;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        tx.push(frame);
        if tx.consumer_sleeping() {
            s.ring(DATA);
        }
        ControlSent::Sent
    }

    fn shut_down(&self) {
        let s = &*self.shared;
        s.dead.store(true, Ordering::SeqCst);
        let _ = s.sock.shutdown(std::net::Shutdown::Both);
    }

    fn kind(&self) -> Option<&'static str> {
        Some("shm")
    }

    fn peer_arena(&self) -> Option<Arc<ringwire_shm::Mapping>> {
        self.peer_arena.clone()
    }

    fn ring_doorbell(&self) {
        self.shared.ring(DATA);
    }

    fn doorbell(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        Some(self.shared.sock.as_fd())
    }

    fn death_watch(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.shared.process.as_ref().map(PeerProcess::fd)
    }

    fn hear_doorbell(&self, fabric: &dyn Fabric) {
        self.shared.hear(fabric);
    }
}

#[cfg(test)]
mod tests;
