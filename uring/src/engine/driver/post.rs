//! What goes on the ring for a link each turn: its receive and send
//! entries, its lanes' pieces and receives (handed to engine threads where
//! dealt), and the small frames sent or received directly by a polling
//! driver.

use super::*;

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

impl Driver {
    /// Writes `link`'s queued small frames with plain non-blocking
    /// `sendmsg` calls while the socket takes them whole, before any ring
    /// entry is made for them: a small frame then costs one system call and
    /// no submission or completion. What the socket does not take (or a
    /// large frame) goes through the ring as before, in order, since only
    /// the driver sends and never while a ring send is in flight.
    pub(super) fn send_directly(&mut self, link: usize, finished: &mut Vec<(u64, Outcome)>) {
        loop {
            let Some(l) = self.links.get_mut(link).and_then(|l| l.as_mut()) else {
                return;
            };
            if l.send_failure().is_some() || l.send_in_flight {
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
            self.sent(link, result, 0, finished);
            if !whole {
                return;
            }
        }
    }

    /// What a header-only receive asks for: a header and the longest pad.
    pub(super) fn header_ask(&self) -> usize {
        self.header_len + self.frame_align - 1
    }

    /// Whether a polling driver reads small frames itself this turn (see
    /// `receive_directly`).
    pub(super) fn receives_directly(&self) -> bool {
        !self.spin.is_zero() && self.links.iter().flatten().count() <= DIRECT_RECV_LINKS
    }

    /// Whether `link` is between large payloads (its receives go to the
    /// staging buffer).
    pub(super) fn is_staging(&self, link: usize) -> bool {
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
    pub(super) fn held_back(&self, link: usize, sink: &dyn FrameSink) -> bool {
        self.links
            .get(link)
            .and_then(|l| l.as_ref())
            .is_some_and(|l| {
                // Once sending stopped, what is left is read whole.
                matches!(l.rx, Rx::Staging) && l.send_error.is_none() && sink.paused(link)
            })
    }

    /// Reads what each staging link without a receive in flight has, with
    /// one plain non-blocking `recv` per link, and handles it as a receive's
    /// completion; true if any link had bytes (or an error). A polling
    /// driver does this instead of keeping a ring receive in flight: that
    /// receive's arming, completion work and withdrawal at `release` cost
    /// more system calls than a poll's `recv` (decision 0012). Payloads
    /// received in place keep their ring receive (`MSG_WAITALL`).
    pub(super) fn receive_directly(
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
            if l.send_error.is_none() && sink.paused(link) {
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
    pub(super) fn post_send(&mut self, link: usize) {
        self.post_entries(link, false);
    }

    pub(super) fn post_entries(&mut self, link: usize, receive: bool) {
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
        let sending = l.send_failure().is_none();
        if sending && !l.send_in_flight {
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
        if let Some(payload) = l.spread.as_ref().map(|s| s.payload).filter(|_| sending) {
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
}
