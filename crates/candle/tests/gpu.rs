//! distribute-candle on CUDA replicas (feature `cuda`, a suite of `cargo xtask test-gpu`): a
//! `/gpu:N` replica holds its copy of the model on candle's CUDA device `N`, trains as a CPU
//! replica does (to float rounding: cuBLAS and candle's kernels round differently), and stays
//! bit-identical to the other copies, GPU or CPU.
//!
//! The executable links CUDA (candle's backend does), so it starts only where libcuda,
//! cuBLAS, cuRAND, NVRTC and NCCL are found; the workspace's own GPU code (GPU tensors, the
//! NVRTC kernels, the NCCL backend) runs in it beside candle's, through the same linked
//! libraries (one binary). With them but without a GPU the tests say why and pass, unless
//! `DISTRIBUTE_REQUIRE_GPU=1` (set by `cargo xtask test-gpu`).
//!
//! The `gpt` example's GPT trains here too, on `/gpu:0` (issue 41): a GPU suite of its own
//! would be another executable of candle's CUDA kernels, which the bundle has no room for.
//!
//! Gradients in GPU memory (issue 36): the reference `candle_mlp` on two GPUs of this process,
//! and with feature `mpi` on two worker processes sharing one GPU (this executable started by
//! `mpirun`, NCCL across the processes), each against the same run through the host
//! (`Config::through_host`).

#[path = "../examples/gpt.rs"]
#[allow(dead_code)]
mod gpt;

#[path = "../examples/candle_mlp.rs"]
#[allow(dead_code)]
mod candle_mlp;

use std::collections::HashMap;

use candle_core::{Device, Module, Tensor};
use candle_nn::{Linear, Optimizer, SGD, VarBuilder};
use distribute_candle::{Config, DataParallel, Error};
use distribute_mirrored::MirroredStrategy;
use distribute_values::ReduceOp;

/// How many CUDA devices candle can open, or why none.
fn gpus() -> Result<usize, String> {
    match Device::new_cuda(0) {
        Err(e) => Err(format!("candle could not open CUDA device 0: {e}")),
        Ok(_) => Ok(1 + (1..).take_while(|&i| Device::new_cuda(i).is_ok()).count()),
    }
}

/// The GPU count when there are at least `needed`; otherwise says why the test is skipped
/// (panics instead under `DISTRIBUTE_REQUIRE_GPU=1` when there is no GPU at all).
fn gpus_or_skip(needed: usize) -> Option<usize> {
    let why = match gpus() {
        Ok(n) if n >= needed => return Some(n),
        Ok(n) => {
            eprintln!("skipped: needs {needed} GPUs, candle opens {n}");
            return None;
        }
        Err(why) => why,
    };
    assert!(
        std::env::var("DISTRIBUTE_REQUIRE_GPU").map_or(true, |v| v != "1"),
        "DISTRIBUTE_REQUIRE_GPU=1 but no GPU: {why}"
    );
    eprintln!("skipped: {why}");
    None
}

struct Mlp {
    hidden: Linear,
    out: Linear,
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.out.forward(&self.hidden.forward(x)?.relu()?)
    }
}

fn mlp(vb: VarBuilder) -> candle_core::Result<Mlp> {
    Ok(Mlp {
        hidden: candle_nn::linear(8, 32, vb.pp("hidden"))?,
        out: candle_nn::linear(32, 1, vb.pp("out"))?,
    })
}

fn sgd(vars: Vec<candle_core::Var>) -> candle_core::Result<SGD> {
    SGD::new(vars, 0.05)
}

/// Replica `replica`'s batch of step `step`: 16 rows, a target that a small MLP can fit.
fn batch(replica: usize, step: usize, device: &Device) -> candle_core::Result<(Tensor, Tensor)> {
    let seed = (replica * 7919 + step * 104_729) as f32;
    let x: Vec<f32> = (0..16 * 8)
        .map(|i| ((i as f32 * 0.37 + seed) % 2.0) - 1.0)
        .collect();
    let y: Vec<f32> = x.chunks(8).map(|r| r[0] * r[1] - r[2] + 0.5).collect();
    Ok((
        Tensor::from_vec(x, (16, 8), device)?,
        Tensor::from_vec(y, (16, 1), device)?,
    ))
}

