//! Prometheus metrics of the operator: one prometheus-client [`Registry`] under the
//! `egress_proxies` prefix, with the proxy health engine's families in its `health`
//! sub-registry and the controller's and pools' snapshots exported through collectors
//! ([`collect`]). `docs/metrics.md` lists every family, its labels and its cardinality.
//!
//! Guarantees:
//! - **Bounded labels**: values come from closed sets (phases, results, error classes, probe
//!   failure reasons, health states), from the provider config (entry and host names, which
//!   are validated identifiers) or are one per object where one value per object is the
//!   point (a proxy's `up`, a pool's replica counts); never from error text. Latency
//!   histograms are per entry and host, never per proxy.
//! - **Present from start**: every family that is not per host or per object has its series
//!   from [`Metrics::new`] on (at zero), so `absent()` alerts work; a host's series appear
//!   with its first check.
//! - **One exposition** in the format the scrape negotiated ([`MetricsFormat`]), written by
//!   the crate's own encoders; encoding never fails for this registry.

mod collect;
mod format;
pub(crate) mod labels;
mod pool;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use egress_provider::sync::lock;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

pub use self::collect::PoolReplicas;
use self::collect::{ControllerCollector, PoolCollector};
pub use self::format::{MetricsFormat, OPENMETRICS_CONTENT_TYPE};
use self::labels::HostLabel;
use crate::controller::ControllerCounters;
use crate::health::metrics::HealthMetrics;
use crate::model::Phase;
use egress_provider::model::AddressUsage;

/// The prefix of every family.
pub const PREFIX: &str = "egress_proxies";

/// Every phase, for setting the per-phase gauge (zero included).
const PHASES: [Phase; 6] = [
    Phase::Pending,
    Phase::Provisioning,
    Phase::Running,
    Phase::Paused,
    Phase::Failed,
    Phase::Terminating,
];

/// Reconcile results whose series exist from start (others appear when first counted): a
/// reconcile that emitted no Warning event, and the Warning reasons of provider errors.
const RESULTS_FROM_START: [&str; 5] = [
    "ok",
    "TransientError",
    "PermanentError",
    "QuotaExceeded",
    "ReconcileTimeout",
];

/// What the build info gauge says: set once by the binary ([`set_build_info`]).
static BUILD: OnceLock<BuildLabels> = OnceLock::new();

/// Records the binary's version and commit for `egress_proxies_build_info`; the first call
/// wins. Without it the library's own version and commit `unknown` are shown.
pub fn set_build_info(version: &str, commit: &str) {
    let _ = BUILD.set(BuildLabels {
        version: version.to_owned(),
        commit: commit.to_owned(),
    });
}

/// `version`/`commit` labels of the build info.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
    commit: String,
}

/// `phase` label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabel {
    phase: String,
}

/// `result` label: `ok` or what went wrong.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: String,
}

/// `entry`/`host`/`family`/`state` labels of a host's declared-address pool usage.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AddressLabel {
    entry: String,
    host: String,
    /// `IPv4` or `IPv6`.
    family: String,
    /// `allocated`, `retired` or `free`.
    state: &'static str,
}

/// Buckets of the reconcile duration histogram, in seconds.
// NB: 5 ms … ~82 s doubling: a reconcile that only reads state takes milliseconds, one that
// waits on a slow host seconds, and the reconcile deadline (60 s by default) caps the tail.
fn reconcile_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

/// The operator's metrics. Cheap to clone (every metric is shared).
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    controller: Arc<ControllerCollector>,
    pools: Arc<PoolCollector>,
    pool_members: pool::PoolMetrics,
    health: HealthMetrics,
    reputation: crate::reputation::metrics::ReputationMetrics,
    leader: Gauge,
    proxies: Family<PhaseLabel, Gauge>,
    reconciles: Family<ResultLabel, Counter>,
    reconcile_duration: Histogram,
    host_up: Family<HostLabel, Gauge>,
    host_latency: Family<HostLabel, Gauge<f64, AtomicU64>>,
    hosts: Arc<Mutex<BTreeSet<HostLabel>>>,
    host_addresses: Family<AddressLabel, Gauge<f64, AtomicU64>>,
    /// The pool families each host's series exist for (to drop them when they go).
    address_families: Arc<Mutex<BTreeMap<HostLabel, Vec<&'static str>>>>,
    gc_deleted: Counter,
    gc_runs: Family<ResultLabel, Counter>,
    image_bytes: Counter,
    reloads: Family<ResultLabel, Counter>,
    reload_ok: Gauge,
    reload_ok_time: Gauge<f64, AtomicU64>,
    manifests_rejected: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// A shared collector registered in the operator's registry.
