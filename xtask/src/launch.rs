//! `cargo xtask launch [--restarts K] -n W EXAMPLE [-- ARGS...]`: builds an example in release
//! with the `mpi` feature and runs it as W worker processes under `mpirun` ([`crate::mpirun`]),
//! each job with a fresh random cluster key; `--restarts K` starts a failed job again with the
//! same arguments up to K times.

use anyhow::{Context, Result, bail};

use crate::cargo::metadata;
use crate::mpirun::{build_release, cores, mpirun, mpirun_args, resolve};
use crate::packages::{package_of_example, require_feature};

/// `cargo xtask launch`'s arguments.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Launch {
    /// Processes to start (`-n`).
    pub(crate) workers: usize,
    /// The example to run.
    pub(crate) example: String,
    /// Arguments for every process of the example.
    pub(crate) args: Vec<String>,
    /// How many times the whole job is started again after it fails (`--restarts K`).
    pub(crate) restarts: usize,
}

pub(crate) const LAUNCH_USAGE: &str =
    "usage: cargo xtask launch [--restarts K] -n W EXAMPLE [-- ARGS...]";

impl Launch {
    /// Parses `[--restarts K] -n W EXAMPLE [-- ARGS…]` (also `-nW`, `-n=W`, `--np W`,
    /// `--restarts=K`, and the options after the example).
    pub(crate) fn parse(args: &[String]) -> Result<Launch> {
        let mut workers = None;
        let mut example = None;
        let mut restarts = None;
        let mut rest = Vec::new();
        let mut iter = args.iter();
        while let Some(arg) = iter.next() {
            let restart_count = match arg.as_str() {
                "--restarts" => Some(
                    iter.next()
                        .with_context(|| format!("--restarts needs a count; {LAUNCH_USAGE}"))?
                        .as_str(),
                ),
                other => other.strip_prefix("--restarts="),
            };
            if let Some(count) = restart_count {
                let k: usize = count.parse().ok().with_context(|| {
                    format!("--restarts needs a whole number, not '{count}'; {LAUNCH_USAGE}")
                })?;
                if restarts.replace(k).is_some() {
                    bail!("--restarts is given twice; {LAUNCH_USAGE}");
                }
                continue;
            }
            let count = match arg.as_str() {
                "--" => {
                    rest.extend(iter.by_ref().cloned());
                    break;
                }
                "-n" | "--np" => Some(
                    iter.next()
                        .with_context(|| format!("{arg} needs a process count; {LAUNCH_USAGE}"))?
                        .as_str(),
                ),
                other => other
                    .strip_prefix("-n=")
                    .or_else(|| other.strip_prefix("--np="))
                    .or_else(|| other.strip_prefix("-n").filter(|n| !n.is_empty())),
            };
            if let Some(count) = count {
                if workers.is_some() {
                    bail!("the process count is given twice; {LAUNCH_USAGE}");
                }
                let n: usize = count.parse().ok().filter(|&n| n > 0).with_context(|| {
                    format!("the process count must be a positive integer, not '{count}'")
                })?;
                workers = Some(n);
            } else if arg.starts_with('-') {
                bail!(
                    "unknown option '{arg}' (the example's own options go after `--`); {LAUNCH_USAGE}"
                );
            } else if example.replace(arg.clone()).is_some() {
                bail!("more than one example named ('{arg}'); {LAUNCH_USAGE}");
            }
        }
        Ok(Launch {
            workers: workers
                .with_context(|| format!("how many processes? give -n W; {LAUNCH_USAGE}"))?,
            example: example.with_context(|| format!("which example? {LAUNCH_USAGE}"))?,
            args: rest,
            restarts: restarts.unwrap_or(0),
        })
    }
}

/// `cargo xtask launch -n W EXAMPLE [-- ARGS…]`.
pub(crate) fn launch(args: &[String]) -> Result<()> {
    let launch = Launch::parse(args)?;
    let metadata = metadata()?;
    let package = package_of_example(&metadata, &launch.example)?;
    require_feature(&metadata, &package, &launch.example)?;
    let mpi = resolve(&metadata)?;
    let exe = build_release(&metadata, &mpi, &package, "--example", &launch.example)?;
    let args = mpirun_args(launch.workers, cores(), &exe, &launch.args);
    let what = format!("launch {}", launch.example);
    with_restarts(launch.restarts, &what, |attempt| {
        if attempt > 0 {
            eprintln!(
                "xtask: {what}: restart {attempt} of {}: the job starts again with the same \
                 arguments (an example given --checkpoint-dir resumes from its newest good \
                 checkpoint)",
                launch.restarts
            );
        }
        mpirun(&mpi, &what, &args)
    })
}

/// Runs `attempt(0)`, and after a failure `attempt(1)`, … up to `restarts` more times; the last
/// failure is the error, naming how many attempts failed.
pub(crate) fn with_restarts(
    restarts: usize,
    what: &str,
    mut attempt: impl FnMut(usize) -> Result<()>,
) -> Result<()> {
    let mut last = None;
    for n in 0..=restarts {
        match attempt(n) {
            Ok(()) => return Ok(()),
            Err(e) => {
                eprintln!(
                    "xtask: {what}: attempt {} of {} failed: {e:#}",
                    n + 1,
                    restarts + 1
                );
                last = Some(e);
            }
        }
    }
    let error = last.expect("at least one attempt ran");
    Err(error.context(format!(
        "{what}: all {} attempts failed (--restarts {restarts})",
        restarts + 1
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| (*s).to_owned()).collect()
    }

    fn parse(args: &[&str]) -> Result<Launch> {
        Launch::parse(&strings(args))
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
            (&["--restarts", "-1", "-n", "2", "x"][..], "whole number"),
            (&["--restarts"][..], "needs a count"),
            (
                &["--restarts", "1", "--restarts=2", "-n", "2", "x"][..],
                "given twice",
            ),
        ] {
            let error = parse(form).unwrap_err().to_string();
            assert!(error.contains(expected), "{form:?}: {error}");
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
        let expected = Launch {
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
        for (args, says) in [
            (&["linear_regression"][..], "give -n W"),
            (&["-n", "2"], "which example"),
            (&["-n"], "-n needs a process count"),
            (&["-n", "0", "x"], "positive integer, not '0'"),
            (&["-n", "two", "x"], "positive integer, not 'two'"),
            (&["-n", "2", "-n", "3", "x"], "given twice"),
            (&["-n", "2", "x", "y"], "more than one example"),
            (&["-n", "2", "x", "--json"], "unknown option '--json'"),
        ] {
            let err = parse(args).unwrap_err().to_string();
            assert!(err.contains(says), "{args:?}: {err}");
            assert!(
                err.contains("usage") || says.contains("positive"),
                "{args:?}: {err}"
            );
        }
    }
}
