//! Collectives on the arena (`crate::arena`): for communicators whose
//! members share one host, small ops stage their input in shared memory
//! and every rank reads what it needs from every member's staging,
//! instead of passing frames hop by hop (issue 31, part 3; decision 0030).
//!
//! Whether a communicator uses its arena is voted once, in its first op
//! that could: every member says whether it has a slot and every other
//! member's arena mapped, over the links (frames of that op, step
//! [`VOTE_STEP`]); all yes, and its arena ops run there from then on.
//! Which ops could is a function of facts every rank agrees on (the job's
//! `arena_everywhere`, the members' host, the op's size), so every member
//! votes in the same op, and after the vote picks the same path.
//!
//! Reductions combine in rank order, 0 to p-1, on every rank: all ranks
//! get the same bits.

use super::context::{ArenaState, Ctx, Executor, VOTED_NO, VOTED_YES};
use crate::arena::exchange::{ArenaOp, CommArena, WaitError, Waiting};
use crate::arena::{Peer, STAGE_BYTES};
use crate::error::Error;
use crate::{Element, ReduceOp, algo};
use zerocopy::{FromBytes, IntoBytes};

/// The step number of the vote's frames (schedules' steps are far below).
const VOTE_STEP: u32 = u32::MAX - 1;

/// Where a member's slot epoch starts in the slot word it votes with.
const EPOCH_SHIFT: u32 = 8;

/// Largest reduction (all-reduce, reduce, reduce-scatter; the bytes each
/// rank stages, its whole input) that runs on the arena in one op. Above
/// it every rank reading every staged copy is slower (measured at 2 ranks
/// on the 2-core VM, docs/perf.md: all-reduce 1.14x at 8 KiB, 0.82x at
/// 16 KiB): reduce and reduce-scatter run over the links, all-reduce in
/// chunks ([`all_reduce_chunked`]).
pub(super) const ALL_REDUCE_MAX_BYTES: usize = 8 << 10;
/// The same for the ops that copy (broadcast, scatter: the root's input;
/// all-gather, gather, all-to-all: each rank's input): a placed receive
/// over the links copies once where the arena copies twice (broadcast
/// 1.37x at 4 KiB, 0.59x at 8 KiB).
pub(super) const COPY_MAX_BYTES: usize = 4 << 10;

/// Whether a broadcast of `bytes` over `size` ranks runs on the arena in
/// chunks ([`broadcast_chunked`]) once past the small tier: from 3 ranks
/// always (1.5-3.9x the links' tree and chain on a 16-core host, 16 KiB
/// to 64 MiB), at 2 ranks up to 64 KiB (1.2-1.3x; above it the link's
/// placed receive, one copy, was 1.1-1.2x the arena's two). All-gather
/// runs in chunks at every size past the small tier (decision 0032).
pub(super) fn broadcast_in_chunks(size: usize, bytes: usize) -> bool {
    size > 2 || bytes <= 64 << 10
}

/// Reductions read peers' staging through a buffer of this many bytes (a
/// piece stays in L1 while every rank's is combined into it).
const PIECE_BYTES: usize = 16 << 10;

/// Whether a communicator of these world ranks could use arenas: every
/// rank of the job has one, and its members share this host.
pub(super) fn could(world: &crate::world::World, members: &[usize]) -> bool {
    world.arena_everywhere
        && (2..=64).contains(&members.len())
        && members
            .iter()
            .all(|&w| w == world.rank || world.local_ranks.get(w).copied().unwrap_or(false))
}

