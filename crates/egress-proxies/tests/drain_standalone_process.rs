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

mod standalone_support;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use standalone_support::{
    BIN, FakeHosts, Look, Operator, free_port, host_rows, json, providers_yaml, write,
};

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

/// Writes the provider config with each host's `maintenance` (`None` when not listed).
fn write_config(path: &Path, fakes: &FakeHosts, maintenance: &[(&str, &str)]) {
    let mut hosts = String::new();
    for h in HOSTS {
        let m = maintenance
            .iter()
            .find(|(n, _)| *n == h)
            .map_or("None", |(_, m)| m);
        hosts.push_str(&fakes.host_yaml(h, &format!("        maintenance: {m}\n")));
    }
    standalone_support::write_whole(path, &providers_yaml(ENTRY, IMAGE, &hosts, ""));
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

/// The pool's look at `/status`.
async fn look(addr: SocketAddr) -> Look {
    standalone_support::look(addr, "web").await
}

/// Each host's `maintenance` in `/hosts` ("-" when absent).
async fn maintenance(addr: SocketAddr) -> BTreeMap<String, String> {
    host_rows(addr, "maintenance").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_drained_by_a_config_reload_moves_its_proxies_within_the_pool_budget() {
    let work = tempfile::tempdir().unwrap();
    let fakes = FakeHosts::start(work.path(), ENTRY, IMAGE, &HOSTS).await;

    // Only h1 in service at first: everything lands there.
    let cfg = work.path().join("providers.yaml");
    write_config(&cfg, &fakes, &[("h2", "Cordon"), ("h0", "Cordon")]);
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
    let mut op = Operator::start(&cfg, &dir, listen, "1s", [] as [&str; 0], log, 40);

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
        op.assert_running();
        assert!(
            t0.elapsed() < DEADLINE,
            "not settled on h1 after {DEADLINE:?}: {l:?}\n{}",
            op.tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(fakes.domains("h1"), REPLICAS + 2);
    assert_eq!(fakes.domains("h2") + fakes.domains("h0"), 0);
    let m = maintenance(listen).await;
    assert_eq!(m["h0"], "Cordoned", "{m:?}");
    println!(
        "eptest: settled on h1 after {:.1} s; draining h1 (h2 in service, h0 cordoned)",
        t0.elapsed().as_secs_f64()
    );

    // Drain h1 by a config reload; sample every second.
    write_config(&cfg, &fakes, &[("h1", "Drain"), ("h0", "Cordon")]);
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
            fakes.domains("h1"),
            fakes.domains("h2"),
            fakes.domains("h0"),
        );
        lowest = lowest.min(l.available());
        assert!(
            l.available() >= min_available,
            "available members dropped to {} (below replicas - maxUnavailable = {min_available}): \
             {l:?}\n{}",
            l.available(),
            op.tail()
        );
        assert_eq!(fakes.domains("h0"), 0, "a cordoned host got a proxy");
        let done = l.on("h1") == 0
            && l.on("h2") == REPLICAS
            && l.available() == REPLICAS
            && l.proxy("solo") == ("Running", "h2", "Running")
            && l.proxy("pinned") == ("Running", "h1", "OnDrainingHost")
            // Only the pinned Proxy's domain is left on h1.
            && fakes.domains("h1") == 1
            && hosts.get("h1").map(String::as_str) == Some("Draining (1 left)");
        if done {
            break;
        }
        op.assert_running();
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
        if hosts.get("h1").map(String::as_str) == Some("Drained") && fakes.domains("h1") == 0 {
            break;
        }
        assert!(
            t2.elapsed() < DEADLINE,
            "h1 not Drained: {hosts:?}, {} domains\n{}",
            fakes.domains("h1"),
            op.tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(fakes.domains("h0"), 0, "a cordoned host got a proxy");
    println!("eptest: h1 Drained, h0 still empty");
}
