//! A job under `mpirun`: its command line (oversubscribed where there are more workers than
//! cores, a host file, the wheel's prefix on other machines), a fresh random cluster key per
//! job, and restarts of a failed job.

use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Error, Result};
use crate::mpi::Mpi;

/// The variable through which every task of a job gets its cluster key (the library's
/// `CLUSTER_KEY_VAR`, which authenticates NCCL's unique-id exchange).
pub const CLUSTER_KEY_VAR: &str = "DISTRIBUTE_CLUSTER_KEY";

/// The workers of one job: how many, where, and what each runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workers {
    /// Processes to start.
    pub count: usize,
    /// Open MPI's host file (the machines and their slots), if the job spans machines.
    pub hostfile: Option<PathBuf>,
    /// The program every worker runs.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
}

impl Workers {
    /// `mpirun`'s arguments that start the workers on a machine with `cores` cores: oversubscribed
    /// when one machine has more processes than cores (Open MPI refuses otherwise); with a host
    /// file, its slots decide, and `wheel_prefix` (the wheel's Open MPI, at the same path on
    /// every machine) is passed as `--prefix` so the other machines' daemons find it.
    pub fn mpirun_args(&self, cores: usize, wheel_prefix: Option<&Path>) -> Vec<String> {
        let mut mpirun = vec!["-n".to_owned(), self.count.to_string()];
        match &self.hostfile {
            Some(hostfile) => {
                mpirun.extend(["--hostfile".to_owned(), hostfile.display().to_string()]);
                if let Some(prefix) = wheel_prefix {
                    mpirun.extend(["--prefix".to_owned(), prefix.display().to_string()]);
                }
            }
            None if self.count > cores => mpirun.push("--oversubscribe".to_owned()),
            None => {}
        }
        mpirun.push(self.program.display().to_string());
        mpirun.extend(self.args.iter().cloned());
        mpirun
    }
}

/// The machine's core count as Open MPI counts slots (at least 1).
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// `mpirun -x DISTRIBUTE_CLUSTER_KEY ARGS` with the environment of `mpi` and a fresh cluster
/// key ([`job_key`]), ready to start.
pub fn mpirun_command(mpi: &Mpi, args: &[String]) -> Result<Command> {
    let mut command = Command::new(mpi.mpirun());
    command
        .args(["-x", CLUSTER_KEY_VAR])
        .args(args)
        .envs(mpi.env())
        .envs(job_key()?);
    Ok(command)
}

/// How [`mpirun_command`] reads, for the line a launcher prints before it starts the job.
pub fn mpirun_line(mpi: &Mpi, args: &[String]) -> String {
    format!(
        "{} -x {CLUSTER_KEY_VAR} {}",
        mpi.mpirun().display(),
        args.join(" ")
    )
}

/// A fresh random cluster key for one job, in the environment every worker inherits (`mpirun`
/// hands its environment to the processes it starts on this machine, and `-x` exports the
/// variable to other hosts), so the unique-id exchange authenticates without any setup; a key
/// the user set is kept (nothing to add).
pub fn job_key() -> Result<Option<(&'static str, String)>> {
    if std::env::var_os(CLUSTER_KEY_VAR).is_some() {
        return Ok(None);
    }
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| std::io::Read::read_exact(&mut random, &mut bytes))
        .map_err(Error::io("reading /dev/urandom for the job's cluster key"))?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(Some((CLUSTER_KEY_VAR, hex)))
}

/// Runs `attempt(0)`, and after a failure `attempt(1)`, … up to `restarts` more times, printing
/// each failure on a line starting `who: what: `; returns the last failure when every attempt
/// failed.
pub fn with_restarts<E: Display>(
    restarts: usize,
    who: &str,
    what: &str,
    mut attempt: impl FnMut(usize) -> Result<(), E>,
) -> Result<(), E> {
    let mut last = None;
    for n in 0..=restarts {
        if n > 0 {
            eprintln!(
                "{who}: {what}: restart {n} of {restarts}: the job starts again with the same \
                 arguments (a program that checkpoints resumes from its newest good checkpoint)"
            );
        }
        match attempt(n) {
            Ok(()) => return Ok(()),
            Err(e) => {
                eprintln!(
                    "{who}: {what}: attempt {} of {} failed: {e}",
                    n + 1,
                    restarts + 1
                );
                last = Some(e);
            }
        }
    }
    Err(last.expect("at least one attempt ran"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workers(count: usize, hostfile: Option<&str>) -> Workers {
        Workers {
            count,
            hostfile: hostfile.map(PathBuf::from),
            program: PathBuf::from("/t/release/train"),
            args: vec!["--json".to_owned()],
        }
    }

    #[test]
    fn mpirun_oversubscribes_only_past_the_cores_of_one_machine() {
        assert_eq!(
            workers(2, None).mpirun_args(2, None).join(" "),
            "-n 2 /t/release/train --json"
        );
        assert_eq!(
            workers(4, None).mpirun_args(2, None).join(" "),
            "-n 4 --oversubscribe /t/release/train --json"
        );
        // A host file's slots decide; the wheel's prefix goes to the other machines.
        assert_eq!(
            workers(4, Some("hosts"))
                .mpirun_args(2, Some(Path::new("/c/openmpi-5.0.11")))
                .join(" "),
            "-n 4 --hostfile hosts --prefix /c/openmpi-5.0.11 /t/release/train --json"
        );
        assert_eq!(
            workers(4, Some("hosts")).mpirun_args(2, None).join(" "),
            "-n 4 --hostfile hosts /t/release/train --json"
        );
    }

    #[test]
    fn every_job_gets_a_fresh_cluster_key() {
        if std::env::var_os(CLUSTER_KEY_VAR).is_some() {
            // The user's key is kept: nothing to make.
            assert!(job_key().unwrap().is_none());
            return;
        }
        let (a, b) = (job_key().unwrap().unwrap(), job_key().unwrap().unwrap());
        assert_eq!(a.0, CLUSTER_KEY_VAR);
        assert_eq!(a.1.len(), 64);
        assert!(a.1.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a.1, b.1);
    }

    #[test]
    fn a_job_is_started_again_until_it_succeeds_or_the_restarts_run_out() {
        let mut attempts = Vec::new();
        let result = with_restarts(3, "test", "job", |n| {
            attempts.push(n);
            if n < 2 { Err("worker 1 died") } else { Ok(()) }
        });
        assert!(result.is_ok());
        assert_eq!(attempts, [0, 1, 2]);
        let mut tried = 0;
        let error = with_restarts(1, "test", "job", |n| {
            tried += 1;
            Err(format!("worker 1 died in attempt {n}"))
        })
        .unwrap_err();
        assert_eq!((tried, error.as_str()), (2, "worker 1 died in attempt 1"));
    }
}
