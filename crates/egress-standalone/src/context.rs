//! What every job of the standalone driver acts through: the core controller, the providers
//! in effect, the metrics and their exposition, the proxy health engine, the work queues and
//! the requeue timers, the reputation checks and the retired addresses. What the driver knows is the [`crate::store::Store`].
//!
//! Guarantees: the providers are swapped whole (a reader gets the old set or the new one,
//! never a mix) and the controller is given the same set; after shutdown began
//! ([`Context::stopping`]) no requeue timer is started. No lock is held across an `.await`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use egress_core::controller::Controller;
use egress_core::health::HealthEngine;
use egress_core::metrics::Metrics;
use egress_core::providers::Providers;
use egress_core::reputation::ReputationService;
use egress_provider::ProxyUid;
use egress_provider::libvirt::retired::RetiredAddresses;
use egress_provider::sync::{read, write};
use egress_web::exposition::Exposition;

use crate::queue::{PoolQueue, WorkQueue};
use crate::timers::Timers;

/// The handles the driver's jobs act through.
pub(crate) struct Context {
    /// The core reconciler.
    pub(crate) controller: Arc<Controller>,
    providers: RwLock<Arc<Providers>>,
    /// The operator's metrics.
    pub(crate) metrics: Metrics,
    /// Renders `/metrics` (keeps the controller's image-byte total already exported).
    pub(crate) exposition: Exposition,
    /// The proxy health engine, when health checks are on.
    pub(crate) health: Option<Arc<HealthEngine>>,
    /// Proxies to reconcile.
    pub(crate) queue: WorkQueue,
    /// Pools to decide again.
    pub(crate) pool_queue: PoolQueue,
    /// When each Proxy is reconciled again.
    pub(crate) timers: Timers,
    /// Set at shutdown: no requeue timer is started any more.
    pub(crate) stopping: AtomicBool,
    /// The manifest directory (pools keep their files beside their manifests).
    pub(crate) manifest_dir: PathBuf,
    /// The DNS blocklist checks of the egress addresses (settings, results, metrics).
    pub(crate) reputation: Arc<ReputationService>,
    /// The process's retired addresses: every pool's `status.retiredAddresses` in effect,
    /// shared with the providers of every config load.
    pub(crate) retired: Arc<RetiredAddresses>,
}

impl Context {
    /// A context over `providers` and a controller using them; `health` turns the proxy
    /// health engine on (its metrics in `metrics`' registry).
    pub(crate) fn new(
        controller: Arc<Controller>,
        providers: Arc<Providers>,
        metrics: Metrics,
        health: Option<Arc<HealthEngine>>,
        manifest_dir: PathBuf,
    ) -> Self {
        // NB: unprimed: nothing is allocated until the pools' retirements were read back
        // from their member files (`lib.rs` primes it after the first manifest scan).
        let retired = Arc::new(RetiredAddresses::unprimed());
        providers.with_retired_ref(&retired);
        let reputation = Arc::new(ReputationService::new(
            providers.reputation().clone(),
            metrics.reputation(),
        ));
        Self {
            controller,
            providers: RwLock::new(providers),
            metrics,
            exposition: Exposition::new(),
            health,
            queue: WorkQueue::default(),
            pool_queue: PoolQueue::default(),
            timers: Timers::default(),
            stopping: AtomicBool::new(false),
            manifest_dir,
            reputation,
            retired,
        }
    }

    /// The providers in effect.
    pub(crate) fn providers(&self) -> Arc<Providers> {
        read(&self.providers).clone()
    }

    /// Puts `p` in effect, for the controller too; its providers consult the process's
    /// retired addresses and its `reputation:` settings take effect.
    pub(crate) fn set_providers(&self, p: Arc<Providers>) {
        p.with_retired_ref(&self.retired);
        self.reputation.set_settings(p.reputation().clone());
        self.controller.set_providers(Arc::clone(&p));
        *write(&self.providers) = p;
    }

    /// Re-queues `uid` after `after`, replacing any earlier timer of it (nothing once
    /// stopping).
    pub(crate) fn schedule(&self, uid: ProxyUid, after: Duration) {
        if self.stopping.load(Ordering::SeqCst) {
            return;
        }
        self.timers.schedule(uid, after);
    }
}
