//! The JSON document `GET /status` serves in standalone mode, and that the CLI's `status`
//! command reads back.
//!
//! Guarantees: the shape is plain data (Serialize + Deserialize round-trip), field names are
//! camelCase and stable; every message in it was redacted before it got here (conditions
//! are redacted by [`egress_core::model`], host errors by the provider).

use serde::{Deserialize, Serialize};

use egress_core::host_health::HostHealth;
use egress_core::model::{Condition, HealthStatus, Phase};
use egress_core::pool::Member;

impl StatusDocument {
    /// The `/pools/NAME/healthy.txt` body of pool `namespace/name`: `ip:port` of each member
    /// the pool counts as available (not quarantined, not being deleted), one per line,
    /// sorted; `None` when no such pool exists.
    pub fn pool_healthy_list(&self, namespace: &str, name: &str) -> Option<String> {
        let pool = self
            .pools
            .iter()
            .find(|p| p.namespace == namespace && p.name == name)?;
        // NB: an index of the namespace's rows: O(proxies + members), not their product.
        let rows: std::collections::HashMap<&str, &ProxyStatusRow> = self
            .proxies
            .iter()
            .filter(|p| p.namespace == pool.namespace)
            .map(|p| (p.name.as_str(), p))
            .collect();
        let mut eps: Vec<String> = pool
            .members
            .iter()
            .filter(|m| m.available && m.quarantine.is_none() && !m.deleting)
            .filter_map(|m| {
                let row = rows.get(m.name.as_str())?;
                let ip: std::net::IpAddr = row.ip.as_deref()?.parse().ok()?;
                Some(std::net::SocketAddr::new(ip, row.port?).to_string())
            })
            .collect();
        eps.sort();
        eps.dedup();
        let mut out = String::with_capacity(eps.len() * 22);
        for e in eps {
            out.push_str(&e);
            out.push('\n');
        }
        Some(out)
    }
}

/// Everything standalone mode knows, at one instant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusDocument {
    /// When the document was built (RFC 3339, UTC).
    pub generated_at: String,
    /// One row per Proxy (manifests present and those still being deleted), sorted by
    /// namespace/name.
    pub proxies: Vec<ProxyStatusRow>,
    /// One row per host of every provider entry, from the last check.
    pub hosts: Vec<HostStatusRow>,
    /// Current manifest errors (bad files keep their last good version).
    pub manifest_errors: Vec<String>,
    /// One row per ProxyPool, sorted by namespace/name (absent from documents written before
    /// pools existed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<PoolStatusRow>,
}

/// One ProxyPool: what it wants, its status, and its members.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolStatusRow {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Members wanted (`spec.replicas`).
    pub desired: u32,
    /// The pool's status (counts, conditions, quarantined members).
    pub status: egress_core::pool::ProxyPoolStatus,
    /// Its members (each also has a row in `proxies`, in the pool's namespace), sorted by name.
    #[serde(default)]
    pub members: Vec<PoolMemberRow>,
    /// Why the pool cannot act, when it cannot (e.g. its credentials file is unreadable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One member of a pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolMemberRow {
    /// The member Proxy's name.
    pub name: String,
    /// The host the pool placed it on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Its phase.
    pub phase: Phase,
    /// Counted as available by the pool (Ready, Running and, with health checks on, healthy
    /// through itself): what `/pools/NAME/healthy.txt` lists.
    pub available: bool,
    /// The template hash it was made from.
    pub template_hash: String,
    /// When it was created (RFC 3339).
    pub created_at: String,
    /// Its quarantine reason, when quarantined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantine: Option<String>,
    /// The pool is deleting it.
    #[serde(default)]
    pub deleting: bool,
    /// The declared egress address(es) it holds from its host's address pool (its
    /// `status.egressAddress`; absent when it holds none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress_address: Vec<String>,
    /// The pool unpublished it at this time (RFC 3339) to remove it: it takes no new client
    /// and is deleted once the pool's drain grace has passed since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draining_since: Option<String>,
}

