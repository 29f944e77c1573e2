//! The chunked, pipelined ring (Patarasuk and Yuan; what NCCL and Gloo use for
//! large messages).
//!
//! Rank r sends to r+1 and receives from r-1. The buffer is cut into p blocks;
//! reduce-scatter takes p-1 steps after which rank r holds the full reduction
//! of block r, and all-gather takes p-1 more steps that circulate the reduced
//! blocks. Every rank sends 2(p-1)/p of the buffer in all-reduce, the
//! bandwidth optimum. Each block is cut into chunks, and a chunk is forwarded
//! as soon as it has been received and reduced, so the p-1 hops overlap.

use super::{Action, Step, block, chunks};
use std::ops::Range;

/// One ring step: which block goes right, which comes from the left.
struct RingStep {
    send: Range<usize>,
    recv: Range<usize>,
    action: Action,
}

/// Emits ring steps in pipelined order (reduce-scatter and all-gather; the
/// all-reduce of more than two ranks runs as a [`wavefront`]): the sends of
/// step 0, then for each
/// later step and chunk "receive chunk c of the previous step, then send chunk
/// c of this one", then the receives of the last step. Step g's send block is
/// always step g-1's receive block, so chunk c can go on as soon as it lands.
/// `ring(g)` is step g of `count`.
fn pipelined(
    out: &mut Vec<Step>,
    rank: usize,
    world: usize,
    chunk: usize,
    count: usize,
    ring: impl Fn(usize) -> RingStep,
) {
    let right = (rank + 1) % world;
    let left = (rank + world - 1) % world;
    if count == 0 {
        return;
    }
    super::push_sends(out, right, ring(0).send, chunk, 0);
    let mut prev = ring(0);
    for g in 1..count {
        let this = ring(g);
        debug_assert_eq!(this.send, prev.recv);
        for (c, r) in chunks(prev.recv.clone(), chunk).enumerate() {
            out.push(Step::Recv {
                peer: left,
                range: r.clone(),
                step: (g - 1) as u32,
                chunk: c as u32,
                action: prev.action,
            });
            out.push(Step::Send {
                peer: right,
                range: r,
                step: g as u32,
                chunk: c as u32,
            });
        }
        prev = this;
    }
    super::push_recvs(out, left, prev.recv, chunk, (count - 1) as u32, prev.action);
}

fn modp(x: isize, world: usize) -> usize {
    x.rem_euclid(world as isize) as usize
}

/// Step `s` of the reduce-scatter phase (p-1 steps).
fn reduce_scatter_step(
    rank: usize,
    world: usize,
    blocks: &dyn Fn(usize) -> Range<usize>,
    s: usize,
) -> RingStep {
    let (r, s) = (rank as isize, s as isize);
    RingStep {
        send: blocks(modp(r - s - 1, world)),
        recv: blocks(modp(r - s - 2, world)),
        action: Action::Reduce,
    }
}

/// Step `s` of the all-gather phase (p-1 steps).
fn all_gather_step(
    rank: usize,
    world: usize,
    blocks: &dyn Fn(usize) -> Range<usize>,
    s: usize,
) -> RingStep {
    let (r, s) = (rank as isize, s as isize);
    RingStep {
        send: blocks(modp(r - s, world)),
        recv: blocks(modp(r - s - 1, world)),
        action: Action::Copy,
    }
}

/// Chunks of the peer's half a 2-rank all-reduce sends ahead of the
/// reductions (see [`all_reduce_pair`]).
const PAIR_SENDS_AHEAD: usize = 4;

/// Ring all-reduce of `len` elements. Work buffer: the user's buffer.
pub fn all_reduce_ring(out: &mut Vec<Step>, rank: usize, world: usize, len: usize, chunk: usize) {
    if world == 2 {
        return all_reduce_pair(out, rank, len, chunk);
    }
    let blocks = |i| block(len, world, i);
    let phase = world.saturating_sub(1);
    wavefront(out, rank, world, chunk, 2 * phase, |g| {
        if g < phase {
            reduce_scatter_step(rank, world, &blocks, g)
        } else {
            all_gather_step(rank, world, &blocks, g - phase)
        }
    });
}

/// Chunk `c` of `range` cut into chunks of `chunk` (as [`chunks`] does).
fn nth_chunk(range: &Range<usize>, chunk: usize, c: usize) -> Option<Range<usize>> {
    let start = range.start.checked_add(c.checked_mul(chunk)?)?;
    (start < range.end).then(|| start..(start + chunk).min(range.end))
}

