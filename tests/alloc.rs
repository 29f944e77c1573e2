//! Heap allocations in steady state, counted by a global allocator: the
//! transports' data path (frames, sends, receives, the engine's queues)
//! allocates nothing per frame, so an op's allocation count does not grow
//! with the number of frames it moves. (The op itself still allocates a
//! few times: its task, its completion, its schedule; printed below.)

mod common;

use common::{local_group, on_all};
use ringwire::{Communicator, ReduceOp};
use ringwire_uring::CountingAllocator;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::new();

/// Allocations per op (fewest over a few rounds, to skip heartbeats and
/// other background work) for all-reduces of `len` elements.
fn allocations_per_op(comms: &[Communicator], len: usize) -> u64 {
    const OPS: u64 = 20;
    let run = |c: &Communicator| {
        let mut buf = vec![1.0f32; len];
        for _ in 0..OPS {
            c.all_reduce_slice(&mut buf, ReduceOp::Sum).unwrap();
        }
    };
    on_all(comms, run); // warm up: pools, inboxes, queues reach their size
    (0..5)
        .map(|_| {
            let before = ALLOCATOR.count();
            on_all(comms, run);
            (ALLOCATOR.count() - before) / OPS
        })
        .min()
        .unwrap()
}

#[test]
fn allocations_per_op_do_not_grow_with_the_frames_moved() {
    // 1 KiB chunks: a 4 KiB all-reduce moves 4 frames per rank, a 256 KiB
    // one 256 (2 ranks, ring).
    let (_store, comms) = local_group(2, |b| b.chunk_bytes(1024).small_message_bytes(1024));
    let few = allocations_per_op(&comms, 1024);
    let many = allocations_per_op(&comms, 64 * 1024);
    eprintln!(
        "{}: {few} allocations per op moving 4 frames per rank, {many} moving 256",
        comms[0].transport_name()
    );
    // Both ranks' ops and threads count: 64x the frames may cost a few
    // reallocations of an op's schedule, never one per frame.
    assert!(
        many <= few + 16,
        "allocations grow with frames: {few} per op for 4 frames, {many} for 256"
    );
}

/// Every other test of this file, again on the portable transport.
#[test]
fn on_the_portable_transport_too() {
    common::rerun_on_portable("on_the_portable_transport_too");
}
