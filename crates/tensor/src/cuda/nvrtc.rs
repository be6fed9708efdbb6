//! One NVRTC program: the kernels' source compiled with the project's options, then read as PTX
//! (for a virtual architecture: what CI checks without a GPU) or as a CUBIN (for a real one: what
//! a GPU loads). A CUBIN is machine code the driver loads as it is, so it works under a driver
//! older than NVRTC within one CUDA major version, where PTX of a newer ISA would be refused
//! (CUDA's minor version compatibility covers machine code, not PTX). Every `unsafe` NVRTC call
//! of the crate is a method here.

use std::ffi::{CStr, CString, c_char};

use cudarc::nvrtc::{result, sys};

use super::probe::require_nvrtc;
use crate::GpuError;

/// A compiled NVRTC program, destroyed on drop.
pub(super) struct Program {
    prog: sys::nvrtcProgram,
    // The program refers to its source and name until it is destroyed.
    _source: CString,
    _name: CString,
}

impl Program {
    /// Compiles `source` (named `name` in messages) with `options`; a compile error carries
    /// NVRTC's log.
    pub(super) fn compile(source: &str, name: &str, options: &[String]) -> Result<Self, GpuError> {
        require_nvrtc()?;
        let text = |what: &str| GpuError::Compile(format!("{what} contains a NUL byte"));
        let source_c = CString::new(source).map_err(|_| text("the kernel source"))?;
        let name_c = CString::new(name).map_err(|_| text("the program name"))?;
        let prog = result::create_program(&source_c, Some(&name_c))
            .map_err(|e| GpuError::Compile(format!("nvrtcCreateProgram: {e:?}")))?;
        let program = Program {
            prog,
            _source: source_c,
            _name: name_c,
        };
        // SAFETY: `prog` was just created and is destroyed only by Drop.
        let compiled = unsafe { result::compile_program(program.prog, options) };
        if let Err(e) = compiled {
            return Err(GpuError::Compile(format!(
                "{e:?} with options {options:?}: {}",
                program.log()
            )));
        }
        Ok(program)
    }

    /// NVRTC's log of the compilation (warnings, or why it failed).
    fn log(&self) -> String {
        // SAFETY: the program is live.
        match unsafe { result::get_program_log(self.prog) } {
            Ok(log) => c_text(&log),
            Err(e) => format!("(no log: {e:?})"),
        }
    }

    /// The PTX.
    pub(super) fn ptx(&self) -> Result<String, GpuError> {
        // SAFETY: the program is live and compiled.
        let ptx = unsafe { result::get_ptx(self.prog) }
            .map_err(|e| GpuError::Compile(format!("nvrtcGetPTX: {e:?}")))?;
        Ok(c_text(&ptx))
    }

    /// The CUBIN: there is one only when the program was compiled for a real architecture
    /// (`sm_XY`).
    pub(super) fn cubin(&self) -> Result<Vec<u8>, GpuError> {
        let failed = |call: &str, e: sys::nvrtcResult| {
            GpuError::Compile(format!(
                "{call}: {e:?} (a CUBIN needs a real architecture, sm_XY)"
            ))
        };
        let mut size = 0usize;
        // SAFETY: the program is live and compiled; `size` is a valid out-pointer.
        let status = unsafe { sys::nvrtcGetCUBINSize(self.prog, &mut size) };
        if status != sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(failed("nvrtcGetCUBINSize", status));
        }
        if size == 0 {
            return Err(GpuError::Compile(
                "NVRTC made no CUBIN: compile for a real architecture (sm_XY), not a virtual one"
                    .into(),
            ));
        }
        let mut cubin = vec![0u8; size];
        // SAFETY: `cubin` holds the `size` bytes NVRTC reported.
        let status = unsafe { sys::nvrtcGetCUBIN(self.prog, cubin.as_mut_ptr().cast::<c_char>()) };
        if status != sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(failed("nvrtcGetCUBIN", status));
        }
        Ok(cubin)
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program is live and nothing uses it after this. A failure to free it
        // cannot be acted on.
        let _ = unsafe { result::destroy_program(self.prog) };
    }
}

/// A NUL-terminated C string NVRTC filled in, as text.
fn c_text(bytes: &[c_char]) -> String {
    let bytes: Vec<u8> = bytes.iter().map(|&b| b as u8).collect();
    match CStr::from_bytes_until_nul(&bytes) {
        Ok(text) => text.to_string_lossy().into_owned(),
        Err(_) => String::from_utf8_lossy(&bytes).into_owned(),
    }
}
