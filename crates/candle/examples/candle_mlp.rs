//! The reference candle workload (`distribute_test_support::candle_mlp` has its data
//! specification, so other frameworks can run it identically): a candle MLP 64 → 512 ReLU →
//! 512 ReLU → 10 (`candle_nn::Linear` layers `l1`, `l2`, `l3`) learns a 10-class labelling of
//! 8192 synthetic rows, mean cross-entropy over the global batch of 512, plain SGD at 0.05,
//! trained data-parallel with `distribute-candle` on `MirroredStrategy`.
//!
//! ```text
//! cargo run --release -p distribute-candle --example candle_mlp -- --replicas 2
//! cargo run --release -p distribute-candle --example candle_mlp -- --save-init init.safetensors --steps 0
//! cargo run --release -p distribute-candle --example candle_mlp -- --init init.safetensors --json
//! cargo run --release -p distribute-candle --example candle_mlp -- --optimizer adamw --lr 1e-3 \
//!     --warmup 20 --clip-norm 1.0 --checkpoint-dir ckpt --checkpoint-every 50
//! ```
//!
//! A real run's options: `--optimizer sgd|adamw` (AdamW with PyTorch's defaults: betas 0.9 and
//! 0.999, eps 1e-8, weight decay 0.01; SGD's rate defaults to 0.05, AdamW's to 1e-3), `--lr`,
//! `--weight-decay`, `--warmup W` (a linear warmup over W updates, then cosine decay to zero at
//! `--steps`; 0, the default, keeps the rate constant), `--clip-norm X` (clip by the global
//! gradient norm), `--hidden H` (both hidden layers), `--precision f32|bf16|f16` (mixed
//! precision: the model computes in bf16 or f16 over f32 master weights, f16 with dynamic loss
//! scaling), and `--checkpoint-dir DIR` with
//! `--checkpoint-every N`: a checkpoint of the model, its optimizer's state and the input
//! position every N steps, from which a restarted run resumes on the bits of one that never
//! stopped. `--sharding zero1|zero2` shards the optimizer's state (and the reduced gradients)
//! among the replicas (ZeRO), to the same bits; `--momentum X` gives SGD a momentum.
//!
//! Built with the feature `mpi` and started by `mpirun`, it trains with
//! `MultiWorkerMirroredStrategy`: every process is a worker with `--replicas` local replicas, and
//! only the chief prints (`cargo xtask launch -n 2 candle_mlp -- --replicas 1`). `--deadline SECS`
//! (default 300) bounds every wait for the other replicas and workers: a worker that freezes ends
//! the job that long after, with an error naming it.

use std::collections::BTreeMap;
use std::error::Error;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Instant;

use candle_core::{D, Tensor};
use candle_nn::{Linear, Module, Optimizer, ParamsAdamW, VarBuilder};
use distribute_candle::{
    AnyOptimizer, Config, CpuThreads, DataParallel, Decay, OptimizerConfig, ParamsSgd, Precision,
    ReplicaMemory, Schedule, Sharding,
};
use distribute_device_spec::LocalDevices;
use distribute_input::{Dataset, InputOptions, InputPosition};
use distribute_mirrored::MirroredStrategy;
use distribute_strategy::{CheckpointOptions, Checkpoints, Strategy};
use distribute_tensor::Tensor as HostTensor;
use distribute_test_support::candle_mlp::{
    CLASSES, FEATURES, GLOBAL_BATCH, HIDDEN, LEARNING_RATE, ROWS, STEPS, rows,
};
use distribute_values::ReduceOp;

/// The model: three `Linear` layers with ReLU between them.
pub(crate) struct Mlp {
    l1: Linear,
    l2: Linear,
    l3: Linear,
}

impl Mlp {
    /// The model's layers from `vb` (candle's default initialisers), `hidden` units in each
    /// hidden layer.
    pub(crate) fn new(vb: VarBuilder, hidden: usize) -> candle_core::Result<Mlp> {
        Ok(Mlp {
            l1: candle_nn::linear(FEATURES, hidden, vb.pp("l1"))?,
            l2: candle_nn::linear(hidden, hidden, vb.pp("l2"))?,
            l3: candle_nn::linear(hidden, CLASSES, vb.pp("l3"))?,
        })
    }
}

