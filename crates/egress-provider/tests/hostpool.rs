//! The host pool: against libvirt-fake for the fault paths (close after open, frozen host,
//! failing and hanging dials) and against the real libvirtd through the real sshd.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use egress_provider::ErrorClass;
use egress_provider::error::ProviderError;
use egress_provider::libvirt::classify::classify;
use egress_provider::libvirt::config::{HostConfig, LibvirtEntry, Timeouts, VirtType};
use egress_provider::libvirt::hostpool::{
    Connector, HostPool, PoolOptions, SshConnector, UnixConnector,
};
use ep_test_support::sshd::Sshd;
use libvirt_fake::{ConnHandle, DEFAULT_HOSTNAME, FakeLibvirt, FaultSpec};
use libvirt_remote::Transport;
use tokio::time::Instant;

// ---- fixtures ----

fn host(name: &str, max_concurrent: u32) -> HostConfig {
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
        max_concurrent,
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

fn entry(hosts: Vec<HostConfig>, dial: Duration, call: Duration) -> LibvirtEntry {
    LibvirtEntry {
        name: "home".into(),
        hosts,
        images: BTreeMap::new(),
        url_images: Default::default(),
        max_image_bytes: 1 << 30,
        guest: Default::default(),
        timeouts: Timeouts {
            dial,
            call,
            ..Timeouts::default()
        },
        defaults: Default::default(),
        limits: Default::default(),
        policy: Default::default(),
        access: None,
        quotas: Default::default(),
    }
}

/// How a fake host answers a dial.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dial {
    Ok,
    Refuse,
    RefusePermanently,
    Hang,
}

/// Dials in-memory connections to one fake per host; counts dials; keeps the server-side
/// handles so a test can close a connection from the daemon's side.
#[derive(Default)]
struct FakeConnector {
    fakes: Mutex<HashMap<String, (FakeLibvirt, Dial)>>,
    delay: Mutex<Duration>,
    dials: AtomicU64,
    handles: Mutex<Vec<ConnHandle>>,
}

impl FakeConnector {
    fn with(hosts: &[(&str, &FakeLibvirt)]) -> Arc<Self> {
        let c = Self::default();
        for (h, f) in hosts {
            c.fakes
                .lock()
                .unwrap()
                .insert((*h).into(), ((*f).clone(), Dial::Ok));
        }
        Arc::new(c)
    }
    fn set(&self, host: &str, d: Dial) {
        self.fakes.lock().unwrap().get_mut(host).unwrap().1 = d;
    }
    fn last_handle(&self) -> ConnHandle {
        self.handles.lock().unwrap().last().unwrap().clone()
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
            Dial::Ok => {
                let (t, h) = fake.duplex();
                self.handles.lock().unwrap().push(h);
                Ok(t)
            }
            Dial::Refuse => Err(ProviderError::transient(format!(
                "connecting to host {}: connection refused",
                host.name
            ))),
            Dial::RefusePermanently => Err(ProviderError::permanent(format!(
                "connecting to host {}: host key mismatch",
                host.name
            ))),
            Dial::Hang => std::future::pending().await,
        }
    }
}

fn pool_of(
    hosts: Vec<HostConfig>,
    connector: Arc<dyn Connector>,
    dial: Duration,
    call: Duration,
    permit_wait: Duration,
) -> HostPool {
    HostPool::new(
        entry(hosts, dial, call),
        connector,
        PoolOptions { permit_wait },
    )
    .unwrap()
}

// ---- against libvirt-fake ----

