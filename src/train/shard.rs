//! Sharded parameters (ZeRO / FSDP style): each rank keeps 1/p of every
//! unit's parameters (a unit is a flat group, a layer say), the optimizer
//! runs on that shard, gradients are reduce-scattered into it, and the
//! whole unit is all-gathered ahead of its use, with a window of gathers
//! in flight.
//!
//! A communicator runs its ops in order, so all-gathers (forward's next
//! units) and reduce-scatters (backward's gradients) go on two
//! communicators of the same ranks ([`CommPair`]) and overlap each other,
//! as FSDP2 uses two streams.
//!
//! The hybrid layout ([`ShardedParams::hybrid`], HSDP's) shards within
//! groups of consecutive ranks and keeps a replica of each shard in every
//! group: a gradient shard is reduce-scattered in its group, then averaged
//! with its replicas across groups. A lost rank's shard then lives on in
//! the other groups: [`ShardedParams::recover`] goes on with the groups
//! still whole, as torchft's fault-tolerant HSDP does with its replica
//! groups.

use super::TrainError;
use crate::{Communicator, Element, PendingCollective, ReduceOp};
use std::ops::Range;

/// How a unit's flat vector is cut among the ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Padding {
    /// Padded with zeros to a multiple of the ranks: equal shards, plain
    /// all-gather and reduce-scatter (FSDP's layout).
    Pad,
    /// No padding: shards as `reduce_scatter` cuts (the first `len % p`
    /// ranks one element more), gathered with `all_gather_v`.
    Uneven,
}

/// Where each rank's shard of a flat vector of `len` elements is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardLayout {
    /// Elements in the whole vector.
    pub len: usize,
    /// Ranks it is split over.
    pub ranks: usize,
    /// Whether shards are padded to one length or uneven.
    pub padding: Padding,
}

impl ShardLayout {
    /// The flat vector's length with its padding.
    pub fn padded_len(&self) -> usize {
        match self.padding {
            Padding::Pad => self.len.div_ceil(self.ranks) * self.ranks,
            Padding::Uneven => self.len,
        }
    }

    /// Rank `rank`'s shard, as a range of the padded vector.
    pub fn shard(&self, rank: usize) -> Range<usize> {
        match self.padding {
            Padding::Pad => {
                let per = self.padded_len() / self.ranks;
                rank * per..(rank + 1) * per
            }
            Padding::Uneven => crate::algo::block(self.len, self.ranks, rank),
        }
    }

    /// Every rank's shard length.
    pub fn counts(&self) -> Vec<usize> {
        (0..self.ranks).map(|r| self.shard(r).len()).collect()
    }
}

/// Two communicators of the same ranks in the same order: all-gathers on
/// one, reduce-scatters on the other, so each overlaps the other.
#[derive(Clone, Debug)]
pub struct CommPair {
    /// Where all-gathers run.
    pub gather: Communicator,
    /// Where reduce-scatters run.
    pub reduce: Communicator,
}

impl CommPair {
    /// Two duplicates of `comm` (two splits that keep every rank and its
    /// rank). Collective.
    pub fn new(comm: &Communicator) -> Result<CommPair, crate::Error> {
        let dup = || -> Result<Communicator, crate::Error> {
            let c = comm.split(Some(0), comm.rank() as i64)?;
            Ok(c.expect("every rank passes a colour"))
        };
        Ok(CommPair {
            gather: dup()?,
            reduce: dup()?,
        })
    }
}

/// Which way a pass walks the units: forward prefetches the units after
/// the one gathered, backward the ones before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// First unit to last.
    Forward,
    /// Last unit to first.
    Backward,
}

enum Full<T: Element> {
    /// Not gathered; the buffer kept for the next gather.
    Released(Vec<T>),
    Gathering(PendingCollective<(Vec<T>, Vec<T>)>),
    Gathered(Vec<T>),
    /// Lost to a failed op.
    Gone,
}

enum GradShard<T: Element> {
    /// The full (padded) gradient buffer to write, and this rank's reduced
    /// shard.
    Idle(Vec<T>, Vec<T>),
    Reducing(PendingCollective<(Vec<T>, Vec<T>)>),
    /// The reduced shard being averaged with its replicas (hybrid layout).
    Replicating(Vec<T>, PendingCollective<Vec<T>>),
    Gone,
}

struct Unit<T: Element> {
    layout: ShardLayout,
    /// This rank's parameters (its shard).
    shard: Vec<T>,
    /// A copy of the shard as the gather's input (the shard stays with
    /// the optimizer meanwhile).
    send: Vec<T>,
    full: Full<T>,
    grads: GradShard<T>,
}