/// Which optimizer trains the model (`--optimizer`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum OptimizerKind {
    /// Plain SGD (with `--weight-decay`, PyTorch's coupled decay).
    Sgd,
    /// AdamW with PyTorch's defaults.
    AdamW,
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.l3
            .forward(&self.l2.forward(&self.l1.forward(x)?.relu()?)?.relu()?)
    }
}

/// How to train.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// Replicas of this process.
    pub(crate) replicas: usize,
    /// Training steps.
    pub(crate) steps: usize,
    /// Initial values to load (safetensors).
    pub(crate) init: Option<PathBuf>,
    /// Where to save the initial values before training.
    pub(crate) save_init: Option<PathBuf>,
    /// Threads per replica.
    pub(crate) threads: CpuThreads,
    /// How long a replica or worker waits for the others (`--deadline SECS`): across workers, a
    /// frozen one ends the job this long after it stopped, with an error naming it.
    pub(crate) deadline: std::time::Duration,
    /// `--optimizer`.
    pub(crate) optimizer: OptimizerKind,
    /// `--lr` (default: SGD's 0.05, AdamW's 1e-3).
    pub(crate) lr: Option<f64>,
    /// `--weight-decay` (default: SGD 0, AdamW 0.01).
    pub(crate) weight_decay: Option<f64>,
    /// `--warmup`: 0 keeps the rate constant, else warmup then cosine decay to `steps`.
    pub(crate) warmup: u64,
    /// `--clip-norm`.
    pub(crate) clip_norm: Option<f64>,
    /// `--hidden`: units of each hidden layer.
    pub(crate) hidden: usize,
    /// `--precision f32|bf16|f16`: mixed precision over f32 master weights.
    pub(crate) precision: Precision,
    /// `--checkpoint-dir` and `--checkpoint-every`.
    pub(crate) checkpoints: Option<(PathBuf, u64)>,
    /// `--sharding none|zero1|zero2`: ZeRO, each replica keeping its shard of the optimizer's
    /// state (and of the reduced gradients).
    pub(crate) sharding: Sharding,
    /// `--momentum X`: SGD's momentum (default 0).
    pub(crate) momentum: f64,
    /// `--no-weights`: `--json` without the weights (a big model's would be hundreds of MB).
    pub(crate) no_weights: bool,
    /// `--stop-after N`: stop once step N is done, as if stopped there (the schedule still
    /// runs to `steps`); a later run resumes from the checkpoints.
    pub(crate) stop_after: Option<usize>,
    /// Called with each step's number (from 1) once the step and its checkpoint are done (the
    /// tests that include this file kill a worker there).
    pub(crate) after_step: Option<AfterStep>,
    /// `--gpu`: the replicas on GPUs `/gpu:0` … `/gpu:R-1` (each worker's own numbering:
    /// workers on one machine share them) instead of CPUs (feature `cuda`).
    pub(crate) gpu: bool,
    /// `--through-host`: GPU replicas' gradients reduced through host memory
    /// (`Config::through_host`) instead of in GPU memory.
    pub(crate) through_host: bool,
}

/// A hook run after each step.
#[derive(Clone)]
pub(crate) struct AfterStep(pub(crate) std::sync::Arc<dyn Fn(usize) + Send + Sync>);

impl std::fmt::Debug for AfterStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AfterStep")
    }
}

impl Options {
    /// The optimizer's configuration.
    fn optimizer_config(&self) -> OptimizerConfig {
        match self.optimizer {
            OptimizerKind::Sgd => OptimizerConfig::Sgd(ParamsSgd {
                lr: self.lr.unwrap_or(LEARNING_RATE),
                weight_decay: self.weight_decay.unwrap_or(0.0),
                momentum: self.momentum,
                ..ParamsSgd::default()
            }),
            OptimizerKind::AdamW => {
                let defaults = ParamsAdamW::default();
                OptimizerConfig::AdamW(ParamsAdamW {
                    lr: self.lr.unwrap_or(defaults.lr),
                    weight_decay: self.weight_decay.unwrap_or(defaults.weight_decay),
                    ..defaults
                })
            }
        }
    }

