//! How much gradient communication `GradReducer` hides behind backward:
//! the step time of one data-parallel MLP under four ways to synchronise,
//! interleaved round by round on the same ranks.
//!
//! ```text
//! cargo run --release --example ddp_overlap -- --ranks 2
//! bash benches/ddp_overlap.sh 1gbit     # two network namespaces, a rate-limited veth
//! ```
//!
//! Modes: `none` (no communication: the compute-only bound), `after` (one
//! all-reduce of every gradient after backward), `buckets` (the reducer's
//! buckets, all launched after backward) and `overlap` (each bucket
//! launched as backward produces its last gradient). Reported per mode: the
//! median step time over ranks' slowest; then the share of communication
//! that overlap hid, `(buckets - overlap) / (buckets - none)`, and the
//! reducer's own per-step times as PyTorch DDP logs them. Synthetic data
//! (timing only). With `--ranks N` this process starts N ranks of itself;
//! without it, it is a rank (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

use ringwire::train::{GradReducer, Layout, ParamId, ReducerConfig, StepStats};
use ringwire::{Communicator, DType, ReduceOp};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

struct Args {
    ranks: Option<usize>,
    widths: Vec<usize>,
    batch: usize,
    steps: usize,
    rounds: usize,
    bucket_kib: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        ranks: None,
        widths: vec![256, 512, 512, 512, 10],
        batch: 32,
        steps: 5,
        rounds: 4,
        bucket_kib: 512,
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
            "--batch" => args.batch = number("--batch", value("--batch")?)?,
            "--steps" => args.steps = number("--steps", value("--steps")?)?,
            "--rounds" => args.rounds = number("--rounds", value("--rounds")?)?,
            "--bucket-kib" => args.bucket_kib = number("--bucket-kib", value("--bucket-kib")?)?,
            "--widths" => {
                args.widths = value("--widths")?
                    .split(',')
                    .map(|w| {
                        w.parse()
                            .map_err(|_| format!("--widths: {w:?} is not a number"))
                    })
                    .collect::<Result<_, _>>()?;
                if args.widths.len() < 2 {
                    return Err("--widths: at least an input and an output width".into());
                }
            }
            "-h" | "--help" => {
                println!(
                    "usage: ddp_overlap [--ranks N] [--widths 256,512,512,512,10] [--batch PER_RANK] \
                     [--steps S] [--rounds R] [--bucket-kib K]"
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
            eprintln!("ddp_overlap: {e}");
            return ExitCode::from(2);
        }
    };
    match args.ranks {
        Some(n) => launch(n),
        None => ringwire::error_file::main(|| run_rank(&args)),
    }
}

