//! Declared egress addresses end to end in standalone mode, over libvirt-fake: a host with a
//! two-address pool (192.0.2.2–.3) gives each of two Proxies its own address (the real
//! provider records it in the mark and reports it as `Instance::egress`); `/status` shows it
//! as `egressAddress`; the health engine probes each proxy through a real in-process HTTP
//! CONNECT proxy (reached on loopback through `dial_map`) against an echo that answers as the
//! world would see a guest behind 1:1 NAT (caller 127.0.0.N → 192.0.2.N): the proxy whose
//! traffic leaves from its declared address is Healthy, the one whose traffic leaves from
//! another address is Unhealthy `EgressMismatch` naming both; `/metrics` reports the pool
//! allocated/free; a third Proxy finds the pool exhausted, says so naming the host and the
//! pool, and nothing is defined for it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use egress_core::health::HealthSettings;
use egress_core::health::probe::CheckTarget;
use egress_core::model::condition;
use egress_provider::libvirt::address_pool::{AddressPool, FamilyPool};
use egress_provider::libvirt::names;
use egress_standalone::manifests::uid_for;
use egress_web::status::{ProxyStatusRow, StatusDocument};
use ep_operator_fixtures::health_proxies::{ProxyBehaviour, http_proxy};
use ep_operator_fixtures::{FakeHosts, get, standalone_options, start_standalone, status};
use libvirt_fake::NetworkSpec;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const ENTRY: &str = "fk";
const IMAGE: &str = "tiny";
/// Hang guard on every wait (convergence takes a few seconds).
const WAIT: Duration = Duration::from_secs(60);

fn digest() -> String {
    "ce".repeat(32)
}

/// 192.0.2.N:P → 127.0.0.N:P (anything else → port 9 on loopback, refused).
fn to_loopback(a: SocketAddr) -> SocketAddr {
    match a.ip() {
        IpAddr::V4(v4) if v4.octets()[..3] == [192, 0, 2] => {
            SocketAddr::from(([127, 0, 0, v4.octets()[3]], a.port()))
        }
        _ => SocketAddr::from(([127, 0, 0, 1], 9)),
    }
}

/// An echo on `bind` that answers what the world would see behind 1:1 NAT: a caller
/// 127.0.0.N is answered as 192.0.2.N, the IPv6 caller ::1 as 2001:db8:5::10.
async fn nat_echo(bind: &str) -> SocketAddr {
    let l = TcpListener::bind(bind).await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut c, peer)) = l.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut n = 0;
                while !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") && n < buf.len() {
                    match c.read(&mut buf[n..]).await {
                        Ok(0) | Err(_) => return,
                        Ok(k) => n += k,
                    }
                }
                let seen = match peer.ip() {
                    IpAddr::V4(v4) => format!("192.0.2.{}", v4.octets()[3]),
                    IpAddr::V6(v6) if v6.is_loopback() => "2001:db8:5::10".to_owned(),
                    IpAddr::V6(v6) => v6.to_string(),
                };
                let body = format!("{seen}\n");
                let _ = c
                    .write_all(
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        )
                        .as_bytes(),
                    )
                    .await;
            });
        }
    });
    addr
}

fn manifest(dir: &std::path::Path, name: &str, port: u16) {
    std::fs::write(
        dir.join(format!("{name}.yaml")),
        format!(
            "apiVersion: egress-proxies.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: {name}\n\
             spec:\n  provider: {ENTRY}\n  image: {IMAGE}\n  proxy:\n    port: {port}\n    \
             allowedClientCidrs: [127.0.0.0/8]\n"
        ),
    )
    .unwrap();
}

