//! Which address of a guest the provider trusts, against libvirt-fake: only an address inside
//! the host's guest subnets (the libvirt network's `<ip>` subnets, narrowed by `guestCidr`, or
//! `guestCidr` alone on a bridge host); the host's DHCP lease for our MAC wins over the guest
//! agent when they disagree; without known subnets the agent is not believed; a network whose
//! XML cannot be read never fails a `get`; the provider reads a host's subnets once per
//! connection.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use egress_provider::libvirt::check::CheckOptions;
use egress_provider::libvirt::config::{HostConfig, LibvirtEntry, VirtType};
use egress_provider::libvirt::hostpool::{Connector, HostPool, PoolOptions};
use egress_provider::libvirt::image::fetch::FetchOptions;
use egress_provider::libvirt::ops::get;
use egress_provider::libvirt::provider_impl::LibvirtProvider;
use egress_provider::libvirt::{mark, names};
use egress_provider::{InstanceState, Provider, ProviderError, ProviderId, ProxyUid};
use libvirt_fake::{DomainSpec, FakeLibvirt, Interface, Lease, NetworkSpec, PoolSpec};
use libvirt_remote::proto::procs;
use libvirt_remote::{Client, OpenOptions, Transport};

const ENTRY: &str = "home";
/// Deadline of every call in these tests (the fake answers at once).
const CALL_BUDGET: Duration = Duration::from_secs(10);
const NET_XML: &str = "<network><name>egress</name><bridge name='virbr0'/>\
                       <ip address='192.168.100.1' prefix='24'><dhcp/></ip></network>";
/// `VIR_ERR_INTERNAL_ERROR`.
const CODE_INTERNAL: i32 = 1;
/// `VIR_FROM_NETWORK`.
const FROM_NETWORK: i32 = 19;

fn uid(n: u8) -> ProxyUid {
    ProxyUid::parse_strict(&format!("0f8fad5b-d9cb-469f-a165-7086772895{n:02x}")).unwrap()
}

fn ip(s: &str) -> Option<IpAddr> {
    Some(s.parse().unwrap())
}

/// A host attached to network `egress` (`network`) or to a bridge, with `guest_cidr`.
fn host(network: bool, guest_cidr: &[&str]) -> HostConfig {
    HostConfig {
        name: "h1".into(),
        address: "127.0.0.1:22".into(),
        user: "root".into(),
        socket: "/run/libvirt/libvirt-sock".into(),
        pool: "default".into(),
        bridge: (!network).then(|| "br0".into()),
        network: network.then(|| "egress".into()),
        virt_type: VirtType::Auto,
        pool_reserve_gib: 0,
        ssh_key_file: None,
        known_hosts_file: None,
        max_concurrent: 4,
        guest_cidr: guest_cidr.iter().map(|s| (*s).to_owned()).collect(),
        address_pool: None,
        maintenance: Default::default(),
        segment: None,
        fence: None,
        host_addresses: Vec::new(),
        capacity: Default::default(),
        access: None,
    }
}

/// A fake holding network `egress` ([`NET_XML`]) leasing `lease_ip` (if any) to our MAC and a
/// running domain of ours whose guest agent reports `agent_ip` on our NIC (attached to the
/// network when `on_network`).
fn fake_with(
    u: &ProxyUid,
    agent_ip: &str,
    lease_ip: Option<&str>,
    on_network: bool,
) -> FakeLibvirt {
    let fake = FakeLibvirt::new();
    fake.add_pool(PoolSpec::new("default")).unwrap();
    let mac = names::mac(ENTRY, u);
    let mut net = NetworkSpec::new("egress").xml(NET_XML);
    if let Some(ip) = lease_ip {
        net = net.lease(Lease::new(mac.clone(), ip, 24));
    }
    fake.add_network(net).unwrap();
    let mut nic = Interface::new("eth0", mac).addr(agent_ip, 24);
    if on_network {
        nic = nic.network("egress");
    }
    let created = SystemTime::UNIX_EPOCH + Duration::from_secs(1_790_000_000);
    fake.add_domain(
        DomainSpec::new(names::domain(ENTRY, u))
            .metadata(mark::NAMESPACE, mark::render(u, ENTRY, created))
            .running()
            .interface(nic),
    )
    .unwrap();
    fake
}

