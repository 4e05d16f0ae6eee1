//! In-process proxies on loopback for the health tests and the health benchmark: an HTTP
//! CONNECT proxy (optional basic auth, slow handshake, linger before closing, or silent) and a
//! SOCKS5 proxy (optional username/password). They only ever connect to the address a client
//! names, and the tests only name 127.0.0.1.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    dead_code
)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// How an in-process proxy behaves.
#[derive(Clone, Default)]
pub struct ProxyBehaviour {
    /// `user:password` required (basic auth for HTTP, RFC 1929 for SOCKS5).
    pub credentials: Option<(String, String)>,
    /// Keep the client connection open this long after the target closed (teardown time).
    pub linger: Duration,
    /// Wait this long before accepting a tunnel (a slow proxy).
    pub handshake_delay: Duration,
    /// Accept connections but never answer (a black hole).
    pub silent: bool,
    /// HTTP CONNECT only: connect to targets of its family from this local address (what the
    /// target sees as the caller); `None`, and for targets of the other family: the system's
    /// choice.
    pub source: Option<std::net::IpAddr>,
    /// Close the connections whose number (from 1, in accept order) is in this range at
    /// once, answering nothing (lost probes).
    pub drop: std::ops::Range<usize>,
}

/// A running in-process proxy; stops when dropped.
pub struct TestProxy {
    pub addr: SocketAddr,
    /// Tunnels opened.
    pub tunnels: Arc<AtomicUsize>,
    /// Most handshakes in progress at once (a probe's handshake lies within the probe).
    pub max_in_flight: Arc<AtomicUsize>,
    stop: CancellationToken,
}

impl Drop for TestProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl TestProxy {
    pub fn stop(&self) {
        self.stop.cancel();
    }
}

/// Counts a handshake in progress until dropped.
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn new(now: &Arc<AtomicUsize>, max: &AtomicUsize) -> Self {
        let n = now.fetch_add(1, Ordering::SeqCst) + 1;
        max.fetch_max(n, Ordering::SeqCst);
        Self(Arc::clone(now))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Starts the echo on 127.0.0.1:0; returns its address and a guard token.
pub async fn start_echo() -> (SocketAddr, CancellationToken) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(egress_web::echo::serve(l, stop.clone()));
    (addr, stop)
}

/// An HTTP CONNECT proxy on `bind` (e.g. "127.0.0.1:0").
pub async fn http_proxy(bind: &str, b: ProxyBehaviour) -> TestProxy {
    let l = TcpListener::bind(bind).await.unwrap();
    serve(l, b, false)
}

/// A SOCKS5 proxy on `bind`.
pub async fn socks5_proxy(bind: &str, b: ProxyBehaviour) -> TestProxy {
    let l = TcpListener::bind(bind).await.unwrap();
    serve(l, b, true)
}

/// Serves `l` as an HTTP CONNECT (or SOCKS5) proxy.
pub fn serve(l: TcpListener, b: ProxyBehaviour, socks: bool) -> TestProxy {
    let addr = l.local_addr().unwrap();
    let stop = CancellationToken::new();
    let tunnels = Arc::new(AtomicUsize::new(0));
    let max_in_flight = Arc::new(AtomicUsize::new(0));
    let in_flight = Arc::new(AtomicUsize::new(0));
    let (s2, t2, m2) = (
        stop.clone(),
        Arc::clone(&tunnels),
        Arc::clone(&max_in_flight),
    );
    tokio::spawn(async move {
        let mut accepted = 0usize;
        loop {
            let (c, _) = tokio::select! {
                () = s2.cancelled() => return,
                a = l.accept() => match a { Ok(x) => x, Err(_) => continue },
            };
            accepted += 1;
            if b.drop.contains(&accepted) {
                drop(c);
                continue;
            }
            let (b, t, s3) = (b.clone(), Arc::clone(&t2), s2.clone());
            let guard = InFlight::new(&in_flight, &m2);
            tokio::spawn(async move {
                if b.silent {
                    // Hold the connection, answer nothing.
                    s3.cancelled().await;
                    drop(c);
                    return;
                }
                tokio::select! {
                    () = s3.cancelled() => {}
                    _ = async {
                        if socks {
                            socks_conn(c, &b, &t, guard).await
                        } else {
                            http_conn(c, &b, &t, guard).await
                        }
                    } => {}
                }
            });
        }
    });
    TestProxy {
        addr,
        tunnels,
        max_in_flight,
        stop,
    }
}

