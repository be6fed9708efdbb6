//! `cargo xtask demo`: the whole stack training a real model, data-parallel, end to end.
//!
//! A multilayer perceptron (11 inputs → `--hidden` tanh units → 1 output, backprop written with
//! ndarray) learns the quality score of red wines (`linfa-datasets`' wine-quality data, 1599
//! rows) from their 11 measurements, with a fixed 20 % held out for validation. Every layer of
//! `distribute` takes part:
//!
//! - the input crate's [`DistributedDataset`] shuffles (seeded), repeats and cuts each global
//!   batch into per-replica batches: replica `r` gets the `r`-th contiguous chunk, prefetched
//!   on a background thread;
//! - the weights are mirrored variables made by `strategy.create_variable`, one per layer weight
//!   and bias, plus one momentum slot each;
//! - each replica computes the gradient sums of its rows, one fused `all_reduce` adds them up,
//!   and a `merge_call` applies SGD with momentum through the cross-replica `update_with`, as
//!   TF's optimizers do.
//!
//! The same training then runs on one replica with the same global batch and data order; the
//! largest difference between the two runs' weights must be at most 1e-5, or the demo fails.
//!
//! `--strategy tpu` trains the same model from the same batches with `TpuStrategy`, one replica
//! per PJRT device: the whole step (forward, backward, the gradient all-reduce and the momentum
//! update) is one program written with `StepBuilder` and compiled once ([`tpu_step`]), the
//! weights are `TpuVariable` device buffers, and batches are fed through the strategy's
//! `distribute_dataset` and `device_batches`. It is checked against one TPU replica (1e-5) and
//! against MirroredStrategy ([`TPU_MIRRORED_TOLERANCE`]).
//!
//! ```text
//! cargo xtask demo [--replicas N | --devices /cpu:0,/cpu:1,...] [--strategy mirrored|tpu]
//!                  [--steps S] [--batch B] [--lr LR] [--momentum M] [--hidden H] [--seed SEED]
//!                  [--plot FILE.png]
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use distribute::device_spec::DeviceSpec;
use distribute::pjrt::ElementType;
use distribute::pjrt::stablehlo::{DotDims, Reduction, UnaryOp, Value};
use distribute::prelude::*;
use distribute::tpu::{
    DeviceValue, StepBuilder, StepInput, TpuConfig, TpuError, TpuStrategy, TpuVariable,
};
use distribute_input::{Dataset, DistributedDataset, InputOptions, InputWorkers, PartialBatch};
use indicatif::{ProgressBar, ProgressStyle};
use ndarray::{Array1, Array2, ArrayView1, ArrayView2, Axis, Ix1, Ix2};

/// Measurements per wine: the model's inputs.
pub(crate) const FEATURES: usize = 11;
/// Share of the wines held out for validation.
const VALIDATION_FRACTION: f64 = 0.2;
/// The largest weight difference allowed between the N-replica and the 1-replica run.
pub(crate) const TOLERANCE: f32 = 1e-5;
/// The largest weight difference allowed between a TPU run and the mirrored run. Both sum
/// gradients in f64, but their per-row values round differently: the mirrored replicas sum
/// their dot products in f32 (ndarray) and call libm's `tanhf`, while the compiled step sums
/// them in f64 and computes tanh in f64 before rounding to f32 (see [`tpu_step`]); XLA also
/// fuses multiply-adds. The last-bit differences of each step are carried forward and grown
/// by momentum SGD: 5e-7 after the default 2000 steps, 1e-5 after 6000 steps at lr 0.02 on 3
/// or 4 replicas. Real mistakes are far larger: without the mask, 4 replicas of the short
/// test ended 0.7 away from 1 replica.
pub(crate) const TPU_MIRRORED_TOLERANCE: f32 = 1e-4;

/// What to train, and where.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Config {
    /// One replica per device.
    pub(crate) devices: Vec<String>,
    /// Optimizer steps.
    pub(crate) steps: usize,
    /// Rows per step, over all replicas.
    pub(crate) global_batch: usize,
    /// SGD learning rate.
    pub(crate) learning_rate: f32,
    /// Momentum of SGD (0 for plain SGD).
    pub(crate) momentum: f32,
    /// Units of the hidden layer.
    pub(crate) hidden: usize,
    /// Seed of the validation split, the initial weights and the shuffle.
    pub(crate) seed: u64,
    /// Steps between two validation losses on the curve.
    pub(crate) eval_every: usize,
    /// Whether to draw a progress bar (indicatif hides it anyway when stderr is not a terminal).
    pub(crate) progress: bool,
}

impl Config {
    /// The demo's defaults on `devices`: trains in about a second in release on 2 cores.
    pub(crate) fn new(devices: Vec<String>) -> Self {
        Config {
            devices,
            steps: 2000,
            global_batch: 128,
            learning_rate: 0.01,
            momentum: 0.9,
            hidden: 32,
            seed: 7,
            eval_every: 50,
            progress: true,
        }
    }

    /// The same run on the first device alone: the reference the replicas must match.
    pub(crate) fn one_replica(&self) -> Self {
        Config {
            devices: self.devices[..1].to_vec(),
            ..self.clone()
        }
    }
}

/// Rows of standardized features (`FEATURES` per row, row-major) and their quality scores.
#[derive(Debug, Clone)]
pub(crate) struct Split {
    /// The features, standardized with the training split's mean and deviation.
    pub(crate) x: Vec<f32>,
    /// The quality scores (3 to 8).
    pub(crate) y: Vec<f32>,
}

impl Split {
    /// The number of wines.
    pub(crate) fn rows(&self) -> usize {
        self.y.len()
    }
}

/// The wine-quality data, split into training and validation rows.
#[derive(Debug, Clone)]
pub(crate) struct WineData {
    /// The rows trained on.
    pub(crate) train: Split,
    /// The held-out rows.
    pub(crate) validation: Split,
}

/// Loads the red wines, holds out a seeded random 20 % for validation and standardizes every
/// feature with the training rows' mean and standard deviation (so nothing of the validation
/// rows leaks into training).
pub(crate) fn load_wine(seed: u64) -> Result<WineData> {
    // linfa-datasets brings its own ndarray version: go through plain iterators, not its types.
    let wines = linfa_datasets::winequality();
    let x: Vec<f64> = wines.records.iter().copied().collect();
    let y: Vec<f64> = wines.targets.iter().map(|&q| q as f64).collect();
    let rows = y.len();
    ensure!(
        rows > 10 && x.len() == rows * FEATURES,
        "the wine-quality data has {} values for {rows} rows; expected {FEATURES} features a row",
        x.len()
    );
    let order = permutation(rows, seed);
    let held_out = (rows as f64 * VALIDATION_FRACTION).round() as usize;
    let (validation_rows, train_rows) = order.split_at(held_out);

    let mut mean = [0.0f64; FEATURES];
    let mut deviation = [0.0f64; FEATURES];
    for &i in train_rows {
        for (j, m) in mean.iter_mut().enumerate() {
            *m += x[i * FEATURES + j];
        }
    }
    mean.iter_mut().for_each(|m| *m /= train_rows.len() as f64);
    for &i in train_rows {
        for (j, d) in deviation.iter_mut().enumerate() {
            *d += (x[i * FEATURES + j] - mean[j]).powi(2);
        }
    }
    deviation
        .iter_mut()
        .for_each(|d| *d = (*d / train_rows.len() as f64).sqrt().max(1e-12));
    let split = |picked: &[usize]| Split {
        x: picked
            .iter()
            .flat_map(|&i| (0..FEATURES).map(move |j| (i, j)))
            .map(|(i, j)| ((x[i * FEATURES + j] - mean[j]) / deviation[j]) as f32)
            .collect(),
        y: picked.iter().map(|&i| y[i] as f32).collect(),
    };
    Ok(WineData {
        train: split(train_rows),
        validation: split(validation_rows),
    })
}

