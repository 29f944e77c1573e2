//! Runs a schedule on a transport: the I/O driver for the sans-IO
//! algorithms in [`crate::algo`].
//!
//! Each send becomes one data frame whose header carries the op's signature
//! (communicator, sequence number, kind, dtype, reduce op, root, count) and
//! the schedule position (step, chunk). Each receive checks all of it against
//! what this rank expects before touching the buffer, so ranks that disagree
//! about a collective fail with an error naming both sides instead of
//! producing garbage.

use crate::algo::{Action, Step};
use crate::error::{Error, OpContext};
use crate::stats::Traffic;
use crate::transport::{LinkError, PostedRecvs, Received, Transport};
use crate::wire::{Header, OpKind};
use crate::{DType, Element, ReduceOp};
use std::ops::Range;
use std::time::{Duration, Instant};
use zerocopy::{FromBytes, IntoBytes};

/// Everything a frame of this op must agree on.
pub(crate) struct OpSignature {
    pub(crate) comm_id: u64,
    pub(crate) seq: u64,
    pub(crate) op: OpKind,
    pub(crate) dtype: DType,
    pub(crate) reduce_op: Option<ReduceOp>,
    pub(crate) root: u32,
    /// Checked only when every rank passes the same count.
    pub(crate) count: Option<u64>,
    /// What this op's sends carry instead of `seq` and `count`, when they
    /// differ from what its receives expect (`send_recv`: a send number
    /// and a receive number per peer pair).
    pub(crate) send_seq: Option<u64>,
    pub(crate) send_count: Option<u64>,
}

impl OpSignature {
    fn header(&self) -> Header {
        let mut h = Header::data(
            self.comm_id,
            self.send_seq.unwrap_or(self.seq),
            self.op,
            self.dtype,
        )
        .with_root(self.root)
        .with_count(self.send_count.or(self.count).unwrap_or(0));
        h.reduce_op = self.reduce_op;
        h
    }

    fn describe(
        op: OpKind,
        seq: u64,
        dtype: Option<DType>,
        count: u64,
        root: u32,
        reduce: Option<ReduceOp>,
    ) -> String {
        let dtype = dtype.map_or("?", DType::name);
        let mut s = format!("{op} #{seq} ({dtype}, {count} elements");
        if let Some(r) = reduce {
            s += &format!(", {r}");
        }
        if matches!(
            op,
            OpKind::Broadcast | OpKind::Reduce | OpKind::Gather | OpKind::Scatter
        ) {
            s += &format!(", root {root}");
        }
        s + ")"
    }

    /// Compares an incoming header with this op; a description of the
    /// difference if they disagree.
    fn mismatch(&self, h: &Header, my_rank: usize, peer: usize) -> Option<String> {
        let same = h.comm_id == self.comm_id
            && h.seq == self.seq
            && h.op == self.op
            && h.dtype == Some(self.dtype)
            && h.reduce_op == self.reduce_op
            && h.root == self.root
            && self.count.is_none_or(|c| c == h.count);
        (!same).then(|| {
            format!(
                "rank {my_rank} called {} but rank {peer} called {}",
                Self::describe(
                    self.op,
                    self.seq,
                    Some(self.dtype),
                    self.count.unwrap_or(0),
                    self.root,
                    self.reduce_op
                ),
                Self::describe(h.op, h.seq, h.dtype, h.count, h.root, h.reduce_op),
            )
        })
    }
}

/// Copy receives from one peer holding at least this much in all are
/// posted ahead (see [`PostAhead`]); fewer are not worth the bookkeeping.
const POST_AHEAD_BYTES: usize = 64 << 10;

