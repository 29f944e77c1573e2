//! ringwire programs under a real torchrun: its default launch (the agent
//! hosts a TCPStore on MASTER_PORT, workers join it), two agents meeting
//! through the c10d rendezvous, an elastic restart, and the error file
//! torchrun reads for its failure report.
//!
//! The programs are the `allreduce` example and this test binary itself,
//! started by torchrun with `RINGWIRE_TEST_CHILD` naming what a child does
//! (the `child` test below; it does nothing in a plain run).

mod common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use ringwire::{Communicator, ReduceOp};

const CHILD_VAR: &str = "RINGWIRE_TEST_CHILD";

/// A port nothing listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The first of `n` consecutive ports nothing listens on now, from
/// 10000-19999: below the ephemeral range (where `free_port` and every
/// outgoing connection take theirs) and below the ports mpirun jobs
/// derive, so no other test of the run picks one of them meanwhile.
fn free_ports(n: u16) -> u16 {
    let start = 10_000 + (std::process::id() % 9_000) as u16;
    for k in 0..9_000u16 {
        let base = 10_000 + (start - 10_000 + k * 7) % 9_000;
        let all: Vec<_> = (base..base + n)
            .map_while(|p| TcpListener::bind(("127.0.0.1", p)).ok())
            .collect();
        if all.len() == usize::from(n) {
            return base;
        }
    }
    panic!("no {n} consecutive free ports in 10000-19999");
}

/// The `allreduce` example `cargo test` built beside this test binary.
fn example() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let path = dir.join("examples/allreduce");
    assert!(
        path.exists(),
        "{} is not built: `cargo test` builds the examples, `cargo test --test torchrun` alone does not (cargo build --examples)",
        path.display()
    );
    path
}

/// A torchrun command (launch variables of this process cleared) with
/// `args`, giving setup a minute on a loaded machine.
fn torchrun(torchrun: &Path, args: &[&str]) -> Command {
    let mut cmd = common::launchers::torchrun_command(torchrun);
    cmd.env("RINGWIRE_CONNECT_TIMEOUT", "60").args(args);
    cmd
}

/// torchrun running this test binary's `child` test, doing `scenario`.
fn torchrun_child(torchrun_path: &Path, launch: &[&str], scenario: &str) -> Output {
    child_command(torchrun_path, launch, scenario)
        .output()
        .expect("run torchrun")
}