#[tokio::test]
async fn a_connection_closed_right_after_open_is_redialed_by_the_next_acquire() {
    // finding: M6
    let fake = FakeLibvirt::new();
    let conn = FakeConnector::with(&[("h1", &fake)]);
    let pool = pool_of(
        vec![host("h1", 4)],
        conn.clone(),
        Duration::from_secs(10),
        Duration::from_secs(10),
        Duration::from_secs(10),
    );
    let first = pool.acquire("h1").await.unwrap();
    assert_eq!(first.client().hostname().await.unwrap(), DEFAULT_HOSTNAME);
    let mut previous = first.client().clone();
    drop(first);
    for i in 0..100u64 {
        // The daemon closes the pooled connection; the next dial gets one that the peer closes
        // right after CONNECT_OPEN (the seed's scenario).
        fake.faults_for_next_connection(FaultSpec {
            close_after_open: true,
            ..FaultSpec::default()
        });
        conn.last_handle().close();
        tokio::time::timeout(Duration::from_secs(5), previous.connection().closed())
            .await
            .expect("the client notices the daemon closing");

        let failed = async {
            let lease = pool.acquire("h1").await?;
            lease
                .client()
                .hostname()
                .await
                .map_err(|e| classify(&e, "reading the hostname of host h1"))
        };
        let err = tokio::time::timeout(Duration::from_secs(5), failed)
            .await
            .expect("a closed connection fails at once, it does not hang")
            .expect_err("the connection was closed after open");
        assert_eq!(err.class, ErrorClass::Transient, "iteration {i}: {err}");

        let lease = pool.acquire("h1").await.unwrap();
        assert_eq!(
            lease.client().hostname().await.unwrap(),
            DEFAULT_HOSTNAME,
            "iteration {i}: the next acquire redials and works"
        );
        previous = lease.client().clone();
        assert_eq!(pool.dials("h1"), 1 + 2 * (i + 1));
    }
    // Nothing accumulates: only the live control connection is open.
    tokio::time::timeout(Duration::from_secs(5), fake.wait_for_open_connections(1))
        .await
        .expect("dead connections are released");
}

#[tokio::test]
async fn concurrent_first_users_of_a_host_share_one_dial() {
    let fake = FakeLibvirt::new();
    let conn = FakeConnector::with(&[("h1", &fake)]);
    *conn.delay.lock().unwrap() = Duration::from_millis(200);
    let pool = pool_of(
        vec![host("h1", 32)],
        conn.clone(),
        Duration::from_secs(10),
        Duration::from_secs(10),
        Duration::from_secs(10),
    );
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let lease = pool.acquire("h1").await.unwrap();
                lease.client().hostname().await.unwrap()
            })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), DEFAULT_HOSTNAME);
    }
    assert_eq!(conn.dials.load(Ordering::SeqCst), 1);
    assert_eq!(fake.open_connections(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_frozen_host_pins_at_most_its_own_slots_while_other_hosts_keep_working() {
    // finding: H1
    let frozen = FakeLibvirt::new();
    let healthy = FakeLibvirt::new();
    let conn = FakeConnector::with(&[("a", &frozen), ("b", &healthy)]);
    let call = Duration::from_secs(10);
    let permit_wait = Duration::from_secs(2);
    let pool = pool_of(
        vec![host("a", 2), host("b", 2)],
        conn.clone(),
        Duration::from_secs(5),
        call,
        permit_wait,
    );
    drop(pool.acquire("a").await.unwrap());
    drop(pool.acquire("b").await.unwrap());
    frozen.faults().freeze();

    let started = Instant::now();
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let lease = pool.acquire("a").await.unwrap();
                let r = lease.client().hostname().await;
                let err = r.expect_err("a frozen host does not answer");
                lease.invalidate();
                (
                    classify(&err, "reading the hostname of host a"),
                    started.elapsed(),
                )
            })
        })
        .collect();
    tokio::task::yield_now().await;

    // A third worker on the frozen host waits for a slot, and gives up in bounded time.
    let t = Instant::now();
    let err = pool.acquire("a").await.expect_err("both slots are pinned");
    assert_eq!(err.class, ErrorClass::Transient);
    assert!(err.message.contains("host a is busy"), "{err}");
    assert!(err.message.contains("maxConcurrent"), "{err}");
    assert!(t.elapsed() <= permit_wait + Duration::from_millis(100));

    // Meanwhile the other host keeps working.
    let lease = pool.acquire("b").await.unwrap();
    assert_eq!(lease.client().hostname().await.unwrap(), DEFAULT_HOSTNAME);
    drop(lease);

    // The pinned calls fail in bounded time (their call deadline), Transient.
    for w in workers {
        let (err, elapsed) = w.await.unwrap();
        assert_eq!(err.class, ErrorClass::Transient, "{err}");
        assert!(elapsed <= call + Duration::from_secs(1), "{elapsed:?}");
    }

    // Once the host answers again, the next acquire redials (the lease invalidated the
    // frozen connection) and works.
    frozen.faults().thaw();
    let lease = pool.acquire("a").await.unwrap();
    assert_eq!(lease.client().hostname().await.unwrap(), DEFAULT_HOSTNAME);
    assert_eq!(pool.dials("a"), 2);
}

