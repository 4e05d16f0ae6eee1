//! Declared egress addresses of one provider entry, per segment: which instance holds which
//! address of the segment's address pool, kept in one [`HostAddresses`] per segment (hosts of
//! an entry with the same `segment` share one; a host without one is a segment of its own) and
//! fed by the hosts' own listings, so the hosts stay the source of truth across operator
//! restarts. A holder is `host/domain` (one Proxy's domain has the same name on every host).
//!
//! Guarantees:
//! - **rebuilt before the first allocation**: nothing of a segment is allocated until every
//!   host of it has had one complete listing of its domains ([`ops::list::list_host`])
//!   recorded, or has been fenced ([`AddressBook::fence`]): a restart during an outage never
//!   guesses what a dead host holds. Every valid mark under our namespace that records
//!   addresses counts as held, whatever its entry or installation. Concurrent first creates on
//!   a host share that one listing;
//! - **never two holders**: the allocator hands an address to at most one holder in the whole
//!   segment; allocation for a holder is idempotent (a retried create gets the same addresses);
//! - **released only when the instance is confirmed gone**: after a delete succeeded
//!   ([`AddressBook::release_deleted`]); after a failed create that left no domain (none
//!   existed under the per-name lock and the one it defined, if any, was undefined), so the
//!   retry's placement does not see the host full of its own allocation; when a complete
//!   listing of the holder's host that started after the holder's last create ended no longer
//!   shows it ([`AddressBook::apply_listing`]; a listing of one host never releases another
//!   host's holders); or when its host was fenced (its fence command exited 0, or an
//!   administrator declared it dead). Never on a timeout. A create in flight is never
//!   released by a listing, whatever the listing saw;
//! - **a fence lasts one outage**: a fenced host that answers again is listed at its next
//!   check or before a create on it, and the listing replaces the fence; when it dies again,
//!   what its instances hold then moves only after a fence of its own (a fence recorded for
//!   an earlier outage never stands in for it);
//! - a failed allocation holds nothing it did not hold before; its error names the host and
//!   the pool's family (exhaustion: QuotaExceeded) or the ranges (outside the pool: Permanent);
//!   a pinned address held on the same host is Permanent, one held on another host of the
//!   segment Transient, naming that host and what is waited for;
//! - **retired addresses are never handed out** (see [`super::retired`]): the retirements of
//!   every host of the segment are read before every allocation, and while they have not been
//!   read back after a start (the registry is not primed) nothing is allocated (Transient);
//! - the lock is a std mutex held for in-memory work only, never across an `.await`.
//!
//! One piece (about 630 lines, its tests apart): the segment book's state (holdings, listed
//! and fenced hosts, creates in flight and their ends) is read and changed together by every
//! method under one lock; split, the rule that a listing, a create's end and a fence see one
//! consistent state would span files.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use libvirt_remote::Client;

use super::address_alloc::{AllocError, HostAddresses};
use super::address_pool::ParsedPool;
use super::config::LibvirtEntry;
use super::hostpool::HostPool;
use super::ops::list::{self, Claim};
use super::retired::RetiredAddresses;
use crate::error::{ProviderError, Result};
use crate::model::{AddressUsage, HostReport, HostState};
use crate::sync::lock;

/// One segment's allocation state (a host without `segment` is a segment of its own). A
/// holder is `host/domain`: a domain name is unique on a host, and one Proxy's domain has the
/// same name on every host.
#[derive(Debug)]
struct SegmentBook {
    alloc: HostAddresses,
    /// Hosts of the segment whose complete listing has been recorded.
    listed: HashSet<String>,
    /// Hosts fenced since their last listing (their guests are off), with how.
    fenced: HashMap<String, String>,
    /// Holder → creates in flight for it.
    in_flight: HashMap<String, u32>,
    /// Holder → the sequence number at which its last create ended.
    ended: HashMap<String, u64>,
    /// Increases at every create end and listing start.
    seq: u64,
}

fn holder_key(host: &str, domain: &str) -> String {
    format!("{host}/{domain}")
}

/// The host part of a holder key.
fn holder_host(key: &str) -> &str {
    key.split_once('/').map_or(key, |(h, _)| h)
}

