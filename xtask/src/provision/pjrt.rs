//! The pinned PJRT plugins, installed under `target/pjrt/…` (never committed; `target/` is
//! ignored); `cargo xtask fetch-pjrt [--plugin cpu|cuda]` runs [`install`].
//!
//! - `cpu` (the default): the CPU plugin that `distribute-pjrt`'s tests load, from the wheel
//!   `lammps-jax-pjrt-cpu==0.11.2`.
//! - `cuda`: the CUDA plugin `xla_cuda_plugin.so` from JAX's `jax-cuda13-pjrt==0.11.2`, for
//!   `TpuStrategy` on NVIDIA GPUs (set `PJRT_PLUGIN` to the path it prints). It loads the CUDA 13
//!   libraries of the system, or of NVIDIA's wheels on `LD_LIBRARY_PATH`.
//!
//! The plugins ship on PyPI inside wheels, downloaded from their pinned URLs (no pip; the CPU
//! wheel's declared dependency on jax is not needed by the plugin). Both the wheel and the
//! unpacked .so are checked against pinned SHA-256 sums before anything is installed; an
//! installed file whose sum matches makes the command a no-op.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::pins::{self, Member};
use super::wheel::{self, sha256_file};

/// A pinned PJRT plugin that `fetch-pjrt` installs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Plugin {
    /// The CPU plugin, for tests and machines without an accelerator.
    Cpu,
    /// JAX's CUDA 13 plugin, for NVIDIA GPUs.
    Cuda,
}

/// Everything pinned about one plugin.
struct PluginPin {
    /// The `--plugin` value.
    name: &'static str,
    /// The wheel that carries the plugin (its only build: Linux x86_64).
    wheel: pins::Pin,
    /// The plugin inside the wheel, with its SHA-256.
    plugin: Member,
    /// Where the plugin goes, below the workspace root.
    install_path: &'static str,
}

impl Plugin {
    /// Every plugin, the CPU one first.
    pub(crate) const ALL: [Plugin; 2] = [Plugin::Cpu, Plugin::Cuda];

    fn pin(self) -> &'static PluginPin {
        match self {
            Plugin::Cpu => &PluginPin {
                name: "cpu",
                wheel: pins::PJRT_CPU,
                plugin: pins::PJRT_CPU_PLUGIN,
                install_path: INSTALL_PATH,
            },
            Plugin::Cuda => &PluginPin {
                name: "cuda",
                wheel: pins::PJRT_CUDA,
                plugin: pins::PJRT_CUDA_PLUGIN,
                install_path: CUDA_INSTALL_PATH,
            },
        }
    }

    /// The name `fetch-pjrt --plugin` takes: `cpu` or `cuda`.
    pub(crate) fn name(self) -> &'static str {
        self.pin().name
    }

    /// The installed plugin's path for the workspace at `root`.
    pub(crate) fn install_path(self, root: &Path) -> PathBuf {
        root.join(self.pin().install_path)
    }
}

/// Where the CPU plugin goes, below the workspace root. `distribute_pjrt::PINNED_PLUGIN_RELATIVE_PATH`
/// spells the same path; a test below keeps the two in step.
pub(crate) const INSTALL_PATH: &str =
    "target/pjrt/lammps-jax-pjrt-cpu-0.11.2/pjrt_c_api_cpu_plugin.so";
/// Where the CUDA plugin goes, below the workspace root.
const CUDA_INSTALL_PATH: &str = "target/pjrt/jax-cuda13-pjrt-0.11.2/xla_cuda_plugin.so";

/// Installs `plugin` under `root` unless a checked copy is there; returns its path.
pub(crate) fn install(root: &Path, plugin: Plugin) -> Result<PathBuf> {
    let pin = plugin.pin();
    let destination = plugin.install_path(root);
    if destination.is_file() && sha256_file(&destination)? == pin.plugin.sha256 {
        eprintln!("xtask: fetch-pjrt: {} is installed", destination.display());
        return Ok(destination);
    }
    let directory = destination.parent().expect("the install path has a parent");
    fs::create_dir_all(directory)
        .with_context(|| format!("could not create {}", directory.display()))?;
    let scratch = directory.join(format!("download-{}", std::process::id()));
    let result = download_and_install(root, pin, &scratch, &destination);
    // The scratch folder holds a wheel of 63 MB (CPU) or 134 MB (CUDA); remove it whatever
    // happened.
    let _ = fs::remove_dir_all(&scratch);
    result?;
    Ok(destination)
}

fn download_and_install(
    root: &Path,
    pin: &PluginPin,
    scratch: &Path,
    destination: &Path,
) -> Result<()> {
    wheel::require_platform("fetch-pjrt", "elsewhere set PJRT_PLUGIN to a plugin .so")?;
    let wheel = wheel::download(root, &pin.wheel, scratch, "fetch-pjrt")?;
    wheel::extract(&wheel, &[pin.plugin.path], scratch)?;
    let unpacked = scratch.join(pin.plugin.path);
    wheel::check_sha256(&unpacked, pin.plugin.sha256, "fetch-pjrt")?;
    // A rename within one folder tree is atomic: a reader never sees half a plugin.
    fs::rename(&unpacked, destination).with_context(|| {
        format!(
            "could not move {} to {}",
            unpacked.display(),
            destination.display()
        )
    })?;
    eprintln!("xtask: fetch-pjrt: installed {}", destination.display());
    if pin.name != "cpu" {
        eprintln!(
            "xtask: fetch-pjrt: use it with PJRT_PLUGIN={}",
            destination.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_install_path_is_the_one_the_pjrt_crate_loads() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let plugin_rs = fs::read_to_string(root.join("crates/pjrt/src/plugin.rs")).unwrap();
        assert!(
            plugin_rs.contains(&format!("\"{INSTALL_PATH}\"")),
            "crates/pjrt/src/plugin.rs must name {INSTALL_PATH}"
        );
    }

    #[test]
    fn every_pin_is_complete_and_installs_under_target_pjrt() {
        let root = Path::new("/w");
        for plugin in Plugin::ALL {
            let pin = plugin.pin();
            let path = plugin.install_path(root);
            assert!(path.starts_with("/w/target/pjrt/"), "{}", path.display());
            assert_eq!(path.file_name(), Path::new(pin.plugin.path).file_name());
        }
    }
}
