//! The benchmark cases that run worker processes under `mpirun` ([`crate::mpirun`]): the suite
//! `multi-worker` and the `candle` suite's multi-worker cases (the MLP's and the GPT's).

use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::cargo::{metadata, workspace_root};
use crate::mpirun::{build_release, cores, mpirun, mpirun_args, mpirun_output, resolve};
use crate::packages::package_of_example;

/// The example with the all-reduce and step cases.
const MULTI_WORKER_BENCH: &str = "multi_worker_bench";
/// `(workers, replicas per worker)` of the multi-worker bench.
const MULTI_WORKER_BENCH_SHAPES: [(usize, usize); 3] = [(2, 1), (4, 1), (2, 2)];
/// The reference workload's example.
const LINREG: &str = "linear_regression";
/// Runs of the linear regression per worker count.
const LINREG_RUNS: usize = 3;
/// The reference candle workload's example.
const CANDLE_MLP: &str = "candle_mlp";
/// Alternating runs of each candle multi-worker case.
const CANDLE_RUNS: usize = 3;
/// The small GPT's example.
const GPT: &str = "gpt";
/// Steps of each GPT run (its default model and batch; evaluated before and after only).
const GPT_STEPS: &str = "40";

/// `cargo xtask bench multi-worker`: `distribute-mirrored`'s `multi_worker_bench` example under
/// `mpirun` as 2 and 4 workers of 1 replica and 2 workers of 2 (its chief prints the
/// all-reduce and trivial-step lines), then the `linear_regression` example as 2 and 4 workers,
/// whose steps per second become `multi_worker_linreg` lines (the median of
/// [`LINREG_RUNS`] runs: one run is only 200 steps).
pub(super) fn bench_multi_worker() -> Result<()> {
    let metadata = metadata()?;
    let mpi = resolve(&metadata)?;
    let package = package_of_example(&metadata, MULTI_WORKER_BENCH)?;
    let exe = build_release(&metadata, &mpi, &package, "--example", MULTI_WORKER_BENCH)?;
    for (workers, replicas) in MULTI_WORKER_BENCH_SHAPES {
        let args = mpirun_args(
            workers,
            cores(),
            &exe,
            &["--replicas".to_owned(), replicas.to_string()],
        );
        mpirun(
            &mpi,
            &format!("benchmarks 'multi-worker' ({workers} workers × {replicas} replicas)"),
            &args,
        )?;
    }
    let package = package_of_example(&metadata, LINREG)?;
    let exe = build_release(&metadata, &mpi, &package, "--example", LINREG)?;
    for workers in [2, 4] {
        let mut rates = Vec::new();
        for _ in 0..LINREG_RUNS {
            let args = mpirun_args(
                workers,
                cores(),
                &exe,
                &["--replicas".to_owned(), "1".to_owned(), "--json".to_owned()],
            );
            let out = mpirun_output(&mpi, &format!("{LINREG} ({workers} workers)"), &args)?;
            rates.push(steps_per_s(&out)?);
        }
        rates.sort_by(f64::total_cmp);
        println!(
            "{}",
            serde_json::json!({
                "bench": "multi_worker_linreg", "workers": workers, "replicas_per_worker": 1,
                "steps_per_s": rates[rates.len() / 2],
            })
        );
    }
    Ok(())
}

/// `cargo xtask bench candle`'s multi-worker line: the reference candle MLP (`candle_mlp`) as 2
/// worker processes × 1 replica under `mpirun`, alternating with 1 process × 1 replica (all its
/// cores) in the same run; the medians and their ratio. Skipped, with a line saying why, where
/// no Open MPI or libclang can be had.
pub(super) fn bench_candle_multi_worker() -> Result<()> {
    let metadata = metadata()?;
    let mpi = match resolve(&metadata) {
        Ok(mpi) => mpi,
        Err(err) => {
            println!(
                "{}",
                serde_json::json!({
                    "bench": "candle_mlp", "workers": 2,
                    "skipped": format!("the multi-worker case: {err:#}"),
                })
            );
            return Ok(());
        }
    };
    let package = package_of_example(&metadata, CANDLE_MLP)?;
    let exe = build_release(&metadata, &mpi, &package, "--example", CANDLE_MLP)?;
    let args: Vec<String> = ["--replicas", "1", "--json", "--steps", "150"]
        .iter()
        .map(|a| (*a).to_owned())
        .collect();
    let (mut one, mut two) = (Vec::new(), Vec::new());
    let mut threads = Value::Null;
    for _ in 0..CANDLE_RUNS {
        let out = Command::new(&exe)
            .args(&args)
            .envs(mpi.env())
            .current_dir(workspace_root())
            .output()
            .with_context(|| format!("could not start {}", exe.display()))?;
        if !out.status.success() {
            bail!("{CANDLE_MLP} (1 process) exited with {}", out.status);
        }
        one.push(steps_per_s(&String::from_utf8_lossy(&out.stdout))?);
        let out = mpirun_output(
            &mpi,
            &format!("{CANDLE_MLP} (2 workers)"),
            &mpirun_args(2, cores(), &exe, &args),
        )?;
        let chief = chief_json(&out)?;
        two.push(
            chief["steps_per_s"]
                .as_f64()
                .with_context(|| format!("no steps_per_s in {chief}"))?,
        );
        threads = chief["threads_per_replica"].clone();
    }
    let median = |rates: &mut Vec<f64>| {
        rates.sort_by(f64::total_cmp);
        rates[rates.len() / 2]
    };
    let (one, two) = (median(&mut one), median(&mut two));
    println!(
        "{}",
        serde_json::json!({
            "bench": "candle_mlp", "replicas": 1, "workers": 2, "threads_per_replica": threads,
            "steps_per_s": two, "one_process_steps_per_s": one, "speedup_vs_1": two / one,
            "runs": CANDLE_RUNS,
        })
    );
    Ok(())
}

