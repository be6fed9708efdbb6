//! `--framework candle`: the wines' quality as a class (3 … 8), learned by a candle MLP
//! (11 → H ReLU → H ReLU → 6, `candle_nn::Linear` layers `l1`, `l2`, `l3`) that
//! `distribute-candle` trains data-parallel on `MirroredStrategy` (or, under `mpirun`,
//! `MultiWorkerMirroredStrategy`): one copy of the model and its
//! optimizer per replica, each replica's rows of every global batch as candle tensors, the
//! gradients all-reduced in one bucket before every replica's optimizer step.
//!
//! The optimizer is plain SGD by default, or AdamW (`--optimizer`, [`OptimizerKind`]), with a
//! weight decay (`--weight-decay`), a linear warmup then cosine decay of the rate (`--warmup`,
//! `distribute_candle::Schedule`) and clipping by the global norm of the reduced gradients
//! (`--clip-norm`), all of them `DataParallel`'s: its checkpoints hold the optimizer's state
//! and the number of updates, so a resumed run goes on with the same moments and rate.
//!
//! The same training then runs on one replica from the same seeded initial values, batches and
//! order; the two runs' weights after [`CHECK_STEPS`] steps must agree within
//! [`CANDLE_TOLERANCE`], and every replica's copy must be bit-identical to the others, or the
//! demo fails.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use candle_core::{D, Device, Tensor};
use candle_nn::{Linear, Module, Optimizer, ParamsAdamW, VarBuilder};
use distribute::prelude::{
    Checkpoints, Dataset, InputOptions, InputPosition, PartialBatch, ReduceOp, Strategy,
};
use distribute_candle::{
    AnyOptimizer, Config as CandleConfig, DataParallel, Decay, OptimizerConfig, OptimizerState,
    ParamsSgd, Schedule, StateTensor,
};

pub use crate::config::OptimizerKind;

use crate::Config;
use crate::checkpoint::Progress;
use crate::data::{FEATURES, Split, SplitMix, WineData};
use crate::progress::progress_bar;

/// Quality scores the data has: 3 … 8, class `q − 3`.
pub const CLASSES: usize = 6;
/// The lowest quality score, class 0.
const LOWEST: f32 = 3.0;

/// The largest weight difference allowed between the N-replica and the 1-replica run after
/// [`CHECK_STEPS`] steps. Each replica's matrix products add over its own rows, so the
/// gradients' last bits differ from one replica's: 3e-8 after 100 steps of the default run on 2
/// replicas, 1.2e-7 and 6e-8 on 2 and 3 replicas of the tests' short run. Training goes on from
/// there, and the ReLU network's SGD grows such differences chaotically in long runs (1e-5 after
/// the default 600 steps, up to 1e-3 after 1000 at higher learning rates here), so the check is
/// made early, where a real mistake stands out: a learning rate 1 % off moves the weights by
/// 3.6e-3 in the tests' 100 steps (the test checks it is over 10 times this limit). AdamW stays
/// as close: 1.0e-7 after 100 steps of the default run with `--optimizer adamw` on 2 replicas,
/// 6e-8 with `--warmup 50 --clip-norm 1` too.
pub const CANDLE_TOLERANCE: f32 = 1e-5;

/// The demo's defaults for `--framework candle` with plain SGD, where the command line leaves
/// them: a model big enough that a step is candle's kernels' work, not their call overhead.
pub fn defaults() -> Config {
    Config {
        steps: 600,
        global_batch: 256,
        learning_rate: 0.02,
        hidden: 256,
        ..Config::DEFAULT
    }
}

/// [`defaults`] with `optimizer`'s own learning rate and weight decay: plain SGD's 0.02 and 0,
/// AdamW's [`ADAMW_LEARNING_RATE`] and [`ADAMW_WEIGHT_DECAY`].
pub fn defaults_for(optimizer: OptimizerKind) -> Config {
    match optimizer {
        OptimizerKind::Sgd => defaults(),
        OptimizerKind::AdamW => Config {
            optimizer,
            learning_rate: ADAMW_LEARNING_RATE,
            weight_decay: ADAMW_WEIGHT_DECAY,
            ..defaults()
        },
    }
}

/// AdamW's learning rate where `--lr` leaves it: PyTorch's default.
pub const ADAMW_LEARNING_RATE: f32 = 1e-3;
/// AdamW's weight decay where `--weight-decay` leaves it: PyTorch's default.
pub const ADAMW_WEIGHT_DECAY: f64 = 0.01;

