//! Catalogue images over https **without a pinned sha256** (allowed: "https unless a digest is
//! pinned"), downloaded for real from a local TLS server whose certificate is signed by a
//! throwaway CA (rcgen), trusted through the entry's `images.<key>.caFile`:
//! against libvirt-fake (import, digest-bound name, reuse, marker, one CA read per provider,
//! untrusted certificate, unreadable caFile, plain http refused) and against the real libvirtd
//! through a real sshd (base published, TCG domain created on it, everything cleaned up).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod image_support;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use egress_provider::libvirt::check::CheckOptions;
use egress_provider::libvirt::config::{
    HostConfig, ImageFormat, ImageSpec, LibvirtEntry, Timeouts, VirtType,
};
use egress_provider::libvirt::hostpool::{Connector, HostPool, PoolOptions, SshConnector};
use egress_provider::libvirt::image::cache;
use egress_provider::libvirt::image::fetch::FetchOptions;
use egress_provider::libvirt::names::{self, ImageSource};
use egress_provider::libvirt::provider_impl::LibvirtProvider;
use egress_provider::{CreateRequest, ErrorClass, NoProgress, Provider, ProviderError, ProxyUid};
use ep_test_support::cleanup::{self, PoolFixture};
use ep_test_support::sshd::Sshd;
use image_support::{ImageServer, Route, qcow2, sha};
use libvirt_fake::{FakeLibvirt, PoolSpec};
use libvirt_remote::Transport;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

const GIB: u64 = 1 << 30;
const POOL: &str = "images";

// ------------------------------------------------------------------ a throwaway PKI

/// A CA (its PEM, written to `ca.pem` in a temp dir) and a server certificate it signed for
/// `localhost` and `127.0.0.1`.
struct Pki {
    dir: tempfile::TempDir,
    ca_file: PathBuf,
    server: Arc<ServerConfig>,
}

fn pki() -> Pki {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "eptest private mirror CA");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);

    let leaf_key = KeyPair::generate().unwrap();
    let mut leaf =
        CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    leaf.distinguished_name
        .push(DnType::CommonName, "eptest mirror");
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer).unwrap();

    let dir = tempfile::Builder::new()
        .prefix("eptest-pki-")
        .tempdir()
        .unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca_cert.pem()).unwrap();
    let provider = Arc::new(tokio_rustls::rustls::crypto::aws_lc_rs::default_provider());
    let server = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf_cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der())),
        )
        .unwrap();
    Pki {
        dir,
        ca_file,
        server: Arc::new(server),
    }
}

// ------------------------------------------------------------------ a tiny https server

/// What a path answers.
#[derive(Clone)]
enum Reply {
    /// 200 with this body (true Content-Length; HEAD gets the length only).
    Body(Arc<Vec<u8>>),
    /// 302 to this location.
    Redirect(String),
}

#[derive(Default)]
struct Stats {
    /// TCP connections accepted.
    accepts: AtomicU64,
    /// Completed TLS handshakes.
    handshakes: AtomicU64,
    /// Handshakes the client aborted (it did not trust us).
    refused_handshakes: AtomicU64,
    /// GETs answered, per path.
    gets: Mutex<HashMap<String, u64>>,
}

