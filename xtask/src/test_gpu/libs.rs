//! Finding the native libraries the GPU suites load at run time: the GPU itself, NVIDIA's Python
//! wheels (`nvidia/*/lib` in site-packages), NCCL and NVRTC, and the `LD_LIBRARY_PATH` that
//! makes cudarc find them.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// Folders where a system install puts `libnccl.so.2`, searched after the Python wheels.
pub(super) const SYSTEM_NCCL_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/local/cuda/lib64",
    "/usr/local/nccl/lib",
    "/usr/local/lib",
];
/// Folders where a CUDA toolkit puts `libnvrtc.so.<major>`, searched before the Python wheels.
pub(super) const CUDA_TOOLKIT_DIRS: &[&str] = &["/usr/local/cuda/lib64"];
/// Folders where a distribution's packages put NVRTC, searched after the Python wheels.
pub(super) const SYSTEM_NVRTC_DIRS: &[&str] = &["/usr/lib/x86_64-linux-gnu", "/usr/lib64"];
/// The NCCL library the wheels and system packages ship.
pub(super) const NCCL_LIBRARY: &str = "libnccl.so.2";

/// Evidence of an NVIDIA GPU: `nvidia-smi -L`'s GPUs, else /dev/nvidia0, else a loadable
/// libcuda.so.1 (a container may have the driver library without nvidia-smi).
pub(super) fn detect_gpu() -> Option<String> {
    if let Ok(output) = Command::new("nvidia-smi")
        .arg("-L")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
    {
        let listing = String::from_utf8_lossy(&output.stdout);
        let gpus: Vec<&str> = listing
            .lines()
            .filter(|line| line.starts_with("GPU "))
            .collect();
        if output.status.success() && !gpus.is_empty() {
            return Some(gpus.join("; "));
        }
    }
    if Path::new("/dev/nvidia0").exists() {
        return Some("/dev/nvidia0 exists".to_owned());
    }
    // SAFETY: loading the CUDA driver library runs only its initialisers, which have no
    // preconditions; nothing is called through it and it is unloaded at once.
    if unsafe { libloading::Library::new("libcuda.so.1") }.is_ok() {
        return Some("libcuda.so.1 loads".to_owned());
    }
    None
}

