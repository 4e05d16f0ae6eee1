//! The Proxy reconciler, shared by the Kubernetes and standalone drivers: a pure decision
//! function ([`decide`]) plus this thin executor ([`Controller`]).
//!
//! Pipeline of one [`Controller::reconcile`] call: read what is known (the in-memory state of
//! the Proxy's in-flight work, where its instance is, host loads and health; no network) →
//! observe the instance with one bounded `Provider::get` (network) → [`decide::decide`] (pure)
//! → act (spawn a create/replace/delete task; no network in the call itself) → report.
//!
//! Guarantees:
//! - One reconcile never takes longer than [`ControllerSettings::reconcile_deadline`]
//!   (finding APX-3); creates (which may import a 1 GiB image for many minutes) and deletes run
//!   as spawned tasks tracked per UID, each bounded by its own deadline; reconcile reports
//!   their progress and picks their result up later.
//! - Work on a host takes a slot of that host's `maxConcurrent` with a try-acquire, and reads
//!   of a host take a slot of a separate pool of the same size, so one frozen host holds at most
//!   its own slots and never a caller's worker beyond one reconcile deadline (finding H1).
//! - No lock is held across an `.await`; dropping a reconcile future is safe (spawned work
//!   continues and is picked up by the next reconcile).
//! - Every message put in a status or an event is redacted ([`crate::model::Condition`] does
//!   it; finding D5).
//! - Image bytes a create transfers are counted as its progress arrives
//!   ([`Controller::image_bytes`], a monotonic total a driver exports as a metric), so a long
//!   import shows its throughput while it runs, not only when it ends.

pub mod backoff;
pub mod decide;
#[cfg(test)]
mod decide_tests;
#[cfg(test)]
mod executor_tests;
pub mod limits;
pub mod metrics;
#[cfg(test)]
mod test_fixtures;
pub mod userdata;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use egress_provider::error::ProviderError;
use egress_provider::model::{
    CreateRequest, HostReport, HostState, Instance, OwnedInstance, Progress, ProviderId, ProxyUid,
};
use egress_provider::provider::Provider;
use tokio::task::AbortHandle;
use tokio_util::task::TaskTracker;

use crate::model::{ProxySpec, ProxyStatus};
use crate::providers::Providers;

use self::decide::{Action, Decision, HostInfo, Inputs, Memory, Observed, OpView};
use self::limits::HostLimits;
pub use self::metrics::ControllerCounters;
use self::metrics::Counters;

/// Default provisioning deadline (finding APX-1).
// NB: a TCG guest (no KVM) boots a cloud image and runs cloud-init in 1–3 minutes; package
// installs on first boot can add several more. 15 minutes is well past a slow first boot and
// short enough that a stuck VM is noticed within one coffee break.
pub const DEFAULT_PROVISIONING_DEADLINE: Duration = Duration::from_secs(15 * 60);
/// Default bound on one reconcile call (finding APX-3).
// NB: one reconcile makes at most one provider `get` (a handful of libvirt calls, normally
// < 100 ms over SSH); creates and deletes are spawned. 30 s leaves room for a slow SSH dial
// (the entry's dial timeout defaults to 10 s) and still frees a worker quickly.
pub const DEFAULT_RECONCILE_DEADLINE: Duration = Duration::from_secs(30);
/// Default first retry delay after a failure (finding APX-2).
// NB: most transient libvirt failures (a dropped SSH link, a busy daemon) clear within seconds.
pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_secs(5);
/// Default longest retry delay (finding APX-2).
// NB: 5 minutes keeps a host that is down for hours from being hammered while a fix is still
// picked up within minutes; 5 s doubling reaches it after 7 failures.
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(5 * 60);
/// Default time the last known IP is kept while an instance reports no address (finding H3).
// NB: a guest agent restart or a DHCP renewal hides the address for a few seconds; a minute
// covers those without hiding a real loss for long.
pub const DEFAULT_IP_GRACE: Duration = Duration::from_secs(60);
/// Default poll interval of a Running proxy.
// NB: state changes also arrive with the driver's own resyncs; one get per proxy per minute is
// cheap (1000 proxies: ~17 gets/s across all hosts).
pub const DEFAULT_POLL_RUNNING: Duration = Duration::from_secs(60);
/// Default poll interval while provisioning (create running, or waiting for an address).
// NB: cloud-init reports an address ~40 s after start on TCG; 5 s polls see it promptly.
pub const DEFAULT_POLL_PROVISIONING: Duration = Duration::from_secs(5);
/// Longest a delete of one instance on one host may take before it is reported failed.
// NB: destroy + undefine + two volume deletes are a handful of calls; 2 minutes covers a
// slow host, and a frozen one is given up on (and retried with backoff) after that.
pub const DELETE_DEADLINE: Duration = Duration::from_secs(120);
/// Slack added to an entry's own timeouts to bound a whole create.
// NB: a create is an import (bounded by `timeouts.imageImport`), a start (`timeouts.start`)
// and a few dozen calls (each bounded by `timeouts.call`); this covers the calls in between.
pub const CREATE_SLACK: Duration = Duration::from_secs(120);
/// Number of `timeouts.call` budgets a create's own calls may take beside import and start.
// NB: lock, capability probe, pool refresh, volume creates, seed upload, define, start: ~10
// sequential calls, each bounded by `timeouts.call`.
pub const CREATE_CALL_BUDGETS: u32 = 10;
/// Load added, in the placement's view, to a host whose work slots are all taken.
// NB: placement picks the least loaded host; without this a Proxy refused on a full host is
// placed there again while another host has a free slot, and waits for its next poll. 2^20 is
// above any real number of proxies on one host, so every host that can start work now sorts
// first, and full hosts keep their order by real load among themselves.
const FULL_HOST_LOAD: usize = 1 << 20;
/// Share of the reconcile deadline a provider `get` may use (numerator / denominator).
// NB: three quarters leaves the rest for deciding and reporting; the outer deadline still
// bounds the whole call.
const GET_SHARE: (u32, u32) = (3, 4);