#[derive(Debug)]
struct Extra(Arc<dyn prometheus_client::collector::Collector>);

impl prometheus_client::collector::Collector for Extra {
    fn encode(
        &self,
        encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }
}

impl Metrics {
    /// A fresh registry with every family registered, each at zero where it has no
    /// per-host or per-object label.
    pub fn new() -> Self {
        Self::with_extra(None)
    }

    /// [`Metrics::new`] with `extra`'s families too (under the same `egress_proxies_`
    /// prefix): how a driver adds the pool gateway's to its `/metrics`.
    pub fn with_extra(extra: Option<Arc<dyn prometheus_client::collector::Collector>>) -> Self {
        let mut root = Registry::default();
        let reg = root.sub_registry_with_prefix(PREFIX);
        let build = BUILD.get().cloned().unwrap_or_else(|| BuildLabels {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            commit: "unknown".to_owned(),
        });
        reg.register(
            "build",
            "The running build: version and commit (value 1)",
            Info::new(build),
        );
        let leader = Gauge::default();
        reg.register(
            "leader",
            "1 when this process acts on the fleet (holds the Lease in Kubernetes mode; always \
             1 in standalone mode), else 0",
            leader.clone(),
        );
        let proxies = Family::<PhaseLabel, Gauge>::default();
        reg.register("proxies", "Proxies by phase", proxies.clone());
        let reconciles = Family::<ResultLabel, Counter>::default();
        reg.register(
            "reconciles",
            "Proxy reconciles by result: ok, or the reason of the Warning event it emitted",
            reconciles.clone(),
        );
        let reconcile_duration = reconcile_histogram();
        reg.register(
            "reconcile_duration_seconds",
            "Wall time of one Proxy reconcile",
            reconcile_duration.clone(),
        );
        let host_up = Family::<HostLabel, Gauge>::default();
        reg.register(
            "host_up",
            "1 when the host's last check found it Ready, else 0",
            host_up.clone(),
        );
        let host_latency = Family::<HostLabel, Gauge<f64, AtomicU64>>::default();
        reg.register(
            "host_check_latency_seconds",
            "Round-trip time of the host's last check call",
            host_latency.clone(),
        );
        let host_addresses = Family::<AddressLabel, Gauge<f64, AtomicU64>>::default();
        reg.register(
            "host_egress_addresses",
            "Declared egress addresses of the host's address pool by family and state: \
             allocated (held by instances), retired (after a blocklist listing; not handed \
             out) or free",
            host_addresses.clone(),
        );
        let gc_deleted = Counter::default();
        reg.register(
            "gc_deleted_instances",
            "Instances deleted by orphan GC",
            gc_deleted.clone(),
        );
        let gc_runs = Family::<ResultLabel, Counter>::default();
        reg.register(
            "gc_runs",
            "Orphan GC runs by result: ok, or incomplete when a listing failed",
            gc_runs.clone(),
        );
        let image_bytes = Counter::default();
        reg.register(
            "image_transferred_bytes",
            "Image bytes uploaded to hosts",
            image_bytes.clone(),
        );
        let reloads = Family::<ResultLabel, Counter>::default();
        reg.register(
            "config_reloads",
            "Provider config loads after a change of its files, by result (ok or failed)",
            reloads.clone(),
        );
        let reload_ok = Gauge::default();
        reg.register(
            "config_last_reload_successful",
            "1 when the last provider config load succeeded (the running config is the file's), \
             else 0",
            reload_ok.clone(),
        );
        let reload_ok_time = Gauge::<f64, AtomicU64>::default();
        reg.register(
            "config_last_reload_success_timestamp_seconds",
            "Unix time of the last successful provider config load",
            reload_ok_time.clone(),
        );
        let manifests_rejected = Gauge::default();
        reg.register(
            "manifests_rejected",
            "Proxy manifests the last scan rejected (standalone mode; always 0 in Kubernetes \
             mode, where the API server validates)",
            manifests_rejected.clone(),
        );
        let controller = Arc::new(ControllerCollector::default());
        reg.register_collector(Box::new(Arc::clone(&controller)));
        let pools = Arc::new(PoolCollector::default());
        reg.register_collector(Box::new(Arc::clone(&pools)));
        let pool_members = pool::PoolMetrics::register(reg);
        if let Some(e) = extra {
            reg.register_collector(Box::new(Extra(e)));
        }
        let health = HealthMetrics::register(reg.sub_registry_with_prefix("health"));
        let reputation = crate::reputation::metrics::ReputationMetrics::register(
            reg.sub_registry_with_prefix("reputation"),
        );
        for p in PHASES {
            proxies
                .get_or_create(&PhaseLabel {
                    phase: p.as_str().into(),
                })
                .set(0);
        }
        for r in RESULTS_FROM_START {
            reconciles
                .get_or_create(&ResultLabel { result: r.into() })
                .inc_by(0);
        }
        for r in ["ok", "incomplete"] {
            gc_runs
                .get_or_create(&ResultLabel { result: r.into() })
                .inc_by(0);
        }
        for r in ["ok", "failed"] {
            reloads
                .get_or_create(&ResultLabel { result: r.into() })
                .inc_by(0);
        }
        Self {
            registry: Arc::new(root),
            controller,
            pools,
            pool_members,
            health,
            reputation,
            leader,
            proxies,
            reconciles,
            reconcile_duration,
            host_up,
            host_latency,
            hosts: Arc::new(Mutex::new(BTreeSet::new())),
            host_addresses,
            address_families: Arc::new(Mutex::new(BTreeMap::new())),
            gc_deleted,
            gc_runs,
            image_bytes,
            reloads,
            reload_ok,
            reload_ok_time,
            manifests_rejected,
        }
    }

