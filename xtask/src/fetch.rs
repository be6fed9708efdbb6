//! `cargo xtask fetch-pjrt [--plugin cpu|cuda]` and `cargo xtask fetch-nvrtc`: install a pinned
//! PJRT plugin or NVRTC under `target/` ([`crate::provision::pjrt`],
//! [`crate::provision::nvrtc`]); `cargo xtask test` installs both itself.

use std::path::Path;

use anyhow::{Context, Result, bail};

use crate::provision::{
    nvrtc,
    pjrt::{self, Plugin},
};

/// `fetch-pjrt [--plugin cpu|cuda]`: installs the plugin under `root` unless a checked copy is
/// already there.
pub(crate) fn fetch_pjrt(root: &Path, args: &[String]) -> Result<()> {
    pjrt::install(root, parse_args(args)?).map(drop)
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
        .find(|plugin| plugin.name() == name)
        .with_context(|| format!("unknown PJRT plugin '{name}'; known: cpu, cuda"))
}

/// `cargo xtask fetch-nvrtc`: installs NVRTC and prints the folder to put on `LD_LIBRARY_PATH`.
pub(crate) fn fetch_nvrtc(root: &Path, args: &[String]) -> Result<()> {
    if !args.is_empty() {
        bail!("`cargo xtask fetch-nvrtc` takes no arguments (got {args:?})");
    }
    let lib_dir = nvrtc::fetch(root)?;
    println!("{}", lib_dir.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
