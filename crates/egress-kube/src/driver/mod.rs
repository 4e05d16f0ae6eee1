//! The Kubernetes driver: a kube-runtime `Controller` on [`Proxy`] over the core reconciler
//! ([`egress_core::controller::Controller`]), plus the leader-only GC and provider-health
//! loops and the watch on the provider config and SSH material.
//!
//! Pipeline of one reconcile ([`reconcile`]): read (the Proxy from the watch cache, its
//! credentials Secret: network) → ensure the finalizer (network) → core `reconcile` (bounded
//! by the core's own deadline) → write the status with server-side apply under
//! [`FIELD_MANAGER`] (only when it changed) → publish the outcome's events (reason = the
//! core's category) → remove the finalizer once the core reports `finalized`.
//!
//! Guarantees:
//! - Everything that acts (the controller, GC, host checks) runs only while this replica holds
//!   the leader Lease ([`crate::leader`]); each leadership term gets a fresh core controller
//!   that first adopts what the hosts' marks say, and a lost Lease stops the term's work.
//!   (Two replicas reconciling the same Proxy could place it twice, so the reconciler is
//!   gated too, not only GC and health.)
//! - One reconcile never outlives the core's reconcile deadline plus [`API_SLACK`] (finding
//!   APX-3); at most `concurrency` reconciles run at once, and per-host limits come from the
//!   core (finding H1).
//! - Error policy: a Permanent provider failure is latched by the core and the reconcile
//!   asks for no requeue (it waits for a spec change, a config change or a resync); a
//!   Transient failure requeues after the core's per-object backoff (finding APX-2); a
//!   Kubernetes API failure of the driver itself backs off per object the same way.
//! - A change of the provider config file or of any file in the SSH directory rebuilds the
//!   providers and re-reconciles every Proxy, which releases Permanent latches of changed
//!   entries (the core compares config digests). A config that fails to load keeps the
//!   running one.
//! - Proxy health (when `--health-target` is set): on the leader, every Running Proxy with an
//!   address is probed through itself ([`egress_core::health`]); its state is merged into
//!   the status the driver applies (`health`, `Healthy`, `Ready` = Running ∧ Healthy) both by
//!   reconciles and by a publishing pass after each round, and a change of a Proxy's decided
//!   health is an Event (`Healthy`, or the failure's reason). Health state outlives terms and
//!   is dropped only when the Proxy is deleted (finding H3).
//! - Publishing ([`publish`]): after every health round and every `publish_interval`, groups
//!   of Proxies labelled `egress-proxies.dev/group` get a selector-less Service and
//!   EndpointSlices listing only healthy members.
//! - Credentials: a Proxy's credentials Secret is read on every reconcile and re-read every
//!   `secret_poll_interval`; a change re-reconciles the Proxies naming it (only `get` on
//!   Secrets: no cluster-wide list/watch of Secrets is needed).
//! - Every Kubernetes API call site names its [`crate::rbac`] entry (`// rbac:`), and a test
//!   records the fake API server's requests over a full tour and checks they equal
//!   [`crate::rbac::API_ACCESS`].
//! - On shutdown: the controller stops taking work, in-flight reconciles finish (bounded),
//!   the core gets `shutdown_grace` for creates and deletes, and only then is the Lease
//!   released, so a rollout hands over within one retry period (finding APX-3).

pub mod publish;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use egress_core::controller::{
    Controller as Core, ControllerSettings, EventKind, Outcome, ProxyCredentials, ProxyObject,
    backoff::backoff,
};
use egress_core::gc::{self, GcSettings};
use egress_core::health::{self, HealthState, ProbeTarget};
use egress_core::model::{Condition, ConditionStatus, ProxyStatus};
use egress_core::providers::{BuildOptions, Providers};
use egress_core::status::ProxyStatusRow;
use egress_provider::ProxyUid;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::api::{HostHealth, HostHealthState, ProviderHealth, ProviderHealthStatus, Proxy};
use crate::leader::{Elector, LeaseSettings};
use crate::observe::Observer;

/// The one field manager of every server-side apply the operator makes.
pub const FIELD_MANAGER: &str = "egress-proxies";
/// The finalizer the operator puts on every Proxy.
pub const FINALIZER: &str = "egress-proxies.dev/instance";
/// Time a reconcile may spend on Kubernetes API calls beside the core's reconcile.
// NB: a reconcile makes at most 4 API calls (secret, finalizer, status, finalizer) plus
// events; each is normally < 50 ms. 15 s absorbs a slow API server without letting a hung
// one pin a worker for long.
pub const API_SLACK: Duration = Duration::from_secs(15);
/// Default number of reconciles running at once.
// NB: reconciles are short (creates are spawned by the core); 8 keeps a few slow hosts from
// delaying everyone while the per-host limits of the core bound the load on each host.
pub const DEFAULT_CONCURRENCY: u16 = 8;
/// Default interval between GC passes.
pub const DEFAULT_GC_INTERVAL: Duration = Duration::from_secs(600);
/// Default interval between provider health rounds.
// NB: as in standalone mode: a host that goes away shows within half a minute.
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(30);
/// Default interval between looks at the provider config file and the SSH directory.
// NB: a mounted ConfigMap or Secret changes at most once per kubelet sync (~1 min); 5 s
// notices a change promptly for reading two small files.
pub const DEFAULT_WATCH_INTERVAL: Duration = Duration::from_secs(5);
/// Default time given to creates and deletes in flight at shutdown or leadership loss.
// NB: well below a pod's default 30 s termination grace, leaving time to release the Lease.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(20);
/// Longest adoption listing of one entry at the start of a term.
pub const ADOPT_DEADLINE: Duration = gc::LIST_BUDGET;
/// Longest one entry's host check may take.
// NB: `check` bounds each host by the entry's dial and call timeouts (70 s by default).
pub const CHECK_DEADLINE: Duration = Duration::from_secs(120);
/// Longest listing of every Proxy for GC's live set.
// NB: one paged list of metadata; 30 s is far above a healthy API server's answer.
pub const LIVE_SET_DEADLINE: Duration = Duration::from_secs(30);
/// Largest file read when fingerprinting the SSH directory.
// NB: keys and known_hosts are a few KiB; a larger file is fingerprinted by size and mtime.
pub const MAX_FINGERPRINT_FILE: u64 = 1 << 20;
/// Default interval between publishing passes (status merge of health, Services and
/// EndpointSlices) besides the pass after every health round.
// NB: a pass is an in-memory diff that writes only what changed; 5 s makes an emptied group's
// Service go promptly when health checks are off (no rounds to trigger passes).
pub const DEFAULT_PUBLISH_INTERVAL: Duration = Duration::from_secs(5);
/// Default interval between re-reads of the credentials Secrets Proxies name.
// NB: a few `get`s per interval (one per distinct Secret); 15 s makes a created or changed
// Secret take effect within a kubelet-sync-like delay without a cluster-wide Secret watch.
pub const DEFAULT_SECRET_POLL_INTERVAL: Duration = Duration::from_secs(15);
/// Interval between looks at whether the watch cache finished its first listing.
// NB: only at the start of a term; 200 ms delays the first health round and publishing pass
// by at most that after the listing, at the cost of a few wake-ups.
pub const STORE_SYNC_POLL: Duration = Duration::from_millis(200);
/// First retry delay after a Kubernetes API failure of the driver.
pub const API_BACKOFF_BASE: Duration = Duration::from_secs(1);
/// Longest retry delay after Kubernetes API failures.
pub const API_BACKOFF_MAX: Duration = Duration::from_secs(120);

