//! The libvirt network filter on every guest's NIC: the host's enforcement of who a guest
//! may pretend to be (anti-spoofing, ebtables rules) and where it may connect (the address
//! part of the destination policy, iptables/ip6tables rules), instantiated by libvirt on the
//! guest's tap, so both hold even when the guest is compromised and its own firewall and
//! proxy configuration are gone.
//!
//! One filter set per provider entry and installation ([`names::nwfilter`]): a root filter
//! and four children it references ([`render_set`]), defined on a host before a domain that
//! references the root (`<filterref>` in the domain XML, with the NIC's own parameters,
//! [`nic_params`]), each redefined only when its rendering changed (libvirt re-applies a
//! redefined filter to every interface that uses it).
//!
//! **Who the guest may be** (layer 2, frames *leaving* the guest; [`spoof`]): the source MAC
//! is the NIC's (`$MAC`); IPv4 packets come from the NIC's addresses (`$IP`: its declared
//! egress address, or the address its DHCP lease gave it, which libvirt learns by watching
//! the DHCP exchange) or are a DHCP request from 0.0.0.0; ARP packets carry the NIC's MAC
//! and one of its IPv4 addresses (or 0.0.0.0, a probe); IPv6 packets come from the NIC's
//! addresses (`$IPV6`: declared, or derived from the MAC in the host's IPv6 `guestCidr`) or
//! its own link-local address (`$IPV6_LL`, derived from the MAC) or `::` (duplicate address
//! detection), and neighbour advertisements only from `$IPV6`; the guest never sends DHCP or
//! DHCPv6 server replies, router advertisements or redirects; every other frame type is
//! dropped. So a guest cannot take another guest's declared or leased address, answer ARP or
//! neighbour solicitations for it, hand out addresses or routes, or send as another MAC.
//!
//! **Where it may connect** (the root filter's iptables rules, first match wins, for traffic
//! leaving the guest only: clients and the operator's health probes connect *into* the guest,
//! which is never filtered):
//! 1. packets of established or related connections (replies to clients and probes, and to
//!    the guest's own connections) pass;
//! 2. DHCP requests (v4 and v6), DNS (port 53) to the resolvers the host hands out (the
//!    address pool's `dns`, the libvirt network's own addresses where its dnsmasq answers)
//!    and ICMPv6 neighbour discovery pass; DNS to any other resolver is judged by 3–5 like
//!    any destination;
//! 3. new connections to the entry's `policy.allowedInternalCidrs` pass;
//! 4. new (or invalid) packets to the shared deny list ([`crate::denylist`]: the ranges the
//!    image guard and the guests refuse too) and the host's own addresses are rejected;
//! 5. everything else (the Internet) passes.
//!
//! Upgrades: the set carries a new name (`…-filter2-…`); guests created before keep the
//! destination-only filter of the old name, which keeps working unchanged (libvirt refuses to
//! re-instantiate a filter that references variables their NICs do not carry, so it is never
//! updated in place), and get anti-spoofing when they are recreated.
//!
//! Guarantees: the rendering is deterministic (same inputs, same XML, same UUIDs derived from
//! the names), in the attribute order libvirt 11.3 prints, so an unchanged filter is never
//! redefined; CIDRs that do not parse are skipped (the config loader refuses them first); the
//! per-NIC parameters are addresses and a MAC we derived, never text from a Proxy.
//!
//! Needs on the host: libvirt's nwfilter driver (with ebtables) and
//! `net.bridge.bridge-nf-call-iptables=1` (and `-ip6tables`), without which bridged guest
//! traffic bypasses iptables.

use std::fmt::Write as _;
use std::net::IpAddr;

use ipnet::IpNet;
use libvirt_remote::Client;
use sha2::{Digest, Sha256};

pub mod spoof;

pub use self::spoof::nic_params;

use super::classify::classify;
use super::config::{HostConfig, ProxyPolicy};
use crate::error::Result;

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

