//! The address of OUR NIC in a running domain, from the host's answers first: the libvirt
//! network's DHCP lease for the MAC we gave the NIC (hosts that attach to a `network`), else
//! the host's ARP table for that MAC, else the guest agent's view of the interface with that
//! MAC — the agent only where the host's subnets for guests are known ([`super::trust`]).
//!
//! Guarantees:
//! - only an interface whose MAC equals ours (case-insensitively) is ever read; `docker0`,
//!   `tailscale0` and any other guest interface are ignored whatever their order (finding M14);
//! - IPv4 is preferred; loopback, link-local, unspecified and multicast addresses are skipped;
//! - trusted addresses: the host's answers (lease, ARP) win over the guest agent's, which the
//!   guest's author controls: the agent is asked only when neither has an address for our
//!   MAC. Where the host's guest subnets are known (the libvirt network's `<ip>` subnets,
//!   narrowed by `guestCidr`, or `guestCidr` alone), an address from any source outside them
//!   is ignored; where they are not known, the agent is not asked at all. So the operator
//!   never probes (nor sends a proxy's credentials to) an address the guest chose outside its
//!   network. Reading the subnets never fails the read (see [`super::trust`]);
//! - a source that is merely unavailable (agent not configured or not connected, the domain
//!   not running, the source unsupported) is "no address from it"; only when every source
//!   consulted answered and none had an address is the result `None` ("no address yet");
//! - an empty ARP table is an answer with no address: libvirtd (11.3 at least) reports a
//!   neighbour dump holding no entry as an internal error, "malformed netlink response
//!   message" (its dump expects a neighbour record or an error first and finds only the end
//!   of the dump), so that exact error from the ARP source is read as "nothing yet". A host
//!   whose guests have not sent a packet yet (a fresh host, a quiet bridge) has this table;
//! - a source that fails otherwise (e.g. the host's ARP table when the neighbour dump itself
//!   fails) is named with its error and the others are still asked: when another answers,
//!   its answer counts and the failure is reported beside a "no address yet"
//!   ([`AddressRead::note`]);
//! - a connection-class failure or a timeout while reading fails the read Transient, never
//!   "no address" (finding H3); a domain that vanished meanwhile is NotFound (finding L6); a
//!   read where no source answered at all is Transient, naming each source's error and each
//!   source not consulted with why.
//!   Address-read failures are never Permanent: they must not latch a running proxy Failed.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use libvirt_remote::client::addr_source;
use libvirt_remote::proto::{Domain, DomainInterface};
use libvirt_remote::{Client, Error as LvError};

use super::trust::{self, Subnets};
use super::{
    CODE_AGENT_UNRESPONSIVE, CODE_ARGUMENT_UNSUPPORTED, CODE_INTERNAL_ERROR, CODE_NO_DOMAIN,
    CODE_NO_NETWORK, CODE_NO_SUPPORT, CODE_OPERATION_INVALID, is_code, is_connection_class,
};
use crate::error::ProviderError;
use crate::libvirt::config::HostConfig;

/// What libvirtd says when its neighbour dump holds no entry (see the module doc).
const EMPTY_NEIGHBOUR_DUMP: &str = "malformed netlink response message";

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

    /// The error libvirtd answers an ARP read with when the host's neighbour table is empty
    /// (see the module doc): an answer with no entries, not a failure.
    fn empty_table(self, e: &LvError) -> bool {
        self == Self::Arp
            && e.libvirt_code() == Some(CODE_INTERNAL_ERROR)
            && e.to_string().contains(EMPTY_NEIGHBOUR_DUMP)
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

/// Reads the address of the NIC with MAC `mac` of the running domain `dom` on `host`, reading
/// the host's guest subnets first (see [`address_within`]).
/// `Ok(None)`: every source answered and none knows a trusted address for our MAC yet.
pub async fn address(
    client: &Client,
    dom: &Domain,
    mac: &str,
    host: &HostConfig,
) -> Result<Option<IpAddr>, ProviderError> {
    let (subnets, _) = trust::read(client, host).await;
    address_within(client, dom, mac, host, &subnets).await
}

/// Reads the address of the NIC with MAC `mac` of the running domain `dom` on `host`: the
/// lease, then ARP, then (only when `subnets` are known) the guest agent; an address outside
/// known `subnets` is never returned.
/// `Ok(None)`: every source answered and none knows a trusted address for our MAC yet.
pub async fn address_within(
    client: &Client,
    dom: &Domain,
    mac: &str,
    host: &HostConfig,
    subnets: &Subnets,
) -> Result<Option<IpAddr>, ProviderError> {
    read_address_within(client, dom, &[mac.to_owned()], host, subnets)
        .await
        .map(|r| r.ip)
}

/// What [`read_address_within`] learnt.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AddressRead {
    /// The trusted address of our NIC, when a source knows it.
    pub ip: Option<IpAddr>,
    /// When no address is known: each source that failed, with its error, and each source
    /// not consulted, with why — for the Proxy's condition; `None` when every source
    /// consulted answered.
    pub note: Option<String>,
    /// The MAC of `macs` the address was found by (`None` without an address).
    pub mac: Option<String>,
}

