//! One reconcile of a ProxyPool (see the pipeline in the module doc of `pool`) and its error
//! policy.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use egress_core::controller::backoff::backoff;
use egress_core::controller::{EventKind, decide::fmt_time};
use egress_core::metrics::PoolReplicas;
use egress_core::model::{Condition, ConditionStatus};
use egress_core::pool::credentials;
use egress_core::pool::member::{
    ANNOTATION_QUARANTINE, LABEL_POOL, LABEL_TEMPLATE_HASH, member_spec, template_hash,
};
use egress_core::pool::status::{MAX_STATUS_MEMBERS, PoolMemberStatus, condition, reason};
use egress_core::pool::validate::validate_pool_name;
use egress_core::pool::{PoolInputs, ProxyPoolStatus, decide};
use egress_core::status::{PoolMemberRow, PoolStatusRow};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event as KubeEvent, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::members;
use super::secret::{self, PoolSecret};
use super::{POOL_FINALIZER, POOL_RESYNC, PoolCtx, PoolError};
use crate::api::{Proxy, ProxyCrdSpec, ProxyPool};
use crate::driver::{
    API_BACKOFF_BASE, API_BACKOFF_MAX, API_SLACK, FIELD_MANAGER, api_version, lock,
};

/// Condition reason: the generated-credentials Secret exists but cannot be used.
pub(crate) const REASON_CREDENTIALS_UNUSABLE: &str = "CredentialsUnusable";

/// How soon a deleted pool is looked at again while its members go (their own deletions
/// wake it too).
const DELETION_RECHECK: Duration = Duration::from_secs(5);

