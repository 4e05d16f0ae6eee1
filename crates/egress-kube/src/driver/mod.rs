//! The Kubernetes driver: a kube-runtime `Controller` on [`Proxy`] over the core reconciler
//! ([`egress_core::controller::Controller`]), plus the leader-only GC and provider-health
//! loops and the watch on the provider config and SSH material.
//!
//! Pipeline of one reconcile (`reconcile.rs`): read (the Proxy from the watch cache, its
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
//! - Reputation (when the provider config's `reputation:` names blocklist zones): on the
//!   leader, every Proxy's declared and observed egress addresses are checked
//!   ([`egress_core::reputation`]); the results are merged into status (`reputation`, the
//!   `Listed` condition) by reconciles and by the publishing pass after each round, which
//!   also announces each change as one Event (`Listed`, `Delisted`, `ReputationCheckFailed`).
//!   Pools act on listings (`reputation.onListed`); the addresses they retire are kept in
//!   one registry for the process, read back from every pool's status at the start of each
//!   term before any address is handed out.
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
//!
//! Where things are: this file holds the options, the start-up and the election loop;
//! `term.rs` one leadership term (the controller and every leader-only loop);
//! `reconcile.rs` one reconcile and the error policy; `credentials.rs` the credentials
//! Secrets; `status.rs` the publishing pass and [`publish`] the Services and EndpointSlices.
//! GC, host checks, proxy health and the config watch are the core's shared background tasks
//! ([`egress_core::background`]); `gc.rs`, `host_checks.rs` and `proxy_health.rs`
//! are this driver's side of them (the live set from the API server, ProviderHealth writes,
//! targets from the watch cache), and `reputation.rs` of the reputation worker.

mod cache;
pub(crate) mod credentials;
pub(crate) use cache::strip as strip_cached;
mod events;
mod gc;
mod host_checks;
mod pins;
pub mod pool;
mod proxy_health;
pub mod publish;
mod reconcile;
mod replaces;
mod reputation;
mod status;
mod term;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use egress_core::background::config_watch::{self, Compare, WatchedFiles};
use egress_core::config::installation::Installation;
use egress_core::controller::{Controller as Core, ControllerSettings, ProxyCredentials};
use egress_core::gc::GcSettings;
use egress_core::health::HealthState;
use egress_core::providers::{self, OpenError, Providers};
use egress_provider::ProxyUid;
use kube::{Client, Resource, ResourceExt};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::api::Proxy;
use crate::leader::{Elector, LeaseSettings};
use crate::observe::Observer;
pub(crate) use egress_provider::sync::lock;
use term::run_term;

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
pub const ADOPT_DEADLINE: Duration = egress_core::gc::LIST_BUDGET;

/// Longest one entry's host check may take.
// NB: `check` bounds each host by the entry's dial and call timeouts (70 s by default).
pub const CHECK_DEADLINE: Duration = Duration::from_secs(120);

/// Longest listing of every Proxy for GC's live set.
// NB: one paged list of metadata; 30 s is far above a healthy API server's answer.
pub const LIVE_SET_DEADLINE: Duration = Duration::from_secs(30);

/// Largest file read when fingerprinting the config file and the SSH directory (sized in
/// [`egress_core::background::config_watch`]).
pub const MAX_FINGERPRINT_FILE: u64 = config_watch::MAX_FINGERPRINT_FILE;

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

/// Rebuilds the providers after the config or SSH material changed (blocking; run on the
/// blocking pool by the config watch).
pub type Reload = config_watch::Reload;

