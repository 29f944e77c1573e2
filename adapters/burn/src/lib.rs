//! Data-parallel training of [burn](https://burn.dev) models across
//! processes, over ringwire's [`GradReducer`].
//!
//! ```no_run
//! # use burn::module::Module;
//! # use burn::tensor::Device;
//! # fn model<M: Module>(m: M) -> M { m }
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let net = burn::nn::LinearConfig::new(4, 2).init(&Device::default().autodiff());
//! let comm = ringwire::Communicator::from_env().wait()?;
//! let mut ddp = ringwire_burn::Ddp::new(&comm, &net, Default::default())?;
//! let net = ddp.broadcast(net)?; // every rank starts from rank 0's weights
//! # let loss = net.forward(burn::tensor::Tensor::<2>::zeros([1, 4], &Device::default().autodiff())).sum();
//! let grads = ddp.sync(&net, loss.backward())?; // averaged across ranks
//! # let _ = grads;
//! # Ok(()) }
//! ```
//!
//! Parameters are taken in the module's visit order (its fields in
//! declaration order), named by their path (`l1.weight`): burn's
//! `ParamId`s are random per process, so only the order is the same on
//! every rank, and the reducer checks that every rank has the same names,
//! lengths and types. Only f32 parameters that require a gradient are
//! averaged. burn hands gradients over once backward has finished, so
//! buckets overlap the copying of the later gradients, not backward itself.
//!
//! Gradient accumulation ([`Ddp::accumulate`]), an uneven last batch
//! ([`Ddp::set_sample_count`]), bf16 on the wire
//! ([`ReducerConfig::hook`](ringwire::train::ReducerConfig)) and per-step
//! times ([`GradReducer::step_stats`]) come from ringwire's reducer.
//!
//! **Devices.** Gradients are staged through host memory: each is read
//! out of its tensor once (`into_data`, no copy on burn's CPU backend
//! where the tensor is not shared), copied into bucket memory, and the
//! average is copied out once and put back on the gradient's device. On a
//! GPU backend `into_data` is a device-to-host copy and the way back a
//! host-to-device copy; reducing GPU tensors in place through
//! `ringwire-gpu` is not built (decision 0042).

