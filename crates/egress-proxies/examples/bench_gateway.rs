//! `scripts/bench gateway`: the pool gateway beside HAProxy and direct connections, in one
//! run, on loopback, with the same real tinyproxy members (the configs a guest gets).
//!
//! Set-up: `MEMBERS` tinyproxy processes (MaxClients raised for the idle test), a target
//! server in this process (a blob source, a short answer, a sink that holds connections),
//! the fake Kubernetes API server as its own process (`kube-fake-server`) holding a ProxyPool
//! with `spec.gateway` and its members (Ready, healthy, pointing at the tinyproxies), the
//! release `egress-proxies gateway` process following it (access log off), and HAProxy
//! (`mode tcp`, `balance roundrobin`, the same members). The load generator is this process.
//!
//! Contenders, interleaved (their order rotates each run):
//! - `direct`: the client talks to a member (round robin on the client side);
//! - `haproxy`: through HAProxy (the client's CONNECT goes through to a member);
//! - `gateway`: through the gateway (it authenticates the client and dials a member itself).
//!
//! Figures per contender and run: throughput of `SIZE_MIB` through one CONNECT tunnel (the
//! target sends, the client reads), the front process's CPU for it (per GiB); connections
//! per second for short CONNECT exchanges at `CONCURRENCY` for `RATE_SECS`; latency of
//! `LATENCY_SAMPLES` sequential short exchanges (p50/p99, and added over direct); then, once,
//! the front's RSS with `IDLE` idle tunnels open (and before them). The load average is
//! printed with each run.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::print_stdout
)]

use std::io::{BufRead as _, BufReader};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ep_operator_fixtures::real_members::{Daemon, basic, tinyproxy_with};
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const USER: &str = "pool-bench";
const PW: &str = "bench-password-0123456789";
const NS: &str = "default";
const TOKEN: &str = "bench-token-1";
/// Bound on each step's waits.
const STEP: Duration = Duration::from_secs(120);

fn env_or<T: std::str::FromStr>(k: &str, d: T) -> T {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// utime + stime of `pid`, seconds.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    ticks / 100.0
}

/// VmRSS of `pid`, MiB.
fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

// ----- targets -----

/// The targets: blob (reads an 8-byte length, sends that many bytes), short (reads a request
/// head, answers a 2-byte body), sink (holds the connection until the peer closes).
struct Targets {
    blob: SocketAddr,
    short: SocketAddr,
    sink: SocketAddr,
}

async fn serve_blob(l: TcpListener) {
    loop {
        let Ok((mut c, _)) = l.accept().await else {
            continue;
        };
        tokio::spawn(async move {
            let mut n = [0u8; 8];
            if c.read_exact(&mut n).await.is_err() {
                return;
            }
            let mut left = u64::from_be_bytes(n);
            let chunk = vec![0x5au8; 256 * 1024];
            while left > 0 {
                let k = left.min(chunk.len() as u64) as usize;
                if c.write_all(&chunk[..k]).await.is_err() {
                    return;
                }
                left -= k as u64;
            }
            let _ = c.shutdown().await;
        });
    }
}

async fn serve_short(l: TcpListener) {
    loop {
        let Ok((mut c, _)) = l.accept().await else {
            continue;
        };
        tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            let mut got = Vec::new();
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                match c.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            let _ = c
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
                .await;
            let _ = c.shutdown().await;
        });
    }
}

async fn serve_sink(l: TcpListener) {
    loop {
        let Ok((mut c, _)) = l.accept().await else {
            continue;
        };
        tokio::spawn(async move {
            let mut buf = [0u8; 64];
            while matches!(c.read(&mut buf).await, Ok(n) if n > 0) {}
        });
    }
}

async fn targets() -> Targets {
    let b = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let s = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let k = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let t = Targets {
        blob: b.local_addr().unwrap(),
        short: s.local_addr().unwrap(),
        sink: k.local_addr().unwrap(),
    };
    tokio::spawn(serve_blob(b));
    tokio::spawn(serve_short(s));
    tokio::spawn(serve_sink(k));
    t
}

