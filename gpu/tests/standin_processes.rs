//! Ranks in separate processes, as in production: the parent hosts the
//! store and starts three children of this test binary, each a rank with
//! its own CPU communicator and GPU communicator on the stand-in NCCL
//! (which bootstraps over TCP from the unique id rank 0 broadcast).

mod common;

use common::standin;
use ringwire::{Communicator, ReduceOp};
use ringwire_gpu::{Device, GpuCommunicator, HostBuffer};
use std::time::Duration;

const RANK: &str = "RINGWIRE_GPU_TEST_RANK";
const WORLD: usize = 3;

/// Starts `WORLD` children running test `name`, each told its rank and
/// the store; their outputs, in rank order.
fn spawn_ranks(name: &str) -> Vec<(std::process::ExitStatus, String)> {
    let store = ringwire::store::StoreServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let port = store.local_addr().port().to_string();
    let lib = common::standin_path();
    let children: Vec<_> = (0..WORLD)
        .map(|rank| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", name, "--nocapture"])
                .env(RANK, rank.to_string())
                .env("RINGWIRE_TEST_STORE_PORT", &port)
                .env("RINGWIRE_STANDIN_NCCL", &lib)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    children
        .into_iter()
        .map(|child| {
            let out = child.wait_with_output().unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            (out.status, text)
        })
        .collect()
}

/// A rank's CPU and GPU communicators, from the store the parent hosts.
fn join(rank: usize) -> (Communicator, GpuCommunicator) {
    let port: u16 = std::env::var("RINGWIRE_TEST_STORE_PORT")
        .unwrap()
        .parse()
        .unwrap();
    let cpu = Communicator::builder()
        .rank(rank)
        .world_size(WORLD)
        .store("127.0.0.1", port)
        .host_store(false)
        .timeout(Duration::from_secs(30))
        .build()
        .wait()
        .expect("cpu communicator");
    let lib = standin();
    let device = Device::standin_host(&lib).unwrap();
    let gpu = GpuCommunicator::builder(&cpu, &device)
        .library(lib)
        .build()
        .expect("gpu communicator");
    (cpu, gpu)
}

/// Issue 45 in processes: rank 2 is killed (SIGKILL) while the others'
/// all-reduce waits for it. Their op fails naming it, they shrink the
/// CPU communicator and then the GPU one through `ncclCommShrink`, and
/// the two go on.
#[test]
fn a_killed_rank_is_shrunk_away_by_the_others() {
    const NAME: &str = "a_killed_rank_is_shrunk_away_by_the_others";
    if let Ok(rank) = std::env::var(RANK) {
        return survive_a_kill(rank.parse().unwrap());
    }
    for (rank, (status, text)) in spawn_ranks(NAME).into_iter().enumerate() {
        if rank == 2 {
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(status.signal(), Some(9), "rank 2 was killed:\n{text}");
            continue;
        }
        assert!(status.success(), "rank {rank}:\n{text}");
        assert!(
            text.contains(&format!("rank {rank} went on")),
            "rank {rank}:\n{text}"
        );
    }
}

fn survive_a_kill(rank: usize) {
    let (cpu, gpu) = join(rank);
    gpu.barrier().wait().expect("a barrier of all three");
    if rank == 2 {
        // The process ends here, as a crash would end it.
        let _ = std::process::Command::new("kill")
            .args(["-9", &std::process::id().to_string()])
            .status();
        std::thread::sleep(Duration::from_secs(60));
        unreachable!("SIGKILL ends the process");
    }
    let stuck = gpu
        .all_reduce(HostBuffer::new(vec![1f32; 64]), ReduceOp::Sum)
        .wait()
        .expect_err("an op that waits for the killed rank");
    assert!(stuck.to_string().contains("lost rank(s) [2]"), "{stuck}");
    let _ = cpu.all_reduce(vec![1u8; 4], ReduceOp::Sum).wait();
    let shrunk = cpu.shrink().wait().expect("CPU shrink");
    let smaller = gpu.shrink(&shrunk).expect("GPU shrink");
    assert!(smaller.made_by_nccl_shrink());
    let sum = smaller
        .all_reduce(
            HostBuffer::new(vec![rank as f32 + 1.0; 1001]),
            ReduceOp::Sum,
        )
        .wait()
        .expect("an all-reduce of the two")
        .into_vec();
    assert!(sum.iter().all(|&x| x == 3.0), "{:?}", &sum[..4]);
    println!("rank {rank} went on");
}

#[test]
fn three_processes_reduce_gather_and_meet() {
    if let Ok(rank) = std::env::var(RANK) {
        return child(rank.parse().unwrap());
    }
    let ranks = spawn_ranks("three_processes_reduce_gather_and_meet");
    for (rank, (status, text)) in ranks.into_iter().enumerate() {
        assert!(status.success(), "rank {rank}:\n{text}");
        assert!(
            text.contains(&format!("rank {rank} checked")),
            "rank {rank}:\n{text}"
        );
    }
}

fn child(rank: usize) {
    let (_cpu, gpu) = join(rank);
    let summed = gpu
        .all_reduce(
            HostBuffer::new(vec![rank as f32 + 1.0; 1001]),
            ReduceOp::Sum,
        )
        .wait()
        .expect("all_reduce")
        .into_vec();
    assert!(summed.iter().all(|&x| x == 6.0), "{:?}", &summed[..4]);
    let (_, gathered) = gpu
        .all_gather(
            HostBuffer::new(vec![rank as i64; 5]),
            HostBuffer::new(vec![0i64; 15]),
        )
        .wait()
        .expect("all_gather");
    assert_eq!(
        gathered.into_vec(),
        [0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2]
    );
    gpu.barrier().wait().expect("barrier");
    println!("rank {rank} checked");
}
