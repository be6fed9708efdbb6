//! Multi-worker device lists: what TF's `MirroredStrategy` computes from a cluster
//! (`configure(cluster_spec)`, `_initialize_multi_worker`) — every worker's devices, this task's,
//! the replica count and the cross-device ops it would infer.
//!
//! A `MirroredStrategy` runs on one machine only (building one over several workers' devices is
//! an error); across processes, [`crate::MultiWorkerMirroredStrategy`] runs the replicas, and
//! checks `TF_CONFIG` against the MPI world with this plan.

use distribute_collectives::OpsPlan;
use distribute_device_spec::{
    ClusterSpec, DeviceSpec, DeviceSpecError, LocalDevices, MAX_GPUS_PER_WORKER, TaskId, TaskType,
    TfConfig, cluster_spec_to_device_list,
};
use distribute_strategy::StrategyError;

/// The devices of a multi-worker cluster as a mirrored strategy on one of its tasks sees them.
///
/// ```
/// use distribute_device_spec::{ClusterSpec, TaskId, TaskType};
/// use distribute_collectives::OpsPlan;
/// use distribute_multi_worker::MultiWorkerDevices;
///
/// let cluster = ClusterSpec::from_json(r#"{"worker": ["w0:2222", "w1:2222"]}"#)?;
/// let plan = MultiWorkerDevices::from_cluster(&cluster, TaskId::new(TaskType::Worker, 1), 2)?;
/// assert_eq!(plan.num_replicas_in_sync, 4);
/// assert_eq!(plan.local_devices, ["/job:worker/task:1/device:GPU:0", "/job:worker/task:1/device:GPU:1"]);
/// assert_eq!(plan.default_device(), "/job:worker/task:0");
/// assert_eq!(plan.cross_device_ops, OpsPlan::NcclAcrossWorkers);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultiWorkerDevices {
    /// Every training task's devices: the chief's first, then each worker's; parameter servers
    /// and evaluators hold no replicas.
    pub devices: Vec<String>,
    /// The training tasks, as `/job:J/task:T`, in the same order.
    pub workers: Vec<String>,
    /// The devices of the task this process runs.
    pub local_devices: Vec<String>,
    /// GPUs per worker; 0 means each worker is one CPU replica.
    pub num_gpus_per_worker: usize,
    /// The replicas of all workers together: workers × max(GPUs, 1).
    pub num_replicas_in_sync: usize,
    /// The cross-device ops the one chooser plans for these devices
    /// ([`OpsPlan::for_devices`]; TF infers `ReductionToOneDevice` for one CPU worker, where the
    /// plan is the shared-memory all-reduce, which gives the same bits).
    pub cross_device_ops: OpsPlan,
}

impl MultiWorkerDevices {
    /// The plan for `task` of `cluster`, each worker with `num_gpus` GPUs.
    ///
    /// Fails when `task` is not in the cluster, or is a parameter server or evaluator (they run
    /// no training replicas), when the cluster has no chief or worker, or when `num_gpus` is
    /// above [`MAX_GPUS_PER_WORKER`].
    pub fn from_cluster(
        cluster: &ClusterSpec,
        task: TaskId,
        num_gpus: usize,
    ) -> Result<Self, StrategyError> {
        cluster.validate_task(task)?;
        if matches!(task.task_type, TaskType::Ps | TaskType::Evaluator) {
            return Err(StrategyError::InvalidArgument(format!(
                "task {task} runs no training replicas; a mirrored strategy's devices belong to \
                 the chief and the workers"
            )));
        }
        let gpus = u32::try_from(num_gpus).map_err(|_| DeviceSpecError::TooManyGpusPerWorker {
            requested: num_gpus as u64,
            max: MAX_GPUS_PER_WORKER,
        })?;
        let specs = cluster_spec_to_device_list(cluster, gpus)?;
        let mut workers: Vec<String> = Vec::new();
        let mut local_devices = Vec::new();
        for spec in &specs {
            let (job, index) = (spec.job().unwrap_or_default(), spec.task().unwrap_or(0));
            let worker = format!("/job:{job}/task:{index}");
            if workers.last() != Some(&worker) {
                workers.push(worker);
            }
            if job == task.task_type.as_str() && index == task.index {
                local_devices.push(spec.to_string());
            }
        }
        if workers.is_empty() {
            return Err(StrategyError::InvalidArgument(
                "the cluster has no chief and no worker, so no replicas".into(),
            ));
        }
        let cross_device_ops =
            OpsPlan::for_devices(&LocalDevices::new(&local_devices)?, workers.len());
        Ok(MultiWorkerDevices {
            num_replicas_in_sync: specs.len(),
            devices: specs.iter().map(ToString::to_string).collect(),
            workers,
            local_devices,
            num_gpus_per_worker: num_gpus,
            cross_device_ops,
        })
    }

    /// The plan for the task `TF_CONFIG` names, each worker with `num_gpus` GPUs.
    ///
    /// Fails on a configuration without a cluster (use
    /// `MirroredStrategy::with_default_devices`
    /// on one machine) or without a task.
    pub fn from_tf_config(config: &TfConfig, num_gpus: usize) -> Result<Self, StrategyError> {
        if config.cluster.is_empty() {
            return Err(StrategyError::InvalidArgument(
                "TF_CONFIG has no cluster; on one machine use MirroredStrategy's local devices"
                    .into(),
            ));
        }
        let task = config.task.ok_or_else(|| {
            StrategyError::InvalidArgument(
                "TF_CONFIG has a cluster but no task: set \"task\": {\"type\": …, \"index\": …}"
                    .into(),
            )
        })?;
        Self::from_cluster(&config.cluster, task, num_gpus)
    }

    /// Where ops placed on no device go: the first training task (TF's default device of a
    /// multi-worker mirrored strategy).
    pub fn default_device(&self) -> &str {
        &self.workers[0]
    }

    /// Where an op placed on `device` goes inside the strategy's scope: `device`'s fields over
    /// the [`default_device`](Self::default_device)'s, so `""` stays on the first task and
    /// `/cpu:0` becomes its CPU (SM-12).
    ///
    /// ```
    /// use distribute_device_spec::{ClusterSpec, TaskId, TaskType};
    /// use distribute_multi_worker::MultiWorkerDevices;
    ///
    /// let cluster = ClusterSpec::from_json(r#"{"worker": ["w0:2222", "w1:2222"]}"#)?;
    /// let plan = MultiWorkerDevices::from_cluster(&cluster, TaskId::new(TaskType::Worker, 0), 1)?;
    /// assert_eq!(plan.device_in_scope("/cpu:0")?, "/job:worker/task:0/device:CPU:0");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn device_in_scope(&self, device: &str) -> Result<String, StrategyError> {
        let scope: DeviceSpec = self.default_device().parse()?;
        Ok(scope.merged_with(&device.parse()?).to_string())
    }
}
