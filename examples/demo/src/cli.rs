//! The demo's command line (clap): the options, their defaults (the ones of
//! [`Config::DEFAULT`]) and the checks that refuse what this build cannot run, with a message
//! that says what to use instead.

use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::{Context, Result, bail, ensure};
use clap::{Parser, ValueEnum};
use distribute::device_spec::{DeviceKind, LocalDevices};

use crate::Config;
use crate::candle::OptimizerKind;
use crate::gpt::{DEFAULT_SAMPLE, GptArgs};
use crate::tpu::StepArithmetic;

/// Which strategy `--strategy` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StrategyKind {
    /// `MirroredStrategy`: one thread per device.
    Mirrored,
    /// `TpuStrategy`: one compiled XLA step over the devices of the PJRT plugin (`cargo xtask
    /// fetch-pjrt` installs the pinned CPU plugin).
    Tpu,
}

/// Which framework's model `--framework` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Framework {
    /// The demo's own MLP regressing the score (11 → H tanh → 1, backprop written by hand),
    /// bit-identical on any number of replicas.
    Native,
    /// A candle MLP classifying the score (11 → H ReLU → H ReLU → 6, plain SGD or AdamW) with
    /// `distribute-candle`.
    Candle,
}

/// Which model `--model` asks for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum ModelKind {
    /// An MLP on the wine-quality data (`--framework` chooses which).
    #[default]
    Mlp,
    /// A small byte-level GPT on this project's documentation, with `distribute-candle`
    /// ([`crate::gpt`]).
    Gpt,
}

/// The command line, parsed and checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Args {
    /// `--model gpt`'s run; `None`: the MLP that the rest of the fields describe.
    pub gpt: Option<GptArgs>,
    /// The training to run.
    pub config: Config,
    /// The strategy asked for.
    pub strategy: StrategyKind,
    /// The model's framework.
    pub framework: Framework,
    /// Where the loss curve goes; `None`: `target/demo/loss.png`.
    pub plot: Option<PathBuf>,
    /// Where the candle run's checkpoints go (`--checkpoint-dir`); `None`: no checkpoints.
    pub checkpoint_dir: Option<PathBuf>,
    /// Steps between two checkpoints (`--checkpoint-every`).
    pub checkpoint_every: u64,
}

/// Steps between two checkpoints when `--checkpoint-dir` is given and `--checkpoint-every` is
/// not.
pub const DEFAULT_CHECKPOINT_EVERY: u64 = 50;

impl Args {
    /// The checkpoints `--checkpoint-dir` asks for (the newest 3 kept), if any.
    pub fn checkpoints(&self) -> Result<Option<distribute::prelude::Checkpoints>> {
        use distribute::prelude::{CheckpointOptions, Checkpoints};
        self.checkpoint_dir
            .as_ref()
            .map(|dir| {
                let options = CheckpointOptions {
                    every: self.checkpoint_every,
                    ..CheckpointOptions::default()
                };
                Checkpoints::new(dir, options).context("--checkpoint-every")
            })
            .transpose()
    }
}