/// SplitMix64: a small seeded generator, the same on every platform.
struct SplitMix(u64);

impl SplitMix {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [−1, 1).
    fn symmetric(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// A seeded Fisher–Yates permutation of `0..n`.
fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut rng = SplitMix(seed);
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}

/// The model's parameters on the host: `w1` is `FEATURES × hidden` (row-major), `b1` and `w2`
/// have `hidden` entries, `b2` one.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Params {
    /// Input → hidden weights.
    pub(crate) w1: Array2<f32>,
    /// Hidden biases.
    pub(crate) b1: Array1<f32>,
    /// Hidden → output weights.
    pub(crate) w2: Array1<f32>,
    /// Output bias.
    pub(crate) b2: f32,
}

impl Params {
    /// Glorot-uniform weights (suited to tanh), zero hidden biases, and the output bias at the
    /// mean score, so the first predictions are centred on it rather than on 0.
    pub(crate) fn init(hidden: usize, mean_score: f32, seed: u64) -> Self {
        // A stream of its own, apart from the split's, which uses `seed` as it is.
        let mut rng = SplitMix(seed ^ 0xA5A5_A5A5_A5A5_A5A5);
        let limit1 = (6.0 / (FEATURES + hidden) as f32).sqrt();
        let limit2 = (6.0 / (hidden + 1) as f32).sqrt();
        Params {
            w1: Array2::from_shape_simple_fn((FEATURES, hidden), || limit1 * rng.symmetric()),
            b1: Array1::zeros(hidden),
            w2: Array1::from_shape_simple_fn(hidden, || limit2 * rng.symmetric()),
            b2: mean_score,
        }
    }

    /// Every parameter in one list (w1, b1, w2, b2), for comparing runs.
    pub(crate) fn flat(&self) -> Vec<f32> {
        let mut all: Vec<f32> = self.w1.iter().copied().collect();
        all.extend(self.b1.iter());
        all.extend(self.w2.iter());
        all.push(self.b2);
        all
    }

    /// The parameters as tensors on `device`, in the order of [`Params::from_tensors`].
    fn to_tensors(&self, device: &str) -> Vec<Tensor> {
        vec![
            Tensor::from_array(device, self.w1.clone()),
            Tensor::from_array(device, self.b1.clone()),
            Tensor::from_array(device, self.w2.clone()),
            Tensor::from_array(device, Array1::from_elem(1, self.b2)),
        ]
    }

    /// The parameters back from `[w1, b1, w2, b2]` tensors.
    fn from_tensors(tensors: &[Tensor]) -> Result<Self, StrategyError> {
        let [w1, b1, w2, b2] = tensors else {
            return Err(StrategyError::InvalidArgument(format!(
                "the model has 4 parameter tensors, got {}",
                tensors.len()
            )));
        };
        Ok(Params {
            w1: view2(w1)?.to_owned(),
            b1: view1(b1)?.to_owned(),
            w2: view1(w2)?.to_owned(),
            b2: view1(b2)?[0],
        })
    }

    /// The predicted scores of `x` (rows × `FEATURES`), with the hidden activations.
    fn forward(&self, x: ArrayView2<f32>) -> (Array2<f32>, Array1<f32>) {
        let hidden = (x.dot(&self.w1) + &self.b1).mapv(f32::tanh);
        let predicted = hidden.dot(&self.w2) + self.b2;
        (hidden, predicted)
    }

    /// The sums over the rows of `x` of the gradients of the squared error, `[w1, b1, w2, b2]`,
    /// and the sum of squared errors. Sums, not means, so that replicas with different numbers
    /// of rows add up to the global batch's gradient.
    ///
    /// Everything per row is f32; the sums over rows are f64. The sum over a batch must not
    /// depend on how the batch was cut across replicas, and f32 sums of 64 + 64 rows and of 128
    /// rows differ in their last bits, which thousands of momentum steps amplified past 1e-5
    /// (3e-5 after 6000 steps on 2 replicas). In f64 they agree to ~1e-16 and round alike.
    fn gradient_sums(&self, x: ArrayView2<f32>, y: ArrayView1<f32>) -> (Gradients, f64) {
        let (hidden, predicted) = self.forward(x);
        let error = predicted - y;
        // d(err²)/d(prediction) = 2·err; backprop through the output layer, then through tanh
        // (d tanh(z)/dz = 1 − tanh²).
        let d_out = &error * 2.0;
        let d_hidden =
            d_out.view().insert_axis(Axis(1)).to_owned() * &self.w2 * hidden.mapv(|h| 1.0 - h * h);
        let wide2 = |a: ArrayView2<f32>| a.mapv(f64::from);
        let wide1 = |a: &Array1<f32>| a.mapv(f64::from);
        let (d_out, d_hidden, error) = (wide1(&d_out), wide2(d_hidden.view()), wide1(&error));
        (
            Gradients {
                w1: wide2(x).t().dot(&d_hidden),
                b1: d_hidden.sum_axis(Axis(0)),
                w2: wide2(hidden.view()).t().dot(&d_out),
                b2: d_out.sum(),
            },
            error.dot(&error),
        )
    }
}

/// Gradient sums of the four parameters.
struct Gradients {
    w1: Array2<f64>,
    b1: Array1<f64>,
    w2: Array1<f64>,
    b2: f64,
}

fn shape_error(e: ndarray::ShapeError) -> StrategyError {
    StrategyError::InvalidArgument(e.to_string())
}

fn view1(t: &Tensor) -> Result<ArrayView1<'_, f32>, StrategyError> {
    t.array::<f32>()?
        .view()
        .into_dimensionality::<Ix1>()
        .map_err(shape_error)
}

fn view2(t: &Tensor) -> Result<ArrayView2<'_, f32>, StrategyError> {
    t.array::<f32>()?
        .view()
        .into_dimensionality::<Ix2>()
        .map_err(shape_error)
}

/// Regression metrics of a model on some rows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Metrics {
    /// Mean squared error.
    pub(crate) mse: f32,
    /// Mean absolute error.
    pub(crate) mae: f32,
    /// Share of wines whose predicted score rounds to the true one (|error| < 0.5).
    pub(crate) within_half: f32,
}

/// The metrics of `params` on `split`.
pub(crate) fn evaluate(params: &Params, split: &Split) -> Result<Metrics> {
    let x = ArrayView2::from_shape((split.rows(), FEATURES), &split.x)?;
    let (_, predicted) = params.forward(x);
    let n = split.rows() as f32;
    let errors = predicted - ArrayView1::from(&split.y);
    Ok(Metrics {
        mse: errors.dot(&errors) / n,
        mae: errors.mapv(f32::abs).sum() / n,
        within_half: errors.iter().filter(|e| e.abs() < 0.5).count() as f32 / n,
    })
}

/// Mean time per step spent in each phase, over all steps.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct StepTimes {
    /// Waiting for the next per-replica batch from the input pipeline.
    pub(crate) input: Duration,
    /// Reading the variables, forward and backward pass (mean over replicas).
    pub(crate) compute: Duration,
    /// The fused all-reduce of the gradient sums (mean over replicas), including the wait for
    /// the slowest replica.
    pub(crate) all_reduce: Duration,
    /// The optimizer's `merge_call` (mean over replicas): the rendezvous, and replica 0 applying
    /// the momentum update to every copy while the others wait.
    pub(crate) merge_call: Duration,
    /// The rest of `strategy.run`: handing the step to the replica threads and collecting
    /// their results.
    pub(crate) dispatch: Duration,
}

