//! The reference linear-regression workload (`distribute_test_support::linear_regression`
//! has its data specification, so other frameworks can run it identically): 64 features,
//! global batch 256, 200 SGD steps at learning rate 0.1 from zero weights and bias, trained
//! data-parallel with `MirroredStrategy`.
//!
//! The strategy's `distribute_dataset` cuts each global batch into per-replica chunks (replica
//! `r` gets the `r`-th contiguous chunk). Each replica computes the gradient sums of its rows;
//! one fused `all_reduce` adds them up; a `merge_call` applies the SGD step to the mirrored
//! variables through the cross-replica `update`, as TF's optimizers do.
//!
//! ```text
//! cargo run --release -p distribute --example linear_regression -- --replicas 2 --json
//! ```
//!
//! Built with the feature `mpi` and started by `mpirun`, it trains with
//! `MultiWorkerMirroredStrategy` instead: every process is a worker with `--replicas` local
//! replicas, and only the chief (worker 0) prints. With W workers × R replicas each step's rows
//! reach the same W·R replicas' gradient sums as one process with W·R replicas, so the weights
//! equal that run's (to rounding: the sums are added in another order).
//!
//! ```text
//! cargo build --release -p distribute --example linear_regression --features mpi
//! mpirun -n 2 target/release/examples/linear_regression --replicas 1 --json
//! ```
//!
//! `--deadline SECS` (default 300) bounds every wait for the other replicas and workers: a worker
//! that freezes ends the job that long after, with an error naming it.
//!
//! `--checkpoint-dir DIR` makes the job resumable: the chief writes a checkpoint (the weights,
//! the bias and the input position) every `--checkpoint-every N` steps (default 20), and a job
//! started again with the same directory restores the newest good one and continues from its
//! step, on any worker and replica count. Started again after a worker died, on the same
//! counts, it ends with the bits of a run that never stopped:
//!
//! ```text
//! for attempt in 1 2 3; do
//!   mpirun -n 2 target/release/examples/linear_regression --replicas 1 --checkpoint-dir ckpt && break
//! done
//! ```

use std::time::{Duration, Instant};

use distribute::prelude::*;
use distribute::tensor::Tensor;
use distribute_test_support::linear_regression::{
    self as workload, FEATURES, GLOBAL_BATCH, LEARNING_RATE, STEPS,
};
use ndarray::{Ix1, Ix2};

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
    /// The checkpoint's step the run resumed from, if it did.
    pub(crate) resumed_from: Option<u64>,
}

/// How a run checkpoints, starts and stops; [`Default`]: none of it.
#[derive(Default)]
pub(crate) struct Resumable<'a> {
    /// Where checkpoints go and how often: the run first restores the newest good one there.
    pub(crate) checkpoints: Option<&'a Checkpoints>,
    /// Start at this step from these weights and bias instead of zeros at step 0 (for tests: a
    /// run that changed its replica count there, without a checkpoint).
    pub(crate) start: Option<(usize, Vec<f32>, f32)>,
    /// Stop after this step (for tests: a job that stopped there).
    pub(crate) stop_after: Option<usize>,
    /// Called after every step with the number of steps taken (for tests: a worker that dies).
    pub(crate) after_step: Option<&'a (dyn Fn(usize) + Sync)>,
}

/// How long a replica or worker waits for the others before the step fails (`--deadline SECS`;
/// across workers a frozen one then ends the job, named): the strategies' default.
pub(crate) const DEFAULT_DEADLINE: Duration = Duration::from_secs(300);

/// Steps between checkpoints when `--checkpoint-dir` is given (`--checkpoint-every N`).
pub(crate) const DEFAULT_CHECKPOINT_EVERY: u64 = 20;

/// Trains on `replicas` CPU replicas of this process for `steps` steps, every wait bounded by
/// `deadline`.
#[allow(dead_code, reason = "the tests' entry point (they include this file)")]
pub(crate) fn train(
    replicas: usize,
    steps: usize,
    deadline: Duration,
) -> Result<Trained, Box<dyn std::error::Error>> {
    train_with(replicas, steps, deadline, &Resumable::default())
}

/// [`train`], checkpointing, starting and stopping as `resumable` says.
pub(crate) fn train_with(
    replicas: usize,
    steps: usize,
    deadline: Duration,
    resumable: &Resumable<'_>,
) -> Result<Trained, Box<dyn std::error::Error>> {
    let config = MirroredConfig {
        deadline,
        ..MirroredConfig::default()
    };
    let strategy = MirroredStrategy::with_config(LocalDevices::cpus(replicas), config)?;
    train_on(&strategy, steps, resumable)
}

