//! Pool failover when a host dies, in standalone mode, through the real `egress-proxies
//! standalone` binary on two libvirt-fake hosts (unix sockets; guest addresses given by the
//! fixtures' DHCP loop).
//!
//! What it proves, through the user's path (`/status`, `/hosts`, `/metrics`):
//! - a pool of 2 spread over h1 and h2; h1 is frozen (libvirt-fake's freeze fault: nothing is
//!   answered, not even keepalive), its row turns `Timeout`/`Unreachable`;
//! - the member on h1 is not replaced before `autohealing.hostDeadAfter` (10 s here) has
//!   passed since the row turned dead, and is replaced on h2 within that + the check interval
//!   + the standalone pool loop's tick;
//! - the old member and its domain on h1 stay while h1 is frozen (never deleted before), and
//!   the pool's status names it (`lostMembers`, `ReplicaFailure` `HostLost`);
//! - once h1 answers again, the old copy is deleted (its domain gone from h1), counted under
//!   `cause="host-lost"`.
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
const ENTRY: &str = "eptest-hostlost";
const IMAGE: &str = "tiny";
const HOSTS: [&str; 2] = ["h1", "h2"];
const REPLICAS: usize = 2;
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

/// Writes the provider config.
fn write_config(path: &Path, socks: &BTreeMap<&str, PathBuf>) {
    let mut hosts = String::new();
    for h in HOSTS {
        hosts.push_str(&format!(
            "      - name: {h}\n        address: local\n        socket: {}\n        pool: {POOL}\n        \
             network: default\n        virtType: qemu\n        poolReserveGiB: 1\n",
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
    /// The pool's `status` as recorded.
    status: Value,
}

impl Look {
    fn available(&self) -> usize {
        self.members.values().filter(|(_, a)| *a).count()
    }
    fn on(&self, host: &str) -> usize {
        self.members.values().filter(|(h, _)| h == host).count()
    }
}

async fn look(addr: SocketAddr) -> Look {
    let doc = json(addr, "/status").await;
    let mut l = Look::default();
    for p in doc["pools"].as_array().into_iter().flatten() {
        if p["name"] != "web" {
            continue;
        }
        l.status = p["status"].clone();
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
    l
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

/// Each host's `state` in `/hosts` ("-" when absent).
async fn host_states(addr: SocketAddr) -> BTreeMap<String, String> {
    json(addr, "/hosts")
        .await
        .as_array()
        .into_iter()
        .flatten()
        .map(|h| {
            (
                h["host"].as_str().unwrap_or("").to_owned(),
                h["state"].as_str().unwrap_or("-").to_owned(),
            )
        })
        .collect()
}

const BUDGET: Duration = Duration::from_secs(10);
const CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// The standalone pool loop decides every pool at least this often.
const POOL_TICK: Duration = Duration::from_secs(2);
/// How long h1 stays frozen once the pool is whole on h2 (more than the pool's 10 s look at
/// its lost members and a member reconcile's 5 s).
const HOLD: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_replaces_a_member_on_a_dead_host_after_the_budget_and_deletes_it_on_return() {
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

    let cfg = work.path().join("providers.yaml");
    write_config(&cfg, &socks);
    let dir = work.path().join("manifests");
    std::fs::create_dir(&dir).unwrap();
    write(
        &dir,
        "web.yaml",
        &format!(
            "apiVersion: egress-proxies.dev/v1alpha1\nkind: ProxyPool\nmetadata:\n  name: web\n\
             spec:\n  replicas: {REPLICAS}\n  update: {{maxSurge: 1, maxUnavailable: 0}}\n  \
             autohealing: {{hostDeadAfter: {}s}}\n  \
             template:\n    spec:\n      provider: {ENTRY}\n      image: {IMAGE}\n      proxy:\n        \
             allowedClientCidrs: [10.0.0.0/8]\n  credentials: {{generate: true}}\n",
            BUDGET.as_secs()
        ),
    );
    let log = work.path().join("operator.log");
    let listen = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
    let child = Command::new(BIN)
        .args(["standalone", "--config"])
        .arg(&cfg)
        .arg("--proxies")
        .arg(&dir)
        .args([
            "--listen",
            &listen.to_string(),
            "--check-interval",
            &format!("{}s", CHECK_INTERVAL.as_secs()),
        ])
        .env_remove("EGRESS_PROXIES_CONFIG")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut op = Operator { child, log };

    // Settled: one available member on each host.
    let t0 = Instant::now();
    let settled = loop {
        let l = look(listen).await;
        if l.available() == REPLICAS && l.on("h1") == 1 && l.on("h2") == 1 {
            break l;
        }
        assert!(
            op.child.try_wait().unwrap().is_none(),
            "standalone exited\n{}",
            op.tail()
        );
        assert!(
            t0.elapsed() < DEADLINE,
            "not settled after {DEADLINE:?}: {l:?}\n{}",
            op.tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let old = settled
        .members
        .iter()
        .find(|(_, (h, _))| h == "h1")
        .map(|(n, _)| n.clone())
        .unwrap();
    assert_eq!((domains(&fakes, "h1"), domains(&fakes, "h2")), (1, 1));
    println!(
        "eptest: settled after {:.1} s; {old} on h1; freezing h1",
        t0.elapsed().as_secs_f64()
    );

    // Freeze h1: its row turns dead, then the budget runs, then the replacement lands on h2.
    fakes["h1"].faults().freeze();
    let t_freeze = Instant::now();
    let mut t_dead: Option<Instant> = None;
    let t_replaced = loop {
        let l = look(listen).await;
        let states = host_states(listen).await;
        let h1 = states.get("h1").cloned().unwrap_or_default();
        if t_dead.is_none() && (h1 == "Timeout" || h1 == "Unreachable") {
            t_dead = Some(Instant::now());
            println!(
                "eptest: h1 {h1} {:.1} s after the freeze",
                t_freeze.elapsed().as_secs_f64()
            );
        }
        // Never deleted while h1 is dead.
        assert!(
            l.members.contains_key(&old),
            "{old} deleted while h1 is dead: {l:?}"
        );
        assert_eq!(
            domains(&fakes, "h1"),
            1,
            "{old}'s domain deleted while h1 is dead"
        );
        if l.on("h2") == REPLICAS {
            let dead = t_dead.expect("a replacement before h1 was reported dead");
            break Instant::now().duration_since(dead);
        }
        if let Some(dead) = t_dead {
            // Not before the budget has run since the row turned dead (the row and the
            // clock are set by the same check round; 0.5 s for this loop's own look).
            assert!(
                l.on("h2") == 1 || dead.elapsed() + Duration::from_millis(500) >= BUDGET,
                "replaced before the budget: {l:?}"
            );
        }
        assert!(
            t_freeze.elapsed() < DEADLINE,
            "not replaced within {DEADLINE:?}: {l:?} {states:?}\n{}",
            op.tail()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let bound = BUDGET + CHECK_INTERVAL + POOL_TICK + Duration::from_secs(1);
    println!(
        "eptest: replaced on h2 {:.1} s after h1 was reported dead (budget {BUDGET:?}, bound \
         {bound:?})",
        t_replaced.as_secs_f64()
    );
    assert!(
        t_replaced + Duration::from_millis(500) >= BUDGET,
        "replaced {t_replaced:?} after h1 was reported dead, before the budget {BUDGET:?}"
    );
    assert!(
        t_replaced <= bound,
        "replaced {t_replaced:?} after h1 was reported dead, later than {bound:?}"
    );
    // The status names the lost member and its host.
    let lost = look(listen).await.status;
    assert_eq!(lost["lostMembers"][0]["member"], old.as_str(), "{lost}");
    assert_eq!(lost["lostMembers"][0]["host"], "h1", "{lost}");
    let rf = lost["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "ReplicaFailure")
        .cloned()
        .unwrap();
    assert_eq!(rf["reason"], "HostLost", "{rf}");
    assert!(
        rf["message"]
            .as_str()
            .unwrap()
            .contains(&format!("h1 ({old})")),
        "{rf}"
    );

    // Still frozen a while longer: the old copy stays, also once its replacement is
    // available (the pool is whole without it) and past the pool's 10 s look at lost members.
    let hold = Instant::now();
    let mut whole: Option<Instant> = None;
    while whole.is_none_or(|t| t.elapsed() < HOLD) {
        assert!(
            hold.elapsed() < DEADLINE,
            "the replacement never became available"
        );
        if whole.is_none()
            && look(listen)
                .await
                .members
                .iter()
                .filter(|(n, (h, a))| *n != &old && h == "h2" && *a)
                .count()
                == REPLICAS
        {
            whole = Some(Instant::now());
        }
        let l = look(listen).await;
        assert!(
            l.members.contains_key(&old),
            "{old} deleted while h1 is dead"
        );
        assert_eq!(
            domains(&fakes, "h1"),
            1,
            "{old}'s domain deleted while h1 is dead"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // h1 answers again: the old copy goes.
    fakes["h1"].faults().thaw();
    let t_thaw = Instant::now();
    loop {
        let l = look(listen).await;
        if !l.members.contains_key(&old) && domains(&fakes, "h1") == 0 {
            assert_eq!(l.on("h2"), REPLICAS, "{l:?}");
            assert!(l.status["lostMembers"].is_null(), "{}", l.status);
            break;
        }
        assert!(
            t_thaw.elapsed() < DEADLINE,
            "{old} not deleted {DEADLINE:?} after h1 returned: {l:?}, {} domain(s) on h1\n{}",
            domains(&fakes, "h1"),
            op.tail()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    println!(
        "eptest: {old} and its domain on h1 deleted {:.1} s after h1 was thawed",
        t_thaw.elapsed().as_secs_f64()
    );
    let metrics = get(listen, "/metrics").await.unwrap_or_default();
    let line = metrics
        .lines()
        .find(|l| {
            l.starts_with("egress_proxies_pool_replacements_total") && l.contains("host-lost")
        })
        .unwrap_or_default()
        .to_owned();
    assert!(line.ends_with(" 1"), "{line:?}");
}
