//! The portable plane: a reader thread per link files what arrives, and
//! senders share the link's writer (blocking `writev`). It runs wherever
//! sockets do (io_uring refused, TLS), and is the baseline every benchmark
//! shows beside the engine.

use super::{ControlSent, Established, Fabric, LinkPlane, PlaneConfig, send_stop};
use crate::error::link::{LinkFailure, Loss};
use crate::security::{ReadHalf, WriteHalf};
use crate::transport::conn::Conn;
use crate::transport::framing::{read_payload, write_counted, write_frame_from};
use crate::transport::inbox::{Await, Inbox};
use crate::transport::{Incoming, LinkError, lock};
use crate::wire::{HEADER_LEN, Header};
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The portable reader polls for the next frame only after one of at most
/// this many payload bytes (see `read_loop`).
const POLLED_FRAME_BYTES: usize = 64 << 10;

/// How long the portable reader polls after a small frame even while no
/// thread waits for the next one (see `poll_for_next_frame`).
const READER_GRACE: Duration = Duration::from_micros(50);

/// A link of the portable plane.
pub(super) struct PortableLink {
    socket: Arc<Socket>,
    config: PlaneConfig,
}

/// What the link's reader thread shares with its senders.
struct Socket {
    /// Executors share the writer, one frame at a time.
    writer: Mutex<WriteHalf>,
    /// The socket itself, for shutdown, timeouts and readiness.
    control: Conn,
}

impl PortableLink {
    /// Starts the link's reader thread (it files frames through `fabric`
    /// until the link fails or is shut down).
    pub(super) fn start(
        fabric: &Arc<dyn Fabric>,
        peer: usize,
        link: Established,
        config: &PlaneConfig,
    ) -> io::Result<Box<dyn LinkPlane>> {
        let (reader, writer) = link.halves;
        let socket = Arc::new(Socket {
            writer: Mutex::new(writer),
            control: link.conn,
        });
        // Plaintext reads come straight from the socket, so its readiness
        // says whether a read would block (TLS may hold decrypted bytes).
        let polled = (!config.tls).then(|| socket.clone());
        let (fabric, spin) = (fabric.clone(), config.spin);
        std::thread::Builder::new()
            .name(format!("ringwire-rx-{peer}"))
            .spawn(move || read_loop(&*fabric, peer, reader, polled.as_deref(), spin))?;
        Ok(Box::new(PortableLink {
            socket,
            config: config.clone(),
        }))
    }

    /// Whether the socket takes a few bytes now without blocking.
    fn writable_now(&self) -> bool {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let mut fds = [PollFd::new(self.socket.control.as_fd(), PollFlags::POLLOUT)];
        matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
    }

    /// Writes a control frame; one that failed after part of it went out
    /// tears the link, so it is shut down (its reader then reports it
    /// lost); one that put nothing out leaves it (but a TLS writer may
    /// have put part of a record out while reporting nothing written).
    fn write_control(&self, peer: usize, w: &mut WriteHalf, frame: &[u8]) -> ControlSent {
        let mut written = 0;
        let result = write_counted(&mut **w, frame, &mut written);
        match result.and_then(|()| w.flush()) {
            Ok(()) => ControlSent::Sent,
            Err(e) => {
                tracing::debug!(peer, error = %e, "could not send a control frame");
                if written > 0 || self.config.tls {
                    self.shut_down();
                }
                ControlSent::Failed
            }
        }
    }