/// Rebuilds the providers after the config or SSH material changed.
pub type Reload = Arc<dyn Fn() -> Result<Providers, String> + Send + Sync>;

/// How the Kubernetes driver runs.
#[derive(Debug, Clone)]
pub struct KubeOptions {
    /// Provider config file.
    pub config_path: PathBuf,
    /// Directory of SSH keys and known_hosts (a mounted Secret), watched for changes.
    pub ssh_dir: Option<PathBuf>,
    /// Watch Proxies of this namespace only; `None`: all namespaces.
    pub namespace: Option<String>,
    /// Leader election.
    pub lease: LeaseSettings,
    /// Core reconciler settings.
    pub controller: ControllerSettings,
    /// GC settings.
    pub gc: GcSettings,
    /// Interval between GC passes.
    pub gc_interval: Duration,
    /// Interval between provider health rounds.
    pub check_interval: Duration,
    /// Interval between looks at the watched files.
    pub watch_interval: Duration,
    /// Reconciles at once.
    pub concurrency: u16,
    /// Time given to work in flight at shutdown.
    pub shutdown_grace: Duration,
    /// Interval between publishing passes ([`DEFAULT_PUBLISH_INTERVAL`]).
    pub publish_interval: Duration,
    /// Interval between re-reads of credentials Secrets ([`DEFAULT_SECRET_POLL_INTERVAL`]).
    pub secret_poll_interval: Duration,
}

impl KubeOptions {
    /// Options with every default.
    pub fn new(config_path: impl Into<PathBuf>, lease: LeaseSettings) -> Self {
        Self {
            config_path: config_path.into(),
            ssh_dir: None,
            namespace: None,
            lease,
            controller: ControllerSettings::default(),
            gc: GcSettings::default(),
            gc_interval: DEFAULT_GC_INTERVAL,
            check_interval: DEFAULT_CHECK_INTERVAL,
            watch_interval: DEFAULT_WATCH_INTERVAL,
            concurrency: DEFAULT_CONCURRENCY,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            publish_interval: DEFAULT_PUBLISH_INTERVAL,
            secret_poll_interval: DEFAULT_SECRET_POLL_INTERVAL,
        }
    }
}

/// Counters a test (or a debug endpoint) can read while the driver runs.
#[derive(Debug, Default)]
pub struct DriverStats {
    /// Leadership terms started.
    pub terms: AtomicU64,
    /// GC passes run.
    pub gc_passes: AtomicU64,
    /// Provider health rounds run.
    pub health_rounds: AtomicU64,
    /// Provider reloads applied.
    pub reloads: AtomicU64,
    /// Reconciles that hit the driver's deadline.
    pub reconcile_timeouts: AtomicU64,
    /// Publishing passes completed without an API failure.
    pub publish_passes: AtomicU64,
}

/// Why the driver did not start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// No Kubernetes client configuration (in-cluster or kubeconfig).
    #[error("cannot configure a Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    /// The provider config is invalid.
    #[error("{0}")]
    Config(#[source] egress_core::config::ConfigErrors),
    /// The providers could not be built.
    #[error("cannot build the providers: {0}")]
    Providers(#[source] egress_provider::ProviderError),
}

/// Why one reconcile failed (the error policy backs off per object).
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// A Kubernetes API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[source] kube::Error),
    /// The Proxy's `metadata.uid` is not a canonical UUID.
    #[error("metadata.uid {0:?} is not a canonical UUID")]
    Uid(String),
    /// The reconcile hit the driver's deadline (finding APX-3).
    #[error("reconcile did not finish within {0:?}")]
    Timeout(Duration),
}

impl ReconcileError {
    /// A stable category (metric label, log field).
    pub fn category(&self) -> &'static str {
        match self {
            Self::Kube(_) => "KubeApiError",
            Self::Uid(_) => "InvalidUid",
            Self::Timeout(_) => "ReconcileTimeout",
        }
    }
}

