//! Which network addresses a URL image may be fetched from (finding M12).
//!
//! Guarantees: [`forbidden`] refuses every address that reaches the operator's own network
//! or host: unspecified, loopback, private (RFC 1918, ULA), link-local, CGNAT (100.64/10),
//! multicast, broadcast and reserved ranges, the cloud metadata addresses (169.254.169.254,
//! fd00:ec2::254, both inside refused ranges), and IPv6 forms that embed an IPv4 address
//! (mapped, compatible, NAT64) when the embedded address is refused. [`GuardedResolver`]
//! applies it to every address a name resolves to, at connect time, so a DNS answer that
//! changes between check and use cannot slip through; IP-literal hosts never reach a
//! resolver, so callers check them with [`forbidden`] on the first URL and every redirect.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use ipnet::{Ipv4Net, Ipv6Net};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// Deadline for one DNS resolution of an image host.
// NB: a healthy resolver answers in milliseconds; 10 s covers a retry by the stub resolver
// without letting a dead one hold an import.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);

/// IPv4 ranges a URL image may never reach, with the reason shown in errors.
const V4_FORBIDDEN: &[(&str, &str)] = &[
    ("0.0.0.0/8", "unspecified"),
    ("10.0.0.0/8", "private"),
    ("100.64.0.0/10", "CGNAT"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local or metadata"),
    ("172.16.0.0/12", "private"),
    ("192.0.0.0/24", "IETF protocol assignments"),
    ("192.168.0.0/16", "private"),
    ("198.18.0.0/15", "benchmarking"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved or broadcast"),
];

/// IPv6 ranges a URL image may never reach.
const V6_FORBIDDEN: &[(&str, &str)] = &[
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    (
        "fc00::/7",
        "unique-local (private, includes the fd00:ec2::254 metadata address)",
    ),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local"),
    ("ff00::/8", "multicast"),
    ("100::/64", "discard"),
];

/// Why `ip` must not be fetched from, or `None` when it is a public address.
pub fn forbidden(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = embedded_v4(v6) {
                return forbidden_v4(v4);
            }
            V6_FORBIDDEN.iter().find_map(|(net, why)| {
                let net: Ipv6Net = net.parse().ok()?;
                net.contains(&v6).then_some(*why)
            })
        }
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> Option<&'static str> {
    V4_FORBIDDEN.iter().find_map(|(net, why)| {
        let net: Ipv4Net = net.parse().ok()?;
        net.contains(&ip).then_some(*why)
    })
}

/// The IPv4 address inside an IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`)
/// or NAT64 (`64:ff9b::a.b.c.d`) address.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    let s = ip.segments();
    let tail =
        |s: &[u16; 8]| Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    #[allow(clippy::indexing_slicing)] // NB: fixed-size array, constant indices.
    {
        if s[..6] == [0, 0, 0, 0, 0, 0] && (s[6] != 0 || s[7] > 1) {
            return Some(tail(&s));
        }
        if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
            return Some(tail(&s));
        }
    }
    None
}

/// A refusal by the address policy; found again in reqwest's error chain by type.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// A DNS resolver for reqwest that drops forbidden addresses and fails when none is left.
#[derive(Debug, Clone)]
pub struct GuardedResolver {
    allow_loopback: bool,
}

impl GuardedResolver {
    /// A resolver applying [`forbidden`]; `allow_loopback` admits 127.0.0.0/8 and ::1 only
    /// (tests serve images from a local server; not reachable from configuration).
    pub fn new(allow_loopback: bool) -> Arc<Self> {
        Arc::new(Self { allow_loopback })
    }

    /// Whether `ip` may be connected to under this resolver's policy.
    pub fn admits(&self, ip: IpAddr) -> Result<(), Refused> {
        if self.allow_loopback && ip.is_loopback() {
            return Ok(());
        }
        match forbidden(ip) {
            None => Ok(()),
            Some(why) => Err(Refused(format!(
                "address {ip} is {why}; URL images may only be fetched from public addresses"
            ))),
        }
    }
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let this = self.clone();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let found =
                tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((host.as_str(), 0)))
                    .await
                    .map_err(|_| {
                        Refused(format!(
                            "resolving {host} timed out after {RESOLVE_TIMEOUT:?}"
                        ))
                    })??;
            let mut ok: Vec<SocketAddr> = Vec::new();
            let mut last = None;
            for a in found {
                match this.admits(a.ip()) {
                    Ok(()) => ok.push(a),
                    Err(e) => last = Some(e),
                }
            }
            if ok.is_empty() {
                let why = last.map_or_else(|| "no addresses".to_owned(), |e| e.0);
                return Err(Box::new(Refused(format!("host {host} refused: {why}")))
                    as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(ok.into_iter()) as Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_loopback_link_local_cgnat_metadata_and_multicast_are_refused() {
        // finding: M12
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fd00:ec2::254",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "::10.0.0.1",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert!(forbidden(ip).is_some(), "{ip} must be refused");
        }
        for ip in [
            "93.184.216.34",
            "2606:4700::1",
            "::ffff:8.8.8.8",
            "100.128.0.1",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert!(forbidden(ip).is_none(), "{ip} is public");
        }
    }

    #[test]
    fn the_test_knob_admits_loopback_only() {
        let r = GuardedResolver::new(true);
        assert!(r.admits("127.0.0.1".parse().unwrap()).is_ok());
        assert!(r.admits("10.0.0.1".parse().unwrap()).is_err());
        assert!(
            GuardedResolver::new(false)
                .admits("127.0.0.1".parse().unwrap())
                .is_err()
        );
    }
}
