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
//! The `distribute` line also gives `library_share`, the part of a step the library adds over
//! `plain_upload` (1 − the ratio; the goal is at most 3 %).
//!
//! With feature `mpi`, the large model on two worker processes sharing GPU 0 (this executable
//! started by `mpirun` twice over, each process a "node" of its own for NCCL through
//! `NCCL_HOSTID`), `MultiWorkerMirroredStrategy` with one replica each, batch 2048 per process:
//! `nccl` (the gradients reduced in GPU memory over NCCL), `host` (`Config::through_host`, the
//! path before GPU buckets: each bucket copied to the host and handed to the collectives there,
//! which, being NCCL's, upload it, reduce it and download the result, then copied back; the
//! line counts this library's copies only) and, where python3 imports torch with CUDA,
//! `torch_ddp` (`benches/peers/torch_ddp_gpu.py`: PyTorch DDP over NCCL, the same model and
//! setup), alternating round by round. One line per way: `{"bench":"candle_gpu_two_processes",
//! "way","steps_per_s","single_process_steps_per_s","vs_single_process",
//! "gradient_bytes_through_host_per_step"}`, its single-process rate measured in the same run
//! (ours: the `distribute` way on the large model; PyTorch's: its script with one process).
//!
//! Without `--bench` (as `cargo test --all-targets --features cuda` would build it) a quick smoke
//! run. Without a GPU it prints `{"skipped": "<why>"}` and succeeds, unless
//! `DISTRIBUTE_REQUIRE_GPU=1`, where it fails saying so.

use std::error::Error;
use std::time::{Duration, Instant};

use candle_core::{D, DType, Device, Module, Tensor};
use candle_nn::{Linear, Optimizer, SGD, VarBuilder, VarMap};
use distribute_candle::{Config, DataParallel, ToCandle};
use distribute_input::{Dataset, InputOptions};
use distribute_mirrored::MirroredStrategy;
use distribute_strategy::Strategy;
use distribute_tensor::Tensor as HostTensor;
use distribute_values::{Distributed, ReduceOp};
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

/// [`data`] as `steps` global batches of `workers` times the size's batch (one per process).
fn dataset(
    size: Size,
    steps: usize,
    workers: usize,
) -> Result<Dataset<(HostTensor, HostTensor)>, BoxError> {
    let (x, labels) = data(size);
    let rows = BATCHES * size.batch;
    Ok(Dataset::from_tensors((
        HostTensor::from_vec("/cpu:0", &[rows, size.features], x)?,
        HostTensor::from_vec("/cpu:0", &[rows], labels)?,
    ))?
    .repeat((steps * workers).div_ceil(BATCHES))?
    .batch(size.batch * workers, false)?)
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
    let total = steps + WARMUP;
    let dataset = dataset(size, total, 1)?;
    let dataset = strategy.distribute_dataset(dataset, InputOptions::default())?;
    let mut batches = dataset.iter();
    let bar = progress(steps);
    let (wall, _) = timed_steps(&model, &mut batches, total, Some(&bar))?;
    bar.finish_and_clear();
    Ok(steps as f64 / wall)
}