/// How the Kubernetes driver runs.
#[derive(Debug, Clone)]
pub struct KubeOptions {
    /// Provider config file.
    pub config_path: PathBuf,
    /// Kubeconfig file to connect with; `None`: `$KUBECONFIG`, `~/.kube/config`, then the
    /// in-cluster service account (kube's inference).
    pub kubeconfig: Option<PathBuf>,
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
            kubeconfig: None,
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
    /// The kubeconfig file given could not be read or used.
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
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

/// The UID of the cluster's `kube-system` namespace (the cluster's identity for the
/// installation ID), or `None` with a warning when it cannot be read within the API deadline.
async fn cluster_uid(client: &Client) -> Option<String> {
    let api: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client.clone());
    // rbac: NAMESPACES get
    match tokio::time::timeout(API_SLACK, api.get_metadata_opt("kube-system")).await {
        Ok(Ok(Some(ns))) => ns.metadata.uid,
        Ok(Ok(None)) => {
            tracing::warn!(
                "no kube-system namespace: the installation ID is the legacy one, the same in every cluster installed alike; set installation.id when hosts are shared"
            );
            None
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot read the kube-system namespace: the installation ID is the legacy one, the same in every cluster installed alike; set installation.id when hosts are shared");
            None
        }
        Err(_) => {
            tracing::warn!(
                "reading the kube-system namespace timed out: the installation ID is the legacy one; set installation.id when hosts are shared"
            );
            None
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
    let (lease_ns, lease_name) = (opts.lease.namespace.clone(), opts.lease.name.clone());
    // The config is checked before anything is contacted.
    egress_core::config::load(&path).map_err(RunError::Config)?;
    let client = match &opts.kubeconfig {
        Some(path) => {
            let err = |source| RunError::Kubeconfig {
                path: path.clone(),
                source,
            };
            let kc = kube::config::Kubeconfig::read_from(path).map_err(err)?;
            let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .map_err(err)?;
            Client::try_from(cfg).map_err(RunError::Client)?
        }
        None => Client::try_default().await.map_err(RunError::Client)?,
    };
    // This installation's ID in every mark: from the config, else the cluster's and its
    // Lease's identity.
    let legacy = egress_core::config::installation::legacy_kubernetes(&lease_ns, &lease_name);
    let installation = Installation::Kubernetes {
        cluster_uid: cluster_uid(&client).await,
        lease_namespace: lease_ns,
        lease_name,
    };
    let build = move || -> Result<Providers, RunError> {
        let cfg = egress_core::config::load(&path).map_err(RunError::Config)?;
        for w in &cfg.warnings {
            tracing::warn!(%w, "provider config warning");
        }
        if cfg.installation.is_none()
            && let Ok(Some(id)) = installation.id(&cfg)
            && id != legacy
        {
            tracing::info!(installation = %id, legacy = %legacy, "installation ID derived from the cluster; VMs created by a release that derived the legacy ID are another installation's to this one: to keep them, set installation.id to the legacy ID");
        }
        providers::open(&cfg, &installation).map_err(|e| match e {
            OpenError::Installation(e) => RunError::Config(e),
            OpenError::Build(e) => RunError::Providers(e),
        })
    };
    let providers = build()?;
    observer.set_config_loaded(true);
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
    // One reputation service and one registry of retired addresses for the process, shared
    // by every term and every config load; nothing is allocated until a term's pool
    // controller read the pools' retirements back.
    let reputation = Arc::new(egress_core::reputation::ReputationService::new(
        providers.reputation().clone(),
        observer.metrics().reputation(),
    ));
    let retired = Arc::new(egress_provider::libvirt::retired::RetiredAddresses::unprimed());
    providers.with_retired_ref(&retired);
    let (providers_tx, providers_rx) = watch::channel(Arc::new(providers));
    let mut side = JoinSet::new();
    {
        let stats = stats.clone();
        let (reputation, retired) = (reputation.clone(), retired.clone());
        side.spawn(config_watch::run(
            WatchedFiles {
                config: opts.config_path.clone(),
                dirs: opts.ssh_dir.iter().cloned().collect(),
                compare: Compare::Content,
            },
            opts.watch_interval,
            reload,
            move |p| {
                tracing::info!("provider config or SSH material changed: providers rebuilt");
                stats.reloads.fetch_add(1, Ordering::Relaxed);
                p.with_retired_ref(&retired);
                reputation.set_settings(p.reputation().clone());
                providers_tx.send_replace(Arc::new(p));
            },
            observer.metrics().clone(),
            shutdown.clone(),
        ));
    }
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
            &term::Shared {
                reputation: reputation.clone(),
                retired: retired.clone(),
            },
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
pub(super) async fn follow_election(
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
pub(super) struct Ctx {
    client: Client,
    core: Arc<Core>,
    recorder: events::Recorder,
    deadline: Duration,
    failures: Mutex<HashMap<String, u32>>,
    stats: Arc<DriverStats>,
    observer: Arc<Observer>,
    /// The credentials each Proxy's last reconcile read (health probes use them; the
    /// credentials poller compares against them).
    creds: Mutex<HashMap<ProxyUid, Option<ProxyCredentials>>>,
    /// The decided health each Proxy was last announced with (one Event per change).
    announced: Mutex<HashMap<ProxyUid, HealthState>>,
    /// The DNS blocklist checks of the egress addresses (outlives terms).
    reputation: Arc<egress_core::reputation::ReputationService>,
    /// The reputation each Proxy's status showed when its last change was announced (one
    /// Event per change, whether a reconcile or the publishing pass wrote it first).
    reputation_announced:
        Mutex<HashMap<ProxyUid, Option<egress_core::reputation::ProxyReputation>>>,
    /// Namespaces' labels, read for the config's `namespaceSelector`s, each for
    /// [`NAMESPACE_LABELS_TTL`].
    namespace_labels: Mutex<HashMap<String, (std::time::Instant, NamespaceLabels)>>,
}

/// A namespace's labels (shared with every ProxyObject of that namespace).
pub(super) type NamespaceLabels = Arc<std::collections::BTreeMap<String, String>>;

/// How long a namespace's labels are reused before they are read again.
// NB: a namespace's labels change rarely; a minute bounds how long a change of entitlement by
// label goes unseen, at one GET per namespace per minute whatever the number of Proxies.
pub(super) const NAMESPACE_LABELS_TTL: Duration = Duration::from_secs(60);

pub(super) fn uid_of(p: &Proxy) -> Option<ProxyUid> {
    p.meta().uid.as_deref().and_then(ProxyUid::parse_strict)
}

pub(super) fn key_of(p: &Proxy) -> String {
    format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any())
}

pub(super) fn api_version() -> String {
    format!("{}/{}", crate::api::GROUP, crate::api::VERSION)
}
