//! The shared-memory plane: a link to a rank on this host as two byte rings
//! in one sealed memfd segment (`ringwire_shm`), one per direction, made
//! over the link's Unix socket once its handshake passed (the dialer makes
//! the segment and passes it with SCM_RIGHTS; the acceptor checks and maps
//! it). Frames travel through the rings laid out as on a socket, so every
//! schedule runs on it unchanged, with no system call on the way.
//!
//! The Unix socket stays: a sleeper is woken by a one-byte doorbell on it,
//! sent only when the sleeper said it sleeps (the rings' armed words), and
//! its end of stream is how a dead peer is seen. A thread that waits for a
//! frame of this link reads the ring itself and files what it finds (one
//! at a time: others wait on their inboxes); the heartbeat thread drains it
//! when nobody waits, so heartbeats and aborts are heard.
//!
//! Where a segment cannot be made or mapped (memfd or mmap refused, a
//! memory limit), the link stays a plain Unix link on the other plane; the
//! log says so once.

use super::{
    ControlSent, Established, Fabric, LinkPlane, PlaneConfig, lost, recv_ready, send_stop,
};
use crate::transport::conn::Conn;
use crate::transport::failure::LinkFailure;
use crate::transport::framing::padded_head;
use crate::transport::inbox::{Await, Inbox};
use crate::transport::{AlignedBuf, Incoming, LinkError, lock};
use crate::wire::{HEADER_LEN, Header};
use ringwire_shm::{Consumer, MappedRing, Producer, RING_HEADER, Segment, recv_fd, send_fd};
use std::io::{self, Read};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// Data bytes of each direction's ring: two chunks of the default size in
/// flight, so a sender of large frames keeps a frame ahead.
const RING_BYTES: usize = 4 << 20;

/// What the dialer sends with the segment: magic, version, ring bytes.
const OFFER_MAGIC: &[u8; 4] = b"RWSM";
const OFFER_VERSION: u32 = 1;
const OFFER_LEN: usize = 16;

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

/// The shm links of the process, for the heartbeat thread to drain.
#[derive(Default)]
pub(super) struct ShmLinks {
    links: Mutex<Vec<Weak<Shared>>>,
}

impl ShmLinks {
    fn live(&self) -> Vec<Arc<Shared>> {
        let mut all = lock(&self.links);
        all.retain(|w| w.strong_count() > 0);
        all.iter().filter_map(Weak::upgrade).collect()
    }

    /// Files whatever waits in every link nobody is reading, and notices
    /// dead peers (the heartbeat thread's turn).
    pub(super) fn tick(&self, fabric: &dyn Fabric) {
        for link in self.live() {
            if let Ok(mut rx) = link.rx.try_lock() {
                link.check_alive(fabric);
                link.drain(&mut rx, fabric);
            }
        }
    }

