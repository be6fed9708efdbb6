//! The facade of `distribute` (top of the crate map): every layer re-exported, plus a
//! [`prelude`] for step functions.
//!
//! Write one step function and run it data-parallel on N replicas:
//!
//! ```
//! use distribute::prelude::*;
//! use distribute::tensor::Tensor;
//!
//! let strategy = MirroredStrategy::new(&["/cpu:0", "/cpu:1"])?;
//! let sums = strategy.run(
//!     |ctx, ()| {
//!         let mine = Tensor::scalar(ctx.device(), ctx.replica_id() as f32);
//!         ctx.all_reduce(ReduceOp::Sum, &mine)
//!     },
//!     &(),
//! )?;
//! assert!(sums.local_results().iter().all(|t| t.to_vec::<f32>().unwrap() == [1.0]));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! With the feature `mpi`, the prelude also has [`MultiWorkerMirroredStrategy`](multi_worker::MultiWorkerMirroredStrategy)
//! for programs started by `mpirun` (one process per worker).
//!
//! Downstream projects that need one layer can depend on its crate alone. This crate adds no
//! behaviour of its own.

// The README's Rust blocks are doc tests of this crate, so its examples keep compiling and passing.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;

pub use distribute_collectives as collectives;
pub use distribute_device_spec as device_spec;
pub use distribute_input as input;
pub use distribute_mirrored as mirrored;
#[cfg(feature = "mpi")]
pub use distribute_mpi as mpi;
#[cfg(feature = "mpi")]
pub use distribute_multi_worker as multi_worker;
#[cfg(feature = "nccl")]
pub use distribute_nccl as nccl;
#[cfg(feature = "nccl")]
pub use distribute_nccl_exchange as nccl_exchange;
pub use distribute_pjrt as pjrt;
pub use distribute_strategy as strategy;
pub use distribute_tensor as tensor;
pub use distribute_tpu as tpu;
pub use distribute_values as values;

/// The names a step function usually needs. None of them collides with the names of the
/// frameworks whose models run on the strategies (candle's `Tensor`, `DType`, `Device`,
/// `Module`…), so a program may glob-import both; the library's own tensors are
/// [`distribute::tensor::Tensor`](crate::tensor::Tensor).
pub mod prelude {
    pub use distribute_collectives::Destinations;
    pub use distribute_device_spec::LocalDevices;
    pub use distribute_input::{
        Dataset, DistributedDataset, InputOptions, InputPosition, PartialBatch,
    };
    pub use distribute_mirrored::{MirroredConfig, MirroredStrategy};
    #[cfg(feature = "mpi")]
    pub use distribute_multi_worker::{MultiWorkerConfig, MultiWorkerMirroredStrategy};
    pub use distribute_strategy::{
        CheckpointOptions, Checkpoints, CrossReplicaContext, DefaultStrategy, ReplicaContext,
        Strategy, StrategyError, VariableOptions,
    };
    // `Nest` is both the trait and `#[derive(Nest)]`, which makes a struct a dataset's batch, a
    // step's input and output, and one `all_reduce` payload.
    pub use distribute_values::{
        DistributedValues, DistributedVariable, Leaf, Mirrored, Nest, PerReplica, ReduceOp,
        UpdateOp, VariableAggregation, VariableSynchronization,
    };
}
