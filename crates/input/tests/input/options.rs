//! 6.6: input options (replication mode, placement, prefetch buffer).

use distribute_input::{
    Dataset, DistributedDataset, InputContext, InputError, InputOptions, InputReplicationMode,
    distribute_datasets_from_function,
};
use distribute_tensor::Tensor;
use distribute_values::DistributedValues;

use crate::common::{between, distribute, in_graph, ints, local, steps};

#[test]
fn in_41_invalid_option_combinations() {
    let cases = [
        InputOptions {
            place_dataset_on_device: true,
            ..InputOptions::default()
        },
        InputOptions {
            place_dataset_on_device: true,
            fetch_to_device: true,
            replication_mode: InputReplicationMode::PerReplica,
            ..InputOptions::default()
        },
    ];
    for options in cases {
        let err = distribute_datasets_from_function(&local(2), options, |_| {
            Dataset::range(4).batch(1, false)
        })
        .err()
        .unwrap();
        assert!(
            matches!(err, InputError::InvalidOption(_)),
            "{options:?}: {err}"
        );
        assert!(distribute(4, 2, false, &local(2), options).is_err());
    }
    // Per-replica datasets only come from a function.
    let per_replica = InputOptions {
        replication_mode: InputReplicationMode::PerReplica,
        ..InputOptions::default()
    };
    assert!(matches!(
        distribute(4, 2, false, &local(2), per_replica),
        Err(InputError::InvalidOption(_))
    ));
}

#[test]
fn in_42_per_worker_values_do_not_depend_on_prefetch() {
    for prefetch in [0, 1, 2] {
        let options = InputOptions {
            prefetch,
            ..InputOptions::default()
        };
        let dist = distribute_datasets_from_function(&local(2), options, |cx| {
            let k = cx.input_pipeline_id() as i64 + 1;
            let rows: Vec<i64> = (1..=10).map(|v| v * k).collect();
            Dataset::from_tensors(Tensor::from_vec("/cpu:0", &[2, 5], rows)?)?.batch(1, false)
        })
        .unwrap();
        assert_eq!(
            steps(&dist),
            [[vec![1, 2, 3, 4, 5], vec![6, 7, 8, 9, 10]]],
            "prefetch {prefetch}"
        );
    }
}

#[test]
fn in_43_per_replica_mode_calls_the_function_once_per_replica() {
    let options = InputOptions {
        replication_mode: InputReplicationMode::PerReplica,
        ..InputOptions::default()
    };
    let dist = distribute_datasets_from_function(&local(2), options, |cx| {
        let k = cx.input_pipeline_id() as i64 + 1;
        let values: Vec<i64> = (1..=9).map(|v| v * k).collect();
        Dataset::from_tensors(Tensor::from_vec("/cpu:0", &[9], values)?)?.batch(1, false)
    })
    .unwrap();
    let expected: Vec<Vec<Vec<i64>>> = (1..=9).map(|k| vec![vec![k], vec![2 * k]]).collect();
    assert_eq!(steps(&dist), expected);
}

#[test]
fn per_replica_mode_is_refused_between_graph() {
    // A process of a between-graph cluster sees only its own replicas, so its per-replica
    // pipelines would get the ids and counts of every other process's.
    let options = InputOptions {
        replication_mode: InputReplicationMode::PerReplica,
        ..InputOptions::default()
    };
    let err = distribute_datasets_from_function(
        &between(2, 1, 2),
        options,
        |_| -> Result<Dataset<Tensor>, InputError> { panic!("the input function is not called") },
    )
    .err()
    .unwrap();
    assert_eq!(
        err.to_string(),
        "invalid input option: per-replica replication needs every replica fed by this \
         process, but it is one of 2 processes (between-graph); use \
         InputReplicationMode::PerWorker and split the data per replica in the input function"
    );
    // In-graph, one process numbers every replica of the cluster.
    let contexts = std::cell::RefCell::new(Vec::new());
    distribute_datasets_from_function(&in_graph(2, 2), options, |cx| {
        contexts.borrow_mut().push(*cx);
        Dataset::range(1).batch(1, false)
    })
    .unwrap();
    let expected: Vec<_> = (0..4)
        .map(|id| InputContext::new(4, id, 4).unwrap())
        .collect();
    assert_eq!(contexts.into_inner(), expected);
}

#[test]
fn in_44_placement_follows_fetch_to_device() {
    let workers = local(2);
    let on_device = distribute(4, 2, false, &workers, InputOptions::default()).unwrap();
    let step = on_device.iter_per_replica().next().unwrap().unwrap();
    for (i, device, value) in step.iter() {
        assert_eq!(value.device(), device);
        assert_eq!(
            device,
            format!("/job:localhost/replica:0/task:0/device:GPU:{i}")
        );
    }
    let on_host = distribute(
        4,
        2,
        false,
        &workers,
        InputOptions {
            fetch_to_device: false,
            ..InputOptions::default()
        },
    )
    .unwrap();
    for value in on_host.iter_per_replica().next().unwrap().unwrap().values() {
        assert_eq!(
            value.device(),
            "/job:localhost/replica:0/task:0/device:CPU:0"
        );
    }
    // Empty batches are placed the same way.
    let dist = DistributedDataset::new(
        Dataset::range(1).batch(1, false).unwrap(),
        &workers,
        InputOptions::default(),
    )
    .unwrap();
    let step = dist.iter_per_replica().next().unwrap().unwrap();
    assert_eq!(
        step.values()[1].device(),
        "/job:localhost/replica:0/task:0/device:GPU:1"
    );
    assert!(ints(&step.values()[1]).is_empty());
}

#[test]
fn a_replica_whose_dataset_is_empty_still_gets_a_value_every_step() {
    let options = InputOptions {
        replication_mode: InputReplicationMode::PerReplica,
        ..InputOptions::default()
    };
    let dist = distribute_datasets_from_function(&local(3), options, |cx| {
        let rows = [3, 0, 1][cx.input_pipeline_id()];
        Dataset::range(rows).batch(1, false)
    })
    .unwrap();
    assert_eq!(
        steps(&dist),
        [
            vec![vec![0], vec![], vec![0]],
            vec![vec![1], vec![], vec![]],
            vec![vec![2], vec![], vec![]]
        ]
    );
}

#[test]
fn input_function_errors_name_the_pipeline() {
    let err = distribute_datasets_from_function(
        &crate::common::in_graph(2, 1),
        InputOptions::default(),
        |cx| {
            if cx.input_pipeline_id() == 1 {
                Dataset::range(4).batch(0, false)
            } else {
                Dataset::range(4).batch(1, false)
            }
        },
    )
    .err()
    .unwrap();
    assert!(
        matches!(err, InputError::InputFunction { pipeline: 1, .. }),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "input function for pipeline 1: invalid dataset pipeline: batch size must be at least 1"
    );
}
