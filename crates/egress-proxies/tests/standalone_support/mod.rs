//! Shared by the tests that run the real `egress-proxies standalone` binary as its own process
//! against libvirt-fake hosts on unix sockets: the hosts and their "DHCP" loop
//! ([`FakeHosts`]), the provider config and manifest files, the operator process
//! ([`Operator`]: killed and reaped on drop), plain HTTP reads of its API ([`get`], [`json`],
//! each with a deadline), one look at a pool in `/status` ([`look`]), and the re-run of a test
//! inside a fresh network namespace ([`rerun_in_netns`]).
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::future::Future;
use std::io::{BufRead as _, BufReader};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ep_operator_fixtures::real_members::{Daemon, tinyproxy_at};
use ep_operator_fixtures::{GIB, POOL, dhcp_network, publish_base, run_dhcp};
use libvirt_fake::{FakeLibvirt, PoolSpec};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::{CancellationToken, DropGuard};

pub const BIN: &str = env!("CARGO_BIN_EXE_egress-proxies");
/// Every HTTP read of the operator's API gives up after this long.
pub const HTTP_TIMEOUT: Duration = Duration::from_secs(5);

/// The sha256 the fake hosts' base image is published under.
pub fn digest() -> String {
    "ad".repeat(32)
}

/// A loopback port free at the time of the call.
pub fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Writes `text` to `dir/name`.
pub fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

/// libvirt-fake hosts, each with the pool, the `default` DHCP network and a published base of
/// `image`, served on `<dir>/<host>.sock`, plus the "DHCP" loop giving guest addresses. The
/// loop stops when this is dropped.
pub struct FakeHosts {
    /// The fakes by host name.
    pub fakes: BTreeMap<&'static str, FakeLibvirt>,
    /// Each host's socket.
    pub socks: BTreeMap<&'static str, PathBuf>,
    _dhcp: DropGuard,
}

impl FakeHosts {
    /// Starts `hosts` on the current runtime, their sockets in `dir`.
    pub async fn start(dir: &Path, entry: &str, image: &str, hosts: &[&'static str]) -> Self {
        let mut fakes = BTreeMap::new();
        let mut socks = BTreeMap::new();
        for &h in hosts {
            let fake = FakeLibvirt::new();
            fake.add_pool(PoolSpec::new(POOL).capacity(100 * GIB))
                .unwrap();
            fake.add_network(dhcp_network("default")).unwrap();
            publish_base(&fake, entry, image, &digest());
            let sock = dir.join(format!("{h}.sock"));
            fake.listen_unix(&sock).await.unwrap();
            fakes.insert(h, fake);
            socks.insert(h, sock);
        }
        let dhcp = CancellationToken::new();
        tokio::spawn(run_dhcp(
            entry.into(),
            fakes
                .iter()
                .map(|(h, f)| ((*h).to_owned(), f.clone()))
                .collect(),
            Duration::from_millis(100),
            dhcp.clone(),
        ));
        Self {
            fakes,
            socks,
            _dhcp: dhcp.drop_guard(),
        }
    }

    /// How many domains `host` holds.
    pub fn domains(&self, host: &str) -> usize {
        self.fakes[host].domains().len()
    }

    /// One `hosts:` entry of the provider config for `host` (`extra`: more indented lines).
    pub fn host_yaml(&self, host: &str, extra: &str) -> String {
        format!(
            "      - name: {host}\n        address: local\n        socket: {}\n        pool: {POOL}\n        \
             network: default\n        virtType: qemu\n        poolReserveGiB: 1\n{extra}",
            self.socks[host].display()
        )
    }
}

/// A provider `policy` letting members reach loopback (the gateway tests' echo targets).
pub const LOOPBACK_POLICY: &str = "    policy:\n      allowedInternalCidrs: [127.0.0.0/8]\n";

impl FakeHosts {
    /// Writes (whole) the provider config of every one of these hosts, with `extra` lines after
    /// the image (see [`providers_yaml`]).
    pub fn write_config(&self, path: &Path, entry: &str, image: &str, extra: &str) {
        let hosts: String = self.socks.keys().map(|h| self.host_yaml(h, "")).collect();
        write_whole(path, &providers_yaml(entry, image, &hosts, extra));
    }
}

/// Creates the manifest directory `parent/manifests` with one credentials file per
/// `(file, user, password)`; returns its path.
pub fn manifest_dir(parent: &Path, creds: &[(&str, &str, &str)]) -> PathBuf {
    let dir = parent.join("manifests");
    std::fs::create_dir(&dir).unwrap();
    for (file, user, password) in creds {
        write(&dir, file, &format!("{user}:{password}\n"));
    }
    dir
}

/// Guest addresses the DHCP loop may give (10.1.0.2 onwards, in creation order): in the
/// gateway tests a member listens on each; the ones no member got stay idle.
pub const SLOTS: u8 = 6;
/// The members' proxy port, and the credentials they take.
pub const MEMBER_PORT: u16 = 3128;
pub const MEMBER_USER: &str = "pool-fleet";
pub const MEMBER_PW: &str = "member-password-0123456789";
/// The gateway's HTTP listener, and the password of its client `alice`.
pub const HTTP_PORT: u16 = 8118;
pub const ALICE_PW: &str = "alice-password-0123456789";

/// The guest address the fixtures' DHCP loop gives the `k`th domain (10.1.0.2 onwards).
pub fn slot_addr(k: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 1, 0, 2 + k)
}

