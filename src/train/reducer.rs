//! [`GradReducer`]: PyTorch DDP's reducer over ringwire, framework-free.
//!
//! Gradients live in bucket memory (the trainer writes or adds each
//! parameter's gradient into [`GradReducer::grad_mut`]); as backward marks
//! parameters ready, a bucket whose parameters are all ready is all-reduced
//! at once, in bucket order (every rank launches the same buckets in the
//! same order, whatever order its own gradients came in), so communication
//! overlaps the rest of backward; [`GradReducer::finish`] waits for the rest
//! and leaves the averaged gradients in place. Bucket memory is allocated
//! once and reused every step.

use super::TrainError;
use super::grads::{GradElement, Grads, InFlight};
use super::layout::{Caps, Layout, ParamId, assign_buckets, reverse_definition_order};
use super::stats::{StepStats, StepTimer};
use crate::half::{bf16, f16};
use crate::{Communicator, DType, Element, ReduceOp};

/// How a bucket travels and is combined (PyTorch's communication hooks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum CommHook {
    /// Averaged in the gradients' own type (sum, then one division: at two
    /// ranks every rank gets `(g0 + g1) / 2` exactly).
    #[default]
    Avg,
    /// f32 buckets travel as bf16 (half the bytes), summed in f32 at each
    /// hop, and come back as f32 divided by the ranks; other types as `Avg`.
    Bf16Wire,
    /// As `Bf16Wire`, with f16 on the wire.
    F16Wire,
}

/// What to do at [`GradReducer::finish`] with parameters never marked ready.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unused {
    /// Fail naming them (and abort the communicator, so ranks that did
    /// launch their buckets stop at once instead of waiting for this one).
    #[default]
    Error,
    /// Treat their gradients as zero (PyTorch's `find_unused_parameters`).
    Zero,
}

/// Settings of a [`GradReducer`]; every rank must use the same.
#[derive(Clone, Debug)]
pub struct ReducerConfig {
    /// Cap of every bucket but the last-launched, in bytes (PyTorch's
    /// `bucket_cap_mb`: 25 MiB).
    pub bucket_cap_bytes: usize,
    /// Cap of the bucket launched last, which holds the first-defined
    /// parameters (ready last), in bytes: small, so the tail after
    /// backward is short (1 MiB, as PyTorch).
    pub first_bucket_bytes: usize,
    /// What goes on the wire and how gradients are combined (an average
    /// by default; bf16 or f16 on the wire).
    pub hook: CommHook,
    /// Rebuild the buckets once, after the first synchronised step, from
    /// the order rank 0's gradients really arrived in (as PyTorch does).
    pub rebuild_buckets: bool,
    /// What a parameter never marked ready in a step means: an error by
    /// default, or a zero gradient.
    pub unused: Unused,
}

impl Default for ReducerConfig {
    fn default() -> ReducerConfig {
        ReducerConfig {
            bucket_cap_bytes: 25 << 20,
            first_bucket_bytes: 1 << 20,
            hook: CommHook::Avg,
            rebuild_buckets: true,
            unused: Unused::Error,
        }
    }
}

/// One bucket's parameters, as [`GradReducer::buckets`] reports them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketInfo {
    /// Its parameters, in bucket order.
    pub params: Vec<ParamId>,
    /// Their element type (a bucket holds one).
    pub dtype: DType,
    /// Its size.
    pub bytes: usize,
}

/// Where a bucket's memory is.
enum State {
    /// Here, to write gradients into or read results from.
    Idle(Grads),
    /// In an all-reduce.
    Reducing(InFlight),
    /// f32 gradients here while their 16-bit copy is in an all-reduce.
    Wire(Grads, InFlight),
    /// Between two states (only inside a method).
    Moving,
}

struct Bucket {
    params: Vec<ParamId>,
    dtype: DType,
    /// Parameters of this bucket marked ready this step.
    ready: usize,
    state: State,
    /// The 16-bit wire copy of an f32 bucket under a wire hook, kept.
    wire: Option<Grads>,
}