/// Runs `steps` on `input` and `work`, which the steps address as one
/// index space: ranges below `input.len()` are the caller's input, read in
/// place by sends and by [`Action::ReduceFrom`] receives; the rest are
/// `work`, offset by `input.len()`. All-to-all, reduce-scatter, a
/// non-root reduce or gather, and the root of a scatter pass their input
/// here instead of copying it into a work buffer; every other op passes an
/// empty one.
/// `members` maps communicator ranks to the transport's (world) ranks.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run<T: Element>(
    transport: &dyn Transport,
    members: &[usize],
    sig: &OpSignature,
    ctx: &OpContext,
    steps: &[Step],
    input: &[T],
    work: &mut [T],
    started: Instant,
    timeout: Duration,
    traffic: &mut Traffic,
) -> Result<(), Error> {
    let op = Run {
        transport,
        members,
        sig,
        ctx,
        started,
        deadline: started + timeout,
        template: sig.header(),
    };
    let Some(peer) = PostAhead::peer(steps, size_of::<T>()) else {
        return op.steps(steps, input, &mut Work::Whole(work), traffic);
    };
    transport.with_posted_recvs(
        sig.comm_id,
        members[peer],
        work.as_mut_bytes(),
        op.deadline,
        &mut |posted| {
            let ahead = PostAhead::new(peer);
            op.steps::<T>(steps, input, &mut Work::Posted { posted, ahead }, traffic)
        },
    )
}

/// One op's run: what every step needs.
struct Run<'a> {
    transport: &'a dyn Transport,
    members: &'a [usize],
    sig: &'a OpSignature,
    ctx: &'a OpContext,
    started: Instant,
    deadline: Instant,
    template: Header,
}

