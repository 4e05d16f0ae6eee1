//! The address of OUR NIC in a running domain: the libvirt network's DHCP lease for the MAC
//! we gave the NIC (hosts that attach to a `network`), else the host's ARP table for that MAC,
//! else the guest agent's view of the interface with that MAC.
//!
//! Guarantees:
//! - only an interface whose MAC equals ours (case-insensitively) is ever read; `docker0`,
//!   `tailscale0` and any other guest interface are ignored whatever their order (finding M14);
//! - IPv4 is preferred; loopback, link-local, unspecified and multicast addresses are skipped;
//! - trusted addresses: the host's answers (lease, ARP) win over the guest's (the agent runs
//!   inside the guest, whose author controls it): the agent is asked only when neither has an
//!   address for our MAC. On a host attached to a libvirt `network`, every address from any
//!   source must lie in one of that network's subnets (its `<ip address prefix|netmask>`);
//!   one outside is ignored, so the operator never probes (nor sends a proxy's credentials
//!   to) an address the guest chose outside its network. A network whose subnets cannot be
//!   read yields no trusted address (Transient on connection-class failures);
//! - a source that is merely unavailable (agent not configured or not connected, the domain
//!   not running, the source unsupported) is "no address from it"; only when every source
//!   consulted answered and none had an address is the result `None` ("no address yet");
//! - a connection-class failure or a timeout while reading fails the read Transient, never
//!   "no address" (finding H3); a domain that vanished meanwhile is NotFound (finding L6); a
//!   read where no source answered at all is Transient, naming each source's error.
//!   Address-read failures are never Permanent: they must not latch a running proxy Failed.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use libvirt_remote::client::addr_source;
use libvirt_remote::proto::{Domain, DomainInterface};
use libvirt_remote::{Client, Error as LvError};

use super::{
    CODE_AGENT_UNRESPONSIVE, CODE_ARGUMENT_UNSUPPORTED, CODE_NO_DOMAIN, CODE_NO_NETWORK,
    CODE_NO_SUPPORT, CODE_OPERATION_INVALID, is_code, is_connection_class,
};
use crate::error::ProviderError;
use crate::libvirt::config::HostConfig;

/// One place an address can come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Agent,
    Lease,
    Arp,
}

impl Source {
    fn wire(self) -> u32 {
        match self {
            Self::Agent => addr_source::AGENT,
            Self::Lease => addr_source::LEASE,
            Self::Arp => addr_source::ARP,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Self::Agent => "the guest agent",
            Self::Lease => "the libvirt network's DHCP leases",
            Self::Arp => "the host's ARP table",
        }
    }

    /// Codes meaning "this source has nothing to say now", not "reading failed".
    fn unavailable(self, e: &LvError) -> bool {
        let common = [CODE_NO_SUPPORT, CODE_OPERATION_INVALID];
        let codes: &[i32] = match self {
            // 74: no agent channel configured; 86: agent not connected / not answering.
            Self::Agent => &[CODE_ARGUMENT_UNSUPPORTED, CODE_AGENT_UNRESPONSIVE],
            // 43: the network is gone; 74: the NIC is not on a libvirt network.
            Self::Lease => &[CODE_NO_NETWORK, CODE_ARGUMENT_UNSUPPORTED],
            Self::Arp => &[],
        };
        e.libvirt_code()
            .is_some_and(|c| common.contains(&c) || codes.contains(&c))
    }
}

/// Reads the address of the NIC with MAC `mac` of the running domain `dom` on `host`.
/// `Ok(None)`: every source answered and none knows an address for our MAC yet.
pub async fn address(
    client: &Client,
    dom: &Domain,
    mac: &str,
    host: &HostConfig,
) -> Result<Option<IpAddr>, ProviderError> {
    // NB: the host's own sources first: a guest agent may report any address it likes.
    let mut sources = Vec::new();
    let subnets = match &host.network {
        Some(net) => {
            sources.push(Source::Lease);
            Some(network_subnets(client, net, host).await?)
        }
        None => None,
    };
    sources.push(Source::Arp);
    sources.push(Source::Agent);

    let mut answered = false;
    let mut failures = Vec::new();
    for src in sources {
        match client.domain_interface_addresses(dom, src.wire()).await {
            Ok(ifaces) => {
                answered = true;
                if let Some(ip) = pick_within(&ifaces, mac, subnets.as_deref()) {
                    return Ok(Some(ip));
                }
            }
            Err(e) if is_code(&e, CODE_NO_DOMAIN) => {
                return Err(ProviderError::not_found(format!(
                    "domain {} on host {} vanished while its address was read",
                    dom.name, host.name
                ))
                .with_code(e.libvirt_code()));
            }
            Err(e) if is_connection_class(&e) => {
                return Err(ProviderError::transient(format!(
                    "reading the address of domain {} on host {} from {}: {e}",
                    dom.name,
                    host.name,
                    src.describe()
                ))
                .with_code(e.libvirt_code()));
            }
            Err(e) if src.unavailable(&e) => {
                tracing::debug!(domain = %dom.name, host = %host.name, source = src.describe(),
                    error = %e, "address source unavailable");
                answered = true;
            }
            Err(e) => {
                tracing::debug!(domain = %dom.name, host = %host.name, source = src.describe(),
                    error = %e, "address source failed");
                failures.push((src, e));
            }
        }
    }
    if answered {
        return Ok(None);
    }
    let detail = failures
        .iter()
        .map(|(s, e)| format!("{}: {e}", s.describe()))
        .collect::<Vec<_>>()
        .join("; ");
    let code = failures.first().and_then(|(_, e)| e.libvirt_code());
    Err(ProviderError::transient(format!(
        "reading the address of domain {} on host {}: every source failed ({detail})",
        dom.name, host.name
    ))
    .with_code(code))
}