/// The folders `python3` installs packages into (site-packages, user site, `sys.path`),
/// existing ones only, in its order; none without python3.
pub(super) fn python_site_dirs() -> Vec<PathBuf> {
    let output = Command::new("python3")
        .args([
            "-c",
            "import site, sys\n\
             print('\\n'.join([*site.getsitepackages(), site.getusersitepackages(), *sys.path]))",
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output();
    let Ok(output) = output else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = Vec::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let dir = PathBuf::from(line);
        if !line.is_empty() && dir.is_dir() && !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    dirs
}

/// The `nvidia/*/lib` folders of NVIDIA's wheels in `site_dirs` (`nvidia/nccl/lib` of
/// nvidia-nccl-cu12, `nvidia/cu13/lib` of the CUDA 13 wheels, …), sorted within each site.
pub(super) fn wheel_lib_dirs(site_dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for site in site_dirs {
        let Ok(entries) = fs::read_dir(site.join("nvidia")) else {
            continue;
        };
        let mut libs: Vec<PathBuf> = entries
            .filter_map(|entry| entry.ok().map(|entry| entry.path().join("lib")))
            .filter(|lib| lib.is_dir())
            .collect();
        libs.sort();
        found.extend(libs);
    }
    found
}

/// The file name of the CUDA PJRT plugin in the `jax-cuda13-pjrt` and `jax-cuda12-pjrt` wheels.
pub(crate) const CUDA_PJRT_LIBRARY: &str = "xla_cuda_plugin.so";

/// The CUDA PJRT plugin: `env_plugin` (`PJRT_PLUGIN`, an error when it is not a file), else
/// `xla_cuda_plugin.so` in the first of `dirs` that has it (a bundle's folder, `fetch-pjrt
/// --plugin cuda`'s install), else in the `jax_plugins/*/` folder of a `jax-cuda*-pjrt` wheel in
/// `site_dirs`; `None` when there is none.
pub(super) fn find_cuda_pjrt(
    env_plugin: Option<&Path>,
    dirs: &[PathBuf],
    site_dirs: &[PathBuf],
) -> Result<Option<PathBuf>> {
    if let Some(plugin) = env_plugin {
        if plugin.is_file() {
            return Ok(Some(plugin.to_path_buf()));
        }
        bail!("PJRT_PLUGIN={} is not a file", plugin.display());
    }
    if let Some(dir) = dirs
        .iter()
        .find(|dir| dir.join(CUDA_PJRT_LIBRARY).is_file())
    {
        return Ok(Some(dir.join(CUDA_PJRT_LIBRARY)));
    }
    for site in site_dirs {
        let Ok(entries) = fs::read_dir(site.join("jax_plugins")) else {
            continue;
        };
        let mut plugins: Vec<PathBuf> = entries
            .filter_map(|entry| entry.ok().map(|entry| entry.path().join(CUDA_PJRT_LIBRARY)))
            .filter(|plugin| plugin.is_file())
            .collect();
        // xla_cuda13 before xla_cuda12: the newest CUDA first.
        plugins.sort();
        if let Some(plugin) = plugins.pop() {
            return Ok(Some(plugin));
        }
    }
    Ok(None)
}

/// The folder with `libnccl.so.2`: `env_dir` (`NCCL_LIB_DIR`, an error when it lacks the
/// library), else the first of `wheel_dirs`, else of `system_dirs`.
pub(super) fn find_nccl(
    env_dir: Option<&Path>,
    wheel_dirs: &[PathBuf],
    system_dirs: &[&str],
) -> Result<Option<PathBuf>> {
    if let Some(dir) = env_dir {
        if dir.join(NCCL_LIBRARY).exists() {
            return Ok(Some(dir.to_path_buf()));
        }
        bail!("NCCL_LIB_DIR={} has no {NCCL_LIBRARY}", dir.display());
    }
    Ok(wheel_dirs
        .iter()
        .cloned()
        .chain(system_dirs.iter().map(PathBuf::from))
        .find(|dir| dir.join(NCCL_LIBRARY).exists()))
}

/// The folder with `libnvrtc.so.<major>`: a CUDA toolkit's, else a wheel's, else a system
/// package's; `None` sends the caller to `fetch-nvrtc`.
pub(super) fn find_nvrtc(wheel_dirs: &[PathBuf]) -> Option<PathBuf> {
    CUDA_TOOLKIT_DIRS
        .iter()
        .map(PathBuf::from)
        .chain(wheel_dirs.iter().cloned())
        .chain(SYSTEM_NVRTC_DIRS.iter().map(PathBuf::from))
        .find(|dir| has_nvrtc(dir))
}

/// Whether `dir` holds `libnvrtc.so.<digits>`, a name cudarc loads.
fn has_nvrtc(dir: &Path) -> bool {
    let Ok(entries) = fs::read_dir(dir) else {
        return false;
    };
    entries.filter_map(|entry| entry.ok()).any(|entry| {
        entry
            .file_name()
            .to_str()
            .and_then(|name| name.strip_prefix("libnvrtc.so."))
            .is_some_and(|major| !major.is_empty() && major.bytes().all(|b| b.is_ascii_digit()))
    })
}

/// Makes `dir/libnccl.so` a symlink to `library`, the name cudarc loads.
pub(super) fn link_nccl(dir: &Path, library: &Path) -> Result<()> {
    let link = dir.join("libnccl.so");
    if link.symlink_metadata().is_ok() {
        fs::remove_file(&link).with_context(|| format!("could not remove {}", link.display()))?;
    }
    std::os::unix::fs::symlink(library, &link)
        .with_context(|| format!("could not link {} to {}", link.display(), library.display()))
}

/// `dirs` then the entries of `existing` (an `LD_LIBRARY_PATH`), `:`-joined.
pub(super) fn ld_library_path(dirs: &[PathBuf], existing: Option<OsString>) -> Result<OsString> {
    let mut all: Vec<PathBuf> = dirs.to_vec();
    if let Some(existing) = existing {
        all.extend(std::env::split_paths(&existing).filter(|dir| !dir.as_os_str().is_empty()));
    }
    std::env::join_paths(all).context("a library folder's path contains ':'")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake site-packages with the layouts of nvidia-nccl-cu12 and the CUDA 13 wheels.
    fn fake_site() -> tempfile::TempDir {
        let site = tempfile::tempdir().unwrap();
        for (dir, file) in [
            ("nvidia/nccl/lib", "libnccl.so.2"),
            ("nvidia/cu13/lib", "libnvrtc.so.13"),
            ("nvidia/cu13/lib", "libnvrtc-builtins.so.13.0"),
            ("nvidia/cublas/lib", "libcublas.so.13"),
        ] {
            fs::create_dir_all(site.path().join(dir)).unwrap();
            fs::write(site.path().join(dir).join(file), b"").unwrap();
        }
        fs::create_dir_all(site.path().join("nvidia/cu13/include")).unwrap();
        site
    }

    #[test]
    fn nccl_is_found_in_a_wheel_and_nccl_lib_dir_wins() {
        let site = fake_site();
        let wheel_dirs =
            wheel_lib_dirs(&[site.path().to_path_buf(), PathBuf::from("/nonexistent")]);
        assert_eq!(
            wheel_dirs,
            ["nvidia/cu13/lib", "nvidia/cublas/lib", "nvidia/nccl/lib"]
                .map(|dir| site.path().join(dir))
        );
        assert_eq!(
            find_nccl(None, &wheel_dirs, &[]).unwrap(),
            Some(site.path().join("nvidia/nccl/lib"))
        );
        assert_eq!(find_nccl(None, &[], &["/nonexistent"]).unwrap(), None);

        let own = tempfile::tempdir().unwrap();
        assert!(find_nccl(Some(own.path()), &wheel_dirs, &[]).is_err());
        fs::write(own.path().join(NCCL_LIBRARY), b"").unwrap();
        assert_eq!(
            find_nccl(Some(own.path()), &wheel_dirs, &[]).unwrap(),
            Some(own.path().to_path_buf())
        );
        let system = own.path().to_str().unwrap();
        assert_eq!(
            find_nccl(None, &[], &["/nonexistent", system]).unwrap(),
            Some(own.path().to_path_buf())
        );
    }

    #[test]
    fn the_cuda_pjrt_plugin_is_found_by_env_folder_or_wheel() {
        let site = fake_site();
        assert_eq!(
            find_cuda_pjrt(None, &[], &[site.path().to_path_buf()]).unwrap(),
            None
        );
        for wheel in ["xla_cuda12", "xla_cuda13"] {
            let dir = site.path().join("jax_plugins").join(wheel);
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join(CUDA_PJRT_LIBRARY), b"").unwrap();
        }
        let in_wheel = site
            .path()
            .join("jax_plugins/xla_cuda13")
            .join(CUDA_PJRT_LIBRARY);
        let sites = [PathBuf::from("/nonexistent"), site.path().to_path_buf()];
        assert_eq!(
            find_cuda_pjrt(None, &[], &sites).unwrap(),
            Some(in_wheel.clone())
        );

        let bundle = tempfile::tempdir().unwrap();
        let dirs = [PathBuf::from("/nonexistent"), bundle.path().to_path_buf()];
        assert_eq!(
            find_cuda_pjrt(None, &dirs, &sites).unwrap(),
            Some(in_wheel.clone())
        );
        fs::write(bundle.path().join(CUDA_PJRT_LIBRARY), b"").unwrap();
        assert_eq!(
            find_cuda_pjrt(None, &dirs, &sites).unwrap(),
            Some(bundle.path().join(CUDA_PJRT_LIBRARY))
        );

        assert_eq!(
            find_cuda_pjrt(Some(&in_wheel), &dirs, &[]).unwrap(),
            Some(in_wheel)
        );
        let err = find_cuda_pjrt(Some(Path::new("/no/plugin.so")), &dirs, &sites).unwrap_err();
        assert!(
            err.to_string().contains("PJRT_PLUGIN=/no/plugin.so"),
            "{err}"
        );
    }

    #[test]
    fn nvrtc_is_recognised_by_its_versioned_name() {
        let site = fake_site();
        assert!(has_nvrtc(&site.path().join("nvidia/cu13/lib")));
        assert!(!has_nvrtc(&site.path().join("nvidia/nccl/lib")));
        let only_builtins = tempfile::tempdir().unwrap();
        fs::write(only_builtins.path().join("libnvrtc-builtins.so.13.0"), b"").unwrap();
        fs::write(only_builtins.path().join("libnvrtc.so"), b"").unwrap();
        assert!(!has_nvrtc(only_builtins.path()));
    }

    #[test]
    fn the_nccl_link_has_the_name_cudarc_loads() {
        let site = fake_site();
        let libs = tempfile::tempdir().unwrap();
        let library = site.path().join("nvidia/nccl/lib").join(NCCL_LIBRARY);
        link_nccl(libs.path(), &library).unwrap();
        // Linking again replaces the link.
        link_nccl(libs.path(), &library).unwrap();
        assert_eq!(
            fs::read_link(libs.path().join("libnccl.so")).unwrap(),
            library
        );
    }

    #[test]
    fn ld_library_path_puts_new_folders_first() {
        let joined = ld_library_path(
            &[PathBuf::from("/a"), PathBuf::from("/b")],
            Some(OsString::from("/c::/d")),
        )
        .unwrap();
        assert_eq!(joined, "/a:/b:/c:/d");
        assert_eq!(ld_library_path(&[PathBuf::from("/a")], None).unwrap(), "/a");
    }
}
