//! Where a new instance goes: the pin, else the least loaded host that accepts placements;
//! and why none was chosen.
//!
//! Guarantees: pure; a host that is unhealthy or whose pool is at or below its reserve gets
//! no new proxies; ties break by host name, so the choice is deterministic.

use egress_provider::libvirt::config::LibvirtEntry;

use super::inputs::HostView;

/// Where to place: the pin when it accepts placements, else the host accepting placements
/// with the fewest proxies of this entry (ties by name). A host accepts placements only when
/// its last report is Ready or it has none yet ([`crate::hosthealth::accepts_placements`]):
/// an unhealthy host, or one whose pool is at or below its reserve (reported Degraded), gets
/// no new proxies. `None` when no host qualifies. Costs what `hosts` answers in: O(log
/// hosts) from the executor's ordered view.
pub fn place(entry: &LibvirtEntry, pinned: Option<&str>, hosts: &dyn HostView) -> Option<String> {
    if let Some(p) = pinned {
        let usable = crate::hosthealth::accepts_placements(hosts.info(p).health);
        return usable.then(|| p.to_owned());
    }
    hosts.least_loaded(entry)
}

/// Why no host was chosen: each host with its last state.
pub(super) fn no_usable_host(
    entry: &LibvirtEntry,
    pinned: Option<&str>,
    hosts: &dyn HostView,
) -> String {
    let state = |n: &str| {
        hosts
            .info(n)
            .health
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
