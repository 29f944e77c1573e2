//! One size's op on device buffers through a [`GpuCommunicator`]: the
//! device twin of `ops::Runner`, timed and checked the same way (a
//! [`Bench`]). Ops take their buffers by value and give them back when
//! waited for, so the runner keeps each in an `Option` between iterations.

use super::memory::{DeviceMem, GpuElem};
use crate::bench_op::{BenchOp, Shape};
use crate::check::{Check, check_input};
use crate::ops::Bench;
use ringwire::ReduceOp;
use ringwire_gpu::{GpuCommunicator, GpuError};

pub(crate) struct GpuRunner<'a, T: GpuElem, M: DeviceMem> {
    gpu: &'a GpuCommunicator,
    mem: &'a M,
    op: BenchOp,
    redop: ReduceOp,
    root: usize,
    /// `None` where the shape leaves a buffer unused (length 0: CUDA
    /// allocates no empty buffers) or an op failed with it.
    input: Option<M::Buf<T>>,
    output: Option<M::Buf<T>>,
}

impl<'a, T: GpuElem, M: DeviceMem> GpuRunner<'a, T, M> {
    /// Allocates `shape`'s buffers, zeroed, on the device.
    pub(crate) fn new(
        gpu: &'a GpuCommunicator,
        mem: &'a M,
        (op, redop, root): (BenchOp, ReduceOp, usize),
        shape: Shape,
    ) -> Result<Self, String> {
        let alloc = |len: usize| (len > 0).then(|| mem.zeros::<T>(len)).transpose();
        Ok(GpuRunner {
            gpu,
            mem,
            op,
            redop,
            root,
            input: alloc(shape.input)?,
            output: alloc(shape.output)?,
        })
    }
}

fn take<B>(slot: &mut Option<B>, what: &str) -> Result<B, String> {
    slot.take()
        .ok_or_else(|| format!("internal: the op's {what} buffer is missing"))
}

impl<T: GpuElem, M: DeviceMem> Bench for GpuRunner<'_, T, M> {
    fn iterate(&mut self) -> Result<(), String> {
        let g = self.gpu;
        let e = |e: GpuError| e.to_string();
        let (redop, root) = (self.redop, self.root);
        let (rank, ranks) = (g.rank(), g.world_size());
        // Ops of one buffer, updated in place.
        let one = match self.op {
            BenchOp::AllReduce | BenchOp::Broadcast | BenchOp::Reduce | BenchOp::PingPong => {
                Some(take(&mut self.input, "input")?)
            }
            _ => None,
        };
        if let Some(buf) = one {
            let buf = match self.op {
                BenchOp::AllReduce => g.all_reduce(buf, redop).wait(),
                BenchOp::Broadcast => g.broadcast(buf, root).wait(),
                BenchOp::Reduce => g.reduce(buf, redop, root).wait(),
                // Ranks 0 and 1 bounce the buffer; the others wait.
                _ => match rank {
                    0 => g.send(buf, 1).wait().and_then(|b| g.recv(b, 1).wait()),
                    1 => g.recv(buf, 0).wait().and_then(|b| g.send(b, 0).wait()),
                    _ => Ok(buf),
                },
            };
            self.input = Some(buf.map_err(e)?);
            return Ok(());
        }
        if self.op == BenchOp::Barrier {
            return g.barrier().wait().map_err(e);
        }
        let input = take(&mut self.input, "input")?;
        let output = take(&mut self.output, "output")?;
        let (input, output) = match self.op {
            BenchOp::AllGather => g.all_gather(input, output).wait().map_err(e)?,
            BenchOp::ReduceScatter => g.reduce_scatter(input, output, redop).wait().map_err(e)?,
            BenchOp::AllToAll => g.all_to_all(input, output).wait().map_err(e)?,
            BenchOp::Gather => g.gather(input, output, root).wait().map_err(e)?,
            BenchOp::Scatter => g.scatter(input, output, root).wait().map_err(e)?,
            // nccl-tests' sendrecv: to the next rank and from the previous
            // at once, one NCCL group (which gives the buffers back in order).
            _ => {
                let (next, prev) = ((rank + 1) % ranks, (rank + ranks - 1) % ranks);
                let mut group = g.group();
                group.send(input, next).recv(output, prev);
                let mut bufs = group.launch().wait().map_err(e)?.into_iter();
                match (bufs.next(), bufs.next()) {
                    (Some(i), Some(o)) => (i, o),
                    _ => return Err("internal: a group of two gave back fewer buffers".into()),
                }
            }
        };
        self.input = Some(input);
        self.output = Some(output);
        Ok(())
    }

    fn check(&mut self, corrupt: bool) -> Result<usize, String> {
        let (rank, ranks) = (self.gpu.rank(), self.gpu.world_size());
        let input_len = self
            .input
            .as_ref()
            .map_or(0, ringwire_gpu::DeviceBuffer::len);
        if let Some(input) = &mut self.input {
            self.mem
                .write(input, &check_input::<T>(self.redop, rank, input_len))?;
        }
        self.iterate()?;
        let check = Check {
            op: self.op,
            redop: self.redop,
            root: self.root,
            rank,
            ranks,
            input_len,
        };
        let result = if check.reads_output() {
            &self.output
        } else {
            &self.input
        };
        let mut host = match result {
            Some(buf) => self.mem.read(buf)?,
            None => Vec::new(),
        };
        Ok(check.wrong(&mut host, corrupt))
    }

    fn barrier(&mut self) -> Result<(), String> {
        self.gpu.barrier().wait().map_err(|e| e.to_string())
    }
}
