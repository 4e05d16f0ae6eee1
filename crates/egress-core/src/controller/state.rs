//! The executor's in-memory state: per-Proxy memory and work in flight, where each
//! instance is, host health, creation times, and the queues of Proxies waiting for a host's
//! work slot.
//!
//! Guarantees: plain data behind one mutex (`egress_provider::sync::lock` recovers it from
//! poisoning, since every update leaves it consistent); each UID waits at most once per
//! host, so the queues are bounded by the number of Proxies; no I/O. Each host's load (see
//! [`host_view`](super::host_view)) is kept as a count updated on every change of a UID's
//! location or work in flight ([`State::set_location`], [`State::clear_location`],
//! [`State::refresh_load`]), so reading it costs O(1) per host whatever the fleet's size;
//! [`State::recount_loads`] recomputes it from scratch for tests that pin the two together.
//! Each entry's hosts are also kept ordered by that load ([`HostOrders`]), so placement
//! ([`State::least_loaded`]) costs O(log hosts) plus the hosts it skips (unhealthy, or with
//! no free work slot).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::SystemTime;

use egress_provider::libvirt::config::LibvirtEntry;
use egress_provider::model::{HostState, ProviderId, ProxyUid};

use super::decide::{AddressRoom, Memory};
use super::host_order::HostOrders;
use super::inflight::{OpKind, RunningOp};

#[derive(Default)]
pub(super) struct ObjState {
    pub(super) memory: Memory,
    pub(super) op: Option<RunningOp>,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) objects: HashMap<ProxyUid, ObjState>,
    /// Where each UID's instance is, from adoption, creates and gets.
    pub(super) locations: HashMap<ProxyUid, ProviderId>,
    /// Last reported health per entry, per host (nested, so a lookup by `&str` allocates
    /// nothing).
    pub(super) health: HashMap<String, HashMap<String, HostState>>,
    /// Per entry, per host: since when its reports have said it is dead (`Unreachable` or
    /// `Timeout`) without a break, as this process saw it (the first such report's arrival);
    /// no entry for a host whose last report is not dead. In memory only: an operator restart
    /// restarts every clock, so a pool never replaces a lost member early after one.
    pub(super) dead_since: HashMap<String, HashMap<String, std::time::SystemTime>>,
    /// Per entry, per host: since when its reports have said it is `Ready` without a break,
    /// as this process saw it; no entry for a host whose last report is not Ready. In memory
    /// only, like `dead_since`: after an operator restart a pool moves no member to a host
    /// before it has been Ready for the settle time again.
    pub(super) ready_since: HashMap<String, HashMap<String, std::time::SystemTime>>,
    /// Per entry, per host: why its last report is not Ready ([`HostReport::reason`]); no
    /// entry for a Ready host.
    ///
    /// [`HostReport::reason`]: egress_provider::model::HostReport::reason
    pub(super) host_reasons: HashMap<String, HashMap<String, String>>,
    /// When each UID's instance was created: its mark's time from a listing, or when a
    /// create of it succeeded in this process.
    pub(super) created: HashMap<ProxyUid, SystemTime>,
    /// UIDs refused a work slot, per (entry, host), oldest first, with whether the Proxy is
    /// pinned to that host; each UID at most once per host (bounded by the number of
    /// Proxies). A freed slot wakes a waiter (see [`State::take_waiter`]).
    pub(super) waiting: HashMap<(String, String), VecDeque<(ProxyUid, bool)>>,
    /// The (entry, host) each UID's load counts on: its create in flight, else its location.
    load_of: HashMap<ProxyUid, (String, String)>,
    /// Per entry, per host: how many UIDs count on it (entries of [`State::load_of`]).
    loads: HashMap<String, HashMap<String, usize>>,
    /// Each entry's hosts ordered by those loads (moved with every count).
    orders: HostOrders,
    /// Per entry, per host: its declared-address pool as its last report showed it (hosts
    /// without a pool have no entry).
    addresses: HashMap<String, HashMap<String, AddressRoom>>,
    /// Hosts other than its location where a copy of a UID's instance may remain (see
    /// [`strays`](super::strays)); no entry for a UID without any.
    pub(super) strays: HashMap<ProxyUid, Strays>,
    /// The other listed copies of a UID whose location a listing chose among several (each
    /// with its mark's creation time), kept until the UID's next reconcile: there the copy
    /// its Proxy's status names wins (see [`State::prefer_recorded_copy`]). No entry for a UID
    /// listed once.
    pub(super) adopted_alternatives: HashMap<ProxyUid, Vec<(ProviderId, SystemTime)>>,
    /// Pinned egress addresses and addresses held for a namespace (see
    /// [`reservations`](super::reservations)).
    pub(super) reservations: super::reservations::Reservations,
    /// Each known Proxy's size and namespace (set by every reconcile), for the host usage
    /// and namespace counts below.
    sizes: HashMap<ProxyUid, Size>,
    /// What each UID counts in [`State::usage`] and [`State::ns_counts`]: the (entry, host)
    /// of its load and its size then.
    usage_of: HashMap<ProxyUid, (String, String, Size)>,
    /// Per entry, per host: memory (MiB) and vCPUs of the UIDs counting on it.
    usage: HashMap<String, HashMap<String, (u64, u64)>>,
    /// Per entry, per namespace: how many UIDs count on one of its hosts.
    ns_counts: HashMap<String, HashMap<String, usize>>,
}