/// The options as clap reads them, before the checks that involve more than one of them.
#[derive(Debug, Parser)]
#[command(
    name = "demo",
    about = "Trains an MLP on wine-quality data, data-parallel, and checks it against one replica \
             (`cargo xtask demo [options]`)"
)]
pub struct Options {
    /// The model: the wine-quality MLP, or a small byte-level GPT trained on this project's
    /// documentation (AdamW, warmup-cosine, clipping; its defaults: --steps 200 --batch 32
    /// windows --lr 0.003 --weight-decay 0.01 --warmup 50 --clip-norm 1; it takes --replicas,
    /// --steps, --batch, --optimizer, --lr, --weight-decay, --warmup, --clip-norm, --seed,
    /// --deadline, --checkpoint-dir and its own --layers, --embd, --heads, --block, --sample)
    #[arg(long, value_enum, default_value_t = ModelKind::Mlp)]
    pub model: ModelKind,
    /// The GPT's transformer blocks (--model gpt) [gpt: 2]
    #[arg(long, value_name = "N", value_parser = positive)]
    pub layers: Option<usize>,
    /// The GPT's embedding width, a multiple of --heads (--model gpt) [gpt: 64]
    #[arg(long, value_name = "N", value_parser = positive)]
    pub embd: Option<usize>,
    /// The GPT's attention heads (--model gpt) [gpt: 4]
    #[arg(long, value_name = "N", value_parser = positive)]
    pub heads: Option<usize>,
    /// The GPT's context in bytes (--model gpt) [gpt: 64]
    #[arg(long, value_name = "N", value_parser = positive)]
    pub block: Option<usize>,
    /// Bytes the trained GPT writes after the prompt "The " (--model gpt) [gpt: 240]
    #[arg(long, value_name = "N", value_parser = steps_usize)]
    pub sample: Option<usize>,
    /// Replicas on /cpu:0 … /cpu:N-1, or on N PJRT devices with --strategy tpu [default: 2]
    #[arg(long, value_name = "N", value_parser = positive)]
    pub replicas: Option<usize>,
    /// Comma-separated replica devices, e.g. /cpu:0,/cpu:1 (mirrored only)
    #[arg(long, value_name = "LIST")]
    pub devices: Option<String>,
    /// The strategy to train with
    #[arg(long, value_enum, default_value_t = StrategyKind::Mirrored)]
    pub strategy: StrategyKind,
    /// The model: a candle classifier trained with distribute-candle (mirrored only; its
    /// defaults: --steps 600 --batch 256 --hidden 256, --optimizer sgd with --lr 0.02, adamw
    /// with --lr 0.001 --weight-decay 0.01; --momentum unused), or the demo's own regression
    /// MLP, bit-identical on any replica count (the defaults in brackets below are its)
    /// [default: candle; native with --strategy tpu]
    #[arg(long, value_enum)]
    pub framework: Option<Framework>,
    /// Optimizer steps [native: 2000]
    #[arg(long, value_name = "N", value_parser = positive)]
    pub steps: Option<usize>,
    /// Global batch: rows per step over all replicas [native: 128]
    #[arg(long, value_name = "N", value_parser = positive)]
    pub batch: Option<usize>,
    /// Learning rate; with --warmup, the peak rate [native: 0.01]
    #[arg(long, value_name = "X", value_parser = non_negative, allow_negative_numbers = true)]
    pub lr: Option<f32>,
    /// SGD momentum, 0 for plain SGD (native only) [native: 0.9]
    #[arg(long, value_name = "X", value_parser = non_negative)]
    pub momentum: Option<f32>,
    /// The candle classifier's optimizer: plain SGD, or AdamW (PyTorch's: betas 0.9 and 0.999,
    /// eps 1e-8, decoupled weight decay), whose moments --checkpoint-dir saves [default: sgd]
    #[arg(long, value_enum, value_name = "NAME")]
    pub optimizer: Option<OptimizerKind>,
    /// The candle classifier's weight decay: SGD's L2 penalty added to the gradient, AdamW's
    /// decoupled decay [sgd: 0, adamw: 0.01]
    #[arg(long, value_name = "X", value_parser = non_negative_f64, allow_negative_numbers = true)]
    pub weight_decay: Option<f64>,
    /// The candle classifier's learning-rate schedule: the rate rises linearly over W steps to
    /// --lr, then falls along a cosine to 0 at the last step; 0 keeps it constant. Below --steps
    #[arg(long, value_name = "W", value_parser = steps_u64, allow_negative_numbers = true)]
    pub warmup: Option<u64>,
    /// Clips the candle classifier's all-reduced gradients to this global norm before each
    /// update (PyTorch's clip_grad_norm_) [default: no clipping]
    #[arg(long, value_name = "X", value_parser = positive_f64, allow_negative_numbers = true)]
    pub clip_norm: Option<f64>,
    /// Hidden units [native: 32]
    #[arg(long, value_name = "N", value_parser = positive)]
    pub hidden: Option<usize>,
    /// Seed of the split, the initial weights and the shuffle
    #[arg(long, default_value_t = Config::DEFAULT.seed)]
    pub seed: u64,
    /// How --strategy tpu's compiled step rounds: f64-sums (the same weights to the bit on any
    /// number of replicas), or f32 (the program jax.jit emits: faster, its last bits depend on
    /// the replica count, which long runs grow past the checks' limits)
    #[arg(long, value_enum, default_value_t = Config::DEFAULT.tpu_arithmetic)]
    pub tpu_arithmetic: StepArithmetic,
    /// Where the loss curve PNG goes [default: target/demo/loss.png]
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Seconds a replica or worker waits for the others before the step fails; with --workers,
    /// a frozen worker ends the job this long after it stopped, with an error naming it
    #[arg(long, value_name = "SECS", default_value_t = Config::DEFAULT.deadline.as_secs_f64(), value_parser = seconds)]
    pub deadline: f64,
    /// Makes the run resumable (candle classifier): the chief writes a checkpoint (the model,
    /// its optimizer's state and update count, the input position, the loss history) into DIR
    /// every --checkpoint-every steps, and the demo started again with the same arguments goes
    /// on from the newest good one there
    #[arg(long, value_name = "DIR")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Steps between two checkpoints
    #[arg(long, value_name = "N", default_value_t = DEFAULT_CHECKPOINT_EVERY, value_parser = positive_u64, requires = "checkpoint_dir")]
    pub checkpoint_every: u64,
}

