//! The standalone driver's side of the shared background workers
//! ([`egress_core::background`]): [`Shared`] is where the providers, the live set and the
//! probe targets come from, and where host rows, GC results and health states go.
//!
//! Guarantees:
//! - GC's live set is every Proxy this process knows (deleting ones included), taken before
//!   listing; a pass is skipped while the manifest directory cannot be listed or adoption is
//!   not complete.
//! - GC follows the `gc` command's empty-set rule ([`StandaloneGc`]): while this process knows
//!   no Proxy at all, no pass runs unless the empty set was allowed, and the refusal is logged
//!   when it starts and when it ends, not on every pass.
//! - An entry whose host check missed [`CHECK_DEADLINE`] is recorded as `Timeout` on every
//!   host, so placement avoids it too.
//! - After each health round every Proxy's health is merged into its status (`Healthy`,
//!   `Ready` = Running ∧ Healthy).
//! - A good config reload replaces the providers everywhere and re-queues every Proxy; a bad
//!   one keeps the running config.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::SystemTime;

use egress_core::background::config_watch::{Compare, Reload, WatchedFiles};
use egress_core::background::gc::GcDriver;
use egress_core::background::host_checks::{self, HostCheckDriver, HostCheckSettings};
use egress_core::background::proxy_health::ProxyHealthDriver;
use egress_core::config;
use egress_core::gc::{self, GcReport};
use egress_core::health::{self, HealthEngine, ProbeTarget, RoundReport};
use egress_core::hosthealth::{self, EntryCheck};
use egress_core::providers::{BuildOptions, Providers};
use egress_core::status::HostRow;
use egress_provider::ProxyUid;

use crate::shared::Shared;
use crate::{CHECK_DEADLINE, lock};

/// How the standalone driver checks hosts: every `interval`, entries in parallel as the
/// core's bounded fan-out allows.
pub(crate) fn host_check_settings(interval: std::time::Duration) -> HostCheckSettings {
    HostCheckSettings {
        interval,
        deadline: CHECK_DEADLINE,
        max_parallel_entries: hosthealth::DEFAULT_MAX_PARALLEL_ENTRIES,
    }
}

impl GcDriver for Shared {
    fn providers(&self) -> Arc<Providers> {
        Shared::providers(self)
    }

    async fn live_set(&self) -> Option<HashSet<ProxyUid>> {
        if !self.directory_ok.load(Ordering::SeqCst) || !self.ready.load(Ordering::SeqCst) {
            tracing::warn!("GC skipped: manifests unreadable or adoption not complete");
            return None;
        }
        // NB: the live set is taken before listing (GC's contract): every Proxy this process
        // knows, deleting ones included, so GC never races the reconciler's own deletes.
        Some(lock(&self.objects).keys().copied().collect())
    }

    fn collected(&self, report: &GcReport) {
        let deleted = report.deleted_of(gc::ItemKind::Instance);
        for i in report.with_action(gc::Action::Deleted) {
            tracing::info!(entry = %i.entry, host = %i.host, name = %i.name, reason = %i.reason, "GC deleted");
        }
        for i in report.with_action(gc::Action::Failed) {
            tracing::warn!(entry = %i.entry, host = %i.host, name = %i.name, reason = %i.reason, "GC deletion failed");
        }
        for e in &report.entries {
            if e.instances_error.is_none() {
                // The listing is complete: refresh where instances are.
                self.controller.adopt(&e.entry, &e.listed);
            }
        }
        self.metrics.gc_ran(
            if report.is_clean() {
                "ok"
            } else {
                "incomplete"
            },
            u64::try_from(deleted).unwrap_or(u64::MAX),
        );
    }
}

/// Standalone's GC driver: [`Shared`]'s live set under the `gc` command's empty-set rule.
///
/// Guarantees: with `allow_empty` false, a pass whose live set is empty is skipped (an empty or
/// wrong manifest directory would otherwise make every instance an orphan); the refusal is
/// logged at WARN once when it begins and at INFO once when Proxies appear again.
pub(crate) struct StandaloneGc {
    shared: Arc<Shared>,
    allow_empty: bool,
    refusing: AtomicBool,
}

impl StandaloneGc {
    /// GC over `shared`'s Proxies; `allow_empty` lets a pass collect with no Proxy known.
    pub(crate) fn new(shared: Arc<Shared>, allow_empty: bool) -> Self {
        Self {
            shared,
            allow_empty,
            refusing: AtomicBool::new(false),
        }
    }
}

impl GcDriver for StandaloneGc {
    fn providers(&self) -> Arc<Providers> {
        Shared::providers(&self.shared)
    }

    async fn live_set(&self) -> Option<HashSet<ProxyUid>> {
        let live = GcDriver::live_set(self.shared.as_ref()).await?;
        let refuse = live.is_empty() && !self.allow_empty;
        let was = self.refusing.swap(refuse, Ordering::SeqCst);
        if refuse && !was {
            tracing::warn!(
                "GC skipped: no Proxy manifest is known, so every instance would count as an \
                 orphan; check --proxies, or pass --gc-allow-empty if no Proxy should exist"
            );
        } else if !refuse && was {
            tracing::info!(
                proxies = live.len(),
                "GC resumed: Proxy manifests are known again"
            );
        }
        (!refuse).then_some(live)
    }

