//! All-reduce random data across local ranks, check it, and time it.
//!
//! ```text
//! cargo run --release --example allreduce -- --ranks 4
//! cargo run --release --example allreduce -- --ranks 2 --bytes 64M --iters 20
//! ```
//!
//! With `--ranks N` this process starts N copies of itself as ranks (like
//! torchrun on one host) and hosts the rendezvous store for them. Without
//! it, it is a rank and joins through the launch environment (RANK,
//! WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...), so it also runs under
//! torchrun, mpirun or srun.

use ringwire::{Communicator, ReduceOp};
use std::process::{Command, ExitCode};
use std::time::Instant;

struct Args {
    ranks: Option<usize>,
    bytes: usize,
    iters: usize,
}

fn parse_size(s: &str) -> Option<usize> {
    let (num, mult) = match s.chars().last()? {
        'K' | 'k' => (&s[..s.len() - 1], 1 << 10),
        'M' | 'm' => (&s[..s.len() - 1], 1 << 20),
        'G' | 'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().ok().map(|n| n * mult)
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        ranks: None,
        bytes: 16 << 20,
        iters: 10,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--ranks" => {
                args.ranks = Some(
                    value("--ranks")?
                        .parse()
                        .map_err(|_| "--ranks: not a number")?,
                )
            }
            "--bytes" => {
                args.bytes =
                    parse_size(&value("--bytes")?).ok_or("--bytes: use e.g. 4096, 64K, 16M")?
            }
            "--iters" => {
                args.iters = value("--iters")?
                    .parse()
                    .map_err(|_| "--iters: not a number")?
            }
            "-h" | "--help" => {
                println!("usage: allreduce [--ranks N] [--bytes SIZE] [--iters N]");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other} (try --help)")),
        }
    }
    Ok(args)
}

fn main() -> ExitCode {
    // Warnings on stderr; RINGWIRE_LOG=info (or ringwire=debug, ...) for more.
    #[cfg(feature = "logging")]
    ringwire::logging::init_from_env();
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("allreduce: {e}");
            return ExitCode::from(2);
        }
    };
    match args.ranks {
        Some(n) => launch(n),
        // An error is printed and, under torchrun, written to its error
        // file, so its failure report shows the cause.
        None => ringwire::error_file::main(|| run_rank(&args)),
    }
}

/// Starts `n` ranks of this program and waits for them.
fn launch(n: usize) -> ExitCode {
    if n == 0 {
        eprintln!("allreduce: --ranks must be at least 1");
        return ExitCode::from(2);
    }
    let store = match ringwire::store::StoreServer::bind("127.0.0.1:0".parse().expect("literal")) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("allreduce: cannot start the store: {e}");
            return ExitCode::FAILURE;
        }
    };
    let exe = std::env::current_exe().expect("current exe");
    let passthrough: Vec<String> = {
        let mut v = Vec::new();
        let mut it = std::env::args().skip(1);
        while let Some(a) = it.next() {
            if a == "--ranks" {
                it.next();
            } else {
                v.push(a);
            }
        }
        v
    };
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
                eprintln!("allreduce: rank {rank} failed ({status})");
                ok = false;
            }
            Err(e) => {
                eprintln!("allreduce: rank {rank} could not run: {e}");
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

fn run_rank(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let comm = Communicator::from_env().wait()?;
    let (rank, world) = (comm.rank(), comm.world_size());
    let len = args.bytes / 4;

    // Check once, then time. Small whole numbers sum exactly in f32, so the
    // result can be compared bit for bit with a sum computed here.
    let value = |rank: usize, i: usize| ((i * 31 + rank * 7) % 13) as f32;
    let mine: Vec<f32> = (0..len).map(|i| value(rank, i)).collect();
    let got = comm.all_reduce(mine, ReduceOp::Sum).wait()?;
    if let Some(i) = (0..len).find(|&i| got[i] != (0..world).map(|r| value(r, i)).sum::<f32>()) {
        return Err(format!("rank {rank}: wrong sum at element {i}: {}", got[i]).into());
    }

    let mut buf = comm.alloc::<f32>(len);
    comm.barrier().wait()?;
    let start = Instant::now();
    for _ in 0..args.iters {
        buf = comm.all_reduce(buf, ReduceOp::Sum).wait()?;
    }
    let per_op = start.elapsed() / args.iters.max(1) as u32;
    if rank == 0 {
        let secs = per_op.as_secs_f64();
        let algbw = args.bytes as f64 / secs / 1e9;
        let busbw = algbw * 2.0 * (world as f64 - 1.0) / world as f64;
        println!(
            "all_reduce f32 sum: {world} ranks, {} bytes, checked OK; \
             {:.1} us per op, algbw {algbw:.2} GB/s, busbw {busbw:.2} GB/s ({} transport)",
            args.bytes,
            secs * 1e6,
            comm.transport_name()
        );
    }
    Ok(())
}
