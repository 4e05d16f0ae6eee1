//! What the standalone driver serves over HTTP ([`egress_core::web::serve`]): the status
//! document built from the shared state, `/metrics` ([`Exposition`]), readiness and the host
//! rows.
//!
//! `/status` and `/proxies` do not build the whole document: they take its outline (hosts,
//! pools, manifest errors and the Proxies' UIDs sorted by namespace/name) and then build the
//! rows a chunk at a time as the body is sent ([`egress_core::web::stream`]), so a request at
//! 10,000 Proxies holds ~160 KB of UIDs and one chunk rather than every row and its JSON.
//!
//! Guarantees: every view is a snapshot taken under short locks, never across an `.await`;
//! serving a request never waits on a host. A streamed row is the Proxy's state when its
//! chunk is built; a Proxy gone by then is left out. Readiness turns on once every entry was
//! adopted from a complete listing and stays on through a bad config reload (see the crate
//! doc).

use std::sync::atomic::Ordering;
use std::time::SystemTime;

use egress_core::hosthealth::HostHealth;
use egress_core::status::{ProxyStatusRow, StatusDocument};
use egress_provider::model::ProxyUid;

use crate::lock;
use crate::shared::{Obj, Shared};

impl Shared {
    /// The `/status` document: every known Proxy sorted by namespace and name, the host rows
    /// and the manifest errors of the last scan.
    pub(crate) fn status_document(&self) -> StatusDocument {
        let (mut doc, uids) = self.status_outline_now();
        doc.proxies = self.status_rows_of(&uids);
        doc
    }

    /// The document without its rows, and the rows' UIDs sorted by namespace, name (and UID,
    /// the order the objects map lists two objects of one name in). O(n log n) under the
    /// objects lock, O(n) UIDs kept.
    fn status_outline_now(&self) -> (StatusDocument, Vec<ProxyUid>) {
        let uids: Vec<ProxyUid> = {
            let objects = lock(&self.objects);
            let mut keys: Vec<(&str, &str, ProxyUid)> = objects
                .iter()
                .map(|(uid, o)| (o.object.namespace.as_str(), o.object.name.as_str(), *uid))
                .collect();
            keys.sort_unstable();
            keys.into_iter().map(|(_, _, uid)| uid).collect()
        };
        let doc = StatusDocument {
            generated_at: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
            proxies: Vec::new(),
            hosts: lock(&self.hosts).values().cloned().collect(),
            manifest_errors: lock(&self.manifest_errors).clone(),
            pools: self.pool_rows(),
        };
        (doc, uids)
    }

    /// The rows of `uids` still known, in that order. O(|uids| log n) under the objects lock.
    fn status_rows_of(&self, uids: &[ProxyUid]) -> Vec<ProxyStatusRow> {
        let objects = lock(&self.objects);
        uids.iter()
            .filter_map(|uid| objects.get(uid))
            .map(|o| self.status_row(o))
            .collect()
    }

    fn status_row(&self, o: &Obj) -> ProxyStatusRow {
        ProxyStatusRow {
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
            reputation: o.status.reputation.clone(),
            egress_address: o.status.egress_address.clone(),
        }
    }
}

impl egress_core::web::Endpoints for Shared {
    fn status(&self) -> StatusDocument {
        self.status_document()
    }

    fn status_outline(&self) -> Option<(StatusDocument, Vec<ProxyUid>)> {
        Some(self.status_outline_now())
    }

    fn status_rows(&self, uids: &[ProxyUid]) -> Vec<ProxyStatusRow> {
        self.status_rows_of(uids)
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
