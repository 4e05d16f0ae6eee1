//! The policy a guest's proxy enforces: who may use it (client networks and passwords) and
//! where it may connect (destinations). It joins the entry's `policy:` (the admin's) with a
//! Proxy's `spec.proxy.allowedDestinations` (the author's) into a [`GuestPolicy`] that
//! `controller::userdata` renders into tinyproxy's and dante's configs and the guest's
//! nftables rules.
//!
//! Guarantees:
//! - Internal destinations are denied by default: the shared deny list
//!   ([`denied_networks`]: private, loopback, link-local with the cloud metadata address,
//!   CGNAT, ULA, multicast, reserved, NAT64, 6to4, Teredo) and the host's own addresses. Only the admin (an entry's
//!   `policy.allowedInternalCidrs`) can lift that for a network; a Proxy cannot.
//! - A Proxy's allowlist only narrows the entry's: each of its domains, CIDRs and ports must
//!   lie within the entry's list when the entry has one ([`GuestPolicy::for_proxy`]).
//! - Values are re-parsed and normalised here (CIDRs to their network address, domains to
//!   lowercase DNS names), so what reaches a config file is plain ASCII with no quoting.
//! - Pure: no I/O.

use std::net::IpAddr;

use egress_provider::libvirt::config::{DestinationAllowlist, ProxyPolicy};

use crate::model::destinations::{Destinations, check_list};
use crate::model::net::parse_cidr;

pub use crate::model::destinations::{MAX_DESTINATIONS, is_domain_pattern};

/// A network: its (masked) address and prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Net {
    /// The network address (host bits cleared).
    pub addr: IpAddr,
    /// The prefix length.
    pub len: u8,
}

impl Net {
    /// Parses `addr/len`, clearing host bits; `None` when it is not a CIDR.
    pub fn parse(s: &str) -> Option<Self> {
        let (addr, len) = parse_cidr(s)?;
        Some(Self::new(addr, len))
    }

    /// The network of `addr` with prefix `len` (clamped to the family's width).
    pub fn new(addr: IpAddr, len: u8) -> Self {
        match addr {
            IpAddr::V4(a) => {
                let len = len.min(32);
                let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
                Self {
                    addr: IpAddr::V4((u32::from(a) & mask).into()),
                    len,
                }
            }
            IpAddr::V6(a) => {
                let len = len.min(128);
                let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
                Self {
                    addr: IpAddr::V6((u128::from(a) & mask).into()),
                    len,
                }
            }
        }
    }

    /// Whether `other` lies entirely within this network.
    pub fn contains(&self, other: &Net) -> bool {
        self.addr.is_ipv4() == other.addr.is_ipv4()
            && other.len >= self.len
            && Net::new(other.addr, self.len).addr == self.addr
    }

    /// Whether the two networks share any address.
    pub fn overlaps(&self, other: &Net) -> bool {
        self.contains(other) || other.contains(self)
    }
}

impl std::fmt::Display for Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// The denied networks: the shared deny list ([`egress_provider::denylist`], the one the
/// image guard and the host's network filter on every guest NIC apply too), parsed.
pub fn denied_networks() -> Vec<Net> {
    egress_provider::denylist::ranges(egress_provider::denylist::Scope::Everywhere)
        .filter_map(|r| Net::parse(r.cidr))
        .collect()
}

/// Whether every name `inner` matches is matched by `outer` (both [`is_domain_pattern`]).
fn domain_within(outer: &str, inner: &str) -> bool {
    match outer.strip_prefix("*.") {
        None => outer == inner,
        Some(suffix) => {
            let name = inner.strip_prefix("*.").unwrap_or(inner);
            name.ends_with(&format!(".{suffix}")) || (inner.starts_with("*.") && name == suffix)
        }
    }
}

