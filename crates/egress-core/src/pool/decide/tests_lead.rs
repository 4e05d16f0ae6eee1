//! The drain grace (`update.drainGrace`, or the gateway's): a member removed for a planned
//! cause is unpublished first and deleted only once the grace has passed since, as recorded
//! on it (so a restart changes nothing); it leaves the budget the moment it is unpublished;
//! a scale-up during the wait makes new members and takes no drain back; broken members and
//! released quarantined ones are deleted at once.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::time::Duration;

use super::tests::{Case, at, member, policy, provisioning, unhealthy};
use super::*;
use crate::pool::status::condition;

const GRACE: u64 = 300;

/// `m` as the next round observes it once the driver recorded `u` on it.
fn unpublished(mut m: Member, u: &UnpublishMember) -> Member {
    m.draining = Some(Drain::parse(&u.marker));
    m.available = false;
    m
}

/// Applies a round as a driver would: unpublishes recorded, deletes gone, creates booted.
fn apply(c: &mut Case, d: &PoolDecision, boot: bool) {
    let gone: Vec<&str> = d.deletes.iter().map(|x| x.name.as_str()).collect();
    c.members.retain(|m| !gone.contains(&m.name.as_str()));
    for m in &mut c.members {
        if let Some(u) = d.unpublishes.iter().find(|u| u.name == m.name) {
            *m = unpublished(m.clone(), u);
        }
    }
    for x in &d.creates {
        let mut m = member(&x.name, &x.host, 0);
        m.template_hash = x.template_hash.clone();
        m.created = c.now;
        c.members.push(if boot { m } else { provisioning(m) });
    }
    c.status = d.status.clone();
}

#[test]
fn a_rotated_member_is_unpublished_at_once_and_deleted_only_after_the_grace() {
    let mut c = Case::new(
        policy("replicas: 1\nupdate:\n  drainGrace: 5m\n"),
        vec![member("web-old", "h1", 0)],
        &["h1"],
    );
    c.hash = "bbbbbbbbbb".into();
    // Surge: the replacement first; the old member is untouched.
    let d = c.run();
    assert_eq!(d.creates.len(), 1);
    assert!(d.unpublishes.is_empty() && d.deletes.is_empty(), "{d:#?}");
    apply(&mut c, &d, true);
    // The replacement is available: the old member leaves publication now, and is not
    // deleted.
    c.now = at(1010);
    let d = c.run();
    assert_eq!(d.unpublishes.len(), 1, "{d:#?}");
    let u = &d.unpublishes[0];
    assert_eq!(
        (u.name.as_str(), u.cause),
        ("web-old", DeleteCause::Template)
    );
    assert_eq!(Drain::parse(&u.marker).since, at(1010));
    assert!(d.deletes.is_empty() && d.creates.is_empty(), "{d:#?}");
    assert_eq!(d.requeue_after, Some(Duration::from_secs(GRACE)));
    assert!(
        d.events
            .iter()
            .any(|e| e.reason == "MemberDraining" && e.message.contains("web-old")),
        "{:?}",
        d.events
    );
    apply(&mut c, &d, true);
    // During the grace: nothing is deleted, nothing more is created, the round wakes at
    // its end; the pool counts only the replacement.
    for t in [1011, 1200, 1309] {
        c.now = at(t);
        let d = c.run();
        assert!(
            d.deletes.is_empty() && d.creates.is_empty() && d.unpublishes.is_empty(),
            "at {t}: {d:#?}"
        );
        assert_eq!(
            d.requeue_after,
            Some(Duration::from_secs(1310 - t)),
            "wakes at the grace's end"
        );
        assert_eq!((d.status.replicas, d.status.available_replicas), (1, 1));
        let p = d.status.condition(condition::PROGRESSING).unwrap();
        assert_eq!(p.reason, "Complete", "{p:?}");
        assert!(
            p.message.contains("1 removed member(s) unpublished"),
            "{p:?}"
        );
    }
    // At the grace's end: deleted, with the cause it was removed for.
    c.now = at(1310);
    let d = c.run();
    assert_eq!(
        d.deletes,
        [DeleteMember {
            name: "web-old".into(),
            cause: DeleteCause::Template
        }]
    );
    assert_eq!(d.requeue_after, None);
}