impl Run<'_> {
    fn steps<T: Element>(
        &self,
        steps: &[Step],
        input: &[T],
        work: &mut Work<'_, T>,
        traffic: &mut Traffic,
    ) -> Result<(), Error> {
        let elem = size_of::<T>();
        let split = input.len();
        for (at, current) in steps.iter().enumerate() {
            if let Work::Posted { posted, ahead } = work {
                ahead
                    .post_due(steps, at, &mut |range, step, chunk| {
                        let range = in_work(&range, split)
                            .ok_or_else(|| format!("{range:?} reaches into the read-only input"))?;
                        let (offset, len) = (range.start * elem, range.len() * elem);
                        posted.post((self.sig.seq, step, chunk), offset, len)
                    })
                    .map_err(|why| self.internal(format!("posting a receive ahead: {why}")))?;
            }
            match current {
                Step::Send {
                    peer,
                    range,
                    step,
                    chunk,
                } => {
                    if range.end <= split {
                        let payload = input
                            .get(range.clone())
                            .ok_or_else(|| self.outside(range))?;
                        self.send(*peer, payload, *step, *chunk, traffic)?;
                        continue;
                    }
                    let at = in_work(range, split).ok_or_else(|| self.straddles(range, split))?;
                    let payload = work.get(at).ok_or_else(|| self.outside(range))?;
                    self.send(*peer, payload, *step, *chunk, traffic)?;
                }
                Step::Recv {
                    peer,
                    range: whole,
                    step,
                    chunk,
                    action,
                } => {
                    let range =
                        &in_work(whole, split).ok_or_else(|| self.straddles(whole, split))?;
                    let link_error = |e| self.link_error(e, *peer);
                    if let Work::Posted { posted, ahead } = work
                        && ahead.posts(current)
                    {
                        let (offset, len) = (range.start * elem, range.len() * elem);
                        let (received, bytes) = posted
                            .next((self.sig.seq, *step, *chunk), offset, len, self.deadline)
                            .map_err(link_error)?;
                        let dest = <[T]>::mut_from_bytes(bytes).map_err(|_| {
                            self.internal(format!("a posted piece of {len} bytes is not {range:?}"))
                        })?;
                        self.finish_recv(
                            received,
                            *peer,
                            dest,
                            &[],
                            *step,
                            *chunk,
                            *action,
                            traffic,
                        )?;
                        continue;
                    }
                    let source = match action {
                        Action::ReduceFrom { .. } => action
                            .source(whole)
                            .and_then(|from| input.get(from))
                            .ok_or_else(|| {
                                self.internal(format!(
                                    "step range {whole:?} reduces from outside the read-only input (its first {split} elements)"
                                ))
                            })?,
                        _ => &[][..],
                    };
                    let dest = work.get(range.clone()).ok_or_else(|| self.outside(range))?;
                    let received = match action {
                        // Copies may land in place: no buffer, no second copy.
                        Action::Copy => self.transport.recv_into(
                            self.sig.comm_id,
                            self.members[*peer],
                            (self.sig.seq, *step, *chunk),
                            dest.as_mut_bytes(),
                            self.deadline,
                        ),
                        Action::Reduce | Action::ReduceFrom { .. } => self
                            .transport
                            .recv(self.sig.comm_id, self.members[*peer], self.deadline)
                            .map(Received::Frame),
                    }
                    .map_err(link_error)?;
                    self.finish_recv(
                        received, *peer, dest, source, *step, *chunk, *action, traffic,
                    )?;
                }
            }
        }
        Ok(())
    }

    /// Sends `payload` as one frame of this op.
    fn send<T: Element>(
        &self,
        peer: usize,
        payload: &[T],
        step: u32,
        chunk: u32,
        traffic: &mut Traffic,
    ) -> Result<(), Error> {
        let payload = payload.as_bytes();
        let header = self
            .template
            .with_step(step, chunk)
            .with_payload_len(payload.len() as u32);
        self.transport
            .send(self.members[peer], &header, payload, self.deadline)
            .map_err(|e| self.link_error(e, peer))?;
        traffic.sent += payload.len() as u64;
        Ok(())
    }

    /// Checks a received frame against the step that expected it, then
    /// applies it to `dest` (with `source`, see [`Action::apply`]) unless it
    /// landed there already.
    #[allow(clippy::too_many_arguments)]
    fn finish_recv<T: Element>(
        &self,
        received: Received,
        peer: usize,
        dest: &mut [T],
        source: &[T],
        step: u32,
        chunk: u32,
        action: Action,
        traffic: &mut Traffic,
    ) -> Result<(), Error> {
        let (h, payload_len) = match &received {
            Received::Placed(h) => (h, h.payload_len_usize()),
            Received::Frame(incoming) => (&incoming.header, incoming.payload.len()),
        };
        let mismatch = |detail: String| Error::Mismatch {
            ctx: self.ctx.clone(),
            peer,
            detail,
        };
        if let Some(detail) = self.sig.mismatch(h, self.ctx.rank, peer) {
            return Err(mismatch(detail));
        }
        if (h.step, h.chunk) != (step, chunk) || payload_len != size_of_val(dest) {
            return Err(mismatch(format!(
                "expected step {step} chunk {chunk} with {} elements, got step {} chunk {} with {} bytes \
                 (the ranks disagree on the element count or chunk size)",
                dest.len(),
                h.step,
                h.chunk,
                payload_len
            )));
        }
        traffic.received += payload_len as u64;
        let Received::Frame(incoming) = received else {
            return Ok(()); // already in place
        };
        let Some(data) = incoming.payload.as_slice::<T>() else {
            return Err(mismatch("payload is not a whole number of elements".into()));
        };
        // Copy steps ignore the operator; reducing ops always carry one.
        let op = self.sig.reduce_op.unwrap_or(ReduceOp::Sum);
        action.apply(dest, source, data, op);
        self.transport.recycle(incoming.payload);
        Ok(())
    }

    fn link_error(&self, e: LinkError, peer: usize) -> Error {
        link_error(e, self.ctx, peer, self.started, self.members)
    }

    /// A schedule that breaks exec's own rules: a bug here, reported as one.
    fn internal(&self, detail: String) -> Error {
        Error::Internal {
            ctx: self.ctx.clone(),
            detail,
        }
    }

    fn outside(&self, range: &Range<usize>) -> Error {
        self.internal(format!(
            "step range {range:?} overlaps the receives posted ahead"
        ))
    }

    fn straddles(&self, range: &Range<usize>, split: usize) -> Error {
        self.internal(format!(
            "step range {range:?} reaches into the read-only input (its first {split} elements)"
        ))
    }
}

/// `range` of the steps' index space as a range of the work buffer, which
/// starts after the `split` elements of the input; `None` if it reaches
/// into the input.
fn in_work(range: &Range<usize>, split: usize) -> Option<Range<usize>> {
    (range.start >= split).then(|| range.start - split..range.end - split)
}

/// An op's work buffer: whole, or lent to receives posted ahead, in which
/// case steps reach it through the transport, which refuses the parts an
/// untaken posted receive may still be writing.
enum Work<'a, T> {
    Whole(&'a mut [T]),
    Posted {
        posted: &'a mut dyn PostedRecvs,
        ahead: PostAhead,
    },
}

