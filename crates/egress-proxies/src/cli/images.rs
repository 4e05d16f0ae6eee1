//! `egress-proxies images prefetch --config FILE [--entry E] [--host H] KEY`: warm a base
//! image on every host so the first Proxy there does not wait for a download. (`images gc`,
//! which removes unused bases, lives in `images_gc`.)
//!
//! Pipeline: load the config (offline, exit 2 on errors) → pick the targets: every host of
//! every entry whose catalogue has KEY (or the one `--entry`, where KEY may also be a URL the
//! entry allows), narrowed by `--host`; a KEY no entry knows, or an unknown entry or host, is
//! a usage error → [`Provider::prefetch`](egress_provider::Provider::prefetch) on at most
//! [`PREFETCH_PARALLEL`] hosts at once, each bounded by the entry's `timeouts.imageImport`
//! plus [`PREFETCH_SLACK`] → one summary line per host → exit 1 if any host failed.
//!
//! Guarantees: only verified, published bases are added (the provider's import protocol);
//! a base already cached is reused without a download; interrupting the command never
//! leaves a half-published base (an unfinished upload is a part volume that GC sweeps).

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use indicatif::MultiProgress;

use super::progress::Bar;
use super::table;
use super::{ConfigArg, EXIT_FAILED, EXIT_OK, UsageError, load_config};
use egress_core::config::installation::Installation;
use egress_core::providers::{self, ProviderHandle, Providers};

/// Hosts importing at once.
// NB: each import streams an image from one HTTP source through this process to a host; 4
// keeps a 1 Gbit/s uplink busy with typical CDN speeds without four-way contention on one
// mirror, and bounds sockets and tasks for large fleets.
pub const PREFETCH_PARALLEL: usize = 4;

/// Added to `timeouts.imageImport` for one host: waiting for the host's operation slot, the
/// dial and the pool lookup happen before the import's own clock starts.
// NB: the slot wait is bounded at 30 s by default and the dial by 3 × dial (≤ 30 s by
// default); 90 s covers both with room for a slow pool lookup.
pub const PREFETCH_SLACK: Duration = Duration::from_secs(90);

/// `images` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ImagesCommand {
    /// Download, verify and publish a catalogue image on every host that can use it.
    ///
    /// KEY is a key of an entry's `images:` catalogue (or, with --entry, a URL that entry's
    /// `urlImages` allows). A host that already has the base reuses it. Exit 1 if any host
    /// failed, 2 if the config, KEY, entry or host is wrong.
    Prefetch(PrefetchArgs),
    /// Remove the cached base images that nothing on their host uses.
    ///
    /// A base is removed when no domain (running or not, ours or not) and no volume on its
    /// host uses it and it was uploaded longer ago than the grace (--grace, else the entry's
    /// limits.unusedBaseGraceMinutes). This command has no memory of earlier runs, so the
    /// grace counts from the upload; the operator's own GC counts it from when it first
    /// found the base unused. Exit 1 if a host could not be read or a removal failed.
    Gc(super::images_gc::ImagesGcArgs),
}

/// Arguments of `images prefetch`.
#[derive(Debug, clap::Args)]
pub struct PrefetchArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Only this provider entry (default: every entry whose catalogue has KEY).
    #[arg(long, value_name = "ENTRY")]
    entry: Option<String>,
    /// Only the host with this name (in each selected entry).
    #[arg(long, value_name = "HOST")]
    host: Option<String>,
    /// Catalogue key (e.g. debian-12), or with --entry an allowed image URL.
    #[arg(value_name = "KEY")]
    key: String,
}

/// Runs an `images` subcommand.
pub async fn run(cmd: ImagesCommand) -> anyhow::Result<u8> {
    match cmd {
        ImagesCommand::Prefetch(a) => prefetch(a).await,
        ImagesCommand::Gc(a) => super::images_gc::run(a).await,
    }
}

/// One (entry, host) to warm.
struct Job<'a> {
    handle: &'a ProviderHandle,
    host: String,
}

