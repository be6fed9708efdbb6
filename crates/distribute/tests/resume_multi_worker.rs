//! A 2-worker MPI job of the linear-regression example (feature `mpi`) whose worker 1 is
//! killed with SIGKILL at a random step after the first checkpoint: `mpirun` fails; started
//! again with the same checkpoint directory, the job resumes from the chief's last checkpoint
//! and ends with the bits of a 2-worker job that never stopped. The workers are this test
//! binary started by `mpirun`, running the example's own code (its ignored `worker` test).
#![cfg(feature = "mpi")]

// The example itself, so the test checks the code users run; its `main` is unused here.
#[path = "../examples/linear_regression.rs"]
#[allow(dead_code)]
mod example;

use std::time::Duration;

use distribute::prelude::*;
use distribute_test_support::linear_regression::STEPS;
use distribute_test_support::mpirun::{
    CHECKPOINT_DIR_VAR, kill_and_resume, kill_at_step_from_env, run_self, write_result,
};

const EVERY: u64 = 20;
/// How long one `mpirun` may take before the test kills it and fails.
const LIMIT: Duration = Duration::from_secs(180);

/// One worker of the jobs `a_killed_worker_s_job_resumes_with_the_uninterrupted_bits` starts:
/// trains 1 replica, checkpointing into `CHECKPOINT_DIR_VAR` if set; worker 1 dies at the step
/// `DIE_AT_VAR` names if set; the chief writes its weights as JSON.
#[test]
#[ignore = "a worker process: started by mpirun from a_killed_worker_s_job_resumes_with_the_uninterrupted_bits"]
fn worker() {
    // As the example's `--checkpoint-dir DIR --checkpoint-every 20` makes them.
    let options = CheckpointOptions {
        every: EVERY,
        ..CheckpointOptions::default()
    };
    let checkpoints =
        std::env::var_os(CHECKPOINT_DIR_VAR).map(|dir| Checkpoints::new(dir, options).unwrap());
    let die = kill_at_step_from_env(1);
    let resumable = example::Resumable {
        checkpoints: checkpoints.as_ref(),
        after_step: Some(&die),
        ..example::Resumable::default()
    };
    let (trained, workers, chief) =
        example::train_multi_worker_with(1, STEPS, example::DEFAULT_DEADLINE, &resumable).unwrap();
    assert_eq!(workers, 2);
    if chief {
        let bits: Vec<u32> = trained.weights.iter().map(|w| w.to_bits()).collect();
        write_result(
            &serde_json::json!({
                "weight_bits": bits, "bias_bits": trained.bias.to_bits(),
                "resumed_from": trained.resumed_from,
            })
            .to_string(),
        );
    }
}

#[test]
fn a_killed_worker_s_job_resumes_with_the_uninterrupted_bits() {
    let (resumed, uninterrupted) = kill_and_resume(
        |env| run_self("worker", 2, env, LIMIT),
        (EVERY, STEPS),
        |result| serde_json::from_str::<serde_json::Value>(result).unwrap(),
        |json| serde_json::from_value(json["resumed_from"].clone()).unwrap(),
    );
    assert_eq!(resumed["weight_bits"], uninterrupted["weight_bits"]);
    assert_eq!(resumed["bias_bits"], uninterrupted["bias_bits"]);
}
