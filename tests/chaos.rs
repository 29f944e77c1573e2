//! Chaos (issue 45): seeded random trials of 4 to 8 ranks, each in its own
//! process, running a mix of collectives on two communicators (the job's,
//! and a split of it) while one or two of them are killed with SIGKILL at
//! random moments (in ops, in `agree`, in `shrink`) or stopped with
//! SIGSTOP. The survivors recover as a ULFM program does: an op that fails
//! revokes both communicators; every step ends with `agree` on "my ops
//! went well"; anything short of every member saying yes runs `shrink`,
//! and the split is made again on the shrunk communicator.
//!
//! Every trial checks that every survivor ends with the same history of
//! memberships (who was in each shrunk communicator, and from which step),
//! that it is the ranks still alive, that every op that returned `Ok`
//! returned the right data, that nothing runs past its bound, and that
//! once the communicators are dropped no thread, descriptor or
//! shared-memory mapping of ringwire's is left in any survivor.
//!
//! `cargo test --test chaos` runs `CHAOS_TRIALS` trials (12) from
//! `CHAOS_SEED` (fresh, printed); `benches/chaos.sh` runs hundreds and
//! reports hangs, disagreements and wrong results.

mod common;

use ringwire::testing::Rng;
use ringwire::{Communicator, ReduceOp};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const CHILD_VAR: &str = "RINGWIRE_CHAOS_CHILD";

/// A rank's op timeout: what bounds a wait for a stopped rank that the
/// heartbeat has not yet declared lost.
const OP_TIMEOUT_S: u64 = 10;

/// How long a trial may run before the ranks still running count as hung.
const TRIAL_LIMIT: Duration = Duration::from_secs(90);

/// How one rank of a trial is hurt.
#[derive(Clone, Copy, Debug)]
enum Hurt {
    /// SIGKILL from the test, `after` the ranks are up.
    Kill { after: Duration },
    /// SIGSTOP from the test `after` the ranks are up (SIGKILL once the
    /// others are done).
    Stop { after: Duration },
    /// SIGKILL to itself `delay` after it starts the `agree` of `step`.
    DieInAgree { step: u64, delay: Duration },
    /// Fails `step` on purpose (revokes, and says no in the agreement),
    /// and SIGKILL to itself `delay` after it starts the `shrink` that
    /// follows.
    DieInShrink { step: u64, delay: Duration },
}

impl Hurt {
    /// What the rank itself is told (its own deaths).
    fn env(&self) -> Option<String> {
        match *self {
            Hurt::DieInAgree { step, delay } => Some(format!("agree:{step}:{}", delay.as_micros())),
            Hurt::DieInShrink { step, delay } => {
                Some(format!("shrink:{step}:{}", delay.as_micros()))
            }
            _ => None,
        }
    }
}

/// One trial's plan, all from its seed.
#[derive(Debug)]
struct Plan {
    seed: u64,
    world: usize,
    /// How long the ranks go on (they agree when to stop).
    run_for: Duration,
    /// `tcp`, or shared memory (`shm`, the default).
    local_links: &'static str,
    hurt: Vec<(usize, Hurt)>,
}

impl Plan {
    fn new(seed: u64) -> Plan {
        let mut rng = Rng::new(seed);
        let world = 4 + rng.below(5) as usize;
        let run_for = Duration::from_millis(1500);
        // Steps take a few ms: a rank that dies in an agreement or a
        // shrink does so in the first thirty.
        let steps = 30;
        let local_links = if rng.below(2) == 0 { "shm" } else { "tcp" };
        // A majority of every membership must stay: one rank of 4 or 5,
        // up to two of 6 to 8.
        let count = if world >= 6 {
            1 + rng.below(2) as usize
        } else {
            1
        };
        let mut ranks: Vec<usize> = (0..world).collect();
        let mut hurt = Vec::new();
        let mut stopped = false;
        for _ in 0..count {
            let rank = ranks.remove(rng.below(ranks.len() as u64) as usize);
            let after = Duration::from_millis(rng.below(1200));
            let delay = Duration::from_micros(rng.below(3000));
            let how = match rng.below(8) {
                0..=3 => Hurt::Kill { after },
                4 if !stopped => {
                    stopped = true;
                    Hurt::Stop { after }
                }
                4 | 5 => Hurt::DieInAgree {
                    step: rng.below(steps),
                    delay,
                },
                _ => Hurt::DieInShrink {
                    step: rng.below(steps),
                    delay,
                },
            };
            hurt.push((rank, how));
        }
        Plan {
            seed,
            world,
            run_for,
            local_links,
            hurt,
        }
    }
}

