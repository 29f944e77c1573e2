//! A model's parameters as the reducer sees them: names, lengths and types
//! in definition order, and how they are cut into buckets.
//!
//! The bucket rule is PyTorch DDP's: parameters are taken in the order their
//! gradients are expected to be ready (the reverse of definition order, at
//! first), one dtype per bucket, a parameter never split, a bucket closed
//! once it reaches its cap (so it may overshoot by one parameter); the
//! bucket holding the gradients ready *last* (the first-defined parameters)
//! is capped at the small first-bucket size, so the tail left after
//! backward is short.

use crate::DType;
use std::fmt;

/// One parameter: its name, element count and element type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Param {
    /// Its name (`layer1.weight`), as the tensor library calls it.
    pub name: String,
    /// Elements.
    pub len: usize,
    /// Element type.
    pub dtype: DType,
}

/// A parameter's index in its [`Layout`] (definition order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ParamId(pub usize);

/// A model's parameters in definition order (the order every rank must
/// register them in; the reducer checks it across ranks).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    params: Vec<Param>,
}

impl Layout {
    /// An empty layout.
    pub fn new() -> Layout {
        Layout::default()
    }

    /// Adds a parameter after the others; its id.
    pub fn push(&mut self, name: impl Into<String>, len: usize, dtype: DType) -> ParamId {
        self.params.push(Param {
            name: name.into(),
            len,
            dtype,
        });
        ParamId(self.params.len() - 1)
    }

    /// The parameter `id`.
    pub fn param(&self, id: ParamId) -> &Param {
        &self.params[id.0]
    }

    /// The id of the parameter named `name`.
    pub fn id(&self, name: &str) -> Option<ParamId> {
        self.params.iter().position(|p| p.name == name).map(ParamId)
    }

    /// How many parameters.
    pub fn len(&self) -> usize {
        self.params.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.params.is_empty()
    }

    /// The parameters with their ids, in definition order.
    pub fn iter(&self) -> impl Iterator<Item = (ParamId, &Param)> {
        self.params.iter().enumerate().map(|(i, p)| (ParamId(i), p))
    }

    /// Elements of type `dtype` in all.
    pub fn elements_of(&self, dtype: DType) -> usize {
        self.params
            .iter()
            .filter(|p| p.dtype == dtype)
            .map(|p| p.len)
            .sum()
    }

    /// What identifies each parameter across ranks: a hash of its name, its
    /// length, its type and its name's length (four words each).
    pub(crate) fn fingerprints(&self) -> Vec<u64> {
        self.params
            .iter()
            .flat_map(|p| {
                [
                    fnv1a(p.name.as_bytes()),
                    p.len as u64,
                    p.dtype as u64,
                    p.name.len() as u64,
                ]
            })
            .collect()
    }
}

impl fmt::Display for Param {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} ({} x {})", self.name, self.len, self.dtype.name())
    }
}

/// FNV-1a, 64-bit: a stable hash every rank computes alike.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Bucket caps, in bytes: the bucket of the gradients ready last, and the
/// others (PyTorch's defaults: 1 MiB and 25 MiB).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    /// The cap of the bucket that holds the gradients ready last (the
    /// first-defined parameters), reduced at the end of backward.
    pub first: usize,
    /// The cap of every other bucket.
    pub rest: usize,
}

/// Cuts `ready_order` (every parameter once, in the order its gradient is
/// expected to be ready) into buckets, returned in launch order, each
/// holding its parameters in ready order. See the module docs for the rule.
pub(crate) fn assign_buckets(
    layout: &Layout,
    ready_order: &[ParamId],
    caps: Caps,
) -> Vec<Vec<ParamId>> {
    // Walked from the last-ready end, so the first bucket closed (at the
    // small cap) holds the gradients ready last; open buckets per dtype.
    let mut closed: Vec<Vec<ParamId>> = Vec::new();
    let mut open: Vec<(DType, Vec<ParamId>, usize)> = Vec::new();
    for &id in ready_order.iter().rev() {
        let p = layout.param(id);
        let i = match open.iter().position(|(d, _, _)| *d == p.dtype) {
            Some(i) => i,
            None => {
                open.push((p.dtype, Vec::new(), 0));
                open.len() - 1
            }
        };
        let (_, ids, bytes) = &mut open[i];
        ids.push(id);
        *bytes += p.len * p.dtype.size();
        let cap = if closed.is_empty() {
            caps.first
        } else {
            caps.rest
        };
        if *bytes >= cap {
            let (_, ids, _) = open.remove(i);
            closed.push(ids);
        }
    }
    // Leftovers, oldest (closest to the last-ready end) first.
    closed.extend(open.into_iter().map(|(_, ids, _)| ids));
    // Into launch order: the bucket of the gradients ready first first,
    // each in ready order.
    closed.reverse();
    for bucket in &mut closed {
        bucket.reverse();
    }
    closed
}