/// How `config` trains, as the report's model line says it: `SGD lr 0.02`, then the weight
/// decay, warmup and clipping where there are any.
pub fn optimizer_description(config: &Config) -> String {
    let mut line = format!("{} lr {}", config.optimizer.name(), config.learning_rate);
    if config.weight_decay != 0.0 {
        line += &format!(" weight decay {}", config.weight_decay);
    }
    if config.warmup > 0 {
        line += &format!(
            " ({} steps of linear warmup, then cosine decay to 0 at step {})",
            config.warmup, config.steps
        );
    }
    if let Some(max) = config.clip_norm {
        line += &format!(", gradients clipped to global norm {max}");
    }
    line
}

/// The learning-rate schedule `config` asks for: none without a warmup (the rate stays
/// constant), else a linear warmup over `warmup` updates to the rate, then cosine decay to zero
/// at the last step.
pub fn schedule(config: &Config) -> Result<Option<Schedule>> {
    if config.warmup == 0 {
        return Ok(None);
    }
    let schedule = Schedule::new(
        f64::from(config.learning_rate),
        config.warmup,
        config.steps as u64,
        Decay::Cosine,
    )
    .context("--warmup")?;
    Ok(Some(schedule))
}

/// The optimizer of a candle run, one type for [`DataParallel`] whichever `--optimizer` chose:
/// its state goes into checkpoints ([`OptimizerState`]), and it times its steps for the
/// report's compute time.
pub struct TrainOptimizer {
    chosen: AnyOptimizer,
    /// How long the last step took.
    last_step: Duration,
}

impl TrainOptimizer {
    /// How long the last [`step`](Optimizer::step) took.
    pub fn last_step(&self) -> Duration {
        self.last_step
    }
}

impl Optimizer for TrainOptimizer {
    /// Which, the learning rate, the weight decay.
    type Config = (OptimizerKind, f64, f64);

    fn new(
        vars: Vec<candle_core::Var>,
        (kind, lr, weight_decay): Self::Config,
    ) -> candle_core::Result<Self> {
        let config = match kind {
            OptimizerKind::Sgd => OptimizerConfig::Sgd(ParamsSgd {
                lr,
                weight_decay,
                ..ParamsSgd::default()
            }),
            OptimizerKind::AdamW => OptimizerConfig::AdamW(ParamsAdamW {
                lr,
                weight_decay,
                ..ParamsAdamW::default()
            }),
        };
        Ok(TrainOptimizer {
            chosen: AnyOptimizer::new(vars, config)?,
            last_step: Duration::ZERO,
        })
    }

    fn step(&mut self, grads: &candle_core::backprop::GradStore) -> candle_core::Result<()> {
        let start = Instant::now();
        self.chosen.step(grads)?;
        self.last_step = start.elapsed();
        Ok(())
    }

    fn learning_rate(&self) -> f64 {
        self.chosen.learning_rate()
    }

    fn set_learning_rate(&mut self, lr: f64) {
        self.chosen.set_learning_rate(lr)
    }
}

impl OptimizerState for TrainOptimizer {
    fn state(&self) -> Vec<StateTensor> {
        self.chosen.state()
    }

    fn set_state(&mut self, values: &[Tensor]) -> candle_core::Result<()> {
        self.chosen.set_state(values)
    }
}

/// The classifier.
pub struct Classifier {
    l1: Linear,
    l2: Linear,
    l3: Linear,
}

impl Classifier {
    /// The layers from `vb`, `hidden` units each.
    pub fn new(vb: VarBuilder, hidden: usize) -> candle_core::Result<Classifier> {
        Ok(Classifier {
            l1: candle_nn::linear(FEATURES, hidden, vb.pp("l1"))?,
            l2: candle_nn::linear(hidden, hidden, vb.pp("l2"))?,
            l3: candle_nn::linear(hidden, CLASSES, vb.pp("l3"))?,
        })
    }
}

impl Module for Classifier {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.l3
            .forward(&self.l2.forward(&self.l1.forward(x)?.relu()?)?.relu()?)
    }
}

/// The steps after which the N-replica run's weights are compared with one replica's.
pub const CHECK_STEPS: usize = 100;

