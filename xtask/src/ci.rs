//! `cargo xtask ci`: what CI runs. `cargo fmt --check`; clippy with warnings denied on every
//! target of the workspace's plain build, then with the GPU features (`cuda` and `nccl`) and
//! candle's CUDA backend (built with the pinned CUDA toolkit) in one pass, candle's GPU suites
//! with `mpi` as the GPU bundle builds them, with `mpi`, and with `mpi` and `nccl` (the MPI
//! lints in the workspace's target folder, which they share with the others); `cargo package` of every publishable crate ([`package`]); then `cargo
//! xtask test`.

use std::ffi::{OsStr, OsString};

use anyhow::{Context, Result};

use distribute_launch::mpi::Inherited;

use crate::cargo::{cargo, cargo_env, metadata, workspace_root};
use crate::mpirun::{env_refs, resolve};
use crate::packages::{MpiPackages, nccl_packages, plain_build_excludes};
use crate::provision::cuda_toolkit;
use crate::test_gpu;

/// Run what CI runs: fmt check, clippy with every feature set, then test
///
/// `cargo fmt --check`; `cargo clippy --all-targets -D warnings` on the workspace's plain build
/// (without the packages that need MPI or CUDA to build), again with the GPU features (cuda and
/// nccl) and distribute-candle's cuda (built with the pinned CUDA 13.0 toolkit, installed under
/// target/cuda-toolkit/), with mpi and with mpi and nccl; `cargo package` of
/// every publishable crate (the leaf crates verified by building the package, the others
/// packaged only); then `cargo xtask test`.
#[derive(clap::Args)]
pub(crate) struct Args {}

/// Runs `cargo xtask ci`.
pub(crate) fn ci() -> Result<()> {
    cargo("format check", &["fmt", "--all", "--", "--check"])?;
    let mut clippy = vec!["clippy", "--workspace", "--all-targets"];
    let excludes = plain_build_excludes()?;
    clippy.extend(excludes.iter().map(String::as_str));
    clippy.extend(["--", "-D", "warnings"]);
    cargo("clippy", &clippy)?;
    // The GPU features (`cuda` and `nccl`) with candle's CUDA backend, in one lint: since the
    // workspace's cudarc falls back to loading only when nothing links CUDA, candle's
    // `dynamic-linking` and the workspace's GPU crates build together (one executable holds
    // both), so one pass covers them all. candle's kernels need the pinned CUDA toolkit (nvcc).
    let toolkit = cuda_toolkit::fetch(&workspace_root())?.build_env(false)?;
    let toolkit: Vec<(&str, &OsStr)> = toolkit
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_os_str()))
        .collect();
    let gpu_clippy = with_candle_cuda(test_gpu::clippy_args(&["cuda", "nccl"]));
    let gpu_clippy: Vec<&str> = gpu_clippy.iter().map(String::as_str).collect();
    cargo_env(
        "clippy (features cuda, nccl, distribute-candle/cuda)",
        &gpu_clippy,
        &toolkit,
    )?;
    // candle's GPU suites with `mpi` too (their two-worker tests and bench), as the bundle
    // builds them, in the same target folder: the kernels compiled above serve.
    let metadata = metadata()?;
    let mpi = resolve(&metadata).context("linting candle's GPU suites with `mpi`")?;
    // The MPI's PATH in front of the toolkit's (nvcc), in front of this process's.
    let toolkit_path = toolkit
        .iter()
        .find(|(k, _)| *k == "PATH")
        .map(|(_, v)| v.to_os_string());
    let mpi_env = lint_env(mpi.env_from(&Inherited {
        path: toolkit_path,
        ..Inherited::current()
    }));
    let mut env: Vec<(&str, &OsStr)> = toolkit
        .iter()
        .filter(|(k, _)| *k != "PATH")
        .cloned()
        .collect();
    env.extend(mpi_env.iter().map(|(k, v)| (*k, v.as_os_str())));
    cargo_env(
        "clippy (distribute-candle's GPU suites with mpi)",
        &[
            "clippy",
            "--package",
            "distribute-candle",
            "--all-targets",
            "--features",
            "distribute-candle/cuda,distribute-candle/mpi,distribute-multi-worker/nccl",
            "--",
            "-D",
            "warnings",
        ],
        &env,
    )?;
    clippy_mpi()?;
    package(&metadata)?;
    crate::test::test(&[])
}

