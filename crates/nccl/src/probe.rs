//! Whether NCCL can be loaded, asked before the first call into it (cudarc panics on a call
//! into a library that is missing), with where a pip-installed copy lies when it cannot.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use distribute_tensor::GpuError;
use distribute_tensor::cuda::library_present;

/// True when NCCL is there for cudarc: linked into the program (a build with candle's CUDA
/// backend links it), or loadable under one of the names cudarc's dynamic loading tries
/// (`libnccl.so`, …; see `distribute_tensor::cuda::library_present`).
pub fn nccl_available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| library_present("nccl", "ncclGetVersion"))
}

/// Fails with [`GpuError::MissingLibrary`] unless NCCL is there; the error says where a
/// pip-installed copy (`libnccl.so.2`, a name cudarc's loading does not try) was found and how
/// to make it loadable.
pub fn require_nccl() -> Result<(), GpuError> {
    if nccl_available() {
        return Ok(());
    }
    let hint = match find_pip_nccl() {
        Some(lib) => format!(
            "found {} (from the nvidia-nccl wheel), but cudarc only loads `libnccl.so`: make a \
             folder with a symlink `libnccl.so -> {}` and put it on LD_LIBRARY_PATH before \
             starting the program (`cargo xtask test-gpu` does this)",
            lib.display(),
            lib.display()
        ),
        None => "install NCCL: `pip install nvidia-nccl-cu13` (then link libnccl.so to its \
                 nvidia/nccl/lib/libnccl.so.2 on LD_LIBRARY_PATH) or the libnccl2 package"
            .to_owned(),
    };
    Err(GpuError::MissingLibrary {
        library: "NCCL",
        hint: format!("cudarc looks for libnccl.so; {hint}"),
    })
}

/// `libnccl.so.2` from the nvidia-nccl-cu13/-cu12 wheels: `$NCCL_LIB_DIR`, then the Python that
/// `python3` runs. Only asked when NCCL did not load, to write a useful error.
fn find_pip_nccl() -> Option<PathBuf> {
    let in_dir = |dir: PathBuf| Some(dir.join("libnccl.so.2")).filter(|p| p.exists());
    if let Some(lib) = std::env::var_os("NCCL_LIB_DIR").and_then(|dir| in_dir(PathBuf::from(dir))) {
        return Some(lib);
    }
    let out = Command::new("python3")
        .args([
            "-c",
            "import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], 'lib'))",
        ])
        .output()
        .ok()?;
    let dir = String::from_utf8(out.stdout).ok()?;
    in_dir(PathBuf::from(dir.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_answers_without_panicking() {
        // On a machine without NCCL this is a plain `false` and a typed error, never a panic.
        if !nccl_available() {
            let err = require_nccl().unwrap_err().to_string();
            assert!(err.contains("libnccl.so"), "{err}");
        }
    }
}