/// What went wrong in a trial, by kind (`benches/chaos.sh` counts them).
#[derive(Debug, Default)]
struct Verdict {
    hangs: Vec<String>,
    disagreements: Vec<String>,
    wrong: Vec<String>,
    leaks: Vec<String>,
    other: Vec<String>,
}

impl Verdict {
    fn clean(&self) -> bool {
        self.hangs.is_empty()
            && self.disagreements.is_empty()
            && self.wrong.is_empty()
            && self.leaks.is_empty()
            && self.other.is_empty()
    }
}

#[test]
fn chaos_trials() {
    let trials: u64 = std::env::var("CHAOS_TRIALS").map_or(12, |v| v.parse().unwrap());
    let first = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(Rng::fresh_seed);
    eprintln!("chaos: {trials} trials from seed {first} (rerun with CHAOS_SEED={first})");
    let mut totals = Verdict::default();
    let mut shrinks = 0;
    for t in 0..trials {
        let plan = Plan::new(first.wrapping_add(t));
        let started = Instant::now();
        let (verdict, shrunk) = run_trial(&plan);
        shrinks += shrunk;
        eprintln!(
            "trial {t} seed {} world {} {} {:?}: {} in {:.1} s, {shrunk} shrink(s)",
            plan.seed,
            plan.world,
            plan.local_links,
            plan.hurt,
            if verdict.clean() { "ok" } else { "FAILED" },
            started.elapsed().as_secs_f64()
        );
        for (kind, list) in [
            ("hang", &verdict.hangs),
            ("disagreement", &verdict.disagreements),
            ("wrong", &verdict.wrong),
            ("leak", &verdict.leaks),
            ("other", &verdict.other),
        ] {
            for what in list {
                eprintln!("  {kind}: {what}");
            }
        }
        totals.hangs.extend(verdict.hangs);
        totals.disagreements.extend(verdict.disagreements);
        totals.wrong.extend(verdict.wrong);
        totals.leaks.extend(verdict.leaks);
        totals.other.extend(verdict.other);
    }
    eprintln!(
        "CHAOS-SUMMARY trials={trials} hangs={} disagreements={} wrong={} leaks={} other={} shrinks={shrinks}",
        totals.hangs.len(),
        totals.disagreements.len(),
        totals.wrong.len(),
        totals.leaks.len(),
        totals.other.len(),
    );
    assert!(totals.clean(), "chaos trials failed (see above)");
    // The trials hurt ranks while they ran, and the others went on.
    assert!(
        trials < 4 || shrinks > 0,
        "no trial shrank: the ranks were not hurt while they ran"
    );
}

/// What one rank printed and how it ended.
#[derive(Default)]
struct RankRun {
    lines: Vec<String>,
    status: Option<std::process::ExitStatus>,
}

