//! A reference workload that other frameworks can run identically: linear regression with 64
//! features, global batch 256, 200 SGD steps at learning rate 0.1, weights and bias starting at
//! zero, trained data-parallel with `MirroredStrategy`.
//!
//! Data (all f32, generated, so every framework sees the same rows): `h` is lowbias32,
//! `u(k) = (h(k) >> 8) / 2^23 − 1`, `X[i][j] = u(64·i + j)`, `w_true[j] = ((j mod 9) − 4) / 4`,
//! `b_true = 0.5`, `noise[i] = u(0x9E3779B9 xor i) / 128`, and
//! `y[i] = f32(Σ_j X[i][j]·w_true[j] + b_true + noise[i])` summed in f64. Step `s` uses rows
//! `256·s … 256·s + 255`; replica `r` gets the `r`-th contiguous chunk of each batch.
//!
//! Each replica computes the gradient sums of its chunk; one fused `all_reduce` adds them up; a
//! `merge_call` applies the SGD step to the mirrored variables through the cross-replica
//! `update`, as TF's optimizers do.
//!
//! ```text
//! cargo run --release -p distribute --example linear_regression -- --replicas 2 --json
//! ```

use std::time::Instant;

use distribute::prelude::*;
use distribute::values::regroup;
use ndarray::{Array1, ArrayView1, ArrayView2, Ix1, Ix2};

/// The workload's fixed sizes.
pub(crate) const FEATURES: usize = 64;
/// Rows per step, over all replicas.
pub(crate) const GLOBAL_BATCH: usize = 256;
/// SGD steps.
pub(crate) const STEPS: usize = 200;
/// The learning rate.
pub(crate) const LEARNING_RATE: f32 = 0.1;

/// lowbias32, with wrapping arithmetic.
pub(crate) fn h(mut k: u32) -> u32 {
    k ^= k >> 16;
    k = k.wrapping_mul(0x7feb_352d);
    k ^= k >> 15;
    k = k.wrapping_mul(0x846c_a68b);
    k ^= k >> 16;
    k
}

/// A number in [−1, 1) from `k`; every step is exact in f32.
pub(crate) fn u(k: u32) -> f32 {
    (h(k) >> 8) as f32 / 8_388_608.0 - 1.0
}

/// The rows of `steps` steps: `X` (row-major, `FEATURES` per row) and `y`.
pub(crate) fn dataset(steps: usize) -> (Vec<f32>, Vec<f32>) {
    let rows = steps * GLOBAL_BATCH;
    let w_true: Vec<f64> = (0..FEATURES)
        .map(|j| ((j % 9) as f64 - 4.0) / 4.0)
        .collect();
    let x: Vec<f32> = (0..rows * FEATURES).map(|k| u(k as u32)).collect();
    let y = (0..rows)
        .map(|i| {
            let row = &x[i * FEATURES..(i + 1) * FEATURES];
            let dot: f64 = row.iter().zip(&w_true).map(|(&x, &w)| x as f64 * w).sum();
            let noise = u(0x9E37_79B9 ^ i as u32) as f64 / 128.0;
            (dot + 0.5 + noise) as f32
        })
        .collect();
    (x, y)
}

/// What a training run ends with.
#[derive(Debug, Clone)]
pub(crate) struct Trained {
    /// The learned weights.
    pub(crate) weights: Vec<f32>,
    /// The learned bias.
    pub(crate) bias: f32,
    /// The mean squared error of the last step's batch (before its update).
    pub(crate) loss: f32,
    /// Training steps per second, data generation excluded.
    pub(crate) steps_per_s: f64,
}

/// One replica's input for a step: its rows of X and y.
type Chunk = (Tensor, Tensor);