impl StepTimes {
    fn total(&self) -> Duration {
        self.input + self.compute + self.communication() + self.dispatch
    }

    /// Time spent with the other replicas: the all-reduce and the merge_call.
    fn communication(&self) -> Duration {
        self.all_reduce + self.merge_call
    }
}

/// What a training run ends with.
#[derive(Debug, Clone)]
pub(crate) struct Trained {
    /// The final parameters (replica 0's copy of the mirrored variables).
    pub(crate) params: Params,
    /// The largest difference between replica 0's copy of the parameters and another
    /// replica's: 0 when every copy received the same updates.
    pub(crate) copy_difference: f32,
    /// The mean squared error of each step's global batch, before its update.
    pub(crate) losses: Vec<f32>,
    /// `(step, validation MSE)` before training, every `eval_every` steps and after the last.
    pub(crate) validation: Vec<(usize, f32)>,
    /// Time per step, by phase.
    pub(crate) times: StepTimes,
    /// Steps per second of the training loop (validation excluded).
    pub(crate) steps_per_s: f64,
    /// The cross-device ops the strategy chose.
    pub(crate) cross_device_ops: String,
}

/// One replica's input for a step: its rows of features and scores.
type Rows = (Tensor, Tensor);

/// The training rows as one `PerReplica<(x, y)>` per step: shuffled (seeded, a new order each
/// epoch), global batches of `config.global_batch` rows, replica `r` getting the `r`-th
/// contiguous chunk of each.
pub(crate) fn input_pipeline(
    config: &Config,
    train: &Split,
    host: &str,
) -> Result<DistributedDataset<Rows>> {
    let dataset = training_batches(config, train, host)?;
    // KeepUneven: a global batch that does not divide by the replica count gives the last
    // replicas a row fewer (or an empty batch), never a hang; gradients are sums over rows, so
    // the step's result does not depend on how the batch was cut.
    let options = InputOptions {
        partial_batch: PartialBatch::KeepUneven,
        ..InputOptions::default()
    };
    let workers = InputWorkers::local(&config.devices)?;
    Ok(DistributedDataset::new(dataset, &workers, options)?)
}

/// The training rows on `host` as global batches: shuffled (seeded, a new order each epoch),
/// `config.global_batch` rows each, enough of them for `config.steps` steps. Both strategies
/// cut these same batches into per-replica chunks.
fn training_batches(config: &Config, train: &Split, host: &str) -> Result<Dataset<Rows>> {
    // Enough epochs for every step to have a full global batch; repeat before shuffle gives
    // each epoch its own order.
    let epochs = (config.steps * config.global_batch).div_ceil(train.rows());
    Ok(Dataset::from_tensors((
        Tensor::from_vec(host, &[train.rows(), FEATURES], train.x.clone())?,
        Tensor::from_vec(host, &[train.rows()], train.y.clone())?,
    ))?
    .repeat(epochs)?
    .shuffle(config.seed, false)?
    .batch(config.global_batch, false)?)
}

/// Trains the MLP on `data.train` with `MirroredStrategy` over `config.devices`.
pub(crate) fn train(config: &Config, data: &WineData) -> Result<Trained> {
    ensure!(
        config.steps > 0 && config.global_batch > 0 && config.hidden > 0 && config.eval_every > 0,
        "steps, batch, hidden units and the validation interval must be positive"
    );
    let strategy = MirroredStrategy::new(&config.devices)?;
    let host = strategy.extended().host_device().to_owned();
    let mean_score = data.train.y.iter().sum::<f32>() / data.train.rows() as f32;
    let init = Params::init(config.hidden, mean_score, config.seed);
    let names = ["dense/kernel", "dense/bias", "output/kernel", "output/bias"];
    let mut weights = Vec::new();
    let mut velocities = Vec::new();
    for (name, value) in names.iter().zip(init.to_tensors(&host)) {
        let zeros = Tensor::zeros(&host, DType::F32, value.shape());
        weights.push(strategy.create_variable(name, value, VariableOptions::default())?);
        velocities.push(strategy.create_variable(
            &format!("{name}/momentum"),
            zeros,
            VariableOptions {
                trainable: Some(false),
                ..VariableOptions::default()
            },
        )?);
    }

    let distributed = input_pipeline(config, &data.train, &host)?;

    let (learning_rate, momentum, global_batch) =
        (config.learning_rate, config.momentum, config.global_batch);
    let step_fn = |ctx: &ReplicaContext<'_>, (x, y): Rows| -> Result<_, StrategyError> {
        let started = Instant::now();
        let device = ctx.devices()[0].clone();
        let current = weights
            .iter()
            .map(|w| ctx.read_variable(w))
            .collect::<Result<Vec<Tensor>, _>>()?;
        let params = Params::from_tensors(&current)?;
        let (grads, squared_error) = params.gradient_sums(view2(&x)?, view1(&y)?);
        let sums = (
            vec![
                Tensor::from_array(&device, grads.w1),
                Tensor::from_array(&device, grads.b1),
                Tensor::from_array(&device, grads.w2),
                Tensor::from_vec(&device, &[1], vec![grads.b2])?,
            ],
            Tensor::from_vec(&device, &[2], vec![squared_error, y.shape()[0] as f64])?,
        );
        let computed = Instant::now();
        let (grad_sums, totals) = ctx.all_reduce(ReduceOp::Sum, &sums)?;
        let reduced = Instant::now();
        let totals = totals.to_vec::<f64>()?;
        let (squared_error, rows) = (totals[0], totals[1]);
        // Every step has a full global batch (see `input_pipeline`); replicas that together saw
        // another number of rows were fed wrongly, whatever the gradients look like.
        if rows != global_batch as f64 {
            return Err(StrategyError::InvalidArgument(format!(
                "the replicas' batches add up to {rows} rows, not the global batch of \
                 {global_batch}"
            )));
        }
        // The gradient of the global batch's mean squared error (TF's
        // `compute_average_loss(..., global_batch_size)`).
        let grads = grad_sums
            .iter()
            .map(|g| {
                let mean = g.array::<f64>()?.mapv(|v| (v / rows) as f32);
                Ok(Tensor::from_shared(&device, mean.into_shared()))
            })
            .collect::<Result<Vec<Tensor>, StrategyError>>()?;
        ctx.merge_call::<Vec<Tensor>, (), _>(grads, |cross, grads: Vec<Leaf<Tensor>>| {
            // SGD with momentum on every copy: v ← μ·v + g, then w ← w − lr·v, each device's
            // copy with that device's all-reduced gradient.
            for ((weight, velocity), grad) in weights.iter().zip(&velocities).zip(&grads) {
                cross.update_with(velocity, |at, v| {
                    let v_device = v.device();
                    let g = replica_value(grad, at.replica())?.array::<f32>()?;
                    let v = v.array::<f32>()?.mapv(|v| v * momentum) + g;
                    Ok(Tensor::from_shared(v_device, v.into_shared()))
                })?;
                cross.update_with(weight, |at, w| {
                    let v = velocity.component(at.replica())?.read();
                    let step = v.array::<f32>()?.mapv(|v| v * learning_rate);
                    let new = w.array::<f32>()? - &step;
                    Ok(Tensor::from_shared(w.device(), new.into_shared()))
                })?;
            }
            Ok(())
        })?;
        let done = Instant::now();
        Ok((
            (squared_error / rows) as f32,
            (computed - started).as_secs_f64(),
            (reduced - computed).as_secs_f64(),
            (done - reduced).as_secs_f64(),
        ))
    };

    let bar = progress_bar(config);
    let mut losses = Vec::with_capacity(config.steps);
    let mut validation = vec![(0, evaluate(&init, &data.validation)?.mse)];
    let mut times = StepTimes::default();
    let mut steps = distributed.iter();
    for step in 0..config.steps {
        let waiting = Instant::now();
        let batch = steps
            .next()
            .ok_or_else(|| anyhow!("the input ended after {step} steps"))??;
        let batch = per_replica_rows(batch)?;
        let running = Instant::now();
        let (loss, compute, all_reduce, merge_call) = strategy.run(step_fn, &batch)?;
        let ran = Instant::now();
        let compute = mean_seconds(&compute);
        let (all_reduce, merge_call) = (mean_seconds(&all_reduce), mean_seconds(&merge_call));
        times.input += running - waiting;
        times.compute += compute;
        times.all_reduce += all_reduce;
        times.merge_call += merge_call;
        times.dispatch += (ran - running).saturating_sub(compute + all_reduce + merge_call);
        let loss = *loss.local_results()[0];
        losses.push(loss);

        if (step + 1) % config.eval_every == 0 || step + 1 == config.steps {
            let params = read_params(&strategy, &weights)?;
            validation.push((step + 1, evaluate(&params, &data.validation)?.mse));
        }
        if step % 20 == 0 || step + 1 == config.steps {
            let seconds = times.total().as_secs_f64();
            bar.set_position(step as u64 + 1);
            bar.set_message(format!(
                "loss {loss:.4} · {:.0} samples/s",
                (step + 1) as f64 * config.global_batch as f64 / seconds
            ));
        }
    }
    bar.finish_and_clear();
    let params = read_params(&strategy, &weights)?;
    let mut copy_difference = 0.0f32;
    for r in 1..config.devices.len() {
        let copy = weights
            .iter()
            .map(|w| Ok(w.component(r)?.read()))
            .collect::<Result<Vec<Tensor>, StrategyError>>()?;
        let difference = max_weight_difference(&params, &Params::from_tensors(&copy)?);
        if difference > copy_difference || difference.is_nan() {
            copy_difference = difference;
        }
    }
    let per_step = |d: Duration| d / config.steps as u32;
    let total = times.total();
    Ok(Trained {
        params,
        copy_difference,
        losses,
        validation,
        times: StepTimes {
            input: per_step(times.input),
            compute: per_step(times.compute),
            all_reduce: per_step(times.all_reduce),
            merge_call: per_step(times.merge_call),
            dispatch: per_step(times.dispatch),
        },
        steps_per_s: config.steps as f64 / total.as_secs_f64(),
        cross_device_ops: strategy
            .cross_replica()
            .cross_device_ops()
            .name()
            .to_owned(),
    })
}

