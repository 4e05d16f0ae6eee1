//! `egress-proxies hosts fence|unfence --config FILE --proxies DIR [--entry ENTRY] HOST`:
//! declare a dead host of a standalone operator dead (its VMs are off), so the addresses its
//! instances held may move to other hosts of its segment; and take the declaration back.
//! With `--kubernetes [--kubeconfig PATH]` instead of `--config`/`--proxies`, the same for
//! the Kubernetes operator: the `fence.egress-proxies.dev/HOST` annotation on the entry's
//! ProviderHealth ([`egress_kube::fence`]), set with a JSON merge patch touching only that
//! key, removed with a JSON patch that tests the value read first; the entry and its hosts
//! come from the cluster's ProviderHealths; every API call has a deadline.
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
use std::time::{Duration, SystemTime};

use anyhow::Context as _;

use egress_core::config::ProviderEntry;
use egress_standalone::fenced_hosts::{self, Edit, FenceError};
use serde::Serialize;

use super::{EXIT_OK, UsageError, load_config};

/// `hosts` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum HostsCommand {
    /// Declare a host dead: its VMs are off (you powered it off, or it burned). Only you can
    /// know this; a timeout never proves it.
    ///
    /// Standalone: writes a line to the `fenced-hosts` file in --proxies. Kubernetes
    /// (--kubernetes): sets the `fence.egress-proxies.dev/HOST` annotation on the entry's
    /// ProviderHealth. After its next check of the entry, and only while that check finds the
    /// host dead (Unreachable or Timeout), the running operator frees what the host's
    /// instances held: a Proxy pinned to such an address may then take it on another host of
    /// the host's segment. When the host answers again, the operator removes the declaration.
    /// Exit 2 if the host or the entry is unknown.
    Fence(FenceArgs),
    /// Take back a declaration that has not been applied yet, or stop it applying after an
    /// operator restart. What already moved stays where it is.
    Unfence(HostArgs),
}

