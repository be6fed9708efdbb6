//! The options of a distributed dataset: how the data is sharded among input pipelines
//! ([`AutoShardPolicy`]), what becomes of a step without a full batch for every replica
//! ([`PartialBatch`]), how a batch maps onto replicas ([`BatchSplit`]), and [`InputOptions`],
//! which gathers them with prefetching and placement.

use crate::{InputError, InputReplicationMode};

/// How a dataset is divided among input pipelines (TF's `AutoShardPolicy`). Checked when the
/// distributed dataset is built, so a policy that cannot apply is an error, not a warning.
///
/// ```
/// use distribute_input::AutoShardPolicy;
///
/// assert_eq!(AutoShardPolicy::default(), AutoShardPolicy::Auto);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AutoShardPolicy {
    /// No sharding: every pipeline reads all the data.
    Off,
    /// `File` when the source has at least one file per pipeline, else `Data`.
    #[default]
    Auto,
    /// Pipeline `p` of `P` reads files `p`, `p + P`, …; fewer files than pipelines is an error.
    File,
    /// Every pipeline reads all the data and keeps its share of each global batch.
    Data,
}

/// What happens to a step that does not have a full batch for every replica.
///
/// ```
/// use distribute_input::PartialBatch;
///
/// assert_eq!(PartialBatch::default(), PartialBatch::KeepUneven);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PartialBatch {
    /// TF's behaviour: uneven pieces, and empty (0-row) batches for replicas without data.
    #[default]
    KeepUneven,
    /// Drop short batches and incomplete steps: every replica gets the same full size every
    /// step. The global batch must then divide evenly by the number of pieces.
    DropRemainder,
    /// Pad every replica's batch with zero rows to the full size; read the mask with
    /// [`DistributedDataset::iter_masked`](crate::DistributedDataset::iter_masked).
    PadWithMask,
}

/// How one batch of the dataset maps onto replicas.
///
/// ```
/// use distribute_input::BatchSplit;
///
/// assert_eq!(BatchSplit::default(), BatchSplit::SplitGlobalBatch);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum BatchSplit {
    /// Each batch is a global batch, cut into ⌈b/N⌉-row pieces for the N replicas of all
    /// pipelines, as TF's `experimental_distribute_dataset` did with its legacy rebatch
    /// (IN-48). Current TF cuts every batch by the full batch's per-replica sizes instead
    /// ([`batch_sizes_for_worker`](crate::batch_sizes_for_worker)), which differs on a short
    /// last batch: a worker that splits unsharded data for its own replicas gets more, smaller
    /// steps here (IN-34: 4 steps where TF gives 3; see the crate docs).
    #[default]
    SplitGlobalBatch,
    /// Each batch goes whole to one replica; consecutive batches go to consecutive replicas
    /// (TF's raw input, and always the case for `distribute_datasets_from_function`).
    WholeBatches,
}

/// Options of a distributed dataset (TF's `InputOptions` plus the split and the policies).
///
/// ```
/// use distribute_input::{InputOptions, PartialBatch};
///
/// let options = InputOptions { partial_batch: PartialBatch::DropRemainder, ..InputOptions::default() };
/// assert_eq!(options.prefetch, 64);
/// assert!(options.fetch_to_device);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct InputOptions {
    /// How the data is divided among input pipelines.
    pub auto_shard: AutoShardPolicy,
    /// What a step without a full batch for every replica becomes.
    pub partial_batch: PartialBatch,
    /// Whether batches are global batches to split, or whole per-replica batches.
    pub split: BatchSplit,
    /// Steps prepared ahead on a background thread per pipeline (default 64); 0 makes them on
    /// the caller's thread. The producer sleeps while the buffer is full and is woken when it
    /// is half empty, so depth sets how often threads hand over: on 2 busy cores the in-memory
    /// bench lost 40% of its throughput at 2 steps, 18% at 16 and under 10% at 64.
    ///
    /// Memory: prepared steps are already placed. On the host (`fetch_to_device` off, or this
    /// crate's tensors, whose device is a label on a host buffer) steps of in-memory and file
    /// data are views of the source's blocks (copies only where a batch straddles two files,
    /// or is padded or shuffled), so depth costs little beyond the file blocks it reaches
    /// into. With `fetch_to_device` and a batch type whose placement copies onto an
    /// accelerator, every prepared step holds its own device copy: up to depth + 1 steps of
    /// device memory per pipeline, so lower the depth for large batches.
    pub prefetch: usize,
    /// Place each replica's batch on the replica's device (else on the worker's host CPU).
    pub fetch_to_device: bool,
    /// Run the dataset on the replica's device; only with `PerReplica` replication (IN-41).
    pub place_dataset_on_device: bool,
    /// One dataset per worker, or one per replica (`distribute_datasets_from_function` only).
    pub replication_mode: InputReplicationMode,
}

impl Default for InputOptions {
    fn default() -> Self {
        InputOptions {
            auto_shard: AutoShardPolicy::Auto,
            partial_batch: PartialBatch::KeepUneven,
            split: BatchSplit::SplitGlobalBatch,
            prefetch: 64,
            fetch_to_device: true,
            place_dataset_on_device: false,
            replication_mode: InputReplicationMode::PerWorker,
        }
    }
}

impl InputOptions {
    pub(crate) fn validate(&self) -> Result<(), InputError> {
        match self.replication_mode {
            InputReplicationMode::PerWorker if self.place_dataset_on_device => {
                Err(InputError::InvalidOption(
                    "place_dataset_on_device needs InputReplicationMode::PerReplica: a \
                     per-worker dataset feeds several devices"
                        .into(),
                ))
            }
            InputReplicationMode::PerReplica
                if self.place_dataset_on_device && self.fetch_to_device =>
            {
                Err(InputError::InvalidOption(
                    "place_dataset_on_device and fetch_to_device exclude each other: a dataset \
                     already on the device has nothing to fetch; turn one off"
                        .into(),
                ))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_accepts_the_allowed_combinations() {
        let per_replica = InputOptions {
            replication_mode: InputReplicationMode::PerReplica,
            place_dataset_on_device: true,
            fetch_to_device: false,
            ..InputOptions::default()
        };
        assert!(per_replica.validate().is_ok());
        assert!(InputOptions::default().validate().is_ok());
    }
}
