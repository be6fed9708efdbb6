//! What the demo prints and draws: each strategy's run with its speed, the time per step by
//! phase, the metrics table, the loss curve (PNG), and the checks against one replica and
//! between strategies that make the demo fail when the replicas did not train the same model.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use ndarray::Array1;

use crate::cli::{Args, Framework, StrategyKind};
use crate::data::{FEATURES, WineData, load_wine};
use crate::model::{Params, evaluate, max_weight_difference};
use crate::{Config, TOLERANCE, TPU_MIRRORED_TOLERANCE, mirrored, tpu};

/// Loads the data, trains as `args` asks, prints the report and draws the loss curve; fails
/// when the replicas did not train the same model as one replica (or, with `--strategy tpu`,
/// as MirroredStrategy).
pub fn run(args: &Args) -> Result<()> {
    if let Some(gpt) = &args.gpt {
        return crate::gpt::run(gpt);
    }
    let config = &args.config;
    let data = load_wine(config.seed)?;
    print_data(&data);
    if args.framework == Framework::Candle {
        return run_candle(args, &data);
    }
    println!(
        "model: {FEATURES} → {} tanh → 1, SGD lr {} momentum {}, {} steps of global batch {}",
        config.hidden, config.learning_rate, config.momentum, config.steps, config.global_batch
    );
    match args.strategy {
        StrategyKind::Mirrored => run_mirrored(args, &data),
        StrategyKind::Tpu => run_tpu(args, &data),
    }
}

