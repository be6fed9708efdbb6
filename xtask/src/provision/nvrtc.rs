//! NVIDIA's runtime compiler, NVRTC, installed by [`fetch`] (`cargo xtask fetch-nvrtc`) from its
//! pinned PyPI wheel ([`pins::NVRTC`]) at `target/nvrtc/…/lib` (never committed; `target/` is
//! ignored), so that CI compiles the CUDA reduction kernels of `distribute-collectives` to PTX on
//! a machine with no GPU and no CUDA.
//!
//! cudarc (built with `cuda-13000`) dlopens `libnvrtc.so` … `libnvrtc.so.13`; the wheel ships
//! `libnvrtc.so.13`, which loads `libnvrtc-builtins.so.13.0` from its own folder, so putting
//! the returned folder on `LD_LIBRARY_PATH` is all a test process needs. The wheel and both
//! unpacked libraries are checked against pinned SHA-256 sums; installed libraries whose sums
//! match make the command a no-op.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::pins::{self, NVRTC_LIBRARIES};
use super::wheel;

/// The folder of the libraries inside the wheel.
const WHEEL_LIB_DIR: &str = "nvidia/cu13/lib";
/// Where the libraries go, below the workspace root.
const INSTALL_DIR: &str = "target/nvrtc/nvidia-cuda-nvrtc-13.0.88/lib";

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
    for library in NVRTC_LIBRARIES {
        let path = lib_dir.join(file_name(library.path));
        if !path.is_file() || wheel::sha256_file(&path)? != library.sha256 {
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
    let downloaded = wheel::download(root, &pins::NVRTC, scratch, "fetch-nvrtc")?;
    let members = NVRTC_LIBRARIES.map(|library| library.path);
    let unpacked = scratch.join("unpacked");
    wheel::extract(&downloaded, &members, &unpacked)?;
    for library in NVRTC_LIBRARIES {
        wheel::check_sha256(&unpacked.join(library.path), library.sha256, "fetch-nvrtc")?;
    }
    let unpacked_lib_dir = unpacked.join(WHEEL_LIB_DIR);
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

/// The last part of a path inside a wheel.
fn file_name(path: &str) -> &str {
    path.rsplit_once('/').map_or(path, |(_, name)| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_libraries_are_in_one_folder_of_the_wheel() {
        for library in NVRTC_LIBRARIES {
            assert_eq!(
                library.path,
                format!("{WHEEL_LIB_DIR}/{}", file_name(library.path))
            );
        }
    }

    #[test]
    fn a_folder_with_a_wrong_library_is_not_installed() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!is_installed(dir.path()).unwrap());
        for library in NVRTC_LIBRARIES {
            fs::write(dir.path().join(file_name(library.path)), b"not a library").unwrap();
        }
        assert!(!is_installed(dir.path()).unwrap());
    }
}