/// The policy one guest enforces, ready to render.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestPolicy {
    /// Shortest IPv4 client prefix allowed.
    pub min_client_prefix_v4: u8,
    /// Shortest IPv6 client prefix allowed.
    pub min_client_prefix_v6: u8,
    /// The IPv4 client span cap, as a prefix length ([`crate::client_span`]).
    pub max_client_span_v4: u8,
    /// The IPv6 client span cap, as a prefix length, counted in /64s.
    pub max_client_span_v6: u8,
    /// Shortest password allowed whenever credentials are set.
    pub min_password_length: usize,
    /// Allowed domain patterns (empty: any name).
    pub domains: Vec<String>,
    /// Allowed destination networks (empty: any address not denied).
    pub cidrs: Vec<Net>,
    /// Allowed destination ports (empty: any port).
    pub ports: Vec<u16>,
    /// Networks the admin lifted out of the denied classes (`allowedInternalCidrs`).
    pub lifted: Vec<Net>,
    /// Denied destination networks: the default classes and the host's own addresses,
    /// minus nothing (lifting happens by accepting `lifted` first).
    pub denied: Vec<Net>,
    /// The ports HTTP CONNECT may reach when `ports` is empty: [`DEFAULT_CONNECT_PORTS`], and
    /// the operator adds its health check targets' ports (its probes CONNECT through the
    /// proxy).
    pub connect_default: Vec<u16>,
}

/// The ports HTTP CONNECT may reach when neither the Proxy nor its entry lists ports: HTTPS
/// and HTTP. (A plain HTTP request through tinyproxy names its own port; the guest firewall
/// bounds ports only when a list is set.)
pub const DEFAULT_CONNECT_PORTS: [u16; 2] = [443, 80];

impl GuestPolicy {
    /// The entry's policy with its defaults and no Proxy allowlist (for tests and callers
    /// without a Proxy).
    pub fn from_entry(entry: &ProxyPolicy) -> Self {
        Self::for_proxy(entry, &Destinations::default(), &[]).unwrap_or_else(|_| Self {
            min_client_prefix_v4: entry.min_client_prefix_v4,
            min_client_prefix_v6: entry.min_client_prefix_v6,
            max_client_span_v4: entry.max_client_span_v4,
            max_client_span_v6: entry.max_client_span_v6,
            min_password_length: usize::try_from(entry.min_password_length).unwrap_or(usize::MAX),
            domains: Vec::new(),
            cidrs: Vec::new(),
            ports: Vec::new(),
            lifted: Vec::new(),
            denied: denied_networks(),
            connect_default: DEFAULT_CONNECT_PORTS.to_vec(),
        })
    }

