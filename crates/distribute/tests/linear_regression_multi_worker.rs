//! The reference linear regression on 2 worker processes under `mpirun` (feature `mpi`): with
//! 1 replica per worker it learns the single-process 2-replica run's weights and bias to 1e-6,
//! with 2 per worker the 4-replica run's. The workers are this test binary started by
//! `mpirun`, running the example's own code (its ignored `worker` test); every run is bounded
//! in time.
#![cfg(feature = "mpi")]

// The example itself, so the test checks the code users run; its `main` is unused here.
#[path = "../examples/linear_regression.rs"]
#[allow(dead_code)]
mod example;

use std::time::Duration;

use distribute_test_support::linear_regression::STEPS;
use distribute_test_support::mpirun::{run_self, write_result};

/// The variable that makes the ignored `worker` test train, with this many local replicas.
const WORKER_REPLICAS: &str = "DISTRIBUTE_TEST_LINREG_WORKER_REPLICAS";
/// How long one `mpirun` may take before the test kills it and fails.
const LIMIT: Duration = Duration::from_secs(180);
const TOLERANCE: f32 = 1e-6;

/// One worker of the job `two_workers_learn_the_single_process_weights` starts: trains, and
/// the chief writes its weights as JSON for the launching test.
#[test]
#[ignore = "a worker process: started by mpirun from two_workers_learn_the_single_process_weights"]
fn worker() {
    let replicas: usize = std::env::var(WORKER_REPLICAS)
        .expect("started by the launching test")
        .parse()
        .unwrap();
    let (trained, workers, chief) =
        example::train_multi_worker(replicas, STEPS, example::DEFAULT_DEADLINE).unwrap();
    assert_eq!(workers, 2);
    if chief {
        write_result(
            &serde_json::json!({"weights": trained.weights, "bias": trained.bias}).to_string(),
        );
    }
}

/// Runs `mpirun -n 2` on this test binary's `worker` with `replicas` each; the chief's weights
/// and bias.
fn two_workers(replicas: usize) -> (Vec<f32>, f32) {
    let job = run_self(
        "worker",
        2,
        &[(WORKER_REPLICAS, replicas.to_string())],
        LIMIT,
    );
    let json: serde_json::Value = serde_json::from_str(job.chief_result()).unwrap();
    let weights = json["weights"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_f64().unwrap() as f32)
        .collect();
    (weights, json["bias"].as_f64().unwrap() as f32)
}

#[test]
fn two_workers_learn_the_single_process_weights() {
    for replicas in [1, 2] {
        let (weights, bias) = two_workers(replicas);
        let single = example::train(2 * replicas, STEPS, example::DEFAULT_DEADLINE).unwrap();
        assert_eq!(weights.len(), single.weights.len());
        let max_diff = weights
            .iter()
            .zip(&single.weights)
            .map(|(a, b)| (a - b).abs())
            .fold((bias - single.bias).abs(), f32::max);
        assert!(
            max_diff <= TOLERANCE,
            "2 workers × {replicas} replicas differ from {} replicas in one process by {max_diff}",
            2 * replicas
        );
    }
}