/// One Proxy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyStatusRow {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Stable UID (canonical form).
    pub uid: String,
    /// Phase.
    pub phase: Phase,
    /// Host, when placed.
    pub host: Option<String>,
    /// Address, when known.
    pub ip: Option<String>,
    /// The declared egress address(es) the instance holds from its host's address pool
    /// (`status.egressAddress`; absent when it holds none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress_address: Vec<String>,
    /// `libvirt://ENTRY/HOST/NAME`, when created.
    pub provider_id: Option<String>,
    /// When the instance was created (its ownership mark's time) when known, else when this
    /// process first saw the manifest (RFC 3339).
    pub created_at: String,
    /// The message of the first False condition, if any (redacted).
    pub last_error: Option<String>,
    /// All conditions.
    pub conditions: Vec<Condition>,
    /// The proxy's listen port (`spec.proxy.port`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// What the health engine saw through the proxy (absent while health checks are off or
    /// before the first check): healthy, egress IP, latency, last check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthStatus>,
    /// The egress addresses' DNS blocklist results (`status.reputation`; absent while no
    /// blocklist is configured or before the first check).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reputation: Option<egress_core::reputation::ProxyReputation>,
}

impl ProxyStatusRow {
    /// `Some(true)` when the health engine decided the proxy is healthy and it is Running.
    pub fn healthy(&self) -> Option<bool> {
        let h = self.health.as_ref()?.healthy?;
        Some(h && self.phase == Phase::Running)
    }

    /// `ip:port` when Running, healthy, with an address and a port (IPv6 bracketed).
    pub fn healthy_endpoint(&self) -> Option<std::net::SocketAddr> {
        if self.healthy() != Some(true) {
            return None;
        }
        let ip: std::net::IpAddr = self.ip.as_deref()?.parse().ok()?;
        Some(std::net::SocketAddr::new(ip, self.port?))
    }

    /// The reputation in one cell (the `LISTED` column of `egress-proxies status` and the
    /// fleet page): the zones an address is listed in (comma-separated), `no` when every
    /// check answered and none lists it, `?` when none lists it but some check failed, `-`
    /// when checks are off or before the first check.
    pub fn listed_cell(&self) -> String {
        use egress_core::reputation::engine::status::Summary;
        match self.reputation.as_ref().map(|r| r.summary()) {
            None | Some(Summary::Unchecked) => "-".into(),
            Some(Summary::Listed(zones)) => zones.join(","),
            Some(Summary::Failing) => "?".into(),
            Some(Summary::Clean) => "no".into(),
        }
    }
}

/// One host of one provider entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostStatusRow {
    /// Provider entry.
    pub entry: String,
    /// Host name in the entry.
    pub host: String,
    /// `Ready`, `Unreachable`, `Timeout`, `Degraded`, or `Unknown` before the first check.
    pub state: String,
    /// Latency of the probe call, milliseconds.
    pub latency_ms: Option<u64>,
    /// Last error (redacted).
    pub error: Option<String>,
    /// Maintenance progress: `Cordoned`, `Draining (N left)` or `Drained`; absent for a host
    /// in service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<String>,
    /// Its address pool's usage per family (empty without an address pool).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<egress_core::host_health::AddressPoolUsage>,
    /// An administrator's declaration that the host is dead and what the operator did with
    /// it; absent when there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fenced: Option<egress_core::host_health::HostFence>,
}

impl From<&HostHealth> for HostStatusRow {
    /// The document's summary of a host's last check.
    fn from(h: &HostHealth) -> Self {
        Self {
            entry: h.entry.clone(),
            host: h.host.clone(),
            state: h.state.clone(),
            latency_ms: h.latency_ms,
            error: h.error.clone(),
            maintenance: h.maintenance.clone(),
            addresses: h.addresses.clone(),
            fenced: h.fenced.clone(),
        }
    }
}

impl PoolMemberRow {
    /// The row of member `m`: available only when it counts towards the pool (neither
    /// quarantined nor being deleted).
    pub fn of(m: &Member) -> Self {
        Self {
            name: m.name.clone(),
            host: m.host.clone(),
            phase: m.phase,
            available: m.available && m.quarantine.is_none() && m.draining.is_none() && !m.deleting,
            template_hash: m.template_hash.clone(),
            created_at: humantime::format_rfc3339_seconds(m.created).to_string(),
            quarantine: m.quarantine.clone(),
            deleting: m.deleting,
            egress_address: m.egress_address.clone(),
            draining_since: m
                .draining
                .map(|d| humantime::format_rfc3339_seconds(d.since).to_string()),
        }
    }
}

