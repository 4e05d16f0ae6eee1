//! Publishing healthy proxies to in-cluster clients: every group of Proxies sharing the label
//! [`GROUP_LABEL`]` = NAME`, and every ProxyPool's members (label [`POOL_LABEL`]` = NAME`, which
//! wins), gets a Service without selector named NAME in their namespace
//! (port = the members' proxy port) and an EndpointSlice per address family listing only the
//! members that are Running and decided Healthy and neither quarantined
//! ([`QUARANTINE_ANNOTATION`]) nor unpublished by their pool ([`DRAIN_ANNOTATION`]), so clients use `NAME.NAMESPACE.svc:PORT` and reach only
//! working proxies.
//!
//! Pipeline: [`desired`] (pure: Proxies → groups) → [`Publisher::sync`] (network: server-side
//! apply of what changed since the last pass, delete what is no longer wanted) → a
//! [`SyncReport`] (writes, groups refused and why, failures).
//!
//! Guarantees:
//! - Only healthy members' `ip:port` appear in a slice; a member turning unhealthy, stopping
//!   or being deleted leaves it on the next pass.
//! - Everything written carries [`MANAGED_BY_LABEL`]` = egress-proxies` and is written with
//!   server-side apply under the driver's one field manager; slices name their Service as
//!   owner (so Kubernetes' garbage collector removes them with it) and carry
//!   `kubernetes.io/service-name` and an `endpointslice.kubernetes.io/managed-by` of ours (the
//!   cluster's EndpointSlice controllers leave them alone).
//! - **Only objects the operator created are written or deleted** (a Proxy author may name
//!   any group, e.g. `kubernetes`): before every write the object is read, and an existing
//!   one is written only when it is ours ([`is_ours`]: our managed-by and group labels *and*
//!   an entry of our field manager in `managedFields`); otherwise the group is refused
//!   ([`Refusal`], reason [`REASON_NAME_CLASH`]) and nothing of it is written; the
//!   resourceVersion read is a precondition of the apply, so an object replaced or changed
//!   between the read and the write is not written either. Applies are
//!   never forced: a field another manager owns with another value makes the API server
//!   refuse the apply (409), and the group is refused ([`REASON_FIELD_CONFLICT`]) rather
//!   than taking the field over. Deletes carry a UID precondition (the UID we read or
//!   wrote), so an object deleted and recreated by someone else under the same name is
//!   never deleted.
//! - A group that empties loses its Service and slices; on the first pass of a leadership
//!   term, objects of ours left by an earlier term that no group wants are deleted too (found
//!   by a label-selected list, each checked with [`is_ours`]).
//! - Errors are per group: a group that fails or is refused does not stop the others; it is
//!   retried on the next pass (nothing is remembered as written unless it was). A group
//!   whose name is not a valid Service name is skipped with a warning.
//! - Every call is bounded by the driver's API deadline.
//!
//! One piece (about 680 lines before its tests, 510 of them code): the read-check-apply-delete
//! protocol of one pass holds its ownership and precondition rules in one place; the pure part
//! ([`desired`]) is already separate, and splitting the network half would spread one
//! protocol's invariants over several files.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use egress_core::health::healthy_endpoints;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};

use crate::api::Proxy;

