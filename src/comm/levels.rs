//! Two-level collectives (decision 0033): a communicator whose members
//! form two or more hosts of the same number of ranks runs a large
//! all-reduce as three ops on two groups it makes once, without a word to
//! its peers (every rank derives them from the hosts agreed at
//! rendezvous):
//!
//! 1. a reduce-scatter within the host (shared memory where it runs),
//! 2. an all-reduce of this local rank's shard across hosts, with the
//!    ranks of the same local rank on the other hosts (k such groups run
//!    side by side, so k ranks' flows and cores drive each host's link),
//! 3. an all-gather of the shards within the host.
//!
//! The groups are communicators of their own (their own op numbers and
//! comm ids), nested in this one at the transport: an abort of this one
//! aborts them, so a rank waiting in a group's op wakes when any rank's
//! two-level op fails. Their errors come back as this op's, their ranks
//! named as ranks of this communicator.

use super::context::mix;
use super::context::{CommKind, Ctx, Executor, Group, Levels};
use crate::Communicator;
use crate::algo::levels::{Costs, Grid};
use crate::config::TwoLevel;
use crate::error::{Error, OpContext};
use crate::locks::lock;
use crate::{Element, ReduceOp, algo};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where each level's op failed, for the error.
#[derive(Clone, Copy)]
enum Phase {
    HostReduceScatter,
    CrossAllReduce,
    HostAllGather,
    CrossReduceScatter,
    CrossAllGather,
    CrossBroadcast,
    HostBroadcast,
}

impl Phase {
    fn words(self) -> &'static str {
        match self {
            Phase::HostReduceScatter => "the reduce-scatter within the host",
            Phase::CrossAllReduce => "the all-reduce across hosts",
            Phase::HostAllGather => "the all-gather within the host",
            Phase::CrossReduceScatter => "the reduce-scatter across hosts",
            Phase::CrossAllGather => "the all-gather across hosts",
            Phase::CrossBroadcast => "the broadcast across hosts",
            Phase::HostBroadcast => "the broadcast within the host",
        }
    }
}

/// Salt of the groups' comm ids (host groups even, cross groups odd).
const LEVELS_SALT: u64 = 0x6c65_7665_6c73_3233;

impl Ctx<'_> {
    /// This communicator's levels, if its ops run in two levels under the
    /// settings and `pays` (the cost model, given the grid and costs)
    /// agrees; made at the first op that runs in two levels.
    pub(super) fn two_level(
        &self,
        pays: impl FnOnce(&Grid, &Costs) -> bool,
    ) -> Result<Option<Arc<Levels>>, Error> {
        let ex = self.ex;
        let Some(grid) = &ex.grid else {
            return Ok(None);
        };
        let wanted = match ex.tunables.two_level {
            TwoLevel::Never => false,
            TwoLevel::Always => true,
            TwoLevel::Auto => {
                let gbps = ex.tunables.inter_host_gbps;
                pays(
                    grid,
                    &Costs::with_link_gbps(gbps.unwrap_or(ex.world.inter_host_gbps)),
                )
            }
        };
        if !wanted {
            return Ok(None);
        }
        let mut made = lock(&ex.levels);
        if let Some(levels) = &*made {
            return Ok(Some(levels.clone()));
        }
        // A rank that cannot make its groups (a thread refused) must fail
        // the op as fatal, so its abort reaches the others.
        let levels = Levels::make(ex, grid.clone()).map_err(|e| Error::Internal {
            ctx: self.op.clone(),
            detail: format!("could not make the groups of a two-level op: {e}"),
        })?;
        let levels = Arc::new(levels);
        *made = Some(levels.clone());
        Ok(Some(levels))
    }
}

impl Levels {
    /// Bytes both groups have sent and received so far.
    fn bytes(&self) -> (u64, u64) {
        let (a, b) = self.host.comm.inner.stats.bytes();
        let (c, d) = self.cross.comm.inner.stats.bytes();
        (a + c, b + d)
    }

