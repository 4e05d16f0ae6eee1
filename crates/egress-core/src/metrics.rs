//! Prometheus metrics of the operator, in one prometheus-client [`Registry`] under the
//! `egress_proxies` prefix: proxies by phase, reconciles and their errors by class, host
//! health and probe latency, GC deletions and image bytes transferred.
//!
//! Guarantees: label values come from closed sets (phases, error classes) or from the
//! provider config (entry and host names, which are validated identifiers), so cardinality
//! is bounded by the config and never by user input or error text. Encoding never fails for
//! a well-formed registry; [`Metrics::encode`] returns the OpenMetrics text. The
//! controller's own counters ([`ControllerCounters`]) are exported from the last snapshot
//! given to [`Metrics::set_controller_counters`].

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;

use crate::controller::ControllerCounters;
use crate::model::Phase;

/// Exports the last controller snapshot as const counters and gauges.
#[derive(Debug, Default)]
struct ControllerCollector {
    last: Mutex<ControllerCounters>,
}

impl Collector for ControllerCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let c = *self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let counters: [(&str, &str, u64); 12] = [
            ("controller_reconciles", "Reconcile calls", c.reconciles),
            (
                "controller_reconcile_timeouts",
                "Reconciles that hit their deadline",
                c.reconcile_timeouts,
            ),
            (
                "controller_errors_transient",
                "Provider errors of class Transient",
                c.errors_transient,
            ),
            (
                "controller_errors_permanent",
                "Provider errors of class Permanent",
                c.errors_permanent,
            ),
            (
                "controller_errors_not_found",
                "Provider errors of class NotFound",
                c.errors_not_found,
            ),
            (
                "controller_errors_quota",
                "Provider errors of class QuotaExceeded",
                c.errors_quota,
            ),
            (
                "controller_creates_started",
                "Creates started",
                c.creates_started,
            ),
            (
                "controller_creates_succeeded",
                "Creates that succeeded",
                c.creates_succeeded,
            ),
            (
                "controller_creates_failed",
                "Creates that failed",
                c.creates_failed,
            ),
            (
                "controller_replacements",
                "Replaces started",
                c.replacements,
            ),
            (
                "controller_deletes_started",
                "Deletes started",
                c.deletes_started,
            ),
            (
                "controller_host_busy",
                "Work refused because a host had no free slot",
                c.host_busy,
            ),
        ];
        for (name, help, v) in counters {
            let m = ConstCounter::new(v);
            let e = encoder.encode_descriptor(name, help, None, m.metric_type())?;
            m.encode(e)?;
        }
        for (name, help, v) in [
            (
                "controller_creates_in_flight",
                "Creates running now",
                c.creates_in_flight,
            ),
            (
                "controller_deletes_in_flight",
                "Deletes running now",
                c.deletes_in_flight,
            ),
        ] {
            let m = ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX));
            let e = encoder.encode_descriptor(name, help, None, m.metric_type())?;
            m.encode(e)?;
        }
        Ok(())
    }
}

/// Every phase, for setting the per-phase gauge (zero included).
const PHASES: [Phase; 6] = [
    Phase::Pending,
    Phase::Provisioning,
    Phase::Running,
    Phase::Paused,
    Phase::Failed,
    Phase::Terminating,
];

/// `phase` label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabel {
    phase: String,
}

/// `result` label of a reconcile: `ok` or an error class.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: String,
}

/// `class` label of an error.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabel {
    class: String,
}

/// `entry`/`host` labels.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HostLabel {
    entry: String,
    host: String,
}

