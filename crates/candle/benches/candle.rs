//! `cargo xtask bench candle`: the reference candle MLP (`candle_mlp`: 64 → 512 → 512 → 10,
//! global batch 512, SGD) trained as a user's program would — the distributed dataset with its
//! prefetch thread, a progress bar ticking on its own thread — on 1 and 2 replicas of
//! `MirroredStrategy` with `distribute-candle`, and as a plain candle loop on all cores (no
//! library) in the same run, and 1 replica on 1 thread (how the replicas scale apart from
//! candle's own threads: `vs_1_replica_1_thread`). Each case runs in its own process (candle sizes its thread pools
//! once per process, as a user's program would configure it once), the cases alternate, and
//! each prints the median of its rounds as one JSON line:
//!
//! `{"bench":"candle_mlp","replicas","workers","threads_per_replica","steps_per_s",
//! "speedup_vs_1","vs_plain_candle","split_ms":{"compute","all_reduce","input","rest"},
//! "library_share"}`
//!
//! `split_ms` is replica 0's mean step: its candle kernels (forward, backward, optimizer), the
//! gradient all-reduce (including the wait for the slower replica), waiting for input on the
//! calling thread, and the rest of `run`; `all_reduce_last_arrival` is the all-reduce of the
//! replica that arrived last in each step, which waited for nobody (packing, the collective,
//! unpacking). `library_share` is everything but replica 0's candle kernels over the step,
//! waits for the slower replica included; `library_own_share` is the last arrival's all-reduce
//! and the input wait over the step: the library's own work. A `peer` line quotes PyTorch DDP's figures on the same model and
//! machine (measured once for issue 24, not in this run: torch is not installed here).
//!
//! The training state's costs (issue 38), on 2 replicas, the same model and loop, alternating
//! round by round with the cases above; each `vs_*` is a throughput ratio (this case's steps/s
//! over its baseline's, as `vs_plain_candle`: below 1 is slower), the median over the rounds of
//! each round's ratio (the two ran back to back). The step is the one above, written out
//! (backward, `all_reduce_gradients`, which clips, and the optimizer's `step`: what
//! `backward_step` does, bar counting updates, so a checkpoint's update count stays 0):
//!
//! `{"bench":"candle_mlp_adamw","replicas":2,"steps_per_s","vs_sgd","optimizer_ms",
//! "sgd_optimizer_ms"}`: AdamW (`distribute_candle::AdamW` with candle-nn's default
//! `ParamsAdamW`: lr 1e-3, betas 0.9 and 0.999, eps 1e-8, weight decay 0.01) in place of SGD;
//! `optimizer_ms` and `sgd_optimizer_ms` are replica 0's optimizer step alone, AdamW's and SGD's
//! (the AdamW step's cost is `1 / vs_sgd` SGD steps).
//!
//! `{"bench":"candle_mlp_clip","replicas":2,"clip_norm":1.0,"steps_per_s","vs_unclipped",
//! "clip_ms","clip_share","clipped_steps_share"}`: SGD with `Config::clip_norm = Some(1.0)`
//! against SGD without (the `candle_mlp` 2-replica case); `clip_ms` is what clipping adds to the
//! last arrival's all-reduce (the global norm and the scaling, median of the rounds'
//! differences), `clip_share` that over the unclipped step, and `clipped_steps_share` the share
//! of steps whose norm was above the limit (only those scale). The goal, clipping at most 2 % of
//! a step: `vs_unclipped` at least 0.98 and `clip_share` at most 0.02 (the direct measure, which
//! a busy machine's noise disturbs far less than the throughputs).
//!
//! `{"bench":"candle_mlp_bf16","replicas":2,"steps_per_s","vs_f32","peak_mib","f32_peak_mib"}`:
//! the 2-replica SGD case with `Precision::MixedBf16` (the model computes in bf16 over f32
//! master weights), its throughput over the f32 case's and both processes' peak resident memory
//! (`VmHWM`, MiB; every case's child prints its own).
//!
//! `{"bench":"candle_mlp_checkpoint_every_50","replicas":2,"optimizer":"adamw","every":50,
//! "keep":2,"checkpoints","steps_per_s","vs_no_checkpoints","checkpoint_ms","checkpoint_share"}`:
//! AdamW with a `Checkpoints` save (model, both moments, the input position) after every 50th
//! step into a temporary directory, keeping 2, against the same AdamW run without checkpoints;
//! `checkpoints` is the saves in each run's timed steps, `checkpoint_ms` the mean time of one
//! save over every round's, and `checkpoint_share` the time spent saving over the run's (the
//! median of the rounds'). The goal, checkpoints costing at most 3 %: `vs_no_checkpoints` at
//! least 0.97 and `checkpoint_share` at most 0.03 (again the direct measure).
//!
//! Without `--bench` (as `cargo test --all-targets` runs it) every case runs once for a few
//! steps (checkpointing every 2nd step), so the bench cannot rot.