    /// Runs `op` (a two-level op) and counts its groups' bytes as the
    /// op's own, marking it two-level for the stats.
    pub(super) fn counted<R>(
        &self,
        cx: &mut Ctx<'_>,
        op: impl FnOnce(&mut Ctx<'_>) -> Result<R, Error>,
    ) -> Result<R, Error> {
        let (sent, received) = self.bytes();
        // Marked first: a failed op's error came from a group, which has
        // already asked the store who was missing (`execute` asks once).
        cx.traffic.two_level = true;
        let done = op(cx)?;
        let (sent_now, received_now) = self.bytes();
        cx.traffic.sent += sent_now - sent;
        cx.traffic.received += received_now - received;
        Ok(done)
    }

    fn make(ex: &Executor, grid: Grid) -> Result<Levels, Error> {
        let (h, l) = grid.place(ex.rank);
        let host = grid.host_group(ex.rank).to_vec();
        let cross = grid.cross_group(ex.rank);
        let group = |members: Vec<usize>, salt: u64| -> Result<Group, Error> {
            let comm_id = mix(mix(ex.comm_id, LEVELS_SALT), salt);
            let rank = members
                .iter()
                .position(|&m| m == ex.rank)
                .expect("a rank is in its own groups");
            let world_ranks = members.iter().map(|&m| ex.members[m]).collect();
            let comm = Communicator::start_group(
                ex.world.clone(),
                ex.tunables.clone(),
                rank,
                comm_id,
                Arc::new(world_ranks),
                CommKind::IN_TWO_LEVELS,
            )?;
            ex.world.transport.nest(ex.comm_id, comm_id);
            Ok(Group { comm, members })
        };
        Ok(Levels {
            host: group(host, 2 * h as u64)?,
            cross: group(cross, 2 * l as u64 + 1)?,
            grid,
        })
    }
}

/// The two-level all-reduce of `data` (see the module docs). Avg sums in
/// both levels and divides once, as the flat schedules do.
pub(super) fn all_reduce<T: Element>(
    cx: &mut Ctx<'_>,
    levels: &Levels,
    data: &mut [T],
    op: ReduceOp,
) -> Result<(), Error> {
    let size = cx.ex.size;
    let summed = summed(op);
    let pieces = algo::levels::pieces(size_of_val(data));
    match pieces {
        1 => all_reduce_whole(cx, levels, data, summed)?,
        _ => all_reduce_pipelined(cx, levels, data, summed, pieces)?,
    }
    if op == ReduceOp::Avg {
        T::finish_avg(data, size);
    }
    Ok(())
}

/// The operator both levels run: Avg sums, and the op divides once at
/// the end, as the flat schedules do.
fn summed(op: ReduceOp) -> ReduceOp {
    match op {
        ReduceOp::Avg => ReduceOp::Sum,
        other => other,
    }
}

/// What one level's op needs: the groups' communicators with what is left
/// of the op's time, and how to name their errors.
struct Run<'a> {
    levels: &'a Levels,
    ctx: OpContext,
    parent: Arc<Vec<usize>>,
    /// The parent op's deadline.
    deadline: Instant,
}

impl Run<'_> {
    fn time_left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// The host group, its ops bounded by the parent op's deadline.
    fn host(&self) -> Communicator {
        self.levels.host.comm.with_timeout(self.time_left())
    }

    /// The cross-host group, likewise.
    fn cross(&self) -> Communicator {
        self.levels.cross.comm.with_timeout(self.time_left())
    }

    fn lift_host(&self, e: Error, phase: Phase) -> Error {
        self.levels.host.lift(e, &self.ctx, &self.parent, phase)
    }

    fn lift_cross(&self, e: Error, phase: Phase) -> Error {
        self.levels.cross.lift(e, &self.ctx, &self.parent, phase)
    }

    fn reduce_scatter<T: Element>(
        &self,
        input: &[T],
        shard: &mut [T],
        op: ReduceOp,
    ) -> Result<(), Error> {
        self.host()
            .reduce_scatter_slice(input, shard, op)
            .map_err(|e| self.lift_host(e, Phase::HostReduceScatter))
    }

    fn all_gather<T: Element>(&self, shard: &[T], output: &mut [T]) -> Result<(), Error> {
        let (k, n) = (self.levels.grid.per_host, output.len());
        let gathered = match n % k {
            0 => self.host().all_gather_slice(shard, output),
            _ => {
                let counts: Vec<usize> = (0..k).map(|j| algo::block(n, k, j).len()).collect();
                self.host().all_gather_v_slice(shard, output, &counts)
            }
        };
        gathered.map_err(|e| self.lift_host(e, Phase::HostAllGather))
    }
}