/// Seeded initial values (candle's `Linear` bounds, ±1/√fan-in, drawn from SplitMix64 with
/// `seed`): the same on every run, machine and worker.
pub fn seeded_init(hidden: usize, seed: u64) -> Result<HashMap<String, Tensor>> {
    let mut rng = SplitMix(seed ^ 0x00ca_0d1e);
    let mut values = HashMap::new();
    for (name, inputs, outputs) in [
        ("l1", FEATURES, hidden),
        ("l2", hidden, hidden),
        ("l3", hidden, CLASSES),
    ] {
        let bound = 1.0 / (inputs as f32).sqrt();
        let mut draw = |n: usize| {
            (0..n)
                .map(|_| rng.symmetric() * bound)
                .collect::<Vec<f32>>()
        };
        let weight = Tensor::from_vec(draw(inputs * outputs), (outputs, inputs), &Device::Cpu)?;
        let bias = Tensor::from_vec(draw(outputs), outputs, &Device::Cpu)?;
        values.insert(format!("{name}.weight"), weight);
        values.insert(format!("{name}.bias"), bias);
    }
    Ok(values)
}

/// Mean time per step in each phase (replica 0's, which runs on the calling thread).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepTimes {
    /// Waiting for the next per-replica batch.
    pub input: Duration,
    /// candle's forward, backward and optimizer step.
    pub compute: Duration,
    /// The gradients' all-reduce (and clipping), with the wait for the slower replica.
    pub all_reduce: Duration,
    /// The rest of `run`.
    pub dispatch: Duration,
}

impl StepTimes {
    /// All of a step's time.
    pub fn total(&self) -> Duration {
        self.input + self.compute + self.all_reduce + self.dispatch
    }
}

/// Accuracy and mean cross-entropy of the model on some rows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Metrics {
    /// Share of rows whose predicted class is the true one.
    pub accuracy: f32,
    /// Mean cross-entropy.
    pub loss: f32,
}

/// What a training run ends with.
pub struct Trained {
    /// Every variable of replica 0's copy, flat, in name order.
    pub weights: Vec<(String, Vec<f32>)>,
    /// The same after [`CHECK_STEPS`] steps (or all of them, when fewer).
    pub early_weights: Vec<(String, Vec<f32>)>,
    /// Each step's global-batch loss (every worker's replicas' shares added up).
    pub losses: Vec<f32>,
    /// `(step, validation loss)`.
    pub validation: Vec<(usize, f32)>,
    /// Train and validation metrics of the final model.
    pub train: Metrics,
    /// See [`Trained::train`].
    pub held_out: Metrics,
    /// Mean time per step by phase.
    pub times: StepTimes,
    /// Steps per second.
    pub steps_per_s: f64,
    /// Threads each replica's candle kernels used.
    pub threads_per_replica: Option<usize>,
    /// The checkpoint's step the run resumed from, if it did: the losses, the validation curve
    /// and the early weights before it come from the checkpoint, the times and speed are of the
    /// steps after it.
    pub resumed_from: Option<usize>,
    /// Steps this run took (after the checkpoint it resumed from, up to a stop).
    pub steps_run: usize,
}

/// How a candle run checkpoints, resumes and stops; [`Default`]: none of it.
#[derive(Default, Clone, Copy)]
pub struct Resumable<'a> {
    /// Where checkpoints go and how often (`--checkpoint-dir`, `--checkpoint-every`): the run
    /// first restores the newest good one there and goes on from its step.
    pub checkpoints: Option<&'a Checkpoints>,
    /// Stop after this step (for tests: a job that stopped there).
    pub stop_after: Option<usize>,
    /// Called after every step with the number of steps taken (for tests: a worker that dies).
    pub after_step: Option<&'a (dyn Fn(usize) + Sync)>,
}

/// The class of each row's quality score.
fn classes(split: &Split) -> Vec<i64> {
    split
        .y
        .iter()
        .map(|&q| ((q - LOWEST).round() as i64).clamp(0, CLASSES as i64 - 1))
        .collect()
}

/// The share of `split`'s rows in its most common class: the accuracy to beat.
pub fn majority_accuracy(train: &Split, split: &Split) -> f32 {
    let mut counts = [0usize; CLASSES];
    for c in classes(train) {
        counts[c as usize] += 1;
    }
    let majority = (0..CLASSES).max_by_key(|&c| counts[c]).unwrap_or(0) as i64;
    let rows = classes(split);
    rows.iter().filter(|&&c| c == majority).count() as f32 / rows.len().max(1) as f32
}

/// The model's metrics on `split`.
fn evaluate(model: &Classifier, split: &Split) -> Result<Metrics> {
    let x = Tensor::from_slice(&split.x, (split.rows(), FEATURES), &Device::Cpu)?;
    let y = Tensor::new(classes(split), &Device::Cpu)?;
    let logits = model.forward(&x)?;
    let loss = candle_nn::loss::cross_entropy(&logits, &y)?.to_scalar::<f32>()?;
    let predicted = logits.argmax(D::Minus1)?.to_vec1::<u32>()?;
    let right = predicted
        .iter()
        .zip(y.to_vec1::<i64>()?)
        .filter(|(p, y)| i64::from(**p) == *y)
        .count();
    Ok(Metrics {
        accuracy: right as f32 / split.rows().max(1) as f32,
        loss,
    })
}

