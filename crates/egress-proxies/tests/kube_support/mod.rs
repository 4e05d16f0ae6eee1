//! Shared by the tests that run the real `egress-proxies kubernetes` binary as its own process
//! (kube_process.rs): the fake API server behind real HTTPS with a generated CA and a bearer
//! token ([`ApiServer`], the same front `kube-fake-server` runs), a kube client of the test's
//! own over that HTTPS, the committed CRDs applied through it, libvirt-fake hosts on unix
//! sockets the operator process dials ([`SocketHosts`]), and the operator process itself
//! ([`Operator`]: stderr captured, SIGTERM, exit with a deadline).
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use ep_operator_fixtures::{POOL, dhcp_network, publish_base, run_dhcp};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube_fake::FakeApiServer;
use libvirt_fake::{FakeLibvirt, PoolSpec};
use tokio_util::sync::CancellationToken;

/// The bearer token of the fake API server.
pub const TOKEN: &str = "eptest-token-7f3a";
/// The namespace of the operator's Lease.
pub const LEASE_NAMESPACE: &str = "ep-system";
/// The Lease name (the flag's default).
pub const LEASE_NAME: &str = "egress-proxies-leader";
/// The provider entry of the fake hosts.
pub const ENTRY: &str = "fake";
/// The catalogue image published on every fake host.
pub const IMAGE: &str = "tiny";
/// Bound on one request of the test's own clients.
// NB: loopback requests answer in milliseconds; 10 s absorbs a loaded 2-core machine.
pub const HTTP_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between polls of a wait.
// NB: 100 ms: fine resolution for waits of seconds, negligible load.
pub const POLL: Duration = Duration::from_millis(100);
/// Longest the operator may take to exit after SIGTERM.
// NB: it stops the controller and releases the Lease (one request) in well under a second;
// the driver's own shutdown grace is 60 s, so 90 s also catches a grace that ran out.
pub const EXIT_DEADLINE: Duration = Duration::from_secs(90);
/// How often the fake "DHCP" hands out addresses.
// NB: 100 ms keeps the fake's share of a Running wait negligible.
pub const DHCP_INTERVAL: Duration = Duration::from_millis(100);

/// The digest the published fake base claims.
pub fn digest() -> String {
    "ab".repeat(32)
}

/// The repository root (deploy/ lives there).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Installs the workspace's one rustls provider in the test process (its kube clients use TLS).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

