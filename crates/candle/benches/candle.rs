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
//! Without `--bench` (as `cargo test --all-targets` runs it) every case runs once for a few
//! steps, so the bench cannot rot.

#[path = "../examples/candle_mlp.rs"]
#[allow(dead_code)]
mod example;

use std::error::Error;
use std::num::NonZeroUsize;
use std::process::Command;
use std::time::{Duration, Instant};

use candle_core::{D, Device, Tensor};
use candle_nn::{Module, Optimizer, SGD, VarBuilder, VarMap};
use distribute_candle::{Config, CpuThreads, DataParallel};
use distribute_device_spec::LocalDevices;
use distribute_input::{Dataset, InputOptions};
use distribute_mirrored::MirroredStrategy;
use distribute_strategy::Strategy;
use distribute_tensor::Tensor as HostTensor;
use distribute_test_support::candle_mlp::{
    FEATURES, GLOBAL_BATCH, HIDDEN, LEARNING_RATE, ROWS, rows,
};
use distribute_values::ReduceOp;
use example::Mlp;
use indicatif::{ProgressBar, ProgressDrawTarget};

/// The variable that makes this binary run one case and print its result.
const CHILD: &str = "DISTRIBUTE_CANDLE_BENCH_CASE";

/// One case's measurement.
#[derive(Debug, Clone, Copy, Default)]
struct Measured {
    steps_per_s: f64,
    threads_per_replica: usize,
    compute_ms: f64,
    all_reduce_ms: f64,
    last_arrival_ms: f64,
    input_ms: f64,
    rest_ms: f64,
}

