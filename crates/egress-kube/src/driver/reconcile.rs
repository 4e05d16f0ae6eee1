//! One reconcile of a Proxy (read → finalizer → core reconcile → status → events →
//! finalizer removal) and the error policy of the kube-runtime controller.
//!
//! Guarantees: a reconcile never outlives the core's deadline plus [`super::API_SLACK`]; the
//! status is written only when it changed; a Kubernetes API failure backs off per object, an
//! invalid uid waits for a change.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use egress_core::controller::{EventKind, Outcome, ProxyObject, backoff::backoff};
use egress_core::model::ProxyStatus;
use egress_provider::ProxyUid;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event as KubeEvent, EventType};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::credentials::credentials;
use super::{
    API_BACKOFF_BASE, API_BACKOFF_MAX, Ctx, FIELD_MANAGER, FINALIZER, ReconcileError, api_version,
    lock,
};
use crate::api::Proxy;

/// One reconcile of a Proxy, bounded by the core's deadline plus [`API_SLACK`].
pub(super) async fn reconcile(p: Arc<Proxy>, ctx: Arc<Ctx>) -> Result<Action, ReconcileError> {
    let deadline = ctx.deadline;
    let key = format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any());
    match tokio::time::timeout(deadline, reconcile_inner(&p, &ctx)).await {
        Ok(Ok(a)) => {
            lock(&ctx.failures).remove(&key);
            Ok(a)
        }
        Ok(Err(e)) => Err(e),
        Err(_) => {
            ctx.stats.reconcile_timeouts.fetch_add(1, Ordering::Relaxed);
            Err(ReconcileError::Timeout(deadline))
        }
    }
}

/// The labels of namespace `ns`, for the config's `namespaceSelector`s: read when some entry
/// uses one (else `None`, and no call is made), reused for
/// [`NAMESPACE_LABELS_TTL`](super::NAMESPACE_LABELS_TTL); `None` (selectors match nothing)
/// when the read fails.
async fn namespace_labels(ctx: &Ctx, ns: &str) -> Option<super::NamespaceLabels> {
    let selectors = ctx.core.uses_namespace_selectors();
    if !selectors {
        return None;
    }
    if let Some((at, l)) = lock(&ctx.namespace_labels).get(ns)
        && at.elapsed() < super::NAMESPACE_LABELS_TTL
    {
        return Some(l.clone());
    }
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(ctx.client.clone());
    // rbac: NAMESPACES get
    let read = tokio::time::timeout(super::API_SLACK, api.get_metadata_opt(ns)).await;
    let labels: super::NamespaceLabels = match read {
        Ok(Ok(Some(n))) => std::sync::Arc::new(n.metadata.labels.unwrap_or_default()),
        _ => {
            tracing::warn!(namespace = %ns, "cannot read the namespace's labels; namespaceSelectors match nothing for it");
            return None;
        }
    };
    lock(&ctx.namespace_labels).insert(ns.to_owned(), (std::time::Instant::now(), labels.clone()));
    Some(labels)
}

