//! Who may use a proxy, judged by the addresses a list of client networks admits — not by
//! each entry's prefix alone.
//!
//! A proxy daemon sees an IPv4 client on a dual-stack socket as the IPv4-mapped address
//! `::ffff:a.b.c.d` (tinyproxy matches its `Allow` lines against that form), so an IPv6
//! entry such as `::/32` or `::/80`, narrow by its prefix, admits every IPv4 client; 256
//! entries `0.0.0.0/8` … `255.0.0.0/8`, each allowed alone, admit them all together. The
//! rule here counts what the whole list admits after normalising the IPv4-mapped
//! (`::ffff:0:0/96`) and IPv4-compatible (`::/96`) forms to IPv4, and caps the totals.
//!
//! **The rule** (one definition, evaluated by [`span`]; [`cel_v4_rule`] and [`cel_v6_rule`]
//! are the same arithmetic as CEL, not installed in the CRDs: at 256 items their estimated
//! cost is 32 and 16 times the API server's per-rule budget, so the operator applies the rule
//! itself — spec validation in both drivers, `check`, and the renderer):
//! - an IPv4 entry `/L` counts 2^(32−L) IPv4 addresses;
//! - an IPv6 entry inside `::/96` or `::ffff:0:0/96` counts 2^(128−L) IPv4 addresses (it
//!   *is* an IPv4 network, and is rendered as one);
//! - an IPv6 entry containing `::ffff:0:0/96` counts 2^32 IPv4 addresses (every one), and as
//!   many again when it contains `::/96`; it also counts as IPv6 below;
//! - any other IPv6 entry `/L` counts IPv6 in units of a /64 (one LAN): 2^(64−L) for
//!   L ≤ 64, one unit when longer, and 2^33 units (above every cap) when shorter than /32;
//! - the counts are summed over every entry (overlapping entries count twice, so the sum
//!   bounds the union), and each sum must stay within its cap: at most as many IPv4
//!   addresses as one `/maxClientSpanV4` (default and ceiling `/8`: 16,777,216), at most as
//!   many /64s as one `/maxClientSpanV6` (default and ceiling `/32`: 2^32 LANs).
//!
//! An entry admin may lower the caps per entry (`policy.maxClientSpanV4`/`V6`, up to /32
//! and /64); never raise them above the ceilings, which the CRDs enforce for every
//! namespace. Credentials do not lift the caps: a list that admits too much is refused
//! whatever else is set.
//!
//! Guarantees: pure, no allocation beyond the result; the sums saturate (never overflow,
//! never wrap to a small number); [`normalised`] is what the renderer writes, so a mapped or
//! compatible entry reaches tinyproxy and dante in its IPv4 form.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::model::net::parse_cidr;
use crate::proxy_policy::Net;

/// The widest total of IPv4 client addresses any entry may allow, as a prefix length: one
/// /8 (also the default of `policy.maxClientSpanV4`).
pub const CEILING_SPAN_V4: u8 = 8;
/// The widest total of IPv6 client networks any entry may allow, as a prefix length: one
/// /32 counted in /64s (also the default of `policy.maxClientSpanV6`).
pub const CEILING_SPAN_V6: u8 = 32;
/// The narrowest `maxClientSpanV6` an entry may set: one /64 (the unit IPv6 is counted in).
pub const FLOOR_SPAN_V6: u8 = 64;

/// What a list of client networks admits: IPv4 addresses (mapped and compatible forms
/// included) and IPv6 /64 units, each saturating.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Span {
    /// IPv4 addresses admitted.
    pub v4: u64,
    /// IPv6 /64 networks admitted.
    pub v6_units: u64,
}

impl Span {
    /// The IPv4 cap of a `/prefix` span: 2^(32−prefix) addresses.
    pub fn v4_cap(prefix: u8) -> u64 {
        1u64 << (32 - u32::from(prefix.min(32)))
    }

    /// The IPv6 cap of a `/prefix` span (prefix ≤ 64): 2^(64−prefix) /64s.
    pub fn v6_cap(prefix: u8) -> u64 {
        1u64.checked_shl(64 - u32::from(prefix.min(64)))
            .unwrap_or(u64::MAX)
    }
}