/// How the controller tells its driver that a Proxy's reconcile can make progress now: its
/// create or delete finished, or a host slot it was refused freed up. The driver queues the
/// UID (e.g. standalone's de-duplicating work queue); it must not block. See
/// [`Controller::set_waker`].
pub type Waker = Arc<dyn Fn(ProxyUid) + Send + Sync>;

/// What a driver knows about one Proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyObject {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The Proxy's UID (names and marks derive from it).
    pub uid: ProxyUid,
    /// The spec generation (a change releases a latched Permanent failure).
    pub generation: i64,
    /// What the user wants.
    pub spec: ProxySpec,
    /// The user removed it; finalize (delete the instance, then report `finalized`).
    pub deleting: bool,
    /// The credentials `spec.proxy.credentialsRef` resolves to, when it names any.
    pub credentials: Option<ProxyCredentials>,
}

/// Proxy credentials (basic auth for HTTP, username/password for SOCKS5). `Debug` redacts
/// the password so it never reaches a log line.
#[derive(Clone, PartialEq, Eq)]
pub struct ProxyCredentials {
    /// User name.
    pub username: String,
    /// Password.
    pub password: String,
}

impl fmt::Debug for ProxyCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyCredentials")
            .field("username", &self.username)
            .field("password", &"REDACTED")
            .finish()
    }
}

/// How the controller behaves; [`Default`] gives the documented constants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerSettings {
    /// How long an instance may take from the start of a create to reporting an address
    /// (finding APX-1).
    pub provisioning_deadline: Duration,
    /// Bound on one [`Controller::reconcile`] call (finding APX-3).
    pub reconcile_deadline: Duration,
    /// First retry delay after a failure (finding APX-2).
    pub backoff_base: Duration,
    /// Longest retry delay (finding APX-2).
    pub backoff_max: Duration,
    /// How long the last known IP is kept through a Provisioning gap (finding H3).
    pub ip_grace: Duration,
    /// Poll interval of a Running proxy.
    pub poll_running: Duration,
    /// Poll interval while provisioning.
    pub poll_provisioning: Duration,
    /// On an expired provisioning deadline: replace the instance (true) or report the Proxy
    /// Failed and wait for a spec or config change (false).
    pub replace_on_deadline: bool,
}

impl Default for ControllerSettings {
    fn default() -> Self {
        Self {
            provisioning_deadline: DEFAULT_PROVISIONING_DEADLINE,
            reconcile_deadline: DEFAULT_RECONCILE_DEADLINE,
            backoff_base: DEFAULT_BACKOFF_BASE,
            backoff_max: DEFAULT_BACKOFF_MAX,
            ip_grace: DEFAULT_IP_GRACE,
            poll_running: DEFAULT_POLL_RUNNING,
            poll_provisioning: DEFAULT_POLL_PROVISIONING,
            // NB: replacing is what a user of an egress pool wants (a new VM usually boots);
            // Failed is for debugging a bad image.
            replace_on_deadline: true,
        }
    }
}

