//! Training with `MirroredStrategy`: the input pipeline that cuts global batches into
//! per-replica chunks, the mirrored variables, the replica step (gradient sums, one fused
//! `all_reduce`, SGD with momentum in a `merge_call`), and where each step's time goes.

use std::borrow::Cow;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, ensure};
use distribute::input::InputWorkers;
use distribute::prelude::*;
use distribute::tensor::Element;
use distribute::tensor::{DType, Tensor};
use ndarray::{Ix1, Ix2};

use crate::Config;
use crate::data::{FEATURES, Split, WineData};
use crate::model::{ParamSlices, Params, evaluate, max_weight_difference};
use crate::progress::progress_bar;

/// Mean time per step spent in each phase, over all steps.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepTimes {
    /// Waiting for the next per-replica batch from the input pipeline.
    pub input: Duration,
    /// Reading the variables, forward and backward pass (mean over replicas).
    pub compute: Duration,
    /// The fused all-reduce of the gradient sums (mean over replicas), including the wait for
    /// the slowest replica.
    pub all_reduce: Duration,
    /// The optimizer's `merge_call` (mean over replicas): the rendezvous, and replica 0 applying
    /// the momentum update to every copy while the others wait.
    pub merge_call: Duration,
    /// The rest of `strategy.run`: handing the step to the replica threads and collecting
    /// their results.
    pub dispatch: Duration,
    /// Of all the above, the time this process spent in cross-worker calls (MPI: the
    /// all-reduce's cross-process part, the end-of-step agreement); 0 in one process.
    pub cross_worker: Duration,
}

impl StepTimes {
    /// All of a step's time.
    pub fn total(&self) -> Duration {
        self.input + self.compute + self.communication() + self.dispatch
    }

    /// Time spent with the other replicas: the all-reduce and the merge_call.
    pub fn communication(&self) -> Duration {
        self.all_reduce + self.merge_call
    }
}

/// What a training run ends with.
#[derive(Debug, Clone)]
pub struct Trained {
    /// The final parameters (replica 0's copy of the mirrored variables).
    pub params: Params,
    /// The largest difference between replica 0's copy of the parameters and another
    /// replica's: 0 when every copy received the same updates.
    pub copy_difference: f32,
    /// The mean squared error of each step's global batch, before its update.
    pub losses: Vec<f32>,
    /// `(step, validation MSE)` before training, every `eval_every` steps and after the last.
    pub validation: Vec<(usize, f32)>,
    /// Time per step, by phase.
    pub times: StepTimes,
    /// Steps per second of the training loop (validation excluded).
    pub steps_per_s: f64,
    /// The cross-device ops the strategy chose.
    pub cross_device_ops: String,
}

/// One replica's input for a step: its rows of features and scores.
type Rows = (Tensor, Tensor);