/// Runs the driver until `shutdown` is cancelled: loads the provider config (refusing to
/// start on any error), connects to the cluster (in-cluster or kubeconfig) and runs
/// [`run_with`] with a reload that re-reads the config file. `observer` is what `--listen`
/// serves; it becomes ready once the config loaded and the API server answers.
pub async fn run(
    opts: KubeOptions,
    observer: Arc<Observer>,
    shutdown: CancellationToken,
) -> Result<(), RunError> {
    let path = opts.config_path.clone();
    let build = move || -> Result<Providers, RunError> {
        let cfg = egress_core::config::load(&path).map_err(RunError::Config)?;
        for w in &cfg.warnings {
            tracing::warn!(%w, "provider config warning");
        }
        Providers::from_config(&cfg, &BuildOptions::default()).map_err(RunError::Providers)
    };
    let providers = build()?;
    observer.set_config_loaded(true);
    let client = Client::try_default().await.map_err(RunError::Client)?;
    let reload: Reload = Arc::new(move || build().map_err(|e| e.to_string()));
    run_with(
        opts,
        client,
        providers,
        reload,
        Arc::new(DriverStats::default()),
        observer,
        shutdown,
    )
    .await;
    Ok(())
}

/// Runs the driver with a ready client and providers (tests pass a fake API server and
/// fake-backed providers) until `shutdown` is cancelled; then stops the work and releases
/// the Lease.
pub async fn run_with(
    opts: KubeOptions,
    client: Client,
    providers: Providers,
    reload: Reload,
    stats: Arc<DriverStats>,
    observer: Arc<Observer>,
    shutdown: CancellationToken,
) {
    observer.set_config_loaded(true);
    let (providers_tx, providers_rx) = watch::channel(Arc::new(providers));
    let mut side = JoinSet::new();
    side.spawn(watch_files(
        opts.clone(),
        reload,
        providers_tx,
        stats.clone(),
        shutdown.clone(),
    ));
    let elector = Elector::spawn(client.clone(), opts.lease.clone());
    let mut leader = elector.leader();
    side.spawn(follow_election(
        elector.leader(),
        elector.api_ok(),
        observer.clone(),
    ));
    loop {
        tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            r = leader.wait_for(|l| *l) => if r.is_err() { break },
        }
        if shutdown.is_cancelled() {
            break;
        }
        stats.terms.fetch_add(1, Ordering::Relaxed);
        tracing::info!(identity = %opts.lease.identity, "leading: starting the controller");
        run_term(
            &opts,
            &client,
            &providers_rx,
            leader.clone(),
            &stats,
            &observer,
            &shutdown,
        )
        .await;
        tracing::info!("term ended");
    }
    elector.stop_and_release().await;
    side.abort_all();
    while side.join_next().await.is_some() {}
}

/// Mirrors leadership and API reachability into the observer (readiness).
async fn follow_election(
    mut leader: watch::Receiver<bool>,
    mut api_ok: watch::Receiver<bool>,
    observer: Arc<Observer>,
) {
    loop {
        observer.set_leader(*leader.borrow_and_update());
        observer.set_api_ok(*api_ok.borrow_and_update());
        tokio::select! {
            r = leader.changed() => if r.is_err() { return },
            r = api_ok.changed() => if r.is_err() { return },
        }
    }
}

