//! `cargo xtask fetch-pjrt [--plugin cpu|cuda]`: installs a pinned PJRT plugin under
//! `target/pjrt/…` (never committed; `target/` is ignored).
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

use anyhow::{Context, Result, bail};

use crate::wheel::{self, sha256_file};

/// A pinned PJRT plugin that `fetch-pjrt` installs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Plugin {
    /// The CPU plugin, for tests and machines without an accelerator.
    Cpu,
    /// JAX's CUDA 13 plugin, for NVIDIA GPUs.
    Cuda,
}

/// Everything pinned about one plugin.
struct Pin {
    /// The `--plugin` value.
    name: &'static str,
    /// The wheel that carries the plugin (its only build: Linux x86_64).
    wheel: wheel::Pin,
    /// The plugin's path inside the wheel.
    member: &'static str,
    /// SHA-256 of that .so.
    plugin_sha256: &'static str,
    /// Where the plugin goes, below the workspace root.
    install_path: &'static str,
}

impl Plugin {
    const ALL: [Plugin; 2] = [Plugin::Cpu, Plugin::Cuda];

    fn pin(self) -> &'static Pin {
        match self {
            Plugin::Cpu => &Pin {
                name: "cpu",
                // lammps-jax-pjrt-cpu==0.11.2 (62,711,338 bytes).
                wheel: wheel::Pin {
                    file: "lammps_jax_pjrt_cpu-0.11.2-py3-none-manylinux_2_27_x86_64.whl",
                    url: "https://files.pythonhosted.org/packages/e5/90/f04e5ea9e56f01965b4cd56bc3cf4801a563cd47b74d4ded5780f19c3a7c/lammps_jax_pjrt_cpu-0.11.2-py3-none-manylinux_2_27_x86_64.whl",
                    sha256: "1319390d948b39f69f7dade496b7c385149d9ca6097a6b62114da113216d9ad1",
                },
                member: "lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so",
                // PJRT C API 0.115.
                plugin_sha256: "ad1309ac822b1b24d51b7f9947c7c9fa9ef5d67f390584cbc3d1fa2428fed9c2",
                install_path: INSTALL_PATH,
            },
            Plugin::Cuda => &Pin {
                name: "cuda",
                // jax-cuda13-pjrt==0.11.2 (134,162,640 bytes).
                wheel: wheel::Pin {
                    file: "jax_cuda13_pjrt-0.11.2-py3-none-manylinux_2_27_x86_64.whl",
                    url: "https://files.pythonhosted.org/packages/a8/13/247ba4ea1ac057309f2e1328d743ba355631b76d31fbebd076421a74e26e/jax_cuda13_pjrt-0.11.2-py3-none-manylinux_2_27_x86_64.whl",
                    sha256: "e5ff589d43064913bb74027682d89639c7ea48f9f81c2bae6fc75117e913f93e",
                },
                member: "jax_plugins/xla_cuda13/xla_cuda_plugin.so",
                // 411 MB unpacked.
                plugin_sha256: "43d3efd6fd43d8a5d9aa67176e830d81e4ad5fc19fda4ad09cdcc4aebd9f3920",
                install_path: CUDA_INSTALL_PATH,
            },
        }
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

/// `fetch-pjrt [--plugin cpu|cuda]`: installs the plugin under `root` unless a checked copy is
/// already there.
pub(crate) fn fetch(root: &Path, args: &[String]) -> Result<()> {
    install(root, parse_args(args)?).map(drop)
}

/// The plugin the arguments name: none is the CPU plugin.
fn parse_args(args: &[String]) -> Result<Plugin> {
    let name = match args {
        [] => return Ok(Plugin::Cpu),
        [flag, name] if flag == "--plugin" => name.as_str(),
        [flag] if flag.starts_with("--plugin=") => &flag["--plugin=".len()..],
        _ => bail!("usage: cargo xtask fetch-pjrt [--plugin cpu|cuda] (got {args:?})"),
    };
    Plugin::ALL
        .into_iter()
        .find(|plugin| plugin.pin().name == name)
        .with_context(|| format!("unknown PJRT plugin '{name}'; known: cpu, cuda"))
}

/// Installs `plugin` under `root` unless a checked copy is there; returns its path.
pub(crate) fn install(root: &Path, plugin: Plugin) -> Result<PathBuf> {
    let pin = plugin.pin();
    let destination = plugin.install_path(root);
    if destination.is_file() && sha256_file(&destination)? == pin.plugin_sha256 {
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

fn download_and_install(root: &Path, pin: &Pin, scratch: &Path, destination: &Path) -> Result<()> {
    wheel::require_platform("fetch-pjrt", "elsewhere set PJRT_PLUGIN to a plugin .so")?;
    let wheel = wheel::download(root, &pin.wheel, scratch, "fetch-pjrt")?;
    wheel::extract(&wheel, &[pin.member], scratch)?;
    let unpacked = scratch.join(pin.member);
    wheel::check_sha256(&unpacked, pin.plugin_sha256, "fetch-pjrt")?;
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
        let root = crate::workspace_root();
        let plugin_rs = fs::read_to_string(root.join("crates/pjrt/src/plugin.rs")).unwrap();
        assert!(
            plugin_rs.contains(&format!("\"{INSTALL_PATH}\"")),
            "crates/pjrt/src/plugin.rs must name {INSTALL_PATH}"
        );
    }

    #[test]
    fn the_plugin_argument_picks_cpu_or_cuda() {
        let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(parse_args(&[]).unwrap(), Plugin::Cpu);
        assert_eq!(
            parse_args(&args(&["--plugin", "cpu"])).unwrap(),
            Plugin::Cpu
        );
        assert_eq!(
            parse_args(&args(&["--plugin", "cuda"])).unwrap(),
            Plugin::Cuda
        );
        assert_eq!(parse_args(&args(&["--plugin=cuda"])).unwrap(), Plugin::Cuda);
        let err = parse_args(&args(&["--plugin", "tpu"])).unwrap_err();
        assert!(
            err.to_string().contains("unknown PJRT plugin 'tpu'"),
            "{err}"
        );
        let err = parse_args(&args(&["cuda"])).unwrap_err();
        assert!(
            err.to_string().contains("usage: cargo xtask fetch-pjrt"),
            "{err}"
        );
    }

    #[test]
    fn every_pin_is_complete_and_installs_under_target_pjrt() {
        let root = Path::new("/w");
        for plugin in Plugin::ALL {
            let pin = plugin.pin();
            wheel::tests::assert_pin_is_complete(&pin.wheel);
            let sum = pin.plugin_sha256;
            assert!(
                sum.len() == 64 && sum.bytes().all(|b| b.is_ascii_hexdigit()),
                "{sum}"
            );
            let path = plugin.install_path(root);
            assert!(path.starts_with("/w/target/pjrt/"), "{}", path.display());
            assert_eq!(path.file_name(), Path::new(pin.member).file_name());
        }
    }
}
