//! `cargo xtask bench strategy` (beside `distribute-mirrored`'s step-overhead bench): the demo's
//! own training loop, as a user runs it, one JSON line per case. Every strategy run is a call of
//! the demo library's [`mirrored::train`] or [`tpu::train_tpu`], the functions `cargo xtask demo`
//! calls: a fresh strategy, the wine data's global batches from `distribute_dataset` (prefetched
//! per replica on the input pipeline's background thread), mirrored variables, one fused gradient
//! `all_reduce` and one `merge_call` momentum update a step, validation every 50 steps and the
//! progress bar updated every 20 steps. The bar is indicatif's on stderr: it draws when stderr is a
//! terminal and is hidden (updated, not drawn) when it is not, as in the demo; indicatif starts no
//! redraw thread for it (no steady tick).
//!
//! - `train_step`: the demo's default configuration (`cargo xtask demo --replicas 1|2`: hidden
//!   32, global batch 128, 2000 steps), 7 runs of 1 and 2 replicas alternating. `median_s` is
//!   the median over runs of the time per step as the demo counts it (waiting for the input plus
//!   `strategy.run`; validation excluded), `speedup_vs_1` the ratio of steps/s against the
//!   1-replica median of the same invocation, and `split` the demo's own time split (mean per
//!   step) of the median run.
//! - `mlp`: the peer-comparison configurations of issue 16, both strategies, 1 and 2 replicas
//!   alternating, median steps/s: small (hidden 32, global batch 128; the mirrored figures are
//!   the `train_step` runs) and big (hidden 256, global batch 1024). `peers` carries the figures
//!   the author measured on the same kind of 2-core machine with TensorFlow 2.21
//!   MirroredStrategy and JAX 0.10 (`pmap` with flattened gradients; `jit` on one device): they
//!   are references, not measured by this run. The `tpu` cases need a PJRT CPU plugin
//!   (`PJRT_PLUGIN`, else the pinned one of `cargo xtask fetch-pjrt`, which `cargo xtask bench
//!   strategy` runs first); without one each prints a `skipped` line saying why. They run in
//!   both of the demo's arithmetics (`--tpu-arithmetic f64-sums`, the default, and `f32`, the
//!   program `jax.jit` emits).
//! - `floor`: [`train_hand_rolled`], the same step written by hand without the library (batches
//!   cut before the clock starts, a thread per replica for the whole run, one spin barrier a
//!   step, each replica updating its own copy), run after each `MirroredStrategy` run of the
//!   default and the big configuration on the same replica count. Its `speedup_vs_1` is what a
//!   hand-written loop gains from 2 replicas over 1 on this machine at that size, a reference
//!   for the strategy's; `mirrored_vs_floor` is the strategy's steps/s as a fraction of it.
//!   Every run must train the strategy's weights to the bit. It spins, so it runs only where
//!   every replica has a core (a `skipped` line says so).
//! - `jax_jit` in this run: where `python3` imports `jax`, the `tpu` cases alternate with runs of
//!   `peers/jax_mlp.py` (the same model and batch with `jax.jit` on one CPU device, the batches
//!   already on the device), and each 1-replica `tpu` line carries the median JAX steps/s of
//!   this run (`jax_jit_this_run`) and its own ratio to it (`vs_jax_jit`). Where JAX cannot
//!   run, the lines say why (`jax_skipped`). JAX is not a dependency of the build or of CI.
//!
//! Every run is checked: the replicas' copies of the weights must agree within
//! [`TOLERANCE`] and the losses must be finite. Without `--bench` (as `cargo test --all-targets`
//! runs it) a short smoke run also checks that the loss goes down, that 2 replicas train the
//! weights of 1, and (with a plugin) that `TpuStrategy` trains those of `MirroredStrategy`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, anyhow, ensure};
use distribute::pjrt::Plugin;
use distribute_demo::data::{WineData, load_wine};
use distribute_demo::hand_rolled::train_hand_rolled;
use distribute_demo::model::{Params, max_weight_difference};
use distribute_demo::tpu::StepArithmetic;
use distribute_demo::{Config, TOLERANCE, TPU_MIRRORED_TOLERANCE, mirrored, tpu};
use serde_json::{Value, json};