/// Initial values every model in these tests starts from (the same on CPU and GPU).
fn initial_values() -> HashMap<String, Tensor> {
    let values = |shape: &[usize], scale: f32| {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|i| ((i * 37 % 101) as f32 / 101.0 - 0.5) * scale)
            .collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    };
    HashMap::from([
        ("hidden.weight".to_owned(), values(&[32, 8], 0.7)),
        ("hidden.bias".to_owned(), values(&[32], 0.1)),
        ("out.weight".to_owned(), values(&[1, 32], 0.35)),
        ("out.bias".to_owned(), values(&[1], 0.1)),
    ])
}

/// The model of these tests, data-parallel on a MirroredStrategy.
type Model<'s> = DataParallel<'s, MirroredStrategy, Mlp, SGD>;

/// Trains a model on `strategy`'s replicas for `steps` steps from [`initial_values`]; each replica's batch
/// is that of its replica id. The losses of replica 0, and the trained model.
fn train<'s>(strategy: &'s MirroredStrategy, steps: usize) -> Result<(Vec<f32>, Model<'s>), Error> {
    let model = DataParallel::new(strategy, Config::default(), mlp, sgd)?;
    model.assign(initial_values())?;
    let mut losses = Vec::new();
    for step in 0..steps {
        let out = model.run(&(), |replica, ()| {
            let (x, y) = batch(replica.replica_id(), step, replica.device())?;
            let loss = candle_nn::loss::mse(&replica.model().forward(&x)?, &y)?;
            replica.backward_step(&loss, ReduceOp::Mean)?;
            Ok(loss.to_scalar::<f32>()?)
        })?;
        losses.push(out[0]);
    }
    Ok((losses, model))
}

fn weights(model: &Model<'_>, replica: usize) -> Vec<f32> {
    ["hidden.bias", "hidden.weight", "out.bias", "out.weight"]
        .iter()
        .flat_map(|name| {
            let t = model.variable(replica, name).unwrap();
            t.to_device(&Device::Cpu)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        })
        .collect()
}

fn assert_close(what: &str, gpu: &[f32], cpu: &[f32]) {
    assert_eq!(gpu.len(), cpu.len(), "{what}");
    for (i, (g, c)) in gpu.iter().zip(cpu).enumerate() {
        assert!(
            (g - c).abs() <= 1e-4 * c.abs().max(1.0),
            "{what}[{i}]: GPU {g}, CPU {c}"
        );
    }
}

#[test]
fn a_gpu_replica_holds_its_model_on_the_gpu_and_trains_as_a_cpu_replica_does() {
    if gpus_or_skip(1).is_none() {
        return;
    }
    let on_gpu = MirroredStrategy::new(&["/gpu:0"]).unwrap();
    let on_cpu = MirroredStrategy::new(&["/cpu:0"]).unwrap();
    let (gpu_losses, gpu_model) = train(&on_gpu, 30).unwrap();
    let (cpu_losses, cpu_model) = train(&on_cpu, 30).unwrap();
    let w = gpu_model.variable(0, "hidden.weight").unwrap();
    assert!(
        w.device().is_cuda(),
        "the variable lives on {:?}",
        w.device()
    );
    assert!(
        gpu_losses[29] < gpu_losses[0] * 0.8,
        "the model learned: {gpu_losses:?}"
    );
    assert_close("loss", &gpu_losses, &cpu_losses);
    assert_close("weights", &weights(&gpu_model, 0), &weights(&cpu_model, 0));
    println!(
        "{{\"test\": \"candle_gpu_vs_cpu\", \"first_loss\": {}, \"last_loss\": {}, \
         \"last_loss_cpu\": {}}}",
        gpu_losses[0], gpu_losses[29], cpu_losses[29]
    );
}

