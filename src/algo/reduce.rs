//! Reduce to one root over a binomial tree (the mirror of the broadcast tree):
//! each rank combines its children's partial results into its own and passes
//! the sum to its parent, chunk by chunk so the levels overlap.

use super::{Action, Step, chunks};

/// Binomial-tree reduce of `len` elements to `root`. Work buffer: a scratch
/// copy of the input on every rank (the root's holds the result afterwards).
pub fn reduce_tree(rank: usize, world: usize, root: usize, len: usize, chunk: usize) -> Vec<Step> {
    let mut out = Vec::new();
    if world <= 1 {
        return out;
    }
    let vr = (rank + world - root) % world;
    let real = |v: usize| (v + root) % world;
    let mut children = Vec::new();
    let mut parent = None;
    let mut mask = 1;
    while mask < world {
        if vr & mask == 0 {
            if vr | mask < world {
                children.push(real(vr | mask));
            }
        } else {
            parent = Some(real(vr & !mask));
            break;
        }
        mask <<= 1;
    }
    for (c, r) in chunks(0..len, chunk).enumerate() {
        for &child in &children {
            out.push(Step::Recv {
                peer: child,
                range: r.clone(),
                step: 0,
                chunk: c as u32,
                action: Action::Reduce,
            });
        }
        if let Some(p) = parent {
            out.push(Step::Send {
                peer: p,
                range: r,
                step: 0,
                chunk: c as u32,
            });
        }
    }
    out
}
