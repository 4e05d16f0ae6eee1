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
//! - Reputation: with blocklist zones in the config, the shared reputation worker
//!   ([`egress_core::background::reputation`]) checks every Proxy's egress addresses; each
//!   round and each reconcile merge the results into the Proxy's status (`reputation`, the
//!   `Listed` condition), changes are logged as events, and pools act under
//!   `reputation.onListed`. The addresses pools retire are kept in one registry for the
//!   process, restored from the member files before anything is allocated.
//! - Every network call is bounded: reconciles by the controller's deadline, listings by
//!   [`ADOPT_DEADLINE`], checks by [`CHECK_DEADLINE`], GC by its own budgets. No lock is held
//!   across an `.await`.
//!
//! Where things are (the same file names as the Kubernetes driver's for the same jobs):
//! this file is the wiring (options, start-up, shutdown); the state is split in two —
//! `store.rs` what the driver knows (every Proxy and pool, host rows, adoption) and
//! `context.rs` what it acts through (the controller, the providers, the queues, metrics);
//! `watch.rs` merges the manifest directory (`manifests/`) into the store; `adoption.rs`
//! lists each entry's instances before its Proxies are reconciled; `reconcile.rs` the
//! reconcile workers; `pool/` ProxyPools; `observe.rs` what it serves over HTTP. `gc.rs`,
//! `host_checks.rs`, `proxy_health.rs`, `reputation.rs` and `config_watch.rs` are its side
//! of the background tasks written once in the core ([`egress_core::background`]);
//! `queue.rs` and `timers.rs` the work queues and requeue timers; `gateway_feed.rs` the pool gateways'
//! membership, read from the store.

mod adoption;
mod config_watch;
mod context;
pub mod fenced_hosts;
pub mod gateway_feed;
mod gc;
mod host_checks;
pub mod manifests;
mod observe;
pub mod pool;
mod proxy_health;
pub mod quarantine;
mod queue;
mod reconcile;
mod reputation;
mod settings;
mod store;
mod timers;
mod watch;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use egress_core::background::{self, Tasks};
use egress_core::config::installation::Installation;
use egress_core::config::{self, ConfigErrors, ProviderConfig};
use egress_core::controller::{Controller, ControllerSettings};
use egress_core::gc::GcSettings;
use egress_core::health::{HealthEngine, HealthSettings};
use egress_core::metrics::Metrics;
use egress_core::providers::{self, OpenError, Providers};
use egress_provider::error::ProviderError;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use self::context::Context;
use self::gc::StandaloneGc;
use self::host_checks::HostChecks;
use self::manifests::ManifestStore;
use self::observe::Observe;
use self::proxy_health::ProxyHealth;
use self::store::Store;

pub use self::settings::*;

/// How standalone mode runs.
#[derive(Debug, Clone)]
pub struct StandaloneOptions {
    /// Provider config file; `None` uses [`DEFAULT_CONFIG`].
    pub config_path: Option<PathBuf>,
    /// Directory of Proxy manifests.
    pub proxies_dir: PathBuf,
    /// Status endpoint address ([`DEFAULT_LISTEN`]).
    pub listen: SocketAddr,
    /// DNS names the status endpoint answers to besides IP addresses and `localhost`
    /// ([`egress_web::HostCheck`]); empty by default.
    pub allowed_hosts: Vec<String>,
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
    /// The installation these options run as: the ID file beside the config file (or above
    /// the manifest directory on the embedded default config), as the `gc` command finds it.
    pub fn installation(&self) -> Installation {
        Installation::Standalone {
            config_path: self.config_path.clone(),
            proxies_dir: self.proxies_dir.clone(),
        }
    }

