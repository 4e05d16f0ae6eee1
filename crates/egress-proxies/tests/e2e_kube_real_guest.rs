//! End to end in Kubernetes mode on the real hypervisor: the `egress-proxies kubernetes`
//! binary, as its own process, against the fake API server over HTTPS (generated CA, bearer
//! token, kubeconfig), drives the real libvirtd through a real sshd to boot the real Debian
//! guest image (built by `scripts/build-guest-image`, served on 127.0.0.1 with its sha256
//! pinned). A Proxy object created through the API becomes Running with the guest's address;
//! a request through the guest's tinyproxy reaches an echo server; the health engine (checking
//! through the proxy against a real `egress-proxies echo`) records it Healthy; it is listed in
//! its group's EndpointSlice; the entry's ProviderHealth object shows the host Ready.
//! Deleting the Proxy: the API keeps it (finalizer, `deletionTimestamp`) until the VM and its
//! volumes are gone, then the operator removes the finalizer and the object goes. SIGTERM
//! releases the Lease, exit 0. Every phase is timed (`eptest: timing:` lines).
//!
//! Network isolation as in e2e_real_guest.rs: the test re-executes itself inside libvirtd's
//! network namespace (`ip netns exec`) and checks the child ran exactly this test; the fake API
//! server, sshd, image server, echo servers and the operator all live there.
//!
//! Resources: every name is printed before it exists; guards remove the operator and echo
//! processes, the entry's domains, the pool, the network and the temp directories on every
//! exit path; a sweep at the start removes this suite's leftovers older than
//! [`cleanup::SWEEP_AGE`].
//!
//! Needs root, the libvirtd of `.ci/setup-host`, the sshd binary, and the guest-image tools.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod kube_support;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use egress_provider::libvirt::names;
use egress_provider::model::ProxyUid;
use ep_test_support::cleanup::{self};
use ep_test_support::e2e::{
    EchoProcess, ImageHost, NetGuard, echo_server, http, status_code, volumes,
};
use ep_test_support::real_guest::{self as real_guest, EntryFixture, RealGuest};
use ep_test_support::sshd::Sshd;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use kube_support::{ApiServer, ClusterConfig, Operator, proxy_resource};

/// The whole test, image build included.
// NB: as the standalone e2e: a first image build ~2.5 min, the cached run ~2–3 min (TCG boot
// to a leased address ~40 s–2 min, tinyproxy ~35 s later). 30 min is far above and
// inside CI's budget.
const TEST_BUDGET: Duration = Duration::from_secs(30 * 60);
/// From Proxy created to Running with an IP (download, import, define, boot, DHCP lease).
// NB: the operator's own provisioning deadline.
const BOOT_BUDGET: Duration = Duration::from_secs(15 * 60);
/// From Running to tinyproxy answering, to Healthy, and to the EndpointSlice listing it.
// NB: cloud-init's final stage ends ~10–40 s after the guest has its address; Healthy follows
// the first answer by two health intervals; the publisher runs every 5 s.
const PROXY_BUDGET: Duration = Duration::from_secs(5 * 60);
/// From the start to the Lease and the first ProviderHealth status.
// NB: the Lease is taken at once; the first host check round (SSH + libvirt probes) takes
// seconds; 2 min absorbs a loaded host.
const START_BUDGET: Duration = Duration::from_secs(2 * 60);
/// Deleting: delete → VM and instance volumes gone → finalizer removed.
// NB: destroy + undefine + two volume deletes take seconds; the reconcile poll is 5 s.
const DELETE_BUDGET: Duration = Duration::from_secs(3 * 60);
/// Pause between polls.
const POLL: Duration = Duration::from_secs(2);
/// The proxy port in the Proxy.
const PROXY_PORT: u16 = 3128;
/// The guest's resources (as the standalone e2e).
// NB: the image's virtual size is ~1 GiB; 512 MiB runs the cloud kernel, cloud-init, tinyproxy.
const DISK_GIB: u64 = 4;
const MEMORY_MIB: u64 = 512;
/// The catalogue key of the test image.
const IMAGE_KEY: &str = "debian-12-ep";
/// Where the image server serves it.
const IMAGE_PATH: &str = "/debian-12-ep.qcow2";
/// Between health rounds (`--health-interval`).
// NB: short so Healthy (two consecutive successes, the second at once for a new proxy)
// follows tinyproxy's start within seconds.
const HEALTH_INTERVAL: &str = "3s";
/// The Proxy's namespace, name and group.
const NAMESPACE: &str = "team-e2e";
const NAME: &str = "k2e-web";
const GROUP: &str = "k2e-egress";

fn main_test_name() -> &'static str {
    "in_kubernetes_mode_a_proxy_object_boots_a_real_guest_is_published_when_healthy_and_its_deletion_removes_the_vm_before_the_finalizer"
}

#[test]
fn in_kubernetes_mode_a_proxy_object_boots_a_real_guest_is_published_when_healthy_and_its_deletion_removes_the_vm_before_the_finalizer()
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