impl Ctx<'_> {
    /// Runs `body` on the communicator's arena if this op takes it (its
    /// largest staged input `staged` bytes, at most `max`), voting first if
    /// the communicator has not. `Ok(false)`: the op runs over the links.
    pub(super) fn on_arena(
        &mut self,
        staged: usize,
        max: usize,
        body: impl FnOnce(&ArenaOp<'_>, &Waiting<'_>) -> Result<(), WaitError>,
    ) -> Result<bool, Error> {
        if staged > max.min(STAGE_BYTES) {
            return Ok(false);
        }
        self.on_arena_ops(|ops, w| ops.run(|op| body(op, w)))
    }

    /// Runs `body` on the communicator's arena, as a sequence of arena ops
    /// it starts itself ([`ArenaOps::run`]), voting first if the
    /// communicator has not. The caller decided the op may run there (a
    /// function of facts every member agrees on). `Ok(false)`: the op runs
    /// over the links.
    pub(super) fn on_arena_ops(
        &mut self,
        body: impl FnOnce(&mut ArenaOps<'_>, &Waiting<'_>) -> Result<(), WaitError>,
    ) -> Result<bool, Error> {
        let ex: &Executor = self.ex;
        // Held for the op: one op of a communicator runs at a time.
        let mut state = crate::locks::lock(&ex.arena);
        if matches!(*state, ArenaState::Unvoted) {
            *state = ArenaState::Off; // if the vote fails
            *state = self.vote()?;
            let vote = match *state {
                ArenaState::On(_) => VOTED_YES,
                _ => VOTED_NO,
            };
            ex.arena_vote
                .store(vote, std::sync::atomic::Ordering::Release);
        }
        let ArenaState::On(arena) = &mut *state else {
            return Ok(false);
        };
        let waiting = Waiting {
            transport: &*ex.world.transport,
            comm_id: ex.comm_id,
            members: &ex.members,
            deadline: self.started + self.timeout,
            crowded: ex.world.crowded,
            spin: ex.tunables.spin,
        };
        let mut ops = ArenaOps {
            arena,
            tag: self.arena_tag(),
            runs: 0,
            traffic: (0, 0),
        };
        let done = body(&mut ops, &waiting);
        // Traffic on the arena: bytes staged once for every reader count as
        // sent, bytes read from other ranks as received.
        self.traffic.sent += ops.traffic.0;
        self.traffic.received += ops.traffic.1;
        drop(state);
        done.map(|()| true).map_err(|e| self.wait_error(e))
    }

    /// The op's signature as one word, the same on every rank that runs
    /// the same collective: a member whose tag differs runs another.
    fn arena_tag(&self) -> u64 {
        let s = &self.sig;
        let kind = s.op as u64
            | (s.dtype as u64) << 8
            | s.reduce_op.map_or(0xff, |r| r as u64) << 16
            | u64::from(s.root) << 24;
        super::context::mix(s.comm_id ^ kind, s.count.unwrap_or(u64::MAX))
    }

    fn wait_error(&self, e: WaitError) -> Error {
        match e {
            WaitError::Timeout(rank) => crate::exec::link_error(
                crate::transport::LinkError::Timeout,
                &self.op,
                rank,
                self.started,
                &self.ex.members,
            ),
            WaitError::Link(e, rank) => {
                crate::exec::link_error(e, &self.op, rank, self.started, &self.ex.members)
            }
            WaitError::Mismatch { rank } => Error::Mismatch {
                ctx: self.op.clone(),
                peer: rank,
                detail: format!(
                    "rank {rank} runs another collective on shared memory (its kind, type, count, \
                     reduce op or root differs from {}); every rank must call the same \
                     collectives in the same order with the same arguments",
                    self.op
                ),
            },
        }
    }

    /// The vote: each member says whether it can run on the arena (a free
    /// slot, every other member's arena mapped) and which slot it took.
    fn vote(&mut self) -> Result<ArenaState, Error> {
        let ex: &Executor = self.ex;
        let (me, size) = (ex.rank, ex.size);
        let transport = &*ex.world.transport;
        let deadline = self.started + self.timeout;
        let slot = transport
            .arena()
            .and_then(|arena| arena.take_slot(|w| transport.link_failure(w).is_some()));
        let mut ok = slot.is_some();
        let mut mappings = Vec::with_capacity(size);
        for (r, &w) in ex.members.iter().enumerate() {
            if r == me {
                mappings.push(slot.as_ref().map(|s| s.mapping().clone()));
                continue;
            }
            let mapped = transport
                .peer_arena(w, ex.comm_id, deadline)
                .map_err(|e| crate::exec::link_error(e, &self.op, r, self.started, &ex.members))?;
            ok &= mapped.is_some();
            mappings.push(mapped);
        }
        let mut all = vec![0i64; 2 * size];
        all[2 * me] = i64::from(ok);
        // The slot's index below, its epoch above.
        all[2 * me + 1] = slot.as_ref().map_or(0, |s| {
            (s.index() as i64) | ((s.epoch() as i64) << EPOCH_SHIFT)
        });
        let mut steps = Vec::with_capacity(2 * size);
        for k in 1..size {
            let (to, from) = ((me + k) % size, (me + size - k) % size);
            steps.push(algo::Step::Send {
                peer: to,
                range: 2 * me..2 * me + 2,
                step: VOTE_STEP,
                chunk: 0,
            });
            steps.push(algo::Step::Recv {
                peer: from,
                range: 2 * from..2 * from + 2,
                step: VOTE_STEP,
                chunk: 0,
                action: algo::Action::Copy,
            });
        }
        self.run(&steps, &[], &mut all)?;
        let yes = (0..size).all(|r| all[2 * r] == 1);
        tracing::debug!(rank = me, comm = ex.comm_id, yes, "arena vote");
        match (yes, slot) {
            (true, Some(slot)) => {
                let members = mappings
                    .into_iter()
                    .enumerate()
                    .map(|(r, m)| Peer {
                        rank: ex.members[r],
                        arena: m.expect("voted yes: mapped"),
                        slot: (all[2 * r + 1] & ((1 << EPOCH_SHIFT) - 1)) as usize,
                        epoch: (all[2 * r + 1] >> EPOCH_SHIFT) as u64,
                    })
                    .collect();
                Ok(ArenaState::On(CommArena::new(slot, members, me)))
            }
            _ => Ok(ArenaState::Off),
        }
    }
}

