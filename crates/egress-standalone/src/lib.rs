//! Standalone mode (`egress-proxies standalone`): Proxy manifests in a directory, reconciled
//! by the shared [`Controller`] against the configured providers, with status, metrics and
//! health served over HTTP on a local address.
//!
//! The pipeline: load the provider config (refuse to start on any error: a broken config
//! changes nothing on a host) → build the providers (no I/O) → serve HTTP → read the manifests
//! → adopt each entry's instances from the hosts' marks (`list_owned`; a restart loses
//! nothing) → run: `workers` reconcile tasks fed by a de-duplicating work queue, per-object
//! requeue timers (all in one task: `timers.rs`), a manifest poller, a host checker, a GC
//! pass and a config reloader.
//!
//! Guarantees:
//! - An object is reconciled by at most one worker at a time; a change that arrives while it
//!   is being reconciled queues it once more afterwards.
//! - No object of an entry is reconciled before that entry's instances were adopted from a
//!   complete listing (so a restart never places a second instance for a Proxy).
//! - A removed manifest turns its Proxy into `deleting: true`; the Proxy is forgotten only
//!   when the reconciler reports `finalized`. GC's live set is every Proxy this process
//!   knows (deleting ones included), and GC is skipped while the manifest directory cannot
//!   be listed.
//! - A bad manifest file keeps the proxies of its last good version (see [`manifests`]); a
//!   bad config reload keeps the running config.
//! - Readiness (`/readyz`) turns on once every entry was adopted from a complete listing, and
//!   a bad config reload does not turn it off. Decision: the running config stays in effect
//!   and keeps working, so the process still does its job; turning readiness off would make a
//!   supervisor unroute or restart a working operator, and the restarted process would refuse
//!   the broken file and do nothing at all. The refusal is logged at error level with every
//!   field error.
//! - Shutdown (the token): no new reconcile starts; [`Controller::shutdown`] lets creates and
//!   deletes in flight finish within the grace (a create is never cut while publishing a
//!   base: the provider publishes only verified bases); then everything stops.
//! - Health: the host check loop feeds placement (a host not Ready, or with its pool
//!   at or below the reserve, gets no new proxies), the `/status` host rows and `/hosts`; with
//!   [`StandaloneOptions::health`] set, the proxy health engine ([`egress_core::health`]) checks
//!   every Running proxy through itself, and each round and each reconcile merges its state
//!   into the Proxy's status (`health`, `Healthy`, `Ready` = Running ∧ Healthy), served at
//!   `/proxies` and `/healthy.txt`. A Proxy's health state is dropped only when it is deleted.
//! - Every network call is bounded: reconciles by the controller's deadline, listings by
//!   [`ADOPT_DEADLINE`], checks by [`CHECK_DEADLINE`], GC by its own budgets. No lock is held
//!   across an `.await`.
//!
//! Where things are: this file is the wiring (options, start-up, shutdown); `shared.rs`
//! holds the state everything shares; `queue.rs` the work queue; `loops.rs` the driver's own
//! loops (manifests, adoption, resync, reconcile workers); `workers.rs` its side of the
//! background workers written once in the core ([`egress_core::background`]: GC, host
//! checks, proxy health, config watch); `endpoints.rs` what it serves over HTTP.

mod endpoints;
pub mod gateway_feed;
mod loops;
pub mod manifests;
pub mod pool_manifests;
pub mod pools;
mod queue;
mod shared;
mod timers;
mod workers;

use std::collections::{BTreeMap, HashSet};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use egress_core::background::{self, Workers};
use egress_core::config::{self, ConfigErrors, ProviderConfig};
use egress_core::controller::{Controller, ControllerSettings};
use egress_core::exposition::Exposition;
use egress_core::gc::{self, GcSettings};
use egress_core::health::{HealthEngine, HealthSettings};
use egress_core::metrics::Metrics;
use egress_core::providers::{BuildOptions, Providers};
use egress_provider::error::ProviderError;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use self::manifests::ManifestStore;
use self::queue::WorkQueue;
use self::shared::Shared;

/// unix socket (`address: local`), pool `egress-proxies`, network `default`, TCG guests.
pub const DEFAULT_CONFIG: &str = include_str!("default_config.yaml");