const MAPPED: Net = Net {
    addr: IpAddr::V6(Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0)),
    len: 96,
};
const COMPATIBLE: Net = Net {
    addr: IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    len: 96,
};

fn pow2(n: u32) -> u64 {
    1u64.checked_shl(n).unwrap_or(u64::MAX)
}

/// The IPv4 network an IPv6 network inside `::ffff:0:0/96` or `::/96` stands for.
fn embedded_v4(n: &Net) -> Option<Net> {
    let IpAddr::V6(a) = n.addr else { return None };
    if !(MAPPED.contains(n) || COMPATIBLE.contains(n)) {
        return None;
    }
    let low = u32::try_from(u128::from(a) & u128::from(u32::MAX)).unwrap_or(0);
    Some(Net::new(IpAddr::V4(Ipv4Addr::from(low)), n.len - 96))
}

/// What one (masked) network counts ([`span`]'s rule for one entry).
pub fn count(n: &Net) -> Span {
    match n.addr {
        IpAddr::V4(_) => Span {
            v4: pow2(32 - u32::from(n.len.min(32))),
            v6_units: 0,
        },
        IpAddr::V6(_) => {
            if let Some(v4) = embedded_v4(n) {
                return count(&v4);
            }
            let mut v4 = 0u64;
            for r in [MAPPED, COMPATIBLE] {
                if n.contains(&r) {
                    v4 = v4.saturating_add(pow2(32));
                }
            }
            let v6_units = match n.len {
                0..32 => pow2(33),
                32..=64 => pow2(64 - u32::from(n.len)),
                _ => 1,
            };
            Span { v4, v6_units }
        }
    }
}

/// The sum of [`count`] over `nets`.
pub fn span<'a>(nets: impl IntoIterator<Item = &'a Net>) -> Span {
    nets.into_iter().fold(Span::default(), |acc, n| {
        let c = count(n);
        Span {
            v4: acc.v4.saturating_add(c.v4),
            v6_units: acc.v6_units.saturating_add(c.v6_units),
        }
    })
}

/// `n` as the renderer writes it: the IPv4 network of a mapped or compatible entry, else
/// `n` itself.
pub fn normalised(n: &Net) -> Net {
    embedded_v4(n).unwrap_or(*n)
}

/// Checks a Proxy's client networks against caps `/span_v4` and `/span_v6` (see the module
/// docs) and every entry's shape; returns the normalised networks, or every violation as
/// `(field path, message)` under `path` (`spec.proxy.allowedClientCidrs`). A list with no
/// entry passes (credentials must then be set; checked elsewhere).
pub fn check(
    path: &str,
    cidrs: &[String],
    span_v4: u8,
    span_v6: u8,
) -> Result<Vec<Net>, Vec<(String, String)>> {
    let mut errs = Vec::new();
    let mut nets = Vec::with_capacity(cidrs.len());
    for (i, c) in cidrs.iter().enumerate() {
        match parse_cidr(c) {
            None => errs.push((
                format!("{path}[{i}]"),
                format!("{c:?} is not a CIDR (e.g. 10.0.0.0/8 or 2001:db8::/32)"),
            )),
            Some((_, 0)) => errs.push((
                format!("{path}[{i}]"),
                format!("{c:?} allows every address: a proxy open to everyone is an open relay"),
            )),
            Some((ip, len)) => nets.push(Net::new(ip, len)),
        }
    }
    if !errs.is_empty() {
        return Err(errs);
    }
    let s = span(&nets);
    let (cap4, cap6) = (Span::v4_cap(span_v4), Span::v6_cap(span_v6));
    if s.v4 > cap4 {
        errs.push((
            path.to_owned(),
            format!(
                "the list admits {} IPv4 client addresses (IPv4-mapped ::ffff:0:0/96 and \
                 IPv4-compatible ::/96 forms counted as IPv4; an IPv6 network containing them \
                 admits every IPv4 client); at most {cap4} (one /{span_v4}, the provider \
                 entry's policy.maxClientSpanV4) are allowed",
                fmt_count(s.v4)
            ),
        ));
    }
    if s.v6_units > cap6 {
        errs.push((
            path.to_owned(),
            format!(
                "the list admits {} IPv6 /64 client networks; at most {cap6} (one /{span_v6}, \
                 the provider entry's policy.maxClientSpanV6) are allowed",
                fmt_count(s.v6_units)
            ),
        ));
    }
    if errs.is_empty() {
        Ok(nets.iter().map(normalised).collect())
    } else {
        Err(errs)
    }
}

