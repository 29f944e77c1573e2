//! What a link's lanes carry, as rules with no I/O (docs/decisions/0018,
//! 0034): the header that names each piece, how a large payload is cut into
//! pieces, which lane the next piece goes to, and the receiver's checks on a
//! piece before any byte of it is placed. The driver does the reading and
//! writing.
//!
//! A laned frame's header, pad and zeros go on the link's main connection;
//! its payload goes as pieces over the link's send lanes, each piece a
//! [`PieceHeader`] and then its bytes. The header names the frame (a count
//! of laned frames on the link, one way) and where the piece lands, so the
//! sender may put any piece on any lane: each goes to the lane with the
//! fewest bytes yet to deliver ([`pick_lane`]), not round-robin, so one slow
//! lane does not hold every frame to its pace; a clearly slow lane's pieces
//! are cut to its share by rate ([`piece_for`]), so the piece it holds at a
//! frame's end is short.

use std::time::Duration;

/// Bytes of a [`PieceHeader`] on the wire.
pub(crate) const PIECE_HEADER: usize = 16;

/// Pieces no larger than this (a multiple of every page size), so a slow
/// lane takes at most this much of a frame at a time.
pub(crate) const MAX_PIECE: usize = 1 << 20;

/// Nor smaller than this (save a frame's last, and those of a clearly slow
/// lane, [`piece_for`]): each piece costs a header and a system call on
/// each end.
pub(crate) const MIN_PIECE: usize = 64 << 10;

/// With more than one lane, a frame is cut into about this many pieces per
/// lane, so lanes that finish early take more of it.
const PIECES_PER_LANE: usize = 4;

/// The bytes that introduce a piece on a lane: which laned frame it is of
/// (counted from zero on the link, one way, wrapping), its length and where
/// it lands in the frame's payload. Little endian.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PieceHeader {
    pub(crate) frame: u32,
    pub(crate) len: u32,
    pub(crate) offset: u64,
}

impl PieceHeader {
    pub(crate) fn encode(&self) -> [u8; PIECE_HEADER] {
        let mut out = [0u8; PIECE_HEADER];
        out[..4].copy_from_slice(&self.frame.to_le_bytes());
        out[4..8].copy_from_slice(&self.len.to_le_bytes());
        out[8..].copy_from_slice(&self.offset.to_le_bytes());
        out
    }

    pub(crate) fn decode(bytes: &[u8; PIECE_HEADER]) -> PieceHeader {
        let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        PieceHeader {
            frame: word(0),
            len: word(4),
            offset: u64::from_le_bytes(bytes[8..].try_into().expect("8 bytes")),
        }
    }
}

/// How long the pieces of a payload of `len` bytes are, over `lanes` lanes.
/// One lane takes the payload whole (up to [`MAX_PIECE`] times 1024, far
/// beyond any frame); more take pieces of about `len / (4 * lanes)`, at
/// least [`MIN_PIECE`] and at most [`MAX_PIECE`].
pub(crate) fn piece_len(len: usize, lanes: usize) -> usize {
    if lanes <= 1 {
        return len.clamp(1, MAX_PIECE << 10);
    }
    len.div_ceil(PIECES_PER_LANE * lanes)
        .next_multiple_of(4 << 10)
        .clamp(MIN_PIECE, MAX_PIECE)
}

/// What the sender knows of one send lane: whether a piece of it is in
/// flight, the bytes of that piece the kernel has yet to take, and the
/// bytes the kernel holds that the peer has not acknowledged (sent or not:
/// `SIOCOUTQ`, looked at before each placement).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct LaneLoad {
    busy: bool,
    pending: usize,
    unacked: u64,
    /// The lane's rates (bytes/s) over its last two whole windows of
    /// busy time ([`RATE_WINDOW`]), the newer first.
    rates: [u64; 2],
    /// How many windows have been whole (up to 2).
    whole: u8,
    /// Where the current window began: the kernel's busy time (µs) and
    /// bytes acknowledged then.
    window: Option<Progress>,
}

/// What the kernel has counted of a send lane since it connected
/// (`TCP_INFO`): how long it had data in flight or waiting to be sent
/// (`tcpi_busy_time`, µs, in the kernel's clock ticks) and how many bytes
/// the peer acknowledged (`tcpi_bytes_acked`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Progress {
    pub(crate) busy_us: u64,
    pub(crate) acked: u64,
}

