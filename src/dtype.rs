//! Element types and reduction operators, and the kernels that combine two
//! slices element by element.
//!
//! The kernels are plain loops over slices that the compiler vectorises; they
//! are the inner loop of every reducing collective, so they stay branch-free
//! per element (the operator is matched once per slice, not per element).
//!
//! Half-precision types (`f16`, `bf16`) are combined in `f32`: each element is
//! widened, combined and rounded once. A ring all-reduce therefore rounds once
//! per hop (p-1 times for p ranks) instead of accumulating rounding error inside
//! each addition, which keeps the result within about (p-1)/2 ulp of the exact
//! sum for well-scaled data. `Avg` sums in the same way and divides once at the
//! end (in `f32` for the half types, in `f64` for `f64`).

use half::{bf16, f16};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// The element type of a buffer, as carried in every frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DType {
    /// `f32`.
    F32 = 1,
    /// `f64`.
    F64 = 2,
    /// `half::f16`.
    F16 = 3,
    /// `half::bf16`.
    BF16 = 4,
    /// `i32`.
    I32 = 5,
    /// `i64`.
    I64 = 6,
    /// `u8`.
    U8 = 7,
}

impl DType {
    /// Every dtype, for tests and benchmarks that sweep them.
    pub const ALL: [DType; 7] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::I64,
        DType::U8,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::F16 | DType::BF16 => 2,
            DType::U8 => 1,
        }
    }

    /// The dtype for a wire byte, or `None` for an unknown one.
    pub const fn from_u8(byte: u8) -> Option<DType> {
        Some(match byte {
            1 => DType::F32,
            2 => DType::F64,
            3 => DType::F16,
            4 => DType::BF16,
            5 => DType::I32,
            6 => DType::I64,
            7 => DType::U8,
            _ => return None,
        })
    }

    /// Short lower-case name (`f32`, `bf16`, ...), as used in errors and CLIs.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
        }
    }

    /// Parses a name as printed by [`DType::name`] (also accepts `float`, `half`...).
    pub fn parse(name: &str) -> Option<DType> {
        Some(match name.to_ascii_lowercase().as_str() {
            "f32" | "float" | "float32" => DType::F32,
            "f64" | "double" | "float64" => DType::F64,
            "f16" | "half" | "float16" => DType::F16,
            "bf16" | "bfloat16" => DType::BF16,
            "i32" | "int" | "int32" => DType::I32,
            "i64" | "int64" => DType::I64,
            "u8" | "uint8" | "byte" => DType::U8,
            _ => return None,
        })
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How a reducing collective combines the ranks' elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReduceOp {
    /// The sum (integers wrap on overflow).
    Sum = 1,
    /// The product (integers wrap on overflow).
    Prod = 2,
    /// The smallest.
    Min = 3,
    /// The largest.
    Max = 4,
    /// Sum divided by the number of ranks (integer division for integer types).
    Avg = 5,
}

impl ReduceOp {
    /// Every operator, for tests and benchmarks that sweep them.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];

    /// The operator for a wire byte, or `None` for an unknown one.
    pub const fn from_u8(byte: u8) -> Option<ReduceOp> {
        Some(match byte {
            1 => ReduceOp::Sum,
            2 => ReduceOp::Prod,
            3 => ReduceOp::Min,
            4 => ReduceOp::Max,
            5 => ReduceOp::Avg,
            _ => return None,
        })
    }

    /// Short lower-case name (`sum`, `prod`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }

    /// Parses a name as printed by [`ReduceOp::name`].
    pub fn parse(name: &str) -> Option<ReduceOp> {
        Some(match name.to_ascii_lowercase().as_str() {
            "sum" => ReduceOp::Sum,
            "prod" | "product" => ReduceOp::Prod,
            "min" => ReduceOp::Min,
            "max" => ReduceOp::Max,
            "avg" | "mean" => ReduceOp::Avg,
            _ => return None,
        })
    }
}

impl std::fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    #[allow(unnameable_types)]
    pub trait Sealed {}
}