/// The strategies the `mlp` cases compare.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Mirrored,
    Tpu,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Mirrored => "mirrored",
            Kind::Tpu => "tpu",
        }
    }
}

/// One of the peer-comparison configurations, with the peers' steps/s on 1 and 2
/// replicas (devices) as the issue reports them; `jax_jit` is one device in both.
struct MlpCase {
    hidden: usize,
    global_batch: usize,
    /// Steps of one timed run, a few hundred milliseconds at today's speeds (`None`: the demo's
    /// default).
    steps: Option<usize>,
    tf: [f64; 2],
    jax_pmap: [f64; 2],
    jax_jit: f64,
}

const SMALL: MlpCase = MlpCase {
    hidden: 32,
    global_batch: 128,
    steps: None,
    tf: [980.0, 580.0],
    jax_pmap: [8300.0, 4400.0],
    jax_jit: 10100.0,
};

const BIG: MlpCase = MlpCase {
    hidden: 256,
    global_batch: 1024,
    steps: Some(300),
    tf: [440.0, 320.0],
    jax_pmap: [1800.0, 1500.0],
    jax_jit: 1800.0,
};

/// Where the `peers` figures come from, carried in every line that has them.
const PEERS_SOURCE: &str = "issue 16: its author on this kind of 2-core machine, not this run";

/// The replica counts compared, in the order each repetition runs them.
const REPLICAS: [usize; 2] = [1, 2];

/// Runs of each replica count of [`REPLICAS`], in its order.
type ByReplicas = [Vec<Run>; 2];

/// One training run's result that the bench reports.
#[derive(Clone, Debug)]
struct Run {
    /// Steps trained.
    steps: usize,
    /// Time per step as the demo counts it.
    per_step: f64,
    /// The mirrored run's split (`None` for TpuStrategy, whose step is one program).
    split: Option<mirrored::StepTimes>,
}

fn main() -> Result<()> {
    let full = std::env::args().any(|a| a == "--bench");
    let data = load_wine(Config::DEFAULT.seed)?;
    if full { bench(&data) } else { smoke(&data) }
}

/// The full bench: `train_step` beside the hand-written floor, then the `mlp` cases.
fn bench(data: &WineData) -> Result<()> {
    let plugin = tpu_plugin();
    let jax = jax_peer();
    let floor_fits = floor_fits();
    let (train_step, small_floor) = repeated_with_floor(7, &floor_fits, default_config, data)?;
    print_train_step(&train_step);
    print_floor(&SMALL, &small_floor, &train_step, &floor_fits);
    print_mlp(Kind::Mirrored, &SMALL, &train_step, None);
    let (big_mirrored, big_floor) =
        repeated_with_floor(5, &floor_fits, |replicas| mlp_config(&BIG, replicas), data)?;
    match &plugin {
        Ok(()) => tpu_cases(&SMALL, data, &jax)?,
        Err(reason) => print_skipped(&SMALL, reason),
    }
    print_mlp(Kind::Mirrored, &BIG, &big_mirrored, None);
    print_floor(&BIG, &big_floor, &big_mirrored, &floor_fits);
    match &plugin {
        Ok(()) => tpu_cases(&BIG, data, &jax)?,
        Err(reason) => print_skipped(&BIG, reason),
    }
    Ok(())
}

/// Whether this machine has a core for each replica of [`REPLICAS`], which the hand-written
/// loop needs (it spins), and if not, why.
fn floor_fits() -> Result<(), String> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let most = REPLICAS.iter().copied().max().unwrap_or(1);
    if cores >= most {
        Ok(())
    } else {
        Err(format!(
            "the hand-written loop spins and needs {most} cores, this machine has {cores}"
        ))
    }
}

