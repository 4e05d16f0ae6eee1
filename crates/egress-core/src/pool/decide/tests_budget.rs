//! The update budget over random histories: members boot, fail, turn unhealthy and recover,
//! the template changes, members age, replicas change, hosts go down; after every round
//! the decision's own removals never take available members below
//! `min(available before, replicas - maxUnavailable)` nor the pool's members (this round's
//! creates included) below `min(members, replicas - maxUnavailable)` (both budgets asserted
//! as counts, in every build profile), creates never take the pool above
//! `replicas + maxSurge`, and placement respects host health and `maxPerHost`. Then, left
//! alone, the pool converges to `replicas` current, available members.

#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use std::collections::BTreeMap;
use std::time::Duration;

use egress_provider::model::HostState;

use super::tests::{Case, at, member, policy};
use super::*;
use crate::model::Phase;

/// A simulated member: when it boots (becomes available) unless it breaks first.
struct Sim {
    boots_at: u64,
    breaks: bool,
}

fn run_history(seed: u64, replicas: u32, spec: &str, steps: usize) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut c = Case::new(
        policy(&format!("replicas: {replicas}\n{spec}")),
        vec![],
        &["h1", "h2", "h3", "h4"],
    );
    // Hosts Ready since the start: uneven pools are spread again (`placement.rebalance`).
    for h in &mut c.hosts {
        h.ready_since = Some(at(0));
    }
    let mut sims: BTreeMap<String, Sim> = BTreeMap::new();
    let mut t: u64 = 0;
    let mut chaos = true;
    for step in 0..steps {
        if step == steps / 2 {
            chaos = false;
            for h in &mut c.hosts {
                if h.state != Some(HostState::Ready) {
                    h.ready_since = Some(at(t));
                }
                h.state = Some(HostState::Ready);
            }
        }
        t += rng.u64(1..40);
        c.now = at(t);
        // The world moves.
        if chaos {
            if rng.u8(0..30) == 0 {
                c.hash = format!("h{}", rng.u8(0..3));
            }
            if rng.u8(0..40) == 0 {
                let n = rng.u32(0..8);
                c.policy = policy(&format!("replicas: {n}\n{spec}"));
            }
            if rng.u8(0..20) == 0 {
                let h = &mut c.hosts[rng.usize(0..4)];
                let state = [
                    Some(HostState::Ready),
                    Some(HostState::Unreachable),
                    Some(HostState::Degraded),
                ][rng.usize(0..3)];
                if state != Some(HostState::Ready) {
                    h.ready_since = None;
                } else if h.state != state {
                    h.ready_since = Some(at(t));
                }
                h.state = state;
            }
        }
        for m in &mut c.members {
            if m.draining.is_some() {
                // Unpublished: never available again.
                continue;
            }
            let s = &sims[&m.name];
            if m.phase == Phase::Provisioning && t >= s.boots_at {
                if s.breaks {
                    m.phase = Phase::Failed;
                } else {
                    m.phase = Phase::Running;
                    m.ready = true;
                    m.available = true;
                }
            } else if chaos && m.available && rng.u8(0..25) == 0 {
                m.ready = false;
                m.available = false;
                m.unhealthy_since = Some(at(t));
            } else if m.unhealthy_since.is_some() && rng.u8(0..4) == 0 {
                m.ready = true;
                m.available = true;
                m.unhealthy_since = None;
            }
        }
        // Decide.
        let d = c.run();
        c.status = d.status.clone();
        let p = &c.policy;
        // NB: a member unpublished for its drain grace left the budget then.
        let counted: Vec<&Member> = c
            .members
            .iter()
            .filter(|m| m.quarantine.is_none() && m.draining.is_none())
            .collect();
        let gone = |m: &Member| {
            d.deletes.iter().any(|x| x.name == m.name)
                || d.unpublishes.iter().any(|x| x.name == m.name)
        };
        let healing =
            |x: &DeleteMember| matches!(x.cause, DeleteCause::Failed | DeleteCause::Unhealthy);
        let healed = d.deletes.iter().filter(|x| healing(x)).count();
        // The budgets, counted from the round's inputs and asserted as such (not through an
        // arithmetic overflow, which release builds would not report): the pool's own
        // removals take neither its available members nor its members (this round's creates
        // included, the ones autohealing removed not) below `replicas - maxUnavailable`, or
        // below what there was when that was fewer already.
        let min_available = p.min_available() as usize;
        let drained = |x: &DeleteMember| {
            c.members
                .iter()
                .any(|m| m.name == x.name && m.draining.is_some())
        };
        let removals: Vec<&str> = d
            .deletes
            .iter()
            .filter(|x| !healing(x) && !drained(x))
            .map(|x| x.name.as_str())
            .chain(d.unpublishes.iter().map(|x| x.name.as_str()))
            .collect();
        // A drained member goes no sooner than its grace.
        for x in d.deletes.iter().filter(|x| drained(x)) {
            let m = c.members.iter().find(|m| m.name == x.name).unwrap();
            let since = m.draining.unwrap().since;
            assert!(
                c.now >= since + p.drain_grace,
                "seed {seed} step {step}: {} deleted before its grace",
                x.name
            );
        }
        let avail_before = counted.iter().filter(|m| m.available).count();
        let avail_removed = counted.iter().filter(|m| m.available && gone(m)).count();
        let available_budget = avail_before.saturating_sub(min_available);
        assert!(
            avail_removed <= available_budget,
            "seed {seed} step {step}: {avail_removed} available members removed, over the \
             available budget {available_budget} ({avail_before} available, replicas - \
             maxUnavailable = {min_available}); deletes {:?}",
            d.deletes
        );
        let members = counted.len() - healed + d.creates.len();
        let total_budget = members.saturating_sub(min_available);
        assert!(
            removals.len() <= total_budget,
            "seed {seed} step {step}: {} members removed, over the total budget {total_budget} \
             ({members} members with this round's creates, replicas - maxUnavailable = \
             {min_available}); deletes {:?}",
            removals.len(),
            d.deletes
        );
        let after = members;
        assert!(
            d.creates.is_empty() || after <= p.max_total() as usize,
            "seed {seed} step {step}: {after} members after creates, above {}",
            p.max_total()
        );
        let mut per_host: BTreeMap<&str, u32> = BTreeMap::new();
        for m in &c.members {
            *per_host.entry(m.host.as_deref().unwrap()).or_default() += 1;
        }
        for cr in &d.creates {
            let h = c.hosts.iter().find(|h| h.name == cr.host).unwrap();
            assert!(
                crate::host_health::accepts_placements(h.state),
                "seed {seed}: placed on {h:?}"
            );
            let n = per_host.entry(&cr.host).or_default();
            *n += 1;
            assert!(
                p.max_per_host.is_none_or(|m| *n <= m),
                "seed {seed}: {} over maxPerHost",
                cr.host
            );
            assert!(
                !c.members.iter().any(|m| m.name == cr.name),
                "seed {seed}: name reused"
            );
        }
        // Act: deletes take effect at once, unpublishes mark their member, creates start
        // provisioning.
        c.members
            .retain(|m| !d.deletes.iter().any(|x| x.name == m.name));
        for m in &mut c.members {
            if let Some(u) = d.unpublishes.iter().find(|u| u.name == m.name) {
                m.draining = Some(crate::pool::member::Drain::parse(&u.marker));
                m.available = false;
            }
        }
        for cr in &d.creates {
            let mut m = member(&cr.name, &cr.host, t);
            m.template_hash = cr.template_hash.clone();
            m.phase = Phase::Provisioning;
            m.ready = false;
            m.available = false;
            c.members.push(m);
            let breaks = chaos && rng.u8(0..10) == 0;
            sims.insert(
                cr.name.clone(),
                Sim {
                    boots_at: t + rng.u64(20..120),
                    breaks,
                },
            );
        }
    }
    // Left alone (no failures, hosts up, long enough for any backoff): converged, unless
    // rotation keeps replacing members.
    if c.policy.max_age.is_none() {
        let p = &c.policy;
        let ok = c
            .members
            .iter()
            .filter(|m| m.available && m.template_hash == c.hash)
            .count();
        assert_eq!(
            ok, p.replicas as usize,
            "seed {seed}: not converged: {:?}",
            c.status.conditions
        );
        let left = c.members.iter().filter(|m| m.draining.is_none()).count();
        assert_eq!(left, p.replicas as usize, "seed {seed}");
        // And spread: no host holds two members more than another (each takes them).
        if c.status.rebalancing.is_none() && p.rebalance {
            let mut per_host: BTreeMap<&str, usize> =
                c.hosts.iter().map(|h| (h.name.as_str(), 0)).collect();
            for m in c.members.iter().filter(|m| m.draining.is_none()) {
                *per_host.entry(m.host.as_deref().unwrap()).or_default() += 1;
            }
            let (lo, hi) = (per_host.values().min(), per_host.values().max());
            assert!(
                hi.unwrap() - lo.unwrap() <= 1,
                "seed {seed}: not spread: {per_host:?}"
            );
        }
    }
}