/// HTTPS on 127.0.0.1 with the PKI's server certificate. One request per connection.
struct TlsServer {
    port: u16,
    routes: Arc<Mutex<HashMap<String, Reply>>>,
    stats: Arc<Stats>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TlsServer {
    async fn start(config: Arc<ServerConfig>) -> Self {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let routes: Arc<Mutex<HashMap<String, Reply>>> = Arc::default();
        let stats: Arc<Stats> = Arc::default();
        let acceptor = TlsAcceptor::from(config);
        let (r, st) = (routes.clone(), stats.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = l.accept().await else {
                    return;
                };
                st.accepts.fetch_add(1, Ordering::SeqCst);
                let (acceptor, r, st) = (acceptor.clone(), r.clone(), st.clone());
                tokio::spawn(async move {
                    match acceptor.accept(tcp).await {
                        Ok(tls) => {
                            st.handshakes.fetch_add(1, Ordering::SeqCst);
                            let _ = serve(tls, &r, &st).await;
                        }
                        Err(_) => {
                            st.refused_handshakes.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                });
            }
        });
        Self {
            port,
            routes,
            stats,
            task,
        }
    }

    /// Serves `reply` at `path`; returns its https URL (by IP literal).
    fn route(&self, path: &str, reply: Reply) -> String {
        self.routes.lock().unwrap().insert(path.into(), reply);
        format!("https://127.0.0.1:{}{path}", self.port)
    }

    fn gets(&self, path: &str) -> u64 {
        *self.stats.gets.lock().unwrap().get(path).unwrap_or(&0)
    }

    fn handshakes(&self) -> u64 {
        self.stats.handshakes.load(Ordering::SeqCst)
    }

    fn accepts(&self) -> u64 {
        self.stats.accepts.load(Ordering::SeqCst)
    }

    /// Waits (bounded) until the server has seen a handshake the client aborted: the server
    /// learns it from the client's alert, after the client has already returned.
    async fn saw_a_refused_handshake(&self) -> bool {
        for _ in 0..500 {
            if self.stats.refused_handshakes.load(Ordering::SeqCst) > 0 {
                return true;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        false
    }
}

async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    routes: &Mutex<HashMap<String, Reply>>,
    stats: &Stats,
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
    let reply = routes.lock().unwrap().get(&path).cloned();
    match reply {
        None => {
            s.write_all(
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            )
            .await?;
        }
        Some(Reply::Redirect(loc)) => {
            let r = format!(
                "HTTP/1.1 302 Found\r\nLocation: {loc}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            s.write_all(r.as_bytes()).await?;
        }
        Some(Reply::Body(body)) => {
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            s.write_all(head.as_bytes()).await?;
            if method != "HEAD" {
                *stats.gets.lock().unwrap().entry(path).or_default() += 1;
                for chunk in body.chunks(64 << 10) {
                    s.write_all(chunk).await?;
                }
            }
        }
    }
    s.flush().await?;
    s.shutdown().await?;
    Ok(())
}

// ------------------------------------------------------------------ fake-backed provider

struct FakeConnector(FakeLibvirt);

#[async_trait]
impl Connector for FakeConnector {
    async fn connect(&self, _host: &HostConfig) -> Result<Transport, ProviderError> {
        Ok(self.0.connect_duplex())
    }
}

fn fake_host() -> HostConfig {
    HostConfig {
        name: "h1".into(),
        address: "h1.invalid".into(),
        user: "root".into(),
        socket: "/run/libvirt/libvirt-sock".into(),
        pool: POOL.into(),
        bridge: None,
        network: None,
        virt_type: VirtType::Qemu,
        pool_reserve_gib: 1,
        ssh_key_file: None,
        known_hosts_file: None,
        max_concurrent: 4,
        guest_cidr: Vec::new(),
        address_pool: None,
        maintenance: Default::default(),
        segment: None,
        fence: None,
        host_addresses: Vec::new(),
        capacity: Default::default(),
        access: None,
    }
}

/// An unpinned catalogue entry (`sha256` absent) for `url`, trusting `ca_file`.
fn unpinned(url: &str, ca_file: Option<&Path>) -> ImageSpec {
    ImageSpec {
        url: url.into(),
        sha256: None,
        format: ImageFormat::Qcow2,
        firmware: Default::default(),
        ca_file: ca_file.map(Path::to_path_buf),
    }
}

fn entry_with(name: &str, host: HostConfig, images: BTreeMap<String, ImageSpec>) -> LibvirtEntry {
    LibvirtEntry {
        name: name.into(),
        hosts: vec![host],
        images,
        url_images: Default::default(),
        max_image_bytes: GIB,
        guest: Default::default(),
        timeouts: Timeouts::default(),
        defaults: Default::default(),
        limits: Default::default(),
        policy: Default::default(),
        access: None,
        quotas: Default::default(),
    }
}

/// A provider over a fresh fake with one 100 GiB pool; returns the fetch options it holds
/// (their CA cache is shared with the provider's).
fn fake_provider(
    images: BTreeMap<String, ImageSpec>,
) -> (FakeLibvirt, LibvirtProvider, FetchOptions) {
    let fake = FakeLibvirt::new();
    fake.add_pool(PoolSpec::new(POOL).capacity(100 * GIB))
        .unwrap();
    let pool = HostPool::new(
        entry_with("home", fake_host(), images),
        Arc::new(FakeConnector(fake.clone())),
        PoolOptions::default(),
    )
    .unwrap();
    let fetch = FetchOptions::default();
    let provider = LibvirtProvider::new(pool, fetch.clone(), CheckOptions::default());
    (fake, provider, fetch)
}

fn uid(n: u8) -> ProxyUid {
    ProxyUid::parse_strict(&format!("6a1f3c2e-0b7d-4e58-9c4a-1d2e3f4a5b{n:02x}")).unwrap()
}

fn request(u: ProxyUid, image: &str, disk_gib: u64, memory_mib: u64) -> CreateRequest {
    CreateRequest {
        uid: u,
        display_name: "default/p".into(),
        host: "h1".into(),
        image: image.into(),
        disk_gib,
        memory_mib,
        vcpus: 1,
        user_data: "#cloud-config\n{}\n".into(),
        pinned_egress: Vec::new(),
        reserved: Vec::new(),
        prefer_egress: Vec::new(),
        lift_internal: true,
        replaces: None,
    }
}

fn vols(fake: &FakeLibvirt) -> Vec<String> {
    let mut v = fake.volumes(POOL).unwrap();
    v.sort();
    v
}

/// The name the base of an unpinned source must have: identified by its URL, bound to the
/// digest of the bytes.
fn expected_base(entry: &str, url: &str, image: &[u8]) -> String {
    names::base(
        entry,
        ImageSource::Url(url),
        &sha(image),
        ImageFormat::Qcow2,
    )
}

// ------------------------------------------------------------------ tests (fake libvirt)

#[tokio::test]
async fn an_unpinned_https_image_behind_a_private_ca_imports_under_its_streamed_digest_and_is_reused()
 {
    // finding: H4 — an unpinned base is bound to the digest of the bytes actually streamed,
    // and its marker records that digest, the size and the source.
    let pki = pki();
    let server = TlsServer::start(pki.server.clone()).await;
    let img = qcow2(2 * GIB, 300_000);
    let other = qcow2(2 * GIB, 200_000);
    let url = server.route("/tiny.qcow2", Reply::Body(Arc::new(img.clone())));
    let url2 = server.route("/other.qcow2", Reply::Body(Arc::new(other.clone())));
    let mut images = BTreeMap::new();
    images.insert("mirror".to_string(), unpinned(&url, Some(&pki.ca_file)));
    images.insert("mirror2".to_string(), unpinned(&url2, Some(&pki.ca_file)));
    let (fake, provider, fetch) = fake_provider(images);

    let a = provider
        .create(&request(uid(1), "mirror", 4, 256), &NoProgress)
        .await
        .unwrap();
    assert_eq!(server.gets("/tiny.qcow2"), 1);
    // The base's name carries the digest computed while streaming (nothing was pinned).
    let base = expected_base("home", &url, &img);
    let all = vols(&fake);
    assert!(all.contains(&base), "{base} not in {all:?}");
    // The marker records that digest, the size streamed and the (redacted) source.
    let marker = cache::marker_name(&base);
    let text = String::from_utf8(fake.volume_content(POOL, &marker).unwrap()).unwrap();
    assert!(
        text.contains(&format!("digest=sha256:{}", sha(&img))),
        "{text}"
    );
    assert!(text.contains(&format!("size={}", img.len())), "{text}");
    assert!(text.contains(&format!("source={url}")), "{text}");
    assert!(fake.domain(&a.id.name).is_some());

    // A second proxy reuses the published base: no second download, no second base.
    provider
        .create(&request(uid(2), "mirror", 4, 256), &NoProgress)
        .await
        .unwrap();
    assert_eq!(server.gets("/tiny.qcow2"), 1, "the cached base is reused");
    let bases: Vec<String> = vols(&fake)
        .into_iter()
        .filter(|v| v.starts_with(&names::base_prefix("home")) && v.ends_with(".qcow2"))
        .filter(|v| !v.contains(cache::PART_INFIX))
        .collect();
    assert_eq!(bases, vec![base.clone()]);

    // Another image of the same mirror is a second download, but the CA file was read once
    // for the provider, not once per download.
    provider
        .create(&request(uid(3), "mirror2", 4, 256), &NoProgress)
        .await
        .unwrap();
    assert_eq!(server.gets("/other.qcow2"), 1);
    assert!(vols(&fake).contains(&expected_base("home", &url2, &other)));
    assert_eq!(fetch.ca_roots.reads(), 1, "{:?}", fetch.ca_roots);
    drop(pki.dir);
}

#[tokio::test]
async fn an_untrusted_certificate_fails_transient_naming_the_redacted_url_and_the_tls_problem() {
    // finding: L24 — the URL's query (a token) never reaches the message.
    let pki = pki();
    let server = TlsServer::start(pki.server.clone()).await;
    let img = qcow2(2 * GIB, 4096);
    let url = server.route("/tiny.qcow2", Reply::Body(Arc::new(img)));
    let secret_url = format!("{url}?token=s3cr3t-t0ken");
    let mut images = BTreeMap::new();
    // No caFile: the private CA is unknown to the client.
    images.insert("mirror".to_string(), unpinned(&secret_url, None));
    let (fake, provider, _) = fake_provider(images);
    let u = uid(1);

    let e = provider
        .create(&request(u, "mirror", 4, 256), &NoProgress)
        .await
        .unwrap_err();
    println!("error: {e}");
    assert_eq!(e.class, ErrorClass::Transient, "{e}");
    assert!(e.message.contains(&url), "names the URL: {}", e.message);
    assert!(!e.message.contains("s3cr3t"), "redacted: {}", e.message);
    assert!(
        e.message.contains("certificate") && e.message.contains("UnknownIssuer"),
        "names the TLS problem: {}",
        e.message
    );
    assert!(
        e.message.contains("images.mirror.caFile"),
        "names the setting: {}",
        e.message
    );
    // The client refused the handshake; no request was served; nothing was published (not
    // even a temporary volume), and no instance exists.
    assert!(server.saw_a_refused_handshake().await);
    assert_eq!(server.handshakes(), 0);
    assert_eq!(server.gets("/tiny.qcow2"), 0);
    assert!(vols(&fake).is_empty(), "{:?}", vols(&fake));
    assert!(fake.domain(&names::domain("home", &u)).is_none());
}

#[tokio::test]
async fn a_ca_file_from_another_ca_is_still_untrusted_and_a_missing_one_is_permanent_naming_it() {
    let pki = pki();
    let other = pki_ca_only();
    let server = TlsServer::start(pki.server.clone()).await;
    let url = server.route("/tiny.qcow2", Reply::Body(Arc::new(qcow2(2 * GIB, 4096))));
    let quiet = TlsServer::start(pki.server.clone()).await;
    let quiet_url = quiet.route("/tiny.qcow2", Reply::Body(Arc::new(qcow2(2 * GIB, 4096))));
    let missing = pki.dir.path().join("no-such-ca.pem");
    let mut images = BTreeMap::new();
    images.insert("wrongca".to_string(), unpinned(&url, Some(&other.1)));
    images.insert("missing".to_string(), unpinned(&quiet_url, Some(&missing)));
    let (fake, provider, _) = fake_provider(images);

    let e = provider
        .create(&request(uid(1), "wrongca", 4, 256), &NoProgress)
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::Transient, "{e}");
    // Same subject name as the real issuer, other key: rustls says BadSignature.
    assert!(
        e.message.contains("invalid peer certificate")
            && e.message.contains("images.wrongca.caFile"),
        "{}",
        e.message
    );

    let e = provider
        .create(&request(uid(2), "missing", 4, 256), &NoProgress)
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::Permanent, "{e}");
    assert!(
        e.message.contains("images.missing.caFile")
            && e.message.contains(&missing.display().to_string()),
        "{}",
        e.message
    );
    assert_eq!(quiet.accepts(), 0, "no connection was made");
    assert_eq!(server.gets("/tiny.qcow2"), 0);
    assert!(vols(&fake).is_empty(), "{:?}", vols(&fake));
    drop(other.0);
}

/// Another CA only (its temp dir and PEM path).
fn pki_ca_only() -> (tempfile::TempDir, PathBuf) {
    let p = pki();
    (p.dir, p.ca_file)
}

#[tokio::test]
async fn plain_http_without_a_digest_stays_refused_directly_and_as_a_redirect_from_https() {
    // finding: M17
    let pki = pki();
    let tls = TlsServer::start(pki.server.clone()).await;
    let http = ImageServer::start().await;
    let img = qcow2(2 * GIB, 4096);
    let plain = http.route("/tiny.qcow2", Route::new(img.clone()));
    let hop = tls.route("/hop.qcow2", Reply::Redirect(plain.clone()));
    let mut images = BTreeMap::new();
    images.insert("plain".to_string(), unpinned(&plain, None));
    images.insert("hop".to_string(), unpinned(&hop, Some(&pki.ca_file)));
    let (fake, provider, _) = fake_provider(images);

    let e = provider
        .create(&request(uid(1), "plain", 4, 256), &NoProgress)
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::Permanent, "{e}");
    assert!(
        e.message.contains("plain http") && e.message.contains("images.plain.sha256"),
        "{}",
        e.message
    );
    assert_eq!(
        http.requests("/tiny.qcow2"),
        0,
        "refused before any traffic"
    );

