//! Running cargo in the workspace this xtask serves: where the workspace is, each cargo command
//! echoed with its duration, and `cargo metadata` of the workspace's own packages.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// Runs `cargo ARGS` from the workspace root, echoing the command and its duration.
pub(crate) fn cargo(what: &str, args: &[&str]) -> Result<()> {
    cargo_env(what, args, &[])
}

/// [`cargo`] with environment variables `env` set for cargo and what it runs.
pub(crate) fn cargo_env(what: &str, args: &[&str], env: &[(&str, &OsStr)]) -> Result<()> {
    let cargo = cargo_program();
    eprintln!("xtask: {what}: cargo {}", args.join(" "));
    let start = Instant::now();
    let status = Command::new(&cargo)
        .args(args)
        .envs(env.iter().copied())
        .current_dir(workspace_root())
        .status()
        .with_context(|| format!("could not start `{cargo}`"))?;
    eprintln!("xtask: {what}: {:.1} s", start.elapsed().as_secs_f64());
    if !status.success() {
        bail!(
            "{what} failed: `cargo {}` exited with {status}",
            args.join(" ")
        );
    }
    Ok(())
}

/// The cargo that runs xtask (`$CARGO`), else `cargo` from `PATH`.
pub(crate) fn cargo_program() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned())
}

/// `cargo metadata` of the workspace's own packages.
pub(crate) fn metadata() -> Result<Value> {
    let output = Command::new(cargo_program())
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .current_dir(workspace_root())
        .output()
        .context("could not run `cargo metadata`")?;
    if !output.status.success() {
        bail!(
            "`cargo metadata` failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    serde_json::from_slice(&output.stdout).context("`cargo metadata` printed invalid JSON")
}

/// Cargo's target folder, from `cargo metadata`.
pub(crate) fn target_directory(metadata: &Value) -> Result<PathBuf> {
    metadata["target_directory"]
        .as_str()
        .map(PathBuf::from)
        .context("`cargo metadata` gave no target directory")
}

/// The workspace this run of xtask serves, found at run time: `cargo xtask` (`cargo run`) sets
/// `CARGO_MANIFEST_DIR` to the xtask folder of the checkout it runs in. The folder xtask was
/// compiled in is only the last resort: with one `CARGO_TARGET_DIR` shared by two checkouts,
/// the binary cargo runs may have been built from the other one.
pub(crate) fn workspace_root() -> PathBuf {
    root_of(
        std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from),
        Path::new(env!("CARGO_MANIFEST_DIR")),
    )
}

/// The workspace root above the xtask folder `at_run_time` (when cargo gave one), else above
/// `compiled`.
fn root_of(at_run_time: Option<PathBuf>, compiled: &Path) -> PathBuf {
    let xtask = at_run_time
        .filter(|dir| dir.join("Cargo.toml").is_file())
        .unwrap_or_else(|| compiled.to_path_buf());
    xtask
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workspace_is_the_checkout_cargo_runs_xtask_in() {
        let compiled = Path::new(env!("CARGO_MANIFEST_DIR"));
        let other = tempfile::tempdir().unwrap();
        let other_xtask = other.path().join("xtask");
        std::fs::create_dir(&other_xtask).unwrap();
        std::fs::write(other_xtask.join("Cargo.toml"), "[package]\n").unwrap();
        // Another checkout's xtask folder, as cargo run sets it, wins over the compiled one.
        assert_eq!(root_of(Some(other_xtask), compiled), other.path());
        // Without one (or a folder that is not a package) the compiled folder decides.
        let compiled_root = compiled.parent().unwrap();
        assert_eq!(root_of(None, compiled), compiled_root);
        let not_a_package = other.path().join("nothing");
        assert_eq!(root_of(Some(not_a_package), compiled), compiled_root);
    }
}
