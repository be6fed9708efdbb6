//! [`DistributedDataset`]: one `PerReplica` batch per step from a global-batch dataset
//! ([`DistributedDataset::new`]) or from one dataset per input pipeline
//! ([`distribute_datasets_from_function`]), with the auto-shard and partial-batch policies and
//! prefetching on background threads.
//!
//! Each local input pipeline turns its dataset into a stream of *pieces* (slices of batches, in
//! order), keeps its share of them, and hands its replicas one piece each per step. Pipelines
//! that run out early keep handing out empty batches while another still has data, so every
//! replica gets a value on every step and all of them see the end on the same step.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;

use distribute_values::{PerReplica, ReplicaDeviceMap};

use crate::dataset::{BatchSpec, BoxIter};
use crate::split::split_sizes_iter;
use crate::{
    Batch, Dataset, DatasetIter, InputContext, InputError, InputReplicationMode, InputWorkers,
    Masked, Prefetch,
};

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
    /// [`DistributedDataset::iter_masked`].
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
    fn validate(&self) -> Result<(), InputError> {
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

/// One local input pipeline: its dataset, its share of the pieces and its replicas' devices.
struct Plan<B: Batch> {
    dataset: Dataset<B>,
    /// Pieces each batch is cut into (1 for whole batches).
    pieces_per_batch: usize,
    /// `(P, p)` under data sharding: this is pipeline `p` of `P`, all reading the same stream.
    keep: Option<(usize, usize)>,
    /// Rows of a full piece, the size padding pads to.
    full_piece: usize,
    /// Rows of a full batch, below which `DropRemainder` drops a batch (0 for rebatched data,
    /// whose sizes vary by design).
    full_batch: usize,
    partial: PartialBatch,
    /// Where each replica's batch is placed.
    placement: Vec<String>,
}

/// A global-batch dataset distributed over input workers: iterate it for one [`PerReplica`]
/// batch per step.
///
/// ```
/// use distribute_input::{Dataset, DistributedDataset, InputOptions, InputWorkers};
///
/// let workers = InputWorkers::local(["/cpu:0", "/cpu:1"])?;
/// let ds = Dataset::range(5).batch(4, false)?;
/// let dist = DistributedDataset::new(ds, &workers, InputOptions::default())?;
/// let steps: Vec<Vec<Vec<i64>>> = dist.iter().map(|step| {
///     step?.into_iter().map(|t| Ok(t.to_vec::<i64>()?)).collect()
/// }).collect::<Result<_, distribute_input::InputError>>()?;
/// // The short last batch leaves the second replica an empty batch.
/// assert_eq!(steps, [vec![vec![0, 1], vec![2, 3]], vec![vec![4], vec![]]]);
/// # Ok::<(), distribute_input::InputError>(())
/// ```
pub struct DistributedDataset<B: Batch> {
    plans: Vec<Arc<Plan<B>>>,
    /// Processes that feed replicas of each step: all input pipelines over the local ones.
    num_processes: usize,
    device_map: Arc<ReplicaDeviceMap>,
    prefetch: usize,
    partial: PartialBatch,
    applied: Vec<AutoShardPolicy>,
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
            applied,
        })
    }

    /// The steps, from the start: one [`PerReplica`] batch per step, `None` after the last.
    /// Each call starts over and yields the same sequence (IN-14).
    pub fn iter(&self) -> DistributedIterator<B> {
        DistributedIterator {
            steps: self.steps(),
            num_processes: self.num_processes,
            finished: false,
        }
    }

    /// Like [`iter`](Self::iter), with each replica's batch paired with its mask (1.0 for
    /// real rows, 0.0 for padding; all ones unless the policy pads).
    pub fn iter_masked(&self) -> MaskedDistributedIterator<B> {
        MaskedDistributedIterator {
            steps: self.steps(),
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

    fn steps(&self) -> Steps<B> {
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
        Steps {
            ended: vec![false; pipelines.len()],
            pipelines,
            plans: self.plans.clone(),
            partial: self.partial,
            device_map: Arc::clone(&self.device_map),
            replicas: self.plans.iter().map(|plan| plan.placement.len()).sum(),
            template: None,
            done: false,
        }
    }
}

impl<B: Batch> IntoIterator for &DistributedDataset<B> {
    type Item = Result<PerReplica<B>, InputError>;
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
/// let first = dist.iter().next().unwrap()?;
/// assert_eq!(first.values()[1].to_vec::<i64>()?, [2, 3]);
/// # use distribute_values::DistributedValues;
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

/// A local step: each replica's batch and, under [`PartialBatch::PadWithMask`], how many of
/// its rows are real. Without padding every row is real and `real` stays empty, which saves a
/// vector per step.
struct LocalStep<B> {
    batches: Vec<B>,
    real: Vec<usize>,
}

impl<B: Batch> LocalStep<B> {
    fn with_capacity(replicas: usize, partial: PartialBatch) -> Self {
        let padded = partial == PartialBatch::PadWithMask;
        LocalStep {
            batches: Vec::with_capacity(replicas),
            real: Vec::with_capacity(if padded { replicas } else { 0 }),
        }
    }

    /// Adds `piece`, sliced, placed on `device` and padded as `plan` says.
    fn push(&mut self, piece: &Piece<B>, plan: &Plan<B>, device: &str) -> Result<(), InputError> {
        self.batches.push(finish(piece, plan, device)?);
        if plan.partial == PartialBatch::PadWithMask {
            self.real.push(piece.1.len());
        }
        Ok(())
    }

    /// Each batch with its mask: 1.0 for real rows, 0.0 for padding.
    fn masked(self) -> Result<Vec<Masked<B>>, InputError> {
        let LocalStep { batches, real } = self;
        batches
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let rows = b.rows("a replica's batch")?;
                Masked::pad(b, real.get(i).copied().unwrap_or(rows), rows)
            })
            .collect()
    }
}

