//! What the Kubernetes driver shows about itself on `--listen`: `/metrics` (the core's
//! [`Metrics`], the proxy health engine's families included, rendered by [`Exposition`]),
//! `/healthz`,
//! `/readyz`, and the same read-only views as standalone mode (`/status`, `/proxies`,
//! `/hosts`, `/healthy.txt`) built from the driver's watch cache. The HTTP server is the standalone one
//! ([`egress_web::serve`]); this module only implements its
//! [`Endpoints`].
//!
//! Guarantees:
//! - **Readiness**: ready once the provider config is loaded and either this replica leads or
//!   its last Lease attempt reached the API server (a follower with a working connection is
//!   ready to take over; one that cannot reach the API server is not).
//! - **Liveness** (`/healthz`) answers as long as the process serves HTTP.
//! - Every view is a snapshot under a short-lived lock: no lock is held across an `.await`,
//!   and serving a request never waits on the network.
//! - Metric labels come from the provider config and from Proxy names (bounded by the
//!   cluster's objects), never from error text.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use egress_core::controller::Controller as Core;
use egress_core::health::{HealthEngine, HealthSettings};
use egress_core::host_health::HostHealth;
use egress_core::metrics::{Metrics, MetricsFormat};
use egress_core::model::Phase;
use egress_provider::model::HostReport;
use egress_provider::sync::lock;
use egress_web::Endpoints;
use egress_web::exposition::Exposition;
use egress_web::status::{HostStatusRow, PoolStatusRow, ProxyStatusRow, StatusDocument};

/// The driver's observable state, shared between the driver (writer) and the HTTP server
/// (reader). Create one per process with [`Observer::new`].
#[derive(Debug)]
pub struct Observer {
    metrics: Metrics,
    health: Option<Arc<HealthEngine>>,
    config_loaded: AtomicBool,
    leader: AtomicBool,
    api_ok: AtomicBool,
    core: Mutex<Option<Arc<Core>>>,
    exposition: Exposition,
    rows: Mutex<Vec<ProxyStatusRow>>,
    hosts: Mutex<BTreeMap<(String, String), HostHealth>>,
    pools: Mutex<BTreeMap<(String, String), PoolStatusRow>>,
}

impl Observer {
    /// A fresh observer (not ready); `health` turns the proxy health engine on. No I/O.
    pub fn new(health: Option<HealthSettings>) -> Self {
        let metrics = Metrics::new();
        Self {
            health: health.map(|h| Arc::new(HealthEngine::with_metrics(h, metrics.health()))),
            metrics,
            config_loaded: AtomicBool::new(false),
            leader: AtomicBool::new(false),
            api_ok: AtomicBool::new(false),
            core: Mutex::new(None),
            exposition: Exposition::new(),
            rows: Mutex::new(Vec::new()),
            hosts: Mutex::new(BTreeMap::new()),
            pools: Mutex::new(BTreeMap::new()),
        }
    }

    /// The core metrics the driver records into.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The proxy health engine, when health checks are on. Its state lives as long as the
    /// process (a new leadership term keeps what earlier terms learned).
    pub fn health(&self) -> Option<&Arc<HealthEngine>> {
        self.health.as_ref()
    }

    /// Records that the provider config loaded (the first load is counted in the config
    /// load metrics; reloads are counted by the config watch).
    pub fn set_config_loaded(&self, v: bool) {
        if !self.config_loaded.swap(v, Ordering::SeqCst) && v {
            self.metrics.config_loaded(true);
        }
    }

    /// Records whether this replica leads.
    pub fn set_leader(&self, v: bool) {
        self.leader.store(v, Ordering::SeqCst);
        self.metrics.set_leader(v);
    }

    /// Records whether the last Lease attempt reached the API server.
    pub fn set_api_ok(&self, v: bool) {
        self.api_ok.store(v, Ordering::SeqCst);
    }

    /// Whether this replica leads (as last recorded).
    pub fn is_leader(&self) -> bool {
        self.leader.load(Ordering::SeqCst)
    }

    /// The core of the current leadership term (its counters are exported), or `None`.
    pub fn set_core(&self, core: Option<Arc<Core>>) {
        *lock(&self.core) = core;
    }

    /// Sets a pool's row (`/status` under `pools`, `/pools/NAME/healthy.txt`), as its last
    /// reconcile saw it.
    pub fn set_pool(&self, row: PoolStatusRow) {
        lock(&self.pools).insert((row.namespace.clone(), row.name.clone()), row);
    }

    /// Drops a deleted pool's row.
    pub fn forget_pool(&self, namespace: &str, name: &str) {
        lock(&self.pools).remove(&(namespace.to_owned(), name.to_owned()));
    }

