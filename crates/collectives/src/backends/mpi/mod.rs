//! The MPI backend (feature `mpi`): the reductions of a multi-worker run, across the worker
//! processes of an MPI job (Open MPI through the `mpi` crate).
//!
//! - `agreement`: what every worker is about to do, agreed before any data moves (pure: no MPI).
//! - `bytes`: elements as bytes, how tensors travel between processes (no MPI).
//! - `world`: the process world, MPI initialised once per process, deadline-bounded waits.
//! - `backend`: [`MpiAllReduce`], the hierarchical backend (local shared memory, then one
//!   cross-process collective per fused bucket, then back to every local replica).
//! - `nccl_id`: `NcclAllReduce::for_mpi_world`, NCCL across processes with its unique id
//!   broadcast over MPI (features `mpi` and `nccl`).
//!
//! Knows nothing about strategies: a strategy drives it through [`crate::CrossDeviceOps`],
//! [`crate::StepLifecycle`] and [`MpiAllReduce::finish_step`].

// Without the feature only its tests use it.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
mod agreement;
#[cfg(feature = "mpi")]
mod backend;
mod bytes;
#[cfg(all(feature = "mpi", feature = "nccl"))]
mod nccl_id;
#[cfg(feature = "mpi")]
mod world;

#[cfg(feature = "mpi")]
pub use backend::{INLINE_BYTES, MpiAllReduce, SCATTER_MIN_BYTES};
pub(crate) use bytes::{element_bytes, element_bytes_mut};
#[cfg(feature = "mpi")]
pub use world::MpiWorld;
