//! Spread restored (`placement.rebalance`, default on): a pool whose members sit unevenly
//! (as after a failover: the lost members' replacements went to the live hosts, and nothing
//! moves back when the dead host returns) replaces one member of its most loaded host on the
//! least loaded host it may use, through the same path as a replacement for age: the member
//! is outdated (cause `rebalance`) and removed within the `update` budget, its replacement
//! created on the target host (surge first, or after it is gone under `maxSurge: 0` and
//! `rotation.egressAddress: Keep`).
//!
//! The rule: only when the pool is settled (exactly `replicas` members, every one available,
//! none outdated, aged, listed, draining, quarantined, lost, unpublished, deleting, and no
//! addresses waiting for a replacement) and no rebalance is in flight
//! (`status.rebalancing`). A target host is one the pool may place on (`placement.hosts`,
//! Ready, not cordoned or draining, not backing off, below `maxPerHost`) that has been
//! `Ready` without a break for `autohealing.hostDeadAfter` (a flapping host attracts no
//! member). When the most loaded host holds at least two members more than the least loaded
//! target, the **oldest** member of the most loaded host (the one its age would replace
//! first) is replaced on that target. Under `Keep`, the target must share the member's host's
//! `segment` (its addresses move there once it is gone); without such a target the pool is not
//! rebalanced and its `Progressing` message says why.
//!
//! Guarantees: pure; O(members + hosts · log hosts) per round; at most one member in
//! flight; a member is marked only while the pool is settled, so a rebalance never adds to
//! another replacement; the status entry ends once the member is gone.

use std::collections::BTreeMap;
use std::time::SystemTime;

use crate::controller::decide::fmt_time;
use crate::controller::{Event, EventKind};
use crate::pool::member::Member;
use crate::pool::status::{Rebalancing, reason};

use super::io::{DeleteCause, PoolHost, PoolInputs};
use super::place::backoff_end;

/// Whether `h` may take a member moved there now: the pool may place on it, it accepts
/// placements, is not backing off, and is below `maxPerHost` at `count` members.
fn takes(i: &PoolInputs<'_>, h: &PoolHost, count: u32) -> bool {
    let p = i.policy;
    (p.hosts.is_empty() || p.hosts.contains(&h.name))
        && h.accepts_placements()
        && p.max_per_host.is_none_or(|m| count < m)
        && !i
            .status
            .host_failures
            .iter()
            .any(|f| f.host == h.name && backoff_end(p, f).is_some_and(|end| end > i.now))
}

/// What the round does about spread.
#[derive(Debug, Default)]
pub(super) struct Plan {
    /// The rebalance in flight after this round (`status.rebalancing`).
    pub(super) entry: Option<Rebalancing>,
    /// The host this round's first create goes to (the in-flight rebalance's target).
    pub(super) target: Option<String>,
    /// Why an uneven pool is not rebalanced (for the `Progressing` message).
    pub(super) note: Option<String>,
}

