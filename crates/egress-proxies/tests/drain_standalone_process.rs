//! Host maintenance in standalone mode, through the real `egress-proxies standalone` binary on
//! three libvirt-fake hosts (unix sockets; guest addresses given by the fixtures' DHCP loop).
//!
//! What it proves, all through the user's path (provider config, manifest directory, `/status`,
//! `/hosts`, `egress-proxies status`):
//! - a cordoned host gets no new proxy: h0 is cordoned from start to end and never holds a
//!   domain;
//! - a drain set by a config reload (h1: `maintenance: Drain`) replaces a pool of 2
//!   (`maxSurge: 1`, `maxUnavailable: 0`) on h2 while the available members never drop below
//!   `replicas - maxUnavailable` = 2 (sampled every second and printed);
//! - an unpinned Proxy on the draining host is re-placed (its instance moves to h2) and its
//!   copy on h1 is deleted; a Proxy pinned to h1 (`spec.host`) stays, its `Ready` condition
//!   saying so (`OnDrainingHost`);
//! - the host row shows `Draining (1 left)` while the pinned Proxy is there, `Drained` once it
//!   is removed, and `Cordoned` for h0, in `/hosts` and in `egress-proxies status`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ep_operator_fixtures::{GIB, POOL, dhcp_network, publish_base, run_dhcp};
use libvirt_fake::{FakeLibvirt, PoolSpec};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

const BIN: &str = env!("CARGO_BIN_EXE_egress-proxies");
const ENTRY: &str = "eptest-drain";
const IMAGE: &str = "tiny";
/// In config order. The cordoned one, `h0`, sorts first by name: the tie-break of an unpinned
/// Proxy's placement among equally loaded hosts, so a placement that ignored the cordon
/// would pick it.
const HOSTS: [&str; 3] = ["h1", "h2", "h0"];
const REPLICAS: usize = 2;
const MAX_UNAVAILABLE: usize = 0;
/// Hang guard of every wait (fake hosts answer in microseconds).
const DEADLINE: Duration = Duration::from_secs(120);

fn digest() -> String {
    "ad".repeat(32)
}

/// The operator process; killed and reaped when dropped, its log kept for failures.
struct Operator {
    child: Child,
    log: PathBuf,
}

