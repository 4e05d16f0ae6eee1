//! Each entry's hosts ordered by load, so placement finds the least loaded host that can
//! take a new proxy in O(log hosts) rather than by comparing every host of the entry.
//!
//! Guarantees: no I/O; the order of an entry is built from its configuration the first time
//! placement asks (and again when the entry's config digest changes), then moved on every
//! change of a host's load ([`HostOrders::moved`], O(log hosts)); a host the configuration
//! no longer has is not in the order, whatever its load. [`State`](super::state::State)
//! keeps it next to the load counts it mirrors.

use std::collections::{BTreeSet, HashMap};

use egress_provider::libvirt::config::LibvirtEntry;

/// One entry's hosts by (load, name), and each host's `maxConcurrent`.
#[derive(Debug, Default)]
pub(super) struct HostOrder {
    /// The config digest the order was built from.
    digest: String,
    /// (load, host name): iteration is least loaded first, ties by name.
    pub(super) by_load: BTreeSet<(usize, String)>,
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
        if let Some(o) = self.map.get_mut(entry) {
            let key = (from, host.to_owned());
            if o.by_load.remove(&key) {
                o.by_load.insert((to, key.1));
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
    ) -> &HostOrder {
        let o = self.map.entry(entry.name.clone()).or_default();
        if o.digest != digest || (o.max.is_empty() && !entry.hosts.is_empty()) {
            o.digest = digest.to_owned();
            o.by_load = entry
                .hosts
                .iter()
                .map(|h| (load(&h.name), h.name.clone()))
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