/// The ringwire this crate is built on, so that `ringwire-burn` is the one
/// dependency a trainer adds: `use ringwire_burn::ringwire;`.
pub use ringwire;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{DType as BurnDType, Device, Gradients, Tensor, TensorData};
use ringwire::train::{GradReducer, Layout, ParamId, ReducerConfig, TrainError};
use ringwire::{Communicator, DType};

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The reducer failed (a layout that differs across ranks, a failed
    /// collective, a missing gradient, ...).
    #[error(transparent)]
    Train(#[from] TrainError),
    /// A parameter of a type the reducer does not average.
    #[error("parameter {name:?} has type {dtype:?}: only f32 parameters are averaged")]
    Unsupported {
        /// Its path in the module.
        name: String,
        /// Its type.
        dtype: BurnDType,
    },
    /// The module's float parameters are not those [`Ddp::new`] was made
    /// from (another module, or one whose layers changed since).
    #[error("the module has {got} float parameters; the Ddp was made from one with {expected}")]
    ModuleChanged {
        /// How many `new` saw.
        expected: usize,
        /// How many this module has.
        got: usize,
    },
    /// A parameter that is not as rank 0's (a frozen one: the reducer
    /// checks the trained ones when it is made).
    #[error("parameter {name:?}: {detail}")]
    NotAsOnRank0 {
        /// Its path in the module.
        name: String,
        /// How it differs.
        detail: String,
    },
    /// burn's tensor data could not be read as f32.
    #[error("parameter {name:?}: {detail}")]
    Data {
        /// Its path in the module.
        name: String,
        /// What burn said.
        detail: String,
    },
}

/// One trained parameter: its path and its id in the reducer.
struct Entry {
    name: String,
    id: ParamId,
}

/// A burn module's f32 parameters, averaged across the ranks of a
/// communicator.
pub struct Ddp {
    reducer: GradReducer,
    /// The trained parameters, in visit order.
    params: Vec<Entry>,
    /// For each float parameter in visit order, its index in `params` (the
    /// trained ones). burn's ids are random per process and change when a
    /// module is made anew; the position in the visit does not.
    slots: Vec<Option<usize>>,
    /// By index in `params`: whether bucket memory holds gradients of the
    /// steps since the last sync (accumulated), to be added to.
    held: Vec<bool>,
    /// Every float parameter in visit order: its path, and its elements
    /// when it is f32 (what `broadcast` sends).
    floats: Vec<(String, Option<usize>)>,
    /// The sample count `set_sample_count` gave for the next sync.
    samples: Option<usize>,
}

/// Walks a module's float parameters in visit order, with their paths.
#[derive(Default)]
struct Walk {
    path: Vec<String>,
    /// (path, elements, dtype, requires a gradient)
    found: Vec<(String, usize, BurnDType, bool)>,
}

impl ModuleVisitor for Walk {
    fn enter_module(&mut self, name: &str, _container: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let value = param.val();
        self.found.push((
            self.path.join("."),
            value.shape().num_elements(),
            value.dtype(),
            value.is_require_grad(),
        ));
    }
}

impl Ddp {
    /// A reducer of `model`'s trained f32 parameters (those that require a
    /// gradient), in visit order, on `comm`. Collective; every rank must
    /// have the same parameters, and a layout that differs fails on every
    /// rank naming the first parameter that differs.
    pub fn new<M: Module>(
        comm: &Communicator,
        model: &M,
        config: ReducerConfig,
    ) -> Result<Ddp, Error> {
        let mut walk = Walk::default();
        model.visit(&mut walk);
        let mut layout = Layout::new();
        let mut params = Vec::new();
        let mut slots = Vec::with_capacity(walk.found.len());
        let mut floats = Vec::with_capacity(walk.found.len());
        for (name, len, dtype, trained) in walk.found {
            floats.push((name.clone(), (dtype == BurnDType::F32).then_some(len)));
            if !trained {
                slots.push(None);
                continue;
            }
            if dtype != BurnDType::F32 {
                return Err(Error::Unsupported { name, dtype });
            }
            let id = layout.push(name.clone(), len, DType::F32);
            slots.push(Some(params.len()));
            params.push(Entry { name, id });
        }
        let reducer = GradReducer::new(comm, layout, config)?;
        Ok(Ddp {
            reducer,
            held: vec![false; params.len()],
            params,
            slots,
            floats,
            samples: None,
        })
    }

    /// `model` with every rank's f32 parameters set to rank 0's: the
    /// trained ones, and the frozen ones and buffers (a `no_grad` layer,
    /// batch norm's running statistics) too, as PyTorch's DDP broadcasts
    /// its buffers. Collective. A frozen parameter whose shape differs
    /// from rank 0's fails on every rank, naming it.
    pub fn broadcast<M: Module>(&mut self, model: M) -> Result<M, Error> {
        let mut values = Collect {
            at: 0,
            values: Vec::with_capacity(self.floats.len()),
            error: None,
            floats: &self.floats,
        };
        model.visit(&mut values);
        let comm = self.reducer.communicator();
        // A failure here is this rank's alone: the others would wait in the
        // broadcast until their timeout, so the communicator is aborted.
        let local = match values.error {
            Some(e) => Err(e),
            None => self.check_visited(values.at),
        };
        if let Err(e) = local {
            comm.abort(&e.to_string());
            return Err(e);
        }
        let values = values.values;
        // Every rank's f32 parameters must be rank 0's shapes: their
        // lengths first (a flat broadcast of another length would fail
        // without naming one).
        let lens: Vec<i64> = self
            .floats
            .iter()
            .map(|(_, n)| n.map_or(-1, |n| n as i64))
            .collect();
        let rank0 = comm
            .broadcast(lens.clone(), 0)
            .wait()
            .map_err(TrainError::from)?;
        if let Some(at) = (0..lens.len().max(rank0.len())).find(|&i| rank0.get(i) != lens.get(i)) {
            let name = self
                .floats
                .get(at)
                .map_or_else(|| "(none)".into(), |f| f.0.clone());
            let say = |n: Option<&i64>| match n {
                None => "absent".to_string(),
                Some(-1) => "not f32".to_string(),
                Some(n) => format!("{n} elements"),
            };
            let e = Error::NotAsOnRank0 {
                name,
                detail: format!(
                    "{} here, {} on rank 0",
                    say(lens.get(at)),
                    say(rank0.get(at))
                ),
            };
            comm.abort(&e.to_string());
            return Err(e);
        }
        let flat: Vec<f32> = values.iter().flatten().flatten().copied().collect();
        let flat = comm.broadcast(flat, 0).wait().map_err(TrainError::from)?;
        let mut put = Put {
            at: 0,
            floats: &self.floats,
            flat: &flat,
            from: 0,
        };
        Ok(model.map(&mut put))
    }

    /// Averages the gradients of `loss.backward()` across the ranks: each
    /// parameter's gradient is copied into bucket memory (last in visit
    /// order first: a bucket is all-reduced as soon as it is full, while
    /// the rest are copied), then the averages come back as the
    /// [`GradientsParams`] a burn optimizer steps with, each on its
    /// gradient's device. Steps taken with [`Ddp::accumulate`] since the
    /// last sync are added in. A parameter without a gradient counts as
    /// zero if [`ReducerConfig::unused`] says so, and fails the step naming
    /// it otherwise.
    pub fn sync<M: Module>(
        &mut self,
        model: &M,
        grads: Gradients,
    ) -> Result<GradientsParams, Error> {
        self.sync_params(model, GradientsParams::from_grads(grads, model))
    }

    /// As [`Ddp::sync`], for gradients already taken as [`GradientsParams`].
    pub fn sync_params<M: Module>(
        &mut self,
        model: &M,
        mut grads: GradientsParams,
    ) -> Result<GradientsParams, Error> {
        let mut found = self.take(model, &mut grads)?;
        if let Some(samples) = self.samples.take() {
            self.reducer.set_sample_count(samples)?;
        }
        let fed = feed(&mut self.reducer, &self.params, &found, &mut self.held);
        // The window's sums are spent (averaged, or lost with a failed
        // step): the next gradients are copied in, not added.
        self.held.fill(false);
        if let Err(e) = fed {
            // Ends the step (its buckets waited for or the communicator
            // aborted), so the reducer is ready for the next one.
            let _ = self.reducer.finish();
            return Err(e);
        }
        self.reducer.finish()?;
        let mut back = Back {
            ddp: self,
            at: 0,
            found: &mut found,
            grads: &mut grads,
            error: None,
        };
        model.visit(&mut back);
        if let Some(e) = back.error {
            return Err(e);
        }
        Ok(grads)
    }

    /// Adds the gradients of `loss.backward()` into bucket memory without
    /// communicating (PyTorch's `no_sync`): the next [`Ddp::sync`] averages
    /// across the ranks the sum of every step accumulated since and its
    /// own. Every rank must accumulate the same steps. As with one process
    /// accumulating gradients, the sum is not divided by the number of
    /// steps: scale the loss or the learning rate for that.
    pub fn accumulate<M: Module>(&mut self, model: &M, grads: Gradients) -> Result<(), Error> {
        self.accumulate_params(model, GradientsParams::from_grads(grads, model))
    }

    /// As [`Ddp::accumulate`], for gradients already taken as
    /// [`GradientsParams`].
    pub fn accumulate_params<M: Module>(
        &mut self,
        model: &M,
        mut grads: GradientsParams,
    ) -> Result<(), Error> {
        let found = self.take(model, &mut grads)?;
        let (params, held) = (&self.params, &mut self.held);
        let result = self.reducer.no_sync(|reducer| {
            let fed = feed(reducer, params, &found, held);
            // Ends the step whatever happened, so none stays marked.
            let finished = reducer.finish();
            fed?;
            Ok(finished?)
        });
        if result.is_err() {
            self.held.fill(false);
        }
        result
    }

    /// Makes the next [`Ddp::sync`] a weighted average: this rank's
    /// gradients are the mean over `samples` samples (an uneven last
    /// batch), and each rank counts in proportion, so the result is the
    /// mean over every rank's samples. Call it before that `sync`, on every
    /// rank (the sync adds one small all-reduce). With steps accumulated
    /// since the last sync, the weight applies to their sum with the
    /// sync's own gradients: count the window's samples.
    pub fn set_sample_count(&mut self, samples: usize) {
        self.samples = Some(samples);
    }

    /// The reducer underneath (buckets, per-step statistics with
    /// [`GradReducer::step_stats`]).
    pub fn reducer(&mut self) -> &mut GradReducer {
        &mut self.reducer
    }

    /// The trained parameters' paths, in the order the reducer knows them.
    pub fn names(&self) -> Vec<&str> {
        self.params.iter().map(|e| e.name.as_str()).collect()
    }

    /// Takes each trained parameter's gradient out of `grads` as host data
    /// (no copy where burn's tensor is contiguous and not shared), with its
    /// device, by index in `params`; and checks them all before any goes
    /// into bucket memory, so a step fails whole, not half fed. A failure
    /// here aborts the communicator: the other ranks' buckets would wait
    /// for this rank's until their timeout.
    fn take<M: Module>(&self, model: &M, grads: &mut GradientsParams) -> Result<Vec<Taken>, Error> {
        let mut take = Take {
            slots: &self.slots,
            at: 0,
            grads,
            found: (0..self.params.len()).map(|_| None).collect(),
        };
        model.visit(&mut take);
        let (visited, found) = (take.at, take.found);
        let checked = self.check_visited(visited).and_then(|()| {
            for (entry, slot) in self.params.iter().zip(&found) {
                let Some((data, _)) = slot else { continue };
                let expected = self.reducer.layout().param(entry.id).len;
                let detail = match data.as_slice::<f32>() {
                    Ok(v) if v.len() == expected => continue,
                    Ok(v) => format!(
                        "its gradient has {} elements, the parameter {expected}",
                        v.len()
                    ),
                    Err(e) => format!("its gradient is not f32: {e:?}"),
                };
                return Err(Error::Data {
                    name: entry.name.clone(),
                    detail,
                });
            }
            Ok(())
        });
        match checked {
            Ok(()) => Ok(found),
            Err(e) => {
                self.reducer.communicator().abort(&e.to_string());
                Err(e)
            }
        }
    }

    /// Fails when the module's float parameters are not those `new` saw.
    fn check_visited(&self, visited: usize) -> Result<(), Error> {
        if visited == self.slots.len() {
            Ok(())
        } else {
            Err(Error::ModuleChanged {
                expected: self.slots.len(),
                got: visited,
            })
        }
    }
}

/// A gradient taken out of burn: its values on the host and the device it
/// was on (`None`: the parameter had none this step).
type Taken = Option<(TensorData, Device)>;

/// Puts the taken gradients into bucket memory, last in visit order first,
/// so the last parameters' buckets are on the wire while the first ones are
/// still copied. A parameter whose bucket memory holds nothing of this
/// window is copied in (no zeroing of the buckets after each step, no
/// reading of zeros); one that holds accumulated steps is added to. A
/// parameter with no gradient now but accumulated ones counts as ready.
fn feed(
    reducer: &mut GradReducer,
    params: &[Entry],
    found: &[Taken],
    held: &mut [bool],
) -> Result<(), Error> {
    for ((entry, slot), held) in params.iter().zip(found).zip(held).rev() {
        let Some((data, _)) = slot else {
            if *held {
                reducer.mark_ready(entry.id)?;
            }
            continue;
        };
        let values = data.as_slice::<f32>().map_err(|e| Error::Data {
            name: entry.name.clone(),
            detail: format!("{e:?}"),
        })?;
        let memory = reducer.grad_mut::<f32>(entry.id)?;
        if *held || memory.len() != values.len() {
            // Adds. (`take` checked the lengths; one that differed anyway
            // fails here naming the parameter instead of panicking.)
            reducer.accumulate(entry.id, values)?;
        } else {
            memory.copy_from_slice(values);
            reducer.mark_ready(entry.id)?;
        }
        *held = true;
    }
    Ok(())
}

/// Collects every f32 parameter's values, in visit order (`None` for
/// the others).
struct Collect<'a> {
    floats: &'a [(String, Option<usize>)],
    /// Float parameters visited so far.
    at: usize,
    values: Vec<Option<Vec<f32>>>,
    error: Option<Error>,
}