fn fmt_count(n: u64) -> String {
    if n == u64::MAX {
        "more than 2^63".into()
    } else {
        n.to_string()
    }
}

/// The powers of two 2^0 … 2^32 as a CEL list literal, indexed by exponent.
fn cel_pow2() -> String {
    let items: Vec<String> = (0..=32).map(|e| (1u64 << e).to_string()).collect();
    format!("[{}]", items.join(","))
}

/// The IPv4 count of one entry `c`, as CEL (the arithmetic of [`count`]; a string the
/// Kubernetes CIDR library refuses, such as an IPv4-mapped one, counts nothing here and is
/// refused by the `isCIDR` rule beside it).
fn cel_v4_count() -> String {
    let p = cel_pow2();
    format!(
        "!isCIDR(c) ? 0 : cidr(c).ip().family() == 4 ? {p}[32 - cidr(c).prefixLength()] : \
         cidr('::/96').containsCIDR(cidr(c)) ? {p}[128 - cidr(c).prefixLength()] : \
         ((cidr(c).prefixLength() <= 95 && cidr(c).containsIP(ip('::fffe:ffff:ffff'))) ? 4294967296 : 0) + \
         (cidr(c).containsCIDR(cidr('::/96')) ? 4294967296 : 0)"
    )
}

/// The IPv6 /64 count of one entry `c`, as CEL (the arithmetic of [`count`]).
fn cel_v6_count() -> String {
    let p = cel_pow2();
    format!(
        "!isCIDR(c) || cidr(c).ip().family() == 4 || cidr('::/96').containsCIDR(cidr(c)) ? 0 : \
         cidr(c).prefixLength() < 32 ? 8589934592 : \
         cidr(c).prefixLength() <= 64 ? {p}[64 - cidr(c).prefixLength()] : 1"
    )
}

/// The CEL rule on `allowedClientCidrs` capping the IPv4 total at the ceiling (/8).
// NB: a `::ffff:…` entry containing ::ffff:0:0/96 is detected through `::fffe:ffff:ffff`, the
// address just below it: an aligned network of at least 2^33 addresses holds one iff it holds
// the other, and the Kubernetes IP library refuses IPv4-mapped literals (`ip('::ffff:0:0')`).
pub fn cel_v4_rule() -> String {
    format!(
        "self.map(c, {}).sum() <= {}",
        cel_v4_count(),
        Span::v4_cap(CEILING_SPAN_V4)
    )
}

/// The CEL rule on `allowedClientCidrs` capping the IPv6 total at the ceiling (/32 in /64s).
pub fn cel_v6_rule() -> String {
    format!(
        "self.map(c, {}).sum() <= {}",
        cel_v6_count(),
        Span::v6_cap(CEILING_SPAN_V6)
    )
}

/// The message of [`cel_v4_rule`].
pub const CEL_V4_MESSAGE: &str = "allowedClientCidrs admit more than 16777216 IPv4 client \
     addresses (one /8) in total; IPv6 networks containing ::ffff:0:0/96 or ::/96 admit every \
     IPv4 client";
