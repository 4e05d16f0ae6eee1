//! Declared egress addresses of one host (`addressPool:`): the guest-side prefix, gateway and
//! allocatable ranges per address family, and the DNS servers, for hosts whose bridge carries
//! routable addresses (a routed prefix or a public bridge).
//!
//! Guarantees:
//! - [`AddressPool::parse`] is pure and reports every violation at once, each with its field
//!   path (relative to the pool: `ipv4.ranges[1]`) and the value at fault; nothing is dropped
//!   or corrected silently;
//! - a parsed pool's ranges lie inside their prefix, never contain the prefix's network address
//!   (nor, for IPv4 prefixes shorter than /31, its broadcast address) nor the gateway, and do
//!   not overlap each other; the gateway lies inside the prefix;
//! - [`ParsedPool::overlap`] finds an address two hosts' pools could both hand out, for the
//!   "no overlap between hosts that share a segment" rule of the config check.
//!
//! The file shape (strings, parsed here) keeps the config reader's line-and-column errors for
//! shape problems and this module's field-path errors for meaning problems.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::Deserialize;

/// The addresses a host's guests may be given, as written in the provider config.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AddressPool {
    /// IPv4 prefix, gateway and ranges.
    #[serde(default)]
    pub ipv4: Option<FamilyPool>,
    /// IPv6 prefix, gateway and ranges.
    #[serde(default)]
    pub ipv6: Option<FamilyPool>,
    /// DNS servers the guests use (given to the guest with its static address).
    #[serde(default)]
    pub dns: Vec<String>,
    /// The namespaces the pool's addresses belong to (`access: {namespaces,
    /// namespaceSelector}`): only their proxies are placed on this host or may pin its
    /// addresses; not set: every namespace the entry grants address pools to.
    #[serde(default)]
    pub access: Option<super::namespaces::Namespaces>,
    /// How long an address stays reserved for its last holder's namespace after its
    /// instance is gone (`holdReleased`, e.g. `10m`): only a Proxy of that namespace may pin
    /// it meanwhile (a pool replacing a member keeps its address so), and no other Proxy is
    /// given it. Default [`DEFAULT_HOLD_RELEASED`].
    #[serde(
        default = "default_hold",
        deserialize_with = "super::secs::deserialize"
    )]
    pub hold_released: std::time::Duration,
}

impl Default for AddressPool {
    fn default() -> Self {
        Self {
            ipv4: None,
            ipv6: None,
            dns: Vec::new(),
            access: None,
            hold_released: DEFAULT_HOLD_RELEASED,
        }
    }
}

/// Default [`AddressPool::hold_released`]: ten minutes.
// NB: a pool's replacement of a member with `rotation.egressAddress: Keep` pins the released
// address within seconds to minutes (a create); ten minutes covers a slow host and a
// restart of the replacement's create, and keeps an address out of use no longer than that.
pub const DEFAULT_HOLD_RELEASED: std::time::Duration = std::time::Duration::from_secs(600);

fn default_hold() -> std::time::Duration {
    DEFAULT_HOLD_RELEASED
}

/// One family's part of an [`AddressPool`], as written.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FamilyPool {
    /// The guest-side prefix in CIDR notation (`203.0.113.0/28`, `2001:db8:1::/64`).
    pub prefix: String,
    /// The guests' default gateway: inside `prefix`, outside every range.
    pub gateway: String,
    /// Allocatable addresses: `a-b` (inclusive), a single address, or a CIDR inside `prefix`.
    pub ranges: Vec<String>,
}

/// A violation found by [`AddressPool::parse`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolError {
    /// Field path relative to the pool (`ipv4.gateway`, `ipv6.ranges[0]`, `dns[1]`).
    pub field: String,
    /// What is wrong, naming the value.
    pub message: String,
}