/// Runs `plan`: the verdict, and how many shrinks the survivors ran.
fn run_trial(plan: &Plan) -> (Verdict, usize) {
    let store =
        ringwire::store::StoreServer::bind("127.0.0.1:0".parse().unwrap()).expect("bind store");
    let port = store.local_addr().port();
    let (lines_tx, lines) = mpsc::channel::<(usize, Option<String>)>();
    // A stopped rank is found by the heartbeat: a short one where a rank
    // is stopped, the default (10 s) elsewhere, so that a rank slowed by
    // 8 processes on 2 cores is not taken for lost.
    let stops = plan
        .hurt
        .iter()
        .any(|(_, h)| matches!(h, Hurt::Stop { .. }));
    let heartbeat_s = if stops { 3 } else { 10 };
    let mut children: Vec<Child> = (0..plan.world)
        .map(|rank| {
            let mut env = vec![
                ("RINGWIRE_LOCAL_LINKS", plan.local_links.to_string()),
                ("RINGWIRE_HEARTBEAT_TIMEOUT", heartbeat_s.to_string()),
                ("CHAOS_TRIAL_SEED", plan.seed.to_string()),
                ("CHAOS_RUN_MS", plan.run_for.as_millis().to_string()),
            ];
            if let Some(die) = plan
                .hurt
                .iter()
                .find(|(r, _)| *r == rank)
                .and_then(|(_, h)| h.env())
            {
                env.push(("CHAOS_DIE", die));
            }
            spawn_rank(rank, plan.world, port, &env, &lines_tx)
        })
        .collect();
    drop(lines_tx);
    let mut runs: Vec<RankRun> = (0..plan.world).map(|_| RankRun::default()).collect();
    let mut open = plan.world;
    let mut ready = 0;
    let mut up_at: Option<Instant> = None;
    let mut done_external: Vec<bool> = vec![false; plan.hurt.len()];
    let started = Instant::now();
    let mut verdict = Verdict::default();
    let pid = |c: &Child| nix::unistd::Pid::from_raw(c.id() as i32);
    // Read every rank's lines; hurt ranks on schedule once all are up.
    while open > 0 {
        if started.elapsed() > TRIAL_LIMIT {
            for (rank, run) in runs.iter().enumerate() {
                let last = run.lines.last().map_or("", String::as_str);
                if run.status.is_none() && !run.lines.iter().any(|l| l == "CHAOS-END") {
                    verdict
                        .hangs
                        .push(format!("rank {rank} still running; last said: {last}"));
                }
            }
            break;
        }
        if let Some(up) = up_at {
            for (i, (rank, how)) in plan.hurt.iter().enumerate() {
                let (signal, after) = match *how {
                    Hurt::Kill { after } => (nix::sys::signal::Signal::SIGKILL, after),
                    Hurt::Stop { after } => (nix::sys::signal::Signal::SIGSTOP, after),
                    _ => continue,
                };
                if !done_external[i] && up.elapsed() >= after {
                    done_external[i] = true;
                    let _ = nix::sys::signal::kill(pid(&children[*rank]), signal);
                }
            }
        }
        match lines.recv_timeout(Duration::from_millis(5)) {
            Ok((rank, Some(line))) => {
                if line == "CHAOS-READY" {
                    ready += 1;
                    if ready == plan.world {
                        up_at = Some(Instant::now());
                    }
                }
                runs[rank].lines.push(line);
            }
            Ok((_, None)) => open -= 1,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        // A stopped rank never closes its output: once every other rank
        // is done, it is killed.
        let stopped: Vec<usize> = plan
            .hurt
            .iter()
            .enumerate()
            .filter(|(i, (_, h))| matches!(h, Hurt::Stop { .. }) && done_external[*i])
            .map(|(_, (r, _))| *r)
            .collect();
        let others_done = (0..plan.world)
            .filter(|r| !stopped.contains(r))
            .all(|r| children[r].try_wait().ok().flatten().is_some());
        if !stopped.is_empty() && others_done {
            for &r in &stopped {
                let _ = children[r].kill();
            }
        }
    }
    for (rank, child) in children.iter_mut().enumerate() {
        if runs[rank].status.is_none() && child.try_wait().ok().flatten().is_none() {
            let _ = child.kill();
        }
        runs[rank].status = child.wait().ok();
    }
    drop(store);
    if std::env::var_os("CHAOS_VERBOSE").is_some() {
        for (rank, run) in runs.iter().enumerate() {
            eprintln!("rank {rank} ({:?}):", run.status);
            for line in &run.lines {
                eprintln!("  {line}");
            }
        }
    }
    let shrinks = judge(&runs, &mut verdict);
    (verdict, shrinks)
}

/// Starts `rank` of `world` (this binary's `chaos_rank`) against the store
/// at `port`, with `env`; its stdout's lines go to `lines` (`None` at its
/// end).
fn spawn_rank(
    rank: usize,
    world: usize,
    port: u16,
    env: &[(&str, String)],
    lines: &mpsc::Sender<(usize, Option<String>)>,
) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "chaos_rank",
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
    .env("RINGWIRE_HOST_STORE", "0")
    .env("RINGWIRE_TIMEOUT", OP_TIMEOUT_S.to_string())
    .env_remove("RINGWIRE_TRANSPORT")
    .stdout(Stdio::piped())
    .stderr(match std::env::var_os("CHAOS_STDERR") {
        // A folder for each rank's stderr (with RINGWIRE_TEST_LOG, its log),
        // each trial's appended.
        Some(dir) => Stdio::from(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(std::path::Path::new(&dir).join(format!("rank-{rank}.err")))
                .expect("a file in CHAOS_STDERR"),
        ),
        None => Stdio::null(),
    });
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn a rank");
    let out = child.stdout.take().unwrap();
    let tx = lines.clone();
    std::thread::spawn(move || {
        for mut line in BufReader::new(out).lines().map_while(Result::ok) {
            // The test harness may print before a rank's first line.
            if let Some(at) = line.find("CHAOS-") {
                line.drain(..at);
            }
            let _ = tx.send((rank, Some(line)));
        }
        let _ = tx.send((rank, None));
    });
    child
}

