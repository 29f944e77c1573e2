//! Reduce to one root: over a binomial tree for small messages (the mirror
//! of the broadcast tree: each rank combines its children's partial results
//! into its own and passes the sum to its parent, chunk by chunk so the
//! levels overlap), and over a pipelined chain for large ones (the mirror of
//! the broadcast chain: the root receives and reduces the buffer once, where
//! a tree's root takes it ceil(log2 p) times).

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
/// partial results, one chunk at a time (see `read_input_in_place`). The
/// frames are [`reduce_tree`]'s.
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
    read_input_in_place(&mut out[from..], len);
}

/// Pipelined chain reduce of `len` elements to `root`. Chunks flow the way
/// the ring and the broadcast chain send (rank r to r+1): each starts at
/// `root + 1`, which sends its input; every later rank adds its own and
/// passes the sum on, and `root - 1` hands the total to the root. Every
/// link carries the buffer once and each rank but the first reduces it
/// once, so time approaches size / link bandwidth whatever p is, and the
/// root's work is a tree's divided by ceil(log2 p). Work buffer: a scratch
/// copy of the input on every rank (the root's holds the result). Its step
/// number differs from the tree's, so ranks that chose differently fail on
/// the first frame instead of waiting for frames that never come.
pub fn reduce_chain(
    out: &mut Vec<Step>,
    rank: usize,
    world: usize,
    root: usize,
    len: usize,
    chunk: usize,
) {
    let first = (root + 1) % world.max(1);
    super::push_chain(
        out,
        rank,
        world,
        first,
        len,
        chunk,
        CHAIN_REDUCE_STEP,
        Action::Reduce,
    );
}

/// Whether [`reduce_chain`] should beat [`reduce_tree`] on `len` elements
/// cut into `chunk`-element pieces: in chunk times, the chain takes
/// `k + p - 2` (its pipeline fills over p - 1 links) and the tree `k *
/// ceil(log2 p)` (its root takes every chunk from that many children), so
/// the chain wins from 2 chunks at 3 ranks, 3 at 4 and 4 at 8. A one-chunk
/// buffer stays on the tree, whose depth is log2 p hops against the
/// chain's p - 1. (Broadcast keeps its chain from one chunk: a tree there
/// measured no better on this machine; docs/perf.md, seventeenth session.)
pub fn reduce_chain_pays(world: usize, len: usize, chunk: usize) -> bool {
    let k = len.div_ceil(chunk.max(1));
    let depth = world.next_power_of_two().trailing_zeros() as usize;
    world > 2 && k * depth > k + world - 2
}

/// [`reduce_chain`] for a rank other than `root` that leaves its input as
/// it is, through one chunk's slot after it (see `read_input_in_place`).
/// The frames are [`reduce_chain`]'s.
pub fn reduce_chain_from(
    out: &mut Vec<Step>,
    rank: usize,
    world: usize,
    root: usize,
    len: usize,
    chunk: usize,
) {
    let from = out.len();
    reduce_chain(out, rank, world, root, len, chunk);
    read_input_in_place(&mut out[from..], len);
}

/// The step number of [`reduce_chain`]'s frames.
const CHAIN_REDUCE_STEP: u32 = 2 << 20;

/// Turns a non-root reduce schedule whose work buffer is a copy of the
/// input into one that reads the input in place. Index space: the input
/// (`0..len`, read only), then a slot of `chunk.min(len)` elements where
/// this rank combines what it receives, one chunk at a time: a chunk's
/// receives and its send onward are consecutive steps, and a send is done
/// before the next step starts, so one slot serves every chunk. A chunk's
/// first receive is combined with the input as it arrives
/// ([`Action::ReduceFrom`]), so nothing is copied. A rank that receives
/// nothing (a leaf) sends its input, and its schedule never reaches the
/// slot.
fn read_input_in_place(steps: &mut [Step], len: usize) {
    let mut reduced = None;
    for step in steps {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::schedule;

    /// Elements a rank receives in its schedule.
    fn received(steps: &[Step]) -> usize {
        steps
            .iter()
            .map(|s| match s {
                Step::Recv { range, .. } => range.len(),
                Step::Send { .. } => 0,
            })
            .sum()
    }

    #[test]
    fn the_chain_root_receives_the_buffer_once_and_the_tree_root_log2_p_times() {
        for world in 2..=9usize {
            let depth = world.next_power_of_two().trailing_zeros() as usize;
            for root in 0..world {
                let chain = schedule(|o| reduce_chain(o, root, world, root, 100, 7));
                let tree = schedule(|o| reduce_tree(o, root, world, root, 100, 7));
                assert_eq!(received(&chain), 100, "p={world} root={root}");
                assert_eq!(received(&tree), 100 * depth, "p={world} root={root}");
                // No rank of the chain receives more than the buffer once.
                for rank in 0..world {
                    let s = schedule(|o| reduce_chain(o, rank, world, root, 100, 7));
                    assert!(received(&s) <= 100);
                }
            }
        }
    }

    #[test]
    fn the_reduce_chain_pays_once_its_pipeline_outruns_the_tree_root() {
        // (world, fewest chunks where the chain is chosen)
        for (world, from) in [(3, 2), (4, 3), (5, 2), (8, 4), (16, 5)] {
            assert!(!reduce_chain_pays(world, (from - 1) * 10, 10), "p={world}");
            assert!(reduce_chain_pays(world, from * 10, 10), "p={world}");
            assert!(reduce_chain_pays(world, from * 10 - 9, 10), "p={world}");
        }
        // Two ranks: both are one hop, so the tree (its step numbers) stays.
        assert!(!reduce_chain_pays(2, 1000, 10));
        assert!(!reduce_chain_pays(1, 1000, 10));
        assert!(!reduce_chain_pays(4, 0, 10));
    }
}
