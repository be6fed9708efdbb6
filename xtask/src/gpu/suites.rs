//! The GPU suites: one table of the test and bench targets behind the `cuda` and `nccl`
//! features ([`SUITES`]), what each needs, and the cargo arguments that build, run or lint them.

/// What a suite needs besides a build with its feature.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Needs {
    /// NVRTC only: runs on a machine without a GPU.
    Nvrtc,
    /// A GPU with its driver (and NVRTC).
    Gpu,
    /// A GPU and NCCL.
    Nccl,
}

/// The kind of cargo target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// An integration test (`tests/NAME.rs`), run with `--test-threads=1`.
    Test,
    /// A `harness = false` bench (`benches/NAME.rs`) that prints JSON lines, run with `--bench`.
    Bench,
}

/// One GPU suite: a test or bench target of a package, built with one feature.
#[derive(Debug)]
pub(crate) struct Suite {
    /// The stable name: of the executable in a `--build-only` folder, and in summaries.
    pub(crate) name: &'static str,
    pub(crate) package: &'static str,
    pub(crate) kind: Kind,
    /// The cargo target name (`--test NAME` / `--bench NAME`).
    pub(crate) target: &'static str,
    /// The package feature the target requires (`required-features`).
    pub(crate) feature: &'static str,
    pub(crate) needs: Needs,
}

/// Every GPU suite, in the order they run. The one table to edit when targets change.
pub(crate) const SUITES: &[Suite] = &[
    Suite {
        name: "collectives-nvrtc",
        package: "distribute-collectives",
        kind: Kind::Test,
        target: "nvrtc",
        feature: "cuda",
        needs: Needs::Nvrtc,
    },
    Suite {
        name: "collectives-gpu",
        package: "distribute-collectives",
        kind: Kind::Test,
        target: "gpu",
        feature: "cuda",
        needs: Needs::Gpu,
    },
    Suite {
        name: "collectives-nccl",
        package: "distribute-collectives",
        kind: Kind::Test,
        target: "nccl",
        feature: "nccl",
        needs: Needs::Nccl,
    },
    Suite {
        name: "mirrored-gpu",
        package: "distribute-mirrored",
        kind: Kind::Test,
        target: "gpu",
        feature: "cuda",
        needs: Needs::Gpu,
    },
    Suite {
        name: "bench-gpu",
        package: "distribute-collectives",
        kind: Kind::Bench,
        target: "gpu",
        feature: "cuda",
        needs: Needs::Gpu,
    },
];

/// The suite `cargo xtask test` runs on every machine.
pub(crate) const NVRTC_SUITE: &str = "collectives-nvrtc";

/// The packages that have the `cuda` and `nccl` features; `cargo xtask ci` lints them with both.
pub(crate) const FEATURE_PACKAGES: &[&str] = &[
    "distribute-collectives",
    "distribute-mirrored",
    "distribute",
];

impl Suite {
    /// `FEATURE` qualified by the package, which cargo accepts with one `-p` or several.
    fn feature_flag(&self) -> String {
        format!("{}/{}", self.package, self.feature)
    }

    /// `cargo ARGS` that builds (`no_run`) or runs this suite. Extra arguments for the
    /// executable come after `--`.
    pub(super) fn cargo_args(&self, no_run: bool) -> Vec<String> {
        let (subcommand, target_flag) = match self.kind {
            Kind::Test => ("test", "--test"),
            Kind::Bench => ("bench", "--bench"),
        };
        let mut args = vec![subcommand.to_owned()];
        if no_run {
            args.extend(["--no-run", "--message-format=json-render-diagnostics"].map(String::from));
        }
        args.extend([
            "--package".to_owned(),
            self.package.to_owned(),
            "--features".to_owned(),
            self.feature_flag(),
            target_flag.to_owned(),
            self.target.to_owned(),
        ]);
        args
    }

    /// What the executable is run with.
    pub(super) fn run_args(&self) -> &'static [&'static str] {
        match self.kind {
            Kind::Test => &["--test-threads=1"],
            Kind::Bench => &["--bench"],
        }
    }
}

pub(super) fn suite(name: &str) -> &'static Suite {
    SUITES
        .iter()
        .find(|suite| suite.name == name)
        .unwrap_or_else(|| panic!("no GPU suite named {name}"))
}

/// `cargo clippy` arguments that lint every target of [`FEATURE_PACKAGES`] with `features` (such
/// as `cuda`, or `cuda` and `nccl`) on, warnings denied. CI lints both sets: code gated on one
/// feature alone can warn where the pair does not.
pub(crate) fn clippy_args(features: &[&str]) -> Vec<String> {
    let mut args = vec!["clippy".to_owned(), "--all-targets".to_owned()];
    for package in FEATURE_PACKAGES {
        args.extend(["--package".to_owned(), (*package).to_owned()]);
    }
    let features: Vec<String> = FEATURE_PACKAGES
        .iter()
        .flat_map(|package| features.iter().map(move |f| format!("{package}/{f}")))
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
    }

    #[test]
    pub(super) fn cargo_args_name_package_feature_and_target() {
        assert_eq!(
            suite("collectives-nccl").cargo_args(false).join(" "),
            "test --package distribute-collectives --features distribute-collectives/nccl \
             --test nccl"
        );
        assert_eq!(
            suite("bench-gpu").cargo_args(true).join(" "),
            "bench --no-run --message-format=json-render-diagnostics --package \
             distribute-collectives --features distribute-collectives/cuda --bench gpu"
        );
    }

    #[test]
    fn clippy_lints_every_feature_package_with_cuda_and_nccl() {
        let args = clippy_args(&["cuda", "nccl"]).join(" ");
        assert!(
            args.starts_with("clippy --all-targets --package distribute-collectives --package"),
            "{args}"
        );
        assert!(
            args.contains(
                "--features distribute-collectives/cuda,distribute-collectives/nccl,\
                 distribute-mirrored/cuda,distribute-mirrored/nccl,distribute/cuda,distribute/nccl"
            ),
            "{args}"
        );
        assert!(args.ends_with("-- -D warnings"), "{args}");
    }
}
