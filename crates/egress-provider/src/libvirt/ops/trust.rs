//! Where a guest's address may lie on a host: the subnets of the libvirt network its NIC is
//! attached to (the `<ip address prefix|netmask>` elements of the network's XML), narrowed by
//! the host's `guestCidr` when set, or `guestCidr` alone on a host without a libvirt network
//! (a bridge or direct attach).
//!
//! Why: the operator sends health probes, carrying the proxy's credentials, to the address it
//! reports. The guest agent runs inside the guest, so its author chooses what it says; an
//! address outside the guests' network would turn the operator into a port scanner of the
//! host's LAN (and hand the credentials to whoever answers). [`Subnets`] is the rule
//! [`super::address`] applies to every address, from every source.
//!
//! Without known subnets — no libvirt network (or one whose XML has no `<ip>`, e.g. a
//! `<forward mode='bridge'/>` network) and no `guestCidr`, or a network whose XML could not be
//! read just now — the guest's own word is never taken: only the host's answers for our MAC
//! (the network's DHCP lease, then the host's ARP table) are used, and the guest agent is not
//! asked. NB: a lease is granted by libvirt's dnsmasq from the network's range, so it is the
//! host's word; an ARP entry is the host kernel's, but a guest can plant one for an address of
//! its choice (an ARP request carrying that sender address), which is why configuration
//! validation warns about a bridge host without `guestCidr`.
//!
//! Guarantees: reading the subnets never fails a caller: a network that cannot be read is
//! logged and treated as unknown (the address read that follows reports the connection's
//! failure itself, Transient); parsing is pure and bounded by the XML's size. [`SubnetCache`]
//! keeps one answer per host and control connection for at most [`SUBNETS_TTL`], so a `get`
//! costs no extra round trip in the steady state; an unreadable network is never cached.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ipnet::IpNet;
use libvirt_remote::Client;

use crate::libvirt::config::HostConfig;
use crate::sync::lock;

/// How long a host's subnets are reused before they are read again (on the same connection;
/// a new connection reads them at once).
// NB: a network's `<ip>` changes only when an admin redefines it (and restarts the network);
// 10 minutes bounds how long such a change goes unseen at one round trip per host per
// 10 minutes, whatever the number of proxies.
pub const SUBNETS_TTL: Duration = Duration::from_secs(600);

/// The networks a guest address on a host must lie in, as far as they are known.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Subnets {
    /// The libvirt network's subnets (`None`: no network, no `<ip>` in it, or not readable).
    pub network: Option<Vec<IpNet>>,
    /// The host's `guestCidr` (empty: not set).
    pub guest_cidr: Vec<IpNet>,
    /// The libvirt network's own addresses (its `<ip address>`s: where its dnsmasq answers
    /// DNS and DHCP for the guests); empty without a readable network.
    pub network_addresses: Vec<IpAddr>,
}

impl Subnets {
    /// Whether anything bounds the addresses (else only the host's own answers are used).
    pub fn known(&self) -> bool {
        self.network.is_some() || !self.guest_cidr.is_empty()
    }

    /// Whether `ip` lies in the network's subnets (when known) and in `guestCidr` (when set).
    /// `false` when nothing is known: the caller decides what unknown means.
    pub fn admits(&self, ip: IpAddr) -> bool {
        self.known()
            && self
                .network
                .as_ref()
                .is_none_or(|n| n.iter().any(|s| s.contains(&ip)))
            && (self.guest_cidr.is_empty() || self.guest_cidr.iter().any(|s| s.contains(&ip)))
    }

    /// Words for logs and messages.
    pub fn describe(&self) -> String {
        let list = |v: &[IpNet]| {
            v.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        match (&self.network, self.guest_cidr.is_empty()) {
            (None, true) => "no known subnet (only the host's lease and ARP answers count)".into(),
            (Some(n), true) => format!("the network's subnets {}", list(n)),
            (None, false) => format!("guestCidr {}", list(&self.guest_cidr)),
            (Some(n), false) => format!(
                "the network's subnets {} narrowed by guestCidr {}",
                list(n),
                list(&self.guest_cidr)
            ),
        }
    }
}

/// Parses one `guestCidr` value (`10.0.0.0/24`, `fd00:1::/64`); `None` when it is not a CIDR.
pub fn parse_guest_cidr(text: &str) -> Option<IpNet> {
    text.trim().parse::<IpNet>().ok()
}

/// The subnets of `host`: its `guestCidr` and, for a host attached to a libvirt network, the
/// network's `<ip>` subnets read through `client`. The flag says whether the answer may be
/// cached (`false` when the network could not be read).
pub async fn read(client: &Client, host: &HostConfig) -> (Subnets, bool) {
    // finding: M22
    let guest_cidr = host
        .guest_cidr
        .iter()
        .filter_map(|c| parse_guest_cidr(c))
        .collect();
    let Some(net) = &host.network else {
        return (
            Subnets {
                network: None,
                guest_cidr,
                network_addresses: Vec::new(),
            },
            true,
        );
    };
    let xml = async {
        let n = client.network_lookup_by_name(net).await?;
        client.network_xml(&n).await
    };
    match xml.await {
        Ok(xml) => {
            let ips = parse_network_ips(&xml);
            let subnets: Vec<IpNet> = ips.iter().map(IpNet::trunc).collect();
            (
                Subnets {
                    network: (!subnets.is_empty()).then_some(subnets),
                    guest_cidr,
                    network_addresses: ips.iter().map(IpNet::addr).collect(),
                },
                true,
            )
        }
        Err(e) => {
            tracing::warn!(network = %net, host = %host.name, error = %e,
                "cannot read the libvirt network's subnets; only the host's lease and ARP \
                 answers (or guestCidr) bound guest addresses until it can be read");
            (
                Subnets {
                    network: None,
                    guest_cidr,
                    network_addresses: Vec::new(),
                },
                false,
            )
        }
    }
}

/// The subnets of every top-level `<ip>` element of a libvirt network XML (address and
/// `prefix`, or an IPv4 `netmask` of contiguous ones). Elements that do not parse are skipped.
pub fn parse_network_subnets(xml: &str) -> Vec<IpNet> {
    parse_network_ips(xml).iter().map(IpNet::trunc).collect()
}

/// Every top-level `<ip>` element of a libvirt network XML as the network's own address
/// with its prefix (not truncated). Elements that do not parse are skipped.
pub fn parse_network_ips(xml: &str) -> Vec<IpNet> {
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
                        .and_then(netmask_len)
                });
            if let (Some(a), Some(p)) = (addr, prefix)
                && let Ok(n) = IpNet::new(a, p)
            {
                out.push(n);
            }
        }
        if opens {
            depth += 1;
        }
    }
    out
}

