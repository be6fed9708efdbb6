//! Whether the CUDA driver, NVRTC and NCCL can be loaded, asked before any call into them.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use cudarc::driver::CudaContext;

use crate::GpuError;

/// True when libcuda loads (cached: loading is a `dlopen` per candidate name).
fn driver_available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen the library; no symbol is called.
    *PRESENT.get_or_init(|| unsafe { cudarc::driver::sys::is_culib_present() })
}

/// True when NVRTC, the run-time CUDA compiler, loads.
pub fn nvrtc_available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: as above.
    *PRESENT.get_or_init(|| unsafe { cudarc::nvrtc::sys::is_culib_present() })
}

/// True when NCCL loads under one of the names cudarc looks for (`libnccl.so`, …).
pub fn nccl_available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: as above.
    *PRESENT.get_or_init(|| unsafe { cudarc::nccl::sys::is_culib_present() })
}

/// The number of GPUs the driver sees; a typed error when there is no driver or it fails to
/// initialise (no GPU, driver/library mismatch).
pub fn gpu_count() -> Result<usize, GpuError> {
    if !driver_available() {
        return Err(GpuError::NoDriver);
    }
    match CudaContext::device_count() {
        Ok(n) => Ok(usize::try_from(n).unwrap_or(0)),
        Err(e) => Err(GpuError::NoGpu(e.to_string())),
    }
}

/// Fails with [`GpuError::NoNvrtc`] unless NVRTC loads.
pub fn require_nvrtc() -> Result<(), GpuError> {
    if nvrtc_available() {
        Ok(())
    } else {
        Err(GpuError::NoNvrtc)
    }
}

/// Fails with [`GpuError::NoNccl`] unless NCCL loads; the error says where a pip-installed copy
/// (`libnccl.so.2`, a name cudarc does not try) was found and how to make it loadable.
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
    Err(GpuError::NoNccl { hint })
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
    fn probes_answer_without_panicking() {
        // On a machine without CUDA these are plain `false`/errors, never cudarc's panic.
        match gpu_count() {
            Ok(_) | Err(GpuError::NoDriver) | Err(GpuError::NoGpu(_)) => {}
            Err(other) => panic!("unexpected probe error: {other}"),
        }
        let _ = (nvrtc_available(), nccl_available());
        if !nccl_available() {
            let err = require_nccl().unwrap_err().to_string();
            assert!(err.contains("libnccl.so"), "{err}");
        }
    }
}
