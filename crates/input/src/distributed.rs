//! [`DistributedDataset`]: one step per item, in the form a strategy's `run` takes (or one
//! `PerReplica` of whole batches), from a global-batch dataset
//! ([`DistributedDataset::new`]) or from one dataset per input pipeline
//! ([`distribute_datasets_from_function`]), with the auto-shard and partial-batch policies and
//! prefetching on background threads.
//!
//! Each local input pipeline turns its dataset into a stream of *pieces* (slices of batches, in
//! order), keeps its share of them, and hands its replicas one piece each per step. Pipelines
//! that run out early keep handing out empty batches while another still has data, so every
//! replica gets a value on every step and all of them see the end on the same step.
//!
//! The parts live beside this file: the options (`options`), one pipeline's pieces and steps
//! (`pipeline`), the pipelines joined (`steps`), the iterators (`iterator`), the per-step
//! exchange between processes (`across_processes`) and the windowed agreement on the end of
//! data that multi-worker runs use (`agreement`).
//!
//! # Multi-worker rows
//!
//! In a multi-worker run (one process per worker, [`InputWorkers::worker_of_cluster`]) with W
//! workers × R local replicas, each global batch is cut into W·R per-replica chunks, and the
//! replicas get TensorFlow's `MultiWorkerMirroredStrategy` rows:
//! - [`DistributedDataset::new`] sharded by data: local replica `r` of worker `w` gets chunk
//!   `r·W + w` (the chunks are dealt to the workers round-robin). Sharded by file, worker `w`
//!   reads files `w`, `w + W`, … and cuts its own global batches the same way, its replicas
//!   taking consecutive chunks.
//! - [`distribute_datasets_from_function`]: worker `w`'s function produces its contiguous part
//!   of each global batch ([`InputContext::rows_of_global_batch`]), batched per replica, and
//!   local replica `r` gets global chunk `w·R + r`.
//!
//! With one replica per worker both give worker `w` rows `w·B/W..(w+1)·B/W` of a `B`-row
//! batch: the rows a single process with W replicas gives its replicas.

mod across_processes;
mod agreement;
mod iterator;
mod options;
mod pipeline;
mod position;
mod steps;

use std::sync::Arc;

use distribute_values::{Lock, ReplicaDeviceMap};

use agreement::{Agreement, AgreementConfig};
pub use agreement::{DEFAULT_AGREEMENT_WINDOW, SumAcrossProcesses};
pub use iterator::{
    DistributedIterator, MaskedDistributedIterator, MaskedPerReplicaIterator, PerReplicaIterator,
};
pub use options::{AutoShardPolicy, BatchSplit, InputOptions, PartialBatch};
use pipeline::{LocalStep, LocalSteps, Plan};
pub use position::InputPosition;
use steps::Steps;

use crate::dataset::BatchSpec;
use crate::source::BoxIter;
use crate::{
    Batch, Dataset, InputContext, InputError, InputReplicationMode, InputWorkers, Prefetch,
};

/// A global-batch dataset distributed over input workers: iterate it for one step per item, in
/// the form a strategy's `run` takes (the batch's structure with per-replica leaves); see
/// [`iter_per_replica`](Self::iter_per_replica) for one [`PerReplica`] of whole batches.
///
/// ```
/// use distribute_input::{Dataset, DistributedDataset, InputOptions, InputWorkers};
///
/// let workers = InputWorkers::local(["/cpu:0", "/cpu:1"])?;
/// let ds = Dataset::range(5).batch(4, false)?;
/// let dist = DistributedDataset::new(ds, &workers, InputOptions::default())?;
/// let steps: Vec<Vec<Vec<i64>>> = dist.iter_per_replica().map(|step| {
///     step?.into_iter().map(|t| Ok(t.to_vec::<i64>()?)).collect()
/// }).collect::<Result<_, distribute_input::InputError>>()?;
/// // The short last batch leaves the second replica an empty batch.
/// assert_eq!(steps, [vec![vec![0, 1], vec![2, 3]], vec![vec![4], vec![]]]);
/// # Ok::<(), distribute_input::InputError>(())
/// ```
///
/// [`PerReplica`]: distribute_values::PerReplica
pub struct DistributedDataset<B: Batch> {
    plans: Vec<Arc<Plan<B>>>,
    /// Processes that feed replicas of each step: all input pipelines over the local ones.
    num_processes: usize,
    device_map: Arc<ReplicaDeviceMap>,
    prefetch: usize,
    partial: PartialBatch,
    applied: Vec<AutoShardPolicy>,
    /// Whether every process reads the same stream and so knows the end of data alone.
    same_stream: bool,
    /// How the processes agree on the end of data when they read different streams.
    agreement: Option<AgreementConfig>,
    /// Where the next iteration starts, set by [`resume_from`](Self::resume_from) and taken
    /// by that iteration.
    resume: Lock<Option<InputPosition>>,
}

