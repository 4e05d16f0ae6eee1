//! The Proxy model shared by both drivers (Kubernetes and standalone): the manifest a user
//! writes and its spec here, the status the operator reports in [`status`]. No Kubernetes types: the Kubernetes
//! driver wraps these in its custom resource; standalone mode reads the same YAML from files.
//!
//! Guarantees:
//! - A manifest that deserializes has a well-formed shape; [`ProxySpec::validate`] checks
//!   the values and names the field path at fault (`spec.proxy.port`).
//! - Status messages are redacted on the way in ([`Condition::new`] and
//!   [`ProxyStatus::set_condition`] pass every message through
//!   [`egress_provider::error::redact`] and truncate it), so status never carries credentials
//!   (finding D5) or unbounded remote strings (finding L18).

use egress_provider::error::redact;
use serde::{Deserialize, Serialize};

pub mod destinations;
mod egress;
pub mod net;
pub mod status;
pub use destinations::Destinations;
pub use egress::{EgressSpec, family};
pub use net::{is_dns_label, is_dns_subdomain, parse_cidr, parse_ip_or_cidr, prefix_contains};
pub use status::{
    Condition, ConditionStatus, HealthStatus, MAX_MESSAGE_CHARS, Phase, ProxyStatus, condition,
    truncate,
};

/// The API group/version of a Proxy manifest.
pub const API_VERSION: &str = "egress-proxies.dev/v1alpha1";
/// The kind of a Proxy manifest.
pub const KIND: &str = "Proxy";
/// Longest `spec.provider` and `spec.host` (entry and host names are identifiers of at most
/// 32 characters in the provider config).
pub const MAX_NAME_CHARS: usize = 32;
/// Longest `spec.image` (a catalogue key, or a URL with its digest fragment).
pub const MAX_IMAGE_CHARS: usize = 2048;
/// Default proxy listen port (tinyproxy/squid convention).
pub const DEFAULT_PROXY_PORT: u16 = 3128;

/// A Proxy manifest: the same YAML in a standalone directory and in Kubernetes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProxyManifest {
    /// Must be [`API_VERSION`].
    pub api_version: String,
    /// Must be [`KIND`].
    pub kind: String,
    /// Name and namespace.
    pub metadata: ObjectMeta,
    /// What the user wants.
    pub spec: ProxySpec,
}

/// The metadata a manifest carries (a subset of Kubernetes' ObjectMeta).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    /// Name, unique within the namespace.
    pub name: String,
    /// Namespace; `default` when omitted.
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// Labels (informational in standalone mode).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
}

fn default_namespace() -> String {
    "default".into()
}

/// What a Proxy asks for. (`Default` is an empty spec, which does not validate: a placeholder.)
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.proxy) && ((has(self.proxy.allowedClientCidrs) && size(self.proxy.allowedClientCidrs) > 0) || has(self.proxy.credentialsRef))",
    "message": "set proxy.allowedClientCidrs or proxy.credentialsRef: a proxy open to everyone is an open relay"
}])))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProxySpec {
    /// The provider entry (its `name` in the provider config). Immutable in Kubernetes: to
    /// move a Proxy to another entry, delete it and create a new one.
    // NB: a CEL transition rule, because re-typing a Proxy to another entry would orphan its
    // instance on the old entry's hosts (finding M2).
    #[cfg_attr(feature = "schema", schemars(length(min = 1, max = 32), extend("x-kubernetes-validations" = [{
        "rule": "self == oldSelf",
        "message": "spec.provider is immutable: delete the Proxy and create a new one"
    }])))]
    pub provider: String,
    /// Pin to one host of the entry (its name in the provider config); otherwise the operator
    /// places it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(length(min = 1, max = 32)))]
    pub host: Option<String>,
    /// The image to boot: a key of the entry's image catalogue or, when the entry allows URL
    /// images, a URL with its digest as a fragment (`https://host/image.qcow2#sha256=HEX`; the
    /// fragment is required for plain http).
    #[cfg_attr(feature = "schema", schemars(length(min = 1, max = 2048)))]
    pub image: String,
    /// Size overrides; the entry's `defaults` fill what is omitted.
    #[serde(default)]
    pub resources: Resources,
    /// The proxy software's settings.
    #[serde(default)]
    pub proxy: ProxySettings,
    /// The declared egress: the address(es) the proxy must have from its host's address pool.
    #[serde(default, skip_serializing_if = "EgressSpec::is_empty")]
    pub egress: EgressSpec,
}

