//! The Kubernetes driver end to end without a cluster: the real kube-runtime Controller, event
//! Recorder and Lease elector against the in-process fake API server (kube-fake), over
//! libvirt-fake hosts with a pre-published base image.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use ep_operator_fixtures::health_proxies as health_support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use egress_core::controller::ControllerSettings;
use egress_core::health::HealthSettings;
use egress_core::model::{Phase, ProxySettings, ProxySpec, Resources};
use egress_core::providers::Providers;
use egress_kube::api::{Proxy, ProxyCrdSpec, ProxyPool};
use egress_kube::driver::{DriverStats, KubeOptions, Reload, run_with};
use egress_kube::leader::LeaseSettings;
use egress_kube::observe::Observer;
use egress_provider::libvirt::names;
use ep_operator_fixtures::{FakeHosts, qcow2_image};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube_fake::FakeApiServer;
use libvirt_fake::{FakeLibvirt, Interface};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const ENTRY: &str = "home";
const IMAGE: &str = "tiny";
/// An image only a reloaded config has.
const LATE_IMAGE: &str = "late";
const GROUP: &str = "egress-proxies.dev";
/// Hang guard of every wait (the fakes answer in milliseconds).
const WAIT: Duration = Duration::from_secs(30);

fn digest(c: char) -> String {
    c.to_string().repeat(64)
}

/// Host h1 with the pool and published bases of IMAGE and LATE_IMAGE; only IMAGE is in the
/// catalogue (a reloaded config adds LATE_IMAGE, see [`providers`]).
fn fake_hosts() -> FakeHosts {
    FakeHosts::new(ENTRY, &["h1"])
        .max_concurrent(4)
        .short_timeouts()
        .short_permit_wait()
        .published_image(IMAGE, &digest('a'))
        .publish(LATE_IMAGE, &digest('b'))
}

fn providers(hosts: &FakeHosts, with_late: bool) -> Providers {
    if with_late {
        let url = format!("https://images.invalid/{LATE_IMAGE}.qcow2");
        hosts
            .clone()
            .image(LATE_IMAGE, qcow2_image(url, digest('b')))
            .providers()
    } else {
        hosts.providers()
    }
}

struct Replica {
    stats: Arc<DriverStats>,
    observer: Arc<Observer>,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

struct World {
    api: FakeApiServer,
    hosts: FakeHosts,
    fakes: BTreeMap<String, FakeLibvirt>,
    late: Arc<AtomicBool>,
    dir: tempfile::TempDir,
    /// Guest address per Proxy name (others get [`DEFAULT_IP`]).
    addrs: Mutex<BTreeMap<String, String>>,
}

impl Drop for World {
    fn drop(&mut self) {
        // NB: every test's world checks, at its end, that nothing the operator wrote was pruned.
        if !std::thread::panicking() {
            self.assert_nothing_pruned();
        }
    }
}

/// The pool the flat-template test writes in the shape of earlier versions.
const FLAT_POOL: &str = "flat-template";

/// The address a guest reports unless the test chose one.
const DEFAULT_IP: &str = "192.168.122.10";

impl World {
    fn new() -> Self {
        // The committed CRDs, so every write is pruned, defaulted and validated (schema and CEL
        // rules) as a real API server would, and their status/scale subresources are served.
        let api = FakeApiServer::new();
        let crds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/crds");
        assert_eq!(api.install_crds_from_dir(&crds).unwrap(), 3);
        let hosts = fake_hosts();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("providers.yaml"), "v1").unwrap();
        Self {
            api,
            fakes: hosts.fakes().clone(),
            hosts,
            late: Arc::new(AtomicBool::new(false)),
            dir,
            addrs: Mutex::new(BTreeMap::new()),
        }
    }

    /// Fails when the fake dropped a field the operator wrote: the schema does not declare it,
    /// so on a real cluster it would be lost.
    fn assert_nothing_pruned(&self) {
        // NB: the flat-template test writes unknown fields itself, to see them refused.
        let dropped: Vec<_> = self
            .api
            .dropped_fields()
            .into_iter()
            .filter(|d| !d.object.ends_with(&format!("/proxypools/{FLAT_POOL}")))
            .collect();
        assert!(
            dropped.is_empty(),
            "the API server pruned fields the operator wrote: {dropped:#?}"
        );
    }

    fn options(&self, identity: &str) -> KubeOptions {
        let mut lease = LeaseSettings::new("egress-proxies", "ops", identity);
        lease.lease_duration = Duration::from_secs(10);
        lease.renew_deadline = Duration::from_secs(5);
        lease.retry_period = Duration::from_millis(100);
        let mut o = KubeOptions::new(self.dir.path().join("providers.yaml"), lease);
        o.controller = ControllerSettings {
            reconcile_deadline: Duration::from_secs(2),
            backoff_base: Duration::from_millis(50),
            backoff_max: Duration::from_millis(200),
            poll_provisioning: Duration::from_millis(50),
            poll_running: Duration::from_millis(100),
            ..ControllerSettings::default()
        };
        o.gc_interval = Duration::from_millis(100);
        o.check_interval = Duration::from_millis(200);
        o.watch_interval = Duration::from_millis(50);
        o.shutdown_grace = Duration::from_secs(2);
        o
    }

    fn start(&self, identity: &str) -> Replica {
        self.start_with(identity, None, |_| {})
    }

    fn start_with(
        &self,
        identity: &str,
        health: Option<HealthSettings>,
        tweak: impl FnOnce(&mut KubeOptions),
    ) -> Replica {
        let mut opts = self.options(identity);
        tweak(&mut opts);
        let observer = Arc::new(Observer::new(health));
        let (hosts, late) = (self.hosts.clone(), self.late.clone());
        let reload: Reload = Arc::new(move || Ok(providers(&hosts, late.load(Ordering::SeqCst))));
        let stats = Arc::new(DriverStats::default());
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(run_with(
            opts,
            self.api.client("default"),
            providers(&self.hosts, self.late.load(Ordering::SeqCst)),
            reload,
            stats.clone(),
            observer.clone(),
            shutdown.clone(),
        ));
        Replica {
            stats,
            observer,
            shutdown,
            task,
        }
    }

    fn proxies(&self) -> Api<Proxy> {
        Api::namespaced(self.api.client("default"), "default")
    }

    fn proxy_json(&self, name: &str) -> Option<Value> {
        self.api.object(GROUP, "proxies", "default", name)
    }

    /// The guest "boots": its agent reports an address on the instance's NIC.
    fn give_addresses(&self) {
        for p in self.api.objects(GROUP, "proxies") {
            let Some(uid) = p["metadata"]["uid"]
                .as_str()
                .and_then(egress_provider::ProxyUid::parse_strict)
            else {
                continue;
            };
            let ip = p["metadata"]["name"]
                .as_str()
                .and_then(|n| self.addrs.lock().unwrap().get(n).cloned())
                .unwrap_or_else(|| DEFAULT_IP.to_owned());
            let name = names::domain(ENTRY, &uid);
            for fake in self.fakes.values() {
                if fake.domain(&name).is_some() {
                    let _ = fake.set_interfaces(
                        &name,
                        vec![Interface::new("eth0", names::mac(ENTRY, &uid)).addr(ip.clone(), 24)],
                    );
                }
            }
        }
    }

