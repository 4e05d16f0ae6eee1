//! The one list of destinations nobody on the operator's side may be made to reach: the
//! image-download guard ([`crate::libvirt::image::ssrf`]), the guest's proxy and firewall
//! (`egress-core`'s `proxy_policy`) and the host's network filter on every guest NIC
//! ([`crate::libvirt::nwfilter`]) all read it from here, so a range added once is refused by
//! all three.
//!
//! What is on it: unspecified, private (RFC 1918, ULA), CGNAT, loopback, link-local (with
//! the cloud metadata addresses 169.254.169.254 and fd00:ec2::254), IETF protocol
//! assignments, benchmarking, multicast, reserved and broadcast, discard, site-local, and the
//! translation and tunnel ranges whose far end reaches IPv4 destinations no one on this side
//! controls: NAT64 (well-known `64:ff9b::/96` and local-use `64:ff9b:1::/48`, through which a
//! client on a NAT64 segment reaches 169.254.169.254 and private IPv4), 6to4 (`2002::/16`
//! and its relay anycast 192.88.99.0/24), Teredo (`2001::/32`) and IPv4-translated
//! (`::ffff:0:0:0/96`).
//!
//! The documentation ranges (TEST-NET-1/2/3, `2001:db8::/32`, `3fff::/20`) are on it for
//! image downloads only ([`Scope::Images`]): they are never an image server, and the guests'
//! destinations keep them because they stand in for public addresses in examples and tests
//! (they are not routed on the Internet, so a proxy gains nothing by reaching them).
//!
//! IPv4-mapped addresses (`::ffff:0:0/96`) are not listed as a destination range: the kernel
//! sends a connection to one as IPv4, where the IPv4 rows apply (dante also refuses the
//! notation); the image guard checks the IPv4 address inside them.
//!
//! The host's own addresses join the list per host (see `hostAddresses` in the provider
//! config and [`crate::libvirt::nwfilter`]).

use std::net::IpAddr;

use ipnet::IpNet;

/// Where a row applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Every consumer: image downloads, the guest's proxy and firewall, the host's filter.
    Everywhere,
    /// Image downloads only (documentation ranges).
    Images,
}

/// One denied range: CIDR, the reason shown in errors, where it applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeniedRange {
    /// The range, CIDR notation (network address, no host bits).
    pub cidr: &'static str,
    /// Why, as shown in errors.
    pub why: &'static str,
    /// Where it applies.
    pub scope: Scope,
}

const fn row(cidr: &'static str, why: &'static str) -> DeniedRange {
    DeniedRange {
        cidr,
        why,
        scope: Scope::Everywhere,
    }
}

const fn doc(cidr: &'static str, why: &'static str) -> DeniedRange {
    DeniedRange {
        cidr,
        why,
        scope: Scope::Images,
    }
}

/// The list, IPv4 rows first, each family in address order.
pub const DENIED: &[DeniedRange] = &[
    row("0.0.0.0/8", "unspecified"),
    row("10.0.0.0/8", "private"),
    row("100.64.0.0/10", "CGNAT"),
    row("127.0.0.0/8", "loopback"),
    row("169.254.0.0/16", "link-local or metadata"),
    row("172.16.0.0/12", "private"),
    row("192.0.0.0/24", "IETF protocol assignments"),
    doc("192.0.2.0/24", "documentation (TEST-NET-1)"),
    row("192.88.99.0/24", "6to4 relay anycast"),
    row("192.168.0.0/16", "private"),
    row("198.18.0.0/15", "benchmarking"),
    doc("198.51.100.0/24", "documentation (TEST-NET-2)"),
    doc("203.0.113.0/24", "documentation (TEST-NET-3)"),
    row("224.0.0.0/4", "multicast"),
    row("240.0.0.0/4", "reserved or broadcast"),
    row("::/128", "unspecified"),
    row("::1/128", "loopback"),
    row("::ffff:0:0:0/96", "IPv4-translated (SIIT)"),
    row(
        "64:ff9b::/96",
        "NAT64 (a translator reaches the IPv4 address inside it)",
    ),
    row("64:ff9b:1::/48", "local-use NAT64 (a local translator)"),
    row("100::/64", "discard"),
    row(
        "2001::/32",
        "Teredo (a relay reaches the IPv4 address inside it)",
    ),
    doc("2001:db8::/32", "documentation"),
    row(
        "2002::/16",
        "6to4 (a relay reaches the IPv4 address inside it)",
    ),
    doc("3fff::/20", "documentation"),
    row(
        "fc00::/7",
        "unique-local (private, includes the fd00:ec2::254 metadata address)",
    ),
    row("fe80::/10", "link-local"),
    row("fec0::/10", "site-local"),
    row("ff00::/8", "multicast"),
];

/// The rows that apply to `scope`'s consumer: [`Scope::Everywhere`] rows for the guests and
/// the host filter, every row for image downloads.
pub fn ranges(scope: Scope) -> impl Iterator<Item = &'static DeniedRange> {
    DENIED
        .iter()
        .filter(move |r| scope == Scope::Images || r.scope == Scope::Everywhere)
}

/// The networks of [`ranges`]`(scope)`, parsed.
pub fn networks(scope: Scope) -> Vec<IpNet> {
    ranges(scope)
        .filter_map(|r| r.cidr.parse::<IpNet>().ok())
        .collect()
}

/// The first row for `scope` holding `ip`, if any.
pub fn lookup(ip: IpAddr, scope: Scope) -> Option<&'static DeniedRange> {
    ranges(scope).find(|r| r.cidr.parse::<IpNet>().is_ok_and(|n| n.contains(&ip)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_row_parses_as_a_network_address() {
        for r in DENIED {
            let n: IpNet = r.cidr.parse().unwrap();
            assert_eq!(n, n.trunc(), "{} has host bits", r.cidr);
        }
    }

    #[test]
    fn nat64_6to4_and_teredo_are_denied_for_proxies_and_images_alike() {
        for ip in [
            "64:ff9b::a9fe:a9fe",
            "64:ff9b::808:808",
            "64:ff9b:1::a00:1",
            "2002:a9fe:a9fe::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "::ffff:0:a00:1",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert!(lookup(ip, Scope::Everywhere).is_some(), "{ip}");
            assert!(lookup(ip, Scope::Images).is_some(), "{ip}");
        }
    }

    #[test]
    fn documentation_ranges_are_denied_for_images_only() {
        let ip: IpAddr = "203.0.113.7".parse().unwrap();
        assert!(lookup(ip, Scope::Everywhere).is_none());
        assert_eq!(
            lookup(ip, Scope::Images).map(|r| r.why),
            Some("documentation (TEST-NET-3)")
        );
        assert!(networks(Scope::Images).len() > networks(Scope::Everywhere).len());
    }
}