    /// Files what waits in every link with bytes that nobody is reading.
    /// Every waiting thread does this now and then: a rank keeps receiving
    /// while it waits for anything, so a peer blocked on a full ring
    /// towards it always gets room (two ranks sending to each other at
    /// once cannot block each other), as a socket's reader would.
    fn drain_all(&self, fabric: &dyn Fabric) {
        // Under the list's lock (only a new link waits for it), and without
        // collecting the list: this runs in every wait, which allocates
        // nothing.
        let Ok(all) = self.links.try_lock() else {
            return;
        };
        for link in all.iter().filter_map(Weak::upgrade) {
            if link.rx_has_bytes() {
                if let Ok(mut rx) = link.rx.try_lock() {
                    link.drain(&mut rx, fabric);
                }
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
    let _ = sock.set_read_timeout(None);
    let mapping = Arc::new(segment.into_mapping());
    // Ring 0 carries dialer -> acceptor, ring 1 the other way.
    let ring =
        |i: usize| MappedRing::new(mapping.clone(), i * (RING_HEADER + RING_BYTES), RING_BYTES);
    let (send, recv) = match link.dialed {
        true => (ring(0), ring(1)),
        false => (ring(1), ring(0)),
    };
    // A second reading end that only looks (`unread`), never reads, so
    // others can see bytes waiting without the reader's lock.
    let recv_view = Consumer::new(recv.clone());
    let sock = match link.conn {
        Conn::Unix(s) => s,
        Conn::Tcp(_) => unreachable!("checked above"),
    };
    drop(link.halves);
    let shared = Arc::new(Shared {
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
        config: config.clone(),
        links: Arc::downgrade(links),
        rx_bytes: recv_view,
    });
    fabric.heard(peer);
    lock(&links.links).push(Arc::downgrade(&shared));
    Ok(Box::new(ShmLink { shared }))
}

/// Segment bytes for two rings.
fn segment_len() -> usize {
    2 * (RING_HEADER + RING_BYTES)
}

/// The dialer's half: makes the segment and offers it; `None` if it could
/// not (the acceptor is told, and both keep the Unix link).
fn offer(sock: &UnixStream) -> io::Result<Option<Segment>> {
    let mut msg = [0u8; OFFER_LEN];
    msg[..4].copy_from_slice(OFFER_MAGIC);
    msg[4..8].copy_from_slice(&OFFER_VERSION.to_le_bytes());
    match Segment::create(segment_len()) {
        Ok(mut segment) => {
            msg[8..16].copy_from_slice(&(RING_BYTES as u64).to_le_bytes());
            let fd = segment.take_fd().expect("a segment made here has its fd");
            send_fd(sock, fd.as_fd(), &msg)?;
            drop(fd);
            let mut answer = [0u8; 1];
            (&*sock).read_exact(&mut answer)?;
            Ok((answer[0] == 1).then_some(segment))
        }
        Err(e) => {
            tracing::warn!(error = %e, "no shared memory for a local link (memfd or mmap refused?): it stays a Unix socket");
            // Ring size 0: no segment comes.
            io::Write::write_all(&mut &*sock, &msg)?;
            Ok(None)
        }
    }
}

/// The acceptor's half: takes and checks the offered segment, and says
/// whether it mapped it.
fn take(sock: &UnixStream) -> io::Result<Option<Segment>> {
    let mut msg = [0u8; OFFER_LEN];
    let (n, fd) = recv_fd(sock, &mut msg)?;
    if n != OFFER_LEN || &msg[..4] != OFFER_MAGIC {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the peer's shared-memory offer is garbled",
        ));
    }
    let version = u32::from_le_bytes(msg[4..8].try_into().expect("4 bytes"));
    let ring = u64::from_le_bytes(msg[8..16].try_into().expect("8 bytes")) as usize;
    let Some(fd) = fd else {
        return Ok(None); // the dialer has none
    };
    let mapped = if version != OFFER_VERSION || ring != RING_BYTES {
        Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "the peer offers rings of {ring} bytes (version {version}); this build uses {RING_BYTES} (version {OFFER_VERSION})"
            ),
        ))
    } else {
        Segment::open(fd, segment_len())
    };
    let answer = [u8::from(mapped.is_ok())];
    io::Write::write_all(&mut &*sock, &answer)?;
    match mapped {
        Ok(segment) => Ok(Some(segment)),
        Err(e) => {
            tracing::warn!(error = %e, "could not map a local peer's shared memory: the link stays a Unix socket");
            Ok(None)
        }
    }
}

/// Where reading the ring is inside a frame.
enum Partial {
    /// `n` bytes of the header so far.
    Head(usize, [u8; HEADER_LEN]),
    /// The header checked; `skip` pad bytes left, then the payload into
    /// `buf` (`got` bytes so far), then `trail` zeros.
    Body {
        header: Header,
        skip: usize,
        buf: AlignedBuf,
        got: usize,
        trail: usize,
    },
}

struct Rx {
    ring: Consumer<MappedRing>,
    frame: Partial,
    scratch: [u8; 64],
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
    config: PlaneConfig,
    /// The process's shm links, drained by this link's waiting threads.
    links: Weak<ShmLinks>,
    /// A reading end that only looks (`unread`), never reads: whether bytes
    /// wait, without the reader's lock.
    rx_bytes: Consumer<MappedRing>,
}

