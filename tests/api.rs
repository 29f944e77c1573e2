//! The communicator's behaviour beyond arithmetic: overlapping ops, await
//! order, sub-groups, executors, drop semantics, argument checks, timeouts
//! and failure reporting.

mod common;

use common::{local_group, on_all};
use ringwire::{Communicator, Error, OpKind, ReduceOp};
use std::time::{Duration, Instant};

#[test]
fn two_ops_in_flight_complete_in_any_await_order() {
    let (_store, comms) = local_group(3, |b| b);
    let results = on_all(&comms, |c| {
        let r = c.rank() as f32;
        let first = c.all_reduce(vec![r; 1000], ReduceOp::Sum);
        let second = c.all_reduce(vec![r + 1.0; 300_000], ReduceOp::Max);
        let third = c.broadcast(vec![r as i64; 17], 2);
        // Await the last first.
        let third = third.wait().unwrap();
        let second = second.wait().unwrap();
        let first = first.wait().unwrap();
        (first[0], second[299_999], third[0])
    });
    for (sum, max, root) in results {
        assert_eq!(sum, 3.0);
        assert_eq!(max, 3.0);
        assert_eq!(root, 2);
    }
}

#[test]
fn pending_works_under_tokio_and_block_on() {
    let (_store, comms) = local_group(2, |b| b);
    let results = on_all(&comms, |c| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let a = rt.block_on(async { c.all_reduce(vec![1u8; 5], ReduceOp::Sum).await.unwrap() });
        let b = futures::executor::block_on(c.all_reduce(vec![2i32; 5], ReduceOp::Prod)).unwrap();
        let mut p = c.barrier();
        // Poll with a short timeout until the barrier completes.
        let barrier = loop {
            if let Some(r) = p.wait_timeout(Duration::from_millis(1)) {
                break r;
            }
        };
        barrier.unwrap();
        (a, b)
    });
    for (a, b) in results {
        assert_eq!(a, vec![2u8; 5]);
        assert_eq!(b, vec![4i32; 5]);
    }
}

#[test]
fn accepts_vec_buffer_bytesmut_and_slices() {
    let (_store, comms) = local_group(2, |b| b);
    on_all(&comms, |c| {
        let mut buf = c.alloc::<f64>(4);
        buf.copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
        let buf = c.all_reduce(buf, ReduceOp::Sum).wait().unwrap();
        assert_eq!(&buf[..], &[2.0, 4.0, 6.0, 8.0]);
        let bytes = bytes::BytesMut::from(&[7u8, 8, 9][..]);
        let bytes = c.all_reduce(bytes, ReduceOp::Sum).wait().unwrap();
        assert_eq!(&bytes[..], &[14, 16, 18]);
        let mut slice = [1i64, 2, 3];
        c.all_reduce_slice(&mut slice, ReduceOp::Max).unwrap();
        assert_eq!(slice, [1, 2, 3]);
        let mut out = [0i64; 6];
        c.all_gather_slice(&slice, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3, 1, 2, 3]);
        // Rank 1 gathers; rank 0's output is empty and left so.
        let mut gathered = vec![0i64; if c.rank() == 1 { 6 } else { 0 }];
        let mine = [c.rank() as i64 + 5; 3];
        c.gather_slice(&mine, &mut gathered, 1).unwrap();
        if c.rank() == 1 {
            assert_eq!(gathered, [5, 5, 5, 6, 6, 6]);
        }
        let mut block = [0i64; 3];
        c.scatter_slice(&out, &mut block, 0).unwrap();
        assert_eq!(block, [1, 2, 3]);
        let boxed: Box<[u8]> = vec![c.rank() as u8; 2].into_boxed_slice();
        let boxed = c.broadcast(boxed, 1).wait().unwrap();
        assert_eq!(&boxed[..], &[1, 1]);
    });
}

