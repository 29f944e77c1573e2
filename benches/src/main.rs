//! ringwire-bench: latency and bandwidth of ringwire's collectives, printed
//! like nccl-tests (size, count, type, redop, root, time, algbw, busbw,
//! #wrong) plus latency percentiles, CPU seconds per GB and the share of the
//! ring link limit.
//!
//! `--ranks N` starts N local rank processes (this binary again) and hosts
//! their rendezvous store; without it the process is one rank of a job
//! described by the launch environment (torchrun, mpirun, srun, by hand).
//!
//! `--device cuda|standin` runs the same sweep on device buffers through
//! NCCL (ringwire-gpu; see `device`).

#![forbid(unsafe_code)]

mod args;
mod bench_op;
mod certs;
mod check;
mod cores;
mod device;
mod linklimit;
mod membw;
use linklimit::LinkLimit;
mod ops;
mod plot;
mod report;

use args::{Args, DeviceChoice, LinksChoice, TransportChoice};
use bench_op::BenchOp;
use hdrhistogram::Histogram;
use ops::{Bench, CpuBench, Runner};
use report::Row;
use ringwire::{Communicator, DType, Element, LocalLinks, ReduceOp, TransportKind};
use std::io::IsTerminal;
use std::process::{Child, Command, ExitCode};
use std::time::{Duration, Instant};

const CHILD_VAR: &str = "RINGWIRE_BENCH_CHILD";
/// Sizes from here (the issue's "from 1 MiB up") get the link limit measured
/// just before and after them.
const BRACKET_FROM: usize = 1 << 20;
/// Bytes each rank streams in a bracketing link-limit measurement: short
/// enough to stay close to the size it brackets.
const BRACKET_BYTES: usize = 64 << 20;

fn main() -> ExitCode {
    // Warnings on stderr (every rank process); RINGWIRE_LOG for more.
    ringwire::logging::init_from_env();
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.first().map(String::as_str) == Some("core-round-trip") {
        // The launcher's probe on its own, for scripts that time other
        // libraries (benches/compare/run.sh) and need the VM's phase.
        return match cores::line("now") {
            Some(line) => {
                println!("{line}");
                ExitCode::SUCCESS
            }
            None => {
                eprintln!("ringwire-bench: fewer than two usable cores: no round trip to measure");
                ExitCode::FAILURE
            }
        };
    }
    if argv.first().map(String::as_str) == Some("memcpy-bandwidth") {
        println!("{}", membw::line());
        return ExitCode::SUCCESS;
    }
    let args = match args::parse(&argv) {
        Ok(a) => a,
        Err(msg) if msg == args::USAGE => {
            print!("{msg}");
            return ExitCode::SUCCESS;
        }
        Err(msg) => {
            eprintln!("ringwire-bench: {msg}");
            return ExitCode::from(2);
        }
    };
    if let (Some(n), Err(_)) = (args.ranks, std::env::var(CHILD_VAR)) {
        return launch(n, &argv, &args);
    }
    match run_rank(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            ringwire::error_file::report(&"results were wrong: see the #wrong column");
            ExitCode::FAILURE
        }
        // Printed and, under torchrun, written to its error file, so its
        // failure report shows the cause.
        Err(e) => {
            ringwire::error_file::report(&e);
            ExitCode::FAILURE
        }
    }
}

