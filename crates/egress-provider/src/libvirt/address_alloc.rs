//! Allocation of declared egress addresses from one host's [`ParsedPool`]: which instance
//! holds which address, and which address a new instance gets.
//!
//! Guarantees:
//! - an address is held by at most one holder at a time; a holder holds at most one address
//!   per family, and asking again returns the same one (allocation is idempotent);
//! - an address comes back only through [`HostAddresses::release`], which the caller invokes
//!   once the instance that held it is confirmed gone (never on a mere failed create or an
//!   unreachable host): until then it is not handed to anyone else;
//! - [`HostAddresses::rebuild`] records what the host's listing says is held (each instance's
//!   mark carries its address) before anything new is allocated, so a restarted operator
//!   never hands out an address a live instance holds; two instances claiming one address are
//!   reported, and the address stays with the first;
//! - a pinned address is given only if it is one of the pool's allocatable addresses and free
//!   (else [`AllocError::Taken`] naming the holder, or [`AllocError::OutsidePool`] naming the
//!   ranges);
//! - fresh addresses (never handed out since the operator started) go first, in ascending
//!   order, then released ones, lowest first: an address a just-deleted proxy used (perhaps
//!   rotated away from because it was banned) is reused last;
//! - a retired address (see [`super::retired`]) is never handed out by
//!   [`HostAddresses::allocate_excluding`], pinned or free; retirement is not a holding and
//!   not a release: it is a list the caller passes in;
//! - every operation is O(log n) in the number of held addresses (amortised for the skip over
//!   addresses the listing said were held), never a scan of the pool or the fleet; the pool's
//!   size does not matter (an IPv6 /64 costs what a /28 costs).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use super::address_pool::{ParsedFamily, ParsedPool, from_num, num};

/// Why no address was allocated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// The pinned address is held by another instance.
    #[error("{address} is already held by {holder}")]
    Taken {
        /// The address asked for.
        address: IpAddr,
        /// Who holds it.
        holder: String,
    },
    /// The pinned address is not one of the pool's allocatable addresses.
    #[error("{address} is not in the host's address pool (ranges: {ranges})")]
    OutsidePool {
        /// The address asked for.
        address: IpAddr,
        /// The pool's ranges, as `a-b` joined with `, ` (or "none for this family").
        ranges: String,
    },
    /// Every address of the family is held.
    #[error("the host's {family} address pool is exhausted ({size} addresses, all held)")]
    Exhausted {
        /// `IPv4` or `IPv6`.
        family: &'static str,
        /// How many addresses the pool has.
        size: u128,
    },
    /// The pinned address is retired (see [`super::retired`]): no one is given it now.
    #[error("{address} is retired")]
    Retired {
        /// The address asked for.
        address: IpAddr,
    },
    /// The holder already holds another address of this family.
    #[error("{holder} already holds {held}, not {asked}")]
    HoldsAnother {
        /// Who asked.
        holder: String,
        /// The address it holds.
        held: IpAddr,
        /// The address it asked for.
        asked: IpAddr,
    },
}

/// Two instances found claiming one address by [`HostAddresses::rebuild`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// The address.
    pub address: IpAddr,
    /// The holder it stays with.
    pub kept: String,
    /// The holder whose claim was not recorded.
    pub refused: String,
}

/// The allocation state of one family of one host's pool.
#[derive(Debug, Clone)]
struct Family {
    pool: ParsedFamily,
    /// Address → holder.
    held: BTreeMap<u128, String>,
    /// Released addresses not handed out again yet.
    released: BTreeSet<u128>,
    /// Index into `pool.ranges` and the next address never handed out from it.
    cursor: (usize, u128),
    /// Addresses neither held nor handed out: size − held, kept as a count.
    size: u128,
}

impl Family {
    fn new(pool: ParsedFamily) -> Self {
        let start = pool.ranges.first().map_or(0, |(a, _)| num(*a));
        let size = pool.size();
        Self {
            pool,
            held: BTreeMap::new(),
            released: BTreeSet::new(),
            cursor: (0, start),
            size,
        }
    }