/// The publishable crates whose package `cargo package` also builds (verifies): the leaves,
/// cheap to build from scratch in the package's own target folder. Verifying the others would
/// build candle, MPI and everything above them a second time (minutes on CI's 2 cores) for
/// what the packaged-only check and the workspace's own builds already show: every file a
/// crate needs is in its package (`include`, `exclude`, paths outside the crate), and its
/// manifest is publishable (versions on its workspace dependencies, no unpublished normal
/// dependency).
const VERIFIED: [&str; 4] = [
    "distribute-device-spec",
    "distribute-values-derive",
    "distribute-values",
    "distribute-launch",
];

/// The workspace's publishable packages (`publish` not `false`), from `cargo metadata`.
fn publishable(metadata: &serde_json::Value) -> Vec<String> {
    metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|package| {
            package["publish"]
                .as_array()
                .is_none_or(|to| !to.is_empty())
        })
        .filter_map(|package| package["name"].as_str().map(str::to_owned))
        .collect()
}

/// `cargo package` arguments: the crates of [`VERIFIED`] built from their packages, or every
/// publishable crate packaged without building it (all in one invocation: a crate's package
/// resolves its workspace dependencies among the packages of the same invocation, none of
/// them being on the registry yet).
fn package_args(publishable: &[String], verify: bool) -> Vec<String> {
    let mut args = vec!["package".to_owned(), "--allow-dirty".to_owned()];
    if !verify {
        args.push("--no-verify".to_owned());
    }
    for name in publishable {
        if !verify || VERIFIED.contains(&name.as_str()) {
            args.extend(["--package".to_owned(), name.clone()]);
        }
    }
    args
}

/// `cargo package` of every publishable crate, so the workspace can be published as it is.
fn package(metadata: &serde_json::Value) -> Result<()> {
    let publishable = publishable(metadata);
    for verify in [true, false] {
        let args = package_args(&publishable, verify);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let what = if verify {
            "package (the leaves, built)"
        } else {
            "package (every publishable crate, not built)"
        };
        cargo(what, &args)?;
    }
    Ok(())
}

/// `args` (a GPU lint's cargo command line, with `--features`) with distribute-candle and its
/// `cuda` added.
fn with_candle_cuda(mut args: Vec<String>) -> Vec<String> {
    let at = args
        .iter()
        .position(|a| a == "--features")
        .expect("a GPU lint names its features");
    args[at + 1] = format!("{},distribute-candle/cuda", args[at + 1]);
    args.splice(
        at..at,
        ["--package".to_owned(), "distribute-candle".to_owned()],
    );
    args
}

/// `cargo clippy` arguments that lint every target of `packages` with `mpi` on.
fn clippy_args(packages: &MpiPackages) -> Vec<String> {
    let mut args = vec!["clippy".to_owned(), "--all-targets".to_owned()];
    args.extend(packages.cargo_args());
    args.extend(["--", "-D", "warnings"].map(str::to_owned));
    args
}

