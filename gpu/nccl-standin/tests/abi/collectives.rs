//! Collectives against a simple reference, in and out of place.

use crate::common::run_ranks;
use half::{bf16, f16};
use ringwire_nccl_standin::codes::{DataType, RedOp, SUCCESS};

/// Rank `rank`'s element `i` as a small integer (some negative, so
/// unsigned types wrap).
fn value(rank: usize, i: usize) -> i64 {
    ((rank * 7 + i * 3) % 11) as i64 - 4
}

fn encode(dtype: DataType, v: i64) -> Vec<u8> {
    let x = v as f64 * 0.5;
    match dtype {
        DataType::Int8 => (v as i8).to_ne_bytes().to_vec(),
        DataType::Uint8 => (v as u8).to_ne_bytes().to_vec(),
        DataType::Int32 => (v as i32).to_ne_bytes().to_vec(),
        DataType::Uint32 => (v as u32).to_ne_bytes().to_vec(),
        DataType::Int64 => v.to_ne_bytes().to_vec(),
        DataType::Uint64 => (v as u64).to_ne_bytes().to_vec(),
        DataType::Float16 => f16::from_f64(x).to_bits().to_ne_bytes().to_vec(),
        DataType::Float32 => (x as f32).to_ne_bytes().to_vec(),
        DataType::Float64 => x.to_ne_bytes().to_vec(),
        DataType::Bfloat16 => bf16::from_f64(x).to_bits().to_ne_bytes().to_vec(),
    }
}

pub(crate) fn input(dtype: DataType, rank: usize, count: usize) -> Vec<u8> {
    (0..count)
        .flat_map(|i| encode(dtype, value(rank, i)))
        .collect()
}

macro_rules! int_ref {
    ($t:ty, $op:expr, $inputs:expr) => {{
        let n = $inputs.len();
        let decode = |b: &[u8]| -> Vec<$t> {
            b.chunks_exact(size_of::<$t>())
                .map(|c| <$t>::from_ne_bytes(c.try_into().unwrap()))
                .collect()
        };
        let all: Vec<Vec<$t>> = $inputs.iter().map(|b| decode(b)).collect();
        (0..all[0].len())
            .flat_map(|i| {
                let mut acc = all[0][i];
                for r in 1..n {
                    let x = all[r][i];
                    acc = match $op {
                        RedOp::Sum | RedOp::Avg => acc.wrapping_add(x),
                        RedOp::Prod => acc.wrapping_mul(x),
                        RedOp::Max => acc.max(x),
                        RedOp::Min => acc.min(x),
                    };
                }
                if $op == RedOp::Avg {
                    acc = (acc as i128 / n as i128) as $t;
                }
                acc.to_ne_bytes()
            })
            .collect::<Vec<u8>>()
    }};
}

/// Folds `load`ed values in the accumulator type `A`, rank by rank.
fn float_ref<A>(
    op: RedOp,
    inputs: &[Vec<u8>],
    size: usize,
    load: impl Fn(&[u8]) -> A,
    store: impl Fn(A) -> Vec<u8>,
    div: impl Fn(A, usize) -> A,
) -> Vec<u8>
where
    A: Copy + std::ops::Add<Output = A> + std::ops::Mul<Output = A> + PartialOrd,
{
    let count = inputs[0].len() / size;
    (0..count)
        .flat_map(|i| {
            let at = |r: usize| load(&inputs[r][i * size..(i + 1) * size]);
            let mut acc = at(0);
            for r in 1..inputs.len() {
                let x = at(r);
                acc = match op {
                    RedOp::Sum | RedOp::Avg => acc + x,
                    RedOp::Prod => acc * x,
                    RedOp::Max => {
                        if x > acc {
                            x
                        } else {
                            acc
                        }
                    }
                    RedOp::Min => {
                        if x < acc {
                            x
                        } else {
                            acc
                        }
                    }
                };
            }
            if op == RedOp::Avg {
                acc = div(acc, inputs.len());
            }
            store(acc)
        })
        .collect()
}

