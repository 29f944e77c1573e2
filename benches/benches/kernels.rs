//! Reduction kernels per dtype and op in GB/s of input, beside a plain
//! memcpy of the same bytes; and frame-header encode/decode.
//!
//! `cargo bench -p ringwire-bench --bench kernels`

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use half::{bf16, f16};
use ringwire::wire::{Header, OpKind};
use ringwire::{DType, Element, ReduceOp};
use std::hint::black_box;

const BYTES: usize = 1 << 20;

fn kernel<T: Element>(c: &mut Criterion) {
    let n = BYTES / size_of::<T>();
    let incoming: Vec<T> = (0..n).map(|i| T::from_f64((i % 7) as f64 + 1.0)).collect();
    let mut acc: Vec<T> = (0..n).map(|i| T::from_f64((i % 5) as f64 + 1.0)).collect();
    let mut g = c.benchmark_group(format!("reduce_{}", T::DTYPE));
    g.throughput(Throughput::Bytes(BYTES as u64));
    for op in ReduceOp::ALL {
        g.bench_function(BenchmarkId::from_parameter(op), |b| {
            b.iter(|| T::reduce_into(black_box(&mut acc), black_box(&incoming), op))
        });
    }
    g.bench_function("memcpy", |b| {
        b.iter(|| black_box(&mut acc).copy_from_slice(black_box(&incoming)))
    });
    g.finish();
}

fn kernels(c: &mut Criterion) {
    kernel::<f32>(c);
    kernel::<f64>(c);
    kernel::<f16>(c);
    kernel::<bf16>(c);
    kernel::<i32>(c);
    kernel::<i64>(c);
    kernel::<u8>(c);
}

fn header(c: &mut Criterion) {
    let h = Header::data(7, 42, OpKind::AllReduce, DType::F32)
        .with_reduce_op(ReduceOp::Sum)
        .with_step(3, 9)
        .with_payload_len(1 << 20)
        .with_count(1 << 24);
    let bytes = h.encode();
    c.bench_function("header_encode", |b| {
        b.iter(|| black_box(black_box(&h).encode()))
    });
    c.bench_function("header_decode", |b| {
        b.iter(|| Header::decode(black_box(&bytes), 64 << 20))
    });
}

criterion_group!(benches, kernels, header);
criterion_main!(benches);
