//! An administrator declares a dead host dead, in standalone mode, through the real
//! `egress-proxies standalone` and `egress-proxies hosts fence` binaries on two libvirt-fake
//! hosts of one segment sharing one address pool (no fence command configured).
//!
//! What it proves, through the user's path (`/status`, `/hosts`, the `fenced-hosts` file):
//! - Proxy `a` holds the pool's first address on host X; X is frozen (nothing answered);
//! - Proxy `b`, pinned to that address, is placed on the other host Y and waits: not Running,
//!   nothing defined on Y, its condition naming X and `egress-proxies hosts fence X`; for
//!   longer than several checks (a timeout alone never frees the address);
//! - `egress-proxies hosts fence` refuses an unknown host (exit 2, naming it and the entries);
//!   `egress-proxies hosts fence X` exits 0, and `b` comes up on Y with the address;
//! - once X answers again, the operator removes X's line from the file.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod standalone_support;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use standalone_support::{
    BIN, FakeHosts, Operator, free_port, host_rows, json, providers_yaml, write, write_whole,
};

const ENTRY: &str = "eptest-fence";
const IMAGE: &str = "tiny";
const HOSTS: [&str; 2] = ["h1", "h2"];
const ADDRESS: &str = "203.0.113.10";
/// Hang guard of every wait (fake hosts answer in microseconds).
const DEADLINE: Duration = Duration::from_secs(90);
/// How long `b` is watched waiting before the declaration (several 1 s checks).
const WAITING: Duration = Duration::from_secs(6);

const POOL_YAML: &str = "        segment: lan\n        addressPool:\n          ipv4:\n            \
    prefix: 203.0.113.0/24\n            gateway: 203.0.113.1\n            \
    ranges: [203.0.113.10-203.0.113.12]\n";

fn proxy(dir: &Path, name: &str, pinned: Option<&str>) {
    let egress = pinned.map_or(String::new(), |a| {
        format!("  egress:\n    address: [{a}]\n")
    });
    write_whole(
        &dir.join(format!("{name}.yaml")),
        &format!(
            "apiVersion: egress-proxies.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: {name}\n\
             spec:\n  provider: {ENTRY}\n  image: {IMAGE}\n{egress}  proxy:\n    \
             allowedClientCidrs: [10.0.0.0/8]\n"
        ),
    );
}

