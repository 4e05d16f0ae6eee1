//! [`LibvirtProvider`]: the [`Provider`] trait over one libvirt entry — the host pool, the
//! image cache, volumes, seed, domain XML and the get/delete/list operations, wired together.
//!
//! Create, in order: per-name lock with a deadline → host slot → adopt an
//! existing domain only if its mark is ours, its seed exists and its overlay is backed by the
//! image's base at the requested size (L4; otherwise it is deleted and recreated) → capabilities (cached
//! per host) → base ensured (verified, published) → disk size vs the base (M5) → seed input
//! checked (M8) → pool refreshed and space checked with the reserve (M4) → overlay (verified if
//! it exists) → seed built in memory, its volume created and uploaded → define with the
//! mark → start → wait running. Anything this call created is removed when a later step
//! fails; nothing else ever is.
//!
//! One piece: it is the wiring of the `Provider` trait, each method one ordered sequence over the
//! sibling modules, and a create's undo record must be visible to every step that adds to it.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use libvirt_remote::Client;
use libvirt_remote::client::{domain_state, undefine};
use libvirt_remote::proto::{Domain, StoragePool, StorageVol};

use super::address_book::{AddressBook, InFlight};
use super::caps::{self, HostCaps, Virt};
use super::check::{self, CheckOptions};
use super::classify::classify;
use super::config::{HostConfig, LibvirtEntry, VirtType};
use super::domain_xml::{self, Backing, DiskSource, DomainSpec, Nic, NicAttach};
use super::hostpool::{HostLease, HostPool};
use super::image::{self, BulkConnect, Target, fetch::FetchOptions};
use super::names;
use super::network_config::{self, StaticAddress};
use super::nwfilter;
use super::ops::{self, get::MarkCheck};
use super::seed::{self, SeedInput};
use super::volumes::{self, BackingBase};
use crate::error::{ProviderError, Result};
use crate::model::{
    CreateRequest, HostReport, HostState, Instance, InstanceState, OwnedInstance, Progress,
    ProviderId, ProxyUid,
};
use crate::provider::Provider;
use crate::sync::lock;

/// How long a create waits for another create/delete of the same name in this process.
// NB: a create holding the lock may be importing an image (minutes); waiting longer than a
// reconcile deadline is pointless — the controller retries.
pub const NAME_LOCK_WAIT: Duration = Duration::from_secs(120);
/// How often a started domain's state is polled while waiting for RUNNING.
const START_POLL: Duration = Duration::from_millis(250);
/// Space an overlay and a seed need at creation (the overlay is thin; the seed is < 1 MiB).
// NB: the overlay grows with the guest; the reserve (poolReserveGiB) is what protects the
// pool from that growth, so only the immediate need is checked here.
const CREATE_SPACE: u64 = 64 << 20;
const _: () = assert!(seed::MAX_SEED_BYTES as u64 <= CREATE_SPACE);
/// Deadline for uploading a seed (at most 2 MiB) on the control connection.
const SEED_UPLOAD_BUDGET: Duration = Duration::from_secs(30);
/// Deadline for removing what a failed create made.
const CLEANUP_BUDGET: Duration = Duration::from_secs(30);
/// Deadline for one host's base collection.
// NB: a pool listing, a few reads per base and per domain (8 in flight) and three deletes per
// removed base, each under the call deadline; 180 s is three default call deadlines, so a
// frozen host ends as that host's failure, never a hang.
const BASE_GC_HOST_BUDGET: Duration = Duration::from_secs(180);
/// How long a failed fence command's result stands before a create runs it again.
// NB: a create is retried with backoff; without this every retry would drive the BMC.
pub const FENCE_RETRY: Duration = Duration::from_secs(10);
/// What the book records for a fence the host's command confirmed.
pub const FENCED_BY_COMMAND: &str = "its fence command exited 0";
/// What the book records for a host an administrator declared dead.
pub const FENCED_BY_ADMIN: &str = "declared dead by an administrator";

/// The last failed fence run of a host: when, and why.
type FenceGate = Arc<tokio::sync::Mutex<Option<(std::time::Instant, String)>>>;

/// Why a create waits for another host of its segment to be confirmed gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holding {
    /// A copy of the Proxy being created holds a pinned address there: its host may be fenced.
    OwnCopy,
    /// Another Proxy's instance holds this pinned address there: never a reason to fence.
    Another(IpAddr),
    /// The host was never listed since the start: only its answer or an administrator helps.
    Unknown,
}

/// Hosts whose bases are collected at once.
const BASE_GC_PARALLEL: usize = 4;

/// A provider for one libvirt entry.
pub struct LibvirtProvider {
    pool: HostPool,
    fetch: FetchOptions,
    check: CheckOptions,
    caps: Mutex<HashMap<String, HostCaps>>,
    /// Each host's guest subnets, per control connection (an address is trusted only inside).
    subnets: ops::trust::SubnetCache,
    /// The MACs in use on each host, for the collision check before a define.
    macs: ops::mac::MacIndex,
    pools: Mutex<HashMap<String, StoragePool>>,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    installation: Option<String>,
    /// Declared egress addresses per host (see [`AddressBook`]).
    addresses: AddressBook,
    /// When each base was first found unused by [`Provider::collect_bases`].
    unused_bases: image::gc::UnusedSince,
    /// Hosts whose last check found them dead (Unreachable or Timeout): only those are fenced.
    dead: Mutex<HashSet<String>>,
    /// Per host: one fence run at a time, and the last failure.
    fencing: Mutex<HashMap<String, FenceGate>>,
    /// How long a failed fence stands before a create runs the command again.
    fence_retry: Duration,
}

impl std::fmt::Debug for LibvirtProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LibvirtProvider")
            .field("entry", &self.pool.entry().name)
            .finish_non_exhaustive()
    }
}

struct LeaseBulk<'a>(&'a HostLease);

