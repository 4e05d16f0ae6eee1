//! Declared egress addresses of one provider entry, per host: which instance holds which
//! address of the host's address pool, kept in a [`HostAddresses`] per host and fed by the
//! host's own listings, so the hosts stay the source of truth across operator restarts.
//!
//! Guarantees:
//! - **rebuilt before the first allocation**: nothing is allocated on a host until one complete
//!   listing of its domains ([`ops::list::list_host`]) has been recorded; every valid mark
//!   under our namespace that records addresses counts as held, whatever its entry or
//!   installation. Concurrent first creates on a host share that one listing;
//! - **never two holders**: the allocator hands an address to at most one holder (the domain
//!   name, unique on a host); allocation for a holder is idempotent (a retried create gets the
//!   same addresses);
//! - **released only when the instance is confirmed gone**: after a delete succeeded
//!   ([`AddressBook::release_deleted`]); after a failed create that left no domain (none
//!   existed under the per-name lock and the one it defined, if any, was undefined), so the
//!   retry's placement does not see the host full of its own allocation; or when a complete
//!   listing that started after the holder's last create ended no longer shows it
//!   ([`AddressBook::apply_listing`]); a create in flight is never released by a listing,
//!   whatever the listing saw;
//! - a failed allocation holds nothing it did not hold before; its error names the host and
//!   the pool's family (exhaustion: QuotaExceeded) or the holder or the ranges (a pinned
//!   address taken or outside the pool: Permanent);
//! - **retired addresses are never handed out** (see [`super::retired`]): the process's
//!   retirements for the host are read before every allocation, and while they have not been
//!   read back after a start (the registry is not primed) nothing is allocated (Transient);
//! - the lock is a std mutex held for in-memory work only, never across an `.await`.

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

/// One host's allocation state.
#[derive(Debug)]
struct HostBook {
    alloc: HostAddresses,
    /// Whether a complete listing has been recorded.
    rebuilt: bool,
    /// Holder → creates in flight for it.
    in_flight: HashMap<String, u32>,
    /// Holder → the sequence number at which its last create ended.
    ended: HashMap<String, u64>,
    /// Increases at every create end and listing start.
    seq: u64,
}

/// The address pools of an entry's hosts and their allocations.
#[derive(Debug, Default)]
pub struct AddressBook {
    pools: HashMap<String, ParsedPool>,
    /// Pools that did not parse, by host, with the reason (the config check refuses them; a
    /// create on such a host fails Permanent rather than ignoring the pool).
    invalid: HashMap<String, String>,
    books: Mutex<HashMap<String, HostBook>>,
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
    holder: String,
    /// The addresses allocated (IPv4 first).
    pub addresses: Vec<IpAddr>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut g = lock(&self.book.books);
        if let Some(b) = g.get_mut(&self.host) {
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
        for h in &entry.hosts {
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
            entry: entry.name.clone(),
            ..Self::default()
        }
    }

    /// Consults `retired` (the process's retirements) before it hands out an address.
    pub fn use_retired(&self, retired: Arc<RetiredAddresses>) {
        *lock(&self.retired) = retired;
    }

