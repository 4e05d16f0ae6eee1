//! Where a client wants to go: `host:port`, the host an IP address or a DNS name.
//!
//! Guarantees: a name is 1 to 253 characters of letters, digits, `-`, `_` and `.`, stored in
//! lowercase; an IPv4-mapped IPv6 address is stored as the IPv4 address it maps (so the
//! destination rules judge the address actually reached); port 0 is refused. Nothing here
//! resolves a name.

use std::fmt;
use std::net::IpAddr;

/// Longest host name accepted.
pub const MAX_NAME: usize = 253;

/// A destination host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// An IP literal.
    Ip(IpAddr),
    /// A DNS name, lowercase.
    Name(String),
}

/// A destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The host.
    pub host: Host,
    /// The TCP port (never 0).
    pub port: u16,
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ip(IpAddr::V6(a)) => write!(f, "[{a}]"),
            Self::Ip(a) => write!(f, "{a}"),
            Self::Name(n) => f.write_str(n),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// The address an IP literal names, IPv4-mapped IPv6 as IPv4.
pub fn normalize(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(a) => a.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

impl Host {
    /// Parses a host as written in a request (`example.com`, `192.0.2.1`, `[2001:db8::1]`);
    /// `None` when it is neither a valid name nor an address.
    pub fn parse(s: &str) -> Option<Self> {
        if let Some(inner) = s.strip_prefix('[') {
            let inner = inner.strip_suffix(']')?;
            return match inner.parse::<IpAddr>().ok()? {
                IpAddr::V6(a) => Some(Self::Ip(normalize(IpAddr::V6(a)))),
                IpAddr::V4(_) => None,
            };
        }
        if let Ok(IpAddr::V4(a)) = s.parse::<IpAddr>() {
            return Some(Self::Ip(IpAddr::V4(a)));
        }
        Self::name(s.as_bytes())
    }

    /// A DNS name from raw bytes (as SOCKS5 carries it); an IP literal written as a name is
    /// read as the address.
    pub fn name(b: &[u8]) -> Option<Self> {
        let s = std::str::from_utf8(b).ok()?;
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Some(Self::Ip(normalize(ip)));
        }
        let ok = !b.is_empty()
            && b.len() <= MAX_NAME
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
            && !b.starts_with(b".")
            && !b.contains(&b' ');
        ok.then(|| Self::Name(s.to_ascii_lowercase()))
    }
}

impl Target {
    /// Parses `host:port` (`[v6]:port` for IPv6), as a CONNECT request names it.
    pub fn parse_authority(s: &str) -> Option<Self> {
        let (host, port) = s.rsplit_once(':')?;
        if host.contains(':') && !host.starts_with('[') {
            return None;
        }
        let port = parse_port(port)?;
        Some(Self {
            host: Host::parse(host)?,
            port,
        })
    }
}

/// A decimal port 1–65535 without sign or leading `+`.
pub fn parse_port(s: &str) -> Option<u16> {
    if s.is_empty() || s.len() > 5 || !s.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    s.parse::<u16>().ok().filter(|p| *p != 0)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn authorities_parse_names_addresses_and_bracketed_ipv6() {
        let t = Target::parse_authority("Example.COM:443").unwrap();
        assert_eq!(t.to_string(), "example.com:443");
        let t = Target::parse_authority("[2001:db8::1]:8080").unwrap();
        assert_eq!(t.to_string(), "[2001:db8::1]:8080");
        let t = Target::parse_authority("[::ffff:192.0.2.1]:80").unwrap();
        assert_eq!(t.host, Host::Ip("192.0.2.1".parse().unwrap()));
        assert_eq!(
            Target::parse_authority("192.0.2.1:22").unwrap().to_string(),
            "192.0.2.1:22"
        );
        for bad in [
            "example.com",
            "example.com:0",
            "example.com:65536",
            "example.com:+80",
            ":80",
            "2001:db8::1:80",
            "[192.0.2.1]:80",
            "exa mple.com:80",
            "a/b:80",
            ".x:80",
        ] {
            assert!(Target::parse_authority(bad).is_none(), "{bad}");
        }
        let long = format!("{}:80", "a".repeat(254));
        assert!(Target::parse_authority(&long).is_none());
    }
}
