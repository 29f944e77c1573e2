//! Each collective, described once: its argument checks (which give the
//! plan every rank's frames are checked against) and its body over slices,
//! with its schedule picked by `algo::select`. The owned-buffer form
//! (queued) and the blocking slice form (run in place) of each are the
//! generic drivers in `forms`.

use super::arena;
use super::context::{Ctx, OpPlan, with_kept};
use crate::algo::select::{AllReduce as AllReduceAlgo, Rooted};
use crate::algo::{self, Step};
use crate::error::Error;
use crate::wire::OpKind;
use crate::{Element, ReduceOp};

/// This rank's place in its communicator: its rank and the size.
#[derive(Clone, Copy, Debug)]
pub(super) struct Member {
    pub(super) rank: usize,
    pub(super) size: usize,
}

/// A collective on one buffer, in place.
pub(super) trait InPlace<T: Element>: Copy + Send + 'static {
    /// The op's plan for a buffer of `n` elements, once its arguments are
    /// checked.
    fn plan(self, at: Member, n: usize) -> Result<OpPlan, Error>;
    /// Runs it on `data`.
    fn run(self, cx: &mut Ctx<'_>, data: &mut [T]) -> Result<(), Error>;
}

/// A collective from an input buffer into an output buffer.
pub(super) trait InToOut<T: Element>: Clone + Send + 'static {
    /// The op's plan for an input of `n` and an output of `out` elements,
    /// once its arguments are checked.
    fn plan(&self, at: Member, n: usize, out: usize) -> Result<OpPlan, Error>;
    /// Runs it from `input` into `output`.
    fn run(&self, cx: &mut Ctx<'_>, input: &[T], output: &mut [T]) -> Result<(), Error>;
    /// Whether this rank reads its input and writes its output (a rooted
    /// op's unused buffer is neither: the blocking form, queued, copies
    /// only what is used).
    fn uses(&self, rank: usize) -> (bool, bool) {
        let _ = rank;
        (true, true)
    }
}

fn invalid(op: OpKind, detail: String) -> Error {
    Error::InvalidArgument { op, detail }
}

/// The plan of an op of `count` elements of `T`.
pub(super) fn plan<T: Element>(kind: OpKind, count: usize) -> OpPlan {
    OpPlan {
        kind,
        dtype: T::DTYPE,
        count: count as u64,
        reduce_op: None,
        root: 0,
        uniform_count: true,
    }
}

/// The plan of a rooted op, once `root` is checked to be a rank.
fn rooted_plan<T: Element>(at: Member, op: OpKind, n: usize, root: usize) -> Result<OpPlan, Error> {
    if root >= at.size {
        return Err(invalid(
            op,
            format!(
                "root {root} is not a rank of this communicator (size {})",
                at.size
            ),
        ));
    }
    let mut plan = plan::<T>(op, n);
    plan.root = root as u32;
    Ok(plan)
}

/// Checks the length of a gather's output or a scatter's input (`what`,
/// `len` elements) against the `n` elements of the other buffer (`per`)
/// of every rank: at the root it must hold every rank's block; elsewhere
/// it is not used, and may be empty or of the root's length.
fn check_root_buffer(
    at: Member,
    op: OpKind,
    (what, per): (&str, &str),
    len: usize,
    n: usize,
    root: usize,
) -> Result<(), Error> {
    let Member { rank, size } = at;
    let whole = n * size;
    if len == whole || (rank != root && len == 0) {
        return Ok(());
    }
    let detail = match rank == root {
        true => format!(
            "{what} has {len} elements but at the root must have {per} length {n} x world size {size} = {whole}"
        ),
        false => format!(
            "{what} has {len} elements; rank {rank} is not the root ({root}), so it must be \
             empty or have the root's {per} length {n} x world size {size} = {whole}"
        ),
    };
    Err(invalid(op, detail))
}

/// All-reduce with this operator.
#[derive(Clone, Copy, Debug)]
pub(super) struct AllReduce(pub(super) ReduceOp);

