//! The standalone driver's own loops (the shared background workers are in
//! [`crate::workers`]): the manifest poller, adoption of each entry's instances, the periodic
//! resync, and the reconcile workers fed by the [`crate::queue::WorkQueue`].
//!
//! Guarantees:
//! - No object of an entry is reconciled before that entry's instances were adopted from a
//!   complete listing under its current config; it is retried after
//!   `ADOPT_RETRY.min(POLL_INTERVAL)`, and meanwhile carries a `Provisioned` condition
//!   (status Unknown, reason [`AWAITING_ADOPTION`]) naming the entry and why its listing has
//!   not succeeded yet.
//! - A failing adoption listing is retried with the controller's exponential backoff (from
//!   `POLL_INTERVAL` up to [`ADOPT_BACKOFF_MAX`]), logged at WARN when the entry starts failing
//!   or its error changes, and at INFO when it recovers: a down host is not a WARN every poll.
//! - A rejected manifest is logged at WARN once (again only after it was fixed and broke
//!   again), not on every poll.
//! - Each adoption listing is bounded by [`ADOPT_DEADLINE`]; the manifest scan runs off the
//!   async threads; every loop leaves at the next wait once its stop token is cancelled.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use egress_core::background::sleep_or_stop;
use egress_core::controller::backoff::backoff;
use egress_core::model::{Condition, ConditionStatus, condition};
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
    let mut logged: HashSet<String> = HashSet::new();
    while sleep_or_stop(POLL_INTERVAL, &stop).await {
        let (s, desired) = scan(store).await;
        store = s;
        sh.apply_desired(&desired);
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

/// Longest wait between two adoption listings of an entry that keeps failing.
// NB: a host that is down for hours is tried once a minute (one dial, no log line); one that
// comes back is serving within a minute, while the 2 s poll keeps new entries prompt.
pub(crate) const ADOPT_BACKOFF_MAX: Duration = Duration::from_secs(60);

/// Reason of the `Provisioned` condition of a Proxy whose entry was not adopted yet.
pub(crate) const AWAITING_ADOPTION: &str = "AwaitingAdoption";

/// Why each entry that is not adopted yet is waiting (entry name → cause), shared by the
/// adoption loop (writer) and the reconcile workers (which put it on the Proxy's condition).
pub(crate) type AdoptionWaits = Arc<Mutex<BTreeMap<String, String>>>;

/// One entry's failing adoption: how many listings failed in a row, when to try next, and
/// the last error (to log only when it changes).
struct Failing {
    failures: u32,
    next: Instant,
    error: String,
}

/// Adopts every entry not yet adopted (under its current config), retrying failures with
/// backoff; marks the process ready once every entry was adopted once.
pub(crate) async fn adoption_loop(sh: Arc<Shared>, waits: AdoptionWaits, stop: CancellationToken) {
    let mut failing: BTreeMap<String, Failing> = BTreeMap::new();
    loop {
        let providers = sh.providers();
        let pending: Vec<_> = providers
            .iter()
            .filter(|h| {
                !lock(&sh.adopted).contains(&(h.config.name.clone(), h.config_digest.clone()))
            })
            .cloned()
            .collect();
        // Entries gone from the config no longer wait.
        failing.retain(|n, _| providers.iter().any(|h| h.config.name == *n));
        lock(&waits).retain(|n, _| providers.iter().any(|h| h.config.name == *n));
        let mut all_ok = true;
        for h in pending {
            let name = h.config.name.clone();
            if failing.get(&name).is_some_and(|f| Instant::now() < f.next) {
                all_ok = false;
                continue;
            }
            let r = tokio::select! {
                () = stop.cancelled() => return,
                r = tokio::time::timeout(ADOPT_DEADLINE, h.provider.list_owned()) => r,
            };
            let error = match r {
                Ok(Ok(owned)) => {
                    sh.controller.adopt(&name, &owned);
                    lock(&sh.adopted).insert((name.clone(), h.config_digest.clone()));
                    lock(&waits).remove(&name);
                    match failing.remove(&name) {
                        Some(f) => tracing::info!(
                            entry = %name, instances = owned.len(), failed_listings = f.failures,
                            "adopted after failed listings"
                        ),
                        None => tracing::info!(entry = %name, instances = owned.len(), "adopted"),
                    }
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
                    continue;
                }
                Ok(Err(e)) => e.to_string(),
                Err(_) => format!("the listing took longer than {}s", ADOPT_DEADLINE.as_secs()),
            };
            all_ok = false;
            let f = failing.entry(name.clone()).or_insert(Failing {
                failures: 0,
                next: Instant::now(),
                error: String::new(),
            });
            f.failures = f.failures.saturating_add(1);
            let delay = backoff(
                ADOPT_RETRY.min(POLL_INTERVAL),
                ADOPT_BACKOFF_MAX,
                f.failures,
            );
            f.next = Instant::now() + delay;
            if f.error != error {
                tracing::warn!(
                    entry = %name, error = %error, retry_in_s = delay.as_secs(),
                    "cannot list the entry's instances; its Proxies wait, retrying with backoff"
                );
            } else {
                tracing::debug!(entry = %name, error = %error, failures = f.failures, "adoption listing failed again");
            }
            lock(&waits).insert(name, error.clone());
            f.error = error;
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
pub(crate) async fn worker(sh: Arc<Shared>, waits: AdoptionWaits, stop: CancellationToken) {
    while let Some(uid) = sh.queue.next(&stop).await {
        let snap = lock(&sh.objects)
            .get(&uid)
            .map(|o| (o.object.clone(), o.status.clone()));
        if let Some((obj, st)) = snap {
            if sh.is_adopted(&obj.spec.provider) {
                let started = std::time::Instant::now();
                let out = sh.controller.reconcile(&obj, &st, SystemTime::now()).await;
                sh.apply_outcome(uid, &obj, out, started.elapsed());
            } else {
                mark_awaiting_adoption(&sh, &waits, uid, &obj.spec.provider, obj.generation);
                sh.schedule(uid, ADOPT_RETRY.min(POLL_INTERVAL));
            }
        }
        sh.queue.done(uid);
    }
}

/// Puts on `uid`'s status why it waits: entry `entry`'s instances are not listed yet, and the
/// last error of that listing when there was one.
fn mark_awaiting_adoption(
    sh: &Shared,
    waits: &AdoptionWaits,
    uid: ProxyUid,
    entry: &str,
    generation: i64,
) {
    let message = match lock(waits).get(entry) {
        Some(e) => format!("waiting for the instances of provider entry {entry} to be listed: {e}"),
        None => format!("waiting for the instances of provider entry {entry} to be listed"),
    };
    let now = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    if let Some(mut o) = lock(&sh.objects).get_mut(&uid) {
        o.status.set_condition(Condition::new(
            condition::PROVISIONED,
            ConditionStatus::Unknown,
            AWAITING_ADOPTION,
            &message,
            &now,
            generation,
        ));
    }
}