/// The arena ops one collective runs (one for most; the chunked
/// all-reduce runs two per chunk), each with the collective's tag mixed
/// with its index, so a member running another collective is still seen.
pub(super) struct ArenaOps<'a> {
    arena: &'a mut CommArena,
    tag: u64,
    runs: u64,
    /// Bytes staged, and read from other ranks, by the ops so far.
    traffic: (u64, u64),
}

impl ArenaOps<'_> {
    /// Runs the collective's next arena op: `body` publishes, waits and
    /// reads through it; counted done if `body` succeeds.
    pub(super) fn run<R>(
        &mut self,
        body: impl FnOnce(&ArenaOp<'_>) -> Result<R, WaitError>,
    ) -> Result<R, WaitError> {
        let tag = match self.runs {
            0 => self.tag,
            i => super::context::mix(self.tag, i),
        };
        self.runs += 1;
        let op = self.arena.op(tag);
        let done = body(&op);
        let (sent, received) = op.traffic();
        self.traffic.0 += sent;
        self.traffic.1 += received;
        if done.is_ok() {
            op.finish();
        }
        done
    }
}

fn bytes_of<T: Element>(n: usize) -> usize {
    n * size_of::<T>()
}

/// Combines every rank's staged `len` elements (`staged` bytes each) into
/// `out`, in rank order; `out` may hold this rank's own input on entry,
/// which is staged too.
fn combine<T: Element>(
    op: &ArenaOp<'_>,
    ranks: usize,
    staged: usize,
    from: usize,
    out: &mut [T],
    reduce: ReduceOp,
) {
    // Tiny ops (the common case: a loss, a flag) read through a buffer on
    // the stack; zeroing 16 KiB per op cost more than the exchange.
    if size_of_val(out) <= TINY_BYTES {
        let mut words = [0u64; TINY_BYTES / 8];
        return combine_through(op, ranks, staged, from, out, reduce, &mut words);
    }
    PIECE.with_borrow_mut(|words| {
        if words.is_empty() {
            words.resize(PIECE_BYTES / 8, 0);
        }
        combine_through(op, ranks, staged, from, out, reduce, words)
    });
}

/// Ops up to this many bytes combine through a buffer on the stack.
const TINY_BYTES: usize = 256;

