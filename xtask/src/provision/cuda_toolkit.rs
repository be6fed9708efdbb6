//! The CUDA toolkit that builds candle's CUDA backend (`distribute-candle`'s feature `cuda`), on a
//! machine with no CUDA installed and no GPU: nvcc 13.0 and what it compiles with, from pinned
//! PyPI wheels unpacked into one folder under `target/cuda-toolkit/` (never committed), plus
//! link-time stub libraries.
//!
//! candle compiles its kernels with nvcc at build time (`candle-kernels`) and links the CUDA
//! libraries (its cudarc uses `dynamic-linking`): `libcuda.so.1`, `libcublas.so.13`,
//! `libcublasLt.so.13`, `libcurand.so.10`, `libnvrtc.so.13` and (its kernels' static library)
//! `libcudart.so.13`. The linker only needs their
//! names and symbols, so instead of the driver (which no wheel ships) and cuBLAS/cuRAND (480 MB of
//! wheels), [`stub_libraries`] compiles stubs with the C compiler: every function that cudarc
//! 0.19.10 declares for that library, each returning the library's "not initialised" error, under
//! the real library's soname. The executables then need the real libraries where they run (the
//! GPU machine has them: the driver, and NVIDIA's CUDA 13 wheels); NVRTC links against the real
//! one of `fetch-nvrtc`. On a machine without a GPU, the stubs on `LD_LIBRARY_PATH` let such an
//! executable start, and every CUDA call then fails as the toolkit's own stub `libcuda.so` makes
//! it fail (`CUDA_ERROR_STUB_LIBRARY`): how the GPU bundle's dry run checks that the candle GPU
//! suite starts and reports the missing GPU as an error.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use super::pins::{self, Pin};
use super::wheel;

/// The wheels of the toolkit ([`pins::CUDA_TOOLKIT`]), all of CUDA 13.0 (the driver of the GPU
/// machine): nvcc (with ptxas), its front end's headers (crt), NVVM (cicc), the runtime's
/// headers and CCCL's. Each unpacks below `nvidia/cu13/`.
const WHEELS: [Pin; 5] = pins::CUDA_TOOLKIT;
/// The folder inside every wheel that holds the toolkit.
const WHEEL_PREFIX: &str = "nvidia/cu13/";
/// Where the toolkit goes, below the workspace root: `CUDA_HOME` of the builds.
const INSTALL_DIR: &str = "target/cuda-toolkit/cuda-13.0";
/// The file that says an install finished, holding the pins it was made from.
const MARKER: &str = ".installed";
/// The GPU architecture candle's kernels are compiled for: 9.0, the H100 and H200 of the GPU
/// machine (`CUDA_COMPUTE_CAP`; `DISTRIBUTE_CUDA_COMPUTE_CAP` overrides it).
const COMPUTE_CAP: &str = "90";

/// A library linked through a stub: its soname, the cudarc `sys` module that declares its
/// functions, and the status every stub function returns.
pub(crate) struct Stub {
    /// The real library's soname, the name the executables will need.
    pub(crate) soname: &'static str,
    /// The name the linker looks for (`-lcuda` finds `libcuda.so`).
    link_name: &'static str,
    /// The folder of cudarc's `src/` whose `sys/mod.rs` declares the library's functions.
    module: &'static str,
    /// What every stub function returns: the library's "not initialised"/"stub" status.
    status: u32,
}

/// The libraries candle's CUDA backend links that are stubbed at link time.
pub(crate) const STUBS: &[Stub] = &[
    Stub {
        soname: "libcuda.so.1",
        link_name: "libcuda.so",
        module: "driver",
        // CUDA_ERROR_STUB_LIBRARY
        status: 34,
    },
    Stub {
        soname: "libcublas.so.13",
        link_name: "libcublas.so",
        module: "cublas",
        // CUBLAS_STATUS_NOT_INITIALIZED
        status: 1,
    },
    Stub {
        soname: "libcublasLt.so.13",
        link_name: "libcublasLt.so",
        module: "cublaslt",
        // CUBLAS_STATUS_NOT_INITIALIZED
        status: 1,
    },
    Stub {
        soname: "libcurand.so.10",
        link_name: "libcurand.so",
        module: "curand",
        // CURAND_STATUS_NOT_INITIALIZED
        status: 201,
    },
    // The workspace's NCCL backend, linked beside candle's CUDA backend in one executable
    // (cudarc's `dynamic-linking` links every library it is built with).
    Stub {
        soname: "libnccl.so.2",
        link_name: "libnccl.so",
        module: "nccl",
        // ncclSystemError
        status: 2,
    },
];

