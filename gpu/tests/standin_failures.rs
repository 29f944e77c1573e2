//! Failure on the NCCL path, on the stand-in NCCL with injected faults: a
//! hung peer, an async error, a rank whose init fails or stalls, ranks
//! calling different collectives, and the library missing, foreign or too
//! old. Each ends in a typed error naming what and where, on every rank,
//! within its deadline; nothing panics or hangs.
//!
//! The faults are set through the environment, so each such test runs
//! again in a child process with the variable set.

mod common;

use common::{cpu_group, cpu_group_with, on_all, standin, standin_path};
use ringwire::ReduceOp;
use ringwire::testing::in_a_child_with;
use ringwire_gpu::{
    Device, GpuCommunicator, GpuError, HostBuffer, NcclLibrary, NcclResult, Unavailable,
};
use std::time::{Duration, Instant};

const CHILD: &str = "RINGWIRE_GPU_FAULT_CHILD";

fn in_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

fn device() -> Device {
    Device::standin_host(&standin()).expect("host device")
}

fn build(cpu: &ringwire::Communicator, timeout: Duration) -> Result<GpuCommunicator, GpuError> {
    GpuCommunicator::builder(cpu, &device())
        .library(standin())
        .timeout(timeout)
        .build()
}

#[test]
fn a_hung_peer_is_aborted_on_every_rank_within_the_deadline() {
    if !in_child() {
        return in_a_child_with(
            "a_hung_peer_is_aborted_on_every_rank_within_the_deadline",
            CHILD,
            &[("RINGWIRE_STANDIN_NCCL_FAULT", "hang:1:2")],
        );
    }
    let (_store, cpu) = cpu_group(2, Duration::from_secs(60));
    // Rank 0 gives up after 2 s; rank 1 (the hung one) would wait 60 s.
    let gpus = on_all(&cpu, |c| {
        let t = if c.rank() == 0 { 2 } else { 60 };
        build(c, Duration::from_secs(t)).expect("init")
    });
    let started = Instant::now();
    let results = on_all(&gpus, |g| {
        for _ in 0..2 {
            g.all_reduce(HostBuffer::new(vec![1f32; 16]), ReduceOp::Sum)
                .wait()
                .expect("ops before the hang");
        }
        let third = g
            .all_reduce(HostBuffer::new(vec![1f32; 16]), ReduceOp::Sum)
            .wait();
        (third.map(|_| ()), started.elapsed())
    });
    let (r0, t0) = &results[0];
    let (r1, t1) = &results[1];
    let e0 = r0.as_ref().expect_err("rank 0's op must fail");
    let e1 = r1.as_ref().expect_err("rank 1's op must fail");
    assert!(matches!(e0, GpuError::Timeout { .. }), "rank 0: {e0}");
    let text = e0.to_string();
    assert!(
        text.contains("GPU all_reduce #3 on rank 0 of 2: timed out"),
        "{text}"
    );
    assert!(text.contains("last finished op #2"), "{text}");
    assert!(text.contains("aborted on every rank"), "{text}");
    // The hung rank learns it through the CPU abort, long before its own 60 s.
    assert!(matches!(e1, GpuError::Aborted { .. }), "rank 1: {e1}");
    assert!(
        e1.to_string().contains("timed out"),
        "rank 1 names the cause: {e1}"
    );
    assert!(
        *t0 < Duration::from_secs(10) && *t1 < Duration::from_secs(10),
        "{t0:?} {t1:?}"
    );
    // The communicator stays failed: later ops end at once.
    for g in &gpus {
        let err = g.barrier().wait().unwrap_err();
        assert!(matches!(err, GpuError::Aborted { .. }), "{err}");
        assert!(g.failure().is_some());
    }
}

#[test]
fn an_async_error_surfaces_with_nccls_message_on_every_rank() {
    if !in_child() {
        return in_a_child_with(
            "an_async_error_surfaces_with_nccls_message_on_every_rank",
            CHILD,
            &[("RINGWIRE_STANDIN_NCCL_FAULT", "error:0:1:6")],
        );
    }
    let (_store, cpu) = cpu_group(2, Duration::from_secs(60));
    let gpus = on_all(&cpu, |c| build(c, Duration::from_secs(60)).expect("init"));
    let started = Instant::now();
    let results = on_all(&gpus, |g| {
        g.all_reduce(HostBuffer::new(vec![1f64; 8]), ReduceOp::Max)
            .wait()
            .expect("op 0");
        g.all_reduce(HostBuffer::new(vec![1f64; 8]), ReduceOp::Max)
            .wait()
            .map(|_| ())
    });
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    match results[0].as_ref().unwrap_err() {
        GpuError::Nccl {
            at,
            code,
            text,
            last_error,
        } => {
            assert_eq!(*code, NcclResult::REMOTE_ERROR);
            assert_eq!((at.seq, at.rank), (2, 0));
            assert_eq!(text, "remote process exited or there was a network error");
            assert!(
                last_error.contains("injected error 6 at op 1 on rank 0"),
                "{last_error}"
            );
        }
        other => panic!("rank 0: {other}"),
    }
    let e1 = results[1].as_ref().unwrap_err();
    assert!(matches!(e1, GpuError::Aborted { .. }), "rank 1: {e1}");
    assert!(
        e1.to_string().contains("ncclRemoteError"),
        "rank 1 names the cause: {e1}"
    );
}

