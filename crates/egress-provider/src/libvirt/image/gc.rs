//! Collecting unused bases: a base nothing on its host uses, unused for the entry's grace
//! period (`limits.unusedBaseGraceMinutes`), is removed with its marker and data volume.
//! So is an *unpublished* base (the final name without its marker, left by an import that
//! died between creating it and marking it: a crash, or a host failing at that moment in
//! another process or before a restart) once its upload is older than the entry's
//! `timeouts.imageImport` plus the grace: no import publishes it any more, and left there it
//! would make every later import of that image on the host wait for a marker nobody writes.
//! The operator's GC runs this every pass; `egress-proxies images gc` runs it once.
//!
//! Guarantees:
//! - "in use" is read on the host itself, exactly as eviction reads it ([`evict::usage`]):
//!   any domain (ours or not, running or shut off, live chain or next definition) naming the
//!   base or its data volume, any volume of the pool backed by either, a base this process
//!   handed to a create within [`evict::RECENT_USE`], and nothing at all on a host where a
//!   shut-off domain has a disk chain libvirt does not show. Our own records (marks, the
//!   address book) are never what keeps or frees a base;
//! - an unpublished base is judged by the same "in use" rules and then by its upload time
//!   alone (from its data volume's name, written by the importing process): an import's
//!   deadline starts before its upload, so past `timeouts.imageImport` none is running; the
//!   grace is added as a margin for a slow clock;
//! - a base in use is never removed, and the unused count restarts whenever a pass finds it
//!   in use; a base's unused time never starts before its upload, so a base imported or
//!   prefetched less than the grace ago stays;
//! - with [`UnusedClock::FirstSeen`] the unused time counts from the first pass of this
//!   process that found the base unused (kept in memory: a restart starts it again, which
//!   only delays a removal); with [`UnusedClock::Upload`] it counts from the upload;
//! - a base whose age or data volume cannot be read is kept and reported;
//! - the removal runs under the import lock of the base's source (a running import of that
//!   image in this process keeps it) and re-checks the recent use under it, so a create in
//!   this process that took the base meanwhile keeps it, and one that comes later imports it
//!   again; a dry run removes nothing;
//! - one host failing (unreachable, a read refused) is one verdict for that host; the other
//!   hosts are still collected.
//!
//! Not covered (as for eviction): another process that finds the base published and defines
//! an overlay on it between this pass's reads and the removal; its create then fails
//! Transient and its retry imports the image again.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use libvirt_remote::Client;
use libvirt_remote::proto::StoragePool;

use super::{cache, evict, import_lock};
use crate::bases::{BaseAction, BaseGcSettings, BaseVerdict, UnusedClock};
use crate::error::Result;
use crate::libvirt::classify::classify;
use crate::libvirt::names;

/// When each base was first found unused by this process, per `host/pool/base`.
#[derive(Debug, Default)]
pub struct UnusedSince {
    seen: Mutex<HashMap<String, SystemTime>>,
}

impl UnusedSince {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, SystemTime>> {
        crate::sync::lock(&self.seen)
    }
}

/// One host of an entry, as a pass sees it.
pub struct HostScope<'a> {
    /// The entry's name.
    pub entry: &'a str,
    /// The host's name in the entry.
    pub host: &'a str,
    /// The pooled control connection.
    pub client: &'a Client,
    /// The host's pool.
    pub pool: &'a StoragePool,
    /// The entry's `timeouts.imageImport`: a base without its marker whose upload is older
    /// than this plus the grace has no import left to publish it.
    pub import_timeout: Duration,
}