/// The address pools of an entry's hosts and their allocations.
#[derive(Debug, Default)]
pub struct AddressBook {
    pools: HashMap<String, ParsedPool>,
    /// Pools that did not parse, by host, with the reason (the config check refuses them; a
    /// create on such a host fails Permanent rather than ignoring the pool).
    invalid: HashMap<String, String>,
    /// Host → its segment's key ([`LibvirtEntry`] hosts' `segment`, else the host itself).
    segment_of: HashMap<String, String>,
    /// Segment key → its hosts, in config order.
    members: HashMap<String, Vec<String>>,
    books: Mutex<HashMap<String, SegmentBook>>,
    /// One first listing per host at a time.
    rebuilding: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The entry's name (retirements are kept per entry and host).
    entry: String,
    /// Addresses no one is given now (shared by every provider of the process).
    retired: Mutex<Arc<RetiredAddresses>>,
}

/// A create in flight for a holder: while it lives, no listing releases the holder's
/// addresses. Dropping it (success, failure or a cancelled create) ends the create.
#[derive(Debug)]
pub struct InFlight<'a> {
    book: &'a AddressBook,
    host: String,
    /// The holder key (`host/domain`).
    holder: String,
    /// The addresses allocated (IPv4 first).
    pub addresses: Vec<IpAddr>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let seg = self.book.segment(&self.host);
        let mut g = lock(&self.book.books);
        if let Some(b) = g.get_mut(seg) {
            if let Some(n) = b.in_flight.get_mut(&self.holder) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    b.in_flight.remove(&self.holder);
                }
            }
            b.seq += 1;
            let s = b.seq;
            b.ended.insert(self.holder.clone(), s);
        }
    }
}

fn family_name(v4: bool) -> &'static str {
    if v4 { "IPv4" } else { "IPv6" }
}

impl AddressBook {
    /// The pools of `entry`'s hosts (hosts without `addressPool` have none).
    pub fn new(entry: &LibvirtEntry) -> Self {
        let mut pools = HashMap::new();
        let mut invalid = HashMap::new();
        let mut segment_of = HashMap::new();
        let mut members: HashMap<String, Vec<String>> = HashMap::new();
        for h in &entry.hosts {
            let seg = h.segment_key();
            members.entry(seg.clone()).or_default().push(h.name.clone());
            segment_of.insert(h.name.clone(), seg);
            let Some(p) = &h.address_pool else { continue };
            match p.parse() {
                Ok(pp) => {
                    pools.insert(h.name.clone(), pp);
                }
                Err(errs) => {
                    let why = errs
                        .iter()
                        .map(|e| format!("addressPool.{}: {}", e.field, e.message))
                        .collect::<Vec<_>>()
                        .join("; ");
                    invalid.insert(h.name.clone(), why);
                }
            }
        }
        Self {
            pools,
            invalid,
            segment_of,
            members,
            entry: entry.name.clone(),
            ..Self::default()
        }
    }

    /// Consults `retired` (the process's retirements) before it hands out an address.
    pub fn use_retired(&self, retired: Arc<RetiredAddresses>) {
        *lock(&self.retired) = retired;
    }

    /// The retired addresses of `host`'s segment (every host of it shares its pool).
    fn retired_of(&self, host: &str) -> Option<Vec<IpAddr>> {
        let reg = Arc::clone(&lock(&self.retired));
        let now = SystemTime::now();
        let mut out = Vec::new();
        for h in self.hosts_of(host) {
            out.extend(reg.of_host(&self.entry, h, now)?.iter().map(|r| r.address));
        }
        Some(out)
    }

    /// `host`'s segment key (the host itself when it is not in the config).
    fn segment<'a>(&'a self, host: &'a str) -> &'a str {
        self.segment_of.get(host).map_or(host, String::as_str)
    }

    /// The hosts of `host`'s segment (at least `host`).
    fn hosts_of<'a>(&'a self, host: &'a str) -> Vec<&'a str> {
        match self.members.get(self.segment(host)) {
            Some(m) if !m.is_empty() => m.iter().map(String::as_str).collect(),
            _ => vec![host],
        }
    }

