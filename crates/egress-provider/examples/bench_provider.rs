//! The provider benchmark behind `scripts/bench provider`:
//!   1. import: create a proxy whose base image (`--image-file`, raw) is not cached yet: the
//!      image is served by a local HTTP server in this process, downloaded, streamed into the
//!      pool through SSH, verified and published. Prints the time, throughput and the growth
//!      of this process's peak RSS (VmHWM) during it.
//!   2. cached: create a second proxy with the base cached; prints the wall time and every RPC
//!      call the provider sent (counted on the wire across all its connections), in order.
//!
//! Both proxies are deleted at the end (the bases stay in the pool, which the script removes).
//!
//! Usage: `bench_provider --host H --port P --user U --key K --known-hosts F --pool POOL
//! --image-file FILE`
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use async_trait::async_trait;
use egress_provider::libvirt::check::CheckOptions;
use egress_provider::libvirt::config::{
    HostConfig, ImageFormat, ImageSpec, LibvirtEntry, Timeouts, VirtType,
};
use egress_provider::libvirt::hostpool::{Connector, HostPool, PoolOptions, SshConnector};
use egress_provider::libvirt::image::fetch::FetchOptions;
use egress_provider::libvirt::provider_impl::LibvirtProvider;
use egress_provider::{CreateRequest, NoProgress, Provider, ProviderError, ProxyUid};
use libvirt_remote::Transport;
use sha2::Digest;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Records `(procedure, time)` of every remote CALL written through it.
#[derive(Clone, Default)]
struct CallLog(Arc<Mutex<Vec<(i32, Instant)>>>);

struct CountingWriter {
    inner: Box<dyn AsyncWrite + Send + Unpin>,
    log: CallLog,
    header: Vec<u8>,
    skip: usize,
}

impl CountingWriter {
    fn observe(&mut self, mut buf: &[u8]) {
        while !buf.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(buf.len());
                self.skip -= n;
                buf = &buf[n..];
                continue;
            }
            let need = 28 - self.header.len();
            let n = need.min(buf.len());
            self.header.extend_from_slice(&buf[..n]);
            buf = &buf[n..];
            if self.header.len() == 28 {
                let h = &self.header;
                let len = u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize;
                let prog = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
                let proc_ = i32::from_be_bytes([h[12], h[13], h[14], h[15]]);
                let mtype = i32::from_be_bytes([h[16], h[17], h[18], h[19]]);
                if prog == 0x2000_8086 && mtype == 0 {
                    self.log.0.lock().unwrap().push((proc_, Instant::now()));
                }
                self.skip = len.saturating_sub(28);
                self.header.clear();
            }
        }
    }
}

impl AsyncWrite for CountingWriter {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            self.observe(&buf[..n]);
        }
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

struct CountingConnector {
    inner: SshConnector,
    log: CallLog,
}

#[async_trait]
impl Connector for CountingConnector {
    async fn connect(&self, host: &HostConfig) -> Result<Transport, ProviderError> {
        let t = self.inner.connect(host).await?;
        let (r, w, kill, peer) = t.into_parts();
        let w = CountingWriter {
            inner: w,
            log: self.log.clone(),
            header: Vec::with_capacity(28),
            skip: 0,
        };
        Ok(Transport::new(r, w, kill, peer))
    }
}

/// User + system CPU seconds of this process (all threads), from /proc/self/stat.
fn cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of stat(5) (utime, stime), counted from field 3 here; 100 ticks/s.
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0
}

fn vm_hwm_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Serves one file over HTTP/1.1 on 127.0.0.1 (HEAD and GET, Content-Length).
async fn serve_file(path: String) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            let path = path.clone();
            tokio::spawn(async move {
                let mut req = Vec::new();
                let mut b = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = s.read(&mut b).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    req.extend_from_slice(&b[..n]);
                }
                let len = std::fs::metadata(&path).unwrap().len();
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
                );
                let _ = s.write_all(head.as_bytes()).await;
                if req.starts_with(b"GET") {
                    // NB: 1 MiB reads: tokio's file I/O costs a blocking-pool hop per read,
                    // and 8 KiB reads made this server, not the provider, the bottleneck.
                    let f = tokio::fs::File::open(&path).await.unwrap();
                    let mut f = tokio::io::BufReader::with_capacity(1 << 20, f);
                    let _ = tokio::io::copy_buf(&mut f, &mut s).await;
                }
                let _ = s.shutdown().await;
            });
        }
    });
    format!("http://{addr}/image.raw")
}

