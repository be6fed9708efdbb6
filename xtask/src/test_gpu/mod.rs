//! `cargo xtask test-gpu`: the GPU suites, the test, bench and binary targets that the workspace
//! tests leave out (they need NVRTC, a GPU, NCCL or the CUDA PJRT plugin), and the commands that
//! run them.
//!
//! - [`suites`]: the one table of suites and their cargo arguments.
//! - [`libs`]: finding the GPU, NCCL, NVRTC and the CUDA PJRT plugin.
//! - [`runner`]: `cargo xtask test` runs the one suite a machine without a GPU can run (kernels
//!   compiled to PTX, with the NVRTC of `fetch-nvrtc`); `cargo xtask test-gpu` runs every suite
//!   on this machine's GPU.
//! - [`bundle`]: `cargo xtask test-gpu --build-only DIR [SUITE...|--all]` builds the suites into
//!   `DIR` with `run.sh` (`test_gpu/run.sh`), which runs them on another machine that has no
//!   Rust, and the Open MPI that the suites with `mpi` were built against (that machine has
//!   none).
//! - [`dry_run`](mod@dry_run): `cargo xtask test-gpu --dry-run` (and the end of `cargo xtask test`) builds the
//!   bundle and runs its `run.sh` here, without a GPU, checking what each suite must give.
//! - `cargo xtask ci` also runs clippy with the GPU features on (`cuda`, then `cuda` + `nccl`;
//!   [`clippy_args`]).
//!
//! The TpuStrategy suites (`pjrt-plugin`, `tpu-*`, `bench-tpu`, `demo-tpu`) are the CPU
//! plugin's suites run with `PJRT_PLUGIN` set to JAX's CUDA plugin (`xla_cuda_plugin.so`).
//!
//! What a device call carries (the working tree and the bundle) is 64 MiB at most, and every
//! suite with the carried Open MPI is more. So `--build-only DIR` without suite names builds the
//! set the next GPU session runs ([`suites::DEFAULT_SUITES`]: the candle suites, which run two
//! workers under `mpirun`, and the CUDA and NCCL suites beneath them), naming suites builds
//! those, and `--all` builds every one. The dry run builds and runs every suite, and checks that
//! the default set fits a device call (docs/gpus.md, "What the next GPU session runs").
//!
//! cudarc loads CUDA, NVRTC and NCCL at run time. It looks for `libnccl.so` and
//! `libnccl.so.<CUDA major>` but never `libnccl.so.2`, the only name the PyPI NCCL wheels ship,
//! so both runners put a folder with a `libnccl.so -> …/libnccl.so.2` symlink on
//! `LD_LIBRARY_PATH` (see `../shared/notes/cuda-nccl.md`). The tests skip what is missing
//! unless `DISTRIBUTE_REQUIRE_{NVRTC,GPU,NCCL}=1`, which the runners set.

mod bundle;
mod dry_run;
mod libs;
mod runner;
mod suites;

use std::path::PathBuf;

use anyhow::Result;
use clap::builder::PossibleValuesParser;

use crate::cargo::workspace_root;

pub(crate) use dry_run::dry_run;
pub(crate) use runner::test_nvrtc;
pub(crate) use suites::{clippy_args, gpu_only_packages};