    fn collected(&self, report: &GcReport) {
        GcDriver::collected(self.shared.as_ref(), report);
    }
}

impl HostCheckDriver for Shared {
    fn providers(&self) -> Arc<Providers> {
        Shared::providers(self)
    }

    /// Feeds placement ([`egress_core::controller::Controller::record_host_reports`]), the
    /// `/status` host rows, `/hosts` and the host metrics.
    async fn entry_checked(&self, check: EntryCheck, now: SystemTime) {
        let entry = check.handle.config.name.clone();
        let rows = check.rows(CHECK_DEADLINE, now);
        let reports = match &check.reports {
            Some(r) => r.clone(),
            None => host_checks::timeout_reports(&check),
        };
        self.controller.record_host_reports(&entry, &reports);
        if let Some(engine) = &self.health {
            engine.hosts_reported(&entry, &reports);
        }
        let mut hosts = lock(&self.hosts);
        let mut full = lock(&self.host_health);
        for row in rows {
            let ready = row.state == "Ready";
            let latency = check
                .reports
                .as_ref()
                .and_then(|rs| rs.iter().find(|r| r.host == row.host))
                .and_then(|r| r.latency)
                .map(|l| l.as_secs_f64());
            self.metrics.host_checked(&entry, &row.host, ready, latency);
            let addresses = check
                .reports
                .as_ref()
                .and_then(|rs| rs.iter().find(|r| r.host == row.host))
                .map(|r| r.addresses.as_slice())
                .unwrap_or_default();
            self.metrics.host_addresses(&entry, &row.host, addresses);
            hosts.insert(
                (entry.clone(), row.host.clone()),
                HostRow {
                    entry: entry.clone(),
                    host: row.host.clone(),
                    state: row.state.clone(),
                    latency_ms: row.latency_ms,
                    error: row.error.clone(),
                },
            );
            full.insert((entry.clone(), row.host.clone()), row);
        }
    }

    /// Nothing: rows of removed entries are dropped when the config is reloaded.
    async fn round_done(&self, _providers: &Providers) {}
}

impl ProxyHealthDriver for Shared {
    fn targets(&self) -> Vec<ProbeTarget> {
        lock(&self.objects)
            .iter()
            .filter(|(_, o)| !o.object.deleting)
            .filter_map(|(uid, o)| {
                ProbeTarget::of(
                    *uid,
                    format!("{}/{}", o.object.namespace, o.object.name),
                    &o.object.spec.provider,
                    &o.object.spec.proxy,
                    o.object.credentials.as_ref(),
                    &o.status,
                )
            })
            .collect()
    }

    fn known(&self) -> HashSet<ProxyUid> {
        lock(&self.objects).keys().copied().collect()
    }

    fn round_done(&self, engine: &HealthEngine, _report: &RoundReport) {
        let now = SystemTime::now();
        lock(&self.objects).for_each_mut(|uid, o| {
            let previous = o.status.clone();
            health::apply_to_status(
                &mut o.status,
                engine.get(uid).as_ref(),
                Some(&previous),
                now,
                o.object.generation,
            );
        });
    }
}

/// The config file as the standalone driver watches it: a change of size or modification
/// time (no SSH directory: key files are named in the config).
pub(crate) fn watched_config(path: &Path) -> WatchedFiles {
    WatchedFiles {
        config: path.to_path_buf(),
        dirs: Vec::new(),
        compare: Compare::SizeAndModified,
    }
}

/// Loads the config at `path` and builds its providers (blocking: file I/O).
pub(crate) fn reload_from(path: PathBuf) -> Reload {
    Arc::new(move || {
        let mut cfg = config::load(&path).map_err(|e| e.to_string())?;
        let id_dir = config::installation::standalone_dir(Some(&path), &path);
        config::installation::fill_standalone(&mut cfg, &id_dir).map_err(|e| e.to_string())?;
        Providers::from_config(&cfg, &BuildOptions::default())
            .map_err(|e| format!("cannot build providers: {e}"))
    })
}

impl Shared {
    /// Puts reloaded providers in effect: the controller, the host rows, and every Proxy
    /// re-queued (which releases latches of changed entries).
    pub(crate) fn providers_reloaded(&self, p: Providers, path: &Path) {
        let p = Arc::new(p);
        self.controller.set_providers(Arc::clone(&p));
        *self
            .providers
            .write()
            .unwrap_or_else(PoisonError::into_inner) = p;
        self.seed_host_rows();
        tracing::info!(path = %path.display(), "provider config reloaded");
        let uids: Vec<ProxyUid> = lock(&self.objects).keys().copied().collect();
        for u in uids {
            self.queue.add(u);
        }
    }
}