fn id_of(u: &ProxyUid) -> ProviderId {
    ProviderId {
        entry: ENTRY.into(),
        host: "h1".into(),
        name: names::domain(ENTRY, u),
    }
}

/// What `get` reports for `u` on `h` through a fresh connection to `fake`.
async fn get_on(
    fake: &FakeLibvirt,
    h: &HostConfig,
    u: &ProxyUid,
) -> (InstanceState, Option<IpAddr>) {
    let c = tokio::time::timeout(
        CALL_BUDGET,
        Client::open(fake.connect_duplex(), OpenOptions::default()),
    )
    .await
    .unwrap()
    .unwrap();
    let inst = tokio::time::timeout(CALL_BUDGET, get::get(&c, ENTRY, None, h, &id_of(u), u))
        .await
        .unwrap()
        .unwrap();
    (inst.state, inst.ip)
}

/// `get` on a network host for a guest whose agent says `agent_ip` and whose lease (if any)
/// says `lease_ip`.
async fn observed(
    u: ProxyUid,
    agent_ip: &str,
    lease_ip: Option<&str>,
) -> (InstanceState, Option<IpAddr>) {
    let fake = fake_with(&u, agent_ip, lease_ip, true);
    get_on(&fake, &host(true, &[]), &u).await
}

#[tokio::test]
async fn a_guest_agent_address_outside_the_network_subnet_is_never_used() {
    // finding: M22
    let (state, got) = observed(uid(1), "10.0.0.5", None).await;
    assert_eq!(got, None, "an address the guest chose outside its network");
    assert_eq!(state, InstanceState::Provisioning);
    // Inside the subnet (and no lease to contradict it), the agent's answer is used.
    let (state, got) = observed(uid(2), "192.168.100.50", None).await;
    assert_eq!(got, ip("192.168.100.50"));
    assert_eq!(state, InstanceState::Running);
}

#[tokio::test]
async fn the_lease_for_our_mac_wins_over_a_disagreeing_guest_agent() {
    // finding: M22
    let (state, got) = observed(uid(3), "192.168.100.50", Some("192.168.100.20")).await;
    assert_eq!(got, ip("192.168.100.20"));
    assert_eq!(state, InstanceState::Running);
}

#[tokio::test]
async fn guest_cidr_bounds_a_bridge_host_and_narrows_a_network() {
    // finding: M22
    let u = uid(4);
    // A bridge host: guestCidr is the only bound.
    let bridge = host(false, &["10.20.0.0/16"]);
    let fake = fake_with(&u, "10.20.1.5", None, false);
    assert_eq!(get_on(&fake, &bridge, &u).await.1, ip("10.20.1.5"));
    let fake = fake_with(&u, "10.21.1.5", None, false);
    assert_eq!(
        get_on(&fake, &bridge, &u).await,
        (InstanceState::Provisioning, None)
    );
    // A single CIDR or a list: any of them admits.
    let two = host(false, &["10.21.0.0/16", "10.20.0.0/16"]);
    assert_eq!(get_on(&fake, &two, &u).await.1, ip("10.21.1.5"));

    // A network host: guestCidr narrows the network's /24 to its upper half; the lease in
    // the lower half is not used, the agent's address in the upper half is.
    let narrowed = host(true, &["192.168.100.128/25"]);
    let fake = fake_with(&u, "192.168.100.200", Some("192.168.100.20"), true);
    assert_eq!(get_on(&fake, &narrowed, &u).await.1, ip("192.168.100.200"));
    let fake = fake_with(&u, "192.168.100.30", Some("192.168.100.20"), true);
    assert_eq!(get_on(&fake, &narrowed, &u).await.1, None);
    // guestCidr never widens the network: an address outside the network is not used.
    let wider = host(true, &["10.0.0.0/8"]);
    let fake = fake_with(&u, "10.0.0.5", None, true);
    assert_eq!(get_on(&fake, &wider, &u).await.1, None);
}

