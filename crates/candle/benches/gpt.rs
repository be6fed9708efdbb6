//! `cargo bench -p distribute-candle --bench gpt` (part of `cargo xtask bench candle`): the small
//! GPT of the `gpt` example (its own model code: 2 blocks of width 64 with 4 heads over 64 bytes
//! of context, about 120 thousand parameters, a global batch of 32 windows, AdamW at 3e-3 with
//! weight decay 0.01, no clipping or schedule) on the project's documentation, in tokens
//! (bytes) per second:
//!
//! - a plain candle loop: no library, candle's default threads (all cores), the whole batch per
//!   step, candle-nn's `AdamW` (`candle_gpt_plain`);
//! - distribute-candle on 1 and 2 replicas of `MirroredStrategy` in one process, fed by the
//!   distributed dataset (the example's windows, made on its prefetch thread),
//!   `CpuThreads::Auto`, the example's initial values, each step written out (forward and
//!   backward, `all_reduce_gradients`, the optimizer's `step`) so that its parts are timed:
//!
//! `{"bench":"candle_gpt","replicas","workers":1,"threads_per_replica","tokens_per_s",
//! "speedup_vs_1","vs_plain_candle","split_ms":{"compute","all_reduce","input","rest",
//! "all_reduce_last_arrival"},"library_share","library_own_share"}`
//!
//! as the MLP's lines of `benches/candle.rs`: `split_ms` is replica 0's mean step (its candle
//! work: forward, backward and the optimizer; the gradient all-reduce with the wait for the
//! slower replica; waiting for input; the rest of `run`), `library_share` everything but replica
//! 0's candle work over the step, `library_own_share` the all-reduce of the replica that arrived
//! last (which waited for nobody) and the input wait over the step.
//!
//! Each case runs in its own process (candle sizes its thread pools once per process), the
//! cases alternate round by round, and each line is the median of its rounds; the ratios are
//! throughput ratios, the median over the rounds of each round's ratio.
//!
//! The peer: where `python3` imports `torch`, the same model and batch in PyTorch
//! (`benches/peers/torch_gpt.py`, all cores, one process) runs in the same rounds
//! (`candle_gpt_peer`, with `vs_pytorch` of each case); where it does not, a line says so and
//! why. 2 workers under `mpirun` are `cargo xtask bench candle`'s next step (from the example
//! built with the feature `mpi`: its executable path is known, a bench's is not).
//!
//! Without `--bench` (as `cargo test --all-targets` runs it) every case runs once for 2 steps of
//! a tiny model, so the bench cannot rot.

#[path = "../examples/gpt.rs"]
#[allow(dead_code)]
mod example;

use std::error::Error;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use candle_nn::{Optimizer, ParamsAdamW, VarBuilder, VarMap};
use distribute_candle::{AnyOptimizer, Config, CpuThreads, DataParallel, OptimizerConfig};
use distribute_device_spec::LocalDevices;
use distribute_input::{Dataset, GeneratorSource, InputOptions};
use distribute_mirrored::MirroredStrategy;
use distribute_strategy::Strategy;
use distribute_tensor::Tensor as HostTensor;
use distribute_values::ReduceOp;
use example::{Gpt, GptConfig, Options, initial_values, read_corpus, training_windows};

/// The variable that makes this binary run one case and print its result: `replicas:steps:size`
/// (replicas 0: the plain candle loop; size `full` or `tiny`).
const CHILD: &str = "DISTRIBUTE_CANDLE_GPT_CASE";
/// Steps before the clock starts.
const WARMUP: usize = 3;
/// The seed of the initial values and the windows.
const SEED: u64 = 0;

/// The model and batch of a run.
#[derive(Debug, Clone, Copy)]
struct Size {
    model: GptConfig,
    batch: usize,
}

impl Size {
    /// The example's default model and batch.
    fn full() -> Size {
        let defaults = Options::default();
        Size {
            model: defaults.model,
            batch: defaults.batch,
        }
    }

    /// tests/gpt.rs's tiny model: the test-mode run.
    fn tiny() -> Size {
        Size {
            model: GptConfig {
                layers: 1,
                embd: 16,
                heads: 2,
                block: 16,
            },
            batch: 8,
        }
    }

