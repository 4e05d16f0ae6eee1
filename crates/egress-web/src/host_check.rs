//! The `Host` check of every listener (DNS rebinding).
//!
//! A web page on another site can make a browser send requests to the status endpoint by
//! pointing a DNS name it controls at the endpoint's address (`rebind.example` → 127.0.0.1):
//! the browser then treats the answers as the attacker's site's own and hands them to its
//! script. Such a request carries the attacker's name in its `Host` header. So a request is
//! answered only when its `Host` is an IP address literal (no DNS name is involved, so nothing
//! can be rebound), `localhost`, or a name the operator listed ([`HostCheck::new`]); any other
//! is refused with 421 Misdirected Request before any route runs.
//!
//! Guarantees: the check is on the header as sent (a port, an IPv6 literal in brackets and a
//! trailing dot are understood; names compare case-insensitively); a request without `Host`
//! (HTTP/1.0; browsers always send one) is answered; a `Host` that is not valid text, or has
//! an empty or malformed name, is refused.

use std::net::{IpAddr, Ipv6Addr};

/// Which `Host` headers a listener answers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostCheck {
    /// Extra names (lowercase, without a trailing dot).
    names: Vec<String>,
}

impl HostCheck {
    /// IP literals and `localhost`, plus `names` (e.g. the Service name a cluster reaches a
    /// listener by); names are compared case-insensitively, a trailing dot ignored.
    pub fn new<I, S>(names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self {
            names: names
                .into_iter()
                .map(|n| normalise(n.as_ref()))
                .filter(|n| !n.is_empty())
                .collect(),
        }
    }

    /// Whether a request whose `Host` header is `host` (`None`: no header) is answered.
    pub fn allows(&self, host: Option<&[u8]>) -> bool {
        let Some(raw) = host else {
            return true;
        };
        let Ok(text) = std::str::from_utf8(raw) else {
            return false;
        };
        let Some(name) = host_part(text.trim()) else {
            return false;
        };
        if let Some(v6) = name.strip_prefix('[').and_then(|n| n.strip_suffix(']')) {
            return v6.parse::<Ipv6Addr>().is_ok();
        }
        if name.parse::<IpAddr>().is_ok() {
            return true;
        }
        let name = normalise(name);
        !name.is_empty() && (name == "localhost" || self.names.contains(&name))
    }
}

/// `host[:port]` → `host` (an IPv6 literal keeps its brackets); `None` when the port is not
/// a number or the name is empty.
fn host_part(text: &str) -> Option<&str> {
    let (name, port) = if text.starts_with('[') {
        let end = text.find(']')?;
        let (name, rest) = text.split_at(end + 1);
        (name, rest.strip_prefix(':'))
    } else {
        match text.rsplit_once(':') {
            Some((n, p)) => (n, Some(p)),
            None => (text, None),
        }
    };
    if port.is_some_and(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit())) {
        return None;
    }
    (!name.is_empty()).then_some(name)
}

fn normalise(name: &str) -> String {
    name.trim().trim_end_matches('.').to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_literals_localhost_and_listed_names_pass_other_names_do_not() {
        let c = HostCheck::new(["egress-proxies-status.ops.svc", "Status.Example."]);
        for ok in [
            "127.0.0.1",
            "127.0.0.1:8080",
            "10.1.2.3:9090",
            "[::1]:8080",
            "[::1]",
            "localhost",
            "LOCALHOST:8080",
            "localhost.:8080",
            "egress-proxies-status.ops.svc:8081",
            "status.example",
        ] {
            assert!(c.allows(Some(ok.as_bytes())), "{ok}");
        }
        for bad in [
            "rebind.example",
            "rebind.example:8080",
            "127.0.0.1.rebind.example",
            "localhost.rebind.example",
            "egress-proxies-status",
            "",
            ":8080",
            "127.0.0.1:80x",
            "[::1",
            "[rebind.example]:80",
            "localhost:",
        ] {
            assert!(!c.allows(Some(bad.as_bytes())), "{bad}");
        }
        assert!(!c.allows(Some(b"\xff\xfe")));
        assert!(c.allows(None), "HTTP/1.0 without Host");
        assert!(!HostCheck::default().allows(Some(b"status.example")));
    }
}