/// A type ringwire can move and reduce: `f32`, `f64`, `f16`, `bf16`, `i32`,
/// `i64`, `u8`. Sealed: the wire format names each one.
pub trait Element:
    sealed::Sealed
    + Copy
    + Send
    + Sync
    + PartialEq
    + std::fmt::Debug
    + Default
    + FromBytes
    + IntoBytes
    + Immutable
    + KnownLayout
    + 'static
{
    /// The wire tag of this type.
    const DTYPE: DType;

    /// `acc[i] = op(acc[i], incoming[i])` for every i. `Avg` combines as `Sum`;
    /// [`Element::finish_avg`] divides at the end.
    fn reduce_into(acc: &mut [Self], incoming: &[Self], op: ReduceOp);

    /// `dst[i] = op(source[i], incoming[i])` for every i: what copying
    /// `source` into `dst` and then [`Element::reduce_into`] give, bit for
    /// bit. Native types do it in one pass, so a reduce-scatter that
    /// combines its read-only input with what arrives writes its slot once
    /// instead of copying the input there first.
    fn combine_into(dst: &mut [Self], source: &[Self], incoming: &[Self], op: ReduceOp) {
        dst.copy_from_slice(source);
        Self::reduce_into(dst, incoming, op);
    }

    /// Divides every element by `ranks` (the last step of `Avg`).
    fn finish_avg(values: &mut [Self], ranks: usize);

    /// Converts to f64, for references in tests and checks in the harness.
    fn to_f64(self) -> f64;

    /// Converts from f64 (saturating / rounding as `as` does).
    fn from_f64(value: f64) -> Self;
}

/// Applies `f` pairwise; the closure is monomorphised per operator so the
/// loop has no per-element branch.
#[inline(always)]
fn zip_apply<T: Copy>(acc: &mut [T], incoming: &[T], f: impl Fn(T, T) -> T) {
    assert_eq!(acc.len(), incoming.len(), "reduce_into: length mismatch");
    for (a, b) in acc.iter_mut().zip(incoming) {
        *a = f(*a, *b);
    }
}

/// `dst[i] = f(a[i], b[i])`, monomorphised per operator as [`zip_apply`].
#[inline(always)]
fn zip3_apply<T: Copy>(dst: &mut [T], a: &[T], b: &[T], f: impl Fn(T, T) -> T) {
    assert!(
        dst.len() == a.len() && a.len() == b.len(),
        "combine_into: length mismatch"
    );
    for ((d, x), y) in dst.iter_mut().zip(a).zip(b) {
        *d = f(*x, *y);
    }
}

macro_rules! native_element {
    ($t:ty, $dtype:expr, $sum:expr, $prod:expr, $min:expr, $max:expr, $div:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = $dtype;

            fn reduce_into(acc: &mut [Self], incoming: &[Self], op: ReduceOp) {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => zip_apply(acc, incoming, $sum),
                    ReduceOp::Prod => zip_apply(acc, incoming, $prod),
                    ReduceOp::Min => zip_apply(acc, incoming, $min),
                    ReduceOp::Max => zip_apply(acc, incoming, $max),
                }
            }

            fn combine_into(dst: &mut [Self], source: &[Self], incoming: &[Self], op: ReduceOp) {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => zip3_apply(dst, source, incoming, $sum),
                    ReduceOp::Prod => zip3_apply(dst, source, incoming, $prod),
                    ReduceOp::Min => zip3_apply(dst, source, incoming, $min),
                    ReduceOp::Max => zip3_apply(dst, source, incoming, $max),
                }
            }

            fn finish_avg(values: &mut [Self], ranks: usize) {
                // One rank: the average is the value (x / 1 is exact).
                if ranks == 1 {
                    return;
                }
                let div = $div;
                for v in values {
                    *v = div(*v, ranks);
                }
            }

            fn to_f64(self) -> f64 {
                self as f64
            }

            fn from_f64(value: f64) -> Self {
                value as $t
            }
        }
    };
}

native_element!(
    f32,
    DType::F32,
    |a: f32, b: f32| a + b,
    |a: f32, b: f32| a * b,
    |a: f32, b: f32| a.min(b),
    |a: f32, b: f32| a.max(b),
    |v: f32, n: usize| (v as f64 / n as f64) as f32
);
native_element!(
    f64,
    DType::F64,
    |a: f64, b: f64| a + b,
    |a: f64, b: f64| a * b,
    |a: f64, b: f64| a.min(b),
    |a: f64, b: f64| a.max(b),
    |v: f64, n: usize| v / n as f64
);
// Integers wrap on overflow, as NCCL and MPI do; they never panic.
native_element!(
    i32,
    DType::I32,
    |a: i32, b: i32| a.wrapping_add(b),
    |a: i32, b: i32| a.wrapping_mul(b),
    |a: i32, b: i32| a.min(b),
    |a: i32, b: i32| a.max(b),
    |v: i32, n: usize| v / n as i32
);
native_element!(
    i64,
    DType::I64,
    |a: i64, b: i64| a.wrapping_add(b),
    |a: i64, b: i64| a.wrapping_mul(b),
    |a: i64, b: i64| a.min(b),
    |a: i64, b: i64| a.max(b),
    |v: i64, n: usize| v / n as i64
);
native_element!(
    u8,
    DType::U8,
    |a: u8, b: u8| a.wrapping_add(b),
    |a: u8, b: u8| a.wrapping_mul(b),
    |a: u8, b: u8| a.min(b),
    |a: u8, b: u8| a.max(b),
    |v: u8, n: usize| (v as usize / n) as u8
);