/// What one reconcile concluded.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The status to write (redacted messages).
    pub status: ProxyStatus,
    /// When to reconcile again; `None`: only on a change (spec, config) or a resync.
    pub requeue_after: Option<Duration>,
    /// Events to publish (redacted messages).
    pub events: Vec<Event>,
    /// The Proxy was being deleted and nothing is left on any host: the driver may forget it.
    pub finalized: bool,
}

/// An event's kind, as in Kubernetes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// Something expected happened.
    Normal,
    /// Something needs attention.
    Warning,
}

/// An event about a Proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Normal or Warning.
    pub kind: EventKind,
    /// A stable CamelCase reason.
    pub reason: String,
    /// Redacted, bounded message.
    pub message: String,
}

impl Event {
    /// An event whose message is redacted and truncated like a condition's (finding D5).
    pub fn new(kind: EventKind, reason: &str, message: &str) -> Self {
        Self {
            kind,
            reason: reason.to_owned(),
            message: crate::model::truncate(
                &egress_provider::error::redact(message),
                crate::model::MAX_MESSAGE_CHARS,
            ),
        }
    }
}

/// Progress of one create, readable while it runs.
#[derive(Debug, Default)]
struct ProgressCell {
    done: AtomicU64,
    /// `u64::MAX` = unknown.
    total: AtomicU64,
    seen: AtomicBool,
    /// The controller's running total of image bytes, fed with each update's increase.
    image_bytes: Option<Arc<AtomicU64>>,
}

impl Progress for ProgressCell {
    fn update(&self, done: u64, total: Option<u64>) {
        let before = self.done.swap(done, Ordering::Relaxed);
        if let Some(sum) = &self.image_bytes {
            // `done` is cumulative per transfer; a smaller value is a new transfer from 0.
            let added = if done >= before { done - before } else { done };
            sum.fetch_add(added, Ordering::Relaxed);
        }
        self.total
            .store(total.unwrap_or(u64::MAX), Ordering::Relaxed);
        self.seen.store(true, Ordering::Relaxed);
    }
}

impl ProgressCell {
    fn snapshot(&self) -> Option<(u64, Option<u64>)> {
        if !self.seen.load(Ordering::Relaxed) {
            return None;
        }
        let total = self.total.load(Ordering::Relaxed);
        Some((
            self.done.load(Ordering::Relaxed),
            (total != u64::MAX).then_some(total),
        ))
    }
}

/// What a finished op left for the next reconcile.
#[derive(Debug)]
enum OpResult {
    Created(Result<Instance, ProviderError>),
    Deleted(Result<(), ProviderError>),
}

#[derive(Debug, Clone)]
enum OpKind {
    Create { host: String, image: String },
    Delete { hosts: Vec<String> },
}

/// One spawned create/replace/delete of a UID.
struct RunningOp {
    kind: OpKind,
    started: SystemTime,
    progress: Arc<ProgressCell>,
    result: Arc<Mutex<Option<OpResult>>>,
    abort: AbortHandle,
}

#[derive(Default)]
struct ObjState {
    memory: Memory,
    op: Option<RunningOp>,
}

#[derive(Default)]
struct State {
    objects: HashMap<ProxyUid, ObjState>,
    /// Where each UID's instance is, from adoption, creates and gets.
    locations: HashMap<ProxyUid, ProviderId>,
    /// Last reported health per (entry, host).
    health: HashMap<(String, String), HostState>,
    /// When each UID's instance was created: its mark's time from a listing, or when a
    /// create of it succeeded in this process.
    created: HashMap<ProxyUid, SystemTime>,
    /// UIDs refused a work slot, per (entry, host), oldest first, with whether the Proxy is
    /// pinned to that host; each UID at most once per host (bounded by the number of
    /// Proxies). A freed slot wakes a waiter (see [`State::take_waiter`]).
    waiting: HashMap<(String, String), VecDeque<(ProxyUid, bool)>>,
}

