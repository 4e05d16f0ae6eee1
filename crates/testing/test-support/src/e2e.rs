//! Building blocks of the real-guest end-to-end tests (crates/egress-proxies/tests/
//! e2e_real_guest.rs for standalone, e2e_kube_real_guest.rs for Kubernetes): re-running the
//! test inside libvirtd's network namespace and checking that the child ran exactly that
//! test ([`reexec_in_netns`], [`check_ran_exactly`]), the Debian guest image
//! ([`build_image`]), an isolated libvirt network ([`NetGuard`]), the entry's domain sweep
//! ([`EntryGuard`]), an HTTP image server that can throttle ([`ImageHost`]), the
//! `egress-proxies echo` process ([`EchoProcess`]), and one-shot HTTP/1.1 helpers.
//!
//! Every wait is bounded: the re-executed child by `timeout(1)`, HTTP exchanges by
//! [`HTTP_TIMEOUT`], process stops by [`STOP_GRACE`]; every guard cleans up on Drop.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use crate::cleanup::{self, virsh};

/// The namespace `.ci/setup-host` starts libvirtd in.
pub const LIBVIRT_NETNS: &str = "egress-proxies";
/// One HTTP exchange (status, proxy request).
// NB: loopback/bridge round trips are milliseconds; a TCG guest's tinyproxy answers in < 1 s.
pub const HTTP_TIMEOUT: Duration = Duration::from_secs(20);
/// Graceful stop of a helper process before it is killed.
// NB: the operators of the e2e tests run with a 20 s shutdown grace; 30 s covers it.
pub const STOP_GRACE: Duration = Duration::from_secs(30);
/// Attempts at a free /24 for the test network.
// NB: parallel runs pick random /24s of 198.18.0.0/15; 16 collisions in a row do not happen.
pub const SUBNET_ATTEMPTS: usize = 16;
/// The chunk the image server writes at a time.
// NB: 64 KiB keeps a throttle smooth (16 sleeps per second at 4 MiB/s).
pub const SERVE_CHUNK: usize = 64 << 10;
/// Largest request head the image server reads.
// NB: the operator's HEAD/GET heads are ~200 bytes.
pub const MAX_REQUEST_HEAD: usize = 16 << 10;

/// Runs `cmd` (stdin closed); its stdout, or a panic with its stderr when it fails.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

// ---------------------------------------------------------------- re-running in the namespace

/// Checks the output of a test binary run with `NAME --exact`: the libtest summary says
/// exactly one test passed and nothing failed, was ignored or filtered in, and that test was
/// `name`. A child that ran nothing (a renamed test: "0 passed"), was skipped ("1 ignored")
/// or ran another test is an error naming what it saw.
pub fn check_ran_exactly(stdout: &str, name: &str) -> Result<(), String> {
    let summaries: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("test result: "))
        .collect();
    let [summary] = summaries.as_slice() else {
        return Err(format!(
            "expected one libtest summary line, saw {}: {summaries:?}",
            summaries.len()
        ));
    };
    if !summary.starts_with("test result: ok. 1 passed; 0 failed; 0 ignored;") {
        return Err(format!(
            "the child did not run exactly one passing test: {summary}"
        ));
    }
    // NB: with --nocapture the test's own output follows "test NAME ... " on the same line
    // and the verdict comes later, so only the name is taken from these lines; the verdict
    // is the summary's.
    let ran: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("test "))
        .filter_map(|l| l.split_once(" ... ").map(|(n, _)| n))
        .collect();
    if ran != [name] {
        return Err(format!("the child ran {ran:?}, not [{name:?}]"));
    }
    Ok(())
}

