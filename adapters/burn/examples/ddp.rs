//! A burn MLP trained data-parallel on the digits data set over ringwire,
//! checked against the same training in one process.
//!
//! ```text
//! cd adapters/burn && cargo run --example ddp -- --ranks 2
//! torchrun --nproc-per-node 2 target/debug/examples/ddp   # the same, under torchrun
//! ```
//!
//! The data: smartcore's copy of the UCI handwritten digits (1797 images of
//! 8x8 pixels, ten classes), embedded in the binary. Each epoch walks the
//! samples in order in global batches of 64; each batch is cut into one
//! slice per rank, and the last batch (5 samples) unevenly, so its average
//! is weighted by each rank's samples (`Ddp::set_sample_count`). After
//! training, rank 0 trains the same model in one process from the same
//! start, combining the slices' gradients as ringwire does (summed in f32,
//! divided once), and compares: bit for bit at 1 and 2 ranks; within 1e-4
//! of the largest weight at more (ringwire's all-reduce then sums the
//! ranks in another order than rank order). Every rank also checks that
//! its weights equal rank 0's. The exit status fails if a check fails.

#[path = "common/launch.rs"]
mod launch;

use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::{GradientsParams, SgdConfig};
use burn::tensor::{Device, Int, Tensor, TensorData};
use ringwire_burn::Ddp;
use ringwire_burn::ringwire::train::{ReducerConfig, Unused};
use ringwire_burn::ringwire::{self, Communicator};
use std::process::ExitCode;

const FEATURES: usize = 64;
const HIDDEN: usize = 128;
const CLASSES: usize = 10;
const GLOBAL_BATCH: usize = 64;
const EPOCHS: usize = 10;
const LR: f64 = 0.1;

fn main() -> ExitCode {
    let ranks = match launch::arg("--ranks", 0usize) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("ddp: {e}");
            return ExitCode::from(2);
        }
    };
    if ranks > 0 {
        return launch::local_ranks(ranks, "ddp");
    }
    match run_rank() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ddp: {e}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Module, Debug)]
struct Mlp {
    l1: Linear,
    act: Relu,
    l2: Linear,
}

impl Mlp {
    fn new(device: &Device) -> Mlp {
        Mlp {
            l1: LinearConfig::new(FEATURES, HIDDEN).init(device),
            act: Relu::new(),
            l2: LinearConfig::new(HIDDEN, CLASSES).init(device),
        }
    }

    fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        self.l2.forward(self.act.forward(self.l1.forward(x)))
    }
}

/// The digits: pixels scaled to [0, 1], and labels.
struct Digits {
    x: Vec<f32>,
    y: Vec<i64>,
}

impl Digits {
    fn load() -> Digits {
        let d = smartcore::dataset::digits::load_dataset();
        assert_eq!(d.num_features, FEATURES, "8x8 images");
        Digits {
            x: d.data.iter().map(|v| v / 16.0).collect(),
            y: d.target.iter().map(|&t| t as i64).collect(),
        }
    }

    fn len(&self) -> usize {
        self.y.len()
    }

    /// Samples `at` as tensors.
    fn slice(&self, at: std::ops::Range<usize>, device: &Device) -> (Tensor<2>, Tensor<1, Int>) {
        let n = at.len();
        let x = TensorData::new(
            self.x[at.start * FEATURES..at.end * FEATURES].to_vec(),
            [n, FEATURES],
        );
        let y = TensorData::new(self.y[at].to_vec(), [n]);
        (Tensor::from_data(x, device), Tensor::from_data(y, device))
    }
}

/// Global batch `b`'s slice for `rank` of `world`: contiguous, the first
/// ranks one sample more where the batch does not divide.
fn slice_of(b: usize, rank: usize, world: usize, samples: usize) -> std::ops::Range<usize> {
    let start = b * GLOBAL_BATCH;
    let len = GLOBAL_BATCH.min(samples - start);
    let (base, extra) = (len / world, len % world);
    let from = start + rank * base + rank.min(extra);
    from..from + base + usize::from(rank < extra)
}