#[test]
fn a_gpu_and_a_cpu_replica_stay_bit_identical() {
    // Both copies apply the same reduced gradients with SGD (a multiply and a subtract, each
    // rounded once in IEEE arithmetic on either device), so they agree to the bit.
    if gpus_or_skip(1).is_none() {
        return;
    }
    let mixed = MirroredStrategy::new(&["/gpu:0", "/cpu:0"]).unwrap();
    let (losses, model) = train(&mixed, 20).unwrap();
    assert!(losses[19] < losses[0], "{losses:?}");
    model.check_in_sync().unwrap();
    assert_eq!(weights(&model, 0), weights(&model, 1));
    assert!(model.variable(1, "out.weight").unwrap().device().is_cpu());
}

#[test]
fn two_gpus_train_one_model_in_step() {
    let Some(_) = gpus_or_skip(2) else {
        return;
    };
    let two = MirroredStrategy::new(&["/gpu:0", "/gpu:1"]).unwrap();
    let (losses, model) = train(&two, 20).unwrap();
    assert!(losses[19] < losses[0], "{losses:?}");
    model.check_in_sync().unwrap();
    assert!(model.variable(1, "out.weight").unwrap().device().is_cuda());
}

#[test]
fn a_gpu_the_machine_lacks_is_refused_naming_the_replica_device() {
    let Ok(n) = gpus() else {
        // Without a GPU every `/gpu:N` is refused: the same check on `/gpu:0`.
        let s = MirroredStrategy::new(&["/gpu:0"]).unwrap();
        let err = DataParallel::new(&s, Config::default(), mlp, sgd)
            .err()
            .expect("no GPU, no model");
        let text = err.to_string();
        // The strategy names the device canonically: `/job:localhost/…/device:GPU:0`.
        assert!(
            matches!(err, Error::Device { .. }) && text.contains("GPU:0'"),
            "{text}"
        );
        assert!(text.contains("could not open CUDA device 0"), "{text}");
        return;
    };
    let name = format!("/gpu:{n}");
    let s = MirroredStrategy::new(&[name.as_str()]).unwrap();
    let err = DataParallel::new(&s, Config::default(), mlp, sgd)
        .err()
        .expect("a GPU past the last one");
    let text = err.to_string();
    assert!(text.contains(&format!("GPU:{n}'")), "{text}");
    assert!(
        text.contains(&format!("could not open CUDA device {n}")),
        "{text}"
    );
}

/// `run` returns while a GPU replica's work may still be queued (as a plain candle loop goes on
/// while its GPU works); a tensor the step returns is still read after that work, on the
/// caller's thread and its stream, and so is the model. The step queues milliseconds of GPU
/// work (twenty passes over 256 MiB) after its last wait, so a read that did not follow it
/// would see a partial result.
#[test]
fn what_a_step_returns_is_read_after_the_step_s_gpu_work() {
    if gpus_or_skip(1).is_none() {
        return;
    }
    let s = MirroredStrategy::new(&["/gpu:0"]).unwrap();
    let model = DataParallel::new(&s, Config::default(), mlp, sgd).unwrap();
    model.assign(initial_values()).unwrap();
    for round in 0..3 {
        let out = model
            .run(&(), |replica, ()| {
                let (x, y) = batch(0, round, replica.device())?;
                let loss = candle_nn::loss::mse(&replica.model().forward(&x)?, &y)?;
                replica.backward_step(&loss, ReduceOp::Mean)?;
                let mut t = Tensor::zeros(64 << 20, candle_core::DType::F32, replica.device())?;
                for _ in 0..20 {
                    t = (t + 1.0)?;
                }
                Ok(t)
            })
            .unwrap();
        let t = out.into_iter().next().unwrap();
        let (min, max) = (
            t.min_all().unwrap().to_scalar::<f32>().unwrap(),
            t.max_all().unwrap().to_scalar::<f32>().unwrap(),
        );
        assert_eq!((min, max), (20.0, 20.0), "round {round}");
        drop(t);
        model.check_in_sync().unwrap();
    }
}

