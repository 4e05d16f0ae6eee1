//! The proxy health engine through real proxies on loopback: an in-process HTTP CONNECT proxy
//! and SOCKS5 proxy (ep_operator_fixtures::health_proxies) in front of the real echo target
//! (`egress_web::echo::serve`). Everything listens and connects on 127.0.0.1 only.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use ep_operator_fixtures::health_proxies as health_support;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use egress_core::controller::ProxyCredentials;
use egress_core::health::probe::{CheckTarget, ProbeError, ProxyEndpoint, probe};
use egress_core::health::{
    DEFAULT_UNHEALTHY_AFTER, HealthEngine, HealthSettings, HealthState, ProbeTarget, reason,
};
use egress_core::model::ProxyProtocol;
use egress_provider::ProxyUid;
use health_support::{ProxyBehaviour, http_proxy, socks5_proxy, start_echo};

/// Bound on one probe in these tests (loopback answers in milliseconds).
const PROBE_DEADLINE: Duration = Duration::from_secs(5);

fn target(echo: SocketAddr) -> CheckTarget {
    CheckTarget::parse(&format!("http://{echo}/")).unwrap()
}

fn endpoint(
    addr: SocketAddr,
    protocol: ProxyProtocol,
    creds: Option<(&str, &str)>,
) -> ProxyEndpoint {
    ProxyEndpoint {
        addr,
        protocol,
        credentials: creds.map(|(u, p)| ProxyCredentials {
            username: u.into(),
            password: p.into(),
        }),
    }
}

fn uid(n: u8) -> ProxyUid {
    ProxyUid(uuid_from(n))
}

fn uuid_from(n: u8) -> uuid::Uuid {
    uuid::Uuid::from_bytes([n; 16])
}

fn ptarget(n: u8, ep: ProxyEndpoint, expected: Option<&str>) -> ProbeTarget {
    ProbeTarget {
        uid: uid(n),
        key: format!("default/p{n}"),
        entry: "local".into(),
        host: "h1".into(),
        endpoint: ep,
        expected_egress: expected.map(str::to_owned),
        declared: Vec::new(),
    }
}

fn settings(echo: SocketAddr) -> HealthSettings {
    let mut s = HealthSettings::new(target(echo));
    s.probe_timeout = PROBE_DEADLINE;
    s
}

#[tokio::test]
async fn a_probe_through_an_http_connect_proxy_records_latency_and_the_egress_ip_the_echo_saw() {
    // finding: L15
    // The proxy keeps the client connection open 2 s after the answer (a slow teardown):
    // the probe's latency covers the probe only, and the probe does not wait for the close.
    let linger = Duration::from_secs(2);
    let (echo, _e) = start_echo().await;
    let p = http_proxy(
        "127.0.0.1:0",
        ProxyBehaviour {
            linger,
            ..ProxyBehaviour::default()
        },
    )
    .await;
    println!("proxy {} echo {echo}", p.addr);
    let t0 = Instant::now();
    let ok = probe(
        &endpoint(p.addr, ProxyProtocol::Http, None),
        &target(echo),
        PROBE_DEADLINE,
    )
    .await
    .unwrap();
    let wall = t0.elapsed();
    assert_eq!(ok.egress_ip.to_string(), "127.0.0.1");
    assert!(ok.latency > Duration::ZERO);
    assert!(ok.latency < linger, "teardown not timed: {:?}", ok.latency);
    assert!(
        wall < linger,
        "the probe did not wait for the close: {wall:?}"
    );
    assert_eq!(
        p.tunnels.load(Ordering::SeqCst),
        1,
        "went through the proxy"
    );
}

#[tokio::test]
async fn basic_auth_is_sent_and_a_wrong_password_fails_as_an_auth_error() {
    let (echo, _e) = start_echo().await;
    let p = http_proxy(
        "127.0.0.1:0",
        ProxyBehaviour {
            credentials: Some(("alice".into(), "s3cr3t-pw".into())),
            ..ProxyBehaviour::default()
        },
    )
    .await;
    let good = endpoint(p.addr, ProxyProtocol::Http, Some(("alice", "s3cr3t-pw")));
    let ok = probe(&good, &target(echo), PROBE_DEADLINE).await.unwrap();
    assert_eq!(ok.egress_ip.to_string(), "127.0.0.1");
    let bad = endpoint(p.addr, ProxyProtocol::Http, Some(("alice", "wrong")));
    let e = probe(&bad, &target(echo), PROBE_DEADLINE)
        .await
        .unwrap_err();
    assert!(matches!(e, ProbeError::Auth(_)), "{e:?}");
    assert!(
        !e.to_string().contains("wrong"),
        "no password in errors: {e}"
    );
    let none = endpoint(p.addr, ProxyProtocol::Http, None);
    let e = probe(&none, &target(echo), PROBE_DEADLINE)
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "ProxyAuthFailed");
}

