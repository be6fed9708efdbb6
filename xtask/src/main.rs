//! `cargo xtask`: the project's runner, in the style of rust-analyzer's and wgpu's xtasks.
//!
//! It only orchestrates `cargo` and the provisioning that tests need; it knows nothing about the
//! library crates' internals. This file parses the command line ([`Command`]) and hands each
//! command to its module: [`test`](mod@test) (`test`, `test-mpi`), [`ci`], [`test_gpu`],
//! [`fetch`] (`fetch-pjrt`, `fetch-nvrtc`), [`bench`](mod@bench), [`demo`], [`launch`]. What
//! several commands share is in [`cargo`], [`packages`] and [`mpirun`]; what they fetch or find
//! on the machine is in [`provision`]. The tidy tests (layering, module headers, the
//! architecture doc's invariants, licences, cycles between files, single copies, the poison
//! policy) live in `tidy` (compiled for tests only).

use std::process::ExitCode;

use anyhow::Result;
use clap::{CommandFactory, Parser, Subcommand};

mod bench;
mod cargo;
mod ci;
mod demo;
mod downstream;
mod fetch;
mod launch;
mod mpirun;
mod packages;
mod provision;
mod test;
mod test_gpu;
#[cfg(test)]
mod tidy;

/// The project's runner: tests, lints, benchmarks, the demo and multi-worker launches, with the
/// pinned tools and libraries they need.
#[derive(Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask", after_help = mpirun::MPI_HELP)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

/// Every command; each one's help is the doc comment of its arguments.
#[derive(Subcommand)]
enum Command {
    Test(test::TestArgs),
    TestMpi(test::TestMpiArgs),
    TestDownstream(downstream::Args),
    Ci(ci::Args),
    TestGpu(test_gpu::Args),
    FetchPjrt(fetch::FetchPjrtArgs),
    FetchNvrtc(fetch::FetchNvrtcArgs),
    Bench(bench::Args),
    Demo(demo::Args),
    Launch(launch::Args),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            // Help goes to stdout and succeeds; a usage error fails as every other error does.
            let _ = err.print();
            return if err.use_stderr() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Option<Command>) -> Result<()> {
    let Some(command) = command else {
        // `cargo xtask` alone lists the commands.
        Cli::command().print_help()?;
        return Ok(());
    };
    match command {
        Command::Test(args) => test::test(&args.args),
        Command::TestMpi(args) => test::test_mpi(&args.args).map(|_| ()),
        Command::TestDownstream(_) => downstream::test(&cargo::workspace_root()),
        Command::Ci(_) => ci::ci(),
        Command::TestGpu(args) => test_gpu::command(&args),
        Command::FetchPjrt(args) => fetch::fetch_pjrt(&args),
        Command::FetchNvrtc(_) => fetch::fetch_nvrtc(),
        Command::Bench(args) => bench::bench(&args),
        Command::Demo(args) => demo::demo(&args.args),
        Command::Launch(args) => launch::launch(&args),
    }
}

/// Parses `cargo xtask ARGS…` as `main` does.
#[cfg(test)]
fn parse(args: &[&str]) -> Result<Command, clap::Error> {
    let cli = Cli::try_parse_from(std::iter::once("cargo xtask").chain(args.iter().copied()))?;
    Ok(cli.command.expect("the tests name a command"))
}

#[cfg(test)]
mod tests {
    use clap::error::ErrorKind;

    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_command_has_its_name_and_help() {
        let cli = Cli::command();
        let names: Vec<&str> = cli.get_subcommands().map(|c| c.get_name()).collect();
        assert_eq!(
            names,
            [
                "test",
                "test-mpi",
                "test-downstream",
                "ci",
                "test-gpu",
                "fetch-pjrt",
                "fetch-nvrtc",
                "bench",
                "demo",
                "launch"
            ]
        );
        for command in cli.get_subcommands() {
            assert!(command.get_about().is_some(), "{}", command.get_name());
        }
    }

    #[test]
    fn unknown_command_is_an_error_with_usage() {
        let Err(err) = parse(&["frobnicate"]) else {
            panic!("frobnicate parsed");
        };
        assert_eq!(err.kind(), ErrorKind::InvalidSubcommand);
        let text = err.to_string();
        assert!(
            text.contains("unrecognized subcommand 'frobnicate'"),
            "{text}"
        );
        assert!(text.contains("Usage: cargo xtask"), "{text}");
    }
}
