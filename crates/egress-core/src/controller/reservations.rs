//! Who may have a declared egress address: the addresses Proxies pin (`spec.egress.address`),
//! and the addresses held for a namespace after its Proxy went away (its address pool's
//! `holdReleased`), per provider entry.
//!
//! Rules:
//! - a pin of an address another Proxy pins waits until that Proxy is gone (first registered
//!   keeps it);
//! - an address held for a namespace may be pinned only by a Proxy of that namespace until
//!   the hold ends — so a pool with `rotation.egressAddress: Keep` brings a replacement back
//!   at its member's address and no other tenant can take it in between;
//! - an allocation for a Proxy that pins nothing skips every address pinned by another
//!   Proxy and every address held for another namespace ([`Reservations::reserved_for`]), so
//!   creation order never decides who gets a pinned address.
//!
//! Guarantees: pure data, no I/O; refusals name the address and the hold's end, never
//! another Proxy or namespace; every operation costs O(addresses of the Proxy) or, for
//! [`Reservations::reserved_for`], O(pinned and held addresses of the entry) — never a scan
//! of the fleet's unpinned Proxies. Held addresses are kept in memory: a restarted operator
//! forgets holds (documented in docs/security.md).

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::SystemTime;

use egress_provider::model::ProxyUid;

/// One entry's pins and holds.
#[derive(Debug, Default)]
struct EntryBook {
    /// Address → the Proxy pinning it and its namespace.
    pins: HashMap<IpAddr, (ProxyUid, String)>,
    /// Address → the namespace it is held for and until when.
    holds: HashMap<IpAddr, (String, SystemTime)>,
}

/// Pins and holds of every entry, and each Proxy's registered pins.
#[derive(Debug, Default)]
pub(super) struct Reservations {
    entries: HashMap<String, EntryBook>,
    /// Each pinning Proxy's (entry, addresses), to drop them when they change.
    by_uid: HashMap<ProxyUid, (String, Vec<IpAddr>)>,
    /// The addresses each Proxy's instance holds as last reported, with its entry,
    /// namespace and the hold its pool gives them when the instance goes.
    held: HashMap<ProxyUid, Held>,
}

/// What a Proxy's instance holds (see [`Reservations::note_held`]).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    entry: String,
    namespace: String,
    addresses: Vec<IpAddr>,
    hold: std::time::Duration,
}

impl Reservations {
    /// Records that `uid` (namespace `ns`) pins `addrs` in `entry` (replacing what it pinned
    /// before). An address another Proxy already pins stays with that Proxy.
    pub(super) fn register(&mut self, entry: &str, uid: ProxyUid, ns: &str, addrs: &[IpAddr]) {
        if self
            .by_uid
            .get(&uid)
            .is_some_and(|(e, a)| e == entry && a == addrs)
        {
            return;
        }
        self.forget_pins(&uid);
        if addrs.is_empty() {
            return;
        }
        let book = self.entries.entry(entry.to_owned()).or_default();
        for a in addrs {
            book.pins.entry(*a).or_insert_with(|| (uid, ns.to_owned()));
        }
        self.by_uid.insert(uid, (entry.to_owned(), addrs.to_vec()));
    }

    /// Drops `uid`'s pins (its Proxy is gone or pins nothing now).
    pub(super) fn forget(&mut self, uid: &ProxyUid) {
        self.forget_pins(uid);
    }

    /// Drops `uid`'s pins and what it holds, holding nothing (a Proxy the driver no longer
    /// tracks, whose instance is left for GC).
    pub(super) fn forget_all(&mut self, uid: &ProxyUid) {
        self.forget_pins(uid);
        self.held.remove(uid);
    }

    fn forget_pins(&mut self, uid: &ProxyUid) {
        let Some((entry, addrs)) = self.by_uid.remove(uid) else {
            return;
        };
        if let Some(book) = self.entries.get_mut(&entry) {
            for a in addrs {
                if book.pins.get(&a).is_some_and(|(u, _)| u == uid) {
                    book.pins.remove(&a);
                }
            }
        }
    }

    /// `uid`'s instance (namespace `ns`, entry `entry`) holds `addrs` now; when it goes
    /// ([`Self::release`]) they are held for `ns` for `hold`. Empty `addrs` forgets it.
    pub(super) fn note_held(
        &mut self,
        entry: &str,
        uid: ProxyUid,
        ns: &str,
        addrs: &[IpAddr],
        hold: std::time::Duration,
    ) {
        if addrs.is_empty() {
            self.held.remove(&uid);
            return;
        }
        let h = Held {
            entry: entry.to_owned(),
            namespace: ns.to_owned(),
            addresses: addrs.to_vec(),
            hold,
        };
        if self.held.get(&uid) != Some(&h) {
            self.held.insert(uid, h);
        }
    }

    /// `uid`'s Proxy is gone (its instance deleted): its pins are dropped and the addresses
    /// its instance held are held for its namespace for its pool's hold, from `now`.
    pub(super) fn release(&mut self, uid: &ProxyUid, now: SystemTime) {
        self.forget(uid);
        if let Some(h) = self.held.remove(uid) {
            self.hold(&h.entry, &h.namespace, &h.addresses, now + h.hold);
        }
    }

    /// `addrs` (the egress addresses a Proxy of namespace `ns` had in `entry`, its instance
    /// now gone) are held for `ns` until `until`.
    pub(super) fn hold(&mut self, entry: &str, ns: &str, addrs: &[IpAddr], until: SystemTime) {
        if addrs.is_empty() {
            return;
        }
        let book = self.entries.entry(entry.to_owned()).or_default();
        for a in addrs {
            book.holds.insert(*a, (ns.to_owned(), until));
        }
    }

