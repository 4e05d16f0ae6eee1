//! The executor's handle, [`Controller`]: its shared state and the calls a driver makes
//! besides reconciling (adopt, host reports, forget, metrics, shutdown, waker, config
//! reload).
//!
//! Guarantees: `Send + Sync`; no call here does network I/O, and no lock is held across an
//! `.await`; [`Controller::shutdown`] waits at most its grace, then aborts what is left.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use egress_provider::model::{HostReport, Instance, InstanceState, OwnedInstance, ProxyUid};
use tokio_util::task::TaskTracker;

use crate::model::ProxyStatus;
use crate::providers::Providers;

use super::decide::AddressRoom;
use super::inflight::{OpKind, op_finished};
use super::limits::HostLimits;
use super::metrics::{ControllerCounters, Counters};
use super::settings::ControllerSettings;
use super::state::State;
use egress_provider::sync::{lock, read, write};

/// How the controller tells its driver that a Proxy's reconcile can make progress now: its
/// create or delete finished, or a host slot it was refused freed up. The driver queues the
/// UID (e.g. standalone's de-duplicating work queue); it must not block. See
/// [`Controller::set_waker`].
pub type Waker = Arc<dyn Fn(ProxyUid) + Send + Sync>;

pub(super) struct Inner {
    pub(super) providers: RwLock<Arc<Providers>>,
    pub(super) settings: ControllerSettings,
    pub(super) state: Mutex<State>,
    pub(super) limits: HostLimits,
    pub(super) counters: Counters,
    pub(super) tracker: TaskTracker,
    pub(super) stopping: AtomicBool,
    /// Image bytes transferred by creates (their imports' progress), since start.
    pub(super) image_bytes: Arc<AtomicU64>,
    /// The driver's waker, when it set one.
    pub(super) waker: RwLock<Option<Waker>>,
    /// The address each Proxy's instance had at the provider's last `get` that reported one
    /// (see [`Controller::verified_address`]).
    pub(super) verified: Mutex<HashMap<ProxyUid, IpAddr>>,
    /// The declared egress addresses each Proxy's instance held at the provider's last report
    /// of it (see [`Controller::declared_egress`]); no entry when it holds none.
    pub(super) declared: Mutex<HashMap<ProxyUid, Vec<IpAddr>>>,
    /// Whether the driver has shown every Proxy's pins (see [`Controller::set_pins_known`]):
    /// until then no create that pins nothing is started.
    pub(super) pins_known: AtomicBool,
}

impl Inner {
    /// Records what the provider said about `uid`'s instance (a `get` or a finished create;
    /// `None`: it is gone): see [`Controller::verified_address`].
    pub(super) fn note_observed(&self, uid: &ProxyUid, inst: Option<&Instance>) {
        {
            let mut d = lock(&self.declared);
            match inst {
                Some(i) if !i.egress.is_empty() => {
                    d.insert(*uid, i.egress.clone());
                }
                _ => {
                    d.remove(uid);
                }
            }
        }
        let mut v = lock(&self.verified);
        match inst {
            Some(Instance { ip: Some(ip), .. }) => {
                v.insert(*uid, *ip);
            }
            Some(Instance {
                state: InstanceState::Running | InstanceState::Provisioning,
                ..
            }) => {}
            _ => {
                v.remove(uid);
            }
        }
    }

    /// Wakes `uids` through the driver's waker (no lock of ours is held while it runs).
    pub(super) fn wake(&self, uids: impl IntoIterator<Item = ProxyUid>) {
        let w = read(&self.waker).clone();
        if let Some(w) = w {
            for u in uids {
                w(u);
            }
        }
    }
}

/// The reconciler's executor. `Send + Sync`; share it in an `Arc` between workers.
pub struct Controller {
    pub(super) inner: Arc<Inner>,
}

impl fmt::Debug for Controller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Controller")
            .field("settings", &self.inner.settings)
            .finish_non_exhaustive()
    }
}