/// Replica `r`'s value of a merge argument (every replica's, when they were all equal).
fn replica_value(value: &Leaf<Tensor>, r: usize) -> Result<&Tensor, StrategyError> {
    let values = value.local_results();
    let index = if values.len() == 1 { 0 } else { r };
    values.get(index).copied().ok_or_else(|| {
        StrategyError::Invariant(format!("no value for replica {r} in a merge argument"))
    })
}

/// One step of the distributed dataset, `PerReplica<(x, y)>`, as the `(x, y)` of per-replica
/// tensors that `run` takes.
fn per_replica_rows(batch: PerReplica<Rows>) -> Result<(Leaf<Tensor>, Leaf<Tensor>)> {
    let (rows, devices) = batch.into_parts();
    let (x, y): (Vec<Tensor>, Vec<Tensor>) = rows.into_iter().unzip();
    Ok((
        Leaf::PerReplica(PerReplica::new(Arc::clone(&devices), x)?),
        Leaf::PerReplica(PerReplica::new(devices, y)?),
    ))
}

/// The mean over replicas of per-replica durations in seconds.
fn mean_seconds(per_replica: &Leaf<f64>) -> Duration {
    let values = per_replica.local_results();
    Duration::from_secs_f64(values.iter().copied().sum::<f64>() / values.len() as f64)
}

/// The mirrored weights as the cross-replica context reads them.
fn read_params(
    strategy: &MirroredStrategy,
    weights: &[DistributedVariable<Tensor>],
) -> Result<Params> {
    let cross = strategy.cross_replica();
    let tensors = weights
        .iter()
        .map(|w| cross.read_var(w))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Params::from_tensors(&tensors)?)
}

/// Mean time per step of a TPU run, over all steps.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct TpuStepTimes {
    /// Waiting for the next per-replica batch: the input pipeline, padding to the compiled
    /// shape, and the copy into device buffers.
    pub(crate) input: Duration,
    /// Launching the compiled step on every replica and waiting for its loss. Forward,
    /// backward, the gradient all-reduce and the momentum update all run inside the one
    /// program, so they cannot be timed apart from the host.
    pub(crate) step: Duration,
}

impl TpuStepTimes {
    fn total(&self) -> Duration {
        self.input + self.step
    }
}

/// What a TPU training run ends with.
#[derive(Debug, Clone)]
pub(crate) struct TpuTrained {
    /// The final parameters (replica 0's device copy).
    pub(crate) params: Params,
    /// The largest difference between replica 0's device copy of the parameters and another
    /// replica's: 0 when the in-program all-reduce gave every replica the same update.
    pub(crate) copy_difference: f32,
    /// The mean squared error of each step's global batch, before its update.
    pub(crate) losses: Vec<f32>,
    /// `(step, validation MSE)` before training, every `eval_every` steps and after the last.
    pub(crate) validation: Vec<(usize, f32)>,
    /// Time per step, by phase.
    pub(crate) times: TpuStepTimes,
    /// Tracing and compiling the step (and one run of it, to wait for), before the timed steps.
    pub(crate) compile: Duration,
    /// Steps per second of the training loop (compilation and validation excluded).
    pub(crate) steps_per_s: f64,
    /// The PJRT platform the replicas run on (`cpu` for the pinned plugin).
    pub(crate) platform: String,
    /// The replicas' device names.
    pub(crate) devices: Vec<String>,
}

/// The model's variables in the order the compiled step takes and returns them: the four
/// parameters, then their four momentum slots.
const VARIABLES: usize = 8;

/// A `TpuStrategy` with one replica per device of the PJRT plugin (`cargo xtask fetch-pjrt`
/// installs the pinned CPU plugin; `PJRT_PLUGIN` names another).
fn tpu_strategy(replicas: usize) -> Result<TpuStrategy> {
    // The plugin's own error already says how to install it; the context says who needed it.
    TpuStrategy::new(TpuConfig::cpu(replicas)).with_context(|| {
        format!("--strategy tpu: could not start TpuStrategy on {replicas} PJRT CPU devices")
    })
}

