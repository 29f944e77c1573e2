//! The ring itself: submission entries for receives, sends and the wake-up
//! eventfd, and what each completion means. The only module of the engine
//! that hands memory to the kernel, so every `unsafe` block is here.
//!
//! The rule that keeps it sound: memory named by an entry in flight stays
//! valid until that entry's completion is taken. Staging buffers, payload
//! buffers, `msghdr`/`iovec`s and the eventfd word are owned by `Driver`
//! (boxed, so they never move) and are only dropped after their completion
//! or, when the ring is torn down with entries still in flight, leaked.
//! Borrowed send payloads belong to a caller that `FrameEngine::send` keeps
//! waiting until the completion has been recorded.
#![allow(unsafe_code)]

use super::head_slots::{HEAD_SLOTS, HeadSlots};
use super::lanes::{self, LaneLoad, PIECE_HEADER, PieceFit, PieceHeader};
use super::shard_thread::{EngineThread, ThreadCounters};
use super::{
    Body, EngineConfig, FrameSink, LaneCounters, Lanes, LanesToInstall, LinkFault, MAX_FRAME_ALIGN,
    MAX_HEADER, Outcome, PlaceRequest, Queued, SendRequest, SharedFd,
};
use crate::AlignedBuf;
use io_uring::{IoUring, opcode, squeue, types};
use nix::sys::socket::{Shutdown, shutdown};
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

// SAFETY: a `SendRequest` is plain data except for `Body::Borrowed`'s
// pointer, which is only read by the kernel (through an entry built in this
// module) while the caller that owns the memory is parked in
// `FrameEngine::send`; moving the request between threads does not touch it.
unsafe impl Send for SendRequest {}

// SAFETY: as for `SendRequest`: the pointer is written only by the kernel
// or this module while its owner is parked in
// `FrameEngine::receive_in_place`.
unsafe impl Send for PlaceRequest {}

/// What a completion is for: the low four bits of `user_data`; the next
/// four name a send lane's header slot (`HeadSlots`), the next byte the
/// connection of the link (0: its main one; `1 + i`: lane `i`), and the
/// link is above that.
const KIND: u64 = 0x0f;
const RECV: u64 = 1;
const SEND: u64 = 2;
const WAKE: u64 = 3;
const CANCEL: u64 = 4;
/// The message that wakes an engine thread (`shard_thread.rs`); its link
/// field names the slot in `Driver::wakers` of the thread that sent it.
const THREAD_WAKE: u64 = 5;

/// `IORING_SEND_ZC_REPORT_USAGE` (sqe ioprio of a SEND_ZC) and
/// `IORING_NOTIF_USAGE_ZC_COPIED` (in the notification's result).
const SEND_ZC_REPORT_USAGE: u16 = 1 << 3;
const NOTIF_USAGE_ZC_COPIED: u32 = 1 << 31;

/// Whether a link's large sends go zero-copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ZeroCopy {
    /// The next large send tries SEND_ZC and asks the kernel to report.
    Untried,
    /// That send is in flight.
    Probing,
    /// The kernel sent without copying: keep using SEND_ZC.
    On,
    /// The kernel copied (loopback, veth, NICs without offload) or refused
    /// SEND_ZC on this socket: plain sends.
    Off,
}

/// Frames with at most this many bytes left (and below the zero-copy
/// threshold) go out by a plain `sendmsg` when the socket takes them at
/// once (`Driver::send_directly`).
pub(crate) const DIRECT_SEND_BYTES: usize = 64 << 10;

/// A polling driver reads small frames with plain non-blocking `recv` calls
/// when the ring has at most this many links (`Driver::receive_directly`);
/// beyond it, one call per link per poll would cost more than it saves.
const DIRECT_RECV_LINKS: usize = 8;

/// A non-blocking socket call's return as a ring completion's result (bytes,
/// or minus the errno); `None` if it would have blocked or was interrupted.
fn completion_result(n: isize) -> Option<i32> {
    if n >= 0 {
        return Some(n as i32);
    }
    match io::Error::last_os_error().raw_os_error() {
        Some(libc::EAGAIN | libc::EINTR) => None,
        Some(code) => Some(-code),
        None => Some(-libc::EIO),
    }
}

/// The zeros that end frames (sends point at them; nothing writes here).
static ZEROS: [u8; MAX_FRAME_ALIGN] = [0; MAX_FRAME_ALIGN];

fn tag(kind: u64, link: usize) -> u64 {
    lane_tag(kind, link, 0)
}

/// `tag` for a link's connection `conn` (0: main; `1 + i`: lane `i`).
fn lane_tag(kind: u64, link: usize, conn: usize) -> u64 {
    kind | ((conn as u64) << 8) | ((link as u64) << 16)
}

/// A `SENDMSG` of what `msg` describes on `socket` (by its file-table
/// slot when it has one), or a `SENDMSG_ZC` asking the kernel to report
/// whether it copied. Building it names no memory; pushing it does.
fn send_entry(
    socket: &SharedFd,
    fixed: Option<u32>,
    msg: &libc::msghdr,
    zero_copy: bool,
) -> squeue::Entry {
    let msg: *const libc::msghdr = msg;
    let flags = (libc::MSG_WAITALL | libc::MSG_NOSIGNAL) as u32;
    let fd = socket.as_raw_fd();
    match (zero_copy, fixed) {
        (false, Some(f)) => opcode::SendMsg::new(types::Fixed(f), msg)
            .flags(flags)
            .build(),
        (false, None) => opcode::SendMsg::new(types::Fd(fd), msg)
            .flags(flags)
            .build(),
        (true, Some(f)) => opcode::SendMsgZc::new(types::Fixed(f), msg)
            .flags(flags)
            .ioprio(SEND_ZC_REPORT_USAGE)
            .build(),
        (true, None) => opcode::SendMsgZc::new(types::Fd(fd), msg)
            .flags(flags)
            .ioprio(SEND_ZC_REPORT_USAGE)
            .build(),
    }
}

/// `lane_tag` for a send of the piece in header slot `slot`: a SEND_ZC's
/// notification names the slot whose bytes the kernel let go.
fn piece_tag(link: usize, conn: usize, slot: usize) -> u64 {
    const _: () = assert!(HEAD_SLOTS <= 16, "a slot fits in four bits");
    lane_tag(SEND, link, conn) | ((slot as u64) << 4)
}

/// A send lane's socket holds at most about this many bytes not yet sent
/// (`TCP_NOTSENT_LOWAT`), on links with more than one lane: a piece's send
/// then ends about when the lane has moved most of it, so a lane waited
/// for wakes the driver when it has room, and bytes do not pile up unsent
/// in a slow lane's buffer (`lanes::pick_lane`).
const LANE_NOTSENT_LOWAT: libc::c_int = 64 << 10;

enum Rx {
    /// Receiving headers and small frames into the staging buffer.
    Staging,
    /// Receiving one large payload into a pooled buffer.
    Payload {
        head: [u8; MAX_HEADER],
        buf: AlignedBuf,
        got: usize,
        /// Zeros after the payload, skipped once it is in.
        tail: usize,
    },
    /// Receiving one payload straight into a waiting caller's memory.
    Placing {
        head: [u8; MAX_HEADER],
        target: PlaceRequest,
        got: usize,
        tail: usize,
    },
    /// Receiving a laned frame's payload as pieces on the receive lanes
    /// (its header came on the link's socket, whose staging buffer may
    /// hold later frames; the socket is not read until it is in).
    Laned {
        head: [u8; MAX_HEADER],
        dest: Dest,
        len: usize,
        /// Bytes of the pieces being read or read.
        claimed: usize,
        /// Bytes of the pieces read whole.
        got: usize,
    },
}

/// Where a laned frame's payload goes.
enum Dest {
    Buf(AlignedBuf),
    Target(PlaceRequest),
}

impl Dest {
    fn base(&mut self) -> *mut u8 {
        match self {
            Dest::Buf(buf) => buf.bytes_mut().as_mut_ptr(),
            Dest::Target(target) => target.ptr,
        }
    }
}

/// A lane this end writes.
struct SendLane {
    socket: SharedFd,
    fixed: Option<u32>,
    /// The engine thread its entries are handed to (none: the driver's
    /// ring takes them).
    thread: Option<usize>,
    in_flight: bool,
    owner: Option<ThreadId>,
    /// The `user_data` of the send in flight (its cancel names it).
    posted: u64,
    /// The send in flight is a SEND_ZC (not cancelled: its notification
    /// must still come).
    posted_zero_copy: bool,
    /// The piece being written.
    piece: Option<OutPiece>,
    /// Piece headers, each kept in place until the kernel is done with it
    /// (`slots` says when: after its send, or its SEND_ZCs' notifications).
    heads: Box<[[u8; PIECE_HEADER]; HEAD_SLOTS]>,
    slots: HeadSlots,
    /// The thread that posted each slot's last SEND_ZC: the kernel runs
    /// its notification's completion work there (`Driver::release`).
    zc_owners: [Option<ThreadId>; HEAD_SLOTS],
    /// Whether this lane's large pieces go zero-copy (probed per lane).
    zero_copy: ZeroCopy,
    msg: Box<libc::msghdr>,
    iov: Box<[libc::iovec; 2]>,
}

/// A piece of a laned frame's payload, on its way out.
struct OutPiece {
    /// Its header's slot in the lane's `heads`.
    slot: usize,
    /// Where in the payload, and how many bytes.
    offset: usize,
    len: usize,
    /// Bytes out, its header's included.
    sent: usize,
}

impl SendLane {
    /// Points `msg` at what is left of the piece: its header, then its
    /// bytes from `payload`.
    fn describe(&mut self, payload: *const u8) {
        let Some(p) = &self.piece else { return };
        let parts = [
            (self.heads[p.slot].as_ptr(), PIECE_HEADER),
            (payload.wrapping_add(p.offset), p.len),
        ];
        let mut n = 0;
        let mut at = 0;
        for (ptr, len) in parts {
            let from = p.sent.max(at);
            if from < at + len {
                self.iov[n] = libc::iovec {
                    iov_base: ptr.wrapping_add(from - at) as *mut libc::c_void,
                    iov_len: at + len - from,
                };
                n += 1;
            }
            at += len;
        }
        // SAFETY: `msghdr` is plain old data; all-zero is its empty value.
        *self.msg = unsafe { std::mem::zeroed() };
        self.msg.msg_iov = self.iov.as_mut_ptr();
        self.msg.msg_iovlen = n as _;
    }
}

/// A lane this end reads.
struct RecvLane {
    socket: SharedFd,
    fixed: Option<u32>,
    /// As `SendLane::thread`.
    thread: Option<usize>,
    in_flight: bool,
    owner: Option<ThreadId>,
    rx: LaneRx,
    /// A piece of a later frame, read ahead whole, waiting for its frame
    /// (`LaneRx::Ahead`). A lane holding one reads no further.
    ahead: Option<(PieceHeader, AlignedBuf)>,
    /// The peer closed the lane between pieces: it is read no more.
    ended: bool,
}

enum LaneRx {
    /// Reading a piece's header; whole, it waits until its frame is the
    /// one being received.
    Header {
        bytes: [u8; PIECE_HEADER],
        got: usize,
    },
    /// Reading a piece of the frame being received.
    Body {
        offset: usize,
        len: usize,
        got: usize,
    },
    /// Reading a piece of a later frame into a buffer of its own, so the
    /// lane's stream keeps moving while the frame being received waits for
    /// other lanes (a lane not read has its TCP window close).
    Ahead {
        piece: PieceHeader,
        buf: AlignedBuf,
        got: usize,
    },
}

/// A piece of a later frame is read ahead only up to this size; a longer
/// one waits in its socket for its frame.
const MAX_AHEAD: usize = lanes::MAX_PIECE;

impl LaneRx {
    const EMPTY: LaneRx = LaneRx::Header {
        bytes: [0; PIECE_HEADER],
        got: 0,
    };
}

/// The payload of the laned frame being sent, as pieces handed to lanes.
struct Spread {
    /// The frame's count among the link's laned frames.
    frame: u32,
    payload: *const u8,
    len: usize,
    piece: usize,
    /// Bytes handed to lanes so far.
    next: usize,
    /// Pieces handed out and not yet wholly sent.
    open: usize,
}

