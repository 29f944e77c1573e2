//! Check data and result checks (the #wrong column), shared by the host
//! runner (`ops`) and the device one (`device`).
//!
//! Check data is a deterministic function of (rank, index), so every rank
//! can compute the expected result for its own elements without holding
//! the other ranks' inputs (at 256 MiB per rank that matters).

use crate::bench_op::BenchOp;
use ringwire::testing::{count_wrong, reference_reduce};
use ringwire::{DType, Element, ReduceOp};

/// The check value of element `i` of rank `rank`'s input, in the ranges that
/// keep the f64 reference exact enough (see ringwire::testing).
fn value(dtype: DType, op: ReduceOp, rank: usize, i: usize) -> f64 {
    let mut z = ((rank as u64) << 40 ^ i as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    let unit = (z >> 11) as f64 / (1u64 << 53) as f64;
    match (dtype, op) {
        (DType::U8, _) => (z % 4) as f64,
        (DType::I32 | DType::I64, ReduceOp::Prod) => (z % 7) as f64 - 3.0,
        (DType::I32 | DType::I64, _) => (z % 2001) as f64 - 1000.0,
        (_, ReduceOp::Prod) => 0.5 + unit,
        _ => unit * 2.0 - 1.0,
    }
}

/// Fills `out` with rank `rank`'s check data from element `offset`.
pub(crate) fn fill<T: Element>(op: ReduceOp, rank: usize, offset: usize, out: &mut [T]) {
    for (i, v) in out.iter_mut().enumerate() {
        *v = T::from_f64(value(T::DTYPE, op, rank, offset + i));
    }
}

/// Counts elements of `got` (rank-order elements `offset..`) that differ from
/// the reduction over all ranks, computed in slices to bound memory.
fn wrong_reduced<T: Element>(got: &[T], offset: usize, ranks: usize, op: ReduceOp) -> usize {
    const SLICE: usize = 1 << 16;
    let mut wrong = 0;
    for (k, part) in got.chunks(SLICE).enumerate() {
        let start = offset + k * SLICE;
        let inputs: Vec<Vec<T>> = (0..ranks)
            .map(|r| {
                let mut v = vec![T::default(); part.len()];
                fill(op, r, start, &mut v);
                v
            })
            .collect();
        wrong += count_wrong(part, &reference_reduce(&inputs, op), ranks);
    }
    wrong
}

/// Counts elements of `got` that differ from rank `rank`'s input at `offset..`.
fn wrong_copied<T: Element>(got: &[T], rank: usize, offset: usize, op: ReduceOp) -> usize {
    got.iter()
        .enumerate()
        .filter(|(i, g)| **g != T::from_f64(value(T::DTYPE, op, rank, offset + i)))
        .count()
}

/// The check data of rank `rank`'s input: `len` elements from index 0.
pub(crate) fn check_input<T: Element>(redop: ReduceOp, rank: usize, len: usize) -> Vec<T> {
    let mut v = vec![T::default(); len];
    fill(redop, rank, 0, &mut v);
    v
}

/// What one rank's result must hold after one op on check data: shared by
/// the host runner and the device one, which reads its result back first.
#[derive(Clone, Copy)]
pub(crate) struct Check {
    pub(crate) op: BenchOp,
    pub(crate) redop: ReduceOp,
    pub(crate) root: usize,
    pub(crate) rank: usize,
    pub(crate) ranks: usize,
    /// Elements of this rank's input.
    pub(crate) input_len: usize,
}

impl Check {
    /// Whether the result is in the op's output (else in its input,
    /// updated in place).
    pub(crate) fn reads_output(&self) -> bool {
        matches!(
            self.op,
            BenchOp::AllGather
                | BenchOp::ReduceScatter
                | BenchOp::AllToAll
                | BenchOp::Gather
                | BenchOp::Scatter
                | BenchOp::SendRecv
        )
    }

    /// Counts wrong elements of `result` (the buffer [`Check::reads_output`]
    /// names). `corrupt` first changes its first element.
    pub(crate) fn wrong<T: Element>(&self, result: &mut [T], corrupt: bool) -> usize {
        let Check {
            op,
            redop,
            root,
            rank,
            ranks,
            input_len,
        } = *self;
        if corrupt && let Some(first) = result.first_mut() {
            *first = T::from_f64(first.to_f64() + 1.0);
        }
        let result: &[T] = result;
        // All-to-all: block j of rank r's input goes to rank j; all-gather:
        // each rank contributes its whole input.
        let block = input_len / ranks.max(1);
        match op {
            BenchOp::AllReduce => wrong_reduced(result, 0, ranks, redop),
            BenchOp::Reduce if rank == root => wrong_reduced(result, 0, ranks, redop),
            BenchOp::Reduce => wrong_copied(result, rank, 0, redop),
            BenchOp::Broadcast => wrong_copied(result, root, 0, redop),
            BenchOp::ReduceScatter => wrong_reduced(result, rank * result.len(), ranks, redop),
            BenchOp::AllGather => (0..ranks)
                .map(|r| wrong_copied(&result[r * input_len..(r + 1) * input_len], r, 0, redop))
                .sum(),
            BenchOp::Gather if rank == root => (0..ranks)
                .map(|r| wrong_copied(&result[r * input_len..(r + 1) * input_len], r, 0, redop))
                .sum(),
            // Not the root: its output must stay as it was (zeros).
            BenchOp::Gather => result.iter().filter(|x| **x != T::default()).count(),
            BenchOp::Scatter => wrong_copied(result, root, rank * result.len(), redop),
            BenchOp::AllToAll => (0..ranks)
                .map(|j| wrong_copied(&result[j * block..(j + 1) * block], j, rank * block, redop))
                .sum(),
            BenchOp::SendRecv => {
                let prev = (rank + ranks - 1) % ranks;
                wrong_copied(result, prev, 0, redop)
            }
            BenchOp::PingPong => match rank {
                // Rank 1 got rank 0's data and sent it back.
                0 | 1 => wrong_copied(result, 0, 0, redop),
                _ => 0,
            },
            BenchOp::Barrier => 0,
        }
    }
}