fn targets<'a>(providers: &'a Providers, a: &PrefetchArgs) -> Result<Vec<Job<'a>>, UsageError> {
    let entries: Vec<&ProviderHandle> = match &a.entry {
        Some(e) => {
            let h = providers.get(e).ok_or_else(|| {
                let known: Vec<&str> = providers.iter().map(|h| h.config.name.as_str()).collect();
                UsageError::new(format!(
                    "no provider entry {e:?} in the config (entries: {})",
                    known.join(", ")
                ))
            })?;
            let is_url = a.key.starts_with("http://") || a.key.starts_with("https://");
            if !is_url && !h.config.images.contains_key(&a.key) {
                return Err(UsageError::new(format!(
                    "entry {e} has no image {:?} in its catalogue (keys: {})",
                    a.key,
                    keys(h)
                )));
            }
            vec![h]
        }
        None => {
            let v: Vec<&ProviderHandle> = providers
                .iter()
                .filter(|h| h.config.images.contains_key(&a.key))
                .collect();
            if v.is_empty() {
                return Err(UsageError::new(format!(
                    "no provider entry has an image {:?} in its catalogue ({}); to prefetch a \
                     URL, name the entry with --entry",
                    a.key,
                    providers
                        .iter()
                        .map(|h| format!("{}: {}", h.config.name, keys(h)))
                        .collect::<Vec<_>>()
                        .join("; ")
                )));
            }
            v
        }
    };
    let mut jobs = Vec::new();
    for h in entries {
        for host in &h.config.hosts {
            if a.host.as_ref().is_none_or(|want| *want == host.name) {
                jobs.push(Job {
                    handle: h,
                    host: host.name.clone(),
                });
            }
        }
    }
    if jobs.is_empty()
        && let Some(want) = &a.host
    {
        return Err(UsageError::new(format!(
            "no host {want:?} in the selected entr{}",
            if a.entry.is_some() { "y" } else { "ies" }
        )));
    }
    Ok(jobs)
}

fn keys(h: &ProviderHandle) -> String {
    if h.config.images.is_empty() {
        "none".into()
    } else {
        h.config
            .images
            .keys()
            .cloned()
            .collect::<Vec<_>>()
            .join(", ")
    }
}

async fn prefetch(a: PrefetchArgs) -> anyhow::Result<u8> {
    let cfg = load_config(&a.config.config)?;
    super::check::missing_ssh_files(&cfg)?;
    // NB: a prefetch writes bases, never an ownership mark: the config's own ID, if any.
    let providers = providers::open(&cfg, &Installation::ConfigOnly)
        .map_err(|e| UsageError::new(e.to_string()))?;
    let jobs = targets(&providers, &a)?;
    let multi = MultiProgress::with_draw_target(indicatif::ProgressDrawTarget::stderr());
    let key = a.key.as_str();
    let results: Vec<(String, Result<String, String>)> = futures_util::stream::iter(jobs)
        .map(|j| {
            let bar = Bar::new(&multi, &format!("{}/{}", j.handle.config.name, j.host));
            async move {
                let label = format!("{}/{}", j.handle.config.name, j.host);
                let budget = j.handle.config.timeouts.image_import + PREFETCH_SLACK;
                let started = Instant::now();
                let res =
                    tokio::time::timeout(budget, j.handle.provider.prefetch(&j.host, key, &bar))
                        .await;
                bar.finish();
                let took = started.elapsed();
                let line = match res {
                    Ok(Ok(())) if bar.moved() => Ok(format!(
                        "ready: imported {} in {:.1}s",
                        table::bytes(bar.done()),
                        took.as_secs_f64()
                    )),
                    Ok(Ok(())) => Ok("ready: already cached".to_owned()),
                    Ok(Err(e)) => Err(super::messages::plain(&e.to_string())),
                    Err(_) => Err(format!("did not finish within {budget:?}")),
                };
                (label, line)
            }
        })
        .buffer_unordered(PREFETCH_PARALLEL)
        .collect()
        .await;
    let mut sorted = results;
    sorted.sort_by(|x, y| x.0.cmp(&y.0));
    let failed = sorted.iter().filter(|(_, r)| r.is_err()).count();
    let code = if failed == 0 { EXIT_OK } else { EXIT_FAILED };
    let doc = PrefetchDocument {
        key: key.to_owned(),
        failed,
        hosts: sorted
            .iter()
            .map(|(label, r)| PrefetchHost {
                host: label.clone(),
                ready: r.is_ok(),
                message: r.clone().unwrap_or_else(|e| e),
            })
            .collect(),
    };
    if let Some(text) = super::output::document(&doc, super::output::format(false))? {
        println!("{text}");
        return Ok(code);
    }
    for (label, r) in &sorted {
        match r {
            Ok(line) => println!("{label}: {line}"),
            Err(e) => println!("{label}: FAILED: {e}"),
        }
    }
    if failed == 0 {
        println!("{key} is ready on {} host(s)", sorted.len());
    } else {
        println!("{key} failed on {failed} of {} host(s)", sorted.len());
    }
    Ok(code)
}

/// What `images prefetch -o json|yaml` prints.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct PrefetchDocument {
    /// The catalogue key or URL prefetched.
    key: String,
    /// Hosts that failed.
    failed: usize,
    /// One row per host, sorted by `entry/host`.
    hosts: Vec<PrefetchHost>,
}

/// One host's prefetch result.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct PrefetchHost {
    /// `entry/host`.
    host: String,
    /// Whether the base is ready there.
    ready: bool,
    /// What happened (or why it failed).
    message: String,
}
