//! The `egress-proxies` binary: parses the command line and runs it ([`cli`]).
//!
//! Guarantees: the exit codes of [`cli`] (0 ok, 1 failed, 2 usage) for every command.

mod cli;

use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    cli::run(cli::Cli::parse())
}