#[path = "../examples/candle_mlp.rs"]
#[allow(dead_code)]
mod example;

use std::error::Error;
use std::num::NonZeroUsize;
use std::process::Command;
use std::time::{Duration, Instant};

use candle_core::{D, DType, Device, Tensor, Var};
use candle_nn::{Module, Optimizer, ParamsAdamW, SGD, VarBuilder, VarMap};
use distribute_candle::{AdamW, Config, CpuThreads, DataParallel, OptimizerState, Precision};
use distribute_device_spec::LocalDevices;
use distribute_input::{Dataset, InputOptions, InputPosition};
use distribute_mirrored::MirroredStrategy;
use distribute_strategy::{CheckpointOptions, Checkpoints, Strategy};
use distribute_tensor::Tensor as HostTensor;
use distribute_test_support::candle_mlp::{
    FEATURES, GLOBAL_BATCH, HIDDEN, LEARNING_RATE, ROWS, rows,
};
use distribute_values::ReduceOp;
use example::Mlp;
use indicatif::{ProgressBar, ProgressDrawTarget};

/// The variable that makes this binary run one case and print its result: the case as
/// `replicas:threads:steps:optimizer:clip_norm:checkpoint_every` ([`Case::encode`]).
const CHILD: &str = "DISTRIBUTE_CANDLE_BENCH_CASE";

/// The global norm the clipping case clips to.
const CLIP_NORM: f64 = 1.0;
/// Checkpoints the checkpointing case keeps.
const KEEP: usize = 2;

/// Which optimizer a case trains with.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Optim {
    /// candle-nn's `SGD` at the reference rate.
    Sgd,
    /// `distribute_candle::AdamW` with candle-nn's default `ParamsAdamW`.
    AdamW,
}

/// One case: what its child process trains.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Case {
    /// Replicas; 0 is the plain candle loop (no library, SGD).
    replicas: usize,
    /// Threads per replica; 0 is `CpuThreads::Auto`.
    threads: usize,
    optimizer: Optim,
    /// `Config::clip_norm`.
    clip_norm: Option<f64>,
    /// A checkpoint after every this many steps; 0: none.
    checkpoint_every: u64,
    /// bf16 mixed precision (`Precision::MixedBf16`) instead of f32.
    bf16: bool,
}

impl Case {
    /// SGD on `replicas` replicas of `threads` threads, no clipping, no checkpoints.
    const fn sgd(replicas: usize, threads: usize) -> Case {
        Case {
            replicas,
            threads,
            optimizer: Optim::Sgd,
            clip_norm: None,
            checkpoint_every: 0,
            bf16: false,
        }
    }

    /// `replicas:threads:steps:optimizer:clip_norm:checkpoint_every:precision`, as [`CHILD`]
    /// carries it: optimizer `sgd` or `adamw`, clip_norm `-` for none, checkpoint_every 0 for
    /// none, precision `f32` or `bf16` (`2:0:150:adamw:-:50:f32`).
    fn encode(&self, steps: usize) -> String {
        let optimizer = match self.optimizer {
            Optim::Sgd => "sgd",
            Optim::AdamW => "adamw",
        };
        let clip = self
            .clip_norm
            .map_or_else(|| "-".to_owned(), |c| c.to_string());
        let precision = if self.bf16 { "bf16" } else { "f32" };
        format!(
            "{}:{}:{steps}:{optimizer}:{clip}:{}:{precision}",
            self.replicas, self.threads, self.checkpoint_every
        )
    }

