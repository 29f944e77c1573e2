//! Entry points for the fuzz targets in `fuzz/` (not part of the API): the
//! lanes' rules with no I/O, driven by arbitrary bytes, each checking the
//! invariants the driver relies on. A panic here is a bug the fuzzer found.

use super::head_slots::{HEAD_SLOTS, HeadSlots};
use super::lanes::{self, PIECE_HEADER, PieceFit, PieceHeader};

/// A receiver's view of piece headers from a peer: `data` is a laned
/// frame's payload length (4 bytes), the count of the next laned frame (4
/// bytes), then piece headers. Every header re-encodes to its bytes; a
/// piece `fit_piece` lets land in the frame being received lies inside it
/// and, with those before it, claims no more than its length; once the
/// frame is whole no piece lands in it; a piece of a frame already
/// received is refused. Then `piece_len` over every lane count: within
/// bounds, and pieces that cover the payload; and `piece_for` under any
/// rates (from the bytes after the last whole piece header): only a
/// clearly slow lane's piece is cut, in 4 KiB steps, to no less than its
/// floor.
pub fn pieces(data: &[u8]) {
    let Some((head, rest)) = data.split_first_chunk::<8>() else {
        return;
    };
    let len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes")) as usize;
    let first = u32::from_le_bytes(head[4..].try_into().expect("4 bytes"));
    let mut current = Some((first, len, 0usize));
    let mut next = first;
    for bytes in rest.chunks_exact(PIECE_HEADER) {
        let bytes: &[u8; PIECE_HEADER] = bytes.try_into().expect("chunks of PIECE_HEADER");
        let piece = PieceHeader::decode(bytes);
        assert_eq!(&piece.encode(), bytes, "a piece header re-encodes");
        match lanes::fit_piece(&piece, current, next) {
            Ok(PieceFit::Now) => {
                let (frame, len, claimed) = current.expect("Now only with a frame being received");
                assert_eq!(piece.frame, frame);
                assert!(piece.len > 0);
                assert!(piece.offset + u64::from(piece.len) <= len as u64);
                let claimed = claimed + piece.len as usize;
                assert!(claimed <= len, "pieces claim {claimed} of {len} bytes");
                current = match claimed == len {
                    true => {
                        next = frame.wrapping_add(1);
                        None
                    }
                    false => Some((frame, len, claimed)),
                };
            }
            Ok(PieceFit::Later) => {
                let base = current.map_or(next, |(frame, ..)| frame);
                assert_ne!(
                    piece.frame,
                    base.wrapping_sub(1),
                    "a received frame is not later"
                );
            }
            Err(reason) => assert!(!reason.is_empty()),
        }
    }
    for lanes in 1..=8 {
        let piece = lanes::piece_len(len, lanes);
        assert!(piece >= 1);
        if lanes > 1 {
            assert!((lanes::MIN_PIECE..=lanes::MAX_PIECE).contains(&piece));
        }
        assert!(len.div_ceil(piece) * piece >= len);
        // Whatever the lanes' rates (here from the bytes after the last
        // whole piece header), a lane under half the fastest's rate takes
        // a piece cut in 4 KiB steps (or the whole), no shorter than
        // MIN_SLOW_PIECE (or the piece); every other lane the piece.
        let tail = rest.chunks_exact(PIECE_HEADER).remainder();
        let rates: Vec<u64> = (0..lanes)
            .map(|i| match tail.len() {
                0 => 0,
                n => u64::from(tail[i % n]) << (tail[(i + 1) % n] % 40),
            })
            .collect();
        // Each lane delivered its rate over two seconds of busy time, a
        // window of it each.
        let mut loads = vec![lanes::LaneLoad::default(); lanes];
        for (load, &rate) in loads.iter_mut().zip(&rates) {
            for second in 0..3 {
                load.observe_progress(lanes::Progress {
                    busy_us: second * 1_000_000,
                    acked: second * rate,
                });
            }
        }
        let fastest = rates.iter().copied().max().unwrap_or(0);
        for (i, &rate) in rates.iter().enumerate() {
            let cut = lanes::piece_for(&loads, i, piece);
            let slow = rate > 0 && fastest as f64 > rate as f64 * 2.0;
            if !slow {
                assert_eq!(cut, piece, "lane {i} at {rate} B/s (fastest {fastest})");
                continue;
            }
            assert!(cut <= piece, "lane {i}: {cut} of a {piece}-byte piece");
            assert!(cut >= lanes::MIN_SLOW_PIECE.min(piece), "lane {i}: {cut}");
            assert!(
                cut == piece || cut.is_multiple_of(4 << 10),
                "lane {i}: {cut}"
            );
        }
    }
}

