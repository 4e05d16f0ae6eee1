//! One reconcile of a ProxyPool (see the pipeline in the module doc of `pool`) and its error
//! policy.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use egress_core::controller::backoff::backoff;
use egress_core::controller::{Event, EventKind};
use egress_core::pool::credentials;
use egress_core::pool::member::{ANNOTATION_DRAIN, LABEL_POOL, LABEL_TEMPLATE_HASH, member_spec};
use egress_core::pool::round::{self, PoolCredentials, PoolDriver, Quota, Round, RoundInputs};
use egress_core::pool::status::reason as pool_reason;
use egress_core::pool::{CreateMember, ProxyPoolStatus, ProxyTemplate, UnpublishMember};
use egress_web::status::{PoolMemberRow, PoolStatusRow};
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
    let mut objects: Vec<Arc<Proxy>> = ctx
        .index
        .members(key)
        .iter()
        .filter_map(|m| ctx.proxies.get(&ObjectRef::new(m).within(ns)))
        .collect();
    let has_finalizer = pool.finalizers().iter().any(|f| f == POOL_FINALIZER);
    let deleting = pool.meta().deletion_timestamp.is_some();
    if deleting {
        // NB: only members that still name this pool as their owner go with it: a pool
        // deleted with `propagationPolicy: Orphan` has the garbage collector remove that
        // reference, and its members stay (as the user asked), whichever of us acts first.
        let pool_uid = pool.meta().uid.clone();
        let orphaning = pool.finalizers().iter().any(|f| f == ORPHAN_FINALIZER);
        objects.retain(|p| {
            !orphaning
                && p.owner_references()
                    .iter()
                    .any(|o| Some(&o.uid) == pool_uid.as_ref())
        });
    }
    if !has_finalizer {
        if !deleting {
            let mut list = pool.finalizers().to_vec();
            list.push(POOL_FINALIZER.to_owned());
            set_finalizers(&pools, pool, list).await?;
        }
        return Ok(Action::await_change());
    }

    let generation = pool.meta().generation.unwrap_or(0);
    let current = pool.status.clone().unwrap_or_default();
    let spec = &pool.spec.0;
    // Credentials: read, or generated once (only for a pool that acts).
    let mut credentials_ref = None;
    let mut digest = String::new();
    let mut unusable = None;
    let mut pending = false;
    // Bound by its entry's quotas.maxPoolReplicas (quarantined members count).
    let quota = ctx
        .core
        .max_pool_replicas(&spec.template.spec.provider)
        .map_or(Quota::Unbounded, Quota::Refuse);
    let generate =
        !deleting && round::check(name, spec, quota).is_ok_and(|p| p.generate_credentials);
    if generate {
        match secret::ensure(&ctx.client, pool).await? {
            Some(PoolSecret::Present(c)) => {
                credentials_ref = Some(secret::secret_name(name));
                digest = credentials::digest(&c);
            }
            Some(PoolSecret::Unusable(msg)) => unusable = Some(msg),
            // Made by someone else meanwhile: read on the next round.
            None => pending = true,
        }
    }
    let credentials = match (&unusable, pending) {
        (Some(msg), _) => PoolCredentials::Unusable(msg),
        (None, true) => PoolCredentials::Pending,
        (None, false) => PoolCredentials::Ready { digest: &digest },
    };
    let hosts = ctx.core.pool_hosts(&spec.template.spec.provider);
    let health_checks = ctx.observer.health().is_some();

    // Members: the pool's Proxies from the cache, and the creates the watch has not shown.
    let (members, round) = {
        let mut e = lock(&ctx.expectations);
        let exp = e.pools.entry(key.clone()).or_default();
        let members =
            members::observe(&objects, exp, now, health_checks, spec.reputation.on_listed);
        let round = round::plan(
            &RoundInputs {
                namespace: ns,
                name,
                generation,
                spec,
                deleting,
                quota,
                status: &current,
                credentials,
                members: &members,
                hosts: &hosts,
                retire_for: ctx.reputation.settings().retire_for,
                now,
            },
            &mut exp.availability,
        );
        (members, round)
    };

    let pool_key = format!("{ns}/{name}");
    let io = KubePool {
        ctx,
        pool,
        key,
        pools: &pools,
        proxies: &proxies,
        objects: &objects,
        members: &members,
        credentials_ref: credentials_ref.as_deref(),
        now,
    };
    let done = round::carry_out(&io, ctx.observer.metrics(), &pool_key, &round, &current).await?;
    Ok(match &round {
        Round::Remove { .. } if done.finished => {
            ctx.observer.forget_pool(ns, name);
            lock(&ctx.expectations).pools.remove(key);
            Action::await_change()
        }
        Round::Remove { .. } => Action::requeue(DELETION_RECHECK),
        Round::Refused { reason, .. } if *reason == pool_reason::INVALID_SPEC => {
            Action::await_change()
        }
        Round::Refused { .. } => Action::requeue(ctx.secret_poll),
        Round::Wait(d) => Action::requeue(*d),
        Round::Act(plan) => {
            let mut next = done
                .requeue_after
                .map_or(POOL_RESYNC, |r| r.min(POOL_RESYNC));
            if plan.policy.generate_credentials {
                next = next.min(ctx.secret_poll);
            }
            Action::requeue(next.max(Duration::from_millis(100)))
        }
    })
}