/// Everything a reconcile needs.
struct Ctx {
    client: Client,
    core: Arc<Core>,
    recorder: Recorder,
    deadline: Duration,
    failures: Mutex<HashMap<String, u32>>,
    stats: Arc<DriverStats>,
    observer: Arc<Observer>,
    /// The credentials each Proxy's last reconcile read (health probes use them; the
    /// credentials poller compares against them).
    creds: Mutex<HashMap<ProxyUid, Option<ProxyCredentials>>>,
    /// The decided health each Proxy was last announced with (one Event per change).
    announced: Mutex<HashMap<ProxyUid, HealthState>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One leadership term: adopt, then run the controller and the leader-only loops until the
/// Lease is lost or `shutdown` is cancelled.
async fn run_term(
    opts: &KubeOptions,
    client: &Client,
    providers_rx: &watch::Receiver<Arc<Providers>>,
    mut leader: watch::Receiver<bool>,
    stats: &Arc<DriverStats>,
    observer: &Arc<Observer>,
    shutdown: &CancellationToken,
) {
    let stop = CancellationToken::new();
    let providers = providers_rx.borrow().clone();
    let core = Arc::new(Core::new(providers.clone(), opts.controller.clone()));
    observer.set_core(Some(core.clone()));
    let mut loops = JoinSet::new();
    {
        let (stop, shutdown) = (stop.clone(), shutdown.clone());
        loops.spawn(async move {
            tokio::select! {
                () = shutdown.cancelled() => {}
                _ = leader.wait_for(|l| !*l) => tracing::warn!("leadership lost: stopping"),
            }
            stop.cancel();
        });
    }
    {
        // NB: adoption runs beside the controller: a frozen host must not hold the term for
        // a whole listing budget, and the status's providerID already locates instances.
        let (core, stop) = (core.clone(), stop.clone());
        loops.spawn(async move { adopt(&core, &providers, &stop).await });
    }
    let (trigger_tx, trigger_rx) = mpsc::channel::<()>(1);
    let creds_trigger = trigger_tx.clone();
    loops.spawn(follow_providers(
        core.clone(),
        providers_rx.clone(),
        trigger_tx,
        stop.clone(),
    ));
    loops.spawn(gc_loop(
        client.clone(),
        providers_rx.clone(),
        opts.gc.clone(),
        opts.gc_interval,
        stats.clone(),
        stop.clone(),
    ));
    loops.spawn(health_loop(
        client.clone(),
        core.clone(),
        providers_rx.clone(),
        opts.check_interval,
        stats.clone(),
        observer.clone(),
        stop.clone(),
    ));
    let proxies: Api<Proxy> = match &opts.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        core: core.clone(),
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: FIELD_MANAGER.into(),
                instance: Some(opts.lease.identity.clone()),
            },
        ),
        deadline: opts.controller.reconcile_deadline.saturating_add(API_SLACK),
        failures: Mutex::new(HashMap::new()),
        stats: stats.clone(),
        observer: observer.clone(),
        creds: Mutex::new(HashMap::new()),
        announced: Mutex::new(HashMap::new()),
    });
    let triggers = futures_util::stream::unfold(trigger_rx, |mut rx| async move {
        rx.recv().await.map(|()| ((), rx))
    });
    let graceful = stop.clone().cancelled_owned();
    // rbac: PROXIES list, watch (the controller's watch cache)
    let controller = Controller::new(proxies, watcher::Config::default());
    let store = controller.store();
    let wake = Arc::new(Notify::new());
    // NB: one waiter on the store's readiness, fanned out, and re-polled: kube-runtime's
    // `wait_until_ready` keeps a single waker (a oneshot receiver shared by every clone of
    // the store), and a wake-up can be lost (observed with the fake API server); a fresh
    // poll every STORE_SYNC_POLL reads the readiness that was already set.
    let (synced_tx, synced) = watch::channel(false);
    {
        let store = store.clone();
        loops.spawn(async move {
            loop {
                match tokio::time::timeout(STORE_SYNC_POLL, store.wait_until_ready()).await {
                    Ok(Ok(())) => {
                        synced_tx.send_replace(true);
                        break;
                    }
                    Ok(Err(_)) => return,
                    Err(_) => {}
                }
            }
            // Keep the sender alive so waiters see `true`, not a closed channel.
            std::future::pending::<()>().await;
        });
    }
    if let Some(engine) = observer.health().cloned() {
        loops.spawn(proxy_health_loop(
            ctx.clone(),
            engine,
            store.clone(),
            synced.clone(),
            wake.clone(),
            stop.clone(),
        ));
    }
    loops.spawn(publish_loop(
        ctx.clone(),
        store.clone(),
        synced,
        publish::Publisher::new(
            client.clone(),
            opts.namespace.clone(),
            FIELD_MANAGER,
            API_SLACK,
        ),
        wake,
        opts.publish_interval,
        stats.clone(),
        stop.clone(),
    ));
    loops.spawn(credentials_loop(
        ctx.clone(),
        store,
        creds_trigger,
        opts.secret_poll_interval,
        stop.clone(),
    ));
    controller
        .with_config(ControllerConfig::default().concurrency(opts.concurrency.max(1)))
        .reconcile_all_on(triggers)
        .graceful_shutdown_on(graceful)
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "controller");
            }
        })
        .await;
    stop.cancel();
    core.shutdown(opts.shutdown_grace).await;
    loops.abort_all();
    while loops.join_next().await.is_some() {}
    observer.set_core(None);
}

/// Learns where instances are from every entry's complete listing (bounded per entry).
async fn adopt(core: &Core, providers: &Providers, stop: &CancellationToken) {
    for h in providers.iter() {
        let r = tokio::select! {
            () = stop.cancelled() => return,
            r = tokio::time::timeout(ADOPT_DEADLINE, h.provider.list_owned()) => r,
        };
        match r {
            Ok(Ok(owned)) => core.adopt(&h.config.name, &owned),
            Ok(Err(e)) => {
                tracing::warn!(entry = %h.config.name, error = %e, "adoption listing failed")
            }
            Err(_) => tracing::warn!(entry = %h.config.name, "adoption listing timed out"),
        }
    }
}

/// Hands reloaded providers to the core and re-reconciles everything.
async fn follow_providers(
    core: Arc<Core>,
    mut rx: watch::Receiver<Arc<Providers>>,
    trigger: mpsc::Sender<()>,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            r = rx.changed() => if r.is_err() { return },
        }
        let p = rx.borrow_and_update().clone();
        core.set_providers(p);
        // NB: a full channel means a re-reconcile of everything is already pending.
        let _ = trigger.try_send(());
    }
}

async fn sleep_or_stop(d: Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        () = stop.cancelled() => false,
        () = tokio::time::sleep(d) => true,
    }
}

/// A fingerprint of the config file and every file under the SSH directory (two levels, as a
/// mounted Secret's `..data` symlink layout has).
fn fingerprint(opts: &KubeOptions) -> String {
    let mut h = Sha256::new();
    let mut add = |p: &std::path::Path| {
        h.update(p.to_string_lossy().as_bytes());
        match std::fs::metadata(p) {
            Ok(m) if m.len() <= MAX_FINGERPRINT_FILE => {
                h.update(std::fs::read(p).unwrap_or_default());
            }
            Ok(m) => h.update(format!("{:?}{}", m.modified().ok(), m.len()).as_bytes()),
            Err(_) => h.update(b"-"),
        }
    };
    add(&opts.config_path);
    if let Some(dir) = &opts.ssh_dir {
        let mut files = Vec::new();
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                for e2 in std::fs::read_dir(&p).into_iter().flatten().flatten() {
                    if e2.path().is_file() {
                        files.push(e2.path());
                    }
                }
            } else if p.is_file() {
                files.push(p);
            }
        }
        files.sort();
        for f in &files {
            add(f);
        }
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Rebuilds the providers when the config file or the SSH material changes.
async fn watch_files(
    opts: KubeOptions,
    reload: Reload,
    tx: watch::Sender<Arc<Providers>>,
    stats: Arc<DriverStats>,
    stop: CancellationToken,
) {
    let o = opts.clone();
    let mut last = tokio::task::spawn_blocking(move || fingerprint(&o))
        .await
        .unwrap_or_default();
    while sleep_or_stop(opts.watch_interval, &stop).await {
        let o = opts.clone();
        let now = tokio::task::spawn_blocking(move || fingerprint(&o))
            .await
            .unwrap_or_default();
        if now == last {
            continue;
        }
        last = now;
        let r = reload.clone();
        match tokio::task::spawn_blocking(move || r()).await {
            Ok(Ok(p)) => {
                tracing::info!("provider config or SSH material changed: providers rebuilt");
                stats.reloads.fetch_add(1, Ordering::Relaxed);
                tx.send_replace(Arc::new(p));
            }
            Ok(Err(e)) => tracing::error!(error = %e, "reload refused; the running config stays"),
            Err(e) => tracing::error!(error = %e, "reload failed; the running config stays"),
        }
    }
}

