//! The collective sweep every world size runs: every collective (and the
//! point-to-point exchange), every
//! dtype and reduce op, lengths 0, 1, p-1, 2p+1 and 1000, against an f64
//! reference on random data shared by seed.

use half::{bf16, f16};
use ringwire::testing::{Rng, check_close, random_data, reference_reduce};
use ringwire::{Communicator, Element, ReduceOp};

fn lengths(world: usize) -> Vec<usize> {
    vec![0, 1, world.saturating_sub(1), 2 * world + 1, 1000]
}

/// The inputs of every rank for one case, the same on every rank.
pub(crate) fn inputs<T: Element>(
    seed: u64,
    case: u64,
    world: usize,
    len: usize,
    op: ReduceOp,
) -> Vec<Vec<T>> {
    (0..world)
        .map(|r| {
            random_data(
                &mut Rng::new(seed ^ case.wrapping_mul(1_000_003) ^ ((r as u64) << 40)),
                len,
                op,
            )
        })
        .collect()
}

fn reducing_ops<T: Element>(
    comm: &Communicator,
    seed: u64,
    case: &mut u64,
    lens: &[usize],
) -> Result<(), String> {
    let (rank, world) = (comm.rank(), comm.world_size());
    for &len in lens {
        for op in ReduceOp::ALL {
            *case += 1;
            let ins = inputs::<T>(seed, *case, world, len, op);
            let reference = reference_reduce(&ins, op);
            let ctx = |what: &str, e: String| {
                format!(
                    "{what} {} p={world} n={len} {op} rank {rank}: {e}",
                    T::DTYPE
                )
            };

            let got = comm
                .all_reduce(ins[rank].clone(), op)
                .wait()
                .map_err(|e| ctx("all_reduce", e.to_string()))?;
            check_close(&got, &reference, world).map_err(|e| ctx("all_reduce", e))?;

            let root = len % world;
            let got = comm
                .reduce(ins[rank].clone(), root, op)
                .wait()
                .map_err(|e| ctx("reduce", e.to_string()))?;
            if rank == root {
                check_close(&got, &reference, world).map_err(|e| ctx("reduce", e))?;
            } else if got != ins[rank] {
                return Err(ctx("reduce", "non-root buffer changed".into()));
            }

            let mine = comm.block_len(len, rank);
            let start: usize = (0..rank).map(|r| comm.block_len(len, r)).sum();
            let (back, got) = comm
                .reduce_scatter(ins[rank].clone(), vec![T::default(); mine], op)
                .wait()
                .map_err(|e| ctx("reduce_scatter", e.to_string()))?;
            check_close(&got, &reference[start..start + mine], world)
                .map_err(|e| ctx("reduce_scatter", e))?;
            if back != ins[rank] {
                return Err(ctx("reduce_scatter", "input changed".into()));
            }
        }
    }
    Ok(())
}