fn launch(n: usize) -> ExitCode {
    let store = match ringwire::store::StoreServer::bind("127.0.0.1:0".parse().expect("literal")) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ddp_overlap: cannot start the store: {e}");
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
        if !child.and_then(|mut c| c.wait()).is_ok_and(|s| s.success()) {
            eprintln!("ddp_overlap: rank {rank} failed");
            ok = false;
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    None,
    After,
    Buckets,
    Overlap,
}

const MODES: [Mode; 4] = [Mode::None, Mode::After, Mode::Buckets, Mode::Overlap];

struct Mlp {
    widths: Vec<usize>,
    params: Vec<Vec<f32>>,
}

impl Mlp {
    fn new(widths: &[usize]) -> Mlp {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut uniform = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        };
        let mut params = Vec::new();
        for l in 0..widths.len() - 1 {
            let scale = (2.0 / widths[l] as f32).sqrt();
            params.push(
                (0..widths[l] * widths[l + 1])
                    .map(|_| uniform() * scale)
                    .collect(),
            );
            params.push(vec![0.0; widths[l + 1]]);
        }
        Mlp {
            widths: widths.to_vec(),
            params,
        }
    }

    fn layers(&self) -> usize {
        self.widths.len() - 1
    }

    fn forward(&self, x: &[f32], n: usize) -> Vec<Vec<f32>> {
        let mut acts = vec![x.to_vec()];
        for l in 0..self.layers() {
            let (fi, fo) = (self.widths[l], self.widths[l + 1]);
            let (w, b) = (&self.params[2 * l], &self.params[2 * l + 1]);
            let mut out = vec![0.0f32; n * fo];
            for s in 0..n {
                let row = &mut out[s * fo..(s + 1) * fo];
                row.copy_from_slice(b);
                for i in 0..fi {
                    let xi = acts[l][s * fi + i];
                    for (o, wv) in row.iter_mut().zip(&w[i * fo..(i + 1) * fo]) {
                        *o += xi * wv;
                    }
                }
                if l + 1 < self.layers() {
                    row.iter_mut().for_each(|v| *v = v.max(0.0));
                }
            }
            acts.push(out);
        }
        acts
    }

    /// Backward of a squared loss against zero targets, last layer first:
    /// each gradient goes where `sink` says, and is marked done there
    /// before the layer below is computed.
    fn backward(&self, acts: &[Vec<f32>], n: usize, sink: &mut dyn GradSink) {
        let mut dout: Vec<f32> = acts
            .last()
            .expect("output")
            .iter()
            .map(|v| v / n as f32)
            .collect();
        for l in (0..self.layers()).rev() {
            let (fi, fo) = (self.widths[l], self.widths[l + 1]);
            let dw = sink.grad(2 * l);
            dw.fill(0.0);
            for s in 0..n {
                for i in 0..fi {
                    let xi = acts[l][s * fi + i];
                    for (g, d) in dw[i * fo..(i + 1) * fo]
                        .iter_mut()
                        .zip(&dout[s * fo..(s + 1) * fo])
                    {
                        *g += xi * d;
                    }
                }
            }
            sink.done(2 * l);
            let db = sink.grad(2 * l + 1);
            db.fill(0.0);
            for s in 0..n {
                db.iter_mut()
                    .zip(&dout[s * fo..(s + 1) * fo])
                    .for_each(|(g, d)| *g += d);
            }
            sink.done(2 * l + 1);
            if l == 0 {
                break;
            }
            let w = &self.params[2 * l];
            let mut din = vec![0.0f32; n * fi];
            for s in 0..n {
                for i in 0..fi {
                    let acc: f32 = dout[s * fo..(s + 1) * fo]
                        .iter()
                        .zip(&w[i * fo..(i + 1) * fo])
                        .map(|(d, w)| d * w)
                        .sum();
                    din[s * fi + i] = if acts[l][s * fi + i] > 0.0 { acc } else { 0.0 };
                }
            }
            dout = din;
        }
    }

    fn layout(&self) -> Layout {
        let mut layout = Layout::new();
        for (i, p) in self.params.iter().enumerate() {
            layout.push(format!("p{i}"), p.len(), DType::F32);
        }
        layout
    }
}

/// Where backward puts gradients.
trait GradSink {
    fn grad(&mut self, param: usize) -> &mut [f32];
    fn done(&mut self, param: usize);
}

/// Plain vectors: no communication (`none`).
struct Local(Vec<Vec<f32>>);

impl GradSink for Local {
    fn grad(&mut self, param: usize) -> &mut [f32] {
        &mut self.0[param]
    }
    fn done(&mut self, _: usize) {}
}

/// The reducer's bucket memory; marked ready as each gradient is done
/// (`overlap`, and `after` with one bucket), or only after backward
/// (`buckets`).
struct Bucketed<'a> {
    reducer: &'a mut GradReducer,
    ids: &'a [ParamId],
    mark_at_once: bool,
}

impl GradSink for Bucketed<'_> {
    fn grad(&mut self, param: usize) -> &mut [f32] {
        self.reducer
            .grad_mut::<f32>(self.ids[param])
            .expect("an f32 gradient, not in flight")
    }
    fn done(&mut self, param: usize) {
        if self.mark_at_once {
            self.reducer
                .mark_ready(self.ids[param])
                .expect("once a step");
        }
    }
}

