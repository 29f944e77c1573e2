//! Data-parallel training of a small network on real data, with gradients
//! reduced by `ringwire::train::GradReducer` while backward runs, checked
//! against the same training in one process.
//!
//! ```text
//! cargo run --release --example ddp -- --ranks 2
//! cargo run --release --example ddp -- --ranks 4 --epochs 5 --hook bf16
//! ```
//!
//! The data: the 1797 8x8 handwritten digits smartcore embeds in itself
//! (nothing is downloaded); 1500 to train, 297 to test. The model: an MLP
//! 64-128-64-10 (ReLU, softmax cross-entropy) with backpropagation written
//! here, SGD with momentum. Each step takes a global batch (48 by default)
//! and gives rank r its r-th slice; backward computes the last layer's
//! gradients first, straight into the reducer's bucket memory, and marks
//! them ready, so their bucket is all-reduced while the earlier layers'
//! backward runs.
//!
//! Checks (printed; the exit status fails if one fails): every rank ends
//! with the same parameters; rank 0's parameters equal those of the same
//! training in one process (the global batch cut into the same slices,
//! their gradients averaged as ringwire averages): bit for bit at 2 ranks
//! (`(g0 + g1) / 2` is the same in any order), within 1e-4 (relative to
//! the largest weight) at other counts, whose sums run in another order;
//! and the loss falls. With `--ranks N` this process starts N ranks of
//! itself; without it, it is a rank (torchrun, mpirun, srun).

use ringwire::train::{CommHook, GradReducer, ParamId, ReducerConfig};
use ringwire::{Communicator, ReduceOp};
use std::process::{Command, ExitCode};
use std::time::Duration;

#[path = "common/mlp.rs"]
mod mlp;
use mlp::{
    GradSink, Local, accuracy, backward, batch, digits, forward, init_params, layout,
    loss_and_grad, permutation, sgd,
};

struct Args {
    ranks: Option<usize>,
    epochs: usize,
    batch: usize,
    lr: f32,
    hook: CommHook,
    bucket_kib: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        ranks: None,
        epochs: 3,
        batch: 48,
        lr: 0.05,
        hook: CommHook::Avg,
        bucket_kib: 16,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        let number = |name: &str, v: String| {
            v.parse::<usize>()
                .map_err(|_| format!("{name}: not a number"))
        };
        match a.as_str() {
            "--ranks" => args.ranks = Some(number("--ranks", value("--ranks")?)?),
            "--epochs" => args.epochs = number("--epochs", value("--epochs")?)?,
            "--batch" => args.batch = number("--batch", value("--batch")?)?,
            "--bucket-kib" => args.bucket_kib = number("--bucket-kib", value("--bucket-kib")?)?,
            "--lr" => args.lr = value("--lr")?.parse().map_err(|_| "--lr: not a number")?,
            "--hook" => {
                args.hook = match value("--hook")?.as_str() {
                    "avg" => CommHook::Avg,
                    "bf16" => CommHook::Bf16Wire,
                    "f16" => CommHook::F16Wire,
                    other => return Err(format!("--hook: avg, bf16 or f16, not {other:?}")),
                }
            }
            "-h" | "--help" => {
                println!(
                    "usage: ddp [--ranks N] [--epochs E] [--batch GLOBAL] [--lr LR] \
                     [--hook avg|bf16|f16] [--bucket-kib K]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other} (try --help)")),
        }
    }
    Ok(args)
}

fn main() -> ExitCode {
    #[cfg(feature = "logging")]
    ringwire::logging::init_from_env();
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("ddp: {e}");
            return ExitCode::from(2);
        }
    };
    match args.ranks {
        Some(n) => launch(n),
        None => ringwire::error_file::main(|| run_rank(&args)),
    }
}

