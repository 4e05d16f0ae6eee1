//! A pinned address moves between two real hosts of one L2 segment, and each guest that takes
//! it announces it: two private libvirtds, each in its own network namespace with its own
//! sshd, their guests bridged onto one segment (`ep_test_support::segment`), both hosts with
//! `segment: lan` and one shared address pool; the `egress-proxies standalone` binary reaches
//! both over SSH and runs real Debian guests (TCG).
//!
//! What it proves, through the user's path (`/status`, `/hosts`, `egress-proxies hosts fence`,
//! the echo) and the segment itself:
//! 1. Proxy `a`, pinned to address A of the shared pool, runs on a host X and answers through
//!    the echo from A; after its boot, before the test sends anything to A, the guest has
//!    **announced** A: a gratuitous ARP for A from the guest's MAC reached the segment bridge
//!    (an nftables set records the sender MAC of every ARP whose sender and target are A), and
//!    the bridge's neighbour table holds A at that MAC.
//! 2. X is frozen (a DROP rule on its uplink: its SSH and its guest cut off; the guest still
//!    runs). Once X's row says it is dead, `a` is removed and Proxy `b`, pinned to A, is
//!    written: it waits, its condition naming X, with no domain on the other host Y, and X's
//!    fence command (a script that would kill X's QEMU) is **not** run: A is another Proxy's
//!    address (a fence runs only for a Proxy's own copy).
//! 3. The administrator kills X's guest and declares X dead (`egress-proxies hosts fence X`):
//!    `b` comes up on Y with A; Y's guest announces A (its MAC recorded by the set), the
//!    bridge's neighbour table moves A to Y's guest MAC without the test sending anything to A
//!    first, and A answers through the echo from A.
//! 4. X answers again: `a`'s old domain is deleted there; removing `b` leaves no domain and no
//!    volume but the base on either host.
//!
//! Printed: freeze → X's row dead, → declared dead, → `b`'s domain on Y, → A announced from
//! Y, → A answering through the echo, and how much of it is the guest's boot.
//!
//! Isolation: the test re-executes itself inside a network namespace it creates; the segment
//! bridge, the operator, the echo, the image server and the client live there; every host is a
//! namespace of its own. Everything is removed by Drop guards, and by the parent by name if the
//! child died before them.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use ep_test_support::cleanup;
use ep_test_support::e2e::{ImageHost, echo_server, env, get_body, run_ok};
use ep_test_support::real_guest::{
    self as real_guest, RealGuest, StandaloneOperator, egress_through, status_json,
};
use ep_test_support::segment::{HOST_BRIDGE, HOST_POOL, OwnNetns, Segment};
use serde_json::Value;

const SEGMENT_ENV: &str = "EPTEST_SEGMENT_MOVE_SEGMENT";
// NB: two guest boots (3-4.5 min each under TCG on a loaded 2-core machine) and the waits
// between them.
const TEST_BUDGET: Duration = Duration::from_secs(40 * 60);
/// From a manifest to its Proxy running with its address.
const BOOT_BUDGET: Duration = Duration::from_secs(12 * 60);
/// From a Proxy running (its phase: the domain runs and its declared address is known, long
/// before the guest has booted) to its guest's announcement seen: the guest's boot under TCG.
const ANNOUNCE_BUDGET: Duration = Duration::from_secs(10 * 60);
/// From the announcement to a request through the proxy answered: the rest of the boot
/// (cloud-init's final stage starts the proxy).
const ANSWER_BUDGET: Duration = Duration::from_secs(5 * 60);
/// A frozen host's row must say so within this: the host check interval (5 s here) and its
/// first call's 10 s, and slack for a check round of two hosts.
const HOST_ROW_BOUND: Duration = Duration::from_secs(30);
/// How long `b` is watched waiting for X before the declaration (several host checks and
/// create attempts).
const WAITING: Duration = Duration::from_secs(20);
/// From a host's return to the removed Proxy's old domain deleted there, and from a manifest's
/// removal to its domain gone.
const CLEANUP_BUDGET: Duration = Duration::from_secs(180);
const SAMPLE: Duration = Duration::from_millis(250);
const PROXY_PORT: u16 = 3128;
const IMAGE_KEY: &str = "debian-12-ep";
const IMAGE_PATH: &str = "/debian-12-ep.qcow2";
const HOSTS: usize = 2;

fn test_name() -> &'static str {
    "a_pinned_address_is_announced_by_each_guest_that_takes_it_across_the_segment"
}

