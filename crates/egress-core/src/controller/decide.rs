//! The reconcile decision: a pure function of (Proxy, current status, what is known about its
//! instance, host loads and health, the in-flight op, the clock, settings, config digest) →
//! (action, new status, requeue, events). No I/O, no clock reads, no randomness: every rule
//! is a table-driven unit test below.
//!
//! Guarantees (each closed by a tagged test):
//! - A provisioning attempt that outlives `provisioning_deadline` gets a condition naming
//!   what is missing (no address / not running / create still in progress) and is replaced
//!   or reported Failed per `replace_on_deadline` (finding APX-1).
//! - Transient failures set `Ready=False` with a reason and the redacted message, keep the
//!   phase and the IP, never latch, and requeue with per-object exponential backoff capped at
//!   `backoff_max` (finding APX-2).
//! - Permanent failures latch (no action, no requeue) until the generation or the entry's
//!   config digest changes.
//! - A Stopped instance is replaced only when its verified UID is this Proxy's (finding M2);
//!   a Paused one is never destroyed (finding M1); a vanished one is recreated.
//! - Deletion deletes by UID even with no providerID: on the known host, or on every host of
//!   the entry when none is known (finding M3).
//! - The last known IP survives a Provisioning gap shorter than `ip_grace` (finding H3).
//! - Spec errors, an unknown entry, an unknown host pin, an image outside the catalogue and
//!   sizes over the entry's limits are Permanent conditions naming the field path and value;
//!   sizes come from the entry's `defaults` with checked arithmetic (finding L20).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use egress_provider::error::{ErrorClass, ProviderError};
use egress_provider::libvirt::config::LibvirtEntry;
use egress_provider::libvirt::image::source::is_url;
use egress_provider::model::{CreateRequest, HostState, Instance, InstanceState, ProviderId};

use super::backoff::backoff;
use super::userdata;
use super::{ControllerSettings, Event, EventKind, Outcome, ProxyObject};
use crate::model::{Condition, ConditionStatus, Phase, ProxyStatus, condition};

/// Stable condition/event reasons.
pub mod reason {
    /// A create is running.
    pub const CREATING: &str = "Creating";
    /// The instance exists.
    pub const CREATED: &str = "Created";
    /// Running with an address.
    pub const RUNNING: &str = "Running";
    /// Running, no address yet.
    pub const WAITING_FOR_ADDRESS: &str = "WaitingForAddress";
    /// Address briefly missing; last one kept (H3).
    pub const ADDRESS_GAP: &str = "AddressGap";
    /// The host has no free work slot.
    pub const HOST_BUSY: &str = "HostBusy";
    /// The spec is invalid for this provider entry.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// The credentials the spec references are not available (yet).
    pub const CREDENTIALS_MISSING: &str = "CredentialsMissing";
    /// A transient provider failure.
    pub const TRANSIENT_ERROR: &str = "TransientError";
    /// A permanent provider failure.
    pub const PERMANENT_ERROR: &str = "PermanentError";
    /// The host lacks capacity.
    pub const QUOTA_EXCEEDED: &str = "QuotaExceeded";
    /// No host of the entry accepts new proxies (unhealthy, or its pool below the reserve).
    pub const NO_USABLE_HOST: &str = "NoUsableHost";
    /// The provisioning deadline passed (APX-1).
    pub const PROVISIONING_TIMEOUT: &str = "ProvisioningTimeout";
    /// The hypervisor paused the instance (M1).
    pub const PAUSED: &str = "Paused";
    /// The instance stopped and is being replaced.
    pub const REPLACING: &str = "Replacing";
    /// The instance vanished and is being recreated.
    pub const INSTANCE_LOST: &str = "InstanceLost";
    /// The instance's verified UID is not this Proxy's (M2).
    pub const FOREIGN_INSTANCE: &str = "ForeignInstance";
    /// Deleting the instance.
    pub const DELETING: &str = "Deleting";
    /// Nothing is left on any host.
    pub const DELETED: &str = "Deleted";
    /// One reconcile hit its deadline (APX-3).
    pub const RECONCILE_TIMEOUT: &str = "ReconcileTimeout";
    /// The controller is shutting down and starts no new work.
    pub const SHUTTING_DOWN: &str = "ShuttingDown";
    /// A latched failure was released by a spec or config change.
    pub const RETRYING: &str = "Retrying";
}

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// What is known about the Proxy's instance this time.
#[derive(Debug, Clone, PartialEq)]
pub enum Observed {
    /// Not looked up (no location known, or work in flight, or deleting).
    Unknown,
    /// `get` found it (mark verified by the provider).
    Found(Instance),
    /// `get` says it does not exist.
    NotFound,
    /// `get` failed.
    GetFailed(ProviderError),
    /// The host's read slots were all taken; not looked up (H1).
    HostBusy(String),
}

