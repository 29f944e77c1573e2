//! Two-level collectives across hosts (issue 33, part 4; decision 0033):
//! ranks told they sit on different hosts (`Builder::host_id`, as
//! `NCCL_HOSTID`) run all-reduce as a reduce-scatter within each host, an
//! all-reduce of each local rank's shard across hosts and an all-gather
//! within each host; reduce-scatter within each host, then across;
//! all-gather across hosts, then within each; broadcast across hosts among
//! the root's local rank's group, then within each host. Checked against
//! the reference for every dtype and reduce op at 2 hosts of 2 and 3 ranks
//! and 3 hosts of 2 (also placed cyclically), lengths that do not divide,
//! whole and in pipelined pieces; that the path ran (the stats count the
//! op as two-level, with its groups' bytes); that the cost model keeps
//! small ops flat; and that a mismatch inside one level fails every rank,
//! none left waiting.
//! (Real hosts, network namespaces joined by veth: tests/netns.)

mod common;

use common::{local_group_per_rank, on_all, seed};
use ringwire::testing::{Rng, check_close, random_data, reference_reduce};
use ringwire::{Communicator, Error, ReduceOp, TwoLevel};
use std::time::Duration;

/// Rank `rank`'s block of `len` elements over `p` ranks (the first
/// `len % p` one longer), as reduce-scatter cuts them.
fn block(len: usize, p: usize, rank: usize) -> std::ops::Range<usize> {
    let (base, extra) = (len / p, len % p);
    let start = rank * base + rank.min(extra);
    start..start + base + usize::from(rank < extra)
}

/// `hosts` hosts of `per_host` ranks (ranks 0..per_host on the first).
fn hosts_of(
    hosts: usize,
    per_host: usize,
    mode: TwoLevel,
) -> (ringwire::store::StoreServer, Vec<Communicator>) {
    local_group_per_rank(hosts * per_host, |rank, b| {
        b.host_id(format!("host-{}", rank / per_host))
            .two_level(mode)
    })
}

/// What `f`'s op did: the bytes this rank sent for it (its groups', when
/// it ran in two levels) and how many ops ran in two levels (0 or 1).
fn counted(comm: &Communicator, f: impl FnOnce()) -> (u64, u64) {
    let before = comm.stats();
    f();
    let after = comm.stats();
    (
        after.bytes_sent - before.bytes_sent,
        after.two_level_ops - before.two_level_ops,
    )
}

fn every_dtype_and_op_in_two_levels(hosts: usize, per_host: usize) {
    every_dtype_and_op_in_two_levels_placed(hosts, per_host, false)
}

