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
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use egress_core::background::sleep_or_stop;
use egress_core::controller::{Event, EventKind, ProxyCredentials, ProxyObject};
use egress_core::model::{Phase, ProxyStatus, condition};
use egress_core::pool::member::member_spec;
use egress_core::pool::round::{
    self, AvailabilityMemory, PoolCredentials, PoolDriver, Round, RoundInputs,
};
use egress_core::pool::{
    CreateMember, Member, MemberMeta, ProxyPoolStatus, credentials, credentials_file,
};
use egress_provider::ProxyUid;
use egress_web::status::{PoolMemberRow, PoolStatusRow};
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

/// Pools to decide again soon (de-duplicated).
#[derive(Debug, Default)]
pub(crate) struct PoolQueue {
    dirty: std::sync::Mutex<BTreeSet<String>>,
    notify: Notify,
}

impl PoolQueue {
    /// Marks `key` to be decided again.
    pub(crate) fn add(&self, key: &str) {
        if lock(&self.dirty).insert(key.to_owned()) {
            self.notify.notify_one();
        }
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
                        if rt.removed || rt.loaded.1 != *generation {
                            rt.loaded = (Arc::clone(p), *generation);
                            rt.removed = false;
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
                                loaded: (Arc::clone(p), *generation),
                                removed: false,
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
                    if !pools.contains_key(key) && !rt.removed {
                        tracing::info!(pool = %key, "pool manifest removed: deleting its members");
                        rt.removed = true;
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

    /// One round of pool `key`: the core's round ([`round::plan`]) over the pool's members,
    /// carried out by [`StandalonePool`].
    pub(crate) async fn pool_round(&self, key: &str) {
        let snapshot = lock(&self.pools).by_key.get(key).map(|rt| {
            (
                rt.namespace.clone(),
                rt.name.clone(),
                rt.loaded.clone(),
                rt.removed,
                rt.members.clone(),
                rt.status.clone(),
                rt.quarantine.clone(),
            )
        });
        let Some((namespace, name, (p, generation), removed, mut recs, status, held)) = snapshot
        else {
            return;
        };
        if !removed && !self.is_adopted(&p.spec.template.provider) {
            return;
        }
        let quarantine = if removed {
            held
        } else {
            read_quarantine(&quarantine_path(self.dir(), &namespace, &name))
        };
        let (creds, unusable) = if removed {
            (None, None)
        } else {
            match self.pool_credentials(&p) {
                Ok(c) => (c, None),
                Err(e) => {
                    tracing::warn!(pool = %key, error = %e, "pool cannot act");
                    (None, Some(e.to_string()))
                }
            }
        };
        let digest = creds.as_ref().map(credentials::digest).unwrap_or_default();
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
        // A member leaves the file once its deletion finalized (a removed pool's: once its
        // object is gone, whatever the file said).
        let mut changed = false;
        for g in &gone {
            if removed || recs.get(g).is_some_and(|r| r.deleting) {
                recs.remove(g);
                changed = true;
            }
        }
        if unobserved && !removed {
            // Re-decided when the member's first reconcile reports.
            self.store_pool(key, recs, None, quarantine, changed, None);
            return;
        }
        let hosts = self.controller.pool_hosts(&p.spec.template.provider);
        let now = SystemTime::now();
        let mut memory = AvailabilityMemory::recorded(
            recs.values()
                .filter(|r| r.was_available)
                .map(|r| r.name.clone()),
        );
        let round = round::plan(
            &RoundInputs {
                namespace: &namespace,
                name: &name,
                generation,
                spec: &p.spec,
                deleting: removed,
                status: &status,
                credentials: match &unusable {
                    Some(why) => PoolCredentials::Unusable(why),
                    None => PoolCredentials::Ready { digest: &digest },
                },
                members: &members,
                hosts: &hosts,
                now,
            },
            &mut memory,
        );
        for r in recs.values_mut() {
            if !r.was_available && memory.contains(&r.name) {
                r.was_available = true;
                changed = true;
            }
        }
        let io = StandalonePool {
            sh: self,
            key,
            pool: &p,
            creds: creds.as_ref(),
            now,
            work: Mutex::new(RoundWork {
                recs,
                changed,
                quarantine,
                error: unusable,
                new_objects: Vec::new(),
                deleted: Vec::new(),
            }),
        };
        let Ok(done) = round::carry_out(&io, &self.metrics, key, &round, &status).await;
        if !done.finished && matches!(round, Round::Remove { .. } | Round::Wait(_)) {
            // No status to record: the member list alone.
            io.commit(None);
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
        error: Option<String>,
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
            rt.error = error;
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
                    if rt.removed {
                        0
                    } else {
                        rt.loaded.0.policy.replicas
                    },
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

/// What one round changes before it is recorded: the member list, the objects to make and
/// to mark deleting.
struct RoundWork {
    recs: BTreeMap<String, MemberRec>,
    /// The member list changed (the member file is written).
    changed: bool,
    quarantine: BTreeMap<String, String>,
    /// Why the pool cannot act, shown on its `/status` row.
    error: Option<String>,
    new_objects: Vec<(ProxyUid, ProxyObject)>,
    deleted: Vec<ProxyUid>,
}

/// One pool's round as the standalone driver carries it out: members are objects in the
/// store recorded in the pool's member file, events are log lines, the status is kept in
/// memory and in the member file.
///
/// Guarantees: a round's creates and deletes take effect only when it is recorded
/// ([`StandalonePool::commit`]): the member file is written first, then the objects are made
/// (a crash in between leaves a recorded member the next start creates, never an unrecorded
/// VM).
struct StandalonePool<'a> {
    sh: &'a Shared,
    key: &'a str,
    pool: &'a LoadedPool,
    creds: Option<&'a ProxyCredentials>,
    now: SystemTime,
    work: Mutex<RoundWork>,
}

impl StandalonePool<'_> {
    /// Records the round: the member file (when the member list changed), the pool's
    /// `status` (when given), then the objects made and marked deleting, queued.
    fn commit(&self, status: Option<ProxyPoolStatus>) {
        let (recs, changed, quarantine, error, new_objects, deleted) = {
            let mut w = lock(&self.work);
            (
                std::mem::take(&mut w.recs),
                std::mem::take(&mut w.changed),
                std::mem::take(&mut w.quarantine),
                w.error.take(),
                std::mem::take(&mut w.new_objects),
                std::mem::take(&mut w.deleted),
            )
        };
        // NB: the member file is written before the objects exist.
        self.sh
            .store_pool(self.key, recs, status, quarantine, changed, error);
        {
            let mut objects = lock(&self.sh.objects);
            for (uid, object) in &new_objects {
                objects.insert(
                    *uid,
                    Obj {
                        object: object.clone(),
                        status: ProxyStatus::default(),
                        first_seen: self.now,
                        pool: Some(self.key.to_owned()),
                    },
                );
            }
            for uid in &deleted {
                if let Some(mut o) = objects.get_mut(uid) {
                    o.object.deleting = true;
                }
            }
        }
        let acted = !new_objects.is_empty() || !deleted.is_empty();
        for (uid, _) in new_objects {
            self.sh.queue.add(uid);
        }
        for uid in deleted {
            self.sh.queue.add(uid);
        }
        if acted {
            self.sh.update_phase_metrics();
        }
    }
}

impl PoolDriver for StandalonePool<'_> {
    type Error = std::convert::Infallible;

    async fn create(&self, c: &CreateMember) -> Result<(), Self::Error> {
        let rec = MemberRec {
            name: c.name.clone(),
            host: c.host.clone(),
            template_hash: c.template_hash.clone(),
            created: now_text(self.now),
            deleting: false,
            was_available: false,
            pin: c.pin.clone(),
        };
        let uid = member_uid(&self.pool.namespace, &self.pool.name, &c.name);
        let object = member_object(self.pool, &rec, uid, self.creds);
        let mut w = lock(&self.work);
        w.new_objects.push((uid, object));
        w.recs.insert(c.name.clone(), rec);
        w.changed = true;
        Ok(())
    }

    async fn delete(&self, name: &str) -> Result<bool, Self::Error> {
        let mut w = lock(&self.work);
        w.deleted
            .push(member_uid(&self.pool.namespace, &self.pool.name, name));
        let Some(r) = w.recs.get_mut(name) else {
            return Ok(false);
        };
        let started = !std::mem::replace(&mut r.deleting, true);
        w.changed |= started;
        Ok(started)
    }

    async fn event(&self, ev: &Event) {
        match ev.kind {
            EventKind::Normal => {
                tracing::info!(pool = %self.key, reason = %ev.reason, message = %ev.message, "event");
            }
            EventKind::Warning => {
                tracing::warn!(pool = %self.key, reason = %ev.reason, message = %ev.message, "event");
            }
        }
    }

    async fn write_status(
        &self,
        status: &ProxyPoolStatus,
        _changed: bool,
    ) -> Result<(), Self::Error> {
        self.commit(Some(status.clone()));
        Ok(())
    }

    async fn forget(&self) -> Result<(), Self::Error> {
        let (namespace, name) = (&self.pool.namespace, &self.pool.name);
        lock(&self.sh.pools).by_key.remove(self.key);
        let _ = std::fs::remove_file(state_path(self.sh.dir(), namespace, name));
        tracing::info!(pool = %self.key, "pool deleted: no member left");
        Ok(())
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
            sh.pool_round(&k).await;
        }
        if !sleep_or_stop(ROUND_GAP, &stop).await {
            return;
        }
    }
}

#[cfg(test)]
#[path = "pools_tests.rs"]
mod tests;
