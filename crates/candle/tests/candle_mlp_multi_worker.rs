//! The reference candle workload on 2 worker processes under `mpirun` (feature `mpi`), each with
//! one replica, from the same initial values as one process with 2 replicas: the chief's weights
//! and losses equal that run's bit for bit (each step's two replicas' gradients are added in the
//! same order either way), and a model whose shape differs on one worker fails every worker with
//! an error naming the variable and the worker. The workers are this test binary started by
//! `mpirun`, running the example's own code; every run is bounded in time.
#![cfg(feature = "mpi")]

#[path = "../examples/candle_mlp.rs"]
#[allow(dead_code)]
mod example;

use std::num::NonZeroUsize;
use std::time::Duration;

use distribute_candle::{Config, CpuThreads, DataParallel};
use distribute_multi_worker::{MultiWorkerConfig, MultiWorkerMirroredStrategy};
use distribute_strategy::Strategy;
use distribute_test_support::mpirun::{
    CHECKPOINT_DIR_VAR, kill_and_resume, kill_at_step_from_env, run_self, write_result,
};
use example::{AfterStep, OptimizerKind, Options, train, train_multi_worker, write_initial_values};

/// The initial values every run loads.
const INIT: &str = "DISTRIBUTE_TEST_CANDLE_INIT";
/// How long one `mpirun` may take before the test kills it and fails.
const LIMIT: Duration = Duration::from_secs(300);
const STEPS: usize = 30;

fn options(init: &str) -> Options {
    Options {
        replicas: 1,
        steps: STEPS,
        init: Some(init.into()),
        save_init: None,
        threads: CpuThreads::PerReplica(NonZeroUsize::new(1).unwrap()),
        ..Options::default()
    }
}

#[test]
#[ignore = "a worker process: started by mpirun from two_workers_train_the_two_replica_bits"]
fn worker() {
    let init = std::env::var(INIT).expect("started by the launching test");
    let (trained, workers, chief) = train_multi_worker(&options(&init)).unwrap();
    assert_eq!(workers, 2);
    if chief {
        write_result(
            &serde_json::json!({"weights": trained.weights, "losses": trained.losses}).to_string(),
        );
    }
}

#[test]
fn two_workers_train_the_two_replica_bits() {
    let dir = tempfile::tempdir().unwrap();
    let init = dir.path().join("init.safetensors");
    write_initial_values(&init).unwrap();
    let init = init.to_str().unwrap().to_owned();
    let job = run_self("worker", 2, &[(INIT, init.clone())], LIMIT);
    let json: serde_json::Value = serde_json::from_str(job.chief_result()).unwrap();
    let single = train(&Options {
        replicas: 2,
        ..options(&init)
    })
    .unwrap();
    let losses: Vec<f32> = serde_json::from_value(json["losses"].clone()).unwrap();
    assert_eq!(losses, single.losses);
    for (name, want) in &single.weights {
        let got: Vec<f32> = serde_json::from_value(json["weights"][name].clone()).unwrap();
        assert!(
            got == *want,
            "variable '{name}' differs between 2 workers and 2 replicas"
        );
    }
}

#[test]
#[ignore = "a worker process: started by mpirun from a_worker_with_another_model_fails_every_worker"]
fn mismatched_worker() {
    let strategy = MultiWorkerMirroredStrategy::with_config(MultiWorkerConfig::default()).unwrap();
    let hidden = if strategy.is_chief() { 8 } else { 9 };
    let err = DataParallel::new(
        &strategy,
        Config::default(),
        |vb: candle_nn::VarBuilder| candle_nn::linear(4, hidden, vb.pp("l1")),
        |vars| <candle_nn::SGD as candle_nn::Optimizer>::new(vars, 0.1),
    )
    .err()
    .expect("the models differ");
    write_result(&err.to_string());
}

#[test]
fn a_worker_with_another_model_fails_every_worker() {
    let job = run_self("mismatched_worker", 2, &[], LIMIT);
    assert!(
        job.status.success(),
        "mpirun exited with {}; stdout:\n{}",
        job.status,
        job.stdout
    );
    assert_eq!(job.results.len(), 2, "stdout:\n{}", job.stdout);
    for message in &job.results {
        assert_eq!(
            message,
            "the model replicas differ: variable 'l1.bias' is f32 [8] on worker 0 but f32 [9] on \
             worker 1"
        );
    }
}

#[test]
#[ignore = "a worker process: started by mpirun from a_worker_whose_builder_fails_fails_every_worker_and_reports_its_own_error"]
fn failing_builder_worker() {
    let strategy = MultiWorkerMirroredStrategy::with_config(MultiWorkerConfig::default()).unwrap();
    let chief = strategy.is_chief();
    let err = DataParallel::new(
        &strategy,
        Config::default(),
        |vb: candle_nn::VarBuilder| {
            if chief {
                candle_nn::linear(4, 2, vb.pp("l1"))
            } else {
                Err(candle_core::Error::Msg(
                    "no weights file on this machine".into(),
                ))
            }
        },
        |vars| <candle_nn::SGD as candle_nn::Optimizer>::new(vars, 0.1),
    )
    .err()
    .expect("worker 1's builder fails");
    write_result(&err.to_string());
}

