//! Open MPI's real `mpirun` starts ranks of this test binary with no
//! MASTER_ADDR or MASTER_PORT anywhere in their environment: ranks on one
//! host meet on loopback at the port derived from Open MPI's job id
//! (src/env/). Each test runs `mpirun` of this binary's `mpirun_child`
//! test, which does nothing unless RINGWIRE_TEST_CHILD names its part.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ringwire::testing::{Rng, check_close, random_data, reference_reduce};
use ringwire::{Communicator, ReduceOp, env};

/// Set (with `mpirun -x`) in the ranks: which part of `mpirun_child` runs.
const CHILD: &str = "RINGWIRE_TEST_CHILD";
/// Set in the ranks of the taken-port test: a file whose appearance says
/// the parent now holds the port.
const GO_FILE: &str = "RINGWIRE_TEST_GO";
/// Elements each rank reduces (about 280 KB of f32: the ring, chunked).
const LEN: usize = 70_001;

/// Variables that would give the ranks their rank or store from somewhere
/// other than mpirun: kept out of mpirun's environment, which its local
/// ranks inherit.
const FOREIGN: &[&str] = &[
    "MASTER_ADDR",
    "MASTER_PORT",
    "RINGWIRE_MASTER_ADDR",
    "RINGWIRE_MASTER_PORT",
    "RINGWIRE_RANK",
    "RINGWIRE_WORLD_SIZE",
    "RINGWIRE_LOCAL_RANK",
    "RINGWIRE_LOCAL_WORLD_SIZE",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "RINGWIRE_JOB_ID",
    "RINGWIRE_HOST_STORE",
    "RINGWIRE_STORE",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_RUN_ID",
];

/// The ranks' side. Every rank prints what it discovered before it joins,
/// and one line when it is done. (The harness prints "test mpirun_child
/// ... " before the first, on the same line.)
#[test]
fn mpirun_child() {
    let Ok(part) = std::env::var(CHILD) else {
        return; // run by the harness itself: nothing to do
    };
    let cfg = env::discover_from_process().expect("discover the launch environment");
    let rank = cfg.rank;
    println!(
        "discovered: rank {rank} addr {} port {} job {} from {:?}",
        cfg.master_addr,
        cfg.master_port,
        cfg.launcher_job_id.as_deref().unwrap_or("-"),
        cfg.master_from.as_deref().unwrap_or("-"),
    );
    match part.as_str() {
        "collectives" => collectives(&cfg),
        "taken" => port_taken(&cfg),
        "survive" => survive(&cfg),
        other => panic!("{CHILD}={other}: no such part"),
    }
}

/// Joins from the environment alone, then checks an all-reduce of random
/// data against a reference computed from every rank's input, and a
/// broadcast from the last rank.
fn collectives(cfg: &env::LaunchConfig) {
    let (rank, world) = (cfg.rank, cfg.world_size);
    let comm = Communicator::from_env()
        .wait()
        .unwrap_or_else(|e| panic!("rank {rank}: Communicator::from_env: {e}"));
    assert_eq!((comm.rank(), comm.world_size()), (rank, world));
    let seed: u64 = std::env::var("RINGWIRE_TEST_SEED")
        .expect("the parent passes its seed")
        .parse()
        .expect("a seed");
    let inputs: Vec<Vec<f32>> = (0..world)
        .map(|r| {
            random_data(
                &mut Rng::new(seed ^ ((r as u64 + 1) << 20)),
                LEN,
                ReduceOp::Sum,
            )
        })
        .collect();
    let reference = reference_reduce(&inputs, ReduceOp::Sum);
    let sum = comm
        .all_reduce(inputs[rank].clone(), ReduceOp::Sum)
        .wait()
        .unwrap_or_else(|e| panic!("rank {rank}: all_reduce: {e}"));
    check_close(&sum, &reference, world).unwrap_or_else(|e| panic!("rank {rank}: all_reduce: {e}"));
    let root = world - 1;
    let mut data = if rank == root {
        inputs[root].clone()
    } else {
        vec![0.0; LEN]
    };
    comm.broadcast_slice(&mut data, root)
        .unwrap_or_else(|e| panic!("rank {rank}: broadcast: {e}"));
    assert!(
        data == inputs[root],
        "rank {rank}: broadcast from {root} differs"
    );
    println!("rank {rank} of {world}: ok");
}