/// Re-runs test `name` of the current test binary inside network namespace `netns`
/// (`timeout BUDGET ip netns exec NETNS EXE NAME --exact --nocapture --test-threads=1`) with
/// `envs` set, echoing its stdout, and panics unless it exited 0 having run exactly `name`
/// ([`check_ran_exactly`]).
pub fn reexec_in_netns(netns: &str, name: &str, budget: Duration, envs: &[(&str, OsString)]) {
    let exe = std::env::current_exe().unwrap();
    println!("eptest: re-running {name} inside network namespace {netns}");
    let mut cmd = Command::new("timeout");
    cmd.arg(budget.as_secs().to_string())
        .args(["ip", "netns", "exec", netns])
        .arg(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut seen = String::new();
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            // NB: straight to the process's stdout, not `println!` (which libtest captures
            // for a passing test): the child's timing lines stay in the log, as when it
            // inherited stdout.
            let _ = writeln!(std::io::stdout().lock(), "{line}");
            seen.push_str(&line);
            seen.push('\n');
        }
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "the run inside {netns} failed: {status}");
    if let Err(e) = check_ran_exactly(&seen, name) {
        panic!("the run inside {netns}: {e}");
    }
}

// ---------------------------------------------------------------- the guest image

/// The Debian guest image of `scripts/build-guest-image`.
#[derive(Debug, Clone)]
pub struct GuestImage {
    /// The qcow2 file.
    pub path: PathBuf,
    /// Its sha256 (hex).
    pub sha256: String,
}

/// The image `.ci/setup-host` built (`REPO/scripts/build-guest-image --cached-only`, cached by
/// content), from its `key=value` output. Never builds: when the image is missing the script
/// fails naming `.ci/setup-host`, and so does this.
pub fn build_image(repo: &Path) -> GuestImage {
    let out = run_ok(Command::new(repo.join("scripts/build-guest-image")).arg("--cached-only"));
    let get = |k: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("build-guest-image printed no {k}=: {out}"))
            .to_owned()
    };
    GuestImage {
        path: PathBuf::from(get("image")),
        sha256: get("sha256"),
    }
}

// ---------------------------------------------------------------- guards

/// An isolated libvirt network with DHCP on bridge `eptbr<hex>` in a random /24 of
/// 198.18.0.0/15 (no `<forward>`); destroyed when dropped.
#[derive(Debug)]
pub struct NetGuard {
    /// The network's name.
    pub name: String,
    /// Its bridge.
    pub bridge: String,
    prefix: [u8; 3],
}