/// Trains as one worker of the MPI job this process belongs to, with `replicas` local CPU
/// replicas, for `steps` steps; also gives the worker count and whether this is the chief.
#[cfg(feature = "mpi")]
#[allow(dead_code, reason = "the tests' entry point (they include this file)")]
pub(crate) fn train_multi_worker(
    replicas: usize,
    steps: usize,
    deadline: Duration,
) -> Result<(Trained, usize, bool), Box<dyn std::error::Error>> {
    train_multi_worker_with(replicas, steps, deadline, &Resumable::default())
}

/// [`train_multi_worker`], checkpointing, starting and stopping as `resumable` says.
#[cfg(feature = "mpi")]
pub(crate) fn train_multi_worker_with(
    replicas: usize,
    steps: usize,
    deadline: Duration,
    resumable: &Resumable<'_>,
) -> Result<(Trained, usize, bool), Box<dyn std::error::Error>> {
    let strategy = MultiWorkerMirroredStrategy::with_config(MultiWorkerConfig {
        local_devices: LocalDevices::cpus(replicas),
        deadline,
        ..MultiWorkerConfig::default()
    })?;
    let trained = train_on(&strategy, steps, resumable)?;
    Ok((trained, strategy.num_workers(), strategy.is_chief()))
}

/// Under `mpirun` without the feature every process would train alone and print.
#[cfg(not(feature = "mpi"))]
fn train_multi_worker_with(
    _replicas: usize,
    _steps: usize,
    _deadline: Duration,
    _resumable: &Resumable<'_>,
) -> Result<(Trained, usize, bool), Box<dyn std::error::Error>> {
    Err(
        "started by mpirun, but built without the `mpi` feature: rebuild with \
         `cargo build --release -p distribute --example linear_regression --features mpi`"
            .into(),
    )
}

/// Whether `mpirun` (Open MPI's, or an MPICH-style launcher's) started this process.
fn started_by_mpirun() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"]
        .iter()
        .any(|name| std::env::var_os(name).is_some())
}