/// The Proxy's in-flight work, as the executor tracks it.
#[derive(Debug, Clone, PartialEq)]
pub enum OpView {
    /// Nothing in flight.
    Idle,
    /// A create (or replace) is running.
    Creating {
        /// Target host.
        host: String,
        /// Image being created from.
        image: String,
        /// When it started.
        started: SystemTime,
        /// Bytes done / total of an image import, once reported.
        progress: Option<(u64, Option<u64>)>,
    },
    /// A delete is running.
    Deleting {
        /// Hosts being cleaned.
        hosts: Vec<String>,
    },
    /// A create finished since the last reconcile.
    CreateFinished {
        /// Target host.
        host: String,
        /// Its result.
        result: Result<Instance, ProviderError>,
    },
    /// A delete finished since the last reconcile.
    DeleteFinished {
        /// Its result.
        result: Result<(), ProviderError>,
    },
}

/// Load and health of one host of the entry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostInfo {
    /// Proxies of this entry known on it (instances and creates in flight).
    pub load: usize,
    /// Its last health report, if any.
    pub health: Option<HostState>,
}

/// A Permanent failure latched for a generation and config digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Latch {
    /// The generation it was computed for.
    pub generation: i64,
    /// The entry's config digest then ("" when the entry was unknown).
    pub config_digest: String,
}

/// Per-object memory the executor keeps between reconciles.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Memory {
    /// Consecutive failures (drives the backoff; reset on success).
    pub failures: u32,
    /// A latched Permanent failure.
    pub latch: Option<Latch>,
}

/// The provider entry as the decision needs it.
#[derive(Debug, Clone, Copy)]
pub struct EntryView<'a> {
    /// The entry's configuration.
    pub config: &'a LibvirtEntry,
    /// Its digest (a change releases latches).
    pub config_digest: &'a str,
}

/// Everything [`decide`] looks at.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// The Proxy.
    pub obj: &'a ProxyObject,
    /// Its current status.
    pub status: &'a ProxyStatus,
    /// Its provider entry, when the config has it.
    pub entry: Option<&'a EntryView<'a>>,
    /// Where its instance is, when known (adopted, created, or from status).
    pub location: Option<&'a ProviderId>,
    /// What the provider said this time.
    pub observed: &'a Observed,
    /// Work in flight.
    pub op: &'a OpView,
    /// Hosts of the entry by name.
    pub hosts: &'a BTreeMap<String, HostInfo>,
    /// Per-object memory.
    pub memory: &'a Memory,
    /// The clock.
    pub now: SystemTime,
    /// Settings.
    pub settings: &'a ControllerSettings,
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Nothing.
    None,
    /// Abort the work in flight.
    Cancel,
    /// Create (after deleting the old instance when `replace`).
    Create {
        /// The request (user-data rendered).
        req: CreateRequest,
        /// Delete the instance by UID on `req.host` first.
        replace: bool,
    },
    /// Delete by UID on these hosts (aborting any work in flight first).
    Delete {
        /// Hosts.
        hosts: Vec<String>,
    },
}

/// The decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// What to do.
    pub action: Action,
    /// The status to report.
    pub status: ProxyStatus,
    /// When to come back.
    pub requeue_after: Option<Duration>,
    /// Events.
    pub events: Vec<Event>,
    /// Memory to keep.
    pub memory: Memory,
    /// Deleting and nothing left: forget the Proxy.
    pub finalized: bool,
}

/// RFC 3339 (seconds) form of `t`.
pub fn fmt_time(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

fn parse_time(s: &str) -> Option<SystemTime> {
    humantime::parse_rfc3339_weak(s).ok()
}

fn human(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

/// The working state of one decision.
struct Ctx<'a> {
    i: &'a Inputs<'a>,
    status: ProxyStatus,
    events: Vec<Event>,
    memory: Memory,
    now_s: String,
}

impl Ctx<'_> {
    fn cond(&mut self, type_: &str, st: ConditionStatus, reason: &str, msg: &str) {
        let c = Condition::new(type_, st, reason, msg, &self.now_s, self.i.obj.generation);
        self.status.set_condition(c);
    }
    fn event(&mut self, kind: EventKind, reason: &str, msg: &str) {
        self.events.push(Event::new(kind, reason, msg));
    }
    fn done(self, action: Action, requeue_after: Option<Duration>) -> Decision {
        Decision {
            action,
            status: self.status,
            requeue_after,
            events: self.events,
            memory: self.memory,
            finalized: false,
        }
    }
    fn digest(&self) -> String {
        self.i
            .entry
            .map(|e| e.config_digest.to_owned())
            .unwrap_or_default()
    }
    /// Latches a Permanent failure: phase Failed, Ready=False, no requeue.
    fn latch(mut self, reason: &str, msg: &str, action: Action) -> Decision {
        self.status.phase = Phase::Failed;
        self.cond(condition::READY, ConditionStatus::False, reason, msg);
        self.event(EventKind::Warning, reason, msg);
        self.memory.latch = Some(Latch {
            generation: self.i.obj.generation,
            config_digest: self.digest(),
        });
        self.done(action, None)
    }
    /// A retryable failure: Ready=False with reason and message, phase and IP unchanged,
    /// backoff requeue (finding APX-2).
    fn retry(mut self, reason: &str, msg: &str, action: Action) -> Decision {
        self.memory.failures = self.memory.failures.saturating_add(1);
        self.cond(condition::READY, ConditionStatus::False, reason, msg);
        if self.status.phase == Phase::Pending || self.status.phase == Phase::Provisioning {
            self.cond(condition::PROVISIONED, ConditionStatus::False, reason, msg);
        }
        self.event(EventKind::Warning, reason, msg);
        let s = self.i.settings;
        let d = backoff(s.backoff_base, s.backoff_max, self.memory.failures);
        self.done(action, Some(d))
    }
    /// A provider failure, by class.
    fn failure(self, e: &ProviderError, what: &str) -> Decision {
        let msg = format!("{what}: {}", e.message);
        match e.class {
            ErrorClass::Permanent => self.latch(reason::PERMANENT_ERROR, &msg, Action::None),
            ErrorClass::QuotaExceeded => self.retry(reason::QUOTA_EXCEEDED, &msg, Action::None),
            ErrorClass::Transient | ErrorClass::NotFound => {
                self.retry(reason::TRANSIENT_ERROR, &msg, Action::None)
            }
        }
    }
}

