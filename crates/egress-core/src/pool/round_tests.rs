//! One pool round: removal, refusals announced once, the status a round records (selector,
//! member rows), availability recorded once per member, and the order and error handling of
//! carrying a round out.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use egress_provider::model::HostState;
use egress_provider::sync::lock;

use super::*;
use crate::metrics::MetricsFormat;
use crate::model::Phase;
use crate::pool::DeleteCause;

const T0: u64 = 1_800_000_000;

fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(T0 + secs)
}

fn spec(replicas: u32) -> ProxyPoolSpec {
    serde_saphyr::from_str(&format!(
        "replicas: {replicas}\ntemplate:\n  spec:\n    provider: home\n    image: debian-12\n    \
         proxy:\n      allowedClientCidrs: [10.0.0.0/8]\n"
    ))
    .unwrap()
}

fn hosts() -> Vec<PoolHost> {
    vec![PoolHost {
        name: "h1".into(),
        state: Some(HostState::Ready),
        maintenance: Default::default(),
        dead_since: None,
        ready_since: None,
        segment: None,
    }]
}

/// A running member made from the current template of `spec(_)` at `created`.
fn member(name: &str, available: bool, created: u64) -> Member {
    let mut m = Member::expected(
        name,
        "h1",
        &template_hash(&spec(1).template, ""),
        at(created),
    );
    m.phase = Phase::Running;
    m.ready = available;
    m.available = available;
    m.ip = Some("192.0.2.7".into());
    m
}

fn inputs<'a>(
    spec: &'a ProxyPoolSpec,
    members: &'a [Member],
    hosts: &'a [PoolHost],
    status: &'a ProxyPoolStatus,
) -> RoundInputs<'a> {
    RoundInputs {
        namespace: "ns",
        name: "web",
        generation: 3,
        spec,
        deleting: false,
        quota: Quota::Unbounded,
        status,
        credentials: PoolCredentials::Ready { digest: "" },
        members,
        hosts,
        retire_for: Duration::from_secs(3600),
        now: at(100),
    }
}

#[test]
fn a_deleted_pool_deletes_the_members_not_yet_going_and_finishes_with_none_left() {
    let s = spec(2);
    let mut going = member("web-b", true, 0);
    going.deleting = true;
    let members = [member("web-a", true, 0), going];
    let status = ProxyPoolStatus::default();
    let h = hosts();
    let mut i = inputs(&s, &members, &h, &status);
    i.deleting = true;
    let mut mem = AvailabilityMemory::default();
    assert_eq!(
        plan(&i, &mut mem),
        Round::Remove {
            delete: vec!["web-a".into()],
            finished: false
        }
    );
    i.members = &[];
    assert_eq!(
        plan(&i, &mut mem),
        Round::Remove {
            delete: Vec::new(),
            finished: true
        }
    );
}

#[test]
fn an_invalid_pool_is_refused_with_every_fault_and_announced_only_when_its_status_changes() {
    let mut s = spec(1);
    s.replicas = 1_000_000;
    s.template.spec.host = Some("h1".into());
    let status = ProxyPoolStatus::default();
    let h = hosts();
    let mut i = inputs(&s, &[], &h, &status);
    i.name = "Not_A_Name";
    let Round::Refused {
        reason: why,
        status: refused,
        event,
    } = plan(&i, &mut AvailabilityMemory::default())
    else {
        panic!("not refused");
    };
    assert_eq!(why, reason::INVALID_SPEC);
    let msg = &refused.condition(condition::PROGRESSING).unwrap().message;
    for needle in ["Not_A_Name", "replicas", "template.spec.host"] {
        assert!(msg.contains(needle), "{needle} missing from {msg}");
    }
    assert_eq!(refused.selector, "egress-proxies.dev/pool=Not_A_Name");
    assert_eq!(refused.observed_generation, 3);
    assert!(event.is_some(), "the first refusal is announced");
    // The same refusal again: the status holds, nothing new to announce.
    i.status = &refused;
    let Round::Refused { event, .. } = plan(&i, &mut AvailabilityMemory::default()) else {
        panic!("not refused");
    };
    assert!(event.is_none());
}