/// Which host.
#[derive(Debug, clap::Args)]
pub struct HostArgs {
    /// Provider configuration file of the `standalone` operator (YAML).
    #[arg(
        long,
        short = 'c',
        value_name = "FILE",
        env = "EGRESS_PROXIES_CONFIG",
        required_unless_present = "kubernetes"
    )]
    config: Option<PathBuf>,
    /// The directory of Proxy and ProxyPool manifests the `standalone` operator runs over.
    #[arg(long, value_name = "DIR", required_unless_present = "kubernetes")]
    proxies: Option<PathBuf>,
    /// Declare it to the Kubernetes operator: the annotation on the entry's ProviderHealth
    /// (what `kubectl annotate providerhealth ENTRY fence.egress-proxies.dev/HOST=REASON`
    /// does).
    #[arg(long, conflicts_with_all = ["proxies", "config"])]
    kubernetes: bool,
    /// Kubeconfig file to connect with (default: $KUBECONFIG, ~/.kube/config, then the pod's
    /// service account).
    #[arg(long, value_name = "PATH", requires = "kubernetes")]
    kubeconfig: Option<PathBuf>,
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
fn entry_of(a: &HostArgs, config: &std::path::Path) -> anyhow::Result<String> {
    let cfg = load_config(config)?;
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
pub async fn run(cmd: HostsCommand) -> anyhow::Result<u8> {
    let format = super::output::format(false);
    let (a, reason) = match &cmd {
        HostsCommand::Fence(f) => (&f.host, Some(f.reason.as_str())),
        HostsCommand::Unfence(a) => (a, None),
    };
    let (Some(config), Some(proxies)) = (&a.config, &a.proxies) else {
        return kube_run(a, reason, format).await;
    };
    let entry = entry_of(a, config)?;
    let when = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    let by = std::env::var("USER")
        .ok()
        .filter(|u| !u.trim().is_empty())
        .unwrap_or_else(|| "unknown".to_owned());
    let declare = reason.map(|r| (when.as_str(), by.as_str(), r));
    let edit = fenced_hosts::edit(proxies, &entry, &a.host, declare).map_err(|e| match e {
        FenceError::Io { .. } => anyhow::Error::new(e),
        other => UsageError::new(other.to_string()).into(),
    })?;
    report(&entry, &a.host, reason, edit, format)
}

/// Prints what an edit did.
fn report(
    entry: &str,
    host: &str,
    reason: Option<&str>,
    edit: Edit,
    format: super::output::OutputFormat,
) -> anyhow::Result<u8> {
    let out = Outcome {
        entry: entry.to_owned(),
        host: host.to_owned(),
        fenced: reason.is_some(),
        changed: matches!(edit, Edit::Fenced | Edit::Unfenced),
        reason: reason.map(str::to_owned),
    };
    if let Some(doc) = super::output::document(&out, format)? {
        println!("{doc}");
        return Ok(EXIT_OK);
    }
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

/// Deadline of each Kubernetes API call.
const KUBE_CALL: Duration = Duration::from_secs(15);

async fn within<T>(
    what: &str,
    f: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> anyhow::Result<T> {
    match tokio::time::timeout(KUBE_CALL, f).await {
        Ok(r) => r.with_context(|| what.to_owned()),
        Err(_) => Err(anyhow::anyhow!("{what}: no answer within {KUBE_CALL:?}")),
    }
}

/// `hosts fence|unfence --kubernetes`: edits the host's annotation on its entry's
/// ProviderHealth.
async fn kube_run(
    a: &HostArgs,
    reason: Option<&str>,
    format: super::output::OutputFormat,
) -> anyhow::Result<u8> {
    use egress_kube::api::ProviderHealth;
    use egress_kube::fence;
    use kube::api::{Api, ListParams, Patch, PatchParams};

    if let Some(r) = reason {
        fence::check_reason(r).map_err(|e| UsageError::new(format!("--reason: {e}")))?;
    }
    {
        let client = super::kube_client::client(a.kubeconfig.as_deref()).await?;
        let api: Api<ProviderHealth> = Api::all(client);
        // rbac (the administrator's): providerhealths list, patch
        let list = within("listing ProviderHealths", api.list(&ListParams::default())).await?;
        let hosts_of = |ph: &ProviderHealth| -> Vec<String> {
            ph.status
                .as_ref()
                .map(|s| s.hosts.iter().map(|h| h.host.clone()).collect())
                .unwrap_or_default()
        };
        let all: Vec<String> = list.items.iter().map(kube::ResourceExt::name_any).collect();
        let all_s = all.join(", ");
        let ph = if let Some(want) = &a.entry {
            let Some(ph) = list
                .items
                .iter()
                .find(|p| &kube::ResourceExt::name_any(*p) == want)
            else {
                return Err(UsageError::new(format!(
                    "--entry {want}: the cluster has no ProviderHealth of that entry \
                     (entries: {all_s})"
                ))
                .into());
            };
            if !hosts_of(ph).contains(&a.host) {
                return Err(UsageError::new(format!(
                    "entry {want} has no host {} (its hosts: {})",
                    a.host,
                    hosts_of(ph).join(", ")
                ))
                .into());
            }
            ph
        } else {
            let found: Vec<&ProviderHealth> = list
                .items
                .iter()
                .filter(|p| hosts_of(p).contains(&a.host))
                .collect();
            match found.as_slice() {
                [one] => *one,
                [] => {
                    return Err(UsageError::new(format!(
                        "no entry's ProviderHealth has a host {} (entries: {all_s})",
                        a.host
                    ))
                    .into());
                }
                many => {
                    let names: Vec<String> = many
                        .iter()
                        .map(|p| kube::ResourceExt::name_any(*p))
                        .collect();
                    return Err(UsageError::new(format!(
                        "host {} is in entries {}: say which with --entry",
                        a.host,
                        names.join(", ")
                    ))
                    .into());
                }
            }
        };
        let entry = kube::ResourceExt::name_any(ph);
        let key = fence::key(&a.host);
        let current = ph
            .metadata
            .annotations
            .as_ref()
            .and_then(|m| m.get(&key))
            .cloned();
        let edit = match (reason, current) {
            (Some(r), Some(c)) if c == r => Edit::AlreadyFenced,
            (Some(r), _) => {
                let patch = Patch::Merge(serde_json::json!({
                    "metadata": {"annotations": {key.as_str(): r}}}));
                within(
                    "annotating the ProviderHealth",
                    api.patch(&entry, &PatchParams::default(), &patch),
                )
                .await?;
                Edit::Fenced
            }
            (None, None) => Edit::NotFenced,
            (None, Some(c)) => {
                let patch = Patch::<()>::Json(fence::removal_patch(&a.host, &c));
                match tokio::time::timeout(
                    KUBE_CALL,
                    api.patch(&entry, &PatchParams::default(), &patch),
                )
                .await
                {
                    Ok(Ok(_)) => Edit::Unfenced,
                    Ok(Err(kube::Error::Api(e))) if e.code == 409 || e.code == 422 => {
                        anyhow::bail!(
                            "the declaration of host {} changed meanwhile (by the operator or \
                             someone else); run the command again",
                            a.host
                        )
                    }
                    Ok(Err(e)) => {
                        return Err(anyhow::Error::new(e).context("removing the annotation"));
                    }
                    Err(_) => {
                        anyhow::bail!("removing the annotation: no answer within {KUBE_CALL:?}")
                    }
                }
            }
        };
        report(&entry, &a.host, reason, edit, format)
    }
}
