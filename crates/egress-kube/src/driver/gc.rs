//! The Kubernetes driver's side of the shared GC task ([`egress_core::background::gc`]):
//! the live set is the UID of every Proxy in the cluster, read from the API server.
//!
//! Guarantees: a pass is skipped unless that list was had completely within
//! [`super::LIVE_SET_DEADLINE`] with a canonical uid on every Proxy. The task runs only
//! while this replica leads (it is started with the term's stop token).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use egress_core::background::gc::GcDriver;
use egress_core::gc::{self, GcReport};
use egress_core::metrics::Metrics;
use egress_core::providers::Providers;
use egress_provider::ProxyUid;
use kube::Client;
use kube::api::{Api, ListParams};
use tokio::sync::watch;

use super::{DriverStats, LIVE_SET_DEADLINE};
use crate::api::Proxy;

/// Leader-only orphan GC over every entry, with the UIDs of every Proxy in the cluster as
/// the live set.
pub(super) struct ClusterGc {
    all: Api<Proxy>,
    providers: watch::Receiver<Arc<Providers>>,
    stats: Arc<DriverStats>,
    metrics: Metrics,
}

impl ClusterGc {
    /// GC over the providers `providers` holds, counting passes in `stats` and `metrics`.
    pub(super) fn new(
        client: Client,
        providers: watch::Receiver<Arc<Providers>>,
        stats: Arc<DriverStats>,
        metrics: Metrics,
    ) -> Self {
        Self {
            all: Api::all(client),
            providers,
            stats,
            metrics,
        }
    }
}

impl GcDriver for ClusterGc {
    fn providers(&self) -> Arc<Providers> {
        self.providers.borrow().clone()
    }

    async fn live_set(&self) -> Option<HashSet<ProxyUid>> {
        let params = ListParams::default();
        // rbac: PROXIES_LIVE_SET list (every namespace, whatever is watched)
        match tokio::time::timeout(LIVE_SET_DEADLINE, self.all.list_metadata(&params)).await {
            Ok(Ok(list)) => {
                let mut live = HashSet::new();
                for p in &list.items {
                    match p.metadata.uid.as_deref().and_then(ProxyUid::parse_strict) {
                        Some(u) => {
                            live.insert(u);
                        }
                        None => {
                            tracing::warn!("GC skipped: a Proxy has no canonical uid");
                            return None;
                        }
                    }
                }
                Some(live)
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "GC skipped: cannot list Proxies");
                None
            }
            Err(_) => {
                tracing::warn!("GC skipped: listing Proxies timed out");
                None
            }
        }
    }

    fn collected(&self, report: &GcReport) {
        self.stats.gc_passes.fetch_add(1, Ordering::Relaxed);
        tracing::info!(%report, "GC pass");
        let deleted = report.deleted_of(gc::ItemKind::Instance);
        self.metrics.gc_ran(
            if report.is_clean() {
                "ok"
            } else {
                "incomplete"
            },
            u64::try_from(deleted).unwrap_or(u64::MAX),
        );
    }
}