/// The CUDA runtime that candle-kernels' static library links (the real one, 0.7 MB, from the
/// runtime wheel); the GPU machine's CUDA 13 wheels have it too.
pub(crate) const CUDART: &str = "libcudart.so.13";

/// An installed toolkit.
pub(crate) struct Toolkit {
    /// `CUDA_HOME`: `bin/nvcc`, `include/`, `lib/`.
    home: PathBuf,
}

impl Toolkit {
    /// The folder of the real libraries the executables link besides the stubs: the CUDA
    /// runtime ([`CUDART`]).
    pub(crate) fn lib(&self) -> PathBuf {
        self.home.join("lib")
    }

    /// The folder of the stub libraries (`lib/stubs`, where cudarc's build looks for them).
    pub(crate) fn stubs(&self) -> PathBuf {
        self.home.join("lib/stubs")
    }

    /// The environment of a cargo build that compiles candle's CUDA backend: nvcc on `PATH`,
    /// `CUDA_HOME`, and the GPU architecture: `DISTRIBUTE_CUDA_COMPUTE_CAP`, else for another
    /// machine (`for_this_gpu` false) the H100/H200's, else none, so that candle's build asks
    /// this machine's GPU.
    pub(crate) fn build_env(
        &self,
        for_this_gpu: bool,
    ) -> Result<Vec<(String, std::ffi::OsString)>> {
        let mut path = std::ffi::OsString::from(self.home.join("bin"));
        if let Some(old) = std::env::var_os("PATH") {
            path.push(":");
            path.push(old);
        }
        let mut env = vec![
            ("PATH".into(), path),
            ("CUDA_HOME".into(), self.home.clone().into()),
        ];
        let cap = std::env::var("DISTRIBUTE_CUDA_COMPUTE_CAP")
            .ok()
            .or_else(|| (!for_this_gpu).then(|| COMPUTE_CAP.to_owned()));
        if let Some(cap) = cap {
            env.push(("CUDA_COMPUTE_CAP".into(), cap.into()));
        }
        Ok(env)
    }
}

/// Installs the toolkit under `root` unless it is there, links NVRTC (of `fetch-nvrtc`) and
/// compiles the stubs; returns it.
pub(crate) fn fetch(root: &Path) -> Result<Toolkit> {
    // nvcc compiles the host side of candle's kernels with the system's C++ compiler.
    let cxx = Command::new("g++").arg("--version").output();
    if !cxx.is_ok_and(|out| out.status.success()) {
        bail!(
            "candle's CUDA kernels need a C++ compiler for nvcc: `g++` does not run; install g++ \
             (Debian: apt install g++) and run again"
        );
    }
    let home = root.join(INSTALL_DIR);
    let pins = pins_text();
    if fs::read_to_string(home.join(MARKER)).ok().as_deref() != Some(pins.as_str()) {
        wheel::require_platform(
            "the CUDA toolkit",
            "build distribute-candle's `cuda` with a CUDA toolkit of your own (CUDA_HOME)",
        )?;
        let parent = home.parent().expect("the install folder has a parent");
        fs::create_dir_all(parent)
            .with_context(|| format!("could not create {}", parent.display()))?;
        let scratch = parent.join(format!("download-{}", std::process::id()));
        let result = install(root, &scratch, &home, &pins);
        let _ = fs::remove_dir_all(&scratch);
        result?;
    }
    let toolkit = Toolkit { home };
    let nvrtc = super::nvrtc::fetch(root)?;
    let lib = toolkit.lib();
    link(&nvrtc.join("libnvrtc.so.13"), &lib.join("libnvrtc.so"))?;
    // candle-kernels' static library calls the CUDA runtime: the real one, from the wheel.
    link(Path::new(CUDART), &lib.join("libcudart.so"))?;
    stub_libraries(root, &toolkit.stubs())?;
    Ok(toolkit)
}

/// The pins, one per line: what the marker holds.
fn pins_text() -> String {
    WHEELS.iter().fold(String::new(), |mut text, pin| {
        let _ = writeln!(text, "{} {}", pin.file(), pin.sha256);
        text
    })
}