    /// Joins the entry's policy with a Proxy's allowlist. `host_addresses` are the hosting
    /// machine's own addresses (always denied). Fails, naming each field path under
    /// `spec.proxy.allowedDestinations`, when the Proxy's list is malformed, reaches outside
    /// the entry's list, or names a denied network the entry did not lift.
    pub fn for_proxy(
        entry: &ProxyPolicy,
        spec: &Destinations,
        host_addresses: &[IpAddr],
    ) -> Result<Self, Vec<String>> {
        let path = "spec.proxy.allowedDestinations";
        let mut errs: Vec<String> = check_list(path, &spec.domains, &spec.cidrs, &spec.ports)
            .into_iter()
            .map(|(p, m)| format!("{p}: {m}"))
            .collect();
        let DestinationAllowlist {
            domains: e_domains,
            cidrs: e_cidrs,
            ports: e_ports,
        } = &entry.allowed_destinations;
        let e_nets: Vec<Net> = e_cidrs.iter().filter_map(|c| Net::parse(c)).collect();
        let lifted: Vec<Net> = entry
            .allowed_internal_cidrs
            .iter()
            .filter_map(|c| Net::parse(c))
            .collect();
        let mut denied = denied_networks();
        for ip in host_addresses {
            denied.push(Net::new(*ip, if ip.is_ipv4() { 32 } else { 128 }));
        }
        let e_domains: Vec<String> = e_domains.iter().map(|d| d.to_ascii_lowercase()).collect();
        for (i, d) in spec.domains.iter().enumerate() {
            if !e_domains.is_empty() && !e_domains.iter().any(|o| domain_within(o, d)) {
                errs.push(format!(
                    "{path}.domains[{i}]: {d:?} is outside the provider entry's \
                     policy.allowedDestinations.domains"
                ));
            }
        }
        let mut cidrs = Vec::new();
        for (i, c) in spec.cidrs.iter().enumerate() {
            let Some(n) = Net::parse(c) else { continue };
            if !e_nets.is_empty() && !e_nets.iter().any(|o| o.contains(&n)) {
                errs.push(format!(
                    "{path}.cidrs[{i}]: {c:?} is outside the provider entry's \
                     policy.allowedDestinations.cidrs"
                ));
            } else if !lifted.iter().any(|o| o.contains(&n))
                && let Some(d) = denied.iter().find(|d| d.overlaps(&n))
            {
                errs.push(format!(
                    "{path}.cidrs[{i}]: {c:?} overlaps {d}, an internal network proxies may \
                     not reach (only the provider entry's policy.allowedInternalCidrs can \
                     allow it)"
                ));
            }
            cidrs.push(n);
        }
        for (i, p) in spec.ports.iter().enumerate() {
            if !e_ports.is_empty() && !e_ports.contains(p) {
                errs.push(format!(
                    "{path}.ports[{i}]: {p} is outside the provider entry's \
                     policy.allowedDestinations.ports"
                ));
            }
        }
        if !errs.is_empty() {
            return Err(errs);
        }
        Ok(Self {
            min_client_prefix_v4: entry.min_client_prefix_v4,
            min_client_prefix_v6: entry.min_client_prefix_v6,
            max_client_span_v4: entry.max_client_span_v4,
            max_client_span_v6: entry.max_client_span_v6,
            min_password_length: usize::try_from(entry.min_password_length).unwrap_or(usize::MAX),
            domains: if spec.domains.is_empty() {
                e_domains
            } else {
                spec.domains.clone()
            },
            cidrs: if cidrs.is_empty() { e_nets } else { cidrs },
            ports: if spec.ports.is_empty() {
                e_ports.clone()
            } else {
                spec.ports.clone()
            },
            lifted,
            denied,
            connect_default: DEFAULT_CONNECT_PORTS.to_vec(),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn dests(domains: &[&str], cidrs: &[&str], ports: &[u16]) -> Destinations {
        Destinations {
            domains: domains.iter().map(|s| (*s).to_owned()).collect(),
            cidrs: cidrs.iter().map(|s| (*s).to_owned()).collect(),
            ports: ports.to_vec(),
        }
    }

    #[test]
    fn networks_are_masked_and_compared_by_containment() {
        let n = Net::parse("10.1.2.3/8").unwrap();
        assert_eq!(n.to_string(), "10.0.0.0/8");
        assert!(n.contains(&Net::parse("10.9.0.0/16").unwrap()));
        assert!(!n.contains(&Net::parse("0.0.0.0/1").unwrap()));
        assert!(n.overlaps(&Net::parse("0.0.0.0/1").unwrap()));
        assert!(!n.overlaps(&Net::parse("2001:db8::/32").unwrap()));
        assert_eq!(Net::parse("::/0").unwrap().to_string(), "::/0");
    }

    #[test]
    fn the_metadata_address_and_cgnat_are_denied_by_default() {
        let d = denied_networks();
        for ip in [
            "169.254.169.254/32",
            "100.64.0.1/32",
            "fd00::1/128",
            "127.0.0.53/32",
            "64:ff9b::a9fe:a9fe/128",
            "64:ff9b:1::a00:1/128",
            "2002:a9fe:a9fe::/48",
            "2001:0:4136:e378::/64",
        ] {
            let n = Net::parse(ip).unwrap();
            assert!(d.iter().any(|x| x.contains(&n)), "{ip}");
        }
        assert!(
            !d.iter()
                .any(|x| x.contains(&Net::parse("203.0.113.7/32").unwrap()))
        );
    }

    #[test]
    fn domain_patterns_are_lowercase_names_or_star_suffixes() {
        for ok in ["example.com", "*.example.com", "a-b.c0.example"] {
            assert!(is_domain_pattern(ok), "{ok}");
        }
        for bad in [
            "",
            "com",
            "*.com",
            "Example.com",
            "*example.com",
            "a..b",
            "1.2.3.4",
            "ex ample.com",
            "example.com.",
            "-a.com",
            "a.com:443",
            "*.*.a.com",
        ] {
            assert!(!is_domain_pattern(bad), "{bad}");
        }
    }

    #[test]
    fn a_proxy_allowlist_only_narrows_the_entry_and_cannot_reach_internal_networks() {
        let mut entry = ProxyPolicy::default();
        // Without an entry list, public values pass and internal networks are refused.
        let ok = GuestPolicy::for_proxy(
            &entry,
            &dests(&["*.example.com"], &["203.0.113.0/24"], &[443]),
            &[],
        )
        .unwrap();
        assert_eq!(ok.ports, [443]);
        let e =
            GuestPolicy::for_proxy(&entry, &dests(&[], &["10.1.0.0/16"], &[]), &[]).unwrap_err();
        assert!(
            e[0].starts_with("spec.proxy.allowedDestinations.cidrs[0]"),
            "{e:?}"
        );
        let e = GuestPolicy::for_proxy(&entry, &dests(&[], &["0.0.0.0/0"], &[]), &[]).unwrap_err();
        assert!(e[0].contains("overlaps"), "{e:?}");
        let host: IpAddr = "198.51.100.9".parse().unwrap();
        let e = GuestPolicy::for_proxy(&entry, &dests(&[], &["198.51.100.0/24"], &[]), &[host])
            .unwrap_err();
        assert!(
            e[0].contains("198.51.100.9/32"),
            "the host's own address: {e:?}"
        );
        // The entry's list bounds the Proxy's; its allowedInternalCidrs lift the denial.
        entry.allowed_destinations = DestinationAllowlist {
            domains: vec!["*.example.com".into()],
            cidrs: vec!["10.5.0.0/16".into()],
            ports: vec![443, 8443],
        };
        let e =
            GuestPolicy::for_proxy(&entry, &dests(&[], &["10.5.1.0/24"], &[]), &[]).unwrap_err();
        assert!(
            e[0].contains("allowedInternalCidrs"),
            "not lifted yet: {e:?}"
        );
        entry.allowed_internal_cidrs = vec!["10.5.0.0/16".into()];
        let ok = GuestPolicy::for_proxy(
            &entry,
            &dests(
                &["api.example.com", "*.eu.example.com"],
                &["10.5.1.0/24"],
                &[8443],
            ),
            &[],
        )
        .unwrap();
        assert_eq!(ok.cidrs, [Net::parse("10.5.1.0/24").unwrap()]);
        assert_eq!(ok.lifted, [Net::parse("10.5.0.0/16").unwrap()]);
        let e = GuestPolicy::for_proxy(
            &entry,
            &dests(&["example.com", "evil.org"], &["10.6.0.0/16"], &[22]),
            &[],
        )
        .unwrap_err();
        let paths: Vec<&str> = e.iter().map(|m| m.split(':').next().unwrap()).collect();
        assert_eq!(
            paths,
            [
                "spec.proxy.allowedDestinations.domains[0]",
                "spec.proxy.allowedDestinations.domains[1]",
                "spec.proxy.allowedDestinations.cidrs[0]",
                "spec.proxy.allowedDestinations.ports[0]",
            ]
        );
        // Without a Proxy list, the entry's applies.
        let inherit = GuestPolicy::for_proxy(&entry, &Destinations::default(), &[]).unwrap();
        assert_eq!(inherit.domains, ["*.example.com"]);
        assert_eq!(inherit.ports, [443, 8443]);
    }
}
