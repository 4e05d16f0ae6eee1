//! The libvirt network filter on every guest's NIC: the address part of the destination
//! policy, enforced by the host (iptables/ip6tables rules libvirt instantiates for the
//! guest's tap), so it holds even when the guest is compromised and its own firewall and
//! proxy configuration are gone.
//!
//! One filter per provider entry and installation ([`names::nwfilter`]), defined on a host
//! before a domain that references it (`<filterref>` in the domain XML), and redefined only
//! when its rendering changed (libvirt re-applies a redefined filter to every interface that
//! uses it). Rules, first match wins, for traffic *leaving* the guest only (clients and the
//! operator's health probes connect *into* the guest, which is never filtered):
//! 1. packets of established or related connections (replies to clients and probes, and to
//!    the guest's own connections) pass;
//! 2. DHCP (v4 and v6), DNS (port 53, to any resolver) and ICMPv6 neighbour discovery pass;
//! 3. new connections to the entry's `policy.allowedInternalCidrs` pass;
//! 4. new (or invalid) packets to [`DENIED_V4`], [`DENIED_V6`] and the host's own address
//!    are rejected;
//! 5. everything else (the Internet) passes.
//!
//! Guarantees: the rendering is deterministic (same policy, same XML, same UUID derived from
//! the name), in the attribute order libvirt 11.3 prints, so an unchanged filter is never
//! redefined; CIDRs that do not parse are skipped (the config loader refuses them first).
//!
//! Needs on the host: libvirt's nwfilter driver and `net.bridge.bridge-nf-call-iptables=1`
//! (and `-ip6tables`), without which bridged guest traffic bypasses iptables.

use std::fmt::Write as _;
use std::net::IpAddr;

use ipnet::IpNet;
use libvirt_remote::Client;
use sha2::{Digest, Sha256};

use super::classify::classify;
use super::config::ProxyPolicy;
use crate::error::Result;

/// IPv4 destinations a proxy refuses unless the entry lifts them.
// NB: "this network", RFC 1918, CGNAT (RFC 6598), loopback, link-local (holds the
// 169.254.169.254 cloud metadata address), IETF protocol assignments, benchmarking,
// multicast and reserved/broadcast: nothing a proxy for the Internet needs to reach.
pub const DENIED_V4: &[&str] = &[
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/4",
    "240.0.0.0/4",
];
/// IPv6 destinations a proxy refuses unless the entry lifts them.
// NB: unspecified, loopback, NAT64 local-use, ULA, link-local, multicast. IPv4-mapped
// addresses (::ffff:0:0/96) are not listed: the kernel sends them as IPv4, where the IPv4
// rules apply, and dante refuses the notation.
pub const DENIED_V6: &[&str] = &[
    "::/128",
    "::1/128",
    "64:ff9b:1::/48",
    "fc00::/7",
    "fe80::/10",
    "ff00::/8",
];

/// Rule priorities (libvirt orders a filter's rules by them, lowest first).
const PRIO_ESTABLISHED: i32 = -900;
const PRIO_SERVICES: i32 = -800;
const PRIO_LIFTED: i32 = -700;
const PRIO_DENIED: i32 = -600;

/// ICMPv6 types the guest sends for neighbour discovery: router solicitation (133),
/// neighbour solicitation (135) and advertisement (136).
const NDP_TYPES: [u8; 3] = [133, 135, 136];

/// The IP address of a host's `address` (`ip`, `ip:port`, `[v6]:port`), when it is one; a
/// DNS name or `local` gives `None`.
pub fn host_ip(address: &str) -> Option<IpAddr> {
    if let Ok(ip) = address.parse() {
        return Some(ip);
    }
    if let Some(rest) = address.strip_prefix('[') {
        return rest.split_once(']').and_then(|(ip, _)| ip.parse().ok());
    }
    address.split_once(':').and_then(|(ip, _)| ip.parse().ok())
}

