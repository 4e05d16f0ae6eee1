//! The leader-only orphan GC loop: every Proxy's UID in the cluster is the live set.
//!
//! Guarantees: a pass is skipped unless that list was had completely within
//! [`super::LIVE_SET_DEADLINE`] with a canonical uid on every Proxy.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use egress_core::gc::{self, GcSettings};
use egress_core::providers::Providers;
use egress_provider::ProxyUid;
use kube::Client;
use kube::api::{Api, ListParams};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{DriverStats, LIVE_SET_DEADLINE, sleep_or_stop};
use crate::api::Proxy;

/// Leader-only: orphan GC over every entry, with the UIDs of every Proxy in the cluster as
/// the live set (a pass is skipped when that list cannot be had completely).
pub(super) async fn gc_loop(
    client: Client,
    providers: watch::Receiver<Arc<Providers>>,
    settings: GcSettings,
    interval: Duration,
    stats: Arc<DriverStats>,
    stop: CancellationToken,
) {
    let all: Api<Proxy> = Api::all(client);
    while sleep_or_stop(interval, &stop).await {
        // rbac: PROXIES list
        let live = match tokio::time::timeout(
            LIVE_SET_DEADLINE,
            all.list_metadata(&ListParams::default()),
        )
        .await
        {
            Ok(Ok(list)) => {
                let mut live = HashSet::new();
                let mut complete = true;
                for p in &list.items {
                    match p.metadata.uid.as_deref().and_then(ProxyUid::parse_strict) {
                        Some(u) => {
                            live.insert(u);
                        }
                        None => complete = false,
                    }
                }
                if !complete {
                    tracing::warn!("GC skipped: a Proxy has no canonical uid");
                    continue;
                }
                live
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "GC skipped: cannot list Proxies");
                continue;
            }
            Err(_) => {
                tracing::warn!("GC skipped: listing Proxies timed out");
                continue;
            }
        };
        let p = providers.borrow().clone();
        let report = tokio::select! {
            () = stop.cancelled() => return,
            r = gc::collect(&p, &live, &settings, SystemTime::now()) => r,
        };
        stats.gc_passes.fetch_add(1, Ordering::Relaxed);
        tracing::info!(%report, "GC pass");
    }
}