/// The reduction of `inputs` (rank order) as the spec defines it.
pub(crate) fn reference(dtype: DataType, op: RedOp, inputs: &[Vec<u8>]) -> Vec<u8> {
    let half = |b: &[u8]| u16::from_ne_bytes(b.try_into().unwrap());
    match dtype {
        DataType::Int8 => int_ref!(i8, op, inputs),
        DataType::Uint8 => int_ref!(u8, op, inputs),
        DataType::Int32 => int_ref!(i32, op, inputs),
        DataType::Uint32 => int_ref!(u32, op, inputs),
        DataType::Int64 => int_ref!(i64, op, inputs),
        DataType::Uint64 => int_ref!(u64, op, inputs),
        DataType::Float32 => float_ref(
            op,
            inputs,
            4,
            |b| f32::from_ne_bytes(b.try_into().unwrap()),
            |a| a.to_ne_bytes().to_vec(),
            |a, n| a / n as f32,
        ),
        DataType::Float64 => float_ref(
            op,
            inputs,
            8,
            |b| f64::from_ne_bytes(b.try_into().unwrap()),
            |a| a.to_ne_bytes().to_vec(),
            |a, n| a / n as f64,
        ),
        DataType::Float16 => float_ref(
            op,
            inputs,
            2,
            |b| f16::from_bits(half(b)).to_f32(),
            |a| f16::from_f32(a).to_bits().to_ne_bytes().to_vec(),
            |a, n| a / n as f32,
        ),
        DataType::Bfloat16 => float_ref(
            op,
            inputs,
            2,
            |b| bf16::from_bits(half(b)).to_f32(),
            |a| bf16::from_f32(a).to_bits().to_ne_bytes().to_vec(),
            |a, n| a / n as f32,
        ),
    }
}

const SENTINEL: u8 = 0xab;

#[test]
fn reference_agrees_with_hand_computed_values() {
    let ints: Vec<Vec<u8>> = [1i32, 2, 3]
        .iter()
        .map(|v| v.to_ne_bytes().to_vec())
        .collect();
    assert_eq!(
        reference(DataType::Int32, RedOp::Sum, &ints),
        6i32.to_ne_bytes()
    );
    assert_eq!(
        reference(DataType::Int32, RedOp::Avg, &ints),
        2i32.to_ne_bytes()
    );
    let bytes: Vec<Vec<u8>> = [200u8, 100].iter().map(|v| vec![*v]).collect();
    assert_eq!(reference(DataType::Uint8, RedOp::Sum, &bytes), vec![44]);
    assert_eq!(reference(DataType::Uint8, RedOp::Avg, &bytes), vec![22]);
}

#[test]
fn all_reduce_every_dtype_op_and_count() {
    const N: usize = 3;
    let failures = run_ranks(N, |r| {
        let mut failures = Vec::new();
        let mut in_place = false;
        for dtype in DataType::ALL {
            for op in RedOp::ALL {
                for count in [0usize, 1, 7, 1000] {
                    in_place = !in_place;
                    let len = count * dtype.size();
                    let mine = input(dtype, r.rank, count);
                    let mut mem = mine.clone();
                    let recv = if in_place { 0 } else { len };
                    if !in_place {
                        mem.resize(2 * len, SENTINEL);
                    }
                    let code = r.all_reduce(&mut mem, 0, recv, count, dtype, op);
                    let inputs: Vec<Vec<u8>> = (0..N).map(|q| input(dtype, q, count)).collect();
                    let want = if count == 0 {
                        Vec::new()
                    } else {
                        reference(dtype, op, &inputs)
                    };
                    let got = &mem[recv..recv + len];
                    if code != SUCCESS
                        || got != want.as_slice()
                        || mem[..len] != (if in_place { &want } else { &mine })[..]
                    {
                        failures.push(format!(
                            "{dtype:?} {op:?} count {count} in place {in_place}: code {code}"
                        ));
                    }
                }
            }
        }
        failures
    });
    assert!(failures.iter().all(Vec::is_empty), "{failures:#?}");
}

