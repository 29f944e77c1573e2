//! A candle MLP trained data-parallel over ringwire, checked against the
//! same training in one process.
//!
//! ```text
//! cd adapters/candle && cargo run --release --example ddp -- --ranks 2
//! ```
//!
//! The data: a classification task a fixed random "teacher" network labels
//! (generated from a seed, nothing downloaded). Each step cuts a global
//! batch into one slice per rank; `Ddp::sync` averages the gradients; SGD
//! updates. Rank 0 then trains the same model in one process, averaging
//! the slices' gradients as ringwire does (summed in f32, divided once),
//! and compares: bit for bit at 2 ranks, within 1e-4 of the largest weight
//! at other counts. The exit status fails if a check fails.

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{Linear, Optimizer, SGD, VarBuilder, VarMap, linear};
use ringwire::Communicator;
use ringwire_candle::Ddp;
use std::process::{Command, ExitCode};

const IN: usize = 16;
const HIDDEN: usize = 32;
const CLASSES: usize = 4;
const SAMPLES: usize = 960;
const GLOBAL_BATCH: usize = 48;
const EPOCHS: usize = 4;
const LR: f64 = 0.1;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    match (args.next().as_deref(), args.next()) {
        (Some("--ranks"), Some(n)) => match n.parse() {
            Ok(n) if n > 0 => launch(n),
            _ => {
                eprintln!("ddp: --ranks needs a positive number");
                ExitCode::from(2)
            }
        },
        (None, _) => match run_rank() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("ddp: {e}");
                ExitCode::FAILURE
            }
        },
        _ => {
            eprintln!("usage: ddp [--ranks N]");
            ExitCode::from(2)
        }
    }
}