#[test]
fn a_worker_whose_builder_fails_fails_every_worker_and_reports_its_own_error() {
    let job = run_self("failing_builder_worker", 2, &[], LIMIT);
    assert!(
        job.status.success(),
        "mpirun exited with {}; stdout:\n{}",
        job.status,
        job.stdout
    );
    assert_eq!(
        job.results,
        [
            // The other workers hear the failed worker's message (the end-of-step agreement).
            "worker 1 failed: building its model: replica 1: no weights file on this machine",
            "replica 1: no weights file on this machine",
        ],
        "stdout:\n{}",
        job.stdout
    );
}

#[test]
#[ignore = "a worker process: started by mpirun from workers_start_from_the_chiefs_values_and_drift_is_named"]
fn fresh_worker() {
    let strategy = MultiWorkerMirroredStrategy::with_config(MultiWorkerConfig::default()).unwrap();
    // Each worker's initialiser draws its own random values.
    let model = DataParallel::new(
        &strategy,
        Config::default(),
        |vb: candle_nn::VarBuilder| candle_nn::linear(4, 3, vb.pp("l1")),
        |vars| <candle_nn::SGD as candle_nn::Optimizer>::new(vars, 0.1),
    )
    .unwrap();
    // Every worker holds the chief's values, whatever its initialiser drew.
    model.check_in_sync().unwrap();
    // Worker 1's copy drifts; the check names it on every worker.
    model
        .run(&(), |replica, ()| {
            if replica.replica_id() == 1 {
                let bias = &replica.vars()[0];
                bias.set(&(bias.as_tensor() + 1e-3)?.detach())?;
            }
            Ok(())
        })
        .unwrap();
    write_result(&model.check_in_sync().unwrap_err().to_string());
}

#[test]
fn workers_start_from_the_chiefs_values_and_drift_is_named() {
    let job = run_self("fresh_worker", 2, &[], LIMIT);
    assert!(
        job.status.success(),
        "mpirun exited with {}; stdout:\n{}",
        job.status,
        job.stdout
    );
    let named = "the model copies are out of sync: variable 'l1.bias' of worker 1 differs from \
                 worker 0's";
    assert_eq!(job.results, [named, named], "stdout:\n{}", job.stdout);
}

/// Checkpoints of the resumable job: every `EVERY` of `RESUMABLE_STEPS` steps.
const EVERY: u64 = 5;
const RESUMABLE_STEPS: usize = 30;

/// AdamW with a warmup-cosine schedule and clipping, on a small model; checkpoints in
/// [`CHECKPOINT_DIR_VAR`] when set, and worker 1 killed with SIGKILL after the step
/// `kill_and_resume` names.
fn resumable_options(init: &str) -> Options {
    Options {
        steps: RESUMABLE_STEPS,
        optimizer: OptimizerKind::AdamW,
        lr: Some(3e-3),
        warmup: 5,
        clip_norm: Some(0.5),
        hidden: 32,
        checkpoints: std::env::var(CHECKPOINT_DIR_VAR)
            .ok()
            .map(|dir| (dir.into(), EVERY)),
        after_step: Some(AfterStep(std::sync::Arc::new(kill_at_step_from_env(1)))),
        ..options(init)
    }
}

#[test]
#[ignore = "a worker process: started by mpirun from a_killed_adamw_job_resumes_on_the_bits_of_one_that_never_stopped"]
fn resumable_worker() {
    let init = std::env::var(INIT).expect("started by the launching test");
    let (trained, _, chief) = train_multi_worker(&resumable_options(&init)).unwrap();
    if chief {
        write_result(
            &serde_json::json!({"weights": trained.weights, "losses": trained.losses,
                                "first_step": trained.first_step})
            .to_string(),
        );
    }
}

#[test]
fn a_killed_adamw_job_resumes_on_the_bits_of_one_that_never_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let init = dir.path().join("init.safetensors");
    train(&Options {
        replicas: 1,
        steps: 0,
        hidden: 32,
        save_init: Some(init.clone()),
        ..Options::default()
    })
    .unwrap();
    let init = init.to_str().unwrap().to_owned();
    let run = |env: &[(&str, String)]| {
        let mut env = env.to_vec();
        env.push((INIT, init.clone()));
        run_self("resumable_worker", 2, &env, LIMIT)
    };
    let parse = |result: &str| serde_json::from_str::<serde_json::Value>(result).unwrap();
    let first_step = |v: &serde_json::Value| v["first_step"].as_u64().filter(|&s| s > 0);
    let (resumed, whole) = kill_and_resume(run, (EVERY, RESUMABLE_STEPS), parse, first_step);
    let from = first_step(&resumed).unwrap() as usize;
    let losses: Vec<f32> = serde_json::from_value(resumed["losses"].clone()).unwrap();
    let all: Vec<f32> = serde_json::from_value(whole["losses"].clone()).unwrap();
    assert_eq!(losses, all[from..], "the losses after step {from}");
    assert_eq!(
        resumed["weights"], whole["weights"],
        "the weights differ from the job that never stopped"
    );
}
