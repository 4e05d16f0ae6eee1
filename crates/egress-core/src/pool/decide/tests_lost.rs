//! Members lost with their host: replaced elsewhere only once the host has been dead for
//! `autohealing.hostDeadAfter`, outside `replicas + maxSurge` but within the entry's quota,
//! never deleted while the host is dead, deleted (`host-lost`) once it answers again.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::time::Duration;

use egress_provider::model::HostState;

use super::tests::{Case, at, member, policy, provisioning, unhealthy};
use super::*;
use crate::pool::status::{LostMember, condition, reason};

/// A pool of 2 on h1 and h2, h1 dead (`Timeout`) since `since`, the clock at `now`.
fn dead_h1(since: u64, now: u64) -> Case {
    let mut c = Case::new(
        policy("replicas: 2\n"),
        vec![member("web-a", "h1", 0), member("web-b", "h2", 0)],
        &["h1", "h2"],
    );
    c.hosts[0].state = Some(HostState::Timeout);
    c.hosts[0].dead_since = Some(at(since));
    c.now = at(now);
    c
}

fn deleted(d: &PoolDecision) -> Vec<(&str, DeleteCause)> {
    d.deletes
        .iter()
        .map(|x| (x.name.as_str(), x.cause))
        .collect()
}

fn lost_a() -> LostMember {
    LostMember {
        member: "web-a".into(),
        host: "h1".into(),
        since: crate::controller::decide::fmt_time(at(950)),
    }
}

#[test]
fn a_member_on_a_dead_host_is_not_replaced_before_the_budget_and_the_round_wakes_at_its_end() {
    // Dead for 59 s of the default 60 s.
    let d = dead_h1(950, 1009).run();
    assert!(d.creates.is_empty(), "{:?}", d.creates);
    assert!(d.deletes.is_empty(), "{:?}", d.deletes);
    assert!(d.status.lost_members.is_empty());
    assert_eq!(d.requeue_after, Some(Duration::from_secs(1)));
    // A longer budget holds it longer.
    let mut c = dead_h1(950, 1100);
    c.policy = policy("replicas: 2\nautohealing:\n  hostDeadAfter: 5m\n");
    let d = c.run();
    assert!(d.creates.is_empty());
    assert_eq!(d.requeue_after, Some(Duration::from_secs(150)));
}

#[test]
fn a_member_on_a_host_dead_for_the_budget_is_replaced_elsewhere_and_not_deleted() {
    let d = dead_h1(950, 1010).run();
    assert_eq!(d.creates.len(), 1);
    assert_eq!(d.creates[0].host, "h2");
    assert!(d.deletes.is_empty(), "{:?}", d.deletes);
    assert_eq!(d.status.lost_members, [lost_a()]);
    // Out of the accounting: 1 counted member.
    assert_eq!(d.status.replicas, 1);
    let rf = d.status.condition(condition::REPLICA_FAILURE).unwrap();
    assert_eq!(rf.reason, reason::HOST_LOST);
    assert!(rf.message.contains("1 member(s) lost"), "{}", rf.message);
    assert!(rf.message.contains("h1 (web-a)"), "{}", rf.message);
    let ev = d
        .events
        .iter()
        .find(|e| e.reason == reason::HOST_LOST)
        .expect("a HostLost event");
    assert!(
        ev.message.contains("web-a") && ev.message.contains("h1"),
        "{}",
        ev.message
    );
    // Looked at again while the host is dead.
    assert_eq!(d.requeue_after, Some(lost::LOST_RECHECK));
}

#[test]
fn a_lost_member_is_never_deleted_while_its_host_is_dead_whatever_else_happens() {
    // The next rounds: the replacement exists; web-a is unhealthy for far longer than
    // unhealthyAfter, outdated by a template change, and the pool scales in.
    for (replicas, hash) in [(2, HASH_SAME), (2, "bbbbbbbbbb"), (1, HASH_SAME)] {
        let mut c = dead_h1(950, 5000);
        c.policy = policy(&format!("replicas: {replicas}\n"));
        c.members[0] = unhealthy(member("web-a", "h1", 0), 960);
        c.members.push(member("web-c", "h2", 1010));
        c.status.lost_members = vec![lost_a()];
        if hash != HASH_SAME {
            c.hash = hash.into();
        }
        let d = c.run();
        assert!(
            !d.deletes.iter().any(|x| x.name == "web-a"),
            "replicas {replicas}, hash {hash}: {:?}",
            d.deletes
        );
        assert_eq!(d.status.lost_members, [lost_a()]);
    }
    // Nor by autohealing before the budget (a member on a dead host is the lost rule's).
    let mut c = dead_h1(950, 1005);
    c.members[0] = unhealthy(member("web-a", "h1", 0), 100);
    let d = c.run();
    assert!(d.deletes.is_empty(), "{:?}", d.deletes);
}

const HASH_SAME: &str = "same";

