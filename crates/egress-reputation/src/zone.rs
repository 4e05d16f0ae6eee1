//! Blocklist zone names and the name queried for an address in a zone.
//!
//! Guarantees:
//! - a [`Zone`] is a DNS name the query name fits under: labels of 1–63 letters, digits and
//!   `-` (not at either end of a label), at least two labels, the last one not all digits (so
//!   an IP address is refused), lowercase, without the trailing dot, at most
//!   [`MAX_ZONE_LEN`] characters so that the longest query name (an IPv6 address's 64
//!   characters of nibbles and dots, then the zone) stays within DNS's 253;
//! - [`query_name`] is total: every address has one query name in every zone (an
//!   IPv4-mapped IPv6 address is queried as the IPv4 address it carries, as blocklists list
//!   IPv4 addresses under their IPv4 form).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Longest zone name: 253 (a DNS name's longest text form) less the 64 characters of an IPv6
/// address's 32 reversed nibbles, each followed by its dot.
pub const MAX_ZONE_LEN: usize = 253 - 64;

/// A validated blocklist zone name (lowercase, no trailing dot).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Zone(String);

/// Why a zone name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a DNS zone name: {1}")]
pub struct ZoneError(pub String, pub &'static str);

impl Zone {
    /// Checks `text` (a trailing dot is allowed, case is folded).
    pub fn parse(text: &str) -> Result<Self, ZoneError> {
        let shown: String = text.chars().take(80).collect();
        let err = |why| Err(ZoneError(shown.clone(), why));
        let t = text.strip_suffix('.').unwrap_or(text).to_ascii_lowercase();
        if t.is_empty() {
            return err("it is empty");
        }
        if t.len() > MAX_ZONE_LEN {
            return err(
                "it is longer than 189 characters (the query names under it would pass DNS's 253)",
            );
        }
        let labels: Vec<&str> = t.split('.').collect();
        if labels.len() < 2 {
            return err("it needs at least two labels, e.g. zen.spamhaus.org");
        }
        for l in &labels {
            if l.is_empty() {
                return err("it has an empty label (two dots in a row, or a leading dot)");
            }
            if l.len() > 63 {
                return err("a label is longer than 63 characters");
            }
            if !l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
                return err("labels may hold only letters, digits and '-'");
            }
            if l.starts_with('-') || l.ends_with('-') {
                return err("a label starts or ends with '-'");
            }
        }
        if labels
            .last()
            .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()))
        {
            return err("its last label is all digits (an IP address is not a zone)");
        }
        Ok(Self(t))
    }

    /// The name, lowercase, without the trailing dot.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The address a blocklist lists `ip` under: the IPv4 address inside an IPv4-mapped IPv6
/// address, else `ip` itself.
pub fn listed_form(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// The fully qualified name to query (`A`) for `ip` in `zone`, with the trailing dot:
/// `4.3.2.1.zone.` for `1.2.3.4`, the 32 nibbles reversed for an IPv6 address.
pub fn query_name(ip: IpAddr, zone: &Zone) -> String {
    let mut out = match listed_form(ip) {
        IpAddr::V4(v4) => reversed_v4(v4),
        IpAddr::V6(v6) => reversed_v6(v6),
    };
    out.push('.');
    out.push_str(zone.as_str());
    out.push('.');
    out
}

fn reversed_v4(ip: Ipv4Addr) -> String {
    let [a, b, c, d] = ip.octets();
    format!("{d}.{c}.{b}.{a}")
}

fn reversed_v6(ip: Ipv6Addr) -> String {
    let mut s = String::with_capacity(63);
    for byte in ip.octets().iter().rev() {
        for nibble in [byte & 0x0f, byte >> 4] {
            if !s.is_empty() {
                s.push('.');
            }
            // A nibble is below 16: always a lowercase hex digit.
            s.extend(char::from_digit(u32::from(nibble), 16));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zone_names_are_checked_and_folded() {
        assert_eq!(
            Zone::parse("Zen.Spamhaus.org.").unwrap().as_str(),
            "zen.spamhaus.org"
        );
        assert_eq!(Zone::parse("bl.test").unwrap().as_str(), "bl.test");
        assert_eq!(Zone::parse("b-l.x1.test").unwrap().as_str(), "b-l.x1.test");
        for bad in [
            "",
            ".",
            "localhost",
            "127.0.0.1",
            "bl..test",
            ".bl.test",
            "-bl.test",
            "bl-.test",
            "bl.te_st",
            "bl test.org",
            "http://bl.test/",
            "bl.test/24",
            "bl.tést",
        ] {
            assert!(Zone::parse(bad).is_err(), "{bad:?} accepted");
        }
        let long_label = format!("{}.test", "a".repeat(64));
        assert!(Zone::parse(&long_label).is_err());
        let fits = format!(
            "{}.{}.{}.test",
            "a".repeat(60),
            "b".repeat(60),
            "c".repeat(62)
        );
        assert_eq!(fits.len(), MAX_ZONE_LEN);
        assert!(Zone::parse(&fits).is_ok());
        assert!(Zone::parse(&format!("x{fits}")).is_err());
    }

    #[test]
    fn the_longest_query_name_fits_dns() {
        let zone = Zone::parse(&format!(
            "{}.{}.{}.test",
            "a".repeat(60),
            "b".repeat(60),
            "c".repeat(62)
        ))
        .unwrap();
        let ip: IpAddr = "2001:db8::1".parse().unwrap();
        let name = query_name(ip, &zone);
        assert_eq!(name.trim_end_matches('.').len(), 253);
    }

    #[test]
    fn query_names_reverse_octets_and_nibbles() {
        let z = Zone::parse("bl.test").unwrap();
        assert_eq!(
            query_name("192.0.2.1".parse().unwrap(), &z),
            "1.2.0.192.bl.test."
        );
        assert_eq!(
            query_name("2001:db8::1".parse().unwrap(), &z),
            "1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.8.b.d.0.1.0.0.2.bl.test."
        );
        // RFC 5782's own example.
        assert_eq!(
            query_name("2001:db8:1:2:3:4:567:89ab".parse().unwrap(), &z),
            "b.a.9.8.7.6.5.0.4.0.0.0.3.0.0.0.2.0.0.0.1.0.0.0.8.b.d.0.1.0.0.2.bl.test."
        );
        // An IPv4-mapped address is listed (and queried) as IPv4.
        assert_eq!(
            query_name("::ffff:192.0.2.1".parse().unwrap(), &z),
            "1.2.0.192.bl.test."
        );
    }
}
