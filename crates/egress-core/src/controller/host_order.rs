//! Each entry's hosts ordered by load, so placement finds the least loaded host that can
//! take a new proxy in O(log hosts) rather than by comparing every host of the entry.
//!
//! Guarantees: no I/O; the order of an entry is built from its configuration the first time
//! placement asks (and again when the entry's config digest changes), then moved on every
//! change of a host's load ([`HostOrders::moved`], O(log hosts)) and of its declared-address
//! room ([`HostOrders::reranked`], O(log hosts)); a host the configuration
//! no longer has is not in the order, whatever its load. [`State`](super::state::State)
//! keeps it next to the load counts it mirrors.

use std::collections::{BTreeSet, HashMap};

use egress_provider::libvirt::config::LibvirtEntry;

use super::decide::AddressRoom;

/// One entry's hosts by (load, address rank, name), and each host's `maxConcurrent`.
#[derive(Debug, Default)]
pub(super) struct HostOrder {
    /// The config digest the order was built from.
    digest: String,
    /// (load, address rank, host name): iteration is least loaded first, ties by
    /// [`AddressRoom::rank`] (free declared addresses first), then by name.
    pub(super) by_load: BTreeSet<(usize, u8, String)>,
    /// Each host's address rank as it is in `by_load`.
    rank: HashMap<String, u8>,
    /// Each host's `maxConcurrent` (its work slots), by name.
    pub(super) max: HashMap<String, u32>,
}

/// The orders of the entries placement has asked about, by entry name.
#[derive(Debug, Default)]
pub(super) struct HostOrders {
    map: HashMap<String, HostOrder>,
}

impl HostOrders {
    /// `host` of `entry` went from load `from` to load `to`. O(log hosts); nothing when the
    /// entry's order was never built or does not have the host.
    pub(super) fn moved(&mut self, entry: &str, host: &str, from: usize, to: usize) {
        if let Some(o) = self.map.get_mut(entry)
            && let Some(rank) = o.rank.get(host).copied()
        {
            let key = (from, rank, host.to_owned());
            if o.by_load.remove(&key) {
                o.by_load.insert((to, rank, key.2));
            }
        }
    }

    /// `host` of `entry` (at `load`) now has `room` in its address pool. O(log hosts);
    /// nothing when the entry's order was never built or does not have the host.
    pub(super) fn reranked(&mut self, entry: &str, host: &str, load: usize, room: AddressRoom) {
        if let Some(o) = self.map.get_mut(entry)
            && let Some(rank) = o.rank.get_mut(host)
        {
            let key = (load, *rank, host.to_owned());
            if o.by_load.remove(&key) {
                *rank = room.rank();
                o.by_load.insert((load, *rank, key.2));
            }
        }
    }

    /// The order of `entry` (built from its hosts with `load` when missing or when its
    /// config digest changed: O(hosts log hosts), once per config).
    pub(super) fn of(
        &mut self,
        entry: &LibvirtEntry,
        digest: &str,
        load: impl Fn(&str) -> usize,
        room: impl Fn(&str) -> AddressRoom,
    ) -> &HostOrder {
        let o = self.map.entry(entry.name.clone()).or_default();
        if o.digest != digest || (o.max.is_empty() && !entry.hosts.is_empty()) {
            o.digest = digest.to_owned();
            o.rank = entry
                .hosts
                .iter()
                .map(|h| (h.name.clone(), room(&h.name).rank()))
                .collect();
            o.by_load = entry
                .hosts
                .iter()
                .map(|h| {
                    let rank = o.rank.get(&h.name).copied().unwrap_or(1);
                    (load(&h.name), rank, h.name.clone())
                })
                .collect();
            o.max = entry
                .hosts
                .iter()
                .map(|h| (h.name.clone(), h.max_concurrent))
                .collect();
        }
        o
    }
}