/// `repetitions` alternating runs of `MirroredStrategy` on each replica count of [`REPLICAS`],
/// each followed (where it fits) by [`train_hand_rolled`] of the same configuration, which must
/// train the same bits; the strategy's runs and the hand-written ones.
fn repeated_with_floor(
    repetitions: usize,
    floor_fits: &Result<(), String>,
    config: impl Fn(usize) -> Config,
    data: &WineData,
) -> Result<(ByReplicas, ByReplicas)> {
    let mut floor: [Vec<Run>; 2] = Default::default();
    let strategy = repeated(repetitions, |replicas| {
        let config = config(replicas);
        let (run, trained) = mirrored_run(&config, data)?;
        if floor_fits.is_ok() {
            let i = REPLICAS.iter().position(|&r| r == replicas).unwrap_or(0);
            floor[i].push(floor_run(&config, data, &trained.params)?);
        }
        Ok(run)
    })?;
    Ok((strategy, floor))
}

/// The `tpu` lines of `case` in both arithmetics, 5 alternating repetitions of every run
/// (each arithmetic on 1 and 2 replicas, then JAX where it runs), so that the machine's drift
/// falls on all of them alike.
fn tpu_cases(case: &MlpCase, data: &WineData, jax: &Result<PathBuf, String>) -> Result<()> {
    const ARITHMETICS: [StepArithmetic; 2] = [StepArithmetic::F64Sums, StepArithmetic::F32];
    let mut runs: [[Vec<Run>; 2]; 2] = Default::default();
    let mut jax_steps_per_s = Vec::new();
    // A JAX run that fails (an old jax, a script that prints something else) costs this case
    // its JAX comparison, not the bench.
    let mut jax_failed = None;
    for _ in 0..5 {
        for (arithmetic, runs) in ARITHMETICS.iter().zip(&mut runs) {
            for (i, &replicas) in REPLICAS.iter().enumerate() {
                let config = Config {
                    tpu_arithmetic: *arithmetic,
                    ..mlp_config(case, replicas)
                };
                runs[i].push(tpu_run(&config, data)?);
            }
        }
        if let (Ok(script), None) = (jax, &jax_failed) {
            match jax_run(script, case) {
                Ok(steps_per_s) => jax_steps_per_s.push(steps_per_s),
                Err(err) => jax_failed = Some(format!("the JAX peer failed: {err:#}")),
            }
        }
    }
    let jax = match (jax, &jax_failed) {
        (Err(reason), _) | (Ok(_), Some(reason)) => Err(reason.as_str()),
        (Ok(_), None) => Ok(median(&mut jax_steps_per_s)),
    };
    for (arithmetic, runs) in ARITHMETICS.iter().zip(&runs) {
        let label = match arithmetic {
            StepArithmetic::F64Sums => "f64-sums",
            StepArithmetic::F32 => "f32",
        };
        print_mlp(Kind::Tpu, case, runs, Some((label, jax)));
    }
    Ok(())
}

/// `peers/jax_mlp.py` if `python3` can import `jax`, else why not.
fn jax_peer() -> Result<PathBuf, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("peers/jax_mlp.py");
    let probe = Command::new("python3")
        .args(["-c", "import jax"])
        .env("JAX_PLATFORMS", "cpu")
        .output()
        .map_err(|err| format!("python3 does not run: {err}"))?;
    if !probe.status.success() {
        return Err(format!(
            "python3 cannot import jax (pip install jax to compare): {}",
            String::from_utf8_lossy(&probe.stderr)
                .trim()
                .lines()
                .last()
                .unwrap_or("")
        ));
    }
    Ok(script)
}

