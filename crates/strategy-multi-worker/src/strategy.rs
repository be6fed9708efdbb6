//! [`MultiWorkerMirroredStrategy`]: synchronous data parallelism over the replicas of several
//! worker processes (TF 2.x's `MultiWorkerMirroredStrategy`), reduced through MPI; its workers
//! reach the strategy layer through [`Workers`], the one cross-worker seam.
//!
//! Each worker process runs its local replicas as [`MirroredStrategy`] does (persistent threads,
//! `merge_call`, typed contexts); collectives go through [`MpiAllReduce`], so reductions span
//! every replica of every worker and give every one of them the same bits. After each step every
//! worker passes through one agreement ([`MpiAllReduce::finish_step`]), so a worker whose step
//! failed or panicked makes every worker's `run` fail with an error naming it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use distribute_collectives::{CrossDeviceOps, OpsPlan, Workers};
use distribute_device_spec::{LocalDevices, TaskType, TfConfig};
use distribute_input::{
    Batch, DEFAULT_AGREEMENT_WINDOW, Dataset, DistributedDataset, InputContext, InputError,
    InputOptions, InputWorkers, SumAcrossProcesses, distribute_datasets_from_function,
};
use distribute_strategy::{
    MergeArgs, MergeResult, ReplicaContext, RunError, Strategy, StrategyError, StrategyExtended,
    VariableOptions, create_distributed_variable, gather_local_replicas, initial_value_from_chief,
};
use distribute_tensor::Tensor;
use distribute_values::{
    Distributed, DistributedVariable, Leaf, PerReplica, ReplicaDeviceMap, VariableValue,
};

use distribute_mirrored::{
    CollectiveTuning, CrossDeviceOpsChoice, MirroredConfig, MirroredStrategy,
};
use distribute_mpi::MpiAllReduce;

use crate::MultiWorkerDevices;

/// Settings of a [`MultiWorkerMirroredStrategy`].
///
/// Its cross-device operations are MPI's (or NCCL's across the processes' GPUs), built by the
/// strategy, so there is no field to give others, and one deadline bounds every wait:
///
/// ```compile_fail,E0560
/// use distribute_mirrored::{MirroredConfig, MultiWorkerConfig};
///
/// let config = MultiWorkerConfig { mirrored: MirroredConfig::default(), ..MultiWorkerConfig::default() };
/// ```
#[derive(Debug, Clone)]
pub struct MultiWorkerConfig {
    /// This worker's replica devices (host devices; every worker the same count), e.g.
    /// `LocalDevices::cpus(2)`. Default: one replica on `/cpu:0`.
    pub local_devices: LocalDevices,
    /// How long a replica waits for the others, in this process and across workers (past it
    /// the MPI job is aborted), as [`MirroredConfig::deadline`].
    pub deadline: Duration,
    /// As [`MirroredConfig::idle_spin`].
    pub idle_spin: Duration,
    /// As [`MirroredConfig::caller_runs_replica_0`].
    pub caller_runs_replica_0: bool,
    /// How the collectives reduce, in this process and across workers.
    pub collectives: CollectiveTuning,
    /// The cluster, when `TF_CONFIG` describes one: it must agree with the MPI world. `None`
    /// reads the `TF_CONFIG` environment variable (absent: the MPI world alone decides).
    pub tf_config: Option<TfConfig>,
}

impl Default for MultiWorkerConfig {
    fn default() -> Self {
        let MirroredConfig {
            deadline,
            idle_spin,
            caller_runs_replica_0,
            ..
        } = MirroredConfig::default();
        MultiWorkerConfig {
            local_devices: LocalDevices::cpus(1),
            deadline,
            idle_spin,
            caller_runs_replica_0,
            collectives: CollectiveTuning::default(),
            tf_config: None,
        }
    }
}

/// Runs one step function on every replica of every worker process of an MPI job, keeping
/// variables mirrored across all of them (TF's `tf.distribute.MultiWorkerMirroredStrategy`).
///
/// Start the program with `mpirun -n W …`: rank `w` of `W` is worker `w`, worker 0 the chief.
/// With R local replicas per worker, `num_replicas_in_sync` is W·R and worker `w`'s local
/// replica `r` has replica id `w·R + r`. Every worker must build the strategy, create the same
/// variables and run the same steps: each call that crosses workers is agreed on first, so a
/// worker that differs fails every worker with an error instead of hanging them.
pub struct MultiWorkerMirroredStrategy {
    local: MirroredStrategy,
    /// The replicas' collectives: `backend`, or NCCL across the processes' GPUs.
    ops: Arc<dyn CrossDeviceOps>,
    /// Agreements between workers (end of step, chief's values) and, on CPUs, the collectives.
    backend: MpiAllReduce,
    input_workers: InputWorkers,
}

