//! What each benchmarked op moves, its bus-bandwidth factor (nccl-tests'
//! formulas), one timed iteration, and the result check.
//!
//! Check data is a deterministic function of (rank, index), so every rank
//! can compute the expected result for its own elements without holding
//! the other ranks' inputs (at 256 MiB per rank that matters).

use ringwire::testing::{count_wrong, reference_reduce};
use ringwire::{CollectiveBuffer, Communicator, DType, Element, ReduceOp};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BenchOp {
    AllReduce,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    /// Every rank's input to the root (nccl-tests' gather).
    Gather,
    /// The root's input, a block to each rank (nccl-tests' scatter).
    Scatter,
    Barrier,
    /// nccl-tests' sendrecv: every rank sends to the next and receives
    /// from the previous at once (`send_recv`).
    SendRecv,
    /// Ranks 0 and 1 bounce one buffer (`send` then `recv`); reported one
    /// way, as half the round trip.
    PingPong,
}

/// Buffer lengths (elements) for one size, and the bytes the size row
/// reports (nccl-tests' S: the larger of the op's buffers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    pub(crate) input: usize,
    pub(crate) output: usize,
    pub(crate) bytes: usize,
}

impl BenchOp {
    pub(crate) const ALL: [BenchOp; 11] = [
        BenchOp::AllReduce,
        BenchOp::Broadcast,
        BenchOp::Reduce,
        BenchOp::AllGather,
        BenchOp::ReduceScatter,
        BenchOp::AllToAll,
        BenchOp::Gather,
        BenchOp::Scatter,
        BenchOp::Barrier,
        BenchOp::SendRecv,
        BenchOp::PingPong,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            BenchOp::AllReduce => "all_reduce",
            BenchOp::Broadcast => "broadcast",
            BenchOp::Reduce => "reduce",
            BenchOp::AllGather => "all_gather",
            BenchOp::ReduceScatter => "reduce_scatter",
            BenchOp::AllToAll => "all_to_all",
            BenchOp::Gather => "gather",
            BenchOp::Scatter => "scatter",
            BenchOp::Barrier => "barrier",
            BenchOp::SendRecv => "sendrecv",
            BenchOp::PingPong => "pingpong",
        }
    }

    pub(crate) fn parse(name: &str) -> Option<BenchOp> {
        BenchOp::ALL
            .into_iter()
            .find(|op| op.name() == name.replace('-', "_"))
    }

    pub(crate) fn reduces(self) -> bool {
        matches!(
            self,
            BenchOp::AllReduce | BenchOp::Reduce | BenchOp::ReduceScatter
        )
    }

    /// Whether it needs another rank to talk to.
    pub(crate) fn point_to_point(self) -> bool {
        matches!(self, BenchOp::SendRecv | BenchOp::PingPong)
    }

    pub(crate) fn rooted(self) -> bool {
        matches!(
            self,
            BenchOp::Broadcast | BenchOp::Reduce | BenchOp::Gather | BenchOp::Scatter
        )
    }

    /// busbw = algbw * factor (nccl-tests, doc/PERFORMANCE.md): the bandwidth
    /// each link needs, comparable with the hardware's.
    pub(crate) fn bus_factor(self, ranks: usize) -> f64 {
        let n = ranks as f64;
        match self {
            BenchOp::AllReduce => 2.0 * (n - 1.0) / n,
            BenchOp::AllGather
            | BenchOp::ReduceScatter
            | BenchOp::AllToAll
            | BenchOp::Gather
            | BenchOp::Scatter => (n - 1.0) / n,
            BenchOp::Broadcast
            | BenchOp::Reduce
            | BenchOp::SendRecv
            | BenchOp::PingPong
            | BenchOp::Barrier => 1.0,
        }
    }

    /// Buffer lengths for a nominal `size` in bytes, rounded down so that
    /// blocks divide evenly where the op needs it.
    pub(crate) fn shape(self, size: usize, elem: usize, ranks: usize) -> Shape {
        let count = size / elem;
        match self {
            BenchOp::AllReduce | BenchOp::Broadcast | BenchOp::Reduce | BenchOp::PingPong => {
                Shape {
                    input: count,
                    output: 0,
                    bytes: count * elem,
                }
            }
            BenchOp::SendRecv => Shape {
                input: count,
                output: count,
                bytes: count * elem,
            },
            // Every rank passes the root's length where the op leaves it
            // unused, as symmetric code would.
            BenchOp::AllGather | BenchOp::Gather => {
                let per = count / ranks;
                Shape {
                    input: per,
                    output: per * ranks,
                    bytes: per * ranks * elem,
                }
            }
            BenchOp::ReduceScatter | BenchOp::Scatter => {
                let total = count / ranks * ranks;
                Shape {
                    input: total,
                    output: total / ranks,
                    bytes: total * elem,
                }
            }
            BenchOp::AllToAll => {
                let total = count / ranks * ranks;
                Shape {
                    input: total,
                    output: total,
                    bytes: total * elem,
                }
            }
            BenchOp::Barrier => Shape {
                input: 0,
                output: 0,
                bytes: 0,
            },
        }
    }
}

