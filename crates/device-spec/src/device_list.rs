//! Device lists as strategies receive them: one worker or several, grouped by job and task, GPUs
//! per worker, and the device list of a whole cluster.

use std::collections::{BTreeMap, BTreeSet};

use crate::{ClusterSpec, DeviceKind, DeviceSpec, DeviceSpecError, TaskType};

/// Parses every device of a list, failing on the first invalid one.
///
/// ```
/// use distribute_device_spec::parse_device_list;
///
/// let devices = parse_device_list(["/gpu:0", "/gpu:1"])?;
/// assert_eq!(devices[1].to_string(), "/device:GPU:1");
/// # Ok::<(), distribute_device_spec::DeviceSpecError>(())
/// ```
pub fn parse_device_list<S: AsRef<str>>(
    devices: impl IntoIterator<Item = S>,
) -> Result<Vec<DeviceSpec>, DeviceSpecError> {
    devices.into_iter().map(|d| d.as_ref().parse()).collect()
}

/// Whether `devices` all belong to one worker (TF's `_is_device_list_single_worker`, formerly
/// `_is_device_list_local`).
///
/// Local devices (no job, or job `localhost`) form one worker; so do remote devices that share
/// job, replica and task, an unset replica or task counting as 0. Errors: local and remote devices mixed, or a single remote worker
/// whose devices name no task.
///
/// ```
/// use distribute_device_spec::{is_device_list_single_worker, parse_device_list};
///
/// let local = parse_device_list(["/device:GPU:0", "/device:GPU:1"])?;
/// assert!(is_device_list_single_worker(&local)?);
/// let two_workers = parse_device_list(["/job:worker/task:0/gpu:0", "/job:worker/task:1/gpu:0"])?;
/// assert!(!is_device_list_single_worker(&two_workers)?);
/// # Ok::<(), distribute_device_spec::DeviceSpecError>(())
/// ```
pub fn is_device_list_single_worker(devices: &[DeviceSpec]) -> Result<bool, DeviceSpecError> {
    let local = devices.iter().find(|d| d.is_local());
    let remote = devices.iter().find(|d| !d.is_local());
    if let (Some(local), Some(remote)) = (local, remote) {
        return Err(DeviceSpecError::MixedLocalAndRemote {
            local: local.to_string(),
            remote: remote.to_string(),
        });
    }
    // Unset fields mean what canonicalization fills in (localhost, replica 0, task 0), so
    // `/job:localhost/device:GPU:0` and `/device:GPU:1` are one worker; TF compares the raw
    // fields and would call that list multi-worker.
    let workers: BTreeSet<_> = devices
        .iter()
        .map(|d| {
            let job = d.job().unwrap_or("localhost");
            (job, d.replica().unwrap_or(0), d.task().unwrap_or(0))
        })
        .collect();
    let single = workers.len() <= 1;
    if single
        && remote.is_some()
        && let Some(device) = devices.iter().find(|d| d.task().is_none())
    {
        return Err(DeviceSpecError::RemoteDeviceWithoutTask {
            device: device.to_string(),
        });
    }
    Ok(single)
}

/// The most GPUs one worker may be given in [`cluster_spec_to_device_list`].
///
/// Hosts today carry a few dozen accelerators at most; the cap exists so that a count passed as an
/// argument (say `u32::MAX`) becomes a typed error instead of a list too large to allocate.
pub const MAX_GPUS_PER_WORKER: u32 = 1024;

/// The devices of a multi-worker list grouped by job, then by task index: `result[job][task]` is
/// that task's devices in input order. Only tasks that have devices are present, so a list naming
/// `/job:worker/task:4000000000` costs one entry, not four billion.
///
/// Fails on a single worker's list, on local/remote mixes, and on a device without a task.
///
/// ```
/// use distribute_device_spec::{group_by_job_task, parse_device_list};
///
/// let devices = parse_device_list(["/job:worker/task:2/gpu:0", "/job:worker/task:0/gpu:0"])?;
/// let groups = group_by_job_task(&devices)?;
/// let tasks: Vec<(u32, usize)> = groups["worker"].iter().map(|(t, d)| (*t, d.len())).collect();
/// assert_eq!(tasks, [(0, 1), (2, 1)]);
/// # Ok::<(), distribute_device_spec::DeviceSpecError>(())
/// ```
pub fn group_by_job_task(
    devices: &[DeviceSpec],
) -> Result<BTreeMap<String, BTreeMap<u32, Vec<DeviceSpec>>>, DeviceSpecError> {
    if is_device_list_single_worker(devices)? {
        return Err(DeviceSpecError::NotMultiWorker);
    }
    let mut groups: BTreeMap<String, BTreeMap<u32, Vec<DeviceSpec>>> = BTreeMap::new();
    for device in devices {
        let task = device
            .task()
            .ok_or_else(|| DeviceSpecError::RemoteDeviceWithoutTask {
                device: device.to_string(),
            })?;
        // Not local, so the job is set.
        let job = device.job().unwrap_or_default().to_owned();
        groups
            .entry(job)
            .or_default()
            .entry(task)
            .or_default()
            .push(device.clone());
    }
    Ok(groups)
}

