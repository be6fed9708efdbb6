//! `cargo xtask launch [--restarts K] -n W EXAMPLE [-- ARGS...]`: builds an example in release
//! with the `mpi` feature and runs it as W worker processes under `mpirun` ([`crate::mpirun`]),
//! each job with a fresh random cluster key; `--restarts K` starts a failed job again with the
//! same arguments up to K times.

use anyhow::Result;

use crate::cargo::metadata;
use crate::mpirun::{build_release, cores, mpirun, mpirun_args, resolve};
use crate::packages::{package_of_example, require_feature};

/// Build an example with the feature mpi and run it as W worker processes under mpirun
///
/// Builds EXAMPLE in release with the mpi feature and runs it as W worker processes under
/// mpirun (--oversubscribe past the cores; allowed as root), each job with a fresh random
/// cluster key in DISTRIBUTE_CLUSTER_KEY (unless set). An example given --checkpoint-dir DIR
/// resumes from its newest good checkpoint when --restarts starts it again.
#[derive(clap::Args, Debug, PartialEq, Eq)]
pub(crate) struct Args {
    /// Processes to start
    #[arg(short = 'n', long = "np", value_name = "W", value_parser = positive)]
    pub(crate) workers: usize,
    /// The example to run (of a workspace package with the feature mpi)
    pub(crate) example: String,
    /// Arguments for every process of the example
    #[arg(last = true, value_name = "ARGS")]
    pub(crate) args: Vec<String>,
    /// Start a failed job again with the same arguments up to K times
    #[arg(long, value_name = "K", default_value_t = 0)]
    pub(crate) restarts: usize,
}

/// A process count: a whole number above zero.
fn positive(count: &str) -> Result<usize, String> {
    count
        .parse()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| "the process count must be a positive integer".to_owned())
}

/// `cargo xtask launch -n W EXAMPLE [-- ARGS…]`.
pub(crate) fn launch(launch: &Args) -> Result<()> {
    let metadata = metadata()?;
    let package = package_of_example(&metadata, &launch.example)?;
    require_feature(&metadata, &package, &launch.example)?;
    let mpi = resolve(&metadata)?;
    let exe = build_release(&metadata, &mpi, &package, "--example", &launch.example)?;
    let args = mpirun_args(launch.workers, cores(), &exe, &launch.args);
    let what = format!("launch {}", launch.example);
    with_restarts(launch.restarts, &what, |_| mpirun(&mpi, &what, &args))
}

/// Runs `attempt(0)`, and after a failure `attempt(1)`, … up to `restarts` more times
/// (`distribute-launch`'s restarts, as `cargo distribute run` makes them); the last failure is
/// the error, naming how many attempts failed.
pub(crate) fn with_restarts(
    restarts: usize,
    what: &str,
    attempt: impl FnMut(usize) -> Result<()>,
) -> Result<()> {
    distribute_launch::job::with_restarts(restarts, "xtask", what, attempt).map_err(|error| {
        error.context(format!(
            "{what}: all {} attempts failed (--restarts {restarts})",
            restarts + 1
        ))
    })
}

#[cfg(test)]
mod tests {
    use anyhow::bail;
    use clap::error::ErrorKind;