/// The slowest rank's time of `f`, as every rank sees it.
fn slowest(
    comm: &Communicator,
    f: impl FnOnce() -> Result<(), Box<dyn std::error::Error>>,
) -> Result<f64, Box<dyn std::error::Error>> {
    comm.barrier().wait()?;
    let start = Instant::now();
    f()?;
    let mine = start.elapsed().as_secs_f64();
    Ok(comm.all_reduce(vec![mine], ReduceOp::Max).wait()?[0])
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn run_rank(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let comm = Communicator::from_env().wait()?;
    let rank = comm.rank();
    let model = Mlp::new(&args.widths);
    let n = args.batch;
    let x: Vec<f32> = (0..n * args.widths[0])
        .map(|i| ((i * 7919 + rank * 31) % 1000) as f32 / 1000.0)
        .collect();
    let layout = model.layout();
    let ids: Vec<ParamId> = layout.iter().map(|(id, _)| id).collect();
    let bytes: usize = model.params.iter().map(|p| p.len() * 4).sum();
    let bucketed = ReducerConfig {
        bucket_cap_bytes: args.bucket_kib << 10,
        first_bucket_bytes: (args.bucket_kib << 10) / 4,
        ..ReducerConfig::default()
    };
    let one_bucket = ReducerConfig {
        bucket_cap_bytes: usize::MAX,
        first_bucket_bytes: usize::MAX,
        ..ReducerConfig::default()
    };
    let mut after = GradReducer::new(&comm, layout.clone(), one_bucket)?;
    let mut buckets = GradReducer::new(&comm, layout.clone(), bucketed.clone())?;
    let mut overlap = GradReducer::new(&comm, layout, bucketed)?;
    let mut local = Local(model.params.iter().map(|p| vec![0.0; p.len()]).collect());
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); MODES.len()];
    let mut stats: Vec<StepStats> = Vec::new();
    for round in 0..args.rounds + 1 {
        for k in 0..MODES.len() {
            let mode = MODES[(k + round) % MODES.len()];
            for _ in 0..args.steps {
                let t = slowest(&comm, || {
                    let acts = model.forward(&x, n);
                    match mode {
                        Mode::None => model.backward(&acts, n, &mut local),
                        Mode::After | Mode::Buckets | Mode::Overlap => {
                            let reducer = match mode {
                                Mode::After => &mut after,
                                Mode::Buckets => &mut buckets,
                                _ => &mut overlap,
                            };
                            reducer.begin_backward();
                            model.backward(
                                &acts,
                                n,
                                &mut Bucketed {
                                    reducer: &mut *reducer,
                                    ids: &ids,
                                    mark_at_once: mode != Mode::Buckets,
                                },
                            );
                            if mode == Mode::Buckets {
                                for &id in ids.iter().rev() {
                                    reducer.mark_ready(id)?;
                                }
                            }
                            reducer.finish()?;
                            reducer.zero_grads();
                        }
                    }
                    Ok(())
                })?;
                // The first round warms up (and rebuilds the buckets).
                if round > 0 {
                    times[mode as usize].push(t);
                    if mode == Mode::Overlap {
                        stats.push(overlap.step_stats());
                    }
                }
            }
        }
    }
    if rank == 0 {
        let ms: Vec<f64> = times.iter_mut().map(|t| 1e3 * median(t)).collect();
        println!(
            "# ddp_overlap: {} ranks, MLP {:?} ({:.1} MB of f32 gradients, {} buckets), {} samples per rank, {} steps x {} rounds per mode",
            comm.world_size(),
            args.widths,
            bytes as f64 / 1e6,
            overlap.buckets().len(),
            n,
            args.steps,
            args.rounds
        );
        for (mode, t) in MODES.iter().zip(&ms) {
            println!(
                "{:>8} {t:9.2} ms per step",
                format!("{mode:?}").to_lowercase()
            );
        }
        let comm_time = ms[Mode::Buckets as usize] - ms[Mode::None as usize];
        let hidden = (ms[Mode::Buckets as usize] - ms[Mode::Overlap as usize]) / comm_time;
        println!(
            "communication after backward: {comm_time:.2} ms per step; overlap hid {:.0}% of it",
            100.0 * hidden
        );
        let mid = |f: &dyn Fn(&StepStats) -> Duration| {
            let mut v: Vec<f64> = stats.iter().map(|s| f(s).as_secs_f64() * 1e3).collect();
            median(&mut v)
        };
        println!(
            "overlap, as DDP logs it (medians): backward {:.2} ms, communication {:.2} ms, overlapped {:.2} ms, waited after backward {:.2} ms",
            mid(&|s| s.backward_compute.unwrap_or_default()),
            mid(&|s| s.backward_comm.unwrap_or_default()),
            mid(&|s| s.overlap),
            mid(&|s| s.comm_wait)
        );
    }
    Ok(())
}