    /// The case and its steps from [`encode`](Self::encode)'s text.
    fn decode(text: &str) -> Result<(Case, usize), Box<dyn Error>> {
        let bad = || {
            format!(
                "the case is replicas:threads:steps:optimizer:clip_norm:checkpoint_every:\
                 precision, not {text:?}"
            )
        };
        let [replicas, threads, steps, optimizer, clip, every, precision] =
            text.split(':').collect::<Vec<_>>()[..]
        else {
            return Err(bad().into());
        };
        let case = Case {
            replicas: replicas.parse().map_err(|_| bad())?,
            threads: threads.parse().map_err(|_| bad())?,
            optimizer: match optimizer {
                "sgd" => Optim::Sgd,
                "adamw" => Optim::AdamW,
                _ => return Err(bad().into()),
            },
            clip_norm: match clip {
                "-" => None,
                c => Some(c.parse().map_err(|_| bad())?),
            },
            checkpoint_every: every.parse().map_err(|_| bad())?,
            bf16: match precision {
                "f32" => false,
                "bf16" => true,
                _ => return Err(bad().into()),
            },
        };
        if case.replicas == 0 && case != Case::sgd(0, case.threads) {
            return Err(format!("the plain candle loop is SGD alone, not {text:?}").into());
        }
        Ok((case, steps.parse().map_err(|_| bad())?))
    }
}

/// One case's measurement.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
struct Measured {
    steps_per_s: f64,
    threads_per_replica: usize,
    compute_ms: f64,
    /// Replica 0's optimizer step (part of `compute_ms`).
    optimizer_ms: f64,
    all_reduce_ms: f64,
    last_arrival_ms: f64,
    input_ms: f64,
    rest_ms: f64,
    /// Steps whose gradient norm was above `Config::clip_norm`, over the steps.
    clipped_share: f64,
    /// Checkpoints saved in the timed steps.
    checkpoints: usize,
    /// Their mean save time.
    checkpoint_ms: f64,
    /// The case's process's peak resident memory (`VmHWM`), MiB.
    peak_mib: f64,
}

impl Measured {
    /// The mean step.
    fn step_ms(&self) -> f64 {
        1e3 / self.steps_per_s
    }

    /// The share of the run spent saving checkpoints.
    fn checkpoint_share(&self, steps: usize) -> f64 {
        self.checkpoints as f64 * self.checkpoint_ms / (steps as f64 * self.step_ms())
    }

    /// As the child prints it.
    fn to_json(self) -> serde_json::Value {
        serde_json::to_value(self).expect("a measurement is plain numbers")
    }

    /// What [`to_json`](Self::to_json) printed.
    fn from_json(text: &str) -> Result<Measured, Box<dyn Error>> {
        serde_json::from_str(text).map_err(|e| format!("the case printed {text:?}: {e}").into())
    }
}

/// This process's peak resident memory (`VmHWM` of /proc/self/status), MiB; 0 where there is no
/// /proc.
fn peak_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
            let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib / 1024.0)
        })
        .unwrap_or(0.0)
}

/// The throughput of `case`'s run over `baseline`'s.
fn throughput(case: &Measured, baseline: &Measured) -> f64 {
    case.steps_per_s / baseline.steps_per_s
}

/// The median of `values` (the upper one of an even count).
fn median(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut sorted: Vec<f64> = values.into_iter().collect();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
}

