//! Publishing healthy proxies to in-cluster clients: every group of Proxies sharing the label
//! [`GROUP_LABEL`]` = NAME` gets a Service without selector named NAME in their namespace
//! (port = the members' proxy port) and an EndpointSlice per address family listing only the
//! members that are Running and decided Healthy, so clients use `NAME.NAMESPACE.svc:PORT` and
//! reach only working proxies.
//!
//! Pipeline: [`desired`] (pure: Proxies → groups) → [`Publisher::sync`] (network: server-side
//! apply of what changed since the last pass, delete what is no longer wanted).
//!
//! Guarantees:
//! - Only healthy members' `ip:port` appear in a slice; a member turning unhealthy, stopping
//!   or being deleted leaves it on the next pass.
//! - Everything written carries [`MANAGED_BY_LABEL`]` = egress-proxies` and is written with
//!   server-side apply under the driver's one field manager; slices name their Service as
//!   owner (so Kubernetes' garbage collector removes them with it) and carry
//!   `kubernetes.io/service-name` and an `endpointslice.kubernetes.io/managed-by` of ours (the
//!   cluster's EndpointSlice controllers leave them alone).
//! - A group that empties loses its Service and slices; on the first pass of a leadership
//!   term, objects of ours left by an earlier term that no group wants are deleted too (found
//!   by a label-selected list).
//! - Objects not labelled as ours are never deleted. A group whose name is not a valid
//!   Service name is skipped with a warning.
//! - Every call is bounded by the driver's API deadline; a failed pass is retried whole on
//!   the next one (nothing is remembered as written unless it was).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use egress_core::health::healthy_endpoints;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};

use crate::api::Proxy;

/// The label grouping Proxies behind one Service.
pub const GROUP_LABEL: &str = "egress-proxies.dev/group";
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

