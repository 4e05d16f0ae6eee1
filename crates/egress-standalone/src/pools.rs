//! ProxyPools in standalone mode: each `kind: ProxyPool` manifest keeps `replicas` member
//! Proxies, decided by the core's pure [`decide`] and reconciled by the ordinary Proxy
//! controller like any manifest's Proxy.
//!
//! - **Members** are ordinary objects in the shared store, tagged with their pool, named by
//!   the decision (`POOL-xxxxxx`) and given a UID derived from the pool and the member name
//!   ([`member_uid`]), so their instances are found by UID like any Proxy's.
//! - **The member list survives restarts**: it is kept in a hidden file beside the manifests
//!   (`.NAMESPACE.NAME.pool-members.json`, [`state_path`]), written (atomically: a temporary
//!   file renamed over it) *before* a member is created or marked for deletion, so a restart
//!   re-derives every member's UID from it and adopts the existing instances instead of
//!   creating new ones. A member leaves the file only once its deletion finalized.
//! - **Rounds**: the pool loop ([`run`]) decides a pool again when it is marked dirty (its
//!   manifest changed, one of its members' phase/readiness/health changed or finalized, a host
//!   check or health round ended) and on every tick ([`crate::POLL_INTERVAL`]: the wake-up time
//!   of an age, an unhealthy period or a backoff; the quarantine and credentials files). A
//!   round reads only the pool's own members (indexed by pool), never every Proxy.
//! - **Safety gates**: no round acts before the pool's provider entry was adopted from a
//!   complete listing, nor while one of its live members was never reconciled (a restarted
//!   process must not mistake a healthy member it has not looked at yet for an unavailable
//!   one).
//! - **Quarantine**: a line `MEMBER REASON` in `NAMESPACE.NAME.quarantine` beside the manifest holds the
//!   member out of the pool (not published, replaced, its VM kept); removing the line deletes it.
//! - **Generated credentials**: `NAMESPACE.NAME.credentials` beside the manifest
//!   ([`credentials_file`]), created once (0600), never overwritten; deleting or editing it
//!   rolls the members.
//! - **Removal**: a pool whose manifest is gone deletes every member, then forgets itself
//!   (its metrics, its member file); its credentials file is left for the user.
//!
//! Locks: `pools` and `objects` are never held together; nothing is held across an `.await`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use egress_core::background::sleep_or_stop;
use egress_core::controller::{EventKind, ProxyCredentials, ProxyObject};
use egress_core::metrics::PoolReplicas;
use egress_core::model::{Phase, ProxyStatus, condition};
use egress_core::pool::member::{member_spec, template_hash};
use egress_core::pool::{
    Member, MemberMeta, PoolInputs, ProxyPoolStatus, credentials, credentials_file, decide,
};
use egress_core::status::{PoolMemberRow, PoolStatusRow};
use egress_provider::ProxyUid;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::manifests::{LoadedPool, UID_NAMESPACE};
use crate::shared::{Obj, Shared};
use crate::{POLL_INTERVAL, lock};

/// The suffix of a pool's quarantine file beside its manifest: `NAMESPACE.NAME.quarantine`
/// (namespaced like the credentials file: two pools of one name never share it).
pub const QUARANTINE_SUFFIX: &str = ".quarantine";
/// Largest quarantine file read.
const MAX_QUARANTINE_BYTES: u64 = 1 << 20;
/// Shortest pause between two rounds of the pool loop.
// NB: a member's every status change marks its pool dirty; 100 ms folds a burst (a thousand
// members turning Running) into a few rounds, each O(members), and is invisible to a user.
const ROUND_GAP: Duration = Duration::from_millis(100);

/// The UID of member `member` of pool `namespace/pool`: UUIDv5 of `pool:NS/POOL/MEMBER` under
/// [`UID_NAMESPACE`] (never equal to a manifest Proxy's UID, which has no `pool:` prefix).
pub fn member_uid(namespace: &str, pool: &str, member: &str) -> ProxyUid {
    ProxyUid(Uuid::new_v5(
        &UID_NAMESPACE,
        format!("pool:{namespace}/{pool}/{member}").as_bytes(),
    ))
}

/// Where pool `namespace/name`'s quarantine file is read from in manifest directory `dir`.
pub fn quarantine_path(dir: &Path, namespace: &str, name: &str) -> PathBuf {
    dir.join(format!("{namespace}.{name}{QUARANTINE_SUFFIX}"))
}

