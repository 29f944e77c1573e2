//! The NCCL path on a real GPU (feature `cuda`; ignored elsewhere): run by
//! `gpu/scripts/gpu-test.sh` on a machine with a GPU, NCCL and a driver,
//! from a test binary built where Rust is. Every op, dtype and reduce
//! operator on cudarc device slices, a 100-tensor group, the barrier,
//! `stream_wait` ordering, and two ranks on one GPU where the NCCL version
//! allows it (else the refusal, typed).

#![cfg(feature = "cuda")]

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use ringwire::store::StoreServer;
use ringwire::testing::{Rng, check_close, random_data, reference_reduce};
use ringwire::{Communicator, Element, ReduceOp};
use ringwire_gpu::{Device, DeviceElement, GpuCommunicator, GpuError, NcclLibrary, NcclVersion};
use std::sync::Arc;
use std::time::Duration;

const GPU: &str = "needs a GPU: run gpu/scripts/gpu-test.sh";

fn cpu_group(world: usize) -> (StoreServer, Vec<Communicator>) {
    let store = StoreServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = store.local_addr();
    let comms = std::thread::scope(|s| {
        let hs: Vec<_> = (0..world)
            .map(|rank| {
                let b = Communicator::builder()
                    .rank(rank)
                    .world_size(world)
                    .store_addr(addr)
                    .host_store(false)
                    .timeout(Duration::from_secs(60));
                s.spawn(move || b.build().wait().expect("cpu communicator"))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    (store, comms)
}

fn on_all<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let hs: Vec<_> = items.iter().map(|c| s.spawn(|| f(c))).collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}

fn context() -> Arc<CudaContext> {
    CudaContext::new(0).expect("CUDA device 0")
}

fn gpus(
    world: usize,
    ctx: &Arc<CudaContext>,
) -> (StoreServer, Vec<Result<GpuCommunicator, GpuError>>) {
    let (store, cpu) = cpu_group(world);
    let device = Device::from_cuda_context(ctx.clone());
    let gpus = on_all(&cpu, |c| GpuCommunicator::new(c, &device));
    (store, gpus)
}

fn up<T: DeviceRepr>(stream: &Arc<CudaStream>, data: &[T]) -> CudaSlice<T> {
    stream.clone_htod(data).expect("copy to the device")
}

fn down<T: DeviceRepr + Default + Clone>(stream: &Arc<CudaStream>, data: &CudaSlice<T>) -> Vec<T> {
    stream.clone_dtoh(data).expect("copy to the host")
}

/// Every reduce op and the moves for one dtype, on `gpus` sharing one GPU.
fn sweep<T>(gpus: &[GpuCommunicator], ctx: &Arc<CudaContext>, rng: &mut Rng)
where
    T: Element
        + DeviceElement
        + DeviceRepr
        + ValidAsZeroBits
        + Default
        + PartialEq
        + std::fmt::Debug,
{
    let world = gpus.len();
    let stream = ctx.default_stream();
    for op in ReduceOp::ALL {
        for len in [1usize, 7, 1000, 1 << 20] {
            let data: Vec<Vec<T>> = (0..world).map(|_| random_data(rng, len, op)).collect();
            let reference = reference_reduce(&data, op);
            let got = on_all(gpus, |g| {
                let out = g
                    .all_reduce(up(&stream, &data[g.rank()]), op)
                    .wait()
                    .expect("all_reduce");
                down(&stream, &out)
            });
            for (rank, out) in got.iter().enumerate() {
                check_close(out, &reference, world).unwrap_or_else(|e| {
                    panic!("all_reduce {} {op:?} {len} rank {rank}: {e}", T::NAME)
                });
            }
            let got = on_all(gpus, |g| {
                let input: Vec<T> = data.concat();
                let out = stream.alloc_zeros::<T>(len * world).unwrap();
                let (_, out) = g
                    .all_gather(up(&stream, &data[g.rank()]), out)
                    .wait()
                    .expect("all_gather");
                assert_eq!(down(&stream, &out), input);
                let zero = stream.alloc_zeros::<T>(len).unwrap();
                let (_, out) = g
                    .reduce_scatter(up(&stream, &input), zero, op)
                    .wait()
                    .expect("reduce_scatter");
                down(&stream, &out)
            });
            let sums = reference_reduce(&vec![data.concat(); world], op);
            for (rank, out) in got.iter().enumerate() {
                check_close(out, &sums[rank * len..(rank + 1) * len], world).unwrap_or_else(|e| {
                    panic!("reduce_scatter {} {op:?} {len} rank {rank}: {e}", T::NAME)
                });
            }
        }
    }
    let len = 4097;
    let data: Vec<Vec<T>> = (0..world)
        .map(|_| random_data(rng, len, ReduceOp::Sum))
        .collect();
    for root in 0..world {
        let got = on_all(gpus, |g| {
            down(
                &stream,
                &g.broadcast(up(&stream, &data[g.rank()]), root)
                    .wait()
                    .expect("broadcast"),
            )
        });
        assert!(got.iter().all(|o| o == &data[root]));
        let got = on_all(gpus, |g| {
            down(
                &stream,
                &g.reduce(up(&stream, &data[g.rank()]), ReduceOp::Max, root)
                    .wait()
                    .expect("reduce"),
            )
        });
        check_close(&got[root], &reference_reduce(&data, ReduceOp::Max), world).unwrap();
        let got = on_all(gpus, |g| {
            let out = stream
                .alloc_zeros::<T>(if g.rank() == root { len * world } else { 0 })
                .unwrap();
            down(
                &stream,
                &g.gather(up(&stream, &data[g.rank()]), out, root)
                    .wait()
                    .expect("gather")
                    .1,
            )
        });
        assert_eq!(got[root], data.concat());
        let got = on_all(gpus, |g| {
            let input = if g.rank() == root {
                up(&stream, &data.concat())
            } else {
                stream.alloc_zeros::<T>(0).unwrap()
            };
            down(
                &stream,
                &g.scatter(input, stream.alloc_zeros::<T>(len).unwrap(), root)
                    .wait()
                    .expect("scatter")
                    .1,
            )
        });
        assert_eq!(got, data);
    }
    let blocks: Vec<Vec<T>> = (0..world)
        .map(|_| random_data(rng, len * world, ReduceOp::Sum))
        .collect();
    let got = on_all(gpus, |g| {
        let out = stream.alloc_zeros::<T>(len * world).unwrap();
        down(
            &stream,
            &g.all_to_all(up(&stream, &blocks[g.rank()]), out)
                .wait()
                .expect("all_to_all")
                .1,
        )
    });
    for (rank, out) in got.iter().enumerate() {
        for p in 0..world {
            assert_eq!(
                &out[p * len..(p + 1) * len],
                &blocks[p][rank * len..(rank + 1) * len]
            );
        }
    }
}

fn sweep_all(gpus: &[GpuCommunicator], ctx: &Arc<CudaContext>) {
    let mut rng = Rng::new(Rng::fresh_seed());
    use ringwire::half::{bf16, f16};
    sweep::<f32>(gpus, ctx, &mut rng);
    sweep::<f64>(gpus, ctx, &mut rng);
    sweep::<f16>(gpus, ctx, &mut rng);
    sweep::<bf16>(gpus, ctx, &mut rng);
    sweep::<i32>(gpus, ctx, &mut rng);
    sweep::<i64>(gpus, ctx, &mut rng);
    sweep::<u8>(gpus, ctx, &mut rng);
}

#[test]
#[ignore = "needs a GPU: run gpu/scripts/gpu-test.sh"]
fn one_rank_every_op_dtype_and_reduce_op() {
    let ctx = context();
    let (_store, gpus) = gpus(1, &ctx);
    let gpus: Vec<_> = gpus.into_iter().map(|g| g.expect("init")).collect();
    eprintln!("{:?}", gpus[0]);
    sweep_all(&gpus, &ctx);
}

#[test]
#[ignore = "needs a GPU: run gpu/scripts/gpu-test.sh"]
fn a_group_of_100_tensors_the_barrier_and_stream_wait() {
    let ctx = context();
    let (_store, gpus) = gpus(1, &ctx);
    let g = gpus.into_iter().next().unwrap().expect("init");
    let stream = ctx.default_stream();
    let tensors: Vec<Vec<f32>> = (0..100).map(|i| vec![i as f32; 1 + i * 37]).collect();
    let mut group = g.group();
    for t in &tensors {
        group.all_reduce(up(&stream, t), ReduceOp::Sum);
    }
    let outs = group.launch().wait().expect("group");
    for (t, out) in tensors.iter().zip(&outs) {
        assert_eq!(&down(&stream, out), t);
    }
    g.barrier().wait().expect("barrier");
    // stream_wait: the host does not block; the compute stream runs after
    // the op, so a copy queued on it sees the result.
    let compute = ctx.new_stream().unwrap();
    let big = compute.clone_htod(&vec![3.0f32; 1 << 24]).unwrap();
    let pending = g.all_reduce(big, ReduceOp::Sum);
    let big = pending
        .stream_wait(&ringwire_gpu::Stream::from_cuda(compute.clone()))
        .expect("stream_wait");
    let back = compute.clone_dtoh(&big).unwrap();
    assert!(back.iter().all(|&x| x == 3.0));
    // Send to self inside a group.
    let mut group = g.group();
    group
        .send(up(&stream, &[1.5f32, 2.5]), 0)
        .recv(stream.alloc_zeros::<f32>(2).unwrap(), 0);
    let outs = group.launch().wait().expect("send/recv to self");
    assert_eq!(down(&stream, &outs[1]), vec![1.5, 2.5]);
}

#[test]
#[ignore = "needs a GPU: run gpu/scripts/gpu-test.sh"]
fn two_ranks_on_one_gpu_work_or_are_refused_clearly() {
    let lib = NcclLibrary::global().expect("NCCL");
    let ctx = context();
    let (_store, gpus) = gpus(2, &ctx);
    let allowed = lib.version() >= NcclVersion::new(2, 30, 0)
        && std::env::var("NCCL_MULTI_RANK_GPU_ENABLE").as_deref() == Ok("1");
    eprintln!(
        "NCCL {}; two ranks on one GPU expected to work: {allowed}",
        lib.version()
    );
    if allowed {
        let gpus: Vec<_> = gpus
            .into_iter()
            .map(|g| g.expect("init of two ranks on one GPU"))
            .collect();
        sweep_all(&gpus, &ctx);
        // Abort while an op is pending: rank 1 never joins it.
        let stream = ctx.default_stream();
        let pending = gpus[0].all_reduce(up(&stream, &[1.0f32; 1024]), ReduceOp::Sum);
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !pending.is_completed(),
            "an all-reduce finished without its peer"
        );
        let started = std::time::Instant::now();
        gpus[0].abort("test: abort a pending op");
        let err = pending.wait().expect_err("the pending op fails");
        eprintln!("pending op after abort ({:?}): {err}", started.elapsed());
        assert!(
            err.to_string().contains("test: abort a pending op"),
            "{err}"
        );
        let until = std::time::Instant::now() + Duration::from_secs(30);
        while gpus[1].failure().is_none() {
            assert!(
                std::time::Instant::now() < until,
                "rank 1 never heard of the abort"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    } else {
        for g in gpus {
            let err = g.expect_err("NCCL before 2.30 refuses two ranks on one GPU");
            eprintln!("refused as expected: {err}");
            assert!(
                matches!(err, GpuError::Nccl { .. } | GpuError::Aborted { .. }),
                "{err}"
            );
        }
    }
}

#[test]
#[ignore = "needs a GPU: run gpu/scripts/gpu-test.sh"]
fn the_gpu_is_available() {
    let lib = ringwire_gpu::available(0).expect("NCCL and a GPU");
    eprintln!("{lib:?}");
    let _ = GPU;
}

#[test]
#[ignore = "needs a GPU: run gpu/scripts/gpu-test.sh"]
fn hierarchical_all_reduce_across_two_hosts_on_one_gpu() {
    // Two "hosts" of one rank each: NCCL within each (one rank), ringwire
    // across, through pinned staging in 1 MiB chunks.
    let ctx = context();
    let (_store, cpu) = cpu_group(2);
    let device = Device::from_cuda_context(ctx.clone());
    let hier = on_all(&cpu, |c| {
        ringwire_gpu::HierarchicalAllReduce::builder(c, &device)
            .host(format!("host-{}", c.rank()))
            .chunk_bytes(1 << 20)
            .build()
            .expect("hierarchical")
    });
    let stream = ctx.default_stream();
    let mut rng = Rng::new(Rng::fresh_seed());
    for op in ReduceOp::ALL {
        for len in [1usize, 1000, (3 << 20) + 5] {
            let data: Vec<Vec<f32>> = (0..2).map(|_| random_data(&mut rng, len, op)).collect();
            let reference = reference_reduce(&data, op);
            let got = on_all(&hier, |h| {
                let rank = h.cross().rank();
                down(
                    &stream,
                    &h.all_reduce(up(&stream, &data[rank]), op)
                        .wait()
                        .expect("all_reduce"),
                )
            });
            for out in &got {
                check_close(out, &reference, 2).unwrap_or_else(|e| panic!("{op:?} {len}: {e}"));
            }
        }
    }
}

/// Issue 45 on real NCCL (decision 0041): three ranks on one GPU, rank 2
/// goes while the others' all-reduce waits for it; they shrink the CPU
/// communicator, then the GPU one. Prints which way it was made
/// (`ncclCommShrink`, or a new unique id where NCCL refused the parent)
/// and how long it took: the number decision 0041 asks a GPU for.
#[test]
#[ignore = "needs a GPU: run gpu/scripts/gpu-test.sh"]
fn survivors_shrink_on_real_nccl() {
    let lib = NcclLibrary::global().expect("NCCL");
    if lib.version() < NcclVersion::new(2, 30, 0)
        || std::env::var("NCCL_MULTI_RANK_GPU_ENABLE").as_deref() != Ok("1")
    {
        eprintln!(
            "skipped: three ranks on one GPU need NCCL 2.30 and NCCL_MULTI_RANK_GPU_ENABLE=1"
        );
        return;
    }
    let ctx = context();
    let (_store, mut cpu) = cpu_group(3);
    let device = Device::from_cuda_context(ctx.clone());
    let mut gpus: Vec<_> = on_all(&cpu, |c| {
        GpuCommunicator::builder(c, &device)
            .timeout(Duration::from_secs(20))
            .build()
            .expect("init")
    });
    let stream = ctx.default_stream();
    let stuck: Vec<_> = gpus[..2]
        .iter()
        .map(|g| g.all_reduce(up(&stream, &[1.0f32; 4096]), ReduceOp::Sum))
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    drop(gpus.pop());
    drop(cpu.pop());
    for op in stuck {
        let err = op.wait().expect_err("the op waited for the lost rank");
        eprintln!("the stuck op: {err}");
    }
    let pairs: Vec<_> = cpu.iter().zip(gpus.iter()).collect();
    let outcomes = on_all(&pairs, |(c, g)| {
        let _ = c.all_reduce(vec![1u8; 4], ReduceOp::Sum).wait();
        let shrunk = c.shrink().wait().expect("CPU shrink");
        let started = std::time::Instant::now();
        let smaller = g.shrink(&shrunk).expect("GPU shrink");
        let took = started.elapsed();
        let stream = ctx.default_stream();
        let sum = smaller
            .all_reduce(up(&stream, &[(c.rank() + 1) as f32; 1000]), ReduceOp::Sum)
            .wait()
            .expect("an all-reduce of the two");
        (down(&stream, &sum), smaller.made_by_nccl_shrink(), took)
    });
    for (rank, (sum, native, took)) in outcomes.into_iter().enumerate() {
        eprintln!(
            "rank {rank}: made by ncclCommShrink: {native}; GpuCommunicator::shrink took {took:?}"
        );
        assert!(sum.iter().all(|&x| x == 3.0), "rank {rank}: {}", sum[0]);
    }
}