/// Trains on `strategy`'s replicas for `steps` steps, checkpointing, starting and stopping as
/// `resumable` says.
pub(crate) fn train_on<S: Strategy>(
    strategy: &S,
    steps: usize,
    resumable: &Resumable<'_>,
) -> Result<Trained, Box<dyn std::error::Error>> {
    let (mut step, initial_w, initial_b) = match &resumable.start {
        Some((step, w, b)) => (*step, w.clone(), *b),
        None => (0, vec![0.0; FEATURES], 0.0),
    };
    let options = VariableOptions::default;
    let initial_w = Tensor::from_vec("/cpu:0", &[FEATURES], initial_w)?;
    let weights = strategy.create_variable("weights", initial_w, options())?;
    let initial_b = Tensor::from_vec("/cpu:0", &[1], vec![initial_b])?;
    let bias = strategy.create_variable("bias", initial_b, options())?;
    let mut resumed_from = None;
    if let Some(checkpoints) = resumable.checkpoints
        && let Some(resume) = checkpoints.restore(strategy, &[&weights, &bias])?
    {
        // The chief's refusals, also `log` warnings (this example installs no logger).
        for (path, why) in &resume.refused {
            eprintln!("refused checkpoint {}: {why}", path.display());
        }
        // The input position is the step: the data is the same in every run.
        step = usize::try_from(resume.input.step)?;
        resumed_from = Some(resume.step);
    }

    // Every step's rows as one dataset of global batches.
    let (x, y) = workload::steps(steps);
    let rows = y.len();
    let dataset = Dataset::from_tensors((
        Tensor::from_vec("/cpu:0", &[rows, FEATURES], x)?,
        Tensor::from_vec("/cpu:0", &[rows], y)?,
    ))?
    .batch(GLOBAL_BATCH, false)?;
    let dataset = strategy
        .distribute_dataset(dataset, InputOptions::default())?
        .resume_from(InputPosition::at_step(step as u64));
    let first_step = step;

    let mut loss = f32::NAN;
    let start = Instant::now();
    for batch in &dataset {
        let step_loss: Leaf<f32> = strategy.run(
            |ctx, (xs, ys)| {
                let device = ctx.device();
                let w = ctx.read_variable(&weights)?;
                let b = ctx.read_variable(&bias)?.to_vec::<f32>()?[0];
                let x = xs.view::<f32, Ix2>()?;
                let err = x.dot(&w.view::<f32, Ix1>()?) + b - ys.view::<f32, Ix1>()?;
                // This replica's Σ err·x, Σ err and Σ err², summed over all replicas at once.
                let sums = (
                    Tensor::from_array(device, err.dot(&x)),
                    Tensor::from_vec(device, &[2], vec![err.sum(), err.dot(&err)])?,
                );
                let (grad_w, rest) = ctx.all_reduce(ReduceOp::Sum, &sums)?;
                // d(mean squared error)/dθ = 2/B · Σ err·∂pred/∂θ over the global batch.
                let scale = 2.0 * LEARNING_RATE / GLOBAL_BATCH as f32;
                let rest = rest.to_vec::<f32>()?;
                let step_w = Tensor::from_array(device, &grad_w.view::<f32, Ix1>()? * scale);
                let step_b = Tensor::from_vec(device, &[1], vec![rest[0] * scale])?;
                ctx.merge_call((step_w, step_b), |cross, (dw, db)| {
                    cross.update(&weights, UpdateOp::AssignSub, &dw)?;
                    cross.update(&bias, UpdateOp::AssignSub, &db)?;
                    Ok(())
                })?;
                Ok(rest[1] / GLOBAL_BATCH as f32)
            },
            &batch?,
        )?;
        loss = *step_loss.local_results()[0];
        step += 1;
        if let Some(checkpoints) = resumable.checkpoints {
            let position = InputPosition::at_step(step as u64);
            checkpoints.save(strategy, step as u64, &[&weights, &bias], position)?;
        }
        if let Some(after_step) = resumable.after_step {
            after_step(step);
        }
        if resumable.stop_after == Some(step) {
            break;
        }
    }
    let steps_per_s = (step - first_step) as f64 / start.elapsed().as_secs_f64();
    let cross = strategy.cross_replica();
    Ok(Trained {
        weights: cross.read_var(&weights)?.to_vec::<f32>()?,
        bias: cross.read_var(&bias)?.to_vec::<f32>()?[0],
        loss,
        steps_per_s,
        resumed_from,
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut replicas = 2;
    let mut json = false;
    let mut deadline = DEFAULT_DEADLINE;
    let mut checkpoint_dir = None;
    let mut checkpoint_every = DEFAULT_CHECKPOINT_EVERY;
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
            "--deadline" => {
                deadline = args
                    .next()
                    .and_then(|s| s.parse::<f64>().ok())
                    .filter(|s| s.is_finite() && *s >= 0.1 && *s <= 1e9)
                    .map(Duration::from_secs_f64)
                    .ok_or("--deadline needs a number of seconds from 0.1 on")?;
            }
            "--checkpoint-dir" => {
                checkpoint_dir = Some(args.next().ok_or("--checkpoint-dir needs a directory")?);
            }
            "--checkpoint-every" => {
                checkpoint_every = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|n| *n > 0)
                    .ok_or("--checkpoint-every needs a positive number of steps")?;
            }
            other => {
                return Err(format!(
                    "unknown argument '{other}'; use --replicas N, --json, --deadline SECS, \
                     --checkpoint-dir DIR, --checkpoint-every N"
                )
                .into());
            }
        }
    }
    let checkpoints = checkpoint_dir
        .map(|dir| {
            let options = CheckpointOptions {
                every: checkpoint_every,
                ..CheckpointOptions::default()
            };
            Checkpoints::new(dir, options)
        })
        .transpose()?;
    let resumable = Resumable {
        checkpoints: checkpoints.as_ref(),
        ..Resumable::default()
    };
    let (trained, workers, chief) = if started_by_mpirun() {
        train_multi_worker_with(replicas, STEPS, deadline, &resumable)?
    } else {
        (train_with(replicas, STEPS, deadline, &resumable)?, 1, true)
    };
    if !chief {
        // Every worker holds the same weights; the chief speaks for all.
        return Ok(());
    }
    if let Some(step) = trained.resumed_from {
        eprintln!("resumed from the checkpoint of step {step}");
    }
    if json {
        println!(
            "{}",
            serde_json::json!({
                "workers": workers, "replicas": replicas, "steps": STEPS,
                "resumed_from": trained.resumed_from,
                "weights": trained.weights,
                "bias": trained.bias, "loss": trained.loss, "steps_per_s": trained.steps_per_s,
            })
        );
    } else {
        println!(
            "{workers} worker(s) × {replicas} replicas, {STEPS} steps: loss {:.6}, bias {:.6}, \
             {:.0} steps/s",
            trained.loss, trained.bias, trained.steps_per_s
        );
        println!("weights: {:?}", trained.weights);
    }
    Ok(())
}