    /// Waits until `f` holds, giving guests addresses meanwhile. `f` says `true`/`Ok(())`
    /// when it holds; an `Err` says what it saw instead, printed if the wait runs out.
    async fn until<C: Condition>(&self, what: &str, f: impl Fn(&Self) -> C) {
        let t = Instant::now();
        loop {
            let missing = match f(self).check() {
                Ok(()) => return,
                Err(m) => m,
            };
            assert!(
                t.elapsed() < WAIT,
                "timed out after {:?} waiting for {what}; {missing}proxies' status: {:?}",
                t.elapsed(),
                self.api
                    .objects(GROUP, "proxies")
                    .iter()
                    .map(|p| p.get("status").cloned())
                    .collect::<Vec<_>>()
            );
            self.give_addresses();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn events(&self) -> Vec<(String, String)> {
        self.api
            .objects("events.k8s.io", "events")
            .into_iter()
            .map(|e| {
                (
                    e["type"].as_str().unwrap_or("").to_owned(),
                    e["reason"].as_str().unwrap_or("").to_owned(),
                )
            })
            .collect()
    }
}

/// What [`World::until`] waits for: a plain `bool`, or `Result<(), String>` whose error says
/// what was seen instead of what is awaited.
trait Condition {
    /// `Err` carries the explanation printed when the wait runs out (empty for a `bool`).
    fn check(self) -> Result<(), String>;
}

impl Condition for bool {
    fn check(self) -> Result<(), String> {
        if self { Ok(()) } else { Err(String::new()) }
    }
}

impl Condition for Result<(), String> {
    fn check(self) -> Result<(), String> {
        self.map_err(|m| format!("saw: {m}; "))
    }
}

fn phase_of(v: &Option<Value>) -> Option<String> {
    v.as_ref()?
        .pointer("/status/phase")?
        .as_str()
        .map(str::to_owned)
}

fn ready_reason(v: &Option<Value>) -> Option<String> {
    v.as_ref()?
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")?["reason"]
        .as_str()
        .map(str::to_owned)
}

fn spec(image: &str) -> ProxySpec {
    ProxySpec {
        provider: ENTRY.into(),
        host: None,
        image: image.into(),
        resources: Resources::default(),
        proxy: ProxySettings {
            allowed_client_cidrs: vec!["10.0.0.0/8".into()],
            ..ProxySettings::default()
        },
        egress: Default::default(),
    }
}

async fn create(w: &World, name: &str, image: &str) {
    let p = Proxy::new(name, ProxyCrdSpec(spec(image)));
    w.proxies()
        .create(&PostParams::default(), &p)
        .await
        .unwrap();
}

async fn stop(r: Replica) {
    r.shutdown.cancel();
    let t = Instant::now();
    tokio::time::timeout(WAIT, r.task).await.unwrap().unwrap();
    eprintln!("replica stopped in {:?}", t.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_runs_with_status_and_events_and_its_deletion_waits_for_the_instance() {
    let w = World::new();
    let r = w.start("a");
    create(&w, "p1", IMAGE).await;
    w.until("p1 Running", |w| {
        phase_of(&w.proxy_json("p1")).as_deref() == Some(Phase::Running.as_str())
    })
    .await;
    let p = w.proxy_json("p1").unwrap();
    assert_eq!(p["status"]["ip"], "192.168.122.10");
    assert_eq!(
        p["metadata"]["finalizers"][0],
        egress_kube::driver::FINALIZER
    );
    let managers: Vec<&str> = p["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["operation"] == "Apply")
        .map(|m| m["manager"].as_str().unwrap())
        .collect();
    assert_eq!(managers, [egress_kube::driver::FIELD_MANAGER]);
    let uid =
        egress_provider::ProxyUid::parse_strict(p["metadata"]["uid"].as_str().unwrap()).unwrap();
    let domain = names::domain(ENTRY, &uid);
    assert!(w.fakes["h1"].domain(&domain).is_some());
    w.until("a Running event", |w| {
        w.events()
            .iter()
            .any(|(t, r)| t == "Normal" && r == "Running")
    })
    .await;

    w.proxies()
        .delete("p1", &DeleteParams::default())
        .await
        .unwrap();
    w.until("p1 gone", |w| w.proxy_json("p1").is_none()).await;
    assert!(
        w.fakes["h1"].domain(&domain).is_none(),
        "the finalizer is removed only after the instance is gone"
    );
    stop(r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transient_failure_sets_a_condition_and_an_event_and_is_retried() {
    // finding: APX-2
    let w = World::new();
    w.fakes["h1"].faults().freeze();
    let r = w.start("a");
    create(&w, "p1", IMAGE).await;
    // The create's transient error, or (when the health loop saw the frozen host first)
    // placement refusing the unreachable host: either way a visible, non-latching condition.
    w.until("a transient condition", |w| {
        matches!(
            ready_reason(&w.proxy_json("p1")).as_deref(),
            Some("TransientError" | "NoUsableHost")
        )
    })
    .await;
    w.until("a warning event", |w| {
        w.events().iter().any(|(t, _)| t == "Warning")
    })
    .await;
    // Not latched: once the host answers again the same object converges.
    w.fakes["h1"].faults().thaw();
    w.until("p1 Running after the host recovers", |w| {
        phase_of(&w.proxy_json("p1")).as_deref() == Some("Running")
    })
    .await;
    stop(r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_failure_latches_until_the_spec_changes() {
    let w = World::new();
    let r = w.start("a");
    create(&w, "p1", "no-such-image").await;
    w.until("p1 Failed", |w| {
        phase_of(&w.proxy_json("p1")).as_deref() == Some("Failed")
    })
    .await;
    let rv = w.proxy_json("p1").unwrap()["metadata"]["resourceVersion"].clone();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        w.proxy_json("p1").unwrap()["metadata"]["resourceVersion"],
        rv,
        "a latched failure is not retried (no status churn)"
    );
    let fix = json!({"spec": {"image": IMAGE}});
    w.proxies()
        .patch("p1", &PatchParams::default(), &Patch::Merge(&fix))
        .await
        .unwrap();
    w.until("p1 Running after the spec change", |w| {
        phase_of(&w.proxy_json("p1")).as_deref() == Some("Running")
    })
    .await;
    stop(r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_config_change_releases_a_latched_failure() {
    let w = World::new();
    let r = w.start("a");
    create(&w, "p1", LATE_IMAGE).await;
    w.until("p1 Failed", |w| {
        phase_of(&w.proxy_json("p1")).as_deref() == Some("Failed")
    })
    .await;
    // The operator's config gains the image; the mounted file changes.
    w.late.store(true, Ordering::SeqCst);
    std::fs::write(w.dir.path().join("providers.yaml"), "v2").unwrap();
    w.until("p1 Running after the config change", |w| {
        phase_of(&w.proxy_json("p1")).as_deref() == Some("Running")
    })
    .await;
    assert_eq!(r.stats.reloads.load(Ordering::Relaxed), 1);
    stop(r).await;
}

fn holder(w: &World) -> Option<String> {
    w.api
        .object("coordination.k8s.io", "leases", "ops", "egress-proxies")
        .and_then(|l| serde_json::from_value::<Lease>(l).ok())
        .and_then(|l| l.spec?.holder_identity)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_runs_gc_and_a_released_lease_hands_over_within_seconds() {
    // finding: APX-3
    let w = World::new();
    let a = w.start("a");
    w.until("a leads", |w| holder(w).as_deref() == Some("a"))
        .await;
    let b = w.start("b");
    w.until("a runs GC", |_| {
        a.stats.gc_passes.load(Ordering::Relaxed) >= 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        b.stats.gc_passes.load(Ordering::Relaxed),
        0,
        "a follower never runs GC"
    );
    assert_eq!(b.stats.health_rounds.load(Ordering::Relaxed), 0);
    assert_eq!(b.stats.terms.load(Ordering::Relaxed), 0);

    // Graceful shutdown of the leader (SIGTERM in a rollout) releases the Lease.
    let t = Instant::now();
    let a_stats = a.stats.clone();
    stop(a).await;
    let a_passes = a_stats.gc_passes.load(Ordering::Relaxed);
    w.until("b leads", |w| holder(w).as_deref() == Some("b"))
        .await;
    w.until("b runs GC", |_| {
        b.stats.gc_passes.load(Ordering::Relaxed) >= 1
    })
    .await;
    // NB: the Lease lasts 10 s; without the release b would wait all of it.
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "hand-over took {:?}",
        t.elapsed()
    );
    assert_eq!(
        a_stats.gc_passes.load(Ordering::Relaxed),
        a_passes,
        "a stopped replica runs no more GC"
    );
    stop(b).await;
    assert_eq!(holder(&w), None, "the last replica released the Lease too");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_host_cannot_hold_a_reconcile_past_its_deadline() {
    // finding: APX-3
    let w = World::new();
    let r = w.start("a");
    create(&w, "p1", IMAGE).await;
    w.until("p1 Running", |w| {
        phase_of(&w.proxy_json("p1")).as_deref() == Some("Running")
    })
    .await;
    w.fakes["h1"].faults().freeze();
    let t = Instant::now();
    // The read's own failure, or, once a host check found the host dead, the host's.
    w.until("a transient condition from the frozen host", |w| {
        matches!(
            ready_reason(&w.proxy_json("p1")).as_deref(),
            Some("TransientError" | "HostUnreachable")
        )
    })
    .await;
    // Reconcile deadline 2 s (a get may use 3/4 of it) + poll 100 ms + slack.
    assert!(
        t.elapsed() < Duration::from_secs(6),
        "took {:?}",
        t.elapsed()
    );
    assert_eq!(
        phase_of(&w.proxy_json("p1")).as_deref(),
        Some("Running"),
        "a transient read failure keeps the phase"
    );
    w.fakes["h1"].faults().thaw();
    stop(r).await;
}

// ---- health, publishing, ProviderHealth, credentials, RBAC ----

use egress_core::health::probe::CheckTarget;
use egress_kube::api::{ProviderHealth, ProviderHealthSpec};
use egress_kube::driver::publish::GROUP_LABEL;
use egress_web::{Endpoints, healthy_list};
use k8s_openapi::api::core::v1::Secret;

/// 192.0.2.N:P → 127.0.0.N:P, where the test's in-process proxies listen.
fn to_loopback(a: std::net::SocketAddr) -> std::net::SocketAddr {
    match a.ip() {
        std::net::IpAddr::V4(v4) if v4.octets()[..3] == [192, 0, 2] => {
            std::net::SocketAddr::from(([127, 0, 0, v4.octets()[3]], a.port()))
        }
        _ => std::net::SocketAddr::from(([127, 0, 0, 1], 9)),
    }
}

fn health(echo: std::net::SocketAddr) -> HealthSettings {
    let mut h = HealthSettings::new(CheckTarget::parse(&format!("http://{echo}/")).unwrap());
    h.interval = Duration::from_millis(100);
    h.jitter = Duration::from_millis(10);
    h.probe_timeout = Duration::from_secs(1);
    h.healthy_after = 1;
    h.unhealthy_after = 2;
    h.dial_map = Some(to_loopback);
    h
}

async fn create_member(
    w: &World,
    name: &str,
    port: u16,
    group: Option<&str>,
    credentials: Option<&str>,
) {
    let mut sp = spec(IMAGE);
    sp.proxy.port = port;
    sp.proxy.credentials_ref = credentials.map(str::to_owned);
    let mut p = Proxy::new(name, ProxyCrdSpec(sp));
    if let Some(g) = group {
        p.metadata.labels = Some([(GROUP_LABEL.to_owned(), g.to_owned())].into());
    }
    w.proxies()
        .create(&PostParams::default(), &p)
        .await
        .unwrap();
}

/// (status, reason) of condition `t`.
fn condition(v: &Option<Value>, t: &str) -> Option<(String, String)> {
    let c = v
        .as_ref()?
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == t)?
        .clone();
    Some((
        c["status"].as_str()?.to_owned(),
        c["reason"].as_str()?.to_owned(),
    ))
}

fn slice_ips(w: &World, group: &str) -> Option<Vec<String>> {
    let s = w.api.object(
        "discovery.k8s.io",
        "endpointslices",
        "default",
        &format!("{group}-ipv4"),
    )?;
    Some(
        s["endpoints"]
            .as_array()
            .map(|eps| {
                eps.iter()
                    .filter_map(|e| e["addresses"][0].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default(),
    )
}

/// A credentials Secret marked for egress-proxies (the label the driver requires).
async fn create_secret(w: &World, name: &str) {
    create_secret_labelled(w, name, json!({"egress-proxies.dev/credentials": "true"})).await;
}

async fn create_secret_labelled(w: &World, name: &str, labels: Value) {
    let s: Secret = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "stringData": {},
        "data": {"username": "dXNlcjE=", "password": "UGFzc3cwcmQtc2l4dGVlbi1jaGFycw=="},
    }))
    .unwrap();
    Api::<Secret>::namespaced(w.api.client("default"), "default")
        .create(&PostParams::default(), &s)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_healthy_group_members_are_published_and_an_emptied_group_is_unpublished() {
    let w = World::new();
    let (echo, _echo) = health_support::start_echo().await;
    let good = health_support::http_proxy("127.0.0.2:0", Default::default()).await;
    let port = good.addr.port();
    // "bad" reports 192.0.2.3, where nothing listens (127.0.0.3:port).
    w.addrs.lock().unwrap().extend([
        ("good".to_owned(), "192.0.2.2".to_owned()),
        ("bad".to_owned(), "192.0.2.3".to_owned()),
    ]);
    let r = w.start_with("a", Some(health(echo)), |_| {});
    create_member(&w, "good", port, Some("web"), None).await;
    create_member(&w, "bad", port, Some("web"), None).await;
    w.until("good published, bad decided unhealthy", |w| {
        slice_ips(w, "web") == Some(vec!["192.0.2.2".to_owned()])
            && condition(&w.proxy_json("bad"), "Healthy")
                .map(|c| c.0)
                .as_deref()
                == Some("False")
            && condition(&w.proxy_json("good"), "Ready")
                .map(|c| c.0)
                .as_deref()
                == Some("True")
    })
    .await;
    let svc = w.api.object("", "services", "default", "web").unwrap();
    assert_eq!(svc["spec"]["ports"][0]["port"], port);
    assert!(svc["spec"].get("selector").is_none(), "no selector: {svc}");
    assert_eq!(
        svc["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "egress-proxies"
    );
    let slice = w
        .api
        .object("discovery.k8s.io", "endpointslices", "default", "web-ipv4")
        .unwrap();
    assert_eq!(
        slice["metadata"]["labels"]["kubernetes.io/service-name"],
        "web"
    );
    assert_eq!(
        slice["metadata"]["ownerReferences"][0]["uid"],
        svc["metadata"]["uid"]
    );
    assert_eq!(slice["ports"][0]["port"], port);
    let g = w.proxy_json("good");
    assert_eq!(
        condition(&g, "Healthy"),
        Some(("True".into(), "ProbeSucceeded".into()))
    );
    assert_eq!(
        g.as_ref().unwrap()["status"]["health"]["egressIp"],
        "127.0.0.1"
    );
    assert_eq!(
        condition(&w.proxy_json("bad"), "Ready"),
        Some(("False".into(), "NotHealthy".into())),
        "Ready = Running ∧ Healthy"
    );
    w.until("health transition events", |w| {
        let ev = w.events();
        ev.iter().any(|(t, r)| t == "Normal" && r == "Healthy")
            && ev.iter().any(|(t, r)| t == "Warning" && r == "ProbeFailed")
    })
    .await;
    // The served views of the Kubernetes mode.
    assert!(r.observer.ready());
    let m = Endpoints::metrics(
        r.observer.as_ref(),
        egress_core::metrics::MetricsFormat::Prometheus,
    );
    assert!(
        m.contains("egress_proxies_proxies{phase=\"Running\"} 2"),
        "{m}"
    );
    assert_eq!(
        healthy_list(&r.observer.status()),
        format!("192.0.2.2:{port}\n")
    );

    // A member turning unhealthy leaves the slice; the Service stays.
    good.stop();
    drop(good);
    w.until("good leaves the slice", |w| {
        slice_ips(w, "web") == Some(vec![])
    })
    .await;
    assert!(w.api.object("", "services", "default", "web").is_some());

    // An emptied group loses its Service and slice.
    for n in ["good", "bad"] {
        w.proxies()
            .delete(n, &DeleteParams::default())
            .await
            .unwrap();
    }
    w.until("the group's Service and slice are gone", |w| {
        w.api.object("", "services", "default", "web").is_none() && slice_ips(w, "web").is_none()
    })
    .await;
    stop(r).await;
}

/// A Proxy whose guest stopped (its domain shut off, its proxy no longer answering) is
/// re-created in place as soon as a health round turns it Unhealthy, not at its next periodic
/// read (`poll_running`, set to a minute here as by default).
///
/// Two paths deliver that reconcile in this mode: the health task's per-object trigger, and
/// the status write that records `Ready` False (the controller watches its Proxies without a
/// predicate filter, so every write of one wakes it). This test proves the outcome, whichever
/// path comes first (it still passes with the trigger removed: tried).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_whose_guest_stopped_is_re_created_when_it_turns_unhealthy() {
    let w = World::new();
    let (echo, _echo) = health_support::start_echo().await;
    let good = health_support::http_proxy("127.0.0.2:0", Default::default()).await;
    let port = good.addr.port();
    w.addrs
        .lock()
        .unwrap()
        .insert("p1".to_owned(), "192.0.2.2".to_owned());
    let r = w.start_with("a", Some(health(echo)), |o| {
        o.controller.poll_running = Duration::from_secs(60);
    });
    create_member(&w, "p1", port, None, None).await;
    w.until("p1 Ready", |w| {
        condition(&w.proxy_json("p1"), "Ready")
            .map(|c| c.0)
            .as_deref()
            == Some("True")
    })
    .await;
    // Settled: the writes of its first reconciles and health rounds are behind it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let uid = w.proxy_json("p1").unwrap()["metadata"]["uid"]
        .as_str()
        .and_then(egress_provider::ProxyUid::parse_strict)
        .unwrap();
    let domain = names::domain(ENTRY, &uid);
    let fake = w
        .fakes
        .values()
        .find(|f| f.domain(&domain).is_some())
        .unwrap()
        .clone();
    let old = fake.domain(&domain).unwrap().uuid;

    // The guest dies: its domain shuts off and its proxy stops answering.
    let killed = Instant::now();
    fake.set_domain_state(&domain, libvirt_fake::domain_state::SHUTOFF, 1)
        .unwrap();
    good.stop();
    drop(good);
    w.until("a new domain in its place", |_| {
        fake.domain(&domain)
            .is_some_and(|d| d.uuid != old && d.state == libvirt_fake::domain_state::RUNNING)
    })
    .await;
    let took = killed.elapsed();
    println!("re-created {:.1} s after the stop", took.as_secs_f64());
    assert!(took < Duration::from_secs(20), "re-created after {took:?}");
    stop(r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_writes_one_provider_health_per_entry_and_deletes_those_of_removed_entries() {
    let w = World::new();
    let api: Api<ProviderHealth> = Api::all(w.api.client("default"));
    let stale = ProviderHealth::new(
        "gone",
        ProviderHealthSpec {
            provider: "gone".into(),
        },
    );
    api.create(&PostParams::default(), &stale).await.unwrap();
    let r = w.start("a");
    w.until("a ProviderHealth with a Ready host row", |w| {
        w.api
            .object(GROUP, "providerhealths", "", ENTRY)
            .and_then(|o| o.pointer("/status/hosts/0/state").cloned())
            == Some(json!("Ready"))
    })
    .await;
    let ph = w.api.object(GROUP, "providerhealths", "", ENTRY).unwrap();
    assert_eq!(ph["spec"]["provider"], ENTRY);
    assert_eq!(ph["status"]["hosts"][0]["host"], "h1");
    assert_eq!(ph["status"]["hostCount"], 1);
    assert_eq!(ph["status"]["readyHosts"], 1);
    let ready = &ph["status"]["conditions"][0];
    assert_eq!(
        (ready["type"].as_str(), ready["status"].as_str()),
        (Some("Ready"), Some("True"))
    );
    let appliers: Vec<&str> = ph["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["operation"] == "Apply")
        .map(|m| m["manager"].as_str().unwrap())
        .collect();
    assert!(
        !appliers.is_empty()
            && appliers
                .iter()
                .all(|m| *m == egress_kube::driver::FIELD_MANAGER)
    );
    w.until("the removed entry's ProviderHealth is deleted", |w| {
        w.api.object(GROUP, "providerhealths", "", "gone").is_none()
    })
    .await;
    // A host that stops answering turns its row and the Ready condition False.
    w.fakes["h1"].faults().freeze();
    w.until("the host row leaves Ready", |w| {
        w.api
            .object(GROUP, "providerhealths", "", ENTRY)
            .is_some_and(|o| {
                o.pointer("/status/hosts/0/state") != Some(&json!("Ready"))
                    && o.pointer("/status/conditions/0/status") == Some(&json!("False"))
            })
    })
    .await;
    w.fakes["h1"].faults().thaw();
    stop(r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credentials_secret_created_late_re_reconciles_its_proxy_without_waiting_for_backoff() {
    let w = World::new();
    let r = w.start_with("a", None, |o| {
        // Without the Secret poller the retry would come after a minute (beyond WAIT).
        o.controller.backoff_base = Duration::from_secs(60);
        o.controller.backoff_max = Duration::from_secs(60);
        o.secret_poll_interval = Duration::from_millis(100);
    });
    create_member(&w, "p1", 3128, None, Some("creds")).await;
    w.until("p1 waits for its Secret", |w| {
        w.proxy_json("p1")
            .and_then(|p| p.pointer("/status/conditions").cloned())
            .is_some_and(|c| c.to_string().contains("could not be read yet"))
    })
    .await;
    create_secret(&w, "creds").await;
    w.until("p1 Running once the Secret exists", |w| {
        phase_of(&w.proxy_json("p1")).as_deref() == Some("Running")
    })
    .await;
    stop(r).await;
}

/// The RBAC verb a recorded request needs, and its resource (`plural[/subresource]`), group
/// and namespace.
fn access_of(req: &kube_fake::RecordedRequest) -> Vec<(String, String, String, Option<String>)> {
    let segs: Vec<&str> = req.path.trim_matches('/').split('/').collect();
    let (group, rest) = match segs.first() {
        Some(&"api") => ("", &segs[2..]),
        Some(&"apis") => (segs[1], &segs[3..]),
        _ => return vec![],
    };
    let (ns, rest) = if rest.first() == Some(&"namespaces") && rest.len() >= 3 {
        (Some(rest[1].to_owned()), &rest[2..])
    } else {
        (None, rest)
    };
    let resource = match rest.get(2) {
        Some(sub) => format!("{}/{sub}", rest[0]),
        None => rest[0].to_owned(),
    };
    let named = rest.len() >= 2;
    let verbs: Vec<&str> = match (req.method.as_str(), named) {
        ("GET", true) => vec!["get"],
        ("GET", false) if req.query.contains("watch=true") || req.query.contains("watch=1") => {
            vec!["watch"]
        }
        ("GET", false) => vec!["list"],
        ("POST", _) => vec!["create"],
        ("PUT", _) => vec!["update"],
        // An apply that creates is authorized as a create too.
        ("PATCH", _) if req.status == 201 => vec!["patch", "create"],
        ("PATCH", _) => vec!["patch"],
        ("DELETE", _) => vec!["delete"],
        _ => vec![],
    };
    verbs
        .into_iter()
        .map(|v| (group.to_owned(), resource.clone(), v.to_owned(), ns.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_driver_calls_exactly_the_apis_its_rbac_table_grants() {
    // finding: APX-3 (least privilege: the RBAC grants what the code calls, no more)
    use egress_kube::rbac::{API_ACCESS, PROXIES, PROXIES_FINALIZERS, Scope};
    use std::collections::BTreeSet;
    let w = World::new();
    // A tour of every path: Secret-backed proxy in a published group, health, a removed
    // entry's ProviderHealth, transient failures (repeated events), deletion, GC, release.
    let (echo, _echo) = health_support::start_echo().await;
    let good = health_support::http_proxy("127.0.0.2:0", Default::default()).await;
    w.addrs
        .lock()
        .unwrap()
        .insert("good".to_owned(), "192.0.2.2".to_owned());
    create_secret(&w, "creds").await;
    Api::<ProviderHealth>::all(w.api.client("default"))
        .create(
            &PostParams::default(),
            &ProviderHealth::new(
                "gone",
                ProviderHealthSpec {
                    provider: "gone".into(),
                },
            ),
        )
        .await
        .unwrap();
    let tests_requests = w.api.requests().len();
    let r = w.start_with("a", Some(health(echo)), |o| {
        o.secret_poll_interval = Duration::from_millis(100);
        o.publish_interval = Duration::from_millis(100);
    });
    create_member(&w, "good", good.addr.port(), Some("web"), Some("creds")).await;
    w.until("good published", |w| {
        slice_ips(w, "web") == Some(vec!["192.0.2.2".to_owned()])
    })
    .await;
    w.until("the stale ProviderHealth is deleted", |w| {
        w.api.object(GROUP, "providerhealths", "", "gone").is_none()
    })
    .await;
    // A pool: its finalizer, a member created, its credentials Secret created, its status;
    // deleted: its member deleted and the finalizer removed.
    let pools: Api<ProxyPool> = Api::namespaced(w.api.client("default"), "default");
    let pool: ProxyPool = serde_json::from_value(json!({
        "apiVersion": "egress-proxies.dev/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": "tour", "namespace": "default"},
        "spec": {"replicas": 1, "template": {"spec": {"provider": ENTRY, "image": IMAGE}},
                 "credentials": {"generate": true}},
    }))
    .unwrap();
    pools.create(&PostParams::default(), &pool).await.unwrap();
    w.until("the pool's member, Secret and status", |w| {
        w.api
            .objects(GROUP, "proxies")
            .iter()
            .any(|p| p["metadata"]["labels"]["egress-proxies.dev/pool"] == "tour")
            && w.api
                .object("", "secrets", "default", "tour-credentials")
                .is_some()
            && w.api
                .object(GROUP, "proxypools", "default", "tour")
                .is_some_and(|p| p["status"]["replicas"] == 1)
    })
    .await;
    pools
        .delete("tour", &DeleteParams::default())
        .await
        .unwrap();
    w.until("the pool and its member gone", |w| {
        w.api
            .object(GROUP, "proxypools", "default", "tour")
            .is_none()
            && !w
                .api
                .objects(GROUP, "proxies")
                .iter()
                .any(|p| p["metadata"]["labels"]["egress-proxies.dev/pool"] == "tour")
    })
    .await;
    create(&w, "p2", "no-such-image").await;
    w.fakes["h1"].faults().freeze();
    w.until("a repeated event became a series", |w| {
        w.api
            .objects("events.k8s.io", "events")
            .iter()
            .any(|e| e.get("series").is_some_and(|s| !s.is_null()))
    })
    .await;
    w.fakes["h1"].faults().thaw();
    for n in ["good", "p2"] {
        w.proxies()
            .delete(n, &DeleteParams::default())
            .await
            .unwrap();
    }
    w.until("proxies and the group gone", |w| {
        w.proxy_json("good").is_none()
            && w.proxy_json("p2").is_none()
            && w.api.object("", "services", "default", "web").is_none()
    })
    .await;
    w.until("a GC pass", |_| {
        r.stats.gc_passes.load(Ordering::Relaxed) >= 1
    })
    .await;
    stop(r).await;

    let reqs = w.api.requests();
    let mut seen: BTreeSet<(String, String, String)> = BTreeSet::new();
    // The test's own calls during the tour: it creates the Proxies "good" and "p2" (two
    // POSTs) and deletes them by name, creates and deletes the pool; the driver creates and
    // deletes the pool's members.
    let mut own_proxy_creates = 2;
    for req in &reqs[tests_requests..] {
        let own_create =
            req.method == "POST" && req.path.ends_with("/proxies") && own_proxy_creates > 0;
        if own_create {
            own_proxy_creates -= 1;
        }
        let own = own_create
            || (req.method == "DELETE"
                && ["/proxies/good", "/proxies/p2", "/proxypools/tour"]
                    .iter()
                    .any(|p| req.path.ends_with(p)))
            || (req.method == "POST" && req.path.ends_with("/proxypools"));
        if own {
            continue;
        }
        for (g, res, verb, ns) in access_of(req) {
            if res == "leases" {
                assert_eq!(
                    ns.as_deref(),
                    Some("ops"),
                    "a Lease outside the operator namespace"
                );
            }
            seen.insert((g, res, verb));
        }
    }
    // Writing the pool's finalizer, and owner references with blockOwnerDeletion to the pool,
    // are authorized on proxypools/finalizers: implied by the pool's patch.
    if seen.contains(&(GROUP.into(), "proxypools".into(), "patch".into())) {
        seen.insert((
            GROUP.into(),
            "proxypools/finalizers".into(),
            "update".into(),
        ));
    }
    // Writing finalizers (a JSON patch of the Proxy) is authorized on proxies/finalizers
    // where the OwnerReferencesPermissionEnforcement plugin is on: implied by that patch.
    if seen.contains(&(
        PROXIES.group.into(),
        PROXIES.resource.into(),
        "patch".into(),
    )) {
        seen.insert((
            PROXIES_FINALIZERS.group.into(),
            PROXIES_FINALIZERS.resource.into(),
            "update".into(),
        ));
    }
    // NB: the kube-system namespace is read by `run` (the binary's entry) before it calls
    // `run_with`, which this test drives: that call is made by the real binary
    // (crates/egress-proxies/tests/kube_process.rs), not here.
    let table: BTreeSet<(String, String, String)> = API_ACCESS
        .iter()
        .filter(|a| a.resource != egress_kube::rbac::NAMESPACES.resource)
        .flat_map(|a| {
            a.verbs
                .iter()
                .map(|v| (a.group.to_owned(), a.resource.to_owned(), (*v).to_owned()))
        })
        .collect();
    let unlisted: Vec<_> = seen.difference(&table).collect();
    let unused: Vec<_> = table.difference(&seen).collect();
    assert!(
        unlisted.is_empty() && unused.is_empty(),
        "calls not in rbac::API_ACCESS: {unlisted:?}; grants never used: {unused:?}"
    );
    assert!(
        API_ACCESS
            .iter()
            .all(|a| (a.resource == "leases") == (a.scope == Scope::OperatorNamespace))
    );
    drop(good);
}

// ---- ProxyPool publishing through the running driver ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pools_healthy_members_are_its_service_and_a_quarantined_one_leaves_it_at_once() {
    let w = World::new();
    let (echo, _echo) = health_support::start_echo().await;
    let a = health_support::http_proxy("127.0.0.2:0", Default::default()).await;
    let port = a.addr.port();
    let b = health_support::http_proxy(&format!("127.0.0.3:{port}"), Default::default()).await;
    let r = w.start_with("a", Some(health(echo)), |o| {
        o.publish_interval = Duration::from_millis(100);
    });
    let pools: Api<ProxyPool> = Api::namespaced(w.api.client("default"), "default");
    let pool: ProxyPool = serde_json::from_value(json!({
        "apiVersion": "egress-proxies.dev/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": "fleet", "namespace": "default"},
        "spec": {"replicas": 2, "template": {"spec": {"provider": ENTRY, "image": IMAGE,
                 "proxy": {"port": port, "allowedClientCidrs": ["10.0.0.0/8"]}}}},
    }))
    .unwrap();
    pools.create(&PostParams::default(), &pool).await.unwrap();
    // The first two members' guests answer as the two test proxies; any later one as nothing.
    let members = |w: &World| -> Vec<String> {
        w.api
            .objects(GROUP, "proxies")
            .iter()
            .filter(|p| p["metadata"]["labels"]["egress-proxies.dev/pool"] == "fleet")
            .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
            .collect()
    };
    let assign = |w: &World| {
        let mut addrs = w.addrs.lock().unwrap();
        for m in members(w) {
            if !addrs.contains_key(&m) {
                let ip = ["192.0.2.2", "192.0.2.3"]
                    .into_iter()
                    .find(|ip| !addrs.values().any(|v| v == ip))
                    .unwrap_or("192.168.122.10");
                addrs.insert(m, ip.to_owned());
            }
        }
    };
    w.until("both members published in the pool's Service", |w| {
        assign(w);
        slice_ips(w, "fleet") == Some(vec!["192.0.2.2".to_owned(), "192.0.2.3".to_owned()])
    })
    .await;
    assert!(w.api.object("", "services", "default", "fleet").is_some());
    let quarantined = w
        .addrs
        .lock()
        .unwrap()
        .iter()
        .find(|(_, ip)| *ip == "192.0.2.2")
        .map(|(n, _)| n.clone())
        .unwrap();
    w.proxies()
        .patch(
            &quarantined,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "egress-proxies.dev/quarantine": "banned"}}})),
        )
        .await
        .unwrap();
    w.until(
        "the quarantined member out of the Service, kept, replaced",
        |w| {
            assign(w);
            slice_ips(w, "fleet") == Some(vec!["192.0.2.3".to_owned()])
                && w.proxy_json(&quarantined).is_some()
                && members(w).len() == 3
        },
    )
    .await;
    // The operator's status views list the pool with its members.
    use egress_web::Endpoints;
    w.until("the pool in the status document", |_| {
        r.observer.status().pools.iter().any(|p| {
            p.name == "fleet"
                && p.desired == 2
                && p.members.len() == 3
                && p.members.iter().any(|m| {
                    m.name == quarantined
                        && m.quarantine.as_deref() == Some("banned")
                        && !m.available
                })
                && p.status.quarantined == [quarantined.clone()]
        })
    })
    .await;
    stop(r).await;
    drop((a, b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_pool_is_reported_with_every_field_at_fault_and_gets_no_member() {
    let w = World::new();
    let r = w.start("a");
    let pool: ProxyPool = serde_json::from_value(json!({
        "apiVersion": "egress-proxies.dev/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": "bad", "namespace": "default"},
        "spec": {"replicas": 2, "template": {"spec": {"provider": ENTRY, "image": IMAGE,
                 "proxy": {"allowedClientCidrs": ["10.0.0.0/8"]}}},
                 "update": {"maxSurge": 0, "maxUnavailable": 0},
                 "rotation": {"maxAge": "10s"}},
    }))
    .unwrap();
    Api::<ProxyPool>::namespaced(w.api.client("default"), "default")
        .create(&PostParams::default(), &pool)
        .await
        .unwrap();
    w.until("the pool reports InvalidSpec", |w| {
        w.api
            .object(GROUP, "proxypools", "default", "bad")
            .is_some_and(|p| {
                condition(&Some(p.clone()), "Progressing")
                    == Some(("False".into(), "InvalidSpec".into()))
                    && p["status"]["observedGeneration"] == 1
            })
    })
    .await;
    let p = w.api.object(GROUP, "proxypools", "default", "bad").unwrap();
    let msg = p["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "ReplicaFailure")
        .unwrap()["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        msg.contains("spec.update") && msg.contains("spec.rotation.maxAge"),
        "{msg}"
    );
    // The Event is written after the status: wait for it (with the same deadline).
    w.until("a Warning InvalidSpec Event", |w| {
        w.events()
            .contains(&("Warning".into(), "InvalidSpec".into()))
    })
    .await;
    assert!(
        !w.api
            .objects(GROUP, "proxies")
            .iter()
            .any(|p| p["metadata"]["labels"]["egress-proxies.dev/pool"] == "bad"),
        "no member of an invalid pool"
    );
    stop(r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_in_the_flat_template_shape_is_refused_with_the_new_shape_and_wedges_nothing() {
    let w = World::new();
    let r = w.start("a");
    // Written as earlier versions took it (the Proxy's fields directly under `template`):
    // raw JSON, not through the typed API. The API server prunes the unknown fields and the
    // CRD's rule refuses a template without `spec`, showing the shape to write. (A pool stored
    // in that shape before an upgrade is refused by the operator with the same shape: the
    // core's `pool::validate_tests` and standalone's manifest tests.)
    let ar = kube::api::ApiResource::erase::<ProxyPool>(&());
    let dynamic: Api<kube::api::DynamicObject> =
        Api::namespaced_with(w.api.client("default"), "default", &ar);
    let flat: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "egress-proxies.dev/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": FLAT_POOL, "namespace": "default"},
        "spec": {"replicas": 1, "template": {"provider": ENTRY, "image": IMAGE,
                 "proxy": {"allowedClientCidrs": ["10.0.0.0/8"]}}},
    }))
    .unwrap();
    let err = dynamic
        .create(&PostParams::default(), &flat)
        .await
        .unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("not an API refusal: {err}");
    };
    assert_eq!(status.code, 422, "{status:?}");
    for needle in ["spec.template", "template.spec", "metadata", "v1alpha1"] {
        assert!(
            status.message.contains(needle),
            "{needle}: {}",
            status.message
        );
    }
    // Its watch is not wedged: a pool in the new shape beside it gets its member.
    let pool: ProxyPool = serde_json::from_value(json!({
        "apiVersion": "egress-proxies.dev/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": "new", "namespace": "default"},
        "spec": {"replicas": 1, "template": {"spec": {"provider": ENTRY, "image": IMAGE,
                 "proxy": {"allowedClientCidrs": ["10.0.0.0/8"]}}}},
    }))
    .unwrap();
    Api::<ProxyPool>::namespaced(w.api.client("default"), "default")
        .create(&PostParams::default(), &pool)
        .await
        .unwrap();
    w.until("the new pool's member exists", |w| {
        w.api
            .objects(GROUP, "proxies")
            .iter()
            .any(|p| p["metadata"]["labels"]["egress-proxies.dev/pool"] == "new")
    })
    .await;
    assert!(
        !w.api
            .objects(GROUP, "proxies")
            .iter()
            .any(|p| p["metadata"]["labels"]["egress-proxies.dev/pool"] == FLAT_POOL),
        "no member of the refused pool"
    );
    stop(r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_named_like_an_unowned_service_leaves_it_alone_and_marks_its_members() {
    use k8s_openapi::api::core::v1::Service;
    let w = World::new();
    let admin: Service = serde_json::from_value(json!({
        "metadata": {"name": "db"},
        "spec": {"clusterIP": "10.96.0.9", "ports": [{"name": "pg", "port": 5432}]},
    }))
    .unwrap();
    Api::<Service>::namespaced(w.api.client("default"), "default")
        .create(&PostParams::default(), &admin)
        .await
        .unwrap();
    let before = w.api.object("", "services", "default", "db").unwrap();
    let r = w.start_with("a", None, |o| {
        o.publish_interval = Duration::from_millis(100);
    });
    let pool: ProxyPool = serde_json::from_value(json!({
        "apiVersion": "egress-proxies.dev/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": "db", "namespace": "default"},
        "spec": {"replicas": 1, "template": {"spec": {"provider": ENTRY, "image": IMAGE,
                 "proxy": {"allowedClientCidrs": ["10.0.0.0/8"]}}}},
    }))
    .unwrap();
    Api::<ProxyPool>::namespaced(w.api.client("default"), "default")
        .create(&PostParams::default(), &pool)
        .await
        .unwrap();
    w.until("the pool's member marked Published=False", |w| {
        w.api.objects(GROUP, "proxies").iter().any(|p| {
            p["metadata"]["labels"]["egress-proxies.dev/pool"] == "db"
                && condition(&Some(p.clone()), "Published")
                    == Some(("False".into(), "ServiceNameClash".into()))
        })
    })
    .await;
    assert_eq!(
        w.api.object("", "services", "default", "db").unwrap(),
        before,
        "the admin's Service is untouched"
    );
    stop(r).await;
}

// ---- tenant-safe publishing through the running driver ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_named_like_an_unowned_service_is_refused_with_an_event_and_a_condition() {
    use k8s_openapi::api::core::v1::Service;
    let w = World::new();
    // The cluster's own Service, created by an admin: a Proxy author names their group after it.
    let admin: Service = serde_json::from_value(json!({
        "metadata": {"name": "kubernetes"},
        "spec": {"clusterIP": "10.96.0.1", "ports": [{"name": "https", "port": 443}]},
    }))
    .unwrap();
    Api::<Service>::namespaced(w.api.client("default"), "default")
        .create(&PostParams::default(), &admin)
        .await
        .unwrap();
    let before = w
        .api
        .object("", "services", "default", "kubernetes")
        .unwrap();
    let r = w.start_with("a", None, |o| {
        o.publish_interval = Duration::from_millis(100);
    });
    create_member(&w, "p", 3128, Some("kubernetes"), None).await;
    w.until("the refusal is a condition on the member", |w| {
        condition(&w.proxy_json("p"), "Published")
            == Some(("False".into(), "ServiceNameClash".into()))
    })
    .await;
    let p = w.proxy_json("p").unwrap();
    let c = p["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Published")
        .unwrap()
        .clone();
    assert!(
        c["message"]
            .as_str()
            .unwrap()
            .contains("Service default/kubernetes"),
        "the condition names the clash: {c}"
    );
    w.until("a Warning event names the clash", |w| {
        w.events()
            .contains(&("Warning".into(), "ServiceNameClash".into()))
    })
    .await;
    assert_eq!(
        w.api
            .object("", "services", "default", "kubernetes")
            .unwrap(),
        before,
        "the admin's Service is untouched"
    );
    assert!(
        w.api
            .object(
                "discovery.k8s.io",
                "endpointslices",
                "default",
                "kubernetes-ipv4"
            )
            .is_none()
    );
    // Renamed to a free name: published, and the condition goes away.
    w.proxies()
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {GROUP_LABEL: "web"}}})),
        )
        .await
        .unwrap();
    w.until("published under the free name, condition cleared", |w| {
        w.api.object("", "services", "default", "web").is_some()
            && condition(&w.proxy_json("p"), "Published").is_none()
    })
    .await;
    assert_eq!(
        w.api
            .object("", "services", "default", "kubernetes")
            .unwrap(),
        before
    );
    stop(r).await;
}

// ---- credentials Secrets must be meant for egress-proxies ----

fn waits_for_credentials(w: &World, name: &str) -> bool {
    w.proxy_json(name)
        .and_then(|p| p.pointer("/status/conditions").cloned())
        .is_some_and(|c| c.to_string().contains("could not be read yet"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_that_did_not_opt_in_is_never_used_as_credentials() {
    let w = World::new();
    // Some other workload's Secret, with the keys the operator reads.
    create_secret_labelled(&w, "db-admin", json!({"app": "db"})).await;
    let r = w.start_with("a", None, |o| {
        o.secret_poll_interval = Duration::from_millis(100);
    });
    create_member(&w, "p1", 3128, None, Some("db-admin")).await;
    w.until(
        "p1 waits: the Secret is not marked for egress-proxies",
        |w| waits_for_credentials(w, "p1"),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(waits_for_credentials(&w, "p1"), "still not used");
    assert!(
        w.fakes.values().all(|f| f.domains().is_empty()),
        "no instance was created with another workload's credentials"
    );
    // The owner marks it (here: the opt-in type is equivalent): now it is used.
    Api::<Secret>::namespaced(w.api.client("default"), "default")
        .patch(
            "db-admin",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {"egress-proxies.dev/credentials": "true"}}}),
            ),
        )
        .await
        .unwrap();
    w.until("p1 Running once the Secret opted in", |w| {
        phase_of(&w.proxy_json("p1")).as_deref() == Some("Running")
    })
    .await;
    stop(r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credentials_ref_naming_another_namespace_is_never_requested() {
    let w = World::new();
    let refs = [
        ("p1", "kube-system/admin"),
        ("p2", "../../kube-system/secrets/admin"),
    ];
    // The CRD refuses them: a credentialsRef is a Secret name (its pattern)...
    for (name, r) in refs {
        let mut sp = spec(IMAGE);
        sp.proxy.credentials_ref = Some(r.to_owned());
        let err = w
            .proxies()
            .create(&PostParams::default(), &Proxy::new(name, ProxyCrdSpec(sp)))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, kube::Error::Api(s) if s.code == 422
                && s.message.contains("spec.proxy.credentialsRef in body should match")),
            "{err:?}"
        );
    }
    // ... but Proxies stored while an older CRD without the pattern was installed stay (the
    // server ratchets unchanged values), and the operator must still never follow them.
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(w.api.client("default"));
    let pattern = "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/proxy/properties/credentialsRef/pattern";
    let crd = crds.get("proxies.egress-proxies.dev").await.unwrap();
    let original = serde_json::to_value(&crd)
        .unwrap()
        .pointer(pattern)
        .cloned()
        .unwrap();
    let edit = |op: Value| Patch::<Value>::Json(serde_json::from_value(json!([op])).unwrap());
    crds.patch(
        "proxies.egress-proxies.dev",
        &PatchParams::default(),
        &edit(json!({"op": "remove", "path": pattern})),
    )
    .await
    .unwrap();
    for (name, r) in refs {
        create_member(&w, name, 3128, None, Some(r)).await;
    }
    crds.patch(
        "proxies.egress-proxies.dev",
        &PatchParams::default(),
        &edit(json!({"op": "add", "path": pattern, "value": original})),
    )
    .await
    .unwrap();
    let r = w.start_with("a", None, |o| {
        o.secret_poll_interval = Duration::from_millis(100);
    });
    w.until("both wait for credentials they will never get", |w| {
        waits_for_credentials(w, "p1") && waits_for_credentials(w, "p2")
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let secret_reads: Vec<_> = w
        .api
        .requests()
        .into_iter()
        .filter(|q| q.path.contains("secrets") || q.path.contains("kube-system"))
        .collect();
    assert!(secret_reads.is_empty(), "{secret_reads:?}");
    stop(r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watching_one_namespace_every_namespaced_call_stays_in_it_so_a_role_there_suffices() {
    // The chart's `watchNamespace`: the operator's grants on Proxies, Secrets, Services,
    // EndpointSlices and Events are a Role in that namespace only; only ProviderHealth and the
    // GC's list of Proxies (PROXIES_LIVE_SET) are cluster-wide, Leases in the operator's own.
    use egress_kube::rbac::{API_ACCESS, Scope};
    let w = World::new();
    create_secret(&w, "creds").await;
    let before = w.api.requests().len();
    let r = w.start_with("a", None, |o| {
        o.namespace = Some("default".into());
        o.publish_interval = Duration::from_millis(100);
        o.secret_poll_interval = Duration::from_millis(100);
    });
    create_member(&w, "p1", 3128, Some("web"), Some("creds")).await;
    w.until("p1 Running and its group published", |w| {
        phase_of(&w.proxy_json("p1")).as_deref() == Some("Running")
            && w.api.object("", "services", "default", "web").is_some()
    })
    .await;
    w.proxies()
        .delete("p1", &DeleteParams::default())
        .await
        .unwrap();
    w.until("p1 and its group gone", |w| {
        w.proxy_json("p1").is_none() && w.api.object("", "services", "default", "web").is_none()
    })
    .await;
    w.until("a GC pass", |_| {
        r.stats.gc_passes.load(Ordering::Relaxed) >= 1
    })
    .await;
    stop(r).await;
    for req in &w.api.requests()[before..] {
        for (g, res, verb, ns) in access_of(req) {
            if g == GROUP && res == "proxies" && (verb == "create" || verb == "delete") {
                continue; // the test's own calls
            }
            let entry = API_ACCESS
                .iter()
                .find(|a| a.group == g && a.resource == res && a.verbs.contains(&verb.as_str()))
                .unwrap_or_else(|| panic!("{verb} {g}/{res} is in no grant"));
            let cluster_wide_grant = API_ACCESS.iter().any(|a| {
                a.scope == Scope::Cluster
                    && a.group == g
                    && a.resource == res
                    && a.verbs.contains(&verb.as_str())
            });
            match entry.scope {
                Scope::OperatorNamespace => assert_eq!(ns.as_deref(), Some("ops"), "{req:?}"),
                _ if cluster_wide_grant => {}
                _ => assert_eq!(
                    ns.as_deref(),
                    Some("default"),
                    "{verb} {g}/{res} outside the watched namespace: {req:?}"
                ),
            }
        }
    }
}

// ---- Pool deletion by propagation policy, with the fake's garbage collector ----

/// Creates pool `name` with two members and waits until both run (their VMs defined).
async fn running_pool(w: &World, name: &str) -> Vec<String> {
    let pool: ProxyPool = serde_json::from_value(json!({
        "apiVersion": "egress-proxies.dev/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"replicas": 2, "template": {"spec": {"provider": ENTRY, "image": IMAGE,
                 "proxy": {"allowedClientCidrs": ["10.0.0.0/8"]}}}},
    }))
    .unwrap();
    Api::<ProxyPool>::namespaced(w.api.client("default"), "default")
        .create(&PostParams::default(), &pool)
        .await
        .unwrap();
    w.until("two running members", |w| {
        pool_members(w, name)
            .iter()
            .filter(|m| phase_of(&w.proxy_json(m)).as_deref() == Some("Running"))
            .count()
            == 2
    })
    .await;
    let members = pool_members(w, name);
    assert_eq!(vms(w), 2, "one VM per member");
    members
}

fn pool_members(w: &World, pool: &str) -> Vec<String> {
    w.api
        .objects(GROUP, "proxies")
        .iter()
        .filter(|p| p["metadata"]["labels"]["egress-proxies.dev/pool"] == pool)
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
        .collect()
}

fn vms(w: &World) -> usize {
    w.fakes.values().map(|f| f.domains().len()).sum()
}

async fn delete_pool(w: &World, name: &str, dp: &DeleteParams) {
    let _ = Api::<ProxyPool>::namespaced(w.api.client("default"), "default")
        .delete(name, dp)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_deleted_in_the_background_goes_with_its_members_and_their_vms() {
    let w = World::new();
    let r = w.start("a");
    running_pool(&w, "bg").await;
    delete_pool(&w, "bg", &DeleteParams::background()).await;
    w.until("the pool, its members and their VMs gone", |w| {
        w.api.object(GROUP, "proxypools", "default", "bg").is_none()
            && pool_members(w, "bg").is_empty()
            && vms(w) == 0
    })
    .await;
    stop(r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_deleted_in_the_foreground_waits_for_its_members_and_goes_last() {
    let w = World::new();
    let r = w.start("a");
    running_pool(&w, "fg").await;
    delete_pool(&w, "fg", &DeleteParams::foreground()).await;
    // Garbage Collection › Foreground cascading deletion: the owner is "deletion in progress"
    // (the members block it: the operator set blockOwnerDeletion), its members are deleted
    // (by the collector and the operator, whichever comes first), then the owner goes.
    let pool = w.api.object(GROUP, "proxypools", "default", "fg");
    if let Some(p) = pool {
        assert!(p["metadata"]["deletionTimestamp"].is_string());
    }
    w.until("the members and their VMs gone, then the pool", |w| {
        let members = pool_members(w, "fg");
        if w.api.object(GROUP, "proxypools", "default", "fg").is_none()
            && members.is_empty()
            && vms(w) == 0
        {
            return Ok(());
        }
        let names: Vec<&str> = members.iter().map(String::as_str).collect();
        Err(format!(
            "{}; {} VMs; DELETEs: {:?}; pool requests: {:?}",
            pool_and_members(w, "fg", &names),
            vms(w),
            proxy_deletes(w),
            w.api
                .requests()
                .iter()
                .filter(|r| r.path.contains("/proxypools/fg"))
                .map(|r| format!("{} {} {}", r.method, r.path, r.status))
                .collect::<Vec<_>>()
        ))
    })
    .await;
    stop(r).await;
}

/// What a deletion check saw: `pool` (present with its finalizers and deletionTimestamp, or
/// gone), and each of `members` (its ownerReferences and deletionTimestamp, or gone).
fn pool_and_members(w: &World, pool: &str, members: &[&str]) -> String {
    let mut seen = vec![match w.api.object(GROUP, "proxypools", "default", pool) {
        None => format!("pool {pool} gone"),
        Some(p) => format!(
            "pool {pool} present (finalizers {}, deletionTimestamp {})",
            p["metadata"]["finalizers"], p["metadata"]["deletionTimestamp"]
        ),
    }];
    for m in members {
        seen.push(match w.proxy_json(m) {
            None => format!("member {m} gone"),
            Some(p) => format!(
                "member {m} (ownerReferences {}, deletionTimestamp {})",
                p["metadata"]["ownerReferences"], p["metadata"]["deletionTimestamp"]
            ),
        });
    }
    seen.join("; ")
}

/// Whether member `m` is there without owner references.
fn unowned(w: &World, m: &str) -> bool {
    w.proxy_json(m)
        .is_some_and(|p| p["metadata"].get("ownerReferences").is_none())
}

/// `Ok` once `pool` is gone and each of `members` is there without owner references; else
/// what the check saw ([`pool_and_members`]).
fn orphaned(w: &World, pool: &str, members: &[String]) -> Result<(), String> {
    let gone = w.api.object(GROUP, "proxypools", "default", pool).is_none();
    if gone && members.iter().all(|m| unowned(w, m)) {
        return Ok(());
    }
    let names: Vec<&str> = members.iter().map(String::as_str).collect();
    Err(pool_and_members(w, pool, &names))
}

/// The DELETEs of Proxies the API server answered: path and status code.
fn proxy_deletes(w: &World) -> Vec<String> {
    w.api
        .requests()
        .into_iter()
        .filter(|r| r.method == "DELETE" && r.path.contains("/proxies/"))
        .map(|r| format!("{} {}", r.path, r.status))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_deleted_with_orphan_leaves_its_members_running_without_the_owner() {
    let w = World::new();
    let r = w.start("a");
    let members = running_pool(&w, "or").await;
    delete_pool(&w, "or", &DeleteParams::orphan()).await;
    w.until("the pool gone, its members orphaned", |w| {
        orphaned(w, "or", &members)
    })
    .await;
    // Garbage Collection › Orphaned dependents: they stay, and the operator keeps running them.
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Who deleted a member, should one go: the operator (a DELETE) or the collector.
    let deletes = || {
        format!(
            "DELETEs: {:?}, collector deletes: {}",
            proxy_deletes(&w),
            w.api.gc_deleted()
        )
    };
    for m in &members {
        let p = w
            .proxy_json(m)
            .unwrap_or_else(|| panic!("orphaned member {m} gone; {}", deletes()));
        assert!(
            p["metadata"].get("deletionTimestamp").is_none(),
            "{m} was deleted; {}",
            deletes()
        );
        assert_eq!(phase_of(&Some(p)).as_deref(), Some("Running"));
    }
    assert_eq!(vms(&w), 2);
    stop(r).await;
}

// A deleted pool takes a member along because its cache shows the member naming the pool
// as owner, and that cache may lag behind the API server: with `propagationPolicy: Orphan`
// the collector removes the members' references and only then the `orphan` finalizer, so a
// round can see the pool without that finalizer and a member still owned. The delete must
// hold only for the member as read. Shown deterministically with a member released from the
// pool by hand (its owner reference removed) between the operator's read and its delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_released_from_its_pool_just_before_the_deleted_pool_deletes_it_stays() {
    let w = World::new();
    let r = w.start("a");
    let members = running_pool(&w, "rel").await;
    let (kept, other) = (members[0].as_str(), members[1].as_str());
    let path = format!("/apis/{GROUP}/v1alpha1/namespaces/default/proxies/{kept}");
    let mut released = w.proxy_json(kept).unwrap();
    let meta = released["metadata"].as_object_mut().unwrap();
    meta.remove("ownerReferences");
    meta.remove("resourceVersion");
    w.api.before_request(
        "DELETE",
        &path,
        vec![("PUT".into(), path.clone(), Some(released))],
    );
    delete_pool(&w, "rel", &DeleteParams::background()).await;
    w.until(
        "the pool and its owned member gone, the released one kept",
        |w| {
            let gone = w
                .api
                .object(GROUP, "proxypools", "default", "rel")
                .is_none()
                && w.proxy_json(other).is_none();
            if gone && unowned(w, kept) {
                Ok(())
            } else {
                Err(format!(
                    "{}; DELETEs: {:?}",
                    pool_and_members(w, "rel", &[kept, other]),
                    proxy_deletes(w)
                ))
            }
        },
    )
    .await;
    // The operator did send its delete of the released member, and it was refused.
    assert!(
        proxy_deletes(&w).contains(&format!("{path} 409")),
        "{:?}",
        proxy_deletes(&w)
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let p = w.proxy_json(kept).expect("the released member stays");
    assert!(p["metadata"].get("deletionTimestamp").is_none());
    assert_eq!(phase_of(&Some(p)).as_deref(), Some("Running"));
    assert_eq!(vms(&w), 1);
    stop(r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_deleted_with_orphan_leaves_its_members_when_the_operator_acts_before_the_collector()
{
    let w = World::new();
    let r = w.start("a");
    let members = running_pool(&w, "or2").await;
    // The collector has not removed the owner references yet when the operator sees the
    // deletion: the `orphan` finalizer alone says the members stay.
    w.api.set_gc_paused(true);
    delete_pool(&w, "or2", &DeleteParams::orphan()).await;
    w.until(
        "the operator let the pool go (its finalizer removed)",
        |w| {
            w.api
                .object(GROUP, "proxypools", "default", "or2")
                .is_none_or(|p| {
                    !p["metadata"]["finalizers"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|f| f.as_str().is_some_and(|f| f.contains("egress-proxies")))
                })
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    for m in &members {
        let p = w
            .proxy_json(m)
            .expect("a member of an orphaning pool stays");
        assert!(
            p["metadata"].get("deletionTimestamp").is_none(),
            "{m} was deleted"
        );
    }
    w.api.set_gc_paused(false);
    w.api.collect_garbage();
    assert_eq!(vms(&w), 2);
    stop(r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_copes_when_the_garbage_collector_deleted_the_members_first() {
    let w = World::new();
    let r = w.start("a");
    running_pool(&w, "gc").await;
    // The operator is down when the pool is deleted in the foreground: the collector alone
    // deletes the members (their finalizer holds them until the operator removed their VMs).
    stop(r).await;
    let before = w.api.gc_deleted();
    delete_pool(&w, "gc", &DeleteParams::foreground()).await;
    w.until("the collector deleting both members", |w| {
        let deleting = pool_members(w, "gc")
            .iter()
            .filter(|m| {
                w.proxy_json(m)
                    .is_some_and(|p| p["metadata"]["deletionTimestamp"].is_string())
            })
            .count();
        deleting == 2 && w.api.gc_deleted() >= before + 2
    })
    .await;
    let r = w.start("b");
    w.until("the VMs, members and pool gone", |w| {
        w.api.object(GROUP, "proxypools", "default", "gc").is_none()
            && pool_members(w, "gc").is_empty()
            && vms(w) == 0
    })
    .await;
    stop(r).await;
}
