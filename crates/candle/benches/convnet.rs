//! `cargo bench -p distribute-candle --bench convnet`: a second real model beside the MLP of
//! `benches/candle.rs` — the ConvNet of candle's `mnist-training` example (conv 1 → 32, 5×5,
//! max-pool 2, conv 32 → 64, 5×5, max-pool 2, flatten, linear 1024 → 1024, ReLU, dropout 0.5,
//! linear 1024 → 10), mean cross-entropy over a global batch of 64, AdamW with candle-nn's
//! default `ParamsAdamW` (lr 1e-3, the example's rate). The images are synthetic, made here
//! (deterministic: [`images`]), not MNIST: this machine cannot download data sets, and the
//! speed does not depend on the pixels.
//!
//! Cases, each in processes of their own (candle sizes its thread pools once per process),
//! alternating round by round, the median of each case's rounds printed as one JSON line:
//!
//! - a plain candle loop: no library, candle's default threads (all cores), the whole batch per
//!   step, candle-nn's `AdamW` and candle's own dropout (`candle_convnet_plain`);
//! - distribute-candle on 1 and 2 replicas of `MirroredStrategy` in one process, as a user's
//!   program (the distributed dataset with its prefetch thread, `CpuThreads::Auto`,
//!   `ReplicaStep::dropout` and `backward_step`, distribute-candle's `AdamW`):
//!
//! `{"bench":"candle_convnet","replicas","workers":1,"threads_per_replica","steps_per_s",
//! "speedup_vs_1","vs_plain_candle","split_ms":{"forward","backward_step","input","rest"}}`
//!
//! - 2 processes at once, each 1 replica on 1 thread training on half the batch with nothing
//!   exchanged (`candle_convnet_processes_unsynced`): what 2 workers under `mpirun` could reach
//!   at most on this machine (they also wait for each other and all-reduce every step), the
//!   yardstick of the in-process replicas (issue 38), with `vs_2_replicas`.
//!
//! Ratios (`speedup_vs_1`, `vs_plain_candle`, `vs_2_replicas`) are throughput ratios, the median
//! over the rounds of each round's ratio (the two ran back to back); a case of several processes
//! counts its slowest. `split_ms` is replica 0's mean step: its forward pass with the loss,
//! `backward_step` (backward, the gradient all-reduce with the wait for the slower replica, the
//! optimizer), waiting for input on the calling thread, and the rest of `run`.
//!
//! Workers under `mpirun` are not a case here: `cargo xtask bench candle` runs its multi-worker
//! case from an example built with the feature `mpi` (its executable path is known, a bench's
//! is not), and the ConvNet has no such example.
//!
//! Without `--bench` (as `cargo test --all-targets` runs it) every case runs once for 2 steps
//! (after 1 unmeasured), so the bench cannot rot.

use std::error::Error;
use std::num::NonZeroUsize;
use std::process::{Command, Stdio};
use std::time::Instant;