impl Controller {
    /// A controller over `providers` with `settings`. No I/O.
    pub fn new(providers: Arc<Providers>, settings: ControllerSettings) -> Self {
        Self {
            inner: Arc::new(Inner {
                providers: RwLock::new(providers),
                settings,
                state: Mutex::new(State::default()),
                limits: HostLimits::default(),
                counters: Counters::default(),
                tracker: TaskTracker::new(),
                stopping: AtomicBool::new(false),
                image_bytes: Arc::new(AtomicU64::new(0)),
                waker: RwLock::new(None),
                verified: Mutex::new(HashMap::new()),
                declared: Mutex::new(HashMap::new()),
                pins_known: AtomicBool::new(true),
            }),
        }
    }

    /// Records the addresses `obj` pins (what every reconcile of it does too), so a Proxy
    /// that pins nothing never takes them (see [`super::reservations`]). A driver that learns
    /// its Proxies in batches calls it for each before any is reconciled. O(its pins).
    pub fn note_pins(&self, obj: &super::ProxyObject) {
        self.note_pins_of(
            &obj.spec.provider,
            obj.uid,
            &obj.namespace,
            &obj.spec.egress.pinned(),
        );
    }

    /// [`note_pins`](Self::note_pins) from a Proxy's parts: `uid` (namespace `ns`) pins
    /// `pins` in provider entry `entry` (nothing is recorded for an unknown entry).
    pub fn note_pins_of(&self, entry: &str, uid: ProxyUid, ns: &str, pins: &[std::net::IpAddr]) {
        if self.providers().get(entry).is_none() {
            return;
        }
        lock(&self.inner.state)
            .reservations
            .register(entry, uid, ns, pins);
    }

    /// Tells whether the driver has shown every Proxy's pins ([`note_pins`](Self::note_pins)):
    /// while it has not (a watch listing), a create that pins no address waits, so it never
    /// takes an address a Proxy not seen yet pins. Known from the start unless set otherwise.
    pub fn set_pins_known(&self, known: bool) {
        self.inner.pins_known.store(known, Ordering::SeqCst);
    }

    /// Sets the driver's waker: called with a Proxy's UID when its create or delete finished
    /// (so the result is picked up at once rather than at the next poll), and with the
    /// oldest UIDs refused a work slot on a host when that host's slots free up. Without a
    /// waker, those Proxies are reconciled at their requeue time as before; with one, they
    /// still are (waking only brings a reconcile forward).
    pub fn set_waker(&self, waker: Waker) {
        *write(&self.inner.waker) = Some(waker);
    }

    /// Replaces the providers after a config reload. Work in flight keeps the provider it
    /// started with; latched failures of an entry whose digest changed are released on the
    /// next reconcile.
    pub fn set_providers(&self, providers: Arc<Providers>) {
        let mut p = write(&self.inner.providers);
        *p = providers;
    }

    pub(super) fn providers(&self) -> Arc<Providers> {
        read(&self.inner.providers).clone()
    }