/// A send lane's header slots under any order of events (each byte one:
/// its low two bits the event, the rest the slot or frame). A slot is
/// never handed out while its piece is being sent or owed a notification,
/// and `holds` agrees with a plain model of what is owed.
pub fn head_slots(data: &[u8]) {
    #[derive(Clone, Copy, Default)]
    struct Model {
        frame: u32,
        sending: bool,
        owed: u32,
        /// Notifications that came before their expectation.
        early: u32,
    }
    let mut slots = HeadSlots::default();
    let mut model = [Model::default(); HEAD_SLOTS];
    for &byte in data {
        let (event, arg) = (byte & 3, usize::from(byte >> 2));
        let i = arg % HEAD_SLOTS;
        match event {
            0 => {
                let frame = arg as u32;
                match slots.take(frame) {
                    Some(i) => {
                        let m = &mut model[i];
                        assert!(!m.sending && m.owed == 0, "slot {i} handed out in use");
                        *m = Model {
                            frame,
                            sending: true,
                            ..Model::default()
                        };
                    }
                    None => assert!(model.iter().all(|m| m.sending || m.owed > 0)),
                }
            }
            // The driver expects notifications only of a slot in use.
            1 if model[i].sending || model[i].owed > 0 => {
                let m = &mut model[i];
                let owed_now = m.early == 0;
                match owed_now {
                    true => m.owed += 1,
                    false => m.early -= 1,
                }
                assert_eq!(slots.expect_notification(i), owed_now);
            }
            // One before its expectation (reordered) is kept for it.
            2 => {
                assert_eq!(slots.notified(i), model[i].frame);
                let m = &mut model[i];
                match m.owed {
                    0 => m.early += 1,
                    _ => m.owed -= 1,
                }
            }
            3 => {
                slots.piece_sent(i);
                model[i].sending = false;
            }
            _ => {}
        }
        for frame in model.iter().map(|m| m.frame) {
            let owed = model.iter().any(|m| m.frame == frame && m.owed > 0);
            assert_eq!(slots.holds(frame), owed);
        }
        assert_eq!(slots.owed(), model.iter().any(|m| m.owed > 0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fuzz_entries_hold_on_hand_made_inputs() {
        // A frame of 100 bytes in two pieces, then a piece of it again.
        let mut data = [100u32.to_le_bytes(), 7u32.to_le_bytes()].concat();
        for (frame, len, offset) in [(7, 60, 0), (8, 10, 0), (7, 40, 60), (7, 1, 0)] {
            data.extend(PieceHeader { frame, len, offset }.encode());
        }
        pieces(&data);
        pieces(&[0xff; 40]);
        pieces(&[]);
        head_slots(&[
            0, 1, 3, 0, 2, 0, 5, 7, 4, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 3, 0,
        ]);
        head_slots(&(0..=255).collect::<Vec<u8>>());
    }

    #[test]
    fn the_lanes_seed_corpus_holds() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fuzz/corpus/lanes");
        let files: Vec<_> = std::fs::read_dir(dir).unwrap().collect();
        assert!(!files.is_empty(), "{dir} is empty");
        for file in files {
            let data = std::fs::read(file.unwrap().path()).unwrap();
            pieces(&data);
            head_slots(&data);
        }
    }
}