/// Leader-only: orphan GC over every entry, with the UIDs of every Proxy in the cluster as
/// the live set (a pass is skipped when that list cannot be had completely).
async fn gc_loop(
    client: Client,
    providers: watch::Receiver<Arc<Providers>>,
    settings: GcSettings,
    interval: Duration,
    stats: Arc<DriverStats>,
    stop: CancellationToken,
) {
    let all: Api<Proxy> = Api::all(client);
    while sleep_or_stop(interval, &stop).await {
        // rbac: PROXIES list
        let live = match tokio::time::timeout(
            LIVE_SET_DEADLINE,
            all.list_metadata(&ListParams::default()),
        )
        .await
        {
            Ok(Ok(list)) => {
                let mut live = HashSet::new();
                let mut complete = true;
                for p in &list.items {
                    match p.metadata.uid.as_deref().and_then(ProxyUid::parse_strict) {
                        Some(u) => {
                            live.insert(u);
                        }
                        None => complete = false,
                    }
                }
                if !complete {
                    tracing::warn!("GC skipped: a Proxy has no canonical uid");
                    continue;
                }
                live
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "GC skipped: cannot list Proxies");
                continue;
            }
            Err(_) => {
                tracing::warn!("GC skipped: listing Proxies timed out");
                continue;
            }
        };
        let p = providers.borrow().clone();
        let report = tokio::select! {
            () = stop.cancelled() => return,
            r = gc::collect(&p, &live, &settings, SystemTime::now()) => r,
        };
        stats.gc_passes.fetch_add(1, Ordering::Relaxed);
        tracing::info!(%report, "GC pass");
    }
}

/// Leader-only: checks every entry's hosts, feeds placement, and writes one
/// [`ProviderHealth`] per entry with server-side apply.
async fn health_loop(
    client: Client,
    core: Arc<Core>,
    providers: watch::Receiver<Arc<Providers>>,
    interval: Duration,
    stats: Arc<DriverStats>,
    observer: Arc<Observer>,
    stop: CancellationToken,
) {
    let api: Api<ProviderHealth> = Api::all(client);
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    loop {
        let p = providers.borrow().clone();
        for h in p.iter() {
            let reports = tokio::select! {
                () = stop.cancelled() => return,
                r = tokio::time::timeout(CHECK_DEADLINE, h.provider.check()) => r,
            };
            let Ok(reports) = reports else {
                tracing::warn!(entry = %h.config.name, "host check timed out");
                continue;
            };
            core.record_host_reports(&h.config.name, &reports);
            observer.record_hosts(&h.config.name, &reports, SystemTime::now());
            let now = rfc3339(SystemTime::now());
            let hosts: Vec<HostHealth> = reports
                .iter()
                .map(|r| HostHealth::from_report(r, &now))
                .collect();
            let ready = hosts
                .iter()
                .filter(|x| x.state == HostHealthState::Ready)
                .count();
            let all_ready = ready == hosts.len() && !hosts.is_empty();
            let status = ProviderHealthStatus {
                host_count: u32::try_from(hosts.len()).unwrap_or(u32::MAX),
                ready_hosts: u32::try_from(ready).unwrap_or(u32::MAX),
                checked_at: Some(now.clone()),
                conditions: vec![Condition::new(
                    crate::api::CONDITION_READY,
                    if all_ready {
                        ConditionStatus::True
                    } else {
                        ConditionStatus::False
                    },
                    if all_ready {
                        "AllHostsReady"
                    } else {
                        "HostsNotReady"
                    },
                    &format!("{ready} of {} hosts ready", hosts.len()),
                    &now,
                    1,
                )],
                hosts,
                observed_generation: 1,
            };
            let name = h.config.name.clone();
            let spec = json!({"apiVersion": api_version(), "kind": "ProviderHealth",
                              "metadata": {"name": name}, "spec": {"provider": name}});
            let st = json!({"apiVersion": api_version(), "kind": "ProviderHealth",
                            "status": status});
            let write = async {
                // rbac: PROVIDER_HEALTHS patch (create when new)
                api.patch(&name, &pp, &Patch::Apply(&spec)).await?;
                // rbac: PROVIDER_HEALTHS_STATUS patch
                api.patch_status(&name, &pp, &Patch::Apply(&st)).await
            };
            match tokio::time::timeout(API_SLACK, write).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(entry = %name, error = %e, "ProviderHealth write failed")
                }
                Err(_) => tracing::warn!(entry = %name, "ProviderHealth write timed out"),
            }
        }
        let names: Vec<String> = p.iter().map(|h| h.config.name.clone()).collect();
        observer.retain_entries(&names);
        match tokio::time::timeout(API_SLACK, delete_stale_provider_healths(&api, &names)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot remove stale ProviderHealths"),
            Err(_) => tracing::warn!("removing stale ProviderHealths timed out"),
        }
        stats.health_rounds.fetch_add(1, Ordering::Relaxed);
        if !sleep_or_stop(interval, &stop).await {
            return;
        }
    }
}

fn uid_of(p: &Proxy) -> Option<ProxyUid> {
    p.meta().uid.as_deref().and_then(ProxyUid::parse_strict)
}

fn key_of(p: &Proxy) -> String {
    format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any())
}

