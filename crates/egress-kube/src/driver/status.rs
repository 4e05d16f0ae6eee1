//! Status publishing: the publishing pass that merges health (from the proxy health task,
//! [`super::proxy_health`]) and reputation (from the reputation task,
//! [`super::reputation`]) into each Proxy's status and announces changes as Events, and the
//! observer's rows.
//!
//! Guarantees: a status write is guarded by the cached resourceVersion (a stale cache never
//! overwrites a newer status); one Event per change of decided health; one Event per change
//! of reputation, decided against the reputation last announced (a reconcile that merged
//! the same results first does not swallow it), published once the status shows it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use egress_core::health::{self, HealthState};
use egress_core::model::{Condition, ConditionStatus};
use egress_provider::ProxyUid;
use egress_web::status::ProxyStatusRow;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType};
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use super::{
    API_SLACK, Ctx, DriverStats, FIELD_MANAGER, api_version, key_of, lock, publish, uid_of,
};
use crate::api::Proxy;

/// Waits until the watch cache holds a complete first listing; `false` when stopped first.
pub(super) async fn wait_synced(
    synced: &mut watch::Receiver<bool>,
    stop: &CancellationToken,
) -> bool {
    tokio::select! {
        () = stop.cancelled() => false,
        r = synced.wait_for(|v| *v) => r.is_ok(),
    }
}

/// Leader-only: a publishing pass after every health round and every `interval`.
#[allow(clippy::too_many_arguments)]
pub(super) async fn publish_loop(
    ctx: Arc<Ctx>,
    store: Store<Proxy>,
    mut synced: watch::Receiver<bool>,
    mut publisher: publish::Publisher,
    wake: Arc<Notify>,
    interval: Duration,
    stats: Arc<DriverStats>,
    stop: CancellationToken,
) {
    if !wait_synced(&mut synced, &stop).await {
        return;
    }
    // What the stored statuses show was announced before (by an earlier term or process).
    {
        let mut a = lock(&ctx.reputation_announced);
        for p in store.state() {
            if let (Some(uid), Some(st)) = (uid_of(&p), p.status.as_ref()) {
                a.entry(uid).or_insert_with(|| st.reputation.clone());
            }
        }
    }
    loop {
        if publish_pass(&ctx, &store, &mut publisher, &stop).await {
            stats.publish_passes.fetch_add(1, Ordering::Relaxed);
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = wake.notified() => {}
            () = tokio::time::sleep(interval) => {}
        }
    }
}

