//! The pool decision: (pool + its members + host states + now) → members to create (with
//! derived names, hosts and the template hash), members to unpublish and to delete (with
//! their cause), and the pool's status.
//!
//! One round, in order:
//! 1. **Quarantine**: a member with the quarantine annotation leaves the pool's accounting at
//!    once (not counted, not available, never deleted by the pool) and is replaced; when the
//!    annotation is removed it is deleted (cause `quarantine`).
//!    **Lost members** ([`lost`]): a member whose host has been dead (`Unreachable` or
//!    `Timeout`, without a break) for `hostDeadAfter` leaves the accounting too and is
//!    replaced on another host; it is never deleted while its host is dead, and is deleted
//!    (cause `host-lost`) once its host answers again, unless it still serves and the pool is
//!    below `replicas - maxUnavailable` available members without it. A lost member counts
//!    against the entry's quota like a quarantined one, never against `replicas + maxSurge`.
//! 2. **Drains**: a member the pool unpublished to remove it (its drain marker, see step 6)
//!    is out of the pool's accounting (not counted, not available, its replacement made as
//!    for a deleted one) and is deleted, with the cause it was removed for, once
//!    `drainGrace` has passed since it was unpublished and its host is not dead (the lost
//!    rule's reason: a delete could not reach it); the round asks to be woken then.
//!    A drain is never taken back (a scale-up during it makes new members).
//! 3. **Autohealing**: a member in phase Failed, or unhealthy (running or paused, not
//!    available) for `unhealthyAfter`, is deleted (cause `failed` / `unhealthy`) and its
//!    host's failure count grows; creates on that host back off until a member there is
//!    available again. A member on a dead host is left to the lost rule (a delete could not
//!    reach its host).
//! 4. **Listings** (with `reputation.onListed: Replace`): a member whose declared egress
//!    address is listed in a DNS blocklist is outdated (cause `listed`), and its listed
//!    addresses are retired (`status.retiredAddresses`) until `retire_for` has passed;
//!    retirements past their time end.
//! 5. **Creates**: up to `replicas` current members (current template, younger than
//!    `maxAge`), never more than `replicas + maxSurge` members in all, placed by
//!    `place` (spread, `maxPerHost`, host health, backoff).
//!    A member on a draining host (`maintenance: Drain`) is outdated too (cause `drain`, ahead
//!    of every other cause) and no new member goes to a cordoned or draining host.
//!    **Spread** ([`rebalance`], `placement.rebalance`): in a settled pool, when a host holds
//!    two members more than a host that has been Ready for `hostDeadAfter`, the oldest member
//!    of the most loaded host is outdated too (cause `rebalance`, one at a time, remembered in
//!    `status.rebalancing`) and the first create goes to that host.
//! 6. **Removals** of outdated (cause `template`, `drain`), aged (`age`) and surplus (`scale-in`)
//!    members, unavailable ones first: an available member is removed only while more than
//!    `replicas - maxUnavailable` are available, and removals never take the pool's members
//!    (creates of this round included) below that number either. With a drain grace
//!    (`PoolPolicy::drain_grace` above zero) a removed member is **unpublished** (its drain
//!    marker recorded, since now; since it turned unhealthy for one that is not available)
//!    rather than deleted, and step 2 deletes it later; without one, or when that time has
//!    passed already, it is deleted at once. Either way it leaves the budget at once.
//!
//! Guarantees: pure (the clock is an input); O(members · log members + hosts · creates) per
//! round, from the pool's own members only; the pool's own removals (unpublished or deleted)
//! never take the available members below `min(available before, replicas - maxUnavailable)`
//! (broken members removed by autohealing are never available); a member unpublished for a
//! planned removal is deleted no sooner than `drainGrace` after it was unpublished, as
//! recorded on it (so an operator restart changes nothing); broken members and released
//! quarantined ones are deleted at once.

mod acts;
mod conditions;
mod io;
mod keep;
mod lost;
mod place;
mod rebalance;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_budget;
#[cfg(test)]
mod tests_drain;
#[cfg(test)]
mod tests_keep;
#[cfg(test)]
mod tests_keep_lost;
#[cfg(test)]
mod tests_lead;
#[cfg(test)]
mod tests_listed;
#[cfg(test)]
mod tests_lost;
#[cfg(test)]
mod tests_rebalance;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use crate::controller::decide::fmt_time;
use crate::controller::{Event, EventKind};
use crate::model::{MAX_MESSAGE_CHARS, truncate};
use crate::pool::member::{Drain, Member, member_name};
use crate::pool::spec::{OnListed, ScaleInOrder};
use crate::pool::status::{MAX_RETIRED, RetiredAddress, reason};
use egress_provider::libvirt::config::Maintenance;

