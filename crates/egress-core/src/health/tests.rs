#![allow(clippy::unwrap_used, clippy::indexing_slicing)]
use super::*;

fn settings() -> HealthSettings {
    HealthSettings::new(CheckTarget::parse("http://127.0.0.1:9/").unwrap())
}

fn addr() -> SocketAddr {
    "192.0.2.10:3128".parse().unwrap()
}

fn ok(ip: &str) -> ProbeResult {
    ProbeResult::Ok(ProbeSuccess {
        egress_ip: ip.parse().unwrap(),
        latency: Duration::from_millis(12),
    })
}

fn failed() -> ProbeResult {
    ProbeResult::Failed(ProbeError::Connect("connection refused".into()))
}

fn t(s: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + s)
}

#[test]
fn hysteresis_needs_consecutive_results_in_both_directions() {
    let s = settings();
    let mut h = ProxyHealth::default();
    h.record(addr(), &ok("203.0.113.7"), None, &s, t(0));
    assert_eq!(h.state, HealthState::Unknown, "one success is not enough");
    h.record(addr(), &ok("203.0.113.7"), None, &s, t(1));
    assert_eq!(h.state, HealthState::Healthy);
    for i in 0..DEFAULT_UNHEALTHY_AFTER - 1 {
        h.record(addr(), &failed(), None, &s, t(2 + u64::from(i)));
        assert_eq!(
            h.state,
            HealthState::Healthy,
            "failure {i} keeps it healthy"
        );
    }
    h.record(addr(), &failed(), None, &s, t(9));
    assert_eq!(h.state, HealthState::Unhealthy);
    assert_eq!(h.reason, reason::PROBE_FAILED);
    assert!(h.message.contains("ProxyUnreachable"), "{}", h.message);
    assert_eq!(h.consecutive_failures, DEFAULT_UNHEALTHY_AFTER);
    assert_eq!(
        h.egress_ip,
        Some("203.0.113.7".parse().unwrap()),
        "last egress kept"
    );
}

#[test]
fn an_egress_outside_the_expected_cidr_is_unhealthy_at_once_with_both_addresses() {
    let s = settings();
    let mut h = ProxyHealth::default();
    h.record(
        addr(),
        &ok("198.51.100.1"),
        Some("203.0.113.0/24"),
        &s,
        t(0),
    );
    assert_eq!(h.state, HealthState::Unhealthy);
    assert_eq!(h.reason, reason::EGRESS_MISMATCH);
    assert!(h.message.contains("198.51.100.1") && h.message.contains("203.0.113.0/24"));
    h.record(addr(), &ok("203.0.113.9"), Some("203.0.113.0/24"), &s, t(1));
    h.record(addr(), &ok("203.0.113.9"), Some("203.0.113.0/24"), &s, t(2));
    assert_eq!(h.state, HealthState::Healthy);
}

#[test]
fn egress_matching_handles_ips_cidrs_and_families() {
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    assert!(egress_matches("203.0.113.7", ip("203.0.113.7")));
    assert!(!egress_matches("203.0.113.7", ip("203.0.113.8")));
    assert!(egress_matches("203.0.113.0/24", ip("203.0.113.200")));
    assert!(egress_matches("0.0.0.0/0", ip("8.8.8.8")));
    assert!(egress_matches("2001:db8::/32", ip("2001:db8:1::5")));
    assert!(!egress_matches("2001:db8::/32", ip("203.0.113.7")));
    assert!(!egress_matches("nonsense", ip("203.0.113.7")));
}