/// An [`AddressPool`] checked and parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedPool {
    /// IPv4 part.
    pub ipv4: Option<ParsedFamily>,
    /// IPv6 part.
    pub ipv6: Option<ParsedFamily>,
    /// DNS servers.
    pub dns: Vec<IpAddr>,
}

/// One family of a [`ParsedPool`]: every range is inside `prefix`, sorted, disjoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedFamily {
    /// The guest-side prefix.
    pub prefix: IpNet,
    /// The default gateway.
    pub gateway: IpAddr,
    /// Inclusive ranges, sorted by start, disjoint.
    pub ranges: Vec<(IpAddr, IpAddr)>,
}

impl ParsedFamily {
    /// How many addresses the ranges hold (saturating at `u128::MAX`).
    pub fn size(&self) -> u128 {
        self.ranges.iter().fold(0u128, |n, (a, b)| {
            n.saturating_add(num(*b) - num(*a)).saturating_add(1)
        })
    }

    /// Whether `ip` is one of the allocatable addresses.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let v = num(ip);
        self.ranges
            .iter()
            .any(|(a, b)| same_family(*a, ip) && num(*a) <= v && v <= num(*b))
    }
}

impl ParsedPool {
    /// The family part an address of `ip`'s family comes from.
    pub fn family(&self, ip: IpAddr) -> Option<&ParsedFamily> {
        match ip {
            IpAddr::V4(_) => self.ipv4.as_ref(),
            IpAddr::V6(_) => self.ipv6.as_ref(),
        }
    }

    /// An address both pools could hand out, when their prefixes overlap (hosts on one
    /// segment); `None` when they cannot collide.
    pub fn overlap(&self, other: &ParsedPool) -> Option<IpAddr> {
        [
            (self.ipv4.as_ref(), other.ipv4.as_ref()),
            (self.ipv6.as_ref(), other.ipv6.as_ref()),
        ]
        .into_iter()
        .filter_map(|(a, b)| Some((a?, b?)))
        .filter(|(a, b)| {
            a.prefix.contains(&b.prefix.network()) || b.prefix.contains(&a.prefix.network())
        })
        .find_map(|(a, b)| {
            a.ranges.iter().find_map(|(s1, e1)| {
                b.ranges.iter().find_map(|(s2, e2)| {
                    let lo = num(*s1).max(num(*s2));
                    (lo <= num(*e1).min(num(*e2)))
                        .then(|| if num(*s1) >= num(*s2) { *s1 } else { *s2 })
                })
            })
        })
    }
}

impl AddressPool {
    /// Checks and parses the pool; every violation is reported, each naming its field.
    pub fn parse(&self) -> Result<ParsedPool, Vec<PoolError>> {
        let mut errs = Vec::new();
        if self.ipv4.is_none() && self.ipv6.is_none() {
            errs.push(PoolError {
                field: "ipv4".into(),
                message: "an address pool needs ipv4, ipv6 or both".into(),
            });
        }
        let ipv4 = self
            .ipv4
            .as_ref()
            .and_then(|f| parse_family(f, "ipv4", true, &mut errs));
        let ipv6 = self
            .ipv6
            .as_ref()
            .and_then(|f| parse_family(f, "ipv6", false, &mut errs));
        let mut dns = Vec::new();
        for (i, d) in self.dns.iter().enumerate() {
            match d.trim().parse::<IpAddr>() {
                Ok(ip) => dns.push(ip),
                Err(_) => errs.push(PoolError {
                    field: format!("dns[{i}]"),
                    message: format!("{d:?} is not an IP address"),
                }),
            }
        }
        if errs.is_empty() {
            Ok(ParsedPool { ipv4, ipv6, dns })
        } else {
            Err(errs)
        }
    }
}