thread_local! {
    /// The buffer larger reductions read peers' pieces through, kept per
    /// thread (ops of one thread run one at a time).
    static PIECE: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn combine_through<T: Element>(
    op: &ArenaOp<'_>,
    ranks: usize,
    staged: usize,
    from: usize,
    out: &mut [T],
    reduce: ReduceOp,
    words: &mut [u64],
) {
    let piece = size_of_val(words) / size_of::<T>();
    let mut at = 0;
    while at < out.len() {
        let end = (at + piece).min(out.len());
        let dst = &mut out[at..end];
        let offset = bytes_of::<T>(from + at);
        op.read(0, staged, offset, dst.as_mut_bytes());
        let buf = <[T]>::mut_from_bytes(&mut words.as_mut_bytes()[..size_of_val(dst)])
            .expect("8-byte words hold any element type");
        for r in 1..ranks {
            op.read(r, staged, offset, buf.as_mut_bytes());
            T::reduce_into(dst, buf, reduce);
        }
        at = end;
    }
}

pub(super) fn all_reduce<T: Element>(
    op: &ArenaOp<'_>,
    w: &Waiting<'_>,
    size: usize,
    data: &mut [T],
    reduce: ReduceOp,
) -> Result<(), WaitError> {
    op.publish(data.as_bytes(), w)?;
    combine_all(op, w, size, size_of_val(data), 0, data, reduce)
}

/// All-reduce in chunks of the staging (the large tier): for each chunk,
/// every rank stages its input, then reduces its share of the chunk
/// (`algo::block`) from every rank's staged copy, in rank order, and
/// stages the result; then every rank copies each rank's reduced share
/// into its output. Two arena ops per chunk; each element is combined by
/// one rank, so all ranks get the same bits. Each rank copies about three
/// times its input (stage, read for its share, read the shares) and waits
/// twice per chunk, where the ring over the links passes 2(p-1) steps.
pub(super) fn all_reduce_chunked<T: Element>(
    ops: &mut ArenaOps<'_>,
    w: &Waiting<'_>,
    (rank, size): (usize, usize),
    data: &mut [T],
    reduce: ReduceOp,
) -> Result<(), WaitError> {
    let per = STAGE_BYTES / size_of::<T>();
    for chunk in data.chunks_mut(per) {
        let share = algo::block(chunk.len(), size, rank);
        let staged = size_of_val(chunk);
        let own = bytes_of::<T>(share.start)..bytes_of::<T>(share.end);
        ops.run(|op| {
            // Its own share only this rank reads: not staged.
            op.publish_except(chunk.as_bytes(), own, w)?;
            op.wait(op.others(), w)?;
            combine_share(
                op,
                (rank, size),
                staged,
                share.start,
                &mut chunk[share.clone()],
                reduce,
            );
            Ok(())
        })?;
        let mine = &mut chunk[share.clone()];
        if reduce == ReduceOp::Avg {
            T::finish_avg(mine, size);
        }
        ops.run(|op| {
            op.publish(chunk[share.clone()].as_bytes(), w)?;
            op.wait(op.others(), w)?;
            for r in (0..size).filter(|&r| r != rank) {
                let theirs = algo::block(chunk.len(), size, r);
                let dst = &mut chunk[theirs];
                op.read(r, size_of_val(dst), 0, dst.as_mut_bytes());
            }
            Ok(())
        })?;
    }
    Ok(())
}

/// The first `n` elements of `words`.
fn as_elements<T: Element>(words: &mut [u64], n: usize) -> &mut [T] {
    <[T]>::mut_from_bytes(&mut words.as_mut_bytes()[..bytes_of::<T>(n)])
        .expect("8-byte words hold any element type")
}

/// Combines elements `from..` of every rank's staged chunk (`staged` bytes
/// each) into `mine` in rank order, `mine` holding this rank's own
/// elements on entry (not staged): through two buffers, unless this rank
/// is the first.
fn combine_share<T: Element>(
    op: &ArenaOp<'_>,
    (rank, ranks): (usize, usize),
    staged: usize,
    from: usize,
    mine: &mut [T],
    reduce: ReduceOp,
) {
    PIECE.with_borrow_mut(|words| {
        if words.is_empty() {
            words.resize(PIECE_BYTES / 8, 0);
        }
        let (acc, buf) = words.split_at_mut(PIECE_BYTES / 16);
        let piece = size_of_val(acc) / size_of::<T>();
        for (i, own) in mine.chunks_mut(piece).enumerate() {
            let offset = bytes_of::<T>(from + i * piece);
            let buf = as_elements::<T>(buf, own.len());
            if rank == 0 {
                for r in 1..ranks {
                    op.read(r, staged, offset, buf.as_mut_bytes());
                    T::reduce_into(own, buf, reduce);
                }
                continue;
            }
            let acc = as_elements::<T>(acc, own.len());
            op.read(0, staged, offset, acc.as_mut_bytes());
            for r in 1..ranks {
                match r == rank {
                    true => T::reduce_into(acc, own, reduce),
                    false => {
                        op.read(r, staged, offset, buf.as_mut_bytes());
                        T::reduce_into(acc, buf, reduce);
                    }
                }
            }
            own.copy_from_slice(acc);
        }
    });
}

pub(super) fn reduce<T: Element>(
    op: &ArenaOp<'_>,
    w: &Waiting<'_>,
    (rank, size): (usize, usize),
    root: usize,
    data: &mut [T],
    reduce: ReduceOp,
) -> Result<(), WaitError> {
    op.publish(data.as_bytes(), w)?;
    if rank != root {
        return Ok(());
    }
    combine_all(op, w, size, size_of_val(data), 0, data, reduce)
}

pub(super) fn reduce_scatter<T: Element>(
    op: &ArenaOp<'_>,
    w: &Waiting<'_>,
    (rank, size): (usize, usize),
    input: &[T],
    output: &mut [T],
    reduce: ReduceOp,
) -> Result<(), WaitError> {
    let mine = algo::block(input.len(), size, rank);
    op.publish(input.as_bytes(), w)?;
    combine_all(op, w, size, size_of_val(input), mine.start, output, reduce)
}

/// Waits for every other rank's staging, then combines elements `from..`
/// of every rank's (`staged` bytes each) into `out` and finishes an
/// average.
fn combine_all<T: Element>(
    op: &ArenaOp<'_>,
    w: &Waiting<'_>,
    size: usize,
    staged: usize,
    from: usize,
    out: &mut [T],
    reduce: ReduceOp,
) -> Result<(), WaitError> {
    op.wait(op.others(), w)?;
    combine(op, size, staged, from, out, reduce);
    if reduce == ReduceOp::Avg {
        T::finish_avg(out, size);
    }
    Ok(())
}

pub(super) fn broadcast<T: Element>(
    op: &ArenaOp<'_>,
    w: &Waiting<'_>,
    rank: usize,
    root: usize,
    data: &mut [T],
) -> Result<(), WaitError> {
    if rank == root {
        return op.publish(data.as_bytes(), w);
    }
    receive_from(op, w, root, size_of_val(data), 0, data.as_mut_bytes())
}

/// Broadcast in chunks of the staging: one arena op per chunk, the root
/// staging it and every other rank reading it (the root runs up to
/// `DEPTH - 1` chunks ahead of its slowest reader).
pub(super) fn broadcast_chunked<T: Element>(
    ops: &mut ArenaOps<'_>,
    w: &Waiting<'_>,
    rank: usize,
    root: usize,
    data: &mut [T],
) -> Result<(), WaitError> {
    for chunk in data.chunks_mut(STAGE_BYTES / size_of::<T>()) {
        ops.run(|op| broadcast(op, w, rank, root, chunk))?;
    }
    Ok(())
}

pub(super) fn scatter<T: Element>(
    op: &ArenaOp<'_>,
    w: &Waiting<'_>,
    (rank, size): (usize, usize),
    root: usize,
    input: &[T],
    output: &mut [T],
) -> Result<(), WaitError> {
    let n = output.len();
    if rank == root {
        op.publish(input.as_bytes(), w)?;
        output.copy_from_slice(&input[rank * n..(rank + 1) * n]);
        return Ok(());
    }
    let (staged, at) = (bytes_of::<T>(n * size), bytes_of::<T>(rank * n));
    receive_from(op, w, root, staged, at, output.as_mut_bytes())
}

/// A rank that stages nothing: publishes that, waits for `root`, and
/// copies `dst.len()` bytes at `offset` of its staging (`staged` bytes).
fn receive_from(
    op: &ArenaOp<'_>,
    w: &Waiting<'_>,
    root: usize,
    staged: usize,
    offset: usize,
    dst: &mut [u8],
) -> Result<(), WaitError> {
    op.publish(&[], w)?;
    op.wait(1 << root, w)?;
    op.read(root, staged, offset, dst);
    Ok(())
}

pub(super) fn all_gather<T: Element>(
    op: &ArenaOp<'_>,
    w: &Waiting<'_>,
    at: (usize, usize),
    input: &[T],
    output: &mut [T],
) -> Result<(), WaitError> {
    op.publish(input.as_bytes(), w)?;
    collect(op, w, at, input, 0, output)
}

/// All-gather in chunks of the staging: one arena op per chunk of every
/// rank's input, each rank staging its chunk and reading every other's
/// into its block of `output`.
pub(super) fn all_gather_chunked<T: Element>(
    ops: &mut ArenaOps<'_>,
    w: &Waiting<'_>,
    (rank, size): (usize, usize),
    input: &[T],
    output: &mut [T],
) -> Result<(), WaitError> {
    let n = input.len();
    output[rank * n..(rank + 1) * n].copy_from_slice(input);
    let per = STAGE_BYTES / size_of::<T>();
    for at in (0..n).step_by(per) {
        let piece = at..(at + per).min(n);
        ops.run(|op| {
            op.publish(input[piece.clone()].as_bytes(), w)?;
            op.wait(op.others(), w)?;
            for r in (0..size).filter(|&r| r != rank) {
                let dst = &mut output[r * n + piece.start..r * n + piece.end];
                op.read(r, size_of_val(dst), 0, dst.as_mut_bytes());
            }
            Ok(())
        })?;
    }
    Ok(())
}

pub(super) fn gather<T: Element>(
    op: &ArenaOp<'_>,
    w: &Waiting<'_>,
    at: (usize, usize),
    root: usize,
    input: &[T],
    output: &mut [T],
) -> Result<(), WaitError> {
    op.publish(input.as_bytes(), w)?;
    if at.0 != root {
        return Ok(());
    }
    collect(op, w, at, input, 0, output)
}

pub(super) fn all_to_all<T: Element>(
    op: &ArenaOp<'_>,
    w: &Waiting<'_>,
    (rank, size): (usize, usize),
    input: &[T],
    output: &mut [T],
) -> Result<(), WaitError> {
    let per = input.len() / size;
    op.publish(input.as_bytes(), w)?;
    collect(op, w, (rank, size), input, rank * per, output)
}

/// Fills `output`'s block of each rank (`output.len() / size` elements)
/// with the block at element `from` of what that rank staged (its whole
/// `input`, as this rank's): this rank's from `input` itself, the others'
/// once every one of them has published.
fn collect<T: Element>(
    op: &ArenaOp<'_>,
    w: &Waiting<'_>,
    (rank, size): (usize, usize),
    input: &[T],
    from: usize,
    output: &mut [T],
) -> Result<(), WaitError> {
    let n = output.len() / size;
    output[rank * n..(rank + 1) * n].copy_from_slice(&input[from..from + n]);
    op.wait(op.others(), w)?;
    for r in (0..size).filter(|&r| r != rank) {
        let block = output[r * n..(r + 1) * n].as_mut_bytes();
        op.read(r, size_of_val(input), bytes_of::<T>(from), block);
    }
    Ok(())
}

pub(super) fn barrier(op: &ArenaOp<'_>, w: &Waiting<'_>) -> Result<(), WaitError> {
    op.publish(&[], w)?;
    op.wait(op.others(), w)
}