/// Emits ring steps as a wavefront: in round `t`, chunk `t - g` of every
/// step `g` ("receive chunk c of step g-1, then send chunk c of step g";
/// step 0 only sends, the last receive only receives). A rank's round `t`
/// needs only what its left neighbour sent in round `t - 1`, so no step
/// sends a whole block ahead of what the next rank takes: each chunk is
/// received and reduced soon after it is sent, in cache, instead of a
/// whole block waiting in buffers (the pipelined order sends step 0 whole
/// first; 0011 did the same for two ranks). Every link still carries
/// frames in the order its receiver takes them: the sender emits (g, c) in
/// round g + c, the receiver takes it in round g + c + 1, both in order of
/// the round, then of g.
fn wavefront(
    out: &mut Vec<Step>,
    rank: usize,
    world: usize,
    chunk: usize,
    count: usize,
    ring: impl Fn(usize) -> RingStep,
) {
    if count == 0 {
        return;
    }
    let chunk = chunk.max(1);
    let right = (rank + 1) % world;
    let left = (rank + world - 1) % world;
    // Receives count too: a reduce-scatter never sends its last step's
    // block (this rank's own), which may be the longest.
    let most = (0..count)
        .map(|g| {
            let step = ring(g);
            step.send.len().max(step.recv.len()).div_ceil(chunk)
        })
        .max()
        .unwrap_or(0);
    for t in 0..most + count {
        // Only steps with a chunk t - g < most: the loop stays as long as
        // the schedule, even for worlds of thousands of ranks.
        for g in (t + 1).saturating_sub(most)..=count.min(t) {
            let c = t - g;
            if g > 0 {
                let prev = ring(g - 1);
                let Some(range) = nth_chunk(&prev.recv, chunk, c) else {
                    continue;
                };
                out.push(Step::Recv {
                    peer: left,
                    range,
                    step: (g - 1) as u32,
                    chunk: c as u32,
                    action: prev.action,
                });
            }
            if g < count
                && let Some(range) = nth_chunk(&ring(g).send, chunk, c) {
                    out.push(Step::Send {
                        peer: right,
                        range,
                        step: g as u32,
                        chunk: c as u32,
                    });
                }
        }
    }
}

/// The ring of two ranks, ordered for its one link: each rank sends the
/// peer's half (step 0) and reduces into its own half what the peer sends,
/// keeping its sends [`PAIR_SENDS_AHEAD`] chunks ahead of its reductions;
/// then it sends its reduced half and receives the other (step 1).
///
/// The pipelined ring sends a whole block before it reduces anything, and
/// forwards each chunk as soon as it is reduced. With two ranks the
/// forwards cannot reach the peer before the rest of the first block (one
/// link, frames taken in order), so they gain nothing, while the peer's
/// whole first half waits in buffers and is reduced from memory. Here it
/// is reduced chunk by chunk as it arrives, while a few chunks stay in
/// flight, and each link still carries all of step 0 before step 1 (so
/// its all-gather half is one trailing run of copy receives, which exec
/// posts ahead; decision 0010). Larger rings run as a [`wavefront`].
fn all_reduce_pair(out: &mut Vec<Step>, rank: usize, len: usize, chunk: usize) {
    let peer = 1 - rank;
    let (mine, theirs) = (block(len, 2, rank), block(len, 2, peer));
    pair_exchange(
        out,
        peer,
        theirs.clone(),
        mine.clone(),
        chunk,
        Action::Reduce,
    );
    super::push_sends(out, peer, mine, chunk, 1);
    super::push_recvs(out, peer, theirs, chunk, 1, Action::Copy);
}

/// Step 0 of a two-rank reduce-scatter: the chunks of `send` go to `peer`,
/// kept [`PAIR_SENDS_AHEAD`] ahead of the receives of `recv`'s chunks (each
/// applied with `action`), so neither rank's block waits whole in the
/// other's inbox (decision 0011).
fn pair_exchange(
    out: &mut Vec<Step>,
    peer: usize,
    send: Range<usize>,
    recv: Range<usize>,
    chunk: usize,
    action: Action,
) {
    let push_send = |out: &mut Vec<Step>, (i, range): (usize, Range<usize>)| {
        out.push(Step::Send {
            peer,
            range,
            step: 0,
            chunk: i as u32,
        });
    };
    let mut sends = chunks(send, chunk).enumerate();
    for s in sends.by_ref().take(PAIR_SENDS_AHEAD) {
        push_send(out, s);
    }
    for (c, range) in chunks(recv, chunk).enumerate() {
        if let Some(s) = sends.next() {
            push_send(out, s);
        }
        out.push(Step::Recv {
            peer,
            range,
            step: 0,
            chunk: c as u32,
            action,
        });
    }
    for s in sends {
        push_send(out, s);
    }
}