/// The check value of element `i` of rank `rank`'s input, in the ranges that
/// keep the f64 reference exact enough (see ringwire::testing).
pub(crate) fn value(dtype: DType, op: ReduceOp, rank: usize, i: usize) -> f64 {
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

fn fill<T: Element>(op: ReduceOp, rank: usize, offset: usize, out: &mut [T]) {
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

/// A buffer of `len` elements starting at a chosen offset within a 4 KiB
/// page (`--buffer-offset`): a window into a larger `Vec`. The kernel's
/// copies into and out of socket buffers run at very different speeds
/// depending on how source and destination line up within a page, so where
/// a buffer starts is a benchmark parameter.
pub(crate) struct Placed<T> {
    store: Vec<T>,
    start: usize,
    len: usize,
}

impl<T: Element> Placed<T> {
    /// `len` zeroed elements, starting `page_offset` bytes into a page
    /// (`None`: a plain `Vec`, wherever the allocator puts it). The offset
    /// is a multiple of the element size (checked by the argument parser).
    pub(crate) fn new(len: usize, page_offset: Option<usize>) -> Placed<T> {
        let Some(offset) = page_offset else {
            return Placed {
                store: vec![T::default(); len],
                start: 0,
                len,
            };
        };
        let element = size_of::<T>();
        let spare = crate::args::PAGE / element;
        let store = vec![T::default(); len + spare];
        let address = store.as_ptr() as usize;
        // Elements are aligned to their size, so stepping whole elements
        // reaches every multiple of it within the page.
        let skip = (offset + crate::args::PAGE - address % crate::args::PAGE) % crate::args::PAGE;
        Placed {
            store,
            start: skip / element,
            len,
        }
    }
}

impl<T: Element> std::ops::Deref for Placed<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.store[self.start..self.start + self.len]
    }
}

impl<T: Element> std::ops::DerefMut for Placed<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.store[self.start..self.start + self.len]
    }
}

impl<T: Element> CollectiveBuffer<T> for Placed<T> {
    fn as_slice(&self) -> &[T] {
        self
    }
    fn as_mut_slice(&mut self) -> &mut [T] {
        self
    }
}

impl<T> Default for Placed<T> {
    fn default() -> Placed<T> {
        Placed {
            store: Vec::new(),
            start: 0,
            len: 0,
        }
    }
}

/// One op's buffers, reused across iterations.
pub(crate) struct Runner<T: Element> {
    op: BenchOp,
    redop: ReduceOp,
    root: usize,
    input: Placed<T>,
    output: Placed<T>,
}

impl<T: Element> Runner<T> {
    pub(crate) fn new(
        op: BenchOp,
        redop: ReduceOp,
        root: usize,
        shape: Shape,
        page_offset: Option<usize>,
    ) -> Runner<T> {
        Runner {
            op,
            redop,
            root,
            input: Placed::new(shape.input, page_offset),
            output: Placed::new(shape.output, page_offset),
        }
    }

    /// Runs the op once and waits for it.
    pub(crate) fn iterate(&mut self, comm: &Communicator) -> Result<(), ringwire::Error> {
        let input = std::mem::take(&mut self.input);
        let output = std::mem::take(&mut self.output);
        let (rank, redop, root) = (comm.rank(), self.redop, self.root);
        let (input, output) = match self.op {
            BenchOp::AllReduce => (comm.all_reduce(input, redop).wait()?, output),
            BenchOp::Broadcast => (comm.broadcast(input, root).wait()?, output),
            BenchOp::Reduce => (comm.reduce(input, root, redop).wait()?, output),
            BenchOp::AllGather => comm.all_gather(input, output).wait()?,
            BenchOp::ReduceScatter => comm.reduce_scatter(input, output, redop).wait()?,
            BenchOp::AllToAll => comm.all_to_all(input, output).wait()?,
            BenchOp::Gather => comm.gather(input, output, root).wait()?,
            BenchOp::Scatter => comm.scatter(input, output, root).wait()?,
            BenchOp::Barrier => {
                comm.barrier().wait()?;
                (input, output)
            }
            BenchOp::SendRecv => {
                let ranks = comm.world_size();
                let (next, prev) = ((rank + 1) % ranks, (rank + ranks - 1) % ranks);
                comm.send_recv(input, next, output, prev).wait()?
            }
            BenchOp::PingPong => match rank {
                0 => {
                    let input = comm.send(input, 1).wait()?;
                    (comm.recv(input, 1).wait()?, output)
                }
                1 => {
                    let input = comm.recv(input, 0).wait()?;
                    (comm.send(input, 0).wait()?, output)
                }
                _ => (input, output),
            },
        };
        self.input = input;
        self.output = output;
        Ok(())
    }