#[async_trait]
impl BulkConnect for LeaseBulk<'_> {
    async fn open(&self) -> Result<Client> {
        self.0.bulk().await
    }
}

/// What a create made, so a failure removes exactly that.
#[derive(Default)]
struct Made {
    overlay: Option<StorageVol>,
    seed: Option<StorageVol>,
    domain: Option<Domain>,
}

impl LibvirtProvider {
    /// A provider over `pool` (which carries the entry).
    pub fn new(pool: HostPool, fetch: FetchOptions, check: CheckOptions) -> Self {
        Self {
            addresses: AddressBook::new(pool.entry()),
            pool,
            fetch,
            check,
            caps: Mutex::new(HashMap::new()),
            subnets: ops::trust::SubnetCache::default(),
            macs: ops::mac::MacIndex::default(),
            pools: Mutex::new(HashMap::new()),
            locks: Mutex::new(HashMap::new()),
            installation: None,
            unused_bases: image::gc::UnusedSince::default(),
            dead: Mutex::new(HashSet::new()),
            fencing: Mutex::new(HashMap::new()),
            fence_retry: FENCE_RETRY,
        }
    }

    /// Runs a failed fence command again only after `d` (default [`FENCE_RETRY`]).
    pub fn with_fence_retry(mut self, d: Duration) -> Self {
        self.fence_retry = d;
        self
    }

