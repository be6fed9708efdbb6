//! Device lists of one or several workers: SM-01..SM-08, with a snapshot of a cluster's device map.

use std::fmt::Write;

use distribute_device_spec::{
    ClusterSpec, DeviceSpec, DeviceSpecError, MAX_GPUS_PER_WORKER, TaskType, TfConfig,
    cluster_spec_to_device_list, group_by_job_task, infer_num_gpus_per_worker,
    is_device_list_single_worker, parse_device_list,
};

fn devices(list: &[&str]) -> Vec<DeviceSpec> {
    parse_device_list(list).unwrap()
}

fn strings(devices: &[DeviceSpec]) -> Vec<String> {
    devices.iter().map(ToString::to_string).collect()
}

#[test]
fn sm01_local_lists_are_single_worker() {
    for list in [
        &["/device:GPU:0", "/device:GPU:1"][..],
        &["/job:localhost/replica:0/task:0/device:CPU:0"][..],
        &["/job:localhost/device:GPU:0", "/device:GPU:1"][..],
        &["/cpu:0"][..],
    ] {
        assert!(
            is_device_list_single_worker(&devices(list)).unwrap(),
            "{list:?}"
        );
    }
}

#[test]
fn sm02_mixing_local_and_remote_is_an_error_whatever_the_order() {
    for list in [
        ["/device:GPU:0", "/job:worker/task:0/device:GPU:0"],
        ["/job:worker/task:0/device:GPU:0", "/device:GPU:0"],
    ] {
        let err = is_device_list_single_worker(&devices(&list)).unwrap_err();
        assert_eq!(
            err,
            DeviceSpecError::MixedLocalAndRemote {
                local: "/device:GPU:0".into(),
                remote: "/job:worker/task:0/device:GPU:0".into(),
            }
        );
        assert!(err.to_string().contains("may only name job 'localhost'"));
    }
}

#[test]
fn sm03_a_remote_worker_must_name_its_task() {
    let err = is_device_list_single_worker(&devices(&[
        "/job:worker/device:GPU:0",
        "/job:worker/device:GPU:1",
    ]))
    .unwrap_err();
    assert_eq!(
        err,
        DeviceSpecError::RemoteDeviceWithoutTask {
            device: "/job:worker/device:GPU:0".into()
        }
    );
}

#[test]
fn sm04_a_remote_single_worker_is_single_worker() {
    let list: Vec<String> = (0..4)
        .map(|i| format!("/job:worker/task:0/gpu:{i}"))
        .collect();
    let list = parse_device_list(&list).unwrap();
    assert!(is_device_list_single_worker(&list).unwrap());
    assert_eq!(infer_num_gpus_per_worker(&list).unwrap(), 4);
    // An unset replica means replica 0, so spelling it out does not make a second worker.
    let spelled = devices(&[
        "/job:worker/task:0/gpu:0",
        "/job:worker/replica:0/task:0/gpu:1",
    ]);
    assert!(is_device_list_single_worker(&spelled).unwrap());
    let other_replica = devices(&[
        "/job:worker/task:0/gpu:0",
        "/job:worker/replica:1/task:0/gpu:0",
    ]);
    assert!(!is_device_list_single_worker(&other_replica).unwrap());
}

#[test]
fn sm05_two_tasks_are_multi_worker() {
    let list = devices(&[
        "/job:worker/task:0/device:GPU:0",
        "/job:worker/task:1/device:GPU:0",
    ]);
    assert!(!is_device_list_single_worker(&list).unwrap());
}

