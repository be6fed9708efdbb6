//! `cargo xtask demo`: the whole stack training a real model, data-parallel, end to end. An
//! application on top of the `distribute` facade (nothing in the workspace depends on it).
//!
//! A multilayer perceptron (11 inputs → `--hidden` tanh units → 1 output, backprop written as
//! fused loops over contiguous rows, [`model`]) learns the quality score of red wines
//! (`linfa-datasets`' wine-quality data, 1599 rows) from their 11 measurements, with a fixed
//! 20 % held out for validation ([`data`]). Every layer of `distribute` takes part:
//!
//! - the input crate's `DistributedDataset` shuffles (seeded), repeats and cuts each global
//!   batch into per-replica batches: replica `r` gets the `r`-th contiguous chunk, prefetched
//!   on a background thread;
//! - the weights are mirrored variables made by `strategy.create_variable`, one per layer weight
//!   and bias, plus one momentum slot each;
//! - each replica computes the gradient sums of its rows, one fused `all_reduce` adds them up,
//!   and a `merge_call` applies SGD with momentum through the cross-replica `update_with`, as
//!   TF's optimizers do ([`mirrored`]).
//!
//! The same training then runs on one replica with the same global batch and data order; the
//! largest difference between the two runs' weights must be at most [`TOLERANCE`], or the demo
//! fails ([`report`]).
//!
//! [`hand_rolled`] is the same training written by hand, without the library: the floor
//! `cargo xtask bench strategy` measures the strategy against.
//!
//! `cargo xtask demo --workers W [--replicas R]` (feature `mpi`) starts the demo as W worker
//! processes under `mpirun`, training with `MultiWorkerMirroredStrategy` (R replicas each); the
//! chief reports the time per step with the cross-worker communication as its own part, and
//! checks the weights against one process with one replica ([`TOLERANCE`]) and that every copy
//! on every worker has the same bits (`report::run_multi_worker`).
//!
//! `--strategy tpu` trains the same model from the same batches with `TpuStrategy`, one replica
//! per PJRT device, the whole step compiled once ([`tpu`]). It is checked against one TPU
//! replica ([`TOLERANCE`]) and against MirroredStrategy ([`TPU_MIRRORED_TOLERANCE`]).
//!
//! `--framework candle` trains a candle classifier of the quality class instead, with
//! `distribute-candle` on `MirroredStrategy` ([`candle`]), checked the same way against one
//! replica ([`candle::CANDLE_TOLERANCE`]).
//!
//! ```text
//! cargo xtask demo [--framework native|candle] [--replicas N | --devices /cpu:0,/cpu:1,...] [--strategy mirrored|tpu]
//!                  [--steps S] [--batch B] [--lr LR] [--momentum M] [--hidden H] [--seed SEED]
//!                  [--tpu-arithmetic f32|f64-sums] [--plot FILE.png]
//!                  [--checkpoint-dir DIR [--checkpoint-every N]]
//! ```
//!
//! `--checkpoint-dir DIR` (candle classifier) makes the run resumable: the chief writes a
//! checkpoint every `--checkpoint-every N` steps ([`checkpoint`]), and the demo started again
//! with the same arguments goes on from the newest good one, to the bits of a run that never
//! stopped on the same worker and replica counts.

pub mod candle;
pub mod checkpoint;
pub mod cli;
pub mod data;
pub mod hand_rolled;
pub mod mirrored;
pub mod model;
pub mod report;
pub mod tpu;

pub use cli::{Args, Framework, StrategyKind, parse_args};

/// Whether `mpirun` (Open MPI's, or an MPICH-style launcher) started this process: the demo is
/// then one worker of `cargo xtask demo --workers W`.
pub fn started_by_mpirun() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"]
        .iter()
        .any(|name| std::env::var_os(name).is_some())
}
pub use report::run;

/// The largest weight difference allowed between the N-replica and the 1-replica run.
pub const TOLERANCE: f32 = 1e-5;

/// The largest weight difference allowed between a TPU run and the mirrored run. Their values
/// round differently in the last bits: the compiled step uses XLA's f32 dot kernels and tanh
/// (or f64 ones, [`tpu::StepArithmetic`]) and fuses multiply-adds, while the mirrored replicas
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
    /// SGD learning rate.
    pub learning_rate: f32,
    /// Momentum of SGD (0 for plain SGD).
    pub momentum: f32,
    /// Units of the hidden layer.
    pub hidden: usize,
    /// Seed of the validation split, the initial weights and the shuffle.
    pub seed: u64,
    /// Steps between two validation losses on the curve.
    pub eval_every: usize,
    /// Whether to draw a progress bar (indicatif hides it anyway when stderr is not a terminal).
    pub progress: bool,
    /// How `--strategy tpu`'s compiled step rounds (the mirrored path ignores it).
    pub tpu_arithmetic: tpu::StepArithmetic,
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
        hidden: 32,
        seed: 7,
        eval_every: 50,
        progress: true,
        tpu_arithmetic: tpu::StepArithmetic::F64Sums,
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