/// Starts `n` ranks of this binary on this host, hosts their store, and
/// waits; a failing rank stops the others after a grace period.
fn launch(n: usize, argv: &[String], args: &Args) -> ExitCode {
    // With --tls: a throwaway CA and a certificate per rank and for the
    // store, removed when the ranks are done.
    let pki = if args.tls {
        match certs::TempPki::generate(n) {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("ringwire-bench: cannot generate TLS certificates: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        None
    };
    let mut security = ringwire::Security::none();
    if let Some(p) = &pki {
        match p.tls_config(n) {
            Ok(t) => security = security.with_tls(Some(t)),
            Err(e) => {
                eprintln!("ringwire-bench: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if let Some(s) = &args.secret {
        security = security.with_secret(s.clone());
    } else if let Ok(s) = std::env::var("RINGWIRE_SECRET") {
        security = security.with_secret(s);
    }
    let store = match ringwire::store::StoreServer::bind_with(
        "127.0.0.1:0".parse().expect("literal"),
        security,
    ) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ringwire-bench: cannot start the rendezvous store: {e}");
            return ExitCode::FAILURE;
        }
    };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("ringwire-bench: cannot find this executable: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Before any rank runs, and after all have ended: the probe spins on two
    // cores, so it must not overlap the ranks.
    print_line(cores::line("before the ranks start"));
    let port = store.local_addr().port().to_string();
    let mut children: Vec<Option<Child>> = Vec::new();
    for rank in 0..n {
        let mut cmd = Command::new(&exe);
        if let Some(p) = &pki {
            let (cert, key) = p.files(rank);
            cmd.env("RINGWIRE_TLS", "mtls")
                .env("RINGWIRE_TLS_CA", p.ca_file())
                .env("RINGWIRE_TLS_CERT", cert)
                .env("RINGWIRE_TLS_KEY", key);
        }
        let spawned = cmd
            .args(argv)
            .env(CHILD_VAR, "1")
            .env("RINGWIRE_RANK", rank.to_string())
            .env("RINGWIRE_WORLD_SIZE", n.to_string())
            .env("RINGWIRE_LOCAL_RANK", rank.to_string())
            .env("RINGWIRE_LOCAL_WORLD_SIZE", n.to_string())
            .env("RINGWIRE_MASTER_ADDR", "127.0.0.1")
            .env("RINGWIRE_MASTER_PORT", &port)
            .env("RINGWIRE_HOST_STORE", "0")
            .spawn();
        match spawned {
            Ok(c) => children.push(Some(c)),
            Err(e) => {
                eprintln!("ringwire-bench: cannot start rank {rank}: {e}");
                children.push(None);
            }
        }
    }
    let mut failed = children.iter().any(Option::is_none);
    let mut running = children.iter().filter(|c| c.is_some()).count();
    let mut first_failure: Option<Instant> = None;
    while running > 0 {
        for (rank, slot) in children.iter_mut().enumerate() {
            let Some(child) = slot else { continue };
            match child.try_wait() {
                Ok(Some(status)) => {
                    if !status.success() {
                        eprintln!("ringwire-bench: rank {rank} exited with {status}");
                        failed = true;
                        first_failure.get_or_insert_with(Instant::now);
                    }
                    *slot = None;
                    running -= 1;
                }
                Ok(None) => {}
                Err(e) => {
                    eprintln!("ringwire-bench: waiting for rank {rank}: {e}");
                    failed = true;
                    *slot = None;
                    running -= 1;
                }
            }
        }
        if first_failure.is_some_and(|t| t.elapsed() > Duration::from_secs(10)) {
            for (rank, slot) in children.iter_mut().enumerate() {
                if let Some(child) = slot {
                    eprintln!("ringwire-bench: stopping rank {rank} (another rank failed)");
                    let _ = child.kill();
                    let _ = child.wait();
                    *slot = None;
                    running -= 1;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(pki);
    print_line(cores::line("after they end"));
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn print_line(line: Option<String>) {
    if let Some(line) = line {
        use std::io::Write;
        println!("{line}");
        let _ = std::io::stdout().flush();
    }
}

fn machine_line() -> String {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "?".into())
    };
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "?".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!(
        "{}, {cores} cores ({cpu}), Linux {}",
        read("/proc/sys/kernel/hostname"),
        read("/proc/sys/kernel/osrelease")
    )
}

/// CPU seconds (user + sys) of this process so far, and its peak RSS in KiB.
fn cpu_and_rss() -> (f64, u64) {
    use nix::sys::resource::{UsageWho, getrusage};
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(u) => {
            let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 * 1e-6;
            (t(u.user_time()) + t(u.system_time()), u.max_rss() as u64)
        }
        Err(_) => (0.0, 0),
    }
}

/// One rank's measurement of one (size, transport).
struct Measured {
    times: Vec<f64>,
    cpu: f64,
    wrong: usize,
    shape: bench_op::Shape,
}

/// Checks (with `-c 1`), warms up and times `runner`, one op at a time,
/// each from its submission until its wait returns.
fn measure(
    runner: &mut dyn Bench,
    ctrl: &Communicator,
    a: &Args,
    shape: bench_op::Shape,
) -> Result<Measured, String> {
    let e = |e: ringwire::Error| e.to_string();
    let wrong = if a.check {
        runner.check(a.inject_wrong)?
    } else {
        0
    };
    let warm_start = Instant::now();
    for _ in 0..a.warmup {
        runner.iterate()?;
    }
    // Every rank must run the same number of iterations: agree on the
    // slowest rank's warm-up estimate.
    let per_iter = warm_start.elapsed().as_secs_f64() / a.warmup.max(1) as f64;
    let per_iter = ctrl
        .all_reduce(vec![per_iter], ReduceOp::Max)
        .wait()
        .map_err(e)?[0];
    let iters = if a.max_seconds > 0.0 && a.warmup > 0 && per_iter > 0.0 {
        ((a.max_seconds / per_iter) as usize).clamp(1, a.iters.max(1))
    } else {
        a.iters.max(1)
    };
    runner.barrier()?;
    let (cpu0, _) = cpu_and_rss();
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        runner.iterate()?;
        times.push(t.elapsed().as_secs_f64());
    }
    let (cpu1, _) = cpu_and_rss();
    Ok(Measured {
        times,
        cpu: cpu1 - cpu0,
        wrong,
        shape,
    })
}

/// The host runner of `a.op` at `shape` on `comm`.
fn cpu_bench<'c, T: Element>(
    comm: &'c Communicator,
    a: &Args,
    shape: bench_op::Shape,
) -> Box<dyn Bench + 'c> {
    let runner =
        Runner::<T>::new(a.op, a.redop, a.root, shape, a.buffer_offset).blocking(a.blocking);
    Box::new(CpuBench { runner, comm })
}

macro_rules! with_dtype {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            DType::F32 => {
                type $t = f32;
                $body
            }
            DType::F64 => {
                type $t = f64;
                $body
            }
            DType::F16 => {
                type $t = half::f16;
                $body
            }
            DType::BF16 => {
                type $t = half::bf16;
                $body
            }
            DType::I32 => {
                type $t = i32;
                $body
            }
            DType::I64 => {
                type $t = i64;
                $body
            }
            DType::U8 => {
                type $t = u8;
                $body
            }
        }
    };
}

/// Runs this rank's part of the sweep. `Ok(false)` when results were wrong.
fn run_rank(a: &Args) -> Result<bool, String> {
    let uring_works = ringwire_uring::probe().is_ok();
    let transports: Vec<(&str, TransportKind)> = match a.transport {
        TransportChoice::Portable => vec![("portable", TransportKind::Portable)],
        TransportChoice::Uring => vec![("uring", TransportKind::Uring)],
        TransportChoice::All if uring_works && !a.tls => vec![
            ("uring", TransportKind::Uring),
            ("portable", TransportKind::Portable),
        ],
        TransportChoice::All => {
            eprintln!(
                "note: measuring the portable transport only ({})",
                if a.tls {
                    "TLS runs on the portable transport".to_string()
                } else {
                    ringwire::uring_status()
                }
            );
            vec![("portable", TransportKind::Portable)]
        }
    };
    let links: &[LocalLinks] = match a.links {
        LinksChoice::Unix => &[LocalLinks::Unix],
        LinksChoice::Tcp => &[LocalLinks::Tcp],
        LinksChoice::Shm => &[LocalLinks::Shm],
        LinksChoice::All => &[LocalLinks::Unix, LocalLinks::Tcp, LocalLinks::Shm],
    };
    // Rows of forced TCP links are labelled `<transport>-tcp`.
    let mut variants: Vec<(String, TransportKind, LocalLinks)> = transports
        .iter()
        .flat_map(|&(name, kind)| {
            links.iter().map(move |&l| {
                let label = match l {
                    LocalLinks::Tcp => format!("{name}-tcp"),
                    LocalLinks::Shm => format!("{name}-shm"),
                    LocalLinks::Unix => name.to_string(),
                };
                (label, kind, l)
            })
        })
        .collect();
    // On a device, NCCL moves the data: one CPU communicator (the first
    // variant) starts it and gathers the results.
    let on_device = a.device != DeviceChoice::Cpu;
    if on_device {
        variants.truncate(1);
    }
    let mut comms: Vec<(String, Communicator)> = Vec::new();
    for (i, (name, kind, local_links)) in variants.iter().enumerate() {
        let mut b = ringwire::Builder::from_env()
            .map_err(|e| e.to_string())?
            .transport(*kind)
            .local_links(*local_links)
            .job(format!("bench-{name}"));
        if let Some(timeout) = a.op_timeout() {
            b = b.timeout(timeout);
        }
        if let Some(s) = &a.secret {
            b = b.secret(s.clone());
        }
        if a.tls && std::env::var_os("RINGWIRE_TLS_CA").is_none() {
            return Err(
                "--tls without --ranks needs RINGWIRE_TLS_CA, RINGWIRE_TLS_CERT and RINGWIRE_TLS_KEY"
                    .into(),
            );
        }
        if i > 0 {
            b = b.host_store(false); // the first communicator's rank 0 hosts it
        }
        comms.push((name.clone(), b.build().wait().map_err(|e| e.to_string())?));
    }
    let ctrl = comms[0].1.clone();
    let (rank, world) = (ctrl.rank(), ctrl.world_size());
    let gpu = device::open(a, &ctrl)?;
    // Device rows are labelled by what moves their data.
    let control = comms[0].0.clone();
    if gpu.is_some() {
        comms[0].0 = "nccl".into();
    }
    if let [op] = a.ops[..]
        && op.point_to_point()
        && world < 2
    {
        return Err(format!("{} needs at least 2 ranks", op.name()));
    }
    if a.ops.iter().any(|op| op.rooted()) && a.root >= world {
        return Err(format!(
            "--root {} is not a rank (world size {world})",
            a.root
        ));
    }
    let lead = rank == 0;
    let started = Instant::now();
    let progress = lead && std::io::stderr().is_terminal();
    if lead {
        println!(
            "# ringwire-bench {}: {world} ranks, dtype {}, redop {}, transports: {}",
            a.ops
                .iter()
                .map(|op| op.name())
                .collect::<Vec<_>>()
                .join(","),
            a.dtype,
            a.redop,
            comms
                .iter()
                .map(|t| t.0.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        if let Some(g) = &gpu {
            println!(
                "# device: {} (rank 0), {}; ringwire's {control} transport only starts NCCL and gathers the results",
                g.device(),
                g.library()
            );
        }
        if a.transport == TransportChoice::All && !on_device {
            println!(
                "# (uring: {}; comparing the available transports only)",
                ringwire::uring_status()
            );
        }
        println!("# machine: {}", machine_line());
        println!(
            "# security: {}",
            ringwire::Security::from_env()
                .map(|s| {
                    let s = match &a.secret {
                        Some(k) => s.with_secret(k.clone()),
                        None => s,
                    };
                    s.describe()
                })
                .unwrap_or_else(|e| e.to_string())
        );
        println!(
            "# iterations: up to {} timed after {} warm-up (capped near {} s per size), check {}, {}",
            a.iters,
            a.warmup,
            a.max_seconds,
            if a.check { "on" } else { "off" },
            match a.blocking {
                true => "blocking slice forms (all_reduce_slice, ...)",
                false => "owned buffers and wait()",
            }
        );
    }
    // What carries each variant's ring links (made by a first op).
    let mut kinds = Vec::new();
    for (name, comm) in &comms {
        comm.barrier().wait().map_err(|e| e.to_string())?;
        let kind = comm.link_kind((rank + 1) % world).unwrap_or("none");
        kinds.push(if on_device { "nccl" } else { kind });
        if lead && world > 1 && !on_device {
            let lanes = if comm.link_has_lanes((rank + 1) % world) {
                " with lanes for large payloads (RINGWIRE_TCP_LANES)"
            } else {
                ""
            };
            println!("# {name}: rank 0's link to rank 1 is {kind}{lanes}");
        }
    }
    // The link limit over each kind of link a variant uses: once before
    // the sweep, and again around every size from `BRACKET_FROM` bytes so
    // that a size is compared with the limit of its own moment (this VM's
    // speed drifts 2x within minutes).
    let measure_limits =
        |bytes: usize, buffer: usize| -> Result<Vec<(&str, Option<LinkLimit>)>, String> {
            let mut limits: Vec<(&str, Option<LinkLimit>)> = Vec::new();
            for &kind in &kinds {
                if kind == "none" || limits.iter().any(|(k, _)| *k == kind) {
                    continue;
                }
                let unix = kind == "unix";
                let l = linklimit::measure(&ctrl, bytes, unix, buffer, a.link_socket_buffer)?;
                limits.push((kind, l));
            }
            Ok(limits)
        };
    let limit_in = |limits: &[(&str, Option<LinkLimit>)], kind: &str| {
        limits.iter().find(|(k, _)| *k == kind).and_then(|l| l.1)
    };
    let mut limits: Vec<(&str, Option<LinkLimit>)> = Vec::new();
    if a.link_limit {
        let bytes = 256 << 20;
        limits = measure_limits(bytes, a.link_buffer)?;
        if lead {
            for (kind, l) in &limits {
                match l {
                    Some(l) => println!(
                        "# ring link limit ({kind}): {:.3} GB/s (every rank streams {} MiB to its successor at once over plain {kind} sockets, from and into {} buffers{}); {:.3} CPU s per GB streamed, all ranks, {:.2} cores busy",
                        l.gbps,
                        bytes >> 20,
                        report::human_bytes(a.link_buffer),
                        a.link_socket_buffer.map_or(String::new(), |b| format!(
                            ", socket buffers set to {}",
                            report::human_bytes(b)
                        )),
                        l.cpu_s_per_gb,
                        l.cores_busy,
                    ),
                    None => println!("# ring link limit: n/a for one rank"),
                }
            }
            if limits.iter().any(|(_, l)| l.is_some()) {
                println!(
                    "# from {} the link column compares each size with the mean of the limits measured just before and just after it ({} MiB streams{})",
                    report::human_bytes(BRACKET_FROM),
                    BRACKET_BYTES >> 20,
                    if a.link_buffer_op {
                        ", from and into buffers as large as the size"
                    } else {
                        ""
                    }
                );
            }
        }
    }
    let link_limit = limit_in(&limits, "tcp").map(|l| l.gbps);
    let link_limit_unix = limit_in(&limits, "unix").map(|l| l.gbps);
    let mut all_wrong = 0u64;
    for &op in &a.ops {
        let a = &a.for_op(op);
        if op.point_to_point() && world < 2 {
            if lead {
                println!("# {}: skipped (it needs at least 2 ranks)", op.name());
            }
            continue;
        }
        if lead && a.ops.len() > 1 {
            println!("#\n# {}", op.name());
        }
        if lead {
            println!("{}", report::header());
        }
        let mut rows = Vec::new();
        let mut total_wrong = 0u64;
        let elem = a.dtype.size();
        // Limits measured just after the previous size, if it was bracketed.
        let mut before: Option<Vec<(&str, Option<LinkLimit>)>> = None;
        // (kind, lowest, highest) of the bracketing limits, for the summary.
        // and the lowest and highest CPU per GB streamed.
        let mut drift: Vec<(&str, [f64; 2], [f64; 2])> = Vec::new();
        for size in args::sizes(a) {
            let payload = a.op.shape(size, elem, world).bytes;
            if a.op != BenchOp::Barrier && payload == 0 {
                continue;
            }
            let bracket = a.link_limit && world > 1 && payload >= BRACKET_FROM;
            // `--link-buffer op`: streams from buffers as large as this size's
            // payload, as the op must; the limit after the previous size, from
            // smaller buffers, does not serve as this one's before.
            let buffer = if a.link_buffer_op {
                payload
            } else {
                a.link_buffer
            };
            if a.link_buffer_op {
                before = None;
            }
            if bracket && before.is_none() {
                before = Some(measure_limits(BRACKET_BYTES, buffer)?);
            }
            let first_row = rows.len();
            for ((name, comm), kind) in comms.iter().zip(&kinds) {
                if progress {
                    eprint!("\r[{name}] {} {size} B ...        ", a.op.name());
                }
                let shape = a.op.shape(size, elem, world);
                let mut runner = match &gpu {
                    None => with_dtype!(a.dtype, T => cpu_bench::<T>(comm, a, shape)),
                    Some(g) => with_dtype!(a.dtype, T => g.bench::<T>(a, shape)?),
                };
                let two_level_before = comm.stats().two_level_ops;
                let m = measure(runner.as_mut(), &ctrl, a, shape);
                let two_level = comm.stats().two_level_ops > two_level_before;
                // Device buffers freed before the next size's are made.
                drop(runner);
                let m = m?;
                let e = |e: ringwire::Error| e.to_string();
                let iters = m.times.len();
                let all = ctrl
                    .all_gather(m.times, vec![0f64; iters * world])
                    .wait()
                    .map_err(e)?
                    .1;
                let cpu = ctrl
                    .all_reduce(vec![m.cpu], ReduceOp::Sum)
                    .wait()
                    .map_err(e)?[0];
                let wrong = ctrl
                    .all_reduce(vec![m.wrong as i64], ReduceOp::Sum)
                    .wait()
                    .map_err(e)?[0] as u64;
                total_wrong += wrong;
                // The largest rank: a slow root or receiver holds what its
                // peers sent ahead, and rank 0 is not always that one.
                let max_rss_kib = ctrl
                    .all_reduce(vec![cpu_and_rss().1 as i64], ReduceOp::Max)
                    .wait()
                    .map_err(e)?[0] as u64;
                if !lead {
                    continue;
                }
                // An iteration ends when its slowest rank does; ping-pong
                // reports one-way latency (half the round trip).
                let scale = if a.op == BenchOp::PingPong { 0.5 } else { 1.0 };
                let per_iter: Vec<f64> = (0..iters)
                    .map(|i| (0..world).map(|r| all[r * iters + i]).fold(0.0, f64::max) * scale)
                    .collect();
                let mean = per_iter.iter().sum::<f64>() / iters as f64;
                let mut hist = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3)
                    .map_err(|e| e.to_string())?;
                for t in &per_iter {
                    hist.saturating_record((t * 1e9).max(1.0) as u64);
                }
                let us = |ns: u64| ns as f64 / 1e3;
                let bytes = m.shape.bytes;
                let algbw = report::algbw(bytes, mean);
                let busbw = algbw * a.op.bus_factor(world);
                let moved_gb = bytes as f64 * iters as f64 / 1e9;
                let row = Row {
                    transport: name.to_string(),
                    size_bytes: bytes,
                    count: bytes / elem,
                    dtype: a.dtype.name().into(),
                    redop: if a.op.reduces() {
                        a.redop.name().into()
                    } else {
                        "none".into()
                    },
                    root: a.op.rooted().then_some(a.root),
                    iters,
                    time_us: mean * 1e6,
                    algbw_gbps: algbw,
                    busbw_gbps: busbw,
                    wrong,
                    p50_us: us(hist.value_at_quantile(0.5)),
                    p99_us: us(hist.value_at_quantile(0.99)),
                    max_us: us(hist.max()),
                    cpu_s_per_gb: (moved_gb > 0.0).then(|| cpu / moved_gb),
                    link_pct: None,
                    link_limit_gbps: limit_in(&limits, kind).map(|l| l.gbps),
                    link_cpu_s_per_gb: limit_in(&limits, kind).map(|l| l.cpu_s_per_gb),
                    link_buffer_bytes: limit_in(&limits, kind).map(|l| l.buffer),
                    link_kind: kind.to_string(),
                    max_rss_kib,
                    two_level,
                };
                rows.push(row);
            }
            if bracket {
                let after = measure_limits(BRACKET_BYTES, buffer)?;
                let around = before.replace(after.clone()).unwrap_or_default();
                for row in &mut rows[first_row..] {
                    if let (Some(x), Some(y)) = (
                        limit_in(&around, &row.link_kind),
                        limit_in(&after, &row.link_kind),
                    ) {
                        row.link_limit_gbps = Some((x.gbps + y.gbps) / 2.0);
                        row.link_cpu_s_per_gb = Some((x.cpu_s_per_gb + y.cpu_s_per_gb) / 2.0);
                        row.link_buffer_bytes = Some(buffer);
                    }
                }
                for (kind, l) in around.iter().chain(&after) {
                    let Some(l) = *l else { continue };
                    let (gbps, cpu) = (l.gbps, l.cpu_s_per_gb);
                    match drift.iter_mut().find(|d| d.0 == *kind) {
                        Some((_, low, high)) => {
                            *low = [low[0].min(gbps), low[1].min(cpu)];
                            *high = [high[0].max(gbps), high[1].max(cpu)];
                        }
                        None => drift.push((kind, [gbps, cpu], [gbps, cpu])),
                    }
                }
            } else {
                before = None;
            }
            if !lead {
                continue;
            }
            if progress {
                eprint!("\r{:60}\r", "");
            }
            for row in &mut rows[first_row..] {
                row.link_pct = row
                    .link_limit_gbps
                    .filter(|l| *l > 0.0 && row.size_bytes > 0)
                    .map(|l| row.busbw_gbps / l * 100.0);
                println!("{}", report::format_row(row));
            }
        }
        if lead {
            for (kind, low, high) in &drift {
                println!(
                    "# ring link limit ({kind}) around the sizes from {}: {:.3} to {:.3} GB/s, {:.3} to {:.3} CPU s per GB streamed",
                    report::human_bytes(BRACKET_FROM),
                    low[0],
                    high[0],
                    low[1],
                    high[1],
                );
            }
            if world > 1 {
                for (name, comm) in &comms {
                    let next = (rank + 1) % world;
                    if let Some(line) = report::lane_shares(&comm.lane_stats(next)) {
                        println!("# {name}: rank 0's link to rank {next}: {line}");
                    }
                }
            }
            // The engine's threads are the process's: once, whichever
            // communicator runs on it.
            let elapsed = started.elapsed();
            if let Some(line) = comms
                .iter()
                .find_map(|(_, c)| report::engine_threads(&c.engine_thread_stats(), elapsed))
            {
                println!("# rank 0's {line}");
            }
            for (t, sizes) in report::two_level_sizes(&rows) {
                println!(
                    "# {t}: in two levels, within each host and across hosts (RINGWIRE_TWO_LEVEL), at {sizes} B"
                );
            }
            for (t, avg) in report::averages(&rows) {
                println!("# avg bus bandwidth: {avg:.3} GB/s ({t})");
            }
            if let Some(r) = report::ratios(&rows) {
                println!("{r}");
            }
            println!(
                "# wrong elements: {total_wrong}{}",
                if total_wrong == 0 {
                    " (OK)"
                } else {
                    " (FAILED)"
                }
            );
            let title = format!("ringwire {} {}, {world} ranks", a.op.name(), a.dtype);
            if let Some(path) = &a.json {
                let doc = serde_json::json!({
                    "op": a.op.name(), "ranks": world, "dtype": a.dtype.name(), "redop": a.redop.name(),
                    "device": gpu.as_ref().map_or_else(|| "cpu".to_string(), |g| g.device()),
                    "nccl": gpu.as_ref().map(|g| g.library()),
                    "machine": machine_line(), "link_limit_gbps": link_limit,
                    "link_limit_unix_gbps": link_limit_unix,
                    "link_buffer_bytes": a.link_limit.then_some(a.link_buffer),
                    "link_socket_buffer_bytes": a.link_limit.then_some(a.link_socket_buffer).flatten(),
                    "rows": rows,
                });
                std::fs::write(
                    path,
                    serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?,
                )
                .map_err(|e| format!("writing {path}: {e}"))?;
            }
            if let Some(path) = &a.csv {
                std::fs::write(path, report::csv(&rows))
                    .map_err(|e| format!("writing {path}: {e}"))?;
            }
            if let Some(path) = &a.plot {
                plot::write_svg(path, &title, &rows)?;
            }
        }
        all_wrong += total_wrong;
    }
    Ok(all_wrong == 0)
}