/// Decides one reconcile. Pure.
pub fn decide(i: &Inputs<'_>) -> Decision {
    let mut cx = Ctx {
        i,
        status: i.status.clone(),
        events: Vec::new(),
        memory: i.memory.clone(),
        now_s: fmt_time(i.now),
    };
    cx.status.observed_generation = i.obj.generation;
    if i.obj.deleting {
        return finalize(cx);
    }

    // A latched Permanent failure holds until the generation or the config changes.
    if let Some(l) = &i.memory.latch {
        if l.generation == i.obj.generation && l.config_digest == cx.digest() {
            return Decision {
                action: Action::None,
                status: i.status.clone(),
                requeue_after: None,
                events: Vec::new(),
                memory: i.memory.clone(),
                finalized: false,
            };
        }
        cx.memory = Memory::default();
        cx.event(
            EventKind::Normal,
            reason::RETRYING,
            "the spec or the provider configuration changed; retrying",
        );
        if cx.status.phase == Phase::Failed {
            cx.status.phase = Phase::Pending;
        }
    }

    // Spec and entry checks (Permanent, naming the field path and value).
    let Some(entry) = i.entry else {
        let msg = format!(
            "spec.provider: {:?} is not a provider entry of the loaded configuration",
            i.obj.spec.provider
        );
        let action = cancel_if_creating(i.op);
        return cx.latch(reason::INVALID_SPEC, &msg, action);
    };
    let errs = spec_errors(i.obj, entry.config);
    if !errs.is_empty() {
        let action = cancel_if_creating(i.op);
        return cx.latch(reason::INVALID_SPEC, &errs.join("; "), action);
    }
    // The entry of a placed Proxy is immutable (as the Kubernetes CEL rule says): acting on a
    // changed entry would create a second instance and leave the first running, out of GC's
    // reach because its UID is live (finding M2: nothing is touched on the old entry either).
    if let Some(loc) = i.location
        && loc.entry != entry.config.name
    {
        let msg = format!(
            "spec.provider: changed to {:?}, but this Proxy's instance lives in entry {:?} on              host {}; the provider of a Proxy cannot change: set spec.provider back to {:?},              or delete this Proxy (its instance is then deleted there) and create a new one",
            entry.config.name, loc.entry, loc.host, loc.entry
        );
        return cx.latch(reason::INVALID_SPEC, &msg, Action::None);
    }

    // Work in flight.
    let mut observed = i.observed.clone();
    let mut location = i.location.cloned();
    match i.op {
        OpView::Creating {
            host,
            image,
            started,
            progress,
        } => return creating(cx, entry, host, image, *started, *progress),
        OpView::Deleting { .. } => {
            cx.cond(
                condition::READY,
                ConditionStatus::False,
                reason::DELETING,
                "a delete is still in progress",
            );
            return cx.done(Action::None, Some(i.settings.poll_provisioning));
        }
        OpView::CreateFinished { host, result } => match result {
            Ok(inst) => {
                location = Some(inst.id.clone());
                observed = Observed::Found(inst.clone());
            }
            Err(e) => {
                cx.status.host = Some(host.clone());
                return cx.failure(e, &format!("creating the instance on host {host}"));
            }
        },
        OpView::DeleteFinished { .. } | OpView::Idle => {}
    }

    match observed {
        // The host's read slots are taken (H1): keep the status, look again soon.
        Observed::HostBusy(_) => cx.done(Action::None, Some(i.settings.poll_provisioning)),
        Observed::Unknown => {
            // Sticky: retry where the last attempt was (a create converges from its own
            // partial state there) unless that host is gone or unhealthy.
            let prev = i.status.host.as_deref().filter(|h| {
                entry.config.hosts.iter().any(|c| c.name == *h)
                    && matches!(
                        i.hosts.get(*h).and_then(|x| x.health),
                        None | Some(HostState::Ready)
                    )
            });
            start_create(cx, entry, prev, "")
        }
        Observed::NotFound => {
            let prev = location.as_ref().map(|l| l.host.clone());
            let msg = match &location {
                Some(l) => format!("instance {l} no longer exists; recreating it"),
                None => "the instance no longer exists; recreating it".into(),
            };
            cx.event(EventKind::Warning, reason::INSTANCE_LOST, &msg);
            cx.status.provider_id = None;
            start_create(cx, entry, prev.as_deref(), &msg)
        }
        Observed::GetFailed(e) => {
            let what = match &location {
                Some(l) => format!("reading instance {l}"),
                None => "reading the instance".into(),
            };
            cx.failure(&e, &what)
        }
        Observed::Found(inst) => found(cx, entry, inst),
    }
}