/// A Proxy's size and namespace, as its last reconcile computed them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Size {
    /// Memory, MiB.
    pub(super) memory_mib: u64,
    /// vCPUs.
    pub(super) vcpus: u64,
    /// Its namespace.
    pub(super) namespace: String,
}

impl State {
    /// Where `uid`'s instance is now (from adoption, a create or a get); its host's load
    /// follows. A location on another host than before leaves the old host noted as a place
    /// where a copy may remain (see [`strays`](super::strays)); the new host is no longer one.
    pub(super) fn set_location(&mut self, uid: ProxyUid, id: ProviderId) {
        let moved_from = self
            .locations
            .get(&uid)
            .filter(|old| (&old.entry, &old.host) != (&id.entry, &id.host))
            .map(|old| (old.entry.clone(), old.host.clone()));
        self.unnote_stray(&uid, &id.entry, &id.host);
        self.locations.insert(uid, id);
        if let Some((entry, host)) = moved_from {
            self.note_stray(uid, &entry, &host);
        }
        self.refresh_load(&uid);
    }

    /// At `uid`'s first reconcile after a listing chose its location among several copies:
    /// when the Proxy's status records (`recorded`) another of the listed copies, that one
    /// becomes the location and the listing's choice a copy to remove. The status is what the
    /// previous owner of the Proxy (an earlier leadership term, a process before a restart)
    /// last reported, and such an owner never sweeps the copy it reported (its location), so
    /// following it keeps a new term from deleting the copy in use while the old term's sweep
    /// in flight deletes the other. Without a status, or one naming no listed copy, the
    /// listing's newest copy stays. O(copies listed for `uid`).
    pub(super) fn prefer_recorded_copy(&mut self, uid: &ProxyUid, recorded: Option<&str>) {
        let Some(alternatives) = self.adopted_alternatives.remove(uid) else {
            return;
        };
        let Some(recorded) = recorded.and_then(|s| s.parse::<ProviderId>().ok()) else {
            return;
        };
        if self.locations.get(uid) == Some(&recorded) || self.sweeping(uid) {
            return;
        }
        if let Some((id, created)) = alternatives.into_iter().find(|(id, _)| *id == recorded) {
            self.set_location(*uid, id);
            self.created.insert(*uid, created);
        }
    }

    /// `uid` has no instance any more (deleted or not found); its host's load follows.
    pub(super) fn clear_location(&mut self, uid: &ProxyUid) {
        self.locations.remove(uid);
        self.refresh_load(uid);
    }

    /// `entry`'s `host` reported `room` in its declared-address pool; its place in the
    /// order follows. O(log hosts).
    pub(super) fn set_address_room(&mut self, entry: &str, host: &str, room: AddressRoom) {
        let m = self.addresses.entry(entry.to_owned()).or_default();
        let before = m.get(host).copied().unwrap_or_default();
        if before == room {
            return;
        }
        if room == AddressRoom::default() {
            m.remove(host);
        } else {
            m.insert(host.to_owned(), room);
        }
        let load = self.load(entry, host);
        self.orders.reranked(entry, host, load, room);
    }