use candle_core::{D, Device, Tensor, Var};
use candle_nn::{Conv2d, Linear, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use distribute_candle::{AdamW, Config, CpuThreads, DataParallel, StepError};
use distribute_device_spec::LocalDevices;
use distribute_input::{Dataset, InputOptions};
use distribute_mirrored::MirroredStrategy;
use distribute_strategy::Strategy;
use distribute_tensor::Tensor as HostTensor;
use distribute_values::ReduceOp;

/// The variable that makes this binary run one case and print its result: the case as
/// `replicas:threads:steps:batch` ([`Case::encode`]).
const CHILD: &str = "DISTRIBUTE_CANDLE_CONVNET_CASE";

/// Side of the square single-channel images.
const SIDE: usize = 28;
/// Classes.
const CLASSES: usize = 10;
/// The global batch (the example's `BSIZE`).
const GLOBAL_BATCH: usize = 64;
/// Synthetic images: 32 batches, repeated.
const ROWS: usize = 2048;
/// Dropout's rate after the first fully connected layer.
const DROPOUT: f32 = 0.5;
/// Steps before the clock starts; in a short run, half its steps.
const WARMUP: usize = 3;

/// candle's `mnist-training` ConvNet (its variables named as there: `c1`, `c2`, `fc1`, `fc2`).
struct ConvNet {
    c1: Conv2d,
    c2: Conv2d,
    fc1: Linear,
    fc2: Linear,
}

impl ConvNet {
    /// The layers from `vb`, with candle-nn's default initialisers.
    fn new(vb: VarBuilder) -> candle_core::Result<ConvNet> {
        Ok(ConvNet {
            c1: candle_nn::conv2d(1, 32, 5, Default::default(), vb.pp("c1"))?,
            c2: candle_nn::conv2d(32, 64, 5, Default::default(), vb.pp("c2"))?,
            fc1: candle_nn::linear(1024, 1024, vb.pp("fc1"))?,
            fc2: candle_nn::linear(1024, CLASSES, vb.pp("fc2"))?,
        })
    }

    /// The logits of `images` (`[rows, 1, 28, 28]`) in training, `dropout` applied after the
    /// first fully connected layer's ReLU.
    fn forward<E>(
        &self,
        images: &Tensor,
        dropout: impl FnOnce(&Tensor) -> Result<Tensor, E>,
    ) -> Result<Tensor, E>
    where
        E: From<candle_core::Error>,
    {
        let hidden = images
            .apply(&self.c1)?
            .max_pool2d(2)?
            .apply(&self.c2)?
            .max_pool2d(2)?
            .flatten_from(1)?
            .apply(&self.fc1)?
            .relu()?;
        Ok(dropout(&hidden)?.apply(&self.fc2)?)
    }
}

/// The sum of the rows' negative log-likelihoods over the global batch: each replica's share
/// of the global mean, so that summing the replicas' gradients gives the whole batch's.
fn loss(logits: &Tensor, labels: &Tensor) -> candle_core::Result<Tensor> {
    let log_p = candle_nn::ops::log_softmax(logits, D::Minus1)?;
    log_p.gather(&labels.unsqueeze(1)?, 1)?.sum_all()? * (-1.0 / GLOBAL_BATCH as f64)
}

/// [`ROWS`] synthetic images and their labels (i64: distribute's tensors have no u8 or u32),
/// the same on every run: image `i` has label `i % 10`, a bright 8×8 square at its class's
/// place on a 4 × 3 grid, over noise in `[0, 0.5)` from a fixed-seed SplitMix64.
fn images() -> (Vec<f32>, Vec<i64>) {
    let mut state = 0x5eed_u64;
    let mut noise = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32 * 0.5
    };
    let mut pixels = Vec::with_capacity(ROWS * SIDE * SIDE);
    let mut labels = Vec::with_capacity(ROWS);
    for i in 0..ROWS {
        let class = i % CLASSES;
        let (top, left) = (2 + (class / 4) * 9, 2 + (class % 4) * 6);
        for y in 0..SIDE {
            for x in 0..SIDE {
                let inside = (top..top + 8).contains(&y) && (left..left + 8).contains(&x);
                pixels.push(noise() + if inside { 1.0 } else { 0.0 });
            }
        }
        labels.push(class as i64);
    }
    (pixels, labels)
}

/// One case: what its child processes train.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Case {
    /// Replicas per process; 0 is the plain candle loop.
    replicas: usize,
    /// Threads per replica; 0 is `CpuThreads::Auto`.
    threads: usize,
    /// Processes started at once, each training on `GLOBAL_BATCH / processes` rows per step
    /// with no exchange between them.
    processes: usize,
}

impl Case {
    /// `replicas` replicas of `threads` threads in one process.
    const fn one_process(replicas: usize, threads: usize) -> Case {
        Case {
            replicas,
            threads,
            processes: 1,
        }
    }

    /// `replicas:threads:steps:batch`, as [`CHILD`] carries it to each process: `batch` is the
    /// rows a step takes in the process.
    fn encode(&self, steps: usize) -> String {
        let batch = GLOBAL_BATCH / self.processes;
        format!("{}:{}:{steps}:{batch}", self.replicas, self.threads)
    }

    /// One process's case, its steps and the rows a step takes from [`encode`](Self::encode)'s
    /// text.
    fn decode(text: &str) -> Result<(Case, usize, usize), Box<dyn Error>> {
        let bad = || format!("the case is replicas:threads:steps:batch, not {text:?}");
        let [replicas, threads, steps, batch] = text.split(':').collect::<Vec<_>>()[..] else {
            return Err(bad().into());
        };
        let number = |s: &str| s.parse::<usize>().map_err(|_| bad());
        let case = Case::one_process(number(replicas)?, number(threads)?);
        let batch = number(batch)?;
        if batch == 0 || batch > GLOBAL_BATCH {
            return Err(bad().into());
        }
        Ok((case, number(steps)?, batch))
    }
}

/// One case's measurement: replica 0's mean step, in milliseconds.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
struct Measured {
    steps_per_s: f64,
    threads_per_replica: usize,
    forward_ms: f64,
    backward_step_ms: f64,
    input_ms: f64,
    rest_ms: f64,
}

impl Measured {
    /// As the child prints it.
    fn to_json(self) -> serde_json::Value {
        serde_json::to_value(self).expect("a measurement is plain numbers")
    }

