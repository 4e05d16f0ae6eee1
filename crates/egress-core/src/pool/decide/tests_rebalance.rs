//! Spread restored (`placement.rebalance`): a pool left on one host after a failover moves
//! one member at a time back to a host that has been Ready for `hostDeadAfter`, within the
//! update budget, only while settled; a difference of one, a host Ready too briefly, Degraded,
//! cordoned, draining or backing off, `maxPerHost` and `rebalance: false` move nothing; under
//! `rotation.egressAddress: Keep` a member moves only within its host's segment, with its
//! addresses.

#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use std::collections::BTreeMap;

use egress_provider::libvirt::config::Maintenance;
use egress_provider::model::HostState;

use super::tests::{Case, at, member, policy, provisioning};
use super::*;
use crate::pool::status::{HostFailures, condition};

/// `names` hosts, each Ready since T0 (1000 s before the cases' clock: long enough for the
/// default `hostDeadAfter` of 60 s).
fn case(spec: &str, members: Vec<Member>, names: &[&str]) -> Case {
    let mut c = Case::new(policy(spec), members, names);
    for h in &mut c.hosts {
        h.ready_since = Some(at(0));
    }
    c
}

/// Two members, both on h1 (web-a the older), hosts h1 and h2.
fn both_on_h1(spec: &str) -> Case {
    case(
        &format!("replicas: 2\n{spec}"),
        vec![member("web-a", "h1", 0), member("web-b", "h1", 100)],
        &["h1", "h2"],
    )
}

fn rebalance_events(d: &PoolDecision) -> Vec<&str> {
    d.events
        .iter()
        .filter(|e| e.reason == reason::REBALANCING)
        .map(|e| e.message.as_str())
        .collect()
}

fn nothing_moves(d: &PoolDecision) {
    assert!(d.creates.is_empty(), "created: {:?}", d.creates);
    assert!(d.deletes.is_empty(), "deleted: {:?}", d.deletes);
    assert!(d.unpublishes.is_empty(), "unpublished: {:?}", d.unpublishes);
    assert_eq!(d.status.rebalancing, None);
    assert!(rebalance_events(d).is_empty(), "{:?}", d.events);
}

/// Carries `d` out on `c`: creates join (provisioning), unpublished members drain, deleted
/// ones are gone; the status is kept.
fn apply(c: &mut Case, d: &PoolDecision) {
    for u in &d.unpublishes {
        let m = c.members.iter_mut().find(|m| m.name == u.name).unwrap();
        m.draining = Some(crate::pool::member::Drain {
            since: c.now,
            cause: u.cause,
        });
    }
    c.members
        .retain(|m| !d.deletes.iter().any(|x| x.name == m.name));
    for cr in &d.creates {
        let mut m = provisioning(member(&cr.name, &cr.host, 0));
        m.created = c.now;
        m.egress_address = cr.pin.iter().map(ToString::to_string).collect();
        c.members.push(m);
    }
    c.status = d.status.clone();
}

/// Every provisioning member turns available.
fn boot(c: &mut Case) {
    for m in &mut c.members {
        if !m.available && m.draining.is_none() {
            m.phase = crate::model::Phase::Running;
            m.ready = true;
            m.available = true;
        }
    }
}

fn per_host(c: &Case) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for m in &c.members {
        *out.entry(m.host.clone().unwrap()).or_default() += 1;
    }
    out
}

#[test]
fn two_members_on_one_host_move_one_to_the_other_once_it_has_been_ready_long_enough() {
    let mut c = both_on_h1("");
    // Round 1: the older member is outdated for spread; its replacement surges onto h2.
    let d = c.run();
    assert_eq!(d.creates.len(), 1);
    assert_eq!(d.creates[0].host, "h2");
    assert!(d.deletes.is_empty() && d.unpublishes.is_empty());
    let r = d.status.rebalancing.clone().unwrap();
    assert_eq!(
        (r.member.as_str(), r.from.as_str(), r.to.as_str()),
        ("web-a", "h1", "h2")
    );
    let ev = rebalance_events(&d);
    assert_eq!(ev.len(), 1, "{:?}", d.events);
    for part in ["web-a", "host h1 (2 members)", "host h2 (0 members"] {
        assert!(ev[0].contains(part), "{part} not in {}", ev[0]);
    }
    let p = cond_of(&d, condition::PROGRESSING);
    assert_eq!(p.reason, reason::REBALANCING);
    // Round 2: the replacement boots; web-a keeps serving (maxUnavailable 0).
    apply(&mut c, &d);
    c.now = at(1010);
    let d = c.run();
    assert!(d.creates.is_empty() && d.deletes.is_empty(), "{d:?}");
    assert!(rebalance_events(&d).is_empty());
    assert_eq!(
        cond_of(&d, condition::PROGRESSING).reason,
        reason::REBALANCING
    );
    assert_eq!(
        cond_of(&d, condition::AVAILABLE).status,
        crate::model::ConditionStatus::True
    );
    // Round 3: available: web-a goes (cause rebalance).
    apply(&mut c, &d);
    boot(&mut c);
    c.now = at(1020);
    let d = c.run();
    assert!(d.creates.is_empty());
    assert_eq!(d.deletes.len(), 1);
    assert_eq!(
        (d.deletes[0].name.as_str(), d.deletes[0].cause),
        ("web-a", DeleteCause::Rebalance)
    );
    // Round 4: gone: done, spread, nothing more.
    apply(&mut c, &d);
    c.now = at(1030);
    let d = c.run();
    assert_eq!(d.status.rebalancing, None);
    assert!(d.creates.is_empty() && d.deletes.is_empty());
    assert_eq!(
        per_host(&c),
        BTreeMap::from([("h1".into(), 1), ("h2".into(), 1)])
    );
    assert_eq!(cond_of(&d, condition::PROGRESSING).reason, reason::COMPLETE);
}

