//! Survivors of a lost rank go on on the NCCL path (issue 45, decision
//! 0041): `GpuCommunicator::shrink` through `ncclCommShrink` where every
//! rank's NCCL has it, and through a new communicator where it does not
//! or where the shrink fails, on the stand-in NCCL.

mod common;

use common::{cpu_group, on_all, standin};
use ringwire::testing::in_a_child_with;
use ringwire::{Communicator, ReduceOp};
use ringwire_gpu::{Device, GpuCommunicator, GpuError, HostBuffer};
use std::time::Duration;

const CHILD: &str = "RINGWIRE_GPU_SHRINK_CHILD";
const TIMEOUT: Duration = Duration::from_secs(30);

fn in_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

fn build(cpu: &Communicator) -> GpuCommunicator {
    build_with(cpu, TIMEOUT)
}

fn build_with(cpu: &Communicator, timeout: Duration) -> GpuCommunicator {
    let lib = standin();
    let device = Device::standin_host(&lib).expect("host device");
    GpuCommunicator::builder(cpu, &device)
        .library(lib)
        .timeout(timeout)
        .build()
        .expect("init")
}

/// Drops the last rank's CPU and GPU communicators: the lost rank.
fn lose_last(cpu: &mut Vec<Communicator>, gpus: &mut Vec<GpuCommunicator>) {
    drop(gpus.pop());
    drop(cpu.pop());
}

/// What a survivor sees: its CPU op fails, it shrinks the CPU
/// communicator, then the GPU one; the new one's all-reduce of
/// `rank + 1` over its members, and which way it was made.
fn survive(c: &Communicator, g: &GpuCommunicator) -> (Communicator, GpuCommunicator, f32, bool) {
    let failed = c.all_reduce(vec![1f32; 8], ReduceOp::Sum).wait();
    assert!(
        failed.is_err(),
        "rank {}: an op without the lost rank",
        c.rank()
    );
    let shrunk = c.shrink().wait().expect("CPU shrink");
    let smaller = g.shrink(&shrunk).expect("GPU shrink");
    assert_eq!(smaller.world_size(), shrunk.world_size());
    assert_eq!(smaller.rank(), shrunk.rank());
    let sum = smaller
        .all_reduce(
            HostBuffer::new(vec![(c.rank() + 1) as f32; 1001]),
            ReduceOp::Sum,
        )
        .wait()
        .expect("an all-reduce of the survivors")
        .into_vec();
    assert!(sum.iter().all(|&x| x == sum[0]), "rank {}", c.rank());
    assert!(
        g.barrier().wait().is_err(),
        "the old communicator stays failed"
    );
    let native = smaller.made_by_nccl_shrink();
    (shrunk, smaller, sum[0], native)
}

/// Rank 2 of 3 goes; the other two shrink through `ncclCommShrink`.
#[test]
fn survivors_shrink_through_ncclcommshrink() {
    let (_store, mut cpu) = cpu_group(3, TIMEOUT);
    let mut gpus = on_all(&cpu, build);
    on_all(&gpus, |g| {
        g.all_reduce(HostBuffer::new(vec![1f32; 64]), ReduceOp::Sum)
            .wait()
            .expect("an op with everyone")
    });
    assert!(gpus.iter().all(|g| !g.made_by_nccl_shrink()));
    lose_last(&mut cpu, &mut gpus);
    let pairs: Vec<_> = cpu.iter().zip(gpus.iter()).collect();
    for (_, _, sum, native) in on_all(&pairs, |(c, g)| survive(c, g)) {
        assert_eq!(sum, 3.0);
        assert!(native, "made by ncclCommShrink");
    }
}