struct LinkIo {
    socket: SharedFd,
    /// Index in the ring's file table, when registered.
    fixed: Option<u32>,
    /// The link's lanes, if it has them: frames whose payload is at least
    /// `lane_from` bytes put it there in pieces, and everything else on
    /// `socket`.
    send_lanes: Vec<SendLane>,
    recv_lanes: Vec<RecvLane>,
    /// What placement knows of each send lane.
    loads: Vec<LaneLoad>,
    /// What each send lane has carried, for whoever added the link.
    counters: Option<LaneCounters>,
    lane_from: usize,
    /// The payload of the laned frame in `sending`.
    spread: Option<Spread>,
    /// Laned frames wholly sent whose SEND_ZC notifications some lane still
    /// owes (by frame count): their callers wait on the side while the next
    /// frame goes (`HeadSlots`).
    notified_later: Vec<(u32, SendRequest)>,
    /// Laned frames begun on this link, each way (wrapping): a piece
    /// header names its frame by this count.
    sent_frames: u32,
    recv_frames: u32,
    staging: Box<[u8]>,
    /// Unparsed bytes are `staging[start..end]`.
    start: usize,
    end: usize,
    /// Bytes still to drop before the next header (the last frame's
    /// trailing zeros).
    skip: usize,
    rx: Rx,
    /// The last frame was large, so the next staging receive asks for a
    /// header only: in a stream of large frames each payload then lands
    /// where it belongs whole, none of it copied out of staging.
    header_only: bool,
    recv_in_flight: bool,
    /// The thread whose turn posted the receive in flight: the kernel runs
    /// its completion work in that thread.
    recv_owner: Option<ThreadId>,
    queue: VecDeque<SendRequest>,
    /// The send being written; it stays here (not moved) while in flight.
    sending: Option<SendRequest>,
    send_in_flight: bool,
    send_owner: Option<ThreadId>,
    msg: Box<libc::msghdr>,
    iov: Box<[libc::iovec; 3]>,
    /// Set once the link failed; later sends fail with it at once.
    dead: Option<String>,
    zero_copy: ZeroCopy,
    /// Callers waiting for a frame to be received into their memory.
    targets: Vec<PlaceRequest>,
    /// A SEND_ZC's result, held until its notification (the kernel is done
    /// with the bytes only then).
    zc_result: Option<i32>,
    /// The send in flight is being cancelled for its caller, who withdrew
    /// it: if the kernel confirms none of it went out, it ends withdrawn.
    withdrawing: bool,
    /// The send in flight is a SEND_ZC (its notification must still come,
    /// so it is not cancelled).
    send_zero_copy: bool,
}

impl LinkIo {
    /// Bytes left of the current send on the link's socket (for a laned
    /// send: of its head and zeros).
    fn send_left(&self) -> usize {
        self.sending
            .as_ref()
            .map_or(0, |req| req.main_end().saturating_sub(req.sent))
    }

    /// Moves the next queued send into `sending` if none is there, marking
    /// it laned if the link has lanes and its payload is `lane_from` bytes
    /// or more (the receiver applies the same rule to the header).
    fn start_next_send(&mut self, frame_align: usize) {
        if self.sending.is_some() {
            return;
        }
        self.sending = self.queue.pop_front();
        let Some(req) = &mut self.sending else { return };
        let Body::Borrowed { ptr, len } = req.body else {
            return;
        };
        if self.send_lanes.is_empty() || len < self.lane_from {
            return;
        }
        req.laned = true;
        req.tail = super::tail_len(req.head_len, frame_align);
        self.spread = Some(Spread {
            frame: self.sent_frames,
            payload: ptr,
            len,
            piece: lanes::piece_len(len, self.send_lanes.len()),
            next: 0,
            open: 0,
        });
        self.sent_frames = self.sent_frames.wrapping_add(1);
    }

    /// Takes the send in `sending`, none of which went out, back: a laned
    /// one gives its frame count back too, since the receiver never saw it.
    fn take_unsent(&mut self) -> Option<SendRequest> {
        if self.spread.take().is_some() {
            self.sent_frames = self.sent_frames.wrapping_sub(1);
        }
        self.sending.take()
    }

    /// Whether a piece of the laned send is in the kernel's hands.
    fn lanes_sending(&self) -> bool {
        self.send_lanes.iter().any(|lane| lane.in_flight)
    }

    fn lanes_receiving(&self) -> bool {
        self.recv_lanes.iter().any(|lane| lane.in_flight)
    }

    /// Whether connection `conn` (0: main; `1 + i`: lane `i`) has a receive
    /// (or a send) in flight.
    fn receiving(&self, conn: usize) -> bool {
        match conn {
            0 => self.recv_in_flight,
            i => self.recv_lanes.get(i - 1).is_some_and(|l| l.in_flight),
        }
    }

    fn sending_on(&self, conn: usize) -> bool {
        match conn {
            0 => self.send_in_flight,
            i => self.send_lanes.get(i - 1).is_some_and(|l| l.in_flight),
        }
    }

    /// The send in `sending`, if it is done: a plain one once its bytes
    /// are out, a laned one once its head and every piece are and no lane
    /// owes a notification of it. One whose pieces are out but owed
    /// notifications moves to `notified_later`, so the next frame can go.
    fn take_finished_send(&mut self) -> Option<SendRequest> {
        let req = self.sending.as_ref()?;
        if req.sent < req.main_end() {
            return None;
        }
        if req.laned {
            let s = self.spread.as_ref()?;
            if s.next < s.len || s.open > 0 {
                return None;
            }
            let frame = s.frame;
            self.spread = None;
            if self.send_lanes.iter().any(|l| l.slots.holds(frame)) {
                let req = self.sending.take().expect("checked");
                self.notified_later.push((frame, req));
                return None;
            }
        }
        self.sending.take()
    }

    /// A laned frame waiting in `notified_later` that no lane owes a
    /// notification of any more, if there is one.
    fn take_notified(&mut self) -> Option<SendRequest> {
        take_notified(&mut self.notified_later, &self.send_lanes)
    }

    /// Hands pieces of the laned send's payload to lanes, each to the lane
    /// with the fewest bytes yet to deliver, until that lane is a busy one
    /// (`lanes::pick_lane`; what each lane's socket holds unacknowledged
    /// is looked at first). Only once the frame's head is out: until then
    /// the send can still be withdrawn whole.
    fn place_pieces(&mut self) {
        let (Some(req), Some(s)) = (&self.sending, &mut self.spread) else {
            return;
        };
        // With every lane busy nothing can be placed: spare the looks.
        let all_busy = self.loads.iter().all(LaneLoad::is_busy);
        if req.sent < req.lead() || s.next == s.len || all_busy {
            return;
        }
        if self.send_lanes.len() > 1 {
            let now = Instant::now();
            for (i, (lane, load)) in self.send_lanes.iter().zip(&mut self.loads).enumerate() {
                let unacked = unacknowledged(&lane.socket);
                load.observe(unacked);
                if let Some((rate, app_limited)) = delivery_rate(&lane.socket) {
                    load.observe_rate(rate, app_limited, now);
                }
                if let Some(c) = self.counters.as_ref().and_then(|c| c.get(i)) {
                    c.unacked.store(unacked, Ordering::Relaxed);
                    c.delivery_rate.store(load.rate(), Ordering::Relaxed);
                }
            }
        }
        while s.next < s.len {
            let len = s.piece.min(s.len - s.next);
            let Some(i) = lanes::pick_lane(&self.loads) else {
                break;
            };
            // A lane whose header slots are all owed notifications is
            // waited for like a busy one; a notification wakes the driver.
            let lane = &mut self.send_lanes[i];
            let Some(slot) = lane.slots.take(s.frame) else {
                break;
            };
            let head = PieceHeader {
                frame: s.frame,
                len: len as u32,
                offset: s.next as u64,
            };
            lane.heads[slot] = head.encode();
            lane.piece = Some(OutPiece {
                slot,
                offset: s.next,
                len,
                sent: 0,
            });
            self.loads[i].start(PIECE_HEADER + len);
            s.next += len;
            s.open += 1;
        }
    }

    /// Whether the laned frame being received can no longer be whole: a
    /// lane has ended, and every lane that has not holds a piece of a later
    /// frame (a lane reads no further then), so none can bring its bytes.
    fn stranded(&self) -> bool {
        let Rx::Laned { len, got, .. } = &self.rx else {
            return false;
        };
        let idle = |r: &RecvLane| {
            r.ended
                || r.ahead.is_some()
                || matches!(
                    r.rx,
                    LaneRx::Header {
                        got: PIECE_HEADER,
                        ..
                    }
                )
        };
        got < len && self.recv_lanes.iter().any(|r| r.ended) && self.recv_lanes.iter().all(idle)
    }

    /// The laned frame being received (its count, length and bytes claimed
    /// by pieces), if one is.
    fn current_laned(&self) -> Option<(u32, usize, usize)> {
        match &self.rx {
            Rx::Laned { len, claimed, .. } => Some((self.recv_frames, *len, *claimed)),
            _ => None,
        }
    }

    /// Checks the piece header lane `i` has read whole against the frame
    /// being received: its bytes are read next, into the frame if it
    /// belongs to it, or read ahead into a buffer of their own if it
    /// belongs to a later one (unless the lane holds such a piece already:
    /// then it waits). Else the stream is broken.
    fn fit_lane(&mut self, i: usize, sink: &dyn FrameSink) -> Result<(), String> {
        let LaneRx::Header {
            bytes,
            got: PIECE_HEADER,
        } = self.recv_lanes[i].rx
        else {
            return Ok(());
        };
        let piece = PieceHeader::decode(&bytes);
        let fit = lanes::fit_piece(&piece, self.current_laned(), self.recv_frames);
        let lane = &mut self.recv_lanes[i];
        match fit {
            Ok(PieceFit::Now) => {
                if let Rx::Laned { claimed, .. } = &mut self.rx {
                    *claimed += piece.len as usize;
                }
                lane.rx = LaneRx::Body {
                    offset: piece.offset as usize,
                    len: piece.len as usize,
                    got: 0,
                };
                Ok(())
            }
            Ok(PieceFit::Later) => {
                let len = piece.len as usize;
                if lane.ahead.is_none() && (1..=MAX_AHEAD).contains(&len) {
                    let mut buf = sink.buffer();
                    buf.prepare(len);
                    lane.rx = LaneRx::Ahead { piece, buf, got: 0 };
                }
                Ok(())
            }
            Err(reason) => Err(format!("receive lane {i}: {reason}")),
        }
    }

    /// For the laned frame just begun: the pieces lanes read ahead for it
    /// go to its destination, and lanes that waited read on. `Ok(true)`
    /// if that made it whole.
    fn take_ahead(&mut self, sink: &dyn FrameSink) -> Result<bool, String> {
        for i in 0..self.recv_lanes.len() {
            let frame = self.recv_frames;
            let lane = &mut self.recv_lanes[i];
            if lane.ahead.as_ref().is_some_and(|(p, _)| p.frame == frame) {
                let (piece, buf) = lane.ahead.take().expect("checked");
                let fit = lanes::fit_piece(&piece, self.current_laned(), frame);
                if fit != Ok(PieceFit::Now) {
                    let why = fit.err().unwrap_or_default();
                    return Err(format!("receive lane {i}: {why}"));
                }
                let Rx::Laned {
                    dest, claimed, got, ..
                } = &mut self.rx
                else {
                    unreachable!("called with a laned frame begun")
                };
                let (at, len) = (piece.offset as usize, piece.len as usize);
                match dest {
                    Dest::Buf(whole) => {
                        whole.bytes_mut()[at..at + len].copy_from_slice(buf.bytes());
                    }
                    // SAFETY: `target` names its `len` bytes of a caller's
                    // memory that nothing else touches until the engine
                    // reports this placement finished (see `PlaceRequest`);
                    // `fit_piece` checked `at + len` against that length.
                    Dest::Target(target) => unsafe {
                        std::ptr::copy_nonoverlapping(buf.bytes().as_ptr(), target.ptr.add(at), len)
                    },
                }
                *claimed += len;
                *got += len;
            }
            self.fit_lane(i, sink)?;
        }
        Ok(matches!(self.rx, Rx::Laned { len, got, .. } if got == len))
    }

    /// Shuts every socket of the link down, which ends what is in flight on them.
    fn shut_down(&self) {
        let _ = shutdown(self.socket.as_raw_fd(), Shutdown::Both);
        for lane in &self.send_lanes {
            let _ = shutdown(lane.socket.as_raw_fd(), Shutdown::Both);
        }
        for lane in &self.recv_lanes {
            let _ = shutdown(lane.socket.as_raw_fd(), Shutdown::Both);
        }
    }

