//! Adoption: before any Proxy of a provider entry is reconciled, the entry's instances are
//! listed from the hosts' ownership marks and handed to the controller, so a restart never
//! places a second instance for a Proxy. The process is ready (`/readyz`) once every entry
//! was adopted once.
//!
//! Guarantees:
//! - No object of an entry is reconciled before that entry's instances were adopted from a
//!   complete listing under its current config ([`is_adopted`]); meanwhile it carries a
//!   `Provisioned` condition (status Unknown, reason [`AWAITING_ADOPTION`]) naming the entry
//!   and why its listing has not succeeded yet.
//! - A failing listing is retried with the controller's exponential backoff (from
//!   `POLL_INTERVAL` up to [`ADOPT_BACKOFF_MAX`]), logged at WARN when the entry starts
//!   failing or its error changes, and at INFO when it recovers: a down host is not a WARN
//!   every poll.
//! - Each listing is bounded by [`ADOPT_DEADLINE`]; the loop leaves at the next wait once its
//!   stop token is cancelled.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use egress_core::background::sleep_or_stop;
use egress_core::controller::backoff::backoff;
use egress_core::model::{Condition, ConditionStatus, condition};
use egress_provider::ProxyUid;
use egress_provider::sync::lock;
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::settings::{ADOPT_DEADLINE, ADOPT_RETRY, POLL_INTERVAL};
use crate::store::Store;

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
pub(crate) async fn run(
    store: &Store,
    ctx: &Context,
    waits: AdoptionWaits,
    stop: CancellationToken,
) {
    let mut failing: BTreeMap<String, Failing> = BTreeMap::new();
    loop {
        let providers = ctx.providers();
        let pending: Vec<_> = providers
            .iter()
            .filter(|h| {
                !lock(&store.adopted).contains(&(h.config.name.clone(), h.config_digest.clone()))
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
                    ctx.controller.adopt(&name, &owned);
                    lock(&store.adopted).insert((name.clone(), h.config_digest.clone()));
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
                    let uids: Vec<ProxyUid> = lock(&store.objects)
                        .iter()
                        .filter(|(_, o)| o.object.spec.provider == name)
                        .map(|(u, _)| *u)
                        .collect();
                    for u in uids {
                        ctx.queue.add(u);
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
        if all_ok && !store.ready.swap(true, Ordering::SeqCst) {
            tracing::info!("ready: every provider entry adopted");
        }
        if !sleep_or_stop(ADOPT_RETRY.min(POLL_INTERVAL), &stop).await {
            return;
        }
    }
}

/// Whether provider entry `entry`, as currently configured, was adopted.
pub(crate) fn is_adopted(store: &Store, ctx: &Context, entry: &str) -> bool {
    store.is_adopted(&ctx.providers(), entry)
}

/// Puts on `uid`'s status why it waits: entry `entry`'s instances are not listed yet, and the
/// last error of that listing when there was one.
pub(crate) fn mark_awaiting_adoption(
    store: &Store,
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
    if let Some(mut o) = lock(&store.objects).get_mut(&uid) {
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