/// The command of [`torchrun_child`], to start.
fn child_command(torchrun_path: &Path, launch: &[&str], scenario: &str) -> Command {
    let exe = std::env::current_exe().unwrap();
    let mut args = launch.to_vec();
    args.extend([
        "--no-python",
        exe.to_str().unwrap(),
        "child",
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ]);
    let mut cmd = torchrun(torchrun_path, &args);
    cmd.env(CHILD_VAR, scenario);
    cmd
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn the_example_under_torchruns_default_launch() {
    let Some(torchrun_path) = common::launchers::torchrun() else {
        return;
    };
    // What a user types, with the port moved off 29500 so tests can run
    // side by side: torchrun's agent hosts a TCPStore there.
    let port = free_port().to_string();
    let out = torchrun(
        &torchrun_path,
        &[
            "--nproc-per-node",
            "4",
            "--master-port",
            &port,
            "--no-python",
        ],
    )
    .arg(example())
    .args(["--bytes", "1M", "--iters", "3"])
    .output()
    .unwrap();
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    assert!(all.contains("4 ranks, 1048576 bytes, checked OK"), "{all}");
}

#[test]
fn two_torchrun_agents_meet_through_c10d() {
    let Some(torchrun_path) = common::launchers::torchrun() else {
        return;
    };
    let endpoint = format!("127.0.0.1:{}", free_port());
    let agents: Vec<_> = (0..2)
        .map(|_| {
            torchrun(
                &torchrun_path,
                &[
                    "--nnodes",
                    "2",
                    "--nproc-per-node",
                    "2",
                    "--rdzv-backend",
                    "c10d",
                    "--rdzv-endpoint",
                    &endpoint,
                    "--rdzv-id",
                    "ringwire-two-agents",
                    "--no-python",
                ],
            )
            .arg(example())
            .args(["--bytes", "64K", "--iters", "3"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
        })
        .collect();
    let outs: Vec<Output> = agents
        .into_iter()
        .map(|a| a.wait_with_output().unwrap())
        .collect();
    let all: String = outs.iter().map(text).collect();
    for out in &outs {
        assert!(out.status.success(), "{all}");
    }
    assert_eq!(
        all.matches("4 ranks, 65536 bytes, checked OK").count(),
        1,
        "{all}"
    );
}

#[test]
fn an_elastic_restart_meets_apart_from_the_failed_attempt() {
    let Some(torchrun_path) = common::launchers::torchrun() else {
        return;
    };
    let port = free_port().to_string();
    let out = torchrun_child(
        &torchrun_path,
        &[
            "--nproc-per-node",
            "3",
            "--max-restarts",
            "1",
            "--master-port",
            &port,
        ],
        "fail-first-attempt",
    );
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    // Attempt 0 got through rendezvous (its keys are in the agent's store)
    // before rank 1 failed; attempt 1 claimed the same ranks again.
    assert!(all.contains("attempt 0: rank 1 fails on purpose"), "{all}");
    for rank in 0..3 {
        assert!(
            all.contains(&format!("attempt 1: rank {rank} done")),
            "{all}"
        );
    }
}

#[test]
fn torchruns_failure_report_shows_ringwires_error() {
    let Some(torchrun_path) = common::launchers::torchrun() else {
        return;
    };
    let port = free_port().to_string();
    let out = torchrun_child(
        &torchrun_path,
        &["--nproc-per-node", "2", "--master-port", &port],
        "mismatch",
    );
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    // The root cause is ringwire's message (op, sequence number, peer),
    // read from the error file, not torchrun's "<N/A>".
    let report = all.split("Root Cause").nth(1).expect("a failure report");
    assert!(report.contains("error_file: /"), "{report}");
    assert!(!report.contains("<N/A>"), "{report}");
    assert!(report.contains("all_reduce"), "{report}");
    assert!(
        report.contains("rank 1") || report.contains("rank 0"),
        "{report}"
    );
}

#[test]
fn the_error_file_reads_back_in_torchs_own_parser() {
    let Some(python) = common::launchers::python_with(&["torch.distributed.elastic"]) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("ringwire-error-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("error.json");
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args(["child", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_VAR, "record-error")
        .env("TORCHELASTIC_ERROR_FILE", &file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let check = r#"
import sys
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
f = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=sys.argv[1])
print(f.message["message"])
print(f.timestamp)
"#;
    let parsed = Command::new(python)
        .args(["-c", check, file.to_str().unwrap()])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&parsed.stdout);
    assert!(parsed.status.success(), "{}", text(&parsed));
    let mut lines = said.lines();
    assert_eq!(
        lines.next(),
        Some("op \"all_reduce\" #7 failed: \"quoted\", back\\slash, tab\tend")
    );
    let stamp: u64 = lines.next().unwrap().parse().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(stamp <= now && stamp + 60 > now, "{stamp} vs {now}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn each_rank_of_a_host_serves_metrics_at_its_own_port() {
    let Some(torchrun_path) = common::launchers::torchrun() else {
        return;
    };
    let base = free_ports(3);
    let port = free_port().to_string();
    let exe = std::env::current_exe().unwrap();
    let out = torchrun(
        &torchrun_path,
        &[
            "--nproc-per-node",
            "3",
            "--master-port",
            &port,
            "--no-python",
        ],
    )
    .arg(exe)
    .args(["child", "--exact", "--nocapture", "--test-threads=1"])
    .env(CHILD_VAR, "metrics-port")
    .env("RINGWIRE_METRICS_ADDR", format!("127.0.0.1:{base}"))
    .output()
    .unwrap();
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    for local in 0..3u16 {
        let want = format!(
            "local rank {local} serves metrics at 127.0.0.1:{}",
            base + local
        );
        assert!(all.contains(&want), "{want:?} not in {all}");
    }
}

/// What a child started by the tests above does; nothing in a plain run.
/// Issue 45: torchrun's agent stops every worker of its group when one
/// fails (and restarts them all, given restarts), so survivors need an
/// agent each: one per rank (`--nproc-per-node 1`), static rendezvous,
/// `--max-restarts 0`. Rank 2 of 3 kills itself; the other two shrink and
/// run a correct all-reduce. (Their agents then wait in torchrun's exit
/// barrier for the dead rank's agent, 300 s: the test ends them.)
#[test]
fn survivors_of_a_killed_rank_go_on_with_an_agent_per_rank() {
    let Some(torchrun_path) = common::launchers::torchrun() else {
        return;
    };
    let (agents, lines) = agents_per_rank(&torchrun_path, "0", "survive");
    let went_on = |said: &[String], rank: usize| {
        said.iter()
            .any(|l| l.contains(&format!("rank {rank} went on as {rank} of 2: ok")))
    };
    let said = lines_until(agents, &lines, |said| went_on(said, 0) && went_on(said, 1));
    assert!(
        went_on(&said, 0) && went_on(&said, 1),
        "{}",
        said.join("\n")
    );
}

/// Three torchrun agents of one rank each (static rendezvous, at `port`),
/// each running `scenario` with `restarts` restarts; every line their
/// workers and they print comes through the receiver.
fn agents_per_rank(
    torchrun_path: &Path,
    restarts: &str,
    scenario: &str,
) -> (Vec<std::process::Child>, std::sync::mpsc::Receiver<String>) {
    use std::io::BufRead;
    let port = free_port().to_string();
    let (tx, lines) = std::sync::mpsc::channel::<String>();
    let agents = (0..3)
        .map(|node| {
            let node = node.to_string();
            let launch = [
                "--nnodes",
                "3",
                "--node-rank",
                &node,
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                &port,
                "--nproc-per-node",
                "1",
                "--max-restarts",
                restarts,
            ];
            let mut agent = child_command(torchrun_path, &launch, scenario)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            for out in [
                Box::new(agent.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
                Box::new(agent.stderr.take().unwrap()),
            ] {
                let tx = tx.clone();
                std::thread::spawn(move || {
                    for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                        let _ = tx.send(line);
                    }
                });
            }
            agent
        })
        .collect();
    (agents, lines)
}

/// The lines that came until `done` says enough did (or two minutes
/// passed); then the agents are ended (the survivors' would wait in
/// torchrun's exit barrier for the dead rank's agent).
fn lines_until(
    mut agents: Vec<std::process::Child>,
    lines: &std::sync::mpsc::Receiver<String>,
    done: impl Fn(&[String]) -> bool,
) -> Vec<String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut said = Vec::new();
    while !done(&said) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => said.push(line),
            Err(_) => break,
        }
    }
    for agent in &mut agents {
        let _ = agent.kill();
        let _ = agent.wait();
    }
    said
}

/// Issue 45, decision 0040: as above, but the dead rank's agent restarts
/// it (`--max-restarts 1`, same RANK, TORCHELASTIC_RESTART_COUNT 1): the
/// restarted worker rejoins in its old place, the survivors admit it, and
/// all three run a correct all-reduce.
#[test]
fn a_killed_rank_restarted_by_its_agent_rejoins() {
    let Some(torchrun_path) = common::launchers::torchrun() else {
        return;
    };
    let (agents, lines) = agents_per_rank(&torchrun_path, "1", "rejoin");
    let done = |said: &[String]| {
        (0..3).all(|rank| {
            said.iter()
                .any(|l| l.contains(&format!("rank {rank} of 3 after the rejoin: ok")))
        })
    };
    let said = lines_until(agents, &lines, done);
    let all = said.join("\n");
    assert!(done(&said), "{all}");
    assert!(all.contains("rank 2 rejoined as incarnation"), "{all}");
}

/// The `rejoin` scenario: in the first attempt, rank 2 dies as in
/// `survive` and the others shrink, then wait for its replacement and
/// admit it; the restarted rank 2 rejoins. All three then all-reduce.
fn rejoin() -> std::process::ExitCode {
    let comm = if attempt() == 0 {
        let comm = Communicator::from_env().wait().expect("join");
        let rank = comm.rank();
        let shrunk = common::lose_rank_2(&comm);
        let until = std::time::Instant::now() + Duration::from_secs(90);
        while shrunk.joiners_waiting().expect("joiners_waiting") == 0 {
            assert!(
                std::time::Instant::now() < until,
                "rank {rank}: nobody came"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        shrunk.admit().wait().expect("admit")
    } else {
        let comm = ringwire::Builder::from_env()
            .expect("launch variables")
            .rejoin(true)
            .build()
            .wait()
            .expect("rejoin");
        println!("rank {} rejoined as incarnation {}", comm.rank(), attempt());
        comm
    };
    let sum = comm
        .all_reduce(vec![1.0f32; 1000], ReduceOp::Sum)
        .wait()
        .expect("all_reduce after the rejoin");
    assert!(sum.iter().all(|&x| x == 3.0), "{}", sum[0]);
    println!(
        "rank {} of {} after the rejoin: ok",
        comm.rank(),
        comm.world_size()
    );
    std::process::ExitCode::SUCCESS
}

/// The `survive` scenario: rank 2 of 3 dies by SIGKILL after a few
/// all-reduces; the others shrink and go on.
fn survive() -> std::process::ExitCode {
    let comm = Communicator::from_env().wait().expect("join");
    let (now, size) = common::lose_rank_2_and_go_on(&comm);
    println!("rank {} went on as {now} of {size}: ok", comm.rank());
    std::process::ExitCode::SUCCESS
}

#[test]
fn child() {
    let Ok(scenario) = std::env::var(CHILD_VAR) else {
        return;
    };
    let code = match scenario.as_str() {
        "fail-first-attempt" => fail_first_attempt(),
        "mismatch" => ringwire::error_file::main(mismatch),
        "metrics-port" => ringwire::error_file::main(metrics_port),
        "survive" => survive(),
        "rejoin" => rejoin(),
        "record-error" => {
            ringwire::error_file::report(
                &"op \"all_reduce\" #7 failed: \"quoted\", back\\slash, tab\tend",
            );
            std::process::exit(0);
        }
        other => panic!("unknown {CHILD_VAR}={other}"),
    };
    // The libtest harness would print its summary; the exit code is the
    // child's answer.
    std::process::exit(if code == std::process::ExitCode::SUCCESS {
        0
    } else {
        1
    });
}

fn attempt() -> u64 {
    std::env::var("TORCHELASTIC_RESTART_COUNT")
        .unwrap()
        .parse()
        .unwrap()
}

fn fail_first_attempt() -> std::process::ExitCode {
    let comm = Communicator::from_env().wait().expect("rendezvous");
    let (rank, attempt) = (comm.rank(), attempt());
    let sum = comm
        .all_reduce(vec![1.0f32; 100], ReduceOp::Sum)
        .wait()
        .unwrap();
    assert_eq!(sum, vec![3.0f32; 100]);
    if attempt == 0 {
        if rank == 1 {
            println!("attempt 0: rank 1 fails on purpose");
            std::process::exit(1);
        }
        // The others wait to be stopped by the agent.
        std::thread::sleep(Duration::from_secs(120));
    }
    comm.barrier().wait().unwrap();
    println!("attempt {attempt}: rank {rank} done");
    std::process::ExitCode::SUCCESS
}

/// Each rank scrapes its own server (every rank's is up once the barrier
/// passes) and says where it serves.
fn metrics_port() -> Result<(), ringwire::Error> {
    let comm = Communicator::from_env().wait()?;
    comm.all_reduce(vec![1.0f32; 8], ReduceOp::Sum).wait()?;
    comm.barrier().wait()?;
    let addr = ringwire::metrics::server_addr().expect("a metrics server");
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    use std::io::{Read, Write};
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut page = String::new();
    stream.read_to_string(&mut page).unwrap();
    let rank = comm.rank();
    assert!(
        page.contains(&format!("rank=\"{rank}\"")),
        "rank {rank}'s page: {page}"
    );
    let local = std::env::var("LOCAL_RANK").unwrap();
    println!("local rank {local} serves metrics at {addr}");
    comm.barrier().wait()?;
    Ok(())
}

fn mismatch() -> Result<(), ringwire::Error> {
    // Lengths differ across ranks: each rank's op fails at once from the
    // other's frame header, naming both sides.
    let comm = Communicator::from_env().wait()?;
    let len = 100 + comm.rank();
    comm.all_reduce(vec![1.0f32; len], ReduceOp::Sum).wait()?;
    Ok(())
}
