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

use std::time::{Duration, Instant};

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
    /// The kernel's last delivery rate of the lane (bytes/s) from a sample
    /// that was not limited by what the lane was fed; 0: none yet.
    rate: u64,
    /// When that sample was taken.
    rate_at: Option<Instant>,
    /// The last sample the kernel gave, kept or not: the kernel repeats
    /// its last one while the lane sends nothing, and a repeat is no news.
    sample: (u64, bool),
}

/// How long a delivery rate is kept without a fresh sample. A lane found
/// slow is fed less, so its later samples may all be app-limited: were the
/// rate kept for ever, a lane that had recovered would stay starved.
/// Forgotten, the lane counts its bytes like the rest until a full sample
/// says how fast it is.
pub(crate) const RATE_KEPT: Duration = Duration::from_secs(1);

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

    /// The delivery rate kept (bytes/s; 0: none yet).
    pub(crate) fn rate(&self) -> u64 {
        self.rate
    }

    /// The kernel's delivery rate sample, read at `now`: kept if it is
    /// new and was not app-limited; the rate kept is forgotten once older
    /// than [`RATE_KEPT`].
    pub(crate) fn observe_rate(&mut self, rate: u64, app_limited: bool, now: Instant) {
        let new = (rate, app_limited) != self.sample;
        self.sample = (rate, app_limited);
        if new && rate > 0 && !app_limited {
            (self.rate, self.rate_at) = (rate, Some(now));
        } else if self
            .rate_at
            .is_some_and(|at| now.saturating_duration_since(at) > RATE_KEPT)
        {
            (self.rate, self.rate_at) = (0, None);
        }
    }

    /// The bytes the lane has yet to deliver.
    fn unsent(&self) -> u64 {
        self.unacked + self.pending as u64
    }
}

/// A lane whose delivery rate is below the fastest lane's over this factor
/// is clearly slow; rates closer than that are taken as even (the noise of
/// rate samples, htb classes borrowing: weighing them cost 4 MiB frames
/// 5-10% over even lanes, decision 0037).
const UNEVEN_RATES: f64 = 2.0;