#[tokio::test]
async fn a_failed_dial_keeps_its_class_and_the_next_acquire_dials_again() {
    let fake = FakeLibvirt::new();
    let conn = FakeConnector::with(&[("h1", &fake)]);
    let pool = pool_of(
        vec![host("h1", 2)],
        conn.clone(),
        Duration::from_secs(10),
        Duration::from_secs(10),
        Duration::from_secs(10),
    );
    conn.set("h1", Dial::Refuse);
    let e = pool.acquire("h1").await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Transient);
    conn.set("h1", Dial::RefusePermanently);
    let e = pool.acquire("h1").await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Permanent);
    assert!(e.message.contains("h1"), "{e}");
    conn.set("h1", Dial::Ok);
    let lease = pool.acquire("h1").await.unwrap();
    assert_eq!(lease.client().hostname().await.unwrap(), DEFAULT_HOSTNAME);
    assert_eq!(conn.dials.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn a_dial_that_never_completes_fails_within_the_dial_budget() {
    let fake = FakeLibvirt::new();
    let conn = FakeConnector::with(&[("h1", &fake)]);
    conn.set("h1", Dial::Hang);
    let dial = Duration::from_secs(3);
    let pool = pool_of(
        vec![host("h1", 2)],
        conn.clone(),
        dial,
        Duration::from_secs(10),
        Duration::from_secs(10),
    );
    let t = Instant::now();
    let e = pool.acquire("h1").await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Transient);
    assert!(e.message.contains("did not complete within 9s"), "{e}");
    assert!(t.elapsed() <= pool.dial_budget() + Duration::from_millis(100));
}

#[tokio::test]
async fn a_host_that_freezes_during_the_handshake_fails_the_dial_in_bounded_time() {
    let fake = FakeLibvirt::new();
    fake.faults().freeze();
    let conn = FakeConnector::with(&[("h1", &fake)]);
    let pool = pool_of(
        vec![host("h1", 2)],
        conn,
        Duration::from_millis(300),
        Duration::from_secs(10),
        Duration::from_secs(10),
    );
    let e = tokio::time::timeout(Duration::from_secs(5), pool.acquire("h1"))
        .await
        .expect("bounded by the dial budget")
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::Transient, "{e}");
}

#[tokio::test]
async fn bulk_connections_are_dedicated_and_leave_the_control_connection_alone() {
    let fake = FakeLibvirt::new();
    let conn = FakeConnector::with(&[("h1", &fake)]);
    let pool = pool_of(
        vec![host("h1", 2)],
        conn.clone(),
        Duration::from_secs(10),
        Duration::from_secs(10),
        Duration::from_secs(10),
    );
    let lease = pool.acquire("h1").await.unwrap();
    let bulk = lease.bulk().await.unwrap();
    assert_eq!(fake.open_connections(), 2);
    assert_eq!(bulk.hostname().await.unwrap(), DEFAULT_HOSTNAME);
    bulk.close();
    bulk.connection().closed().await;
    assert_eq!(lease.client().hostname().await.unwrap(), DEFAULT_HOSTNAME);
    drop(lease);
    // The control connection is pooled: the next lease does not dial.
    let lease = pool.acquire("h1").await.unwrap();
    assert_eq!(lease.client().hostname().await.unwrap(), DEFAULT_HOSTNAME);
    assert_eq!(pool.dials("h1"), 2);
}

#[tokio::test]
async fn unknown_hosts_and_bad_settings_are_permanent_and_named() {
    let fake = FakeLibvirt::new();
    let conn = FakeConnector::with(&[("h1", &fake)]);
    let pool = pool_of(
        vec![host("h1", 2)],
        conn.clone(),
        Duration::from_secs(1),
        Duration::from_secs(1),
        Duration::from_secs(1),
    );
    let e = pool.acquire("h9").await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Permanent);
    assert!(e.message.contains("h9") && e.message.contains("h1"), "{e}");

    let e = HostPool::new(
        entry(
            vec![host("h1", 0)],
            Duration::from_secs(1),
            Duration::from_secs(1),
        ),
        conn.clone(),
        PoolOptions::default(),
    )
    .unwrap_err();
    assert!(e.message.contains("hosts[h1].maxConcurrent"), "{e}");
    let e = HostPool::new(
        entry(
            vec![host("h1", 1), host("h1", 1)],
            Duration::from_secs(1),
            Duration::from_secs(1),
        ),
        conn,
        PoolOptions::default(),
    )
    .unwrap_err();
    assert!(e.message.contains("appears twice"), "{e}");
}