/// The data-parallel gradient reducer (see the module docs).
pub struct GradReducer {
    comm: Communicator,
    layout: Layout,
    config: ReducerConfig,
    buckets: Vec<Bucket>,
    /// Per parameter: its bucket and its offset there.
    place: Vec<(usize, usize)>,
    /// Per parameter: marked ready this step.
    ready: Vec<bool>,
    /// Buckets launched this step (they launch in order).
    launched: usize,
    /// Inside `no_sync`: nothing is launched, gradients accumulate.
    no_sync: bool,
    /// The order parameters were marked ready in the first synchronised
    /// step (for the one rebuild), until it is done.
    observed: Option<Vec<ParamId>>,
    /// This step's weighted average: this rank's weight, and the all-reduce
    /// of every rank's.
    weight: Option<(f64, crate::PendingCollective<Vec<f64>>)>,
    timer: StepTimer,
}

impl GradReducer {
    /// A reducer of `layout`'s gradients on `comm`. Collective: every rank
    /// calls it with its layout, and a layout that differs anywhere fails on
    /// every rank naming the first parameter that differs and both ranks.
    pub fn new(
        comm: &Communicator,
        layout: Layout,
        config: ReducerConfig,
    ) -> Result<GradReducer, TrainError> {
        super::check::same_layout(comm, &layout)?;
        for (_, p) in layout.iter() {
            if Grads::zeroed(p.dtype, 0).is_none() {
                return Err(TrainError::Unsupported {
                    param: p.name.clone(),
                    dtype: p.dtype,
                });
            }
        }
        let mut reducer = GradReducer {
            comm: comm.clone(),
            ready: vec![false; layout.len()],
            place: vec![(0, 0); layout.len()],
            layout,
            buckets: Vec::new(),
            launched: 0,
            no_sync: false,
            observed: None,
            weight: None,
            timer: StepTimer::default(),
            config,
        };
        let order = reverse_definition_order(&reducer.layout);
        reducer.build(&order);
        if reducer.config.rebuild_buckets {
            reducer.observed = Some(Vec::with_capacity(reducer.layout.len()));
        }
        Ok(reducer)
    }

    /// (Re)makes the buckets for `order` (every parameter, in expected
    /// ready order), carrying over the gradients held now.
    fn build(&mut self, order: &[ParamId]) {
        let caps = Caps {
            first: self.config.first_bucket_bytes,
            rest: self.config.bucket_cap_bytes,
        };
        let plan = assign_buckets(&self.layout, order, caps);
        let old = std::mem::take(&mut self.buckets);
        let old_place = std::mem::take(&mut self.place);
        let mut place = vec![(0, 0); self.layout.len()];
        let mut buckets = Vec::with_capacity(plan.len());
        for (b, params) in plan.into_iter().enumerate() {
            let dtype = self.layout.param(params[0]).dtype;
            let mut len = 0;
            for &id in &params {
                place[id.0] = (b, len);
                len += self.layout.param(id).len;
            }
            let mut grads = Grads::zeroed(dtype, len).expect("checked in new");
            for &id in &params {
                let (ob, off) = old_place.get(id.0).copied().unwrap_or((usize::MAX, 0));
                if let Some(Bucket {
                    state: State::Idle(from),
                    ..
                }) = old.get(ob)
                {
                    grads.copy_from(place[id.0].1, from, off, self.layout.param(id).len);
                }
            }
            let wire = match (self.config.hook, dtype) {
                (CommHook::Bf16Wire, DType::F32) => Some(Grads::Bf16(vec![bf16::ZERO; len])),
                (CommHook::F16Wire, DType::F32) => Some(Grads::F16(vec![f16::ZERO; len])),
                _ => None,
            };
            buckets.push(Bucket {
                params,
                dtype,
                ready: 0,
                state: State::Idle(grads),
                wire,
            });
        }
        self.buckets = buckets;
        self.place = place;
    }

