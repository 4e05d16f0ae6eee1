//! Declared egress addresses end to end on the real hypervisor: the `egress-proxies` binary in
//! standalone mode, a host whose `addressPool` holds two IPv4 and two IPv6 addresses of an
//! isolated libvirt network that has **no DHCP** (and no router advertisements), and the real
//! Debian guest image. Two dual-stack Proxies come up at their allocated static addresses
//! (configured by the seed's cloud-init network-config, matched by MAC); a request through each
//! reaches the echo servers from its own declared addresses, IPv4 and IPv6; the health check
//! probes each family and sees the declared address; the
//! operator restarts and both keep their allocations (the marks on the host are the record);
//! a third Proxy finds the pool exhausted: its status names the exhaustion and nothing is
//! defined for it on the host. Every phase is timed (`eptest: timing:` lines).
//!
//! Network isolation: as the other real-guest tests, the test re-executes itself inside the
//! network namespace libvirtd runs in (`.ci/setup-host`), so the isolated network's bridge,
//! the guests' taps, sshd, the image server, the echo servers, the operator and the HTTP
//! client all live there (the /24 is in the 198.18.0.0/15 benchmark range).
//!
//! Resources (finding M19): every name is printed before it exists; guards remove the
//! operators, the echo process, the entry's domains, the pool, the network and the temp
//! directory on every exit path; a sweep at the start removes this suite's leftovers by prefix.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use egress_provider::libvirt::{mark, names};
use egress_standalone::manifests::uid_for;
use ep_test_support::cleanup::{self};
use ep_test_support::e2e::{EchoProcess, ImageHost, StaticNet, echo_server, run_ok, volumes};
use ep_test_support::real_guest::{
    self as real_guest, EntryFixture, RealGuest, StandaloneOperator, egress_through, status_json,
};
use ep_test_support::sshd::Sshd;

/// The whole test.
// NB: two TCG guests booting at once take ~2–4 min here; 30 min is far above and inside CI's.
const TEST_BUDGET: Duration = Duration::from_secs(30 * 60);
/// From manifests to both proxies Running at their declared addresses.
const BOOT_BUDGET: Duration = Duration::from_secs(15 * 60);
/// From Running to tinyproxy answering through the declared address, and to Healthy.
// NB: cloud-init's final stage starts tinyproxy ~10–40 s after boot under TCG on a quiet
// machine; two guests booting beside other suites' guests (load 7–8) took 285 s here.
const PROXY_BUDGET: Duration = Duration::from_secs(10 * 60);
/// From the restarted operator's start to both proxies Running again.
const RESTART_BUDGET: Duration = Duration::from_secs(3 * 60);
/// From the third manifest to its exhaustion showing in its status.
const EXHAUST_BUDGET: Duration = Duration::from_secs(3 * 60);
const POLL: Duration = Duration::from_secs(2);
const PROXY_PORT: u16 = 3128;
const IMAGE_KEY: &str = "debian-12-ep";
const IMAGE_PATH: &str = "/debian-12-ep.qcow2";
/// The pool's two addresses (host parts of the test's /24).
const POOL_FIRST: u8 = 50;
const POOL_LAST: u8 = 51;

fn test_name() -> &'static str {
    "two_proxies_egress_from_their_declared_static_addresses_keep_them_across_a_restart_and_a_third_finds_the_pool_exhausted"
}

fn proxy_row(doc: &serde_json::Value, name: &str) -> Option<serde_json::Value> {
    doc["proxies"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == name)
        .cloned()
}

/// The addresses `domain`'s mark records.
fn mark_addresses(domain: &str, entry: &str) -> Vec<IpAddr> {
    let xml = run_ok(Command::new("virsh").args(["metadata", domain, "--uri", mark::NAMESPACE]));
    mark::parse(&xml, entry, SystemTime::now())
        .unwrap_or_else(|| panic!("{domain}'s mark does not parse: {xml}"))
        .addresses
}