/// [`address_within`], also saying which sources failed when no address is known: a source
/// that errors is named with its error, and the remaining sources are still asked.
/// Our NIC is the one whose MAC is one of `macs`, tried in order within each source
/// ([`names::macs`](super::super::names::macs): the current and the legacy derivation).
pub async fn read_address_within(
    client: &Client,
    dom: &Domain,
    macs: &[String],
    host: &HostConfig,
    subnets: &Subnets,
) -> Result<AddressRead, ProviderError> {
    // finding: M22
    // NB: the host's own sources first: a guest agent may report any address it likes.
    let mut sources = Vec::with_capacity(3);
    let mut skipped = Vec::new();
    if host.network.is_some() {
        sources.push(Source::Lease);
    } else {
        skipped.push(format!(
            "{}: not consulted, the host has no network (hosts[{}].network)",
            Source::Lease.describe(),
            host.name
        ));
    }
    sources.push(Source::Arp);
    if subnets.known() {
        sources.push(Source::Agent);
    } else {
        skipped.push(format!(
            "{}: not asked, the host's guest subnets are unknown (set hosts[{}].guestCidr to \
             trust its answers inside them)",
            Source::Agent.describe(),
            host.name
        ));
    }

    let mut answered = false;
    let mut failures = Vec::new();
    for src in sources {
        match client.domain_interface_addresses(dom, src.wire()).await {
            Ok(ifaces) => {
                answered = true;
                if let Some((ip, mac)) = macs
                    .iter()
                    .find_map(|m| pick_trusted(&ifaces, m, subnets).map(|ip| (ip, m)))
                {
                    return Ok(AddressRead {
                        ip: Some(ip),
                        note: None,
                        mac: Some(mac.clone()),
                    });
                }
                if let Some(ip) = macs.iter().find_map(|m| pick(&ifaces, m)) {
                    tracing::warn!(domain = %dom.name, host = %host.name,
                        source = src.describe(), address = %ip, bounds = %subnets.describe(),
                        "ignoring an address of our NIC outside the host's guest subnets");
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
            Err(e) if src.empty_table(&e) => {
                tracing::debug!(domain = %dom.name, host = %host.name, source = src.describe(),
                    "the host's neighbour table is empty (libvirt: {EMPTY_NEIGHBOUR_DUMP})");
                answered = true;
            }
            Err(e) if src.unavailable(&e) => {
                tracing::debug!(domain = %dom.name, host = %host.name, source = src.describe(),
                    error = %e, "address source unavailable");
                answered = true;
            }
            Err(e) => {
                tracing::warn!(domain = %dom.name, host = %host.name, source = src.describe(),
                    error = %e, "address source failed; trying the others");
                failures.push((src, e));
            }
        }
    }
    let detail = failures
        .iter()
        .map(|(s, e)| format!("{} failed: {e}", s.describe()))
        .chain(skipped)
        .collect::<Vec<_>>()
        .join("; ");
    if answered {
        let note = (!failures.is_empty()).then(|| format!("no address known yet ({detail})"));
        return Ok(AddressRead {
            ip: None,
            note,
            mac: None,
        });
    }
    let code = failures.first().and_then(|(_, e)| e.libvirt_code());
    Err(ProviderError::transient(format!(
        "reading the address of domain {} on host {}: no source could answer ({detail})",
        dom.name, host.name
    ))
    .with_code(code))
}

/// The best address of the interfaces whose hardware address is `mac`: the first usable IPv4,
/// else the first usable IPv6.
pub fn pick(ifaces: &[DomainInterface], mac: &str) -> Option<IpAddr> {
    pick_where(ifaces, mac, |_| true)
}

/// [`pick`] among the addresses `subnets` admit; when they are not known (no network subnets,
/// no `guestCidr`), every usable address counts (only the host's own sources are then read).
pub fn pick_trusted(ifaces: &[DomainInterface], mac: &str, subnets: &Subnets) -> Option<IpAddr> {
    if subnets.known() {
        pick_where(ifaces, mac, |ip| subnets.admits(*ip))
    } else {
        pick(ifaces, mac)
    }
}

fn pick_where(
    ifaces: &[DomainInterface],
    mac: &str,
    admit: impl Fn(&IpAddr) -> bool,
) -> Option<IpAddr> {
    let ours = ifaces.iter().filter(|i| {
        i.hwaddr
            .as_deref()
            .is_some_and(|h| h.trim().eq_ignore_ascii_case(mac))
    });
    let addrs: Vec<IpAddr> = ours
        .flat_map(|i| i.addrs.iter())
        .filter_map(|a| a.addr.trim().parse::<IpAddr>().ok())
        .filter(usable)
        .filter(|ip| admit(ip))
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