    /// Why `uid` (namespace `ns`) may not have the addresses it pins in `entry` now, if it
    /// may not: one refusal naming the address, never its holder. A pin of `replaces` (the
    /// Proxy `uid` replaces in its pool) is no conflict.
    pub(super) fn conflict(
        &mut self,
        entry: &str,
        uid: &ProxyUid,
        replaces: Option<&ProxyUid>,
        ns: &str,
        addrs: &[IpAddr],
        now: SystemTime,
    ) -> Option<String> {
        let book = self.entries.get_mut(entry)?;
        book.holds.retain(|_, (_, until)| *until > now);
        for a in addrs {
            // NB: the Proxy it replaces (same pool and namespace, vouched for by the
            // driver) pins it too while its lost instance may hold it: no conflict.
            if book
                .pins
                .get(a)
                .is_some_and(|(u, _)| u != uid && Some(u) != replaces)
            {
                return Some(format!(
                    "spec.egress.address: {a} is pinned by another Proxy; waiting until it is \
                     released"
                ));
            }
            if let Some((held_for, until)) = book.holds.get(a)
                && held_for != ns
            {
                return Some(format!(
                    "spec.egress.address: {a} is reserved for its previous holder until {} \
                     (the address pool's holdReleased); waiting",
                    crate::controller::decide::fmt_time(*until)
                ));
            }
        }
        None
    }

    /// The addresses of `entry` an allocation for `uid` (namespace `ns`, pinning nothing)
    /// must skip: pinned by another Proxy, or held for another namespace.
    pub(super) fn reserved_for(
        &mut self,
        entry: &str,
        uid: &ProxyUid,
        ns: &str,
        now: SystemTime,
    ) -> Vec<IpAddr> {
        let Some(book) = self.entries.get_mut(entry) else {
            return Vec::new();
        };
        book.holds.retain(|_, (_, until)| *until > now);
        let mut out: Vec<IpAddr> = book
            .pins
            .iter()
            .filter(|(_, (u, _))| u != uid)
            .map(|(a, _)| *a)
            .chain(
                book.holds
                    .iter()
                    .filter(|(_, (n, _))| n != ns)
                    .map(|(a, _)| *a),
            )
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::Duration;

    use super::*;

    fn uid(n: u8) -> ProxyUid {
        ProxyUid(uuid::Uuid::from_bytes([n; 16]))
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_pinned_address_is_kept_from_other_pins_and_from_allocation() {
        let mut r = Reservations::default();
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        r.register("e", uid(1), "team-a", &[ip("203.0.113.7")]);
        let msg = r
            .conflict("e", &uid(2), None, "team-b", &[ip("203.0.113.7")], t)
            .unwrap();
        assert!(msg.contains("pinned by another Proxy"), "{msg}");
        assert!(!msg.contains("team-a"), "names no other tenant: {msg}");
        assert!(
            r.conflict("e", &uid(1), None, "team-a", &[ip("203.0.113.7")], t)
                .is_none()
        );
        assert_eq!(
            r.reserved_for("e", &uid(3), "team-b", t),
            [ip("203.0.113.7")]
        );
        assert!(r.reserved_for("other", &uid(3), "team-b", t).is_empty());
        // The replacement of the pinning Proxy (vouched for by its pool's driver) may pin it;
        // a Proxy naming another one may not.
        assert!(
            r.conflict(
                "e",
                &uid(2),
                Some(&uid(1)),
                "team-a",
                &[ip("203.0.113.7")],
                t
            )
            .is_none()
        );
        assert!(
            r.conflict(
                "e",
                &uid(2),
                Some(&uid(4)),
                "team-a",
                &[ip("203.0.113.7")],
                t
            )
            .is_some()
        );
        r.forget(&uid(1));
        assert!(
            r.conflict("e", &uid(2), None, "team-b", &[ip("203.0.113.7")], t)
                .is_none()
        );
        assert!(r.reserved_for("e", &uid(3), "team-b", t).is_empty());
    }

    #[test]
    fn a_released_address_is_held_for_its_namespace_until_the_hold_ends() {
        let mut r = Reservations::default();
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        r.hold(
            "e",
            "team-a",
            &[ip("203.0.113.7")],
            t + Duration::from_secs(600),
        );
        let msg = r
            .conflict("e", &uid(2), None, "team-b", &[ip("203.0.113.7")], t)
            .unwrap();
        assert!(msg.contains("reserved for its previous holder"), "{msg}");
        assert!(!msg.contains("team-a"), "{msg}");
        // Its own namespace (a pool's replacement) may take it back.
        assert!(
            r.conflict("e", &uid(3), None, "team-a", &[ip("203.0.113.7")], t)
                .is_none()
        );
        assert_eq!(
            r.reserved_for("e", &uid(4), "team-b", t),
            [ip("203.0.113.7")]
        );
        assert!(r.reserved_for("e", &uid(4), "team-a", t).is_empty());
        // After the hold, anyone.
        let later = t + Duration::from_secs(601);
        assert!(
            r.conflict("e", &uid(2), None, "team-b", &[ip("203.0.113.7")], later)
                .is_none()
        );
        assert!(r.reserved_for("e", &uid(4), "team-b", later).is_empty());
    }
}