/// Where pool `namespace/name`'s member list is kept in manifest directory `dir`.
pub fn state_path(dir: &Path, namespace: &str, name: &str) -> PathBuf {
    dir.join(format!(".{namespace}.{name}.pool-members.json"))
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
}

/// The member file.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StateFile {
    members: Vec<MemberRec>,
    #[serde(default)]
    status: ProxyPoolStatus,
}

/// A pool's row as `/status` needs it: namespace, name, replicas, status, members,
/// quarantine, error.
type PoolSnapshot = (
    String,
    String,
    u32,
    ProxyPoolStatus,
    Vec<MemberRec>,
    BTreeMap<String, String>,
    Option<String>,
);

/// One pool as this process runs it.
#[derive(Debug)]
pub(crate) struct PoolRt {
    pub(crate) namespace: String,
    pub(crate) name: String,
    /// The manifest's pool and generation; `None` once the manifest is gone.
    pub(crate) loaded: Option<(Arc<LoadedPool>, i64)>,
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

/// Pools to decide again soon (de-duplicated).
#[derive(Debug, Default)]
pub(crate) struct PoolQueue {
    dirty: std::sync::Mutex<BTreeSet<String>>,
    notify: Notify,
    /// Wakes the gateway feed ([`crate::gateway_feed`]) on the same changes.
    pub(crate) gateway_wake: Notify,
}

impl PoolQueue {
    /// Marks `key` to be decided again.
    pub(crate) fn add(&self, key: &str) {
        if lock(&self.dirty).insert(key.to_owned()) {
            self.notify.notify_one();
        }
        self.gateway_wake.notify_one();
    }

    fn take(&self) -> BTreeSet<String> {
        std::mem::take(&mut *lock(&self.dirty))
    }
}

fn now_text(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

fn parse_time(t: &str) -> SystemTime {
    humantime::parse_rfc3339_weak(t).unwrap_or(SystemTime::UNIX_EPOCH)
}

/// Writes `path` atomically (temporary file, fsync, rename).
fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// Reads a quarantine file: `MEMBER REASON` per line, `#` comments.
fn read_quarantine(path: &Path) -> BTreeMap<String, String> {
    let Ok(bytes) = crate::manifests::read_regular_bounded(path, MAX_QUARANTINE_BYTES, true) else {
        return BTreeMap::new();
    };
    String::from_utf8_lossy(&bytes)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| match l.split_once(char::is_whitespace) {
            Some((m, why)) => (m.to_owned(), why.trim().to_owned()),
            None => (l.to_owned(), "quarantined".to_owned()),
        })
        .collect()
}

/// The state of a member's status that its pool cares about (a change re-decides the pool).
pub(crate) fn pool_view(s: &ProxyStatus) -> (Phase, bool, Option<bool>) {
    (
        s.phase,
        s.condition(condition::READY)
            .is_some_and(|c| c.status == egress_core::model::ConditionStatus::True),
        s.health.as_ref().and_then(|h| h.healthy),
    )
}

impl Shared {
    /// The manifest directory (pool files live beside the manifests).
    fn dir(&self) -> &Path {
        &self.manifest_dir
    }