#[test]
fn a_pool_over_its_entry_s_quota_is_refused_or_held_as_its_driver_asks() {
    let s = spec(5);
    let status = ProxyPoolStatus::default();
    let h = hosts();
    let mut i = inputs(&s, &[], &h, &status);
    // Within the quota: every member counts against it, quarantined ones included.
    i.quota = Quota::Refuse(5);
    let Round::Act(p) = plan(&i, &mut AvailabilityMemory::default()) else {
        panic!("a pool at its quota acts");
    };
    assert_eq!((p.policy.replicas, p.policy.max_members), (5, 5));
    // Kubernetes: refused, naming spec.replicas and the quota.
    i.quota = Quota::Refuse(3);
    let Round::Refused {
        reason: why,
        status: refused,
        ..
    } = plan(&i, &mut AvailabilityMemory::default())
    else {
        panic!("a pool over its quota is refused");
    };
    assert_eq!(why, reason::INVALID_SPEC);
    let msg = &refused.condition(condition::PROGRESSING).unwrap().message;
    assert!(
        msg.contains("spec.replicas") && msg.contains("maxPoolReplicas (3)"),
        "{msg}"
    );
    assert!(check("web", &s, Quota::Refuse(3)).is_err());
    // Standalone: held to the quota.
    i.quota = Quota::Hold(3);
    let Round::Act(p) = plan(&i, &mut AvailabilityMemory::default()) else {
        panic!("a pool held to its quota acts");
    };
    assert_eq!((p.policy.replicas, p.policy.max_members), (3, 3));
    let n = p.decision.creates.len();
    assert!((1..=3).contains(&n), "{:?}", p.decision.creates);
}

#[test]
fn unusable_credentials_refuse_the_pool_and_credentials_being_made_wait() {
    let s = spec(1);
    let status = ProxyPoolStatus::default();
    let h = hosts();
    let mut i = inputs(&s, &[], &h, &status);
    i.credentials = PoolCredentials::Unusable("the Secret has no password");
    let r = plan(&i, &mut AvailabilityMemory::default());
    assert!(
        matches!(&r, Round::Refused { reason: REASON_CREDENTIALS_UNUSABLE, status, .. }
            if status.condition(condition::REPLICA_FAILURE).unwrap().message.contains("no password")),
        "{r:?}"
    );
    i.credentials = PoolCredentials::Pending;
    assert_eq!(
        plan(&i, &mut AvailabilityMemory::default()),
        Round::Wait(CREDENTIALS_RETRY)
    );
}

#[test]
fn a_round_records_the_selector_and_one_row_per_live_member_sorted() {
    let s = spec(3);
    let mut quarantined = member("web-q", true, 0);
    quarantined.quarantine = Some("banned".into());
    let mut going = member("web-d", true, 0);
    going.deleting = true;
    let members = [
        member("web-b", true, 0),
        quarantined,
        going,
        member("web-a", false, 0),
    ];
    let status = ProxyPoolStatus::default();
    let h = hosts();
    let Round::Act(p) = plan(
        &inputs(&s, &members, &h, &status),
        &mut AvailabilityMemory::default(),
    ) else {
        panic!("no plan");
    };
    assert_eq!(p.status.selector, "egress-proxies.dev/pool=web");
    let rows: Vec<(&str, bool, bool)> = p
        .status
        .members
        .iter()
        .map(|r| (r.name.as_str(), r.available, r.quarantined))
        .collect();
    assert_eq!(
        rows,
        [
            ("web-a", false, false),
            ("web-b", true, false),
            ("web-q", false, true)
        ],
        "sorted, the deleting member left out, a quarantined one never available"
    );
    assert_eq!(p.status.members[0].ip.as_deref(), Some("192.0.2.7"));
    assert_eq!(p.member_counts, [1, 1, 1, 1]);
    assert_eq!(p.status.members_omitted, 0);
    assert_eq!(p.template_hash, template_hash(&s.template, ""));
}

#[test]
fn a_member_s_first_availability_is_recorded_once_and_a_fresh_memory_records_none_at_first() {
    let mut mem = AvailabilityMemory::default();
    // A new process: the members available now became so before it started.
    assert!(
        mem.newly_available(&[member("web-a", true, 0)], at(50))
            .is_empty()
    );
    let m = [member("web-a", true, 0), member("web-b", true, 20)];
    assert_eq!(mem.newly_available(&m, at(50)), vec![30.0]);
    assert!(mem.newly_available(&m, at(60)).is_empty(), "twice");
    // Gone and back under the same name: recorded again (a new member).
    assert!(
        mem.newly_available(&[member("web-a", true, 0)], at(70))
            .is_empty()
    );
    assert!(!mem.contains("web-b"));
    // A memory read back from a driver's records: recorded members only.
    let mut kept = AvailabilityMemory::recorded(["web-a".to_owned()]);
    assert_eq!(kept.newly_available(&m, at(50)), vec![30.0]);
}