/// The groups `proxies` form (pure). Proxies being deleted are not members; a member's
/// endpoint counts only when it is Running, decided Healthy and uses the group's port.
pub fn desired<'a>(
    proxies: impl IntoIterator<Item = &'a Proxy>,
) -> BTreeMap<(String, String), Group> {
    let mut members: BTreeMap<(String, String), Vec<&Proxy>> = BTreeMap::new();
    for p in proxies {
        if p.meta().deletion_timestamp.is_some() {
            continue;
        }
        let Some(g) = p.labels().get(GROUP_LABEL) else {
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
        let statuses: Vec<_> = ps
            .iter()
            .filter(|p| p.spec.proxy.port == port)
            .filter_map(|p| p.status.as_ref())
            .collect();
        let mut endpoints: Vec<IpAddr> = healthy_endpoints(statuses.iter().map(|s| (*s, port)))
            .into_iter()
            .map(|a| a.ip())
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

/// Applies groups and remembers what it wrote, so a pass writes only changes.
pub struct Publisher {
    client: Client,
    namespace: Option<String>,
    field_manager: &'static str,
    deadline: Duration,
    /// What the last successful pass published; `None` before the first (which also
    /// sweeps objects of ours left by earlier terms).
    last: Option<BTreeMap<(String, String), Group>>,
}

/// A publishing pass that failed (it is retried whole on the next pass).
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// A Kubernetes API call failed.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// A call did not answer within the deadline.
    #[error("a Kubernetes API call took longer than {0:?}")]
    Timeout(Duration),
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("namespace", &self.namespace)
            .field("groups", &self.last.as_ref().map(BTreeMap::len))
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
            last: None,
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

    /// Makes the cluster hold exactly `want`: applies groups that changed, deletes the
    /// Services and slices of groups that are gone (and, on the first pass, any labelled as
    /// ours that no group wants). Returns the number of writes made.
    pub async fn sync(
        &mut self,
        want: &BTreeMap<(String, String), Group>,
    ) -> Result<usize, PublishError> {
        let mut writes = 0;
        // (namespace, service) and (namespace, slice) that exist and are ours but unwanted.
        let mut stale_services: BTreeSet<(String, String)> = BTreeSet::new();
        let mut stale_slices: BTreeSet<(String, String)> = BTreeSet::new();
        let wanted_slices: BTreeSet<(String, String)> = want
            .values()
            .flat_map(|g| {
                g.slices()
                    .into_iter()
                    .map(|(n, _, _)| (g.namespace.clone(), n))
            })
            .collect();
        match &self.last {
            None => {
                let lp = ListParams::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}"));
                let (svc_api, slice_api): (Api<Service>, Api<EndpointSlice>) = match &self.namespace
                {
                    Some(ns) => (
                        Api::namespaced(self.client.clone(), ns),
                        Api::namespaced(self.client.clone(), ns),
                    ),
                    None => (Api::all(self.client.clone()), Api::all(self.client.clone())),
                };
                // rbac: SERVICES list
                for s in self.bounded(svc_api.list_metadata(&lp)).await?.items {
                    let k = (
                        s.metadata.namespace.unwrap_or_default(),
                        s.metadata.name.unwrap_or_default(),
                    );
                    if !want.contains_key(&k) {
                        stale_services.insert(k);
                    }
                }
                // rbac: ENDPOINT_SLICES list
                for s in self.bounded(slice_api.list_metadata(&lp)).await?.items {
                    let k = (
                        s.metadata.namespace.unwrap_or_default(),
                        s.metadata.name.unwrap_or_default(),
                    );
                    if !wanted_slices.contains(&k) {
                        stale_slices.insert(k);
                    }
                }
            }
            Some(last) => {
                for (k, g) in last {
                    if !want.contains_key(k) {
                        stale_services.insert(k.clone());
                    }
                    for (n, _, _) in g.slices() {
                        let sk = (g.namespace.clone(), n);
                        if !wanted_slices.contains(&sk) {
                            stale_slices.insert(sk);
                        }
                    }
                }
            }
        }
        let pp = PatchParams::apply(self.field_manager).force();
        for (k, g) in want {
            if self.last.as_ref().and_then(|l| l.get(k)) == Some(g) {
                continue;
            }
            let svc_api: Api<Service> = Api::namespaced(self.client.clone(), &g.namespace);
            // rbac: SERVICES patch (create when new)
            let svc = self
                .bounded(svc_api.patch(&g.name, &pp, &Patch::Apply(&service_body(g))))
                .await?;
            writes += 1;
            let uid = svc.metadata.uid.clone();
            let slice_api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &g.namespace);
            for (name, family, addrs) in g.slices() {
                let body = slice_body(g, &name, family, &addrs, uid.as_deref());
                // rbac: ENDPOINT_SLICES patch (create when new)
                self.bounded(slice_api.patch(&name, &pp, &Patch::Apply(&body)))
                    .await?;
                writes += 1;
            }
        }
        for (ns, name) in &stale_slices {
            let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), ns);
            // rbac: ENDPOINT_SLICES delete
            match self
                .bounded(api.delete(name, &DeleteParams::default()))
                .await
            {
                Ok(_) => writes += 1,
                Err(PublishError::Kube(kube::Error::Api(e))) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        for (ns, name) in &stale_services {
            let api: Api<Service> = Api::namespaced(self.client.clone(), ns);
            // rbac: SERVICES delete
            match self
                .bounded(api.delete(name, &DeleteParams::default()))
                .await
            {
                Ok(_) => writes += 1,
                Err(PublishError::Kube(kube::Error::Api(e))) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        self.last = Some(want.clone());
        Ok(writes)
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
        let g = desired(ps.iter());
        assert_eq!(g.len(), 1, "{g:?}");
        let web = &g[&("ns".to_owned(), "web".to_owned())];
        assert_eq!(web.port, 3128);
        assert_eq!(web.members, 4);
        assert_eq!(web.endpoints, vec!["10.1.0.1".parse::<IpAddr>().unwrap()]);
    }

    #[test]
    fn a_slice_lists_addresses_with_the_service_label_and_owner() {
        let ps = [proxy("a", Some("web"), 3128, "10.1.0.1", Some(true))];
        let g = desired(ps.iter());
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
