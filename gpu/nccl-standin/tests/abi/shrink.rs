//! `ncclCommShrink`: the child, its numbering and data, the argument
//! checks NCCL makes, `NCCL_SHRINK_ABORT`, and shrinks that fail or stall.

use crate::common::*;
use ringwire_nccl_standin::abi::*;
use ringwire_nccl_standin::codes::{
    DataType, IN_PROGRESS, INVALID_ARGUMENT, INVALID_USAGE, REMOTE_ERROR, RedOp, SUCCESS,
    SYSTEM_ERROR,
};
use ringwire_nccl_standin::envcfg;
use std::ffi::c_int;
use std::sync::Barrier;
use std::time::{Duration, Instant};

const SETTLE: Duration = Duration::from_secs(10);

/// Where `ncclCommShrink` writes the new handle: on the heap, so that it
/// stays put while a non-blocking shrink runs.
struct Slot(Box<NcclComm>);

impl Slot {
    fn new() -> Slot {
        Slot(Box::new(handle(0xdead_0000)))
    }

    fn get(&self) -> usize {
        self.0.addr()
    }
}

/// `ncclCommShrink(parent, exclude, &slot, NULL or a config, flags)`.
fn shrink(
    parent: usize,
    exclude: &mut [c_int],
    blocking: Option<bool>,
    flags: c_int,
    slot: &mut Slot,
) -> c_int {
    let mut config = blocking.map(|b| NcclConfig {
        size: size_of::<NcclConfig>(),
        magic: CONFIG_MAGIC,
        version: 23007,
        blocking: c_int::from(b),
        cga_cluster_size: c_int::MIN,
        min_ctas: c_int::MIN,
        max_ctas: c_int::MIN,
        net_name: std::ptr::null(),
        split_share: c_int::MIN,
    });
    let config_ptr = config
        .as_mut()
        .map_or(std::ptr::null_mut(), |c| c as *mut NcclConfig);
    // SAFETY: the list and the slot outlive the call, and the slot stays
    // writable until the parent settles (the callers poll it before
    // dropping the slot); the config outlives the call.
    unsafe {
        ncclCommShrink(
            handle(parent),
            exclude.as_mut_ptr(),
            exclude.len() as c_int,
            &mut *slot.0,
            config_ptr,
            flags,
        )
    }
}

/// A non-blocking comm of `nranks`, its setup waited for.
fn non_blocking(id: NcclUniqueId, nranks: usize, rank: usize) -> Rank {
    let (code, comm) = init(id, nranks, rank, false);
    assert_eq!(code, IN_PROGRESS);
    assert_eq!(poll_until_settled(comm, SETTLE), SUCCESS);
    Rank::from_comm(comm, nranks, rank)
}

