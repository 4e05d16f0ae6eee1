//! The controller's counters: plain numbers a driver exports on `/metrics`.
//!
//! Guarantees: counting never blocks or allocates (relaxed atomics); a snapshot is a
//! consistent-enough copy for monitoring (each counter is read once).

use std::sync::atomic::{AtomicU64, Ordering};

use egress_provider::error::ErrorClass;

/// A snapshot of the controller's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ControllerCounters {
    /// Reconcile calls.
    pub reconciles: u64,
    /// Reconciles that hit their deadline (APX-3).
    pub reconcile_timeouts: u64,
    /// Provider errors of class Transient (gets, creates, deletes).
    pub errors_transient: u64,
    /// Provider errors of class Permanent.
    pub errors_permanent: u64,
    /// Provider errors of class NotFound (other than a get's "instance gone").
    pub errors_not_found: u64,
    /// Provider errors of class QuotaExceeded.
    pub errors_quota: u64,
    /// Creates started (including replaces).
    pub creates_started: u64,
    /// Creates that succeeded.
    pub creates_succeeded: u64,
    /// Creates that failed or hit their deadline.
    pub creates_failed: u64,
    /// Replaces started (a delete then a create).
    pub replacements: u64,
    /// Deletes started.
    pub deletes_started: u64,
    /// Work or reads refused because a host had no free slot (H1).
    pub host_busy: u64,
    /// Creates running now.
    pub creates_in_flight: u64,
    /// Deletes running now.
    pub deletes_in_flight: u64,
    /// Deletes of a possible second copy of an instance on a host other than its own that
    /// succeeded (nothing of it is left there).
    pub duplicate_deletes_ok: u64,
    /// Deletes of a possible second copy that failed (retried with backoff).
    pub duplicate_deletes_failed: u64,
}

/// The live counters.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub reconciles: AtomicU64,
    pub reconcile_timeouts: AtomicU64,
    pub errors_transient: AtomicU64,
    pub errors_permanent: AtomicU64,
    pub errors_not_found: AtomicU64,
    pub errors_quota: AtomicU64,
    pub creates_started: AtomicU64,
    pub creates_succeeded: AtomicU64,
    pub creates_failed: AtomicU64,
    pub replacements: AtomicU64,
    pub deletes_started: AtomicU64,
    pub host_busy: AtomicU64,
    pub duplicate_deletes_ok: AtomicU64,
    pub duplicate_deletes_failed: AtomicU64,
}

impl Counters {
    /// Counts one provider error by class.
    pub fn count_error(&self, class: ErrorClass) {
        let c = match class {
            ErrorClass::Transient => &self.errors_transient,
            ErrorClass::Permanent => &self.errors_permanent,
            ErrorClass::NotFound => &self.errors_not_found,
            ErrorClass::QuotaExceeded => &self.errors_quota,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// A snapshot with the in-flight gauges given.
    pub fn snapshot(&self, creates_in_flight: u64, deletes_in_flight: u64) -> ControllerCounters {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ControllerCounters {
            reconciles: r(&self.reconciles),
            reconcile_timeouts: r(&self.reconcile_timeouts),
            errors_transient: r(&self.errors_transient),
            errors_permanent: r(&self.errors_permanent),
            errors_not_found: r(&self.errors_not_found),
            errors_quota: r(&self.errors_quota),
            creates_started: r(&self.creates_started),
            creates_succeeded: r(&self.creates_succeeded),
            creates_failed: r(&self.creates_failed),
            replacements: r(&self.replacements),
            deletes_started: r(&self.deletes_started),
            host_busy: r(&self.host_busy),
            creates_in_flight,
            deletes_in_flight,
            duplicate_deletes_ok: r(&self.duplicate_deletes_ok),
            duplicate_deletes_failed: r(&self.duplicate_deletes_failed),
        }
    }
}