/// The operator's metrics. Cheap to clone (every metric is shared).
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    controller: Arc<ControllerCollector>,
    proxies: Family<PhaseLabel, Gauge>,
    reconciles: Family<ResultLabel, Counter>,
    reconcile_errors: Family<ClassLabel, Counter>,
    host_up: Family<HostLabel, Gauge>,
    host_latency: Family<HostLabel, Gauge<f64, AtomicU64>>,
    gc_deleted: Counter,
    gc_runs: Family<ResultLabel, Counter>,
    image_bytes: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every metric registered (all at zero).
    pub fn new() -> Self {
        let mut root = Registry::default();
        let reg = root.sub_registry_with_prefix("egress_proxies");
        let proxies = Family::<PhaseLabel, Gauge>::default();
        reg.register("proxies", "Proxies by phase", proxies.clone());
        let reconciles = Family::<ResultLabel, Counter>::default();
        reg.register(
            "reconciles",
            "Reconciles by result (ok or the error class)",
            reconciles.clone(),
        );
        let reconcile_errors = Family::<ClassLabel, Counter>::default();
        reg.register(
            "reconcile_errors",
            "Reconcile errors by class",
            reconcile_errors.clone(),
        );
        let host_up = Family::<HostLabel, Gauge>::default();
        reg.register(
            "host_up",
            "1 when the host's last check was Ready, else 0",
            host_up.clone(),
        );
        let host_latency = Family::<HostLabel, Gauge<f64, AtomicU64>>::default();
        reg.register(
            "host_probe_latency_seconds",
            "Latency of the host's last probe call",
            host_latency.clone(),
        );
        let gc_deleted = Counter::default();
        reg.register(
            "gc_deleted_instances",
            "Instances deleted by orphan GC",
            gc_deleted.clone(),
        );
        let gc_runs = Family::<ResultLabel, Counter>::default();
        reg.register("gc_runs", "GC runs by result", gc_runs.clone());
        let image_bytes = Counter::default();
        reg.register(
            "image_bytes",
            "Image bytes transferred to hosts",
            image_bytes.clone(),
        );
        let controller = Arc::new(ControllerCollector::default());
        reg.register_collector(Box::new(Arc::clone(&controller)));
        for p in PHASES {
            proxies
                .get_or_create(&PhaseLabel {
                    phase: p.as_str().into(),
                })
                .set(0);
        }
        Self {
            registry: Arc::new(root),
            controller,
            proxies,
            reconciles,
            reconcile_errors,
            host_up,
            host_latency,
            gc_deleted,
            gc_runs,
            image_bytes,
        }
    }

    /// Sets the per-phase gauge from counts (phases not given are set to 0).
    pub fn set_phase_counts(&self, counts: &[(Phase, i64)]) {
        for p in PHASES {
            let n = counts
                .iter()
                .filter(|(q, _)| *q == p)
                .map(|(_, n)| *n)
                .sum();
            self.proxies
                .get_or_create(&PhaseLabel {
                    phase: p.as_str().into(),
                })
                .set(n);
        }
    }

    /// Counts one reconcile; `error_class` is `None` on success, else a stable class label
    /// (`transient`, `permanent`, `not_found`, `quota_exceeded`, `deadline`...).
    pub fn reconciled(&self, error_class: Option<&str>) {
        let result = error_class.unwrap_or("ok");
        self.reconciles
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .inc();
        if let Some(c) = error_class {
            self.reconcile_errors
                .get_or_create(&ClassLabel { class: c.into() })
                .inc();
        }
    }

    /// Records a host check: up when `ready`, with the probe latency when known.
    pub fn host_checked(&self, entry: &str, host: &str, ready: bool, latency_secs: Option<f64>) {
        let l = HostLabel {
            entry: entry.into(),
            host: host.into(),
        };
        self.host_up.get_or_create(&l).set(i64::from(ready));
        if let Some(s) = latency_secs {
            self.host_latency.get_or_create(&l).set(s);
        }
    }

    /// Records a GC run (`ok` when its lists were complete) and its deletions.
    pub fn gc_ran(&self, result: &str, deleted: u64) {
        self.gc_runs
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .inc();
        self.gc_deleted.inc_by(deleted);
    }

    /// Keeps `c` as the controller snapshot exported on the next [`encode`](Self::encode).
    pub fn set_controller_counters(&self, c: ControllerCounters) {
        *self
            .controller
            .last
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = c;
    }

    /// Adds image bytes transferred.
    pub fn image_bytes(&self, n: u64) {
        self.image_bytes.inc_by(n);
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // NB: encoding into a String only fails on a fmt error, which String never raises.
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_names_every_metric_with_bounded_labels() {
        let m = Metrics::new();
        m.set_phase_counts(&[(Phase::Running, 3)]);
        m.reconciled(None);
        m.reconciled(Some("transient"));
        m.host_checked("local", "h1", true, Some(0.004));
        m.gc_ran("ok", 2);
        m.image_bytes(1024);
        m.set_controller_counters(ControllerCounters {
            reconciles: 7,
            creates_in_flight: 2,
            ..ControllerCounters::default()
        });
        let t = m.encode();
        for want in [
            "egress_proxies_proxies{phase=\"Running\"} 3",
            "egress_proxies_proxies{phase=\"Failed\"} 0",
            "egress_proxies_reconciles_total{result=\"ok\"} 1",
            "egress_proxies_reconcile_errors_total{class=\"transient\"} 1",
            "egress_proxies_host_up{entry=\"local\",host=\"h1\"} 1",
            "egress_proxies_gc_deleted_instances_total 2",
            "egress_proxies_image_bytes_total 1024",
            "egress_proxies_controller_reconciles_total 7",
            "egress_proxies_controller_creates_in_flight 2",
        ] {
            assert!(t.contains(want), "{want} missing in\n{t}");
        }
    }
}