    // The trusted https mirror redirects to plain http: refused at the hop.
    let e = provider
        .create(&request(uid(2), "hop", 4, 256), &NoProgress)
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::Permanent, "{e}");
    assert!(
        e.message.contains("redirect to plain http"),
        "{}",
        e.message
    );
    assert_eq!(http.gets("/tiny.qcow2"), 0, "the http hop is never fetched");
    assert!(vols(&fake).is_empty(), "{:?}", vols(&fake));
}

// ------------------------------------------------------------------ real libvirtd

/// Removes domains by name on Drop (destroy, then undefine with every metadata flag).
struct DomainGuard(Vec<String>);

impl Drop for DomainGuard {
    fn drop(&mut self) {
        for d in &self.0 {
            cleanup::remove_domain(d);
        }
    }
}

/// A unique entry name (`eptest<hex>`: time and pid), as in provider_real.rs.
fn unique(tag: &str) -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "{tag}{:x}",
        (n as u64) ^ u64::from(std::process::id()) << 20
    )
}

/// A real qcow2 image of `size` virtual bytes (sparse: a few hundred KiB).
fn qcow2_image(size: &str, dir: &Path) -> Vec<u8> {
    let path = dir.join("img.qcow2");
    let out = std::process::Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&path)
        .arg(size)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let b = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unpinned_https_image_is_published_and_boots_a_tcg_domain_on_the_real_libvirtd() {
    let sshd = Sshd::start();
    let pool = PoolFixture::create("imagetls");
    let pki = pki();
    let server = TlsServer::start(pki.server.clone()).await;
    let img = qcow2_image("1G", pki.dir.path());
    let url = server.route("/tiny.qcow2", Reply::Body(Arc::new(img.clone())));
    let entry = unique("eptest");
    let u = ProxyUid::parse_strict(&uuid::Uuid::new_v4().to_string()).unwrap();
    let dom = names::domain(&entry, &u);
    println!(
        "eptest: pool {} (dir {}), domain {dom}",
        pool.name,
        pool.dir.display()
    );
    let _guard = DomainGuard(vec![dom.clone()]);

    let host = HostConfig {
        name: "h1".into(),
        address: format!("127.0.0.1:{}", sshd.port),
        user: "root".into(),
        socket: "/run/libvirt/libvirt-sock".into(),
        pool: pool.name.clone(),
        // NB: no bridge or network: the guest has no NIC, so it sends no traffic.
        bridge: None,
        network: None,
        virt_type: VirtType::Qemu,
        pool_reserve_gib: 0,
        ssh_key_file: Some(sshd.client_key_path.clone()),
        known_hosts_file: Some(sshd.known_hosts_path.clone()),
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
    let mut images = BTreeMap::new();
    images.insert("tiny".to_string(), unpinned(&url, Some(&pki.ca_file)));
    let t = Timeouts::default();
    let hp = HostPool::new(
        entry_with(&entry, host, images),
        Arc::new(SshConnector::new(&t)),
        PoolOptions::default(),
    )
    .unwrap();
    let provider = LibvirtProvider::new(hp, FetchOptions::default(), CheckOptions::default());

    let inst = provider
        .create(&request(u, "tiny", 2, 128), &NoProgress)
        .await
        .unwrap();
    assert_eq!(inst.id.name, dom);
    assert_eq!(server.gets("/tiny.qcow2"), 1);
    // Published under the digest computed while streaming, with its marker, on the host.
    let base = expected_base(&entry, &url, &img);
    let marker = cache::marker_name(&base);
    assert!(pool.file(&base).exists(), "base {base} published");
    let text = std::fs::read_to_string(pool.file(&marker)).unwrap();
    assert!(
        text.contains(&format!("digest=sha256:{}", sha(&img))),
        "{text}"
    );
    // The TCG domain runs on an overlay backed by that base.
    assert_eq!(cleanup::virsh_ok(&["domstate", &dom]).trim(), "running");
    let info = std::process::Command::new("qemu-img")
        .args(["info", "-U", "--output=json"])
        .arg(pool.file(&names::overlay(&entry, &u)))
        .output()
        .unwrap();
    let info = String::from_utf8_lossy(&info.stdout);
    assert!(info.contains(&base), "overlay backs onto {base}: {info}");

    // Delete removes the instance and leaves the base.
    provider.delete("h1", &u).await.unwrap();
    assert!(
        !cleanup::virsh(&["domstate", &dom]).status.success(),
        "domain gone"
    );
    assert!(!pool.file(&names::overlay(&entry, &u)).exists());
    assert!(pool.file(&base).exists(), "the base stays");
}
