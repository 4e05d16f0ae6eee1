//! Standalone mode (`egress-proxies standalone`): Proxy manifests in a directory, reconciled
//! by the shared [`Controller`] against the configured providers, with status, metrics and
//! health served over HTTP on a local address.
//!
//! The pipeline: load the provider config (refuse to start on any error: a broken config
//! changes nothing on a host) → build the providers (no I/O) → serve HTTP → read the manifests
//! → adopt each entry's instances from the hosts' marks (`list_owned`; a restart loses
//! nothing) → run: `workers` reconcile tasks fed by a de-duplicating work queue, per-object
//! requeue timers, a manifest poller, a host checker, a GC pass and a config reloader.
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
//! - Health (issue 6): the host check loop feeds placement (a host not Ready, or with its pool
//!   at or below the reserve, gets no new proxies), the `/status` host rows and `/hosts`; with
//!   [`StandaloneOptions::health`] set, the proxy health engine ([`egress_core::health`]) checks
//!   every Running proxy through itself, and each round and each reconcile merges its state
//!   into the Proxy's status (`health`, `Healthy`, `Ready` = Running ∧ Healthy), served at
//!   `/proxies` and `/healthy.txt`. A Proxy's health state is dropped only when it is deleted.
//! - Every network call is bounded: reconciles by the controller's deadline, listings by
//!   [`ADOPT_DEADLINE`], checks by [`CHECK_DEADLINE`], GC by its own budgets. No lock is held
//!   across an `.await`.

pub mod manifests;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use egress_provider::ProxyUid;
use egress_provider::error::ProviderError;
use egress_provider::model::HostState;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::{AbortHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use egress_core::config::{self, ConfigErrors, ProviderConfig};
use egress_core::controller::{
    Controller, ControllerSettings, EventKind, Outcome, ProxyCredentials, ProxyObject,
};
use egress_core::gc::{self, GcSettings};
use egress_core::health::{self, HealthEngine, HealthSettings, ProbeTarget};
use egress_core::hosthealth::{self, HostHealth};
use egress_core::metrics::Metrics;
use egress_core::model::{ConditionStatus, Phase, ProxyStatus};
use egress_core::providers::{BuildOptions, Providers};

use self::manifests::{Desired, LoadedProxy, ManifestStore};
use egress_core::status::{HostRow, ProxyStatusRow, StatusDocument};

/// The provider config used when `--config` is not given: this machine's libvirtd through its
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
    /// Time given to work in flight at shutdown.
    pub shutdown_grace: Duration,
    /// Proxy health checks through each proxy; `None` turns them off (then `Ready` is the
    /// controller's alone and `/healthy.txt` is empty).
    pub health: Option<HealthSettings>,
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
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            health: None,
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

/// A token cancelled on the first SIGTERM or SIGINT. Must be called inside a tokio runtime.
/// If a signal handler cannot be installed, that is logged and the other signal still works.
pub fn shutdown_on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let term = signal(SignalKind::terminate());
            if let Err(e) = &term {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
            }
            let term_wait = async {
                match term {
                    Ok(mut s) => {
                        s.recv().await;
                    }
                    Err(_) => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                r = tokio::signal::ctrl_c() => {
                    if let Err(e) = r {
                        tracing::warn!(error = %e, "cannot listen for SIGINT");
                        std::future::pending::<()>().await;
                    }
                    tracing::info!("SIGINT: shutting down");
                }
                () = term_wait => tracing::info!("SIGTERM: shutting down"),
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
        t.cancel();
    });
    token
}

