//! The GPU suites: one table ([`SUITES`]) of the test, bench and binary targets that need what
//! the workspace tests do not have (NVRTC, a GPU, NCCL, the CUDA PJRT plugin), what each needs,
//! and the cargo arguments that build, run or lint them.

/// What a suite needs besides a build (with its feature, if any).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Needs {
    /// NVRTC only: runs on a machine without a GPU.
    Nvrtc,
    /// A GPU with its driver (and NVRTC).
    Gpu,
    /// A GPU and NCCL.
    Nccl,
    /// A GPU and the CUDA PJRT plugin (`PJRT_PLUGIN`; see [`super::libs::find_cuda_pjrt`]).
    CudaPjrt,
    /// A GPU, and the CUDA libraries the executable links rather than loads (candle's CUDA
    /// backend links libcuda, cuBLAS, cuRAND and NVRTC): built with the pinned CUDA toolkit of
    /// [`crate::provision::cuda_toolkit`], run where those libraries are found.
    CudaLinked,
}

impl Needs {
    /// The word `run.sh` reads in the bundle's suite list.
    pub(super) fn word(self) -> &'static str {
        match self {
            Needs::Nvrtc => "nvrtc",
            Needs::Gpu => "gpu",
            Needs::Nccl => "nccl",
            Needs::CudaPjrt => "cuda-pjrt",
            Needs::CudaLinked => "cuda-linked",
        }
    }
}

/// The kind of cargo target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// An integration test (`tests/NAME.rs`), run with `--test-threads=1 --nocapture` (so its
    /// `skipped:` lines reach the suite's log, where `run.sh` counts them).
    Test,
    /// A `harness = false` bench (`benches/NAME.rs`) that prints JSON lines, run with `--bench`.
    Bench,
    /// A binary (`--bin NAME`), built in release and run with the suite's `args`.
    Bin,
}

impl Kind {
    /// The target kind in cargo's messages and on its command line (`--test`, …).
    pub(super) fn cargo_name(self) -> &'static str {
        match self {
            Kind::Test => "test",
            Kind::Bench => "bench",
            Kind::Bin => "bin",
        }
    }
}

/// One GPU suite: a test, bench or binary target of a package, built with at most one feature.
#[derive(Debug)]
pub(crate) struct Suite {
    /// The stable name: of the executable in a `--build-only` folder, and in summaries.
    pub(crate) name: &'static str,
    pub(crate) package: &'static str,
    pub(crate) kind: Kind,
    /// The cargo target name (`--test NAME` / `--bench NAME` / `--bin NAME`).
    pub(crate) target: &'static str,
    /// The package feature the target requires (`required-features`), if any.
    pub(crate) feature: Option<&'static str>,
    pub(crate) needs: Needs,
    /// Arguments for a binary (tests and benches get their kind's own).
    pub(crate) args: &'static [&'static str],
}

