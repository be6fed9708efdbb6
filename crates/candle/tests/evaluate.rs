//! Distributed evaluation (`DataParallel::evaluate`) of a small linear classifier whose weights
//! and inputs are dyadic (every logit exact in f32, so a row's loss does not depend on the rows
//! beside it): on 1, 2 and 3 replicas, over datasets whose row count is not a multiple of the
//! global batch (the last batch padded with a mask, or uneven and empty batches), it gives
//! exactly the correct/total/loss sums of a plain loop over the rows, counting every row once;
//! it leaves the model alone; a step's error names the replica; differing metric names are
//! named; it is refused inside a step. And the all-reduce helpers for metrics inside a step.

use std::collections::HashMap;

use candle_core::{D, DType, Device, Tensor};
use candle_nn::{Linear, Module, Optimizer, SGD, VarBuilder};
use distribute_candle::{
    CandleMasked, Config, DataParallel, Error, Metrics, StepError, all_reduce_scalar,
    all_reduce_scalars, all_reduce_tensor, all_reduce_tensors,
};
use distribute_device_spec::LocalDevices;
use distribute_input::{Dataset, DistributedDataset, InputError, InputOptions, PartialBatch};
use distribute_mirrored::MirroredStrategy;
use distribute_strategy::Strategy;
use distribute_tensor::Tensor as HostTensor;
use distribute_values::ReduceOp;

const FEATURES: usize = 3;
const CLASSES: usize = 3;
const GLOBAL_BATCH: usize = 8;

type Model<'s> = DataParallel<'s, MirroredStrategy, Linear, SGD>;

fn strategy(replicas: usize) -> MirroredStrategy {
    MirroredStrategy::new(LocalDevices::cpus(replicas)).unwrap()
}

/// Row `i`'s features: multiples of 0.5 in [-2, 2], no two rows of the first 23 alike.
fn features(i: usize) -> [f32; FEATURES] {
    std::array::from_fn(|j| ((i * i * 3 + i * (j + 1) * 5 + j * 2 + i / 3) % 9) as f32 * 0.5 - 2.0)
}

/// Row `i`'s label.
fn label(i: usize) -> i64 {
    ((i * 5 + i / 4) % CLASSES) as i64
}

/// The classifier's weights and bias: multiples of 0.25, so every logit is exact in f32.
fn weights() -> (Vec<f32>, Vec<f32>) {
    let w = (0..CLASSES * FEATURES)
        .map(|k| ((k * 2 + 1) % 7) as f32 * 0.25 - 0.75)
        .collect();
    (w, vec![0.25, -0.25, 0.0])
}

/// The model on `strategy`, holding [`weights`].
fn model(strategy: &MirroredStrategy) -> Model<'_> {
    let model = DataParallel::new(
        strategy,
        Config::default(),
        |vb: VarBuilder| candle_nn::linear(FEATURES, CLASSES, vb.pp("l1")),
        |vars| SGD::new(vars, 0.1),
    )
    .unwrap();
    let (w, b) = weights();
    model
        .assign(HashMap::from([
            (
                "l1.weight".to_owned(),
                Tensor::from_vec(w, (CLASSES, FEATURES), &Device::Cpu).unwrap(),
            ),
            (
                "l1.bias".to_owned(),
                Tensor::from_vec(b, CLASSES, &Device::Cpu).unwrap(),
            ),
        ]))
        .unwrap();
    model
}