/// Proxy `name` in `/status`: (phase, host, egress addresses, Ready message).
fn proxy_row(doc: &Value, name: &str) -> Option<(String, String, Vec<String>, String)> {
    let p = doc["proxies"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == name)?;
    let s = |v: &Value| v.as_str().unwrap_or("-").to_owned();
    let egress = p["egressAddress"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    let ready = p["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready")
        .map(|c| s(&c["message"]))
        .unwrap_or_default();
    Some((s(&p["phase"]), s(&p["host"]), egress, ready))
}

/// Runs `egress-proxies hosts ARGS --config cfg --proxies dir`: (exit code, stdout, stderr).
fn hosts_cmd(cfg: &Path, dir: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .arg("hosts")
        .args(args)
        .arg("--config")
        .arg(cfg)
        .arg("--proxies")
        .arg(dir)
        .env_remove("EGRESS_PROXIES_CONFIG")
        .env("USER", "ops-alice")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn fenced_file(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("fenced-hosts")).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_address_held_on_a_dead_host_moves_only_after_an_administrator_declares_it_dead() {
    let work = tempfile::tempdir().unwrap();
    let fakes = FakeHosts::start(work.path(), ENTRY, IMAGE, &HOSTS).await;
    let cfg = work.path().join("providers.yaml");
    let hosts: String = HOSTS
        .iter()
        .map(|h| fakes.host_yaml(h, POOL_YAML))
        .collect();
    write(
        work.path(),
        "providers.yaml",
        &providers_yaml(ENTRY, IMAGE, &hosts, ""),
    );
    let dir = work.path().join("manifests");
    std::fs::create_dir(&dir).unwrap();
    proxy(&dir, "a", None);
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

    // `a` runs with the pool's first address on one host: that host is X.
    let t0 = Instant::now();
    let x = loop {
        if let Some((phase, host, egress, _)) = proxy_row(&json(listen, "/status").await, "a")
            && phase == "Running"
            && egress == [ADDRESS]
        {
            break host;
        }
        op.assert_running();
        assert!(t0.elapsed() < DEADLINE, "a not running\n{}", op.tail());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let y = HOSTS.iter().find(|h| **h != x).unwrap().to_string();
    println!("eptest: a runs on {x} with {ADDRESS}; freezing {x}");
    fakes.fakes[x.as_str()].faults().freeze();
    let t_freeze = Instant::now();
    loop {
        let state = host_rows(listen, "state").await.get(&x).cloned();
        if matches!(state.as_deref(), Some("Timeout" | "Unreachable")) {
            break;
        }
        assert!(t_freeze.elapsed() < DEADLINE, "{x} never reported dead");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // `b` pins the address: placed on Y, it waits, saying for what.
    proxy(&dir, "b", Some(ADDRESS));
    let want = [
        format!("held by another Proxy's instance on host {x}"),
        format!("`egress-proxies hosts fence {x}`"),
    ];
    let t_b = Instant::now();
    let mut waiting_since: Option<Instant> = None;
    while waiting_since.is_none_or(|t| t.elapsed() < WAITING) {
        let row = proxy_row(&json(listen, "/status").await, "b");
        if let Some((phase, _, egress, msg)) = &row {
            assert_ne!(phase, "Running", "b running while {x} is dead: {row:?}");
            assert!(egress.is_empty(), "{row:?}");
            if waiting_since.is_none() && want.iter().all(|w| msg.contains(w.as_str())) {
                waiting_since = Some(Instant::now());
                println!(
                    "eptest: b waits ({:.1} s after its manifest): {msg}",
                    t_b.elapsed().as_secs_f64()
                );
            }
        }
        assert_eq!(fakes.domains(&y), 0, "b defined on {y} while {x} is dead");
        op.assert_running();
        assert!(
            t_b.elapsed() < DEADLINE,
            "b never said it waits for {x}: {row:?}\n{}",
            op.tail()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // An unknown host is refused, naming it and the entries; nothing is written.
    let (code, _, err) = hosts_cmd(&cfg, &dir, &["fence", "h9"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("host h9") && err.contains(ENTRY), "{err}");
    let (code, _, err) = hosts_cmd(&cfg, &dir, &["fence", "--entry", "nope", &x]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--entry nope") && err.contains(ENTRY), "{err}");
    assert_eq!(fenced_file(&dir), "");

    // The administrator declares X dead: b comes up on Y with the address.
    let (code, out, err) = hosts_cmd(&cfg, &dir, &["fence", &x, "--reason", "rack 4 unplugged"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&format!("host {x} of entry {ENTRY} declared dead")),
        "{out}"
    );
    let line = fenced_file(&dir);
    assert!(
        line.starts_with(&format!("{ENTRY} {x} ")) && line.contains(" ops-alice rack 4 unplugged"),
        "{line:?}"
    );
    let t_fence = Instant::now();
    loop {
        let row = proxy_row(&json(listen, "/status").await, "b");
        if let Some((phase, host, egress, _)) = &row
            && phase == "Running"
        {
            assert_eq!(
                (host.as_str(), egress.as_slice()),
                (y.as_str(), &[ADDRESS.to_owned()][..])
            );
            break;
        }
        op.assert_running();
        assert!(
            t_fence.elapsed() < DEADLINE,
            "b not running after the declaration: {row:?}\n{}",
            op.tail()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    println!(
        "eptest: b running on {y} with {ADDRESS} {:.1} s after `hosts fence {x}`",
        t_fence.elapsed().as_secs_f64()
    );
    assert!(
        !fenced_file(&dir).is_empty(),
        "the line went while {x} is dead"
    );

    // X answers again: the operator removes its line.
    fakes.fakes[x.as_str()].faults().thaw();
    let t_thaw = Instant::now();
    while !fenced_file(&dir).is_empty() {
        assert!(
            t_thaw.elapsed() < DEADLINE,
            "{x}'s line kept after it answered: {:?}\n{}",
            fenced_file(&dir),
            op.tail()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    println!(
        "eptest: {x}'s line removed {:.1} s after it was thawed",
        t_thaw.elapsed().as_secs_f64()
    );
}
