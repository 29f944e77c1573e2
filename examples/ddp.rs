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

use ringwire::train::{CommHook, GradReducer, Layout, ParamId, ReducerConfig};
use ringwire::{Communicator, DType, ReduceOp};
use std::process::{Command, ExitCode};
use std::time::Duration;

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

/// Layer sizes: 64 inputs, two hidden layers, 10 classes.
const SIZES: [usize; 4] = [64, 128, 64, 10];

/// Samples: inputs (64 per sample) and labels.
type Samples = (Vec<f32>, Vec<usize>);

/// The digits, features scaled to 0..1: train then test.
fn digits() -> (Samples, Samples) {
    let d = smartcore::dataset::digits::load_dataset();
    let x: Vec<f32> = d.data.iter().map(|v| v / 16.0).collect();
    let y: Vec<usize> = d.target.iter().map(|&c| c as usize).collect();
    let split = 1500;
    let (xf, n) = (d.num_features, d.num_samples);
    assert_eq!((xf, n), (64, 1797), "the digits data set changed");
    (
        (x[..split * xf].to_vec(), y[..split].to_vec()),
        (x[split * xf..].to_vec(), y[split..].to_vec()),
    )
}

/// xorshift64*: the same stream on every rank for the same seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// The parameters in definition order: w1, b1, w2, b2, w3, b3 (weights
/// `in x out`, row-major).
fn init_params(seed: u64) -> Vec<Vec<f32>> {
    let mut rng = Rng(seed | 1);
    let mut params = Vec::new();
    for l in 0..3 {
        let (fan_in, fan_out) = (SIZES[l], SIZES[l + 1]);
        let scale = (6.0 / (fan_in + fan_out) as f32).sqrt();
        params.push(
            (0..fan_in * fan_out)
                .map(|_| (rng.uniform() * 2.0 - 1.0) * scale)
                .collect(),
        );
        params.push(vec![0.0; fan_out]);
    }
    params
}

fn layout() -> Layout {
    let mut layout = Layout::new();
    for l in 0..3 {
        layout.push(
            format!("layer{}.weight", l + 1),
            SIZES[l] * SIZES[l + 1],
            DType::F32,
        );
        layout.push(format!("layer{}.bias", l + 1), SIZES[l + 1], DType::F32);
    }
    layout
}

/// Where backward puts each parameter's gradient, and tells it is done.
trait GradSink {
    fn grad(&mut self, param: usize) -> &mut [f32];
    fn ready(&mut self, param: usize);
}

/// Forward over a batch of `n` samples; the activations of each layer
/// (the input first), the last being the logits.
fn forward(params: &[Vec<f32>], x: &[f32], n: usize) -> Vec<Vec<f32>> {
    let mut acts = vec![x.to_vec()];
    for l in 0..3 {
        let (fi, fo) = (SIZES[l], SIZES[l + 1]);
        let (w, b) = (&params[2 * l], &params[2 * l + 1]);
        let input = &acts[l];
        let mut out = vec![0.0f32; n * fo];
        for s in 0..n {
            let row = &mut out[s * fo..(s + 1) * fo];
            row.copy_from_slice(b);
            for i in 0..fi {
                let xi = input[s * fi + i];
                for (o, wv) in row.iter_mut().zip(&w[i * fo..(i + 1) * fo]) {
                    *o += xi * wv;
                }
            }
            if l < 2 {
                row.iter_mut().for_each(|v| *v = v.max(0.0));
            }
        }
        acts.push(out);
    }
    acts
}

/// Mean softmax cross-entropy of the logits, and its gradient.
fn loss_and_grad(logits: &[f32], y: &[usize]) -> (f32, Vec<f32>) {
    let (n, c) = (y.len(), SIZES[3]);
    let mut grad = vec![0.0f32; n * c];
    let mut loss = 0.0f32;
    for s in 0..n {
        let row = &logits[s * c..(s + 1) * c];
        let max = row.iter().cloned().fold(f32::MIN, f32::max);
        let exp: Vec<f32> = row.iter().map(|v| (v - max).exp()).collect();
        let sum: f32 = exp.iter().sum();
        loss -= (exp[y[s]] / sum).ln();
        for k in 0..c {
            let p = exp[k] / sum;
            grad[s * c + k] = (p - if k == y[s] { 1.0 } else { 0.0 }) / n as f32;
        }
    }
    (loss / n as f32, grad)
}

