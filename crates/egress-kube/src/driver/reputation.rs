//! The Kubernetes driver's side of the shared reputation worker
//! ([`egress_core::background::reputation`]): the Proxies checked come from the controller's
//! watch cache, their addresses from what the provider reported to this process (declared)
//! and what the health check saw (observed), never from `status.egressAddress` as stored in
//! the API; after each round the publishing pass is woken, which merges the results into
//! status (`reputation`, the `Listed` condition) and publishes the Events.
//!
//! Guarantees: the first round starts only once the watch cache holds a complete first
//! listing; the listings the stored statuses show are seeded into the book first, so a
//! listing's `since` survives a restart or a new term. The worker runs only while this
//! replica leads (it is started with the term's stop token).

use std::sync::Arc;

use egress_core::background::reputation::{self, ReputationDriver};
use egress_core::reputation::{ReputationService, ReputationTarget, RoundDone, proxy_addresses};
use kube::Resource;
use kube::runtime::reflector::Store;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use super::status::wait_synced;
use super::{Ctx, key_of, uid_of};
use crate::api::Proxy;

/// Targets from the watch cache; a round's end wakes the publisher.
struct CacheTargets {
    ctx: Arc<Ctx>,
    store: Store<Proxy>,
    wake: Arc<Notify>,
}

impl ReputationDriver for CacheTargets {
    fn targets(&self) -> Vec<ReputationTarget> {
        self.store
            .state()
            .iter()
            .filter(|p| p.meta().deletion_timestamp.is_none())
            .filter_map(|p| {
                let uid = uid_of(p)?;
                let addresses = self.ctx.reputation_addresses(&uid);
                (!addresses.is_empty()).then(|| ReputationTarget {
                    uid,
                    key: key_of(p),
                    addresses,
                })
            })
            .collect()
    }

    fn round_done(&self, _service: &ReputationService, _done: &RoundDone) {
        self.wake.notify_one();
    }
}

impl Ctx {
    /// The addresses `uid` is checked at ([`proxy_addresses`]: declared and observed).
    pub(super) fn reputation_addresses(
        &self,
        uid: &egress_provider::ProxyUid,
    ) -> Vec<std::net::IpAddr> {
        proxy_addresses(&self.core, self.observer.health().map(|e| &**e), uid)
    }

    /// The reputation view of `uid`'s addresses (`None` with checks off or before their
    /// first check).
    pub(super) fn reputation_view(
        &self,
        uid: &egress_provider::ProxyUid,
    ) -> Option<egress_core::reputation::ProxyReputation> {
        self.reputation
            .proxy_view(&self.core, self.observer.health().map(|e| &**e), uid)
    }
}

/// Leader-only: once the watch cache synced, seeds the stored listings and runs check rounds
/// over every Proxy with an address (not being deleted), waking the publishing pass after
/// each round.
pub(super) async fn run(
    ctx: Arc<Ctx>,
    store: Store<Proxy>,
    mut synced: watch::Receiver<bool>,
    wake: Arc<Notify>,
    stop: CancellationToken,
) {
    if !wait_synced(&mut synced, &stop).await {
        return;
    }
    for p in store.state() {
        if let Some(r) = p.status.as_ref().and_then(|s| s.reputation.as_ref()) {
            ctx.reputation.seed(r);
        }
    }
    let service = Arc::clone(&ctx.reputation);
    let targets = Arc::new(CacheTargets { ctx, store, wake });
    reputation::run(targets, service, stop).await;
}