impl State {
    fn wait_for_slot(&mut self, entry: &str, host: &str, uid: ProxyUid, pinned: bool) {
        let q = self
            .waiting
            .entry((entry.to_owned(), host.to_owned()))
            .or_default();
        if !q.iter().any(|(u, _)| *u == uid) {
            q.push_back((uid, pinned));
        }
    }

    /// The waiter to wake for a freed slot on `host`: the oldest refused on that host, else
    /// the oldest unpinned one refused on another host of the entry (placement sends it to a
    /// host with a free slot, see [`FULL_HOST_LOAD`]); a pinned Proxy is only woken for its
    /// own host, where it can use the slot.
    fn take_waiter(&mut self, entry: &str, host: &str) -> Option<ProxyUid> {
        let key = (entry.to_owned(), host.to_owned());
        let own = self.waiting.get_mut(&key).and_then(VecDeque::pop_front);
        let found = own.map(|(u, _)| u).or_else(|| {
            self.waiting
                .iter_mut()
                .filter(|((e, _), _)| e == entry)
                .find_map(|(_, q)| {
                    let i = q.iter().position(|(_, pinned)| !pinned)?;
                    q.remove(i).map(|(u, _)| u)
                })
        });
        self.waiting.retain(|_, q| !q.is_empty());
        found
    }

    fn forget_waiter(&mut self, uid: &ProxyUid) {
        self.waiting.retain(|_, q| {
            q.retain(|(u, _)| u != uid);
            !q.is_empty()
        });
    }
}

struct Inner {
    providers: RwLock<Arc<Providers>>,
    settings: ControllerSettings,
    state: Mutex<State>,
    limits: HostLimits,
    counters: Counters,
    tracker: TaskTracker,
    stopping: AtomicBool,
    /// Image bytes transferred by creates (their imports' progress), since start.
    image_bytes: Arc<AtomicU64>,
    /// The driver's waker, when it set one.
    waker: RwLock<Option<Waker>>,
}

impl Inner {
    /// Wakes `uids` through the driver's waker (no lock of ours is held while it runs).
    fn wake(&self, uids: impl IntoIterator<Item = ProxyUid>) {
        let w = self
            .waker
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if let Some(w) = w {
            for u in uids {
                w(u);
            }
        }
    }
}

/// The reconciler's executor. `Send + Sync`; share it in an `Arc` between workers.
pub struct Controller {
    inner: Arc<Inner>,
}

impl fmt::Debug for Controller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Controller")
            .field("settings", &self.inner.settings)
            .finish_non_exhaustive()
    }
}