/// Waits until the watch cache holds a complete first listing; `false` when stopped first.
async fn wait_synced(synced: &mut watch::Receiver<bool>, stop: &CancellationToken) -> bool {
    tokio::select! {
        () = stop.cancelled() => false,
        r = synced.wait_for(|v| *v) => r.is_ok(),
    }
}

/// Leader-only: runs the proxy health engine over every Running Proxy with an address in the
/// watch cache (not being deleted), then wakes the publishing pass, which merges the new
/// states into status. Proxies gone from the cache are dropped from the engine; a Proxy that
/// is only not probed this round (no address for a moment) keeps its state (finding H3).
async fn proxy_health_loop(
    ctx: Arc<Ctx>,
    engine: Arc<health::HealthEngine>,
    store: Store<Proxy>,
    mut synced: watch::Receiver<bool>,
    wake: Arc<Notify>,
    stop: CancellationToken,
) {
    if !wait_synced(&mut synced, &stop).await {
        return;
    }
    let targets_store = store.clone();
    let targets_ctx = ctx.clone();
    let targets = move || -> Vec<ProbeTarget> {
        let creds = lock(&targets_ctx.creds).clone();
        targets_store
            .state()
            .iter()
            .filter(|p| p.meta().deletion_timestamp.is_none())
            .filter_map(|p| {
                let uid = uid_of(p)?;
                let status = p.status.as_ref()?;
                let c = creds.get(&uid).cloned().flatten();
                ProbeTarget::of(uid, key_of(p), &p.spec.proxy, c.as_ref(), status)
            })
            .collect()
    };
    let retain_engine = engine.clone();
    let after_round = move |r: &health::RoundReport| {
        let live: HashSet<ProxyUid> = store.state().iter().filter_map(|p| uid_of(p)).collect();
        retain_engine.retain(|u| live.contains(u));
        tracing::debug!(probed = r.probed, ok = r.succeeded, elapsed = ?r.elapsed, "health round");
        wake.notify_one();
    };
    engine.run(targets, after_round, stop).await;
}

/// Leader-only: a publishing pass after every health round and every `interval`.
#[allow(clippy::too_many_arguments)]
async fn publish_loop(
    ctx: Arc<Ctx>,
    store: Store<Proxy>,
    mut synced: watch::Receiver<bool>,
    mut publisher: publish::Publisher,
    wake: Arc<Notify>,
    interval: Duration,
    stats: Arc<DriverStats>,
    stop: CancellationToken,
) {
    if !wait_synced(&mut synced, &stop).await {
        return;
    }
    loop {
        if publish_pass(&ctx, &store, &mut publisher, &stop).await {
            stats.publish_passes.fetch_add(1, Ordering::Relaxed);
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = wake.notified() => {}
            () = tokio::time::sleep(interval) => {}
        }
    }
}

/// One pass: merge each Proxy's health into its status (written with server-side apply,
/// guarded by the cached resourceVersion so a stale cache never overwrites a newer status),
/// announce health changes as Events, refresh the observer's rows, then publish the groups.
/// `true` when every write succeeded.
async fn publish_pass(
    ctx: &Ctx,
    store: &Store<Proxy>,
    publisher: &mut publish::Publisher,
    stop: &CancellationToken,
) -> bool {
    let now = SystemTime::now();
    let mut proxies: Vec<Proxy> = store.state().iter().map(|p| (**p).clone()).collect();
    let mut ok = true;
    for p in &mut proxies {
        if stop.is_cancelled() {
            return false;
        }
        let (Some(uid), Some(engine)) = (uid_of(p), ctx.observer.health()) else {
            continue;
        };
        if p.meta().deletion_timestamp.is_some() {
            continue;
        }
        let Some(current) = p.status.clone() else {
            // Not reconciled yet: the first reconcile writes a status.
            continue;
        };
        let h = engine.get(&uid);
        let mut next = current.clone();
        health::apply_to_status(
            &mut next,
            h.as_ref(),
            Some(&current),
            now,
            p.meta().generation.unwrap_or(0),
        );
        if next != current {
            let ns = p.namespace().unwrap_or_default();
            let api: Api<Proxy> = Api::namespaced(ctx.client.clone(), &ns);
            let body = json!({"apiVersion": api_version(), "kind": "Proxy",
                              "metadata": {"resourceVersion": p.resource_version()},
                              "status": next});
            let pp = PatchParams::apply(FIELD_MANAGER).force();
            let name = p.name_any();
            let patch = Patch::Apply(&body);
            // rbac: PROXIES_STATUS patch
            let w = api.patch_status(&name, &pp, &patch);
            match tokio::time::timeout(API_SLACK, w).await {
                Ok(Ok(_)) => p.status = Some(next),
                Ok(Err(kube::Error::Api(e))) if e.code == 409 => {
                    // The cache is behind a newer write; the next pass sees it.
                    ok = false;
                }
                Ok(Err(e)) => {
                    tracing::warn!(proxy = %key_of(p), error = %e, "health status write failed");
                    ok = false;
                }
                Err(_) => {
                    tracing::warn!(proxy = %key_of(p), "health status write timed out");
                    ok = false;
                }
            }
        }
        if let Some(h) = h {
            announce(ctx, p, &uid, &h).await;
        }
    }
    ctx.observer
        .set_proxies(proxies.iter().map(row_of).collect());
    let want = publish::desired(proxies.iter());
    let r = tokio::select! {
        () = stop.cancelled() => return false,
        r = publisher.sync(&want) => r,
    };
    match r {
        Ok(n) => {
            if n > 0 {
                tracing::debug!(writes = n, groups = want.len(), "published groups");
            }
            ok
        }
        Err(e) => {
            tracing::warn!(error = %e, "publishing groups failed; retried next pass");
            false
        }
    }
}

