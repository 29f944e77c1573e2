//! Data-parallel training of [candle](https://github.com/huggingface/candle)
//! models across processes, over ringwire's [`GradReducer`].
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use candle_nn::{Optimizer, VarMap};
//! let comm = ringwire::Communicator::from_env().wait()?;
//! let varmap = VarMap::new();
//! // ... build the model from `varmap` ...
//! let mut ddp = ringwire_candle::Ddp::new(&comm, &varmap, Default::default())?;
//! ddp.broadcast_params()?; // every rank starts from rank 0's weights
//! let mut opt = candle_nn::SGD::new(varmap.all_vars(), 0.05)?;
//! # let loss = candle_core::Tensor::new(0f32, &candle_core::Device::Cpu)?;
//! let mut grads = loss.backward()?;
//! ddp.sync(&mut grads)?;   // averaged across ranks, in place
//! opt.step(&grads)?;
//! # Ok(()) }
//! ```
//!
//! candle's `VarMap` keeps its variables in a hash map, whose order differs
//! from process to process: they are taken sorted by name, and the reducer
//! checks every rank has the same names, shapes and types. candle hands
//! gradients over only once backward has finished (`GradStore`), so buckets
//! overlap the copying of the later gradients, not backward itself.

use candle_core::{DType as CandleDType, Tensor, Var, backprop::GradStore};
use candle_nn::VarMap;
use ringwire::train::{GradReducer, Layout, ParamId, ReducerConfig, TrainError};
use ringwire::{Communicator, DType};

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The reducer failed (a layout that differs across ranks, a failed
    /// collective, ...).
    #[error(transparent)]
    Train(#[from] TrainError),
    /// A candle call failed.
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    /// A variable of a type the reducer does not average.
    #[error("variable {name:?} has type {dtype:?}: only f32 variables are averaged")]
    Unsupported {
        /// The variable's name in the `VarMap`.
        name: String,
        /// Its type.
        dtype: CandleDType,
    },
}

/// A candle model's variables, averaged across the ranks of a communicator.
pub struct Ddp {
    reducer: GradReducer,
    /// The variables sorted by name, with their reducer ids.
    vars: Vec<(String, Var, ParamId)>,
}

impl Ddp {
    /// A reducer of `varmap`'s variables (sorted by name) on `comm`.
    /// Collective; every rank must have the same variables.
    pub fn new(comm: &Communicator, varmap: &VarMap, config: ReducerConfig) -> Result<Ddp, Error> {
        let mut named: Vec<(String, Var)> = varmap
            .data()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        let mut layout = Layout::new();
        let mut vars = Vec::with_capacity(named.len());
        for (name, var) in named {
            if var.dtype() != CandleDType::F32 {
                return Err(Error::Unsupported {
                    name,
                    dtype: var.dtype(),
                });
            }
            let id = layout.push(name.clone(), var.elem_count(), DType::F32);
            vars.push((name, var, id));
        }
        let reducer = GradReducer::new(comm, layout, config)?;
        Ok(Ddp { reducer, vars })
    }

    /// Sets every rank's variables to rank 0's. Collective.
    pub fn broadcast_params(&mut self) -> Result<(), Error> {
        let mut values: Vec<Vec<f32>> = self
            .vars
            .iter()
            .map(|(_, var, _)| var.as_tensor().flatten_all()?.to_vec1::<f32>())
            .collect::<Result<_, _>>()?;
        {
            let mut views: Vec<&mut [f32]> = values.iter_mut().map(Vec::as_mut_slice).collect();
            self.reducer.broadcast_params(&mut views)?;
        }
        for ((_, var, _), v) in self.vars.iter().zip(values) {
            var.set(&Tensor::from_vec(v, var.shape(), var.device())?)?;
        }
        Ok(())
    }

    /// Averages `grads` across the ranks, in place: each variable's
    /// gradient is copied into bucket memory (last by name first; a bucket
    /// is all-reduced as soon as it is full, while the rest are copied),
    /// then the averages are put back. A variable without a gradient counts
    /// as zero if [`ReducerConfig::unused`] says so, and fails the step
    /// naming it otherwise.
    pub fn sync(&mut self, grads: &mut GradStore) -> Result<(), Error> {
        for (_, var, id) in self.vars.iter().rev() {
            if let Some(g) = grads.get(var) {
                let g = g.flatten_all()?.to_vec1::<f32>()?;
                self.reducer.accumulate(*id, &g)?;
            }
        }
        self.reducer.finish()?;
        for (_, var, id) in &self.vars {
            let avg = self.reducer.grad::<f32>(*id)?;
            grads.insert(var, Tensor::from_slice(avg, var.shape(), var.device())?);
        }
        self.reducer.zero_grads();
        Ok(())
    }

    /// The reducer underneath (buckets, step statistics, `no_sync`).
    pub fn reducer(&mut self) -> &mut GradReducer {
        &mut self.reducer
    }

    /// The variables' names, in the order the reducer knows them.
    pub fn names(&self) -> Vec<&str> {
        self.vars.iter().map(|(n, _, _)| n.as_str()).collect()
    }
}