/// Default listen address of the status endpoint.
// NB: 9464 is the port OpenTelemetry's Prometheus exporter made conventional for a process's
// own metrics; loopback only, since /status shows hosts and addresses.
pub const DEFAULT_LISTEN: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 9464));
/// Default number of reconcile workers.
// NB: a reconcile is bounded and mostly waits on one `get`; creates run as spawned tasks in
// the controller. Four workers keep 1000 proxies moving on 2 cores, and the per-host limits
// (not the worker count) bound the load on each host.
pub const DEFAULT_WORKERS: usize = 4;
/// Default interval between GC passes.
// NB: orphans only appear after crashes or manual edits; every 10 minutes bounds how long one
// lingers (plus GC's minimum age) at the cost of one listing per entry.
pub const DEFAULT_GC_INTERVAL: Duration = Duration::from_secs(600);
/// Default interval between host checks.
// NB: placement skips hosts that are not Ready; 30 s notices a host going away well before a
// user does, for one cheap probe per host.
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(30);
/// Default time given to work in flight at shutdown.
// NB: a create that is uploading a base may need minutes, but a service manager's stop
// timeout is typically 90 s; 60 s finishes most creates and stays within it. What is cut is
// converged by the next start (creates are idempotent, bases are published only verified).
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(60);
/// How often the manifest directory (and the config file) is polled for changes.
// NB: polling rather than inotify (`notify`): a directory of small files is listed and
// stat()ed in microseconds, polling sees changes inotify misses (NFS, bind mounts, editors
// that replace files), and it adds no dependency. Two seconds feels immediate to a user.
pub const POLL_INTERVAL: Duration = Duration::from_secs(2);
/// Longest one entry's adoption listing may take.
// NB: the same as GC's listing budget: a listing of 1000 domains takes seconds; a frozen host
// ends it as a failure (retried after [`ADOPT_RETRY`]), never a hang.
pub const ADOPT_DEADLINE: Duration = gc::LIST_BUDGET;
/// Delay before retrying an entry whose adoption listing failed, and before re-queuing an
/// object whose entry is not adopted yet.
// NB: long enough not to hammer a down host, short enough that a host that comes back is
// serving within seconds.
pub const ADOPT_RETRY: Duration = Duration::from_secs(10);
/// Longest one entry's host check may take.
// NB: `check` bounds each host by the entry's dial and call timeouts (70 s by default); this
// is a backstop above them.
pub const CHECK_DEADLINE: Duration = Duration::from_secs(120);
/// Every known Proxy is reconciled at least this often, whatever its requeue said.
// NB: catches drift nobody announced (an instance deleted by hand); 5 minutes costs 1000
// proxies ~3 gets/s.
pub const RESYNC_INTERVAL: Duration = Duration::from_secs(300);

/// How standalone mode runs.
#[derive(Debug, Clone)]
pub struct StandaloneOptions {
    /// Provider config file; `None` uses [`DEFAULT_CONFIG`].
    pub config_path: Option<PathBuf>,
    /// Directory of Proxy manifests.
    pub proxies_dir: PathBuf,
    /// Status endpoint address ([`DEFAULT_LISTEN`]).
    pub listen: SocketAddr,
    /// Reconcile workers (at least 1 is used).
    pub workers: usize,
    /// Interval between GC passes.
    pub gc_interval: Duration,
    /// Interval between host checks.
    pub check_interval: Duration,
    /// Reconciler settings.
    pub controller: ControllerSettings,
    /// GC settings.
    pub gc: GcSettings,
    /// Let GC collect while no Proxy manifest is known (the `gc` command's `--allow-empty`);
    /// false by default, so an empty or wrong manifest directory deletes nothing.
    pub gc_allow_empty: bool,
    /// Time given to work in flight at shutdown.
    pub shutdown_grace: Duration,
    /// Proxy health checks through each proxy; `None` turns them off (then `Ready` is the
    /// controller's alone and `/healthy.txt` is empty).
    pub health: Option<HealthSettings>,
    /// Where the pool gateways' membership is published (every pool declaring
    /// `spec.gateway`); `None`: no gateway is served.
    pub gateway: Option<tokio::sync::watch::Sender<Arc<gateway_feed::GatewaySources>>>,
    /// More metric families for `/metrics` (the gateway's).
    pub extra_metrics: Option<Arc<dyn prometheus_client::collector::Collector>>,
}

impl StandaloneOptions {
    /// Options with every default and the given manifest directory.
    pub fn new(proxies_dir: impl Into<PathBuf>) -> Self {
        Self {
            config_path: None,
            proxies_dir: proxies_dir.into(),
            listen: DEFAULT_LISTEN,
            workers: DEFAULT_WORKERS,
            gc_interval: DEFAULT_GC_INTERVAL,
            check_interval: DEFAULT_CHECK_INTERVAL,
            controller: ControllerSettings::default(),
            gc: GcSettings::default(),
            gc_allow_empty: false,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            health: None,
            gateway: None,
            extra_metrics: None,
        }
    }
}

