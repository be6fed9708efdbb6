//! Whether the CUDA driver and NVRTC can be loaded, asked before any call into them.

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
        if !nvrtc_available() {
            assert_eq!(require_nvrtc(), Err(GpuError::NoNvrtc));
        }
    }
}