    /// Allocates `name`'s addresses on `host`; when a pinned address is held by an instance on
    /// another host of the segment, or a host of the segment was never listed, first tries to
    /// confirm that host's instances gone: a listing of it (it answers), else — only when the
    /// instance held there is a copy of this same Proxy (`name`: a Proxy's domain has one name
    /// on every host), or of the Proxy it replaces (`req.replaces`) — its fence command when its last check found it dead. Another Proxy's
    /// holding, or a host never listed since the start, is never a reason to fence: the
    /// create waits for that host's answer or an administrator's fence. Never releases
    /// anything on a timeout.
    async fn allocate_moving(
        &self,
        host: &str,
        name: &str,
        req: &CreateRequest,
    ) -> Result<Option<InFlight<'_>>> {
        if let Some(kept) = self.kept_addresses(host, name, req) {
            return Ok(Some(kept));
        }
        let first = self
            .addresses
            .allocate_avoiding(host, name, &req.pinned_egress, &req.reserved);
        let Err(e) = first else { return first };
        if !e.is_transient() {
            return Err(e);
        }
        // Host → why its instances must be confirmed gone (a copy of this Proxy: may fence).
        let mut others: std::collections::BTreeMap<String, Holding> = Default::default();
        // The Proxy this one replaces (lost with its host, in one pool): its instance counts
        // as a copy of this one.
        let replaced = req
            .replaces
            .as_ref()
            .map(|u| names::domain(&self.entry_cfg().name, u));
        for a in &req.pinned_egress {
            if let Some((h, domain)) = self.addresses.holder(host, *a) {
                let why = if domain == name || replaced.as_deref() == Some(domain.as_str()) {
                    Holding::OwnCopy
                } else {
                    Holding::Another(*a)
                };
                let slot = others.entry(h).or_insert(why);
                if why == Holding::OwnCopy {
                    *slot = why;
                }
            }
        }
        for h in self.addresses.unknown_peers(host) {
            others.entry(h).or_insert(Holding::Unknown);
        }
        others.remove(host);
        if others.is_empty() {
            return Err(e);
        }
        for (other, why) in &others {
            self.confirm_gone(other, *why).await?;
        }
        self.addresses
            .allocate_avoiding(host, name, &req.pinned_egress, &req.reserved)
    }

    /// A Proxy re-created in place that pins nothing (`req.prefer_egress`): its previous
    /// addresses again, when they are one per family of `host`'s pool and each is still free
    /// for it (not another holder's anywhere in the segment, not reserved, not retired, inside
    /// the pool); `None` otherwise, and the create allocates as usual. Never fences, never
    /// waits: a preference is no reason to fail or to free anything.
    fn kept_addresses(&self, host: &str, name: &str, req: &CreateRequest) -> Option<InFlight<'_>> {
        let prefer = &req.prefer_egress;
        if !req.pinned_egress.is_empty()
            || prefer.is_empty()
            || prefer.iter().any(|a| req.reserved.contains(a))
        {
            return None;
        }
        let pool = self.addresses.pool(host).ok()??;
        let covers = |v4: bool, has: bool| {
            prefer.iter().filter(|a| a.is_ipv4() == v4).count() == usize::from(has)
        };
        if !covers(true, pool.ipv4.is_some()) || !covers(false, pool.ipv6.is_some()) {
            return None;
        }
        match self
            .addresses
            .allocate_avoiding(host, name, prefer, &req.reserved)
        {
            Ok(got) => {
                if got.is_some() {
                    tracing::info!(host, domain = name, addresses = ?prefer, "re-created in place with its previous addresses");
                }
                got
            }
            Err(e) => {
                tracing::info!(host, domain = name, addresses = ?prefer, error = %e, "its previous addresses are not free for it; allocating others");
                None
            }
        }
    }

    /// Lists `other` (recording what it holds), or, when it does not answer and `holding` is a
    /// copy of the Proxy being created, runs its fence command if its last check found it
    /// dead; Transient naming what is waited for otherwise. The listing gets `timeouts.call`,
    /// or one host check call's deadline (`timeouts.check`) when the last check found `other`
    /// dead.
    async fn confirm_gone(&self, other: &str, holding: Holding) -> Result<()> {
        if self.addresses.fenced(other).is_some() {
            return Ok(());
        }
        let entry = &self.entry_cfg().name;
        // NB: a host the checks found dead gets one check call's time (`timeouts.check`) to
        // answer, not a whole call's: a frozen host's pooled connection would otherwise hold
        // the listing until keepalive gives up on it (30 s after its last answer) before its
        // fence could run.
        let budget = if lock(&self.dead).contains(other) {
            self.check.call_timeout.min(self.entry_cfg().timeouts.call)
        } else {
            self.entry_cfg().timeouts.call
        };
        let listed = tokio::time::timeout(budget, async {
            let lease = self.pool.acquire(other).await?;
            let started = self.addresses.listing_started(other);
            let l =
                ops::list::list_host(lease.client(), entry, self.installation.as_deref(), other)
                    .await?;
            self.addresses.apply_listing(other, started, &l.claims);
            Ok::<(), ProviderError>(())
        })
        .await;
        let failed = match listed {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => e.message,
            Err(_) => format!("no answer within {budget:?}"),
        };
        let declare = format!(
            "an administrator who knows it is off can declare it dead (`egress-proxies hosts \
             fence {other}`)"
        );
        match holding {
            Holding::OwnCopy => {}
            // NB: never fenced for another Proxy's address: a create pinning someone else's
            // address must not power off their host to take it. The holder is not named.
            Holding::Another(a) => {
                return Err(ProviderError::transient(format!(
                    "the pinned address {a} is held by another Proxy's instance on host {other} \
                     of this host's segment: waiting for host {other} to answer without it \
                     ({failed}); {declare}"
                )));
            }
            Holding::Unknown => {
                return Err(ProviderError::transient(format!(
                    "host {other} of this host's segment has not answered since the operator \
                     started ({failed}), so what its instances hold is unknown: no address of \
                     the segment is handed out until it answers; {declare}"
                )));
            }
        }
        let Some(fence) = self.pool.host(other)?.fence.clone() else {
            return Err(ProviderError::transient(format!(
                "waiting for host {other} to answer ({failed}); it has no fence command \
                 (hosts[].fence), so only its answer frees what its instances hold, or {declare}"
            )));
        };
        if !lock(&self.dead).contains(other) {
            return Err(ProviderError::transient(format!(
                "waiting for host {other} to answer ({failed}); its fence command runs once a \
                 host check finds it dead"
            )));
        }
        let gate = lock(&self.fencing)
            .entry(other.to_owned())
            .or_default()
            .clone();
        let mut last = gate.lock().await;
        if self.addresses.fenced(other).is_some() {
            return Ok(());
        }
        if let Some((at, why)) = last.as_ref()
            && at.elapsed() < self.fence_retry
        {
            return Err(ProviderError::transient(format!(
                "waiting for host {other} to be fenced: {why}"
            )));
        }
        tracing::warn!(host = other, "running the host's fence command");
        match super::fence::run(other, &fence).await {
            Ok(()) => {
                *last = None;
                self.addresses.fence(other, FENCED_BY_COMMAND);
                Ok(())
            }
            Err(why) => {
                tracing::warn!(host = other, "fencing failed: {why}");
                *last = Some((std::time::Instant::now(), why.clone()));
                Err(ProviderError::transient(format!(
                    "waiting for host {other} to be fenced: {why}"
                )))
            }
        }
    }

    /// This provider as the installation `id`: every mark it writes carries `id`, marks of
    /// other installations are never listed, adopted or deleted, and marks without an ID are
    /// adopted and rewritten with `id` by the listing (see [`ops::list`]). Without this call
    /// marks carry no ID and any mark with one is another installation's. `id` must satisfy
    /// [`mark::valid_installation_id`](super::mark::valid_installation_id) (the config checks
    /// it); an invalid one is refused here as `None` would be wrong silently.
    pub fn with_installation(mut self, id: &str) -> Result<Self> {
        if !super::mark::valid_installation_id(id) {
            return Err(ProviderError::permanent(format!(
                "installation ID {:?} is not valid: 1 to {} lowercase letters, digits, '-' or \
                 '.', starting and ending with a letter or digit",
                super::classify::truncate(id, 80),
                super::mark::MAX_INSTALLATION_ID_LEN
            )));
        }
        self.installation = Some(id.to_owned());
        Ok(self)
    }

    /// The host pool.
    pub fn pool(&self) -> &HostPool {
        &self.pool
    }

    /// Removes what failed uploads left ([`image::debris`]) on each host that answered this
    /// check, each host within one call deadline; a host that fails keeps its notes.
    async fn clear_debris(&self, reports: &[HostReport]) {
        let cfg = self.entry_cfg();
        for r in reports {
            let answered = matches!(r.state, HostState::Ready | HostState::Degraded);
            let Ok(h) = self.pool.host(&r.host) else {
                continue;
            };
            if !answered || image::debris::noted(&r.host, &h.pool).is_empty() {
                continue;
            }
            let work = async {
                let c = self.pool.control(&r.host).await?;
                let pool = self.pool_handle(&c, h).await?;
                image::debris::clear(&c, &pool, &r.host, &cfg.name).await
            };
            match tokio::time::timeout(cfg.timeouts.call, work).await {
                Ok(Ok(gone)) if !gone.is_empty() => {
                    tracing::info!(host = %r.host, ?gone, "removed temporary volumes failed uploads left");
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(host = %r.host, "removing what failed uploads left: {e}");
                }
                Err(_) => tracing::warn!(
                    host = %r.host,
                    "removing what failed uploads left took over {:?}",
                    cfg.timeouts.call
                ),
            }
        }
    }

    fn entry_cfg(&self) -> &LibvirtEntry {
        self.pool.entry()
    }

    async fn lock_name(&self, name: &str) -> Result<tokio::sync::OwnedMutexGuard<()>> {
        let m = {
            let mut g = lock(&self.locks);
            g.entry(name.to_owned()).or_default().clone()
        };
        tokio::time::timeout(NAME_LOCK_WAIT, m.lock_owned())
            .await
            .map_err(|_| {
                ProviderError::transient(format!(
                    "another operation on {name} has held it for {NAME_LOCK_WAIT:?}; retrying later"
                ))
            })
    }

    async fn host_caps(&self, client: &Client, host: &HostConfig) -> Result<HostCaps> {
        let cached = {
            let g = lock(&self.caps);
            g.get(&host.name).cloned()
        };
        if let Some(c) = cached {
            return Ok(c);
        }
        let c = caps::probe(
            client,
            &host.name,
            host.virt_type,
            self.entry_cfg().timeouts.call,
        )
        .await?;
        self.remember_caps(&host.name, c.clone());
        Ok(c)
    }

    /// The host's pool handle, looked up once per host. A handle that went stale (pool
    /// recreated: code 49 on use) is dropped by [`forget_pool`](Self::forget_pool).
    async fn pool_handle(&self, client: &Client, host: &HostConfig) -> Result<StoragePool> {
        let cached = {
            let g = lock(&self.pools);
            g.get(&host.name).cloned()
        };
        if let Some(p) = cached {
            return Ok(p);
        }
        let p = lookup_pool(client, host).await?;
        let mut g = lock(&self.pools);
        g.insert(host.name.clone(), p.clone());
        Ok(p)
    }

    fn forget_pool(&self, host: &str) {
        let mut g = lock(&self.pools);
        g.remove(host);
    }

    fn remember_caps(&self, host: &str, caps: HostCaps) {
        let mut g = lock(&self.caps);
        g.insert(host.to_owned(), caps);
    }

    fn id(&self, host: &str, uid: &ProxyUid) -> ProviderId {
        ProviderId {
            entry: self.entry_cfg().name.clone(),
            host: host.to_owned(),
            name: names::domain(&self.entry_cfg().name, uid),
        }
    }

    /// Adopts an existing domain of ours: returns `Some(instance)` when it can be used as is
    /// (after starting it if it was shut off), `None` when it was removed to be recreated.
    async fn adopt(
        &self,
        lease: &HostLease,
        dom: &Domain,
        req: &CreateRequest,
        progress: &dyn Progress,
    ) -> Result<Option<Instance>> {
        let c = lease.client();
        let host = lease.host();
        let entry = &self.entry_cfg().name;
        let inst = self.installation.as_deref();
        match ops::get::check_mark(c, dom, entry, inst, &req.uid, &host.name).await? {
            MarkCheck::Ours => {}
            other => {
                return Err(ProviderError::permanent(format!(
                    "domain {} on host {} exists and is not this Proxy's ({}); it is left \
                     untouched: remove or rename it",
                    dom.name,
                    host.name,
                    other.describe()
                )));
            }
        }
        // finding: L4 — a defined domain is started only if its disks are the ones we make.
        let pool = lookup_pool(c, host).await?;
        let overlay = names::overlay(entry, &req.uid);
        let seed_name = names::seed(entry, &req.uid);
        let overlay_vol = lookup_vol(c, &pool, &overlay, &host.name).await?;
        let seed_ok = volume_exists(c, &pool, &seed_name, &host.name).await?;
        let mismatch = match (overlay_vol, seed_ok) {
            (None, _) | (_, false) => Some("it lacks its overlay or seed".to_owned()),
            (Some(vol), true) => {
                // The overlay must be the one this request would create: backed by the base
                // the image resolves to, of the requested size (never smaller than the image).
                let (_, backing) = self.ensure_backing(lease, &pool, req, progress).await?;
                let disk = volumes::check_disk_size(req.disk_gib, &backing)?;
                let xml = c.vol_xml(&vol).await.map_err(|e| {
                    classify(
                        &e,
                        &format!("reading overlay {overlay} on host {}", host.name),
                    )
                })?;
                let facts = volumes::parse_volume_xml(&xml).ok_or_else(|| {
                    ProviderError::transient(format!(
                        "cannot read overlay {overlay}'s description on host {}",
                        host.name
                    ))
                })?;
                volumes::verify_overlay(&overlay, &host.name, &facts, disk, &backing)
                    .err()
                    .map(|e| e.message)
            }
        };
        if let Some(why) = mismatch {
            tracing::info!(domain = %dom.name, host = %host.name, why, "adopted domain's disks are not the ones this Proxy needs; recreating");
            ops::delete::delete(c, entry, inst, host, &req.uid).await?;
            return Ok(None);
        }
        let (state, _) = c.domain_state(dom).await.map_err(|e| {
            classify(
                &e,
                &format!("reading state of {} on host {}", dom.name, host.name),
            )
        })?;
        if matches!(state, domain_state::SHUTOFF | domain_state::CRASHED) {
            c.domain_create(dom).await.map_err(|e| {
                classify(&e, &format!("starting {} on host {}", dom.name, host.name))
            })?;
        }
        let id = self.id(&host.name, &req.uid);
        ops::get::get(c, entry, inst, host, &id, &req.uid)
            .await
            .map(Some)
    }

    /// The verified base `req.image` resolves to on the lease's host (imported if not cached)
    /// and what an overlay on it must name as its backing.
    async fn ensure_backing(
        &self,
        lease: &HostLease,
        pool: &StoragePool,
        req: &CreateRequest,
        progress: &dyn Progress,
    ) -> Result<(image::Base, BackingBase)> {
        let host = lease.host();
        let bulk = LeaseBulk(lease);
        let base = image::ensure_base_fitting(
            &Target {
                entry: self.entry_cfg(),
                host: &host.name,
                client: lease.client(),
                pool,
                reserve_bytes: host.pool_reserve_gib.saturating_mul(volumes::GIB),
                bulk: &bulk,
                progress,
                fetch: &self.fetch,
            },
            &req.image,
            Some(req.disk_gib),
        )
        .await?;
        let backing = BackingBase {
            path: base.path.clone(),
            capacity: base.capacity,
            // The base volume's own format (qcow2: an overlay on its data volume).
            format: base.disk_format,
            image: req.image.clone(),
        };
        Ok((base, backing))
    }

    async fn create_new(
        &self,
        lease: &HostLease,
        req: &CreateRequest,
        egress: &[std::net::IpAddr],
        progress: &dyn Progress,
        made: &mut Made,
    ) -> Result<Instance> {
        let c = lease.client();
        let host = lease.host();
        let cfg = self.entry_cfg();
        let entry = &cfg.name;
        let caps = self.host_caps(c, host).await?;
        let pool = self.pool_handle(c, host).await?;
        let reserve = host.pool_reserve_gib.saturating_mul(volumes::GIB);

        let (base, backing) = self.ensure_backing(lease, &pool, req, progress).await?;
        let disk = volumes::check_disk_size(req.disk_gib, &backing)?;
        let name = names::domain(entry, &req.uid);
        let mac = names::mac(entry, &req.uid);
        // Declared egress addresses: static, on our NIC matched by its MAC, no DHCP.
        let addr_pool = self.addresses.pool(&host.name)?;
        let statics: Vec<StaticAddress> = addr_pool
            .map(|p| {
                egress
                    .iter()
                    .filter_map(|a| StaticAddress::in_pool(*a, p))
                    .collect()
            })
            .unwrap_or_default();
        let net = addr_pool.and_then(|p| network_config::render(&mac, &statics, &p.dns));
        let declared = statics.first().map(|s| s.address);
        let seed_input = SeedInput {
            instance_id: &req.uid,
            hostname: &name,
            user_data: &req.user_data,
            network_config: net.as_deref(),
            guest: &cfg.guest,
        };
        // NB: checked here, built just before its upload (below): the image (~50 KiB) is then
        // held only while its volume is created and uploaded, not through the space check and
        // the overlay's round trips, by each of the hundreds of creates a large fleet runs.
        seed::check(&seed_input)?;
        // NB: a seed is at most MAX_SEED_BYTES, below CREATE_SPACE (asserted at compile time).
        volumes::check_space(c, &host.name, &pool, CREATE_SPACE, reserve).await?;

        let overlay_name = names::overlay(entry, &req.uid);
        let (overlay, created) =
            volumes::ensure_overlay(c, &host.name, &pool, &overlay_name, disk, &backing).await?;
        if created {
            made.overlay = Some(overlay.clone());
        }

        let seed = seed::build(&seed_input)?.image;
        let seed_name = names::seed(entry, &req.uid);
        let seed_xml = volumes::seed_xml(&seed_name, seed.len() as u64);
        let what = format!("creating seed {seed_name} on host {}", host.name);
        // NB: create first (one round trip on the usual path); an existing seed is ours by
        // name and rebuilt every time, so it is replaced.
        let seed_vol = match c.vol_create_xml(&pool, &seed_xml, 0).await {
            Ok(v) => v,
            Err(e) if e.libvirt_code() == Some(90) => {
                if let Some(old) = lookup_vol(c, &pool, &seed_name, &host.name).await? {
                    c.vol_delete(&old, 0).await.map_err(|e| {
                        classify(
                            &e,
                            &format!("replacing seed {seed_name} on host {}", host.name),
                        )
                    })?;
                }
                c.vol_create_xml(&pool, &seed_xml, 0)
                    .await
                    .map_err(|e| classify(&e, &what))?
            }
            Err(e) => return Err(classify(&e, &what)),
        };
        made.seed = Some(seed_vol.clone());
        upload_seed(c, &seed_vol, &seed, &host.name).await?;
        // NB: the image (~50 KiB) is not needed past its upload; hundreds of creates may be
        // between here and running at once on a large fleet.
        drop(seed);

        let nic = match (&host.bridge, &host.network) {
            (Some(b), _) => Some(NicAttach::Bridge(b)),
            (None, Some(n)) => Some(NicAttach::Network(n)),
            (None, None) => None,
        };
        // Two NICs with one MAC break each other's networking: refuse before defining.
        if nic.is_some()
            && let Some(other) = self.macs.user(c, &host.name, &mac, &name).await?
        {
            return Err(ProviderError::permanent(format!(
                "the MAC address {mac} this Proxy's guest would get (derived from its UID and \
                 entry {entry}) is already used by domain {other} on host {}; two guests with \
                 one MAC break each other's networking. Place the Proxy on another host, or \
                 recreate it under another name (a new UID derives another MAC), or remove \
                 {other}",
                host.name
            )));
        }
        // The entry's network filter, on the host before the domain that references it.
        // Its NIC is pinned to its MAC and addresses (the declared ones, else its DHCP
        // lease), and DNS passes only to the resolvers this host hands out.
        let (filter, filter_params) = if nic.is_some() && cfg.policy.network_filter {
            let fname = names::nwfilter(entry, self.installation.as_deref());
            let subnets = self.subnets.get(c, host, lease.generation()).await;
            let own = nwfilter::host_addresses(host, cfg.timeouts.dial).await;
            let mut resolvers: Vec<std::net::IpAddr> =
                addr_pool.map(|p| p.dns.clone()).unwrap_or_default();
            resolvers.extend(subnets.network_addresses.iter().copied());
            let set = nwfilter::render_set(
                &fname,
                &nwfilter::HostFilter {
                    policy: &cfg.policy,
                    host_addresses: &own,
                    resolvers: &resolvers,
                },
            );
            nwfilter::ensure_set(c, &host.name, &set).await?;
            let declared: Vec<std::net::IpAddr> = statics.iter().map(|s| s.address).collect();
            let mut cidrs = subnets.guest_cidr.clone();
            cidrs.extend(subnets.network.iter().flatten().copied());
            // A guest whose namespace is not granted the entry's internal networks gets
            // the root that lifts none.
            let root = if req.lift_internal {
                fname
            } else {
                nwfilter::strict_name(&fname)
            };
            (Some(root), nwfilter::nic_params(&mac, &declared, &cidrs))
        } else {
            (None, Vec::new())
        };
        // The base's data volume, declared as the last layer (the chain ends there).
        let data = base.data_path.as_deref().map(|path| Backing {
            path,
            format: base.format,
            below: None,
        });
        let define = |caps: &HostCaps, uuid: Option<uuid::Uuid>| {
            domain_xml::build(
                &DomainSpec {
                    name: &name,
                    uuid,
                    vcpus: req.vcpus,
                    memory_mib: req.memory_mib,
                    firmware: base.firmware,
                    root: DiskSource::Volume {
                        pool: &pool.name,
                        volume: &overlay.name,
                    },
                    backing: Some(Backing {
                        path: &base.path,
                        format: base.disk_format,
                        below: data.as_ref(),
                    }),
                    seed: DiskSource::Volume {
                        pool: &pool.name,
                        volume: &seed_vol.name,
                    },
                    nic: nic.map(|attach| Nic {
                        attach,
                        mac: &mac,
                        filter: filter.as_deref(),
                        filter_params: &filter_params,
                    }),
                    uid: &req.uid,
                    entry,
                    created_at: SystemTime::now(),
                    installation: self.installation.as_deref(),
                    addresses: egress,
                },
                caps,
            )
        };
        let xml = define(&caps, None)?;
        let mut dom = c
            .domain_define_xml(&xml, 0)
            .await
            .map_err(|e| classify(&e, &format!("defining {name} on host {}", host.name)))?;
        made.domain = Some(dom.clone());
        if nic.is_some() {
            self.macs.note(&host.name, &mac, &name);
        }
        if let Err(e) = c.domain_create(&dom).await {
            let err = classify(&e, &format!("starting {name} on host {}", host.name));
            // NB: `virtType: auto` chose KVM because the host lists it and QEMU enabled it,
            // but nested KVM can still fail at start ("failed to set MSR"): no remote query
            // shows that. Learn it once per host, fall back to TCG, and retry this domain.
            if host.virt_type != VirtType::Auto || caps.virt != Virt::Kvm {
                return Err(err);
            }
            tracing::warn!(host = %host.name, "KVM listed but a guest failed to start ({err}); using TCG on this host");
            let tcg = caps::probe(c, &host.name, VirtType::Qemu, cfg.timeouts.call).await?;
            self.remember_caps(&host.name, tcg.clone());
            // Same UUID: this replaces the definition we just made.
            let xml = define(&tcg, Some(uuid::Uuid::from_bytes(dom.uuid)))?;
            dom = c.domain_define_xml(&xml, 0).await.map_err(|e| {
                classify(
                    &e,
                    &format!("redefining {name} for TCG on host {}", host.name),
                )
            })?;
            made.domain = Some(dom.clone());
            c.domain_create(&dom).await.map_err(|e| {
                classify(
                    &e,
                    &format!("starting {name} with TCG on host {}", host.name),
                )
            })?;
        }
        wait_running(c, &dom, &host.name, cfg.timeouts.start).await?;
        // NB: just defined with our mark and seen running: reading it all back would cost
        // five more round trips for what we already know; the address comes with `get`.
        // NB: on a host with an address pool the address is the one we configured (see
        // ops::get): known now, so the instance is Running with it.
        Ok(Instance {
            id: self.id(&host.name, &req.uid),
            uid: req.uid,
            state: if declared.is_some() {
                InstanceState::Running
            } else {
                InstanceState::Provisioning
            },
            ip: declared,
            mac,
            egress: egress.to_vec(),
            address_note: None,
        })
    }
}

