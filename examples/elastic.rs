//! Losing a rank and keeping training (issue 45): data-parallel training
//! of the digits MLP with `GradReducer`; a rank is killed with SIGKILL at
//! a step chosen at random; the others shrink and go on; a replacement
//! process rejoins, the members admit it and send it the live state; at
//! the end the parameters are checked bit for bit against one process
//! replaying the same membership.
//!
//! ```text
//! cargo run --release --example elastic -- --ranks 4
//! cargo run --release --example elastic -- --ranks 4 --seed 7 --steps 60
//! ```
//!
//! With `--ranks N` this process is the launcher: it hosts a standalone
//! store (a job whose ranks rejoin needs one that outlives them), starts
//! N ranks of itself, picks the victim and its step from the seed
//! (printed), and when the victim dies starts its replacement with
//! `RINGWIRE_REJOIN=1`. Its exit status fails if any rank's check fails.
//!
//! Each step, member i of k takes its slice of the step's k x 16 samples
//! (taken in order from one fixed shuffle), computes its gradients, and
//! the reducer averages them. Gradients are rounded to multiples of
//! 2^-30 first: their f64 sums are then exact in any order, so the
//! replay's sum equals the ranks' whatever the collective's order, and
//! the check can ask for equal bits at any rank count. Every step ends
//! with `agree` (as the guide's recovery loop): a step counts only where
//! every live member finished it, and a member that saw a replacement
//! waiting makes every member `admit` it.

use ringwire::store::{StoreClient, StoreServer};
use ringwire::train::{GradReducer, Layout, ParamId, ReducerConfig, broadcast_state};
use ringwire::{Communicator, DType};
use std::process::{Child, Command, ExitCode};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[path = "common/mlp.rs"]
mod mlp;
use mlp::{Local, Rng, SIZES, backward, batch, digits, forward, init_params, loss_and_grad, sgd};

/// Samples each member takes per step.
const PER_RANK: usize = 16;

/// Gradients are rounded to multiples of this (2^-30) and kept below
/// 2^20, so that sums of up to 8 of them in f64 are exact.
const GRID: f64 = (1u64 << 30) as f64;
const LARGEST: f64 = (1u64 << 20) as f64;

const LR: f32 = 0.05;

fn main() -> ExitCode {
    #[cfg(feature = "logging")]
    ringwire::logging::init_from_env();
    let mut ranks = None;
    let mut seed = None;
    let mut steps = 40usize;
    let mut extra_mib = 0usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut number = |what: &str| -> Option<u64> {
            let v = args.next().and_then(|v| v.parse().ok());
            if v.is_none() {
                eprintln!("elastic: {what} takes a number");
            }
            v
        };
        match a.as_str() {
            "--ranks" => ranks = number("--ranks").map(|n| n as usize),
            "--seed" => seed = number("--seed"),
            "--steps" => steps = number("--steps").unwrap_or(0) as usize,
            "--extra-state-mib" => extra_mib = number("--extra-state-mib").unwrap_or(0) as usize,
            _ => {
                eprintln!(
                    "usage: elastic [--ranks N] [--seed S] [--steps STEPS] [--extra-state-mib MIB]"
                );
                return ExitCode::from(2);
            }
        }
    }
    match ranks {
        Some(n) => launch(n, seed, steps, extra_mib),
        None => ringwire::error_file::main(run_rank),
    }
}