/// Locks a std mutex, recovering the data if a panicking thread poisoned it (the state is
/// plain data and every update leaves it consistent).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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
            }),
        }
    }

    /// Sets the driver's waker: called with a Proxy's UID when its create or delete finished
    /// (so the result is picked up at once rather than at the next poll), and with the
    /// oldest UIDs refused a work slot on a host when that host's slots free up. Without a
    /// waker, those Proxies are reconciled at their requeue time as before; with one, they
    /// still are (waking only brings a reconcile forward).
    pub fn set_waker(&self, waker: Waker) {
        *self
            .inner
            .waker
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(waker);
    }

    /// Replaces the providers after a config reload. Work in flight keeps the provider it
    /// started with; latched failures of an entry whose digest changed are released on the
    /// next reconcile.
    pub fn set_providers(&self, providers: Arc<Providers>) {
        let mut p = self
            .inner
            .providers
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *p = providers;
    }

    fn providers(&self) -> Arc<Providers> {
        self.inner
            .providers
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Learns where instances are from a complete `list_owned` of `entry` (the driver calls
    /// it at start and after each listing), so a restart finds each Proxy's instance from the
    /// hosts' marks. Only instances whose domain name matches their mark's UID are adopted;
    /// their marks' creation times become [`Controller::created_at`].
    pub fn adopt(&self, entry: &str, owned: &[OwnedInstance]) {
        let mut st = lock(&self.inner.state);
        for o in owned {
            if o.name_matches_uid && o.id.entry == entry {
                st.locations.insert(o.uid, o.id.clone());
                st.created.insert(o.uid, o.created_at);
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
    /// is not Ready is skipped while another host of the entry is usable.
    pub fn record_host_reports(&self, entry: &str, reports: &[HostReport]) {
        let mut st = lock(&self.inner.state);
        for r in reports {
            st.health
                .insert((entry.to_owned(), r.host.clone()), r.state);
        }
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
        st.locations.remove(uid);
        st.created.remove(uid);
        st.forget_waiter(uid);
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

    /// One reconcile of `obj`, never longer than `settings.reconcile_deadline` (finding
    /// APX-3). `status` is the Proxy's current status; `now` is the wall clock (tests pass a
    /// fixed one).
    pub async fn reconcile(
        &self,
        obj: &ProxyObject,
        status: &ProxyStatus,
        now: SystemTime,
    ) -> Outcome {
        let deadline = self.inner.settings.reconcile_deadline;
        self.inner
            .counters
            .reconciles
            .fetch_add(1, Ordering::Relaxed);
        match tokio::time::timeout(deadline, self.reconcile_inner(obj, status, now)).await {
            Ok(o) => o,
            Err(_) => {
                self.inner
                    .counters
                    .reconcile_timeouts
                    .fetch_add(1, Ordering::Relaxed);
                let failures = {
                    let mut st = lock(&self.inner.state);
                    let o = st.objects.entry(obj.uid).or_default();
                    o.memory.failures = o.memory.failures.saturating_add(1);
                    o.memory.failures
                };
                decide::reconcile_timed_out(obj, status, now, &self.inner.settings, failures)
            }
        }
    }

    async fn reconcile_inner(
        &self,
        obj: &ProxyObject,
        status: &ProxyStatus,
        now: SystemTime,
    ) -> Outcome {
        let settings = &self.inner.settings;
        let providers = self.providers();
        // A Proxy being deleted is deleted where its instance is, even if spec.provider was
        // edited since (the edit itself is refused by `decide`).
        let known_entry = if obj.deleting {
            lock(&self.inner.state)
                .locations
                .get(&obj.uid)
                .map(|l| l.entry.clone())
                .or_else(|| {
                    status
                        .provider_id
                        .as_deref()
                        .and_then(|s| s.parse::<ProviderId>().ok())
                        .map(|id| id.entry)
                })
        } else {
            None
        };
        let handle = known_entry
            .and_then(|e| providers.get(&e).cloned())
            .or_else(|| providers.get(&obj.spec.provider).cloned());

        // Read what is known (no network).
        let (memory, op_view, location, hosts) = {
            let mut st = lock(&self.inner.state);
            let location = st.locations.get(&obj.uid).cloned().or_else(|| {
                status
                    .provider_id
                    .as_deref()
                    .and_then(|s| s.parse::<ProviderId>().ok())
            });
            let hosts = handle
                .as_ref()
                .map(|h| {
                    let mut view = host_view(
                        &st,
                        &h.config.name,
                        h.config.hosts.iter().map(|c| c.name.as_str()),
                    );
                    // Placement prefers a host that can start the work now (see
                    // FULL_HOST_LOAD); the order by real load is kept within each group.
                    for c in &h.config.hosts {
                        if self.inner.limits.work_available(
                            &h.config.name,
                            &c.name,
                            c.max_concurrent,
                        ) == 0
                            && let Some(hi) = view.get_mut(&c.name)
                        {
                            hi.load = hi.load.saturating_add(FULL_HOST_LOAD);
                        }
                    }
                    view
                })
                .unwrap_or_default();
            let o = st.objects.entry(obj.uid).or_default();
            let op_view = take_op_view(o);
            (o.memory.clone(), op_view, location, hosts)
        };

        // Observe (network: one bounded get), only when nothing is in flight.
        let observed = match (&handle, &location, &op_view) {
            (Some(h), Some(id), OpView::Idle) if !obj.deleting && id.entry == h.config.name => {
                self.observe(h.provider.clone(), &h.config, id, &obj.uid)
                    .await
            }
            _ => Observed::Unknown,
        };
        if let Observed::GetFailed(e) = &observed {
            self.inner.counters.count_error(e.class);
        }

        let entry = handle.as_ref().map(|h| decide::EntryView {
            config: &h.config,
            config_digest: &h.config_digest,
        });
        let d = decide::decide(&Inputs {
            obj,
            status,
            entry: entry.as_ref(),
            location: location.as_ref(),
            observed: &observed,
            op: &op_view,
            hosts: &hosts,
            memory: &memory,
            now,
            settings,
        });
        self.act(obj, handle.as_ref(), d, now)
    }

    async fn observe(
        &self,
        provider: Arc<dyn Provider>,
        entry: &egress_provider::libvirt::config::LibvirtEntry,
        id: &ProviderId,
        uid: &ProxyUid,
    ) -> Observed {
        let max = entry
            .hosts
            .iter()
            .find(|h| h.name == id.host)
            .map_or(1, |h| h.max_concurrent);
        let Some(_permit) = self.inner.limits.try_read(&id.entry, &id.host, max) else {
            self.inner
                .counters
                .host_busy
                .fetch_add(1, Ordering::Relaxed);
            return Observed::HostBusy(id.host.clone());
        };
        let (num, den) = GET_SHARE;
        let budget = self.inner.settings.reconcile_deadline * num / den;
        match tokio::time::timeout(budget, provider.get(id, uid)).await {
            Ok(Ok(inst)) => {
                lock(&self.inner.state)
                    .locations
                    .insert(*uid, inst.id.clone());
                Observed::Found(inst)
            }
            Ok(Err(e)) if e.is_not_found() => {
                let mut st = lock(&self.inner.state);
                st.locations.remove(uid);
                st.created.remove(uid);
                drop(st);
                Observed::NotFound
            }
            Ok(Err(e)) => Observed::GetFailed(e),
            Err(_) => Observed::GetFailed(ProviderError::transient(format!(
                "reading instance {id} did not finish within {}s (host {} may be unreachable)",
                budget.as_secs(),
                id.host
            ))),
        }
    }

    /// Performs the decision's action (no network here: work is spawned) and builds the
    /// outcome.
    fn act(
        &self,
        obj: &ProxyObject,
        handle: Option<&crate::providers::ProviderHandle>,
        d: Decision,
        now: SystemTime,
    ) -> Outcome {
        let Decision {
            action,
            mut status,
            mut requeue_after,
            mut events,
            memory,
            finalized,
        } = d;
        let settings = &self.inner.settings;
        let mut st = lock(&self.inner.state);
        if finalized {
            if let Some(o) = st.objects.remove(&obj.uid)
                && let Some(op) = o.op
            {
                op.abort.abort();
            }
            st.locations.remove(&obj.uid);
            st.created.remove(&obj.uid);
            st.forget_waiter(&obj.uid);
            return Outcome {
                status,
                requeue_after,
                events,
                finalized,
            };
        }
        let o = st.objects.entry(obj.uid).or_default();
        o.memory = memory;
        let stopping = self.inner.stopping.load(Ordering::SeqCst);
        // A host whose work slots were all taken: this UID waits for one to free up. (The
        // state lock is held from the try-acquire to the registration, and a finishing op
        // frees its slot before taking waiters under the same lock, so no wake-up is lost.)
        let mut wait_on: Option<(String, String, bool)> = None;
        match action {
            Action::None => {}
            Action::Cancel => {
                if let Some(op) = o.op.take() {
                    op.abort.abort();
                }
            }
            Action::Create { req, replace } => {
                if let Some(h) = handle {
                    if stopping {
                        status = decide::shutting_down(status, obj, now);
                        requeue_after = Some(settings.poll_provisioning);
                    } else {
                        let max = h.host(&req.host).map_or(1, |c| c.max_concurrent);
                        match self.inner.limits.try_work(&h.config.name, &req.host, max) {
                            None => {
                                self.inner
                                    .counters
                                    .host_busy
                                    .fetch_add(1, Ordering::Relaxed);
                                status = decide::host_busy(status, obj, &req.host, now);
                                requeue_after = Some(settings.poll_provisioning);
                                events.retain(|e| e.kind == EventKind::Warning);
                                wait_on = Some((
                                    h.config.name.clone(),
                                    req.host.clone(),
                                    obj.spec.host.is_some(),
                                ));
                            }
                            Some(permit) => {
                                if let Some(old) = o.op.take() {
                                    old.abort.abort();
                                }
                                let deadline = create_deadline(&h.config.timeouts);
                                o.op = Some(self.spawn_create(
                                    h.provider.clone(),
                                    h.config.name.clone(),
                                    req,
                                    replace,
                                    permit,
                                    deadline,
                                    now,
                                ));
                            }
                        }
                    }
                }
            }
            Action::Delete { .. } if stopping => {
                status = decide::shutting_down(status, obj, now);
                requeue_after = Some(settings.poll_provisioning);
            }
            Action::Delete { hosts } => {
                if let Some(old) = o.op.take() {
                    old.abort.abort();
                }
                if let Some(h) = handle {
                    let mut permits = Vec::new();
                    let mut busy = None;
                    for host in &hosts {
                        let max = h.host(host).map_or(1, |c| c.max_concurrent);
                        match self.inner.limits.try_work(&h.config.name, host, max) {
                            Some(p) => permits.push(p),
                            None => {
                                busy = Some(host.clone());
                                break;
                            }
                        }
                    }
                    if let Some(host) = busy {
                        self.inner
                            .counters
                            .host_busy
                            .fetch_add(1, Ordering::Relaxed);
                        status = decide::host_busy(status, obj, &host, now);
                        requeue_after = Some(settings.poll_provisioning);
                        // A delete must run where the instance is: treat it as pinned.
                        wait_on = Some((h.config.name.clone(), host, true));
                    } else {
                        o.op = Some(self.spawn_delete(
                            h.provider.clone(),
                            h.config.name.clone(),
                            obj.uid,
                            hosts,
                            permits,
                            now,
                        ));
                    }
                }
            }
        }
        if let Some((entry, host, pinned)) = wait_on {
            st.wait_for_slot(&entry, &host, obj.uid, pinned);
        }
        Outcome {
            status,
            requeue_after,
            events,
            finalized,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn spawn_create(
        &self,
        provider: Arc<dyn Provider>,
        entry: String,
        req: CreateRequest,
        replace: bool,
        permit: limits::Slot,
        deadline: Duration,
        now: SystemTime,
    ) -> RunningOp {
        let progress = Arc::new(ProgressCell {
            image_bytes: Some(Arc::clone(&self.inner.image_bytes)),
            ..ProgressCell::default()
        });
        let result = Arc::new(Mutex::new(None));
        let kind = OpKind::Create {
            host: req.host.clone(),
            image: req.image.clone(),
        };
        let inner = self.inner.clone();
        let (p, r) = (progress.clone(), result.clone());
        inner
            .counters
            .creates_started
            .fetch_add(1, Ordering::Relaxed);
        if replace {
            inner.counters.replacements.fetch_add(1, Ordering::Relaxed);
        }
        let task = self.inner.tracker.spawn(async move {
            let work = async {
                if replace {
                    provider.delete(&req.host, &req.uid).await?;
                }
                provider.create(&req, &*p).await
            };
            let res = match tokio::time::timeout(deadline, work).await {
                Ok(r) => r,
                Err(_) => Err(ProviderError::transient(format!(
                    "create on host {} did not finish within {}s",
                    req.host,
                    deadline.as_secs()
                ))),
            };
            match &res {
                Ok(inst) => {
                    inner
                        .counters
                        .creates_succeeded
                        .fetch_add(1, Ordering::Relaxed);
                    let mut st = lock(&inner.state);
                    st.locations.insert(req.uid, inst.id.clone());
                    st.created.insert(req.uid, SystemTime::now());
                }
                Err(e) => {
                    inner
                        .counters
                        .creates_failed
                        .fetch_add(1, Ordering::Relaxed);
                    inner.counters.count_error(e.class);
                }
            }
            *lock(&r) = Some(OpResult::Created(res));
            // Free the slot first, then pick its next user (see `act`).
            drop(permit);
            let waiter = lock(&inner.state).take_waiter(&entry, &req.host);
            inner.wake(std::iter::once(req.uid).chain(waiter));
        });
        RunningOp {
            kind,
            started: now,
            progress,
            result,
            abort: task.abort_handle(),
        }
    }

    fn spawn_delete(
        &self,
        provider: Arc<dyn Provider>,
        entry: String,
        uid: ProxyUid,
        hosts: Vec<String>,
        permits: Vec<limits::Slot>,
        now: SystemTime,
    ) -> RunningOp {
        let result = Arc::new(Mutex::new(None));
        let inner = self.inner.clone();
        let r = result.clone();
        inner
            .counters
            .deletes_started
            .fetch_add(1, Ordering::Relaxed);
        let hs = hosts.clone();
        let task = self.inner.tracker.spawn(async move {
            // NB: hosts are deleted concurrently so one frozen host delays the result by one
            // DELETE_DEADLINE, not one per host.
            let calls = hs.iter().map(|h| {
                let provider = provider.clone();
                async move {
                    match tokio::time::timeout(DELETE_DEADLINE, provider.delete(h, &uid)).await {
                        Ok(r) => r,
                        Err(_) => Err(ProviderError::transient(format!(
                            "delete on host {h} did not finish within {}s",
                            DELETE_DEADLINE.as_secs()
                        ))),
                    }
                }
            });
            let results = futures_util::future::join_all(calls).await;
            let res = results
                .into_iter()
                .find_map(Result::err)
                .map_or(Ok(()), Err);
            match &res {
                Ok(()) => {
                    let mut st = lock(&inner.state);
                    st.locations.remove(&uid);
                    st.created.remove(&uid);
                }
                Err(e) => inner.counters.count_error(e.class),
            }
            *lock(&r) = Some(OpResult::Deleted(res));
            // Free the slots first, then pick their next users (see `act`).
            drop(permits);
            let mut wake = vec![uid];
            {
                let mut st = lock(&inner.state);
                for h in &hs {
                    wake.extend(st.take_waiter(&entry, h));
                }
            }
            inner.wake(wake);
        });
        RunningOp {
            kind: OpKind::Delete { hosts },
            started: now,
            progress: Arc::new(ProgressCell::default()),
            result,
            abort: task.abort_handle(),
        }
    }
}

fn op_finished(op: Option<&RunningOp>) -> bool {
    op.is_some_and(|op| op.abort.is_finished() || lock(&op.result).is_some())
}

/// The in-flight op as the decision sees it; a finished op's result is taken (once).
fn take_op_view(o: &mut ObjState) -> OpView {
    let Some(op) = &o.op else {
        return OpView::Idle;
    };
    let mut finished = lock(&op.result).take();
    if finished.is_none() && op.abort.is_finished() {
        // Aborted (or panicked) without a result: report it like a failure.
        let e = ProviderError::transient("the operation was interrupted before it finished");
        finished = Some(match op.kind {
            OpKind::Create { .. } => OpResult::Created(Err(e)),
            OpKind::Delete { .. } => OpResult::Deleted(Err(e)),
        });
    }
    match finished {
        Some(res) => {
            let kind = op.kind.clone();
            o.op = None;
            match (res, kind) {
                (OpResult::Created(result), OpKind::Create { host, .. }) => {
                    OpView::CreateFinished { host, result }
                }
                (OpResult::Deleted(result), _) => OpView::DeleteFinished { result },
                (OpResult::Created(result), OpKind::Delete { hosts }) => OpView::CreateFinished {
                    host: hosts.first().cloned().unwrap_or_default(),
                    result,
                },
            }
        }
        None => match &op.kind {
            OpKind::Create { host, image } => OpView::Creating {
                host: host.clone(),
                image: image.clone(),
                started: op.started,
                progress: op.progress.snapshot(),
            },
            OpKind::Delete { hosts } => OpView::Deleting {
                hosts: hosts.clone(),
            },
        },
    }
}

/// Loads (instances known + creates in flight) and health of `entry`'s hosts.
fn host_view<'a>(
    st: &State,
    entry: &str,
    hosts: impl Iterator<Item = &'a str>,
) -> BTreeMap<String, HostInfo> {
    let mut view: BTreeMap<String, HostInfo> = hosts
        .map(|h| {
            (
                h.to_owned(),
                HostInfo {
                    load: 0,
                    health: st.health.get(&(entry.to_owned(), h.to_owned())).copied(),
                },
            )
        })
        .collect();
    let mut counted: std::collections::HashSet<ProxyUid> = std::collections::HashSet::new();
    for (uid, o) in &st.objects {
        if let Some(RunningOp {
            kind: OpKind::Create { host, .. },
            ..
        }) = &o.op
            && let Some(hi) = view.get_mut(host)
        {
            hi.load += 1;
            counted.insert(*uid);
        }
    }
    for (uid, id) in &st.locations {
        if id.entry == entry
            && !counted.contains(uid)
            && let Some(hi) = view.get_mut(&id.host)
        {
            hi.load += 1;
        }
    }
    view
}

/// Bound on a whole create from the entry's own timeouts.
fn create_deadline(t: &egress_provider::libvirt::config::Timeouts) -> Duration {
    t.image_import
        .saturating_add(t.start)
        .saturating_add(t.call.saturating_mul(CREATE_CALL_BUDGETS))
        .saturating_add(CREATE_SLACK)
}