    /// Goes on on `comm`, the communicator [`Communicator::shrink`] made
    /// after a step failed with a lost rank: the same layout and bucket
    /// order, every gradient zeroed (the failed step's were not reduced on
    /// every rank alike: redo the step), and from then on the average over
    /// `comm`'s members. Collective over `comm`; checks the layout there as
    /// [`GradReducer::new`] does.
    ///
    /// Also after [`Communicator::admit`]: the members that were there call
    /// this while each replacement calls [`GradReducer::rejoin`], which
    /// takes their bucket order.
    pub fn recover(&mut self, comm: &Communicator) -> Result<(), TrainError> {
        // Buckets still in an all-reduce on the failed communicator end
        // now (it failed); their memory comes back or is made anew.
        self.drain();
        self.weight = None;
        super::check::same_layout(comm, &self.layout)?;
        self.comm = comm.clone();
        let order: Vec<ParamId> = self
            .buckets
            .iter()
            .flat_map(|b| b.params.iter().copied())
            .collect();
        self.buckets.clear();
        self.build(&order);
        self.ready.fill(false);
        self.launched = 0;
        self.no_sync = false;
        if let Some(observed) = self.observed.as_mut() {
            observed.clear();
        }
        self.share_order(false)
    }

    /// A reducer for a replacement process that `comm` admitted
    /// ([`Communicator::admit`]), made while the members that were there
    /// call [`GradReducer::recover`] on it: the layout checked as
    /// [`GradReducer::new`] checks it, and their bucket order (the one
    /// they rebuilt to after their first step, or the first one and the
    /// rebuild still to come), so that every member reduces the same
    /// buckets. The parameters come separately
    /// ([`broadcast_state`](super::broadcast_state)).
    pub fn rejoin(
        comm: &Communicator,
        layout: Layout,
        config: ReducerConfig,
    ) -> Result<GradReducer, TrainError> {
        let mut reducer = GradReducer::new(comm, layout, config)?;
        reducer.share_order(true)?;
        Ok(reducer)
    }

    /// Makes every member's bucket order, and whether its one rebuild is
    /// still to come, that of the lowest-ranked member that was there
    /// before (`newcomer`: this one was not). Collective.
    fn share_order(&mut self, newcomer: bool) -> Result<(), TrainError> {
        let me = if newcomer {
            i64::MAX
        } else {
            self.comm.rank() as i64
        };
        let root = self
            .comm
            .all_reduce(vec![me], ReduceOp::Min)
            .wait()
            .map_err(|e| TrainError::from(e).context("choosing whose bucket order".into()))?[0];
        let Ok(root) = usize::try_from(root)
            .map_err(drop)
            .and_then(|r| (r < self.comm.world_size()).then_some(r).ok_or(()))
        else {
            return Err(TrainError::Lost {
                what: "the members that held the bucket order (every member is a replacement)"
                    .into(),
            });
        };
        self.same_config(root)?;
        let mut mine: Vec<i64> = self
            .buckets
            .iter()
            .flat_map(|b| b.params.iter().map(|p| p.0 as i64))
            .collect();
        mine.push(i64::from(self.observed.is_some()));
        let theirs = self
            .comm
            .broadcast(mine, root)
            .wait()
            .map_err(|e| TrainError::from(e).context("taking the bucket order".into()))?;
        if newcomer {
            let (pending, order) = theirs.split_last().expect("the order and a flag");
            let order: Vec<ParamId> = order.iter().map(|&i| ParamId(i as usize)).collect();
            self.buckets.clear();
            self.build(&order);
            self.observed = (*pending == 1).then(|| Vec::with_capacity(self.layout.len()));
        }
        Ok(())
    }

