//! The standalone driver's side of the shared GC task ([`egress_core::background::gc`]):
//! the live set is every Proxy this process knows.
//!
//! Guarantees:
//! - The live set is every Proxy of the [`Store`] (deleting ones included), taken before
//!   listing; a pass is skipped while the manifest directory cannot be listed or adoption is
//!   not complete.
//! - GC follows the `gc` command's empty-set rule: while this process knows no Proxy at all,
//!   no pass runs unless the empty set was allowed, and the refusal is logged when it starts
//!   and when it ends, not on every pass.
//! - A pass whose listing of an entry was complete refreshes where the controller thinks
//!   that entry's instances are.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use egress_core::background::gc::GcDriver;
use egress_core::gc::{self, GcReport};
use egress_core::providers::Providers;
use egress_provider::ProxyUid;
use egress_provider::sync::lock;

use crate::context::Context;
use crate::store::Store;

/// Standalone's GC driver: the [`Store`]'s Proxies under the `gc` command's empty-set rule.
///
/// Guarantees: with `allow_empty` false, a pass whose live set is empty is skipped (an empty or
/// wrong manifest directory would otherwise make every instance an orphan); the refusal is
/// logged at WARN once when it begins and at INFO once when Proxies appear again.
pub(crate) struct StandaloneGc {
    store: Arc<Store>,
    ctx: Arc<Context>,
    allow_empty: bool,
    refusing: AtomicBool,
}

impl StandaloneGc {
    /// GC over `store`'s Proxies; `allow_empty` lets a pass collect with no Proxy known.
    pub(crate) fn new(store: Arc<Store>, ctx: Arc<Context>, allow_empty: bool) -> Self {
        Self {
            store,
            ctx,
            allow_empty,
            refusing: AtomicBool::new(false),
        }
    }

    /// Every Proxy this process knows, or `None` while that is not a complete view.
    fn known(&self) -> Option<HashSet<ProxyUid>> {
        if !self.store.directory_ok.load(Ordering::SeqCst)
            || !self.store.ready.load(Ordering::SeqCst)
        {
            tracing::warn!("GC skipped: manifests unreadable or adoption not complete");
            return None;
        }
        // NB: the live set is taken before listing (GC's contract): every Proxy this process
        // knows, deleting ones included, so GC never races the reconciler's own deletes.
        Some(lock(&self.store.objects).keys().copied().collect())
    }
}

impl GcDriver for StandaloneGc {
    fn providers(&self) -> Arc<Providers> {
        self.ctx.providers()
    }

    async fn live_set(&self) -> Option<HashSet<ProxyUid>> {
        let live = self.known()?;
        let refuse = live.is_empty() && !self.allow_empty;
        let was = self.refusing.swap(refuse, Ordering::SeqCst);
        if refuse && !was {
            tracing::warn!(
                "GC skipped: no Proxy manifest is known, so every instance would count as an \
                 orphan; check --proxies, or pass --gc-allow-empty if no Proxy should exist"
            );
        } else if !refuse && was {
            tracing::info!(
                proxies = live.len(),
                "GC resumed: Proxy manifests are known again"
            );
        }
        (!refuse).then_some(live)
    }

    fn collected(&self, report: &GcReport) {
        let deleted = report.deleted_of(gc::ItemKind::Instance);
        for i in report.with_action(gc::Action::Deleted) {
            tracing::info!(entry = %i.entry, host = %i.host, name = %i.name, reason = %i.reason, "GC deleted");
        }
        for i in report.with_action(gc::Action::Failed) {
            tracing::warn!(entry = %i.entry, host = %i.host, name = %i.name, reason = %i.reason, "GC deletion failed");
        }
        for e in &report.entries {
            if e.instances_error.is_none() {
                // The listing is complete: refresh where instances are.
                self.ctx.controller.adopt(&e.entry, &e.listed);
            }
        }
        self.ctx.metrics.gc_ran(
            if report.is_clean() {
                "ok"
            } else {
                "incomplete"
            },
            u64::try_from(deleted).unwrap_or(u64::MAX),
        );
    }
}