/// Rank 0 waits until the parent holds the derived port, then tries to
/// join: it must fail, saying why.
fn port_taken(cfg: &env::LaunchConfig) {
    if cfg.rank == 0 {
        let go = std::env::var(GO_FILE).expect("the parent names the go file");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !Path::new(&go).exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    match Communicator::from_env().wait() {
        Ok(_) => println!("rank {} joined, the port was free", cfg.rank),
        Err(e) => {
            println!("rank {} error: {e}", cfg.rank);
            panic!("rank {} could not join (as the test wants)", cfg.rank);
        }
    }
}

/// Issue 45: rank 2 kills itself (SIGKILL) after a few all-reduces; the
/// others see theirs fail, shrink to three and run a correct all-reduce
/// there, which only works if mpirun left them running.
fn survive(cfg: &env::LaunchConfig) {
    let rank = cfg.rank;
    let comm = Communicator::from_env()
        .wait()
        .unwrap_or_else(|e| panic!("rank {rank}: Communicator::from_env: {e}"));
    let (now, size) = common::lose_rank_2_and_go_on(&comm);
    println!("rank {rank} went on as {now} of {size}: ok");
}

/// `mpirun -np <np>` of `mpirun_child`, running `part`, with no MASTER_*.
fn mpirun(np: usize, part: &str, vars: &[(&str, String)]) -> Option<Command> {
    mpirun_with(&[], np, part, vars)
}

/// [`mpirun`] with `flags` of mpirun's own.
fn mpirun_with(flags: &[&str], np: usize, part: &str, vars: &[(&str, String)]) -> Option<Command> {
    let mpirun = common::launchers::mpirun()?;
    let mut cmd = Command::new(mpirun);
    // Root in containers; more ranks than this machine's 2 cores; Open
    // MPI ends the job itself if it hangs.
    cmd.args(["--allow-run-as-root", "--oversubscribe", "--timeout", "60"])
        .args(flags)
        .args(["-np", &np.to_string()])
        .args(["-x", &format!("{CHILD}={part}")]);
    for (var, value) in vars {
        cmd.args(["-x", &format!("{var}={value}")]);
    }
    cmd.arg(std::env::current_exe().expect("the test binary"))
        .args([
            "--exact",
            "mpirun_child",
            "--nocapture",
            "--test-threads",
            "1",
        ]);
    for var in FOREIGN {
        cmd.env_remove(var);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    Some(cmd)
}

/// A running mpirun: its stdout line by line as it comes, its stderr at
/// the end.
struct Job {
    child: Child,
    lines: mpsc::Receiver<String>,
    stdout: Vec<String>,
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl Job {
    fn start(mut cmd: Command) -> Job {
        let mut child = cmd.spawn().expect("start mpirun");
        let out = child.stdout.take().expect("piped");
        let mut err = child.stderr.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = err.read_to_string(&mut text);
            text
        });
        Job {
            child,
            lines,
            stdout: Vec::new(),
            stderr: Some(stderr),
        }
    }

    /// The next line of stdout that holds `part`, waiting up to `within`.
    fn line_with(&mut self, part: &str, within: Duration) -> Option<String> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            let line = self.lines.recv_timeout(left).ok()?;
            self.stdout.push(line.clone());
            if line.contains(part) {
                return Some(line);
            }
        }
    }

    /// Waits for mpirun to end (killing it after `within`): its status and
    /// everything it printed.
    fn finish(mut self, within: Duration) -> (ExitStatus, String) {
        let deadline = Instant::now() + within;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait for mpirun") {
                break status;
            }
            if Instant::now() > deadline {
                // SIGTERM: mpirun takes its ranks down with it.
                let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
                let status = self.child.wait().expect("wait for mpirun");
                panic!("mpirun ran past {within:?} ({status}):\n{}", self.text());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        (status, self.text())
    }

    /// Everything mpirun printed, once it has ended.
    fn text(&mut self) -> String {
        // The reader thread ends with mpirun's stdout: take what it still has.
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.stdout.push(line);
        }
        let stderr = self.stderr.take().map(|h| h.join().unwrap_or_default());
        format!(
            "--- stdout\n{}\n--- stderr\n{}",
            self.stdout.join("\n"),
            stderr.unwrap_or_default()
        )
    }
}

/// What each rank said it discovered: (rank, addr, port, job id).
fn discovered(text: &str) -> Vec<(usize, String, u16, String)> {
    text.lines()
        .filter_map(|line| {
            let (_, said) = line.split_once("discovered: ")?;
            let words: Vec<&str> = said.split(' ').collect();
            match words[..] {
                [
                    "rank",
                    rank,
                    "addr",
                    addr,
                    "port",
                    port,
                    "job",
                    job,
                    "from",
                    ..,
                ] => Some((
                    rank.parse().ok()?,
                    addr.to_owned(),
                    port.parse().ok()?,
                    job.to_owned(),
                )),
                _ => None,
            }
        })
        .collect()
}

