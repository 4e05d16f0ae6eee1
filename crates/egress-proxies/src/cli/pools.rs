//! `egress-proxies pools quarantine|release --proxies DIR [--namespace NS] POOL MEMBER`: hold
//! a standalone pool's member out of the pool for inspection, and let it go.
//!
//! Pipeline: edit the pool's quarantine file beside its manifest
//! ([`egress_standalone::quarantine::edit`]: the member must be one the running operator
//! keeps for the pool, the file is replaced whole) → one line (or a document under `-o
//! json|yaml`) saying what changed and what the operator does next. No network: the running
//! `standalone` reads the file on its next pool round (within a second or two).
//!
//! Guarantees: a refused edit (unknown pool or member, a bad reason) changes nothing and
//! exits 2; quarantining twice for the same reason or releasing a member that is not
//! quarantined changes nothing and exits 0, saying so.

use std::path::PathBuf;

use egress_standalone::quarantine::{self, Edit, QuarantineError};
use serde::Serialize;

use super::{EXIT_OK, UsageError};

/// `pools` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum PoolsCommand {
    /// Hold a member of a standalone ProxyPool out of the pool, keeping its VM.
    ///
    /// The member leaves the pool's publication (healthy.txt) at the operator's next pool
    /// round, a replacement is created for it, and its VM stays for inspection until `pools
    /// release`. Exit 2 if the pool or the member is unknown or the reason is not one line.
    Quarantine(QuarantineArgs),
    /// Let a quarantined member go: the pool deletes it (it was already replaced).
    Release(MemberArgs),
}

/// Which member.
#[derive(Debug, clap::Args)]
pub struct MemberArgs {
    /// The directory of Proxy and ProxyPool manifests the `standalone` operator runs over.
    #[arg(long, value_name = "DIR")]
    proxies: PathBuf,
    /// The pool's namespace (its manifest's metadata.namespace).
    #[arg(long, value_name = "NS", default_value = "default")]
    namespace: String,
    /// The pool's name.
    #[arg(value_name = "POOL")]
    pool: String,
    /// The member's name (as `egress-proxies status` lists it).
    #[arg(value_name = "MEMBER")]
    member: String,
}

/// Arguments of `pools quarantine`.
#[derive(Debug, clap::Args)]
pub struct QuarantineArgs {
    #[command(flatten)]
    member: MemberArgs,
    /// Why (one line, shown in the member's row).
    #[arg(long, value_name = "TEXT", default_value = "quarantined by hand")]
    reason: String,
}

/// What the command did (the `-o json|yaml` document).
#[derive(Debug, Serialize)]
struct Outcome {
    pool: String,
    member: String,
    quarantined: bool,
    changed: bool,
    reason: Option<String>,
}

/// Runs a `pools` subcommand.
pub fn run(cmd: PoolsCommand) -> anyhow::Result<u8> {
    let format = super::output::format(false);
    let (m, reason) = match &cmd {
        PoolsCommand::Quarantine(a) => (&a.member, Some(a.reason.as_str())),
        PoolsCommand::Release(a) => (a, None),
    };
    let pool = format!("{}/{}", m.namespace, m.pool);
    let edit = quarantine::edit(&m.proxies, &m.namespace, &m.pool, &m.member, reason).map_err(
        |e| match e {
            QuarantineError::Io { .. } => anyhow::Error::new(e),
            other => UsageError::new(other.to_string()).into(),
        },
    )?;
    let out = Outcome {
        pool: pool.clone(),
        member: m.member.clone(),
        quarantined: reason.is_some(),
        changed: matches!(edit, Edit::Quarantined | Edit::Released),
        reason: reason.map(str::to_owned),
    };
    if let Some(doc) = super::output::document(&out, format)? {
        println!("{doc}");
        return Ok(EXIT_OK);
    }
    let member = &m.member;
    match edit {
        Edit::Quarantined => println!(
            "member {member} of pool {pool} quarantined ({}): it leaves the pool's publication and \
             is replaced; its VM stays until `egress-proxies pools release`",
            reason.unwrap_or_default()
        ),
        Edit::AlreadyQuarantined => {
            println!("member {member} of pool {pool} was already quarantined; nothing changed");
        }
        Edit::Released => {
            println!("member {member} of pool {pool} released: the pool deletes it");
        }
        Edit::NotQuarantined => {
            println!("member {member} of pool {pool} is not quarantined; nothing changed");
        }
    }
    Ok(EXIT_OK)
}
