//! The frozen-host budget docs/operations.md states ("A host that stops answering"), on
//! libvirt-fake's freeze fault with every default setting, tokio's clock paused (the budgets
//! pass in virtual time, so the figures are exact): a call waiting on a frozen host fails
//! Transient at most 30 s after the host last answered (libvirt keepalive, 5 s × (5 + 1)); a
//! host check started at any moment after the freeze reports the host Timeout (while the
//! connection is still up) or Unreachable (once it was declared dead) within 10 s, the check's
//! call deadline; so a host-check loop every 30 s shows it within 40 s of the freeze.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use egress_provider::libvirt::check::CheckOptions;
use egress_provider::libvirt::config::{HostConfig, LibvirtEntry, VirtType};
use egress_provider::libvirt::hostpool::{Connector, HostPool, PoolOptions};
use egress_provider::libvirt::image::fetch::FetchOptions;
use egress_provider::libvirt::provider_impl::LibvirtProvider;
use egress_provider::libvirt::{mark, names};
use egress_provider::{ErrorClass, HostState, Provider, ProviderError, ProviderId, ProxyUid};
use libvirt_fake::{DomainSpec, FakeLibvirt, Interface, Lease, NetworkSpec, PoolSpec};
use libvirt_remote::Transport;
use tokio::time::Instant;

const ENTRY: &str = "home";

struct FakeConnector(FakeLibvirt);

#[async_trait]
impl Connector for FakeConnector {
    async fn connect(&self, _host: &HostConfig) -> Result<Transport, ProviderError> {
        Ok(self.0.connect_duplex())
    }
}

fn uid() -> ProxyUid {
    ProxyUid::parse_strict("0f8fad5b-d9cb-469f-a165-708677289501").unwrap()
}

fn setup() -> (FakeLibvirt, LibvirtProvider, ProviderId) {
    let u = uid();
    let fake = FakeLibvirt::new();
    fake.add_pool(PoolSpec::new("default")).unwrap();
    let mac = names::mac(ENTRY, &u);
    fake.add_network(NetworkSpec::new("egress").lease(Lease::new(
        mac.clone(),
        "192.168.122.5",
        24,
    )))
    .unwrap();
    fake.add_domain(
        DomainSpec::new(names::domain(ENTRY, &u))
            .metadata(
                mark::NAMESPACE,
                mark::render(&u, ENTRY, SystemTime::UNIX_EPOCH),
            )
            .running()
            .interface(Interface::new("eth0", mac).network("egress")),
    )
    .unwrap();
    let host = HostConfig {
        name: "h1".into(),
        address: "h1.invalid".into(),
        user: "root".into(),
        socket: "/run/libvirt/libvirt-sock".into(),
        pool: "default".into(),
        bridge: None,
        network: Some("egress".into()),
        virt_type: VirtType::Qemu,
        pool_reserve_gib: 0,
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
    };
    let entry = LibvirtEntry {
        name: ENTRY.into(),
        hosts: vec![host],
        images: Default::default(),
        url_images: Default::default(),
        max_image_bytes: 1 << 30,
        guest: Default::default(),
        timeouts: Default::default(),
        defaults: Default::default(),
        limits: Default::default(),
        policy: Default::default(),
        access: Default::default(),
        quotas: Default::default(),
    };
    let pool = HostPool::new(
        entry,
        Arc::new(FakeConnector(fake.clone())),
        PoolOptions::default(),
    )
    .unwrap();
    let p = LibvirtProvider::new(pool, FetchOptions::default(), CheckOptions::default());
    let id = ProviderId {
        entry: ENTRY.into(),
        host: "h1".into(),
        name: names::domain(ENTRY, &u),
    };
    (fake, p, id)
}

/// The documented budgets.
const KEEPALIVE_BUDGET: Duration = Duration::from_secs(30);
const CHECK_CALL: Duration = Duration::from_secs(10);
const CHECK_INTERVAL: Duration = Duration::from_secs(30);

#[tokio::test(start_paused = true)]
async fn a_call_waiting_on_a_frozen_host_fails_transient_within_30_s_of_its_last_answer() {
    for quiet in [0u64, 3, 4] {
        let (fake, p, id) = setup();
        p.get(&id, &uid()).await.unwrap();
        // Some quiet time after the last answer, as between two polls.
        tokio::time::sleep(Duration::from_secs(quiet)).await;
        let last_answer = Instant::now() - Duration::from_secs(quiet);
        fake.faults().freeze();
        let e = p.get(&id, &uid()).await.unwrap_err();
        let took = last_answer.elapsed();
        println!("quiet {quiet}s: the get failed {took:?} after the host last answered: {e}");
        assert_eq!(e.class, ErrorClass::Transient, "{e}");
        assert!(e.message.contains("keepalive"), "{e}");
        assert!(took <= KEEPALIVE_BUDGET, "{took:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_host_check_after_a_freeze_reports_the_host_within_its_call_deadline() {
    let (fake, p, id) = setup();
    p.get(&id, &uid()).await.unwrap();
    assert_eq!(p.check().await[0].state, HostState::Ready);
    fake.faults().freeze();
    let frozen = Instant::now();
    // While the connection is still up: the check's first call runs out its deadline.
    let t = Instant::now();
    let r = p.check().await;
    println!(
        "check right after the freeze: {:?} after {:?}: {:?}",
        r[0].state,
        t.elapsed(),
        r[0].error
    );
    assert_eq!(r[0].state, HostState::Timeout, "{r:?}");
    assert!(t.elapsed() <= CHECK_CALL, "{:?}", t.elapsed());
    // Once keepalive declared the connection dead, the check redials: the handshake runs out
    // the same deadline (timeouts.dial), Unreachable.
    tokio::time::sleep_until(frozen + KEEPALIVE_BUDGET).await;
    let t = Instant::now();
    let r = p.check().await;
    println!(
        "check after the link died: {:?} after {:?}: {:?}",
        r[0].state,
        t.elapsed(),
        r[0].error
    );
    assert_eq!(r[0].state, HostState::Unreachable, "{r:?}");
    assert!(t.elapsed() <= CHECK_CALL, "{:?}", t.elapsed());
}

#[tokio::test(start_paused = true)]
async fn with_checks_every_30_s_a_frozen_host_shows_within_40_s_whenever_it_freezes() {
    // The freeze lands at several points of the check cycle; the first check that starts
    // after it reports the host by then.
    for offset in [1u64, 10, 20, 29] {
        let (fake, p, id) = setup();
        p.get(&id, &uid()).await.unwrap();
        let cycle = Instant::now();
        assert_eq!(p.check().await[0].state, HostState::Ready);
        tokio::time::sleep_until(cycle + Duration::from_secs(offset)).await;
        fake.faults().freeze();
        let frozen = Instant::now();
        tokio::time::sleep_until(cycle + CHECK_INTERVAL).await;
        let r = p.check().await;
        let shown = frozen.elapsed();
        println!(
            "frozen {offset}s into the cycle: {:?} {shown:?} after the freeze",
            r[0].state
        );
        assert_ne!(r[0].state, HostState::Ready, "{r:?}");
        assert!(shown <= CHECK_INTERVAL + CHECK_CALL, "{shown:?}");
    }
}
