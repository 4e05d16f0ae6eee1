//! Real proxy members on loopback for the gateway's tests and the binary's: Debian's
//! `tinyproxy` and `danted` started with the configs `userdata::render` writes into a guest
//! (adapted to loopback), each leaving from its own loopback address so a target tells which
//! member carried a connection; an echo target answering the caller's IP; a "blob" target
//! moving exact byte counts; hand-made HTTP CONNECT and SOCKS5 clients.
//!
//! Every 127.0.0.0/8 address is local on Linux's loopback, so member `i` binds its outgoing
//! connections to `127.0.0.(20+i)` (tinyproxy `Bind`, dante `external`). dante's username
//! method checks the system's password files: each dante member runs in a private mount
//! namespace (`unshare -m`) where copies of /etc/passwd and /etc/shadow with its user are
//! mounted, so nothing on this machine changes. Every child runs in its own process group,
//! killed (the whole group) on drop. Needs root and the packages of .ci/setup-host.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use egress_core::controller::ProxyCredentials;
use egress_core::controller::userdata::render;
use egress_core::model::{ProxyProtocol, ProxySettings};
use egress_core::proxy_policy::GuestPolicy;
use egress_provider::libvirt::config::ProxyPolicy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Bound on a daemon starting to listen (loopback: milliseconds; a loaded machine: seconds).
pub const START_DEADLINE: Duration = Duration::from_secs(20);
/// Bound on one client exchange through the gateway.
pub const IO_DEADLINE: Duration = Duration::from_secs(20);

pub fn require(bin: &str) {
    assert!(
        Path::new(bin).exists(),
        "{bin} is missing: run `bash .ci/setup-host` (it installs tinyproxy and dante-server)"
    );
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The egress address of member `i`.
pub fn egress(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, 20 + i)
}

pub fn creds(user: &str, password: &str) -> ProxyCredentials {
    ProxyCredentials {
        username: user.into(),
        password: password.into(),
    }
}

fn staged(user_data: &str, name: &str) -> String {
    let v: serde_json::Value = serde_saphyr::from_str(user_data).unwrap();
    v["write_files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"].as_str().unwrap().ends_with(name))
        .unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The targets are on loopback, which a guest's policy denies; the entry lifts it.
/// The entry's policy with loopback lifted, and CONNECT to every port: the tests' targets
/// listen on ephemeral ports (the operator renders 443, 80 and its health targets' ports
/// when no port list is set; an empty list renders no `ConnectPort`, which tinyproxy takes
/// as every port).
fn loopback_allowed() -> GuestPolicy {
    let mut p = GuestPolicy::from_entry(&ProxyPolicy {
        allowed_internal_cidrs: vec!["127.0.0.0/8".into()],
        ..ProxyPolicy::default()
    });
    p.connect_default.clear();
    p
}

/// A member daemon: a child in its own process group, killed on drop.
pub struct Daemon {
    child: Option<tokio::process::Child>,
    pub addr: SocketAddr,
    pub egress: Ipv4Addr,
    pub protocol: ProxyProtocol,
    pub creds: ProxyCredentials,
    pub uid: String,
    _dir: tempfile::TempDir,
}

impl Daemon {
    /// Kills the daemon (its whole process group) and waits for it.
    pub async fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            if let Some(pid) = c.id() {
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", "--", &format!("-{pid}")])
                    .status();
            }
            let _ = c.kill().await;
            let _ = c.wait().await;
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            if let Some(pid) = c.id() {
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", "--", &format!("-{pid}")])
                    .status();
            }
            let _ = c.start_kill();
        }
    }
}