    /// The learning-rate schedule: none without a warmup.
    fn schedule(&self) -> Result<Option<Schedule>, Box<dyn Error>> {
        if self.warmup == 0 {
            return Ok(None);
        }
        let lr = self.optimizer_config().lr();
        Ok(Some(Schedule::new(
            lr,
            self.warmup,
            self.steps as u64,
            Decay::Cosine,
        )?))
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            replicas: 2,
            steps: STEPS,
            init: None,
            save_init: None,
            threads: CpuThreads::Auto,
            deadline: std::time::Duration::from_secs(300),
            optimizer: OptimizerKind::Sgd,
            lr: None,
            weight_decay: None,
            warmup: 0,
            clip_norm: None,
            hidden: HIDDEN,
            precision: Precision::Full,
            checkpoints: None,
            sharding: Sharding::None,
            momentum: 0.0,
            no_weights: false,
            stop_after: None,
            after_step: None,
            gpu: false,
            through_host: false,
        }
    }
}

/// What a training run ends with.
#[derive(Debug, Clone)]
pub(crate) struct Trained {
    /// Every variable's final value, flat, by name.
    pub(crate) weights: BTreeMap<String, Vec<f32>>,
    /// Each step's loss: the mean cross-entropy over its global batch (the steps this run took,
    /// from [`first_step`](Self::first_step) on).
    pub(crate) losses: Vec<f32>,
    /// The step this run started from: 0, or the checkpoint's it resumed from.
    pub(crate) first_step: usize,
    /// Training steps per second (data generation and model building excluded).
    pub(crate) steps_per_s: f64,
    /// Threads each replica's kernels used.
    pub(crate) threads_per_replica: Option<usize>,
    /// The bytes the library held for the first local replica at the end.
    pub(crate) memory: ReplicaMemory,
    /// Each worker's peak resident memory in KiB (Linux's `VmHWM`; 0 where unknown).
    pub(crate) peak_rss_kib: Vec<u64>,
    /// Bytes of gradient buckets the first local replica copied between its GPU and the host
    /// (`DataParallel::gradient_bytes_through_host`): 0 on CPUs and on the GPU path.
    pub(crate) bytes_through_host: u64,
    /// Whether the GPU replicas' buckets stayed in GPU memory (`DataParallel::buckets_on_gpu`).
    pub(crate) buckets_on_gpu: bool,
}

/// Writes fresh initial values (candle's initialisers, on one replica) to `path`: the common
/// start of runs that are to be compared (the tests that include this file use it).
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn write_initial_values(path: &std::path::Path) -> Result<(), Box<dyn Error>> {
    train(&Options {
        replicas: 1,
        steps: 0,
        save_init: Some(path.to_owned()),
        ..Options::default()
    })
    .map(drop)
}

/// The replicas' devices: `options.replicas` CPUs, or GPUs with `--gpu`.
fn local_devices(options: &Options) -> LocalDevices {
    match options.gpu {
        true => LocalDevices::gpus(options.replicas),
        false => LocalDevices::cpus(options.replicas),
    }
}

/// Trains on `options.replicas` replicas of this process (CPUs, or GPUs with `--gpu`).
pub(crate) fn train(options: &Options) -> Result<Trained, Box<dyn Error>> {
    let config = distribute_mirrored::MirroredConfig {
        deadline: options.deadline,
        ..Default::default()
    };
    let strategy = MirroredStrategy::with_config(local_devices(options), config)?;
    train_on(&strategy, options)
}

/// Trains as one worker of the MPI job this process belongs to; also the worker count and
/// whether this is the chief.
#[cfg(feature = "mpi")]
pub(crate) fn train_multi_worker(
    options: &Options,
) -> Result<(Trained, usize, bool), Box<dyn Error>> {
    use distribute_multi_worker::{MultiWorkerConfig, MultiWorkerMirroredStrategy};
    let strategy = MultiWorkerMirroredStrategy::with_config(MultiWorkerConfig {
        local_devices: local_devices(options),
        deadline: options.deadline,
        ..MultiWorkerConfig::default()
    })?;
    let trained = train_on(&strategy, options)?;
    Ok((trained, strategy.num_workers(), strategy.is_chief()))
}