impl ModuleVisitor for Collect<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let float = self.floats.get(self.at);
        self.at += 1;
        let Some((name, Some(_))) = float else {
            self.values.push(None);
            return;
        };
        match param.val().into_data().try_to_vec::<f32>() {
            Ok(v) => self.values.push(Some(v)),
            Err(err) => {
                self.error.get_or_insert(Error::Data {
                    name: name.clone(),
                    detail: format!("{err:?}"),
                });
                self.values.push(None);
            }
        }
    }
}

/// Writes rank 0's values back, in visit order, from one flat vector.
struct Put<'a> {
    floats: &'a [(String, Option<usize>)],
    at: usize,
    flat: &'a [f32],
    /// Where the next parameter's values start in `flat`.
    from: usize,
}

impl ModuleMapper for Put<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let float = self.floats.get(self.at);
        self.at += 1;
        let Some((_, Some(len))) = float else {
            return param;
        };
        let values = self.flat[self.from..self.from + len].to_vec();
        self.from += len;
        param.map(|t| {
            let (device, shape) = (t.device(), t.shape());
            let fresh = Tensor::<D>::from_data(TensorData::new(values, shape), &device);
            if t.is_require_grad() {
                fresh.require_grad()
            } else {
                fresh
            }
        })
    }
}

/// Takes each gradient out of burn's tensors, in visit order.
struct Take<'a> {
    slots: &'a [Option<usize>],
    at: usize,
    grads: &'a mut GradientsParams,
    found: Vec<Taken>,
}