    use super::*;
    use crate::Command;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| (*s).to_owned()).collect()
    }

    /// `cargo xtask launch ARGS…`, parsed.
    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        let command: Vec<&str> = ["launch"].iter().chain(args).copied().collect();
        crate::parse(&command).map(|command| match command {
            Command::Launch(args) => args,
            _ => panic!("{args:?} is not launch's"),
        })
    }

    #[test]
    fn launch_takes_a_restart_count() {
        for form in [
            &["--restarts", "2", "-n", "2", "linear_regression"][..],
            &["-n", "2", "--restarts=2", "linear_regression"],
            &["-n", "2", "linear_regression", "--restarts", "2"],
        ] {
            assert_eq!(parse(form).unwrap().restarts, 2, "{form:?}");
        }
        assert_eq!(parse(&["-n", "2", "x"]).unwrap().restarts, 0);
        // After `--` it is the example's.
        let theirs = parse(&["-n", "2", "x", "--", "--restarts", "3"]).unwrap();
        assert_eq!((theirs.restarts, theirs.args.len()), (0, 2));
        for (form, expected) in [
            (
                &["--restarts=-1", "-n", "2", "x"][..],
                ErrorKind::ValueValidation,
            ),
            (&["--restarts", "-n", "2", "x"], ErrorKind::InvalidValue),
            (&["-n", "2", "x", "--restarts"], ErrorKind::InvalidValue),
            (
                &["--restarts", "1", "--restarts=2", "-n", "2", "x"],
                ErrorKind::ArgumentConflict,
            ),
        ] {
            let error = parse(form).unwrap_err();
            assert_eq!(error.kind(), expected, "{form:?}: {error}");
        }
    }

    #[test]
    fn a_job_is_started_again_until_it_succeeds_or_the_restarts_run_out() {
        let mut attempts = Vec::new();
        let result = with_restarts(3, "job", |n| {
            attempts.push(n);
            if n < 2 {
                bail!("worker 1 died")
            } else {
                Ok(())
            }
        });
        assert!(result.is_ok());
        assert_eq!(attempts, [0, 1, 2]);
        let mut tried = 0;
        let error = with_restarts(1, "job", |_| {
            tried += 1;
            bail!("worker 1 died")
        })
        .unwrap_err();
        assert_eq!(tried, 2);
        let text = format!("{error:#}");
        assert!(
            text.contains("all 2 attempts failed (--restarts 1)"),
            "{text}"
        );
        assert!(text.contains("worker 1 died"), "{text}");
    }

    #[test]
    fn launch_takes_the_count_the_example_and_its_arguments() {
        let expected = Args {
            workers: 2,
            example: "linear_regression".to_owned(),
            args: strings(&["--replicas", "2", "--json"]),
            restarts: 0,
        };
        for form in [
            &[
                "-n",
                "2",
                "linear_regression",
                "--",
                "--replicas",
                "2",
                "--json",
            ][..],
            &[
                "-n2",
                "linear_regression",
                "--",
                "--replicas",
                "2",
                "--json",
            ],
            &[
                "-n=2",
                "linear_regression",
                "--",
                "--replicas",
                "2",
                "--json",
            ],
            &[
                "--np",
                "2",
                "linear_regression",
                "--",
                "--replicas",
                "2",
                "--json",
            ],
            &[
                "linear_regression",
                "-n",
                "2",
                "--",
                "--replicas",
                "2",
                "--json",
            ],
        ] {
            assert_eq!(parse(form).unwrap(), expected, "{form:?}");
        }
        let bare = parse(&["-n", "3", "linear_regression"]).unwrap();
        assert_eq!((bare.workers, bare.args.len()), (3, 0));
        // After `--` everything is the example's, even `-n`.
        assert_eq!(
            parse(&["-n", "2", "x", "--", "-n", "5"]).unwrap().args,
            ["-n", "5"]
        );
    }

    #[test]
    fn launch_rejects_bad_arguments_with_the_usage() {
        for (args, kind, says) in [
            (
                &["linear_regression"][..],
                ErrorKind::MissingRequiredArgument,
                "--np <W>",
            ),
            (
                &["-n", "2"],
                ErrorKind::MissingRequiredArgument,
                "<EXAMPLE>",
            ),
            (&["-n"], ErrorKind::InvalidValue, "'--np <W>'"),
            (
                &["-n", "0", "x"],
                ErrorKind::ValueValidation,
                "invalid value '0' for '--np <W>': the process count must be a positive integer",
            ),
            (&["-n", "two", "x"], ErrorKind::ValueValidation, "'two'"),
            (
                &["-n", "2", "-n", "3", "x"],
                ErrorKind::ArgumentConflict,
                "cannot be used multiple times",
            ),
            (&["-n", "2", "x", "y"], ErrorKind::UnknownArgument, "'y'"),
            (
                &["-n", "2", "x", "--json"],
                ErrorKind::UnknownArgument,
                "to pass '--json' as a value, use '-- --json'",
            ),
        ] {
            let err = parse(args).unwrap_err();
            assert_eq!(err.kind(), kind, "{args:?}: {err}");
            let text = err.to_string();
            assert!(text.contains(says), "{args:?}: {text}");
            // clap shows the usage with every error but a bad value, which it names.
            let bad_value = matches!(kind, ErrorKind::InvalidValue | ErrorKind::ValueValidation);
            assert!(
                bad_value || text.contains("Usage: cargo xtask launch"),
                "{args:?}: {text}"
            );
        }
    }
}
