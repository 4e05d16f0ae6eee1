//! The standalone driver's side of the shared reputation worker
//! ([`egress_core::background::reputation`]): the Proxies checked are the [`Store`]'s (not
//! being deleted), at the addresses this process knows for them (declared by the provider,
//! observed by the health check: [`egress_core::reputation::proxy_addresses`]); after each
//! round the results are merged into every Proxy's status (`reputation`, the `Listed`
//! condition), each change is logged as an event line (`Listed`, `Delisted`,
//! `ReputationCheckFailed`), and every pool is decided again (a listing may unpublish or
//! replace a member under the pool's `reputation.onListed`).
//!
//! Guarantees: a reconcile merges the results as of its end too ([`merge`]), deciding the
//! event against what the status showed before, so a change is logged once whichever merge
//! sees it first. No lock is held across a query; the book and the objects are never locked
//! together.

use std::sync::Arc;
use std::time::SystemTime;

use egress_core::background::reputation::ReputationDriver;
use egress_core::controller::{Event, EventKind};
use egress_core::model::{ProxyStatus, condition};
use egress_core::reputation::{
    ProxyReputation, ReputationService, ReputationTarget, RoundDone, apply_to_status,
    proxy_addresses,
};
use egress_provider::ProxyUid;
use egress_provider::sync::lock;

use crate::context::Context;
use crate::store::Store;

/// The targets and the status merge of the reputation worker, over the [`Store`].
pub(crate) struct Reputation {
    store: Arc<Store>,
    ctx: Arc<Context>,
}

impl Reputation {
    /// Reputation checks of `store`'s Proxies.
    pub(crate) fn new(store: Arc<Store>, ctx: Arc<Context>) -> Self {
        Self { store, ctx }
    }
}

/// The reputation view of `uid` as of now (`None` with checks off or before a first check).
pub(crate) fn view_of(ctx: &Context, uid: &ProxyUid) -> Option<ProxyReputation> {
    ctx.reputation
        .proxy_view(&ctx.controller, ctx.health.as_deref(), uid)
}

/// Merges `view` into `status`, whose reputation and `Listed` condition before the merge are
/// those of `shown` (the status as last published: a reconcile's new status is decided
/// against the one it replaces); logs the change's event for Proxy `key`.
pub(crate) fn merge(
    ctx: &Context,
    key: &str,
    status: &mut ProxyStatus,
    shown: Option<&ProxyStatus>,
    view: Option<ProxyReputation>,
    generation: i64,
) {
    if let Some(before) = shown {
        status.reputation.clone_from(&before.reputation);
        status.conditions.retain(|c| c.type_ != condition::LISTED);
        if let Some(c) = before.condition(condition::LISTED) {
            status.conditions.push(c.clone());
        }
    }
    if let Some(ev) = apply_to_status(
        status,
        view,
        ctx.reputation.enabled(),
        SystemTime::now(),
        generation,
    ) {
        log_event(key, &ev);
    }
}

/// An event of Proxy `key` as a log line (standalone mode has no event store).
pub(crate) fn log_event(key: &str, ev: &Event) {
    match ev.kind {
        EventKind::Normal => {
            tracing::info!(proxy = %key, reason = %ev.reason, message = %ev.message, "event");
        }
        EventKind::Warning => {
            tracing::warn!(proxy = %key, reason = %ev.reason, message = %ev.message, "event");
        }
    }
}

impl ReputationDriver for Reputation {
    fn targets(&self) -> Vec<ReputationTarget> {
        let keys: Vec<(ProxyUid, String)> = lock(&self.store.objects)
            .iter()
            .filter(|(_, o)| !o.object.deleting)
            .map(|(uid, o)| (*uid, format!("{}/{}", o.object.namespace, o.object.name)))
            .collect();
        keys.into_iter()
            .filter_map(|(uid, key)| {
                let addresses =
                    proxy_addresses(&self.ctx.controller, self.ctx.health.as_deref(), &uid);
                (!addresses.is_empty()).then_some(ReputationTarget {
                    uid,
                    key,
                    addresses,
                })
            })
            .collect()
    }

    fn round_done(&self, _service: &ReputationService, _done: &RoundDone) {
        let uids: Vec<ProxyUid> = lock(&self.store.objects).keys().copied().collect();
        let mut pools = std::collections::BTreeSet::new();
        for uid in uids {
            // The view is built without the objects' lock (it takes the book's).
            let view = view_of(&self.ctx, &uid);
            let mut objects = lock(&self.store.objects);
            if let Some(mut o) = objects.get_mut(&uid) {
                let key = format!("{}/{}", o.object.namespace, o.object.name);
                let generation = o.object.generation;
                let before = o.status.reputation.clone();
                merge(&self.ctx, &key, &mut o.status, None, view, generation);
                if before != o.status.reputation
                    && let Some(p) = &o.pool
                {
                    pools.insert(p.clone());
                }
            }
        }
        // A pool whose member's listing changed decides again at once (`onListed`).
        for p in pools {
            self.ctx.pool_queue.add(&p);
        }
    }
}