/// The training rows as one `PerReplica<(x, y)>` per step: shuffled (seeded, a new order each
/// epoch), global batches of `config.global_batch` rows, replica `r` getting the `r`-th
/// contiguous chunk of each.
pub fn input_pipeline(
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
pub(crate) fn training_batches(
    config: &Config,
    train: &Split,
    host: &str,
) -> Result<Dataset<Rows>> {
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
pub fn train(config: &Config, data: &WineData) -> Result<Trained> {
    train_on(&config.mirrored_strategy()?, config, data, || {
        Duration::ZERO
    })
}

/// Trains the MLP on `data.train` with `strategy`, whose local replicas are `config.devices`
/// (a `MultiWorkerMirroredStrategy` trains every worker's replicas together, each step's global
/// batch shared by all). `cross_worker_clock` says how long this process has spent in
/// cross-worker calls so far (always 0 in one process).
pub fn train_on<S: Strategy>(
    strategy: &S,
    config: &Config,
    data: &WineData,
    cross_worker_clock: impl Fn() -> Duration,
) -> Result<Trained> {
    ensure!(
        config.steps > 0 && config.global_batch > 0 && config.hidden > 0 && config.eval_every > 0,
        "steps, batch, hidden units and the validation interval must be positive"
    );
    let host = strategy.extended().host_device().to_owned();
    let mean_score = data.train.y.iter().sum::<f32>() / data.train.rows() as f32;
    let init = Params::init(config.hidden, mean_score, config.seed);
    let names = ["dense/kernel", "dense/bias", "output/kernel", "output/bias"];
    let mut weights = Vec::new();
    let mut velocities = Vec::new();
    for (name, value) in names.iter().zip(init.to_tensors(&host)) {
        let zeros = Tensor::zeros(&host, DType::F32, value.shape())?;
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

    // The strategy's own dataset: in one process `input_pipeline`'s; across workers each
    // worker's share of every global batch.
    let distributed = strategy.distribute_dataset(
        training_batches(config, &data.train, &host)?,
        InputOptions {
            partial_batch: PartialBatch::KeepUneven,
            ..InputOptions::default()
        },
    )?;

    let (learning_rate, momentum, global_batch) =
        (config.learning_rate, config.momentum, config.global_batch);
    let step_fn = |ctx: &ReplicaContext<'_>, (x, y): Rows| -> Result<_, StrategyError> {
        let started = Instant::now();
        let device = ctx.device().to_owned();
        let current = weights
            .iter()
            .map(|w| ctx.read_variable(w))
            .collect::<Result<Vec<Tensor>, _>>()?;
        let params = ParamSlices::from_tensors(&current)?;
        let (grads, squared_error) =
            params.gradient_sums(x.view::<f32, Ix2>()?, y.view::<f32, Ix1>()?)?;
        let hidden = grads.b1.len();
        let sums = (
            vec![
                Tensor::from_vec(&device, &[FEATURES, hidden], grads.w1)?,
                Tensor::from_vec(&device, &[hidden], grads.b1)?,
                Tensor::from_vec(&device, &[hidden], grads.w2)?,
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
        ctx.merge_call(grad_sums, |cross, grad_sums: Vec<Leaf<Tensor>>| {
            // SGD with momentum on every copy: v ← μ·v + g, then w ← w − lr·v, each device's
            // copy with that device's all-reduced gradient sums. g is the gradient of the global
            // batch's mean squared error (TF's `compute_average_loss(..., global_batch_size)`),
            // rounded to f32 from the f64 sum. One pass and one new buffer per copy.
            for ((weight, velocity), sum) in weights.iter().zip(&velocities).zip(&grad_sums) {
                cross.update_with(velocity, |at, v| {
                    let sum = elements::<f64>(replica_value(sum, at.replica())?)?;
                    let new = elements::<f32>(v)?
                        .iter()
                        .zip(sum.iter())
                        .map(|(&v, &sum)| v * momentum + (sum / rows) as f32)
                        .collect();
                    Ok(Tensor::from_vec(v.device(), v.shape(), new)?)
                })?;
                cross.update_with(weight, |at, w| {
                    let v = velocity.component(at.replica())?.read();
                    let new = elements::<f32>(w)?
                        .iter()
                        .zip(elements::<f32>(&v)?.iter())
                        .map(|(&w, &v)| w - v * learning_rate)
                        .collect();
                    Ok(Tensor::from_vec(w.device(), w.shape(), new)?)
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
        let cross_before = cross_worker_clock();
        let batch = steps
            .next()
            .ok_or_else(|| anyhow!("the input ended after {step} steps"))??;
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
        times.cross_worker += cross_worker_clock().saturating_sub(cross_before);
        let loss = *loss.local_results()[0];
        losses.push(loss);

        if (step + 1) % config.eval_every == 0 || step + 1 == config.steps {
            let params = read_params(strategy, &weights)?;
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
    let params = read_params(strategy, &weights)?;
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
            cross_worker: per_step(times.cross_worker),
        },
        steps_per_s: config.steps as f64 / total.as_secs_f64(),
        cross_device_ops: strategy
            .cross_replica()
            .cross_device_ops()
            .name()
            .to_owned(),
    })
}

/// The elements of a host tensor in row-major order, borrowed when it is laid out so.
fn elements<T: Element>(tensor: &Tensor) -> Result<Cow<'_, [T]>, StrategyError> {
    let array = tensor.array::<T>()?;
    Ok(match array.as_slice() {
        Some(elements) => Cow::Borrowed(elements),
        None => Cow::Owned(array.iter().copied().collect()),
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

/// The mean over replicas of per-replica durations in seconds.
fn mean_seconds(per_replica: &Leaf<f64>) -> Duration {
    let values = per_replica.local_results();
    Duration::from_secs_f64(values.iter().copied().sum::<f64>() / values.len() as f64)
}

/// The mirrored weights as the cross-replica context reads them.
fn read_params<S: Strategy>(
    strategy: &S,
    weights: &[DistributedVariable<Tensor>],
) -> Result<Params> {
    let cross = strategy.cross_replica();
    let tensors = weights
        .iter()
        .map(|w| cross.read_var(w))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Params::from_tensors(&tensors)?)
}