/// A piece not yet placed: rows `range` of a batch. Slicing and placing happen in one go once
/// the replica is known, which touches the source buffer's shared reference count once per
/// piece instead of three times (a slice, a placed copy, the slice dropped); the consumer's
/// thread touches that count too, so every touch can cost a cache miss.
type Piece<B> = (Arc<B>, Range<usize>);

/// A 0-row batch of `batch`'s structure. A copy, not a slice: a slice would keep the whole
/// batch's buffer (often a whole file's block) alive for as long as the empty batch is kept.
fn zero_rows<B: Batch>(batch: &B) -> Result<Arc<B>, InputError> {
    Ok(Arc::new(batch.select_rows(&[])?))
}

/// One pipeline's steps: its kept pieces, one per replica per step.
struct LocalSteps<B: Batch> {
    plan: Arc<Plan<B>>,
    batches: DatasetIter<B>,
    /// Pieces cut from batches and not yet handed out.
    ready: VecDeque<Piece<B>>,
    /// A 0-row batch of the dataset's structure, for replicas without data.
    empty: Option<Arc<B>>,
    ended: bool,
}

impl<B: Batch> LocalSteps<B> {
    fn new(plan: Arc<Plan<B>>) -> Self {
        LocalSteps {
            batches: plan.dataset.iter(),
            plan,
            ready: VecDeque::new(),
            empty: None,
            ended: false,
        }
    }

    fn cut(&mut self, batch: B) -> Result<(), InputError> {
        let plan = &self.plan;
        let rows = batch.rows("a dataset batch")?;
        if plan.partial == PartialBatch::DropRemainder && rows < plan.full_batch {
            // Only the last batch is short.
            self.ended = true;
            return Ok(());
        }
        if self.empty.is_none() {
            self.empty = Some(zero_rows(&batch)?);
        }
        let batch = Arc::new(batch);
        let mut offset = 0;
        for size in split_sizes_iter(rows, plan.pieces_per_batch) {
            self.ready
                .push_back((Arc::clone(&batch), offset..offset + size));
            offset += size;
        }
        Ok(())
    }

    /// The next step. Under data sharding a step is a group of `P·R` consecutive pieces of
    /// the stream every pipeline reads, piece `j` going to pipeline `j mod P`, replica
    /// `j div P`; so all pipelines agree on the number of steps, and one whose share of the
    /// last group is short gets empty batches (IN-27, IN-30).
    fn step(&mut self) -> Result<Option<LocalStep<B>>, InputError> {
        let replicas = self.plan.placement.len();
        let group = self.plan.keep.map_or(replicas, |(num, _)| num * replicas);
        while self.ready.len() < group && !self.ended {
            match self.batches.next() {
                Some(batch) => self.cut(batch?)?,
                None => self.ended = true,
            }
        }
        if self.ready.is_empty()
            || (self.ready.len() < group && self.plan.partial == PartialBatch::DropRemainder)
        {
            self.ready.clear();
            return Ok(None);
        }
        let take = group.min(self.ready.len());
        let (plan, empty) = (&self.plan, &self.empty);
        let empty_piece = || {
            let empty = empty.as_ref().expect("set by the batch that made a piece");
            (Arc::clone(empty), 0..0)
        };
        let mut step = LocalStep::with_capacity(replicas, plan.partial);
        match plan.keep {
            None => {
                for device in &plan.placement {
                    let piece = self.ready.pop_front().unwrap_or_else(empty_piece);
                    step.push(&piece, plan, device)?;
                }
            }
            Some((num, mine)) => {
                let mut mine = self.ready.drain(..take).skip(mine).step_by(num);
                for device in &plan.placement {
                    let piece = mine.next().unwrap_or_else(empty_piece);
                    step.push(&piece, plan, device)?;
                }
            }
        }
        Ok(Some(step))
    }
}

