//! `cargo xtask test [CARGO-TEST-ARGS...]`: every test of the workspace, and `cargo xtask
//! test-mpi [CARGO-TEST-ARGS...]`, its part with the `mpi` feature on.
//!
//! `test` runs the workspace's tests (all targets, then the doc tests, which `--all-targets`
//! leaves out) without the packages that need MPI or CUDA to build, then the downstream crate on
//! `distribute-device-spec` alone, then [`test_mpi`] and the downstream crate trained on 2
//! workers through `cargo distribute` ([`crate::downstream`]), then the GPU suite that needs only
//! NVRTC, then the GPU bundle's dry run ([`crate::test_gpu`]).
//! `test_mpi` runs every test of the packages that build with MPI, with the feature on where
//! they have it (their multi-process tests start `mpirun` themselves, with 2, 3 and 4
//! processes).

use anyhow::{Result, bail};

use crate::cargo::{cargo, cargo_env, metadata, workspace_root};
use crate::downstream;
use crate::mpirun::{env_refs, resolve};
use crate::packages::{MpiPackages, plain_build_excludes};
use crate::provision::pjrt;
use crate::test_gpu;

/// Run every test of the workspace
///
/// Every test of the workspace (unit, integration, property and snapshot tests, the benches in
/// test mode, doc tests, the tidy tests), then again those of the packages that build with MPI,
/// with their `mpi` feature on (as test-mpi does; DISTRIBUTE_SKIP_MPI=1 skips them where no MPI
/// can be had), the crates outside the workspace built as a user builds them (see
/// test-downstream), then the GPU suite that needs only NVRTC (collectives-nvrtc, with fetch-nvrtc's
/// NVRTC), then the GPU bundle's dry run (every GPU suite built and run by its run.sh without a
/// GPU: the NVRTC and TpuStrategy suites on the CPU plugin pass, the GPU suites fail with the
/// typed no-GPU error). Installs the PJRT plugins (as fetch-pjrt does) first.
#[derive(clap::Args)]
pub(crate) struct TestArgs {
    /// Arguments for the test binaries (`--nocapture`, a test name, …); with any, the GPU
    /// bundle's dry run is skipped
    #[arg(
        value_name = "CARGO-TEST-ARGS",
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub(crate) args: Vec<String>,
}

/// Run the tests of the packages that build with MPI, with the feature `mpi` on
///
/// Every test of the packages that have an `mpi` feature (with it on) or need MPI whatever their
/// features, doc tests included; their multi-process tests start mpirun with 2, 3 and 4
/// processes. Against the MPI that DISTRIBUTE_MPI chooses (see `cargo xtask --help`).
#[derive(clap::Args)]
pub(crate) struct TestMpiArgs {
    /// Arguments for the test binaries
    #[arg(
        value_name = "CARGO-TEST-ARGS",
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub(crate) args: Vec<String>,
}

/// Runs every test of the workspace. Doc tests need their own invocation because
/// `--all-targets` leaves them out. Then the GPU suite that needs only NVRTC, with the pinned
/// NVRTC: the other GPU suites are `test-gpu`'s.
pub(crate) fn test(extra: &[String]) -> Result<()> {
    let root = workspace_root();
    pjrt::install(&root, pjrt::Plugin::Cpu)?;
    // The pjrt crate's cuda_plugin test checks create options against JAX's CUDA plugin.
    pjrt::install(&root, pjrt::Plugin::Cuda)?;
    let excludes = plain_build_excludes()?;
    let excludes: Vec<&str> = excludes.iter().map(String::as_str).collect();
    let mut all_targets = vec!["test", "--workspace", "--all-targets"];
    let mut doc = vec!["test", "--workspace", "--doc"];
    all_targets.extend(&excludes);
    doc.extend(&excludes);
    if !extra.is_empty() {
        all_targets.push("--");
        doc.push("--");
        all_targets.extend(extra.iter().map(String::as_str));
        doc.extend(extra.iter().map(String::as_str));
    }
    cargo("tests", &all_targets)?;
    cargo("doc tests", &doc)?;
    // The crates outside the workspace: only for a whole run, not a filtered one.
    if extra.is_empty() {
        downstream::spec_only(&root)?;
    }
    if test_mpi(extra)? && extra.is_empty() {
        downstream::training(&root)?;
    }
    test_gpu::test_nvrtc(&root, extra)?;
    if extra.is_empty() {
        test_gpu::dry_run(&root)?;
    }
    Ok(())
}