/// The provider entry of a proxy row, from its `libvirt://ENTRY/HOST/NAME` provider ID.
pub fn entry_of(p: &ProxyStatusRow) -> Option<&str> {
    let rest = p.provider_id.as_deref()?.split_once("://")?.1;
    rest.split('/').next().filter(|e| !e.is_empty())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use crate::filters::Filters;

    #[test]
    fn the_status_document_round_trips_through_json() {
        let d = StatusDocument {
            generated_at: "2026-01-01T00:00:00Z".into(),
            proxies: vec![ProxyStatusRow {
                namespace: "default".into(),
                name: "p1".into(),
                uid: "0f8fad5b-d9cb-469f-a165-70867728950e".into(),
                phase: Phase::Running,
                host: Some("h1".into()),
                ip: Some("192.0.2.1".into()),
                provider_id: Some("libvirt://local/h1/ep-local-x".into()),
                created_at: "2026-01-01T00:00:00Z".into(),
                last_error: None,
                conditions: vec![],
                port: Some(3128),
                health: Some(HealthStatus {
                    healthy: Some(true),
                    egress_ip: Some("203.0.113.7".into()),
                    ..HealthStatus::default()
                }),
                reputation: None,
                egress_address: Vec::new(),
            }],
            hosts: vec![HostStatusRow {
                entry: "local".into(),
                host: "h1".into(),
                state: "Ready".into(),
                latency_ms: Some(3),
                error: None,
                maintenance: None,
                addresses: Vec::new(),
                fenced: None,
            }],
            manifest_errors: vec!["a.yaml: bad".into()],
            pools: vec![],
        };
        let j = serde_json::to_string(&d).unwrap();
        assert!(j.contains("\"generatedAt\"") && j.contains("\"providerId\""));
        assert!(j.contains("\"egressIp\":\"203.0.113.7\""), "{j}");
        assert_eq!(
            d.proxies[0].healthy_endpoint(),
            Some("192.0.2.1:3128".parse().unwrap())
        );
        let back: StatusDocument = serde_json::from_str(&j).unwrap();
        assert_eq!(back, d);
    }

    fn row(name: &str, phase: Phase, host: Option<&str>, healthy: Option<bool>) -> ProxyStatusRow {
        ProxyStatusRow {
            namespace: "default".into(),
            name: name.into(),
            uid: String::new(),
            phase,
            host: host.map(Into::into),
            ip: None,
            provider_id: host.map(|h| format!("libvirt://local/{h}/ep-local-{name}")),
            created_at: String::new(),
            last_error: None,
            conditions: vec![],
            port: Some(3128),
            health: healthy.map(|h| HealthStatus {
                healthy: Some(h),
                ..HealthStatus::default()
            }),
            reputation: None,
            egress_address: Vec::new(),
        }
    }

    fn fleet() -> StatusDocument {
        let host = |h: &str, state: &str| HostStatusRow {
            entry: "local".into(),
            host: h.into(),
            state: state.into(),
            latency_ms: None,
            error: None,
            maintenance: None,
            addresses: Vec::new(),
            fenced: None,
        };
        StatusDocument {
            generated_at: "2026-01-01T00:00:00Z".into(),
            proxies: vec![
                row("a", Phase::Running, Some("h1"), Some(true)),
                row("b", Phase::Running, Some("h2"), Some(false)),
                row("c", Phase::Pending, None, None),
                row("d", Phase::Provisioning, Some("h1"), None),
            ],
            hosts: vec![host("h1", "Ready"), host("h2", "Degraded")],
            manifest_errors: vec!["x.yaml: bad".into()],
            pools: vec![],
        }
    }

    fn names(d: &StatusDocument) -> Vec<&str> {
        d.proxies.iter().map(|p| p.name.as_str()).collect()
    }

    #[test]
    fn filters_by_phase_host_entry_and_health_keep_only_matching_rows() {
        let d = fleet();
        let f = |q: &str| d.filtered(&Filters::from_query(Some(q)));
        assert_eq!(names(&f("phase=Running")), ["a", "b"]);
        assert_eq!(
            f("phase=Running").hosts.len(),
            2,
            "a phase keeps every host"
        );
        assert_eq!(names(&f("host=h1")), ["a", "d"]);
        assert_eq!(f("host=h1").hosts.len(), 1);
        assert_eq!(names(&f("health=Unhealthy")), ["b"]);
        assert_eq!(names(&f("health=Unchecked")), ["c", "d"]);
        assert_eq!(names(&f("phase=Running&health=Healthy")), ["a"]);
        assert_eq!(names(&f("entry=local")), ["a", "b", "d"], "c is not placed");
        assert!(f("entry=other").proxies.is_empty());
        assert_eq!(names(&f("state=Pending")), ["c"]);
        assert_eq!(f("state=Degraded").hosts.len(), 1);
        assert!(f("pool=p").proxies.is_empty(), "proxies carry no pool yet");
        assert_eq!(f("").proxies.len(), 4, "no filter keeps everything");
        assert_eq!(f("phase=Running").manifest_errors.len(), 1);
    }

    struct Doc;
    impl crate::Endpoints for Doc {
        fn status(&self) -> StatusDocument {
            fleet()
        }
        fn metrics(&self, _: egress_core::metrics::MetricsFormat) -> String {
            String::new()
        }
        fn ready(&self) -> bool {
            true
        }
    }

    #[test]
    fn status_and_proxies_answer_only_the_rows_their_query_keeps_and_everything_without_one() {
        use http_body_util::BodyExt;
        use hyper::Method;

        use crate::{Routes, handle_request};

        let get = |path: &str, q: Option<&str>| {
            let r = handle_request(&Doc, None, Routes::All, &Method::GET, path, q);
            assert!(r.status().is_success(), "{path}?{q:?}");
            let body = futures_util::FutureExt::now_or_never(r.into_body().collect())
                .unwrap()
                .unwrap()
                .to_bytes();
            body.to_vec()
        };
        let doc: StatusDocument =
            serde_json::from_slice(&get("/status", Some("phase=Running&host=h2"))).unwrap();
        assert_eq!(names(&doc), ["b"]);
        let rows: Vec<ProxyStatusRow> =
            serde_json::from_slice(&get("/proxies", Some("health=Healthy"))).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].name, "a");
        let all: StatusDocument = serde_json::from_slice(&get("/status", None)).unwrap();
        assert_eq!(all, fleet());
    }

    #[test]
    fn a_pools_healthy_list_holds_its_available_members_only_and_is_served_per_pool() {
        use http_body_util::BodyExt;
        use hyper::Method;

        use crate::{Routes, handle_request};

        struct D(StatusDocument);
        impl crate::Endpoints for D {
            fn status(&self) -> StatusDocument {
                self.0.clone()
            }
            fn metrics(&self, _: egress_core::metrics::MetricsFormat) -> String {
                String::new()
            }
            fn ready(&self) -> bool {
                true
            }
        }
        let member = |name: &str, available: bool| PoolMemberRow {
            name: name.into(),
            host: Some("h1".into()),
            phase: Phase::Running,
            available,
            template_hash: "t".into(),
            created_at: String::new(),
            quarantine: None,
            deleting: false,
            egress_address: Vec::new(),
            draining_since: None,
        };
        let mut doc = fleet();
        for (p, ip) in doc.proxies.iter_mut().zip(1..) {
            p.ip = Some(format!("192.0.2.{ip}"));
        }
        let names: Vec<String> = doc.proxies.iter().map(|p| p.name.clone()).collect();
        let mut quarantined = member(&names[1], true);
        quarantined.quarantine = Some("banned".into());
        let mut going = member(&names[2], true);
        going.deleting = true;
        doc.pools = vec![PoolStatusRow {
            namespace: "default".into(),
            name: "web".into(),
            desired: 3,
            status: egress_core::pool::ProxyPoolStatus::default(),
            members: vec![
                member(&names[0], true),
                quarantined,
                going,
                member(&names[3], false),
            ],
            error: None,
        }];
        assert_eq!(
            doc.pool_healthy_list("default", "web").as_deref(),
            Some("192.0.2.1:3128\n")
        );
        assert_eq!(doc.pool_healthy_list("other", "web"), None);
        let ep = D(doc);
        let get = |path: &str| {
            let r = handle_request(&ep, None, Routes::All, &Method::GET, path, None);
            let code = r.status().as_u16();
            let body = futures_util::FutureExt::now_or_never(r.into_body().collect())
                .unwrap()
                .unwrap()
                .to_bytes();
            (code, String::from_utf8(body.to_vec()).unwrap())
        };
        assert_eq!(
            get("/pools/web/healthy.txt"),
            (200, "192.0.2.1:3128\n".into())
        );
        assert_eq!(get("/pools/default/web/healthy.txt").0, 200);
        assert_eq!(get("/pools/nope/healthy.txt").0, 404);
        assert_eq!(get("/pools/a/b/web/healthy.txt").0, 404);
    }
}
