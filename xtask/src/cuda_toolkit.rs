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

use crate::wheel;

/// The wheels of the toolkit, all of CUDA 13.0 (the driver of the GPU machine): nvcc (with
/// ptxas), its front end's headers (crt), NVVM (cicc), the runtime's headers and CCCL's. Each
/// unpacks below `nvidia/cu13/`.
const WHEELS: &[wheel::Pin] = &[
    wheel::Pin {
        file: "nvidia_cuda_nvcc-13.0.88-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        url: "https://files.pythonhosted.org/packages/71/8b/a546c12881fffeba927d810598987df25d74b8b241788c7db8dfc93b0173/nvidia_cuda_nvcc-13.0.88-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        sha256: "56fe502eb77625a12f25172caa3cdddb4e4c8ba2c8c17dba44b164761b380f03",
    },
    wheel::Pin {
        file: "nvidia_cuda_crt-13.0.88-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        url: "https://files.pythonhosted.org/packages/05/69/a1ec4d9f0747d85964206feb47bf359f48a2d6af74c0add8abba6efe3dda/nvidia_cuda_crt-13.0.88-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        sha256: "2c8043c7c9e02492716426e9919fc78d2c5b3b2a7a768a88e952676b08aa55a4",
    },
    wheel::Pin {
        file: "nvidia_nvvm-13.0.88-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl",
        url: "https://files.pythonhosted.org/packages/15/b0/ee41e6d1108d959b5097163e7190c2d0f7857dea75606ce358f0275891b4/nvidia_nvvm-13.0.88-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl",
        sha256: "c5f41ffeb6466944a026dfa5317d7d85355c119bbec279205d22f1869d1054e0",
    },
    wheel::Pin {
        file: "nvidia_cuda_runtime-13.0.96-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        url: "https://files.pythonhosted.org/packages/2e/24/d1558f3b68b1d26e706813b1d10aa1d785e4698c425af8db8edc3dced472/nvidia_cuda_runtime-13.0.96-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        sha256: "7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548",
    },
    wheel::Pin {
        file: "nvidia_cuda_cccl-13.0.85-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        url: "https://files.pythonhosted.org/packages/ab/fb/0384bb2129bed6b1b39f8e44471c615ab5ab29b7e55817538a1d390d8f84/nvidia_cuda_cccl-13.0.85-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        sha256: "e0da7ad981f3a8aff08241b5bfc1af868742a63e2762f53a5171c492ef242649",
    },
];
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
    let nvrtc = crate::nvrtc::fetch(root)?;
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
        let _ = writeln!(text, "{} {}", pin.file, pin.sha256);
        text
    })
}

fn install(root: &Path, scratch: &Path, home: &Path, pins: &str) -> Result<()> {
    let unpacked = scratch.join("cuda");
    for pin in WHEELS {
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
    let output = Command::new(crate::cargo_program())
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
    fn every_wheel_pin_is_complete_and_of_cuda_13_0() {
        for pin in WHEELS {
            wheel::tests::assert_pin_is_complete(pin);
            assert!(pin.file.contains("-13.0."), "{}", pin.file);
        }
    }

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

    #[test]
    fn the_stubbed_sonames_are_what_run_sh_looks_for() {
        // run.sh finds the real libraries of a linked suite by these names on the GPU machine.
        let run_sh = include_str!("gpu/run.sh");
        for stub in STUBS.iter().filter(|s| s.module != "driver") {
            assert!(run_sh.contains(stub.soname), "{}", stub.soname);
        }
        assert!(run_sh.contains(CUDART));
    }
}
