//! The JSON document `GET /status` serves in standalone mode, and that the CLI's `status`
//! command reads back.
//!
//! Guarantees: the shape is plain data (Serialize + Deserialize round-trip), field names are
//! camelCase and stable; every message in it was redacted before it got here (conditions
//! are redacted by [`crate::model`], host errors by the provider).

use serde::{Deserialize, Serialize};

use crate::model::{Condition, HealthStatus, Phase};

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
}