    /// Learns where instances are from a complete `list_owned` of `entry` (the driver calls
    /// it at start and after each listing), so a restart finds each Proxy's instance from the
    /// hosts' marks. Only instances whose domain name matches their mark's UID are adopted;
    /// their marks' creation times become [`Controller::created_at`].
    ///
    /// A listing never moves a location this process already knows (a listing may be older
    /// than the create or get that set it): an instance listed on another host than its UID's
    /// location, or than the host its create in flight addresses, is noted as a second copy
    /// to remove once the Proxy is found at its location (see `strays`). When the UID has no
    /// location, its newest listed copy (by its mark's creation time; the first listed of
    /// equals) becomes it and any other is such a copy: a second copy is mostly what an
    /// earlier create left before the one in use was made elsewhere. Then, at the UID's next
    /// reconcile, a listed copy its Proxy's status names wins over the newest: the previous
    /// leadership term (or process) may still be sweeping the others, never that one.
    pub fn adopt(&self, entry: &str, owned: &[OwnedInstance]) {
        // NB: newest first (stable: the listing's order among equals), so the first copy of a
        // UID met below is the one adopted. O(listed · log listed), once per listing.
        let mut newest_first: Vec<&OwnedInstance> = owned.iter().collect();
        newest_first.sort_by_key(|o| std::cmp::Reverse(o.created_at));
        let mut st = lock(&self.inner.state);
        // UIDs whose location this listing chose: their other copies are kept as
        // alternatives for the UID's next reconcile (see `State::prefer_recorded_copy`).
        let mut chosen_here = std::collections::HashSet::new();
        for o in newest_first {
            if !o.name_matches_uid || o.id.entry != entry {
                continue;
            }
            let creating_on = st.objects.get(&o.uid).and_then(|s| match &s.op {
                Some(op) => match &op.kind {
                    OpKind::Create { entry, host, .. } => Some((entry.clone(), host.clone())),
                    OpKind::Delete { .. } => None,
                },
                None => None,
            });
            let here = (o.id.entry.as_str(), o.id.host.as_str());
            match st.locations.get(&o.uid) {
                Some(l) if (l.entry.as_str(), l.host.as_str()) == here => {
                    st.created.insert(o.uid, o.created_at);
                }
                Some(_) => {
                    if chosen_here.contains(&o.uid) {
                        st.adopted_alternatives
                            .entry(o.uid)
                            .or_default()
                            .push((o.id.clone(), o.created_at));
                    }
                    st.note_stray(o.uid, entry, &o.id.host)
                }
                None => match creating_on {
                    // The create's own result sets the location.
                    Some((e, h)) if (e.as_str(), h.as_str()) == here => {}
                    Some(_) => st.note_stray(o.uid, entry, &o.id.host),
                    None if st.sweeping_host(&o.uid, entry, &o.id.host) => {}
                    None => {
                        st.set_location(o.uid, o.id.clone());
                        st.created.insert(o.uid, o.created_at);
                        st.adopted_alternatives.remove(&o.uid);
                        chosen_here.insert(o.uid);
                    }
                },
            }
        }
    }

    /// When `uid`'s instance was created, when known: the creation time in its mark (from
    /// the last complete listing given to [`Controller::adopt`]), or the time a create of it
    /// finished in this process (the mark written by that create is at most one create's
    /// duration earlier; the next listing replaces it with the mark's own time). `None` before
    /// either, and once the instance was deleted.
    pub fn created_at(&self, uid: &ProxyUid) -> Option<SystemTime> {
        lock(&self.inner.state).created.get(uid).copied()
    }

    /// Image bytes transferred to hosts by this controller's creates since it was built (the
    /// sum of their imports' progress, fed as it happens). Monotonic.
    pub fn image_bytes(&self) -> u64 {
        self.inner.image_bytes.load(Ordering::Relaxed)
    }

    /// Records host health for placement (from `Provider::check()`): a host whose last report
    /// is not Ready is skipped while another host of the entry is usable, and so is a host
    /// whose declared-address pool the report shows exhausted for a family a Proxy needs;
    /// among equally loaded hosts, one with free addresses goes first. O(hosts reported ×
    /// log hosts), whatever the number of Proxies.
    pub fn record_host_reports(&self, entry: &str, reports: &[HostReport]) {
        let mut st = lock(&self.inner.state);
        let hosts = st.health.entry(entry.to_owned()).or_default();
        for r in reports {
            hosts.insert(r.host.clone(), r.state);
        }
        let now = SystemTime::now();
        let dead = st.dead_since.entry(entry.to_owned()).or_default();
        for r in reports {
            if crate::host_health::is_dead(Some(r.state)) {
                dead.entry(r.host.clone()).or_insert(now);
            } else {
                dead.remove(&r.host);
            }
        }
        let ready = st.ready_since.entry(entry.to_owned()).or_default();
        for r in reports {
            if r.state == egress_provider::model::HostState::Ready {
                ready.entry(r.host.clone()).or_insert(now);
            } else {
                ready.remove(&r.host);
            }
        }
        let reasons = st.host_reasons.entry(entry.to_owned()).or_default();
        for r in reports {
            match r.reason() {
                Some(why) => reasons.insert(r.host.clone(), why),
                None => reasons.remove(&r.host),
            };
        }
        for r in reports {
            st.set_address_room(entry, &r.host, AddressRoom::of(&r.addresses));
        }
    }

