//! Declared egress addresses through the real binary, against a libvirt-fake host on a unix
//! socket whose config declares a dual-stack address pool of two addresses per family:
//! `check -o json` and `check` report the pool's usage; `standalone` gives a Proxy pinning
//! `spec.egress.address` exactly its pins and another Proxy the pool's free addresses (never
//! a pinned one, though the pins are the addresses it would take first), shows
//! them as `egressAddress` in `/status` (and in `egress-proxies status`), and reports the
//! pool allocated/free per family in `/metrics`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod cli_support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cli_support::{BIN, output_within};
use ep_operator_fixtures::{GIB, POOL, publish_base};
use libvirt_fake::{FakeLibvirt, NetworkSpec, PoolSpec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ENTRY: &str = "eptest-addr";
const IMAGE: &str = "tiny";
/// Deadline of one CLI run and of each wait (the fake answers in microseconds).
const DEADLINE: Duration = Duration::from_secs(60);

fn digest() -> String {
    "ad".repeat(32)
}

/// Kills and reaps the operator when dropped.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn config(dir: &Path, sock: &Path) -> std::path::PathBuf {
    let cfg = dir.join("providers.yaml");
    std::fs::write(
        &cfg,
        format!(
            "providers:\n  - name: {ENTRY}\n    type: libvirt\n    hosts:\n      - name: h1\n        \
             address: local\n        socket: {}\n        pool: {POOL}\n        network: default\n        \
             virtType: qemu\n        poolReserveGiB: 1\n        addressPool:\n          ipv4:\n            \
             prefix: 192.0.2.0/24\n            gateway: 192.0.2.1\n            \
             ranges: [192.0.2.2-192.0.2.3]\n          ipv6:\n            prefix: 2001:db8:5::/64\n            \
             gateway: 2001:db8:5::1\n            ranges: [2001:db8:5::10-2001:db8:5::11]\n          \
             dns: [192.0.2.53]\n    images:\n      {IMAGE}:\n        \
             url: https://images.invalid/tiny.qcow2\n        sha256: {}\n        format: qcow2\n    \
             timeouts:\n      dial: 3\n    defaults:\n      diskGiB: 4\n      memoryMiB: 256\n      \
             vcpus: 1\n",
            sock.display(),
            digest()
        ),
    )
    .unwrap();
    cfg
}

fn manifest(dir: &Path, name: &str, pin: &str) {
    std::fs::write(
        dir.join(format!("{name}.yaml")),
        format!(
            "apiVersion: egress-proxies.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: {name}\n\
             spec:\n  provider: {ENTRY}\n  image: {IMAGE}\n  proxy:\n    \
             allowedClientCidrs: [10.0.0.0/8]\n{pin}"
        ),
    )
    .unwrap();
}

