//! Multi-worker clusters: [`ClusterSpec`], the `TF_CONFIG` environment variable ([`TfConfig`]),
//! and TF's `multi_worker_util` helpers (chief, worker count, id in cluster, collective leader).
//!
//! A `ClusterSpec` is validated when it is built (at most one chief and one evaluator, no empty or
//! duplicate addresses, only known task types), so the helpers only check the task they are asked
//! about.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::DeviceSpecError;

/// The role of a task in a cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", try_from = "String", into = "String")]
pub enum TaskType {
    /// The worker that also does checkpointing and summaries; at most one.
    Chief,
    /// A training worker.
    Worker,
    /// A parameter server.
    Ps,
    /// A side-car evaluator, outside the training cluster; at most one.
    Evaluator,
}

impl TaskType {
    /// Every task type, in the order [`ClusterSpec`] keeps its jobs.
    pub const ALL: [TaskType; 4] = [Self::Chief, Self::Worker, Self::Ps, Self::Evaluator];

    /// The job name TF uses: `chief`, `worker`, `ps` or `evaluator`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Chief => "chief",
            Self::Worker => "worker",
            Self::Ps => "ps",
            Self::Evaluator => "evaluator",
        }
    }
}

impl fmt::Display for TaskType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for TaskType {
    type Err = DeviceSpecError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|t| t.as_str() == name)
            .ok_or_else(|| DeviceSpecError::UnknownTaskType(name.to_owned()))
    }
}

impl TryFrom<String> for TaskType {
    type Error = DeviceSpecError;

    fn try_from(name: String) -> Result<Self, Self::Error> {
        name.parse()
    }
}

impl From<TaskType> for String {
    fn from(task_type: TaskType) -> Self {
        task_type.as_str().to_owned()
    }
}

/// One task of a cluster: its type and its index among the tasks of that type.
///
/// In `TF_CONFIG` it is the `task` object: `{"type": "worker", "index": 1}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TaskId {
    /// The task's type.
    #[serde(rename = "type")]
    pub task_type: TaskType,
    /// The task's index among tasks of its type.
    pub index: u32,
}

impl TaskId {
    /// The task `index` of type `task_type`.
    pub fn new(task_type: TaskType, index: u32) -> Self {
        Self { task_type, index }
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.task_type, self.index)
    }
}

/// The addresses of every task of a cluster, by task type; validated when built.
///
/// ```
/// use distribute_device_spec::{ClusterSpec, TaskId, TaskType};
///
/// let cluster = ClusterSpec::from_json(
///     r#"{"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"], "ps": ["p:2222"]}"#,
/// )?;
/// assert_eq!(cluster.worker_count(TaskType::Worker)?, 3);
/// assert_eq!(cluster.id_in_cluster(TaskId::new(TaskType::Worker, 1))?, 2);
/// assert_eq!(cluster.collective_leader(TaskId::new(TaskType::Worker, 0))?, "/job:chief/replica:0/task:0");
/// # Ok::<(), distribute_device_spec::DeviceSpecError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    try_from = "BTreeMap<String, Vec<String>>",
    into = "BTreeMap<String, Vec<String>>"
)]
pub struct ClusterSpec {
    // Task types with no tasks are not stored, so that `{"ps": []}` equals `{}`.
    jobs: BTreeMap<TaskType, Vec<String>>,
}

impl ClusterSpec {
    /// A cluster from (task type, addresses) pairs.
    ///
    /// Fails on more than one chief or evaluator, an empty address, or an address used twice.
    pub fn new(
        jobs: impl IntoIterator<Item = (TaskType, Vec<String>)>,
    ) -> Result<Self, DeviceSpecError> {
        let jobs: BTreeMap<TaskType, Vec<String>> = jobs
            .into_iter()
            .filter(|(_, addresses)| !addresses.is_empty())
            .collect();
        for task_type in [TaskType::Chief, TaskType::Evaluator] {
            let count = jobs.get(&task_type).map_or(0, Vec::len);
            if count > 1 {
                return Err(DeviceSpecError::TooManyTasks {
                    task_type: task_type.to_string(),
                    count,
                });
            }
        }
        let mut owners: BTreeMap<&str, TaskId> = BTreeMap::new();
        for (&task_type, addresses) in &jobs {
            for (index, address) in addresses.iter().enumerate() {
                let task = TaskId::new(task_type, index as u32);
                if address.is_empty() {
                    return Err(DeviceSpecError::EmptyAddress {
                        task: task.to_string(),
                    });
                }
                if let Some(first) = owners.insert(address, task) {
                    return Err(DeviceSpecError::DuplicateAddress {
                        address: address.clone(),
                        first: first.to_string(),
                        second: task.to_string(),
                    });
                }
            }
        }
        Ok(Self { jobs })
    }