/// Under `mpirun` without the feature every process would train alone and print.
#[cfg(not(feature = "mpi"))]
pub(crate) fn train_multi_worker(
    _options: &Options,
) -> Result<(Trained, usize, bool), Box<dyn Error>> {
    Err(
        "started by mpirun, but built without the `mpi` feature: rebuild with \
         `--features mpi` (or use `cargo xtask launch -n W candle_mlp`)"
            .into(),
    )
}

/// Trains on `strategy`'s replicas.
pub(crate) fn train_on<S: Strategy>(
    strategy: &S,
    options: &Options,
) -> Result<Trained, Box<dyn Error>> {
    let config = Config {
        threads: options.threads,
        schedule: options.schedule()?,
        clip_norm: options.clip_norm,
        precision: options.precision,
        sharding: options.sharding,
        through_host: options.through_host,
        ..Config::default()
    };
    let hidden = options.hidden;
    let model = DataParallel::new_sharded(
        strategy,
        config,
        |vb| Mlp::new(vb, hidden),
        |vars| AnyOptimizer::new(vars, options.optimizer_config()),
    )?;
    if let Some(init) = &options.init {
        model.load(init)?;
    }
    let checkpoints = match &options.checkpoints {
        Some((dir, every)) => Some(Checkpoints::new(
            dir,
            CheckpointOptions {
                every: *every,
                keep: 2,
            },
        )?),
        None => None,
    };
    let resume = match &checkpoints {
        Some(checkpoints) => checkpoints.restore(strategy, &[&model])?,
        None => None,
    };
    let first_step = resume.as_ref().map_or(0, |r| r.step as usize);
    if let Some(path) = &options.save_init
        && strategy.extended().should_checkpoint()
    {
        model.save_variables(path)?;
    }

    // Step s takes rows (s·512 mod 8192) .. + 512: the rows in order, repeated.
    let (x, labels) = rows();
    let epochs = (options.steps * GLOBAL_BATCH).div_ceil(ROWS).max(1);
    let dataset = Dataset::from_tensors((
        HostTensor::from_vec("/cpu:0", &[ROWS, FEATURES], x)?,
        HostTensor::from_vec("/cpu:0", &[ROWS], labels)?,
    ))?
    .repeat(epochs)?
    .batch(GLOBAL_BATCH, false)?;
    let dataset = strategy
        .distribute_dataset(dataset, InputOptions::default())?
        .resume_from(resume.map_or(InputPosition::at_step(0), |r| r.input));

    let mut local_losses = Vec::with_capacity(options.steps);
    let start = Instant::now();
    let last = options
        .stop_after
        .map_or(options.steps, |s| s.min(options.steps));
    let todo = last.saturating_sub(first_step);
    for (step, batch) in (first_step + 1..).zip(dataset.iter().take(todo)) {
        let losses = model.run(&batch?, |replica, (x, y)| {
            // The model computes in its dtype (bf16 or f16 with --precision); the loss in f32.
            let x = x.to_dtype(replica.compute_dtype())?;
            let logits = replica
                .model()
                .forward(&x)?
                .to_dtype(candle_core::DType::F32)?;
            // This replica's share of the mean over the global batch: its rows' summed
            // cross-entropy over 512, reduced with Sum (TF's compute_average_loss).
            let log_p = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
            let picked = log_p.gather(&y.unsqueeze(1)?, 1)?;
            let loss = (picked.sum_all()? * (-1.0 / GLOBAL_BATCH as f64))?;
            replica.backward_step(&loss, ReduceOp::Sum)?;
            Ok(loss.to_scalar::<f32>()?)
        })?;
        local_losses.push(losses.iter().sum::<f32>());
        if let Some(checkpoints) = &checkpoints
            && checkpoints.is_due(step as u64)
        {
            let at = InputPosition::at_step(step as u64);
            checkpoints.save(strategy, step as u64, &[&model], at)?;
        }
        if let Some(AfterStep(hook)) = &options.after_step {
            hook(step);
        }
    }
    let steps_per_s = local_losses.len() as f64 / start.elapsed().as_secs_f64();

    // Every worker's share of each step's loss, added up once at the end.
    let losses = model.run(&(), |replica, ()| {
        // The first local replica brings this worker's sums, the others zeros.
        let mine = if replica.local_replica() == 0 {
            local_losses.clone()
        } else {
            vec![0.0; local_losses.len()]
        };
        let device = replica.context().device().to_owned();
        let total = replica.context().all_reduce(
            ReduceOp::Sum,
            &HostTensor::from_vec(&device, &[mine.len()], mine)?,
        )?;
        Ok(total.to_vec::<f32>()?)
    })?;
    // Each worker's peak resident memory, gathered as the losses are.
    let replicas = options.replicas;
    let peak = peak_rss_kib() as f64;
    let peaks = model.run(&(), |replica, ()| {
        let workers = replica.num_replicas_in_sync() / replicas;
        let mut mine = vec![0f64; workers];
        if replica.local_replica() == 0 {
            mine[replica.replica_id() / replicas] = peak;
        }
        let device = replica.context().device().to_owned();
        let total = replica.context().all_reduce(
            ReduceOp::Sum,
            &HostTensor::from_vec(&device, &[mine.len()], mine)?,
        )?;
        Ok(total.to_vec::<f64>()?)
    })?;
    // Every copy of the model the same bits, on every worker.
    model.check_in_sync()?;
    let mut weights = BTreeMap::new();
    for var in model.variables() {
        let value = model.variable(0, &var.name)?;
        weights.insert(var.name.clone(), value.flatten_all()?.to_vec1::<f32>()?);
    }
    Ok(Trained {
        weights,
        losses: losses.into_iter().next().unwrap_or_default(),
        first_step,
        steps_per_s,
        threads_per_replica: model.threads_per_replica(),
        memory: model.memory()?[0],
        peak_rss_kib: peaks
            .into_iter()
            .next()
            .unwrap_or_default()
            .into_iter()
            .map(|p| p as u64)
            .collect(),
        bytes_through_host: model.gradient_bytes_through_host()?[0],
        buckets_on_gpu: model.buckets_on_gpu()?,
    })
}