async fn inside_the_namespace(rg: RealGuest) {
    let RealGuest { bin, image } = rg;
    let fixture = EntryFixture::create("k2e");
    let (entry, pool) = (fixture.entry.clone(), &fixture.pool);
    let net = NetGuard::create("k2e");
    let gateway = net.ip(1);
    let (echo, seen) = echo_server(gateway).await;
    println!("eptest: echo server on {echo}");
    let work = tempfile::Builder::new()
        .prefix(&cleanup::unique_name("dir", "k2e"))
        .tempdir()
        .unwrap();
    let health_echo = EchoProcess::start(&bin, gateway, &work.path().join("echo.log"));
    let sshd = Sshd::start();
    let server = ImageHost::start(std::fs::read(&image.path).unwrap(), IMAGE_PATH, 0).await;
    println!("eptest: image served at {}", server.url);

    let config = work.path().join("providers.yaml");
    std::fs::write(
        &config,
        format!(
            "providers:\n  - name: {entry}\n    type: libvirt\n    hosts:\n      - name: h1\n        \
             address: 127.0.0.1:{port}\n        user: root\n        pool: {pool}\n        \
             network: {net}\n        virtType: qemu\n        poolReserveGiB: 0\n        \
             sshKeyFile: {key}\n        knownHostsFile: {kh}\n        maxConcurrent: 2\n    \
             images:\n      {IMAGE_KEY}:\n        url: {url}\n        sha256: {sha}\n        \
             format: qcow2\n        firmware: uefi\n    \
             policy:\n      allowedInternalCidrs: [{lan}]\n    \
             defaults:\n      diskGiB: {DISK_GIB}\n      memoryMiB: {MEMORY_MIB}\n      vcpus: 1\n",
            port = sshd.port,
            pool = pool.name,
            net = net.name,
            key = sshd.client_key_path.display(),
            kh = sshd.known_hosts_path.display(),
            url = server.url,
            sha = image.sha256,
            // NB: the echo servers live on the test network's bridge, an internal (benchmark
            // range) network the guest's policy denies unless the entry lifts it.
            lan = format_args!("{}/24", net.ip(0)),
        ),
    )
    .unwrap();

    // The API server (HTTPS, token) with the committed CRDs, and the operator.
    let srv = ApiServer::start().await;
    println!("eptest: fake API server at {}", srv.url);
    srv.apply_committed_crds().await;
    let kubeconfig = srv.kubeconfig();
    let mut op = Operator::start_with(
        &config,
        ClusterConfig::Kubeconfig(&kubeconfig),
        "op-e2e",
        &[
            "--health-target".to_owned(),
            format!("http://{}/", health_echo.addr),
            "--health-interval".to_owned(),
            HEALTH_INTERVAL.to_owned(),
        ],
    );
    println!("eptest: operator pid {}", op.pid());
    poll("the Lease taken", START_BUDGET, &op, || async {
        (srv.lease_holder().as_deref() == Some("op-e2e")).then_some(())
    })
    .await;

    // ProviderHealth: the one host Ready.
    let ph = poll(
        "ProviderHealth shows h1 Ready",
        START_BUDGET,
        &op,
        || async {
            srv.api
                .object("egress-proxies.dev", "providerhealths", "", &entry)
                .filter(|p| {
                    p["status"]["readyHosts"] == 1
                        && p["status"]["hosts"].as_array().is_some_and(|h| {
                            h.iter().any(|h| h["host"] == "h1" && h["state"] == "Ready")
                        })
                })
        },
    )
    .await;
    println!("eptest: ProviderHealth status {}", ph["status"]);

    // Create the Proxy through the API.
    let client = srv.client().await;
    let proxies: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), NAMESPACE, &proxy_resource());
    let obj: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "egress-proxies.dev/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": NAME, "namespace": NAMESPACE,
                     "labels": {"egress-proxies.dev/group": GROUP}},
        "spec": {"provider": entry, "image": IMAGE_KEY,
                 "proxy": {"port": PROXY_PORT, "protocol": "http",
                           "allowedClientCidrs": [format!("{gateway}/32")]}},
    }))
    .unwrap();
    proxies.create(&PostParams::default(), &obj).await.unwrap();
    let t_created = Instant::now();

    let ip: Ipv4Addr = poll("Proxy Running with an IP", BOOT_BUDGET, &op, || async {
        let p = srv.proxy(NAMESPACE, NAME)?;
        assert_ne!(p["status"]["phase"], "Failed", "the Proxy failed: {p:#}");
        if p["status"]["phase"] == "Running" {
            p["status"]["ip"].as_str().and_then(|s| s.parse().ok())
        } else {
            None
        }
    })
    .await;
    println!(
        "eptest: timing: Proxy created → Running with IP {ip} {:.1} s",
        t_created.elapsed().as_secs_f64()
    );
    let uid = srv
        .proxy(NAMESPACE, NAME)
        .and_then(|p| {
            p["metadata"]["uid"]
                .as_str()
                .and_then(ProxyUid::parse_strict)
        })
        .expect("the Proxy has a canonical UID");
    let domain = names::domain(&entry, &uid);
    assert!(
        cleanup::domain_names().contains(&domain),
        "no VM {domain} for the Proxy"
    );

    // Through its tinyproxy to the echo server.
    let proxy = SocketAddr::V4(SocketAddrV4::new(ip, PROXY_PORT));
    let request =
        format!("GET http://{echo}/egress HTTP/1.1\r\nHost: {echo}\r\nConnection: close\r\n\r\n");
    let resp = poll("a 200 through the proxy", PROXY_BUDGET, &op, || async {
        http(Some(gateway), proxy, request.clone())
            .await
            .ok()
            .filter(|r| status_code(r) == Some(200))
    })
    .await;
    assert!(
        resp.ends_with(&format!("egress={ip}\n")),
        "the echo did not see the guest: {resp}"
    );
    assert!(seen.lock().unwrap().contains(&ip.to_string()));

    // Healthy in its status, with the guest as the egress IP.
    let health = poll("Proxy Healthy", PROXY_BUDGET, &op, || async {
        let p = srv.proxy(NAMESPACE, NAME)?;
        (p["status"]["health"]["healthy"] == true).then(|| p["status"]["health"].clone())
    })
    .await;
    assert_eq!(health["egressIp"], ip.to_string(), "{health}");

    // Published: the group's Service and an EndpointSlice listing the guest.
    let slice = poll(
        "the group's EndpointSlice lists it",
        PROXY_BUDGET,
        &op,
        || async {
            srv.api
                .objects("discovery.k8s.io", "endpointslices")
                .into_iter()
                .find(|s| {
                    s["metadata"]["namespace"] == NAMESPACE
                        && s["metadata"]["labels"]["kubernetes.io/service-name"] == GROUP
                        && s["endpoints"].as_array().is_some_and(|eps| {
                            eps.iter().any(|e| {
                                e["addresses"]
                                    .as_array()
                                    .is_some_and(|a| a.iter().any(|a| a == &ip.to_string()))
                            })
                        })
                })
        },
    )
    .await;
    assert!(
        slice["ports"]
            .as_array()
            .is_some_and(|ps| ps.iter().any(|p| p["port"] == PROXY_PORT)),
        "{slice}"
    );
    assert!(
        srv.api.object("", "services", NAMESPACE, GROUP).is_some(),
        "no Service {GROUP}"
    );

    // Delete: the finalizer holds the object until the VM and its volumes are gone.
    let instance_volumes = |pool: &str| -> Vec<String> {
        volumes(pool)
            .into_iter()
            .filter(|v| v.starts_with(&format!("{domain}-")))
            .collect()
    };
    let before = instance_volumes(&pool.name);
    println!("eptest: the instance's volumes: {before:?}");
    for v in [names::overlay(&entry, &uid), names::seed(&entry, &uid)] {
        assert!(before.contains(&v), "no volume {v} in {before:?}");
    }
    let t_delete = Instant::now();
    proxies
        .delete(NAME, &DeleteParams::default())
        .await
        .unwrap();
    let held = srv.proxy(NAMESPACE, NAME);
    if let Some(p) = &held {
        assert!(
            p["metadata"]["deletionTimestamp"].is_string(),
            "a deleted Proxy with a finalizer has a deletionTimestamp: {p}"
        );
    }
    let mut saw_vm_gone_while_held = held.is_none();
    poll("the Proxy object gone", DELETE_BUDGET, &op, || {
        let vm_gone =
            !cleanup::domain_names().contains(&domain) && instance_volumes(&pool.name).is_empty();
        let obj = srv.proxy(NAMESPACE, NAME);
        if let Some(p) = &obj {
            assert!(
                p["metadata"]["finalizers"]
                    .as_array()
                    .is_some_and(|f| f.iter().any(|x| x == "egress-proxies.dev/instance")),
                "the finalizer was removed before the Proxy object went: {p}"
            );
            if vm_gone {
                saw_vm_gone_while_held = true;
            }
        }
        async move { obj.is_none().then_some(()) }
    })
    .await;
    println!(
        "eptest: timing: delete → object gone {:.1} s",
        t_delete.elapsed().as_secs_f64()
    );
    assert!(
        !cleanup::domain_names().contains(&domain),
        "the VM {domain} outlived its Proxy object"
    );
    assert_eq!(
        instance_volumes(&pool.name),
        Vec::<String>::new(),
        "the instance's volumes outlived its Proxy object"
    );
    println!(
        "eptest: the VM was gone while the finalizer still held the object: {saw_vm_gone_while_held}"
    );

    // Unpublished, and a clean stop.
    poll(
        "the guest leaves the EndpointSlice",
        PROXY_BUDGET,
        &op,
        || async {
            let listed = srv
                .api
                .objects("discovery.k8s.io", "endpointslices")
                .into_iter()
                .any(|s| s.to_string().contains(&format!("\"{ip}\"")));
            (!listed).then_some(())
        },
    )
    .await;
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
