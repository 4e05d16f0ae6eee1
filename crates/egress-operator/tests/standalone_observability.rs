//! What standalone mode reports about itself, against libvirt-fake hosts in this process: the
//! `image_bytes` metric fed from create progress, `createdAt` in /status from the instance's
//! mark, readiness through a bad config reload, and the wake-ups that let queued Proxies go
//! as soon as a host slot frees up (the 1000-proxy benchmark's fix).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

#[path = "../../egress-provider/tests/image_support/mod.rs"]
mod image_support;

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use egress_operator::controller::ControllerSettings;
use egress_operator::model::Phase;
use egress_operator::providers::{ProviderHandle, Providers};
use egress_operator::standalone::manifests::uid_for;
use egress_operator::standalone::status::StatusDocument;
use egress_operator::standalone::{POLL_INTERVAL, StandaloneOptions, run_with_providers};
use egress_provider::ProviderError;
use egress_provider::libvirt::check::CheckOptions;
use egress_provider::libvirt::config::{
    HostConfig, ImageFormat, ImageSpec, LibvirtEntry, VirtType,
};
use egress_provider::libvirt::hostpool::{Connector, HostPool, PoolOptions};
use egress_provider::libvirt::image::fetch::FetchOptions;
use egress_provider::libvirt::mark;
use egress_provider::libvirt::names;
use egress_provider::libvirt::provider_impl::LibvirtProvider;
use image_support::{ImageServer, Route, qcow2, sha};
use libvirt_fake::{DomainSpec, FakeLibvirt, Interface, PoolSpec, domain_state};
use libvirt_remote::Transport;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

const GIB: u64 = 1 << 30;
const POOL: &str = "images";
const ENTRY: &str = "ob";
/// Bound on every wait here; convergence takes about a second.
const WAIT: Duration = Duration::from_secs(90);
/// A poll interval no test may rely on: if a Proxy converges well before it, something other
/// than polling (a wake-up) moved it.
const SLOW_POLL: Duration = Duration::from_secs(3600);

struct Hosts(BTreeMap<String, FakeLibvirt>);

#[async_trait]
impl Connector for Hosts {
    async fn connect(&self, host: &HostConfig) -> Result<Transport, ProviderError> {
        self.0
            .get(&host.name)
            .map(FakeLibvirt::connect_duplex)
            .ok_or_else(|| ProviderError::permanent(format!("no fake for {}", host.name)))
    }
}

struct World {
    fakes: BTreeMap<String, FakeLibvirt>,
    entry: LibvirtEntry,
    server: ImageServer,
    image_len: u64,
    dir: tempfile::TempDir,
    dhcp: CancellationToken,
}

impl Drop for World {
    fn drop(&mut self) {
        self.dhcp.cancel();
    }
}

fn host(name: &str, max_concurrent: u32) -> HostConfig {
    HostConfig {
        name: name.into(),
        address: format!("{name}.invalid"),
        user: "root".into(),
        socket: "/run/libvirt/libvirt-sock".into(),
        pool: POOL.into(),
        bridge: None,
        network: None,
        virt_type: VirtType::Qemu,
        pool_reserve_gib: 1,
        ssh_key_file: None,
        known_hosts_file: None,
        max_concurrent,
    }
}

async fn world(max_concurrent: u32) -> World {
    let f = FakeLibvirt::new();
    f.add_pool(PoolSpec::new(POOL).capacity(100 * GIB)).unwrap();
    let fakes: BTreeMap<String, FakeLibvirt> = [("h1".to_string(), f)].into();
    let server = ImageServer::start().await;
    let image = qcow2(2 * GIB, 64 * 1024);
    let url = server.route("/tiny.qcow2", Route::new(image.clone()));
    let mut images = BTreeMap::new();
    images.insert(
        "tiny".to_string(),
        ImageSpec {
            url,
            sha256: Some(sha(&image)),
            format: ImageFormat::Qcow2,
            firmware: Default::default(),
            ca_file: None,
        },
    );
    let entry = LibvirtEntry {
        name: ENTRY.into(),
        hosts: vec![host("h1", max_concurrent)],
        images,
        url_images: Default::default(),
        max_image_bytes: GIB,
        guest: Default::default(),
        timeouts: Default::default(),
        defaults: Default::default(),
        limits: Default::default(),
    };
    let dhcp = CancellationToken::new();
    tokio::spawn(dhcp_task(fakes.clone(), dhcp.clone()));
    World {
        fakes,
        entry,
        server,
        image_len: image.len() as u64,
        dir: tempfile::tempdir().unwrap(),
        dhcp,
    }
}