#[test]
fn an_init_failure_on_one_rank_fails_every_rank_at_once() {
    if !in_child() {
        return in_a_child_with(
            "an_init_failure_on_one_rank_fails_every_rank_at_once",
            CHILD,
            &[("RINGWIRE_STANDIN_NCCL_FAULT", "initfail:1")],
        );
    }
    let (_store, cpu) = cpu_group(2, Duration::from_secs(60));
    let started = Instant::now();
    let results = on_all(&cpu, |c| build(c, Duration::from_secs(60)).map(|_| ()));
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    match results[1].as_ref().unwrap_err() {
        GpuError::Nccl {
            code, last_error, ..
        } => {
            assert_eq!(*code, NcclResult::UNHANDLED_CUDA_ERROR);
            assert!(last_error.contains("injected init failure"), "{last_error}");
        }
        other => panic!("rank 1: {other}"),
    }
    let e0 = results[0].as_ref().unwrap_err();
    assert!(matches!(e0, GpuError::Aborted { .. }), "rank 0: {e0}");
    assert!(
        e0.to_string()
            .contains("another rank failed while NCCL initialised"),
        "{e0}"
    );
}

#[test]
fn an_init_that_never_finishes_times_out_and_is_aborted() {
    if !in_child() {
        return in_a_child_with(
            "an_init_that_never_finishes_times_out_and_is_aborted",
            CHILD,
            &[("RINGWIRE_STANDIN_NCCL_FAULT", "initstall:1")],
        );
    }
    let (_store, cpu) = cpu_group(2, Duration::from_secs(60));
    let started = Instant::now();
    let results = on_all(&cpu, |c| {
        GpuCommunicator::builder(c, &device())
            .library(standin())
            .init_timeout(Duration::from_secs(2))
            .build()
            .map(|_| ())
    });
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    let stalled = results[1].as_ref().unwrap_err();
    assert!(
        matches!(stalled, GpuError::Timeout { .. }),
        "rank 1: {stalled}"
    );
    assert!(
        stalled.to_string().contains("NCCL still initialising"),
        "{stalled}"
    );
    // Rank 0 either timed out too or heard rank 1's abort first.
    let e0 = results[0].as_ref().unwrap_err();
    assert!(
        matches!(e0, GpuError::Timeout { .. } | GpuError::Aborted { .. }),
        "rank 0: {e0}"
    );
}

#[test]
fn ranks_calling_different_collectives_are_told_so_under_debug_checks() {
    let (_store, cpu) = cpu_group_with(2, Duration::from_secs(30), |b| b.debug_checks(true));
    let gpus = on_all(&cpu, |c| build(c, Duration::from_secs(30)).expect("init"));
    let results = on_all(&gpus, |g| {
        let len = 4 + g.rank();
        g.all_reduce(HostBuffer::new(vec![1u8; len]), ReduceOp::Sum)
            .wait()
            .map(|_| ())
    });
    for (rank, r) in results.iter().enumerate() {
        let e = r.as_ref().unwrap_err();
        assert!(matches!(e, GpuError::Mismatch { .. }), "rank {rank}: {e}");
        let other = 1 - rank;
        assert!(
            e.to_string().contains(&format!(
                "rank {other} called op all_reduce, dtype 1, count {}",
                4 + other
            )),
            "{e}"
        );
    }
    // Nothing reached NCCL, so the ranks are still in step.
    let ok = on_all(&gpus, |g| {
        g.all_reduce(HostBuffer::new(vec![1u8; 4]), ReduceOp::Sum)
            .wait()
            .expect("after")
            .into_vec()
    });
    assert!(ok.iter().all(|v| v == &[2, 2, 2, 2]));
}

