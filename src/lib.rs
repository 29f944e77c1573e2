//! ringwire: collective communication for distributed training.
//!
//! See the README for a tour and ARCHITECTURE.md for the map of modules.

pub mod algo;
pub mod dtype;
#[doc(hidden)]
pub mod testing;
// helper-owned modules (each line added by whoever owns the module):
// [wire]
// [store]
// [env]
// [net]

pub use dtype::{DType, Element, ReduceOp};
