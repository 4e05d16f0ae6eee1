//! Address reputation end to end on the real hypervisor: the `egress-proxies` binary in
//! standalone mode, a host whose `addressPool` holds two IPv4 addresses of an isolated libvirt
//! network without DHCP, the real Debian guest image, and a real DNS server (nsd) serving the
//! blocklist zone the config's `reputation:` section names. A ProxyPool of one member with
//! `reputation.onListed: Replace` and `maxUnavailable: 0` comes up; a request through it
//! reaches the echo server from its address and the health check observes that egress; the
//! test then lists **the observed egress address** in the zone → the next check round reports
//! the listing in the member's status → the pool boots a replacement at the other address,
//! which egresses from it, and only then deletes the listed member (the pool never has fewer
//! than one available member) → the listed address is retired in the pool's status, and
//! `egress-proxies addresses` shows it retired. Every phase is timed (`eptest: timing:`).
//!
//! Network isolation: as the other real-guest tests, the test re-executes itself inside the
//! network namespace libvirtd runs in (`.ci/setup-host`), so the isolated network's bridge,
//! the guests' taps, sshd, the image server, the echo servers, nsd, the operator and the HTTP
//! client all live there.
//!
//! Resources (finding M19): every name is printed before it exists; guards remove the
//! operator, the echo process, nsd, the entry's domains, the pool, the network and the temp
//! directory on every exit path; a sweep at the start removes this suite's leftovers by prefix.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::net::Ipv4Addr;
use std::process::Command;
use std::time::{Duration, Instant};

use ep_test_support::cleanup::{self};
use ep_test_support::e2e::{EchoProcess, ImageHost, StaticNet, echo_server};
use ep_test_support::nsd::{Nsd, TestZone};
use ep_test_support::real_guest::{
    self as real_guest, EntryFixture, RealGuest, StandaloneOperator, egress_through, pool_members,
    pool_status, status_json, wait_for_pool,
};
use ep_test_support::sshd::Sshd;

/// The whole test.
// NB: two TCG guests booting one after the other take ~3–8 min here; 30 min is far above.
const TEST_BUDGET: Duration = Duration::from_secs(30 * 60);
/// From the manifest to the member healthy, and from the listing to the replacement healthy.
// NB: a TCG boot and cloud-init's final stage took up to ~285 s beside other suites' guests.
const BOOT_BUDGET: Duration = Duration::from_secs(12 * 60);
/// From the listing in the zone to the listing in the member's status: one check round
/// (`interval: 1m`) and a publishing pass.
const LISTING_BUDGET: Duration = Duration::from_secs(3 * 60);
const PROXY_PORT: u16 = 3128;
const IMAGE_KEY: &str = "debian-12-ep";
const IMAGE_PATH: &str = "/debian-12-ep.qcow2";
/// The pool's two addresses (host parts of the test's /24).
const POOL_FIRST: u8 = 60;
const POOL_LAST: u8 = 61;
const ZONE: &str = "bl.test";
const PNAME: &str = "erp";

fn test_name() -> &'static str {
    "the_observed_egress_of_a_real_guest_listed_in_a_blocklist_is_replaced_and_retired"
}

#[test]
fn the_observed_egress_of_a_real_guest_listed_in_a_blocklist_is_replaced_and_retired() {
    real_guest::run(test_name(), TEST_BUDGET, inside_the_namespace);
}

