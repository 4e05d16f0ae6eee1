//! The standalone driver's own loops (the shared background workers are in
//! [`crate::workers`]): the manifest poller, adoption of each entry's instances, the periodic
//! resync, and the reconcile workers fed by the [`crate::queue::WorkQueue`].
//!
//! Guarantees:
//! - No object of an entry is reconciled before that entry's instances were adopted from a
//!   complete listing under its current config; it is retried after
//!   `ADOPT_RETRY.min(POLL_INTERVAL)`.
//! - Each adoption listing is bounded by [`ADOPT_DEADLINE`]; the manifest scan runs off the
//!   async threads; every loop leaves at the next wait once its stop token is cancelled.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use egress_core::background::sleep_or_stop;
use egress_provider::ProxyUid;
use tokio_util::sync::CancellationToken;

use crate::manifests::{Desired, ManifestStore};
use crate::shared::Shared;
use crate::{ADOPT_DEADLINE, ADOPT_RETRY, POLL_INTERVAL, RESYNC_INTERVAL, lock};

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
pub(crate) async fn manifest_loop(
    sh: Arc<Shared>,
    mut store: ManifestStore,
    stop: CancellationToken,
) {
    while sleep_or_stop(POLL_INTERVAL, &stop).await {
        let (s, desired) = scan(store).await;
        store = s;
        sh.apply_desired(&desired);
    }
}

/// Adopts every entry not yet adopted (under its current config), retrying failures every
/// [`ADOPT_RETRY`]; marks the process ready once every entry was adopted once.
pub(crate) async fn adoption_loop(sh: Arc<Shared>, stop: CancellationToken) {
    loop {
        let providers = sh.providers();
        let pending: Vec<_> = providers
            .iter()
            .filter(|h| {
                !lock(&sh.adopted).contains(&(h.config.name.clone(), h.config_digest.clone()))
            })
            .cloned()
            .collect();
        let mut all_ok = true;
        for h in pending {
            let name = h.config.name.clone();
            let r = tokio::select! {
                () = stop.cancelled() => return,
                r = tokio::time::timeout(ADOPT_DEADLINE, h.provider.list_owned()) => r,
            };
            match r {
                Ok(Ok(owned)) => {
                    sh.controller.adopt(&name, &owned);
                    lock(&sh.adopted).insert((name.clone(), h.config_digest.clone()));
                    tracing::info!(entry = %name, instances = owned.len(), "adopted");
                    // Its Proxies were waiting for this: reconcile them now, not at their
                    // retry timer.
                    let uids: Vec<ProxyUid> = lock(&sh.objects)
                        .iter()
                        .filter(|(_, o)| o.object.spec.provider == name)
                        .map(|(u, _)| *u)
                        .collect();
                    for u in uids {
                        sh.queue.add(u);
                    }
                }
                Ok(Err(e)) => {
                    all_ok = false;
                    tracing::warn!(entry = %name, error = %e, "adoption listing failed; retrying");
                }
                Err(_) => {
                    all_ok = false;
                    tracing::warn!(entry = %name, "adoption listing timed out; retrying");
                }
            }
        }
        if all_ok && !sh.ready.swap(true, Ordering::SeqCst) {
            tracing::info!("ready: every provider entry adopted");
        }
        if !sleep_or_stop(ADOPT_RETRY.min(POLL_INTERVAL), &stop).await {
            return;
        }
    }
}

/// Queues every known Proxy every [`RESYNC_INTERVAL`].
pub(crate) async fn resync_loop(sh: Arc<Shared>, stop: CancellationToken) {
    while sleep_or_stop(RESYNC_INTERVAL, &stop).await {
        let uids: Vec<ProxyUid> = lock(&sh.objects).keys().copied().collect();
        for u in uids {
            sh.queue.add(u);
        }
    }
}

/// Takes UIDs from the queue and reconciles each (one worker per task), until stopped.
pub(crate) async fn worker(sh: Arc<Shared>, stop: CancellationToken) {
    while let Some(uid) = sh.queue.next(&stop).await {
        let snap = lock(&sh.objects)
            .get(&uid)
            .map(|o| (o.object.clone(), o.status.clone()));
        if let Some((obj, st)) = snap {
            if sh.is_adopted(&obj.spec.provider) {
                let out = sh.controller.reconcile(&obj, &st, SystemTime::now()).await;
                sh.apply_outcome(uid, &obj, out);
            } else {
                sh.schedule(uid, ADOPT_RETRY.min(POLL_INTERVAL));
            }
        }
        sh.queue.done(uid);
    }
}
