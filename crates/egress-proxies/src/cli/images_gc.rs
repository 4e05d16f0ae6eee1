//! `egress-proxies images gc --config FILE [--entry E] [--dry-run] [--grace DURATION]`: one
//! pass removing the cached base images nothing on their host uses.
//!
//! Pipeline: load the config (offline; exit 2 on errors) → pick the entries (all, or the one
//! `--entry`; an unknown one is a usage error) → each entry's
//! [`Provider::collect_bases`](egress_provider::Provider::collect_bases) (network; each host
//! bounded by the provider) → one line per base → exit 1 unless every host was read and
//! every removal succeeded.
//!
//! Guarantees: what "in use" means is the provider's, read on each host (any domain or
//! volume there that uses the base, whoever owns it); this process has no earlier passes, so
//! a base's unused time counts from its upload ([`UnusedClock::Upload`]): a base uploaded
//! less than the grace ago is kept; `--dry-run` removes nothing.

use std::time::{Duration, SystemTime};

use egress_core::config::installation::Installation;
use egress_core::gc::{Action, GcReport, base_item};
use egress_core::providers::{self, ProviderHandle};
use egress_provider::bases::{BaseGcSettings, UnusedClock};

use super::{ConfigArg, EXIT_FAILED, EXIT_OK, UsageError, load_config};

/// Arguments of `images gc`.
#[derive(Debug, clap::Args)]
pub struct ImagesGcArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Only this provider entry (default: every entry).
    #[arg(long, value_name = "ENTRY")]
    entry: Option<String>,
    /// Print what would be removed, and why, without removing anything.
    #[arg(long)]
    dry_run: bool,
    /// Keep bases uploaded less than this long ago (e.g. 0s, 30m, 2h); default: each entry's
    /// limits.unusedBaseGraceMinutes.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    grace: Option<Duration>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `images gc`.
pub async fn run(a: ImagesGcArgs) -> anyhow::Result<u8> {
    let format = super::output::format(a.json);
    let cfg = load_config(&a.config.config)?;
    super::check::missing_ssh_files(&cfg)?;
    let providers = providers::open(&cfg, &Installation::ConfigOnly)
        .map_err(|e| UsageError::new(e.to_string()))?;
    let selected: Vec<&ProviderHandle> = match &a.entry {
        Some(e) => vec![providers.get(e).ok_or_else(|| {
            let known: Vec<&str> = providers.iter().map(|h| h.config.name.as_str()).collect();
            UsageError::new(format!(
                "no provider entry {e:?} in the config (entries: {})",
                known.join(", ")
            ))
        })?],
        None => providers.iter().collect(),
    };
    let settings = BaseGcSettings {
        dry_run: a.dry_run,
        clock: UnusedClock::Upload,
        grace: a.grace,
        now: SystemTime::now(),
    };
    let mut items = Vec::new();
    for h in selected {
        items.extend(
            h.provider
                .collect_bases(&settings)
                .await
                .into_iter()
                .map(base_item),
        );
    }
    let report = GcReport {
        dry_run: a.dry_run,
        entries: Vec::new(),
        items,
    };
    if let Some(doc) = super::output::document(&report, format)? {
        println!("{doc}");
    } else {
        print!("{}", super::messages::plain_report(&report.to_string()));
        let n = |x| report.with_action(x).count();
        println!(
            "bases: {}{} removed, {} would be removed, {} kept, {} failed",
            if a.dry_run { "dry run: " } else { "" },
            n(Action::Deleted),
            n(Action::WouldDelete),
            n(Action::Kept),
            n(Action::Failed)
        );
    }
    Ok(if report.is_clean() {
        EXIT_OK
    } else {
        EXIT_FAILED
    })
}