fn cancel_if_creating(op: &OpView) -> Action {
    if matches!(op, OpView::Creating { .. }) {
        Action::Cancel
    } else {
        Action::None
    }
}

/// Deletion (finding M3): by UID, on the known host or on every host of the entry.
fn finalize(mut cx: Ctx<'_>) -> Decision {
    let i = cx.i;
    cx.status.phase = Phase::Terminating;
    match i.op {
        OpView::Deleting { hosts } => {
            let msg = format!("deleting the instance on {}", hosts.join(", "));
            cx.cond(
                condition::READY,
                ConditionStatus::False,
                reason::DELETING,
                &msg,
            );
            return cx.done(Action::None, Some(i.settings.poll_provisioning));
        }
        OpView::DeleteFinished { result: Ok(()) } => {
            cx.cond(
                condition::READY,
                ConditionStatus::False,
                reason::DELETED,
                "nothing is left on any host",
            );
            cx.event(
                EventKind::Normal,
                reason::DELETED,
                "instance and volumes deleted",
            );
            let mut d = cx.done(Action::None, None);
            d.finalized = true;
            return d;
        }
        OpView::DeleteFinished { result: Err(e) } => {
            let e = e.clone();
            // NB: deletion always retries (a latch would wedge the finalizer); a Permanent
            // error waits the longest backoff between attempts.
            if e.class == ErrorClass::Permanent {
                cx.memory.failures = u32::MAX;
            }
            let mut d = cx.retry(
                reason::TRANSIENT_ERROR,
                &format!("deleting the instance: {}", e.message),
                Action::None,
            );
            d.status.phase = Phase::Terminating;
            // The next reconcile (after the backoff) issues the delete again.
            return d;
        }
        OpView::Idle | OpView::Creating { .. } | OpView::CreateFinished { .. } => {}
    }
    let Some(_entry) = i.entry else {
        let msg = format!(
            "provider entry {:?} is not configured: nothing can be deleted; if an instance \
             was created under it, remove it by hand or restore the entry",
            i.obj.spec.provider
        );
        cx.event(EventKind::Warning, reason::DELETED, &msg);
        let mut d = cx.done(Action::None, None);
        d.finalized = true;
        return d;
    };
    let hosts = delete_hosts(&cx);
    let msg = format!("deleting the instance on {}", hosts.join(", "));
    cx.cond(
        condition::READY,
        ConditionStatus::False,
        reason::DELETING,
        &msg,
    );
    cx.done(Action::Delete { hosts }, Some(i.settings.poll_provisioning))
}

/// Hosts a delete must cover: where the instance is or is being created, else every host.
fn delete_hosts(cx: &Ctx<'_>) -> Vec<String> {
    let i = cx.i;
    let mut hosts: Vec<String> = Vec::new();
    let mut add = |h: &str| {
        if !hosts.iter().any(|x| x == h) {
            hosts.push(h.to_owned());
        }
    };
    if let Some(l) = i.location {
        add(&l.host);
    }
    if let OpView::Creating { host, .. } | OpView::CreateFinished { host, .. } = i.op {
        add(host);
    }
    if let Some(h) = &i.status.host {
        add(h);
    }
    if hosts.is_empty()
        && let Some(e) = i.entry
    {
        hosts = e.config.hosts.iter().map(|h| h.name.clone()).collect();
    }
    // Only hosts the entry still has can be reached.
    if let Some(e) = i.entry {
        let known: Vec<&str> = e.config.hosts.iter().map(|h| h.name.as_str()).collect();
        let before = hosts.clone();
        hosts.retain(|h| known.contains(&h.as_str()));
        if hosts.is_empty() && !before.is_empty() {
            hosts = known.iter().map(|h| (*h).to_owned()).collect();
        }
    }
    hosts
}