    /// Parses the `cluster` object of `TF_CONFIG`: `{"worker": ["host:port", …], …}`.
    pub fn from_json(json: &str) -> Result<Self, DeviceSpecError> {
        let jobs: BTreeMap<String, Vec<String>> =
            serde_json::from_str(json).map_err(|e| json_error(&e))?;
        jobs.try_into()
    }

    /// True when the cluster has no tasks.
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// The addresses of the tasks of `task_type`, empty when it has none.
    pub fn tasks(&self, task_type: TaskType) -> &[String] {
        self.jobs.get(&task_type).map_or(&[], Vec::as_slice)
    }

    /// The task types that have tasks, in the order chief, worker, ps, evaluator.
    pub fn task_types(&self) -> impl Iterator<Item = TaskType> + '_ {
        self.jobs.keys().copied()
    }

    /// Checks that `task` may run in this cluster (TF's `_validate_cluster_spec`): its type must
    /// be in the cluster, except an evaluator, which may run beside it, and its index in range.
    pub fn validate_task(&self, task: TaskId) -> Result<(), DeviceSpecError> {
        let count = self.tasks(task.task_type).len();
        if count == 0 {
            if task.task_type == TaskType::Evaluator {
                return Ok(());
            }
            return Err(DeviceSpecError::TaskTypeNotFound(
                task.task_type.to_string(),
            ));
        }
        if task.index as usize >= count {
            return Err(DeviceSpecError::TaskIndexOutOfRange {
                task_type: task.task_type.to_string(),
                index: task.index,
                count,
            });
        }
        Ok(())
    }

    /// Whether `task` is the chief: the chief task, an evaluator, or worker 0 when the cluster has
    /// no chief.
    pub fn is_chief(&self, task: TaskId) -> Result<bool, DeviceSpecError> {
        self.validate_task(task)?;
        Ok(match task.task_type {
            TaskType::Chief | TaskType::Evaluator => true,
            TaskType::Worker => task.index == 0 && self.tasks(TaskType::Chief).is_empty(),
            TaskType::Ps => false,
        })
    }

    /// How many workers train together from the view of `task_type`: chief plus workers for
    /// either of those, the evaluators for an evaluator (it runs in its own cluster).
    pub fn worker_count(&self, task_type: TaskType) -> Result<usize, DeviceSpecError> {
        self.validate_task(TaskId::new(task_type, 0))?;
        match task_type {
            TaskType::Chief | TaskType::Worker => {
                Ok(self.tasks(TaskType::Chief).len() + self.tasks(TaskType::Worker).len())
            }
            TaskType::Evaluator => Ok(self.tasks(TaskType::Evaluator).len()),
            TaskType::Ps => Err(DeviceSpecError::UnsupportedTaskType {
                operation: "worker_count",
                task_type: task_type.to_string(),
            }),
        }
    }

    /// The task's id among the workers: the chief is 0, workers follow it; an evaluator keeps its
    /// index. Parameter servers have no id.
    pub fn id_in_cluster(&self, task: TaskId) -> Result<usize, DeviceSpecError> {
        self.validate_task(task)?;
        let index = task.index as usize;
        match task.task_type {
            TaskType::Chief => Ok(0),
            TaskType::Worker => Ok(index + self.tasks(TaskType::Chief).len()),
            TaskType::Evaluator => Ok(index),
            TaskType::Ps => Err(DeviceSpecError::UnsupportedTaskType {
                operation: "id_in_cluster",
                task_type: task.task_type.to_string(),
            }),
        }
    }

    /// The device prefix of the task that leads collectives: the chief, else worker 0; `""` for
    /// an evaluator or an empty cluster.
    pub fn collective_leader(&self, task: TaskId) -> Result<String, DeviceSpecError> {
        if self.is_empty() {
            return Ok(String::new());
        }
        self.validate_task(task)?;
        Ok(match task.task_type {
            TaskType::Evaluator => String::new(),
            _ if !self.tasks(TaskType::Chief).is_empty() => "/job:chief/replica:0/task:0".into(),
            _ => "/job:worker/replica:0/task:0".into(),
        })
    }
}

