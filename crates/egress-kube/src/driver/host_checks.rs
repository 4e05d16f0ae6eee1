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
//!
//! Hosts declared dead (the `fence.egress-proxies.dev/HOST` annotations on the entry's
//! ProviderHealth, [`crate::fence`]), after each check of the entry:
//! - a declaration frees what the host's instances held (the provider's `fence_host`, as in
//!   standalone mode) only while this check found the host dead (`Unreachable` or
//!   `Timeout`), and once per declaration (host and annotation value) per term: a declaration
//!   read again after the host answered never frees what its live instances hold, since the
//!   term forgets it only once the annotation is gone;
//! - a host that answers has its annotation removed with a JSON patch that first tests the
//!   value read, so a newer declaration written meanwhile stays; logged; until the removal
//!   succeeds the row says `Removing`, and a declaration in that state never applies again,
//!   in this term or the next leader's (it reads the row back);
//! - the host's row shows the declaration (`fenced`); annotations naming no host of the
//!   entry, or with a bad value, are never applied and are named by the `FenceDeclarations`
//!   condition and a warning.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
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
use crate::api::{
    ProviderHealth, ProviderHealthStatus, ProviderHostFence, ProviderHostState, ProviderHostStatus,
};
use crate::fence;
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
    /// Declarations this term applied: (entry, host, reason) → (when, what was freed). Kept
    /// until the annotation is gone, so the same declaration never applies twice.
    fenced: Mutex<HashMap<DeclarationKey, (String, Vec<String>)>>,
}

/// A declaration: (entry, host, reason).
type DeclarationKey = (String, String, String);