#[test]
fn abort_fails_pending_and_later_ops_on_every_rank() {
    let (_store, cpu) = cpu_group(2, Duration::from_secs(60));
    let gpus = on_all(&cpu, |c| build(c, Duration::from_secs(60)).expect("init"));
    // Rank 1 never joins this op, so rank 0's stays pending until the abort.
    let pending = gpus[0].all_reduce(HostBuffer::new(vec![1f32; 4]), ReduceOp::Sum);
    gpus[0].abort("checkpoint and restart");
    let err = pending.wait().unwrap_err();
    assert!(
        err.to_string()
            .contains("rank 0 called abort(): checkpoint and restart"),
        "{err}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while gpus[1].failure().is_none() {
        assert!(Instant::now() < deadline, "rank 1 never heard of the abort");
        std::thread::sleep(Duration::from_millis(5));
    }
    let err = gpus[1].barrier().wait().unwrap_err();
    assert!(err.to_string().contains("checkpoint and restart"), "{err}");
}

#[test]
fn dropped_handles_still_finish_and_the_communicator_closes() {
    let (_store, cpu) = cpu_group(2, Duration::from_secs(30));
    let gpus = on_all(&cpu, |c| build(c, Duration::from_secs(30)).expect("init"));
    on_all(&gpus, |g| {
        for _ in 0..20 {
            drop(g.all_reduce(HostBuffer::new(vec![1f32; 1000]), ReduceOp::Sum));
        }
        g.barrier().wait().expect("barrier after detached ops");
    });
    // Dropping waits for detached ops, then finalizes: bounded, no hang.
    let started = Instant::now();
    on_all(&gpus, |g| drop(g.clone()));
    drop(gpus);
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[test]
fn a_missing_library_names_where_it_looked_and_how_to_install() {
    if !in_child() {
        return in_a_child_with(
            "a_missing_library_names_where_it_looked_and_how_to_install",
            CHILD,
            &[("RINGWIRE_NCCL_LIB", "/nonexistent/libnccl.so.2")],
        );
    }
    let err = NcclLibrary::global().unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Unavailable::NoLibrary { .. }), "{text}");
    assert!(text.contains("/nonexistent/libnccl.so.2"), "{text}");
    assert!(text.contains("pip install nvidia-nccl-cu12"), "{text}");
    assert!(ringwire_gpu::available(0).is_err());
    // Making a communicator says the same, as a GpuError, and a rank that
    // found NCCL (rank 0 is handed the stand-in) hears of it at once rather
    // than waiting for the missing rank until its timeout.
    let (_store, cpu) = cpu_group(2, Duration::from_secs(60));
    let started = Instant::now();
    let results = on_all(&cpu, |c| {
        let b = GpuCommunicator::builder(c, &device());
        let b = if c.rank() == 0 {
            b.library(standin())
        } else {
            b
        };
        b.build().map(|_| ())
    });
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    let e1 = results[1].as_ref().unwrap_err();
    assert_eq!(e1.kind(), "unavailable", "{e1}");
    let e0 = results[0].as_ref().unwrap_err();
    assert!(
        e0.to_string().contains("rank(s) [1] could not load NCCL"),
        "{e0}"
    );
}

#[test]
fn a_library_without_ncclx_symbols_is_refused_by_name() {
    let err = NcclLibrary::open("libm.so.6").unwrap_err();
    assert!(matches!(err, Unavailable::MissingSymbol { .. }), "{err}");
    assert!(err.to_string().contains("lacks ncclGetVersion"), "{err}");
}

#[test]
fn an_nccl_older_than_2_14_is_refused_with_both_versions() {
    if !in_child() {
        return in_a_child_with(
            "an_nccl_older_than_2_14_is_refused_with_both_versions",
            CHILD,
            &[("RINGWIRE_STANDIN_NCCL_VERSION", "2.12.0")],
        );
    }
    let err = NcclLibrary::open(standin_path()).unwrap_err();
    assert!(matches!(err, Unavailable::TooOld { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("is NCCL 2.12.0; ringwire needs 2.14.3 or newer"),
        "{err}"
    );
}

#[test]
fn no_cuda_here_is_an_error_not_a_panic() {
    match Device::cuda(0) {
        Err(err) if cfg!(feature = "cuda") => assert!(
            matches!(
                err,
                Unavailable::NoDriver { .. } | Unavailable::NoDevice { .. }
            ),
            "{err}"
        ),
        Err(err) => assert!(matches!(err, Unavailable::NoCudaFeature), "{err}"),
        // A machine with a GPU (gpu/scripts/gpu-test.sh runs this there).
        Ok(device) => {
            let built_with_cuda = cfg!(feature = "cuda");
            assert!(built_with_cuda, "{device:?}");
        }
    }
}
