//! The host check: states, latency, truncation and what is missing, against libvirt-fake for
//! the fault paths and against the real libvirtd through the real sshd.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use egress_provider::error::ProviderError;
use egress_provider::libvirt::check::{
    CheckOptions, MAX_HOSTNAME_CHARS, check_all, check_host, check_host_with,
};
use egress_provider::libvirt::config::{
    Firmware, HostConfig, ImageFormat, ImageSpec, LibvirtEntry, Timeouts, VirtType,
};
use egress_provider::libvirt::hostpool::{Connector, HostPool, PoolOptions, SshConnector};
use egress_provider::{ErrorClass, HostState};
use ep_test_support::sshd::Sshd;
use libvirt_fake::{DEFAULT_HOSTNAME, FakeLibvirt, NetworkSpec, PoolSpec};
use libvirt_remote::Transport;

const GIB: u64 = 1 << 30;

// ---- fixtures ----

fn host(name: &str) -> HostConfig {
    HostConfig {
        name: name.into(),
        address: format!("{name}.invalid"),
        user: "root".into(),
        socket: "/run/libvirt/libvirt-sock".into(),
        pool: "default".into(),
        bridge: None,
        network: None,
        virt_type: VirtType::Qemu,
        pool_reserve_gib: 0,
        ssh_key_file: None,
        known_hosts_file: None,
        max_concurrent: 4,
        guest_cidr: Vec::new(),
        address_pool: None,
        maintenance: Default::default(),
        segment: None,
        fence: None,
        host_addresses: Vec::new(),
        capacity: Default::default(),
        access: None,
    }
}