async fn lookup_pool(c: &Client, host: &HostConfig) -> Result<StoragePool> {
    c.pool_lookup_by_name(&host.pool).await.map_err(|e| {
        let err = classify(
            &e,
            &format!("looking up pool {} on host {}", host.pool, host.name),
        );
        if err.is_not_found() {
            ProviderError::permanent(format!(
                "storage pool {} (hosts[{}].pool) does not exist on host {}",
                host.pool, host.name, host.name
            ))
        } else {
            err
        }
    })
}

async fn lookup_vol(
    c: &Client,
    pool: &StoragePool,
    name: &str,
    host: &str,
) -> Result<Option<StorageVol>> {
    image::cache::lookup(c, pool, name)
        .await
        .map_err(|e| classify(&e, &format!("looking up volume {name} on host {host}")))
}

async fn volume_exists(c: &Client, pool: &StoragePool, name: &str, host: &str) -> Result<bool> {
    lookup_vol(c, pool, name, host).await.map(|v| v.is_some())
}

async fn upload_seed(c: &Client, vol: &StorageVol, bytes: &[u8], host: &str) -> Result<()> {
    // NB: the seed is small (≤ 2 MiB, bounded by the seed builder), so it goes on the pooled
    // control connection: a dedicated one would cost a dial and three handshake calls. Image
    // imports, which are bulk, always use dedicated connections.
    let opts = libvirt_remote::UploadOptions {
        deadline: Some(SEED_UPLOAD_BUDGET),
        ..Default::default()
    };
    c.vol_upload(vol, 0, bytes.len() as u64, bytes, &opts)
        .await
        .map(|_| ())
        .map_err(|e| classify(&e, &format!("uploading seed {} to host {host}", vol.name)))
}

