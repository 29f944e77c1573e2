//! The cross-rank check that every rank registered the same parameters in
//! the same order (PyTorch checks shapes across processes at construction;
//! Rust frameworks that order parameters by random ids or hash maps make it
//! essential). One small all-gather when the layouts agree; when they do
//! not, every rank finds the same first differing parameter and names it
//! as each side has it.

use super::TrainError;
use super::layout::Layout;
use crate::{Communicator, DType};

/// Words per parameter in a fingerprint (see `Layout::fingerprints`).
const WORDS: usize = 4;

/// Checks `layout` is the same on every rank of `comm`. Collective.
pub(crate) fn same_layout(comm: &Communicator, layout: &Layout) -> Result<(), TrainError> {
    let size = comm.world_size();
    // i64 words on the wire (ringwire reduces no u64).
    let mine: Vec<i64> = layout.fingerprints().iter().map(|&w| w as i64).collect();
    let summary = [
        layout.len() as i64,
        super::layout::fnv1a(as_bytes(&mine)) as i64,
    ];
    let (_, all) = comm
        .all_gather(summary.to_vec(), vec![0i64; 2 * size])
        .wait()?;
    if all.chunks(2).all(|s| s == summary) {
        return Ok(());
    }
    // They differ: every rank's fingerprints, then the names at the first
    // index where any two ranks differ.
    let counts: Vec<usize> = all.chunks(2).map(|s| s[0] as usize * WORDS).collect();
    let (_, prints) = comm
        .all_gather_v(mine, vec![0i64; counts.iter().sum()], &counts)
        .wait()?;
    let mut at = 0;
    let per_rank: Vec<&[i64]> = counts
        .iter()
        .map(|&n| {
            let p = &prints[at..at + n];
            at += n;
            p
        })
        .collect();
    let entry = |r: usize, i: usize| per_rank[r].get(i * WORDS..(i + 1) * WORDS);
    let longest = per_rank.iter().map(|p| p.len() / WORDS).max().unwrap_or(0);
    let Some(index) = (0..longest).find(|&i| (1..size).any(|r| entry(r, i) != entry(0, i))) else {
        // Same parameters, hashes differ: cannot happen; say so plainly.
        return Err(TrainError::LayoutMismatch {
            index: 0,
            detail: "the ranks' layouts hash differently but list the same parameters".into(),
        });
    };
    let other = (1..size)
        .find(|&r| entry(r, index) != entry(0, index))
        .expect("found above");
    let name_of = |r: usize| entry(r, index).map_or(0, |e| e[3] as usize);
    let name_counts: Vec<usize> = (0..size).map(name_of).collect();
    let my_name = match layout.iter().nth(index) {
        Some((_, p)) => p.name.as_bytes().to_vec(),
        None => Vec::new(),
    };
    let (_, names) = comm
        .all_gather_v(my_name, vec![0u8; name_counts.iter().sum()], &name_counts)
        .wait()?;
    let describe = |r: usize| match entry(r, index) {
        None => format!(
            "rank {r} has no parameter #{index} (it has {})",
            per_rank[r].len() / WORDS
        ),
        Some(e) => {
            let start: usize = name_counts[..r].iter().sum();
            let name = String::from_utf8_lossy(&names[start..start + name_counts[r]]);
            let dtype = DType::from_u8(e[2] as u8).map_or("?", DType::name);
            format!("rank {r} has {name:?} ({} x {dtype})", e[1])
        }
    };
    Err(TrainError::LayoutMismatch {
        index,
        detail: format!("{}, {}", describe(0), describe(other)),
    })
}

fn as_bytes(words: &[i64]) -> &[u8] {
    zerocopy::IntoBytes::as_bytes(words)
}