    /// Merges the scan's pools: new pools are loaded with their recorded members (which are
    /// put in the store at once, so nothing is created twice), changed ones are re-decided,
    /// vanished ones (directory listed) start deleting their members.
    pub(crate) fn apply_pools(
        &self,
        pools: &BTreeMap<String, (Arc<LoadedPool>, i64)>,
        directory_ok: bool,
    ) {
        let mut dirty = Vec::new();
        let mut restored: Vec<(String, String, Vec<MemberRec>, Arc<LoadedPool>)> = Vec::new();
        {
            let mut all = lock(&self.pools);
            for (key, (p, generation)) in pools.iter() {
                match all.by_key.get_mut(key) {
                    Some(rt) => {
                        if rt.loaded.as_ref().is_none_or(|(_, g)| g != generation) {
                            rt.loaded = Some((Arc::clone(p), *generation));
                            dirty.push(key.clone());
                        }
                    }
                    None => {
                        let path = state_path(self.dir(), &p.namespace, &p.name);
                        let state: StateFile = std::fs::read(&path)
                            .ok()
                            .and_then(|b| serde_json::from_slice(&b).ok())
                            .unwrap_or_default();
                        tracing::info!(pool = %key, members = state.members.len(), "pool loaded");
                        restored.push((
                            key.clone(),
                            p.namespace.clone(),
                            state.members.clone(),
                            Arc::clone(p),
                        ));
                        all.by_key.insert(
                            key.clone(),
                            PoolRt {
                                namespace: p.namespace.clone(),
                                name: p.name.clone(),
                                loaded: Some((Arc::clone(p), *generation)),
                                members: state
                                    .members
                                    .into_iter()
                                    .map(|m| (m.name.clone(), m))
                                    .collect(),
                                status: state.status,
                                quarantine: BTreeMap::new(),
                                error: None,
                            },
                        );
                        dirty.push(key.clone());
                    }
                }
            }
            if directory_ok {
                for (key, rt) in &mut all.by_key {
                    if !pools.contains_key(key) && rt.loaded.is_some() {
                        tracing::info!(pool = %key, "pool manifest removed: deleting its members");
                        rt.loaded = None;
                        dirty.push(key.clone());
                    }
                }
            }
        }
        let now = SystemTime::now();
        for (key, namespace, members, p) in restored {
            let creds = self.pool_credentials(&p).ok().flatten();
            let mut objects = lock(&self.objects);
            for m in members {
                let uid = member_uid(&namespace, &p.name, &m.name);
                if objects.contains_key(&uid) {
                    continue;
                }
                let mut object = member_object(&p, &m, uid, creds.as_ref());
                object.deleting = m.deleting;
                objects.insert(
                    uid,
                    Obj {
                        object,
                        status: ProxyStatus::default(),
                        first_seen: now,
                        pool: Some(key.clone()),
                    },
                );
                drop(objects);
                self.queue.add(uid);
                objects = lock(&self.objects);
            }
        }
        for k in dirty {
            self.pool_queue.add(&k);
        }
    }

    /// The pool's credentials: the template's own (read with the manifest), or the generated
    /// file's (created now when missing); `None` when it has none.
    fn pool_credentials(
        &self,
        p: &LoadedPool,
    ) -> Result<Option<ProxyCredentials>, credentials_file::CredentialsFileError> {
        if p.policy.generate_credentials {
            let path = credentials_file::credentials_path(self.dir(), &p.namespace, &p.name);
            let (c, created) = credentials_file::ensure(&path, &p.name)?;
            if created {
                tracing::info!(pool = %p.key(), file = %path.display(), "pool credentials generated");
            }
            return Ok(Some(c));
        }
        Ok(p.credentials.as_ref().map(|c| ProxyCredentials {
            username: c.username.clone(),
            password: c.password.clone(),
        }))
    }

    /// Marks every pool dirty (a host check or a health round ended).
    pub(crate) fn all_pools_dirty(&self) {
        let keys: Vec<String> = lock(&self.pools).by_key.keys().cloned().collect();
        for k in keys {
            self.pool_queue.add(&k);
        }
    }