async fn inside_the_namespace(rg: RealGuest) {
    let t_all = Instant::now();
    let RealGuest { bin, image } = rg;
    let fixture = EntryFixture::create("erp");
    let (entry, pool) = (fixture.entry.clone(), &fixture.pool);
    let net = StaticNet::create("erp");
    let gateway = net.ip(1);
    let (echo, _seen) = echo_server(gateway).await;
    println!("eptest: echo server on {echo}");
    let work = tempfile::Builder::new()
        .prefix(&cleanup::unique_name("dir", "erp"))
        .tempdir()
        .unwrap();
    let health_echo = EchoProcess::start(&bin, gateway, &work.path().join("echo.log"));
    let sshd = Sshd::start();
    let server = ImageHost::start(std::fs::read(&image.path).unwrap(), IMAGE_PATH, 0).await;
    server.unthrottle();
    // The blocklist zone, empty at first (in this namespace: we run inside it).
    let mut nsd = tokio::task::spawn_blocking(|| Nsd::start(None, &[TestZone::new(ZONE)]))
        .await
        .unwrap();
    println!("eptest: nsd on {}", nsd.addr());

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
             defaults:\n      diskGiB: 4\n      memoryMiB: 512\n      vcpus: 1\n\
             reputation:\n  resolvers: ['{resolver}']\n  interval: 1m\n  timeout: 2s\n  \
             retireFor: 1h\n  zones:\n    - name: {ZONE}\n      codes:\n        \
             - {{answer: 127.0.0.2, means: listed, label: SBL}}\n",
            port = sshd.port,
            pool = pool.name,
            netname = net.name,
            key = sshd.client_key_path.display(),
            kh = sshd.known_hosts_path.display(),
            url = server.url,
            sha = image.sha256,
            resolver = nsd.addr(),
        ),
    )
    .unwrap();
    std::fs::write(
        proxies.join("pool.yaml"),
        format!(
            "apiVersion: egress-proxies.dev/v1alpha1\nkind: ProxyPool\nmetadata:\n  name: {PNAME}\n\
             spec:\n  replicas: 1\n  template:\n    spec:\n      provider: {entry}\n      \
             image: {IMAGE_KEY}\n      proxy:\n        port: {PROXY_PORT}\n        protocol: http\n        \
             allowedClientCidrs: [{gateway}/32]\n  update:\n    maxSurge: 1\n    maxUnavailable: 0\n  \
             reputation:\n    onListed: Replace\n"
        ),
    )
    .unwrap();

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

    // The member: healthy, its egress observed by the health check, checked and not listed.
    let (m1, observed) = wait_for_pool(
        "the first member healthy",
        &op,
        listen,
        PNAME,
        BOOT_BUDGET,
        |d| {
            let ms = pool_members(d, PNAME);
            let m = ms.first()?;
            let observed: Ipv4Addr = m["health"]["egressIp"].as_str()?.parse().ok()?;
            (ms.len() == 1
                && m["health"]["healthy"] == true
                && m["conditions"]
                    .as_array()?
                    .iter()
                    .any(|c| c["type"] == "Listed" && c["status"] == "False"))
            .then(|| (m["name"].as_str().unwrap_or_default().to_owned(), observed))
        },
    )
    .await;
    println!(
        "eptest: timing: manifest → {m1} healthy, egress {observed} observed, not listed {:.1} s",
        t_start.elapsed().as_secs_f64()
    );
    assert!(
        [first, last].contains(&observed),
        "{observed} is not from the pool"
    );
    let saw = egress_through((observed, PROXY_PORT), gateway, echo, BOOT_BUDGET).await;
    assert_eq!(saw, observed.to_string(), "the echo saw another egress");

    // List the observed egress address.
    let t_listed = Instant::now();
    nsd.serve(&[TestZone::new(ZONE).list(observed.into(), Ipv4Addr::new(127, 0, 0, 2))]);
    wait_for_pool(
        "the listing in the member's status",
        &op,
        listen,
        PNAME,
        LISTING_BUDGET,
        |d| {
            let ms = pool_members(d, PNAME);
            ms.iter()
                .find(|m| m["name"] == m1.as_str())
                .filter(|m| {
                    m["reputation"]["listed"][0]["address"] == observed.to_string()
                        && m["reputation"]["listed"][0]["zone"] == ZONE
                })
                .map(|_| ())
        },
    )
    .await;
    println!(
        "eptest: timing: listed in the zone → the listing in status {:.1} s",
        t_listed.elapsed().as_secs_f64()
    );

    // Replaced: a new member at the other address, healthy, before the listed one goes; the
    // pool never has no available member meanwhile.
    let t_replace = Instant::now();
    let other = if observed == first { last } else { first };
    let m2 = wait_for_pool(
        "the listed member replaced",
        &op,
        listen,
        PNAME,
        BOOT_BUDGET,
        |d| {
            let available = pool_status(d, PNAME)["availableReplicas"]
                .as_u64()
                .unwrap_or(0);
            assert!(
                available >= 1,
                "the pool dropped below its budget: {:#}",
                pool_status(d, PNAME)
            );
            let ms = pool_members(d, PNAME);
            (ms.len() == 1 && ms[0]["name"] != m1.as_str() && ms[0]["health"]["healthy"] == true)
                .then(|| ms[0].clone())
        },
    )
    .await;
    println!(
        "eptest: timing: listing → replacement healthy, listed member deleted {:.1} s",
        t_replace.elapsed().as_secs_f64()
    );
    assert_eq!(
        m2["egressAddress"],
        serde_json::json!([other.to_string()]),
        "{m2:#}"
    );
    assert_eq!(m2["health"]["egressIp"], other.to_string(), "{m2:#}");
    let saw = egress_through((other, PROXY_PORT), gateway, echo, BOOT_BUDGET).await;
    assert_eq!(saw, other.to_string(), "the echo saw another egress");

    // Retired: in the pool's status, and as `egress-proxies addresses` lists it.
    let doc = status_json(listen).await.unwrap();
    let retired = pool_status(&doc, PNAME)["retiredAddresses"].clone();
    assert_eq!(retired[0]["address"], observed.to_string(), "{retired:#}");
    assert_eq!(retired[0]["member"], m1.as_str(), "{retired:#}");
    let out = Command::new(&bin)
        .args(["addresses", "--server", &format!("http://{listen}")])
        .env_remove("EGRESS_PROXIES_SERVER")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    println!("eptest: egress-proxies addresses:\n{text}");
    assert!(
        text.lines().any(|l| l.starts_with(&format!("{observed} "))
            && l.contains("retired")
            && l.contains(ZONE)),
        "{text}"
    );
    drop(op);
    drop(nsd);
    println!(
        "eptest: timing: whole test {:.1} s",
        t_all.elapsed().as_secs_f64()
    );
}