fn cond_of<'a>(d: &'a PoolDecision, t: &str) -> &'a crate::model::Condition {
    d.status.condition(t).unwrap()
}

#[test]
fn a_host_ready_for_less_than_host_dead_after_gets_nothing_and_the_round_wakes_then() {
    let mut c = both_on_h1("");
    c.hosts[1].ready_since = Some(at(990));
    let d = c.run();
    nothing_moves(&d);
    // Due at 990 + 60 s: 50 s from now.
    assert_eq!(d.requeue_after, Some(Duration::from_secs(50)));
    // Not Ready at all (no clock): nothing either.
    c.hosts[1].ready_since = None;
    nothing_moves(&c.run());
    // Ready long enough.
    c.hosts[1].ready_since = Some(at(990));
    c.now = at(1050);
    let d = c.run();
    assert_eq!(d.creates.len(), 1);
    assert_eq!(d.creates[0].host, "h2");
}

#[test]
fn a_degraded_cordoned_draining_backing_off_or_excluded_target_gets_nothing() {
    let mut c = both_on_h1("");
    c.hosts[1].state = Some(HostState::Degraded);
    nothing_moves(&c.run());
    c.hosts[1].state = Some(HostState::Unreachable);
    nothing_moves(&c.run());
    c.hosts[1].state = Some(HostState::Ready);
    c.hosts[1].maintenance = Maintenance::Cordon;
    nothing_moves(&c.run());
    c.hosts[1].maintenance = Maintenance::None;
    c.status.host_failures = vec![HostFailures {
        host: "h2".into(),
        count: 1,
        last_failure: crate::controller::decide::fmt_time(at(990)),
        message: "boom".into(),
    }];
    nothing_moves(&c.run());
    c.status.host_failures.clear();
    c.policy = policy("replicas: 2\nplacement:\n  hosts: [h1]\n");
    nothing_moves(&c.run());
}

#[test]
fn an_unsettled_pool_is_not_rebalanced() {
    // A member not available yet.
    let mut c = both_on_h1("");
    c.members[1] = provisioning(c.members[1].clone());
    nothing_moves(&c.run());
    // A member being deleted (a replacement in flight).
    let mut c = both_on_h1("");
    let mut gone = member("web-c", "h1", 50);
    gone.deleting = true;
    c.members.push(gone);
    nothing_moves(&c.run());
    // A member unpublished, draining.
    let mut c = both_on_h1("update:\n  drainGrace: 5m\n");
    let mut dr = member("web-c", "h1", 50);
    dr.draining = Some(crate::pool::member::Drain {
        since: at(990),
        cause: DeleteCause::Age,
    });
    c.members.push(dr);
    nothing_moves(&c.run());
    // A rollout: the template changed; its replacements go by placement, nothing is marked
    // for spread.
    let mut c = both_on_h1("");
    c.hash = "bbbbbbbbbb".into();
    let d = c.run();
    assert_eq!(d.status.rebalancing, None);
    assert!(rebalance_events(&d).is_empty());
    // Fewer members than replicas.
    let c = case(
        "replicas: 3\n",
        vec![member("web-a", "h1", 0), member("web-b", "h1", 100)],
        &["h1", "h2"],
    );
    let d = c.run();
    assert_eq!(d.status.rebalancing, None);
    assert!(rebalance_events(&d).is_empty());
    // A quarantined member.
    let mut c = both_on_h1("");
    let mut q = member("web-q", "h1", 50);
    q.quarantine = Some("inspect".into());
    c.members.push(q);
    c.status.quarantined = vec!["web-q".into()];
    nothing_moves(&c.run());
}

