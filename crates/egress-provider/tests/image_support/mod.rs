//! A hand-rolled HTTP/1.1 image server on 127.0.0.1 for the image-cache tests. It can lie
//! about Content-Length, answer HEAD without a length, truncate or stall a body, redirect,
//! and counts requests per route. One request per connection (`Connection: close`).
//! Hand-written rather than hyper: every lie it tells is one a real server library refuses.

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What HEAD answers.
#[derive(Clone, Debug)]
pub enum Head {
    /// 200 with the true length.
    Length,
    /// 200 with this (possibly false) length.
    Says(u64),
    /// 200 without Content-Length.
    NoLength,
    /// This status, no body.
    Status(u16),
}

/// What GET declares as Content-Length.
#[derive(Clone, Debug)]
pub enum GetLength {
    /// The true length.
    True,
    /// This value, whatever is sent.
    Says(u64),
    /// None: the body ends when the connection closes.
    None,
}

/// One route's behaviour.
#[derive(Clone, Debug)]
pub struct Route {
    pub body: Arc<Vec<u8>>,
    pub head: Head,
    pub get_len: GetLength,
    /// Send only this many body bytes, then close.
    pub truncate_at: Option<usize>,
    /// Send this many body bytes, then hang (until the client gives up).
    pub stall_at: Option<usize>,
    /// Answer 302 to this location.
    pub redirect: Option<String>,
    /// Answer this status to GET.
    pub status: u16,
}

impl Route {
    pub fn new(body: Vec<u8>) -> Self {
        Self {
            body: Arc::new(body),
            head: Head::Length,
            get_len: GetLength::True,
            truncate_at: None,
            stall_at: None,
            redirect: None,
            status: 200,
        }
    }
}

#[derive(Default)]
struct Counts {
    heads: AtomicU64,
    gets: AtomicU64,
    body_bytes: AtomicU64,
}

/// The server. Dropping it stops accepting.
pub struct ImageServer {
    pub addr: SocketAddr,
    routes: Arc<Mutex<HashMap<String, Route>>>,
    counts: Arc<Mutex<HashMap<String, Arc<Counts>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ImageServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ImageServer {
    pub async fn start() -> Self {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let routes: Arc<Mutex<HashMap<String, Route>>> = Arc::default();
        let counts: Arc<Mutex<HashMap<String, Arc<Counts>>>> = Arc::default();
        let (r, c) = (routes.clone(), counts.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((s, _)) = l.accept().await else { return };
                let (r, c) = (r.clone(), c.clone());
                tokio::spawn(async move {
                    let _ = serve(s, r, c).await;
                });
            }
        });
        Self {
            addr,
            routes,
            counts,
            task,
        }
    }

    /// Serves `route` at `path`; returns the URL.
    pub fn route(&self, path: &str, route: Route) -> String {
        self.routes.lock().unwrap().insert(path.into(), route);
        self.counts.lock().unwrap().entry(path.into()).or_default();
        format!("http://{}{path}", self.addr)
    }

    fn c(&self, path: &str) -> Arc<Counts> {
        self.counts
            .lock()
            .unwrap()
            .entry(path.into())
            .or_default()
            .clone()
    }
    pub fn gets(&self, path: &str) -> u64 {
        self.c(path).gets.load(Ordering::SeqCst)
    }
    pub fn heads(&self, path: &str) -> u64 {
        self.c(path).heads.load(Ordering::SeqCst)
    }
    pub fn requests(&self, path: &str) -> u64 {
        self.gets(path) + self.heads(path)
    }
    pub fn body_bytes_sent(&self, path: &str) -> u64 {
        self.c(path).body_bytes.load(Ordering::SeqCst)
    }
}

async fn serve(
    mut s: TcpStream,
    routes: Arc<Mutex<HashMap<String, Route>>>,
    counts: Arc<Mutex<HashMap<String, Arc<Counts>>>>,
) -> std::io::Result<()> {
    let mut req = Vec::new();
    let mut buf = [0u8; 4096];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        req.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&req).to_string();
    let mut first = text.lines().next().unwrap_or("").split_whitespace();
    let method = first.next().unwrap_or("").to_owned();
    let target = first.next().unwrap_or("/").to_owned();
    let path = target.split('?').next().unwrap_or("/").to_owned();
    let route = routes.lock().unwrap().get(&path).cloned();
    let c = counts
        .lock()
        .unwrap()
        .entry(path.clone())
        .or_default()
        .clone();
    let Some(route) = route else {
        s.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            .await?;
        return Ok(());
    };
    let head = method == "HEAD";
    if head {
        c.heads.fetch_add(1, Ordering::SeqCst);
    } else {
        c.gets.fetch_add(1, Ordering::SeqCst);
    }
    if let Some(loc) = &route.redirect {
        let r = format!(
            "HTTP/1.1 302 Found\r\nLocation: {loc}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        s.write_all(r.as_bytes()).await?;
        return Ok(());
    }
    let len = route.body.len() as u64;
    if head {
        let r = match &route.head {
            Head::Length => {
                format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n")
            }
            Head::Says(n) => {
                format!("HTTP/1.1 200 OK\r\nContent-Length: {n}\r\nConnection: close\r\n\r\n")
            }
            Head::NoLength => "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n".to_owned(),
            Head::Status(code) => {
                format!("HTTP/1.1 {code} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            }
        };
        s.write_all(r.as_bytes()).await?;
        return Ok(());
    }
    if route.status != 200 {
        let r = format!(
            "HTTP/1.1 {} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            route.status
        );
        s.write_all(r.as_bytes()).await?;
        return Ok(());
    }
    let cl = match &route.get_len {
        GetLength::True => format!("Content-Length: {len}\r\n"),
        GetLength::Says(n) => format!("Content-Length: {n}\r\n"),
        GetLength::None => String::new(),
    };
    s.write_all(format!("HTTP/1.1 200 OK\r\n{cl}Connection: close\r\n\r\n").as_bytes())
        .await?;
    let limit = route
        .truncate_at
        .or(route.stall_at)
        .unwrap_or(route.body.len())
        .min(route.body.len());
    for chunk in route.body[..limit].chunks(64 << 10) {
        s.write_all(chunk).await?;
        c.body_bytes.fetch_add(chunk.len() as u64, Ordering::SeqCst);
    }
    if route.stall_at.is_some() {
        // Hang until the client closes.
        let _ = s.read(&mut buf).await;
        return Ok(());
    }
    s.shutdown().await?;
    Ok(())
}

/// A minimal qcow2 header declaring `virtual_size`, padded with `pad` bytes of data.
pub fn qcow2(virtual_size: u64, pad: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(512 + pad);
    v.extend_from_slice(b"QFI\xfb");
    v.extend_from_slice(&3u32.to_be_bytes());
    v.extend_from_slice(&[0u8; 12]); // backing file offset and size
    v.extend_from_slice(&16u32.to_be_bytes()); // cluster bits
    v.extend_from_slice(&virtual_size.to_be_bytes());
    v.resize(512, 0);
    v.extend((0..pad).map(|i| (i % 251) as u8));
    v
}

/// Lowercase hex sha256.
pub fn sha(b: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}