fn entry(hosts: Vec<HostConfig>, dial: Duration) -> LibvirtEntry {
    LibvirtEntry {
        name: "home".into(),
        hosts,
        images: BTreeMap::new(),
        url_images: Default::default(),
        max_image_bytes: GIB,
        guest: Default::default(),
        timeouts: Timeouts {
            dial,
            ..Timeouts::default()
        },
        defaults: Default::default(),
        limits: Default::default(),
        policy: Default::default(),
        access: None,
        quotas: Default::default(),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Dial {
    Ok,
    Refuse,
    Hang,
}

/// One fake per host, in memory; an optional delay before each dial.
#[derive(Default)]
struct FakeConnector {
    fakes: Mutex<HashMap<String, (FakeLibvirt, Dial)>>,
    delay: Mutex<Duration>,
    dials: AtomicU64,
}

impl FakeConnector {
    fn with(hosts: &[(&str, &FakeLibvirt, Dial)]) -> Arc<Self> {
        let c = Self::default();
        for (h, f, d) in hosts {
            c.fakes
                .lock()
                .unwrap()
                .insert((*h).into(), ((*f).clone(), *d));
        }
        Arc::new(c)
    }
}

#[async_trait]
impl Connector for FakeConnector {
    async fn connect(&self, host: &HostConfig) -> Result<Transport, ProviderError> {
        self.dials.fetch_add(1, Ordering::SeqCst);
        let delay = *self.delay.lock().unwrap();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let (fake, mode) = self.fakes.lock().unwrap().get(&host.name).cloned().unwrap();
        match mode {
            Dial::Ok => Ok(fake.connect_duplex()),
            Dial::Refuse => Err(ProviderError::transient(format!(
                "connecting to host {}: connection refused",
                host.name
            ))),
            Dial::Hang => std::future::pending().await,
        }
    }
}

fn fake_with_pool() -> FakeLibvirt {
    let f = FakeLibvirt::new();
    f.add_pool(PoolSpec::new("default").capacity(100 * GIB))
        .unwrap();
    f
}

fn pool_of(e: LibvirtEntry, c: Arc<dyn Connector>) -> HostPool {
    HostPool::new(e, c, PoolOptions::default()).unwrap()
}

// ---- against libvirt-fake ----

#[tokio::test]
async fn a_healthy_host_is_ready_with_version_hostname_virt_types_and_pool_space() {
    let fake = fake_with_pool();
    fake.set_pool_usage("default", 40 * GIB, 60 * GIB).unwrap();
    let mut h = host("h1");
    h.pool_reserve_gib = 10;
    let pool = pool_of(
        entry(vec![h], Duration::from_secs(10)),
        FakeConnector::with(&[("h1", &fake, Dial::Ok)]),
    );
    let r = check_host(&pool, "h1").await;
    assert_eq!(r.state, HostState::Ready, "{r:?}");
    assert_eq!(r.libvirt_version.as_deref(), Some("11.3.0"));
    assert_eq!(r.hostname.as_deref(), Some(DEFAULT_HOSTNAME));
    // The fake answers qemu (TCG) domain capabilities whatever is asked: kvm is not usable.
    assert_eq!(r.virt_types, vec!["qemu".to_owned()]);
    assert!(r.uefi);
    // finding: M4 (figures read after a refresh), reserve applied
    assert_eq!(r.pool_free_bytes, Some(50 * GIB));
    assert!(r.latency.is_some());
    assert!(r.missing.is_empty() && r.error.is_none(), "{r:?}");
}

#[tokio::test]
async fn what_the_host_lacks_is_named_and_makes_it_degraded() {
    // finding: M7
    let fake = FakeLibvirt::new();
    fake.add_pool(PoolSpec::new("default").capacity(100 * GIB).available(GIB))
        .unwrap();
    // Domain capabilities without a UEFI loader.
    let domcaps = libvirt_fake::DEFAULT_DOMAIN_CAPABILITIES
        .replace("<loader supported='yes'>", "<loader supported='no'>")
        .replace("<value>/usr/share/OVMF/OVMF_CODE_4M.fd</value>", "");
    fake.set_domain_capabilities(domcaps);
    let mut h = host("h1");
    h.network = Some("nonet".into());
    h.virt_type = VirtType::Kvm;
    h.pool_reserve_gib = 2;
    let mut e = entry(vec![h], Duration::from_secs(10));
    e.images.insert(
        "debian-uefi".into(),
        ImageSpec {
            url: "https://images.example/d.qcow2".into(),
            sha256: None,
            format: ImageFormat::Qcow2,
            firmware: Firmware::Uefi,
            ca_file: None,
        },
    );
    let pool = pool_of(e, FakeConnector::with(&[("h1", &fake, Dial::Ok)]));
    let r = check_host(&pool, "h1").await;
    assert_eq!(r.state, HostState::Degraded, "{r:?}");
    let missing = r.missing.join(" | ");
    assert!(
        missing.contains("virt type kvm (hosts[h1].virtType)"),
        "{missing}"
    );
    assert!(
        missing.contains("UEFI") && missing.contains("debian-uefi"),
        "{missing}"
    );
    assert!(
        missing.contains("network nonet (hosts[h1].network)"),
        "{missing}"
    );
    assert!(missing.contains("poolReserveGiB"), "{missing}");
    assert_eq!(r.pool_free_bytes, Some(0));

    // A missing pool is named too.
    let fake = FakeLibvirt::new();
    fake.add_network(NetworkSpec::new("net1")).unwrap();
    let mut h = host("h2");
    h.network = Some("net1".into());
    let pool = pool_of(
        entry(vec![h], Duration::from_secs(10)),
        FakeConnector::with(&[("h2", &fake, Dial::Ok)]),
    );
    let r = check_host(&pool, "h2").await;
    assert_eq!(r.state, HostState::Degraded, "{r:?}");
    assert_eq!(
        r.missing,
        vec!["storage pool default (hosts[h2].pool)".to_owned()]
    );
}

#[tokio::test(start_paused = true)]
async fn each_host_keeps_its_own_state_timeout_only_for_its_own_deadline() {
    // finding: L16
    let stalled = FakeLibvirt::new(); // accepts the dial, never answers the libvirt handshake
    stalled.faults().freeze();
    let frozen_after = fake_with_pool(); // answers the dial, then stops answering
    let refused = FakeLibvirt::new();
    let healthy = fake_with_pool();
    let conn = FakeConnector::with(&[
        ("stalled", &stalled, Dial::Ok),
        ("hanging", &stalled, Dial::Hang),
        ("frozen", &frozen_after, Dial::Ok),
        ("refused", &refused, Dial::Refuse),
        ("healthy", &healthy, Dial::Ok),
    ]);
    let dial = Duration::from_secs(2);
    let pool = pool_of(
        entry(
            vec![
                host("stalled"),
                host("hanging"),
                host("frozen"),
                host("refused"),
                host("healthy"),
            ],
            dial,
        ),
        conn,
    );
    // Connect "frozen", then make it stop answering.
    pool.control("frozen").await.unwrap();
    frozen_after.faults().freeze();

    let opts = CheckOptions::default();
    let reports = check_all(&pool, &opts).await.unwrap();
    let by: HashMap<_, _> = reports.iter().map(|r| (r.host.as_str(), r)).collect();
    assert_eq!(reports.len(), 5);
    assert_eq!(
        by["stalled"].state,
        HostState::Unreachable,
        "{:?}",
        by["stalled"]
    );
    assert_eq!(
        by["hanging"].state,
        HostState::Unreachable,
        "{:?}",
        by["hanging"]
    );
    assert_eq!(by["refused"].state, HostState::Unreachable);
    assert!(
        by["refused"]
            .error
            .as_deref()
            .unwrap()
            .contains("connection refused"),
        "the host's own reason is kept: {:?}",
        by["refused"]
    );
    assert_eq!(by["frozen"].state, HostState::Timeout, "{:?}", by["frozen"]);
    assert!(
        by["frozen"]
            .error
            .as_deref()
            .unwrap()
            .contains("reading the libvirt version"),
        "{:?}",
        by["frozen"]
    );
    assert_eq!(by["healthy"].state, HostState::Ready, "{:?}", by["healthy"]);
}

#[tokio::test]
async fn a_round_timeout_that_cannot_cover_the_dial_budget_is_refused() {
    // finding: L17
    let fake = fake_with_pool();
    let pool = pool_of(
        entry(vec![host("h1")], Duration::from_secs(10)),
        FakeConnector::with(&[("h1", &fake, Dial::Ok)]),
    );
    let opts = CheckOptions {
        round_timeout: Some(Duration::from_secs(10)),
        ..CheckOptions::default()
    };
    let e = check_all(&pool, &opts).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Permanent);
    assert!(e.message.contains("round timeout 10s"), "{e}");
    assert!(e.message.contains("timeouts.dial"), "{e}");
    // Many hosts at one at a time need more than one host's budget.
    let hosts: Vec<_> = (0..3).map(|i| host(&format!("h{i}"))).collect();
    let pool = pool_of(
        entry(hosts, Duration::from_secs(10)),
        FakeConnector::with(&[]),
    );
    let opts = CheckOptions {
        round_timeout: Some(Duration::from_secs(60)),
        max_parallel: 1,
        ..CheckOptions::default()
    };
    assert!(opts.validate(&pool).is_err());
    // Unset, the round timeout is computed from the waves and always covers them.
    let opts = CheckOptions {
        max_parallel: 1,
        ..CheckOptions::default()
    };
    opts.validate(&pool).unwrap();
    assert!(opts.effective_round_timeout(&pool) >= Duration::from_secs(3 * 50));
    let opts = CheckOptions {
        round_timeout: Some(Duration::from_secs(150)),
        max_parallel: 1,
        ..CheckOptions::default()
    };
    opts.validate(&pool).unwrap();
}

#[tokio::test(start_paused = true)]
async fn latency_is_the_probe_call_only_not_the_dial_or_a_teardown() {
    // finding: L15
    let fake = fake_with_pool();
    let conn = FakeConnector::with(&[("h1", &fake, Dial::Ok)]);
    *conn.delay.lock().unwrap() = Duration::from_secs(5);
    let pool = pool_of(
        entry(vec![host("h1")], Duration::from_secs(10)),
        conn.clone(),
    );
    fake.faults()
        .delay_replies(Some(Duration::from_millis(300)));
    let r = check_host(&pool, "h1").await;
    assert_eq!(r.state, HostState::Ready, "{r:?}");
    let latency = r.latency.unwrap();
    assert!(
        latency >= Duration::from_millis(300) && latency < Duration::from_secs(1),
        "one call of 300 ms, not the 5 s dial: {latency:?}"
    );
    // The next round reuses the pooled connection: no dial, no teardown per round.
    let r = check_host(&pool, "h1").await;
    assert_eq!(r.state, HostState::Ready);
    assert_eq!(conn.dials.load(Ordering::SeqCst), 1);
    assert_eq!(fake.open_connections(), 1);
}

#[tokio::test]
async fn a_huge_remote_hostname_is_truncated() {
    // finding: L18
    let fake = fake_with_pool();
    fake.set_hostname(format!("h{}", "x".repeat(100_000)));
    let pool = pool_of(
        entry(vec![host("h1")], Duration::from_secs(10)),
        FakeConnector::with(&[("h1", &fake, Dial::Ok)]),
    );
    let r = check_host(&pool, "h1").await;
    assert_eq!(r.state, HostState::Ready, "{r:?}");
    assert_eq!(r.hostname.unwrap().chars().count(), MAX_HOSTNAME_CHARS);
}

#[tokio::test]
async fn many_hosts_are_checked_with_bounded_fan_out_in_entry_order() {
    // finding: L19
    let fakes: Vec<_> = (0..6).map(|_| fake_with_pool()).collect();
    let names: Vec<String> = (0..6).map(|i| format!("h{i}")).collect();
    let spec: Vec<_> = names
        .iter()
        .zip(&fakes)
        .map(|(n, f)| (n.as_str(), f, Dial::Ok))
        .collect();
    let conn = FakeConnector::with(&spec);
    let pool = pool_of(
        entry(
            names.iter().map(|n| host(n)).collect(),
            Duration::from_secs(10),
        ),
        conn,
    );
    let opts = CheckOptions {
        max_parallel: 2,
        round_timeout: Some(Duration::from_secs(150)),
        ..CheckOptions::default()
    };
    let reports = check_all(&pool, &opts).await.unwrap();
    let got: Vec<_> = reports.iter().map(|r| r.host.clone()).collect();
    assert_eq!(got, names);
    assert!(reports.iter().all(|r| r.state == HostState::Ready));
}

#[tokio::test(start_paused = true)]
async fn a_host_answering_each_call_slowly_is_cut_by_its_own_probe_budget() {
    let fake = fake_with_pool();
    let pool = pool_of(
        entry(vec![host("h1")], Duration::from_secs(10)),
        FakeConnector::with(&[("h1", &fake, Dial::Ok)]),
    );
    pool.control("h1").await.unwrap();
    // Each call takes 4 s: under the 10 s call deadline, but 9 of them exceed 20 s.
    fake.faults().delay_replies(Some(Duration::from_secs(4)));
    let opts = CheckOptions::default();
    let r = check_host_with(&pool, "h1", &opts).await;
    assert_eq!(r.state, HostState::Timeout, "{r:?}");
    assert!(r.error.unwrap().contains("probe calls"));
}

// ---- against the real libvirtd through the real sshd ----

fn virsh(args: &[&str]) -> std::process::Output {
    Command::new("timeout")
        .args(["60", "virsh", "-q", "-c", "qemu:///system"])
        .args(args)
        .output()
        .unwrap()
}

/// A transient dir pool named `eptest-check-…`, destroyed with its directory on drop.
struct ScratchPool {
    name: String,
    dir: PathBuf,
}

impl ScratchPool {
    fn create(test: &str) -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let name = format!(
            "eptest-{test}-{secs}-{:04x}{:04x}",
            std::process::id() & 0xffff,
            N.fetch_add(1, Ordering::Relaxed)
        );
        println!("eptest: creating pool {name}");
        let dir = std::env::temp_dir().join(&name);
        std::fs::create_dir_all(&dir).unwrap();
        let out = virsh(&[
            "pool-create-as",
            &name,
            "dir",
            "--target",
            dir.to_str().unwrap(),
        ]);
        let guard = Self { name, dir };
        assert!(
            out.status.success(),
            "pool-create-as: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        guard
    }
}

impl Drop for ScratchPool {
    fn drop(&mut self) {
        let _ = virsh(&["pool-destroy", &self.name]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn real_pool(sshd: &Sshd, h: HostConfig) -> HostPool {
    let t = Timeouts::default();
    let h = HostConfig {
        address: format!("127.0.0.1:{}", sshd.port),
        ssh_key_file: Some(sshd.client_key_path.clone()),
        known_hosts_file: Some(sshd.known_hosts_path.clone()),
        ..h
    };
    HostPool::new(
        entry(vec![h], t.dial),
        Arc::new(SshConnector::new(&t)),
        PoolOptions::default(),
    )
    .unwrap()
}

#[tokio::test]
async fn the_real_host_is_ready_through_ssh_with_its_version_and_pool_space() {
    let sshd = Sshd::start();
    let sp = ScratchPool::create("check-ready");
    let mut h = host("h1");
    h.pool = sp.name.clone();
    let pool = real_pool(&sshd, h);
    let r = check_host(&pool, "h1").await;
    assert_eq!(r.state, HostState::Ready, "{r:?}");
    let version = r.libvirt_version.clone().unwrap();
    let major: u32 = version.split('.').next().unwrap().parse().unwrap();
    assert!(major >= 11, "{version}");
    assert!(r.hostname.as_deref().is_some_and(|h| !h.is_empty()));
    assert!(r.virt_types.contains(&"qemu".to_owned()), "{r:?}");
    assert!(r.pool_free_bytes.unwrap() > 0);
    assert!(r.latency.is_some());
    println!("eptest: real check report: {r:?}");
}

#[tokio::test]
async fn the_real_host_names_a_missing_network_bridge_and_pool() {
    // finding: M7
    let sshd = Sshd::start();
    let mut h = host("h1");
    h.network = Some("eptest-no-such-network".into());
    h.bridge = Some("eptestnobr0".into());
    h.pool = "eptest-no-such-pool".into();
    let pool = real_pool(&sshd, h);
    let r = check_host(&pool, "h1").await;
    assert_eq!(r.state, HostState::Degraded, "{r:?}");
    assert_eq!(
        r.missing,
        vec![
            "network eptest-no-such-network (hosts[h1].network)".to_owned(),
            "bridge eptestnobr0 (hosts[h1].bridge)".to_owned(),
            "storage pool eptest-no-such-pool (hosts[h1].pool)".to_owned(),
        ]
    );
}

#[tokio::test]
async fn a_host_whose_sshd_refuses_is_unreachable_with_its_reason() {
    let sshd = Sshd::start();
    let pool = real_pool(&sshd, host("h1"));
    drop(sshd); // nothing listens on that port any more
    let r = check_host(&pool, "h1").await;
    assert_eq!(r.state, HostState::Unreachable, "{r:?}");
    assert!(r.error.as_deref().unwrap().contains("h1"), "{r:?}");
}

#[tokio::test]
async fn an_entry_of_many_hosts_is_checked_with_the_default_options() {
    // finding: L17
    // 40 hosts with the default 10 s dial: a fixed 60 s round used to refuse the whole round,
    // so every host read Degraded and received no placements.
    let fake = fake_with_pool();
    let names: Vec<String> = (0..40).map(|i| format!("h{i}")).collect();
    let dials: Vec<(&str, &FakeLibvirt, Dial)> = names
        .iter()
        .map(|n| (n.as_str(), &fake, Dial::Ok))
        .collect();
    let pool = pool_of(
        entry(
            names.iter().map(|n| host(n)).collect(),
            Duration::from_secs(10),
        ),
        FakeConnector::with(&dials),
    );
    let reports = check_all(&pool, &CheckOptions::default()).await.unwrap();
    assert_eq!(reports.len(), 40);
    assert!(
        reports.iter().all(|r| r.state == HostState::Ready),
        "{reports:?}"
    );
}
