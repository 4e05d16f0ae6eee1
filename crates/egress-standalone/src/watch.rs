//! The manifest poller (this driver's watch): scans the manifest directory every
//! [`POLL_INTERVAL`] and merges what it finds into the [`Store`] — new and changed Proxies
//! are queued, vanished ones start deleting, pools are handed to [`crate::pool`].
//!
//! Guarantees:
//! - A vanished manifest turns its Proxy into `deleting: true` only when the directory could
//!   be listed; the Proxy is forgotten only when its reconcile reports `finalized`.
//! - A scan that found no change costs O(1) here; one that did walks the set once.
//! - A rejected manifest is logged at WARN once (again only after it was fixed and broke
//!   again), not on every poll.
//! - The scan runs off the async threads; the loop leaves at the next wait once its stop
//!   token is cancelled.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use egress_core::background::sleep_or_stop;
use egress_core::model::ProxyStatus;
use egress_provider::sync::lock;
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::manifests::{Desired, ManifestStore};
use crate::settings::POLL_INTERVAL;
use crate::store::{Obj, Store, object_of};

/// Scans the manifest directory off the async threads (it is file I/O).
pub(crate) async fn scan(mut store: ManifestStore) -> (ManifestStore, Desired) {
    let dir = store.dir().to_path_buf();
    match tokio::task::spawn_blocking(move || {
        let d = store.scan();
        (store, d)
    })
    .await
    {
        Ok(r) => r,
        Err(e) => {
            // The blocking task panicked: start over with an empty store; report the
            // directory as not ok so nothing is marked deleting on this pass.
            tracing::error!(error = %e, "manifest scan failed");
            (
                ManifestStore::new(dir),
                Desired {
                    directory_ok: false,
                    ..Desired::default()
                },
            )
        }
    }
}

/// Re-scans the manifest directory every [`POLL_INTERVAL`] and merges what it finds.
pub(crate) async fn run(
    store: &Store,
    ctx: &Context,
    mut manifests: ManifestStore,
    stop: CancellationToken,
) {
    let mut logged: HashSet<String> = HashSet::new();
    while sleep_or_stop(POLL_INTERVAL, &stop).await {
        let (m, desired) = scan(manifests).await;
        manifests = m;
        apply_desired(store, ctx, &desired);
        log_new_rejections(&mut logged, &desired.errors);
    }
}

/// Logs at WARN each manifest error not logged before, and forgets the ones that are gone (a
/// file fixed and broken again is logged again): a rejected manifest is one line, not one
/// per poll.
pub(crate) fn log_new_rejections(logged: &mut HashSet<String>, errors: &[String]) {
    logged.retain(|e| errors.contains(e));
    for e in errors {
        if logged.insert(e.clone()) {
            tracing::warn!(error = %e, "manifest rejected; its Proxy keeps its last good version, if any");
        }
    }
}

/// Merges a manifest scan into the objects: new and changed proxies are (re)queued,
/// vanished ones become `deleting` (only when the directory could be listed). A scan
/// that found no change costs O(1) here; one that did walks the set once.
pub(crate) fn apply_desired(store: &Store, ctx: &Context, d: &Desired) {
    *lock(&store.manifest_errors) = d.errors.clone();
    ctx.metrics.set_manifests_rejected(d.errors.len());
    store.directory_ok.store(d.directory_ok, Ordering::SeqCst);
    if d.unchanged {
        // The set this process applied last: nothing new, nothing vanished (O(1)).
        return;
    }
    let now = SystemTime::now();
    let mut changed = Vec::new();
    {
        let mut objects = lock(&store.objects);
        for (uid, (p, generation)) in d.proxies.iter() {
            if let Some(mut o) = objects.get_mut(uid) {
                if o.object.generation != *generation
                    || o.object.deleting
                    || o.object.spec != p.spec
                {
                    o.object = object_of(p, *generation);
                    ctx.controller.note_pins(&o.object);
                    changed.push(*uid);
                }
                continue;
            }
            let object = object_of(p, *generation);
            // NB: every manifest's pins are known before any of them is reconciled, so an
            // unpinned Proxy never takes an address a later one pins.
            ctx.controller.note_pins(&object);
            objects.insert(
                *uid,
                Obj {
                    object,
                    status: ProxyStatus::default(),
                    first_seen: now,
                    pool: None,
                },
            );
            changed.push(*uid);
        }
        if d.directory_ok {
            // NB: only `object.deleting` changes here, never a status: a plain walk.
            objects.for_each_mut(|uid, o| {
                if o.pool.is_none() && !d.proxies.contains_key(uid) && !o.object.deleting {
                    tracing::info!(proxy = %format!("{}/{}", o.object.namespace, o.object.name), "manifest removed: deleting");
                    o.object.deleting = true;
                    changed.push(*uid);
                }
            });
        }
    }
    for uid in changed {
        ctx.queue.add(uid);
    }
    crate::pool::reconcile::apply_pools(store, ctx, &d.pools, d.directory_ok);
    store.publish_phase_counts(&ctx.metrics);
}
