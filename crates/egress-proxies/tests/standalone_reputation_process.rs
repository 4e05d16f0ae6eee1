//! Egress address reputation in standalone mode, through the real `egress-proxies standalone`
//! binary as its own process (config file and manifest directory as a user gives them), over
//! a libvirt-fake host on a unix socket whose address pool has four addresses, with a real DNS
//! server (nsd, on a private loopback port) serving the blocklist zone the config's
//! `reputation:` section names.
//!
//! A ProxyPool with `reputation.onListed: Replace`, one replica, `maxUnavailable: 0`: the
//! first member runs, checked and not listed → its address is listed in the zone → the next
//! check round finds it → the pool replaces the member (never below its one available member once it had one), the
//! replacement at another address → the listed address is retired in the pool's status and
//! in its member file → scaled to 3, the members get the three other addresses → the process
//! is killed and started again → scaled to 4, the fourth finds the pool exhausted, never
//! given the retired one → the pool is deleted, which ends its retirements: a Proxy pinning
//! the address gets it. `egress-proxies addresses` lists the retired address with its reason
//! and the allocated ones with their Proxies.
//!
//! Under `onListed: Unpublish` (every address of the pool listed), the listed member shows
//! the listing in `/status` (`reputation`, `Listed` True) and in `egress-proxies status`,
//! leaves the healthy list and the available count, and is kept.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod cli_support;

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cli_support::{BIN, output_within};
use ep_operator_fixtures::{GIB, POOL, publish_base};
use ep_test_support::nsd::{Nsd, TestZone};
use libvirt_fake::{FakeLibvirt, NetworkSpec, PoolSpec};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ENTRY: &str = "eptest-rep";
const IMAGE: &str = "tiny";
/// Hang guard of every wait.
// NB: a member is Running within seconds on the fake host; a new address is checked within
// the worker's 5 s poll, a listing added later within a round (`interval: 1m`); a
// replacement is a create, a check and a delete.
const DEADLINE: Duration = Duration::from_secs(120);
const ZONE: &str = "bl.test";
const PNAME: &str = "clean";
/// The host's address pool.
const ALL: [&str; 4] = ["203.0.113.2", "203.0.113.3", "203.0.113.4", "203.0.113.5"];

fn digest() -> String {
    "ad".repeat(32)
}

/// Kills and reaps the operator when dropped; its log (stderr) is kept in a file.
struct Process(Child, PathBuf);