#[tokio::test]
async fn the_socks5_path_works_with_and_without_credentials() {
    let (echo, _e) = start_echo().await;
    let open = socks5_proxy("127.0.0.1:0", ProxyBehaviour::default()).await;
    let ok = probe(
        &endpoint(open.addr, ProxyProtocol::Socks5, None),
        &target(echo),
        PROBE_DEADLINE,
    )
    .await
    .unwrap();
    assert_eq!(ok.egress_ip.to_string(), "127.0.0.1");
    let authed = socks5_proxy(
        "127.0.0.1:0",
        ProxyBehaviour {
            credentials: Some(("bob".into(), "pw-1".into())),
            ..ProxyBehaviour::default()
        },
    )
    .await;
    let ok = probe(
        &endpoint(authed.addr, ProxyProtocol::Socks5, Some(("bob", "pw-1"))),
        &target(echo),
        PROBE_DEADLINE,
    )
    .await
    .unwrap();
    assert_eq!(ok.egress_ip.to_string(), "127.0.0.1");
    let e = probe(
        &endpoint(authed.addr, ProxyProtocol::Socks5, Some(("bob", "nope"))),
        &target(echo),
        PROBE_DEADLINE,
    )
    .await
    .unwrap_err();
    assert!(matches!(e, ProbeError::Auth(_)), "{e:?}");
    assert_eq!(authed.tunnels.load(Ordering::SeqCst), 1);
}

/// An HTTP proxy that closes its connections numbered in `drop` (from 1) at once (lost
/// probes).
async fn lossy(drop: std::ops::Range<usize>) -> health_support::TestProxy {
    http_proxy(
        "127.0.0.1:0",
        ProxyBehaviour {
            drop,
            ..ProxyBehaviour::default()
        },
    )
    .await
}

/// A proxy made Healthy through `engine` (one round with the re-check, two without), and
/// its target.
async fn healthy(engine: &HealthEngine, p: &health_support::TestProxy) -> ProbeTarget {
    let t = ptarget(1, endpoint(p.addr, ProxyProtocol::Http, None), None);
    let r = engine.round(vec![t.clone()]).await;
    if engine.settings().recheck {
        assert_eq!(
            r.rechecked, 1,
            "a new proxy's first pass is confirmed at once"
        );
    } else {
        assert_eq!(engine.get(&uid(1)).unwrap().state, HealthState::Unknown);
        engine.round(vec![t.clone()]).await;
    }
    let h = engine.get(&uid(1)).unwrap();
    assert_eq!(h.state, HealthState::Healthy);
    assert_eq!(h.egress_ip.unwrap().to_string(), "127.0.0.1");
    t
}

#[tokio::test]
async fn without_the_recheck_a_dead_proxy_flips_to_unhealthy_only_after_n_consecutive_failures() {
    let (echo, _e) = start_echo().await;
    let p = http_proxy("127.0.0.1:0", ProxyBehaviour::default()).await;
    let mut s = settings(echo);
    s.recheck = false;
    s.unhealthy_after = 3;
    let engine = HealthEngine::new(s);
    let t = healthy(&engine, &p).await;
    // The proxy dies (its port now refuses connections).
    p.stop();
    drop(p);
    tokio::time::sleep(Duration::from_millis(50)).await;
    for i in 1..3 {
        let r = engine.round(vec![t.clone()]).await;
        assert_eq!((r.succeeded, r.rechecked), (0, 0));
        let h = engine.get(&uid(1)).unwrap();
        assert_eq!(
            h.state,
            HealthState::Healthy,
            "after {i} failure(s) it is still healthy"
        );
        assert_eq!(h.consecutive_failures, i);
    }
    engine.round(vec![t.clone()]).await;
    let h = engine.get(&uid(1)).unwrap();
    assert_eq!(h.state, HealthState::Unhealthy);
    assert_eq!(h.reason, reason::PROBE_FAILED);
    assert!(h.message.contains("ProxyUnreachable"), "{}", h.message);
}