/// How many GPUs each worker of the list has.
///
/// A single worker's list counts its `GPU` devices without further checks. In a multi-worker
/// list every worker (including one left empty by a gap in task indices, as in TF) must have the
/// same number of GPUs, and their indices must be `0..n` in any order.
///
/// ```
/// use distribute_device_spec::{infer_num_gpus_per_worker, parse_device_list};
///
/// let local = parse_device_list(["/gpu:0", "/gpu:1", "/cpu:0"])?;
/// assert_eq!(infer_num_gpus_per_worker(&local)?, 2);
/// # Ok::<(), distribute_device_spec::DeviceSpecError>(())
/// ```
pub fn infer_num_gpus_per_worker(devices: &[DeviceSpec]) -> Result<usize, DeviceSpecError> {
    let is_gpu = |d: &&DeviceSpec| d.device_kind() == Some(DeviceKind::Gpu);
    if is_device_list_single_worker(devices)? {
        return Ok(devices.iter().filter(is_gpu).count());
    }
    let mut first: Option<(String, usize)> = None;
    let mut check_count = |worker: String, count: usize| match &first {
        None => {
            first = Some((worker, count));
            Ok(())
        }
        Some((first_worker, first_count)) if *first_count != count => {
            Err(DeviceSpecError::UnequalGpuCounts {
                first_worker: first_worker.clone(),
                first_count: *first_count,
                other_worker: worker,
                other_count: count,
            })
        }
        Some(_) => Ok(()),
    };
    for (job, tasks) in group_by_job_task(devices)? {
        let mut expected_task = 0u32;
        for (task, task_devices) in tasks {
            // Tasks below this one that have no devices are workers with no GPUs; the first of
            // them stands for all (they share the count 0), so a gap costs nothing to check.
            if task > expected_task {
                check_count(format!("/job:{job}/task:{expected_task}"), 0)?;
            }
            expected_task = task.saturating_add(1);
            let worker = format!("/job:{job}/task:{task}");
            let indices: Vec<Option<u32>> = task_devices
                .iter()
                .filter(is_gpu)
                .map(DeviceSpec::device_index)
                .collect();
            let count = indices.len();
            check_count(worker.clone(), count)?;
            let distinct: BTreeSet<Option<u32>> = indices.iter().copied().collect();
            let consecutive = distinct.len() == count
                && distinct
                    .iter()
                    .all(|i| i.is_some_and(|i| (i as usize) < count));
            if !consecutive {
                return Err(DeviceSpecError::NonConsecutiveGpus {
                    worker,
                    count,
                    indices,
                });
            }
        }
    }
    Ok(first.map_or(0, |(_, count)| count))
}

/// The devices of every training task of `cluster` (chief first, then workers; parameter servers
/// and evaluators are left out): `GPU:0..gpus_per_worker` on each, or its `CPU:0` when
/// `gpus_per_worker` is 0.
///
/// Fails when `gpus_per_worker` is above [`MAX_GPUS_PER_WORKER`].
///
/// ```
/// use distribute_device_spec::{cluster_spec_to_device_list, ClusterSpec};
///
/// let cluster = ClusterSpec::from_json(r#"{"chief": ["a:1"], "worker": ["b:1"], "ps": ["d:1"]}"#)?;
/// let devices: Vec<String> =
///     cluster_spec_to_device_list(&cluster, 1)?.iter().map(ToString::to_string).collect();
/// assert_eq!(devices, ["/job:chief/task:0/device:GPU:0", "/job:worker/task:0/device:GPU:0"]);
/// # Ok::<(), distribute_device_spec::DeviceSpecError>(())
/// ```
pub fn cluster_spec_to_device_list(
    cluster: &ClusterSpec,
    gpus_per_worker: u32,
) -> Result<Vec<DeviceSpec>, DeviceSpecError> {
    if gpus_per_worker > MAX_GPUS_PER_WORKER {
        return Err(DeviceSpecError::TooManyGpusPerWorker {
            requested: u64::from(gpus_per_worker),
            max: MAX_GPUS_PER_WORKER,
        });
    }
    let mut devices = Vec::new();
    for task_type in [TaskType::Chief, TaskType::Worker] {
        for task in 0..cluster.tasks(task_type).len() as u32 {
            let worker = DeviceSpec::new()
                .with_job(task_type.as_str())
                .expect("task type names are valid job names")
                .with_task(task);
            let with_device = |device_type, index| {
                worker
                    .clone()
                    .with_device(device_type, index)
                    .expect("CPU and GPU are valid device types")
            };
            if gpus_per_worker == 0 {
                devices.push(with_device("CPU", 0));
            } else {
                devices.extend((0..gpus_per_worker).map(|gpu| with_device("GPU", gpu)));
            }
        }
    }
    Ok(devices)
}