#[test]
fn broadcast_reduce_all_gather_reduce_scatter() {
    const N: usize = 4;
    let failures = run_ranks(N, |r| {
        let mut failures = Vec::new();
        let mut check = |what: &str, ok: bool| {
            if !ok {
                failures.push(format!("rank {}: {what}", r.rank));
            }
        };
        let size = |d: DataType, count: usize| d.size() * count;

        // Broadcast from rank 2, out of place then in place.
        let (dt, count, root) = (DataType::Int32, 5, 2);
        let len = size(dt, count);
        let root_data = input(dt, root, count);
        let mut mem = input(dt, r.rank, count);
        mem.resize(2 * len, SENTINEL);
        check(
            "broadcast code",
            r.broadcast(&mut mem, 0, len, count, dt, root) == SUCCESS,
        );
        check("broadcast out of place", mem[len..] == root_data[..]);
        let mut mem = input(dt, r.rank, count);
        check(
            "broadcast in place code",
            r.broadcast(&mut mem, 0, 0, count, dt, root) == SUCCESS,
        );
        check("broadcast in place", mem == root_data);

        // Reduce (sum of f32) to rank 1: only the root's buffer is written.
        let (dt, count, root) = (DataType::Float32, 6, 1);
        let len = size(dt, count);
        let inputs: Vec<Vec<u8>> = (0..N).map(|q| input(dt, q, count)).collect();
        let want = reference(dt, RedOp::Sum, &inputs);
        let mut mem = inputs[r.rank].clone();
        mem.resize(2 * len, SENTINEL);
        check(
            "reduce code",
            r.reduce(&mut mem, 0, len, count, dt, RedOp::Sum, root) == SUCCESS,
        );
        if r.rank == root {
            check("reduce on root", mem[len..] == want[..]);
        } else {
            check(
                "reduce leaves non-roots",
                mem[len..].iter().all(|b| *b == SENTINEL),
            );
        }
        let mut mem = inputs[r.rank].clone();
        check(
            "reduce in place code",
            r.reduce(&mut mem, 0, 0, count, dt, RedOp::Sum, root) == SUCCESS,
        );
        check(
            "reduce in place",
            mem == if r.rank == root {
                &want
            } else {
                &inputs[r.rank]
            }[..],
        );

        // All-gather of u64: rank q's block at q * count.
        let (dt, count) = (DataType::Uint64, 3);
        let len = size(dt, count);
        let want: Vec<u8> = (0..N).flat_map(|q| input(dt, q, count)).collect();
        let mut mem = input(dt, r.rank, count);
        mem.resize(len + N * len, SENTINEL);
        check(
            "all-gather code",
            r.all_gather(&mut mem, 0, len, count, dt) == SUCCESS,
        );
        check("all-gather out of place", mem[len..] == want[..]);
        let mut mem = vec![SENTINEL; N * len];
        mem[r.rank * len..(r.rank + 1) * len].copy_from_slice(&input(dt, r.rank, count));
        check(
            "all-gather in place code",
            r.all_gather(&mut mem, r.rank * len, 0, count, dt) == SUCCESS,
        );
        check("all-gather in place", mem == want);

        // Reduce-scatter (max of i64): rank q gets the max of blocks q.
        let (dt, count) = (DataType::Int64, 4);
        let len = size(dt, count);
        let sends: Vec<Vec<u8>> = (0..N).map(|q| input(dt, q + 10, N * count)).collect();
        let blocks: Vec<Vec<u8>> = sends
            .iter()
            .map(|s| s[r.rank * len..(r.rank + 1) * len].to_vec())
            .collect();
        let want = reference(dt, RedOp::Max, &blocks);
        let mut mem = sends[r.rank].clone();
        mem.resize(N * len + len, SENTINEL);
        check(
            "reduce-scatter code",
            r.reduce_scatter(&mut mem, 0, N * len, count, dt, RedOp::Max) == SUCCESS,
        );
        check("reduce-scatter out of place", mem[N * len..] == want[..]);
        let mut mem = sends[r.rank].clone();
        check(
            "reduce-scatter in place code",
            r.reduce_scatter(&mut mem, 0, r.rank * len, count, dt, RedOp::Max) == SUCCESS,
        );
        check(
            "reduce-scatter in place",
            mem[r.rank * len..(r.rank + 1) * len] == want[..],
        );
        failures
    });
    assert!(failures.iter().all(Vec::is_empty), "{failures:#?}");
}