/// Units of parameters of type `T`, sharded over a [`CommPair`] (see the
/// module docs). Buffers are allocated once and reused.
pub struct ShardedParams<T: Element> {
    pair: CommPair,
    /// The ranks that hold this rank's shard in the other groups (the
    /// hybrid layout), this rank among them.
    replicas: Option<Communicator>,
    /// The job's ranks ([`Communicator::world_ranks`]) of each group, in
    /// the order the groups were made.
    groups: Vec<Vec<usize>>,
    units: Vec<Unit<T>>,
    window: usize,
}

/// What [`ShardedParams::recover`] made of this rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recovered {
    /// Its group is whole: it goes on, its shard averaged with the groups
    /// left.
    GoesOn,
    /// Its group lost a rank: it sits out (its shard is kept; the other
    /// groups go on without it).
    GroupBroken,
}

impl<T: Element> ShardedParams<T> {
    /// Units of `unit_lens` elements each, cut by `padding`, gathering at
    /// most `window` units ahead of the one in use. Collective (it makes
    /// the communicator pair).
    pub fn new(
        comm: &Communicator,
        unit_lens: &[usize],
        padding: Padding,
        window: usize,
    ) -> Result<ShardedParams<T>, TrainError> {
        Self::hybrid(comm, comm.world_size(), unit_lens, padding, window)
    }

    /// The hybrid layout (HSDP): `comm`'s ranks in groups of `group`
    /// consecutive ranks, each unit sharded within every group, each
    /// shard replicated across the groups; gradients averaged over every
    /// rank. `group` must divide the ranks (`group` = all of them is
    /// [`ShardedParams::new`]). Collective.
    pub fn hybrid(
        comm: &Communicator,
        group: usize,
        unit_lens: &[usize],
        padding: Padding,
        window: usize,
    ) -> Result<ShardedParams<T>, TrainError> {
        let size = comm.world_size();
        if group == 0 || !size.is_multiple_of(group) {
            return Err(TrainError::BadGroups { group, ranks: size });
        }
        let world = comm.world_ranks();
        let groups = world.chunks(group).map(<[usize]>::to_vec).collect();
        let (pair, replicas) = split_groups(comm, group, |_| true)?;
        let pair = pair.expect("every rank is in a group");
        Ok(ShardedParams {
            units: make_units(&pair, unit_lens, padding),
            pair,
            replicas,
            groups,
            window,
        })
    }

    /// Goes on after a lost rank, on `shrunk` (what
    /// [`Communicator::shrink`] made of the communicator this was made
    /// on): groups whose ranks are all in `shrunk` go on, on new
    /// communicators, their shards as they are and gradients averaged
    /// over them; a group that lost a rank sits out
    /// ([`Recovered::GroupBroken`]; its shards live on in the other
    /// groups). Gradients are zeroed and gathered parameters released
    /// (redo the failed step). Collective over `shrunk`; with the plain
    /// layout (one group) every rank is in the broken group.
    pub fn recover(&mut self, shrunk: &Communicator) -> Result<Recovered, TrainError> {
        let alive = shrunk.world_ranks();
        let whole: Vec<bool> = self
            .groups
            .iter()
            .map(|g| g.iter().all(|r| alive.contains(r)))
            .collect();
        let me = alive[shrunk.rank()];
        let mine = self
            .groups
            .iter()
            .position(|g| g.contains(&me))
            .expect("a member of the layout");
        let group = self.groups[mine].len();
        let (pair, replicas) = split_groups(shrunk, group, |r| {
            self.groups
                .iter()
                .position(|g| g.contains(&alive[r]))
                .is_some_and(|g| whole[g])
        })?;
        // Whatever was in flight failed with the old communicators.
        for unit in &mut self.units {
            let len = unit.layout.padded_len();
            let mine = unit.shard.len();
            unit.full = Full::Released(vec![T::default(); len]);
            unit.grads = GradShard::Idle(vec![T::default(); len], vec![T::default(); mine]);
            unit.send = vec![T::default(); mine];
        }
        let Some(pair) = pair else {
            return Ok(Recovered::GroupBroken);
        };
        self.pair = pair;
        self.replicas = replicas;
        self.groups = self
            .groups
            .iter()
            .zip(&whole)
            .filter(|(_, w)| **w)
            .map(|(g, _)| g.clone())
            .collect();
        Ok(Recovered::GoesOn)
    }
}