    /// The declared-address room of `entry`'s `host` as last reported. O(1).
    pub(super) fn address_room(&self, entry: &str, host: &str) -> AddressRoom {
        self.addresses
            .get(entry)
            .and_then(|m| m.get(host))
            .copied()
            .unwrap_or_default()
    }

    /// Host load of `entry`'s `host`: UIDs with a create in flight there, plus UIDs whose
    /// instance is there and that have no create in flight elsewhere. O(1).
    pub(super) fn load(&self, entry: &str, host: &str) -> usize {
        self.loads
            .get(entry)
            .and_then(|m| m.get(host))
            .copied()
            .unwrap_or(0)
    }

    /// What `uid` counts on from its current state: its create in flight (finished or not,
    /// until its result is taken), else where its instance is.
    fn load_key(&self, uid: &ProxyUid) -> Option<(&str, &str)> {
        let creating = self.objects.get(uid).and_then(|o| match &o.op {
            Some(RunningOp {
                kind: OpKind::Create { entry, host, .. },
                ..
            }) => Some((entry.as_str(), host.as_str())),
            _ => None,
        });
        creating.or_else(|| {
            self.locations
                .get(uid)
                .map(|id| (id.entry.as_str(), id.host.as_str()))
        })
    }

    /// Records `uid`'s size and namespace (from its reconcile); its host's usage follows.
    /// `None` forgets it. O(1).
    pub(super) fn set_size(&mut self, uid: ProxyUid, size: Option<Size>) {
        match size {
            Some(s) => {
                if self.sizes.get(&uid) == Some(&s) {
                    return;
                }
                self.sizes.insert(uid, s);
            }
            None => {
                self.sizes.remove(&uid);
            }
        }
        self.refresh_usage(&uid);
    }

    /// Memory (MiB) and vCPUs counted on `entry`'s `host`. O(1).
    pub(super) fn usage(&self, entry: &str, host: &str) -> (u64, u64) {
        self.usage
            .get(entry)
            .and_then(|m| m.get(host))
            .copied()
            .unwrap_or((0, 0))
    }

    /// How many UIDs of namespace `ns` count on a host of `entry`. O(1).
    pub(super) fn namespace_count(&self, entry: &str, ns: &str) -> usize {
        self.ns_counts
            .get(entry)
            .and_then(|m| m.get(ns))
            .copied()
            .unwrap_or(0)
    }

    /// Whether `uid` counts on a host of `entry` now (an instance or a create there).
    pub(super) fn counts_on(&self, uid: &ProxyUid, entry: &str) -> bool {
        self.usage_of.get(uid).is_some_and(|(e, _, _)| e == entry)
    }