impl NetGuard {
    /// Creates the network (a unique name of `test`), trying other /24s on a clash.
    pub fn create(test: &str) -> Self {
        for _ in 0..SUBNET_ATTEMPTS {
            let name = cleanup::unique_name("net", test);
            let bridge = format!("eptbr{:08x}", cleanup::random_u32());
            let r = cleanup::random_u32();
            let prefix = [198, 18 + (r & 1) as u8, (r >> 8) as u8];
            let [a, b, c] = prefix;
            println!("eptest: creating network {name} (bridge {bridge}, {a}.{b}.{c}.0/24)");
            let xml = format!(
                "<network><name>{name}</name><bridge name='{bridge}' stp='off'/>\
                 <ip address='{a}.{b}.{c}.1' netmask='255.255.255.0'>\
                 <dhcp><range start='{a}.{b}.{c}.10' end='{a}.{b}.{c}.200'/></dhcp></ip>\
                 </network>"
            );
            let file = std::env::temp_dir().join(format!("{name}.xml"));
            std::fs::write(&file, xml).unwrap();
            let g = Self {
                name,
                bridge,
                prefix,
            };
            let out = virsh(&["net-create", file.to_str().unwrap()]);
            let _ = std::fs::remove_file(&file);
            if out.status.success() {
                return g;
            }
            // NB: most likely the /24 is taken by a parallel run; try another.
            println!(
                "eptest: network {} not created: {}",
                g.name,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        panic!("no isolated network could be created in {SUBNET_ATTEMPTS} attempts");
    }

    /// Address `.host` of the network's /24 (`.1` is the bridge).
    pub fn ip(&self, host: u8) -> Ipv4Addr {
        let [a, b, c] = self.prefix;
        Ipv4Addr::new(a, b, c, host)
    }
}

impl Drop for NetGuard {
    fn drop(&mut self) {
        if cleanup::keep_requested() {
            println!("eptest: keeping network {}", self.name);
            return;
        }
        let _ = virsh(&["net-destroy", &self.name]);
        let _ = std::fs::remove_file(format!("/var/lib/libvirt/dnsmasq/{}.status", self.bridge));
    }
}

/// An isolated libvirt network without DHCP (bridge address `.1` of a random /24 of
/// 198.18.0.0/15, no `<dhcp>`, no `<forward>`), plus `::1` of a random ULA /64 added to the
/// bridge by hand (a libvirt network with IPv6 would send router advertisements, and the
/// guests would add addresses of their own); destroyed when dropped.
#[derive(Debug)]
pub struct StaticNet {
    /// The network's name.
    pub name: String,
    /// Its bridge.
    pub bridge: String,
    prefix: [u8; 3],
    prefix6: [u16; 3],
}

impl StaticNet {
    /// Creates the network (a unique name of `test`), trying other /24s on a clash.
    pub fn create(test: &str) -> Self {
        for _ in 0..SUBNET_ATTEMPTS {
            let name = cleanup::unique_name("net", test);
            let bridge = format!("eptbr{:08x}", cleanup::random_u32());
            let r = cleanup::random_u32();
            let prefix = [198, 18 + (r & 1) as u8, (r >> 8) as u8];
            let [a, b, c] = prefix;
            println!(
                "eptest: creating network {name} (bridge {bridge}, {a}.{b}.{c}.0/24, no DHCP)"
            );
            let xml = format!(
                "<network><name>{name}</name><bridge name='{bridge}' stp='off'/>\
                 <ip address='{a}.{b}.{c}.1' netmask='255.255.255.0'/></network>"
            );
            let file = std::env::temp_dir().join(format!("{name}.xml"));
            std::fs::write(&file, xml).unwrap();
            let r6 = cleanup::random_u32();
            let g = Self {
                name,
                bridge,
                prefix,
                prefix6: [0xfd00 | (r6 >> 24) as u16, r6 as u16, (r >> 16) as u16],
            };
            let out = virsh(&["net-create", file.to_str().unwrap()]);
            let _ = std::fs::remove_file(&file);
            if out.status.success() {
                // NB: libvirt turns IPv6 off on the bridge of a network without IPv6.
                run_ok(
                    Command::new("sysctl")
                        .args(["-qw", &format!("net.ipv6.conf.{}.disable_ipv6=0", g.bridge)]),
                );
                run_ok(Command::new("ip").args([
                    "-6",
                    "addr",
                    "add",
                    &format!("{}/64", g.ip6(1)),
                    "dev",
                    &g.bridge,
                    "nodad",
                ]));
                println!("eptest: bridge {} also holds {}/64", g.bridge, g.ip6(1));
                return g;
            }
            println!(
                "eptest: network {} not created: {}",
                g.name,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        panic!("no isolated network could be created");
    }

    /// Address `.host` of the network's /24 (`.1` is the bridge).
    pub fn ip(&self, host: u8) -> Ipv4Addr {
        let [a, b, c] = self.prefix;
        Ipv4Addr::new(a, b, c, host)
    }

    /// Address `::host` of the bridge's IPv6 /64 (`::1` is the bridge).
    pub fn ip6(&self, host: u16) -> Ipv6Addr {
        let [a, b, c] = self.prefix6;
        Ipv6Addr::new(a, b, c, 0, 0, 0, 0, host)
    }
}

impl Drop for StaticNet {
    fn drop(&mut self) {
        if cleanup::keep_requested() {
            println!("eptest: keeping network {}", self.name);
            return;
        }
        let _ = virsh(&["net-destroy", &self.name]);
        let _ = std::fs::remove_file(format!("/var/lib/libvirt/dnsmasq/{}.status", self.bridge));
    }
}

/// Every domain of one provider entry (`ep-<entry>-…`): destroyed and undefined with NVRAM
/// when dropped (the volumes go with the test's pool).
#[derive(Debug)]
pub struct EntryGuard {
    /// The provider entry.
    pub entry: String,
}

impl Drop for EntryGuard {
    fn drop(&mut self) {
        if cleanup::keep_requested() {
            println!("eptest: keeping entry {}'s domains", self.entry);
            return;
        }
        let prefix = format!("ep-{}-", self.entry);
        for d in cleanup::domain_names() {
            if d.starts_with(&prefix) {
                println!("eptest: removing domain {d}");
                cleanup::remove_domain(&d);
                let _ = virsh(&["undefine", &d, "--nvram"]);
            }
        }
        // The entry's network filters, once no domain uses them; twice, since a filter
        // another one references (a filter set's children) is removed after its parent.
        for _ in 0..2 {
            for f in nwfilter_names() {
                if f.starts_with(&format!("{prefix}filter")) {
                    println!("eptest: removing network filter {f}");
                    let _ = virsh(&["nwfilter-undefine", &f]);
                }
            }
        }
    }
}

/// The names of the network filters libvirtd holds.
pub fn nwfilter_names() -> Vec<String> {
    // NB: `nwfilter-list` has no --name: rows are `UUID  NAME`.
    cleanup::names_from(&["nwfilter-list"])
        .into_iter()
        .filter_map(|l| l.split_whitespace().nth(1).map(str::to_owned))
        .filter(|n| n != "Name")
        .collect()
}

/// The volumes of pool `pool`, by name.
pub fn volumes(pool: &str) -> Vec<String> {
    cleanup::names_from(&["vol-list", pool])
        .into_iter()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .filter(|n| n != "Name" && !n.starts_with("---"))
        .collect()
}

/// Removes e2e leftovers: [`cleanup::sweep_once`], domains named `ep-<entry_prefix><secs>…`
/// older than [`cleanup::SWEEP_AGE`], and test networks older than that.
pub fn sweep(entry_prefix: &str) {
    cleanup::sweep_once();
    let now = cleanup::now_secs();
    let domain_prefix = format!("ep-{entry_prefix}");
    for d in cleanup::domain_names() {
        let Some(rest) = d.strip_prefix(&domain_prefix) else {
            continue;
        };
        let secs: Option<u64> = rest.get(..10).and_then(|s| s.parse().ok());
        if secs.is_some_and(|s| now.saturating_sub(s) > cleanup::SWEEP_AGE.as_secs()) {
            println!("eptest: sweeping leftover domain {d}");
            cleanup::remove_domain(&d);
            let _ = virsh(&["undefine", &d, "--nvram"]);
        }
    }
    for f in nwfilter_names() {
        let Some(rest) = f.strip_prefix(&domain_prefix) else {
            continue;
        };
        let secs: Option<u64> = rest.get(..10).and_then(|s| s.parse().ok());
        if secs.is_some_and(|s| now.saturating_sub(s) > cleanup::SWEEP_AGE.as_secs()) {
            println!("eptest: sweeping leftover network filter {f}");
            let _ = virsh(&["nwfilter-undefine", &f]);
        }
    }
    for n in cleanup::names_from(&["net-list", "--all", "--name"]) {
        if cleanup::age_of(&n).is_some_and(|a| a > cleanup::SWEEP_AGE) {
            println!("eptest: sweeping leftover network {n}");
            let _ = virsh(&["net-destroy", &n]);
            let _ = virsh(&["net-undefine", &n]);
        }
    }
}

// ---------------------------------------------------------------- HTTP bits

/// One HTTP/1.1 exchange on a fresh connection from `from` (any when None) to `to`, bounded
/// by [`HTTP_TIMEOUT`].
pub async fn http(
    from: Option<Ipv4Addr>,
    to: SocketAddr,
    request: String,
) -> std::io::Result<String> {
    let sock = TcpSocket::new_v4()?;
    if let Some(ip) = from {
        sock.bind(SocketAddr::V4(SocketAddrV4::new(ip, 0)))?;
    }
    let exchange = async {
        let mut s = sock.connect(to).await?;
        s.write_all(request.as_bytes()).await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&buf).into_owned())
    };
    tokio::time::timeout(HTTP_TIMEOUT, exchange)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "http timeout"))?
}

