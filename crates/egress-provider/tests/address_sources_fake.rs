//! An address source that errors (libvirt-fake's ARP fault, here with the error libvirtd
//! reports when its neighbour dump itself fails) is named with its error and the other
//! sources are still asked: the lease or the guest agent still give the address; when they
//! have none yet the instance is Provisioning with a note naming the failed source; when no
//! source can answer, the Transient error names each source's error and each source not
//! consulted with why. The error libvirtd answers for an EMPTY neighbour table ("malformed
//! netlink response message") is no failure: the table answered, with no entry.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use egress_provider::libvirt::config::{HostConfig, VirtType};
use egress_provider::libvirt::ops::get;
use egress_provider::libvirt::{mark, names};
use egress_provider::{ErrorClass, Instance, InstanceState, ProviderError, ProviderId, ProxyUid};
use libvirt_fake::{DomainSpec, FakeLibvirt, Interface, Lease, NetworkSpec, PoolSpec};
use libvirt_remote::{Client, OpenOptions};

const ENTRY: &str = "home";
/// Deadline of every call in these tests (the fake answers at once).
const CALL_BUDGET: Duration = Duration::from_secs(10);
const NET_XML: &str = "<network><name>egress</name><bridge name='virbr0'/>\
                       <ip address='192.168.100.1' prefix='24'><dhcp/></ip></network>";
/// What libvirtd's ARP source answers when the neighbour dump itself fails.
const NETLINK: &str = "error dumping neighbor table: Operation not permitted";
/// What libvirtd 11.3's ARP source answers when the host's neighbour table is empty (observed
/// with `virsh domifaddr --source arp` on a fresh network namespace too).
const EMPTY_TABLE: &str = "malformed netlink response message";

fn uid() -> ProxyUid {
    ProxyUid::parse_strict("0f8fad5b-d9cb-469f-a165-708677289577").unwrap()
}

/// A host on network `egress`, or on a bridge when `network` is false, with `guest_cidr`.
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

/// A fake whose ARP source is broken, holding network `egress` (leasing `lease_ip` to our
/// MAC, if given) and a running domain of ours (on the network when `on_network`) whose
/// guest agent reports `agent_ip` (no agent when `None`).
fn broken_arp(lease_ip: Option<&str>, agent_ip: Option<&str>, on_network: bool) -> FakeLibvirt {
    let u = uid();
    let fake = FakeLibvirt::new();
    fake.add_pool(PoolSpec::new("default")).unwrap();
    let mac = names::mac(ENTRY, &u);
    let mut net = NetworkSpec::new("egress").xml(NET_XML);
    if let Some(ip) = lease_ip {
        net = net.lease(Lease::new(mac.clone(), ip, 24));
    }
    fake.add_network(net).unwrap();
    let mut nic = Interface::new("eth0", mac);
    if let Some(ip) = agent_ip {
        nic = nic.addr(ip, 24);
    }
    if on_network {
        nic = nic.network("egress");
    }
    let created = SystemTime::UNIX_EPOCH + Duration::from_secs(1_790_000_000);
    fake.add_domain(
        DomainSpec::new(names::domain(ENTRY, &u))
            .metadata(mark::NAMESPACE, mark::render(&u, ENTRY, created))
            .running()
            .guest_agent(agent_ip.is_some())
            .interface(nic),
    )
    .unwrap();
    fake.faults().arp_error(Some(NETLINK));
    fake
}

async fn get_on(fake: &FakeLibvirt, h: &HostConfig) -> Result<Instance, ProviderError> {
    let u = uid();
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
    tokio::time::timeout(CALL_BUDGET, get::get(&c, ENTRY, None, h, &id, &u))
        .await
        .unwrap()
}

fn ip(s: &str) -> Option<IpAddr> {
    Some(s.parse().unwrap())
}