/// One run of the JAX peer on `case` on one CPU device (the batches on the device, as its
/// default): its steps/s.
fn jax_run(script: &Path, case: &MlpCase) -> Result<f64> {
    let steps = case.steps.unwrap_or(Config::DEFAULT.steps);
    // On the CPU, as the `tpu` cases run on the PJRT CPU plugin, even where jax has a GPU.
    let output = Command::new("python3")
        .env("JAX_PLATFORMS", "cpu")
        .arg(script)
        .args(["--hidden", &case.hidden.to_string()])
        .args(["--batch", &case.global_batch.to_string()])
        .args(["--steps", &steps.to_string()])
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    ensure!(
        output.status.success(),
        "{} failed: {}",
        script.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    // The script's one line ends in `: N steps/s`.
    stdout
        .trim()
        .strip_suffix(" steps/s")
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|n| n.parse::<f64>().ok())
        .ok_or_else(|| anyhow!("{} printed no steps/s: {stdout:?}", script.display()))
}

/// The median of `values` (the upper one of an even count).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The smoke run: short trainings that check what the bench's runs rely on, and the lines
/// printed from them.
fn smoke(data: &WineData) -> Result<()> {
    let short = |replicas| Config {
        steps: 150,
        ..default_config(replicas)
    };
    let one = mirrored::train(&short(1), data)?;
    let two = mirrored::train(&short(2), data)?;
    for trained in [&one, &two] {
        let first = trained.losses[0];
        let last = mean(&trained.losses[trained.losses.len() - 20..]);
        ensure!(
            last < 0.8 * first,
            "the training loss did not go down: {first} at the first step, {last} over the last 20"
        );
    }
    ensure!(
        two.copy_difference == 0.0,
        "the 2 replicas' copies of the weights differ by {}",
        two.copy_difference
    );
    let difference = max_weight_difference(&one.params, &two.params);
    ensure!(
        difference <= TOLERANCE,
        "2 replicas trained other weights than 1: they differ by {difference}"
    );
    let runs = [&one, &two].map(|trained| {
        vec![Run {
            steps: trained.losses.len(),
            per_step: trained.times.total().as_secs_f64(),
            split: Some(trained.times),
        }]
    });
    print_train_step(&runs);
    let fits = floor_fits();
    let mut floor: [Vec<Run>; 2] = Default::default();
    if fits.is_ok() {
        for (i, trained) in [&one, &two].into_iter().enumerate() {
            floor[i].push(floor_run(&short(REPLICAS[i]), data, &trained.params)?);
        }
    }
    print_floor(&SMALL, &floor, &runs, &fits);

    match tpu_plugin() {
        Ok(()) => {
            let on_tpu = REPLICAS.map(|replicas| tpu::train_tpu(&short(replicas), data));
            let [tpu_one, tpu_two] = on_tpu;
            let (tpu_one, tpu_two) = (tpu_one?, tpu_two?);
            ensure!(
                tpu_two.copy_difference == 0.0,
                "the 2 TPU replicas' copies of the weights differ by {}",
                tpu_two.copy_difference
            );
            for (replicas, on_tpu, on_mirrored) in [(1, &tpu_one, &one), (2, &tpu_two, &two)] {
                let difference = max_weight_difference(&on_tpu.params, &on_mirrored.params);
                ensure!(
                    difference <= TPU_MIRRORED_TOLERANCE,
                    "on {replicas} replicas TpuStrategy trained other weights than \
                     MirroredStrategy: they differ by {difference}"
                );
            }
            let runs = [&tpu_one, &tpu_two].map(|trained| {
                vec![Run {
                    steps: trained.losses.len(),
                    per_step: trained.times.total().as_secs_f64(),
                    split: None,
                }]
            });
            print_mlp(Kind::Tpu, &SMALL, &runs, None);
        }
        Err(reason) => print_skipped(&SMALL, &reason),
    }
    Ok(())
}

/// The demo's default configuration on `replicas` CPU replicas: `cargo xtask demo --replicas N`.
fn default_config(replicas: usize) -> Config {
    Config::on_cpus(replicas)
}

/// `case`'s model and batch, otherwise the demo's defaults, on `replicas` replicas.
fn mlp_config(case: &MlpCase, replicas: usize) -> Config {
    Config {
        hidden: case.hidden,
        global_batch: case.global_batch,
        steps: case.steps.unwrap_or(Config::DEFAULT.steps),
        ..default_config(replicas)
    }
}