/// A lane's rate is the bytes acknowledged over this much of its busy
/// time (time it held data: idle time does not count, so a lane fed less
/// does not look slower for it), long enough to span many pieces and the
/// kernel's clock ticks (1-10 ms by its HZ: within about 8% at HZ=250,
/// 20% at HZ=100).
pub(crate) const RATE_WINDOW: Duration = Duration::from_millis(50);

impl LaneLoad {
    pub(crate) fn is_busy(&self) -> bool {
        self.busy
    }

    /// A piece of `bytes` (header included) went on the lane.
    pub(crate) fn start(&mut self, bytes: usize) {
        self.busy = true;
        self.pending = bytes;
    }

    /// The kernel took `bytes` more of the lane's piece.
    pub(crate) fn took(&mut self, bytes: usize) {
        self.pending = self.pending.saturating_sub(bytes);
    }

    /// The lane's piece is all the kernel's.
    pub(crate) fn finish(&mut self) {
        self.busy = false;
        self.pending = 0;
    }

    /// What the kernel holds of the lane unacknowledged now.
    pub(crate) fn observe(&mut self, unacked: u64) {
        self.unacked = unacked;
    }

    /// The lane's rate (bytes/s; 0: none yet, until two windows are
    /// whole): the higher of its last two windows', so one window that
    /// read low (slow start, a delayed acknowledgement, a stall of the
    /// receiver) does not make a lane look slow.
    pub(crate) fn rate(&self) -> u64 {
        match self.whole {
            2 => self.rates[0].max(self.rates[1]),
            _ => 0,
        }
    }

    /// What the kernel has counted of the lane now: once [`RATE_WINDOW`]
    /// of busy time has passed since the window began, its bytes
    /// acknowledged over that time are the lane's newest window rate.
    /// Counts below the window's start (counters that restarted) begin a
    /// new window and keep the rates.
    pub(crate) fn observe_progress(&mut self, now: Progress) {
        let Some(start) = self.window else {
            self.window = Some(now);
            return;
        };
        if now.busy_us < start.busy_us || now.acked < start.acked {
            self.window = Some(now);
            return;
        }
        let busy = now.busy_us - start.busy_us;
        if u128::from(busy) >= RATE_WINDOW.as_micros() {
            let acked = u128::from(now.acked - start.acked);
            let rate = (acked * 1_000_000 / u128::from(busy)).min(u128::from(u64::MAX)) as u64;
            self.rates = [rate, self.rates[0]];
            self.whole = (self.whole + 1).min(2);
            self.window = Some(now);
        }
    }

    /// The bytes the lane has yet to deliver.
    fn unsent(&self) -> u64 {
        self.unacked + self.pending as u64
    }
}

/// A lane whose delivery rate is below the fastest lane's over this factor
/// is clearly slow; rates closer than that are taken as even (the noise of
/// measured rates, htb classes borrowing: weighing them cost 4 MiB frames
/// 5-10% over even lanes, decision 0037).
const UNEVEN_RATES: f64 = 2.0;

/// The lane the next piece goes to, or `None` to wait: the lane with the
/// fewest bytes yet to deliver (those the peer has not acknowledged, and
/// those the kernel has yet to take), where a clearly slow lane's bytes
/// count as what the fastest lane would take as long to deliver (scaled
/// by fastest rate over its own). If that lane is busy, the piece waits
/// for it. Ties go to the lowest idle lane.
///
/// The rates are bytes acknowledged over the kernel's busy time of each
/// lane ([`LaneLoad::observe_progress`]): time a lane sat idle does not
/// count, so a lane fed less does not look slower for it (bytes over wall
/// time, tried first, measured what a lane was fed: decision 0034); lanes
/// without one yet count their bytes. A lane that has delivered everything
/// costs nothing whatever its rate, so it is fed, and its rate stays
/// current. Without the scaling a slow lane took as many pieces as its
/// queue let it, and each frame waited at its end for the slow lane's last
/// one (one lane of four at a quarter rate: 0.65 of the summed rates; with
/// it about 0.9, decision 0037).
pub(crate) fn pick_lane(lanes: &[LaneLoad]) -> Option<usize> {
    let fastest = fastest_rate(lanes);
    // Bytes yet to deliver, a clearly slow lane's scaled to the fastest
    // lane's rate: what the fastest would take as long to deliver.
    let cost = |lane: &LaneLoad| -> u128 {
        let unsent = u128::from(lane.unsent());
        match lane.is_clearly_slow(fastest) {
            true => unsent * u128::from(fastest) / u128::from(lane.rate()),
            false => unsent,
        }
    };
    let mut best: Option<(u128, bool, usize)> = None;
    for (i, lane) in lanes.iter().enumerate() {
        let (cost, idle) = (cost(lane), !lane.is_busy());
        let better = match best {
            None => true,
            Some((b, was_idle, _)) => cost < b || (cost == b && idle && !was_idle),
        };
        if better {
            best = Some((cost, idle, i));
        }
    }
    match best {
        Some((_, true, i)) => Some(i),
        _ => None,
    }
}