macro_rules! half_element {
    ($t:ty, $dtype:expr, $reduce:ident, $combine:ident) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = $dtype;

            fn reduce_into(acc: &mut [Self], incoming: &[Self], op: ReduceOp) {
                $reduce(acc, incoming, op);
            }

            fn combine_into(dst: &mut [Self], source: &[Self], incoming: &[Self], op: ReduceOp) {
                $combine(dst, source, incoming, op);
            }

            fn finish_avg(values: &mut [Self], ranks: usize) {
                if ranks == 1 {
                    return;
                }
                let ranks = ranks as f32;
                for v in values {
                    *v = <$t>::from_f32(v.to_f32() / ranks);
                }
            }

            fn to_f64(self) -> f64 {
                self.to_f64()
            }

            fn from_f64(value: f64) -> Self {
                <$t>::from_f64(value)
            }
        }
    };
}

half_element!(f16, DType::F16, f16_reduce, f16_combine);
half_element!(bf16, DType::BF16, bf16_reduce, bf16_combine);

/// bf16 widen and round-to-nearest-even narrow, inline per element so the
/// kernels below vectorise.
#[inline(always)]
fn bf16_widen(x: bf16) -> f32 {
    f32::from_bits(u32::from(x.to_bits()) << 16)
}

#[inline(always)]
fn bf16_narrow(x: f32) -> bf16 {
    let bits = x.to_bits();
    let rounded = (bits.wrapping_add(0x7FFF + ((bits >> 16) & 1)) >> 16) as u16;
    let quiet_nan = ((bits >> 16) as u16) | 0x0040;
    let is_nan = (bits & 0x7FFF_FFFF) > 0x7F80_0000;
    bf16::from_bits(if is_nan { quiet_nan } else { rounded })
}

/// f16 to f32 with integer and float operations only, so loops of it
/// vectorise (after F. Giesen's `half_to_float`): the same bits as `half`'s
/// conversion, NaN payloads included (checked over all 65536 values).
#[inline(always)]
fn f16_widen(h: f16) -> f32 {
    let h = u32::from(h.to_bits());
    let shifted = (h & 0x7fff) << 13;
    let exponent = shifted & 0x0f80_0000;
    let normal = shifted + ((127 - 15) << 23);
    // Infinities and NaNs (quieted, as F16C does).
    let quiet = if shifted & 0x007f_ffff != 0 {
        0x0040_0000
    } else {
        0
    };
    let special = (normal + ((128 - 16) << 23)) | quiet;
    // Zeros and subnormals: scale by float arithmetic, which normalises.
    let small = (f32::from_bits(normal + (1 << 23)) - f32::from_bits(113 << 23)).to_bits();
    let magnitude = if exponent == 0x0f80_0000 {
        special
    } else if exponent == 0 {
        small
    } else {
        normal
    };
    f32::from_bits(magnitude | ((h & 0x8000) << 16))
}

/// f32 to f16, rounding to nearest even, in the same style (after Giesen's
/// `float_to_half_fast3_rtne`): `half::f16::from_f32`'s bits, NaN payloads
/// aside (checked on 45 million values around every f16 and its midpoints).
#[inline(always)]
fn f16_narrow(f: f32) -> f16 {
    const OVERFLOW: u32 = (127 + 16) << 23; // 65536.0 and up round to infinity
    const DENORMAL_MAGIC: u32 = ((127 - 15) + (23 - 10) + 1) << 23;
    let bits = f.to_bits();
    let sign = bits & 0x8000_0000;
    let x = bits ^ sign;
    let special = if x > 0x7f80_0000 {
        0x7e00 | ((x >> 13) & 0x3ff)
    } else {
        0x7c00
    };
    // Below the smallest normal f16: an add rounds the mantissa into place.
    let small = (f32::from_bits(x) + f32::from_bits(DENORMAL_MAGIC))
        .to_bits()
        .wrapping_sub(DENORMAL_MAGIC);
    let odd = (x >> 13) & 1;
    let normal = x
        .wrapping_add((15u32.wrapping_sub(127) << 23).wrapping_add(0xfff))
        .wrapping_add(odd)
        >> 13;
    let magnitude = if x >= OVERFLOW {
        special
    } else if x < (113 << 23) {
        small
    } else {
        normal
    };
    f16::from_bits((magnitude | (sign >> 16)) as u16)
}