/// 4 ranks lose rank 3, then the 3 left lose their rank 1: two shrinks
/// in a row, each of the communicator the last one made.
#[test]
fn four_ranks_shrink_to_three_then_two() {
    let (_store, mut cpu) = cpu_group(4, TIMEOUT);
    let mut gpus = on_all(&cpu, build);
    lose_last(&mut cpu, &mut gpus);
    let pairs: Vec<_> = cpu.iter().zip(gpus.iter()).collect();
    let firsts = on_all(&pairs, |(c, g)| survive(c, g));
    // The old communicators go: the next rank lost must be lost whole.
    drop(pairs);
    drop((cpu, gpus));
    let (mut cpu, mut gpus): (Vec<_>, Vec<_>) = firsts
        .into_iter()
        .map(|(c, g, sum, native)| {
            assert_eq!((sum, native), (6.0, true));
            (c, g)
        })
        .unzip();
    // Lose the middle rank this time.
    drop(gpus.remove(1));
    drop(cpu.remove(1));
    let pairs: Vec<_> = cpu.iter().zip(gpus.iter()).collect();
    let seconds = on_all(&pairs, |(c, g)| survive(c, g));
    for (c, _, sum, native) in seconds {
        assert_eq!(c.world_ranks(), vec![0, 2]);
        // Ranks 0 and 2 of the three (world ranks 0 and 2) sent 1 and 3.
        assert_eq!((sum, native), (4.0, true));
    }
}

/// The survivors' all-reduce was queued and waits for the lost rank when
/// it goes: the op fails (the watchdog sees the rank's links fail; long
/// before the op timeout), and `NCCL_SHRINK_ABORT` ends it on the device
/// before the shrink, which still goes through `ncclCommShrink`.
#[test]
fn an_op_stuck_on_the_lost_rank_ends_and_the_shrink_goes_on() {
    let (_store, mut cpu) = cpu_group(3, TIMEOUT);
    let mut gpus = on_all(&cpu, build);
    let stuck: Vec<_> = gpus[..2]
        .iter()
        .map(|g| g.all_reduce(HostBuffer::new(vec![1f32; 32]), ReduceOp::Sum))
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    lose_last(&mut cpu, &mut gpus);
    for op in stuck {
        let err = op.wait().expect_err("the op waited for the lost rank");
        assert!(matches!(err, GpuError::Aborted { .. }), "{err}");
        assert!(err.to_string().contains("lost rank(s) [2]"), "{err}");
    }
    let pairs: Vec<_> = cpu.iter().zip(gpus.iter()).collect();
    for (_, _, sum, native) in on_all(&pairs, |(c, g)| survive(c, g)) {
        assert_eq!((sum, native), (3.0, true));
    }
}

/// Where the survivors cannot all shrink, they all make a new
/// communicator with a unique id instead, and get the same sums.
fn falls_back(name: &str, env: &[(&str, &str)], world: usize) {
    if !in_child() {
        return in_a_child_with(name, CHILD, env);
    }
    let (_store, mut cpu) = cpu_group(world, TIMEOUT);
    // The GPU op timeout bounds a stalled shrink.
    let mut gpus = on_all(&cpu, |c| build_with(c, Duration::from_secs(3)));
    // Op #1 may carry an injected error (the new communicator makes one
    // op, #0, so it is not hit).
    on_all(&gpus, |g| {
        for _ in 0..2 {
            let _ = g
                .all_reduce(HostBuffer::new(vec![1f32; 8]), ReduceOp::Sum)
                .wait();
        }
    });
    lose_last(&mut cpu, &mut gpus);
    let pairs: Vec<_> = cpu.iter().zip(gpus.iter()).collect();
    let expected = (world * (world - 1) / 2) as f32;
    for (_, _, sum, native) in on_all(&pairs, |(c, g)| survive(c, g)) {
        assert_eq!(sum, expected);
        assert!(!native, "made with a new unique id");
    }
}

#[test]
fn an_nccl_older_than_2_27_3_makes_a_new_communicator() {
    falls_back(
        "an_nccl_older_than_2_27_3_makes_a_new_communicator",
        &[("RINGWIRE_STANDIN_NCCL_VERSION", "2.26.6")],
        3,
    );
}

#[test]
fn a_shrink_that_fails_on_one_rank_falls_back_on_every_rank() {
    falls_back(
        "a_shrink_that_fails_on_one_rank_falls_back_on_every_rank",
        &[("RINGWIRE_STANDIN_NCCL_FAULT", "shrinkfail:1")],
        4,
    );
}

#[test]
fn a_shrink_that_stalls_on_one_rank_falls_back_at_the_init_timeout() {
    // Rank 0's shrink never ends: the others wait for it, and all of them
    // give up at the init timeout and make a new communicator.
    falls_back(
        "a_shrink_that_stalls_on_one_rank_falls_back_at_the_init_timeout",
        &[("RINGWIRE_STANDIN_NCCL_FAULT", "shrinkstall:0")],
        3,
    );
}