/// One `MirroredStrategy` training run, checked, and what it trained.
fn mirrored_run(config: &Config, data: &WineData) -> Result<(Run, mirrored::Trained)> {
    let trained = mirrored::train(config, data)?;
    check(config, trained.copy_difference, &trained.losses)?;
    let run = Run {
        steps: config.steps,
        per_step: trained.times.total().as_secs_f64(),
        split: Some(trained.times),
    };
    Ok((run, trained))
}

/// One run of the hand-written loop, which must train `strategy_params`, the bits
/// `MirroredStrategy` trained from the same configuration.
fn floor_run(config: &Config, data: &WineData, strategy_params: &Params) -> Result<Run> {
    let by_hand = train_hand_rolled(config, data)?;
    let difference = max_weight_difference(&by_hand.params, strategy_params);
    ensure!(
        by_hand.params.same_bits(strategy_params),
        "on {} replicas the hand-written loop trained other weights than MirroredStrategy: \
         they differ by {difference}",
        config.devices.len()
    );
    Ok(Run {
        steps: config.steps,
        per_step: 1.0 / by_hand.steps_per_s,
        split: None,
    })
}

/// One `TpuStrategy` training run (compilation excluded, as the demo counts), checked.
fn tpu_run(config: &Config, data: &WineData) -> Result<Run> {
    let trained = tpu::train_tpu(config, data)?;
    check(config, trained.copy_difference, &trained.losses)?;
    Ok(Run {
        steps: config.steps,
        per_step: trained.times.total().as_secs_f64(),
        split: None,
    })
}

/// What every timed run must show: copies in sync, a loss for every step, all finite.
fn check(config: &Config, copy_difference: f32, losses: &[f32]) -> Result<()> {
    ensure!(
        copy_difference <= TOLERANCE,
        "{} replicas' copies of the weights differ by {copy_difference}",
        config.devices.len()
    );
    ensure!(
        losses.len() == config.steps && losses.iter().all(|l| l.is_finite()),
        "a run of {} steps ended with {} losses, or a loss that is not finite",
        config.steps,
        losses.len()
    );
    Ok(())
}

/// `repetitions` runs of each replica count of [`REPLICAS`], alternating so that the machine's
/// drift falls on both alike; the runs of each count in order.
fn repeated(
    repetitions: usize,
    mut run: impl FnMut(usize) -> Result<Run>,
) -> Result<[Vec<Run>; 2]> {
    let mut runs: [Vec<Run>; 2] = Default::default();
    for _ in 0..repetitions {
        for (i, &replicas) in REPLICAS.iter().enumerate() {
            runs[i].push(run(replicas)?);
        }
    }
    Ok(runs)
}

/// The run whose time per step is the median (the upper one of an even count).
fn median_run(runs: &[Run]) -> &Run {
    let mut sorted: Vec<&Run> = runs.iter().collect();
    sorted.sort_by(|a, b| a.per_step.total_cmp(&b.per_step));
    sorted[sorted.len() / 2]
}

fn print_train_step(runs: &[Vec<Run>; 2]) {
    let one = median_run(&runs[0]).per_step;
    for (&replicas, runs) in REPLICAS.iter().zip(runs) {
        let median = median_run(runs);
        let split = median.split.unwrap_or_default();
        println!(
            "{}",
            json!({
                "bench": "train_step",
                "replicas": replicas,
                "runs": runs.len(),
                "steps": median.steps,
                "median_s": median.per_step,
                "steps_per_s": 1.0 / median.per_step,
                "speedup_vs_1": one / median.per_step,
                "split": {
                    "compute_s": split.compute.as_secs_f64(),
                    "all_reduce_s": split.all_reduce.as_secs_f64(),
                    "merge_call_s": split.merge_call.as_secs_f64(),
                    "input_s": split.input.as_secs_f64(),
                    "dispatch_s": split.dispatch.as_secs_f64(),
                },
            })
        );
    }
}

