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
//! - The per-phase counts ([`Objects::phase_counts`]) are kept up to date on every insert,
//!   removal and status change, so a change costs O(1) whatever the fleet's size (no
//!   recount of every object per event).

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

use crate::lock;
use crate::manifests::{Desired, LoadedProxy};
use crate::queue::WorkQueue;

/// One Proxy as this process knows it.
#[derive(Debug, Clone)]
pub(crate) struct Obj {
    pub(crate) object: ProxyObject,
    pub(crate) status: ProxyStatus,
    pub(crate) first_seen: SystemTime,
    /// The pool (`namespace/name`) this object is a member of; `None` for a manifest's Proxy.
    pub(crate) pool: Option<String>,
}

/// Every known Proxy by UID, with the number of Proxies in each phase kept up to date on
/// every change. Reads go through `Deref` to the map; writes go through [`Objects::insert`],
/// [`Objects::remove`], [`Objects::get_mut`] and [`Objects::for_each_mut`], which keep the
/// counts (a status changed through [`ObjMut`] is counted when the guard drops).
#[derive(Debug, Default)]
pub(crate) struct Objects {
    // NB: boxed: a B-tree node has room for 11 values and is on average ~2/3 full, so inline
    // objects (over a kilobyte each, spec and status) left ~1/3 of that room empty per Proxy;
    // boxed, the empty room is 8 bytes a slot.
    map: BTreeMap<ProxyUid, Box<Obj>>,
    phases: HashMap<Phase, i64>,
}

/// Write access to one [`Obj`]; its phase change, if any, is counted when it drops.
pub(crate) struct ObjMut<'a> {
    obj: &'a mut Obj,
    phases: &'a mut HashMap<Phase, i64>,
    before: Phase,
}

impl std::ops::Deref for ObjMut<'_> {
    type Target = Obj;
    fn deref(&self) -> &Obj {
        self.obj
    }
}

impl std::ops::DerefMut for ObjMut<'_> {
    fn deref_mut(&mut self) -> &mut Obj {
        self.obj
    }
}

impl Drop for ObjMut<'_> {
    fn drop(&mut self) {
        move_phase(self.phases, self.before, self.obj.status.phase);
    }
}

fn move_phase(phases: &mut HashMap<Phase, i64>, from: Phase, to: Phase) {
    if from == to {
        return;
    }
    if let Some(n) = phases.get_mut(&from) {
        *n -= 1;
        if *n <= 0 {
            phases.remove(&from);
        }
    }
    *phases.entry(to).or_default() += 1;
}

impl std::ops::Deref for Objects {
    type Target = BTreeMap<ProxyUid, Box<Obj>>;
    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl Objects {
    /// Inserts (or replaces) `uid`'s object. O(log n).
    pub(crate) fn insert(&mut self, uid: ProxyUid, obj: Obj) {
        *self.phases.entry(obj.status.phase).or_default() += 1;
        if let Some(old) = self.map.insert(uid, Box::new(obj)) {
            self.uncount(old.status.phase);
        }
    }

    /// Removes `uid`'s object. O(log n).
    pub(crate) fn remove(&mut self, uid: &ProxyUid) -> Option<Obj> {
        let old = self.map.remove(uid)?;
        self.uncount(old.status.phase);
        Some(*old)
    }

    /// Write access to `uid`'s object; a phase change is counted when the guard drops.
    pub(crate) fn get_mut(&mut self, uid: &ProxyUid) -> Option<ObjMut<'_>> {
        let obj = self.map.get_mut(uid)?;
        let before = obj.status.phase;
        Some(ObjMut {
            obj,
            phases: &mut self.phases,
            before,
        })
    }

    /// Calls `f` on every object (O(n): for passes that visit everyone anyway, such as a
    /// health round), keeping the counts.
    pub(crate) fn for_each_mut(&mut self, mut f: impl FnMut(&ProxyUid, &mut Obj)) {
        for (uid, obj) in &mut self.map {
            let before = obj.status.phase;
            f(uid, obj);
            move_phase(&mut self.phases, before, obj.status.phase);
        }
    }