/// Every GPU suite, in the order they run. The one table to edit when targets change.
pub(crate) const SUITES: &[Suite] = &[
    Suite {
        name: "collectives-nvrtc",
        package: "distribute-collectives",
        kind: Kind::Test,
        target: "nvrtc",
        feature: Some("cuda"),
        args: &[],
        needs: Needs::Nvrtc,
    },
    Suite {
        name: "collectives-gpu",
        package: "distribute-collectives",
        kind: Kind::Test,
        target: "gpu",
        feature: Some("cuda"),
        args: &[],
        needs: Needs::Gpu,
    },
    Suite {
        name: "nccl",
        package: "distribute-nccl",
        kind: Kind::Test,
        target: "nccl",
        feature: None,
        args: &[],
        needs: Needs::Nccl,
    },
    Suite {
        name: "nccl-exchange-cluster",
        package: "distribute-nccl-exchange",
        kind: Kind::Test,
        target: "nccl_cluster",
        feature: Some("nccl"),
        args: &[],
        needs: Needs::Nccl,
    },
    Suite {
        name: "mirrored-gpu",
        package: "distribute-mirrored",
        kind: Kind::Test,
        target: "gpu",
        // With NCCL, so `choose_the_best` can pick it on two GPUs.
        feature: Some("nccl"),
        args: &[],
        needs: Needs::Gpu,
    },
    // candle models on `/gpu:N` replicas (candle's CUDA backend, compiled with nvcc), the `gpt`
    // example's GPT on `/gpu:0` among them (one executable of candle's kernels: a second would
    // not fit the bundle).
    Suite {
        name: "candle-gpu",
        package: "distribute-candle",
        kind: Kind::Test,
        target: "gpu",
        feature: Some("cuda"),
        args: &[],
        needs: Needs::CudaLinked,
    },
    Suite {
        name: "bench-gpu",
        package: "distribute-collectives",
        kind: Kind::Bench,
        target: "gpu",
        feature: Some("cuda"),
        args: &[],
        needs: Needs::Gpu,
    },
    Suite {
        name: "bench-nccl",
        package: "distribute-nccl",
        kind: Kind::Bench,
        target: "two_ranks",
        feature: None,
        args: &[],
        needs: Needs::Nccl,
    },
    // distribute-candle on one GPU against plain candle loops on it.
    Suite {
        name: "bench-candle-gpu",
        package: "distribute-candle",
        kind: Kind::Bench,
        target: "gpu",
        feature: Some("cuda"),
        args: &[],
        needs: Needs::CudaLinked,
    },
    // TpuStrategy on the CUDA PJRT plugin: the suites take the plugin `PJRT_PLUGIN` names.
    Suite {
        name: "pjrt-plugin",
        package: "distribute-pjrt",
        kind: Kind::Test,
        target: "plugin",
        feature: None,
        needs: Needs::CudaPjrt,
        args: &[],
    },
    // JAX's CUDA plugin's own create options (of every value kind) pass its checks; without a
    // GPU its client fails with "No visible GPU devices", with one it is created.
    Suite {
        name: "pjrt-cuda-options",
        package: "distribute-pjrt",
        kind: Kind::Test,
        target: "cuda_plugin",
        feature: None,
        needs: Needs::CudaPjrt,
        args: &[],
    },
    Suite {
        name: "tpu-strategy",
        package: "distribute-tpu",
        kind: Kind::Test,
        target: "strategy",
        feature: None,
        needs: Needs::CudaPjrt,
        args: &[],
    },
    Suite {
        name: "tpu-variables",
        package: "distribute-tpu",
        kind: Kind::Test,
        target: "variables",
        feature: None,
        needs: Needs::CudaPjrt,
        args: &[],
    },
    Suite {
        name: "tpu-input",
        package: "distribute-tpu",
        kind: Kind::Test,
        target: "input",
        feature: None,
        needs: Needs::CudaPjrt,
        args: &[],
    },
    Suite {
        name: "bench-tpu",
        package: "distribute-tpu",
        kind: Kind::Bench,
        target: "tpu",
        feature: None,
        needs: Needs::CudaPjrt,
        args: &[],
    },
    Suite {
        name: "demo-tpu",
        package: "distribute-demo",
        kind: Kind::Bin,
        target: "demo",
        feature: None,
        needs: Needs::CudaPjrt,
        args: &["--strategy", "tpu", "--replicas", "1"],
    },
];

/// The suite `cargo xtask test` runs on every machine.
pub(crate) const NVRTC_SUITE: &str = "collectives-nvrtc";

/// The packages with GPU features and which of `cuda` and `nccl` each has; `cargo xtask ci` lints
/// them with those features on. A package with none (`distribute-nccl`) needs CUDA whatever its
/// features: every GPU lint takes it, and the workspace's plain builds leave it out
/// ([`gpu_only_packages`]), so that it does not turn on collectives' `cuda` for every crate.
pub(crate) const FEATURE_PACKAGES: &[(&str, &[&str])] = &[
    ("distribute-tensor", &["cuda"]),
    ("distribute-collectives", &["cuda"]),
    ("distribute-nccl", &[]),
    ("distribute-nccl-exchange", &["nccl"]),
    ("distribute-mirrored", &["cuda", "nccl"]),
    ("distribute", &["cuda", "nccl"]),
];

impl Suite {
    /// `cargo ARGS` that builds (`no_run`) or runs this suite. Extra arguments for the
    /// executable come after `--`.
    pub(super) fn cargo_args(&self, no_run: bool) -> Vec<String> {
        let subcommand = match (self.kind, no_run) {
            (Kind::Test, _) => "test",
            (Kind::Bench, _) => "bench",
            (Kind::Bin, true) => "build",
            (Kind::Bin, false) => "run",
        };
        let mut args = vec![subcommand.to_owned()];
        if no_run && self.kind != Kind::Bin {
            args.push("--no-run".to_owned());
        }
        if no_run {
            args.push("--message-format=json-render-diagnostics".to_owned());
        }
        if self.kind == Kind::Bin {
            args.push("--release".to_owned());
        }
        args.extend(["--package".to_owned(), self.package.to_owned()]);
        if let Some(feature) = self.feature {
            // Qualified by the package, which cargo accepts with one `-p` or several.
            args.extend([
                "--features".to_owned(),
                format!("{}/{feature}", self.package),
            ]);
        }
        args.extend([
            format!("--{}", self.kind.cargo_name()),
            self.target.to_owned(),
        ]);
        args
    }

    /// What the executable is run with.
    pub(super) fn run_args(&self) -> &'static [&'static str] {
        match self.kind {
            Kind::Test => &["--test-threads=1", "--nocapture"],
            Kind::Bench => &["--bench"],
            Kind::Bin => self.args,
        }
    }
}

