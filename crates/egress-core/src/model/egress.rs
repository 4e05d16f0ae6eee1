//! A Proxy's declared egress (`spec.egress`): the address(es) it pins, at most one per
//! family, and their checks.
//!
//! Guarantees: [`EgressSpec::validate`] is pure and names every bad value at its field path
//! (`spec.egress.address[1]`) with the value; [`EgressSpec::pinned`] returns exactly the
//! addresses a valid spec pins, in the order written.
//!
//! NB: `address` is a list (one IPv4 and/or one IPv6 address) rather than a string, so a
//! dual-stack proxy can pin both families; a host's address pool gives a pinned proxy exactly
//! the pinned addresses, so pinning only one family of a dual-stack pool leaves the other out.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::{parse_ip_or_cidr, prefix_contains};

/// Largest number of pinned addresses: one per family.
pub const MAX_PINNED: usize = 2;

/// The declared egress of a Proxy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EgressSpec {
    /// The egress address(es) this proxy must have: at most one IPv4 and one IPv6 address,
    /// each one of its host's address pool. The proxy gets exactly these (a family not listed
    /// gets no declared address); without it, a host with an address pool gives the proxy
    /// free addresses of its own. An address held by another proxy or outside every pool
    /// fails the Proxy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "schema", schemars(length(max = 2), extend(
        "items" = {"type": "string", "maxLength": 45},
        "x-kubernetes-validations" = [
            {
                "rule": "self.all(a, isIP(a))",
                "message": "every egress.address entry must be an IP address, e.g. 203.0.113.7 or 2001:db8::7"
            },
            {
                "rule": "size(self) < 2 || !isIP(self[0]) || !isIP(self[1]) || ip(self[0]).family() != ip(self[1]).family()",
                "message": "egress.address takes at most one address per family (one IPv4, one IPv6)"
            }
        ]
    )))]
    pub address: Vec<String>,
}

impl EgressSpec {
    /// Whether nothing is declared.
    pub fn is_empty(&self) -> bool {
        self.address.is_empty()
    }

    /// The pinned addresses that parse (all of them in a valid spec).
    pub fn pinned(&self) -> Vec<IpAddr> {
        self.address
            .iter()
            .filter_map(|a| a.trim().parse().ok())
            .collect()
    }

    /// Every invalid value as `(path, message)`: an entry that is not a unicast IP address,
    /// a second address of one family, more than [`MAX_PINNED`] entries, and a contradiction
    /// with `expected_egress` (`spec.proxy.expectedEgress`): no pinned address of its family
    /// inside it.
    pub fn validate(&self, expected_egress: Option<&str>) -> Vec<(String, String)> {
        let mut errs = Vec::new();
        if self.address.len() > MAX_PINNED {
            errs.push((
                "spec.egress.address".to_owned(),
                format!(
                    "{} addresses given: at most one IPv4 and one IPv6 address",
                    self.address.len()
                ),
            ));
        }
        let mut seen: Vec<IpAddr> = Vec::new();
        for (i, a) in self.address.iter().enumerate() {
            let path = format!("spec.egress.address[{i}]");
            let ip = match a.parse::<IpAddr>() {
                Ok(ip) => ip,
                Err(_) => {
                    errs.push((
                        path,
                        format!("{a:?} is not an IP address (e.g. 203.0.113.7 or 2001:db8::7)"),
                    ));
                    continue;
                }
            };
            if let Some(why) = not_an_egress(ip) {
                errs.push((
                    path,
                    format!("{a} is {why}: it cannot be an egress address"),
                ));
                continue;
            }
            if let Some(other) = seen.iter().find(|s| s.is_ipv4() == ip.is_ipv4()) {
                errs.push((
                    path,
                    format!(
                        "{a} is a second {} address ({other} is already given): at most one \
                         per family",
                        family(ip)
                    ),
                ));
                continue;
            }
            seen.push(ip);
        }
        if let Some(want) = expected_egress
            && !seen.is_empty()
            && let Some((net, len)) = parse_ip_or_cidr(want.trim())
        {
            match seen.iter().find(|s| s.is_ipv4() == net.is_ipv4()) {
                Some(ip) if !prefix_contains(net, len, *ip) => errs.push((
                    "spec.egress.address".to_owned(),
                    format!(
                        "{ip} is outside spec.proxy.expectedEgress {want}: the health check \
                         could never pass"
                    ),
                )),
                Some(_) => {}
                None => errs.push((
                    "spec.egress.address".to_owned(),
                    format!(
                        "no {} address is given, but spec.proxy.expectedEgress {want} expects \
                         one: the health check could never pass",
                        family(net)
                    ),
                )),
            }
        }
        errs
    }
}