#[test]
fn a_lost_member_is_deleted_once_its_host_answers_again() {
    for state in [HostState::Ready, HostState::Degraded] {
        let mut c = dead_h1(950, 1100);
        c.hosts[0].state = Some(state);
        c.hosts[0].dead_since = None;
        c.members.push(member("web-c", "h2", 1010));
        c.status.lost_members = vec![lost_a()];
        let d = c.run();
        assert_eq!(deleted(&d), [("web-a", DeleteCause::HostLost)], "{state:?}");
        assert!(d.creates.is_empty());
        assert!(d.status.lost_members.is_empty());
        assert!(
            d.events
                .iter()
                .any(|e| e.message.contains("web-a") && e.message.contains("host-lost"))
        );
    }
}

#[test]
fn a_returned_copy_that_still_serves_waits_for_its_replacement_to_be_available() {
    let mut c = dead_h1(950, 1100);
    c.hosts[0].state = Some(HostState::Ready);
    c.hosts[0].dead_since = None;
    c.members.push(provisioning(member("web-c", "h2", 1010)));
    c.status.lost_members = vec![lost_a()];
    let d = c.run();
    assert!(d.deletes.is_empty(), "{:?}", d.deletes);
    assert_eq!(d.status.lost_members, [lost_a()]);
    // Once it is available, the old copy goes.
    c.members[2] = member("web-c", "h2", 1010);
    assert_eq!(deleted(&c.run()), [("web-a", DeleteCause::HostLost)]);
    // A returned copy that does not serve goes at once.
    c.members[2] = provisioning(member("web-c", "h2", 1010));
    c.members[0].available = false;
    assert_eq!(deleted(&c.run()), [("web-a", DeleteCause::HostLost)]);
}

#[test]
fn after_an_operator_restart_a_lost_member_stays_lost_until_its_host_answers() {
    // The host not checked yet (its clock restarted): the lost member is neither deleted nor
    // counted, and nothing more is created.
    let mut c = dead_h1(950, 1100);
    c.hosts[0].state = None;
    c.hosts[0].dead_since = None;
    c.members.push(member("web-c", "h2", 1010));
    c.status.lost_members = vec![lost_a()];
    let d = c.run();
    assert!(d.deletes.is_empty() && d.creates.is_empty(), "{d:?}");
    assert_eq!(d.status.lost_members, [lost_a()]);
    // A host dead again but for less than the budget (its clock restarted with the
    // operator): nothing new is lost.
    let mut c = dead_h1(1090, 1100);
    let d = c.run();
    assert!(d.creates.is_empty() && d.status.lost_members.is_empty());
    c.now = at(1150);
    assert_eq!(c.run().creates.len(), 1);
}

#[test]
fn several_lost_members_are_replaced_past_max_surge_but_within_the_entry_quota() {
    let mut c = Case::new(
        policy("replicas: 3\nupdate:\n  maxSurge: 1\n"),
        vec![
            member("web-a", "h1", 0),
            member("web-b", "h1", 0),
            member("web-c", "h2", 0),
        ],
        &["h1", "h2", "h3"],
    );
    c.hosts[0].state = Some(HostState::Unreachable);
    c.hosts[0].dead_since = Some(at(900));
    let d = c.run();
    // Both replaced at once: they are out of replicas + maxSurge (3 + 1 would allow one).
    let mut hosts: Vec<&str> = d.creates.iter().map(|x| x.host.as_str()).collect();
    hosts.sort_unstable();
    assert_eq!(hosts, ["h2", "h3"]);
    assert!(d.deletes.is_empty());
    assert_eq!(d.status.lost_members.len(), 2);
    let rf = d.status.condition(condition::REPLICA_FAILURE).unwrap();
    assert!(
        rf.message.contains("2 member(s) lost") && rf.message.contains("h1 (web-a, web-b)"),
        "{}",
        rf.message
    );
    // The entry's quota counts lost members (their VMs may still run): 4 allows one more.
    c.policy.max_members = 4;
    assert_eq!(c.run().creates.len(), 1);
    // A rollout beside them still keeps to maxSurge: the replacements done, the template
    // changes; one surge member at a time.
    c.policy.max_members = u32::MAX;
    c.members.push(member("web-d", "h2", 1000));
    c.members.push(member("web-e", "h3", 1000));
    c.status.lost_members = d.status.lost_members.clone();
    c.hash = "bbbbbbbbbb".into();
    let d2 = c.run();
    assert_eq!(d2.creates.len(), 1, "{:?}", d2.creates);
    assert!(
        !d2.deletes
            .iter()
            .any(|x| x.name == "web-a" || x.name == "web-b")
    );
}

#[test]
fn a_flapping_host_restarts_the_clock() {
    // Dead since 950, answered once at 1005 (no dead_since), dead again since 1007.
    let mut c = dead_h1(950, 1005);
    c.hosts[0].state = Some(HostState::Ready);
    c.hosts[0].dead_since = None;
    assert!(c.run().creates.is_empty());
    let mut c = dead_h1(1007, 1060);
    assert!(
        c.run().creates.is_empty(),
        "lost before 60 s since the last break"
    );
    c.now = at(1067);
    assert_eq!(c.run().creates.len(), 1);
}

#[test]
fn without_autohealing_a_member_on_a_dead_host_is_kept() {
    let mut c = dead_h1(0, 5000);
    c.policy = policy("replicas: 2\nautohealing:\n  enabled: false\n");
    let d = c.run();
    assert!(d.creates.is_empty() && d.deletes.is_empty());
    assert!(d.status.lost_members.is_empty());
}