impl<T: Element> InPlace<T> for AllReduce {
    fn plan(self, _: Member, n: usize) -> Result<OpPlan, Error> {
        let mut plan = plan::<T>(OpKind::AllReduce, n);
        plan.reduce_op = Some(self.0);
        Ok(plan)
    }

    fn run(self, cx: &mut Ctx<'_>, data: &mut [T]) -> Result<(), Error> {
        let (rank, size) = cx.rank_and_size();
        let n = data.len();
        let algo = cx.shape().all_reduce(size_of_val(data));
        let bytes = size_of_val(data);
        // Hosts of equal size: within each, across them, within each again
        // (decision 0033), where the cost model says that pays.
        if let Some(levels) =
            cx.two_level(|grid, costs| algo::levels::two_level_all_reduce_pays(grid, bytes, costs))?
        {
            return levels.counted(cx, |cx| {
                super::levels::all_reduce(cx, &levels, data, self.0)
            });
        }
        let on_arena = match bytes <= arena::ALL_REDUCE_MAX_BYTES {
            true => cx.on_arena(bytes, arena::ALL_REDUCE_MAX_BYTES, |op, w| {
                arena::all_reduce(op, w, size, data, self.0)
            })?,
            // The large tier: faster than the schedules over the links at
            // every size from 16 KiB to 256 MiB, 2 to 8 ranks (decision 0032).
            false => cx.on_arena_ops(|ops, w| {
                arena::all_reduce_chunked(ops, w, (rank, size), data, self.0)
            })?,
        };
        if on_arena {
            return Ok(());
        }
        cx.run_schedule(data, |steps, chunk| match algo {
            AllReduceAlgo::Halving => algo::all_reduce_halving(steps, rank, size, n, chunk),
            AllReduceAlgo::Tree => algo::all_reduce_tree(steps, rank, size, n, chunk),
            AllReduceAlgo::Doubling => algo::all_reduce_doubling(steps, rank, size, n, chunk),
            AllReduceAlgo::Ring => algo::all_reduce_ring(steps, rank, size, n, chunk),
        })?;
        if self.0 == ReduceOp::Avg {
            T::finish_avg(data, size);
        }
        Ok(())
    }
}

/// Broadcast from this root.
#[derive(Clone, Copy, Debug)]
pub(super) struct Broadcast {
    pub(super) root: usize,
}

impl<T: Element> InPlace<T> for Broadcast {
    fn plan(self, at: Member, n: usize) -> Result<OpPlan, Error> {
        rooted_plan::<T>(at, OpKind::Broadcast, n, self.root)
    }

    fn run(self, cx: &mut Ctx<'_>, data: &mut [T]) -> Result<(), Error> {
        let (rank, size) = cx.rank_and_size();
        let (n, root) = (data.len(), self.root);
        let bytes = size_of_val(data);
        let choice = cx.shape().broadcast(bytes);
        // Across hosts, then within each, where the flat schedule would
        // cross hosts more (decision 0033).
        if let Some(levels) = cx.two_level(|grid, costs| {
            algo::levels::two_level_broadcast_pays(grid, root, bytes, costs)
        })? {
            return levels.counted(cx, |cx| super::levels::broadcast(cx, &levels, data, root));
        }
        let on_arena = match bytes <= arena::COPY_MAX_BYTES {
            true => cx.on_arena(bytes, arena::COPY_MAX_BYTES, |op, w| {
                arena::broadcast(op, w, rank, root, data)
            })?,
            false if arena::broadcast_in_chunks(size, bytes) => {
                cx.on_arena_ops(|ops, w| arena::broadcast_chunked(ops, w, rank, root, data))?
            }
            false => false,
        };
        if on_arena {
            return Ok(());
        }
        cx.pace = choice.paced;
        cx.run_schedule(data, |steps, chunk| match choice.schedule {
            Rooted::Tree => algo::broadcast_tree(steps, rank, size, root, n, chunk),
            Rooted::Chain => algo::broadcast_chain(steps, rank, size, root, n, chunk),
        })
    }
}

