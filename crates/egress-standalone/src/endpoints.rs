//! What the standalone driver serves over HTTP ([`egress_core::web::serve`]): the status
//! document built from the shared state, `/metrics` ([`Exposition`]), readiness and the host
//! rows.
//!
//! Guarantees: every view is a snapshot taken under short locks, never across an `.await`;
//! serving a request never waits on a host. Readiness turns on once every entry was adopted
//! from a complete listing and stays on through a bad config reload (see the crate doc).

use std::sync::atomic::Ordering;
use std::time::SystemTime;

use egress_core::hosthealth::HostHealth;
use egress_core::status::{ProxyStatusRow, StatusDocument};

use crate::lock;
use crate::shared::Shared;

impl Shared {
    /// The `/status` document: every known Proxy sorted by namespace and name, the host rows
    /// and the manifest errors of the last scan.
    pub(crate) fn status_document(&self) -> StatusDocument {
        let mut proxies: Vec<ProxyStatusRow> = lock(&self.objects)
            .values()
            .map(|o| ProxyStatusRow {
                namespace: o.object.namespace.clone(),
                name: o.object.name.clone(),
                uid: o.object.uid.canonical(),
                phase: o.status.phase,
                host: o.status.host.clone(),
                ip: o.status.ip.clone(),
                provider_id: o.status.provider_id.clone(),
                // The instance's creation (its mark's time) when known, else when this
                // process first saw the manifest.
                created_at: humantime::format_rfc3339_seconds(
                    self.controller
                        .created_at(&o.object.uid)
                        .unwrap_or(o.first_seen),
                )
                .to_string(),
                last_error: o.status.last_error(),
                conditions: o.status.conditions.clone(),
                port: Some(o.object.spec.proxy.port),
                health: o.status.health.clone(),
                egress_address: o.status.egress_address.clone(),
            })
            .collect();
        proxies.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        StatusDocument {
            generated_at: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
            proxies,
            hosts: lock(&self.hosts).values().cloned().collect(),
            manifest_errors: lock(&self.manifest_errors).clone(),
            pools: self.pool_rows(),
        }
    }
}

impl egress_core::web::Endpoints for Shared {
    fn status(&self) -> StatusDocument {
        self.status_document()
    }

    fn metrics(&self, format: egress_core::metrics::MetricsFormat) -> String {
        self.exposition
            .render(&self.metrics, Some(&self.controller), format)
    }

    fn ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    fn hosts(&self) -> Vec<HostHealth> {
        lock(&self.host_health).values().cloned().collect()
    }

    fn pool_healthy(&self, namespace: &str, name: &str) -> Option<String> {
        self.pool_healthy_list(namespace, name)
    }
}