/// An op of the layout failed: every communicator of it is revoked, so
/// that the members waiting in another (a gather while a reduction failed,
/// or a shard's replicas in other groups) fail too, and reach the
/// agreement that follows (ULFM's revoke).
fn revoke(pair: &CommPair, replicas: &Option<Communicator>, e: crate::Error) -> TrainError {
    pair.gather.revoke();
    pair.reduce.revoke();
    if let Some(r) = replicas {
        r.revoke();
    }
    TrainError::from(e)
}

/// The communicators of `comm`'s groups of `group` consecutive ranks among
/// those `keep` takes (by rank in `comm`): this rank's group's pair, and
/// the communicator of its shard's replicas in the other groups (none with
/// a single group); nothing for a rank `keep` refuses. Collective.
fn split_groups(
    comm: &Communicator,
    group: usize,
    keep: impl Fn(usize) -> bool,
) -> Result<(Option<CommPair>, Option<Communicator>), TrainError> {
    let rank = comm.rank();
    let kept: Vec<usize> = (0..comm.world_size()).filter(|&r| keep(r)).collect();
    let at = kept.iter().position(|&r| r == rank);
    let colour = |c: usize| at.map(|_| c as u32);
    let key = rank as i64;
    let within = comm.split(at.and_then(|i| colour(i / group)), key)?;
    let across = comm.split(at.and_then(|i| colour(i % group)), key)?;
    let pair = within.as_ref().map(CommPair::new).transpose()?;
    let replicas = across.filter(|c| c.world_size() > 1);
    // Every rank takes part in the splits above, kept or not; a rank with
    // no group then has nothing.
    Ok((pair, replicas))
}

fn make_units<T: Element>(pair: &CommPair, unit_lens: &[usize], padding: Padding) -> Vec<Unit<T>> {
    let (rank, ranks) = (pair.gather.rank(), pair.gather.world_size());
    unit_lens
        .iter()
        .map(|&len| {
            let layout = ShardLayout {
                len,
                ranks,
                padding,
            };
            let mine = layout.shard(rank).len();
            Unit {
                layout,
                shard: vec![T::default(); mine],
                send: vec![T::default(); mine],
                full: Full::Released(vec![T::default(); layout.padded_len()]),
                grads: GradShard::Idle(
                    vec![T::default(); layout.padded_len()],
                    vec![T::default(); mine],
                ),
            }
        })
        .collect()
}

impl<T: Element> ShardedParams<T> {
    /// How unit `u` is cut.
    pub fn layout(&self, u: usize) -> ShardLayout {
        self.units[u].layout
    }

    /// The communicators gathers and reductions run on.
    pub fn comms(&self) -> &CommPair {
        &self.pair
    }

    /// Keeps this rank's shard of unit `u`'s full parameters `full`
    /// (every rank passes the same, after a broadcast say).
    pub fn load(&mut self, u: usize, full: &[T]) -> Result<(), TrainError> {
        let unit = &mut self.units[u];
        if full.len() != unit.layout.len {
            return Err(TrainError::WrongLength {
                param: format!("unit {u}"),
                expected: unit.layout.len,
                got: full.len(),
            });
        }
        let mine = unit.layout.shard(self.pair.gather.rank());
        let real = mine.start.min(full.len())..mine.end.min(full.len());
        let n = real.len();
        unit.shard[..n].copy_from_slice(&full[real]);
        unit.shard[n..].fill(T::default());
        Ok(())
    }

    fn revoke(&self, e: crate::Error) -> TrainError {
        revoke(&self.pair, &self.replicas, e)
    }

    /// Starts unit `u`'s all-gather, if it is not gathered or gathering.
    fn start_gather(&mut self, u: usize) {
        let comm = &self.pair.gather;
        let unit = &mut self.units[u];
        if !matches!(unit.full, Full::Released(_)) {
            return;
        }
        let Full::Released(out) = std::mem::replace(&mut unit.full, Full::Gone) else {
            unreachable!("just matched");
        };
        let mut send = std::mem::take(&mut unit.send);
        send.copy_from_slice(&unit.shard);
        unit.full = Full::Gathering(match unit.layout.padding {
            Padding::Pad => comm.all_gather(send, out),
            Padding::Uneven => comm.all_gather_v(send, out, &unit.layout.counts()),
        });
    }

