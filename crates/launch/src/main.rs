//! `cargo-distribute`, run as `cargo distribute build|run|env` in the user's crate: see
//! [`distribute_launch::cli::USAGE`].

use std::process::ExitCode;

use distribute_launch::cli::{self, Command, Run, USAGE};
use distribute_launch::exports::shell_exports;
use distribute_launch::job::{Workers, cores, mpirun_command, mpirun_line, with_restarts};
use distribute_launch::mpi::{Mpi, cache_dir};
use distribute_launch::{Error, Result, cargo};

/// How this program's lines start.
const WHO: &str = "cargo-distribute";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match cli::parse(&args).and_then(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("{WHO}: error: {err}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> Result<()> {
    if command == Command::Help {
        println!("{USAGE}");
        return Ok(());
    }
    let mpi = Mpi::resolve(&cache_dir()?, &cargo::target_directory()?, WHO)?;
    match command {
        Command::Build(args) => cargo::build(&args, &mpi.env()).map(|_| ()),
        Command::Run(run) => run_job(&mpi, &run),
        Command::Env => {
            print!("{}", shell_exports(&mpi.describe(), &mpi.env()));
            Ok(())
        }
        Command::Help => unreachable!("answered above"),
    }
}

/// `cargo distribute run`: builds, then runs the program under `mpirun`, again after a failure
/// up to `--restarts` times.
fn run_job(mpi: &Mpi, run: &Run) -> Result<()> {
    let program = cargo::the_program(cargo::build(&run.cargo_args, &mpi.env())?)?;
    let workers = Workers {
        count: run.workers,
        hostfile: run.hostfile.clone(),
        program: program.executable,
        args: run.program_args.clone(),
    };
    let args = workers.mpirun_args(cores(), mpi.wheel_prefix());
    let what = format!("{} on {} workers", program.name, run.workers);
    with_restarts(run.restarts, WHO, &what, |_| {
        eprintln!("{WHO}: {}", mpirun_line(mpi, &args));
        let status = mpirun_command(mpi, &args)?
            .status()
            .map_err(Error::io(format!("starting {}", mpi.mpirun().display())))?;
        if status.success() {
            Ok(())
        } else {
            Err(Error::Command(format!("mpirun exited with {status}")))
        }
    })
    .map_err(|last| {
        Error::Command(format!(
            "{what}: all {} attempts failed (--restarts {}); the last: {last}",
            run.restarts + 1,
            run.restarts
        ))
    })
}