impl ModuleVisitor for Take<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let slot = self.slots.get(self.at).copied().flatten();
        self.at += 1;
        if let Some(e) = slot
            && let Some(g) = self.grads.remove::<D>(param.id)
        {
            let device = g.device();
            self.found[e] = Some((g.into_data(), device));
        }
    }
}

/// Puts the averages back as burn tensors on each gradient's device (the
/// parameter's, for one that had no gradient and counts as zero). Each
/// average is written into the host memory its gradient came out in, when
/// burn gave that up unshared: no allocation, and no page faults on fresh
/// memory every step.
struct Back<'a> {
    ddp: &'a Ddp,
    at: usize,
    found: &'a mut [Taken],
    grads: &'a mut GradientsParams,
    error: Option<Error>,
}

impl ModuleVisitor for Back<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let slot = self.ddp.slots.get(self.at).copied().flatten();
        self.at += 1;
        let Some(e) = slot else {
            return;
        };
        let avg = match self.ddp.reducer.grad::<f32>(self.ddp.params[e].id) {
            Ok(avg) => avg,
            Err(err) => {
                self.error.get_or_insert(err.into());
                return;
            }
        };
        let (data, device) = match self.found[e].take() {
            Some((mut data, device)) => match data.as_mut_slice::<f32>() {
                Ok(out) if out.len() == avg.len() => {
                    out.copy_from_slice(avg);
                    (data, device)
                }
                _ => (TensorData::new(avg.to_vec(), data.shape().clone()), device),
            },
            None => {
                // burn keeps gradients on the inner device, not the
                // autodiff one the parameter is on.
                let value = param.val();
                (
                    TensorData::new(avg.to_vec(), value.shape()),
                    value.device().inner(),
                )
            }
        };
        self.grads
            .register::<D>(param.id, Tensor::<D>::from_data(data, &device));
    }
}
