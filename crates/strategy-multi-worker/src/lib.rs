//! `distribute-multi-worker`: [`MultiWorkerMirroredStrategy`], synchronous data parallelism over
//! the replicas of every worker process of an MPI job (TF 2.x's `MultiWorkerMirroredStrategy`).
//!
//! Layer: a strategy beside `distribute-mirrored`, whose replica threads it runs in each
//! process; across processes it knows MPI through `distribute-mpi` only, and hands the strategy
//! layer the workers through the one cross-worker seam, `distribute_collectives::Workers`.
//! Knows nothing about XLA, PJRT or candle. Building it needs MPI, so a one-process build never
//! compiles it.
//!
//! Files: `strategy` (the strategy), `cluster` (TF's multi-worker device lists from a cluster
//! spec or `TF_CONFIG`, checked against the MPI world).

mod cluster;
mod strategy;

pub use cluster::MultiWorkerDevices;
pub use strategy::{MultiWorkerConfig, MultiWorkerMirroredStrategy};
