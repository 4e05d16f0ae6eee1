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
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use egress_provider::libvirt::check::CheckOptions;
use egress_provider::libvirt::config::{
    HostConfig, ImageFormat, ImageSpec, LibvirtEntry, Timeouts, VirtType,
};
use egress_provider::libvirt::hostpool::{Connector, HostPool, PoolOptions, SshConnector};
use egress_provider::libvirt::image::fetch::FetchOptions;
use egress_provider::libvirt::provider_impl::LibvirtProvider;
use egress_provider::{CreateRequest, NoProgress, Provider, ProviderError, ProxyUid};
use futures_util::future::BoxFuture;
use libvirt_remote::Transport;
use libvirt_remote::transport::PacketSink;
use sha2::Digest;
use tokio::io::AsyncWrite;

/// Records `(procedure, time)` of every remote CALL sent through it.
#[derive(Clone, Default)]
struct CallLog(Arc<Mutex<Vec<(i32, Instant)>>>);

/// The transport's packet sink, observed: every packet the connection sends is one whole
/// packet, so its header is at its start. The packets pass on untouched (the SSH transport
/// still sends them without a copy).
struct CountingSink {
    inner: Box<dyn PacketSink>,
    log: CallLog,
}

impl PacketSink for CountingSink {
    fn send(&mut self, packet: Bytes) -> BoxFuture<'_, std::io::Result<()>> {
        if let Some(h) = packet.get(..28) {
            let prog = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
            let proc_ = i32::from_be_bytes([h[12], h[13], h[14], h[15]]);
            let mtype = i32::from_be_bytes([h[16], h[17], h[18], h[19]]);
            if prog == 0x2000_8086 && mtype == 0 {
                self.log.0.lock().unwrap().push((proc_, Instant::now()));
            }
        }
        self.inner.send(packet)
    }
    fn flush(&mut self) -> BoxFuture<'_, std::io::Result<()>> {
        self.inner.flush()
    }
    fn into_async_write(self: Box<Self>) -> Box<dyn AsyncWrite + Send + Unpin> {
        self.inner.into_async_write()
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
        let (r, w, kill, peer) = t.into_sink_parts();
        let w = CountingSink {
            inner: w,
            log: self.log.clone(),
        };
        Ok(Transport::with_sink(r, w, kill, peer))
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

/// Serves one file over HTTP/1.1 on 127.0.0.1 (HEAD and GET, Content-Length), from a thread
/// of its own with `sendfile(2)`, like a real image server: the bytes never pass through this
/// process's memory, so the import is charged as little as possible for a server it would not
/// run in production (what is left is the kernel's loopback TCP work on the sending side).
async fn serve_file(path: String) -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let path = path.clone();
            std::thread::spawn(move || {
                use std::io::{Read, Write};
                let mut req = Vec::new();
                let mut b = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = s.read(&mut b).unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    req.extend_from_slice(&b[..n]);
                }
                let len = std::fs::metadata(&path).unwrap().len();
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
                );
                let _ = s.write_all(head.as_bytes());
                if req.starts_with(b"GET") {
                    // NB: `std::io::copy` from a file to a TCP socket does not use sendfile
                    // (measured: 8 KiB read + send pairs, ~0.7 CPU-s per GiB in this
                    // process, charged to the import); sendfile(2) keeps the bytes in the
                    // kernel, as an image server (nginx, a CDN) does.
                    let f = std::fs::File::open(&path).unwrap();
                    let mut left = len;
                    while left > 0 {
                        let want = usize::try_from(left.min(1 << 30)).unwrap();
                        match rustix::fs::sendfile(&s, &f, None, want) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => left -= n as u64,
                        }
                    }
                }
                let _ = s.shutdown(std::net::Shutdown::Both);
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
        maintenance: Default::default(),
        segment: None,
        fence: None,
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
        prefer_egress: Vec::new(),
        lift_internal: true,
        replaces: None,
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
