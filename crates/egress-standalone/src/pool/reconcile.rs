//! The pool loop and one pool's round in standalone mode: the core's round
//! ([`egress_core::pool::round`]) over the pool's members, carried out by
//! [`StandalonePool`] — this driver's I/O: the member file, the objects in the store, log
//! lines for events. See the module doc of [`crate::pool`] for what a round guarantees.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use egress_core::background::sleep_or_stop;
use egress_core::controller::{Event, EventKind, ProxyCredentials, ProxyObject};
use egress_core::model::ProxyStatus;
use egress_core::pool::credentials;
use egress_core::pool::round::{
    self, AvailabilityMemory, PoolCredentials, PoolDriver, Quota, Round, RoundInputs,
};
use egress_core::pool::{CreateMember, Member, ProxyPoolStatus, UnpublishMember};
use egress_provider::ProxyUid;
use egress_provider::sync::lock;
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::manifests::LoadedPool;
use crate::pool::credentials::{CredentialsFileError, credentials_path, ensure, ensure_digest_key};
use crate::pool::members::{
    StateFile, member_object, member_uid, now_text, quarantine_path, state_path,
};
use crate::settings::POLL_INTERVAL;
use crate::store::{MemberRec, Obj, PoolRt, Store};

/// Shortest pause between two rounds of the pool loop.
// NB: a member's every status change marks its pool dirty; 100 ms folds a burst (a thousand
// members turning Running) into a few rounds, each O(members), and is invisible to a user.
const ROUND_GAP: Duration = Duration::from_millis(100);

/// Merges the scan's pools: new pools are loaded with their recorded members (which are
/// put in the store at once, so nothing is created twice), changed ones are re-decided,
/// vanished ones (directory listed) start deleting their members.
pub(crate) fn apply_pools(
    store: &Store,
    ctx: &Context,
    pools: &BTreeMap<String, (Arc<LoadedPool>, i64)>,
    directory_ok: bool,
) {
    let mut dirty = Vec::new();
    let mut restored: Vec<(String, String, Vec<MemberRec>, Arc<LoadedPool>)> = Vec::new();
    {
        let mut all = lock(&store.pools);
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
                    let path = state_path(&ctx.manifest_dir, &p.namespace, &p.name);
                    let state = StateFile::read(&path);
                    tracing::info!(pool = %key, members = state.members.len(), "pool loaded");
                    // Its recorded retirements take effect before anything is allocated (the
                    // registry is primed only after the first scan loaded every pool).
                    state.status.sync_retired(
                        &ctx.retired,
                        key,
                        &p.spec.template.spec.provider,
                        SystemTime::now(),
                    );
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
        let creds = pool_credentials(ctx, &p).ok().flatten();
        let mut objects = lock(&store.objects);
        let names: std::collections::BTreeSet<String> =
            members.iter().map(|m| m.name.clone()).collect();
        for m in members {
            let uid = member_uid(&namespace, &p.name, &m.name);
            if objects.contains_key(&uid) {
                continue;
            }
            let mut object = member_object(&p, &m, uid, creds.as_ref(), &|r| names.contains(r));
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
            ctx.queue.add(uid);
            objects = lock(&store.objects);
        }
    }
    for k in dirty {
        ctx.pool_queue.add(&k);
    }
}