/// The lane the next piece goes to, or `None` to wait: the lane with the
/// fewest bytes yet to deliver (those the peer has not acknowledged, and
/// those the kernel has yet to take), where a clearly slow lane's bytes
/// count as what the fastest lane would take as long to deliver (scaled
/// by fastest rate over its own). If that lane is busy, the piece waits
/// for it. Ties go to the lowest idle lane.
///
/// The rates are the kernel's own estimates (`tcpi_delivery_rate`), kept
/// only from samples it did not mark app-limited, so a lane fed less does
/// not look slower for it; lanes without one yet count their bytes. A lane
/// that has delivered everything costs nothing whatever its rate, so it is
/// fed, and its rate stays current. Without the scaling a slow lane took
/// as many pieces as its queue let it, and each frame waited at its end
/// for the slow lane's last one (one lane of four at a quarter rate: 0.65
/// of the summed rates; with it 0.89-0.91, decision 0037). Rates the
/// engine learned itself, from acknowledged bytes over time, measured
/// worse still (decision 0034): they measure what a lane was fed.
pub(crate) fn pick_lane(lanes: &[LaneLoad]) -> Option<usize> {
    let fastest = fastest_rate(lanes);
    // Bytes yet to deliver, a clearly slow lane's scaled to the fastest
    // lane's rate: what the fastest would take as long to deliver.
    let cost = |lane: &LaneLoad| -> u128 {
        let unsent = u128::from(lane.unsent());
        match lane.is_clearly_slow(fastest) {
            true => unsent * u128::from(fastest) / u128::from(lane.rate),
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
/// not a loopback lane whose rate samples merely differ).
pub(crate) const SLOW_PIECE_TIME: Duration = Duration::from_millis(1);

/// The length of the piece lane `i` takes next, where the frame's pieces
/// are `piece` bytes: a clearly slow lane takes its share by rate (`piece`
/// times its rate over the fastest lane's), so it holds the frame's end
/// about as long as a fast lane holds a whole piece; but no less than it
/// delivers in [`SLOW_PIECE_TIME`] nor than [`MIN_SLOW_PIECE`], in 4 KiB
/// steps, and never more than `piece`. Every other lane takes `piece`.
/// (One lane of four at a quarter rate, 4 MiB all-reduce: median 0.83 of
/// the summed rates against 0.67 with whole pieces, decision 0037.)
pub(crate) fn piece_for(lanes: &[LaneLoad], i: usize, piece: usize) -> usize {
    let fastest = fastest_rate(lanes);
    let lane = &lanes[i];
    if !lane.is_clearly_slow(fastest) {
        return piece;
    }
    let share = piece as u128 * u128::from(lane.rate) / u128::from(fastest);
    let in_time = u128::from(lane.rate) * SLOW_PIECE_TIME.as_micros() / 1_000_000;
    let cut = share.max(in_time).min(piece as u128) as usize;
    cut.next_multiple_of(4 << 10)
        .clamp(MIN_SLOW_PIECE.min(piece), piece)
}

fn fastest_rate(lanes: &[LaneLoad]) -> u64 {
    lanes.iter().map(|l| l.rate).max().unwrap_or(0)
}

impl LaneLoad {
    /// Whether the lane's kept rate is below `fastest` over
    /// [`UNEVEN_RATES`].
    fn is_clearly_slow(&self, fastest: u64) -> bool {
        self.rate > 0 && (fastest as f64) > (self.rate as f64) * UNEVEN_RATES
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

    #[test]
    fn with_uneven_rates_the_lane_that_would_deliver_first_gets_the_piece() {
        const MB: u64 = 1_000_000;
        let now = Instant::now();
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
            lane.observe_rate(rate, false, now);
        }
        // 300 000 B at 12 MB/s are delivered before 100 000 at 3 MB/s.
        assert_eq!(pick_lane(&lanes), Some(2));
        // A sample the kernel marked app-limited is not kept: the slow
        // lane stays slow however little it was fed.
        lanes[1].observe_rate(12 * MB, true, now);
        assert_eq!(pick_lane(&lanes), Some(2));
        // Drained far enough, the slow lane is the first to be done; and
        // one that holds nothing is fed whatever its rate.
        lanes[1].observe(20_000);
        assert_eq!(pick_lane(&lanes), Some(1));
        lanes[1].observe(0);
        lanes[1].observe_rate(1000, false, now);
        assert_eq!(pick_lane(&lanes), Some(1));
        // Busy, it is waited for.
        lanes[1].start(65_536 + PIECE_HEADER);
        lanes[1].took(65_536 + PIECE_HEADER);
        assert_eq!(pick_lane(&lanes), None);
    }

    #[test]
    fn a_clearly_slow_lane_takes_a_piece_cut_to_its_share_by_rate() {
        const MB: u64 = 1_000_000;
        let now = Instant::now();
        let mut lanes = [LaneLoad::default(); 3];
        for (lane, rate) in lanes.iter_mut().zip([12 * MB, 3 * MB, 10 * MB]) {
            lane.observe_rate(rate, false, now);
        }
        // A quarter of the fastest rate: a quarter of the piece.
        assert_eq!(piece_for(&lanes, 1, 128 << 10), 32 << 10);
        // Even lanes take the whole piece (10 of 12 MB/s is not slow).
        assert_eq!(piece_for(&lanes, 0, 128 << 10), 128 << 10);
        assert_eq!(piece_for(&lanes, 2, 128 << 10), 128 << 10);
        // In 4 KiB steps, never below MIN_SLOW_PIECE, nor above the piece.
        lanes[1].observe_rate(MB, false, now);
        assert_eq!(piece_for(&lanes, 1, 128 << 10), MIN_SLOW_PIECE);
        assert_eq!(piece_for(&lanes, 1, 8 << 10), 8 << 10);
        lanes[1].observe_rate(5 * MB, false, now);
        assert_eq!(piece_for(&lanes, 1, 100 << 10), 44 << 10, "41.7 KiB up");
        // A slow lane that still delivers a whole piece within
        // SLOW_PIECE_TIME (fast loopback lanes whose samples differ) takes
        // it whole: the cut would cost more system calls than it saves.
        let mut fast = [LaneLoad::default(); 2];
        fast[0].observe_rate(4000 * MB, false, now);
        fast[1].observe_rate(1000 * MB, false, now);
        assert_eq!(piece_for(&fast, 1, 512 << 10), 512 << 10);
        fast[0].observe_rate(8000 * MB, false, now);
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
    fn a_rate_not_sampled_afresh_is_forgotten_and_bytes_decide_again() {
        const MB: u64 = 1_000_000;
        let t0 = Instant::now();
        let mut lanes = [LaneLoad::default(); 2];
        lanes[0].observe(300_000);
        lanes[1].observe(100_000);
        lanes[0].observe_rate(12 * MB, false, t0);
        lanes[1].observe_rate(3 * MB, false, t0);
        assert_eq!(pick_lane(&lanes), Some(0), "lane 1 is slow");
        // Fed less, lane 1's samples are app-limited: its rate is kept a
        // while, then forgotten, and it is fed by its bytes again.
        let soon = t0 + RATE_KEPT / 2;
        lanes[1].observe_rate(12 * MB, true, soon);
        assert_eq!((lanes[1].rate(), pick_lane(&lanes)), (3 * MB, Some(0)));
        let later = t0 + RATE_KEPT + Duration::from_millis(1);
        lanes[1].observe_rate(12 * MB, true, later);
        assert_eq!((lanes[1].rate(), pick_lane(&lanes)), (0, Some(1)));
        // A fresh full sample is kept again.
        lanes[1].observe_rate(11 * MB, false, later);
        assert_eq!(lanes[1].rate(), 11 * MB);
        // The kernel repeats a lane's last sample while it sends nothing:
        // a repeat is no fresh sample, and the rate goes all the same.
        let much_later = later + RATE_KEPT + Duration::from_millis(1);
        lanes[1].observe_rate(11 * MB, false, much_later);
        assert_eq!(lanes[1].rate(), 0, "a repeated sample kept the rate");
        lanes[1].observe_rate(11 * MB + 1, false, much_later);
        assert_eq!(lanes[1].rate(), 11 * MB + 1);
    }

    #[test]
    fn even_or_unknown_rates_leave_the_fewest_bytes_rule() {
        const MB: u64 = 1_000_000;
        let now = Instant::now();
        let mut lanes = [LaneLoad::default(); 2];
        lanes[0].observe(200_000);
        lanes[1].observe(100_000);
        // Lane 1 is 20% slower: within the noise of rate samples.
        lanes[0].observe_rate(10 * MB, false, now);
        lanes[1].observe_rate(8 * MB, false, now);
        assert_eq!(pick_lane(&lanes), Some(1));
        // One lane without a rate yet: bytes decide.
        let mut fresh = [LaneLoad::default(); 2];
        fresh[0].observe_rate(10 * MB, false, now);
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