    /// Brings `uid`'s share of the host usage and namespace counts up to date. O(1).
    fn refresh_usage(&mut self, uid: &ProxyUid) {
        let now = self.load_key(uid).map(|(e, h)| {
            (
                e.to_owned(),
                h.to_owned(),
                self.sizes.get(uid).cloned().unwrap_or_default(),
            )
        });
        if now.as_ref() == self.usage_of.get(uid) {
            return;
        }
        if let Some((e, h, size)) = self.usage_of.remove(uid) {
            if let Some(m) = self.usage.get_mut(&e) {
                if let Some(u) = m.get_mut(&h) {
                    u.0 = u.0.saturating_sub(size.memory_mib);
                    u.1 = u.1.saturating_sub(size.vcpus);
                    if *u == (0, 0) {
                        m.remove(&h);
                    }
                }
                if m.is_empty() {
                    self.usage.remove(&e);
                }
            }
            if let Some(m) = self.ns_counts.get_mut(&e) {
                if let Some(n) = m.get_mut(&size.namespace) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        m.remove(&size.namespace);
                    }
                }
                if m.is_empty() {
                    self.ns_counts.remove(&e);
                }
            }
        }
        if let Some((e, h, size)) = now {
            let u = self
                .usage
                .entry(e.clone())
                .or_default()
                .entry(h.clone())
                .or_default();
            u.0 = u.0.saturating_add(size.memory_mib);
            u.1 = u.1.saturating_add(size.vcpus);
            *self
                .ns_counts
                .entry(e.clone())
                .or_default()
                .entry(size.namespace.clone())
                .or_default() += 1;
            self.usage_of.insert(*uid, (e, h, size));
        }
    }

    /// Brings `uid`'s share of the host loads up to date after its work in flight or its
    /// location changed (or it was forgotten). O(1); call it after every such change.
    pub(super) fn refresh_load(&mut self, uid: &ProxyUid) {
        self.refresh_usage(uid);
        let now = self.load_key(uid);
        let before = self.load_of.get(uid);
        if now == before.map(|(e, h)| (e.as_str(), h.as_str())) {
            return;
        }
        let now = now.map(|(e, h)| (e.to_owned(), h.to_owned()));
        if let Some((e, h)) = self.load_of.remove(uid)
            && let Some(m) = self.loads.get_mut(&e)
        {
            if let Some(n) = m.get_mut(&h) {
                let from = *n;
                *n = n.saturating_sub(1);
                self.orders.moved(&e, &h, from, *n);
                if *n == 0 {
                    m.remove(&h);
                }
            }
            if m.is_empty() {
                self.loads.remove(&e);
            }
        }
        if let Some((e, h)) = now {
            let n = self
                .loads
                .entry(e.clone())
                .or_default()
                .entry(h.clone())
                .or_default();
            *n += 1;
            let to = *n;
            self.orders.moved(&e, &h, to - 1, to);
            self.load_of.insert(*uid, (e, h));
        }
    }

    /// Where a new instance of `entry` (config digest `digest`) goes when nothing pins it:
    /// among the hosts that accept placements
    /// ([`crate::host_health::accepts_placements`]) and whose declared-address pool is not
    /// known exhausted for a family in `need`, the least loaded one (ties: free addresses
    /// first, see [`AddressRoom::rank`]) for which
    /// `has_slot(host, maxConcurrent)` says a work slot is free, else the least loaded one,
    /// among the hosts `eligible` admits (the Proxy's namespace's, with room for its size);
    /// ties by name. The same choice as a scan of every host with a full host's load raised by
    /// [`FULL_HOST_LOAD`](super::host_view::FULL_HOST_LOAD), in O(log hosts) plus the hosts
    /// skipped.
    pub(super) fn least_loaded(
        &mut self,
        entry: &LibvirtEntry,
        digest: &str,
        need: u8,
        has_slot: impl Fn(&str, u32) -> bool,
        eligible: &dyn Fn(&str) -> bool,
    ) -> Option<String> {
        let loads = self.loads.get(&entry.name);
        let rooms = self.addresses.get(&entry.name);
        let room = |h: &str| rooms.and_then(|m| m.get(h)).copied().unwrap_or_default();
        let order = self.orders.of(
            entry,
            digest,
            |h| loads.and_then(|m| m.get(h)).copied().unwrap_or(0),
            room,
        );
        let health = self.health.get(&entry.name);
        let mut fallback = None;
        for (_, _, host) in &order.by_load {
            let state = health.and_then(|m| m.get(host)).copied();
            if !crate::host_health::accepts_placements(state)
                || room(host).blocks(need)
                || !eligible(host)
            {
                continue;
            }
            if has_slot(host, order.max.get(host).copied().unwrap_or(1)) {
                return Some(host.clone());
            }
            fallback = fallback.or(Some(host));
        }
        fallback.cloned()
    }

    /// The instances of `entry` on `host` now (located there or being created there). O(1).
    pub(super) fn load_on(&self, entry: &str, host: &str) -> usize {
        self.loads
            .get(entry)
            .and_then(|m| m.get(host))
            .copied()
            .unwrap_or(0)
    }

    /// `maxConcurrent` of `entry`'s `host` (config digest `digest`), `None` when the entry
    /// has no such host. O(1).
    pub(super) fn max_concurrent(
        &mut self,
        entry: &LibvirtEntry,
        digest: &str,
        host: &str,
    ) -> Option<u32> {
        let loads = self.loads.get(&entry.name);
        let rooms = self.addresses.get(&entry.name);
        let order = self.orders.of(
            entry,
            digest,
            |h| loads.and_then(|m| m.get(h)).copied().unwrap_or(0),
            |h| rooms.and_then(|m| m.get(h)).copied().unwrap_or_default(),
        );
        order.max.get(host).copied()
    }

    /// Every host's load recounted from every object and location (O(n)): what the
    /// incremental counts must always equal. For tests.
    #[cfg(test)]
    pub(super) fn recount_loads(&self) -> HashMap<String, HashMap<String, usize>> {
        let mut out: HashMap<String, HashMap<String, usize>> = HashMap::new();
        let uids: std::collections::HashSet<&ProxyUid> =
            self.objects.keys().chain(self.locations.keys()).collect();
        for uid in uids {
            if let Some((e, h)) = self.load_key(uid) {
                *out.entry(e.to_owned())
                    .or_default()
                    .entry(h.to_owned())
                    .or_default() += 1;
            }
        }
        out
    }

    /// The incremental loads as kept (for tests comparing them with a recount).
    #[cfg(test)]
    pub(super) fn loads(&self) -> &HashMap<String, HashMap<String, usize>> {
        &self.loads
    }

    pub(super) fn wait_for_slot(&mut self, entry: &str, host: &str, uid: ProxyUid, pinned: bool) {
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
    /// host with a free slot, see
    /// [`FULL_HOST_LOAD`](super::host_view::FULL_HOST_LOAD)); a pinned Proxy is only woken for its
    /// own host, where it can use the slot.
    pub(super) fn take_waiter(&mut self, entry: &str, host: &str) -> Option<ProxyUid> {
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

    pub(super) fn forget_waiter(&mut self, uid: &ProxyUid) {
        self.waiting.retain(|_, q| {
            q.retain(|(u, _)| u != uid);
            !q.is_empty()
        });
    }
}

/// The hosts of one entry where a copy of a UID's instance may remain (`strays` explains
/// how a second copy comes to be and sweeps them).
#[derive(Debug, Default)]
pub(super) struct Strays {
    pub(super) entry: String,
    pub(super) hosts: BTreeSet<String>,
    /// A sweep of these hosts is running.
    pub(super) sweeping: bool,
    /// Sweeps that failed in a row.
    pub(super) failures: u32,
    /// No sweep before this time (after a failure; the reconciles' clock).
    pub(super) not_before: Option<SystemTime>,
}

impl State {
    /// Notes `entry`'s `host` as a place where a copy of `uid`'s instance may remain, unless
    /// it is where the instance is. O(log hosts noted).
    pub(super) fn note_stray(&mut self, uid: ProxyUid, entry: &str, host: &str) {
        if self
            .locations
            .get(&uid)
            .is_some_and(|l| l.entry == entry && l.host == host)
        {
            return;
        }
        let s = self.strays.entry(uid).or_default();
        if s.entry != entry {
            // NB: a placed Proxy's entry never changes (decide refuses it): a new entry means
            // the old notes belong to a config that is gone.
            s.entry = entry.to_owned();
            s.hosts.clear();
        }
        s.hosts.insert(host.to_owned());
    }

    /// `uid`'s instance is on `entry`'s `host`: no longer a place for a second copy.
    pub(super) fn unnote_stray(&mut self, uid: &ProxyUid, entry: &str, host: &str) {
        if let Some(s) = self.strays.get_mut(uid)
            && s.entry == entry
        {
            s.hosts.remove(host);
            if s.hosts.is_empty() && !s.sweeping {
                self.strays.remove(uid);
            }
        }
    }

    /// The hosts noted for `uid` (a delete of the Proxy covers them). Allocates only when
    /// there are some.
    pub(super) fn stray_hosts(&self, uid: &ProxyUid) -> Vec<String> {
        self.strays
            .get(uid)
            .map(|s| s.hosts.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Whether a sweep of `uid` is running (no create of it may start meanwhile).
    pub(super) fn sweeping(&self, uid: &ProxyUid) -> bool {
        self.strays.get(uid).is_some_and(|s| s.sweeping)
    }

    /// Whether a sweep of `uid` is running on `entry`'s `host`.
    pub(super) fn sweeping_host(&self, uid: &ProxyUid, entry: &str, host: &str) -> bool {
        self.strays
            .get(uid)
            .is_some_and(|s| s.sweeping && s.entry == entry && s.hosts.contains(host))
    }
}