/// A real tinyproxy at `slot_addr(k):port` for each of `slots`, taking `user`/`password`, each
/// leaving from its own egress address; stopped when dropped.
pub async fn tinyproxies(
    slots: u8,
    port: u16,
    user: &str,
    password: &str,
) -> BTreeMap<Ipv4Addr, Daemon> {
    let mut daemons = BTreeMap::new();
    for k in 0..slots {
        let at = SocketAddr::from((slot_addr(k), port));
        daemons.insert(slot_addr(k), tinyproxy_at(at, k, user, password).await);
    }
    daemons
}

/// The provider config of one libvirt entry: its `hosts` lines, the image, `extra` lines (such
/// as a policy) and the defaults.
pub fn providers_yaml(entry: &str, image: &str, hosts: &str, extra: &str) -> String {
    format!(
        "providers:\n  - name: {entry}\n    type: libvirt\n    hosts:\n{hosts}    images:\n      \
         {image}:\n        url: https://images.invalid/tiny.qcow2\n        sha256: {}\n        \
         format: qcow2\n{extra}    defaults:\n      diskGiB: 4\n      memoryMiB: 256\n      vcpus: 1\n",
        digest()
    )
}

/// Writes `text` whole to a temporary name and renames it to `path`, so a watch never reads
/// half a file.
pub fn write_whole(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// The operator process; killed and reaped when dropped, its log kept for failures.
pub struct Operator {
    pub child: Child,
    log: PathBuf,
    tail_lines: usize,
}

impl Operator {
    /// Starts `egress-proxies standalone` with `--config cfg --proxies dir --listen listen
    /// --check-interval check_interval`, then `extra` arguments; stderr goes to `log`, of
    /// which [`Operator::tail`] shows the last `tail_lines` lines.
    pub fn start<I, S>(
        cfg: &Path,
        dir: &Path,
        listen: SocketAddr,
        check_interval: &str,
        extra: I,
        log: PathBuf,
        tail_lines: usize,
    ) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let child = Command::new(BIN)
            .args(["standalone", "--config"])
            .arg(cfg)
            .arg("--proxies")
            .arg(dir)
            .args([
                "--listen",
                &listen.to_string(),
                "--check-interval",
                check_interval,
            ])
            .args(extra)
            .env_remove("EGRESS_PROXIES_CONFIG")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Self {
            child,
            log,
            tail_lines,
        }
    }

    /// The last lines of its log.
    pub fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(self.tail_lines)..].join("\n")
    }

    /// Fails the test, with the log's tail, if the process has exited.
    pub fn assert_running(&mut self) {
        assert!(
            self.child.try_wait().unwrap().is_none(),
            "standalone exited\n{}",
            self.tail()
        );
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// GET `path` from the operator; `None` while nothing answers with 200 (within
/// [`HTTP_TIMEOUT`]).
pub async fn get(addr: SocketAddr, path: &str) -> Option<String> {
    let go = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .ok()?;
        let mut buf = String::new();
        s.read_to_string(&mut buf).await.ok()?;
        match ep_test_support::http::response(&buf)? {
            (200, body) => Some(body),
            _ => None,
        }
    };
    tokio::time::timeout(HTTP_TIMEOUT, go).await.ok().flatten()
}

