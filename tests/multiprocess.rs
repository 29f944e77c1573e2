//! The collective sweep with every rank in its own process, launched the way
//! torchrun launches ranks (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT),
//! with rank 0 hosting the store: world sizes 1 to 4.
//!
//! The parent test re-runs this test binary once per rank with
//! `--exact child_rank --include-ignored`; `child_rank` does the rank's work
//! and is ignored in a normal run.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHILD_VAR: &str = "RINGWIRE_TEST_CHILD";

fn free_port() -> u16 {
    // Only rank 0 binds this port (for its store); nothing else races for it
    // in the test, and a collision shows as a clear bind error.
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn launch(world: usize, seed: u64, extra_env: &[(&str, String)]) -> Vec<std::process::Output> {
    let exe = std::env::current_exe().unwrap();
    let port = free_port();
    let children: Vec<_> = (0..world)
        .map(|rank| {
            let mut cmd = Command::new(&exe);
            cmd.args([
                "--exact",
                "child_rank",
                "--include-ignored",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(CHILD_VAR, "1")
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("LOCAL_WORLD_SIZE", world.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("RINGWIRE_TEST_SEED", seed.to_string())
            .env("RINGWIRE_TIMEOUT", "60")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
            for (k, v) in extra_env {
                cmd.env(k, v);
            }
            cmd.spawn().expect("spawn rank")
        })
        .collect();
    children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect()
}

fn run_world(world: usize) {
    let seed = common::seed();
    let start = Instant::now();
    let outputs = launch(world, seed, &[]);
    for (rank, out) in outputs.iter().enumerate() {
        assert!(
            out.status.success(),
            "seed {seed}: rank {rank} of {world} failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("CHILD-OK"),
            "rank {rank} did not run the sweep"
        );
    }
    eprintln!("world {world}: {:?}", start.elapsed());
}

#[test]
#[ignore = "runs only as a child of the multi-process tests"]
fn child_rank() {
    if std::env::var(CHILD_VAR).is_err() {
        return;
    }
    let seed: u64 = std::env::var("RINGWIRE_TEST_SEED")
        .unwrap()
        .parse()
        .unwrap();
    let comm = ringwire::Communicator::from_env()
        .wait()
        .expect("join from env");
    if let Ok(mode) = std::env::var("RINGWIRE_TEST_MODE") {
        if mode == "mismatch" {
            // Ranks pass different lengths: every rank must fail naming both.
            let n = 1000 - comm.rank();
            let err = comm
                .all_reduce(vec![1.0f32; n], ringwire::ReduceOp::Sum)
                .wait()
                .unwrap_err();
            println!("CHILD-ERR {err}");
            return;
        }
    }
    common::sweep::every_dtype(&comm, seed).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    // Sub-groups across processes too.
    let sub = comm
        .split(Some((comm.rank() % 2) as u32), 0)
        .unwrap()
        .unwrap();
    let got = sub
        .all_reduce(vec![1i64; 5], ringwire::ReduceOp::Sum)
        .wait()
        .unwrap();
    assert_eq!(got[0] as usize, sub.world_size());
    println!("CHILD-OK rank {}", comm.rank());
}

#[test]
fn processes_world_1() {
    run_world(1);
}

#[test]
fn processes_world_2() {
    run_world(2);
}

#[test]
fn processes_world_3() {
    run_world(3);
}

#[test]
fn processes_world_4() {
    run_world(4);
}

#[test]
fn processes_mismatch_fails_on_every_rank() {
    let outputs = launch(
        2,
        1,
        &[
            ("RINGWIRE_TEST_MODE", "mismatch".into()),
            ("RINGWIRE_TIMEOUT", "10".into()),
        ],
    );
    for (rank, out) in outputs.iter().enumerate() {
        let stdout = String::from_utf8_lossy(&out.stdout);
        let line = stdout
            .lines()
            .find_map(|l| l.split_once("CHILD-ERR").map(|x| x.1))
            .unwrap_or_else(|| {
                panic!(
                    "rank {rank} printed no error:\n{stdout}\n{}",
                    String::from_utf8_lossy(&out.stderr)
                )
            });
        assert!(
            line.contains("1000") && line.contains("999"),
            "rank {rank}: {line}"
        );
    }
}

#[test]
fn a_second_process_claiming_a_rank_is_refused() {
    let exe = std::env::current_exe().unwrap();
    let port = free_port();
    let spawn = |rank: usize| {
        Command::new(&exe)
            .args([
                "--exact",
                "child_rank",
                "--include-ignored",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(CHILD_VAR, "1")
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", "3")
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("RINGWIRE_TEST_SEED", "1")
            .env("RINGWIRE_CONNECT_TIMEOUT", "3")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let first = spawn(0);
    std::thread::sleep(Duration::from_millis(300));
    let a = spawn(1);
    let b = spawn(1);
    let outs: Vec<_> = [first, a, b]
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let all: String = outs
        .iter()
        .map(|o| {
            String::from_utf8_lossy(&o.stderr).into_owned() + &String::from_utf8_lossy(&o.stdout)
        })
        .collect();
    assert!(all.contains("two processes claim rank 1"), "{all}");
    assert!(
        outs.iter().all(|o| !o.status.success()),
        "nobody may succeed without rank 2"
    );
}