#[test]
fn one_executable_holds_candle_s_cuda_backend_and_the_nccl_collectives() {
    use distribute_mirrored::{CrossDeviceOpsChoice, MirroredConfig};
    use distribute_tensor::cuda::{Gpu, gpu_count, library_present};

    // Linked, not loaded: the probes find the libraries in the program itself.
    for (library, symbol) in [
        ("cuda", "cuInit"),
        ("nvrtc", "nvrtcVersion"),
        ("nccl", "ncclGetVersion"),
    ] {
        assert!(
            library_present(library, symbol),
            "{library} is linked into this executable"
        );
    }
    let Some(_) = gpus_or_skip(1) else { return };
    assert!(gpu_count().unwrap() >= 1);
    distribute_nccl::require_nccl().unwrap();
    // One rank on GPU 0: NCCL's communicator beside candle's context on the same device.
    let deadline = std::time::Duration::from_secs(60);
    let nccl = distribute_nccl::NcclAllReduce::new(&[0], deadline).unwrap();
    let strategy = MirroredStrategy::with_config(
        &["/gpu:0"],
        MirroredConfig {
            cross_device_ops: CrossDeviceOpsChoice::Given(std::sync::Arc::new(nccl)),
            ..MirroredConfig::default()
        },
    )
    .unwrap();
    let model = DataParallel::new(&strategy, Config::default(), mlp, sgd).unwrap();
    let gpu = Gpu::open(0).unwrap();
    let sums = model
        .run(&(), |replica, ()| {
            let (x, y) = batch(0, 0, replica.device())?;
            let loss = (replica.model().forward(&x)? - y)?.sqr()?.mean_all()?;
            replica.backward_step(&loss, ReduceOp::Mean)?;
            // The step's loss through NCCL, from GPU memory: one rank sums to itself.
            let mine = distribute_tensor::Tensor::scalar("/gpu:0", loss.to_scalar::<f32>()?)
                .to_gpu(&gpu)?;
            let summed = replica.context().all_reduce(ReduceOp::Sum, &mine)?;
            Ok((loss.to_scalar::<f32>()?, summed.to_vec::<f32>()?[0]))
        })
        .unwrap();
    let (loss, summed) = sums[0];
    assert_eq!(
        loss.to_bits(),
        summed.to_bits(),
        "NCCL summed one rank to itself"
    );
    model.check_in_sync().unwrap();
}

/// The largest difference allowed between a training or held-out loss (nats per byte) of the
/// GPT on `/gpu:0` and on the CPU: cuBLAS and candle's CUDA kernels (softmax, layer norm, the
/// reductions) round otherwise than the CPU's, and AdamW carries the differences on; a real
/// mistake (a gradient lost, a step applied twice) moves the losses by tenths.
const GPT_GPU_LOSS_TOLERANCE: f64 = 2e-3;