#[tokio::test]
async fn a_new_address_resets_the_state_but_an_unprobed_round_keeps_it() {
    // finding: H3
    let s = settings();
    let mut h = ProxyHealth::default();
    h.record(addr(), &ok("203.0.113.7"), None, &s, t(0));
    h.record(addr(), &ok("203.0.113.7"), None, &s, t(1));
    assert_eq!(h.state, HealthState::Healthy);

    // An address gap: the instance's address read failed transiently, so the Proxy is
    // briefly Provisioning without an address. It is not a probe target then ...
    let uid = ProxyUid::parse_strict("0f8fad5b-d9cb-469f-a165-70867728950e").unwrap();
    let spec = crate::model::ProxySettings {
        port: 3128,
        ..crate::model::ProxySettings::default()
    };
    let gap = ProxyStatus {
        phase: Phase::Provisioning,
        ip: None,
        ..ProxyStatus::default()
    };
    assert!(ProbeTarget::of(uid, "default/p1".into(), "local", &spec, None, &gap).is_none());
    // ... and rounds that do not probe it keep its state, Healthy, with its counts.
    let engine = HealthEngine::new(settings());
    lock(&engine.states).insert(uid, h.clone());
    for _ in 0..3 {
        let r = tokio::time::timeout(Duration::from_secs(5), engine.round(Vec::new()))
            .await
            .expect("an empty round finishes at once");
        assert_eq!(r.probed, 0);
    }
    let kept = engine.get(&uid).unwrap();
    assert_eq!(kept, h, "an unprobed round changes nothing");
    // Its status keeps what was seen through the gap (healthy, the egress address); the
    // condition says it is not running rather than unhealthy.
    let mut st = gap.clone();
    apply_to_status(&mut st, Some(&kept), None, t(2), 1);
    let hs = st.health.clone().unwrap();
    assert_eq!(hs.healthy, Some(true), "{st:?}");
    assert_eq!(hs.egress_ip.as_deref(), Some("203.0.113.7"));
    assert_ne!(
        st.condition(condition::HEALTHY).unwrap().status,
        ConditionStatus::False,
        "{st:?}"
    );
    // The same address back: one more success, still Healthy (no start over).
    let back = running();
    let target = ProbeTarget::of(uid, "default/p1".into(), "local", &spec, None, &back).unwrap();
    assert_eq!(target.endpoint.addr, addr());
    h.record(addr(), &ok("203.0.113.7"), None, &s, t(3));
    assert_eq!(h.state, HealthState::Healthy);
    assert_eq!(h.consecutive_successes, 3);

    let other: SocketAddr = "192.0.2.11:3128".parse().unwrap();
    h.record(other, &ok("203.0.113.7"), None, &s, t(2));
    assert_eq!(
        h.state,
        HealthState::Unknown,
        "a replaced instance starts over"
    );
    assert_eq!(h.consecutive_successes, 1);
}

fn running() -> ProxyStatus {
    let mut st = ProxyStatus {
        phase: Phase::Running,
        ip: Some("192.0.2.10".into()),
        ..ProxyStatus::default()
    };
    st.set_condition(Condition::new(
        condition::READY,
        ConditionStatus::True,
        "Running",
        "running",
        "2026-01-01T00:00:00Z",
        1,
    ));
    st
}

#[test]
fn ready_is_running_and_healthy_and_keeps_its_transition_time() {
    let s = settings();
    let mut h = ProxyHealth::default();
    h.record(addr(), &ok("203.0.113.7"), None, &s, t(0));
    // Not decided yet: Ready False, Healthy Unknown.
    let mut st = running();
    apply_to_status(&mut st, Some(&h), None, t(0), 1);
    assert_eq!(
        st.condition(condition::HEALTHY).unwrap().status,
        ConditionStatus::Unknown
    );
    let ready = st.condition(condition::READY).unwrap().clone();
    assert_eq!(ready.status, ConditionStatus::False);
    assert_eq!(ready.reason, reason::NOT_HEALTHY);
    // The next reconcile sets Ready True again; merging keeps the earlier False's time.
    let prev = st.clone();
    let mut next = running();
    apply_to_status(&mut next, Some(&h), Some(&prev), t(30), 1);
    assert_eq!(
        next.condition(condition::READY)
            .unwrap()
            .last_transition_time,
        ready.last_transition_time
    );
    // Healthy: Ready True.
    h.record(addr(), &ok("203.0.113.7"), None, &s, t(31));
    let mut st = running();
    apply_to_status(&mut st, Some(&h), Some(&next), t(31), 1);
    assert_eq!(
        st.condition(condition::READY).unwrap().status,
        ConditionStatus::True
    );
    assert_eq!(
        st.condition(condition::HEALTHY).unwrap().reason,
        reason::PROBE_SUCCEEDED
    );
    let hs = st.health.unwrap();
    assert_eq!(hs.healthy, Some(true));
    assert_eq!(hs.egress_ip.as_deref(), Some("203.0.113.7"));
    assert_eq!(hs.latency_ms, Some(12));
}

#[test]
fn a_proxy_that_is_not_running_is_never_ready_through_health() {
    let mut st = ProxyStatus {
        phase: Phase::Provisioning,
        ..ProxyStatus::default()
    };
    apply_to_status(&mut st, None, None, t(0), 1);
    assert_eq!(
        st.condition(condition::HEALTHY).unwrap().reason,
        reason::NOT_RUNNING
    );
    assert!(
        st.condition(condition::READY).is_none(),
        "Ready stays the controller's"
    );
}

#[test]
fn the_healthy_list_holds_only_running_healthy_members() {
    let mut a = running();
    a.health = Some(HealthStatus {
        healthy: Some(true),
        ..HealthStatus::default()
    });
    let mut b = running();
    b.ip = Some("2001:db8::5".into());
    b.health = a.health.clone();
    let mut c = running();
    c.health = Some(HealthStatus {
        healthy: Some(false),
        ..HealthStatus::default()
    });
    let d = running();
    let list = healthy_endpoints([(&a, 3128), (&b, 1080), (&c, 3128), (&d, 3128)]);
    let text: Vec<String> = list.iter().map(ToString::to_string).collect();
    assert_eq!(text, ["192.0.2.10:3128", "[2001:db8::5]:1080"]);
}