/// Every address of `host` a guest must not reach: the IP in its `address`, its
/// `hostAddresses`, and what the name in its `address` resolves to now (bounded by
/// `timeout`; a failed lookup adds nothing, and is logged: the host's SSH dial resolves the
/// same name, so a name that does not resolve also fails the create). Sorted, unique.
pub async fn host_addresses(host: &HostConfig, timeout: std::time::Duration) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = host_ip(&host.address).into_iter().collect();
    out.extend(
        host.host_addresses
            .iter()
            .filter_map(|a| a.trim().parse::<IpAddr>().ok()),
    );
    if host_ip(&host.address).is_none() {
        let name = host
            .address
            .rsplit_once(':')
            .map_or(host.address.as_str(), |(n, _)| n);
        if name != "local" && !name.is_empty() {
            match tokio::time::timeout(timeout, tokio::net::lookup_host((name, 0))).await {
                Ok(Ok(found)) => out.extend(found.map(|a| a.ip())),
                Ok(Err(e)) => {
                    tracing::warn!(host = %host.name, name, error = %e, "cannot resolve the host's name for its network filter");
                }
                Err(_) => {
                    tracing::warn!(host = %host.name, name, "resolving the host's name for its network filter timed out");
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
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

/// What a host's filter set is rendered from.
#[derive(Debug, Clone, Copy)]
pub struct HostFilter<'a> {
    /// The entry's policy.
    pub policy: &'a ProxyPolicy,
    /// The host's own addresses (always denied).
    pub host_addresses: &'a [IpAddr],
    /// The resolvers the host hands its guests (DNS to them passes).
    pub resolvers: &'a [IpAddr],
}

/// The root filter `name` (see the module docs for the rules): the anti-spoofing children
/// ([`spoof::children`]) referenced first, then the destination rules.
pub fn render(name: &str, f: &HostFilter<'_>) -> String {
    render_root(name, name, f, true)
}

/// The name of the root that lifts nothing (for guests whose namespace is not granted the
/// entry's `allowedInternalCidrs`).
pub fn strict_name(root: &str) -> String {
    format!("{root}-strict")
}

/// Root `name` over the children of `base`, with the entry's lifted networks when `lift`.
fn render_root(name: &str, base: &str, f: &HostFilter<'_>, lift: bool) -> String {
    let mut x = format!(
        "<filter name='{name}' chain='root'>\n  <uuid>{}</uuid>\n",
        uuid(name).hyphenated()
    );
    spoof::root_rules(&mut x, base);
    let policy = f.policy;
    let host_addresses = f.host_addresses;
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
    ] {
        rule(&mut x, "accept", PRIO_SERVICES, true, body);
    }
    let mut resolvers = f.resolvers.to_vec();
    resolvers.sort();
    resolvers.dedup();
    for r in resolvers {
        let suffix = if r.is_ipv4() { "" } else { "-ipv6" };
        for proto in ["udp", "tcp"] {
            rule(
                &mut x,
                "accept",
                PRIO_SERVICES,
                true,
                &format!("<{proto}{suffix} dstipaddr='{r}' state='NEW' dstportstart='53'/>"),
            );
        }
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
        .filter(|_| lift)
        .map(String::as_str)
        .collect();
    for n in nets(&lifted) {
        rule(&mut x, "accept", PRIO_LIFTED, true, &to_net(&n, "NEW"));
    }
    let mut denied = crate::denylist::networks(crate::denylist::Scope::Everywhere);
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

/// The whole set for `name` on one host: the children first (the roots reference them),
/// then the root `name` and the root [`strict_name`] (the same without the entry's lifted
/// networks); each `(name, xml)`.
pub fn render_set(name: &str, f: &HostFilter<'_>) -> Vec<(String, String)> {
    let mut set = spoof::children(name);
    let strict = strict_name(name);
    set.push((name.to_owned(), render(name, f)));
    let x = render_root(&strict, name, f, false);
    set.push((strict, x));
    set
}

/// Makes the host behind `c` (named `host`) hold every filter of `set` (from [`render_set`],
/// in order): [`ensure`] each. `Defined` when any was (re)defined.
pub async fn ensure_set(c: &Client, host: &str, set: &[(String, String)]) -> Result<Ensured> {
    let mut any = Ensured::Unchanged;
    for (name, xml) in set {
        if ensure(c, host, name, xml).await? == Ensured::Defined {
            any = Ensured::Defined;
        }
    }
    Ok(any)
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
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    #[test]
    fn internal_networks_and_the_host_are_rejected_after_replies_services_and_lifted_networks() {
        let policy = ProxyPolicy {
            allowed_internal_cidrs: vec!["10.5.1.7/16".into(), "fd00:1::/64".into()],
            ..ProxyPolicy::default()
        };
        let host: IpAddr = "203.0.113.9".parse().unwrap();
        let dns: IpAddr = "10.0.0.53".parse().unwrap();
        let f = HostFilter {
            policy: &policy,
            host_addresses: &[host],
            resolvers: &[dns],
        };
        let x = render("ep-e-filter", &f);
        assert!(x.starts_with("<filter name='ep-e-filter' chain='root'>"));
        assert!(x.contains(&format!("<uuid>{}</uuid>", uuid("ep-e-filter"))));
        let pos = |s: &str| x.find(s).unwrap_or_else(|| panic!("{s} missing:\n{x}"));
        let est = pos("<all state='ESTABLISHED,RELATED'/>");
        let dhcp = pos("<udp state='NEW' srcportstart='68' dstportstart='67'/>");
        // DNS only to the resolvers handed out; NAT64, 6to4 and Teredo denied.
        let dns = pos("<udp dstipaddr='10.0.0.53' state='NEW' dstportstart='53'/>");
        pos("<tcp dstipaddr='10.0.0.53' state='NEW' dstportstart='53'/>");
        assert!(!x.contains("<udp state='NEW' dstportstart='53'/>"), "{x}");
        for n in [
            "64:ff9b::' dstipmask='96",
            "64:ff9b:1::' dstipmask='48",
            "2002::' dstipmask='16",
            "2001::' dstipmask='32",
        ] {
            pos(&format!("<all-ipv6 dstipaddr='{n}' state='NEW,INVALID'/>"));
        }
        let lifted = pos("<all dstipaddr='10.5.0.0' dstipmask='16' state='NEW'/>");
        pos("<all-ipv6 dstipaddr='fd00:1::' dstipmask='64' state='NEW'/>");
        let private = pos("<all dstipaddr='10.0.0.0' dstipmask='8' state='NEW,INVALID'/>");
        pos("<all dstipaddr='169.254.0.0' dstipmask='16' state='NEW,INVALID'/>");
        pos("<all dstipaddr='100.64.0.0' dstipmask='10' state='NEW,INVALID'/>");
        pos("<all-ipv6 dstipaddr='fe80::' dstipmask='10' state='NEW,INVALID'/>");
        let me = pos("<all dstipaddr='203.0.113.9' dstipmask='32' state='NEW,INVALID'/>");
        assert!(est < dhcp && dhcp < dns && dns < lifted && lifted < private && private < me);
        // Only outgoing traffic is filtered, so clients and probes connect in.
        assert!(!x.contains("direction='in'") && !x.contains("direction='inout'"));
        // The anti-spoofing children come first.
        let mac = pos("<filterref filter='ep-e-filter-mac'/>");
        assert!(mac < est);
        // Deterministic: the same policy renders the same document.
        assert_eq!(x, render("ep-e-filter", &f));
        assert_ne!(uuid("ep-e-filter"), uuid("ep-f-filter"));
    }

    #[tokio::test]
    async fn a_host_named_by_dns_is_denied_what_its_name_resolves_to() {
        let host: HostConfig = serde_json::from_str(
            r#"{"name": "h1", "address": "localhost:22", "hostAddresses": ["203.0.113.9"]}"#,
        )
        .unwrap();
        let own = host_addresses(&host, std::time::Duration::from_secs(10)).await;
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let public: IpAddr = "203.0.113.9".parse().unwrap();
        assert!(own.contains(&lo) && own.contains(&public), "{own:?}");
        let x = render(
            "f",
            &HostFilter {
                policy: &ProxyPolicy::default(),
                host_addresses: &own,
                resolvers: &[],
            },
        );
        assert!(
            x.contains("<all dstipaddr='203.0.113.9' dstipmask='32' state='NEW,INVALID'/>"),
            "{x}"
        );
        // An IP address is taken as it is; `local` is nothing to resolve.
        let by_ip: HostConfig =
            serde_json::from_str(r#"{"name": "h1", "address": "198.51.100.4:2222"}"#).unwrap();
        assert_eq!(
            host_addresses(&by_ip, std::time::Duration::from_secs(10)).await,
            ["198.51.100.4".parse::<IpAddr>().unwrap()]
        );
        let local: HostConfig =
            serde_json::from_str(r#"{"name": "h1", "address": "local"}"#).unwrap();
        assert!(
            host_addresses(&local, std::time::Duration::from_secs(10))
                .await
                .is_empty()
        );
    }

    #[test]
    fn the_strict_root_lifts_nothing_and_shares_the_children() {
        let policy = ProxyPolicy {
            allowed_internal_cidrs: vec!["10.5.0.0/16".into()],
            ..ProxyPolicy::default()
        };
        let f = HostFilter {
            policy: &policy,
            host_addresses: &[],
            resolvers: &[],
        };
        let set = render_set("r", &f);
        let names: Vec<&str> = set.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["r-mac", "r-ipv4", "r-ipv6", "r-arp", "r", "r-strict"]
        );
        let (root, strict) = (&set[4].1, &set[5].1);
        assert!(root.contains("dstipaddr='10.5.0.0'"));
        assert!(!strict.contains("dstipaddr='10.5.0.0'"), "{strict}");
        assert!(strict.contains("<filterref filter='r-mac'/>"));
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
        let a = render(
            "n",
            &HostFilter {
                policy: &ProxyPolicy::default(),
                host_addresses: &[],
                resolvers: &[],
            },
        );
        let b = a.replace("\n  <rule", "\n<rule").replace("\n", "\n\n");
        assert_eq!(normalise(&a), normalise(&b));
    }
}