#[tokio::test]
async fn a_broken_arp_source_never_hides_the_lease_or_the_guest_agent() {
    // The lease answers: used, no note.
    let fake = broken_arp(Some("192.168.100.20"), None, true);
    let i = get_on(&fake, &host(true, &[])).await.unwrap();
    assert_eq!(
        (i.state.clone(), i.ip, i.address_note.clone()),
        (InstanceState::Running, ip("192.168.100.20"), None),
        "{i:?}"
    );
    // No lease yet (a static guest, or DHCP not done): ARP fails, the agent is still asked
    // (the network's subnet bounds it) and its address is used.
    let fake = broken_arp(None, Some("192.168.100.50"), true);
    let i = get_on(&fake, &host(true, &[])).await.unwrap();
    assert_eq!(
        (i.state.clone(), i.ip),
        (InstanceState::Running, ip("192.168.100.50")),
        "{i:?}"
    );
    // A bridge host with guestCidr: ARP fails, the agent answers inside it.
    let fake = broken_arp(None, Some("10.20.1.5"), false);
    let i = get_on(&fake, &host(false, &["10.20.0.0/16"]))
        .await
        .unwrap();
    assert_eq!(
        (i.state.clone(), i.ip),
        (InstanceState::Running, ip("10.20.1.5")),
        "{i:?}"
    );
}

#[tokio::test]
async fn a_failed_source_is_named_beside_no_address_yet() {
    // The lease answered (none yet), ARP failed, the agent is not connected: no address yet,
    // and the note says ARP failed and why.
    let fake = broken_arp(None, Some("192.168.100.50"), true);
    fake.faults().agent_unresponsive(true);
    let i = get_on(&fake, &host(true, &[])).await.unwrap();
    assert_eq!(
        (i.state.clone(), i.ip),
        (InstanceState::Provisioning, None),
        "{i:?}"
    );
    let note = i.address_note.expect("the failed source is reported");
    assert!(note.contains("ARP") && note.contains(NETLINK), "{note}");
    // Once ARP works again, the note goes.
    fake.faults().arp_error(None);
    let i = get_on(&fake, &host(true, &[])).await.unwrap();
    assert_eq!(i.address_note, None, "{i:?}");
}

#[tokio::test]
async fn when_no_source_can_answer_the_error_names_each_one() {
    // A bridge host without guestCidr: ARP is the only source it may use, and it fails.
    let fake = broken_arp(None, Some("10.20.1.5"), false);
    let e = get_on(&fake, &host(false, &[])).await.unwrap_err();
    println!("{e}");
    assert_eq!(e.class, ErrorClass::Transient, "{e}");
    let m = &e.message;
    assert!(
        m.contains("ARP") && m.contains(NETLINK),
        "ARP's own error: {m}"
    );
    assert!(
        m.contains("DHCP leases: not consulted") && m.contains("hosts[h1].network"),
        "why the lease was not read: {m}"
    );
    assert!(
        m.contains("guest agent: not asked") && m.contains("hosts[h1].guestCidr"),
        "why the agent was not asked, and what to set: {m}"
    );
}

#[tokio::test]
async fn an_empty_neighbour_table_is_an_answer_with_no_address_not_a_failure() {
    // A bridge host without guestCidr: ARP is the only source it may use. libvirtd reports
    // its empty neighbour table as "malformed netlink response message": the table answered
    // (nothing yet), so the instance is Provisioning without a failure note, never an error.
    let fake = broken_arp(None, Some("10.20.1.5"), false);
    fake.faults().arp_error(Some(EMPTY_TABLE));
    let i = get_on(&fake, &host(false, &[])).await.unwrap();
    assert_eq!(
        (i.state.clone(), i.ip, i.address_note.clone()),
        (InstanceState::Provisioning, None, None),
        "{i:?}"
    );
    // With the agent trusted (guestCidr), it is still asked and its address used.
    let i = get_on(&fake, &host(false, &["10.20.0.0/16"]))
        .await
        .unwrap();
    assert_eq!(
        (i.state.clone(), i.ip, i.address_note.clone()),
        (InstanceState::Running, ip("10.20.1.5"), None),
        "{i:?}"
    );
    // Any other ARP error is still a failure, named as such.
    fake.faults().arp_error(Some(NETLINK));
    let e = get_on(&fake, &host(false, &[])).await.unwrap_err();
    assert!(e.message.contains(NETLINK), "{e}");
}
