//! `rotation.egressAddress: Keep` on the real hypervisor: the `egress-proxies` binary in
//! standalone mode, a host whose `addressPool` holds two IPv4 addresses of an isolated libvirt
//! network without DHCP, the real Debian guest image. A ProxyPool of one member comes up on
//! the first address; a request through it reaches the echo server from that address. The
//! test then changes the pool's template → the member is deleted first (no surge under
//! `Keep`), its address waits in `status.pendingAddresses`, and its replacement boots pinned to
//! **the same address** and egresses from it. The second address is never handed out: with
//! `Fresh` the replacement would take it (fresh addresses go before released ones), so the test
//! tells `Keep` from `Fresh`. Every phase is timed (`eptest: timing:`).
//!
//! Network isolation and resources: as the other real-guest tests (the shared harness,
//! `ep_test_support::real_guest`): the test re-runs itself inside libvirtd's network
//! namespace; guards remove the operator, the echo process, the entry's domains, the pool, the
//! network and the temporary directory on every exit path.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use ep_test_support::cleanup;
use ep_test_support::e2e::{EchoProcess, ImageHost, StaticNet, echo_server};
use ep_test_support::real_guest::{
    self as real_guest, EntryFixture, RealGuest, StandaloneOperator, egress_through, pool_members,
    pool_status, wait_for_pool,
};
use ep_test_support::sshd::Sshd;

/// The whole test.
// NB: two TCG guests booting one after the other take ~3–8 min here; 30 min is far above.
const TEST_BUDGET: Duration = Duration::from_secs(30 * 60);
/// From the manifest (or the template change) to a healthy member.
// NB: a TCG boot and cloud-init's final stage took up to ~285 s beside other suites' guests.
const BOOT_BUDGET: Duration = Duration::from_secs(12 * 60);
const PROXY_PORT: u16 = 3128;
const IMAGE_KEY: &str = "debian-12-ep";
const IMAGE_PATH: &str = "/debian-12-ep.qcow2";
/// The pool's two addresses (host parts of the test's /24).
const POOL_FIRST: u8 = 70;
const POOL_LAST: u8 = 71;
const PNAME: &str = "ekp";

fn test_name() -> &'static str {
    "under_keep_the_replacement_of_a_rotated_real_member_egresses_from_the_same_declared_address"
}

/// The pool's manifest; `client` is the extra client CIDR whose change makes a new template.
fn manifest(entry: &str, gateway: Ipv4Addr, client: &str) -> String {
    format!(
        "apiVersion: egress-proxies.dev/v1alpha1\nkind: ProxyPool\nmetadata:\n  name: {PNAME}\n\
         spec:\n  replicas: 1\n  template:\n    spec:\n      provider: {entry}\n      \
         image: {IMAGE_KEY}\n      proxy:\n        port: {PROXY_PORT}\n        protocol: http\n        \
         allowedClientCidrs: [{gateway}/32, {client}]\n  update:\n    maxSurge: 0\n    \
         maxUnavailable: 1\n  rotation:\n    egressAddress: Keep\n"
    )
}

fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[test]
fn under_keep_the_replacement_of_a_rotated_real_member_egresses_from_the_same_declared_address() {
    real_guest::run(test_name(), TEST_BUDGET, inside_the_namespace);
}