fn row<'a>(d: &'a StatusDocument, name: &str) -> &'a ProxyStatusRow {
    d.proxies.iter().find(|p| p.name == name).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_proxy_gets_its_own_declared_address_verified_from_outside() {
    let echo = nat_echo("127.0.0.1:0").await;
    // The guest holding 192.0.2.2 sends from 127.0.0.2 (seen as 192.0.2.2: its own); the
    // one holding 192.0.2.3 sends from 127.0.0.9 (seen as 192.0.2.9: not its own).
    let at2 = http_proxy(
        "127.0.0.2:0",
        ProxyBehaviour {
            source: Some("127.0.0.2".parse().unwrap()),
            ..ProxyBehaviour::default()
        },
    )
    .await;
    let port = at2.addr.port();
    let _at3 = http_proxy(
        &format!("127.0.0.3:{port}"),
        ProxyBehaviour {
            source: Some("127.0.0.9".parse().unwrap()),
            ..ProxyBehaviour::default()
        },
    )
    .await;

    let dir = tempfile::tempdir().unwrap();
    for name in ["a", "b"] {
        manifest(dir.path(), name, port);
    }
    let hosts = FakeHosts::new(ENTRY, &["h1"])
        .max_concurrent(4)
        .published_image(IMAGE, &digest());
    let fake = hosts.fake("h1").clone();
    fake.add_network(NetworkSpec::new("default")).unwrap();
    let mut entry = hosts.entry().clone();
    entry.hosts[0].network = Some("default".into());
    entry.hosts[0].address_pool = Some(AddressPool {
        ipv4: Some(FamilyPool {
            prefix: "192.0.2.0/24".into(),
            gateway: "192.0.2.1".into(),
            ranges: vec!["192.0.2.2-192.0.2.3".into()],
        }),
        ipv6: None,
        dns: vec!["192.0.2.53".into()],
        access: None,
        hold_released: egress_provider::libvirt::address_pool::DEFAULT_HOLD_RELEASED,
    });
    let providers = hosts.providers_for(entry);

    let mut opts = standalone_options(dir.path());
    opts.check_interval = Duration::from_millis(300);
    let mut h = HealthSettings::new(CheckTarget::parse(&format!("http://{echo}/")).unwrap());
    h.interval = Duration::from_millis(200);
    h.jitter = Duration::from_millis(50);
    h.probe_timeout = Duration::from_secs(2);
    h.dial_map = Some(to_loopback);
    opts.health = Some(h);
    let running = start_standalone(opts, providers).await;
    let addr = running.addr;

    // Both decided: each with its own declared address.
    let t0 = Instant::now();
    let doc = loop {
        let d = status(addr).await;
        let decided = d.proxies.len() == 2
            && d.proxies.iter().all(|r| {
                r.egress_address.len() == 1 && r.health.as_ref().and_then(|h| h.healthy).is_some()
            });
        if decided {
            break d;
        }
        assert!(t0.elapsed() < WAIT, "not decided in time: {d:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let held: BTreeMap<String, &ProxyStatusRow> = doc
        .proxies
        .iter()
        .map(|r| (r.egress_address[0].clone(), r))
        .collect();
    assert_eq!(
        held.keys().map(String::as_str).collect::<Vec<_>>(),
        ["192.0.2.2", "192.0.2.3"],
        "distinct addresses from the pool: {doc:#?}"
    );
    let good = held["192.0.2.2"];
    assert_eq!(good.ip.as_deref(), Some("192.0.2.2"), "{good:#?}");
    let gh = good.health.clone().unwrap();
    assert_eq!(gh.healthy, Some(true), "{good:#?}");
    assert_eq!(gh.egress_ips, ["192.0.2.2"]);
    let bad = held["192.0.2.3"];
    let bh = bad.health.clone().unwrap();
    assert_eq!(bh.healthy, Some(false), "{bad:#?}");
    let c = bad
        .conditions
        .iter()
        .find(|c| c.type_ == condition::HEALTHY)
        .unwrap();
    assert_eq!(c.reason, "EgressMismatch", "{c:?}");
    assert!(
        c.message.contains("192.0.2.3") && c.message.contains("192.0.2.9"),
        "declared and observed: {c:?}"
    );

    // The pool's usage, per host and family.
    let t0 = Instant::now();
    loop {
        let (_, metrics) = get(addr, "/metrics").await;
        let want = [
            "egress_proxies_host_egress_addresses{entry=\"fk\",host=\"h1\",family=\"IPv4\",state=\"allocated\"} 2",
            "egress_proxies_host_egress_addresses{entry=\"fk\",host=\"h1\",family=\"IPv4\",state=\"free\"} 0",
        ];
        if want.iter().all(|w| metrics.contains(w)) {
            break;
        }
        assert!(t0.elapsed() < WAIT, "pool usage not reported: {metrics}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A third Proxy: the pool is exhausted; it says so, naming the host and the pool, and
    // nothing is defined for it.
    manifest(dir.path(), "c", port);
    let t0 = Instant::now();
    let ready = loop {
        let d = status(addr).await;
        let r = d
            .proxies
            .iter()
            .find(|p| p.name == "c")
            .and_then(|p| p.conditions.iter().find(|c| c.type_ == condition::READY))
            .cloned();
        if let Some(r) = r
            && (r.reason == "NoUsableHost" || r.reason == "QuotaExceeded")
        {
            break r;
        }
        assert!(t0.elapsed() < WAIT, "no exhaustion reported: {d:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        ready.message.contains("h1")
            && ready.message.contains("IPv4")
            && ready.message.contains("exhausted"),
        "{ready:?}"
    );
    let c_domain = names::domain(ENTRY, &uid_for("default", "c"));
    assert!(fake.domain(&c_domain).is_none(), "nothing defined for c");
    let d = status(addr).await;
    assert!(row(&d, "c").egress_address.is_empty());

    running.stop(WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dual_stack_proxy_is_probed_per_family_against_each_familys_target() {
    // IPv4 probes go to the echo on 127.0.0.1 (the proxy connects from 127.0.0.2: seen as
    // 192.0.2.2), IPv6 probes to the one on [::1] (seen as 2001:db8:5::10).
    let echo4 = nat_echo("127.0.0.1:0").await;
    let echo6 = nat_echo("[::1]:0").await;
    let at2 = http_proxy(
        "127.0.0.2:0",
        ProxyBehaviour {
            source: Some("127.0.0.2".parse().unwrap()),
            ..ProxyBehaviour::default()
        },
    )
    .await;
    let port = at2.addr.port();
    let dir = tempfile::tempdir().unwrap();
    manifest(dir.path(), "dual", port);
    let hosts = FakeHosts::new(ENTRY, &["h1"])
        .max_concurrent(4)
        .published_image(IMAGE, &digest());
    hosts
        .fake("h1")
        .add_network(NetworkSpec::new("default"))
        .unwrap();
    let mut entry = hosts.entry().clone();
    entry.hosts[0].network = Some("default".into());
    entry.hosts[0].address_pool = Some(AddressPool {
        ipv4: Some(FamilyPool {
            prefix: "192.0.2.0/24".into(),
            gateway: "192.0.2.1".into(),
            ranges: vec!["192.0.2.2".into()],
        }),
        ipv6: Some(FamilyPool {
            prefix: "2001:db8:5::/64".into(),
            gateway: "2001:db8:5::1".into(),
            ranges: vec!["2001:db8:5::10".into()],
        }),
        dns: vec![],
        access: None,
        hold_released: egress_provider::libvirt::address_pool::DEFAULT_HOLD_RELEASED,
    });
    let providers = hosts.providers_for(entry);
    let mut opts = standalone_options(dir.path());
    let mut h = HealthSettings::new(CheckTarget::parse(&format!("http://{echo4}/")).unwrap());
    h.target_ipv6 = Some(CheckTarget::parse(&format!("http://{echo6}/")).unwrap());
    h.interval = Duration::from_millis(200);
    h.jitter = Duration::from_millis(50);
    h.probe_timeout = Duration::from_secs(2);
    h.dial_map = Some(to_loopback);
    opts.health = Some(h);
    let running = start_standalone(opts, providers).await;
    let t0 = Instant::now();
    let r = loop {
        let d = status(running.addr).await;
        if let Some(r) = d.proxies.first()
            && r.health.as_ref().and_then(|h| h.healthy).is_some()
        {
            break r.clone();
        }
        assert!(t0.elapsed() < WAIT, "not decided in time: {d:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(r.egress_address, ["192.0.2.2", "2001:db8:5::10"], "{r:#?}");
    let h = r.health.clone().unwrap();
    assert_eq!(h.healthy, Some(true), "{r:#?}");
    assert_eq!(h.egress_ips, ["192.0.2.2", "2001:db8:5::10"], "{r:#?}");
    running.stop(WAIT).await;
}
