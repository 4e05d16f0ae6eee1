//! Which network addresses a URL image may be fetched from (finding M12).
//!
//! Guarantees: [`forbidden`] refuses every address of the shared deny list
//! ([`crate::denylist`], the one the guests and the host filter apply too), which reaches the
//! operator's own network or host: unspecified, loopback, private (RFC 1918, ULA), link-local, CGNAT (100.64/10),
//! multicast, broadcast and reserved ranges, the documentation ranges (192.0.2.0/24,
//! 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32, 3fff::/20), the cloud metadata addresses
//! (169.254.169.254, fd00:ec2::254, both inside refused ranges), IPv6 forms that embed an
//! IPv4 address (mapped, compatible) when the embedded address is refused, and every address
//! of the translation and tunnel ranges whose far end no one on this side controls: NAT64
//! (`64:ff9b::/96`, `64:ff9b:1::/48`), 6to4 (`2002::/16`), Teredo (`2001::/32`) and
//! IPv4-translated (`::ffff:0:0:0/96`) — refused whole, whatever they embed, since a relay or translator on the path turns them into an IPv4 destination (the
//! reason names the embedded IPv4 address when it is itself refused). [`GuardedResolver`]
//! applies it to every address a name resolves to, at connect time, so a DNS answer that
//! changes between check and use cannot slip through; IP-literal hosts never reach a
//! resolver, so callers check them with [`forbidden`] on the first URL and every redirect.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// Deadline for one DNS resolution of an image host.
// NB: a healthy resolver answers in milliseconds; 10 s covers a retry by the stub resolver
// without letting a dead one hold an import.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why `ip` must not be fetched from, or `None` when it is a public address: the first row
/// of the shared deny list ([`crate::denylist`], image scope) holding the IPv4 address
/// embedded in it, else holding `ip` itself.
pub fn forbidden(ip: IpAddr) -> Option<&'static str> {
    let images = crate::denylist::Scope::Images;
    if let IpAddr::V6(v6) = ip
        && let Some(r) = embedded_v4(v6).and_then(|v4| crate::denylist::lookup(v4.into(), images))
    {
        return Some(r.why);
    }
    crate::denylist::lookup(ip, images).map(|r| r.why)
}

/// The IPv4 address inside an IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`),
/// IPv4-translated (`::ffff:0:a.b.c.d`), NAT64 (`64:ff9b::a.b.c.d`, and `64:ff9b:1::/48` in
/// its /96 form), 6to4 (`2002:AABB:CCDD::`) or Teredo (`2001:0:SERVER::` with the client's
/// address inverted in the last 32 bits) address.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    let s = ip.segments();
    let pair = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    let [a, b, c, d, e, f, g, h] = s;
    match (a, b, c, d, e, f) {
        (0, 0, 0, 0, 0, 0) if g != 0 || h > 1 => Some(pair(g, h)),
        (0, 0, 0, 0, 0xffff, 0) => Some(pair(g, h)),
        (0x64, 0xff9b, 0, 0, 0, 0) => Some(pair(g, h)),
        (0x64, 0xff9b, 1, _, _, _) => Some(pair(g, h)),
        (0x2002, ..) => Some(pair(b, c)),
        (0x2001, 0, ..) => Some(pair(!g, !h)),
        _ => None,
    }
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
    fn translation_tunnel_and_documentation_ranges_are_refused() {
        for (ip, why) in [
            // 6to4, Teredo, local-use NAT64, IPv4-translated: refused whole, even when the
            // IPv4 address inside is public.
            ("2002:808:808::1", "6to4"),
            ("2001:0:4136:e378:8000:63bf:f7f7:f7f7", "Teredo"),
            ("64:ff9b:1::808:808", "local-use NAT64"),
            ("64:ff9b::808:808", "NAT64"),
            ("::ffff:0:808:808", "IPv4-translated"),
            // ... and named for what they embed when that is refused.
            ("2002:a00:1::1", "private"),
            ("2002:a9fe:a9fe::", "link-local or metadata"),
            ("2001:0:4136:e378:8000:63bf:80ff:fffe", "loopback"), // client !0x80fffffe = 127.0.0.1
            ("64:ff9b:1::a00:1", "private"),
            ("::ffff:0:7f00:1", "loopback"),
            ("64:ff9b::c0a8:101", "private"),
            // Documentation.
            ("192.0.2.1", "documentation (TEST-NET-1)"),
            ("198.51.100.7", "documentation (TEST-NET-2)"),
            ("203.0.113.200", "documentation (TEST-NET-3)"),
            ("2001:db8::1", "documentation"),
            ("3fff:fff::1", "documentation"),
            ("::ffff:203.0.113.5", "documentation (TEST-NET-3)"),
            ("192.88.99.1", "6to4 relay anycast"),
        ] {
            let got = forbidden(ip.parse().unwrap());
            let got = got.unwrap_or_else(|| panic!("{ip} must be refused"));
            assert!(got.starts_with(why), "{ip}: {got}");
        }
        // Neighbours of those ranges stay public.
        for ip in [
            "2003::1",
            "2001:1::1",
            "2001:4860:4860::8888",
            "64:ff9b:2::1",
            "4000::1",
            "192.0.3.1",
            "203.0.114.1",
            "2001:db9::1",
        ] {
            assert!(forbidden(ip.parse().unwrap()).is_none(), "{ip} is public");
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
