//! Layer 3 of `distribute`: tensors placed on devices and the operations that move and reduce
//! them across replicas.
//!
//! Knows device names (layer 1) and distributed values (layer 2); knows nothing about strategies,
//! input pipelines, how replica threads are scheduled, or any transport between processes: the
//! NCCL and MPI backends are crates of their own (`distribute-nccl`, `distribute-mpi`), built
//! from the kit in [`backend`], and the other worker processes of a job are reached through
//! [`Workers`], the one cross-worker seam.
//!
//! Shared files: [`Tensor`] and [`AnyTensor`], the backend traits ([`CrossDeviceOps`],
//! [`StepLifecycle`], [`ReplicaCollectives`]), [`Destinations`], the cross-replica reductions every
//! backend shares, [`FusionPlan`], [`OpsPlan`] (which ops for which devices and workers) and
//! [`Workers`]. Each in-process host backend lives in a module of its own under `backends/`; GPU memory and kernels live in `cuda` (feature `cuda`), and the shared
//! files reach them through one small API that a build without `cuda` provides too, so `cfg`
//! appears only on `mod` lines. The pieces the backends are built from, for authors of new
//! backends and strategies, are in [`backend`], apart from what step functions use. The
//! in-process backends build on `group/`, the group engine ([`backend::CollectiveGroup`]), which
//! is no backend.

mod agreement;
mod backends;
mod bytes;
mod choose;
mod cross_replica;
mod destinations;
mod distributed;
mod error;
mod flat;
mod fnv;
mod fusion;
mod group;
mod kernel;
mod ops;
mod rendezvous;
mod sparse;
// `with_host!` reaches the `cuda` module below by textual scope.
#[macro_use]
mod tensor;
mod workers;

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(not(feature = "cuda"))]
mod no_cuda;

/// What the shared files need of GPUs: `cuda::bridge` with feature `cuda`, `no_cuda` without.
#[cfg(feature = "cuda")]
use cuda::bridge as gpu;
#[cfg(not(feature = "cuda"))]
use no_cuda as gpu;

pub use backends::{ReductionToOneDevice, SharedMemoryAllReduce};
pub use choose::OpsPlan;
pub use cross_replica::reduce_non_distributed_value;
pub use destinations::Destinations;
pub use error::{CollectiveError, GpuError};
pub use fusion::FusionPlan;
pub use group::GroupConfig;
pub use ops::{CrossDeviceOps, ReplicaCollectives, StepLifecycle};
pub use sparse::{AnyTensor, IndexedSlices};
pub use tensor::{DType, Element, Placement, Tensor};
pub use workers::Workers;

/// For authors of backends and strategies, not for step functions: the kit every backend is
/// built from, in this crate or another (the MPI backend of `distribute-mpi` uses nothing else):
/// the in-process rendezvous and collective group, the agreement record every backend gathers
/// before data moves and its hash, the fold kernel with its dtype dispatch, tensors as bytes and
/// delivery to destinations. Their API follows the backends' needs and is less stable than the
/// crate root's.
///
/// ```compile_fail,E0432
/// // Not at the crate root: a user's step never needs them.
/// use distribute_collectives::Rendezvous;
/// ```
pub mod backend {
    pub use crate::group::{CollectiveGroup, Member, ReducePlan};
    pub use crate::rendezvous::{Rendezvous, lock_ignoring_poison};

    /// Runs its body with a type alias naming the Rust type of a [`DType`](crate::DType):
    /// `with_dtype!(tensor.dtype(), T => tensor.to_vec::<T>())`.
    pub use crate::__with_dtype as with_dtype;
    pub use crate::agreement::{Call, MAX_DIMS, Record, Status, Verdict, judge};
    pub use crate::bytes::{element_bytes, element_bytes_mut, tensor_bytes};
    pub use crate::cross_replica::{deliver, reduce_and_deliver};
    pub use crate::fnv::Fnv;
    pub use crate::kernel::{Arith, check_op, contiguous, divide, reduce_slices, reduce_tensors};
    /// The half-precision element types, as [`with_dtype!`] names them.
    pub use half::{bf16, f16};
}