fn install(root: &Path, scratch: &Path, home: &Path, pins: &str) -> Result<()> {
    let unpacked = scratch.join("cuda");
    for pin in &WHEELS {
        let downloaded = wheel::download(root, pin, scratch, "the CUDA toolkit")?;
        wheel::extract_tree(&downloaded, WHEEL_PREFIX, &unpacked)?;
        // The wheels are large; keep one on disk at a time.
        if downloaded.starts_with(scratch) {
            fs::remove_file(&downloaded)?;
        }
    }
    if !unpacked.join("bin/nvcc").is_file() {
        bail!("the CUDA toolkit wheels have no bin/nvcc");
    }
    fs::write(unpacked.join(MARKER), pins)?;
    if home.exists() {
        fs::remove_dir_all(home)
            .with_context(|| format!("could not remove the stale {}", home.display()))?;
    }
    fs::rename(&unpacked, home).with_context(|| {
        format!(
            "could not move {} to {}",
            unpacked.display(),
            home.display()
        )
    })?;
    eprintln!("xtask: installed the CUDA toolkit at {}", home.display());
    Ok(())
}

/// Makes `link` a symlink to `target`, replacing what was there.
fn link(target: &Path, link: &Path) -> Result<()> {
    if link.symlink_metadata().is_ok() {
        fs::remove_file(link).with_context(|| format!("could not remove {}", link.display()))?;
    }
    std::os::unix::fs::symlink(target, link)
        .with_context(|| format!("could not link {} to {}", link.display(), target.display()))
}

/// Compiles every [`STUBS`] library into `dir` (as `link_name`, with a `soname` symlink), from
/// the functions cudarc's sources declare; a no-op when they are there from the same sources.
fn stub_libraries(root: &Path, dir: &Path) -> Result<()> {
    let cudarc = cudarc_source(root)?;
    fs::create_dir_all(dir).with_context(|| format!("could not create {}", dir.display()))?;
    for stub in STUBS {
        let sys = cudarc.join("src").join(stub.module).join("sys/mod.rs");
        let source = fs::read_to_string(&sys)
            .with_context(|| format!("could not read cudarc's {}", sys.display()))?;
        let c = stub_source(&source, stub.status);
        if c.is_empty() {
            bail!("found no functions in {}", sys.display());
        }
        let c_file = dir.join(format!("{}.c", stub.link_name));
        let library = dir.join(stub.link_name);
        let soname = dir.join(stub.soname);
        if fs::read_to_string(&c_file).ok().as_deref() == Some(c.as_str())
            && library.is_file()
            && soname.is_file()
        {
            continue;
        }
        fs::write(&c_file, &c)?;
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let status = Command::new(&cc)
            .args(["-shared", "-fPIC", "-o"])
            .arg(&library)
            .arg(format!("-Wl,-soname,{}", stub.soname))
            .arg(&c_file)
            .status()
            .with_context(|| format!("could not run the C compiler `{cc}`"))?;
        if !status.success() {
            bail!("`{cc}` could not compile the stub {}", library.display());
        }
        link(Path::new(stub.link_name), &soname)?;
    }
    Ok(())
}

/// C source defining every function `sys` (a cudarc `sys/mod.rs`) declares, each returning
/// `status`, in name order.
fn stub_source(sys: &str, status: u32) -> String {
    let mut names: Vec<&str> = sys
        .lines()
        .filter_map(|line| line.strip_prefix("pub unsafe fn "))
        .filter_map(|rest| rest.split('(').next())
        .filter(|name| {
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
        .filter(|name| *name != "is_culib_present" && *name != "culib")
        .collect();
    names.sort_unstable();
    names.dedup();
    names.iter().fold(String::new(), |mut c, name| {
        let _ = writeln!(c, "int {name}(void) {{ return {status}; }}");
        c
    })
}

/// The folder of the cudarc crate's sources that the workspace builds with (`cargo metadata`).
fn cudarc_source(root: &Path) -> Result<PathBuf> {
    // The cargo that runs this program (as cargo sets it for what it runs), else `cargo`.
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .args(["metadata", "--format-version", "1"])
        .current_dir(root)
        .output()
        .context("could not run cargo metadata")?;
    if !output.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    let manifest = metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|package| package["name"] == "cudarc")
        .and_then(|package| package["manifest_path"].as_str())
        .context("cargo metadata lists no cudarc package")?;
    Ok(Path::new(manifest)
        .parent()
        .expect("a manifest is in a folder")
        .to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stub_defines_each_declared_function_once_returning_the_status() {
        let sys = "pub type CUresult = u32;\n\
                   pub unsafe fn cuInit(Flags: u32) -> CUresult {\n\
                   pub unsafe fn cuDeviceGet(device: *mut i32, ordinal: i32) -> CUresult {\n\
                   pub unsafe fn cuInit(Flags: u32) -> CUresult {\n\
                   pub unsafe fn is_culib_present() -> bool {\n\
                   pub unsafe fn culib() -> &'static Library {\n";
        assert_eq!(
            stub_source(sys, 34),
            "int cuDeviceGet(void) { return 34; }\nint cuInit(void) { return 34; }\n"
        );
    }
}