    /// One round of pool `key`: decide, then carry the decision out.
    pub(crate) fn pool_round(&self, key: &str) {
        let snapshot = lock(&self.pools).by_key.get(key).map(|rt| {
            (
                rt.namespace.clone(),
                rt.name.clone(),
                rt.loaded.clone(),
                rt.members.clone(),
                rt.status.clone(),
            )
        });
        let Some((namespace, name, loaded, mut recs, status)) = snapshot else {
            return;
        };
        let Some((p, generation)) = loaded else {
            self.pool_removal_round(key, &namespace, &name, recs);
            return;
        };
        if !self.is_adopted(&p.spec.template.provider) {
            return;
        }
        let quarantine = read_quarantine(&quarantine_path(self.dir(), &namespace, &name));
        let creds = match self.pool_credentials(&p) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(pool = %key, error = %e, "pool cannot act");
                if let Some(rt) = lock(&self.pools).by_key.get_mut(key) {
                    rt.error = Some(e.to_string());
                    rt.quarantine = quarantine;
                }
                return;
            }
        };
        let digest = creds.as_ref().map(credentials::digest).unwrap_or_default();
        let hash = template_hash(&p.spec.template, &digest);
        let health_checks = self.health.is_some();
        // The pool's members, read from their objects (O(members)).
        let mut members = Vec::with_capacity(recs.len());
        let mut gone = Vec::new();
        let mut unobserved = false;
        {
            let objects = lock(&self.objects);
            for rec in recs.values() {
                let uid = member_uid(&namespace, &name, &rec.name);
                let Some(o) = objects.get(&uid) else {
                    gone.push(rec.name.clone());
                    continue;
                };
                if !o.object.deleting && o.status.observed_generation == 0 {
                    unobserved = true;
                }
                members.push(Member::observe(
                    MemberMeta {
                        name: rec.name.clone(),
                        host: Some(rec.host.clone()),
                        template_hash: rec.template_hash.clone(),
                        created: parse_time(&rec.created),
                        quarantine: quarantine.get(&rec.name).cloned(),
                        deleting: rec.deleting || o.object.deleting,
                    },
                    &o.status,
                    health_checks,
                ));
            }
        }
        let mut changed = false;
        for g in &gone {
            if recs.get(g).is_some_and(|r| r.deleting) {
                recs.remove(g);
                changed = true;
            }
        }
        if unobserved {
            // Re-decided when the member's first reconcile reports.
            self.store_pool(key, recs, None, quarantine, changed);
            return;
        }
        let hosts = self.controller.pool_hosts(&p.spec.template.provider);
        // Bound by its entry's quotas.maxPoolReplicas (quarantined members count); a pool
        // asking for more is held to it, and says so in the log.
        let policy = match self.controller.max_pool_replicas(&p.spec.template.provider) {
            Some(max) => p.policy.clone().within_quota(max).unwrap_or_else(|e| {
                tracing::warn!(pool = %key, error = %format!("{}: {}", e.path, e.message), "pool held to its entry's quota");
                let mut held = p.policy.clone();
                held.replicas = max;
                held.max_members = max;
                held
            }),
            None => p.policy.clone(),
        };
        let now = SystemTime::now();
        let d = decide(&PoolInputs {
            name: &name,
            generation,
            policy: &policy,
            template_hash: &hash,
            members: &members,
            hosts: &hosts,
            status: &status,
            credentials_present: true,
            now,
        });
        for ev in &d.events {
            match ev.kind {
                EventKind::Normal => {
                    tracing::info!(pool = %key, reason = %ev.reason, message = %ev.message, "event");
                }
                EventKind::Warning => {
                    tracing::warn!(pool = %key, reason = %ev.reason, message = %ev.message, "event");
                }
            }
        }
        let mut new_objects = Vec::new();
        for c in &d.creates {
            let rec = MemberRec {
                name: c.name.clone(),
                host: c.host.clone(),
                template_hash: c.template_hash.clone(),
                created: now_text(now),
                deleting: false,
                was_available: false,
                pin: c.pin.clone(),
            };
            let uid = member_uid(&namespace, &name, &c.name);
            new_objects.push((uid, member_object(&p, &rec, uid, creds.as_ref())));
            recs.insert(c.name.clone(), rec);
            changed = true;
        }
        let mut counts = [0u64; 4];
        for m in &members {
            let i = if m.deleting {
                3
            } else if m.quarantine.is_some() {
                2
            } else if m.available {
                0
            } else {
                1
            };
            if let Some(c) = counts.get_mut(i) {
                *c += 1;
            }
            if m.available
                && let Some(r) = recs.get_mut(&m.name)
                && !r.was_available
            {
                r.was_available = true;
                changed = true;
                let secs = now
                    .duration_since(parse_time(&r.created))
                    .unwrap_or_default()
                    .as_secs_f64();
                self.metrics.pool_member_ready(key, secs);
            }
        }
        self.metrics.set_pool_members(key, counts);
        let mut deleted = Vec::new();
        for del in &d.deletes {
            if let Some(r) = recs.get_mut(&del.name)
                && !r.deleting
            {
                r.deleting = true;
                self.metrics.pool_member_replaced(key, del.cause.as_str());
                deleted.push(member_uid(&namespace, &name, &del.name));
                changed = true;
            }
        }
        self.metrics.set_pool(
            key,
            PoolReplicas {
                desired: u64::from(p.policy.replicas),
                available: u64::from(d.status.available_replicas),
            },
        );
        // NB: the member file is written before the objects exist (a crash in between
        // leaves a recorded member the next start creates, never an unrecorded VM).
        self.store_pool(key, recs, Some(d.status), quarantine, changed);
        {
            let mut objects = lock(&self.objects);
            for (uid, object) in &new_objects {
                objects.insert(
                    *uid,
                    Obj {
                        object: object.clone(),
                        status: ProxyStatus::default(),
                        first_seen: now,
                        pool: Some(key.to_owned()),
                    },
                );
            }
            for uid in &deleted {
                if let Some(mut o) = objects.get_mut(uid) {
                    o.object.deleting = true;
                }
            }
        }
        for (uid, _) in new_objects {
            self.queue.add(uid);
        }
        for uid in deleted {
            self.queue.add(uid);
        }
        if !d.creates.is_empty() || !d.deletes.is_empty() {
            self.update_phase_metrics();
        }
    }

    /// Stores a round's results in the pool and, when the member list `changed`, writes the
    /// member file.
    fn store_pool(
        &self,
        key: &str,
        recs: BTreeMap<String, MemberRec>,
        status: Option<ProxyPoolStatus>,
        quarantine: BTreeMap<String, String>,
        changed: bool,
    ) {
        let mut write = None;
        {
            let mut all = lock(&self.pools);
            let Some(rt) = all.by_key.get_mut(key) else {
                return;
            };
            rt.members = recs;
            if let Some(s) = status {
                rt.status = s;
            }
            rt.quarantine = quarantine;
            rt.error = None;
            if changed {
                let file = StateFile {
                    members: rt.members.values().cloned().collect(),
                    status: rt.status.clone(),
                };
                write = Some((
                    state_path(self.dir(), &rt.namespace, &rt.name),
                    serde_json::to_vec_pretty(&file).unwrap_or_default(),
                ));
            }
        }
        if let Some((path, bytes)) = write
            && let Err(e) = write_atomic(&path, &bytes)
        {
            tracing::error!(pool = %key, file = %path.display(), error = %e, "cannot write the pool's member file");
        }
    }

    /// A removed pool's round: every member deleting; once none is left, the pool is
    /// forgotten.
    fn pool_removal_round(
        &self,
        key: &str,
        namespace: &str,
        name: &str,
        mut recs: BTreeMap<String, MemberRec>,
    ) {
        let mut changed = false;
        let mut queue = Vec::new();
        {
            let mut objects = lock(&self.objects);
            recs.retain(|m, r| {
                let uid = member_uid(namespace, name, m);
                match objects.get_mut(&uid) {
                    None => {
                        changed = true;
                        false
                    }
                    Some(mut o) => {
                        if !o.object.deleting {
                            o.object.deleting = true;
                            queue.push(uid);
                        }
                        if !r.deleting {
                            r.deleting = true;
                            changed = true;
                        }
                        true
                    }
                }
            });
        }
        for u in queue {
            self.queue.add(u);
        }
        if recs.is_empty() {
            lock(&self.pools).by_key.remove(key);
            self.metrics.forget_pool(key);
            let _ = std::fs::remove_file(state_path(self.dir(), namespace, name));
            tracing::info!(pool = %key, "pool deleted: no member left");
            return;
        }
        let q = lock(&self.pools)
            .by_key
            .get(key)
            .map(|rt| rt.quarantine.clone())
            .unwrap_or_default();
        self.store_pool(key, recs, None, q, changed);
    }

    /// The `/pools/NAME/healthy.txt` body of pool `namespace/name` from its own members
    /// (O(members), not the whole status document): `ip:port` of each available member that
    /// is neither quarantined nor being deleted, sorted; `None` for an unknown pool.
    pub(crate) fn pool_healthy_list(&self, namespace: &str, name: &str) -> Option<String> {
        let (recs, quarantine) = {
            let all = lock(&self.pools);
            let rt = all.by_key.get(&format!("{namespace}/{name}"))?;
            (
                rt.members.values().cloned().collect::<Vec<_>>(),
                rt.quarantine.clone(),
            )
        };
        let health_checks = self.health.is_some();
        let mut eps: Vec<String> = {
            let objects = lock(&self.objects);
            recs.into_iter()
                .filter(|r| !r.deleting && !quarantine.contains_key(&r.name))
                .filter_map(|r| {
                    let o = objects.get(&member_uid(namespace, name, &r.name))?;
                    if o.object.deleting {
                        return None;
                    }
                    let m = Member::observe(
                        MemberMeta {
                            name: r.name.clone(),
                            host: Some(r.host.clone()),
                            template_hash: r.template_hash.clone(),
                            created: parse_time(&r.created),
                            quarantine: None,
                            deleting: false,
                        },
                        &o.status,
                        health_checks,
                    );
                    let ip: std::net::IpAddr = o.status.ip.as_deref()?.parse().ok()?;
                    m.available.then(|| {
                        std::net::SocketAddr::new(ip, o.object.spec.proxy.port).to_string()
                    })
                })
                .collect()
        };
        eps.sort();
        let mut out = String::with_capacity(eps.len() * 22);
        for e in eps {
            out.push_str(&e);
            out.push('\n');
        }
        Some(out)
    }

    /// Every pool's row for `/status`.
    pub(crate) fn pool_rows(&self) -> Vec<PoolStatusRow> {
        let pools: Vec<PoolSnapshot> = lock(&self.pools)
            .by_key
            .values()
            .map(|rt| {
                (
                    rt.namespace.clone(),
                    rt.name.clone(),
                    rt.loaded.as_ref().map_or(0, |(p, _)| p.policy.replicas),
                    rt.status.clone(),
                    rt.members.values().cloned().collect(),
                    rt.quarantine.clone(),
                    rt.error.clone(),
                )
            })
            .collect();
        let health_checks = self.health.is_some();
        let objects = lock(&self.objects);
        pools
            .into_iter()
            .map(
                |(namespace, name, desired, status, recs, quarantine, error)| {
                    let members = recs
                        .into_iter()
                        .map(|r| {
                            let o = objects.get(&member_uid(&namespace, &name, &r.name));
                            let st = o.map(|o| o.status.clone()).unwrap_or_default();
                            let quarantine = quarantine.get(&r.name).cloned();
                            let m = Member::observe(
                                MemberMeta {
                                    name: r.name.clone(),
                                    host: Some(r.host.clone()),
                                    template_hash: r.template_hash.clone(),
                                    created: parse_time(&r.created),
                                    quarantine: quarantine.clone(),
                                    deleting: r.deleting,
                                },
                                &st,
                                health_checks,
                            );
                            PoolMemberRow {
                                name: r.name,
                                host: Some(r.host),
                                phase: st.phase,
                                available: m.available,
                                template_hash: r.template_hash,
                                created_at: r.created,
                                quarantine,
                                deleting: r.deleting || o.is_some_and(|o| o.object.deleting),
                                egress_address: m.egress_address,
                            }
                        })
                        .collect();
                    PoolStatusRow {
                        namespace,
                        name,
                        desired,
                        status,
                        members,
                        error,
                    }
                },
            )
            .collect()
    }
}