    /// Fails on every rank, naming the first that differs, unless every
    /// rank's config is `root`'s: a replacement made with other bucket
    /// caps or another hook would build other buckets. Collective.
    fn same_config(&self, root: usize) -> Result<(), TrainError> {
        let c = &self.config;
        let hook = match c.hook {
            CommHook::Avg => 0,
            CommHook::Bf16Wire => 1,
            CommHook::F16Wire => 2,
        };
        let unused = match c.unused {
            Unused::Error => 0,
            Unused::Zero => 1,
        };
        let mine = [
            c.bucket_cap_bytes as i64,
            c.first_bucket_bytes as i64,
            hook,
            i64::from(c.rebuild_buckets),
            unused,
        ];
        let mut all = vec![0i64; mine.len() * self.comm.world_size()];
        self.comm
            .all_gather_slice(&mine, &mut all)
            .map_err(|e| TrainError::from(e).context("comparing the reducer configs".into()))?;
        let configs: Vec<&[i64]> = all.chunks_exact(mine.len()).collect();
        let describe = |v: &[i64]| {
            let hook = ["Avg", "Bf16Wire", "F16Wire"]
                .get(v[2] as usize)
                .unwrap_or(&"?");
            let unused = ["Error", "Zero"].get(v[4] as usize).unwrap_or(&"?");
            format!(
                "bucket_cap_bytes {}, first_bucket_bytes {}, hook {hook}, rebuild_buckets {}, \
                 unused {unused}",
                v[0],
                v[1],
                v[3] != 0,
            )
        };
        match configs.iter().position(|v| *v != configs[root]) {
            None => Ok(()),
            Some(rank) => Err(TrainError::ConfigDiffers {
                rank,
                theirs: describe(configs[rank]),
                root,
                reference: describe(configs[root]),
            }),
        }
    }

    /// The communicator the gradients are averaged on (the one given to
    /// `new`, or the last `recover`/`rejoin`): for the collectives a
    /// trainer runs beside the reducer, on the same members.
    pub fn communicator(&self) -> &Communicator {
        &self.comm
    }

    /// The layout this reducer was made with.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The buckets, in launch order.
    pub fn buckets(&self) -> Vec<BucketInfo> {
        self.buckets
            .iter()
            .map(|b| BucketInfo {
                params: b.params.clone(),
                dtype: b.dtype,
                bytes: b
                    .params
                    .iter()
                    .map(|&p| self.layout.param(p).len * b.dtype.size())
                    .sum(),
            })
            .collect()
    }

    /// The gradient of `id` in bucket memory, to write or add into before
    /// marking it ready (and to read the result from after `finish`).
    /// Refused while its bucket is being reduced, or for another type.
    pub fn grad_mut<T: GradElement>(&mut self, id: ParamId) -> Result<&mut [T], TrainError> {
        let (b, off, len) = self.locate(id)?;
        let name = &self.layout.param(id).name;
        let bucket = &mut self.buckets[b];
        let State::Idle(grads) = &mut bucket.state else {
            return Err(TrainError::InFlight {
                param: name.clone(),
            });
        };
        let found = grads.len();
        match T::view_mut(grads) {
            Some(v) => Ok(&mut v[off..off + len]),
            None => Err(TrainError::WrongType {
                param: name.clone(),
                asked: T::DTYPE,
                is: bucket.dtype,
                len: found,
            }),
        }
    }

    /// The gradient of `id`, to read (see [`GradReducer::grad_mut`]).
    pub fn grad<T: GradElement>(&self, id: ParamId) -> Result<&[T], TrainError> {
        let (b, off, len) = self.locate(id)?;
        let name = &self.layout.param(id).name;
        let State::Idle(grads) = &self.buckets[b].state else {
            return Err(TrainError::InFlight {
                param: name.clone(),
            });
        };
        match T::view(grads) {
            Some(v) => Ok(&v[off..off + len]),
            None => Err(TrainError::WrongType {
                param: name.clone(),
                asked: T::DTYPE,
                is: self.buckets[b].dtype,
                len: grads.len(),
            }),
        }
    }

    fn locate(&self, id: ParamId) -> Result<(usize, usize, usize), TrainError> {
        if id.0 >= self.layout.len() {
            return Err(TrainError::UnknownParam { id: id.0 });
        }
        let (b, off) = self.place[id.0];
        Ok((b, off, self.layout.param(id).len))
    }

    /// Adds `grad` into the gradient of `id` and marks it ready.
    pub fn accumulate<T: GradElement>(
        &mut self,
        id: ParamId,
        grad: &[T],
    ) -> Result<(), TrainError> {
        let expected = self.locate(id)?.2;
        if expected != grad.len() {
            return Err(TrainError::WrongLength {
                param: self.layout.param(id).name.clone(),
                expected,
                got: grad.len(),
            });
        }
        T::reduce_into(self.grad_mut::<T>(id)?, grad, ReduceOp::Sum);
        self.mark_ready(id)
    }