/// `cargo xtask ci`'s lint with the `mpi` feature; an error when no MPI can be had.
fn clippy_mpi() -> Result<()> {
    let metadata = metadata()?;
    let packages = MpiPackages::of(&metadata);
    if packages.is_empty() {
        eprintln!("xtask: clippy (feature mpi): no package builds with MPI; nothing to lint");
        return Ok(());
    }
    let mpi = resolve(&metadata).context("linting with the `mpi` feature")?;
    let env = lint_env(mpi.env());
    let args = clippy_args(&packages);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    cargo_env("clippy (feature mpi)", &args, &env_refs(&env))?;
    // MPI and NCCL together (NCCL across an MPI job's GPUs): the same packages, with `nccl` on
    // where they have it.
    let args = with_nccl(
        clippy_args(&packages),
        &nccl_packages(&metadata, &packages.all()),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    cargo_env("clippy (features mpi, nccl)", &args, &env_refs(&env))
}

/// An MPI build's variables for a lint, which links nothing: without the rpath (`RUSTFLAGS`)
/// and the MPI's own target folder (`CARGO_TARGET_DIR`), so it checks in the workspace's target
/// folder and reuses every dependency the plain lint checked there; only the crates that build
/// with MPI are checked anew. (In the MPI's folder, under other `RUSTFLAGS`, it checked every
/// dependency again: 664 s of a cold `bash .ci/run` on 2 cores.)
fn lint_env(mut env: Vec<(&'static str, OsString)>) -> Vec<(&'static str, OsString)> {
    env.retain(|(name, _)| !matches!(*name, "RUSTFLAGS" | "CARGO_TARGET_DIR"));
    env
}

/// `args` (a cargo command line ending in `-- ...`) with `P/nccl` for each of `packages` added
/// to its features.
fn with_nccl(mut args: Vec<String>, packages: &[String]) -> Vec<String> {
    let nccl: Vec<String> = packages.iter().map(|p| format!("{p}/nccl")).collect();
    if nccl.is_empty() {
        return args;
    }
    match args.iter().position(|a| a == "--features") {
        Some(i) => args[i + 1] = format!("{},{}", args[i + 1], nccl.join(",")),
        None => {
            let end = args.iter().position(|a| a == "--").unwrap_or(args.len());
            args.splice(end..end, ["--features".to_owned(), nccl.join(",")]);
        }
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn every_publishable_crate_is_packaged_and_the_leaves_built() {
        let metadata: serde_json::Value = serde_json::from_str(
            r#"{"packages": [
                {"name": "distribute-values", "publish": null},
                {"name": "distribute-candle", "publish": null},
                {"name": "xtask", "publish": []},
                {"name": "distribute-launch", "publish": ["crates-io"]}
            ]}"#,
        )
        .unwrap();
        let names = publishable(&metadata);
        assert_eq!(
            names,
            [
                "distribute-values",
                "distribute-candle",
                "distribute-launch"
            ]
        );
        assert_eq!(
            package_args(&names, true).join(" "),
            "package --allow-dirty --package distribute-values --package distribute-launch"
        );
        assert_eq!(
            package_args(&names, false).join(" "),
            "package --allow-dirty --no-verify --package distribute-values --package \
             distribute-candle --package distribute-launch"
        );
        // The verified crates are the workspace's, and publishable.
        let workspace = publishable(&crate::cargo::metadata().unwrap());
        for name in VERIFIED {
            assert!(workspace.iter().any(|n| n == name), "{name}");
        }
    }

    #[test]
    fn the_gpu_lint_takes_candle_with_its_cuda_beside_the_gpu_features() {
        let args = with_candle_cuda(crate::test_gpu::clippy_args(&["cuda", "nccl"])).join(" ");
        assert!(
            args.contains("--package distribute-candle --features distribute-tensor/cuda,"),
            "{args}"
        );
        assert!(
            args.contains("distribute/nccl,distribute-candle/cuda -- -D warnings"),
            "{args}"
        );
    }

    #[test]
    fn clippy_lints_every_mpi_package_with_the_feature_and_again_with_nccl() {
        let packages = MpiPackages {
            featured: strings(&["distribute", "distribute-mirrored"]),
            only: strings(&["distribute-mpi"]),
        };
        assert_eq!(
            clippy_args(&packages).join(" "),
            "clippy --all-targets --package distribute --package distribute-mirrored \
             --package distribute-mpi --features distribute/mpi,distribute-mirrored/mpi -- -D \
             warnings"
        );
        assert_eq!(
            with_nccl(clippy_args(&packages), &strings(&["distribute-mpi"])).join(" "),
            "clippy --all-targets --package distribute --package distribute-mirrored --package \
             distribute-mpi --features distribute/mpi,distribute-mirrored/mpi,distribute-mpi/nccl \
             -- -D warnings"
        );
        let only = MpiPackages {
            featured: Vec::new(),
            only: strings(&["distribute-mpi"]),
        };
        assert_eq!(
            with_nccl(clippy_args(&only), &strings(&["distribute-mpi"])).join(" "),
            "clippy --all-targets --package distribute-mpi --features distribute-mpi/nccl -- -D \
             warnings"
        );
    }
}
