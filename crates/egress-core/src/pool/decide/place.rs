//! Where the pool's new members go: spread over the usable hosts, fewest of this pool's
//! members first, within `maxPerHost`, away from hosts that are unhealthy, out of space or
//! backing off after failures, cordoned or draining; and why a host was refused.
//!
//! Guarantees: pure; O(hosts) per member placed; ties break by the entry's host order, so the
//! choice is deterministic; a host never gets more than `maxPerHost` members counting every
//! member still on it (quarantined and deleting ones too).

use std::collections::BTreeMap;
use std::time::SystemTime;

use crate::controller::backoff::backoff;
use crate::controller::decide::fmt_time;
use crate::pool::status::HostFailures;
use crate::pool::validate::PoolPolicy;

use super::io::PoolHost;

/// The outcome of placing up to `n` members.
#[derive(Debug, Default)]
pub(super) struct Placed {
    /// The host of each member placed, in order.
    pub(super) hosts: Vec<String>,
    /// Hosts refused when a member could not be placed: `"NAME REASON"` each.
    pub(super) refused: Vec<String>,
    /// Every usable host was only backing off.
    pub(super) backing_off: bool,
    /// When the first backoff ends (a moment to decide again).
    pub(super) backoff_ends: Option<SystemTime>,
}

/// When creates on a host may resume after `f`.
pub(super) fn backoff_end(p: &PoolPolicy, f: &HostFailures) -> Option<SystemTime> {
    let last = humantime::parse_rfc3339_weak(&f.last_failure).ok()?;
    last.checked_add(backoff(p.backoff_initial, p.backoff_max, f.count))
}

/// Places up to `n` members; `counts` holds each host's members now and is updated.
pub(super) fn place(
    n: usize,
    p: &PoolPolicy,
    hosts: &[PoolHost],
    failures: &[HostFailures],
    counts: &mut BTreeMap<String, u32>,
    now: SystemTime,
) -> Placed {
    let mut out = Placed::default();
    let in_subset = |h: &str| p.hosts.is_empty() || p.hosts.iter().any(|s| s == h);
    let candidates: Vec<&PoolHost> = hosts.iter().filter(|h| in_subset(&h.name)).collect();
    let backoff_until = |h: &str| {
        failures
            .iter()
            .find(|f| f.host == h)
            .and_then(|f| backoff_end(p, f))
            .filter(|end| *end > now)
    };
    for _ in 0..n {
        let count = |h: &str| counts.get(h).copied().unwrap_or(0);
        let best = candidates
            .iter()
            .filter(|h| h.accepts_placements())
            .filter(|h| p.max_per_host.is_none_or(|m| count(&h.name) < m))
            .filter(|h| backoff_until(&h.name).is_none())
            .min_by_key(|h| count(&h.name))
            .map(|h| h.name.clone());
        let Some(host) = best else {
            refuse(&mut out, p, &candidates, counts, &backoff_until, hosts);
            break;
        };
        *counts.entry(host.clone()).or_default() += 1;
        out.hosts.push(host);
    }
    out
}

/// Records why no host could take a member.
fn refuse(
    out: &mut Placed,
    p: &PoolPolicy,
    candidates: &[&PoolHost],
    counts: &BTreeMap<String, u32>,
    backoff_until: &dyn Fn(&str) -> Option<SystemTime>,
    hosts: &[PoolHost],
) {
    let mut only_backoff = !candidates.is_empty();
    for h in candidates {
        let count = counts.get(&h.name).copied().unwrap_or(0);
        let why = if !h.maintenance.accepts_placements() {
            only_backoff = false;
            crate::host_health::maintenance_reason(h.maintenance).to_owned()
        } else if !crate::host_health::accepts_placements(h.state) {
            only_backoff = false;
            h.state
                .map_or_else(|| "unchecked".to_owned(), |s| format!("{s:?}"))
        } else if let Some(m) = p.max_per_host.filter(|m| count >= *m) {
            only_backoff = false;
            format!("full ({count} members, maxPerHost {m})")
        } else if let Some(end) = backoff_until(&h.name) {
            out.backoff_ends = Some(out.backoff_ends.map_or(end, |e| e.min(end)));
            format!("backing off after failures until {}", fmt_time(end))
        } else {
            continue;
        };
        out.refused.push(format!("{} {why}", h.name));
    }
    for s in &p.hosts {
        if !hosts.iter().any(|h| &h.name == s) {
            out.refused
                .push(format!("{s} not a host of the provider entry"));
        }
    }
    if candidates.is_empty() && p.hosts.is_empty() {
        out.refused.push("the provider entry has no hosts".into());
    }
    out.backing_off = only_backoff;
}