    fn retired_of(&self, host: &str) -> Option<Vec<IpAddr>> {
        let reg = Arc::clone(&lock(&self.retired));
        reg.of_host(&self.entry, host, SystemTime::now())
            .map(|v| v.iter().map(|r| r.address).collect())
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

    /// Records one complete listing of `host` unless one has been recorded already; the first
    /// caller lists, concurrent ones wait for it. A host without a pool needs none.
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

    fn is_rebuilt(&self, host: &str) -> bool {
        lock(&self.books).get(host).is_some_and(|b| b.rebuilt)
    }

    fn with_book<T>(&self, host: &str, f: impl FnOnce(&mut HostBook) -> T) -> Option<T> {
        let pool = self.pools.get(host)?;
        let mut g = lock(&self.books);
        let b = g.entry(host.to_owned()).or_insert_with(|| HostBook {
            alloc: HostAddresses::new(pool),
            rebuilt: false,
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
            let shown: HashSet<&str> = claims.iter().map(|c| c.domain.as_str()).collect();
            let gone: Vec<String> = b
                .alloc
                .holders()
                .filter(|h| !shown.contains(h))
                .filter(|h| !b.in_flight.contains_key(*h))
                .filter(|h| b.ended.get(*h).is_none_or(|e| *e < started))
                .map(str::to_owned)
                .collect();
            for h in gone {
                let freed = b.alloc.release(&h);
                b.ended.remove(&h);
                tracing::info!(host, holder = %h, ?freed, "released the addresses of an instance the host no longer lists");
            }
            let conflicts = b.alloc.rebuild(
                claims
                    .iter()
                    .flat_map(|c| c.addresses.iter().map(|a| (c.domain.as_str(), *a))),
            );
            for c in conflicts {
                tracing::warn!(host, address = %c.address, kept = %c.kept, refused = %c.refused, "two domains claim one declared egress address; it stays with the first");
            }
            b.rebuilt = true;
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
        let res = self.with_book(host, |b| {
            if !b.rebuilt {
                return Err(ProviderError::transient(format!(
                    "host {host}'s address allocations have not been read yet; retrying"
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
                holder: holder.to_owned(),
                addresses,
            })),
        }
    }

    /// Frees `holder`'s addresses on `host`: call only once its domain is confirmed gone (a
    /// delete succeeded, or a failed create left none).
    pub fn release_deleted(&self, host: &str, holder: &str) {
        self.with_book(host, |b| {
            let freed = b.alloc.release(holder);
            b.ended.remove(holder);
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
            if !b.rebuilt {
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
            r.addresses = self.usage(&r.host);
        }
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
mod tests {
    use super::*;
    use crate::libvirt::address_pool::{AddressPool, FamilyPool};

    fn book(ranges: &[&str]) -> AddressBook {
        let pool = AddressPool {
            ipv4: Some(FamilyPool {
                prefix: "203.0.113.0/24".into(),
                gateway: "203.0.113.1".into(),
                ranges: ranges.iter().map(|r| r.to_string()).collect(),
            }),
            ipv6: None,
            dns: vec![],
            access: None,
            hold_released: crate::libvirt::address_pool::DEFAULT_HOLD_RELEASED,
        };
        let mut pools = HashMap::new();
        pools.insert("h1".to_owned(), pool.parse().unwrap());
        AddressBook {
            pools,
            ..AddressBook::default()
        }
    }

    fn claim(domain: &str, a: &str) -> Claim {
        Claim {
            domain: domain.into(),
            addresses: vec![a.parse().unwrap()],
        }
    }

    fn held(b: &AddressBook) -> u64 {
        b.usage("h1")[0].held
    }

    #[test]
    fn nothing_is_allocated_before_the_first_listing() {
        let b = book(&["203.0.113.10-203.0.113.20"]);
        let e = b.allocate("h1", "dA", &[]).unwrap_err();
        assert!(e.is_transient(), "{e}");
        assert!(b.usage("h1").is_empty(), "unknown before a listing");
        b.apply_listing(
            "h1",
            b.listing_started("h1"),
            &[claim("theirs", "203.0.113.10")],
        );
        let g = b.allocate("h1", "dA", &[]).unwrap().unwrap();
        assert_eq!(g.addresses, vec!["203.0.113.11".parse::<IpAddr>().unwrap()]);
    }

    #[test]
    fn a_listing_releases_only_holders_it_no_longer_shows_whose_creates_ended_before_it() {
        let b = book(&["203.0.113.10-203.0.113.20"]);
        b.apply_listing("h1", b.listing_started("h1"), &[]);
        let a = b.allocate("h1", "dA", &[]).unwrap().unwrap();
        // A listing that ran while A's create was in flight (its domain not defined yet).
        b.apply_listing("h1", b.listing_started("h1"), &[]);
        assert_eq!(held(&b), 1, "an in-flight create keeps its address");
        let other = b.allocate("h1", "dB", &[]).unwrap().unwrap();
        assert_ne!(other.addresses, a.addresses);
        drop(other);
        // A listing that started before A's create ended, and completed after.
        let before_end = b.listing_started("h1");
        drop(a);
        b.apply_listing("h1", before_end, &[claim("dB", "203.0.113.11")]);
        assert_eq!(
            held(&b),
            2,
            "a listing older than the create's end proves nothing"
        );
        // A listing that shows the holder keeps it.
        b.apply_listing(
            "h1",
            b.listing_started("h1"),
            &[claim("dA", "203.0.113.10"), claim("dB", "203.0.113.11")],
        );
        assert_eq!(held(&b), 2);
        // A complete listing after the create ended that no longer shows it: gone.
        b.apply_listing(
            "h1",
            b.listing_started("h1"),
            &[claim("dB", "203.0.113.11")],
        );
        assert_eq!(held(&b), 1);
        // A claim the book did not know (another process's instance) is held from now on.
        b.apply_listing(
            "h1",
            b.listing_started("h1"),
            &[claim("dB", "203.0.113.11"), claim("theirs", "203.0.113.12")],
        );
        assert_eq!(held(&b), 2);
    }

    #[test]
    fn a_deleted_holders_address_is_free_again() {
        let b = book(&["203.0.113.10"]);
        b.apply_listing("h1", b.listing_started("h1"), &[]);
        drop(b.allocate("h1", "dA", &[]).unwrap());
        let e = b.allocate("h1", "dB", &[]).unwrap_err();
        assert_eq!(e.class, crate::error::ErrorClass::QuotaExceeded, "{e}");
        b.release_deleted("h1", "dA");
        assert!(b.allocate("h1", "dB", &[]).unwrap().is_some());
    }
}
