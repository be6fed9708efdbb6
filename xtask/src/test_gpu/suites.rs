//! The GPU suites: one table ([`SUITES`]) of the test, bench and binary targets that need what
//! the workspace tests do not have (NVRTC, a GPU, NCCL, the CUDA PJRT plugin), what each needs,
//! and the cargo arguments that build, run or lint them.

/// What a suite needs besides a build (with its features).
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

/// One GPU suite: a test, bench or binary target of a package, built with the features it
/// requires.
#[derive(Debug)]
pub(crate) struct Suite {
    /// The stable name: of the executable in a `--build-only` folder, and in summaries.
    pub(crate) name: &'static str,
    pub(crate) package: &'static str,
    pub(crate) kind: Kind,
    /// The cargo target name (`--test NAME` / `--bench NAME` / `--bin NAME`).
    pub(crate) target: &'static str,
    /// The features it is built with: the package's own (`cuda`: what `required-features`
    /// asks) or a dependency's, package-qualified (`distribute-multi-worker/nccl`). With its
    /// package's `mpi`, the suite is built against the MPI that the bundle carries and runs
    /// with that Open MPI's `mpirun` first on `PATH` ([`Suite::mpi`]).
    pub(crate) features: &'static [&'static str],
    pub(crate) needs: Needs,
    /// Arguments for a binary (tests and benches get their kind's own).
    pub(crate) args: &'static [&'static str],
}

/// candle's CUDA backend, and its two-worker cases: MultiWorkerMirroredStrategy (`mpi`) with
/// NCCL across the processes.
const CANDLE_GPU_FEATURES: &[&str] = &["cuda", "mpi", "distribute-multi-worker/nccl"];

/// Every GPU suite, in the order they run. The one table to edit when targets change.
pub(crate) const SUITES: &[Suite] = &[
    Suite {
        name: "collectives-nvrtc",
        package: "distribute-collectives",
        kind: Kind::Test,
        target: "nvrtc",
        features: &["cuda"],
        args: &[],
        needs: Needs::Nvrtc,
    },
    Suite {
        name: "collectives-gpu",
        package: "distribute-collectives",
        kind: Kind::Test,
        target: "gpu",
        features: &["cuda"],
        args: &[],
        needs: Needs::Gpu,
    },
    Suite {
        name: "nccl",
        package: "distribute-nccl",
        kind: Kind::Test,
        target: "nccl",
        features: &[],
        args: &[],
        needs: Needs::Nccl,
    },
    Suite {
        name: "nccl-exchange-cluster",
        package: "distribute-nccl-exchange",
        kind: Kind::Test,
        target: "nccl_cluster",
        features: &["nccl"],
        args: &[],
        needs: Needs::Nccl,
    },
    Suite {
        name: "mirrored-gpu",
        package: "distribute-mirrored",
        kind: Kind::Test,
        target: "gpu",
        // With NCCL, so `choose_the_best` can pick it on two GPUs.
        features: &["nccl"],
        args: &[],
        needs: Needs::Gpu,
    },
    // candle models on `/gpu:N` replicas (candle's CUDA backend, compiled with nvcc), the `gpt`
    // example's GPT on `/gpu:0` among them (one executable of candle's kernels: a second would
    // not fit the bundle), and two workers under `mpirun` sharing one GPU over NCCL
    // (MultiWorkerMirroredStrategy).
    Suite {
        name: "candle-gpu",
        package: "distribute-candle",
        kind: Kind::Test,
        target: "gpu",
        features: CANDLE_GPU_FEATURES,
        args: &[],
        needs: Needs::CudaLinked,
    },
    Suite {
        name: "bench-gpu",
        package: "distribute-collectives",
        kind: Kind::Bench,
        target: "gpu",
        features: &["cuda"],
        args: &[],
        needs: Needs::Gpu,
    },
    Suite {
        name: "bench-nccl",
        package: "distribute-nccl",
        kind: Kind::Bench,
        target: "two_ranks",
        features: &[],
        args: &[],
        needs: Needs::Nccl,
    },
    // distribute-candle on one GPU against plain candle loops on it, and two workers on it.
    Suite {
        name: "bench-candle-gpu",
        package: "distribute-candle",
        kind: Kind::Bench,
        target: "gpu",
        features: CANDLE_GPU_FEATURES,
        args: &[],
        needs: Needs::CudaLinked,
    },
    // TpuStrategy on the CUDA PJRT plugin: the suites take the plugin `PJRT_PLUGIN` names.
    Suite {
        name: "pjrt-plugin",
        package: "distribute-pjrt",
        kind: Kind::Test,
        target: "plugin",
        features: &[],
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
        features: &[],
        needs: Needs::CudaPjrt,
        args: &[],
    },
    Suite {
        name: "tpu-strategy",
        package: "distribute-tpu",
        kind: Kind::Test,
        target: "strategy",
        features: &[],
        needs: Needs::CudaPjrt,
        args: &[],
    },
    Suite {
        name: "tpu-variables",
        package: "distribute-tpu",
        kind: Kind::Test,
        target: "variables",
        features: &[],
        needs: Needs::CudaPjrt,
        args: &[],
    },
    Suite {
        name: "tpu-input",
        package: "distribute-tpu",
        kind: Kind::Test,
        target: "input",
        features: &[],
        needs: Needs::CudaPjrt,
        args: &[],
    },
    Suite {
        name: "bench-tpu",
        package: "distribute-tpu",
        kind: Kind::Bench,
        target: "tpu",
        features: &[],
        needs: Needs::CudaPjrt,
        args: &[],
    },
    Suite {
        name: "demo-tpu",
        package: "distribute-demo",
        kind: Kind::Bin,
        target: "demo",
        features: &[],
        needs: Needs::CudaPjrt,
        args: &["--strategy", "tpu", "--replicas", "1"],
    },
];