/// Collects the entry's unused bases on one host (see the module guarantees). `grace` is the
/// grace in effect. Fails only when the host cannot be read as a whole; each base's outcome is
/// one verdict.
pub async fn collect_host(
    scope: &HostScope<'_>,
    settings: &BaseGcSettings,
    grace: Duration,
    seen: &UnusedSince,
) -> Result<Vec<BaseVerdict>> {
    let (c, pool, host, entry) = (scope.client, scope.pool, scope.host, scope.entry);
    let vols = c
        .pool_list_volumes(pool)
        .await
        .map_err(|e| classify(&e, &format!("listing pool {} on host {host}", pool.name)))?;
    let prefix = names::base_prefix(entry);
    let listed: HashSet<&str> = vols.iter().map(|v| v.name.as_str()).collect();
    let marked = vols
        .iter()
        .filter_map(|v| v.name.strip_suffix(cache::MARKER_SUFFIX))
        .filter(|b| b.starts_with(&prefix));
    // NB: a base name without its marker: being published, or left by an import that died
    // between the two (judged by age below).
    let unmarked = vols.iter().map(|v| v.name.as_str()).filter(|n| {
        n.starts_with(&prefix)
            && !n.contains(cache::PART_INFIX)
            && !n.ends_with(cache::MARKER_SUFFIX)
            && !listed.contains(cache::marker_name(n).as_str())
    });
    let bases: Vec<String> = marked.chain(unmarked).map(str::to_owned).collect();
    let key = |base: &str| format!("{host}/{}/{base}", pool.name);
    if bases.is_empty() {
        forget_host(seen, &key(""), &HashSet::new());
        return Ok(Vec::new());
    }
    let usage = evict::usage(c, pool, host, entry, &bases).await?;
    let verdict =
        |name: &str, action: BaseAction, rule: &'static str, reason: String| BaseVerdict {
            entry: entry.to_owned(),
            host: host.to_owned(),
            name: name.to_owned(),
            action,
            rule,
            reason,
        };
    let mut out = Vec::with_capacity(bases.len());
    for (name, why) in &usage.unreadable {
        out.push(verdict(
            name,
            BaseAction::Kept,
            "base-age-unknown",
            format!("kept: {why}"),
        ));
    }
    let present: HashSet<String> = usage.bases.iter().map(|(k, _)| key(&k.name)).collect();
    forget_host(seen, &key(""), &present);
    for (k, user) in usage.bases {
        let base_key = key(&k.name);
        if let Some(user) = user {
            seen.lock().remove(&base_key);
            out.push(verdict(
                &k.name,
                BaseAction::Kept,
                "base-in-use",
                format!("in use by {user}"),
            ));
            continue;
        }
        if evict::recently_used(host, &pool.name, &k.name) {
            seen.lock().remove(&base_key);
            out.push(verdict(
                &k.name,
                BaseAction::Kept,
                "base-in-use",
                format!(
                    "handed to a create by this process within the last {}s",
                    evict::RECENT_USE.as_secs()
                ),
            ));
            continue;
        }
        if let Some(why) = &usage.blocked {
            seen.lock().remove(&base_key);
            out.push(verdict(
                &k.name,
                BaseAction::Kept,
                "base-chain-unseen",
                format!("kept: no base is removed on this host while {why}"),
            ));
            continue;
        }
        let uploaded = UNIX_EPOCH + Duration::from_secs(k.created_unix);
        let (rule, reason) = if k.published {
            match unused_reason(&base_key, uploaded, settings, grace, seen) {
                Ok(r) => ("base-unused", r),
                Err(kept) => {
                    out.push(verdict(&k.name, BaseAction::Kept, "base-in-grace", kept));
                    continue;
                }
            }
        } else {
            // NB: no process publishes a base whose upload is older than its import budget:
            // the import's deadline is counted from before the upload.
            let limit = scope.import_timeout.saturating_add(grace);
            let age = settings.now.duration_since(uploaded).unwrap_or_default();
            if age < limit {
                out.push(verdict(
                    &k.name,
                    BaseAction::Kept,
                    "base-unpublished",
                    format!(
                        "kept: it has no marker yet, and its import may still be publishing it \
                         (uploaded {}s ago; removed once older than timeouts.imageImport plus \
                         the grace, {}s)",
                        age.as_secs(),
                        limit.as_secs()
                    ),
                ));
                continue;
            }
            (
                "base-unpublished",
                format!(
                    "it has no marker: its import ended before publishing it (uploaded {}s ago, \
                     more than timeouts.imageImport plus the grace, {}s), and nothing on the \
                     host uses it",
                    age.as_secs(),
                    limit.as_secs()
                ),
            )
        };
        if settings.dry_run {
            out.push(verdict(&k.name, BaseAction::WouldRemove, rule, reason));
            continue;
        }
        let lock = import_lock(&k.lock_key(host, &pool.name, entry));
        let held = lock.try_lock();
        if held.is_err() || evict::recently_used(host, &pool.name, &k.name) {
            out.push(verdict(
                &k.name,
                BaseAction::Kept,
                "base-importing",
                "kept: this process is importing or handing out its image right now".into(),
            ));
            continue;
        }
        match evict::remove(c, pool, host, &k).await {
            Ok(()) => {
                seen.lock().remove(&base_key);
                tracing::info!(base = %k.name, host, pool = %pool.name, rule, "removed a base");
                out.push(verdict(&k.name, BaseAction::Removed, rule, reason));
            }
            Err(e) => out.push(verdict(
                &k.name,
                BaseAction::Failed,
                rule,
                format!("removing it failed: {e}"),
            )),
        }
    }
    Ok(out)
}

/// Why a published, unused base goes (`Ok`), or why it is kept in its grace (`Err`).
fn unused_reason(
    base_key: &str,
    uploaded: SystemTime,
    settings: &BaseGcSettings,
    grace: Duration,
    seen: &UnusedSince,
) -> std::result::Result<String, String> {
    let since = match settings.clock {
        UnusedClock::Upload => uploaded,
        UnusedClock::FirstSeen => {
            let first = *seen
                .lock()
                .entry(base_key.to_owned())
                .or_insert(settings.now);
            first.max(uploaded)
        }
    };
    let unused_for = settings.now.duration_since(since).unwrap_or_default();
    if unused_for < grace {
        return Err(format!(
            "unused for {}s, less than the grace of {}s ({})",
            unused_for.as_secs(),
            grace.as_secs(),
            match settings.clock {
                UnusedClock::Upload => "counted from its upload",
                UnusedClock::FirstSeen => {
                    "counted from the first pass that found it unused, or its upload"
                }
            }
        ));
    }
    Ok(format!(
        "nothing on the host uses it and it has been unused for {}s (grace {}s)",
        unused_for.as_secs(),
        grace.as_secs()
    ))
}

/// Drops the first-seen times of bases under `prefix` (one host's pool) that are no longer
/// there, so the table holds only what the pools hold.
fn forget_host(seen: &UnusedSince, prefix: &str, present: &HashSet<String>) {
    seen.lock()
        .retain(|k, _| !k.starts_with(prefix) || present.contains(k));
}
