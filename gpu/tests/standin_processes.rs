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

#[test]
fn three_processes_reduce_gather_and_meet() {
    if let Ok(rank) = std::env::var(RANK) {
        return child(rank.parse().unwrap());
    }
    let store = ringwire::store::StoreServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let port = store.local_addr().port().to_string();
    let lib = common::standin_path();
    let children: Vec<_> = (0..WORLD)
        .map(|rank| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "three_processes_reduce_gather_and_meet",
                    "--nocapture",
                ])
                .env(RANK, rank.to_string())
                .env("RINGWIRE_TEST_STORE_PORT", &port)
                .env("RINGWIRE_STANDIN_NCCL", &lib)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (rank, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "rank {rank}:\n{text}");
        assert!(
            text.contains(&format!("rank {rank} checked")),
            "rank {rank}:\n{text}"
        );
    }
}

fn child(rank: usize) {
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