/// The label grouping Proxies behind one Service.
pub const GROUP_LABEL: &str = "egress-proxies.dev/group";
/// The label naming a member's ProxyPool: a pool's members publish as the group of the
/// pool's name (this label wins over [`GROUP_LABEL`]).
pub const POOL_LABEL: &str = egress_core::pool::member::LABEL_POOL;
/// The annotation that quarantines a pool member: never an endpoint while it is set.
pub const QUARANTINE_ANNOTATION: &str = egress_core::pool::member::ANNOTATION_QUARANTINE;
/// The annotation a pool sets on a member it removes after its drain grace: never an
/// endpoint again.
pub const DRAIN_ANNOTATION: &str = egress_core::pool::member::ANNOTATION_DRAIN;
/// The label marking a Service or EndpointSlice as the operator's.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Its value.
pub const MANAGED_BY: &str = "egress-proxies";
/// The label tying an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The label naming the controller of an EndpointSlice.
pub const SLICE_MANAGER_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// Its value: not the cluster's `endpointslice-controller.k8s.io` nor the mirroring
/// controller's, so neither touches our slices.
pub const SLICE_MANAGER: &str = "egress-proxies.dev";
/// The Service's and the slices' port name.
pub const PORT_NAME: &str = "proxy";
/// Longest Service name (a DNS-1035 label).
pub const MAX_SERVICE_NAME: usize = 63;
/// The Proxy condition set (False) on every member of a refused group, removed once the
/// group publishes again.
pub const PUBLISHED_CONDITION: &str = "Published";
/// Event and condition reason: a group's Service or slice name is taken by an object the
/// operator does not own.
pub const REASON_NAME_CLASH: &str = "ServiceNameClash";
/// Event and condition reason: applying the group's object would overwrite a field another
/// field manager owns (the apply is never forced).
pub const REASON_FIELD_CONFLICT: &str = "FieldConflict";

/// One group as it should be published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// Namespace of the members (and of the Service).
    pub namespace: String,
    /// The group label's value: the Service's name.
    pub name: String,
    /// The members' port (the most common one; ties go to the lowest).
    pub port: u16,
    /// Healthy members' addresses on `port`, sorted.
    pub endpoints: Vec<IpAddr>,
    /// Members counted (healthy or not).
    pub members: usize,
}

impl Group {
    /// The slice names this group publishes: one per address family present (IPv4 always,
    /// so an all-unhealthy group still has an empty slice).
    pub fn slices(&self) -> Vec<(String, &'static str, Vec<IpAddr>)> {
        let v4: Vec<IpAddr> = self
            .endpoints
            .iter()
            .copied()
            .filter(IpAddr::is_ipv4)
            .collect();
        let v6: Vec<IpAddr> = self
            .endpoints
            .iter()
            .copied()
            .filter(IpAddr::is_ipv6)
            .collect();
        let mut out = vec![(slice_name(&self.name, "ipv4"), "IPv4", v4)];
        if !v6.is_empty() {
            out.push((slice_name(&self.name, "ipv6"), "IPv6", v6));
        }
        out
    }
}

fn slice_name(service: &str, family: &str) -> String {
    format!("{service}-{family}")
}

/// Whether `s` is a valid Service name (DNS-1035 label).
pub fn valid_service_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_SERVICE_NAME
        && b.first().is_some_and(u8::is_ascii_lowercase)
        && b.last()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// The group `p` publishes in: its pool's name (label [`POOL_LABEL`]) when it is a pool's
/// member — the label alone is not enough: its controller owner reference must be that
/// ProxyPool (a Proxy labelled by hand, not made by the pool, publishes nowhere) — else its
/// [`GROUP_LABEL`].
pub fn group_of(p: &Proxy) -> Option<&String> {
    if let Some(pool) = p.labels().get(POOL_LABEL) {
        let owned = p.owner_references().iter().any(|o| {
            o.controller == Some(true)
                && o.kind == "ProxyPool"
                && o.api_version == format!("{}/{}", crate::api::GROUP, crate::api::VERSION)
                && &o.name == pool
                && !o.uid.is_empty()
        });
        return owned.then_some(pool);
    }
    p.labels().get(GROUP_LABEL)
}