impl fmt::Debug for MultiWorkerMirroredStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiWorkerMirroredStrategy")
            .field("worker", &self.worker())
            .field("workers", &self.num_workers())
            .field("local", &self.local)
            .finish()
    }
}

impl MultiWorkerMirroredStrategy {
    /// One CPU replica per worker, the MPI world (and `TF_CONFIG`, if set) naming the workers.
    pub fn new() -> Result<Self, StrategyError> {
        Self::with_config(MultiWorkerConfig::default())
    }

    /// A strategy with `config`; every worker of the job must call it (it agrees with the
    /// others on the local replica count).
    ///
    /// Errors: a deadline below [`MirroredConfig::MIN_DEADLINE`], `TF_CONFIG` that disagrees
    /// with the MPI world, or workers with different replica counts.
    pub fn with_config(config: MultiWorkerConfig) -> Result<Self, StrategyError> {
        let devices = config.local_devices;
        let names: Vec<&str> = devices.names().collect();
        let backend = MpiAllReduce::new(&names, config.collectives.with_deadline(config.deadline))?;
        let (worker, workers) = (backend.worker(), backend.num_workers());
        // Checked on every worker, then agreed: a worker whose TF_CONFIG disagrees fails every
        // worker's construction with an error naming it, rather than leaving the others to wait.
        let tf_check = tf_config_agrees(config.tf_config, worker, workers);
        backend.finish_step(tf_check.as_ref().err().map(ToString::to_string).as_deref())?;
        let (ops, why) = cross_device_ops(&devices, workers, &backend, config.deadline)?;
        let local = MirroredStrategy::with_config(
            &devices,
            MirroredConfig {
                deadline: config.deadline,
                idle_spin: config.idle_spin,
                caller_runs_replica_0: config.caller_runs_replica_0,
                cross_device_ops: CrossDeviceOpsChoice::Given(Arc::clone(&ops)),
            },
        )?;
        let input_workers = InputWorkers::worker_of_cluster(
            workers,
            worker,
            devices.host(),
            local.device_map().primary_devices(),
        )?;
        log::info!(
            "MultiWorkerMirroredStrategy: worker {worker} of {workers}, {} local replicas; {why}",
            devices.len()
        );
        Ok(MultiWorkerMirroredStrategy {
            local,
            ops,
            backend,
            input_workers,
        })
    }

    /// This process's worker index (its MPI rank; as `extended().worker_index()`).
    pub fn worker(&self) -> usize {
        self.extended().worker_index()
    }

    /// The number of workers (as `extended().num_workers()`).
    pub fn num_workers(&self) -> usize {
        self.extended().num_workers()
    }

    /// Replicas per worker.
    pub fn local_replicas(&self) -> usize {
        self.backend.local_replicas()
    }

    /// This worker's input workers: one pipeline, `worker` of `num_workers`, feeding its local
    /// replicas (the hook for distributing datasets).
    pub fn input_workers(&self) -> &InputWorkers {
        &self.input_workers
    }

    /// The input context of this worker's pipeline: `num_input_pipelines` = workers,
    /// `input_pipeline_id` = worker, `num_replicas_in_sync` = every worker's replicas.
    pub fn input_context(&self) -> Result<InputContext, StrategyError> {
        Ok(self.input_workers.input_context(0)?)
    }

    /// The global replica id of local replica `local`.
    pub fn global_replica_id(&self, local: usize) -> usize {
        self.worker() * self.local_replicas() + local
    }

    /// The integer sum across workers with which distributed datasets agree on the end of
    /// data (once per window of steps, and only when the workers read different streams).
    fn sum_across_workers(&self) -> SumAcrossProcesses {
        let workers = self.backend.clone();
        SumAcrossProcesses::new(move |values| {
            workers
                .sum(values)
                .map_err(|error| InputError::AcrossProcesses(Box::new(error)))
        })
    }
}