impl TryFrom<BTreeMap<String, Vec<String>>> for ClusterSpec {
    type Error = DeviceSpecError;

    fn try_from(jobs: BTreeMap<String, Vec<String>>) -> Result<Self, Self::Error> {
        let jobs = jobs
            .into_iter()
            .map(|(name, addresses)| Ok((name.parse()?, addresses)))
            .collect::<Result<Vec<_>, DeviceSpecError>>()?;
        Self::new(jobs)
    }
}

impl From<ClusterSpec> for BTreeMap<String, Vec<String>> {
    fn from(cluster: ClusterSpec) -> Self {
        cluster
            .jobs
            .into_iter()
            .map(|(task_type, addresses)| (task_type.to_string(), addresses))
            .collect()
    }
}

/// The `TF_CONFIG` environment variable: the cluster and this process's task in it.
///
/// ```
/// use distribute_device_spec::{TaskId, TaskType, TfConfig};
///
/// let config = TfConfig::from_json(
///     r#"{"cluster": {"worker": ["w0:2222", "w1:2222"]}, "task": {"type": "worker", "index": 1}}"#,
/// )?;
/// assert_eq!(config.task, Some(TaskId::new(TaskType::Worker, 1)));
/// assert!(!config.is_chief()?);
/// # Ok::<(), distribute_device_spec::DeviceSpecError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TfConfig {
    /// Every task's address.
    #[serde(default)]
    pub cluster: ClusterSpec,
    /// This process's task; `None` outside a cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<TaskId>,
    /// The RPC protocol, e.g. `grpc`; `None` for the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rpc_layer: Option<String>,
    /// `cloud` or `google` in TF's cloud setups; kept for round trips.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<String>,
}

impl TfConfig {
    /// Parses and validates a `TF_CONFIG` JSON document: the task, when given, must be in the
    /// cluster.
    pub fn from_json(json: &str) -> Result<Self, DeviceSpecError> {
        // Parse loosely first, so that validation failures keep their own error variants instead
        // of being flattened into serde's message.
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            #[serde(default)]
            cluster: BTreeMap<String, Vec<String>>,
            task: Option<RawTask>,
            rpc_layer: Option<String>,
            environment: Option<String>,
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct RawTask {
            #[serde(rename = "type")]
            task_type: String,
            index: u32,
        }
        let raw: Raw = serde_json::from_str(json).map_err(|e| json_error(&e))?;
        let cluster = ClusterSpec::try_from(raw.cluster)?;
        let task = raw
            .task
            .map(|task| Ok::<_, DeviceSpecError>(TaskId::new(task.task_type.parse()?, task.index)))
            .transpose()?;
        if let Some(task) = task {
            cluster.validate_task(task)?;
        }
        Ok(TfConfig {
            cluster,
            task,
            rpc_layer: raw.rpc_layer,
            environment: raw.environment,
        })
    }

    /// Reads and validates the `TF_CONFIG` environment variable.
    pub fn from_env() -> Result<Self, DeviceSpecError> {
        let json = std::env::var("TF_CONFIG").map_err(|_| DeviceSpecError::NoTfConfig)?;
        Self::from_json(&json)
    }

    /// Whether this process is the chief; a process outside a cluster (no task) is.
    pub fn is_chief(&self) -> Result<bool, DeviceSpecError> {
        match self.task {
            Some(task) => self.cluster.is_chief(task),
            None => Ok(true),
        }
    }
}

/// A JSON document that does not have the shape of a cluster or `TF_CONFIG`.
fn json_error(error: &serde_json::Error) -> DeviceSpecError {
    DeviceSpecError::InvalidClusterJson(error.to_string())
}