/// Checks the ranks' reports against each other and against who died.
fn judge(runs: &[RankRun], verdict: &mut Verdict) -> usize {
    use std::os::unix::process::ExitStatusExt;
    let killed = |rank: usize| {
        runs[rank]
            .status
            .is_some_and(|s| s.signal() == Some(nix::libc::SIGKILL))
    };
    let mut histories: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    let mut finals: BTreeMap<usize, String> = BTreeMap::new();
    for (rank, run) in runs.iter().enumerate() {
        for line in &run.lines {
            if let Some(what) = line.strip_prefix("CHAOS-WRONG ") {
                verdict.wrong.push(format!("rank {rank}: {what}"));
            }
            if let Some(what) = line.strip_prefix("CHAOS-LEAK ") {
                verdict.leaks.push(format!("rank {rank}: {what}"));
            }
            if let Some(what) = line.strip_prefix("CHAOS-OUT ") {
                verdict
                    .other
                    .push(format!("rank {rank} dropped out: {what}"));
            }
            if let Some(what) = line.strip_prefix("CHAOS-SHRUNK ") {
                histories.entry(rank).or_default().push(what.to_string());
            }
            if let Some(what) = line.strip_prefix("CHAOS-DONE ") {
                finals.insert(rank, what.to_string());
            }
        }
        if killed(rank) {
            continue;
        }
        match run.status {
            Some(s) if s.success() && !finals.contains_key(&rank) => verdict
                .other
                .push(format!("rank {rank} ended without finishing its steps")),
            Some(s) if s.success() => {}
            Some(s) => verdict.other.push(format!(
                "rank {rank} ended with {s}; last said {:?}",
                run.lines.last()
            )),
            None => {}
        }
    }
    // Every rank that finished went through the same shrinks and ended
    // with the same members: the ranks that finished.
    let finished: Vec<usize> = finals.keys().copied().collect();
    let expected = format!("{finished:?}");
    for (rank, members) in &finals {
        if *members != expected {
            verdict.disagreements.push(format!(
                "rank {rank} ended with members {members}, but {expected} finished"
            ));
        }
    }
    let first_history = finished.first().map(|r| histories.get(r));
    for rank in &finished {
        if Some(histories.get(rank)) != first_history {
            verdict.disagreements.push(format!(
                "rank {rank} shrank as {:?}, rank {} as {:?}",
                histories.get(rank),
                finished[0],
                first_history.flatten()
            ));
        }
    }
    first_history.flatten().map_or(0, Vec::len)
}

