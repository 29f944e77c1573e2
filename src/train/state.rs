//! Moving training state to a replacement (decision 0040): a healthy
//! member's parameters and optimizer state, broadcast in pieces through
//! one staging buffer, so a state of many gigabytes never needs a second
//! copy of itself in memory.

use super::TrainError;
use crate::{Communicator, Element, ReduceOp};

/// The most bytes one broadcast of [`broadcast_state`] carries.
pub const STATE_PIECE_BYTES: usize = 64 << 20;

/// Broadcasts rank `root`'s `parts` to every rank of `comm`, into each
/// rank's own `parts`: parameters, optimizer moments, anything held as
/// buffers of one element type, listed in the same order with the same
/// lengths on every rank. What a replacement needs once
/// [`Communicator::admit`] took it in (call it once per element type).
///
/// The parts travel in pieces of at most [`STATE_PIECE_BYTES`] through
/// one staging buffer of that size: memory grows by one piece, not by the
/// state. Collective over `comm`. Parts that differ across ranks (in
/// count or lengths) fail on every rank with [`TrainError::StateDiffers`]
/// before anything moves.
pub fn broadcast_state<T: Element>(
    comm: &Communicator,
    root: usize,
    parts: &mut [&mut [T]],
) -> Result<(), TrainError> {
    broadcast_state_in_pieces(comm, root, parts, STATE_PIECE_BYTES)
}

/// [`broadcast_state`] with pieces of at most `piece_bytes` (the tests
/// cut small states into many pieces).
pub(crate) fn broadcast_state_in_pieces<T: Element>(
    comm: &Communicator,
    root: usize,
    parts: &mut [&mut [T]],
    piece_bytes: usize,
) -> Result<(), TrainError> {
    let elements: usize = parts.iter().map(|p| p.len()).sum();
    // Every rank's (count, total, hash of the lengths) and their
    // negations, maxed: the maxima and minima at once.
    let mut lengths = 0xcbf2_9ce4_8422_2325u64;
    for p in parts.iter() {
        lengths = (lengths ^ p.len() as u64).wrapping_mul(0x0100_0000_01b3);
    }
    let lengths = (lengths >> 1) as i64;
    let mine = [parts.len() as i64, elements as i64, lengths];
    let both: Vec<i64> = mine
        .iter()
        .chain(mine.iter().map(|v| -v).collect::<Vec<_>>().iter())
        .copied()
        .collect();
    let seen = comm
        .all_reduce(both, ReduceOp::Max)
        .wait()
        .map_err(|e| TrainError::from(e).context("comparing the state's parts".into()))?;
    let same = (0..3).all(|i| seen[i] == -seen[i + 3]);
    if !same {
        return Err(TrainError::StateDiffers {
            parts: parts.len(),
            elements,
        });
    }
    let per_piece = (piece_bytes / size_of::<T>()).max(1);
    let mut staging: Vec<T> = Vec::with_capacity(per_piece.min(elements));
    // (part, offset) where the next piece starts.
    let mut at = (0usize, 0usize);
    let is_root = comm.rank() == root;
    let mut left = elements;
    while left > 0 {
        let n = per_piece.min(left);
        if is_root {
            staging.clear();
            let mut cursor = at;
            while staging.len() < n {
                let part = &parts[cursor.0];
                let take = (part.len() - cursor.1).min(n - staging.len());
                staging.extend_from_slice(&part[cursor.1..cursor.1 + take]);
                cursor = advance(parts, cursor, take);
            }
        } else {
            // Overwritten by the broadcast: filled only where it grows
            // (the first piece), not once per piece.
            staging.truncate(n);
            staging.resize(n, T::default());
        }
        staging = comm
            .broadcast(staging, root)
            .wait()
            .map_err(|e| TrainError::from(e).context("broadcasting the state".into()))?;
        let mut taken = 0;
        while taken < n {
            let part = &mut parts[at.0];
            let put = (part.len() - at.1).min(n - taken);
            if !is_root {
                part[at.1..at.1 + put].copy_from_slice(&staging[taken..taken + put]);
            }
            taken += put;
            at = advance(parts, at, put);
        }
        left -= n;
    }
    Ok(())
}

/// The place `by` elements after `(part, offset)`, skipping to the next
/// non-empty part at a part's end.
fn advance<T>(parts: &[&mut [T]], (mut part, offset): (usize, usize), by: usize) -> (usize, usize) {
    let mut offset = offset + by;
    while part < parts.len() && offset >= parts[part].len() {
        offset -= parts[part].len();
        part += 1;
    }
    (part, offset)
}
