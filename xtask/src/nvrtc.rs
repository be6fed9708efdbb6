//! `cargo xtask fetch-nvrtc`: installs NVIDIA's runtime compiler, NVRTC, from its pinned PyPI
//! wheel at `target/nvrtc/…/lib` (never committed; `target/` is ignored), so that CI compiles the
//! CUDA reduction kernels of `distribute-collectives` to PTX on a machine with no GPU and no CUDA.
//!
//! cudarc (built with `cuda-13000`) dlopens `libnvrtc.so` … `libnvrtc.so.13`; the wheel ships
//! `libnvrtc.so.13`, which loads `libnvrtc-builtins.so.13.0` from its own folder, so putting
//! the returned folder on `LD_LIBRARY_PATH` is all a test process needs. The wheel and both
//! unpacked libraries are checked against pinned SHA-256 sums; installed libraries whose sums
//! match make the command a no-op.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::wheel;

/// The wheel that carries NVRTC, `nvidia-cuda-nvrtc==13.0.88` (90,215,200 bytes). 13.0 is the
/// newest NVRTC a CUDA 13.0 driver runs the PTX of (NVRTC must not be newer than the driver),
/// and the version cudarc's `cuda-13000` names.
pub(crate) const WHEEL: wheel::Pin = wheel::Pin {
    file: "nvidia_cuda_nvrtc-13.0.88-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl",
    url: "https://files.pythonhosted.org/packages/c3/68/483a78f5e8f31b08fb1bb671559968c0ca3a065ac7acabfc7cee55214fd6/nvidia_cuda_nvrtc-13.0.88-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl",
    sha256: "ad9b6d2ead2435f11cbb6868809d2adeeee302e9bb94bcf0539c7a40d80e8575",
};
/// The same wheel as a pip requirement: what the GPU bundle's run.sh, on a machine without
/// Rust, tells to install where it finds no NVRTC (a test keeps the two in step).
#[cfg(test)]
pub(crate) const REQUIREMENT: &str = "nvidia-cuda-nvrtc==13.0.88";
/// The folder of the libraries inside the wheel.
const WHEEL_LIB_DIR: &str = "nvidia/cu13/lib";
/// The libraries taken from the wheel, with their SHA-256 sums. The wheel also has
/// `libnvrtc.alt.so.13` and `libnvrtc-builtins.alt.so.13.0` (115 MB more), which cudarc never
/// loads.
const LIBRARIES: &[(&str, &str)] = &[
    (
        "libnvrtc.so.13",
        "a49e67e8e74590f1e98de55c39c6287efd3f59e3c3797464d7bbe0fe01349b11",
    ),
    (
        "libnvrtc-builtins.so.13.0",
        "91dcd944d01da9c0f08fff5d779db136a47f6d62bdb63bae900d2f481e92c3a2",
    ),
];
/// Where the libraries go, below the workspace root.
pub(crate) const INSTALL_DIR: &str = "target/nvrtc/nvidia-cuda-nvrtc-13.0.88/lib";

/// `cargo xtask fetch-nvrtc`: installs NVRTC and prints the folder to put on `LD_LIBRARY_PATH`.
pub(crate) fn command(root: &Path, args: &[String]) -> Result<()> {
    if !args.is_empty() {
        bail!("`cargo xtask fetch-nvrtc` takes no arguments (got {args:?})");
    }
    let lib_dir = fetch(root)?;
    println!("{}", lib_dir.display());
    Ok(())
}

/// Installs the pinned NVRTC under `root` unless checked copies are already there, and returns
/// the folder that holds the libraries.
pub(crate) fn fetch(root: &Path) -> Result<PathBuf> {
    let lib_dir = root.join(INSTALL_DIR);
    if is_installed(&lib_dir)? {
        eprintln!("xtask: fetch-nvrtc: {} is installed", lib_dir.display());
        return Ok(lib_dir);
    }
    let parent = lib_dir.parent().expect("the install folder has a parent");
    fs::create_dir_all(parent).with_context(|| format!("could not create {}", parent.display()))?;
    let scratch = parent.join(format!("download-{}", std::process::id()));
    let result = download_and_install(root, &scratch, &lib_dir);
    // The scratch folder holds a 90 MB wheel and what was unpacked; remove it whatever happened.
    let _ = fs::remove_dir_all(&scratch);
    result.map(|()| lib_dir)
}

/// Whether every library is in `lib_dir` with its pinned sum.
fn is_installed(lib_dir: &Path) -> Result<bool> {
    for (name, sha256) in LIBRARIES {
        let path = lib_dir.join(name);
        if !path.is_file() || wheel::sha256_file(&path)? != *sha256 {
            return Ok(false);
        }
    }
    Ok(true)
}

fn download_and_install(root: &Path, scratch: &Path, lib_dir: &Path) -> Result<()> {
    wheel::require_platform(
        "fetch-nvrtc",
        "elsewhere set NVRTC_LIB_DIR to an NVRTC lib folder",
    )?;
    let downloaded = wheel::download(root, &WHEEL, scratch, "fetch-nvrtc")?;
    let members: Vec<String> = LIBRARIES
        .iter()
        .map(|(name, _)| format!("{WHEEL_LIB_DIR}/{name}"))
        .collect();
    let members: Vec<&str> = members.iter().map(String::as_str).collect();
    let unpacked = scratch.join("unpacked");
    wheel::extract(&downloaded, &members, &unpacked)?;
    let unpacked_lib_dir = unpacked.join(WHEEL_LIB_DIR);
    for (name, sha256) in LIBRARIES {
        wheel::check_sha256(&unpacked_lib_dir.join(name), sha256, "fetch-nvrtc")?;
    }
    // Replace the whole folder by one rename (atomic within one file system), so that a reader
    // never sees one new library beside an old one.
    if lib_dir.exists() {
        fs::remove_dir_all(lib_dir)
            .with_context(|| format!("could not remove the stale {}", lib_dir.display()))?;
    }
    fs::rename(&unpacked_lib_dir, lib_dir).with_context(|| {
        format!(
            "could not move {} to {}",
            unpacked_lib_dir.display(),
            lib_dir.display()
        )
    })?;
    eprintln!("xtask: fetch-nvrtc: installed {}", lib_dir.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wheel_pin_is_complete_and_the_requirement() {
        wheel::tests::assert_pin_is_complete(&WHEEL);
        let (name, version) = REQUIREMENT.split_once("==").unwrap();
        let prefix = format!("{}-{version}-", name.replace('-', "_"));
        assert!(
            WHEEL.file.starts_with(&prefix),
            "{} vs {REQUIREMENT}",
            WHEEL.file
        );
    }

    #[test]
    fn a_folder_with_a_wrong_library_is_not_installed() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!is_installed(dir.path()).unwrap());
        for (name, _) in LIBRARIES {
            fs::write(dir.path().join(name), b"not a library").unwrap();
        }
        assert!(!is_installed(dir.path()).unwrap());
    }
}