#[tokio::test]
async fn a_failed_check_is_rechecked_at_once_so_a_dead_proxy_goes_in_one_round() {
    let (echo, _e) = start_echo().await;
    let p = http_proxy("127.0.0.1:0", ProxyBehaviour::default()).await;
    let engine = HealthEngine::new(settings(echo));
    assert_eq!(DEFAULT_UNHEALTHY_AFTER, 2);
    let t = healthy(&engine, &p).await;
    p.stop();
    drop(p);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let r = engine.round(vec![t.clone()]).await;
    assert_eq!((r.probed, r.succeeded, r.rechecked), (1, 0, 1));
    let h = engine.get(&uid(1)).unwrap();
    assert_eq!(h.state, HealthState::Unhealthy, "{h:?}");
    assert_eq!(h.consecutive_failures, 2);
    assert!(h.message.contains("ProxyUnreachable"), "{}", h.message);
    assert_eq!(
        r.became_unhealthy,
        [(uid(1), t.key.clone())],
        "the round that turned it Unhealthy names it (its driver reconciles it now)"
    );
    // Unhealthy: the next failure is not re-checked (nothing to decide), and the round names
    // no transition.
    let r = engine.round(vec![t.clone()]).await;
    assert_eq!(r.rechecked, 0);
    assert!(r.became_unhealthy.is_empty(), "{r:?}");
}

#[tokio::test]
async fn one_lost_probe_whose_recheck_passes_keeps_the_proxy_published() {
    let (echo, _e) = start_echo().await;
    // The proxy drops its 3rd connection: the first check after it became Healthy.
    let p = lossy(3..4).await;
    let engine = HealthEngine::new(settings(echo));
    let t = healthy(&engine, &p).await;
    let r = engine.round(vec![t.clone()]).await;
    assert_eq!((r.succeeded, r.rechecked), (1, 1), "lost probe re-checked");
    let h = engine.get(&uid(1)).unwrap();
    assert_eq!(h.state, HealthState::Healthy, "{h:?}");
    assert_eq!(h.consecutive_failures, 0);
    assert_eq!(
        p.tunnels.load(Ordering::SeqCst),
        3,
        "the first round and its confirmation, then the lost probe's re-check"
    );
}

#[tokio::test]
async fn a_proxy_never_healthy_joins_in_the_round_it_first_answers_and_a_recovered_one_needs_two() {
    let (echo, _e) = start_echo().await;
    // `p` loses its connections 1-2 (a guest still booting: both checks of its first round),
    // `q` its 3-4 (once it was Healthy: both checks of its second round).
    let p = lossy(1..3).await;
    let q = lossy(3..5).await;
    let engine = HealthEngine::new(settings(echo));
    let t = ptarget(1, endpoint(p.addr, ProxyProtocol::Http, None), None);
    let state = || engine.get(&uid(1)).unwrap();
    // Booting: it fails and its re-check fails.
    let r = engine.round(vec![t.clone()]).await;
    assert_eq!((r.succeeded, r.rechecked), (0, 1));
    assert_eq!(state().state, HealthState::Unhealthy);
    // It answers: the pass is confirmed in the same round.
    let r = engine.round(vec![t.clone()]).await;
    assert_eq!((r.succeeded, r.rechecked), (1, 1));
    assert_eq!(state().state, HealthState::Healthy, "{:?}", state());
    assert_eq!(state().consecutive_successes, 2);

    // Another proxy: Healthy in its first round, then lost in one round.
    let t = ptarget(2, endpoint(q.addr, ProxyProtocol::Http, None), None);
    let state = || engine.get(&uid(2)).unwrap();
    let r = engine.round(vec![t.clone()]).await;
    assert_eq!((r.succeeded, r.rechecked), (1, 1));
    assert_eq!(state().state, HealthState::Healthy);
    let r = engine.round(vec![t.clone()]).await;
    assert_eq!((r.succeeded, r.rechecked), (0, 1));
    assert_eq!(state().state, HealthState::Unhealthy);
    // Back: once Healthy, a pass is not confirmed at once; it needs two rounds again.
    let r = engine.round(vec![t.clone()]).await;
    assert_eq!((r.succeeded, r.rechecked), (1, 0));
    assert_eq!(state().state, HealthState::Unhealthy, "{:?}", state());
    engine.round(vec![t.clone()]).await;
    assert_eq!(state().state, HealthState::Healthy);

    // A new instance (re-created in place on its address) is new again.
    engine.new_instance(&uid(2));
    let r = engine.round(vec![t.clone()]).await;
    assert_eq!((r.succeeded, r.rechecked), (1, 1));
    assert_eq!(state().state, HealthState::Healthy);
}