/// Carries on or starts a rebalance: moves its member from `fresh` to `stale` (cause
/// `rebalance`); `settled` says whether the pool is settled (see the module doc); `wake` is
/// told when a host that would take a member has been Ready long enough.
pub(super) fn plan<'a>(
    i: &PoolInputs<'_>,
    settled: bool,
    fresh: &mut Vec<&'a Member>,
    stale: &mut Vec<(&'a Member, DeleteCause)>,
    events: &mut Vec<Event>,
    wake: &mut dyn FnMut(SystemTime),
) -> Plan {
    let p = i.policy;
    let mut out = Plan::default();
    if let Some(e) = &i.status.rebalancing {
        // Done once the member is gone (its replacement made as for any removed member).
        if !p.rebalance || !i.members.iter().any(|m| m.name == e.member) {
            out.target = p.rebalance.then(|| e.to.clone());
            return out;
        }
        let target_ok = i.hosts.iter().any(|h| h.name == e.to && takes(i, h, 0));
        if let Some(at) = fresh.iter().position(|m| m.name == e.member) {
            if !target_ok {
                // The target can no longer take it: nothing moves; a later settled round
                // looks again.
                return out;
            }
            let m = fresh.remove(at);
            stale.push((m, DeleteCause::Rebalance));
        }
        out.target = target_ok.then(|| e.to.clone());
        out.entry = Some(e.clone());
        return out;
    }
    if !p.rebalance || !settled {
        return out;
    }
    // Members per host (every member is counted and available: the pool is settled).
    let mut counts: BTreeMap<&str, u32> = BTreeMap::new();
    for m in fresh.iter() {
        if let Some(h) = m.host.as_deref() {
            *counts.entry(h).or_default() += 1;
        }
    }
    let count = |h: &str| counts.get(h).copied().unwrap_or(0);
    // The most loaded host (first in the entry's order on a tie; a host no longer in the
    // entry after it).
    let Some((from, most)) = counts.iter().map(|(h, n)| (*h, *n)).min_by_key(|(h, n)| {
        let order = i
            .hosts
            .iter()
            .position(|x| x.name == *h)
            .unwrap_or(usize::MAX);
        (std::cmp::Reverse(*n), order)
    }) else {
        return out;
    };
    let settle = p.host_dead_after;
    let from_segment = i
        .hosts
        .iter()
        .find(|h| h.name == from)
        .and_then(|h| h.segment.as_deref());
    let mut best: Option<&PoolHost> = None;
    let mut elsewhere: Option<&PoolHost> = None;
    for h in i.hosts {
        let n = count(&h.name);
        if h.name == from || n.saturating_add(2) > most || !takes(i, h, n) {
            continue;
        }
        let Some(since) = h.ready_since else { continue };
        let due = since.checked_add(settle).unwrap_or(since);
        if due > i.now {
            wake(due);
            continue;
        }
        let better = |b: Option<&PoolHost>| b.is_none_or(|b| n < count(&b.name));
        if p.keep_addresses && (from_segment.is_none() || h.segment.as_deref() != from_segment) {
            if better(elsewhere) {
                elsewhere = Some(h);
            }
            continue;
        }
        if better(best) {
            best = Some(h);
        }
    }
    let Some(to) = best else {
        if let Some(e) = elsewhere {
            out.note = Some(format!(
                "not spread again: host {from} has {most} members and host {} {}, but \
                 rotation.egressAddress Keep moves a member's addresses only to a host of the \
                 same segment ({})",
                e.name,
                count(&e.name),
                from_segment.map_or_else(
                    || format!("{from} has no segment"),
                    |s| format!("{from} is in segment {s}")
                )
            ));
        }
        return out;
    };
    // The oldest member of the most loaded host (its age would replace it first).
    let Some(at) = fresh
        .iter()
        .enumerate()
        .filter(|(_, m)| m.host.as_deref() == Some(from))
        .min_by(|(_, a), (_, b)| a.created.cmp(&b.created).then_with(|| a.name.cmp(&b.name)))
        .map(|(k, _)| k)
    else {
        return out;
    };
    let m = fresh.remove(at);
    let ready = to
        .ready_since
        .map_or_else(String::new, |t| format!(", Ready since {}", fmt_time(t)));
    events.push(Event::new(
        EventKind::Normal,
        reason::REBALANCING,
        &format!(
            "replacing member {} on host {from} ({most} members) with one on host {} ({} \
             members{ready}) to spread the pool again, within the update budget",
            m.name,
            to.name,
            count(&to.name)
        ),
    ));
    stale.push((m, DeleteCause::Rebalance));
    out.entry = Some(Rebalancing {
        member: m.name.clone(),
        from: from.to_owned(),
        to: to.name.clone(),
        since: fmt_time(i.now),
    });
    out.target = Some(to.name.clone());
    out
}