/// Runs `total` steps of `model` on `batches` (the first [`WARMUP`] untimed), ticking `bar`:
/// the seconds the timed steps took, from a drained GPU queue to a drained one, and the bytes
/// of gradients its first replica copied between its GPU and the host in them.
fn timed_steps<S, D, E>(
    model: &DataParallel<'_, S, Mlp, SGD>,
    batches: &mut impl Iterator<Item = Result<D, E>>,
    total: usize,
    bar: Option<&ProgressBar>,
) -> Result<(f64, u64), BoxError>
where
    S: Strategy,
    D: Distributed + Sync,
    D::Local: ToCandle<Candle = (Tensor, Tensor)>,
    E: Into<BoxError>,
{
    // A read of a variable waits for the replica's queued steps (`run` itself does not wait).
    let wait = || -> Result<(), BoxError> {
        model.variable(0, "l3.bias")?.to_vec1::<f32>()?;
        Ok(())
    };
    let mut start = Instant::now();
    let mut before = 0;
    for step in 0..total {
        if step == WARMUP {
            wait()?;
            before = model.gradient_bytes_through_host()?[0];
            start = Instant::now();
        }
        let inputs = batches
            .next()
            .ok_or("the dataset ended early")?
            .map_err(Into::into)?;
        model.run(&inputs, |replica, (x, y)| {
            let loss = loss(&replica.model().forward(&x)?, &y)?;
            replica.backward_step(&loss, ReduceOp::Sum)?;
            Ok(())
        })?;
        if let Some(bar) = bar {
            bar.inc(1);
        }
    }
    wait()?;
    let wall = start.elapsed().as_secs_f64();
    Ok((wall, model.gradient_bytes_through_host()?[0] - before))
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

fn main() {
    #[cfg(feature = "mpi")]
    if let Ok(way) = std::env::var(two_processes::WORKER) {
        if let Err(e) = two_processes::worker(&way) {
            eprintln!("a two-process benchmark worker failed: {e}");
            std::process::exit(1);
        }
        return;
    }
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
    let mut single_large = 0.0;
    for size in SIZES {
        let mut results: Vec<Vec<f64>> = vec![Vec::new(); WAYS.len()];
        for _ in 0..rounds {
            results[0].push(plain(size, gpu, true, steps)?);
            results[1].push(plain(size, gpu, false, steps)?);
            results[2].push(distribute(size, steps)?);
        }
        let medians: Vec<f64> = results.iter().map(|r| median(r)).collect();
        if size.name == "large" {
            single_large = medians[2];
        }
        for (way, steps_per_s) in WAYS.iter().zip(&medians) {
            println!(
                "{}",
                serde_json::json!({
                    "bench": "candle_gpu", "model": size.name, "way": way,
                    "features": size.features, "hidden": size.hidden, "batch": size.batch,
                    "steps_per_s": steps_per_s,
                    "vs_plain_resident": steps_per_s / medians[0],
                    "vs_plain_upload": steps_per_s / medians[1],
                    "library_share": (*way == "distribute").then(|| 1.0 - steps_per_s / medians[1]),
                    "rounds": rounds, "steps": steps,
                    "mode": if full { "bench" } else { "smoke" },
                })
            );
        }
    }
    #[cfg(feature = "mpi")]
    two_processes::compare(single_large, full)?;
    #[cfg(not(feature = "mpi"))]
    let _ = single_large;
    Ok(())
}

/// The large model on two worker processes sharing GPU 0, over NCCL and through the host, with
/// PyTorch DDP beside them.
#[cfg(feature = "mpi")]
mod two_processes {
    use std::path::{Path, PathBuf};
    use std::process::Command;
    use std::time::Duration;

    use candle_nn::Optimizer;
    use distribute_candle::{Config, DataParallel};
    use distribute_device_spec::LocalDevices;
    use distribute_input::InputOptions;
    use distribute_multi_worker::{MultiWorkerConfig, MultiWorkerMirroredStrategy};
    use distribute_strategy::Strategy;
    use distribute_test_support::mpirun::{rank, run_self, write_result};

    use super::{BoxError, LEARNING_RATE, SIZES, WARMUP, median, mlp, timed_steps};

    /// Set in the workers `mpirun` starts: the way (`nccl` or `host`).
    pub(super) const WORKER: &str = "DISTRIBUTE_BENCH_GPU_WORKER";
    /// Steps each worker times.
    const STEPS: &str = "DISTRIBUTE_BENCH_GPU_STEPS";
    /// How long one `mpirun` may take.
    const LIMIT: Duration = Duration::from_secs(120);

    /// One worker of a two-process job: trains the large model with the way `way`, leaves its
    /// steps per second and the bytes its replica copied between GPU and host.
    pub(super) fn worker(way: &str) -> Result<(), BoxError> {
        let steps: usize = std::env::var(STEPS)?.parse()?;
        // NCCL before 2.30 refuses two ranks of one node on one GPU: a host id each.
        // SAFETY: set before the strategy starts this process's threads.
        unsafe { std::env::set_var("NCCL_HOSTID", format!("distribute-bench-{}", rank())) };
        let size = SIZES[1];
        let strategy = MultiWorkerMirroredStrategy::with_config(MultiWorkerConfig {
            local_devices: LocalDevices::gpus(1),
            ..MultiWorkerConfig::default()
        })?;
        let config = Config {
            through_host: way == "host",
            ..Config::default()
        };
        let model = DataParallel::new(
            &strategy,
            config,
            |vb| mlp(size, vb),
            |vars| candle_nn::SGD::new(vars, LEARNING_RATE),
        )?;
        let workers = strategy.num_workers();
        let total = steps + WARMUP;
        // The global batch is every worker's 2048 rows.
        let dataset = super::dataset(size, total, workers)?;
        let dataset = strategy.distribute_dataset(dataset, InputOptions::default())?;
        let mut batches = dataset.iter();
        let (wall, bytes) = timed_steps(&model, &mut batches, total, None)?;
        model.check_in_sync()?;
        write_result(
            &serde_json::json!({
                "workers": workers,
                "steps_per_s": steps as f64 / wall,
                "bytes_per_step": bytes as f64 / steps as f64,
                "buckets_on_gpu": model.buckets_on_gpu()?,
            })
            .to_string(),
        );
        Ok(())
    }

    /// One two-process job of ours: the chief's result.
    fn ours(way: &str, steps: usize) -> Result<serde_json::Value, BoxError> {
        let job = run_self(
            "bench-worker",
            2,
            &[(WORKER, way.to_owned()), (STEPS, steps.to_string())],
            LIMIT,
        );
        if !job.status.success() || job.results.len() != 2 {
            return Err(format!(
                "the {way} job failed ({}, {} results):\n{}",
                job.status,
                job.results.len(),
                job.stdout
            )
            .into());
        }
        Ok(serde_json::from_str(&job.results[0])?)
    }

    /// The PyTorch peer's script where python3 imports torch with CUDA, or why it cannot run.
    fn torch_peer() -> Result<PathBuf, String> {
        const SCRIPT: &str = "crates/candle/benches/peers/torch_ddp_gpu.py";
        // The bundle runs away from the build's checkout: look up from here and from the
        // executable for the working tree the device call carries.
        let starts = [
            std::env::current_dir().ok(),
            std::env::current_exe().ok(),
            Some(PathBuf::from(env!("CARGO_MANIFEST_DIR"))),
        ];
        let script = starts
            .iter()
            .flatten()
            .flat_map(|start| start.ancestors().map(|dir| dir.join(SCRIPT)))
            .find(|path| path.is_file())
            .ok_or_else(|| format!("{SCRIPT} is not above this folder or the executable"))?;
        let out = Command::new("python3")
            .args([
                "-c",
                "import torch; assert torch.cuda.is_available(), 'no CUDA'",
            ])
            .output()
            .map_err(|e| format!("python3 could not be started: {e}"))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            let last = err.lines().last().unwrap_or("").to_owned();
            return Err(format!("python3 cannot use torch on a GPU ({last})"));
        }
        Ok(script)
    }

    /// The peer's steps per second with `processes` processes.
    fn torch(script: &Path, processes: usize, steps: usize) -> Result<f64, BoxError> {
        let out = Command::new("python3")
            .arg(script)
            .args([
                "--processes",
                &processes.to_string(),
                "--steps",
                &steps.to_string(),
            ])
            .output()?;
        if !out.status.success() {
            return Err(format!(
                "{} --processes {processes} failed: {}",
                script.display(),
                String::from_utf8_lossy(&out.stderr)
            )
            .into());
        }
        let line = String::from_utf8_lossy(&out.stdout);
        let last = line.lines().last().ok_or("the peer printed nothing")?;
        let v: serde_json::Value = serde_json::from_str(last)?;
        v["steps_per_s"]
            .as_f64()
            .ok_or_else(|| format!("no steps_per_s in {last}").into())
    }

    /// The two-process lines: `single` is the `distribute` way's steps per second on the large
    /// model in one process, measured in the same run.
    pub(super) fn compare(single: f64, full: bool) -> Result<(), BoxError> {
        let (rounds, steps) = if full { (3, 100) } else { (1, 3) };
        let peer = torch_peer();
        let mut nccl = Vec::new();
        let mut host = Vec::new();
        let mut nccl_bytes = Vec::new();
        let mut host_bytes = Vec::new();
        let mut ddp = Vec::new();
        let mut torch_single = Vec::new();
        for _ in 0..rounds {
            let n = ours("nccl", steps)?;
            nccl.push(n["steps_per_s"].as_f64().unwrap_or(f64::NAN));
            nccl_bytes.push(n["bytes_per_step"].as_f64().unwrap_or(f64::NAN));
            let h = ours("host", steps)?;
            host.push(h["steps_per_s"].as_f64().unwrap_or(f64::NAN));
            host_bytes.push(h["bytes_per_step"].as_f64().unwrap_or(f64::NAN));
            if let Ok(script) = &peer {
                torch_single.push(torch(script, 1, steps)?);
                ddp.push(torch(script, 2, steps)?);
            }
        }
        let line = |way: &str, rates: &[f64], single: f64, bytes: Option<f64>| {
            let rate = median(rates);
            println!(
                "{}",
                serde_json::json!({
                    "bench": "candle_gpu_two_processes", "way": way, "model": "large",
                    "processes": 2, "batch_per_process": SIZES[1].batch,
                    "steps_per_s": rate, "single_process_steps_per_s": single,
                    "vs_single_process": rate / single,
                    "gradient_bytes_through_host_per_step": bytes,
                    "rounds": rounds, "steps": steps,
                    "mode": if full { "bench" } else { "smoke" },
                })
            );
        };
        line("nccl", &nccl, single, Some(median(&nccl_bytes)));
        line("host", &host, single, Some(median(&host_bytes)));
        match peer {
            Ok(_) => line("torch_ddp", &ddp, median(&torch_single), None),
            Err(why) => println!(
                "{}",
                serde_json::json!({
                    "bench": "candle_gpu_two_processes", "way": "torch_ddp", "skipped": why,
                })
            ),
        }
        Ok(())
    }
}
