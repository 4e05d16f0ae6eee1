//! Host maintenance in the pool decision: a cordoned or draining host gets no new member, and
//! the members on a draining host are replaced elsewhere within `maxSurge` /
//! `maxUnavailable`, round after round, until none is left there.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use egress_provider::libvirt::config::Maintenance;

use super::tests::{Case, member, policy, provisioning};
use super::*;
use crate::pool::status::condition;

fn with(mut c: Case, host: &str, m: Maintenance) -> Case {
    c.hosts
        .iter_mut()
        .find(|h| h.name == host)
        .unwrap()
        .maintenance = m;
    c
}

#[test]
fn a_cordoned_or_draining_host_gets_no_new_member_and_the_refusal_names_it() {
    for (m, word) in [
        (Maintenance::Cordon, "cordoned"),
        (Maintenance::Drain, "draining"),
    ] {
        let c = with(
            Case::new(policy("replicas: 4\n"), vec![], &["h1", "h2"]),
            "h1",
            m,
        );
        let d = c.run();
        assert!(d.creates.iter().all(|x| x.host == "h2"), "{m:?}: {d:#?}");
        assert_eq!(d.creates.len(), 4);
        // Both hosts out: nothing placed, and the condition says why per host.
        let c = with(c, "h2", Maintenance::Cordon);
        let d = c.run();
        assert!(d.creates.is_empty());
        let rf = d.status.condition(condition::REPLICA_FAILURE).unwrap();
        assert!(rf.message.contains(&format!("h1 {word}")), "{}", rf.message);
        assert!(rf.message.contains("h2 cordoned"), "{}", rf.message);
    }
}

#[test]
fn a_cordoned_host_keeps_its_members() {
    let c = with(
        Case::new(
            policy("replicas: 2\n"),
            vec![member("web-a", "h1", 0), member("web-b", "h2", 0)],
            &["h1", "h2"],
        ),
        "h1",
        Maintenance::Cordon,
    );
    let d = c.run();
    assert!(d.creates.is_empty() && d.deletes.is_empty(), "{d:#?}");
}

/// Runs rounds until the pool is settled (every create made available the round after, every
/// delete gone at once), asserting after each that the available members never drop below
/// `replicas - maxUnavailable` and the members never exceed `replicas + maxSurge`; returns
/// the rounds taken and the members at the end.
fn drain_to_end(
    extra: &str,
    replicas: usize,
    min_available: usize,
    max_total: usize,
) -> (usize, Vec<Member>) {
    let mut c = with(
        Case::new(
            policy(&format!("replicas: {replicas}\n{extra}")),
            (0..replicas)
                .map(|k| member(&format!("web-{k}"), "h1", 0))
                .collect(),
            &["h1", "h2", "h3"],
        ),
        "h1",
        Maintenance::Drain,
    );
    c.hosts[2].maintenance = Maintenance::Cordon;
    for round in 1..=20 {
        let d = c.run();
        let deleted: Vec<&str> = d.deletes.iter().map(|x| x.name.as_str()).collect();
        assert!(
            d.deletes.iter().all(|x| x.cause == DeleteCause::Drain),
            "{d:#?}"
        );
        assert!(
            d.creates.iter().all(|x| x.host == "h2"),
            "round {round}: {d:#?}"
        );
        // Deletes take effect now; this round's creates are provisioning.
        let mut next: Vec<Member> = c
            .members
            .iter()
            .filter(|m| !deleted.contains(&m.name.as_str()))
            .cloned()
            .map(|mut m| {
                m.phase = crate::model::Phase::Running;
                m.ready = true;
                m.available = true;
                m
            })
            .collect();
        let available = next.iter().filter(|m| m.available).count();
        assert!(
            available >= min_available,
            "round {round}: {available} available after the deletes, below {min_available}"
        );
        for x in &d.creates {
            next.push(provisioning(member(&x.name, &x.host, 1000)));
        }
        assert!(
            next.len() <= max_total,
            "round {round}: {} members",
            next.len()
        );
        if d.creates.is_empty() && d.deletes.is_empty() && c.members.iter().all(|m| m.available) {
            let done = d.status.condition(condition::PROGRESSING).unwrap();
            assert_eq!(done.reason, "Complete", "{done:?}");
            return (round, next);
        }
        let p = d.status.condition(condition::PROGRESSING).unwrap();
        // NB: once the last member there is gone, what is left is a plain scale-up.
        if c.members.iter().any(|m| m.host.as_deref() == Some("h1")) {
            assert_eq!(p.reason, "Draining", "round {round}: {p:?}");
        }
        c.members = next;
        c.now += std::time::Duration::from_secs(1);
    }
    panic!("the drain did not finish in 20 rounds: {:#?}", c.members);
}

#[test]
fn a_drain_surges_first_and_never_takes_the_available_members_below_the_budget() {
    // maxSurge 1, maxUnavailable 0: one replacement at a time, each available before its
    // member on the draining host goes.
    let (rounds, end) = drain_to_end("update: {maxSurge: 1, maxUnavailable: 0}\n", 2, 2, 3);
    assert!(
        end.iter().all(|m| m.host.as_deref() == Some("h2")),
        "{end:#?}"
    );
    assert_eq!(end.len(), 2);
    assert!(rounds >= 3, "one at a time: {rounds} rounds");
}

#[test]
fn a_drain_with_max_unavailable_removes_first_within_it() {
    // maxSurge 0, maxUnavailable 1: a member goes, then its replacement comes; never two down.
    let (_, end) = drain_to_end("update: {maxSurge: 0, maxUnavailable: 1}\n", 2, 1, 2);
    assert!(
        end.iter().all(|m| m.host.as_deref() == Some("h2")),
        "{end:#?}"
    );
    assert_eq!(end.len(), 2);
    // Both at once: 4 members, 2 may be down and 1 above.
    let (_, end) = drain_to_end("update: {maxSurge: 1, maxUnavailable: 2}\n", 4, 2, 5);
    assert_eq!(end.len(), 4);
}