/// Slices, places and (if the policy says so) pads one replica's batch.
fn finish<B: Batch>(
    (batch, range): &Piece<B>,
    plan: &Plan<B>,
    device: &str,
) -> Result<B, InputError> {
    let piece = batch.slice_rows_onto(range.clone(), device)?;
    if plan.partial == PartialBatch::PadWithMask {
        piece.pad_rows(plan.full_piece)
    } else {
        Ok(piece)
    }
}

impl<B: Batch> Iterator for LocalSteps<B> {
    type Item = Result<LocalStep<B>, InputError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.ended && self.ready.is_empty() {
            return None;
        }
        match self.step() {
            Ok(step) => step.map(Ok),
            Err(e) => {
                self.ended = true;
                self.ready.clear();
                Some(Err(e))
            }
        }
    }
}

/// The steps of all local pipelines, joined replica by replica.
struct Steps<B: Batch> {
    pipelines: Vec<BoxIter<LocalStep<B>>>,
    plans: Vec<Arc<Plan<B>>>,
    ended: Vec<bool>,
    partial: PartialBatch,
    device_map: Arc<ReplicaDeviceMap>,
    /// Replicas of all local pipelines.
    replicas: usize,
    /// A 0-row batch of the data's structure, once any pipeline has produced a step.
    template: Option<Arc<B>>,
    done: bool,
}

impl<B: Batch> Steps<B> {
    fn next_step(&mut self) -> Option<Result<LocalStep<B>, InputError>> {
        if self.done {
            return None;
        }
        let result = self.join();
        if !matches!(result, Some(Ok(_))) {
            self.done = true;
            // Stop the prefetch threads now rather than when the iterator is dropped.
            self.pipelines.clear();
        }
        result
    }

    fn join(&mut self) -> Option<Result<LocalStep<B>, InputError>> {
        if self.pipelines.len() == 1 {
            // One local pipeline, the usual case: its steps pass through as they are.
            let step = if self.ended[0] {
                None
            } else {
                self.pipelines[0].next()
            };
            return match step {
                Some(Ok(step)) => Some(self.remember_structure(&step).map(|()| step)),
                Some(Err(e)) => Some(Err(e)),
                None => {
                    self.ended[0] = true;
                    None
                }
            };
        }
        let mut parts = Vec::with_capacity(self.pipelines.len());
        for (pipeline, ended) in self.pipelines.iter_mut().zip(&mut self.ended) {
            let part = if *ended { None } else { pipeline.next() };
            match part {
                Some(Err(e)) => return Some(Err(e)),
                Some(Ok(step)) => parts.push(Some(step)),
                None => {
                    *ended = true;
                    parts.push(None);
                }
            }
        }
        if let Err(e) = self.remember_structure(parts.iter().flatten().next()?) {
            return Some(Err(e));
        }
        if parts.iter().any(Option::is_none) && self.partial == PartialBatch::DropRemainder {
            return None;
        }
        let template = self.template.as_ref()?;
        let mut step = LocalStep::with_capacity(self.replicas, self.partial);
        for (part, plan) in parts.into_iter().zip(&self.plans) {
            match part {
                Some(part) => {
                    step.batches.extend(part.batches);
                    step.real.extend(part.real);
                }
                // A pipeline that ran out while another has data: empty batches (IN-26).
                None => {
                    for device in &plan.placement {
                        if let Err(e) = step.push(&(Arc::clone(template), 0..0), plan, device) {
                            return Some(Err(e));
                        }
                    }
                }
            }
        }
        Some(Ok(step))
    }

