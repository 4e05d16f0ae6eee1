//! A pinned address moves between two real hosts of one L2 segment, and each guest that takes
//! it announces it: two private libvirtds, each in its own network namespace with its own
//! sshd, their guests bridged onto one segment (`ep_test_support::segment`), both hosts with
//! `segment: lan` and one shared address pool; the `egress-proxies standalone` binary reaches
//! both over SSH and runs real Debian guests (TCG).
//!
//! What it proves, through the user's path (`/status`, `/hosts`, `egress-proxies hosts fence`,
//! the echo) and the segment itself (test `a_pinned_address_is_announced_…`):
//! 1. Proxy `a` gets address A (the shared pool's first) on a host X and answers through the
//!    echo from A; after its boot, before the test sends anything to A, the guest has
//!    **announced** A: a gratuitous ARP for A from the guest's MAC reached the segment bridge
//!    (an nftables set records the sender MAC of every ARP whose sender and target are A), and
//!    the bridge's neighbour table holds A at that MAC (the bridge, the guests' gateway, takes
//!    entries from gratuitous ARPs: `arp_accept=1`).
//! 2. X is frozen (a DROP rule on its uplink: its SSH and its guest cut off; the guest still
//!    runs). Once X's row says it is dead, Proxy `b`, pinned to A, is written: it waits, its
//!    condition naming X, with no domain on the other host Y, and X's fence command (a script
//!    that would kill X's QEMU) is **not** run: A is another Proxy's address (a fence runs
//!    only for a Proxy's own copy).
//! 3. The administrator kills X's guest and declares X dead (`egress-proxies hosts fence X`):
//!    `b` comes up on Y with A; Y's guest announces A (its MAC recorded by the set), the
//!    bridge's neighbour table moves A to Y's guest MAC without the test sending anything to A
//!    first, and A answers through the echo from A.
//! 4. X answers again: A stays with `b`; `a` runs again, with another address. Removing both
//!    leaves no domain and no volume but the bases on either host.
//!
//! The second test (`a_fence_command_that_fails_or_hangs_…`) runs the fence command itself:
//! see its doc.
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
/// before the guest has booted) to its guest's announcement seen: the guest's boot under TCG
/// up to systemd-networkd.
// NB: 38-51 s measured on a 2-core machine at load 2-5; a full boot to a healthy proxy takes
// 3-4 min at worst.
const ANNOUNCE_BUDGET: Duration = Duration::from_secs(5 * 60);
/// From the announcement to a request through the proxy answered: the rest of the boot
/// (cloud-init's final stage starts the proxy).
const ANSWER_BUDGET: Duration = Duration::from_secs(5 * 60);
/// A frozen host's row must say so within this: the host check interval (5 s here) and its
/// first call's 10 s, and slack for a check round of two hosts.
const HOST_ROW_BOUND: Duration = Duration::from_secs(30);
/// How long `b` may take to say it waits for X: its create's listing of X runs out its call
/// deadline (`timeouts.call`, 60 s) before the condition names X; then it is watched for as
/// long again (several host checks and create attempts).
const WAITING: Duration = Duration::from_secs(150);
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