    /// The hosts of `host`'s segment neither listed nor fenced yet (their holdings unknown).
    fn unknown_hosts(&self, host: &str, b: &SegmentBook) -> Vec<String> {
        self.hosts_of(host)
            .into_iter()
            .filter(|h| !b.listed.contains(*h) && !b.fenced.contains_key(*h))
            .map(str::to_owned)
            .collect()
    }

    /// The host's parsed pool; `Ok(None)` without one, Permanent when it is invalid.
    pub fn pool(&self, host: &str) -> Result<Option<&ParsedPool>> {
        if let Some(why) = self.invalid.get(host) {
            return Err(ProviderError::permanent(format!(
                "host {host}'s address pool is not valid: {why}"
            )));
        }
        Ok(self.pools.get(host))
    }

    /// Records one complete listing of `host` unless one has been recorded since the start and
    /// since its last fence; the first caller lists, concurrent ones wait for it. A host
    /// without a pool needs none. A fenced host that answers again is listed at its next check
    /// or create, so the fence never outlives the outage: its next outage needs a fence (or an
    /// answer) of its own.
    pub async fn ensure_rebuilt(
        &self,
        client: &Client,
        entry: &str,
        installation: Option<&str>,
        host: &str,
    ) -> Result<()> {
        if !self.pools.contains_key(host) || self.is_rebuilt(host) {
            return Ok(());
        }
        let gate = lock(&self.rebuilding)
            .entry(host.to_owned())
            .or_default()
            .clone();
        let _g = gate.lock().await;
        if self.is_rebuilt(host) {
            return Ok(());
        }
        let started = self.listing_started(host);
        // NB: claims come from every mark; the installation is this one's, so the listing
        // treats the marks it reads exactly as the entry's own listings do.
        let listing = list::list_host(client, entry, installation, host).await?;
        self.apply_listing(host, started, &listing.claims);
        Ok(())
    }

    /// Listed, and not fenced since (a fence stands in for a listing only while the host is
    /// down).
    fn is_rebuilt(&self, host: &str) -> bool {
        lock(&self.books)
            .get(self.segment(host))
            .is_some_and(|b| b.listed.contains(host) && !b.fenced.contains_key(host))
    }

    fn with_book<T>(&self, host: &str, f: impl FnOnce(&mut SegmentBook) -> T) -> Option<T> {
        let pool = self.pools.get(host)?;
        let mut g = lock(&self.books);
        let b = g
            .entry(self.segment(host).to_owned())
            .or_insert_with(|| SegmentBook {
                alloc: HostAddresses::new(pool),
                listed: HashSet::new(),
                fenced: HashMap::new(),
                in_flight: HashMap::new(),
                ended: HashMap::new(),
                seq: 0,
            });
        Some(f(b))
    }

    /// Call right before a listing of `host` is requested; hand the number to
    /// [`apply_listing`](Self::apply_listing).
    pub fn listing_started(&self, host: &str) -> u64 {
        self.with_book(host, |b| {
            b.seq += 1;
            b.seq
        })
        .unwrap_or(0)
    }

    /// Records a complete listing of `host` that started at `started`: every claim is held
    /// (claims conflicting with what is held are logged; the address stays with its first
    /// holder), and every holder the listing does not show is released — unless a create for
    /// it is in flight or ended after the listing started.
    pub fn apply_listing(&self, host: &str, started: u64, claims: &[Claim]) {
        self.with_book(host, |b| {
            let shown: HashSet<String> = claims.iter().map(|c| holder_key(host, &c.domain)).collect();
            let gone: Vec<String> = b
                .alloc
                .holders()
                .filter(|h| holder_host(h) == host)
                .filter(|h| !shown.contains(*h))
                .filter(|h| !b.in_flight.contains_key(*h))
                .filter(|h| b.ended.get(*h).is_none_or(|e| *e < started))
                .map(str::to_owned)
                .collect();
            for h in gone {
                let freed = b.alloc.release(&h);
                b.ended.remove(&h);
                tracing::info!(host, holder = %h, ?freed, "released the addresses of an instance the host no longer lists");
            }
            let keys: Vec<(String, IpAddr)> = claims
                .iter()
                .flat_map(|c| c.addresses.iter().map(|a| (holder_key(host, &c.domain), *a)))
                .collect();
            let conflicts = b
                .alloc
                .rebuild(keys.iter().map(|(k, a)| (k.as_str(), *a)));
            for c in conflicts {
                tracing::warn!(host, address = %c.address, kept = %c.kept, refused = %c.refused, "two domains claim one declared egress address; it stays with the first");
            }
            b.listed.insert(host.to_owned());
            // It answered: its listing, not the fence, says what it holds from now on.
            b.fenced.remove(host);
        });
    }