/// One pool's round as the Kubernetes API carries it out: members are Proxy objects owned by
/// the pool, events are Kubernetes Events on it, its status goes through the status
/// subresource, and its finalizer holds it until its members are gone.
struct KubePool<'a> {
    ctx: &'a PoolCtx,
    pool: &'a ProxyPool,
    key: &'a (String, String),
    pools: &'a Api<ProxyPool>,
    proxies: &'a Api<Proxy>,
    /// The member Proxies in the watch cache.
    objects: &'a [Arc<Proxy>],
    /// The members as the round saw them (for the `/status` rows).
    members: &'a [egress_core::pool::Member],
    credentials_ref: Option<&'a str>,
    now: SystemTime,
}

impl PoolDriver for KubePool<'_> {
    type Error = PoolError;

    fn retire(&self, status: &ProxyPoolStatus) {
        let key = format!("{}/{}", self.key.0, self.key.1);
        status.sync_retired(
            &self.ctx.retired,
            &key,
            &self.pool.spec.0.template.spec.provider,
            self.now,
        );
    }

    async fn create(&self, c: &CreateMember) -> Result<(), PoolError> {
        let body = member_body(
            self.pool,
            c,
            &self.pool.spec.0.template,
            self.credentials_ref,
        );
        // rbac: PROXIES create
        match bounded(self.proxies.create(&PostParams::default(), &body)).await {
            Ok(_) => {
                lock(&self.ctx.expectations)
                    .pools
                    .entry(self.key.clone())
                    .or_default()
                    .created
                    .insert(c.name.clone(), (c.clone(), self.now));
                Ok(())
            }
            Err(e) if code(&e) == Some(409) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Sets the member's drain annotation (a merge patch of that one key, guarded by the
    /// member's UID), remembered until the watch shows it, so a round before then neither
    /// counts the member nor unpublishes another in its place.
    async fn unpublish(&self, u: &UnpublishMember) -> Result<(), PoolError> {
        let Some(p) = self.objects.iter().find(|p| p.name_any() == u.name) else {
            return Ok(());
        };
        let body = json!({"metadata": {
            "uid": p.meta().uid,
            "annotations": {ANNOTATION_DRAIN: u.marker},
        }});
        // rbac: PROXIES patch
        match bounded(
            self.proxies
                .patch(&u.name, &PatchParams::default(), &Patch::Merge(&body)),
        )
        .await
        {
            Ok(_) => {}
            // Gone, or replaced by another object of that name: nothing to unpublish.
            Err(e) if matches!(code(&e), Some(404 | 409)) => return Ok(()),
            Err(e) => return Err(e),
        }
        lock(&self.ctx.expectations)
            .pools
            .entry(self.key.clone())
            .or_default()
            .unpublished
            .insert(u.name.clone(), (u.marker.clone(), self.now));
        Ok(())
    }

    async fn delete(&self, name: &str) -> Result<bool, PoolError> {
        let Some(p) = self.objects.iter().find(|p| p.name_any() == name) else {
            // A create the watch has not shown yet: deleted once it is seen.
            return Ok(false);
        };
        // NB: a deleted pool takes a member along only because the cache shows the member
        // naming the pool as its owner, and the cache may lag: with `propagationPolicy:
        // Orphan` the garbage collector removes that reference and only then the `orphan`
        // finalizer, so a round may see the pool without that finalizer and a member still
        // owned. The delete holds only for the member as read (its resourceVersion); one that
        // changed since is looked at again once the watch shows it (its change wakes the pool).
        let as_read = self.pool.meta().deletion_timestamp.is_some();
        let accepted = match delete_member(self.proxies, p, as_read).await? {
            Deleted::Accepted => true,
            Deleted::Gone => false,
            Deleted::Changed => return Ok(false),
        };
        Ok(members::note_delete(
            lock(&self.ctx.expectations)
                .pools
                .entry(self.key.clone())
                .or_default(),
            p,
            accepted,
            self.now,
        ))
    }

    async fn event(&self, e: &Event) {
        publish_event(
            self.ctx,
            &self.pool.object_ref(&()),
            e.kind,
            &e.reason,
            &e.message,
        )
        .await;
    }

    async fn write_status(&self, status: &ProxyPoolStatus, changed: bool) -> Result<(), PoolError> {
        if changed {
            write_status(self.pools, &self.pool.name_any(), status).await?;
        }
        self.ctx.observer.set_pool(PoolStatusRow {
            namespace: self.key.0.clone(),
            name: self.key.1.clone(),
            desired: self.pool.spec.0.replicas,
            status: status.clone(),
            members: status_rows(self.members),
            error: None,
        });
        Ok(())
    }

    async fn forget(&self) -> Result<(), PoolError> {
        let keep: Vec<String> = self
            .pool
            .finalizers()
            .iter()
            .filter(|f| *f != POOL_FINALIZER)
            .cloned()
            .collect();
        set_finalizers(self.pools, self.pool, keep).await?;
        // Its retirements end with it.
        ProxyPoolStatus::default().sync_retired(
            &self.ctx.retired,
            &format!("{}/{}", self.key.0, self.key.1),
            &self.pool.spec.0.template.spec.provider,
            self.now,
        );
        Ok(())
    }
}

/// The member Proxy `c` of `pool`: owned by it, with the template's labels and annotations
/// and the pool's own labels, pinned to its host.
pub(crate) fn member_body(
    pool: &ProxyPool,
    c: &egress_core::pool::CreateMember,
    template: &ProxyTemplate,
    credentials_ref: Option<&str>,
) -> Proxy {
    let mut p = Proxy::new(
        &c.name,
        ProxyCrdSpec(member_spec(
            &template.spec,
            &c.host,
            &c.pin,
            credentials_ref,
        )),
    );
    p.metadata.namespace = pool.namespace();
    let mut labels = template.metadata.labels.clone();
    // NB: validation refuses a template setting these; they win all the same.
    labels.insert(LABEL_POOL.to_owned(), pool.name_any());
    labels.insert(LABEL_TEMPLATE_HASH.to_owned(), c.template_hash.clone());
    p.metadata.labels = Some(labels);
    p.metadata.annotations = crate::driver::replaces::member_annotations(
        &template.metadata.annotations,
        c.replaces.as_deref(),
    );
    p.metadata.owner_references = secret::owner_reference(pool).map(|o| vec![o]);
    p
}

/// What became of a member delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Deleted {
    /// The API server took it.
    Accepted,
    /// The member was gone or replaced (another UID).
    Gone,
    /// The member changed since it was read (only for a delete of the member as read).
    Changed,
}

