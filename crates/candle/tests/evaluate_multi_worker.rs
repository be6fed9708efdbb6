//! Distributed evaluation across worker processes (feature `mpi`): 2 workers × 2 replicas under
//! `mpirun` evaluate a small linear classifier (dyadic weights and inputs, as in
//! `tests/evaluate.rs`) over datasets whose row count is not a multiple of the global batch,
//! padded with masks or uneven, and every worker gets bit for bit the sums of a single-process
//! evaluation on 1 and on 4 replicas; metric names that differ on a replica of worker 1 are
//! named on every worker. The workers are this test binary started by `mpirun`; every run is
//! bounded in time.
#![cfg(feature = "mpi")]

use std::collections::HashMap;
use std::time::Duration;

use candle_core::{D, DType, Device, Tensor};
use candle_nn::{Linear, Module, Optimizer, SGD, VarBuilder};
use distribute_candle::{CandleMasked, Config, DataParallel, Metrics, StepError};
use distribute_device_spec::LocalDevices;
use distribute_input::{Dataset, DistributedDataset, InputOptions, PartialBatch};
use distribute_mirrored::MirroredStrategy;
use distribute_multi_worker::{MultiWorkerConfig, MultiWorkerMirroredStrategy};
use distribute_strategy::Strategy;
use distribute_tensor::Tensor as HostTensor;
use distribute_test_support::mpirun::{run_self, write_result};

const FEATURES: usize = 3;
const CLASSES: usize = 3;
const GLOBAL_BATCH: usize = 8;
/// The evaluations every run makes: row counts with their partial-batch policy.
const CASES: [(usize, PartialBatch); 4] = [
    (17, PartialBatch::PadWithMask),
    (23, PartialBatch::PadWithMask),
    (17, PartialBatch::KeepUneven),
    (3, PartialBatch::KeepUneven),
];
/// How long one `mpirun` may take before the test kills it and fails.
const LIMIT: Duration = Duration::from_secs(300);

/// Row `i`'s features: multiples of 0.5 in [-2, 2].
fn features(i: usize) -> [f32; FEATURES] {
    std::array::from_fn(|j| ((i * i * 3 + i * (j + 1) * 5 + j * 2 + i / 3) % 9) as f32 * 0.5 - 2.0)
}

fn label(i: usize) -> i64 {
    ((i * 5 + i / 4) % CLASSES) as i64
}

/// The classifier on `strategy`, holding weights that are multiples of 0.25.
fn model<S: Strategy>(strategy: &S) -> DataParallel<'_, S, Linear, SGD> {
    let model = DataParallel::new(
        strategy,
        Config::default(),
        |vb: VarBuilder| candle_nn::linear(FEATURES, CLASSES, vb.pp("l1")),
        |vars| SGD::new(vars, 0.1),
    )
    .unwrap();
    let w: Vec<f32> = (0..CLASSES * FEATURES)
        .map(|k| ((k * 2 + 1) % 7) as f32 * 0.25 - 0.75)
        .collect();
    let cpu = &Device::Cpu;
    model
        .assign(HashMap::from([
            (
                "l1.weight".to_owned(),
                Tensor::from_vec(w, (CLASSES, FEATURES), cpu).unwrap(),
            ),
            (
                "l1.bias".to_owned(),
                Tensor::new(&[0.25f32, -0.25, 0.0], cpu).unwrap(),
            ),
        ]))
        .unwrap();
    model
}

fn dataset<S: Strategy>(
    strategy: &S,
    rows: usize,
    partial: PartialBatch,
) -> DistributedDataset<(HostTensor, HostTensor)> {
    let x: Vec<f32> = (0..rows).flat_map(features).collect();
    let y: Vec<i64> = (0..rows).map(label).collect();
    let data = (
        HostTensor::from_vec("/cpu:0", &[rows, FEATURES], x).unwrap(),
        HostTensor::from_vec("/cpu:0", &[rows], y).unwrap(),
    );
    let dataset = Dataset::from_tensors(data)
        .unwrap()
        .batch(GLOBAL_BATCH, false)
        .unwrap();
    let options = InputOptions {
        partial_batch: partial,
        ..InputOptions::default()
    };
    strategy.distribute_dataset(dataset, options).unwrap()
}

