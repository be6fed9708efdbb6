//! The crate's one error type: every way a device string, cluster spec or device list can be wrong.

use thiserror::Error;

/// What went wrong with a device string, a cluster spec or a device list.
///
/// Each message names the offending input and says what is allowed instead.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum DeviceSpecError {
    /// A component that is neither `job`, `replica`, `task`, `device` nor a short device type.
    #[error(
        "device '{spec}': unknown component '{component}' (allowed: job:NAME, replica:N, task:N, \
         device:TYPE:N|*, or a short type such as cpu:N, gpu:N, tpu:N)"
    )]
    UnknownComponent {
        /// The whole string being parsed.
        spec: String,
        /// The name before the first `:` of the offending component.
        component: String,
    },
    /// Two device-type components in one spec, e.g. `/device:GPU:0/cpu:0`.
    #[error(
        "device '{spec}': multiple device types are not allowed; give one of device:TYPE:N or TYPE:N"
    )]
    MultipleDeviceTypes {
        /// The whole string being parsed.
        spec: String,
    },
    /// A replica, task or device index that is not a plain non-negative decimal number.
    #[error("device '{spec}': {field} must be a number or '*', got '{value}'")]
    InvalidNumber {
        /// The whole string being parsed.
        spec: String,
        /// `replica`, `task` or `index`.
        field: &'static str,
        /// The text that failed to parse.
        value: String,
    },
    /// A job name or device type that is empty or contains `/` or `:`.
    #[error(
        "{field} '{value}' is not allowed: it must be non-empty and contain neither '/' nor ':'"
    )]
    InvalidName {
        /// `job` or `device type`.
        field: &'static str,
        /// The rejected name.
        value: String,
    },
    /// A long-form device type that is not upper-case, where a canonical name is required.
    #[error(
        "device '{spec}': device type '{device_type}' must be all upper-case to canonicalize \
         (only 'cpu' and 'gpu' are upper-cased for you)"
    )]
    DeviceTypeNotUpperCase {
        /// The device string.
        spec: String,
        /// The offending type.
        device_type: String,
    },
    /// A device list that names both local devices (no job, or `localhost`) and remote ones.
    #[error(
        "device list mixes local and remote devices ('{local}' and '{remote}'): a local device may \
         only name job 'localhost'; use either all local or all remote devices"
    )]
    MixedLocalAndRemote {
        /// A local device of the list.
        local: String,
        /// A remote device of the list.
        remote: String,
    },
    /// A remote device that names no task, e.g. `/job:worker/device:GPU:0`.
    #[error(
        "remote device '{device}' must name a task, e.g. /job:worker/replica:0/task:0/device:GPU:0"
    )]
    RemoteDeviceWithoutTask {
        /// The device missing a task.
        device: String,
    },
    /// A device list with no device, where at least one is needed.
    #[error("device list is empty; give at least one device, e.g. /cpu:0")]
    EmptyDeviceList,
    /// An entry of a device list that does not parse or canonicalize.
    #[error("device list entry {position} ('{device}') is invalid: {error}")]
    InvalidListEntry {
        /// The entry's position in the list, from 0.
        position: usize,
        /// The entry as given.
        device: String,
        /// What is wrong with it.
        error: Box<DeviceSpecError>,
    },
    /// Two entries of a device list that name the same device, perhaps spelled differently.
    #[error(
        "device list must have no duplicates: '{first}' and '{second}' are both {canonical}; \
         name each device once"
    )]
    DuplicateDevice {
        /// The first entry, as given.
        first: String,
        /// The later entry naming the same device, as given.
        second: String,
        /// The canonical name of both.
        canonical: String,
    },
    /// A device list of several workers where one worker's devices were required.
    #[error(
        "the devices {devices:?} belong to several workers; give the devices of one worker (one \
         machine)"
    )]
    SeveralWorkers {
        /// The list as given.
        devices: Vec<String>,
    },
    /// A device list of one worker where several were required.
    #[error("device list is a single worker's; grouping by job and task needs a multi-worker list")]
    NotMultiWorker,
    /// Workers of a multi-worker list with different GPU counts.
    #[error(
        "all workers must have the same number of GPUs: {first_worker} has {first_count}, \
         {other_worker} has {other_count}"
    )]
    UnequalGpuCounts {
        /// The first worker seen, as `/job:J/task:T`.
        first_worker: String,
        /// Its GPU count.
        first_count: usize,
        /// The worker that differs.
        other_worker: String,
        /// Its GPU count.
        other_count: usize,
    },
    /// A worker whose GPU indices are not 0, 1, …, n-1 (in any order).
    #[error(
        "GPU indices on worker {worker} must be 0..{count} with no gaps or repeats, got {indices:?}"
    )]
    NonConsecutiveGpus {
        /// The worker, as `/job:J/task:T`.
        worker: String,
        /// How many GPUs it lists.
        count: usize,
        /// The indices it lists, `None` for `GPU:*`.
        indices: Vec<Option<u32>>,
    },
    /// `TF_CONFIG` or a cluster spec that is not valid JSON of the expected shape.
    #[error(
        "cluster spec is not valid: {0} (expected {{\"cluster\": {{\"worker\": [\"host:port\", ...], ...}}, \"task\": {{\"type\": \"worker\", \"index\": 0}}}})"
    )]
    InvalidClusterJson(String),
    /// A job in a cluster spec, or a task type, outside chief, worker, ps and evaluator.
    #[error("unknown task type '{0}': allowed are chief, worker, ps and evaluator")]
    UnknownTaskType(String),
    /// A task type that the cluster does not contain.
    #[error("task type '{0}' not found in the cluster spec")]
    TaskTypeNotFound(String),
    /// A task index at or beyond the number of tasks of its type.
    #[error("task index {index} exceeds the maximum id of '{task_type}' (it has {count} tasks)")]
    TaskIndexOutOfRange {
        /// The task type.
        task_type: String,
        /// The requested index.
        index: u32,
        /// How many tasks of that type the cluster has.
        count: usize,
    },
    /// More than one chief, or more than one evaluator.
    #[error("there must be at most one '{task_type}' task, the cluster has {count}")]
    TooManyTasks {
        /// `chief` or `evaluator`.
        task_type: String,
        /// How many it has.
        count: usize,
    },
    /// The same address given to two tasks.
    #[error("address '{address}' is used by both {first} and {second}")]
    DuplicateAddress {
        /// The address.
        address: String,
        /// The first task using it, as `type:index`.
        first: String,
        /// The second task using it.
        second: String,
    },
    /// An empty task address.
    #[error("task {task} has an empty address; give host:port")]
    EmptyAddress {
        /// The task, as `type:index`.
        task: String,
    },
    /// An operation that a task type does not support (e.g. `worker_count` for ps).
    #[error("{operation} is not defined for task type '{task_type}'")]
    UnsupportedTaskType {
        /// The operation, e.g. `worker_count`.
        operation: &'static str,
        /// The task type asked about.
        task_type: String,
    },
    /// A GPU count per worker above [`MAX_GPUS_PER_WORKER`](crate::MAX_GPUS_PER_WORKER).
    #[error(
        "{requested} GPUs per worker is more than the {max} one worker may have; pass the number \
         of GPUs each machine really has"
    )]
    TooManyGpusPerWorker {
        /// The count asked for.
        requested: u64,
        /// The cap.
        max: u32,
    },
    /// The `TF_CONFIG` environment variable is unset or not Unicode.
    #[error("environment variable TF_CONFIG is not set (or not valid Unicode)")]
    NoTfConfig,
}

/// A conversion that cannot fail (a [`LocalDevices`](crate::LocalDevices) into itself) has no
/// error to give, so APIs that take `impl TryInto<LocalDevices, Error: Into<DeviceSpecError>>`
/// take a `LocalDevices` too.
impl From<std::convert::Infallible> for DeviceSpecError {
    fn from(never: std::convert::Infallible) -> Self {
        match never {}
    }
}
