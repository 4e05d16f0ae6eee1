//! The pool decision table: scale up and down, spread around an unhealthy or full host,
//! rotation and template rollout in batches within the budget, autohealing with backoff,
//! quarantine, credentials generated once.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::time::{Duration, SystemTime};

use egress_provider::model::HostState;

use super::*;
use crate::model::{ConditionStatus, Phase};
use crate::pool::spec::ProxyPoolSpec;
use crate::pool::status::{ProxyPoolStatus, condition};
use crate::pool::validate::PoolPolicy;

pub(super) const T0: u64 = 1_800_000_000;
pub(super) const HASH: &str = "aaaaaaaaaa";

pub(super) fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(T0 + secs)
}

/// A pool policy from the YAML of a spec (template filled in).
pub(super) fn policy(extra: &str) -> PoolPolicy {
    let y = format!(
        "template:\n  spec:\n    provider: home\n    image: debian-12\n    proxy:\n      allowedClientCidrs: [10.0.0.0/8]\n{extra}"
    );
    let spec: ProxyPoolSpec = serde_saphyr::from_str(&y).unwrap();
    spec.validate().unwrap()
}

pub(super) fn hosts(names: &[&str]) -> Vec<PoolHost> {
    names
        .iter()
        .map(|n| PoolHost {
            name: (*n).into(),
            state: Some(HostState::Ready),
            maintenance: Default::default(),
            dead_since: None,
            ready_since: None,
            segment: None,
        })
        .collect()
}

/// A healthy, current member created at `created` (seconds after T0) on `host`.
pub(super) fn member(name: &str, host: &str, created: u64) -> Member {
    Member {
        name: name.into(),
        host: Some(host.into()),
        template_hash: HASH.into(),
        created: at(created),
        phase: Phase::Running,
        ready: true,
        available: true,
        unhealthy_since: None,
        failure: None,
        quarantine: None,
        deleting: false,
        draining: None,
        egress_address: Vec::new(),
        ip: None,
        egress_ip: None,
        listed: Vec::new(),
        listed_note: String::new(),
    }
}

/// `m`, not ready yet (provisioning).
pub(super) fn provisioning(mut m: Member) -> Member {
    m.phase = Phase::Provisioning;
    m.ready = false;
    m.available = false;
    m
}

/// `m`, running but unhealthy since `since`.
pub(super) fn unhealthy(mut m: Member, since: u64) -> Member {
    m.ready = false;
    m.available = false;
    m.unhealthy_since = Some(at(since));
    m.failure = Some("health check: connect refused".into());
    m
}

pub(super) struct Case {
    pub(super) policy: PoolPolicy,
    pub(super) members: Vec<Member>,
    pub(super) hosts: Vec<PoolHost>,
    pub(super) status: ProxyPoolStatus,
    pub(super) now: SystemTime,
    pub(super) hash: String,
}

impl Case {
    pub(super) fn new(policy: PoolPolicy, members: Vec<Member>, host_names: &[&str]) -> Self {
        Self {
            policy,
            members,
            hosts: hosts(host_names),
            status: ProxyPoolStatus::default(),
            now: at(1000),
            hash: HASH.into(),
        }
    }

    pub(super) fn run(&self) -> PoolDecision {
        decide(&PoolInputs {
            name: "web",
            generation: 3,
            policy: &self.policy,
            template_hash: &self.hash,
            members: &self.members,
            hosts: &self.hosts,
            status: &self.status,
            credentials_present: true,
            now: self.now,
        })
    }
}

fn created_hosts(d: &PoolDecision) -> Vec<&str> {
    d.creates.iter().map(|c| c.host.as_str()).collect()
}

fn deleted(d: &PoolDecision) -> Vec<(&str, DeleteCause)> {
    d.deletes
        .iter()
        .map(|x| (x.name.as_str(), x.cause))
        .collect()
}

fn cond<'a>(d: &'a PoolDecision, t: &str) -> &'a crate::model::Condition {
    d.status.condition(t).unwrap()
}

