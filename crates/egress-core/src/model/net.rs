//! Address and name syntax shared by the model's checks and the policies built from them:
//! DNS subdomains, CIDRs, and prefix containment.
//!
//! Guarantees: pure; every parser refuses rather than guesses (a CIDR's length is checked
//! against its family and written without leading zeros).

use std::net::IpAddr;

/// Whether `s` is a DNS subdomain (RFC 1123) as Kubernetes object names must be: 1 to 253
/// characters, dot-separated labels of lowercase letters, digits and `-`, each starting and
/// ending with a letter or digit. A `credentialsRef` must be one before it names a Secret in
/// an API path.
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b.len() <= 63
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b.first().is_some_and(u8::is_ascii_alphanumeric)
                && b.last().is_some_and(u8::is_ascii_alphanumeric)
        })
}

/// Whether `s` is a DNS label (RFC 1123) as Kubernetes namespace names are: 1 to 63 of
/// lowercase letters, digits and `-`, starting and ending with a letter or digit.
pub fn is_dns_label(s: &str) -> bool {
    s.len() <= 63 && !s.contains('.') && is_dns_subdomain(s)
}

/// Parses `addr/len` with the length within the address family's bounds.
pub fn parse_cidr(s: &str) -> Option<(IpAddr, u8)> {
    let (a, l) = s.split_once('/')?;
    let ip: IpAddr = a.parse().ok()?;
    let len: u8 = l.parse().ok()?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    (len <= max && l == len.to_string()).then_some((ip, len))
}

/// Parses an IP (as a host-length CIDR) or `addr/len`; `None` when it is neither.
pub fn parse_ip_or_cidr(s: &str) -> Option<(IpAddr, u8)> {
    match s.parse::<IpAddr>() {
        Ok(ip) => Some((ip, if ip.is_ipv4() { 32 } else { 128 })),
        Err(_) => parse_cidr(s),
    }
}

/// Whether `ip` is inside `net/len` (an address of another family never is).
pub fn prefix_contains(net: IpAddr, len: u8, ip: IpAddr) -> bool {
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(a)) => {
            let mask = u32::MAX
                .checked_shl(32 - u32::from(len.min(32)))
                .unwrap_or(0);
            u32::from(n) & mask == u32::from(a) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(a)) => {
            let mask = u128::MAX
                .checked_shl(128 - u32::from(len.min(128)))
                .unwrap_or(0);
            u128::from(n) & mask == u128::from(a) & mask
        }
        _ => false,
    }
}