#[test]
fn sm06_grouping_by_job_and_task() {
    let list = devices(&[
        "/job:worker/task:2/device:GPU:1",
        "/job:worker/task:0/device:GPU:0",
        "/job:chief/task:0/device:GPU:0",
        "/job:worker/task:2/device:GPU:0",
    ]);
    let groups = group_by_job_task(&list).unwrap();
    type Tasks = Vec<(u32, Vec<String>)>;
    let shape: Vec<(&str, Tasks)> = groups
        .iter()
        .map(|(job, tasks)| {
            let tasks = tasks.iter().map(|(t, d)| (*t, strings(d))).collect();
            (job.as_str(), tasks)
        })
        .collect();
    assert_eq!(
        shape,
        [
            (
                "chief",
                vec![(0, vec!["/job:chief/task:0/device:GPU:0".to_owned()])]
            ),
            (
                "worker",
                vec![
                    (0, vec!["/job:worker/task:0/device:GPU:0".to_owned()]),
                    (
                        2,
                        vec![
                            "/job:worker/task:2/device:GPU:1".to_owned(),
                            "/job:worker/task:2/device:GPU:0".to_owned()
                        ]
                    ),
                ]
            ),
        ]
    );
    assert_eq!(
        group_by_job_task(&devices(&["/gpu:0", "/gpu:1"])).unwrap_err(),
        DeviceSpecError::NotMultiWorker
    );
}

/// A task index near `u32::MAX` costs one entry: grouping once sized a `Vec` by the largest task
/// index (96 GB for task 4000000000) and the allocator aborted the process.
#[test]
fn huge_task_index_is_grouped_without_allocating_the_gap() {
    let list = devices(&[
        "/job:worker/task:0/device:CPU:0",
        "/job:worker/task:4000000000/device:CPU:0",
    ]);
    let groups = group_by_job_task(&list).unwrap();
    assert_eq!(
        groups["worker"].keys().copied().collect::<Vec<_>>(),
        [0, 4_000_000_000]
    );
    // CPU-only workers all have 0 GPUs, the gap included.
    assert_eq!(infer_num_gpus_per_worker(&list).unwrap(), 0);
    let with_gpus = devices(&[
        "/job:worker/task:0/gpu:0",
        "/job:worker/task:4000000000/gpu:0",
    ]);
    let err = infer_num_gpus_per_worker(&with_gpus).unwrap_err();
    assert_eq!(
        err,
        DeviceSpecError::UnequalGpuCounts {
            first_worker: "/job:worker/task:0".into(),
            first_count: 1,
            other_worker: "/job:worker/task:1".into(),
            other_count: 0,
        }
    );
}