#[test]
fn all_gather_v_takes_uneven_blocks_in_place_and_queued_and_checks_its_arguments() {
    let (_store, comms) = local_group(3, |b| b.chunk_bytes(64));
    on_all(&comms, |c| {
        let counts = [2usize, 0, 37];
        let mine: Vec<i32> = (0..counts[c.rank()])
            .map(|i| (100 * c.rank() + i) as i32)
            .collect();
        let expected: Vec<i32> = (0..3)
            .flat_map(|r| (0..counts[r]).map(move |i| (100 * r + i) as i32))
            .collect();
        // In place (nothing queued), then behind a queued op, on copies.
        let mut out = vec![0i32; 39];
        c.all_gather_v_slice(&mine, &mut out, &counts).unwrap();
        assert_eq!(out, expected);
        let queued = c.all_reduce(vec![1u8; 4], ReduceOp::Sum);
        let mut again = vec![0i32; 39];
        c.all_gather_v_slice(&mine, &mut again, &counts).unwrap();
        assert_eq!(again, expected, "all_gather_v_slice behind an op");
        assert_eq!(queued.wait().unwrap(), [3; 4]);
        let (_, owned) = c
            .all_gather_v(mine.clone(), vec![0i32; 39], &counts)
            .wait()
            .unwrap();
        assert_eq!(owned, expected);
        // Bad arguments fail at once, here only, and fail nothing else.
        for (counts, input, output) in [
            (vec![2, 0], mine.len(), 39),         // one count per rank
            (vec![2, 0, 37], mine.len() + 1, 40), // input is not my count
            (vec![2, 0, 37], mine.len(), 38),     // output is not the sum
        ] {
            let e = c
                .all_gather_v(vec![0i32; input], vec![0i32; output], &counts)
                .wait()
                .unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        }
        c.barrier().wait().unwrap();
    });
}

#[test]
fn ranks_that_disagree_on_all_gather_v_counts_fail_instead_of_hanging() {
    let (_store, comms) = local_group(2, |b| b.timeout(Duration::from_secs(20)));
    let start = Instant::now();
    let results = on_all(&comms, |c| {
        // Rank 0 expects 2 elements from rank 1, which sends 4; rank 1
        // gets the 3 it expects from rank 0, and may finish first.
        let counts = if c.rank() == 0 { [3, 2] } else { [3, 4] };
        let total = counts.iter().sum();
        let op = c
            .all_gather_v(vec![1i32; counts[c.rank()]], vec![0i32; total], &counts)
            .wait()
            .map(|_| ());
        // Either way the communicator is failed now, on both ranks.
        (op, c.barrier().wait())
    });
    assert!(start.elapsed() < Duration::from_secs(10), "{results:?}");
    let (rank0, _) = &results[0];
    let e = rank0.as_ref().unwrap_err();
    assert!(matches!(e, Error::Mismatch { .. }), "{e}");
    for (rank, (op, later)) in results.iter().enumerate() {
        if let Err(e) = op {
            assert!(
                matches!(e, Error::Mismatch { .. } | Error::Aborted { .. }),
                "rank {rank}: {e}"
            );
        }
        assert!(
            later.is_err(),
            "rank {rank}: the communicator must be failed"
        );
    }
}

#[test]
fn send_and_recv_pair_in_call_order() {
    let (_store, comms) = local_group(3, |b| b.chunk_bytes(64));
    on_all(&comms, |c| match c.rank() {
        0 => {
            let a = c.send((0..100u32).map(|x| x as i32).collect::<Vec<_>>(), 2);
            let b = c.send(vec![5.5f32; 3], 2);
            a.wait().unwrap();
            b.wait().unwrap();
            let back = c.recv(vec![0u8; 4], 2).wait().unwrap();
            assert_eq!(back, vec![9u8; 4]);
        }
        2 => {
            let a = c.recv(vec![0i32; 100], 0).wait().unwrap();
            assert_eq!(a, (0..100).collect::<Vec<_>>());
            let b = c.recv(vec![0f32; 3], 0).wait().unwrap();
            assert_eq!(b, vec![5.5; 3]);
            c.send(vec![9u8; 4], 0).wait().unwrap();
        }
        _ => {}
    });
}