fn main() -> Result<(), Box<dyn Error>> {
    if let Ok(case) = std::env::var(CHILD) {
        let (case, steps) = Case::decode(&case)?;
        let m = match (case.replicas, case.optimizer) {
            (0, _) => plain(steps)?,
            (_, Optim::Sgd) => ours(&case, steps, |vars| SGD::new(vars, LEARNING_RATE))?,
            (_, Optim::AdamW) => ours(&case, steps, |vars| {
                AdamW::new(vars, ParamsAdamW::default())
            })?,
        };
        let m = Measured {
            peak_mib: peak_mib(),
            ..m
        };
        println!("{}", m.to_json());
        return Ok(());
    }
    let full = std::env::args().any(|a| a == "--bench");
    // At least 150 steps, so that checkpointing every 50 writes 3 in the timed steps.
    let (rounds, steps, every) = if full { (5, 150, 50) } else { (1, 4, 2) };
    // 0 replicas is the plain candle loop; 1 replica on 1 thread shows how the replicas scale
    // apart from candle's own threads. The cases alternate round by round.
    const PLAIN: usize = 0;
    const ONE: usize = 1;
    const ONE_THREAD: usize = 2;
    const TWO: usize = 3;
    const ADAMW: usize = 4;
    const CLIP: usize = 5;
    const CHECKPOINT: usize = 6;
    const BF16: usize = 7;
    let cases = [
        Case::sgd(0, 0),
        Case::sgd(1, 0),
        Case::sgd(1, 1),
        Case::sgd(2, 0),
        Case {
            optimizer: Optim::AdamW,
            ..Case::sgd(2, 0)
        },
        Case {
            clip_norm: Some(CLIP_NORM),
            ..Case::sgd(2, 0)
        },
        Case {
            optimizer: Optim::AdamW,
            checkpoint_every: every,
            ..Case::sgd(2, 0)
        },
        Case {
            bf16: true,
            ..Case::sgd(2, 0)
        },
    ];
    let mut results: Vec<Vec<Measured>> = vec![Vec::new(); cases.len()];
    for _ in 0..rounds {
        for (i, case) in cases.iter().enumerate() {
            results[i].push(child(case, steps)?);
        }
    }
    let median_run = |runs: &[Measured]| -> Measured {
        let mut sorted = runs.to_vec();
        sorted.sort_by(|a, b| a.steps_per_s.total_cmp(&b.steps_per_s));
        sorted[sorted.len() / 2]
    };
    // The median over the rounds of `of(case's run, baseline's run)` in each round.
    let paired = |case: usize, baseline: usize, of: fn(&Measured, &Measured) -> f64| {
        median(
            results[case]
                .iter()
                .zip(&results[baseline])
                .map(|(c, b)| of(c, b)),
        )
    };
    let plain = median_run(&results[PLAIN]);
    let one = median_run(&results[ONE]);
    let one_thread = median_run(&results[ONE_THREAD]);
    println!(
        "{}",
        serde_json::json!({
            "bench": "candle_mlp_plain", "replicas": 1, "workers": 1,
            "threads": plain.threads_per_replica, "steps_per_s": plain.steps_per_s,
            "rounds": rounds, "steps": steps,
        })
    );
    for i in [ONE, ONE_THREAD, TWO] {
        let m = median_run(&results[i]);
        let step_ms = m.step_ms();
        println!(
            "{}",
            serde_json::json!({
                "bench": "candle_mlp", "replicas": cases[i].replicas, "workers": 1,
                "threads_per_replica": m.threads_per_replica,
                "steps_per_s": m.steps_per_s,
                "speedup_vs_1": m.steps_per_s / one.steps_per_s,
                "vs_1_replica_1_thread": m.steps_per_s / one_thread.steps_per_s,
                "vs_plain_candle": m.steps_per_s / plain.steps_per_s,
                "split_ms": {
                    "compute": m.compute_ms, "all_reduce": m.all_reduce_ms,
                    "input": m.input_ms, "rest": m.rest_ms,
                    "all_reduce_last_arrival": m.last_arrival_ms,
                },
                "library_share": 1.0 - m.compute_ms / step_ms,
                "library_own_share": (m.last_arrival_ms + m.input_ms) / step_ms,
                "rounds": rounds, "steps": steps,
            })
        );
    }
    let sgd = median_run(&results[TWO]);
    let adamw = median_run(&results[ADAMW]);
    println!(
        "{}",
        serde_json::json!({
            "bench": "candle_mlp_adamw", "replicas": cases[ADAMW].replicas, "workers": 1,
            "threads_per_replica": adamw.threads_per_replica,
            "steps_per_s": adamw.steps_per_s,
            "vs_sgd": paired(ADAMW, TWO, throughput),
            "optimizer_ms": adamw.optimizer_ms,
            "sgd_optimizer_ms": sgd.optimizer_ms,
            "rounds": rounds, "steps": steps,
        })
    );
    let clip = median_run(&results[CLIP]);
    let clip_ms = paired(CLIP, TWO, |c, b| c.last_arrival_ms - b.last_arrival_ms);
    println!(
        "{}",
        serde_json::json!({
            "bench": "candle_mlp_clip", "replicas": cases[CLIP].replicas, "workers": 1,
            "clip_norm": CLIP_NORM,
            "threads_per_replica": clip.threads_per_replica,
            "steps_per_s": clip.steps_per_s,
            "vs_unclipped": paired(CLIP, TWO, throughput),
            "clip_ms": clip_ms,
            "clip_share": clip_ms / sgd.step_ms(),
            "clipped_steps_share": clip.clipped_share,
            "rounds": rounds, "steps": steps,
        })
    );
    let saved = median_run(&results[CHECKPOINT]);
    let saves: usize = results[CHECKPOINT].iter().map(|m| m.checkpoints).sum();
    let save_ms: f64 = results[CHECKPOINT]
        .iter()
        .map(|m| m.checkpoints as f64 * m.checkpoint_ms)
        .sum();
    println!(
        "{}",
        serde_json::json!({
            "bench": format!("candle_mlp_checkpoint_every_{every}"),
            "replicas": cases[CHECKPOINT].replicas, "workers": 1,
            "optimizer": "adamw", "every": every, "keep": KEEP,
            "threads_per_replica": saved.threads_per_replica,
            "checkpoints": saved.checkpoints,
            "steps_per_s": saved.steps_per_s,
            "vs_no_checkpoints": paired(CHECKPOINT, ADAMW, throughput),
            "checkpoint_ms": save_ms / saves.max(1) as f64,
            "checkpoint_share": median(
                results[CHECKPOINT].iter().map(|m| m.checkpoint_share(steps))
            ),
            "rounds": rounds, "steps": steps,
        })
    );
    let bf16 = median_run(&results[BF16]);
    println!(
        "{}",
        serde_json::json!({
            "bench": "candle_mlp_bf16", "replicas": cases[BF16].replicas, "workers": 1,
            "precision": "bf16 over f32 masters",
            "threads_per_replica": bf16.threads_per_replica,
            "steps_per_s": bf16.steps_per_s,
            "vs_f32": paired(BF16, TWO, throughput),
            "peak_mib": bf16.peak_mib, "f32_peak_mib": sgd.peak_mib,
            "rounds": rounds, "steps": steps,
        })
    );
    println!(
        "{}",
        serde_json::json!({
            "bench": "candle_mlp_peer", "peer": "PyTorch 2.15 DDP (gloo), 2 processes x 1 thread",
            "steps_per_s_1": [85, 93], "steps_per_s_2": [86, 96], "speedup_vs_1": 1.0,
            "source": "issue 24, same model and machine; not measured in this run",
        })
    );
    Ok(())
}

