//! Every GPU op, dtype and reduce operator against an f64 reference, at 1
//! to 4 ranks, on the stand-in NCCL (host memory, one thread per rank,
//! real TCP between ranks): loaded through the production loader, with
//! non-blocking init and ops that finish later on a stream.

mod common;

use common::{cpu_group, gpu_group, on_all, seed};
use ringwire::testing::{Rng, check_close, random_data, reference_reduce};
use ringwire::{Element, ReduceOp};
use ringwire_gpu::{DeviceElement, GpuCommunicator, HostBuffer};
use std::time::Duration;

const LENGTHS: [usize; 4] = [0, 1, 7, 1000];
const TIMEOUT: Duration = Duration::from_secs(30);

fn inputs<T: Element>(rng: &mut Rng, world: usize, len: usize, op: ReduceOp) -> Vec<Vec<T>> {
    (0..world).map(|_| random_data::<T>(rng, len, op)).collect()
}

fn sweep_reductions<T: Element + DeviceElement>(gpus: &[GpuCommunicator], rng: &mut Rng) {
    let world = gpus.len();
    for op in ReduceOp::ALL {
        for len in LENGTHS {
            let data = inputs::<T>(rng, world, len, op);
            let reference = reference_reduce(&data, op);
            let what = format!("{} {op:?} of {len} at {world} ranks", T::NAME);

            let got = on_all(gpus, |g| {
                let buf = HostBuffer::new(data[g.rank()].clone());
                g.all_reduce(buf, op).wait().expect("all_reduce").into_vec()
            });
            for (rank, out) in got.iter().enumerate() {
                check_close(out, &reference, world)
                    .unwrap_or_else(|e| panic!("all_reduce {what}, rank {rank}: {e}"));
            }

            let root = len % world;
            let got = on_all(gpus, |g| {
                let buf = HostBuffer::new(data[g.rank()].clone());
                g.reduce(buf, op, root).wait().expect("reduce").into_vec()
            });
            check_close(&got[root], &reference, world)
                .unwrap_or_else(|e| panic!("reduce {what}: {e}"));
            for (rank, out) in got.iter().enumerate().filter(|(r, _)| *r != root) {
                assert_eq!(
                    out, &data[rank],
                    "reduce {what}: rank {rank}'s input changed"
                );
            }

            // Reduce-scatter: rank r gets block r of the reduction.
            let block = len;
            let long = inputs::<T>(rng, world, block * world, op);
            let long_ref = reference_reduce(&long, op);
            let got = on_all(gpus, |g| {
                let input = HostBuffer::new(long[g.rank()].clone());
                let output = HostBuffer::new(vec![T::from_f64(0.0); block]);
                g.reduce_scatter(input, output, op)
                    .wait()
                    .expect("reduce_scatter")
                    .1
                    .into_vec()
            });
            for (rank, out) in got.iter().enumerate() {
                check_close(out, &long_ref[rank * block..(rank + 1) * block], world)
                    .unwrap_or_else(|e| panic!("reduce_scatter {what}, rank {rank}: {e}"));
            }
        }
    }
}