/// The suite `cargo xtask test` runs on every machine.
pub(crate) const NVRTC_SUITE: &str = "collectives-nvrtc";

/// The suites `cargo xtask test-gpu --build-only DIR` builds when none is named (`--all` builds
/// every one): what the next GPU session runs. A device call carries the working tree and the
/// bundle, 64 MiB at most, and every suite with the Open MPI that the candle suites need would
/// not fit; so this set holds the candle suites (new: two workers under `mpirun` on one GPU)
/// and the CUDA and NCCL suites beneath them, and leaves out what passed on an H200 and does
/// not depend on them: the TpuStrategy suites (`pjrt-*`, `tpu-*`, `bench-tpu`, `demo-tpu`) and
/// the `bench-gpu` and `bench-nccl` figures, built by naming them. The dry run builds and runs
/// every suite, and checks that this set fits a device call.
pub(crate) const DEFAULT_SUITES: &[&str] = &[
    "collectives-nvrtc",
    "collectives-gpu",
    "nccl",
    "nccl-exchange-cluster",
    "mirrored-gpu",
    "candle-gpu",
    "bench-candle-gpu",
];

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
        if !self.features.is_empty() {
            args.extend(["--features".to_owned(), self.qualified_features().join(",")]);
        }
        args.extend([
            format!("--{}", self.kind.cargo_name()),
            self.target.to_owned(),
        ]);
        args
    }

    /// [`Suite::features`], each qualified by its package (the suite's own unless it names
    /// another), which cargo accepts with one `-p` or several.
    pub(super) fn qualified_features(&self) -> Vec<String> {
        self.features
            .iter()
            .map(|feature| match feature.contains('/') {
                true => (*feature).to_owned(),
                false => format!("{}/{feature}", self.package),
            })
            .collect()
    }

    /// Whether the suite is built with its package's `mpi` feature: against the MPI that the
    /// bundle carries (the pinned Open MPI wheel's), run with its `mpirun` first on `PATH` (the
    /// tests start their workers with `mpirun` from `PATH`).
    pub(crate) fn mpi(&self) -> bool {
        self.features.contains(&"mpi")
    }

    /// Whether one cargo invocation builds this suite and `other` without changing either:
    /// the same package, kind (so profile), features and build environment (the CUDA
    /// toolkit's for `cuda-linked` suites). Suites of different packages stay apart even with
    /// the same features: cargo unifies the features of every package it builds at once, which
    /// could change a dependency's build for one of them.
    pub(super) fn builds_with(&self, other: &Suite) -> bool {
        self.package == other.package
            && self.kind == other.kind
            && self.features == other.features
            && (self.needs == Needs::CudaLinked) == (other.needs == Needs::CudaLinked)
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

/// `cargo ARGS` that builds the suites of `group` (which [`Suite::builds_with`] the first) in
/// one invocation: the first's build arguments and every other's target.
pub(super) fn group_build_args(group: &[&Suite]) -> Vec<String> {
    let (first, rest) = group.split_first().expect("a group has a suite");
    let mut args = first.cargo_args(true);
    for suite in rest {
        assert!(
            first.builds_with(suite),
            "{} and {}",
            first.name,
            suite.name
        );
        args.extend([
            format!("--{}", suite.kind.cargo_name()),
            suite.target.to_owned(),
        ]);
    }
    args
}

/// `suites` in groups that one cargo invocation each builds ([`Suite::builds_with`]), in the
/// order of their first suites.
pub(super) fn build_groups<'a>(suites: &[&'a Suite]) -> Vec<Vec<&'a Suite>> {
    let mut groups: Vec<Vec<&Suite>> = Vec::new();
    for suite in suites {
        match groups.iter_mut().find(|group| group[0].builds_with(suite)) {
            Some(group) => group.push(suite),
            None => groups.push(vec![suite]),
        }
    }
    groups
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
        // A dependency's feature stays qualified by its own package.
        assert_eq!(
            suite("candle-gpu").cargo_args(true).join(" "),
            "test --no-run --message-format=json-render-diagnostics --package distribute-candle \
             --features distribute-candle/cuda,distribute-candle/mpi,distribute-multi-worker/nccl \
             --test gpu"
        );
        let mpi: Vec<&str> = SUITES.iter().filter(|s| s.mpi()).map(|s| s.name).collect();
        assert_eq!(mpi, ["candle-gpu", "bench-candle-gpu"]);
    }

    #[test]
    fn suites_of_one_package_kind_and_features_build_together() {
        let all: Vec<&Suite> = SUITES.iter().collect();
        let groups = build_groups(&all);
        let names: Vec<Vec<&str>> = groups
            .iter()
            .map(|group| group.iter().map(|suite| suite.name).collect())
            .collect();
        assert_eq!(names.len(), 12, "{names:?}");
        for together in [
            &["collectives-nvrtc", "collectives-gpu"][..],
            &["pjrt-plugin", "pjrt-cuda-options"],
            &["tpu-strategy", "tpu-variables", "tpu-input"],
            &["candle-gpu"],
            &["bench-candle-gpu"],
        ] {
            assert!(names.iter().any(|group| group == together), "{names:?}");
        }
        assert_eq!(
            groups.iter().map(Vec::len).sum::<usize>(),
            SUITES.len(),
            "every suite once"
        );
        let tpu = groups.iter().find(|g| g[0].name == "tpu-strategy").unwrap();
        assert_eq!(
            group_build_args(tpu).join(" "),
            "test --no-run --message-format=json-render-diagnostics --package distribute-tpu \
             --test strategy --test variables --test input"
        );
    }

    #[test]
    fn the_default_set_is_the_next_gpu_sessions() {
        for name in DEFAULT_SUITES {
            suite(name);
        }
        // Every suite that needs the carried Open MPI is in it, and no TpuStrategy suite.
        for suite in SUITES {
            if suite.mpi() {
                assert!(DEFAULT_SUITES.contains(&suite.name), "{}", suite.name);
            }
            if suite.needs == Needs::CudaPjrt {
                assert!(!DEFAULT_SUITES.contains(&suite.name), "{}", suite.name);
            }
        }
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
