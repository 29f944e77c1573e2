//! The [`Bench`] the sweep times, and its host form: one timed iteration
//! over host buffers and ringwire's transports, and the result check (whose
//! data and reference are in `check`). What each op moves is `bench_op`.

use crate::bench_op::{BenchOp, Shape};
use crate::check::{Check, fill};
use ringwire::{CollectiveBuffer, Communicator, Element, ReduceOp};

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
    /// The blocking slice forms instead of owned buffers and `wait()`.
    blocking: bool,
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
            blocking: false,
        }
    }

    /// Calls the blocking slice forms from now on.
    pub(crate) fn blocking(mut self, blocking: bool) -> Runner<T> {
        self.blocking = blocking;
        self
    }

    /// Runs the op once on the blocking slice forms; `None` for the ops
    /// that have none (barrier, point-to-point: the owned forms run).
    fn iterate_blocking(&mut self, comm: &Communicator) -> Option<Result<(), ringwire::Error>> {
        let (redop, root) = (self.redop, self.root);
        let (input, output) = (&mut *self.input, &mut *self.output);
        Some(match self.op {
            BenchOp::AllReduce => comm.all_reduce_slice(input, redop),
            BenchOp::Broadcast => comm.broadcast_slice(input, root),
            BenchOp::Reduce => comm.reduce_slice(input, root, redop),
            BenchOp::AllGather => comm.all_gather_slice(input, output),
            BenchOp::ReduceScatter => comm.reduce_scatter_slice(input, output, redop),
            BenchOp::AllToAll => comm.all_to_all_slice(input, output),
            BenchOp::Gather => comm.gather_slice(input, output, root),
            BenchOp::Scatter => comm.scatter_slice(input, output, root),
            BenchOp::Barrier | BenchOp::SendRecv | BenchOp::PingPong => return None,
        })
    }

    /// Runs the op once and waits for it.
    pub(crate) fn iterate(&mut self, comm: &Communicator) -> Result<(), ringwire::Error> {
        if self.blocking
            && let Some(done) = self.iterate_blocking(comm)
        {
            return done;
        }
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
        let check = Check {
            op: self.op,
            redop: self.redop,
            root: self.root,
            rank: comm.rank(),
            ranks: comm.world_size(),
            input_len: self.input.len(),
        };
        fill(self.redop, check.rank, 0, &mut self.input);
        self.iterate(comm)?;
        let result: &mut [T] = if check.reads_output() {
            &mut self.output
        } else {
            &mut self.input
        };
        Ok(check.wrong(result, corrupt))
    }
}

/// One size's op, ready to run on some rank: what the sweep times,
/// whatever holds the buffers (host memory and ringwire's transports, or
/// device memory and NCCL).
pub(crate) trait Bench {
    /// Fills the inputs with check data, runs the op once and counts the
    /// wrong elements of this rank's result (`corrupt`: one on purpose).
    fn check(&mut self, corrupt: bool) -> Result<usize, String>;
    /// Runs the op once, from submission until its `wait` returns.
    fn iterate(&mut self) -> Result<(), String>;
    /// Waits for every rank (before the timed iterations).
    fn barrier(&mut self) -> Result<(), String>;
}

/// [`Runner`] on a CPU communicator.
pub(crate) struct CpuBench<'a, T: Element> {
    pub(crate) runner: Runner<T>,
    pub(crate) comm: &'a Communicator,
}

impl<T: Element> Bench for CpuBench<'_, T> {
    fn check(&mut self, corrupt: bool) -> Result<usize, String> {
        self.runner
            .check(self.comm, corrupt)
            .map_err(|e| e.to_string())
    }
    fn iterate(&mut self) -> Result<(), String> {
        self.runner.iterate(self.comm).map_err(|e| e.to_string())
    }
    fn barrier(&mut self) -> Result<(), String> {
        self.comm.barrier().wait().map_err(|e| e.to_string())
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