#[test]
fn split_makes_independent_groups_that_run_concurrently() {
    let (_store, comms) = local_group(5, |b| b);
    let results = on_all(&comms, |c| {
        // Even and odd ranks; rank 4 opts out. Key reverses the order.
        let color = if c.rank() == 4 {
            None
        } else {
            Some((c.rank() % 2) as u32)
        };
        let sub = c.split(color, -(c.rank() as i64)).unwrap();
        let Some(sub) = sub else {
            // The parent still works for everyone afterwards.
            return (
                None,
                c.all_reduce(vec![1i32], ReduceOp::Sum).wait().unwrap()[0],
            );
        };
        assert_eq!(sub.world_size(), 2);
        // Both groups run many ops at once, sharing the same links.
        let pending: Vec<_> = (0..20)
            .map(|i| sub.all_reduce(vec![c.rank() as i32 + i; 10_000], ReduceOp::Sum))
            .collect();
        let sums: Vec<i32> = pending.into_iter().map(|p| p.wait().unwrap()[0]).collect();
        let gathered = sub
            .all_gather(vec![c.rank() as i32], vec![0; 2])
            .wait()
            .unwrap()
            .1;
        let parent = c.all_reduce(vec![1i32], ReduceOp::Sum).wait().unwrap()[0];
        (Some((sub.rank(), sums, gathered)), parent)
    });
    for (rank, (sub, parent)) in results.into_iter().enumerate() {
        assert_eq!(parent, 5);
        if let Some((sub_rank, sums, gathered)) = sub {
            let (a, b) = if rank % 2 == 0 { (0, 2) } else { (1, 3) };
            // Key = -rank: the higher parent rank comes first.
            assert_eq!(gathered, vec![b, a]);
            assert_eq!(sub_rank, if rank == b as usize { 0 } else { 1 });
            for (i, s) in sums.into_iter().enumerate() {
                assert_eq!(s, a + b + 2 * i as i32);
            }
        }
    }
}

#[test]
fn shutdown_finishes_what_was_queued_and_refuses_the_rest() {
    let (_store, comms) = local_group(2, |b| b);
    on_all(&comms, |c| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let queued: Vec<_> = (0..4)
            .map(|i| c.all_reduce(vec![i as f32; 100_000], ReduceOp::Sum))
            .collect();
        let clone = c.clone();
        rt.block_on(async { c.shutdown().await }).unwrap();
        // Everything submitted before it ran to the end on both ranks.
        for (i, op) in queued.into_iter().enumerate() {
            assert!(op.is_completed(), "op {i} was still running");
            assert_eq!(op.wait().unwrap()[99_999], 2.0 * i as f32);
        }
        // Later ops fail at once, queued or blocking, on every clone.
        for later in [
            clone
                .all_reduce(vec![1f32; 8], ReduceOp::Sum)
                .wait()
                .map(|_| ()),
            clone.all_reduce_slice(&mut [1f32; 8], ReduceOp::Sum),
            c.barrier().wait(),
        ] {
            assert!(matches!(later, Err(Error::ShutDown(_))), "{later:?}");
        }
        assert!(
            c.shutdown().is_completed(),
            "a second shutdown waits for nothing"
        );
        let record = c.flight_record();
        assert_eq!(
            record.last().unwrap().state,
            ringwire::OpState::Failed("not run: communicator shut down".into())
        );
    });
}

#[test]
fn dropped_pending_neither_leaks_nor_desyncs() {
    let (_store, comms) = local_group(2, |b| b);
    let results = on_all(&comms, |c| {
        for i in 0..10 {
            drop(c.all_reduce(vec![i as f32; 200_000], ReduceOp::Sum));
        }
        c.all_reduce(vec![1.0f32; 8], ReduceOp::Sum).wait().unwrap()
    });
    for r in results {
        assert_eq!(r, vec![2.0; 8]);
    }
    assert_eq!(comms[0].stats().ops, 11);
}

/// A caller's buffer type whose `as_mut_slice` panics.
struct Exploding(Vec<f32>);

impl ringwire::CollectiveBuffer<f32> for Exploding {
    fn as_slice(&self) -> &[f32] {
        &self.0
    }
    fn as_mut_slice(&mut self) -> &mut [f32] {
        panic!("this buffer explodes")
    }
}

/// A caller's buffer type whose `Drop` panics.
struct PanicsOnDrop(Vec<f32>);

impl ringwire::CollectiveBuffer<f32> for PanicsOnDrop {
    fn as_slice(&self) -> &[f32] {
        &self.0
    }
    fn as_mut_slice(&mut self) -> &mut [f32] {
        &mut self.0
    }
}

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        panic!("this buffer panics when dropped")
    }
}