    /// The health engine's families (registered in this registry): hand them to
    /// [`HealthEngine::with_metrics`](crate::health::HealthEngine::with_metrics).
    pub fn health(&self) -> HealthMetrics {
        self.health.clone()
    }

    /// The reputation checks' families (registered in this registry): hand them to
    /// [`ReputationService::new`](crate::reputation::ReputationService::new).
    pub fn reputation(&self) -> crate::reputation::metrics::ReputationMetrics {
        self.reputation.clone()
    }

    /// Records whether this process acts on the fleet (leads).
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
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

    /// Counts one reconcile that took `elapsed`; `warning` is `None` when it emitted no
    /// Warning event, else that event's reason (a stable CamelCase word from a closed set).
    pub fn reconciled(&self, warning: Option<&str>, elapsed: Duration) {
        let result = warning.unwrap_or("ok");
        self.reconciles
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .inc();
        self.reconcile_duration.observe(elapsed.as_secs_f64());
    }

    /// Records a host check: up when `ready`, with the check's latency when known (a check
    /// that got no answer has none: the latency series is dropped rather than left stale).
    /// The host's health probe series are created too (at zero), so every per-host family
    /// but the latency has a series from the host's first check on.
    pub fn host_checked(&self, entry: &str, host: &str, ready: bool, latency_secs: Option<f64>) {
        let l = HostLabel {
            entry: entry.into(),
            host: host.into(),
        };
        self.host_up.get_or_create(&l).set(i64::from(ready));
        match latency_secs {
            Some(s) => {
                self.host_latency.get_or_create(&l).set(s);
            }
            None => {
                self.host_latency.remove(&l);
            }
        }
        self.health.host_known(&l);
        lock(&self.hosts).insert(l);
    }

    /// Records a host's address pool usage from its check (`HostReport::addresses`): the
    /// allocated and free addresses of each family it has. A family no longer reported (the
    /// pool was removed from the host) loses its series; a host without a pool has none.
    pub fn host_addresses(&self, entry: &str, host: &str, usage: &[AddressUsage]) {
        let l = HostLabel {
            entry: entry.into(),
            host: host.into(),
        };
        let mut families = lock(&self.address_families);
        let known = families.entry(l.clone()).or_default();
        for gone in known
            .iter()
            .filter(|f| !usage.iter().any(|u| u.family == **f))
        {
            self.remove_address_series(&l, gone);
        }
        known.clear();
        for u in usage {
            let held = u128::from(u.held);
            let retired = u128::from(u.retired);
            // NB: f64 gauges: an IPv6 pool's size does not fit an i64; counts this large are
            // read as magnitudes anyway.
            #[allow(clippy::cast_precision_loss)]
            let (allocated, retired_f, free) = (
                held as f64,
                retired as f64,
                u.size.saturating_sub(held).saturating_sub(retired) as f64,
            );
            for (state, v) in [
                ("allocated", allocated),
                ("retired", retired_f),
                ("free", free),
            ] {
                self.host_addresses
                    .get_or_create(&address_label(&l, u.family, state))
                    .set(v);
            }
            known.push(u.family);
        }
        if known.is_empty() {
            families.remove(&l);
        }
    }

