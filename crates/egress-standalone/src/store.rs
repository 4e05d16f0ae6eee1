//! What the standalone driver knows: every Proxy with its last status (manifest Proxies
//! and pool members), every ProxyPool, every host's last check, the last scan's manifest
//! errors and which entries were adopted. What acts on it (the controller, the providers, the
//! queues, the metrics) is the [`crate::context::Context`].
//!
//! Guarantees:
//! - Every lock is a short critical section with no `.await` inside; a poisoned lock is
//!   recovered (every update leaves the data consistent). `objects` and `pools` are never
//!   held together.
//! - A Proxy is forgotten only when its reconcile reports `finalized` for a deletion (see
//!   [`crate::reconcile`]).
//! - The per-phase counts ([`Objects::phase_counts`]) are kept up to date on every insert,
//!   removal and status change, so a change costs O(1) whatever the fleet's size (no
//!   recount of every object per event).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use egress_core::controller::{ProxyCredentials, ProxyObject};
use egress_core::host_health::HostHealth;
use egress_core::metrics::Metrics;
use egress_core::model::{Phase, ProxyStatus};
use egress_core::pool::ProxyPoolStatus;
use egress_core::providers::Providers;
use egress_provider::ProxyUid;
use egress_provider::sync::lock;
use serde::{Deserialize, Serialize};

use crate::manifests::{LoadedPool, LoadedProxy};

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

/// One member as the member file records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct MemberRec {
    pub(crate) name: String,
    pub(crate) host: String,
    pub(crate) template_hash: String,
    /// RFC 3339.
    pub(crate) created: String,
    #[serde(default)]
    pub(crate) deleting: bool,
    /// It was available once (its create-to-available time is recorded then).
    #[serde(default)]
    pub(crate) was_available: bool,
    /// Egress addresses it pins (its predecessor's, under `rotation.egressAddress: Keep`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) pin: Vec<std::net::IpAddr>,
    /// Its drain marker (`SINCE CAUSE`): the pool unpublished it to remove it, and deletes
    /// it once the drain grace has passed (kept here, so a restart keeps both).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) drain: Option<String>,
    /// The member it replaces: one lost with its host, whose egress addresses it takes on
    /// another host of the segment (`rotation.egressAddress: Keep`). Honoured while that
    /// member is still in this pool's member file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) replaces: Option<String>,
}

/// One pool as this process runs it.
#[derive(Debug)]
pub(crate) struct PoolRt {
    pub(crate) namespace: String,
    pub(crate) name: String,
    /// The manifest's pool and generation (the last one read, once the manifest is gone).
    pub(crate) loaded: (Arc<LoadedPool>, i64),
    /// Its manifest is gone: its members are deleted, then it is forgotten.
    pub(crate) removed: bool,
    pub(crate) members: BTreeMap<String, MemberRec>,
    pub(crate) status: ProxyPoolStatus,
    pub(crate) quarantine: BTreeMap<String, String>,
    pub(crate) error: Option<String>,
}

/// Every pool by `namespace/name`.
#[derive(Debug, Default)]
pub(crate) struct Pools {
    pub(crate) by_key: BTreeMap<String, PoolRt>,
}

/// Everything the standalone driver knows, each part behind its own lock.
#[derive(Debug, Default)]
pub(crate) struct Store {
    /// Every Proxy by UID (manifest Proxies and pool members).
    pub(crate) objects: Mutex<Objects>,
    /// Every ProxyPool and its members ([`crate::pool`]).
    pub(crate) pools: Mutex<Pools>,
    /// Every configured host's last check, by (entry, host): `/hosts`, and `/status`'s host
    /// rows.
    pub(crate) hosts: Mutex<BTreeMap<(String, String), HostHealth>>,
    /// The last scan's manifest errors.
    pub(crate) manifest_errors: Mutex<Vec<String>>,
    /// Entries adopted from a complete listing (by name and config digest).
    pub(crate) adopted: Mutex<HashSet<(String, String)>>,
    /// The manifest directory could be listed by the last scan.
    pub(crate) directory_ok: AtomicBool,
    /// Every entry was adopted once (`/readyz`).
    pub(crate) ready: AtomicBool,
}

impl Store {
    /// Whether provider entry `entry`, as configured in `providers`, was adopted from a
    /// complete listing (an unknown entry counts as adopted: the controller reports it).
    pub(crate) fn is_adopted(&self, providers: &Providers, entry: &str) -> bool {
        match providers.get(entry) {
            None => true,
            Some(h) => lock(&self.adopted).contains(&(entry.to_owned(), h.config_digest.clone())),
        }
    }

    /// Sets the per-phase gauge from the counts kept by [`Objects`] (O(phases)).
    pub(crate) fn publish_phase_counts(&self, metrics: &Metrics) {
        let v = lock(&self.objects).phase_counts();
        metrics.set_phase_counts(&v);
    }
}

/// The object of manifest Proxy `p` at `generation` (its spec shared with the manifest
/// store, not copied).
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
        replaces: None,
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