impl<B: Batch> DistributedDataset<B> {
    /// Distributes `dataset`, whose batches are global batches (or whole per-replica batches
    /// with [`BatchSplit::WholeBatches`]), over `workers`, sharding it across their input
    /// pipelines as `options.auto_shard` says.
    ///
    /// Each global batch of `b` rows, a short last one included, is cut into ⌈b/N⌉-row pieces
    /// for the N replicas: TF's legacy rebatch, not current TF's, which differs on a short last
    /// batch (IN-34, see [`BatchSplit::SplitGlobalBatch`]).
    ///
    /// Errors: a dataset without a batching step (IN-50), per-replica replication (only for
    /// [`distribute_datasets_from_function`]), invalid option combinations (IN-41), workers
    /// with different replica counts when splitting across several pipelines, a `File`
    /// policy the source cannot satisfy, and a `DropRemainder` split that cannot be even.
    pub fn new(
        dataset: Dataset<B>,
        workers: &InputWorkers,
        options: InputOptions,
    ) -> Result<Self, InputError> {
        options.validate()?;
        if options.replication_mode == InputReplicationMode::PerReplica {
            return Err(InputError::InvalidOption(
                "per-replica replication needs one dataset per replica: use \
                 distribute_datasets_from_function"
                    .into(),
            ));
        }
        let spec = dataset.batch_spec().ok_or(InputError::NotBatched)?;
        let split = options.split == BatchSplit::SplitGlobalBatch;
        let size = match spec.uniform_size() {
            Some(size) => size,
            None if !split => spec.max_size(),
            None => {
                return Err(InputError::InvalidOption(format!(
                    "a dataset rebatched into sizes {:?} has no global batch to split: use \
                     BatchSplit::WholeBatches or distribute_datasets_from_function",
                    spec.sizes
                )));
            }
        };
        let num_pipelines = workers.num_input_pipelines();
        let replicas = workers.devices(0).len();
        if (0..workers.num_workers()).any(|w| workers.devices(w).len() != replicas)
            || workers.num_replicas_in_sync() != num_pipelines * replicas
        {
            return Err(InputError::InvalidOption(format!(
                "every input worker needs the same number of replicas to share a dataset \
                 ({} replicas in sync over {num_pipelines} pipelines)",
                workers.num_replicas_in_sync()
            )));
        }
        let pieces_per_batch = if split { num_pipelines * replicas } else { 1 };
        if options.partial_batch == PartialBatch::DropRemainder
            && !size.is_multiple_of(pieces_per_batch)
        {
            return Err(InputError::IndivisibleBatch {
                global_batch: size,
                replicas: pieces_per_batch,
            });
        }
        let mut plans = Vec::new();
        let mut applied = Vec::new();
        for w in 0..workers.num_workers() {
            let pipeline = workers.pipeline_id(w);
            let policy = resolve_policy(options.auto_shard, &dataset, num_pipelines)?;
            let (sharded, keep) = match policy {
                AutoShardPolicy::File => {
                    let files = dataset.source().files();
                    let mine: Vec<_> = files
                        .iter()
                        .skip(pipeline)
                        .step_by(num_pipelines)
                        .cloned()
                        .collect();
                    let source = dataset.source().with_files(mine)?;
                    (dataset.with_source(source), None)
                }
                AutoShardPolicy::Data if num_pipelines > 1 => {
                    (dataset.clone(), Some((num_pipelines, pipeline)))
                }
                _ => (dataset.clone(), None),
            };
            applied.push(policy);
            plans.push(Arc::new(Plan {
                dataset: sharded,
                pieces_per_batch,
                keep,
                full_piece: size.div_ceil(pieces_per_batch),
                full_batch: spec.uniform_size().unwrap_or(0),
                partial: options.partial_batch,
                placement: placement(workers, w, &options),
            }));
        }
        Ok(DistributedDataset {
            plans,
            num_processes: workers.num_processes(),
            device_map: Arc::clone(workers.device_map()),
            prefetch: options.prefetch,
            partial: options.partial_batch,
            same_stream: !applied.contains(&AutoShardPolicy::File),
            applied,
            agreement: None,
            resume: Lock::new(None),
        })
    }

