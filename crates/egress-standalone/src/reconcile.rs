//! The reconcile workers: each takes a Proxy from the work queue, has the core reconcile it
//! ([`egress_core::controller::Controller::reconcile`]) and writes the outcome back into the
//! [`Store`]; plus the periodic resync that queues every Proxy.
//!
//! Guarantees:
//! - An object is reconciled by at most one worker at a time ([`crate::queue::WorkQueue`]);
//!   one whose entry is not adopted yet waits ([`crate::adoption`]), retried after
//!   `ADOPT_RETRY.min(POLL_INTERVAL)`.
//! - A Proxy is forgotten only when its reconcile reports `finalized` for a deletion; then
//!   its health state and its requeue timer go with it.
//! - A member whose phase, readiness, health or listing changed (or that finalized) wakes
//!   its pool.
//! - Each reconcile merges the reputation results as of its end into the status
//!   ([`crate::reputation::merge`]).
//! - Every loop leaves at the next wait once its stop token is cancelled.

use std::time::{Duration, SystemTime};

use egress_core::background::sleep_or_stop;
use egress_core::controller::{EventKind, Outcome, ProxyObject};
use egress_provider::ProxyUid;
use egress_provider::sync::lock;
use tokio_util::sync::CancellationToken;

use crate::adoption::{AdoptionWaits, is_adopted, mark_awaiting_adoption};
use crate::context::Context;
use crate::pool::members::pool_view;
use crate::settings::{ADOPT_RETRY, POLL_INTERVAL, RESYNC_INTERVAL};
use crate::store::Store;

/// Queues every known Proxy every [`RESYNC_INTERVAL`].
pub(crate) async fn resync_loop(store: &Store, ctx: &Context, stop: CancellationToken) {
    while sleep_or_stop(RESYNC_INTERVAL, &stop).await {
        let uids: Vec<ProxyUid> = lock(&store.objects).keys().copied().collect();
        for u in uids {
            ctx.queue.add(u);
        }
    }
}

/// Takes UIDs from the queue and reconciles each (one worker per task), until stopped.
pub(crate) async fn worker(
    store: &Store,
    ctx: &Context,
    waits: AdoptionWaits,
    stop: CancellationToken,
) {
    while let Some(uid) = ctx.queue.next(&stop).await {
        let snap = lock(&store.objects)
            .get(&uid)
            .map(|o| (o.object.clone(), o.status.clone()));
        if let Some((obj, st)) = snap {
            if is_adopted(store, ctx, &obj.spec.provider) {
                let started = std::time::Instant::now();
                let out = ctx.controller.reconcile(&obj, &st, SystemTime::now()).await;
                apply_outcome(store, ctx, uid, &obj, out, started.elapsed());
            } else {
                mark_awaiting_adoption(store, &waits, uid, &obj.spec.provider, obj.generation);
                ctx.schedule(uid, ADOPT_RETRY.min(POLL_INTERVAL));
            }
        }
        ctx.queue.done(uid);
    }
}

/// Writes a reconcile's outcome (of a reconcile that took `elapsed`) back; forgets the
/// Proxy when its deletion finalized.
pub(crate) fn apply_outcome(
    store: &Store,
    ctx: &Context,
    uid: ProxyUid,
    obj: &ProxyObject,
    out: Outcome,
    elapsed: Duration,
) {
    let key = format!("{}/{}", obj.namespace, obj.name);
    for ev in &out.events {
        crate::reputation::log_event(&key, ev);
    }
    let error_class = out
        .events
        .iter()
        .find(|e| e.kind == EventKind::Warning)
        .map(|e| e.reason.clone());
    ctx.metrics.reconciled(error_class.as_deref(), elapsed);
    let mut forget = false;
    let mut pool_dirty = None;
    // The reputation results as of now (built before the objects' lock: it takes the book's).
    let view = crate::reputation::view_of(ctx, &uid);
    {
        let mut objects = lock(&store.objects);
        let mut remove = false;
        if let Some(mut o) = objects.get_mut(&uid) {
            let before = pool_view(&o.status);
            let previous = std::mem::replace(&mut o.status, out.status);
            if let Some(engine) = &ctx.health {
                let generation = o.object.generation;
                engine.merge_reconcile(
                    &uid,
                    &mut o.status,
                    &previous,
                    out.instance_started,
                    SystemTime::now(),
                    generation,
                );
            }
            let generation = o.object.generation;
            crate::reputation::merge(ctx, &key, &mut o.status, Some(&previous), view, generation);
            remove = out.finalized && o.object.deleting;
            if let Some(k) = &o.pool
                && (remove || before != pool_view(&o.status) || previous.observed_generation == 0)
            {
                pool_dirty = Some(k.clone());
            }
        }
        if remove {
            objects.remove(&uid);
            forget = true;
        }
    }
    if let Some(k) = pool_dirty {
        ctx.pool_queue.add(&k);
    }
    if forget {
        if let Some(engine) = &ctx.health {
            engine.forget(&uid, &key);
        }
        tracing::info!(proxy = %key, "deleted: nothing left on any host");
        ctx.timers.cancel(&uid);
    } else if let Some(d) = out.requeue_after {
        ctx.schedule(uid, d);
    }
    store.publish_phase_counts(&ctx.metrics);
}
