//! `distribute-mpi`: the reductions of a multi-worker run across the worker processes of an MPI
//! job (Open MPI through the `mpi` crate), and the cross-worker seam over MPI.
//!
//! Layer: a backend beside the in-process ones of `distribute-collectives`, built from its root
//! traits and errors and its published kit (`distribute_collectives::backend`), with tensors,
//! their bytes and the fold kernel from `distribute-tensor`. Knows nothing about
//! strategies, replica threads' scheduling, input pipelines or step functions: a strategy
//! drives it through `CrossDeviceOps`, `StepLifecycle` and [`Workers`](distribute_collectives::Workers).
//! Building it needs MPI (`mpicc` and libclang for the `mpi` crate's bindings), so nothing that
//! runs in one process depends on it.
//!
//! Files, named by role as in every backend:
//! - `all_reduce`: [`MpiAllReduce`], the hierarchical backend (local shared memory, then one
//!   cross-process collective per fused bucket, then back to every local replica).
//! - `member`: a local replica's handle (`ReplicaCollectives`).
//! - `shared`: the state the backend and its handles share (the local group, the world, the
//!   folds' buffers).
//! - `agreement`: the agreement every cross-worker call starts with, on the one record of
//!   `distribute_collectives::backend::Record`, and its slot ([`INLINE_BYTES`] of payload).
//! - `folds`: the cross-worker folds in worker order (reduce-scatter from
//!   [`SCATTER_MIN_BYTES`]), and the buffers they fold into.
//! - `workers`: the worker services: [`Workers`](distribute_collectives::Workers) over MPI.
//! - `communicator`: [`MpiWorld`], MPI initialised once per process, deadline-bounded waits.
//! - `nccl_id` (feature `nccl`): [`nccl_for_mpi_world`], NCCL across the processes' GPUs with
//!   its unique id broadcast over MPI.

mod agreement;
mod all_reduce;
mod communicator;
mod folds;
mod member;
#[cfg(feature = "nccl")]
mod nccl_id;
mod shared;
mod workers;

pub use agreement::INLINE_BYTES;
pub use all_reduce::MpiAllReduce;
pub use communicator::MpiWorld;
pub use folds::SCATTER_MIN_BYTES;
#[cfg(feature = "nccl")]
pub use nccl_id::nccl_for_mpi_world;
