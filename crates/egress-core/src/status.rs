//! The JSON document `GET /status` serves in standalone mode, and that the CLI's `status`
//! command reads back.
//!
//! Guarantees: the shape is plain data (Serialize + Deserialize round-trip), field names are
//! camelCase and stable; every message in it was redacted before it got here (conditions
//! are redacted by [`crate::model`], host errors by the provider).

use serde::{Deserialize, Serialize};

use crate::model::{Condition, HealthStatus, Phase};

/// The one filter type of `/status`, `/proxies`, the fleet page and the CLI's `status`
/// (`?entry=&host=&pool=&state=&phase=&health=`).
pub use crate::web::page::Filters;

impl StatusDocument {
    /// The document with only the proxy rows `f` keeps and the host rows it keeps (a filter
    /// on a proxy's phase or health leaves the host rows whole); manifest errors are kept.
    /// O(rows).
    pub fn filtered(&self, f: &Filters) -> StatusDocument {
        let host_filter = Filters {
            phase: None,
            health: None,
            ..f.clone()
        };
        StatusDocument {
            generated_at: self.generated_at.clone(),
            proxies: self
                .proxies
                .iter()
                .filter(|p| f.keeps_proxy(p))
                .cloned()
                .collect(),
            hosts: self
                .hosts
                .iter()
                .filter(|h| host_filter.keeps_host(h))
                .cloned()
                .collect(),
            manifest_errors: self.manifest_errors.clone(),
        }
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
    pub hosts: Vec<HostRow>,
    /// Current manifest errors (bad files keep their last good version).
    pub manifest_errors: Vec<String>,
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
}

/// One host of one provider entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostRow {
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
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

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
            }],
            hosts: vec![HostRow {
                entry: "local".into(),
                host: "h1".into(),
                state: "Ready".into(),
                latency_ms: Some(3),
                error: None,
            }],
            manifest_errors: vec!["a.yaml: bad".into()],
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
        }
    }

    fn fleet() -> StatusDocument {
        let host = |h: &str, state: &str| HostRow {
            entry: "local".into(),
            host: h.into(),
            state: state.into(),
            latency_ms: None,
            error: None,
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
    impl crate::web::Endpoints for Doc {
        fn status(&self) -> StatusDocument {
            fleet()
        }
        fn metrics(&self, _: crate::metrics::MetricsFormat) -> String {
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

        use crate::web::{Routes, handle_request};

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
}
