//! `cargo xtask bench [SUITE...]`: benchmark suites by name, or every bench of the workspace
//! (`cargo bench --workspace`) when none is named. One table, [`SUITES`], says of each suite
//! what it measures, what it needs and what runs: cargo bench targets that print one JSON line
//! per case (with ratios measured in the same run) or criterion's, and the cases with worker
//! processes under `mpirun` ([`multi_worker`]).

mod multi_worker;
mod zero;

use anyhow::Result;
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};

use crate::cargo::{cargo, workspace_root};
use crate::provision::pjrt;

/// Run benchmark suites, or every bench of the workspace when none is named
///
/// The named suites, in order: each prints one JSON line per case, with ratios
/// measured in the same run (device-spec runs criterion); with none, `cargo bench --workspace`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// The suites to run
    #[arg(value_name = "SUITE", value_parser = suite_parser())]
    suites: Vec<&'static Suite>,
}

/// A benchmark suite: what `cargo xtask bench NAME` runs.
#[derive(Debug)]
pub(crate) struct Suite {
    /// The name `cargo xtask bench` takes.
    name: &'static str,
    /// What it measures, for `--help`.
    about: &'static str,
    /// What it needs besides its packages' builds.
    needs: &'static [Need],
    /// What runs, in order.
    steps: &'static [Step],
}

/// What a suite needs besides its packages' builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Need {
    /// The PJRT CPU plugin, for its `tpu` cases: installed first (as `fetch-pjrt` does) unless
    /// `PJRT_PLUGIN` names a plugin; where it cannot be installed, those cases print `skipped`.
    PjrtCpuPlugin,
    /// Open MPI and libclang for the feature `mpi`, as `DISTRIBUTE_MPI` chooses.
    Mpi,
}

impl Need {
    /// The need, as `--help` says it.
    fn describe(self) -> &'static str {
        match self {
            Need::PjrtCpuPlugin => "the PJRT CPU plugin, installed first",
            Need::Mpi => "the feature mpi: Open MPI and libclang",
        }
    }
}

/// One step of a suite.
#[derive(Debug)]
enum Step {
    /// `cargo bench --package PACKAGE --bench BENCH`: a bench that prints one JSON line per case.
    Json {
        package: &'static str,
        bench: &'static str,
    },
    /// `cargo bench --package PACKAGE`: the package's criterion benches.
    Criterion { package: &'static str },
    /// Worker processes under `mpirun` ([`multi_worker`]).
    Mpirun(fn() -> Result<()>),
}

/// Every suite, in the order `--help` lists them.
pub(crate) const SUITES: &[Suite] = &[
    Suite {
        name: "device-spec",
        about: "parsing, printing and canonicalising device names (criterion)",
        needs: &[],
        steps: &[Step::Criterion {
            package: "distribute-device-spec",
        }],
    },
    Suite {
        name: "collectives",
        about: "all-reduce from persistent replica threads, beside the machine's memory \
                bandwidth",
        needs: &[],
        steps: &[Step::Json {
            package: "distribute-collectives",
            bench: "collectives",
        }],
    },
    Suite {
        name: "input",
        about: "a distributed dataset (per-replica batches, prefetched) against iterating its \
                raw batched source",
        needs: &[],
        steps: &[Step::Json {
            package: "distribute-input",
            bench: "input",
        }],
    },
    Suite {
        name: "strategy",
        about: "a MirroredStrategy's step overhead on CPU replicas; then the demo's training \
                loop on 1 and 2 replicas beside the same step written by hand (its floor), and \
                issue 16's MLP configurations on both strategies (the tpu ones beside JAX jit \
                runs of examples/demo/peers/jax_mlp.py where python3 imports jax)",
        needs: &[Need::PjrtCpuPlugin],
        steps: &[
            Step::Json {
                package: "distribute-mirrored",
                bench: "strategy",
            },
            Step::Json {
                package: "distribute-demo",
                bench: "train_step",
            },
        ],
    },
    Suite {
        name: "tpu",
        about: "the linear-regression step on TpuStrategy (on its PJRT plugin) and on \
                MirroredStrategy",
        needs: &[],
        steps: &[Step::Json {
            package: "distribute-tpu",
            bench: "tpu",
        }],
    },
    Suite {
        name: "candle",
        about: "the reference candle MLP with distribute-candle on 1 and 2 replicas beside a \
                plain candle loop, then as 2 workers under mpirun beside 1 process; the gpt \
                example's GPT in tokens/s on 1 and 2 replicas beside a plain candle loop (and \
                PyTorch where python3 imports torch), then as 2 workers under mpirun beside 2 \
                replicas (the mpirun cases skipped without MPI)",
        needs: &[Need::Mpi],
        steps: &[
            Step::Json {
                package: "distribute-candle",
                bench: "candle",
            },
            Step::Mpirun(multi_worker::bench_candle_multi_worker),
            Step::Json {
                package: "distribute-candle",
                bench: "gpt",
            },
            Step::Mpirun(multi_worker::bench_candle_gpt_multi_worker),
        ],
    },
    Suite {
        name: "multi-worker",
        about: "MultiWorkerMirroredStrategy under mpirun as 2 and 4 workers (×1 replica) and 2 \
                workers × 2, and the linear regression as 2 and 4 workers",
        needs: &[Need::Mpi],
        steps: &[Step::Mpirun(multi_worker::bench_multi_worker)],
    },
    Suite {
        name: "zero",
        about: "ZeRO: the reference candle MLP at 16.3M parameters with AdamW, unsharded, ZeRO-1 \
                and ZeRO-2, as 1 process × 2 replicas and 2 workers under mpirun, alternating: \
                each worker's peak resident memory, the library's bytes per replica, steps/s",
        needs: &[Need::Mpi],
        steps: &[Step::Mpirun(zero::bench_zero)],
    },
    Suite {
        name: "candle-convnet",
        about: "candle's mnist-training ConvNet with distribute-candle on 1 and 2 replicas beside \
                a plain candle loop and 2 processes that exchange nothing",
        needs: &[],
        steps: &[Step::Json {
            package: "distribute-candle",
            bench: "convnet",
        }],
    },
];

impl Suite {
    /// The suite's line in `--help`: what it measures and needs.
    fn help(&self) -> String {
        let needs: Vec<&str> = self.needs.iter().map(|need| need.describe()).collect();
        match needs.as_slice() {
            [] => self.about.to_owned(),
            needs => format!("{} (needs {})", self.about, needs.join("; ")),
        }
    }

