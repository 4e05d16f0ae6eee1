//! The orphan GC task: every `interval` (first after one interval), one [`crate::gc::collect`]
//! pass over the driver's current providers against the live set the driver gives.
//!
//! Guarantees:
//! - The live set is taken before any listing (GC's contract), and a pass is skipped when the
//!   driver cannot give a complete one ([`GcDriver::live_set`] returns `None`): GC never
//!   deletes on a partial view.
//! - A pass stops at once when the stop token is cancelled; each listing and deletion inside
//!   it is bounded by GC's own budgets.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use egress_provider::ProxyUid;
use tokio_util::sync::CancellationToken;

use super::sleep_or_stop;
use crate::gc::{self, GcReport, GcSettings};
use crate::providers::Providers;

/// What the GC task needs from a driver.
pub trait GcDriver: Send + Sync + 'static {
    /// The providers to collect over now.
    fn providers(&self) -> Arc<Providers>;

    /// Every Proxy UID that must be kept, or `None` to skip this pass (the driver logs why).
    fn live_set(&self) -> impl Future<Output = Option<HashSet<ProxyUid>>> + Send;

    /// A pass finished: record, log, and refresh what the complete listings tell.
    fn collected(&self, report: &GcReport);

    /// The clock GC's minimum ages are measured against.
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// Runs GC passes every `interval` until `stop` is cancelled.
pub async fn run<D: GcDriver>(
    driver: Arc<D>,
    settings: GcSettings,
    interval: Duration,
    stop: CancellationToken,
) {
    while sleep_or_stop(interval, &stop).await {
        let Some(live) = driver.live_set().await else {
            continue;
        };
        let providers = driver.providers();
        let report = tokio::select! {
            () = stop.cancelled() => return,
            r = gc::collect(&providers, &live, &settings, driver.now()) => r,
        };
        driver.collected(&report);
    }
}