/// A driver that records its calls and fails the ones named in `fail`.
#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<String>>,
    fail: Vec<String>,
    started: bool,
}

impl PoolDriver for Recorder {
    type Error = String;

    async fn create(&self, member: &CreateMember) -> Result<(), String> {
        let call = format!("create {} on {}", member.name, member.host);
        lock(&self.calls).push(call.clone());
        if self.fail.iter().any(|f| f == "create") {
            return Err(call);
        }
        Ok(())
    }

    async fn unpublish(&self, u: &UnpublishMember) -> Result<(), String> {
        lock(&self.calls).push(format!("unpublish {} {}", u.name, u.marker));
        Ok(())
    }

    async fn delete(&self, name: &str) -> Result<bool, String> {
        lock(&self.calls).push(format!("delete {name}"));
        Ok(self.started)
    }

    async fn event(&self, event: &Event) {
        lock(&self.calls).push(format!("event {}", event.reason));
    }

    fn retire(&self, status: &ProxyPoolStatus) {
        lock(&self.calls).push(format!("retire {}", status.retired_addresses.len()));
    }

    async fn write_status(&self, status: &ProxyPoolStatus, changed: bool) -> Result<(), String> {
        lock(&self.calls).push(format!("status {} {changed}", status.replicas));
        Ok(())
    }

    async fn forget(&self) -> Result<(), String> {
        lock(&self.calls).push("forget".into());
        Ok(())
    }
}

