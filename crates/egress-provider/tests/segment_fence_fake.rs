//! Addresses that move with their member, through `LibvirtProvider` against two libvirt-fake
//! hosts on one segment (`hosts[].segment`) sharing one address pool:
//! - an address held by an instance on h1 is never given to a create on h2 while h1 does not
//!   answer: not after any wait, not when h1's fence command fails or hangs (killed at its
//!   deadline); the create's error says what it waits for (the command's status and stderr,
//!   or the timeout);
//! - once h1's fence command exits 0 (or an administrator fences h1), the create on h2 gets
//!   the address; when h1 answers again with its old domain, the address stays on h2; a
//!   frozen h1 the checks found dead is fenced after one check call's deadline, not a whole
//!   call's;
//! - the fence command runs only for a create of the same Proxy whose copy holds the address
//!   on h1: another Proxy pinned to that address never runs it (counted in a marker file) and
//!   waits, naming h1 and how an administrator declares it dead;
//! - a restarted provider hands nothing of the segment out while a host of it was never
//!   listed, and never runs that host's fence command for it, until an administrator fences it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod image_support;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use egress_provider::libvirt::address_pool::{AddressPool, FamilyPool};
use egress_provider::libvirt::check::CheckOptions;
use egress_provider::libvirt::config::{
    Fence, HostConfig, ImageFormat, ImageSpec, LibvirtEntry, Timeouts, VirtType,
};
use egress_provider::libvirt::hostpool::{Connector, HostPool, PoolOptions};
use egress_provider::libvirt::image::fetch::FetchOptions;
use egress_provider::libvirt::names;
use egress_provider::libvirt::provider_impl::LibvirtProvider;
use egress_provider::{CreateRequest, HostState, NoProgress, Provider, ProviderError, ProxyUid};
use image_support::{ImageServer, Route, qcow2, sha};
use libvirt_fake::{FakeLibvirt, NetworkSpec, PoolSpec};
use libvirt_remote::Transport;

const GIB: u64 = 1 << 30;
const POOL: &str = "images";
const ENTRY: &str = "seg";
/// Hang guard of one provider call (frozen h1 costs at most a couple of call deadlines).
const CALL_BUDGET: Duration = Duration::from_secs(30);
const FENCE_TIMEOUT: Duration = Duration::from_secs(1);

struct Fakes(BTreeMap<String, FakeLibvirt>);

#[async_trait]
impl Connector for Fakes {
    async fn connect(&self, host: &HostConfig) -> Result<Transport, ProviderError> {
        Ok(self.0.get(&host.name).unwrap().connect_duplex())
    }
}

fn host(name: &str, fence: Option<Fence>) -> HostConfig {
    HostConfig {
        name: name.into(),
        address: format!("{name}.invalid"),
        user: "root".into(),
        socket: "/run/libvirt/libvirt-sock".into(),
        pool: POOL.into(),
        bridge: None,
        network: Some("default".into()),
        virt_type: VirtType::Qemu,
        pool_reserve_gib: 1,
        ssh_key_file: None,
        known_hosts_file: None,
        max_concurrent: 16,
        guest_cidr: Vec::new(),
        address_pool: Some(AddressPool {
            ipv4: Some(FamilyPool {
                prefix: "203.0.113.0/24".into(),
                gateway: "203.0.113.1".into(),
                ranges: vec!["203.0.113.10-203.0.113.20".into()],
            }),
            ipv6: None,
            dns: vec![],
            access: None,
            hold_released: egress_provider::libvirt::address_pool::DEFAULT_HOLD_RELEASED,
        }),
        host_addresses: Vec::new(),
        capacity: Default::default(),
        access: None,
        maintenance: Default::default(),
        segment: Some("lan".into()),
        fence,
    }
}

/// A fence script driven by files in `dir`: `hang` → sleeps; `ok` → exits 0; else exits 1
/// with a BMC error on stderr. Every run is counted in `runs`.
fn fence_script(dir: &Path) -> Fence {
    let d = dir.display();
    Fence {
        command: vec![
            "/bin/sh".into(),
            "-c".into(),
            format!(
                "echo run >> {d}/runs; \
                 if [ -e {d}/hang ]; then echo 'waiting for bmc-h1' >&2; sleep 60; fi; \
                 if [ -e {d}/ok ]; then exit 0; fi; \
                 echo 'bmc-h1: connection refused' >&2; exit 1"
            ),
        ],
        timeout: FENCE_TIMEOUT,
    }
}