    /// Marks `id`'s gradient ready for this step: once every parameter of
    /// a bucket is ready, and every bucket before it launched, the bucket's
    /// all-reduce starts (not inside [`GradReducer::no_sync`]).
    pub fn mark_ready(&mut self, id: ParamId) -> Result<(), TrainError> {
        let (b, _, _) = self.locate(id)?;
        if std::mem::replace(&mut self.ready[id.0], true) {
            return Err(TrainError::MarkedTwice {
                param: self.layout.param(id).name.clone(),
            });
        }
        self.timer.ready();
        let synced = !self.no_sync;
        if let Some(order) = self.observed.as_mut().filter(|_| synced) {
            order.push(id);
        }
        self.buckets[b].ready += 1;
        if !self.no_sync {
            self.launch_ready()?;
        }
        Ok(())
    }

    /// Launches, in order, every bucket from the next one on whose
    /// parameters are all ready.
    fn launch_ready(&mut self) -> Result<(), TrainError> {
        while let Some(bucket) = self.buckets.get(self.launched) {
            if bucket.ready < bucket.params.len() {
                return Ok(());
            }
            self.launch(self.launched)?;
            self.launched += 1;
        }
        Ok(())
    }

    fn launch(&mut self, b: usize) -> Result<(), TrainError> {
        self.timer.launch();
        let weight = self.weight.as_ref().map(|(w, _)| *w);
        let bucket = &mut self.buckets[b];
        let State::Idle(mut grads) = std::mem::replace(&mut bucket.state, State::Moving) else {
            unreachable!("a bucket launches once a step");
        };
        // A weighted average sums w_r g_r and divides by the sum of w_r.
        if let Some(w) = weight {
            grads.scale(w);
        }
        let op = match weight {
            Some(_) => ReduceOp::Sum,
            None => ReduceOp::Avg,
        };
        bucket.state = match (bucket.wire.take(), grads) {
            (Some(mut wire), Grads::F32(g)) => {
                match &mut wire {
                    Grads::Bf16(w) => w
                        .iter_mut()
                        .zip(&g)
                        .for_each(|(w, &x)| *w = bf16::from_f32(x)),
                    Grads::F16(w) => w
                        .iter_mut()
                        .zip(&g)
                        .for_each(|(w, &x)| *w = f16::from_f32(x)),
                    _ => unreachable!("wire copies are 16-bit"),
                }
                State::Wire(Grads::F32(g), wire.all_reduce(&self.comm, ReduceOp::Sum))
            }
            (wire, grads) => {
                bucket.wire = wire;
                State::Reducing(grads.all_reduce(&self.comm, op))
            }
        };
        Ok(())
    }

    /// Makes this step's gradients a weighted average: `samples` is what
    /// this rank's gradients were computed over (an uneven last batch), and
    /// each rank's counts in proportion. Call it before the first
    /// `mark_ready` of the step, on every rank (it adds one small
    /// all-reduce, ordered before the buckets).
    pub fn set_sample_count(&mut self, samples: usize) -> Result<(), TrainError> {
        if self.launched > 0 || self.weight.is_some() {
            return Err(TrainError::WeightTooLate);
        }
        let w = samples as f64;
        let all = self.comm.all_reduce(vec![w], ReduceOp::Sum);
        self.weight = Some((w, all));
        Ok(())
    }

    /// Runs `f` without communication: gradients marked ready inside it
    /// accumulate in bucket memory, and the next synchronised step reduces
    /// their sum (PyTorch's `no_sync`). Every rank must skip the same steps.
    pub fn no_sync<R>(&mut self, f: impl FnOnce(&mut GradReducer) -> R) -> R {
        let was = std::mem::replace(&mut self.no_sync, true);
        let result = f(self);
        self.no_sync = was;
        result
    }

    /// Whether steps are being accumulated without communication.
    pub fn is_no_sync(&self) -> bool {
        self.no_sync
    }

