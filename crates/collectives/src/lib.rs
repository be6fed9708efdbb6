//! Layer 3 of `distribute`: tensors placed on devices and the operations that move and reduce
//! them across replicas.
//!
//! Knows device names (layer 1) and distributed values (layer 2); knows nothing about strategies,
//! input pipelines or how replica threads are scheduled.

mod aggregate;
pub mod algorithms;
mod all_reduce_spec;
mod bootstrap;
#[cfg(feature = "cuda")]
pub mod cuda;
mod distributed;
mod error;
mod flat;
mod group;
mod kernel;
mod keys;
#[cfg(feature = "nccl")]
mod nccl;
mod ops;
mod packing;
mod rendezvous;
mod sparse;
mod tensor;

pub use aggregate::{
    AggregatedGradient, aggregate_single_gradient_using_copy, aggregate_tensors_or_indexed_slices,
    divide_by_n, has_inf_or_nan,
};
pub use all_reduce_spec::{AllReduceSpec, SpecLimit, assign_grads_to_specs, split_grads_by_size};
pub use bootstrap::{NcclRank, UNIQUE_ID_BYTES, exchange_unique_id, nccl_rank};
pub use error::{CollectiveError, GpuError};
pub use group::{CollectiveGroup, GroupConfig, Member, ReducePlan};
pub use keys::{
    CollectiveKeys, DEFAULT_RANGE_SIZE_LIMIT, INSTANCE_KEY_START, extract_ranges,
    group_device_names,
};
#[cfg(feature = "nccl")]
pub use nccl::{NCCL_ID_BYTES, NcclAllReduce};
pub use ops::{
    CrossDeviceOps, Destinations, ReductionToOneDevice, ReplicaCollectives, SharedMemoryAllReduce,
    choose_the_best, reduce_non_distributed_value, simple_broadcast,
};
pub use packing::{
    ConcatAndSplitPacker, ConcatAndSplitPacking, FusionPlan, NumPacks, SmallTensorPacking,
    SparsitySplit, contains_indexed_slices, group_by_size, is_indexed_slices, pack_small_tensors,
    pack_split_sizes, pack_tensors, split_by_sparsity, stitch_values, unpack_small_tensors,
    unpack_tensors,
};
pub use rendezvous::Rendezvous;
pub use sparse::{AnyTensor, IndexedSlices};
pub use tensor::{DType, Element, Placement, Tensor};
