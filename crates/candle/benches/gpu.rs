//! `distribute-candle` on one GPU against a plain candle loop on the same GPU (feature `cuda`; a
//! suite of `cargo xtask test-gpu`, `bench-candle-gpu`): what wrapping a candle model in
//! `DataParallel` costs where a user has one GPU.
//!
//! An MLP (`features → hidden → hidden → 10`, ReLU, softmax cross-entropy, SGD) in two sizes —
//! `small`, the reference workload of the CPU bench (64 → 512 → 512 → 10, batch 512), and `large`
//! (1024 → 4096 → 4096 → 10, batch 2048, 21 M parameters) — trained three ways, alternating
//! round by round in one process:
//!
//! - `plain_resident`: plain candle, the data already on the GPU, each step a slice of it;
//! - `plain_upload`: plain candle, each step's batch copied from host memory, as a loader does;
//! - `distribute`: `DataParallel` on `MirroredStrategy` over `/gpu:0` (one replica), fed by the
//!   distributed dataset with its prefetch thread, a progress bar ticking on its own thread, as
//!   a user's program would be.
//!
//! Each round times `steps` steps after a warm-up, from a drained GPU queue to a drained one:
//! every way waits for its GPU only there (`DataParallel::run` does not wait; a read of a
//! variable does). One JSON line per size and way: `{"bench":"candle_gpu","model","way",
//! "steps_per_s","vs_plain_resident","vs_plain_upload"}`, medians over the rounds.
//!
//! Without `--bench` (as `cargo test --all-targets --features cuda` would build it) a quick smoke
//! run. Without a GPU it prints `{"skipped": "<why>"}` and succeeds, unless
//! `DISTRIBUTE_REQUIRE_GPU=1`, where it fails saying so.

use std::error::Error;
use std::time::{Duration, Instant};

use candle_core::{D, DType, Device, Module, Tensor};
use candle_nn::{Linear, Optimizer, SGD, VarBuilder, VarMap};
use distribute_candle::{Config, DataParallel};
use distribute_input::{Dataset, InputOptions};
use distribute_mirrored::MirroredStrategy;
use distribute_strategy::Strategy;
use distribute_tensor::Tensor as HostTensor;
use distribute_values::ReduceOp;
use indicatif::{ProgressBar, ProgressDrawTarget};

type BoxError = Box<dyn Error>;

const CLASSES: usize = 10;
const LEARNING_RATE: f64 = 0.01;
/// Distinct rows of the synthetic dataset; steps cycle through them.
const BATCHES: usize = 8;
/// Steps before the clock starts.
const WARMUP: usize = 5;

/// One model size.
#[derive(Clone, Copy)]
struct Size {
    name: &'static str,
    features: usize,
    hidden: usize,
    batch: usize,
}

const SIZES: [Size; 2] = [
    Size {
        name: "small",
        features: 64,
        hidden: 512,
        batch: 512,
    },
    Size {
        name: "large",
        features: 1024,
        hidden: 4096,
        batch: 2048,
    },
];

const WAYS: [&str; 3] = ["plain_resident", "plain_upload", "distribute"];

struct Mlp {
    l1: Linear,
    l2: Linear,
    l3: Linear,
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.l3
            .forward(&self.l2.forward(&self.l1.forward(x)?.relu()?)?.relu()?)
    }
}

fn mlp(size: Size, vb: VarBuilder) -> candle_core::Result<Mlp> {
    Ok(Mlp {
        l1: candle_nn::linear(size.features, size.hidden, vb.pp("l1"))?,
        l2: candle_nn::linear(size.hidden, size.hidden, vb.pp("l2"))?,
        l3: candle_nn::linear(size.hidden, CLASSES, vb.pp("l3"))?,
    })
}

/// The mean cross-entropy of `logits` against `labels` (i64 class ids).
fn loss(logits: &Tensor, labels: &Tensor) -> candle_core::Result<Tensor> {
    let log_p = candle_nn::ops::log_softmax(logits, D::Minus1)?;
    log_p.gather(&labels.unsqueeze(1)?, 1)?.mean_all()?.neg()
}

/// `BATCHES × batch` rows of `features` values and their labels, the same every run.
fn data(size: Size) -> (Vec<f32>, Vec<i64>) {
    let rows = BATCHES * size.batch;
    let x = (0..rows * size.features)
        .map(|i| ((i * 7919 % 1009) as f32 / 1009.0) - 0.5)
        .collect();
    let labels = (0..rows).map(|r| (r * 31 % CLASSES) as i64).collect();
    (x, labels)
}

/// A progress bar ticking on its own thread, as a user's loop has; drawn nowhere.
fn progress(steps: usize) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(steps as u64), ProgressDrawTarget::hidden());
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}

