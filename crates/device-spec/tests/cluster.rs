//! Cluster specs, TF_CONFIG and the multi-worker helpers: SM-55..SM-60.

use TaskType::{Chief, Evaluator, Ps, Worker};
use distribute_device_spec::{ClusterSpec, DeviceSpecError, TaskId, TaskType, TfConfig};

/// TF's sample cluster C: one chief, two workers, two parameter servers.
fn cluster_c() -> ClusterSpec {
    ClusterSpec::from_json(
        r#"{"chief": ["127.0.0.1:1234"], "worker": ["127.0.0.1:8964", "127.0.0.1:2333"],
            "ps": ["127.0.0.1:1926", "127.0.0.1:3141"]}"#,
    )
    .unwrap()
}

fn workers_only(n: usize) -> ClusterSpec {
    ClusterSpec::new([(
        Worker,
        (0..n).map(|i| format!("127.0.0.1:{}", 5000 + i)).collect(),
    )])
    .unwrap()
}

fn task(task_type: TaskType, index: u32) -> TaskId {
    TaskId::new(task_type, index)
}

#[test]
fn sm55_specs_from_json_and_from_pairs_are_equal() {
    let from_pairs = ClusterSpec::new([
        (Chief, vec!["127.0.0.1:1234".to_owned()]),
        (
            Worker,
            vec!["127.0.0.1:8964".to_owned(), "127.0.0.1:2333".to_owned()],
        ),
        (
            Ps,
            vec!["127.0.0.1:1926".to_owned(), "127.0.0.1:3141".to_owned()],
        ),
    ])
    .unwrap();
    assert_eq!(cluster_c(), from_pairs);
    // Serialising and parsing again gives the same spec.
    let json = serde_json::to_string(&from_pairs).unwrap();
    assert_eq!(ClusterSpec::from_json(&json).unwrap(), from_pairs);
    // Empty task lists are dropped, so they do not make specs differ.
    assert_eq!(
        ClusterSpec::from_json(r#"{"ps": []}"#).unwrap(),
        ClusterSpec::default()
    );
}

#[test]
fn sm55_a_list_of_addresses_is_not_a_cluster() {
    let err = ClusterSpec::from_json(r#"["127.0.0.1:1234", "127.0.0.1:8964"]"#).unwrap_err();
    assert!(
        matches!(err, DeviceSpecError::InvalidClusterJson(_)),
        "{err:?}"
    );
    assert!(err.to_string().contains("expected {\"cluster\""), "{err}");
}

#[test]
fn sm56_is_chief() {
    let c = cluster_c();
    assert!(c.is_chief(task(Chief, 0)).unwrap());
    assert!(!c.is_chief(task(Worker, 0)).unwrap());
    assert!(!c.is_chief(task(Ps, 1)).unwrap());
    let no_chief = workers_only(2);
    assert!(no_chief.is_chief(task(Worker, 0)).unwrap());
    assert!(!no_chief.is_chief(task(Worker, 1)).unwrap());
    assert_eq!(
        no_chief.is_chief(task(Chief, 0)).unwrap_err(),
        DeviceSpecError::TaskTypeNotFound("chief".into())
    );
    assert!(matches!(
        no_chief.is_chief(task(Worker, 2)).unwrap_err(),
        DeviceSpecError::TaskIndexOutOfRange {
            index: 2,
            count: 2,
            ..
        }
    ));
    assert!(c.is_chief(task(Evaluator, 0)).unwrap());
}

#[test]
fn sm57_worker_count() {
    let c = cluster_c();
    assert_eq!(c.worker_count(Chief).unwrap(), 3);
    assert_eq!(c.worker_count(Worker).unwrap(), 3);
    let with_evaluator = ClusterSpec::new([
        (Chief, vec!["c:1".into()]),
        (Worker, vec!["w:1".into(), "w:2".into()]),
        (Evaluator, vec!["e:1".into()]),
    ])
    .unwrap();
    assert_eq!(with_evaluator.worker_count(Evaluator).unwrap(), 1);
    assert_eq!(
        ClusterSpec::default().worker_count(Worker).unwrap_err(),
        DeviceSpecError::TaskTypeNotFound("worker".into())
    );
    assert!(matches!(
        c.worker_count(Ps).unwrap_err(),
        DeviceSpecError::UnsupportedTaskType {
            operation: "worker_count",
            ..
        }
    ));
}

#[test]
fn sm58_id_in_cluster() {
    let c = cluster_c();
    assert_eq!(c.id_in_cluster(task(Chief, 0)).unwrap(), 0);
    assert_eq!(c.id_in_cluster(task(Worker, 0)).unwrap(), 1);
    assert_eq!(c.id_in_cluster(task(Worker, 1)).unwrap(), 2);
    assert_eq!(workers_only(2).id_in_cluster(task(Worker, 1)).unwrap(), 1);
    assert_eq!(c.id_in_cluster(task(Evaluator, 0)).unwrap(), 0);
    assert!(matches!(
        c.id_in_cluster(task(Ps, 0)).unwrap_err(),
        DeviceSpecError::UnsupportedTaskType {
            operation: "id_in_cluster",
            ..
        }
    ));
    // Two chiefs cannot even be built, so no helper ever sees them.
    assert_eq!(
        ClusterSpec::from_json(r#"{"chief": ["a:1", "b:1"], "worker": ["c:1"]}"#).unwrap_err(),
        DeviceSpecError::TooManyTasks {
            task_type: "chief".into(),
            count: 2
        }
    );
}

#[test]
fn sm59_collective_leader() {
    assert_eq!(
        cluster_c().collective_leader(task(Worker, 1)).unwrap(),
        "/job:chief/replica:0/task:0"
    );
    assert_eq!(
        workers_only(3).collective_leader(task(Worker, 2)).unwrap(),
        "/job:worker/replica:0/task:0"
    );
    assert_eq!(
        cluster_c().collective_leader(task(Evaluator, 0)).unwrap(),
        ""
    );
    assert_eq!(
        ClusterSpec::default()
            .collective_leader(task(Worker, 0))
            .unwrap(),
        ""
    );
}

#[test]
fn sm60_validation() {
    let c = cluster_c();
    for task_type in TaskType::ALL {
        c.validate_task(task(task_type, 0)).unwrap();
    }
    let chief_only = ClusterSpec::new([(Chief, vec!["c:1".into()])]).unwrap();
    assert_eq!(
        chief_only.validate_task(task(Worker, 0)).unwrap_err(),
        DeviceSpecError::TaskTypeNotFound("worker".into())
    );
    assert_eq!(
        ClusterSpec::from_json(r#"{"worker": ["w:1"], "trainer": ["t:1"]}"#).unwrap_err(),
        DeviceSpecError::UnknownTaskType("trainer".into())
    );
    assert_eq!(
        ClusterSpec::from_json(r#"{"worker": ["w:1"], "evaluator": ["e:1", "e:2"]}"#).unwrap_err(),
        DeviceSpecError::TooManyTasks {
            task_type: "evaluator".into(),
            count: 2
        }
    );
    assert_eq!(
        "trainer".parse::<TaskType>().unwrap_err(),
        DeviceSpecError::UnknownTaskType("trainer".into())
    );
}

#[test]
fn cluster_addresses_must_be_present_and_distinct() {
    assert_eq!(
        ClusterSpec::from_json(r#"{"chief": ["h:1"], "worker": ["h:2", "h:1"]}"#).unwrap_err(),
        DeviceSpecError::DuplicateAddress {
            address: "h:1".into(),
            first: "chief:0".into(),
            second: "worker:1".into(),
        }
    );
    assert_eq!(
        ClusterSpec::from_json(r#"{"worker": ["h:1", ""]}"#).unwrap_err(),
        DeviceSpecError::EmptyAddress {
            task: "worker:1".into()
        }
    );
}

#[test]
fn tf_config_parses_validates_and_round_trips() {
    let json = r#"{
        "cluster": {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"], "ps": ["p:2222"]},
        "task": {"type": "worker", "index": 1},
        "rpc_layer": "grpc"
    }"#;
    let config = TfConfig::from_json(json).unwrap();
    assert_eq!(config.task, Some(task(Worker, 1)));
    assert_eq!(config.rpc_layer.as_deref(), Some("grpc"));
    assert_eq!(config.cluster.tasks(Worker), ["w0:2222", "w1:2222"]);
    assert!(!config.is_chief().unwrap());
    let again = TfConfig::from_json(&serde_json::to_string(&config).unwrap()).unwrap();
    assert_eq!(again, config);

    // No task: a single process, which is its own chief.
    assert!(
        TfConfig::from_json(r#"{"cluster": {}}"#)
            .unwrap()
            .is_chief()
            .unwrap()
    );
}

#[test]
fn tf_config_errors_are_typed() {
    let cases: [(&str, DeviceSpecError); 3] = [
        (
            r#"{"cluster": {"worker": ["w:1"]}, "task": {"type": "worker", "index": 1}}"#,
            DeviceSpecError::TaskIndexOutOfRange {
                task_type: "worker".into(),
                index: 1,
                count: 1,
            },
        ),
        (
            r#"{"cluster": {"worker": ["w:1"]}, "task": {"type": "master", "index": 0}}"#,
            DeviceSpecError::UnknownTaskType("master".into()),
        ),
        (
            r#"{"cluster": {"worker": ["w:1"]}, "task": {"type": "chief", "index": 0}}"#,
            DeviceSpecError::TaskTypeNotFound("chief".into()),
        ),
    ];
    for (json, expected) in cases {
        assert_eq!(TfConfig::from_json(json).unwrap_err(), expected, "{json}");
    }
    for malformed in [
        "",
        "{",
        r#"{"cluster": {"worker": "w:1"}}"#,
        r#"{"cluster": {}, "task": {"type": "worker", "index": -1}}"#,
        r#"{"cluster": {}, "tsak": {}}"#,
    ] {
        assert!(
            matches!(
                TfConfig::from_json(malformed),
                Err(DeviceSpecError::InvalidClusterJson(_))
            ),
            "{malformed}"
        );
    }
}