impl Process {
    /// The last 40 lines of its log.
    fn log_tail(&self) -> String {
        let s = std::fs::read_to_string(&self.1).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn config(dir: &Path, sock: &Path, resolver: SocketAddr) -> PathBuf {
    let cfg = dir.join("providers.yaml");
    std::fs::write(
        &cfg,
        format!(
            "providers:\n  - name: {ENTRY}\n    type: libvirt\n    hosts:\n      - name: h1\n        \
             address: local\n        socket: {}\n        pool: {POOL}\n        network: default\n        \
             virtType: qemu\n        poolReserveGiB: 1\n        addressPool:\n          ipv4:\n            \
             prefix: 203.0.113.0/24\n            gateway: 203.0.113.1\n            \
             ranges: [203.0.113.2-203.0.113.5]\n    images:\n      {IMAGE}:\n        \
             url: https://images.invalid/tiny.qcow2\n        sha256: {}\n        format: qcow2\n    \
             timeouts:\n      dial: 3\n    defaults:\n      diskGiB: 4\n      memoryMiB: 256\n      \
             vcpus: 1\n\
             reputation:\n  resolvers: ['{resolver}']\n  interval: 1m\n  timeout: 2s\n  \
             retireFor: 1h\n  zones:\n    - name: {ZONE}\n      codes:\n        \
             - {{answer: 127.0.0.2, means: listed, label: SBL}}\n",
            sock.display(),
            digest()
        ),
    )
    .unwrap();
    cfg
}

fn pool_manifest(dir: &Path, replicas: u32) {
    pool_manifest_on(dir, replicas, "Replace");
}

fn pool_manifest_on(dir: &Path, replicas: u32, on_listed: &str) {
    let text = format!(
        "apiVersion: egress-proxies.dev/v1alpha1\nkind: ProxyPool\nmetadata:\n  name: {PNAME}\n\
         spec:\n  replicas: {replicas}\n  template:\n    spec:\n      provider: {ENTRY}\n      \
         image: {IMAGE}\n      proxy:\n        allowedClientCidrs: [10.0.0.0/8]\n  \
         update:\n    maxSurge: 1\n    maxUnavailable: 0\n  reputation:\n    onListed: {on_listed}\n"
    );
    // Atomically: the operator never reads half a manifest.
    let tmp = dir.join(".pool.yaml.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, dir.join("pool.yaml")).unwrap();
}

fn start(cfg: &Path, proxies: &Path, port: u16) -> Process {
    let log = proxies.with_file_name(format!("operator-{port}.log"));
    let child = Command::new(BIN)
        .args([
            "standalone",
            "--config",
            &cfg.display().to_string(),
            "--proxies",
            &proxies.display().to_string(),
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--check-interval",
            "1s",
        ])
        .env_remove("EGRESS_PROXIES_CONFIG")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    Process(child, log)
}

/// GET `path` from `addr`; `None` while nothing answers.
async fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .ok()?;
        let mut buf = String::new();
        s.read_to_string(&mut buf).await.ok()?;
        ep_test_support::http::response(&buf)
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .ok()
        .flatten()
}

async fn status(addr: SocketAddr) -> Option<Value> {
    match get(addr, "/status").await {
        Some((200, body)) => serde_json::from_str(&body).ok(),
        _ => None,
    }
}

/// Polls `/status` every 200 ms until `f` gives a value (the operator must stay up).
async fn wait_for<T>(
    what: &str,
    op: &mut Process,
    addr: SocketAddr,
    mut f: impl FnMut(&Value) -> Option<T>,
) -> T {
    let t0 = Instant::now();
    let mut last = Value::Null;
    loop {
        assert!(op.0.try_wait().unwrap().is_none(), "standalone exited");
        if let Some(d) = status(addr).await {
            if let Some(v) = f(&d) {
                return v;
            }
            last = d;
        }
        assert!(
            t0.elapsed() < DEADLINE,
            "{what}: not in time; last /status: {last:#}\noperator log:\n{}",
            op.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn members(d: &Value) -> Vec<Value> {
    d["proxies"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .filter(|p| p["name"].as_str().is_some_and(|n| n.starts_with("clean-")))
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

fn pool(d: &Value) -> Value {
    d["pools"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == PNAME).cloned())
        .unwrap_or_default()
}

fn egress(p: &Value) -> Vec<String> {
    p["egressAddress"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn condition<'a>(p: &'a Value, type_: &str) -> Option<&'a Value> {
    p["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

fn available(d: &Value) -> u64 {
    pool(d)["status"]["availableReplicas"].as_u64().unwrap_or(0)
}

async fn cli(args: Vec<String>) -> std::process::Output {
    tokio::task::spawn_blocking(move || {
        let mut cmd = Command::new(BIN);
        cmd.args(&args)
            .env_remove("EGRESS_PROXIES_CONFIG")
            .env_remove("EGRESS_PROXIES_SERVER");
        output_within(&mut cmd, DEADLINE)
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_member_is_replaced_within_budget_and_its_address_stays_retired_across_a_restart()
{
    // The zone lists nothing until the first member's address is known.
    let mut nsd = tokio::task::spawn_blocking(|| Nsd::start(None, &[TestZone::new(ZONE)]))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("h1.sock");
    let fake = FakeLibvirt::new();
    fake.add_pool(PoolSpec::new(POOL).capacity(100 * GIB))
        .unwrap();
    fake.add_network(NetworkSpec::new("default")).unwrap();
    publish_base(&fake, ENTRY, IMAGE, &digest());
    fake.listen_unix(&sock).await.unwrap();
    let cfg = config(dir.path(), &sock, nsd.addr());
    let proxies = dir.path().join("proxies");
    std::fs::create_dir(&proxies).unwrap();
    pool_manifest(&proxies, 1);
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut op = start(&cfg, &proxies, port);

    // The first member runs, checked and not listed; then its address is listed.
    let (first_name, listed) = wait_for("the first member checked", &mut op, addr, |d| {
        let ms = members(d);
        let m = ms.first()?;
        (ms.len() == 1
            && m["phase"] == "Running"
            && condition(m, "Listed").is_some_and(|c| c["status"] == "False"))
        .then(|| Some((m["name"].as_str()?.to_owned(), egress(m).first()?.clone())))
        .flatten()
    })
    .await;
    let others: Vec<String> = ALL
        .iter()
        .filter(|a| **a != listed)
        .map(|a| (*a).to_owned())
        .collect();
    nsd.serve(&[TestZone::new(ZONE).list(listed.parse().unwrap(), Ipv4Addr::new(127, 0, 0, 2))]);
    // The next check round finds it (the listing in status is checked by the Unpublish test:
    // here the replacement is Running within milliseconds on the fake host, and the listed
    // member goes as soon as it is).

    // Replaced: the listed member goes once a replacement at another address is available;
    // the pool never has fewer than one available member once it had one.
    let mut had_one = false;
    let replacement = wait_for("the listed member replaced", &mut op, addr, |d| {
        let n = available(d);
        had_one |= n >= 1;
        assert!(
            !had_one || n >= 1,
            "the pool dropped below its budget: {}",
            pool(d)
        );
        let ms = members(d);
        (ms.len() == 1 && ms[0]["name"] != first_name.as_str() && n == 1).then(|| ms[0].clone())
    })
    .await;
    let got = egress(&replacement);
    assert_eq!(got.len(), 1, "{replacement}");
    // Checked and not listed: no error (`Listed` False is the good state).
    let replacement = wait_for("the replacement checked", &mut op, addr, |d| {
        members(d).into_iter().find(|m| {
            m["name"] == replacement["name"]
                && condition(m, "Listed").is_some_and(|c| c["status"] == "False")
        })
    })
    .await;
    assert!(replacement["lastError"].is_null(), "{replacement:#}");
    assert!(others.contains(&got[0]), "{replacement}");

    // Retired in the pool's status, with the member and the listing.
    let d = status(addr).await.unwrap();
    let retired = pool(&d)["status"]["retiredAddresses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(retired.len(), 1, "{:#}", pool(&d));
    assert_eq!(
        (
            &retired[0]["address"],
            &retired[0]["host"],
            &retired[0]["member"]
        ),
        (&json!(listed), &json!("h1"), &json!(first_name)),
        "{retired:?}"
    );
    assert!(
        retired[0]["reason"].as_str().unwrap().contains(ZONE),
        "{retired:?}"
    );
    assert!(retired[0]["until"].is_string(), "{retired:?}");
    // ... and in the member file, which a restart reads back.
    let file: Value = serde_json::from_slice(
        &std::fs::read(proxies.join(format!(".default.{PNAME}.pool-members.json"))).unwrap(),
    )
    .unwrap();
    assert_eq!(
        file["status"]["retiredAddresses"][0]["address"], listed,
        "{file:#}"
    );

    // The host's pool as its next check sees it once the listed member's instance is gone:
    // four addresses, one held, one retired, two free.
    wait_for("the host's pool usage", &mut op, addr, |d| {
        let u = &d["hosts"][0]["addresses"][0];
        (u["held"] == 1 && u["retired"] == 1).then_some(())
    })
    .await;

    // `egress-proxies addresses`: the retired address with its reason and until when, the
    // replacement's address allocated to it, the host's free addresses.
    let out = cli(vec![
        "addresses".into(),
        "--server".into(),
        format!("http://{addr}"),
    ])
    .await;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = |a: &str| {
        text.lines()
            .find(|l| l.split_whitespace().any(|w| w == a))
            .unwrap_or_else(|| panic!("no row of {a}: {text}"))
            .to_owned()
    };
    let l = line(&listed);
    assert!(l.contains("retired") && l.contains(ZONE), "{text}");
    let l = line(&got[0]);
    assert!(
        l.contains("allocated") && l.contains(replacement["name"].as_str().unwrap()),
        "{text}"
    );
    let out = cli(vec![
        "addresses".into(),
        "--server".into(),
        format!("http://{addr}"),
        "-o".into(),
        "json".into(),
    ])
    .await;
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = doc["addresses"].as_array().cloned().unwrap_or_default();
    let r = rows
        .iter()
        .find(|r| r["address"] == listed.as_str())
        .unwrap();
    assert_eq!(r["state"], "retired", "{rows:?}");
    assert_eq!(r["pool"], format!("default/{PNAME}"), "{rows:?}");
    assert!(r["until"].is_string(), "{rows:?}");
    // The host's pool: four addresses, one retired, one held, two free.
    let h = &doc["hosts"][0];
    assert_eq!(
        (
            &h["host"],
            &h["size"],
            &h["held"],
            &h["retired"],
            &h["free"]
        ),
        (&json!("h1"), &json!(4), &json!(1), &json!(1), &json!(2)),
        "{doc:#}"
    );

    // Never reused while retired: scaled to 3, the members take the three other addresses.
    pool_manifest(&proxies, 3);
    let three = wait_for("three members at the other addresses", &mut op, addr, |d| {
        let ms = members(d);
        let got: BTreeSet<String> = ms.iter().flat_map(egress).collect();
        (ms.len() == 3 && got.len() == 3).then_some(got)
    })
    .await;
    assert_eq!(three, others.iter().cloned().collect());

    // A restart: the retirement is read back before anything is allocated; scaled to 4, the
    // fourth member finds the pool exhausted.
    drop(op);
    pool_manifest(&proxies, 4);
    let mut op = start(&cfg, &proxies, port);
    let four = wait_for("four members, the fourth refused", &mut op, addr, |d| {
        let ms = members(d);
        let got: BTreeSet<String> = ms.iter().flat_map(egress).collect();
        let refused = ms.iter().any(|m| {
            egress(m).is_empty() && {
                let t = serde_json::to_string(m).unwrap();
                t.contains("retired") && t.contains("exhausted")
            }
        });
        (ms.len() == 4 && got.len() == 3 && refused).then_some(got)
    })
    .await;
    assert_eq!(four, others.iter().cloned().collect());
    let d = status(addr).await.unwrap();
    for m in members(&d) {
        assert!(!egress(&m).contains(&listed), "reused: {m}");
    }
    assert_eq!(
        pool(&d)["status"]["retiredAddresses"][0]["address"],
        listed,
        "{:#}",
        pool(&d)
    );

    // Deleting the pool ends its retirements: once its members are gone, a Proxy may be
    // given the address again.
    std::fs::remove_file(proxies.join("pool.yaml")).unwrap();
    wait_for("the pool gone", &mut op, addr, |d| {
        (members(d).is_empty() && pool(d).is_null()).then_some(())
    })
    .await;
    std::fs::write(
        proxies.join("solo.yaml"),
        format!(
            "apiVersion: egress-proxies.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: solo\n\
             spec:\n  provider: {ENTRY}\n  image: {IMAGE}\n  egress:\n    address: [{listed}]\n  \
             proxy:\n    allowedClientCidrs: [10.0.0.0/8]\n"
        ),
    )
    .unwrap();
    wait_for("the address given again", &mut op, addr, |d| {
        d["proxies"].as_array()?.iter().find(|p| {
            p["name"] == "solo" && p["phase"] == "Running" && egress(p) == [listed.clone()]
        })?;
        Some(())
    })
    .await;
    drop(op);
    drop(nsd);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_unpublish_a_listed_member_leaves_the_healthy_list_and_is_kept() {
    let nsd = tokio::task::spawn_blocking(|| {
        Nsd::start(
            None,
            // Every address of the pool: the member's is listed, whichever it gets.
            &[ALL.iter().fold(TestZone::new(ZONE), |z, a| {
                z.list(a.parse().unwrap(), Ipv4Addr::new(127, 0, 0, 2))
            })],
        )
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("h1.sock");
    let fake = FakeLibvirt::new();
    fake.add_pool(PoolSpec::new(POOL).capacity(100 * GIB))
        .unwrap();
    fake.add_network(NetworkSpec::new("default")).unwrap();
    publish_base(&fake, ENTRY, IMAGE, &digest());
    fake.listen_unix(&sock).await.unwrap();
    let cfg = config(dir.path(), &sock, nsd.addr());
    let proxies = dir.path().join("proxies");
    std::fs::create_dir(&proxies).unwrap();
    pool_manifest_on(&proxies, 1, "Unpublish");
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut op = start(&cfg, &proxies, port);

    // Running at the listed address, listed: not available, not in the healthy list.
    let first = wait_for("the member listed and unpublished", &mut op, addr, |d| {
        let ms = members(d);
        let listed = ms.len() == 1
            && condition(&ms[0], "Listed").is_some_and(|c| c["status"] == "True")
            && ms[0]["phase"] == "Running";
        let row = pool(d)["members"][0].clone();
        (listed && row["available"] == false && available(d) == 0).then(|| ms[0].clone())
    })
    .await;
    let rep = &first["reputation"];
    let at = egress(&first)[0].clone();
    assert_eq!(rep["listed"][0]["address"], at.as_str(), "{rep}");
    assert_eq!(rep["listed"][0]["zone"], ZONE, "{rep}");
    assert_eq!(rep["listed"][0]["codes"], json!(["SBL"]), "{rep}");
    assert!(rep["listed"][0]["since"].is_string(), "{rep}");
    assert!(rep["lastCheck"].is_string(), "{rep}");
    let c = condition(&first, "Listed").unwrap();
    assert!(
        c["message"].as_str().unwrap().contains(&at)
            && c["message"].as_str().unwrap().contains(ZONE),
        "{c}"
    );
    // `egress-proxies status` shows it in the LISTED column.
    let out = cli(vec![
        "status".into(),
        "--server".into(),
        format!("http://{addr}"),
    ])
    .await;
    let table = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(table.contains("LISTED") && table.contains(ZONE), "{table}");
    let (code, body) = get(addr, &format!("/pools/{PNAME}/healthy.txt"))
        .await
        .unwrap();
    assert_eq!(
        (code, body.as_str()),
        (200, ""),
        "the listed member is published"
    );
    // Kept, not replaced, and no address retired, across several pool rounds.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let d = status(addr).await.unwrap();
    let ms = members(&d);
    assert_eq!(ms.len(), 1, "{d:#}");
    assert_eq!(ms[0]["name"], first["name"], "{d:#}");
    assert!(
        pool(&d)["status"]["retiredAddresses"]
            .as_array()
            .is_none_or(Vec::is_empty),
        "{:#}",
        pool(&d)
    );
    drop(op);
    drop(nsd);
}
