//! SM-11..SM-13: multi-worker device lists, what TF's `MirroredStrategy` computes from a
//! cluster, and the cross-device ops the one chooser plans for them.

use distribute_collectives::OpsPlan;
use distribute_device_spec::{ClusterSpec, DeviceSpecError, TaskId, TaskType, TfConfig};
use distribute_mirrored::MirroredStrategy;
use distribute_multi_worker::MultiWorkerDevices;
use distribute_strategy::StrategyError;

#[test]
fn sm11_the_global_list_of_a_cluster_is_refused_by_a_one_machine_strategy() {
    let cluster = ClusterSpec::from_json(r#"{"worker": ["w0:1", "w1:1"]}"#).unwrap();
    let plan =
        MultiWorkerDevices::from_cluster(&cluster, TaskId::new(TaskType::Worker, 0), 1).unwrap();
    assert!(matches!(
        MirroredStrategy::new(&plan.devices),
        Err(StrategyError::Runtime(_))
    ));
}

#[test]
fn sm11_a_single_remote_worker_with_gpus_plans_nccl() {
    let cluster = ClusterSpec::from_json(r#"{"worker": ["w0:1"]}"#).unwrap();
    let plan =
        MultiWorkerDevices::from_cluster(&cluster, TaskId::new(TaskType::Worker, 0), 2).unwrap();
    assert_eq!(plan.cross_device_ops, OpsPlan::NcclAllReduce);
    assert_eq!(plan.local_devices, plan.devices);
    assert_eq!(plan.num_replicas_in_sync, 2);
}

#[test]
fn sm12_two_workers_with_n_gpus() {
    let cluster = ClusterSpec::from_json(r#"{"worker": ["w0:1", "w1:1"]}"#).unwrap();
    for gpus in [0, 1, 2, 4] {
        let plan =
            MultiWorkerDevices::from_cluster(&cluster, TaskId::new(TaskType::Worker, 0), gpus)
                .unwrap();
        assert_eq!(plan.num_replicas_in_sync, 2 * gpus.max(1), "{gpus} GPUs");
        assert_eq!(plan.default_device(), "/job:worker/task:0");
        assert_eq!(plan.workers, ["/job:worker/task:0", "/job:worker/task:1"]);
        assert!(
            plan.local_devices
                .iter()
                .all(|d| d.starts_with("/job:worker/task:0/"))
        );
        assert_eq!(plan.local_devices.len(), gpus.max(1));
    }
    // Ops with no device go to the first worker; under /cpu:0, to its CPU.
    let plan =
        MultiWorkerDevices::from_cluster(&cluster, TaskId::new(TaskType::Worker, 1), 2).unwrap();
    assert_eq!(plan.device_in_scope("").unwrap(), "/job:worker/task:0");
    assert_eq!(
        plan.device_in_scope("/cpu:0").unwrap(),
        "/job:worker/task:0/device:CPU:0"
    );
    insta::assert_debug_snapshot!("sm12_worker_1_of_2_with_2_gpus", plan);
}

/// Four billion GPUs per worker once built a device list of eight billion entries; above
/// `MAX_GPUS_PER_WORKER` (and above `u32::MAX`) it is a typed error.
#[test]
fn absurd_gpu_counts_are_refused_before_allocating() {
    let cluster = ClusterSpec::from_json(r#"{"worker": ["w0:1", "w1:1"]}"#).unwrap();
    let worker = TaskId::new(TaskType::Worker, 0);
    for gpus in [4_000_000_000usize, usize::MAX] {
        let err = MultiWorkerDevices::from_cluster(&cluster, worker, gpus).unwrap_err();
        assert!(
            matches!(
                err,
                StrategyError::Device(DeviceSpecError::TooManyGpusPerWorker { requested, .. })
                    if requested == gpus as u64
            ),
            "{gpus}: {err:?}"
        );
    }
}

#[test]
fn sm13_chief_and_two_workers() {
    let config = TfConfig::from_json(
        r#"{"cluster": {"chief": ["c:1"], "worker": ["w0:1", "w1:1"], "ps": ["p:1"]},
            "task": {"type": "worker", "index": 1}}"#,
    )
    .unwrap();
    for gpus in [0, 1, 3] {
        let plan = MultiWorkerDevices::from_tf_config(&config, gpus).unwrap();
        assert_eq!(plan.num_replicas_in_sync, 3 * gpus.max(1));
        assert_eq!(plan.default_device(), "/job:chief/task:0");
        let across = match gpus {
            0 => OpsPlan::MpiAllReduce,
            _ => OpsPlan::NcclAcrossWorkers,
        };
        assert_eq!(plan.cross_device_ops, across, "{gpus} GPUs");
        assert!(plan.devices[0].starts_with("/job:chief/task:0/"));
        assert!(!plan.devices.iter().any(|d| d.contains("/job:ps")));
    }
    // Only a chief: one worker, NCCL with GPUs, else the shared-memory all-reduce (where TF
    // infers reduction to one device: the same bits, reduced in parallel).
    let chief_only = TfConfig::from_json(
        r#"{"cluster": {"chief": ["c:1"]}, "task": {"type": "chief", "index": 0}}"#,
    )
    .unwrap();
    let with_gpus = MultiWorkerDevices::from_tf_config(&chief_only, 2).unwrap();
    assert_eq!(with_gpus.cross_device_ops, OpsPlan::NcclAllReduce);
    assert_eq!(with_gpus.num_replicas_in_sync, 2);
    let cpu_only = MultiWorkerDevices::from_tf_config(&chief_only, 0).unwrap();
    assert_eq!(cpu_only.cross_device_ops, OpsPlan::SharedMemoryAllReduce);
    assert_eq!(cpu_only.local_devices, ["/job:chief/task:0/device:CPU:0"]);
}

#[test]
fn multi_worker_plans_refuse_tasks_without_replicas() {
    let config = TfConfig::from_json(
        r#"{"cluster": {"worker": ["w0:1"], "ps": ["p:1"]}, "task": {"type": "ps", "index": 0}}"#,
    )
    .unwrap();
    assert!(matches!(
        MultiWorkerDevices::from_tf_config(&config, 1),
        Err(StrategyError::InvalidArgument(_))
    ));
    let no_task = TfConfig::from_json(r#"{"cluster": {"worker": ["w0:1"]}}"#).unwrap();
    assert!(matches!(
        MultiWorkerDevices::from_tf_config(&no_task, 1),
        Err(StrategyError::InvalidArgument(_))
    ));
    let cluster = ClusterSpec::from_json(r#"{"worker": ["w0:1"]}"#).unwrap();
    assert!(matches!(
        MultiWorkerDevices::from_cluster(&cluster, TaskId::new(TaskType::Worker, 3), 1),
        Err(StrategyError::Device(_))
    ));
}
