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
    units: Vec<Unit<T>>,
    window: usize,
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
        let pair = CommPair::new(comm)?;
        let (rank, ranks) = (comm.rank(), comm.world_size());
        let units = unit_lens
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
            .collect();
        Ok(ShardedParams {
            pair,
            units,
            window,
        })
    }

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
            let (send, full) = pending.wait()?;
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
                let (send, full) = p.wait()?;
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

    /// Waits for every reduce-scatter started.
    pub fn finish_grads(&mut self) -> Result<(), TrainError> {
        for (u, unit) in self.units.iter_mut().enumerate() {
            if let GradShard::Reducing(_) = unit.grads {
                let GradShard::Reducing(p) = std::mem::replace(&mut unit.grads, GradShard::Gone)
                else {
                    unreachable!("just matched");
                };
                let (full, shard) = p
                    .wait()
                    .map_err(|e| TrainError::from(e).context(format!("unit {u}'s gradients")))?;
                unit.grads = GradShard::Idle(full, shard);
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
