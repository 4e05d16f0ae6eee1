//! The reputation worker: a check round of every Proxy's egress addresses every
//! `reputation.interval` (the settings in effect at the round's start), then the driver
//! merges the results into statuses and announces changes.
//!
//! Guarantees:
//! - rounds never overlap: a round's deadline is the interval, and the next starts an
//!   interval after the previous one started (at once when it took the whole interval);
//!   between full rounds, the addresses never checked yet (a new Proxy's) are checked every
//!   [`IDLE_POLL`], so a new address is known within seconds;
//! - with no zone configured no query is sent; the worker looks again at the settings every
//!   [`IDLE_POLL`] (a config reload may add zones);
//! - it stops at the next wait, or mid-round, once its stop token is cancelled (dropping a
//!   round abandons its queries only).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::sleep_or_stop;
use crate::reputation::{ReputationService, ReputationTarget, RoundDone};

/// How often an idle worker (no zones) looks at the settings again, and how often the
/// addresses never checked yet (a new Proxy's) are looked for between full rounds.
// NB: a new proxy's address is known to be listed (or not) within seconds of its first
// health check, instead of up to an interval later; finding them is one pass over the
// Proxies (as a health round's), which is cheap at this period.
pub const IDLE_POLL: Duration = Duration::from_secs(5);

/// What the reputation worker needs from a driver.
pub trait ReputationDriver: Send + Sync + 'static {
    /// The Proxies to check now, with their declared and observed egress addresses
    /// ([`crate::reputation::addresses_of`]); Proxies without an address are left out.
    fn targets(&self) -> Vec<ReputationTarget>;

    /// A round ended and the service holds its results: merge them into statuses (and
    /// announce the changes), or wake what does.
    fn round_done(&self, service: &ReputationService, done: &RoundDone);
}

/// Runs check rounds until `stop` is cancelled.
pub async fn run<D: ReputationDriver>(
    driver: Arc<D>,
    service: Arc<ReputationService>,
    stop: CancellationToken,
) {
    loop {
        let settings = service.settings();
        if !settings.enabled() {
            if !sleep_or_stop(IDLE_POLL, &stop).await {
                return;
            }
            continue;
        }
        let started = Instant::now();
        let targets = driver.targets();
        let done = tokio::select! {
            () = stop.cancelled() => return,
            d = service.round(&targets) => d,
        };
        if let Some(done) = done {
            tracing::info!(
                proxies = targets.len(),
                queries = done.report.queries,
                listed = done.report.listed,
                failed = done.report.failed,
                changes = done.changes.len(),
                elapsed = ?done.report.elapsed,
                "reputation round"
            );
            driver.round_done(&service, &done);
        }
        // Until the next full round: the addresses never checked, every IDLE_POLL.
        let next_full = started + settings.interval;
        loop {
            let now = Instant::now();
            if now >= next_full || !service.enabled() {
                break;
            }
            if !sleep_or_stop(IDLE_POLL.min(next_full - now), &stop).await {
                return;
            }
            if Instant::now() >= next_full {
                break;
            }
            let targets = driver.targets();
            let done = tokio::select! {
                () = stop.cancelled() => return,
                d = service.round_new(&targets) => d,
            };
            if let Some(done) = done {
                tracing::info!(
                    queries = done.report.queries,
                    listed = done.report.listed,
                    failed = done.report.failed,
                    "reputation round of new addresses"
                );
                driver.round_done(&service, &done);
            }
        }
    }
}