/// The replicas' cross-device ops, as the one chooser plans them ([`OpsPlan::for_devices`]):
/// every device a GPU → NCCL across every process's GPUs, its unique id broadcast over MPI
/// (feature `nccl`; untested here: the build machine has no GPU); anything else, or no `nccl`
/// feature, → `backend`, MPI's hierarchical all-reduce (GPU values through the host). A job of
/// one worker keeps `backend`, whose local part is the shared-memory all-reduce.
fn cross_device_ops(
    devices: &LocalDevices,
    workers: usize,
    backend: &MpiAllReduce,
    deadline: std::time::Duration,
) -> Result<(Arc<dyn CrossDeviceOps>, &'static str), StrategyError> {
    let plan = OpsPlan::for_devices(devices, workers.max(2));
    #[cfg(feature = "nccl")]
    if plan == OpsPlan::NcclAcrossWorkers {
        let gpus: Vec<usize> = devices.iter().filter_map(|d| d.gpu_index()).collect();
        let nccl = distribute_mpi::nccl_for_mpi_world(&gpus, deadline)?;
        return Ok((Arc::new(nccl), "NCCL across every worker's GPUs"));
    }
    let _ = deadline;
    let why = match plan {
        OpsPlan::NcclAcrossWorkers => {
            "MPI's all-reduce through the host: the GPUs' NCCL needs the feature `nccl`"
        }
        _ => "MPI's hierarchical all-reduce",
    };
    Ok((Arc::new(backend.clone()), why))
}

/// `tf_config` (else the `TF_CONFIG` environment variable), when it names a cluster, checked
/// against the MPI world.
fn tf_config_agrees(
    tf_config: Option<TfConfig>,
    rank: usize,
    size: usize,
) -> Result<(), StrategyError> {
    let tf_config = match tf_config {
        Some(tf) => Some(tf),
        None if std::env::var_os("TF_CONFIG").is_some() => Some(TfConfig::from_env()?),
        None => None,
    };
    match tf_config.filter(|tf| !tf.cluster.is_empty()) {
        Some(tf) => check_tf_config(&tf, rank, size),
        None => Ok(()),
    }
}

/// `TF_CONFIG`'s task must be the MPI rank's worker, and its cluster must have as many
/// training tasks as the MPI world has processes (chief first, then the workers).
fn check_tf_config(tf: &TfConfig, rank: usize, size: usize) -> Result<(), StrategyError> {
    let plan = MultiWorkerDevices::from_tf_config(tf, 0)?;
    let task = tf.task.expect("from_tf_config checked the task");
    let name = format!("/job:{}/task:{}", task.task_type.as_str(), task.index);
    let index = plan.workers.iter().position(|w| *w == name);
    if plan.workers.len() != size || index != Some(rank) {
        let chief = if tf.cluster.tasks(TaskType::Chief).is_empty() {
            "the workers"
        } else {
            "the chief, then the workers"
        };
        return Err(StrategyError::InvalidArgument(format!(
            "TF_CONFIG and MPI disagree: TF_CONFIG makes this process {name}, training task {} \
             of {}, but MPI makes it rank {rank} of {size}; start one MPI process per training \
             task, ranks in the cluster's order ({chief}), or unset TF_CONFIG",
            index.map_or_else(|| "?".to_owned(), |i| i.to_string()),
            plan.workers.len()
        )));
    }
    Ok(())
}

impl StrategyExtended for MultiWorkerMirroredStrategy {
    fn device_map(&self) -> &Arc<ReplicaDeviceMap> {
        self.local.device_map()
    }

    fn local_devices(&self) -> &LocalDevices {
        self.local.local_devices()
    }

    fn cross_device_ops(&self) -> &dyn CrossDeviceOps {
        self.ops.as_ref()
    }

    fn host_device(&self) -> &str {
        self.local.host_device()
    }

    fn workers(&self) -> Option<&dyn Workers> {
        Some(&self.backend)
    }

    fn merge(
        &self,
        replica: usize,
        args: MergeArgs,
        merge: &mut dyn FnMut(Vec<MergeArgs>) -> Result<MergeResult, StrategyError>,
    ) -> Result<MergeResult, StrategyError> {
        self.local.merge(replica, args, merge)
    }
}

impl Strategy for MultiWorkerMirroredStrategy {
    fn extended(&self) -> &dyn StrategyExtended {
        self
    }