/// Runs standalone mode until `shutdown` is cancelled: loads the config (refusing to start on
/// any error), builds the providers, binds `opts.listen` and runs [`run_with_providers`].
pub async fn run(
    opts: StandaloneOptions,
    shutdown: CancellationToken,
) -> Result<(), StandaloneError> {
    let cfg = load_config(opts.config_path.as_deref()).map_err(StandaloneError::Config)?;
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
    let controller = Arc::new(Controller::new(
        Arc::clone(&providers),
        opts.controller.clone(),
    ));
    let shared = Arc::new(Shared {
        controller,
        providers: RwLock::new(providers),
        objects: Mutex::new(BTreeMap::new()),
        hosts: Mutex::new(BTreeMap::new()),
        manifest_errors: Mutex::new(Vec::new()),
        adopted: Mutex::new(HashSet::new()),
        directory_ok: AtomicBool::new(false),
        ready: AtomicBool::new(false),
        stopping: AtomicBool::new(false),
        metrics: Metrics::new(),
        image_bytes_exported: AtomicU64::new(0),
        health: opts.health.clone().map(|h| Arc::new(HealthEngine::new(h))),
        host_health: Mutex::new(BTreeMap::new()),
        queue: WorkQueue::default(),
        timers: Mutex::new(HashMap::new()),
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
    let (s, desired) = scan(store).await;
    store = s;
    shared.apply_desired(&desired);

    let mut loops = JoinSet::new();
    loops.spawn(adoption_loop(Arc::clone(&shared), stop.clone()));
    loops.spawn(manifest_loop(Arc::clone(&shared), store, stop.clone()));
    loops.spawn(check_loop(
        Arc::clone(&shared),
        opts.check_interval,
        stop.clone(),
    ));
    loops.spawn(gc_loop(
        Arc::clone(&shared),
        opts.gc_interval,
        opts.gc.clone(),
        stop.clone(),
    ));
    loops.spawn(resync_loop(Arc::clone(&shared), stop.clone()));
    if let Some(engine) = shared.health.clone() {
        loops.spawn(health_loop(Arc::clone(&shared), engine, stop.clone()));
    }
    if let Some(p) = opts.config_path.clone() {
        loops.spawn(config_loop(Arc::clone(&shared), p, stop.clone()));
    }
    let mut workers = JoinSet::new();
    for _ in 0..opts.workers.max(1) {
        workers.spawn(worker(Arc::clone(&shared), stop.clone()));
    }

    stop.cancelled().await;
    tracing::info!("standalone: stopping; no new work is started");
    // Workers finish the reconcile they are in (each bounded by the reconcile deadline).
    loops.abort_all();
    shared.stopping.store(true, Ordering::SeqCst);
    shared.abort_timers();
    let grace = opts.shutdown_grace;
    let drain = async {
        shared.controller.shutdown(grace).await;
        while workers.join_next().await.is_some() {}
    };
    if tokio::time::timeout(
        grace.saturating_add(opts.controller.reconcile_deadline),
        drain,
    )
    .await
    .is_err()
    {
        workers.abort_all();
    }
    shared.abort_timers();
    while loops.join_next().await.is_some() {}
    http_stop.cancel();
    let _ = http_task.await;
    tracing::info!("standalone: stopped");
    Ok(())
}

/// Locks a std mutex, recovering from poisoning (every update leaves the data consistent).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One Proxy as this process knows it.
#[derive(Debug, Clone)]
struct Obj {
    object: ProxyObject,
    status: ProxyStatus,
    first_seen: SystemTime,
}

/// State shared by the loops, the workers and the HTTP endpoint.
struct Shared {
    controller: Arc<Controller>,
    providers: RwLock<Arc<Providers>>,
    objects: Mutex<BTreeMap<ProxyUid, Obj>>,
    hosts: Mutex<BTreeMap<(String, String), HostRow>>,
    manifest_errors: Mutex<Vec<String>>,
    /// Entries adopted from a complete listing (by name and config digest).
    adopted: Mutex<HashSet<(String, String)>>,
    directory_ok: AtomicBool,
    ready: AtomicBool,
    /// Set at shutdown: no requeue timer is started any more.
    stopping: AtomicBool,
    metrics: Metrics,
    /// The controller's image-byte total already added to `metrics`.
    image_bytes_exported: AtomicU64,
    /// The proxy health engine, when health checks are on.
    health: Option<Arc<HealthEngine>>,
    /// Full host rows (`/hosts`), from the host check loop.
    host_health: Mutex<BTreeMap<(String, String), HostHealth>>,
    queue: WorkQueue,
    timers: Mutex<HashMap<ProxyUid, AbortHandle>>,
}

impl Shared {
    fn providers(&self) -> Arc<Providers> {
        self.providers
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Adds an `Unknown` row for every configured host without one; drops rows of hosts no
    /// longer configured.
    fn seed_host_rows(&self) {
        let providers = self.providers();
        let mut hosts = lock(&self.hosts);
        let mut keep = HashSet::new();
        for h in providers.iter() {
            for c in &h.config.hosts {
                let key = (h.config.name.clone(), c.name.clone());
                keep.insert(key.clone());
                lock(&self.host_health)
                    .entry(key.clone())
                    .or_insert_with(|| HostHealth::unknown(&h.config.name, &c.name));
                hosts.entry(key).or_insert_with(|| HostRow {
                    entry: h.config.name.clone(),
                    host: c.name.clone(),
                    state: "Unknown".into(),
                    latency_ms: None,
                    error: None,
                });
            }
        }
        hosts.retain(|k, _| keep.contains(k));
        lock(&self.host_health).retain(|k, _| keep.contains(k));
    }

    /// Merges a manifest scan into the objects: new and changed proxies are (re)queued,
    /// vanished ones become `deleting` (only when the directory could be listed).
    fn apply_desired(&self, d: &Desired) {
        *lock(&self.manifest_errors) = d.errors.clone();
        self.directory_ok.store(d.directory_ok, Ordering::SeqCst);
        let now = SystemTime::now();
        let mut changed = Vec::new();
        {
            let mut objects = lock(&self.objects);
            for (uid, (p, generation)) in &d.proxies {
                match objects.get_mut(uid) {
                    Some(o) => {
                        if o.object.generation != *generation
                            || o.object.deleting
                            || o.object.spec != p.spec
                        {
                            o.object = object_of(p, *generation);
                            changed.push(*uid);
                        }
                    }
                    None => {
                        objects.insert(
                            *uid,
                            Obj {
                                object: object_of(p, *generation),
                                status: ProxyStatus::default(),
                                first_seen: now,
                            },
                        );
                        changed.push(*uid);
                    }
                }
            }
            if d.directory_ok {
                for (uid, o) in objects.iter_mut() {
                    if !d.proxies.contains_key(uid) && !o.object.deleting {
                        tracing::info!(proxy = %format!("{}/{}", o.object.namespace, o.object.name), "manifest removed: deleting");
                        o.object.deleting = true;
                        changed.push(*uid);
                    }
                }
            }
        }
        for uid in changed {
            self.queue.add(uid);
        }
        self.update_phase_metrics();
    }

    fn update_phase_metrics(&self) {
        let mut counts: HashMap<Phase, i64> = HashMap::new();
        for o in lock(&self.objects).values() {
            *counts.entry(o.status.phase).or_default() += 1;
        }
        let v: Vec<(Phase, i64)> = counts.into_iter().collect();
        self.metrics.set_phase_counts(&v);
    }

    /// Whether the entry `entry` (as currently configured) was adopted.
    fn is_adopted(&self, entry: &str) -> bool {
        let providers = self.providers();
        match providers.get(entry) {
            // An unknown entry: the controller reports it; nothing to adopt.
            None => true,
            Some(h) => lock(&self.adopted).contains(&(entry.to_owned(), h.config_digest.clone())),
        }
    }

    /// Re-queues `uid` after `after`, replacing any earlier timer of it.
    fn schedule(self: &Arc<Self>, uid: ProxyUid, after: Duration) {
        if self.stopping.load(Ordering::SeqCst) {
            return;
        }
        let me = Arc::clone(self);
        let task = tokio::spawn(async move {
            tokio::time::sleep(after).await;
            lock(&me.timers).remove(&uid);
            me.queue.add(uid);
        });
        if let Some(old) = lock(&self.timers).insert(uid, task.abort_handle()) {
            old.abort();
        }
    }

    fn abort_timers(&self) {
        for (_, t) in lock(&self.timers).drain() {
            t.abort();
        }
    }

    /// Writes a reconcile's outcome back; forgets the Proxy when its deletion finalized.
    fn apply_outcome(self: &Arc<Self>, uid: ProxyUid, obj: &ProxyObject, out: Outcome) {
        let key = format!("{}/{}", obj.namespace, obj.name);
        for ev in &out.events {
            match ev.kind {
                EventKind::Normal => {
                    tracing::info!(proxy = %key, reason = %ev.reason, message = %ev.message, "event");
                }
                EventKind::Warning => {
                    tracing::warn!(proxy = %key, reason = %ev.reason, message = %ev.message, "event");
                }
            }
        }
        let error_class = out
            .events
            .iter()
            .find(|e| e.kind == EventKind::Warning)
            .map(|e| e.reason.clone());
        self.metrics.reconciled(error_class.as_deref());
        let mut forget = false;
        {
            let mut objects = lock(&self.objects);
            if let Some(o) = objects.get_mut(&uid) {
                let previous = std::mem::replace(&mut o.status, out.status);
                if let Some(engine) = &self.health {
                    health::apply_to_status(
                        &mut o.status,
                        engine.get(&uid).as_ref(),
                        Some(&previous),
                        SystemTime::now(),
                        o.object.generation,
                    );
                }
                if out.finalized && o.object.deleting {
                    objects.remove(&uid);
                    forget = true;
                }
            }
        }
        if forget {
            if let Some(engine) = &self.health {
                engine.forget(&uid, &key);
            }
            tracing::info!(proxy = %key, "deleted: nothing left on any host");
            if let Some(t) = lock(&self.timers).remove(&uid) {
                t.abort();
            }
        } else if let Some(d) = out.requeue_after {
            self.schedule(uid, d);
        }
        self.update_phase_metrics();
    }

    fn status_document(&self) -> StatusDocument {
        let mut proxies: Vec<ProxyStatusRow> = lock(&self.objects)
            .values()
            .map(|o| ProxyStatusRow {
                namespace: o.object.namespace.clone(),
                name: o.object.name.clone(),
                uid: o.object.uid.canonical(),
                phase: o.status.phase,
                host: o.status.host.clone(),
                ip: o.status.ip.clone(),
                provider_id: o.status.provider_id.clone(),
                // The instance's creation (its mark's time) when known, else when this
                // process first saw the manifest.
                created_at: humantime::format_rfc3339_seconds(
                    self.controller
                        .created_at(&o.object.uid)
                        .unwrap_or(o.first_seen),
                )
                .to_string(),
                last_error: o
                    .status
                    .conditions
                    .iter()
                    .find(|c| c.status == ConditionStatus::False && !c.message.is_empty())
                    .map(|c| c.message.clone()),
                conditions: o.status.conditions.clone(),
                port: Some(o.object.spec.proxy.port),
                health: o.status.health.clone(),
            })
            .collect();
        proxies.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        StatusDocument {
            generated_at: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
            proxies,
            hosts: lock(&self.hosts).values().cloned().collect(),
            manifest_errors: lock(&self.manifest_errors).clone(),
        }
    }
}

impl egress_core::web::Endpoints for Shared {
    fn status(&self) -> StatusDocument {
        self.status_document()
    }

    fn metrics(&self) -> String {
        self.metrics
            .set_controller_counters(self.controller.metrics());
        // The controller keeps a monotonic total; the counter gets what it has not seen yet.
        let total = self.controller.image_bytes();
        let before = self.image_bytes_exported.fetch_max(total, Ordering::SeqCst);
        if total > before {
            self.metrics.image_bytes(total - before);
        }
        let mut text = self.metrics.encode();
        if let Some(engine) = &self.health {
            // One exposition: the health registry goes before the single `# EOF`.
            if let Some(body) = text.strip_suffix("# EOF\n") {
                let mut out = body.to_owned();
                engine.metrics().encode_into(&mut out);
                out.push_str("# EOF\n");
                text = out;
            }
        }
        text
    }

    fn ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    fn hosts(&self) -> Vec<HostHealth> {
        lock(&self.host_health).values().cloned().collect()
    }
}

fn object_of(p: &LoadedProxy, generation: i64) -> ProxyObject {
    ProxyObject {
        namespace: p.namespace.clone(),
        name: p.name.clone(),
        uid: p.uid,
        generation,
        spec: p.spec.clone(),
        deleting: false,
        credentials: p.credentials.as_ref().map(|c| ProxyCredentials {
            username: c.username.clone(),
            password: c.password.clone(),
        }),
    }
}

/// Scans the manifest directory off the async threads (it is file I/O).
async fn scan(mut store: ManifestStore) -> (ManifestStore, Desired) {
    let dir = store.dir().to_path_buf();
    match tokio::task::spawn_blocking(move || {
        let d = store.scan();
        (store, d)
    })
    .await
    {
        Ok(r) => r,
        Err(e) => {
            // The blocking task panicked: start over with an empty store; report the
            // directory as not ok so nothing is marked deleting on this pass.
            tracing::error!(error = %e, "manifest scan failed");
            (
                ManifestStore::new(dir),
                Desired {
                    directory_ok: false,
                    ..Desired::default()
                },
            )
        }
    }
}

/// Waits `d` or until `stop`; returns false when stopped.
async fn sleep_or_stop(d: Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        () = stop.cancelled() => false,
        () = tokio::time::sleep(d) => true,
    }
}

async fn manifest_loop(sh: Arc<Shared>, mut store: ManifestStore, stop: CancellationToken) {
    while sleep_or_stop(POLL_INTERVAL, &stop).await {
        let (s, desired) = scan(store).await;
        store = s;
        sh.apply_desired(&desired);
    }
}

/// Adopts every entry not yet adopted (under its current config), retrying failures every
/// [`ADOPT_RETRY`]; marks the process ready once every entry was adopted once.
async fn adoption_loop(sh: Arc<Shared>, stop: CancellationToken) {
    loop {
        let providers = sh.providers();
        let pending: Vec<_> = providers
            .iter()
            .filter(|h| {
                !lock(&sh.adopted).contains(&(h.config.name.clone(), h.config_digest.clone()))
            })
            .cloned()
            .collect();
        let mut all_ok = true;
        for h in pending {
            let name = h.config.name.clone();
            let r = tokio::select! {
                () = stop.cancelled() => return,
                r = tokio::time::timeout(ADOPT_DEADLINE, h.provider.list_owned()) => r,
            };
            match r {
                Ok(Ok(owned)) => {
                    sh.controller.adopt(&name, &owned);
                    lock(&sh.adopted).insert((name.clone(), h.config_digest.clone()));
                    tracing::info!(entry = %name, instances = owned.len(), "adopted");
                    // Its Proxies were waiting for this: reconcile them now, not at their
                    // retry timer.
                    let uids: Vec<ProxyUid> = lock(&sh.objects)
                        .iter()
                        .filter(|(_, o)| o.object.spec.provider == name)
                        .map(|(u, _)| *u)
                        .collect();
                    for u in uids {
                        sh.queue.add(u);
                    }
                }
                Ok(Err(e)) => {
                    all_ok = false;
                    tracing::warn!(entry = %name, error = %e, "adoption listing failed; retrying");
                }
                Err(_) => {
                    all_ok = false;
                    tracing::warn!(entry = %name, "adoption listing timed out; retrying");
                }
            }
        }
        if all_ok && !sh.ready.swap(true, Ordering::SeqCst) {
            tracing::info!("ready: every provider entry adopted");
        }
        if !sleep_or_stop(ADOPT_RETRY.min(POLL_INTERVAL), &stop).await {
            return;
        }
    }
}

/// Checks every entry's hosts each `interval` (bounded fan-out, see [`hosthealth`]); feeds
/// placement ([`Controller::record_host_reports`]), the `/status` host rows, `/hosts` and the
/// host metrics. An entry whose check missed [`CHECK_DEADLINE`] is recorded as Timeout on
/// every host, so placement avoids it too.
async fn check_loop(sh: Arc<Shared>, interval: Duration, stop: CancellationToken) {
    loop {
        let providers = sh.providers();
        let results = tokio::select! {
            () = stop.cancelled() => return,
            r = hosthealth::check_all(
                &providers,
                hosthealth::DEFAULT_MAX_PARALLEL_ENTRIES,
                CHECK_DEADLINE,
            ) => r,
        };
        let now = SystemTime::now();
        for check in results {
            let entry = check.handle.config.name.clone();
            let rows = check.rows(CHECK_DEADLINE, now);
            let reports: Vec<egress_provider::model::HostReport> = match &check.reports {
                Some(r) => r.clone(),
                None => check
                    .handle
                    .config
                    .hosts
                    .iter()
                    .map(|c| egress_provider::model::HostReport {
                        host: c.name.clone(),
                        state: HostState::Timeout,
                        latency: None,
                        hostname: None,
                        libvirt_version: None,
                        virt_types: Vec::new(),
                        uefi: false,
                        pool_free_bytes: None,
                        missing: Vec::new(),
                        error: None,
                    })
                    .collect(),
            };
            sh.controller.record_host_reports(&entry, &reports);
            let mut hosts = lock(&sh.hosts);
            let mut full = lock(&sh.host_health);
            for row in rows {
                let ready = row.state == "Ready";
                let latency = check
                    .reports
                    .as_ref()
                    .and_then(|rs| rs.iter().find(|r| r.host == row.host))
                    .and_then(|r| r.latency)
                    .map(|l| l.as_secs_f64());
                sh.metrics.host_checked(&entry, &row.host, ready, latency);
                hosts.insert(
                    (entry.clone(), row.host.clone()),
                    HostRow {
                        entry: entry.clone(),
                        host: row.host.clone(),
                        state: row.state.clone(),
                        latency_ms: row.latency_ms,
                        error: row.error.clone(),
                    },
                );
                full.insert((entry.clone(), row.host.clone()), row);
            }
        }
        if !sleep_or_stop(interval, &stop).await {
            return;
        }
    }
}

/// Runs the proxy health engine: each round probes every Running Proxy with an address (not
/// being deleted) and merges every Proxy's health into its status (`Healthy`, `Ready` =
/// Running ∧ Healthy). A Proxy that is not probed this round keeps its state (finding H3);
/// deleted Proxies are dropped from the engine.
async fn health_loop(sh: Arc<Shared>, engine: Arc<HealthEngine>, stop: CancellationToken) {
    let targets_sh = Arc::clone(&sh);
    let targets = move || -> Vec<ProbeTarget> {
        lock(&targets_sh.objects)
            .iter()
            .filter(|(_, o)| !o.object.deleting)
            .filter_map(|(uid, o)| {
                ProbeTarget::of(
                    *uid,
                    format!("{}/{}", o.object.namespace, o.object.name),
                    &o.object.spec.proxy,
                    o.object.credentials.as_ref(),
                    &o.status,
                )
            })
            .collect()
    };
    let merge_sh = Arc::clone(&sh);
    let merge_engine = Arc::clone(&engine);
    let after_round = move |r: &health::RoundReport| {
        let now = SystemTime::now();
        let mut objects = lock(&merge_sh.objects);
        merge_engine.retain(|u| objects.contains_key(u));
        for (uid, o) in objects.iter_mut() {
            let previous = o.status.clone();
            health::apply_to_status(
                &mut o.status,
                merge_engine.get(uid).as_ref(),
                Some(&previous),
                now,
                o.object.generation,
            );
        }
        tracing::debug!(probed = r.probed, ok = r.succeeded, elapsed = ?r.elapsed, "health round");
    };
    engine.run(targets, after_round, stop).await;
}

async fn gc_loop(
    sh: Arc<Shared>,
    interval: Duration,
    settings: GcSettings,
    stop: CancellationToken,
) {
    while sleep_or_stop(interval, &stop).await {
        if !sh.directory_ok.load(Ordering::SeqCst) || !sh.ready.load(Ordering::SeqCst) {
            tracing::warn!("GC skipped: manifests unreadable or adoption not complete");
            continue;
        }
        // NB: the live set is taken before listing (GC's contract): every Proxy this process
        // knows, deleting ones included, so GC never races the reconciler's own deletes.
        let live: HashSet<ProxyUid> = lock(&sh.objects).keys().copied().collect();
        let providers = sh.providers();
        let report = tokio::select! {
            () = stop.cancelled() => return,
            r = gc::collect(&providers, &live, &settings, SystemTime::now()) => r,
        };
        let deleted = report.with_action(gc::Action::Deleted).count();
        for i in report.with_action(gc::Action::Deleted) {
            tracing::info!(entry = %i.entry, host = %i.host, name = %i.name, reason = %i.reason, "GC deleted");
        }
        for i in report.with_action(gc::Action::Failed) {
            tracing::warn!(entry = %i.entry, host = %i.host, name = %i.name, reason = %i.reason, "GC deletion failed");
        }
        for e in &report.entries {
            if e.instances_error.is_none() {
                // The listing is complete: refresh where instances are.
                sh.controller.adopt(&e.entry, &e.listed);
            }
        }
        sh.metrics.gc_ran(
            if report.is_clean() {
                "ok"
            } else {
                "incomplete"
            },
            u64::try_from(deleted).unwrap_or(u64::MAX),
        );
    }
}

/// Queues every known Proxy every [`RESYNC_INTERVAL`].
async fn resync_loop(sh: Arc<Shared>, stop: CancellationToken) {
    while sleep_or_stop(RESYNC_INTERVAL, &stop).await {
        let uids: Vec<ProxyUid> = lock(&sh.objects).keys().copied().collect();
        for u in uids {
            sh.queue.add(u);
        }
    }
}

/// Reloads the provider config when its file changes; a bad version keeps the running one.
async fn config_loop(sh: Arc<Shared>, path: PathBuf, stop: CancellationToken) {
    let stamp = |p: &Path| {
        std::fs::metadata(p)
            .ok()
            .map(|m| (m.modified().ok(), m.len()))
    };
    let mut last = stamp(&path);
    while sleep_or_stop(POLL_INTERVAL, &stop).await {
        let now = stamp(&path);
        if now == last {
            continue;
        }
        last = now;
        let p = path.clone();
        let loaded = tokio::task::spawn_blocking(move || config::load(&p)).await;
        let cfg = match loaded {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                tracing::error!(error = %e, "config reload refused; the running config stays");
                continue;
            }
            Err(e) => {
                tracing::error!(error = %e, "config reload failed; the running config stays");
                continue;
            }
        };
        match Providers::from_config(&cfg, &BuildOptions::default()) {
            Ok(p) => {
                let p = Arc::new(p);
                sh.controller.set_providers(Arc::clone(&p));
                *sh.providers.write().unwrap_or_else(PoisonError::into_inner) = p;
                sh.seed_host_rows();
                tracing::info!(path = %path.display(), "provider config reloaded");
                let uids: Vec<ProxyUid> = lock(&sh.objects).keys().copied().collect();
                for u in uids {
                    sh.queue.add(u);
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "config reload: cannot build providers; the running config stays");
            }
        }
    }
}

async fn worker(sh: Arc<Shared>, stop: CancellationToken) {
    while let Some(uid) = sh.queue.next(&stop).await {
        let snap = lock(&sh.objects)
            .get(&uid)
            .map(|o| (o.object.clone(), o.status.clone()));
        if let Some((obj, st)) = snap {
            if sh.is_adopted(&obj.spec.provider) {
                let out = sh.controller.reconcile(&obj, &st, SystemTime::now()).await;
                sh.apply_outcome(uid, &obj, out);
            } else {
                sh.schedule(uid, ADOPT_RETRY.min(POLL_INTERVAL));
            }
        }
        sh.queue.done(uid);
    }
}

/// A de-duplicating work queue: a UID is queued at most once, and handed to one worker at a
/// time; an `add` while it is being worked on queues it again after [`WorkQueue::done`].
#[derive(Default)]
struct WorkQueue {
    state: Mutex<QueueState>,
    notify: Notify,
}

#[derive(Default)]
struct QueueState {
    order: VecDeque<ProxyUid>,
    queued: HashSet<ProxyUid>,
    active: HashSet<ProxyUid>,
    dirty: HashSet<ProxyUid>,
}

impl WorkQueue {
    fn add(&self, uid: ProxyUid) {
        {
            let mut s = lock(&self.state);
            if s.active.contains(&uid) {
                s.dirty.insert(uid);
                return;
            }
            if !s.queued.insert(uid) {
                return;
            }
            s.order.push_back(uid);
        }
        self.notify.notify_one();
    }

    fn try_pop(&self) -> Option<ProxyUid> {
        let mut s = lock(&self.state);
        let uid = s.order.pop_front()?;
        s.queued.remove(&uid);
        s.active.insert(uid);
        Some(uid)
    }

    /// The next UID, or `None` once `stop` is cancelled.
    async fn next(&self, stop: &CancellationToken) -> Option<ProxyUid> {
        loop {
            if stop.is_cancelled() {
                return None;
            }
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(u) = self.try_pop() {
                // Pass the wake-up on: more may be queued than workers woken.
                if !lock(&self.state).order.is_empty() {
                    self.notify.notify_one();
                }
                return Some(u);
            }
            tokio::select! {
                () = stop.cancelled() => return None,
                () = &mut notified => {}
            }
        }
    }

    fn done(&self, uid: ProxyUid) {
        let again = {
            let mut s = lock(&self.state);
            s.active.remove(&uid);
            s.dirty.remove(&uid)
        };
        if again {
            self.add(uid);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn u(n: u8) -> ProxyUid {
        ProxyUid(uuid::Uuid::from_bytes([n; 16]))
    }

    #[test]
    fn the_embedded_default_config_loads() {
        let c = load_config(None).unwrap();
        assert_eq!(c.providers.len(), 1);
        let egress_core::config::ProviderEntry::Libvirt(e) = &c.providers[0];
        assert_eq!(e.name, "local");
        assert_eq!(e.hosts[0].address, egress_core::providers::LOCAL_ADDRESS);
        assert_eq!(e.hosts[0].pool, "egress-proxies");
    }

    #[tokio::test]
    async fn the_queue_hands_a_uid_to_one_worker_and_requeues_changes_after_it() {
        let q = WorkQueue::default();
        let stop = CancellationToken::new();
        q.add(u(1));
        q.add(u(1));
        q.add(u(2));
        assert_eq!(q.next(&stop).await, Some(u(1)));
        q.add(u(1)); // while active: once more after done
        assert_eq!(q.next(&stop).await, Some(u(2)));
        q.done(u(2));
        assert!(q.try_pop().is_none(), "u1 is active, not queued twice");
        q.done(u(1));
        assert_eq!(q.next(&stop).await, Some(u(1)));
        q.done(u(1));
        stop.cancel();
        assert_eq!(q.next(&stop).await, None);
    }

    #[test]
    fn the_embedded_default_config_loads_without_ssh_files() {
        let c = load_config(None).unwrap();
        let egress_core::config::ProviderEntry::Libvirt(e) = &c.providers[0];
        assert_eq!(e.hosts[0].address, "local");
        assert!(e.hosts[0].ssh_key_file.is_none());
    }
}