    /// Allocates `holder`'s addresses on `host` (one per family of the pool, or exactly the
    /// `pinned` ones), for a create about to define its domain. The caller guarantees the
    /// holder's domain does not exist now (it looked under the per-name lock), so an address
    /// it held from an earlier failed create may be given up for a different pinned one.
    /// `Ok(None)` for a host without a pool. The returned guard marks the create in flight.
    pub fn allocate(
        &self,
        host: &str,
        holder: &str,
        pinned: &[IpAddr],
    ) -> Result<Option<InFlight<'_>>> {
        self.allocate_avoiding(host, holder, pinned, &[])
    }

    /// [`Self::allocate`], never choosing one of `reserved` for a holder that pins nothing
    /// (see [`HostAddresses::allocate_avoiding`](super::address_alloc::HostAddresses::allocate_avoiding)).
    pub fn allocate_avoiding(
        &self,
        host: &str,
        holder: &str,
        pinned: &[IpAddr],
        reserved: &[IpAddr],
    ) -> Result<Option<InFlight<'_>>> {
        let Some(pool) = self.pool(host)? else {
            if let Some(p) = pinned.first() {
                return Err(ProviderError::permanent(format!(
                    "{p} is pinned, but host {host} has no address pool (addressPool) to give \
                     it from"
                )));
            }
            return Ok(None);
        };
        let mut fams: Vec<(bool, Option<IpAddr>)> = Vec::new();
        if pinned.is_empty() {
            fams.extend(pool.ipv4.iter().map(|_| (true, None)));
            fams.extend(pool.ipv6.iter().map(|_| (false, None)));
        } else {
            for v4 in [true, false] {
                let mut of = pinned.iter().filter(|a| a.is_ipv4() == v4);
                if let Some(p) = of.next() {
                    if let Some(q) = of.next() {
                        return Err(ProviderError::permanent(format!(
                            "two {} addresses are pinned ({p}, {q}); a Proxy has at most one \
                             per family",
                            family_name(v4)
                        )));
                    }
                    fams.push((v4, Some(*p)));
                }
            }
        }
        let Some(retired) = self.retired_of(host) else {
            return Err(ProviderError::transient(format!(
                "the retired addresses of host {host}'s address pool have not been read back \
                 yet; retrying"
            )));
        };
        let key = holder_key(host, holder);
        let holder = key.as_str();
        let res = self.with_book(host, |b| {
            let unknown = self.unknown_hosts(host, b);
            if unknown.iter().any(|h| h == host) {
                return Err(ProviderError::transient(format!(
                    "host {host}'s address allocations have not been read yet; retrying"
                )));
            }
            if !unknown.is_empty() {
                // NB: a restart during an outage must not guess what a dead host holds.
                return Err(ProviderError::transient(format!(
                    "no address of host {host}'s segment is handed out until every host of it \
                     has been listed once or fenced: waiting for {}",
                    unknown.join(", ")
                )));
            }
            let before: Vec<IpAddr> = [true, false]
                .iter()
                .filter_map(|v4| b.alloc.held_by(holder, *v4))
                .collect();
            let mut got = Vec::new();
            for (v4, p) in &fams {
                if let Some(p) = p
                    && b.alloc.held_by(holder, *v4).is_some_and(|h| h != *p)
                {
                    // Its domain is gone (the caller's guarantee): the old one is free.
                    b.alloc.release(holder);
                }
                match b
                    .alloc
                    .allocate_excluding(holder, *v4, *p, reserved, &retired)
                {
                    Ok(a) => got.push(a),
                    Err(e) => {
                        if before.is_empty() {
                            b.alloc.release(holder);
                        }
                        return Err(alloc_error(host, e, &retired));
                    }
                }
            }
            *b.in_flight.entry(holder.to_owned()).or_default() += 1;
            Ok(got)
        });
        match res {
            None => Ok(None),
            Some(Err(e)) => Err(e),
            Some(Ok(addresses)) => Ok(Some(InFlight {
                book: self,
                host: host.to_owned(),
                holder: key.clone(),
                addresses,
            })),
        }
    }

    /// Frees `holder`'s addresses on `host`: call only once its domain is confirmed gone (a
    /// delete succeeded, or a failed create left none).
    pub fn release_deleted(&self, host: &str, holder: &str) {
        let key = holder_key(host, holder);
        self.with_book(host, |b| {
            let freed = b.alloc.release(&key);
            b.ended.remove(&key);
            if !freed.is_empty() {
                tracing::info!(
                    host,
                    holder,
                    ?freed,
                    "released the addresses of an instance confirmed gone"
                );
            }
        });
    }

    /// Usage of `host`'s pool per family; empty without a pool or before the host's first
    /// listing was recorded (the holdings are unknown then).
    pub fn usage(&self, host: &str) -> Vec<AddressUsage> {
        let Some(pool) = self.pools.get(host) else {
            return Vec::new();
        };
        let retired = self.retired_of(host).unwrap_or_default();
        self.with_book(host, |b| {
            if !self.unknown_hosts(host, b).is_empty() {
                return Vec::new();
            }
            [(true, pool.ipv4.as_ref()), (false, pool.ipv6.as_ref())]
                .into_iter()
                .filter_map(|(v4, f)| {
                    let f = f?;
                    let size = f.size();
                    // Retired and not held (a held one counts as held).
                    let retired = retired
                        .iter()
                        .filter(|a| {
                            a.is_ipv4() == v4 && f.contains(**a) && b.alloc.holder_of(**a).is_none()
                        })
                        .count();
                    Some(AddressUsage {
                        family: family_name(v4),
                        size,
                        held: u64::try_from(size.saturating_sub(b.alloc.free(v4)))
                            .unwrap_or(u64::MAX),
                        retired: u64::try_from(retired).unwrap_or(u64::MAX),
                    })
                })
                .collect()
        })
        .unwrap_or_default()
    }

    /// Fills each reachable pool host's address usage in `reports`, reading its allocations
    /// first if this process has not yet (one listing per host, within `budget`).
    pub async fn fill_usage(
        &self,
        hosts: &HostPool,
        entry: &str,
        installation: Option<&str>,
        budget: Duration,
        reports: &mut [HostReport],
    ) {
        for r in reports.iter_mut() {
            if !self.has_pool(&r.host)
                || matches!(r.state, HostState::Unreachable | HostState::Timeout)
            {
                continue;
            }
            let read = async {
                let lease = hosts.acquire(&r.host).await?;
                self.ensure_rebuilt(lease.client(), entry, installation, &r.host)
                    .await
            };
            match tokio::time::timeout(budget, read).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(host = %r.host, "reading address allocations: {e}"),
                Err(_) => tracing::warn!(
                    host = %r.host,
                    "reading address allocations took over {budget:?}"
                ),
            }
        }
        // NB: after every host was read: a segment's usage is known only once all its hosts are.
        for r in reports.iter_mut() {
            if self.has_pool(&r.host)
                && !matches!(r.state, HostState::Unreachable | HostState::Timeout)
            {
                r.addresses = self.usage(&r.host);
            }
        }
    }

    /// Records that `host` is off (its fence command succeeded, or an administrator declared
    /// it dead): every address its instances held is released, and the host counts as known
    /// until it lists again (a listing replaces the fence). `how` is kept for status and logs.
    /// Returns the addresses freed.
    pub fn fence(&self, host: &str, how: &str) -> Vec<IpAddr> {
        self.with_book(host, |b| {
            let of_host: Vec<String> = b
                .alloc
                .holders()
                .filter(|h| holder_host(h) == host)
                .map(str::to_owned)
                .collect();
            let mut freed = Vec::new();
            for h in of_host {
                freed.extend(b.alloc.release(&h));
                b.ended.remove(&h);
            }
            b.fenced.insert(host.to_owned(), how.to_owned());
            tracing::warn!(
                host,
                how,
                ?freed,
                "host fenced: the addresses its instances held are released"
            );
            freed
        })
        .unwrap_or_default()
    }

    /// Whether `host` has been fenced since its last listing, and how.
    pub fn fenced(&self, host: &str) -> Option<String> {
        lock(&self.books)
            .get(self.segment(host))
            .and_then(|b| b.fenced.get(host).cloned())
    }

    /// The host whose instance holds `ip` in `host`'s segment, if any.
    pub fn holder_host(&self, host: &str, ip: IpAddr) -> Option<String> {
        self.holder(host, ip).map(|(h, _)| h)
    }

    /// The instance holding `ip` in `host`'s segment, if any: its host and domain name.
    pub fn holder(&self, host: &str, ip: IpAddr) -> Option<(String, String)> {
        lock(&self.books).get(self.segment(host)).and_then(|b| {
            let key = b.alloc.holder_of(ip)?;
            let (h, d) = key.split_once('/')?;
            Some((h.to_owned(), d.to_owned()))
        })
    }

    /// The other hosts of `host`'s segment neither listed nor fenced since the start.
    pub fn unknown_peers(&self, host: &str) -> Vec<String> {
        if !self.pools.contains_key(host) {
            return Vec::new();
        }
        self.with_book(host, |b| self.unknown_hosts(host, b))
            .unwrap_or_default()
            .into_iter()
            .filter(|h| h != host)
            .collect()
    }

    /// The other hosts of `host`'s segment (empty for a host on a segment of its own).
    pub fn segment_peers(&self, host: &str) -> Vec<String> {
        self.hosts_of(host)
            .into_iter()
            .filter(|h| *h != host)
            .map(str::to_owned)
            .collect()
    }

    /// Whether `host` has an address pool.
    pub fn has_pool(&self, host: &str) -> bool {
        self.pools.contains_key(host) || self.invalid.contains_key(host)
    }
}