/// As above; `interleaved`: rank r on host r % hosts (Slurm's cyclic
/// placement), so groups and blocks do not follow rank order.
fn every_dtype_and_op_in_two_levels_placed(hosts: usize, per_host: usize, interleaved: bool) {
    let seed = seed();
    let (_store, comms) = match interleaved {
        false => hosts_of(hosts, per_host, TwoLevel::Always),
        true => local_group_per_rank(hosts * per_host, |rank, b| {
            b.host_id(format!("host-{}", rank % hosts))
                .two_level(TwoLevel::Always)
        }),
    };
    let results = on_all(&comms, |c| {
        // Every collective (the others run flat), every dtype and op.
        common::sweep::every_dtype(c, seed)?;
        let (rank, p) = (c.rank(), c.world_size());
        // Whole (one piece), and in 2 and 3 pieces of about 4 MiB,
        // pipelined, lengths that divide neither by pieces nor by ranks.
        let pipelined = [(9 << 20) / 4 + 5, (13 << 20) / 4 + 1];
        for len in [p * 1000 + 1, 70_000].into_iter().chain(pipelined) {
            let ops = match len < 1 << 20 {
                true => &ReduceOp::ALL[..],
                false => &[ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max][..],
            };
            for &op in ops {
                let ins: Vec<Vec<f32>> = (0..p)
                    .map(|r| {
                        random_data(&mut Rng::new(seed ^ (r as u64) << 9 ^ len as u64), len, op)
                    })
                    .collect();
                let reference = reference_reduce(&ins, op);
                let mut got = ins[rank].clone();
                let (sent, two) = counted(c, || c.all_reduce_slice(&mut got, op).unwrap());
                check_close(&got, &reference, p).map_err(|e| format!("n={len} {op}: {e}"))?;
                if two != 1 || sent == 0 {
                    return Err(format!("n={len} {op}: {two} two-level ops, {sent} bytes"));
                }
            }
        }
        // Reduce-scatter (blocks padded and reordered host-major) and
        // all-gather (across hosts first, then reordered into rank order),
        // lengths that do not divide by the ranks.
        // 3 MiB runs whole; from 8 MiB, in pipelined pieces.
        for len in [p * 1000 + 1, 70_001, (9 << 20) / 4 + 7] {
            for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max] {
                let ins: Vec<Vec<f32>> = (0..p)
                    .map(|r| {
                        random_data(&mut Rng::new(seed ^ (r as u64) << 7 ^ len as u64), len, op)
                    })
                    .collect();
                let reference = reference_reduce(&ins, op);
                let mine = &reference[block(len, p, rank)];
                let mut got = vec![0f32; mine.len()];
                let (sent, two) = counted(c, || {
                    c.reduce_scatter_slice(&ins[rank], &mut got, op).unwrap()
                });
                check_close(&got, mine, p)
                    .map_err(|e| format!("reduce_scatter n={len} {op}: {e}"))?;
                if two != 1 || sent == 0 {
                    return Err(format!(
                        "reduce_scatter n={len}: {two} two-level ops, {sent} bytes"
                    ));
                }
            }
            let each = len / p + 1;
            let ins: Vec<Vec<f32>> = (0..p)
                .map(|r| {
                    random_data(
                        &mut Rng::new(seed ^ (r as u64) << 5 ^ len as u64),
                        each,
                        ReduceOp::Sum,
                    )
                })
                .collect();
            let mut got = vec![0f32; each * p];
            let (sent, two) = counted(c, || c.all_gather_slice(&ins[rank], &mut got).unwrap());
            if got != ins.concat() {
                return Err(format!("all_gather of {each} per rank: wrong result"));
            }
            if two != 1 || sent == 0 {
                return Err(format!(
                    "all_gather of {each}: {two} two-level ops, {sent} bytes"
                ));
            }
        }
        // Broadcast from every root: across hosts among the root's local
        // rank's group, then within each host.
        for root in 0..p {
            for len in [1, 70_001] {
                let data = random_data(
                    &mut Rng::new(seed ^ root as u64 ^ len as u64),
                    len,
                    ReduceOp::Sum,
                );
                let mut got = match rank == root {
                    true => data.clone(),
                    false => vec![0f32; len],
                };
                let (_, two) = counted(c, || c.broadcast_slice(&mut got, root).unwrap());
                if got != data {
                    return Err(format!("broadcast of {len} from {root}: wrong result"));
                }
                if two != 1 {
                    return Err(format!("broadcast from {root}: {two} two-level ops"));
                }
            }
        }
        Ok::<_, String>(())
    });
    for (rank, r) in results.into_iter().enumerate() {
        r.unwrap_or_else(|e| panic!("{hosts} hosts of {per_host}, rank {rank}: {e}"));
    }
}

#[test]
fn two_hosts_of_two_ranks() {
    every_dtype_and_op_in_two_levels(2, 2);
}

#[test]
fn two_hosts_of_three_ranks() {
    every_dtype_and_op_in_two_levels(2, 3);
}

#[test]
fn three_hosts_of_two_ranks() {
    every_dtype_and_op_in_two_levels(3, 2);
}

#[test]
fn three_hosts_of_two_ranks_placed_cyclically() {
    every_dtype_and_op_in_two_levels_placed(3, 2, true);
}