// ----- the client -----

/// Opens a CONNECT tunnel to `target` through the HTTP proxy at `front`.
async fn tunnel(front: SocketAddr, target: SocketAddr) -> std::io::Result<TcpStream> {
    let mut s = TcpStream::connect(front).await?;
    s.set_nodelay(true)?;
    let req = format!(
        "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic {}\r\n\r\n",
        basic(USER, PW)
    );
    s.write_all(req.as_bytes()).await?;
    let mut head = Vec::with_capacity(128);
    let mut b = [0u8; 256];
    loop {
        let n = s.read(&mut b).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        head.extend_from_slice(&b[..n]);
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            if !head.starts_with(b"HTTP/1.1 200") && !head.starts_with(b"HTTP/1.0 200") {
                return Err(std::io::Error::other(
                    String::from_utf8_lossy(&head).into_owned(),
                ));
            }
            assert_eq!(end + 4, head.len(), "no early data expected");
            return Ok(s);
        }
    }
}

/// One short exchange through `front` to the short target.
async fn short(front: SocketAddr, target: SocketAddr) -> std::io::Result<()> {
    let mut s = tunnel(front, target).await?;
    s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n").await?;
    let mut out = Vec::with_capacity(128);
    s.read_to_end(&mut out).await?;
    if !out.ends_with(b"ok") {
        return Err(std::io::Error::other("short answer"));
    }
    Ok(())
}

/// How the client reaches the members through one contender.
#[derive(Clone)]
struct Front {
    name: &'static str,
    /// Addresses used in turn (direct: every member; the others: one).
    addrs: Vec<SocketAddr>,
    /// The front's process (CPU and RSS); none for direct.
    pid: Option<u32>,
    next: Arc<AtomicU64>,
}

impl Front {
    fn addr(&self) -> SocketAddr {
        let i = self.next.fetch_add(1, Ordering::Relaxed) as usize;
        self.addrs[i % self.addrs.len()]
    }
}

// ----- the measurements -----

async fn throughput(f: &Front, t: &Targets, bytes: u64) -> (f64, Option<f64>) {
    let cpu0 = f.pid.map(cpu_secs);
    let t0 = Instant::now();
    let mut s = tunnel(f.addr(), t.blob).await.unwrap();
    s.write_all(&bytes.to_be_bytes()).await.unwrap();
    let mut buf = vec![0u8; 256 * 1024];
    let mut got = 0u64;
    loop {
        let n = s.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        got += n as u64;
    }
    assert_eq!(got, bytes, "{}: short transfer", f.name);
    let secs = t0.elapsed().as_secs_f64();
    let gib = bytes as f64 / (1u64 << 30) as f64;
    let cpu = f.pid.map(|p| (cpu_secs(p) - cpu0.unwrap_or(0.0)) / gib);
    (bytes as f64 / (1u64 << 20) as f64 / secs, cpu)
}

/// Connections per second, failed ones, and the front's CPU per connection (µs; none for
/// direct) over the measured window.
async fn conn_rate(
    f: &Front,
    t: &Targets,
    concurrency: usize,
    secs: u64,
) -> (f64, u64, Option<f64>) {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (f, stop, done, failed, target) = (
            f.clone(),
            Arc::clone(&stop),
            Arc::clone(&done),
            Arc::clone(&failed),
            t.short,
        );
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match short(f.addr(), target).await {
                    Ok(()) => done.fetch_add(1, Ordering::Relaxed),
                    Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    let t0 = Instant::now();
    let (n0, cpu0) = (done.load(Ordering::Relaxed), f.pid.map(cpu_secs));
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let n = done.load(Ordering::Relaxed) - n0;
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu = f
        .pid
        .map(|p| (cpu_secs(p) - cpu0.unwrap_or(0.0)) * 1e6 / n.max(1) as f64);
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    (n as f64 / elapsed, failed.load(Ordering::Relaxed), cpu)
}

async fn latencies(f: &Front, t: &Targets, n: usize) -> Vec<f64> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t0 = Instant::now();
        short(f.addr(), t.short).await.unwrap();
        v.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    v.sort_by(f64::total_cmp);
    v
}

