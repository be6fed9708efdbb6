//! Layer 4 of `distribute`: the operations that move and reduce tensors across replicas.
//!
//! Knows device names (layer 1), distributed values (layer 2) and tensors (layer 3,
//! `distribute-tensor`); knows nothing about strategies, input pipelines, how replica threads
//! are scheduled, or any transport between processes: the NCCL and MPI backends are crates of
//! their own (`distribute-nccl`, `distribute-mpi`), built from the kit in [`backend`] and the
//! tensor crate, and the other worker processes of a job are reached through [`Workers`], the
//! one cross-worker seam.
//!
//! Shared files: the backend traits ([`CrossDeviceOps`], [`StepLifecycle`],
//! [`ReplicaCollectives`]), [`Destinations`], the cross-replica reductions every backend shares,
//! [`FusionPlan`], [`OpsPlan`] (which ops for which devices and workers) and [`Workers`]. Each
//! in-process host backend lives in a module of its own under `backends/`. The pieces the
//! backends are built from, for authors of new backends and strategies, are in [`backend`],
//! apart from what step functions use. The in-process backends build on `group/`, the group
//! engine ([`backend::CollectiveGroup`]), which is no backend.

mod agreement;
mod backends;
mod choose;
mod cross_replica;
mod destinations;
mod error;
mod fusion;
mod group;
mod ops;
mod rendezvous;
mod workers;

pub use backends::{ReductionToOneDevice, SharedMemoryAllReduce};
pub use choose::OpsPlan;
pub use cross_replica::reduce_non_distributed_value;
pub use destinations::Destinations;
pub use error::CollectiveError;
pub use fusion::FusionPlan;
pub use group::GroupConfig;
pub use ops::{CrossDeviceOps, ReplicaCollectives, StepLifecycle};
pub use workers::Workers;

/// For authors of backends and strategies, not for step functions: the kit every backend is
/// built from, in this crate or another (the MPI backend of `distribute-mpi` uses nothing else
/// besides the tensor crate's bytes and kernels): the in-process rendezvous and collective group,
/// the agreement record every backend gathers before data moves, and delivery to destinations.
/// Their API follows the backends' needs and is less stable than the crate root's.
///
/// ```compile_fail,E0432
/// // Not at the crate root: a user's step never needs them.
/// use distribute_collectives::Rendezvous;
/// ```
pub mod backend {
    pub use crate::agreement::{Call, MAX_DIMS, Record, Status, Verdict, judge};
    pub use crate::cross_replica::{deliver, reduce_and_deliver};
    pub use crate::group::{CollectiveGroup, Member, ReducePlan};
    pub use crate::rendezvous::Rendezvous;
}