/// Polls `f` every [`POLL`] until it returns `Some`, failing the test after `deadline` with
/// `what` and the last observation of `describe`.
pub async fn wait_for<T, F, Fut>(what: &str, deadline: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            start.elapsed() < deadline,
            "timed out after {deadline:?} waiting for {what}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// A free TCP port on 127.0.0.1 (bound and released).
pub fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The fake API server over HTTPS on 127.0.0.1 (a fresh CA), requiring [`TOKEN`]. Stops
/// when dropped.
pub struct ApiServer {
    /// The store (assertions read it directly).
    pub api: FakeApiServer,
    /// `https://127.0.0.1:PORT`.
    pub url: String,
    /// The bound address.
    pub addr: SocketAddr,
    /// Holds ca.crt, kubeconfig and serviceaccount/{token,ca.crt,namespace}.
    pub dir: tempfile::TempDir,
    stop: CancellationToken,
}

impl Drop for ApiServer {
    /// Stops serving; and, unless the test already failed, fails when the server pruned a
    /// field anyone wrote (the schema does not declare it: a real cluster would lose it).
    fn drop(&mut self) {
        self.stop.cancel();
        if !std::thread::panicking() {
            let dropped = self.api.dropped_fields();
            assert!(
                dropped.is_empty(),
                "the API server pruned fields the operator wrote: {dropped:#?}"
            );
        }
    }
}

impl ApiServer {
    /// Generates the CA, starts serving on the current runtime, writes the files.
    pub async fn start() -> Self {
        install_crypto_provider();
        let pki =
            kube_fake::https::Pki::generate(&["localhost".into(), "127.0.0.1".into()]).unwrap();
        let tls = pki.server_config().unwrap();
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let api = FakeApiServer::new();
        let stop = CancellationToken::new();
        let s = stop.clone();
        tokio::spawn(kube_fake::https::serve(
            listener,
            api.clone(),
            tls,
            TOKEN.to_owned(),
            async move { s.cancelled().await },
        ));
        let dir = tempfile::Builder::new()
            .prefix("eptest-kubeapi-")
            .tempdir()
            .unwrap();
        let url = format!("https://{addr}");
        std::fs::write(dir.path().join("ca.crt"), &pki.ca_pem).unwrap();
        let sa = dir.path().join("serviceaccount");
        std::fs::create_dir(&sa).unwrap();
        std::fs::write(sa.join("ca.crt"), &pki.ca_pem).unwrap();
        std::fs::write(sa.join("token"), TOKEN).unwrap();
        std::fs::write(sa.join("namespace"), LEASE_NAMESPACE).unwrap();
        let srv = Self {
            api,
            url,
            addr,
            dir,
            stop,
        };
        srv.write_kubeconfig("kubeconfig", &srv.dir.path().join("ca.crt"), TOKEN);
        srv
    }

    /// The kubeconfig naming this server, the CA and the token.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    /// Writes DIR/`name`: a kubeconfig for this server with `ca` and `token`; returns its path.
    pub fn write_kubeconfig(&self, name: &str, ca: &Path, token: &str) -> PathBuf {
        write_kubeconfig(&self.dir.path().join(name), &self.url, ca, token)
    }

    /// The service-account directory (token, ca.crt, namespace) a pod would have mounted.
    pub fn serviceaccount_dir(&self) -> PathBuf {
        self.dir.path().join("serviceaccount")
    }

    /// A kube client of the test's own, over HTTPS with the kubeconfig.
    pub async fn client(&self) -> kube::Client {
        let kc = kube::config::Kubeconfig::read_from(self.kubeconfig()).unwrap();
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        kube::Client::try_from(cfg).unwrap()
    }

    /// Applies the committed CRDs (deploy/crds/*.yaml) through the API, as `kubectl apply`.
    pub async fn apply_committed_crds(&self) {
        let api: Api<CustomResourceDefinition> = Api::all(self.client().await);
        let dir = repo_root().join("deploy/crds");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            if path.extension().is_some_and(|x| x == "yaml") {
                let text = std::fs::read_to_string(&path).unwrap();
                let crd: CustomResourceDefinition = serde_saphyr::from_str(&text).unwrap();
                api.create(&PostParams::default(), &crd).await.unwrap();
                n += 1;
            }
        }
        assert_eq!(
            n, 3,
            "deploy/crds must hold the Proxy, ProviderHealth and ProxyPool CRDs"
        );
    }

    /// The Lease's holder, `None` when the Lease is absent or has no holder.
    pub fn lease_holder(&self) -> Option<String> {
        let l = self
            .api
            .object("coordination.k8s.io", "leases", LEASE_NAMESPACE, LEASE_NAME)?;
        l["spec"]["holderIdentity"]
            .as_str()
            .filter(|h| !h.is_empty())
            .map(str::to_owned)
    }

    /// Whether the Lease object exists.
    pub fn lease_exists(&self) -> bool {
        self.api
            .object("coordination.k8s.io", "leases", LEASE_NAMESPACE, LEASE_NAME)
            .is_some()
    }

    /// A stored Proxy.
    pub fn proxy(&self, namespace: &str, name: &str) -> Option<serde_json::Value> {
        self.api
            .object("egress-proxies.dev", "proxies", namespace, name)
    }
}

/// Writes a kubeconfig for `url` trusting `ca` with bearer `token` to `path`.
pub fn write_kubeconfig(path: &Path, url: &str, ca: &Path, token: &str) -> PathBuf {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {url}\n    \
         certificate-authority: {ca}\nusers:\n- name: fake\n  user:\n    token: {token}\n\
         contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n\
         current-context: fake\n",
        ca = ca.display(),
    );
    std::fs::write(path, text).unwrap();
    path.to_owned()
}

/// The Proxy resource of the committed CRD, for dynamic clients.
pub fn proxy_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("egress-proxies.dev", "v1alpha1", "Proxy"),
        "proxies",
    )
}

/// Creates Proxy `name` in `namespace` on the fake entry's image, in group `group`.
pub async fn create_proxy(client: &kube::Client, namespace: &str, name: &str, group: &str) {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &proxy_resource());
    let obj: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "egress-proxies.dev/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"egress-proxies.dev/group": group}},
        "spec": {"provider": ENTRY, "image": IMAGE,
                 "proxy": {"allowedClientCidrs": ["10.0.0.0/8"]}},
    }))
    .unwrap();
    api.create(&PostParams::default(), &obj).await.unwrap();
}