#[test]
fn an_empty_pool_scales_up_spread_evenly_with_derived_names_and_the_template_hash() {
    let d = Case::new(policy("replicas: 5\n"), vec![], &["h1", "h2", "h3"]).run();
    assert_eq!(created_hosts(&d), ["h1", "h2", "h3", "h1", "h2"]);
    for c in &d.creates {
        assert!(
            c.name.starts_with("web-") && c.name.len() == 10,
            "{}",
            c.name
        );
        assert!(crate::model::is_dns_subdomain(&c.name));
        assert_eq!(c.template_hash, HASH);
    }
    let mut names: Vec<&str> = d.creates.iter().map(|c| c.name.as_str()).collect();
    names.dedup();
    assert_eq!(names.len(), 5);
    assert!(d.deletes.is_empty());
    assert_eq!(cond(&d, condition::PROGRESSING).reason, reason::SCALING_UP);
    assert_eq!(
        cond(&d, condition::AVAILABLE).status,
        ConditionStatus::False
    );
    assert_eq!(d.status.observed_generation, 3);
    // The same inputs decide the same names.
    assert_eq!(
        Case::new(policy("replicas: 5\n"), vec![], &["h1", "h2", "h3"]).run(),
        d
    );
}

#[test]
fn a_complete_pool_does_nothing_and_says_so() {
    let members = vec![member("web-a", "h1", 0), member("web-b", "h2", 10)];
    let d = Case::new(policy("replicas: 2\n"), members, &["h1", "h2"]).run();
    assert!(d.creates.is_empty() && d.deletes.is_empty());
    assert_eq!(cond(&d, condition::PROGRESSING).reason, reason::COMPLETE);
    assert_eq!(cond(&d, condition::AVAILABLE).status, ConditionStatus::True);
    assert_eq!(
        cond(&d, condition::REPLICA_FAILURE).status,
        ConditionStatus::False
    );
    assert_eq!(
        (
            d.status.replicas,
            d.status.ready_replicas,
            d.status.available_replicas,
            d.status.updated_replicas
        ),
        (2, 2, 2, 2)
    );
    assert_eq!(d.requeue_after, None);
}

#[test]
fn scale_in_removes_unhealthy_then_not_ready_then_oldest() {
    let members = vec![
        member("web-old", "h1", 0),
        member("web-mid", "h2", 100),
        member("web-new", "h1", 200),
        provisioning(member("web-prov", "h2", 300)),
        unhealthy(member("web-sick", "h1", 250), 900),
    ];
    let mut c = Case::new(policy("replicas: 4\n"), members.clone(), &["h1", "h2"]);
    assert_eq!(deleted(&c.run()), [("web-sick", DeleteCause::ScaleIn)]);
    c.policy = policy("replicas: 2\n");
    assert_eq!(
        deleted(&c.run()),
        [
            ("web-sick", DeleteCause::ScaleIn),
            ("web-prov", DeleteCause::ScaleIn),
            ("web-old", DeleteCause::ScaleIn)
        ]
    );
    assert_eq!(
        cond(&c.run(), condition::PROGRESSING).reason,
        reason::SCALING_DOWN
    );
    c.policy = policy("replicas: 2\nscaleIn:\n  order: NewestFirst\n");
    assert_eq!(
        deleted(&c.run()),
        [
            ("web-sick", DeleteCause::ScaleIn),
            ("web-prov", DeleteCause::ScaleIn),
            ("web-new", DeleteCause::ScaleIn)
        ]
    );
    c.policy = policy("replicas: 0\n");
    assert_eq!(c.run().deletes.len(), 5);
}

#[test]
fn spread_skips_an_unhealthy_host_and_a_full_one_and_says_which_when_none_is_left() {
    let mut c = Case::new(
        policy("replicas: 4\nplacement:\n  maxPerHost: 2\n"),
        vec![member("web-a", "h1", 0), member("web-b", "h1", 0)],
        &["h1", "h2", "h3"],
    );
    c.hosts[2].state = Some(HostState::Unreachable);
    // h1 is full, h3 unreachable: both new members go to h2.
    let d = c.run();
    assert_eq!(created_hosts(&d), ["h2", "h2"]);
    assert_eq!(
        cond(&d, condition::REPLICA_FAILURE).status,
        ConditionStatus::False
    );
    // A fifth member has nowhere to go: h1 and h2 full, h3 unreachable; h4 (Degraded: its
    // storage pool at the reserve) takes none either.
    c.policy = policy("replicas: 5\nplacement:\n  maxPerHost: 2\n");
    c.members.push(member("web-c", "h2", 0));
    c.members.push(member("web-d", "h2", 0));
    c.hosts.push(PoolHost {
        name: "h4".into(),
        state: Some(HostState::Degraded),
        maintenance: Default::default(),
        dead_since: None,
        ready_since: None,
        segment: None,
    });
    let d = c.run();
    assert!(d.creates.is_empty());
    let rf = cond(&d, condition::REPLICA_FAILURE);
    assert_eq!(
        (rf.status, rf.reason.as_str()),
        (ConditionStatus::True, reason::NO_HOST_AVAILABLE)
    );
    for part in [
        "h1 full (2 members, maxPerHost 2)",
        "h2 full",
        "h3 Unreachable",
        "h4 Degraded",
    ] {
        assert!(rf.message.contains(part), "{part}: {}", rf.message);
    }
    assert_eq!(
        cond(&d, condition::PROGRESSING).status,
        ConditionStatus::False
    );
}