    /// Keeps a 0-row batch of the first step's structure, for empty batches later.
    fn remember_structure(&mut self, step: &LocalStep<B>) -> Result<(), InputError> {
        if self.template.is_none()
            && let Some(first) = step.batches.first()
        {
            self.template = Some(zero_rows(first)?);
        }
        Ok(())
    }

    /// Empty batches for every local replica, for a step that only other processes have data
    /// for.
    fn empty_step(&self) -> Result<LocalStep<B>, InputError> {
        let template = self.template.as_ref().ok_or(InputError::NoBatchToImitate)?;
        let mut step = LocalStep::with_capacity(self.replicas, self.partial);
        for plan in &self.plans {
            for device in &plan.placement {
                step.push(&(Arc::clone(template), 0..0), plan, device)?;
            }
        }
        Ok(step)
    }

    fn per_replica(&self, step: LocalStep<B>) -> Result<PerReplica<B>, InputError> {
        Ok(PerReplica::new(Arc::clone(&self.device_map), step.batches)?)
    }
}

/// The steps of a [`DistributedDataset`]: one [`PerReplica`] batch per step, `None` at the end
/// of data (TF's `OutOfRange`), an `Err` for bad data, after which iteration ends. Dropping it
/// stops and joins its prefetch threads.
pub struct DistributedIterator<B: Batch> {
    steps: Steps<B>,
    /// Processes feeding replicas of each step, this one included.
    num_processes: usize,
    /// Whether `next_across_processes` has returned the end or an error, after which it takes
    /// part in no more exchanges.
    finished: bool,
}

impl<B: Batch> Iterator for DistributedIterator<B> {
    type Item = Result<PerReplica<B>, InputError>;

    fn next(&mut self) -> Option<Self::Item> {
        let step = self.steps.next_step()?;
        Some(step.and_then(|step| self.steps.per_replica(step)))
    }
}

/// What this process has for a step of `next_across_processes`, decided before the exchange.
enum LocalState<B: Batch> {
    /// A step with data.
    Data(PerReplica<B>),
    /// Out of data, with empty batches ready in case other processes have some.
    Empty(PerReplica<B>),
    /// Out of data without ever having seen a batch, so it cannot make empty ones.
    NoStructure,
    /// Reading the step failed.
    Failed(InputError),
}

impl<B: Batch> LocalState<B> {
    /// This process's report, in a code whose sum over `n` processes counts each state: 1 for
    /// data, `n + 1` for no structure, `(n + 1)²` for a failure, 0 for none.
    fn report(&self, n: u64) -> u64 {
        match self {
            LocalState::Data(_) => 1,
            LocalState::Empty(_) => 0,
            LocalState::NoStructure => n + 1,
            LocalState::Failed(_) => (n + 1) * (n + 1),
        }
    }
}

/// How many processes reported each state on a step: the sum of the reports, decoded.
struct Tally {
    with_data: u64,
    no_structure: u64,
    failed: u64,
}

impl Tally {
    /// Decodes `sum` over `n` processes; an error, the same on every process since it depends
    /// on the sum alone, if it counts more than `n` reports.
    fn decode(sum: u64, n: u64) -> Result<Tally, InputError> {
        let base = n + 1;
        let tally = Tally {
            with_data: sum % base,
            no_structure: (sum / base) % base,
            failed: sum / (base * base),
        };
        if tally.with_data + tally.no_structure + tally.failed > n {
            return Err(InputError::BadExchange {
                sum,
                processes: n as usize,
            });
        }
        Ok(tally)
    }
}

