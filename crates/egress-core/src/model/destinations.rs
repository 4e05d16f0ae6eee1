//! An allowlist of destinations (a Proxy's `spec.proxy.allowedDestinations`, an entry's
//! `policy.allowedDestinations`) and its shape check. What a guest enforces from two of
//! them is [`crate::proxy_policy`]'s.
//!
//! Guarantees: pure; the check reports every violation at once, each with its field path.

use serde::{Deserialize, Serialize};

use super::net::parse_cidr;

/// Most entries in each destination list (domains, CIDRs, ports).
// NB: bounds the rendered configs and firewall sets; an allowlist longer than this is a
// job for an upstream filtering proxy.
pub const MAX_DESTINATIONS: usize = 64;

/// An allowlist of destinations. Each non-empty list must match: `domains` the name a
/// client asks for (`example.com` exactly, `*.example.com` any subdomain; a client asking
/// for an IP address then matches none), `cidrs` the address the proxy connects to after
/// resolving, `ports` the destination port. Empty lists restrict nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Destinations {
    /// Domains: `example.com` (exactly) or `*.example.com` (any subdomain), lowercase.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "schema", schemars(length(max = 64), extend(
        "items" = {"type": "string", "maxLength": 253}
    )))]
    pub domains: Vec<String>,
    /// Networks (CIDR notation) of the addresses the proxy connects to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "schema", schemars(length(max = 64), extend(
        "items" = {"type": "string", "maxLength": 64}
    )))]
    pub cidrs: Vec<String>,
    /// Destination TCP ports.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "schema", schemars(length(max = 64), extend(
        "items" = {"type": "integer", "minimum": 1, "maximum": 65535}
    )))]
    pub ports: Vec<u16>,
}

impl Destinations {
    /// Whether no list is set (nothing restricted).
    pub fn is_empty(&self) -> bool {
        self.domains.is_empty() && self.cidrs.is_empty() && self.ports.is_empty()
    }
}

/// Whether `s` is a destination domain pattern: a lowercase DNS name of at least two labels
/// (`example.com`), optionally prefixed by `*.` (any subdomain of it, not the name itself).
pub fn is_domain_pattern(s: &str) -> bool {
    let name = s.strip_prefix("*.").unwrap_or(s);
    name.len() <= 253
        && name.contains('.')
        && name.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b.len() <= 63
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b.first().is_some_and(u8::is_ascii_alphanumeric)
                && b.last().is_some_and(u8::is_ascii_alphanumeric)
        })
        // An all-numeric last label would make the pattern look like an IP address.
        && name
            .rsplit('.')
            .next()
            .is_some_and(|tld| tld.bytes().any(|c| c.is_ascii_lowercase()))
}

/// Checks one allowlist's shape; `path` names it (e.g. `spec.proxy.allowedDestinations`).
/// Returns `(field path, message)` pairs, every violation at once.
pub fn check_list(
    path: &str,
    domains: &[String],
    cidrs: &[String],
    ports: &[u16],
) -> Vec<(String, String)> {
    let mut errs = Vec::new();
    for (field, n) in [
        ("domains", domains.len()),
        ("cidrs", cidrs.len()),
        ("ports", ports.len()),
    ] {
        if n > MAX_DESTINATIONS {
            errs.push((
                format!("{path}.{field}"),
                format!("{n} entries; at most {MAX_DESTINATIONS} are allowed"),
            ));
        }
    }
    for (i, d) in domains.iter().enumerate() {
        if !is_domain_pattern(d) {
            errs.push((
                format!("{path}.domains[{i}]"),
                format!(
                    "{d:?} is not a domain: use a lowercase name (example.com) or *.example.com"
                ),
            ));
        }
    }
    for (i, c) in cidrs.iter().enumerate() {
        if parse_cidr(c).is_none() {
            errs.push((
                format!("{path}.cidrs[{i}]"),
                format!("{c:?} is not a CIDR (e.g. 203.0.113.0/24 or 2001:db8::/32)"),
            ));
        }
    }
    for (i, p) in ports.iter().enumerate() {
        if *p == 0 {
            errs.push((format!("{path}.ports[{i}]"), "0 is not a port".into()));
        }
    }
    errs
}