#[test]
fn placement_keeps_to_the_host_subset_and_names_a_host_the_entry_lacks() {
    let c = Case::new(
        policy("replicas: 3\nplacement:\n  hosts: [h2, h9]\n"),
        vec![],
        &["h1", "h2", "h3"],
    );
    let d = c.run();
    assert_eq!(created_hosts(&d), ["h2", "h2", "h2"]);
    let mut c = c;
    c.hosts[1].state = Some(HostState::Timeout);
    let d = c.run();
    assert!(d.creates.is_empty());
    let msg = &cond(&d, condition::REPLICA_FAILURE).message;
    assert!(
        msg.contains("h2 Timeout") && msg.contains("h9 not a host"),
        "{msg}"
    );
    assert!(!msg.contains("h1"), "{msg}");
}

#[test]
fn a_template_change_rolls_members_in_batches_of_the_budget() {
    let old: Vec<Member> = (0..10)
        .map(|n| {
            let mut m = member(&format!("web-{n}"), ["h1", "h2"][n % 2], n as u64);
            m.template_hash = "old".into();
            m
        })
        .collect();
    let mut c = Case::new(
        policy("replicas: 10\nupdate:\n  maxSurge: 30%\n  maxUnavailable: 20%\n"),
        old,
        &["h1", "h2"],
    );
    let d = c.run();
    // maxSurge 30% of 10 = 3 new ones; maxUnavailable 20% = 2 old ones go now, oldest first.
    assert_eq!(d.creates.len(), 3);
    assert_eq!(
        deleted(&d),
        [
            ("web-0", DeleteCause::Template),
            ("web-1", DeleteCause::Template)
        ]
    );
    assert_eq!(
        cond(&d, condition::PROGRESSING).reason,
        reason::ROLLING_UPDATE
    );
    assert_eq!(d.status.updated_replicas, 0);
    // Next round: the three new ones are not ready yet, two old ones are gone.
    c.members.drain(0..2);
    for (k, cr) in d.creates.iter().enumerate() {
        let mut m = provisioning(member(&cr.name, &cr.host, 1000));
        m.name = format!("web-new{k}");
        c.members.push(m);
    }
    let d = c.run();
    // 11 members: 3 new (counted towards 10), at most 13 in all: 2 more creates; 8 old
    // available, at least 8 must stay: no old one goes until new ones are available.
    assert_eq!(d.creates.len(), 2);
    assert!(d.deletes.is_empty(), "{:?}", d.deletes);
    // The new ones become available: the old ones go, two at a time beyond the new ones.
    for m in c
        .members
        .iter_mut()
        .filter(|m| m.name.starts_with("web-new"))
    {
        *m = member(&m.name, m.host.as_deref().unwrap(), 1000);
    }
    let d = c.run();
    assert_eq!(d.deletes.len(), 3, "{:?}", d.deletes);
    assert!(d.deletes.iter().all(|x| x.cause == DeleteCause::Template));
}

#[test]
fn rotation_with_surge_one_and_no_unavailability_replaces_one_at_a_time_new_before_old() {
    let p = policy("replicas: 2\nrotation:\n  maxAge: 1h\n");
    let mut c = Case::new(
        p,
        vec![member("web-a", "h1", 0), member("web-b", "h2", 60)],
        &["h1", "h2"],
    );
    c.now = at(3599);
    let d = c.run();
    assert!(d.creates.is_empty() && d.deletes.is_empty());
    // Asks to be woken when web-a turns one hour old.
    assert_eq!(d.requeue_after, Some(Duration::from_secs(1)));
    c.now = at(3700);
    let d = c.run();
    assert_eq!(d.creates.len(), 1);
    assert!(
        d.deletes.is_empty(),
        "no healthy member goes before its replacement is healthy"
    );
    assert_eq!(cond(&d, condition::PROGRESSING).reason, reason::ROTATING);
    c.members
        .push(provisioning(member("web-c", &d.creates[0].host, 3700)));
    let d = c.run();
    assert!(d.creates.is_empty() && d.deletes.is_empty());
    c.members[2] = member("web-c", "h1", 3700);
    let d = c.run();
    assert_eq!(deleted(&d), [("web-a", DeleteCause::Age)]);
    assert!(d.creates.is_empty());
}

