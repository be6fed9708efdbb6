//! Multi-worker input with real worker processes (feature `mpi`): under `mpirun -n 2` and `-n 3`,
//! `MultiWorkerMirroredStrategy`'s datasets whose workers read different streams (one dataset
//! per worker from a function; files sharded by worker) end on the same step on every worker,
//! workers that ran out feeding empty batches, while every step also runs a cross-worker
//! all-reduce. The workers are this test binary's ignored `worker` test; every run is bounded
//! in time.
#![cfg(feature = "mpi")]

use std::path::{Path, PathBuf};
use std::time::Duration;

use distribute::input::{AutoShardPolicy, NpySource, npy};
use distribute::prelude::*;
use distribute::tensor::Tensor;
use distribute_test_support::mpirun::{run_self, write_result};

/// The folder of the npy files; its presence makes the ignored `worker` test run.
const FILES: &str = "DISTRIBUTE_TEST_INPUT_FILES";
const LIMIT: Duration = Duration::from_secs(180);
/// Steps each worker has data for on its own, by worker index.
const OWN_STEPS: [usize; 3] = [3, 1, 5];

/// Every step's own row count, and the sum over every replica of every worker.
fn iterate(
    strategy: &MultiWorkerMirroredStrategy,
    dataset: &DistributedDataset<Tensor>,
) -> (Vec<usize>, Vec<f32>) {
    let (mut own, mut total) = (Vec::new(), Vec::new());
    for step in dataset {
        let step = step.unwrap();
        own.push(step.local_results().iter().map(|t| t.shape()[0]).sum());
        let sum: Leaf<Tensor> = strategy
            .run(
                |ctx, t: Tensor| {
                    let mine = Tensor::scalar(ctx.device(), t.shape()[0] as f32);
                    ctx.all_reduce(ReduceOp::Sum, &mine)
                },
                &step,
            )
            .unwrap();
        total.push(sum.local_results()[0].to_vec::<f32>().unwrap()[0]);
    }
    (own, total)
}

#[test]
#[ignore = "a worker process: started by mpirun from workers_reading_different_streams_end_together"]
fn worker() {
    let dir = PathBuf::from(std::env::var(FILES).expect("started by the launching test"));
    let strategy = MultiWorkerMirroredStrategy::new().unwrap();
    let w = strategy.worker();
    let workers = strategy.num_workers();

    let from_fn = strategy
        .distribute_datasets_from_function(InputOptions::default(), |cx| {
            Dataset::range(OWN_STEPS[cx.input_pipeline_id()]).batch(1, false)
        })
        .unwrap();
    assert!(from_fn.needs_agreement());
    let (fn_own, fn_total) = iterate(&strategy, &from_fn);

    let files: Vec<PathBuf> = (0..workers).map(|f| file(&dir, f)).collect();
    // Global batches of 2·W rows: 2 per worker per step from its own file.
    let by_file = strategy
        .distribute_dataset(
            Dataset::from_source(NpySource::new(&files).unwrap())
                .batch(2 * workers, false)
                .unwrap(),
            InputOptions::default(),
        )
        .unwrap();
    assert_eq!(by_file.applied_auto_shard(), [AutoShardPolicy::File]);
    let (file_own, file_total) = iterate(&strategy, &by_file);

    write_result(
        &serde_json::json!({
            "worker": w, "fn_own": fn_own, "fn_total": fn_total,
            "file_own": file_own, "file_total": file_total,
        })
        .to_string(),
    );
}

/// Worker `f`'s file: 2·W rows (a global batch, W steps of 2 rows) per `OWN_STEPS[f]`.
fn file(dir: &Path, f: usize) -> PathBuf {
    dir.join(format!("{f}.npy"))
}

/// Runs the workers as `workers` processes; each one's result.
fn launch(workers: usize, dir: &Path) -> Vec<serde_json::Value> {
    let job = run_self(
        "worker",
        workers,
        &[(FILES, dir.display().to_string())],
        LIMIT,
    );
    assert!(
        job.status.success(),
        "mpirun exited with {}; stdout:\n{}",
        job.status,
        job.stdout
    );
    let mut results: Vec<serde_json::Value> = job
        .results
        .iter()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    results.sort_by_key(|r| r["worker"].as_u64());
    assert_eq!(
        results.len(),
        workers,
        "one result per worker; stdout:\n{}",
        job.stdout
    );
    results
}

fn usizes(value: &serde_json::Value) -> Vec<usize> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect()
}

#[test]
fn workers_reading_different_streams_end_together() {
    for workers in [2, 3] {
        let dir = std::env::temp_dir().join(format!(
            "distribute-multi-worker-input-{}-{workers}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        for (f, steps) in OWN_STEPS.iter().take(workers).enumerate() {
            let rows = 2 * workers * steps;
            let data: Vec<i64> = (0..rows as i64).collect();
            npy::write(
                &file(&dir, f),
                &Tensor::from_vec("/cpu:0", &[rows], data).unwrap(),
            )
            .unwrap();
        }
        let results = launch(workers, &dir);
        std::fs::remove_dir_all(&dir).unwrap();
        let longest = *OWN_STEPS[..workers].iter().max().unwrap();
        for (w, result) in results.iter().enumerate() {
            // One row per step while a worker has data, then empty batches until the longest
            // worker ends; the all-reduce counts the workers with a row.
            let fn_own = usizes(&result["fn_own"]);
            let expected: Vec<usize> = (0..longest)
                .map(|s| usize::from(s < OWN_STEPS[w]))
                .collect();
            assert_eq!(
                fn_own, expected,
                "{workers} workers, worker {w}: from function"
            );
            for s in 0..longest {
                let with_data = OWN_STEPS[..workers].iter().filter(|&&n| s < n).count();
                assert_eq!(result["fn_total"][s].as_f64(), Some(with_data as f64));
            }
            // Each global batch of a worker's file is cut into W chunks of 2 rows: W steps.
            let file_own = usizes(&result["file_own"]);
            let expected: Vec<usize> = (0..workers * longest)
                .map(|s| if s < workers * OWN_STEPS[w] { 2 } else { 0 })
                .collect();
            assert_eq!(file_own, expected, "{workers} workers, worker {w}: files");
            for s in 0..workers * longest {
                let with_data = OWN_STEPS[..workers]
                    .iter()
                    .filter(|&&n| s < workers * n)
                    .count();
                assert_eq!(
                    result["file_total"][s].as_f64(),
                    Some(2.0 * with_data as f64)
                );
            }
        }
    }
}