/// Trains on `replicas` CPU replicas for `steps` steps.
pub(crate) fn train(replicas: usize, steps: usize) -> Result<Trained, Box<dyn std::error::Error>> {
    let devices: Vec<String> = (0..replicas).map(|r| format!("/cpu:{r}")).collect();
    let strategy = MirroredStrategy::new(&devices)?;
    let (x, y) = dataset(steps);
    let host = "/cpu:0";
    let weights = strategy.create_variable(
        "weights",
        Tensor::zeros(host, DType::F32, &[FEATURES]),
        VariableOptions::default(),
    )?;
    let bias = strategy.create_variable(
        "bias",
        Tensor::zeros(host, DType::F32, &[1]),
        VariableOptions::default(),
    )?;
    // Each replica's chunk of every step, placed on its device.
    let chunk = GLOBAL_BATCH.div_ceil(replicas);
    let batches: Vec<(Leaf<Tensor>, Leaf<Tensor>)> = (0..steps)
        .map(|s| {
            let chunks = (0..replicas)
                .map(|r| {
                    let start = (s * GLOBAL_BATCH + r * chunk).min((s + 1) * GLOBAL_BATCH);
                    let end = (start + chunk).min((s + 1) * GLOBAL_BATCH);
                    let xs = x[start * FEATURES..end * FEATURES].to_vec();
                    let ys = y[start..end].to_vec();
                    Ok((
                        Tensor::from_vec(&devices[r], &[end - start, FEATURES], xs)?,
                        Tensor::from_vec(&devices[r], &[end - start], ys)?,
                    ))
                })
                .collect::<Result<Vec<Chunk>, StrategyError>>()?;
            // One (X, y) per replica → (PerReplica X, PerReplica y).
            Ok(regroup(strategy.extended().device_map(), chunks)?)
        })
        .collect::<Result<_, StrategyError>>()?;

    let mut loss = f32::NAN;
    let start = Instant::now();
    for batch in &batches {
        let step_loss: Leaf<f32> = strategy.run(
            |ctx, (xs, ys)| {
                let w = ctx.read_variable(&weights)?;
                let b = ctx.read_variable(&bias)?;
                let (grad_w, grad_b, loss_sum) = gradient_sums(&xs, &ys, &w, &b)?;
                let device = &ctx.devices()[0];
                let sums = (
                    Tensor::from_vec(device, &[FEATURES], grad_w)?,
                    Tensor::from_vec(device, &[2], vec![grad_b, loss_sum])?,
                );
                let (grad_w, rest) = ctx.all_reduce(ReduceOp::Sum, &sums)?;
                // d(mean squared error)/dθ = 2/B · Σ err·∂pred/∂θ over the global batch.
                let scale = 2.0 * LEARNING_RATE / GLOBAL_BATCH as f32;
                let rest = rest.to_vec::<f32>()?;
                let step_w = scaled(&grad_w, scale)?;
                let step_b = Tensor::from_vec(device, &[1], vec![rest[0] * scale])?;
                ctx.merge_call::<(Tensor, Tensor), (), _>((step_w, step_b), |cross, (dw, db)| {
                    cross.update(&weights, UpdateOp::AssignSub, &dw)?;
                    cross.update(&bias, UpdateOp::AssignSub, &db)?;
                    Ok(())
                })?;
                Ok(rest[1] / GLOBAL_BATCH as f32)
            },
            batch,
        )?;
        loss = *step_loss.local_results()[0];
    }
    let elapsed = start.elapsed().as_secs_f64();
    let cross = strategy.cross_replica();
    Ok(Trained {
        weights: cross.read_var(&weights)?.to_vec::<f32>()?,
        bias: cross.read_var(&bias)?.to_vec::<f32>()?[0],
        loss,
        steps_per_s: steps as f64 / elapsed,
    })
}

/// Σ err·x (per feature), Σ err and Σ err² over one replica's rows, with err = x·w + b − y.
fn gradient_sums(
    xs: &Tensor,
    ys: &Tensor,
    w: &Tensor,
    b: &Tensor,
) -> Result<(Vec<f32>, f32, f32), StrategyError> {
    let invalid = |e: ndarray::ShapeError| StrategyError::InvalidArgument(e.to_string());
    let x: ArrayView2<f32> = xs
        .array::<f32>()?
        .view()
        .into_dimensionality::<Ix2>()
        .map_err(invalid)?;
    let y: ArrayView1<f32> = ys
        .array::<f32>()?
        .view()
        .into_dimensionality::<Ix1>()
        .map_err(invalid)?;
    let w: ArrayView1<f32> = w
        .array::<f32>()?
        .view()
        .into_dimensionality::<Ix1>()
        .map_err(invalid)?;
    let b = b.to_vec::<f32>()?[0];
    let err: Array1<f32> = x.dot(&w) + b - y;
    let grad_w = err.dot(&x);
    Ok((grad_w.to_vec(), err.sum(), err.dot(&err)))
}

/// `t · scale`, elementwise.
fn scaled(t: &Tensor, scale: f32) -> Result<Tensor, StrategyError> {
    let a = t.array::<f32>()?.mapv(|v| v * scale);
    Ok(Tensor::from_shared(t.device(), a.into_shared()))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut replicas = 2;
    let mut json = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--replicas" => {
                replicas = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|n| *n > 0)
                    .ok_or("--replicas needs a positive number")?;
            }
            "--json" => json = true,
            other => {
                return Err(format!("unknown argument '{other}'; use --replicas N, --json").into());
            }
        }
    }
    let trained = train(replicas, STEPS)?;
    if json {
        println!(
            "{}",
            serde_json::json!({
                "replicas": replicas, "steps": STEPS, "weights": trained.weights,
                "bias": trained.bias, "loss": trained.loss, "steps_per_s": trained.steps_per_s,
            })
        );
    } else {
        println!(
            "{replicas} replicas, {STEPS} steps: loss {:.6}, bias {:.6}, {:.0} steps/s",
            trained.loss, trained.bias, trained.steps_per_s
        );
        println!("weights: {:?}", trained.weights);
    }
    Ok(())
}