fn sweep_moves<T: Element + DeviceElement + PartialEq + std::fmt::Debug>(
    gpus: &[GpuCommunicator],
    rng: &mut Rng,
) {
    let world = gpus.len();
    for len in LENGTHS {
        let data = inputs::<T>(rng, world, len, ReduceOp::Sum);
        let concat: Vec<T> = data.concat();
        let zeros = |n: usize| HostBuffer::new(vec![T::from_f64(0.0); n]);
        for root in 0..world {
            let got = on_all(gpus, |g| {
                g.broadcast(HostBuffer::new(data[g.rank()].clone()), root)
                    .wait()
                    .expect("broadcast")
                    .into_vec()
            });
            assert!(
                got.iter().all(|o| o == &data[root]),
                "broadcast of {len} {} from {root}",
                T::NAME
            );

            let got = on_all(gpus, |g| {
                let out = if g.rank() == root {
                    zeros(len * world)
                } else {
                    zeros(0)
                };
                g.gather(HostBuffer::new(data[g.rank()].clone()), out, root)
                    .wait()
                    .expect("gather")
                    .1
                    .into_vec()
            });
            assert_eq!(got[root], concat, "gather of {len} {} to {root}", T::NAME);

            let got = on_all(gpus, |g| {
                let input = if g.rank() == root {
                    HostBuffer::new(concat.clone())
                } else {
                    zeros(0)
                };
                g.scatter(input, zeros(len), root)
                    .wait()
                    .expect("scatter")
                    .1
                    .into_vec()
            });
            for (rank, out) in got.iter().enumerate() {
                assert_eq!(
                    out,
                    &data[rank],
                    "scatter of {len} {} from {root} to {rank}",
                    T::NAME
                );
            }
        }
        let got = on_all(gpus, |g| {
            g.all_gather(HostBuffer::new(data[g.rank()].clone()), zeros(len * world))
                .wait()
                .expect("all_gather")
                .1
                .into_vec()
        });
        assert!(
            got.iter().all(|o| o == &concat),
            "all_gather of {len} {}",
            T::NAME
        );

        // All-to-all: rank r's block p goes to rank p's block r.
        let blocks = inputs::<T>(rng, world, len * world, ReduceOp::Sum);
        let got = on_all(gpus, |g| {
            g.all_to_all(
                HostBuffer::new(blocks[g.rank()].clone()),
                zeros(len * world),
            )
            .wait()
            .expect("all_to_all")
            .1
            .into_vec()
        });
        for (rank, out) in got.iter().enumerate() {
            for (p, chunk) in
                out.chunks(len.max(1))
                    .enumerate()
                    .take(if len == 0 { 0 } else { world })
            {
                assert_eq!(
                    chunk,
                    &blocks[p][rank * len..(rank + 1) * len],
                    "all_to_all of {len} {}: rank {rank} block {p}",
                    T::NAME
                );
            }
        }

        // Send/recv around a ring.
        let got = on_all(gpus, |g| {
            let (me, next, prev) = (
                g.rank(),
                (g.rank() + 1) % world,
                (g.rank() + world - 1) % world,
            );
            let sent = g.send(HostBuffer::new(data[me].clone()), next);
            let got = g.recv(zeros(len), prev).wait().expect("recv").into_vec();
            sent.wait().expect("send");
            got
        });
        for (rank, out) in got.iter().enumerate() {
            assert_eq!(
                out,
                &data[(rank + world - 1) % world],
                "ring send/recv of {len} {}",
                T::NAME
            );
        }
    }
}

fn run_world(world: usize) {
    let mut rng = Rng::new(seed());
    let (_store, cpu) = cpu_group(world, TIMEOUT);
    let gpus = gpu_group(&cpu, TIMEOUT);
    macro_rules! every_dtype {
        ($($t:ty),*) => {$(
            sweep_reductions::<$t>(&gpus, &mut rng);
            sweep_moves::<$t>(&gpus, &mut rng);
        )*};
    }
    use ringwire::half::{bf16, f16};
    every_dtype!(f32, f64, f16, bf16, i32, i64, u8);
    on_all(&gpus, |g| g.barrier().wait().expect("barrier"));
}

#[test]
fn every_op_and_dtype_at_1_rank() {
    run_world(1);
}

#[test]
fn every_op_and_dtype_at_2_ranks() {
    run_world(2);
}

#[test]
fn every_op_and_dtype_at_3_ranks() {
    run_world(3);
}

#[test]
fn every_op_and_dtype_at_4_ranks() {
    run_world(4);
}

#[test]
fn a_group_of_100_tensors_is_one_launch_with_every_result_right() {
    let world = 3;
    let mut rng = Rng::new(seed());
    let (_store, cpu) = cpu_group(world, TIMEOUT);
    let gpus = gpu_group(&cpu, TIMEOUT);
    let tensors: Vec<Vec<Vec<f32>>> = (0..100)
        .map(|i| inputs::<f32>(&mut rng, world, 1 + i * 13 % 257, ReduceOp::Sum))
        .collect();
    let got = on_all(&gpus, |g| {
        let mut group = g.group();
        for t in &tensors {
            group.all_reduce(HostBuffer::new(t[g.rank()].clone()), ReduceOp::Sum);
        }
        group.launch().wait().expect("group")
    });
    for (rank, outs) in got.iter().enumerate() {
        assert_eq!(outs.len(), 100);
        for (i, out) in outs.iter().enumerate() {
            check_close(out, &reference_reduce(&tensors[i], ReduceOp::Sum), world)
                .unwrap_or_else(|e| panic!("tensor {i} on rank {rank}: {e}"));
        }
    }
}