/// A piece for a clearly slow lane is cut to no less than this, so it
/// still carries far more than its header.
pub(crate) const MIN_SLOW_PIECE: usize = 16 << 10;

/// Nor to less than the lane delivers in this time: a piece costs a few
/// microseconds of system calls on each end, so a cut pays only where the
/// lane takes far longer than that to deliver it (a slow network lane,
/// not a loopback lane whose measured rates merely differ).
pub(crate) const SLOW_PIECE_TIME: Duration = Duration::from_millis(1);

/// The length of the piece lane `i` takes next, where the frame's pieces
/// are `piece` bytes: a clearly slow lane takes its share by rate (`piece`
/// times its rate over the fastest lane's), so it holds the frame's end
/// about as long as a fast lane holds a whole piece; but no less than it
/// delivers in [`SLOW_PIECE_TIME`] nor than [`MIN_SLOW_PIECE`], in 4 KiB
/// steps, and never more than `piece`. Every other lane takes `piece`.
/// (One lane of four at a quarter rate, 4 MiB all-reduce: median 0.83 of
/// the summed rates against 0.67 with whole pieces, through borrowing htb
/// classes; 0.93 with rates from busy time through assured ones, decision
/// 0037.)
pub(crate) fn piece_for(lanes: &[LaneLoad], i: usize, piece: usize) -> usize {
    let fastest = fastest_rate(lanes);
    let lane = &lanes[i];
    if !lane.is_clearly_slow(fastest) {
        return piece;
    }
    let share = piece as u128 * u128::from(lane.rate()) / u128::from(fastest);
    let in_time = u128::from(lane.rate()) * SLOW_PIECE_TIME.as_micros() / 1_000_000;
    let cut = share.max(in_time).min(piece as u128) as usize;
    cut.next_multiple_of(4 << 10)
        .clamp(MIN_SLOW_PIECE.min(piece), piece)
}

fn fastest_rate(lanes: &[LaneLoad]) -> u64 {
    lanes.iter().map(|l| l.rate()).max().unwrap_or(0)
}

impl LaneLoad {
    /// Whether the lane's rate is below `fastest` over
    /// [`UNEVEN_RATES`].
    fn is_clearly_slow(&self, fastest: u64) -> bool {
        self.rate() > 0 && (fastest as f64) > (self.rate() as f64) * UNEVEN_RATES
    }
}

/// Where a piece a receive lane announced fits.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum PieceFit {
    /// In the frame being received now: read its bytes.
    Now,
    /// In a later laned frame, whose header has not been read yet: the
    /// lane waits for it. (A lane may carry no piece of some frames, so
    /// its next piece may be of any later one.)
    Later,
}