#[test]
fn a_detached_buffer_that_panics_when_dropped_leaves_the_executor_running() {
    let c = Communicator::builder()
        .rank(0)
        .world_size(1)
        .build()
        .wait()
        .unwrap();
    // Detached: the executor runs it and then drops the buffer, unless
    // the op finished before the handle was dropped: then the buffer's
    // panic is this thread's, as any value's would be.
    let pending = c.all_reduce(PanicsOnDrop(vec![1.0; 1 << 16]), ReduceOp::Sum);
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(pending)));
    // An op nobody blocks on still runs: the executor is alive.
    let until = Instant::now() + Duration::from_secs(20);
    let op = c.all_reduce(vec![2.0f32; 1 << 16], ReduceOp::Sum);
    while !op.is_completed() {
        assert!(Instant::now() < until, "the executor died");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(op.wait().unwrap()[0], 2.0);
}

#[test]
fn an_op_that_panics_fails_the_communicator_on_every_rank() {
    // One rank's op panics inside the op, at the communicator's first op
    // (no link made yet). It must come back as an error (not a panic in
    // `wait`, nor "shut down"), fail that rank's communicator, and abort
    // the others' op at once rather than leave them to their timeout: the
    // rank dials those above it to tell them, those below dial it.
    for bad in 0..3 {
        let (_store, comms) = local_group(3, |b| b.timeout(Duration::from_secs(20)));
        let errors = on_all(&comms, |c| {
            let started = Instant::now();
            let err = if c.rank() == bad {
                let op = c.all_reduce(Exploding(vec![1.0; 1000]), ReduceOp::Sum);
                op.wait().map(|_| ()).unwrap_err()
            } else {
                let op = c.all_reduce(vec![1.0f32; 1000], ReduceOp::Sum);
                op.wait().map(|_| ()).unwrap_err()
            };
            let waited = started.elapsed();
            assert!(
                waited < Duration::from_secs(10),
                "rank {}: waited for the timeout",
                c.rank()
            );
            (err, c.barrier().wait().unwrap_err())
        });
        for (rank, (err, later)) in errors.iter().enumerate() {
            assert!(
                err.to_string().contains("this buffer explodes"),
                "bad {bad}, rank {rank}: {err}"
            );
            if rank == bad {
                assert!(matches!(err, Error::Internal { .. }), "{err}");
                assert!(matches!(later, Error::Failed { .. }), "{later}");
            }
        }
    }
}

#[test]
fn small_ops_nobody_blocks_on_still_run() {
    // A blocked waiter runs small ops itself; these never block: rank 0
    // only polls `is_completed`, rank 1 drops its handles and then only
    // watches the stats, so the executor must start every op on its own.
    let (_store, comms) = local_group(2, |b| b);
    on_all(&comms, |c| {
        let until = Instant::now() + Duration::from_secs(60);
        for i in 0..20 {
            let op = c.all_reduce(vec![i as f32; 4], ReduceOp::Sum);
            if c.rank() == 0 {
                while !op.is_completed() {
                    assert!(Instant::now() < until, "op {i} never ran");
                    std::thread::yield_now();
                }
                assert_eq!(op.wait().unwrap(), vec![2.0 * i as f32; 4]);
            } else {
                drop(op);
                while c.stats().ops < i + 1 {
                    assert!(Instant::now() < until, "op {i} never ran");
                    std::thread::sleep(Duration::from_micros(100));
                }
            }
        }
    });
}

#[test]
fn bad_arguments_fail_at_once_with_the_op_named() {
    let (_store, comms) = local_group(1, |b| b);
    let c = &comms[0];
    let e = c.all_gather(vec![1u8; 3], vec![0u8; 2]).wait().unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidArgument {
                op: OpKind::AllGather,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("must have input length 3"), "{e}");
    let e = c.broadcast(vec![1u8], 3).wait().unwrap_err();
    assert!(e.to_string().contains("root 3"), "{e}");
    let e = c.send(vec![1u8], 0).wait().unwrap_err();
    assert!(e.to_string().contains("another rank"), "{e}");
    // A misuse does not fail the communicator.
    assert_eq!(
        c.all_reduce(vec![4u8], ReduceOp::Sum).wait().unwrap(),
        vec![4]
    );
}