#[tokio::test]
async fn a_host_reported_down_makes_one_failure_enough_and_wakes_the_engine() {
    use egress_provider::model::{HostReport, HostState};
    let (echo, _e) = start_echo().await;
    let p = http_proxy("127.0.0.1:0", ProxyBehaviour::default()).await;
    // Without the re-check and with three failures needed, only the host report can make
    // one failure enough.
    let mut s = settings(echo);
    s.interval = Duration::from_secs(3600);
    s.jitter = Duration::ZERO;
    s.recheck = false;
    s.unhealthy_after = 3;
    let engine = std::sync::Arc::new(HealthEngine::new(s));
    let t = healthy(&engine, &p).await;
    let live = http_proxy("127.0.0.1:0", ProxyBehaviour::default()).await;
    let mut other = ptarget(2, endpoint(live.addr, ProxyProtocol::Http, None), None);
    other.host = "h1".into();
    p.stop();
    drop(p);
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The engine runs rounds an hour apart; it has done its first one.
    let rounds = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let stop = tokio_util::sync::CancellationToken::new();
    let (e2, r2, targets) = (
        engine.clone(),
        rounds.clone(),
        vec![t.clone(), other.clone()],
    );
    let run = tokio::spawn(e2.run(
        move || targets.clone(),
        move |_| {
            r2.fetch_add(1, Ordering::SeqCst);
        },
        stop.clone(),
    ));
    let deadline = Instant::now() + Duration::from_secs(10);
    while rounds.load(Ordering::SeqCst) < 1 {
        assert!(Instant::now() < deadline, "first round");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // One failure: still Healthy.
    assert_eq!(engine.get(&uid(1)).unwrap().state, HealthState::Healthy);
    let report = |state| HostReport {
        host: "h1".into(),
        state,
        latency: None,
        hostname: None,
        libvirt_version: None,
        virt_types: Vec::new(),
        uefi: false,
        pool_free_bytes: None,
        missing: Vec::new(),
        error: None,
        addresses: Vec::new(),
    };
    let woken = Instant::now();
    engine.hosts_reported("local", &[report(HostState::Unreachable)]);
    while rounds.load(Ordering::SeqCst) < 2 {
        assert!(
            Instant::now() < deadline,
            "the report ends the hour's pause"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!("round after the host report: {:?}", woken.elapsed());
    let h = engine.get(&uid(1)).unwrap();
    assert_eq!(h.state, HealthState::Unhealthy, "{h:?}");
    assert_eq!(h.consecutive_failures, 2);
    assert!(
        h.message.contains("its host h1 is reported down"),
        "{}",
        h.message
    );
    // The proxy on the down host that still answers through itself stays Healthy.
    let h = engine.get(&uid(2)).unwrap();
    assert_eq!(h.consecutive_successes, 2, "probed in the woken round");
    // Reported again down: not newly down, no extra round; reported Ready, then down again:
    // woken again.
    engine.hosts_reported("local", &[report(HostState::Unreachable)]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(rounds.load(Ordering::SeqCst), 2);
    engine.hosts_reported("local", &[report(HostState::Ready)]);
    engine.hosts_reported("local", &[report(HostState::Timeout)]);
    while rounds.load(Ordering::SeqCst) < 3 {
        assert!(Instant::now() < deadline, "woken again");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.cancel();
    run.await.unwrap();
}

#[test]
fn the_default_detection_bound_is_under_ten_seconds() {
    let s = HealthSettings::new(CheckTarget::parse("http://127.0.0.1:9/").unwrap());
    let ms = Duration::from_millis;
    let b = egress_core::health::detection_bound(&s, ms(500));
    println!("detection bound with the defaults and a 0.5 s round: {b:?}");
    // The pause (5 s and 0.5 s of jitter) and two connect deadlines of 2 s.
    assert_eq!(b, ms(9_500));
    // Rounds start on a fixed cadence: a round's time adds nothing while it stays within the
    // connect deadlines ...
    assert_eq!(egress_core::health::detection_bound(&s, ms(4_000)), b);
    // ... and beyond, the round that decides ends with its slowest check (5 s after it
    // started), and from 5.5 s on the round before it delays its start too.
    assert_eq!(
        egress_core::health::detection_bound(&s, ms(5_000)),
        ms(10_500)
    );
    assert_eq!(
        egress_core::health::detection_bound(&s, ms(7_000)),
        ms(14_000)
    );
    let mut off = s.clone();
    off.recheck = false;
    assert!(egress_core::health::detection_bound(&off, Duration::ZERO) > b);
}

#[tokio::test]
async fn a_proxy_killed_just_after_its_check_passed_is_unpublished_within_the_bound_however_long_the_round()
 {
    // The longest a round takes: the slow proxy's second and room for a loaded machine.
    const ROUND: Duration = Duration::from_millis(1_500);
    let (echo, _e) = start_echo().await;
    let victim = http_proxy("127.0.0.1:0", ProxyBehaviour::default()).await;
    // Another proxy whose check takes 1 s keeps every round going for a second after the
    // victim's check passed: a schedule that paused after each round's end would count that
    // second again before the next check of the victim.
    let slow = http_proxy(
        "127.0.0.1:0",
        ProxyBehaviour {
            handshake_delay: Duration::from_secs(1),
            ..ProxyBehaviour::default()
        },
    )
    .await;
    let mut s = settings(echo);
    s.interval = Duration::from_millis(1_500);
    s.jitter = Duration::ZERO;
    s.connect_timeout = Duration::from_millis(100);
    let bound = egress_core::health::detection_bound(&s, ROUND);
    let engine = std::sync::Arc::new(HealthEngine::new(s));
    let targets = vec![
        ptarget(1, endpoint(victim.addr, ProxyProtocol::Http, None), None),
        ptarget(2, endpoint(slow.addr, ProxyProtocol::Http, None), None),
    ];
    let (ended_tx, mut ended) = tokio::sync::mpsc::unbounded_channel();
    let stop = tokio_util::sync::CancellationToken::new();
    let e2 = engine.clone();
    let run = tokio::spawn(engine.clone().run(
        move || targets.clone(),
        move |r| {
            let state = e2.get(&uid(1)).map(|h| h.state);
            let _ = ended_tx.send((Instant::now(), r.elapsed, state));
        },
        stop.clone(),
    ));
    let deadline = Duration::from_secs(20);
    // Healthy after two rounds.
    tokio::time::timeout(deadline, async {
        loop {
            let (_, _, state) = ended.recv().await.unwrap();
            if state == Some(HealthState::Healthy) {
                break;
            }
        }
    })
    .await
    .expect("the victim healthy");
    // The next round: the victim's check passes (in milliseconds), and it dies at once,
    // while the slow proxy's check keeps the round going.
    let died = tokio::time::timeout(deadline, async {
        while engine.get(&uid(1)).unwrap().consecutive_successes < 3 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        victim.stop();
        Instant::now()
    })
    .await
    .expect("the victim's third check");
    // The round under way ends with the victim still Healthy; the next one decides.
    let (at, elapsed, state) = tokio::time::timeout(deadline, ended.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(state, Some(HealthState::Healthy));
    assert!(at > died && elapsed <= ROUND, "{elapsed:?}");
    let (at, elapsed, state) = tokio::time::timeout(deadline, ended.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        state,
        Some(HealthState::Unhealthy),
        "decided in the next round"
    );
    assert!(
        elapsed <= ROUND,
        "a round took {elapsed:?}, past the {ROUND:?} assumed"
    );
    let took = at - died;
    println!("killed just after its check passed → unpublished after {took:?} (bound {bound:?})");
    assert!(took <= bound, "{took:?} > {bound:?}");
    stop.cancel();
    run.await.unwrap();
    drop(slow);
}

#[tokio::test]
async fn an_egress_ip_outside_the_expected_range_is_unhealthy_with_its_reason() {
    let (echo, _e) = start_echo().await;
    let p = http_proxy("127.0.0.1:0", ProxyBehaviour::default()).await;
    let engine = HealthEngine::new(settings(echo));
    let ep = endpoint(p.addr, ProxyProtocol::Http, None);
    engine
        .round(vec![
            ptarget(1, ep.clone(), Some("192.0.2.0/24")),
            ptarget(2, ep.clone(), Some("127.0.0.0/8")),
        ])
        .await;
    let bad = engine.get(&uid(1)).unwrap();
    assert_eq!(bad.state, HealthState::Unhealthy, "at once: {bad:?}");
    assert_eq!(bad.reason, reason::EGRESS_MISMATCH);
    assert!(bad.message.contains("127.0.0.1") && bad.message.contains("192.0.2.0/24"));
    let good = engine.get(&uid(2)).unwrap();
    assert_eq!(
        (good.state, good.consecutive_successes),
        (HealthState::Healthy, 2),
        "a new proxy's pass, confirmed at once"
    );
}

#[tokio::test]
async fn health_state_survives_rounds_without_an_address_and_is_dropped_only_on_deletion() {
    // finding: H3
    let (echo, _e) = start_echo().await;
    let p = http_proxy("127.0.0.1:0", ProxyBehaviour::default()).await;
    let engine = HealthEngine::new(settings(echo));
    let t = ptarget(1, endpoint(p.addr, ProxyProtocol::Http, None), None);
    engine.round(vec![t.clone()]).await;
    engine.round(vec![t.clone()]).await;
    assert_eq!(engine.get(&uid(1)).unwrap().state, HealthState::Healthy);
    // The address read failed transiently: the Proxy is not a target for a few rounds.
    for _ in 0..5 {
        engine.round(vec![]).await;
    }
    assert_eq!(
        engine.get(&uid(1)).unwrap().state,
        HealthState::Healthy,
        "kept"
    );
    engine.retain(|u| *u == uid(1));
    assert!(engine.get(&uid(1)).is_some(), "still known: kept");
    engine.forget(&uid(1), "default/p1");
    assert!(engine.get(&uid(1)).is_none(), "deleted: dropped");
}

#[tokio::test]
async fn a_round_never_has_more_probes_in_flight_than_its_concurrency() {
    let (echo, _e) = start_echo().await;
    // One slow proxy (50 ms per handshake) behind 20 targets: with 4 slots, at most 4
    // handshakes are ever open at the proxy, and every target is probed.
    let p = http_proxy(
        "127.0.0.1:0",
        ProxyBehaviour {
            handshake_delay: Duration::from_millis(50),
            ..ProxyBehaviour::default()
        },
    )
    .await;
    let mut s = settings(echo);
    s.concurrency = 4;
    let engine = HealthEngine::new(s);
    let targets: Vec<ProbeTarget> = (0..20)
        .map(|i| ptarget(i, endpoint(p.addr, ProxyProtocol::Http, None), None))
        .collect();
    let r = engine.round(targets).await;
    assert_eq!((r.probed, r.succeeded), (20, 20));
    assert_eq!(p.max_in_flight.load(Ordering::SeqCst), 4);
}

#[tokio::test(start_paused = true)]
async fn a_black_holed_proxy_fails_with_a_timeout_at_the_probe_deadline() {
    let (echo, _e) = start_echo().await;
    let p = http_proxy(
        "127.0.0.1:0",
        ProxyBehaviour {
            silent: true,
            ..ProxyBehaviour::default()
        },
    )
    .await;
    let e = probe(
        &endpoint(p.addr, ProxyProtocol::Http, None),
        &target(echo),
        PROBE_DEADLINE,
    )
    .await
    .unwrap_err();
    assert_eq!(e, ProbeError::Timeout(PROBE_DEADLINE));
    assert_eq!(e.reason(), "ProbeTimeout");
}

#[tokio::test]
async fn a_target_answering_json_with_an_ip_field_is_understood() {
    // Any target that answers `{"ip": "..."}` works (e.g. ipify's JSON format).
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let json_target = l.local_addr().unwrap();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut c, _)) = l.accept().await {
            let mut buf = [0u8; 1024];
            let _ = c.read(&mut buf).await;
            let body = r#"{"ip": "198.51.100.23"}"#;
            let _ = c
                .write_all(
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                         Content-Length: {}\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                )
                .await;
        }
    });
    let p = http_proxy("127.0.0.1:0", ProxyBehaviour::default()).await;
    let ok = probe(
        &endpoint(p.addr, ProxyProtocol::Http, None),
        &target(json_target),
        PROBE_DEADLINE,
    )
    .await
    .unwrap();
    assert_eq!(ok.egress_ip.to_string(), "198.51.100.23");
}