#[test]
fn a_failed_member_is_replaced_at_once_and_an_unhealthy_one_after_unhealthy_after() {
    let mut failed = member("web-f", "h1", 0);
    failed.phase = Phase::Failed;
    failed.ready = false;
    failed.available = false;
    failed.failure = Some("provisioning deadline passed".into());
    let mut c = Case::new(
        policy("replicas: 3\n"),
        vec![
            failed,
            unhealthy(member("web-u", "h2", 0), 800),
            member("web-ok", "h3", 0),
        ],
        &["h1", "h2", "h3"],
    );
    let d = c.run();
    assert_eq!(deleted(&d), [("web-f", DeleteCause::Failed)]);
    // Its host backs off: the replacement goes elsewhere.
    assert_eq!(created_hosts(&d), ["h2"]);
    let rf = cond(&d, condition::REPLICA_FAILURE);
    assert_eq!(rf.reason, reason::MEMBER_FAILED);
    assert!(
        rf.message
            .contains("web-f on host h1: provisioning deadline passed"),
        "{}",
        rf.message
    );
    assert_eq!(d.status.host_failures[0].host, "h1");
    // web-u has been unhealthy for 200 s of its 300: wake up when it is due.
    assert_eq!(d.requeue_after, Some(Duration::from_secs(100)));
    c.now = at(1100);
    let d = c.run();
    assert!(
        deleted(&d).contains(&("web-u", DeleteCause::Unhealthy)),
        "{:?}",
        d.deletes
    );
    // Autohealing off: nothing is replaced.
    c.policy = policy("replicas: 3\nautohealing:\n  enabled: false\n");
    assert!(c.run().deletes.is_empty());
}

#[test]
fn repeated_failures_on_a_host_back_off_its_creates_until_a_member_there_is_available() {
    let mut c = Case::new(policy("replicas: 1\n"), vec![], &["h1"]);
    let mut failures = 0;
    let mut t = 0u64;
    let mut creates_at = Vec::new();
    // Every member fails right after its create; the host's creates back off 30 s, 60 s, ...
    while t < 1000 {
        c.now = at(t);
        let d = c.run();
        c.status = d.status.clone();
        c.members.clear();
        if let Some(cr) = d.creates.first() {
            creates_at.push(t);
            let mut m = member(&cr.name, "h1", t);
            m.phase = Phase::Failed;
            m.ready = false;
            m.available = false;
            c.members.push(m);
            failures += 1;
        } else {
            let rf = cond(&d, condition::REPLICA_FAILURE);
            if t > 0 && failures > 0 {
                assert_eq!(rf.reason, reason::BACKING_OFF, "{}", rf.message);
            }
        }
        t += 5;
    }
    // The member created at t fails at t+5 (the next round) and the backoff starts then.
    let gaps: Vec<u64> = creates_at.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(
        gaps,
        [5 + 30, 5 + 60, 5 + 120, 5 + 240, 5 + 480],
        "creates at {creates_at:?}"
    );
    // A member that becomes available there resets the count.
    c.now = at(5000);
    let d = c.run();
    assert_eq!(d.creates.len(), 1);
    c.status = d.status.clone();
    c.members = vec![member(&d.creates[0].name, "h1", 5000)];
    c.now = at(5100);
    let d = c.run();
    assert!(d.status.host_failures.is_empty());
    assert_eq!(
        cond(&d, condition::REPLICA_FAILURE).status,
        ConditionStatus::False
    );
}