async fn bounded<T>(
    f: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, PoolError> {
    tokio::time::timeout(API_SLACK, f)
        .await
        .map_err(|_| PoolError::Timeout(API_SLACK))?
        .map_err(PoolError::Kube)
}

fn code(e: &PoolError) -> Option<u16> {
    match e {
        PoolError::Kube(kube::Error::Api(s)) => Some(s.code),
        _ => None,
    }
}

/// One reconcile of a pool.
pub(super) async fn reconcile(
    pool: Arc<ProxyPool>,
    ctx: Arc<PoolCtx>,
) -> Result<Action, PoolError> {
    let key = (pool.namespace().unwrap_or_default(), pool.name_any());
    let r = reconcile_inner(&pool, &ctx, &key).await;
    if r.is_ok() {
        lock(&ctx.failures).remove(&key);
    }
    r
}

/// Kubernetes API failures back off per pool.
pub(super) fn error_policy(pool: Arc<ProxyPool>, e: &PoolError, ctx: Arc<PoolCtx>) -> Action {
    let key = (pool.namespace().unwrap_or_default(), pool.name_any());
    let n = {
        let mut f = lock(&ctx.failures);
        let n = f.entry(key.clone()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    };
    tracing::warn!(pool = %format!("{}/{}", key.0, key.1), error = %e, failures = n, "pool reconcile failed");
    Action::requeue(backoff(API_BACKOFF_BASE, API_BACKOFF_MAX, n))
}

async fn reconcile_inner(
    pool: &ProxyPool,
    ctx: &PoolCtx,
    key: &(String, String),
) -> Result<Action, PoolError> {
    let (ns, name) = (key.0.as_str(), key.1.as_str());
    let pools: Api<ProxyPool> = Api::namespaced(ctx.client.clone(), ns);
    let proxies: Api<Proxy> = Api::namespaced(ctx.client.clone(), ns);
    let now = SystemTime::now();
    let objects: Vec<Arc<Proxy>> = ctx
        .index
        .members(key)
        .iter()
        .filter_map(|m| ctx.proxies.get(&ObjectRef::new(m).within(ns)))
        .collect();
    let has_finalizer = pool.finalizers().iter().any(|f| f == POOL_FINALIZER);

    if pool.meta().deletion_timestamp.is_some() {
        if !has_finalizer {
            return Ok(Action::await_change());
        }
        // NB: only members that still name this pool as their owner go with it: a pool deleted
        // with `propagationPolicy: Orphan` has the garbage collector remove that reference,
        // and its members stay (as the user asked), whichever of us acts first.
        let pool_uid = pool.meta().uid.clone();
        let owned: Vec<&Arc<Proxy>> = objects
            .iter()
            .filter(|p| {
                p.owner_references()
                    .iter()
                    .any(|o| Some(&o.uid) == pool_uid.as_ref())
            })
            .collect();
        let orphaning = pool.finalizers().iter().any(|f| f == ORPHAN_FINALIZER);
        if !orphaning {
            for p in owned
                .iter()
                .filter(|p| p.meta().deletion_timestamp.is_none())
            {
                delete_member(&proxies, p).await?;
            }
        }
        if orphaning || owned.is_empty() {
            let keep: Vec<String> = pool
                .finalizers()
                .iter()
                .filter(|f| *f != POOL_FINALIZER)
                .cloned()
                .collect();
            set_finalizers(&pools, pool, keep).await?;
            ctx.observer.metrics().forget_pool(&format!("{ns}/{name}"));
            ctx.observer.forget_pool(ns, name);
            lock(&ctx.expectations).pools.remove(key);
            return Ok(Action::await_change());
        }
        return Ok(Action::requeue(DELETION_RECHECK));
    }
    if !has_finalizer {
        let mut list = pool.finalizers().to_vec();
        list.push(POOL_FINALIZER.to_owned());
        set_finalizers(&pools, pool, list).await?;
        return Ok(Action::await_change());
    }

    let generation = pool.meta().generation.unwrap_or(0);
    let current = pool.status.clone().unwrap_or_default();
    let spec = &pool.spec.0;
    // Bound by its entry's quotas.maxPoolReplicas (quarantined members count).
    let validated =
        spec.validate().and_then(
            |p| match ctx.core.max_pool_replicas(&spec.template.provider) {
                Some(max) => p.within_quota(max).map_err(|e| vec![e]),
                None => Ok(p),
            },
        );
    let errors: Vec<String> = validate_pool_name(name)
        .into_iter()
        .chain(validated.clone().err().unwrap_or_default())
        .map(|e| format!("{}: {}", e.path, e.message))
        .collect();
    let policy = match validated {
        Ok(p) if errors.is_empty() => p,
        _ => {
            let msg = errors.join("; ");
            refuse(
                ctx,
                &pools,
                pool,
                &current,
                reason::INVALID_SPEC,
                &msg,
                generation,
                now,
            )
            .await?;
            return Ok(Action::await_change());
        }
    };

    // Credentials: read, or generated once.
    let mut credentials_ref = None;
    let mut digest = String::new();
    if policy.generate_credentials {
        match secret::ensure(&ctx.client, pool).await? {
            Some(PoolSecret::Present(c)) => {
                credentials_ref = Some(secret::secret_name(name));
                digest = credentials::digest(&c);
            }
            Some(PoolSecret::Unusable(msg)) => {
                refuse(
                    ctx,
                    &pools,
                    pool,
                    &current,
                    REASON_CREDENTIALS_UNUSABLE,
                    &msg,
                    generation,
                    now,
                )
                .await?;
                return Ok(Action::requeue(ctx.secret_poll));
            }
            // Made by someone else meanwhile: read on the next round.
            None => return Ok(Action::requeue(Duration::from_secs(1))),
        }
    }
    let hash = template_hash(&spec.template, &digest);
    let hosts = ctx.core.pool_hosts(&spec.template.provider);
    let health_checks = ctx.observer.health().is_some();

    // Members: the pool's Proxies from the cache, and the creates the watch has not shown.
    let members = {
        let mut e = lock(&ctx.expectations);
        members::observe(
            &objects,
            e.pools.entry(key.clone()).or_default(),
            now,
            health_checks,
        )
    };

    let d = decide(&PoolInputs {
        name,
        generation,
        policy: &policy,
        template_hash: &hash,
        members: &members,
        hosts: &hosts,
        status: &current,
        credentials_present: true,
        now,
    });

    let metrics = ctx.observer.metrics();
    let pool_key = format!("{ns}/{name}");
    metrics.set_pool_members(&pool_key, members::state_counts(&members));
    let ready = {
        let mut e = lock(&ctx.expectations);
        members::newly_available(&members, e.pools.entry(key.clone()).or_default(), now)
    };
    for secs in ready {
        metrics.pool_member_ready(&pool_key, secs);
    }

    let mut first_error: Option<PoolError> = None;
    for c in &d.creates {
        let body = member_body(pool, c, &spec.template, credentials_ref.as_deref());
        // rbac: PROXIES create
        match bounded(proxies.create(&PostParams::default(), &body)).await {
            Ok(_) => {
                lock(&ctx.expectations)
                    .pools
                    .entry(key.clone())
                    .or_default()
                    .created
                    .insert(c.name.clone(), (c.clone(), now));
            }
            Err(e) if code(&e) == Some(409) => {}
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    for del in &d.deletes {
        let Some(p) = objects.iter().find(|p| p.name_any() == del.name) else {
            continue;
        };
        match delete_member(&proxies, p).await {
            Ok(accepted) => {
                let first = members::note_delete(
                    lock(&ctx.expectations)
                        .pools
                        .entry(key.clone())
                        .or_default(),
                    p,
                    accepted,
                    now,
                );
                if first {
                    metrics.pool_member_replaced(&pool_key, del.cause.as_str());
                }
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    let reference = pool.object_ref(&());
    for e in &d.events {
        publish_event(ctx, &reference, e.kind, &e.reason, &e.message).await;
    }

    let mut status = d.status.clone();
    status.selector = format!("{LABEL_POOL}={name}");
    // A quarantined member is out of the pool's accounting: never listed as available.
    let available: HashSet<&str> = members
        .iter()
        .filter(|m| m.available && m.quarantine.is_none())
        .map(|m| m.name.as_str())
        .collect();
    let mut rows: BTreeMap<String, PoolMemberStatus> = BTreeMap::new();
    for p in objects
        .iter()
        .filter(|p| p.meta().deletion_timestamp.is_none())
    {
        let n = p.name_any();
        let row = PoolMemberStatus::of(
            &n,
            p.spec.host.as_deref(),
            &p.status.clone().unwrap_or_default(),
            available.contains(n.as_str()),
            p.annotations().contains_key(ANNOTATION_QUARANTINE),
        );
        rows.insert(n, row);
    }
    status.members_omitted =
        u32::try_from(rows.len().saturating_sub(MAX_STATUS_MEMBERS)).unwrap_or(u32::MAX);
    status.members = rows.into_values().take(MAX_STATUS_MEMBERS).collect();
    if status != current {
        write_status(&pools, name, &status).await?;
    }
    ctx.observer.set_pool(PoolStatusRow {
        namespace: ns.to_owned(),
        name: name.to_owned(),
        desired: policy.replicas,
        status: status.clone(),
        members: status_rows(&members),
        error: None,
    });
    metrics.set_pool(
        &pool_key,
        PoolReplicas {
            desired: u64::from(policy.replicas),
            available: u64::from(status.available_replicas),
        },
    );
    if let Some(e) = first_error {
        return Err(e);
    }
    let mut next = d.requeue_after.map_or(POOL_RESYNC, |r| r.min(POOL_RESYNC));
    if policy.generate_credentials {
        next = next.min(ctx.secret_poll);
    }
    Ok(Action::requeue(next.max(Duration::from_millis(100))))
}

/// The member Proxy `c` of `pool`: owned by it, labelled, pinned to its host.
pub(crate) fn member_body(
    pool: &ProxyPool,
    c: &egress_core::pool::CreateMember,
    template: &egress_core::model::ProxySpec,
    credentials_ref: Option<&str>,
) -> Proxy {
    let mut p = Proxy::new(
        &c.name,
        ProxyCrdSpec(member_spec(template, &c.host, &c.pin, credentials_ref)),
    );
    p.metadata.namespace = pool.namespace();
    p.metadata.labels = Some(
        [
            (LABEL_POOL.to_owned(), pool.name_any()),
            (LABEL_TEMPLATE_HASH.to_owned(), c.template_hash.clone()),
        ]
        .into(),
    );
    p.metadata.owner_references = secret::owner_reference(pool).map(|o| vec![o]);
    p
}

/// Deletes member `p` if it is still the object read (UID precondition); gone or replaced
/// is not an error. True when the API server took the delete (false: gone or replaced).
async fn delete_member(api: &Api<Proxy>, p: &Proxy) -> Result<bool, PoolError> {
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: p.meta().uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    // rbac: PROXIES delete
    match bounded(api.delete(&p.name_any(), &dp)).await {
        Ok(_) => Ok(true),
        Err(e) if matches!(code(&e), Some(404 | 409)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Sets `Progressing` False and `ReplicaFailure` True with `why` (an invalid spec, unusable
/// credentials), announcing it once per change.
#[allow(clippy::too_many_arguments)]
async fn refuse(
    ctx: &PoolCtx,
    pools: &Api<ProxyPool>,
    pool: &ProxyPool,
    current: &ProxyPoolStatus,
    why: &str,
    msg: &str,
    generation: i64,
    now: SystemTime,
) -> Result<(), PoolError> {
    let t = fmt_time(now);
    let mut status = current.clone();
    status.observed_generation = generation;
    status.selector = format!("{LABEL_POOL}={}", pool.name_any());
    for type_ in [condition::PROGRESSING, condition::REPLICA_FAILURE] {
        let s = if type_ == condition::PROGRESSING {
            ConditionStatus::False
        } else {
            ConditionStatus::True
        };
        status.set_condition(Condition::new(type_, s, why, msg, &t, generation));
    }
    if status != *current {
        write_status(pools, &pool.name_any(), &status).await?;
        publish_event(ctx, &pool.object_ref(&()), EventKind::Warning, why, msg).await;
    }
    Ok(())
}

async fn publish_event(
    ctx: &PoolCtx,
    reference: &k8s_openapi::api::core::v1::ObjectReference,
    kind: EventKind,
    why: &str,
    msg: &str,
) {
    let ev = KubeEvent {
        type_: match kind {
            EventKind::Normal => EventType::Normal,
            EventKind::Warning => EventType::Warning,
        },
        reason: why.to_owned(),
        note: Some(msg.to_owned()),
        action: why.to_owned(),
        secondary: None,
    };
    // rbac: EVENTS create (patch for a repeated event)
    match tokio::time::timeout(API_SLACK, ctx.recorder.publish(&ev, reference)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "cannot publish a pool event"),
        Err(_) => tracing::warn!("publishing a pool event timed out"),
    }
}

async fn write_status(
    api: &Api<ProxyPool>,
    name: &str,
    status: &ProxyPoolStatus,
) -> Result<(), PoolError> {
    let body = json!({"apiVersion": api_version(), "kind": "ProxyPool", "status": status});
    // rbac: PROXYPOOLS_STATUS patch
    bounded(api.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    ))
    .await?;
    Ok(())
}

/// The finalizer the API server sets on an object deleted with `propagationPolicy: Orphan`.
const ORPHAN_FINALIZER: &str = "orphan";

/// Replaces the pool's finalizers with `list`, guarded by the resourceVersion read.
async fn set_finalizers(
    api: &Api<ProxyPool>,
    p: &ProxyPool,
    list: Vec<String>,
) -> Result<(), PoolError> {
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": p.resource_version()},
        {"op": "add", "path": "/metadata/finalizers", "value": list},
    ]))
    .map_err(|e| PoolError::Kube(kube::Error::SerdeError(e)))?;
    // rbac: PROXYPOOLS patch, PROXYPOOLS_FINALIZERS update
    bounded(api.patch(
        &p.name_any(),
        &PatchParams::default(),
        &Patch::Json::<()>(patch),
    ))
    .await?;
    Ok(())
}

/// The members as `/status` lists them, by name (the pool's creates the watch has not shown
/// included: they exist in the API).
fn status_rows(members: &[egress_core::pool::Member]) -> Vec<PoolMemberRow> {
    let mut rows: Vec<PoolMemberRow> = members
        .iter()
        .map(|m| PoolMemberRow {
            name: m.name.clone(),
            host: m.host.clone(),
            phase: m.phase,
            available: m.available && m.quarantine.is_none() && !m.deleting,
            template_hash: m.template_hash.clone(),
            created_at: fmt_time(m.created),
            quarantine: m.quarantine.clone(),
            deleting: m.deleting,
            egress_address: m.egress_address.clone(),
        })
        .collect();
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    rows
}

#[cfg(test)]
mod tests {
    #![allow(clippy::indexing_slicing)]

    use super::*;
    use egress_core::model::ProxyStatus;
    use egress_core::pool::member::{Member, MemberMeta};

    #[test]
    fn a_member_row_lists_the_declared_egress_addresses_of_the_member_proxy() {
        let meta = |name: &str| MemberMeta {
            name: name.into(),
            host: Some("h1".into()),
            template_hash: "t".into(),
            created: std::time::SystemTime::UNIX_EPOCH,
            quarantine: None,
            deleting: false,
        };
        let pinned = ProxyStatus {
            egress_address: vec!["203.0.113.7".into(), "2001:db8::7".into()],
            ..ProxyStatus::default()
        };
        let rows = status_rows(&[
            Member::observe(meta("web-b"), &ProxyStatus::default(), false),
            Member::observe(meta("web-a"), &pinned, false),
        ]);
        assert_eq!(rows[0].name, "web-a");
        assert_eq!(rows[0].egress_address, ["203.0.113.7", "2001:db8::7"]);
        assert!(rows[1].egress_address.is_empty());
    }

    #[test]
    fn a_member_body_pins_the_kept_egress_addresses_of_its_create() {
        #![allow(clippy::unwrap_used)]
        let spec: egress_core::pool::spec::ProxyPoolSpec = serde_saphyr::from_str(
            "replicas: 1\ntemplate:\n  provider: home\n  image: tiny\n  proxy:\n    \
             allowedClientCidrs: [10.0.0.0/8]\n",
        )
        .unwrap();
        let pool = ProxyPool::new("web", spec.clone().into());
        let mut c = egress_core::pool::CreateMember {
            name: "web-bcdfgh".into(),
            host: "h1".into(),
            template_hash: "t".into(),
            pin: vec!["203.0.113.7".parse().unwrap()],
        };
        let p = member_body(&pool, &c, &spec.template, None);
        assert_eq!(p.spec.0.host.as_deref(), Some("h1"));
        assert_eq!(p.spec.0.egress.address, ["203.0.113.7"]);
        c.pin.clear();
        let p = member_body(&pool, &c, &spec.template, None);
        assert!(p.spec.0.egress.address.is_empty());
    }
}