/// One pass: merge each Proxy's health into its status (written with server-side apply,
/// guarded by the cached resourceVersion so a stale cache never overwrites a newer status),
/// announce health changes as Events, refresh the observer's rows, then publish the groups.
/// `true` when every write succeeded.
pub(super) async fn publish_pass(
    ctx: &Ctx,
    store: &Store<Proxy>,
    publisher: &mut publish::Publisher,
    stop: &CancellationToken,
) -> bool {
    let now = SystemTime::now();
    // NB: the cache's objects are shared, not copied (a deep copy of 10,000 Proxies with
    // their managedFields is tens of MB per pass); only a Proxy whose status this pass writes
    // is copied, to carry the new status into the rows and groups below.
    let mut proxies: Vec<Arc<Proxy>> = store.state();
    let mut ok = true;
    for p in &mut proxies {
        if stop.is_cancelled() {
            return false;
        }
        let Some(uid) = uid_of(p) else {
            continue;
        };
        if p.meta().deletion_timestamp.is_some() {
            continue;
        }
        let Some(current) = p.status.clone() else {
            // Not reconciled yet: the first reconcile writes a status.
            continue;
        };
        let generation = p.meta().generation.unwrap_or(0);
        let h = ctx.observer.health().and_then(|e| e.get(&uid));
        let mut next = current.clone();
        if ctx.observer.health().is_some() {
            health::apply_to_status(&mut next, h.as_ref(), Some(&current), now, generation);
        }
        // NB: a reconcile may have merged the same results first (it announces nothing):
        // the Event is decided against the reputation the status showed before either.
        next.reputation = announced_reputation(ctx, &uid);
        let reputation_event = egress_core::reputation::apply_to_status(
            &mut next,
            ctx.reputation_view(&uid),
            ctx.reputation.enabled(),
            now,
            generation,
        );
        let mut written = next == current;
        if next != current {
            let ns = p.namespace().unwrap_or_default();
            let api: Api<Proxy> = Api::namespaced(ctx.client.clone(), &ns);
            let body = json!({"apiVersion": api_version(), "kind": "Proxy",
                              "metadata": {"resourceVersion": p.resource_version()},
                              "status": next});
            let pp = PatchParams::apply(FIELD_MANAGER).force();
            let name = p.name_any();
            let patch = Patch::Apply(&body);
            // rbac: PROXIES_STATUS patch
            let w = api.patch_status(&name, &pp, &patch);
            match tokio::time::timeout(API_SLACK, w).await {
                Ok(Ok(_)) => {
                    written = true;
                    let mut copy = (**p).clone();
                    copy.status = Some(next.clone());
                    *p = Arc::new(copy);
                }
                Ok(Err(kube::Error::Api(e))) if e.code == 409 => {
                    // The cache is behind a newer write; the next pass sees it.
                    ok = false;
                }
                Ok(Err(e)) => {
                    tracing::warn!(proxy = %key_of(p), error = %e, "health status write failed");
                    ok = false;
                }
                Err(_) => {
                    tracing::warn!(proxy = %key_of(p), "health status write timed out");
                    ok = false;
                }
            }
        }
        if let Some(h) = h {
            announce(ctx, p, &uid, &h).await;
        }
        if written {
            lock(&ctx.reputation_announced).insert(uid, next.reputation.clone());
            if let Some(ev) = reputation_event {
                announce_reputation(ctx, p, &ev).await;
            }
        }
    }
    ctx.observer
        .set_proxies(proxies.iter().map(|p| row_of(p)).collect());
    // Each member's address is the one this process read from its host for its instance.
    let observed = |p: &Proxy| {
        let uid = ProxyUid::parse_strict(p.meta().uid.as_deref()?)?;
        ctx.core.verified_address(&uid)
    };
    let want = publish::desired(proxies.iter().map(|p| &**p), &observed);
    let report = tokio::select! {
        () = stop.cancelled() => return false,
        r = publisher.sync(&want) => r,
    };
    if report.writes > 0 {
        tracing::debug!(
            writes = report.writes,
            groups = want.len(),
            "published groups"
        );
    }
    for f in &report.failures {
        tracing::warn!(failure = %f, "publishing: retried next pass");
    }
    let marked = mark_refused_groups(ctx, &proxies, &report, now).await;
    ok && report.ok() && marked
}

/// Sets the `Published` condition (False, with the refusal's reason and message naming the
/// clash) on every member of a refused group and removes it once the group is no longer
/// refused; announces each new refusal once as a Warning Event on every member. `true` when
/// every status write succeeded.
async fn mark_refused_groups(
    ctx: &Ctx,
    proxies: &[Arc<Proxy>],
    report: &publish::SyncReport,
    now: SystemTime,
) -> bool {
    let now_s = humantime::format_rfc3339_seconds(now).to_string();
    let mut ok = true;
    for p in proxies {
        if p.meta().deletion_timestamp.is_some() {
            continue;
        }
        let Some(current) = p.status.clone() else {
            continue;
        };
        let ns = p.namespace().unwrap_or_default();
        let key = publish::group_of(p).map(|g| (ns.clone(), g.clone()));
        let refusal = key.as_ref().and_then(|k| report.refused.get(k));
        let mut next = current.clone();
        match refusal {
            Some(r) => next.set_condition(Condition::new(
                publish::PUBLISHED_CONDITION,
                ConditionStatus::False,
                r.reason,
                &r.message,
                &now_s,
                p.meta().generation.unwrap_or(0),
            )),
            None => next
                .conditions
                .retain(|c| c.type_ != publish::PUBLISHED_CONDITION),
        }
        // Announced once per Proxy: when its Published=False condition is being set (a
        // Proxy without a status yet gets both once it has one).
        if let Some(r) = refusal
            && !current
                .conditions
                .iter()
                .any(|c| c.type_ == publish::PUBLISHED_CONDITION && c.reason == r.reason)
        {
            let ev = KubeEvent {
                type_: EventType::Warning,
                reason: r.reason.to_owned(),
                note: Some(r.message.clone()),
                action: "Publish".into(),
                secondary: None,
            };
            // rbac: EVENTS create
            if let Err(e) = ctx.recorder.publish(&ev, &p.object_ref(&())).await {
                tracing::warn!(proxy = %key_of(p), error = %e, "cannot publish a refusal event");
            }
        }
        if next == current {
            continue;
        }
        let api: Api<Proxy> = Api::namespaced(ctx.client.clone(), &ns);
        let body = json!({"apiVersion": api_version(), "kind": "Proxy",
                          "metadata": {"resourceVersion": p.resource_version()},
                          "status": next});
        let pp = PatchParams::apply(FIELD_MANAGER).force();
        let (name, patch) = (p.name_any(), Patch::Apply(&body));
        // rbac: PROXIES_STATUS patch
        let w = api.patch_status(&name, &pp, &patch);
        match tokio::time::timeout(API_SLACK, w).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::debug!(proxy = %key_of(p), error = %e, "published condition write failed; retried next pass");
                ok = false;
            }
            Err(_) => ok = false,
        }
    }
    ok
}