/// Starts `n` ranks of this program (with a store for them) and waits.
fn launch(n: usize) -> ExitCode {
    if n == 0 {
        eprintln!("ddp: --ranks must be at least 1");
        return ExitCode::from(2);
    }
    let store = match ringwire::store::StoreServer::bind("127.0.0.1:0".parse().expect("literal")) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ddp: cannot start the store: {e}");
            return ExitCode::FAILURE;
        }
    };
    let exe = std::env::current_exe().expect("current exe");
    let mut passthrough = Vec::new();
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--ranks" => {
                it.next();
            }
            _ => passthrough.push(a),
        }
    }
    let children: Vec<_> = (0..n)
        .map(|rank| {
            Command::new(&exe)
                .args(&passthrough)
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", n.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", store.local_addr().port().to_string())
                .env("RINGWIRE_HOST_STORE", "0")
                .spawn()
        })
        .collect();
    let mut ok = true;
    for (rank, child) in children.into_iter().enumerate() {
        match child.and_then(|mut c| c.wait()) {
            Ok(status) if status.success() => {}
            Ok(status) => {
                eprintln!("ddp: rank {rank} failed ({status})");
                ok = false;
            }
            Err(e) => {
                eprintln!("ddp: rank {rank} could not run: {e}");
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

/// Gradients in the reducer's bucket memory.
struct Bucketed<'a> {
    reducer: &'a mut GradReducer,
    ids: &'a [ParamId],
}

impl GradSink for Bucketed<'_> {
    fn grad(&mut self, param: usize) -> &mut [f32] {
        self.reducer
            .grad_mut::<f32>(self.ids[param])
            .expect("an f32 parameter, not in flight")
    }

    fn ready(&mut self, param: usize) {
        self.reducer
            .mark_ready(self.ids[param])
            .expect("marked once a step");
    }
}

fn run_rank(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let comm = Communicator::from_env().wait()?;
    let (rank, world) = (comm.rank(), comm.world_size());
    if !args.batch.is_multiple_of(world) {
        return Err(format!(
            "--batch {} does not split evenly over {world} ranks",
            args.batch
        )
        .into());
    }
    let per_rank = args.batch / world;
    let ((train_x, train_y), (test_x, test_y)) = digits();
    let config = ReducerConfig {
        bucket_cap_bytes: args.bucket_kib << 10,
        first_bucket_bytes: (args.bucket_kib << 10) / 4,
        hook: args.hook,
        ..ReducerConfig::default()
    };
    let layout = layout();
    let ids: Vec<ParamId> = layout.iter().map(|(id, _)| id).collect();
    let mut reducer = GradReducer::new(&comm, layout, config)?;
    // Every rank starts from rank 0's weights.
    let mut params = init_params(0xD16 + rank as u64);
    {
        let mut views: Vec<&mut [f32]> = params.iter_mut().map(|p| p.as_mut_slice()).collect();
        reducer.broadcast_params(&mut views)?;
    }
    let mut velocity: Vec<Vec<f32>> = params.iter().map(|p| vec![0.0; p.len()]).collect();
    let steps_per_epoch = train_y.len() / args.batch;
    let mut epoch_loss = Vec::new();
    let (mut comm_time, mut overlap, mut waited, mut compute) = (
        Duration::ZERO,
        Duration::ZERO,
        Duration::ZERO,
        Duration::ZERO,
    );
    for epoch in 0..args.epochs {
        let order = permutation(train_y.len(), epoch);
        let mut losses = 0.0f32;
        for step in 0..steps_per_epoch {
            let global = &order[step * args.batch..(step + 1) * args.batch];
            let mine = &global[rank * per_rank..(rank + 1) * per_rank];
            let (x, y) = batch(&train_x, &train_y, mine);
            reducer.begin_forward();
            let acts = forward(&params, &x, per_rank);
            let (loss, dlogits) = loss_and_grad(acts.last().expect("logits"), &y);
            reducer.begin_backward();
            backward(
                &params,
                &acts,
                dlogits,
                per_rank,
                &mut Bucketed {
                    reducer: &mut reducer,
                    ids: &ids,
                },
            );
            reducer.finish()?;
            let stats = reducer.step_stats();
            comm_time += stats.backward_comm.unwrap_or_default();
            compute += stats.backward_compute.unwrap_or_default();
            overlap += stats.overlap;
            waited += stats.comm_wait;
            {
                let grads: Vec<&[f32]> = ids
                    .iter()
                    .map(|&id| reducer.grad::<f32>(id).expect("reduced"))
                    .collect();
                sgd(&mut params, &mut velocity, &grads, args.lr);
            }
            reducer.zero_grads();
            // The global mean loss, for the printout.
            losses += comm.all_reduce(vec![loss], ReduceOp::Avg).wait()?[0];
        }
        let mean = losses / steps_per_epoch as f32;
        epoch_loss.push(mean);
        if rank == 0 {
            println!(
                "epoch {epoch}: loss {mean:.4}, test accuracy {:.1}%",
                100.0 * accuracy(&params, &test_x, &test_y)
            );
        }
    }
    // Every rank holds the same parameters.
    let digest = params
        .iter()
        .flatten()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, v| {
            (h ^ u64::from(v.to_bits())).wrapping_mul(0x0100_0000_01b3)
        });
    let (_, digests) = comm
        .all_gather(vec![digest as i64], vec![0i64; world])
        .wait()?;
    let same_everywhere = digests.iter().all(|&d| d == digests[0]);
    let mut failed = !same_everywhere;
    if rank == 0 {
        let steps = (args.epochs * steps_per_epoch).max(1) as u32;
        println!(
            "per step: backward {:?}, its communication {:?}, of which hidden behind backward {:?}, waited after backward {:?}",
            compute / steps,
            comm_time / steps,
            overlap / steps,
            waited / steps
        );
        println!(
            "check: every rank holds the same parameters: {}",
            if same_everywhere { "yes" } else { "NO" }
        );
        let falling = epoch_loss.len() < 2 || epoch_loss.last() < epoch_loss.first();
        println!(
            "check: the loss falls ({:.4} to {:.4}): {}",
            epoch_loss.first().copied().unwrap_or(0.0),
            epoch_loss.last().copied().unwrap_or(0.0),
            if falling { "yes" } else { "NO" }
        );
        failed |= !falling;
        let reference = train_in_one_process(args, world, &train_x, &train_y);
        failed |= !compare(&params, &reference, world, args.hook);
    }
    // Rank 0's verdict, on every rank's exit status.
    let verdict = comm.broadcast(vec![u8::from(failed)], 0).wait()?;
    if verdict[0] != 0 || failed {
        return Err("a check failed".into());
    }
    Ok(())
}