fn main() -> Result<(), Box<dyn Error>> {
    if let Ok(case) = std::env::var(CHILD) {
        let fields: Vec<usize> = case.split(':').map(str::parse).collect::<Result<_, _>>()?;
        let [replicas, threads, steps] = fields[..] else {
            return Err("the case is replicas:threads:steps".into());
        };
        let m = if replicas == 0 {
            plain(steps)?
        } else {
            ours(replicas, NonZeroUsize::new(threads), steps)?
        };
        println!(
            "{} {} {} {} {} {} {}",
            m.steps_per_s,
            m.threads_per_replica,
            m.compute_ms,
            m.all_reduce_ms,
            m.last_arrival_ms,
            m.input_ms,
            m.rest_ms
        );
        return Ok(());
    }
    let full = std::env::args().any(|a| a == "--bench");
    let (rounds, steps) = if full { (5, 150) } else { (1, 4) };
    // (replicas, threads per replica; 0: CpuThreads::Auto). 0 replicas is the plain candle
    // loop; 1 replica on 1 thread shows how the replicas scale apart from candle's own threads.
    // The cases alternate round by round.
    let cases = [(0usize, 0usize), (1, 0), (1, 1), (2, 0)];
    let mut results: Vec<Vec<Measured>> = vec![Vec::new(); cases.len()];
    for _ in 0..rounds {
        for (i, &(replicas, threads)) in cases.iter().enumerate() {
            results[i].push(child(replicas, threads, steps)?);
        }
    }
    let median = |runs: &[Measured]| -> Measured {
        let mut sorted = runs.to_vec();
        sorted.sort_by(|a, b| a.steps_per_s.total_cmp(&b.steps_per_s));
        sorted[sorted.len() / 2]
    };
    let plain = median(&results[0]);
    let one = median(&results[1]);
    let one_thread = median(&results[2]);
    println!(
        "{}",
        serde_json::json!({
            "bench": "candle_mlp_plain", "replicas": 1, "workers": 1,
            "threads": plain.threads_per_replica, "steps_per_s": plain.steps_per_s,
            "rounds": rounds, "steps": steps,
        })
    );
    for (i, &(replicas, _)) in cases.iter().enumerate().skip(1) {
        let m = median(&results[i]);
        let step_ms = 1e3 / m.steps_per_s;
        println!(
            "{}",
            serde_json::json!({
                "bench": "candle_mlp", "replicas": replicas, "workers": 1,
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
fn child(replicas: usize, threads: usize, steps: usize) -> Result<Measured, Box<dyn Error>> {
    let out = Command::new(std::env::current_exe()?)
        .env(CHILD, format!("{replicas}:{threads}:{steps}"))
        .output()?;
    if !out.status.success() {
        return Err(format!(
            "case {replicas} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let text = String::from_utf8(out.stdout)?;
    let fields: Vec<f64> = text
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let [
        steps_per_s,
        threads,
        compute_ms,
        all_reduce_ms,
        last_arrival_ms,
        input_ms,
        rest_ms,
    ] = fields[..]
    else {
        return Err(format!("case {replicas} printed {text:?}").into());
    };
    Ok(Measured {
        steps_per_s,
        threads_per_replica: threads as usize,
        compute_ms,
        all_reduce_ms,
        last_arrival_ms,
        input_ms,
        rest_ms,
    })
}

/// A progress bar ticking on its own thread, as a user's loop has; drawn nowhere.
fn progress(steps: usize) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(steps as u64), ProgressDrawTarget::hidden());
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}

/// Steps to run before the clock starts.
const WARMUP: usize = 5;

/// The model trained with distribute-candle on `replicas` CPU replicas, `threads` each
/// (`None`: `CpuThreads::Auto`).
fn ours(
    replicas: usize,
    threads: Option<NonZeroUsize>,
    steps: usize,
) -> Result<Measured, Box<dyn Error>> {
    let strategy = MirroredStrategy::new(LocalDevices::cpus(replicas))?;
    let config = Config {
        threads: threads.map_or(CpuThreads::Auto, CpuThreads::PerReplica),
        ..Config::default()
    };
    let model = DataParallel::new(
        &strategy,
        config,
        |vb| Mlp::new(vb, HIDDEN),
        |vars| SGD::new(vars, LEARNING_RATE),
    )?;
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
    let (mut compute, mut all_reduce, mut input, mut last_arrival) = (0.0, 0.0, 0.0, 0.0);
    let mut start = Instant::now();
    for step in 0..total {
        if step == WARMUP {
            (compute, all_reduce, input, last_arrival) = (0.0, 0.0, 0.0, 0.0);
            start = Instant::now();
        }
        let waited = Instant::now();
        let inputs = batches.next().ok_or("the dataset ended early")??;
        input += waited.elapsed().as_secs_f64();
        let times = model.run(&inputs, |replica, (x, y)| {
            let t0 = Instant::now();
            let logits = replica.model().forward(&x)?;
            let log_p = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
            let loss =
                (log_p.gather(&y.unsqueeze(1)?, 1)?.sum_all()? * (-1.0 / GLOBAL_BATCH as f64))?;
            let grads = loss.backward()?;
            let t1 = Instant::now();
            let reduced = replica.all_reduce_gradients(&grads, ReduceOp::Sum)?;
            let t2 = Instant::now();
            replica.optimizer_mut().step(&reduced)?;
            let t3 = Instant::now();
            Ok(((t1 - t0) + (t3 - t2), t2 - t1))
        })?;
        compute += times[0].0.as_secs_f64();
        all_reduce += times[0].1.as_secs_f64();
        // The replica that arrived last waited for nobody: its all-reduce is the library's own
        // cost (packing, the collective, unpacking).
        last_arrival += times
            .iter()
            .map(|t| t.1)
            .min()
            .unwrap_or_default()
            .as_secs_f64();
        bar.inc(1);
    }
    let wall = start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    model.check_in_sync()?;
    let per_step = |s: f64| s * 1e3 / steps as f64;
    Ok(Measured {
        steps_per_s: steps as f64 / wall,
        threads_per_replica: model.threads_per_replica().unwrap_or(0),
        compute_ms: per_step(compute),
        all_reduce_ms: per_step(all_reduce),
        last_arrival_ms: per_step(last_arrival),
        input_ms: per_step(input),
        rest_ms: per_step(wall - compute - all_reduce - input),
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
