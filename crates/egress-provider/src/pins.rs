//! The egress addresses Proxies pin (`spec.egress.address`), fleet-wide: a provider that
//! allocates declared addresses gives a pinned address to the Proxy that pins it and never to
//! a Proxy that pins none ([`PinnedAddresses::is_pinned`]).
//!
//! Guarantees: a Proxy's pins are replaced as a whole ([`PinnedAddresses::set`]) and dropped
//! with it ([`PinnedAddresses::remove`]); an address stays pinned while any Proxy pins it;
//! every call costs O(the Proxy's pins), never the fleet's size; `Send + Sync`, with a std
//! mutex held for in-memory work only. Until the registry is [`ready`](PinnedAddresses::ready)
//! (its driver has not seen every Proxy yet), a provider refuses to allocate an unpinned
//! address from a pool, Transient, rather than guess.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::model::ProxyUid;

/// Who pins which address.
#[derive(Debug)]
pub struct PinnedAddresses {
    inner: Mutex<Inner>,
    ready: AtomicBool,
}

#[derive(Debug, Default)]
struct Inner {
    by_uid: HashMap<ProxyUid, Vec<IpAddr>>,
    /// Address → how many Proxies pin it.
    count: HashMap<IpAddr, u32>,
}

impl Default for PinnedAddresses {
    fn default() -> Self {
        Self::new()
    }
}

impl PinnedAddresses {
    /// An empty registry, ready (its driver knows every Proxy as it reconciles it).
    pub fn new() -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            ready: AtomicBool::new(true),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records that `uid` pins exactly `pins` (replacing what it pinned before; empty: none).
    pub fn set(&self, uid: ProxyUid, pins: &[IpAddr]) {
        let mut g = self.lock();
        if g.by_uid
            .get(&uid)
            .map_or(pins.is_empty(), |old| old == pins)
        {
            return;
        }
        drop_pins(&mut g, &uid);
        if !pins.is_empty() {
            for ip in pins {
                *g.count.entry(*ip).or_default() += 1;
            }
            g.by_uid.insert(uid, pins.to_vec());
        }
    }

    /// Forgets `uid`'s pins.
    pub fn remove(&self, uid: &ProxyUid) {
        drop_pins(&mut self.lock(), uid);
    }

    /// Forgets the pins of every Proxy `keep` refuses (after a complete relist: those the
    /// list no longer shows). O(Proxies pinning).
    pub fn retain(&self, keep: impl Fn(&ProxyUid) -> bool) {
        let mut g = self.lock();
        let gone: Vec<ProxyUid> = g.by_uid.keys().filter(|u| !keep(u)).copied().collect();
        for u in gone {
            drop_pins(&mut g, &u);
        }
    }

    /// Whether any Proxy pins `ip`.
    pub fn is_pinned(&self, ip: IpAddr) -> bool {
        self.lock().count.contains_key(&ip)
    }

    /// Whether every Proxy's pins are known (see the module doc).
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Sets [`ready`](Self::ready): a driver that learns its Proxies in batches sets `false`
    /// before its first complete view, then `true` once it has [`set`](Self::set) them all.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }
}

fn drop_pins(g: &mut Inner, uid: &ProxyUid) {
    if let Some(old) = g.by_uid.remove(uid) {
        for ip in old {
            if let Some(n) = g.count.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    g.count.remove(&ip);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uid(n: u128) -> ProxyUid {
        ProxyUid(uuid::Uuid::from_u128(n))
    }

    #[test]
    fn an_address_stays_pinned_while_any_proxy_pins_it() {
        let p = PinnedAddresses::new();
        let a: IpAddr = "203.0.113.7".parse().unwrap();
        let b: IpAddr = "203.0.113.8".parse().unwrap();
        p.set(uid(1), &[a]);
        p.set(uid(2), &[a]);
        assert!(p.is_pinned(a) && !p.is_pinned(b));
        p.remove(&uid(1));
        assert!(p.is_pinned(a), "uid 2 still pins it");
        p.set(uid(2), &[b]);
        assert!(!p.is_pinned(a) && p.is_pinned(b), "a re-pin replaces");
        p.set(uid(2), &[]);
        assert!(!p.is_pinned(b));
        p.remove(&uid(3));
    }
}
