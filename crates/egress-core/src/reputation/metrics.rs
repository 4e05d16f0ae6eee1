//! Metrics of the reputation checks, registered under `egress_proxies_reputation` in the
//! operator's one registry ([`crate::metrics::Metrics::reputation`]): per zone the addresses
//! listed now and the addresses whose last check failed, checks by result and failed checks
//! by reason; the last round's wall time and end.
//!
//! Guarantees: label values are the configured zone names (at most 16, validated DNS names)
//! and closed sets (`listed`, `not_listed`, `failed`; the failure kinds) — never an address,
//! never remote text. Every configured zone's series exist from the moment it is configured
//! (at zero); a zone removed from the config loses its series.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use egress_reputation::book::Book;
use egress_reputation::codes::{FailureKind, Verdict};
use egress_reputation::config::Settings;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ZoneLabel {
    zone: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    zone: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    zone: String,
    reason: &'static str,
}

const RESULTS: [&str; 3] = ["listed", "not_listed", "failed"];

/// The reputation checks' metrics. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ReputationMetrics {
    _own: Option<Arc<Registry>>,
    listed: Family<ZoneLabel, Gauge>,
    failing: Family<ZoneLabel, Gauge>,
    checks: Family<ResultLabel, Counter>,
    failures: Family<ReasonLabel, Counter>,
    round_seconds: Gauge<f64, AtomicU64>,
    round_end: Gauge<f64, AtomicU64>,
    zones: Arc<Mutex<Vec<String>>>,
}

impl Default for ReputationMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ReputationMetrics {
    /// Metrics in a registry of their own, exported nowhere (tests).
    pub fn new() -> Self {
        let mut own = Registry::default();
        let mut m = Self::register(&mut own);
        m._own = Some(Arc::new(own));
        m
    }

    /// Registers every family in `reg` (the operator registry's `reputation` sub-registry).
    pub fn register(reg: &mut Registry) -> Self {
        let listed = Family::<ZoneLabel, Gauge>::default();
        reg.register(
            "listed_addresses",
            "Egress addresses listed in the blocklist zone now",
            listed.clone(),
        );
        let failing = Family::<ZoneLabel, Gauge>::default();
        reg.register(
            "failing_addresses",
            "Egress addresses whose last check in the blocklist zone failed",
            failing.clone(),
        );
        let checks = Family::<ResultLabel, Counter>::default();
        reg.register(
            "checks",
            "Blocklist checks of egress addresses by zone and result: listed, not_listed or \
             failed",
            checks.clone(),
        );
        let failures = Family::<ReasonLabel, Counter>::default();
        reg.register(
            "check_failures",
            "Failed blocklist checks by zone and reason: timeout, refused, servfail, network, \
             error_answer (the blocklist refused: 127.255.255.x), foreign_answer (outside \
             127.0.0.0/8), other",
            failures.clone(),
        );
        let round_seconds = Gauge::<f64, AtomicU64>::default();
        reg.register(
            "last_round_duration_seconds",
            "Wall time of the last check round",
            round_seconds.clone(),
        );
        let round_end = Gauge::<f64, AtomicU64>::default();
        reg.register(
            "last_round_timestamp_seconds",
            "Unix time the last check round ended (0 before the first)",
            round_end.clone(),
        );
        Self {
            _own: None,
            listed,
            failing,
            checks,
            failures,
            round_seconds,
            round_end,
            zones: Arc::default(),
        }
    }

    /// Creates the series of the configured zones at zero and drops those of zones gone.
    pub fn set_zones(&self, settings: &Settings) {
        let now: Vec<String> = settings
            .zones
            .iter()
            .map(|z| z.zone.as_str().to_owned())
            .collect();
        let mut zones = self.zones.lock().unwrap_or_else(PoisonError::into_inner);
        for gone in zones.iter().filter(|z| !now.contains(z)) {
            let l = ZoneLabel { zone: gone.clone() };
            self.listed.remove(&l);
            self.failing.remove(&l);
            for result in RESULTS {
                self.checks.remove(&ResultLabel {
                    zone: gone.clone(),
                    result,
                });
            }
            for k in FailureKind::ALL {
                self.failures.remove(&ReasonLabel {
                    zone: gone.clone(),
                    reason: k.label(),
                });
            }
        }
        for z in &now {
            let l = ZoneLabel { zone: z.clone() };
            self.listed.get_or_create(&l).inc_by(0);
            self.failing.get_or_create(&l).inc_by(0);
            for result in RESULTS {
                self.checks
                    .get_or_create(&ResultLabel {
                        zone: z.clone(),
                        result,
                    })
                    .inc_by(0);
            }
            for k in FailureKind::ALL {
                self.failures
                    .get_or_create(&ReasonLabel {
                        zone: z.clone(),
                        reason: k.label(),
                    })
                    .inc_by(0);
            }
        }
        *zones = now;
    }

    /// Counts one verdict in `zone`.
    pub fn checked(&self, zone: &str, verdict: &Verdict) {
        let result = match verdict {
            Verdict::Listed { .. } => "listed",
            Verdict::NotListed => "not_listed",
            Verdict::Failed { kind, .. } => {
                self.failures
                    .get_or_create(&ReasonLabel {
                        zone: zone.to_owned(),
                        reason: kind.label(),
                    })
                    .inc();
                "failed"
            }
        };
        self.checks
            .get_or_create(&ResultLabel {
                zone: zone.to_owned(),
                result,
            })
            .inc();
    }

    /// A round ended: the per-zone gauges from the book, the round's time.
    pub fn round_done(&self, book: &Book, elapsed: Duration) {
        for (z, n) in book.listed_counts() {
            self.listed
                .get_or_create(&ZoneLabel {
                    zone: z.as_str().to_owned(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        for (z, n) in book.failing_counts() {
            self.failing
                .get_or_create(&ZoneLabel {
                    zone: z.as_str().to_owned(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        self.round_seconds.set(elapsed.as_secs_f64());
        self.round_end.set(
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
        );
    }
}