    /// Lets the iterators of a multi-worker run end on the same step on every process:
    /// `sum` is an integer sum all-reduce across the worker processes (from the strategy's
    /// cross-process collectives), called by [`iter`](Self::iter)'s iterators once per
    /// `window` steps, and only when the processes read different streams (sharded by file,
    /// or from [`distribute_datasets_from_function`]); data-sharded and unsharded datasets
    /// end together without it. The rule, in [`SumAcrossProcesses`]: each process reads up to `window` steps ahead, one exchange tells all of them how many steps
    /// someone has data for, and a process that ran out hands its replicas empty batches until
    /// then. An error of the exchange, or another process's failure, ends iteration with an
    /// error on every process on the same step.
    ///
    /// [`iter_masked`](Self::iter_masked) agrees the same way, a process that ran out handing
    /// its replicas padding with all-zero masks.
    ///
    /// Errors: a `window` of 0.
    ///
    /// ```
    /// use distribute_input::{distribute_datasets_from_function, Dataset, InputError, InputOptions, InputWorkers, SumAcrossProcesses};
    ///
    /// // Worker 0 of 2, alone in this example: the "sum" adds what worker 1 would report
    /// // with no data at all.
    /// let workers = InputWorkers::worker_of_cluster(2, 0, "/job:worker/task:0", ["/job:worker/task:0/cpu:0"])?;
    /// let dist = distribute_datasets_from_function(&workers, InputOptions::default(), |_| {
    ///     Dataset::range(3).batch(1, false)
    /// })?
    /// .with_sum_across_processes(SumAcrossProcesses::new(|_counters| Ok(())), 8)?;
    /// assert!(dist.needs_agreement());
    /// assert_eq!(dist.iter().count(), 3);
    /// # Ok::<(), InputError>(())
    /// ```
    pub fn with_sum_across_processes(
        mut self,
        sum: SumAcrossProcesses,
        window: usize,
    ) -> Result<Self, InputError> {
        if window == 0 {
            return Err(InputError::InvalidOption(
                "the agreement window must be at least one step".into(),
            ));
        }
        self.agreement = Some(AgreementConfig { sum, window });
        Ok(self)
    }