/// This process's peak resident memory in KiB (`VmHWM` in `/proc/self/status`), 0 where the
/// system does not say.
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Whether `mpirun` (Open MPI's, or an MPICH-style launcher's) started this process.
fn started_by_mpirun() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"]
        .iter()
        .any(|name| std::env::var_os(name).is_some())
}

/// The command line.
fn parse_args() -> Result<(Options, bool), Box<dyn Error>> {
    const USAGE: &str = "usage: candle_mlp [--replicas R] [--steps N] [--threads T] \
                         [--init FILE] [--save-init FILE] [--deadline SECS] [--json] \
                         [--optimizer sgd|adamw] [--lr X] [--weight-decay X] [--warmup W] \
                         [--clip-norm X] [--hidden H] [--checkpoint-dir DIR] \
                         [--checkpoint-every N] [--stop-after N] \
                         [--precision f32|bf16|f16] [--sharding none|zero1|zero2] \
                         [--momentum X] [--no-weights] [--gpu] [--through-host]";
    let mut checkpoint_dir = None;
    let mut checkpoint_every = None;
    let mut options = Options::default();
    let mut json = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |what: &str| {
            args.next()
                .ok_or_else(|| format!("{arg} needs {what}; {USAGE}"))
        };
        match arg.as_str() {
            "--replicas" => {
                options.replicas = value("a positive number")?
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or("--replicas needs a positive number")?;
            }
            "--steps" => {
                options.steps = value("a number")?
                    .parse()
                    .map_err(|_| "--steps needs a number")?;
            }
            "--threads" => {
                let n: NonZeroUsize = value("a positive number")?
                    .parse()
                    .map_err(|_| "--threads needs a positive number")?;
                options.threads = CpuThreads::PerReplica(n);
            }
            "--init" => options.init = Some(value("a file")?.into()),
            "--save-init" => options.save_init = Some(value("a file")?.into()),
            "--deadline" => {
                options.deadline = value("a number of seconds")?
                    .parse::<f64>()
                    .ok()
                    .filter(|s| s.is_finite() && *s >= 0.1 && *s <= 1e9)
                    .map(std::time::Duration::from_secs_f64)
                    .ok_or("--deadline needs a number of seconds from 0.1 on")?;
            }
            "--optimizer" => {
                options.optimizer = match value("sgd or adamw")?.as_str() {
                    "sgd" => OptimizerKind::Sgd,
                    "adamw" => OptimizerKind::AdamW,
                    other => return Err(format!("--optimizer {other}: sgd or adamw").into()),
                };
            }
            "--lr" | "--weight-decay" | "--clip-norm" => {
                let x = value("a number")?
                    .parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite() && *x >= 0.0)
                    .ok_or_else(|| format!("{arg} needs a finite number ≥ 0"))?;
                match arg.as_str() {
                    "--lr" => options.lr = Some(x),
                    "--weight-decay" => options.weight_decay = Some(x),
                    _ => options.clip_norm = Some(x),
                }
            }
            "--warmup" => {
                options.warmup = value("a number of updates")?
                    .parse()
                    .map_err(|_| "--warmup needs a number of updates")?;
            }
            "--hidden" => {
                options.hidden = value("a positive number")?
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or("--hidden needs a positive number")?;
            }
            "--precision" => {
                options.precision = match value("f32, bf16 or f16")?.as_str() {
                    "f32" => Precision::Full,
                    "bf16" => Precision::MixedBf16,
                    "f16" => Precision::MixedF16,
                    other => {
                        return Err(format!("--precision {other}: f32, bf16 or f16").into());
                    }
                };
            }
            "--stop-after" => {
                options.stop_after = Some(
                    value("a number of steps")?
                        .parse()
                        .map_err(|_| "--stop-after needs a number of steps")?,
                );
            }
            "--checkpoint-dir" => checkpoint_dir = Some(PathBuf::from(value("a directory")?)),
            "--checkpoint-every" => {
                checkpoint_every = Some(
                    value("a positive number")?
                        .parse::<u64>()
                        .ok()
                        .filter(|&n| n > 0)
                        .ok_or("--checkpoint-every needs a positive number")?,
                );
            }
            "--sharding" => options.sharding = value("none, zero1 or zero2")?.parse()?,
            "--momentum" => {
                options.momentum = value("a number")?
                    .parse()
                    .map_err(|_| "--momentum needs a number")?;
            }
            "--json" => json = true,
            "--no-weights" => options.no_weights = true,
            "--gpu" => options.gpu = true,
            "--through-host" => options.through_host = true,
            "--help" | "-h" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument '{other}'; {USAGE}").into()),
        }
    }
    options.checkpoints = match (checkpoint_dir, checkpoint_every) {
        (Some(dir), every) => Some((dir, every.unwrap_or(50))),
        (None, Some(_)) => return Err("--checkpoint-every needs --checkpoint-dir".into()),
        (None, None) => None,
    };
    Ok((options, json))
}