/// Binds `$g` to the f32 combiner of `$op` and evaluates `$body`, once per
/// operator, so each gets its own inlined loop.
macro_rules! per_f32_op {
    ($op:expr, |$g:ident| $body:expr) => {
        match $op {
            ReduceOp::Sum | ReduceOp::Avg => {
                let $g = |x: f32, y: f32| x + y;
                $body
            }
            ReduceOp::Prod => {
                let $g = |x: f32, y: f32| x * y;
                $body
            }
            ReduceOp::Min => {
                let $g = f32::min;
                $body
            }
            ReduceOp::Max => {
                let $g = f32::max;
                $body
            }
        }
    };
}

/// A half type's reduce and combine kernels: widen each element, combine
/// in f32, round once, in one pass (a block path that converted 512 at a
/// time was slower for both types). Unlike f32's, which streams memory,
/// these loops are bound by their arithmetic, so they are also compiled
/// for AVX2 and AVX-512 and picked at run time.
macro_rules! half_kernels {
    ($t:ty, $widen:ident, $narrow:ident, $reduce:ident, $combine:ident) => {
        #[multiversion::multiversion(targets("x86_64+avx512f+avx512bw", "x86_64+avx2"))]
        fn $reduce(acc: &mut [$t], incoming: &[$t], op: ReduceOp) {
            per_f32_op!(op, |g| zip_apply(acc, incoming, |a, b| {
                $narrow(g($widen(a), $widen(b)))
            }))
        }

        /// `dst = source ⊕ incoming`, as the reduce above.
        #[multiversion::multiversion(targets("x86_64+avx512f+avx512bw", "x86_64+avx2"))]
        fn $combine(dst: &mut [$t], source: &[$t], incoming: &[$t], op: ReduceOp) {
            per_f32_op!(op, |g| zip3_apply(dst, source, incoming, |a, b| {
                $narrow(g($widen(a), $widen(b)))
            }))
        }
    };
}