    /// Replaces the proxy rows (`/status`, `/proxies`, `/healthy.txt`) and the per-phase
    /// gauge.
    pub fn set_proxies(&self, rows: Vec<ProxyStatusRow>) {
        let mut counts: BTreeMap<&'static str, (Phase, i64)> = BTreeMap::new();
        for r in &rows {
            let e = counts.entry(r.phase.as_str()).or_insert((r.phase, 0));
            e.1 = e.1.saturating_add(1);
        }
        let counts: Vec<(Phase, i64)> = counts.into_values().collect();
        self.metrics.set_phase_counts(&counts);
        *lock(&self.rows) = rows;
    }

    /// Records one entry's host check (`/hosts`, host metrics).
    pub fn record_hosts(&self, entry: &str, reports: &[HostReport], now: SystemTime) {
        let mut hosts = lock(&self.hosts);
        // NB: a host's declaration stays shown until the writer sets the check's own
        // ([`Observer::set_fenced`]), so a request in between never sees it vanish.
        let mut fenced: BTreeMap<String, egress_core::host_health::HostFence> = BTreeMap::new();
        hosts.retain(|(e, h), row| {
            if e == entry {
                if let Some(f) = row.fenced.take() {
                    fenced.insert(h.clone(), f);
                }
                false
            } else {
                true
            }
        });
        // A host no longer in the entry's reports left its config: its series go too.
        self.metrics
            .retain_hosts(|e, h| e != entry || reports.iter().any(|r| r.host == h));
        for r in reports {
            let mut row = HostHealth::from_report(entry, r, now);
            row.fenced = fenced.remove(&r.host);
            self.metrics.host_checked(
                entry,
                &r.host,
                row.state == "Ready",
                r.latency.map(|l| l.as_secs_f64()),
            );
            self.metrics.host_addresses(entry, &r.host, &r.addresses);
            hosts.insert((entry.to_owned(), r.host.clone()), row);
        }
    }

    /// Sets the maintenance progress of `entry`'s host rows from `core` (see
    /// [`egress_core::host_health::annotate_maintenance`]).
    pub fn annotate_hosts(&self, entry: &str, core: &egress_core::controller::Controller) {
        let mut hosts = lock(&self.hosts);
        let mut rows: Vec<HostHealth> = hosts
            .iter()
            .filter(|((e, _), _)| e == entry)
            .map(|(_, r)| r.clone())
            .collect();
        egress_core::host_health::annotate_maintenance(&mut rows, core);
        for r in rows {
            hosts.insert((r.entry.clone(), r.host.clone()), r);
        }
    }

    /// Sets the declarations that `entry`'s hosts are dead (`fenced` of their rows) as the
    /// latest check of the entry saw them, the same rows the entry's ProviderHealth shows; a
    /// host not in `fenced` has none.
    pub fn set_fenced(
        &self,
        entry: &str,
        fenced: &std::collections::HashMap<String, egress_core::host_health::HostFence>,
    ) {
        for ((e, h), row) in lock(&self.hosts).iter_mut() {
            if e == entry {
                row.fenced = fenced.get(h).cloned();
            }
        }
    }

    /// Drops the host rows of entries not in `entries` (removed from the config).
    pub fn retain_entries(&self, entries: &[String]) {
        lock(&self.hosts).retain(|(e, _), _| entries.contains(e));
        self.metrics
            .retain_hosts(|e, _| entries.iter().any(|x| x == e));
    }
}

impl Endpoints for Observer {
    fn status(&self) -> StatusDocument {
        StatusDocument {
            generated_at: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
            proxies: lock(&self.rows).clone(),
            hosts: lock(&self.hosts)
                .values()
                .map(HostStatusRow::from)
                .collect(),
            manifest_errors: Vec::new(),
            pools: lock(&self.pools).values().cloned().collect(),
        }
    }

    fn metrics(&self, format: MetricsFormat) -> String {
        let core = lock(&self.core).clone();
        self.exposition
            .render(&self.metrics, core.as_deref(), format)
    }

    fn ready(&self) -> bool {
        self.config_loaded.load(Ordering::SeqCst)
            && (self.leader.load(Ordering::SeqCst) || self.api_ok.load(Ordering::SeqCst))
    }

    fn not_ready_reason(&self) -> String {
        if !self.config_loaded.load(Ordering::SeqCst) {
            "the provider config is not loaded".to_owned()
        } else {
            "no working connection to the Kubernetes API server".to_owned()
        }
    }