    /// Runs `step` on every local replica, then agrees with every other worker on how the step
    /// went: if any worker's step failed, every worker returns
    /// [`CollectiveError::WorkerFailed`](distribute_collectives::CollectiveError::WorkerFailed)
    /// naming it, with the failed step's error as text. Results are this worker's replicas'.
    fn run_each<D, T, E, F>(&self, step: F, inputs: &D) -> Result<Vec<T>, RunError<E>>
    where
        D: Distributed + Sync,
        T: Send,
        E: Send + std::fmt::Display,
        F: Fn(&ReplicaContext<'_>, D::Local) -> Result<T, E> + Sync,
    {
        let outputs = self.local.run_replicas(self, step, inputs);
        let failure = outputs.as_ref().err().map(ToString::to_string);
        self.backend
            .finish_step(failure.as_deref())
            .map_err(StrategyError::from)?;
        outputs
    }

    /// Every replica of every worker's value joined along `axis`, in global replica order, on
    /// the host: this worker's replicas joined, then the workers' parts gathered through MPI
    /// (their lengths along `axis` may differ; dtype, rank and the other dimensions are agreed
    /// first, so a mismatch is an error on every worker). Every worker must call it.
    fn gather(&self, value: &Leaf<Tensor>, axis: usize) -> Result<Tensor, StrategyError> {
        let local = gather_local_replicas(self, value, axis)?;
        Ok(self.backend.all_gather_across_workers(&local, axis)?)
    }

    /// Creates the variable on this worker's replicas with the chief's (worker 0's) `initial`
    /// value, so every worker starts identical even when their initialisers differ. Every
    /// worker must create the same variables in the same order.
    fn create_variable<T: VariableValue>(
        &self,
        name: &str,
        initial: T,
        options: VariableOptions,
    ) -> Result<DistributedVariable<T>, StrategyError>
    where
        Self: Sized,
    {
        let initial = initial_value_from_chief(self, name, initial)?;
        create_distributed_variable(name, self.local.device_map(), initial, options)
    }

    /// This worker's share of a global-batch dataset: auto-sharded per worker (by file when the
    /// source has a file per worker, else by data), each global batch cut into W·R chunks of
    /// which local replica `r` of worker `w` gets chunk `r·W + w`, as TF's
    /// `MultiWorkerMirroredStrategy` deals them. Every worker ends on the same step (see
    /// [`SumAcrossProcesses`]).
    fn distribute_dataset<B: Batch>(
        &self,
        dataset: Dataset<B>,
        options: InputOptions,
    ) -> Result<DistributedDataset<B>, StrategyError>
    where
        Self: Sized,
    {
        Ok(
            DistributedDataset::new(dataset, &self.input_workers, options)?
                .with_sum_across_processes(self.sum_across_workers(), DEFAULT_AGREEMENT_WINDOW)?,
        )
    }

    /// This worker's dataset from `dataset_fn`, called with this worker's [`InputContext`]
    /// (pipeline `w` of W); its consecutive batches go to the local replicas in turn, so a
    /// function that produces its contiguous part of each global batch
    /// ([`InputContext::rows_of_global_batch`]) gives local replica `r` global chunk `w·R + r`.
    /// Every worker ends on the same step (see [`SumAcrossProcesses`]).
    fn distribute_datasets_from_function<B: Batch>(
        &self,
        options: InputOptions,
        dataset_fn: impl Fn(&InputContext) -> Result<Dataset<B>, InputError>,
    ) -> Result<DistributedDataset<B>, StrategyError>
    where
        Self: Sized,
    {
        Ok(
            distribute_datasets_from_function(&self.input_workers, options, dataset_fn)?
                .with_sum_across_processes(self.sum_across_workers(), DEFAULT_AGREEMENT_WINDOW)?,
        )
    }

    /// One value per local replica from `value_fn(global replica id, num_replicas_in_sync)`.
    fn distribute_values_from_function<T>(
        &self,
        value_fn: impl Fn(usize, usize) -> T,
    ) -> Result<PerReplica<T>, StrategyError>
    where
        Self: Sized,
    {
        let n = self.num_replicas_in_sync();
        let values = (0..self.local_replicas())
            .map(|r| value_fn(self.global_replica_id(r), n))
            .collect();
        Ok(PerReplica::new(
            Arc::clone(self.local.device_map()),
            values,
        )?)
    }
}
