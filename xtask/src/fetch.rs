//! `cargo xtask fetch-pjrt [--plugin cpu|cuda]` and `cargo xtask fetch-nvrtc`: install a pinned
//! PJRT plugin or NVRTC under `target/` ([`crate::provision::pjrt`],
//! [`crate::provision::nvrtc`]); `cargo xtask test` installs them itself.

use anyhow::Result;
use clap::ValueEnum;
use clap::builder::PossibleValue;

use crate::cargo::workspace_root;
use crate::provision::{
    nvrtc,
    pjrt::{self, Plugin},
};

/// Install a pinned PJRT plugin under target/pjrt/
///
/// Downloads the plugin's wheel with curl or wget from PyPI (a wheel put in target/wheels/ is
/// used instead), checks the wheel's and the plugin's SHA-256 and installs the plugin; a no-op
/// when it is installed. `test` installs both plugins (the CUDA one for its create-option
/// checks, which need no GPU). PJRT_PLUGIN=/path/to/plugin.so makes tests and programs use
/// another plugin.
#[derive(clap::Args)]
pub(crate) struct FetchPjrtArgs {
    /// The plugin: `cpu` (lammps-jax-pjrt-cpu==0.11.2), or `cuda`, JAX's CUDA 13 plugin
    /// (jax-cuda13-pjrt==0.11.2, a 134 MB wheel)
    #[arg(long, value_name = "PLUGIN", default_value = "cpu")]
    plugin: Plugin,
}

impl ValueEnum for Plugin {
    fn value_variants<'a>() -> &'a [Self] {
        &Plugin::ALL
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(PossibleValue::new(self.name()))
    }
}

/// Install the pinned NVRTC under target/nvrtc/ and print its lib folder
///
/// Installs NVRTC from the pinned nvidia-cuda-nvrtc==13.0.88 wheel (curl or wget, SHA-256
/// checked; a no-op when installed; a wheel put in target/wheels/ is used instead of
/// downloading it). `test` uses it to compile the CUDA kernels to PTX without a GPU.
#[derive(clap::Args)]
pub(crate) struct FetchNvrtcArgs {}

/// `fetch-pjrt`: installs the plugin unless a checked copy is already there.
pub(crate) fn fetch_pjrt(args: &FetchPjrtArgs) -> Result<()> {
    pjrt::install(&workspace_root(), args.plugin).map(drop)
}

/// `fetch-nvrtc`: installs NVRTC and prints the folder to put on `LD_LIBRARY_PATH`.
pub(crate) fn fetch_nvrtc() -> Result<()> {
    let lib_dir = nvrtc::fetch(&workspace_root())?;
    println!("{}", lib_dir.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::error::ErrorKind;

    use super::*;
    use crate::{Command, parse};

    #[test]
    fn the_plugin_argument_picks_cpu_or_cuda() {
        let plugin = |args: &[&str]| match parse(args) {
            Ok(Command::FetchPjrt(args)) => Ok(args.plugin),
            Ok(_) => panic!("{args:?} is not fetch-pjrt"),
            Err(err) => Err(err),
        };
        assert_eq!(plugin(&["fetch-pjrt"]).unwrap(), Plugin::Cpu);
        for (args, expected) in [
            (&["fetch-pjrt", "--plugin", "cpu"][..], Plugin::Cpu),
            (&["fetch-pjrt", "--plugin", "cuda"], Plugin::Cuda),
            (&["fetch-pjrt", "--plugin=cuda"], Plugin::Cuda),
        ] {
            assert_eq!(plugin(args).unwrap(), expected, "{args:?}");
        }
        let err = plugin(&["fetch-pjrt", "--plugin", "tpu"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidValue);
        let text = err.to_string();
        assert!(
            text.contains("'tpu'") && text.contains("[possible values: cpu, cuda]"),
            "{text}"
        );
        let err = plugin(&["fetch-pjrt", "cuda"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::UnknownArgument);
        assert!(
            err.to_string().contains("Usage: cargo xtask fetch-pjrt"),
            "{err}"
        );
    }

    #[test]
    fn fetch_nvrtc_takes_no_arguments() {
        let Err(err) = parse(&["fetch-nvrtc", "now"]) else {
            panic!("fetch-nvrtc took an argument");
        };
        assert_eq!(err.kind(), ErrorKind::UnknownArgument);
    }
}
