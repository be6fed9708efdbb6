//! The `demo` binary (`cargo xtask demo`): parses the command line and runs the library's
//! [`distribute_demo::run`].

use anyhow::Result;
use clap::Parser;
use distribute_demo::cli::Options;

fn main() -> Result<()> {
    let args = Options::parse().check()?;
    distribute_demo::run(&args)
}