#[tokio::test]
async fn without_known_subnets_the_guest_agent_is_not_believed() {
    // finding: M22
    // A bridge host without guestCidr: only the host's lease and ARP answers count, and the
    // fake host has none for a NIC outside its networks.
    let u = uid(5);
    let fake = fake_with(&u, "10.0.0.5", None, false);
    assert_eq!(
        get_on(&fake, &host(false, &[]), &u).await,
        (InstanceState::Provisioning, None)
    );
    assert_eq!(fake.calls(procs::NETWORK_GET_XML_DESC), 0);
}

#[tokio::test]
async fn a_network_whose_subnets_cannot_be_read_does_not_fail_get() {
    // finding: M22
    let u = uid(6);
    let fake = fake_with(&u, "10.0.0.5", Some("192.168.100.20"), true);
    fake.faults().fail_calls(
        procs::NETWORK_GET_XML_DESC,
        CODE_INTERNAL,
        FROM_NETWORK,
        "internal error: cannot read the network",
        None,
    );
    // The host's lease is still used; the agent, unbounded now, is not asked.
    assert_eq!(
        get_on(&fake, &host(true, &[]), &u).await,
        (InstanceState::Running, ip("192.168.100.20"))
    );
    // Without a lease: no address (not a failure), however the agent disagrees.
    let fake = fake_with(&u, "10.0.0.5", None, true);
    fake.faults().fail_calls(
        procs::NETWORK_LOOKUP_BY_NAME,
        CODE_INTERNAL,
        FROM_NETWORK,
        "internal error",
        None,
    );
    assert_eq!(
        get_on(&fake, &host(true, &[]), &u).await,
        (InstanceState::Provisioning, None)
    );
    // With guestCidr, the agent is bounded by it alone meanwhile.
    assert_eq!(
        get_on(&fake, &host(true, &["10.0.0.0/24"]), &u).await.1,
        ip("10.0.0.5")
    );
}

struct FakeConnector(FakeLibvirt);

#[async_trait]
impl Connector for FakeConnector {
    async fn connect(&self, _host: &HostConfig) -> Result<Transport, ProviderError> {
        Ok(self.0.connect_duplex())
    }
}

fn provider(fake: &FakeLibvirt) -> LibvirtProvider {
    let entry = LibvirtEntry {
        name: ENTRY.into(),
        hosts: vec![host(true, &[])],
        images: Default::default(),
        url_images: Default::default(),
        max_image_bytes: 1 << 30,
        guest: Default::default(),
        timeouts: Default::default(),
        defaults: Default::default(),
        limits: Default::default(),
        policy: Default::default(),
        access: None,
        quotas: Default::default(),
    };
    let pool = HostPool::new(
        entry,
        Arc::new(FakeConnector(fake.clone())),
        PoolOptions::default(),
    )
    .unwrap();
    LibvirtProvider::new(pool, FetchOptions::default(), CheckOptions::default())
}

#[tokio::test]
async fn the_provider_reads_a_hosts_subnets_once_per_connection_and_retries_a_failed_read() {
    let u = uid(7);
    let fake = fake_with(&u, "10.0.0.5", Some("192.168.100.20"), true);
    let p = provider(&fake);
    // The first read fails: not cached, the next get reads again.
    fake.faults().fail_calls(
        procs::NETWORK_GET_XML_DESC,
        CODE_INTERNAL,
        FROM_NETWORK,
        "internal error",
        Some(1),
    );
    let inst = p.get(&id_of(&u), &u).await.unwrap();
    assert_eq!(inst.ip, ip("192.168.100.20"));
    for _ in 0..5 {
        let inst = p.get(&id_of(&u), &u).await.unwrap();
        assert_eq!(inst.ip, ip("192.168.100.20"));
    }
    assert_eq!(
        fake.calls(procs::NETWORK_GET_XML_DESC),
        2,
        "one failed read, then one read for every later get on the connection"
    );
}