/// The UUID of filter `name`: derived from the name, so every definition of it (from any
/// process) carries the same one and replaces the previous one in place.
pub fn uuid(name: &str) -> uuid::Uuid {
    let h = Sha256::digest(format!("egress-proxies nwfilter {name}").as_bytes());
    let mut b = [0u8; 16];
    for (d, s) in b.iter_mut().zip(h.iter()) {
        *d = *s;
    }
    uuid::Builder::from_random_bytes(b).into_uuid()
}

fn rule(out: &mut String, action: &str, priority: i32, statematch: bool, body: &str) {
    let sm = if statematch {
        ""
    } else {
        " statematch='false'"
    };
    let _ = write!(
        out,
        "  <rule action='{action}' direction='out' priority='{priority}'{sm}>\n    {body}\n  </rule>\n"
    );
}

/// The protocol element matching `net` as a destination, with `state`.
fn to_net(net: &IpNet, state: &str) -> String {
    let (proto, addr, len) = match net {
        IpNet::V4(n) => ("all", n.network().to_string(), n.prefix_len()),
        IpNet::V6(n) => ("all-ipv6", n.network().to_string(), n.prefix_len()),
    };
    format!("<{proto} dstipaddr='{addr}' dstipmask='{len}' state='{state}'/>")
}

fn nets(cidrs: &[&str]) -> Vec<IpNet> {
    cidrs
        .iter()
        .filter_map(|c| c.parse::<IpNet>().ok().map(|n| n.trunc()))
        .collect()
}

/// The filter `name` for an entry with `policy`, on a host whose own addresses are
/// `host_addresses` (see the module docs for the rules).
pub fn render(name: &str, policy: &ProxyPolicy, host_addresses: &[IpAddr]) -> String {
    let mut x = format!(
        "<filter name='{name}' chain='root'>\n  <uuid>{}</uuid>\n",
        uuid(name).hyphenated()
    );
    for proto in ["all", "all-ipv6"] {
        rule(
            &mut x,
            "accept",
            PRIO_ESTABLISHED,
            true,
            &format!("<{proto} state='ESTABLISHED,RELATED'/>"),
        );
    }
    for body in [
        "<udp state='NEW' srcportstart='68' dstportstart='67'/>",
        "<udp-ipv6 state='NEW' srcportstart='546' dstportstart='547'/>",
        "<udp state='NEW' dstportstart='53'/>",
        "<tcp state='NEW' dstportstart='53'/>",
        "<udp-ipv6 state='NEW' dstportstart='53'/>",
        "<tcp-ipv6 state='NEW' dstportstart='53'/>",
    ] {
        rule(&mut x, "accept", PRIO_SERVICES, true, body);
    }
    for t in NDP_TYPES {
        // NB: conntrack does not track neighbour discovery: no state match.
        rule(
            &mut x,
            "accept",
            PRIO_SERVICES,
            false,
            &format!("<icmpv6 type='{t}'/>"),
        );
    }
    let lifted: Vec<&str> = policy
        .allowed_internal_cidrs
        .iter()
        .map(String::as_str)
        .collect();
    for n in nets(&lifted) {
        rule(&mut x, "accept", PRIO_LIFTED, true, &to_net(&n, "NEW"));
    }
    let mut denied = nets(DENIED_V4);
    denied.extend(nets(DENIED_V6));
    denied.extend(host_addresses.iter().map(|ip| IpNet::from(*ip)));
    for n in denied {
        rule(
            &mut x,
            "reject",
            PRIO_DENIED,
            true,
            &to_net(&n, "NEW,INVALID"),
        );
    }
    x.push_str("</filter>\n");
    x
}

/// `xml` without the whitespace between tags (libvirt re-indents what it prints).
fn normalise(xml: &str) -> String {
    let mut out = String::with_capacity(xml.len());
    for line in xml.lines() {
        out.push_str(line.trim());
    }
    out
}

/// What [`ensure`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ensured {
    /// The host already held this exact filter.
    Unchanged,
    /// The filter was defined (new) or redefined (changed).
    Defined,
}

