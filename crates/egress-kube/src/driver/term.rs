//! One leadership term: a fresh core controller, adoption of what the hosts' marks say, the
//! kube-runtime controller over the watch cache, and every leader-only loop, all stopped
//! together when the Lease is lost or the driver shuts down.
//!
//! Guarantees: nothing of a term outlives it (every loop is aborted and joined before
//! [`run_term`] returns); in-flight creates and deletes get `shutdown_grace` first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use egress_core::background::{self, Tasks};
use egress_core::controller::Controller as Core;
use egress_core::providers::Providers;
use futures_util::StreamExt;
use kube::Client;
use kube::api::Api;
use kube::runtime::controller::Config as ControllerConfig;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::{Notify, mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::cache;
use super::credentials::credentials_loop;
use super::gc::ClusterGc;
use super::host_checks::{ProviderHealthWriter, host_check_settings};
use super::pool;
use super::proxy_health;
use super::reconcile::{error_policy, reconcile};
use super::status::publish_loop;
use super::{
    ADOPT_DEADLINE, API_SLACK, Ctx, DriverStats, FIELD_MANAGER, KubeOptions, STORE_SYNC_POLL,
    publish,
};
use crate::api::{Proxy, ProxyPool};
use crate::observe::Observer;

/// What outlives a term: the reputation service and the process's retired addresses.
pub(super) struct Shared {
    /// The DNS blocklist checks.
    pub(super) reputation: Arc<egress_core::reputation::ReputationService>,
    /// The pools' retired addresses (the pool controller restores and primes them).
    pub(super) retired: Arc<egress_provider::libvirt::retired::RetiredAddresses>,
}

/// One leadership term: adopt, then run the controller and the leader-only loops until the
/// Lease is lost or `shutdown` is cancelled.
// NB: each argument is a different part of the process the term borrows for its life.
#[allow(clippy::too_many_arguments)]
pub(super) async fn run_term(
    opts: &KubeOptions,
    client: &Client,
    providers_rx: &watch::Receiver<Arc<Providers>>,
    mut leader: watch::Receiver<bool>,
    stats: &Arc<DriverStats>,
    observer: &Arc<Observer>,
    shared: &Shared,
    shutdown: &CancellationToken,
) {
    let stop = CancellationToken::new();
    let providers = providers_rx.borrow().clone();
    // The health probes CONNECT through the proxies: their targets' ports are allowed.
    let mut controller_settings = opts.controller.clone();
    if let Some(engine) = observer.health() {
        let h = engine.settings();
        controller_settings.allow_connect_port(h.target.port);
        if let Some(t6) = &h.target_ipv6 {
            controller_settings.allow_connect_port(t6.port);
        }
    }
    let core = Arc::new(Core::new(providers.clone(), controller_settings));
    observer.set_core(Some(core.clone()));
    let mut loops = Tasks::new(stop.clone());
    {
        let (stop, shutdown) = (stop.clone(), shutdown.clone());
        loops.spawn("leadership", async move {
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
        loops.spawn(
            "adoption",
            async move { adopt(&core, &providers, &stop).await },
        );
    }
    let (trigger_tx, trigger_rx) = mpsc::channel::<()>(1);
    let creds_trigger = trigger_tx.clone();
    loops.spawn(
        "providers",
        follow_providers(core.clone(), providers_rx.clone(), trigger_tx, stop.clone()),
    );
    loops.spawn(
        "gc",
        background::gc::run(
            Arc::new(ClusterGc::new(
                client.clone(),
                providers_rx.clone(),
                stats.clone(),
                observer.metrics().clone(),
            )),
            opts.gc.clone(),
            opts.gc_interval,
            stop.clone(),
        ),
    );
    loops.spawn(
        "host checks",
        background::host_checks::run(
            Arc::new(ProviderHealthWriter::new(
                client.clone(),
                core.clone(),
                providers_rx.clone(),
                stats.clone(),
                observer.clone(),
            )),
            host_check_settings(opts.check_interval),
            stop.clone(),
        ),
    );
    let proxies: Api<Proxy> = match &opts.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        core: core.clone(),
        recorder: super::events::Recorder::new(
            client.clone(),
            FIELD_MANAGER.into(),
            opts.lease.identity.clone(),
        ),
        deadline: opts.controller.reconcile_deadline.saturating_add(API_SLACK),
        failures: Mutex::new(HashMap::new()),
        stats: stats.clone(),
        observer: observer.clone(),
        creds: Mutex::new(HashMap::new()),
        announced: Mutex::new(HashMap::new()),
        reputation: shared.reputation.clone(),
        reputation_announced: Mutex::new(HashMap::new()),
        namespace_labels: Mutex::new(HashMap::new()),
    });
    let triggers = futures_util::stream::unfold(trigger_rx, |mut rx| async move {
        rx.recv().await.map(|()| ((), rx))
    });
    let graceful = stop.clone().cancelled_owned();
    // The watch cache holds every Proxy without its managedFields (see `cache`); every event
    // also feeds the pool controller's member index and wakes the pools it touched.
    let index = Arc::new(pool::index::MemberIndex::default());
    let (pool_tx, pool_rx) = mpsc::unbounded_channel();
    let controller = {
        let index = index.clone();
        let pins = super::pins::PinFeed::new(core.clone());
        cache::proxy_controller(proxies, move |ev| {
            pins.observe(ev);
            for k in index.observe(ev) {
                // NB: the receiver is gone only when the pool controller stopped (end of term).
                let _ = pool_tx.send(k);
            }
        })
    };
    let store = controller.store();
    let pools: Api<ProxyPool> = match &opts.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    loops.spawn(
        "pools",
        pool::run(
            pools,
            Arc::new(pool::PoolCtx {
                client: client.clone(),
                core: core.clone(),
                recorder: super::events::Recorder::new(
                    client.clone(),
                    FIELD_MANAGER.into(),
                    opts.lease.identity.clone(),
                ),
                proxies: store.clone(),
                index,
                observer: observer.clone(),
                expectations: Mutex::new(pool::Expectations::default()),
                failures: Mutex::new(HashMap::new()),
                secret_poll: opts.secret_poll_interval,
                reputation: shared.reputation.clone(),
                retired: shared.retired.clone(),
            }),
            pool_rx,
            stop.clone(),
        ),
    );
    let wake = Arc::new(Notify::new());
    // NB: one waiter on the store's readiness, fanned out, and re-polled: kube-runtime's
    // `wait_until_ready` keeps a single waker (a oneshot receiver shared by every clone of
    // the store), and a wake-up can be lost (observed with the fake API server); a fresh
    // poll every STORE_SYNC_POLL reads the readiness that was already set.
    let (synced_tx, synced) = watch::channel(false);
    {
        let store = store.clone();
        loops.spawn("cache sync", async move {
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
    // Proxies a health round turned Unhealthy: reconciled at once (see `proxy_health`).
    let (unhealthy_tx, unhealthy_rx) = mpsc::unbounded_channel::<ObjectRef<Proxy>>();
    if let Some(engine) = observer.health().cloned() {
        loops.spawn(
            "proxy health",
            proxy_health::run(
                ctx.clone(),
                engine,
                store.clone(),
                synced.clone(),
                wake.clone(),
                unhealthy_tx,
                stop.clone(),
            ),
        );
    }
    let unhealthy = futures_util::stream::unfold(unhealthy_rx, |mut rx| async move {
        rx.recv().await.map(|r| (r, rx))
    });
    loops.spawn(
        "reputation",
        super::reputation::run(
            ctx.clone(),
            store.clone(),
            synced.clone(),
            wake.clone(),
            stop.clone(),
        ),
    );
    loops.spawn(
        "publish",
        publish_loop(
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
        ),
    );
    loops.spawn(
        "credentials",
        credentials_loop(
            ctx.clone(),
            store,
            creds_trigger,
            opts.secret_poll_interval,
            stop.clone(),
        ),
    );
    controller
        .with_config(ControllerConfig::default().concurrency(opts.concurrency.max(1)))
        .reconcile_all_on(triggers)
        .reconcile_on(unhealthy)
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
    loops.shutdown().await;
    observer.set_core(None);
}

/// Learns where instances are from every entry's complete listing (bounded per entry).
pub(super) async fn adopt(core: &Core, providers: &Providers, stop: &CancellationToken) {
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
pub(super) async fn follow_providers(
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