    /// What [`to_json`](Self::to_json) printed.
    fn from_json(text: &str) -> Result<Measured, Box<dyn Error>> {
        serde_json::from_str(text).map_err(|e| format!("the case printed {text:?}: {e}").into())
    }
}

/// The median of `values` (the upper one of an even count).
fn median(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut sorted: Vec<f64> = values.into_iter().collect();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
}

fn main() -> Result<(), Box<dyn Error>> {
    if let Ok(case) = std::env::var(CHILD) {
        let (case, steps, batch) = Case::decode(&case)?;
        let m = match case.replicas {
            0 => plain(steps, batch)?,
            _ => ours(&case, steps, batch)?,
        };
        println!("{}", m.to_json());
        return Ok(());
    }
    let full = std::env::args().any(|a| a == "--bench");
    let (rounds, steps) = if full { (5, 30) } else { (1, 2) };
    const PLAIN: usize = 0;
    const ONE: usize = 1;
    const TWO: usize = 2;
    const PROCESSES: usize = 3;
    let cases = [
        Case::one_process(0, 0),
        Case::one_process(1, 0),
        Case::one_process(2, 0),
        Case {
            processes: 2,
            ..Case::one_process(1, 1)
        },
    ];
    let mut results: Vec<Vec<Measured>> = vec![Vec::new(); cases.len()];
    for _ in 0..rounds {
        for (i, case) in cases.iter().enumerate() {
            results[i].push(run_case(case, steps)?);
        }
    }
    let median_run = |runs: &[Measured]| -> Measured {
        let mut sorted = runs.to_vec();
        sorted.sort_by(|a, b| a.steps_per_s.total_cmp(&b.steps_per_s));
        sorted[sorted.len() / 2]
    };
    // The median over the rounds of this case's throughput over the baseline's in each round.
    let vs = |case: usize, baseline: usize| {
        median(
            results[case]
                .iter()
                .zip(&results[baseline])
                .map(|(c, b)| c.steps_per_s / b.steps_per_s),
        )
    };
    let plain = median_run(&results[PLAIN]);
    println!(
        "{}",
        serde_json::json!({
            "bench": "candle_convnet_plain", "replicas": 1, "workers": 1,
            "threads": plain.threads_per_replica, "steps_per_s": plain.steps_per_s,
            "split_ms": { "forward": plain.forward_ms, "backward_step": plain.backward_step_ms },
            "rounds": rounds, "steps": steps,
        })
    );
    for i in [ONE, TWO] {
        let m = median_run(&results[i]);
        println!(
            "{}",
            serde_json::json!({
                "bench": "candle_convnet", "replicas": cases[i].replicas, "workers": 1,
                "threads_per_replica": m.threads_per_replica,
                "steps_per_s": m.steps_per_s,
                "speedup_vs_1": vs(i, ONE),
                "vs_plain_candle": vs(i, PLAIN),
                "split_ms": {
                    "forward": m.forward_ms, "backward_step": m.backward_step_ms,
                    "input": m.input_ms, "rest": m.rest_ms,
                },
                "rounds": rounds, "steps": steps,
            })
        );
    }
    let m = median_run(&results[PROCESSES]);
    println!(
        "{}",
        serde_json::json!({
            "bench": "candle_convnet_processes_unsynced", "processes": cases[PROCESSES].processes,
            "replicas_per_process": 1, "threads_per_replica": m.threads_per_replica,
            "steps_per_s": m.steps_per_s,
            "vs_2_replicas": vs(PROCESSES, TWO),
            "vs_plain_candle": vs(PROCESSES, PLAIN),
            "split_ms": { "forward": m.forward_ms, "backward_step": m.backward_step_ms },
            "rounds": rounds, "steps": steps,
        })
    );
    Ok(())
}