/// libvirt-fake hosts `h0..hN` served on unix sockets in a temp directory, each with the
/// pool, the network and a published base of [`IMAGE`], plus the "DHCP" task; the operator
/// process reaches them through `address: local` + `socket:` in [`SocketHosts::config`].
pub struct SocketHosts {
    /// The fakes by host name.
    pub fakes: BTreeMap<String, FakeLibvirt>,
    /// Holds the sockets and the provider config.
    pub dir: tempfile::TempDir,
    stop: CancellationToken,
}

impl Drop for SocketHosts {
    fn drop(&mut self) {
        self.stop.cancel();
        for f in self.fakes.values() {
            f.shutdown();
        }
    }
}

impl SocketHosts {
    /// Starts `n` hosts on the current runtime.
    pub async fn start(n: usize) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("eptest-hosts-")
            .tempdir()
            .unwrap();
        let mut fakes = BTreeMap::new();
        for i in 0..n {
            let f = FakeLibvirt::new();
            f.add_pool(PoolSpec::new(POOL).capacity(16 << 40)).unwrap();
            f.add_network(dhcp_network("default")).unwrap();
            publish_base(&f, ENTRY, IMAGE, &digest());
            f.listen_unix(dir.path().join(format!("h{i}.sock")))
                .await
                .unwrap();
            fakes.insert(format!("h{i}"), f);
        }
        let stop = CancellationToken::new();
        tokio::spawn(run_dhcp(
            ENTRY.to_owned(),
            fakes.clone(),
            DHCP_INTERVAL,
            stop.clone(),
        ));
        Self { fakes, dir, stop }
    }

    /// Writes the provider config for these hosts; returns its path.
    pub fn config(&self) -> PathBuf {
        self.config_with_maintenance(&[])
    }

    /// Writes the provider config for these hosts with each host's `maintenance` (none for an
    /// empty list; `None` for a host not listed), whole, under a temporary name renamed into
    /// place (a watching operator never reads half a file); returns its path.
    pub fn config_with_maintenance(&self, maintenance: &[(&str, &str)]) -> PathBuf {
        let mut cfg = format!("providers:\n  - name: {ENTRY}\n    type: libvirt\n    hosts:\n");
        for h in self.fakes.keys() {
            let m = if maintenance.is_empty() {
                String::new()
            } else {
                let m = maintenance
                    .iter()
                    .find(|(n, _)| n == h)
                    .map_or("None", |(_, m)| m);
                format!("        maintenance: {m}\n")
            };
            cfg.push_str(&format!(
                "      - name: {h}\n        address: local\n        socket: {}\n        pool: {POOL}\n        \
                 network: default\n        virtType: qemu\n        poolReserveGiB: 1\n{m}",
                self.dir.path().join(format!("{h}.sock")).display()
            ));
        }
        cfg.push_str(&format!(
            "    images:\n      {IMAGE}:\n        url: https://images.invalid/tiny.qcow2\n        \
             sha256: {}\n        format: qcow2\n    timeouts:\n      dial: 3\n    defaults:\n      \
             diskGiB: 4\n      memoryMiB: 256\n      vcpus: 1\n",
            digest()
        ));
        let path = self.dir.path().join("providers.yaml");
        let tmp = self.dir.path().join("providers.yaml.tmp");
        std::fs::write(&tmp, cfg).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        path
    }

    /// How many domains host `h` holds.
    pub fn domains(&self, h: &str) -> usize {
        self.fakes[h].domains().len()
    }
}

/// The members of pool `pool` in `namespace` not being deleted, as the API server holds them:
/// name → (spec.host, Running with an address).
pub fn pool_members(
    srv: &ApiServer,
    namespace: &str,
    pool: &str,
) -> BTreeMap<String, (String, bool)> {
    srv.api
        .objects("egress-proxies.dev", "proxies")
        .into_iter()
        .filter(|p| {
            p["metadata"]["namespace"] == namespace
                && p["metadata"]["labels"]["egress-proxies.dev/pool"] == pool
                && p["metadata"]["deletionTimestamp"].is_null()
        })
        .map(|p| {
            (
                p["metadata"]["name"].as_str().unwrap_or("").to_owned(),
                (
                    p["spec"]["host"].as_str().unwrap_or("-").to_owned(),
                    p["status"]["phase"] == "Running" && p["status"]["ip"].is_string(),
                ),
            )
        })
        .collect()
}