/// What a rank does to itself (`CHAOS_DIE`): die in the agreement of
/// `step`, or fail `step` and die in the shrink after it; `delay` after
/// that starts.
struct Die {
    in_shrink: bool,
    step: u64,
    delay: Duration,
}

/// SIGKILL to this process `delay` from now.
fn die_after(delay: Duration) {
    std::thread::spawn(move || {
        std::thread::sleep(delay);
        let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGKILL);
    });
}

/// The value rank `w` (of the job) puts at element `i` of op `op` at
/// `step`: small integers, exact in every type and in any sum of 8.
fn value(w: usize, step: u64, op: u64, i: usize) -> i64 {
    let x = (w as u64 * 1_000_003) ^ (step * 7919) ^ (op * 104_729) ^ (i as u64 * 31);
    (x % 201) as i64 - 100
}

/// Why a step did not go through.
enum StepError {
    /// An op failed (a lost rank, a revoked communicator, a timeout).
    Failed(ringwire::Error),
    /// An op returned data that is not what the members sent.
    Wrong(String),
}

impl From<ringwire::Error> for StepError {
    fn from(e: ringwire::Error) -> StepError {
        StepError::Failed(e)
    }
}

fn expect_eq<T: PartialEq + std::fmt::Debug>(
    what: &str,
    got: &[T],
    want: &[T],
) -> Result<(), StepError> {
    if got.len() != want.len() {
        return Err(StepError::Wrong(format!(
            "{what}: {} elements, expected {}",
            got.len(),
            want.len()
        )));
    }
    match got.iter().zip(want).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(i) => Err(StepError::Wrong(format!(
            "{what}: element {i} of {} is {:?}, expected {:?}",
            got.len(),
            got[i],
            want[i]
        ))),
    }
}

/// One step's ops on `comm` and on its split (made here if there is none).
fn run_step(
    comm: &Communicator,
    sub: &mut Option<Communicator>,
    seed: u64,
    step: u64,
) -> Result<(), StepError> {
    let members = comm.world_ranks();
    let (n, me) = (comm.world_size(), comm.rank());
    let w = members[me];
    let mut rng = Rng::new(seed ^ step.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let len = |rng: &mut Rng| match rng.below(6) {
        0 => 0,
        1 => 1,
        2 => 7 + rng.below(100) as usize,
        3 => 1000 + rng.below(5000) as usize,
        // 1 to 2 MiB of i64: long enough for a kill to land inside.
        4 if step.is_multiple_of(4) => (1 << 17) + rng.below(1 << 17) as usize,
        _ => 333,
    };
    // All-reduce, sum of i64.
    let l = len(&mut rng);
    let mine: Vec<i64> = (0..l).map(|i| value(w, step, 0, i)).collect();
    let got = comm.all_reduce(mine, ReduceOp::Sum).wait()?;
    let want: Vec<i64> = (0..l)
        .map(|i| members.iter().map(|&m| value(m, step, 0, i)).sum())
        .collect();
    expect_eq("all_reduce i64 sum", &got, &want)?;
    // Broadcast of f32 from a root of the step's choosing.
    let l = len(&mut rng);
    let root = rng.below(n as u64) as usize;
    let data: Vec<f32> = match me == root {
        true => (0..l).map(|i| value(w, step, 1, i) as f32).collect(),
        false => vec![f32::NAN; l],
    };
    let got = comm.broadcast(data, root).wait()?;
    let want: Vec<f32> = (0..l)
        .map(|i| value(members[root], step, 1, i) as f32)
        .collect();
    expect_eq("broadcast f32", &got, &want)?;
    // All-gather of i32 blocks.
    let block = rng.below(300) as usize;
    let mine: Vec<i32> = (0..block).map(|i| value(w, step, 2, i) as i32).collect();
    let (_, got) = comm.all_gather(mine, vec![0i32; block * n]).wait()?;
    let want: Vec<i32> = members
        .iter()
        .flat_map(|&m| (0..block).map(move |i| value(m, step, 2, i) as i32))
        .collect();
    expect_eq("all_gather i32", &got, &want)?;
    // Reduce-scatter, max of f64.
    let block = rng.below(300) as usize;
    let input = |m: usize| (0..block * n).map(move |i| value(m, step, 3, i) as f64);
    let (_, got) = comm
        .reduce_scatter(
            input(w).collect::<Vec<f64>>(),
            vec![0f64; block],
            ReduceOp::Max,
        )
        .wait()?;
    let want: Vec<f64> = (me * block..(me + 1) * block)
        .map(|i| {
            members
                .iter()
                .map(|&m| value(m, step, 3, i) as f64)
                .fold(f64::MIN, f64::max)
        })
        .collect();
    expect_eq("reduce_scatter f64 max", &got, &want)?;
    // The split (even and odd ranks of the job): an all-reduce, min of u8.
    if sub.is_none() {
        *sub = comm.split(Some((w % 2) as u32), me as i64)?;
    }
    let sub = sub.as_ref().expect("every rank has a color");
    let sub_members = sub.world_ranks();
    let l = len(&mut rng);
    let byte = |m: usize, i: usize| (value(m, step, 4, i) + 100) as u8;
    let got = sub
        .all_reduce(
            (0..l).map(|i| byte(w, i)).collect::<Vec<u8>>(),
            ReduceOp::Min,
        )
        .wait()?;
    let want: Vec<u8> = (0..l)
        .map(|i| sub_members.iter().map(|&m| byte(m, i)).min().unwrap())
        .collect();
    expect_eq("split all_reduce u8 min", &got, &want)?;
    if step.is_multiple_of(5) {
        comm.barrier().wait()?;
    }
    Ok(())
}

/// ringwire's threads in this process (their names start with it).
fn ringwire_threads() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.flatten()
                .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
                .map(|n| n.trim().to_string())
                .filter(|n| n.starts_with("ringwire"))
                .collect()
        })
        .unwrap_or_default()
}

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