/// Runs `case`: its processes at once, each a fresh process of this binary; the slowest
/// process's measurement (a synchronised job would go at its pace).
fn run_case(case: &Case, steps: usize) -> Result<Measured, Box<dyn Error>> {
    let encoded = case.encode(steps);
    let children = (0..case.processes)
        .map(|_| {
            Command::new(std::env::current_exe()?)
                .env(CHILD, &encoded)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut slowest: Option<Measured> = None;
    for child in children {
        let out = child.wait_with_output()?;
        if !out.status.success() {
            return Err(format!(
                "case {encoded} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            )
            .into());
        }
        let m = Measured::from_json(&String::from_utf8(out.stdout)?)?;
        if slowest.is_none_or(|s| m.steps_per_s < s.steps_per_s) {
            slowest = Some(m);
        }
    }
    slowest.ok_or_else(|| "a case with no process".into())
}

/// The ConvNet trained with distribute-candle on `case.replicas` CPU replicas of
/// `MirroredStrategy`, `case.threads` threads each (0: `CpuThreads::Auto`).
fn ours(case: &Case, steps: usize, batch: usize) -> Result<Measured, Box<dyn Error>> {
    let strategy = MirroredStrategy::new(LocalDevices::cpus(case.replicas))?;
    let config = Config {
        threads: NonZeroUsize::new(case.threads).map_or(CpuThreads::Auto, CpuThreads::PerReplica),
        ..Config::default()
    };
    let model = DataParallel::new(&strategy, config, ConvNet::new, |vars: Vec<Var>| {
        AdamW::new(vars, ParamsAdamW::default())
    })?;
    let (pixels, labels) = images();
    let warmup = WARMUP.min(steps / 2);
    let total = steps + warmup;
    let dataset = Dataset::from_tensors((
        HostTensor::from_vec("/cpu:0", &[ROWS, 1, SIDE, SIDE], pixels)?,
        HostTensor::from_vec("/cpu:0", &[ROWS], labels)?,
    ))?
    .repeat((total * batch).div_ceil(ROWS))?
    .batch(batch, false)?;
    let dataset = strategy.distribute_dataset(dataset, InputOptions::default())?;
    let mut batches = dataset.iter();
    let (mut forward, mut backward_step, mut input) = (0.0, 0.0, 0.0);
    let mut start = Instant::now();
    for step in 0..total {
        if step == warmup {
            (forward, backward_step, input) = (0.0, 0.0, 0.0);
            start = Instant::now();
        }
        let waited = Instant::now();
        let inputs = batches.next().ok_or("the dataset ended early")??;
        input += waited.elapsed().as_secs_f64();
        let times = model.run(&inputs, |replica, (images, labels)| {
            let t0 = Instant::now();
            let logits = replica
                .model()
                .forward(&images, |xs| replica.dropout(xs, DROPOUT))?;
            let loss = loss(&logits, &labels)?;
            let t1 = Instant::now();
            replica.backward_step(&loss, ReduceOp::Sum)?;
            Ok::<_, StepError>((t1 - t0, t1.elapsed()))
        })?;
        forward += times[0].0.as_secs_f64();
        backward_step += times[0].1.as_secs_f64();
    }
    let wall = start.elapsed().as_secs_f64();
    model.check_in_sync()?;
    let per_step = |s: f64| s * 1e3 / steps as f64;
    Ok(Measured {
        steps_per_s: steps as f64 / wall,
        threads_per_replica: model.threads_per_replica().unwrap_or(0),
        forward_ms: per_step(forward),
        backward_step_ms: per_step(backward_step),
        input_ms: per_step(input),
        rest_ms: per_step(wall - forward - backward_step - input),
    })
}

/// The same model and steps as a plain candle loop: one process, candle's default threads (all
/// cores), the whole global batch per step, candle-nn's `AdamW` and candle's own dropout.
fn plain(steps: usize, batch: usize) -> Result<Measured, Box<dyn Error>> {
    let varmap = VarMap::new();
    let model = ConvNet::new(VarBuilder::from_varmap(
        &varmap,
        candle_core::DType::F32,
        &Device::Cpu,
    ))?;
    let mut adamw = candle_nn::AdamW::new(varmap.all_vars(), ParamsAdamW::default())?;
    let (pixels, labels) = images();
    let pixels = Tensor::from_vec(pixels, (ROWS, 1, SIDE, SIDE), &Device::Cpu)?;
    let labels = Tensor::from_vec(labels, ROWS, &Device::Cpu)?;
    let (mut forward, mut backward_step) = (0.0, 0.0);
    let mut start = Instant::now();
    let warmup = WARMUP.min(steps / 2);
    for step in 0..steps + warmup {
        if step == warmup {
            (forward, backward_step) = (0.0, 0.0);
            start = Instant::now();
        }
        let first = step * batch % ROWS;
        let t0 = Instant::now();
        let images = pixels.narrow(0, first, batch)?;
        let ys = labels.narrow(0, first, batch)?;
        let logits = model.forward(&images, |xs| candle_nn::ops::dropout(xs, DROPOUT))?;
        let loss = loss(&logits, &ys)?;
        let t1 = Instant::now();
        adamw.backward_step(&loss)?;
        forward += (t1 - t0).as_secs_f64();
        backward_step += t1.elapsed().as_secs_f64();
    }
    let wall = start.elapsed().as_secs_f64();
    let per_step = |s: f64| s * 1e3 / steps as f64;
    Ok(Measured {
        steps_per_s: steps as f64 / wall,
        threads_per_replica: candle_core::utils::get_num_threads(),
        forward_ms: per_step(forward),
        backward_step_ms: per_step(backward_step),
        ..Measured::default()
    })
}