/// Reduce to this root with this operator.
#[derive(Clone, Copy, Debug)]
pub(super) struct Reduce {
    pub(super) root: usize,
    pub(super) op: ReduceOp,
}

impl<T: Element> InPlace<T> for Reduce {
    fn plan(self, at: Member, n: usize) -> Result<OpPlan, Error> {
        let mut plan = rooted_plan::<T>(at, OpKind::Reduce, n, self.root)?;
        plan.reduce_op = Some(self.op);
        Ok(plan)
    }

    fn run(self, cx: &mut Ctx<'_>, data: &mut [T]) -> Result<(), Error> {
        let (rank, size) = cx.rank_and_size();
        let (n, root) = (data.len(), self.root);
        let choice = cx.shape().reduce(n, size_of_val(data), cx.chunk::<T>());
        if cx.on_arena(size_of_val(data), arena::ALL_REDUCE_MAX_BYTES, |op, w| {
            arena::reduce(op, w, (rank, size), root, data, self.op)
        })? {
            return Ok(());
        }
        let chain = choice.schedule == Rooted::Chain;
        cx.pace = choice.paced;
        if rank == root {
            cx.run_schedule(data, |steps, chunk| match chain {
                true => algo::reduce_chain(steps, rank, size, root, n, chunk),
                false => algo::reduce_tree(steps, rank, size, root, n, chunk),
            })?;
            if self.op == ReduceOp::Avg {
                T::finish_avg(data, size);
            }
            return Ok(());
        }
        // The caller's buffer is read in place and comes back as it was:
        // partial results pass through one chunk's slot (a leaf never
        // touches it; see `algo::reduce_tree_from` and `reduce_chain_from`).
        cx.with_scratch(cx.chunk::<T>().min(n), |cx, work: &mut [T]| {
            cx.run_schedule_from(data, work, |steps, chunk| match chain {
                true => algo::reduce_chain_from(steps, rank, size, root, n, chunk),
                false => algo::reduce_tree_from(steps, rank, size, root, n, chunk),
            })
        })
    }
}

/// All-gather.
#[derive(Clone, Copy, Debug)]
pub(super) struct AllGather;

impl<T: Element> InToOut<T> for AllGather {
    fn plan(&self, at: Member, n: usize, out: usize) -> Result<OpPlan, Error> {
        let size = at.size;
        if out != n * size {
            return Err(invalid(
                OpKind::AllGather,
                format!(
                    "output has {out} elements but must have input length {n} x world size {size} = {}",
                    n * size
                ),
            ));
        }
        Ok(plan::<T>(OpKind::AllGather, n))
    }

    fn run(&self, cx: &mut Ctx<'_>, input: &[T], output: &mut [T]) -> Result<(), Error> {
        let (rank, size) = cx.rank_and_size();
        let n = input.len();
        let bytes = size_of_val(input);
        // Across hosts first, then within each (decision 0033).
        if let Some(levels) = cx.two_level(|grid, costs| {
            algo::levels::two_level_half_pays(grid, size_of_val(output), costs)
        })? {
            return levels.counted(cx, |cx| {
                super::levels::all_gather(cx, &levels, input, output)
            });
        }
        let on_arena = match bytes <= arena::COPY_MAX_BYTES {
            true => cx.on_arena(bytes, arena::COPY_MAX_BYTES, |op, w| {
                arena::all_gather(op, w, (rank, size), input, output)
            })?,
            false => cx.on_arena_ops(|ops, w| {
                arena::all_gather_chunked(ops, w, (rank, size), input, output)
            })?,
        };
        if on_arena {
            return Ok(());
        }
        output[rank * n..(rank + 1) * n].copy_from_slice(input);
        cx.run_schedule(output, |steps, chunk| {
            algo::all_gather_ring(steps, rank, size, n, chunk)
        })
    }
}

