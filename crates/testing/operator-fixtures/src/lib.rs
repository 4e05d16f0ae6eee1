//! The fake-provider fixtures shared by the operator's test suites (the core's, the standalone
//! driver's and egress-kube's integration tests, the standalone benchmark): libvirt-fake hosts behind one
//! libvirt provider entry ([`FakeHosts`]), each with a pool and optionally a published base
//! image so creates need no download; a "DHCP" task giving running fake domains an address
//! on their derived MAC ([`FakeHosts::start_dhcp`]); a standalone instance on 127.0.0.1
//! ([`start_standalone`]); and HTTP helpers that poll `/status` until a predicate holds
//! ([`wait_status`]); and in-process HTTP CONNECT and SOCKS5 proxies on loopback for the health
//! tests ([`health_proxies`]); real tinyproxy and dante members, targets and proxy clients on
//! loopback ([`real_members`]).
//!
//! Guarantees: everything stays in this process or on loopback; the DHCP task stops when its
//! guard drops; every HTTP call and every wait has a deadline. Test-only code: it panics on
//! setup failures and on timeouts (with the last observed state), which is what a test wants.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

pub mod health_proxies;
pub mod real_members;

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use egress_core::controller::ControllerSettings;
use egress_core::providers::{ProviderHandle, Providers};
use egress_provider::ProviderError;
use egress_provider::libvirt::check::CheckOptions;
use egress_provider::libvirt::config::{
    HostConfig, ImageFormat, ImageSpec, LibvirtEntry, Timeouts, VirtType,
};
use egress_provider::libvirt::hostpool::{Connector, HostPool, PoolOptions};
use egress_provider::libvirt::image::fetch::FetchOptions;
use egress_provider::libvirt::names::{self, ImageSource};
use egress_provider::libvirt::provider_impl::LibvirtProvider;
use egress_standalone::{StandaloneError, StandaloneOptions, run_with_providers};
use egress_web::status::StatusDocument;
use libvirt_fake::{FakeLibvirt, Interface, NetworkSpec, PoolSpec, VolumeSpec, domain_state};
use libvirt_remote::Transport;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// One GiB in bytes.
pub const GIB: u64 = 1 << 30;
/// The storage pool every fake host has.
pub const POOL: &str = "images";
/// Capacity of each fake host's pool.
// NB: far above what any suite creates (a few 4 GiB overlays per host), so space never
// limits placement unless a test shrinks it on purpose.
pub const POOL_CAPACITY: u64 = 100 * GIB;
/// Virtual size of a published base volume (and its marker).
// NB: 2 GiB, below the default 4 GiB proxy disk, so overlays of every default spec fit.
pub const BASE_CAPACITY: u64 = 2 * GIB;
/// Deadline of one HTTP request of [`get`].
// NB: the status server answers in milliseconds; 10 s only guards against a hang.
pub const HTTP_DEADLINE: Duration = Duration::from_secs(10);
/// Pause between two polls of [`wait_status`].
// NB: 50 ms keeps waits responsive while costing the server a negligible ~20 requests/s.
pub const STATUS_POLL: Duration = Duration::from_millis(50);
/// Short provider budgets of [`FakeHosts::short_timeouts`]: dial, call, image import, start,
/// host check call.
// NB: the fake answers in microseconds; 1 s calls make work stuck on a frozen fake give up
// well within a test, and 5 s leaves import/start room on a loaded 2-core machine.
pub const SHORT_TIMEOUTS: Timeouts = Timeouts {
    dial: Duration::from_secs(1),
    call: Duration::from_secs(1),
    image_import: Duration::from_secs(5),
    start: Duration::from_secs(5),
    check: Duration::from_secs(1),
};
/// Host slot wait of [`FakeHosts::short_permit_wait`].
// NB: as short as a call, so a test on a frozen host sees slot waits give up quickly.
pub const SHORT_PERMIT_WAIT: Duration = Duration::from_secs(1);

/// A [`Connector`] dialling, for each host of the entry, its own in-process fake libvirtd.
/// Unknown hosts are a permanent error.
#[derive(Clone)]
pub struct FakeConnector(pub BTreeMap<String, FakeLibvirt>);