    fn name(&self) -> &'static str {
        if self.pool.prefix.addr().is_ipv4() {
            "IPv4"
        } else {
            "IPv6"
        }
    }

    /// The next never-handed-out address that is not held, advancing the cursor past it.
    fn take_fresh(&mut self) -> Option<u128> {
        loop {
            let (i, v) = self.cursor;
            let (_, end) = *self.pool.ranges.get(i)?;
            if v > num(end) {
                let next = self
                    .pool
                    .ranges
                    .get(i + 1)
                    .map_or(u128::MAX, |(a, _)| num(*a));
                self.cursor = (i + 1, next);
                continue;
            }
            // NB: v < u128::MAX here (it is ≤ end), so +1 cannot overflow.
            self.cursor = (i, v + 1);
            if !self.held.contains_key(&v) {
                return Some(v);
            }
        }
    }

    fn ranges_text(&self) -> String {
        self.pool
            .ranges
            .iter()
            .map(|(a, b)| {
                if a == b {
                    a.to_string()
                } else {
                    format!("{a}-{b}")
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The addresses of one host's pool: held, released and free.
#[derive(Debug, Clone)]
pub struct HostAddresses {
    v4: Option<Family>,
    v6: Option<Family>,
    /// Holder → its addresses (at most one per family).
    by_holder: HashMap<String, Vec<IpAddr>>,
}

impl HostAddresses {
    /// An empty allocation state over `pool`.
    pub fn new(pool: &ParsedPool) -> Self {
        Self {
            v4: pool.ipv4.clone().map(Family::new),
            v6: pool.ipv6.clone().map(Family::new),
            by_holder: HashMap::new(),
        }
    }

    fn family(&self, v4: bool) -> Option<&Family> {
        if v4 {
            self.v4.as_ref()
        } else {
            self.v6.as_ref()
        }
    }

    fn family_mut(&mut self, v4: bool) -> Option<&mut Family> {
        if v4 {
            self.v4.as_mut()
        } else {
            self.v6.as_mut()
        }
    }

    /// Records what the host's listing says each instance holds. Addresses outside the pool
    /// (the pool was narrowed) are recorded too, so they are never handed out while held.
    /// Returns the claims that could not be recorded.
    pub fn rebuild<'a>(
        &mut self,
        listing: impl IntoIterator<Item = (&'a str, IpAddr)>,
    ) -> Vec<Conflict> {
        let mut conflicts = Vec::new();
        for (holder, ip) in listing {
            if let Err(e) = self.record(holder, ip) {
                if let AllocError::Taken { holder: kept, .. } = e {
                    conflicts.push(Conflict {
                        address: ip,
                        kept,
                        refused: holder.to_owned(),
                    });
                } else if let AllocError::HoldsAnother { held, .. } = e {
                    conflicts.push(Conflict {
                        address: ip,
                        kept: format!("{holder} (holds {held})"),
                        refused: holder.to_owned(),
                    });
                }
            }
        }
        conflicts
    }

    /// Marks `ip` held by `holder` (pinned allocation and rebuild share this).
    fn record(&mut self, holder: &str, ip: IpAddr) -> Result<IpAddr, AllocError> {
        if let Some(held) = self.held_by(holder, ip.is_ipv4()) {
            return if held == ip {
                Ok(ip)
            } else {
                Err(AllocError::HoldsAnother {
                    holder: holder.to_owned(),
                    held,
                    asked: ip,
                })
            };
        }
        let v = num(ip);
        let Some(f) = self.family_mut(ip.is_ipv4()) else {
            // A family the pool does not have: nothing of ours can collide with it.
            self.by_holder
                .entry(holder.to_owned())
                .or_default()
                .push(ip);
            return Ok(ip);
        };
        if let Some(h) = f.held.get(&v) {
            return Err(AllocError::Taken {
                address: ip,
                holder: h.clone(),
            });
        }
        f.released.remove(&v);
        if f.pool.contains(ip) {
            f.size -= 1;
        }
        f.held.insert(v, holder.to_owned());
        self.by_holder
            .entry(holder.to_owned())
            .or_default()
            .push(ip);
        Ok(ip)
    }

    /// The address of `ip`'s family `holder` holds, if any.
    pub fn held_by(&self, holder: &str, v4: bool) -> Option<IpAddr> {
        self.by_holder
            .get(holder)?
            .iter()
            .copied()
            .find(|a| a.is_ipv4() == v4)
    }

    /// Who holds `ip`, if anyone.
    pub fn holder_of(&self, ip: IpAddr) -> Option<&str> {
        self.family(ip.is_ipv4())?
            .held
            .get(&num(ip))
            .map(String::as_str)
    }

    /// An address of the family (`v4`) for `holder`: the one it holds, else `pinned` if
    /// free and in the pool, else a free one.
    pub fn allocate(
        &mut self,
        holder: &str,
        v4: bool,
        pinned: Option<IpAddr>,
    ) -> Result<IpAddr, AllocError> {
        self.allocate_avoiding(holder, v4, pinned, &[])
    }

    /// [`Self::allocate`], except that a free address chosen for a holder pinning nothing is
    /// never one of `reserved` (pinned by other Proxies, or held for another namespace): those
    /// are skipped, and stay free for their owners. Costs O(log n) per address skipped.
    pub fn allocate_avoiding(
        &mut self,
        holder: &str,
        v4: bool,
        pinned: Option<IpAddr>,
        reserved: &[IpAddr],
    ) -> Result<IpAddr, AllocError> {
        if let Some(p) = pinned {
            let f = self.family(p.is_ipv4());
            if !f.is_some_and(|f| f.pool.contains(p)) {
                return Err(AllocError::OutsidePool {
                    address: p,
                    ranges: f
                        .map_or_else(|| "none for this family".to_owned(), Family::ranges_text),
                });
            }
            return self.record(holder, p);
        }
        if let Some(held) = self.held_by(holder, v4) {
            return Ok(held);
        }
        let Some(f) = self.family_mut(v4) else {
            return Err(AllocError::OutsidePool {
                address: if v4 {
                    IpAddr::from([0, 0, 0, 0])
                } else {
                    IpAddr::from([0u16; 8])
                },
                ranges: "none for this family".to_owned(),
            });
        };
        let like = f.pool.prefix.addr();
        let avoid: BTreeSet<u128> = reserved
            .iter()
            .filter(|a| a.is_ipv4() == v4)
            .map(|a| num(*a))
            .collect();
        let mut skipped = Vec::new();
        let found = loop {
            let Some(v) = f.take_fresh().or_else(|| f.released.pop_first()) else {
                break None;
            };
            if avoid.contains(&v) {
                skipped.push(v);
                continue;
            }
            break Some(v);
        };
        // Skipped addresses stay free (for their owners): back among the released ones.
        f.released.extend(skipped);
        let Some(v) = found else {
            return Err(AllocError::Exhausted {
                family: f.name(),
                size: f.pool.size(),
            });
        };
        let ip = from_num(like, v);
        self.record(holder, ip)
    }

    /// [`Self::allocate_avoiding`], never handing out one of `retired` either (a separate
    /// state: those may still be held by the instance they were retired from, and are not
    /// freed by this): a pinned retired address is refused ([`AllocError::Retired`]) unless
    /// `holder` already holds it; a free one is skipped and stays free (among the released,
    /// so it comes back last once its retirement ends). Costs O(log n) per address skipped.
    pub fn allocate_excluding(
        &mut self,
        holder: &str,
        v4: bool,
        pinned: Option<IpAddr>,
        reserved: &[IpAddr],
        retired: &[IpAddr],
    ) -> Result<IpAddr, AllocError> {
        if let Some(p) = pinned
            && retired.contains(&p)
            && self.held_by(holder, p.is_ipv4()) != Some(p)
        {
            return Err(AllocError::Retired { address: p });
        }
        if retired.is_empty() {
            return self.allocate_avoiding(holder, v4, pinned, reserved);
        }
        let avoid: Vec<IpAddr> = reserved.iter().chain(retired).copied().collect();
        self.allocate_avoiding(holder, v4, pinned, &avoid)
    }

    /// Frees every address `holder` holds. Call only once its instance is confirmed gone.
    /// Returns the addresses freed.
    pub fn release(&mut self, holder: &str) -> Vec<IpAddr> {
        let Some(addrs) = self.by_holder.remove(holder) else {
            return Vec::new();
        };
        for ip in &addrs {
            let v = num(*ip);
            if let Some(f) = self.family_mut(ip.is_ipv4())
                && f.held.get(&v).is_some_and(|h| h == holder)
            {
                f.held.remove(&v);
                if f.pool.contains(*ip) {
                    f.size += 1;
                    // NB: one the cursor has not reached yet (pinned, then released) is
                    // listed too; the cursor's hand-out takes it out of this set again.
                    f.released.insert(v);
                }
            }
        }
        addrs
    }

    /// Every holder that holds an address (any family), in no particular order.
    pub fn holders(&self) -> impl Iterator<Item = &str> {
        self.by_holder.keys().map(String::as_str)
    }

    /// Free addresses of the family (`v4`): the pool's size less what is held inside it.
    pub fn free(&self, v4: bool) -> u128 {
        self.family(v4).map_or(0, |f| f.size)
    }

    /// Held addresses of the family (`v4`), inside the pool or not.
    pub fn held(&self, v4: bool) -> usize {
        self.family(v4).map_or(0, |f| f.held.len())
    }
}

#[cfg(test)]
#[path = "address_alloc_tests.rs"]
mod tests;