    /// Where the next receive on this link writes, how much it asks for,
    /// and its flags: the free end of the staging buffer (compacted first),
    /// or the rest of the payload being received in place. `header_ask` is
    /// what a header-only receive asks for: a header and the longest pad,
    /// so a large payload's first bytes may come along (copied out of
    /// staging), but nothing of the frame after it.
    fn receive_into(&mut self, header_ask: usize) -> (*mut u8, usize, i32) {
        match &mut self.rx {
            Rx::Staging => {
                if self.start > 0 {
                    self.staging.copy_within(self.start..self.end, 0);
                    self.end -= self.start;
                    self.start = 0;
                }
                let free = &mut self.staging[self.end..];
                let want = match (self.skip + header_ask).checked_sub(self.end) {
                    Some(need) if self.header_only && need > 0 => need,
                    _ => free.len(),
                };
                (free.as_mut_ptr(), want, 0)
            }
            Rx::Payload { buf, got, .. } => {
                let rest = &mut buf.bytes_mut()[*got..];
                (rest.as_mut_ptr(), rest.len(), libc::MSG_WAITALL)
            }
            Rx::Placing { target, got, .. } => (
                target.ptr.wrapping_add(*got),
                target.len - *got,
                libc::MSG_WAITALL,
            ),
            // Not read while a laned payload comes (`post_entries`).
            Rx::Laned { .. } => (std::ptr::null_mut(), 0, 0),
        }
    }

    /// Points `msg` at what is left of the current send on the link's
    /// socket (up to [`SendRequest::main_end`]): head, body, zeros; or,
    /// laned, head and zeros (the lanes carry the body).
    fn describe_send(&mut self) {
        let Some(req) = &self.sending else { return };
        let head = (req.head.as_ptr(), req.head_len);
        let body = match &req.body {
            Body::Borrowed { ptr, len } => (*ptr, *len),
            Body::Owned(v) => (v.as_ptr(), v.len()),
        };
        let zeros = (ZEROS.as_ptr(), req.tail);
        let pieces = match req.laned {
            true => [head, zeros, (body.0, 0)],
            false => [head, body, zeros],
        };
        let end = req.main_end();
        let (mut n, mut at) = (0, 0);
        for (ptr, len) in pieces {
            let (from, to) = (req.sent.max(at), end.min(at + len));
            if from < to {
                self.iov[n] = libc::iovec {
                    iov_base: ptr.wrapping_add(from - at) as *mut libc::c_void,
                    iov_len: to - from,
                };
                n += 1;
            }
            at += len;
        }
        // SAFETY: `msghdr` is plain old data; all-zero is its empty value.
        *self.msg = unsafe { std::mem::zeroed() };
        self.msg.msg_iov = self.iov.as_mut_ptr();
        self.msg.msg_iovlen = n as _;
    }
}

/// Runs `f` on a thread made for it. io_uring ties a ring to the task that
/// creates it, and when the ring goes away it interrupts that task (a
/// blocking socket read with a timeout then fails with EINTR, rustls gives
/// up a handshake): a thread that has exited by then is not disturbed.
pub(crate) fn on_a_passing_thread<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(f)
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// Starts `config.engine_threads` engine threads for the ring of
/// descriptor `ring` (pinned to `config.thread_cores` where given); none
/// where the kernel cannot run them, with a warning.
fn start_threads(config: &EngineConfig, ring: RawFd, entries: u32) -> Vec<EngineThread> {
    let mut threads = Vec::new();
    for i in 0..config.engine_threads {
        let core = config.thread_cores.get(i).copied();
        match EngineThread::start(i, ring, entries, core) {
            Ok(t) => threads.push(t),
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "engine threads cannot run here (they need Linux 6.3+); \
                     the lanes run on the caller-driven ring"
                );
                return Vec::new();
            }
        }
    }
    threads
}

pub(crate) struct Driver {
    ring: IoUring,
    links: Vec<Option<Box<LinkIo>>>,
    header_len: usize,
    /// Every frame is a multiple of this many bytes.
    frame_align: usize,
    staging: usize,
    fixed_files: bool,
    wake_fd: RawFd,
    wake_word: Box<u64>,
    wake_in_flight: bool,
    wake_owner: Option<ThreadId>,
    /// Set (under the engine's state lock) when work is queued or waiters
    /// are notified during a turn; a spinning driver ends its turn on it,
    /// so the eventfd read is only needed while it sleeps in the kernel.
    poked: Arc<AtomicBool>,
    /// The thread driving the current turn.
    me: Option<ThreadId>,
    /// What `release` withdraws (kept to reuse its storage).
    cancels: Vec<u64>,
    /// Entries submitted whose completion has not been taken.
    in_flight: usize,
    /// Entries ever pushed (the engine's tests count them).
    pub(crate) pushed: u64,
    completions: Vec<(u64, i32, u32)>,
    touched: Vec<usize>,
    /// Sends finished this turn (id 0: an owned send), for the engine.
    pub(crate) finished: Vec<(u64, Outcome)>,
    /// The other half of the engine's double-buffered work queue.
    pub(crate) spare: Queued,
    /// Sends with at least this many bytes left try SEND_ZC.
    zero_copy_from: Option<usize>,
    zero_copy_always: bool,
    /// How long a driver polls before it sleeps.
    spin: Duration,
    /// Lanes a link may have each way (their slots in the file table).
    max_lanes: usize,
    /// Lane entries built in `post_entries` (kept to reuse its storage).
    lane_entries: Vec<(squeue::Entry, u64, bool, Option<usize>)>,
    /// SEND_ZC notifications owed on lanes, all links together: when none
    /// are, `release` looks no further.
    lane_notifications: usize,
    /// Engine threads that lanes are dealt to (decision 0036); none: every
    /// entry goes on this ring.
    threads: Vec<EngineThread>,
    /// Entries built for each thread this turn, handed over together.
    handed: Vec<Vec<squeue::Entry>>,
    /// Threads that sent engine threads wake messages, and how many of
    /// those have not completed here: a message's own completion may be
    /// completion work left to its sender (before Linux 6.11), so a thread
    /// leaving the engine waits for its own (`release`). A slot whose
    /// count is 0 is free for any thread.
    wakers: Vec<(Option<ThreadId>, u32)>,
    /// Threads handed entries whose wake found the queue full.
    wake_owed: Vec<bool>,
    /// Wakes `Drop` sent to stop the threads, not yet completed.
    stop_wakes: u32,
    /// Set by `Drop` if entries were still in flight and it leaked what
    /// they name (tests look: a clean end leaks nothing).
    leaked: Arc<AtomicBool>,
    /// Lanes dealt to threads so far (the next goes to `dealt % threads`).
    dealt: usize,
}

// SAFETY: the raw pointers in `msghdr`/`iovec` point into this driver's own
// boxes or into borrowed payloads (see `SendRequest`); the driver is only
// used under `FrameEngine`'s mutex, one thread at a time.
unsafe impl Send for Driver {}