#[test]
fn without_a_grace_a_removed_member_is_deleted_at_once() {
    let mut c = Case::new(
        policy("replicas: 1\n"),
        vec![member("web-a", "h1", 0), member("web-b", "h1", 1)],
        &["h1"],
    );
    let d = c.run();
    assert_eq!(d.deletes.len(), 1);
    assert!(d.unpublishes.is_empty());
    // A gateway's grace is the default.
    c.policy = policy(
        "replicas: 1\ncredentials:\n  generate: true\ngateway:\n  listeners: [{port: 3128}]\n  \
         drainGrace: 1m\n",
    );
    let d = c.run();
    assert!(d.deletes.is_empty(), "{d:#?}");
    assert_eq!(d.unpublishes.len(), 1);
    assert_eq!(d.unpublishes[0].cause, DeleteCause::ScaleIn);
    assert_eq!(d.requeue_after, Some(Duration::from_secs(60)));
}

#[test]
fn broken_and_released_members_are_deleted_at_once_whatever_the_grace() {
    let mut c = Case::new(
        policy("replicas: 2\nupdate:\n  drainGrace: 1h\n"),
        vec![
            unhealthy(member("web-sick", "h1", 0), 0),
            member("web-ok", "h1", 0),
            member("web-held", "h1", 0),
        ],
        &["h1"],
    );
    c.members[2].quarantine = None;
    c.status.quarantined = vec!["web-held".into()];
    let d = c.run();
    let mut gone: Vec<(&str, DeleteCause)> = d
        .deletes
        .iter()
        .map(|x| (x.name.as_str(), x.cause))
        .collect();
    gone.sort();
    assert_eq!(
        gone,
        [
            ("web-held", DeleteCause::Quarantine),
            ("web-sick", DeleteCause::Unhealthy)
        ]
    );
    assert!(d.unpublishes.is_empty(), "{d:#?}");
}

#[test]
fn a_member_not_available_drains_from_when_it_left_publication_or_goes_at_once() {
    // Scale-in of a member unhealthy since 900 with a 5m grace: due at 1200.
    let mut c = Case::new(
        policy("replicas: 1\nupdate:\n  drainGrace: 5m\n"),
        vec![
            member("web-ok", "h1", 0),
            unhealthy(member("web-sick", "h1", 1), 900),
        ],
        &["h1"],
    );
    let d = c.run();
    assert_eq!(d.unpublishes.len(), 1, "{d:#?}");
    assert_eq!(Drain::parse(&d.unpublishes[0].marker).since, at(900));
    assert_eq!(d.requeue_after, Some(Duration::from_secs(200)));
    // Unhealthy for longer than the grace: deleted at once.
    c.members[1] = unhealthy(member("web-sick", "h1", 1), 600);
    let d = c.run();
    assert_eq!(d.deletes.len(), 1, "{d:#?}");
    assert!(d.unpublishes.is_empty());
    // Never published (still provisioning): deleted at once.
    c.members[1] = provisioning(member("web-new", "h1", 1));
    let d = c.run();
    assert_eq!(d.deletes.len(), 1, "{d:#?}");
    assert!(d.unpublishes.is_empty());
}

#[test]
fn the_budget_holds_while_members_wait_and_nothing_is_unpublished_twice() {
    // 4 members of an old template, maxSurge 0, maxUnavailable 1: one at a time.
    let mut c = Case::new(
        policy("replicas: 4\nupdate:\n  maxSurge: 0\n  maxUnavailable: 1\n  drainGrace: 5m\n"),
        (0..4)
            .map(|k| member(&format!("web-{k}"), "h1", k))
            .collect(),
        &["h1", "h2"],
    );
    c.hash = "bbbbbbbbbb".into();
    let d = c.run();
    assert_eq!(d.unpublishes.len(), 1, "{d:#?}");
    assert!(d.deletes.is_empty());
    let first = d.unpublishes[0].name.clone();
    // No surge: its replacement comes once it left the pool (the next round), and is not
    // available yet; the unpublished member is waiting: no second member may go (3
    // available = replicas - maxUnavailable).
    apply(&mut c, &d, false);
    c.now = at(1001);
    let d = c.run();
    assert_eq!(d.creates.len(), 1, "{d:#?}");
    assert!(d.unpublishes.is_empty() && d.deletes.is_empty(), "{d:#?}");
    apply(&mut c, &d, false);
    for t in [1002, 1100] {
        c.now = at(t);
        let d = c.run();
        assert!(d.unpublishes.is_empty() && d.deletes.is_empty(), "{d:#?}");
        assert!(
            d.creates.is_empty(),
            "the drained member is replaced once: {d:#?}"
        );
        assert_eq!(d.status.available_replicas, 3);
    }
    // The replacement is available: the next old member goes, the first still waits.
    for m in &mut c.members {
        if m.phase == crate::model::Phase::Provisioning {
            *m = member(&m.name, "h1", 0);
            m.template_hash = "bbbbbbbbbb".into();
        }
    }
    c.now = at(1101);
    let d = c.run();
    assert_eq!(d.unpublishes.len(), 1, "{d:#?}");
    assert_ne!(d.unpublishes[0].name, first);
    assert!(d.deletes.is_empty());
    apply(&mut c, &d, false);
    // The first member's grace ends at 1300; the second's at 1401.
    c.now = at(1300);
    let d = c.run();
    let gone: Vec<&str> = d.deletes.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(gone, [first.as_str()]);
    assert_eq!(d.requeue_after, Some(Duration::from_secs(101)));
}

