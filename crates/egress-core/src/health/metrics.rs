//! Metrics of the proxy health engine, in their own prometheus-client [`Registry`] under the
//! `egress_proxies_health` prefix: per proxy a probe-latency histogram, failures by reason
//! and an up gauge; per host probes and failures; the last round's wall time.
//!
//! Guarantees: label values are Proxy keys (`namespace/name`, bounded by the manifests or
//! objects), host names from the config, and the closed set of probe failure reasons — never
//! remote text. A deleted Proxy's series are removed ([`HealthMetrics::forget`]).

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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProxyLabel {
    proxy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabel {
    proxy: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HostLabel {
    host: String,
}

fn latency_histogram() -> Histogram {
    // NB: 1 ms … ~8 s doubling: loopback probes take ~1 ms, remote ones 50-500 ms, and the
    // probe deadline (10 s) caps the tail.
    Histogram::new(exponential_buckets(0.001, 2.0, 14))
}

/// The health engine's metrics. Cheap to clone.
#[derive(Debug, Clone)]
pub struct HealthMetrics {
    registry: Arc<Registry>,
    latency: Family<ProxyLabel, Histogram, fn() -> Histogram>,
    failures: Family<FailureLabel, Counter>,
    up: Family<ProxyLabel, Gauge>,
    host_probes: Family<HostLabel, Counter>,
    host_failures: Family<HostLabel, Counter>,
    round_seconds: Gauge<f64, AtomicU64>,
}

impl Default for HealthMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl HealthMetrics {
    /// Every metric registered, all empty.
    pub fn new() -> Self {
        let mut root = Registry::default();
        let reg = root.sub_registry_with_prefix("egress_proxies_health");
        let latency = Family::<ProxyLabel, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram,
        );
        reg.register(
            "probe_latency_seconds",
            "Latency of successful probes through each proxy",
            latency.clone(),
        );
        let failures = Family::<FailureLabel, Counter>::default();
        reg.register(
            "probe_failures",
            "Failed probes by proxy and reason",
            failures.clone(),
        );
        let up = Family::<ProxyLabel, Gauge>::default();
        reg.register(
            "proxy_up",
            "1 when the proxy is Healthy, 0 when Unhealthy or not decided",
            up.clone(),
        );
        let host_probes = Family::<HostLabel, Counter>::default();
        reg.register(
            "host_probes",
            "Probes of proxies on each host",
            host_probes.clone(),
        );
        let host_failures = Family::<HostLabel, Counter>::default();
        reg.register(
            "host_probe_failures",
            "Failed probes of proxies on each host",
            host_failures.clone(),
        );
        let round_seconds = Gauge::<f64, AtomicU64>::default();
        reg.register(
            "round_seconds",
            "Wall time of the last full round",
            round_seconds.clone(),
        );
        Self {
            registry: Arc::new(root),
            latency,
            failures,
            up,
            host_probes,
            host_failures,
            round_seconds,
        }
    }

    /// Records one probe of `proxy` on `host` and the state it led to.
    pub fn observe(&self, proxy: &str, host: &str, result: &ProbeResult, state: HealthState) {
        let p = ProxyLabel {
            proxy: proxy.to_owned(),
        };
        let h = HostLabel {
            host: host.to_owned(),
        };
        self.host_probes.get_or_create(&h).inc();
        match result {
            ProbeResult::Ok(s) => {
                self.latency
                    .get_or_create(&p)
                    .observe(s.latency.as_secs_f64());
            }
            ProbeResult::Failed(e) => {
                self.host_failures.get_or_create(&h).inc();
                self.failures
                    .get_or_create(&FailureLabel {
                        proxy: proxy.to_owned(),
                        reason: e.reason().to_owned(),
                    })
                    .inc();
            }
        }
        self.up
            .get_or_create(&p)
            .set(i64::from(state == HealthState::Healthy));
    }

    /// Records a round's wall time.
    pub fn round_done(&self, elapsed: Duration) {
        self.round_seconds.set(elapsed.as_secs_f64());
    }

    /// Removes a deleted proxy's per-proxy series.
    pub fn forget(&self, proxy: &str) {
        let p = ProxyLabel {
            proxy: proxy.to_owned(),
        };
        self.latency.remove(&p);
        self.up.remove(&p);
        // NB: failure series are keyed by reason too; the closed set is small.
        for r in [
            "ProbeTimeout",
            "ProxyUnreachable",
            "TunnelRefused",
            "ProxyAuthFailed",
            "BadAnswer",
            "ProbeIoError",
        ] {
            self.failures.remove(&FailureLabel {
                proxy: proxy.to_owned(),
                reason: r.to_owned(),
            });
        }
    }

    /// The registry (to encode next to other registries).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Appends this registry's OpenMetrics text, without the `# EOF` line, to `out`.
    pub fn encode_into(&self, out: &mut String) {
        let mut s = String::new();
        // NB: encoding into a String only fails on a fmt error, which String never raises.
        if prometheus_client::encoding::text::encode_registry(&mut s, &self.registry).is_ok() {
            out.push_str(&s);
        }
    }
}