    /// Ends backward: launches what is left, waits for every bucket, and
    /// leaves the averaged gradients in bucket memory. Parameters never
    /// marked ready fail the step naming them (or count as zero, with
    /// [`Unused::Zero`]). Inside `no_sync` it only ends the step.
    pub fn finish(&mut self) -> Result<(), TrainError> {
        self.timer.backward_end();
        let unready: Vec<ParamId> = (0..self.layout.len())
            .map(ParamId)
            .filter(|id| !self.ready[id.0])
            .collect();
        let result = if self.no_sync {
            Ok(())
        } else {
            self.finish_synced(&unready)
        };
        self.ready.fill(false);
        for b in &mut self.buckets {
            b.ready = 0;
        }
        self.launched = 0;
        self.weight = None;
        self.timer.step_end(!self.no_sync && result.is_ok());
        result
    }

    fn finish_synced(&mut self, unready: &[ParamId]) -> Result<(), TrainError> {
        if !unready.is_empty() {
            match self.config.unused {
                Unused::Error => {
                    let names: Vec<String> = unready
                        .iter()
                        .map(|&p| self.layout.param(p).name.clone())
                        .collect();
                    let e = TrainError::NeverReady {
                        rank: self.comm.rank(),
                        params: names,
                    };
                    // Ranks that launched buckets this one will not must
                    // stop now, not at their timeout.
                    self.comm.abort(&e.to_string());
                    self.drain();
                    return Err(e);
                }
                Unused::Zero => {
                    for &id in unready {
                        let (b, off, len) = self.locate(id)?;
                        if let State::Idle(g) = &mut self.buckets[b].state {
                            g.zero_range(off..off + len);
                        }
                        self.buckets[b].ready += 1;
                        self.ready[id.0] = true;
                        if let Some(order) = self.observed.as_mut() {
                            order.push(id);
                        }
                    }
                    self.launch_ready()?;
                }
            }
        }
        // A failed all-reduce (a lost rank) leaves every bucket here again,
        // its memory back or made anew, so the reducer can go on
        // (`recover`) or be dropped.
        let total = match self.weight.take() {
            Some((_, all)) => match all.wait() {
                Ok(total) => Some(total[0]),
                Err(e) => {
                    self.drain();
                    return Err(e.into());
                }
            },
            None => None,
        };
        let ranks = self.comm.world_size() as f64;
        for b in 0..self.buckets.len() {
            let state = std::mem::replace(&mut self.buckets[b].state, State::Moving);
            let grads = match state {
                State::Idle(g) => g,
                State::Reducing(pending) => {
                    let mut g = match pending.wait() {
                        Ok(g) => g,
                        Err(e) => {
                            let bucket = &mut self.buckets[b];
                            bucket.state = State::Idle(zeroed_grads(bucket, &self.layout));
                            self.drain();
                            return Err(e.into());
                        }
                    };
                    if let Some(total) = total {
                        g.scale(1.0 / total);
                    }
                    g
                }
                State::Wire(Grads::F32(mut g), pending) => {
                    let wire = match pending.wait() {
                        Ok(wire) => wire,
                        Err(e) => {
                            self.buckets[b].state = State::Idle(Grads::F32(g));
                            self.drain();
                            return Err(e.into());
                        }
                    };
                    let divide = total.unwrap_or(ranks) as f32;
                    match &wire {
                        Grads::Bf16(w) => g
                            .iter_mut()
                            .zip(w)
                            .for_each(|(x, w)| *x = w.to_f32() / divide),
                        Grads::F16(w) => g
                            .iter_mut()
                            .zip(w)
                            .for_each(|(x, w)| *x = w.to_f32() / divide),
                        _ => unreachable!("wire copies are 16-bit"),
                    }
                    self.buckets[b].wire = Some(wire);
                    Grads::F32(g)
                }
                State::Wire(..) | State::Moving => unreachable!("bucket states are kept whole"),
            };
            self.buckets[b].state = State::Idle(grads);
        }
        if let Some(order) = self.observed.take() {
            self.rebuild(order)?;
        }
        Ok(())
    }