/// The address as a number, for range arithmetic (IPv4 in the low 32 bits).
pub fn num(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

/// The address of `v` in `like`'s family (`v` must fit it).
pub fn from_num(like: IpAddr, v: u128) -> IpAddr {
    match like {
        IpAddr::V4(_) => IpAddr::V4((v as u32).into()),
        IpAddr::V6(_) => IpAddr::V6(v.into()),
    }
}

fn same_family(a: IpAddr, b: IpAddr) -> bool {
    a.is_ipv4() == b.is_ipv4()
}

fn parse_family(
    f: &FamilyPool,
    fam: &str,
    v4: bool,
    errs: &mut Vec<PoolError>,
) -> Option<ParsedFamily> {
    let before = errs.len();
    let mut err = |field: String, message: String| errs.push(PoolError { field, message });
    let want = if v4 { "an IPv4" } else { "an IPv6" };
    let prefix = match f.prefix.trim().parse::<IpNet>() {
        Ok(p) if p.addr().is_ipv4() != v4 => {
            err(
                format!("{fam}.prefix"),
                format!("{:?} is not {want} prefix", f.prefix),
            );
            None
        }
        Ok(p) if p.addr() != p.network() => {
            err(
                format!("{fam}.prefix"),
                format!(
                    "{:?} has host bits set: the prefix is {}",
                    f.prefix,
                    p.trunc()
                ),
            );
            None
        }
        Ok(p) => Some(p),
        Err(_) => {
            err(
                format!("{fam}.prefix"),
                format!(
                    "{:?} is not a prefix in CIDR notation (e.g. {})",
                    f.prefix,
                    example(v4)
                ),
            );
            None
        }
    };
    let gateway = match f.gateway.trim().parse::<IpAddr>() {
        Ok(g) if g.is_ipv4() != v4 => {
            err(
                format!("{fam}.gateway"),
                format!("{:?} is not {want} address", f.gateway),
            );
            None
        }
        Ok(g) => Some(g),
        Err(_) => {
            err(
                format!("{fam}.gateway"),
                format!("{:?} is not an IP address", f.gateway),
            );
            None
        }
    };
    // Addresses a range must never hold: the prefix's network address and, for IPv4 prefixes
    // that have one, its broadcast address.
    let reserved: Vec<IpAddr> = prefix
        .map(|p| {
            let mut r = vec![p.network()];
            if v4 && p.prefix_len() < 31 {
                r.push(p.broadcast());
            }
            r
        })
        .unwrap_or_default();
    if let (Some(p), Some(g)) = (prefix, gateway) {
        if !p.contains(&g) {
            err(
                format!("{fam}.gateway"),
                format!("{g} is outside the prefix {p}"),
            );
        } else if reserved.contains(&g) {
            err(
                format!("{fam}.gateway"),
                format!("{g} is the network or broadcast address of {p}"),
            );
        }
    }
    if f.ranges.is_empty() {
        err(
            format!("{fam}.ranges"),
            "no range: give at least one (a-b, an address or a CIDR)".into(),
        );
    }
    let mut ranges: Vec<(IpAddr, IpAddr, usize)> = Vec::new();
    for (i, r) in f.ranges.iter().enumerate() {
        let field = format!("{fam}.ranges[{i}]");
        let Some((a, b)) = parse_range(r) else {
            err(
                field,
                format!("{r:?} is not a range: a-b (inclusive), one address, or a CIDR"),
            );
            continue;
        };
        if a.is_ipv4() != v4 || b.is_ipv4() != v4 {
            err(field, format!("{r:?} is not {want} range"));
            continue;
        }
        if num(a) > num(b) {
            err(field, format!("{r:?} ends before it starts"));
            continue;
        }
        if let Some(p) = prefix {
            if !p.contains(&a) || !p.contains(&b) {
                err(field, format!("{r:?} is not inside the prefix {p}"));
                continue;
            }
            if let Some(x) = reserved
                .iter()
                .find(|x| num(a) <= num(**x) && num(**x) <= num(b))
            {
                err(
                    field,
                    format!("{r:?} contains {x}, the network or broadcast address of {p}"),
                );
                continue;
            }
        }
        if let Some(g) = gateway
            && same_family(g, a)
            && num(a) <= num(g)
            && num(g) <= num(b)
        {
            err(field, format!("{r:?} contains the gateway {g}"));
            continue;
        }
        ranges.push((a, b, i));
    }
    ranges.sort_by_key(|(a, _, _)| num(*a));
    for w in ranges.windows(2) {
        let [(_, e1, i1), (s2, _, i2)] = w else {
            continue;
        };
        if num(*s2) <= num(*e1) {
            let (later, earlier) = ((*i1).max(*i2), (*i1).min(*i2));
            let text = |i: usize| f.ranges.get(i).map_or("", String::as_str);
            err(
                format!("{fam}.ranges[{later}]"),
                format!(
                    "{:?} overlaps {fam}.ranges[{earlier}] ({:?})",
                    text(later),
                    text(earlier)
                ),
            );
        }
    }
    if errs.len() != before {
        return None;
    }
    Some(ParsedFamily {
        prefix: prefix?,
        gateway: gateway?,
        ranges: ranges.into_iter().map(|(a, b, _)| (a, b)).collect(),
    })
}

fn example(v4: bool) -> &'static str {
    if v4 {
        "203.0.113.0/28"
    } else {
        "2001:db8:1::/64"
    }
}

