//! Data-parallel training of [candle](https://github.com/huggingface/candle) models on
//! distribute's strategies (the layer above the strategies in the crate map, beside the facade).
//!
//! [`DataParallel`] builds one copy of a user's candle model and optimizer per replica from a
//! closure over a `VarBuilder`, starts them all from replica 0's values (the chief's across
//! workers), checks that their variables agree, and runs a step function on every replica with
//! its copy and its input as candle tensors. Inside the step, [`ReplicaStep::backward_step`]
//! all-reduces every variable's gradient in one fused bucket, in the variables' name order, so
//! every copy receives bit-identical gradients and stays bit-identical
//! ([`DataParallel::check_in_sync`] proves it cheaply). A variable that changes outside
//! the optimizer (batch normalisation's running statistics) follows its [`VarPolicy`]: averaged
//! or taken from replica 0 after every step, or kept per replica. The optimizers'
//! state ([`AdamW`], [`Sgd`], any [`OptimizerState`]), the update count and the schedule's
//! position travel in `save`, `load` and `Checkpoints`, so a run resumes exactly;
//! [`Config`] adds learning-rate [`Schedule`]s and clipping by the global gradient norm, and
//! [`DataParallel::evaluate`] sums [`Metrics`] over a held-out dataset, each row once. Errors of candle and of the user's code
//! propagate with `?` and come back naming the replica. Each CPU replica's candle kernels get
//! their share of the cores ([`CpuThreads`]). With feature `cuda`, a `/gpu:N` replica trains on
//! candle's CUDA device `N` (gradients reduced through host memory).
//!
//! The same program runs on `MirroredStrategy` and, under `mpirun`, on
//! `MultiWorkerMirroredStrategy`: the crate knows strategies only through the strategy layer's
//! traits (`Strategy`, `StrategyExtended`, `CheckpointVariable`) and the `Workers` seam.
//! It knows nothing of particular strategies, of MPI or of how collectives move bytes.

mod buffers;
mod clip;
mod convert;
mod data_parallel;
mod dropout;
mod error;
mod evaluate;
#[cfg(feature = "cuda")]
#[path = "cuda.rs"]
mod gpu;
#[cfg(not(feature = "cuda"))]
#[path = "no_cuda.rs"]
mod gpu;
mod gradients;
mod optim;
mod policy;
mod precision;
mod replica;
mod schedule;
mod shard;
mod step;
mod threads;
mod training_state;
mod variables;

pub use convert::{CandleMasked, ToCandle, from_candle, to_candle};
pub use data_parallel::{Config, DataParallel};
pub use error::{Error, StepError};
pub use evaluate::{
    Metrics, all_reduce_scalar, all_reduce_scalars, all_reduce_tensor, all_reduce_tensors,
};
pub use optim::{
    AdamW, AnyOptimizer, OptimizerConfig, OptimizerState, ParamsSgd, PieceSlot, Sgd,
    ShardOptimizer, StateTensor,
};
pub use policy::{BATCH_NORM_MEAN, VarPolicy};
pub use precision::Precision;
pub use schedule::{Decay, Schedule};
pub use shard::{ReplicaMemory, Sharding};
pub use step::ReplicaStep;
pub use threads::CpuThreads;
pub use variables::VarInfo;