/// Size overrides of a Proxy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Resources {
    /// Root disk, GiB.
    #[serde(rename = "diskGiB", default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub disk_gib: Option<u64>,
    /// Memory, MiB.
    #[serde(rename = "memoryMiB", default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub memory_mib: Option<u64>,
    /// Virtual CPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub vcpus: Option<u32>,
}

/// Proxy protocol served by the guest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum ProxyProtocol {
    /// HTTP forward proxy with CONNECT.
    #[default]
    Http,
    /// SOCKS5.
    Socks5,
}

/// Settings of the proxy software in the guest. A proxy is never an open relay: at least one
/// allowed client CIDR or a credentials reference is required ([`ProxySpec::validate`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProxySettings {
    /// The port the proxy listens on in the guest.
    #[serde(default = "default_port")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 65535)))]
    pub port: u16,
    /// `http` (an HTTP forward proxy with CONNECT) or `socks5`.
    #[serde(default)]
    pub protocol: ProxyProtocol,
    /// Client networks allowed to use the proxy (CIDR notation). Judged together by the
    /// addresses they admit: at most as many IPv4 addresses as one /8 and IPv6 networks as
    /// one /32 in total (the provider entry may allow less); IPv4-mapped (`::ffff:0:0/96`)
    /// and -compatible (`::/96`) forms count as IPv4, so an IPv6 network containing them
    /// (such as `::/32`) admits every IPv4 client and is refused.
    // NB: the span rule's CEL form (`client_span::cel_v4_rule`) is not installed: at 256
    // items its estimated cost is 32 times the API server's per-rule budget. The operator
    // applies the rule itself (spec validation in both drivers, `check`, the renderer).
    // NB: the item bound keeps the CEL rule's cost estimate within the API server's budget;
    // 256 networks is far more than an allowlist of client networks needs.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(length(max = 256), extend(
        "items" = {"type": "string", "format": "cidr", "maxLength": 64},
        "x-kubernetes-validations" = [{
            "rule": "self.all(c, isCIDR(c))",
            "message": "every allowedClientCidrs entry must be a CIDR, e.g. 10.0.0.0/8 or 2001:db8::/32"
        }]
    )))]
    pub allowed_client_cidrs: Vec<String>,
    /// Credentials clients must present. In Kubernetes: the name of a Secret in the Proxy's
    /// namespace with keys `username` and `password`; the Secret must be meant for
    /// egress-proxies: labelled `egress-proxies.dev/credentials: "true"` or of type
    /// `egress-proxies.dev/credentials` (any other Secret is not read). In standalone mode:
    /// the path of a file holding one line `username:password` (relative to the manifest
    /// directory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // NB: in a Proxy resource this is a Secret name, put into an API path: the schema admits
    // only a DNS subdomain (no `/`, so no other namespace or path), as Kubernetes names are.
    #[cfg_attr(
        feature = "schema",
        schemars(
            length(min = 1, max = 253),
            regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
        )
    )]
    pub credentials_ref: Option<String>,
    /// The egress address the world must see from this proxy: an IP (`203.0.113.7`) or a
    /// CIDR (`203.0.113.0/24`). When set, a health check that sees another address makes the
    /// proxy unhealthy with reason `EgressMismatch`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(length(min = 1, max = 64)))]
    pub expected_egress: Option<String>,
    /// Destinations this proxy may reach, narrowing the provider entry's policy. Internal
    /// destinations (private, loopback, link-local and cloud metadata, CGNAT, ULA, the
    /// host's own addresses) are refused whatever this says.
    #[serde(default, skip_serializing_if = "Destinations::is_empty")]
    pub allowed_destinations: Destinations,
}