/// All-gather of blocks of these lengths, one per rank.
#[derive(Clone, Debug)]
pub(super) struct AllGatherV {
    pub(super) counts: Vec<usize>,
}

impl<T: Element> InToOut<T> for AllGatherV {
    fn plan(&self, at: Member, n: usize, out: usize) -> Result<OpPlan, Error> {
        let Member { rank, size } = at;
        let counts = &self.counts;
        let bad = |detail: String| Err(invalid(OpKind::AllGather, detail));
        if counts.len() != size {
            return bad(format!(
                "counts has {} entries but needs one per rank ({size})",
                counts.len()
            ));
        }
        if n != counts[rank] {
            return bad(format!(
                "input has {n} elements but counts says rank {rank}'s block has {}",
                counts[rank]
            ));
        }
        let total: usize = counts.iter().sum();
        if out != total {
            return bad(format!(
                "output has {out} elements but the counts sum to {total}"
            ));
        }
        let mut plan = plan::<T>(OpKind::AllGather, n);
        plan.uniform_count = false;
        Ok(plan)
    }

    fn run(&self, cx: &mut Ctx<'_>, input: &[T], output: &mut [T]) -> Result<(), Error> {
        let rank = cx.ex.rank;
        let counts = &self.counts;
        let start: usize = counts[..rank].iter().sum();
        output[start..start + input.len()].copy_from_slice(input);
        cx.run_schedule(output, |steps, chunk| {
            algo::all_gather_v_ring(steps, rank, counts, chunk)
        })
    }
}

/// Gather to this root.
#[derive(Clone, Copy, Debug)]
pub(super) struct Gather {
    pub(super) root: usize,
}

impl<T: Element> InToOut<T> for Gather {
    fn plan(&self, at: Member, n: usize, out: usize) -> Result<OpPlan, Error> {
        let plan = rooted_plan::<T>(at, OpKind::Gather, n, self.root)?;
        check_root_buffer(at, OpKind::Gather, ("output", "input"), out, n, self.root)?;
        Ok(plan)
    }

    fn run(&self, cx: &mut Ctx<'_>, input: &[T], output: &mut [T]) -> Result<(), Error> {
        let (rank, size) = cx.rank_and_size();
        let (n, root) = (input.len(), self.root);
        let in_turn = cx.shape().gather_in_turn(size_of_val(input));
        if cx.on_arena(size_of_val(input), arena::COPY_MAX_BYTES, |op, w| {
            arena::gather(op, w, (rank, size), root, input, output)
        })? {
            return Ok(());
        }
        let build = |steps: &mut Vec<Step>, chunk| {
            algo::gather(steps, (rank, size, root), n, chunk, in_turn)
        };
        if rank != root {
            // Sends read the input in place; nothing lands here.
            return cx.run_schedule_from(input, &mut [], build);
        }
        output[rank * n..(rank + 1) * n].copy_from_slice(input);
        cx.run_schedule(output, build)
    }

    fn uses(&self, rank: usize) -> (bool, bool) {
        (true, rank == self.root)
    }
}

/// Scatter from this root.
#[derive(Clone, Copy, Debug)]
pub(super) struct Scatter {
    pub(super) root: usize,
}

impl<T: Element> InToOut<T> for Scatter {
    fn plan(&self, at: Member, ins: usize, n: usize) -> Result<OpPlan, Error> {
        let plan = rooted_plan::<T>(at, OpKind::Scatter, n, self.root)?;
        check_root_buffer(at, OpKind::Scatter, ("input", "output"), ins, n, self.root)?;
        Ok(plan)
    }

    fn run(&self, cx: &mut Ctx<'_>, input: &[T], output: &mut [T]) -> Result<(), Error> {
        let (rank, size) = cx.rank_and_size();
        let (n, root) = (output.len(), self.root);
        let build = |steps: &mut Vec<Step>, chunk| algo::scatter(steps, rank, size, root, n, chunk);
        if cx.on_arena(
            size_of_val(output) * size,
            arena::COPY_MAX_BYTES,
            |op, w| arena::scatter(op, w, (rank, size), root, input, output),
        )? {
            return Ok(());
        }
        cx.pace = cx.shape().scatter_paced(size_of_val(output));
        if rank != root {
            return cx.run_schedule(output, build);
        }
        output.copy_from_slice(&input[rank * n..(rank + 1) * n]);
        cx.run_schedule_from(input, &mut [], build)
    }

