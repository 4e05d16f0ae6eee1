//! `egress-proxies completions SHELL` and `egress-proxies man`: the shell completion script
//! and the manual page, generated from the same clap definitions the parser uses (so they
//! never drift from the real flags).
//!
//! Guarantees: no network, no file read; the output goes to stdout; exit 0, or 1 when stdout
//! cannot be written (a closed pipe).

use std::io::Write;

use clap::CommandFactory;
use clap_complete::Shell;

use super::{Cli, EXIT_FAILED, EXIT_OK, UsageError};

/// Arguments of `completions`.
#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// The shell to generate for.
    #[arg(value_enum)]
    shell: Shell,
}

/// Prints the completion script for the asked shell.
pub fn completions(a: &CompletionsArgs) -> anyhow::Result<u8> {
    let mut cmd = Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "egress-proxies", &mut out);
    Ok(write_stdout(&out))
}

/// Arguments of `man`.
#[derive(Debug, clap::Args)]
pub struct ManArgs {
    /// A command whose page to print (e.g. `standalone`); without it, the top-level page,
    /// which lists every command.
    #[arg(value_name = "COMMAND")]
    command: Option<String>,
}

/// Prints the manual page of `egress-proxies` or of one of its commands; an unknown command
/// is a usage error.
pub fn man(a: &ManArgs) -> anyhow::Result<u8> {
    let cmd = Cli::command();
    let man = match &a.command {
        None => clap_mangen::Man::new(cmd),
        Some(name) => {
            let sub = cmd.find_subcommand(name).ok_or_else(|| {
                UsageError::new(format!(
                    "man: no command {name:?} (see egress-proxies --help)"
                ))
            })?;
            clap_mangen::Man::new(sub.clone()).title(format!("egress-proxies-{name}"))
        }
    };
    let mut out = Vec::new();
    man.render(&mut out)?;
    Ok(write_stdout(&out))
}

fn write_stdout(bytes: &[u8]) -> u8 {
    let mut so = std::io::stdout().lock();
    match so.write_all(bytes).and_then(|()| so.flush()) {
        Ok(()) => EXIT_OK,
        Err(e) => {
            eprintln!("error: cannot write to stdout: {e}");
            EXIT_FAILED
        }
    }
}