/// The subnets of the libvirt network `net` on `host`: its `<ip>` elements' address and
/// prefix (or IPv4 netmask). Connection-class failures are Transient; any other failure, or a
/// network without an `<ip>`, is an empty list (no address is then trusted).
async fn network_subnets(
    client: &Client,
    net: &str,
    host: &HostConfig,
) -> Result<Vec<(IpAddr, u8)>, ProviderError> {
    let read = async {
        let n = client.network_lookup_by_name(net).await?;
        client.network_xml(&n).await
    };
    match read.await {
        Ok(xml) => Ok(parse_subnets(&xml)),
        Err(e) if is_connection_class(&e) => Err(ProviderError::transient(format!(
            "reading the subnets of network {net} on host {}: {e}",
            host.name
        ))
        .with_code(e.libvirt_code())),
        Err(e) => {
            tracing::warn!(network = net, host = %host.name, error = %e,
                "cannot read the network's subnets; no guest address is trusted");
            Ok(Vec::new())
        }
    }
}

/// The `(address, prefix)` of every top-level `<ip>` element of a libvirt network XML.
pub fn parse_subnets(xml: &str) -> Vec<(IpAddr, u8)> {
    use quick_xml::events::Event;
    let mut reader = quick_xml::Reader::from_str(xml);
    let mut depth = 0usize;
    let mut out = Vec::new();
    loop {
        let (e, opens) = match reader.read_event() {
            Ok(Event::Start(e)) => (e, true),
            Ok(Event::Empty(e)) => (e, false),
            Ok(Event::End(_)) => {
                depth = depth.saturating_sub(1);
                continue;
            }
            Ok(Event::Eof) | Err(_) => break,
            Ok(_) => continue,
        };
        if depth == 1 && e.local_name().as_ref() == "ip" {
            let attr = |k: &str| {
                e.attributes()
                    .flatten()
                    .find(|a| a.key.as_ref() == k)
                    .map(|a| a.value.into_owned())
            };
            let addr = attr("address").and_then(|a| a.trim().parse::<IpAddr>().ok());
            let prefix = attr("prefix")
                .and_then(|p| p.trim().parse::<u8>().ok())
                .or_else(|| {
                    attr("netmask")
                        .and_then(|m| m.trim().parse::<Ipv4Addr>().ok())
                        .and_then(|m| {
                            let bits = u32::from(m);
                            // A netmask is contiguous ones.
                            (bits.leading_ones() + bits.trailing_zeros() == 32)
                                .then(|| u8::try_from(bits.leading_ones()).ok())
                                .flatten()
                        })
                });
            if let (Some(a), Some(p)) = (addr, prefix) {
                let max = if a.is_ipv4() { 32 } else { 128 };
                if p <= max {
                    out.push((a, p));
                }
            }
        }
        if opens {
            depth += 1;
        }
    }
    out
}

/// Whether `ip` lies in the subnet `net`/`prefix` (same family).
pub fn in_subnet(ip: IpAddr, (net, prefix): (IpAddr, u8)) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// [`pick`] among the addresses inside `subnets` only (`None`: no subnet is known, every
/// usable address counts).
pub fn pick_within(
    ifaces: &[DomainInterface],
    mac: &str,
    subnets: Option<&[(IpAddr, u8)]>,
) -> Option<IpAddr> {
    let Some(subnets) = subnets else {
        return pick(ifaces, mac);
    };
    let inside: Vec<DomainInterface> = ifaces
        .iter()
        .map(|i| DomainInterface {
            name: i.name.clone(),
            hwaddr: i.hwaddr.clone(),
            addrs: i
                .addrs
                .iter()
                .filter(|a| {
                    a.addr
                        .trim()
                        .parse::<IpAddr>()
                        .is_ok_and(|ip| subnets.iter().any(|s| in_subnet(ip, *s)))
                })
                .cloned()
                .collect(),
        })
        .collect();
    pick(&inside, mac)
}

