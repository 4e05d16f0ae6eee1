//! The standalone driver's side of the shared proxy health task
//! ([`egress_core::background::proxy_health`]): the targets are the [`Store`]'s Proxies that
//! are Running with an address, and after each round every Proxy's health is merged into its
//! status (`Healthy`, `Ready` = Running ∧ Healthy).
//!
//! Guarantees: a Proxy a round turned Unhealthy is queued for a reconcile at once (the work
//! queue's de-duplication keeps it to one); a Proxy being deleted is not probed; the engine
//! keeps the state of every Proxy the store knows (deleting ones included) and drops the rest.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::SystemTime;

use egress_core::background::proxy_health::ProxyHealthDriver;
use egress_core::health::{self, HealthEngine, ProbeTarget, RoundReport};
use egress_provider::ProxyUid;
use egress_provider::sync::lock;

use crate::context::Context;
use crate::store::Store;

/// The targets and the status merge of the proxy health task, over the [`Store`].
pub(crate) struct ProxyHealth {
    store: Arc<Store>,
    ctx: Arc<Context>,
}

impl ProxyHealth {
    /// Health checks of `store`'s Proxies; Proxies turned Unhealthy go to `ctx`'s work queue.
    pub(crate) fn new(store: Arc<Store>, ctx: Arc<Context>) -> Self {
        Self { store, ctx }
    }
}

impl ProxyHealthDriver for ProxyHealth {
    fn targets(&self) -> Vec<ProbeTarget> {
        lock(&self.store.objects)
            .iter()
            .filter(|(_, o)| !o.object.deleting)
            .filter_map(|(uid, o)| {
                ProbeTarget::of(
                    *uid,
                    format!("{}/{}", o.object.namespace, o.object.name),
                    &o.object.spec.provider,
                    &o.object.spec.proxy,
                    o.object.credentials.as_ref(),
                    &o.status,
                )
            })
            .collect()
    }

    fn known(&self) -> HashSet<ProxyUid> {
        lock(&self.store.objects).keys().copied().collect()
    }

    fn round_done(&self, engine: &HealthEngine, _report: &RoundReport) {
        let now = SystemTime::now();
        lock(&self.store.objects).for_each_mut(|uid, o| {
            let previous = o.status.clone();
            health::apply_to_status(
                &mut o.status,
                engine.get(uid).as_ref(),
                Some(&previous),
                now,
                o.object.generation,
            );
        });
    }

    fn reconcile_now(&self, proxies: &[(ProxyUid, String)]) {
        for (uid, _) in proxies {
            self.ctx.queue.add(*uid);
        }
    }
}