/// How many of `members` (as [`pool_members`] gives them) are on `host`.
pub fn on(members: &BTreeMap<String, (String, bool)>, host: &str) -> usize {
    members.values().filter(|(h, _)| h == host).count()
}

/// Each host's `field` in the [`ENTRY`]'s ProviderHealth ("-" when absent).
pub fn health_rows(srv: &ApiServer, field: &str) -> BTreeMap<String, String> {
    srv.api
        .objects("egress-proxies.dev", "providerhealths")
        .into_iter()
        .filter(|o| o["metadata"]["name"] == ENTRY)
        .flat_map(|o| o["status"]["hosts"].as_array().cloned().unwrap_or_default())
        .map(|h| {
            (
                h["host"].as_str().unwrap_or("").to_owned(),
                h[field].as_str().unwrap_or("-").to_owned(),
            )
        })
        .collect()
}

/// Runs `egress-proxies status --server http://ADDR` (the operator's `--status-listen`):
/// (exit code, stdout); bounded by the command's own request timeouts.
pub fn status_cli(addr: &str) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_egress-proxies"))
        .args(["status", "--server", &format!("http://{addr}")])
        .env_remove("EGRESS_PROXIES_SERVER")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// How the operator process finds its cluster.
pub enum ClusterConfig<'a> {
    /// `KUBECONFIG=path`.
    Kubeconfig(&'a Path),
    /// In-cluster: `KUBERNETES_SERVICE_HOST/PORT` and the service-account directory bound
    /// on the fixed in-cluster path inside a private mount namespace (`unshare -m`).
    InCluster {
        addr: SocketAddr,
        serviceaccount: &'a Path,
    },
}