/// Makes the host behind `c` (named `host`) hold filter `name` as `xml`: looked up, compared,
/// and defined only when missing or different.
pub async fn ensure(c: &Client, host: &str, name: &str, xml: &str) -> Result<Ensured> {
    match c.nwfilter_lookup_by_name(name).await {
        Ok(f) => {
            let have = c.nwfilter_xml(&f).await.map_err(|e| {
                classify(&e, &format!("reading network filter {name} on host {host}"))
            })?;
            if normalise(&have) == normalise(xml) {
                return Ok(Ensured::Unchanged);
            }
        }
        // VIR_ERR_NO_NWFILTER
        Err(e) if e.libvirt_code() == Some(62) => {}
        Err(e) => {
            return Err(classify(
                &e,
                &format!("looking up network filter {name} on host {host}"),
            ));
        }
    }
    c.nwfilter_define_xml(xml).await.map_err(|e| {
        classify(
            &e,
            &format!("defining network filter {name} on host {host}"),
        )
    })?;
    Ok(Ensured::Defined)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn internal_networks_and_the_host_are_rejected_after_replies_services_and_lifted_networks() {
        let policy = ProxyPolicy {
            allowed_internal_cidrs: vec!["10.5.1.7/16".into(), "fd00:1::/64".into()],
            ..ProxyPolicy::default()
        };
        let host: IpAddr = "203.0.113.9".parse().unwrap();
        let x = render("ep-e-filter", &policy, &[host]);
        assert!(x.starts_with("<filter name='ep-e-filter' chain='root'>"));
        assert!(x.contains(&format!("<uuid>{}</uuid>", uuid("ep-e-filter"))));
        let pos = |s: &str| x.find(s).unwrap_or_else(|| panic!("{s} missing:\n{x}"));
        let est = pos("<all state='ESTABLISHED,RELATED'/>");
        let dhcp = pos("<udp state='NEW' srcportstart='68' dstportstart='67'/>");
        let lifted = pos("<all dstipaddr='10.5.0.0' dstipmask='16' state='NEW'/>");
        pos("<all-ipv6 dstipaddr='fd00:1::' dstipmask='64' state='NEW'/>");
        let private = pos("<all dstipaddr='10.0.0.0' dstipmask='8' state='NEW,INVALID'/>");
        pos("<all dstipaddr='169.254.0.0' dstipmask='16' state='NEW,INVALID'/>");
        pos("<all dstipaddr='100.64.0.0' dstipmask='10' state='NEW,INVALID'/>");
        pos("<all-ipv6 dstipaddr='fe80::' dstipmask='10' state='NEW,INVALID'/>");
        let me = pos("<all dstipaddr='203.0.113.9' dstipmask='32' state='NEW,INVALID'/>");
        assert!(est < dhcp && dhcp < lifted && lifted < private && private < me);
        // Only outgoing traffic is filtered, so clients and probes connect in.
        assert!(!x.contains("direction='in'") && !x.contains("direction='inout'"));
        // Deterministic: the same policy renders the same document.
        assert_eq!(x, render("ep-e-filter", &policy, &[host]));
        assert_ne!(uuid("ep-e-filter"), uuid("ep-f-filter"));
    }

    #[test]
    fn host_addresses_are_read_from_the_configured_address() {
        assert_eq!(host_ip("192.0.2.1:22"), Some("192.0.2.1".parse().unwrap()));
        assert_eq!(
            host_ip("[2001:db8::1]:22"),
            Some("2001:db8::1".parse().unwrap())
        );
        assert_eq!(host_ip("2001:db8::1"), Some("2001:db8::1".parse().unwrap()));
        assert_eq!(host_ip("kvm1.example.com:22"), None);
    }

    #[test]
    fn whitespace_between_tags_does_not_make_a_filter_differ() {
        let a = render("n", &ProxyPolicy::default(), &[]);
        let b = a.replace("\n  <rule", "\n<rule").replace("\n", "\n\n");
        assert_eq!(normalise(&a), normalise(&b));
    }
}