impl<T: Element> Work<'_, T> {
    /// `range` of the buffer, if no posted receive holds part of it.
    fn get(&mut self, range: Range<usize>) -> Option<&mut [T]> {
        match self {
            Work::Whole(work) => work.get_mut(range),
            Work::Posted { posted, .. } => {
                let elem = size_of::<T>();
                let bytes = posted.region(range.start * elem, range.len() * elem)?;
                <[T]>::mut_from_bytes(bytes).ok()
            }
        }
    }
}

/// Which copy receives are posted ahead, and when: each as soon as no step
/// before it still touches its range. In a ring's all-gather phase (and a
/// broadcast chain) a peer's chunks arrive while this rank still reduces
/// or forwards earlier ones; posted only when reached, most would have
/// arrived and cost a copy out of a pooled buffer. With more than two ranks
/// those receives interleave with reductions (the wavefront, decision
/// 0014), so a piece becomes free only once this rank's own send of that
/// chunk is out: posting each then, not the schedule's tail at once, is
/// what lets them land in place (decision 0010).
#[derive(Debug)]
struct PostAhead {
    /// The peer whose copy receives are posted (one link per scope).
    peer: usize,
    /// The first step not yet posted or passed over.
    cursor: usize,
    /// The receive at `cursor` waits for this step, which touches its range.
    blocked_by: Option<usize>,
}

impl PostAhead {
    fn new(peer: usize) -> PostAhead {
        PostAhead {
            peer,
            cursor: 0,
            blocked_by: None,
        }
    }

    /// The peer whose copy receives are worth posting: the one the
    /// schedule's last copy receive of some bytes is from (not an empty
    /// word of pacing or a gather in turn), if its copy receives hold at
    /// least [`POST_AHEAD_BYTES`].
    fn peer(steps: &[Step], elem: usize) -> Option<usize> {
        let peer = steps.iter().rev().find_map(|s| match s {
            Step::Recv {
                peer,
                range,
                action: Action::Copy,
                ..
            } if !range.is_empty() => Some(*peer),
            _ => None,
        })?;
        let ahead = PostAhead::new(peer);
        let bytes: usize = steps
            .iter()
            .filter(|s| ahead.posts(s))
            .map(|s| range_of(s).len() * elem)
            .sum();
        (bytes >= POST_AHEAD_BYTES).then_some(peer)
    }

    /// Whether `step` is one of the receives this posts.
    fn posts(&self, step: &Step) -> bool {
        matches!(step, Step::Recv { peer, action: Action::Copy, .. } if *peer == self.peer)
    }

    /// Before step `at` runs: posts (with `post`: the receive's range, step
    /// and chunk), in schedule order, every receive whose range no step
    /// from `at` up to it touches. Every receive is posted by the time it
    /// is reached (its own turn, at the latest).
    fn post_due(
        &mut self,
        steps: &[Step],
        at: usize,
        post: &mut dyn FnMut(Range<usize>, u32, u32) -> Result<(), String>,
    ) -> Result<(), String> {
        if self.blocked_by.is_some_and(|b| at <= b) {
            return Ok(());
        }
        self.blocked_by = None;
        while let Some(s) = steps.get(self.cursor) {
            let i = self.cursor;
            let (range, step, chunk) = match s {
                Step::Recv {
                    range, step, chunk, ..
                } if self.posts(s) => (range, step, chunk),
                _ => {
                    self.cursor += 1;
                    continue;
                }
            };
            if let Some(b) = (at..i)
                .rev()
                .find(|&k| overlap(&range_of(&steps[k]), range))
            {
                self.blocked_by = Some(b);
                break;
            }
            post(range.clone(), *step, *chunk)?;
            self.cursor += 1;
        }
        Ok(())
    }
}

fn range_of(s: &Step) -> Range<usize> {
    match s {
        Step::Send { range, .. } | Step::Recv { range, .. } => range.clone(),
    }
}

/// Whether two ranges share an element (empty ones share none).
fn overlap(a: &Range<usize>, b: &Range<usize>) -> bool {
    !a.is_empty() && !b.is_empty() && a.start < b.end && b.start < a.end
}

