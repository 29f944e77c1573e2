//! Reduce to one root over a binomial tree (the mirror of the broadcast tree):
//! each rank combines its children's partial results into its own and passes
//! the sum to its parent, chunk by chunk so the levels overlap.

use super::{Action, Step, chunks};

/// Binomial-tree reduce of `len` elements to `root`. Work buffer: a scratch
/// copy of the input on every rank (the root's holds the result afterwards).
pub fn reduce_tree(
    out: &mut Vec<Step>,
    rank: usize,
    world: usize,
    root: usize,
    len: usize,
    chunk: usize,
) {
    if world <= 1 {
        return;
    }
    let vr = (rank + world - root) % world;
    let real = |v: usize| (v + root) % world;
    let mut parent = None;
    let mut top = 1;
    while top < world {
        if vr & top != 0 {
            parent = Some(real(vr & !top));
            break;
        }
        top <<= 1;
    }
    // Children: vr | m for every power of two m below `top`, smallest first.
    let children = std::iter::successors(Some(1usize), |m| Some(m << 1))
        .take_while(move |&m| m < top)
        .filter(move |&m| vr | m < world)
        .map(move |m| real(vr | m));
    for (c, r) in chunks(0..len, chunk).enumerate() {
        for child in children.clone() {
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
}