fn metric_lines(m: &Metrics, needle: &str) -> Vec<String> {
    m.encode(MetricsFormat::Prometheus)
        .lines()
        .filter(|l| l.contains(needle) && !l.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn a_round_creates_then_deletes_then_announces_then_records_and_a_failed_create_stops_nothing()
 {
    // One member too many and one missing host slot: scale 2 → 1 with a stale member.
    let s = spec(1);
    let mut stale = member("web-old", true, 0);
    stale.template_hash = "0000000000".into();
    let members = [stale];
    let status = ProxyPoolStatus::default();
    let h = hosts();
    let round = plan(
        &inputs(&s, &members, &h, &status),
        &mut AvailabilityMemory::default(),
    );
    let Round::Act(p) = &round else {
        panic!("{round:?}")
    };
    assert_eq!(p.decision.creates.len(), 1, "{p:?}");
    let driver = Recorder {
        fail: vec!["create".into()],
        started: true,
        ..Recorder::default()
    };
    let metrics = Metrics::new();
    let r = carry_out(&driver, &metrics, "ns/web", &round, &status).await;
    assert!(r.is_err(), "the failed create is reported");
    let calls = lock(&driver.calls).clone();
    let kinds: Vec<&str> = calls.iter().map(|c| c.split(' ').next().unwrap()).collect();
    let first = |k: &str| kinds.iter().position(|x| *x == k);
    assert!(first("create") < first("status"), "{calls:?}");
    assert!(first("event") < first("status"), "{calls:?}");
    assert_eq!(kinds.last(), Some(&"status"), "{calls:?}");
    assert!(
        metric_lines(&metrics, "pool_members{").len() == 4,
        "members by state recorded"
    );
}

#[tokio::test]
async fn a_replacement_is_counted_only_when_the_driver_started_the_delete() {
    let s = spec(0);
    let members = [member("web-a", false, 0)];
    let status = ProxyPoolStatus::default();
    let h = hosts();
    for (started, counted) in [(false, 0), (true, 1)] {
        let round = plan(
            &inputs(&s, &members, &h, &status),
            &mut AvailabilityMemory::default(),
        );
        let driver = Recorder {
            started,
            ..Recorder::default()
        };
        let metrics = Metrics::new();
        carry_out(&driver, &metrics, "ns/web", &round, &status)
            .await
            .unwrap();
        assert!(lock(&driver.calls).contains(&"delete web-a".to_owned()));
        let n: usize = metric_lines(&metrics, "pool_replacements_total{")
            .iter()
            .filter(|l| l.ends_with(" 1"))
            .count();
        assert_eq!(n, counted, "started: {started}");
    }
}

#[tokio::test]
async fn a_finished_removal_lets_the_pool_go_and_drops_its_series() {
    let s = spec(1);
    let status = ProxyPoolStatus::default();
    let h = hosts();
    let metrics = Metrics::new();
    metrics.set_pool_members("ns/web", [1, 0, 0, 0]);
    let mut i = inputs(&s, &[], &h, &status);
    i.deleting = true;
    let round = plan(&i, &mut AvailabilityMemory::default());
    let driver = Recorder::default();
    let done = carry_out(&driver, &metrics, "ns/web", &round, &status)
        .await
        .unwrap();
    assert!(done.finished);
    assert_eq!(*lock(&driver.calls), ["forget"]);
    assert!(metric_lines(&metrics, "pool=\"ns/web\"").is_empty());
}

/// A running member on host `a` created 100 s after the epoch.
fn running(name: &str, available: bool) -> Member {
    let mut m = Member::expected(
        name,
        "a",
        "h1",
        SystemTime::UNIX_EPOCH + Duration::from_secs(100),
    );
    m.phase = Phase::Running;
    m.ready = available;
    m.available = available;
    m
}

#[test]
fn a_member_s_create_to_available_time_is_recorded_once_and_forgotten_with_it() {
    let at = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
    let mut mem = AvailabilityMemory::default();
    // The first round of this process: nothing available yet.
    assert!(
        mem.newly_available(&[running("web-a", false)], at(101))
            .is_empty()
    );
    // Available: recorded once, from its creation time.
    let m = [running("web-a", true), running("web-b", false)];
    assert_eq!(mem.newly_available(&m, at(130)), vec![30.0]);
    assert!(mem.newly_available(&m, at(140)).is_empty(), "twice");
    // Unavailable, then available again: still once.
    let m2 = [running("web-a", false), running("web-b", true)];
    assert_eq!(mem.newly_available(&m2, at(150)), vec![50.0]);
    assert!(mem.newly_available(&m, at(160)).is_empty(), "again");
    // Gone: forgotten, the memory bounded by the live members.
    assert!(
        mem.newly_available(&[running("web-b", true)], at(170))
            .is_empty()
    );
    assert!(mem.contains("web-b") && !mem.contains("web-a"));
}

#[test]
fn members_available_when_a_new_leader_first_sees_the_pool_are_not_recorded_again() {
    let mut mem = AvailabilityMemory::default();
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
    let m = [running("web-a", true), running("web-b", false)];
    assert!(mem.newly_available(&m, now).is_empty());
    let m = [running("web-a", true), running("web-b", true)];
    assert_eq!(mem.newly_available(&m, now), vec![900.0]);
}

#[test]
fn members_are_counted_by_state_each_once() {
    let mut q = running("web-q", true);
    q.quarantine = Some("banned".into());
    let mut d = running("web-d", true);
    d.quarantine = Some("banned".into());
    d.deleting = true;
    let m = [running("web-a", true), running("web-b", false), q, d];
    assert_eq!(state_counts(&m), [1, 1, 1, 1]);
}

#[tokio::test]
async fn a_member_lost_with_its_host_is_replaced_kept_then_deleted_as_host_lost_on_its_return() {
    let s = spec(1);
    let mut h = vec![
        PoolHost {
            name: "h1".into(),
            state: Some(HostState::Timeout),
            maintenance: Default::default(),
            dead_since: Some(at(0)),
            ready_since: None,
            segment: None,
        },
        PoolHost {
            name: "h2".into(),
            state: Some(HostState::Ready),
            maintenance: Default::default(),
            dead_since: None,
            ready_since: None,
            segment: None,
        },
    ];
    // Round 1: h1 dead for 100 s (> the default 60 s): replaced on h2, not deleted.
    let members = vec![member("web-a", true, 0)];
    let status = ProxyPoolStatus::default();
    let round = plan(
        &inputs(&s, &members, &h, &status),
        &mut AvailabilityMemory::default(),
    );
    let Round::Act(p) = &round else {
        panic!("{round:?}")
    };
    let lost = p.decision.status.clone();
    assert_eq!(lost.lost_members.len(), 1);
    let driver = Recorder {
        started: true,
        ..Recorder::default()
    };
    let metrics = Metrics::new();
    carry_out(&driver, &metrics, "ns/web", &round, &status)
        .await
        .unwrap();
    let calls = lock(&driver.calls).clone();
    assert!(
        calls
            .iter()
            .any(|c| c.starts_with("create ") && c.ends_with(" on h2")),
        "{calls:?}"
    );
    assert!(!calls.iter().any(|c| c.starts_with("delete")), "{calls:?}");
    assert!(calls.contains(&"event HostLost".to_owned()), "{calls:?}");

    // Round 2: the replacement is available and h1 answers again: the old copy goes, counted
    // as `host-lost`.
    h[0].state = Some(HostState::Ready);
    h[0].dead_since = None;
    let mut repl = member("web-b", true, 90);
    repl.host = Some("h2".into());
    let members = vec![member("web-a", true, 0), repl];
    let round = plan(
        &inputs(&s, &members, &h, &lost),
        &mut AvailabilityMemory::default(),
    );
    let driver = Recorder {
        started: true,
        ..Recorder::default()
    };
    carry_out(&driver, &metrics, "ns/web", &round, &lost)
        .await
        .unwrap();
    let calls = lock(&driver.calls).clone();
    assert!(calls.contains(&"delete web-a".to_owned()), "{calls:?}");
    assert_eq!(
        metric_lines(&metrics, "cause=\"host-lost\""),
        ["egress_proxies_pool_replacements_total{pool=\"ns/web\",cause=\"host-lost\"} 1"]
    );
}

#[tokio::test]
async fn a_planned_removal_is_unpublished_through_the_driver_and_deleted_after_the_grace() {
    // The path both drivers share: scale 2 → 1 with a 5m grace.
    let s: ProxyPoolSpec = serde_saphyr::from_str(
        "replicas: 1\nupdate:\n  drainGrace: 5m\ntemplate:\n  spec:\n    provider: home\n    \
         image: debian-12\n    proxy:\n      allowedClientCidrs: [10.0.0.0/8]\n",
    )
    .unwrap();
    let mut members = vec![member("web-a", true, 0), member("web-b", true, 10)];
    let status = ProxyPoolStatus::default();
    let h = hosts();
    let mut i = inputs(&s, &members, &h, &status);
    i.now = at(100);
    let round = plan(&i, &mut AvailabilityMemory::default());
    let driver = Recorder {
        started: true,
        ..Recorder::default()
    };
    let metrics = Metrics::new();
    let done = carry_out(&driver, &metrics, "ns/web", &round, &status)
        .await
        .unwrap();
    let calls = lock(&driver.calls).clone();
    let marker = crate::pool::member::Drain {
        since: at(100),
        cause: DeleteCause::ScaleIn,
    }
    .marker();
    assert!(
        calls.contains(&format!("unpublish web-a {marker}")),
        "{calls:?}"
    );
    assert!(!calls.iter().any(|c| c.starts_with("delete")), "{calls:?}");
    assert_eq!(done.requeue_after, Some(Duration::from_secs(300)));
    let Round::Act(p) = &round else {
        panic!("{round:?}")
    };
    let row = p.status.members.iter().find(|m| m.name == "web-a").unwrap();
    assert!(!row.available && row.draining_since.is_some(), "{row:?}");
    assert_eq!(
        p.member_counts,
        [1, 0, 0, 1],
        "the unpublished one counts as deleting"
    );
    // The next rounds read the marker back from the member (a restart reads the same).
    members[0].draining = Some(crate::pool::member::Drain::parse(&marker));
    members[0].available = false;
    for (t, deleted) in [(399, false), (400, true)] {
        let mut i = inputs(&s, &members, &h, &p.status);
        i.now = at(t);
        let round = plan(&i, &mut AvailabilityMemory::default());
        let driver = Recorder {
            started: true,
            ..Recorder::default()
        };
        carry_out(&driver, &metrics, "ns/web", &round, &p.status)
            .await
            .unwrap();
        let calls = lock(&driver.calls).clone();
        assert_eq!(
            calls.contains(&"delete web-a".to_owned()),
            deleted,
            "at {t}: {calls:?}"
        );
        assert!(
            !calls.iter().any(|c| c.starts_with("unpublish")),
            "{calls:?}"
        );
    }
    // Counted once, at the delete, with the cause it was removed for.
    assert!(
        metric_lines(&metrics, "pool_replacements_total{")
            .iter()
            .any(|l| l.contains("scale-in") && l.ends_with(" 1")),
        "{:?}",
        metric_lines(&metrics, "pool_replacements_total{")
    );
}