/// GET `path` from `addr`; `None` while nothing answers.
async fn get(addr: std::net::SocketAddr, path: &str) -> Option<(u16, String)> {
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

async fn cli(args: Vec<String>) -> std::process::Output {
    tokio::task::spawn_blocking(move || {
        let mut cmd = Command::new(BIN);
        cmd.args(&args).env_remove("EGRESS_PROXIES_CONFIG");
        output_within(&mut cmd, DEADLINE)
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_status_and_metrics_show_each_hosts_pool_and_each_proxys_addresses() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("h1.sock");
    let fake = FakeLibvirt::new();
    fake.add_pool(PoolSpec::new(POOL).capacity(100 * GIB))
        .unwrap();
    fake.add_network(NetworkSpec::new("default")).unwrap();
    publish_base(&fake, ENTRY, IMAGE, &digest());
    fake.listen_unix(&sock).await.unwrap();
    let cfg = config(dir.path(), &sock);
    let cfg_s = cfg.display().to_string();

    // check: the pool's size per family, nothing held yet.
    let out = cli(vec![
        "check".into(),
        "--config".into(),
        cfg_s.clone(),
        "-o".into(),
        "json".into(),
    ])
    .await;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        rows[0]["addresses"],
        serde_json::json!([
            {"family": "IPv4", "size": 2, "held": 0, "free": 2},
            {"family": "IPv6", "size": 2, "held": 0, "free": 2}
        ]),
        "{text}"
    );
    let out = cli(vec!["check".into(), "--config".into(), cfg_s.clone()]).await;
    let human = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        human.contains("ADDRESSES") && human.contains("IPv4 0/2 held, IPv6 0/2 held"),
        "{human}"
    );

    // standalone: one Proxy pins an address of each family, the other gets the rest. The pins
    // are each range's lowest address, the one a fresh allocation would take first: pinned
    // addresses are reserved, so the unpinned Proxy never takes them, whichever is created
    // first (its manifest sorts first, "a-pooled").
    let proxies = dir.path().join("proxies");
    std::fs::create_dir(&proxies).unwrap();
    manifest(
        &proxies,
        "pinned",
        "  egress:\n    address: [192.0.2.2, \"2001:db8:5::10\"]\n",
    );
    manifest(&proxies, "a-pooled", "");
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let child = Command::new(BIN)
        .args([
            "standalone",
            "--config",
            &cfg_s,
            "--proxies",
            &proxies.display().to_string(),
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--check-interval",
            "1s",
        ])
        .env_remove("EGRESS_PROXIES_CONFIG")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut op = Process(child);
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let t0 = Instant::now();
    let doc = loop {
        assert!(op.0.try_wait().unwrap().is_none(), "standalone exited");
        if let Some((200, body)) = get(addr, "/status").await
            && let Ok(d) = serde_json::from_str::<serde_json::Value>(&body)
        {
            let running = d["proxies"].as_array().is_some_and(|ps| {
                ps.len() == 2
                    && ps.iter().all(|p| {
                        p["phase"] == "Running"
                            && p["egressAddress"].as_array().is_some_and(|a| a.len() == 2)
                    })
            });
            if running {
                break d;
            }
            assert!(t0.elapsed() < DEADLINE, "not running in time: {d:#}");
        }
        assert!(t0.elapsed() < DEADLINE, "no /status in time");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let by = |name: &str| {
        doc["proxies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap()
            .clone()
    };
    assert_eq!(
        by("pinned")["egressAddress"],
        serde_json::json!(["192.0.2.2", "2001:db8:5::10"]),
        "{doc:#}"
    );
    assert_eq!(
        by("a-pooled")["egressAddress"],
        serde_json::json!(["192.0.2.3", "2001:db8:5::11"]),
        "{doc:#}"
    );
    assert_eq!(
        by("pinned")["ip"],
        "192.0.2.2",
        "the declared IPv4 address is the proxy's"
    );

    // /metrics: the pool's usage per family once a host check has seen both held.
    let t0 = Instant::now();
    loop {
        let (_, m) = get(addr, "/metrics").await.unwrap_or_default();
        let want = ["IPv4", "IPv6"].map(|f| {
            [
                format!(
                    "egress_proxies_host_egress_addresses{{entry=\"{ENTRY}\",host=\"h1\",family=\"{f}\",state=\"allocated\"}} 2"
                ),
                format!(
                    "egress_proxies_host_egress_addresses{{entry=\"{ENTRY}\",host=\"h1\",family=\"{f}\",state=\"free\"}} 0"
                ),
            ]
        });
        if want.iter().flatten().all(|w| m.contains(w.as_str())) {
            break;
        }
        assert!(t0.elapsed() < DEADLINE, "pool usage not in /metrics: {m}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // `egress-proxies status`: the declared addresses next to the observed egress.
    let out = cli(vec![
        "status".into(),
        "--server".into(),
        format!("http://127.0.0.1:{port}"),
    ])
    .await;
    let table = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(table.contains("EGRESS ADDRESS"), "{table}");
    assert!(table.contains("192.0.2.2,2001:db8:5::10"), "{table}");
    assert!(table.contains("192.0.2.3,2001:db8:5::11"), "{table}");
    drop(op);
}
