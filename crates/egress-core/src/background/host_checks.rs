//! The host check task: every `interval` (first at once), every entry's hosts are checked
//! ([`egress_provider::Provider::check`]) with at most `max_parallel_entries` entries at once,
//! each within `deadline`; the driver gets each entry's result as soon as it is in, then the
//! end of the round.
//!
//! Guarantees:
//! - No check outlives `deadline`: an entry that misses it reaches the driver with
//!   `reports: None` ([`EntryCheck`]); [`timeout_reports`] turns that into one `Timeout` report
//!   per configured host for a driver that records it.
//! - With `max_parallel_entries = 1` the entries are checked one after another, and each
//!   entry's result is handed over before the next check starts.
//! - The round stops at once when the stop token is cancelled.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use egress_provider::model::{HostReport, HostState};
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use super::sleep_or_stop;
use crate::host_health::EntryCheck;
use crate::providers::Providers;

/// How often and how widely hosts are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostCheckSettings {
    /// Pause between the end of a round and the next.
    pub interval: Duration,
    /// Longest one entry's check may take.
    pub deadline: Duration,
    /// Entries checked at once (at least 1 is used).
    pub max_parallel_entries: usize,
}

/// What the host check task needs from a driver.
pub trait HostCheckDriver: Send + Sync + 'static {
    /// The providers to check now (read at the start of each round).
    fn providers(&self) -> Arc<Providers>;

    /// One entry's check ended (`check.reports` is `None` when it missed the deadline):
    /// feed placement, rows, metrics, published status.
    fn entry_checked(&self, check: EntryCheck, now: SystemTime) -> impl Future<Output = ()> + Send;

    /// Every entry of `providers` was handed over: drop what belongs to removed entries.
    fn round_done(&self, providers: &Providers) -> impl Future<Output = ()> + Send;

    /// The clock rows are stamped with.
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// Runs check rounds until `stop` is cancelled.
pub async fn run<D: HostCheckDriver>(
    driver: Arc<D>,
    settings: HostCheckSettings,
    stop: CancellationToken,
) {
    loop {
        let providers = driver.providers();
        let deadline = settings.deadline;
        let mut checks = futures_util::stream::iter(providers.iter().cloned())
            .map(|h| async move {
                let reports = tokio::time::timeout(deadline, h.provider.check())
                    .await
                    .ok();
                EntryCheck { handle: h, reports }
            })
            .buffer_unordered(settings.max_parallel_entries.max(1));
        loop {
            let next = tokio::select! {
                () = stop.cancelled() => return,
                c = checks.next() => c,
            };
            let Some(check) = next else { break };
            driver.entry_checked(check, driver.now()).await;
        }
        drop(checks);
        driver.round_done(&providers).await;
        if !sleep_or_stop(settings.interval, &stop).await {
            return;
        }
    }
}

/// One `Timeout` report per configured host of an entry whose whole check missed its
/// deadline, so placement avoids every host of it.
pub fn timeout_reports(check: &EntryCheck) -> Vec<HostReport> {
    check
        .handle
        .config
        .hosts
        .iter()
        .map(|c| HostReport {
            host: c.name.clone(),
            state: HostState::Timeout,
            latency: None,
            hostname: None,
            libvirt_version: None,
            virt_types: Vec::new(),
            uefi: false,
            pool_free_bytes: None,
            missing: Vec::new(),
            error: None,
            addresses: Vec::new(),
        })
        .collect()
}
