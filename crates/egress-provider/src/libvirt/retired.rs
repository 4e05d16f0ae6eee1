//! Retired declared egress addresses: addresses of hosts' address pools that no Proxy is
//! given until a time, with the reason (a pool replaced the member that held one because it
//! was listed in a DNS blocklist). A state of its own beside the allocations: a retired
//! address may still be held by the instance it was retired from until that instance is
//! gone; what retirement changes is that the allocator never *hands it out* meanwhile,
//! neither as a free address nor as a pinned one.
//!
//! One [`RetiredAddresses`] lives for the whole process and is shared by every provider built
//! from every config load (a reload builds new providers and keeps the retirements). Its
//! entries come from where they are kept durably (a pool's status): each owner replaces its
//! own set with [`RetiredAddresses::sync`].
//!
//! Guarantees:
//! - while the registry is not [`primed`](RetiredAddresses::prime) (a driver that has not yet
//!   read every pool's retirements after a start), no address of any pool is handed out:
//!   allocation is refused with a transient error, so a restart never gives a retired
//!   address away before its retirement was read back;
//! - an entry ends at its `until` (it is ignored from then on and dropped at the next sync);
//! - reads are O(log n) per host; the lock is a std mutex held for in-memory work only.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};
use std::time::SystemTime;

/// One retired address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retired {
    /// The provider entry.
    pub entry: String,
    /// The host whose address pool it belongs to.
    pub host: String,
    /// The address.
    pub address: IpAddr,
    /// When the retirement ends.
    pub until: SystemTime,
    /// Why (shown with the retirement, and in errors).
    pub reason: String,
    /// Who retired it (e.g. `pool default/web`).
    pub owner: String,
}

#[derive(Debug, Default)]
struct Inner {
    primed: bool,
    /// (entry, host) → address → the entry.
    by_host: BTreeMap<(String, String), BTreeMap<IpAddr, Retired>>,
}

/// Every retired address of the process (see the module doc).
#[derive(Debug)]
pub struct RetiredAddresses {
    inner: Mutex<Inner>,
}

impl Default for RetiredAddresses {
    /// An empty registry that is primed: nothing is retired, allocation is not held back.
    fn default() -> Self {
        Self {
            inner: Mutex::new(Inner {
                primed: true,
                by_host: BTreeMap::new(),
            }),
        }
    }
}

impl RetiredAddresses {
    /// An empty registry that holds allocation back until [`Self::prime`]: for a driver that
    /// reads the retirements back from durable state after it starts.
    pub fn unprimed() -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every retirement is known now: allocation may proceed.
    pub fn prime(&self) {
        self.lock().primed = true;
    }

    /// Whether allocation may proceed.
    pub fn is_primed(&self) -> bool {
        self.lock().primed
    }

    /// Replaces the entries of `owner` with `entries` (their `owner` is set to it); entries
    /// past their `until` at `now` are dropped.
    pub fn sync(&self, owner: &str, entries: impl IntoIterator<Item = Retired>, now: SystemTime) {
        let mut g = self.lock();
        for m in g.by_host.values_mut() {
            m.retain(|_, r| r.owner != owner && r.until > now);
        }
        for mut r in entries {
            if r.until <= now {
                continue;
            }
            r.owner = owner.to_owned();
            g.by_host
                .entry((r.entry.clone(), r.host.clone()))
                .or_default()
                .insert(r.address, r);
        }
        g.by_host.retain(|_, m| !m.is_empty());
    }

    /// The addresses of `host` of `entry` retired at `now`; `None` while not primed.
    pub fn of_host(&self, entry: &str, host: &str, now: SystemTime) -> Option<Vec<Retired>> {
        let g = self.lock();
        if !g.primed {
            return None;
        }
        Some(
            g.by_host
                .get(&(entry.to_owned(), host.to_owned()))
                .map(|m| m.values().filter(|r| r.until > now).cloned().collect())
                .unwrap_or_default(),
        )
    }

    /// Every retirement in effect at `now`, by entry, host and address.
    pub fn all(&self, now: SystemTime) -> Vec<Retired> {
        self.lock()
            .by_host
            .values()
            .flat_map(|m| m.values())
            .filter(|r| r.until > now)
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use super::*;

    fn t(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(s)
    }

    fn r(host: &str, a: &str, until: u64) -> Retired {
        Retired {
            entry: "home".into(),
            host: host.into(),
            address: a.parse().unwrap(),
            until: t(until),
            reason: "listed".into(),
            owner: String::new(),
        }
    }

    #[test]
    fn each_owner_replaces_its_own_entries_and_entries_end_at_their_time() {
        let reg = RetiredAddresses::default();
        reg.sync(
            "pool a",
            [r("h1", "192.0.2.1", 100), r("h2", "192.0.2.2", 100)],
            t(0),
        );
        reg.sync("pool b", [r("h1", "192.0.2.3", 50)], t(0));
        assert_eq!(reg.of_host("home", "h1", t(10)).unwrap().len(), 2);
        assert_eq!(reg.of_host("home", "h1", t(60)).unwrap().len(), 1);
        assert!(reg.of_host("other", "h1", t(10)).unwrap().is_empty());
        reg.sync("pool a", [r("h2", "192.0.2.2", 100)], t(10));
        let h1: Vec<IpAddr> = reg
            .of_host("home", "h1", t(10))
            .unwrap()
            .iter()
            .map(|r| r.address)
            .collect();
        assert_eq!(h1, ["192.0.2.3".parse::<IpAddr>().unwrap()]);
        let owners: Vec<String> = reg.all(t(10)).into_iter().map(|r| r.owner).collect();
        assert_eq!(owners, ["pool b", "pool a"], "by host: h1, then h2");
    }

    #[test]
    fn an_unprimed_registry_holds_allocation_back() {
        let reg = RetiredAddresses::unprimed();
        assert!(reg.of_host("home", "h1", t(0)).is_none());
        reg.prime();
        assert_eq!(reg.of_host("home", "h1", t(0)), Some(vec![]));
    }
}