/// The status code of a raw HTTP/1.1 response.
pub fn status_code(resp: &str) -> Option<u16> {
    resp.get(9..12).and_then(|c| c.parse().ok())
}

/// GET `path` on `addr`; the body of a 200, else `None`.
pub async fn get_body(addr: SocketAddr, path: &str) -> Option<String> {
    let r = http(
        None,
        addr,
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"),
    )
    .await
    .ok()?;
    match crate::http::response(&r)? {
        (200, body) => Some(body),
        _ => None,
    }
}

/// The echo endpoint on `ip` (IPv4 or IPv6): answers every request with `egress=<peer ip>` and records the
/// peers.
pub async fn echo_server(ip: impl Into<IpAddr>) -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let l = TcpListener::bind(SocketAddr::new(ip.into(), 0))
        .await
        .unwrap();
    let addr = l.local_addr().unwrap();
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let s2 = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, peer)) = l.accept().await else {
                return;
            };
            s2.lock().unwrap().push(peer.ip().to_string());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let body = format!("egress={}\n", peer.ip());
                let _ = s
                    .write_all(
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        )
                        .as_bytes(),
                    )
                    .await;
            });
        }
    });
    (addr, seen)
}

// ---------------------------------------------------------------- the image server

/// One GET the image server answered.
#[derive(Debug, Clone, Copy)]
pub struct GetRecord {
    /// When it started.
    pub started: Instant,
    /// When the last byte was written (`None`: the client went away first).
    pub finished: Option<Instant>,
    /// Body bytes written.
    pub sent: u64,
}