    fn remove_address_series(&self, l: &HostLabel, family: &str) {
        for state in ["allocated", "retired", "free"] {
            self.host_addresses.remove(&address_label(l, family, state));
        }
    }

    /// Drops the series of every host for which `keep(entry, host)` is false (removed from
    /// the config), so a removed host is not reported down forever.
    pub fn retain_hosts(&self, keep: impl Fn(&str, &str) -> bool) {
        lock(&self.hosts).retain(|l| {
            if keep(&l.entry, &l.host) {
                return true;
            }
            self.host_up.remove(l);
            self.host_latency.remove(l);
            self.health.forget_host(l);
            false
        });
        lock(&self.address_families).retain(|l, families| {
            if keep(&l.entry, &l.host) {
                return true;
            }
            for f in families.iter() {
                self.remove_address_series(l, f);
            }
            false
        });
    }

    /// Records a GC run (`ok` when its lists were complete, else `incomplete`) and its
    /// deletions.
    pub fn gc_ran(&self, result: &str, deleted: u64) {
        self.gc_runs
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .inc();
        self.gc_deleted.inc_by(deleted);
    }

    /// Records a load of the provider config: at start, or after its files changed.
    pub fn config_loaded(&self, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.reloads
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .inc();
        self.reload_ok.set(i64::from(ok));
        if ok {
            let now = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default();
            self.reload_ok_time.set(now.as_secs_f64());
        }
    }

    /// Sets how many manifests the last scan rejected.
    pub fn set_manifests_rejected(&self, n: usize) {
        self.manifests_rejected
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Sets pool `key`'s (`namespace/name`) replica counts.
    pub fn set_pool(&self, key: &str, replicas: PoolReplicas) {
        self.pools.set(key, replicas);
    }

    /// Drops a deleted pool's series (its member, replacement and readiness series too).
    pub fn forget_pool(&self, key: &str) {
        self.pools.forget(key);
        self.pool_members.forget(key);
    }

    /// Sets pool `key`'s members by state: available, unavailable, quarantined, deleting.
    pub fn set_pool_members(&self, key: &str, counts: [u64; 4]) {
        self.pool_members.set_members(key, counts);
    }

    /// Counts a member pool `key` deleted, by `cause` ([`crate::pool::DeleteCause::as_str`]).
    pub fn pool_member_replaced(&self, key: &str, cause: &str) {
        self.pool_members.replaced(key, cause);
    }

    /// Records that a member of pool `key` became available `seconds` after its create.
    pub fn pool_member_ready(&self, key: &str, seconds: f64) {
        self.pool_members.member_ready(key, seconds);
    }

    /// Keeps `c` as the controller snapshot exported on the next [`encode`](Self::encode).
    pub fn set_controller_counters(&self, c: ControllerCounters) {
        self.controller.set(c);
    }

    /// Adds image bytes transferred.
    pub fn image_bytes(&self, n: u64) {
        self.image_bytes.inc_by(n);
    }

    /// The exposition of every family in `format`.
    pub fn encode(&self, format: MetricsFormat) -> String {
        let mut out = String::new();
        let r = match format {
            MetricsFormat::Prometheus => {
                prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)
            }
            MetricsFormat::OpenMetrics => {
                prometheus_client::encoding::text::encode(&mut out, &self.registry)
            }
        };
        // NB: encoding into a String only fails on a fmt error, which String never raises.
        if r.is_err() {
            out.clear();
        }
        out
    }
}

fn address_label(l: &HostLabel, family: &str, state: &'static str) -> AddressLabel {
    AddressLabel {
        entry: l.entry.clone(),
        host: l.host.clone(),
        family: family.to_owned(),
        state,
    }
}