/// Waits (at most [`START_DEADLINE`]) until `addr` accepts connections.
pub async fn wait_listening(addr: SocketAddr) {
    let t0 = Instant::now();
    while TcpStream::connect(addr).await.is_err() {
        assert!(t0.elapsed() < START_DEADLINE, "{addr} never listened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn spawn(cmd: &mut tokio::process::Command) -> tokio::process::Child {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .stdin(Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// tinyproxy with the rendered config and basic auth, on 127.0.0.1, leaving from
/// [`egress`]`(i)`.
pub async fn tinyproxy(i: u8, user: &str, password: &str) -> Daemon {
    tinyproxy_with(i, user, password, None).await
}

/// [`tinyproxy`] with `MaxClients` raised to `max_clients` (the benchmark's idle tunnels).
pub async fn tinyproxy_with(i: u8, user: &str, password: &str, max_clients: Option<u32>) -> Daemon {
    let listen = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
    tinyproxy_on(listen, i, user, password, max_clients).await
}

/// [`tinyproxy`] listening on `listen` (an address of a network namespace where a member's
/// guest address is local), leaving from [`egress`]`(i)`.
pub async fn tinyproxy_at(listen: SocketAddr, i: u8, user: &str, password: &str) -> Daemon {
    tinyproxy_on(listen, i, user, password, None).await
}

async fn tinyproxy_on(
    listen: SocketAddr,
    i: u8,
    user: &str,
    password: &str,
    max_clients: Option<u32>,
) -> Daemon {
    require("/usr/bin/tinyproxy");
    let port = listen.port();
    let c = creds(user, password);
    let settings = ProxySettings {
        port,
        protocol: ProxyProtocol::Http,
        ..ProxySettings::default()
    };
    let ud = render(&settings, Some(&c), &loopback_allowed()).unwrap();
    let mut rendered = staged(&ud, "tinyproxy.conf");
    if let Some(n) = max_clients {
        rendered = rendered.replace("MaxClients 100", &format!("MaxClients {n}"));
    }
    let conf = format!("Listen {}\nBind {}\n{rendered}", listen.ip(), egress(i));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tinyproxy.conf");
    std::fs::write(&path, conf).unwrap();
    let child = spawn(
        tokio::process::Command::new("/usr/bin/tinyproxy")
            .arg("-d")
            .arg("-c")
            .arg(&path),
    );
    let addr = listen;
    wait_listening(addr).await;
    Daemon {
        child: Some(child),
        addr,
        egress: egress(i),
        protocol: ProxyProtocol::Http,
        creds: c,
        uid: format!("uid-tinyproxy-{i}"),
        _dir: dir,
    }
}

/// danted with the rendered config and username auth, on 127.0.0.1, leaving from
/// [`egress`]`(i)`; its user exists only in its private mount namespace.
pub async fn danted(i: u8, user: &str, password: &str) -> Daemon {
    require("/usr/sbin/danted");
    let port = free_port();
    let c = creds(user, password);
    let settings = ProxySettings {
        port,
        protocol: ProxyProtocol::Socks5,
        ..ProxySettings::default()
    };
    let ud = render(&settings, Some(&c), &loopback_allowed()).unwrap();
    let conf = staged(&ud, "danted.conf")
        .replace("@EXTERNAL@", &egress(i).to_string())
        .replace("internal: 0.0.0.0", "internal: 127.0.0.1")
        .replace("logoutput: syslog", "logoutput: stderr");
    let dir = tempfile::tempdir().unwrap();
    let conf_path = dir.path().join("danted.conf");
    std::fs::write(&conf_path, conf).unwrap();
    let hash = std::process::Command::new("openssl")
        .args(["passwd", "-6", "-salt", "egressgw", password])
        .output()
        .unwrap();
    assert!(hash.status.success(), "openssl passwd failed");
    let hash = String::from_utf8(hash.stdout).unwrap();
    let passwd = format!(
        "{}{user}:x:64999:64999::/nonexistent:/usr/sbin/nologin\n",
        std::fs::read_to_string("/etc/passwd").unwrap()
    );
    let shadow = format!(
        "{}{user}:{}:19000:0:99999:7:::\n",
        std::fs::read_to_string("/etc/shadow").unwrap(),
        hash.trim()
    );
    std::fs::write(dir.path().join("passwd"), passwd).unwrap();
    std::fs::write(dir.path().join("shadow"), shadow).unwrap();
    let child = spawn(
        tokio::process::Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "sh", "-euc"])
            .arg(
                "mount --bind \"$1/passwd\" /etc/passwd\n\
                 mount --bind \"$1/shadow\" /etc/shadow\n\
                 exec /usr/sbin/danted -f \"$1/danted.conf\" -N 1",
            )
            .arg("sh")
            .arg(dir.path()),
    );
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    wait_listening(addr).await;
    Daemon {
        child: Some(child),
        addr,
        egress: egress(i),
        protocol: ProxyProtocol::Socks5,
        creds: c,
        uid: format!("uid-danted-{i}"),
        _dir: dir,
    }
}

/// The echo target on 127.0.0.1 (answers GET with the caller's IP); stops when dropped.
pub struct Echo {
    pub addr: SocketAddr,
    stop: CancellationToken,
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

pub async fn echo() -> Echo {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(egress_web::echo::serve(l, stop.clone()));
    Echo { addr, stop }
}

/// The blob target: reads a 16-byte header (bytes it will receive, bytes it will send, both
/// u64 big-endian), reads that many bytes, sends that many, then closes.
pub struct Blob {
    pub addr: SocketAddr,
    stop: CancellationToken,
}

impl Drop for Blob {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

pub async fn blob() -> Blob {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let stop = CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(async move {
        loop {
            let (mut c, _) = tokio::select! {
                () = s.cancelled() => return,
                a = l.accept() => a.unwrap(),
            };
            tokio::spawn(async move {
                let mut h = [0u8; 16];
                if c.read_exact(&mut h).await.is_err() {
                    return;
                }
                let up = u64::from_be_bytes(h[..8].try_into().unwrap());
                let down = u64::from_be_bytes(h[8..].try_into().unwrap());
                let mut sink = vec![0u8; 64 * 1024];
                let mut got = 0;
                while got < up {
                    let want = (up - got).min(sink.len() as u64) as usize;
                    match c.read(&mut sink[..want]).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got += n as u64,
                    }
                }
                let chunk = vec![0x5a; 64 * 1024];
                let mut sent = 0;
                while sent < down {
                    let n = (down - sent).min(chunk.len() as u64) as usize;
                    if c.write_all(&chunk[..n]).await.is_err() {
                        return;
                    }
                    sent += n as u64;
                }
                let _ = c.shutdown().await;
            });
        }
    });
    Blob { addr, stop }
}

/// `base64(user:password)`, as a Basic `Proxy-Authorization` carries it.
pub fn basic(user: &str, password: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
}

/// Reads an HTTP head (up to `\r\n\r\n`) byte by byte; returns it as text.
pub async fn read_head(s: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match tokio::time::timeout(IO_DEADLINE, s.read(&mut b))
            .await
            .unwrap()
        {
            Ok(1) => head.push(b[0]),
            _ => break,
        }
        assert!(head.len() < 16384);
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// Opens a CONNECT tunnel to `target` through the gateway's HTTP listener: `Ok(stream)` on
/// 200, `Err(the reply head and body)` otherwise.
pub async fn http_tunnel(
    gw: SocketAddr,
    user: &str,
    password: &str,
    target: &str,
) -> Result<TcpStream, String> {
    let mut s = TcpStream::connect(gw).await.unwrap();
    let req = format!(
        "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic {}\r\n\r\n",
        basic(user, password)
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let head = read_head(&mut s).await;
    if head.starts_with("HTTP/1.1 200") {
        return Ok(s);
    }
    let mut rest = String::new();
    let _ = tokio::time::timeout(IO_DEADLINE, s.read_to_string(&mut rest)).await;
    Err(format!("{head}{rest}"))
}

/// Opens a SOCKS5 tunnel: `Ok(stream)`, or `Err(the failing step and code)`.
pub async fn socks_tunnel(
    gw: SocketAddr,
    user: &str,
    password: &str,
    target: SocketAddr,
) -> Result<TcpStream, String> {
    let mut s = TcpStream::connect(gw).await.unwrap();
    s.write_all(&[5, 1, 2]).await.unwrap();
    let mut r = [0u8; 2];
    tokio::time::timeout(IO_DEADLINE, s.read_exact(&mut r))
        .await
        .unwrap()
        .map_err(|e| format!("greeting: {e}"))?;
    if r != [5, 2] {
        return Err(format!("method reply {r:?}"));
    }
    let mut m = vec![1, user.len() as u8];
    m.extend_from_slice(user.as_bytes());
    m.push(password.len() as u8);
    m.extend_from_slice(password.as_bytes());
    s.write_all(&m).await.unwrap();
    tokio::time::timeout(IO_DEADLINE, s.read_exact(&mut r))
        .await
        .unwrap()
        .map_err(|e| format!("auth: {e}"))?;
    if r != [1, 0] {
        return Err(format!("auth status {r:?}"));
    }
    let IpAddr::V4(ip) = target.ip() else {
        panic!("v4 targets only")
    };
    let mut q = vec![5, 1, 0, 1];
    q.extend_from_slice(&ip.octets());
    q.extend_from_slice(&target.port().to_be_bytes());
    s.write_all(&q).await.unwrap();
    let mut rep = [0u8; 10];
    tokio::time::timeout(IO_DEADLINE, s.read_exact(&mut rep))
        .await
        .unwrap()
        .map_err(|e| format!("request: {e}"))?;
    if rep[1] != 0 {
        return Err(format!("reply code {}", rep[1]));
    }
    Ok(s)
}

/// Sends `GET /` to the echo over an open tunnel; returns the IP it saw.
pub async fn echo_ip(mut s: TcpStream, echo: SocketAddr) -> String {
    let req = format!("GET / HTTP/1.1\r\nHost: {echo}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut resp = String::new();
    tokio::time::timeout(IO_DEADLINE, s.read_to_string(&mut resp))
        .await
        .unwrap()
        .unwrap();
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    resp.rsplit("\r\n\r\n").next().unwrap().trim().to_owned()
}

/// Moves `up` bytes to the blob and reads its `down` bytes back over an open tunnel.
pub async fn blob_exchange(mut s: TcpStream, up: u64, down: u64) {
    let mut h = [0u8; 16];
    h[..8].copy_from_slice(&up.to_be_bytes());
    h[8..].copy_from_slice(&down.to_be_bytes());
    s.write_all(&h).await.unwrap();
    let chunk = vec![0xa5u8; 64 * 1024];
    let mut sent = 0;
    while sent < up {
        let n = (up - sent).min(chunk.len() as u64) as usize;
        s.write_all(&chunk[..n]).await.unwrap();
        sent += n as u64;
    }
    let mut got = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match tokio::time::timeout(IO_DEADLINE, s.read(&mut buf))
            .await
            .unwrap()
        {
            Ok(0) => break,
            Ok(n) => got += n as u64,
            Err(e) => panic!("blob read: {e}"),
        }
    }
    assert_eq!(got, down);
}