/// A whole number of steps above 0.
fn positive_u64(value: &str) -> Result<u64, String> {
    positive(value).map(|n| n as u64)
}

/// A whole number of steps, 0 included.
fn steps_u64(value: &str) -> Result<u64, String> {
    value
        .parse::<u64>()
        .map_err(|_| format!("a whole number of steps (0 or more) is needed, got '{value}'"))
}

/// A whole number, 0 included.
fn steps_usize(value: &str) -> Result<usize, String> {
    steps_u64(value).map(|n| n as usize)
}

/// A finite number ≥ 0, in f64.
fn non_negative_f64(value: &str) -> Result<f64, String> {
    value
        .parse::<f64>()
        .ok()
        .filter(|x| x.is_finite() && *x >= 0.0)
        .ok_or_else(|| format!("a number ≥ 0 is needed, got '{value}'"))
}

/// A finite number above 0, in f64.
fn positive_f64(value: &str) -> Result<f64, String> {
    value
        .parse::<f64>()
        .ok()
        .filter(|x| x.is_finite() && *x > 0.0)
        .ok_or_else(|| format!("a number above 0 is needed, got '{value}'"))
}

/// A number of seconds the strategies accept as a deadline: at least 0.1, finite.
fn seconds(value: &str) -> Result<f64, String> {
    value
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.1 && *s <= 1e9)
        .ok_or_else(|| format!("a number of seconds from 0.1 on is needed, got '{value}'"))
}

/// A whole number above 0.
fn positive(value: &str) -> Result<usize, String> {
    value
        .parse::<usize>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("a positive whole number is needed, got '{value}'"))
}

/// A finite number ≥ 0.
fn non_negative(value: &str) -> Result<f32, String> {
    value
        .parse::<f32>()
        .ok()
        .filter(|x| x.is_finite() && *x >= 0.0)
        .ok_or_else(|| format!("a number ≥ 0 is needed, got '{value}'"))
}

/// Parses and checks the demo's arguments (without the program name). `--help` comes back as
/// an error whose text is the help.
pub fn parse_args<I, T>(args: I) -> Result<Args>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let program = std::iter::once(OsString::from("demo"));
    let options = Options::try_parse_from(program.chain(args.into_iter().map(Into::into)))?;
    options.check()
}