#[test]
fn the_gpt_example_trains_on_a_gpu_as_on_the_cpu() {
    if gpus_or_skip(1).is_none() {
        return;
    }
    // The tiny model of tests/gpt.rs on the first 48 KiB of the documentation.
    let root = gpt::Options::default().corpus_root;
    let mut text = gpt::read_corpus(&root).unwrap();
    text.truncate(48 * 1024);
    let options = |devices: &[&str]| gpt::Options {
        replicas: devices.len(),
        devices: Some(devices.iter().map(|d| (*d).to_owned()).collect()),
        steps: 16,
        model: gpt::GptConfig {
            layers: 1,
            embd: 16,
            heads: 2,
            block: 16,
        },
        batch: 8,
        lr: Some(1e-2),
        warmup: 2,
        eval_every: 0,
        sample: 16,
        text: Some(std::sync::Arc::new(text.clone())),
        ..gpt::Options::default()
    };
    let on_gpu = gpt::train(&options(&["/gpu:0"])).unwrap();
    let on_cpu = gpt::train(&options(&["/cpu:0"])).unwrap();
    let held_out = |t: &gpt::Trained| (t.evaluations[0].loss, t.evaluations[1].loss);
    let (before, after) = held_out(&on_gpu);
    assert!(
        after < before - 1.0,
        "the held-out loss falls: {before} → {after}"
    );
    let losses = |t: &gpt::Trained| t.losses.iter().map(|&l| f64::from(l)).collect::<Vec<_>>();
    let (gpu, cpu) = (losses(&on_gpu), losses(&on_cpu));
    let mut worst = (after - held_out(&on_cpu).1).abs();
    for (g, c) in gpu.iter().zip(&cpu) {
        worst = worst.max((g - c).abs());
    }
    assert!(
        worst <= GPT_GPU_LOSS_TOLERANCE,
        "GPU and CPU losses {worst:e} apart: {gpu:?} vs {cpu:?}"
    );
    assert_eq!(on_gpu.sample.len(), 16, "the GPU model samples");
    println!(
        "{}",
        serde_json::json!({
            "test": "candle_gpt_gpu_vs_cpu", "held_out_before": before, "held_out_after": after,
            "held_out_after_cpu": held_out(&on_cpu).1, "max_loss_difference": worst,
            "tokens_per_s": on_gpu.tokens_per_s,
        })
    );
}

/// Steps of the gradient-path comparisons (the 50).
const PATH_STEPS: usize = 50;
/// The largest difference allowed between a weight trained with gradients reduced in GPU
/// memory and through the host. Two replicas' gradients are summed by one addition either way
/// (NCCL's or the host's, both IEEE f32), so the runs are expected to agree to the bit; the
/// tolerance is the bound.
const PATH_TOLERANCE: f32 = 1e-5;

/// The options of a path comparison: the reference MLP on `replicas` GPU replicas of this
/// process from the initial values in `init`, `through_host` or not.
fn path_options(
    init: &std::path::Path,
    replicas: usize,
    through_host: bool,
) -> candle_mlp::Options {
    candle_mlp::Options {
        replicas,
        steps: PATH_STEPS,
        init: Some(init.to_owned()),
        gpu: true,
        through_host,
        deadline: std::time::Duration::from_secs(60),
        ..candle_mlp::Options::default()
    }
}

/// The largest difference between two runs' weights (every variable, by name).
fn max_weight_difference(
    a: &std::collections::BTreeMap<String, Vec<f32>>,
    b: &std::collections::BTreeMap<String, Vec<f32>>,
) -> f32 {
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "the same variables"
    );
    a.iter()
        .flat_map(|(name, a)| a.iter().zip(&b[name]).map(|(x, y)| (x - y).abs()))
        .fold(0.0, f32::max)
}

