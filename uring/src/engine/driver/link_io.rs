//! What the driver knows of one link: its socket's receive state (`Rx`),
//! its lanes each way (`SendLane`, `RecvLane`), the laned send being spread
//! over them, and the rules over that state that do no I/O of their own
//! beyond shutting the link's sockets (`LinkIo`).

use super::*;

pub(super) enum Rx {
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
pub(super) enum Dest {
    Buf(AlignedBuf),
    Target(PlaceRequest),
}

impl Dest {
    pub(super) fn base(&mut self) -> *mut u8 {
        match self {
            Dest::Buf(buf) => buf.bytes_mut().as_mut_ptr(),
            Dest::Target(target) => target.ptr,
        }
    }
}

/// A lane this end writes.
pub(super) struct SendLane {
    pub(super) socket: SharedFd,
    pub(super) fixed: Option<u32>,
    /// The engine thread its entries are handed to (none: the driver's
    /// ring takes them).
    pub(super) thread: Option<usize>,
    pub(super) in_flight: bool,
    pub(super) owner: Option<ThreadId>,
    /// The `user_data` of the send in flight (its cancel names it).
    pub(super) posted: u64,
    /// The send in flight is a SEND_ZC (not cancelled: its notification
    /// must still come).
    pub(super) posted_zero_copy: bool,
    /// The piece being written.
    pub(super) piece: Option<OutPiece>,
    /// Piece headers, each kept in place until the kernel is done with it
    /// (`slots` says when: after its send, or its SEND_ZCs' notifications).
    pub(super) heads: Box<[[u8; PIECE_HEADER]; HEAD_SLOTS]>,
    pub(super) slots: HeadSlots,
    /// The thread that posted each slot's last SEND_ZC: the kernel runs
    /// its notification's completion work there (`Driver::release`).
    pub(super) zc_owners: [Option<ThreadId>; HEAD_SLOTS],
    /// Whether this lane's large pieces go zero-copy (probed per lane).
    pub(super) zero_copy: ZeroCopy,
    pub(super) msg: Box<libc::msghdr>,
    pub(super) iov: Box<[libc::iovec; 2]>,
}

/// A piece of a laned frame's payload, on its way out.
pub(super) struct OutPiece {
    /// Its header's slot in the lane's `heads`.
    pub(super) slot: usize,
    /// Where in the payload, and how many bytes.
    pub(super) offset: usize,
    pub(super) len: usize,
    /// Bytes out, its header's included.
    pub(super) sent: usize,
}

impl SendLane {
    /// Points `msg` at what is left of the piece: its header, then its
    /// bytes from `payload`.
    pub(super) fn describe(&mut self, payload: *const u8) {
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
pub(super) struct RecvLane {
    pub(super) socket: SharedFd,
    pub(super) fixed: Option<u32>,
    /// As `SendLane::thread`.
    pub(super) thread: Option<usize>,
    pub(super) in_flight: bool,
    pub(super) owner: Option<ThreadId>,
    pub(super) rx: LaneRx,
    /// A piece of a later frame, read ahead whole, waiting for its frame
    /// (`LaneRx::Ahead`). A lane holding one reads no further.
    pub(super) ahead: Option<(PieceHeader, AlignedBuf)>,
    /// The peer closed the lane between pieces: it is read no more.
    pub(super) ended: bool,
}

pub(super) enum LaneRx {
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
pub(super) const MAX_AHEAD: usize = lanes::MAX_PIECE;

impl LaneRx {
    pub(super) const EMPTY: LaneRx = LaneRx::Header {
        bytes: [0; PIECE_HEADER],
        got: 0,
    };
}

/// The payload of the laned frame being sent, as pieces handed to lanes.
pub(super) struct Spread {
    /// The frame's count among the link's laned frames.
    pub(super) frame: u32,
    pub(super) payload: *const u8,
    pub(super) len: usize,
    /// How long its pieces are (`lanes::piece_len`); a clearly slow lane
    /// takes shorter ones (`lanes::piece_for`), and the last may be short.
    pub(super) piece: usize,
    /// Bytes handed to lanes so far.
    pub(super) next: usize,
    /// Pieces handed out and not yet wholly sent.
    pub(super) open: usize,
}

pub(super) struct LinkIo {
    pub(super) socket: SharedFd,
    /// Index in the ring's file table, when registered.
    pub(super) fixed: Option<u32>,
    /// The link's lanes, if it has them: frames whose payload is at least
    /// `lane_from` bytes put it there in pieces, and everything else on
    /// `socket`.
    pub(super) send_lanes: Vec<SendLane>,
    pub(super) recv_lanes: Vec<RecvLane>,
    /// What placement knows of each send lane.
    pub(super) loads: Vec<LaneLoad>,
    /// What each send lane has carried, for whoever added the link.
    pub(super) counters: Option<LaneCounters>,
    pub(super) lane_from: usize,
    /// The payload of the laned frame in `sending`.
    pub(super) spread: Option<Spread>,
    /// Laned frames wholly sent whose SEND_ZC notifications some lane still
    /// owes (by frame count): their callers wait on the side while the next
    /// frame goes (`HeadSlots`).
    pub(super) notified_later: Vec<(u32, SendRequest)>,
    /// Laned frames begun on this link, each way (wrapping): a piece
    /// header names its frame by this count.
    pub(super) sent_frames: u32,
    pub(super) recv_frames: u32,
    pub(super) staging: Box<[u8]>,
    /// Unparsed bytes are `staging[start..end]`.
    pub(super) start: usize,
    pub(super) end: usize,
    /// Bytes still to drop before the next header (the last frame's
    /// trailing zeros).
    pub(super) skip: usize,
    pub(super) rx: Rx,
    /// The last frame was large, so the next staging receive asks for a
    /// header only: in a stream of large frames each payload then lands
    /// where it belongs whole, none of it copied out of staging.
    pub(super) header_only: bool,
    pub(super) recv_in_flight: bool,
    /// The thread whose turn posted the receive in flight: the kernel runs
    /// its completion work in that thread.
    pub(super) recv_owner: Option<ThreadId>,
    pub(super) queue: VecDeque<SendRequest>,
    /// The send being written; it stays here (not moved) while in flight.
    pub(super) sending: Option<SendRequest>,
    pub(super) send_in_flight: bool,
    pub(super) send_owner: Option<ThreadId>,
    pub(super) msg: Box<libc::msghdr>,
    pub(super) iov: Box<[libc::iovec; 3]>,
    /// Set once the link failed; later sends fail with it at once.
    pub(super) dead: Option<String>,
    /// Set once a send failed (the peer is gone, or the connection broke):
    /// sends fail with it, while the link's receiving side goes on until
    /// it ends (`Driver::stop_sending`).
    pub(super) send_error: Option<String>,
    pub(super) zero_copy: ZeroCopy,
    /// Callers waiting for a frame to be received into their memory.
    pub(super) targets: Vec<PlaceRequest>,
    /// A SEND_ZC's result, held until its notification (the kernel is done
    /// with the bytes only then).
    pub(super) zc_result: Option<i32>,
    /// The send in flight is being cancelled for its caller, who withdrew
    /// it: if the kernel confirms none of it went out, it ends withdrawn.
    pub(super) withdrawing: bool,
    /// The send in flight is a SEND_ZC (its notification must still come,
    /// so it is not cancelled).
    pub(super) send_zero_copy: bool,
}

impl LinkIo {
    /// Bytes left of the current send on the link's socket (for a laned
    /// send: of its head and zeros).
    pub(super) fn send_left(&self) -> usize {
        self.sending
            .as_ref()
            .map_or(0, |req| req.main_end().saturating_sub(req.sent))
    }

    /// Moves the next queued send into `sending` if none is there, marking
    /// it laned if the link has lanes and its payload is `lane_from` bytes
    /// or more (the receiver applies the same rule to the header).
    pub(super) fn start_next_send(&mut self, frame_align: usize) {
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
        req.tail = crate::engine::tail_len(req.head_len, frame_align);
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
    pub(super) fn take_unsent(&mut self) -> Option<SendRequest> {
        if self.spread.take().is_some() {
            self.sent_frames = self.sent_frames.wrapping_sub(1);
        }
        self.sending.take()
    }

    /// Whether a piece of the laned send is in the kernel's hands.
    pub(super) fn lanes_sending(&self) -> bool {
        self.send_lanes.iter().any(|lane| lane.in_flight)
    }

    pub(super) fn lanes_receiving(&self) -> bool {
        self.recv_lanes.iter().any(|lane| lane.in_flight)
    }

    /// Whether connection `conn` (0: main; `1 + i`: lane `i`) has a receive
    /// (or a send) in flight.
    pub(super) fn receiving(&self, conn: usize) -> bool {
        match conn {
            0 => self.recv_in_flight,
            i => self.recv_lanes.get(i - 1).is_some_and(|l| l.in_flight),
        }
    }

    pub(super) fn sending_on(&self, conn: usize) -> bool {
        match conn {
            0 => self.send_in_flight,
            i => self.send_lanes.get(i - 1).is_some_and(|l| l.in_flight),
        }
    }

    /// The send in `sending`, if it is done: a plain one once its bytes
    /// are out, a laned one once its head and every piece are and no lane
    /// owes a notification of it. One whose pieces are out but owed
    /// notifications moves to `notified_later`, so the next frame can go.
    pub(super) fn take_finished_send(&mut self) -> Option<SendRequest> {
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
    pub(super) fn take_notified(&mut self) -> Option<SendRequest> {
        take_notified(&mut self.notified_later, &self.send_lanes)
    }

    /// Hands pieces of the laned send's payload to lanes, each to the lane
    /// with the fewest bytes yet to deliver, until that lane is a busy one
    /// (`lanes::pick_lane`; what each lane's socket holds unacknowledged
    /// is looked at first). Only once the frame's head is out: until then
    /// the send can still be withdrawn whole.
    pub(super) fn place_pieces(&mut self) {
        let (Some(req), Some(s)) = (&self.sending, &mut self.spread) else {
            return;
        };
        // With every lane busy nothing can be placed: spare the looks.
        let all_busy = self.loads.iter().all(LaneLoad::is_busy);
        if req.sent < req.lead() || s.next == s.len || all_busy {
            return;
        }
        if self.send_lanes.len() > 1 {
            for (i, (lane, load)) in self.send_lanes.iter().zip(&mut self.loads).enumerate() {
                let unacked = unacknowledged(&lane.socket);
                load.observe(unacked);
                if let Some(progress) = progress(&lane.socket) {
                    load.observe_progress(progress);
                }
                if let Some(c) = self.counters.as_ref().and_then(|c| c.get(i)) {
                    c.unacked.store(unacked, Ordering::Relaxed);
                    c.delivery_rate.store(load.rate(), Ordering::Relaxed);
                }
            }
        }
        while s.next < s.len {
            let Some(i) = lanes::pick_lane(&self.loads) else {
                break;
            };
            let len = lanes::piece_for(&self.loads, i, s.piece).min(s.len - s.next);
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
    pub(super) fn stranded(&self) -> bool {
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
    pub(super) fn current_laned(&self) -> Option<(u32, usize, usize)> {
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
    pub(super) fn fit_lane(&mut self, i: usize, sink: &dyn FrameSink) -> Result<(), String> {
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
    pub(super) fn take_ahead(&mut self, sink: &dyn FrameSink) -> Result<bool, String> {
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
    /// Shuts the sending side down: the socket's write side (a peer that
    /// lives reads its end and closes too) and the send lanes, which only
    /// send. The socket is still read.
    pub(super) fn shut_down_sending(&self) {
        let _ = shutdown(self.socket.as_raw_fd(), Shutdown::Write);
        for lane in &self.send_lanes {
            let _ = shutdown(lane.socket.as_raw_fd(), Shutdown::Both);
        }
    }

    /// Why sends on this link fail, if they do.
    pub(super) fn send_failure(&self) -> Option<&String> {
        self.dead.as_ref().or(self.send_error.as_ref())
    }

    pub(super) fn shut_down(&self) {
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
    pub(super) fn receive_into(&mut self, header_ask: usize) -> (*mut u8, usize, i32) {
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
    pub(super) fn describe_send(&mut self) {
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