/// Checks a piece header against what the receiver expects: `current` is
/// the laned frame being received (its count, payload length and the bytes
/// of it claimed by pieces so far), or `None` between laned frames, when
/// `next` is the count the next one will have. A piece of a frame already
/// received, or out of its frame's bounds, is a broken stream.
pub(crate) fn fit_piece(
    piece: &PieceHeader,
    current: Option<(u32, usize, usize)>,
    next: u32,
) -> Result<PieceFit, String> {
    let base = current.map_or(next, |(frame, ..)| frame);
    let ahead = piece.frame.wrapping_sub(base);
    if ahead > i32::MAX as u32 {
        return Err(format!(
            "a lane sent a piece of laned frame #{}, which was received already (#{base} is {})",
            piece.frame,
            if current.is_some() {
                "being received"
            } else {
                "next"
            }
        ));
    }
    let Some((frame, len, claimed)) = current.filter(|_| ahead == 0) else {
        return Ok(PieceFit::Later);
    };
    let end = piece.offset.checked_add(u64::from(piece.len));
    let fits = piece.len > 0
        && end.is_some_and(|end| end <= len as u64)
        && claimed + piece.len as usize <= len;
    match fits {
        true => Ok(PieceFit::Now),
        false => Err(format!(
            "a lane sent a piece of {} bytes at offset {} of laned frame #{frame}, whose \
             payload is {len} bytes ({claimed} of them in other pieces)",
            piece.len, piece.offset
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_piece_header_round_trips() {
        let h = PieceHeader {
            frame: u32::MAX,
            len: 0x1234_5678,
            offset: 0x0102_0304_0506_0708,
        };
        assert_eq!(PieceHeader::decode(&h.encode()), h);
        assert_eq!(h.encode()[8], 0x08, "little endian");
    }

    #[test]
    fn one_lane_takes_a_payload_whole_and_more_cut_it_into_bounded_pieces() {
        assert_eq!(piece_len(3 << 20, 1), 3 << 20);
        // 1 MiB over 4 lanes: 16 pieces of 64 KiB.
        assert_eq!(piece_len(1 << 20, 4), 64 << 10);
        // 4 MiB over 2 lanes: 8 pieces of 512 KiB; larger ones stop at MAX_PIECE.
        assert_eq!(piece_len(4 << 20, 2), 512 << 10);
        assert_eq!(piece_len(64 << 20, 2), MAX_PIECE);
        // Small payloads still get pieces of at least MIN_PIECE.
        assert_eq!(piece_len(100 << 10, 8), MIN_PIECE);
        for (len, lanes) in [(1usize << 20, 3usize), (5 << 20, 7), (300 << 10, 2)] {
            let p = piece_len(len, lanes);
            assert!(
                (MIN_PIECE..=MAX_PIECE).contains(&p),
                "{len} over {lanes}: {p}"
            );
            assert_eq!(p % (4 << 10), 0);
        }
    }

    #[test]
    fn with_nothing_held_idle_lanes_fill_in_order_then_pieces_wait() {
        let mut lanes = [LaneLoad::default(); 3];
        for want in 0..3 {
            let i = pick_lane(&lanes).expect("an idle lane");
            assert_eq!(i, want);
            lanes[i].start(1000);
        }
        assert_eq!(pick_lane(&lanes), None, "all busy: wait");
        lanes[1].took(1000);
        lanes[1].finish();
        assert_eq!(pick_lane(&lanes), Some(1));
    }

    #[test]
    fn the_lane_with_the_fewest_bytes_to_deliver_gets_the_piece() {
        let mut lanes = [LaneLoad::default(); 3];
        // A slow lane holds 500 KB unacknowledged, a fast one 20 KB, and
        // a busy one has 5 KB of its piece left for the kernel to take.
        lanes[0].observe(500_000);
        lanes[1].observe(20_000);
        lanes[2].start(5000);
        assert_eq!(pick_lane(&lanes), None, "the busy lane is best: wait");
        // Its piece taken, it holds 30 KB: the idle fast lane is best.
        lanes[2].took(5000);
        lanes[2].observe(30_000);
        assert_eq!(pick_lane(&lanes), Some(1));
        // Once the fast lane holds more than the slow one, the slow one,
        // idle, gets a piece.
        lanes[1].observe(600_000);
        assert_eq!(pick_lane(&lanes), None, "the busy lane again");
        lanes[2].finish();
        lanes[2].observe(700_000);
        assert_eq!(pick_lane(&lanes), Some(0));
    }

    /// Two whole windows of a lane delivering `rate` bytes/s: what a lane
    /// that has sent steadily a while shows.
    fn settle(lane: &mut LaneLoad, rate: u64) {
        let window = RATE_WINDOW.as_micros() as u64;
        let mut at = lane.window.unwrap_or_default();
        lane.observe_progress(at);
        for _ in 0..2 {
            at.busy_us += window;
            at.acked += rate * window / 1_000_000;
            lane.observe_progress(at);
        }
    }

    #[test]
    fn with_uneven_rates_the_lane_that_would_deliver_first_gets_the_piece() {
        const MB: u64 = 1_000_000;
        // Lane 1 delivers at a quarter of the others' rate and holds the
        // fewest bytes: by bytes it would take the piece, by time it
        // would deliver last.
        let mut lanes = [LaneLoad::default(); 3];
        for (lane, (held, rate)) in
            lanes
                .iter_mut()
                .zip([(400_000, 12 * MB), (100_000, 3 * MB), (300_000, 12 * MB)])
        {
            lane.observe(held);
            settle(lane, rate);
        }
        // 300 000 B at 12 MB/s are delivered before 100 000 at 3 MB/s.
        assert_eq!(pick_lane(&lanes), Some(2));
        // Idle time is not busy time: the slow lane stays slow however
        // little it was fed.
        let idle = lanes[1].window.unwrap();
        lanes[1].observe_progress(idle);
        assert_eq!(pick_lane(&lanes), Some(2));
        // Drained far enough, the slow lane is the first to be done; and
        // one that holds nothing is fed whatever its rate.
        lanes[1].observe(20_000);
        assert_eq!(pick_lane(&lanes), Some(1));
        lanes[1].observe(0);
        settle(&mut lanes[1], 1000);
        assert_eq!(pick_lane(&lanes), Some(1));
        // Busy, it is waited for.
        lanes[1].start(65_536 + PIECE_HEADER);
        lanes[1].took(65_536 + PIECE_HEADER);
        assert_eq!(pick_lane(&lanes), None);
    }

    #[test]
    fn a_clearly_slow_lane_takes_a_piece_cut_to_its_share_by_rate() {
        const MB: u64 = 1_000_000;
        let mut lanes = [LaneLoad::default(); 3];
        for (lane, rate) in lanes.iter_mut().zip([12 * MB, 3 * MB, 10 * MB]) {
            settle(lane, rate);
        }
        // A quarter of the fastest rate: a quarter of the piece.
        assert_eq!(piece_for(&lanes, 1, 128 << 10), 32 << 10);
        // Even lanes take the whole piece (10 of 12 MB/s is not slow).
        assert_eq!(piece_for(&lanes, 0, 128 << 10), 128 << 10);
        assert_eq!(piece_for(&lanes, 2, 128 << 10), 128 << 10);
        // In 4 KiB steps, never below MIN_SLOW_PIECE, nor above the piece.
        settle(&mut lanes[1], MB);
        assert_eq!(piece_for(&lanes, 1, 128 << 10), MIN_SLOW_PIECE);
        assert_eq!(piece_for(&lanes, 1, 8 << 10), 8 << 10);
        settle(&mut lanes[1], 5 * MB);
        assert_eq!(piece_for(&lanes, 1, 100 << 10), 44 << 10, "41.7 KiB up");
        // A slow lane that still delivers a whole piece within
        // SLOW_PIECE_TIME (fast loopback lanes whose rates differ) takes
        // it whole: the cut would cost more system calls than it saves.
        let mut fast = [LaneLoad::default(); 2];
        settle(&mut fast[0], 4000 * MB);
        settle(&mut fast[1], 1000 * MB);
        assert_eq!(piece_for(&fast, 1, 512 << 10), 512 << 10);
        settle(&mut fast[0], 8000 * MB);
        assert_eq!(
            piece_for(&fast, 1, 4 << 20),
            1_003_520,
            "an eighth is 512 KiB: 1 ms at 1 GB/s instead, up to 4 KiB"
        );
        // Without rates every lane takes the piece.
        let fresh = [LaneLoad::default(); 2];
        assert_eq!(piece_for(&fresh, 1, 128 << 10), 128 << 10);
    }

    #[test]
    fn a_lanes_rate_is_its_bytes_over_busy_time_and_one_low_window_does_not_slow_it() {
        const MB: u64 = 1_000_000;
        let window = RATE_WINDOW.as_micros() as u64;
        // Advances the counters by `busy_us` of busy time and `acked`
        // bytes, and shows them to the lane.
        fn step(lane: &mut LaneLoad, at: &mut Progress, busy_us: u64, acked: u64) {
            at.busy_us += busy_us;
            at.acked += acked;
            lane.observe_progress(*at);
        }
        let mut lane = LaneLoad::default();
        let mut at = Progress {
            busy_us: 1_000,
            acked: 5_000,
        };
        lane.observe_progress(at);
        // Less than a window of busy time: no rate.
        step(&mut lane, &mut at, window - 1, MB / 2);
        assert_eq!(lane.rate(), 0);
        // One whole window (10 MB/s) is no rate alone: a first window may
        // read low (slow start).
        step(&mut lane, &mut at, 1, 0);
        assert_eq!(lane.rate(), 0);
        // With the second, the higher of the two: bytes over busy time.
        step(&mut lane, &mut at, window, MB / 2);
        assert_eq!(lane.rate(), 10 * MB);
        // Time idle is not busy time: a lane fed a little keeps its rate.
        step(&mut lane, &mut at, 0, 0);
        assert_eq!(lane.rate(), 10 * MB);
        // One window that read low (2 MB/s: a delayed acknowledgement) is
        // not taken alone: the higher of the last two counts.
        step(&mut lane, &mut at, window, MB / 10);
        assert_eq!(lane.rate(), 10 * MB);
        // Two are (2.5 MB/s): the lane has slowed.
        step(&mut lane, &mut at, window, MB / 8);
        assert_eq!(lane.rate(), 5 * MB / 2);
        // A lane that recovered (20 MB/s) shows it after one window.
        step(&mut lane, &mut at, window, MB);
        assert_eq!(lane.rate(), 20 * MB);
        // Counters that restart (below the window's start) begin a new
        // window and keep the rates; the old one counts a window more.
        let mut at = Progress::default();
        lane.observe_progress(at);
        step(&mut lane, &mut at, window / 2, MB / 8);
        assert_eq!(lane.rate(), 20 * MB);
        step(&mut lane, &mut at, window / 2, MB / 8);
        assert_eq!(lane.rate(), 20 * MB, "5 MB/s, under the last 20");
        step(&mut lane, &mut at, window, MB / 4);
        assert_eq!(lane.rate(), 5 * MB);
    }

    #[test]
    fn even_or_unknown_rates_leave_the_fewest_bytes_rule() {
        const MB: u64 = 1_000_000;
        let mut lanes = [LaneLoad::default(); 2];
        lanes[0].observe(200_000);
        lanes[1].observe(100_000);
        // Lane 1 is 20% slower: within the noise of measured rates.
        settle(&mut lanes[0], 10 * MB);
        settle(&mut lanes[1], 8 * MB);
        assert_eq!(pick_lane(&lanes), Some(1));
        // One lane without a rate yet: bytes decide.
        let mut fresh = [LaneLoad::default(); 2];
        settle(&mut fresh[0], 10 * MB);
        fresh[0].observe(50_000);
        fresh[1].observe(60_000);
        assert_eq!(pick_lane(&fresh), Some(0));
        fresh[0].observe(70_000);
        assert_eq!(pick_lane(&fresh), Some(1));
    }

    #[test]
    fn pieces_are_checked_before_a_byte_is_placed() {
        let piece = |frame, offset, len| PieceHeader { frame, len, offset };
        // Between laned frames: pieces of the next one or later wait;
        // those of a frame received already are refused.
        assert_eq!(fit_piece(&piece(7, 0, 10), None, 7), Ok(PieceFit::Later));
        assert_eq!(fit_piece(&piece(9, 0, 10), None, 7), Ok(PieceFit::Later));
        assert!(fit_piece(&piece(6, 0, 10), None, 7).is_err());
        // During frame 7 (100 bytes, 40 claimed): its pieces within
        // bounds, or later frames', which wait.
        let now = Some((7, 100, 40));
        assert_eq!(fit_piece(&piece(7, 40, 60), now, 8), Ok(PieceFit::Now));
        assert_eq!(fit_piece(&piece(8, 0, 10), now, 8), Ok(PieceFit::Later));
        assert_eq!(fit_piece(&piece(12, 0, 10), now, 8), Ok(PieceFit::Later));
        assert!(fit_piece(&piece(6, 0, 10), now, 8).is_err(), "behind");
        assert!(
            fit_piece(&piece(7, 41, 60), now, 8).is_err(),
            "past the end"
        );
        assert!(
            fit_piece(&piece(7, 0, 61), now, 8).is_err(),
            "more than is left"
        );
        assert!(fit_piece(&piece(7, 0, 0), now, 8).is_err(), "empty");
        assert!(
            fit_piece(&piece(7, u64::MAX, 2), now, 8).is_err(),
            "overflow"
        );
        // The count wraps.
        let last = Some((u32::MAX, 100, 0));
        assert_eq!(fit_piece(&piece(0, 0, 1), last, 0), Ok(PieceFit::Later));
        assert!(fit_piece(&piece(u32::MAX - 1, 0, 1), last, 0).is_err());
    }
}
