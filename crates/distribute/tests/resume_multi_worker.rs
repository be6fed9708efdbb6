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

use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use distribute::prelude::*;
use distribute_test_support::linear_regression::STEPS;
use distribute_test_support::mpirun::{Job, run_self, write_result};

/// The checkpoint directory of the worker test (unset: no checkpoints).
const DIR: &str = "DISTRIBUTE_TEST_RESUME_DIR";
/// The step after which worker 1 kills itself with SIGKILL (unset: it does not).
const DIE_AT: &str = "DISTRIBUTE_TEST_RESUME_DIE_AT";
const EVERY: u64 = 20;
/// How long one `mpirun` may take before the test kills it and fails.
const LIMIT: Duration = Duration::from_secs(180);

/// One worker of the jobs `a_killed_worker_s_job_resumes_with_the_uninterrupted_bits` starts:
/// trains 1 replica, checkpointing into `DIR` if set; worker 1 dies at step `DIE_AT` if set;
/// the chief writes its weights as JSON.
#[test]
#[ignore = "a worker process: started by mpirun from a_killed_worker_s_job_resumes_with_the_uninterrupted_bits"]
fn worker() {
    let checkpoints = std::env::var_os(DIR).map(|dir| {
        Checkpoints::new(
            dir,
            CheckpointOptions {
                every: EVERY,
                keep: 3,
            },
        )
        .unwrap()
    });
    let rank: usize = std::env::var("OMPI_COMM_WORLD_RANK")
        .expect("started by Open MPI's mpirun")
        .parse()
        .unwrap();
    let die_at: Option<usize> = std::env::var(DIE_AT).ok().map(|s| s.parse().unwrap());
    let die = move |step: usize| {
        if rank == 1 && die_at == Some(step) {
            // The signal a machine's OOM killer or a lost node's scheduler sends: no cleanup.
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &std::process::id().to_string()])
                .status();
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    };
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

fn job(env: &[(&str, String)]) -> Job {
    run_self("worker", 2, env, LIMIT)
}

/// The chief's result of a job that succeeded.
fn result(job: &Job) -> serde_json::Value {
    assert!(
        job.status.success(),
        "mpirun exited with {}; stdout:\n{}",
        job.status,
        job.stdout
    );
    let [line] = &job.results[..] else {
        panic!("the chief alone writes a result; stdout:\n{}", job.stdout);
    };
    serde_json::from_str(line).unwrap()
}

#[test]
fn a_killed_worker_s_job_resumes_with_the_uninterrupted_bits() {
    // A step after the first checkpoint, before the last step.
    let random = RandomState::new().hash_one(std::process::id());
    let die_at = EVERY as usize + 1 + (random as usize) % (STEPS - EVERY as usize - 1);
    eprintln!("worker 1 dies after step {die_at}");
    let dir = std::env::temp_dir().join(format!(
        "distribute-resume-mpi-{}-{die_at}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let with_dir = (DIR, dir.to_string_lossy().into_owned());

    let killed = job(&[with_dir.clone(), (DIE_AT, die_at.to_string())]);
    assert!(
        !killed.status.success() && killed.results.is_empty(),
        "the job with a killed worker must fail without a result: {}; stdout:\n{}",
        killed.status,
        killed.stdout
    );

    let resumed = result(&job(std::slice::from_ref(&with_dir)));
    let from = resumed["resumed_from"]
        .as_u64()
        .unwrap_or_else(|| panic!("the second job did not resume: {resumed}"));
    // The chief's last checkpoint: at or before the step worker 1 died after (the chief may
    // have been killed before writing that step's own).
    let die_at = die_at as u64;
    assert!(
        from > 0 && from.is_multiple_of(EVERY) && from <= die_at && die_at - from <= EVERY,
        "resumed from step {from}, worker 1 died after step {die_at}"
    );

    let uninterrupted = result(&job(&[]));
    assert_eq!(uninterrupted["resumed_from"], serde_json::Value::Null);
    assert_eq!(resumed["weight_bits"], uninterrupted["weight_bits"]);
    assert_eq!(resumed["bias_bits"], uninterrupted["bias_bits"]);
    std::fs::remove_dir_all(&dir).unwrap();
}