/// Runs `f` on `nranks` threads, each with its rank's non-blocking comm
/// (set up), and returns their results in rank order.
fn on_ranks<R: Send>(nranks: usize, f: impl Fn(Rank) -> R + Sync) -> Vec<R> {
    let id = unique_id();
    std::thread::scope(|s| {
        let f = &f;
        let ranks: Vec<_> = (0..nranks)
            .map(|rank| s.spawn(move || f(non_blocking(id, nranks, rank))))
            .collect();
        ranks.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn count_and_rank(comm: usize) -> (c_int, c_int) {
    let (mut count, mut rank) = (-1, -1);
    // SAFETY: writable ints.
    unsafe {
        assert_eq!(ncclCommCount(handle(comm), &mut count), SUCCESS);
        assert_eq!(ncclCommUserRank(handle(comm), &mut rank), SUCCESS);
    }
    (count, rank)
}

/// An f32 all-reduce of `value` on `r`: the sum.
fn sum_of(r: &Rank, value: f32) -> f32 {
    let mut mem = value.to_ne_bytes().repeat(5);
    let code = r.all_reduce(&mut mem, 0, 0, 5, DataType::Float32, RedOp::Sum);
    assert_eq!(code, SUCCESS);
    f32::from_ne_bytes(mem[..4].try_into().unwrap())
}

#[test]
fn a_non_blocking_shrink_is_in_progress_then_hands_over_a_renumbered_comm() {
    const N: usize = 5;
    let outcomes = on_ranks(N, |parent| {
        let rank = parent.rank;
        if rank == 1 || rank == 3 {
            // The excluded: they do not call it.
            assert_eq!(ncclCommAbort(parent.comm()), SUCCESS);
            return None;
        }
        let mut exclude = [3, 1];
        let mut slot = Slot::new();
        let code = shrink(
            parent.comm_addr(),
            &mut exclude,
            None,
            SHRINK_DEFAULT,
            &mut slot,
        );
        let sorted = exclude == [1, 3];
        let settled = poll_until_settled(parent.comm_addr(), SETTLE);
        let child = slot.get();
        let numbering = count_and_rank(child);
        let child = Rank::from_comm(child, 3, numbering.1 as usize);
        let sum = sum_of(&child, (rank + 1) as f32);
        child.destroy();
        assert_eq!(ncclCommAbort(parent.comm()), SUCCESS);
        Some((code, sorted, settled, numbering, sum))
    });
    let expected_rank = [Some(0), None, Some(1), None, Some(2)];
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        let Some((code, sorted, settled, numbering, sum)) = outcome else {
            assert!(expected_rank[rank].is_none());
            continue;
        };
        assert_eq!(code, IN_PROGRESS, "rank {rank}");
        assert!(sorted, "rank {rank}: the list is sorted in place");
        assert_eq!(settled, SUCCESS, "rank {rank}");
        assert_eq!(numbering, (3, expected_rank[rank].unwrap()), "rank {rank}");
        assert_eq!(sum, 1.0 + 3.0 + 5.0, "rank {rank}");
    }
}

#[test]
fn a_blocking_parent_shrinks_before_returning() {
    let results = run_ranks(3, |r| {
        if r.rank == 2 {
            return None;
        }
        let mut slot = Slot::new();
        let code = shrink(r.comm_addr(), &mut [2], None, SHRINK_DEFAULT, &mut slot);
        let child = Rank::from_comm(slot.get(), 2, r.rank);
        let numbering = count_and_rank(slot.get());
        let sum = sum_of(&child, 10.0 * (r.rank + 1) as f32);
        child.destroy();
        Some((code, numbering, sum))
    });
    for (rank, result) in results.into_iter().take(2).enumerate() {
        let (code, numbering, sum) = result.unwrap();
        assert_eq!(code, SUCCESS);
        assert_eq!(numbering, (2, rank as c_int));
        assert_eq!(sum, 30.0);
    }
}

#[test]
fn arguments_are_checked_as_nccl_checks_them() {
    let _errors = lock_process_errors();
    run_ranks(2, |r| {
        if r.rank == 1 {
            return;
        }
        let mut slot = Slot::new();
        let parent = r.comm_addr();
        assert_eq!(
            shrink(parent, &mut [], None, 0, &mut slot),
            INVALID_ARGUMENT
        );
        assert_eq!(slot.get(), 0, "*newcomm is NULL on failure");
        assert_eq!(
            shrink(parent, &mut [0], None, 0, &mut slot),
            INVALID_ARGUMENT
        );
        assert!(
            last_error(0).contains("rank 0 is in excludeRanksList"),
            "{}",
            last_error(0)
        );
        // SAFETY: NULL list and NULL newcomm are refused before any use.
        unsafe {
            let null_list = ncclCommShrink(
                r.comm(),
                std::ptr::null_mut(),
                1,
                &mut *slot.0,
                std::ptr::null_mut(),
                0,
            );
            assert_eq!(null_list, INVALID_ARGUMENT);
            let null_out = ncclCommShrink(
                r.comm(),
                [1].as_mut_ptr(),
                1,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            );
            assert_eq!(null_out, INVALID_ARGUMENT);
            let stale = ncclCommShrink(
                handle(0x1234_5670),
                [1].as_mut_ptr(),
                1,
                &mut *slot.0,
                std::ptr::null_mut(),
                0,
            );
            assert_eq!(stale, INVALID_ARGUMENT);
        }
        envcfg::set_thread_override(envcfg::VERSION, Some("2.26.6"));
        assert_eq!(shrink(parent, &mut [1], None, 0, &mut slot), INVALID_USAGE);
        assert!(last_error(0).contains("2.27.3"), "{}", last_error(0));
        envcfg::clear_thread_overrides();
    });
}

#[test]
fn a_parent_with_an_async_error_cannot_shrink() {
    let _errors = lock_process_errors();
    // Two ranks whose first op sets the async error to ncclRemoteError.
    const N: usize = 2;
    let id = unique_id();
    std::thread::scope(|s| {
        for rank in 0..N {
            s.spawn(move || {
                set_faults(&format!("error:{rank}:0:6"));
                let r = non_blocking(id, N, rank);
                let send = [0u8; 16];
                let mut recv = [0u8; 16];
                // SAFETY: the buffers outlive the abort below, after which
                // the stream has passed the op.
                assert_eq!(unsafe { all_reduce_async(&r, &send, &mut recv) }, SUCCESS);
                wait_for(SETTLE, "the injected error", || {
                    r.async_error() == REMOTE_ERROR
                });
                let mut slot = Slot::new();
                let peer = [1 - rank as c_int];
                let code = shrink(r.comm_addr(), &mut peer.clone(), None, 0, &mut slot);
                assert_eq!(code, REMOTE_ERROR, "rank {rank}");
                assert_eq!(slot.get(), 0);
                assert_eq!(ncclCommAbort(r.comm()), SUCCESS);
                r.sync();
            });
        }
    });
}

#[test]
fn shrink_abort_ends_an_op_hung_on_the_lost_rank() {
    const N: usize = 3;
    let barrier = &Barrier::new(N);
    on_ranks(N, |r| {
        let rank = r.rank;
        if rank == 2 {
            // Lost: never takes part in the all-reduce.
            barrier.wait();
            assert_eq!(ncclCommAbort(r.comm()), SUCCESS);
            return;
        }
        let send = 1f32.to_ne_bytes().repeat(4);
        let mut recv = vec![0xabu8; 16];
        // SAFETY: the buffers outlive the shrink, whose abort flag
        // drains the stream before it returns.
        assert_eq!(unsafe { all_reduce_async(&r, &send, &mut recv) }, SUCCESS);
        let hung = record(&r);
        std::thread::sleep(Duration::from_millis(100));
        assert!(!event_done(hung), "rank {rank}: the op waits for rank 2");
        barrier.wait();
        let mut slot = Slot::new();
        let code = shrink(r.comm_addr(), &mut [2], None, SHRINK_ABORT, &mut slot);
        assert_eq!(code, IN_PROGRESS);
        wait_for(SETTLE, "the hung op's end", || event_done(hung));
        assert!(recv.iter().all(|b| *b == 0xab), "and it wrote nothing");
        assert_eq!(poll_until_settled(r.comm_addr(), SETTLE), SUCCESS);
        let child = Rank::from_comm(slot.get(), 2, rank);
        assert_eq!(sum_of(&child, 2.0), 4.0);
        // The parent is revoked: a later op ends at once, unwritten.
        let mut again = vec![0xcdu8; 16];
        // SAFETY: the buffers outlive the event wait below.
        assert_eq!(unsafe { all_reduce_async(&r, &send, &mut again) }, SUCCESS);
        let later = record(&r);
        wait_for(SETTLE, "the revoked parent's op", || event_done(later));
        assert!(again.iter().all(|b| *b == 0xcd));
        child.destroy();
        assert_eq!(ncclCommAbort(r.comm()), SUCCESS);
    });
}

#[test]
fn lists_that_differ_fail_on_every_rank_instead_of_hanging() {
    let _errors = lock_process_errors();
    const N: usize = 3;
    let barrier = &Barrier::new(N);
    let results = on_ranks(N, |r| {
        let rank = r.rank;
        // Rank 0 leaves out 1, rank 1 leaves out 2, rank 2 leaves out 0.
        let mut exclude = [((rank + 1) % N) as c_int];
        let mut slot = Slot::new();
        let code = shrink(r.comm_addr(), &mut exclude, None, 0, &mut slot);
        let settled = poll_until_settled(r.comm_addr(), SETTLE);
        let text = last_error(r.comm_addr());
        // Every rank's frames are read before any socket closes.
        barrier.wait();
        if slot.get() != 0 {
            assert_eq!(ncclCommAbort(handle(slot.get())), SUCCESS);
        }
        assert_eq!(ncclCommAbort(r.comm()), SUCCESS);
        (code, settled, text)
    });
    for (rank, (code, settled, text)) in results.into_iter().enumerate() {
        assert_eq!(code, IN_PROGRESS);
        assert_eq!(settled, INVALID_USAGE, "rank {rank}");
        assert!(text.contains("excludes"), "rank {rank}: {text}");
    }
}

#[test]
fn a_failed_shrink_sets_the_parents_error_and_hands_over_a_failed_child() {
    let _errors = lock_process_errors();
    const N: usize = 2;
    on_ranks(N, |r| {
        let rank = r.rank;
        if rank == 1 {
            assert_eq!(ncclCommAbort(r.comm()), SUCCESS);
            return;
        }
        set_faults("shrinkfail:0");
        let mut slot = Slot::new();
        assert_eq!(
            shrink(r.comm_addr(), &mut [1], None, 0, &mut slot),
            IN_PROGRESS
        );
        assert_eq!(poll_until_settled(r.comm_addr(), SETTLE), SYSTEM_ERROR);
        assert!(last_error(r.comm_addr()).contains("injected shrink failure"));
        let child = slot.get();
        assert_ne!(
            child, 0,
            "a non-blocking shrink writes the child either way"
        );
        assert_eq!(poll_until_settled(child, SETTLE), SYSTEM_ERROR);
        assert_eq!(ncclCommAbort(handle(child)), SUCCESS);
        assert_eq!(ncclCommAbort(r.comm()), SUCCESS);
    });
}

#[test]
fn aborting_the_parent_ends_a_stalled_shrink() {
    let _errors = lock_process_errors();
    const N: usize = 3;
    on_ranks(N, |r| {
        let rank = r.rank;
        if rank == 2 {
            assert_eq!(ncclCommAbort(r.comm()), SUCCESS);
            return;
        }
        // Rank 0 stalls; rank 1 waits for rank 0's frame.
        set_faults("shrinkstall:0");
        let mut slot = Slot::new();
        assert_eq!(
            shrink(r.comm_addr(), &mut [2], None, 0, &mut slot),
            IN_PROGRESS
        );
        std::thread::sleep(Duration::from_millis(150));
        assert_eq!(r.async_error(), IN_PROGRESS, "rank {rank}");
        let started = Instant::now();
        assert_eq!(ncclCommAbort(r.comm()), SUCCESS);
        assert!(started.elapsed() < Duration::from_secs(1));
        // The job still writes the slot when it sees the abort, as
        // NCCL's would: an abandoned slot is leaked, never freed.
        std::mem::forget(slot);
    });
}