/// The order gradients are expected to be ready before anything was
/// observed: backward runs the layers last to first.
pub(crate) fn reverse_definition_order(layout: &Layout) -> Vec<ParamId> {
    (0..layout.len()).rev().map(ParamId).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(params: &[(usize, DType)]) -> Layout {
        let mut l = Layout::new();
        for (i, &(len, dtype)) in params.iter().enumerate() {
            l.push(format!("p{i}"), len, dtype);
        }
        l
    }

    fn ids(buckets: &[Vec<ParamId>]) -> Vec<Vec<usize>> {
        buckets
            .iter()
            .map(|b| b.iter().map(|p| p.0).collect())
            .collect()
    }

    const KIB: usize = 1 << 10;

    #[test]
    fn buckets_follow_ddps_rule() {
        // Six f32 parameters of 1 KiB each; caps: 2 KiB for the bucket of
        // the first-defined parameters, 3 KiB for the others.
        let l = layout(&[(256, DType::F32); 6]);
        let caps = Caps {
            first: 2 * KIB,
            rest: 3 * KIB,
        };
        let got = assign_buckets(&l, &reverse_definition_order(&l), caps);
        // Launch order: the last-defined first; p0 and p1 (ready last) in
        // the small bucket, which launches last.
        assert_eq!(ids(&got), vec![vec![5], vec![4, 3, 2], vec![1, 0]]);
    }

    #[test]
    fn a_bucket_overshoots_by_one_parameter_and_never_splits_one() {
        let l = layout(&[(100, DType::F32), (10_000, DType::F32), (100, DType::F32)]);
        let caps = Caps {
            first: 1,
            rest: 1000,
        };
        let got = assign_buckets(&l, &reverse_definition_order(&l), caps);
        assert_eq!(ids(&got), vec![vec![2], vec![1], vec![0]]);
        let every: usize = got.iter().map(Vec::len).sum();
        assert_eq!(every, 3);
    }

    #[test]
    fn each_bucket_holds_one_dtype() {
        let l = layout(&[
            (10, DType::F32),
            (10, DType::F64),
            (10, DType::F32),
            (10, DType::BF16),
            (10, DType::F64),
        ]);
        let caps = Caps {
            first: 1 << 20,
            rest: 1 << 20,
        };
        let got = assign_buckets(&l, &reverse_definition_order(&l), caps);
        for bucket in &got {
            let dtypes: Vec<DType> = bucket.iter().map(|&p| l.param(p).dtype).collect();
            assert!(dtypes.windows(2).all(|w| w[0] == w[1]), "{dtypes:?}");
        }
        let mut all: Vec<usize> = got.iter().flatten().map(|p| p.0).collect();
        all.sort_unstable();
        assert_eq!(all, [0, 1, 2, 3, 4]);
    }

    #[test]
    fn an_observed_order_rebuilds_the_buckets() {
        let l = layout(&[(256, DType::F32); 4]);
        let caps = Caps {
            first: KIB,
            rest: 2 * KIB,
        };
        // Backward produced p1, p3, p0, p2 in that order.
        let observed = [ParamId(1), ParamId(3), ParamId(0), ParamId(2)];
        let got = assign_buckets(&l, &observed, caps);
        assert_eq!(ids(&got), vec![vec![1], vec![3, 0], vec![2]]);
    }

    #[test]
    fn fingerprints_tell_names_lengths_and_types_apart() {
        let a = layout(&[(10, DType::F32)]).fingerprints();
        let mut b = Layout::new();
        b.push("p0", 10, DType::F64);
        assert_ne!(a, b.fingerprints());
        let mut c = Layout::new();
        c.push("q0", 10, DType::F32);
        assert_ne!(a, c.fingerprints());
        assert_eq!(a, layout(&[(10, DType::F32)]).fingerprints());
    }
}
