//! Layer 3 of `distribute`: tensors placed on devices and the operations that move and reduce
//! them across replicas.
//!
//! Knows device names (layer 1) and distributed values (layer 2); knows nothing about strategies,
//! input pipelines or how replica threads are scheduled.
//!
//! Shared files: [`Tensor`] and [`AnyTensor`], the backend traits ([`CrossDeviceOps`],
//! [`StepLifecycle`], [`ReplicaCollectives`]), [`Destinations`], the cross-replica reductions every
//! backend shares, [`FusionPlan`] and [`choose_the_best`]. Each backend lives in a module of its
//! own under `backends/`; GPU memory and kernels live in `cuda` (feature `cuda`), and the shared
//! files reach them through one small API that a build without `cuda` provides too, so `cfg`
//! appears only on `mod` lines. The pieces the backends are built from, for authors of new
//! backends and strategies, are in [`backend`], apart from what step functions use.

mod backends;
mod choose;
mod cross_replica;
mod destinations;
mod distributed;
mod error;
mod flat;
mod fusion;
mod kernel;
mod ops;
mod rendezvous;
mod sparse;
// `with_host!` reaches the `cuda` module below by textual scope.
#[macro_use]
mod tensor;

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(not(feature = "cuda"))]
mod no_cuda;

/// What the shared files need of GPUs: `cuda::bridge` with feature `cuda`, `no_cuda` without.
#[cfg(feature = "cuda")]
use cuda::bridge as gpu;
#[cfg(not(feature = "cuda"))]
use no_cuda as gpu;

#[cfg(feature = "mpi")]
pub use backends::mpi::MpiAllReduce;
#[cfg(feature = "nccl")]
pub use backends::nccl::NcclAllReduce;
pub use backends::{GroupConfig, ReductionToOneDevice, SharedMemoryAllReduce};
pub use choose::choose_the_best;
pub use cross_replica::reduce_non_distributed_value;
pub use destinations::Destinations;
pub use error::{CollectiveError, GpuError};
pub use fusion::FusionPlan;
pub use ops::{CrossDeviceOps, ReplicaCollectives, StepLifecycle};
pub use sparse::{AnyTensor, IndexedSlices};
pub use tensor::{DType, Element, Placement, Tensor};

/// For authors of backends and strategies, not for step functions: the building blocks the
/// bundled backends are made of (the in-process rendezvous and collective group, the MPI
/// world and its tuning constants, NCCL's unique-id bootstrap). They are public so that a new
/// backend or strategy can be built from them; their API follows the backends' needs and is less
/// stable than the crate root's.
///
/// ```compile_fail,E0432
/// // Not at the crate root: a user's step never needs them.
/// use distribute_collectives::Rendezvous;
/// ```
pub mod backend {
    #[cfg(feature = "mpi")]
    pub use crate::backends::mpi::{INLINE_BYTES, MpiWorld, SCATTER_MIN_BYTES};
    pub use crate::backends::{CollectiveGroup, Member, ReducePlan};
    pub use crate::rendezvous::{Rendezvous, lock_ignoring_poison};

    /// NCCL's bootstrap across processes: the authenticated exchange of NCCL's 128-byte unique
    /// id over TCP, the cluster key that authenticates it, and each process's NCCL rank.
    pub mod nccl_bootstrap {
        pub use crate::backends::nccl::auth::{
            CLUSTER_KEY_FILE_VAR, CLUSTER_KEY_VAR, ClusterKey, ExchangeAuth, MIN_CLUSTER_KEY_BYTES,
            UNAUTHENTICATED_VAR,
        };
        pub use crate::backends::nccl::bootstrap::{
            NcclRank, UNIQUE_ID_BYTES, exchange_unique_id, exchange_unique_id_unauthenticated,
            exchange_unique_id_with_key, nccl_rank,
        };
    }
}