fn main() -> Result<(), Box<dyn Error>> {
    let (options, json) = parse_args()?;
    let (trained, workers, chief) = if started_by_mpirun() {
        train_multi_worker(&options)?
    } else {
        (train(&options)?, 1, true)
    };
    if !chief {
        // Every worker holds the same weights; the chief speaks for all.
        return Ok(());
    }
    if json {
        println!(
            "{}",
            serde_json::json!({
                "workers": workers, "replicas": options.replicas, "steps": options.steps,
                "threads_per_replica": trained.threads_per_replica,
                "weights": if options.no_weights { serde_json::Value::Null } else {
                    serde_json::json!(trained.weights)
                },
                "losses": trained.losses,
                "steps_per_s": trained.steps_per_s, "first_step": trained.first_step,
                "sharding": options.sharding.to_string(),
                "peak_rss_kib": trained.peak_rss_kib,
                "gpu": options.gpu,
                "buckets_on_gpu": trained.buckets_on_gpu,
                "bytes_through_host": trained.bytes_through_host,
                "memory": {
                    "parameters": trained.memory.parameters,
                    "gradients": trained.memory.gradients,
                    "gradient_buckets": trained.memory.gradient_buckets,
                    "optimizer_state": trained.memory.optimizer_state,
                },
            })
        );
    } else {
        let first = trained.losses.first().copied().unwrap_or(f32::NAN);
        let last = trained.losses.last().copied().unwrap_or(f32::NAN);
        println!(
            "{workers} worker(s) × {} replicas ({} threads each), {} steps: loss {first:.4} → \
             {last:.4}, {:.1} steps/s",
            options.replicas,
            trained
                .threads_per_replica
                .map_or_else(|| "unmanaged".to_owned(), |t| t.to_string()),
            options.steps,
            trained.steps_per_s
        );
    }
    Ok(())
}
