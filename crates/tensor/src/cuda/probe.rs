//! Whether the CUDA driver and NVRTC can be loaded, asked before any call into them, in either of
//! the ways cudarc reaches them: loaded at run time (its `dynamic-loading`, this workspace's
//! default, where a call into a missing library panics) or linked at build time (its
//! `dynamic-linking`, which candle's CUDA backend turns on for the whole build; the program does
//! not start without them). [`library_present`] answers for both, so one binary can hold
//! candle's CUDA backend and these collectives.

use std::sync::OnceLock;

use cudarc::driver::CudaContext;

use crate::GpuError;

/// The CUDA major version this build's cudarc names its libraries by (feature `cuda-13000`).
const CUDA_MAJOR: &str = "13";

/// Whether the CUDA library `name` (`cuda`, `nvrtc`, `nccl`) is there for cudarc: `symbol`, one
/// of its functions, already resolves in this process (the library is linked in, or loaded
/// globally), or the library loads under one of the file names cudarc's dynamic loading tries
/// (`libNAME.so`, `libNAME.so.13`, …, `libNAME.so.1`: the names of cudarc 0.19's
/// `get_lib_name_candidates` on Linux for CUDA 13). Loads nothing it keeps and calls nothing.
pub fn library_present(name: &str, symbol: &str) -> bool {
    // SAFETY: dlopen(NULL) names the running program, and dlsym only looks a name up; no
    // function is called and nothing is unloaded that the program uses.
    let linked = unsafe {
        libloading::os::unix::Library::this()
            .get::<*const std::ffi::c_void>(symbol.as_bytes())
            .is_ok()
    };
    linked
        || candidates(name).iter().any(|file| {
            // SAFETY: loading a CUDA library runs no code of ours; its initialisers are the
            // vendor's, as when cudarc loads it.
            unsafe { libloading::Library::new(file) }.is_ok()
        })
}

/// The file names cudarc's dynamic loading tries for `name` on 64-bit Linux, in its order.
fn candidates(name: &str) -> Vec<String> {
    let mut files = vec![
        format!("lib{name}.so"),
        format!("lib{name}64.so"),
        format!("lib{name}64_{CUDA_MAJOR}.so"),
        format!("lib{name}64_{CUDA_MAJOR}0.so"),
        format!("lib{name}64_{CUDA_MAJOR}0_0.so"),
        format!("lib{name}64_10.so"),
        format!("lib{name}64_11.so"),
        format!("lib{name}64_12.so"),
        format!("lib{name}64_9.so"),
    ];
    for suffix in [CUDA_MAJOR, "12", "11", "10", "9", "1"] {
        files.push(format!("lib{name}.so.{suffix}"));
    }
    files
}

/// True when libcuda is there (cached: loading is a `dlopen` per candidate name).
fn driver_available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| library_present("cuda", "cuInit"))
}

/// True when NVRTC, the run-time CUDA compiler, is there.
pub fn nvrtc_available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| library_present("nvrtc", "nvrtcVersion"))
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
    fn a_library_of_the_process_is_present_and_a_made_up_one_is_not() {
        // The C library is linked into every test binary.
        assert!(library_present("c", "malloc"));
        assert!(!library_present(
            "distribute-no-such-library",
            "no_such_symbol"
        ));
        let names = candidates("nccl");
        assert_eq!(names[0], "libnccl.so");
        assert!(names.contains(&"libnccl.so.13".to_owned()));
        assert!(
            !names.contains(&"libnccl.so.2".to_owned()),
            "cudarc never tries .so.2"
        );
    }

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