#[test]
fn handles_complete_by_await_and_is_completed_and_stream_wait() {
    let world = 2;
    let (_store, cpu) = cpu_group(world, TIMEOUT);
    let gpus = gpu_group(&cpu, TIMEOUT);
    let got = on_all(&gpus, |g| {
        let a = futures::executor::block_on(
            g.all_reduce(HostBuffer::new(vec![1.0f64; 64]), ReduceOp::Sum),
        )
        .expect("await");
        let pending = g.all_reduce(HostBuffer::new(vec![2.0f64; 64]), ReduceOp::Sum);
        let deadline = std::time::Instant::now() + TIMEOUT;
        while !pending.is_completed() {
            assert!(
                std::time::Instant::now() < deadline,
                "is_completed never turned true"
            );
            std::thread::yield_now();
        }
        let b = pending.wait().expect("wait after is_completed");
        let stream = g.device().new_stream().expect("a stream");
        let c = g
            .all_reduce(HostBuffer::new(vec![3.0f64; 64]), ReduceOp::Sum)
            .stream_wait(&stream)
            .expect("stream_wait");
        // The stream now runs after the op: once it drains, the data is final.
        stream.synchronize().expect("synchronize");
        (a.into_vec(), b.into_vec(), c.into_vec())
    });
    for (a, b, c) in got {
        assert!(a.iter().all(|&x| x == 2.0), "{a:?}");
        assert!(b.iter().all(|&x| x == 4.0), "{b:?}");
        assert!(c.iter().all(|&x| x == 6.0), "{c:?}");
    }
}

#[test]
fn bad_arguments_are_refused_before_nccl_sees_them() {
    let (_store, cpu) = cpu_group(2, TIMEOUT);
    let gpus = gpu_group(&cpu, TIMEOUT);
    let g = &gpus[0];
    let err = g
        .broadcast(HostBuffer::new(vec![0f32; 4]), 2)
        .wait()
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("root 2 is not a rank of this communicator of 2"),
        "{err}"
    );
    let err = g
        .all_gather(
            HostBuffer::new(vec![0f32; 4]),
            HostBuffer::new(vec![0f32; 7]),
        )
        .wait()
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("output holds 7 elements; it must hold 8"),
        "{err}"
    );
    let err = g
        .all_to_all(
            HostBuffer::new(vec![0f32; 5]),
            HostBuffer::new(vec![0f32; 5]),
        )
        .wait()
        .unwrap_err();
    assert!(
        err.to_string().contains("do not split into 2 equal blocks"),
        "{err}"
    );
    // Host memory on a CUDA device is refused, not handed to NCCL.
    #[allow(unsafe_code)]
    // SAFETY: the address is never handed to NCCL: the memory check refuses it.
    let raw = unsafe {
        ringwire_gpu::RawDeviceSlice::<f32>::new(
            0x1000,
            4,
            ringwire_gpu::Memory::Cuda { ordinal: 0 },
        )
    };
    let err = g.all_reduce(raw, ReduceOp::Sum).wait().unwrap_err();
    assert!(
        err.to_string()
            .contains("cuda:0 memory, but this communicator's device uses host memory"),
        "{err}"
    );
    assert_eq!(err.kind(), "invalid_argument");
    // Nothing reached NCCL: the communicator still works on both ranks.
    let got = on_all(&gpus, |g| {
        g.all_reduce(HostBuffer::new(vec![1i32; 3]), ReduceOp::Sum)
            .wait()
            .expect("after refusals")
            .into_vec()
    });
    assert!(got.iter().all(|v| v == &[2, 2, 2]));
}

#[test]
fn split_gives_working_sub_communicators() {
    let world = 4;
    let (_store, cpu) = cpu_group(world, TIMEOUT);
    let gpus = gpu_group(&cpu, TIMEOUT);
    let got = on_all(&gpus, |g| {
        let sub = g
            .split(Some((g.rank() % 2) as u32), -(g.rank() as i64))
            .expect("split")
            .expect("a color");
        let out = sub
            .all_reduce(HostBuffer::new(vec![g.rank() as i64 + 1]), ReduceOp::Sum)
            .wait()
            .expect("sub all_reduce");
        (sub.rank(), sub.world_size(), out.into_vec()[0])
    });
    // Evens {0,2} sum 1+3, odds {1,3} sum 2+4; keys reverse the order.
    assert_eq!(got, vec![(1, 2, 4), (1, 2, 6), (0, 2, 4), (0, 2, 6)]);
}