    /// Unit `u`'s full parameters (without padding), gathering it if it is
    /// not gathered yet and waiting; then starts the gathers of the next
    /// `window` units in `direction` that are not in flight.
    pub fn gather(&mut self, u: usize, direction: Direction) -> Result<&[T], TrainError> {
        if matches!(self.units[u].full, Full::Released(_)) {
            self.start_gather(u);
        }
        if let Full::Gathering(_) = self.units[u].full {
            let Full::Gathering(pending) = std::mem::replace(&mut self.units[u].full, Full::Gone)
            else {
                unreachable!("just matched");
            };
            let (send, full) = pending.wait().map_err(|e| self.revoke(e))?;
            self.units[u].send = send;
            self.units[u].full = Full::Gathered(full);
        }
        let ahead: Vec<usize> = match direction {
            Direction::Forward => (u + 1..self.units.len()).take(self.window).collect(),
            Direction::Backward => (0..u).rev().take(self.window).collect(),
        };
        for next in ahead {
            self.start_gather(next);
        }
        match &self.units[u].full {
            Full::Gathered(full) => Ok(&full[..self.units[u].layout.len]),
            _ => Err(TrainError::Lost {
                what: format!("unit {u}'s parameters (an earlier gather failed)"),
            }),
        }
    }

    /// Frees unit `u`'s full parameters (resharding); the buffer is kept
    /// for its next gather. A gather in flight is waited for first.
    pub fn release(&mut self, u: usize) -> Result<(), TrainError> {
        let unit = &mut self.units[u];
        unit.full = match std::mem::replace(&mut unit.full, Full::Gone) {
            Full::Gathering(p) => {
                let (send, full) = p
                    .wait()
                    .map_err(|e| revoke(&self.pair, &self.replicas, e))?;
                unit.send = send;
                Full::Released(full)
            }
            Full::Gathered(full) | Full::Released(full) => Full::Released(full),
            Full::Gone => Full::Gone,
        };
        Ok(())
    }

    /// Unit `u`'s full gradient (without padding) to write before
    /// [`ShardedParams::reduce_grads`]. Refused while it is being reduced.
    pub fn grads_mut(&mut self, u: usize) -> Result<&mut [T], TrainError> {
        let unit = &mut self.units[u];
        match &mut unit.grads {
            GradShard::Idle(full, _) => Ok(&mut full[..unit.layout.len]),
            _ => Err(TrainError::InFlight {
                param: format!("unit {u}'s gradients"),
            }),
        }
    }

    /// Starts the reduce-scatter (average) of unit `u`'s gradients into
    /// this rank's gradient shard.
    pub fn reduce_grads(&mut self, u: usize) -> Result<(), TrainError> {
        let comm = &self.pair.reduce;
        let unit = &mut self.units[u];
        let GradShard::Idle(full, shard) = std::mem::replace(&mut unit.grads, GradShard::Gone)
        else {
            return Err(TrainError::InFlight {
                param: format!("unit {u}'s gradients"),
            });
        };
        unit.grads = GradShard::Reducing(comm.reduce_scatter(full, shard, ReduceOp::Avg));
        Ok(())
    }

    /// Waits for every reduce-scatter started (and, in the hybrid layout,
    /// for each shard's average with its replicas, started as its
    /// reduce-scatter ends).
    pub fn finish_grads(&mut self) -> Result<(), TrainError> {
        let (pair, replicas) = (&self.pair, &self.replicas);
        let failed =
            |u: usize| move |e| revoke(pair, replicas, e).context(format!("unit {u}'s gradients"));
        for (u, unit) in self.units.iter_mut().enumerate() {
            if let GradShard::Reducing(_) = unit.grads {
                let GradShard::Reducing(p) = std::mem::replace(&mut unit.grads, GradShard::Gone)
                else {
                    unreachable!("just matched");
                };
                let (full, shard) = p.wait().map_err(failed(u))?;
                unit.grads = match &self.replicas {
                    Some(replicas) => {
                        GradShard::Replicating(full, replicas.all_reduce(shard, ReduceOp::Avg))
                    }
                    None => GradShard::Idle(full, shard),
                };
            }
        }
        for (u, unit) in self.units.iter_mut().enumerate() {
            if let GradShard::Replicating(..) = unit.grads {
                let GradShard::Replicating(full, p) =
                    std::mem::replace(&mut unit.grads, GradShard::Gone)
                else {
                    unreachable!("just matched");
                };
                unit.grads = GradShard::Idle(full, p.wait().map_err(failed(u))?);
            }
        }
        Ok(())
    }

    /// Unit `u`'s parameter shard (to update) and its reduced gradient
    /// shard: what this rank's optimizer works on.
    pub fn shard_mut(&mut self, u: usize) -> Result<(&mut [T], &[T]), TrainError> {
        let unit = &mut self.units[u];
        match &unit.grads {
            GradShard::Idle(_, grads) => Ok((&mut unit.shard, grads)),
            _ => Err(TrainError::InFlight {
                param: format!("unit {u}'s gradients"),
            }),
        }
    }
}
