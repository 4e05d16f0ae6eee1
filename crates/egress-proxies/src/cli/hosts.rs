//! `egress-proxies hosts fence|unfence --config FILE --proxies DIR [--entry ENTRY] HOST`:
//! declare a dead host of a standalone operator dead (its VMs are off), so the addresses its
//! instances held may move to other hosts of its segment; and take the declaration back.
//!
//! Pipeline: load the provider config (the host must be one of an entry's hosts) → edit the
//! `fenced-hosts` file in the manifest directory ([`egress_standalone::fenced_hosts::edit`],
//! replaced whole) → one line (or a document under `-o json|yaml`) saying what changed and
//! what the operator does next. No network: the running `standalone` applies the file after
//! its next check of the entry, and only while that check finds the host dead.
//!
//! Guarantees: a refused edit (an unknown host or entry, a host in several entries without
//! `--entry`, a bad reason) changes nothing, names the host and the entries, and exits 2;
//! declaring twice or taking back a declaration that is not there changes nothing and exits
//! 0, saying so.

use std::path::PathBuf;
use std::time::SystemTime;

use egress_core::config::ProviderEntry;
use egress_standalone::fenced_hosts::{self, Edit, FenceError};
use serde::Serialize;

use super::{ConfigArg, EXIT_OK, UsageError, load_config};

/// `hosts` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum HostsCommand {
    /// Declare a host of a standalone operator dead: its VMs are off (you powered it off, or
    /// it burned). Only you can know this; a timeout never proves it.
    ///
    /// Writes a line to the `fenced-hosts` file in --proxies. After its next check of the
    /// entry, and only while that check finds the host dead (Unreachable or Timeout), the
    /// running operator frees what the host's instances held: a Proxy pinned to such an
    /// address may then take it on another host of the host's segment. When the host answers
    /// again, the operator removes the line. Exit 2 if the host or the entry is unknown.
    Fence(FenceArgs),
    /// Take back a declaration that has not been applied yet, or stop it applying after an
    /// operator restart. What already moved stays where it is.
    Unfence(HostArgs),
}

/// Which host.
#[derive(Debug, clap::Args)]
pub struct HostArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// The directory of Proxy and ProxyPool manifests the `standalone` operator runs over.
    #[arg(long, value_name = "DIR")]
    proxies: PathBuf,
    /// The provider entry (needed only when several entries have a host of that name).
    #[arg(long, value_name = "ENTRY")]
    entry: Option<String>,
    /// The host's name (`hosts[].name`).
    #[arg(value_name = "HOST")]
    host: String,
}

/// Arguments of `hosts fence`.
#[derive(Debug, clap::Args)]
pub struct FenceArgs {
    #[command(flatten)]
    host: HostArgs,
    /// Why (one line, in the file and the operator's log).
    #[arg(long, value_name = "TEXT", default_value = "declared dead by hand")]
    reason: String,
}

/// What the command did (the `-o json|yaml` document).
#[derive(Debug, Serialize)]
struct Outcome {
    entry: String,
    host: String,
    fenced: bool,
    changed: bool,
    reason: Option<String>,
}

/// The entry of `a.host`: the one named by `--entry`, else the only one with that host.
fn entry_of(a: &HostArgs) -> anyhow::Result<String> {
    let cfg = load_config(&a.config.config)?;
    let with_host = |e: &ProviderEntry| {
        let ProviderEntry::Libvirt(l) = e;
        l.hosts.iter().any(|h| h.name == a.host)
    };
    let names = |f: &dyn Fn(&ProviderEntry) -> bool| {
        cfg.providers
            .iter()
            .filter(|e| f(e))
            .map(|e| e.name().to_owned())
            .collect::<Vec<_>>()
    };
    let all = names(&|_| true).join(", ");
    if let Some(want) = &a.entry {
        let Some(e) = cfg.entry(want) else {
            return Err(UsageError::new(format!(
                "--entry {want}: the provider config has no such entry (entries: {all})"
            ))
            .into());
        };
        if !with_host(e) {
            let ProviderEntry::Libvirt(l) = e;
            let hosts: Vec<&str> = l.hosts.iter().map(|h| h.name.as_str()).collect();
            return Err(UsageError::new(format!(
                "entry {want} has no host {} (its hosts: {})",
                a.host,
                hosts.join(", ")
            ))
            .into());
        }
        return Ok(want.clone());
    }
    let found = names(&with_host);
    match found.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(UsageError::new(format!(
            "no entry of the provider config has a host {} (entries: {all})",
            a.host
        ))
        .into()),
        many => Err(UsageError::new(format!(
            "host {} is in entries {}: say which with --entry",
            a.host,
            many.join(", ")
        ))
        .into()),
    }
}

/// Runs a `hosts` subcommand.
pub fn run(cmd: HostsCommand) -> anyhow::Result<u8> {
    let format = super::output::format(false);
    let (a, reason) = match &cmd {
        HostsCommand::Fence(f) => (&f.host, Some(f.reason.as_str())),
        HostsCommand::Unfence(a) => (a, None),
    };
    let entry = entry_of(a)?;
    let when = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    let by = std::env::var("USER")
        .ok()
        .filter(|u| !u.trim().is_empty())
        .unwrap_or_else(|| "unknown".to_owned());
    let declare = reason.map(|r| (when.as_str(), by.as_str(), r));
    let edit = fenced_hosts::edit(&a.proxies, &entry, &a.host, declare).map_err(|e| match e {
        FenceError::Io { .. } => anyhow::Error::new(e),
        other => UsageError::new(other.to_string()).into(),
    })?;
    let out = Outcome {
        entry: entry.clone(),
        host: a.host.clone(),
        fenced: reason.is_some(),
        changed: matches!(edit, Edit::Fenced | Edit::Unfenced),
        reason: reason.map(str::to_owned),
    };
    if let Some(doc) = super::output::document(&out, format)? {
        println!("{doc}");
        return Ok(EXIT_OK);
    }
    let host = &a.host;
    match edit {
        Edit::Fenced => println!(
            "host {host} of entry {entry} declared dead ({}): after its next check finds it \
             dead, the operator frees what its instances held for other hosts of its segment",
            reason.unwrap_or_default()
        ),
        Edit::AlreadyFenced => {
            println!("host {host} of entry {entry} was already declared dead; nothing changed");
        }
        Edit::Unfenced => {
            println!("host {host} of entry {entry}: declaration removed (what already moved stays)")
        }
        Edit::NotFenced => {
            println!("host {host} of entry {entry} is not declared dead; nothing changed");
        }
    }
    Ok(EXIT_OK)
}
