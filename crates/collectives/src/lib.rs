//! Layer 3 of `distribute`: tensors placed on devices and the operations that move and reduce
//! them across replicas.
//!
//! Knows device names (layer 1) and distributed values (layer 2); knows nothing about strategies,
//! input pipelines or how replica threads are scheduled.

pub mod algorithms;
mod error;
mod flat;
mod kernel;
mod sparse;
mod tensor;

pub use error::CollectiveError;
pub use sparse::{AnyTensor, IndexedSlices};
pub use tensor::{DType, Element, Placement, Tensor};