/// `cargo xtask bench candle`'s GPT multi-worker line: the `gpt` example (its default model and
/// batch, [`GPT_STEPS`] steps) as 2 worker processes × 1 replica under `mpirun`, alternating
/// with 1 process × 2 replicas of the same executable in the same run; the medians of the
/// training tokens per second (evaluation excluded) and the median of the rounds' ratios.
/// Skipped, with a line saying why, where no Open MPI or libclang can be had.
pub(super) fn bench_candle_gpt_multi_worker() -> Result<()> {
    let metadata = metadata()?;
    let mpi = match resolve(&metadata) {
        Ok(mpi) => mpi,
        Err(err) => {
            println!(
                "{}",
                serde_json::json!({
                    "bench": "candle_gpt", "workers": 2,
                    "skipped": format!("the multi-worker case: {err:#}"),
                })
            );
            return Ok(());
        }
    };
    let package = package_of_example(&metadata, GPT)?;
    let exe = build_release(&metadata, &mpi, &package, "--example", GPT)?;
    let args = |replicas: &str| -> Vec<String> {
        [
            "--replicas",
            replicas,
            "--json",
            "--steps",
            GPT_STEPS,
            "--eval-every",
            "0",
        ]
        .iter()
        .map(|a| (*a).to_owned())
        .collect()
    };
    let (mut replicas, mut workers, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let mut threads = Value::Null;
    for _ in 0..CANDLE_RUNS {
        let out = Command::new(&exe)
            .args(args("2"))
            .envs(mpi.env())
            .current_dir(workspace_root())
            .output()
            .with_context(|| format!("could not start {}", exe.display()))?;
        if !out.status.success() {
            bail!(
                "{GPT} (1 process × 2 replicas) exited with {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let two = tokens_per_s(&chief_json(&String::from_utf8_lossy(&out.stdout))?)?;
        let out = mpirun_output(
            &mpi,
            &format!("{GPT} (2 workers)"),
            &mpirun_args(2, cores(), &exe, &args("1")),
        )?;
        let chief = chief_json(&out)?;
        let across = tokens_per_s(&chief)?;
        threads = chief["threads_per_replica"].clone();
        replicas.push(two);
        workers.push(across);
        ratios.push(across / two);
    }
    let median = |values: &mut Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    println!(
        "{}",
        serde_json::json!({
            "bench": "candle_gpt", "workers": 2, "replicas_per_worker": 1,
            "threads_per_replica": threads, "tokens_per_s": median(&mut workers),
            "one_process_2_replicas_tokens_per_s": median(&mut replicas),
            "vs_2_replicas": median(&mut ratios), "runs": CANDLE_RUNS,
            "steps": GPT_STEPS.parse::<usize>()?,
        })
    );
    Ok(())
}

/// The `tokens_per_s` of a chief's JSON line (the GPT example's).
fn tokens_per_s(json: &Value) -> Result<f64> {
    json["tokens_per_s"]
        .as_f64()
        .with_context(|| format!("no tokens_per_s in {json}"))
}

/// The one JSON line a chief printed.
fn chief_json(stdout: &str) -> Result<Value> {
    let line = stdout
        .lines()
        .find(|line| line.starts_with('{'))
        .with_context(|| format!("the chief printed no JSON line; stdout:\n{stdout}"))?;
    serde_json::from_str(line).context("the chief's JSON line")
}

/// The `steps_per_s` of the one JSON line a chief printed (the linear regression's, the candle
/// MLP's).
fn steps_per_s(stdout: &str) -> Result<f64> {
    let json = chief_json(stdout)?;
    json["steps_per_s"]
        .as_f64()
        .with_context(|| format!("no steps_per_s in {json}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_linear_regression_rate_comes_from_the_chiefs_line() {
        let out = "noise\n{\"workers\":2,\"steps_per_s\":9000.5,\"bias\":0.5}\n";
        assert_eq!(steps_per_s(out).unwrap(), 9000.5);
        assert!(
            steps_per_s("no json here")
                .unwrap_err()
                .to_string()
                .contains("no JSON line")
        );
        assert!(steps_per_s("{\"bias\":1}").is_err());
    }
}