/// The groups `proxies` form (pure). Proxies being deleted are not members; a member's
/// endpoint counts only when it is Running, decided Healthy and uses the group's port, and
/// its address is the one `observed` gives (the address this process read from the host for
/// its instance), never `status.ip` as stored in the API, which whoever may write the
/// status could set; a member with no observed address is not published.
pub fn desired<'a>(
    proxies: impl IntoIterator<Item = &'a Proxy>,
    observed: &dyn Fn(&Proxy) -> Option<IpAddr>,
) -> BTreeMap<(String, String), Group> {
    let mut members: BTreeMap<(String, String), Vec<&Proxy>> = BTreeMap::new();
    for p in proxies {
        if p.meta().deletion_timestamp.is_some() {
            continue;
        }
        let Some(g) = group_of(p) else {
            continue;
        };
        if !valid_service_name(g) {
            tracing::warn!(proxy = %p.name_any(), group = %g, "group label is not a valid Service name; not published");
            continue;
        }
        members
            .entry((p.namespace().unwrap_or_default(), g.clone()))
            .or_default()
            .push(p);
    }
    let mut out = BTreeMap::new();
    for ((ns, name), ps) in members {
        let mut ports: BTreeMap<u16, usize> = BTreeMap::new();
        for p in &ps {
            *ports.entry(p.spec.proxy.port).or_default() += 1;
        }
        // Most members first, then the lowest port.
        let Some(port) = ports
            .iter()
            .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
            .map(|(p, _)| *p)
        else {
            continue;
        };
        // A quarantined or drained member is out of publication at once, whatever its health.
        let mut endpoints: Vec<IpAddr> = ps
            .iter()
            .filter(|p| p.spec.proxy.port == port)
            .filter(|p| {
                !p.annotations().contains_key(QUARANTINE_ANNOTATION)
                    && !p.annotations().contains_key(DRAIN_ANNOTATION)
            })
            .filter(|p| {
                p.status
                    .as_ref()
                    .is_some_and(|s| !healthy_endpoints([(s, port)]).is_empty())
            })
            .filter_map(|p| observed(p))
            .collect();
        endpoints.sort();
        endpoints.dedup();
        out.insert(
            (ns.clone(), name.clone()),
            Group {
                namespace: ns,
                name,
                port,
                endpoints,
                members: ps.len(),
            },
        );
    }
    out
}

fn labels(group: &str) -> Value {
    json!({ MANAGED_BY_LABEL: MANAGED_BY, GROUP_LABEL: group })
}

/// The Service (server-side apply body) of `g`: no selector, one TCP port.
pub fn service_body(g: &Group) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": g.name, "namespace": g.namespace, "labels": labels(&g.name)},
        "spec": {"ports": [{"name": PORT_NAME, "port": g.port, "targetPort": g.port,
                             "protocol": "TCP"}]},
    })
}

/// An EndpointSlice (server-side apply body) of `g`, owned by the Service `service_uid`.
pub fn slice_body(
    g: &Group,
    name: &str,
    address_type: &str,
    addrs: &[IpAddr],
    service_uid: Option<&str>,
) -> Value {
    let mut l = labels(&g.name);
    if let Some(m) = l.as_object_mut() {
        m.insert(SERVICE_NAME_LABEL.into(), json!(g.name));
        m.insert(SLICE_MANAGER_LABEL.into(), json!(SLICE_MANAGER));
    }
    let mut meta = json!({"name": name, "namespace": g.namespace, "labels": l});
    if let (Some(uid), Some(m)) = (service_uid, meta.as_object_mut()) {
        m.insert(
            "ownerReferences".into(),
            json!([{"apiVersion": "v1", "kind": "Service", "name": g.name, "uid": uid,
                    "blockOwnerDeletion": false}]),
        );
    }
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": meta,
        "addressType": address_type,
        "ports": [{"name": PORT_NAME, "port": g.port, "protocol": "TCP"}],
        "endpoints": addrs.iter().map(|a| json!({
            "addresses": [a.to_string()],
            "conditions": {"ready": true, "serving": true, "terminating": false},
        })).collect::<Vec<_>>(),
    })
}

/// Whether the object with `meta` is the operator's: labelled as ours for `group`, with an
/// entry of `field_manager` in its `managedFields` (an object someone else created with our
/// labels copied onto it has no such entry).
pub fn is_ours(meta: &ObjectMeta, group: &str, field_manager: &str) -> bool {
    let labels = meta.labels.as_ref();
    let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    label(MANAGED_BY_LABEL) == Some(MANAGED_BY)
        && label(GROUP_LABEL) == Some(group)
        && meta.managed_fields.as_ref().is_some_and(|m| {
            m.iter()
                .any(|e| e.manager.as_deref() == Some(field_manager))
        })
}

