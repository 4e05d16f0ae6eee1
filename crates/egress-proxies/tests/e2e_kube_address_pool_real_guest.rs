//! Declared egress addresses end to end in Kubernetes mode on the real hypervisor: the
//! `egress-proxies kubernetes` binary, as its own process, against the fake API server over
//! HTTPS (generated CA, bearer token, kubeconfig), drives the real libvirtd through a real sshd
//! to boot the real Debian guest image on an isolated libvirt network **without DHCP**, whose
//! host declares an `addressPool` of two IPv4 addresses.
//!
//! A Proxy pinning the pool's lowest address (`spec.egress.address`) is created first, but
//! cannot be created on the host yet (its credentials Secret does not exist); an unpinned Proxy
//! created next must not take the pinned address, though it is the one a fresh allocation
//! would take: it gets the other. Once the Secret exists the pinned Proxy gets its address.
//! Both come up Running at their declared addresses (`status.ip`, `status.egressAddress`); a
//! request through each reaches an echo server from its declared address; the health check
//! (through the proxy, with its credentials) records each Healthy with that egress; the
//! group's EndpointSlice lists both. Deleting them removes their VMs before their finalizers,
//! and SIGTERM releases the Lease. Every phase is timed (`eptest: timing:` lines).
//!
//! Network isolation as in e2e_kube_real_guest.rs: the test re-executes itself inside
//! libvirtd's network namespace and checks the child ran exactly this test.
//!
//! Resources: every name is printed before it exists; guards remove the operator and echo
//! processes, the entry's domains, the pool, the network and the temp directories on every
//! exit path; a sweep at the start removes this suite's leftovers by prefix.
//!
//! Needs root, the libvirtd of `.ci/setup-host`, the sshd binary, and the guest-image tools.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod kube_support;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use egress_provider::libvirt::names;
use egress_provider::model::ProxyUid;
use ep_test_support::cleanup::{self};
use ep_test_support::e2e::{EchoProcess, ImageHost, StaticNet, echo_server, http, status_code};
use ep_test_support::real_guest::{self as real_guest, EntryFixture, RealGuest};
use ep_test_support::sshd::Sshd;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use kube_support::{ApiServer, ClusterConfig, Operator, proxy_resource};

/// The whole test, image build included.
// NB: as the other real-guest tests: two TCG guests booting take ~2–5 min here; 30 min is far
// above and inside CI's budget.
const TEST_BUDGET: Duration = Duration::from_secs(30 * 60);
/// From a Proxy created to Running at its address (download, import, define, boot).
const BOOT_BUDGET: Duration = Duration::from_secs(15 * 60);
/// From Running to tinyproxy answering, to Healthy, and to the EndpointSlice.
// NB: two guests booting beside other suites' guests took ~5 min in the standalone test.
const PROXY_BUDGET: Duration = Duration::from_secs(10 * 60);
/// From the start to the Lease, the first ProviderHealth, or a condition to show.
const START_BUDGET: Duration = Duration::from_secs(2 * 60);
/// Deleting: delete → VMs and volumes gone → finalizers removed.
const DELETE_BUDGET: Duration = Duration::from_secs(3 * 60);
const POLL: Duration = Duration::from_secs(2);
const PROXY_PORT: u16 = 3128;
const IMAGE_KEY: &str = "debian-12-ep";
const IMAGE_PATH: &str = "/debian-12-ep.qcow2";
const HEALTH_INTERVAL: &str = "3s";
const NAMESPACE: &str = "team-kap";
const GROUP: &str = "kap-egress";
const PINNED: &str = "kap-pinned";
const POOLED: &str = "kap-pooled";
const SECRET: &str = "kap-pinned-credentials";
/// The pool's two addresses: `.POOL_FIRST` (pinned) and `.POOL_LAST`.
const POOL_FIRST: u8 = 200;
const POOL_LAST: u8 = 201;
/// The pinned Proxy's credentials.
const USER: &str = "kap";
const PASSWORD: &str = "kap-e2e-password-0123456789";