/// Backward from the loss gradient, last layer first: each layer's weight
/// and bias gradients go into `sink` and are marked ready before the
/// layer below is computed.
fn backward(
    params: &[Vec<f32>],
    acts: &[Vec<f32>],
    mut dout: Vec<f32>,
    n: usize,
    sink: &mut dyn GradSink,
) {
    for l in (0..3).rev() {
        let (fi, fo) = (SIZES[l], SIZES[l + 1]);
        let input = &acts[l];
        {
            let dw = sink.grad(2 * l);
            dw.fill(0.0);
            for s in 0..n {
                for i in 0..fi {
                    let xi = input[s * fi + i];
                    for (g, d) in dw[i * fo..(i + 1) * fo]
                        .iter_mut()
                        .zip(&dout[s * fo..(s + 1) * fo])
                    {
                        *g += xi * d;
                    }
                }
            }
        }
        sink.ready(2 * l);
        {
            let db = sink.grad(2 * l + 1);
            db.fill(0.0);
            for s in 0..n {
                for (g, d) in db.iter_mut().zip(&dout[s * fo..(s + 1) * fo]) {
                    *g += d;
                }
            }
        }
        sink.ready(2 * l + 1);
        if l == 0 {
            break;
        }
        let w = &params[2 * l];
        let mut din = vec![0.0f32; n * fi];
        for s in 0..n {
            for i in 0..fi {
                let mut acc = 0.0f32;
                for (d, wv) in dout[s * fo..(s + 1) * fo]
                    .iter()
                    .zip(&w[i * fo..(i + 1) * fo])
                {
                    acc += d * wv;
                }
                // Through the ReLU of the layer below.
                din[s * fi + i] = if input[s * fi + i] > 0.0 { acc } else { 0.0 };
            }
        }
        dout = din;
    }
}

/// SGD with momentum 0.9.
fn sgd(params: &mut [Vec<f32>], velocity: &mut [Vec<f32>], grads: &[&[f32]], lr: f32) {
    for ((p, v), g) in params.iter_mut().zip(velocity.iter_mut()).zip(grads) {
        for ((p, v), g) in p.iter_mut().zip(v.iter_mut()).zip(g.iter()) {
            *v = 0.9 * *v + g;
            *p -= lr * *v;
        }
    }
}

/// The sample order of `epoch`, the same on every rank.
fn permutation(n: usize, epoch: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = Rng(0x5eed_0000 + epoch as u64);
    for i in (1..n).rev() {
        order.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    order
}

/// The inputs and labels of samples `idx`.
fn batch(x: &[f32], y: &[usize], idx: &[usize]) -> (Vec<f32>, Vec<usize>) {
    let xs = idx
        .iter()
        .flat_map(|&i| x[i * 64..(i + 1) * 64].iter().copied())
        .collect();
    (xs, idx.iter().map(|&i| y[i]).collect())
}

fn accuracy(params: &[Vec<f32>], x: &[f32], y: &[usize]) -> f32 {
    let logits = forward(params, x, y.len()).pop().expect("logits");
    let right = (0..y.len())
        .filter(|&s| {
            let row = &logits[s * 10..(s + 1) * 10];
            let best = (0..10)
                .max_by(|&a, &b| row[a].total_cmp(&row[b]))
                .expect("10 classes");
            best == y[s]
        })
        .count();
    right as f32 / y.len() as f32
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

/// Gradients in plain vectors (the one-process reference).
struct Local(Vec<Vec<f32>>);

impl GradSink for Local {
    fn grad(&mut self, param: usize) -> &mut [f32] {
        &mut self.0[param]
    }

    fn ready(&mut self, _: usize) {}
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
