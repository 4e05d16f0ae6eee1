//! Everything [`decide`](super::decide()) looks at: the [`Inputs`] and the views in it (what
//! was observed, the work in flight, host loads and health, the per-object memory).
//!
//! Guarantees: plain data, no I/O; the executor builds these from its state, tests build
//! them directly.

use std::collections::BTreeMap;
use std::time::SystemTime;

use egress_provider::error::ProviderError;
use egress_provider::libvirt::config::LibvirtEntry;
use egress_provider::model::{HostState, Instance, ProviderId};

use crate::controller::{ControllerSettings, ProxyObject};
use crate::model::ProxyStatus;

/// What is known about the Proxy's instance this time.
#[derive(Debug, Clone, PartialEq)]
pub enum Observed {
    /// Not looked up (no location known, or work in flight, or deleting).
    Unknown,
    /// `get` found it (mark verified by the provider).
    Found(Instance),
    /// `get` says it is not there as ours, with the provider's words for why (the domain does
    /// not exist, or it exists but carries no valid mark for this Proxy and is left alone).
    NotFound(String),
    /// `get` failed.
    GetFailed(ProviderError),
    /// The host's read slots were all taken; not looked up (H1).
    HostBusy(String),
}

/// The Proxy's in-flight work, as the executor tracks it.
#[derive(Debug, Clone, PartialEq)]
pub enum OpView {
    /// Nothing in flight.
    Idle,
    /// A create (or replace) is running.
    Creating {
        /// Target host.
        host: String,
        /// Image being created from.
        image: String,
        /// When it started.
        started: SystemTime,
        /// Bytes done / total of an image import, once reported.
        progress: Option<(u64, Option<u64>)>,
    },
    /// A delete is running.
    Deleting {
        /// Hosts being cleaned.
        hosts: Vec<String>,
    },
    /// A create finished since the last reconcile.
    CreateFinished {
        /// Target host.
        host: String,
        /// Its result.
        result: Result<Instance, ProviderError>,
    },
    /// A delete finished since the last reconcile.
    DeleteFinished {
        /// Its result.
        result: Result<(), ProviderError>,
    },
}

/// Load, health and address room of one host of the entry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostInfo {
    /// Proxies of this entry known on it (instances and creates in flight).
    pub load: usize,
    /// Its last health report, if any.
    pub health: Option<HostState>,
    /// Its declared-address pool as its last report showed it.
    pub addresses: AddressRoom,
    /// Memory (MiB) of the entry's proxies counted on it (instances and creates in flight).
    pub used_memory_mib: u64,
    /// vCPUs of the entry's proxies counted on it.
    pub used_vcpus: u64,
}

/// The IPv4 bit of a set of address families.
pub const FAMILY_V4: u8 = 1;
/// The IPv6 bit of a set of address families.
pub const FAMILY_V6: u8 = 2;
/// What a Proxy that pins no address needs: one address of every family its host's pool has.
pub const EVERY_FAMILY: u8 = FAMILY_V4 | FAMILY_V6;

/// The families a Proxy needs an address of: those it pins, else [`EVERY_FAMILY`].
pub fn families_needed(pinned: &[std::net::IpAddr]) -> u8 {
    if pinned.is_empty() {
        return EVERY_FAMILY;
    }
    pinned
        .iter()
        .map(|ip| if ip.is_ipv4() { FAMILY_V4 } else { FAMILY_V6 })
        .fold(0, |a, b| a | b)
}

/// A host's declared-address pool as its last check reported it (`HostReport::addresses`):
/// the families it has and those with no free address. Empty (the default) for a host with
/// no pool or no report yet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct AddressRoom {
    /// Families the pool has ([`FAMILY_V4`], [`FAMILY_V6`] bits).
    pub pool: u8,
    /// Families whose every address is held.
    pub full: u8,
}

impl AddressRoom {
    /// The room a report's usage shows.
    pub fn of(usage: &[egress_provider::model::AddressUsage]) -> Self {
        let mut r = Self::default();
        for u in usage {
            let bit = match u.family {
                "IPv4" => FAMILY_V4,
                "IPv6" => FAMILY_V6,
                _ => continue,
            };
            r.pool |= bit;
            if u128::from(u.held).saturating_add(u128::from(u.retired)) >= u.size {
                r.full |= bit;
            }
        }
        r
    }

    /// Placement's preference among hosts of equal load: 0 for a pool with free addresses in
    /// every family, 1 without a pool, 2 for a pool with an exhausted family.
    pub fn rank(self) -> u8 {
        match (self.pool, self.full) {
            (0, _) => 1,
            (_, 0) => 0,
            _ => 2,
        }
    }