async fn wait_running(c: &Client, dom: &Domain, host: &str, budget: Duration) -> Result<()> {
    let deadline = tokio::time::Instant::now() + budget;
    loop {
        let (state, reason) = c
            .domain_state(dom)
            .await
            .map_err(|e| classify(&e, &format!("reading state of {} on host {host}", dom.name)))?;
        if state == domain_state::RUNNING {
            return Ok(());
        }
        if matches!(state, domain_state::SHUTOFF | domain_state::CRASHED) {
            return Err(ProviderError::transient(format!(
                "{} on host {host} stopped right after starting (state {state}, reason {reason}); \
                 see the host's /var/log/libvirt/qemu/{}.log",
                dom.name, dom.name
            )));
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(ProviderError::transient(format!(
                "{} on host {host} did not reach running within {budget:?} (state {state})",
                dom.name
            )));
        }
        tokio::time::sleep(START_POLL).await;
    }
}

/// Removes what a failed create made, newest first; best effort, bounded. True when no
/// domain is left of it: none was defined, or its undefine succeeded.
async fn undo(c: &Client, made: Made, host: &str) -> bool {
    let work = async {
        let mut gone = true;
        if let Some(dom) = made.domain {
            let _ = c.domain_destroy(&dom, 0).await;
            if let Err(e) = c.domain_undefine(&dom, undefine::ALL_METADATA).await {
                tracing::warn!(domain = %dom.name, host, "cleanup: undefine failed: {e}");
                gone = false;
            }
        }
        for vol in [made.seed, made.overlay].into_iter().flatten() {
            if let Err(e) = c.vol_delete(&vol, 0).await {
                tracing::warn!(volume = %vol.name, host, "cleanup: delete failed: {e}");
            }
        }
        gone
    };
    match tokio::time::timeout(CLEANUP_BUDGET, work).await {
        Ok(gone) => gone,
        Err(_) => {
            tracing::warn!(
                host,
                "cleanup after a failed create did not finish in {CLEANUP_BUDGET:?}"
            );
            false
        }
    }
}