    /// Fills the inputs with check data, runs the op once, and counts wrong
    /// elements in this rank's result. `corrupt` flips one result element
    /// first (a test hook proving the check can fail).
    pub(crate) fn check(
        &mut self,
        comm: &Communicator,
        corrupt: bool,
    ) -> Result<usize, ringwire::Error> {
        let (rank, ranks, redop, root) = (comm.rank(), comm.world_size(), self.redop, self.root);
        // All-to-all: block j of rank r's input goes to rank j; all-gather:
        // each rank contributes its whole input.
        let block = self.input.len() / ranks.max(1);
        let input_len = self.input.len();
        fill(redop, rank, 0, &mut self.input);
        self.iterate(comm)?;
        let result: &mut [T] = match self.op {
            BenchOp::AllGather
            | BenchOp::ReduceScatter
            | BenchOp::AllToAll
            | BenchOp::Gather
            | BenchOp::Scatter
            | BenchOp::SendRecv => &mut self.output,
            _ => &mut self.input,
        };
        if corrupt {
            if let Some(first) = result.first_mut() {
                *first = T::from_f64(first.to_f64() + 1.0);
            }
        }
        let result: &[T] = result;
        Ok(match self.op {
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
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_factors_follow_nccl_tests() {
        assert_eq!(BenchOp::AllReduce.bus_factor(4), 1.5);
        assert_eq!(BenchOp::AllReduce.bus_factor(2), 1.0);
        assert_eq!(BenchOp::AllGather.bus_factor(4), 0.75);
        assert_eq!(BenchOp::ReduceScatter.bus_factor(8), 0.875);
        assert_eq!(BenchOp::AllToAll.bus_factor(2), 0.5);
        assert_eq!(BenchOp::Broadcast.bus_factor(8), 1.0);
        assert_eq!(BenchOp::Reduce.bus_factor(3), 1.0);
        assert_eq!(BenchOp::Gather.bus_factor(4), 0.75);
        assert_eq!(BenchOp::Scatter.bus_factor(4), 0.75);
        assert_eq!(BenchOp::AllReduce.bus_factor(1), 0.0);
    }

    #[test]
    fn shapes_round_to_whole_blocks() {
        let s = BenchOp::AllGather.shape(1000, 4, 3);
        assert_eq!(
            s,
            Shape {
                input: 83,
                output: 249,
                bytes: 996
            }
        );
        let s = BenchOp::ReduceScatter.shape(1000, 4, 3);
        assert_eq!(
            s,
            Shape {
                input: 249,
                output: 83,
                bytes: 996
            }
        );
        let s = BenchOp::AllReduce.shape(1000, 8, 3);
        assert_eq!(
            s,
            Shape {
                input: 125,
                output: 0,
                bytes: 1000
            }
        );
        assert_eq!(BenchOp::AllToAll.shape(8, 4, 4).bytes, 0);
    }

    #[test]
    fn placed_buffers_start_at_the_asked_page_offset() {
        for offset in [0, 4, 48, 52, 4092] {
            let mut buf = Placed::<f32>::new(1000, Some(offset));
            assert_eq!(buf.as_ptr() as usize % 4096, offset);
            assert_eq!(buf.len(), 1000);
            buf.as_mut_slice().fill(1.5);
            assert!(buf.iter().all(|&x| x == 1.5));
        }
        let bytes = Placed::<u8>::new(10, Some(4095));
        assert_eq!(bytes.as_ptr() as usize % 4096, 4095);
        assert_eq!(Placed::<f64>::new(7, None).len(), 7);
        assert!(Placed::<f32>::new(0, Some(64)).is_empty());
    }

    #[test]
    fn names_round_trip() {
        for op in BenchOp::ALL {
            assert_eq!(BenchOp::parse(op.name()), Some(op));
        }
        assert_eq!(BenchOp::parse("all-reduce"), Some(BenchOp::AllReduce));
    }
}