pub(crate) fn link_error(
    e: LinkError,
    ctx: &OpContext,
    peer: usize,
    started: Instant,
    members: &[usize],
) -> Error {
    match e {
        LinkError::Aborted {
            origin,
            seq,
            reason,
        } => Error::Aborted {
            ctx: ctx.clone(),
            // Name the origin by its rank in this communicator when it is one.
            origin: members.iter().position(|&w| w == origin).unwrap_or(origin),
            origin_seq: seq,
            reason,
        },
        // A connection this process refused meanwhile (another secret,
        // TLS setting or job) may be why: name it.
        LinkError::Timeout => Error::Timeout {
            ctx: ctx.clone(),
            peer,
            waited: started.elapsed(),
            detail: crate::refusals::suffix_since(started),
        },
        LinkError::Unread => Error::Timeout {
            ctx: ctx.clone(),
            peer,
            waited: started.elapsed(),
            detail: format!(
                " to read what this rank sends: {}{}",
                crate::error::link::WHY_A_PEER_STOPS_READING,
                crate::refusals::suffix_since(started)
            ),
        },
        LinkError::Lost(loss) => Error::PeerLost {
            ctx: ctx.clone(),
            peer,
            reason: loss.to_string(),
            cause: loss.failure,
        },
        LinkError::Connect {
            addr,
            detail,
            failure,
        } => Error::Connect {
            peer,
            addr,
            detail: format!("during {ctx}: {detail}"),
            cause: failure,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::{all_gather_ring, all_reduce_ring, broadcast_chain, reduce_scatter_ring};

    fn touch(a: &Step, b: &Step) -> bool {
        overlap(&range_of(a), &range_of(b))
    }

    /// Runs `PostAhead` over `steps` as exec does and returns, per step,
    /// the step before which it was posted. Checks what exec relies on:
    /// exactly the receives `posts` names are posted, each by its own turn
    /// at the latest, and no step from its posting up to it touches its
    /// range. And that it is posted as early as that and schedule order
    /// allow: right after the last step before it that touches its range,
    /// or with the receive posted before it, whichever is later.
    fn posting_points(steps: &[Step], peer: usize) -> Vec<Option<usize>> {
        let mut ahead = PostAhead::new(peer);
        let mut point = vec![None; steps.len()];
        for at in 0..steps.len() {
            ahead
                .post_due(steps, at, &mut |range, step, chunk| {
                    let is = |s: &Step| {
                        matches!(s, Step::Recv { range: r, step: t, chunk: c, .. }
                            if (r, *t, *c) == (&range, step, chunk))
                    };
                    let i = steps.iter().position(is).unwrap();
                    assert_eq!(point[i], None, "step {i} posted twice");
                    point[i] = Some(at);
                    Ok(())
                })
                .unwrap();
            assert_eq!(
                point[at].is_some(),
                ahead.posts(&steps[at]),
                "step {at} {:?} reached",
                steps[at]
            );
        }
        let mut previous = 0;
        for (i, p) in point.iter().enumerate() {
            let Some(p) = *p else { continue };
            let free_from = (0..i)
                .rev()
                .find(|&k| touch(&steps[k], &steps[i]))
                .map_or(0, |k| k + 1);
            assert!(
                p >= free_from,
                "step {i} posted before step {free_from} ran"
            );
            assert_eq!(p, free_from.max(previous), "step {i} posted late");
            previous = p;
        }
        point
    }

    #[test]
    fn the_wavefront_posts_each_all_gather_chunk_once_this_ranks_send_of_it_is_out() {
        // 4 ranks, 16 chunks per block: the all-gather receives interleave
        // with reductions into the other chunks of the same blocks.
        let (world, chunk) = (4, 1 << 10);
        let len = world * 16 * chunk;
        let mut steps = Vec::new();
        for rank in 0..world {
            steps.clear();
            all_reduce_ring(&mut steps, rank, world, len, chunk);
            let left = (rank + world - 1) % world;
            assert_eq!(PostAhead::peer(&steps, 4), Some(left));
            let point = posting_points(&steps, left);
            let posted: Vec<usize> = (0..steps.len()).filter(|&i| point[i].is_some()).collect();
            assert_eq!(posted.len(), (world - 1) * 16, "every all-gather chunk");
            for &i in &posted {
                // Posted when its range is free, never held back behind
                // another receive, and more than a round before its turn.
                let free_from = (0..i).rev().find(|&k| touch(&steps[k], &steps[i])).unwrap() + 1;
                assert_eq!(point[i], Some(free_from), "rank {rank} step {i}");
                assert!(
                    i - free_from > 2 * world,
                    "rank {rank} step {i}: {free_from}"
                );
            }
            // The tail of decision 0010 posted only the receives after
            // the last reduction; most come before it.
            let last_reduce = steps
                .iter()
                .rposition(|s| {
                    matches!(
                        s,
                        Step::Recv {
                            action: Action::Reduce,
                            ..
                        }
                    )
                })
                .unwrap();
            let before = posted.iter().filter(|&&i| i < last_reduce).count();
            assert!(before * 4 >= posted.len() * 3, "rank {rank}: {before}");
        }
    }

    #[test]
    fn a_two_rank_ring_posts_its_all_gather_half_once_its_own_sends_are_out() {
        let (len, chunk) = (1 << 20, 1 << 18); // f32: 4 MiB in 1 MiB chunks
        let mut steps = Vec::new();
        all_reduce_ring(&mut steps, 0, 2, len, chunk);
        assert_eq!(PostAhead::peer(&steps, 4), Some(1));
        let point = posting_points(&steps, 1);
        // Rank 0 sends block 1's two chunks first, reduces into block 0,
        // and receives the reduced block 1 last: each chunk is posted once
        // its own send is out.
        let posted: Vec<(usize, usize)> = point
            .iter()
            .enumerate()
            .filter_map(|(i, p)| Some((i, (*p)?)))
            .collect();
        assert_eq!(posted, [(6, 1), (7, 2)]);
        assert_eq!(range_of(&steps[6]).start, len / 2);

        steps.clear();
        all_gather_ring(&mut steps, 0, 2, len, chunk);
        let point = posting_points(&steps, 1);
        assert!(point.iter().flatten().all(|&p| p == 0), "{point:?}");
    }

    #[test]
    fn an_exchange_posts_every_receive_before_its_first_send() {
        let (len, chunk) = (3 << 18, 1 << 18); // f32: 3 MiB each way in 1 MiB chunks
        let steps = crate::algo::schedule(|o| crate::algo::exchange(o, 1, len, 2, len + 5, chunk));
        assert_eq!(PostAhead::peer(&steps, 4), Some(2));
        let point = posting_points(&steps, 2);
        assert_eq!(point.iter().flatten().count(), 4, "{point:?}");
        assert!(point.iter().flatten().all(|&p| p == 0), "{point:?}");
    }

    #[test]
    fn a_broadcast_chain_posts_every_chunk_it_forwards_at_once() {
        let (len, chunk) = (1 << 20, 1 << 16);
        let mut steps = Vec::new();
        for rank in 0..4 {
            steps.clear();
            broadcast_chain(&mut steps, rank, 4, 1, len, chunk);
            let Some(peer) = PostAhead::peer(&steps, 4) else {
                assert_eq!(rank, 1, "only the root receives nothing");
                continue;
            };
            let point = posting_points(&steps, peer);
            assert_eq!(point.iter().flatten().count(), len / chunk);
            assert!(point.iter().flatten().all(|&p| p == 0), "{point:?}");
        }
    }

    #[test]
    fn posted_receives_keep_clear_of_every_step_that_touches_them() {
        let mut steps = Vec::new();
        for world in 2..=5 {
            for rank in 0..world {
                for len in [0, 5, 70_001, 1 << 20] {
                    for chunk in [1 << 12, 1 << 16] {
                        steps.clear();
                        all_reduce_ring(&mut steps, rank, world, len, chunk);
                        let peer = PostAhead::peer(&steps, 4);
                        // Receives below 64 KiB in all are not posted.
                        let copied = len - crate::algo::block(len, world, 0).len();
                        if len * 4 < POST_AHEAD_BYTES || copied * 4 >= POST_AHEAD_BYTES * 2 {
                            assert_eq!(peer.is_some(), len * 4 >= POST_AHEAD_BYTES, "{len}");
                        }
                        if let Some(peer) = peer {
                            posting_points(&steps, peer);
                        }
                        steps.clear();
                        all_gather_ring(&mut steps, rank, world, len, chunk);
                        if let Some(peer) = PostAhead::peer(&steps, 4) {
                            posting_points(&steps, peer);
                        }
                        // Reduce-scatter receives reduce: nothing to post.
                        steps.clear();
                        reduce_scatter_ring(&mut steps, rank, world, len, chunk);
                        assert_eq!(PostAhead::peer(&steps, 4), None);
                    }
                }
            }
        }
    }
}
