//! How a GC pass behaves ([`GcSettings`]) and the budgets that bound its network calls.
//!
//! Guarantees: every budget is a named constant with a comment on how it was sized; no I/O.

use std::time::Duration;

use egress_provider::bases::UnusedClock;

/// Default [`GcSettings::min_age`].
// NB: an instance becomes visible to the driver's live set within one watch event (seconds),
// and a create that raced a GC pass needs at most the reconcile deadline plus the start wait
// (minutes) to be seen; 10 minutes covers both with margin, and an orphan that lingers 10
// minutes longer costs only its disk and memory.
pub const DEFAULT_MIN_AGE: Duration = Duration::from_secs(600);

/// Longest one entry's listing (instances, then volumes, each) may take.
// NB: a listing is one domain list plus one pipelined mark read per domain per host, every
// call under the entry's call deadline (60 s by default); 1000 domains over an SSH link at
// 4 calls in flight and ~5 ms a call take ~1.5 s. 180 s is a backstop above three call
// deadlines, so a frozen host ends the listing as a failure, never a hang.
pub const LIST_BUDGET: Duration = Duration::from_secs(180);

/// Longest one deletion may take.
// NB: `delete` may wait up to NAME_LOCK_WAIT (120 s) for a create of the same name, then
// makes 4-6 calls under the call deadline; 240 s covers the lock wait plus two slow calls. A
// deletion that runs out is reported failed and retried on the next pass.
pub const DELETE_BUDGET: Duration = Duration::from_secs(240);

/// How a GC pass behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcSettings {
    /// Instances and volumes younger than this are kept.
    pub min_age: Duration,
    /// Delete nothing; report what would go.
    pub dry_run: bool,
    /// Whether the pass also removes the cached base images nothing uses (each entry's
    /// `limits.unusedBaseGraceMinutes` after they went unused), and how their unused time is
    /// counted; `None` leaves bases alone.
    pub bases: Option<UnusedClock>,
}

impl Default for GcSettings {
    /// [`DEFAULT_MIN_AGE`], not a dry run, unused bases collected with their unused time
    /// counted from the first pass that found them unused (a periodic worker's setting).
    fn default() -> Self {
        Self {
            min_age: DEFAULT_MIN_AGE,
            dry_run: false,
            bases: Some(UnusedClock::FirstSeen),
        }
    }
}
