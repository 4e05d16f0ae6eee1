//! The proxy health task: runs the [`HealthEngine`]'s rounds over the targets the driver
//! gives; after each round, drops the state of Proxies the driver no longer knows and hands
//! the round to the driver (which merges the new states into status or wakes its publisher).
//!
//! Guarantees:
//! - A Proxy's health state is dropped only when the driver no longer knows it (deleted); a
//!   Proxy that is only not probed this round (no address for a moment) keeps its state
//!   (finding H3).
//! - **A Proxy turned Unhealthy is reconciled at once**: when a round turns a Proxy
//!   Unhealthy (from Healthy or Unknown; [`RoundReport::became_unhealthy`]), the driver is
//!   asked to reconcile it now ([`ProxyHealthDriver::reconcile_now`]) rather than at its next
//!   periodic read of a Running Proxy (a minute by default): that reconcile reads its
//!   instance, and one whose guest stopped is re-created in place at once. A Proxy whose
//!   instance still runs (only its proxy software is down) is read and left as it is. The
//!   cost is one reconcile (one provider read) per transition, never per round a Proxy stays
//!   Unhealthy; the rounds do no extra work for Proxies whose state did not change.
//! - The task stops at the next wait once its stop token is cancelled (the engine's own
//!   rounds are bounded by its probe deadlines).

use std::collections::HashSet;
use std::sync::Arc;

use egress_provider::ProxyUid;
use tokio_util::sync::CancellationToken;

use crate::health::{HealthEngine, ProbeTarget, RoundReport};

/// What the proxy health task needs from a driver.
pub trait ProxyHealthDriver: Send + Sync + 'static {
    /// The Proxies to probe now: Running, with an address, not being deleted.
    fn targets(&self) -> Vec<ProbeTarget>;

    /// Every Proxy the driver knows now (deleting ones included): the engine keeps only these.
    fn known(&self) -> HashSet<ProxyUid>;

    /// A round ended and the engine holds its states: merge them into status, or wake what
    /// publishes them.
    fn round_done(&self, engine: &HealthEngine, report: &RoundReport);

    /// Queue a reconcile now of each of these Proxies (UID, `namespace/name`), which the
    /// round just turned Unhealthy. Must not block.
    fn reconcile_now(&self, proxies: &[(ProxyUid, String)]);
}

/// Runs health rounds until `stop` is cancelled.
pub async fn run<D: ProxyHealthDriver>(
    driver: Arc<D>,
    engine: Arc<HealthEngine>,
    stop: CancellationToken,
) {
    let targets_driver = Arc::clone(&driver);
    let targets = move || targets_driver.targets();
    let round_engine = Arc::clone(&engine);
    let after_round = move |r: &RoundReport| {
        let known = driver.known();
        round_engine.retain(|u| known.contains(u));
        driver.round_done(&round_engine, r);
        if !r.became_unhealthy.is_empty() {
            tracing::info!(proxies = ?r.became_unhealthy.iter().map(|(_, k)| k).collect::<Vec<_>>(), "turned Unhealthy: reconciling now");
            driver.reconcile_now(&r.became_unhealthy);
        }
        tracing::debug!(probed = r.probed, ok = r.succeeded, elapsed = ?r.elapsed, "health round");
    };
    engine.run(targets, after_round, stop).await;
}