struct ShmLink {
    shared: Arc<Shared>,
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
        let mut any = false;
        while !self.dead.load(Ordering::Relaxed) {
            if matches!(rx.frame, Partial::Head(0, _)) && fabric.inboxes().paused(self.peer) {
                break;
            }
            let Rx {
                ring,
                frame,
                scratch,
            } = rx;
            let progressed = match frame {
                Partial::Head(n, head) => {
                    let got = ring.pop(&mut head[*n..]);
                    *n += got;
                    if *n == HEADER_LEN {
                        match fabric.header(self.peer, &head[..]) {
                            Ok(header) => {
                                let mut buf = fabric.inboxes().buffer();
                                buf.prepare(header.payload_len_usize());
                                *frame = Partial::Body {
                                    skip: usize::from(header.pad),
                                    trail: header.trail_len(),
                                    header,
                                    buf,
                                    got: 0,
                                };
                            }
                            Err(failure) => {
                                self.fail(fabric, failure);
                                return true;
                            }
                        }
                    }
                    got > 0
                }
                Partial::Body {
                    header,
                    skip,
                    buf,
                    got,
                    trail,
                } => {
                    let mut moved = 0;
                    if *skip > 0 {
                        let n = ring.pop(&mut scratch[..*skip]);
                        *skip -= n;
                        moved += n;
                    }
                    if *skip == 0 {
                        let want = header.payload_len_usize();
                        if *got < want {
                            let n = ring.pop(&mut buf.bytes_mut()[*got..want]);
                            *got += n;
                            moved += n;
                        }
                        if *got == want && *trail > 0 {
                            let n = ring.pop(&mut scratch[..*trail]);
                            *trail -= n;
                            moved += n;
                        }
                    }
                    if *skip == 0 && *got == header.payload_len_usize() && *trail == 0 {
                        let Partial::Body { header, buf, .. } =
                            std::mem::replace(frame, Partial::Head(0, [0; HEADER_LEN]))
                        else {
                            unreachable!("just matched");
                        };
                        fabric.arrived(self.peer, header, buf, true);
                        true
                    } else {
                        moved > 0
                    }
                }
            };
            if !progressed {
                break;
            }
            any = true;
        }
        if any && rx.ring.producer_sleeping() {
            self.ring(SPACE);
        }
        // Everything the peer wrote before it closed is read: now it is gone.
        if self.eof.load(Ordering::SeqCst) && rx.ring.available() == 0 {
            self.fail(fabric, LinkFailure::Closed);
        }
        any
    }

    /// Reads what the socket holds (doorbells) without waiting; notices a
    /// broken socket (and fails the link) or a closed one (and says so:
    /// the reader fails the link once it has read what came before).
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
                Err(nix::errno::Errno::EAGAIN) => return,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return self.fail(fabric, LinkFailure::of_io(&io::Error::from(e), false)),
            }
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
        let mut fds = [PollFd::new(self.sock.as_fd(), PollFlags::POLLIN)];
        let ms = PollTimeout::try_from(wait.as_millis().max(1) as i32).unwrap_or(PollTimeout::ZERO);
        let _ = poll(&mut fds, ms);
        self.check_alive(fabric);
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
        let start = Instant::now();
        while start.elapsed() < PURE_SPIN {
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
            && !self.eof.load(Ordering::Relaxed)
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
                if s.dead.load(Ordering::Relaxed) || s.eof.load(Ordering::Relaxed) {
                    s.fail(fabric, LinkFailure::Closed);
                    return Err(lost(fabric, header.comm_id, peer, LinkFailure::Closed));
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
                    let rx_ref = &mut *rx;
                    let ring = &rx_ref.ring;
                    s.wait(
                        fabric,
                        deadline,
                        || ring.available() > 0 || fabric.aborted(comm_id).is_some(),
                        || ring.arm(),
                        || ring.disarm(),
                    );
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
        // reading must not hold the abort of the others.
        let until = Instant::now() + Duration::from_secs(1);
        while tx.free() < frame.len() {
            if !wait || s.dead.load(Ordering::Relaxed) || Instant::now() >= until {
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
}