    /// Runs the suite's steps.
    fn run(&self) -> Result<()> {
        if self.needs.contains(&Need::PjrtCpuPlugin) {
            fetch_pjrt_for_bench();
        }
        for step in self.steps {
            let what = format!("benchmarks '{}'", self.name);
            match *step {
                Step::Json { package, bench } => {
                    cargo(&what, &["bench", "--package", package, "--bench", bench])?
                }
                Step::Criterion { package } => cargo(&what, &["bench", "--package", package])?,
                Step::Mpirun(run) => run()?,
            }
        }
        Ok(())
    }
}

/// Parses a suite's name into its row of [`SUITES`]; `--help` lists them with [`Suite::help`].
fn suite_parser() -> impl TypedValueParser<Value = &'static Suite> {
    let names = SUITES
        .iter()
        .map(|suite| PossibleValue::new(suite.name).help(suite.help()));
    PossibleValuesParser::new(names).map(|name| {
        SUITES
            .iter()
            .find(|suite| suite.name == name)
            .expect("the parser takes only the suites' names")
    })
}

/// Runs the suites of `args` in order, or every bench of the workspace when none is named.
pub(crate) fn bench(args: &Args) -> Result<()> {
    if args.suites.is_empty() {
        return cargo("benchmarks", &["bench", "--workspace"]);
    }
    args.suites.iter().try_for_each(|suite| suite.run())
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
        let Err(err) = crate::parse(&["bench", "nonsense"]) else {
            panic!("nonsense is a suite");
        };
        let err = err.to_string();
        assert!(
            err.contains("invalid value 'nonsense'") && err.contains("collectives"),
            "{err}"
        );
        assert_eq!(err.matches("strategy").count(), 1, "{err}");
    }

    #[test]
    fn suites_are_named_once_and_run_in_the_order_given() {
        for (i, suite) in SUITES.iter().enumerate() {
            assert!(
                SUITES[..i].iter().all(|other| other.name != suite.name),
                "{}",
                suite.name
            );
            assert!(!suite.steps.is_empty(), "{}", suite.name);
        }
        let Ok(crate::Command::Bench(args)) =
            crate::parse(&["bench", "multi-worker", "strategy", "multi-worker"])
        else {
            panic!("the suites did not parse");
        };
        let names: Vec<&str> = args.suites.iter().map(|suite| suite.name).collect();
        assert_eq!(names, ["multi-worker", "strategy", "multi-worker"]);
        assert_eq!(
            SUITES[3].help(),
            format!(
                "{} (needs the PJRT CPU plugin, installed first)",
                SUITES[3].about
            )
        );
    }
}
