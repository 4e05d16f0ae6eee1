//! Where a new instance goes: the pin, else the least loaded host that accepts placements;
//! and why none was chosen.
//!
//! Guarantees: pure; a host that is unhealthy or whose pool is at or below its reserve gets
//! no new proxies; ties break by host name, so the choice is deterministic.

use std::collections::BTreeMap;

use egress_provider::libvirt::config::LibvirtEntry;

use super::inputs::HostInfo;

/// Where to place: the pin when it accepts placements, else the host accepting placements
/// with the fewest proxies of this entry (ties by name). A host accepts placements only when
/// its last report is Ready or it has none yet ([`crate::hosthealth::accepts_placements`]):
/// an unhealthy host, or one whose pool is at or below its reserve (reported Degraded), gets
/// no new proxies. `None` when no host qualifies.
pub fn place(
    entry: &LibvirtEntry,
    pinned: Option<&str>,
    hosts: &BTreeMap<String, HostInfo>,
) -> Option<String> {
    let info = |n: &str| hosts.get(n).copied().unwrap_or_default();
    let usable = |n: &str| crate::hosthealth::accepts_placements(info(n).health);
    if let Some(p) = pinned {
        return usable(p).then(|| p.to_owned());
    }
    entry
        .hosts
        .iter()
        .map(|h| h.name.as_str())
        .filter(|n| usable(n))
        .min_by(|a, b| info(a).load.cmp(&info(b).load).then_with(|| a.cmp(b)))
        .map(str::to_owned)
}

/// Why no host was chosen: each host with its last state.
pub(super) fn no_usable_host(
    entry: &LibvirtEntry,
    pinned: Option<&str>,
    hosts: &BTreeMap<String, HostInfo>,
) -> String {
    let state = |n: &str| {
        hosts
            .get(n)
            .and_then(|x| x.health)
            .map_or_else(|| "unchecked".to_owned(), |s| format!("{s:?}"))
    };
    match pinned {
        Some(p) => format!(
            "host {p} (spec.host) is {}: no new proxies on a host that is not Ready; waiting",
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
                list.join(", ")
            )
        }
    }
}