#[cfg(any(test, feature = "internals"))]
/// Ring reduce-scatter of `len` elements. Work buffer: a copy of the input;
/// afterwards `block(len, world, rank)` of it holds this rank's result.
pub fn reduce_scatter_ring(
    out: &mut Vec<Step>,
    rank: usize,
    world: usize,
    len: usize,
    chunk: usize,
) {
    let blocks = |i| block(len, world, i);
    pipelined(out, rank, world, chunk, world.saturating_sub(1), |g| {
        reduce_scatter_step(rank, world, &blocks, g)
    });
}

/// Ring reduce-scatter of `len` elements that leaves the input as it is.
/// Index space: the input (`0..len`, read only), then the work buffer;
/// `work(b)` is where block b is reduced, an index range past `len`. Every
/// block this rank reduces is touched first by the receive that combines
/// it with the input ([`Action::ReduceFrom`]), so nothing is copied up
/// front; afterwards `work(rank)` holds this rank's result. The frames are
/// the same as [`reduce_scatter_ring`]'s. With two ranks only `work(rank)`
/// is used, so the work buffer can be the output itself, and sends and
/// receives interleave as in the two-rank all-reduce; more ranks run as a
/// wavefront, as the all-reduce's ring does.
pub fn reduce_scatter_ring_from(
    out: &mut Vec<Step>,
    rank: usize,
    world: usize,
    len: usize,
    chunk: usize,
    work: impl Fn(usize) -> Range<usize>,
) {
    let blocks = |i| block(len, world, i);
    if world == 2 {
        // The same frames, sends and receives interleaved as the two-rank
        // all-reduce does.
        let (peer, recv) = (1 - rank, work(rank));
        let back = recv.start - blocks(rank).start;
        let action = Action::ReduceFrom { back };
        return pair_exchange(out, peer, blocks(peer), recv, chunk, action);
    }
    // A wavefront, as the all-reduce's ring (decision 0014): each chunk is
    // reduced soon after it is sent, not after a whole block waited.
    wavefront(out, rank, world, chunk, world - 1, |g| {
        let ring = reduce_scatter_step(rank, world, &|i| i..i + 1, g);
        let (sent, received) = (ring.send.start, ring.recv.start);
        let recv = work(received);
        RingStep {
            // Step 0 sends a block straight from the input; later steps
            // forward what the previous one reduced.
            send: if g == 0 { blocks(sent) } else { work(sent) },
            action: Action::ReduceFrom {
                back: recv.start - blocks(received).start,
            },
            recv,
        }
    });
}

/// Where `rank`'s [`reduce_scatter_ring_into`] puts its slot, and how many
/// elements past the input its schedule uses: the slot (one chunk, or the
/// longest block if that is shorter) is the tail of this rank's block when
/// the block holds it, so the schedule needs only the output; else it
/// follows the block.
pub fn reduce_scatter_slot(len: usize, world: usize, rank: usize, chunk: usize) -> (usize, usize) {
    let slot_len = chunk.max(1).min(block(len, world, 0).len());
    let mine = block(len, world, rank).len();
    if mine >= slot_len {
        (len + mine - slot_len, mine)
    } else {
        (len + mine, mine + slot_len)
    }
}

/// Ring reduce-scatter of `len` elements with no work space beyond one
/// chunk. Index space: the input (`0..len`, read only), this rank's block
/// (`len..len + mine`, its result), and a one-chunk slot at `slot`
/// (placed by [`reduce_scatter_slot`]). Every chunk of another
/// rank's block is combined with the input into the slot and forwarded
/// from it in the next step (the wavefront emits the two together, and a
/// send is done before the next step starts), so one slot serves them all.
///
/// The slot may be the tail of this rank's block. It overlaps at most the
/// block's last two chunks, and the wavefront writes those no earlier than
/// the round of the slot's last use, after that use in its round. (Other
/// blocks have at most one more chunk than this one, and only when this
/// one's last chunk is whole, in which case the slot is that chunk.)
pub fn reduce_scatter_ring_into(
    out: &mut Vec<Step>,
    rank: usize,
    world: usize,
    len: usize,
    chunk: usize,
    slot: usize,
) {
    let mine = block(len, world, rank);
    let from = out.len();
    // Laid out like the input first (block b at len + b), then moved.
    reduce_scatter_ring_from(out, rank, world, len, chunk, |b| {
        let b = block(len, world, b);
        len + b.start..len + b.end
    });
    for step in &mut out[from..] {
        match step {
            Step::Recv { range, action, .. } if range.start >= len => {
                // The input elements this chunk combines with.
                let source = range.start - len..range.end - len;
                let dest = if mine.contains(&source.start) {
                    len + source.start - mine.start..len + source.end - mine.start
                } else {
                    slot..slot + source.len()
                };
                *action = Action::ReduceFrom {
                    back: dest.start - source.start,
                };
                *range = dest;
            }
            // Only chunks of other blocks are forwarded from the work space.
            Step::Send { range, .. } if range.start >= len => *range = slot..slot + range.len(),
            _ => {}
        }
    }
}

