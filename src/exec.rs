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
use crate::transport::{LinkError, Received, Transport};
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
}

impl OpSignature {
    fn header(&self) -> Header {
        let mut h = Header::data(self.comm_id, self.seq, self.op, self.dtype)
            .with_root(self.root)
            .with_count(self.count.unwrap_or(0));
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
        if matches!(op, OpKind::Broadcast | OpKind::Reduce) {
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

/// Bytes moved by one op, for stats.
#[derive(Default, Clone, Copy)]
pub(crate) struct Traffic {
    pub(crate) sent: u64,
    pub(crate) received: u64,
}

/// A trailing run of copy receives at least this large is posted before
/// the steps ahead of it (see [`PostedTail`]); smaller ones are not worth
/// the bookkeeping.
const POST_AHEAD_BYTES: usize = 64 << 10;

/// Runs `steps` on `work`. `members` maps communicator ranks to the
/// transport's (world) ranks.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run<T: Element>(
    transport: &dyn Transport,
    members: &[usize],
    sig: &OpSignature,
    ctx: &OpContext,
    steps: &[Step],
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
    let elem = size_of::<T>();
    let Some(tail) = PostedTail::find(steps, elem) else {
        return op.steps(steps, &mut Parts::whole(work), traffic);
    };
    op.steps(&steps[..tail.post_at], &mut Parts::whole(work), traffic)?;
    let (before, rest) = work.split_at_mut(tail.region.start);
    let (region, after) = rest.split_at_mut(tail.region.len());
    let mut parts = Parts {
        before,
        after,
        after_start: tail.region.end,
    };
    let (middle, tail_steps) = steps[tail.post_at..].split_at(tail.first - tail.post_at);
    let mut pieces = tail_steps.iter().filter_map(|s| match s {
        Step::Recv {
            range, step, chunk, ..
        } => Some((
            (sig.seq, *step, *chunk),
            (range.start - tail.region.start) * elem,
            range.len() * elem,
        )),
        Step::Send { .. } => None,
    });
    transport.with_posted_recvs(
        sig.comm_id,
        members[tail.peer],
        &mut pieces,
        region.as_mut_bytes(),
        op.deadline,
        &mut |posted| {
            op.steps(middle, &mut parts, traffic)?;
            // The piece last received: the tail's sends forward it.
            let mut piece: &mut [T] = &mut [];
            for s in tail_steps {
                match s {
                    Step::Recv {
                        peer,
                        range,
                        step,
                        chunk,
                        action,
                    } => {
                        let (offset, len) =
                            ((range.start - tail.region.start) * elem, range.len() * elem);
                        let (received, bytes) = posted
                            .next((sig.seq, *step, *chunk), offset, len, op.deadline)
                            .map_err(|e| op.link_error(e, *peer))?;
                        let dest = <[T]>::mut_from_bytes(bytes).map_err(|_| {
                            op.internal(format!("a posted piece of {len} bytes is not {range:?}"))
                        })?;
                        op.finish_recv(received, *peer, dest, *step, *chunk, *action, traffic)?;
                        piece = dest;
                    }
                    Step::Send {
                        peer,
                        range,
                        step,
                        chunk,
                    } => {
                        if range.len() != piece.len() {
                            return Err(op.internal(format!(
                                "a posted tail sends {range:?}, not the piece it received"
                            )));
                        }
                        op.send(*peer, piece, *step, *chunk, traffic)?;
                    }
                }
            }
            Ok(())
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
        work: &mut Parts<'_, T>,
        traffic: &mut Traffic,
    ) -> Result<(), Error> {
        for step in steps {
            match step {
                Step::Send {
                    peer,
                    range,
                    step,
                    chunk,
                } => {
                    let payload = work.get(range.clone()).ok_or_else(|| self.outside(range))?;
                    self.send(*peer, payload, *step, *chunk, traffic)?;
                }
                Step::Recv {
                    peer,
                    range,
                    step,
                    chunk,
                    action,
                } => {
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
                        Action::Reduce => self
                            .transport
                            .recv(self.sig.comm_id, self.members[*peer], self.deadline)
                            .map(Received::Frame),
                    }
                    .map_err(|e| self.link_error(e, *peer))?;
                    self.finish_recv(received, *peer, dest, *step, *chunk, *action, traffic)?;
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
    /// applies it to `dest` unless it landed there already.
    #[allow(clippy::too_many_arguments)]
    fn finish_recv<T: Element>(
        &self,
        received: Received,
        peer: usize,
        dest: &mut [T],
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
        action.apply(dest, data, op);
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
}

/// The work buffer less a region handed to posted receives: the part
/// before it and the part after it (all of it when nothing is posted).
struct Parts<'a, T> {
    before: &'a mut [T],
    after: &'a mut [T],
    /// Where `after` starts in the whole buffer.
    after_start: usize,
}

impl<'a, T> Parts<'a, T> {
    fn whole(work: &'a mut [T]) -> Parts<'a, T> {
        let after_start = work.len();
        Parts {
            before: work,
            after: &mut [],
            after_start,
        }
    }

    /// `range` of the whole buffer, if it lies in one part.
    fn get(&mut self, range: Range<usize>) -> Option<&mut [T]> {
        if range.end <= self.before.len() {
            return self.before.get_mut(range);
        }
        let start = range.start.checked_sub(self.after_start)?;
        self.after.get_mut(start..range.end - self.after_start)
    }
}

/// The receives that end a schedule, posted early. In a ring's all-gather
/// phase and a broadcast chain the peer's chunks arrive while this rank
/// still reduces or forwards earlier ones; posted only when reached, most
/// would have arrived and cost a copy out of a pooled buffer.
#[derive(Debug, PartialEq)]
struct PostedTail {
    /// First step run after posting: the one after the last step that
    /// touches `region`, so nothing still reads the memory the receives
    /// overwrite.
    post_at: usize,
    /// First step of the tail.
    first: usize,
    /// The peer every tail receive is from.
    peer: usize,
    /// Elements spanned by the tail's receives (they need not cover it).
    region: Range<usize>,
}

impl PostedTail {
    /// The schedule's trailing groups of a copy receive from one peer
    /// followed by sends that forward exactly what it received, if their
    /// receives hold at least [`POST_AHEAD_BYTES`].
    fn find(steps: &[Step], elem: usize) -> Option<PostedTail> {
        let mut peer = None;
        let (mut start, mut end, mut bytes) = (usize::MAX, 0, 0);
        let mut first = steps.len();
        loop {
            let sends = steps[..first]
                .iter()
                .rev()
                .take_while(|s| matches!(s, Step::Send { .. }))
                .count();
            let Some(Step::Recv {
                peer: from,
                range,
                action: Action::Copy,
                ..
            }) = (first - sends).checked_sub(1).map(|i| &steps[i])
            else {
                break;
            };
            let forwards = |s: &Step| matches!(s, Step::Send { range: r, .. } if r == range);
            if *peer.get_or_insert(*from) != *from
                || !steps[first - sends..first].iter().all(forwards)
            {
                break;
            }
            (start, end) = (start.min(range.start), end.max(range.end));
            bytes += range.len() * elem;
            first -= sends + 1;
        }
        if bytes < POST_AHEAD_BYTES {
            return None;
        }
        let region = start..end;
        let touches = |s: &Step| {
            let r = match s {
                Step::Send { range, .. } | Step::Recv { range, .. } => range,
            };
            !r.is_empty() && r.start < region.end && region.start < r.end
        };
        let post_at = steps[..first]
            .iter()
            .rposition(touches)
            .map_or(0, |i| i + 1);
        Some(PostedTail {
            post_at,
            first,
            peer: peer?,
            region,
        })
    }
}

fn link_error(
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
        LinkError::Timeout => Error::Timeout {
            ctx: ctx.clone(),
            peer,
            waited: started.elapsed(),
            detail: String::new(),
        },
        LinkError::Lost(reason) => Error::PeerLost {
            ctx: ctx.clone(),
            peer,
            reason,
        },
        LinkError::Connect { addr, detail } => Error::Connect {
            peer,
            addr,
            detail: format!("during {ctx}: {detail}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::{all_gather_ring, all_reduce_ring, broadcast_chain, reduce_scatter_ring};

    fn range_of(s: &Step) -> Range<usize> {
        match s {
            Step::Send { range, .. } | Step::Recv { range, .. } => range.clone(),
        }
    }

    /// What `find` promises: the tail is copy receives from one peer, each
    /// followed only by sends of what it received; their pieces lie in the
    /// region, apart; nothing from `post_at` on touches the region before
    /// the tail; and the step just before `post_at` does.
    fn check(steps: &[Step], t: &PostedTail) {
        let mut received: Option<Range<usize>> = None;
        let mut pieces = Vec::new();
        for s in &steps[t.first..] {
            match s {
                Step::Recv {
                    peer,
                    range,
                    action: Action::Copy,
                    ..
                } => {
                    assert_eq!(*peer, t.peer, "{s:?}");
                    assert!(t.region.start <= range.start && range.end <= t.region.end);
                    pieces.push(range.clone());
                    received = Some(range.clone());
                }
                Step::Send { range, .. } => assert_eq!(Some(range), received.as_ref()),
                other => panic!("tail step {other:?}"),
            }
        }
        pieces.sort_by_key(|r| r.start);
        assert!(
            pieces.windows(2).all(|w| w[0].end <= w[1].start),
            "{pieces:?}"
        );
        let overlaps = |s: &Step| {
            let r = range_of(s);
            !r.is_empty() && r.start < t.region.end && t.region.start < r.end
        };
        assert!(!steps[t.post_at..t.first].iter().any(overlaps));
        if t.post_at > 0 {
            assert!(overlaps(&steps[t.post_at - 1]));
        }
    }

    #[test]
    fn a_two_rank_ring_posts_its_all_gather_half_once_its_own_sends_are_out() {
        let (len, chunk) = (1 << 20, 1 << 18); // f32: 4 MiB in 1 MiB chunks
        let mut steps = Vec::new();
        all_reduce_ring(&mut steps, 0, 2, len, chunk);
        let t = PostedTail::find(&steps, 4).expect("the all-gather half is posted");
        check(&steps, &t);
        // Rank 0 sends block 1 in the first step, reduces into block 0,
        // and receives the reduced block 1 last.
        assert_eq!(t.region, len / 2..len);
        assert_eq!((t.post_at, t.first, t.peer), (2, 6, 1));

        steps.clear();
        all_gather_ring(&mut steps, 0, 2, len, chunk);
        let t = PostedTail::find(&steps, 4).expect("the peer's block is posted");
        check(&steps, &t);
        assert_eq!((t.region, t.post_at), (len..2 * len, 0));
    }

    #[test]
    fn a_broadcast_chain_posts_every_chunk_it_forwards() {
        let (len, chunk) = (1 << 20, 1 << 16);
        let mut steps = Vec::new();
        for rank in 0..4 {
            steps.clear();
            broadcast_chain(&mut steps, rank, 4, 1, len, chunk);
            let found = PostedTail::find(&steps, 4);
            if rank == 1 {
                assert_eq!(found, None, "the root receives nothing");
                continue;
            }
            let t = found.expect("every other rank posts the whole buffer");
            check(&steps, &t);
            assert_eq!((t.region, t.post_at, t.first), (0..len, 0, 0));
        }
    }

    #[test]
    fn posted_tails_keep_clear_of_every_step_that_touches_them() {
        let mut steps = Vec::new();
        for world in 2..=5 {
            for rank in 0..world {
                for len in [0, 5, 70_001, 1 << 20] {
                    for chunk in [1 << 12, 1 << 16] {
                        steps.clear();
                        all_reduce_ring(&mut steps, rank, world, len, chunk);
                        let found = PostedTail::find(&steps, 4);
                        if world == 2 {
                            // The whole all-gather phase: the other half.
                            let own = crate::algo::block(len, world, (rank + 1) % world).len();
                            let posts = (len - own) * 4 >= POST_AHEAD_BYTES;
                            assert_eq!(
                                found.is_some(),
                                posts,
                                "world {world} rank {rank} len {len}"
                            );
                        }
                        // (Larger rings run as a wavefront: at most its last
                        // rounds form a tail, which must keep clear too.)
                        if let Some(t) = &found {
                            check(&steps, t);
                        }
                        steps.clear();
                        all_gather_ring(&mut steps, rank, world, len, chunk);
                        if let Some(t) = &PostedTail::find(&steps, 4) {
                            check(&steps, t);
                        }
                        // Reduce-scatter receives reduce: nothing to post.
                        steps.clear();
                        reduce_scatter_ring(&mut steps, rank, world, len, chunk);
                        assert_eq!(PostedTail::find(&steps, 4), None);
                    }
                }
            }
        }
    }
}