impl Options {
    /// The checks that involve more than one option, and the device list.
    pub fn check(self) -> Result<Args> {
        if self.model == ModelKind::Gpt {
            return self.check_gpt();
        }
        let gpt_only = [
            ("--layers", self.layers.is_some()),
            ("--embd", self.embd.is_some()),
            ("--heads", self.heads.is_some()),
            ("--block", self.block.is_some()),
            ("--sample", self.sample.is_some()),
        ];
        if let Some((flag, _)) = gpt_only.iter().find(|(_, given)| *given) {
            bail!("{flag} is the GPT's: add --model gpt, or drop {flag}");
        }
        let warmup = self.warmup.unwrap_or(0);
        if let Some(momentum) = self.momentum {
            ensure!(
                momentum < 1.0,
                "--momentum must be below 1 (got {momentum}): with 1 or more the steps never shrink"
            );
        }
        let framework = self.framework.unwrap_or(match self.strategy {
            StrategyKind::Tpu => Framework::Native,
            StrategyKind::Mirrored => Framework::Candle,
        });
        if framework == Framework::Candle && self.strategy == StrategyKind::Tpu {
            bail!(
                "--framework candle trains on MirroredStrategy: candle steps are Rust code, \
                 which TpuStrategy's compiled programs cannot trace; drop --strategy tpu"
            );
        }
        let defaults = match framework {
            Framework::Native => {
                let candle_only = [
                    ("--optimizer", self.optimizer.is_some()),
                    ("--weight-decay", self.weight_decay.is_some()),
                    ("--warmup", warmup != 0),
                    ("--clip-norm", self.clip_norm.is_some()),
                ];
                if let Some((flag, _)) = candle_only.iter().find(|(_, given)| *given) {
                    bail!(
                        "{flag} is the candle classifier's; the native MLP (--framework native, \
                         and --strategy tpu's) trains with SGD and --momentum: drop {flag}"
                    );
                }
                Config::DEFAULT
            }
            Framework::Candle => {
                ensure!(
                    self.momentum.is_none(),
                    "--momentum is the native MLP's; the candle classifier trains with \
                     --optimizer sgd (plain SGD) or adamw (add --framework native to use it)"
                );
                crate::candle::defaults_for(self.optimizer.unwrap_or_default())
            }
        };
        if self.checkpoint_dir.is_some() && framework != Framework::Candle {
            bail!(
                "--checkpoint-dir resumes the candle classifier; the native MLP and --strategy \
                 tpu do not checkpoint (drop --framework native, or --checkpoint-dir)"
            );
        }
        let steps = self.steps.unwrap_or(defaults.steps);
        let learning_rate = self.lr.unwrap_or(defaults.learning_rate);
        if warmup > 0 {
            ensure!(
                warmup < steps as u64,
                "--warmup {warmup} must be below --steps ({steps}): the learning rate rises over \
                 the warmup, then falls to 0 at the last step (0 keeps it constant)"
            );
            ensure!(
                learning_rate > 0.0,
                "--warmup needs an --lr above 0: the rate it rises to (got --lr {learning_rate})"
            );
        }
        let batch = self.batch.unwrap_or(defaults.global_batch);
        let devices = self.devices.as_deref().map(parse_devices).transpose()?;
        if self.strategy == StrategyKind::Tpu && devices.is_some() {
            bail!(
                "--strategy tpu puts one replica on each device of the PJRT plugin; choose how \
                 many with --replicas N instead of --devices"
            );
        }
        let devices = match (devices, self.replicas) {
            (Some(devices), Some(n)) if devices.len() != n => bail!(
                "--replicas {n} disagrees with --devices, which lists {} devices; give one of them",
                devices.len()
            ),
            (Some(devices), _) => devices,
            (None, n) => Config::on_cpus(n.unwrap_or(2)).devices,
        };
        ensure!(
            batch >= devices.len(),
            "--batch {} gives some of the {} replicas no rows at all; use a batch of at least one \
             row per replica",
            batch,
            devices.len()
        );
        Ok(Args {
            gpt: None,
            config: Config {
                steps,
                global_batch: batch,
                learning_rate,
                momentum: self.momentum.unwrap_or(defaults.momentum),
                optimizer: defaults.optimizer,
                weight_decay: self.weight_decay.unwrap_or(defaults.weight_decay),
                warmup,
                clip_norm: self.clip_norm,
                hidden: self.hidden.unwrap_or(defaults.hidden),
                seed: self.seed,
                tpu_arithmetic: self.tpu_arithmetic,
                deadline: std::time::Duration::from_secs_f64(self.deadline),
                ..Config::new(devices)
            },
            strategy: self.strategy,
            framework,
            plot: self.plot,
            checkpoint_dir: self.checkpoint_dir,
            checkpoint_every: self.checkpoint_every,
        })
    }
}