/// Trains on `config.devices` with `MirroredStrategy`, from the seeded initial values.
pub fn train(config: &Config, data: &WineData) -> Result<Trained> {
    train_on(&config.mirrored_strategy()?, config, data)
}

/// Trains with `strategy` (whose local replicas are `config.devices`; across workers every
/// worker's replicas share each global batch), from the seeded initial values.
pub fn train_on<S: Strategy>(strategy: &S, config: &Config, data: &WineData) -> Result<Trained> {
    train_resumable(strategy, config, data, &Resumable::default())
}

/// [`train_on`], checkpointing, resuming and stopping as `resumable` says. Resumed on the same
/// worker and replica counts, the weights are the bits of a run that never stopped.
pub fn train_resumable<S: Strategy>(
    strategy: &S,
    config: &Config,
    data: &WineData,
    resumable: &Resumable<'_>,
) -> Result<Trained> {
    ensure!(
        config.steps > 0 && config.global_batch > 0 && config.hidden > 0 && config.eval_every > 0,
        "steps, batch, hidden units and the validation interval must be positive"
    );
    let hidden = config.hidden;
    let optimizer = (
        config.optimizer,
        f64::from(config.learning_rate),
        config.weight_decay,
    );
    let candle_config = CandleConfig {
        schedule: schedule(config)?,
        clip_norm: config.clip_norm,
        ..CandleConfig::default()
    };
    let model = DataParallel::new(
        strategy,
        candle_config,
        |vb| Classifier::new(vb, hidden),
        |vars| TrainOptimizer::new(vars, optimizer),
    )?;
    model.assign(seeded_init(hidden, config.seed)?)?;
    let chief = strategy.extended().should_checkpoint();
    let restored = match resumable.checkpoints {
        Some(checkpoints) => crate::checkpoint::restore(checkpoints, strategy, &model, config)?,
        None => None,
    };
    let (first_step, input, mut progress) = match restored {
        Some(restored) => {
            if chief {
                for (path, why) in &restored.refused {
                    eprintln!("refused checkpoint {}: {why}", path.display());
                }
                println!(
                    "resumed from the checkpoint of step {} ({})",
                    restored.step,
                    restored.path.display()
                );
            }
            (restored.step, restored.input, restored.progress)
        }
        None => {
            let start = model.with_model(0, |m| evaluate(m, &data.validation))?;
            let progress = Progress {
                validation: vec![(0, start.loss)],
                ..Progress::default()
            };
            (0, InputPosition::at_step(0), progress)
        }
    };

    let host = strategy.extended().host_device().to_owned();
    let epochs = (config.steps * config.global_batch).div_ceil(data.train.rows());
    let labels = classes(&data.train);
    let batches = Dataset::from_tensors((
        distribute::tensor::Tensor::from_vec(
            &host,
            &[data.train.rows(), FEATURES],
            data.train.x.clone(),
        )?,
        distribute::tensor::Tensor::from_vec(&host, &[data.train.rows()], labels)?,
    ))?
    .repeat(epochs)?
    .shuffle(config.seed, false)?
    .batch(config.global_batch, false)?;
    let distributed = strategy
        .distribute_dataset(
            batches,
            InputOptions {
                partial_batch: PartialBatch::KeepUneven,
                ..InputOptions::default()
            },
        )?
        .resume_from(input);

    let scale = -1.0 / config.global_batch as f64;
    let bar = progress_bar(config);
    let mut times = StepTimes::default();
    let mut steps = distributed.iter();
    let started = Instant::now();
    let mut last_step = first_step;
    for step in first_step..config.steps {
        let waiting = Instant::now();
        let inputs = steps
            .next()
            .ok_or_else(|| anyhow!("the input ended after {step} steps"))??;
        let running = Instant::now();
        let results = model.run(&inputs, |replica, (x, y)| {
            let t0 = Instant::now();
            let log_p = candle_nn::ops::log_softmax(&replica.model().forward(&x)?, D::Minus1)?;
            // This replica's share of the mean cross-entropy over the global batch.
            let loss = (log_p.gather(&y.unsqueeze(1)?, 1)?.sum_all()? * scale)?;
            // The backward pass, its gradients kept for the update (one micro-batch: the same
            // gradients as `loss.backward()`'s).
            replica.accumulate(&loss)?;
            let t1 = Instant::now();
            // The all-reduce, clipped with `--clip-norm`, then the optimizer's step at the
            // schedule's rate for this update (which checkpoints count).
            replica.step_accumulated(ReduceOp::Sum)?;
            let update = replica.optimizer_mut().last_step();
            let t2 = Instant::now();
            Ok((
                loss.to_scalar::<f32>()?,
                (t1 - t0) + update,
                (t2 - t1).saturating_sub(update),
            ))
        })?;
        let ran = Instant::now();
        let (_, compute, all_reduce) = results[0];
        times.input += running - waiting;
        times.compute += compute;
        times.all_reduce += all_reduce;
        times.dispatch += (ran - running).saturating_sub(compute + all_reduce);
        let loss: f32 = results.iter().map(|r| r.0).sum();
        progress.losses.push(loss);
        if step + 1 == CHECK_STEPS.min(config.steps) {
            progress.early_weights = weights_of(&model)?;
        }
        if (step + 1) % config.eval_every == 0 || step + 1 == config.steps {
            let held_out = model.with_model(0, |m| evaluate(m, &data.validation))?;
            progress.validation.push((step + 1, held_out.loss));
        }
        if step % 20 == 0 || step + 1 == config.steps {
            bar.set_position(step as u64 + 1);
            bar.set_message(format!(
                "loss {loss:.4} · {:.0} samples/s",
                (step + 1 - first_step) as f64 * config.global_batch as f64
                    / started.elapsed().as_secs_f64()
            ));
        }
        last_step = step + 1;
        if let Some(checkpoints) = resumable.checkpoints {
            crate::checkpoint::save(checkpoints, strategy, &model, config, step + 1, &progress)?;
        }
        if let Some(after_step) = resumable.after_step {
            after_step(step + 1);
        }
        if resumable.stop_after == Some(step + 1) {
            break;
        }
    }
    let steps_run = last_step - first_step;
    let Progress {
        losses,
        validation,
        early_weights,
    } = progress;
    bar.finish_and_clear();
    let total = times.total();
    model.check_in_sync()?;
    // Across workers each worker summed only its replicas' losses: add up every worker's, once.
    let losses = model
        .run(&(), |replica, ()| {
            let device = replica.context().device().to_owned();
            let mine = if replica.local_replica() == 0 {
                losses.clone()
            } else {
                vec![0.0; losses.len()]
            };
            let total = replica.context().all_reduce(
                ReduceOp::Sum,
                &distribute::tensor::Tensor::from_vec(&device, &[mine.len()], mine)?,
            )?;
            Ok(total.to_vec::<f32>()?)
        })?
        .swap_remove(0);
    let weights = weights_of(&model)?;
    let (train, held_out) = model.with_model(0, |m| {
        Ok::<_, anyhow::Error>((evaluate(m, &data.train)?, evaluate(m, &data.validation)?))
    })?;
    let per_step = |d: Duration| d / steps_run.max(1) as u32;
    Ok(Trained {
        weights,
        early_weights,
        losses,
        validation,
        train,
        held_out,
        times: StepTimes {
            input: per_step(times.input),
            compute: per_step(times.compute),
            all_reduce: per_step(times.all_reduce),
            dispatch: per_step(times.dispatch),
        },
        steps_per_s: steps_run as f64 / total.as_secs_f64(),
        threads_per_replica: model.threads_per_replica(),
        resumed_from: (first_step > 0).then_some(first_step),
        steps_run,
    })
}

/// Every variable of replica 0's copy, flat, in name order.
fn weights_of<S: Strategy, O: Optimizer + Send>(
    model: &DataParallel<'_, S, Classifier, O>,
) -> Result<Vec<(String, Vec<f32>)>> {
    model
        .variables()
        .iter()
        .map(|v| {
            let value = model
                .variable(0, &v.name)?
                .flatten_all()?
                .to_vec1::<f32>()?;
            Ok((v.name.clone(), value))
        })
        .collect()
}

/// The largest difference between two sets of weights (NaN when either has one).
pub fn max_weight_difference(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) -> f32 {
    a.iter()
        .zip(b)
        .flat_map(|((_, x), (_, y))| x.iter().zip(y).map(|(x, y)| (x - y).abs()))
        .fold(0.0, |m: f32, d| {
            if d.is_nan() || m.is_nan() {
                f32::NAN
            } else {
                m.max(d)
            }
        })
}