    fn uses(&self, rank: usize) -> (bool, bool) {
        (rank == self.root, true)
    }
}

/// Reduce-scatter with this operator.
#[derive(Clone, Copy, Debug)]
pub(super) struct ReduceScatter(pub(super) ReduceOp);

impl<T: Element> InToOut<T> for ReduceScatter {
    fn plan(&self, at: Member, n: usize, out: usize) -> Result<OpPlan, Error> {
        let Member { rank, size } = at;
        let mine = algo::block(n, size, rank).len();
        if out != mine {
            return Err(invalid(
                OpKind::ReduceScatter,
                format!(
                    "output has {out} elements but rank {rank}'s block of {n} over {size} ranks has {mine}"
                ),
            ));
        }
        let mut plan = plan::<T>(OpKind::ReduceScatter, n);
        plan.reduce_op = Some(self.0);
        Ok(plan)
    }

    fn run(&self, cx: &mut Ctx<'_>, input: &[T], output: &mut [T]) -> Result<(), Error> {
        let (rank, size) = cx.rank_and_size();
        let n = input.len();
        let mine = algo::block(n, size, rank);
        // Within each host, then across hosts (decision 0033).
        if let Some(levels) = cx.two_level(|grid, costs| {
            algo::levels::two_level_half_pays(grid, size_of_val(input), costs)
        })? {
            return levels.counted(cx, |cx| {
                super::levels::reduce_scatter(cx, &levels, input, output, self.0)
            });
        }
        if cx.on_arena(size_of_val(input), arena::ALL_REDUCE_MAX_BYTES, |op, w| {
            arena::reduce_scatter(op, w, (rank, size), input, output, self.0)
        })? {
            return Ok(());
        }
        // The input stays as it is: each block is first combined with it as
        // it arrives (`algo::reduce_scatter_ring_from`). Two ranks reduce
        // only their own block, straight into the output. More also forward
        // the other blocks, chunk by chunk through one slot at the output's
        // tail (`algo::reduce_scatter_ring_into`), so they need no work
        // space either.
        if size == 1 {
            output.copy_from_slice(input);
        } else if size == 2 {
            cx.run_schedule_from(input, output, |steps, chunk| {
                algo::reduce_scatter_ring_from(steps, rank, size, n, chunk, |_| n..n + mine.len())
            })?;
        } else {
            let (slot, work_len) = algo::reduce_scatter_slot(n, size, rank, cx.chunk::<T>());
            let build = |steps: &mut Vec<Step>, chunk| {
                algo::reduce_scatter_ring_into(steps, rank, size, n, chunk, slot)
            };
            if work_len == mine.len() {
                cx.run_schedule_from(input, output, build)?;
            } else {
                // An output shorter than a chunk: it and the slot in scratch.
                cx.with_scratch(work_len, |cx, work: &mut [T]| {
                    cx.run_schedule_from(input, work, build)?;
                    output.copy_from_slice(&work[..mine.len()]);
                    Ok::<(), Error>(())
                })?;
            }
        }
        if self.0 == ReduceOp::Avg {
            T::finish_avg(output, size);
        }
        Ok(())
    }
}

/// All-to-all with even blocks.
#[derive(Clone, Copy, Debug)]
pub(super) struct AllToAll;

impl<T: Element> InToOut<T> for AllToAll {
    fn plan(&self, at: Member, n: usize, out: usize) -> Result<OpPlan, Error> {
        let size = at.size;
        if !n.is_multiple_of(size) || out != n {
            return Err(invalid(
                OpKind::AllToAll,
                format!(
                    "input has {n} elements and output {out}: both must be equal and divisible by the world size {size} \
                     (use all_to_all_v for uneven splits)"
                ),
            ));
        }
        let mut plan = plan::<T>(OpKind::AllToAll, n);
        plan.uniform_count = false;
        Ok(plan)
    }