#[test]
fn a_difference_of_one_is_left_alone_and_of_two_moves() {
    let c = case(
        "replicas: 3\n",
        vec![
            member("web-a", "h1", 0),
            member("web-b", "h1", 100),
            member("web-c", "h2", 100),
        ],
        &["h1", "h2"],
    );
    nothing_moves(&c.run());
    // 2 / 2 / 0: h3 takes one (of h1, the first most loaded host).
    let c = case(
        "replicas: 4\n",
        vec![
            member("web-a", "h1", 0),
            member("web-b", "h1", 100),
            member("web-c", "h2", 50),
            member("web-d", "h2", 100),
        ],
        &["h1", "h2", "h3"],
    );
    let d = c.run();
    assert_eq!(d.creates.len(), 1);
    assert_eq!(d.creates[0].host, "h3");
    assert_eq!(d.status.rebalancing.unwrap().member, "web-a");
}

#[test]
fn rebalance_false_turns_it_off() {
    let c = both_on_h1("placement:\n  rebalance: false\n");
    nothing_moves(&c.run());
    // Turned off while one is in flight: the member is not outdated any more.
    let mut c = both_on_h1("");
    let d = c.run();
    apply(&mut c, &d);
    boot(&mut c);
    c.policy = policy("replicas: 2\nplacement:\n  rebalance: false\n");
    let d = c.run();
    assert_eq!(d.status.rebalancing, None);
    assert!(
        d.deletes.iter().all(|x| x.cause != DeleteCause::Rebalance),
        "{d:?}"
    );
}

#[test]
fn max_per_host_is_respected() {
    // maxPerHost lowered to 1 after 3 members landed on h1: h2 is full with 1.
    let c = case(
        "replicas: 4\nplacement:\n  maxPerHost: 1\n",
        vec![
            member("web-a", "h1", 0),
            member("web-b", "h1", 100),
            member("web-c", "h1", 100),
            member("web-d", "h2", 100),
        ],
        &["h1", "h2"],
    );
    nothing_moves(&c.run());
    // With room on h2 (maxPerHost 2), one moves.
    let mut c = c;
    c.policy = policy("replicas: 4\nplacement:\n  maxPerHost: 2\n");
    let d = c.run();
    assert_eq!(d.status.rebalancing.unwrap().to, "h2");
}

#[test]
fn without_surge_the_member_goes_first_and_its_replacement_lands_on_the_target() {
    // h3 (first in order, as empty as h2) became Ready just now: plain placement would pick
    // it; the rebalance's target is h2.
    let mut c = case(
        "replicas: 2\nupdate:\n  maxSurge: 0\n  maxUnavailable: 1\n",
        vec![member("web-a", "h1", 0), member("web-b", "h1", 100)],
        &["h1", "h3", "h2"],
    );
    c.hosts[1].ready_since = Some(at(999));
    let d = c.run();
    assert!(d.creates.is_empty(), "surged: {:?}", d.creates);
    assert_eq!(
        (d.deletes[0].name.as_str(), d.deletes[0].cause),
        ("web-a", DeleteCause::Rebalance)
    );
    assert_eq!(d.status.rebalancing.as_ref().unwrap().to, "h2");
    // Round 2: web-a still being deleted: its replacement goes to h2.
    apply(&mut c, &d);
    let mut a = member("web-a", "h1", 0);
    a.deleting = true;
    c.members.push(a);
    c.now = at(1001);
    let d = c.run();
    assert_eq!(d.creates.len(), 1);
    assert_eq!(d.creates[0].host, "h2");
    assert!(d.status.rebalancing.is_some());
    // Round 3: web-a gone: the entry ends.
    apply(&mut c, &d);
    c.members.retain(|m| m.name != "web-a");
    boot(&mut c);
    c.now = at(1002);
    let d = c.run();
    assert_eq!(d.status.rebalancing, None);
    nothing_moves(&d);
}

#[test]
fn members_move_one_at_a_time_until_spread() {
    let mut c = case(
        "replicas: 4\n",
        (0..4)
            .map(|k| member(&format!("web-{k}"), "h1", k * 10))
            .collect(),
        &["h1", "h2", "h3"],
    );
    let mut moves = 0;
    for round in 0..40 {
        c.now = at(1000 + round * 10);
        let settled = c.members.len() == 4 && c.members.iter().all(|m| m.available);
        let d = c.run();
        let started = rebalance_events(&d).len();
        assert!(started <= 1, "{:?}", d.events);
        if started == 1 {
            assert!(
                settled,
                "started while unsettled (round {round}): {:?}",
                c.members
            );
            moves += 1;
        }
        // Never more than one member marked, never below replicas available.
        let marked = d
            .deletes
            .iter()
            .filter(|x| x.cause == DeleteCause::Rebalance)
            .count();
        assert!(marked <= 1);
        apply(&mut c, &d);
        assert!(
            c.members.iter().filter(|m| m.available).count() >= 4,
            "below the budget: {:?}",
            c.members
        );
        boot(&mut c);
    }
    assert_eq!(moves, 2);
    assert_eq!(
        per_host(&c),
        BTreeMap::from([("h1".into(), 2), ("h2".into(), 1), ("h3".into(), 1)])
    );
}