fn run_rank() -> Result<(), Box<dyn std::error::Error>> {
    let comm = Communicator::from_env().wait()?;
    let (rank, world) = (comm.rank(), comm.world_size());
    let device = Device::default().autodiff();
    let data = Digits::load();
    let batches = data.len().div_ceil(GLOBAL_BATCH);
    let model = Mlp::new(&device);
    // A rank whose slice of the last batch is empty (more ranks than its
    // samples) syncs no gradients, counting them as zero with weight zero.
    let config = ReducerConfig {
        unused: Unused::Zero,
        ..Default::default()
    };
    let mut ddp = Ddp::new(&comm, &model, config)?;
    let mut model = ddp.broadcast(model)?;
    let start = model.clone();
    let mut optim = SgdConfig::new().init();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut losses = Vec::new();
    for epoch in 0..EPOCHS {
        let mut total = 0.0;
        for b in 0..batches {
            let at = slice_of(b, rank, world, data.len());
            let uneven = !data.len().is_multiple_of(GLOBAL_BATCH) && b + 1 == batches;
            if uneven {
                ddp.set_sample_count(at.len());
            }
            let grads = if at.is_empty() {
                ddp.sync_params(&model, GradientsParams::new())?
            } else {
                let (x, y) = data.slice(at.clone(), &device);
                let loss = loss_fn.forward(model.forward(x), y);
                total += loss.clone().into_scalar::<f32>() as f64 * at.len() as f64;
                ddp.sync(&model, loss.backward())?
            };
            model = optim.step(LR, model, grads);
        }
        // The epoch's mean loss over every rank's samples.
        let sum = comm
            .all_reduce(vec![total], ringwire::ReduceOp::Sum)
            .wait()?[0];
        let mean = sum / data.len() as f64;
        losses.push(mean);
        if rank == 0 {
            println!("epoch {epoch}: loss {mean:.4}");
        }
    }
    let mine = weights(&model);
    let rank0 = comm.broadcast(mine.clone(), 0).wait()?;
    let mut failed = false;
    if mine
        .iter()
        .zip(&rank0)
        .any(|(a, b)| a.to_bits() != b.to_bits())
    {
        eprintln!("ddp: rank {rank}'s weights differ from rank 0's");
        failed = true;
    }
    if rank == 0 {
        let reference = weights(&train_in_one_process(start, world, &data, &device));
        let identical = mine
            .iter()
            .zip(&reference)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        let largest = reference.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let worst = mine
            .iter()
            .zip(&reference)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max)
            / largest;
        let exact = world <= 2;
        let held = if exact { identical } else { worst <= 1e-4 };
        println!(
            "check: {world} ranks' weights against one process with the same global batches: {} (largest difference {worst:.2e} of the largest weight; {} required: {})",
            if identical {
                "bit-identical"
            } else {
                "not bit-identical"
            },
            if exact {
                "bit-identical"
            } else {
                "within 1e-4"
            },
            if held { "held" } else { "FAILED" }
        );
        let accuracy = accuracy(&model, &data, &device);
        let falling = losses.last() < losses.first();
        println!(
            "check: the loss falls ({:.4} to {:.4}): {}; accuracy on the training set {:.1}%",
            losses[0],
            losses[losses.len() - 1],
            if falling { "yes" } else { "NO" },
            accuracy * 100.0
        );
        failed |= !held || !falling;
    }
    let verdict = comm
        .all_reduce(vec![u8::from(failed)], ringwire::ReduceOp::Max)
        .wait()?;
    if verdict[0] != 0 {
        return Err("a check failed".into());
    }
    Ok(())
}