fn step(
    model: &Linear,
    x: &Tensor,
    y: &Tensor,
    mask: Option<&Tensor>,
) -> Result<Metrics, StepError> {
    let logits = model.forward(x)?;
    let y = y.to_dtype(DType::U32)?;
    let loss = candle_nn::ops::log_softmax(&logits, D::Minus1)?
        .gather(&y.unsqueeze(1)?, 1)?
        .squeeze(1)?
        .neg()?;
    let correct = logits.argmax(D::Minus1)?.eq(&y)?;
    let mut metrics = Metrics::new();
    metrics
        .add_rows("correct", &correct, mask)?
        .count_rows("total", x, mask)?
        .add_rows("loss", &loss, mask)?;
    Ok(metrics)
}

/// Every case's metrics on `strategy`, as `name=bits` lines (exact).
fn evaluate_all<S: Strategy>(strategy: &S) -> Vec<String> {
    let model = model(strategy);
    CASES
        .iter()
        .map(|&(rows, partial)| {
            let data = dataset(strategy, rows, partial);
            let metrics = if partial == PartialBatch::PadWithMask {
                model.evaluate(data.iter_masked(), |model, _, batch| {
                    let CandleMasked {
                        batch: (x, y),
                        mask,
                    } = batch;
                    step(model, &x, &y, Some(&mask))
                })
            } else {
                model.evaluate(&data, |model, _, (x, y)| step(model, &x, &y, None))
            }
            .unwrap();
            assert_eq!(metrics["total"], rows as f64);
            let exact: Vec<String> = metrics
                .iter()
                .map(|(name, value)| format!("{name}={:#x}", value.to_bits()))
                .collect();
            format!("{rows} {partial:?}: {metrics} [{}]", exact.join(" "))
        })
        .collect()
}

fn multi_worker() -> MultiWorkerMirroredStrategy {
    MultiWorkerMirroredStrategy::with_config(MultiWorkerConfig {
        local_devices: LocalDevices::cpus(2),
        ..MultiWorkerConfig::default()
    })
    .unwrap()
}

#[test]
#[ignore = "a worker process: started by mpirun from two_workers_of_two_replicas_sum_what_one_process_sums"]
fn worker() {
    let strategy = multi_worker();
    assert_eq!(strategy.num_replicas_in_sync(), 4);
    write_result(&serde_json::json!(evaluate_all(&strategy)).to_string());
}

#[test]
fn two_workers_of_two_replicas_sum_what_one_process_sums() {
    let job = run_self("worker", 2, &[], LIMIT);
    assert!(
        job.status.success(),
        "mpirun exited with {}; stdout:\n{}",
        job.status,
        job.stdout
    );
    assert_eq!(job.results.len(), 2, "stdout:\n{}", job.stdout);
    let one = evaluate_all(&MirroredStrategy::new(LocalDevices::cpus(1)).unwrap());
    let four = evaluate_all(&MirroredStrategy::new(LocalDevices::cpus(4)).unwrap());
    assert_eq!(one, four, "one process, 1 and 4 replicas");
    for (worker, result) in job.results.iter().enumerate() {
        let got: Vec<String> = serde_json::from_str(result).unwrap();
        assert_eq!(got, one, "worker {worker} of 2 (2 replicas each)");
    }
}

#[test]
#[ignore = "a worker process: started by mpirun from names_that_differ_on_another_worker_are_named_on_every_worker"]
fn mismatched_worker() {
    let strategy = multi_worker();
    let model = model(&strategy);
    let data = dataset(&strategy, 8, PartialBatch::KeepUneven);
    // One global batch of 8 rows, 2 to each of the 4 replicas: rows 6 and 7 go to the last
    // replica (worker 1's local replica 1, global replica 3: local replica r of worker w takes
    // chunk r·W + w).
    let last = features(7);
    let err = model
        .evaluate(&data, |model, _, (x, y)| {
            let rows = x.to_vec2::<f32>()?;
            let metrics = step(model, &x, &y, None)?;
            Ok(match rows.iter().any(|row| row[..] == last[..]) {
                true => metrics.with("extra", 1.0),
                false => metrics,
            })
        })
        .unwrap_err();
    write_result(&err.to_string());
}

#[test]
fn names_that_differ_on_another_worker_are_named_on_every_worker() {
    let job = run_self("mismatched_worker", 2, &[], LIMIT);
    assert!(
        job.status.success(),
        "mpirun exited with {}; stdout:\n{}",
        job.status,
        job.stdout
    );
    assert_eq!(job.results.len(), 2, "stdout:\n{}", job.stdout);
    for message in &job.results {
        assert!(
            message.contains("replica 3's metrics (4 names) differ from replica 0's (3 names)"),
            "{message}"
        );
    }
}
