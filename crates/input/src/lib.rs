//! Layer 4 of `distribute`: input pipelines that feed replicas.
//!
//! Owns [`InputContext`], [`InputReplicationMode`] and [`InputWorkers`]; the [`Batch`] row
//! operations on any nested structure of tensors (a tensor, tuples, `Vec`s, maps, `Option`s,
//! a user's `#[derive(Nest)]` struct: the values crate's `Nest`); [`Dataset`]s read from a [`Source`] (in memory,
//! [`NpySource`] for `.npy` files, [`CsvSource`] for CSV files, [`GeneratorSource`] for
//! computed data, or a user's own) with repeat, shuffle, shard, batch and rebatch; and
//! [`DistributedDataset`], which turns a global-batch dataset (or one dataset per pipeline,
//! with [`distribute_datasets_from_function`]) into steps in the form a strategy's `run` takes
//! (or one [`PerReplica`] of whole batches each), with the
//! auto-shard ([`AutoShardPolicy`]) and partial-batch ([`PartialBatch`]) policies and
//! [`Prefetch`] on background threads. In a multi-worker run (one process per worker) it gives
//! each replica TensorFlow's `MultiWorkerMirroredStrategy` rows, and the workers end a finite
//! dataset on the same step through a [`SumAcrossProcesses`] the strategy provides, without a
//! round trip per step.
//!
//! It builds on device names (layer 1), distributed values (layer 2) and tensors (layer 3). It
//! knows nothing about strategies, replica threads or collectives' algorithms: it hands out one
//! value per replica per step, possibly empty, so that whatever runs the replicas never waits
//! on a replica without data.
//!
//! # Deliberate departures from TF
//!
//! - **IN-34**: a global batch is cut into ⌈b/N⌉-row pieces for N replicas, a short last batch
//!   included: TF's legacy rebatch (IN-48). Current TF cuts every batch by the full batch's
//!   per-replica sizes ([`batch_sizes_for_worker`], IN-45), so a short last batch gives full
//!   pieces and empty ones. The step count differs when a worker splits unsharded data for
//!   its own replicas: 2 workers × 1 replica reading `range(12).batch(8)` with sharding off
//!   get 4 steps each here ([0..4], [4..8], [8..10], [10..12]) and 3 in TF ([0..4], [4..8],
//!   [8..12]). The legacy rule keeps each batch a unit of the split, so pieces never straddle
//!   two source batches and stay views of them. For TF's steps, rebatch into the per-replica
//!   sizes yourself ([`Dataset::rebatch`] with [`batch_sizes_for_worker`]) and distribute
//!   with [`BatchSplit::WholeBatches`].
//!
//! [`PerReplica`]: distribute_values::PerReplica
//!
//! ```
//! use distribute_input::{Dataset, DistributedDataset, InputOptions, InputWorkers};
//! use distribute_values::DistributedValues;
//!
//! let workers = InputWorkers::local(["/gpu:0", "/gpu:1"])?;
//! let dist = DistributedDataset::new(Dataset::range(100).batch(10, false)?, &workers, InputOptions::default())?;
//! let mut steps = 0;
//! for step in dist.iter_per_replica() {
//!     let step = step?;
//!     assert_eq!(step.values()[1].shape(), [5]);
//!     assert_eq!(step.values()[1].device(), "/job:localhost/replica:0/task:0/device:GPU:1");
//!     steps += 1;
//! }
//! assert_eq!(steps, 10);
//! # Ok::<(), distribute_input::InputError>(())
//! ```

mod batch;
mod context;
mod csv_source;
mod dataset;
mod distributed;
mod error;
pub mod npy;
mod prefetch;
mod rows;
mod source;
mod split;

pub use batch::{Batch, Masked, MaskedRegrouped};
pub use context::{InputContext, InputReplicationMode, InputWorkers};
pub use csv_source::{CsvOptions, CsvSource};
pub use dataset::{BatchSpec, Dataset, DatasetIter, ShuffleSpec};
pub use distributed::{
    AutoShardPolicy, BatchSplit, DEFAULT_AGREEMENT_WINDOW, DistributedDataset, DistributedIterator,
    InputOptions, InputPosition, MaskedDistributedIterator, MaskedPerReplicaIterator, PartialBatch,
    PerReplicaIterator, SumAcrossProcesses, distribute_datasets_from_function,
};
pub use error::{ErrorKind, InputError};
pub use npy::NpySource;
pub use prefetch::Prefetch;
pub use source::{BoxIter, GeneratorSource, MemorySource, RangeSource, Source};
pub use split::{batch_sizes_for_worker, split_sizes};
