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

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId as BurnId};
use burn::optim::GradientsParams;
use burn::tensor::{DType as BurnDType, Gradients, Tensor, TensorData};
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
    /// burn's tensor data could not be read as f32.
    #[error("parameter {name:?}: {detail}")]
    Data {
        /// Its path in the module.
        name: String,
        /// What burn said.
        detail: String,
    },
}

/// One trained parameter: its path, its id in this process's module, and
/// its id in the reducer.
struct Entry {
    name: String,
    burn: BurnId,
    id: ParamId,
}

/// A burn module's f32 parameters, averaged across the ranks of a
/// communicator.
pub struct Ddp {
    reducer: GradReducer,
    /// In visit order.
    params: Vec<Entry>,
}

/// Walks a module's float parameters in visit order, with their paths.
#[derive(Default)]
struct Walk {
    path: Vec<String>,
    /// (path, id, elements, dtype, requires a gradient)
    found: Vec<(String, BurnId, usize, BurnDType, bool)>,
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
            param.id,
            value.shape().num_elements(),
            value.dtype(),
            value.is_require_grad(),
        ));
    }
}

impl Ddp {
    /// A reducer of `model`'s trained f32 parameters (those that require a
    /// gradient), in visit order, on `comm`. Collective; every rank must
    /// have the same parameters.
    pub fn new<M: Module>(
        comm: &Communicator,
        model: &M,
        config: ReducerConfig,
    ) -> Result<Ddp, Error> {
        let mut walk = Walk::default();
        model.visit(&mut walk);
        let mut layout = Layout::new();
        let mut params = Vec::new();
        for (name, burn, len, dtype, trained) in walk.found {
            if !trained {
                continue;
            }
            if dtype != BurnDType::F32 {
                return Err(Error::Unsupported { name, dtype });
            }
            let id = layout.push(name.clone(), len, DType::F32);
            params.push(Entry { name, burn, id });
        }
        let reducer = GradReducer::new(comm, layout, config)?;
        Ok(Ddp { reducer, params })
    }

    /// `model` with every rank's trained parameters set to rank 0's.
    /// Collective.
    pub fn broadcast<M: Module>(&mut self, model: M) -> Result<M, Error> {
        let mut values = Collect {
            want: &self.params,
            values: Vec::new(),
            error: None,
        };
        model.visit(&mut values);
        if let Some(e) = values.error {
            return Err(e);
        }
        let mut values = values.values;
        {
            let mut views: Vec<&mut [f32]> = values.iter_mut().map(Vec::as_mut_slice).collect();
            self.reducer.broadcast_params(&mut views)?;
        }
        let mut put = Put {
            want: &self.params,
            values,
            next: 0,
        };
        Ok(model.map(&mut put))
    }

    /// Averages the gradients of `loss.backward()` across the ranks: each
    /// parameter's gradient is copied into bucket memory (last in visit
    /// order first: a bucket is all-reduced as soon as it is full, while
    /// the rest are copied), then the averages come back as the
    /// [`GradientsParams`] a burn optimizer steps with. A parameter without
    /// a gradient counts as zero if [`ReducerConfig::unused`] says so, and
    /// fails the step naming it otherwise.
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
        let mut take = Take {
            grads: &mut grads,
            found: Vec::new(),
        };
        model.visit(&mut take);
        let mut found = take.found;
        // (burn id, data, device) by visit order; fed last first.
        for entry in self.params.iter().rev() {
            let Some(at) = found.iter().position(|(id, _, _)| *id == entry.burn) else {
                continue;
            };
            let data = &found[at].1;
            let values = data.as_slice::<f32>().map_err(|e| Error::Data {
                name: entry.name.clone(),
                detail: format!("{e:?}"),
            })?;
            self.reducer.accumulate(entry.id, values)?;
        }
        self.reducer.finish()?;
        let mut back = Back {
            reducer: &self.reducer,
            params: &self.params,
            found: &mut found,
            grads: &mut grads,
            error: None,
        };
        model.visit(&mut back);
        if let Some(e) = back.error {
            return Err(e);
        }
        self.reducer.zero_grads();
        Ok(grads)
    }

    /// The reducer underneath (buckets, step statistics, `no_sync`).
    pub fn reducer(&mut self) -> &mut GradReducer {
        &mut self.reducer
    }

    /// The trained parameters' paths, in the order the reducer knows them.
    pub fn names(&self) -> Vec<&str> {
        self.params.iter().map(|e| e.name.as_str()).collect()
    }
}

/// Collects the trained parameters' values, in visit order.
struct Collect<'a> {
    want: &'a [Entry],
    values: Vec<Vec<f32>>,
    error: Option<Error>,
}

impl ModuleVisitor for Collect<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let Some(entry) = self.want.iter().find(|e| e.burn == param.id) else {
            return;
        };
        match param.val().into_data().try_to_vec::<f32>() {
            Ok(v) => self.values.push(v),
            Err(e) => {
                self.error.get_or_insert(Error::Data {
                    name: entry.name.clone(),
                    detail: format!("{e:?}"),
                });
                self.values.push(Vec::new());
            }
        }
    }
}

/// Writes the broadcast values back, in visit order.
struct Put<'a> {
    want: &'a [Entry],
    values: Vec<Vec<f32>>,
    next: usize,
}

impl ModuleMapper for Put<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        if !self.want.iter().any(|e| e.burn == param.id) {
            return param;
        }
        let values = std::mem::take(&mut self.values[self.next]);
        self.next += 1;
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
    grads: &'a mut GradientsParams,
    /// (id, data, device) of each parameter that had a gradient.
    found: Vec<(BurnId, TensorData, burn::tensor::Device)>,
}

impl ModuleVisitor for Take<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(g) = self.grads.remove::<D>(param.id) {
            let device = g.device();
            self.found.push((param.id, g.into_data(), device));
        }
    }
}

/// Puts the averages back as burn tensors on each gradient's device.
struct Back<'a> {
    reducer: &'a GradReducer,
    params: &'a [Entry],
    found: &'a mut Vec<(BurnId, TensorData, burn::tensor::Device)>,
    grads: &'a mut GradientsParams,
    error: Option<Error>,
}

impl ModuleVisitor for Back<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let Some(entry) = self.params.iter().find(|e| e.burn == param.id) else {
            return;
        };
        let shape = param.val().shape();
        let device = self
            .found
            .iter()
            .find(|(id, _, _)| *id == param.id)
            .map_or_else(|| param.val().device(), |(_, _, d)| d.clone());
        match self.reducer.grad::<f32>(entry.id) {
            Ok(avg) => {
                let t = Tensor::<D>::from_data(TensorData::new(avg.to_vec(), shape), &device);
                self.grads.register::<D>(param.id, t);
            }
            Err(e) => {
                self.error.get_or_insert(e.into());
            }
        }
    }
}
