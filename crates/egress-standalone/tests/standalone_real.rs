//! Standalone mode against the REAL libvirtd through a real sshd: a config written by the
//! test (its own temp pool, the sshd's address, key and known_hosts), a tiny qcow2 base
//! served on 127.0.0.1 with its sha256 pinned, one manifest → a TCG domain; `/status` shows
//! it; removing the manifest leaves nothing (checked with virsh). No guest boots (the image
//! is blank), so Provisioning is the expected phase. Resources are uniquely named, printed
//! first, and removed on every path by Drop guards.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

#[path = "../../egress-provider/tests/image_support/mod.rs"]
mod image_support;

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use egress_core::model::Phase;
use egress_provider::libvirt::names;
use egress_standalone::manifests::uid_for;
use egress_standalone::{StandaloneOptions, run};
use egress_web::status::StatusDocument;
use ep_test_support::cleanup::{self, DomainGuard, PoolFixture};
use ep_test_support::sshd::Sshd;
use image_support::{ImageServer, Route, sha};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

/// Bound on every wait: a TCG domain is defined and started within seconds here.
const WAIT: Duration = Duration::from_secs(120);

/// A real qcow2 image of `size` virtual bytes (sparse: a few hundred KiB).
fn qcow2_image(size: &str, dir: &std::path::Path) -> Vec<u8> {
    let path = dir.join("tiny.qcow2");
    let out = Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&path)
        .arg(size)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read(&path).unwrap()
}

async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = String::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut buf))
        .await
        .unwrap()
        .unwrap();
    ep_test_support::http::response(&buf).unwrap_or_else(|| panic!("not a whole response: {buf}"))
}

/// Polls `/status` (the endpoint may not be up yet) until `ok` holds.
async fn wait_status(addr: SocketAddr, what: &str, ok: impl Fn(&StatusDocument) -> bool) {
    let t0 = Instant::now();
    let mut last = None;
    loop {
        if let Ok(s) = tokio::net::TcpStream::connect(addr).await {
            drop(s);
            let (code, body) = get(addr, "/status").await;
            if code == 200 {
                let d: StatusDocument = serde_json::from_str(&body).unwrap();
                if ok(&d) {
                    return;
                }
                last = Some(d);
            }
        }
        assert!(
            t0.elapsed() < WAIT,
            "timed out waiting for {what}: {last:#?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn domain_exists(name: &str) -> bool {
    cleanup::domain_names().iter().any(|d| d == name)
}

/// Volume names of `pool` (`virsh vol-list` has no `--name`: the first column of each row;
/// header rows, if virsh prints them, are skipped).
fn volumes(pool: &str) -> Vec<String> {
    cleanup::names_from(&["vol-list", pool])
        .into_iter()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .filter(|n| n != "Name" && !n.starts_with("---"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_becomes_a_real_tcg_domain_shown_on_status_and_removing_it_leaves_nothing() {
    cleanup::sweep_once();
    let entry = format!("eptest{:x}", cleanup::random_u32());
    let uid = uid_for("default", "eptest-real");
    let domain = names::domain(&entry, &uid);
    println!("eptest: may create domain {domain}");
    let _domain = DomainGuard {
        name: domain.clone(),
    };
    let pool = PoolFixture::create("standalone");
    println!("eptest: pool {} at {}", pool.name, pool.dir.display());
    let sshd = Sshd::start();
    let server = ImageServer::start().await;
    let work = tempfile::Builder::new()
        .prefix("eptest-standalone-")
        .tempdir()
        .unwrap();
    let image = qcow2_image("1G", work.path());
    let url = server.route("/tiny.qcow2", Route::new(image.clone()));
    let proxies = work.path().join("proxies");
    std::fs::create_dir(&proxies).unwrap();
    let config = work.path().join("providers.yaml");
    std::fs::write(
        &config,
        format!(
            "providers:\n  - name: {entry}\n    type: libvirt\n    hosts:\n      - name: h1\n        \
             address: 127.0.0.1:{port}\n        user: root\n        pool: {pool}\n        \
             virtType: qemu\n        poolReserveGiB: 0\n        sshKeyFile: {key}\n        \
             knownHostsFile: {kh}\n        maxConcurrent: 2\n    images:\n      tiny:\n        \
             url: {url}\n        sha256: {sha}\n        format: qcow2\n    maxImageBytes: {max}\n    \
             defaults:\n      diskGiB: 2\n      memoryMiB: 128\n      vcpus: 1\n",
            port = sshd.port,
            pool = pool.name,
            key = sshd.client_key_path.display(),
            kh = sshd.known_hosts_path.display(),
            sha = sha(&image),
            max = 1u64 << 30,
        ),
    )
    .unwrap();
    let manifest = proxies.join("p.yaml");
    std::fs::write(
        &manifest,
        format!(
            "apiVersion: egress-proxies.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: eptest-real\n\
             spec:\n  provider: {entry}\n  image: tiny\n  proxy:\n    allowedClientCidrs: [127.0.0.1/32]\n"
        ),
    )
    .unwrap();

    // A free loopback port for the endpoint.
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let mut opts = StandaloneOptions::new(&proxies);
    opts.config_path = Some(config);
    opts.listen = addr;
    opts.check_interval = Duration::from_secs(2);
    opts.shutdown_grace = Duration::from_secs(10);
    opts.controller.poll_provisioning = Duration::from_secs(1);
    let stop = CancellationToken::new();
    let task = tokio::spawn(run(opts, stop.clone()));

    wait_status(addr, "the proxy created on h1", |d| {
        d.proxies.iter().any(|p| {
            p.name == "eptest-real"
                && matches!(p.phase, Phase::Provisioning | Phase::Running)
                && p.provider_id.as_deref() == Some(&format!("libvirt://{entry}/h1/{domain}"))
        })
    })
    .await;
    assert!(domain_exists(&domain), "virsh does not list {domain}");
    let vols = volumes(&pool.name);
    assert!(
        vols.contains(&names::overlay(&entry, &uid)) && vols.contains(&names::seed(&entry, &uid)),
        "{vols:?}"
    );
    wait_status(addr, "host h1 Ready", |d| {
        d.hosts.iter().any(|h| h.host == "h1" && h.state == "Ready")
    })
    .await;
    assert_eq!(get(addr, "/readyz").await.0, 200);

    std::fs::remove_file(&manifest).unwrap();
    wait_status(addr, "the proxy forgotten", |d| d.proxies.is_empty()).await;
    assert!(!domain_exists(&domain), "{domain} is still defined");
    let left: Vec<String> = volumes(&pool.name)
        .into_iter()
        .filter(|v| !v.starts_with(&names::base_prefix(&entry)))
        .collect();
    assert!(left.is_empty(), "instance volumes left: {left:?}");

    stop.cancel();
    tokio::time::timeout(WAIT, task)
        .await
        .expect("standalone stops")
        .unwrap()
        .unwrap();
}