/// Every spec problem against `entry`, each naming the field path and the value.
pub fn spec_errors(obj: &ProxyObject, entry: &LibvirtEntry) -> Vec<String> {
    let mut errs: Vec<String> = obj
        .spec
        .validate()
        .iter()
        .map(ToString::to_string)
        .collect();
    let spec = &obj.spec;
    if let Some(h) = &spec.host
        && !h.trim().is_empty()
        && !entry.hosts.iter().any(|c| &c.name == h)
    {
        let known: Vec<&str> = entry.hosts.iter().map(|c| c.name.as_str()).collect();
        errs.push(format!(
            "spec.host: {h:?} is not a host of provider entry {:?} (hosts: {})",
            entry.name,
            known.join(", ")
        ));
    }
    if !spec.image.trim().is_empty() {
        if is_url(&spec.image) {
            if !entry.url_images.enabled {
                errs.push(format!(
                    "spec.image: {:?} is a URL and provider entry {:?} does not allow URL \
                     images (urlImages.enabled); use a catalogue key",
                    spec.image, entry.name
                ));
            }
        } else if !entry.images.contains_key(&spec.image) {
            let known: Vec<&str> = entry.images.keys().map(String::as_str).collect();
            errs.push(format!(
                "spec.image: {:?} is not in the catalogue of provider entry {:?} (known: {})",
                spec.image,
                entry.name,
                if known.is_empty() {
                    "none".into()
                } else {
                    known.join(", ")
                }
            ));
        }
    }
    if let Err(e) = sizes(obj, entry) {
        errs.extend(e);
    }
    errs
}

/// Disk GiB, memory MiB and vCPUs of `obj`: the spec's overrides, else the entry's defaults,
/// within the entry's limits; byte sizes are computed with checked arithmetic (L20).
pub fn sizes(obj: &ProxyObject, entry: &LibvirtEntry) -> Result<(u64, u64, u32), Vec<String>> {
    let r = &obj.spec.resources;
    let (d, l) = (&entry.defaults, &entry.limits);
    let disk = r.disk_gib.unwrap_or(d.disk_gib);
    let mem = r.memory_mib.unwrap_or(d.memory_mib);
    let cpus = r.vcpus.unwrap_or(d.vcpus);
    let mut errs = Vec::new();
    if disk > l.disk_gib || disk.checked_mul(GIB).is_none() {
        errs.push(format!(
            "spec.resources.diskGiB: {disk} exceeds the limit of provider entry {:?} \
             (limits.diskGiB: {})",
            entry.name, l.disk_gib
        ));
    }
    if mem > l.memory_mib || mem.checked_mul(MIB).is_none() {
        errs.push(format!(
            "spec.resources.memoryMiB: {mem} exceeds the limit of provider entry {:?} \
             (limits.memoryMiB: {})",
            entry.name, l.memory_mib
        ));
    }
    if cpus > l.vcpus {
        errs.push(format!(
            "spec.resources.vcpus: {cpus} exceeds the limit of provider entry {:?} \
             (limits.vcpus: {})",
            entry.name, l.vcpus
        ));
    }
    if errs.is_empty() {
        Ok((disk, mem, cpus))
    } else {
        Err(errs)
    }
}

/// Where to place: the pin when it accepts placements, else the host accepting placements
/// with the fewest proxies of this entry (ties by name). A host accepts placements only when
/// its last report is Ready or it has none yet ([`crate::hosthealth::accepts_placements`]):
/// an unhealthy host, or one whose pool is at or below its reserve (reported Degraded), gets
/// no new proxies (issue 6). `None` when no host qualifies.
pub fn place(
    entry: &LibvirtEntry,
    pinned: Option<&str>,
    hosts: &BTreeMap<String, HostInfo>,
) -> Option<String> {
    let info = |n: &str| hosts.get(n).copied().unwrap_or_default();
    let usable = |n: &str| crate::hosthealth::accepts_placements(info(n).health);
    if let Some(p) = pinned {
        return usable(p).then(|| p.to_owned());
    }
    entry
        .hosts
        .iter()
        .map(|h| h.name.as_str())
        .filter(|n| usable(n))
        .min_by(|a, b| info(a).load.cmp(&info(b).load).then_with(|| a.cmp(b)))
        .map(str::to_owned)
}

/// Why no host was chosen: each host with its last state.
fn no_usable_host(
    entry: &LibvirtEntry,
    pinned: Option<&str>,
    hosts: &BTreeMap<String, HostInfo>,
) -> String {
    let state = |n: &str| {
        hosts
            .get(n)
            .and_then(|x| x.health)
            .map_or_else(|| "unchecked".to_owned(), |s| format!("{s:?}"))
    };
    match pinned {
        Some(p) => format!(
            "host {p} (spec.host) is {}: no new proxies on a host that is not Ready; waiting",
            state(p)
        ),
        None => {
            let list: Vec<String> = entry
                .hosts
                .iter()
                .map(|h| format!("{} {}", h.name, state(&h.name)))
                .collect();
            format!(
                "no host of provider entry {:?} takes new proxies ({}); waiting for one to be Ready",
                entry.name,
                list.join(", ")
            )
        }
    }
}