fn pct(v: &[f64], p: f64) -> f64 {
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

async fn idle_rss(f: &Front, t: &Targets, n: usize) -> (f64, f64, Vec<TcpStream>) {
    let pid = f.pid.unwrap();
    let before = rss_mib(pid);
    let mut held = Vec::with_capacity(n);
    // A few at a time: the members accept their backlog's worth at once.
    let mut pending = Vec::new();
    for i in 0..n {
        let (addr, target) = (f.addr(), t.sink);
        pending.push(tokio::spawn(async move { tunnel(addr, target).await }));
        if pending.len() == 64 || i + 1 == n {
            for p in pending.drain(..) {
                held.push(p.await.unwrap().unwrap());
            }
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    (before, rss_mib(pid), held)
}

// ----- set-up -----

async fn fake_api(bin: &Path, dir: &Path) -> (Child, PathBuf) {
    let mut child = Command::new(bin)
        .args(["--dir", dir.to_str().unwrap(), "--token", TOKEN])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(
        line.starts_with("ready https://"),
        "kube-fake-server: {line:?}"
    );
    (child, dir.join("kubeconfig"))
}

fn gvk(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("egress-proxies.dev", "v1alpha1", kind),
        plural,
    )
}

async fn publish_pool(kubeconfig: &Path, repo: &Path, members: &[Daemon], port: u16) {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(cfg).unwrap();
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    for f in ["proxies", "proxypools", "providerhealths"] {
        let text =
            std::fs::read_to_string(repo.join(format!("deploy/crds/{f}.egress-proxies.dev.yaml")))
                .unwrap();
        crds.create(
            &PostParams::default(),
            &serde_saphyr::from_str(&text).unwrap(),
        )
        .await
        .unwrap();
    }
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), NS);
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "bench-credentials", "namespace": NS,
                             "labels": {"egress-proxies.dev/credentials": "true",
                                        "egress-proxies.dev/pool": "bench"}},
                "data": {"username": b64(USER), "password": b64(PW)},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let pools: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), NS, &gvk("ProxyPool", "proxypools"));
    let pool = pools
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "egress-proxies.dev/v1alpha1", "kind": "ProxyPool",
                "metadata": {"name": "bench", "namespace": NS},
                "spec": {"replicas": members.len(),
                         "template": {"spec": {"provider": "fake", "image": "tiny",
                                               "proxy": {"port": 3128}}},
                         "credentials": {"generate": true},
                         "gateway": {"listeners": [{"port": port}],
                                     "timeouts": {"request": "5m"}}},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let uid = pool.metadata.uid.unwrap();
    let proxies: Api<DynamicObject> = Api::namespaced_with(client, NS, &gvk("Proxy", "proxies"));
    for (i, d) in members.iter().enumerate() {
        let name = format!("bench-m{i}");
        proxies
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "apiVersion": "egress-proxies.dev/v1alpha1", "kind": "Proxy",
                    "metadata": {"name": name, "namespace": NS,
                                 "labels": {"egress-proxies.dev/pool": "bench"},
                                 "ownerReferences": [{"apiVersion": "egress-proxies.dev/v1alpha1",
                                     "kind": "ProxyPool", "name": "bench", "uid": uid,
                                     "controller": true}]},
                    "spec": {"provider": "fake", "host": "h0", "image": "tiny",
                             "proxy": {"port": d.addr.port(), "credentialsRef": "bench-credentials"}},
                }))
                .unwrap(),
            )
            .await
            .unwrap();
        proxies
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {
                    "phase": "Running", "ip": "127.0.0.1", "observedGeneration": 1,
                    "conditions": [{"type": "Ready", "status": "True", "reason": "Ready",
                        "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z",
                        "observedGeneration": 1}],
                    "health": {"healthy": true, "egressIp": d.egress.to_string(),
                               "consecutiveFailures": 0, "consecutiveSuccesses": 3}}})),
            )
            .await
            .unwrap();
    }
}