    /// Whether a Proxy needing addresses of `need` cannot get them here: its pool has one of
    /// those families exhausted.
    pub fn blocks(self, need: u8) -> bool {
        self.full & need != 0
    }

    /// The exhausted families, as words (`IPv4`, `IPv6`, `IPv4 and IPv6`).
    pub fn full_families(self) -> &'static str {
        match self.full {
            FAMILY_V4 => "IPv4",
            FAMILY_V6 => "IPv6",
            0 => "no",
            _ => "IPv4 and IPv6",
        }
    }
}

/// What placement reads about an entry's hosts: each host's load and health, and which host
/// a new instance goes to when nothing pins it.
///
/// `BTreeMap<String, HostInfo>` (a host missing from the map has no load and no report) is
/// the definition, by a scan of the entry's hosts; the executor answers the same questions
/// from hosts kept ordered by load, so a placement costs O(log hosts), not O(hosts).
pub trait HostView: std::fmt::Debug {
    /// Load and last health of `host` (no load and no report when the view has none).
    fn info(&self, host: &str) -> HostInfo;
    /// Among `entry`'s hosts that accept placements
    /// ([`crate::host_health::accepts_placements`]) and whose address pool is not known
    /// exhausted for a family in `need` ([`AddressRoom::blocks`]), the one with the least
    /// load, ties by [`AddressRoom::rank`] (free addresses first), then by name; `None` when
    /// no host qualifies. Only hosts `eligible` admits are considered.
    fn least_loaded(
        &self,
        entry: &LibvirtEntry,
        need: u8,
        eligible: &dyn Fn(&str) -> bool,
    ) -> Option<String>;
    /// Why `host`'s last report is not Ready, in a few words (what it misses, or its
    /// error); `None` when Ready, unchecked, or unknown to the view.
    fn reason(&self, host: &str) -> Option<String> {
        let _ = host;
        None
    }
    /// Since when `host`'s checks have found it dead
    /// ([`crate::host_health::is_dead`]: `Unreachable` or `Timeout`), from the first check
    /// that did; `None` while its last check found it answering, before any check, or when
    /// unknown to the view.
    fn dead_since(&self, host: &str) -> Option<SystemTime> {
        let _ = host;
        None
    }
}

impl HostView for BTreeMap<String, HostInfo> {
    fn info(&self, host: &str) -> HostInfo {
        self.get(host).copied().unwrap_or_default()
    }

    fn least_loaded(
        &self,
        entry: &LibvirtEntry,
        need: u8,
        eligible: &dyn Fn(&str) -> bool,
    ) -> Option<String> {
        entry
            .hosts
            .iter()
            .map(|h| (h.name.as_str(), self.info(&h.name)))
            .filter(|(n, i)| {
                crate::host_health::accepts_placements(i.health)
                    && !i.addresses.blocks(need)
                    && eligible(n)
            })
            .min_by(|(a, x), (b, y)| {
                (x.load, x.addresses.rank(), a).cmp(&(y.load, y.addresses.rank(), b))
            })
            .map(|(n, _)| n.to_owned())
    }
}

/// A Permanent failure latched for a generation and config digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Latch {
    /// The generation it was computed for.
    pub generation: i64,
    /// The entry's config digest then ("" when the entry was unknown).
    pub config_digest: String,
}

/// Per-object memory the executor keeps between reconciles.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Memory {
    /// Consecutive failures (drives the backoff; reset on success).
    pub failures: u32,
    /// A latched Permanent failure.
    pub latch: Option<Latch>,
}

/// The provider entry as the decision needs it.
#[derive(Debug, Clone, Copy)]
pub struct EntryView<'a> {
    /// The entry's configuration.
    pub config: &'a LibvirtEntry,
    /// Its digest (a change releases latches).
    pub config_digest: &'a str,
}

/// Everything [`decide`](super::decide()) looks at.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// The Proxy.
    pub obj: &'a ProxyObject,
    /// Its current status.
    pub status: &'a ProxyStatus,
    /// Its provider entry, when the config has it.
    pub entry: Option<&'a EntryView<'a>>,
    /// Where its instance is, when known (adopted, created, or from status).
    pub location: Option<&'a ProviderId>,
    /// Other hosts of its entry where a copy of its instance may remain (a create there had
    /// no known outcome, or a listing showed it there); a delete covers them too.
    pub strays: &'a [String],
    /// What the provider said this time.
    pub observed: &'a Observed,
    /// Work in flight.
    pub op: &'a OpView,
    /// Loads and health of the entry's hosts.
    pub hosts: &'a dyn HostView,
    /// Per-object memory.
    pub memory: &'a Memory,
    /// The clock.
    pub now: SystemTime,
    /// Settings.
    pub settings: &'a ControllerSettings,
}
