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

/// [`reduce_tree`] for a rank other than `root` that leaves its input as
/// it is. Index space: the input (`0..len`, read only), then a slot of
/// `chunk.min(len)` elements where this rank combines its children's
/// partial results, one chunk at a time: a chunk's receives and its send
/// to the parent are consecutive steps, and a send is done before the next
/// step starts, so one slot serves every chunk. The first child's chunk is
/// combined with the input as it arrives ([`Action::ReduceFrom`]), so
/// nothing is copied. A rank without children (a leaf) sends its input,
/// and its schedule never reaches the slot. The frames are
/// [`reduce_tree`]'s.
pub fn reduce_tree_from(
    out: &mut Vec<Step>,
    rank: usize,
    world: usize,
    root: usize,
    len: usize,
    chunk: usize,
) {
    let from = out.len();
    reduce_tree(out, rank, world, root, len, chunk);
    // Each chunk's receives come before its send: the first receive of a
    // chunk combines with the input, the rest with what it left in the
    // slot; a chunk that received anything is sent from the slot.
    let mut reduced = None;
    for step in &mut out[from..] {
        match step {
            Step::Recv {
                range,
                chunk,
                action,
                ..
            } => {
                *action = if reduced == Some(*chunk) {
                    Action::Reduce
                } else {
                    Action::ReduceFrom {
                        back: len - range.start,
                    }
                };
                reduced = Some(*chunk);
                *range = len..len + range.len();
            }
            Step::Send { range, chunk, .. } => {
                if reduced == Some(*chunk) {
                    *range = len..len + range.len();
                }
            }
        }
    }
}

/// All-reduce as a binomial-tree reduce to rank 0, then a binomial-tree
/// broadcast from it. Per chunk it moves 2(p-1) frames, against recursive
/// doubling's p*log2(p), in 2*ceil(log2 p) rounds against log2(p): the
/// better trade where ranks share cores, so every frame's CPU is time
/// (decision 0013). Work buffer: the user's buffer (inner ranks hold
/// partial sums until the broadcast overwrites them).
pub fn all_reduce_tree(out: &mut Vec<Step>, rank: usize, world: usize, len: usize, chunk: usize) {
    let start = out.len();
    reduce_tree(out, rank, world, 0, len, chunk);
    let broadcast = out.len();
    super::broadcast_tree(out, rank, world, 0, len, chunk);
    // Step numbers of its own (the other all-reduces count from 0): a rank
    // that chose another algorithm fails on the first frame with a
    // mismatch, instead of taking a frame that happens to fit.
    for (i, s) in out[start..].iter_mut().enumerate() {
        let (Step::Send { step, .. } | Step::Recv { step, .. }) = s;
        *step = TREE_REDUCE_STEP + u32::from(start + i >= broadcast);
    }
}

/// The step number of `all_reduce_tree`'s reduce; its broadcast is the next.
const TREE_REDUCE_STEP: u32 = 1 << 20;