/// `rows` rows in global batches of [`GLOBAL_BATCH`], distributed with `partial`.
fn dataset(
    strategy: &MirroredStrategy,
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

/// Each row's loss (cross-entropy, f32) and whether the prediction is right (`[rows]`).
fn per_row(model: &Linear, x: &Tensor, y: &Tensor) -> candle_core::Result<(Tensor, Tensor)> {
    let logits = model.forward(x)?;
    let y = y.to_dtype(DType::U32)?;
    let loss = candle_nn::ops::log_softmax(&logits, D::Minus1)?
        .gather(&y.unsqueeze(1)?, 1)?
        .squeeze(1)?
        .neg()?;
    let correct = logits.argmax(D::Minus1)?.eq(&y)?;
    Ok((loss, correct))
}

/// An evaluation step: the replica's batch's sums, its padding rows skipped.
fn step(
    model: &Linear,
    x: &Tensor,
    y: &Tensor,
    mask: Option<&Tensor>,
) -> Result<Metrics, StepError> {
    let (loss, correct) = per_row(model, x, y)?;
    let mut metrics = Metrics::new();
    metrics
        .add_rows("correct", &correct, mask)?
        .count_rows("total", x, mask)?
        .add_rows("loss", &loss, mask)?;
    Ok(metrics)
}

fn masked_step(
    model: &Linear,
    _: &Device,
    batch: CandleMasked<(Tensor, Tensor)>,
) -> Result<Metrics, StepError> {
    let CandleMasked {
        batch: (x, y),
        mask,
    } = batch;
    step(model, &x, &y, Some(&mask))
}

/// Evaluation with masks (`PadWithMask`) on `replicas` replicas.
fn evaluate_padded(replicas: usize, rows: usize) -> Metrics {
    let s = strategy(replicas);
    let model = model(&s);
    let data = dataset(&s, rows, PartialBatch::PadWithMask);
    model.evaluate(data.iter_masked(), masked_step).unwrap()
}

/// The reference: a plain loop over the rows, one at a time, on one candle model, the sums
/// added in row order in f64.
fn plain_loop(rows: usize) -> Metrics {
    let (w, b) = weights();
    let linear = Linear::new(
        Tensor::from_vec(w, (CLASSES, FEATURES), &Device::Cpu).unwrap(),
        Some(Tensor::from_vec(b, CLASSES, &Device::Cpu).unwrap()),
    );
    let (mut correct, mut loss) = (0.0f64, 0.0f64);
    for i in 0..rows {
        let x = Tensor::new(&[features(i)], &Device::Cpu).unwrap();
        let y = Tensor::new(&[label(i)], &Device::Cpu).unwrap();
        let (l, c) = per_row(&linear, &x, &y).unwrap();
        loss += f64::from(l.to_vec1::<f32>().unwrap()[0]);
        correct += f64::from(c.to_vec1::<u8>().unwrap()[0]);
    }
    Metrics::new()
        .with("correct", correct)
        .with("total", rows as f64)
        .with("loss", loss)
}

#[test]
fn padded_last_batches_count_every_row_once_on_any_replica_count() {
    // 17 rows: the last global batch has 1 row, so on 2 replicas the second replica's last
    // batch is all padding; 23 rows: 7 in the last batch, padded unevenly.
    for rows in [17, 23] {
        let reference = plain_loop(rows);
        assert_eq!(reference["total"], rows as f64);
        assert!(
            reference["correct"] > 0.0 && reference["correct"] < rows as f64,
            "a classifier neither always right nor always wrong: {reference}"
        );
        for replicas in [1, 2, 3] {
            let metrics = evaluate_padded(replicas, rows);
            assert_eq!(
                metrics, reference,
                "{rows} rows on {replicas} replicas: {metrics} but a plain loop gives {reference}"
            );
            // Bit for bit, the loss included.
            assert_eq!(metrics["loss"].to_bits(), reference["loss"].to_bits());
            assert_eq!(metrics["total"], rows as f64);
        }
    }
}

#[test]
fn uneven_and_empty_batches_without_masks_count_every_row_once() {
    // KeepUneven: 17 rows give the last step 1 row, so replica 1 (and 2) get an empty batch,
    // which runs no step; 1 row leaves replicas 1 and 2 without any step at all.
    for rows in [17, 1] {
        for replicas in [1, 2, 3] {
            let s = strategy(replicas);
            let model = model(&s);
            let data = dataset(&s, rows, PartialBatch::KeepUneven);
            let metrics = model
                .evaluate(&data, |model, _, (x, y)| step(model, &x, &y, None))
                .unwrap();
            assert_eq!(
                metrics,
                plain_loop(rows),
                "{rows} rows, {replicas} replicas"
            );
        }
    }
}

#[test]
fn a_step_may_return_no_metrics_for_a_batch_of_padding() {
    // 17 rows on 2 replicas: replica 1's last batch is all padding, and 1 row on 2 replicas
    // leaves replica 1 nothing but padding; its step says so with no metrics at all.
    for rows in [17, 1] {
        let s = strategy(2);
        let model = model(&s);
        let data = dataset(&s, rows, PartialBatch::PadWithMask);
        let metrics = model
            .evaluate(data.iter_masked(), |model, device, batch| {
                if batch.mask.sum_all()?.to_scalar::<f32>()? == 0.0 {
                    return Ok(Metrics::new());
                }
                masked_step(model, device, batch)
            })
            .unwrap();
        assert_eq!(metrics, plain_loop(rows), "{rows} rows");
    }
}

#[test]
fn evaluation_leaves_the_model_alone() {
    let s = strategy(2);
    let model = model(&s);
    let before = model
        .variable(0, "l1.weight")
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    let data = dataset(&s, 23, PartialBatch::PadWithMask);
    let first = model.evaluate(data.iter_masked(), masked_step).unwrap();
    let second = model.evaluate(data.iter_masked(), masked_step).unwrap();
    assert_eq!(first, second, "the same bits twice");
    model.check_in_sync().unwrap();
    assert_eq!(
        model
            .variable(1, "l1.weight")
            .unwrap()
            .to_vec2::<f32>()
            .unwrap(),
        before
    );
}

#[test]
fn an_empty_dataset_gives_no_metrics() {
    let s = strategy(2);
    let model = model(&s);
    let none = std::iter::empty::<Result<(), InputError>>();
    let metrics = model.evaluate(none, |_, _, ()| Ok(Metrics::new())).unwrap();
    assert!(metrics.is_empty());
}

#[test]
fn a_steps_error_names_its_replica() {
    let s = strategy(2);
    let model = model(&s);
    let data = dataset(&s, 23, PartialBatch::PadWithMask);
    // Row 5 of the first global batch of 8 is in replica 1's half.
    let sentinel = features(5);
    let err = model
        .evaluate(data.iter_masked(), |model, device, batch| {
            let rows = batch.batch.0.to_vec2::<f32>()?;
            if rows.iter().any(|row| row[..] == sentinel[..]) {
                return Err("a row the step cannot score".into());
            }
            masked_step(model, device, batch)
        })
        .unwrap_err();
    assert!(matches!(err, Error::Replica { replica: 1, .. }), "{err:?}");
    assert_eq!(err.to_string(), "replica 1: a row the step cannot score");
    // The model is usable after the failed evaluation.
    model.check_in_sync().unwrap();
}

#[test]
fn metric_names_that_differ_between_steps_or_replicas_are_named() {
    let s = strategy(2);
    let model = model(&s);
    // Between steps of one replica: the names change after the first step.
    let data = dataset(&s, 23, PartialBatch::PadWithMask);
    let err = model
        .evaluate(data.iter_masked(), |model, device, batch| {
            let full = batch.mask.sum_all()?.to_scalar::<f32>()? == 4.0;
            let metrics = masked_step(model, device, batch)?;
            Ok(if full {
                metrics
            } else {
                metrics.with("extra", 1.0)
            })
        })
        .unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, Error::Replica { .. }), "{err:?}");
    assert!(
        message.contains("every step must return the same names"),
        "{message}"
    );

    // Between replicas: one step, whose second replica alone adds a name.
    let data = dataset(&s, 8, PartialBatch::PadWithMask);
    let second_half = features(4);
    let err = model
        .evaluate(data.iter_masked(), |model, device, batch| {
            let mine = batch.batch.0.to_vec2::<f32>()?[0] == second_half;
            let metrics = masked_step(model, device, batch)?;
            Ok(if mine {
                metrics.with("extra", 1.0)
            } else {
                metrics
            })
        })
        .unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("replica 1's metrics (4 names) differ from replica 0's (3 names)"),
        "{message}"
    );
}

