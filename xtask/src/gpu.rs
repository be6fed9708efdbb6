//! The GPU suites: the test and bench targets behind the `cuda` and `nccl` features, which the
//! workspace tests leave out (they need NVRTC, a GPU or NCCL), and the commands that run them.
//!
//! - `cargo xtask test` runs the one suite a machine without a GPU can run, [`NVRTC_SUITE`]
//!   (kernels compiled to PTX), with the NVRTC of `fetch-nvrtc` ([`test_nvrtc`]).
//! - `cargo xtask ci` also runs clippy with the GPU features on (`cuda`, then `cuda` + `nccl`;
//!   [`clippy_args`]).
//! - `cargo xtask test-gpu` runs every suite here on a machine with an NVIDIA GPU, or with
//!   `--build-only DIR` builds them into `DIR` with a `run.sh` that runs them on another
//!   machine that has no Rust ([`command`]).
//!
//! cudarc loads CUDA, NVRTC and NCCL at run time. It looks for `libnccl.so` and
//! `libnccl.so.<CUDA major>` but never `libnccl.so.2`, the only name the PyPI NCCL wheels ship,
//! so both runners put a folder with a `libnccl.so -> …/libnccl.so.2` symlink on
//! `LD_LIBRARY_PATH` (see `../shared/notes/cuda-nccl.md`). The tests skip what is missing
//! unless `DISTRIBUTE_REQUIRE_{NVRTC,GPU,NCCL}=1`, which the runners set.

mod bundle;
mod libs;
mod runner;
mod suites;

use std::path::Path;

use anyhow::{Result, bail};

use crate::workspace_root;

pub(crate) use runner::test_nvrtc;
pub(crate) use suites::clippy_args;

/// `cargo xtask test-gpu [--build-only DIR]`.
pub(crate) fn command(args: &[String]) -> Result<()> {
    let root = workspace_root();
    match args {
        [] => runner::run_here(&root),
        [flag, dir] if flag == "--build-only" => bundle::build_only(&root, Path::new(dir)),
        [flag] if flag.starts_with("--build-only=") => {
            bundle::build_only(&root, Path::new(&flag["--build-only=".len()..]))
        }
        _ => bail!("usage: cargo xtask test-gpu [--build-only DIR] (got {args:?})"),
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