/// Polls the status until every proxy of `names` is Running with an IP; their IPs in order.
async fn wait_running(
    listen: SocketAddr,
    names: &[&str],
    budget: Duration,
    op: &StandaloneOperator,
) -> Vec<Ipv4Addr> {
    let t0 = Instant::now();
    loop {
        let doc = status_json(listen).await;
        let rows: Vec<Option<serde_json::Value>> = names
            .iter()
            .map(|n| doc.as_ref().and_then(|d| proxy_row(d, n)))
            .collect();
        let ips: Vec<Option<Ipv4Addr>> = rows
            .iter()
            .map(|r| {
                r.as_ref()
                    .filter(|r| r["phase"] == "Running")
                    .and_then(|r| r["ip"].as_str())
                    .and_then(|s| s.parse().ok())
            })
            .collect();
        if ips.iter().all(Option::is_some) {
            return ips.into_iter().flatten().collect();
        }
        for r in rows.iter().flatten() {
            assert!(
                r["phase"] != "Failed",
                "a proxy failed: {r:#}\n{}",
                op.log_tail()
            );
        }
        assert!(
            t0.elapsed() < budget,
            "not all Running with an IP within {budget:?}: {rows:#?}\n{}",
            op.log_tail()
        );
        tokio::time::sleep(POLL).await;
    }
}

#[test]
fn two_proxies_egress_from_their_declared_static_addresses_keep_them_across_a_restart_and_a_third_finds_the_pool_exhausted()
 {
    real_guest::run(test_name(), TEST_BUDGET, inside_the_namespace);
}

