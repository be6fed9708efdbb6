//! Layer 6 of `distribute`: [`MirroredStrategy`], synchronous data parallelism over the devices of
//! one machine.
//!
//! One persistent thread per replica, created with the strategy and reused by every `run`; the
//! replicas rendezvous at `merge_call` and at collectives, and every rendezvous is checked: a
//! replica that panics, fails, makes a different number of merge calls or never arrives turns
//! into an error on the caller, never a hang.
//!
//! Across the worker processes of a job, `distribute-multi-worker`'s
//! `MultiWorkerMirroredStrategy` runs the same replicas in every process, on this crate's
//! replica threads ([`MirroredStrategy::run_replicas`]).
//!
//! This crate knows the strategy layer and everything below it; it knows nothing about input
//! pipelines' internals or compiled (XLA) programs.

mod choose;
mod first_failure;
mod merge;
mod mirrored;
mod pool;

pub use choose::choose_the_best;
pub use mirrored::{CollectiveTuning, CrossDeviceOpsChoice, MirroredConfig, MirroredStrategy};