#[async_trait]
impl Connector for FakeConnector {
    async fn connect(&self, host: &HostConfig) -> Result<Transport, ProviderError> {
        self.0
            .get(&host.name)
            .map(FakeLibvirt::connect_duplex)
            .ok_or_else(|| ProviderError::permanent(format!("no fake for {}", host.name)))
    }
}

/// The config of fake host `name` (address `NAME.invalid`, never dialled: the connector
/// routes by name) on pool [`POOL`], TCG, no SSH material.
pub fn host_config(name: &str, pool_reserve_gib: u64, max_concurrent: u32) -> HostConfig {
    HostConfig {
        name: name.into(),
        address: format!("{name}.invalid"),
        user: "root".into(),
        socket: "/run/libvirt/libvirt-sock".into(),
        pool: POOL.into(),
        bridge: None,
        network: None,
        virt_type: VirtType::Qemu,
        pool_reserve_gib,
        ssh_key_file: None,
        known_hosts_file: None,
        max_concurrent,
        // The provider uses only guest addresses inside the host's guest subnets.
        guest_cidr: GUEST_CIDRS.iter().map(|c| (*c).to_owned()).collect(),
        address_pool: None,
        maintenance: Default::default(),
        segment: None,
        fence: None,
        host_addresses: Vec::new(),
        capacity: Default::default(),
        access: None,
    }
}

/// Every fixture host's `guestCidr`: the subnets the suites' fake guests report addresses in
/// ([`DHCP_SUBNET`] of [`run_dhcp`]; 192.168.122.0/24, libvirt's default network, in the
/// controller and Kubernetes driver suites; TEST-NET-1 in the standalone health suite).
pub const GUEST_CIDRS: [&str; 3] = [DHCP_SUBNET, "192.168.122.0/24", "192.0.2.0/24"];

/// The subnet [`run_dhcp`] gives guests their addresses in: every fixture host's `guestCidr`,
/// and the subnet of [`dhcp_network`].
pub const DHCP_SUBNET: &str = "10.0.0.0/8";

/// A libvirt network `name` for the fakes whose subnet ([`DHCP_SUBNET`]) holds the addresses
/// [`run_dhcp`] gives (the provider uses only guest addresses inside the host's network).
pub fn dhcp_network(name: &str) -> NetworkSpec {
    NetworkSpec::new(name).xml(format!(
        "<network>\n  <name>{name}</name>\n  <forward mode='nat'/>\n  <bridge name='virbr0'/>\n  \
         <ip address='10.0.0.1' prefix='8'/>\n</network>\n"
    ))
}

/// A catalogue image in qcow2 at `url` with the expected `sha256`.
pub fn qcow2_image(url: impl Into<String>, sha256: impl Into<String>) -> ImageSpec {
    ImageSpec {
        url: url.into(),
        sha256: Some(sha256.into()),
        format: ImageFormat::Qcow2,
        firmware: Default::default(),
        ca_file: None,
    }
}

/// Adds to `fake`'s [`POOL`] a published base of catalogue image `image` of `entry` with
/// `digest` (the base plus its marker of equal capacity: the image cache's publish protocol),
/// so a create of that image needs no download.
pub fn publish_base(fake: &FakeLibvirt, entry: &str, image: &str, digest: &str) {
    let base = names::base(
        entry,
        ImageSource::Catalogue(image),
        digest,
        ImageFormat::Qcow2,
    );
    fake.add_volume(
        POOL,
        VolumeSpec::new(base.clone(), BASE_CAPACITY).format("qcow2"),
    )
    .unwrap();
    fake.add_volume(
        POOL,
        VolumeSpec::new(format!("{base}.marker"), BASE_CAPACITY),
    )
    .unwrap();
}

/// Fake hosts behind one libvirt provider entry. Cheap to clone: clones share the fakes.
///
/// Built with [`FakeHosts::new`] (each host: pool [`POOL`] of [`POOL_CAPACITY`], reserve
/// 1 GiB, 2 concurrent operations, default timeouts, empty catalogue), then adjusted with the
/// builder methods. [`FakeHosts::providers`] may be called any number of times: each call is
/// a fresh registry (new connections, new caches) over the same fakes, like a restart.
#[derive(Clone)]
pub struct FakeHosts {
    entry: LibvirtEntry,
    fakes: BTreeMap<String, FakeLibvirt>,
    pool_options: PoolOptions,
}

