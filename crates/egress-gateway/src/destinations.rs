//! The destinations a pool's gateway refuses before it tries any member: the pool's own
//! allowlist (`allowedDestinations` of its template: domains, CIDRs, ports) and, for IP
//! literals, the internal networks the provider entry does not lift.
//!
//! Guarantees: the same reading as the members' proxies (each non-empty list must match;
//! a client asking for an IP address matches no domain; CIDRs judge IP literals only, since
//! the gateway never resolves names — the member resolves and enforces again); an
//! IPv4-mapped address is judged as its IPv4 address. This is an early, clear refusal, not
//! the enforcement: the members' own policy and their hosts' filters stay the authority.

use std::net::IpAddr;

use crate::target::{Host, Target};

/// A network: address and prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Net {
    addr: IpAddr,
    len: u8,
}

impl Net {
    /// Parses `addr/len` (or a bare address as a host network); `None` otherwise.
    pub fn parse(s: &str) -> Option<Self> {
        let (a, len) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: IpAddr = a.parse().ok()?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = match len {
            Some(l) => l.parse::<u8>().ok().filter(|l| *l <= max)?,
            None => max,
        };
        Some(Self { addr, len })
    }

    /// Whether `ip` lies in this network (another family never does).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.len.min(32)))
                    .unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.len.min(128)))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

/// The destination rules of one pool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Destinations {
    /// Allowed names: `example.com` exactly or `*.example.com` (any subdomain); empty: any.
    pub domains: Vec<String>,
    /// Allowed networks for IP literals; empty: any.
    pub cidrs: Vec<Net>,
    /// Allowed ports; empty: any.
    pub ports: Vec<u16>,
    /// Networks refused for IP literals (the internal ones) ...
    pub denied: Vec<Net>,
    /// ... except these (the provider entry's `allowedInternalCidrs`).
    pub lifted: Vec<Net>,
}

/// Why a destination is refused (a sentence for the client and the log).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

fn domain_matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(suffix) => name
            .strip_suffix(suffix)
            .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
        None => pattern == name,
    }
}

impl Destinations {
    /// Whether `t` may be asked for; the refusal names the rule.
    pub fn check(&self, t: &Target) -> Result<(), Refused> {
        if !self.ports.is_empty() && !self.ports.contains(&t.port) {
            return Err(Refused(format!(
                "port {} is not among the pool's allowed destination ports",
                t.port
            )));
        }
        match &t.host {
            Host::Name(n) => {
                if !self.domains.is_empty() && !self.domains.iter().any(|d| domain_matches(d, n)) {
                    return Err(Refused(format!(
                        "{n} is not among the pool's allowed destination domains"
                    )));
                }
            }
            Host::Ip(ip) => {
                if !self.domains.is_empty() {
                    return Err(Refused(format!(
                        "{ip} is an address; the pool allows destination domains only"
                    )));
                }
                if !self.cidrs.is_empty() && !self.cidrs.iter().any(|c| c.contains(*ip)) {
                    return Err(Refused(format!(
                        "{ip} is not within the pool's allowed destination networks"
                    )));
                }
                if self.denied.iter().any(|d| d.contains(*ip))
                    && !self.lifted.iter().any(|l| l.contains(*ip))
                {
                    return Err(Refused(format!(
                        "{ip} is an internal address the pool's proxies may not reach"
                    )));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn t(s: &str) -> Target {
        Target::parse_authority(s).unwrap()
    }

    #[test]
    fn each_non_empty_list_must_match_and_internal_literals_are_refused_unless_lifted() {
        let open = Destinations::default();
        assert!(open.check(&t("10.0.0.1:80")).is_ok());
        let d = Destinations {
            domains: vec!["example.com".into(), "*.example.net".into()],
            ports: vec![443],
            ..Destinations::default()
        };
        assert!(d.check(&t("example.com:443")).is_ok());
        assert!(d.check(&t("a.example.net:443")).is_ok());
        assert!(d.check(&t("example.net:443")).is_err());
        assert!(d.check(&t("xexample.net:443")).is_err());
        assert!(d.check(&t("example.com:80")).is_err());
        assert!(d.check(&t("192.0.2.1:443")).is_err());
        let internal = Destinations {
            denied: vec![
                Net::parse("10.0.0.0/8").unwrap(),
                Net::parse("127.0.0.0/8").unwrap(),
            ],
            lifted: vec![Net::parse("127.0.0.1/32").unwrap()],
            cidrs: vec![],
            ..Destinations::default()
        };
        assert!(internal.check(&t("10.1.2.3:80")).is_err());
        assert!(internal.check(&t("[::ffff:10.1.2.3]:80")).is_err());
        assert!(internal.check(&t("127.0.0.1:80")).is_ok());
        assert!(internal.check(&t("127.0.0.2:80")).is_err());
        assert!(internal.check(&t("internal.example:80")).is_ok());
        let nets = Destinations {
            cidrs: vec![Net::parse("203.0.113.0/24").unwrap()],
            ..Destinations::default()
        };
        assert!(nets.check(&t("203.0.113.9:80")).is_ok());
        assert!(nets.check(&t("198.51.100.1:80")).is_err());
        assert!(Net::parse("10.0.0.0/33").is_none());
        assert!(Net::parse("::1").unwrap().contains("::1".parse().unwrap()));
    }
}