#[async_trait]
impl Provider for LibvirtProvider {
    fn entry(&self) -> &str {
        &self.entry_cfg().name
    }

    fn use_retired(&self, retired: std::sync::Arc<super::retired::RetiredAddresses>) {
        self.addresses.use_retired(retired);
    }

    /// The addresses `host`'s instances held may move to other hosts of its segment (see
    /// [`AddressBook::fence`]); only while its last check found it dead, so a declaration
    /// that outlived the outage never frees what a live host's instances hold.
    fn fence_host(&self, host: &str) -> Result<Vec<IpAddr>> {
        self.pool.host(host)?;
        if self.addresses.fenced(host).is_some() {
            return Ok(Vec::new());
        }
        if !lock(&self.dead).contains(host) {
            return Err(ProviderError::transient(format!(
                "host {host} of entry {} is not declared dead: its last check did not find \
                 it dead (Unreachable or Timeout)",
                self.entry_cfg().name
            )));
        }
        Ok(self.addresses.fence(host, FENCED_BY_ADMIN))
    }

    async fn create(&self, req: &CreateRequest, progress: &dyn Progress) -> Result<Instance> {
        let host_name = req.host.clone();
        self.pool.host(&host_name)?;
        let name = names::domain(&self.entry_cfg().name, &req.uid);
        let _guard = self.lock_name(&name).await?;
        let lease = self.pool.acquire(&host_name).await?;
        let c = lease.client();
        match c.domain_lookup_by_name(&name).await {
            Ok(dom) => {
                if let Some(inst) = self.adopt(&lease, &dom, req, progress).await? {
                    return Ok(inst);
                }
            }
            Err(e) if e.libvirt_code() == Some(42) => {}
            Err(e) => {
                return Err(classify(
                    &e,
                    &format!("looking up {name} on host {host_name}"),
                ));
            }
        }
        // The domain is absent now (looked up under the name lock): allocate its addresses,
        // after the host's allocations were read; refused allocations define nothing.
        self.addresses
            .ensure_rebuilt(
                c,
                &self.entry_cfg().name,
                self.installation.as_deref(),
                &host_name,
            )
            .await?;
        let held = self.allocate_moving(&host_name, &name, req).await?;
        let egress = held.as_ref().map_or(&[][..], |h| &h.addresses[..]);
        let mut made = Made::default();
        match self
            .create_new(&lease, req, egress, progress, &mut made)
            .await
        {
            Ok(inst) => Ok(inst),
            Err(e) => {
                if undo(c, made, &host_name).await {
                    // No domain of this Proxy exists (it was absent under the name lock, and
                    // none this call defined is left): nothing holds its addresses, so they
                    // must not make the host look full to the retry's placement.
                    drop(held);
                    self.addresses.release_deleted(&host_name, &name);
                }
                if e.libvirt_code == Some(49) {
                    // The cached pool handle may be stale (pool recreated): look it up again
                    // next time.
                    self.forget_pool(&host_name);
                }
                Err(e)
            }
        }
    }