/// Runs one case in a fresh process of this binary.
fn child(case: &Case, steps: usize) -> Result<Measured, Box<dyn Error>> {
    let encoded = case.encode(steps);
    let out = Command::new(this_binary()?).env(CHILD, &encoded).output()?;
    if !out.status.success() {
        return Err(format!(
            "case {encoded} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Measured::from_json(&String::from_utf8(out.stdout)?)
}

/// This binary, to start a case in: on Linux `/proc/self/exe`, which goes on naming the running
/// binary when a build beside the bench replaces its file; elsewhere its path.
fn this_binary() -> std::io::Result<std::path::PathBuf> {
    let running = std::path::Path::new("/proc/self/exe");
    if cfg!(target_os = "linux") && running.exists() {
        return Ok(running.to_owned());
    }
    std::env::current_exe()
}

/// A progress bar ticking on its own thread, as a user's loop has; drawn nowhere.
fn progress(steps: usize) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(steps as u64), ProgressDrawTarget::hidden());
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}

/// Steps to run before the clock starts.
const WARMUP: usize = 5;

/// The model trained with distribute-candle on `case.replicas` CPU replicas, `case.threads` each
/// (0: `CpuThreads::Auto`), with the optimizer `optimizer` builds, clipping and checkpoints as
/// the case says.
fn ours<O, F>(case: &Case, steps: usize, optimizer: F) -> Result<Measured, Box<dyn Error>>
where
    O: Optimizer + OptimizerState + Send,
    F: Fn(Vec<Var>) -> candle_core::Result<O>,
{
    let strategy = MirroredStrategy::new(LocalDevices::cpus(case.replicas))?;
    let config = Config {
        threads: NonZeroUsize::new(case.threads).map_or(CpuThreads::Auto, CpuThreads::PerReplica),
        clip_norm: case.clip_norm,
        precision: if case.bf16 {
            Precision::MixedBf16
        } else {
            Precision::Full
        },
        ..Config::default()
    };
    let model = DataParallel::new(&strategy, config, |vb| Mlp::new(vb, HIDDEN), optimizer)?;
    let dir = tempfile::tempdir()?;
    let checkpoints = match case.checkpoint_every {
        0 => None,
        every => Some(Checkpoints::new(
            dir.path(),
            CheckpointOptions { every, keep: KEEP },
        )?),
    };
    let (x, labels) = rows();
    let total = steps + WARMUP;
    let dataset = Dataset::from_tensors((
        HostTensor::from_vec("/cpu:0", &[ROWS, FEATURES], x)?,
        HostTensor::from_vec("/cpu:0", &[ROWS], labels)?,
    ))?
    .repeat((total * GLOBAL_BATCH).div_ceil(ROWS))?
    .batch(GLOBAL_BATCH, false)?;
    let dataset = strategy.distribute_dataset(dataset, InputOptions::default())?;
    let bar = progress(steps);
    let mut batches = dataset.iter();
    let (mut compute, mut optimizing, mut all_reduce, mut input, mut last_arrival) =
        (0.0, 0.0, 0.0, 0.0, 0.0);
    let (mut clipped, mut saves, mut saving) = (0usize, 0usize, 0.0);
    let mut start = Instant::now();
    for step in 0..total {
        if step == WARMUP {
            (compute, optimizing, all_reduce, input, last_arrival) = (0.0, 0.0, 0.0, 0.0, 0.0);
            (clipped, saves, saving) = (0, 0, 0.0);
            start = Instant::now();
        }
        let waited = Instant::now();
        let inputs = batches.next().ok_or("the dataset ended early")??;
        input += waited.elapsed().as_secs_f64();
        let times = model.run(&inputs, |replica, (x, y)| {
            let t0 = Instant::now();
            let x = x.to_dtype(replica.compute_dtype())?;
            let logits = replica.model().forward(&x)?.to_dtype(DType::F32)?;
            let log_p = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
            let loss =
                (log_p.gather(&y.unsqueeze(1)?, 1)?.sum_all()? * (-1.0 / GLOBAL_BATCH as f64))?;
            let grads = loss.backward()?;
            let t1 = Instant::now();
            let reduced = replica.all_reduce_gradients(&grads, ReduceOp::Sum)?;
            let t2 = Instant::now();
            replica.optimizer_mut().step(&reduced)?;
            let t3 = Instant::now();
            let norm = replica.grad_norm();
            Ok((t1 - t0, t2 - t1, t3 - t2, norm))
        })?;
        let (forward_backward, reduce, update, norm) = times[0];
        compute += (forward_backward + update).as_secs_f64();
        optimizing += update.as_secs_f64();
        all_reduce += reduce.as_secs_f64();
        // The replica that arrived last waited for nobody: its all-reduce is the library's own
        // cost (packing, the collective, unpacking; clipping when on).
        last_arrival += times
            .iter()
            .map(|t| t.1)
            .min()
            .unwrap_or_default()
            .as_secs_f64();
        if let (Some(norm), Some(max)) = (norm, case.clip_norm)
            && norm > max
        {
            clipped += 1;
        }
        // A user's loop: a checkpoint after every `every` steps, with the input position.
        let done = step as u64 + 1;
        if let Some(checkpoints) = &checkpoints
            && checkpoints.is_due(done)
        {
            let t0 = Instant::now();
            checkpoints
                .save(&strategy, done, &[&model], InputPosition::at_step(done))?
                .ok_or("a due checkpoint was not written")?;
            saving += t0.elapsed().as_secs_f64();
            saves += 1;
        }
        bar.inc(1);
    }
    let wall = start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    model.check_in_sync()?;
    if let Some(checkpoints) = &checkpoints {
        let kept = std::fs::read_dir(checkpoints.dir())?.count();
        let expected = KEEP.min(total / case.checkpoint_every as usize);
        if kept != expected {
            return Err(format!("{kept} checkpoints kept, not {expected}").into());
        }
    }
    let per_step = |s: f64| s * 1e3 / steps as f64;
    Ok(Measured {
        steps_per_s: steps as f64 / wall,
        threads_per_replica: model.threads_per_replica().unwrap_or(0),
        compute_ms: per_step(compute),
        optimizer_ms: per_step(optimizing),
        all_reduce_ms: per_step(all_reduce),
        last_arrival_ms: per_step(last_arrival),
        input_ms: per_step(input),
        rest_ms: per_step(wall - compute - all_reduce - input - saving),
        clipped_share: clipped as f64 / steps as f64,
        checkpoints: saves,
        checkpoint_ms: if saves == 0 {
            0.0
        } else {
            saving * 1e3 / saves as f64
        },
        peak_mib: 0.0,
    })
}

/// The same model and steps as a plain candle loop: one process, all cores (candle's default
/// threads), the whole global batch per step, no library.
fn plain(steps: usize) -> Result<Measured, Box<dyn Error>> {
    let varmap = VarMap::new();
    let model = Mlp::new(
        VarBuilder::from_varmap(&varmap, candle_core::DType::F32, &Device::Cpu),
        HIDDEN,
    )?;
    let mut sgd = SGD::new(varmap.all_vars(), LEARNING_RATE)?;
    let (x, labels) = rows();
    let x = Tensor::from_vec(x, (ROWS, FEATURES), &Device::Cpu)?;
    let labels = Tensor::from_vec(labels, ROWS, &Device::Cpu)?;
    let bar = progress(steps);
    let mut compute = 0.0;
    let mut start = Instant::now();
    for step in 0..steps + WARMUP {
        if step == WARMUP {
            compute = 0.0;
            start = Instant::now();
        }
        let first = step * GLOBAL_BATCH % ROWS;
        let t0 = Instant::now();
        let xs = x.narrow(0, first, GLOBAL_BATCH)?;
        let ys = labels.narrow(0, first, GLOBAL_BATCH)?;
        let log_p = candle_nn::ops::log_softmax(&model.forward(&xs)?, D::Minus1)?;
        let loss = (log_p.gather(&ys.unsqueeze(1)?, 1)?.sum_all()? * (-1.0 / GLOBAL_BATCH as f64))?;
        sgd.backward_step(&loss)?;
        compute += t0.elapsed().as_secs_f64();
        bar.inc(1);
    }
    let wall = start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    Ok(Measured {
        steps_per_s: steps as f64 / wall,
        threads_per_replica: candle_core::utils::get_num_threads(),
        compute_ms: compute * 1e3 / steps as f64,
        ..Measured::default()
    })
}