use self::acts::{delete, record_failure, removal_order, tier, unpublish};
pub use self::io::{
    CreateMember, DeleteCause, DeleteMember, PoolDecision, PoolHost, PoolInputs, UnpublishMember,
};

/// What one round saw, for the status and its conditions.
#[derive(Debug, Default)]
struct Round {
    /// Members broken this round: `member on host: why`.
    broken: Vec<String>,
    /// Members needing a create that could not be placed.
    unplaced: usize,
    /// Placement's refusals (`host reason`).
    refused: Vec<String>,
    /// Every usable host was backing off.
    backing_off: bool,
    /// Outdated / aged / listed / surplus members left after this round's removals.
    outdated: usize,
    aged: usize,
    listed: usize,
    surplus: usize,
    /// Members left on draining hosts after this round's removals.
    draining: usize,
    /// Members left to move for spread (`placement.rebalance`) after this round's removals.
    rebalancing: usize,
    /// Why an uneven pool is not spread again.
    unspread: Option<String>,
    /// Members unpublished and waiting for their drain grace to end after this round.
    unpublished: usize,
    /// Members counted (not quarantined) and their available / updated subsets, before acting.
    counted: u32,
    available: u32,
    updated: u32,
    ready: u32,
    /// Quarantined members this round (old and new).
    quarantined: usize,
    /// Members lost with their host (`status.lostMembers` after this round).
    lost: Vec<crate::pool::status::LostMember>,
    released: usize,
}

