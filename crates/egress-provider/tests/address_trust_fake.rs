//! Which address of a guest the provider trusts, against libvirt-fake: on a host attached to
//! a libvirt network, only an address inside the network's subnet; the host's DHCP lease for
//! our MAC wins over the guest agent when they disagree.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::{Duration, SystemTime};

use egress_provider::libvirt::config::{HostConfig, VirtType};
use egress_provider::libvirt::ops::get;
use egress_provider::libvirt::{mark, names};
use egress_provider::{InstanceState, ProviderId, ProxyUid};
use libvirt_fake::{DomainSpec, FakeLibvirt, Interface, Lease, NetworkSpec, PoolSpec};
use libvirt_remote::{Client, OpenOptions};

const ENTRY: &str = "home";
/// Deadline of every call in these tests (the fake answers at once).
const CALL_BUDGET: Duration = Duration::from_secs(10);
const NET_XML: &str = "<network><name>egress</name><bridge name='virbr0'/>\
                       <ip address='192.168.100.1' prefix='24'/></network>";

fn uid(n: u8) -> ProxyUid {
    ProxyUid::parse_strict(&format!("0f8fad5b-d9cb-469f-a165-7086772895{n:02x}")).unwrap()
}

fn host() -> HostConfig {
    HostConfig {
        name: "h1".into(),
        address: "127.0.0.1:22".into(),
        user: "root".into(),
        socket: "/run/libvirt/libvirt-sock".into(),
        pool: "default".into(),
        bridge: None,
        network: Some("egress".into()),
        virt_type: VirtType::Auto,
        pool_reserve_gib: 0,
        ssh_key_file: None,
        known_hosts_file: None,
        max_concurrent: 4,
    }
}

/// A running domain of ours whose guest agent reports `agent_ip` on our NIC, on a network
/// leasing `lease_ip` (if any) to our MAC; returns what `get` reports.
async fn observed(
    u: ProxyUid,
    agent_ip: &str,
    lease_ip: Option<&str>,
) -> (InstanceState, Option<std::net::IpAddr>) {
    let fake = FakeLibvirt::new();
    fake.add_pool(PoolSpec::new("default")).unwrap();
    let mac = names::mac(ENTRY, &u);
    let mut net = NetworkSpec::new("egress").xml(NET_XML);
    if let Some(ip) = lease_ip {
        net = net.lease(Lease::new(mac.clone(), ip, 24));
    }
    fake.add_network(net).unwrap();
    let created = SystemTime::UNIX_EPOCH + Duration::from_secs(1_790_000_000);
    fake.add_domain(
        DomainSpec::new(names::domain(ENTRY, &u))
            .metadata(mark::NAMESPACE, mark::render(&u, ENTRY, created))
            .running()
            .interface(
                Interface::new("eth0", mac)
                    .network("egress")
                    .addr(agent_ip, 24),
            ),
    )
    .unwrap();
    let c = tokio::time::timeout(
        CALL_BUDGET,
        Client::open(fake.connect_duplex(), OpenOptions::default()),
    )
    .await
    .unwrap()
    .unwrap();
    let id = ProviderId {
        entry: ENTRY.into(),
        host: "h1".into(),
        name: names::domain(ENTRY, &u),
    };
    let inst = tokio::time::timeout(CALL_BUDGET, get::get(&c, ENTRY, None, &host(), &id, &u))
        .await
        .unwrap()
        .unwrap();
    (inst.state, inst.ip)
}

#[tokio::test]
async fn a_guest_agent_address_outside_the_network_subnet_is_never_used() {
    let (state, ip) = observed(uid(1), "10.0.0.5", None).await;
    assert_eq!(ip, None, "an address the guest chose outside its network");
    assert_eq!(state, InstanceState::Provisioning);
    // Inside the subnet (and no lease to contradict it), the agent's answer is used.
    let (_, ip) = observed(uid(2), "192.168.100.50", None).await;
    assert_eq!(ip, Some("192.168.100.50".parse().unwrap()));
}

#[tokio::test]
async fn the_lease_for_our_mac_wins_over_a_disagreeing_guest_agent() {
    let (state, ip) = observed(uid(3), "192.168.100.50", Some("192.168.100.20")).await;
    assert_eq!(ip, Some("192.168.100.20".parse().unwrap()));
    assert_eq!(state, InstanceState::Running);
}