#[test]
fn a_proxy_held_unready_by_health_becomes_ready_when_healthy_without_a_reconcile() {
    let s = settings();
    let mut h = ProxyHealth::default();
    h.record(addr(), &ok("203.0.113.7"), None, &s, t(0));
    let mut st = running();
    apply_to_status(&mut st, Some(&h), None, t(0), 1);
    assert_eq!(
        st.condition(condition::READY).unwrap().status,
        ConditionStatus::False
    );
    h.record(addr(), &ok("203.0.113.7"), None, &s, t(30));
    let prev = st.clone();
    apply_to_status(&mut st, Some(&h), Some(&prev), t(30), 1);
    let ready = st.condition(condition::READY).unwrap();
    assert_eq!(ready.status, ConditionStatus::True, "{ready:?}");
}

#[tokio::test(start_paused = true)]
async fn rounds_start_on_a_fixed_cadence_and_an_overrun_is_followed_at_once_never_overlapping() {
    // Rounds of 3 s on a 5 s cadence (no jitter), one of 7 s among them, and a host reported
    // down during the fifth.
    let took = [3, 3, 7, 3, 3, 3].map(Duration::from_secs);
    let t0 = tokio::time::Instant::now();
    let wake = tokio::sync::Notify::new();
    let stop = CancellationToken::new();
    let mut n = 0;
    let mut spans: Vec<(Duration, Duration)> = Vec::new();
    on_cadence(
        || Duration::from_secs(5),
        &wake,
        &stop,
        || {
            let i = n;
            n += 1;
            let (wake, d) = (&wake, took.get(i).copied().unwrap_or_default());
            async move {
                let start = tokio::time::Instant::now();
                if i == 4 {
                    wake.notify_one();
                }
                tokio::time::sleep(d).await;
                (start - t0, tokio::time::Instant::now() - t0)
            }
        },
        |span| {
            if spans.len() < took.len() {
                spans.push(span);
            }
            if spans.len() == took.len() {
                stop.cancel();
            }
        },
    )
    .await;
    let secs = |s: u64| Duration::from_secs(s);
    let starts: Vec<Duration> = spans.iter().map(|s| s.0).collect();
    // Every 5 s from the previous start (not 5 s after its end: 0, 8, 16, ...); the 7 s
    // round is followed at once when it ends (17), and the cadence counts from there; the
    // wake-up during the round at 22 starts the next one when it ends (25, not 27).
    assert_eq!(starts, [0, 5, 10, 17, 22, 25].map(secs), "{spans:?}");
    for w in spans.windows(2) {
        assert!(w[1].0 >= w[0].1, "rounds overlap: {spans:?}");
    }
    assert_eq!(spans[2].1, secs(17), "{spans:?}");
}

#[test]
fn a_reconcile_that_started_a_new_instance_drops_the_old_instances_health() {
    // A guest re-created in place keeps its address, so nothing but the reconcile that
    // started it tells the engine the Healthy results belong to the instance that died.
    let s = settings();
    let uid = ProxyUid::parse_strict("7c9e6679-7425-40de-944b-e07fc1f90ae7").unwrap();
    let mut h = ProxyHealth::default();
    h.record(addr(), &ok("203.0.113.7"), None, &s, t(0));
    h.record(addr(), &ok("203.0.113.7"), None, &s, t(1));
    assert_eq!(h.state, HealthState::Healthy);
    let engine = HealthEngine::new(s);
    lock(&engine.states).insert(uid, h);
    let running = ProxyStatus {
        phase: Phase::Running,
        ip: Some(addr().ip().to_string()),
        ..ProxyStatus::default()
    };
    let healthy = |st: &ProxyStatus| st.condition(condition::HEALTHY).map(|c| c.status);

    // A reconcile that started nothing: the instance's own state stands.
    let mut st = running.clone();
    engine.merge_reconcile(&uid, &mut st, &running, false, t(2), 1);
    assert_eq!(healthy(&st), Some(ConditionStatus::True), "{st:?}");
    assert!(engine.get(&uid).is_some());

    // The reconcile that re-created it: awaiting its own checks, the old state gone.
    let mut st = running.clone();
    engine.merge_reconcile(&uid, &mut st, &running, true, t(3), 1);
    assert_eq!(healthy(&st), Some(ConditionStatus::Unknown), "{st:?}");
    assert_eq!(
        st.condition(condition::HEALTHY).unwrap().reason,
        reason::AWAITING_PROBE
    );
    assert_eq!(st.health, None, "{st:?}");
    assert!(engine.get(&uid).is_none());
}