    /// Whether any entry's `access` (or a host's, or an address pool's) uses a
    /// `namespaceSelector`: only then does a driver need to read namespaces' labels.
    pub fn uses_namespace_selectors(&self) -> bool {
        self.providers().iter().any(|h| {
            let c = &h.config;
            let sel = |n: &Option<egress_provider::libvirt::config::Namespaces>| {
                n.as_ref().is_some_and(|n| n.namespace_selector.is_some())
            };
            c.access.as_ref().is_some_and(|a| {
                a.namespace_selector.is_some()
                    || sel(&a.url_images)
                    || sel(&a.internal_cidrs)
                    || sel(&a.address_pools)
            }) || c.hosts.iter().any(|host| {
                sel(&host.access) || host.address_pool.as_ref().is_some_and(|p| sel(&p.access))
            })
        })
    }

    /// The entry's `quotas.maxPoolReplicas`, when the entry exists.
    pub fn max_pool_replicas(&self, entry: &str) -> Option<u32> {
        self.providers()
            .get(entry)
            .map(|h| h.config.quotas.max_pool_replicas)
    }

    /// The hosts of `entry` in config order with their last recorded health report (what
    /// [`Controller::record_host_reports`] learnt), as the pool decision takes them; empty
    /// when the entry does not exist.
    pub fn pool_hosts(&self, entry: &str) -> Vec<crate::pool::PoolHost> {
        let providers = self.providers();
        let Some(h) = providers.get(entry) else {
            return Vec::new();
        };
        let st = lock(&self.inner.state);
        let states = st.health.get(entry);
        let dead = st.dead_since.get(entry);
        let ready = st.ready_since.get(entry);
        h.config
            .hosts
            .iter()
            .map(|host| crate::pool::PoolHost {
                name: host.name.clone(),
                state: states.and_then(|s| s.get(&host.name).copied()),
                maintenance: host.maintenance,
                dead_since: dead.and_then(|d| d.get(&host.name).copied()),
                ready_since: ready.and_then(|d| d.get(&host.name).copied()),
                segment: host.segment.clone(),
            })
            .collect()
    }

    /// The hosts of `entry` under maintenance (`maintenance:` not `None` in the config), each
    /// with how many Proxies' instances are on it now (located there or being created there):
    /// a host's drain progress. Empty when the entry does not exist or has none. O(hosts of
    /// the entry), one lock.
    pub fn hosts_in_maintenance(
        &self,
        entry: &str,
    ) -> Vec<(String, egress_provider::libvirt::config::Maintenance, usize)> {
        let providers = self.providers();
        let Some(h) = providers.get(entry) else {
            return Vec::new();
        };
        let out: Vec<_> = h
            .config
            .hosts
            .iter()
            .filter(|c| !c.maintenance.accepts_placements())
            .collect();
        if out.is_empty() {
            return Vec::new();
        }
        let st = lock(&self.inner.state);
        out.into_iter()
            .map(|c| (c.name.clone(), c.maintenance, st.load_on(entry, &c.name)))
            .collect()
    }

    /// The address the provider last reported for `uid`'s instance in this process: the
    /// address the provider verified (inside the host's guest subnets, the host's own answer
    /// winning over the guest's), kept while the instance runs without one (as the status
    /// keeps its last IP) and dropped once the instance is reported paused, stopped or gone,
    /// or the Proxy is forgotten. Probe health here, never at an address read back from a
    /// status someone else may have written (Kubernetes: `status.ip` in the API).
    pub fn verified_address(&self, uid: &ProxyUid) -> Option<IpAddr> {
        // finding: M22
        lock(&self.inner.verified).get(uid).copied()
    }

    /// The declared egress addresses `uid`'s instance holds from its host's address pool, as
    /// the provider last reported them to this process (a create's result or a `get`, read
    /// from the instance's mark): empty when it holds none, before any report, once the
    /// instance is gone or the Proxy is forgotten. The health check expects exactly these as
    /// the egress; take them from here, never from a status someone else may have written
    /// (Kubernetes: `status.egressAddress` in the API).
    pub fn declared_egress(&self, uid: &ProxyUid) -> Vec<IpAddr> {
        lock(&self.inner.declared)
            .get(uid)
            .cloned()
            .unwrap_or_default()
    }