#[test]
fn a_pinned_address_is_announced_by_each_guest_that_takes_it_across_the_segment() {
    let own = (!real_guest::is_rerun(test_name())).then(|| OwnNetns::create("segmove"));
    let ns = own.as_ref().map_or_else(String::new, |o| o.0.clone());
    real_guest::run_in(
        &ns,
        test_name(),
        TEST_BUDGET,
        &[env(SEGMENT_ENV, &ns)],
        inside_the_namespace,
    );
}

/// Proxy `name` in `/status`: (phase, host, egress addresses, domain, Ready message).
#[derive(Debug, Clone, Default)]
struct Row {
    phase: String,
    host: String,
    egress: Vec<String>,
    domain: String,
    ready: String,
}

async fn row(listen: SocketAddr, name: &str) -> Option<Row> {
    let doc = status_json(listen).await?;
    let p = doc["proxies"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == name)?
        .clone();
    let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    Some(Row {
        phase: s(&p["phase"]),
        host: s(&p["host"]),
        egress: p["egressAddress"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        domain: p["providerId"]
            .as_str()
            .and_then(|id| id.rsplit('/').next())
            .unwrap_or_default()
            .to_owned(),
        ready: p["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Ready")
            .map(|c| s(&c["message"]))
            .unwrap_or_default(),
    })
}

/// The state of host `host` in `/hosts`.
async fn host_state(listen: SocketAddr, host: &str) -> Option<String> {
    let doc: Value = serde_json::from_str(&get_body(listen, "/hosts").await?).ok()?;
    doc.as_array()?
        .iter()
        .find(|h| h["host"] == host)
        .and_then(|h| h["state"].as_str())
        .map(str::to_owned)
}

/// Waits until Proxy `name` runs with `address` as its egress address; returns its row.
async fn running_with(
    listen: SocketAddr,
    name: &str,
    address: Ipv4Addr,
    op: &StandaloneOperator,
) -> Row {
    let t0 = Instant::now();
    loop {
        if let Some(r) = row(listen, name).await
            && r.phase == "Running"
            && r.egress.contains(&address.to_string())
            && !r.domain.is_empty()
        {
            return r;
        }
        assert!(
            t0.elapsed() < BOOT_BUDGET,
            "Proxy {name} is not running with {address} after {BOOT_BUDGET:?}: {:?}\n{}",
            row(listen, name).await,
            op.log_tail()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Waits until the segment recorded an announcement of the watched address from `mac`, and
/// returns the neighbour entry the bridge then holds for `address`.
async fn announced_by(
    seg: &Segment,
    address: Ipv4Addr,
    mac: &str,
    who: &str,
) -> (Duration, Option<(String, String)>) {
    let t0 = Instant::now();
    loop {
        let seen = seg.announced();
        if seen.iter().any(|m| m == mac) {
            return (t0.elapsed(), seg.neighbour(address));
        }
        assert!(
            t0.elapsed() < ANNOUNCE_BUDGET,
            "{who}: no gratuitous ARP for {address} from its MAC {mac} within \
             {ANNOUNCE_BUDGET:?} of its guest running (MACs that announced {address}: \
             {seen:?}; the bridge's neighbour entry: {:?})",
            seg.neighbour(address)
        );
        tokio::time::sleep(SAMPLE).await;
    }
}

fn proxy_yaml(dir: &Path, name: &str, entry: &str, address: Ipv4Addr, client: Ipv4Addr) {
    let path = dir.join(format!("{name}.yaml"));
    let tmp = dir.join(format!(".{name}.yaml.tmp"));
    std::fs::write(
        &tmp,
        format!(
            "apiVersion: egress-proxies.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: {name}\n\
             spec:\n  provider: {entry}\n  image: {IMAGE_KEY}\n  egress:\n    address: [{address}]\n  \
             proxy:\n    port: {PROXY_PORT}\n    protocol: http\n    \
             allowedClientCidrs: [{client}/32]\n"
        ),
    )
    .unwrap();
    std::fs::rename(&tmp, &path).unwrap();
}

/// Runs `egress-proxies hosts ARGS --config cfg --proxies dir`: (exit code, stdout+stderr).
fn hosts_cmd(bin: &Path, cfg: &Path, dir: &Path, args: &[&str]) -> (i32, String) {
    let out = Command::new(bin)
        .arg("hosts")
        .args(args)
        .arg("--config")
        .arg(cfg)
        .arg("--proxies")
        .arg(dir)
        .env_remove("EGRESS_PROXIES_CONFIG")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Host index of config name `hN`.
fn host_index(name: &str) -> usize {
    name.strip_prefix('h')
        .and_then(|n| n.parse::<usize>().ok())
        .and_then(|n| n.checked_sub(1))
        .unwrap_or_else(|| panic!("host name {name}"))
}

async fn inside_the_namespace(rg: RealGuest) {
    let t_start = Instant::now();
    let RealGuest { bin, image } = rg;
    let name = std::env::var(SEGMENT_ENV).expect("the segment's name from the parent");
    let seg = Segment::create_named(name, HOSTS);
    let entry = format!("epsegmv{}", cleanup::now_secs());
    let gateway = seg.ip(1);
    // The address both Proxies pin, in the shared pool's range.
    let address = seg.ip(150);
    let work = tempfile::Builder::new()
        .prefix(&cleanup::unique_name("dir", "epsegmv"))
        .tempdir()
        .unwrap();
    let (echo, _seen) = echo_server(gateway).await;
    let server = ImageHost::start(std::fs::read(&image.path).unwrap(), IMAGE_PATH, 0).await;
    let dir = work.path().join("manifests");
    std::fs::create_dir(&dir).unwrap();
    // Each host's fence command: a script that records its run and kills the QEMUs of the
    // host's namespace (its guests), exit 0. It must not run here: A is another Proxy's.
    let mut hosts = String::new();
    let mut markers = Vec::new();
    for h in &seg.hosts {
        let marker = work.path().join(format!("fenced-h{}", h.index + 1));
        let script = work.path().join(format!("fence-h{}.sh", h.index + 1));
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\necho \"$EGRESS_PROXIES_FENCE_HOST\" >> {marker}\n\
                 for p in $(ip netns pids {ns}); do\n  \
                 case \"$(cat /proc/$p/comm 2>/dev/null)\" in qemu*) kill -KILL \"$p\" ;; esac\n\
                 done\nexit 0\n",
                marker = marker.display(),
                ns = h.netns(),
            ),
        )
        .unwrap();
        run_ok(Command::new("chmod").arg("755").arg(&script));
        markers.push(marker);
        hosts.push_str(&format!(
            "      - name: h{n}\n        address: {ip}:{port}\n        user: root\n        \
             socket: {sock}\n        pool: {HOST_POOL}\n        bridge: {HOST_BRIDGE}\n        \
             guestCidr: {cidr}\n        virtType: qemu\n        poolReserveGiB: 0\n        \
             sshKeyFile: {key}\n        knownHostsFile: {kh}\n        maxConcurrent: 3\n        \
             segment: lan\n        fence: {{command: [{script}], timeout: 10s}}\n        \
             addressPool:\n          ipv4:\n            prefix: {cidr}\n            \
             gateway: {gateway}\n            ranges: [{first}-{last}]\n",
            n = h.index + 1,
            ip = h.ip,
            port = h.sshd.port,
            sock = h.socket().display(),
            cidr = seg.cidr(),
            key = h.sshd.client_key_path.display(),
            kh = h.sshd.known_hosts_path.display(),
            script = script.display(),
            first = seg.ip(140),
            last = seg.ip(159),
        ));
    }
    let config = work.path().join("providers.yaml");
    std::fs::write(
        &config,
        format!(
            "providers:\n  - name: {entry}\n    type: libvirt\n    hosts:\n{hosts}    \
             images:\n      {IMAGE_KEY}:\n        url: {url}\n        sha256: {sha}\n        \
             format: qcow2\n        firmware: uefi\n    \
             policy:\n      allowedInternalCidrs: [{gateway}/32]\n      networkFilter: false\n    \
             defaults:\n      diskGiB: 4\n      memoryMiB: 512\n      vcpus: 1\n",
            url = server.url,
            sha = image.sha256,
        ),
    )
    .unwrap();
    println!(
        "eptest: config:\n{}",
        std::fs::read_to_string(&config).unwrap()
    );
    seg.watch_announcements(address);
    let listen = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let op = StandaloneOperator::start(
        &bin,
        &config,
        &dir,
        listen,
        std::iter::empty::<&str>(),
        work.path().join("operator.log"),
    );

    // 1. `a` pinned to A runs on X and announced A.
    let t0 = Instant::now();
    proxy_yaml(&dir, "a", &entry, address, gateway);
    let a = running_with(listen, "a", address, &op).await;
    let x = host_index(&a.host);
    let y = 1 - x;
    let (xh, yh) = (&seg.hosts[x], &seg.hosts[y]);
    let x_mac = xh.guest_mac(&a.domain).expect("a's guest MAC on X");
    println!(
        "eptest: timing: manifest → a running on h{} ({}, MAC {x_mac}) {:.1} s",
        x + 1,
        a.domain,
        t0.elapsed().as_secs_f64()
    );
    let (after, neigh) = announced_by(&seg, address, &x_mac, "a").await;
    println!(
        "eptest: a: gratuitous ARP for {address} from {x_mac} seen ({:.1} s after running); \
         the bridge's neighbour entry then, before the test sent anything to {address}: \
         {neigh:?}",
        after.as_secs_f64()
    );
    assert_eq!(
        neigh.as_ref().map(|n| n.0.as_str()),
        Some(x_mac.as_str()),
        "the segment bridge does not hold {address} at a's guest MAC after its announcement"
    );
    let saw = egress_through((address, PROXY_PORT), gateway, echo, ANSWER_BUDGET).await;
    assert_eq!(saw, address.to_string(), "the echo saw another egress");
    println!("eptest: a: a request through {address} reached the echo from {saw}");

    // 2. X frozen; `a` removed, `b` pinned to A waits, no fence run.
    let x_name = format!("h{}", x + 1);
    let x_qemu = xh.libvirtd.qemu_pid(&a.domain).expect("a's QEMU pid");
    println!("eptest: freezing {x_name} (a's QEMU pid {x_qemu} keeps running)");
    xh.freeze();
    let t_freeze = Instant::now();
    let dead = loop {
        let s = host_state(listen, &x_name).await.unwrap_or_default();
        if s == "Unreachable" || s == "Timeout" {
            break t_freeze.elapsed();
        }
        assert!(
            t_freeze.elapsed() < HOST_ROW_BOUND,
            "{x_name}'s row says {s:?} {:?} after its freeze\n{}",
            t_freeze.elapsed(),
            op.log_tail()
        );
        tokio::time::sleep(SAMPLE).await;
    };
    println!(
        "eptest: timing: freeze → {x_name}'s row dead {:.1} s",
        dead.as_secs_f64()
    );
    std::fs::remove_file(dir.join("a.yaml")).unwrap();
    proxy_yaml(&dir, "b", &entry, address, gateway);
    let t_b = Instant::now();
    let mut last = Row::default();
    while t_b.elapsed() < WAITING {
        if let Some(r) = row(listen, "b").await {
            assert_ne!(
                r.phase, "Running",
                "b runs while A's holder on {x_name} is not proven gone: {r:?}"
            );
            last = r;
        }
        let on_y: Vec<String> = yh
            .domains()
            .into_iter()
            .filter(|d| d.starts_with(&format!("ep-{entry}-")))
            .collect();
        assert!(
            on_y.is_empty(),
            "a domain on h{} while A's holder is not proven gone: {on_y:?}",
            y + 1
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    println!("eptest: b waits: {last:?}");
    assert!(
        last.ready.contains(&x_name),
        "b's condition does not name {x_name}: {last:?}"
    );
    for m in &markers {
        assert!(
            !m.exists(),
            "a fence command ran for another Proxy's address: {}",
            std::fs::read_to_string(m).unwrap_or_default()
        );
    }
    assert!(
        Path::new(&format!("/proc/{x_qemu}")).exists(),
        "a's QEMU on {x_name} died while frozen"
    );

    // 3. The administrator powers X's guest off and declares X dead: `b` comes up on Y.
    run_ok(Command::new("kill").args(["-KILL", &x_qemu.to_string()]));
    let (code, out) = hosts_cmd(
        &bin,
        &config,
        &dir,
        &["fence", &x_name, "--reason", "eptest: its guest was killed"],
    );
    assert_eq!(code, 0, "hosts fence {x_name}: {out}");
    let declared = t_freeze.elapsed();
    println!(
        "eptest: timing: freeze → {x_name} declared dead {:.1} s: {}",
        declared.as_secs_f64(),
        out.trim()
    );
    let t_declared = Instant::now();
    let mut created_at = None;
    let b = loop {
        if created_at.is_none()
            && yh
                .domains()
                .iter()
                .any(|d| d.starts_with(&format!("ep-{entry}-")))
        {
            created_at = Some(t_declared.elapsed());
        }
        if let Some(r) = row(listen, "b").await
            && r.phase == "Running"
            && r.egress.contains(&address.to_string())
            && !r.domain.is_empty()
        {
            break r;
        }
        assert!(
            t_declared.elapsed() < BOOT_BUDGET,
            "b is not running with {address} {BOOT_BUDGET:?} after {x_name} was declared dead: \
             {:?}\n{}",
            row(listen, "b").await,
            op.log_tail()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let running = t_declared.elapsed();
    assert_eq!(
        b.host,
        format!("h{}", y + 1),
        "b not on the other host: {b:?}"
    );
    let y_mac = yh.guest_mac(&b.domain).expect("b's guest MAC on Y");
    assert_ne!(y_mac, x_mac, "b's guest has a's MAC");
    let (after_b, neigh_b) = announced_by(&seg, address, &y_mac, "b").await;
    println!(
        "eptest: b: gratuitous ARP for {address} from {y_mac} seen ({:.1} s after running); \
         the bridge's neighbour entry then, before the test sent anything to {address}: \
         {neigh_b:?}",
        after_b.as_secs_f64()
    );
    assert_eq!(
        neigh_b.as_ref().map(|n| n.0.as_str()),
        Some(y_mac.as_str()),
        "the segment bridge still does not hold {address} at b's guest MAC after its \
         announcement (a's was {x_mac})"
    );
    let saw = egress_through((address, PROXY_PORT), gateway, echo, ANSWER_BUDGET).await;
    assert_eq!(saw, address.to_string(), "the echo saw another egress");
    let answering = t_declared.elapsed();
    // NB: the phase turns Running once the domain runs with its declared address, long before
    // the guest has booted: the boot is the domain's start to the answer through the proxy.
    let created = created_at.unwrap_or(running);
    let boot = answering.saturating_sub(created);
    println!(
        "eptest: timing: {x_name} declared dead → b's domain on h{} {:.1} s → b Running {:.1} s \
         → A announced from h{} {:.1} s → A answering through the echo {:.1} s (the guest's \
         boot, domain to answer: {:.1} s, {:.0} % of it); freeze → A answering {:.1} s (of \
         which the wait for the declaration {:.1} s)",
        y + 1,
        created.as_secs_f64(),
        running.as_secs_f64(),
        y + 1,
        (running + after_b).as_secs_f64(),
        answering.as_secs_f64(),
        boot.as_secs_f64(),
        100.0 * boot.as_secs_f64() / answering.as_secs_f64().max(0.001),
        t_freeze.elapsed().as_secs_f64(),
        declared.as_secs_f64(),
    );

    // 4. X answers again: a's old domain goes; removing b leaves nothing.
    xh.thaw();
    let t_back = Instant::now();
    loop {
        if !xh.domains().contains(&a.domain) && row(listen, "a").await.is_none() {
            break;
        }
        assert!(
            t_back.elapsed() < CLEANUP_BUDGET,
            "a's old domain {} on {x_name} is not deleted {:?} after its return: {:?}\n{}",
            a.domain,
            t_back.elapsed(),
            xh.domains(),
            op.log_tail()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    println!(
        "eptest: timing: {x_name} back → a's old domain deleted {:.1} s",
        t_back.elapsed().as_secs_f64()
    );
    std::fs::remove_file(dir.join("b.yaml")).unwrap();
    let prefix = format!("ep-{entry}-");
    let t2 = Instant::now();
    loop {
        let left: Vec<String> = seg
            .hosts
            .iter()
            .flat_map(|h| h.domains())
            .filter(|d| d.starts_with(&prefix))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            t2.elapsed() < CLEANUP_BUDGET,
            "domains left after the Proxies' removal: {left:?}\n{}",
            op.log_tail()
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    drop(op);
    for h in &seg.hosts {
        let (domains, volumes) = (h.domains(), h.volumes());
        println!(
            "eptest: h{} after: domains {domains:?}, volumes {volumes:?}",
            h.index + 1
        );
        assert!(
            domains.is_empty(),
            "h{}: domains left: {domains:?}",
            h.index + 1
        );
        let base = format!("{prefix}base-");
        let ours: Vec<&String> = volumes
            .iter()
            .filter(|v| v.starts_with(&prefix) && !v.starts_with(&base))
            .collect();
        assert!(ours.is_empty(), "h{}: volumes left: {ours:?}", h.index + 1);
    }
    println!(
        "eptest: timing: whole test {:.1} s",
        t_start.elapsed().as_secs_f64()
    );
}