/// The `floor` lines of `case`: the hand-written loop's steps/s and speedup on each replica
/// count, and the strategy's steps/s as a fraction of it, all from the runs of this invocation;
/// or why the loop could not run here.
fn print_floor(
    case: &MlpCase,
    floor: &[Vec<Run>; 2],
    strategy: &[Vec<Run>; 2],
    fits: &Result<(), String>,
) {
    let mut line = json!({
        "bench": "floor",
        "hidden": case.hidden,
        "global_batch": case.global_batch,
        "what": FLOOR_WHAT,
    });
    if let Err(reason) = fits {
        line["skipped"] = json!(reason);
        println!("{line}");
        return;
    }
    let one = median_run(&floor[0]).per_step;
    for ((&replicas, floor_runs), strategy) in REPLICAS.iter().zip(floor).zip(strategy) {
        let (floor, strategy) = (median_run(floor_runs), median_run(strategy));
        line["replicas"] = json!(replicas);
        line["runs"] = json!(floor_runs.len());
        line["steps_per_s"] = json!(1.0 / floor.per_step);
        line["speedup_vs_1"] = json!(one / floor.per_step);
        line["mirrored_steps_per_s"] = json!(1.0 / strategy.per_step);
        line["mirrored_vs_floor"] = json!(floor.per_step / strategy.per_step);
        println!("{line}");
    }
}

/// What the `floor` lines measure, carried in each.
const FLOOR_WHAT: &str = "the same step written by hand (hand_rolled.rs): batches cut before \
    the clock starts, a thread per replica for the whole run, one spin barrier a step, each \
    replica updating its own copy; the same weights to the bit";

/// The `mlp` lines of one strategy's runs. `tpu` is `Some((arithmetic, JAX))` for the `tpu`
/// cases: the arithmetic's name, and JAX `jit`'s median steps/s in this run or why it did not
/// run.
fn print_mlp(
    kind: Kind,
    case: &MlpCase,
    runs: &[Vec<Run>; 2],
    tpu: Option<(&str, Result<f64, &str>)>,
) {
    let one = median_run(&runs[0]).per_step;
    for (i, (&replicas, runs)) in REPLICAS.iter().zip(runs).enumerate() {
        let median = median_run(runs);
        let steps_per_s = 1.0 / median.per_step;
        let mut line = json!({
            "bench": "mlp",
            "strategy": kind.name(),
            "hidden": case.hidden,
            "global_batch": case.global_batch,
            "replicas": replicas,
            "runs": runs.len(),
            "steps": median.steps,
            "steps_per_s": steps_per_s,
            "speedup_vs_1": one / median.per_step,
            "peers": peers(case, i),
        });
        if let Some((arithmetic, jax)) = &tpu {
            line["arithmetic"] = json!(arithmetic);
            match jax {
                // JAX `jit` runs on one device: only the 1-replica line compares with it.
                Ok(jax) if replicas == 1 => {
                    line["jax_jit_this_run"] = json!(jax);
                    line["vs_jax_jit"] = json!(steps_per_s / jax);
                }
                Ok(_) => {}
                Err(reason) => line["jax_skipped"] = json!(reason),
            }
        }
        println!("{line}");
    }
}

/// The peer figures for `case` on `REPLICAS[i]` replicas.
fn peers(case: &MlpCase, i: usize) -> Value {
    json!({
        "tf": case.tf[i],
        "jax_pmap": case.jax_pmap[i],
        "jax_jit": case.jax_jit,
        "source": PEERS_SOURCE,
    })
}

fn print_skipped(case: &MlpCase, reason: &str) {
    println!(
        "{}",
        json!({
            "bench": "mlp",
            "strategy": Kind::Tpu.name(),
            "hidden": case.hidden,
            "global_batch": case.global_batch,
            "skipped": reason,
        })
    );
}

/// Whether a PJRT plugin can be loaded for the `tpu` cases, and if not, why.
fn tpu_plugin() -> Result<(), String> {
    Plugin::discover().map(drop).map_err(|err| err.to_string())
}

fn mean(values: &[f32]) -> f32 {
    values.iter().sum::<f32>() / values.len() as f32
}
