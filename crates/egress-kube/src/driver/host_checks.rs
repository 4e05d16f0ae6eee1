//! The Kubernetes driver's side of the shared host check task
//! ([`egress_core::background::host_checks`]): each entry's reports feed placement and the
//! observer, and are written as one [`ProviderHealth`] per entry with server-side apply;
//! after a round, the ProviderHealths of entries removed from the config are deleted.
//!
//! Guarantees: entries are checked one after another, each bounded by
//! [`super::CHECK_DEADLINE`], and each entry's write (bounded by [`super::API_SLACK`])
//! happens before the next entry's check; an entry whose check missed the deadline records
//! nothing; a failed write is logged and retried next round. The task runs only while
//! this replica leads (it is started with the term's stop token).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use egress_core::background::host_checks::{HostCheckDriver, HostCheckSettings};
use egress_core::controller::Controller as Core;
use egress_core::host_health::EntryCheck;
use egress_core::model::{Condition, ConditionStatus};
use egress_core::providers::Providers;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::watch;

use super::{API_SLACK, CHECK_DEADLINE, DriverStats, FIELD_MANAGER, api_version};
use crate::api::{ProviderHealth, ProviderHealthStatus, ProviderHostState, ProviderHostStatus};
use crate::observe::Observer;

/// How the Kubernetes driver checks hosts: every `interval`, one entry at a time.
pub(super) fn host_check_settings(interval: Duration) -> HostCheckSettings {
    HostCheckSettings {
        interval,
        deadline: CHECK_DEADLINE,
        max_parallel_entries: 1,
    }
}

/// Leader-only: feeds placement with every entry's host reports and writes one
/// [`ProviderHealth`] per entry.
pub(super) struct ProviderHealthWriter {
    api: Api<ProviderHealth>,
    core: Arc<Core>,
    providers: watch::Receiver<Arc<Providers>>,
    stats: Arc<DriverStats>,
    observer: Arc<Observer>,
}

impl ProviderHealthWriter {
    /// A writer for one term: `core` is the term's controller.
    pub(super) fn new(
        client: Client,
        core: Arc<Core>,
        providers: watch::Receiver<Arc<Providers>>,
        stats: Arc<DriverStats>,
        observer: Arc<Observer>,
    ) -> Self {
        Self {
            api: Api::all(client),
            core,
            providers,
            stats,
            observer,
        }
    }
}

impl HostCheckDriver for ProviderHealthWriter {
    fn providers(&self) -> Arc<Providers> {
        self.providers.borrow().clone()
    }

    async fn entry_checked(&self, check: EntryCheck, now: SystemTime) {
        let h = &check.handle;
        let Some(reports) = &check.reports else {
            tracing::warn!(entry = %h.config.name, "host check timed out");
            return;
        };
        self.core.record_host_reports(&h.config.name, reports);
        if let Some(engine) = self.observer.health() {
            engine.hosts_reported(&h.config.name, reports);
        }
        self.observer.record_hosts(&h.config.name, reports, now);
        self.observer.annotate_hosts(&h.config.name, &self.core);
        let now = rfc3339(now);
        let out = self.core.hosts_in_maintenance(&h.config.name);
        let hosts: Vec<ProviderHostStatus> = reports
            .iter()
            .map(|r| {
                let mut s = ProviderHostStatus::from_report(r, &now);
                s.maintenance =
                    out.iter()
                        .find(|(n, _, _)| *n == r.host)
                        .and_then(|(_, m, left)| {
                            egress_core::host_health::maintenance_state(*m, *left)
                        });
                s
            })
            .collect();
        let ready = hosts
            .iter()
            .filter(|x| x.state == ProviderHostState::Ready)
            .count();
        let all_ready = ready == hosts.len() && !hosts.is_empty();
        let status = ProviderHealthStatus {
            host_count: u32::try_from(hosts.len()).unwrap_or(u32::MAX),
            ready_hosts: u32::try_from(ready).unwrap_or(u32::MAX),
            checked_at: Some(now.clone()),
            conditions: vec![Condition::new(
                crate::api::CONDITION_READY,
                if all_ready {
                    ConditionStatus::True
                } else {
                    ConditionStatus::False
                },
                if all_ready {
                    "AllHostsReady"
                } else {
                    "HostsNotReady"
                },
                &format!("{ready} of {} hosts ready", hosts.len()),
                &now,
                1,
            )],
            hosts,
            observed_generation: 1,
        };
        let name = h.config.name.clone();
        let spec = json!({"apiVersion": api_version(), "kind": "ProviderHealth",
                          "metadata": {"name": name}, "spec": {"provider": name}});
        let st = json!({"apiVersion": api_version(), "kind": "ProviderHealth",
                        "status": status});
        let pp = PatchParams::apply(FIELD_MANAGER).force();
        let write = async {
            // rbac: PROVIDER_HEALTHS patch (create when new)
            self.api.patch(&name, &pp, &Patch::Apply(&spec)).await?;
            // rbac: PROVIDER_HEALTHS_STATUS patch
            self.api.patch_status(&name, &pp, &Patch::Apply(&st)).await
        };
        match tokio::time::timeout(API_SLACK, write).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::warn!(entry = %name, error = %e, "ProviderHealth write failed")
            }
            Err(_) => tracing::warn!(entry = %name, "ProviderHealth write timed out"),
        }
    }

    async fn round_done(&self, providers: &Providers) {
        let names: Vec<String> = providers.iter().map(|h| h.config.name.clone()).collect();
        self.observer.retain_entries(&names);
        match tokio::time::timeout(API_SLACK, delete_stale_provider_healths(&self.api, &names))
            .await
        {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot remove stale ProviderHealths"),
            Err(_) => tracing::warn!("removing stale ProviderHealths timed out"),
        }
        self.stats.health_rounds.fetch_add(1, Ordering::Relaxed);
    }
}

/// Deletes the ProviderHealths of entries no longer in the config (written by us: they carry
/// our field manager's `spec.provider` equal to their name).
async fn delete_stale_provider_healths(
    api: &Api<ProviderHealth>,
    entries: &[String],
) -> Result<(), kube::Error> {
    // rbac: PROVIDER_HEALTHS list
    let list = api.list(&ListParams::default()).await?;
    for ph in list.items {
        let name = ph.name_any();
        if !entries.contains(&name) && ph.spec.provider == name {
            tracing::info!(entry = %name, "provider entry removed: deleting its ProviderHealth");
            // rbac: PROVIDER_HEALTHS delete
            match api.delete(&name, &kube::api::DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

fn rfc3339(t: SystemTime) -> String {
    time::OffsetDateTime::from(t)
        .replace_nanosecond(0)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}