/// Asserts that a job of `np` ranks succeeded, every rank on loopback at
/// the port derived from the job id they share; returns that port.
fn assert_all_ok(np: usize, status: ExitStatus, text: &str) -> u16 {
    assert!(status.success(), "mpirun failed ({status}):\n{text}");
    for rank in 0..np {
        assert!(
            text.contains(&format!("rank {rank} of {np}: ok")),
            "rank {rank} did not finish:\n{text}"
        );
    }
    let found = discovered(text);
    assert_eq!(found.len(), np, "{text}");
    let (_, addr, port, job) = &found[0];
    assert_eq!(addr, "127.0.0.1", "{text}");
    assert_eq!(*port, env::derived_port(job), "{text}");
    assert!(
        found
            .iter()
            .all(|(_, a, p, j)| (a, p, j) == (addr, port, job)),
        "ranks disagree:\n{text}"
    );
    *port
}

#[test]
fn three_ranks_join_with_no_master_variables() {
    let seed = common::seed();
    let Some(cmd) = mpirun(
        3,
        "collectives",
        &[("RINGWIRE_TEST_SEED", seed.to_string())],
    ) else {
        return;
    };
    let (status, text) = Job::start(cmd).finish(Duration::from_secs(90));
    assert_all_ok(3, status, &text);
}

#[test]
fn two_jobs_at_once_meet_at_their_own_ports() {
    let seed = common::seed();
    let vars = [("RINGWIRE_TEST_SEED", seed.to_string())];
    let (Some(a), Some(b)) = (
        mpirun(2, "collectives", &vars),
        mpirun(2, "collectives", &vars),
    ) else {
        return;
    };
    let (a, b) = (Job::start(a), Job::start(b));
    let (a, b) = (
        a.finish(Duration::from_secs(90)),
        b.finish(Duration::from_secs(90)),
    );
    let ports = [&a.1, &b.1].map(|text| discovered(text).first().map(|d| d.2));
    if ports[0].is_some() && ports[0] == ports[1] {
        // 1 chance in 12768: the second job then finds the port taken.
        eprintln!(
            "note: both jobs derived port {:?}; nothing to check",
            ports[0]
        );
        return;
    }
    let pa = assert_all_ok(2, a.0, &a.1);
    let pb = assert_all_ok(2, b.0, &b.1);
    assert_ne!(pa, pb);
}

#[test]
fn a_taken_derived_port_is_named_in_the_error() {
    let go = std::env::temp_dir().join(format!("ringwire-launch-mpi-go-{}", std::process::id()));
    let _ = std::fs::remove_file(&go);
    let vars = [
        (GO_FILE, go.display().to_string()),
        ("RINGWIRE_CONNECT_TIMEOUT", "10".to_owned()),
    ];
    let Some(cmd) = mpirun(2, "taken", &vars) else {
        return;
    };
    let mut job = Job::start(cmd);
    let Some(line) = job.line_with("discovered: rank 0 addr", Duration::from_secs(30)) else {
        let (status, text) = job.finish(Duration::from_secs(30));
        panic!("rank 0 never said its port ({status}):\n{text}");
    };
    let (_, _, port, _) = discovered(&line).pop().expect("rank 0's line");
    // Another job holds the port (if something else already does, it is
    // taken all the same).
    let _held = std::net::TcpListener::bind(("127.0.0.1", port));
    std::fs::write(&go, b"").expect("write the go file");
    let (status, text) = job.finish(Duration::from_secs(60));
    let _ = std::fs::remove_file(&go);
    assert!(!status.success(), "the job should fail:\n{text}");
    let error = text
        .lines()
        .find_map(|l| l.split_once("rank 0 error: ").map(|(_, e)| e))
        .unwrap_or_else(|| panic!("rank 0 gave no error:\n{text}"));
    assert!(
        error.contains(&port.to_string()) && error.contains("MASTER_PORT"),
        "the error names neither the port nor MASTER_PORT: {error}"
    );
    assert!(
        error.contains("derived from Open MPI's job id"),
        "the error does not say where the port came from: {error}"
    );
    // What rendezvous can add to that error (LaunchConfig::master_from).
    for part in [
        format!("MASTER_PORT {port} was derived from Open MPI's job id"),
        "set MASTER_PORT".to_owned(),
    ] {
        assert!(line.contains(&part), "{part:?} not in {line}");
    }
}

/// Issue 45 under a real launcher: Open MPI 4's mpirun ends the whole job
/// when a rank dies, unless told `--enable-recovery` (Open MPI 5:
/// `--with-ft ulfm`); with it, the three survivors of a SIGKILL shrink and
/// go on. mpirun's status is 0 in that mode whatever the ranks do, so the
/// ranks' own lines are the verdict.
#[test]
fn survivors_of_a_killed_rank_go_on_under_mpirun_enable_recovery() {
    let Some(cmd) = mpirun_with(&["--enable-recovery"], 4, "survive", &[]) else {
        return;
    };
    let (_, text) = Job::start(cmd).finish(Duration::from_secs(90));
    for (rank, now) in [(0, 0), (1, 1), (3, 2)] {
        assert!(
            text.contains(&format!("rank {rank} went on as {now} of 3: ok")),
            "rank {rank} did not go on:\n{text}"
        );
    }
}