pub(super) async fn reconcile_inner(p: &Proxy, ctx: &Ctx) -> Result<Action, ReconcileError> {
    let ns = p.namespace().unwrap_or_default();
    let name = p.name_any();
    let api: Api<Proxy> = Api::namespaced(ctx.client.clone(), &ns);
    let deleting = p.meta().deletion_timestamp.is_some();
    let has_finalizer = p.finalizers().iter().any(|f| f == FINALIZER);
    if deleting && !has_finalizer {
        return Ok(Action::await_change());
    }
    if !deleting && !has_finalizer {
        let mut list = p.finalizers().to_vec();
        list.push(FINALIZER.to_owned());
        set_finalizers(&api, p, list).await?;
        // The write is a change: the next reconcile sees the finalizer.
        return Ok(Action::await_change());
    }
    let raw_uid = p.meta().uid.clone().unwrap_or_default();
    let uid = ProxyUid::parse_strict(&raw_uid).ok_or(ReconcileError::Uid(raw_uid))?;
    let credentials =
        credentials(&ctx.client, &ns, p.spec.proxy.credentials_ref.as_deref()).await?;
    lock(&ctx.creds).insert(uid, credentials.clone());
    let phase = p.status.as_ref().map(|s| s.phase).unwrap_or_default();
    let (replaces, refused) = match super::replaces::resolve(&api, p, phase).await {
        Ok(r) => (r, None),
        Err(why) => {
            tracing::warn!(proxy = %name, "{why}");
            (None, Some(why))
        }
    };
    let obj = ProxyObject {
        namespace: ns.clone(),
        name: name.clone(),
        uid,
        generation: p.meta().generation.unwrap_or(0),
        spec: std::sync::Arc::new(p.spec.0.clone()),
        deleting,
        credentials,
        namespace_labels: namespace_labels(ctx, &ns).await,
        replaces,
    };
    let current = p.status.clone().unwrap_or_default();
    let started = std::time::Instant::now();
    let mut out: Outcome = ctx.core.reconcile(&obj, &current, SystemTime::now()).await;
    if let Some(why) = refused {
        out.events.push(egress_core::controller::Event::new(
            EventKind::Warning,
            "ReplacesRefused",
            &why,
        ));
    }
    if let Some(engine) = ctx.observer.health() {
        engine.merge_reconcile(
            &uid,
            &mut out.status,
            &current,
            out.instance_started,
            SystemTime::now(),
            obj.generation,
        );
    }
    // The reputation results as of now (the publishing pass announces their changes).
    let _ = egress_core::reputation::apply_to_status(
        &mut out.status,
        ctx.reputation_view(&uid),
        ctx.reputation.enabled(),
        SystemTime::now(),
        obj.generation,
    );
    let error_class = out
        .events
        .iter()
        .find(|e| e.kind == EventKind::Warning)
        .map(|e| e.reason.clone());
    ctx.observer
        .metrics()
        .reconciled(error_class.as_deref(), started.elapsed());
    if out.status != current && !(out.finalized && deleting) {
        write_status(&api, &name, &out.status).await?;
    }
    let reference = p.object_ref(&());
    for e in &out.events {
        let ev = KubeEvent {
            type_: match e.kind {
                EventKind::Normal => EventType::Normal,
                EventKind::Warning => EventType::Warning,
            },
            reason: e.reason.clone(),
            note: Some(e.message.clone()),
            action: e.reason.clone(),
            secondary: None,
        };
        // rbac: EVENTS create (patch for a repeated event)
        if let Err(err) = ctx.recorder.publish(&ev, &reference).await {
            tracing::warn!(proxy = %name, error = %err, "cannot publish an event");
        }
    }
    if out.finalized && deleting {
        let list: Vec<String> = p
            .finalizers()
            .iter()
            .filter(|f| *f != FINALIZER)
            .cloned()
            .collect();
        set_finalizers(&api, p, list).await?;
        ctx.core.forget(&uid);
        if let Some(engine) = ctx.observer.health() {
            engine.forget(&uid, &format!("{ns}/{name}"));
        }
        lock(&ctx.creds).remove(&uid);
        lock(&ctx.announced).remove(&uid);
        lock(&ctx.reputation_announced).remove(&uid);
        return Ok(Action::await_change());
    }
    Ok(match out.requeue_after {
        Some(d) => Action::requeue(d),
        None => Action::await_change(),
    })
}

pub(super) async fn write_status(
    api: &Api<Proxy>,
    name: &str,
    status: &ProxyStatus,
) -> Result<(), ReconcileError> {
    let body = json!({"apiVersion": api_version(), "kind": "Proxy", "status": status});
    // rbac: PROXIES_STATUS patch
    api.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map_err(ReconcileError::Kube)?;
    Ok(())
}

/// Replaces `metadata.finalizers` with `list`, guarded by the resourceVersion read (a
/// concurrent change makes the patch fail and the reconcile retry).
pub(super) async fn set_finalizers(
    api: &Api<Proxy>,
    p: &Proxy,
    list: Vec<String>,
) -> Result<(), ReconcileError> {
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": p.resource_version()},
        {"op": "add", "path": "/metadata/finalizers", "value": list},
    ]))
    .map_err(|e| ReconcileError::Kube(kube::Error::SerdeError(e)))?;
    // rbac: PROXIES patch, PROXIES_FINALIZERS update
    api.patch(
        &p.name_any(),
        &PatchParams::default(),
        &Patch::Json::<()>(patch),
    )
    .await
    .map_err(ReconcileError::Kube)?;
    Ok(())
}

/// Kubernetes API failures and deadlines back off per object; provider failures never get
/// here (the core turns them into a status and a requeue).
pub(super) fn error_policy(p: Arc<Proxy>, e: &ReconcileError, ctx: Arc<Ctx>) -> Action {
    let key = format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any());
    let n = {
        let mut f = lock(&ctx.failures);
        let n = f.entry(key.clone()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    };
    tracing::warn!(proxy = %key, category = e.category(), error = %e, failures = n, "reconcile failed");
    match e {
        ReconcileError::Uid(_) => Action::await_change(),
        _ => Action::requeue(backoff(API_BACKOFF_BASE, API_BACKOFF_MAX, n)),
    }
}