#[test]
fn evaluate_inside_a_step_is_refused() {
    let s = strategy(2);
    let model = model(&s);
    model
        .run(&(), |_, ()| {
            let none = std::iter::empty::<Result<(), InputError>>();
            let err = model
                .evaluate(none, |_, _, ()| Ok(Metrics::new()))
                .unwrap_err();
            assert!(
                matches!(err, Error::InStep { method: "evaluate" }),
                "{err:?}"
            );
            Ok(())
        })
        .unwrap();
}

#[test]
fn metrics_skip_padding_rows_and_check_their_shapes() {
    let cpu = &Device::Cpu;
    let per_row =
        Tensor::new(&[[1.0f32, 2.0], [3.0, 4.0], [f32::NAN, f32::INFINITY]], cpu).unwrap();
    let mask = Tensor::new(&[1.0f32, 1.0, 0.0], cpu).unwrap();
    let mut metrics = Metrics::new();
    metrics
        .add_rows("sum", &per_row, Some(&mask))
        .unwrap()
        .count_rows("rows", &per_row, Some(&mask))
        .unwrap()
        .count_rows("all", &per_row, None)
        .unwrap()
        .add_rows("scalar", &Tensor::new(2.5f64, cpu).unwrap(), None)
        .unwrap();
    assert_eq!(metrics.to_string(), "sum=10 rows=2 all=3 scalar=2.5");
    assert_eq!(
        metrics.names().collect::<Vec<_>>(),
        ["sum", "rows", "all", "scalar"]
    );
    assert_eq!(metrics.values(), [10.0, 2.0, 3.0, 2.5]);
    assert_eq!(metrics.ratio("sum", "rows"), Some(5.0));
    assert_eq!(metrics.ratio("sum", "missing"), None);
    assert_eq!(metrics.get("missing"), None);

    let short = Tensor::new(&[1.0f32], cpu).unwrap();
    let err = Metrics::new()
        .add_rows("sum", &per_row, Some(&short))
        .err()
        .unwrap();
    assert_eq!(
        err.to_string(),
        "metric 'sum': the mask has 1 entries but the tensor has 3 rows"
    );

    let mut merged: Metrics = [("a", 1.0), ("b", 2.0)].into_iter().collect();
    merged.merge(&Metrics::new()).unwrap();
    merged
        .merge(&Metrics::new().with("a", 1.0).with("b", 1.0))
        .unwrap();
    assert_eq!(merged, Metrics::new().with("a", 2.0).with("b", 3.0));
    assert!(
        merged
            .merge(&Metrics::new().with("b", 1.0).with("a", 1.0))
            .is_err()
    );
}