impl Options {
    /// `--model gpt`'s checks: the options it does not take are refused, naming what to use.
    fn check_gpt(self) -> Result<Args> {
        let mlp_only = [
            ("--framework", self.framework.is_some()),
            ("--strategy tpu", self.strategy == StrategyKind::Tpu),
            ("--devices", self.devices.is_some()),
            ("--momentum", self.momentum.is_some()),
            ("--hidden", self.hidden.is_some()),
            ("--plot", self.plot.is_some()),
            (
                "--tpu-arithmetic",
                self.tpu_arithmetic != Config::DEFAULT.tpu_arithmetic,
            ),
        ];
        if let Some((flag, _)) = mlp_only.iter().find(|(_, given)| *given) {
            bail!(
                "{flag} is the wine-quality MLP's; --model gpt trains the GPT with \
                 distribute-candle on --replicas N CPU replicas: drop {flag}"
            );
        }
        let replicas = self.replicas.unwrap_or(2);
        let embd = self.embd.unwrap_or(64);
        let heads = self.heads.unwrap_or(4);
        ensure!(
            embd.is_multiple_of(heads),
            "--embd {embd} is not a multiple of --heads {heads}: each head takes an equal share \
             of the width"
        );
        if let Some(batch) = self.batch {
            ensure!(
                batch >= replicas,
                "--batch {batch} gives some of the {replicas} replicas no window; use at least \
                 one window per replica"
            );
        }
        if let (Some(warmup), Some(steps)) = (self.warmup, self.steps) {
            ensure!(
                warmup == 0 || warmup < steps as u64,
                "--warmup {warmup} must be below --steps ({steps})"
            );
        }
        // The f32 that clap read, as the f64 the user wrote (0.003, not 0.003000000026).
        let lr = self
            .lr
            .map(|lr| lr.to_string().parse::<f64>())
            .transpose()?;
        let gpt = GptArgs {
            replicas,
            steps: self.steps,
            batch: self.batch,
            layers: self.layers,
            embd: self.embd,
            heads: self.heads,
            block: self.block,
            optimizer: self.optimizer,
            lr,
            weight_decay: self.weight_decay,
            warmup: self.warmup,
            clip_norm: self.clip_norm,
            seed: self.seed,
            deadline: std::time::Duration::from_secs_f64(self.deadline),
            checkpoints: self
                .checkpoint_dir
                .clone()
                .map(|dir| (dir, self.checkpoint_every)),
            sample: self.sample.unwrap_or(DEFAULT_SAMPLE),
        };
        Ok(Args {
            gpt: Some(gpt),
            config: Config::on_cpus(replicas),
            strategy: StrategyKind::Mirrored,
            framework: Framework::Candle,
            plot: None,
            checkpoint_dir: self.checkpoint_dir,
            checkpoint_every: self.checkpoint_every,
        })
    }
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
    let local = LocalDevices::new(&devices).context("--devices")?;
    // Messages name each device as the user spelled it.
    for (device, parsed) in devices.iter().zip(local.iter()) {
        match parsed.kind() {
            DeviceKind::Cpu => {}
            DeviceKind::Gpu => bail!(
                "device '{device}': the demo's MLP computes with its own loops in host memory and has \
                 no GPU kernels, so it will not run on the CPU under a GPU's name. GPU replicas \
                 (cargo features `cuda`/`nccl`) reduce GPU tensors; see `cargo xtask test-gpu`. \
                 Use CPU devices here, e.g. --devices /cpu:0,/cpu:1"
            ),
            DeviceKind::Tpu => bail!(
                "device '{device}': TPU replicas come with --strategy tpu, one per PJRT device; \
                 use --strategy tpu --replicas N"
            ),
            other => {
                bail!("device '{device}': give a CPU device such as /cpu:0 (device type: {other})")
            }
        }
    }
    Ok(devices)
}
