//! The standalone driver's side of the shared host check task
//! ([`egress_core::background::host_checks`]): each entry's result feeds placement (the
//! controller), the [`Store`]'s host rows (`/hosts`, `/status`) and the host metrics.
//!
//! Guarantees: every configured host has a row from the start (`Unknown` before its first
//! check, [`seed_rows`]); an entry whose check missed [`CHECK_DEADLINE`] is recorded as
//! `Timeout` on every host, so placement avoids it too; rows of hosts no longer configured
//! go when the config is reloaded; after each entry's check, the hosts an administrator
//! declared dead are applied (see [`crate::fenced_hosts`]).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::SystemTime;

use egress_core::background::host_checks::{self, HostCheckDriver, HostCheckSettings};
use egress_core::host_health::{self, EntryCheck, HostHealth};
use egress_core::providers::Providers;
use egress_provider::sync::lock;

use crate::context::Context;
use crate::settings::CHECK_DEADLINE;
use crate::store::Store;

/// How the standalone driver checks hosts: every `interval`, entries in parallel as the
/// core's bounded fan-out allows.
pub(crate) fn host_check_settings(interval: std::time::Duration) -> HostCheckSettings {
    HostCheckSettings {
        interval,
        deadline: CHECK_DEADLINE,
        max_parallel_entries: host_health::DEFAULT_MAX_PARALLEL_ENTRIES,
    }
}

/// Adds an `Unknown` row for every configured host without one; drops rows (and host
/// metrics) of hosts no longer configured.
pub(crate) fn seed_rows(store: &Store, ctx: &Context) {
    let providers = ctx.providers();
    let mut hosts = lock(&store.hosts);
    let mut keep = HashSet::new();
    for h in providers.iter() {
        for c in &h.config.hosts {
            let key = (h.config.name.clone(), c.name.clone());
            keep.insert(key.clone());
            hosts
                .entry(key)
                .or_insert_with(|| HostHealth::unknown(&h.config.name, &c.name));
        }
    }
    hosts.retain(|k, _| keep.contains(k));
    drop(hosts);
    ctx.metrics
        .retain_hosts(|e, h| keep.contains(&(e.to_owned(), h.to_owned())));
}

/// The host check task's view of this driver.
pub(crate) struct HostChecks {
    store: Arc<Store>,
    ctx: Arc<Context>,
    /// Declarations of dead hosts applied by this process.
    fenced: crate::fenced_hosts::Applied,
}

impl HostChecks {
    /// Host checks recorded into `store`, acting through `ctx`.
    pub(crate) fn new(store: Arc<Store>, ctx: Arc<Context>) -> Self {
        Self {
            store,
            ctx,
            fenced: Default::default(),
        }
    }
}

impl HostCheckDriver for HostChecks {
    fn providers(&self) -> Arc<Providers> {
        self.ctx.providers()
    }

    /// Feeds placement ([`egress_core::controller::Controller::record_host_reports`]), the
    /// host rows and the host metrics.
    async fn entry_checked(&self, check: EntryCheck, now: SystemTime) {
        let entry = check.handle.config.name.clone();
        let rows = check.rows(CHECK_DEADLINE, now);
        let reports = match &check.reports {
            Some(r) => r.clone(),
            None => host_checks::timeout_reports(&check),
        };
        self.ctx.controller.record_host_reports(&entry, &reports);
        // NB: only real reports: a check that missed its deadline told the provider nothing.
        let mut fenced = match &check.reports {
            Some(r) => {
                crate::fenced_hosts::apply(&self.ctx.manifest_dir, &check.handle, r, &self.fenced)
            }
            None => Default::default(),
        };
        if let Some(engine) = &self.ctx.health {
            engine.hosts_reported(&entry, &reports);
        }
        let mut hosts = lock(&self.store.hosts);
        for mut row in rows {
            let key = (entry.clone(), row.host.clone());
            // NB: a check that missed its deadline told nothing about the declarations: the
            // row keeps what the last real check showed.
            row.fenced = if check.reports.is_some() {
                fenced.remove(&row.host)
            } else {
                hosts.get(&key).and_then(|r| r.fenced.clone())
            };
            let report = check
                .reports
                .as_ref()
                .and_then(|rs| rs.iter().find(|r| r.host == row.host));
            let latency = report.and_then(|r| r.latency).map(|l| l.as_secs_f64());
            self.ctx
                .metrics
                .host_checked(&entry, &row.host, row.state == "Ready", latency);
            let addresses = report.map(|r| r.addresses.as_slice()).unwrap_or_default();
            self.ctx
                .metrics
                .host_addresses(&entry, &row.host, addresses);
            hosts.insert(key, row);
        }
    }

    /// Nothing: rows of removed entries are dropped when the config is reloaded.
    async fn round_done(&self, _providers: &Providers) {}
}