/// The create request for `obj` on `host`, or why it cannot be made yet.
fn request(
    obj: &ProxyObject,
    entry: &LibvirtEntry,
    host: &str,
) -> Result<CreateRequest, (bool, String)> {
    let (disk_gib, memory_mib, vcpus) = sizes(obj, entry).map_err(|e| (true, e.join("; ")))?;
    if obj.spec.proxy.credentials_ref.is_some() && obj.credentials.is_none() {
        return Err((
            false,
            format!(
                "spec.proxy.credentialsRef: {:?} could not be read yet",
                obj.spec
                    .proxy
                    .credentials_ref
                    .as_deref()
                    .unwrap_or_default()
            ),
        ));
    }
    let user_data = userdata::render(&obj.spec.proxy, obj.credentials.as_ref())
        .map_err(|e| (true, e.to_string()))?;
    Ok(CreateRequest {
        uid: obj.uid,
        display_name: format!("{}/{}", obj.namespace, obj.name),
        host: host.to_owned(),
        image: obj.spec.image.clone(),
        disk_gib,
        memory_mib,
        vcpus,
        user_data,
    })
}

/// Starts a create (or a replace, when `replace_on` names the host to clear first).
fn start_create(
    mut cx: Ctx<'_>,
    entry: &EntryView<'_>,
    prefer: Option<&str>,
    why: &str,
) -> Decision {
    let i = cx.i;
    let pin = i.obj.spec.host.as_deref();
    let pinned = pin.or(prefer);
    if entry.config.hosts.is_empty() {
        let msg = format!("provider entry {:?} has no hosts", entry.config.name);
        return cx.latch(reason::INVALID_SPEC, &msg, Action::None);
    }
    // A preferred (sticky) host that stopped accepting placements yields to the others.
    let chosen = place(entry.config, pinned, i.hosts).or_else(|| {
        pin.is_none()
            .then(|| place(entry.config, None, i.hosts))
            .flatten()
    });
    let Some(host) = chosen else {
        let msg = no_usable_host(entry.config, pin, i.hosts);
        return cx.retry(reason::NO_USABLE_HOST, &msg, Action::None);
    };
    let req = match request(i.obj, entry.config, &host) {
        Ok(r) => r,
        Err((true, msg)) => return cx.latch(reason::INVALID_SPEC, &msg, Action::None),
        Err((false, msg)) => return cx.retry(reason::CREDENTIALS_MISSING, &msg, Action::None),
    };
    let msg = if why.is_empty() {
        format!("creating the instance on host {host}")
    } else {
        format!("{why}: creating the instance on host {host}")
    };
    cx.status.phase = Phase::Provisioning;
    cx.status.host = Some(host.clone());
    cx.status.ip = None;
    cx.status.ip_seen_at = None;
    cx.status.provisioning_since = Some(cx.now_s.clone());
    cx.cond(
        condition::PROVISIONED,
        ConditionStatus::False,
        reason::CREATING,
        &msg,
    );
    cx.cond(
        condition::READY,
        ConditionStatus::False,
        reason::CREATING,
        &msg,
    );
    cx.event(EventKind::Normal, reason::CREATING, &msg);
    cx.done(
        Action::Create {
            req,
            replace: false,
        },
        Some(i.settings.poll_provisioning),
    )
}

/// Replaces the instance on `host` (delete by UID, then create there).
fn replace(
    mut cx: Ctx<'_>,
    entry: &EntryView<'_>,
    host: &str,
    reason_: &str,
    msg: &str,
) -> Decision {
    let i = cx.i;
    let req = match request(i.obj, entry.config, host) {
        Ok(r) => r,
        Err((true, m)) => return cx.latch(reason::INVALID_SPEC, &m, Action::None),
        Err((false, m)) => return cx.retry(reason::CREDENTIALS_MISSING, &m, Action::None),
    };
    cx.status.phase = Phase::Provisioning;
    cx.status.host = Some(host.to_owned());
    cx.status.ip = None;
    cx.status.ip_seen_at = None;
    cx.status.provisioning_since = Some(cx.now_s.clone());
    cx.cond(condition::PROVISIONED, ConditionStatus::False, reason_, msg);
    cx.cond(condition::READY, ConditionStatus::False, reason_, msg);
    cx.event(EventKind::Warning, reason_, msg);
    cx.done(
        Action::Create { req, replace: true },
        Some(i.settings.poll_provisioning),
    )
}

