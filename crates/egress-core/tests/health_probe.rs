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

#[tokio::test]
async fn a_dead_proxy_flips_to_unhealthy_only_after_n_consecutive_failures() {
    let (echo, _e) = start_echo().await;
    let p = http_proxy("127.0.0.1:0", ProxyBehaviour::default()).await;
    let engine = HealthEngine::new(settings(echo));
    let t = ptarget(1, endpoint(p.addr, ProxyProtocol::Http, None), None);
    engine.round(vec![t.clone()]).await;
    assert_eq!(engine.get(&uid(1)).unwrap().state, HealthState::Unknown);
    engine.round(vec![t.clone()]).await;
    let h = engine.get(&uid(1)).unwrap();
    assert_eq!(h.state, HealthState::Healthy);
    assert_eq!(h.egress_ip.unwrap().to_string(), "127.0.0.1");
    // The proxy dies (its port now refuses connections).
    p.stop();
    drop(p);
    tokio::time::sleep(Duration::from_millis(50)).await;
    for i in 1..DEFAULT_UNHEALTHY_AFTER {
        let r = engine.round(vec![t.clone()]).await;
        assert_eq!(r.succeeded, 0);
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
    assert_eq!(engine.get(&uid(2)).unwrap().consecutive_successes, 1);
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
