//! The rules of an entry's `policy:` (who may use its proxies and where they may connect).

use egress_provider::libvirt::config::ProxyPolicy;

use super::Report;
use crate::client_span::{CEILING_SPAN_V4, CEILING_SPAN_V6, FLOOR_SPAN_V6};
use crate::controller::userdata::MAX_PASSWORD;
use crate::model::destinations::check_list;
use crate::proxy_policy::Net;

/// Shortest `minPasswordLength` an admin may set.
// NB: below 8 characters a credentials-only proxy, reachable by anyone, falls to online
// guessing; the default (16) is stricter.
pub const MIN_MIN_PASSWORD_LENGTH: u32 = 8;

/// Checks `policy` at `path` (`providers[i].policy`): prefix minimums within their family
/// (1–32, 1–128), a password minimum of [`MIN_MIN_PASSWORD_LENGTH`] to the longest password
/// accepted, well-formed allowlists and internal CIDRs.
pub(super) fn policy(r: &mut Report, path: &str, p: &ProxyPolicy) {
    if !(1..=32).contains(&p.min_client_prefix_v4) {
        r.err(
            &format!("{path}.minClientPrefixV4"),
            format!(
                "{} is not an IPv4 prefix length from 1 to 32 (/0 would admit every client)",
                p.min_client_prefix_v4
            ),
        );
    }
    if !(1..=128).contains(&p.min_client_prefix_v6) {
        r.err(
            &format!("{path}.minClientPrefixV6"),
            format!(
                "{} is not an IPv6 prefix length from 1 to 128 (/0 would admit every client)",
                p.min_client_prefix_v6
            ),
        );
    }
    if !(CEILING_SPAN_V4..=32).contains(&p.max_client_span_v4) {
        r.err(
            &format!("{path}.maxClientSpanV4"),
            format!(
                "{} is outside {CEILING_SPAN_V4}..=32: a Proxy's client networks may admit at \
                 most as many IPv4 addresses as one /{CEILING_SPAN_V4} together (the Proxy \
                 resource enforces that ceiling for every namespace)",
                p.max_client_span_v4
            ),
        );
    }
    if !(CEILING_SPAN_V6..=FLOOR_SPAN_V6).contains(&p.max_client_span_v6) {
        r.err(
            &format!("{path}.maxClientSpanV6"),
            format!(
                "{} is outside {CEILING_SPAN_V6}..={FLOOR_SPAN_V6}: IPv6 client networks are \
                 counted in /64s, at most as many as one /{CEILING_SPAN_V6} together",
                p.max_client_span_v6
            ),
        );
    }
    let max = u32::try_from(MAX_PASSWORD).unwrap_or(u32::MAX);
    if !(MIN_MIN_PASSWORD_LENGTH..=max).contains(&p.min_password_length) {
        r.err(
            &format!("{path}.minPasswordLength"),
            format!(
                "{} is outside {MIN_MIN_PASSWORD_LENGTH}..={max}",
                p.min_password_length
            ),
        );
    }
    let d = &p.allowed_destinations;
    for (field, message) in check_list(
        &format!("{path}.allowedDestinations"),
        &d.domains,
        &d.cidrs,
        &d.ports,
    ) {
        r.err(&field, message);
    }
    for (i, c) in p.allowed_internal_cidrs.iter().enumerate() {
        let field = format!("{path}.allowedInternalCidrs[{i}]");
        match Net::parse(c) {
            None => r.err(
                &field,
                format!("{c:?} is not a CIDR (e.g. 10.5.0.0/16 or fd00:1::/64)"),
            ),
            Some(n) if n.len == 0 => r.warn(
                &field,
                format!(
                    "{c:?} lets the proxies reach every internal network, the host's LAN and \
                     cloud metadata included"
                ),
            ),
            Some(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use crate::config::{ProviderEntry, parse};

    const BASE: &str = "providers:
  - name: home
    type: libvirt
    hosts:
      - name: h1
        address: local
";

    #[test]
    fn the_policy_defaults_to_slash_8_slash_32_and_16_characters() {
        let cfg = parse(BASE, "test.yaml").unwrap();
        let ProviderEntry::Libvirt(e) = &cfg.providers[0];
        assert_eq!(e.policy.min_client_prefix_v4, 8);
        assert_eq!(e.policy.min_client_prefix_v6, 32);
        assert_eq!(e.policy.min_password_length, 16);
        assert_eq!(
            (e.policy.max_client_span_v4, e.policy.max_client_span_v6),
            (8, 32)
        );
        assert!(e.policy.allowed_destinations.domains.is_empty());
        assert!(e.policy.allowed_internal_cidrs.is_empty());
    }

    #[test]
    fn every_bad_policy_value_is_reported_with_its_field_path() {
        let text = format!(
            "{BASE}    policy:
      minClientPrefixV4: 0
      minClientPrefixV6: 129
      maxClientSpanV4: 4
      maxClientSpanV6: 65
      minPasswordLength: 4
      allowedDestinations:
        domains: [example.com, 'Bad Domain']
        cidrs: [10.0.0.0/33]
        ports: [443, 0]
      allowedInternalCidrs: [10.5.0.0/16, nonsense]
"
        );
        let errs = parse(&text, "test.yaml").unwrap_err();
        let paths: Vec<&str> = errs.errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "providers[0].policy.minClientPrefixV4",
                "providers[0].policy.minClientPrefixV6",
                "providers[0].policy.maxClientSpanV4",
                "providers[0].policy.maxClientSpanV6",
                "providers[0].policy.minPasswordLength",
                "providers[0].policy.allowedDestinations.domains[1]",
                "providers[0].policy.allowedDestinations.cidrs[0]",
                "providers[0].policy.allowedDestinations.ports[1]",
                "providers[0].policy.allowedInternalCidrs[1]",
            ],
            "{errs}"
        );
    }

    #[test]
    fn access_names_are_namespace_names_and_an_open_entry_with_features_warns() {
        let text = format!(
            "{BASE}    urlImages:\n      enabled: true\n      allowedHosts: [img.example]\n"
        );
        let cfg = parse(&text, "test.yaml").unwrap();
        let w: Vec<&str> = cfg.warnings.iter().map(|w| w.path.as_str()).collect();
        assert!(w.contains(&"providers[0].access"), "{w:?}");
        assert!(
            cfg.warnings
                .iter()
                .any(|w| w.message.contains("URL images"))
        );
        let text = format!(
            "{text}    access:\n      namespaces: [team-a, 'Bad_NS']\n      urlImages:\n        \
             namespaceSelector:\n          matchLabels: {{}}\n"
        );
        let errs = parse(&text, "test.yaml").unwrap_err();
        let paths: Vec<&str> = errs.errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "providers[0].access.namespaces[1]",
                "providers[0].access.urlImages.namespaceSelector.matchLabels"
            ],
            "{errs}"
        );
        assert!(
            !errs
                .warnings
                .iter()
                .any(|w| w.path == "providers[0].access"),
            "granted: no warning"
        );
    }

    #[test]
    fn lifting_every_internal_network_is_a_warning() {
        let text = format!("{BASE}    policy:\n      allowedInternalCidrs: [0.0.0.0/0]\n");
        let cfg = parse(&text, "test.yaml").unwrap();
        assert_eq!(
            cfg.warnings[0].path,
            "providers[0].policy.allowedInternalCidrs[0]"
        );
    }
}