/// `body` with `metadata.resourceVersion` = `rv` when given: in an apply, a precondition
/// (the API server refuses with 409 when the object's version differs).
fn with_resource_version(mut body: Value, rv: Option<String>) -> Value {
    if let (Some(rv), Some(meta)) = (rv, body.get_mut("metadata").and_then(Value::as_object_mut)) {
        meta.insert("resourceVersion".into(), Value::String(rv));
    }
    body
}

/// Why a group was not published: its Service's or a slice's name is taken by an object that
/// is not ours, or an apply would have taken a field over from another manager.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// [`REASON_NAME_CLASH`] or [`REASON_FIELD_CONFLICT`].
    pub reason: &'static str,
    /// What clashed, naming the object (`Service NAMESPACE/NAME ...`).
    pub message: String,
}

/// What one [`Publisher::sync`] did.
#[derive(Debug, Default)]
pub struct SyncReport {
    /// Objects applied or deleted.
    pub writes: usize,
    /// Groups refused this pass, by (namespace, group); nothing of them was written.
    pub refused: BTreeMap<(String, String), Refusal>,
    /// Groups refused this pass that were not refused on the previous one (announce these).
    pub newly_refused: BTreeSet<(String, String)>,
    /// Calls that failed (each group, listing or delete on its own), retried next pass.
    pub failures: Vec<String>,
}

impl SyncReport {
    /// Whether every call succeeded (refusals are decisions, not failures).
    pub fn ok(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Applies groups and remembers what it wrote, so a pass writes only changes.
pub struct Publisher {
    client: Client,
    namespace: Option<String>,
    field_manager: &'static str,
    deadline: Duration,
    /// Groups whose objects the last passes applied exactly as they are now.
    published: BTreeMap<(String, String), Group>,
    /// Services that are ours, by (namespace, name), with their UID and group.
    services: BTreeMap<(String, String), (String, String)>,
    /// EndpointSlices that are ours, by (namespace, name), with their UID and group.
    slices: BTreeMap<(String, String), (String, String)>,
    /// Whether this term's label-selected listing of earlier terms' objects succeeded.
    swept: bool,
    /// Groups refused on the last pass.
    refused: BTreeSet<(String, String)>,
}

/// A publishing call that failed.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// A Kubernetes API call failed.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// A call did not answer within the deadline.
    #[error("a Kubernetes API call took longer than {0:?}")]
    Timeout(Duration),
}

impl PublishError {
    fn code(&self) -> Option<u16> {
        match self {
            Self::Kube(kube::Error::Api(e)) => Some(e.code),
            _ => None,
        }
    }
}

/// How publishing one group ended when it did not fail.
enum GroupOutcome {
    Published(usize),
    Refused(Refusal),
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("namespace", &self.namespace)
            .field("groups", &self.published.len())
            .finish_non_exhaustive()
    }
}

impl Publisher {
    /// A publisher over Proxies of `namespace` (`None`: every namespace).
    pub fn new(
        client: Client,
        namespace: Option<String>,
        field_manager: &'static str,
        deadline: Duration,
    ) -> Self {
        Self {
            client,
            namespace,
            field_manager,
            deadline,
            published: BTreeMap::new(),
            services: BTreeMap::new(),
            slices: BTreeMap::new(),
            swept: false,
            refused: BTreeSet::new(),
        }
    }

    async fn bounded<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, PublishError> {
        match tokio::time::timeout(self.deadline, f).await {
            Ok(r) => Ok(r?),
            Err(_) => Err(PublishError::Timeout(self.deadline)),
        }
    }