/// The reputation `uid`'s status showed when its last reputation change was announced: the
/// stored one for a Proxy the term found at its start, none for a Proxy new since (whose
/// first listing a reconcile may have written already, unannounced).
fn announced_reputation(
    ctx: &Ctx,
    uid: &ProxyUid,
) -> Option<egress_core::reputation::ProxyReputation> {
    lock(&ctx.reputation_announced).get(uid).cloned().flatten()
}

/// Publishes a reputation Event (`Listed`, `Delisted`, `ReputationCheckFailed`).
async fn announce_reputation(ctx: &Ctx, p: &Proxy, ev: &egress_core::controller::Event) {
    let ev = KubeEvent {
        type_: match ev.kind {
            egress_core::controller::EventKind::Normal => EventType::Normal,
            egress_core::controller::EventKind::Warning => EventType::Warning,
        },
        reason: ev.reason.clone(),
        note: Some(ev.message.clone()),
        action: "ReputationCheck".into(),
        secondary: None,
    };
    // rbac: EVENTS create
    if let Err(e) = ctx.recorder.publish(&ev, &p.object_ref(&())).await {
        tracing::warn!(proxy = %key_of(p), error = %e, "cannot publish a reputation event");
    }
}

/// Publishes an Event when a Proxy's decided health changed since the last announcement:
/// Normal `Healthy`, or Warning with the failure's reason (`ProbeFailed`, `EgressMismatch`).
/// Undecided states are not announced.
pub(super) async fn announce(ctx: &Ctx, p: &Proxy, uid: &ProxyUid, h: &health::ProxyHealth) {
    if h.state == HealthState::Unknown {
        return;
    }
    let changed = {
        let mut a = lock(&ctx.announced);
        a.insert(*uid, h.state) != Some(h.state)
    };
    if !changed {
        return;
    }
    let (type_, reason) = match h.state {
        HealthState::Healthy => (EventType::Normal, "Healthy".to_owned()),
        _ => (EventType::Warning, h.reason.clone()),
    };
    let ev = KubeEvent {
        type_,
        reason: reason.clone(),
        note: Some(h.message.clone()),
        action: "HealthCheck".into(),
        secondary: None,
    };
    // rbac: EVENTS create
    if let Err(e) = ctx.recorder.publish(&ev, &p.object_ref(&())).await {
        tracing::warn!(proxy = %key_of(p), error = %e, "cannot publish a health event");
    }
}

pub(super) fn row_of(p: &Proxy) -> ProxyStatusRow {
    let st = p.status.clone().unwrap_or_default();
    ProxyStatusRow {
        namespace: p.namespace().unwrap_or_default(),
        name: p.name_any(),
        uid: p.meta().uid.clone().unwrap_or_default(),
        phase: st.phase,
        host: st.host.clone(),
        ip: st.ip.clone(),
        provider_id: st.provider_id.clone(),
        created_at: p
            .meta()
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.to_string())
            .unwrap_or_default(),
        last_error: st.last_error(),
        conditions: st.conditions.clone(),
        port: Some(p.spec.proxy.port),
        health: st.health.clone(),
        reputation: st.reputation.clone(),
        egress_address: st.egress_address.clone(),
    }
}