/// Elapsed provisioning time, when the deadline has passed.
fn deadline_passed(cx: &Ctx<'_>, fallback: SystemTime) -> Option<Duration> {
    let since = cx
        .status
        .provisioning_since
        .as_deref()
        .and_then(parse_time)
        .unwrap_or(fallback);
    let elapsed = cx.i.now.duration_since(since).unwrap_or_default();
    (elapsed >= cx.i.settings.provisioning_deadline).then_some(elapsed)
}

/// The provisioning deadline passed (finding APX-1): say what is missing; replace or fail.
fn deadline_expired(
    mut cx: Ctx<'_>,
    entry: &EntryView<'_>,
    host: &str,
    elapsed: Duration,
    missing: &str,
    may_replace: bool,
) -> Decision {
    let s = cx.i.settings;
    let msg = format!(
        "provisioning deadline of {} passed after {}: {missing}",
        human(s.provisioning_deadline),
        human(elapsed)
    );
    if s.replace_on_deadline && may_replace {
        let m = format!("{msg}; replacing the instance");
        return replace(cx, entry, host, reason::PROVISIONING_TIMEOUT, &m);
    }
    let action = cancel_if_creating(cx.i.op);
    if !may_replace {
        // Paused instances are never destroyed (M1): report, keep polling.
        cx.cond(
            condition::READY,
            ConditionStatus::False,
            reason::PROVISIONING_TIMEOUT,
            &msg,
        );
        return cx.done(action, Some(s.poll_running));
    }
    cx.latch(reason::PROVISIONING_TIMEOUT, &msg, action)
}

fn creating(
    mut cx: Ctx<'_>,
    entry: &EntryView<'_>,
    host: &str,
    image: &str,
    started: SystemTime,
    progress: Option<(u64, Option<u64>)>,
) -> Decision {
    let mut what = format!("create still in progress on host {host}");
    if let Some((done, total)) = progress {
        let total = total.map_or("?".to_owned(), |t| (t / MIB).to_string());
        what.push_str(&format!(
            " (importing image {image}: {}/{total} MiB)",
            done / MIB
        ));
    }
    if let Some(elapsed) = deadline_passed(&cx, started) {
        return deadline_expired(cx, entry, host, elapsed, &what, true);
    }
    cx.status.phase = Phase::Provisioning;
    cx.status.host = Some(host.to_owned());
    if cx.status.provisioning_since.is_none() {
        cx.status.provisioning_since = Some(fmt_time(started));
    }
    let msg = match progress {
        Some(_) => what.replace("create still in progress on", "creating on"),
        None => format!("creating the instance on host {host}"),
    };
    cx.cond(
        condition::PROVISIONED,
        ConditionStatus::False,
        reason::CREATING,
        &msg,
    );
    cx.cond(
        condition::READY,
        ConditionStatus::False,
        reason::CREATING,
        &msg,
    );
    let poll = cx.i.settings.poll_provisioning;
    cx.done(Action::None, Some(poll))
}