/// Connects to `target` (`host:port`), from `source` when given.
async fn connect_from(
    source: Option<std::net::IpAddr>,
    target: &str,
) -> std::io::Result<TcpStream> {
    let Some(src) = source else {
        return TcpStream::connect(target).await;
    };
    let Some(addr) = tokio::net::lookup_host(target)
        .await?
        .find(|a| a.is_ipv4() == src.is_ipv4())
    else {
        // A target of the other family: the system's choice.
        return TcpStream::connect(target).await;
    };
    let socket = if src.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.bind(SocketAddr::new(src, 0))?;
    socket.connect(addr).await
}

async fn relay(mut c: TcpStream, mut up: TcpStream, linger: Duration) -> std::io::Result<()> {
    let (mut cr, mut cw) = c.split();
    let (mut ur, mut uw) = up.split();
    let c2u = tokio::io::copy(&mut cr, &mut uw);
    let u2c = async {
        let mut buf = [0u8; 4096];
        loop {
            let n = ur.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            cw.write_all(&buf[..n]).await?;
        }
        // The target closed: hold the client's connection open (slow teardown).
        tokio::time::sleep(linger).await;
        cw.shutdown().await
    };
    tokio::select! {
        r = u2c => r,
        _ = async { let _ = c2u.await; std::future::pending::<()>().await } => Ok(()),
    }
}

async fn http_conn(
    mut c: TcpStream,
    b: &ProxyBehaviour,
    tunnels: &AtomicUsize,
    guard: InFlight,
) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if c.read(&mut byte).await? == 0 || head.len() > 8192 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head).to_string();
    let target = text
        .strip_prefix("CONNECT ")
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_default()
        .to_owned();
    if let Some((u, p)) = &b.credentials {
        let want = base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"));
        let ok = text
            .lines()
            .any(|l| l.trim() == format!("Proxy-Authorization: Basic {want}"));
        if !ok {
            c.write_all(
                b"HTTP/1.1 407 Proxy Authentication Required\r\n\
                  Proxy-Authenticate: Basic realm=\"t\"\r\nContent-Length: 0\r\n\r\n",
            )
            .await?;
            return Ok(());
        }
    }
    let Ok(up) = connect_from(b.source, &target).await else {
        c.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await?;
        return Ok(());
    };
    tokio::time::sleep(b.handshake_delay).await;
    drop(guard);
    c.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await?;
    tunnels.fetch_add(1, Ordering::SeqCst);
    relay(c, up, b.linger).await
}

async fn socks_conn(
    mut c: TcpStream,
    b: &ProxyBehaviour,
    tunnels: &AtomicUsize,
    guard: InFlight,
) -> std::io::Result<()> {
    let mut h = [0u8; 2];
    c.read_exact(&mut h).await?;
    let mut methods = vec![0u8; usize::from(h[1])];
    c.read_exact(&mut methods).await?;
    if let Some((u, p)) = &b.credentials {
        if !methods.contains(&2) {
            c.write_all(&[5, 0xff]).await?;
            return Ok(());
        }
        c.write_all(&[5, 2]).await?;
        let mut v = [0u8; 2];
        c.read_exact(&mut v).await?;
        let mut user = vec![0u8; usize::from(v[1])];
        c.read_exact(&mut user).await?;
        let mut pl = [0u8; 1];
        c.read_exact(&mut pl).await?;
        let mut pass = vec![0u8; usize::from(pl[0])];
        c.read_exact(&mut pass).await?;
        if user != u.as_bytes() || pass != p.as_bytes() {
            c.write_all(&[1, 1]).await?;
            return Ok(());
        }
        c.write_all(&[1, 0]).await?;
    } else {
        c.write_all(&[5, 0]).await?;
    }
    let mut req = [0u8; 4];
    c.read_exact(&mut req).await?;
    let host = match req[3] {
        1 => {
            let mut a = [0u8; 4];
            c.read_exact(&mut a).await?;
            std::net::Ipv4Addr::from(a).to_string()
        }
        3 => {
            let mut l = [0u8; 1];
            c.read_exact(&mut l).await?;
            let mut n = vec![0u8; usize::from(l[0])];
            c.read_exact(&mut n).await?;
            String::from_utf8_lossy(&n).to_string()
        }
        _ => return Ok(()),
    };
    let mut port = [0u8; 2];
    c.read_exact(&mut port).await?;
    let port = u16::from_be_bytes(port);
    let Ok(up) = TcpStream::connect((host.as_str(), port)).await else {
        c.write_all(&[5, 5, 0, 1, 0, 0, 0, 0, 0, 0]).await?;
        return Ok(());
    };
    tokio::time::sleep(b.handshake_delay).await;
    drop(guard);
    c.write_all(&[5, 0, 0, 1, 0, 0, 0, 0, 0, 0]).await?;
    tunnels.fetch_add(1, Ordering::SeqCst);
    relay(c, up, b.linger).await
}
