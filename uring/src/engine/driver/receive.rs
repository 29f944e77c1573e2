//! What a receive's completion means: bytes into the link's staging
//! buffer, a placement or a payload buffer (`received`), or into a lane's
//! piece (`lane_received`), and frames cut from what arrived.

use super::*;

impl Driver {
    pub(super) fn received(
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
    pub(super) fn lane_received(
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
            l.skip = crate::engine::tail_len(lead, frame_align);
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
        let tail = crate::engine::tail_len(lead + len, frame_align);
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