fn main_test_name() -> &'static str {
    "in_kubernetes_mode_a_pinned_address_is_reserved_and_both_proxies_egress_from_their_declared_addresses_on_real_guests"
}

#[test]
fn in_kubernetes_mode_a_pinned_address_is_reserved_and_both_proxies_egress_from_their_declared_addresses_on_real_guests()
 {
    real_guest::run(main_test_name(), TEST_BUDGET, inside_the_namespace);
}

/// Polls `f` every [`POLL`] until `Some`, failing with `what` and the operator's stderr tail.
async fn poll<T, F, Fut>(what: &str, budget: Duration, op: &Operator, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let t = Instant::now();
    loop {
        if let Some(v) = f().await {
            println!(
                "eptest: timing: {what} after {:.1} s",
                t.elapsed().as_secs_f64()
            );
            return v;
        }
        if t.elapsed() > budget {
            let err = op.stderr();
            let tail: Vec<&str> = err.lines().rev().take(40).collect();
            panic!(
                "timed out after {budget:?} waiting for {what}; operator stderr tail:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// A Proxy object of the group; pinning `pin` with credentials `secret` when given.
fn proxy_object(
    name: &str,
    entry: &str,
    gateway: Ipv4Addr,
    pin: Option<Ipv4Addr>,
    secret: Option<&str>,
) -> DynamicObject {
    let mut spec = serde_json::json!({
        "provider": entry, "image": IMAGE_KEY,
        "proxy": {"port": PROXY_PORT, "protocol": "http",
                  "allowedClientCidrs": [format!("{gateway}/32")]},
    });
    if let Some(ip) = pin {
        spec["egress"] = serde_json::json!({"address": [ip.to_string()]});
    }
    if let Some(s) = secret {
        spec["proxy"]["credentialsRef"] = serde_json::json!(s);
    }
    serde_json::from_value(serde_json::json!({
        "apiVersion": "egress-proxies.dev/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": name, "namespace": NAMESPACE,
                     "labels": {"egress-proxies.dev/group": GROUP}},
        "spec": spec,
    }))
    .unwrap()
}

/// `Proxy-Authorization` for the pinned Proxy's credentials.
fn basic_auth() -> String {
    // NB: base64 by hand (the test has no base64 dependency); the alphabet of RFC 4648.
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let raw = format!("{USER}:{PASSWORD}").into_bytes();
    let mut out = String::new();
    for chunk in raw.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    format!("Proxy-Authorization: Basic {out}\r\n")
}

async fn inside_the_namespace(rg: RealGuest) {
    let RealGuest { bin, image } = rg;
    let fixture = EntryFixture::create("kap");
    let (entry, pool) = (fixture.entry.clone(), &fixture.pool);
    let net = StaticNet::create("kap");
    let gateway = net.ip(1);
    let (echo, seen) = echo_server(gateway).await;
    println!("eptest: echo server on {echo}");
    let work = tempfile::Builder::new()
        .prefix(&cleanup::unique_name("dir", "kap"))
        .tempdir()
        .unwrap();
    let health_echo = EchoProcess::start(&bin, gateway, &work.path().join("echo.log"));
    let sshd = Sshd::start();
    let server = ImageHost::start(std::fs::read(&image.path).unwrap(), IMAGE_PATH, 0).await;
    server.unthrottle();
    let (first, last) = (net.ip(POOL_FIRST), net.ip(POOL_LAST));
    let [a, b, c] = [
        gateway.octets()[0],
        gateway.octets()[1],
        gateway.octets()[2],
    ];
    let config = work.path().join("providers.yaml");
    std::fs::write(
        &config,
        format!(
            "providers:\n  - name: {entry}\n    type: libvirt\n    hosts:\n      - name: h1\n        \
             address: 127.0.0.1:{port}\n        user: root\n        pool: {pool}\n        \
             network: {netname}\n        virtType: qemu\n        poolReserveGiB: 0\n        \
             sshKeyFile: {key}\n        knownHostsFile: {kh}\n        maxConcurrent: 2\n        \
             addressPool:\n          ipv4:\n            prefix: {a}.{b}.{c}.0/24\n            \
             gateway: {gateway}\n            ranges: [{first}-{last}]\n          dns: [{gateway}]\n    \
             images:\n      {IMAGE_KEY}:\n        url: {url}\n        sha256: {sha}\n        \
             format: qcow2\n        firmware: uefi\n    \
             policy:\n      allowedInternalCidrs: [{gateway}/32]\n    \
             defaults:\n      diskGiB: 4\n      memoryMiB: 512\n      vcpus: 1\n",
            port = sshd.port,
            pool = pool.name,
            netname = net.name,
            key = sshd.client_key_path.display(),
            kh = sshd.known_hosts_path.display(),
            url = server.url,
            sha = image.sha256,
        ),
    )
    .unwrap();

    let srv = ApiServer::start().await;
    println!("eptest: fake API server at {}", srv.url);
    srv.apply_committed_crds().await;
    let kubeconfig = srv.kubeconfig();
    let mut op = Operator::start_with(
        &config,
        ClusterConfig::Kubeconfig(&kubeconfig),
        "op-kap",
        &[
            "--health-target".to_owned(),
            format!("http://{}/", health_echo.addr),
            "--health-interval".to_owned(),
            HEALTH_INTERVAL.to_owned(),
        ],
    );
    println!("eptest: operator pid {}", op.pid());
    poll("the Lease taken", START_BUDGET, &op, || async {
        (srv.lease_holder().as_deref() == Some("op-kap")).then_some(())
    })
    .await;
    poll(
        "ProviderHealth shows h1 Ready",
        START_BUDGET,
        &op,
        || async {
            srv.api
                .object("egress-proxies.dev", "providerhealths", "", &entry)
                .filter(|p| p["status"]["readyHosts"] == 1)
        },
    )
    .await;

    let client = srv.client().await;
    let proxies: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), NAMESPACE, &proxy_resource());
    // The pinned Proxy first: its credentials Secret does not exist yet, so it waits.
    let t0 = Instant::now();
    proxies
        .create(
            &PostParams::default(),
            &proxy_object(PINNED, &entry, gateway, Some(first), Some(SECRET)),
        )
        .await
        .unwrap();
    let waiting = poll(
        "the pinned Proxy waits for its Secret",
        START_BUDGET,
        &op,
        || async {
            let p = srv.proxy(NAMESPACE, PINNED)?;
            let conds = p["status"]["conditions"].as_array()?.clone();
            conds
                .iter()
                .find(|c| c["type"] == "Ready" && c["reason"] == "CredentialsMissing")
                .cloned()
        },
    )
    .await;
    println!("eptest: the pinned Proxy: {waiting}");
    // The unpinned one: it must not take the pinned (lowest) address.
    proxies
        .create(
            &PostParams::default(),
            &proxy_object(POOLED, &entry, gateway, None, None),
        )
        .await
        .unwrap();
    let running = |name: &'static str| {
        let srv = &srv;
        move || async move {
            let p = srv.proxy(NAMESPACE, name)?;
            assert_ne!(p["status"]["phase"], "Failed", "{name} failed: {p:#}");
            (p["status"]["phase"] == "Running").then_some(p)
        }
    };
    let pooled = poll(
        "the unpinned Proxy Running",
        BOOT_BUDGET,
        &op,
        running(POOLED),
    )
    .await;
    println!(
        "eptest: timing: unpinned Proxy created → Running {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(
        pooled["status"]["egressAddress"],
        serde_json::json!([last.to_string()]),
        "the unpinned Proxy took another address than the pinned one: {pooled:#}"
    );
    assert_eq!(pooled["status"]["ip"], last.to_string(), "{pooled:#}");
    // Its credentials arrive: the pinned Proxy gets its pin.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let mut data = BTreeMap::new();
    data.insert("username".to_owned(), ByteString(USER.as_bytes().to_vec()));
    data.insert(
        "password".to_owned(),
        ByteString(PASSWORD.as_bytes().to_vec()),
    );
    let mut secret = Secret {
        data: Some(data),
        ..Secret::default()
    };
    secret.metadata.name = Some(SECRET.to_owned());
    secret.metadata.labels = Some(BTreeMap::from([(
        "egress-proxies.dev/credentials".to_owned(),
        "true".to_owned(),
    )]));
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let t1 = Instant::now();
    let pinned = poll(
        "the pinned Proxy Running",
        BOOT_BUDGET,
        &op,
        running(PINNED),
    )
    .await;
    println!(
        "eptest: timing: Secret created → pinned Proxy Running {:.1} s",
        t1.elapsed().as_secs_f64()
    );
    assert_eq!(
        pinned["status"]["egressAddress"],
        serde_json::json!([first.to_string()]),
        "{pinned:#}"
    );
    assert_eq!(pinned["status"]["ip"], first.to_string(), "{pinned:#}");

    // A request through each reaches the echo from its declared address.
    for (name, ip, auth) in [(POOLED, last, String::new()), (PINNED, first, basic_auth())] {
        let proxy = SocketAddr::V4(SocketAddrV4::new(ip, PROXY_PORT));
        let request = format!(
            "GET http://{echo}/egress HTTP/1.1\r\nHost: {echo}\r\n{auth}Connection: close\r\n\r\n"
        );
        let resp = poll(
            &format!("a 200 through {name}"),
            PROXY_BUDGET,
            &op,
            || async {
                http(Some(gateway), proxy, request.clone())
                    .await
                    .ok()
                    .filter(|r| status_code(r) == Some(200))
            },
        )
        .await;
        assert!(
            resp.ends_with(&format!("egress={ip}\n")),
            "the echo saw another egress through {name}: {resp}"
        );
    }
    assert!(seen.lock().unwrap().contains(&first.to_string()));
    // Healthy, each with its declared address as the egress the health target saw.
    for (name, ip) in [(POOLED, last), (PINNED, first)] {
        let health = poll(&format!("{name} Healthy"), PROXY_BUDGET, &op, || async {
            let p = srv.proxy(NAMESPACE, name)?;
            (p["status"]["health"]["healthy"] == true).then(|| p["status"]["health"].clone())
        })
        .await;
        assert_eq!(health["egressIp"], ip.to_string(), "{name}: {health}");
    }
    // Published: the group's EndpointSlice lists both.
    poll(
        "the EndpointSlice lists both",
        PROXY_BUDGET,
        &op,
        || async {
            let text = srv
                .api
                .objects("discovery.k8s.io", "endpointslices")
                .into_iter()
                .filter(|s| s["metadata"]["labels"]["kubernetes.io/service-name"] == GROUP)
                .map(|s| s.to_string())
                .collect::<String>();
            (text.contains(&format!("\"{first}\"")) && text.contains(&format!("\"{last}\"")))
                .then_some(())
        },
    )
    .await;

    // Deleting both: their VMs go before their objects.
    let domains: Vec<String> = [PINNED, POOLED]
        .iter()
        .map(|n| {
            let uid = srv
                .proxy(NAMESPACE, n)
                .and_then(|p| {
                    p["metadata"]["uid"]
                        .as_str()
                        .and_then(ProxyUid::parse_strict)
                })
                .expect("a canonical UID");
            names::domain(&entry, &uid)
        })
        .collect();
    for n in [PINNED, POOLED] {
        proxies.delete(n, &DeleteParams::default()).await.unwrap();
    }
    poll("both Proxy objects gone", DELETE_BUDGET, &op, || async {
        (srv.proxy(NAMESPACE, PINNED).is_none() && srv.proxy(NAMESPACE, POOLED).is_none())
            .then_some(())
    })
    .await;
    let left = cleanup::domain_names();
    for d in &domains {
        assert!(!left.contains(d), "the VM {d} outlived its Proxy object");
    }
    op.sigterm();
    let status = op.wait_exit(kube_support::EXIT_DEADLINE).await;
    let stderr = op.stderr();
    assert_eq!(
        status.code(),
        Some(0),
        "exit {status}; stderr tail:\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(srv.lease_holder(), None, "the Lease must be released");
}