fn shm_mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .map(|m| m.lines().filter(|l| l.contains("ringwire-shm")).count())
        .unwrap_or(0)
}

#[test]
#[ignore = "runs only as a rank of a chaos trial"]
fn chaos_rank() {
    if std::env::var_os(CHILD_VAR).is_none() {
        return;
    }
    if let Ok(len) = std::env::var("CHAOS_MEASURE_LEN") {
        return measure_rank(len.parse().unwrap());
    }
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set"));
    let seed: u64 = var("CHAOS_TRIAL_SEED").parse().unwrap();
    let run_for = Duration::from_millis(var("CHAOS_RUN_MS").parse().unwrap());
    let die = std::env::var("CHAOS_DIE").ok().map(|d| {
        let parts: Vec<&str> = d.split(':').collect();
        Die {
            in_shrink: parts[0] == "shrink",
            step: parts[1].parse().unwrap(),
            delay: Duration::from_micros(parts[2].parse().unwrap()),
        }
    });
    let say = |line: String| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    };
    common::init_logging();
    let descriptors_before = open_descriptors();
    let world = Communicator::from_env().wait().expect("join");
    say("CHAOS-READY".into());
    let started = Instant::now();
    let mut comm = world.clone();
    let mut sub: Option<Communicator> = None;
    let mut finished = true;
    for step in 0.. {
        let fail_on_purpose = die.as_ref().is_some_and(|d| d.in_shrink && d.step == step);
        let ran = match fail_on_purpose {
            true => Err(StepError::Failed(ringwire::Error::InvalidArgument {
                op: ringwire::OpKind::None,
                detail: "failed on purpose, to die in the shrink".into(),
            })),
            false => run_step(&comm, &mut sub, seed, step),
        };
        let ok = match ran {
            Ok(()) => true,
            Err(StepError::Wrong(what)) => {
                say(format!("CHAOS-WRONG step {step}: {what}"));
                std::process::exit(3);
            }
            Err(StepError::Failed(e)) => {
                say(format!("CHAOS-FAILED step {step}: {e}"));
                // The others may be in an op this rank will not run: make
                // theirs fail too, and meet them in the agreement.
                comm.revoke();
                if let Some(s) = &sub {
                    s.revoke();
                }
                false
            }
        };
        if let Some(d) = &die
            && !d.in_shrink
            && d.step == step
        {
            die_after(d.delay);
        }
        // Bit 0: my ops went well; bit 1: I would go on (the AND ends
        // every rank's run at the same step).
        let go_on = started.elapsed() < run_for;
        let agreed = match comm.agree(ok as u64 | (go_on as u64) << 1).wait() {
            Ok(a) => a,
            Err(e) => {
                say(format!("CHAOS-OUT agree of step {step}: {e}"));
                finished = false;
                break;
            }
        };
        let go_on = agreed.value & 2 != 0;
        if agreed.value & 1 == 1 && agreed.members.len() == comm.world_size() {
            if go_on {
                continue;
            }
            break;
        }
        if fail_on_purpose {
            die_after(die.as_ref().expect("dies").delay);
        }
        match comm.shrink().wait() {
            Ok(shrunk) => {
                comm = shrunk;
                sub = None;
                say(format!("CHAOS-SHRUNK {step} {:?}", comm.world_ranks()));
                if !go_on {
                    break;
                }
            }
            Err(e) => {
                say(format!("CHAOS-OUT shrink of step {step}: {e}"));
                finished = false;
                break;
            }
        }
    }
    if finished {
        say(format!("CHAOS-DONE {:?}", comm.world_ranks()));
    }
    drop((comm, sub, world));
    // Nothing of ringwire's is left: its threads end, its descriptors and
    // mappings close (a thread may hold the transport for one more turn).
    let deadline = Instant::now() + Duration::from_secs(OP_TIMEOUT_S + 5);
    loop {
        let (threads, fds, maps) = (ringwire_threads(), open_descriptors(), shm_mappings());
        if threads.is_empty() && fds <= descriptors_before && maps == 0 {
            break;
        }
        if Instant::now() >= deadline {
            say(format!(
                "CHAOS-LEAK threads {threads:?}, {fds} descriptors open (before: \
                 {descriptors_before}), {maps} shared-memory mappings"
            ));
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    say("CHAOS-END".into());
}

fn unix_us() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros()
}

