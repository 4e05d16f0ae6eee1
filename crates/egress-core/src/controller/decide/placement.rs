//! Where a new instance goes: the pin, else the least loaded host that accepts placements;
//! and why none was chosen.
//!
//! Guarantees: pure; a Proxy pinning egress addresses goes to the host whose address pool
//! holds them (unless `spec.host` says otherwise); a host that is unhealthy or whose pool is at or below its reserve gets
//! no new proxies, nor does a cordoned or draining one (`maintenance`), nor a host whose declared-address pool is known exhausted for a
//! family the Proxy needs; among equally loaded hosts one with free addresses goes first;
//! ties break by host name, so the choice is deterministic.

use egress_provider::libvirt::config::LibvirtEntry;

use super::inputs::HostView;

/// Where to place: the pin when it accepts placements, else the host accepting placements
/// with the fewest proxies of this entry (ties by name). A host accepts placements only when
/// its last report is Ready or it has none yet ([`crate::host_health::accepts_placements`]):
/// an unhealthy host, or one whose pool is at or below its reserve (reported Degraded), gets
/// no new proxies. `None` when no host qualifies. Costs what `hosts` answers in: O(log
/// hosts) from the executor's ordered view.
///
/// With declared egress addresses, `need` is the families the Proxy needs an address of
/// ([`super::families_needed`]): a host whose address pool is known exhausted for one of them
/// gets no new proxy of it, and among hosts of equal load one with free addresses goes first
/// ([`HostView::least_loaded`]). A pinned host is taken whatever its pool says (the create
/// then fails naming the host and its pool). Only hosts `eligible` says yes to are taken
/// (the hosts the Proxy's namespace may use, with room for its size).
pub fn place(
    entry: &LibvirtEntry,
    pinned: Option<&str>,
    hosts: &dyn HostView,
    need: u8,
    eligible: &dyn Fn(&str) -> bool,
) -> Option<String> {
    if let Some(p) = pinned {
        let usable = crate::host_health::accepts_placements(hosts.info(p).health) && eligible(p);
        return usable.then(|| p.to_owned());
    }
    hosts.least_loaded(entry, need, eligible)
}

/// Why `host` cannot take `need` by its `capacity` (configured memory or vCPUs), if so.
pub(super) fn capacity_short(
    entry: &LibvirtEntry,
    host: &str,
    info: &super::inputs::HostInfo,
    need: (u64, u64),
    own: (u64, u64),
) -> Option<String> {
    let cap = entry.hosts.iter().find(|h| h.name == host)?.capacity;
    let mem = info.used_memory_mib.saturating_sub(own.0);
    let cpu = info.used_vcpus.saturating_sub(own.1);
    if let Some(c) = cap.memory_mib
        && mem.saturating_add(need.0) > c
    {
        return Some(format!(
            "full by memory ({mem} of {c} MiB placed, {} MiB needed)",
            need.0
        ));
    }
    if let Some(c) = cap.vcpus
        && cpu.saturating_add(need.1) > u64::from(c)
    {
        return Some(format!(
            "full by vCPUs ({cpu} of {c} placed, {} needed)",
            need.1
        ));
    }
    None
}

/// Why no host was chosen: each host with its last state (and, for a host without room
/// for `need` (memory MiB, vCPUs), what it lacks).
pub(super) fn no_usable_host(
    entry: &LibvirtEntry,
    pinned: Option<&str>,
    hosts: &dyn HostView,
    need: (u64, u64),
    own: &dyn Fn(&str) -> (u64, u64),
) -> String {
    let state = |n: &str| {
        let info = hosts.info(n);
        let health = info
            .health
            .map_or_else(|| "unchecked".to_owned(), |s| format!("{s:?}"));
        let mut why: Vec<String> = hosts.reason(n).into_iter().collect();
        if let Some(m) = entry
            .hosts
            .iter()
            .find(|h| h.name == n)
            .map(|h| h.maintenance)
            .filter(|m| !m.accepts_placements())
        {
            why.insert(0, crate::host_health::maintenance_reason(m).to_owned());
        }
        if info.addresses.full != 0 {
            why.push(format!(
                "its {} address pool exhausted",
                info.addresses.full_families()
            ));
        }
        if let Some(c) = capacity_short(entry, n, &info, need, own(n)) {
            why.push(c);
        }
        if why.is_empty() {
            health
        } else {
            format!("{health}: {}", why.join("; "))
        }
    };
    match pinned {
        Some(p) => format!(
            "host {p} (spec.host) is {}: no new proxies on a host that is not Ready or has no \
             room; waiting",
            state(p)
        ),
        None => {
            let list: Vec<String> = entry
                .hosts
                .iter()
                .map(|h| format!("{} {}", h.name, state(&h.name)))
                .collect();
            format!(
                "no host of provider entry {:?} takes new proxies ({}); waiting for one to be Ready",
                entry.name,
                list.join("; ")
            )
        }
    }
}

/// The first host of `entry` (in config order) whose address pool holds every address of
/// `pinned` among its allocatable ranges, preferring one `usable` says takes the Proxy now:
/// hosts of one `segment` share one pool, so a pinned Proxy goes to a live host of the
/// segment rather than wait for the first one. `None` without pins or when no host's pool
/// holds them all (the create then fails naming the pools). Reads each host's pool:
/// O(hosts), paid only when a Proxy that pins addresses is placed.
pub(super) fn host_holding(
    entry: &LibvirtEntry,
    pinned: &[std::net::IpAddr],
    eligible: &dyn Fn(&str) -> bool,
    usable: &dyn Fn(&str) -> bool,
) -> Option<String> {
    if pinned.is_empty() {
        return None;
    }
    let holding: Vec<&str> = entry
        .hosts
        .iter()
        .filter(|h| eligible(&h.name))
        .filter(|h| {
            h.address_pool
                .as_ref()
                .and_then(|p| p.parse().ok())
                .is_some_and(|pool| {
                    pinned
                        .iter()
                        .all(|ip| pool.family(*ip).is_some_and(|f| f.contains(*ip)))
                })
        })
        .map(|h| h.name.as_str())
        .collect();
    holding
        .iter()
        .find(|h| usable(h))
        .or(holding.first())
        .map(|h| (*h).to_owned())
}
