//! 6.1 InputContext and the input workers it is built from.

use std::sync::Mutex;

use distribute_input::{
    Dataset, InputContext, InputError, InputOptions, InputWorkers,
    distribute_datasets_from_function,
};

use crate::common::{in_graph, local};

#[test]
fn in_01_context_reports_pipelines_id_and_replicas() {
    let cx = InputContext::new(2, 1, 6).unwrap();
    assert_eq!(cx.num_replicas_in_sync(), 6);
    assert_eq!(cx.input_pipeline_id(), 1);
    assert_eq!(cx.num_input_pipelines(), 2);
}

#[test]
fn in_02_per_replica_batch_size_needs_a_divisible_global_batch() {
    let cx = InputContext::new(1, 0, 6).unwrap();
    assert_eq!(cx.per_replica_batch_size(12).unwrap(), 2);
    let err = cx.per_replica_batch_size(13).unwrap_err();
    assert!(matches!(
        err,
        InputError::IndivisibleBatch {
            global_batch: 13,
            replicas: 6
        }
    ));
    assert_eq!(err.kind(), distribute_input::ErrorKind::InvalidArgument);
}

#[test]
fn in_03_string_form_names_the_pipeline_and_total() {
    let cases = [
        ((1, 0, 42), "InputContext(input pipeline id 0, total: 1)"),
        ((3, 1, 42), "InputContext(input pipeline id 1, total: 3)"),
    ];
    for ((pipelines, id, replicas), expected) in cases {
        assert_eq!(
            InputContext::new(pipelines, id, replicas)
                .unwrap()
                .to_string(),
            expected
        );
    }
}

#[test]
fn in_04_defaults_are_one_pipeline_id_zero_one_replica() {
    assert_eq!(InputContext::default(), InputContext::new(1, 0, 1).unwrap());
}

/// The contexts the input function was called with, in call order.
fn contexts_seen(workers: &InputWorkers) -> Vec<(usize, usize, usize)> {
    let seen = Mutex::new(Vec::new());
    distribute_datasets_from_function(workers, InputOptions::default(), |cx| {
        seen.lock().unwrap().push((
            cx.num_input_pipelines(),
            cx.input_pipeline_id(),
            cx.num_replicas_in_sync(),
        ));
        Dataset::range(4).batch(1, false)
    })
    .unwrap();
    seen.into_inner().unwrap()
}

#[test]
fn in_05_input_function_is_called_once_per_worker_in_order() {
    assert_eq!(contexts_seen(&local(2)), [(1, 0, 2)]);
    for gpus in [1, 2, 4] {
        assert_eq!(
            contexts_seen(&in_graph(2, gpus)),
            [(2, 0, 2 * gpus), (2, 1, 2 * gpus)]
        );
    }
}

#[test]
fn in_18_no_input_workers_or_devices_is_an_error() {
    let none: Vec<(&str, Vec<&str>)> = Vec::new();
    assert!(matches!(
        InputWorkers::new(none),
        Err(InputError::InvalidOption(_))
    ));
    let no_devices: [(&str, Vec<&str>); 1] = [("/cpu:0", vec![])];
    assert!(matches!(
        InputWorkers::new(no_devices),
        Err(InputError::InvalidOption(_))
    ));
    assert!(InputWorkers::local(Vec::<&str>::new()).is_err());
    assert!(
        InputWorkers::local(["/gpu:x"]).is_err(),
        "device names must parse"
    );
}