/// [`get`] parsed as JSON; `Null` while nothing answers.
pub async fn json(addr: SocketAddr, path: &str) -> Value {
    get(addr, path)
        .await
        .and_then(|b| serde_json::from_str(&b).ok())
        .unwrap_or(Value::Null)
}

/// What one look at `/status` shows of one pool and of every Proxy.
#[derive(Debug, Default)]
pub struct Look {
    /// The pool's members not being deleted: name → (host, available).
    pub members: BTreeMap<String, (String, bool)>,
    /// The pool's `status` as recorded.
    pub status: Value,
    /// Every Proxy: name → (phase, host, Ready condition's reason).
    pub proxies: BTreeMap<String, (String, String, String)>,
}

impl Look {
    pub fn available(&self) -> usize {
        self.members.values().filter(|(_, a)| *a).count()
    }
    pub fn on(&self, host: &str) -> usize {
        self.members.values().filter(|(h, _)| h == host).count()
    }
    pub fn proxy(&self, name: &str) -> (&str, &str, &str) {
        self.proxies.get(name).map_or(("-", "-", "-"), |(p, h, r)| {
            (p.as_str(), h.as_str(), r.as_str())
        })
    }
}

/// One look at `/status` for `pool` (empty while nothing answers; one [`get`]).
pub async fn look(addr: SocketAddr, pool: &str) -> Look {
    let doc = json(addr, "/status").await;
    let mut l = Look::default();
    for p in doc["pools"].as_array().into_iter().flatten() {
        if p["name"] != pool {
            continue;
        }
        l.status = p["status"].clone();
        for m in p["members"].as_array().into_iter().flatten() {
            if m["deleting"] == true {
                continue;
            }
            l.members.insert(
                m["name"].as_str().unwrap_or("").to_owned(),
                (
                    m["host"].as_str().unwrap_or("-").to_owned(),
                    m["available"] == true,
                ),
            );
        }
    }
    for p in doc["proxies"].as_array().into_iter().flatten() {
        let ready = p["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Ready")
            .and_then(|c| c["reason"].as_str())
            .unwrap_or("-");
        l.proxies.insert(
            p["name"].as_str().unwrap_or("").to_owned(),
            (
                p["phase"].as_str().unwrap_or("-").to_owned(),
                p["host"].as_str().unwrap_or("-").to_owned(),
                ready.to_owned(),
            ),
        );
    }
    l
}

/// Each host's `field` in `/hosts` ("-" when absent; empty while nothing answers).
pub async fn host_rows(addr: SocketAddr, field: &str) -> BTreeMap<String, String> {
    json(addr, "/hosts")
        .await
        .as_array()
        .into_iter()
        .flatten()
        .map(|h| {
            (
                h["host"].as_str().unwrap_or("").to_owned(),
                h[field].as_str().unwrap_or("-").to_owned(),
            )
        })
        .collect()
}

/// Runs `body` on a 2-worker runtime (the run inside the namespace).
pub fn block_on(body: impl Future<Output = ()>) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(body);
}

/// Re-runs this test binary's test `test` alone, with `inner` set in its environment, in a
/// fresh network namespace where 10.0.0.0/8 is local on loopback; its output is passed
/// through. The run is killed after 300 s; fails unless it succeeded and ran exactly `test`.
pub fn rerun_in_netns(test: &str, inner: &str) {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new("timeout")
        .args(["300", "unshare", "-n", "sh", "-ec"])
        .arg("ip link set lo up; ip route add local 10.0.0.0/8 dev lo table local; exec \"$@\"")
        .arg("sh")
        .arg(exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(inner, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen = String::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let Ok(line) = line else { break };
        println!("{line}");
        seen.push_str(&line);
        seen.push('\n');
    }
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "the run inside the namespace failed: {status}"
    );
    if let Err(e) = ep_test_support::e2e::check_ran_exactly(&seen, test) {
        panic!("the run inside the namespace: {e}");
    }
}