#[test]
fn a_quarantined_member_is_replaced_kept_and_deleted_only_once_released() {
    let mut q = member("web-q", "h1", 0);
    q.quarantine = Some("egress IP listed by a blocklist".into());
    let mut c = Case::new(
        policy("replicas: 2\n"),
        vec![q, member("web-b", "h2", 0)],
        &["h1", "h2"],
    );
    let d = c.run();
    assert_eq!(d.newly_quarantined, ["web-q"]);
    assert!(d.deletes.is_empty(), "kept for inspection");
    assert_eq!(d.creates.len(), 1, "and replaced");
    assert_eq!(d.status.quarantined, ["web-q"]);
    assert_eq!(
        d.status.available_replicas, 1,
        "not available: out of publication"
    );
    assert_eq!(d.status.ready_replicas, 2);
    assert!(
        d.events
            .iter()
            .any(|e| e.reason == reason::MEMBER_QUARANTINED && e.message.contains("blocklist"))
    );
    c.status = d.status.clone();
    c.members
        .push(member(&d.creates[0].name, &d.creates[0].host, 1000));
    let d = c.run();
    assert!(d.newly_quarantined.is_empty() && d.deletes.is_empty() && d.creates.is_empty());
    assert_eq!(cond(&d, condition::PROGRESSING).reason, reason::COMPLETE);
    // The annotation is removed: the member, already replaced, is deleted.
    c.status = d.status.clone();
    c.members[0].quarantine = None;
    let d = c.run();
    assert_eq!(deleted(&d), [("web-q", DeleteCause::Quarantine)]);
    assert!(d.status.quarantined.is_empty());
}

#[test]
fn credentials_are_generated_only_while_they_do_not_exist() {
    let p = policy("credentials:\n  generate: true\n");
    let c = Case::new(p, vec![], &["h1"]);
    let run = |present| {
        decide(&PoolInputs {
            name: "web",
            generation: 1,
            policy: &c.policy,
            template_hash: HASH,
            members: &[],
            hosts: &c.hosts,
            status: &c.status,
            credentials_present: present,
            now: c.now,
        })
    };
    assert!(run(false).generate_credentials);
    assert!(!run(true).generate_credentials);
    let p = policy("");
    let c2 = Case {
        policy: p,
        ..Case::new(policy(""), vec![], &["h1"])
    };
    assert!(!c2.run().generate_credentials);
}

#[test]
fn members_being_deleted_are_not_counted_but_still_fill_their_host() {
    let mut going = member("web-x", "h1", 0);
    going.deleting = true;
    let c = Case::new(
        policy("replicas: 1\nplacement:\n  maxPerHost: 1\n"),
        vec![going],
        &["h1", "h2"],
    );
    let d = c.run();
    assert_eq!(created_hosts(&d), ["h2"]);
    assert_eq!(d.status.replicas, 0);
}

#[test]
fn a_rollout_over_members_not_ready_yet_removes_no_more_than_it_replaces() {
    // Three old members still booting (not available, not unhealthy) when the template
    // changes: they may come up any moment, so they are replaced one per new member, never
    // all removed at once (the pool's members stay at replicas - maxUnavailable or more).
    let old: Vec<Member> = (0..3)
        .map(|n| {
            let mut m = provisioning(member(&format!("web-{n}"), "h1", n));
            m.template_hash = "old".into();
            m
        })
        .collect();
    let d = Case::new(policy("replicas: 3\n"), old, &["h1", "h2"]).run();
    assert_eq!(d.creates.len(), 1);
    assert_eq!(deleted(&d), [("web-0", DeleteCause::Template)]);
}

#[test]
fn quarantined_members_count_toward_max_pool_replicas() {
    // A pool of 2 on an entry allowing 3 members: one quarantined member is replaced...
    let quarantined = |name: &str, host: &str| {
        let mut q = member(name, host, 0);
        q.quarantine = Some("banned".into());
        q
    };
    let p = policy("replicas: 2\n").within_quota(3).unwrap();
    let mut c = Case::new(
        p.clone(),
        vec![quarantined("web-q1", "h1"), member("web-b", "h2", 0)],
        &["h1", "h2"],
    );
    assert_eq!(c.run().creates.len(), 1);
    // ...a second is not: 2 quarantined and 1 serving are the entry's 3.
    c.members = vec![
        quarantined("web-q1", "h1"),
        quarantined("web-q2", "h2"),
        member("web-b", "h2", 0),
    ];
    assert!(
        c.run().creates.is_empty(),
        "never more than maxPoolReplicas members"
    );
    // Without the quota the same pool would replace it.
    let mut unbounded = Case::new(policy("replicas: 2\n"), c.members.clone(), &["h1", "h2"]);
    assert_eq!(unbounded.run().creates.len(), 1);
    unbounded.members.clear();
    // A pool asking for more than the quota is refused, naming spec.replicas.
    let e = policy("replicas: 4\n").within_quota(3).unwrap_err();
    assert_eq!(e.path, "spec.replicas");
    assert!(
        e.message.contains("quotas.maxPoolReplicas"),
        "{}",
        e.message
    );
}