struct Setup {
    fakes: BTreeMap<String, FakeLibvirt>,
    url: String,
    sha: String,
    _srv: ImageServer,
}

async fn setup() -> Setup {
    let mut fakes = BTreeMap::new();
    for h in ["h1", "h2"] {
        let f = FakeLibvirt::new();
        f.add_pool(PoolSpec::new(POOL).capacity(100 * GIB)).unwrap();
        f.add_network(NetworkSpec::new("default")).unwrap();
        fakes.insert(h.to_owned(), f);
    }
    let srv = ImageServer::start().await;
    let image = qcow2(2 * GIB, 4096);
    let url = srv.route("/tiny.qcow2", Route::new(image.clone()));
    Setup {
        fakes,
        url,
        sha: sha(&image),
        _srv: srv,
    }
}

impl Setup {
    fn provider(&self, h1_fence: Option<Fence>) -> LibvirtProvider {
        self.provider_with_call(h1_fence, Duration::from_secs(1))
    }

    /// [`Setup::provider`] with `timeouts.call` = `call` (host check calls still 1 s).
    fn provider_with_call(&self, h1_fence: Option<Fence>, call: Duration) -> LibvirtProvider {
        let mut images = BTreeMap::new();
        images.insert(
            "tiny".to_string(),
            ImageSpec {
                url: self.url.clone(),
                sha256: Some(self.sha.clone()),
                format: ImageFormat::Qcow2,
                firmware: Default::default(),
                ca_file: None,
            },
        );
        let entry = LibvirtEntry {
            name: ENTRY.into(),
            hosts: vec![host("h1", h1_fence), host("h2", None)],
            images,
            url_images: Default::default(),
            max_image_bytes: GIB,
            guest: Default::default(),
            timeouts: Timeouts {
                dial: Duration::from_secs(1),
                call,
                ..Timeouts::default()
            },
            defaults: Default::default(),
            limits: Default::default(),
            policy: Default::default(),
            access: None,
            quotas: Default::default(),
        };
        let pool = HostPool::new(
            entry,
            Arc::new(Fakes(self.fakes.clone())),
            PoolOptions::default(),
        )
        .unwrap();
        let check = CheckOptions {
            call_timeout: Duration::from_secs(1),
            probe_budget: Duration::from_secs(2),
            ..CheckOptions::default()
        };
        LibvirtProvider::new(pool, FetchOptions::default(), check).with_fence_retry(Duration::ZERO)
    }

    fn h1(&self) -> &FakeLibvirt {
        &self.fakes["h1"]
    }

    fn domains(&self, host: &str) -> Vec<String> {
        self.fakes[host]
            .domains()
            .into_iter()
            .map(|d| d.name)
            .collect()
    }
}

