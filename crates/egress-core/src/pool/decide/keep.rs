//! `rotation.egressAddress: Keep`: a member replaced for its age or a template change leaves
//! its host and egress addresses in the pool's status ([`remember`]); once it is gone from
//! the members, its replacement is created on that host pinned to those addresses
//! ([`take`]), or, when that host cannot take it, placed elsewhere with fresh addresses.
//!
//! A member lost with its host ([`remember_lost`]) leaves an entry too when that host has
//! peers on its segment (`hosts[].segment`): its replacement is created at once on one of
//! them ([`take`], placed as any member among those peers), pinned to its addresses and
//! naming it (`replaces`), so the provider may confirm its instance gone (list or fence its
//! host) and move the addresses; never on a timeout alone. Without a usable peer it is placed
//! elsewhere with fresh addresses.
//!
//! Guarantees: pure; at most `replicas` entries; an entry is used once; a member replaced
//! for another cause (quarantine, autohealing, scale-in) leaves no entry.

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::pool::member::Member;
use crate::pool::status::PendingAddress;

use super::io::{DeleteCause, PoolHost, PoolInputs};
use super::place::{backoff_end, place};

/// A replacement to create on `host` pinned to `pin`; `replaces` names the lost member whose
/// addresses it takes on another host of the same segment.
pub(super) type Pinned = (String, Vec<IpAddr>, Option<String>);

/// The other hosts of `host`'s segment (none when it has no segment).
pub(super) fn segment_peers<'h>(hosts: &'h [PoolHost], host: &str) -> Vec<&'h PoolHost> {
    let Some(seg) = hosts
        .iter()
        .find(|h| h.name == host)
        .and_then(|h| h.segment.as_deref())
    else {
        return Vec::new();
    };
    hosts
        .iter()
        .filter(|h| h.name != host && h.segment.as_deref() == Some(seg))
        .collect()
}

/// Whether `m`'s host has peers on its segment.
pub(super) fn has_peers(hosts: &[PoolHost], m: &Member) -> bool {
    m.host
        .as_deref()
        .is_some_and(|h| !segment_peers(hosts, h).is_empty())
}

/// Remembers the addresses of each member of `lost`, just lost with its host, when that host
/// has peers on its segment (the replacement takes them there) and the member had any.
pub(super) fn remember_lost(list: &mut Vec<PendingAddress>, lost: &[&Member], i: &PoolInputs<'_>) {
    let replicas = usize::try_from(i.policy.replicas).unwrap_or(usize::MAX);
    for m in lost {
        let Some(host) = m.host.as_deref().filter(|h| !h.is_empty()) else {
            continue;
        };
        if m.egress_address.is_empty()
            || !has_peers(i.hosts, m)
            || list.iter().any(|e| e.member == m.name)
            || list.len() >= replicas
        {
            continue;
        }
        list.push(PendingAddress {
            member: m.name.clone(),
            host: host.to_owned(),
            addresses: m.egress_address.clone(),
            lost: true,
        });
    }
}

/// The `MemberCreated` event's message for `name` on `host`, replacing lost member `replaces`.
pub(super) fn created_message(name: &str, host: &str, replaces: Option<&str>) -> String {
    match replaces {
        Some(lost) => format!(
            "created member {name} on host {host}, replacing lost member {lost} at its egress \
             addresses (once its instance is confirmed gone)"
        ),
        None => format!("created member {name} on host {host}"),
    }
}

/// Remembers the addresses of `m`, deleted for `cause`, when it had any: its replacement
/// takes them on its host, or, for a member moved for spread (cause `rebalance`), on `to` (a
/// host of the same segment: the addresses move there once `m` is gone).
pub(super) fn remember(
    list: &mut Vec<PendingAddress>,
    m: &Member,
    cause: DeleteCause,
    to: Option<&str>,
    replicas: usize,
) {
    let host = match cause {
        DeleteCause::Age | DeleteCause::Template => m.host.as_deref(),
        DeleteCause::Rebalance => to,
        _ => return,
    };
    let Some(host) = host.filter(|h| !h.is_empty()) else {
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
        lost: false,
    });
}

/// Takes the entries whose member is gone, and those of lost members: the replacements to
/// create (counted in `counts`) — on the old host, or, for a lost member, on a peer of its
/// segment naming it — and how many entries still wait for their member to go (each holds
/// its slot). Entries whose host (or every peer) cannot take the replacement are dropped: the
/// replacement is placed as any other create, with fresh addresses.
pub(super) fn take(
    list: &mut Vec<PendingAddress>,
    i: &PoolInputs<'_>,
    counts: &mut BTreeMap<String, u32>,
) -> (Vec<Pinned>, usize) {
    let p = i.policy;
    let mut pinned = Vec::new();
    let mut held = 0usize;
    list.retain(|e| {
        if e.lost {
            // NB: the lost member stays among the members while its host is dead; its
            // replacement does not wait for it (the provider waits for its instance instead).
            let pin: Vec<IpAddr> = e.addresses.iter().filter_map(|a| a.parse().ok()).collect();
            if pin.is_empty() {
                return false;
            }
            let peers: Vec<PoolHost> = segment_peers(i.hosts, &e.host)
                .into_iter()
                .cloned()
                .collect();
            let placed = place(1, p, &peers, &i.status.host_failures, counts, i.now);
            if let Some(h) = placed.hosts.into_iter().next() {
                pinned.push((h, pin, Some(e.member.clone())));
            }
            return false;
        }
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
            pinned.push((e.host.clone(), pin, None));
        }
        false
    });
    (pinned, held)
}
