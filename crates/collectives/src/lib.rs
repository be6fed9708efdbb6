//! Layer 3 of `distribute`: tensors placed on devices and the operations that move and reduce
//! them across replicas.
//!
//! Knows device names (layer 1) and distributed values (layer 2); knows nothing about strategies,
//! input pipelines or how replica threads are scheduled.

mod distributed;
mod error;
mod group;
mod kernel;
mod ops;
mod rendezvous;
mod sparse;
mod tensor;

pub use error::CollectiveError;
pub use group::{CollectiveGroup, GroupConfig, Member, ReducePlan};
pub use ops::{
    CrossDeviceOps, Destinations, ReductionToOneDevice, ReplicaCollectives, SharedMemoryAllReduce,
    choose_the_best, reduce_non_distributed_value, simple_broadcast,
};
pub use rendezvous::Rendezvous;
pub use sparse::{AnyTensor, IndexedSlices};
pub use tensor::{DType, Element, Placement, Tensor};