async fn inside_the_namespace(rg: RealGuest) {
    let t_all = Instant::now();
    let RealGuest { bin, image } = rg;
    let fixture = EntryFixture::create("eap");
    let (entry, pool) = (fixture.entry.clone(), &fixture.pool);
    let net = StaticNet::create("eap");
    let gateway = net.ip(1);
    let gateway6 = net.ip6(1);
    let (echo, seen) = echo_server(gateway).await;
    let (echo6, seen6) = echo_server(gateway6).await;
    println!("eptest: echo servers on {echo} and {echo6}");
    let work = tempfile::Builder::new()
        .prefix(&cleanup::unique_name("dir", "eap"))
        .tempdir()
        .unwrap();
    let health_echo = EchoProcess::start(&bin, gateway, &work.path().join("echo.log"));
    let health_echo6 = EchoProcess::start(&bin, gateway6, &work.path().join("echo6.log"));
    let sshd = Sshd::start();
    let server = ImageHost::start(std::fs::read(&image.path).unwrap(), IMAGE_PATH, 0).await;
    server.unthrottle();

    let proxies = work.path().join("proxies");
    std::fs::create_dir(&proxies).unwrap();
    let config = work.path().join("providers.yaml");
    let (first, last) = (net.ip(POOL_FIRST), net.ip(POOL_LAST));
    let (first6, last6) = (
        net.ip6(u16::from(POOL_FIRST)),
        net.ip6(u16::from(POOL_LAST)),
    );
    let [a, b, c, _] = net.ip(0).octets();
    let prefix6 = format!("{}/64", net.ip6(0));
    std::fs::write(
        &config,
        format!(
            "providers:\n  - name: {entry}\n    type: libvirt\n    hosts:\n      - name: h1\n        \
             address: 127.0.0.1:{port}\n        user: root\n        pool: {pool}\n        \
             network: {netname}\n        virtType: qemu\n        poolReserveGiB: 0\n        \
             sshKeyFile: {key}\n        knownHostsFile: {kh}\n        maxConcurrent: 2\n        \
             addressPool:\n          ipv4:\n            prefix: {a}.{b}.{c}.0/24\n            \
             gateway: {gateway}\n            ranges: [{first}-{last}]\n          ipv6:\n            \
             prefix: \"{prefix6}\"\n            gateway: \"{gateway6}\"\n            \
             ranges: [\"{first6}-{last6}\"]\n          dns: [{gateway}]\n    \
             images:\n      {IMAGE_KEY}:\n        url: {url}\n        sha256: {sha}\n        \
             format: qcow2\n        firmware: uefi\n    \
             policy:\n      allowedInternalCidrs: [{gateway}/32, \"{gateway6}/128\"]\n    \
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
    let manifest = |name: &str| {
        let path = proxies.join(format!("{name}.yaml"));
        std::fs::write(
            &path,
            format!(
                "apiVersion: egress-proxies.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: {name}\n\
                 spec:\n  provider: {entry}\n  image: {IMAGE_KEY}\n  proxy:\n    port: {PROXY_PORT}\n    \
                 protocol: http\n    allowedClientCidrs: [{gateway}/32]\n"
            ),
        )
        .unwrap();
    };
    let names = ["eap-one", "eap-two"];
    let domains: Vec<String> = names
        .iter()
        .map(|n| names::domain(&entry, &uid_for("default", n)))
        .collect();
    println!("eptest: domains will be {domains:?}");
    for n in names {
        manifest(n);
    }

    let listen = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let flags = [
        "--health-target".to_owned(),
        format!("http://{}/", health_echo.addr),
        "--health-target-ipv6".to_owned(),
        format!("http://{}/", health_echo6.addr),
        "--health-interval".to_owned(),
        "3s".to_owned(),
    ];
    let t_start = Instant::now();
    let mut op = StandaloneOperator::start(
        &bin,
        &config,
        &proxies,
        listen,
        &flags,
        work.path().join("operator-1.log"),
    );
    let ips = wait_running(listen, &names, BOOT_BUDGET, &op).await;
    println!(
        "eptest: timing: manifests → both Running at {ips:?} {:.1} s",
        t_start.elapsed().as_secs_f64()
    );
    let pool_addrs = [first, last];
    assert_ne!(ips[0], ips[1], "two proxies, one address");
    // Each holds one address of each family, recorded in its mark (IPv4 first).
    let mut ips6: Vec<Ipv6Addr> = Vec::new();
    for (ip, d) in ips.iter().zip(&domains) {
        assert!(
            pool_addrs.contains(ip),
            "{ip} is not from the pool {first}-{last}"
        );
        let m = mark_addresses(d, &entry);
        let [IpAddr::V4(v4), IpAddr::V6(v6)] = m[..] else {
            panic!("{d}'s mark holds {m:?}, not one IPv4 and one IPv6 address");
        };
        assert_eq!(v4, *ip, "{d}'s mark");
        assert!([first6, last6].contains(&v6), "{v6} is not from the pool");
        ips6.push(v6);
    }
    assert_ne!(ips6[0], ips6[1], "two proxies, one IPv6 address");
    // The network has no DHCP: nobody leased anything.
    let leases = run_ok(Command::new("virsh").args(["net-dhcp-leases", &net.name]));
    assert!(
        !leases.contains("198."),
        "a lease on a network without DHCP: {leases}"
    );

    // A request through each reaches the echo from its own declared address.
    let t_proxy = Instant::now();
    for (ip, ip6) in ips.iter().zip(&ips6) {
        let saw = egress_through((*ip, PROXY_PORT), gateway, echo, PROXY_BUDGET).await;
        assert_eq!(
            saw,
            ip.to_string(),
            "the echo saw another egress through {ip}"
        );
        let saw = egress_through((*ip, PROXY_PORT), gateway, echo6, PROXY_BUDGET).await;
        assert_eq!(
            saw,
            ip6.to_string(),
            "the IPv6 echo saw another egress through {ip}"
        );
    }
    println!(
        "eptest: timing: Running → a request through each proxy from its declared address {:.1} s",
        t_proxy.elapsed().as_secs_f64()
    );
    let seen_now: Vec<String> = seen.lock().unwrap().clone();
    for ip in &ips {
        assert!(seen_now.contains(&ip.to_string()), "{seen_now:?}");
    }
    let seen6_now: Vec<String> = seen6.lock().unwrap().clone();
    for ip6 in &ips6 {
        assert!(seen6_now.contains(&ip6.to_string()), "{seen6_now:?}");
    }
    // The operator's health check (through each proxy, against the echo process) agrees.
    let t_health = Instant::now();
    loop {
        let doc = status_json(listen).await;
        let rows: Vec<_> = names
            .iter()
            .map(|n| doc.as_ref().and_then(|d| proxy_row(d, n)))
            .collect();
        let healthy = rows
            .iter()
            .all(|r| r.as_ref().is_some_and(|r| r["health"]["healthy"] == true));
        if healthy {
            for ((r, ip), ip6) in rows.iter().flatten().zip(&ips).zip(&ips6) {
                let both = serde_json::json!([ip.to_string(), ip6.to_string()]);
                // Declared, and seen by each family's probe.
                assert_eq!(r["egressAddress"], both, "{r:#}");
                assert_eq!(r["health"]["egressIps"], both, "{r:#}");
            }
            break;
        }
        assert!(
            t_health.elapsed() < PROXY_BUDGET,
            "not both Healthy from their declared addresses within {PROXY_BUDGET:?}: {rows:#?}\n{}",
            op.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "eptest: timing: both Healthy, each family's probe seeing the declared address {:.1} s",
        t_health.elapsed().as_secs_f64()
    );

    // The operator restarts; both keep their allocations (the host's marks are the record).
    assert!(
        op.stop(),
        "the operator did not stop cleanly:\n{}",
        op.log_tail()
    );
    drop(op);
    let t_restart = Instant::now();
    let op = StandaloneOperator::start(
        &bin,
        &config,
        &proxies,
        listen,
        &flags,
        work.path().join("operator-2.log"),
    );
    let again = wait_running(listen, &names, RESTART_BUDGET, &op).await;
    assert_eq!(again, ips, "the restarted operator moved an address");
    for ((ip, ip6), d) in ips.iter().zip(&ips6).zip(&domains) {
        assert_eq!(
            mark_addresses(d, &entry),
            vec![IpAddr::V4(*ip), IpAddr::V6(*ip6)]
        );
        let saw = egress_through((*ip, PROXY_PORT), gateway, echo, PROXY_BUDGET).await;
        assert_eq!(saw, ip.to_string());
        let saw = egress_through((*ip, PROXY_PORT), gateway, echo6, PROXY_BUDGET).await;
        assert_eq!(saw, ip6.to_string());
    }
    println!(
        "eptest: timing: restart → both Running at the same addresses, requests through each {:.1} s",
        t_restart.elapsed().as_secs_f64()
    );

    // A third Proxy: the pool is exhausted; its status says so and nothing is defined for it.
    let third = "eap-three";
    let uid3 = uid_for("default", third);
    let domain3 = names::domain(&entry, &uid3);
    println!("eptest: third proxy's domain would be {domain3}");
    let before = cleanup::domain_names();
    manifest(third);
    let t3 = Instant::now();
    let row = loop {
        let doc = status_json(listen).await;
        let row = doc.as_ref().and_then(|d| proxy_row(d, third));
        if let Some(r) = &row
            && r.to_string().contains("exhausted")
        {
            break r.clone();
        }
        assert!(
            t3.elapsed() < EXHAUST_BUDGET,
            "the third proxy's status never named the exhaustion: {row:#?}\n{}",
            op.log_tail()
        );
        tokio::time::sleep(POLL).await;
    };
    println!(
        "eptest: the third proxy's conditions: {}",
        row["conditions"]
    );
    let text = row.to_string();
    assert!(
        text.contains("h1") && text.contains("IPv4"),
        "names host and family: {row:#}"
    );
    assert!(row["ip"].is_null(), "{row:#}");
    assert!(
        !cleanup::domain_names().contains(&domain3),
        "a domain was defined for the third proxy"
    );
    assert_eq!(
        cleanup::domain_names().len(),
        before.len(),
        "something new on the host"
    );
    let vols = volumes(&pool.name);
    assert!(
        !vols.contains(&names::overlay(&entry, &uid3))
            && !vols.contains(&names::seed(&entry, &uid3)),
        "volumes were made for the third proxy: {vols:?}"
    );
    println!(
        "eptest: timing: third manifest → exhaustion in its status {:.1} s",
        t3.elapsed().as_secs_f64()
    );
    // The first two are untouched.
    assert_eq!(wait_running(listen, &names, RESTART_BUDGET, &op).await, ips);
    println!(
        "eptest: timing: whole test {:.1} s",
        t_all.elapsed().as_secs_f64()
    );
}