fn name_of(p: i32) -> &'static str {
    use libvirt_remote::proto::procs::*;
    match p {
        AUTH_LIST => "AUTH_LIST",
        CONNECT_OPEN => "CONNECT_OPEN",
        CONNECT_SUPPORTS_FEATURE => "CONNECT_SUPPORTS_FEATURE",
        DOMAIN_LOOKUP_BY_NAME => "DOMAIN_LOOKUP_BY_NAME",
        STORAGE_POOL_LOOKUP_BY_NAME => "STORAGE_POOL_LOOKUP_BY_NAME",
        STORAGE_VOL_LOOKUP_BY_NAME => "STORAGE_VOL_LOOKUP_BY_NAME",
        STORAGE_VOL_GET_INFO => "STORAGE_VOL_GET_INFO",
        STORAGE_VOL_GET_PATH => "STORAGE_VOL_GET_PATH",
        STORAGE_VOL_GET_XML_DESC => "STORAGE_VOL_GET_XML_DESC",
        STORAGE_POOL_REFRESH => "STORAGE_POOL_REFRESH",
        STORAGE_POOL_GET_INFO => "STORAGE_POOL_GET_INFO",
        STORAGE_VOL_CREATE_XML => "STORAGE_VOL_CREATE_XML",
        STORAGE_VOL_UPLOAD => "STORAGE_VOL_UPLOAD",
        STORAGE_VOL_DELETE => "STORAGE_VOL_DELETE",
        STORAGE_VOL_CREATE_XML_FROM => "STORAGE_VOL_CREATE_XML_FROM",
        DOMAIN_DEFINE_XML_FLAGS => "DOMAIN_DEFINE_XML_FLAGS",
        DOMAIN_CREATE => "DOMAIN_CREATE",
        DOMAIN_GET_STATE => "DOMAIN_GET_STATE",
        DOMAIN_GET_METADATA => "DOMAIN_GET_METADATA",
        DOMAIN_INTERFACE_ADDRESSES => "DOMAIN_INTERFACE_ADDRESSES",
        CONNECT_GET_CAPABILITIES => "CONNECT_GET_CAPABILITIES",
        CONNECT_GET_DOMAIN_CAPABILITIES => "CONNECT_GET_DOMAIN_CAPABILITIES",
        _ => "other",
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut o = HashMap::new();
    for kv in args.chunks(2) {
        o.insert(kv[0].trim_start_matches("--").to_string(), kv[1].clone());
    }
    let file = o["image-file"].clone();
    eprintln!("hashing {file} ...");
    let hash_t0 = Instant::now();
    let hash_cpu0 = cpu_secs();
    let bytes_len = std::fs::metadata(&file).unwrap().len();
    let digest = {
        let mut h = sha2::Sha256::new();
        let mut f = std::fs::File::open(&file).unwrap();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = std::io::Read::read(&mut f, &mut buf).unwrap();
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
        h.finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    println!(
        "sha2 (this build, one core): {:.2} s wall, {:.2} s CPU per {} MiB ({:.0} MiB/s)",
        hash_t0.elapsed().as_secs_f64(),
        cpu_secs() - hash_cpu0,
        bytes_len >> 20,
        bytes_len as f64 / hash_t0.elapsed().as_secs_f64() / 1048576.0
    );
    let url = serve_file(file).await;
    let mut images = BTreeMap::new();
    images.insert(
        "big".to_string(),
        ImageSpec {
            url,
            sha256: Some(digest),
            format: ImageFormat::Raw,
            firmware: Default::default(),
            ca_file: None,
        },
    );
    let host = HostConfig {
        name: "h1".into(),
        address: format!("{}:{}", o["host"], o["port"]),
        user: o["user"].clone(),
        socket: "/run/libvirt/libvirt-sock".into(),
        pool: o["pool"].clone(),
        bridge: None,
        network: None,
        virt_type: VirtType::Qemu,
        pool_reserve_gib: 0,
        ssh_key_file: Some(o["key"].clone().into()),
        known_hosts_file: Some(o["known-hosts"].clone().into()),
        max_concurrent: 4,
        guest_cidr: Vec::new(),
        address_pool: None,
        host_addresses: Vec::new(),
        capacity: Default::default(),
        access: None,
    };
    let entry = LibvirtEntry {
        name: "epbench".into(),
        hosts: vec![host],
        images,
        url_images: Default::default(),
        max_image_bytes: 4 << 30,
        guest: Default::default(),
        timeouts: Timeouts::default(),
        defaults: Default::default(),
        limits: Default::default(),
        policy: Default::default(),
        access: None,
        quotas: Default::default(),
    };
    let log = CallLog::default();
    let t = Timeouts::default();
    let connector = Arc::new(CountingConnector {
        inner: SshConnector::new(&t),
        log: log.clone(),
    });
    let pool = HostPool::new(entry, connector, PoolOptions::default()).unwrap();
    let p = LibvirtProvider::new(pool, FetchOptions::default(), CheckOptions::default());
    let req = |uid: ProxyUid| CreateRequest {
        uid,
        display_name: "bench/p".into(),
        host: "h1".into(),
        image: "big".into(),
        disk_gib: bytes_len.div_ceil(1 << 30) + 1,
        memory_mib: 128,
        vcpus: 1,
        user_data: "#cloud-config\n{}\n".into(),
        pinned_egress: Vec::new(),
        reserved: Vec::new(),
        lift_internal: true,
    };
    let (ua, ub) = (
        ProxyUid(uuid::Uuid::new_v4()),
        ProxyUid(uuid::Uuid::new_v4()),
    );

    let hwm0 = vm_hwm_kib();
    let cpu0 = cpu_secs();
    let t0 = Instant::now();
    p.create(&req(ua), &NoProgress).await.unwrap();
    let import = t0.elapsed().as_secs_f64();
    let hwm1 = vm_hwm_kib();
    println!(
        "import+create: this process (HTTP server + client, sha256, SSH cipher) used {:.2} s CPU",
        cpu_secs() - cpu0
    );
    println!(
        "import+create: {import:.3} s for {bytes_len} bytes ({:.1} MiB/s); peak RSS {} MiB -> {} MiB (+{} MiB)",
        bytes_len as f64 / import / 1048576.0,
        hwm0 / 1024,
        hwm1 / 1024,
        hwm1.saturating_sub(hwm0) / 1024
    );

    // Where the import's time went: every RPC that followed a gap of more than 50 ms.
    let mut prev = t0;
    for (proc_, at) in log.0.lock().unwrap().iter() {
        let gap = at.duration_since(prev);
        if gap.as_millis() > 50 {
            println!(
                "  import: {:>8.1} ms before {:>3} {}",
                gap.as_secs_f64() * 1000.0,
                proc_,
                name_of(*proc_)
            );
        }
        prev = *at;
    }
    println!(
        "  import: {:>8.1} ms after the last call",
        t0.elapsed()
            .saturating_sub(prev.duration_since(t0))
            .as_secs_f64()
            * 1000.0
            - (t0.elapsed().as_secs_f64() - import) * 1000.0
    );
    log.0.lock().unwrap().clear();
    let t1 = Instant::now();
    p.create(&req(ub), &NoProgress).await.unwrap();
    let cached = t1.elapsed();
    let calls = log.0.lock().unwrap().clone();
    println!(
        "cached create: {:.3} s, {} RPC calls:",
        cached.as_secs_f64(),
        calls.len()
    );
    let mut prev = t1;
    for (proc_, at) in &calls {
        println!(
            "  +{:>7.2} ms  {:>3} {}",
            at.duration_since(prev).as_secs_f64() * 1000.0,
            proc_,
            name_of(*proc_)
        );
        prev = *at;
    }
    println!(
        "  +{:>7.2} ms  (until create returned)",
        cached.saturating_sub(prev.duration_since(t1)).as_secs_f64() * 1000.0
    );
    p.delete("h1", &ua).await.unwrap();
    p.delete("h1", &ub).await.unwrap();
}