    fn hosts(&self) -> Vec<HostHealth> {
        lock(&self.hosts).values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use egress_web::handle;
    use hyper::{Method, StatusCode};

    #[test]
    fn readiness_needs_a_loaded_config_and_either_leadership_or_a_working_api_connection() {
        let o = Observer::new(None);
        let code = |o: &Observer| handle(o, &Method::GET, "/readyz").status();
        assert_eq!(code(&o), StatusCode::SERVICE_UNAVAILABLE);
        o.set_api_ok(true);
        assert_eq!(
            code(&o),
            StatusCode::SERVICE_UNAVAILABLE,
            "config not loaded"
        );
        o.set_config_loaded(true);
        assert_eq!(code(&o), StatusCode::OK, "a follower with a working API");
        o.set_api_ok(false);
        assert_eq!(code(&o), StatusCode::SERVICE_UNAVAILABLE);
        o.set_leader(true);
        assert_eq!(code(&o), StatusCode::OK, "the leader");
        assert_eq!(
            handle(&o, &Method::GET, "/healthz").status(),
            StatusCode::OK
        );
    }

    #[test]
    fn metrics_carry_phase_counts_and_host_state() {
        let o = Observer::new(None);
        o.set_proxies(vec![ProxyStatusRow {
            namespace: "default".into(),
            name: "p".into(),
            uid: "u".into(),
            phase: Phase::Running,
            host: None,
            ip: None,
            provider_id: None,
            created_at: String::new(),
            last_error: None,
            conditions: vec![],
            port: Some(3128),
            health: None,
            reputation: None,
            egress_address: Vec::new(),
        }]);
        let t = Endpoints::metrics(&o, MetricsFormat::Prometheus);
        assert!(
            t.contains("egress_proxies_proxies{phase=\"Running\"} 1"),
            "{t}"
        );
        assert!(
            !t.contains("# EOF"),
            "the Prometheus text format has no EOF line"
        );
        let om = Endpoints::metrics(&o, MetricsFormat::OpenMetrics);
        assert!(om.ends_with("# EOF\n"));
        o.set_leader(true);
        let t = Endpoints::metrics(&o, MetricsFormat::Prometheus);
        assert!(t.contains("egress_proxies_leader 1"), "{t}");
    }

    #[test]
    fn a_declaration_shows_in_status_from_the_writers_check_until_a_check_has_none() {
        use egress_core::host_health::HostFence;
        use egress_provider::model::HostState;
        let o = Observer::new(None);
        let report = HostReport {
            host: "h1".into(),
            state: HostState::Timeout,
            latency: None,
            hostname: None,
            libvirt_version: None,
            virt_types: vec![],
            uefi: false,
            pool_free_bytes: None,
            missing: vec![],
            error: Some("no answer".into()),
            addresses: vec![],
        };
        let now = SystemTime::now();
        let fence = HostFence {
            reason: "rack 4 unplugged".into(),
            state: "Applied".into(),
            applied_at: Some("2026-01-01T00:00:00Z".into()),
            freed: vec![],
            message: None,
        };
        let shown = |o: &Observer| {
            Endpoints::status(o)
                .hosts
                .iter()
                .find(|h| h.host == "h1")
                .and_then(|h| h.fenced.clone())
        };
        o.record_hosts("home", std::slice::from_ref(&report), now);
        assert_eq!(shown(&o), None);
        o.set_fenced(
            "home",
            &std::collections::HashMap::from([("h1".to_owned(), fence.clone())]),
        );
        assert_eq!(shown(&o), Some(fence.clone()));
        // The next check's rows keep it until the writer says what that check saw.
        o.record_hosts("home", std::slice::from_ref(&report), now);
        assert_eq!(shown(&o), Some(fence));
        o.set_fenced("home", &std::collections::HashMap::new());
        assert_eq!(shown(&o), None);
    }

    #[test]
    fn a_hosts_address_pool_usage_is_exported_and_goes_with_the_host() {
        use egress_provider::model::{AddressUsage, HostState};
        let o = Observer::new(None);
        let report = |host: &str| HostReport {
            host: host.into(),
            state: HostState::Ready,
            latency: None,
            hostname: None,
            libvirt_version: None,
            virt_types: vec![],
            uefi: false,
            pool_free_bytes: None,
            missing: vec![],
            error: None,
            addresses: vec![AddressUsage {
                family: "IPv4",
                size: 14,
                held: 5,
                retired: 0,
            }],
        };
        let now = SystemTime::now();
        o.record_hosts("home", &[report("h1"), report("h2")], now);
        let t = Endpoints::metrics(&o, MetricsFormat::Prometheus);
        let free = |h: &str| {
            format!(
                "egress_proxies_host_egress_addresses{{entry=\"home\",host=\"{h}\",family=\"IPv4\",state=\"free\"}} 9"
            )
        };
        assert!(t.contains(&free("h1")) && t.contains(&free("h2")), "{t}");
        // h2 leaves the config: its series go.
        o.record_hosts("home", &[report("h1")], now);
        let t = Endpoints::metrics(&o, MetricsFormat::Prometheus);
        assert!(t.contains(&free("h1")) && !t.contains("host=\"h2\""), "{t}");
    }
}