    /// How many objects are in each phase (phases with none are left out). O(phases).
    pub(crate) fn phase_counts(&self) -> Vec<(Phase, i64)> {
        self.phases.iter().map(|(p, n)| (*p, *n)).collect()
    }

    fn uncount(&mut self, phase: Phase) {
        if let Some(n) = self.phases.get_mut(&phase) {
            *n -= 1;
            if *n <= 0 {
                self.phases.remove(&phase);
            }
        }
    }
}

/// State shared by the loops, the workers and the HTTP endpoint.
pub(crate) struct Shared {
    pub(crate) controller: Arc<Controller>,
    pub(crate) providers: RwLock<Arc<Providers>>,
    pub(crate) objects: Mutex<Objects>,
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
    /// Requeue times ([`crate::timers`]).
    pub(crate) timers: crate::timers::Timers,
    /// The manifest directory (pools keep their files beside their manifests).
    pub(crate) manifest_dir: std::path::PathBuf,
    /// Every ProxyPool and its members ([`crate::pools`]).
    pub(crate) pools: Mutex<crate::pools::Pools>,
    /// Pools to decide again.
    pub(crate) pool_queue: crate::pools::PoolQueue,
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
        self.metrics
            .retain_hosts(|e, h| keep.contains(&(e.to_owned(), h.to_owned())));
    }

    /// Merges a manifest scan into the objects: new and changed proxies are (re)queued,
    /// vanished ones become `deleting` (only when the directory could be listed). A scan
    /// that found no change costs O(1) here; one that did walks the set once.
    pub(crate) fn apply_desired(&self, d: &Desired) {
        *lock(&self.manifest_errors) = d.errors.clone();
        self.metrics.set_manifests_rejected(d.errors.len());
        self.directory_ok.store(d.directory_ok, Ordering::SeqCst);
        if d.unchanged {
            // The set this process applied last: nothing new, nothing vanished (O(1)).
            return;
        }
        let now = SystemTime::now();
        let mut changed = Vec::new();
        {
            let mut objects = lock(&self.objects);
            for (uid, (p, generation)) in d.proxies.iter() {
                if let Some(mut o) = objects.get_mut(uid) {
                    if o.object.generation != *generation
                        || o.object.deleting
                        || o.object.spec != p.spec
                    {
                        o.object = object_of(p, *generation);
                        changed.push(*uid);
                    }
                    continue;
                }
                objects.insert(
                    *uid,
                    Obj {
                        object: object_of(p, *generation),
                        status: ProxyStatus::default(),
                        first_seen: now,
                        pool: None,
                    },
                );
                changed.push(*uid);
            }
            if d.directory_ok {
                // NB: only `object.deleting` changes here, never a status: a plain walk.
                objects.for_each_mut(|uid, o| {
                    if o.pool.is_none() && !d.proxies.contains_key(uid) && !o.object.deleting {
                        tracing::info!(proxy = %format!("{}/{}", o.object.namespace, o.object.name), "manifest removed: deleting");
                        o.object.deleting = true;
                        changed.push(*uid);
                    }
                });
            }
        }
        for uid in changed {
            self.queue.add(uid);
        }
        self.apply_pools(&d.pools, d.directory_ok);
        self.update_phase_metrics();
    }

    /// Sets the per-phase gauge from the counts kept by [`Objects`] (O(phases)).
    pub(crate) fn update_phase_metrics(&self) {
        let v = lock(&self.objects).phase_counts();
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
        self.timers.schedule(uid, after);
    }

    pub(crate) fn abort_timers(&self) {
        self.timers.clear();
    }

    /// Writes a reconcile's outcome (of a reconcile that took `elapsed`) back; forgets the
    /// Proxy when its deletion finalized.
    pub(crate) fn apply_outcome(
        self: &Arc<Self>,
        uid: ProxyUid,
        obj: &ProxyObject,
        out: Outcome,
        elapsed: Duration,
    ) {
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
        self.metrics.reconciled(error_class.as_deref(), elapsed);
        let mut forget = false;
        let mut pool_dirty = None;
        {
            let mut objects = lock(&self.objects);
            let mut remove = false;
            if let Some(mut o) = objects.get_mut(&uid) {
                let before = crate::pools::pool_view(&o.status);
                let previous = std::mem::replace(&mut o.status, out.status);
                if let Some(engine) = &self.health {
                    let generation = o.object.generation;
                    health::apply_to_status(
                        &mut o.status,
                        engine.get(&uid).as_ref(),
                        Some(&previous),
                        SystemTime::now(),
                        generation,
                    );
                }
                remove = out.finalized && o.object.deleting;
                if let Some(k) = &o.pool
                    && (remove
                        || before != crate::pools::pool_view(&o.status)
                        || previous.observed_generation == 0)
                {
                    pool_dirty = Some(k.clone());
                }
            }
            if remove {
                objects.remove(&uid);
                forget = true;
            }
        }
        if let Some(k) = pool_dirty {
            self.pool_queue.add(&k);
        }
        if forget {
            if let Some(engine) = &self.health {
                engine.forget(&uid, &key);
            }
            tracing::info!(proxy = %key, "deleted: nothing left on any host");
            self.timers.cancel(&uid);
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
        namespace_labels: None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use std::path::Path;

    use super::*;
    use crate::manifests::parse_file;

    const PHASES: [Phase; 6] = [
        Phase::Pending,
        Phase::Provisioning,
        Phase::Running,
        Phase::Paused,
        Phase::Failed,
        Phase::Terminating,
    ];

    fn recount(t: &Objects) -> HashMap<Phase, i64> {
        let mut m = HashMap::new();
        for o in t.values() {
            *m.entry(o.status.phase).or_default() += 1;
        }
        m
    }

    #[test]
    fn an_objects_spec_is_the_manifest_stores_copy_not_a_clone() {
        let text = "apiVersion: egress-proxies.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: p\n\
                    spec:\n  provider: local\n  image: tiny\n  proxy:\n    allowedClientCidrs: [10.0.0.0/8]\n";
        let (loaded, errs) = parse_file(Path::new("/m/p.yaml"), text, Path::new("/m"));
        assert!(errs.is_empty(), "{errs:?}");
        let o = object_of(&loaded[0], 1);
        assert!(
            std::sync::Arc::ptr_eq(&o.spec, &loaded[0].spec),
            "the object table must share the parsed spec, not hold a copy of it"
        );
    }

    #[test]
    fn phase_counts_kept_on_every_change_equal_a_full_recount_after_random_changes() {
        let text = "apiVersion: egress-proxies.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: p\n\
                    spec:\n  provider: local\n  image: tiny\n  proxy:\n    allowedClientCidrs: [10.0.0.0/8]\n";
        let (loaded, errs) = parse_file(Path::new("/m/p.yaml"), text, Path::new("/m"));
        assert!(errs.is_empty(), "{errs:?}");
        let base = Obj {
            object: object_of(&loaded[0], 1),
            status: ProxyStatus::default(),
            first_seen: SystemTime::UNIX_EPOCH,
            pool: None,
        };
        let mut t = Objects::default();
        // A fixed-seed LCG: the same 5000 steps every run.
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: u64| {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) % n
        };
        for step in 0..5000 {
            let uid = ProxyUid(uuid::Uuid::from_u128(u128::from(next(50))));
            let phase = PHASES[next(6) as usize];
            match next(5) {
                0 => {
                    let mut o = base.clone();
                    o.status.phase = phase;
                    t.insert(uid, o);
                }
                1 => {
                    t.remove(&uid);
                }
                2 => {
                    if let Some(mut o) = t.get_mut(&uid) {
                        o.status.phase = phase;
                    }
                }
                3 => {
                    // A change that is not a phase change.
                    if let Some(mut o) = t.get_mut(&uid) {
                        o.object.deleting = !o.object.deleting;
                    }
                }
                _ => t.for_each_mut(|u, o| {
                    if u.0.as_u128() % 3 == u128::from(next(3)) {
                        o.status.phase = phase;
                    }
                }),
            }
            let kept: HashMap<Phase, i64> = t.phase_counts().into_iter().collect();
            assert_eq!(kept, recount(&t), "step {step}");
        }
    }
}
