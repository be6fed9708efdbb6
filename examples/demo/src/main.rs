//! The `demo` binary (`cargo xtask demo`): parses the command line and runs the library's
//! [`distribute_demo::run`].

use anyhow::Result;
use clap::Parser;
use distribute_demo::cli::Options;

fn main() -> Result<()> {
    let args = Options::parse().check()?;
    if distribute_demo::started_by_mpirun() {
        return multi_worker(&args);
    }
    distribute_demo::run(&args)
}

/// A worker of `cargo xtask demo --workers W`.
#[cfg(feature = "mpi")]
fn multi_worker(args: &distribute_demo::Args) -> Result<()> {
    if let Some(gpt) = &args.gpt {
        return distribute_demo::gpt::run_multi_worker(gpt);
    }
    match args.framework {
        distribute_demo::Framework::Candle => {
            distribute_demo::report::run_candle_multi_worker(args)
        }
        distribute_demo::Framework::Native => distribute_demo::report::run_multi_worker(args),
    }
}

/// Under mpirun without the feature each process would train alone.
#[cfg(not(feature = "mpi"))]
fn multi_worker(_args: &distribute_demo::Args) -> Result<()> {
    anyhow::bail!(
        "started by mpirun, but this demo was built without the `mpi` feature: run \
         `cargo xtask demo --workers W`"
    )
}