/// Why standalone mode did not start (once running, it only stops on the token).
#[derive(Debug, thiserror::Error)]
pub enum StandaloneError {
    /// The provider config is invalid (every error listed); nothing was done on any host.
    #[error("{0}")]
    Config(#[source] ConfigErrors),
    /// The providers could not be built from a valid config.
    #[error("cannot build the providers: {0}")]
    Providers(#[source] ProviderError),
    /// The manifest directory is not a readable directory.
    #[error("cannot read the manifest directory {}: {source}", path.display())]
    ProxiesDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The status endpoint could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Loads the provider config at `path`, or [`DEFAULT_CONFIG`] when `None`; all errors at once.
pub fn load_config(path: Option<&Path>) -> Result<ProviderConfig, ConfigErrors> {
    match path {
        Some(p) => config::load(p),
        None => config::parse(DEFAULT_CONFIG, "the embedded default config"),
    }
}

/// Runs standalone mode until `shutdown` is cancelled: loads the config (refusing to start on
/// any error), builds the providers, binds `opts.listen` and runs [`run_with_providers`].
pub async fn run(
    opts: StandaloneOptions,
    shutdown: CancellationToken,
) -> Result<(), StandaloneError> {
    let mut cfg = load_config(opts.config_path.as_deref()).map_err(StandaloneError::Config)?;
    // This installation's ID in every mark: from the config, else kept in a file.
    let id_dir =
        config::installation::standalone_dir(opts.config_path.as_deref(), &opts.proxies_dir);
    config::installation::fill_standalone(&mut cfg, &id_dir).map_err(StandaloneError::Config)?;
    for w in &cfg.warnings {
        tracing::warn!(%w, "provider config warning");
    }
    let providers = Providers::from_config(&cfg, &BuildOptions::default())
        .map_err(StandaloneError::Providers)?;
    let listener =
        TcpListener::bind(opts.listen)
            .await
            .map_err(|source| StandaloneError::Listen {
                addr: opts.listen,
                source,
            })?;
    run_with_providers(opts, providers, listener, shutdown).await
}

/// Runs standalone mode with ready-made `providers` (tests inject fake-backed ones) and an
/// already bound `listener`, until `shutdown` is cancelled. When `opts.config_path` is set,
/// the file is watched and a valid new version replaces the providers; otherwise the
/// providers are fixed.
pub async fn run_with_providers(
    opts: StandaloneOptions,
    providers: Providers,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), StandaloneError> {
    match std::fs::read_dir(&opts.proxies_dir) {
        Ok(_) => {}
        Err(source) => {
            return Err(StandaloneError::ProxiesDir {
                path: opts.proxies_dir.clone(),
                source,
            });
        }
    }
    let providers = Arc::new(providers);
    // The health probes CONNECT through the proxies: their targets' ports are allowed.
    let mut controller_settings = opts.controller.clone();
    if let Some(h) = &opts.health {
        controller_settings.allow_connect_port(h.target.port);
        if let Some(t6) = &h.target_ipv6 {
            controller_settings.allow_connect_port(t6.port);
        }
    }
    let controller = Arc::new(Controller::new(Arc::clone(&providers), controller_settings));
    let metrics = Metrics::with_extra(opts.extra_metrics.clone());
    // Standalone acts on the fleet alone; the config was just loaded.
    metrics.set_leader(true);
    metrics.config_loaded(true);
    let shared = Arc::new(Shared {
        controller,
        providers: RwLock::new(providers),
        objects: Mutex::new(shared::Objects::default()),
        hosts: Mutex::new(BTreeMap::new()),
        manifest_errors: Mutex::new(Vec::new()),
        adopted: Mutex::new(HashSet::new()),
        directory_ok: AtomicBool::new(false),
        ready: AtomicBool::new(false),
        stopping: AtomicBool::new(false),
        health: opts
            .health
            .clone()
            .map(|h| Arc::new(HealthEngine::with_metrics(h, metrics.health()))),
        metrics,
        exposition: Exposition::new(),
        host_health: Mutex::new(BTreeMap::new()),
        queue: WorkQueue::default(),
        timers: timers::Timers::default(),
        manifest_dir: opts.proxies_dir.clone(),
        pools: Mutex::new(pools::Pools::default()),
        pool_queue: pools::PoolQueue::default(),
    });
    shared.seed_host_rows();
    // A finished create/delete, or a freed host slot, queues the Proxy at once (a weak
    // reference: the controller lives inside `shared`).
    let weak = Arc::downgrade(&shared);
    shared.controller.set_waker(Arc::new(move |uid| {
        if let Some(sh) = weak.upgrade() {
            sh.queue.add(uid);
        }
    }));

    // Loops stop on `stop`; the HTTP server outlives them until everything is down.
    let stop = shutdown.child_token();
    let http_stop = CancellationToken::new();
    let http_task = tokio::spawn(egress_core::web::serve(
        listener,
        Arc::clone(&shared) as Arc<dyn egress_core::web::Endpoints>,
        http_stop.clone(),
    ));

    let mut store = ManifestStore::new(opts.proxies_dir.clone());
    let (s, desired) = loops::scan(store).await;
    store = s;
    shared.apply_desired(&desired);
    if desired.proxies.is_empty() && desired.pools.is_empty() && !opts.gc_allow_empty {
        tracing::warn!(
            proxies = %opts.proxies_dir.display(),
            "no Proxy manifest found: GC will not collect until one exists (pass \
             --gc-allow-empty if no Proxy should exist)"
        );
    }

    let waits = loops::AdoptionWaits::default();
    let mut tasks = Workers::new(stop.clone());
    tasks.spawn(
        "adoption",
        loops::adoption_loop(Arc::clone(&shared), Arc::clone(&waits), stop.clone()),
    );
    tasks.spawn(
        "manifests",
        loops::manifest_loop(Arc::clone(&shared), store, stop.clone()),
    );
    tasks.spawn(
        "host checks",
        background::host_checks::run(
            Arc::clone(&shared),
            workers::host_check_settings(opts.check_interval),
            stop.clone(),
        ),
    );
    tasks.spawn(
        "gc",
        background::gc::run(
            Arc::new(workers::StandaloneGc::new(
                Arc::clone(&shared),
                opts.gc_allow_empty,
            )),
            opts.gc.clone(),
            opts.gc_interval,
            stop.clone(),
        ),
    );
    tasks.spawn("pools", pools::run(Arc::clone(&shared), stop.clone()));
    if let Some(tx) = opts.gateway.clone() {
        tasks.spawn(
            "gateway feed",
            gateway_feed::run(Arc::clone(&shared), tx, stop.clone()),
        );
    }
    tasks.spawn("timers", timers::run(Arc::clone(&shared), stop.clone()));
    tasks.spawn(
        "resync",
        loops::resync_loop(Arc::clone(&shared), stop.clone()),
    );
    if let Some(engine) = shared.health.clone() {
        tasks.spawn(
            "proxy health",
            background::proxy_health::run(Arc::clone(&shared), engine, stop.clone()),
        );
    }
    if let Some(p) = opts.config_path.clone() {
        let sh = Arc::clone(&shared);
        let path = p.clone();
        tasks.spawn(
            "config watch",
            background::config_watch::run(
                workers::watched_config(&p),
                POLL_INTERVAL,
                workers::reload_from(p),
                move |providers| sh.providers_reloaded(providers, &path),
                shared.metrics.clone(),
                stop.clone(),
            ),
        );
    }
    let mut reconcilers = JoinSet::new();
    for _ in 0..opts.workers.max(1) {
        reconcilers.spawn(loops::worker(
            Arc::clone(&shared),
            Arc::clone(&waits),
            stop.clone(),
        ));
    }

    stop.cancelled().await;
    tracing::info!("standalone: stopping; no new work is started");
    // Workers finish the reconcile they are in (each bounded by the reconcile deadline).
    tasks.abort();
    shared.stopping.store(true, Ordering::SeqCst);
    shared.abort_timers();
    let grace = opts.shutdown_grace;
    let drain = async {
        shared.controller.shutdown(grace).await;
        while reconcilers.join_next().await.is_some() {}
    };
    if tokio::time::timeout(
        grace.saturating_add(opts.controller.reconcile_deadline),
        drain,
    )
    .await
    .is_err()
    {
        reconcilers.abort_all();
    }
    shared.abort_timers();
    tasks.join().await;
    http_stop.cancel();
    let _ = http_task.await;
    tracing::info!("standalone: stopped");
    Ok(())
}

/// Locks a std mutex, recovering from poisoning (every update leaves the data consistent).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_embedded_default_config_loads() {
        let c = load_config(None).unwrap();
        assert_eq!(c.providers.len(), 1);
        let egress_core::config::ProviderEntry::Libvirt(e) = &c.providers[0];
        assert_eq!(e.name, "local");
        assert_eq!(e.hosts[0].address, egress_core::providers::LOCAL_ADDRESS);
        assert_eq!(e.hosts[0].pool, "egress-proxies");
    }

    #[test]
    fn the_embedded_default_config_loads_without_ssh_files() {
        let c = load_config(None).unwrap();
        let egress_core::config::ProviderEntry::Libvirt(e) = &c.providers[0];
        assert_eq!(e.hosts[0].address, "local");
        assert!(e.hosts[0].ssh_key_file.is_none());
    }
}