fn run_of<'a>(cx: &Ctx<'_>, levels: &'a Levels) -> Run<'a> {
    Run {
        levels,
        ctx: cx.op.clone(),
        parent: cx.ex.members.clone(),
        deadline: cx.started + cx.timeout,
    }
}

/// The three phases one after another, the shard in the op's scratch.
fn all_reduce_whole<T: Element>(
    cx: &mut Ctx<'_>,
    levels: &Levels,
    data: &mut [T],
    op: ReduceOp,
) -> Result<(), Error> {
    let (_, local) = levels.grid.place(cx.ex.rank);
    let shard = algo::block(data.len(), levels.grid.per_host, local).len();
    let run = run_of(cx, levels);
    cx.with_scratch(shard, |_, mine: &mut [T]| {
        run.reduce_scatter(data, mine, op)?;
        run.cross()
            .all_reduce_slice(mine, op)
            .map_err(|e| run.lift_cross(e, Phase::CrossAllReduce))?;
        run.all_gather(mine, data)
    })
}

/// A piece's all-reduce across hosts, running on the cross group's
/// executor.
type InFlight<T> = (usize, crate::PendingCollective<Vec<T>>);

/// The phases over `pieces` pieces of `data`: piece j's reduce-scatter,
/// then piece j's all-reduce across hosts goes to the cross group's
/// executor, then piece j-1's all-gather (its all-reduce waited for), so
/// the link carries piece j while the host gathers piece j-1 and reduces
/// piece j+1. Every rank of a host runs its host's ops in the same order
/// (RS 0, RS 1, AG 0, RS 2, AG 1, ...), and every rank of a cross group
/// its all-reduces in piece order.
fn all_reduce_pipelined<T: Element>(
    cx: &mut Ctx<'_>,
    levels: &Levels,
    data: &mut [T],
    op: ReduceOp,
    pieces: usize,
) -> Result<(), Error> {
    let (_, local) = levels.grid.place(cx.ex.rank);
    let k = levels.grid.per_host;
    let n = data.len();
    let run = run_of(cx, levels);
    // Shards whose piece is done, for the next pieces (three at most).
    let mut spare: Vec<Vec<T>> = Vec::new();
    let mut in_flight: std::collections::VecDeque<InFlight<T>> = Default::default();
    // Waits for piece i's all-reduce across hosts and gathers it.
    let finish = |data: &mut [T], (i, pending): InFlight<T>, spare: &mut Vec<Vec<T>>| {
        let shard = pending
            .wait()
            .map_err(|e| run.lift_cross(e, Phase::CrossAllReduce))?;
        run.all_gather(&shard, &mut data[algo::block(n, pieces, i)])?;
        spare.push(shard);
        Ok::<_, Error>(())
    };
    for j in 0..pieces {
        let piece = algo::block(n, pieces, j);
        let mut shard = spare.pop().unwrap_or_default();
        shard.resize(algo::block(piece.len(), k, local).len(), T::default());
        run.reduce_scatter(&data[piece], &mut shard, op)?;
        in_flight.push_back((j, run.cross().all_reduce(shard, op)));
        if in_flight.len() > 1 {
            let earlier = in_flight.pop_front().expect("two in flight");
            finish(data, earlier, &mut spare)?;
        }
    }
    while let Some(last) = in_flight.pop_front() {
        finish(data, last, &mut spare)?;
    }
    Ok(())
}

