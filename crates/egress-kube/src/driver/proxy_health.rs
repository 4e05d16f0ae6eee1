//! The Kubernetes driver's side of the shared proxy health worker
//! ([`egress_core::background::proxy_health`]): targets and the set of known Proxies come
//! from the controller's watch cache, the credentials from what each Proxy's last reconcile
//! read; after each round the publishing pass is woken, which merges the new states into
//! status.
//!
//! Guarantees: the first round starts only once the watch cache holds a complete first
//! listing (so no Proxy's state is dropped for being missing from a partial cache); Proxies
//! gone from the cache are dropped from the engine, a Proxy only not probed this round keeps
//! its state (finding H3). The worker runs only while this replica leads (it is started with
//! the term's stop token).

use std::collections::HashSet;
use std::sync::Arc;

use egress_core::background::proxy_health::{self, ProxyHealthDriver};
use egress_core::health::{HealthEngine, ProbeTarget, RoundReport};
use egress_provider::ProxyUid;
use kube::Resource;
use kube::runtime::reflector::Store;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use super::status::wait_synced;
use super::{Ctx, key_of, lock, uid_of};
use crate::api::Proxy;

/// Probe targets from the watch cache; a round's end wakes the publisher.
struct CacheTargets {
    ctx: Arc<Ctx>,
    store: Store<Proxy>,
    wake: Arc<Notify>,
}

impl ProxyHealthDriver for CacheTargets {
    fn targets(&self) -> Vec<ProbeTarget> {
        let creds = lock(&self.ctx.creds).clone();
        self.store
            .state()
            .iter()
            .filter(|p| p.meta().deletion_timestamp.is_none())
            .filter_map(|p| {
                let uid = uid_of(p)?;
                let status = p.status.as_ref()?;
                let c = creds.get(&uid).cloned().flatten();
                ProbeTarget::of(
                    uid,
                    key_of(p),
                    &p.spec.provider,
                    &p.spec.proxy,
                    c.as_ref(),
                    status,
                )
            })
            .collect()
    }

    fn known(&self) -> HashSet<ProxyUid> {
        self.store
            .state()
            .iter()
            .filter_map(|p| uid_of(p))
            .collect()
    }

    fn round_done(&self, _engine: &HealthEngine, _report: &RoundReport) {
        self.wake.notify_one();
    }
}

/// Leader-only: once the watch cache synced, runs the proxy health engine over every Running
/// Proxy with an address in it (not being deleted), waking the publishing pass after each
/// round.
pub(super) async fn run(
    ctx: Arc<Ctx>,
    engine: Arc<HealthEngine>,
    store: Store<Proxy>,
    mut synced: watch::Receiver<bool>,
    wake: Arc<Notify>,
    stop: CancellationToken,
) {
    if !wait_synced(&mut synced, &stop).await {
        return;
    }
    let targets = Arc::new(CacheTargets { ctx, store, wake });
    proxy_health::run(targets, engine, stop).await;
}