/// `IPv4` or `IPv6` (the labels the provider's address usage and the metrics use).
pub fn family(ip: IpAddr) -> &'static str {
    if ip.is_ipv4() { "IPv4" } else { "IPv6" }
}

/// Why `ip` cannot be an egress address, if it cannot.
fn not_an_egress(ip: IpAddr) -> Option<&'static str> {
    match ip {
        _ if ip.is_unspecified() => Some("the unspecified address"),
        _ if ip.is_loopback() => Some("a loopback address"),
        _ if ip.is_multicast() => Some("a multicast address"),
        IpAddr::V4(v4) if v4.is_broadcast() => Some("the broadcast address"),
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() => {
            Some("an IPv4-mapped IPv6 address (write the IPv4 address)")
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    fn spec(a: &[&str]) -> EgressSpec {
        EgressSpec {
            address: a.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    #[test]
    fn one_address_per_family_is_accepted_and_returned_as_pinned() {
        for ok in [
            &["203.0.113.7"][..],
            &["2001:db8::7"],
            &["203.0.113.7", "2001:db8::7"],
        ] {
            let s = spec(ok);
            assert!(s.validate(None).is_empty(), "{ok:?}");
            assert_eq!(s.pinned().len(), ok.len());
        }
        assert!(
            EgressSpec::default()
                .validate(Some("203.0.113.0/24"))
                .is_empty()
        );
    }

    #[test]
    fn bad_addresses_are_refused_at_their_paths_naming_the_value() {
        let e = spec(&["203.0.113.0/24", "127.0.0.1", "2001:db8::7", "2001:db8::8"]).validate(None);
        let paths: Vec<&str> = e.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            paths,
            [
                "spec.egress.address",
                "spec.egress.address[0]",
                "spec.egress.address[1]",
                "spec.egress.address[3]"
            ],
            "{e:?}"
        );
        assert!(
            e[1].1.contains("\"203.0.113.0/24\" is not an IP address"),
            "{e:?}"
        );
        assert!(e[2].1.contains("127.0.0.1 is a loopback"), "{e:?}");
        assert!(e[3].1.contains("2001:db8::8 is a second IPv6") && e[3].1.contains("2001:db8::7"));
        let e = spec(&["::ffff:203.0.113.7"]).validate(None);
        assert_eq!(e[0].0, "spec.egress.address[0]", "{e:?}");
    }

    #[test]
    fn a_pin_contradicting_expected_egress_is_refused() {
        let s = spec(&["203.0.113.7", "2001:db8::7"]);
        assert!(s.validate(Some("203.0.113.0/24")).is_empty());
        assert!(s.validate(Some("2001:db8::7")).is_empty());
        let e = s.validate(Some("198.51.100.0/24"));
        assert_eq!(e.len(), 1, "{e:?}");
        assert_eq!(e[0].0, "spec.egress.address");
        assert!(e[0].1.contains("203.0.113.7") && e[0].1.contains("198.51.100.0/24"));
        let e = spec(&["2001:db8::7"]).validate(Some("203.0.113.7"));
        assert!(e[0].1.contains("no IPv4 address"), "{e:?}");
    }
}
