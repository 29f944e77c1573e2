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
//! sender may put any piece on any lane: each goes to the lane expected to
//! finish it first ([`pick_lane`]), not round-robin, so one slow lane does
//! not hold every frame to its pace.

use std::time::Instant;

/// Bytes of a [`PieceHeader`] on the wire.
pub(crate) const PIECE_HEADER: usize = 16;

/// Pieces no larger than this (a multiple of every page size), so a lane
/// whose rate the sender has yet to learn holds at most this much of a
/// frame.
pub(crate) const MAX_PIECE: usize = 1 << 20;

/// Nor smaller than this: each piece costs a header and a system call on
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

/// What the sender knows of one send lane: its piece in flight (bytes, when
/// posted) and the rate it has shown.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct LaneLoad {
    busy: Option<(usize, Instant)>,
    /// Bytes per second, from pieces it finished; 0 until one has.
    rate: f64,
}

impl LaneLoad {
    pub(crate) fn is_busy(&self) -> bool {
        self.busy.is_some()
    }

    /// A piece of `bytes` went on the lane at `now`.
    pub(crate) fn start(&mut self, bytes: usize, now: Instant) {
        self.busy = Some((bytes, now));
    }

    /// The lane's piece is out (the kernel took its last byte). Its time
    /// is a sample of the lane's rate: a lane's socket holds little unsent
    /// data (`TCP_NOTSENT_LOWAT`), so a send ends about when the lane has
    /// moved it. Samples are averaged, the newest weighing half.
    pub(crate) fn finish(&mut self, now: Instant) {
        let Some((bytes, since)) = self.busy.take() else {
            return;
        };
        let secs = now.saturating_duration_since(since).as_secs_f64().max(1e-6);
        let sample = bytes as f64 / secs;
        self.rate = match self.rate {
            0.0 => sample,
            rate => 0.5 * rate + 0.5 * sample,
        };
    }

    /// Seconds from `now` until this lane would have sent `piece` more
    /// bytes after what it holds, at `rate`.
    fn finish_after(&self, piece: usize, rate: f64, now: Instant) -> f64 {
        let held = self.busy.map_or(0.0, |(bytes, since)| {
            let done = now.saturating_duration_since(since).as_secs_f64() * rate;
            (bytes as f64 - done).max(0.0)
        });
        (held + piece as f64) / rate
    }
}

/// The lane the next piece of `piece` bytes goes to, or `None` to wait:
/// the lane expected to have sent it first, counting what each holds (its
/// unsent bytes, as far as the sender can tell) at the rate each has shown.
/// A lane yet to show a rate is taken to be as fast as the fastest (with
/// none known, all are alike, and this is "fewest unsent bytes"). If that
/// lane is busy, the piece waits for it rather than go to a slower lane
/// that would finish it later. Ties go to the lowest idle lane.
pub(crate) fn pick_lane(lanes: &[LaneLoad], piece: usize, now: Instant) -> Option<usize> {
    let fastest = lanes.iter().map(|l| l.rate).fold(0.0, f64::max);
    let fallback = if fastest > 0.0 { fastest } else { 1.0 };
    let mut best: Option<(f64, bool, usize)> = None;
    for (i, lane) in lanes.iter().enumerate() {
        let rate = if lane.rate > 0.0 { lane.rate } else { fallback };
        let when = lane.finish_after(piece, rate, now);
        let idle = !lane.is_busy();
        let better = match best {
            None => true,
            Some((t, was_idle, _)) => when < t || (when == t && idle && !was_idle),
        };
        if better {
            best = Some((when, idle, i));
        }
    }
    match best {
        Some((_, true, i)) => Some(i),
        _ => None,
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
    use std::time::Duration;

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
    fn with_no_rate_known_idle_lanes_fill_in_order_then_pieces_wait() {
        let now = Instant::now();
        let mut lanes = [LaneLoad::default(); 3];
        for want in 0..3 {
            let i = pick_lane(&lanes, 1000, now).expect("an idle lane");
            assert_eq!(i, want);
            lanes[i].start(1000, now);
        }
        assert_eq!(pick_lane(&lanes, 1000, now), None, "all busy: wait");
        lanes[1].finish(now + Duration::from_millis(1));
        assert_eq!(pick_lane(&lanes, 1000, now), Some(1));
    }

    #[test]
    fn a_slow_lane_is_passed_over_when_a_busy_fast_one_would_finish_first() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut lanes = [LaneLoad::default(); 2];
        // Lane 0 moves 1000 bytes in 1 ms, lane 1 in 10 ms.
        lanes[0].start(1000, t0);
        lanes[0].finish(t0 + ms(1));
        lanes[1].start(1000, t0);
        lanes[1].finish(t0 + ms(10));
        let now = t0 + ms(10);
        // Lane 0 busy with a piece it has half sent: it finishes a second
        // one in 1.5 ms; lane 1, idle, would take 10 ms. Wait for lane 0.
        lanes[0].start(1000, now - Duration::from_micros(500));
        assert_eq!(pick_lane(&lanes, 1000, now), None);
        // A lane yet to show a rate counts as the fastest: it gets tried.
        let fresh = [lanes[0], lanes[1], LaneLoad::default()];
        assert_eq!(pick_lane(&fresh, 1000, now), Some(2));
        // Idle, the fast lane takes it.
        lanes[0].finish(now);
        assert_eq!(pick_lane(&lanes, 1000, now), Some(0));
    }

    #[test]
    fn a_slow_lane_still_takes_a_piece_when_it_would_finish_it_first() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut lanes = [LaneLoad::default(); 2];
        lanes[0].start(1000, t0);
        lanes[0].finish(t0 + ms(1));
        lanes[1].start(1000, t0);
        lanes[1].finish(t0 + ms(3));
        // Lane 0 holds 5000 unsent bytes (5 ms); lane 1 sends 1000 in 3 ms.
        lanes[0].start(5000, t0 + ms(3));
        assert_eq!(pick_lane(&lanes, 1000, t0 + ms(3)), Some(1));
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