    /// Blocks of `input.len() / size` elements (the counts list is the
    /// communicator's, reused).
    fn run(&self, cx: &mut Ctx<'_>, input: &[T], output: &mut [T]) -> Result<(), Error> {
        let ex = cx.ex;
        let (rank, size) = cx.rank_and_size();
        if cx.on_arena(size_of_val(input), arena::COPY_MAX_BYTES, |op, w| {
            arena::all_to_all(op, w, (rank, size), input, output)
        })? {
            return Ok(());
        }
        with_kept(
            &ex.counts,
            |_| true,
            |counts| {
                counts.clear();
                counts.resize(ex.size, input.len() / ex.size);
                all_to_all_v(cx, input, counts, output, counts)
            },
        )
    }
}

/// All-to-all with uneven blocks: these many elements to and from each rank.
#[derive(Clone, Debug)]
pub(super) struct AllToAllV {
    pub(super) send_counts: Vec<usize>,
    pub(super) recv_counts: Vec<usize>,
}

impl<T: Element> InToOut<T> for AllToAllV {
    fn plan(&self, at: Member, ins: usize, outs: usize) -> Result<OpPlan, Error> {
        let Member { rank, size } = at;
        let (send_counts, recv_counts) = (&self.send_counts, &self.recv_counts);
        let bad = |detail: String| Err(invalid(OpKind::AllToAll, detail));
        if send_counts.len() != size || recv_counts.len() != size {
            return bad(format!(
                "send_counts and recv_counts need one entry per rank ({size})"
            ));
        }
        let (sum_send, sum_recv) = (
            send_counts.iter().sum::<usize>(),
            recv_counts.iter().sum::<usize>(),
        );
        if sum_send != ins || sum_recv != outs {
            return bad(format!(
                "send_counts sum to {sum_send} (input has {ins}); recv_counts sum to {sum_recv} (output has {outs})"
            ));
        }
        if send_counts[rank] != recv_counts[rank] {
            return bad(format!(
                "this rank sends itself {} elements but expects {}",
                send_counts[rank], recv_counts[rank]
            ));
        }
        let mut plan = plan::<T>(OpKind::AllToAll, ins);
        plan.uniform_count = false;
        Ok(plan)
    }

    fn run(&self, cx: &mut Ctx<'_>, input: &[T], output: &mut [T]) -> Result<(), Error> {
        all_to_all_v(cx, input, &self.send_counts, output, &self.recv_counts)
    }
}

/// The all-to-all body: the schedule addresses the input, then the output
/// (see `algo::all_to_all_v`), so sends read the input where it is and
/// receives land in the output; only this rank's own block is copied.
fn all_to_all_v<T: Element>(
    cx: &mut Ctx<'_>,
    input: &[T],
    send_counts: &[usize],
    output: &mut [T],
    recv_counts: &[usize],
) -> Result<(), Error> {
    let rank = cx.ex.rank;
    let own_in: usize = send_counts[..rank].iter().sum();
    let own_out: usize = recv_counts[..rank].iter().sum();
    let own = send_counts[rank]; // equal to recv_counts[rank] (checked)
    output[own_out..own_out + own].copy_from_slice(&input[own_in..own_in + own]);
    cx.run_schedule_from(input, output, |steps, chunk| {
        algo::all_to_all_v(steps, rank, send_counts, recv_counts, chunk)
    })
}

/// The barrier's body.
pub(super) fn barrier(cx: &mut Ctx<'_>) -> Result<(), Error> {
    let (rank, size) = cx.rank_and_size();
    if cx.on_arena(0, 0, arena::barrier)? {
        return Ok(());
    }
    cx.run_schedule::<u8>(&mut [], |steps, _| algo::barrier(steps, rank, size))
}