/// The kill-to-first-op benchmark (issue 45; `benches/recovery.sh` runs it,
/// `cargo test` does not): `RECOVERY_WORLD` ranks (4) over
/// `RECOVERY_LINKS` (`shm`) all-reduce `RECOVERY_LEN` f32 (262144, 1 MiB)
/// in a loop; rank `world - 2` gets `RECOVERY_SIGNAL` (`kill`: SIGKILL,
/// `stop`: SIGSTOP) 1 s after all are up; each survivor's op fails, it
/// shrinks, runs one all-reduce on the shrunk communicator (checked), and
/// says when that ended. Prints, per run of `RECOVERY_RUNS` (5), the time
/// from the signal to the last survivor's first op, and their median.
#[test]
#[ignore = "a benchmark: benches/recovery.sh runs it"]
fn kill_to_first_op() {
    let var = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_string());
    let world: usize = var("RECOVERY_WORLD", "4").parse().unwrap();
    let links = var("RECOVERY_LINKS", "shm");
    let len = var("RECOVERY_LEN", "262144");
    let signal = match var("RECOVERY_SIGNAL", "kill").as_str() {
        "kill" => nix::sys::signal::Signal::SIGKILL,
        "stop" => nix::sys::signal::Signal::SIGSTOP,
        other => panic!("RECOVERY_SIGNAL={other}: kill or stop"),
    };
    let heartbeat = var("RECOVERY_HEARTBEAT_S", "10");
    let runs: usize = var("RECOVERY_RUNS", "5").parse().unwrap();
    let victim = world - 2;
    let mut took = Vec::new();
    for run in 0..runs {
        let store =
            ringwire::store::StoreServer::bind("127.0.0.1:0".parse().unwrap()).expect("bind store");
        let (tx, lines) = mpsc::channel();
        let env = [
            ("RINGWIRE_LOCAL_LINKS", links.clone()),
            ("RINGWIRE_HEARTBEAT_TIMEOUT", heartbeat.clone()),
            ("CHAOS_MEASURE_LEN", len.clone()),
        ];
        let mut children: Vec<Child> = (0..world)
            .map(|rank| spawn_rank(rank, world, store.local_addr().port(), &env, &tx))
            .collect();
        drop(tx);
        let mut said: Vec<(usize, String)> = Vec::new();
        let mut ready = 0;
        let mut signalled_at = None;
        let deadline = Instant::now() + TRIAL_LIMIT;
        let recovered = |said: &[(usize, String)]| {
            said.iter()
                .filter(|(_, l)| l.starts_with("CHAOS-RECOVERED "))
                .count()
        };
        while recovered(&said) < world - 1 && Instant::now() < deadline {
            let Ok((rank, Some(line))) = lines.recv_timeout(Duration::from_millis(100)) else {
                continue;
            };
            if line == "CHAOS-READY" {
                ready += 1;
                if ready == world {
                    std::thread::sleep(Duration::from_secs(1));
                    signalled_at = Some(unix_us());
                    let pid = nix::unistd::Pid::from_raw(children[victim].id() as i32);
                    nix::sys::signal::kill(pid, signal).expect("signal the victim");
                }
            }
            said.push((rank, line));
        }
        for child in &mut children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let at = signalled_at.expect("the ranks came up");
        let done: Vec<u128> = said
            .iter()
            .filter_map(|(_, l)| l.strip_prefix("CHAOS-RECOVERED ")?.parse().ok())
            .collect();
        assert_eq!(
            done.len(),
            world - 1,
            "run {run}: not every survivor went on: {said:?}"
        );
        let ms = (done.iter().max().unwrap() - at) as f64 / 1000.0;
        // Where the time went: the last survivor to see its op fail, and
        // the last to leave shrink.
        let last = |prefix: &str| {
            said.iter()
                .filter_map(|(_, l)| l.strip_prefix(prefix)?.parse::<u128>().ok())
                .max()
                .map_or(f64::NAN, |t| (t.saturating_sub(at)) as f64 / 1000.0)
        };
        eprintln!(
            "run {run}: failed by {:.1} ms, shrunk by {:.1} ms",
            last("CHAOS-FAILED-AT "),
            last("CHAOS-SHRUNK-AT ")
        );
        eprintln!(
            "run {run}: {world} ranks, {links}, {signal:?}: {ms:.1} ms from the signal to the last survivor's first op"
        );
        took.push(ms);
    }
    took.sort_by(f64::total_cmp);
    eprintln!(
        "RECOVERY world={world} links={links} signal={signal:?} len={len} median_ms={:.1} min_ms={:.1} max_ms={:.1}",
        took[took.len() / 2],
        took[0],
        took[took.len() - 1]
    );
}

/// `kill_to_first_op`'s rank: all-reduces until one fails, then shrinks
/// and runs one on the shrunk communicator.
fn measure_rank(len: usize) {
    let comm = Communicator::from_env().wait().expect("join");
    println!("CHAOS-READY");
    let mut buf = vec![1.0f32; len];
    while let Ok(mut b) = comm.all_reduce(buf, ReduceOp::Sum).wait() {
        b.fill(1.0);
        buf = b;
    }
    println!("CHAOS-FAILED-AT {}", unix_us());
    let shrunk = comm.shrink().wait().expect("shrink");
    println!("CHAOS-SHRUNK-AT {}", unix_us());
    let sum = shrunk
        .all_reduce(vec![1.0f32; len], ReduceOp::Sum)
        .wait()
        .expect("an all-reduce on the shrunk communicator");
    let n = shrunk.world_size() as f32;
    assert!(sum.iter().all(|&x| x == n), "{}", sum[0]);
    println!("CHAOS-RECOVERED {}", unix_us());
    // Exits at once: a survivor still finishing its op must get what this
    // one sent (tests/failures.rs, what_a_departed_rank_sent_...).
}