/// The message of [`cel_v6_rule`].
pub const CEL_V6_MESSAGE: &str = "allowedClientCidrs admit more than 4294967296 IPv6 /64 \
     client networks (one /32) in total";

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    fn list(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    fn every_slash_8() -> Vec<String> {
        (0..=255).map(|a| format!("{a}.0.0.0/8")).collect()
    }

    #[test]
    fn ipv6_networks_holding_the_mapped_or_compatible_range_admit_every_ipv4_client() {
        for c in [
            "::/32",
            "::/80",
            "::/64",
            "::/1",
            "::ff00:0:0/88",
            "::/95",
            "::/96",
        ] {
            let n = Net::parse(c).unwrap();
            assert!(count(&n).v4 >= 1 << 32, "{c}: {:?}", count(&n));
            let e = check("p", &list(&[c]), 8, 32).unwrap_err();
            assert!(e[0].1.contains("IPv4 client addresses"), "{c}: {e:?}");
        }
        // Not holding them: only IPv6 counted.
        for c in ["2001:db8::/32", "::1:0:0:0/80", "::fffe:0:0/96"] {
            assert_eq!(count(&Net::parse(c).unwrap()).v4, 0, "{c}");
            check("p", &list(&[c]), 8, 32).unwrap();
        }
    }

    #[test]
    fn the_union_of_many_narrow_networks_is_judged_not_each_one() {
        let e = check("spec.proxy.allowedClientCidrs", &every_slash_8(), 8, 32).unwrap_err();
        assert_eq!(e.len(), 1, "{e:?}");
        assert_eq!(e[0].0, "spec.proxy.allowedClientCidrs");
        assert!(e[0].1.contains("4294967296 IPv4"), "{e:?}");
        // One /8 is exactly the cap; a /8 and a /32 more is over it.
        check("p", &list(&["10.0.0.0/8"]), 8, 32).unwrap();
        check("p", &list(&["10.0.0.0/8", "192.0.2.1/32"]), 8, 32).unwrap_err();
        check("p", &list(&["10.0.0.0/9", "11.0.0.0/9"]), 8, 32).unwrap();
        // An entry's lower cap.
        check("p", &list(&["10.0.0.0/16"]), 16, 32).unwrap();
        check("p", &list(&["10.0.0.0/16", "10.1.0.0/24"]), 16, 32).unwrap_err();
    }

    #[test]
    fn mapped_and_compatible_entries_count_and_render_as_ipv4() {
        let n = Net::parse("::ffff:10.0.0.0/104").unwrap();
        assert_eq!(
            count(&n),
            Span {
                v4: 1 << 24,
                v6_units: 0
            }
        );
        assert_eq!(normalised(&n).to_string(), "10.0.0.0/8");
        let c = Net::parse("::10.1.0.0/112").unwrap();
        assert_eq!(normalised(&c).to_string(), "10.1.0.0/16");
        let out = check(
            "p",
            &list(&["::ffff:198.51.100.0/120", "2001:db8::/48"]),
            8,
            32,
        )
        .unwrap();
        let shown: Vec<String> = out.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["198.51.100.0/24", "2001:db8::/48"]);
        check("p", &list(&["::ffff:0.0.0.0/97"]), 8, 32).unwrap_err();
    }

    #[test]
    fn ipv6_is_counted_in_slash_64s_and_capped_at_a_slash_32() {
        assert_eq!(
            count(&Net::parse("2001:db8::/32").unwrap()).v6_units,
            1 << 32
        );
        assert_eq!(count(&Net::parse("2001:db8::/64").unwrap()).v6_units, 1);
        assert_eq!(count(&Net::parse("2001:db8::1/128").unwrap()).v6_units, 1);
        assert_eq!(count(&Net::parse("2000::/3").unwrap()).v6_units, 1 << 33);
        check("p", &list(&["2001:db8::/32"]), 8, 32).unwrap();
        check("p", &list(&["2001:db8::/32", "2001:db9::/64"]), 8, 32).unwrap_err();
        check("p", &list(&["2001:db8::/48"]), 8, 48).unwrap();
        check("p", &list(&["2001:db8::/47"]), 8, 48).unwrap_err();
    }

    #[test]
    fn sums_of_the_widest_lists_neither_overflow_nor_wrap() {
        // Each `::/1` counts every IPv4 address twice (mapped and compatible) and 2^33 /64s
        // (above every cap): 300 of them sum exactly, far from u64's end.
        let nets: Vec<Net> = (0..300).map(|_| Net::parse("::/1").unwrap()).collect();
        let s = span(&nets);
        assert_eq!(
            s,
            Span {
                v4: 300 << 33,
                v6_units: 300 << 33
            }
        );
        let e = check("p", &vec!["::/1".to_owned(); 300], 8, 32).unwrap_err();
        assert_eq!(e.len(), 2, "{e:?}");
    }

    #[test]
    fn shape_errors_name_each_entry() {
        let e = check("p", &list(&["10.0.0.0/8", "nonsense", "0.0.0.0/0"]), 8, 32).unwrap_err();
        let paths: Vec<&str> = e.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(paths, ["p[1]", "p[2]"]);
    }
}