/// The two-level reduce-scatter: each rank's block padded to the longest
/// (b elements) and the blocks reordered host-major by local rank
/// ([local][host]), so a reduce-scatter within the host leaves local rank
/// l the host's sums of its cross group's blocks, and a reduce-scatter
/// across hosts each rank its own. In pieces (a piece: the same stretch of
/// every block), pipelined as the all-reduce's, so the work space stays
/// about 1.75 pieces, not 1.75 times the input. Avg sums and divides once.
pub(super) fn reduce_scatter<T: Element>(
    cx: &mut Ctx<'_>,
    levels: &Levels,
    input: &[T],
    output: &mut [T],
    op: ReduceOp,
) -> Result<(), Error> {
    let size = cx.ex.size;
    let grid = &levels.grid;
    let (hosts, k) = (grid.hosts, grid.per_host);
    let n = input.len();
    let b = n.div_ceil(size);
    let pieces = algo::levels::pieces(size_of_val(input));
    let summed = summed(op);
    let longest = algo::block(b, pieces, 0).len();
    let run = run_of(cx, levels);
    cx.with_scratch(k * hosts * longest, |_, staging: &mut [T]| {
        let mut spare: Vec<Vec<T>> = Vec::new();
        let mut in_flight: Option<(usize, PendingPair<T>)> = None;
        let finish = |output: &mut [T],
                      in_flight: Option<(usize, PendingPair<T>)>,
                      spare: &mut Vec<Vec<T>>| {
            let Some((i, pending)) = in_flight else {
                return Ok(());
            };
            let (sums, mine) = pending
                .wait()
                .map_err(|e| run.lift_cross(e, Phase::CrossReduceScatter))?;
            let piece = algo::block(b, pieces, i);
            let end = piece.end.min(output.len());
            if piece.start < end {
                output[piece.start..end].copy_from_slice(&mine[..end - piece.start]);
            }
            spare.extend([sums, mine]);
            Ok::<_, Error>(())
        };
        for j in 0..pieces {
            let piece = algo::block(b, pieces, j);
            let len = piece.len();
            let staged = &mut staging[..k * hosts * len];
            for l in 0..k {
                for h in 0..hosts {
                    let block = algo::block(n, size, grid.member(h, l));
                    // This piece's stretch of the block, and padding past
                    // its end.
                    let from = (block.start + piece.start).min(block.end);
                    let to = (block.start + piece.end).min(block.end);
                    let slot = &mut staged[(l * hosts + h) * len..][..len];
                    let (dst, pad) = slot.split_at_mut(to - from);
                    dst.copy_from_slice(&input[from..to]);
                    pad.fill(T::default());
                }
            }
            let mut sums = spare.pop().unwrap_or_default();
            sums.resize(hosts * len, T::default());
            run.reduce_scatter(staged, &mut sums, summed)?;
            finish(output, in_flight.take(), &mut spare)?;
            let mut mine = spare.pop().unwrap_or_default();
            mine.resize(len, T::default());
            in_flight = Some((j, run.cross().reduce_scatter(sums, mine, summed)));
        }
        finish(output, in_flight.take(), &mut spare)
    })?;
    if op == ReduceOp::Avg {
        T::finish_avg(output, size);
    }
    Ok(())
}

/// A piece's reduce-scatter or all-gather across hosts in flight: its
/// input and output come back with it.
type PendingPair<T> = crate::PendingCollective<(Vec<T>, Vec<T>)>;

/// The two-level all-gather: across hosts first (each rank's block goes
/// over the link once per other host), then within the host (each rank
/// gets every host's blocks of every local rank, [local][host]), then
/// reordered into rank order. In pieces (the same stretch of every
/// block), the next piece's all-gather across hosts in flight while this
/// one's runs within the host.
pub(super) fn all_gather<T: Element>(
    cx: &mut Ctx<'_>,
    levels: &Levels,
    input: &[T],
    output: &mut [T],
) -> Result<(), Error> {
    let grid = &levels.grid;
    let (hosts, k) = (grid.hosts, grid.per_host);
    let m = input.len();
    let pieces = algo::levels::pieces(size_of_val(output));
    let longest = algo::block(m, pieces, 0).len();
    let run = run_of(cx, levels);
    cx.with_scratch(k * hosts * longest, |_, gathering: &mut [T]| {
        let mut spare: Vec<Vec<T>> = Vec::new();
        let launch = |j: usize, spare: &mut Vec<Vec<T>>| {
            let piece = algo::block(m, pieces, j);
            let mut mine = spare.pop().unwrap_or_default();
            mine.clear();
            mine.extend_from_slice(&input[piece.clone()]);
            let mut crossed = spare.pop().unwrap_or_default();
            crossed.resize(hosts * piece.len(), T::default());
            run.cross().all_gather(mine, crossed)
        };
        let mut next = Some(launch(0, &mut spare));
        for j in 0..pieces {
            let pending = next
                .take()
                .expect("each piece is launched before it is gathered");
            if j + 1 < pieces {
                next = Some(launch(j + 1, &mut spare));
            }
            let (mine, crossed) = pending
                .wait()
                .map_err(|e| run.lift_cross(e, Phase::CrossAllGather))?;
            let piece = algo::block(m, pieces, j);
            let len = piece.len();
            let hosted = &mut gathering[..k * hosts * len];
            run.all_gather(&crossed, hosted)?;
            for l in 0..k {
                for h in 0..hosts {
                    let at = grid.member(h, l) * m + piece.start;
                    output[at..at + len].copy_from_slice(&hosted[(l * hosts + h) * len..][..len]);
                }
            }
            spare.extend([mine, crossed]);
        }
        Ok(())
    })
}