fn default_port() -> u16 {
    DEFAULT_PROXY_PORT
}

impl Default for ProxySettings {
    fn default() -> Self {
        Self {
            port: DEFAULT_PROXY_PORT,
            protocol: ProxyProtocol::Http,
            allowed_client_cidrs: Vec::new(),
            credentials_ref: None,
            expected_egress: None,
            allowed_destinations: Destinations::default(),
        }
    }
}

/// One invalid value in a spec: the field path and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecError {
    /// Field path, e.g. `spec.proxy.allowedClientCidrs[1]`.
    pub path: String,
    /// What is wrong, naming the value.
    pub message: String,
}

impl std::fmt::Display for SpecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

impl ProxySpec {
    /// Checks the values a shape check cannot: every error at once, each with its path.
    /// Provider-specific checks (does the entry exist, is the image in its catalogue, sizes
    /// within its limits) belong to the reconciler, which knows the config.
    pub fn validate(&self) -> Vec<SpecError> {
        let mut errs = Vec::new();
        let mut err = |path: String, message: String| {
            errs.push(SpecError {
                path,
                message: truncate(&redact(&message), MAX_MESSAGE_CHARS),
            })
        };
        if self.provider.trim().is_empty() {
            err("spec.provider".into(), "must name a provider entry".into());
        }
        // The same bounds as the Proxy resource's schema (entry and host names are at most
        // 32 characters; an image URL at most 2048).
        for (path, value, max) in [
            (
                "spec.provider",
                Some(self.provider.as_str()),
                MAX_NAME_CHARS,
            ),
            ("spec.host", self.host.as_deref(), MAX_NAME_CHARS),
            ("spec.image", Some(self.image.as_str()), MAX_IMAGE_CHARS),
        ] {
            if let Some(v) = value
                && v.chars().count() > max
            {
                err(
                    path.into(),
                    format!(
                        "{} characters; at most {max} are allowed",
                        v.chars().count()
                    ),
                );
            }
        }
        if self.image.trim().is_empty() {
            err("spec.image".into(), "must name an image".into());
        }
        if let Some(h) = &self.host
            && h.trim().is_empty()
        {
            err("spec.host".into(), "must not be empty when given".into());
        }
        if self.proxy.port == 0 {
            err("spec.proxy.port".into(), "0 is not a usable port".into());
        }
        if self.resources.disk_gib == Some(0) {
            err("spec.resources.diskGiB".into(), "must be at least 1".into());
        }
        if self.resources.memory_mib == Some(0) {
            err(
                "spec.resources.memoryMiB".into(),
                "must be at least 1".into(),
            );
        }
        if self.resources.vcpus == Some(0) {
            err("spec.resources.vcpus".into(), "must be at least 1".into());
        }
        // The whole list, judged by what it admits, within the widest caps any entry may
        // set (the provider entry's own caps are applied when the Proxy is rendered).
        if let Err(e) = crate::client_span::check(
            "spec.proxy.allowedClientCidrs",
            &self.proxy.allowed_client_cidrs,
            crate::client_span::CEILING_SPAN_V4,
            crate::client_span::CEILING_SPAN_V6,
        ) {
            for (path, message) in e {
                err(path, message);
            }
        }
        for (path, message) in destinations::check_list(
            "spec.proxy.allowedDestinations",
            &self.proxy.allowed_destinations.domains,
            &self.proxy.allowed_destinations.cidrs,
            &self.proxy.allowed_destinations.ports,
        ) {
            err(path, message);
        }
        if let Some(e) = &self.proxy.expected_egress
            && parse_ip_or_cidr(e).is_none()
        {
            err(
                "spec.proxy.expectedEgress".into(),
                format!("{e:?} is not an IP or a CIDR (e.g. 203.0.113.7 or 203.0.113.0/24)"),
            );
        }
        for (path, message) in self.egress.validate(self.proxy.expected_egress.as_deref()) {
            err(path, message);
        }
        if self.proxy.allowed_client_cidrs.is_empty() && self.proxy.credentials_ref.is_none() {
            err(
                "spec.proxy".into(),
                "set allowedClientCidrs or credentialsRef: a proxy open to everyone is an open \
                 relay"
                    .into(),
            );
        }
        errs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> ProxySpec {
        ProxySpec {
            provider: "home".into(),
            host: None,
            image: "debian-12".into(),
            resources: Resources::default(),
            proxy: ProxySettings {
                allowed_client_cidrs: vec!["10.0.0.0/8".into()],
                ..ProxySettings::default()
            },
            egress: EgressSpec::default(),
        }
    }

    #[test]
    fn a_secret_name_must_be_a_dns_subdomain_so_it_cannot_reach_another_namespace() {
        for ok in ["creds", "proxy-users", "a.b-c.d0", &"a".repeat(63)] {
            assert!(is_dns_subdomain(ok), "{ok}");
        }
        for bad in [
            "",
            "kube-system/admin",
            "../secrets",
            "Creds",
            "-x",
            "x-",
            "a..b",
            "a_b",
            &"a".repeat(64),
            &["a"; 128].join("."),
        ] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
    }

    #[test]
    fn a_manifest_parses_with_defaults() {
        let y = "apiVersion: egress-proxies.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: p1\n\
                 spec:\n  provider: home\n  image: debian-12\n  proxy:\n    allowedClientCidrs: [10.0.0.0/8]\n";
        let m: ProxyManifest = serde_saphyr::from_str(y).unwrap();
        assert_eq!(m.metadata.namespace, "default");
        assert_eq!(m.spec.proxy.port, DEFAULT_PROXY_PORT);
        assert!(m.spec.validate().is_empty());
    }

    #[test]
    fn no_client_cidrs_without_credentials_and_bad_values_are_refused_with_their_paths() {
        let mut s = spec();
        s.proxy.allowed_client_cidrs = vec!["10.0.0.0/8".into(), "10.0.0.0/33".into()];
        s.proxy.port = 0;
        s.resources.vcpus = Some(0);
        let paths: Vec<String> = s.validate().into_iter().map(|e| e.path).collect();
        assert_eq!(
            paths,
            [
                "spec.proxy.port",
                "spec.resources.vcpus",
                "spec.proxy.allowedClientCidrs[1]"
            ]
        );
        // Neither a client list nor credentials: open to everyone, refused at `spec.proxy`.
        let mut open = spec();
        open.proxy.allowed_client_cidrs.clear();
        let errs = open.validate();
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].path, "spec.proxy");
        assert!(
            errs[0].message.contains("open relay"),
            "{}",
            errs[0].message
        );
        // Credentials alone restrict it: no client list is then fine.
        open.proxy.credentials_ref = Some("proxy-users".into());
        assert!(open.validate().is_empty(), "{:?}", open.validate());
    }

    #[test]
    fn client_networks_admitting_every_ipv4_client_are_refused_whatever_their_prefixes() {
        // `::/32` passes a prefix check, yet holds ::ffff:0:0/96: every IPv4 client.
        for cidrs in [
            vec!["::/32".to_owned()],
            (0..=255).map(|a| format!("{a}.0.0.0/8")).collect(),
        ] {
            for creds in [None, Some("users".to_owned())] {
                let mut s = spec();
                s.proxy.allowed_client_cidrs = cidrs.clone();
                s.proxy.credentials_ref = creds.clone();
                let errs = s.validate();
                assert_eq!(errs.len(), 1, "{errs:?}");
                assert_eq!(errs[0].path, "spec.proxy.allowedClientCidrs");
                assert!(errs[0].message.contains("IPv4"), "{}", errs[0]);
            }
        }
    }

    #[test]
    fn expected_egress_accepts_an_ip_or_a_cidr_and_names_its_path_otherwise() {
        let mut s = spec();
        for ok in [
            "203.0.113.7",
            "203.0.113.0/24",
            "2001:db8::1",
            "2001:db8::/32",
        ] {
            s.proxy.expected_egress = Some(ok.into());
            assert!(s.validate().is_empty(), "{ok}");
        }
        s.proxy.expected_egress = Some("203.0.113.0/33".into());
        assert_eq!(s.validate()[0].path, "spec.proxy.expectedEgress");
        let y = "provider: home\nimage: debian-12\nproxy:\n  allowedClientCidrs: [10.0.0.0/8]\n  \
                 expectedEgress: 203.0.113.7\n";
        let parsed: ProxySpec = serde_saphyr::from_str(y).unwrap();
        assert_eq!(parsed.proxy.expected_egress.as_deref(), Some("203.0.113.7"));
    }

    #[test]
    fn a_client_network_of_every_address_and_bad_destinations_are_refused_with_their_paths() {
        let mut s = spec();
        s.proxy.allowed_client_cidrs = vec!["10.0.0.0/8".into(), "0.0.0.0/0".into(), "::/0".into()];
        s.proxy.allowed_destinations = Destinations {
            domains: vec!["*.example.com".into(), "http://x".into()],
            cidrs: vec!["203.0.113.0/24".into(), "x".into()],
            ports: vec![0],
        };
        let paths: Vec<String> = s.validate().into_iter().map(|e| e.path).collect();
        assert_eq!(
            paths,
            [
                "spec.proxy.allowedClientCidrs[1]",
                "spec.proxy.allowedClientCidrs[2]",
                "spec.proxy.allowedDestinations.domains[1]",
                "spec.proxy.allowedDestinations.cidrs[1]",
                "spec.proxy.allowedDestinations.ports[0]",
            ]
        );
        let y = "provider: home\nimage: debian-12\nproxy:\n  allowedClientCidrs: [10.0.0.0/8]\n  \
                 allowedDestinations:\n    domains: ['*.example.com']\n    ports: [443]\n";
        let parsed: ProxySpec = serde_saphyr::from_str(y).unwrap();
        assert_eq!(parsed.proxy.allowed_destinations.ports, [443]);
        assert!(parsed.validate().is_empty());
    }

    #[test]
    fn condition_messages_are_redacted_and_bounded() {
        // finding: D5, L18
        let long = format!(
            "fetch https://user:pw@example.com/x failed {}",
            "x".repeat(5000)
        );
        let c = Condition::new("Ready", ConditionStatus::False, "E", &long, "t", 1);
        assert!(!c.message.contains("pw@"), "{}", &c.message[..80]);
        assert!(c.message.chars().count() <= MAX_MESSAGE_CHARS);
    }

    #[test]
    fn setting_a_condition_keeps_the_transition_time_while_its_status_holds() {
        let mut st = ProxyStatus::default();
        st.set_condition(Condition::new(
            "Ready",
            ConditionStatus::False,
            "A",
            "a",
            "t1",
            1,
        ));
        st.set_condition(Condition::new(
            "Ready",
            ConditionStatus::False,
            "B",
            "b",
            "t2",
            1,
        ));
        assert_eq!(st.condition("Ready").unwrap().last_transition_time, "t1");
        assert_eq!(st.condition("Ready").unwrap().reason, "B");
        st.set_condition(Condition::new(
            "Ready",
            ConditionStatus::True,
            "C",
            "c",
            "t3",
            1,
        ));
        assert_eq!(st.condition("Ready").unwrap().last_transition_time, "t3");
    }
}
