//! The pool gateway's membership source in Kubernetes (the `egress-proxies gateway`
//! Deployment): a watch of ProxyPools and of their member Proxies, and the credentials
//! Secrets read by name, turned into one [`GatewaySource`] per pool declaring
//! `spec.gateway`, sent on a `watch` channel the gateway follows.
//!
//! Guarantees:
//! - **Read-only**: lists and watches ProxyPools and Proxies and gets Secrets by name
//!   ([`crate::rbac::GATEWAY_API_ACCESS`]); it never writes anything, takes no Lease, and
//!   any number of replicas run side by side (leaderless).
//! - A member is one of the pool's only when it is in the pool's namespace, carries the
//!   pool's label and is owned (controller reference) by the pool's UID, so a hand-made
//!   Proxy with the label never joins; it is published by the same rule as the operator's
//!   EndpointSlices ([`published_member`]).
//! - Per event, only the pool it touched is rebuilt (O(its members)); every [`REFRESH`] all
//!   gateway pools are rebuilt and their Secrets read again (one `get` per distinct Secret,
//!   each bounded by [`SECRET_DEADLINE`]), which is how a rotated password reaches the
//!   gateway. A Secret that cannot be read keeps its last value.
//! - A pool whose rebuilt source is unchanged keeps the same `Arc` (the gateway does nothing).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use egress_core::controller::ProxyCredentials;
use egress_core::pool::MemberMeta;
use egress_core::pool::gateway_source::{GatewaySource, published_member};
use egress_core::pool::member::{ANNOTATION_DRAIN, ANNOTATION_QUARANTINE, LABEL_POOL};
use futures_util::StreamExt;
use kube::api::Api;
use kube::runtime::reflector::reflector;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::api::{Proxy, ProxyPool};

/// Every pool gateway's source, by `namespace/name`.
pub type GatewaySources = BTreeMap<String, Arc<GatewaySource>>;

/// How often every gateway pool is rebuilt and its Secrets read again.
// NB: as the operator re-reads a pool's credentials Secret (15 s): a rotated password reaches
// the members and the gateway within the same bound.
pub const REFRESH: Duration = Duration::from_secs(15);
/// Bound on one Secret read.
pub const SECRET_DEADLINE: Duration = Duration::from_secs(10);
/// Pause folding a burst of watch events into one rebuild.
// NB: a rolling replacement changes a member several times a second; 100 ms is invisible to
// clients and keeps rebuilds to a few per second.
const DEBOUNCE: Duration = Duration::from_millis(100);

/// What the source needs to run.
#[derive(Debug, Clone)]
pub struct SourceOptions {
    /// Watch this namespace only (`None`: every namespace).
    pub namespace: Option<String>,
    /// Whether the operator runs proxy health checks: then a member is published only when
    /// healthy through itself (as the operator's EndpointSlices).
    pub health_checks: bool,
}

/// A Secret or a pool: namespace and name.
type Key = (String, String);

