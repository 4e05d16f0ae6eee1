//! The `egress-proxies` binary: parses the command line and hands it to
//! [`egress_operator::cli::run`], which returns the documented exit code.

use clap::Parser;

fn main() -> std::process::ExitCode {
    egress_operator::cli::run(egress_operator::cli::Cli::parse())
}
