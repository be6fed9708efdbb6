//! Layer 6 of `distribute`: [`MirroredStrategy`], synchronous data parallelism over the devices of
//! one machine.
//!
//! One persistent thread per replica, created with the strategy and reused by every `run`; the
//! replicas rendezvous at `merge_call` and at collectives, and every rendezvous is checked: a
//! replica that panics, fails, makes a different number of merge calls or never arrives turns
//! into an error on the caller, never a hang.
//!
//! With the feature `mpi`, [`MultiWorkerMirroredStrategy`] runs the same replicas in every
//! worker process of an MPI job, reductions spanning all of them.
//!
//! This crate knows the strategy layer and everything below it; it knows nothing about input
//! pipelines' internals or compiled (XLA) programs.

mod cluster;
mod merge;
mod mirrored;
#[cfg(feature = "mpi")]
mod multi_worker;
mod pool;

pub use cluster::{InferredCrossDeviceOps, MultiWorkerDevices};
pub use mirrored::{CollectiveTuning, CrossDeviceOpsChoice, MirroredConfig, MirroredStrategy};
#[cfg(feature = "mpi")]
pub use multi_worker::{MultiWorkerConfig, MultiWorkerMirroredStrategy};