fn uid(n: u8) -> ProxyUid {
    ProxyUid::parse_strict(&format!("0f8fad5b-d9cb-469f-a165-7086772895{n:02x}")).unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

async fn create(
    p: &LibvirtProvider,
    u: ProxyUid,
    host: &str,
    pinned: &[&str],
) -> Result<egress_provider::Instance, ProviderError> {
    create_replacing(p, u, host, pinned, None).await
}

/// A create of `u` on `host` naming `replaces` (the Proxy it replaces in its pool).
async fn create_replacing(
    p: &LibvirtProvider,
    u: ProxyUid,
    host: &str,
    pinned: &[&str],
    replaces: Option<ProxyUid>,
) -> Result<egress_provider::Instance, ProviderError> {
    let req = CreateRequest {
        uid: u,
        display_name: "default/p".into(),
        host: host.into(),
        image: "tiny".into(),
        disk_gib: 4,
        memory_mib: 256,
        vcpus: 1,
        user_data: "#cloud-config\n{}\n".into(),
        pinned_egress: pinned.iter().map(|s| s.parse().unwrap()).collect(),
        reserved: Vec::new(),
        prefer_egress: Vec::new(),
        lift_internal: true,
        replaces,
    };
    tokio::time::timeout(CALL_BUDGET, p.create(&req, &NoProgress))
        .await
        .expect("create within its budget")
}

/// Checks until h1 is reported dead.
async fn h1_dead(p: &LibvirtProvider) {
    let until = Instant::now() + CALL_BUDGET;
    loop {
        let r = p.check().await;
        let h1 = r.iter().find(|r| r.host == "h1").unwrap();
        if matches!(h1.state, HostState::Unreachable | HostState::Timeout) {
            return;
        }
        assert!(Instant::now() < until, "h1 never reported dead: {h1:?}");
    }
}

/// A refused create on h2: transient, naming `want`, nothing left on h2.
async fn refused(s: &Setup, p: &LibvirtProvider, u: ProxyUid, want: &str) {
    let e = create(p, u, "h2", &["203.0.113.10"]).await.unwrap_err();
    assert!(e.is_transient(), "{e}");
    assert!(e.message.contains(want), "want {want:?} in: {e}");
    assert!(
        !s.domains("h2").contains(&names::domain(ENTRY, &u)),
        "nothing defined on h2 while the address is held on h1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_moves_to_another_host_of_the_segment_only_after_a_fence_succeeded() {
    let s = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let p = s.provider(Some(fence_script(dir.path())));
    let old = create(&p, uid(1), "h1", &["203.0.113.10"]).await.unwrap();
    assert_eq!(old.egress, vec![ip("203.0.113.10")]);
    // The segment shares one pool: h2's next address is not h1's.
    let other = create(&p, uid(2), "h2", &[]).await.unwrap();
    assert_eq!(other.egress, vec![ip("203.0.113.11")]);
    // Each host's row reports the segment's usage (a fresh provider reads both hosts).
    let r = s.provider(None).check().await;
    for h in &r {
        assert_eq!(h.addresses.len(), 1, "{r:?}");
        assert_eq!((h.addresses[0].size, h.addresses[0].held), (11, 2), "{r:?}");
    }

    s.h1().faults().freeze();
    // The same Proxy, moved to h2: its domain has the same name there.
    let replacement = uid(1);
    // Not answering is not dead: no host check has found it dead yet, so no fence runs.
    std::fs::write(dir.path().join("ok"), "").unwrap();
    refused(
        &s,
        &p,
        replacement,
        "its fence command runs once a host check finds it dead",
    )
    .await;
    assert!(!dir.path().join("runs").exists(), "the fence command ran");
    std::fs::remove_file(dir.path().join("ok")).unwrap();
    h1_dead(&p).await;
    // A hanging fence command is killed at its deadline; the address stays.
    std::fs::write(dir.path().join("hang"), "").unwrap();
    let t = Instant::now();
    refused(
        &s,
        &p,
        replacement,
        "waiting for host h1 to be fenced: fence command timed out after 1s (killed): waiting \
         for bmc-h1",
    )
    .await;
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    std::fs::remove_file(dir.path().join("hang")).unwrap();
    // A failing one: its status and stderr are the reason; retries never release it.
    for _ in 0..3 {
        refused(
            &s,
            &p,
            replacement,
            "waiting for host h1 to be fenced: fence command exited 1: bmc-h1: connection refused",
        )
        .await;
    }
    let runs = std::fs::read_to_string(dir.path().join("runs")).unwrap();
    assert_eq!(runs.lines().count(), 4, "one run per attempt");
    // It succeeds: the replacement on h2 gets the address.
    std::fs::write(dir.path().join("ok"), "").unwrap();
    let moved = create(&p, replacement, "h2", &["203.0.113.10"])
        .await
        .unwrap();
    assert_eq!(moved.egress, vec![ip("203.0.113.10")]);
    assert!(
        s.domains("h1").contains(&names::domain(ENTRY, &uid(1))),
        "the old domain is left to the host's return"
    );
    // h1 answers again with its old domain: the address stays with the replacement.
    s.h1().faults().thaw();
    let until = Instant::now() + CALL_BUDGET;
    while p.list_owned().await.is_err() {
        assert!(Instant::now() < until, "h1 never answered again");
    }
    let e = create(&p, uid(4), "h1", &["203.0.113.10"])
        .await
        .unwrap_err();
    assert!(e.message.contains("held by an instance on host h2"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_fence_command_the_address_waits_and_an_administrators_fence_moves_it() {
    let s = setup().await;
    let p = s.provider(None);
    create(&p, uid(1), "h1", &["203.0.113.10"]).await.unwrap();
    s.h1().faults().freeze();
    h1_dead(&p).await;
    refused(&s, &p, uid(1), "waiting for host h1 to answer").await;
    refused(&s, &p, uid(1), "it has no fence command").await;
    refused(&s, &p, uid(1), "`egress-proxies hosts fence h1`").await;
    assert_eq!(p.fence_host("h1").unwrap(), vec![ip("203.0.113.10")]);
    let moved = create(&p, uid(1), "h2", &["203.0.113.10"]).await.unwrap();
    assert_eq!(moved.egress, vec![ip("203.0.113.10")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_proxy_pinned_to_a_held_address_never_fences_its_host() {
    let s = setup().await;
    let dir = tempfile::tempdir().unwrap();
    // The fence command would succeed: only the rule keeps it from running.
    std::fs::write(dir.path().join("ok"), "").unwrap();
    let p = s.provider(Some(fence_script(dir.path())));
    create(&p, uid(1), "h1", &["203.0.113.10"]).await.unwrap();
    s.h1().faults().freeze();
    h1_dead(&p).await;
    for _ in 0..3 {
        refused(
            &s,
            &p,
            uid(3),
            "held by another Proxy's instance on host h1 of this host's segment: waiting for \
             host h1 to answer without it",
        )
        .await;
    }
    refused(&s, &p, uid(3), "`egress-proxies hosts fence h1`").await;
    assert!(
        !dir.path().join("runs").exists(),
        "another Proxy's create ran h1's fence command"
    );
    // The Proxy whose copy holds it, moving to h2: h1 is fenced, the address follows it.
    let moved = create(&p, uid(1), "h2", &["203.0.113.10"]).await.unwrap();
    assert_eq!(moved.egress, vec![ip("203.0.113.10")]);
    let runs = std::fs::read_to_string(dir.path().join("runs")).unwrap();
    assert_eq!(runs.lines().count(), 1, "{runs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_naming_the_lost_holder_fences_its_host_and_takes_its_address() {
    let s = setup().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ok"), "").unwrap();
    let p = s.provider(Some(fence_script(dir.path())));
    // uid(1) (a pool member) holds the address on h1; uid(2), another Proxy, holds .11.
    create(&p, uid(1), "h1", &["203.0.113.10"]).await.unwrap();
    create(&p, uid(2), "h1", &["203.0.113.11"]).await.unwrap();
    s.h1().faults().freeze();
    h1_dead(&p).await;
    let refused_as = |u: ProxyUid, pin: &'static str, replaces: Option<ProxyUid>| {
        let p = &p;
        async move {
            let e = create_replacing(p, u, "h2", &[pin], replaces)
                .await
                .unwrap_err();
            assert!(e.is_transient(), "{e}");
            assert!(
                e.message
                    .contains("held by another Proxy's instance on host h1"),
                "{e}"
            );
        }
    };
    // A replacement naming a Proxy that is not the holder: never a reason to fence.
    refused_as(uid(3), "203.0.113.10", Some(uid(2))).await;
    // Naming the holder of another address it does not pin: no fence either.
    refused_as(uid(3), "203.0.113.11", Some(uid(1))).await;
    // Without `replaces`: another Proxy's holding.
    refused_as(uid(3), "203.0.113.10", None).await;
    assert!(
        !dir.path().join("runs").exists(),
        "a create not replacing the holder ran h1's fence command"
    );
    // The replacement of uid(1) (another Proxy, another domain name): h1 is fenced once,
    // the address moves to it on h2.
    let moved = create_replacing(&p, uid(3), "h2", &["203.0.113.10"], Some(uid(1)))
        .await
        .unwrap();
    assert_eq!(moved.egress, vec![ip("203.0.113.10")]);
    let runs = std::fs::read_to_string(dir.path().join("runs")).unwrap();
    assert_eq!(runs.lines().count(), 1, "{runs}");
    assert!(
        s.domains("h2").contains(&names::domain(ENTRY, &uid(3))),
        "{:?}",
        s.domains("h2")
    );
}

/// A frozen host the checks found dead gets one check call's deadline (1 s here) to answer
/// the replacement's listing before its fence runs, not a whole call's (`timeouts.call`, 60 s
/// here) nor keepalive's 30 s: the replacement is created well within 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_hosts_fence_runs_after_one_check_calls_deadline_not_a_whole_calls() {
    let s = setup().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ok"), "").unwrap();
    let p = s.provider_with_call(Some(fence_script(dir.path())), Duration::from_secs(60));
    create(&p, uid(1), "h1", &["203.0.113.10"]).await.unwrap();
    s.h1().faults().freeze();
    h1_dead(&p).await;
    let t = Instant::now();
    let moved = tokio::time::timeout(
        Duration::from_secs(10),
        create_replacing(&p, uid(3), "h2", &["203.0.113.10"], Some(uid(1))),
    )
    .await
    .expect("the replacement waited on the frozen host for more than 10 s")
    .unwrap();
    println!(
        "eptest: replacement created {:.2} s after h1 was found dead",
        t.elapsed().as_secs_f64()
    );
    assert_eq!(moved.egress, vec![ip("203.0.113.10")]);
    let runs = std::fs::read_to_string(dir.path().join("runs")).unwrap();
    assert_eq!(runs.lines().count(), 1, "{runs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_during_an_outage_hands_nothing_out_until_the_dead_host_is_fenced() {
    let s = setup().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ok"), "").unwrap();
    let before = s.provider(None);
    create(&before, uid(1), "h1", &["203.0.113.10"])
        .await
        .unwrap();
    drop(before);
    s.h1().faults().freeze();
    let p = s.provider(Some(fence_script(dir.path())));
    h1_dead(&p).await;
    // Neither a fresh create nor the Proxy itself (its holding on h1 is unknown) fences h1.
    for (u, pinned) in [(uid(2), &[][..]), (uid(1), &["203.0.113.10"][..])] {
        let e = create(&p, u, "h2", pinned).await.unwrap_err();
        assert!(e.is_transient(), "{e}");
        for want in [
            "host h1 of this host's segment has not answered since the operator started",
            "`egress-proxies hosts fence h1`",
        ] {
            assert!(e.message.contains(want), "want {want:?} in: {e}");
        }
        assert!(!s.domains("h2").contains(&names::domain(ENTRY, &u)));
    }
    assert!(
        !dir.path().join("runs").exists(),
        "a host never listed was fenced by a create"
    );
    p.fence_host("h1").unwrap();
    create(&p, uid(2), "h2", &[]).await.unwrap();
}

/// Checks until h1 answers again.
async fn h1_back(p: &LibvirtProvider) {
    let until = Instant::now() + CALL_BUDGET;
    loop {
        let r = p.check().await;
        let h1 = r.iter().find(|r| r.host == "h1").unwrap();
        if matches!(h1.state, HostState::Ready | HostState::Degraded) {
            return;
        }
        assert!(Instant::now() < until, "h1 never answered again: {h1:?}");
    }
}

/// A fence lasts one outage: h1 is fenced, answers again, takes a new instance with another
/// address, and dies again; the replacement of that instance waits for a fence of this outage
/// (h1's command runs a second time) and then takes the address. A fence recorded for the
/// first outage must neither stand in for the second (the create would wait for good: the
/// address is held by an instance made after it) nor let an administrator's declaration be
/// ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_fenced_in_one_outage_is_fenced_again_in_the_next() {
    let s = setup().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ok"), "").unwrap();
    let p = s.provider(Some(fence_script(dir.path())));
    let runs = || {
        std::fs::read_to_string(dir.path().join("runs"))
            .unwrap_or_default()
            .lines()
            .count()
    };
    create(&p, uid(1), "h1", &["203.0.113.10"]).await.unwrap();

    // The first outage: fenced once, the address moves to uid(2) on h2.
    s.h1().faults().freeze();
    h1_dead(&p).await;
    let moved = create_replacing(&p, uid(2), "h2", &["203.0.113.10"], Some(uid(1)))
        .await
        .unwrap();
    assert_eq!(moved.egress, vec![ip("203.0.113.10")]);
    assert_eq!(runs(), 1);

    // h1 answers again (seen by its host checks only); its old copy is deleted, as a pool
    // does, and a new instance takes another address there.
    s.h1().faults().thaw();
    h1_back(&p).await;
    p.delete("h1", &uid(1)).await.unwrap();
    let back = create(&p, uid(3), "h1", &["203.0.113.11"]).await.unwrap();
    assert_eq!(back.egress, vec![ip("203.0.113.11")]);

    // The second outage: uid(3)'s replacement runs h1's fence command again, then moves.
    s.h1().faults().freeze();
    h1_dead(&p).await;
    let moved = create_replacing(&p, uid(4), "h2", &["203.0.113.11"], Some(uid(3)))
        .await
        .unwrap();
    assert_eq!(moved.egress, vec![ip("203.0.113.11")]);
    assert_eq!(runs(), 2, "the second outage has a fence of its own");

    // The third, declared by an administrator: the declaration frees what h1 holds now.
    s.h1().faults().thaw();
    h1_back(&p).await;
    p.delete("h1", &uid(3)).await.unwrap();
    create(&p, uid(5), "h1", &["203.0.113.12"]).await.unwrap();
    s.h1().faults().freeze();
    h1_dead(&p).await;
    assert_eq!(p.fence_host("h1").unwrap(), vec![ip("203.0.113.12")]);
    assert_eq!(runs(), 2, "an administrator's declaration runs no command");
}