half_kernels!(bf16, bf16_widen, bf16_narrow, bf16_reduce, bf16_combine);
half_kernels!(f16, f16_widen, f16_narrow, f16_reduce, f16_combine);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_bytes_round_trip() {
        for dtype in DType::ALL {
            assert_eq!(DType::from_u8(dtype as u8), Some(dtype));
            assert_eq!(DType::parse(dtype.name()), Some(dtype));
        }
        for op in ReduceOp::ALL {
            assert_eq!(ReduceOp::from_u8(op as u8), Some(op));
            assert_eq!(ReduceOp::parse(op.name()), Some(op));
        }
        assert_eq!(DType::from_u8(0), None);
        assert_eq!(ReduceOp::from_u8(200), None);
    }

    #[test]
    fn kernels_combine_elementwise() {
        let mut acc = vec![1.0f32, 5.0, -2.0];
        f32::reduce_into(&mut acc, &[2.0, 3.0, -4.0], ReduceOp::Sum);
        assert_eq!(acc, [3.0, 8.0, -6.0]);
        f32::reduce_into(&mut acc, &[2.0, 3.0, -4.0], ReduceOp::Min);
        assert_eq!(acc, [2.0, 3.0, -6.0]);
        let mut ints = vec![i32::MAX, 7];
        i32::reduce_into(&mut ints, &[1, 3], ReduceOp::Sum);
        assert_eq!(ints, [i32::MIN, 10]);
        i32::finish_avg(&mut ints, 2);
        assert_eq!(ints, [i32::MIN / 2, 5]);
    }

    /// The bit-level f16 conversions give `half`'s bits: every f16 widens
    /// the same, and f32 values on a stride through all bit patterns and
    /// around every f16 and rounding midpoint narrow the same (NaNs: both
    /// NaN).
    #[test]
    fn f16_conversions_match_half() {
        for h in 0..=u16::MAX {
            let h = f16::from_bits(h);
            let (want, got) = (h.to_f32(), f16_widen(h));
            assert!(
                want.to_bits() == got.to_bits() || (want.is_nan() && got.is_nan()),
                "widen {:#06x}: {want:?} against {got:?}",
                h.to_bits()
            );
        }
        let check = |x: f32| {
            let (want, got) = (f16::from_f32(x), f16_narrow(x));
            assert!(
                want.to_bits() == got.to_bits() || (want.is_nan() && got.is_nan()),
                "narrow {x:e} ({:#x}): {:#06x} against {:#06x}",
                x.to_bits(),
                want.to_bits(),
                got.to_bits()
            );
        };
        for bits in (0..=u32::MAX).step_by(9973) {
            check(f32::from_bits(bits));
        }
        for h in 0..=u16::MAX {
            let v = f16::from_bits(h).to_f32().to_bits();
            for d in [-4097i64, -4096, -4095, -1, 0, 1, 4095, 4096, 4097] {
                check(f32::from_bits((i64::from(v) + d) as u32));
            }
        }
    }

    /// Element by element the same bits, except that a NaN may carry either
    /// input's payload (which one the hardware keeps depends on operand
    /// order, which the compiler may swap in a commutative add).
    fn assert_same<T: Element>(got: &[T], want: &[T], what: &str) {
        assert_eq!(got.len(), want.len(), "{what}");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            let same = g.as_bytes() == w.as_bytes() || (g.to_f64().is_nan() && w.to_f64().is_nan());
            assert!(same, "{what}: element {i}: {g:?} against {w:?}");
        }
    }

    /// `combine_into` gives what a copy and `reduce_into` give, bit for
    /// bit but for NaN payloads, for every type and operator (NaNs, signed
    /// zeros and overflow among the values).
    #[test]
    fn combine_into_equals_copy_then_reduce() {
        fn check<T: Element>(rng: &mut crate::testing::Rng) {
            for op in ReduceOp::ALL {
                for len in [0, 1, 7, 1000] {
                    let source: Vec<T> = crate::testing::random_data(rng, len, op);
                    let mut incoming: Vec<T> = crate::testing::random_data(rng, len, op);
                    if len > 3 {
                        incoming[0] = T::from_f64(f64::NAN);
                        incoming[1] = T::from_f64(-0.0);
                        incoming[2] = T::from_f64(1e300);
                    }
                    let mut want = source.clone();
                    T::reduce_into(&mut want, &incoming, op);
                    let mut got = vec![T::default(); len];
                    T::combine_into(&mut got, &source, &incoming, op);
                    assert_same(&got, &want, &format!("{} {op} n={len}", T::DTYPE));
                }
            }
        }
        let mut rng = crate::testing::Rng::new(crate::testing::Rng::fresh_seed());
        check::<f32>(&mut rng);
        check::<f64>(&mut rng);
        check::<f16>(&mut rng);
        check::<bf16>(&mut rng);
        check::<i32>(&mut rng);
        check::<i64>(&mut rng);
        check::<u8>(&mut rng);
    }

    #[test]
    fn bf16_conversion_matches_half() {
        let values: Vec<f32> = (0..5000)
            .map(|i| f32::from_bits((i as u32).wrapping_mul(2_654_435_761)))
            .chain([
                0.0,
                -0.0,
                f32::INFINITY,
                f32::NEG_INFINITY,
                f32::NAN,
                1.0 + f32::EPSILON,
            ])
            .collect();
        for v in &values {
            let (ours, theirs) = (bf16_narrow(*v), bf16::from_f32(*v));
            if v.is_nan() {
                assert!(ours.is_nan());
            } else {
                assert_eq!(ours.to_bits(), theirs.to_bits(), "{v:e}");
            }
            let back = bf16_widen(ours);
            assert!(ours.to_f32() == back || back.is_nan());
        }
    }

    #[test]
    fn half_types_round_once_in_f32() {
        // 2048 + 1 is not representable in f16 (spacing 2 there); combined in
        // f32 and rounded once it rounds to even (2048), but 2048 + 3 -> 2052.
        let mut acc = vec![f16::from_f32(2048.0), f16::from_f32(2048.0)];
        f16::reduce_into(
            &mut acc,
            &[f16::from_f32(1.0), f16::from_f32(3.0)],
            ReduceOp::Sum,
        );
        assert_eq!(acc[0].to_f32(), 2048.0);
        assert_eq!(acc[1].to_f32(), 2052.0);
        let mut b = vec![bf16::from_f32(3.0)];
        bf16::reduce_into(&mut b, &[bf16::from_f32(5.0)], ReduceOp::Max);
        assert_eq!(b[0].to_f32(), 5.0);
    }
}
