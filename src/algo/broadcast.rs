//! Broadcast: a binomial tree for small messages (ceil(log2 p) rounds), a
//! pipelined chain for large ones (each chunk flows root -> root+1 -> ... and
//! every link carries the buffer once, so time approaches size / link
//! bandwidth whatever p is).

use super::{Action, Step, chunks};

/// Binomial-tree broadcast of `len` elements from `root` (MPICH's shape).
/// Work buffer: the user's buffer. Chunks pipeline down the tree: an inner
/// rank forwards chunk c to its children as soon as it has it.
pub fn broadcast_tree(
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
    let mut top = 1;
    let mut parent = None;
    while top < world {
        if vr & top != 0 {
            parent = Some(real(vr - top));
            break;
        }
        top <<= 1;
    }
    // Children: vr + m for every power of two m below `top`, largest first.
    let children = std::iter::successors(Some(top >> 1), |m| Some(m >> 1))
        .take_while(|&m| m > 0)
        .filter(move |&m| vr + m < world)
        .map(move |m| real(vr + m));
    for (c, r) in chunks(0..len, chunk).enumerate() {
        if let Some(p) = parent {
            out.push(Step::Recv {
                peer: p,
                range: r.clone(),
                step: 0,
                chunk: c as u32,
                action: Action::Copy,
            });
        }
        for child in children.clone() {
            out.push(Step::Send {
                peer: child,
                range: r.clone(),
                step: 0,
                chunk: c as u32,
            });
        }
    }
}

/// Pipelined chain broadcast of `len` elements from `root`. Work buffer: the
/// user's buffer.
pub fn broadcast_chain(
    out: &mut Vec<Step>,
    rank: usize,
    world: usize,
    root: usize,
    len: usize,
    chunk: usize,
) {
    super::push_chain(out, rank, world, root, len, chunk, 0, Action::Copy);
}