impl Driver {
    pub(crate) fn new(
        config: &EngineConfig,
        wake: &nix::sys::eventfd::EventFd,
        poked: Arc<AtomicBool>,
    ) -> io::Result<Driver> {
        // Every connection of a link (main and lanes) has at most one
        // receive and one send in flight, plus the eventfd read: size the
        // queues so completions never overflow.
        let per_link = 2 + 2 * config.max_lanes;
        let entries = ((per_link * config.links) as u32 + 8)
            .next_power_of_two()
            .clamp(64, 8192);
        // Cooperative task running: completions run when a driver next
        // enters the kernel instead of interrupting a thread that is busy
        // reducing (measured against the default in decision 0007).
        let ring = on_a_passing_thread(move || {
            IoUring::builder()
                .setup_coop_taskrun()
                .setup_cqsize(entries * 2)
                .build(entries)
                .or_else(|_| IoUring::builder().setup_cqsize(entries * 2).build(entries))
        })
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENOMEM) => io::Error::new(e.kind(), crate::probe::memlock_refusal(&e)),
            _ => e,
        })?;
        // A slot for every lane a link may have; if the kernel refuses that
        // many (RLIMIT_NOFILE bounds the table), one lane each way, as
        // before lanes multiplied (a lane past the table runs unregistered).
        let links = config.links.max(1);
        let fixed_files = [1 + 2 * config.max_lanes, 3].iter().any(|per_link| {
            ring.submitter()
                .register_files_sparse((per_link * links) as u32)
                .is_ok()
        });
        let threads = start_threads(config, ring.as_raw_fd(), entries);
        Ok(Driver {
            handed: threads.iter().map(|_| Vec::new()).collect(),
            wakers: Vec::new(),
            wake_owed: vec![false; threads.len()],
            stop_wakes: 0,
            leaked: Arc::default(),
            threads,
            dealt: 0,
            ring,
            links: (0..config.links).map(|_| None).collect(),
            header_len: config.header_len,
            frame_align: config.frame_align,
            staging: config
                .staging
                .max(4 * (config.header_len + config.frame_align)),
            fixed_files,
            wake_fd: wake.as_fd().as_raw_fd(),
            wake_word: Box::new(0),
            wake_in_flight: false,
            wake_owner: None,
            poked,
            me: None,
            cancels: Vec::new(),
            in_flight: 0,
            pushed: 0,
            completions: Vec::with_capacity(entries as usize * 2),
            touched: Vec::new(),
            finished: Vec::new(),
            spare: Queued::default(),
            zero_copy_from: config.zero_copy_from,
            zero_copy_always: config.zero_copy_always,
            spin: config.spin,
            max_lanes: config.max_lanes,
            lane_entries: Vec::new(),
            lane_notifications: 0,
        })
    }

    pub(crate) fn uses_fixed_files(&self) -> bool {
        self.fixed_files
    }

    /// The counters of each engine thread that runs.
    pub(crate) fn thread_counters(&self) -> Vec<Arc<ThreadCounters>> {
        self.threads.iter().map(EngineThread::counters).collect()
    }

    /// Each installed link's zero-copy state.
    pub(crate) fn zero_copy(&self) -> Vec<(usize, ZeroCopy)> {
        self.links
            .iter()
            .enumerate()
            .filter_map(|(i, l)| l.as_ref().map(|l| (i, l.zero_copy)))
            .collect()
    }

    /// One turn: take in `queued` (left empty), submit what can go, wait
    /// up to `wait` for at least one completion, and handle every
    /// completion there is. Finished sends go to `self.finished`.
    pub(crate) fn turn(&mut self, queued: &mut Queued, wait: Duration, sink: &dyn FrameSink) {
        self.me = Some(std::thread::current().id());
        let mut finished = std::mem::take(&mut self.finished);
        self.turn_inner(queued, wait, sink, &mut finished);
        self.finished = finished;
    }

    fn turn_inner(
        &mut self,
        queued: &mut Queued,
        wait: Duration,
        sink: &dyn FrameSink,
        finished: &mut Vec<(u64, Outcome)>,
    ) {
        for (link, socket, lanes) in queued.links.drain(..) {
            self.install(link, socket, lanes);
        }
        for target in queued.placements.drain(..) {
            let link = target.link;
            match self.links.get_mut(link).and_then(|l| l.as_mut()) {
                Some(l) if l.dead.is_none() => l.targets.push(target),
                Some(l) => finished.push((
                    target.id,
                    Outcome::Failed(l.dead.clone().unwrap_or_default()),
                )),
                None => finished.push((
                    target.id,
                    Outcome::Failed(format!("link {link} is not connected")),
                )),
            }
        }
        // Sends join their links' queues before withdrawals are looked at,
        // so a send withdrawn before any turn took it is found there.
        for req in queued.sends.drain(..) {
            self.take_send(req, finished);
        }
        for id in queued.withdrawals.drain(..) {
            self.withdraw(id, finished);
        }
        for link in 0..self.links.len() {
            self.send_directly(link, sink, finished);
        }
        // Work that ended already (a withdrawn placement, a send to a dead
        // link) must reach its caller now, not after a sleep.
        let ended = !finished.is_empty();
        // A driver that will poll reads small frames itself, so staging
        // links get no ring receive; nor do they in a turn that ends at once
        // because its work is done (its caller polls again if it still
        // waits). Only a turn asked not to wait (the heartbeat's tick)
        // leaves receives in flight for the ring.
        let direct = !wait.is_zero() && self.receives_directly();
        for link in 0..self.links.len() {
            let receive = (!direct || !self.is_staging(link)) && !self.held_back(link, sink);
            self.post_entries(link, receive);
        }
        self.touched.clear();
        let wait = if ended { Duration::ZERO } else { wait };
        self.enter(wait, direct, sink, finished);
        // Take what completed. Sends that went out in part continue at
        // once; receives are posted again by the next turn (whoever still
        // waits takes one at once), so a thread whose wait this completion
        // ended leaves no fresh receive behind for `release` to withdraw.
        for _ in 0..8 {
            if !self.reap(sink, finished) {
                break;
            }
            let touched = std::mem::take(&mut self.touched);
            for &link in &touched {
                self.post_send(link);
            }
            self.touched = touched;
            self.touched.clear();
            if self.ring.submission().is_empty() {
                break; // nothing new went in; later completions are the next turn's
            }
            self.enter(Duration::ZERO, false, sink, finished);
        }
        self.fail_dead_work(finished);
    }

    /// Withdraws work `id` if none of it has happened yet: a placement not
    /// being filled (one that is completes as placed), or a send none of
    /// whose bytes went out. A queued send leaves its link's queue; the
    /// send being written, if the kernel has not moved a byte of it, is
    /// cancelled, and `sent` finishes it as withdrawn if the cancel comes
    /// first. A SEND_ZC in flight is left alone (its notification must
    /// still come), and so is a send partly out: both end as they would
    /// have.
    fn withdraw(&mut self, id: u64, finished: &mut Vec<(u64, Outcome)>) {
        let mut cancel = None;
        for (link, l) in self.links.iter_mut().enumerate() {
            let Some(l) = l else { continue };
            if let Some(i) = l.targets.iter().position(|t| t.id == id) {
                l.targets.swap_remove(i);
                finished.push((id, Outcome::Withdrawn));
                return;
            }
            if let Some(i) = l.queue.iter().position(|r| r.id == id) {
                l.queue.remove(i);
                finished.push((id, Outcome::Withdrawn));
                return;
            }
            if !l
                .sending
                .as_ref()
                .is_some_and(|r| r.id == id && r.sent == 0)
            {
                continue;
            }
            if !l.send_in_flight {
                l.take_unsent();
                finished.push((id, Outcome::Withdrawn));
            } else if !l.send_zero_copy {
                l.withdrawing = true;
                cancel = Some(link);
            }
            break;
        }
        let Some(link) = cancel else { return };
        let entry = opcode::AsyncCancel::new(tag(SEND, link))
            .build()
            .user_data(tag(CANCEL, 0));
        // SAFETY: a cancel names no memory.
        if !unsafe { self.push(&entry) } {
            // No room in the ring: the send ends as it would have.
            self.links[link].as_mut().expect("link present").withdrawing = false;
        }
    }

    /// Puts `req` at the back of its link's queue, or fails it at once if
    /// the link is dead or unknown.
    fn take_send(&mut self, req: SendRequest, finished: &mut Vec<(u64, Outcome)>) {
        let link = req.link;
        match self.links.get_mut(link).and_then(|l| l.as_mut()) {
            Some(l) if l.dead.is_none() => {
                l.queue.push_back(req);
                self.touched.push(link);
            }
            Some(l) => finished.push((
                req.id,
                Outcome::Sent(Err(l.dead.clone().unwrap_or_default())),
            )),
            None => finished.push((
                req.id,
                Outcome::Sent(Err(format!("link {link} is not connected"))),
            )),
        }
    }

    /// Outside a turn: queues `req` on its link and writes what the link's
    /// socket takes at once by plain `sendmsg` calls (`send_directly`),
    /// making no ring entry. Returns `req`'s outcome if it finished; if not,
    /// it waits in its link's queue for the next turn. Anything else that
    /// finished is left in `finished` for the caller to hand out. A small
    /// op's send then costs one system call and none of a turn's queue
    /// hand-over or polling set-up.
    pub(crate) fn send_now(&mut self, req: SendRequest, sink: &dyn FrameSink) -> Option<Outcome> {
        let (id, link) = (req.id, req.link);
        let mut finished = std::mem::take(&mut self.finished);
        self.take_send(req, &mut finished);
        self.send_directly(link, sink, &mut finished);
        let outcome = finished
            .iter()
            .position(|(done, _)| *done == id)
            .map(|i| finished.swap_remove(i).1);
        self.finished = finished;
        outcome
    }

    /// Whether no entry is in the ring (its last completion taken).
    pub(crate) fn nothing_in_flight(&self) -> bool {
        self.in_flight == 0
    }

    /// Withdraws every entry this thread's turns put in flight (receives,
    /// plain sends, the eventfd read) and waits, at most a second, until the
    /// kernel has finished them. Nothing is posted again: the next turn of
    /// whichever thread drives does that. Bytes a cancelled entry had moved
    /// are accounted as usual (see `received`), so no frame is torn.
    ///
    /// Why: the kernel runs an entry's completion work in the thread that
    /// submitted it, interrupting that thread's own timed system calls
    /// (EINTR) or, while it runs user code, leaving the completion until its
    /// next kernel entry. A thread that stops waiting on the engine (a
    /// caller whose op is done, an idle executor) must leave nothing behind.
    pub(crate) fn release(&mut self, sink: &dyn FrameSink) {
        let me = Some(std::thread::current().id());
        self.me = me;
        let mut finished = std::mem::take(&mut self.finished);
        let mut cancels = std::mem::take(&mut self.cancels);
        cancels.clear();
        for (link, l) in self.links.iter().enumerate() {
            let Some(l) = l else { continue };
            if l.recv_in_flight && l.recv_owner == me {
                cancels.push(tag(RECV, link));
            }
            // A SEND_ZC is left alone: its notification must still come.
            if l.send_in_flight && l.send_owner == me && !l.send_zero_copy {
                cancels.push(tag(SEND, link));
            }
            for (i, lane) in l.recv_lanes.iter().enumerate() {
                if lane.in_flight && lane.owner == me {
                    cancels.push(lane_tag(RECV, link, 1 + i));
                }
            }
            for lane in &l.send_lanes {
                if lane.in_flight && lane.owner == me && !lane.posted_zero_copy {
                    cancels.push(lane.posted);
                }
            }
        }
        if self.wake_in_flight && self.wake_owner == me {
            cancels.push(tag(WAKE, 0));
        }
        let mine = |d: &Driver, what: u64| {
            let (link, conn) = ((what >> 16) as usize, ((what >> 8) & 0xff) as usize);
            match what & KIND {
                WAKE => d.wake_in_flight && d.wake_owner == me,
                RECV => d.links[link].as_ref().is_some_and(|l| l.receiving(conn)),
                _ => d.links[link].as_ref().is_some_and(|l| l.sending_on(conn)),
            }
        };
        for &what in &cancels {
            let cancel = opcode::AsyncCancel::new(what)
                .build()
                .user_data(tag(CANCEL, 0));
            // SAFETY: a cancel names no memory.
            let _ = unsafe { self.push(&cancel) };
        }
        // A SEND_ZC's notification is completion work the kernel runs in
        // the thread that posted it, and this ring's (COOP_TASKRUN) does
        // not wake a thread asleep elsewhere for it: one that leaves with
        // notifications owed could hold their callers until it next enters
        // the kernel. It waits for them here, as for the cancels (0035).
        let owes_mine = |d: &Driver| {
            d.links.iter().flatten().any(|l| {
                (l.send_in_flight && l.send_zero_copy && l.send_owner == me)
                    || (d.lane_notifications > 0
                        && l.send_lanes.iter().any(|lane| {
                            (0..HEAD_SLOTS).any(|i| lane.slots.owes(i) && lane.zc_owners[i] == me)
                        }))
            })
        };
        let deadline = Instant::now() + Duration::from_secs(1);
        while (cancels.iter().any(|&what| mine(self, what)) || owes_mine(self) || self.wakes_owed())
            && Instant::now() < deadline
        {
            // Not `enter`: that would post the eventfd read anew.
            if self.ring.completion().is_empty() {
                self.sleep_in_kernel(Duration::from_millis(10));
            }
            self.reap(sink, &mut finished);
            self.touched.clear();
        }
        self.fail_dead_work(&mut finished);
        self.finished = finished;
        self.cancels = cancels;
    }

    fn post_wake(&mut self) {
        if self.wake_in_flight {
            return;
        }
        let entry = opcode::Read::new(
            types::Fd(self.wake_fd),
            (&mut *self.wake_word as *mut u64).cast::<u8>(),
            8,
        )
        .build()
        .user_data(tag(WAKE, 0));
        // SAFETY: `wake_word` is boxed and owned by the driver, which leaks
        // it rather than free it while this read is in flight (see `Drop`);
        // the eventfd is dropped after the driver (field order in
        // `FrameEngine`).
        if unsafe { self.push(&entry) } {
            self.wake_in_flight = true;
            self.wake_owner = self.me;
        }
    }

    /// Submits, and sleeps up to `wait` for a completion unless one is
    /// already there or work was queued meanwhile. Every kernel entry also
    /// runs this thread's pending completion work; entries are kept to one
    /// per call where possible (a small op's turn is a handful of system
    /// calls, each a few microseconds on a VM). With `direct`, links whose
    /// receive is not in flight are read directly while polling, and get
    /// their receive only before the driver sleeps.
    fn enter(
        &mut self,
        wait: Duration,
        direct: bool,
        sink: &dyn FrameSink,
        finished: &mut Vec<(u64, Outcome)>,
    ) {
        if !self.ring.completion().is_empty() {
            if !self.ring.submission().is_empty() {
                let _ = self.ring.submit();
            }
            return;
        }
        if wait.is_zero() || self.poked.load(Ordering::SeqCst) {
            // With nothing to submit and nothing in flight, entering the
            // kernel would take nothing in (a small op's send turn, whose
            // frame went out by `send_directly`).
            if !self.ring.submission().is_empty() || self.in_flight > 0 {
                let _ = self.ring.submit();
            }
            return;
        }
        if !self.spin.is_zero() {
            // Poll before sleeping, yielding the core between polls, so a
            // frame that lands within the spin is taken without a sleep
            // and a wake-up (decision 0008).
            let start = Instant::now();
            loop {
                // Completion work also runs on the way out of the yield and
                // the direct receives, so a poll that has nothing to submit
                // needs no `io_uring_enter` of its own.
                if !direct || !self.ring.submission().is_empty() {
                    let _ = self.ring.submit();
                }
                if !self.ring.completion().is_empty() || self.poked.load(Ordering::SeqCst) {
                    return;
                }
                if direct && self.receive_directly(sink, finished) {
                    return;
                }
                if start.elapsed() >= self.spin.min(wait) {
                    break;
                }
                crate::poll_yield();
            }
        }
        if direct {
            // Asleep, the driver learns of frames only from the ring.
            for link in 0..self.links.len() {
                let receive = !self.held_back(link, sink);
                self.post_entries(link, receive);
            }
        }
        // Only a driver asleep in the kernel needs the eventfd to learn of
        // queued work: posting its read here, not every turn, spares a
        // small op the read's arming and `release`'s cancel of it. A poke
        // that came before the read was posted left the counter set, so
        // the read completes at once.
        self.post_wake();
        self.sleep_in_kernel(wait);
    }

    /// Submits and sleeps up to `wait` for one completion.
    fn sleep_in_kernel(&mut self, wait: Duration) {
        let ts = types::Timespec::from(wait);
        let args = types::SubmitArgs::new().timespec(&ts);
        // ETIME: the wait ran out; EINTR: a signal; EBUSY: completions to
        // take first. Anything else leaves entries queued for the next turn.
        let _ = self.ring.submitter().submit_with_args(1, &args);
    }

    /// # Safety
    /// Memory `entry` names must stay valid until its completion is taken.
    unsafe fn push(&mut self, entry: &squeue::Entry) -> bool {
        if self.ring.submission().is_full() {
            let _ = self.ring.submit();
        }
        // SAFETY: the caller's contract, passed on.
        let pushed = unsafe { self.ring.submission().push(entry) }.is_ok();
        if pushed {
            self.in_flight += 1;
            self.pushed += 1;
        }
        pushed
    }

    fn install(&mut self, link: usize, socket: SharedFd, lanes: Option<LanesToInstall>) {
        let count = self.links.len();
        if link >= count {
            return;
        }
        // File table: links at `link`, send lane `i` at `(1 + i) * count +
        // link`, receive lane `i` at `(1 + max_lanes + i) * count + link`.
        let register = |ring: &IoUring, slot: usize, fd: RawFd| {
            ring.submitter()
                .register_files_update(slot as u32, &[fd])
                .is_ok()
                .then_some(slot as u32)
        };
        let fixed_files = self.fixed_files;
        let mut fixed = None;
        if fixed_files {
            fixed = register(&self.ring, link, socket.as_raw_fd());
        }
        let slot = |ring: &IoUring, socket: &SharedFd, at: usize| {
            fixed_files
                .then(|| register(ring, at * count + link, socket.as_raw_fd()))
                .flatten()
        };
        let max = self.max_lanes;
        // Lanes dealt to engine threads in turn, sends and receives alike,
        // so one peer's lanes spread over them; theirs are not registered
        // (the file table is this ring's).
        let threads = self.threads.len();
        let mut deal = || {
            (threads > 0).then(|| {
                self.dealt += 1;
                (self.dealt - 1) % threads
            })
        };
        let (Lanes { send, recv, from }, counters) = match lanes {
            Some((lanes, counters)) => (lanes, Some(counters)),
            None => (
                Lanes {
                    send: Vec::new(),
                    recv: Vec::new(),
                    from: usize::MAX,
                },
                None,
            ),
        };
        let several = send.len() > 1;
        let send_lanes: Vec<SendLane> = send
            .into_iter()
            .take(max)
            .enumerate()
            .map(|(i, socket)| {
                if several {
                    set_notsent_lowat(&socket, LANE_NOTSENT_LOWAT);
                }
                let thread = deal();
                SendLane {
                    fixed: thread
                        .is_none()
                        .then(|| slot(&self.ring, &socket, 1 + i))
                        .flatten(),
                    thread,
                    socket,
                    in_flight: false,
                    owner: None,
                    posted: 0,
                    posted_zero_copy: false,
                    piece: None,
                    heads: Box::new([[0; PIECE_HEADER]; HEAD_SLOTS]),
                    slots: HeadSlots::default(),
                    zc_owners: [None; HEAD_SLOTS],
                    zero_copy: ZeroCopy::Untried,
                    // SAFETY: `msghdr` is plain old data; all-zero is its empty value.
                    msg: Box::new(unsafe { std::mem::zeroed() }),
                    iov: Box::new(
                        [libc::iovec {
                            iov_base: std::ptr::null_mut(),
                            iov_len: 0,
                        }; 2],
                    ),
                }
            })
            .collect();
        let recv_lanes: Vec<RecvLane> = recv
            .into_iter()
            .take(max)
            .enumerate()
            .map(|(i, socket)| {
                let thread = deal();
                RecvLane {
                    fixed: thread
                        .is_none()
                        .then(|| slot(&self.ring, &socket, 1 + max + i))
                        .flatten(),
                    thread,
                    socket,
                    in_flight: false,
                    owner: None,
                    rx: LaneRx::EMPTY,
                    ahead: None,
                    ended: false,
                }
            })
            .collect();
        // Links are made once; a replaced one with entries in flight is
        // leaked rather than freed under the kernel.
        if let Some(old) = self.links[link].take() {
            if old.recv_in_flight
                || old.send_in_flight
                || old.lanes_sending()
                || old.lanes_receiving()
                || old.send_lanes.iter().any(|l| l.slots.owed())
            {
                std::mem::forget(old);
            }
        }
        self.links[link] = Some(Box::new(LinkIo {
            socket,
            fixed,
            loads: vec![LaneLoad::default(); send_lanes.len()],
            counters,
            lane_from: from,
            send_lanes,
            recv_lanes,
            spread: None,
            notified_later: Vec::new(),
            sent_frames: 0,
            recv_frames: 0,
            staging: vec![0u8; self.staging].into_boxed_slice(),
            start: 0,
            end: 0,
            skip: 0,
            rx: Rx::Staging,
            header_only: false,
            recv_in_flight: false,
            recv_owner: None,
            queue: VecDeque::new(),
            sending: None,
            send_in_flight: false,
            send_owner: None,
            // SAFETY: `msghdr` is plain old data; all-zero is its empty value.
            msg: Box::new(unsafe { std::mem::zeroed() }),
            iov: Box::new(
                [libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                }; 3],
            ),
            dead: None,
            zero_copy: ZeroCopy::Untried,
            targets: Vec::new(),
            zc_result: None,
            withdrawing: false,
            send_zero_copy: false,
        }));
    }

    /// Writes `link`'s queued small frames with plain non-blocking
    /// `sendmsg` calls while the socket takes them whole, before any ring
    /// entry is made for them: a small frame then costs one system call and
    /// no submission or completion. What the socket does not take (or a
    /// large frame) goes through the ring as before, in order, since only
    /// the driver sends and never while a ring send is in flight.
    fn send_directly(
        &mut self,
        link: usize,
        sink: &dyn FrameSink,
        finished: &mut Vec<(u64, Outcome)>,
    ) {
        loop {
            let Some(l) = self.links.get_mut(link).and_then(|l| l.as_mut()) else {
                return;
            };
            if l.dead.is_some() || l.send_in_flight {
                return;
            }
            l.start_next_send(self.frame_align);
            let left = l.send_left();
            let zero_copy = self.zero_copy_from.is_some_and(|from| left >= from);
            // Nothing to send, or only a laned send's pieces (the ring's).
            if left == 0 || left > DIRECT_SEND_BYTES || zero_copy {
                return;
            }
            l.describe_send();
            let fd = l.socket.as_raw_fd();
            // SAFETY: `msg` and `iov` describe the rest of the request in
            // `sending`, whose bytes are owned by it or borrowed from a
            // caller parked until it completes (its trailing zeros are a
            // static); the call is synchronous.
            let n = unsafe { libc::sendmsg(fd, &*l.msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
            // Full (or interrupted): the ring takes it from here.
            let Some(result) = completion_result(n) else {
                return;
            };
            let whole = n.max(0) as usize >= left;
            self.sent(link, result, 0, sink, finished);
            if !whole {
                return;
            }
        }
    }

    /// What a header-only receive asks for: a header and the longest pad.
    fn header_ask(&self) -> usize {
        self.header_len + self.frame_align - 1
    }

    /// Whether a polling driver reads small frames itself this turn (see
    /// `receive_directly`).
    fn receives_directly(&self) -> bool {
        !self.spin.is_zero() && self.links.iter().flatten().count() <= DIRECT_RECV_LINKS
    }

    /// Whether `link` is between large payloads (its receives go to the
    /// staging buffer).
    fn is_staging(&self, link: usize) -> bool {
        self.links
            .get(link)
            .and_then(|l| l.as_ref())
            .is_some_and(|l| matches!(l.rx, Rx::Staging))
    }

    /// Whether `link` is between frames and the sink has paused it: it
    /// gets no receive. (Posted placements do not keep it read: one whose
    /// frame came before it was posted waits in the inbox, and would hold
    /// the link open for nothing; callers waiting on a placement tell the
    /// sink themselves.)
    fn held_back(&self, link: usize, sink: &dyn FrameSink) -> bool {
        self.links
            .get(link)
            .and_then(|l| l.as_ref())
            .is_some_and(|l| matches!(l.rx, Rx::Staging) && sink.paused(link))
    }

    /// Reads what each staging link without a receive in flight has, with
    /// one plain non-blocking `recv` per link, and handles it as a receive's
    /// completion; true if any link had bytes (or an error). A polling
    /// driver does this instead of keeping a ring receive in flight: that
    /// receive's arming, completion work and withdrawal at `release` cost
    /// more system calls than a poll's `recv` (decision 0012). Payloads
    /// received in place keep their ring receive (`MSG_WAITALL`).
    fn receive_directly(
        &mut self,
        sink: &dyn FrameSink,
        finished: &mut Vec<(u64, Outcome)>,
    ) -> bool {
        let header_ask = self.header_ask();
        let mut any = false;
        for link in 0..self.links.len() {
            let Some(l) = self.links[link].as_mut() else {
                continue;
            };
            if l.dead.is_some() || l.recv_in_flight || !matches!(l.rx, Rx::Staging) {
                continue;
            }
            if sink.paused(link) {
                continue;
            }
            let (ptr, len, _) = l.receive_into(header_ask);
            if len == 0 {
                continue;
            }
            // SAFETY: `ptr` and `len` name the free end of this link's
            // staging buffer, owned by the driver; the call is synchronous
            // and no ring receive is in flight on this link.
            let n =
                unsafe { libc::recv(l.socket.as_raw_fd(), ptr.cast(), len, libc::MSG_DONTWAIT) };
            let Some(result) = completion_result(n) else {
                continue; // nothing yet (or interrupted)
            };
            self.received(link, result, sink, finished);
            any = true;
        }
        any
    }

    /// Puts the next queued send in flight on `link` if none is.
    fn post_send(&mut self, link: usize) {
        self.post_entries(link, false);
    }

    fn post_entries(&mut self, link: usize, receive: bool) {
        let header_ask = self.header_ask();
        let Some(l) = self.links.get_mut(link).and_then(|l| l.as_mut()) else {
            return;
        };
        if l.dead.is_some() {
            return;
        }
        let mut recv = None;
        // While a laned payload comes, only the lanes are read.
        let laned = matches!(l.rx, Rx::Laned { .. });
        if receive && !l.recv_in_flight && !laned {
            let (ptr, len, flags) = l.receive_into(header_ask);
            let len = len.min(u32::MAX as usize) as u32;
            recv = Some(
                match l.fixed {
                    Some(i) => opcode::Recv::new(types::Fixed(i), ptr, len)
                        .flags(flags)
                        .build(),
                    None => opcode::Recv::new(types::Fd(l.socket.as_raw_fd()), ptr, len)
                        .flags(flags)
                        .build(),
                }
                .user_data(tag(RECV, link)),
            );
        }
        let mut send = None;
        if !l.send_in_flight {
            l.start_next_send(self.frame_align);
            let left = l.send_left();
            if left > 0 {
                let zero_copy = self.zero_copy_from.is_some_and(|from| left >= from)
                    && matches!(l.zero_copy, ZeroCopy::Untried | ZeroCopy::On);
                l.describe_send();
                let entry = send_entry(&l.socket, l.fixed, &l.msg, zero_copy);
                if zero_copy && l.zero_copy == ZeroCopy::Untried {
                    l.zero_copy = ZeroCopy::Probing;
                }
                send = Some((entry.user_data(tag(SEND, link)), zero_copy));
            }
        }
        let mut lane_entries = std::mem::take(&mut self.lane_entries);
        lane_entries.clear();
        if let Some(payload) = l.spread.as_ref().map(|s| s.payload) {
            l.place_pieces();
            for (i, lane) in l.send_lanes.iter_mut().enumerate() {
                let Some(piece) = lane.piece.as_ref().filter(|_| !lane.in_flight) else {
                    continue;
                };
                let left = PIECE_HEADER + piece.len - piece.sent;
                let what = piece_tag(link, 1 + i, piece.slot);
                let zero_copy = self.zero_copy_from.is_some_and(|from| left >= from)
                    && matches!(lane.zero_copy, ZeroCopy::Untried | ZeroCopy::On);
                lane.describe(payload);
                let entry = send_entry(&lane.socket, lane.fixed, &lane.msg, zero_copy);
                lane_entries.push((entry.user_data(what), what, zero_copy, lane.thread));
            }
        }
        let base = match &mut l.rx {
            Rx::Laned { dest, .. } => Some(dest.base()),
            _ => None,
        };
        for (i, lane) in l.recv_lanes.iter_mut().enumerate() {
            // Between laned frames only a piece being read ahead is.
            let reading = base.is_some() || matches!(lane.rx, LaneRx::Ahead { .. });
            if lane.in_flight || !reading || lane.ended {
                continue;
            }
            let (ptr, len) = match &mut lane.rx {
                LaneRx::Header {
                    got: PIECE_HEADER, ..
                } => continue, // waits for its frame
                LaneRx::Header { bytes, got } => (bytes[*got..].as_mut_ptr(), PIECE_HEADER - *got),
                LaneRx::Body { offset, len, got } => {
                    let base = base.expect("a piece of the current frame");
                    (base.wrapping_add(*offset + *got), *len - *got)
                }
                LaneRx::Ahead { buf, got, .. } => {
                    let rest = &mut buf.bytes_mut()[*got..];
                    (rest.as_mut_ptr(), rest.len())
                }
            };
            let len = len.min(u32::MAX as usize) as u32;
            let entry = match lane.fixed {
                Some(f) => opcode::Recv::new(types::Fixed(f), ptr, len),
                None => opcode::Recv::new(types::Fd(lane.socket.as_raw_fd()), ptr, len),
            };
            let what = lane_tag(RECV, link, 1 + i);
            let entry = entry.flags(libc::MSG_WAITALL).build().user_data(what);
            lane_entries.push((entry, what, false, lane.thread));
        }
        if let Some(entry) = recv {
            // SAFETY: the receive writes into this link's boxed staging
            // buffer or its payload buffer, both owned by the driver and
            // neither touched nor dropped until the receive's completion is
            // taken (or leaked, see `Drop`), or into a placement target,
            // whose caller stays in `FrameEngine::receive_in_place` until
            // the engine reports the placement finished (see `PlaceRequest`).
            if unsafe { self.push(&entry) } {
                let l = self.links[link].as_mut().expect("link present");
                l.recv_in_flight = true;
                l.recv_owner = self.me;
            }
        }
        if let Some((entry, zero_copy)) = send {
            // SAFETY: `msghdr`/`iovec` are boxed in the link and describe
            // the request in `sending`, which is not moved or dropped until
            // the completion is taken; its bytes are owned by the request or
            // borrowed from a caller parked until then (see `SendRequest`),
            // and its trailing zeros are a static.
            if unsafe { self.push(&entry) } {
                let l = self.links[link].as_mut().expect("link present");
                l.send_in_flight = true;
                l.send_owner = self.me;
                l.send_zero_copy = zero_copy;
            }
        }
        for (entry, what, zero_copy, thread) in lane_entries.drain(..) {
            // What each lane entry names, and why it outlives the entry
            // (both arms below): a lane's send names its boxed `msghdr`/`iovec`, which
            // describe its piece's header (in a boxed slot of the lane,
            // not rewritten until `HeadSlots` frees it: after the send, or
            // a SEND_ZC's notifications) and a range of the laned send's
            // payload, borrowed from a caller parked until the send
            // finishes, which it does only once no piece is in flight and
            // no lane owes a notification of it (`take_finished_send`,
            // `take_notified`), or the link failed (`fail_dead_work`). A
            // lane's receive writes into its piece
            // header's bytes (in the lane, likewise) or into the laned
            // frame's destination at an offset `fit_piece` checked against
            // its length: a pooled buffer the driver owns, or a placement
            // target whose caller stays parked until it is reported
            // finished, which happens only once no lane reads into it.
            let pushed = match thread {
                // SAFETY: as above; handed to an engine thread, the entry's
                // completions come back to this ring all the same
                // (`shard_thread.rs`), and are taken as this ring's are.
                Some(t) => unsafe { self.hand(t, entry) },
                // SAFETY: as above.
                None => unsafe { self.push(&entry) },
            };
            if pushed {
                let conn = ((what >> 8) & 0xff) as usize - 1;
                // The kernel runs a handed entry's completion work on its
                // engine thread, not this one: `release` leaves it be.
                let me = if thread.is_some() { None } else { self.me };
                let l = self.links[link].as_mut().expect("link present");
                let (in_flight, owner) = match what & KIND {
                    SEND => {
                        let lane = &mut l.send_lanes[conn];
                        lane.posted = what;
                        lane.posted_zero_copy = zero_copy;
                        if zero_copy {
                            lane.zc_owners[((what >> 4) & 0x0f) as usize] = me;
                        }
                        if zero_copy && lane.zero_copy == ZeroCopy::Untried {
                            lane.zero_copy = ZeroCopy::Probing;
                        }
                        (&mut lane.in_flight, &mut lane.owner)
                    }
                    _ => {
                        let lane = &mut l.recv_lanes[conn];
                        (&mut lane.in_flight, &mut lane.owner)
                    }
                };
                *in_flight = true;
                *owner = me;
            }
        }
        self.lane_entries = lane_entries;
        self.wake_threads();
    }

    /// Hands `entry` to engine thread `t` (with the others of this turn).
    ///
    /// # Safety
    /// As `push`: memory `entry` names must stay valid until its last
    /// completion is taken from this ring.
    unsafe fn hand(&mut self, t: usize, entry: squeue::Entry) -> bool {
        self.handed[t].push(entry);
        self.in_flight += 1;
        self.pushed += 1;
        true
    }

    /// Gives each engine thread the entries built for it, and wakes it by
    /// a message from this ring (submitted with the rest of the turn); a
    /// wake that found the queue full is sent the next turn.
    fn wake_threads(&mut self) {
        for t in 0..self.threads.len() {
            if self.handed[t].is_empty() && !self.wake_owed[t] {
                continue;
            }
            let mut handed = std::mem::take(&mut self.handed[t]);
            // SAFETY: `hand`'s contract, taken by whoever handed them.
            unsafe { self.threads[t].hand(&mut handed) };
            self.handed[t] = handed;
            let waker = self.waker_slot();
            let wake = self.threads[t].wake_entry(tag(THREAD_WAKE, waker));
            // SAFETY: a message names no memory. Should the queue stay full,
            // the thread still finds its entries within its idle wait.
            let pushed = unsafe { self.push(&wake) };
            if pushed {
                self.wakers[waker].1 += 1;
            }
            self.wake_owed[t] = !pushed;
        }
    }

    /// The slot in `wakers` of the thread driving this turn (a free one
    /// taken if it has none).
    fn waker_slot(&mut self) -> usize {
        let me = self.me;
        if let Some(i) = self.wakers.iter().position(|w| w.0 == me && w.1 > 0) {
            return i;
        }
        let i = match self.wakers.iter().position(|w| w.1 == 0) {
            Some(i) => i,
            None => {
                self.wakers.push((None, 0));
                self.wakers.len() - 1
            }
        };
        self.wakers[i].0 = me;
        i
    }

    /// Wake messages the thread driving this turn sent that have not
    /// completed here.
    fn wakes_owed(&self) -> bool {
        self.wakers.iter().any(|w| w.0 == self.me && w.1 > 0)
    }

    /// What `Drop` sets if it had to leak (entries still in flight).
    #[cfg(test)]
    pub(crate) fn leak_flag(&self) -> Arc<AtomicBool> {
        self.leaked.clone()
    }

    /// Takes every completion there is; false if there was none.
    fn reap(&mut self, sink: &dyn FrameSink, finished: &mut Vec<(u64, Outcome)>) -> bool {
        let mut batch = std::mem::take(&mut self.completions);
        batch.clear();
        batch.extend(
            self.ring
                .completion()
                .map(|cqe| (cqe.user_data(), cqe.result(), cqe.flags())),
        );
        self.in_flight = settled(self.in_flight, batch.iter().map(|c| c.2));
        for &(user_data, result, flags) in &batch {
            let link = (user_data >> 16) as usize;
            let conn = ((user_data >> 8) & 0xff) as usize;
            let slot = ((user_data >> 4) & 0x0f) as usize;
            match (user_data & KIND, conn) {
                (WAKE, _) => self.wake_in_flight = false,
                (THREAD_WAKE, _) => {
                    if result < 0 {
                        tracing::warn!(result, "waking an engine thread failed");
                    }
                    if let Some(w) = self.wakers.get_mut(link) {
                        w.1 = w.1.saturating_sub(1);
                    }
                    continue; // it names no link
                }
                (RECV, 0) => self.received(link, result, sink, finished),
                (SEND, 0) => self.sent(link, result, flags, sink, finished),
                (RECV, lane) => self.lane_received(link, lane - 1, result, sink, finished),
                (SEND, lane) => {
                    let done = (lane - 1, slot);
                    self.lane_sent(link, done, result, flags, sink, finished)
                }
                _ => {}
            }
            if link < self.links.len() {
                self.touched.push(link);
            }
        }
        let any = !batch.is_empty();
        self.completions = batch;
        any
    }

    fn received(
        &mut self,
        link: usize,
        result: i32,
        sink: &dyn FrameSink,
        finished: &mut Vec<(u64, Outcome)>,
    ) {
        let (header_len, frame_align) = (self.header_len, self.frame_align);
        let Some(l) = self.links.get_mut(link).and_then(|l| l.as_mut()) else {
            return;
        };
        l.recv_in_flight = false;
        // A placement in progress on a dead link is failed by `fail_dead_work`.
        let Some(n) = self.bytes_received(link, result, sink) else {
            return;
        };
        let l = self.links[link].as_mut().expect("link present");
        match &mut l.rx {
            Rx::Placing {
                head,
                target,
                got,
                tail,
            } => {
                *got += n;
                if *got < target.len {
                    return;
                }
                l.header_only = true;
                l.skip = *tail;
                let head = *head;
                let Rx::Placing { target, .. } = std::mem::replace(&mut l.rx, Rx::Staging) else {
                    unreachable!()
                };
                finished.push((target.id, Outcome::Placed(head)));
                return;
            }
            Rx::Payload {
                head,
                buf,
                got,
                tail,
            } => {
                *got += n;
                if *got < buf.len() {
                    return;
                }
                l.header_only = true;
                l.skip = *tail;
                let head = *head;
                let Rx::Payload { buf, .. } = std::mem::replace(&mut l.rx, Rx::Staging) else {
                    unreachable!()
                };
                sink.frame(link, &head[..header_len], buf);
                return;
            }
            Rx::Staging => l.end += n,
            Rx::Laned { .. } => return, // the socket is not read meanwhile
        }
        if let Err(reason) = cut_frames(l, link, header_len, frame_align, sink, finished) {
            self.fail(link, LinkFault::BadFrame(reason), sink);
        }
        // A laned frame begun here may find its lanes ended already.
        self.fail_if_stranded(link, sink);
    }

    /// The bytes a receive on `link` (its socket or a lane) moved, or
    /// `None` if there is nothing to take: the link is dead (failed here if
    /// this result ended it: end of stream, or an error), or the receive
    /// was cancelled with nothing received. That happens when the thread
    /// that submitted it exited (io_uring cancels a task's requests when
    /// it exits, and any thread may drive); the next turn posts it again. A
    /// cancelled receive or send that had moved bytes reports that count
    /// instead (the kernel's `io_sendrecv_fail`), so the accounting stays
    /// exact.
    fn bytes_received(&mut self, link: usize, result: i32, sink: &dyn FrameSink) -> Option<usize> {
        if self.links[link].as_ref()?.dead.is_some() || result == -libc::ECANCELED {
            return None;
        }
        if result <= 0 {
            let fault = if result == 0 {
                LinkFault::Closed
            } else {
                LinkFault::Io(io::Error::from_raw_os_error(-result))
            };
            self.fail(link, fault, sink);
            return None;
        }
        Some(result as usize)
    }

    /// A receive on lane `lane` of `link` completed: a piece header is in
    /// (checked against the frame being received), or a piece. The frame's
    /// last piece delivers it, and the link's socket is read on.
    fn lane_received(
        &mut self,
        link: usize,
        lane: usize,
        result: i32,
        sink: &dyn FrameSink,
        finished: &mut Vec<(u64, Outcome)>,
    ) {
        let (header_len, frame_align) = (self.header_len, self.frame_align);
        let Some(l) = self.links.get_mut(link).and_then(|l| l.as_mut()) else {
            return;
        };
        let Some(r) = l.recv_lanes.get_mut(lane) else {
            return;
        };
        r.in_flight = false;
        // A peer that is done closes its lanes with its link, and one lane
        // may end, between pieces, while others still bring the frame
        // being received: the link fails only once no lane can (`stranded`),
        // or when the link's own socket ends (read once the frame is in).
        // A piece it read ahead stays for its frame.
        let between_pieces = matches!(r.rx, LaneRx::Header { got: 0, .. });
        if result == 0 && between_pieces && l.dead.is_none() {
            r.ended = true;
            self.fail_if_stranded(link, sink);
            return;
        }
        let Some(n) = self.bytes_received(link, result, sink) else {
            return;
        };
        let l = self.links[link].as_mut().expect("link present");
        let whole = match &mut l.recv_lanes[lane].rx {
            LaneRx::Header { got, .. } => {
                *got += n;
                if *got < PIECE_HEADER {
                    return;
                }
                l.fit_lane(lane, sink).map(|()| false)
            }
            LaneRx::Body { len, got, .. } => {
                *got += n;
                if *got < *len {
                    return;
                }
                let len = *len;
                l.recv_lanes[lane].rx = LaneRx::EMPTY;
                let Rx::Laned {
                    got, len: total, ..
                } = &mut l.rx
                else {
                    unreachable!("a lane reads a piece only during its frame")
                };
                *got += len;
                Ok(*got == *total)
            }
            LaneRx::Ahead { piece, buf, got } => {
                *got += n;
                if *got < buf.len() {
                    return;
                }
                let piece = *piece;
                let LaneRx::Ahead { buf, .. } =
                    std::mem::replace(&mut l.recv_lanes[lane].rx, LaneRx::EMPTY)
                else {
                    unreachable!()
                };
                l.recv_lanes[lane].ahead = Some((piece, buf));
                // Its frame may have begun while it was being read.
                match l.current_laned() {
                    Some((frame, ..)) if frame == piece.frame => l.take_ahead(sink),
                    _ => Ok(false),
                }
            }
        };
        let outcome = match whole {
            Ok(true) => {
                // Whole: then the frames behind its header.
                hand_over_laned(l, link, header_len, sink, finished);
                cut_frames(l, link, header_len, frame_align, sink, finished)
            }
            Ok(false) => Ok(()),
            Err(reason) => Err(reason),
        };
        if let Err(reason) = outcome {
            self.fail(link, LinkFault::BadFrame(reason), sink);
        }
        self.fail_if_stranded(link, sink);
    }

    /// Fails `link` as closed if the laned frame it receives can no longer
    /// be whole (`LinkIo::stranded`).
    fn fail_if_stranded(&mut self, link: usize, sink: &dyn FrameSink) {
        let Some(l) = self.links.get(link).and_then(|l| l.as_ref()) else {
            return;
        };
        if l.dead.is_none() && l.stranded() {
            self.fail(link, LinkFault::Closed, sink);
        }
    }

    fn sent(
        &mut self,
        link: usize,
        result: i32,
        flags: u32,
        sink: &dyn FrameSink,
        finished: &mut Vec<(u64, Outcome)>,
    ) {
        let always = self.zero_copy_always;
        let Some(l) = self.links.get_mut(link).and_then(|l| l.as_mut()) else {
            return;
        };
        // A SEND_ZC completes twice: its result (flagged "more"), then a
        // notification once the kernel no longer reads the bytes. The send
        // stays in flight until the second.
        if io_uring::cqueue::more(flags) {
            l.zc_result = Some(result);
            return;
        }
        let was_probing = l.zero_copy == ZeroCopy::Probing;
        let result = if io_uring::cqueue::notif(flags) {
            // The notification's own result carries the usage report.
            let copied = result as u32 & NOTIF_USAGE_ZC_COPIED != 0;
            let result = l.zc_result.take().unwrap_or(0);
            if was_probing && result >= 0 {
                l.zero_copy = match copied && !always {
                    true => ZeroCopy::Off,
                    false => ZeroCopy::On,
                };
                tracing::debug!(
                    link,
                    copied,
                    "SEND_ZC probe: the kernel {}; {} sends on this link from now on",
                    if copied {
                        "copied anyway"
                    } else {
                        "sent in place"
                    },
                    if copied { "plain" } else { "zero-copy" },
                );
            }
            result
        } else {
            result
        };
        if was_probing && result < 0 && result != -libc::ECANCELED {
            // This socket takes no SEND_ZC (AF_UNIX, say): nothing went
            // out; send it plainly.
            l.zero_copy = ZeroCopy::Off;
            l.send_in_flight = false;
            tracing::debug!(link, result, "SEND_ZC refused; plain sends on this link");
            return;
        }
        l.send_in_flight = false;
        let withdrawing = std::mem::take(&mut l.withdrawing);
        let Some(req) = l.sending.as_mut() else {
            return;
        };
        if l.dead.is_some() {
            // Failed by `fail_dead_work` once no piece of it is in flight.
            return;
        }
        if result == -libc::ECANCELED {
            if withdrawing && req.sent == 0 {
                let req = l.take_unsent().expect("checked");
                finished.push((req.id, Outcome::Withdrawn));
            }
            // Else nothing went out; sent again next turn (see `received`).
            return;
        }
        if result > 0 {
            req.sent += result as usize;
            if let Some(req) = l.take_finished_send() {
                finished.push((req.id, Outcome::Sent(Ok(()))));
            }
            return;
        }
        let error = if result == 0 {
            io::Error::from(io::ErrorKind::WriteZero)
        } else {
            io::Error::from_raw_os_error(-result)
        };
        // The send fails with the link (`fail_dead_work`).
        self.fail(link, LinkFault::Io(error), sink);
    }

    /// A send on lane `lane` of `link`, of the piece in header slot `slot`,
    /// completed: its piece goes on, or is out, which may finish the laned
    /// send. Or a SEND_ZC's notification came: the kernel let the slot's
    /// bytes go, which may finish a laned send waiting for it.
    fn lane_sent(
        &mut self,
        link: usize,
        (lane, slot): (usize, usize),
        result: i32,
        flags: u32,
        sink: &dyn FrameSink,
        finished: &mut Vec<(u64, Outcome)>,
    ) {
        let always = self.zero_copy_always;
        let Some(l) = self.links.get_mut(link).and_then(|l| l.as_mut()) else {
            return;
        };
        let Some(s) = l.send_lanes.get_mut(lane) else {
            return;
        };
        let counter = l.counters.as_ref().and_then(|c| c.get(lane));
        if io_uring::cqueue::notif(flags) {
            let copied = result as u32 & NOTIF_USAGE_ZC_COPIED != 0;
            if s.slots.owes(slot) {
                self.lane_notifications -= 1;
            }
            s.slots.notified(slot);
            if let Some(c) = counter.filter(|_| copied) {
                c.copied_sends.fetch_add(1, Ordering::Relaxed);
            }
            let before = s.zero_copy;
            s.zero_copy = match before {
                ZeroCopy::Probing | ZeroCopy::On if copied && !always => ZeroCopy::Off,
                ZeroCopy::Probing => ZeroCopy::On,
                other => other,
            };
            if s.zero_copy != before {
                tracing::debug!(link, lane, copied, zero_copy = ?s.zero_copy, "SEND_ZC on a lane");
            }
            // On a failed link, `fail_dead_work` lets them go.
            if l.dead.is_none() {
                while let Some(req) = l.take_notified() {
                    finished.push((req.id, Outcome::Sent(Ok(()))));
                }
            }
            return;
        }
        s.in_flight = false;
        // A failed SEND_ZC may still owe a notification (flagged "more").
        if io_uring::cqueue::more(flags) && s.slots.expect_notification(slot) {
            self.lane_notifications += 1;
        }
        let refused = result < 0 && result != -libc::ECANCELED;
        if s.posted_zero_copy && refused && s.zero_copy == ZeroCopy::Probing {
            // This socket takes no SEND_ZC: nothing went out; the piece
            // goes again, plainly, as the lane's pieces do from now on.
            s.zero_copy = ZeroCopy::Off;
            tracing::debug!(link, lane, result, "SEND_ZC refused on a lane; plain sends");
            return;
        }
        if let Some(c) = counter.filter(|_| s.posted_zero_copy && result >= 0) {
            c.zero_copy_sends.fetch_add(1, Ordering::Relaxed);
        }
        // A dead link's send fails in `fail_dead_work`; a cancel that moved
        // nothing is posted again.
        if l.dead.is_some() || result == -libc::ECANCELED {
            return;
        }
        if result <= 0 {
            let error = if result == 0 {
                io::Error::from(io::ErrorKind::WriteZero)
            } else {
                io::Error::from_raw_os_error(-result)
            };
            self.fail(link, LinkFault::Io(error), sink);
            return;
        }
        let Some(piece) = s.piece.as_mut() else {
            return;
        };
        piece.sent += result as usize;
        l.loads[lane].took(result as usize);
        if let Some(c) = counter {
            c.bytes.fetch_add(result as u64, Ordering::Relaxed);
        }
        if piece.sent < PIECE_HEADER + piece.len {
            return;
        }
        s.slots.piece_sent(piece.slot);
        s.piece = None;
        l.loads[lane].finish();
        if let Some(c) = counter {
            c.pieces.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(spread) = &mut l.spread {
            spread.open -= 1;
        }
        if let Some(req) = l.take_finished_send() {
            finished.push((req.id, Outcome::Sent(Ok(()))));
        }
    }

    /// Marks `link` dead and shuts its socket down, which makes the kernel
    /// finish whatever is still in flight on it. Queued sends fail at the
    /// next turn; one in flight fails when its completion comes.
    fn fail(&mut self, link: usize, fault: LinkFault, sink: &dyn FrameSink) {
        let Some(l) = self.links.get_mut(link).and_then(|l| l.as_mut()) else {
            return;
        };
        if l.dead.is_some() {
            return;
        }
        l.dead = Some(match &fault {
            LinkFault::Closed => "the peer closed the connection".to_string(),
            LinkFault::Io(e) => e.to_string(),
            LinkFault::BadFrame(r) => r.clone(),
        });
        l.shut_down();
        // A shut-down socket still sends what it holds, from callers'
        // memory where it went zero-copy: those sockets are reset instead,
        // which drops what they hold and brings the notifications owed, so
        // their callers can be let go before they write that memory again
        // (and without waiting on a dead peer's acknowledgements).
        if l.send_in_flight && l.send_zero_copy {
            reset(&l.socket);
        }
        for lane in l.send_lanes.iter().filter(|lane| lane.slots.owed()) {
            reset(&lane.socket);
        }
        sink.link_failed(link, fault);
    }

    /// Sends queued on dead links, failed; called each turn so their
    /// callers are released.
    fn fail_dead_work(&mut self, finished: &mut Vec<(u64, Outcome)>) {
        for l in self.links.iter_mut().flatten() {
            if let Some(reason) = &l.dead {
                for t in l.targets.drain(..) {
                    finished.push((t.id, Outcome::Failed(reason.clone())));
                }
                // A caller's memory is let go only once no receive (on the
                // socket or a lane) can still write into it.
                let writing = l.recv_in_flight || l.lanes_receiving();
                let placing = matches!(
                    l.rx,
                    Rx::Placing { .. }
                        | Rx::Laned {
                            dest: Dest::Target(_),
                            ..
                        }
                );
                if !writing && placing {
                    match std::mem::replace(&mut l.rx, Rx::Staging) {
                        Rx::Placing { target, .. }
                        | Rx::Laned {
                            dest: Dest::Target(target),
                            ..
                        } => finished.push((target.id, Outcome::Failed(reason.clone()))),
                        _ => {}
                    }
                }
                for req in l.queue.drain(..) {
                    finished.push((req.id, Outcome::Sent(Err(reason.clone()))));
                }
                // Likewise a send's: not while its head or a piece is out,
                // nor while the kernel may still read a piece of it.
                let frame = l.spread.as_ref().map(|s| s.frame);
                let held = frame.is_some_and(|f| l.send_lanes.iter().any(|s| s.slots.holds(f)));
                if !l.send_in_flight && !l.lanes_sending() && !held {
                    l.spread = None;
                    if let Some(req) = l.sending.take() {
                        finished.push((req.id, Outcome::Sent(Err(reason.clone()))));
                    }
                }
                // Frames owed notifications once these came (`fail` reset
                // their lanes, which brings them).
                while let Some(req) = take_notified(&mut l.notified_later, &l.send_lanes) {
                    finished.push((req.id, Outcome::Sent(Err(reason.clone()))));
                }
            }
        }
    }
}

/// The laned frame being received is whole: hands it to its waiting
/// caller or the sink, and the link's socket is read on.
fn hand_over_laned(
    l: &mut LinkIo,
    link: usize,
    header_len: usize,
    sink: &dyn FrameSink,
    finished: &mut Vec<(u64, Outcome)>,
) {
    let Rx::Laned { head, dest, .. } = std::mem::replace(&mut l.rx, Rx::Staging) else {
        unreachable!("called with a laned frame whole")
    };
    l.recv_frames = l.recv_frames.wrapping_add(1);
    match dest {
        Dest::Target(target) => finished.push((target.id, Outcome::Placed(head))),
        Dest::Buf(buf) => sink.frame(link, &head[..header_len], buf),
    }
}

/// Cuts whole frames out of `l`'s staging buffer: small ones to the sink
/// (or a waiting caller), until one whose payload is received apart (in
/// place, or laned) or that is not all here yet. `Err`: a header the sink
/// refused, or a broken lane stream; the link is to fail with it.
fn cut_frames(
    l: &mut LinkIo,
    link: usize,
    header_len: usize,
    frame_align: usize,
    sink: &dyn FrameSink,
    finished: &mut Vec<(u64, Outcome)>,
) -> Result<(), String> {
    let mut refused = None;
    loop {
        let dropped = l.skip.min(l.end - l.start);
        l.start += dropped;
        l.skip -= dropped;
        let avail = l.end - l.start;
        if avail < header_len {
            break;
        }
        let mut head_copy = [0u8; MAX_HEADER];
        head_copy[..header_len].copy_from_slice(&l.staging[l.start..l.start + header_len]);
        let head = &head_copy[..header_len];
        let (pad, len) = match sink.payload(link, head) {
            Ok(at) if at.pad < frame_align => (at.pad, at.len),
            Ok(at) => {
                refused = Some(format!(
                    "link {link} sent a frame with a pad of {} bytes, not below the frame \
                     alignment of {frame_align} bytes: a corrupt stream or a peer with \
                     another framing",
                    at.pad
                ));
                break;
            }
            Err(reason) => {
                refused = Some(reason);
                break;
            }
        };
        let lead = header_len + pad;
        if avail < lead {
            break; // the pad is on its way
        }
        // Whether a caller waits for exactly this frame.
        let placed = match (l.targets.is_empty(), sink.frame_key(link, head)) {
            (false, Some(key)) => l.targets.iter().position(|t| t.key == key && t.len == len),
            _ => None,
        };
        if len >= l.lane_from && !l.recv_lanes.is_empty() {
            // Its payload comes in pieces on the receive lanes; here are only
            // its header, pad and zeros, and perhaps the frames after it.
            l.start += lead;
            l.skip = super::tail_len(lead, frame_align);
            l.header_only = false;
            let dest = match placed {
                Some(i) => Dest::Target(l.targets.swap_remove(i)),
                None => {
                    let mut buf = sink.buffer();
                    buf.prepare(len);
                    Dest::Buf(buf)
                }
            };
            l.rx = Rx::Laned {
                head: head_copy,
                dest,
                len,
                claimed: 0,
                got: 0,
            };
            // Pieces read ahead for this frame land; lanes that waited go on.
            match l.take_ahead(sink) {
                Ok(false) => break,
                // Whole already: hand it over and cut on.
                Ok(true) => {
                    hand_over_laned(l, link, header_len, sink, finished);
                    continue;
                }
                Err(reason) => {
                    refused = Some(reason);
                    break;
                }
            }
        }
        let tail = super::tail_len(lead + len, frame_align);
        if lead + len <= l.staging.len() {
            l.header_only = false; // small frames come many per receive
        }
        let body = l.start + lead;
        if let Some(i) = placed {
            // A caller waits for exactly this frame: straight into its
            // memory, no pooled buffer, no second copy.
            let target = l.targets.swap_remove(i);
            let have = (avail - lead).min(len);
            // SAFETY: `target` names `len` bytes of a caller's memory
            // that nothing else touches until the engine reports this
            // placement finished (see `PlaceRequest`); `have <= len`, and
            // the source is this link's staging buffer.
            unsafe { std::ptr::copy_nonoverlapping(l.staging[body..].as_ptr(), target.ptr, have) };
            if have == len {
                finished.push((target.id, Outcome::Placed(head_copy)));
                l.start += lead + len;
                l.skip = tail;
                continue;
            }
            l.start = 0;
            l.end = 0;
            l.rx = Rx::Placing {
                head: head_copy,
                target,
                got: have,
                tail,
            };
            break;
        }
        if avail >= lead + len {
            let mut buf = sink.buffer();
            buf.prepare(len)
                .copy_from_slice(&l.staging[body..body + len]);
            sink.frame(link, head, buf);
            l.start += lead + len;
            l.skip = tail;
            continue;
        }
        if lead + len <= l.staging.len() {
            break; // the rest of a small frame is on its way
        }
        // A large payload: take what is here, receive the rest in place.
        let mut buf = sink.buffer();
        let have = avail - lead;
        buf.prepare(len)[..have].copy_from_slice(&l.staging[body..l.end]);
        l.start = 0;
        l.end = 0;
        l.rx = Rx::Payload {
            head: head_copy,
            buf,
            got: have,
            tail,
        };
        break;
    }
    if l.start == l.end {
        l.start = 0;
        l.end = 0;
    }
    match refused {
        Some(reason) => Err(reason),
        None => Ok(()),
    }
}

/// Bytes a TCP socket holds that its peer has not acknowledged (sent or
/// not: `SIOCOUTQ`); 0 if it cannot say.
/// `LinkIo::take_notified` over the two fields it needs, for a caller
/// that holds others of the link borrowed.
fn take_notified(later: &mut Vec<(u32, SendRequest)>, lanes: &[SendLane]) -> Option<SendRequest> {
    let i = later
        .iter()
        .position(|(frame, _)| !lanes.iter().any(|l| l.slots.holds(*frame)))?;
    Some(later.swap_remove(i).1)
}

/// Resets a TCP connection (`connect` to `AF_UNSPEC`: the kernel's
/// `tcp_disconnect`): what it holds unsent or unacknowledged is dropped and
/// the peer gets a reset. The descriptor stays open, shared as before.
fn reset(socket: &SharedFd) {
    // SAFETY: `sockaddr` is plain old data; all-zero with the family set is
    // an `AF_UNSPEC` address, passed by pointer and length for the call only.
    let rc = unsafe {
        let mut unspec: libc::sockaddr = std::mem::zeroed();
        unspec.sa_family = libc::AF_UNSPEC as libc::sa_family_t;
        libc::connect(
            socket.as_raw_fd(),
            &unspec,
            size_of::<libc::sockaddr>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        tracing::debug!(error = %io::Error::last_os_error(), "resetting a lane");
    }
}

fn unacknowledged(socket: &SharedFd) -> u64 {
    let mut bytes: libc::c_int = 0;
    // SAFETY: `TIOCOUTQ` (`SIOCOUTQ` on a socket) writes one `c_int` into
    // `bytes`, a live local.
    let done = unsafe { libc::ioctl(socket.as_raw_fd(), libc::TIOCOUTQ, &mut bytes) };
    if done == 0 { bytes.max(0) as u64 } else { 0 }
}

/// The kernel's delivery rate estimate of a TCP socket (bytes/s) and
/// whether the sample behind it was limited by what the socket was fed.
fn delivery_rate(socket: &SharedFd) -> Option<(u64, bool)> {
    // SAFETY: `tcp_info` is plain old data; all-zero is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `TCP_INFO` writes at most `len` bytes into `info`, a live
    // local of that size, and the length into `len`.
    let done = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    // An older kernel fills less of the struct: the rate must be in it.
    let rate_end = std::mem::offset_of!(libc::tcp_info, tcpi_delivery_rate) + size_of::<u64>();
    if done != 0 || (len as usize) < rate_end {
        return None;
    }
    // The byte after the window scales (offset 7) holds the app-limited
    // bit: the first of its bitfield, the low bit where the compiler lays
    // bitfields out from the low end (little endian), the high bit else.
    const APP_LIMITED: u8 = if cfg!(target_endian = "little") {
        1
    } else {
        0x80
    };
    // SAFETY: byte 7 of the struct, inside it (and filled: `len` covers
    // the rate, further on).
    let flags = unsafe { *(&info as *const libc::tcp_info).cast::<u8>().add(7) };
    Some((info.tcpi_delivery_rate, flags & APP_LIMITED != 0))
}

/// Sets `TCP_NOTSENT_LOWAT` on a send lane; a socket that takes no such
/// option (not TCP) keeps its default.
fn set_notsent_lowat(socket: &SharedFd, bytes: libc::c_int) {
    // SAFETY: `setsockopt` reads `size_of::<c_int>()` bytes from `bytes`,
    // a live local, and touches no other memory.
    let _ = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_NOTSENT_LOWAT,
            (&bytes as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
}

/// Caps what a socket sends per second (`SO_MAX_PACING_RATE`, which TCP
/// honours by pacing itself): a slow lane, for the engine's tests.
#[cfg(test)]
pub(super) fn pace_for_tests(socket: &impl AsRawFd, bytes_per_sec: u64) {
    // SAFETY: `setsockopt` reads `size_of::<u64>()` bytes from a live local.
    let done = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_MAX_PACING_RATE,
            (&bytes_per_sec as *const u64).cast(),
            size_of::<u64>() as libc::socklen_t,
        )
    };
    assert_eq!(done, 0, "{}", io::Error::last_os_error());
}

/// Entries still in flight after taking completions with these flags from
/// `in_flight`: each completion ends its entry, except one flagged "more"
/// (a SEND_ZC's result), whose entry stays until its notification. Counted
/// over the whole batch, since both can arrive in one.
fn settled(in_flight: usize, flags: impl Iterator<Item = u32>) -> usize {
    let (done, more) = flags.fold((0, 0), |(d, m), f| {
        (d + 1, m + usize::from(io_uring::cqueue::more(f)))
    });
    in_flight + more - done
}

/// The `wakers` slot of the wakes `Drop` sends (none of theirs).
const STOPPING_WAKER: usize = 0xffff;

impl Driver {
    /// Wake messages sent whose completion has not come.
    fn wakes_in_flight(&self) -> usize {
        let owed = |count: u32| count as usize;
        owed(self.stop_wakes) + self.wakers.iter().map(|w| owed(w.1)).sum::<usize>()
    }

    /// `Drop`'s reap: takes every completion there is, counting it off
    /// `in_flight`, and a wake's off its sender's count too.
    fn settle_for_drop(&mut self) {
        let done: Vec<(u64, u32)> = self
            .ring
            .completion()
            .map(|c| (c.user_data(), c.flags()))
            .collect();
        self.in_flight = settled(self.in_flight, done.iter().map(|c| c.1));
        for &(user_data, _) in done.iter().filter(|c| c.0 & KIND == THREAD_WAKE) {
            let slot = (user_data >> 16) as usize;
            let count = match self.wakers.get_mut(slot) {
                Some(w) => &mut w.1,
                None => &mut self.stop_wakes,
            };
            *count = count.saturating_sub(1);
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        for l in self.links.iter().flatten() {
            l.shut_down();
        }
        if self.wake_in_flight {
            let cancel = opcode::AsyncCancel::new(tag(WAKE, 0))
                .build()
                .user_data(tag(CANCEL, 0));
            // SAFETY: a cancel names no memory.
            let _ = unsafe { self.push(&cancel) };
        }
        // Shut-down sockets finish their entries promptly; wait for them so
        // the buffers can be freed, but never forever.
        let deadline = Instant::now() + Duration::from_secs(1);
        while self.in_flight > self.wakes_in_flight() && Instant::now() < deadline {
            self.sleep_in_kernel(Duration::from_millis(50));
            self.settle_for_drop();
        }
        // Engine threads stop once what they submitted is done: after the
        // wait above, which needed them to pass completions on.
        for t in 0..self.threads.len() {
            self.threads[t].ask_to_stop();
            let wake = self.threads[t].wake_entry(tag(THREAD_WAKE, STOPPING_WAKER));
            // SAFETY: a message names no memory.
            if unsafe { self.push(&wake) } {
                self.stop_wakes += 1;
            }
        }
        let _ = self.ring.submit();
        for t in &mut self.threads {
            t.join();
        }
        // The wake messages' own completions (posted at submit), and any
        // the threads passed on while stopping: taken, or the count above
        // would leak the links for nothing.
        self.settle_for_drop();
        // Wakes name no memory: one whose completion is still owed (work
        // left to a thread that sent it, before Linux 6.11) leaks nothing.
        if self.in_flight > self.wakes_in_flight() {
            self.leaked.store(true, Ordering::SeqCst);
            // SAFETY-relevant: the kernel may still write into these, so
            // they must outlive it: leak them.
            std::mem::forget(std::mem::take(&mut self.links));
            std::mem::forget(std::mem::replace(&mut self.wake_word, Box::new(0)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::settled;

    const MORE: u32 = 1 << 1; // IORING_CQE_F_MORE
    const NOTIF: u32 = 1 << 3; // IORING_CQE_F_NOTIF

    #[test]
    fn a_zero_copy_send_settles_whether_its_two_completions_come_together_or_apart() {
        // One SEND_ZC in flight: its result ("more") and its notification
        // in one batch (the case that used to count below zero), or apart.
        assert_eq!(settled(1, [MORE, NOTIF].into_iter()), 0);
        let after_result = settled(1, [MORE].into_iter());
        assert_eq!(after_result, 1, "still in flight until the notification");
        assert_eq!(settled(after_result, [NOTIF].into_iter()), 0);
        // Plain completions each end their entry.
        assert_eq!(settled(3, [0, 0].into_iter()), 1);
    }
}
