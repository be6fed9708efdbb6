//! `cargo xtask bench [SUITE...]`: benchmark suites by name, or every bench of the workspace
//! (`cargo bench --workspace`) when none is named. The JSON suites print one line per case, with
//! ratios measured in the same run; `multi-worker` and `candle`'s multi-worker case run worker
//! processes under `mpirun` ([`multi_worker`]).

mod multi_worker;

use anyhow::{Result, bail};

use crate::cargo::{cargo, workspace_root};
use crate::provision::pjrt;

/// Benchmark suites: the name `cargo xtask bench` takes, the package, and its bench target that
/// prints one JSON line per case (`None`: the package's criterion benches). A suite of several
/// rows runs each in order.
const SUITES: &[(&str, &str, Option<&str>)] = &[
    ("device-spec", "distribute-device-spec", None),
    ("collectives", "distribute-collectives", Some("collectives")),
    ("input", "distribute-input", Some("input")),
    ("strategy", "distribute-mirrored", Some("strategy")),
    // The demo's own training loop, and issue 16's MLP configurations on both strategies.
    ("strategy", "distribute-demo", Some("train_step")),
    ("tpu", "distribute-tpu", Some("tpu")),
    // The reference candle MLP with distribute-candle against plain candle; the suite then adds
    // its multi-worker case under mpirun.
    ("candle", "distribute-candle", Some("candle")),
];

/// The suite that ends with a multi-worker case under mpirun.
const SUITE_WITH_MULTI_WORKER_CASE: &str = "candle";

/// The suite whose `tpu` cases want the PJRT CPU plugin, fetched first unless `PJRT_PLUGIN`
/// names one.
const SUITE_WITH_TPU_CASES: &str = "strategy";

/// The suite that runs worker processes under `mpirun` rather than a cargo bench target.
const MULTI_WORKER_SUITE: &str = "multi-worker";

/// Runs benchmark suites by name, or every bench of the workspace when none is named.
pub(crate) fn bench(suites: &[String]) -> Result<()> {
    if suites.is_empty() {
        return cargo("benchmarks", &["bench", "--workspace"]);
    }
    for suite in suites {
        if suite == MULTI_WORKER_SUITE {
            multi_worker::bench_multi_worker()?;
            continue;
        }
        let targets: Vec<_> = SUITES.iter().filter(|(name, ..)| name == suite).collect();
        if targets.is_empty() {
            let mut known: Vec<&str> = SUITES
                .iter()
                .map(|(name, ..)| *name)
                .chain([MULTI_WORKER_SUITE])
                .collect();
            known.dedup();
            bail!(
                "unknown benchmark suite '{suite}'; known: {}",
                known.join(", ")
            );
        }
        if suite == SUITE_WITH_TPU_CASES {
            fetch_pjrt_for_bench();
        }
        for (name, package, target) in targets {
            let mut args = vec!["bench", "--package", package];
            if let Some(target) = target {
                args.extend(["--bench", target]);
            }
            cargo(&format!("benchmarks '{name}'"), &args)?;
        }
        if suite == SUITE_WITH_MULTI_WORKER_CASE {
            multi_worker::bench_candle_multi_worker()?;
        }
    }
    Ok(())
}

/// Installs the pinned PJRT CPU plugin unless `PJRT_PLUGIN` names a plugin. A failed install
/// (no network) only warns: the bench then prints a `skipped` line for its `tpu` cases.
fn fetch_pjrt_for_bench() {
    if std::env::var_os("PJRT_PLUGIN").is_some_and(|path| !path.is_empty()) {
        return;
    }
    if let Err(err) = pjrt::install(&workspace_root(), pjrt::Plugin::Cpu) {
        eprintln!(
            "xtask: warning: could not install the PJRT CPU plugin ({err:#}); the tpu cases will be skipped"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_suites_are_named() {
        let err = bench(&["nonsense".to_owned()]).unwrap_err().to_string();
        assert!(
            err.contains("unknown benchmark suite 'nonsense'") && err.contains("collectives"),
            "{err}"
        );
        assert_eq!(err.matches("strategy").count(), 1, "{err}");
    }
}
