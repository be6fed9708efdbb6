//! [`Config`]: what to train and where, with the demo's defaults and tolerances, shared by every
//! front end (mirrored, TPU, candle, hand-rolled) and the command line.

/// The largest weight difference allowed between the N-replica and the 1-replica run.
pub const TOLERANCE: f32 = 1e-5;

/// The largest weight difference allowed between a TPU run and the mirrored run. Their values
/// round differently in the last bits: the compiled step uses XLA's f32 dot kernels and tanh
/// (or f64 ones, [`StepArithmetic`]) and fuses multiply-adds, while the mirrored replicas
/// use the model's own f32 kernels and tanh approximation (within 1.5 ulp). The last-bit
/// differences of each step are carried forward and grown by momentum SGD: about 1e-6 after
/// the default 2000 steps, 1.1e-5
/// after 6000 steps at lr 0.02 on 3 or 4 replicas. Real mistakes are far larger: without the
/// mask, 4 replicas of the short test ended 0.7 away from 1 replica.
pub const TPU_MIRRORED_TOLERANCE: f32 = 1e-4;

/// What to train, and where.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// One replica per device.
    pub devices: Vec<String>,
    /// Optimizer steps.
    pub steps: usize,
    /// Rows per step, over all replicas.
    pub global_batch: usize,
    /// The learning rate (with a [`Config::warmup`], the peak rate).
    pub learning_rate: f32,
    /// Momentum of SGD (0 for plain SGD); the native MLP's.
    pub momentum: f32,
    /// The candle classifier's optimizer (`--optimizer`).
    pub optimizer: OptimizerKind,
    /// The candle classifier's weight decay (`--weight-decay`): SGD's L2 penalty added to the
    /// gradient, AdamW's decoupled decay.
    pub weight_decay: f64,
    /// The candle classifier's warmup (`--warmup`): 0 keeps the learning rate constant; else
    /// it rises linearly over this many steps, then falls along a cosine to zero at the last
    /// step. Below [`Config::steps`].
    pub warmup: u64,
    /// The candle classifier's gradient clipping (`--clip-norm`): the all-reduced gradients
    /// scaled down to this global norm when above it.
    pub clip_norm: Option<f64>,
    /// Units of the hidden layer.
    pub hidden: usize,
    /// Seed of the validation split, the initial weights and the shuffle.
    pub seed: u64,
    /// Steps between two validation losses on the curve.
    pub eval_every: usize,
    /// Whether to draw a progress bar (indicatif hides it anyway when stderr is not a terminal).
    pub progress: bool,
    /// How `--strategy tpu`'s compiled step rounds (the mirrored path ignores it).
    pub tpu_arithmetic: StepArithmetic,
    /// How long any replica or worker waits for the others before the step fails (and, across
    /// workers, the job ends naming the one it waited for): `--deadline SECS`.
    pub deadline: std::time::Duration,
}

impl Config {
    /// The demo's defaults, on no devices yet: trains in about a second in release on 2 cores.
    /// The command line's defaults are these.
    pub const DEFAULT: Config = Config {
        devices: Vec::new(),
        steps: 2000,
        global_batch: 128,
        learning_rate: 0.01,
        momentum: 0.9,
        optimizer: OptimizerKind::Sgd,
        weight_decay: 0.0,
        warmup: 0,
        clip_norm: None,
        hidden: 32,
        seed: 7,
        eval_every: 50,
        progress: true,
        tpu_arithmetic: StepArithmetic::F64Sums,
        deadline: std::time::Duration::from_secs(300),
    };

    /// The demo's defaults on `devices`.
    pub fn new(devices: Vec<String>) -> Self {
        Config {
            devices,
            ..Config::DEFAULT
        }
    }

    /// The demo's defaults on `replicas` CPU replicas (`--replicas N`): `/cpu:0` … `/cpu:N-1`,
    /// spelled short as the report prints them (the strategies parse them into `LocalDevices`).
    pub fn on_cpus(replicas: usize) -> Self {
        Config::new((0..replicas).map(|r| format!("/cpu:{r}")).collect())
    }

    /// `MirroredStrategy` over [`Config::devices`], every wait bounded by [`Config::deadline`].
    pub fn mirrored_strategy(&self) -> anyhow::Result<distribute::prelude::MirroredStrategy> {
        use distribute::prelude::{MirroredConfig, MirroredStrategy};
        let config = MirroredConfig {
            deadline: self.deadline,
            ..MirroredConfig::default()
        };
        Ok(MirroredStrategy::with_config(&self.devices, config)?)
    }

    /// The same run on the first device alone: the reference the replicas must match.
    pub fn one_replica(&self) -> Self {
        Config {
            devices: self.devices[..1].to_vec(),
            ..self.clone()
        }
    }
}

/// How the compiled step rounds (`--tpu-arithmetic`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum StepArithmetic {
    /// Every value in f32, the program `jax.jit` emits for this model: XLA's f32 dot kernels
    /// and tanh, 2–3× faster than [`StepArithmetic::F64Sums`] with `--hidden 256 --batch
    /// 1024` here. The sums over a replica's rows round in f32 before the all-reduce adds the
    /// replicas' sums, so N replicas and one round the global batch's sums differently in the
    /// last bits, and momentum SGD grows those bits: 1 and 2 replicas ended 1.6e-6 apart after
    /// the default 2000 steps, within [`crate::TOLERANCE`], but 1.1e-4 apart after 10000,
    /// past it (and 1.2e-4 from MirroredStrategy, past [`crate::TPU_MIRRORED_TOLERANCE`]).
    F32,
    /// The forward dot products and tanh in f64 rounded once to f32, and the sums over rows
    /// and across replicas in f64, as the mirrored path sums them: the weights come out the
    /// same bits on 1, 2, 3 or 4 replicas, after 10000 steps or 6000 at lr 0.02 too. XLA's
    /// f64 products run several times slower than its f32 ones.
    #[default]
    F64Sums,
}

/// Which optimizer trains the candle classifier (`--optimizer`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum OptimizerKind {
    /// Plain SGD (`distribute_candle::Sgd` without momentum: candle-nn's `SGD` bit for bit);
    /// `--weight-decay` adds PyTorch's coupled L2 penalty to the gradient.
    #[default]
    Sgd,
    /// AdamW (`distribute_candle::AdamW`: PyTorch's, betas 0.9 and 0.999, eps 1e-8, decoupled
    /// weight decay), whose moments and step count the checkpoints hold.
    #[value(name = "adamw")]
    AdamW,
}

impl OptimizerKind {
    /// Its name in the report: `SGD`, `AdamW`.
    pub fn name(self) -> &'static str {
        match self {
            OptimizerKind::Sgd => "SGD",
            OptimizerKind::AdamW => "AdamW",
        }
    }
}