#[tokio::test]
async fn the_unix_connector_reaches_a_daemon_listening_on_a_socket() {
    let fake = FakeLibvirt::new();
    let dir = scratch_dir("unix");
    let sock = dir.join("libvirt-sock");
    fake.listen_unix(&sock).await.unwrap();
    let mut h = host("local", 2);
    h.socket = sock.display().to_string();
    let t = Timeouts::default();
    let pool = HostPool::new(
        entry(vec![h], t.dial, t.call),
        Arc::new(UnixConnector::new(&t)),
        PoolOptions::default(),
    )
    .unwrap();
    let lease = pool.acquire("local").await.unwrap();
    assert_eq!(lease.client().hostname().await.unwrap(), DEFAULT_HOSTNAME);
    fake.shutdown();
    let _ = std::fs::remove_dir_all(dir);
}

fn scratch_dir(test: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let d = std::env::temp_dir().join(format!(
        "eptest-hostpool-{test}-{}-{nanos}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

// ---- against the real libvirtd through the real sshd ----

fn real_host(sshd: &Sshd, name: &str) -> HostConfig {
    HostConfig {
        address: format!("127.0.0.1:{}", sshd.port),
        ssh_key_file: Some(sshd.client_key_path.clone()),
        known_hosts_file: Some(sshd.known_hosts_path.clone()),
        ..host(name, 2)
    }
}

fn real_pool(sshd: &Sshd) -> (HostPool, Arc<SshConnector>) {
    let t = Timeouts::default();
    let connector = Arc::new(SshConnector::new(&t));
    let pool = HostPool::new(
        entry(vec![real_host(sshd, "h1")], t.dial, t.call),
        connector.clone(),
        PoolOptions::default(),
    )
    .unwrap();
    (pool, connector)
}

fn local_hostname() -> String {
    let out = std::process::Command::new("hostname").output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

#[tokio::test]
async fn acquire_through_the_real_sshd_reaches_the_real_libvirtd() {
    let sshd = Sshd::start();
    let (pool, _) = real_pool(&sshd);
    let t = Instant::now();
    let lease = pool.acquire("h1").await.unwrap();
    println!(
        "eptest: first acquire (SSH + libvirt dial) took {:?}",
        t.elapsed()
    );
    let t = Instant::now();
    drop(pool.acquire("h1").await.unwrap());
    println!("eptest: pooled acquire took {:?}", t.elapsed());
    let name = lease.client().hostname().await.unwrap();
    assert_eq!(name, local_hostname());
    assert!(lease.client().lib_version().await.unwrap() >= 11_000_000);
    let bulk = lease.bulk().await.unwrap();
    assert_eq!(bulk.hostname().await.unwrap(), name);
    bulk.close();
}

#[tokio::test]
async fn credentials_are_read_once_not_on_every_dial() {
    // finding: L19
    let sshd = Sshd::start();
    let (pool, connector) = real_pool(&sshd);
    let lease = pool.acquire("h1").await.unwrap();
    for _ in 0..5 {
        let bulk = lease.bulk().await.unwrap();
        bulk.hostname().await.unwrap();
        bulk.close();
    }
    assert_eq!(pool.dials("h1"), 6);
    assert_eq!(
        connector.credentials().reads(),
        2,
        "the key and known_hosts are read once for six dials"
    );
    // A rotated known_hosts file (replaced, as a Secret update does) is read again, once.
    let text = std::fs::read_to_string(&sshd.known_hosts_path).unwrap();
    let tmp = sshd.write_file("known_hosts.new", &text);
    std::fs::rename(&tmp, &sshd.known_hosts_path).unwrap();
    for _ in 0..3 {
        let bulk = lease.bulk().await.unwrap();
        bulk.close();
    }
    assert_eq!(connector.credentials().reads(), 3);
}

#[tokio::test]
async fn a_known_hosts_mismatch_is_permanent_and_names_the_host() {
    let sshd = Sshd::start();
    let other = ep_test_support::sshd::keygen(
        sshd.dir(),
        "not-the-host-key",
        ep_test_support::sshd::KeyKind::Ed25519,
        "",
    );
    let kh = sshd.write_file(
        "wrong_known_hosts",
        &format!("{} {}\n", sshd.known_hosts_name(), other.public),
    );
    let mut h = real_host(&sshd, "h1");
    h.known_hosts_file = Some(kh);
    let t = Timeouts::default();
    let pool = HostPool::new(
        entry(vec![h], t.dial, t.call),
        Arc::new(SshConnector::new(&t)),
        PoolOptions::default(),
    )
    .unwrap();
    let e = pool.acquire("h1").await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Permanent, "{e}");
    assert!(e.message.contains("host h1"), "{e}");
    assert!(
        e.message.contains(&format!("127.0.0.1:{}", sshd.port)),
        "{e}"
    );
}