/// One training step of the MLP as a replicated XLA program: the arithmetic of
/// [`Params::gradient_sums`] and the mirrored `merge_call`, written with symbolic values.
///
/// The dot products of the forward pass and tanh are computed in f64 and rounded to f32, where
/// the mirrored replicas compute them in f32: XLA generates f32 dot and tanh code per shape,
/// and in f32 the per-replica program of 43 rows and the 1-replica program of 128 rounded some
/// rows differently (weights 1.4e-5 apart after 6000 steps at lr 0.02 on 3 replicas, past the
/// 1e-5 limit). A product of two f32 values is exact in f64, and a sum of 11 or 32 of them, in
/// any order, is within a few f64 ulps of the exact sum, so it rounds to the same f32 unless
/// the exact sum is that close to a rounding boundary: the runs above now come out
/// bit-identical.
///
/// Takes `[w1, b1, w2, b2, v_w1, v_b1, v_w2, v_b2, x, y, mask]` and returns the 8 new variables
/// followed by the global batch's squared-error sum and row count (f64 scalars, the same on
/// every replica).
fn tpu_step(
    b: &mut StepBuilder<'_>,
    args: &[Value],
    learning_rate: f32,
    momentum: f32,
) -> Result<Vec<Value>, TpuError> {
    let [w1, b1, w2, b2, v_w1, v_b1, v_w2, v_b2, x, y, mask] = args else {
        return Err(TpuError::InvalidArgument(format!(
            "the MLP step takes {VARIABLES} variables then x, y and the mask; got {} inputs",
            args.len()
        )));
    };
    let rows = x.ty().dims[0];
    let units = w1.ty().dims[1];
    let over_rows = DotDims {
        lhs_contracting: vec![0],
        rhs_contracting: vec![0],
        ..DotDims::default()
    };

    // Forward and backward per row with f32 values, as the mirrored replicas compute them;
    // only the dot products and tanh are computed in f64 and rounded once to f32 (see
    // `wide_matmul`).
    let z = wide_matmul(b, x, w1)?;
    let bias = b.broadcast_in_dim(b1, &[rows, units], &[1])?;
    let z = b.add(&z, &bias)?;
    let z = b.convert(&z, ElementType::F64);
    let hidden = b.unary(UnaryOp::Tanh, &z);
    let hidden = b.convert(&hidden, ElementType::F32);
    let predicted = wide_matmul(b, &hidden, w2)?;
    let bias = b.broadcast_in_dim(b2, &[rows], &[0])?;
    let predicted = b.add(&predicted, &bias)?;
    let error = b.subtract(&predicted, y)?;
    // Padding rows (a global batch that does not divide by the replicas) get zero error, so
    // they add nothing to the loss or the gradients; real rows are multiplied by exactly 1.
    let error = b.multiply(&error, mask)?;
    let two = b.splat(2.0f32, &[rows]);
    let d_out = b.multiply(&error, &two)?;
    let d_out_wide = b.broadcast_in_dim(&d_out, &[rows, units], &[0])?;
    let w2_wide = b.broadcast_in_dim(w2, &[rows, units], &[1])?;
    let d_hidden = b.multiply(&d_out_wide, &w2_wide)?;
    let squared = b.multiply(&hidden, &hidden)?;
    let one = b.splat(1.0f32, &[rows, units]);
    let d_tanh = b.subtract(&one, &squared)?;
    let d_hidden = b.multiply(&d_hidden, &d_tanh)?;

    // Sums over rows and across replicas in f64, as the mirrored path does: the sum over a
    // global batch then rounds to the same f32 however the batch was cut across replicas.
    let [x, hidden, d_hidden, d_out, error, mask] =
        [x, &hidden, &d_hidden, &d_out, &error, mask].map(|v| b.convert(v, ElementType::F64));
    let zero = b.scalar(0.0f64);
    let g_w1 = b.dot_general(&x, &d_hidden, &over_rows)?;
    let g_b1 = b.reduce(&d_hidden, &zero, &[0], Reduction::Sum)?;
    let g_w2 = b.dot_general(&hidden, &d_out, &over_rows)?;
    let g_b2 = b.reduce(&d_out, &zero, &[0], Reduction::Sum)?;
    let g_b2 = b.reshape(&g_b2, &[1])?;
    let squared_error = b.dot_general(&error, &error, &over_rows)?;
    let real_rows = b.reduce(&mask, &zero, &[0], Reduction::Sum)?;
    let squared_error = b.all_reduce(ReduceOp::Sum, &squared_error)?;
    let total_rows = b.all_reduce(ReduceOp::Sum, &real_rows)?;

    // SGD with momentum on the mean gradient of the global batch: v ← μ·v + g, w ← w − lr·v,
    // in the mirrored update's order of operations.
    let mut velocities = Vec::with_capacity(4);
    for (sum, velocity) in [g_w1, g_b1, g_w2, g_b2]
        .iter()
        .zip([v_w1, v_b1, v_w2, v_b2])
    {
        let sum = b.all_reduce(ReduceOp::Sum, sum)?;
        let dims = sum.ty().dims.clone();
        let rows = b.broadcast_in_dim(&total_rows, &dims, &[])?;
        let mean = b.divide(&sum, &rows)?;
        let gradient = b.convert(&mean, ElementType::F32);
        let mu = b.splat(momentum, &dims);
        let decayed = b.multiply(velocity, &mu)?;
        velocities.push(b.add(&decayed, &gradient)?);
    }
    let mut outputs = Vec::with_capacity(VARIABLES + 2);
    for (weight, velocity) in [w1, b1, w2, b2].into_iter().zip(&velocities) {
        let lr = b.splat(learning_rate, &velocity.ty().dims);
        let step = b.multiply(velocity, &lr)?;
        outputs.push(b.subtract(weight, &step)?);
    }
    outputs.extend(velocities);
    outputs.push(squared_error);
    outputs.push(total_rows);
    Ok(outputs)
}

/// `lhs · rhs` of f32 values with the products and their sum in f64, rounded once to f32.
fn wide_matmul(b: &mut StepBuilder<'_>, lhs: &Value, rhs: &Value) -> Result<Value, TpuError> {
    let lhs = b.convert(lhs, ElementType::F64);
    let rhs = b.convert(rhs, ElementType::F64);
    let product = b.matmul(&lhs, &rhs)?;
    Ok(b.convert(&product, ElementType::F32))
}