/// The condition naming fence annotations that are not applied.
pub const CONDITION_FENCE_DECLARATIONS: &str = "FenceDeclarations";

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
            fenced: Mutex::new(HashMap::new()),
        }
    }

    /// Applies `entry`'s declarations after a check (`reports`): see the module doc. Returns
    /// each declared host's row state and the problems to report.
    async fn apply_declarations(
        &self,
        handle: &egress_core::providers::ProviderHandle,
        annotations: &std::collections::BTreeMap<String, String>,
        previous: Option<&ProviderHealthStatus>,
        reports: &[egress_provider::HostReport],
        now: &str,
    ) -> (HashMap<String, ProviderHostFence>, Vec<fence::Problem>) {
        let entry = &handle.config.name;
        let hosts: Vec<&str> = handle
            .config
            .hosts
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        let (decls, problems) = fence::parse(annotations, &hosts);
        // A declaration whose annotation is gone (or changed) is forgotten: a new one applies.
        egress_provider::sync::lock(&self.fenced).retain(|(e, h, r), _| {
            e != entry || decls.iter().any(|d| &d.host == h && &d.reason == r)
        });
        let mut rows = HashMap::new();
        for d in decls {
            let Some(r) = reports.iter().find(|r| r.host == d.host) else {
                continue;
            };
            let k = (entry.clone(), d.host.clone(), d.reason.clone());
            let mut row = ProviderHostFence {
                reason: egress_core::model::truncate(&d.reason, fence::MAX_REASON_CHARS),
                state: "Waiting".to_owned(),
                applied_at: None,
                freed: Vec::new(),
                message: None,
            };
            let applied = egress_provider::sync::lock(&self.fenced).get(&k).cloned();
            // NB: a declaration whose host answered (this or an earlier term was removing it)
            // is stale: it never applies again, even after a change of leader.
            let stale = previous
                .and_then(|p| p.hosts.iter().find(|x| x.host == d.host))
                .and_then(|x| x.fenced.as_ref())
                .is_some_and(|f| f.state == "Removing" && f.reason == row.reason);
            let dead = egress_core::host_health::is_dead(Some(r.state));
            match fence::decide(dead, applied.is_some(), stale) {
                fence::Action::Stale => {
                    row.state = "Removing".to_owned();
                    row.message = Some(
                        "the host answered since this declaration: not applied; write a new \
                         reason to declare it dead again"
                            .to_owned(),
                    );
                }
                fence::Action::AlreadyApplied => {
                    if let Some((at, freed)) = applied {
                        row.state = "Applied".to_owned();
                        row.applied_at = Some(at);
                        row.freed = freed;
                    }
                }
                fence::Action::Apply => match handle.provider.fence_host(&d.host) {
                    Ok(freed) => {
                        let freed: Vec<String> = freed.iter().map(ToString::to_string).collect();
                        tracing::warn!(
                            entry = %entry,
                            host = %d.host,
                            reason = %d.reason,
                            freed = ?freed,
                            "host declared dead by an administrator: what its instances \
                             held may move to other hosts of its segment"
                        );
                        egress_provider::sync::lock(&self.fenced)
                            .insert(k, (now.to_owned(), freed.clone()));
                        row.state = "Applied".to_owned();
                        row.applied_at = Some(now.to_owned());
                        row.freed = freed;
                    }
                    Err(e) => {
                        tracing::warn!(
                            entry = %entry,
                            host = %d.host,
                            "applying the declaration that the host is dead: {e}"
                        );
                        row.message = Some(egress_core::model::truncate(
                            &egress_provider::error::redact(&e.to_string()),
                            crate::api::MAX_HOST_STRING_CHARS,
                        ));
                    }
                },
                fence::Action::Remove => {
                    // NB: it answered: its listings say what it holds; the declaration must not
                    // apply again. The term forgets it only once the annotation is gone.
                    row.state = "Removing".to_owned();
                    let patch = Patch::<()>::Json(fence::removal_patch(&d.host, &d.reason));
                    let params = PatchParams::default();
                    // rbac: PROVIDER_HEALTHS patch
                    let call = self.api.patch(entry, &params, &patch);
                    match tokio::time::timeout(API_SLACK, call).await {
                        Ok(Ok(_)) => {
                            tracing::info!(
                                entry = %entry,
                                host = %d.host,
                                reason = %d.reason,
                                "a host declared dead answered again: its fence annotation is \
                                 removed (nothing was freed by this check)"
                            );
                            egress_provider::sync::lock(&self.fenced).remove(&k);
                            continue;
                        }
                        Ok(Err(kube::Error::Api(e))) if e.code == 409 || e.code == 422 => {
                            tracing::info!(
                                entry = %entry,
                                host = %d.host,
                                "the fence annotation changed meanwhile: kept for the next check"
                            );
                        }
                        Ok(Err(e)) => tracing::warn!(
                            entry = %entry,
                            host = %d.host,
                            error = %e,
                            "removing the fence annotation of a host that answered failed"
                        ),
                        Err(_) => tracing::warn!(
                            entry = %entry,
                            host = %d.host,
                            "removing the fence annotation of a host that answered timed out"
                        ),
                    }
                }
            }
            rows.insert(d.host.clone(), row);
        }
        for p in &problems {
            tracing::warn!(entry = %entry, "ProviderHealth {entry}: {p}");
        }
        (rows, problems)
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
        let name = h.config.name.clone();
        let spec = json!({"apiVersion": api_version(), "kind": "ProviderHealth",
                          "metadata": {"name": name}, "spec": {"provider": name}});
        let pp = PatchParams::apply(FIELD_MANAGER).force();
        // rbac: PROVIDER_HEALTHS patch (create when new)
        let written =
            match tokio::time::timeout(API_SLACK, self.api.patch(&name, &pp, &Patch::Apply(&spec)))
                .await
            {
                Ok(Ok(ph)) => ph,
                Ok(Err(e)) => {
                    tracing::warn!(entry = %name, error = %e, "ProviderHealth write failed");
                    return;
                }
                Err(_) => {
                    tracing::warn!(entry = %name, "ProviderHealth write timed out");
                    return;
                }
            };
        let annotations = written.metadata.annotations.clone().unwrap_or_default();
        let (mut fenced, problems) = self
            .apply_declarations(h, &annotations, written.status.as_ref(), reports, &now)
            .await;
        // The operator's own /status shows the same declarations as the ProviderHealth.
        let shown: HashMap<String, egress_core::host_health::HostFence> = fenced
            .iter()
            .map(|(host, f)| (host.clone(), host_fence(f)))
            .collect();
        self.observer.set_fenced(&h.config.name, &shown);
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
                s.fenced = fenced.remove(&r.host);
                s
            })
            .collect();
        let ready = hosts
            .iter()
            .filter(|x| x.state == ProviderHostState::Ready)
            .count();
        let all_ready = ready == hosts.len() && !hosts.is_empty();
        let mut conditions = vec![Condition::new(
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
        )];
        if !problems.is_empty() {
            let msg: Vec<String> = problems.iter().map(ToString::to_string).collect();
            conditions.push(Condition::new(
                CONDITION_FENCE_DECLARATIONS,
                ConditionStatus::False,
                "NotApplied",
                &msg.join("; "),
                &now,
                1,
            ));
        }
        let status = ProviderHealthStatus {
            host_count: u32::try_from(hosts.len()).unwrap_or(u32::MAX),
            ready_hosts: u32::try_from(ready).unwrap_or(u32::MAX),
            checked_at: Some(now.clone()),
            conditions,
            hosts,
            observed_generation: 1,
        };
        let st = json!({"apiVersion": api_version(), "kind": "ProviderHealth",
                        "status": status});
        // rbac: PROVIDER_HEALTHS_STATUS patch
        let st = Patch::Apply(&st);
        let write = self.api.patch_status(&name, &pp, &st);
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

/// A ProviderHealth host row's declaration as the status document's host rows carry it.
fn host_fence(f: &ProviderHostFence) -> egress_core::host_health::HostFence {
    egress_core::host_health::HostFence {
        reason: f.reason.clone(),
        state: f.state.clone(),
        applied_at: f.applied_at.clone(),
        freed: f.freed.clone(),
        message: f.message.clone(),
    }
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