fn launch(n: usize) -> ExitCode {
    let store = match ringwire::store::StoreServer::bind("127.0.0.1:0".parse().expect("literal")) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ddp: cannot start the store: {e}");
            return ExitCode::FAILURE;
        }
    };
    let exe = std::env::current_exe().expect("current exe");
    let children: Vec<_> = (0..n)
        .map(|rank| {
            Command::new(&exe)
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
        if !child.and_then(|mut c| c.wait()).is_ok_and(|s| s.success()) {
            eprintln!("ddp: rank {rank} failed");
            ok = false;
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// xorshift64*: the same numbers in every process.
struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// Inputs and the teacher's labels.
fn data() -> (Vec<f32>, Vec<u32>) {
    let mut rng = Rng(0x7eac_4e12);
    let teacher: Vec<f32> = (0..IN * CLASSES).map(|_| rng.unit() * 2.0 - 1.0).collect();
    let x: Vec<f32> = (0..SAMPLES * IN).map(|_| rng.unit() * 2.0 - 1.0).collect();
    let y = (0..SAMPLES)
        .map(|s| {
            let score = |c: usize| {
                (0..IN)
                    .map(|i| x[s * IN + i] * teacher[i * CLASSES + c])
                    .sum::<f32>()
            };
            (0..CLASSES)
                .max_by(|&a, &b| score(a).total_cmp(&score(b)))
                .expect("classes") as u32
        })
        .collect();
    (x, y)
}

struct Mlp {
    l1: Linear,
    l2: Linear,
}

impl Mlp {
    /// A fresh model (candle's default initialisation, from its own random
    /// source: rank 0's is broadcast, and copied for the reference).
    fn new(varmap: &VarMap, device: &Device) -> candle_core::Result<Mlp> {
        let vb = VarBuilder::from_varmap(varmap, DType::F32, device);
        Ok(Mlp {
            l1: linear(IN, HIDDEN, vb.pp("l1"))?,
            l2: linear(HIDDEN, CLASSES, vb.pp("l2"))?,
        })
    }

    fn loss(&self, x: &Tensor, y: &Tensor) -> candle_core::Result<Tensor> {
        let logits = self.l2.forward(&self.l1.forward(x)?.relu()?)?;
        candle_nn::loss::cross_entropy(&logits, y)
    }
}

/// Variables' values by name.
type Snapshot = Vec<(String, Vec<f32>)>;

/// Every variable's values, sorted by name.
fn snapshot(varmap: &VarMap) -> candle_core::Result<Snapshot> {
    let data = varmap.data().lock().unwrap_or_else(|e| e.into_inner());
    let mut all: Snapshot = data
        .iter()
        .map(|(k, v)| Ok((k.clone(), v.as_tensor().flatten_all()?.to_vec1::<f32>()?)))
        .collect::<candle_core::Result<_>>()?;
    all.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(all)
}

fn slice(
    x: &[f32],
    y: &[u32],
    idx: std::ops::Range<usize>,
    device: &Device,
) -> candle_core::Result<(Tensor, Tensor)> {
    let n = idx.len();
    let xs = Tensor::from_slice(&x[idx.start * IN..idx.end * IN], (n, IN), device)?;
    let ys = Tensor::from_slice(&y[idx], n, device)?;
    Ok((xs, ys))
}

fn run_rank() -> Result<(), Box<dyn std::error::Error>> {
    let comm = Communicator::from_env().wait()?;
    let (rank, world) = (comm.rank(), comm.world_size());
    if !GLOBAL_BATCH.is_multiple_of(world) {
        return Err(format!("{world} ranks do not split a batch of {GLOBAL_BATCH}").into());
    }
    let per_rank = GLOBAL_BATCH / world;
    let device = Device::Cpu;
    let (x, y) = data();
    let varmap = VarMap::new();
    let model = Mlp::new(&varmap, &device)?;
    let mut ddp = Ddp::new(&comm, &varmap, Default::default())?;
    ddp.broadcast_params()?;
    let start = snapshot(&varmap)?;
    let mut opt = SGD::new(varmap.all_vars(), LR)?;
    let mut first_loss = None;
    let mut loss_now = 0.0;
    for epoch in 0..EPOCHS {
        let mut total = 0.0;
        for step in 0..SAMPLES / GLOBAL_BATCH {
            let at = step * GLOBAL_BATCH + rank * per_rank;
            let (xs, ys) = slice(&x, &y, at..at + per_rank, &device)?;
            let loss = model.loss(&xs, &ys)?;
            let mut grads = loss.backward()?;
            ddp.sync(&mut grads)?;
            opt.step(&grads)?;
            total += loss.to_scalar::<f32>()?;
        }
        let mean = total / (SAMPLES / GLOBAL_BATCH) as f32;
        first_loss.get_or_insert(mean);
        loss_now = mean;
        if rank == 0 {
            println!("epoch {epoch}: rank 0's loss {mean:.4}");
        }
    }
    let mut failed = false;
    if rank == 0 {
        let reference = train_in_one_process(&start, world, &x, &y, &device)?;
        let got = snapshot(&varmap)?;
        let identical = got.iter().zip(&reference).all(|(a, b)| {
            a.0 == b.0
                && a.1
                    .iter()
                    .zip(&b.1)
                    .all(|(p, q)| p.to_bits() == q.to_bits())
        });
        let largest = reference
            .iter()
            .flat_map(|(_, v)| v)
            .fold(0.0f32, |m, v| m.max(v.abs()));
        let worst = got
            .iter()
            .zip(&reference)
            .flat_map(|(a, b)| a.1.iter().zip(&b.1).map(|(p, q)| (p - q).abs()))
            .fold(0.0f32, f32::max)
            / largest;
        let held = if world <= 2 { identical } else { worst <= 1e-4 };
        println!(
            "check: rank 0's variables against one process with the same global batch: {} (largest difference {worst:.2e} of the largest weight; {} required: {})",
            if identical {
                "bit-identical"
            } else {
                "not bit-identical"
            },
            if world <= 2 {
                "bit-identical"
            } else {
                "within 1e-4"
            },
            if held { "held" } else { "FAILED" }
        );
        let falling = loss_now < first_loss.unwrap_or(f32::MAX);
        println!(
            "check: the loss falls: {}",
            if falling { "yes" } else { "NO" }
        );
        failed = !held || !falling;
    }
    let verdict = comm.broadcast(vec![u8::from(failed)], 0).wait()?;
    if verdict[0] != 0 {
        return Err("a check failed".into());
    }
    Ok(())
}

/// The same training in one process, from the same start: each global
/// batch's slices' gradients summed in f32 and divided once (in f64), as
/// ringwire's average.
fn train_in_one_process(
    start: &[(String, Vec<f32>)],
    world: usize,
    x: &[f32],
    y: &[u32],
    device: &Device,
) -> Result<Snapshot, Box<dyn std::error::Error>> {
    let varmap = VarMap::new();
    let model = Mlp::new(&varmap, device)?;
    {
        let data = varmap.data().lock().unwrap_or_else(|e| e.into_inner());
        for (name, values) in start {
            let var = &data[name];
            var.set(&Tensor::from_slice(values, var.shape(), device)?)?;
        }
    }
    let vars = varmap.all_vars();
    let mut opt = SGD::new(vars.clone(), LR)?;
    let per_rank = GLOBAL_BATCH / world;
    for _ in 0..EPOCHS {
        for step in 0..SAMPLES / GLOBAL_BATCH {
            let mut sums: Vec<Option<Vec<f32>>> = vec![None; vars.len()];
            for r in 0..world {
                let at = step * GLOBAL_BATCH + r * per_rank;
                let (xs, ys) = slice(x, y, at..at + per_rank, device)?;
                let grads = model.loss(&xs, &ys)?.backward()?;
                for (sum, var) in sums.iter_mut().zip(&vars) {
                    let g = grads
                        .get(var)
                        .expect("every variable has a gradient")
                        .flatten_all()?
                        .to_vec1::<f32>()?;
                    match sum {
                        Some(s) => s.iter_mut().zip(&g).for_each(|(s, g)| *s += g),
                        None => *sum = Some(g),
                    }
                }
            }
            let mut averaged = candle_core::backprop::GradStore::default();
            for (sum, var) in sums.into_iter().zip(&vars) {
                let avg: Vec<f32> = sum
                    .expect("summed")
                    .iter()
                    .map(|&v| (v as f64 / world as f64) as f32)
                    .collect();
                averaged.insert(var, Tensor::from_vec(avg, var.shape(), device)?);
            }
            opt.step(&averaged)?;
        }
    }
    Ok(snapshot(&varmap)?)
}