#[test]
fn surge_one_and_no_unavailability_never_drop_available_members_below_replicas() {
    for seed in 0..300 {
        run_history(
            seed,
            4,
            "update:\n  maxSurge: 1\n  maxUnavailable: 0\n",
            400,
        );
    }
}

#[test]
fn any_budget_keeps_its_bounds_over_random_histories_and_converges() {
    let budgets = [
        "update:\n  maxSurge: 0\n  maxUnavailable: 1\n",
        "update:\n  maxSurge: 2\n  maxUnavailable: 1\n",
        "update:\n  maxSurge: 25%\n  maxUnavailable: 25%\n",
        "update:\n  maxSurge: 100%\n  maxUnavailable: 0\n",
        "update:\n  maxSurge: 1\n  maxUnavailable: 0\nplacement:\n  maxPerHost: 2\n",
        "update:\n  maxSurge: 1\n  maxUnavailable: 0\nrotation:\n  maxAge: 10m\n",
        "scaleIn:\n  order: NewestFirst\n",
        "update:\n  maxSurge: 1\n  maxUnavailable: 0\n  drainGrace: 2m\n",
        "update:\n  maxSurge: 0\n  maxUnavailable: 1\n  drainGrace: 90s\n",
        "update:\n  maxSurge: 25%\n  maxUnavailable: 25%\n  drainGrace: 5m\n",
    ];
    for (k, b) in budgets.iter().enumerate() {
        for seed in 0..100 {
            run_history(1000 * (k as u64 + 1) + seed, 5, b, 400);
        }
    }
}

#[test]
fn one_round_costs_the_pools_members_only() {
    // The decision sees the pool's members, never the fleet: a pool of 1000 members is
    // decided from those 1000 alone, and nothing in the inputs grows with other Proxies.
    let members: Vec<Member> = (0..1000)
        .map(|n| {
            member(
                &format!("web-{n}"),
                ["h1", "h2", "h3", "h4"][n % 4],
                n as u64,
            )
        })
        .collect();
    let c = Case::new(
        policy("replicas: 1000\nupdate:\n  maxSurge: 10%\n"),
        members,
        &["h1", "h2", "h3", "h4"],
    );
    let d = c.run();
    assert!(d.creates.is_empty() && d.deletes.is_empty());
    assert_eq!(d.requeue_after, None::<Duration>);
}
