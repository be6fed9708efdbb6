//! The GPU suites: the test, bench and binary targets that the workspace tests leave out (they
//! need NVRTC, a GPU, NCCL or the CUDA PJRT plugin), and the commands that run them.
//!
//! - [`suites`]: the one table of suites and their cargo arguments.
//! - [`libs`]: finding the GPU, NCCL, NVRTC and the CUDA PJRT plugin.
//! - [`runner`]: `cargo xtask test` runs the one suite a machine without a GPU can run (kernels
//!   compiled to PTX, with the NVRTC of `fetch-nvrtc`); `cargo xtask test-gpu` runs every suite
//!   on this machine's GPU.
//! - [`bundle`]: `cargo xtask test-gpu --build-only DIR [SUITE...]` builds the suites into `DIR`
//!   with `run.sh` (`test_gpu/run.sh`), which runs them on another machine that has no Rust.
//! - [`dry_run`]: `cargo xtask test-gpu --dry-run` (and the end of `cargo xtask test`) builds the
//!   bundle and runs its `run.sh` here, without a GPU, checking what each suite must give.
//! - `cargo xtask ci` also runs clippy with the GPU features on (`cuda`, then `cuda` + `nccl`;
//!   [`clippy_args`]).
//!
//! The TpuStrategy suites (`pjrt-plugin`, `tpu-*`, `bench-tpu`, `demo-tpu`) are the CPU
//! plugin's suites run with `PJRT_PLUGIN` set to JAX's CUDA plugin (`xla_cuda_plugin.so`).
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

use std::path::Path;

use anyhow::{Result, bail};

use crate::cargo::workspace_root;

pub(crate) use dry_run::dry_run;
pub(crate) use runner::test_nvrtc;
pub(crate) use suites::{clippy_args, gpu_only_packages};

/// `cargo xtask test-gpu [--build-only DIR [SUITE...] | --dry-run]`.
pub(crate) fn command(args: &[String]) -> Result<()> {
    let root = workspace_root();
    match args {
        [] => runner::run_here(&root),
        [flag] if flag == "--dry-run" => dry_run::dry_run(&root),
        [flag, dir, suites @ ..] if flag == "--build-only" => {
            bundle::build_only(&root, Path::new(dir), suites)
        }
        [flag, suites @ ..] if flag.starts_with("--build-only=") => {
            bundle::build_only(&root, Path::new(&flag["--build-only=".len()..]), suites)
        }
        _ => bail!(
            "usage: cargo xtask test-gpu [--build-only DIR [SUITE...] | --dry-run] (got {args:?})"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_gpu_rejects_unknown_arguments() {
        let err = command(&["--frobnicate".to_owned()]).unwrap_err();
        assert!(
            err.to_string().contains("usage: cargo xtask test-gpu"),
            "{err}"
        );
    }
}