#[test]
fn two_gpus_reduce_their_gradients_in_gpu_memory_as_through_the_host() {
    let Some(_) = gpus_or_skip(2) else {
        eprintln!(
            "skipped: the in-process path needs two GPUs (NCCL refuses two ranks of one process \
             on one GPU); on one GPU the two-worker tests below cover it"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let init = dir.path().join("init.safetensors");
    candle_mlp::write_initial_values(&init).unwrap();
    let on_gpu = candle_mlp::train(&path_options(&init, 2, false)).unwrap();
    let again = candle_mlp::train(&path_options(&init, 2, false)).unwrap();
    let host = candle_mlp::train(&path_options(&init, 2, true)).unwrap();
    assert!(on_gpu.buckets_on_gpu && !host.buckets_on_gpu);
    assert_eq!(
        on_gpu.bytes_through_host, 0,
        "no gradient byte crossed to the host"
    );
    assert!(host.bytes_through_host > 0);
    assert_eq!(on_gpu.weights, again.weights, "two runs give the same bits");
    let diff = max_weight_difference(&on_gpu.weights, &host.weights);
    assert!(diff <= PATH_TOLERANCE, "GPU path against host path: {diff}");
    assert!(
        on_gpu.losses[PATH_STEPS - 1] < on_gpu.losses[0],
        "{:?}",
        on_gpu.losses
    );
    println!(
        "{{\"test\": \"two_gpus_gradient_path\", \"max_weight_difference\": {diff}, \
         \"steps_per_s_gpu_path\": {:.1}, \"steps_per_s_host_path\": {:.1}, \
         \"host_bytes_host_path\": {}}}",
        on_gpu.steps_per_s, host.steps_per_s, host.bytes_through_host
    );
}

/// Two worker processes on one GPU, each a "node" of its own for NCCL, under `mpirun`.
#[cfg(feature = "mpi")]
mod two_workers_on_one_gpu {
    use std::time::{Duration, Instant};

    use distribute_test_support::mpirun::{rank, run_self, write_result};

    use super::{PATH_STEPS, PATH_TOLERANCE, candle_mlp, gpus_or_skip, max_weight_difference};

    /// The initial values every worker loads.
    const INIT: &str = "DISTRIBUTE_TEST_GPU_INIT";
    /// Set to 1: the workers reduce through the host.
    const THROUGH_HOST: &str = "DISTRIBUTE_TEST_THROUGH_HOST";
    /// Set to a step: worker 1 freezes after it (never returns), worker 0 reports its error.
    const FREEZE_AFTER: &str = "DISTRIBUTE_TEST_FREEZE_AFTER";
    /// The frozen-worker job's deadline.
    const DEADLINE: Duration = Duration::from_secs(15);
    /// How long one `mpirun` may take before the test kills it and fails.
    const LIMIT: Duration = Duration::from_secs(200);

    /// Whether NCCL loads here, or why the test is skipped (it fails instead under
    /// `DISTRIBUTE_REQUIRE_NCCL=1`).
    fn nccl_or_skip() -> bool {
        match distribute_nccl::require_nccl() {
            Ok(()) => true,
            Err(e) => {
                assert!(
                    std::env::var("DISTRIBUTE_REQUIRE_NCCL").map_or(true, |v| v != "1"),
                    "DISTRIBUTE_REQUIRE_NCCL=1 but NCCL does not load: {e}"
                );
                eprintln!("skipped: {e}");
                false
            }
        }
    }

    #[test]
    #[ignore = "a worker process: started by mpirun from the tests of this module"]
    fn gpu_worker() {
        // NCCL before 2.30 refuses two ranks on one GPU within one node: each process gets a
        // host id of its own, so NCCL takes them for two nodes (over its socket transport).
        // SAFETY: set before the strategy starts any thread of this process's own.
        unsafe { std::env::set_var("NCCL_HOSTID", format!("distribute-gpu-worker-{}", rank())) };
        let init = std::env::var(INIT).expect("started by the launching test");
        let through_host = std::env::var(THROUGH_HOST).is_ok_and(|v| v == "1");
        let freeze_after: Option<usize> = std::env::var(FREEZE_AFTER)
            .ok()
            .map(|s| s.parse().expect("a step"));
        let me = rank();
        let mut options = super::path_options(std::path::Path::new(&init), 1, through_host);
        if freeze_after.is_some() {
            options.deadline = DEADLINE;
        }
        options.after_step = Some(candle_mlp::AfterStep(std::sync::Arc::new(move |step| {
            if me == 1 && freeze_after == Some(step) {
                loop {
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        })));
        let result = match candle_mlp::train_multi_worker(&options) {
            Ok((trained, workers, _)) => serde_json::json!({
                "workers": workers,
                "weights": trained.weights,
                "losses": trained.losses,
                "bytes_through_host": trained.bytes_through_host,
                "buckets_on_gpu": trained.buckets_on_gpu,
                "steps_per_s": trained.steps_per_s,
            }),
            Err(e) => serde_json::json!({ "error": e.to_string() }),
        };
        write_result(&result.to_string());
    }

    /// Every worker's result of a job with the variables `env`, which must succeed.
    fn job(env: &[(&str, String)]) -> Vec<serde_json::Value> {
        let job = run_self("two_workers_on_one_gpu::gpu_worker", 2, env, LIMIT);
        assert!(
            job.status.success(),
            "mpirun exited with {}:\n{}",
            job.status,
            job.stdout
        );
        assert_eq!(job.results.len(), 2, "{}", job.stdout);
        job.results
            .iter()
            .map(|r| serde_json::from_str(r).expect("a worker's JSON"))
            .collect()
    }

    fn weights(result: &serde_json::Value) -> std::collections::BTreeMap<String, Vec<f32>> {
        serde_json::from_value(result["weights"].clone()).expect("the weights, by name")
    }

    #[test]
    fn two_workers_share_one_gpu_and_reduce_over_nccl_as_through_the_host() {
        if gpus_or_skip(1).is_none() || !nccl_or_skip() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let init = dir.path().join("init.safetensors");
        candle_mlp::write_initial_values(&init).unwrap();
        let init = init.to_str().unwrap().to_owned();
        let nccl = job(&[(INIT, init.clone())]);
        let again = job(&[(INIT, init.clone())]);
        let host = job(&[(INIT, init), (THROUGH_HOST, "1".into())]);
        for worker in &nccl {
            assert_eq!(worker["workers"], 2, "{worker}");
            assert_eq!(worker["buckets_on_gpu"], true, "{worker}");
            assert_eq!(worker["bytes_through_host"], 0, "{worker}");
        }
        assert!(host[0]["bytes_through_host"].as_u64().unwrap() > 0);
        assert_eq!(
            weights(&nccl[0]),
            weights(&nccl[1]),
            "both workers' copies agree"
        );
        assert_eq!(
            weights(&nccl[0]),
            weights(&again[0]),
            "two runs give the same bits"
        );
        let diff = max_weight_difference(&weights(&nccl[0]), &weights(&host[0]));
        assert!(
            diff <= PATH_TOLERANCE,
            "NCCL path against host path: {diff}"
        );
        let losses: Vec<f32> = serde_json::from_value(nccl[0]["losses"].clone()).unwrap();
        assert!(losses[PATH_STEPS - 1] < losses[0], "{losses:?}");
        println!(
            "{{\"test\": \"two_workers_one_gpu_gradient_path\", \"max_weight_difference\": \
             {diff}, \"steps_per_s_nccl\": {}, \"steps_per_s_host\": {}, \
             \"host_bytes_host_path\": {}}}",
            nccl[0]["steps_per_s"], host[0]["steps_per_s"], host[0]["bytes_through_host"]
        );
    }

    #[test]
    fn a_frozen_worker_ends_the_other_s_wait_at_the_deadline() {
        if gpus_or_skip(1).is_none() || !nccl_or_skip() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let init = dir.path().join("init.safetensors");
        candle_mlp::write_initial_values(&init).unwrap();
        let start = Instant::now();
        let job = run_self(
            "two_workers_on_one_gpu::gpu_worker",
            2,
            &[
                (INIT, init.to_str().unwrap().to_owned()),
                (FREEZE_AFTER, "3".into()),
            ],
            LIMIT,
        );
        let took = start.elapsed();
        // Worker 0's NCCL call gives up at the deadline; its end-of-step agreement (over MPI)
        // then waits for worker 1 as long, names it and aborts the MPI job: no result.
        assert!(
            !job.status.success() && job.results.is_empty(),
            "the job must fail without a result:\n{}\n{}",
            job.stdout,
            job.stderr
        );
        let named = job
            .stderr
            .lines()
            .find(|l| l.contains("aborting the MPI job") && l.contains("for worker 1"))
            .unwrap_or_else(|| panic!("a worker names the frozen one:\n{}", job.stderr))
            .to_owned();
        // Start-up and three steps, then at most the two deadlines and the abort.
        assert!(
            took < DEADLINE * 4 + Duration::from_secs(60),
            "took {took:?}"
        );
        println!(
            "{{\"test\": \"frozen_gpu_worker\", \"seconds\": {:.1}, \"message\": {}}}",
            took.as_secs_f64(),
            serde_json::Value::String(named)
        );
    }
}