#[test]
fn the_cost_model_keeps_small_ops_flat_and_runs_large_ones_in_two_levels() {
    let (_store, comms) = hosts_of(2, 2, TwoLevel::Auto);
    let two_level = on_all(&comms, |c| {
        let (_, small) = counted(c, || {
            c.all_reduce_slice(&mut [1.0f32; 2], ReduceOp::Sum).unwrap()
        });
        let mut large = vec![1.0f32; 4 << 20];
        let (sent, big) = counted(c, || c.all_reduce_slice(&mut large, ReduceOp::Sum).unwrap());
        assert!(large.iter().all(|&x| x == 4.0));
        // Its groups' bytes count as its own: at least the half of its
        // buffer it sends within its host.
        assert!(sent >= 8 << 20, "{sent}");
        (small, big)
    });
    for (rank, (small, large)) in two_level.into_iter().enumerate() {
        assert_eq!(small, 0, "rank {rank}: an 8-byte all-reduce runs flat");
        assert_eq!(large, 1, "rank {rank}: a 16 MiB one runs in two levels");
    }
    // Told never, the same 16 MiB runs flat.
    let (_store, comms) = hosts_of(2, 2, TwoLevel::Never);
    for (_, two) in on_all(&comms, |c| {
        counted(c, || {
            c.all_reduce_slice(&mut vec![1.0f32; 4 << 20], ReduceOp::Sum)
                .unwrap()
        })
    }) {
        assert_eq!(two, 0);
    }
}

#[test]
fn hosts_of_different_sizes_run_flat() {
    // 3 ranks on one host, 1 on the other: no grid.
    let (_store, comms) = local_group_per_rank(4, |rank, b| {
        b.host_id(if rank < 3 { "a" } else { "b" })
            .two_level(TwoLevel::Always)
    });
    for (_, two) in on_all(&comms, |c| {
        let mut data = vec![c.rank() as f32; 5000];
        let done = counted(c, || c.all_reduce_slice(&mut data, ReduceOp::Sum).unwrap());
        assert!(data.iter().all(|&x| x == 6.0));
        done
    }) {
        assert_eq!(two, 0);
    }
}

/// Rank 0 passes a different length: its host's reduce-scatter and its
/// shard's cross-host all-reduce see the mismatch, and every rank's op
/// ends with an error well before the timeout. The ranks of the other
/// host and local rank (3 of 2 x 2) wait in a group rank 0 is not in:
/// only the abort of the parent, nested into the groups, reaches them.
#[test]
fn a_mismatch_in_one_level_fails_every_rank() {
    let timeout = Duration::from_secs(20);
    let (_store, comms) = local_group_per_rank(4, |rank, b| {
        b.host_id(format!("host-{}", rank / 2))
            .two_level(TwoLevel::Always)
            .timeout(timeout)
    });
    let errors = on_all(&comms, |c| {
        let len = if c.rank() == 0 { 1000 } else { 1002 };
        let started = std::time::Instant::now();
        let e = c
            .all_reduce(vec![1.0f32; len], ReduceOp::Sum)
            .wait()
            .expect_err("a mismatched all-reduce fails");
        (e, started.elapsed())
    });
    for (rank, (e, took)) in errors.into_iter().enumerate() {
        eprintln!("rank {rank} after {took:?}: {e}");
        assert!(
            !matches!(e, Error::Timeout { .. }) && took < timeout / 2,
            "rank {rank} waited for its timeout: {e}"
        );
        assert!(
            matches!(e, Error::Mismatch { .. } | Error::Aborted { .. }),
            "rank {rank}: {e}"
        );
        if let Error::Mismatch { ctx, detail, .. } = &e {
            assert_eq!(ctx.op, ringwire::OpKind::AllReduce, "{e}");
            assert!(detail.contains("two-level"), "says which level: {e}");
        }
    }
}

/// The model keeps a broadcast flat where ranks sit on hosts in rank
/// order (the tree's first round is the only one across hosts: it already
/// is two levels) and runs it in two levels where they are placed
/// cyclically (its last round would put two flows on each host's link).
#[test]
fn broadcast_goes_in_two_levels_only_where_ranks_are_placed_across_hosts() {
    for cyclic in [false, true] {
        let (_store, comms) = local_group_per_rank(4, |rank, b| {
            let host = if cyclic { rank % 2 } else { rank / 2 };
            b.host_id(format!("host-{host}"))
                .two_level(TwoLevel::Auto)
                .inter_host_gbps(10.0)
        });
        let two = on_all(&comms, |c| {
            let mut data = vec![c.rank() as f32; 64 << 10];
            let (_, two) = counted(c, || c.broadcast_slice(&mut data, 0).unwrap());
            assert!(data.iter().all(|&x| x == 0.0));
            two
        });
        let want = u64::from(cyclic);
        assert!(two.iter().all(|&t| t == want), "cyclic {cyclic}: {two:?}");
    }
}
