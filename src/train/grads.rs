//! A bucket's memory: one typed vector, whichever float type the bucket
//! holds, and the collective in flight on it.

use crate::half::{bf16, f16};
use crate::{Communicator, DType, Element, PendingCollective, ReduceOp};

/// The element types gradients may have: f32, f64, f16 and bf16.
pub trait GradElement: Element + sealed::Sealed {
    #[doc(hidden)]
    fn view(grads: &Grads) -> Option<&[Self]>;
    #[doc(hidden)]
    fn view_mut(grads: &mut Grads) -> Option<&mut [Self]>;
}

mod sealed {
    #[allow(unnameable_types)]
    pub trait Sealed {}
}

/// A bucket's gradients.
#[doc(hidden)]
// Named only inside the crate: GradElement is sealed.
#[allow(unnameable_types)]
#[derive(Debug)]
pub enum Grads {
    F32(Vec<f32>),
    F64(Vec<f64>),
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
}

macro_rules! grad_element {
    ($t:ty, $variant:ident) => {
        impl sealed::Sealed for $t {}
        impl GradElement for $t {
            fn view(grads: &Grads) -> Option<&[Self]> {
                match grads {
                    Grads::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn view_mut(grads: &mut Grads) -> Option<&mut [Self]> {
                match grads {
                    Grads::$variant(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}

grad_element!(f32, F32);
grad_element!(f64, F64);
grad_element!(f16, F16);
grad_element!(bf16, Bf16);

/// Runs `$body` with `$v` bound to the typed vector of `$grads`.
macro_rules! with_grads {
    ($grads:expr, |$v:ident| $body:expr) => {
        match $grads {
            Grads::F32($v) => $body,
            Grads::F64($v) => $body,
            Grads::F16($v) => $body,
            Grads::Bf16($v) => $body,
        }
    };
}

impl Grads {
    /// Zeroed gradients of `len` elements of `dtype`; `None` for a type
    /// that is not a float.
    pub(crate) fn zeroed(dtype: DType, len: usize) -> Option<Grads> {
        Some(match dtype {
            DType::F32 => Grads::F32(vec![0.0; len]),
            DType::F64 => Grads::F64(vec![0.0; len]),
            DType::F16 => Grads::F16(vec![f16::ZERO; len]),
            DType::BF16 => Grads::Bf16(vec![bf16::ZERO; len]),
            _ => return None,
        })
    }

    pub(crate) fn len(&self) -> usize {
        with_grads!(self, |v| v.len())
    }

    /// Sets every element to zero.
    pub(crate) fn zero(&mut self) {
        with_grads!(self, |v| v.fill(Default::default()))
    }

    /// Sets elements `range` to zero.
    pub(crate) fn zero_range(&mut self, range: std::ops::Range<usize>) {
        with_grads!(self, |v| v[range].fill(Default::default()))
    }

    /// Copies `len` elements from `from` at `src` to `self` at `dst` (both
    /// of one type).
    pub(crate) fn copy_from(&mut self, dst: usize, from: &Grads, src: usize, len: usize) {
        match (self, from) {
            (Grads::F32(a), Grads::F32(b)) => a[dst..dst + len].copy_from_slice(&b[src..src + len]),
            (Grads::F64(a), Grads::F64(b)) => a[dst..dst + len].copy_from_slice(&b[src..src + len]),
            (Grads::F16(a), Grads::F16(b)) => a[dst..dst + len].copy_from_slice(&b[src..src + len]),
            (Grads::Bf16(a), Grads::Bf16(b)) => {
                a[dst..dst + len].copy_from_slice(&b[src..src + len])
            }
            _ => unreachable!("buckets of one parameter have one type"),
        }
    }

    /// Multiplies every element by `factor` (in f64 for f64, else f32).
    pub(crate) fn scale(&mut self, factor: f64) {
        match self {
            Grads::F32(v) => v.iter_mut().for_each(|x| *x *= factor as f32),
            Grads::F64(v) => v.iter_mut().for_each(|x| *x *= factor),
            Grads::F16(v) => v
                .iter_mut()
                .for_each(|x| *x = f16::from_f32(x.to_f32() * factor as f32)),
            Grads::Bf16(v) => v
                .iter_mut()
                .for_each(|x| *x = bf16::from_f32(x.to_f32() * factor as f32)),
        }
    }

    /// Starts an all-reduce of these gradients on `comm`.
    pub(crate) fn all_reduce(self, comm: &Communicator, op: ReduceOp) -> InFlight {
        match self {
            Grads::F32(v) => InFlight::F32(comm.all_reduce(v, op)),
            Grads::F64(v) => InFlight::F64(comm.all_reduce(v, op)),
            Grads::F16(v) => InFlight::F16(comm.all_reduce(v, op)),
            Grads::Bf16(v) => InFlight::Bf16(comm.all_reduce(v, op)),
        }
    }
}

/// An all-reduce in flight on a bucket's gradients.
pub(crate) enum InFlight {
    F32(PendingCollective<Vec<f32>>),
    F64(PendingCollective<Vec<f64>>),
    F16(PendingCollective<Vec<f16>>),
    Bf16(PendingCollective<Vec<bf16>>),
}

impl InFlight {
    /// Waits; the gradients back.
    pub(crate) fn wait(self) -> crate::Result<Grads> {
        Ok(match self {
            InFlight::F32(p) => Grads::F32(p.wait()?),
            InFlight::F64(p) => Grads::F64(p.wait()?),
            InFlight::F16(p) => Grads::F16(p.wait()?),
            InFlight::Bf16(p) => Grads::Bf16(p.wait()?),
        })
    }

    pub(crate) fn is_completed(&self) -> bool {
        match self {
            InFlight::F32(p) => p.is_completed(),
            InFlight::F64(p) => p.is_completed(),
            InFlight::F16(p) => p.is_completed(),
            InFlight::Bf16(p) => p.is_completed(),
        }
    }
}