/// Ring all-gather of `per_rank` elements from each rank. Work buffer: the
/// output (`per_rank * world` elements) with this rank's input already copied
/// to `rank * per_rank..`.
pub fn all_gather_ring(
    out: &mut Vec<Step>,
    rank: usize,
    world: usize,
    per_rank: usize,
    chunk: usize,
) {
    let blocks = |i: usize| i * per_rank..(i + 1) * per_rank;
    pipelined(out, rank, world, chunk, world.saturating_sub(1), |g| {
        all_gather_step(rank, world, &blocks, g)
    });
}

/// Ring all-gather of blocks of uneven lengths: rank r's block is
/// `counts[r]` elements (MPI's Allgatherv). Work buffer: the output (the
/// blocks in rank order, `counts` summed) with this rank's input already
/// copied to its block. Empty blocks cost no frames; every rank must pass
/// the same counts (a rank that differs meets a frame of another length).
pub fn all_gather_v_ring(out: &mut Vec<Step>, rank: usize, counts: &[usize], chunk: usize) {
    let world = counts.len();
    let blocks = |i: usize| {
        let start: usize = counts[..i].iter().sum();
        start..start + counts[i]
    };
    pipelined(out, rank, world, chunk, world.saturating_sub(1), |g| {
        all_gather_step(rank, world, &blocks, g)
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_larger_ring_sends_each_round_only_after_taking_the_last() {
        // 20 chunks per block: the pipelined order would send all 20 of
        // step 0 before its first receive. The wavefront sends one chunk
        // per step per round, and each round's sends follow its receives.
        let chunk = 10;
        for world in 3..=5 {
            let len = 200 * world + 3;
            for rank in 0..world {
                let steps = crate::algo::schedule(|o| all_reduce_ring(o, rank, world, len, chunk));
                let (mut sent, mut received) = (0usize, 0usize);
                let steps_per_op = 2 * (world - 1);
                for s in &steps {
                    match s {
                        Step::Send { .. } => {
                            sent += 1;
                            // Ahead of the receives by at most a round
                            // (one chunk per step) and the next round's
                            // first send.
                            assert!(
                                sent <= received + steps_per_op + 1,
                                "p={world} rank {rank}: {sent} sends after {received} receives"
                            );
                        }
                        Step::Recv { .. } => received += 1,
                    }
                }
                // Every step of 20-21 chunks (blocks differ by one element).
                assert!(sent >= 20 * steps_per_op, "p={world} rank {rank}: {sent}");
            }
        }
    }

    #[test]
    fn a_two_rank_all_reduce_reduces_as_it_sends_and_keeps_its_link_in_step_order() {
        let (len, chunk) = (1000, 10); // 50 chunks per half
        for rank in 0..2 {
            let steps = crate::algo::schedule(|o| all_reduce_ring(o, rank, 2, len, chunk));
            let mut sent_step0 = 0;
            let mut reduced = 0;
            let mut step1_started = false;
            for s in &steps {
                match s {
                    Step::Send { step: 0, .. } => {
                        assert!(!step1_started, "rank {rank}: step 0 sent after step 1");
                        sent_step0 += 1;
                    }
                    Step::Send { .. } => step1_started = true,
                    Step::Recv {
                        step: 0,
                        action: Action::Reduce,
                        ..
                    } => {
                        reduced += 1;
                        // Only a few chunks wait in the peer's buffers.
                        assert!(
                            sent_step0 <= reduced + PAIR_SENDS_AHEAD,
                            "rank {rank}: {sent_step0} chunks sent before reduction {reduced}"
                        );
                    }
                    Step::Recv { .. } => {}
                }
            }
            assert_eq!((sent_step0, reduced), (50, 50), "rank {rank}");
        }
    }
}