    /// Makes the next iteration ([`iter`](Self::iter), [`iter_per_replica`](Self::iter_per_replica),
    /// [`iter_masked`](Self::iter_masked), `for … in &dataset`) iteration `position.epoch`
    /// (the order a reshuffling shuffle gives it) starting after its first `position.step`
    /// steps; later iterations start at their beginning. A job resumed from a checkpoint so
    /// reads the batches an uninterrupted run would have read, on any number of replicas and
    /// workers when each step is one global batch.
    ///
    /// The skipped steps' batches are read and dropped (nothing is placed on the replicas'
    /// devices twice, no step runs): the cost is reading that much data once.
    ///
    /// ```
    /// use distribute_input::{Dataset, DistributedDataset, InputOptions, InputPosition, InputWorkers};
    ///
    /// let workers = InputWorkers::local(["/cpu:0", "/cpu:1"])?;
    /// let dist = DistributedDataset::new(Dataset::range(8).batch(2, false)?, &workers, InputOptions::default())?
    ///     .resume_from(InputPosition::at_step(3));
    /// let first = dist.iter_per_replica().next().unwrap()?;
    /// assert_eq!(first.into_iter().next().unwrap().to_vec::<i64>()?, [6]);
    /// // The next iteration starts over.
    /// assert_eq!(dist.iter().count(), 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn resume_from(self, position: InputPosition) -> Self {
        *self.resume.lock() = Some(position);
        self
    }

    /// Whether the processes of a multi-worker run must exchange to end on the same step:
    /// more than one process feeds the steps and they read different streams.
    pub fn needs_agreement(&self) -> bool {
        self.num_processes > 1 && !self.same_stream
    }

    /// The steps, from the start, in the form a strategy's `run` takes (`B::Regrouped`: every
    /// leaf per replica), `None` after the last. Each call starts over and yields the same
    /// sequence (IN-14). `for step in &dataset` is the same.
    pub fn iter(&self) -> DistributedIterator<B> {
        DistributedIterator {
            inner: self.iter_per_replica(),
        }
    }

    /// The same steps as [`iter`](Self::iter), each one [`PerReplica`] of whole batches
    /// (replica `r`'s batch at index `r`): for reading batches rather than running them.
    ///
    /// [`PerReplica`]: distribute_values::PerReplica
    pub fn iter_per_replica(&self) -> PerReplicaIterator<B> {
        let (steps, skip) = self.steps();
        PerReplicaIterator {
            steps,
            skip,
            num_processes: self.num_processes,
            finished: false,
            agreement: self.agreement(),
        }
    }

    /// Like [`iter`](Self::iter), with each replica's batch paired with its mask (1.0 for
    /// real rows, 0.0 for padding; all ones unless the policy pads).
    pub fn iter_masked(&self) -> MaskedDistributedIterator<B> {
        let (steps, skip) = self.steps();
        MaskedDistributedIterator {
            inner: MaskedPerReplicaIterator {
                steps,
                skip,
                agreement: self.agreement(),
            },
        }
    }

    /// An iterator's side of the agreement on the end of data, when it needs one.
    fn agreement(&self) -> Option<Agreement<B>> {
        match &self.agreement {
            Some(config) if self.needs_agreement() => {
                Some(Agreement::new(config.clone(), self.num_processes))
            }
            _ => None,
        }
    }

    /// The devices of the replicas fed, worker by worker.
    pub fn device_map(&self) -> &Arc<ReplicaDeviceMap> {
        &self.device_map
    }

    /// The policy each local pipeline ended up with: `Auto` resolved to `File` or `Data`, or
    /// `Off` when there is a single input pipeline and so nothing to shard.
    pub fn applied_auto_shard(&self) -> &[AutoShardPolicy] {
        &self.applied
    }

    /// A new iteration's steps, and how many of them to skip (a resumed iteration's).
    fn steps(&self) -> (Steps<B>, u64) {
        let resume = self.resume.lock().take();
        if let Some(position) = resume {
            for plan in &self.plans {
                plan.dataset.set_next_epoch(position.epoch);
            }
        }
        let pipelines = self
            .plans
            .iter()
            .map(|plan| {
                let local = LocalSteps::new(Arc::clone(plan));
                let it: BoxIter<LocalStep<B>> = if self.prefetch > 0 {
                    Box::new(Prefetch::new(local, self.prefetch))
                } else {
                    Box::new(local)
                };
                it
            })
            .collect::<Vec<_>>();
        let steps = Steps {
            ended: vec![false; pipelines.len()],
            pipelines,
            plans: self.plans.clone(),
            partial: self.partial,
            device_map: Arc::clone(&self.device_map),
            replicas: self.plans.iter().map(|plan| plan.placement.len()).sum(),
            template: None,
            done: false,
        };
        (steps, resume.map_or(0, |p| p.step))
    }
}

impl<B: Batch> IntoIterator for &DistributedDataset<B> {
    type Item = Result<B::Regrouped, InputError>;
    type IntoIter = DistributedIterator<B>;
    fn into_iter(self) -> DistributedIterator<B> {
        self.iter()
    }
}

