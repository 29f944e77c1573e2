//! Step time of data-parallel burn training over ringwire, and the time
//! spent in `Ddp::sync` (copies and communication): the benchmark behind
//! docs/perf.md's burn section.
//!
//! ```text
//! cd adapters/burn && cargo build --release --example step_time
//! target/release/examples/step_time --ranks 2 --model digits --steps 200
//! target/release/examples/step_time --ranks 2 --model wide --steps 10
//! ```
//!
//! `--bucket-mb N` sets the reducer's bucket cap (25 MiB by default, as
//! PyTorch's).
//!
//! `digits` is the ddp example's MLP (64-128-10, 9.6 k parameters), `wide`
//! an MLP of 25 M parameters (1024-4096-4096-1024). Both train on random
//! data with a global batch of 64 split across the ranks (so more ranks
//! each compute less), plain SGD. Printed: the medians over the timed steps
//! of the whole step, of `sync` (copying the gradients into bucket memory,
//! the all-reduce, and the averages back), and of the communication `sync`
//! waited for after the copies (`StepStats::comm_wait`). The step and sync
//! medians are the slowest rank's; the ranges are across ranks (a rank
//! that finished backward first also waits for the others).

#[path = "common/launch.rs"]
mod launch;

use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::SgdConfig;
use burn::tensor::{Device, Int, Tensor, TensorData};
use ringwire::train::ReducerConfig;
use ringwire::{Communicator, ReduceOp};
use ringwire_burn::Ddp;
use std::process::ExitCode;
use std::time::{Duration, Instant};

const GLOBAL_BATCH: usize = 64;
const WARMUP: usize = 3;

fn main() -> ExitCode {
    let parsed = (|| {
        Ok::<_, String>((
            launch::arg("--ranks", 0usize)?,
            launch::arg("--model", "digits".to_string())?,
            launch::arg("--steps", 50usize)?,
            launch::arg("--bucket-mb", 25usize)?,
        ))
    })();
    let (ranks, model, steps, bucket_mb) = match parsed {
        Ok(p) => p,
        Err(e) => {
            eprintln!("step_time: {e}");
            return ExitCode::from(2);
        }
    };
    let dims: &[usize] = match model.as_str() {
        "digits" => &[64, 128, 10],
        "wide" => &[1024, 4096, 4096, 1024],
        other => {
            eprintln!("step_time: --model digits or wide, not {other:?}");
            return ExitCode::from(2);
        }
    };
    if ranks > 0 {
        return launch::local_ranks(ranks, "step_time");
    }
    match run_rank(&model, dims, steps, bucket_mb) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("step_time: {e}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Module, Debug)]
struct Mlp {
    layers: Vec<Linear>,
    act: Relu,
}

impl Mlp {
    fn new(dims: &[usize], device: &Device) -> Mlp {
        Mlp {
            layers: dims
                .windows(2)
                .map(|w| LinearConfig::new(w[0], w[1]).init(device))
                .collect(),
            act: Relu::new(),
        }
    }

    fn forward(&self, mut x: Tensor<2>) -> Tensor<2> {
        let last = self.layers.len() - 1;
        for (i, l) in self.layers.iter().enumerate() {
            x = l.forward(x);
            if i < last {
                x = self.act.forward(x);
            }
        }
        x
    }
}

fn run_rank(
    name: &str,
    dims: &[usize],
    steps: usize,
    bucket_mb: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let comm = Communicator::from_env().wait()?;
    let (rank, world) = (comm.rank(), comm.world_size());
    let per_rank = GLOBAL_BATCH / world;
    if per_rank == 0 {
        return Err(format!("{world} ranks leave no samples of a batch of {GLOBAL_BATCH}").into());
    }
    let device = Device::default().autodiff();
    let (features, classes) = (dims[0], dims[dims.len() - 1]);
    let x: Vec<f32> = (0..per_rank * features)
        .map(|i| ((i * 7919 + rank * 104_729) % 1000) as f32 / 1000.0)
        .collect();
    let y: Vec<i64> = (0..per_rank)
        .map(|i| ((i + rank) % classes) as i64)
        .collect();
    let x = Tensor::<2>::from_data(TensorData::new(x, [per_rank, features]), &device);
    let y = Tensor::<1, Int>::from_data(TensorData::new(y, [per_rank]), &device);
    let model = Mlp::new(dims, &device);
    let config = ReducerConfig {
        bucket_cap_bytes: bucket_mb << 20,
        ..Default::default()
    };
    let mut ddp = Ddp::new(&comm, &model, config)?;
    let params: usize = ddp.reducer().layout().iter().map(|(_, p)| p.len).sum();
    let mut model = ddp.broadcast(model)?;
    let mut optim = SgdConfig::new().init();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let (mut step_t, mut sync_t, mut wait_t) = (Vec::new(), Vec::new(), Vec::new());
    for step in 0..WARMUP + steps {
        let start = Instant::now();
        ddp.reducer().begin_forward();
        let loss = loss_fn.forward(model.forward(x.clone()), y.clone());
        ddp.reducer().begin_backward();
        let grads = loss.backward();
        let synced = Instant::now();
        let grads = ddp.sync(&model, grads)?;
        let sync = synced.elapsed();
        model = optim.step(0.01, model, grads);
        if step >= WARMUP {
            step_t.push(start.elapsed());
            sync_t.push(sync);
            wait_t.push(ddp.reducer().step_stats().comm_wait);
        }
    }
    // Each rank's medians, in milliseconds; the range across ranks (the
    // minimum as the maximum of the negated values, in one all-reduce).
    let mut medians: Vec<f64> = [step_t, sync_t, wait_t]
        .into_iter()
        .map(|t| median(t).as_secs_f64() * 1e3)
        .collect();
    medians.extend(medians.clone().iter().map(|m| -m));
    let r = comm.all_reduce(medians, ReduceOp::Max).wait()?;
    if rank == 0 {
        println!(
            "burn step_time: model {name} ({params} parameters), {world} ranks, batch {per_rank} per rank, {steps} steps: step p50 {:.3} ms, sync p50 {:.3} ms (ranks {:.3}-{:.3}), of it waiting for communication {:.3}-{:.3} ms",
            r[0], r[1], -r[4], r[1], -r[5], r[2]
        );
    }
    Ok(())
}

fn median(mut t: Vec<Duration>) -> Duration {
    t.sort();
    t.get(t.len() / 2).copied().unwrap_or_default()
}