fn found(mut cx: Ctx<'_>, entry: &EntryView<'_>, inst: Instance) -> Decision {
    let i = cx.i;
    let s = i.settings;
    let host = inst.id.host.clone();
    if inst.uid != i.obj.uid {
        // finding M2: never act on an instance whose verified UID is another Proxy's.
        let msg = format!(
            "instance {} carries the mark of Proxy UID {}, not {}: it is left untouched",
            inst.id, inst.uid, i.obj.uid
        );
        return cx.latch(reason::FOREIGN_INSTANCE, &msg, Action::None);
    }
    cx.status.host = Some(host.clone());
    cx.status.provider_id = Some(inst.id.to_string());
    cx.cond(
        condition::PROVISIONED,
        ConditionStatus::True,
        reason::CREATED,
        &format!("instance {} exists", inst.id),
    );
    match (&inst.state, inst.ip) {
        (InstanceState::Running, Some(ip)) => {
            let was_running = i.status.phase == Phase::Running;
            cx.memory.failures = 0;
            cx.status.phase = Phase::Running;
            cx.status.ip = Some(ip.to_string());
            cx.status.ip_seen_at = Some(cx.now_s.clone());
            cx.status.provisioning_since = None;
            let msg = format!("running on host {host} at {ip}");
            cx.cond(
                condition::READY,
                ConditionStatus::True,
                reason::RUNNING,
                &msg,
            );
            if !was_running {
                cx.event(EventKind::Normal, reason::RUNNING, &msg);
            }
            cx.done(Action::None, Some(s.poll_running))
        }
        (InstanceState::Running | InstanceState::Provisioning, _) => {
            // finding H3: keep the last IP through a short gap.
            let seen = i.status.ip_seen_at.as_deref().and_then(parse_time);
            let in_grace = i.status.phase == Phase::Running
                && i.status.ip.is_some()
                && seen.is_some_and(|t| i.now.duration_since(t).unwrap_or_default() < s.ip_grace);
            if in_grace {
                cx.memory.failures = 0;
                let msg = format!(
                    "instance {} reports no address right now; keeping the last one for up to {}",
                    inst.id,
                    human(s.ip_grace)
                );
                cx.cond(
                    condition::READY,
                    ConditionStatus::True,
                    reason::ADDRESS_GAP,
                    &msg,
                );
                return cx.done(Action::None, Some(s.poll_provisioning));
            }
            if cx.status.phase != Phase::Provisioning || cx.status.provisioning_since.is_none() {
                cx.status.provisioning_since = Some(cx.now_s.clone());
            }
            cx.status.phase = Phase::Provisioning;
            cx.status.ip = None;
            cx.status.ip_seen_at = None;
            if let Some(elapsed) = deadline_passed(&cx, i.now) {
                let missing = format!(
                    "instance {} is running but no address was reported",
                    inst.id
                );
                return deadline_expired(cx, entry, &host, elapsed, &missing, true);
            }
            let msg = format!(
                "instance {} is running; waiting for it to report an address",
                inst.id
            );
            cx.cond(
                condition::READY,
                ConditionStatus::False,
                reason::WAITING_FOR_ADDRESS,
                &msg,
            );
            cx.done(Action::None, Some(s.poll_provisioning))
        }
        (InstanceState::Paused { reason: why }, _) => {
            // finding M1: a paused instance is reported, never destroyed.
            let msg = format!("instance {} is paused by the hypervisor: {why}", inst.id);
            let was_provisioning = cx.status.phase == Phase::Provisioning;
            cx.status.phase = Phase::Paused;
            if was_provisioning && let Some(elapsed) = deadline_passed(&cx, i.now) {
                let missing = format!("instance {} is not running (paused: {why})", inst.id);
                return deadline_expired(cx, entry, &host, elapsed, &missing, false);
            }
            cx.cond(
                condition::READY,
                ConditionStatus::False,
                reason::PAUSED,
                &msg,
            );
            cx.done(Action::None, Some(s.poll_running))
        }
        (InstanceState::Stopped { reason: why }, _) => {
            // finding M2: the UID was verified above (the provider's get verified the mark
            // too) before this destructive path.
            let msg = format!("instance {} stopped ({why}); replacing it", inst.id);
            replace(cx, entry, &host, reason::REPLACING, &msg)
        }
    }
}

/// Status while the host has no free work slot (called by the executor when its
/// try-acquire fails): Ready/Provisioned False with reason HostBusy; nothing else changes.
pub fn host_busy(
    mut status: ProxyStatus,
    obj: &ProxyObject,
    host: &str,
    now: SystemTime,
) -> ProxyStatus {
    let now_s = fmt_time(now);
    let msg = format!(
        "host {host} is busy with other creates and deletes (its maxConcurrent slots are \
         taken); waiting for a slot"
    );
    if status.phase == Phase::Pending || status.phase == Phase::Provisioning {
        status.set_condition(Condition::new(
            condition::PROVISIONED,
            ConditionStatus::False,
            reason::HOST_BUSY,
            &msg,
            &now_s,
            obj.generation,
        ));
    }
    if status.phase != Phase::Terminating {
        // The create did not start: no attempt is in progress.
        if status.phase == Phase::Provisioning && status.provider_id.is_none() {
            status.phase = Phase::Pending;
            status.provisioning_since = None;
            // Nothing was started there: the next attempt places afresh.
            status.host = None;
        }
    }
    status.set_condition(Condition::new(
        condition::READY,
        ConditionStatus::False,
        reason::HOST_BUSY,
        &msg,
        &now_s,
        obj.generation,
    ));
    status
}

/// Status when the controller is shutting down and started nothing.
pub fn shutting_down(mut status: ProxyStatus, obj: &ProxyObject, now: SystemTime) -> ProxyStatus {
    status.set_condition(Condition::new(
        condition::READY,
        ConditionStatus::False,
        reason::SHUTTING_DOWN,
        "the operator is shutting down; no new work is started",
        &fmt_time(now),
        obj.generation,
    ));
    status
}

/// The outcome of a reconcile that hit its deadline (finding APX-3): the input status with a
/// visible, non-latching condition and a backoff requeue.
pub fn reconcile_timed_out(
    obj: &ProxyObject,
    status: &ProxyStatus,
    now: SystemTime,
    settings: &ControllerSettings,
    failures: u32,
) -> Outcome {
    let mut st = status.clone();
    let msg = format!(
        "one reconcile did not finish within {}; will retry",
        human(settings.reconcile_deadline)
    );
    st.set_condition(Condition::new(
        condition::READY,
        ConditionStatus::False,
        reason::RECONCILE_TIMEOUT,
        &msg,
        &fmt_time(now),
        obj.generation,
    ));
    Outcome {
        status: st,
        requeue_after: Some(backoff(
            settings.backoff_base,
            settings.backoff_max,
            failures,
        )),
        events: vec![Event::new(
            EventKind::Warning,
            reason::RECONCILE_TIMEOUT,
            &msg,
        )],
        finalized: false,
    }
}