/// Gives every running domain of ours an address on its derived MAC, like a guest agent.
async fn dhcp_task(fakes: BTreeMap<String, FakeLibvirt>, stop: CancellationToken) {
    let mut given: HashSet<String> = HashSet::new();
    while !stop.is_cancelled() {
        for f in fakes.values() {
            for d in f.domains() {
                if d.state != domain_state::RUNNING || given.contains(&d.name) {
                    continue;
                }
                let Some(u) = names::uid_of_domain(ENTRY, &d.name) else {
                    continue;
                };
                let ip = format!("10.1.0.{}", given.len() % 250 + 2);
                let iface = Interface::new("eth0", names::mac(ENTRY, &u)).addr(ip, 24);
                if f.set_interfaces(&d.name, vec![iface]).is_ok() {
                    given.insert(d.name);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl World {
    fn providers(&self) -> Providers {
        let pool = HostPool::new(
            self.entry.clone(),
            Arc::new(Hosts(self.fakes.clone())),
            PoolOptions::default(),
        )
        .unwrap();
        let p = LibvirtProvider::new(pool, FetchOptions::default(), CheckOptions::default());
        Providers::from_handles([ProviderHandle::new(self.entry.clone(), Arc::new(p))])
    }

    fn write_manifest(&self, name: &str) {
        std::fs::write(
            self.dir.path().join(format!("{name}.yaml")),
            format!(
                "apiVersion: egress-proxies.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: {name}\n\
                 spec:\n  provider: {ENTRY}\n  image: tiny\n  resources:\n    diskGiB: 4\n    \
                 memoryMiB: 256\n  proxy:\n    allowedClientCidrs: [10.0.0.0/8]\n"
            ),
        )
        .unwrap();
    }

    fn options(&self) -> StandaloneOptions {
        let mut o = StandaloneOptions::new(self.dir.path());
        o.workers = 2;
        o.check_interval = Duration::from_secs(1);
        o.gc_interval = Duration::from_secs(3600);
        o.shutdown_grace = Duration::from_secs(2);
        o.controller = ControllerSettings {
            reconcile_deadline: Duration::from_secs(3),
            backoff_base: Duration::from_millis(200),
            backoff_max: Duration::from_secs(1),
            poll_provisioning: Duration::from_millis(200),
            poll_running: Duration::from_secs(1),
            ..ControllerSettings::default()
        };
        o
    }
}

struct Running {
    addr: SocketAddr,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), egress_operator::standalone::StandaloneError>>,
}

async fn start(opts: StandaloneOptions, providers: Providers) -> Running {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn(run_with_providers(opts, providers, l, stop.clone()));
    Running { addr, stop, task }
}

impl Running {
    async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("standalone stops within its grace")
            .unwrap()
            .unwrap();
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

async fn status(addr: SocketAddr) -> StatusDocument {
    let (code, body) = get(addr, "/status").await;
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

async fn wait_status(addr: SocketAddr, what: &str, ok: impl Fn(&StatusDocument) -> bool) {
    let t0 = Instant::now();
    loop {
        let d = status(addr).await;
        if ok(&d) {
            return;
        }
        assert!(t0.elapsed() < WAIT, "timed out waiting for {what}: {d:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn running<'a>(names: &'a [&'a str]) -> impl Fn(&StatusDocument) -> bool + 'a {
    move |d| {
        names.iter().all(|n| {
            d.proxies
                .iter()
                .any(|p| p.name == *n && p.phase == Phase::Running && p.ip.is_some())
        })
    }
}

/// The value of an un-labelled metric in the OpenMetrics text.
fn metric(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_bytes_metric_counts_what_creates_imported_once_per_import() {
    let w = world(2).await;
    let r = start(w.options(), w.providers()).await;
    let (_, m) = get(r.addr, "/metrics").await;
    assert_eq!(
        metric(&m, "egress_proxies_image_bytes_total"),
        Some(0),
        "{m}"
    );

    w.write_manifest("p1");
    wait_status(r.addr, "p1 Running", running(&["p1"])).await;
    let (_, m) = get(r.addr, "/metrics").await;
    assert_eq!(
        metric(&m, "egress_proxies_image_bytes_total"),
        Some(w.image_len),
        "the whole image was imported by p1's create: {m}"
    );
    assert_eq!(w.server.body_bytes_sent("/tiny.qcow2"), w.image_len);

    // A second create on the same host uses the cached base: nothing more is transferred.
    w.write_manifest("p2");
    wait_status(r.addr, "p2 Running", running(&["p1", "p2"])).await;
    let (_, m) = get(r.addr, "/metrics").await;
    assert_eq!(
        metric(&m, "egress_proxies_image_bytes_total"),
        Some(w.image_len),
        "{m}"
    );
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn created_at_in_status_is_the_adopted_instances_mark_time_and_a_new_ones_create_time() {
    let w = world(2).await;
    // An instance of `old` from an earlier run: created 2020-01-01 according to its mark.
    let old = uid_for("default", "old");
    let name = names::domain(ENTRY, &old);
    w.fakes["h1"]
        .add_domain(
            DomainSpec::new(name.clone()).running().metadata(
                mark::NAMESPACE,
                format!(
                    "<instance xmlns=\"{}\">\n  <managed>true</managed>\n  <uid>{}</uid>\n  \
                     <entry>{ENTRY}</entry>\n  <createdAt>2020-01-01T00:00:00Z</createdAt>\n</instance>",
                    mark::NAMESPACE,
                    old.canonical()
                ),
            ),
        )
        .unwrap();
    w.write_manifest("old");
    w.write_manifest("new");
    let before = SystemTime::now();
    let r = start(w.options(), w.providers()).await;
    wait_status(r.addr, "both Running", running(&["old", "new"])).await;
    let d = status(r.addr).await;
    let row = |n: &str| d.proxies.iter().find(|p| p.name == n).unwrap().clone();
    assert_eq!(
        row("old").created_at,
        "2020-01-01T00:00:00Z",
        "the mark's time, not when this process first saw the manifest"
    );
    assert_eq!(
        w.fakes["h1"].domains().len(),
        2,
        "old was adopted, not recreated"
    );
    let new_at = humantime::parse_rfc3339(&row("new").created_at).unwrap();
    assert!(
        new_at + Duration::from_secs(1) >= before,
        "a fresh instance is dated by its create: {new_at:?}"
    );
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_config_reload_keeps_the_process_ready_and_the_running_config_working() {
    let w = world(2).await;
    let cfg = w.dir.path().join("providers.conf");
    std::fs::write(&cfg, "# replaced below\n").unwrap();
    let mut o = w.options();
    o.config_path = Some(cfg.clone());
    let r = start(o, w.providers()).await;
    w.write_manifest("p1");
    wait_status(r.addr, "p1 Running", running(&["p1"])).await;
    assert_eq!(get(r.addr, "/readyz").await.0, 200);

    std::fs::write(&cfg, "providers:\n  - name: BAD NAME\n    type: libvirt\n").unwrap();
    // Let the config poller see the change and refuse it.
    tokio::time::sleep(POLL_INTERVAL * 2 + Duration::from_millis(500)).await;
    assert_eq!(
        get(r.addr, "/readyz").await.0,
        200,
        "readiness stays on: the running config still serves"
    );
    w.write_manifest("p2");
    wait_status(
        r.addr,
        "p2 Running under the running config",
        running(&["p1", "p2"]),
    )
    .await;
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxies_refused_a_host_slot_start_as_soon_as_one_frees_without_waiting_for_a_poll() {
    // One slot on the only host, and every requeue (provisioning poll, host-busy retry,
    // backoff) an hour away: a create's result can only be picked up if its finish wakes its
    // Proxy, and p2 and p3 can only get the slot if its release wakes them.
    let w = world(1).await;
    for n in ["p1", "p2", "p3"] {
        w.write_manifest(n);
    }
    let mut o = w.options();
    o.controller.poll_provisioning = SLOW_POLL;
    o.controller.backoff_base = SLOW_POLL;
    o.controller.backoff_max = SLOW_POLL;
    let r = start(o, w.providers()).await;
    wait_status(r.addr, "p1..p3 created", |d| {
        d.proxies.len() == 3 && d.proxies.iter().all(|p| p.provider_id.is_some())
    })
    .await;
    assert_eq!(w.fakes["h1"].domains().len(), 3);
    let (_, m) = get(r.addr, "/metrics").await;
    assert!(
        metric(&m, "egress_proxies_controller_host_busy_total").is_some_and(|n| n >= 1),
        "some Proxy was refused the slot: {m}"
    );
    r.stop().await;
}