    /// The write of one data frame. Until a byte of it has gone out it
    /// stops, leaving the link whole, when its communicator is aborted or
    /// its op's deadline passes while it waits for the link's writer; and a
    /// write that times out with nothing of the frame out ends the op
    /// alone too. Late in an op (or under a handle's shorter timeout) the
    /// socket's write timeout is bounded by what the op has left;
    /// otherwise it is the write timeout, which is the op timeout, so such
    /// an op ends at most a second late (and one with more time than that,
    /// under a handle's longer timeout, tries again). Once bytes went out,
    /// the frame is finished or the link fails, each write bounded by the
    /// write timeout as always. A TLS writer may have put part of a record
    /// out even when it reports nothing written, so on TLS links any timed
    /// out write fails the link. `Err` is the stop; `Ok` carries the
    /// write's own result.
    fn write_data(
        &self,
        fabric: &dyn Fabric,
        header: &Header,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<io::Result<()>, LinkError> {
        let mut w = self.lock_writer(fabric, header.comm_id, deadline)?;
        let plain = !self.config.tls;
        let write_timeout = self.config.write_timeout;
        let mut written = 0;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            // Setting the socket option twice per frame is for the rare op
            // with less than the write timeout left by more than a second.
            let bounded = plain && left + Duration::from_secs(1) < write_timeout;
            if bounded {
                self.set_write_timeout(left.max(Duration::from_millis(1)));
            }
            let result = write_frame_from(&mut **w, header, payload, &mut written);
            if bounded {
                self.set_write_timeout(write_timeout);
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
            if let Some(stop) = send_stop(fabric, header.comm_id, deadline) {
                return Err(stop);
            }
            // Nothing out and time left (a handle's timeout longer than the
            // write timeout): try again.
        }
    }

    /// Takes the link's writer, waiting while another op's frame is going
    /// out, but only until this op must stop (see `send_stop`). A frame
    /// usually takes microseconds, so it yields a few times before it
    /// naps, and naps stay short.
    fn lock_writer(
        &self,
        fabric: &dyn Fabric,
        comm_id: u64,
        deadline: Instant,
    ) -> Result<MutexGuard<'_, WriteHalf>, LinkError> {
        let mut tries = 0u32;
        loop {
            match self.socket.writer.try_lock() {
                Ok(w) => return Ok(w),
                Err(std::sync::TryLockError::Poisoned(p)) => return Ok(p.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => {}
            }
            if let Some(stop) = send_stop(fabric, comm_id, deadline) {
                return Err(stop);
            }
            tries += 1;
            match tries {
                ..=16 => std::thread::yield_now(),
                _ => std::thread::sleep(Duration::from_micros(50 << (tries - 16).min(2))),
            }
        }
    }

    /// Sets the socket's write timeout (its writer's socket is the same).
    fn set_write_timeout(&self, timeout: Duration) {
        let _ = self.socket.control.set_write_timeout(Some(timeout));
    }
}

impl LinkPlane for PortableLink {
    fn send(
        &self,
        fabric: &dyn Fabric,
        peer: usize,
        header: &Header,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<(), LinkError> {
        // Err: nothing of the frame went out; the op ends, the link stays.
        let result = self.write_data(fabric, header, payload, deadline)?;
        fabric.sent(peer);
        result.map_err(|e| {
            let failure = match write_timed_out(&e) {
                true => LinkFailure::StoppedReading,
                false => LinkFailure::of_io(&e, true),
            };
            fabric.failed(peer, failure.clone());
            // An abort that came while the write was blocked explains it;
            // else this write's own failure.
            fabric
                .aborted(header.comm_id)
                .unwrap_or_else(|| LinkError::Lost(Loss::new(peer, failure)))
        })
    }

    fn recv(
        &self,
        fabric: &dyn Fabric,
        inbox: &Inbox,
        comm_id: u64,
        peer: usize,
        deadline: Instant,
    ) -> Result<Incoming, LinkError> {
        let _waiting = fabric.inboxes().waiting_on(inbox, peer, Await::Inbox);
        // Poll briefly before sleeping: a frame the link's reader thread
        // files within the spin is taken without a second wake-up (the
        // reader's own is unavoidable on this plane). An abort still ends
        // the op first, as in the wait below.
        let budget = (self.config.spin).min(deadline.saturating_duration_since(Instant::now()));
        if let Some(polled) = crate::spin::poll_for(budget, || match fabric.aborted(comm_id) {
            Some(e) => Some(Err(e)),
            None => inbox.pop().map(Ok),
        }) {
            return polled;
        }
        inbox
            .wait_until(deadline, |queue| {
                // An abort ends the op at once, even with frames queued:
                // the op cannot complete on every rank any more.
                if let Some(e) = fabric.aborted(comm_id) {
                    return Some(Err(e));
                }
                if let Some(frame) = queue.pop_front() {
                    return Some(Ok(frame));
                }
                fabric.failure(peer).map(|loss| Err(LinkError::Lost(loss)))
            })
            .unwrap_or(Err(LinkError::Timeout))
    }

    fn send_control(&self, peer: usize, frame: &[u8], wait: bool) -> ControlSent {
        if wait {
            return self.write_control(peer, &mut lock(&self.socket.writer), frame);
        }
        // A busy writer is traffic enough, and a full socket (a peer that
        // stopped reading this link) must not block the caller.
        if !self.writable_now() {
            return ControlSent::Busy;
        }
        match self.socket.writer.try_lock() {
            Ok(mut w) => self.write_control(peer, &mut w, frame),
            Err(_) => ControlSent::Busy,
        }
    }

    fn shut_down(&self) {
        let _ = self.socket.control.shutdown(Shutdown::Both);
    }

    fn stop_sending(&self) {
        let _ = self.socket.control.shutdown(Shutdown::Write);
    }
}

/// Reads frames from `peer` until the link fails or is shut down, and
/// reports why it ended. Polls `socket` (plaintext links) after small
/// frames, see `poll_for_next_frame`.
fn read_loop(
    fabric: &dyn Fabric,
    peer: usize,
    mut stream: ReadHalf,
    socket: Option<&Socket>,
    spin: Duration,
) {
    fabric.heard(peer);
    let inboxes = fabric.inboxes();
    // Polling pays where frames are small (latency-bound exchanges); with
    // large ones the peer is busy writing a payload, and a polling reader
    // would only take turns on the core with it.
    let mut last_small = true;
    let failure = loop {
        if inboxes.wait_while_paused(peer) {
            // The pause was this rank's doing: the silence does not count.
            fabric.heard(peer);
        }
        if let Some(socket) = socket.filter(|_| last_small) {
            poll_for_next_frame(fabric, peer, &socket.control, spin);
        }
        let mut head = [0u8; HEADER_LEN];
        if let Err(e) = stream.read_exact(&mut head) {
            break LinkFailure::of_io(&e, false);
        }
        let header = match fabric.header(peer, &head) {
            Ok(h) => h,
            Err(failure) => break failure,
        };
        last_small = header.payload_len_usize() <= POLLED_FRAME_BYTES;
        let mut buf = inboxes.buffer();
        let payload = buf.prepare(header.payload_len_usize());
        if let Err(e) = read_payload(&mut stream, &header, payload) {
            break LinkFailure::of_io(&e, false);
        }
        fabric.arrived(peer, header, buf, true);
    };
    fabric.failed(peer, failure);
}

/// After a small frame of `peer`: polls the link's socket (yielding
/// between polls) instead of sleeping in `read`, for [`READER_GRACE`] and,
/// while a thread here waits for a frame of `peer`, up to the spin budget,
/// so the next frame of a latency-bound exchange is read without waking
/// this reader thread. (The grace covers the time its op thread takes to
/// finish the op and wait for the next frame.)
fn poll_for_next_frame(fabric: &dyn Fabric, peer: usize, socket: &Conn, spin: Duration) {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let start = Instant::now();
    let awaited = || fabric.inboxes().awaited(peer);
    // Bytes, end of stream or an error: the read will not block. (A poll,
    // not a peek: it takes no socket lock that arriving segments would
    // wait for.)
    let readable = || {
        let mut fds = [PollFd::new(socket.as_fd(), PollFlags::POLLIN)];
        !matches!(poll(&mut fds, PollTimeout::ZERO), Ok(0))
    };
    crate::spin::poll_for(spin, || {
        let give_up = !awaited() && start.elapsed() >= READER_GRACE;
        (readable() || give_up).then_some(())
    });
}

/// Whether a blocking write failed for its socket's write timeout.
fn write_timed_out(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}