    /// Options with every default and the given manifest directory.
    pub fn new(proxies_dir: impl Into<PathBuf>) -> Self {
        Self {
            config_path: None,
            proxies_dir: proxies_dir.into(),
            listen: DEFAULT_LISTEN,
            allowed_hosts: Vec::new(),
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
    let cfg = load_config(opts.config_path.as_deref()).map_err(StandaloneError::Config)?;
    for w in &cfg.warnings {
        tracing::warn!(%w, "provider config warning");
    }
    // This installation's ID in every mark: from the config, else kept in a file.
    let providers = providers::open(&cfg, &opts.installation()).map_err(|e| match e {
        OpenError::Installation(e) => StandaloneError::Config(e),
        OpenError::Build(e) => StandaloneError::Providers(e),
    })?;
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
    let health = opts
        .health
        .clone()
        .map(|h| Arc::new(HealthEngine::with_metrics(h, metrics.health())));
    let store = Arc::new(Store::default());
    let ctx = Arc::new(Context::new(
        controller,
        providers,
        metrics,
        health,
        opts.proxies_dir.clone(),
    ));
    host_checks::seed_rows(&store, &ctx);
    // A finished create/delete, or a freed host slot, queues the Proxy at once (a weak
    // reference: the controller lives inside the context).
    let weak = Arc::downgrade(&ctx);
    ctx.controller.set_waker(Arc::new(move |uid| {
        if let Some(ctx) = weak.upgrade() {
            ctx.queue.add(uid);
        }
    }));

    // Loops stop on `stop`; the HTTP server outlives them until everything is down.
    let stop = shutdown.child_token();
    let http_stop = CancellationToken::new();
    let http_task = tokio::spawn(egress_web::serve_checked(
        listener,
        Arc::new(Observe::new(Arc::clone(&store), Arc::clone(&ctx))),
        egress_web::Routes::All,
        egress_web::HostCheck::new(&opts.allowed_hosts),
        http_stop.clone(),
    ));

    let manifests = ManifestStore::new(opts.proxies_dir.clone());
    let (manifests, desired) = watch::scan(manifests).await;
    watch::apply_desired(&store, &ctx, &desired);
    // Every pool found has put its recorded retirements in effect (`pool::reconcile::
    // apply_pools`): addresses may be handed out from now on.
    ctx.retired.prime();
    if desired.proxies.is_empty() && desired.pools.is_empty() && !opts.gc_allow_empty {
        tracing::warn!(
            proxies = %opts.proxies_dir.display(),
            "no Proxy manifest found: GC will not collect until one exists (pass \
             --gc-allow-empty if no Proxy should exist)"
        );
    }

    let waits = adoption::AdoptionWaits::default();
    let mut tasks = Tasks::new(stop.clone());
    {
        let (store, ctx, waits, stop) = (store.clone(), ctx.clone(), waits.clone(), stop.clone());
        tasks.spawn("adoption", async move {
            adoption::run(&store, &ctx, waits, stop).await;
        });
    }
    {
        let (store, ctx, stop) = (store.clone(), ctx.clone(), stop.clone());
        tasks.spawn("manifests", async move {
            watch::run(&store, &ctx, manifests, stop).await;
        });
    }
    tasks.spawn(
        "host checks",
        background::host_checks::run(
            Arc::new(HostChecks::new(Arc::clone(&store), Arc::clone(&ctx))),
            host_checks::host_check_settings(opts.check_interval),
            stop.clone(),
        ),
    );
    tasks.spawn(
        "gc",
        background::gc::run(
            Arc::new(StandaloneGc::new(
                Arc::clone(&store),
                Arc::clone(&ctx),
                opts.gc_allow_empty,
            )),
            opts.gc.clone(),
            opts.gc_interval,
            stop.clone(),
        ),
    );
    {
        let (store, ctx, stop) = (store.clone(), ctx.clone(), stop.clone());
        tasks.spawn("pools", async move {
            pool::reconcile::run(&store, &ctx, stop).await;
        });
    }
    if let Some(tx) = opts.gateway.clone() {
        let (store, ctx, stop) = (store.clone(), ctx.clone(), stop.clone());
        tasks.spawn("gateway feed", async move {
            gateway_feed::run(&store, &ctx, tx, stop).await;
        });
    }
    {
        let (ctx, stop) = (ctx.clone(), stop.clone());
        tasks.spawn("timers", async move {
            ctx.timers.fire_until(|uid| ctx.queue.add(uid), &stop).await;
        });
    }
    {
        let (store, ctx, stop) = (store.clone(), ctx.clone(), stop.clone());
        tasks.spawn("resync", async move {
            reconcile::resync_loop(&store, &ctx, stop).await;
        });
    }
    if let Some(engine) = ctx.health.clone() {
        tasks.spawn(
            "proxy health",
            background::proxy_health::run(
                Arc::new(ProxyHealth::new(Arc::clone(&store), Arc::clone(&ctx))),
                engine,
                stop.clone(),
            ),
        );
    }
    tasks.spawn(
        "reputation",
        background::reputation::run(
            Arc::new(reputation::Reputation::new(
                Arc::clone(&store),
                Arc::clone(&ctx),
            )),
            Arc::clone(&ctx.reputation),
            stop.clone(),
        ),
    );
    if let Some(p) = opts.config_path.clone() {
        let (store, ctx2) = (Arc::clone(&store), Arc::clone(&ctx));
        let path = p.clone();
        tasks.spawn(
            "config watch",
            background::config_watch::run(
                config_watch::watched_config(&p),
                POLL_INTERVAL,
                config_watch::reload_from(p, opts.installation()),
                move |providers| {
                    config_watch::providers_reloaded(&store, &ctx2, providers, &path);
                },
                ctx.metrics.clone(),
                stop.clone(),
            ),
        );
    }
    let mut reconcilers = JoinSet::new();
    for _ in 0..opts.workers.max(1) {
        let (store, ctx, waits, stop) = (store.clone(), ctx.clone(), waits.clone(), stop.clone());
        reconcilers.spawn(async move {
            reconcile::worker(&store, &ctx, waits, stop).await;
        });
    }

    stop.cancelled().await;
    tracing::info!("standalone: stopping; no new work is started");
    // Workers finish the reconcile they are in (each bounded by the reconcile deadline).
    tasks.abort();
    ctx.stopping.store(true, Ordering::SeqCst);
    ctx.timers.clear();
    let grace = opts.shutdown_grace;
    let drain = async {
        ctx.controller.shutdown(grace).await;
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
    ctx.timers.clear();
    tasks.join().await;
    http_stop.cancel();
    let _ = http_task.await;
    tracing::info!("standalone: stopped");
    Ok(())
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
