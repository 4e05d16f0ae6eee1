//! Members lost with their host: a member whose host has been dead (`Unreachable` or
//! `Timeout`, without a break) for `autohealing.hostDeadAfter` leaves the pool's accounting
//! (it is replaced elsewhere like a deleted member), yet is not deleted while its host is dead
//! (the delete could not reach the host, and its VM may still run there: two copies are
//! tolerated); once its host answers again (`Ready` or `Degraded`) it is deleted (cause
//! `host-lost`). The pool remembers its lost members in `status.lostMembers`.
//!
//! Guarantees: pure; O(members · log members + hosts · log hosts); a member is never lost
//! before its host's `deadSince + hostDeadAfter`, and the decision asks to be run again then.

use std::collections::BTreeMap;
use std::time::SystemTime;

use crate::controller::decide::fmt_time;
use crate::controller::{Event, EventKind};
use crate::host_health::is_dead;
use crate::pool::member::Member;
use crate::pool::status::{LostMember, reason};

use super::io::{PoolHost, PoolInputs};

/// How `active` members split.
#[derive(Debug, Default)]
pub(super) struct Split<'a> {
    /// Members still counted by the pool.
    pub(super) kept: Vec<&'a Member>,
    /// Lost members whose host answers again: to delete (the caller decides when).
    pub(super) returned: Vec<(&'a Member, LostMember)>,
    /// Lost members whose host has not answered yet (the new `status.lostMembers`, without
    /// the returned ones).
    pub(super) lost: Vec<LostMember>,
    /// Members lost in this round (also in `lost`).
    pub(super) newly: Vec<&'a Member>,
}

/// Splits `active` into members the pool still counts, lost ones and returned ones; a member
/// newly lost gets a `HostLost` event in `events`; `wake` is told when a host's budget ends.
pub(super) fn split<'a>(
    i: &PoolInputs<'_>,
    active: Vec<&'a Member>,
    events: &mut Vec<Event>,
    wake: &mut dyn FnMut(SystemTime),
) -> Split<'a> {
    let p = i.policy;
    let hosts: BTreeMap<&str, &PoolHost> = i.hosts.iter().map(|h| (h.name.as_str(), h)).collect();
    let remembered: BTreeMap<&str, &LostMember> = i
        .status
        .lost_members
        .iter()
        .map(|l| (l.member.as_str(), l))
        .collect();
    let mut out = Split::default();
    for m in active {
        let host = m.host.as_deref().and_then(|h| hosts.get(h).copied());
        if let Some(l) = remembered.get(m.name.as_str()) {
            let answers = host.is_some_and(|h| h.state.is_some() && !is_dead(h.state));
            if answers {
                out.returned.push((m, (*l).clone()));
            } else {
                out.lost.push((*l).clone());
            }
            continue;
        }
        let dead = host
            .filter(|h| is_dead(h.state))
            .and_then(|h| h.dead_since.map(|s| (h, s)));
        if let (true, Some((h, since))) = (p.autohealing, dead) {
            let due = since.checked_add(p.host_dead_after).unwrap_or(since);
            if i.now >= due {
                let state = h
                    .state
                    .map_or_else(|| "dead".to_owned(), |s| format!("{s:?}"));
                events.push(Event::new(
                    EventKind::Warning,
                    reason::HOST_LOST,
                    &format!(
                        "member {} lost: host {} dead ({state}) since {}, at least {}; \
                         replacing it on another host, deleting it once {} answers again",
                        m.name,
                        h.name,
                        fmt_time(since),
                        crate::pool::duration::format_duration(p.host_dead_after),
                        h.name
                    ),
                ));
                out.newly.push(m);
                out.lost.push(LostMember {
                    member: m.name.clone(),
                    host: h.name.clone(),
                    since: fmt_time(since),
                });
                continue;
            }
            wake(due);
        }
        out.kept.push(m);
    }
    out
}

/// `lost` members grouped by host, for a condition: `h1 (web-a, web-b), h2 (web-c)`.
pub(super) fn summary(lost: &[LostMember]) -> String {
    let mut by_host: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for l in lost {
        by_host
            .entry(l.host.as_str())
            .or_default()
            .push(l.member.as_str());
    }
    by_host
        .iter()
        .map(|(h, ms)| format!("{h} ({})", ms.join(", ")))
        .collect::<Vec<_>>()
        .join(", ")
}

/// How often a pool with lost members decides again while their hosts are dead.
// NB: a returning host is seen by the next host check (every 30 s by default) and changes
// no member by itself; looking every 10 s deletes the old copy within 10 s of that, at the
// cost of one O(members) round per pool with lost members.
pub(super) const LOST_RECHECK: std::time::Duration = std::time::Duration::from_secs(10);