/// `cargo test` arguments for `packages` with `mpi` on: every target, or the doc tests.
fn test_args(packages: &MpiPackages, doc: bool, extra: &[String]) -> Vec<String> {
    let mut args = vec!["test".to_owned()];
    args.extend(packages.cargo_args());
    args.push(if doc { "--doc" } else { "--all-targets" }.to_owned());
    if !extra.is_empty() {
        args.push("--".to_owned());
        args.extend(extra.iter().cloned());
    }
    args
}

/// `cargo xtask test`'s part with the `mpi` feature: every test of the packages that have it,
/// doc tests included. An error when no MPI can be had, unless `DISTRIBUTE_SKIP_MPI=1` (then a
/// warning). Whether the tests ran.
pub(crate) fn test_mpi(extra: &[String]) -> Result<bool> {
    let metadata = metadata()?;
    let packages = MpiPackages::of(&metadata);
    if packages.is_empty() {
        eprintln!("xtask: tests (feature mpi): no package builds with MPI; nothing to run");
        return Ok(false);
    }
    let mpi = match resolve(&metadata) {
        Ok(mpi) => mpi,
        Err(err) => {
            let message = format!(
                "testing {} with the `mpi` feature: {err:#}",
                packages.all().join(", ")
            );
            if std::env::var_os("DISTRIBUTE_SKIP_MPI").is_some_and(|v| v == "1") {
                eprintln!(
                    "xtask: WARNING: SKIPPING the mpi tests (DISTRIBUTE_SKIP_MPI=1): {message}"
                );
                return Ok(false);
            }
            bail!("{message} (or set DISTRIBUTE_SKIP_MPI=1 to skip these tests)");
        }
    };
    let env = mpi.oversubscribed_env();
    let env = env_refs(&env);
    for doc in [false, true] {
        let args = test_args(&packages, doc, extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let what = if doc {
            "doc tests (feature mpi)"
        } else {
            "tests (feature mpi)"
        };
        cargo_env(what, &args, &env)?;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Command, parse};

    #[test]
    fn test_and_test_mpi_pass_every_argument_to_the_test_binaries() {
        for (args, expected) in [
            (&["test"][..], &[][..]),
            (&["test", "--nocapture"], &["--nocapture"]),
            (
                &["test", "ring", "--exact", "--nocapture"],
                &["ring", "--exact", "--nocapture"],
            ),
            (&["test", "--", "--nocapture"], &["--nocapture"]),
            (&["test-mpi", "--test-threads=1"], &["--test-threads=1"]),
        ] {
            let given = match parse(args).unwrap() {
                Command::Test(TestArgs { args }) | Command::TestMpi(TestMpiArgs { args }) => args,
                _ => panic!("{args:?} is no test command"),
            };
            assert_eq!(given, expected, "{args:?}");
        }
    }

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn tests_name_every_mpi_package_and_the_feature_where_it_exists() {
        let packages = MpiPackages {
            featured: strings(&["distribute", "distribute-mirrored"]),
            only: strings(&["distribute-mpi"]),
        };
        assert_eq!(
            test_args(&packages, false, &strings(&["--nocapture"])).join(" "),
            "test --package distribute --package distribute-mirrored --package distribute-mpi \
             --features distribute/mpi,distribute-mirrored/mpi --all-targets -- --nocapture"
        );
        assert!(test_args(&packages, true, &[]).join(" ").ends_with("--doc"));
    }
}