async fn inside_the_namespace(rg: RealGuest) {
    let t_all = Instant::now();
    let RealGuest { bin, image } = rg;
    let fixture = EntryFixture::create("ekp");
    let (entry, pool) = (fixture.entry.clone(), &fixture.pool);
    let net = StaticNet::create("ekp");
    let gateway = net.ip(1);
    let (echo, _seen) = echo_server(gateway).await;
    println!("eptest: echo server on {echo}");
    let work = tempfile::Builder::new()
        .prefix(&cleanup::unique_name("dir", "ekp"))
        .tempdir()
        .unwrap();
    let health_echo = EchoProcess::start(&bin, gateway, &work.path().join("echo.log"));
    let sshd = Sshd::start();
    let server = ImageHost::start(std::fs::read(&image.path).unwrap(), IMAGE_PATH, 0).await;
    server.unthrottle();

    let proxies = work.path().join("proxies");
    std::fs::create_dir(&proxies).unwrap();
    let config = work.path().join("providers.yaml");
    let (first, last) = (net.ip(POOL_FIRST), net.ip(POOL_LAST));
    let [a, b, c, _] = net.ip(0).octets();
    std::fs::write(
        &config,
        format!(
            "providers:\n  - name: {entry}\n    type: libvirt\n    hosts:\n      - name: h1\n        \
             address: 127.0.0.1:{port}\n        user: root\n        pool: {pool}\n        \
             network: {netname}\n        virtType: qemu\n        poolReserveGiB: 0\n        \
             sshKeyFile: {key}\n        knownHostsFile: {kh}\n        maxConcurrent: 2\n        \
             addressPool:\n          ipv4:\n            prefix: {a}.{b}.{c}.0/24\n            \
             gateway: {gateway}\n            ranges: [{first}-{last}]\n          dns: [{gateway}]\n    \
             images:\n      {IMAGE_KEY}:\n        url: {url}\n        sha256: {sha}\n        \
             format: qcow2\n        firmware: uefi\n    \
             policy:\n      allowedInternalCidrs: [{gateway}/32]\n    \
             defaults:\n      diskGiB: 4\n      memoryMiB: 512\n      vcpus: 1\n",
            port = sshd.port,
            pool = pool.name,
            netname = net.name,
            key = sshd.client_key_path.display(),
            kh = sshd.known_hosts_path.display(),
            url = server.url,
            sha = image.sha256,
        ),
    )
    .unwrap();
    let pool_file = proxies.join("pool.yaml");
    write_atomically(&pool_file, &manifest(&entry, gateway, "127.0.0.1/32"));

    let listen = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let flags = [
        "--health-target".to_owned(),
        format!("http://{}/", health_echo.addr),
        "--health-interval".to_owned(),
        "3s".to_owned(),
    ];
    let t_start = Instant::now();
    let op = StandaloneOperator::start(
        &bin,
        &config,
        &proxies,
        listen,
        &flags,
        work.path().join("operator.log"),
    );

    // The first member: healthy, on the first address (fresh addresses go in ascending order).
    let m1 = wait_for_pool(
        "the first member healthy",
        &op,
        listen,
        PNAME,
        BOOT_BUDGET,
        |d| {
            let ms = pool_members(d, PNAME);
            let m = ms.first()?;
            (ms.len() == 1 && m["health"]["healthy"] == true).then(|| m.clone())
        },
    )
    .await;
    let m1_name = m1["name"].as_str().unwrap().to_owned();
    println!(
        "eptest: timing: manifest → {m1_name} healthy {:.1} s",
        t_start.elapsed().as_secs_f64()
    );
    assert_eq!(
        m1["egressAddress"],
        serde_json::json!([first.to_string()]),
        "{m1:#}"
    );
    assert_eq!(m1["health"]["egressIp"], first.to_string(), "{m1:#}");
    let saw = egress_through((first, PROXY_PORT), gateway, echo, BOOT_BUDGET).await;
    assert_eq!(saw, first.to_string(), "the echo saw another egress");

    // A new template: the member goes first, its address waits, the replacement takes it.
    let t_rotate = Instant::now();
    write_atomically(&pool_file, &manifest(&entry, gateway, "127.0.0.2/32"));
    let mut saw_pending = false;
    let m2 = wait_for_pool(
        "the replacement healthy on the kept address",
        &op,
        listen,
        PNAME,
        BOOT_BUDGET,
        |d| {
            let ms = pool_members(d, PNAME);
            for m in &ms {
                assert_ne!(
                    m["egressAddress"],
                    serde_json::json!([last.to_string()]),
                    "a member took the second address: Keep did not keep {first}: {m:#}"
                );
            }
            let pending = pool_status(d, PNAME)["pendingAddresses"].clone();
            if pending.as_array().is_some_and(|p| !p.is_empty()) {
                assert_eq!(pending[0]["member"], m1_name.as_str(), "{pending:#}");
                assert_eq!(
                    pending[0]["addresses"],
                    serde_json::json!([first.to_string()]),
                    "{pending:#}"
                );
                saw_pending = true;
            }
            (ms.len() == 1
                && ms[0]["name"] != m1_name.as_str()
                && ms[0]["health"]["healthy"] == true)
                .then(|| ms[0].clone())
        },
    )
    .await;
    println!(
        "eptest: timing: template change → replacement {} healthy {:.1} s",
        m2["name"],
        t_rotate.elapsed().as_secs_f64()
    );
    // NB: only printed: the entry lives while the old VM is being deleted (seconds), which a
    // 2 s poll may miss; what it leads to is asserted below.
    println!("eptest: status.pendingAddresses seen during the rotation: {saw_pending}");
    assert_eq!(
        m2["egressAddress"],
        serde_json::json!([first.to_string()]),
        "{m2:#}"
    );
    assert_eq!(m2["health"]["egressIp"], first.to_string(), "{m2:#}");
    let saw = egress_through((first, PROXY_PORT), gateway, echo, BOOT_BUDGET).await;
    assert_eq!(saw, first.to_string(), "the echo saw another egress");
    drop(op);
    println!(
        "eptest: timing: whole test {:.1} s",
        t_all.elapsed().as_secs_f64()
    );
}