#[test]
fn a_wait_survives_a_restart_of_the_state() {
    // A new process knows only what the members carry (their markers) and the status it
    // read back: the same decision, the same deadline.
    let mut c = Case::new(
        policy("replicas: 1\nupdate:\n  drainGrace: 5m\n"),
        vec![member("web-new", "h1", 500), member("web-old", "h1", 0)],
        &["h1"],
    );
    c.members[1].draining = Some(Drain {
        since: at(900),
        cause: DeleteCause::Age,
    });
    c.members[1].available = false;
    // A fresh status (lost or never written) changes nothing.
    c.status = Default::default();
    c.now = at(1100);
    let d = c.run();
    assert!(d.deletes.is_empty() && d.creates.is_empty(), "{d:#?}");
    assert_eq!(d.requeue_after, Some(Duration::from_secs(100)));
    c.now = at(1200);
    let d = c.run();
    assert_eq!(
        d.deletes,
        [DeleteMember {
            name: "web-old".into(),
            cause: DeleteCause::Age
        }]
    );
    // The marker as a driver records it reads back the same.
    let m = Drain {
        since: at(900),
        cause: DeleteCause::ScaleIn,
    };
    assert_eq!(Drain::parse(&m.marker()), m);
    // One written by hand: overdue.
    assert_eq!(
        Drain::parse("soon").since,
        std::time::SystemTime::UNIX_EPOCH
    );
}

#[test]
fn a_scale_up_during_the_wait_makes_new_members_and_takes_no_drain_back() {
    let mut c = Case::new(
        policy("replicas: 2\nupdate:\n  drainGrace: 5m\n"),
        vec![
            member("web-a", "h1", 0),
            member("web-b", "h1", 1),
            member("web-c", "h1", 2),
        ],
        &["h1"],
    );
    let d = c.run();
    assert_eq!(d.unpublishes.len(), 1);
    apply(&mut c, &d, true);
    // Scale up to 4: two new members (the unpublished one does not count), no deletion,
    // the drain goes on.
    c.policy = policy("replicas: 4\nupdate:\n  drainGrace: 5m\n");
    c.now = at(1001);
    let d = c.run();
    assert_eq!(d.creates.len(), 2, "{d:#?}");
    assert!(d.deletes.is_empty() && d.unpublishes.is_empty(), "{d:#?}");
    apply(&mut c, &d, true);
    c.now = at(1300);
    let d = c.run();
    assert_eq!(d.deletes.len(), 1);
    assert!(d.creates.is_empty(), "{d:#?}");
    // The entry's quota counts the unpublished member (it still holds a VM).
    let mut q = Case::new(
        policy("replicas: 2\nupdate:\n  drainGrace: 5m\n"),
        vec![member("web-a", "h1", 0), member("web-b", "h1", 1)],
        &["h1"],
    );
    q.members[0].draining = Some(Drain {
        since: at(999),
        cause: DeleteCause::Template,
    });
    q.members[0].available = false;
    q.policy = q.policy.clone().within_quota(2).unwrap();
    let d = q.run();
    assert!(d.creates.is_empty(), "over the quota: {d:#?}");
}