struct ImageHostState {
    body: Vec<u8>,
    path: String,
    /// Bytes per second for GETs that start now; 0 = as fast as the client reads.
    throttle: AtomicU64,
    gets: Mutex<Vec<GetRecord>>,
}

/// An image over HTTP/1.1 on 127.0.0.1 at one path, one request per connection, every GET
/// recorded (start, end, bytes sent); a GET that starts while a throttle is set is sent at
/// that rate. Dropping it stops accepting.
pub struct ImageHost {
    /// `http://127.0.0.1:PORT/PATH`.
    pub url: String,
    state: Arc<ImageHostState>,
    task: tokio::task::JoinHandle<()>,
}

impl ImageHost {
    /// Serves `body` at `path` (starting with `/`), throttled to `throttle` B/s (0: none).
    pub async fn start(body: Vec<u8>, path: &str, throttle: u64) -> Self {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}{path}", l.local_addr().unwrap());
        let state = Arc::new(ImageHostState {
            body,
            path: path.to_owned(),
            throttle: AtomicU64::new(throttle),
            gets: Mutex::default(),
        });
        let st = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                tokio::spawn(serve_image(s, st.clone()));
            }
        });
        Self { url, state, task }
    }

    /// GETs that start from now on are not throttled.
    pub fn unthrottle(&self) {
        self.state.throttle.store(0, Ordering::SeqCst);
    }

    /// Every GET so far.
    pub fn gets(&self) -> Vec<GetRecord> {
        self.state.gets.lock().unwrap().clone()
    }
}