/// Builds one dataset per input pipeline with `dataset_fn` and distributes their batches as
/// per-replica batches: consecutive batches of a pipeline go to its consecutive replicas.
///
/// `dataset_fn` is called once per local worker in worker order (IN-05), or once per replica
/// with [`InputReplicationMode::PerReplica`] (IN-43), with the pipeline's [`InputContext`].
/// No auto-sharding happens: shard in the function with the context if the data should be
/// split.
///
/// Errors: invalid option combinations (IN-41), per-replica replication in a process that is
/// one of several (between-graph; TF supports it only on a single worker), and whatever
/// `dataset_fn` returns, wrapped with its pipeline id.
///
/// ```
/// use distribute_input::{distribute_datasets_from_function, Dataset, InputOptions, InputWorkers};
///
/// let workers = InputWorkers::local(["/cpu:0", "/cpu:1"])?;
/// let dist = distribute_datasets_from_function(&workers, InputOptions::default(), |cx| {
///     let per_replica = cx.per_replica_batch_size(4)?;
///     Dataset::range(8).shard(cx.num_input_pipelines(), cx.input_pipeline_id())?.batch(per_replica, false)
/// })?;
/// // Each step is what a strategy's `run` takes: one per-replica leaf here.
/// let first = dist.iter().next().unwrap()?;
/// assert_eq!(first.local_results()[1].to_vec::<i64>()?, [2, 3]);
/// # Ok::<(), distribute_input::InputError>(())
/// ```
pub fn distribute_datasets_from_function<B, F>(
    workers: &InputWorkers,
    options: InputOptions,
    dataset_fn: F,
) -> Result<DistributedDataset<B>, InputError>
where
    B: Batch,
    F: Fn(&InputContext) -> Result<Dataset<B>, InputError>,
{
    options.validate()?;
    let make = |pipeline: usize, cx: InputContext| {
        dataset_fn(&cx).map_err(|e| InputError::InputFunction {
            pipeline,
            source: Box::new(e),
        })
    };
    let plan = |dataset: Dataset<B>, placement: Vec<String>| {
        let full = dataset.batch_spec().map_or(1, BatchSpec::max_size);
        let uniform = dataset
            .batch_spec()
            .map_or(Some(1), BatchSpec::uniform_size);
        if options.partial_batch == PartialBatch::PadWithMask && dataset.batch_spec().is_none() {
            return Err(InputError::NotBatched);
        }
        Ok(Arc::new(Plan {
            dataset,
            pieces_per_batch: 1,
            keep: None,
            full_piece: full,
            full_batch: uniform.unwrap_or(0),
            partial: options.partial_batch,
            placement,
        }))
    };
    let mut plans = Vec::new();
    match options.replication_mode {
        InputReplicationMode::PerWorker => {
            for w in 0..workers.num_workers() {
                let cx = workers.input_context(w)?;
                let dataset = make(cx.input_pipeline_id(), cx)?;
                plans.push(plan(dataset, placement(workers, w, &options))?);
            }
        }
        InputReplicationMode::PerReplica => {
            if workers.num_processes() > 1 {
                // Each process sees only its own replicas, so its contexts would number them
                // from 0 and count only them, exactly like every other process's.
                return Err(InputError::InvalidOption(format!(
                    "per-replica replication needs every replica fed by this process, but it \
                     is one of {} processes (between-graph); use InputReplicationMode::PerWorker \
                     and split the data per replica in the input function",
                    workers.num_processes()
                )));
            }
            let total = workers.device_map().num_replicas();
            let mut replica = 0;
            for w in 0..workers.num_workers() {
                for slot in placement(workers, w, &options) {
                    let cx = InputContext::new(total, replica, total)?;
                    let dataset = make(replica, cx)?;
                    plans.push(plan(dataset, vec![slot])?);
                    replica += 1;
                }
            }
        }
    }
    Ok(DistributedDataset {
        applied: vec![AutoShardPolicy::Off; plans.len()],
        plans,
        num_processes: workers.num_processes(),
        device_map: Arc::clone(workers.device_map()),
        prefetch: options.prefetch,
        partial: options.partial_batch,
        same_stream: false,
        agreement: None,
        resume: Lock::new(None),
    })
}

fn resolve_policy<B: Batch>(
    policy: AutoShardPolicy,
    dataset: &Dataset<B>,
    num_pipelines: usize,
) -> Result<AutoShardPolicy, InputError> {
    let files = dataset.source().files().len();
    match policy {
        AutoShardPolicy::Auto if num_pipelines == 1 => Ok(AutoShardPolicy::Off),
        AutoShardPolicy::Auto if files >= num_pipelines => Ok(AutoShardPolicy::File),
        AutoShardPolicy::Auto => Ok(AutoShardPolicy::Data),
        AutoShardPolicy::File if files == 0 => Err(InputError::Shard {
            policy: "File",
            reason: format!(
                "{} is not read from files; use AutoShardPolicy::Data or Auto",
                dataset.source().describe()
            ),
        }),
        AutoShardPolicy::File if files < num_pipelines => Err(InputError::Shard {
            policy: "File",
            reason: format!(
                "{files} file(s) cannot give each of {num_pipelines} input pipelines at least \
                 one; split the data into more files, or use AutoShardPolicy::Data"
            ),
        }),
        other => Ok(other),
    }
}

/// Where worker `w`'s replicas receive their batches.
fn placement(workers: &InputWorkers, w: usize, options: &InputOptions) -> Vec<String> {
    if options.fetch_to_device || options.place_dataset_on_device {
        workers.devices(w).to_vec()
    } else {
        vec![workers.host(w).to_owned(); workers.devices(w).len()]
    }
}

#[cfg(test)]
mod tests {
    use distribute_tensor::Tensor;

    use super::*;

    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}

    #[test]
    fn datasets_cross_threads_and_iterators_move_between_them() {
        // A strategy builds the dataset on one thread and may iterate it on another.
        send_sync::<DistributedDataset<Tensor>>();
        send_sync::<Dataset<(Tensor, Tensor)>>();
        send::<DistributedIterator<Tensor>>();
        send::<MaskedDistributedIterator<Tensor>>();
    }
}