/// Publishes an Event when a Proxy's decided health changed since the last announcement:
/// Normal `Healthy`, or Warning with the failure's reason (`ProbeFailed`, `EgressMismatch`).
/// Undecided states are not announced.
async fn announce(ctx: &Ctx, p: &Proxy, uid: &ProxyUid, h: &health::ProxyHealth) {
    if h.state == HealthState::Unknown {
        return;
    }
    let changed = {
        let mut a = lock(&ctx.announced);
        a.insert(*uid, h.state) != Some(h.state)
    };
    if !changed {
        return;
    }
    let (type_, reason) = match h.state {
        HealthState::Healthy => (EventType::Normal, "Healthy".to_owned()),
        _ => (EventType::Warning, h.reason.clone()),
    };
    let ev = KubeEvent {
        type_,
        reason: reason.clone(),
        note: Some(h.message.clone()),
        action: "HealthCheck".into(),
        secondary: None,
    };
    // rbac: EVENTS create
    if let Err(e) = ctx.recorder.publish(&ev, &p.object_ref(&())).await {
        tracing::warn!(proxy = %key_of(p), error = %e, "cannot publish a health event");
    }
}

fn row_of(p: &Proxy) -> ProxyStatusRow {
    let st = p.status.clone().unwrap_or_default();
    ProxyStatusRow {
        namespace: p.namespace().unwrap_or_default(),
        name: p.name_any(),
        uid: p.meta().uid.clone().unwrap_or_default(),
        phase: st.phase,
        host: st.host.clone(),
        ip: st.ip.clone(),
        provider_id: st.provider_id.clone(),
        created_at: p
            .meta()
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.to_string())
            .unwrap_or_default(),
        last_error: st
            .conditions
            .iter()
            .find(|c| c.status == ConditionStatus::False && !c.message.is_empty())
            .map(|c| c.message.clone()),
        conditions: st.conditions.clone(),
        port: Some(p.spec.proxy.port),
        health: st.health.clone(),
    }
}

/// Leader-only: every `interval`, re-reads each credentials Secret a Proxy names (one `get`
/// per distinct Secret) and, when a Proxy's credentials differ from what its last reconcile
/// read (a Secret created late, rotated or removed), re-reconciles every Proxy.
// NB: per-object triggers (`Controller::reconcile_on`) are behind an unstable kube-runtime
// feature; a re-reconcile of everything is bounded by the controller's concurrency and
// credentials change rarely.
async fn credentials_loop(
    ctx: Arc<Ctx>,
    store: Store<Proxy>,
    trigger: mpsc::Sender<()>,
    interval: Duration,
    stop: CancellationToken,
) {
    while sleep_or_stop(interval, &stop).await {
        let mut by_secret: HashMap<(String, String), Vec<Arc<Proxy>>> = HashMap::new();
        for p in store.state() {
            if p.meta().deletion_timestamp.is_some() {
                continue;
            }
            if let Some(s) = p.spec.proxy.credentials_ref.clone() {
                by_secret
                    .entry((p.namespace().unwrap_or_default(), s))
                    .or_default()
                    .push(p);
            }
        }
        for ((ns, secret), ps) in by_secret {
            let read = tokio::select! {
                () = stop.cancelled() => return,
                r = tokio::time::timeout(API_SLACK, credentials(&ctx.client, &ns, Some(&secret))) => r,
            };
            let now = match read {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => {
                    tracing::warn!(namespace = %ns, secret = %secret, error = %e, "cannot read a credentials Secret");
                    continue;
                }
                Err(_) => continue,
            };
            for p in ps {
                let Some(uid) = uid_of(&p) else { continue };
                let seen = lock(&ctx.creds).get(&uid).cloned();
                // Never reconciled yet: its first reconcile reads the Secret anyway.
                if seen.is_some_and(|s| s != now) {
                    tracing::info!(proxy = %key_of(&p), "credentials Secret changed: reconciling");
                    // NB: a full channel means a re-reconcile of everything is already pending.
                    let _ = trigger.try_send(());
                }
            }
        }
    }
}