impl FakeHosts {
    /// Entry `entry` with one fresh fake per name in `hosts`, each with an empty pool.
    pub fn new(entry: &str, hosts: &[&str]) -> Self {
        let fakes = hosts
            .iter()
            .map(|h| {
                let f = FakeLibvirt::new();
                f.add_pool(PoolSpec::new(POOL).capacity(POOL_CAPACITY))
                    .unwrap();
                ((*h).to_owned(), f)
            })
            .collect();
        Self {
            entry: LibvirtEntry {
                name: entry.into(),
                hosts: hosts.iter().map(|h| host_config(h, 1, 2)).collect(),
                images: BTreeMap::new(),
                url_images: Default::default(),
                max_image_bytes: GIB,
                guest: Default::default(),
                timeouts: Default::default(),
                defaults: Default::default(),
                limits: Default::default(),
                policy: Default::default(),
                access: None,
                quotas: Default::default(),
            },
            fakes,
            pool_options: PoolOptions::default(),
        }
    }

    /// Sets every host's pool reserve (GiB).
    pub fn pool_reserve_gib(mut self, gib: u64) -> Self {
        for h in &mut self.entry.hosts {
            h.pool_reserve_gib = gib;
        }
        self
    }

    /// Sets every host's concurrent-operation limit.
    pub fn max_concurrent(mut self, n: u32) -> Self {
        for h in &mut self.entry.hosts {
            h.max_concurrent = n;
        }
        self
    }

    /// Gives every host the declared egress address pool `pool` (each host its own copy of
    /// the same ranges: an address is unique per host, as the provider allocates it).
    pub fn address_pool(
        mut self,
        pool: egress_provider::libvirt::address_pool::AddressPool,
    ) -> Self {
        for h in &mut self.entry.hosts {
            h.address_pool = Some(pool.clone());
        }
        self
    }

    /// Uses [`SHORT_TIMEOUTS`], so work stuck on a frozen fake gives up within a test.
    pub fn short_timeouts(mut self) -> Self {
        self.entry.timeouts = SHORT_TIMEOUTS;
        self
    }

    /// Uses [`SHORT_PERMIT_WAIT`] for host slot waits (default: the pool's own default).
    pub fn short_permit_wait(mut self) -> Self {
        self.pool_options = PoolOptions {
            permit_wait: SHORT_PERMIT_WAIT,
        };
        self
    }

    /// Adds `image` to the entry's catalogue (as given; nothing is put on the fakes).
    pub fn image(mut self, name: &str, spec: ImageSpec) -> Self {
        self.entry.images.insert(name.to_owned(), spec);
        self
    }

    /// Puts a published base of `image` with `digest` on every fake (see [`publish_base`])
    /// without adding it to the catalogue.
    pub fn publish(self, image: &str, digest: &str) -> Self {
        for f in self.fakes.values() {
            publish_base(f, &self.entry.name, image, digest);
        }
        self
    }

    /// Adds `image` (at `https://images.invalid/IMAGE.qcow2`, never fetched) to the
    /// catalogue and publishes its base with `digest` on every fake.
    pub fn published_image(self, image: &str, digest: &str) -> Self {
        let url = format!("https://images.invalid/{image}.qcow2");
        self.image(image, qcow2_image(url, digest))
            .publish(image, digest)
    }

    /// The provider entry (hosts and catalogue).
    pub fn entry(&self) -> &LibvirtEntry {
        &self.entry
    }

    /// The fake of `host`; panics if there is none.
    pub fn fake(&self, host: &str) -> &FakeLibvirt {
        self.fakes
            .get(host)
            .unwrap_or_else(|| panic!("no fake host {host}"))
    }

    /// Every fake, by host name.
    pub fn fakes(&self) -> &BTreeMap<String, FakeLibvirt> {
        &self.fakes
    }