    /// `status` with its `ip` replaced by [`Controller::verified_address`] when they differ
    /// (and its `ipSeenAt` dropped when there is none), and its `egressAddress` by
    /// [`Controller::declared_egress`] likewise: a status handed in may have been written by
    /// someone else (Kubernetes), and the last IP it carries is kept through an address gap
    /// and published, so only what the provider reported may stay in it.
    pub(super) fn trusted_status<'a>(
        &self,
        uid: &ProxyUid,
        status: &'a ProxyStatus,
    ) -> Cow<'a, ProxyStatus> {
        let verified = self.verified_address(uid);
        let stated = status.ip.as_deref().and_then(|s| s.parse::<IpAddr>().ok());
        let ip_ok = status.ip.is_none() || (stated.is_some() && stated == verified);
        let declared = if status.egress_address.is_empty() {
            None
        } else {
            let d: Vec<String> = self
                .declared_egress(uid)
                .iter()
                .map(ToString::to_string)
                .collect();
            (d != status.egress_address).then_some(d)
        };
        if ip_ok && declared.is_none() {
            return Cow::Borrowed(status);
        }
        let mut s = status.clone();
        if !ip_ok {
            s.ip = verified.map(|ip| ip.to_string());
            if verified.is_none() {
                s.ip_seen_at = None;
            }
        }
        if let Some(d) = declared {
            s.egress_address = d;
        }
        Cow::Owned(s)
    }

    /// Records what a `get` said about `uid`'s instance (`None`: it is gone).
    pub(super) fn note_observed(&self, uid: &ProxyUid, inst: Option<&Instance>) {
        self.inner.note_observed(uid, inst);
    }

    /// Forgets a Proxy the driver no longer tracks (e.g. its manifest vanished without a
    /// deletion): aborts its work in flight and drops its per-object state. Nothing on a host
    /// is touched (the orphan GC collects what is left).
    pub fn forget(&self, uid: &ProxyUid) {
        let mut st = lock(&self.inner.state);
        if let Some(o) = st.objects.remove(uid)
            && let Some(op) = o.op
        {
            op.abort.abort();
        }
        st.clear_location(uid);
        st.set_size(*uid, None);
        st.reservations.forget_all(uid);
        st.created.remove(uid);
        st.forget_waiter(uid);
        st.strays.remove(uid);
        st.adopted_alternatives.remove(uid);
        drop(st);
        lock(&self.inner.verified).remove(uid);
        lock(&self.inner.declared).remove(uid);
    }

    /// Counters for `/metrics`.
    pub fn metrics(&self) -> ControllerCounters {
        let in_flight = {
            let st = lock(&self.inner.state);
            let mut creates = 0u64;
            let mut deletes = 0u64;
            for o in st.objects.values() {
                match o.op.as_ref().map(|op| &op.kind) {
                    Some(OpKind::Create { .. }) if !op_finished(o.op.as_ref()) => creates += 1,
                    Some(OpKind::Delete { .. }) if !op_finished(o.op.as_ref()) => deletes += 1,
                    _ => {}
                }
            }
            (creates, deletes)
        };
        self.inner.counters.snapshot(in_flight.0, in_flight.1)
    }

    /// Stops starting new work and waits up to `grace` for creates and deletes in flight to
    /// finish; whatever is still running then is aborted (the provider's create is safe to
    /// drop: it never publishes a half-written base, and the next start converges).
    pub async fn shutdown(&self, grace: Duration) {
        self.inner.stopping.store(true, Ordering::SeqCst);
        self.inner.tracker.close();
        if tokio::time::timeout(grace, self.inner.tracker.wait())
            .await
            .is_err()
        {
            let st = lock(&self.inner.state);
            for o in st.objects.values() {
                if let Some(op) = &o.op {
                    op.abort.abort();
                }
            }
        }
    }
}