/// A gather's output and a scatter's input must hold every block at the
/// root; elsewhere they are unused, and may be empty or of the root's
/// length. Each rank checks its own arguments before any frame moves.
#[test]
fn gather_and_scatter_check_the_roots_buffer() {
    let (_store, comms) = local_group(2, |b| b);
    on_all(&comms, |c| {
        let root = 1;
        let e = c
            .gather(vec![1u8; 3], vec![0u8; 5], root)
            .wait()
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::InvalidArgument {
                    op: OpKind::Gather,
                    ..
                }
            ),
            "{e}"
        );
        let want = match c.rank() == root {
            true => "at the root must have input length 3 x world size 2 = 6",
            false => "must be empty or have the root's input length 3 x world size 2 = 6",
        };
        assert!(e.to_string().contains(want), "{e}");
        let e = c
            .scatter(vec![1u8; 7], vec![0u8; 3], root)
            .wait()
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::InvalidArgument {
                    op: OpKind::Scatter,
                    ..
                }
            ),
            "{e}"
        );
        let e = c.gather(vec![1u8; 3], vec![0u8; 6], 2).wait().unwrap_err();
        assert!(e.to_string().contains("root 2"), "{e}");
        // The root may not pass an empty buffer (unless the blocks are).
        let empty_at_root = c.scatter(Vec::<u8>::new(), vec![0u8; 3], c.rank()).wait();
        assert!(empty_at_root.is_err());
        // None of it failed the communicator.
        let (_, got) = c
            .gather(vec![c.rank() as u8; 2], vec![0u8; 4], root)
            .wait()
            .unwrap();
        if c.rank() == root {
            assert_eq!(got, [0, 0, 1, 1]);
        }
        // Queued behind an op (on copies, not in place), the blocking forms
        // still write only what the op gives each rank.
        let queued = c.all_reduce(vec![1u8; 8], ReduceOp::Sum);
        let mut gathered = [7u8; 4];
        c.gather_slice(&[c.rank() as u8; 2], &mut gathered, root)
            .unwrap();
        let want = if c.rank() == root {
            [0, 0, 1, 1]
        } else {
            [7; 4]
        };
        assert_eq!(gathered, want, "gather_slice behind an op");
        let queued_too = c.all_reduce(vec![1u8; 8], ReduceOp::Sum);
        let mut block = [9u8; 2];
        c.scatter_slice(&[5, 6, 7, 8], &mut block, root).unwrap();
        let first = 5 + 2 * c.rank() as u8;
        assert_eq!(block, [first, first + 1], "scatter_slice behind an op");
        assert_eq!(queued.wait().unwrap(), [2; 8]);
        assert_eq!(queued_too.wait().unwrap(), [2; 8]);
    });
}

#[test]
fn a_missing_peer_times_out_naming_op_seq_and_rank() {
    let (_store, comms) = local_group(2, |b| b);
    let c = comms[0].with_timeout(Duration::from_millis(300));
    let start = Instant::now();
    // Rank 1 never calls: rank 0 must give up within its timeout.
    let e = c
        .all_reduce(vec![1.0f32; 4], ReduceOp::Sum)
        .wait()
        .unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(10));
    let msg = e.to_string();
    assert!(matches!(e, Error::Timeout { peer: 1, .. }), "{msg}");
    assert!(
        msg.contains("all_reduce #1") && msg.contains("rank 1"),
        "{msg}"
    );
    // The communicator is now failed: further ops say so at once.
    let e = c.barrier().wait().unwrap_err();
    assert!(matches!(e, Error::Failed { .. }), "{e}");
    assert!(c.failure().is_some());
}

#[test]
fn mismatched_sizes_are_reported_naming_both_sides() {
    let (_store, comms) = local_group(2, |b| b.timeout(Duration::from_secs(5)));
    let errs = on_all(&comms, |c| {
        let n = 1000 - c.rank(); // rank 0: 1000, rank 1: 999
        c.all_reduce(vec![1.0f32; n], ReduceOp::Sum)
            .wait()
            .unwrap_err()
            .to_string()
    });
    for e in &errs {
        assert!(
            e.contains("all_reduce #1") && e.contains("1000") && e.contains("999"),
            "{e}"
        );
    }
}

#[test]
fn a_lost_peer_fails_the_op_instead_of_hanging() {
    let (_store, mut comms) = local_group(2, |b| b.timeout(Duration::from_secs(20)));
    let c0 = comms.remove(0);
    // Establish the link, then close rank 1 entirely.
    on_all(&[c0.clone(), comms[0].clone()], |c| {
        c.barrier().wait().unwrap()
    });
    drop(comms);
    let start = Instant::now();
    let e = c0
        .all_reduce(vec![1u8; 10], ReduceOp::Sum)
        .wait()
        .unwrap_err();
    eprintln!("lost peer noticed after {:?}: {e}", start.elapsed());
    assert!(matches!(e, Error::PeerLost { peer: 1, .. }), "{e}");
}

