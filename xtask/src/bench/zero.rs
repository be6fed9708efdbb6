//! `cargo xtask bench zero`: ZeRO's memory and speed. The reference workload's `candle_mlp`
//! example with hidden layers of [`HIDDEN`] (16.3M parameters) and AdamW, unsharded, ZeRO-1 and
//! ZeRO-2, as 1 process × 2 replicas and as 2 workers × 1 replica under `mpirun`, the cases
//! alternating in rounds; each worker's peak resident memory (`VmHWM`), the library's own bytes
//! per replica and steps per second, as JSON lines with the savings against the unsharded run
//! of the same shape.

use std::collections::BTreeMap;
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::cargo::{metadata, workspace_root};
use crate::mpirun::{build_release, cores, mpirun_args, mpirun_output, resolve};
use crate::packages::package_of_example;

const CANDLE_MLP: &str = "candle_mlp";
/// Units of each hidden layer: 64·H + H² + 10·H + biases = 16.3M parameters at 4000.
const HIDDEN: &str = "4000";
/// Steps of each run.
const STEPS: &str = "4";
/// Rounds of alternating cases; each case's medians.
const ROUNDS: usize = 3;
const SHARDINGS: [&str; 3] = ["none", "zero1", "zero2"];

/// One run's figures.
#[derive(Clone)]
struct Run {
    steps_per_s: f64,
    /// Each worker's peak resident memory, KiB.
    peaks_kib: Vec<u64>,
    memory: Value,
}

/// Runs the suite.
pub(super) fn bench_zero() -> Result<()> {
    let metadata = metadata()?;
    let mpi = resolve(&metadata).context("the zero bench builds candle_mlp with feature mpi")?;
    let package = package_of_example(&metadata, CANDLE_MLP)?;
    let exe = build_release(&metadata, &mpi, &package, "--example", CANDLE_MLP)?;
    let args = |replicas: &str, sharding: &str| -> Vec<String> {
        [
            "--replicas",
            replicas,
            "--optimizer",
            "adamw",
            "--hidden",
            HIDDEN,
            "--steps",
            STEPS,
            "--sharding",
            sharding,
            "--json",
            "--no-weights",
        ]
        .iter()
        .map(|a| (*a).to_owned())
        .collect()
    };
    let mut runs: BTreeMap<(usize, &str), Vec<Run>> = BTreeMap::new();
    for _ in 0..ROUNDS {
        for sharding in SHARDINGS {
            let out = Command::new(&exe)
                .args(args("2", sharding))
                .envs(mpi.env())
                .current_dir(workspace_root())
                .output()
                .with_context(|| format!("could not start {}", exe.display()))?;
            if !out.status.success() {
                bail!(
                    "{CANDLE_MLP} --sharding {sharding} (1 process) exited with {}: {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            let json: Value = serde_json::from_slice(&out.stdout)
                .with_context(|| format!("{CANDLE_MLP} printed no JSON"))?;
            runs.entry((1, sharding)).or_default().push(run_of(&json)?);
            let out = mpirun_output(
                &mpi,
                &format!("{CANDLE_MLP} --sharding {sharding} (2 workers)"),
                &mpirun_args(2, cores(), &exe, &args("1", sharding)),
            )?;
            let chief = out
                .lines()
                .find_map(|l| serde_json::from_str::<Value>(l).ok())
                .with_context(|| format!("the chief printed no JSON line: {out}"))?;
            runs.entry((2, sharding)).or_default().push(run_of(&chief)?);
        }
    }
    for workers in [1usize, 2] {
        let none = summary(&runs[&(workers, "none")]);
        for sharding in SHARDINGS {
            let s = summary(&runs[&(workers, sharding)]);
            let replicas_per_worker = if workers == 1 { 2 } else { 1 };
            // What sharding should save per worker: the optimizer's state (ZeRO-1), and with
            // ZeRO-2 the reduced gradients too, over this worker's replicas.
            let bytes = |run: &Summary, key: &str| {
                run.memory[key].as_u64().unwrap_or(0) * replicas_per_worker as u64
            };
            let state_saving =
                bytes(&none, "optimizer_state") as f64 - bytes(&s, "optimizer_state") as f64;
            let gradient_saving = bytes(&none, "gradients") as f64 - bytes(&s, "gradients") as f64;
            let drop_kib: Vec<i64> = none
                .peaks_kib
                .iter()
                .zip(&s.peaks_kib)
                .map(|(a, b)| *a as i64 - *b as i64)
                .collect();
            let worst_drop = drop_kib.iter().copied().min().unwrap_or(0) as f64 * 1024.0;
            let expected = state_saving + gradient_saving;
            println!(
                "{}",
                json!({
                    "bench": "zero", "workers": workers, "replicas_per_worker": replicas_per_worker,
                    "sharding": sharding, "parameters_per_replica_bytes": s.memory["parameters"],
                    "optimizer_state_per_replica_bytes": s.memory["optimizer_state"],
                    "gradients_per_replica_bytes": s.memory["gradients"],
                    "peak_rss_mib": s.peaks_kib.iter().map(|k| k / 1024).collect::<Vec<_>>(),
                    "peak_drop_mib": drop_kib.iter().map(|k| k / 1024).collect::<Vec<_>>(),
                    "expected_saving_mib": (expected / (1024.0 * 1024.0)).round(),
                    "drop_over_expected": if expected > 0.0 { json!(worst_drop / expected) } else { Value::Null },
                    "steps_per_s": s.steps_per_s,
                    "speed_vs_none": s.steps_per_s / none.steps_per_s,
                    "rounds": ROUNDS, "hidden": HIDDEN, "steps": STEPS,
                })
            );
        }
    }
    Ok(())
}

/// The figures of one run from its JSON line.
fn run_of(json: &Value) -> Result<Run> {
    Ok(Run {
        steps_per_s: json["steps_per_s"]
            .as_f64()
            .with_context(|| format!("no steps_per_s in {json}"))?,
        peaks_kib: serde_json::from_value(json["peak_rss_kib"].clone())
            .with_context(|| format!("no peak_rss_kib in {json}"))?,
        memory: json["memory"].clone(),
    })
}

/// A case's medians.
struct Summary {
    steps_per_s: f64,
    peaks_kib: Vec<u64>,
    memory: Value,
}

fn summary(runs: &[Run]) -> Summary {
    let median_f = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let workers = runs[0].peaks_kib.len();
    Summary {
        steps_per_s: median_f(runs.iter().map(|r| r.steps_per_s).collect()),
        peaks_kib: (0..workers)
            .map(|w| {
                let mut v: Vec<u64> = runs.iter().map(|r| r.peaks_kib[w]).collect();
                v.sort();
                v[v.len() / 2]
            })
            .collect(),
        memory: runs[0].memory.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_case_s_summary_takes_the_medians_per_worker() {
        let run = |rate: f64, peaks: [u64; 2]| Run {
            steps_per_s: rate,
            peaks_kib: peaks.to_vec(),
            memory: json!({"optimizer_state": 8}),
        };
        let s = summary(&[run(1.0, [10, 50]), run(3.0, [30, 20]), run(2.0, [20, 40])]);
        assert_eq!(s.steps_per_s, 2.0);
        assert_eq!(s.peaks_kib, [20, 40]);
        let parsed = run_of(&json!({"steps_per_s": 0.5, "peak_rss_kib": [7, 9],
                                    "memory": {"gradients": 4}}))
        .unwrap();
        assert_eq!(parsed.peaks_kib, [7, 9]);
        assert!(run_of(&json!({"steps_per_s": 0.5})).is_err());
    }
}
