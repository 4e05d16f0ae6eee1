//! What a driver hands the serving layer: the [`Endpoints`] every listener reads the fleet
//! from. A driver implements it over its own store (standalone) or cache (Kubernetes).
//!
//! Guarantees: every method answers from memory, without waiting on a host or the
//! Kubernetes API; the defaults build what a driver leaves out from its status document.

use egress_core::host_health::HostHealth;
use egress_core::metrics::MetricsFormat;
use egress_provider::model::ProxyUid;

use crate::status::{ProxyStatusRow, StatusDocument};

/// What the endpoint reads from the running operator.
pub trait Endpoints: Send + Sync + 'static {
    /// The current status document.
    fn status(&self) -> StatusDocument;
    /// The metrics text in `format`.
    fn metrics(&self, format: MetricsFormat) -> String;
    /// Whether the config is loaded and the first adoption is done.
    fn ready(&self) -> bool;
    /// What `/readyz` says while [`Endpoints::ready`] is false (the Kubernetes driver has
    /// its own readiness rule).
    fn not_ready_reason(&self) -> String {
        "waiting for the first adoption".to_owned()
    }
    /// The `/pools/…/healthy.txt` body of pool `namespace/name` (`None`: no such pool); by
    /// default from the status document ([`StatusDocument::pool_healthy_list`]).
    fn pool_healthy(&self, namespace: &str, name: &str) -> Option<String> {
        self.status().pool_healthy_list(namespace, name)
    }
    /// The status document without its proxy rows, and the UIDs of those rows in the
    /// document's order (namespace/name), for `/status` and `/proxies` to build the rows a
    /// chunk at a time ([`Endpoints::status_rows`], [`crate::stream::StatusBody::live`]). `None`
    /// (the default): the whole document ([`Endpoints::status`]) is built per request and
    /// only its serialization is chunked.
    fn status_outline(&self) -> Option<(StatusDocument, Vec<ProxyUid>)> {
        None
    }
    /// The rows of `uids` (from [`Endpoints::status_outline`]) that still exist, in the
    /// order of `uids`; a Proxy gone meanwhile is left out. O(`uids`).
    fn status_rows(&self, uids: &[ProxyUid]) -> Vec<ProxyStatusRow> {
        let _ = uids;
        Vec::new()
    }
    /// Every host's last check (`/hosts`); by default built from the status document's rows.
    fn hosts(&self) -> Vec<HostHealth> {
        self.status()
            .hosts
            .into_iter()
            .map(|r| HostHealth {
                state: r.state.clone(),
                accepts_placements: r.state == "Ready" || r.state == "Unknown",
                latency_ms: r.latency_ms,
                error: r.error,
                maintenance: r.maintenance,
                fenced: r.fenced,
                ..HostHealth::unknown(&r.entry, &r.host)
            })
            .collect()
    }
}