impl Drop for ImageHost {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve_image(mut s: TcpStream, st: Arc<ImageHostState>) {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf).await {
            Ok(n) if n > 0 && head.len() + n <= MAX_REQUEST_HEAD => {
                head.extend_from_slice(&buf[..n]);
            }
            _ => return,
        }
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let mut first = text.lines().next().unwrap_or("").split_whitespace();
    let method = first.next().unwrap_or("").to_owned();
    let path = first.next().unwrap_or("").to_owned();
    let len = st.body.len();
    if path != st.path || (method != "GET" && method != "HEAD") {
        let _ = s
            .write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            .await;
        return;
    }
    let ok = format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n");
    if s.write_all(ok.as_bytes()).await.is_err() || method == "HEAD" {
        return;
    }
    let rate = st.throttle.load(Ordering::SeqCst);
    let idx = {
        let mut g = st.gets.lock().unwrap();
        g.push(GetRecord {
            started: Instant::now(),
            finished: None,
            sent: 0,
        });
        g.len() - 1
    };
    for chunk in st.body.chunks(SERVE_CHUNK) {
        if s.write_all(chunk).await.is_err() {
            return; // the client went away: `finished` stays None
        }
        st.gets.lock().unwrap()[idx].sent += chunk.len() as u64;
        if rate > 0 {
            tokio::time::sleep(Duration::from_secs_f64(chunk.len() as f64 / rate as f64)).await;
        }
    }
    let _ = s.shutdown().await;
    st.gets.lock().unwrap()[idx].finished = Some(Instant::now());
}

// ---------------------------------------------------------------- the health check target

/// `egress-proxies echo --listen IP:0` (the health engine's check target); SIGTERM, then
/// SIGKILL after [`STOP_GRACE`], when dropped.
pub struct EchoProcess {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
    // NB: kept open so the echo never writes into a closed pipe.
    _stdout: BufReader<ChildStdout>,
}

impl EchoProcess {
    /// Starts `BIN echo` on `ip` (IPv4 or IPv6), its log in `log`; waits for its `listening on` line.
    pub fn start(bin: &Path, ip: impl Into<IpAddr>, log: &Path) -> Self {
        let ip = ip.into();
        println!("eptest: egress-proxies echo on {ip}, log {}", log.display());
        let mut child = Command::new(bin)
            .arg("echo")
            .args(["--listen", &SocketAddr::new(ip, 0).to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("echo printed {line:?} (see {})", log.display()));
        println!("eptest: echo pid {} listening on {addr}", child.id());
        Self {
            child,
            addr,
            _stdout: out,
        }
    }
}

impl Drop for EchoProcess {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let t0 = Instant::now();
        while t0.elapsed() < STOP_GRACE {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `(key, value)` pairs for [`reexec_in_netns`].
pub fn env(key: &'static str, value: impl Into<OsString>) -> (&'static str, OsString) {
    (key, value.into())
}

#[cfg(test)]
mod tests {
    use super::check_ran_exactly;

    const OK: &str = "running 1 test\ntest the_e2e ... ok\n\n\
                      test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 4 filtered out; finished in 1.00s\n";

    #[test]
    fn a_child_that_ran_exactly_the_named_test_passes_the_check() {
        assert_eq!(check_ran_exactly(OK, "the_e2e"), Ok(()));
        // --nocapture: the test's output follows the name, the verdict comes lines later.
        let nocapture = "running 1 test\ntest the_e2e ... eptest: step 1\neptest: step 2\nok\n\n\
                         test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 4 filtered out; finished in 9.00s\n";
        assert_eq!(check_ran_exactly(nocapture, "the_e2e"), Ok(()));
    }

    #[test]
    fn a_child_that_ran_nothing_another_test_or_an_ignored_one_fails_the_check() {
        let none = "running 0 tests\n\ntest result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 5 filtered out\n";
        assert!(check_ran_exactly(none, "the_e2e").is_err());
        assert!(check_ran_exactly(OK, "another_test").is_err());
        let ignored = "running 1 test\ntest the_e2e ... ignored\n\n\
                       test result: ok. 0 passed; 0 failed; 1 ignored; 0 measured; 4 filtered out\n";
        assert!(check_ran_exactly(ignored, "the_e2e").is_err());
        assert!(check_ran_exactly("", "the_e2e").is_err());
        let twice = format!("{OK}{OK}");
        assert!(check_ran_exactly(&twice, "the_e2e").is_err());
    }
}