    /// A fresh libvirt provider for `entry` (which must name hosts of these fakes).
    pub fn provider_for(&self, entry: LibvirtEntry) -> Arc<LibvirtProvider> {
        let pool = HostPool::new(
            entry,
            Arc::new(FakeConnector(self.fakes.clone())),
            self.pool_options.clone(),
        )
        .unwrap();
        Arc::new(LibvirtProvider::new(
            pool,
            FetchOptions::default(),
            CheckOptions::default(),
        ))
    }

    /// A fresh libvirt provider for this entry.
    pub fn provider(&self) -> Arc<LibvirtProvider> {
        self.provider_for(self.entry.clone())
    }

    /// A fresh registry holding one handle for `entry` over these fakes.
    pub fn providers_for(&self, entry: LibvirtEntry) -> Providers {
        let p = self.provider_for(entry.clone());
        Providers::from_handles([ProviderHandle::new(entry, p)])
    }

    /// A fresh registry holding one handle for this entry (a restart builds a new one).
    pub fn providers(&self) -> Providers {
        self.providers_for(self.entry.clone())
    }

    /// Starts the "DHCP" task ([`run_dhcp`]) over these fakes; it stops when the returned
    /// guard drops.
    pub fn start_dhcp(&self, period: Duration) -> Dhcp {
        let stop = CancellationToken::new();
        tokio::spawn(run_dhcp(
            self.entry.name.clone(),
            self.fakes.clone(),
            period,
            stop.clone(),
        ));
        Dhcp(stop)
    }
}

/// Stops the DHCP task of [`FakeHosts::start_dhcp`] when dropped.
pub struct Dhcp(CancellationToken);

impl Drop for Dhcp {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// The "DHCP" loop, until `stop` is cancelled: every `period` it gives each running domain
/// of `entry` that has none yet an address on NIC `eth0` with the domain's derived MAC, as a
/// guest agent would report it: `10.{host index + 1}.X.Y/16` (host index in name order; X.Y
/// from a counter, starting at 0.2, distinct for the first 62,500 domains of a host). A
/// domain that stops or is recreated gets an address again when it runs: a domain is known
/// by its UUID, so one deleted and defined again under the same name between two rounds (a
/// Proxy removed and added back) is a new domain.
pub async fn run_dhcp(
    entry: String,
    fakes: BTreeMap<String, FakeLibvirt>,
    period: Duration,
    stop: CancellationToken,
) {
    // (host, domain name, domain UUID) of every domain given its address.
    let mut given: HashSet<(String, String, _)> = HashSet::new();
    let mut next: u32 = 0;
    while !stop.is_cancelled() {
        for (i, (h, f)) in fakes.iter().enumerate() {
            for d in f.domains() {
                let key = (h.clone(), d.name.clone(), d.uuid);
                if d.state != domain_state::RUNNING || given.contains(&key) {
                    continue;
                }
                let Some(u) = names::uid_of_domain(&entry, &d.name) else {
                    continue;
                };
                let ip = format!("10.{}.{}.{}", i + 1, (next / 250) % 250, next % 250 + 2);
                next = next.wrapping_add(1);
                let iface = Interface::new("eth0", names::mac(&entry, &u)).addr(ip, 16);
                if f.set_interfaces(&d.name, vec![iface]).is_ok() {
                    given.insert(key);
                }
            }
        }
        // A domain that stopped or was recreated gets an address again.
        given.retain(|(h, n, uuid)| {
            fakes
                .get(h)
                .and_then(|f| f.domain(n))
                .is_some_and(|d| d.state == domain_state::RUNNING && d.uuid == *uuid)
        });
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(period) => {}
        }
    }
}

/// The controller settings of the standalone suites: a 3 s reconcile deadline, 200 ms..1 s
/// backoff, 200 ms provisioning and 1 s running polls, the rest default.
// NB: the fakes answer in microseconds, so these only need to be short enough that a
// convergence takes a few seconds, and long enough not to spin 2 loaded cores.
pub fn standalone_controller_settings() -> ControllerSettings {
    ControllerSettings {
        reconcile_deadline: Duration::from_secs(3),
        backoff_base: Duration::from_millis(200),
        backoff_max: Duration::from_secs(1),
        poll_provisioning: Duration::from_millis(200),
        poll_running: Duration::from_secs(1),
        ..ControllerSettings::default()
    }
}