pub(super) fn suite(name: &str) -> &'static Suite {
    SUITES
        .iter()
        .find(|suite| suite.name == name)
        .unwrap_or_else(|| panic!("no GPU suite named {name}"))
}

/// `cargo clippy` arguments that lint every target of the [`FEATURE_PACKAGES`] that have any of
/// `features` (such as `cuda`, or `cuda` and `nccl`) with those of them on, warnings denied. CI
/// lints both sets: code gated on one feature alone can warn where the pair does not.
/// The packages that need CUDA whatever their features (no features in [`FEATURE_PACKAGES`]).
pub(crate) fn gpu_only_packages() -> impl Iterator<Item = &'static str> {
    FEATURE_PACKAGES
        .iter()
        .filter(|(_, features)| features.is_empty())
        .map(|(package, _)| *package)
}

pub(crate) fn clippy_args(features: &[&str]) -> Vec<String> {
    let mut args = vec!["clippy".to_owned(), "--all-targets".to_owned()];
    let chosen: Vec<(&str, Vec<&str>)> = FEATURE_PACKAGES
        .iter()
        .map(|(package, has)| {
            let on = features.iter().copied().filter(|f| has.contains(f));
            (*package, on.collect::<Vec<_>>())
        })
        .filter(|(package, on)| !on.is_empty() || gpu_only_packages().any(|p| p == *package))
        .collect();
    for (package, _) in &chosen {
        args.extend(["--package".to_owned(), (*package).to_owned()]);
    }
    let features: Vec<String> = chosen
        .iter()
        .flat_map(|(package, on)| on.iter().map(move |f| format!("{package}/{f}")))
        .collect();
    args.extend([
        "--features".to_owned(),
        features.join(","),
        "--".to_owned(),
        "-D".to_owned(),
        "warnings".to_owned(),
    ]);
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_unique_names_and_the_nvrtc_suite() {
        for (i, suite) in SUITES.iter().enumerate() {
            assert!(
                SUITES[..i].iter().all(|other| other.name != suite.name),
                "{}",
                suite.name
            );
        }
        assert_eq!(suite(NVRTC_SUITE).needs, Needs::Nvrtc);
        for suite in SUITES {
            assert_eq!(
                suite.kind == Kind::Bin,
                !suite.args.is_empty(),
                "{}",
                suite.name
            );
        }
    }

    #[test]
    fn cargo_args_name_package_feature_and_target() {
        assert_eq!(
            suite("nccl").cargo_args(false).join(" "),
            "test --package distribute-nccl --test nccl"
        );
        assert_eq!(
            suite("bench-gpu").cargo_args(true).join(" "),
            "bench --no-run --message-format=json-render-diagnostics --package \
             distribute-collectives --features distribute-collectives/cuda --bench gpu"
        );
        assert_eq!(
            suite("tpu-strategy").cargo_args(true).join(" "),
            "test --no-run --message-format=json-render-diagnostics --package distribute-tpu \
             --test strategy"
        );
        assert_eq!(
            suite("demo-tpu").cargo_args(true).join(" "),
            "build --message-format=json-render-diagnostics --release --package distribute-demo \
             --bin demo"
        );
        assert_eq!(
            suite("demo-tpu").cargo_args(false).join(" "),
            "run --release --package distribute-demo --bin demo"
        );
        assert_eq!(
            suite("demo-tpu").run_args(),
            ["--strategy", "tpu", "--replicas", "1"]
        );
    }

    #[test]
    fn clippy_lints_every_feature_package_with_the_features_it_has() {
        let args = clippy_args(&["cuda", "nccl"]).join(" ");
        assert!(
            args.starts_with(
                "clippy --all-targets --package distribute-tensor --package \
                 distribute-collectives --package distribute-nccl --package \
                 distribute-nccl-exchange --package"
            ),
            "{args}"
        );
        assert!(
            args.contains(
                "--features distribute-tensor/cuda,distribute-collectives/cuda,\
                 distribute-nccl-exchange/nccl,distribute-mirrored/cuda,distribute-mirrored/nccl,distribute/cuda,distribute/nccl"
            ),
            "{args}"
        );
        assert!(args.ends_with("-- -D warnings"), "{args}");
        // Without `nccl`, the exchange (which has no `cuda`) is left out; the NCCL backend, which
        // needs CUDA whatever its features, is in.
        let cuda = clippy_args(&["cuda"]).join(" ");
        assert!(
            !cuda.contains("nccl-exchange") && !cuda.contains("/nccl"),
            "{cuda}"
        );
        assert!(cuda.contains("--package distribute-nccl "), "{cuda}");
        assert_eq!(gpu_only_packages().collect::<Vec<_>>(), ["distribute-nccl"]);
    }
}