/// The prefix length of a netmask made of contiguous ones.
fn netmask_len(m: Ipv4Addr) -> Option<u8> {
    let bits = u32::from(m);
    let ones = bits.leading_ones();
    (ones + bits.trailing_zeros() == 32)
        .then(|| u8::try_from(ones).ok())
        .flatten()
}

/// Per host: the subnets read on one control connection, reused for [`SUBNETS_TTL`].
#[derive(Debug, Default)]
pub struct SubnetCache {
    hosts: Mutex<HashMap<String, Cached>>,
}

#[derive(Debug)]
struct Cached {
    connection: u64,
    at: Instant,
    subnets: Arc<Subnets>,
}

impl SubnetCache {
    /// The subnets of `host` as read on its control connection number `connection` (the
    /// host pool's generation): from the cache when read on that connection less than
    /// [`SUBNETS_TTL`] ago, else read now (one lookup and one XML read for a network host).
    pub async fn get(&self, client: &Client, host: &HostConfig, connection: u64) -> Arc<Subnets> {
        {
            let map = lock(&self.hosts);
            if let Some(c) = map.get(&host.name)
                && c.connection == connection
                && c.at.elapsed() < SUBNETS_TTL
            {
                return c.subnets.clone();
            }
        }
        let (subnets, cacheable) = read(client, host).await;
        let subnets = Arc::new(subnets);
        if cacheable {
            lock(&self.hosts).insert(
                host.name.clone(),
                Cached {
                    connection,
                    at: Instant::now(),
                    subnets: subnets.clone(),
                },
            );
        }
        subnets
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn subnets_come_from_the_top_level_ip_elements_of_the_network_xml() {
        let xml = "<network><name>n</name><bridge name='virbr9'/>\
                   <ip address='192.168.122.1' netmask='255.255.255.0'><dhcp/></ip>\
                   <ip family='ipv6' address='fd00::1' prefix='64'/>\
                   <ip address='10.1.1.1' netmask='255.0.255.0'/>\
                   <portgroup><ip address='10.9.9.9' prefix='8'/></portgroup></network>";
        assert_eq!(
            parse_network_subnets(xml),
            vec![net("192.168.122.0/24"), net("fd00::/64")]
        );
        let own: Vec<IpAddr> = parse_network_ips(xml).iter().map(IpNet::addr).collect();
        assert_eq!(
            own,
            [
                "192.168.122.1".parse::<IpAddr>().unwrap(),
                "fd00::1".parse().unwrap()
            ]
        );
        assert!(parse_network_subnets("<network><name>b</name></network>").is_empty());
        assert!(parse_network_subnets("<not xml").is_empty());
    }

    #[test]
    fn an_address_must_be_in_the_network_and_in_guest_cidr_when_both_are_set() {
        let s = Subnets {
            network: Some(vec![net("192.168.122.0/24")]),
            guest_cidr: vec![net("192.168.122.128/25")],
            network_addresses: Vec::new(),
        };
        assert!(s.admits("192.168.122.200".parse().unwrap()));
        assert!(
            !s.admits("192.168.122.5".parse().unwrap()),
            "outside guestCidr"
        );
        assert!(!s.admits("10.0.0.5".parse().unwrap()), "outside both");
        let only_cidr = Subnets {
            network: None,
            guest_cidr: vec![net("10.20.0.0/16")],
            network_addresses: Vec::new(),
        };
        assert!(only_cidr.admits("10.20.3.4".parse().unwrap()));
        assert!(!only_cidr.admits("10.21.3.4".parse().unwrap()));
        let unknown = Subnets::default();
        assert!(!unknown.known());
        assert!(!unknown.admits("10.20.3.4".parse().unwrap()));
    }

    #[test]
    fn guest_cidr_values_parse_as_cidrs_only() {
        assert_eq!(parse_guest_cidr(" 10.0.0.0/8 "), Some(net("10.0.0.0/8")));
        assert_eq!(parse_guest_cidr("fd00:1::/64"), Some(net("fd00:1::/64")));
        for bad in ["10.0.0.0", "10.0.0.0/33", "x/8", ""] {
            assert_eq!(parse_guest_cidr(bad), None, "{bad}");
        }
    }
}