/// A member's object: the template pinned to its host, with the pool's credentials.
fn member_object(
    p: &LoadedPool,
    rec: &MemberRec,
    uid: ProxyUid,
    creds: Option<&ProxyCredentials>,
) -> ProxyObject {
    let reference = if p.policy.generate_credentials {
        Some(format!(
            "{}{}",
            p.name,
            credentials_file::CREDENTIALS_SUFFIX
        ))
    } else {
        None
    };
    ProxyObject {
        namespace: p.namespace.clone(),
        name: rec.name.clone(),
        uid,
        generation: 1,
        spec: std::sync::Arc::new(member_spec(
            &p.spec.template,
            &rec.host,
            &rec.pin,
            reference.as_deref(),
        )),
        deleting: false,
        credentials: creds.cloned(),
        namespace_labels: None,
    }
}

/// The pool loop: decides each dirty pool, and every pool on each tick, until stopped.
pub(crate) async fn run(sh: Arc<Shared>, stop: CancellationToken) {
    let mut next_tick = tokio::time::Instant::now() + POLL_INTERVAL;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = sh.pool_queue.notify.notified() => {}
            () = tokio::time::sleep_until(next_tick) => {
                next_tick = tokio::time::Instant::now() + POLL_INTERVAL;
                sh.all_pools_dirty();
            }
        }
        let keys = sh.pool_queue.take();
        for k in keys {
            sh.pool_round(&k);
        }
        if !sleep_or_stop(ROUND_GAP, &stop).await {
            return;
        }
    }
}

#[cfg(test)]
#[path = "pools_tests.rs"]
mod tests;