/// Every parameter's values, in visit order.
fn weights(model: &Mlp) -> Vec<f32> {
    let mut all = Vec::new();
    for l in [&model.l1, &model.l2] {
        all.extend(l.weight.val().into_data().iter::<f32>());
        if let Some(b) = &l.bias {
            all.extend(b.val().into_data().iter::<f32>());
        }
    }
    all
}

/// One slice's gradients, in visit order (l1.weight, l1.bias, l2.weight,
/// l2.bias).
fn slice_grads(
    model: &Mlp,
    data: &Digits,
    at: std::ops::Range<usize>,
    device: &Device,
) -> Vec<Vec<f32>> {
    let (x, y) = data.slice(at, device);
    let loss = CrossEntropyLossConfig::new()
        .init(device)
        .forward(model.forward(x), y);
    let grads = GradientsParams::from_grads(loss.backward(), model);
    let mut out = Vec::new();
    for l in [&model.l1, &model.l2] {
        out.push(
            grads
                .get::<2>(l.weight.id)
                .expect("weight gradient")
                .into_data()
                .try_to_vec::<f32>()
                .expect("f32"),
        );
        let b = l.bias.as_ref().expect("bias");
        out.push(
            grads
                .get::<1>(b.id)
                .expect("bias gradient")
                .into_data()
                .try_to_vec::<f32>()
                .expect("f32"),
        );
    }
    out
}

/// The same training in one process, from the same start: each global
/// batch's slices' gradients combined as ringwire's reducer combines them
/// (summed in f32 in rank order and divided once in f64; for the uneven
/// last batch, each scaled by its sample count, summed, and scaled by one
/// over the total).
fn train_in_one_process(mut model: Mlp, world: usize, data: &Digits, device: &Device) -> Mlp {
    let mut optim = SgdConfig::new().init();
    let batches = data.len().div_ceil(GLOBAL_BATCH);
    for _ in 0..EPOCHS {
        for b in 0..batches {
            let uneven = !data.len().is_multiple_of(GLOBAL_BATCH) && b + 1 == batches;
            let mut sum: Option<Vec<Vec<f32>>> = None;
            let mut samples = 0;
            for r in 0..world {
                let at = slice_of(b, r, world, data.len());
                if at.is_empty() {
                    continue;
                }
                samples += at.len();
                let weight = at.len() as f32;
                let mut g = slice_grads(&model, data, at, device);
                if uneven {
                    g.iter_mut().flatten().for_each(|v| *v *= weight);
                }
                match &mut sum {
                    None => sum = Some(g),
                    Some(s) => s
                        .iter_mut()
                        .flatten()
                        .zip(g.iter().flatten())
                        .for_each(|(s, g)| *s += g),
                }
            }
            let mut avg = sum.expect("a batch has samples");
            if uneven {
                let scale = (1.0 / samples as f64) as f32;
                avg.iter_mut().flatten().for_each(|v| *v *= scale);
            } else {
                avg.iter_mut()
                    .flatten()
                    .for_each(|v| *v = (*v as f64 / world as f64) as f32);
            }
            let mut grads = GradientsParams::new();
            let mut avg = avg.into_iter();
            for l in [&model.l1, &model.l2] {
                let shape = l.weight.val().shape();
                grads.register::<2>(
                    l.weight.id,
                    Tensor::from_data(TensorData::new(avg.next().expect("weight"), shape), device),
                );
                let b = l.bias.as_ref().expect("bias");
                let shape = b.val().shape();
                grads.register::<1>(
                    b.id,
                    Tensor::from_data(TensorData::new(avg.next().expect("bias"), shape), device),
                );
            }
            model = optim.step(LR, model, grads);
        }
    }
    model
}

/// The share of samples the model classifies right.
fn accuracy(model: &Mlp, data: &Digits, device: &Device) -> f64 {
    let (x, y) = data.slice(0..data.len(), device);
    let predicted = model.forward(x).argmax(1).flatten::<1>(0, 1);
    let right = predicted.equal(y).int().sum().into_scalar::<i64>();
    right as f64 / data.len() as f64
}
