//! Injected faults, abort, and setup failures.

use crate::common::*;
use ringwire_nccl_standin::abi::*;
use ringwire_nccl_standin::codes::{
    DataType, IN_PROGRESS, INVALID_USAGE, REMOTE_ERROR, RedOp, SUCCESS, SYSTEM_ERROR,
    UNHANDLED_CUDA_ERROR,
};
use std::sync::Barrier;
use std::time::{Duration, Instant};

const SECOND: Duration = Duration::from_secs(1);

/// Asserts `event` stays incomplete for a short while (a negative check:
/// nothing can complete it until the comm is aborted).
fn stays_pending(event: usize) -> bool {
    let until = Instant::now() + Duration::from_millis(150);
    while Instant::now() < until {
        if event_done(event) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

/// Aborts `r` and checks it returns within a second; then `event` must
/// complete within a second too, and later work on the stream must run.
fn abort_and_drain(r: Rank, event: usize) -> (bool, bool, bool) {
    let start = Instant::now();
    assert_eq!(ncclCommAbort(r.comm()), SUCCESS);
    let quick = start.elapsed() < SECOND;
    let deadline = Instant::now() + SECOND;
    while !event_done(event) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let drained = event_done(event);
    let later = record(&r);
    assert_eq!(standinEventSynchronize(handle(later)), 0);
    let later_ran = event_done(later);
    assert_eq!(standinStreamDestroy(r.stream()), 0);
    (quick, drained, later_ran)
}

#[test]
fn abort_wakes_a_hung_op_and_later_events_complete() {
    const N: usize = 2;
    let id = unique_id();
    let barrier = Barrier::new(N);
    let results = std::thread::scope(|s| {
        let ranks: Vec<_> = (0..N)
            .map(|rank| {
                let barrier = &barrier;
                s.spawn(move || {
                    set_faults("hang:1:1");
                    let r = Rank::init(id, N, rank);
                    let send = 1f32.to_ne_bytes().repeat(8);
                    let mut mem = send.clone();
                    let op0 = r.all_reduce(&mut mem, 0, 0, 8, DataType::Float32, RedOp::Sum);
                    let op0_ok = op0 == SUCCESS && mem == 2f32.to_ne_bytes().repeat(8);
                    let mut recv = vec![0xabu8; 32];
                    // SAFETY: `send` and `recv` live past the drain below,
                    // after which the stream has passed the op.
                    let code = unsafe { all_reduce_async(&r, &send, &mut recv) };
                    let event = record(&r);
                    let pending = stays_pending(event);
                    barrier.wait();
                    let (quick, drained, later) = abort_and_drain(r, event);
                    let untouched = recv.iter().all(|b| *b == 0xab);
                    [
                        op0_ok,
                        code == SUCCESS,
                        pending,
                        quick,
                        drained,
                        later,
                        untouched,
                    ]
                })
            })
            .collect();
        ranks
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    assert_eq!(results, vec![[true; 7]; N]);
}

#[test]
fn injected_error_sets_async_error_and_last_error() {
    const N: usize = 2;
    let _guard = lock_process_errors();
    let id = unique_id();
    let results = std::thread::scope(|s| {
        let ranks: Vec<_> = (0..N)
            .map(|rank| {
                s.spawn(move || {
                    set_faults("error:0:0:6");
                    let r = Rank::init(id, N, rank);
                    let send = vec![0u8; 16];
                    let mut recv = vec![0u8; 16];
                    // SAFETY: the buffers outlive the drain below.
                    assert_eq!(unsafe { all_reduce_async(&r, &send, &mut recv) }, SUCCESS);
                    let event = record(&r);
                    let mut seen = (SUCCESS, String::new());
                    if rank == 0 {
                        wait_for(5 * SECOND, "the injected error", || {
                            r.async_error() != SUCCESS
                        });
                        seen = (r.async_error(), last_error(r.comm_addr()));
                    }
                    let pending = stays_pending(event);
                    let (quick, drained, _) = abort_and_drain(r, event);
                    (seen, pending, quick, drained)
                })
            })
            .collect();
        ranks
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    let text = "stand-in NCCL: injected error 6 at op 0 on rank 0".to_string();
    assert_eq!(results[0], ((REMOTE_ERROR, text), true, true, true));
    assert_eq!(results[1], ((SUCCESS, String::new()), true, true, true));
}

#[test]
fn init_failure_returns_no_comm() {
    let _guard = lock_process_errors();
    set_faults("initfail:0");
    for blocking in [true, false] {
        let (code, comm) = init(unique_id(), 1, 0, blocking);
        assert_eq!((code, comm), (UNHANDLED_CUDA_ERROR, 0));
        assert_eq!(
            last_error(0),
            "stand-in NCCL: injected init failure (no CUDA device)"
        );
    }
    set_faults("bogus:1");
    assert_eq!(
        init(unique_id(), 1, 0, true).0,
        ringwire_nccl_standin::codes::INVALID_ARGUMENT
    );
    assert!(last_error(0).contains("bogus:1"), "{}", last_error(0));
    ringwire_nccl_standin::envcfg::clear_thread_overrides();
}

#[test]
fn abort_interrupts_a_stalled_or_waiting_setup() {
    // A stall injected on rank 0, and a real wait: rank 0 of 2 whose
    // peer never comes.
    for (faults, nranks) in [("initstall:0", 1), ("", 2)] {
        set_faults(faults);
        let (code, comm) = init(unique_id(), nranks, 0, false);
        assert_eq!(code, IN_PROGRESS);
        let until = Instant::now() + Duration::from_millis(100);
        while Instant::now() < until {
            assert_eq!(async_error(comm), IN_PROGRESS);
            std::thread::sleep(Duration::from_millis(5));
        }
        let start = Instant::now();
        assert_eq!(ncclCommAbort(handle(comm)), SUCCESS);
        assert!(start.elapsed() < SECOND);
    }
    ringwire_nccl_standin::envcfg::clear_thread_overrides();
}

#[test]
fn unreachable_root_is_a_system_error() {
    let _guard = lock_process_errors();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut id = NcclUniqueId { internal: [0; 128] };
    for (i, b) in b"RWSTNDIN"
        .iter()
        .chain(&port.to_le_bytes())
        .chain(&7u64.to_le_bytes())
        .enumerate()
    {
        id.internal[i] = *b as std::ffi::c_char;
    }
    assert_eq!(init(id, 2, 0, true), (SYSTEM_ERROR, 0));
    let (code, comm) = init(id, 2, 1, false);
    assert_eq!(code, IN_PROGRESS);
    assert_eq!(poll_until_settled(comm, 10 * SECOND), SYSTEM_ERROR);
    assert!(
        last_error(comm).contains("bootstrap root"),
        "{}",
        last_error(comm)
    );
    assert_eq!(ncclCommDestroy(handle(comm)), SUCCESS);
    // A stand-in id must come from ncclGetUniqueId.
    let zeros = NcclUniqueId { internal: [0; 128] };
    assert_eq!(
        init(zeros, 1, 0, true).0,
        ringwire_nccl_standin::codes::INVALID_ARGUMENT
    );
}

#[test]
fn ranks_that_disagree_get_invalid_usage() {
    let _guard = lock_process_errors();
    let id = unique_id();
    let codes = std::thread::scope(|s| {
        let a = s.spawn(move || init(id, 2, 0, true));
        let b = s.spawn(move || init(id, 2, 0, true));
        [a.join().unwrap(), b.join().unwrap()]
    });
    assert_eq!(codes, [(INVALID_USAGE, 0); 2]);
}

#[test]
fn mismatched_collectives_are_detected() {
    const N: usize = 2;
    let _guard = lock_process_errors();
    let id = unique_id();
    let results = std::thread::scope(|s| {
        let ranks: Vec<_> = (0..N)
            .map(|rank| {
                s.spawn(move || {
                    let r = Rank::init(id, N, rank);
                    let send = 3f32.to_ne_bytes().repeat(4);
                    let mut recv = vec![0xabu8; 16];
                    // SAFETY: the buffers outlive the drain below.
                    let code = unsafe {
                        if rank == 0 {
                            all_reduce_async(&r, &send, &mut recv)
                        } else {
                            ncclBroadcast(
                                send.as_ptr().cast(),
                                recv.as_mut_ptr().cast(),
                                4,
                                DataType::Float32 as std::ffi::c_int,
                                0,
                                r.comm(),
                                r.stream(),
                            )
                        }
                    };
                    assert_eq!(code, SUCCESS);
                    let event = record(&r);
                    let mut seen = (SUCCESS, String::new());
                    if rank == 1 {
                        // The broadcast gives up without writing.
                        assert_eq!(standinEventSynchronize(handle(event)), 0);
                        seen = (r.async_error(), last_error(r.comm_addr()));
                    } else {
                        assert!(stays_pending(event));
                    }
                    let (quick, drained, _) = abort_and_drain(r, event);
                    (seen, recv.iter().all(|b| *b == 0xab), quick, drained)
                })
            })
            .collect();
        ranks
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    assert_eq!(results[0], ((SUCCESS, String::new()), true, true, true));
    let ((code, text), untouched, quick, drained) = &results[1];
    assert_eq!(*code, INVALID_USAGE);
    assert!(
        text.starts_with("stand-in NCCL: mismatched collective: "),
        "{text}"
    );
    assert!(
        text.contains("Broadcast") && text.contains("AllReduce"),
        "{text}"
    );
    assert!(*untouched && *quick && *drained);
}
