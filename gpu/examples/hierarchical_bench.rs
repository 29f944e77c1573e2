//! Times the hierarchical all-reduce on one CUDA device with R ranks, each
//! its own "host" (so the across-host phase carries everything over
//! ringwire's transport), pipelined in chunks against one unchunked copy,
//! interleaved so both see the same machine state.
//!
//!     cargo run --release -p ringwire-gpu --features cuda --example hierarchical_bench -- 2 5
//!
//! Arguments: ranks (default 2), repetitions per size (default 5).

use cudarc::driver::CudaContext;
use ringwire::store::StoreServer;
use ringwire::{Communicator, ReduceOp};
use ringwire_gpu::{Device, HierarchicalAllReduce};
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let ranks = args.first().copied().unwrap_or(2);
    let reps = args.get(1).copied().unwrap_or(5);
    let ctx = CudaContext::new(0)?;
    let device = Device::from_cuda_context(ctx.clone());
    let store = StoreServer::bind("127.0.0.1:0".parse()?)?;
    let addr = store.local_addr();
    let sizes: Vec<usize> = (16..=28).step_by(2).map(|s| 1usize << s).collect();
    let chunked = [("4 MiB chunks", 4usize << 20), ("one chunk", 1 << 30)];
    println!(
        "# hierarchical all-reduce, f32 sum, {ranks} ranks on {device:?}, each its own host; median of {reps}"
    );
    println!(
        "{:>12} {:>14} {:>10} {:>10} {:>10}",
        "bytes", "staging", "time_us", "algbw", "busbw"
    );
    let rows = std::thread::scope(|s| {
        let handles: Vec<_> = (0..ranks)
            .map(|rank| {
                let (device, sizes, ctx) = (device.clone(), sizes.clone(), ctx.clone());
                s.spawn(move || -> Result<Vec<(usize, &str, f64)>, String> {
                    let cpu = Communicator::builder()
                        .rank(rank)
                        .world_size(ranks)
                        .store_addr(addr)
                        .host_store(false)
                        .timeout(Duration::from_secs(120))
                        .build()
                        .wait()
                        .map_err(|e| e.to_string())?;
                    let hiers: Vec<_> = chunked
                        .iter()
                        .map(|(_, bytes)| {
                            HierarchicalAllReduce::builder(&cpu, &device)
                                .host(format!("host-{rank}"))
                                .chunk_bytes(*bytes)
                                .build()
                        })
                        .collect::<Result<_, _>>()
                        .map_err(|e| e.to_string())?;
                    let stream = ctx.default_stream();
                    let mut rows = Vec::new();
                    for &bytes in &sizes {
                        let mut buf = stream
                            .alloc_zeros::<f32>(bytes / 4)
                            .map_err(|e| format!("{e:?}"))?;
                        let mut times = vec![Vec::new(); chunked.len()];
                        for rep in 0..=reps {
                            for (i, hier) in hiers.iter().enumerate() {
                                cpu.barrier().wait().map_err(|e| e.to_string())?;
                                let started = Instant::now();
                                buf = hier
                                    .all_reduce(buf, ReduceOp::Sum)
                                    .wait()
                                    .map_err(|e| e.to_string())?;
                                if rep > 0 {
                                    times[i].push(started.elapsed().as_secs_f64());
                                }
                            }
                        }
                        for (i, mut t) in times.into_iter().enumerate() {
                            t.sort_by(f64::total_cmp);
                            rows.push((bytes, chunked[i].0, t[t.len() / 2]));
                        }
                    }
                    Ok(rows)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect::<Vec<_>>()
    });
    let rank0 = rows.into_iter().next().expect("rank 0")?;
    for (bytes, label, secs) in rank0 {
        let algbw = bytes as f64 / secs / 1e9;
        let busbw = algbw * 2.0 * (ranks as f64 - 1.0) / ranks as f64;
        println!(
            "{bytes:>12} {label:>14} {:>10.1} {algbw:>10.2} {busbw:>10.2}",
            secs * 1e6
        );
    }
    drop(store);
    Ok(())
}