    /// Waits for what is in flight after a failed step, so bucket memory is
    /// back (the ops end at once: the communicator was aborted).
    fn drain(&mut self) {
        for bucket in &mut self.buckets {
            let state = std::mem::replace(&mut bucket.state, State::Moving);
            bucket.state = State::Idle(match state {
                State::Idle(g) => g,
                State::Reducing(p) => match p.wait() {
                    Ok(g) => g,
                    Err(_) => zeroed_grads(bucket, &self.layout),
                },
                State::Wire(g, p) => {
                    if let Ok(w) = p.wait() {
                        bucket.wire = Some(w);
                    }
                    g
                }
                State::Moving => unreachable!("bucket states are kept whole"),
            });
        }
    }

    /// The one rebuild: rank 0's observed order, broadcast, becomes every
    /// rank's bucket order (as PyTorch rebuilds from the real order).
    fn rebuild(&mut self, order: Vec<ParamId>) -> Result<(), TrainError> {
        let mut mine: Vec<i64> = order.iter().map(|p| p.0 as i64).collect();
        mine.resize(self.layout.len(), -1);
        let order = self.comm.broadcast(mine, 0).wait()?;
        // Rank 0 marked every parameter once in a step that succeeded, so
        // this is every parameter once; checked all the same, and kept as
        // it is if not (every rank sees the same broadcast).
        let mut seen = vec![false; self.layout.len()];
        let whole = order.iter().all(|&i| {
            usize::try_from(i)
                .is_ok_and(|i| i < seen.len() && !std::mem::replace(&mut seen[i], true))
        });
        if whole {
            let order: Vec<ParamId> = order.iter().map(|&i| ParamId(i as usize)).collect();
            self.build(&order);
        }
        Ok(())
    }

    /// Sets every gradient to zero (after the optimizer step, as
    /// `zero_grad`).
    pub fn zero_grads(&mut self) {
        for bucket in &mut self.buckets {
            if let State::Idle(g) = &mut bucket.state {
                g.zero();
            }
        }
    }

    /// Broadcasts rank 0's parameters of type `T` to every rank: `params`
    /// are this rank's parameters of that type, in layout order (one flat
    /// broadcast). Collective.
    pub fn broadcast_params<T: Element>(&self, params: &mut [&mut [T]]) -> Result<(), TrainError> {
        let expected: Vec<(String, usize)> = self
            .layout
            .iter()
            .filter(|(_, p)| p.dtype == T::DTYPE)
            .map(|(_, p)| (p.name.clone(), p.len))
            .collect();
        let lens: Vec<usize> = params.iter().map(|p| p.len()).collect();
        let want: Vec<usize> = expected.iter().map(|(_, n)| *n).collect();
        if lens != want {
            return Err(TrainError::ParamsDoNotMatch {
                dtype: T::DTYPE,
                expected: want,
                got: lens,
            });
        }
        let mut flat: Vec<T> = Vec::with_capacity(want.iter().sum());
        for p in params.iter() {
            flat.extend_from_slice(p);
        }
        let flat = self.comm.broadcast(flat, 0).wait()?;
        let mut at = 0;
        for p in params.iter_mut() {
            p.copy_from_slice(&flat[at..at + p.len()]);
            at += p.len();
        }
        Ok(())
    }

    /// Marks the start of a step's forward pass (for [`GradReducer::step_stats`]).
    pub fn begin_forward(&mut self) {
        self.timer.forward_start();
    }

    /// Marks the start of a step's backward pass.
    pub fn begin_backward(&mut self) {
        self.timer.backward_start();
    }

    /// The times of the last synchronised step, as PyTorch DDP logs them.
    pub fn step_stats(&self) -> StepStats {
        self.timer.last()
    }

    /// Whether any bucket's all-reduce has finished already (for callers
    /// that poll between layers).
    pub fn any_bucket_done(&self) -> bool {
        self.buckets.iter().any(|b| match &b.state {
            State::Reducing(p) | State::Wire(_, p) => p.is_completed(),
            _ => false,
        })
    }
}

/// New, zeroed memory for `bucket` (its own went with a failed all-reduce).
fn zeroed_grads(bucket: &Bucket, layout: &Layout) -> Grads {
    let len = bucket.params.iter().map(|&p| layout.param(p).len).sum();
    Grads::zeroed(bucket.dtype, len).expect("a float type")
}