struct State {
    client: Client,
    opts: SourceOptions,
    pools: Store<ProxyPool>,
    proxies: Store<Proxy>,
    secrets: Mutex<HashMap<Key, Option<ProxyCredentials>>>,
    dirty: Mutex<BTreeSet<Key>>,
    wake: Notify,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl State {
    fn mark(&self, namespace: String, pool: String) {
        lock(&self.dirty).insert((namespace, pool));
        self.wake.notify_one();
    }

    /// The credentials in Secret `name` of `namespace`, from the cache unless `fresh`.
    async fn secret(&self, namespace: &str, name: &str, fresh: bool) -> Option<ProxyCredentials> {
        let key = (namespace.to_owned(), name.to_owned());
        if !fresh && let Some(c) = lock(&self.secrets).get(&key) {
            return c.clone();
        }
        // rbac: GATEWAY_SECRETS get
        let read = tokio::time::timeout(
            SECRET_DEADLINE,
            crate::driver::credentials::credentials(&self.client, namespace, Some(name)),
        )
        .await;
        match read {
            Ok(Ok(c)) => {
                lock(&self.secrets).insert(key, c.clone());
                c
            }
            Ok(Err(e)) => {
                tracing::warn!(namespace, secret = name, error = %e, "gateway: cannot read a credentials Secret; keeping its last value");
                lock(&self.secrets).get(&key).cloned().flatten()
            }
            Err(_) => {
                tracing::warn!(
                    namespace,
                    secret = name,
                    "gateway: a credentials Secret read timed out; keeping its last value"
                );
                lock(&self.secrets).get(&key).cloned().flatten()
            }
        }
    }

    /// Pool `namespace/name`'s source; `None` when it is gone or declares no (valid) gateway.
    async fn source(&self, namespace: &str, name: &str, fresh: bool) -> Option<GatewaySource> {
        let pool = self
            .pools
            .get(&ObjectRef::<ProxyPool>::new(name).within(namespace))?;
        if pool.meta().deletion_timestamp.is_some() {
            return None;
        }
        let g = pool.spec.gateway.as_ref()?;
        let own = pool.spec.credentials.generate
            || pool.spec.template.spec.proxy.credentials_ref.is_some();
        let policy = match g.validate(own) {
            Ok(p) => p,
            Err(errs) => {
                tracing::warn!(pool = %format!("{namespace}/{name}"), errors = ?errs, "gateway: invalid spec.gateway; not served");
                return None;
            }
        };
        let pool_uid = pool.uid()?;
        // The pool's own credentials: its generated Secret, or the template's reference.
        let own_ref = if pool.spec.credentials.generate {
            Some(crate::driver::pool::secret::secret_name(name))
        } else {
            pool.spec.template.spec.proxy.credentials_ref.clone()
        };
        let mut clients = Vec::new();
        if policy.client_credentials.is_empty() {
            if let Some(r) = &own_ref
                && let Some(c) = self.secret(namespace, r, fresh).await
            {
                clients.push(c);
            }
        } else {
            for r in &policy.client_credentials {
                if let Some(c) = self.secret(namespace, r, fresh).await {
                    clients.push(c);
                }
            }
        }
        let mut candidates: Vec<Arc<Proxy>> = self
            .proxies
            .state()
            .into_iter()
            .filter(|p| {
                p.namespace().as_deref() == Some(namespace)
                    && p.labels().get(LABEL_POOL).map(String::as_str) == Some(name)
                    && p.owner_references()
                        .iter()
                        .any(|o| o.uid == pool_uid && o.controller == Some(true))
            })
            .collect();
        candidates.sort_by_key(|p| p.name_any());
        let mut members = Vec::new();
        for p in candidates {
            let Some(uid) = p.uid() else { continue };
            let creds = match &p.spec.proxy.credentials_ref {
                Some(r) => self.secret(namespace, r, false).await,
                None => None,
            };
            let status = p.status.clone().unwrap_or_default();
            let meta = MemberMeta {
                name: p.name_any(),
                host: p.spec.host.clone(),
                template_hash: String::new(),
                created: std::time::SystemTime::UNIX_EPOCH,
                quarantine: p.annotations().get(ANNOTATION_QUARANTINE).cloned(),
                deleting: p.meta().deletion_timestamp.is_some(),
                drain: p.annotations().get(ANNOTATION_DRAIN).cloned(),
            };
            if let Some(m) = published_member(
                meta,
                &uid,
                &status,
                &p.spec,
                creds.as_ref(),
                self.opts.health_checks,
            ) {
                members.push(m);
            }
        }
        Some(GatewaySource {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            policy,
            template: pool.spec.template.spec.clone(),
            clients,
            members,
        })
    }
}

/// Runs the source until `stop`, keeping `tx` up to date; `ready` is cancelled once both
/// watches listed everything once (the gateway's `/readyz`).
pub async fn run(
    client: Client,
    opts: SourceOptions,
    tx: watch::Sender<Arc<GatewaySources>>,
    ready: CancellationToken,
    stop: CancellationToken,
) {
    let (pools_api, proxies_api): (Api<ProxyPool>, Api<Proxy>) = match &opts.namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    let (pools, pools_w) = kube::runtime::reflector::store();
    let (proxies, proxies_w) = kube::runtime::reflector::store();
    let state = Arc::new(State {
        client,
        opts,
        pools: pools.clone(),
        proxies: proxies.clone(),
        secrets: Mutex::new(HashMap::new()),
        dirty: Mutex::new(BTreeSet::new()),
        wake: Notify::new(),
    });
    // rbac: GATEWAY_PROXY_POOLS list, watch
    let pool_events = reflector(
        pools_w,
        watcher(pools_api, watcher::Config::default()).default_backoff(),
    )
    .touched_objects();
    // rbac: GATEWAY_PROXIES list, watch (members only: the pool label)
    let proxy_events = reflector(
        proxies_w,
        watcher(proxies_api, watcher::Config::default().labels(LABEL_POOL))
            .default_backoff()
            .modify(crate::driver::strip_cached),
    )
    .touched_objects();
    let s1 = Arc::clone(&state);
    let watch_pools = pool_events.for_each(move |r| {
        let s = Arc::clone(&s1);
        async move {
            match r {
                Ok(p) => s.mark(p.namespace().unwrap_or_default(), p.name_any()),
                Err(e) => tracing::warn!(error = %e, "gateway: ProxyPool watch"),
            }
        }
    });
    let s2 = Arc::clone(&state);
    let watch_proxies = proxy_events.for_each(move |r| {
        let s = Arc::clone(&s2);
        async move {
            match r {
                Ok(p) => {
                    if let Some(pool) = p.labels().get(LABEL_POOL) {
                        s.mark(p.namespace().unwrap_or_default(), pool.clone());
                    }
                }
                Err(e) => tracing::warn!(error = %e, "gateway: Proxy watch"),
            }
        }
    });
    let readiness = async {
        let _ = tokio::join!(pools.wait_until_ready(), proxies.wait_until_ready());
        tracing::info!("gateway: pools and members listed");
        ready.cancel();
    };
    let rebuild = rebuild_loop(Arc::clone(&state), tx, ready.clone());
    tokio::select! {
        () = stop.cancelled() => {}
        () = watch_pools => {}
        () = watch_proxies => {}
        () = async { readiness.await; std::future::pending::<()>().await } => {}
        () = rebuild => {}
    }
}

async fn rebuild_loop(
    state: Arc<State>,
    tx: watch::Sender<Arc<GatewaySources>>,
    ready: CancellationToken,
) {
    ready.cancelled().await;
    let mut next_full = tokio::time::Instant::now();
    loop {
        let full = tokio::time::Instant::now() >= next_full;
        let keys: Vec<Key> = if full {
            next_full = tokio::time::Instant::now() + REFRESH;
            lock(&state.dirty).clear();
            state
                .pools
                .state()
                .iter()
                .filter(|p| p.spec.gateway.is_some())
                .map(|p| (p.namespace().unwrap_or_default(), p.name_any()))
                .chain(
                    tx.borrow()
                        .values()
                        .map(|s| (s.namespace.clone(), s.name.clone())),
                )
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect()
        } else {
            std::mem::take(&mut *lock(&state.dirty))
                .into_iter()
                .collect()
        };
        if full {
            lock(&state.secrets).clear();
        }
        let prev = Arc::clone(&tx.borrow());
        let mut next = (*prev).clone();
        for (ns, name) in keys {
            let key = format!("{ns}/{name}");
            match state.source(&ns, &name, full).await {
                Some(src) => {
                    if prev.get(&key).is_none_or(|p| **p != src) {
                        next.insert(key, Arc::new(src));
                    }
                }
                None => {
                    next.remove(&key);
                }
            }
        }
        let changed = next.len() != prev.len()
            || next
                .iter()
                .any(|(k, v)| prev.get(k).is_none_or(|p| !Arc::ptr_eq(p, v)));
        if changed {
            tx.send_replace(Arc::new(next));
        }
        tokio::select! {
            () = state.wake.notified() => tokio::time::sleep(DEBOUNCE).await,
            () = tokio::time::sleep_until(next_full) => {}
        }
    }
}