/// The same training in this process: the same global batches cut into
/// the same `world` slices, their gradients averaged as ringwire does
/// (summed in f32, divided once).
fn train_in_one_process(args: &Args, world: usize, x: &[f32], y: &[usize]) -> Vec<Vec<f32>> {
    let per_rank = args.batch / world;
    let mut params = init_params(0xD16);
    let mut velocity: Vec<Vec<f32>> = params.iter().map(|p| vec![0.0; p.len()]).collect();
    for epoch in 0..args.epochs {
        let order = permutation(y.len(), epoch);
        for step in 0..y.len() / args.batch {
            let global = &order[step * args.batch..(step + 1) * args.batch];
            let mut sum: Vec<Vec<f32>> = params.iter().map(|p| vec![0.0; p.len()]).collect();
            for r in 0..world {
                let (xs, ys) = batch(x, y, &global[r * per_rank..(r + 1) * per_rank]);
                let acts = forward(&params, &xs, per_rank);
                let (_, dlogits) = loss_and_grad(acts.last().expect("logits"), &ys);
                let mut grads = Local(params.iter().map(|p| vec![0.0; p.len()]).collect());
                backward(&params, &acts, dlogits, per_rank, &mut grads);
                for (s, g) in sum.iter_mut().zip(&grads.0) {
                    s.iter_mut().zip(g).for_each(|(s, g)| *s += g);
                }
            }
            // ringwire's f32 average: the sum, divided once in f64.
            for s in &mut sum {
                s.iter_mut()
                    .for_each(|v| *v = (*v as f64 / world as f64) as f32);
            }
            let grads: Vec<&[f32]> = sum.iter().map(Vec::as_slice).collect();
            sgd(&mut params, &mut velocity, &grads, args.lr);
        }
    }
    params
}

/// Prints how rank 0's parameters compare with the one-process run's;
/// whether the check for this rank count held.
fn compare(got: &[Vec<f32>], reference: &[Vec<f32>], world: usize, hook: CommHook) -> bool {
    let identical = got
        .iter()
        .flatten()
        .zip(reference.iter().flatten())
        .all(|(a, b)| a.to_bits() == b.to_bits());
    let largest = reference
        .iter()
        .flatten()
        .fold(0.0f32, |m, v| m.max(v.abs()));
    let worst = got
        .iter()
        .flatten()
        .zip(reference.iter().flatten())
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()))
        / largest.max(f32::MIN_POSITIVE);
    let exact = world <= 2 && hook == CommHook::Avg;
    let required = if world == 1 { "1 rank" } else { "2 ranks" };
    // 16-bit wire hooks round every step; their check is looser.
    let tolerance = match hook {
        CommHook::Avg => 1e-4,
        _ => 5e-2,
    };
    let held = if exact { identical } else { worst <= tolerance };
    println!(
        "check: rank 0's parameters against one process with the same global batch: {} \
         (largest difference {worst:.2e} of the largest weight; {})",
        if identical {
            "bit-identical"
        } else {
            "not bit-identical"
        },
        match (exact, held) {
            (true, true) => format!("bit-identical required at {required}: held"),
            (true, false) => format!("bit-identical required at {required}: FAILED"),
            (false, true) => format!("within {tolerance:.0e} required: held"),
            (false, false) => format!("within {tolerance:.0e} required: FAILED"),
        }
    );
    held
}