#[test]
fn world_of_one_needs_no_store() {
    let c = Communicator::builder()
        .rank(0)
        .world_size(1)
        .build()
        .wait()
        .unwrap();
    assert_eq!(
        c.all_reduce(vec![3u8], ReduceOp::Avg).wait().unwrap(),
        vec![3]
    );
    c.barrier().wait().unwrap();
    let s = c.stats();
    assert_eq!(s.ops, 2);
    // A rank outside the communicator has no block.
    assert_eq!((c.block_len(5, 0), c.block_len(5, 1)), (5, 0));
    // Nobody said where the process sits on its host...
    assert_eq!((c.local_rank(), c.local_world_size()), (None, None));
    // ...until the builder (or a launcher) does; split communicators share it.
    let c = Communicator::builder()
        .rank(0)
        .world_size(1)
        .local_ranks(0, 1)
        .build()
        .wait()
        .unwrap();
    let sub = c.split(Some(0), 0).unwrap().expect("in");
    assert_eq!(
        (sub.local_rank(), sub.local_world_size()),
        (Some(0), Some(1))
    );
}

/// Every other test of this file, again on the portable transport (the
/// default run uses the io_uring engine where it works).
#[test]
fn on_the_portable_transport_too() {
    common::rerun_on_portable("on_the_portable_transport_too");
}

#[test]
fn communicators_run_on_the_transport_asked_for() {
    let (_store, comms) = local_group(2, |b| b);
    for c in &comms {
        assert_eq!(c.transport_name(), common::expected_transport());
    }
}

#[test]
fn local_ranks_link_over_unix_sockets_unless_told_tcp() {
    let (_store, comms) = local_group(3, |b| b);
    assert_eq!(comms[0].link_kind(1), None, "links are made on first use");
    on_all(&comms, |c| c.barrier().wait().unwrap());
    let want = common::expected_local_link();
    for (rank, c) in comms.iter().enumerate() {
        for peer in (0..3).filter(|&p| p != rank) {
            assert_eq!(c.link_kind(peer), Some(want), "rank {rank} to {peer}");
        }
    }
    let (_store, comms) = local_group(2, |b| b.local_links(ringwire::LocalLinks::Tcp));
    on_all(&comms, |c| c.barrier().wait().unwrap());
    assert_eq!(comms[0].link_kind(1), Some("tcp"));
    assert_eq!(comms[1].link_kind(0), Some("tcp"));
    assert_eq!(comms[0].link_kind(5), None, "not a rank");
}

/// TCP links of the io_uring engine carry large payloads on two one-way
/// lanes (decision 0018); `tcp_lanes(false)`, Unix links and the portable
/// transport have none. Every test file's TCP rerun runs its collectives
/// over lanes; tests/security.rs checks them with a job secret.
#[test]
fn tcp_links_of_the_engine_have_lanes_unless_told_not_to() {
    for lanes in [true, false] {
        let (_store, comms) = local_group(2, |b| {
            b.local_links(ringwire::LocalLinks::Tcp).tcp_lanes(lanes)
        });
        assert!(!comms[0].link_has_lanes(1), "links are made on first use");
        // Large enough that its frames go on the lanes (1 MiB and up).
        let n = 1 << 20;
        let sums = on_all(&comms, |c| {
            c.all_reduce(vec![c.rank() as f32 + 1.0; n], ReduceOp::Sum)
                .wait()
                .unwrap()
        });
        assert!(
            sums.iter()
                .all(|s| s.len() == n && s.iter().all(|&v| v == 3.0))
        );
        let engine = comms[0].transport_name() == "uring";
        for (rank, c) in comms.iter().enumerate() {
            assert_eq!(
                c.link_has_lanes(1 - rank),
                lanes && engine,
                "rank {rank}, lanes asked: {lanes}, transport {}",
                c.transport_name()
            );
        }
    }
    let (_store, comms) = local_group(2, |b| b);
    on_all(&comms, |c| c.barrier().wait().unwrap());
    let tcp = common::expected_local_link() == "tcp" && comms[0].transport_name() == "uring";
    assert_eq!(comms[0].link_has_lanes(1), tcp, "unix links have no lanes");
}
