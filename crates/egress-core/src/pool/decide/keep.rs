//! `rotation.egressAddress: Keep`: a member replaced for its age or a template change leaves
//! its host and egress addresses in the pool's status ([`remember`]); once it is gone from
//! the members, its replacement is created on that host pinned to those addresses
//! ([`take`]), or, when that host cannot take it, placed elsewhere with fresh addresses.
//!
//! Guarantees: pure; at most `replicas` entries; an entry is used once; a member replaced
//! for another cause (quarantine, autohealing, scale-in) leaves no entry.

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::pool::member::Member;
use crate::pool::status::PendingAddress;

use super::io::{DeleteCause, PoolInputs};
use super::place::backoff_end;

/// Remembers the addresses of `m`, deleted for `cause`, when it had any.
pub(super) fn remember(
    list: &mut Vec<PendingAddress>,
    m: &Member,
    cause: DeleteCause,
    replicas: usize,
) {
    if !matches!(cause, DeleteCause::Age | DeleteCause::Template) {
        return;
    }
    let Some(host) = m.host.as_deref().filter(|h| !h.is_empty()) else {
        return;
    };
    if m.egress_address.is_empty() || list.iter().any(|e| e.member == m.name) {
        return;
    }
    if list.len() >= replicas {
        return;
    }
    list.push(PendingAddress {
        member: m.name.clone(),
        host: host.to_owned(),
        addresses: m.egress_address.clone(),
    });
}

/// Takes the entries whose member is gone: `(host, pin)` of each replacement to create on
/// its old host (counted in `counts`), and how many entries still wait for their member to
/// go (each holds its slot). Entries whose host cannot take the replacement are dropped: the
/// replacement is placed as any other create, with fresh addresses.
pub(super) fn take(
    list: &mut Vec<PendingAddress>,
    i: &PoolInputs<'_>,
    counts: &mut BTreeMap<String, u32>,
) -> (Vec<(String, Vec<IpAddr>)>, usize) {
    let p = i.policy;
    let mut pinned = Vec::new();
    let mut held = 0usize;
    list.retain(|e| {
        if let Some(m) = i.members.iter().find(|m| m.name == e.member) {
            // Still deleting or draining: it holds its slot; not removed (yet): counted as
            // stale.
            if m.deleting || m.draining.is_some() {
                held += 1;
            }
            return true;
        }
        let pin: Vec<IpAddr> = e.addresses.iter().filter_map(|a| a.parse().ok()).collect();
        let count = counts.get(&e.host).copied().unwrap_or(0);
        let usable = !pin.is_empty()
            && (p.hosts.is_empty() || p.hosts.contains(&e.host))
            && i.hosts
                .iter()
                .any(|h| h.name == e.host && h.accepts_placements())
            && p.max_per_host.is_none_or(|m| count < m)
            && !i
                .status
                .host_failures
                .iter()
                .any(|f| f.host == e.host && backoff_end(p, f).is_some_and(|end| end > i.now));
        if usable {
            *counts.entry(e.host.clone()).or_default() += 1;
            pinned.push((e.host.clone(), pin));
        }
        false
    });
    (pinned, held)
}
