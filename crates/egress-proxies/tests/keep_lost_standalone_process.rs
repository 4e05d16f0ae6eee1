//! A pool with `rotation.egressAddress: Keep` keeps the address of a member lost with its
//! host, in standalone mode, through the real `egress-proxies standalone` binary on two
//! libvirt-fake hosts of one segment sharing one address pool, each with a fence command (a
//! script that records its run in a file and exits 0).
//!
//! What it proves, through the user's path (`/status`, the fence command's file):
//! - a pool of 1 runs its member on host X with the pool's first address;
//! - X is frozen (nothing answered): after `hostDeadAfter` the member is lost, and its
//!   replacement is created on the other host Y pinned to that address;
//! - X's fence command runs (Y's never does), and the replacement runs on Y with the lost
//!   member's address, while the lost member's domain is left on X (never deleted while X
//!   is dead).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod standalone_support;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use standalone_support::{FakeHosts, Operator, free_port, json, providers_yaml, write};

const ENTRY: &str = "eptest-keeplost";
const IMAGE: &str = "tiny";
const HOSTS: [&str; 2] = ["h1", "h2"];
const ADDRESS: &str = "203.0.113.10";
/// Hang guard of every wait (fake hosts answer in microseconds).
const DEADLINE: Duration = Duration::from_secs(90);

fn host_extra(dir: &Path, host: &str) -> String {
    format!(
        "        segment: lan\n        fence: {{command: [/bin/sh, -c, 'echo run >> {}/fenced-{host}'], \
         timeout: 5s}}\n        addressPool:\n          ipv4:\n            \
         prefix: 203.0.113.0/24\n            gateway: 203.0.113.1\n            \
         ranges: [203.0.113.10-203.0.113.12]\n",
        dir.display()
    )
}

/// Every member Proxy of the pool in `/status`: name → (phase, host, egress addresses).
fn rows(doc: &Value) -> Vec<(String, String, String, Vec<String>)> {
    let s = |v: &Value| v.as_str().unwrap_or("-").to_owned();
    doc["proxies"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| s(&p["name"]).starts_with("web-"))
        .map(|p| {
            let egress = p["egressAddress"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect();
            (s(&p["name"]), s(&p["phase"]), s(&p["host"]), egress)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_members_replacement_takes_its_address_on_the_segment_peer_after_the_fence() {
    let work = tempfile::tempdir().unwrap();
    let fakes = FakeHosts::start(work.path(), ENTRY, IMAGE, &HOSTS).await;
    let hosts: String = HOSTS
        .iter()
        .map(|h| fakes.host_yaml(h, &host_extra(work.path(), h)))
        .collect();
    write(
        work.path(),
        "providers.yaml",
        &providers_yaml(ENTRY, IMAGE, &hosts, ""),
    );
    let cfg = work.path().join("providers.yaml");
    let dir = work.path().join("manifests");
    std::fs::create_dir(&dir).unwrap();
    write(
        &dir,
        "web.yaml",
        &format!(
            "apiVersion: egress-proxies.dev/v1alpha1\nkind: ProxyPool\nmetadata:\n  name: web\n\
             spec:\n  replicas: 1\n  update: {{maxSurge: 0, maxUnavailable: 1}}\n  \
             rotation: {{egressAddress: Keep}}\n  autohealing: {{hostDeadAfter: 10s}}\n  \
             template:\n    spec:\n      provider: {ENTRY}\n      image: {IMAGE}\n      proxy:\n        \
             allowedClientCidrs: [10.0.0.0/8]\n"
        ),
    );
    let listen = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
    let mut op = Operator::start(
        &cfg,
        &dir,
        listen,
        "1s",
        [] as [&str; 0],
        work.path().join("operator.log"),
        40,
    );

    // The member runs with the pool's first address on host X.
    let t0 = Instant::now();
    let (old, x) = loop {
        let r = rows(&json(listen, "/status").await);
        if let [(name, phase, host, egress)] = r.as_slice()
            && phase == "Running"
            && egress == &[ADDRESS.to_owned()]
        {
            break (name.clone(), host.clone());
        }
        op.assert_running();
        assert!(
            t0.elapsed() < DEADLINE,
            "no member running: {r:?}\n{}",
            op.tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let y = HOSTS.iter().find(|h| **h != x).unwrap().to_string();
    println!("eptest: {old} runs on {x} with {ADDRESS}; freezing {x}");
    fakes.fakes[x.as_str()].faults().freeze();
    let t_freeze = Instant::now();

    // Its replacement on Y gets the address, after X's fence command ran.
    let fenced = work.path().join(format!("fenced-{x}"));
    let (new, _) = loop {
        let r = rows(&json(listen, "/status").await);
        assert_eq!(
            fakes.domains(&x),
            1,
            "{old}'s domain deleted while {x} is dead"
        );
        let running = r.iter().find(|(n, phase, host, egress)| {
            n != &old && phase == "Running" && host == &y && egress == &[ADDRESS.to_owned()]
        });
        if let Some((n, ..)) = running {
            break (n.clone(), r.clone());
        }
        // Never two holders: while the replacement is not running it has no address.
        for (n, _, _, egress) in &r {
            if n != &old {
                assert!(
                    !egress.contains(&ADDRESS.to_owned()) || fenced.exists(),
                    "{n} has {ADDRESS} before {x} was fenced: {r:?}"
                );
            }
        }
        op.assert_running();
        assert!(
            t_freeze.elapsed() < DEADLINE,
            "no replacement on {y} with {ADDRESS}: {r:?}\n{}",
            op.tail()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    println!(
        "eptest: {new} running on {y} with {ADDRESS} {:.1} s after {x} was frozen",
        t_freeze.elapsed().as_secs_f64()
    );
    let runs = std::fs::read_to_string(&fenced).unwrap_or_default();
    assert!(runs.lines().count() >= 1, "{x}'s fence command never ran");
    assert!(
        !work.path().join(format!("fenced-{y}")).exists(),
        "{y}'s fence command ran"
    );
    // The member file records what it replaces.
    let members = std::fs::read_to_string(dir.join(".default.web.pool-members.json")).unwrap();
    assert!(
        members.contains(&format!("\"replaces\": \"{old}\"")),
        "{members}"
    );
}