    /// Lists the objects labelled as ours in scope and remembers those that are ours
    /// ([`is_ours`]), so the stale ones are deleted.
    async fn sweep(&mut self) -> Result<(), PublishError> {
        let lp = ListParams::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}"));
        let (svc_api, slice_api): (Api<Service>, Api<EndpointSlice>) = match &self.namespace {
            Some(ns) => (
                Api::namespaced(self.client.clone(), ns),
                Api::namespaced(self.client.clone(), ns),
            ),
            None => (Api::all(self.client.clone()), Api::all(self.client.clone())),
        };
        // rbac: SERVICES list
        let services = self.bounded(svc_api.list_metadata(&lp)).await?.items;
        // rbac: ENDPOINT_SLICES list
        let slices = self.bounded(slice_api.list_metadata(&lp)).await?.items;
        let metas = [
            (
                services.into_iter().map(|o| o.metadata).collect::<Vec<_>>(),
                true,
            ),
            (slices.into_iter().map(|o| o.metadata).collect(), false),
        ];
        for (items, is_service) in metas {
            let into = if is_service {
                &mut self.services
            } else {
                &mut self.slices
            };
            for m in items {
                let group = m
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(GROUP_LABEL))
                    .cloned()
                    .unwrap_or_default();
                if let (true, Some(ns), Some(name), Some(uid)) = (
                    is_ours(&m, &group, self.field_manager),
                    m.namespace.clone(),
                    m.name.clone(),
                    m.uid.clone(),
                ) {
                    into.entry((ns, name)).or_insert((uid, group));
                }
            }
        }
        Ok(())
    }

    /// Reads the object `name` before a write: `Ok(None)` when absent, `Ok(Some(meta))` when
    /// it exists.
    async fn read<K>(&self, api: &Api<K>, name: &str) -> Result<Option<ObjectMeta>, PublishError>
    where
        K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        Ok(self
            .bounded(api.get_metadata_opt(name))
            .await?
            .map(|o| o.metadata))
    }

    /// Publishes one group: each object is read first and written only when absent or ours;
    /// applies are not forced.
    async fn publish_group(&mut self, g: &Group) -> Result<GroupOutcome, PublishError> {
        let ns = &g.namespace;
        let svc_api: Api<Service> = Api::namespaced(self.client.clone(), ns);
        let slice_api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), ns);
        let clash = |kind: &str, name: &str| Refusal {
            reason: REASON_NAME_CLASH,
            message: format!(
                "{kind} {ns}/{name} exists and was not created by egress-proxies; group {:?} \
                 is not published (rename the group or the {kind})",
                g.name
            ),
        };
        // Every name first: a clash anywhere refuses the group before anything is written.
        // The resourceVersion read of each existing object (ours) is a precondition of its
        // apply: an object replaced or changed between the read and the write is not written.
        // rbac: SERVICES get
        let svc_rv = match self.read(&svc_api, &g.name).await? {
            Some(m) if !is_ours(&m, &g.name, self.field_manager) => {
                return Ok(GroupOutcome::Refused(clash("Service", &g.name)));
            }
            m => m.and_then(|m| m.resource_version),
        };
        let slices = g.slices();
        let mut slice_rvs = Vec::with_capacity(slices.len());
        for (name, _, _) in &slices {
            // rbac: ENDPOINT_SLICES get
            match self.read(&slice_api, name).await? {
                Some(m) if !is_ours(&m, &g.name, self.field_manager) => {
                    return Ok(GroupOutcome::Refused(clash("EndpointSlice", name)));
                }
                m => slice_rvs.push(m.and_then(|m| m.resource_version)),
            }
        }
        let conflict = |kind: &str, name: &str, e: &PublishError| Refusal {
            reason: REASON_FIELD_CONFLICT,
            message: format!(
                "{kind} {ns}/{name} changed since it was read, or has fields another field \
                 manager owns with other values; not overwritten, group {:?} is not published: \
                 {e}",
                g.name
            ),
        };
        // NB: never `.force()`: taking fields over from another manager is what the API
        // server's conflict check exists to prevent.
        let pp = PatchParams::apply(self.field_manager);
        let mut writes = 0;
        // rbac: SERVICES patch (create when new)
        let svc_body = with_resource_version(service_body(g), svc_rv);
        let svc = match self
            .bounded(svc_api.patch(&g.name, &pp, &Patch::Apply(&svc_body)))
            .await
        {
            Ok(s) => s,
            Err(e) if e.code() == Some(409) => {
                return Ok(GroupOutcome::Refused(conflict("Service", &g.name, &e)));
            }
            Err(e) => return Err(e),
        };
        writes += 1;
        let uid = svc.metadata.uid.clone();
        if let Some(u) = &uid {
            self.services
                .insert((ns.clone(), g.name.clone()), (u.clone(), g.name.clone()));
        }
        for ((name, family, addrs), rv) in slices.into_iter().zip(slice_rvs) {
            let body =
                with_resource_version(slice_body(g, &name, family, &addrs, uid.as_deref()), rv);
            // rbac: ENDPOINT_SLICES patch (create when new)
            let slice = match self
                .bounded(slice_api.patch(&name, &pp, &Patch::Apply(&body)))
                .await
            {
                Ok(s) => s,
                Err(e) if e.code() == Some(409) => {
                    return Ok(GroupOutcome::Refused(conflict("EndpointSlice", &name, &e)));
                }
                Err(e) => return Err(e),
            };
            writes += 1;
            if let Some(u) = slice.metadata.uid {
                self.slices.insert((ns.clone(), name), (u, g.name.clone()));
            }
        }
        Ok(GroupOutcome::Published(writes))
    }

    /// Deletes `name` only if its UID is still `uid`: `Ok(true)` when deleted, `Ok(false)`
    /// when it is gone or was replaced by another object (then it is not ours any more).
    async fn delete_if<K>(&self, api: &Api<K>, name: &str, uid: &str) -> Result<bool, PublishError>
    where
        K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.to_owned()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match self.bounded(api.delete(name, &dp)).await {
            Ok(_) => Ok(true),
            Err(e) if matches!(e.code(), Some(404 | 409)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Makes the cluster hold exactly `want`: applies groups that changed, deletes the
    /// Services and slices of ours no group wants (on the first pass of a term, also those
    /// found by a label-selected list). Every group and every delete stands on its own: one
    /// failing or refused does not stop the others.
    pub async fn sync(&mut self, want: &BTreeMap<(String, String), Group>) -> SyncReport {
        let mut report = SyncReport::default();
        if !self.swept {
            match self.sweep().await {
                Ok(()) => self.swept = true,
                Err(e) => report
                    .failures
                    .push(format!("listing objects of earlier terms: {e}")),
            }
        }
        for (k, g) in want {
            if self.published.get(k) == Some(g) {
                continue;
            }
            self.published.remove(k);
            match self.publish_group(g).await {
                Ok(GroupOutcome::Published(n)) => {
                    report.writes += n;
                    self.published.insert(k.clone(), g.clone());
                }
                Ok(GroupOutcome::Refused(r)) => {
                    tracing::warn!(namespace = %k.0, group = %k.1, reason = r.reason, "{}", r.message);
                    if !self.refused.contains(k) {
                        report.newly_refused.insert(k.clone());
                    }
                    report.refused.insert(k.clone(), r);
                }
                Err(e) => {
                    tracing::warn!(namespace = %k.0, group = %k.1, error = %e, "publishing a group failed; retried next pass");
                    report.failures.push(format!("group {}/{}: {e}", k.0, k.1));
                }
            }
        }
        self.published.retain(|k, _| want.contains_key(k));
        self.refused = report.refused.keys().cloned().collect();
        // Objects of ours that no wanted group names (refused groups keep theirs).
        let wanted_slices: BTreeSet<(String, String)> = want
            .values()
            .flat_map(|g| {
                g.slices()
                    .into_iter()
                    .map(|(n, _, _)| (g.namespace.clone(), n))
            })
            .collect();
        let stale_slices: Vec<((String, String), String)> = self
            .slices
            .iter()
            .filter(|(k, _)| !wanted_slices.contains(k))
            .map(|(k, (uid, _))| (k.clone(), uid.clone()))
            .collect();
        for ((ns, name), uid) in stale_slices {
            let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &ns);
            // rbac: ENDPOINT_SLICES delete
            match self.delete_if(&api, &name, &uid).await {
                Ok(deleted) => {
                    report.writes += usize::from(deleted);
                    self.slices.remove(&(ns, name));
                }
                Err(e) => report
                    .failures
                    .push(format!("deleting EndpointSlice {ns}/{name}: {e}")),
            }
        }
        let stale_services: Vec<((String, String), String)> = self
            .services
            .iter()
            .filter(|(k, _)| !want.contains_key(*k))
            .map(|(k, (uid, _))| (k.clone(), uid.clone()))
            .collect();
        for ((ns, name), uid) in stale_services {
            let api: Api<Service> = Api::namespaced(self.client.clone(), &ns);
            // rbac: SERVICES delete
            match self.delete_if(&api, &name, &uid).await {
                Ok(deleted) => {
                    report.writes += usize::from(deleted);
                    self.services.remove(&(ns, name));
                }
                Err(e) => report
                    .failures
                    .push(format!("deleting Service {ns}/{name}: {e}")),
            }
        }
        report
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use crate::api::ProxyCrdSpec;
    use egress_core::model::{HealthStatus, Phase, ProxySettings, ProxySpec, ProxyStatus};

    fn proxy(name: &str, group: Option<&str>, port: u16, ip: &str, healthy: Option<bool>) -> Proxy {
        let mut p = Proxy::new(
            name,
            ProxyCrdSpec(ProxySpec {
                provider: "home".into(),
                host: None,
                image: "tiny".into(),
                resources: Default::default(),
                proxy: ProxySettings {
                    port,
                    allowed_client_cidrs: vec!["10.0.0.0/8".into()],
                    ..ProxySettings::default()
                },
                egress: Default::default(),
            }),
        );
        p.metadata.namespace = Some("ns".into());
        if let Some(g) = group {
            p.metadata.labels = Some([(GROUP_LABEL.to_owned(), g.to_owned())].into());
        }
        p.status = Some(ProxyStatus {
            phase: Phase::Running,
            ip: Some(ip.into()),
            health: Some(HealthStatus {
                healthy,
                ..HealthStatus::default()
            }),
            ..ProxyStatus::default()
        });
        p
    }

    #[test]
    fn only_healthy_running_members_on_the_groups_port_are_endpoints() {
        let ps = [
            proxy("a", Some("web"), 3128, "10.1.0.1", Some(true)),
            proxy("b", Some("web"), 3128, "10.1.0.2", Some(false)),
            proxy("c", Some("web"), 3128, "10.1.0.3", None),
            proxy("d", Some("web"), 8080, "10.1.0.4", Some(true)),
            proxy("e", None, 3128, "10.1.0.5", Some(true)),
            proxy("f", Some("Bad_Name"), 3128, "10.1.0.6", Some(true)),
        ];
        let g = desired(ps.iter(), &as_stored);
        assert_eq!(g.len(), 1, "{g:?}");
        let web = &g[&("ns".to_owned(), "web".to_owned())];
        assert_eq!(web.port, 3128);
        assert_eq!(web.members, 4);
        assert_eq!(web.endpoints, vec!["10.1.0.1".parse::<IpAddr>().unwrap()]);
    }

    /// What the operator observed, for tests: here the address the status holds.
    fn as_stored(p: &Proxy) -> Option<IpAddr> {
        p.status.as_ref()?.ip.as_deref()?.parse().ok()
    }

    fn owned_by_pool(p: &mut Proxy, pool: &str) {
        p.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: format!("{}/{}", crate::api::GROUP, crate::api::VERSION),
                kind: "ProxyPool".into(),
                name: pool.into(),
                uid: "0f0f0f0f-0000-4000-8000-000000000001".into(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            },
        ]);
    }

    #[test]
    fn endpoints_are_the_addresses_the_operator_observed_never_a_stored_status_ip() {
        let ps = [
            proxy("a", Some("web"), 3128, "10.1.0.1", Some(true)),
            // Its status claims an address the operator never read for it.
            proxy("b", Some("web"), 3128, "10.9.9.9", Some(true)),
            proxy("c", Some("web"), 3128, "10.1.0.3", Some(true)),
        ];
        let observed = |p: &Proxy| match p.name_any().as_str() {
            "a" => Some("10.1.0.1".parse().unwrap()),
            "b" => Some("10.1.0.2".parse().unwrap()),
            _ => None,
        };
        let g = desired(ps.iter(), &observed);
        let ips: Vec<String> = g[&("ns".to_owned(), "web".to_owned())]
            .endpoints
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            ips,
            ["10.1.0.1", "10.1.0.2"],
            "c unobserved, b's stored ip ignored"
        );
    }

    #[test]
    fn a_pool_label_without_the_pool_as_controller_makes_no_member() {
        let mut p = proxy("intruder", None, 3128, "10.1.0.9", Some(true));
        p.metadata.labels = Some([(POOL_LABEL.to_owned(), "fleet".to_owned())].into());
        assert_eq!(group_of(&p), None);
        assert!(desired([&p], &as_stored).is_empty());
        owned_by_pool(&mut p, "other-pool");
        assert_eq!(group_of(&p), None, "owned by another pool");
        owned_by_pool(&mut p, "fleet");
        assert_eq!(group_of(&p).map(String::as_str), Some("fleet"));
    }

    #[test]
    fn a_pools_members_publish_under_the_pools_name_without_quarantined_ones() {
        let member = |name: &str, ip: &str, quarantine: bool| {
            let mut p = proxy(name, None, 3128, ip, Some(true));
            p.metadata.labels = Some([(POOL_LABEL.to_owned(), "fleet".to_owned())].into());
            owned_by_pool(&mut p, "fleet");
            if quarantine {
                p.metadata.annotations =
                    Some([(QUARANTINE_ANNOTATION.to_owned(), "banned".to_owned())].into());
            }
            p
        };
        let ps = [
            member("fleet-a", "10.1.0.1", false),
            member("fleet-b", "10.1.0.2", true),
            member("fleet-c", "10.1.0.3", false),
        ];
        assert_eq!(group_of(&ps[0]).map(String::as_str), Some("fleet"));
        let mut both = ps[0].clone();
        both.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(GROUP_LABEL.to_owned(), "web".to_owned());
        assert_eq!(
            group_of(&both).map(String::as_str),
            Some("fleet"),
            "the pool wins"
        );
        let g = desired(ps.iter(), &as_stored);
        let fleet = &g[&("ns".to_owned(), "fleet".to_owned())];
        assert_eq!(fleet.members, 3);
        let ips: Vec<String> = fleet.endpoints.iter().map(ToString::to_string).collect();
        assert_eq!(ips, ["10.1.0.1", "10.1.0.3"]);
        // A member its pool unpublished to remove it (drain annotation) leaves at once.
        let mut ps = ps;
        ps[2].metadata.annotations = Some(
            [(
                DRAIN_ANNOTATION.to_owned(),
                "2026-12-05T07:20:00Z scale-in".to_owned(),
            )]
            .into(),
        );
        let g = desired(ps.iter(), &as_stored);
        let fleet = &g[&("ns".to_owned(), "fleet".to_owned())];
        let ips: Vec<String> = fleet.endpoints.iter().map(ToString::to_string).collect();
        assert_eq!(ips, ["10.1.0.1"]);
    }

    #[test]
    fn a_slice_lists_addresses_with_the_service_label_and_owner() {
        let ps = [proxy("a", Some("web"), 3128, "10.1.0.1", Some(true))];
        let g = desired(ps.iter(), &as_stored);
        let web = &g[&("ns".to_owned(), "web".to_owned())];
        let (name, fam, addrs) = web.slices().remove(0);
        let s = slice_body(web, &name, fam, &addrs, Some("uid-1"));
        assert_eq!(s["metadata"]["labels"][SERVICE_NAME_LABEL], "web");
        assert_eq!(s["metadata"]["ownerReferences"][0]["uid"], "uid-1");
        assert_eq!(s["endpoints"][0]["addresses"][0], "10.1.0.1");
        assert_eq!(s["ports"][0]["port"], 3128);
        assert!(service_body(web)["spec"].get("selector").is_none());
    }

    #[test]
    fn service_names_must_be_dns_labels() {
        assert!(valid_service_name("web-1"));
        assert!(!valid_service_name("1web"));
        assert!(!valid_service_name("web-"));
        assert!(!valid_service_name("Web"));
        assert!(!valid_service_name(&"a".repeat(64)));
    }
}
