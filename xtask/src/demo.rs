//! `cargo xtask demo [DEMO-ARGS...]`: the training demo (the `demo` binary of `examples/demo`)
//! in release, with the arguments as they are; with `--workers W`, as W worker processes under
//! `mpirun` ([`crate::mpirun`]), each with one replica unless the arguments say.

use anyhow::{Context, Result, bail};

use crate::cargo::{cargo, metadata};
use crate::mpirun::{build_release, cores, mpirun, mpirun_args, resolve};
use crate::packages::require_feature;

/// Train the demo's classifier data-parallel (release build)
///
/// The end-to-end training demo (the `demo` binary of examples/demo): an MLP trained on the
/// wine-quality data data-parallel, checked against one replica; with --model gpt, a small
/// byte-level GPT trained on this project's documentation (held-out loss and perplexity, a
/// sample, the same check against one replica). Every argument goes to the
/// demo: `cargo xtask demo --help` lists its options (`cargo xtask help demo` shows this). With
/// --workers W it trains on W worker processes under mpirun (feature mpi; --replicas R each,
/// one by default), checked against one process with one replica.
#[derive(clap::Args)]
#[command(disable_help_flag = true)]
pub(crate) struct Args {
    /// The demo's arguments, and --workers W
    #[arg(
        value_name = "DEMO-ARGS",
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub(crate) args: Vec<String>,
}

/// Runs the training demo (the `demo` binary of `examples/demo`) in release, with `args`; with
/// `--workers W`, as W worker processes under mpirun.
pub(crate) fn demo(args: &[String]) -> Result<()> {
    let (workers, args) = take_workers(args)?;
    if let Some(workers) = workers {
        return demo_workers(workers, &args);
    }
    let mut cargo_args = vec![
        "run",
        "--release",
        "--package",
        "distribute-demo",
        "--bin",
        "demo",
        "--",
    ];
    cargo_args.extend(args.iter().map(String::as_str));
    cargo("demo", &cargo_args)
}

/// Takes `--workers N` (or `--workers=N`) out of the demo's arguments: the worker count, if
/// given, and the arguments left for the demo itself.
fn take_workers(args: &[String]) -> Result<(Option<usize>, Vec<String>)> {
    let mut workers = None;
    let mut rest = Vec::new();
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let value = match arg.strip_prefix("--workers") {
            Some("") => Some(
                iter.next()
                    .context("--workers needs a number of worker processes")?
                    .as_str(),
            ),
            Some(eq) if eq.starts_with('=') => Some(&eq[1..]),
            _ => None,
        };
        match value {
            Some(value) => {
                let n: usize = value.parse().ok().filter(|&n| n > 0).with_context(|| {
                    format!("--workers must be a positive integer, not '{value}'")
                })?;
                if workers.replace(n).is_some() {
                    bail!("--workers is given twice");
                }
            }
            None => rest.push(arg.clone()),
        }
    }
    Ok((workers, rest))
}

/// `cargo xtask demo --workers W [DEMO-ARGS…]`: the demo binary, built in release with `mpi`,
/// as `W` worker processes under `mpirun`, each with one replica unless the arguments say.
fn demo_workers(workers: usize, args: &[String]) -> Result<()> {
    let metadata = metadata()?;
    require_feature(&metadata, "distribute-demo", "demo")?;
    let mpi = resolve(&metadata)?;
    let exe = build_release(&metadata, &mpi, "distribute-demo", "--bin", "demo")?;
    mpirun(
        &mpi,
        &format!("demo ({workers} workers)"),
        &mpirun_args(workers, cores(), &exe, &one_replica_by_default(args)),
    )
}

/// The demo's arguments with `--replicas 1` first unless they choose the replicas: a worker
/// of a multi-worker demo has one replica by default (one process alone has two).
fn one_replica_by_default(args: &[String]) -> Vec<String> {
    let chosen = args
        .iter()
        .any(|a| a.starts_with("--replicas") || a.starts_with("--devices"));
    let default = (!chosen).then(|| ["--replicas".to_owned(), "1".to_owned()]);
    default
        .into_iter()
        .flatten()
        .chain(args.iter().cloned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Command, parse};

    #[test]
    fn the_demo_gets_every_argument_even_help() {
        for args in [
            &["--help"][..],
            &["-h"],
            &["--workers", "2", "--steps", "9"],
            &["--framework", "native", "--", "x"],
        ] {
            let command: Vec<&str> = ["demo"].iter().chain(args).copied().collect();
            let Ok(Command::Demo(given)) = parse(&command) else {
                panic!("{command:?} is not the demo's");
            };
            assert_eq!(given.args, args, "{command:?}");
        }
    }

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_demo_gives_up_its_worker_count() {
        let (workers, rest) = take_workers(&strings(&[
            "--workers",
            "2",
            "--replicas",
            "2",
            "--steps",
            "9",
        ]))
        .unwrap();
        assert_eq!(
            (workers, &rest),
            (Some(2), &strings(&["--replicas", "2", "--steps", "9"]))
        );
        assert_eq!(
            one_replica_by_default(&strings(&["--steps", "9"])),
            ["--replicas", "1", "--steps", "9"]
        );
        assert_eq!(one_replica_by_default(&rest), rest, "--replicas 2 stays");
        let (workers, rest) = take_workers(&strings(&["--replicas", "2", "--workers=3"])).unwrap();
        assert_eq!((workers, rest), (Some(3), strings(&["--replicas", "2"])));
        assert_eq!(take_workers(&strings(&["--steps", "9"])).unwrap().0, None);
        for (bad, says) in [
            (&["--workers"][..], "needs a number"),
            (&["--workers", "0"], "positive integer, not '0'"),
            (&["--workers=x"], "positive integer, not 'x'"),
            (&["--workers", "2", "--workers", "2"], "given twice"),
        ] {
            let err = take_workers(&strings(bad)).unwrap_err().to_string();
            assert!(err.contains(says), "{bad:?}: {err}");
        }
    }
}