fn moving_ops<T: Element>(
    comm: &Communicator,
    seed: u64,
    case: &mut u64,
    lens: &[usize],
) -> Result<(), String> {
    let (rank, world) = (comm.rank(), comm.world_size());
    for &len in lens {
        *case += 1;
        let ins = inputs::<T>(seed, *case, world, len, ReduceOp::Sum);
        let ctx = |what: &str, e: String| {
            format!("{what} {} p={world} n={len} rank {rank}: {e}", T::DTYPE)
        };

        let root = (len + 1) % world;
        let got = comm
            .broadcast(ins[rank].clone(), root)
            .wait()
            .map_err(|e| ctx("broadcast", e.to_string()))?;
        if got != ins[root] {
            return Err(ctx("broadcast", "differs from root's buffer".into()));
        }

        let (_, got) = comm
            .all_gather(ins[rank].clone(), vec![T::default(); len * world])
            .wait()
            .map_err(|e| ctx("all_gather", e.to_string()))?;
        if got != ins.concat() {
            return Err(ctx(
                "all_gather",
                "not the concatenation in rank order".into(),
            ));
        }

        // Uneven all-gather: rank r contributes (r * 3 + len) % 5 elements
        // (some ranks none), of its input's head.
        let counts: Vec<usize> = (0..world).map(|r| ((r * 3 + len) % 5).min(len)).collect();
        let (_, got) = comm
            .all_gather_v(
                ins[rank][..counts[rank]].to_vec(),
                vec![T::default(); counts.iter().sum()],
                &counts,
            )
            .wait()
            .map_err(|e| ctx("all_gather_v", e.to_string()))?;
        let expected: Vec<T> = (0..world)
            .flat_map(|r| ins[r][..counts[r]].to_vec())
            .collect();
        if got != expected {
            return Err(ctx(
                "all_gather_v",
                "not the uneven blocks in rank order".into(),
            ));
        }

        // Gather and scatter at a root other than broadcast's; other ranks
        // pass an empty buffer where the root's holds every block (odd
        // lengths), or one of the root's length (even).
        let root = (len + 2) % world;
        let unused = |whole: usize| if len % 2 == 1 { 0 } else { whole };
        let out_len = if rank == root {
            len * world
        } else {
            unused(len * world)
        };
        let (back, got) = comm
            .gather(ins[rank].clone(), vec![T::default(); out_len], root)
            .wait()
            .map_err(|e| ctx("gather", e.to_string()))?;
        if rank == root && got != ins.concat() {
            return Err(ctx("gather", "not the concatenation in rank order".into()));
        }
        if rank != root && got.iter().any(|x| *x != T::default()) {
            return Err(ctx("gather", "a non-root output was written".into()));
        }
        if back != ins[rank] {
            return Err(ctx("gather", "input changed".into()));
        }
        let whole = ins.concat();
        let input = if rank == root {
            whole.clone()
        } else {
            vec![T::default(); unused(whole.len())]
        };
        let (_, got) = comm
            .scatter(input, vec![T::default(); len], root)
            .wait()
            .map_err(|e| ctx("scatter", e.to_string()))?;
        if got != ins[rank] {
            return Err(ctx("scatter", "not the root's block for this rank".into()));
        }

        // A ring shift in one op per rank: send to the next, receive from
        // the previous (with two ranks, both are the other rank).
        if world > 1 {
            let (next, prev) = ((rank + 1) % world, (rank + world - 1) % world);
            let (sent, got) = comm
                .send_recv(ins[rank].clone(), next, vec![T::default(); len], prev)
                .wait()
                .map_err(|e| ctx("send_recv", e.to_string()))?;
            if got != ins[prev] || sent != ins[rank] {
                return Err(ctx("send_recv", "not the previous rank's data".into()));
            }
        }

        // Equal all-to-all: block j of rank i's input lands in block i of rank j's output.
        let a2a: Vec<Vec<T>> = (0..world)
            .map(|r| ins[r].iter().cycle().take(len * world).copied().collect())
            .collect();
        let (_, got) = comm
            .all_to_all(a2a[rank].clone(), vec![T::default(); len * world])
            .wait()
            .map_err(|e| ctx("all_to_all", e.to_string()))?;
        let expected: Vec<T> = (0..world)
            .flat_map(|j| a2a[j][rank * len..(rank + 1) * len].to_vec())
            .collect();
        if got != expected {
            return Err(ctx("all_to_all", "blocks misrouted".into()));
        }

        // Uneven all-to-all: rank i sends (i + j + len) % 4 elements to rank j.
        let count = |i: usize, j: usize| (i + j + len) % 4;
        let send_counts: Vec<usize> = (0..world).map(|j| count(rank, j)).collect();
        let recv_counts: Vec<usize> = (0..world).map(|j| count(j, rank)).collect();
        let payload = |i: usize| -> Vec<T> {
            let total: usize = (0..world).map(|j| count(i, j)).sum();
            random_data(
                &mut Rng::new(seed ^ (*case << 8) ^ i as u64),
                total,
                ReduceOp::Sum,
            )
        };
        let (_, got) = comm
            .all_to_all_v(
                payload(rank),
                &send_counts,
                vec![T::default(); recv_counts.iter().sum()],
                &recv_counts,
            )
            .wait()
            .map_err(|e| ctx("all_to_all_v", e.to_string()))?;
        let expected: Vec<T> = (0..world)
            .flat_map(|j| {
                let from = payload(j);
                let start: usize = (0..rank).map(|k| count(j, k)).sum();
                from[start..start + count(j, rank)].to_vec()
            })
            .collect();
        if got != expected {
            return Err(ctx("all_to_all_v", "blocks misrouted".into()));
        }
    }
    Ok(())
}

pub(crate) fn every_dtype(comm: &Communicator, seed: u64) -> Result<(), String> {
    let lens = lengths(comm.world_size());
    let mut case = 0;
    reducing_ops::<f32>(comm, seed, &mut case, &lens)?;
    reducing_ops::<f64>(comm, seed, &mut case, &lens)?;
    reducing_ops::<f16>(comm, seed, &mut case, &lens)?;
    reducing_ops::<bf16>(comm, seed, &mut case, &lens)?;
    reducing_ops::<i32>(comm, seed, &mut case, &lens)?;
    reducing_ops::<i64>(comm, seed, &mut case, &lens)?;
    reducing_ops::<u8>(comm, seed, &mut case, &lens)?;
    moving_ops::<f32>(comm, seed, &mut case, &lens)?;
    moving_ops::<f64>(comm, seed, &mut case, &lens)?;
    moving_ops::<f16>(comm, seed, &mut case, &lens)?;
    moving_ops::<bf16>(comm, seed, &mut case, &lens)?;
    moving_ops::<i32>(comm, seed, &mut case, &lens)?;
    moving_ops::<i64>(comm, seed, &mut case, &lens)?;
    moving_ops::<u8>(comm, seed, &mut case, &lens)?;
    comm.barrier().wait().map_err(|e| e.to_string())?;
    Ok(())
}

/// Every collective and reduce op on `T` at lengths of the caller's
/// choosing (large ones, whose frames take paths small ones never do).
pub(crate) fn every_op_at<T: Element>(
    comm: &Communicator,
    seed: u64,
    lens: &[usize],
) -> Result<(), String> {
    let mut case = 0;
    reducing_ops::<T>(comm, seed, &mut case, lens)?;
    moving_ops::<T>(comm, seed, &mut case, lens)?;
    comm.barrier().wait().map_err(|e| e.to_string())?;
    Ok(())
}