/// The best address of the interfaces whose hardware address is `mac`: the first usable IPv4,
/// else the first usable IPv6.
pub fn pick(ifaces: &[DomainInterface], mac: &str) -> Option<IpAddr> {
    let ours = ifaces.iter().filter(|i| {
        i.hwaddr
            .as_deref()
            .is_some_and(|h| h.trim().eq_ignore_ascii_case(mac))
    });
    let addrs: Vec<IpAddr> = ours
        .flat_map(|i| i.addrs.iter())
        .filter_map(|a| a.addr.trim().parse::<IpAddr>().ok())
        .filter(usable)
        .collect();
    addrs
        .iter()
        .copied()
        .find(IpAddr::is_ipv4)
        .or_else(|| addrs.first().copied())
}

fn usable(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => usable_v4(v4),
        IpAddr::V6(v6) => usable_v6(v6),
    }
}

fn usable_v4(ip: &Ipv4Addr) -> bool {
    !(ip.is_loopback()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_multicast()
        || ip.is_broadcast())
}

fn usable_v6(ip: &Ipv6Addr) -> bool {
    !(ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || ip.is_unicast_link_local()
        || ip.to_ipv4_mapped().is_some())
}

#[cfg(test)]
mod tests {
    use libvirt_remote::proto::DomainIpAddr;

    use super::*;

    fn iface(name: &str, mac: &str, addrs: &[&str]) -> DomainInterface {
        DomainInterface {
            name: name.into(),
            hwaddr: Some(mac.into()),
            addrs: addrs
                .iter()
                .map(|a| DomainIpAddr {
                    kind: i32::from(a.contains(':')),
                    addr: (*a).into(),
                    prefix: 24,
                })
                .collect(),
        }
    }

    #[test]
    fn only_the_interface_with_our_mac_counts() {
        // finding: M14
        let ifaces = [
            iface("lo", "00:00:00:00:00:00", &["127.0.0.1", "::1"]),
            iface("docker0", "02:42:ac:11:00:01", &["172.17.0.1"]),
            iface("tailscale0", "", &["100.64.0.7"]),
            iface(
                "eth0",
                "52:54:00:AB:CD:EF",
                &["fe80::1", "2001:db8::5", "10.0.0.5"],
            ),
        ];
        assert_eq!(
            pick(&ifaces, "52:54:00:ab:cd:ef"),
            Some("10.0.0.5".parse().unwrap())
        );
        assert_eq!(pick(&ifaces, "52:54:00:00:00:01"), None);
    }

    #[test]
    fn subnets_come_from_the_network_xml_and_bound_the_picked_address() {
        let xml = "<network><name>n</name><bridge name='virbr9'/>\
                   <ip address='192.168.122.1' netmask='255.255.255.0'><dhcp/></ip>\
                   <ip family='ipv6' address='fd00::1' prefix='64'/>\
                   <portgroup><ip address='10.9.9.9' prefix='8'/></portgroup></network>";
        let subnets = parse_subnets(xml);
        assert_eq!(
            subnets,
            vec![
                ("192.168.122.1".parse().unwrap(), 24),
                ("fd00::1".parse().unwrap(), 64)
            ]
        );
        let ifaces = [iface(
            "eth0",
            "52:54:00:01:02:03",
            &["10.0.0.5", "192.168.122.77"],
        )];
        assert_eq!(
            pick_within(&ifaces, "52:54:00:01:02:03", Some(&subnets)),
            Some("192.168.122.77".parse().unwrap())
        );
        let outside = [iface("eth0", "52:54:00:01:02:03", &["10.0.0.5"])];
        assert_eq!(
            pick_within(&outside, "52:54:00:01:02:03", Some(&subnets)),
            None
        );
        assert_eq!(pick_within(&outside, "52:54:00:01:02:03", Some(&[])), None);
        assert!(!in_subnet(
            "192.168.123.1".parse().unwrap(),
            ("192.168.122.1".parse().unwrap(), 24)
        ));
    }

    #[test]
    fn link_local_and_loopback_are_skipped_and_ipv6_is_a_fallback() {
        let ifaces = [iface(
            "eth0",
            "52:54:00:01:02:03",
            &["169.254.3.4", "fe80::2", "2001:db8::9"],
        )];
        assert_eq!(
            pick(&ifaces, "52:54:00:01:02:03"),
            Some("2001:db8::9".parse().unwrap())
        );
        let none = [iface(
            "eth0",
            "52:54:00:01:02:03",
            &["169.254.3.4", "fe80::2"],
        )];
        assert_eq!(pick(&none, "52:54:00:01:02:03"), None);
    }
}