impl<B: Batch> DistributedIterator<B> {
    /// The next step when other processes feed other replicas of the same steps (one process
    /// per worker), so that all of them see the end of data, or a failure, on the same step
    /// (TF's `get_next_as_optional`, IN-29).
    ///
    /// Every process calls `sum_across_processes` on every step with its report, and it must
    /// return the exact sum of all processes' reports (an integer sum all-reduce; with `n`
    /// processes a report is at most `(n + 1)²`, so a float32 sum is exact up to 250 processes). A report
    /// says whether the process has data, has none, or failed, so on every process:
    /// - if any process failed, the call returns an error: the failed process's own, and
    ///   [`InputError::OtherProcessFailed`] on the others;
    /// - else if none has data, `Ok(None)`, the end; under [`PartialBatch::DropRemainder`] also
    ///   when not every process has data;
    /// - else `Ok(Some(step))`, in which a process that has run out gives its replicas empty
    ///   batches (an error, [`InputError::NoBatchToImitate`], on a process that never had a
    ///   batch to copy the structure of, and `OtherProcessFailed` on the others).
    ///
    /// After it has returned `Ok(None)` or an error it returns `Ok(None)` without calling
    /// `sum_across_processes`: the other processes have stopped too.
    ///
    /// ```
    /// use distribute_input::{Dataset, DistributedDataset, InputError, InputOptions, InputWorkers};
    ///
    /// // Worker 1 of 2, sharded by data: `range(3).batch(2)` gives it [1], then nothing.
    /// let workers = InputWorkers::worker_of_cluster(2, 1, "/job:worker/task:1", ["/job:worker/task:1/cpu:0"])?;
    /// let dist = DistributedDataset::new(Dataset::range(3).batch(2, false)?, &workers, InputOptions::default())?;
    /// let mut it = dist.iter();
    /// // Worker 0 has data on both steps (it gets [0], then [2]) and reports 1 each time.
    /// let first = it.next_across_processes(|mine| Ok::<_, InputError>(mine + 1))?.unwrap();
    /// let second = it.next_across_processes(|mine| Ok::<_, InputError>(mine + 1))?.unwrap();
    /// assert_eq!(first.into_iter().next().unwrap().to_vec::<i64>()?, [1]);
    /// assert_eq!(second.into_iter().next().unwrap().shape(), [0]);
    /// // Then neither has data.
    /// assert!(it.next_across_processes(|mine| Ok::<_, InputError>(mine))?.is_none());
    /// # Ok::<(), InputError>(())
    /// ```
    pub fn next_across_processes<E: From<InputError>>(
        &mut self,
        sum_across_processes: impl FnOnce(u64) -> Result<u64, E>,
    ) -> Result<Option<PerReplica<B>>, E> {
        if self.finished {
            return Ok(None);
        }
        self.finished = true;
        // Everything that can fail here happens before the exchange, so that a failure is
        // reported to the other processes rather than leaving them waiting in the next one.
        let local = self.local_state();
        let n = self.num_processes as u64;
        let mine = local.report(n);
        let tally = Tally::decode(sum_across_processes(mine)?, n)?;
        if tally.failed > 0 {
            return Err(match local {
                LocalState::Failed(e) => e,
                _ => InputError::OtherProcessFailed {
                    failed: tally.failed as usize,
                },
            }
            .into());
        }
        if tally.with_data == 0
            || (self.steps.partial == PartialBatch::DropRemainder && tally.with_data < n)
        {
            return Ok(None);
        }
        match local {
            LocalState::Data(step) | LocalState::Empty(step) if tally.no_structure == 0 => {
                self.finished = false;
                Ok(Some(step))
            }
            LocalState::Data(_) | LocalState::Empty(_) => Err(InputError::OtherProcessFailed {
                failed: tally.no_structure as usize,
            }
            .into()),
            LocalState::NoStructure => Err(InputError::NoBatchToImitate.into()),
            // Only reached when the sum leaves out this process's own report.
            LocalState::Failed(e) => Err(e.into()),
        }
    }

    fn local_state(&mut self) -> LocalState<B> {
        let (step, has_data) = match self.steps.next_step() {
            Some(Ok(step)) => (step, true),
            Some(Err(e)) => return LocalState::Failed(e),
            None => match self.steps.empty_step() {
                Ok(step) => (step, false),
                Err(InputError::NoBatchToImitate) => return LocalState::NoStructure,
                Err(e) => return LocalState::Failed(e),
            },
        };
        match self.steps.per_replica(step) {
            Ok(step) if has_data => LocalState::Data(step),
            Ok(step) => LocalState::Empty(step),
            Err(e) => LocalState::Failed(e),
        }
    }
}

/// The steps of a [`DistributedDataset`] with each replica's batch paired with its mask; see
/// [`DistributedDataset::iter_masked`].
pub struct MaskedDistributedIterator<B: Batch> {
    steps: Steps<B>,
}

impl<B: Batch> Iterator for MaskedDistributedIterator<B> {
    type Item = Result<PerReplica<Masked<B>>, InputError>;

    fn next(&mut self) -> Option<Self::Item> {
        let step = self.steps.next_step()?;
        Some(step.and_then(|step| {
            Ok(PerReplica::new(
                Arc::clone(&self.steps.device_map),
                step.masked()?,
            )?)
        }))
    }
}

#[cfg(test)]
mod tests {
    use distribute_collectives::Tensor;

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
