//! Gather and scatter: the root receives from, or sends to, every other
//! rank directly, as Gloo does. Each rank's block crosses one link once;
//! a binomial tree would save the root frames at small sizes but forward
//! blocks through intermediate ranks, log2(p) times for the farthest.

use super::{Action, Step};

/// Gather of `n` elements per rank to `root`. Work buffer: at the root, the
/// output (`n * world` elements, block r from rank r; its own block is a
/// copy the caller makes); at any other rank, its input, which it sends.
pub fn gather(out: &mut Vec<Step>, rank: usize, world: usize, root: usize, n: usize, chunk: usize) {
    if rank != root {
        super::push_sends(out, root, 0..n, chunk, 0);
        return;
    }
    for k in 1..world {
        let from = (root + k) % world;
        super::push_recvs(out, from, from * n..(from + 1) * n, chunk, 0, Action::Copy);
    }
}

/// Scatter of `n` elements per rank from `root`. Work buffer: at the root,
/// the input (`n * world` elements, block r for rank r; its own block is a
/// copy the caller makes); at any other rank, its output.
pub fn scatter(
    out: &mut Vec<Step>,
    rank: usize,
    world: usize,
    root: usize,
    n: usize,
    chunk: usize,
) {
    if rank != root {
        super::push_recvs(out, root, 0..n, chunk, 0, Action::Copy);
        return;
    }
    for k in 1..world {
        let to = (root + k) % world;
        super::push_sends(out, to, to * n..(to + 1) * n, chunk, 0);
    }
}