/// Deletes the ProviderHealths of entries no longer in the config (written by us: they carry
/// our field manager's `spec.provider` equal to their name).
async fn delete_stale_provider_healths(
    api: &Api<ProviderHealth>,
    entries: &[String],
) -> Result<(), kube::Error> {
    // rbac: PROVIDER_HEALTHS list
    let list = api.list(&ListParams::default()).await?;
    for ph in list.items {
        let name = ph.name_any();
        if !entries.contains(&name) && ph.spec.provider == name {
            tracing::info!(entry = %name, "provider entry removed: deleting its ProviderHealth");
            // rbac: PROVIDER_HEALTHS delete
            match api.delete(&name, &kube::api::DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

fn api_version() -> String {
    format!("{}/{}", crate::api::GROUP, crate::api::VERSION)
}

fn rfc3339(t: SystemTime) -> String {
    time::OffsetDateTime::from(t)
        .replace_nanosecond(0)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

/// The credentials a Proxy's `credentialsRef` names: keys `username` and `password` of the
/// Secret in the Proxy's namespace. A missing Secret or key is `None` (the core reports it).
async fn credentials(
    client: &Client,
    ns: &str,
    name: Option<&str>,
) -> Result<Option<ProxyCredentials>, ReconcileError> {
    let Some(name) = name else {
        return Ok(None);
    };
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    // rbac: SECRETS get
    let Some(secret) = api.get_opt(name).await.map_err(ReconcileError::Kube)? else {
        return Ok(None);
    };
    let data = secret.data.unwrap_or_default();
    let field = |k: &str| {
        data.get(k)
            .and_then(|v| String::from_utf8(v.0.clone()).ok())
            .filter(|s| !s.is_empty())
    };
    Ok(match (field("username"), field("password")) {
        (Some(username), Some(password)) => Some(ProxyCredentials { username, password }),
        _ => None,
    })
}

/// Replaces `metadata.finalizers` with `list`, guarded by the resourceVersion read (a
/// concurrent change makes the patch fail and the reconcile retry).
async fn set_finalizers(
    api: &Api<Proxy>,
    p: &Proxy,
    list: Vec<String>,
) -> Result<(), ReconcileError> {
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": p.resource_version()},
        {"op": "add", "path": "/metadata/finalizers", "value": list},
    ]))
    .map_err(|e| ReconcileError::Kube(kube::Error::SerdeError(e)))?;
    // rbac: PROXIES patch, PROXIES_FINALIZERS update
    api.patch(
        &p.name_any(),
        &PatchParams::default(),
        &Patch::Json::<()>(patch),
    )
    .await
    .map_err(ReconcileError::Kube)?;
    Ok(())
}

/// One reconcile of a Proxy, bounded by the core's deadline plus [`API_SLACK`].
async fn reconcile(p: Arc<Proxy>, ctx: Arc<Ctx>) -> Result<Action, ReconcileError> {
    let deadline = ctx.deadline;
    let key = format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any());
    match tokio::time::timeout(deadline, reconcile_inner(&p, &ctx)).await {
        Ok(Ok(a)) => {
            lock(&ctx.failures).remove(&key);
            Ok(a)
        }
        Ok(Err(e)) => Err(e),
        Err(_) => {
            ctx.stats.reconcile_timeouts.fetch_add(1, Ordering::Relaxed);
            Err(ReconcileError::Timeout(deadline))
        }
    }
}

async fn reconcile_inner(p: &Proxy, ctx: &Ctx) -> Result<Action, ReconcileError> {
    let ns = p.namespace().unwrap_or_default();
    let name = p.name_any();
    let api: Api<Proxy> = Api::namespaced(ctx.client.clone(), &ns);
    let deleting = p.meta().deletion_timestamp.is_some();
    let has_finalizer = p.finalizers().iter().any(|f| f == FINALIZER);
    if deleting && !has_finalizer {
        return Ok(Action::await_change());
    }
    if !deleting && !has_finalizer {
        let mut list = p.finalizers().to_vec();
        list.push(FINALIZER.to_owned());
        set_finalizers(&api, p, list).await?;
        // The write is a change: the next reconcile sees the finalizer.
        return Ok(Action::await_change());
    }
    let raw_uid = p.meta().uid.clone().unwrap_or_default();
    let uid = ProxyUid::parse_strict(&raw_uid).ok_or(ReconcileError::Uid(raw_uid))?;
    let credentials =
        credentials(&ctx.client, &ns, p.spec.proxy.credentials_ref.as_deref()).await?;
    lock(&ctx.creds).insert(uid, credentials.clone());
    let obj = ProxyObject {
        namespace: ns.clone(),
        name: name.clone(),
        uid,
        generation: p.meta().generation.unwrap_or(0),
        spec: p.spec.0.clone(),
        deleting,
        credentials,
    };
    let current = p.status.clone().unwrap_or_default();
    let mut out: Outcome = ctx.core.reconcile(&obj, &current, SystemTime::now()).await;
    if let Some(engine) = ctx.observer.health() {
        health::apply_to_status(
            &mut out.status,
            engine.get(&uid).as_ref(),
            Some(&current),
            SystemTime::now(),
            obj.generation,
        );
    }
    let error_class = out
        .events
        .iter()
        .find(|e| e.kind == EventKind::Warning)
        .map(|e| e.reason.clone());
    ctx.observer.metrics().reconciled(error_class.as_deref());
    if out.status != current && !(out.finalized && deleting) {
        write_status(&api, &name, &out.status).await?;
    }
    let reference = p.object_ref(&());
    for e in &out.events {
        let ev = KubeEvent {
            type_: match e.kind {
                EventKind::Normal => EventType::Normal,
                EventKind::Warning => EventType::Warning,
            },
            reason: e.reason.clone(),
            note: Some(e.message.clone()),
            action: e.reason.clone(),
            secondary: None,
        };
        // rbac: EVENTS create (patch for a repeated event)
        if let Err(err) = ctx.recorder.publish(&ev, &reference).await {
            tracing::warn!(proxy = %name, error = %err, "cannot publish an event");
        }
    }
    if out.finalized && deleting {
        let list: Vec<String> = p
            .finalizers()
            .iter()
            .filter(|f| *f != FINALIZER)
            .cloned()
            .collect();
        set_finalizers(&api, p, list).await?;
        ctx.core.forget(&uid);
        if let Some(engine) = ctx.observer.health() {
            engine.forget(&uid, &format!("{ns}/{name}"));
        }
        lock(&ctx.creds).remove(&uid);
        lock(&ctx.announced).remove(&uid);
        return Ok(Action::await_change());
    }
    Ok(match out.requeue_after {
        Some(d) => Action::requeue(d),
        None => Action::await_change(),
    })
}

async fn write_status(
    api: &Api<Proxy>,
    name: &str,
    status: &ProxyStatus,
) -> Result<(), ReconcileError> {
    let body = json!({"apiVersion": api_version(), "kind": "Proxy", "status": status});
    // rbac: PROXIES_STATUS patch
    api.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map_err(ReconcileError::Kube)?;
    Ok(())
}

/// Kubernetes API failures and deadlines back off per object; provider failures never get
/// here (the core turns them into a status and a requeue).
fn error_policy(p: Arc<Proxy>, e: &ReconcileError, ctx: Arc<Ctx>) -> Action {
    let key = format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any());
    let n = {
        let mut f = lock(&ctx.failures);
        let n = f.entry(key.clone()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    };
    tracing::warn!(proxy = %key, category = e.category(), error = %e, failures = n, "reconcile failed");
    match e {
        ReconcileError::Uid(_) => Action::await_change(),
        _ => Action::requeue(backoff(API_BACKOFF_BASE, API_BACKOFF_MAX, n)),
    }
}