/// Writes Proxy `name`'s manifest (atomically), pinned to `address` when given.
fn proxy_yaml(dir: &Path, name: &str, entry: &str, address: Option<Ipv4Addr>, client: Ipv4Addr) {
    let path = dir.join(format!("{name}.yaml"));
    let tmp = dir.join(format!(".{name}.yaml.tmp"));
    let egress = address.map_or(String::new(), |a| {
        format!("  egress:\n    address: [{a}]\n")
    });
    std::fs::write(
        &tmp,
        format!(
            "apiVersion: egress-proxies.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: {name}\n\
             spec:\n  provider: {entry}\n  image: {IMAGE_KEY}\n{egress}  \
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

/// What both tests run in: the segment, the echo, the image server, the config (both hosts
/// on segment `lan` with one address pool and a fence command each) and the operator.
struct Fixture {
    // NB: fields drop in order: the operator before the segment it reaches.
    op: StandaloneOperator,
    listen: SocketAddr,
    bin: std::path::PathBuf,
    config: std::path::PathBuf,
    dir: std::path::PathBuf,
    entry: String,
    gateway: Ipv4Addr,
    echo: SocketAddr,
    _server: ImageHost,
    /// Per host: the file its fence command appends a line to at each run.
    fence_runs: Vec<std::path::PathBuf>,
    /// Per host: the file its fence command reads what to do from: `kill` (kill the QEMUs of
    /// the host's namespace, exit 0; the default), `fail` (exit 1 with a message), `hang`
    /// (sleep 600 s).
    fence_mode: Vec<std::path::PathBuf>,
    seg: Segment,
    _work: tempfile::TempDir,
}

/// The fence command's timeout in the config.
const FENCE_TIMEOUT: Duration = Duration::from_secs(5);

impl Fixture {
    async fn start(rg: RealGuest, prefix: &str) -> Self {
        let RealGuest { bin, image } = rg;
        let name = std::env::var(SEGMENT_ENV).expect("the segment's name from the parent");
        let seg = Segment::create_named(name, HOSTS);
        let entry = format!("{prefix}{}", cleanup::now_secs());
        let gateway = seg.ip(1);
        let work = tempfile::Builder::new()
            .prefix(&cleanup::unique_name("dir", prefix))
            .tempdir()
            .unwrap();
        let (echo, _seen) = echo_server(gateway).await;
        let server = ImageHost::start(std::fs::read(&image.path).unwrap(), IMAGE_PATH, 0).await;
        let dir = work.path().join("manifests");
        std::fs::create_dir(&dir).unwrap();
        let mut hosts = String::new();
        let (mut fence_runs, mut fence_mode) = (Vec::new(), Vec::new());
        for h in &seg.hosts {
            let n = h.index + 1;
            let runs = work.path().join(format!("fence-runs-h{n}"));
            let mode = work.path().join(format!("fence-mode-h{n}"));
            let script = work.path().join(format!("fence-h{n}.sh"));
            std::fs::write(&mode, "kill\n").unwrap();
            std::fs::write(
                &script,
                format!(
                    "#!/bin/sh\nmode=$(cat {mode})\necho \"$EGRESS_PROXIES_FENCE_HOST $mode $$\" >> {runs}\n\
                     case $mode in\n\
                     fail) echo \"bmc-h{n}: connection refused\" >&2; exit 1 ;;\n\
                     hang) exec sleep 600 ;;\n\
                     esac\n\
                     for p in $(ip netns pids {ns}); do\n  \
                     case \"$(cat /proc/$p/comm 2>/dev/null)\" in qemu*) kill -KILL \"$p\" ;; esac\n\
                     done\nexit 0\n",
                    mode = mode.display(),
                    runs = runs.display(),
                    ns = h.netns(),
                ),
            )
            .unwrap();
            run_ok(Command::new("chmod").arg("755").arg(&script));
            fence_runs.push(runs);
            fence_mode.push(mode);
            hosts.push_str(&format!(
                "      - name: h{n}\n        address: {ip}:{port}\n        user: root\n        \
                 socket: {sock}\n        pool: {HOST_POOL}\n        bridge: {HOST_BRIDGE}\n        \
                 guestCidr: {cidr}\n        virtType: qemu\n        poolReserveGiB: 0\n        \
                 sshKeyFile: {key}\n        knownHostsFile: {kh}\n        maxConcurrent: 3\n        \
                 segment: lan\n        fence: {{command: [{script}], timeout: {t}s}}\n        \
                 addressPool:\n          ipv4:\n            prefix: {cidr}\n            \
                 gateway: {gateway}\n            ranges: [{first}-{last}]\n",
                ip = h.ip,
                port = h.sshd.port,
                sock = h.socket().display(),
                cidr = seg.cidr(),
                key = h.sshd.client_key_path.display(),
                kh = h.sshd.known_hosts_path.display(),
                script = script.display(),
                t = FENCE_TIMEOUT.as_secs(),
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
        Self {
            op,
            listen,
            bin,
            config,
            dir,
            entry,
            gateway,
            echo,
            _server: server,
            fence_runs,
            fence_mode,
            seg,
            _work: work,
        }
    }

    /// The fence runs of host index `i` so far: (host, mode, pid) lines.
    fn fence_runs(&self, i: usize) -> Vec<String> {
        std::fs::read_to_string(&self.fence_runs[i])
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The entry's domains on host index `i`.
    fn domains(&self, i: usize) -> Vec<String> {
        let prefix = format!("ep-{}-", self.entry);
        self.seg.hosts[i]
            .domains()
            .into_iter()
            .filter(|d| d.starts_with(&prefix))
            .collect()
    }

    /// Removes every manifest's Proxy and checks that nothing is left on either host: no
    /// domain, no volume of the entry but its bases.
    async fn remove_all_and_check(self, names: &[&str]) {
        for n in names {
            let _ = std::fs::remove_file(self.dir.join(format!("{n}.yaml")));
        }
        let t2 = Instant::now();
        loop {
            let left: Vec<String> = (0..HOSTS).flat_map(|i| self.domains(i)).collect();
            if left.is_empty() {
                break;
            }
            assert!(
                t2.elapsed() < CLEANUP_BUDGET,
                "domains left after the Proxies' removal: {left:?}\n{}",
                self.op.log_tail()
            );
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        let Self { op, seg, entry, .. } = self;
        drop(op);
        let prefix = format!("ep-{entry}-");
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
    }
}

async fn inside_the_namespace(rg: RealGuest) {
    let t_start = Instant::now();
    let fx = Fixture::start(rg, "epsegmv").await;
    let (seg, listen, op) = (&fx.seg, fx.listen, &fx.op);
    let (entry, gateway, echo) = (fx.entry.clone(), fx.gateway, fx.echo);
    let (bin, config, dir) = (fx.bin.clone(), fx.config.clone(), fx.dir.clone());
    // 1. `a` (not pinned) gets A, the segment pool's first address, on X and announces it.
    let t0 = Instant::now();
    let address = seg.ip(140);
    proxy_yaml(&dir, "a", &entry, None, gateway);
    let a = running_with(listen, "a", address, op).await;
    // NB: Running comes with the domain's start, long before the guest's boot announces.
    seg.watch_announcements(address);
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
    let (after, neigh) = announced_by(seg, address, &x_mac, "a").await;
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
    proxy_yaml(&dir, "b", &entry, Some(address), gateway);
    let t_b = Instant::now();
    let mut last = Row::default();
    let mut named = None;
    while named.is_none_or(|t: Instant| t.elapsed() < Duration::from_secs(15)) {
        assert!(
            t_b.elapsed() < WAITING,
            "b's condition does not name {x_name} within {WAITING:?}: {last:?}\n{}",
            op.log_tail()
        );
        if let Some(r) = row(listen, "b").await {
            if named.is_none() && r.ready.contains(&x_name) {
                println!(
                    "eptest: b waits ({:.1} s after its manifest): {}",
                    t_b.elapsed().as_secs_f64(),
                    r.ready
                );
                named = Some(Instant::now());
            }
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
    println!("eptest: b still waiting: {last:?}");
    for i in 0..HOSTS {
        let runs = fx.fence_runs(i);
        assert!(
            runs.is_empty(),
            "a fence command ran for another Proxy's address: {runs:?}"
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
    let (after_b, neigh_b) = announced_by(seg, address, &y_mac, "b").await;
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

    // 4. X answers again: the address stays with b; a (its guest killed) is re-created
    //    with another address, never A.
    xh.thaw();
    let t_back = Instant::now();
    let a_after = loop {
        let r = row(listen, "a").await.unwrap_or_default();
        // NB: a's status may still say Running with A from before the freeze (a failed read
        // keeps it) until its first read after X's return: what counts is a guest running
        // with A, so the domain's state decides.
        let state = xh.libvirtd.virsh(&["domstate", &a.domain]);
        let runs = String::from_utf8_lossy(&state.stdout).trim() == "running";
        assert!(
            !(runs && r.egress.contains(&address.to_string())),
            "a's guest runs with {address} again after {x_name}'s return while b holds it: \
             {r:?}"
        );
        if r.phase == "Running" && !r.egress.is_empty() && !r.egress.contains(&address.to_string())
        {
            break r;
        }
        assert!(
            t_back.elapsed() < CLEANUP_BUDGET,
            "a is not running again {:?} after {x_name}'s return: {r:?}\n{}",
            t_back.elapsed(),
            op.log_tail()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let b_after = row(listen, "b").await.unwrap_or_default();
    assert!(
        b_after.phase == "Running"
            && b_after.host == b.host
            && b_after.egress.contains(&address.to_string()),
        "b lost {address} after {x_name}'s return: {b_after:?}"
    );
    println!(
        "eptest: timing: {x_name} back → a running again {:.1} s with {:?} on {}; b still \
         has {address} on {}",
        t_back.elapsed().as_secs_f64(),
        a_after.egress,
        a_after.host,
        b_after.host
    );
    fx.remove_all_and_check(&["a", "b"]).await;
    println!(
        "eptest: timing: whole test {:.1} s",
        t_start.elapsed().as_secs_f64()
    );
}

fn fence_test_name() -> &'static str {
    "a_fence_command_that_fails_or_hangs_keeps_the_address_and_the_condition_says_so"
}

/// From a host frozen under a create to its fence command's result in the Proxy's condition:
/// the create's call deadline, a host check that finds the host dead, the retry elsewhere.
const FENCE_BUDGET: Duration = Duration::from_secs(6 * 60);

/// A create dies with its host: Proxy `c`, pinned to address A of the shared pool, is being
/// created on host X (its domain just defined there) when X is frozen, so X may hold A for
/// `c`'s own domain and nothing can say otherwise. The retry on the other host Y must prove
/// the copy gone first: X's fence command runs (it is `c`'s own copy, X found dead).
/// - the fence command exits 1: `c` is not created on Y (no domain there, not Running), and
///   its `Ready` condition says `waiting for host X to be fenced: fence command exited 1`
///   with the command's message;
/// - it hangs (`sleep 600`, timeout 5 s): the same, the condition saying it timed out, and
///   the command is killed (its process gone);
/// - it exits 0: `c` is created on Y with A (running with A as its egress address).
///
/// Then X answers again; removing `c` leaves nothing on either host. No guest needs to boot.
#[test]
fn a_fence_command_that_fails_or_hangs_keeps_the_address_and_the_condition_says_so() {
    let own = (!real_guest::is_rerun(fence_test_name())).then(|| OwnNetns::create("segfence"));
    let ns = own.as_ref().map_or_else(String::new, |o| o.0.clone());
    real_guest::run_in(
        &ns,
        fence_test_name(),
        TEST_BUDGET,
        &[env(SEGMENT_ENV, &ns)],
        fence_inside_the_namespace,
    );
}

/// Waits until `c`'s `Ready` message contains `what`, checking meanwhile that `c` has no
/// domain on host index `y` and does not run; returns the message.
async fn waits_saying(fx: &Fixture, y: usize, what: &str, budget: Duration) -> String {
    let t0 = Instant::now();
    loop {
        let r = row(fx.listen, "c").await.unwrap_or_default();
        assert_ne!(
            r.phase, "Running",
            "c runs while its copy is not proven gone: {r:?}"
        );
        let on_y = fx.domains(y);
        assert!(
            on_y.is_empty(),
            "a domain on h{} while c's copy is not proven gone: {on_y:?}",
            y + 1
        );
        if r.ready.contains(what) {
            return r.ready;
        }
        assert!(
            t0.elapsed() < budget,
            "c's condition does not say {what:?} after {budget:?}: {r:?}\n{}",
            fx.op.log_tail()
        );
        tokio::time::sleep(SAMPLE).await;
    }
}

async fn fence_inside_the_namespace(rg: RealGuest) {
    let t_start = Instant::now();
    let fx = Fixture::start(rg, "epsegfn").await;
    let address = fx.seg.ip(151);
    proxy_yaml(&fx.dir, "c", &fx.entry, Some(address), fx.gateway);
    // X: the host c's create goes to, frozen as soon as c's domain is defined there: the
    // create's next call to X fails, and so does its undo (X does not answer), so X may hold
    // A for c's own domain. (A create that fails before its domain exists releases A: the
    // image import, say.)
    let t0 = Instant::now();
    let x = loop {
        if let Some(i) = (0..HOSTS).find(|i| !fx.domains(*i).is_empty()) {
            break i;
        }
        assert!(
            t0.elapsed() < BOOT_BUDGET,
            "c's domain is not defined on either host: {:?}\n{}",
            row(fx.listen, "c").await,
            fx.op.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let y = 1 - x;
    let x_name = format!("h{}", x + 1);
    fx.seg.hosts[x].freeze();
    let t_freeze = Instant::now();
    println!(
        "eptest: {x_name} frozen under c's create ({:.1} s after the manifest; its row: \
         {:?})",
        t0.elapsed().as_secs_f64(),
        row(fx.listen, "c").await
    );
    // A fence command that fails.
    std::fs::write(&fx.fence_mode[x], "fail\n").unwrap();
    let said = waits_saying(
        &fx,
        y,
        &format!("waiting for host {x_name} to be fenced: fence command exited 1"),
        FENCE_BUDGET,
    )
    .await;
    println!(
        "eptest: timing: freeze → failed fence reported {:.1} s: {said}",
        t_freeze.elapsed().as_secs_f64()
    );
    assert!(
        said.contains("bmc-h"),
        "the command's message is not kept: {said}"
    );
    let runs = fx.fence_runs(x);
    assert!(
        !runs.is_empty() && runs.iter().all(|l| l.starts_with(&format!("{x_name} "))),
        "fence runs of {x_name}: {runs:?}"
    );
    assert!(fx.fence_runs(y).is_empty(), "the live host was fenced");
    // One that hangs past its timeout.
    std::fs::write(&fx.fence_mode[x], "hang\n").unwrap();
    let t_hang = Instant::now();
    let said = waits_saying(
        &fx,
        y,
        &format!("waiting for host {x_name} to be fenced: fence command timed out"),
        Duration::from_secs(90),
    )
    .await;
    println!(
        "eptest: timing: hanging fence reported {:.1} s after the switch: {said}",
        t_hang.elapsed().as_secs_f64()
    );
    let hung: Vec<String> = fx
        .fence_runs(x)
        .iter()
        .filter(|l| l.contains(" hang "))
        .filter_map(|l| l.rsplit(' ').next().map(str::to_owned))
        .collect();
    assert!(!hung.is_empty(), "no hanging run recorded");
    for pid in &hung {
        let t = Instant::now();
        while Path::new(&format!("/proc/{pid}")).exists()
            && std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "sleep")
        {
            assert!(
                t.elapsed() < FENCE_TIMEOUT * 3,
                "the hanging fence command (pid {pid}) is not killed"
            );
            tokio::time::sleep(SAMPLE).await;
        }
    }
    // One that succeeds: c comes up on Y with A.
    std::fs::write(&fx.fence_mode[x], "kill\n").unwrap();
    let t_ok = Instant::now();
    let c = running_with(fx.listen, "c", address, &fx.op).await;
    assert_eq!(
        c.host,
        format!("h{}", y + 1),
        "c not on the other host: {c:?}"
    );
    println!(
        "eptest: timing: fence succeeding → c running on h{} with {address} {:.1} s ({c:?})",
        y + 1,
        t_ok.elapsed().as_secs_f64()
    );
    fx.seg.hosts[x].thaw();
    fx.remove_all_and_check(&["c"]).await;
    println!(
        "eptest: timing: whole test {:.1} s",
        t_start.elapsed().as_secs_f64()
    );
}