/// The real `egress-proxies kubernetes` process; SIGKILLed and reaped if still running when
/// dropped.
pub struct Operator {
    child: Option<Child>,
    /// Its /metrics, /healthz, /readyz address.
    pub listen: SocketAddr,
    stderr_path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Operator {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Operator {
    /// Starts `egress-proxies kubernetes --config CONFIG` with identity `identity`.
    pub fn start(config: &Path, cluster: ClusterConfig<'_>, identity: &str) -> Self {
        Self::start_with(config, cluster, identity, &[])
    }

    /// [`Operator::start`] with `extra` flags appended.
    pub fn start_with(
        config: &Path,
        cluster: ClusterConfig<'_>,
        identity: &str,
        extra: &[String],
    ) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("eptest-operator-")
            .tempdir()
            .unwrap();
        let listen = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
        let stderr_path = dir.path().join("stderr.log");
        let bin = PathBuf::from(env!("CARGO_BIN_EXE_egress-proxies"));
        let mut cmd = match &cluster {
            ClusterConfig::Kubeconfig(_) => Command::new(&bin),
            ClusterConfig::InCluster { serviceaccount, .. } => {
                // NB: kube reads the in-cluster files from a fixed path; a private mount
                // namespace gets a tmpfs over /run (so nothing is created on the real one) and
                // the test's directory bound at /run/secrets/kubernetes.io/serviceaccount.
                let mut c = Command::new("unshare");
                c.args(["--mount", "--propagation", "private", "--", "sh", "-euc"])
                    .arg(
                        "mount -t tmpfs eptest-run /run\n\
                         mkdir -p /run/secrets/kubernetes.io/serviceaccount\n\
                         mount --bind \"$1\" /run/secrets/kubernetes.io/serviceaccount\n\
                         shift\n\
                         exec \"$@\"",
                    )
                    .arg("sh")
                    .arg(serviceaccount)
                    .arg(&bin);
                c
            }
        };
        cmd.arg("kubernetes")
            .arg("--config")
            .arg(config)
            .args(["--listen", &listen.to_string()])
            .args(["--lease-namespace", LEASE_NAMESPACE])
            .args(["--identity", identity])
            .args(extra)
            .env_remove("EGRESS_PROXIES_CONFIG")
            .env_remove("POD_NAMESPACE")
            .env_remove("POD_NAME")
            .env_remove("KUBECONFIG")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBERNETES_SERVICE_PORT")
            .env("HOME", dir.path())
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr_path).unwrap());
        match cluster {
            ClusterConfig::Kubeconfig(p) => {
                cmd.env("KUBECONFIG", p);
            }
            ClusterConfig::InCluster { addr, .. } => {
                cmd.env("KUBERNETES_SERVICE_HOST", addr.ip().to_string())
                    .env("KUBERNETES_SERVICE_PORT", addr.port().to_string());
            }
        }
        let child = cmd.spawn().unwrap();
        Self {
            child: Some(child),
            listen,
            stderr_path,
            _dir: dir,
        }
    }

    /// Everything it wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// Its exit status, if it exited.
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().unwrap())
    }

    /// The process id (of `unshare` for in-cluster runs: it execs into the binary, same pid).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Sends SIGTERM.
    pub fn sigterm(&self) {
        let st = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(st.success(), "kill -TERM failed");
    }

    /// Waits (at most `deadline`) for the exit; fails the test with stderr if it does not.
    pub async fn wait_exit(&mut self, deadline: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(s) = self.try_exit() {
                self.child = None;
                return s;
            }
            assert!(
                start.elapsed() < deadline,
                "the operator did not exit within {deadline:?}; stderr:\n{}",
                self.stderr()
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// GET `path` on its listen address: (status, body), `None` when nothing answers.
    pub async fn get(&self, path: &str) -> Option<(u16, String)> {
        let c = reqwest::Client::builder()
            .no_proxy()
            .timeout(HTTP_TIMEOUT)
            .build()
            .unwrap();
        let r = c
            .get(format!("http://{}{path}", self.listen))
            .send()
            .await
            .ok()?;
        let code = r.status().as_u16();
        Some((code, r.text().await.unwrap_or_default()))
    }

    /// Waits until stderr contains `needle`; fails with stderr after `deadline`.
    pub async fn wait_stderr(&mut self, needle: &str, deadline: Duration) -> String {
        let start = Instant::now();
        loop {
            let s = self.stderr();
            if s.contains(needle) {
                return s;
            }
            assert!(
                start.elapsed() < deadline,
                "no {needle:?} on stderr within {deadline:?}; stderr:\n{s}"
            );
            tokio::time::sleep(POLL).await;
        }
    }
}

/// The real `egress-proxies gateway` process (`KUBECONFIG`, `--namespace`, `--bind-address`,
/// `--listen` on a free port, the access log in its own directory, `--gateway-shutdown-grace
/// 2s`, plus `extra`); SIGKILLed and reaped if still running when dropped.
pub struct GatewayProcess {
    /// The child, until it exited.
    pub child: Option<Child>,
    /// Its /metrics, /healthz, /readyz address.
    pub listen: SocketAddr,
    stderr_path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl GatewayProcess {
    /// Starts it for pools of `namespace`, binding their listeners on `bind`.
    pub fn start(kubeconfig: &Path, namespace: &str, bind: Ipv4Addr, extra: &[&str]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("eptest-gateway-")
            .tempdir()
            .unwrap();
        let listen = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
        let stderr_path = dir.path().join("stderr.log");
        let child = Command::new(env!("CARGO_BIN_EXE_egress-proxies"))
            .arg("gateway")
            .args(["--namespace", namespace])
            .args(["--bind-address", &bind.to_string()])
            .args(["--listen", &listen.to_string()])
            .arg("--gateway-access-log")
            .arg(dir.path().join("access.log"))
            .args(["--gateway-shutdown-grace", "2s"])
            .args(extra)
            .env("KUBECONFIG", kubeconfig)
            .env("HOME", dir.path())
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBERNETES_SERVICE_PORT")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr_path).unwrap())
            .spawn()
            .unwrap();
        Self {
            child: Some(child),
            listen,
            stderr_path,
            _dir: dir,
        }
    }

    /// Everything it wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// GET `path` on its listen address (with `accept`): (status, content type, body).
    pub async fn get(&self, path: &str, accept: Option<&str>) -> Option<(u16, String, String)> {
        let c = reqwest::Client::builder()
            .no_proxy()
            .timeout(HTTP_TIMEOUT)
            .build()
            .unwrap();
        let mut r = c.get(format!("http://{}{path}", self.listen));
        if let Some(a) = accept {
            r = r.header("Accept", a);
        }
        let r = r.send().await.ok()?;
        let code = r.status().as_u16();
        let ct = r
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        Some((code, ct, r.text().await.unwrap_or_default()))
    }

    /// Sends SIGTERM and waits (at most `deadline`) for the exit.
    pub async fn stop(&mut self, deadline: Duration) -> ExitStatus {
        let mut child = self.child.take().unwrap();
        let st = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(st.success(), "kill -TERM failed");
        wait_for("the gateway exits", deadline, || {
            let r = child.try_wait().unwrap();
            async move { r }
        })
        .await
    }
}