    /// Bytes predicted per step.
    fn tokens_per_step(&self) -> usize {
        self.batch * self.model.block
    }
}

/// AdamW's settings: the example's.
fn adamw() -> ParamsAdamW {
    ParamsAdamW {
        lr: 3e-3,
        weight_decay: 0.01,
        ..ParamsAdamW::default()
    }
}

/// One case's measurement: replica 0's mean step, in milliseconds.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
struct Measured {
    tokens_per_s: f64,
    threads_per_replica: usize,
    compute_ms: f64,
    all_reduce_ms: f64,
    last_arrival_ms: f64,
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

    /// The mean step.
    fn step_ms(&self) -> f64 {
        self.compute_ms + self.all_reduce_ms + self.input_ms + self.rest_ms
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
        let bad = || format!("the case is replicas:steps:full|tiny, not {case:?}");
        let [replicas, steps, size] = case.split(':').collect::<Vec<_>>()[..] else {
            return Err(bad().into());
        };
        let replicas: usize = replicas.parse().map_err(|_| bad())?;
        let steps: usize = steps.parse().map_err(|_| bad())?;
        let size = match size {
            "full" => Size::full(),
            "tiny" => Size::tiny(),
            _ => return Err(bad().into()),
        };
        let text = Arc::new(read_corpus(&Options::default().corpus_root)?);
        let m = match replicas {
            0 => plain(size, steps, &text)?,
            _ => ours(size, replicas, steps, &text)?,
        };
        println!("{}", m.to_json());
        return Ok(());
    }
    let full = std::env::args().any(|a| a == "--bench");
    let (rounds, steps, size) = if full {
        (3, 20, "full")
    } else {
        (1, 2, "tiny")
    };
    let shape = if full { Size::full() } else { Size::tiny() };
    const PLAIN: usize = 0;
    const ONE: usize = 1;
    let cases = [0, 1, 2];
    let peer = torch_peer();
    let mut results: Vec<Vec<Measured>> = vec![Vec::new(); cases.len()];
    let mut peer_runs = Vec::new();
    let mut peer_failed = None;
    for _ in 0..rounds {
        for (i, replicas) in cases.iter().enumerate() {
            results[i].push(child(&format!("{replicas}:{steps}:{size}"))?);
        }
        if let (Ok(script), None) = (&peer, &peer_failed) {
            match run_peer(script, shape, steps) {
                Ok(tokens_per_s) => peer_runs.push(tokens_per_s),
                Err(why) => peer_failed = Some(why),
            }
        }
    }
    let median_run = |runs: &[Measured]| -> Measured {
        let mut sorted = runs.to_vec();
        sorted.sort_by(|a, b| a.tokens_per_s.total_cmp(&b.tokens_per_s));
        sorted[sorted.len() / 2]
    };
    // The median over the rounds of this case's throughput over the baseline's in each round.
    let vs = |case: usize, baseline: usize| {
        median(
            results[case]
                .iter()
                .zip(&results[baseline])
                .map(|(c, b)| c.tokens_per_s / b.tokens_per_s),
        )
    };
    let model = serde_json::json!({
        "layers": shape.model.layers, "embd": shape.model.embd, "heads": shape.model.heads,
        "block": shape.model.block, "batch": shape.batch,
    });
    let plain = median_run(&results[PLAIN]);
    println!(
        "{}",
        serde_json::json!({
            "bench": "candle_gpt_plain", "replicas": 1, "workers": 1, "model": model,
            "threads": plain.threads_per_replica, "tokens_per_s": plain.tokens_per_s,
            "split_ms": { "compute": plain.compute_ms, "rest": plain.rest_ms },
            "rounds": rounds, "steps": steps,
        })
    );
    let peer_ratio = |i: usize| {
        (peer_runs.len() == rounds).then(|| {
            median(
                results[i]
                    .iter()
                    .zip(&peer_runs)
                    .map(|(c, p)| c.tokens_per_s / p),
            )
        })
    };
    for (i, &replicas) in cases.iter().enumerate().skip(ONE) {
        let m = median_run(&results[i]);
        let step_ms = m.step_ms();
        println!(
            "{}",
            serde_json::json!({
                "bench": "candle_gpt", "replicas": replicas, "workers": 1, "model": model,
                "threads_per_replica": m.threads_per_replica,
                "tokens_per_s": m.tokens_per_s,
                "speedup_vs_1": vs(i, ONE),
                "vs_plain_candle": vs(i, PLAIN),
                "vs_pytorch": peer_ratio(i),
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
    let peer_line = match (&peer, &peer_failed) {
        (Err(why), _) => serde_json::json!({
            "bench": "candle_gpt_peer", "peer": "PyTorch", "skipped": why,
        }),
        (Ok(_), Some(why)) => serde_json::json!({
            "bench": "candle_gpt_peer", "peer": "PyTorch", "failed": why,
        }),
        (Ok(_), None) => serde_json::json!({
            "bench": "candle_gpt_peer", "peer": "PyTorch (torch_gpt.py, 1 process, all cores)",
            "model": model, "tokens_per_s": median(peer_runs.iter().copied()),
            "rounds": rounds, "steps": steps,
        }),
    };
    println!("{peer_line}");
    Ok(())
}

/// Runs one case in a fresh process of this binary.
fn child(case: &str) -> Result<Measured, Box<dyn Error>> {
    let out = Command::new(this_binary()?).env(CHILD, case).output()?;
    if !out.status.success() {
        return Err(format!(
            "case {case} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Measured::from_json(&String::from_utf8(out.stdout)?)
}

/// This binary, to start a case in: on Linux `/proc/self/exe`, which goes on naming the running
/// binary when a build beside the bench replaces its file; elsewhere its path.
fn this_binary() -> std::io::Result<std::path::PathBuf> {
    let running = Path::new("/proc/self/exe");
    if cfg!(target_os = "linux") && running.exists() {
        return Ok(running.to_owned());
    }
    std::env::current_exe()
}

/// The PyTorch peer's script where `python3` imports `torch`, or why it cannot run.
fn torch_peer() -> Result<std::path::PathBuf, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/peers/torch_gpt.py");
    let out = Command::new("python3")
        .args(["-c", "import torch"])
        .output()
        .map_err(|e| format!("python3 could not be started: {e}"))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr.lines().last().unwrap_or("no message");
        return Err(format!("python3 cannot import torch ({last})"));
    }
    Ok(script)
}

/// One run of the PyTorch peer: its tokens per second, from the JSON line it prints.
fn run_peer(script: &Path, size: Size, steps: usize) -> Result<f64, String> {
    let shape = size.model;
    let out = Command::new("python3")
        .arg(script)
        .args([
            "--layers",
            &shape.layers.to_string(),
            "--embd",
            &shape.embd.to_string(),
            "--heads",
            &shape.heads.to_string(),
            "--block",
            &shape.block.to_string(),
            "--batch",
            &size.batch.to_string(),
            "--steps",
            &steps.to_string(),
            "--warmup",
            &WARMUP.to_string(),
            "--corpus-root",
            &Options::default().corpus_root.display().to_string(),
        ])
        .output()
        .map_err(|e| format!("could not start {}: {e}", script.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "{} exited with {}: {}",
            script.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let line = stdout
        .lines()
        .find(|l| l.starts_with('{'))
        .ok_or_else(|| format!("the peer printed no JSON line: {stdout}"))?;
    serde_json::from_str::<serde_json::Value>(line)
        .ok()
        .and_then(|v| v["tokens_per_s"].as_f64())
        .ok_or_else(|| format!("no tokens_per_s in the peer's line {line:?}"))
}

/// The GPT trained with distribute-candle on `replicas` CPU replicas (`CpuThreads::Auto`).
fn ours(
    size: Size,
    replicas: usize,
    steps: usize,
    text: &Arc<Vec<u8>>,
) -> Result<Measured, Box<dyn Error>> {
    let strategy = MirroredStrategy::new(LocalDevices::cpus(replicas))?;
    let config = Config {
        threads: CpuThreads::Auto,
        ..Config::default()
    };
    let model = DataParallel::new(
        &strategy,
        config,
        |vb| Gpt::new(size.model, vb),
        |vars| AnyOptimizer::new(vars, OptimizerConfig::AdamW(adamw())),
    )?;
    model.assign(initial_values(&model, size.model.layers, SEED)?)?;
    let (batch, block) = (size.batch, size.model.block);
    let total = steps + WARMUP;
    let text = Arc::clone(text);
    let source = GeneratorSource::new(move || {
        let text = Arc::clone(&text);
        (0..total as u64).map(move |s| {
            let windows = training_windows(&text, SEED, s, batch, block);
            Ok(HostTensor::from_vec(
                "/cpu:0",
                &[batch, block + 1],
                windows,
            )?)
        })
    });
    let dataset = Dataset::from_source(source).batch(batch, false)?;
    let dataset = strategy.distribute_dataset(dataset, InputOptions::default())?;
    let mut batches = dataset.iter();
    let tokens_per_step = size.tokens_per_step() as f64;
    let (mut compute, mut all_reduce, mut input, mut last_arrival) = (0.0, 0.0, 0.0, 0.0);
    let mut start = Instant::now();
    for step in 0..total {
        if step == WARMUP {
            (compute, all_reduce, input, last_arrival) = (0.0, 0.0, 0.0, 0.0);
            start = Instant::now();
        }
        let waited = Instant::now();
        let windows = batches.next().ok_or("the dataset ended early")??;
        input += waited.elapsed().as_secs_f64();
        let times = model.run(&windows, |replica, windows| {
            let t0 = Instant::now();
            let summed = replica.model().window_losses(&windows, None)?.sum_all()?;
            let grads = (summed / tokens_per_step)?.backward()?;
            let t1 = Instant::now();
            let reduced = replica.all_reduce_gradients(&grads, ReduceOp::Sum)?;
            let t2 = Instant::now();
            replica.optimizer_mut().step(&reduced)?;
            Ok((t1 - t0, t2 - t1, t2.elapsed()))
        })?;
        let (forward_backward, reduce, update) = times[0];
        compute += (forward_backward + update).as_secs_f64();
        all_reduce += reduce.as_secs_f64();
        // The replica that arrived last waited for nobody: its all-reduce is the library's own
        // cost (packing, the collective, unpacking).
        last_arrival += times
            .iter()
            .map(|t| t.1)
            .min()
            .unwrap_or_default()
            .as_secs_f64();
    }
    let wall = start.elapsed().as_secs_f64();
    model.check_in_sync()?;
    let per_step = |s: f64| s * 1e3 / steps as f64;
    Ok(Measured {
        tokens_per_s: steps as f64 * tokens_per_step / wall,
        threads_per_replica: model.threads_per_replica().unwrap_or(0),
        compute_ms: per_step(compute),
        all_reduce_ms: per_step(all_reduce),
        last_arrival_ms: per_step(last_arrival),
        input_ms: per_step(input),
        rest_ms: per_step(wall - compute - all_reduce - input),
    })
}

/// The same model and windows as a plain candle loop: one process, all cores (candle's default
/// threads), the whole batch per step, candle-nn's `AdamW`, no library.
fn plain(size: Size, steps: usize, text: &[u8]) -> Result<Measured, Box<dyn Error>> {
    let varmap = VarMap::new();
    let model = Gpt::new(
        size.model,
        VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu),
    )?;
    let mut adamw = candle_nn::AdamW::new(varmap.all_vars(), adamw())?;
    let (batch, block) = (size.batch, size.model.block);
    let tokens_per_step = size.tokens_per_step() as f64;
    let mut compute = 0.0;
    let mut start = Instant::now();
    for step in 0..steps + WARMUP {
        if step == WARMUP {
            compute = 0.0;
            start = Instant::now();
        }
        let windows = training_windows(text, SEED, step as u64, batch, block);
        let t0 = Instant::now();
        let windows = Tensor::from_vec(windows, (batch, block + 1), &Device::Cpu)?;
        let losses = model
            .window_losses(&windows, None)
            .map_err(|e| -> Box<dyn Error> { e })?;
        let summed = losses.sum_all()?;
        adamw.backward_step(&(summed / tokens_per_step)?)?;
        compute += t0.elapsed().as_secs_f64();
    }
    let wall = start.elapsed().as_secs_f64();
    Ok(Measured {
        tokens_per_s: steps as f64 * tokens_per_step / wall,
        threads_per_replica: candle_core::utils::get_num_threads(),
        compute_ms: compute * 1e3 / steps as f64,
        rest_ms: (wall - compute) * 1e3 / steps as f64,
        ..Measured::default()
    })
}