    async fn get(&self, id: &ProviderId, uid: &ProxyUid) -> Result<Instance> {
        if id.entry != self.entry_cfg().name {
            return Err(ProviderError::not_found(format!(
                "providerID {id} belongs to entry {}, not {}",
                id.entry,
                self.entry_cfg().name
            )));
        }
        let lease = self.pool.acquire(&id.host).await?;
        ops::get::get_cached(
            lease.client(),
            &self.entry_cfg().name,
            self.installation.as_deref(),
            lease.host(),
            id,
            uid,
            Some((&self.subnets, lease.generation())),
        )
        .await
    }

    async fn delete(&self, host: &str, uid: &ProxyUid) -> Result<()> {
        let name = names::domain(&self.entry_cfg().name, uid);
        let _guard = self.lock_name(&name).await?;
        let lease = self.pool.acquire(host).await?;
        ops::delete::delete(
            lease.client(),
            &self.entry_cfg().name,
            self.installation.as_deref(),
            lease.host(),
            uid,
        )
        .await?;
        // Confirmed gone: its declared addresses may go to another instance.
        self.addresses.release_deleted(host, &name);
        Ok(())
    }

    async fn list_owned(&self) -> Result<Vec<OwnedInstance>> {
        let mut all = Vec::new();
        for h in &self.entry_cfg().hosts {
            let lease = self.pool.acquire(&h.name).await?;
            let started = self.addresses.listing_started(&h.name);
            let listing = ops::list::list_host(
                lease.client(),
                &self.entry_cfg().name,
                self.installation.as_deref(),
                &h.name,
            )
            .await?;
            // A complete listing: what it no longer shows is gone (see AddressBook).
            self.addresses
                .apply_listing(&h.name, started, &listing.claims);
            all.extend(listing.owned);
        }
        Ok(all)
    }