/// `a-b`, `a` or `a/len` as an inclusive range.
fn parse_range(r: &str) -> Option<(IpAddr, IpAddr)> {
    let r = r.trim();
    if let Some((a, b)) = r.split_once('-') {
        return Some((a.trim().parse().ok()?, b.trim().parse().ok()?));
    }
    if r.contains('/') {
        let n: IpNet = r.parse().ok()?;
        if n.addr() != n.network() {
            return None;
        }
        return Some((n.network(), n.broadcast()));
    }
    let a: IpAddr = r.parse().ok()?;
    Some((a, a))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fam(prefix: &str, gateway: &str, ranges: &[&str]) -> FamilyPool {
        FamilyPool {
            prefix: prefix.into(),
            gateway: gateway.into(),
            ranges: ranges.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn pool4(prefix: &str, gateway: &str, ranges: &[&str]) -> AddressPool {
        AddressPool {
            ipv4: Some(fam(prefix, gateway, ranges)),
            ipv6: None,
            dns: vec![],
            access: None,
            hold_released: crate::libvirt::address_pool::DEFAULT_HOLD_RELEASED,
        }
    }

    fn fields(p: &AddressPool) -> Vec<String> {
        p.parse()
            .unwrap_err()
            .into_iter()
            .map(|e| e.field)
            .collect()
    }

    #[test]
    fn a_routed_prefix_with_both_families_parses_sorted_and_sized() {
        let p = AddressPool {
            ipv4: Some(fam(
                "203.0.113.0/28",
                "203.0.113.1",
                &["203.0.113.10-203.0.113.14", "203.0.113.2"],
            )),
            ipv6: Some(fam(
                "2001:db8:1::/64",
                "2001:db8:1::1",
                &["2001:db8:1::100/120"],
            )),
            dns: vec!["203.0.113.53".into(), "2001:db8::53".into()],
            access: None,
            hold_released: crate::libvirt::address_pool::DEFAULT_HOLD_RELEASED,
        };
        let parsed = p.parse().unwrap();
        let v4 = parsed.ipv4.as_ref().unwrap();
        assert_eq!(v4.ranges[0].0, "203.0.113.2".parse::<IpAddr>().unwrap());
        assert_eq!(v4.size(), 6);
        assert_eq!(parsed.ipv6.as_ref().unwrap().size(), 256);
        assert!(v4.contains("203.0.113.12".parse().unwrap()));
        assert!(!v4.contains("203.0.113.9".parse().unwrap()));
        assert_eq!(parsed.dns.len(), 2);
    }

    #[test]
    fn every_violation_is_reported_with_its_field() {
        // gateway outside, a range with the broadcast address, a range outside, a bad DNS.
        let mut p = pool4(
            "203.0.113.0/28",
            "198.51.100.1",
            &["203.0.113.2-203.0.113.15", "203.0.114.1", "nonsense"],
        );
        p.dns = vec!["8.8.8.8".into(), "dns.example".into()];
        let errs = p.parse().unwrap_err();
        let f: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            f,
            [
                "ipv4.gateway",
                "ipv4.ranges[0]",
                "ipv4.ranges[1]",
                "ipv4.ranges[2]",
                "dns[1]"
            ],
            "{errs:?}"
        );
        assert!(errs[0].message.contains("198.51.100.1"), "{errs:?}");
        assert!(errs[1].message.contains("203.0.113.15"), "{errs:?}");
    }

    #[test]
    fn network_address_gateway_in_range_and_overlaps_are_refused() {
        assert_eq!(
            fields(&pool4(
                "203.0.113.0/28",
                "203.0.113.1",
                &["203.0.113.0-203.0.113.3"]
            )),
            ["ipv4.ranges[0]"]
        );
        assert_eq!(
            fields(&pool4(
                "203.0.113.0/28",
                "203.0.113.1",
                &["203.0.113.1-203.0.113.3"]
            )),
            ["ipv4.ranges[0]"]
        );
        assert_eq!(
            fields(&pool4(
                "203.0.113.0/28",
                "203.0.113.1",
                &["203.0.113.5-203.0.113.9", "203.0.113.2-203.0.113.5"]
            )),
            ["ipv4.ranges[1]"]
        );
        assert_eq!(
            fields(&pool4("203.0.113.0/28", "203.0.113.0", &["203.0.113.2"])),
            ["ipv4.gateway"]
        );
        assert_eq!(
            fields(&pool4("203.0.113.1/28", "203.0.113.1", &["203.0.113.2"])),
            ["ipv4.prefix"]
        );
        assert_eq!(
            fields(&pool4("2001:db8::/64", "203.0.113.1", &["203.0.113.2"])),
            ["ipv4.prefix"]
        );
        assert_eq!(
            fields(&pool4("203.0.113.0/28", "203.0.113.1", &[])),
            ["ipv4.ranges"]
        );
        assert_eq!(
            fields(&pool4(
                "203.0.113.0/28",
                "203.0.113.1",
                &["203.0.113.9-203.0.113.3"]
            )),
            ["ipv4.ranges[0]"]
        );
        assert_eq!(fields(&AddressPool::default()), ["ipv4"]);
        // /31 and /32 have no broadcast address to keep out.
        assert!(
            pool4("203.0.113.4/31", "203.0.113.4", &["203.0.113.5"])
                .parse()
                .is_err()
        );
        assert!(
            pool4("203.0.113.4/30", "203.0.113.5", &["203.0.113.6"])
                .parse()
                .is_ok()
        );
    }

    #[test]
    fn overlap_only_between_pools_on_one_segment() {
        let a = pool4(
            "203.0.113.0/28",
            "203.0.113.1",
            &["203.0.113.2-203.0.113.8"],
        )
        .parse()
        .unwrap();
        let b = pool4(
            "203.0.113.0/28",
            "203.0.113.1",
            &["203.0.113.8-203.0.113.14"],
        )
        .parse()
        .unwrap();
        let c = pool4(
            "203.0.113.0/28",
            "203.0.113.1",
            &["203.0.113.9-203.0.113.14"],
        )
        .parse()
        .unwrap();
        let d = pool4(
            "198.51.100.0/28",
            "198.51.100.1",
            &["198.51.100.2-198.51.100.8"],
        )
        .parse()
        .unwrap();
        assert_eq!(a.overlap(&b), Some("203.0.113.8".parse().unwrap()));
        assert_eq!(b.overlap(&a), Some("203.0.113.8".parse().unwrap()));
        assert_eq!(a.overlap(&c), None);
        assert_eq!(a.overlap(&d), None);
    }
}