/// Starts `n` ranks, kills none itself (the victim kills itself at its
/// step, as a crash would), starts the victim's replacement once it died,
/// and waits for everyone.
fn launch(n: usize, seed: Option<u64>, steps: usize, extra_mib: usize) -> ExitCode {
    if !(3..=8).contains(&n) || steps < 10 {
        eprintln!(
            "elastic: --ranks must be 3 to 8 (a majority goes on after a loss) and --steps at least 10"
        );
        return ExitCode::from(2);
    }
    let seed = seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let victim = ((rng.next() >> 33) % n as u64) as usize;
    let kill_step = 3 + ((rng.next() >> 33) % (steps as u64 - 8)) as usize;
    println!(
        "seed {seed} (rerun with --seed {seed}): rank {victim} is killed at step {kill_step} of {steps}"
    );
    let store = match StoreServer::bind("127.0.0.1:0".parse().expect("literal")) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("elastic: cannot start the store: {e}");
            return ExitCode::FAILURE;
        }
    };
    let exe = std::env::current_exe().expect("current exe");
    let start = |rank: usize, replacement: bool| -> std::io::Result<Child> {
        let mut cmd = Command::new(&exe);
        cmd.env("RANK", rank.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", store.local_addr().port().to_string())
            .env("RINGWIRE_HOST_STORE", "0")
            .env("ELASTIC_STEPS", steps.to_string())
            .env("ELASTIC_KILL", format!("{victim}:{kill_step}"))
            .env("ELASTIC_EXTRA_STATE_MIB", extra_mib.to_string());
        if replacement {
            cmd.env("RINGWIRE_REJOIN", "1");
        }
        cmd.spawn()
    };
    let mut children: Vec<(usize, std::io::Result<Child>)> =
        (0..n).map(|rank| (rank, start(rank, false))).collect();
    let mut ok = true;
    // The victim first: its replacement starts once it is gone.
    let at = children
        .iter()
        .position(|(r, _)| *r == victim)
        .expect("the victim");
    let (_, first) = children.remove(at);
    match first.and_then(|mut c| c.wait()) {
        Ok(status) => {
            use std::os::unix::process::ExitStatusExt;
            if status.signal() != Some(9) {
                eprintln!("elastic: rank {victim} ended with {status}, not SIGKILL");
                ok = false;
            }
        }
        Err(e) => {
            eprintln!("elastic: rank {victim} could not run: {e}");
            ok = false;
        }
    }
    children.push((victim, start(victim, true)));
    for (rank, child) in children {
        match child.and_then(|mut c| c.wait()) {
            Ok(status) if status.success() => {}
            Ok(status) => {
                eprintln!("elastic: rank {rank} failed ({status})");
                ok = false;
            }
            Err(e) => {
                eprintln!("elastic: rank {rank} could not run: {e}");
                ok = false;
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Every parameter's gradient as f64 (the reducer's buckets), in
/// definition order.
fn layout() -> Layout {
    let mut layout = Layout::new();
    for l in 0..3 {
        let name = |what: &str| format!("layer{}.{what}", l + 1);
        layout.push(name("weight"), SIZES[l] * SIZES[l + 1], DType::F64);
        layout.push(name("bias"), SIZES[l + 1], DType::F64);
    }
    layout
}

/// A gradient on the grid (see the module docs).
fn on_grid(g: f32) -> f64 {
    ((g as f64).clamp(-LARGEST, LARGEST) * GRID).round() / GRID
}

/// This member's share of step `step`: the samples of slice `member` of
/// `members`, starting at `cursor` of the fixed shuffle.
fn samples(order: &[usize], cursor: usize, member: usize) -> Vec<usize> {
    (0..PER_RANK)
        .map(|j| order[(cursor + member * PER_RANK + j) % order.len()])
        .collect()
}

/// What a rank keeps and a replacement is sent.
struct State {
    params: Vec<Vec<f32>>,
    velocity: Vec<Vec<f32>>,
    /// State a larger model would carry (`--extra-state-mib`: what moving
    /// it costs a rejoin), unchanged by training.
    extra: Vec<f32>,
    /// Steps done; where the next step's samples start; how many members
    /// took part in each step done.
    step: usize,
    cursor: usize,
    history: Vec<i64>,
}

/// When this process began its state's first step after a loss (unix
/// nanoseconds), for the printout.
fn unix_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

fn run_rank() -> Result<(), Box<dyn std::error::Error>> {
    let var = |name: &str| std::env::var(name).map_err(|_| format!("{name} is not set"));
    let steps: usize = var("ELASTIC_STEPS")?.parse()?;
    let kill = var("ELASTIC_KILL")?;
    let (victim, kill_step) = kill.split_once(':').ok_or("ELASTIC_KILL is rank:step")?;
    let (victim, kill_step): (usize, usize) = (victim.parse()?, kill_step.parse()?);
    let replacement = std::env::var_os("RINGWIRE_REJOIN").is_some();
    // The job's store, where the victim notes when it died (opened when
    // needed: by the victim and by rank 0).
    let store_addr: std::net::SocketAddr = format!("127.0.0.1:{}", var("MASTER_PORT")?).parse()?;
    let store = || StoreClient::connect(&[store_addr], Duration::from_secs(30));
    let ((train_x, train_y), _) = digits();
    let order = mlp::permutation(train_y.len(), 0);
    let started = std::time::Instant::now();
    let mut comm = Communicator::from_env().wait()?;
    let admitted_after = started.elapsed();
    let ids: Vec<ParamId> = layout().iter().map(|(id, _)| id).collect();
    let config = ReducerConfig::default();
    let fresh = init_params(0xD16);
    let extra_mib: usize = var("ELASTIC_EXTRA_STATE_MIB")?.parse()?;
    let extra_len = extra_mib * (1 << 20) / size_of::<f32>();
    let mut state = State {
        velocity: fresh.iter().map(|p| vec![0.0; p.len()]).collect(),
        // The members' all alike; a replacement's zeros until it is sent.
        extra: match replacement {
            false => (0..extra_len).map(|i| i as f32).collect(),
            true => vec![0.0; extra_len],
        },
        params: fresh,
        step: 0,
        cursor: 0,
        history: Vec::new(),
    };
    let mut reducer = if replacement {
        // The members call `recover` and send the state (below, in
        // `take_in`) as this process does its part of it.
        let reducer = GradReducer::rejoin(&comm, layout(), config.clone())?;
        share_state(&comm, &mut state)?;
        let whole = started.elapsed();
        let intact = state.extra.iter().enumerate().all(|(i, &v)| v == i as f32);
        println!(
            "rank {} (a replacement) joined at step {} with the members' state: waited \
             {admitted_after:.1?} to be admitted, {:.1?} more for the reducer and {:.1} MiB of \
             state (rejoin {whole:.1?}); extra state intact: {}",
            comm.rank(),
            state.step,
            whole - admitted_after,
            (state.extra.len() * 4 + state.params.iter().map(Vec::len).sum::<usize>() * 8) as f64
                / (1 << 20) as f64,
            if intact { "yes" } else { "NO" }
        );
        if !intact {
            return Err("the extra state did not arrive whole".into());
        }
        reducer
    } else {
        GradReducer::new(&comm, layout(), config.clone())?
    };
    let mut lost_at_step: Option<usize> = None;
    while state.step < steps {
        let (rank, members) = (comm.rank(), comm.world_size());
        if !replacement && comm.world_ranks()[rank] == victim && state.step == kill_step {
            store()?.set("elastic/killed_at", unix_nanos().to_string().as_bytes())?;
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGKILL);
        }
        // This member's gradients, on the grid, averaged by the reducer.
        let (x, y) = batch(&train_x, &train_y, &samples(&order, state.cursor, rank));
        let acts = forward(&state.params, &x, PER_RANK);
        let (_, dlogits) = loss_and_grad(acts.last().expect("logits"), &y);
        let mut local = Local(state.params.iter().map(|p| vec![0.0; p.len()]).collect());
        backward(&state.params, &acts, dlogits, PER_RANK, &mut local);
        let reduced = (|| -> Result<Vec<Vec<f32>>, ringwire::train::TrainError> {
            for p in (0..ids.len()).rev() {
                let grad = reducer.grad_mut::<f64>(ids[p])?;
                for (g, l) in grad.iter_mut().zip(&local.0[p]) {
                    *g = on_grid(*l);
                }
                reducer.mark_ready(ids[p])?;
            }
            reducer.finish()?;
            let avg = ids
                .iter()
                .map(|&id| Ok(reducer.grad::<f64>(id)?.iter().map(|&g| g as f32).collect()))
                .collect();
            reducer.zero_grads();
            avg
        })();
        if let Err(e) = &reduced {
            comm.revoke();
            eprintln!("rank {rank}: step {} failed: {e}", state.step);
        }
        // Every live member decides alike: did the step finish everywhere
        // (bit 0), and did nobody see a replacement waiting (bit 1)?
        let nobody_waiting = comm.joiners_waiting().map_or(true, |n| n == 0);
        let agreed = comm
            .agree(u64::from(reduced.is_ok()) | (u64::from(nobody_waiting) << 1))
            .wait()?;
        if agreed.value & 1 == 1 {
            let grads = reduced.expect("the step finished here too");
            let views: Vec<&[f32]> = grads.iter().map(Vec::as_slice).collect();
            sgd(&mut state.params, &mut state.velocity, &views, LR);
            state.history.push(members as i64);
            state.cursor += members * PER_RANK;
            state.step += 1;
            if let Some(at) = lost_at_step.take() {
                report_since_kill(&store, &comm, at, "the first step without it");
            }
        }
        if agreed.value & 1 == 0 || agreed.members.len() < members {
            comm = comm.shrink().wait()?;
            reducer.recover(&comm)?;
            lost_at_step = Some(state.step);
            if comm.rank() == 0 {
                println!(
                    "step {}: lost ranks {:?}; going on with {} ranks",
                    state.step,
                    lost(&agreed.members, members),
                    comm.world_size()
                );
            }
        }
        if agreed.value & 2 == 0 {
            comm = take_in(&comm, &mut reducer, &mut state)?;
            report_since_kill(
                &store,
                &comm,
                state.step,
                "the replacement admitted, with the state",
            );
        }
    }
    // A replacement that came late is still taken in before the end.
    let world: usize = var("WORLD_SIZE")?.parse()?;
    while comm.world_size() < world {
        let nobody_waiting = comm.joiners_waiting()? == 0;
        if comm.agree(u64::from(nobody_waiting)).wait()?.value == 0 {
            comm = take_in(&comm, &mut reducer, &mut state)?;
        } else {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    check(&comm, &state, &train_x, &train_y, &order, steps)
}

/// The ranks of `size` not among `members`.
fn lost(members: &[usize], size: usize) -> Vec<usize> {
    (0..size).filter(|r| !members.contains(r)).collect()
}

/// Admits the replacements waiting, and sends them the state.
fn take_in(
    comm: &Communicator,
    reducer: &mut GradReducer,
    state: &mut State,
) -> Result<Communicator, Box<dyn std::error::Error>> {
    let admitted = comm.admit().wait()?;
    reducer.recover(&admitted)?;
    share_state(&admitted, state)?;
    if admitted.rank() == 0 {
        println!(
            "step {}: admitted {:?}; {} ranks",
            state.step,
            admitted.newcomers(),
            admitted.world_size()
        );
    }
    Ok(admitted)
}

/// The state of the first member that is not a newcomer, to every member.
fn share_state(comm: &Communicator, state: &mut State) -> Result<(), Box<dyn std::error::Error>> {
    let root = (0..comm.world_size())
        .find(|r| !comm.newcomers().contains(r))
        .ok_or("every member is a newcomer")?;
    let mut parts: Vec<&mut [f32]> = state
        .params
        .iter_mut()
        .chain(state.velocity.iter_mut())
        .chain(std::iter::once(&mut state.extra))
        .map(Vec::as_mut_slice)
        .collect();
    broadcast_state(comm, root, &mut parts)?;
    let counters = vec![state.step as i64, state.cursor as i64];
    let counters = comm.broadcast(counters, root).wait()?;
    state.step = counters[0] as usize;
    state.cursor = counters[1] as usize;
    state.history.resize(state.step, 0);
    let history = std::mem::take(&mut state.history);
    state.history = comm.broadcast(history, root).wait()?;
    Ok(())
}

/// Prints, on rank 0, the time from the victim's kill to now.
fn report_since_kill(
    store: &dyn Fn() -> Result<StoreClient, ringwire::store::StoreError>,
    comm: &Communicator,
    step: usize,
    what: &str,
) {
    if comm.rank() != 0 {
        return;
    }
    if let Ok(Some(at)) = store().and_then(|s| s.try_get("elastic/killed_at")) {
        let at: i64 = String::from_utf8_lossy(&at).parse().unwrap_or(0);
        let ms = (unix_nanos() - at) as f64 / 1e6;
        println!("from the kill to {what} (step {step}): {ms:.1} ms");
    }
}

/// Every rank holds the same parameters, and they equal those of one
/// process that replays the same steps with the same membership.
fn check(
    comm: &Communicator,
    state: &State,
    x: &[f32],
    y: &[usize],
    order: &[usize],
    steps: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let digest = state
        .params
        .iter()
        .flatten()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, v| {
            (h ^ u64::from(v.to_bits())).wrapping_mul(0x0100_0000_01b3)
        });
    let (_, digests) = comm
        .all_gather(vec![digest as i64], vec![0i64; comm.world_size()])
        .wait()?;
    let same = digests.iter().all(|&d| d == digests[0]);
    let mut failed = !same;
    if comm.rank() == 0 {
        println!(
            "check: every rank of the {} at the end holds the same parameters: {}",
            comm.world_size(),
            if same { "yes" } else { "NO" }
        );
        let replayed = replay(&state.history, x, y, order, steps);
        let identical = state
            .params
            .iter()
            .flatten()
            .zip(replayed.iter().flatten())
            .all(|(a, b)| a.to_bits() == b.to_bits());
        let sizes: Vec<i64> = state.history.clone();
        println!(
            "check: the parameters against one process replaying the membership \
             (ranks per step {sizes:?}): {}",
            if identical {
                "bit-identical"
            } else {
                "DIFFERENT"
            }
        );
        failed |= !identical;
    }
    let verdict = comm.broadcast(vec![u8::from(failed)], 0).wait()?;
    if verdict[0] != 0 || failed {
        return Err("a check failed".into());
    }
    Ok(())
}

/// The training of `history.len()` steps in this process, step `t` with
/// `history[t]` members.
fn replay(history: &[i64], x: &[f32], y: &[usize], order: &[usize], steps: usize) -> Vec<Vec<f32>> {
    assert_eq!(history.len(), steps, "a step missing from the history");
    let mut params = init_params(0xD16);
    let mut velocity: Vec<Vec<f32>> = params.iter().map(|p| vec![0.0; p.len()]).collect();
    let mut cursor = 0;
    for &members in history {
        let members = members as usize;
        let mut sum: Vec<Vec<f64>> = params.iter().map(|p| vec![0.0; p.len()]).collect();
        for member in 0..members {
            let (xs, ys) = batch(x, y, &samples(order, cursor, member));
            let acts = forward(&params, &xs, PER_RANK);
            let (_, dlogits) = loss_and_grad(acts.last().expect("logits"), &ys);
            let mut grads = Local(params.iter().map(|p| vec![0.0; p.len()]).collect());
            backward(&params, &acts, dlogits, PER_RANK, &mut grads);
            for (s, g) in sum.iter_mut().zip(&grads.0) {
                s.iter_mut().zip(g).for_each(|(s, &g)| *s += on_grid(g));
            }
        }
        let avg: Vec<Vec<f32>> = sum
            .iter()
            .map(|s| s.iter().map(|&v| (v / members as f64) as f32).collect())
            .collect();
        let views: Vec<&[f32]> = avg.iter().map(Vec::as_slice).collect();
        sgd(&mut params, &mut velocity, &views, LR);
        cursor += members * PER_RANK;
    }
    params
}