/// Standalone options over manifest directory `dir` for the standalone suites: host checks
/// every second, GC hourly (i.e. never within a test unless changed), a 2 s shutdown grace
/// and [`standalone_controller_settings`]; everything else (workers, listen...) default.
// NB: 2 s grace: the fakes drain in milliseconds; a shutdown slower than that is a bug.
pub fn standalone_options(dir: &Path) -> StandaloneOptions {
    let mut o = StandaloneOptions::new(dir);
    o.check_interval = Duration::from_secs(1);
    o.gc_interval = Duration::from_secs(3600);
    o.shutdown_grace = Duration::from_secs(2);
    o.controller = standalone_controller_settings();
    o
}

/// Writes `DIR/NAME.yaml`: a Proxy `name` of provider `entry`, image `image`, pinned to
/// `host` when given, 4 GiB disk, 256 MiB memory, clients from 10.0.0.0/8.
pub fn write_proxy_manifest(dir: &Path, name: &str, entry: &str, image: &str, host: Option<&str>) {
    let pin = host.map(|h| format!("  host: {h}\n")).unwrap_or_default();
    std::fs::write(
        dir.join(format!("{name}.yaml")),
        format!(
            "apiVersion: egress-proxies.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: {name}\n\
             spec:\n  provider: {entry}\n{pin}  image: {image}\n  resources:\n    diskGiB: 4\n    \
             memoryMiB: 256\n  proxy:\n    allowedClientCidrs: [10.0.0.0/8]\n"
        ),
    )
    .unwrap();
}

/// A standalone instance running in this process with its HTTP server on 127.0.0.1.
pub struct Standalone {
    /// Where its HTTP server listens.
    pub addr: SocketAddr,
    /// Cancelling it asks the instance to shut down.
    pub stop: CancellationToken,
    /// The instance's run.
    pub task: JoinHandle<Result<(), StandaloneError>>,
}

/// Starts `run_with_providers(opts, providers)` on a free port of 127.0.0.1.
pub async fn start_standalone(opts: StandaloneOptions, providers: Providers) -> Standalone {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn(run_with_providers(opts, providers, l, stop.clone()));
    Standalone { addr, stop, task }
}

impl Standalone {
    /// Cancels the instance and waits up to `wait` for it to return; panics unless it
    /// returns `Ok` in time.
    pub async fn stop(self, wait: Duration) {
        self.stop.cancel();
        tokio::time::timeout(wait, self.task)
            .await
            .expect("standalone stops within its grace")
            .unwrap()
            .unwrap();
    }
}

/// GET `path` from `addr` over a fresh HTTP/1.1 connection (within [`HTTP_DEADLINE`]);
/// returns (status code, body).
pub async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = tokio::time::timeout(HTTP_DEADLINE, tokio::net::TcpStream::connect(addr))
        .await
        .unwrap()
        .unwrap();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = String::new();
    tokio::time::timeout(HTTP_DEADLINE, s.read_to_string(&mut buf))
        .await
        .unwrap()
        .unwrap();
    ep_test_support::http::response(&buf).unwrap_or_else(|| panic!("not a whole response: {buf}"))
}

/// `GET /status`, asserting 200, parsed.
pub async fn status(addr: SocketAddr) -> StatusDocument {
    let (code, body) = get(addr, "/status").await;
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Polls `/status` every [`STATUS_POLL`] until `ok` holds; panics after `timeout` with
/// `what` and the last document.
pub async fn wait_status(
    addr: SocketAddr,
    what: &str,
    timeout: Duration,
    ok: impl Fn(&StatusDocument) -> bool,
) {
    let t0 = Instant::now();
    loop {
        let d = status(addr).await;
        if ok(&d) {
            return;
        }
        assert!(
            t0.elapsed() < timeout,
            "timed out waiting for {what}: {d:#?}"
        );
        tokio::time::sleep(STATUS_POLL).await;
    }
}
