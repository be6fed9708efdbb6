//! Who reads what: [`InputContext`] (what an input function is told about its pipeline),
//! [`InputReplicationMode`], and [`InputWorkers`] (each input worker and the replica devices it
//! feeds).

use std::fmt;
use std::sync::Arc;

use distribute_device_spec::{canonicalize, host_for_device};
use distribute_values::ReplicaDeviceMap;

use crate::InputError;

/// What an input function is told about the pipeline it builds (TF's `tf.distribute.InputContext`).
///
/// ```
/// use distribute_input::InputContext;
///
/// let cx = InputContext::new(2, 1, 6)?;
/// assert_eq!((cx.num_input_pipelines(), cx.input_pipeline_id(), cx.num_replicas_in_sync()), (2, 1, 6));
/// assert_eq!(cx.per_replica_batch_size(12)?, 2);
/// assert!(cx.per_replica_batch_size(13).is_err());
/// assert_eq!(cx.to_string(), "InputContext(input pipeline id 1, total: 2)");
/// # Ok::<(), distribute_input::InputError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct InputContext {
    num_input_pipelines: usize,
    input_pipeline_id: usize,
    num_replicas_in_sync: usize,
}

impl Default for InputContext {
    /// One pipeline, id 0, one replica (IN-04).
    fn default() -> Self {
        InputContext {
            num_input_pipelines: 1,
            input_pipeline_id: 0,
            num_replicas_in_sync: 1,
        }
    }
}

impl InputContext {
    /// A context for pipeline `input_pipeline_id` of `num_input_pipelines`, feeding
    /// `num_replicas_in_sync` replicas in all. Zero pipelines or replicas, or an id out of
    /// range, is an error.
    pub fn new(
        num_input_pipelines: usize,
        input_pipeline_id: usize,
        num_replicas_in_sync: usize,
    ) -> Result<Self, InputError> {
        if num_input_pipelines == 0 || num_replicas_in_sync == 0 {
            return Err(InputError::InvalidOption(format!(
                "an input context needs at least one pipeline and one replica (got \
                 {num_input_pipelines} pipelines, {num_replicas_in_sync} replicas)"
            )));
        }
        if input_pipeline_id >= num_input_pipelines {
            return Err(InputError::InvalidOption(format!(
                "input pipeline id {input_pipeline_id} is out of range for \
                 {num_input_pipelines} pipelines"
            )));
        }
        Ok(InputContext {
            num_input_pipelines,
            input_pipeline_id,
            num_replicas_in_sync,
        })
    }

    /// How many input pipelines there are, usually the number of input workers.
    pub fn num_input_pipelines(&self) -> usize {
        self.num_input_pipelines
    }

    /// Which pipeline this is, in `0..num_input_pipelines`.
    pub fn input_pipeline_id(&self) -> usize {
        self.input_pipeline_id
    }

    /// How many replicas take part in each step, across all pipelines.
    pub fn num_replicas_in_sync(&self) -> usize {
        self.num_replicas_in_sync
    }

    /// The batch each replica gets when a step consumes `global_batch_size` examples; an
    /// error unless it divides by the replica count (IN-02).
    pub fn per_replica_batch_size(&self, global_batch_size: usize) -> Result<usize, InputError> {
        if !global_batch_size.is_multiple_of(self.num_replicas_in_sync) {
            return Err(InputError::IndivisibleBatch {
                global_batch: global_batch_size,
                replicas: self.num_replicas_in_sync,
            });
        }
        Ok(global_batch_size / self.num_replicas_in_sync)
    }

    /// The contiguous rows of each `global_batch_size`-row global batch that this pipeline's
    /// replicas take: pipeline `p` of `P` takes rows `p·B/P..(p+1)·B/P`, its replicas the
    /// consecutive per-replica chunks of them. An input function of a multi-worker run selects
    /// these rows and batches them per replica, so local replica `r` of worker `w` gets global
    /// chunk `w·R + r`, as TensorFlow's `MultiWorkerMirroredStrategy` gives it. An error unless
    /// the batch divides by the replica count.
    ///
    /// ```
    /// use distribute_input::InputContext;
    ///
    /// // Worker 1 of 2, 2 replicas each: rows 128..256 of a 256-row batch, 64 per replica.
    /// let cx = InputContext::new(2, 1, 4)?;
    /// assert_eq!(cx.rows_of_global_batch(256)?, 128..256);
    /// assert_eq!(cx.per_replica_batch_size(256)?, 64);
    /// # Ok::<(), distribute_input::InputError>(())
    /// ```
    pub fn rows_of_global_batch(
        &self,
        global_batch_size: usize,
    ) -> Result<std::ops::Range<usize>, InputError> {
        let per_replica = self.per_replica_batch_size(global_batch_size)?;
        if !self
            .num_replicas_in_sync
            .is_multiple_of(self.num_input_pipelines)
        {
            return Err(InputError::InvalidOption(format!(
                "{} replicas cannot be shared evenly by {} input pipelines, so a pipeline has \
                 no contiguous part of the global batch",
                self.num_replicas_in_sync, self.num_input_pipelines
            )));
        }
        let per_pipeline = per_replica * self.num_replicas_in_sync / self.num_input_pipelines;
        let start = self.input_pipeline_id * per_pipeline;
        Ok(start..start + per_pipeline)
    }
}