/// `--strategy mirrored`: trains, reports, and checks against one replica.
fn run_mirrored(args: &Args, data: &WineData) -> Result<()> {
    let config = &args.config;
    let replicas = config.devices.len();
    let trained = mirrored::train(config, data)?;
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
    let reference = mirrored::train(&config.one_replica(), data)?;
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

/// Under `mpirun` (feature `mpi`): trains on every worker process with
/// `MultiWorkerMirroredStrategy` (`config.devices` are each worker's local replicas); the chief
/// reports, with the time per step and the cross-worker part of it, and checks the weights
/// against a 1-process 1-replica run. Fails unless they agree within [`TOLERANCE`] and every
/// copy of the weights, on every replica of every worker, has the same bits.
#[cfg(feature = "mpi")]
pub fn run_multi_worker(args: &Args) -> Result<()> {
    use distribute::mpi::MpiWorld;
    use distribute::prelude::Strategy;

    let Worker {
        strategy,
        workers,
        chief,
        config,
        data,
    } = start_worker(args)?;
    let config = &config;
    let replicas = config.devices.len();
    if chief {
        println!(
            "model: {FEATURES} → {} tanh → 1, SGD lr {} momentum {}, {} steps of global batch {}",
            config.hidden, config.learning_rate, config.momentum, config.steps, config.global_batch
        );
    }
    let world = MpiWorld::get()?;
    let trained = mirrored::train_on(&strategy, config, &data, || world.time_in_calls())?;
    // Every worker's bits of its weights, compared on every worker.
    let bits: Vec<u8> = trained
        .params
        .flat()
        .iter()
        .flat_map(|w| w.to_bits().to_le_bytes())
        .collect();
    let every_worker = strategy
        .extended()
        .workers()
        .context("a multi-worker strategy has workers")?
        .exchange(&bits)?;
    let differing: Vec<usize> = (1..every_worker.len())
        .filter(|&w| every_worker[w] != every_worker[0])
        .collect();
    let copies_identical = trained.copy_difference == 0.0;
    if !chief {
        ensure!(
            differing.is_empty() && copies_identical,
            "worker {}: the weights are not bit-identical on every replica of every worker",
            strategy.worker()
        );
        return Ok(());
    }
    println!(
        "MultiWorkerMirroredStrategy: {workers} worker processes × {replicas} replicas [{}], \
         cross-device ops: {}",
        config.devices.join(", "),
        trained.cross_device_ops
    );
    let t = trained.times;
    let total = micros(t.total());
    let share = |d: Duration| 100.0 * micros(d) / total;
    // The MPI waits happen inside the all-reduce and run()'s end-of-step agreement; the rest
    // of those is this worker's own (shared memory, threads).
    let local = (t.communication() + t.dispatch).saturating_sub(t.cross_worker);
    print_speed(config, trained.steps_per_s, &trained.losses);
    println!(
        "time per step {total:.1} µs: compute {:.1} µs ({:.0} %), cross-worker communication \
         {:.1} µs ({:.0} %), local communication and dispatch {:.1} µs ({:.0} %), input {:.1} µs \
         ({:.0} %)",
        micros(t.compute),
        share(t.compute),
        micros(t.cross_worker),
        share(t.cross_worker),
        micros(local),
        share(local),
        micros(t.input),
        share(t.input),
    );
    println!("  compute: read variables, forward, backward (mean over this worker's replicas)");
    println!(
        "  cross-worker: this process waiting in MPI (the gradient all-reduce's cross-process \
         part and run()'s end-of-step agreement)"
    );
    println!(
        "  local: the rest of the gradient all-reduce ({:.1} µs with its MPI part), the \
         merge_call with the momentum update ({:.1} µs) and of run() ({:.1} µs with the \
         agreement)",
        micros(t.all_reduce),
        micros(t.merge_call),
        micros(t.dispatch)
    );
    println!("  input: waiting for this worker's batches");
    print_metrics(config, &data, &trained.params)?;
    write_plot(
        args,
        "loss_multi_worker.png",
        &trained.losses,
        &trained.validation,
        &format!(
            "wine quality MLP, {workers} workers × {replicas} replicas, global batch {}",
            config.global_batch
        ),
    )?;
    println!(
        "copies of the weights: {} on every replica of every worker",
        if differing.is_empty() && copies_identical {
            "bit-identical"
        } else {
            "NOT bit-identical"
        }
    );
    ensure!(
        differing.is_empty(),
        "workers {differing:?} hold other bits than worker 0: the mirrored variables drifted \
         between workers"
    );
    ensure!(
        copies_identical,
        "this worker's replicas' copies differ by {:e}: a mirrored variable was not kept in sync",
        trained.copy_difference
    );
    let one = Config {
        devices: vec!["/cpu:0".to_owned()],
        progress: false,
        ..config.clone()
    };
    let reference = mirrored::train(&one, &data)?;
    let difference = max_weight_difference(&trained.params, &reference.params);
    println!(
        "1 process, 1 replica, same global batch and data order: {:.0} steps/s; max |weight \
         difference| = {difference:.1e} (limit {TOLERANCE:.0e}){}",
        reference.steps_per_s,
        bit_identical(&trained.params, &reference.params)
    );
    ensure!(
        difference <= TOLERANCE,
        "the {workers}×{replicas} weights differ from the 1-replica weights by {difference:e}, \
         more than {TOLERANCE:e}: the workers did not train the same model"
    );
    Ok(())
}

/// `--strategy tpu`: trains with the compiled step, reports, and checks against one TPU
/// replica (the same program's arithmetic) and against MirroredStrategy (other arithmetic).
fn run_tpu(args: &Args, data: &WineData) -> Result<()> {
    let config = &args.config;
    let replicas = config.devices.len();
    let trained = tpu::train_tpu(config, data)?;
    println!(
        "TpuStrategy on {replicas} replicas [{}] of the PJRT {} plugin, gradient all-reduce \
         inside the compiled step, {}",
        trained.devices.join(", "),
        trained.platform,
        match config.tpu_arithmetic {
            tpu::StepArithmetic::F32 => "f32 arithmetic",
            tpu::StepArithmetic::F64Sums => "sums over rows in f64",
        }
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
    let reference = tpu::train_tpu(&config.one_replica(), data)?;
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
         {difference:e}, more than {TOLERANCE:e}: {}",
        match config.tpu_arithmetic {
            tpu::StepArithmetic::F32 => {
                "in f32, N replicas' sums round differently from one replica's, and a long run \
                 at a high learning rate can grow that past the limit; --tpu-arithmetic \
                 f64-sums gives the same bits on any number of replicas, and if it fails too, \
                 the replicas did not train the same model"
            }
            tpu::StepArithmetic::F64Sums => "the replicas did not train the same model",
        }
    );
    let mirrored = mirrored::train(config, data)?;
    let difference = max_weight_difference(&trained.params, &mirrored.params);
    println!(
        "MirroredStrategy, {replicas} CPU replicas, same data and hyperparameters: {:.0} \
         steps/s; max |weight difference| = {difference:.1e} (limit \
         {TPU_MIRRORED_TOLERANCE:.0e}: XLA's dot kernels and tanh round differently from \
         the mirrored replicas' f32 kernels)",
        mirrored.steps_per_s
    );
    ensure!(
        difference <= TPU_MIRRORED_TOLERANCE,
        "the TPU weights differ from MirroredStrategy's by {difference:e}, more than \
         {TPU_MIRRORED_TOLERANCE:e}: the compiled step does not train the same model"
    );
    Ok(())
}

/// `--framework candle`: trains the candle classifier, reports, and checks against one replica
/// from the same initial values.
fn run_candle(args: &Args, data: &WineData) -> Result<()> {
    let config = &args.config;
    let replicas = config.devices.len();
    print_candle_model(config);
    let checkpoints = args.checkpoints()?;
    let resumable = crate::candle::Resumable {
        checkpoints: checkpoints.as_ref(),
        ..Default::default()
    };
    let strategy = distribute::prelude::MirroredStrategy::with_config(
        &config.devices,
        distribute::prelude::MirroredConfig {
            deadline: config.deadline,
            ..Default::default()
        },
    )?;
    let trained = crate::candle::train_resumable(&strategy, config, data, &resumable)?;
    println!(
        "MirroredStrategy on {replicas} replicas [{}] with distribute-candle, {}",
        config.devices.join(", "),
        candle_threads(&trained)
    );
    report_candle(
        args,
        data,
        &trained,
        &format!("{replicas} replicas"),
        "loss.png",
    )?;
    println!("copies on the {replicas} replicas: bit-identical (check_in_sync)");
    check_candle_against_one_replica(config, data, &trained, replicas)
}

/// A worker of a multi-worker demo: its strategy, the configuration (progress bar on the chief
/// only) and the data, of which the chief has printed the line.
#[cfg(feature = "mpi")]
struct Worker {
    strategy: distribute::prelude::MultiWorkerMirroredStrategy,
    workers: usize,
    chief: bool,
    config: Config,
    data: WineData,
}

/// Joins the MPI job as a worker with `args.config.devices` as its replicas.
#[cfg(feature = "mpi")]
fn start_worker(args: &Args) -> Result<Worker> {
    use distribute::prelude::{
        LocalDevices, MultiWorkerConfig, MultiWorkerMirroredStrategy, Strategy,
    };

    let strategy = MultiWorkerMirroredStrategy::with_config(MultiWorkerConfig {
        local_devices: LocalDevices::new(&args.config.devices)?,
        deadline: args.config.deadline,
        ..MultiWorkerConfig::default()
    })?;
    let (workers, chief) = (strategy.num_workers(), strategy.is_chief());
    let config = Config {
        progress: args.config.progress && chief,
        ..args.config.clone()
    };
    let data = load_wine(config.seed)?;
    if chief {
        print_data(&data);
    }
    Ok(Worker {
        strategy,
        workers,
        chief,
        config,
        data,
    })
}

/// The data line every report starts with.
fn print_data(data: &WineData) {
    println!(
        "wine quality (red): {} training and {} validation wines, {FEATURES} standardized features",
        data.train.rows(),
        data.validation.rows()
    );
}

/// Under `mpirun` (feature `mpi`) with `--framework candle`: trains the candle classifier on
/// every worker with `MultiWorkerMirroredStrategy`; every worker checks that every copy on every
/// worker is bit-identical, and the chief reports and checks against one process with one
/// replica.
#[cfg(feature = "mpi")]
pub fn run_candle_multi_worker(args: &Args) -> Result<()> {
    let Worker {
        strategy,
        workers,
        chief,
        config,
        data,
    } = start_worker(args)?;
    let config = &config;
    let replicas = config.devices.len();
    if chief {
        print_candle_model(config);
    }
    let checkpoints = args.checkpoints()?;
    let resumable = crate::candle::Resumable {
        checkpoints: checkpoints.as_ref(),
        ..Default::default()
    };
    // Checks every copy on every worker (check_in_sync) before it returns.
    let trained = crate::candle::train_resumable(&strategy, config, &data, &resumable)?;
    if !chief {
        return Ok(());
    }
    println!(
        "MultiWorkerMirroredStrategy: {workers} worker processes × {replicas} replicas [{}] with \
         distribute-candle, {}",
        config.devices.join(", "),
        candle_threads(&trained)
    );
    report_candle(
        args,
        &data,
        &trained,
        &format!("{workers} workers × {replicas} replicas"),
        "loss_multi_worker.png",
    )?;
    println!(
        "copies on the {} replicas of the {workers} workers: bit-identical (check_in_sync)",
        workers * replicas
    );
    check_candle_against_one_replica(config, &data, &trained, workers * replicas)
}

/// The model line of `--framework candle`.
fn print_candle_model(config: &Config) {
    use crate::candle::CLASSES;
    println!(
        "model: candle MLP {FEATURES} → {h} ReLU → {h} ReLU → {CLASSES} quality classes, {}, {} \
         steps of global batch {}",
        crate::candle::optimizer_description(config),
        config.steps,
        config.global_batch,
        h = config.hidden
    );
}

/// How many candle threads each replica ran.
fn candle_threads(trained: &crate::candle::Trained) -> String {
    match trained.threads_per_replica {
        Some(1) => "1 candle thread per replica".to_owned(),
        Some(n) => format!("{n} candle threads per replica"),
        None => "candle threads unmanaged".to_owned(),
    }
}

/// Speed, time per step, metrics and the loss curve of a candle run.
fn report_candle(
    args: &Args,
    data: &WineData,
    trained: &crate::candle::Trained,
    shape: &str,
    plot: &str,
) -> Result<()> {
    let config = &args.config;
    if trained.steps_run == 0 {
        println!(
            "nothing left to train: the checkpoint is of the last step; loss {:.4} → {:.4} (from \
             the checkpoint)",
            trained.losses[0],
            trained.losses.last().expect("at least one step")
        );
    } else {
        print_speed(config, trained.steps_per_s, &trained.losses);
        print_candle_times(config, trained);
    }
    if let Some(from) = trained.resumed_from
        && trained.steps_run > 0
    {
        println!(
            "  resumed at step {from}: the speed and times are of the {} steps after it; the \
             losses, the loss curve and the check after {} steps include the steps before, from \
             the checkpoint",
            trained.steps_run,
            crate::candle::CHECK_STEPS.min(config.steps)
        );
    }
    println!("{:<28}{:>10}{:>15}", "", "accuracy", "cross-entropy");
    for (name, m) in [("train", trained.train), ("validation", trained.held_out)] {
        println!("{name:<28}{:>9.1} %{:>15.4}", 100.0 * m.accuracy, m.loss);
    }
    println!(
        "{:<28}{:>9.1} %",
        "validation, majority class",
        100.0 * crate::candle::majority_accuracy(&data.train, &data.validation)
    );
    write_plot(
        args,
        plot,
        &trained.losses,
        &trained.validation,
        &format!(
            "wine quality candle classifier, {shape}, global batch {}",
            config.global_batch
        ),
    )
}

/// The time per step of a candle run, by phase.
fn print_candle_times(config: &Config, trained: &crate::candle::Trained) {
    let t = trained.times;
    let total = micros(t.total());
    let share = |d: Duration| 100.0 * micros(d) / total;
    println!(
        "time per step {total:.0} µs: compute {:.0} µs ({:.0} %), gradient all-reduce {:.0} µs \
         ({:.0} %), input {:.0} µs ({:.0} %), dispatch {:.0} µs ({:.0} %)",
        micros(t.compute),
        share(t.compute),
        micros(t.all_reduce),
        share(t.all_reduce),
        micros(t.input),
        share(t.input),
        micros(t.dispatch),
        share(t.dispatch),
    );
    println!(
        "  compute: candle's forward, backward and {} step on replica 0; the all-reduce \
         includes waiting for the slower replicas",
        config.optimizer.name()
    );
}

/// Trains on one replica of this process from the same initial values, batches and order, and
/// fails unless the weights after `CHECK_STEPS` steps agree within `CANDLE_TOLERANCE`.
fn check_candle_against_one_replica(
    config: &Config,
    data: &WineData,
    trained: &crate::candle::Trained,
    replicas: usize,
) -> Result<()> {
    use crate::candle::{CANDLE_TOLERANCE, CHECK_STEPS, max_weight_difference};

    let reference = crate::candle::train(&config.one_replica(), data)?;
    let early = max_weight_difference(&trained.early_weights, &reference.early_weights);
    let last = max_weight_difference(&trained.weights, &reference.weights);
    let checked = CHECK_STEPS.min(config.steps);
    println!(
        "1 replica, same initial values, global batch and data order: {:.0} steps/s; max |weight \
         difference| after {checked} steps = {early:.1e} (limit {CANDLE_TOLERANCE:.0e}), after \
         {} = {last:.1e}; validation accuracy {:.1} %",
        reference.steps_per_s,
        config.steps,
        100.0 * reference.held_out.accuracy
    );
    ensure!(
        early <= CANDLE_TOLERANCE,
        "after {checked} steps the {replicas}-replica weights differ from the 1-replica weights \
         by {early:e}, more than {CANDLE_TOLERANCE:e}: the replicas did not train the same model"
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
    // The candle classifier's loss is a cross-entropy, the regression MLP's a squared error.
    let loss_name = match args.framework {
        Framework::Candle => "cross-entropy",
        Framework::Native => "mean squared error",
    };
    plot_losses(&plot, losses, validation, title, loss_name)?;
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

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// `target/demo/<file>` next to the running binary (`target/release/demo`), so
/// `CARGO_TARGET_DIR` is respected; `target/demo/` in the current directory otherwise.
fn default_plot_path(file: &str) -> PathBuf {
    let target = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.to_path_buf()))
        .unwrap_or_else(|| PathBuf::from("target"));
    target.join("demo").join(file)
}

/// Draws the training loss (each step's batch, and its mean over 50 steps) and the validation
/// loss against the step, as a PNG; `loss_name` labels the vertical axis.
pub fn plot_losses(
    path: &Path,
    losses: &[f32],
    validation: &[(usize, f32)],
    title: &str,
    loss_name: &str,
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
        .y_desc(loss_name)
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
