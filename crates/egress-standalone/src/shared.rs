//! The state the standalone driver's loops, reconcile workers and HTTP endpoint share: every
//! Proxy this process knows with its last status, the host rows, adoption progress, the work
//! queue and requeue timers.
//!
//! Guarantees:
//! - Every lock is a short critical section with no `.await` inside; a poisoned lock is
//!   recovered (every update leaves the data consistent).
//! - A Proxy is forgotten only when its reconcile reports `finalized` for a deletion; then
//!   its health state and its requeue timer go with it.
//! - After shutdown began ([`Shared::stopping`]) no requeue timer is started.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use egress_core::controller::{Controller, EventKind, Outcome, ProxyCredentials, ProxyObject};
use egress_core::exposition::Exposition;
use egress_core::health::{self, HealthEngine};
use egress_core::hosthealth::HostHealth;
use egress_core::metrics::Metrics;
use egress_core::model::{Phase, ProxyStatus};
use egress_core::providers::Providers;
use egress_core::status::HostRow;
use egress_provider::ProxyUid;
use tokio::task::AbortHandle;

use crate::lock;
use crate::manifests::{Desired, LoadedProxy};
use crate::queue::WorkQueue;

/// One Proxy as this process knows it.
#[derive(Debug, Clone)]
pub(crate) struct Obj {
    pub(crate) object: ProxyObject,
    pub(crate) status: ProxyStatus,
    pub(crate) first_seen: SystemTime,
}

/// State shared by the loops, the workers and the HTTP endpoint.
pub(crate) struct Shared {
    pub(crate) controller: Arc<Controller>,
    pub(crate) providers: RwLock<Arc<Providers>>,
    pub(crate) objects: Mutex<BTreeMap<ProxyUid, Obj>>,
    pub(crate) hosts: Mutex<BTreeMap<(String, String), HostRow>>,
    pub(crate) manifest_errors: Mutex<Vec<String>>,
    /// Entries adopted from a complete listing (by name and config digest).
    pub(crate) adopted: Mutex<HashSet<(String, String)>>,
    pub(crate) directory_ok: AtomicBool,
    pub(crate) ready: AtomicBool,
    /// Set at shutdown: no requeue timer is started any more.
    pub(crate) stopping: AtomicBool,
    pub(crate) metrics: Metrics,
    /// Renders `/metrics` (keeps the controller's image-byte total already exported).
    pub(crate) exposition: Exposition,
    /// The proxy health engine, when health checks are on.
    pub(crate) health: Option<Arc<HealthEngine>>,
    /// Full host rows (`/hosts`), from the host check loop.
    pub(crate) host_health: Mutex<BTreeMap<(String, String), HostHealth>>,
    pub(crate) queue: WorkQueue,
    pub(crate) timers: Mutex<HashMap<ProxyUid, AbortHandle>>,
}

impl Shared {
    pub(crate) fn providers(&self) -> Arc<Providers> {
        self.providers
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Adds an `Unknown` row for every configured host without one; drops rows of hosts no
    /// longer configured.
    pub(crate) fn seed_host_rows(&self) {
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
    pub(crate) fn apply_desired(&self, d: &Desired) {
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

    pub(crate) fn update_phase_metrics(&self) {
        let mut counts: HashMap<Phase, i64> = HashMap::new();
        for o in lock(&self.objects).values() {
            *counts.entry(o.status.phase).or_default() += 1;
        }
        let v: Vec<(Phase, i64)> = counts.into_iter().collect();
        self.metrics.set_phase_counts(&v);
    }

    /// Whether the entry `entry` (as currently configured) was adopted.
    pub(crate) fn is_adopted(&self, entry: &str) -> bool {
        let providers = self.providers();
        match providers.get(entry) {
            // An unknown entry: the controller reports it; nothing to adopt.
            None => true,
            Some(h) => lock(&self.adopted).contains(&(entry.to_owned(), h.config_digest.clone())),
        }
    }

    /// Re-queues `uid` after `after`, replacing any earlier timer of it.
    pub(crate) fn schedule(self: &Arc<Self>, uid: ProxyUid, after: Duration) {
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

    pub(crate) fn abort_timers(&self) {
        for (_, t) in lock(&self.timers).drain() {
            t.abort();
        }
    }

    /// Writes a reconcile's outcome back; forgets the Proxy when its deletion finalized.
    pub(crate) fn apply_outcome(self: &Arc<Self>, uid: ProxyUid, obj: &ProxyObject, out: Outcome) {
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
}

pub(crate) fn object_of(p: &LoadedProxy, generation: i64) -> ProxyObject {
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