impl Operator {
    fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes the provider config with each host's `maintenance` (`None` when not listed).
fn write_config(path: &Path, socks: &BTreeMap<&str, PathBuf>, maintenance: &[(&str, &str)]) {
    let mut hosts = String::new();
    for h in HOSTS {
        let m = maintenance
            .iter()
            .find(|(n, _)| *n == h)
            .map_or("None", |(_, m)| m);
        hosts.push_str(&format!(
            "      - name: {h}\n        address: local\n        socket: {}\n        pool: {POOL}\n        \
             network: default\n        virtType: qemu\n        poolReserveGiB: 1\n        \
             maintenance: {m}\n",
            socks[h].display()
        ));
    }
    // NB: written whole to a temporary name and renamed, so the watch never reads half a file.
    let tmp = path.with_extension("tmp");
    std::fs::write(
        &tmp,
        format!(
            "providers:\n  - name: {ENTRY}\n    type: libvirt\n    hosts:\n{hosts}    images:\n      \
             {IMAGE}:\n        url: https://images.invalid/tiny.qcow2\n        sha256: {}\n        \
             format: qcow2\n    defaults:\n      diskGiB: 4\n      memoryMiB: 256\n      vcpus: 1\n",
            digest()
        ),
    )
    .unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

fn proxy_manifest(dir: &Path, name: &str, host: Option<&str>) {
    let pin = host.map(|h| format!("  host: {h}\n")).unwrap_or_default();
    write(
        dir,
        &format!("{name}.yaml"),
        &format!(
            "apiVersion: egress-proxies.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: {name}\n\
             spec:\n  provider: {ENTRY}\n{pin}  image: {IMAGE}\n  proxy:\n    \
             allowedClientCidrs: [10.0.0.0/8]\n"
        ),
    );
}

/// GET `path` from the operator; `None` while nothing answers.
async fn get(addr: SocketAddr, path: &str) -> Option<String> {
    let go = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .ok()?;
        let mut buf = String::new();
        s.read_to_string(&mut buf).await.ok()?;
        match ep_test_support::http::response(&buf)? {
            (200, body) => Some(body),
            _ => None,
        }
    };
    tokio::time::timeout(Duration::from_secs(5), go)
        .await
        .ok()
        .flatten()
}

async fn json(addr: SocketAddr, path: &str) -> Value {
    get(addr, path)
        .await
        .and_then(|b| serde_json::from_str(&b).ok())
        .unwrap_or(Value::Null)
}

/// What one look at `/status` shows.
#[derive(Debug, Default)]
struct Look {
    /// The pool's members not being deleted: name → (host, available).
    members: BTreeMap<String, (String, bool)>,
    /// Every Proxy: name → (phase, host, Ready condition's reason).
    proxies: BTreeMap<String, (String, String, String)>,
}

impl Look {
    fn available(&self) -> usize {
        self.members.values().filter(|(_, a)| *a).count()
    }
    fn on(&self, host: &str) -> usize {
        self.members.values().filter(|(h, _)| h == host).count()
    }
    fn proxy(&self, name: &str) -> (&str, &str, &str) {
        self.proxies.get(name).map_or(("-", "-", "-"), |(p, h, r)| {
            (p.as_str(), h.as_str(), r.as_str())
        })
    }
}

async fn look(addr: SocketAddr) -> Look {
    let doc = json(addr, "/status").await;
    let mut l = Look::default();
    for p in doc["pools"].as_array().into_iter().flatten() {
        if p["name"] != "web" {
            continue;
        }
        for m in p["members"].as_array().into_iter().flatten() {
            if m["deleting"] == true {
                continue;
            }
            l.members.insert(
                m["name"].as_str().unwrap_or("").to_owned(),
                (
                    m["host"].as_str().unwrap_or("-").to_owned(),
                    m["available"] == true,
                ),
            );
        }
    }
    for p in doc["proxies"].as_array().into_iter().flatten() {
        let ready = p["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Ready")
            .and_then(|c| c["reason"].as_str())
            .unwrap_or("-");
        l.proxies.insert(
            p["name"].as_str().unwrap_or("").to_owned(),
            (
                p["phase"].as_str().unwrap_or("-").to_owned(),
                p["host"].as_str().unwrap_or("-").to_owned(),
                ready.to_owned(),
            ),
        );
    }
    l
}

/// Each host's `maintenance` in `/hosts` ("-" when absent).
async fn maintenance(addr: SocketAddr) -> BTreeMap<String, String> {
    json(addr, "/hosts")
        .await
        .as_array()
        .into_iter()
        .flatten()
        .map(|h| {
            (
                h["host"].as_str().unwrap_or("").to_owned(),
                h["maintenance"].as_str().unwrap_or("-").to_owned(),
            )
        })
        .collect()
}

fn domains(fakes: &BTreeMap<&str, FakeLibvirt>, host: &str) -> usize {
    fakes[host].domains().len()
}

fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_drained_by_a_config_reload_moves_its_proxies_within_the_pool_budget() {
    let work = tempfile::tempdir().unwrap();
    let mut fakes: BTreeMap<&str, FakeLibvirt> = BTreeMap::new();
    let mut socks: BTreeMap<&str, PathBuf> = BTreeMap::new();
    for h in HOSTS {
        let fake = FakeLibvirt::new();
        fake.add_pool(PoolSpec::new(POOL).capacity(100 * GIB))
            .unwrap();
        fake.add_network(dhcp_network("default")).unwrap();
        publish_base(&fake, ENTRY, IMAGE, &digest());
        let sock = work.path().join(format!("{h}.sock"));
        fake.listen_unix(&sock).await.unwrap();
        fakes.insert(h, fake);
        socks.insert(h, sock);
    }
    let dhcp = CancellationToken::new();
    tokio::spawn(run_dhcp(
        ENTRY.into(),
        fakes
            .iter()
            .map(|(h, f)| ((*h).to_owned(), f.clone()))
            .collect(),
        Duration::from_millis(100),
        dhcp.clone(),
    ));
    let _dhcp = dhcp.drop_guard();

    // Only h1 in service at first: everything lands there.
    let cfg = work.path().join("providers.yaml");
    write_config(&cfg, &socks, &[("h2", "Cordon"), ("h0", "Cordon")]);
    let dir = work.path().join("manifests");
    std::fs::create_dir(&dir).unwrap();
    write(
        &dir,
        "web.yaml",
        &format!(
            "apiVersion: egress-proxies.dev/v1alpha1\nkind: ProxyPool\nmetadata:\n  name: web\n\
             spec:\n  replicas: {REPLICAS}\n  update: {{maxSurge: 1, maxUnavailable: {MAX_UNAVAILABLE}}}\n  \
             template:\n    spec:\n      provider: {ENTRY}\n      image: {IMAGE}\n      proxy:\n        \
             allowedClientCidrs: [10.0.0.0/8]\n  credentials: {{generate: true}}\n"
        ),
    );
    proxy_manifest(&dir, "solo", None);
    proxy_manifest(&dir, "pinned", Some("h1"));
    let log = work.path().join("operator.log");
    let listen = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
    let child = Command::new(BIN)
        .args(["standalone", "--config"])
        .arg(&cfg)
        .arg("--proxies")
        .arg(&dir)
        .args(["--listen", &listen.to_string(), "--check-interval", "1s"])
        .env_remove("EGRESS_PROXIES_CONFIG")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut op = Operator { child, log };

    let t0 = Instant::now();
    let settled_on_h1 = |l: &Look| {
        l.available() == REPLICAS
            && l.on("h1") == REPLICAS
            && l.proxy("solo").0 == "Running"
            && l.proxy("solo").1 == "h1"
            && l.proxy("pinned").0 == "Running"
    };
    loop {
        let l = look(listen).await;
        if settled_on_h1(&l) {
            break;
        }
        assert!(
            op.child.try_wait().unwrap().is_none(),
            "standalone exited\n{}",
            op.tail()
        );
        assert!(
            t0.elapsed() < DEADLINE,
            "not settled on h1 after {DEADLINE:?}: {l:?}\n{}",
            op.tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(domains(&fakes, "h1"), REPLICAS + 2);
    assert_eq!(domains(&fakes, "h2") + domains(&fakes, "h0"), 0);
    let m = maintenance(listen).await;
    assert_eq!(m["h0"], "Cordoned", "{m:?}");
    println!(
        "eptest: settled on h1 after {:.1} s; draining h1 (h2 in service, h0 cordoned)",
        t0.elapsed().as_secs_f64()
    );

    // Drain h1 by a config reload; sample every second.
    write_config(&cfg, &socks, &[("h1", "Drain"), ("h0", "Cordon")]);
    let t1 = Instant::now();
    let min_available = REPLICAS - MAX_UNAVAILABLE;
    let mut lowest = usize::MAX;
    loop {
        let l = look(listen).await;
        let hosts = maintenance(listen).await;
        println!(
            "eptest: t={:>3}s available={} members={:?} solo={:?} pinned={:?} h1={} h0={} \
             domains h1/h2/h0={}/{}/{}",
            t1.elapsed().as_secs(),
            l.available(),
            l.members,
            l.proxy("solo"),
            l.proxy("pinned"),
            hosts.get("h1").map_or("?", String::as_str),
            hosts.get("h0").map_or("?", String::as_str),
            domains(&fakes, "h1"),
            domains(&fakes, "h2"),
            domains(&fakes, "h0"),
        );
        lowest = lowest.min(l.available());
        assert!(
            l.available() >= min_available,
            "available members dropped to {} (below replicas - maxUnavailable = {min_available}): \
             {l:?}\n{}",
            l.available(),
            op.tail()
        );
        assert_eq!(domains(&fakes, "h0"), 0, "a cordoned host got a proxy");
        let done = l.on("h1") == 0
            && l.on("h2") == REPLICAS
            && l.available() == REPLICAS
            && l.proxy("solo") == ("Running", "h2", "Running")
            && l.proxy("pinned") == ("Running", "h1", "OnDrainingHost")
            // Only the pinned Proxy's domain is left on h1.
            && domains(&fakes, "h1") == 1
            && hosts.get("h1").map(String::as_str) == Some("Draining (1 left)");
        if done {
            break;
        }
        assert!(
            op.child.try_wait().unwrap().is_none(),
            "standalone exited\n{}",
            op.tail()
        );
        assert!(
            t1.elapsed() < DEADLINE,
            "the drain did not finish within {DEADLINE:?}: {l:?}\n{}",
            op.tail()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    println!(
        "eptest: drained in {:.1} s; lowest available {lowest} (bound {min_available})",
        t1.elapsed().as_secs_f64()
    );

    // The user's view: the host rows of `egress-proxies status`, and the pinned Proxy's reason.
    let out = Command::new(BIN)
        .args(["status", "--server", &format!("http://{listen}")])
        .env_remove("EGRESS_PROXIES_CONFIG")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    println!("eptest: egress-proxies status:\n{text}");
    assert!(
        text.contains(&format!("host {ENTRY}/h1 is Ready, Draining (1 left)")),
        "{text}"
    );
    assert!(
        text.contains(&format!("host {ENTRY}/h0 is Ready, Cordoned")),
        "{text}"
    );
    let doc = json(listen, "/status").await;
    let pinned_ready = doc["proxies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "pinned")
        .and_then(|p| {
            p["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "Ready")
                .cloned()
        })
        .unwrap();
    let msg = pinned_ready["message"].as_str().unwrap();
    assert!(
        msg.contains("host h1 is draining") && msg.contains("pinned to it (spec.host)"),
        "{msg}"
    );

    // The pinned Proxy removed: h1 is Drained, with nothing left on it.
    std::fs::remove_file(dir.join("pinned.yaml")).unwrap();
    let t2 = Instant::now();
    loop {
        let hosts = maintenance(listen).await;
        if hosts.get("h1").map(String::as_str) == Some("Drained") && domains(&fakes, "h1") == 0 {
            break;
        }
        assert!(
            t2.elapsed() < DEADLINE,
            "h1 not Drained: {hosts:?}, {} domains\n{}",
            domains(&fakes, "h1"),
            op.tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(domains(&fakes, "h0"), 0, "a cordoned host got a proxy");
    println!("eptest: h1 Drained, h0 still empty");
}
