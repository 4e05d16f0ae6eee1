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

mod health_support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use egress_operator::controller::ControllerSettings;
use egress_operator::health::HealthSettings;
use egress_operator::health::probe::CheckTarget;
use egress_operator::hosthealth::HostHealth;
use egress_operator::model::condition;
use egress_operator::providers::{ProviderHandle, Providers};
use egress_operator::standalone::manifests::uid_for;
use egress_operator::standalone::status::ProxyStatusRow;
use egress_operator::standalone::{StandaloneOptions, run_with_providers};
use egress_provider::ProviderError;
use egress_provider::libvirt::check::CheckOptions;
use egress_provider::libvirt::config::{
    HostConfig, ImageFormat, ImageSpec, LibvirtEntry, VirtType,
};
use egress_provider::libvirt::hostpool::{Connector, HostPool, PoolOptions};
use egress_provider::libvirt::image::fetch::FetchOptions;
use egress_provider::libvirt::names::{self, ImageSource};
use egress_provider::libvirt::provider_impl::LibvirtProvider;
use health_support::{ProxyBehaviour, http_proxy, start_echo};
use libvirt_fake::{FakeLibvirt, Interface, PoolSpec, VolumeSpec, domain_state};
use libvirt_remote::Transport;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

const GIB: u64 = 1 << 30;
const ENTRY: &str = "fk";
const POOL: &str = "images";
const IMAGE: &str = "tiny";
/// Hang guard on every wait (convergence takes a few seconds).
const WAIT: Duration = Duration::from_secs(60);

struct FakeHosts(BTreeMap<String, FakeLibvirt>);

#[async_trait]
impl Connector for FakeHosts {
    async fn connect(&self, host: &HostConfig) -> Result<Transport, ProviderError> {
        self.0
            .get(&host.name)
            .map(FakeLibvirt::connect_duplex)
            .ok_or_else(|| ProviderError::permanent("no fake"))
    }
}

fn digest() -> String {
    "cd".repeat(32)
}

fn providers(fake: &FakeLibvirt) -> Providers {
    let base = names::base(
        ENTRY,
        ImageSource::Catalogue(IMAGE),
        &digest(),
        ImageFormat::Qcow2,
    );
    fake.add_pool(PoolSpec::new(POOL).capacity(100 * GIB))
        .unwrap();
    fake.add_volume(POOL, VolumeSpec::new(base.clone(), 2 * GIB).format("qcow2"))
        .unwrap();
    fake.add_volume(POOL, VolumeSpec::new(format!("{base}.marker"), 2 * GIB))
        .unwrap();
    let mut images = BTreeMap::new();
    images.insert(
        IMAGE.to_string(),
        ImageSpec {
            url: "https://images.invalid/tiny.qcow2".into(),
            sha256: Some(digest()),
            format: ImageFormat::Qcow2,
            firmware: Default::default(),
            ca_file: None,
        },
    );
    let entry = LibvirtEntry {
        name: ENTRY.into(),
        hosts: vec![HostConfig {
            name: "h1".into(),
            address: "h1.invalid".into(),
            user: "root".into(),
            socket: "/run/libvirt/libvirt-sock".into(),
            pool: POOL.into(),
            bridge: None,
            network: None,
            virt_type: VirtType::Qemu,
            pool_reserve_gib: 1,
            ssh_key_file: None,
            known_hosts_file: None,
            max_concurrent: 4,
        }],
        images,
        url_images: Default::default(),
        max_image_bytes: GIB,
        guest: Default::default(),
        timeouts: Default::default(),
        defaults: Default::default(),
        limits: Default::default(),
    };
    let mut fakes = BTreeMap::new();
    fakes.insert("h1".to_string(), fake.clone());
    let pool = HostPool::new(
        entry.clone(),
        Arc::new(FakeHosts(fakes)),
        PoolOptions::default(),
    )
    .unwrap();
    let p = LibvirtProvider::new(pool, FetchOptions::default(), CheckOptions::default());
    Providers::from_handles([ProviderHandle::new(entry, Arc::new(p))])
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

async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = String::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let code = buf[9..12].parse().unwrap();
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
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
    let fake = FakeLibvirt::new();
    let providers = providers(&fake);
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

    let mut opts = StandaloneOptions::new(dir.path());
    opts.check_interval = Duration::from_millis(500);
    opts.gc_interval = Duration::from_secs(3600);
    opts.shutdown_grace = Duration::from_secs(2);
    opts.controller = ControllerSettings {
        reconcile_deadline: Duration::from_secs(3),
        backoff_base: Duration::from_millis(200),
        backoff_max: Duration::from_secs(1),
        poll_provisioning: Duration::from_millis(200),
        poll_running: Duration::from_secs(1),
        ..ControllerSettings::default()
    };
    let mut h = HealthSettings::new(CheckTarget::parse(&format!("http://{echo}/")).unwrap());
    h.interval = Duration::from_millis(200);
    h.jitter = Duration::from_millis(50);
    h.probe_timeout = Duration::from_secs(2);
    h.dial_map = Some(to_loopback);
    opts.health = Some(h);
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn(run_with_providers(opts, providers, l, stop.clone()));

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
    assert!(d.consecutive_failures >= 3, "{d:?}");
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
    assert!(metrics.trim_end().ends_with("# EOF"));
    assert_eq!(metrics.matches("# EOF").count(), 1);

    stop.cancel();
    stop_dhcp.cancel();
    tokio::time::timeout(WAIT, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