/// The pool's credentials: the template's own (read with the manifest), or the generated
/// file's (created now when missing); `None` when it has none.
fn pool_credentials(
    ctx: &Context,
    p: &LoadedPool,
) -> Result<Option<ProxyCredentials>, CredentialsFileError> {
    if p.policy.generate_credentials {
        let path = credentials_path(&ctx.manifest_dir, &p.namespace, &p.name);
        let (c, created) = ensure(&path, &p.name)?;
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

/// The credentials digest members' template hash includes: a generated password's (random,
/// so unguessable) as it is; a chosen password's keyed by the installation's digest key, so
/// that whoever reads a member's template hash cannot test guesses offline.
fn template_digest(
    ctx: &Context,
    p: &LoadedPool,
    c: &ProxyCredentials,
) -> Result<String, CredentialsFileError> {
    template_digest_in(&ctx.manifest_dir, p.policy.generate_credentials, c)
}

/// [`template_digest`] with the digest key in manifest directory `dir`.
fn template_digest_in(
    dir: &std::path::Path,
    generated: bool,
    c: &ProxyCredentials,
) -> Result<String, CredentialsFileError> {
    if generated {
        return Ok(credentials::digest(c));
    }
    let key = ensure_digest_key(dir)?;
    Ok(credentials::keyed_digest(&key, c))
}

/// Marks every pool dirty (a host check or a health round ended, the config was reloaded).
pub(crate) fn all_pools_dirty(store: &Store, ctx: &Context) {
    let keys: Vec<String> = lock(&store.pools).by_key.keys().cloned().collect();
    for k in keys {
        ctx.pool_queue.add(&k);
    }
}

/// One round of pool `key`: the core's round ([`round::plan`]) over the pool's members,
/// carried out by [`StandalonePool`].
pub(crate) async fn pool_round(store: &Store, ctx: &Context, key: &str) {
    let snapshot = lock(&store.pools).by_key.get(key).map(|rt| {
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
    let Some((namespace, name, (p, generation), removed, mut recs, status, held)) = snapshot else {
        return;
    };
    if !removed && !store.is_adopted(&ctx.providers(), &p.spec.template.spec.provider) {
        return;
    }
    let quarantine = if removed {
        held
    } else {
        crate::quarantine::read_quarantine(&quarantine_path(&ctx.manifest_dir, &namespace, &name))
    };
    let (creds, unusable) = if removed {
        (None, None)
    } else {
        match pool_credentials(ctx, &p) {
            Ok(c) => (c, None),
            Err(e) => {
                tracing::warn!(pool = %key, error = %e, "pool cannot act");
                (None, Some(e.to_string()))
            }
        }
    };
    let (digest, unusable) = match (&creds, unusable) {
        (Some(c), None) => match template_digest(ctx, &p, c) {
            Ok(d) => (d, None),
            Err(e) => {
                tracing::warn!(pool = %key, error = %e, "pool cannot act");
                (String::new(), Some(e.to_string()))
            }
        },
        (_, unusable) => (String::new(), unusable),
    };
    let health_checks = ctx.health.is_some();
    // The pool's members, read from their objects (O(members)).
    let mut members = Vec::with_capacity(recs.len());
    let mut gone = Vec::new();
    let mut unobserved = false;
    {
        let objects = lock(&store.objects);
        for rec in recs.values() {
            let uid = member_uid(&namespace, &name, &rec.name);
            let Some(o) = objects.get(&uid) else {
                gone.push(rec.name.clone());
                continue;
            };
            if !o.object.deleting && o.status.observed_generation == 0 {
                unobserved = true;
            }
            members.push(Member::observe_with(
                rec.meta(
                    quarantine.get(&rec.name).cloned(),
                    rec.deleting || o.object.deleting,
                ),
                &o.status,
                health_checks,
                p.spec.reputation.on_listed,
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
        store_pool(store, ctx, key, recs, None, quarantine, changed, None);
        return;
    }
    let hosts = ctx.controller.pool_hosts(&p.spec.template.spec.provider);
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
            // Bound by its entry's quotas.maxPoolReplicas (quarantined members count); a
            // pool asking for more is held to it, and says so in the log.
            quota: ctx
                .controller
                .max_pool_replicas(&p.spec.template.spec.provider)
                .map_or(Quota::Unbounded, Quota::Hold),
            status: &status,
            credentials: match &unusable {
                Some(why) => PoolCredentials::Unusable(why),
                None => PoolCredentials::Ready { digest: &digest },
            },
            members: &members,
            hosts: &hosts,
            retire_for: ctx.reputation.settings().retire_for,
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
        store,
        ctx,
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
            unpublished: false,
        }),
    };
    let Ok(done) = round::carry_out(&io, &ctx.metrics, key, &round, &status).await;
    if !done.finished && matches!(round, Round::Remove { .. } | Round::Wait(_)) {
        // No status to record: the member list alone.
        io.commit(None);
    }
}

/// Stores a round's results in the pool and, when the member list `changed`, writes the
/// member file.
// NB: the parts of one pool's round state, each from a different step of the round.
#[allow(clippy::too_many_arguments)]
fn store_pool(
    store: &Store,
    ctx: &Context,
    key: &str,
    recs: BTreeMap<String, MemberRec>,
    status: Option<ProxyPoolStatus>,
    quarantine: BTreeMap<String, String>,
    changed: bool,
    error: Option<String>,
) {
    let mut write = None;
    {
        let mut all = lock(&store.pools);
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
            write = Some((
                state_path(&ctx.manifest_dir, &rt.namespace, &rt.name),
                StateFile {
                    members: rt.members.values().cloned().collect(),
                    status: rt.status.clone(),
                },
            ));
        }
    }
    if let Some((path, file)) = write
        && let Err(e) = file.write(&path)
    {
        tracing::error!(pool = %key, file = %path.display(), error = %e, "cannot write the pool's member file");
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
    /// Members unpublished this round (their drain marker is in `recs`).
    unpublished: bool,
}

/// One pool's round as the standalone driver carries it out: members are objects in the
/// store recorded in the pool's member file, events are log lines, the status is kept in
/// memory and in the member file (its `retiredAddresses` too: a restart reads them back
/// before anything is allocated).
///
/// Guarantees: a round's creates and deletes take effect only when it is recorded
/// ([`StandalonePool::commit`]): the member file is written first, then the objects are made
/// (a crash in between leaves a recorded member the next start creates, never an unrecorded
/// VM).
struct StandalonePool<'a> {
    store: &'a Store,
    ctx: &'a Context,
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
        let (recs, changed, quarantine, error, new_objects, deleted, unpublished) = {
            let mut w = lock(&self.work);
            (
                std::mem::take(&mut w.recs),
                std::mem::take(&mut w.changed),
                std::mem::take(&mut w.quarantine),
                w.error.take(),
                std::mem::take(&mut w.new_objects),
                std::mem::take(&mut w.deleted),
                std::mem::take(&mut w.unpublished),
            )
        };
        // NB: the member file is written before the objects exist, and with the drain
        // markers before the gateway hears of them (healthy.txt reads them at once).
        store_pool(
            self.store, self.ctx, self.key, recs, status, quarantine, changed, error,
        );
        if unpublished {
            self.ctx.pool_queue.gateway_wake.notify_one();
        }
        {
            let mut objects = lock(&self.store.objects);
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
            self.ctx.queue.add(uid);
        }
        for uid in deleted {
            self.ctx.queue.add(uid);
        }
        if acted {
            self.store.publish_phase_counts(&self.ctx.metrics);
        }
    }
}

impl PoolDriver for StandalonePool<'_> {
    type Error = std::convert::Infallible;

    /// The pool's retirements take effect in the process's registry at once (before this
    /// round's creates), and the member file is written with the status that records them.
    fn retire(&self, status: &ProxyPoolStatus) {
        status.sync_retired(
            &self.ctx.retired,
            self.key,
            &self.pool.spec.template.spec.provider,
            self.now,
        );
        lock(&self.work).changed = true;
    }

    async fn create(&self, c: &CreateMember) -> Result<(), Self::Error> {
        let rec = MemberRec {
            name: c.name.clone(),
            host: c.host.clone(),
            template_hash: c.template_hash.clone(),
            created: now_text(self.now),
            deleting: false,
            was_available: false,
            pin: c.pin.clone(),
            drain: None,
            replaces: c.replaces.clone(),
        };
        let uid = member_uid(&self.pool.namespace, &self.pool.name, &c.name);
        let mut w = lock(&self.work);
        let object = member_object(self.pool, &rec, uid, self.creds, &|r| {
            w.recs.contains_key(r)
        });
        w.new_objects.push((uid, object));
        w.recs.insert(c.name.clone(), rec);
        w.changed = true;
        Ok(())
    }

    /// The marker goes into the member's record: the member file written at the end of the
    /// round keeps it, and every view (healthy.txt, the gateway feed, `/status`) reads it.
    async fn unpublish(&self, u: &UnpublishMember) -> Result<(), Self::Error> {
        let mut w = lock(&self.work);
        if let Some(r) = w.recs.get_mut(&u.name)
            && r.drain.is_none()
        {
            r.drain = Some(u.marker.clone());
            w.changed = true;
            w.unpublished = true;
        }
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
        lock(&self.store.pools).by_key.remove(self.key);
        // Its retirements end with it.
        ProxyPoolStatus::default().sync_retired(
            &self.ctx.retired,
            self.key,
            &self.pool.spec.template.spec.provider,
            self.now,
        );
        let _ = std::fs::remove_file(state_path(&self.ctx.manifest_dir, namespace, name));
        tracing::info!(pool = %self.key, "pool deleted: no member left");
        Ok(())
    }
}

/// The pool loop: decides each dirty pool, and every pool on each tick, until stopped.
pub(crate) async fn run(store: &Store, ctx: &Context, stop: CancellationToken) {
    let mut next_tick = tokio::time::Instant::now() + POLL_INTERVAL;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = ctx.pool_queue.marked() => {}
            () = tokio::time::sleep_until(next_tick) => {
                next_tick = tokio::time::Instant::now() + POLL_INTERVAL;
                all_pools_dirty(store, ctx);
            }
        }
        let keys = ctx.pool_queue.take();
        for k in keys {
            pool_round(store, ctx, &k).await;
        }
        if !sleep_or_stop(ROUND_GAP, &stop).await {
            return;
        }
    }
}

#[cfg(test)]
#[path = "reconcile_tests.rs"]
mod digest_tests;