fn b64(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// This process's open-file limit (children inherit it).
fn open_files() -> usize {
    std::fs::read_to_string("/proc/self/limits")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3).and_then(|v| v.parse().ok()))
        .unwrap_or(1024)
}

fn haproxy(dir: &Path, port: u16, members: &[Daemon]) -> Child {
    // NB: two descriptors per connection (client and server side) and a few of its own.
    let maxconn = (open_files() - 200) / 2;
    let mut cfg = format!(
        "global\n  maxconn {maxconn}\n  log stderr format raw local0 emerg\n\
         defaults\n  mode tcp\n  timeout connect 5s\n  timeout client 1h\n  timeout server 1h\n\
         frontend gw\n"
    );
    cfg.push_str(&format!(
        "  bind 127.0.0.1:{port}\n  maxconn {maxconn}\n  default_backend members\n"
    ));
    cfg.push_str("backend members\n  balance roundrobin\n");
    for (i, d) in members.iter().enumerate() {
        cfg.push_str(&format!("  server m{i} {} maxconn {maxconn}\n", d.addr));
    }
    let path = dir.join("haproxy.cfg");
    std::fs::write(&path, cfg).unwrap();
    Command::new("haproxy")
        .args(["-db", "-f", path.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

async fn wait_serving(addr: SocketAddr, t: &Targets) {
    let t0 = Instant::now();
    while short(addr, t.short).await.is_err() {
        assert!(t0.elapsed() < STEP, "{addr} never served");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let bin = PathBuf::from(
        std::env::var("GATEWAY_BIN").expect("GATEWAY_BIN: the release egress-proxies"),
    );
    let fake =
        PathBuf::from(std::env::var("FAKE_API_BIN").expect("FAKE_API_BIN: kube-fake-server"));
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let n_members: u8 = env_or("MEMBERS", 3);
    let size: u64 = env_or::<u64>("SIZE_MIB", 1024) << 20;
    let runs: usize = env_or("RUNS", 3);
    let concurrency: usize = env_or("CONCURRENCY", 256);
    let rate_secs: u64 = env_or("RATE_SECS", 10);
    let samples: usize = env_or("LATENCY_SAMPLES", 2000);
    // NB: an idle tunnel is two descriptors in the front; the front must fit its limit.
    let idle: usize = env_or("IDLE", 10_000.min((open_files() - 200) / 2));
    let idle_clients: usize = env_or("IDLE_CLIENTS", 10_000.min(open_files() - 200));
    let dir = tempfile::tempdir().unwrap();
    println!(
        "== host: {} cores; load {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        loadavg()
    );
    let t = targets().await;
    let per_member = u32::try_from(idle / usize::from(n_members) + 1000).unwrap();
    let mut members = Vec::new();
    for i in 0..n_members {
        members
            .push(tinyproxy_with(i, USER, PW, Some(per_member.max(concurrency as u32 * 2))).await);
    }
    let (mut api, kubeconfig) = fake_api(&fake, &dir.path().join("api")).await;
    let gw_port = free_port();
    publish_pool(&kubeconfig, &repo, &members, gw_port).await;
    let gw_listen = free_port();
    let mut gateway = Command::new(&bin)
        .arg("gateway")
        .args(["--bind-address", "127.0.0.1"])
        .args(["--listen", &format!("127.0.0.1:{gw_listen}")])
        .args(["--gateway-access-log", "off"])
        .args(
            std::env::var("GATEWAY_WORKERS")
                .map(|n| vec!["--gateway-workers".to_owned(), n])
                .unwrap_or_default(),
        )
        .env("KUBECONFIG", &kubeconfig)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let ha_port = free_port();
    let mut ha = haproxy(dir.path(), ha_port, &members);
    let gw_addr = SocketAddr::from((Ipv4Addr::LOCALHOST, gw_port));
    let ha_addr = SocketAddr::from((Ipv4Addr::LOCALHOST, ha_port));
    wait_serving(gw_addr, &t).await;
    wait_serving(ha_addr, &t).await;
    let fronts = [
        Front {
            name: "direct",
            addrs: members.iter().map(|m| m.addr).collect(),
            pid: None,
            next: Arc::default(),
        },
        Front {
            name: "haproxy",
            addrs: vec![ha_addr],
            pid: Some(ha.id()),
            next: Arc::default(),
        },
        Front {
            name: "gateway",
            addrs: vec![gw_addr],
            pid: Some(gateway.id()),
            next: Arc::default(),
        },
    ];
    println!(
        "== members: {n_members} tinyproxy; {} MiB per transfer; {concurrency} concurrent for {rate_secs} s; {samples} latency samples; {idle} idle tunnels; {idle_clients} idle clients",
        size >> 20
    );
    println!(
        "run contender  MiB/s  cpu_s/GiB  conn/s (failed)  cpu_us/conn  p50_us  p99_us  +p50_us  +p99_us  load"
    );
    for run in 0..runs {
        let mut order: Vec<&Front> = fronts.iter().collect();
        order.rotate_left(run % fronts.len());
        let mut direct_lat: Option<(f64, f64)> = None;
        let mut rows = Vec::new();
        for f in order {
            let (mibs, cpu) = throughput(f, &t, size).await;
            let (rate, failed, per_conn) = conn_rate(f, &t, concurrency, rate_secs).await;
            let lat = latencies(f, &t, samples).await;
            let (p50, p99) = (pct(&lat, 0.5), pct(&lat, 0.99));
            if f.name == "direct" {
                direct_lat = Some((p50, p99));
            }
            rows.push((f.name, mibs, cpu, rate, failed, per_conn, p50, p99));
        }
        let (d50, d99) = direct_lat.unwrap();
        for (name, mibs, cpu, rate, failed, per_conn, p50, p99) in rows {
            println!(
                "{run:>3} {name:<9} {mibs:>6.0} {:>10} {rate:>7.0} ({failed:>4}) {:>11} {p50:>7.0} {p99:>7.0} {:>8.0} {:>8.0}  {}",
                cpu.map_or("-".to_owned(), |c| format!("{c:.2}")),
                per_conn.map_or("-".to_owned(), |c| format!("{c:.0}")),
                p50 - d50,
                p99 - d99,
                loadavg()
            );
        }
    }
    for f in &fronts[1..] {
        let (before, after, held) = idle_rss(f, &t, idle).await;
        println!(
            "idle {:<9} RSS {before:.1} MiB before, {after:.1} MiB with {} idle tunnels ({:.1} KiB per tunnel)",
            f.name,
            held.len(),
            (after - before) * 1024.0 / held.len() as f64
        );
        drop(held);
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    // Idle client connections that sent nothing yet (the gateway holds no member connection
    // and no buffer for them; HAProxy in TCP mode connects to a member at once, so it has no
    // such state and is not measured here).
    let gw = &fronts[2];
    let pid = gw.pid.unwrap();
    let before = rss_mib(pid);
    let mut held = Vec::with_capacity(idle_clients);
    for _ in 0..idle_clients {
        held.push(TcpStream::connect(gw_addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = rss_mib(pid);
    println!(
        "idle gateway   RSS {before:.1} MiB before, {after:.1} MiB with {} idle client connections before their request ({:.1} KiB each)",
        held.len(),
        (after - before) * 1024.0 / held.len() as f64
    );
    drop(held);
    println!(
        "== open-file limit {}; load at the end: {}",
        open_files(),
        loadavg()
    );
    for c in [&mut gateway, &mut ha, &mut api] {
        let _ = c.kill();
        let _ = c.wait();
    }
    drop(members);
}
