//! `cargo xtask demo`: the whole stack training a real model, data-parallel, end to end. An
//! application on top of the `distribute` facade (nothing in the workspace depends on it).
//!
//! A multilayer perceptron (11 inputs → `--hidden` tanh units → 1 output, backprop written as
//! fused loops over contiguous rows, [`model`]) learns the quality score of red wines
//! (`linfa-datasets`' wine-quality data, 1599 rows) from their 11 measurements, with a fixed
//! 20 % held out for validation ([`data`]). Every layer of `distribute` takes part:
//!
//! - the input crate's `DistributedDataset` shuffles (seeded), repeats and cuts each global
//!   batch into per-replica batches: replica `r` gets the `r`-th contiguous chunk, prefetched
//!   on a background thread;
//! - the weights are mirrored variables made by `strategy.create_variable`, one per layer weight
//!   and bias, plus one momentum slot each;
//! - each replica computes the gradient sums of its rows, one fused `all_reduce` adds them up,
//!   and a `merge_call` applies SGD with momentum through the cross-replica `update_with`, as
//!   TF's optimizers do ([`mirrored`]).
//!
//! The same training then runs on one replica with the same global batch and data order; the
//! largest difference between the two runs' weights must be at most [`TOLERANCE`], or the demo
//! fails ([`report`]).
//!
//! [`hand_rolled`] is the same training written by hand, without the library: the floor
//! `cargo xtask bench strategy` measures the strategy against.
//!
//! `cargo xtask demo --workers W [--replicas R]` (feature `mpi`) starts the demo as W worker
//! processes under `mpirun`, training with `MultiWorkerMirroredStrategy` (R replicas each); the
//! chief reports the time per step with the cross-worker communication as its own part, and
//! checks the weights against one process with one replica ([`TOLERANCE`]) and that every copy
//! on every worker has the same bits (`report::run_multi_worker`).
//!
//! `--strategy tpu` trains the same model from the same batches with `TpuStrategy`, one replica
//! per PJRT device, the whole step compiled once ([`tpu`]). It is checked against one TPU
//! replica ([`TOLERANCE`]) and against MirroredStrategy ([`TPU_MIRRORED_TOLERANCE`]).
//!
//! `--framework candle` trains a candle classifier of the quality class instead, with
//! `distribute-candle` on `MirroredStrategy` ([`candle`]), checked the same way against one
//! replica ([`candle::CANDLE_TOLERANCE`]): plain SGD by default, or `--optimizer adamw`, with
//! `--weight-decay`, `--warmup W` (linear warmup, then cosine decay to zero at the last step)
//! and `--clip-norm X` (clipping by the global norm of the all-reduced gradients).
//!
//! ```text
//! cargo xtask demo [--framework native|candle] [--replicas N | --devices /cpu:0,/cpu:1,...] [--strategy mirrored|tpu]
//!                  [--steps S] [--batch B] [--lr LR] [--momentum M] [--hidden H] [--seed SEED]
//!                  [--optimizer sgd|adamw] [--weight-decay X] [--warmup W] [--clip-norm X]
//!                  [--tpu-arithmetic f32|f64-sums] [--plot FILE.png]
//!                  [--checkpoint-dir DIR [--checkpoint-every N]]
//! ```
//!
//! `--model gpt` trains a small byte-level GPT on this project's own documentation instead, with
//! `distribute-candle` (the `gpt` example's model and training loop, [`gpt`]): held-out loss and
//! perplexity, a sample the trained model writes, and the same checks against one replica
//! ([`gpt::GPT_TOLERANCE`]) and the held-out loss's goal ([`gpt::HELD_OUT_GOAL`]).
//!
//! `--checkpoint-dir DIR` (candle classifier) makes the run resumable: the chief writes a
//! checkpoint every `--checkpoint-every N` steps ([`checkpoint`]), and the demo started again
//! with the same arguments goes on from the newest good one, to the bits of a run that never
//! stopped on the same worker and replica counts (the checkpoint holds the optimizer's state and
//! the schedule's position too).

pub mod candle;
pub mod checkpoint;
pub mod cli;
mod config;
pub mod data;
pub mod gpt;
pub mod hand_rolled;
pub mod mirrored;
pub mod model;
mod progress;
pub mod report;
pub mod tpu;

pub use cli::{Args, Framework, ModelKind, StrategyKind, parse_args};
pub use config::{Config, TOLERANCE, TPU_MIRRORED_TOLERANCE};

/// Whether `mpirun` (Open MPI's, or an MPICH-style launcher) started this process: the demo is
/// then one worker of `cargo xtask demo --workers W`.
pub fn started_by_mpirun() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"]
        .iter()
        .any(|name| std::env::var_os(name).is_some())
}
pub use report::run;