#[test]
fn a_communicator_failed_by_nccls_own_error_is_not_shrunk() {
    // Rank 0's first op sets NCCL's async error: its communicator is
    // aborted, not kept for a shrink, so nobody shrinks.
    falls_back(
        "a_communicator_failed_by_nccls_own_error_is_not_shrunk",
        &[("RINGWIRE_STANDIN_NCCL_FAULT", "error:0:1:6")],
        3,
    );
}

/// Rank 2 of 3 goes; the survivors shrink (through `ncclCommShrink`), a
/// replacement joins and is admitted, and the members shrink their GPU
/// communicator onto the admitted CPU one while the newcomer makes its
/// first: a newcomer has no parent to shrink, so all of them make a new
/// NCCL communicator together, of all three.
#[test]
fn a_replacement_joins_the_members_gpu_communicator() {
    let (store, mut cpu) = cpu_group(3, TIMEOUT);
    let addr = store.local_addr();
    let mut gpus = on_all(&cpu, build);
    lose_last(&mut cpu, &mut gpus);
    let pairs: Vec<_> = cpu.iter().zip(gpus.iter()).collect();
    let survivors = on_all(&pairs, |(c, g)| survive(c, g));
    drop(pairs);
    drop((cpu, gpus));
    let newcomer = std::thread::spawn(move || {
        let c = Communicator::builder()
            .rank(2)
            .world_size(3)
            .store_addr(addr)
            .host_store(false)
            .timeout(TIMEOUT)
            .connect_timeout(Duration::from_secs(20))
            .rejoin(true)
            .build()
            .wait()
            .expect("the replacement is admitted");
        let g = build(&c);
        (c, g)
    });
    for (c, ..) in &survivors {
        while c.joiners_waiting().expect("the store") == 0 {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let members = on_all(&survivors, |(c, g, _, native)| {
        assert!(native);
        let admitted = c.admit().wait().expect("admit");
        let g = g
            .shrink(&admitted)
            .expect("the GPU communicator of all three");
        (admitted, g)
    });
    let (c2, g2) = newcomer.join().expect("the newcomer's thread");
    let mut all: Vec<(Communicator, GpuCommunicator)> = members;
    all.push((c2, g2));
    let sums = on_all(&all, |(c, g)| {
        assert_eq!((g.rank(), g.world_size()), (c.rank(), 3));
        assert!(
            !g.made_by_nccl_shrink(),
            "a newcomer needs a new communicator"
        );
        g.all_reduce(
            HostBuffer::new(vec![(c.rank() + 1) as f32; 77]),
            ReduceOp::Sum,
        )
        .wait()
        .expect("an all-reduce of all three")
        .into_vec()
    });
    for sum in sums {
        assert!(sum.iter().all(|&x| x == 6.0), "{}", sum[0]);
    }
}

/// `abort()` releases NCCL's communicator at once, also one a failure
/// kept for a shrink: a shrink after it makes a new communicator.
#[test]
fn abort_releases_a_kept_communicator_at_once() {
    let (_store, mut cpu) = cpu_group(3, TIMEOUT);
    let mut gpus = on_all(&cpu, build);
    lose_last(&mut cpu, &mut gpus);
    let pairs: Vec<_> = cpu.iter().zip(gpus.iter()).collect();
    let outcomes = on_all(&pairs, |(c, g)| {
        let failed = c.all_reduce(vec![1f32; 8], ReduceOp::Sum).wait();
        assert!(failed.is_err());
        let shrunk = c.shrink().wait().expect("CPU shrink");
        g.abort("the program gives this one up");
        let smaller = g.shrink(&shrunk).expect("GPU shrink");
        let sum = smaller
            .all_reduce(HostBuffer::new(vec![1f32; 10]), ReduceOp::Sum)
            .wait()
            .expect("an all-reduce of the two")
            .into_vec();
        (sum[0], smaller.made_by_nccl_shrink())
    });
    for (sum, native) in outcomes {
        assert_eq!((sum, native), (2.0, false));
    }
}
