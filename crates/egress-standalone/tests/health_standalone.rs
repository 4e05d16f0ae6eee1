//! Standalone mode publishes proxy health: libvirt-fake hosts (a published base, so no
//! download), a "DHCP" task giving each guest a TEST-NET address (192.0.2.2, .3, .4; the
//! provider rightly ignores loopback guest addresses), the engine's `dial_map` sending each
//! probe to the same host part on loopback (127.0.0.2, .3, .4: nothing leaves the machine),
//! real in-process HTTP CONNECT proxies listening on some of those, and the echo target.
//! `/healthy.txt` and `/proxies` list only the healthy member; `/hosts` reports each host.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use ep_operator_fixtures::health_proxies as health_support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use egress_core::health::HealthSettings;
use egress_core::health::probe::CheckTarget;
use egress_core::host_health::HostHealth;
use egress_core::model::condition;
use egress_provider::libvirt::names;
use egress_standalone::manifests::uid_for;
use egress_web::status::ProxyStatusRow;
use ep_operator_fixtures::{FakeHosts, get, standalone_options, start_standalone};
use health_support::{ProxyBehaviour, http_proxy, start_echo};
use libvirt_fake::{FakeLibvirt, Interface, domain_state};
use tokio_util::sync::CancellationToken;

const ENTRY: &str = "fk";
const IMAGE: &str = "tiny";
/// Hang guard on every wait (convergence takes a few seconds).
const WAIT: Duration = Duration::from_secs(60);

fn digest() -> String {
    "cd".repeat(32)
}