/// Trains the MLP on `data.train` with `TpuStrategy`, one replica per PJRT device
/// (`config.devices.len()` of them), from the same global batches, initial weights and
/// hyperparameters as [`train`].
pub(crate) fn train_tpu(config: &Config, data: &WineData) -> Result<TpuTrained> {
    ensure!(
        config.steps > 0 && config.global_batch > 0 && config.hidden > 0 && config.eval_every > 0,
        "steps, batch, hidden units and the validation interval must be positive"
    );
    let strategy = tpu_strategy(config.devices.len())?;
    let host = strategy.extended().host_device().to_owned();
    let mean_score = data.train.y.iter().sum::<f32>() / data.train.rows() as f32;
    let init = Params::init(config.hidden, mean_score, config.seed);
    let names = ["dense/kernel", "dense/bias", "output/kernel", "output/bias"];
    let mut weights = Vec::with_capacity(4);
    let mut slots = Vec::with_capacity(4);
    // The host tensors are the initial values; each is copied to every replica's device.
    for (name, value) in names.iter().zip(init.to_tensors(&host)) {
        let zeros = Tensor::zeros(&host, DType::F32, value.shape());
        weights.push(
            strategy.create_device_variable(name, VariableOptions::default(), |_| Ok(value))?,
        );
        slots.push(strategy.create_device_variable(
            &format!("{name}/momentum"),
            VariableOptions {
                trainable: Some(false),
                ..VariableOptions::default()
            },
            |_| Ok(zeros),
        )?);
    }
    let variables: Vec<TpuVariable> = weights.into_iter().chain(slots).collect();
    let variable_refs: Vec<&TpuVariable> = variables.iter().collect();

    // The same global batches, cut the same way; TpuStrategy turns KeepUneven into
    // PadWithMask, so a batch that does not divide by the replicas keeps the compiled shape.
    let distributed = strategy.distribute_dataset(
        training_batches(config, &data.train, &host)?,
        InputOptions {
            partial_batch: PartialBatch::KeepUneven,
            ..InputOptions::default()
        },
    )?;
    // Two steps' batches in device buffers ahead of the step that uses them.
    let mut batches = strategy.device_batches(distributed.iter_masked(), 2);
    let mut next_batch = |step: usize| -> Result<(Vec<DeviceValue>, Duration)> {
        let waiting = Instant::now();
        let batch = batches
            .next()
            .ok_or_else(|| anyhow!("the input ended after {step} steps"))??;
        ensure!(
            batch.len() == 3,
            "a step's input has {} parts; expected x, y and the mask",
            batch.len()
        );
        Ok((batch, waiting.elapsed()))
    };

    let (learning_rate, momentum) = (config.learning_rate, config.momentum);
    let step_fn = strategy.function(move |b, args| tpu_step(b, args, learning_rate, momentum));

    // Trace and compile before the timed steps: `run` with the variables' current buffers has
    // the signature `run_updating` will use, so the program lands in the function's cache.
    // Its outputs are dropped, so the variables do not change.
    let mut pending = Some(next_batch(0)?);
    let compiling = Instant::now();
    {
        let (first, _) = pending.as_ref().expect("just set");
        let current: Vec<_> = variables.iter().map(TpuVariable::device_value).collect();
        let mut inputs: Vec<StepInput<'_>> = current.iter().map(|v| StepInput::Device(v)).collect();
        inputs.extend(first.iter().map(StepInput::Device));
        let outputs = step_fn.run(&inputs)?;
        outputs[VARIABLES].replica(0)?;
    }
    let compile = compiling.elapsed();

    let bar = progress_bar(config);
    let mut losses = Vec::with_capacity(config.steps);
    let mut validation = vec![(0, evaluate(&init, &data.validation)?.mse)];
    let mut times = TpuStepTimes::default();
    for step in 0..config.steps {
        let (batch, input) = match pending.take() {
            Some(first) => first,
            None => next_batch(step)?,
        };
        let launching = Instant::now();
        let totals = step_fn.run_updating(
            &variable_refs,
            &[
                StepInput::Device(&batch[0]),
                StepInput::Device(&batch[1]),
                StepInput::Device(&batch[2]),
            ],
        )?;
        // Reading the loss waits for the step: the launch returns before the devices finish.
        let read = |i: usize| -> Result<f64> { Ok(totals[i].replica(0)?.to_vec::<f64>()?[0]) };
        let (squared_error, rows) = (read(0)?, read(1)?);
        times.step += launching.elapsed();
        times.input += input;
        // As in the mirrored step: replicas that together saw another number of real rows were
        // fed wrongly (a mask that lost or invented rows), whatever the weights look like.
        ensure!(
            rows == config.global_batch as f64,
            "step {step}: the replicas' real rows add up to {rows}, not the global batch of {}",
            config.global_batch
        );
        let loss = (squared_error / rows) as f32;
        losses.push(loss);

        if (step + 1) % config.eval_every == 0 || step + 1 == config.steps {
            let params = tpu_params(&variables, 0)?;
            validation.push((step + 1, evaluate(&params, &data.validation)?.mse));
        }
        if step % 20 == 0 || step + 1 == config.steps {
            let seconds = times.total().as_secs_f64();
            bar.set_position(step as u64 + 1);
            bar.set_message(format!(
                "loss {loss:.4} · {:.0} samples/s",
                (step + 1) as f64 * config.global_batch as f64 / seconds
            ));
        }
    }
    bar.finish_and_clear();
    let params = tpu_params(&variables, 0)?;
    let mut copy_difference = 0.0f32;
    for r in 1..config.devices.len() {
        let difference = max_weight_difference(&params, &tpu_params(&variables, r)?);
        if difference > copy_difference || difference.is_nan() {
            copy_difference = difference;
        }
    }
    let per_step = |d: Duration| d / config.steps as u32;
    let total = times.total();
    Ok(TpuTrained {
        params,
        copy_difference,
        losses,
        validation,
        times: TpuStepTimes {
            input: per_step(times.input),
            step: per_step(times.step),
        },
        compile,
        steps_per_s: config.steps as f64 / total.as_secs_f64(),
        platform: strategy.client().platform_name()?,
        devices: strategy.worker_devices(),
    })
}

/// Replica `r`'s device copy of the parameters (the first 4 variables), on the host.
fn tpu_params(variables: &[TpuVariable], r: usize) -> Result<Params> {
    let tensors = variables[..4]
        .iter()
        .map(|v| v.read_replica(r))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Params::from_tensors(&tensors)?)
}

fn progress_bar(config: &Config) -> ProgressBar {
    if !config.progress {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(config.steps as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix} [{elapsed_precise}] {bar:32.cyan/blue} {pos}/{len} steps · {msg}",
        )
        .expect("the template is valid")
        .progress_chars("=> "),
    );
    bar.set_prefix(match config.devices.len() {
        1 => "1 replica".to_owned(),
        n => format!("{n} replicas"),
    });
    bar
}

/// The largest absolute difference between two runs' parameters; NaN if either has a NaN, so
/// that a diverged run never passes for an equal one (`f32::max` would skip the NaNs).
pub(crate) fn max_weight_difference(a: &Params, b: &Params) -> f32 {
    a.flat()
        .iter()
        .zip(b.flat())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, |max, d| if d > max || d.is_nan() { d } else { max })
}

