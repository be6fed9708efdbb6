//! `cargo xtask fetch-pjrt`: installs the pinned PJRT CPU plugin that `distribute-pjrt`'s tests
//! load, at `target/pjrt/…` (never committed; `target/` is ignored).
//!
//! The plugin ships on PyPI inside the wheel `lammps-jax-pjrt-cpu==0.11.2`, so `pip download
//! --no-deps` fetches it (the wheel declares jax as a dependency, which the plugin does not need).
//! Both the wheel and the unpacked .so are checked against pinned SHA-256 sums before anything
//! is installed; an installed file whose sum matches makes the command a no-op.

use std::fs;
use std::path::Path;

use anyhow::{Context, Result, bail};

use crate::wheel::{self, sha256_file};

/// The PyPI requirement that carries the plugin.
const REQUIREMENT: &str = "lammps-jax-pjrt-cpu==0.11.2";
/// SHA-256 of `lammps_jax_pjrt_cpu-0.11.2-py3-none-manylinux_2_27_x86_64.whl`, the wheel's only
/// build.
const WHEEL_SHA256: &str = "1319390d948b39f69f7dade496b7c385149d9ca6097a6b62114da113216d9ad1";
/// The plugin's path inside the wheel.
const MEMBER: &str = "lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so";
/// SHA-256 of that .so (PJRT C API 0.115).
const PLUGIN_SHA256: &str = "ad1309ac822b1b24d51b7f9947c7c9fa9ef5d67f390584cbc3d1fa2428fed9c2";
/// Where the plugin goes, below the workspace root. `distribute_pjrt::PINNED_PLUGIN_RELATIVE_PATH`
/// spells the same path; a test below keeps the two in step.
pub(crate) const INSTALL_PATH: &str =
    "target/pjrt/lammps-jax-pjrt-cpu-0.11.2/pjrt_c_api_cpu_plugin.so";

/// Installs the pinned plugin under `root` unless a checked copy is already there.
pub(crate) fn fetch(root: &Path, args: &[String]) -> Result<()> {
    if !args.is_empty() {
        bail!("`cargo xtask fetch-pjrt` takes no arguments (got {args:?})");
    }
    let destination = root.join(INSTALL_PATH);
    if destination.is_file() && sha256_file(&destination)? == PLUGIN_SHA256 {
        eprintln!("xtask: fetch-pjrt: {} is installed", destination.display());
        return Ok(());
    }
    let directory = destination.parent().expect("the install path has a parent");
    fs::create_dir_all(directory)
        .with_context(|| format!("could not create {}", directory.display()))?;
    let scratch = directory.join(format!("download-{}", std::process::id()));
    let result = download_and_install(&scratch, &destination);
    // The scratch folder holds a 63 MB wheel; remove it whatever happened.
    let _ = fs::remove_dir_all(&scratch);
    result
}

fn download_and_install(scratch: &Path, destination: &Path) -> Result<()> {
    fs::create_dir_all(scratch)
        .with_context(|| format!("could not create {}", scratch.display()))?;
    let wheel = wheel::pip_download(
        "fetch-pjrt",
        REQUIREMENT,
        &[],
        scratch,
        "the wheel exists for Linux x86_64 only: elsewhere set PJRT_PLUGIN to a plugin .so",
    )?;
    wheel::check_sha256(&wheel, WHEEL_SHA256, "fetch-pjrt")?;
    wheel::extract(&wheel, &[MEMBER], scratch)?;
    let unpacked = scratch.join(MEMBER);
    wheel::check_sha256(&unpacked, PLUGIN_SHA256, "fetch-pjrt")?;
    // A rename within one folder tree is atomic: a reader never sees half a plugin.
    fs::rename(&unpacked, destination).with_context(|| {
        format!(
            "could not move {} to {}",
            unpacked.display(),
            destination.display()
        )
    })?;
    eprintln!("xtask: fetch-pjrt: installed {}", destination.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_install_path_is_the_one_the_pjrt_crate_loads() {
        let root = crate::workspace_root();
        let plugin_rs = fs::read_to_string(root.join("crates/pjrt/src/plugin.rs")).unwrap();
        assert!(
            plugin_rs.contains(&format!("\"{INSTALL_PATH}\"")),
            "crates/pjrt/src/plugin.rs must name {INSTALL_PATH}"
        );
    }
}
