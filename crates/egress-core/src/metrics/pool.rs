//! A pool's per-member families beside its replica counts ([`super::PoolReplicas`]): members
//! by state, replacements by cause, and the time from a member's create to its first
//! availability.
//!
//! Guarantees: label values are pool keys (`namespace/name`, one per pool object) and closed
//! sets (the states below, [`crate::pool::DeleteCause`] labels); every series of a pool goes
//! with [`PoolMetrics::forget`].

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The states `pool_members` reports, each a series per pool.
pub const MEMBER_STATES: [&str; 4] = ["available", "unavailable", "quarantined", "deleting"];
/// The causes `pool_replacements_total` counts.
const CAUSES: [&str; 10] = [
    "age",
    "unhealthy",
    "failed",
    "template",
    "scale-in",
    "quarantine",
    "listed",
    "drain",
    "host-lost",
    "rebalance",
];

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    pool: String,
    state: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabels {
    pool: String,
    cause: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabel {
    pool: String,
}

fn ready_histogram() -> Histogram {
    // NB: 5 s .. ~85 min: a fake member is ready in seconds, a real TCG guest in minutes.
    Histogram::new(exponential_buckets(5.0, 2.0, 11))
}

/// The pool families registered in the operator's registry.
#[derive(Debug, Clone)]
pub(super) struct PoolMetrics {
    members: Family<StateLabels, Gauge>,
    replacements: Family<CauseLabels, Counter>,
    ready: Family<PoolLabel, Histogram, fn() -> Histogram>,
}

impl PoolMetrics {
    pub(super) fn register(reg: &mut Registry) -> Self {
        let members = Family::<StateLabels, Gauge>::default();
        reg.register(
            "pool_members",
            "Members of the pool by state (available, unavailable, quarantined, deleting)",
            members.clone(),
        );
        let replacements = Family::<CauseLabels, Counter>::default();
        reg.register(
            "pool_replacements",
            "Members the pool deleted, by cause (age, unhealthy, failed, template, scale-in, quarantine, listed, drain, host-lost, rebalance)",
            replacements.clone(),
        );
        let ready = Family::<PoolLabel, Histogram, fn() -> Histogram>::new_with_constructor(
            ready_histogram as fn() -> Histogram,
        );
        reg.register(
            "pool_member_ready_seconds",
            "Time from a member's create to its first availability",
            ready.clone(),
        );
        Self {
            members,
            replacements,
            ready,
        }
    }

    pub(super) fn set_members(&self, pool: &str, counts: [u64; 4]) {
        for (state, n) in MEMBER_STATES.iter().zip(counts) {
            self.members
                .get_or_create(&StateLabels {
                    pool: pool.to_owned(),
                    state: (*state).to_owned(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    pub(super) fn replaced(&self, pool: &str, cause: &str) {
        self.replacements
            .get_or_create(&CauseLabels {
                pool: pool.to_owned(),
                cause: cause.to_owned(),
            })
            .inc();
    }

    pub(super) fn member_ready(&self, pool: &str, seconds: f64) {
        self.ready
            .get_or_create(&PoolLabel {
                pool: pool.to_owned(),
            })
            .observe(seconds);
    }

    pub(super) fn forget(&self, pool: &str) {
        for state in MEMBER_STATES {
            self.members.remove(&StateLabels {
                pool: pool.to_owned(),
                state: state.to_owned(),
            });
        }
        for cause in CAUSES {
            self.replacements.remove(&CauseLabels {
                pool: pool.to_owned(),
                cause: cause.to_owned(),
            });
        }
        self.ready.remove(&PoolLabel {
            pool: pool.to_owned(),
        });
    }
}