impl fmt::Display for InputContext {
    /// `InputContext(input pipeline id 1, total: 3)`, TF's form without the Python module (IN-03).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "InputContext(input pipeline id {}, total: {})",
            self.input_pipeline_id, self.num_input_pipelines
        )
    }
}

/// How many times an input function is called and which replicas each dataset feeds.
///
/// ```
/// use distribute_input::InputReplicationMode;
///
/// assert_eq!(InputReplicationMode::default(), InputReplicationMode::PerWorker);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum InputReplicationMode {
    /// One dataset per input worker, feeding all of that worker's replicas.
    #[default]
    PerWorker,
    /// One dataset per replica; only for `distribute_datasets_from_function` (IN-43), and only
    /// where one process feeds every replica (not between-graph).
    PerReplica,
}

/// One input worker: the host that runs its pipeline and the replica devices it feeds.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Worker {
    pipeline_id: usize,
    host: String,
    devices: Vec<String>,
}

/// The input workers this process runs, each with the replica devices it feeds, and where they
/// sit among all the input pipelines of the cluster.
///
/// In-graph (one process feeds every worker) lists every worker; between-graph (one process
/// per worker) lists only the local one, with [`worker_of_cluster`](Self::worker_of_cluster).
///
/// ```
/// use distribute_input::InputWorkers;
///
/// let local = InputWorkers::local(["/gpu:0", "/gpu:1"])?;
/// assert_eq!(local.num_replicas_in_sync(), 2);
/// assert_eq!(local.host(0), "/job:localhost/replica:0/task:0/device:CPU:0");
///
/// let two = InputWorkers::new([
///     ("/job:worker/task:0", vec!["/job:worker/task:0/gpu:0"]),
///     ("/job:worker/task:1", vec!["/job:worker/task:1/gpu:0"]),
/// ])?;
/// assert_eq!(two.input_context(1)?.to_string(), "InputContext(input pipeline id 1, total: 2)");
/// # Ok::<(), distribute_input::InputError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputWorkers {
    workers: Vec<Worker>,
    num_input_pipelines: usize,
    num_replicas_in_sync: usize,
    device_map: Arc<ReplicaDeviceMap>,
}