/// `u32::MAX` GPUs per worker once built a list of four billion devices per task.
#[test]
fn gpus_per_worker_above_the_cap_is_a_typed_error() {
    let cluster = ClusterSpec::from_json(r#"{"worker": ["a:1", "b:1"]}"#).unwrap();
    for gpus in [MAX_GPUS_PER_WORKER + 1, u32::MAX] {
        assert_eq!(
            cluster_spec_to_device_list(&cluster, gpus).unwrap_err(),
            DeviceSpecError::TooManyGpusPerWorker {
                requested: u64::from(gpus),
                max: MAX_GPUS_PER_WORKER,
            }
        );
    }
    let at_cap = cluster_spec_to_device_list(&cluster, MAX_GPUS_PER_WORKER).unwrap();
    assert_eq!(at_cap.len(), 2 * MAX_GPUS_PER_WORKER as usize);
}

#[test]
fn sm07_gpus_per_worker() {
    let ok: [(&[&str], usize); 6] = [
        (&["/gpu:0", "/gpu:1", "/cpu:0"], 2),
        (&["/cpu:0"], 0),
        (
            &[
                "/job:worker/task:0/gpu:0",
                "/job:worker/task:0/gpu:1",
                "/job:worker/task:1/gpu:0",
                "/job:worker/task:1/gpu:1",
            ],
            2,
        ),
        (
            &[
                "/job:worker/task:0/gpu:1",
                "/job:worker/task:0/gpu:0",
                "/job:worker/task:1/gpu:0",
                "/job:worker/task:1/gpu:1",
            ],
            2,
        ),
        // Non-consecutive indices in a local list are not checked.
        (&["/gpu:0", "/gpu:2"], 2),
        // Only a parsed type of GPU counts, not "GPU" somewhere in the name.
        (&["/device:XLA_GPU:0", "/device:CPU:0"], 0),
    ];
    for (list, expected) in ok {
        assert_eq!(
            infer_num_gpus_per_worker(&devices(list)).unwrap(),
            expected,
            "{list:?}"
        );
    }

    let unequal = infer_num_gpus_per_worker(&devices(&[
        "/job:worker/task:0/gpu:0",
        "/job:worker/task:0/gpu:1",
        "/job:worker/task:1/gpu:0",
    ]))
    .unwrap_err();
    assert_eq!(
        unequal,
        DeviceSpecError::UnequalGpuCounts {
            first_worker: "/job:worker/task:0".into(),
            first_count: 2,
            other_worker: "/job:worker/task:1".into(),
            other_count: 1,
        }
    );

    for list in [
        &[
            "/job:worker/task:0/gpu:0",
            "/job:worker/task:0/gpu:2",
            "/job:worker/task:1/gpu:0",
            "/job:worker/task:1/gpu:1",
        ][..],
        &[
            "/job:worker/task:0/gpu:0",
            "/job:worker/task:0/gpu:0",
            "/job:worker/task:1/gpu:0",
            "/job:worker/task:1/gpu:1",
        ][..],
        &["/job:worker/task:0/gpu:*", "/job:worker/task:1/gpu:0"][..],
    ] {
        let err = infer_num_gpus_per_worker(&devices(list)).unwrap_err();
        assert!(
            matches!(err, DeviceSpecError::NonConsecutiveGpus { .. }),
            "{list:?}: {err:?}"
        );
    }

    // A gap in task indices leaves an empty worker, which has the wrong GPU count.
    let gap = infer_num_gpus_per_worker(&devices(&[
        "/job:worker/task:0/gpu:0",
        "/job:worker/task:2/gpu:0",
    ]))
    .unwrap_err();
    assert!(
        matches!(
            gap,
            DeviceSpecError::UnequalGpuCounts { other_count: 0, .. }
        ),
        "{gap:?}"
    );
}

#[test]
fn sm08_cluster_to_device_list() {
    let cluster =
        ClusterSpec::from_json(r#"{"chief": ["a:1"], "worker": ["b:1", "c:1"], "ps": ["d:1"]}"#)
            .unwrap();
    assert_eq!(
        strings(&cluster_spec_to_device_list(&cluster, 2).unwrap()),
        [
            "/job:chief/task:0/device:GPU:0",
            "/job:chief/task:0/device:GPU:1",
            "/job:worker/task:0/device:GPU:0",
            "/job:worker/task:0/device:GPU:1",
            "/job:worker/task:1/device:GPU:0",
            "/job:worker/task:1/device:GPU:1",
        ]
    );
    assert_eq!(
        strings(&cluster_spec_to_device_list(&cluster, 0).unwrap()),
        [
            "/job:chief/task:0/device:CPU:0",
            "/job:worker/task:0/device:CPU:0",
            "/job:worker/task:1/device:CPU:0",
        ]
    );
}

/// A TF_CONFIG with a chief and two workers of 4 GPUs: the device list, its grouping by job and
/// task, and what each worker sees.
#[test]
fn device_map_of_a_chief_and_two_workers_with_four_gpus() {
    let config = TfConfig::from_json(
        r#"{"cluster": {"chief": ["chief:2222"], "worker": ["w0:2222", "w1:2222"],
                        "ps": ["ps0:2222"]},
            "task": {"type": "worker", "index": 0}}"#,
    )
    .unwrap();
    let list = cluster_spec_to_device_list(&config.cluster, 4).unwrap();
    let gpus = infer_num_gpus_per_worker(&list).unwrap();
    let mut out = String::new();
    writeln!(out, "gpus per worker: {gpus}").unwrap();
    for (job, tasks) in group_by_job_task(&list).unwrap() {
        for (index, devices) in tasks {
            let task_type: TaskType = job.parse().unwrap();
            let task = distribute_device_spec::TaskId::new(task_type, index);
            writeln!(
                out,
                "{task} (id {}, chief: {}, address {}):",
                config.cluster.id_in_cluster(task).unwrap(),
                config.cluster.is_chief(task).unwrap(),
                config.cluster.tasks(task_type)[index as usize],
            )
            .unwrap();
            for device in devices {
                writeln!(out, "  {device}").unwrap();
            }
        }
    }
    insta::assert_snapshot!(out);
}
