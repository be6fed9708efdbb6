//! Layer 5 of `distribute`: the [`Strategy`] trait every strategy implements, and the typed
//! contexts step functions see.
//!
//! - [`ReplicaContext`]: inside one replica — its id, collectives with the other replicas
//!   ([`ReplicaContext::all_reduce`] on any nested structure of tensors, walked with
//!   `distribute_values::Nest`), [`ReplicaContext::merge_call`] into
//!   cross-replica context, and variable creation and updates.
//! - [`CrossReplicaContext`]: outside the replicas — `reduce_to`, `batch_reduce_to`,
//!   `broadcast_to`, `update`, `read_var`. Replica code cannot reach it except through
//!   `merge_call`, so mixing the two up does not compile (a top complaint about tf.distribute's
//!   thread-local modes).
//! - [`DefaultStrategy`]: one replica on the host, TF's identity semantics.
//!
//! [`Strategy::run_each`] gives back each replica's own value with the step's own error type
//! ([`RunError`]), what adapters such as `distribute-candle` build on; [`Strategy::run`] regroups
//! the values. Who a process is in a job (worker index, chief, replica ids) is derived from
//! [`StrategyExtended::workers`] alone, the one seam to the other workers.
//!
//! [`Checkpoints`] writes the variables and the input position every N steps (the chief
//! alone, atomically, checksummed) and restores the newest good checkpoint on any replica and
//! worker count, so a job that died resumes where it stopped.
//!
//! Datasets reach the replicas through [`Strategy::distribute_dataset`] (the input crate's
//! `DistributedDataset` over the strategy's devices), whose steps are `run`'s inputs.
//!
//! This crate knows devices, values, tensors, collectives and input pipelines (the layers below).
//! It knows nothing about how a strategy runs its replicas: threads are `distribute-mirrored`'s business, compiled
//! programs `distribute-tpu`'s.

mod checkpoint;
mod context;
mod default;
mod error;
mod steps;
mod strategy;
mod variables;

pub use checkpoint::{
    CHECKPOINT_MAGIC, CHECKPOINT_VERSION, CheckpointOptions, CheckpointVariable, Checkpoints,
    Resume,
};
pub use context::{
    CrossReplicaContext, MergeArgs, MergeResult, ReplicaContext, StrategyExtended, UpdateContext,
    in_replica_step, initial_value_from_chief,
};
pub use default::DefaultStrategy;
pub use error::{RunError, StrategyError};
pub use steps::{LastStepOutput, MultiStepContext};
pub use strategy::{Strategy, gather_local_replicas};
pub use variables::{
    VariableCreator, VariableOptions, canonicalize_variable_name, create_distributed_variable,
    replica_variable_name,
};