impl InputWorkers {
    /// One worker on this machine feeding `devices`; its host is the CPU of the first device.
    pub fn local<I, S>(devices: I) -> Result<Self, InputError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let devices: Vec<String> = devices.into_iter().map(|d| d.as_ref().to_owned()).collect();
        let first = devices.first().ok_or_else(no_devices)?;
        let host = host_for_device(first)?;
        Self::new([(host, devices)])
    }

    /// Every worker of an in-graph setup, in pipeline order: `(host, replica devices)`. Worker
    /// `i` runs input pipeline `i`. Devices are canonicalized, so `/gpu:0` and
    /// `/job:localhost/replica:0/task:0/device:GPU:0` are the same replica.
    pub fn new<I, H, D, S>(workers: I) -> Result<Self, InputError>
    where
        I: IntoIterator<Item = (H, D)>,
        H: AsRef<str>,
        D: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let workers = workers
            .into_iter()
            .enumerate()
            .map(|(i, (host, devices))| worker(i, host.as_ref(), devices))
            .collect::<Result<Vec<_>, _>>()?;
        let pipelines = workers.len();
        let replicas = workers.iter().map(|w| w.devices.len()).sum();
        Self::build(workers, pipelines, replicas)
    }

    /// The one worker this process runs in a between-graph cluster of `num_workers` workers,
    /// each with as many replicas as `devices`: pipeline `worker_index` of `num_workers`.
    pub fn worker_of_cluster<D, S>(
        num_workers: usize,
        worker_index: usize,
        host: &str,
        devices: D,
    ) -> Result<Self, InputError>
    where
        D: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        if worker_index >= num_workers {
            return Err(InputError::InvalidOption(format!(
                "worker index {worker_index} is out of range for {num_workers} workers"
            )));
        }
        let worker = worker(worker_index, host, devices)?;
        let replicas = num_workers * worker.devices.len();
        Self::build(vec![worker], num_workers, replicas)
    }

    fn build(
        workers: Vec<Worker>,
        num_input_pipelines: usize,
        num_replicas_in_sync: usize,
    ) -> Result<Self, InputError> {
        if workers.is_empty() {
            // IN-18: no input workers.
            return Err(InputError::InvalidOption(
                "no input workers: give at least one worker with at least one device".into(),
            ));
        }
        let device_map = Arc::new(ReplicaDeviceMap::new(
            workers.iter().flat_map(|w| w.devices.iter().cloned()),
        )?);
        Ok(InputWorkers {
            workers,
            num_input_pipelines,
            num_replicas_in_sync,
            device_map,
        })
    }

    /// How many workers this process runs.
    pub fn num_workers(&self) -> usize {
        self.workers.len()
    }

    /// How many input pipelines the whole cluster has.
    pub fn num_input_pipelines(&self) -> usize {
        self.num_input_pipelines
    }

    /// How many processes feed input, this one included: 1 in-graph, the number of workers
    /// between-graph.
    pub fn num_processes(&self) -> usize {
        self.num_input_pipelines / self.workers.len()
    }

    /// How many replicas take part in a step across the cluster.
    pub fn num_replicas_in_sync(&self) -> usize {
        self.num_replicas_in_sync
    }

    /// The host device of local worker `worker` (canonical). Panics if out of range, like
    /// slice indexing; use [`num_workers`](Self::num_workers) to iterate.
    pub fn host(&self, worker: usize) -> &str {
        &self.workers[worker].host
    }

    /// The replica devices local worker `worker` feeds (canonical), in replica order.
    pub fn devices(&self, worker: usize) -> &[String] {
        &self.workers[worker].devices
    }

    /// The input pipeline id of local worker `worker`.
    pub fn pipeline_id(&self, worker: usize) -> usize {
        self.workers[worker].pipeline_id
    }

    /// Every local replica device, worker by worker: the devices of the `PerReplica` batches.
    pub fn device_map(&self) -> &Arc<ReplicaDeviceMap> {
        &self.device_map
    }

    /// The context the input function of local worker `worker` is called with (IN-05).
    pub fn input_context(&self, worker: usize) -> Result<InputContext, InputError> {
        let w = self.workers.get(worker).ok_or_else(|| {
            InputError::InvalidOption(format!(
                "worker {worker} is out of range for {} local workers",
                self.workers.len()
            ))
        })?;
        InputContext::new(
            self.num_input_pipelines,
            w.pipeline_id,
            self.num_replicas_in_sync,
        )
    }
}

fn no_devices() -> InputError {
    InputError::InvalidOption("an input worker needs at least one replica device".into())
}

fn worker<D, S>(pipeline_id: usize, host: &str, devices: D) -> Result<Worker, InputError>
where
    D: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let host = canonicalize(host, None)?;
    let devices = devices
        .into_iter()
        .map(|d| canonicalize(d.as_ref(), Some(&host)))
        .collect::<Result<Vec<_>, _>>()?;
    if devices.is_empty() {
        return Err(no_devices());
    }
    Ok(Worker {
        pipeline_id,
        host,
        devices,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_rejects_ids_out_of_range() {
        assert!(InputContext::new(2, 2, 4).is_err());
        assert!(InputContext::new(0, 0, 4).is_err());
        assert!(InputContext::new(1, 0, 0).is_err());
    }

    #[test]
    fn devices_inherit_the_worker_job_and_task() {
        let w = InputWorkers::new([("/job:worker/task:1", ["/gpu:1"])]).unwrap();
        assert_eq!(w.devices(0), ["/job:worker/replica:0/task:1/device:GPU:1"]);
        assert_eq!(w.host(0), "/job:worker/replica:0/task:1/device:CPU:0");
    }

    #[test]
    fn between_graph_worker_counts_the_whole_cluster() {
        let w = InputWorkers::worker_of_cluster(
            2,
            1,
            "/job:worker/task:1",
            ["/job:worker/task:1/gpu:0", "/job:worker/task:1/gpu:1"],
        )
        .unwrap();
        assert_eq!(w.num_replicas_in_sync(), 4);
        assert_eq!(
            w.input_context(0).unwrap(),
            InputContext::new(2, 1, 4).unwrap()
        );
        assert!(InputWorkers::worker_of_cluster(2, 2, "/cpu:0", ["/cpu:0"]).is_err());
    }
}
