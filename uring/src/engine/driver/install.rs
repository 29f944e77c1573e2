//! Installing a link: its socket and lanes in the ring's file table (or
//! not, for lanes dealt to engine threads), their buffers and counters.

use super::*;

/// A send lane's socket holds at most about this many bytes not yet sent
/// (`TCP_NOTSENT_LOWAT`), on links with more than one lane: a piece's send
/// then ends about when the lane has moved most of it, so a lane waited
/// for wakes the driver when it has room, and bytes do not pile up unsent
/// in a slow lane's buffer (`lanes::pick_lane`).
const LANE_NOTSENT_LOWAT: libc::c_int = 64 << 10;

impl Driver {
    pub(super) fn install(&mut self, link: usize, socket: SharedFd, lanes: Option<LanesToInstall>) {
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
        if let Some(old) = self.links[link].take()
            && (old.recv_in_flight
                || old.send_in_flight
                || old.lanes_sending()
                || old.lanes_receiving()
                || old.send_lanes.iter().any(|l| l.slots.owed()))
        {
            std::mem::forget(old);
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
            send_error: None,
            zero_copy: ZeroCopy::Untried,
            targets: Vec::new(),
            zc_result: None,
            withdrawing: false,
            send_zero_copy: false,
        }));
    }
}