/// Plain candle on `gpu`: steps per second, the batches sliced from data on the GPU
/// (`resident`) or copied from host memory each step.
fn plain(size: Size, gpu: &Device, resident: bool, steps: usize) -> Result<f64, BoxError> {
    let varmap = VarMap::new();
    let model = mlp(size, VarBuilder::from_varmap(&varmap, DType::F32, gpu))?;
    let mut sgd = SGD::new(varmap.all_vars(), LEARNING_RATE)?;
    let (x, labels) = data(size);
    let rows = BATCHES * size.batch;
    let on_gpu = (
        Tensor::from_slice(&x, (rows, size.features), gpu)?,
        Tensor::from_slice(&labels, rows, gpu)?,
    );
    let bar = progress(steps);
    let mut start = Instant::now();
    for step in 0..steps + WARMUP {
        if step == WARMUP {
            gpu.synchronize()?;
            start = Instant::now();
        }
        let b = step % BATCHES;
        let (xs, ys) = if resident {
            (
                on_gpu.0.narrow(0, b * size.batch, size.batch)?,
                on_gpu.1.narrow(0, b * size.batch, size.batch)?,
            )
        } else {
            let rows = b * size.batch..(b + 1) * size.batch;
            let cells = rows.start * size.features..rows.end * size.features;
            (
                Tensor::from_slice(&x[cells], (size.batch, size.features), gpu)?,
                Tensor::from_slice(&labels[rows], size.batch, gpu)?,
            )
        };
        sgd.backward_step(&loss(&model.forward(&xs)?, &ys)?)?;
        bar.inc(1);
    }
    gpu.synchronize()?;
    let wall = start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    Ok(steps as f64 / wall)
}

/// `DataParallel` with one replica on `/gpu:0`, fed by the distributed dataset: steps per second.
fn distribute(size: Size, steps: usize) -> Result<f64, BoxError> {
    let strategy = MirroredStrategy::new(&["/gpu:0"])?;
    let model = DataParallel::new(
        &strategy,
        Config::default(),
        |vb| mlp(size, vb),
        |vars| SGD::new(vars, LEARNING_RATE),
    )?;
    let (x, labels) = data(size);
    let rows = BATCHES * size.batch;
    let total = steps + WARMUP;
    let dataset = Dataset::from_tensors((
        HostTensor::from_vec("/cpu:0", &[rows, size.features], x)?,
        HostTensor::from_vec("/cpu:0", &[rows], labels)?,
    ))?
    .repeat(total.div_ceil(BATCHES))?
    .batch(size.batch, false)?;
    let dataset = strategy.distribute_dataset(dataset, InputOptions::default())?;
    let mut batches = dataset.iter();
    let bar = progress(steps);
    // A read of a variable waits for the replica's queued steps (`run` itself does not wait).
    let wait = |model: &DataParallel<'_, MirroredStrategy, Mlp, SGD>| -> Result<(), BoxError> {
        model.variable(0, "l3.bias")?.to_vec1::<f32>()?;
        Ok(())
    };
    let mut start = Instant::now();
    for step in 0..total {
        if step == WARMUP {
            wait(&model)?;
            start = Instant::now();
        }
        let inputs = batches.next().ok_or("the dataset ended early")??;
        model.run(&inputs, |replica, (x, y)| {
            let loss = loss(&replica.model().forward(&x)?, &y)?;
            replica.backward_step(&loss, ReduceOp::Sum)?;
            Ok(())
        })?;
        bar.inc(1);
    }
    wait(&model)?;
    let wall = start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    Ok(steps as f64 / wall)
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

fn main() {
    let required = std::env::var("DISTRIBUTE_REQUIRE_GPU").is_ok_and(|v| v == "1");
    let gpu = match Device::new_cuda(0) {
        Ok(gpu) => gpu,
        Err(e) => {
            let why = format!("no GPU: candle could not open CUDA device 0: {e}");
            println!("{}", serde_json::json!({ "skipped": why }));
            if required {
                eprintln!("DISTRIBUTE_REQUIRE_GPU=1 but {why}");
                std::process::exit(1);
            }
            return;
        }
    };
    let full = std::env::args().any(|a| a == "--bench");
    if let Err(e) = run(&gpu, full) {
        eprintln!("the candle GPU benchmark failed: {e}");
        std::process::exit(1);
    }
}

fn run(gpu: &Device, full: bool) -> Result<(), BoxError> {
    let (rounds, steps) = if full { (5, 100) } else { (1, 3) };
    for size in SIZES {
        let mut results: Vec<Vec<f64>> = vec![Vec::new(); WAYS.len()];
        for _ in 0..rounds {
            results[0].push(plain(size, gpu, true, steps)?);
            results[1].push(plain(size, gpu, false, steps)?);
            results[2].push(distribute(size, steps)?);
        }
        let medians: Vec<f64> = results.iter().map(|r| median(r)).collect();
        for (way, steps_per_s) in WAYS.iter().zip(&medians) {
            println!(
                "{}",
                serde_json::json!({
                    "bench": "candle_gpu", "model": size.name, "way": way,
                    "features": size.features, "hidden": size.hidden, "batch": size.batch,
                    "steps_per_s": steps_per_s,
                    "vs_plain_resident": steps_per_s / medians[0],
                    "vs_plain_upload": steps_per_s / medians[1],
                    "rounds": rounds, "steps": steps,
                    "mode": if full { "bench" } else { "smoke" },
                })
            );
        }
    }
    Ok(())
}