/// Draws the training loss (each step's batch, and its mean over 50 steps) and the validation
/// loss against the step, as a PNG.
pub(crate) fn plot_losses(
    path: &Path,
    losses: &[f32],
    validation: &[(usize, f32)],
    title: &str,
) -> Result<()> {
    use plotters::prelude::*;
    use plotters::style::{FontStyle, register_font};

    // plotters' ab_glyph text needs a registered font: the one embedded in the binary, so
    // nothing has to be installed on the machine.
    register_font(
        "sans-serif",
        FontStyle::Normal,
        epaint_default_fonts::UBUNTU_LIGHT,
    )
    .map_err(|_| anyhow!("the embedded font is not a valid TrueType font"))?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    const WINDOW: usize = 50;
    let smoothed: Vec<(usize, f32)> = (WINDOW..=losses.len())
        .map(|end| {
            let window = &losses[end - WINDOW..end];
            (end, window.iter().sum::<f32>() / WINDOW as f32)
        })
        .collect();
    let top = losses
        .iter()
        .chain(validation.iter().map(|(_, l)| l))
        .copied()
        .fold(0.0f32, f32::max)
        * 1.05;

    let root = BitMapBackend::new(path, (800, 450)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0..losses.len(), 0f32..top)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("mean squared error")
        .label_style(("sans-serif", 14))
        .light_line_style(WHITE)
        .draw()?;
    let light = RGBColor(170, 190, 225);
    chart
        .draw_series(LineSeries::new(
            losses.iter().enumerate().map(|(i, l)| (i + 1, *l)),
            light,
        ))?
        .label("training batch")
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], light));
    chart
        .draw_series(LineSeries::new(smoothed, BLUE.stroke_width(2)))?
        .label(format!("training, mean of {WINDOW} steps"))
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLUE.stroke_width(2)));
    chart
        .draw_series(LineSeries::new(
            validation.iter().copied(),
            RED.stroke_width(2),
        ))?
        .label("validation")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], RED.stroke_width(2)));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font(("sans-serif", 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Which strategy `--strategy` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StrategyKind {
    /// `MirroredStrategy`: one thread per device.
    Mirrored,
    /// `TpuStrategy`: one XLA program over PJRT devices.
    Tpu,
}

/// The command line, parsed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Args {
    /// The training to run.
    pub(crate) config: Config,
    /// The strategy asked for.
    pub(crate) strategy: StrategyKind,
    /// Where the loss curve goes; `None`: `target/demo/loss.png`.
    pub(crate) plot: Option<PathBuf>,
}

const USAGE: &str = "\
usage: cargo xtask demo [options]
  --replicas N          replicas on /cpu:0 … /cpu:N-1, or on N PJRT devices with
                        --strategy tpu (default 2)
  --devices LIST        comma-separated replica devices, e.g. /cpu:0,/cpu:1 (mirrored only)
  --strategy NAME       mirrored (default), or tpu: TpuStrategy, one compiled XLA step over
                        the devices of the PJRT plugin (`cargo xtask fetch-pjrt` installs the
                        pinned CPU plugin)
  --steps N             optimizer steps (default 2000)
  --batch N             global batch, rows per step over all replicas (default 128)
  --lr X                learning rate (default 0.01)
  --momentum X          SGD momentum, 0 for plain SGD (default 0.9)
  --hidden N            hidden units (default 32)
  --seed N              seed of the split, the initial weights and the shuffle (default 7)
  --plot FILE           where the loss curve PNG goes (default target/demo/loss.png)";

/// Parses the demo's arguments; `Ok(None)` for `--help`.
pub(crate) fn parse_args(args: &[String]) -> Result<Option<Args>> {
    let mut replicas: Option<usize> = None;
    let mut devices: Option<Vec<String>> = None;
    let mut strategy = StrategyKind::Mirrored;
    let mut config = Config::new(Vec::new());
    let mut plot = None;
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        if matches!(flag.as_str(), "--help" | "-h") {
            return Ok(None);
        }
        let value = args
            .next()
            .ok_or_else(|| anyhow!("{flag} needs a value\n\n{USAGE}"))?;
        let number = |what: &str| -> Result<usize> {
            value
                .parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| anyhow!("{flag} needs a positive {what}, got '{value}'"))
        };
        let real = || -> Result<f32> {
            value
                .parse::<f32>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| anyhow!("{flag} needs a number ≥ 0, got '{value}'"))
        };
        match flag.as_str() {
            "--replicas" => replicas = Some(number("number of replicas")?),
            "--devices" => devices = Some(parse_devices(value)?),
            "--strategy" => {
                strategy = match value.as_str() {
                    "mirrored" => StrategyKind::Mirrored,
                    "tpu" => StrategyKind::Tpu,
                    other => bail!("unknown strategy '{other}'; use mirrored or tpu"),
                }
            }
            "--steps" => config.steps = number("number of steps")?,
            "--batch" => config.global_batch = number("batch size")?,
            "--lr" => config.learning_rate = real()?,
            "--momentum" => config.momentum = real()?,
            "--hidden" => config.hidden = number("number of hidden units")?,
            "--seed" => {
                config.seed = value
                    .parse()
                    .map_err(|_| anyhow!("--seed needs a whole number, got '{value}'"))?
            }
            "--plot" => plot = Some(PathBuf::from(value)),
            other => bail!("unknown argument '{other}'\n\n{USAGE}"),
        }
    }
    ensure!(
        config.momentum < 1.0,
        "--momentum must be below 1 (got {}): with 1 or more the steps never shrink",
        config.momentum
    );
    if strategy == StrategyKind::Tpu && devices.is_some() {
        bail!(
            "--strategy tpu puts one replica on each device of the PJRT plugin; choose how many \
             with --replicas N instead of --devices"
        );
    }
    config.devices = match (devices, replicas) {
        (Some(devices), Some(n)) if devices.len() != n => bail!(
            "--replicas {n} disagrees with --devices, which lists {} devices; give one of them",
            devices.len()
        ),
        (Some(devices), _) => devices,
        (None, n) => (0..n.unwrap_or(2)).map(|r| format!("/cpu:{r}")).collect(),
    };
    ensure!(
        config.global_batch >= config.devices.len(),
        "--batch {} gives some of the {} replicas no rows at all; use a batch of at least one row \
         per replica",
        config.global_batch,
        config.devices.len()
    );
    Ok(Some(Args {
        config,
        strategy,
        plot,
    }))
}

/// Checks a `--devices` list: CPU devices only, since the MLP computes in host memory and TPU
/// devices are `--strategy tpu`'s.
fn parse_devices(list: &str) -> Result<Vec<String>> {
    let devices: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(str::to_owned)
        .collect();
    ensure!(
        !devices.is_empty(),
        "--devices needs at least one device, e.g. /cpu:0,/cpu:1"
    );
    for device in &devices {
        let spec: DeviceSpec = device
            .parse()
            .with_context(|| format!("--devices: '{device}' is not a device name"))?;
        match spec.device_type().map(str::to_ascii_uppercase).as_deref() {
            Some("CPU") => {}
            Some("GPU") => bail!(
                "device '{device}': the demo's MLP computes with ndarray in host memory and has \
                 no GPU kernels, so it will not run on the CPU under a GPU's name. GPU replicas \
                 (cargo features `cuda`/`nccl`) reduce GPU tensors; see `cargo xtask test-gpu`. \
                 Use CPU devices here, e.g. --devices /cpu:0,/cpu:1"
            ),
            Some("TPU") => bail!(
                "device '{device}': TPU replicas come with --strategy tpu, one per PJRT device; \
                 use --strategy tpu --replicas N"
            ),
            other => bail!(
                "device '{device}': give a CPU device such as /cpu:0 (device type: {})",
                other.unwrap_or("none")
            ),
        }
    }
    Ok(devices)
}

/// `target/demo/<file>` next to the running binary (`target/release/examples/demo`), so
/// `CARGO_TARGET_DIR` is respected; `target/demo/` in the current directory otherwise.
fn default_plot_path(file: &str) -> PathBuf {
    let target = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.parent()?.to_path_buf()))
        .unwrap_or_else(|| PathBuf::from("target"));
    target.join("demo").join(file)
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() -> Result<()> {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let Some(args) = parse_args(&argv)? else {
        println!("{USAGE}");
        return Ok(());
    };
    let config = &args.config;
    let data = load_wine(config.seed)?;
    println!(
        "wine quality (red): {} training and {} validation wines, {FEATURES} standardized features",
        data.train.rows(),
        data.validation.rows()
    );
    println!(
        "model: {FEATURES} → {} tanh → 1, SGD lr {} momentum {}, {} steps of global batch {}",
        config.hidden, config.learning_rate, config.momentum, config.steps, config.global_batch
    );
    match args.strategy {
        StrategyKind::Mirrored => run_mirrored(&args, &data),
        StrategyKind::Tpu => run_tpu(&args, &data),
    }
}