/// On a machine with an NVIDIA GPU: run every GPU suite
///
/// Runs every GPU suite here (the tests, the gpu and tpu benches, the demo on TpuStrategy) with
/// NVRTC, NCCL (from NCCL_LIB_DIR, the nvidia-nccl-cu13/-cu12 wheel or the system) and the CUDA
/// PJRT plugin (PJRT_PLUGIN, fetch-pjrt --plugin cuda or the jax-cuda13-pjrt wheel), each
/// skipped with a warning when missing, and DISTRIBUTE_REQUIRE_{GPU,NVRTC,NCCL}=1. The candle
/// suites build with a CUDA 13.0 toolkit (nvcc) of 5 pinned wheels, installed under
/// target/cuda-toolkit/ with link-time stubs of the driver, cuBLAS and cuRAND
/// (DISTRIBUTE_CUDA_COMPUTE_CAP overrides the GPU architecture), and with the MPI of test-mpi
/// (DISTRIBUTE_MPI), whose mpirun starts their two-worker cases.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Build the GPU suites (the next GPU session's, those named, or --all) into DIR
    /// (stripped; e.g. target/gpu-bundle) with DIR/run.sh, which runs them on a GPU machine
    /// without Rust: `DIR/run.sh [SUITE...]` (NCCL_LIB_DIR, NVRTC_LIB_DIR, PJRT_PLUGIN override
    /// what it finds); executables over 16 MiB go in xz-compressed, which run.sh unpacks, and
    /// so does the Open MPI (the pinned wheel's) that the candle suites' workers run under
    #[arg(long, value_name = "DIR", conflicts_with = "dry_run")]
    build_only: Option<PathBuf>,
    /// Build the bundle into target/gpu-bundle-dry and run its run.sh on this machine without a
    /// GPU, checking each suite's expected outcome (what `test` ends with)
    #[arg(long)]
    dry_run: bool,
    /// The suites --build-only builds (default: what the next GPU session runs: collectives-nvrtc,
    /// collectives-gpu, nccl, nccl-exchange-cluster, mirrored-gpu, candle-gpu, bench-candle-gpu)
    #[arg(
        value_name = "SUITE",
        requires = "build_only",
        value_parser = PossibleValuesParser::new(suites::SUITES.iter().map(|suite| suite.name))
    )]
    suites: Vec<String>,
    /// With --build-only: every suite, the TpuStrategy ones too (more than a device run carries
    /// with the Open MPI of the candle suites)
    #[arg(long, requires = "build_only", conflicts_with = "suites")]
    all: bool,
}

/// `cargo xtask test-gpu [--build-only DIR [SUITE...] | --dry-run]`.
pub(crate) fn command(args: &Args) -> Result<()> {
    let root = workspace_root();
    match (&args.build_only, args.dry_run) {
        (Some(dir), _) => {
            bundle::build_only(&root, dir, &bundle::selected(&args.suites, args.all)?)
        }
        (None, true) => dry_run::dry_run(&root),
        (None, false) => runner::run_here(&root),
    }
}

#[cfg(test)]
mod tests {
    use clap::error::ErrorKind;

    use crate::{Command, parse};

    #[test]
    fn test_gpu_takes_a_bundle_folder_and_suites_or_the_dry_run() {
        let parsed = |args: &[&str]| match parse(args).unwrap() {
            Command::TestGpu(args) => (args.build_only, args.dry_run, args.suites, args.all),
            _ => panic!("{args:?} is not test-gpu"),
        };
        assert_eq!(parsed(&["test-gpu"]), (None, false, vec![], false));
        assert_eq!(
            parsed(&["test-gpu", "--dry-run"]),
            (None, true, vec![], false)
        );
        assert_eq!(
            parsed(&["test-gpu", "--build-only", "b", "--all"]),
            (Some("b".into()), false, vec![], true)
        );
        for form in [
            &["test-gpu", "--build-only", "b", "nccl", "demo-tpu"][..],
            &["test-gpu", "--build-only=b", "nccl", "demo-tpu"],
        ] {
            assert_eq!(
                parsed(form),
                (
                    Some("b".into()),
                    false,
                    vec!["nccl".to_owned(), "demo-tpu".to_owned()],
                    false
                ),
                "{form:?}"
            );
        }
    }

    #[test]
    fn test_gpu_rejects_unknown_arguments() {
        for (args, kind) in [
            (
                &["test-gpu", "--frobnicate"][..],
                ErrorKind::UnknownArgument,
            ),
            (&["test-gpu", "nccl"], ErrorKind::MissingRequiredArgument),
            (
                &["test-gpu", "--dry-run", "--build-only", "b"],
                ErrorKind::ArgumentConflict,
            ),
            (
                &["test-gpu", "--build-only", "b", "nonsense"],
                ErrorKind::InvalidValue,
            ),
            (
                &["test-gpu", "--build-only", "b", "--all", "nccl"],
                ErrorKind::ArgumentConflict,
            ),
            (&["test-gpu", "--all"], ErrorKind::MissingRequiredArgument),
        ] {
            let Err(err) = parse(args) else {
                panic!("{args:?} parsed");
            };
            assert_eq!(err.kind(), kind, "{args:?}: {err}");
        }
    }
}