/// The two-level broadcast from `root`: across hosts among the ranks of
/// the root's local rank (the others have no part in it), then within
/// each host from that local rank. Whole, not in pieces: the model picks
/// it where the flat tree or chain would cross hosts more (ranks placed
/// across hosts out of rank order), not to overlap the levels.
pub(super) fn broadcast<T: Element>(
    cx: &mut Ctx<'_>,
    levels: &Levels,
    data: &mut [T],
    root: usize,
) -> Result<(), Error> {
    let (root_host, root_local) = levels.grid.place(root);
    let (_, local) = levels.grid.place(cx.ex.rank);
    let run = run_of(cx, levels);
    if local == root_local {
        run.cross()
            .broadcast_slice(data, root_host)
            .map_err(|e| run.lift_cross(e, Phase::CrossBroadcast))?;
    }
    run.host()
        .broadcast_slice(data, root_local)
        .map_err(|e| run.lift_host(e, Phase::HostBroadcast))
}

impl Group {
    /// A level's error as the parent op's: its op context, its ranks as
    /// the parent's, and which level it came from.
    fn lift(&self, e: Error, ctx: &OpContext, parent: &[usize], phase: Phase) -> Error {
        let rank = |r: usize| self.members.get(r).copied().unwrap_or(r);
        // An abort's origin is a world rank where it is not a member: ask
        // the transport which world rank it was, and name it as the
        // parent's member where it is one.
        let origin_in_parent = |origin: usize| {
            let world = self
                .comm
                .inner
                .world
                .transport
                .abort_notice(self.comm.inner.comm_id);
            match world {
                Some((w, _, _)) => parent.iter().position(|&m| m == w).unwrap_or(w),
                None => origin,
            }
        };
        let renamed = match self.members.iter().enumerate().all(|(i, &m)| i == m) {
            true => String::new(),
            false => format!(
                ", where ranks {:?} are this communicator's {:?}",
                (0..self.members.len()).collect::<Vec<_>>(),
                self.members
            ),
        };
        let during = format!(" (in {} of a two-level {}{renamed})", phase.words(), ctx.op);
        let ctx = ctx.clone();
        match e {
            Error::Timeout {
                peer,
                waited,
                detail,
                ..
            } => Error::Timeout {
                ctx,
                peer: rank(peer),
                waited,
                detail: detail + &during,
            },
            Error::PeerLost {
                peer,
                reason,
                cause,
                ..
            } => Error::PeerLost {
                ctx,
                peer: rank(peer),
                reason: reason + &during,
                cause,
            },
            Error::Aborted {
                origin,
                origin_seq,
                reason,
                ..
            } => Error::Aborted {
                ctx,
                origin: origin_in_parent(origin),
                origin_seq,
                reason,
            },
            Error::Mismatch { peer, detail, .. } => Error::Mismatch {
                ctx,
                peer: rank(peer),
                detail: detail + &during,
            },
            Error::Internal { detail, .. } => Error::Internal {
                ctx,
                detail: detail + &during,
            },
            other => other,
        }
    }
}