/// `--strategy mirrored`: trains, reports, and checks against one replica.
fn run_mirrored(args: &Args, data: &WineData) -> Result<()> {
    let config = &args.config;
    let replicas = config.devices.len();
    let trained = train(config, data)?;
    println!(
        "MirroredStrategy on {replicas} replicas [{}], cross-device ops: {}",
        config.devices.join(", "),
        trained.cross_device_ops
    );
    let t = trained.times;
    let total = micros(t.total());
    let share = |d: Duration| 100.0 * micros(d) / total;
    print_speed(config, trained.steps_per_s, &trained.losses);
    println!(
        "time per step {total:.1} µs: compute {:.1} µs ({:.0} %), communication {:.1} µs ({:.0} %), \
         input {:.1} µs ({:.0} %), dispatch {:.1} µs ({:.0} %)",
        micros(t.compute),
        share(t.compute),
        micros(t.communication()),
        share(t.communication()),
        micros(t.input),
        share(t.input),
        micros(t.dispatch),
        share(t.dispatch),
    );
    println!("  compute: read variables, forward, backward (mean over replicas)");
    println!(
        "  communication: gradient all-reduce {:.1} µs + merge_call with the momentum update {:.1} µs",
        micros(t.all_reduce),
        micros(t.merge_call)
    );
    println!("  input: waiting for the next per-replica batch; dispatch: the rest of run()");
    print_metrics(config, data, &trained.params)?;
    write_plot(
        args,
        "loss.png",
        &trained.losses,
        &trained.validation,
        &format!(
            "wine quality MLP, {replicas} replicas, global batch {}",
            config.global_batch
        ),
    )?;

    println!(
        "mirrored copies on the {replicas} replicas: max |difference| = {:.1e}",
        trained.copy_difference
    );
    ensure!(
        trained.copy_difference <= TOLERANCE,
        "the replicas' copies of the weights differ by {:e}: a mirrored variable was not kept \
         in sync",
        trained.copy_difference
    );
    let reference = train(&config.one_replica(), data)?;
    let difference = max_weight_difference(&trained.params, &reference.params);
    println!(
        "1 replica, same global batch and data order: {:.0} steps/s; max |weight difference| = \
         {difference:.1e} (limit {TOLERANCE:.0e}){}",
        reference.steps_per_s,
        bit_identical(&trained.params, &reference.params)
    );
    ensure!(
        difference <= TOLERANCE,
        "the {replicas}-replica weights differ from the 1-replica weights by {difference:e}, \
         more than {TOLERANCE:e}: the replicas did not train the same model"
    );
    Ok(())
}

/// `--strategy tpu`: trains with the compiled step, reports, and checks against one TPU
/// replica (the same program's arithmetic) and against MirroredStrategy (other arithmetic).
fn run_tpu(args: &Args, data: &WineData) -> Result<()> {
    let config = &args.config;
    let replicas = config.devices.len();
    let trained = train_tpu(config, data)?;
    println!(
        "TpuStrategy on {replicas} replicas [{}] of the PJRT {} plugin, gradient all-reduce \
         inside the compiled step",
        trained.devices.join(", "),
        trained.platform
    );
    let t = trained.times;
    let total = micros(t.total());
    let share = |d: Duration| 100.0 * micros(d) / total;
    print_speed(config, trained.steps_per_s, &trained.losses);
    println!(
        "time per step {total:.1} µs: step launch + wait {:.1} µs ({:.0} %), input {:.1} µs \
         ({:.0} %)",
        micros(t.step),
        share(t.step),
        micros(t.input),
        share(t.input),
    );
    println!(
        "  step: one XLA program per replica (forward, backward, gradient all-reduce, momentum \
         update), launched and waited for"
    );
    println!("  input: waiting for the next per-replica batch, padded and copied to the devices");
    println!(
        "  compile: {:.0} ms before the timed steps (trace to StableHLO, XLA compile, one run \
         whose outputs are dropped)",
        trained.compile.as_secs_f64() * 1e3
    );
    print_metrics(config, data, &trained.params)?;
    write_plot(
        args,
        "loss-tpu.png",
        &trained.losses,
        &trained.validation,
        &format!(
            "wine quality MLP, TpuStrategy, {replicas} replicas, global batch {}",
            config.global_batch
        ),
    )?;

    println!(
        "device copies on the {replicas} replicas: max |difference| = {:.1e}",
        trained.copy_difference
    );
    ensure!(
        trained.copy_difference <= TOLERANCE,
        "the replicas' device copies of the weights differ by {:e}: the all-reduce inside the \
         step did not give every replica the same update",
        trained.copy_difference
    );
    let reference = train_tpu(&config.one_replica(), data)?;
    let difference = max_weight_difference(&trained.params, &reference.params);
    println!(
        "1 TPU replica, same global batch and data order: {:.0} steps/s; max |weight \
         difference| = {difference:.1e} (limit {TOLERANCE:.0e}){}",
        reference.steps_per_s,
        bit_identical(&trained.params, &reference.params)
    );
    ensure!(
        difference <= TOLERANCE,
        "the {replicas}-replica TPU weights differ from the 1-replica TPU weights by \
         {difference:e}, more than {TOLERANCE:e}: the replicas did not train the same model"
    );
    let mirrored = train(config, data)?;
    let difference = max_weight_difference(&trained.params, &mirrored.params);
    println!(
        "MirroredStrategy, {replicas} CPU replicas, same data and hyperparameters: {:.0} \
         steps/s; max |weight difference| = {difference:.1e} (limit \
         {TPU_MIRRORED_TOLERANCE:.0e}: the step's dot products and tanh round from f64, \
         ndarray's and libm's from f32)",
        mirrored.steps_per_s
    );
    ensure!(
        difference <= TPU_MIRRORED_TOLERANCE,
        "the TPU weights differ from MirroredStrategy's by {difference:e}, more than \
         {TPU_MIRRORED_TOLERANCE:e}: the compiled step does not train the same model"
    );
    Ok(())
}

/// The line with the training speed and the first and last batch losses.
fn print_speed(config: &Config, steps_per_s: f64, losses: &[f32]) {
    println!(
        "trained: {:.0} steps/s, {:.0} samples/s; loss {:.4} → {:.4}",
        steps_per_s,
        steps_per_s * config.global_batch as f64,
        losses[0],
        losses.last().expect("at least one step")
    );
}

/// The metrics table: the trained model on both splits, and the mean predictor to beat.
fn print_metrics(config: &Config, data: &WineData, params: &Params) -> Result<()> {
    // The baseline to beat: the training rows' mean score for every wine (no output weights).
    let constant = Params {
        w2: Array1::zeros(config.hidden),
        b2: data.train.y.iter().sum::<f32>() / data.train.rows() as f32,
        ..params.clone()
    };
    println!("{:<28}{:>8}{:>8}{:>14}", "", "MSE", "MAE", "|error| < 0.5");
    for (name, params, split) in [
        ("train", params, &data.train),
        ("validation", params, &data.validation),
        ("validation, mean predictor", &constant, &data.validation),
    ] {
        let m = evaluate(params, split)?;
        println!(
            "{name:<28}{:>8.4}{:>8.4}{:>13.1} %",
            m.mse,
            m.mae,
            100.0 * m.within_half
        );
    }
    Ok(())
}

/// Draws the loss curve to `--plot`, or `target/demo/<default_file>`, and says where.
fn write_plot(
    args: &Args,
    default_file: &str,
    losses: &[f32],
    validation: &[(usize, f32)],
    title: &str,
) -> Result<()> {
    let plot = args
        .plot
        .clone()
        .unwrap_or_else(|| default_plot_path(default_file));
    plot_losses(&plot, losses, validation, title)?;
    // Relative to the working directory when it is inside it: `target/demo/loss.png`.
    let shown = std::env::current_dir()
        .ok()
        .and_then(|dir| plot.strip_prefix(dir).ok().map(Path::to_path_buf))
        .unwrap_or_else(|| plot.clone());
    println!("loss curve: {}", shown.display());
    Ok(())
}

/// `", bit-identical weights"` when two runs' parameters agree in every bit.
fn bit_identical(a: &Params, b: &Params) -> &'static str {
    let identical = a
        .flat()
        .iter()
        .zip(b.flat())
        .all(|(x, y)| x.to_bits() == y.to_bits());
    if identical {
        ", bit-identical weights"
    } else {
        ""
    }
}