    async fn check(&self) -> Vec<HostReport> {
        match check::check_all(&self.pool, &self.check).await {
            Ok(mut r) => {
                {
                    let mut dead = lock(&self.dead);
                    for h in &r {
                        if matches!(h.state, HostState::Unreachable | HostState::Timeout) {
                            dead.insert(h.host.clone());
                        } else {
                            dead.remove(&h.host);
                        }
                    }
                }
                self.clear_debris(&r).await;
                let (entry, budget) = (&self.entry_cfg().name, self.entry_cfg().timeouts.call);
                self.addresses
                    .fill_usage(
                        &self.pool,
                        entry,
                        self.installation.as_deref(),
                        budget,
                        &mut r,
                    )
                    .await;
                r
            }
            Err(e) => self
                .entry_cfg()
                .hosts
                .iter()
                .map(|h| HostReport {
                    host: h.name.clone(),
                    state: HostState::Degraded,
                    latency: None,
                    hostname: None,
                    libvirt_version: None,
                    virt_types: vec![],
                    uefi: false,
                    pool_free_bytes: None,
                    missing: vec![],
                    error: Some(e.message.clone()),
                    addresses: Vec::new(),
                })
                .collect(),
        }
    }

    async fn prefetch(&self, host: &str, image: &str, progress: &dyn Progress) -> Result<()> {
        // Same path as create's base step: host slot, cached pool handle, reserve, bulk
        // connections from the lease; nothing but the base (and its marker) is made.
        let lease = self.pool.acquire(host).await?;
        let c = lease.client();
        let host_cfg = lease.host();
        let pool = self.pool_handle(c, host_cfg).await?;
        let bulk = LeaseBulk(&lease);
        let res = image::ensure_base(
            &Target {
                entry: self.entry_cfg(),
                host: &host_cfg.name,
                client: c,
                pool: &pool,
                reserve_bytes: host_cfg.pool_reserve_gib.saturating_mul(volumes::GIB),
                bulk: &bulk,
                progress,
                fetch: &self.fetch,
            },
            image,
        )
        .await;
        match res {
            Ok(_) => Ok(()),
            Err(e) => {
                if e.libvirt_code == Some(49) {
                    self.forget_pool(host);
                }
                Err(e)
            }
        }
    }

    async fn list_owned_volumes(&self) -> Result<Vec<crate::model::OwnedVolume>> {
        // NB: like `list_owned`, all or nothing: one host failing fails the entry's list, so
        // a collector never sweeps from a partial view (finding M15).
        let now = SystemTime::now();
        let mut all = Vec::new();
        for h in &self.entry_cfg().hosts {
            let lease = self.pool.acquire(&h.name).await?;
            all.extend(
                ops::orphans::list_volumes(
                    lease.client(),
                    &self.entry_cfg().name,
                    &h.name,
                    &h.pool,
                    now,
                )
                .await?,
            );
        }
        Ok(all)
    }

    async fn delete_orphan_volume(&self, v: &crate::model::OwnedVolume) -> Result<()> {
        // NB: an overlay or seed is deleted under the same per-name lock as create and delete
        // of its UID, so a create in this process cannot define the domain between the
        // re-check and the delete.
        let _guard = match v.uid {
            Some(uid) => Some(
                self.lock_name(&names::domain(&self.entry_cfg().name, &uid))
                    .await?,
            ),
            None => None,
        };
        let lease = self.pool.acquire(&v.host).await?;
        let pool_name = lease.host().pool.clone();
        ops::orphans::delete_orphan_volume(lease.client(), &self.entry_cfg().name, &pool_name, v)
            .await
    }

    async fn collect_bases(
        &self,
        settings: &crate::bases::BaseGcSettings,
    ) -> Vec<crate::bases::BaseVerdict> {
        use futures_util::StreamExt;
        let entry = &self.entry_cfg().name;
        let grace = settings
            .grace
            .unwrap_or_else(|| self.entry_cfg().limits.unused_base_grace());
        let one = |host: String| async move {
            // NB: on the pooled control connection without an operation slot, as the host
            // check: a pass of reads (and at most three deletes per base) must not take a slot
            // a create or delete waits for. Safety against a create of this process does not
            // rest on slots but on the image's import lock and the recent-use record.
            let work = async {
                let cfg = self.pool.host(&host)?;
                let c = self.pool.control(&host).await?;
                let pool = self.pool_handle(&c, cfg).await?;
                let scope = image::gc::HostScope {
                    entry,
                    host: &host,
                    client: &c,
                    pool: &pool,
                    import_timeout: self.entry_cfg().timeouts.image_import,
                };
                let r = image::gc::collect_host(&scope, settings, grace, &self.unused_bases).await;
                if matches!(&r, Err(e) if e.libvirt_code == Some(49)) {
                    self.forget_pool(&host);
                }
                r
            };
            let failed = |reason: String| {
                vec![crate::bases::BaseVerdict {
                    entry: entry.clone(),
                    host: host.clone(),
                    name: "*".into(),
                    action: crate::bases::BaseAction::Failed,
                    rule: "base-host-failed",
                    reason,
                }]
            };
            match tokio::time::timeout(BASE_GC_HOST_BUDGET, work).await {
                Ok(Ok(v)) => v,
                Ok(Err(e)) => failed(format!("nothing removed on this host: {e}")),
                Err(_) => failed(format!(
                    "nothing more removed on this host: the pass did not finish within {}s",
                    BASE_GC_HOST_BUDGET.as_secs()
                )),
            }
        };
        let hosts: Vec<String> = self
            .entry_cfg()
            .hosts
            .iter()
            .map(|h| h.name.clone())
            .collect();
        futures_util::stream::iter(hosts)
            .map(one)
            .buffered(BASE_GC_PARALLEL)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .flatten()
            .collect()
    }
}
