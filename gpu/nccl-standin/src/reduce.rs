//! Element-wise reductions over byte buffers, in rank order: the result is
//! `((x0 op x1) op x2) ...`, so every rank computes the same bytes from the
//! same contributions. Integers wrap; `avg` divides the (wrapped) sum by
//! the rank count; f16 and bf16 are computed in f32 and rounded to nearest
//! once at the end.

use crate::codes::{DataType, RedOp};
use half::{bf16, f16};

/// How one element type loads, stores and combines.
trait Element: Copy {
    /// The type arithmetic happens in.
    type Acc: Accumulate;
    const SIZE: usize;
    fn load(bytes: &[u8]) -> Self::Acc;
    fn store(acc: Self::Acc, out: &mut Vec<u8>);
}

/// Arithmetic on an accumulator.
trait Accumulate: Copy {
    fn combine(self, other: Self, op: RedOp) -> Self;
    fn divide(self, nranks: usize) -> Self;
}

macro_rules! int_element {
    ($($t:ty),*) => {$(
        impl Accumulate for $t {
            fn combine(self, other: $t, op: RedOp) -> $t {
                match op {
                    RedOp::Sum | RedOp::Avg => self.wrapping_add(other),
                    RedOp::Prod => self.wrapping_mul(other),
                    RedOp::Max => self.max(other),
                    RedOp::Min => self.min(other),
                }
            }
            fn divide(self, nranks: usize) -> $t {
                // In i128 so that a rank count past the type's range still
                // divides; the quotient's magnitude is at most `self`'s.
                let n = i128::try_from(nranks.max(1)).unwrap_or(i128::MAX);
                <$t>::try_from(i128::from(self) / n).unwrap_or(self)
            }
        }
        impl Element for $t {
            type Acc = $t;
            const SIZE: usize = std::mem::size_of::<$t>();
            fn load(bytes: &[u8]) -> $t {
                <$t>::from_ne_bytes(bytes.try_into().unwrap_or_default())
            }
            fn store(acc: $t, out: &mut Vec<u8>) {
                out.extend_from_slice(&acc.to_ne_bytes());
            }
        }
    )*};
}
int_element!(i8, u8, i32, u32, i64, u64);

macro_rules! float_element {
    ($($t:ty),*) => {$(
        impl Accumulate for $t {
            fn combine(self, other: $t, op: RedOp) -> $t {
                match op {
                    RedOp::Sum | RedOp::Avg => self + other,
                    RedOp::Prod => self * other,
                    RedOp::Max => self.max(other),
                    RedOp::Min => self.min(other),
                }
            }
            fn divide(self, nranks: usize) -> $t {
                self / nranks.max(1) as $t
            }
        }
        impl Element for $t {
            type Acc = $t;
            const SIZE: usize = std::mem::size_of::<$t>();
            fn load(bytes: &[u8]) -> $t {
                <$t>::from_ne_bytes(bytes.try_into().unwrap_or_default())
            }
            fn store(acc: $t, out: &mut Vec<u8>) {
                out.extend_from_slice(&acc.to_ne_bytes());
            }
        }
    )*};
}
float_element!(f32, f64);

macro_rules! half_element {
    ($($t:ty),*) => {$(
        impl Element for $t {
            type Acc = f32;
            const SIZE: usize = 2;
            fn load(bytes: &[u8]) -> f32 {
                <$t>::from_bits(u16::from_ne_bytes(bytes.try_into().unwrap_or_default())).to_f32()
            }
            fn store(acc: f32, out: &mut Vec<u8>) {
                out.extend_from_slice(&<$t>::from_f32(acc).to_bits().to_ne_bytes());
            }
        }
    )*};
}
half_element!(f16, bf16);

/// Reduces `contributions` (rank order, equal lengths, whole elements of
/// `dtype`) with `op`; `nranks` divides for `avg`.
pub(crate) fn reduce(
    dtype: DataType,
    op: RedOp,
    contributions: &[&[u8]],
    nranks: usize,
) -> Vec<u8> {
    match dtype {
        DataType::Int8 => fold::<i8>(op, contributions, nranks),
        DataType::Uint8 => fold::<u8>(op, contributions, nranks),
        DataType::Int32 => fold::<i32>(op, contributions, nranks),
        DataType::Uint32 => fold::<u32>(op, contributions, nranks),
        DataType::Int64 => fold::<i64>(op, contributions, nranks),
        DataType::Uint64 => fold::<u64>(op, contributions, nranks),
        DataType::Float16 => fold::<f16>(op, contributions, nranks),
        DataType::Float32 => fold::<f32>(op, contributions, nranks),
        DataType::Float64 => fold::<f64>(op, contributions, nranks),
        DataType::Bfloat16 => fold::<bf16>(op, contributions, nranks),
    }
}

fn fold<E: Element>(op: RedOp, contributions: &[&[u8]], nranks: usize) -> Vec<u8> {
    let Some((first, rest)) = contributions.split_first() else {
        return Vec::new();
    };
    let mut out = Vec::with_capacity(first.len());
    for (i, element) in first.chunks_exact(E::SIZE).enumerate() {
        let at = i * E::SIZE..(i + 1) * E::SIZE;
        let mut acc = E::load(element);
        for other in rest {
            acc = acc.combine(E::load(&other[at.clone()]), op);
        }
        if op == RedOp::Avg {
            acc = acc.divide(nranks);
        }
        E::store(acc, &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn i8s(values: &[i8]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_ne_bytes()).collect()
    }

    #[test]
    fn integers_wrap_and_avg_divides_the_wrapped_sum() {
        let a = i8s(&[100, -7, 3]);
        let b = i8s(&[100, 2, -9]);
        let sum = reduce(DataType::Int8, RedOp::Sum, &[&a, &b], 2);
        assert_eq!(sum, i8s(&[-56, -5, -6]));
        let avg = reduce(DataType::Int8, RedOp::Avg, &[&a, &b], 2);
        assert_eq!(avg, i8s(&[-28, -2, -3]));
        let max = reduce(DataType::Int8, RedOp::Max, &[&a, &b], 2);
        assert_eq!(max, i8s(&[100, 2, 3]));
        let prod = reduce(DataType::Uint8, RedOp::Prod, &[&[16u8][..], &[17u8][..]], 2);
        assert_eq!(prod, vec![16u8.wrapping_mul(17)]);
    }

    #[test]
    fn halves_compute_in_f32_and_round_once() {
        let one = f16::ONE.to_bits().to_ne_bytes();
        let tiny = f16::from_f32(0.0004).to_bits().to_ne_bytes();
        // 1 + 0.0004 + 0.0004 is one f16 step above 1 when summed in f32,
        // but would stay 1.0 if rounded after each add.
        let sum = reduce(DataType::Float16, RedOp::Sum, &[&one, &tiny, &tiny], 3);
        let got = f16::from_bits(u16::from_ne_bytes([sum[0], sum[1]]));
        assert!(got > f16::ONE);
        assert_eq!(got, f16::from_f32(1.0008));
        let three = bf16::from_f32(3.0).to_bits().to_ne_bytes();
        let b_one = bf16::ONE.to_bits().to_ne_bytes();
        let avg = reduce(DataType::Bfloat16, RedOp::Avg, &[&three, &b_one], 2);
        assert_eq!(
            bf16::from_bits(u16::from_ne_bytes([avg[0], avg[1]])),
            bf16::from_f32(2.0)
        );
    }
}