#[test]
fn scalars_and_candle_tensors_all_reduce_inside_a_step() {
    let s = strategy(2);
    let model = model(&s);
    let out = model
        .run(&(), |replica, ()| {
            let ctx = replica.context();
            let id = replica.replica_id() as f64;
            let scalars = all_reduce_scalars(ctx, ReduceOp::Sum, &[1.0, id, 0.1])?;
            let max = all_reduce_scalar(ctx, ReduceOp::Max, id)?;
            let device = replica.device();
            let f = Tensor::new(&[[id as f32, 1.0], [2.0, 3.0]], device)?;
            let i = Tensor::new(&[id as i64 + 1], device)?;
            let reduced = all_reduce_tensors(ctx, ReduceOp::Sum, &[f, i])?;
            let mean = all_reduce_tensor(ctx, ReduceOp::Mean, &Tensor::new(&[id], device)?)?;
            let bytes = Tensor::new(&[1u8], device)?;
            let refused = all_reduce_tensor(ctx, ReduceOp::Sum, &bytes).unwrap_err();
            assert!(
                matches!(refused, Error::UnsupportedDType { .. }),
                "{refused:?}"
            );
            assert_eq!(reduced[0].dtype(), DType::F32);
            assert_eq!(reduced[1].dtype(), DType::I64);
            Ok((
                scalars,
                max,
                reduced[0].to_vec2::<f32>()?,
                reduced[1].to_vec1::<i64>()?,
                mean.to_vec1::<f64>()?,
            ))
        })
        .unwrap();
    for (scalars, max, f, i, mean) in out {
        assert_eq!(scalars, [2.0, 1.0, 0.2]);
        assert_eq!(max, 1.0);
        assert_eq!(f, [[1.0, 2.0], [4.0, 6.0]]);
        assert_eq!(i, [3]);
        assert_eq!(mean, [0.5]);
    }
}

#[test]
fn metrics_all_reduce_inside_a_training_step() {
    let s = strategy(2);
    let model = model(&s);
    let out = model
        .run(&(), |replica, ()| {
            let mine = Metrics::new()
                .with("rows", 4.0)
                .with("loss", replica.replica_id() as f64);
            Ok(mine.all_reduce(replica.context(), ReduceOp::Sum)?)
        })
        .unwrap();
    let want = Metrics::new().with("rows", 8.0).with("loss", 1.0);
    assert_eq!(out, [want.clone(), want]);
}
