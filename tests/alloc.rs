//! Heap allocations in steady state, counted by a global allocator.
//!
//! A blocking collective on borrowed slices allocates nothing: it runs on
//! the caller's thread, its schedule is built in a list the communicator
//! reuses, ops that must not touch their input work in a reused scratch
//! space, and the transports' data path (frames, sends, receives, the
//! engine's queues, payload buffers) is pooled. An op on owned buffers
//! (`all_reduce(vec)`, queued behind others and awaitable) allocates
//! nothing either once warm: its handle and its queued job share a cell the
//! communicator reuses.

mod common;

use common::{local_group, on_all};
use ringwire::{Communicator, ReduceOp};
use ringwire_uring::CountingAllocator;
use std::cell::RefCell;
use std::sync::{Barrier, Mutex};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::new();

/// The count is process-wide: this file's tests take turns.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Allocations per op, over every thread of the process, while every rank
/// runs `op` (which gets buffers made beforehand) `OPS` times; the fewest
/// over a few rounds, to skip heartbeats and other background work.
fn allocations_per_op(
    comms: &[Communicator],
    len: usize,
    op: impl Fn(&Communicator, &mut [f32], &mut [f32]) + Sync,
) -> u64 {
    const OPS: u64 = 20;
    let lined_up = Barrier::new(comms.len());
    let counts = on_all(comms, |c| {
        let mut buf = vec![1.0f32; len];
        let mut out = vec![0.0f32; len * comms.len()];
        // Warm up: pools, inboxes, queues and the step list reach their size.
        for _ in 0..OPS {
            op(c, &mut buf, &mut out);
        }
        (0..5)
            .map(|_| {
                lined_up.wait();
                let before = ALLOCATOR.count();
                for _ in 0..OPS {
                    op(c, &mut buf, &mut out);
                }
                lined_up.wait();
                ALLOCATOR.count() - before
            })
            .min()
            .unwrap()
    });
    counts.into_iter().min().unwrap() / OPS
}

#[test]
fn blocking_collectives_allocate_nothing_per_op() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // 1 KiB chunks: 4 KiB moves 4 frames per rank, 256 KiB 256 (2 ranks,
    // ring); 8 bytes takes recursive doubling.
    let (_store, comms) = local_group(2, |b| b.chunk_bytes(1024).small_message_bytes(1024));
    let name = comms[0].transport_name();
    for len in [2, 1024, 64 * 1024] {
        let n = allocations_per_op(&comms, len, |c, buf, out| {
            c.all_reduce_slice(buf, ReduceOp::Sum).unwrap();
            c.broadcast_slice(buf, 1).unwrap();
            c.reduce_slice(buf, 0, ReduceOp::Max).unwrap();
            c.all_gather_slice(buf, out).unwrap();
            c.reduce_scatter_slice(out, buf, ReduceOp::Sum).unwrap();
            c.gather_slice(buf, out, 1).unwrap();
            c.scatter_slice(out, buf, 0).unwrap();
            let (ins, outs) = out.split_at_mut(len);
            c.all_to_all_slice(ins, outs).unwrap();
        });
        eprintln!("{name}: {n} allocations per 8 blocking ops of {len} elements");
        assert_eq!(n, 0, "{name}: blocking ops of {len} elements allocate");
    }
}

thread_local! {
    /// Each rank's owned buffers, handed to the ops and taken back.
    static OWNED: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

#[test]
fn owned_buffer_ops_allocate_nothing_per_op() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (_store, comms) = local_group(2, |b| b.chunk_bytes(1024).small_message_bytes(1024));
    let name = comms[0].transport_name();
    for len in [2, 1024, 64 * 1024] {
        let n = allocations_per_op(&comms, len, |c, buf, out| {
            OWNED.with_borrow_mut(|(owned, gathered)| {
                if owned.len() != buf.len() {
                    *owned = buf.to_vec();
                    *gathered = out.to_vec();
                }
                let mut v = std::mem::take(owned);
                v = c.all_reduce(v, ReduceOp::Sum).wait().unwrap();
                v = c.broadcast(v, 1).wait().unwrap();
                v = futures::executor::block_on(c.reduce(v, 0, ReduceOp::Max)).unwrap();
                let (v, g) = c.all_gather(v, std::mem::take(gathered)).wait().unwrap();
                c.barrier().wait().unwrap();
                // Dropped before it is waited for: still runs, still pooled.
                drop(c.barrier());
                *owned = v;
                *gathered = g;
            });
        });
        eprintln!("{name}: {n} allocations per 6 ops on owned buffers of {len} elements");
        assert_eq!(n, 0, "{name}: owned-buffer ops of {len} elements allocate");
    }
}

thread_local! {
    /// Each rank's gradient reducer, kept across steps.
    static REDUCER: RefCell<Option<ringwire::train::GradReducer>> = const { RefCell::new(None) };
}

#[test]
fn a_gradient_reducer_allocates_nothing_per_step_after_the_first() {
    use ringwire::train::{CommHook, GradReducer, Layout, ReducerConfig};
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (_store, comms) = local_group(2, |b| b.chunk_bytes(1024));
    let name = comms[0].transport_name();
    let mut layout = Layout::new();
    let ids: Vec<_> = (0..6)
        .map(|i| layout.push(format!("p{i}"), 300 * (i + 1), ringwire::DType::F32))
        .collect();
    for hook in [CommHook::Avg, CommHook::Bf16Wire] {
        let config = ReducerConfig {
            bucket_cap_bytes: 4096,
            first_bucket_bytes: 2048,
            hook,
            ..ReducerConfig::default()
        };
        // A step: backward writes each gradient (last layer first) and
        // marks it ready; finish; the optimizer reads; zero_grad. The
        // reducer is made in the first (a warm-up step on each rank's
        // thread).
        let n = allocations_per_op(&comms, 1, |c, _, _| {
            REDUCER.with_borrow_mut(|slot| {
                let r = slot.get_or_insert_with(|| {
                    GradReducer::new(c, layout.clone(), config.clone()).unwrap()
                });
                for &id in ids.iter().rev() {
                    r.grad_mut::<f32>(id).unwrap().fill(1.5);
                    r.mark_ready(id).unwrap();
                }
                r.finish().unwrap();
                assert_eq!(r.grad::<f32>(ids[0]).unwrap()[0], 1.5);
                r.zero_grads();
            });
        });
        eprintln!("{name}: {n} allocations per reducer step ({hook:?})");
        assert_eq!(n, 0, "{name}: a reducer step allocates ({hook:?})");
    }
}

/// Every other test of this file, again on the portable transport.
#[test]
fn on_the_portable_transport_too() {
    common::rerun_on_portable("on_the_portable_transport_too");
}