/// Gives each running guest of `addrs` (by Proxy name) its loopback address.
async fn dhcp(fake: FakeLibvirt, addrs: BTreeMap<String, String>, stop: CancellationToken) {
    while !stop.is_cancelled() {
        for (name, ip) in &addrs {
            let u = uid_for("default", name);
            let d = names::domain(ENTRY, &u);
            if fake
                .domain(&d)
                .is_some_and(|x| x.state == domain_state::RUNNING)
            {
                let _ = fake.set_interfaces(
                    &d,
                    vec![Interface::new("eth0", names::mac(ENTRY, &u)).addr(ip.clone(), 24)],
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// 192.0.2.N:P → 127.0.0.N:P (anything else → port 9 on loopback, refused).
fn to_loopback(a: SocketAddr) -> SocketAddr {
    match a.ip() {
        std::net::IpAddr::V4(v4) if v4.octets()[..3] == [192, 0, 2] => {
            SocketAddr::from(([127, 0, 0, v4.octets()[3]], a.port()))
        }
        _ => SocketAddr::from(([127, 0, 0, 1], 9)),
    }
}

async fn proxies(addr: SocketAddr) -> Vec<ProxyStatusRow> {
    let (code, body) = get(addr, "/proxies").await;
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthy_txt_and_proxies_list_only_the_healthy_member_with_its_egress_ip() {
    let (echo, _echo_guard) = start_echo().await;
    // "good" has a working proxy; "dead" has none listening; "wrong" works but its egress
    // (127.0.0.1, what the echo sees) is outside its expectedEgress.
    let good = http_proxy("127.0.0.2:0", ProxyBehaviour::default()).await;
    let port = good.addr.port();
    let _wrong = http_proxy(&format!("127.0.0.4:{port}"), ProxyBehaviour::default()).await;
    println!("proxies on port {port}: 127.0.0.2 (good), 127.0.0.4 (wrong); echo {echo}");

    let dir = tempfile::tempdir().unwrap();
    for (name, extra) in [
        ("good", ""),
        ("dead", ""),
        ("wrong", "    expectedEgress: 192.0.2.0/24\n"),
    ] {
        std::fs::write(
            dir.path().join(format!("{name}.yaml")),
            format!(
                "apiVersion: egress-proxies.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: {name}\n\
                 spec:\n  provider: {ENTRY}\n  image: {IMAGE}\n  proxy:\n    port: {port}\n    \
                 allowedClientCidrs: [127.0.0.0/8]\n{extra}"
            ),
        )
        .unwrap();
    }
    let hosts = FakeHosts::new(ENTRY, &["h1"])
        .max_concurrent(4)
        .published_image(IMAGE, &digest());
    let fake = hosts.fake("h1").clone();
    let providers = hosts.providers();
    let stop_dhcp = CancellationToken::new();
    let addrs: BTreeMap<String, String> = [
        ("good", "192.0.2.2"),
        ("dead", "192.0.2.3"),
        ("wrong", "192.0.2.4"),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    tokio::spawn(dhcp(fake.clone(), addrs, stop_dhcp.clone()));

    let mut opts = standalone_options(dir.path());
    opts.check_interval = Duration::from_millis(500);
    let mut h = HealthSettings::new(CheckTarget::parse(&format!("http://{echo}/")).unwrap());
    h.interval = Duration::from_millis(200);
    h.jitter = Duration::from_millis(50);
    h.probe_timeout = Duration::from_secs(2);
    h.dial_map = Some(to_loopback);
    opts.health = Some(h);
    let running = start_standalone(opts, providers).await;
    let addr = running.addr;

    let t0 = Instant::now();
    let rows = loop {
        let rows = proxies(addr).await;
        let decided = rows.len() == 3
            && rows
                .iter()
                .all(|r| r.health.as_ref().and_then(|h| h.healthy).is_some());
        if decided {
            break rows;
        }
        assert!(t0.elapsed() < WAIT, "health not decided in time: {rows:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let by: BTreeMap<&str, &ProxyStatusRow> = rows.iter().map(|r| (r.name.as_str(), r)).collect();
    let g = by["good"].health.clone().unwrap();
    assert_eq!(g.healthy, Some(true));
    assert_eq!(
        g.egress_ip.as_deref(),
        Some("127.0.0.1"),
        "what the echo saw"
    );
    assert!(g.latency_ms.is_some() && g.last_check.is_some());
    let ready = by["good"]
        .conditions
        .iter()
        .find(|c| c.type_ == condition::READY)
        .unwrap();
    assert_eq!(format!("{:?}", ready.status), "True", "{ready:?}");

    let d = by["dead"].health.clone().unwrap();
    assert_eq!(d.healthy, Some(false));
    assert!(
        d.consecutive_failures >= 2,
        "a failure and its re-check: {d:?}"
    );
    let dready = by["dead"]
        .conditions
        .iter()
        .find(|c| c.type_ == condition::READY)
        .unwrap();
    assert_eq!(dready.reason, "NotHealthy", "{dready:?}");

    let w = by["wrong"]
        .conditions
        .iter()
        .find(|c| c.type_ == condition::HEALTHY)
        .unwrap();
    assert_eq!(w.reason, "EgressMismatch", "{w:?}");

    let (code, txt) = get(addr, "/healthy.txt").await;
    assert_eq!(code, 200);
    assert_eq!(txt, format!("192.0.2.2:{port}\n"));

    let (code, body) = get(addr, "/hosts").await;
    assert_eq!(code, 200);
    let hosts: Vec<HostHealth> = serde_json::from_str(&body).unwrap();
    assert_eq!(hosts.len(), 1, "{hosts:?}");
    assert_eq!(hosts[0].state, "Ready", "{hosts:?}");
    assert!(hosts[0].latency_ms.is_some() && hosts[0].pool_free_bytes.is_some());

    let (_, metrics) = get(addr, "/metrics").await;
    assert!(
        metrics.contains("egress_proxies_health_proxy_up{proxy=\"default/good\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("egress_proxies_health_proxies{state=\"Healthy\"} 1"),
        "{metrics}"
    );
    // The Prometheus text format by default (no Accept header): no OpenMetrics EOF line.
    assert!(!metrics.contains("# EOF"), "{metrics}");

    running.stop(WAIT).await;
    stop_dhcp.cancel();
}
