//! Metrics of the proxy health engine, registered under `egress_proxies_health` in the
//! operator's one registry ([`crate::metrics::Metrics`]): per entry and host a probe-latency
//! histogram and probes by result; per proxy only its `up` gauge; proxies per decided state;
//! the last round's wall time.
//!
//! Guarantees: label values are entry and host names from the config, the closed set of
//! probe failure reasons, the three health states, and Proxy keys (`namespace/name`, bounded
//! by the manifests or objects) on the `up` gauge alone — never remote text. A deleted
//! Proxy's series is removed ([`HealthMetrics::forget`]); the state and round families
//! exist from registration on.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::{HealthState, ProbeResult};
use crate::metrics::labels::HostLabel;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProxyLabel {
    proxy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProbeLabel {
    entry: String,
    host: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

/// Every probe failure reason (the `result` label besides `ok`).
const FAILURE_REASONS: [&str; 6] = [
    "ProbeTimeout",
    "ProxyUnreachable",
    "TunnelRefused",
    "ProxyAuthFailed",
    "BadAnswer",
    "ProbeIoError",
];

/// The `state` label of a decided state.
fn state_name(s: HealthState) -> &'static str {
    match s {
        HealthState::Unknown => "Unknown",
        HealthState::Healthy => "Healthy",
        HealthState::Unhealthy => "Unhealthy",
    }
}

fn latency_histogram() -> Histogram {
    // NB: 1 ms … ~8 s doubling: loopback probes take ~1 ms, remote ones 50-500 ms, and the
    // probe deadline (10 s) caps the tail.
    Histogram::new(exponential_buckets(0.001, 2.0, 14))
}

type LatencyFamily = Family<HostLabel, Histogram, fn() -> Histogram>;

/// The health engine's metrics. Cheap to clone.
#[derive(Debug, Clone)]
pub struct HealthMetrics {
    /// The registry this was registered in when it is its own (tests, benchmarks).
    _own: Option<Arc<Registry>>,
    latency: LatencyFamily,
    probes: Family<ProbeLabel, Counter>,
    up: Family<ProxyLabel, Gauge>,
    states: Family<StateLabel, Gauge>,
    round_seconds: Gauge<f64, AtomicU64>,
}

impl Default for HealthMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl HealthMetrics {
    /// Metrics in a registry of their own, exported nowhere (tests and benchmarks; the
    /// drivers use the operator registry's, [`crate::metrics::Metrics::health`]).
    pub fn new() -> Self {
        let mut own = Registry::default();
        let mut m = Self::register(&mut own);
        m._own = Some(Arc::new(own));
        m
    }

    /// Registers every family in `reg` (the operator registry's `health` sub-registry).
    pub fn register(reg: &mut Registry) -> Self {
        let latency = LatencyFamily::new_with_constructor(latency_histogram);
        reg.register(
            "probe_latency_seconds",
            "Latency of successful probes through the proxies of each host",
            latency.clone(),
        );
        let probes = Family::<ProbeLabel, Counter>::default();
        reg.register(
            "probes",
            "Probes through the proxies of each host, by result: ok or the failure reason",
            probes.clone(),
        );
        let up = Family::<ProxyLabel, Gauge>::default();
        reg.register(
            "proxy_up",
            "1 when the proxy is Healthy, 0 when Unhealthy or not decided yet",
            up.clone(),
        );
        let states = Family::<StateLabel, Gauge>::default();
        reg.register(
            "proxies",
            "Probed proxies by decided health state (Healthy, Unhealthy, Unknown)",
            states.clone(),
        );
        let round_seconds = Gauge::<f64, AtomicU64>::default();
        reg.register(
            "last_round_duration_seconds",
            "Wall time of the last full probe round",
            round_seconds.clone(),
        );
        for s in [
            HealthState::Healthy,
            HealthState::Unhealthy,
            HealthState::Unknown,
        ] {
            states
                .get_or_create(&StateLabel {
                    state: state_name(s).to_owned(),
                })
                .set(0);
        }
        Self {
            _own: None,
            latency,
            probes,
            up,
            states,
            round_seconds,
        }
    }

    fn probe_label(host: &HostLabel, result: &str) -> ProbeLabel {
        ProbeLabel {
            entry: host.entry.clone(),
            host: host.host.clone(),
            result: result.to_owned(),
        }
    }

    /// Creates a host's series at zero (its histogram and its `ok` probe count).
    pub(crate) fn host_known(&self, host: &HostLabel) {
        drop(self.latency.get_or_create(host));
        self.probes
            .get_or_create(&Self::probe_label(host, "ok"))
            .inc_by(0);
    }

    /// Drops a host's series (removed from the config).
    pub(crate) fn forget_host(&self, host: &HostLabel) {
        self.latency.remove(host);
        self.probes.remove(&Self::probe_label(host, "ok"));
        for r in FAILURE_REASONS {
            self.probes.remove(&Self::probe_label(host, r));
        }
    }

    /// Records one probe of `proxy` on `host` of `entry` and the state it led to.
    pub fn observe(
        &self,
        proxy: &str,
        entry: &str,
        host: &str,
        result: &ProbeResult,
        state: HealthState,
    ) {
        let h = HostLabel {
            entry: entry.to_owned(),
            host: host.to_owned(),
        };
        match result {
            ProbeResult::Ok(s) => {
                self.latency
                    .get_or_create(&h)
                    .observe(s.latency.as_secs_f64());
                self.probes
                    .get_or_create(&Self::probe_label(&h, "ok"))
                    .inc();
            }
            ProbeResult::Failed(e) => {
                self.probes
                    .get_or_create(&Self::probe_label(&h, e.reason()))
                    .inc();
            }
        }
        self.up
            .get_or_create(&ProxyLabel {
                proxy: proxy.to_owned(),
            })
            .set(i64::from(state == HealthState::Healthy));
    }

    /// Sets the count of proxies in each decided state.
    pub fn set_states(&self, states: impl IntoIterator<Item = HealthState>) {
        let (mut healthy, mut unhealthy, mut unknown) = (0i64, 0i64, 0i64);
        for s in states {
            match s {
                HealthState::Healthy => healthy += 1,
                HealthState::Unhealthy => unhealthy += 1,
                HealthState::Unknown => unknown += 1,
            }
        }
        for (s, n) in [
            (HealthState::Healthy, healthy),
            (HealthState::Unhealthy, unhealthy),
            (HealthState::Unknown, unknown),
        ] {
            self.states
                .get_or_create(&StateLabel {
                    state: state_name(s).to_owned(),
                })
                .set(n);
        }
    }

    /// Records a round's wall time.
    pub fn round_done(&self, elapsed: Duration) {
        self.round_seconds.set(elapsed.as_secs_f64());
    }

    /// Removes a deleted proxy's series.
    pub fn forget(&self, proxy: &str) {
        self.up.remove(&ProxyLabel {
            proxy: proxy.to_owned(),
        });
    }
}