/// The provider error for an allocation refused on `host`.
fn alloc_error(host: &str, e: AllocError, retired: &[IpAddr]) -> ProviderError {
    match e {
        AllocError::Exhausted { family, size } => {
            let v4 = family == "IPv4";
            let n = retired.iter().filter(|a| a.is_ipv4() == v4).count();
            let held = if n == 0 {
                "are held".to_owned()
            } else {
                format!(
                    "are held or retired ({n} retired after a blocklist listing: see \
                     `egress-proxies status` or the pools' status.retiredAddresses)"
                )
            };
            ProviderError::quota(format!(
                "host {host}'s {family} address pool is exhausted: all {size} addresses of \
                 addressPool.{} {held}; free one (delete a Proxy on this host) or widen the \
                 ranges",
                family.to_ascii_lowercase()
            ))
        }
        AllocError::Retired { address } => ProviderError::transient(format!(
            "the pinned address {address} on host {host} is retired (listed in a DNS \
             blocklist; see the pools' status.retiredAddresses): no Proxy is given it until its \
             retirement ends"
        )),
        // An instance on another host of the segment: it moves once that one is confirmed
        // gone (the host lists it no more, or is fenced), never on a timeout alone.
        AllocError::Taken { address, holder } if holder_host(&holder) != host => {
            let other = holder_host(&holder);
            ProviderError::transient(format!(
                "the pinned address {address} is held by an instance on host {other} of host \
                 {host}'s segment: waiting for host {other} to answer without it, or to be \
                 fenced"
            ))
        }
        // NB: the holder is another Proxy's instance, perhaps another tenant's: not named.
        AllocError::Taken { address, .. } => ProviderError::permanent(format!(
            "the pinned address {address} on host {host} is already held by another instance"
        )),
        AllocError::OutsidePool { address, ranges } => {
            let fam = family_name(address.is_ipv4()).to_ascii_lowercase();
            ProviderError::permanent(format!(
                "the pinned address {address} is not in host {host}'s address pool \
                 (addressPool.{fam}.ranges: {ranges})"
            ))
        }
        AllocError::HoldsAnother {
            holder,
            held,
            asked,
        } => ProviderError::permanent(format!(
            "{holder} on host {host} already holds {held}, not {asked}"
        )),
    }
}

#[cfg(test)]
#[path = "address_book_tests.rs"]
mod tests;
