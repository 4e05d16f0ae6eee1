//! The leader-only host health loop: checks every entry's hosts, feeds placement, and writes
//! one [`ProviderHealth`] per entry (stale ones of removed entries are deleted).
//!
//! Guarantees: each entry's check is bounded by [`super::CHECK_DEADLINE`], each write by
//! [`super::API_SLACK`]; a failed write is logged and retried next round.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use egress_core::controller::Controller as Core;
use egress_core::model::{Condition, ConditionStatus};
use egress_core::providers::Providers;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{API_SLACK, CHECK_DEADLINE, DriverStats, FIELD_MANAGER, api_version, sleep_or_stop};
use crate::api::{HostHealth, HostHealthState, ProviderHealth, ProviderHealthStatus};
use crate::observe::Observer;

/// Leader-only: checks every entry's hosts, feeds placement, and writes one
/// [`ProviderHealth`] per entry with server-side apply.
pub(super) async fn health_loop(
    client: Client,
    core: Arc<Core>,
    providers: watch::Receiver<Arc<Providers>>,
    interval: Duration,
    stats: Arc<DriverStats>,
    observer: Arc<Observer>,
    stop: CancellationToken,
) {
    let api: Api<ProviderHealth> = Api::all(client);
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    loop {
        let p = providers.borrow().clone();
        for h in p.iter() {
            let reports = tokio::select! {
                () = stop.cancelled() => return,
                r = tokio::time::timeout(CHECK_DEADLINE, h.provider.check()) => r,
            };
            let Ok(reports) = reports else {
                tracing::warn!(entry = %h.config.name, "host check timed out");
                continue;
            };
            core.record_host_reports(&h.config.name, &reports);
            observer.record_hosts(&h.config.name, &reports, SystemTime::now());
            let now = rfc3339(SystemTime::now());
            let hosts: Vec<HostHealth> = reports
                .iter()
                .map(|r| HostHealth::from_report(r, &now))
                .collect();
            let ready = hosts
                .iter()
                .filter(|x| x.state == HostHealthState::Ready)
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
            let write = async {
                // rbac: PROVIDER_HEALTHS patch (create when new)
                api.patch(&name, &pp, &Patch::Apply(&spec)).await?;
                // rbac: PROVIDER_HEALTHS_STATUS patch
                api.patch_status(&name, &pp, &Patch::Apply(&st)).await
            };
            match tokio::time::timeout(API_SLACK, write).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(entry = %name, error = %e, "ProviderHealth write failed")
                }
                Err(_) => tracing::warn!(entry = %name, "ProviderHealth write timed out"),
            }
        }
        let names: Vec<String> = p.iter().map(|h| h.config.name.clone()).collect();
        observer.retain_entries(&names);
        match tokio::time::timeout(API_SLACK, delete_stale_provider_healths(&api, &names)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot remove stale ProviderHealths"),
            Err(_) => tracing::warn!("removing stale ProviderHealths timed out"),
        }
        stats.health_rounds.fetch_add(1, Ordering::Relaxed);
        if !sleep_or_stop(interval, &stop).await {
            return;
        }
    }
}

/// Deletes the ProviderHealths of entries no longer in the config (written by us: they carry
/// our field manager's `spec.provider` equal to their name).
pub(super) async fn delete_stale_provider_healths(
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

pub(super) fn rfc3339(t: SystemTime) -> String {
    time::OffsetDateTime::from(t)
        .replace_nanosecond(0)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}