const KEEP: &str = "replicas: 2\nrotation:\n  egressAddress: Keep\nupdate:\n  maxUnavailable: 1\n";

fn keep_case(segments: [Option<&str>; 2]) -> Case {
    let mut a = member("web-a", "h1", 0);
    a.egress_address = vec!["192.0.2.1".into()];
    let mut b = member("web-b", "h1", 100);
    b.egress_address = vec!["192.0.2.2".into()];
    let mut c = case(KEEP, vec![a, b], &["h1", "h2"]);
    for (h, s) in c.hosts.iter_mut().zip(segments) {
        h.segment = s.map(Into::into);
    }
    c
}

#[test]
fn keep_moves_a_member_with_its_addresses_within_its_segment() {
    let mut c = keep_case([Some("s1"), Some("s1")]);
    // Round 1: no surge; web-a goes first, its addresses wait for h2.
    let d = c.run();
    assert!(d.creates.is_empty(), "surged: {:?}", d.creates);
    assert_eq!(
        (d.deletes[0].name.as_str(), d.deletes[0].cause),
        ("web-a", DeleteCause::Rebalance)
    );
    assert_eq!(d.status.pending_addresses.len(), 1);
    assert_eq!(d.status.pending_addresses[0].host, "h2");
    assert_eq!(d.status.pending_addresses[0].addresses, ["192.0.2.1"]);
    assert_eq!(rebalance_events(&d).len(), 1);
    // Round 2: still being deleted: nothing created.
    apply(&mut c, &d);
    let mut a = member("web-a", "h1", 0);
    a.deleting = true;
    c.members.push(a);
    c.now = at(1001);
    let d = c.run();
    assert!(d.creates.is_empty(), "{:?}", d.creates);
    // Round 3: gone: the replacement on h2, pinned to its address.
    apply(&mut c, &d);
    c.members.retain(|m| m.name != "web-a");
    c.now = at(1002);
    let d = c.run();
    assert_eq!(d.creates.len(), 1);
    assert_eq!(d.creates[0].host, "h2");
    assert_eq!(
        d.creates[0].pin,
        vec!["192.0.2.1".parse::<std::net::IpAddr>().unwrap()]
    );
    assert_eq!(d.creates[0].replaces, None);
    assert_eq!(d.status.rebalancing, None);
}

#[test]
fn keep_across_segments_or_without_one_does_not_move_and_says_why() {
    for segs in [[Some("s1"), Some("s2")], [None, None], [Some("s1"), None]] {
        let c = keep_case(segs);
        let d = c.run();
        nothing_moves(&d);
        let p = cond_of(&d, condition::PROGRESSING);
        assert_eq!(p.reason, reason::COMPLETE);
        assert!(
            p.message.contains("not spread again") && p.message.contains("segment"),
            "{segs:?}: {}",
            p.message
        );
    }
}

#[test]
fn with_a_drain_grace_the_moved_member_is_unpublished_first_and_its_marker_keeps_the_cause() {
    let mut c = both_on_h1("update:\n  drainGrace: 2m\n");
    let d = c.run();
    apply(&mut c, &d);
    boot(&mut c);
    c.now = at(1010);
    let d = c.run();
    assert!(d.deletes.is_empty(), "{:?}", d.deletes);
    assert_eq!(d.unpublishes.len(), 1);
    assert_eq!(
        (d.unpublishes[0].name.as_str(), d.unpublishes[0].cause),
        ("web-a", DeleteCause::Rebalance)
    );
    let dr = crate::pool::member::Drain::parse(&d.unpublishes[0].marker);
    assert_eq!(dr.cause, DeleteCause::Rebalance);
    // Draining: the move is still in flight, nothing else starts; deleted after the grace.
    apply(&mut c, &d);
    c.now = at(1010 + 121);
    let d = c.run();
    assert_eq!(
        d.deletes
            .iter()
            .map(|x| (x.name.as_str(), x.cause))
            .collect::<Vec<_>>(),
        [("web-a", DeleteCause::Rebalance)]
    );
    assert!(rebalance_events(&d).is_empty());
}