/// Decides one round for a pool (see the module doc for the steps).
pub fn decide(i: &PoolInputs<'_>) -> PoolDecision {
    let p = i.policy;
    let now = i.now;
    let mut d = PoolDecision {
        generate_credentials: p.generate_credentials && !i.credentials_present,
        status: i.status.clone(),
        ..PoolDecision::default()
    };
    let mut r = Round::default();
    let mut wake: Option<SystemTime> = None;
    let mut wake_at = |t: SystemTime| wake = Some(wake.map_or(t, |w: SystemTime| w.min(t)));

    // Members on each host, for maxPerHost: every member still there.
    let mut counts: BTreeMap<String, u32> = BTreeMap::new();
    for m in i.members {
        if let Some(h) = &m.host {
            *counts.entry(h.clone()).or_default() += 1;
        }
    }
    let live: Vec<&Member> = i.members.iter().filter(|m| !m.deleting).collect();
    r.ready = u32::try_from(live.iter().filter(|m| m.ready).count()).unwrap_or(u32::MAX);

    // 1. Quarantine.
    let held: BTreeSet<&str> = i.status.quarantined.iter().map(String::as_str).collect();
    let mut quarantined = Vec::new();
    let mut active: Vec<&Member> = Vec::with_capacity(live.len());
    for m in live {
        if let Some(why) = &m.quarantine {
            quarantined.push(m.name.clone());
            if !held.contains(m.name.as_str()) {
                d.newly_quarantined.push(m.name.clone());
                d.events.push(Event::new(
                    EventKind::Warning,
                    reason::MEMBER_QUARANTINED,
                    &format!(
                        "member {} quarantined ({why}); replacing it, keeping it for inspection",
                        m.name
                    ),
                ));
            }
        } else if held.contains(m.name.as_str()) {
            r.released += 1;
            delete(&mut d, m, DeleteCause::Quarantine);
        } else {
            active.push(m);
        }
    }
    r.quarantined = quarantined.len();
    d.status.quarantined = quarantined;

    // Dead hosts: nothing is deleted there (a delete could not reach the host); the lost rule
    // replaces their members.
    let dead_hosts: BTreeSet<&str> = i
        .hosts
        .iter()
        .filter(|h| crate::host_health::is_dead(h.state))
        .map(|h| h.name.as_str())
        .collect();
    let dead_host = |m: &Member| m.host.as_deref().is_some_and(|h| dead_hosts.contains(h));

    // 2. Drains: deleted once their grace has passed (and their host answers); out of the
    // accounting until then.
    let mut undrained: Vec<&Member> = Vec::with_capacity(active.len());
    for m in active {
        let Some(dr) = m.draining else {
            undrained.push(m);
            continue;
        };
        let due = dr.since.checked_add(p.drain_grace).unwrap_or(dr.since);
        if now >= due && !dead_host(m) {
            delete(&mut d, m, dr.cause);
        } else {
            // NB: past its grace on a dead host: looked at again as the lost rule does.
            wake_at(if now >= due {
                now.checked_add(lost::LOST_RECHECK).unwrap_or(now)
            } else {
                due
            });
            r.unpublished += 1;
        }
    }
    let active = undrained;

    // Failures behind a host's backoff end once a host leaves the entry, or a member made after them is available there.
    d.status.host_failures.retain(|f| {
        if !i.hosts.iter().any(|h| h.name == f.host) {
            return false;
        }
        let last = humantime::parse_rfc3339_weak(&f.last_failure).ok();
        !active.iter().any(|m| {
            m.available
                && m.host.as_deref() == Some(f.host.as_str())
                && last.is_none_or(|t| m.created > t)
        })
    });

    // 1b. Members lost with their host: out of the accounting, kept while the host is dead.
    let split = lost::split(i, active, &mut d.events, &mut wake_at);
    let active = split.kept;
    r.lost = split.lost;
    // Keep: a member lost with its host leaves its addresses for a replacement on a peer of
    // its segment (taken in step 5, this round).
    if p.keep_addresses {
        keep::remember_lost(&mut d.status.pending_addresses, &split.newly, i);
    }

    // 3. Autohealing.
    let mut remaining: Vec<&Member> = Vec::with_capacity(active.len());
    for m in active {
        let cause = if !p.autohealing || dead_host(m) {
            None
        } else if m.phase == crate::model::Phase::Failed {
            Some(DeleteCause::Failed)
        } else if let Some(since) = m.unhealthy_since {
            let due = since.checked_add(p.unhealthy_after).unwrap_or(since);
            if now >= due {
                Some(DeleteCause::Unhealthy)
            } else {
                wake_at(due);
                None
            }
        } else {
            None
        };
        match cause {
            Some(c) => {
                let why = m.failure.clone().unwrap_or_else(|| match c {
                    DeleteCause::Failed => "failed".into(),
                    _ => format!(
                        "unhealthy for {}",
                        crate::pool::duration::format_duration(p.unhealthy_after)
                    ),
                });
                let host = m.host.clone().unwrap_or_default();
                r.broken
                    .push(format!("member {} on host {host}: {why}", m.name));
                if !host.is_empty() {
                    record_failure(&mut d.status.host_failures, &host, &why, now);
                }
                delete(&mut d, m, c);
            }
            None => remaining.push(m),
        }
    }

    r.counted = u32::try_from(remaining.len()).unwrap_or(u32::MAX);
    r.available =
        u32::try_from(remaining.iter().filter(|m| m.available).count()).unwrap_or(u32::MAX);
    r.updated = u32::try_from(
        remaining
            .iter()
            .filter(|m| m.template_hash == i.template_hash)
            .count(),
    )
    .unwrap_or(u32::MAX);

    // Lost members whose host answers again go, unless one still serves and the pool is below
    // its minimum without it (its replacement is not available yet).
    let min_available = usize::try_from(p.min_available()).unwrap_or(usize::MAX);
    for (m, l) in split.returned {
        // Keep, with peers on its host's segment: its replacement waits for its addresses, so
        // it goes at once (it never becomes available while this one holds them).
        let moved = p.keep_addresses && keep::has_peers(i.hosts, m);
        if !moved && m.available && (r.available as usize) < min_available {
            r.lost.push(l);
        } else {
            delete(&mut d, m, DeleteCause::HostLost);
        }
    }
    if !r.lost.is_empty() {
        wake_at(now.checked_add(lost::LOST_RECHECK).unwrap_or(now));
    }
    d.status.lost_members = r.lost.clone();

    // Retirements: those past their time end; a member replaced for a listing retires its
    // listed declared addresses now (they are still its own until it is gone, and none is
    // handed to another Proxy until the retirement ends).
    d.status.retired_addresses.retain(|r| {
        let until = humantime::parse_rfc3339_weak(&r.until).ok();
        until.is_some_and(|u| u > now)
    });
    if p.on_listed == OnListed::Replace {
        for m in &remaining {
            let Some(host) = &m.host else { continue };
            for a in m.listed_declared() {
                if d.status
                    .retired_addresses
                    .iter()
                    .any(|r| r.address == a && &r.host == host)
                {
                    continue;
                }
                let until = now.checked_add(p.retire_for).unwrap_or(now);
                d.events.push(Event::new(
                    EventKind::Warning,
                    reason::ADDRESS_RETIRED,
                    &format!(
                        "retired egress address {a} of host {host} until {} (member {} is \
                         listed: {}); replacing the member",
                        fmt_time(until),
                        m.name,
                        m.listed_note
                    ),
                ));
                d.status.retired_addresses.push(RetiredAddress {
                    host: host.clone(),
                    address: a,
                    member: m.name.clone(),
                    reason: truncate(&format!("listed: {}", m.listed_note), MAX_MESSAGE_CHARS),
                    since: fmt_time(now),
                    until: fmt_time(until),
                });
            }
        }
        // NB: bounded by the newest entries (an address whose entry is dropped here was
        // retired long ago and is retired in the hosts' address books until its time).
        let len = d.status.retired_addresses.len();
        if len > MAX_RETIRED {
            d.status.retired_addresses.drain(..len - MAX_RETIRED);
        }
    }
    for r in &d.status.retired_addresses {
        if let Ok(u) = humantime::parse_rfc3339_weak(&r.until) {
            wake_at(u);
        }
    }

    // 5. Creates.
    // Members on a draining host are replaced like outdated ones: surge first, within the
    // pool's budget.
    let draining: BTreeSet<&str> = i
        .hosts
        .iter()
        .filter(|h| h.maintenance == Maintenance::Drain)
        .map(|h| h.name.as_str())
        .collect();
    let stale_cause = |m: &Member| {
        if m.host.as_deref().is_some_and(|h| draining.contains(h)) {
            Some(DeleteCause::Drain)
        } else if p.on_listed == OnListed::Replace && !m.listed_declared().is_empty() {
            Some(DeleteCause::Listed)
        } else if m.template_hash != i.template_hash {
            Some(DeleteCause::Template)
        } else {
            p.max_age
                .and_then(|a| m.created.checked_add(a))
                .filter(|end| now >= *end)
                .map(|_| DeleteCause::Age)
        }
    };
    let (mut stale, mut fresh): (Vec<(&Member, DeleteCause)>, Vec<&Member>) =
        (Vec::new(), Vec::new());
    for m in &remaining {
        match stale_cause(m) {
            Some(c) => stale.push((m, c)),
            None => {
                if let Some(end) = p.max_age.and_then(|a| m.created.checked_add(a)) {
                    wake_at(end);
                }
                fresh.push(m);
            }
        }
    }
    let replicas = usize::try_from(p.replicas).unwrap_or(usize::MAX);
    // Spread restored (`placement.rebalance`): in a settled pool, one member of the most
    // loaded host is outdated (cause `rebalance`), its replacement made on the target host.
    let settled = i.members.len() == replicas
        && remaining.len() == replicas
        && remaining
            .iter()
            .all(|m| m.available && m.unhealthy_since.is_none())
        && stale.is_empty()
        && d.deletes.is_empty()
        && r.quarantined == 0
        && r.lost.is_empty()
        && r.unpublished == 0
        && d.status.pending_addresses.is_empty();
    let spread = rebalance::plan(
        i,
        settled,
        &mut fresh,
        &mut stale,
        &mut d.events,
        &mut wake_at,
    );
    r.unspread = spread.note;
    let max_total = usize::try_from(p.max_total()).unwrap_or(usize::MAX);
    // Keep: a replaced member's addresses wait in the status until it is gone, then its
    // replacement takes them on its host (elsewhere, fresh, when that host is unusable).
    let (pinned, held) = if p.keep_addresses {
        keep::take(&mut d.status.pending_addresses, i, &mut counts)
    } else {
        d.status.pending_addresses.clear();
        (Vec::new(), 0)
    };
    // Keep: no surge for a stale member; it leaves first and its replacement takes its slot.
    let occupied = if p.keep_addresses {
        fresh.len() + stale.len() + held + pinned.len()
    } else {
        fresh.len()
    };
    // Quarantined, lost and unpublished (draining) members count against the entry's quota
    // (`max_members`): replacing them never grows the pool past it. None counts in
    // `replicas + maxSurge`: they are out of the pool's accounting, like members being deleted.
    let max_members = usize::try_from(p.max_members).unwrap_or(usize::MAX);
    let wanted = replicas
        .saturating_sub(occupied)
        .min(max_total.saturating_sub(remaining.len() + held + pinned.len()))
        .min(max_members.saturating_sub(
            remaining.len() + r.quarantined + r.lost.len() + r.unpublished + held + pinned.len(),
        ));
    // A rebalance's replacement goes to its target (elsewhere when the target cannot take it).
    let targeted = match spread.target.as_deref() {
        Some(t) if wanted > 0 => {
            let target: Vec<PoolHost> = i.hosts.iter().filter(|h| h.name == t).cloned().collect();
            place::place(1, p, &target, &d.status.host_failures, &mut counts, now).hosts
        }
        _ => Vec::new(),
    };
    let mut placed = place::place(
        wanted - targeted.len(),
        p,
        i.hosts,
        &d.status.host_failures,
        &mut counts,
        now,
    );
    placed.hosts.splice(0..0, targeted);
    r.unplaced = wanted - placed.hosts.len().min(wanted);
    r.refused = placed.refused;
    r.backing_off = placed.backing_off;
    if let Some(t) = placed.backoff_ends {
        wake_at(t);
    }
    let taken: BTreeSet<&str> = i.members.iter().map(|m| m.name.as_str()).collect();
    let mut attempt = 0u32;
    let planned = pinned
        .into_iter()
        .chain(placed.hosts.into_iter().map(|h| (h, Vec::new(), None)));
    for (host, pin, replaces) in planned {
        let name = loop {
            let n = member_name(i.name, i.template_hash, now, attempt);
            attempt = attempt.saturating_add(1);
            if !taken.contains(n.as_str()) && !d.creates.iter().any(|c| c.name == n) {
                break n;
            }
        };
        d.events.push(Event::new(
            EventKind::Normal,
            reason::MEMBER_CREATED,
            &keep::created_message(&name, &host, replaces.as_deref()),
        ));
        d.creates.push(CreateMember {
            name,
            host,
            template_hash: i.template_hash.to_owned(),
            pin,
            replaces,
        });
    }

    // 6. Removals: outdated and aged members, then the surplus, unavailable ones first.
    let surplus = fresh.len().saturating_sub(replicas);
    fresh.sort_by(|a, b| removal_order(a, b, p.scale_in));
    let mut candidates: Vec<(&Member, DeleteCause)> = std::mem::take(&mut stale);
    candidates.extend(
        fresh
            .iter()
            .take(surplus)
            .map(|m| (*m, DeleteCause::ScaleIn)),
    );
    candidates.sort_by(|(a, ca), (b, cb)| {
        tier(a)
            .cmp(&tier(b))
            .then_with(|| (*ca == DeleteCause::ScaleIn).cmp(&(*cb == DeleteCause::ScaleIn)))
            .then_with(|| removal_order(a, b, ScaleInOrder::OldestFirst))
    });
    let mut total_budget = (remaining.len() + d.creates.len()).saturating_sub(min_available);
    let mut available_budget = (r.available as usize).saturating_sub(min_available);
    for (m, cause) in candidates {
        let allowed = total_budget > 0 && (!m.available || available_budget > 0);
        if !allowed {
            match cause {
                DeleteCause::Template => r.outdated += 1,
                DeleteCause::Age => r.aged += 1,
                DeleteCause::Listed => r.listed += 1,
                DeleteCause::Drain => r.draining += 1,
                DeleteCause::Rebalance => r.rebalancing += 1,
                _ => r.surplus += 1,
            }
            continue;
        }
        // NB: saturating, though `allowed` keeps both positive: were that check ever wrong, the
        // removal beyond the budget shows in the property tests' budget assertions in every
        // build, not as an overflow panic in debug builds only.
        total_budget = total_budget.saturating_sub(1);
        if m.available {
            available_budget = available_budget.saturating_sub(1);
        }
        // A planned removal drains: unpublished now (since it turned unhealthy, for one
        // that is not available: its connections' grace began then), deleted after the grace.
        let since = if m.available {
            Some(now)
        } else {
            m.unhealthy_since
        };
        let due = since.and_then(|t| t.checked_add(p.drain_grace));
        match (since, due) {
            (Some(since), Some(due)) if cause.is_planned() && due > now => {
                wake_at(due);
                r.unpublished += 1;
                unpublish(&mut d, m, Drain { since, cause }, due);
            }
            _ => delete(&mut d, m, cause),
        }
        if p.keep_addresses {
            // A member moved for spread leaves its addresses for the target host (of its
            // segment: see `rebalance`).
            let to = spread.entry.as_ref().map(|e| e.to.as_str());
            keep::remember(&mut d.status.pending_addresses, m, cause, to, replicas);
        }
    }

    d.status.rebalancing = spread.entry;
    d.status.observed_generation = i.generation;
    d.status.template_hash = i.template_hash.to_owned();
    d.status.replicas = r.counted;
    d.status.ready_replicas = r.ready;
    d.status.available_replicas = r.available;
    d.status.updated_replicas = r.updated;
    conditions::set(&mut d, i, &r);
    d.requeue_after = wake.map(|t| t.duration_since(now).unwrap_or(Duration::ZERO));
    d
}
