//! The `egress-proxies` binary: installs the process's TLS crypto provider, parses the command
//! line and runs it ([`cli`]).
//!
//! Guarantees: the exit codes of [`cli`] (0 ok, 1 failed, 2 usage) for every command; every
//! TLS connection of the process (Kubernetes API, image downloads) uses the one crypto
//! provider of the workspace (aws-lc-rs, see the root Cargo.toml), installed before anything
//! else runs, so no TLS handshake can fail to find one.

mod cli;

use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    install_crypto_provider();
    cli::run(cli::Cli::parse())
}

/// Installs aws-lc-rs as the process-level rustls provider. Nothing runs before this, so
/// installing cannot race; should a provider already be installed, that one stays (it is the
/// same kind: only aws-lc-rs is compiled in) and a note goes to stderr.
fn install_crypto_provider() {
    if rustls::crypto::aws_lc_rs::default_provider()
        .install_default()
        .is_err()
    {
        eprintln!("note: a TLS crypto provider was already installed; keeping it");
    }
}