/// Deletes member `p` if it is still the object read: the same UID, and with `as_read` the
/// same resourceVersion too. Gone, replaced or changed is not an error.
async fn delete_member(api: &Api<Proxy>, p: &Proxy, as_read: bool) -> Result<Deleted, PoolError> {
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: p.meta().uid.clone(),
            resource_version: if as_read {
                p.meta().resource_version.clone()
            } else {
                None
            },
        }),
        ..DeleteParams::default()
    };
    // rbac: PROXIES delete
    match bounded(api.delete(&p.name_any(), &dp)).await {
        Ok(_) => Ok(Deleted::Accepted),
        Err(e) if as_read && code(&e) == Some(409) => Ok(Deleted::Changed),
        Err(e) if matches!(code(&e), Some(404 | 409)) => Ok(Deleted::Gone),
        Err(e) => Err(e),
    }
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
    let mut rows: Vec<PoolMemberRow> = members.iter().map(PoolMemberRow::of).collect();
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
            drain: None,
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
            "replicas: 1\ntemplate:\n  spec:\n    provider: home\n    image: tiny\n    proxy:\n      \
             allowedClientCidrs: [10.0.0.0/8]\n",
        )
        .unwrap();
        let pool = ProxyPool::new("web", spec.clone().into());
        let mut c = egress_core::pool::CreateMember {
            name: "web-bcdfgh".into(),
            host: "h1".into(),
            template_hash: "t".into(),
            pin: vec!["203.0.113.7".parse().unwrap()],
            replaces: None,
        };
        let p = member_body(&pool, &c, &spec.template, None);
        assert_eq!(p.spec.0.host.as_deref(), Some("h1"));
        assert_eq!(p.spec.0.egress.address, ["203.0.113.7"]);
        assert!(p.metadata.annotations.is_none());
        c.pin.clear();
        let p = member_body(&pool, &c, &spec.template, None);
        assert!(p.spec.0.egress.address.is_empty());
    }

    #[test]
    fn a_member_body_carries_the_template_metadata_and_the_pools_own_labels() {
        #![allow(clippy::unwrap_used)]
        let spec: egress_core::pool::spec::ProxyPoolSpec = serde_saphyr::from_str(
            "replicas: 1\ntemplate:\n  metadata:\n    labels: {team: payments}\n    \
             annotations: {example.com/owner: jane}\n  spec:\n    provider: home\n    \
             image: tiny\n    proxy:\n      allowedClientCidrs: [10.0.0.0/8]\n",
        )
        .unwrap();
        let pool = ProxyPool::new("web", spec.clone().into());
        let c = egress_core::pool::CreateMember {
            name: "web-bcdfgh".into(),
            host: "h1".into(),
            template_hash: "abc".into(),
            pin: Vec::new(),
            replaces: None,
        };
        let p = member_body(&pool, &c, &spec.template, None);
        let labels = p.metadata.labels.unwrap();
        assert_eq!(labels["team"], "payments");
        assert_eq!(labels[LABEL_POOL], "web");
        assert_eq!(labels[LABEL_TEMPLATE_HASH], "abc");
        assert_eq!(p.metadata.annotations.unwrap()["example.com/owner"], "jane");
    }
}
