//! The custom resources of egress-proxies, generated from Rust types: [`Proxy`] (namespaced,
//! what users create), [`ProxyPool`] (namespaced, fleets of member Proxies; `pool.rs`) and
//! [`ProviderHealth`] (cluster-scoped, one per provider entry, written by the operator).
//!
//! Guarantees:
//! - **One model, two drivers**: a Proxy's spec and status are the core's
//!   [`egress_core::model::ProxySpec`] and [`egress_core::model::ProxyStatus`], so a
//!   Proxy's YAML is the same in Kubernetes and in a standalone manifest directory.
//! - **The API server refuses what the core would**: the schema carries the bounds (port
//!   1–65535, sizes ≥ 1, non-empty names), `format: cidr` plus a CEL `isCIDR` rule on the
//!   allowed client networks, a CEL rule refusing an open relay, and a CEL transition rule
//!   making `spec.provider` immutable (re-typing a Proxy to another entry would orphan its
//!   instance: finding M2); `credentialsRef` must be a DNS subdomain (a Secret name, never
//!   a path or another namespace's).
//! - **Deterministic CRDs**: [`crds_yaml`] renders every CRD the same way every time; the
//!   committed `deploy/crds/*.yaml` are its output, and a test fails when they drift.

use egress_core::model::{Condition, ProxySpec, ProxyStatus};
use egress_provider::model::{HostReport, HostState};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

mod pool;
pub use pool::{ProxyPool, ProxyPoolCrdSpec};

/// The API group of every resource.
pub const GROUP: &str = "egress-proxies.dev";
/// The API version of every resource.
pub const VERSION: &str = "v1alpha1";
/// The condition type a [`ProviderHealth`] reports: True when every host is Ready.
pub const CONDITION_READY: &str = "Ready";
/// The label (value `"true"`) a Secret carries to be usable as a Proxy's `credentialsRef`.
/// A Secret without it (or [`CREDENTIALS_SECRET_TYPE`]) is never read for credentials, so a
/// Proxy author cannot point the operator at a Secret that was not meant for it.
pub const CREDENTIALS_LABEL: &str = "egress-proxies.dev/credentials";
/// The Secret `type` that, like [`CREDENTIALS_LABEL`], marks a Secret as credentials for
/// egress-proxies.
pub const CREDENTIALS_SECRET_TYPE: &str = "egress-proxies.dev/credentials";
/// Longest remote string kept in a [`ProviderHostStatus`] field (finding L18).
// NB: the same bound as a Proxy condition's message: enough for a classified provider error
// naming a host and a setting; 100 hosts × 4 strings stays far below etcd's object limit.
pub const MAX_HOST_STRING_CHARS: usize = egress_core::model::MAX_MESSAGE_CHARS;

/// What the Proxy asks for: the same fields as the `spec` of a standalone Proxy manifest.
// NB: a newtype because the CustomResource derive must sit on a type of this crate; it is the
// core's `ProxySpec`, unchanged on the wire (`#[serde(transparent)]`).
// NB: clippy reads the repeated `printcolumn(name = .., type_ = ..)` keys as duplicated
// attributes; they are one column each.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
#[kube(
    group = "egress-proxies.dev",
    version = "v1alpha1",
    kind = "Proxy",
    plural = "proxies",
    namespaced,
    status = "ProxyStatus",
    shortname = "eproxy",
    category = "egress-proxies",
    derive = "PartialEq",
    doc = "An egress proxy: a small VM on a libvirt host, placed, booted, health-checked and replaced by the operator.",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Host", type_ = "string", json_path = ".status.host"),
    printcolumn(name = "IP", type_ = "string", json_path = ".status.ip"),
    printcolumn(name = "Egress", type_ = "string", json_path = ".status.egressAddress"),
    printcolumn(
        name = "Healthy",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Healthy\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
pub struct ProxyCrdSpec(pub ProxySpec);

impl std::ops::Deref for ProxyCrdSpec {
    type Target = ProxySpec;
    fn deref(&self) -> &ProxySpec {
        &self.0
    }
}

impl From<ProxySpec> for ProxyCrdSpec {
    fn from(s: ProxySpec) -> Self {
        Self(s)
    }
}

/// Which provider entry this ProviderHealth reports on. The operator creates one per entry of
/// its provider config, named after the entry.
// NB: clippy reads the repeated `printcolumn(name = .., type_ = ..)` keys as duplicated
// attributes; they are one column each.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[kube(
    group = "egress-proxies.dev",
    version = "v1alpha1",
    kind = "ProviderHealth",
    plural = "providerhealths",
    status = "ProviderHealthStatus",
    shortname = "ephealth",
    category = "egress-proxies",
    derive = "PartialEq",
    doc = "Health of one provider entry's libvirt hosts, as last checked by the operator.",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Hosts", type_ = "integer", json_path = ".status.hostCount"),
    printcolumn(
        name = "ReadyHosts",
        type_ = "integer",
        json_path = ".status.readyHosts"
    ),
    printcolumn(name = "Checked", type_ = "date", json_path = ".status.checkedAt"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
pub struct ProviderHealthSpec {
    /// The provider entry (its `name` in the provider config).
    #[schemars(length(min = 1))]
    pub provider: String,
}

/// What the operator last saw of a provider entry's hosts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderHealthStatus {
    /// One entry per host of the provider entry, in config order.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["host"]))]
    pub hosts: Vec<ProviderHostStatus>,
    /// Number of hosts in the entry.
    #[serde(default)]
    pub host_count: u32,
    /// Number of hosts whose state is Ready.
    #[serde(default)]
    pub ready_hosts: u32,
    /// When the last check round finished (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checked_at: Option<String>,
    /// The `Ready` condition: True when every host is Ready.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The spec generation this status was computed for.
    #[serde(default)]
    pub observed_generation: i64,
}

/// A host's state, as the last check classified it from the host's own result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ProviderHostState {
    /// Reachable and usable.
    Ready,
    /// Could not connect.
    Unreachable,
    /// The host's own call hit its deadline.
    Timeout,
    /// Reachable but something required is missing or low.
    Degraded,
}

impl From<HostState> for ProviderHostState {
    fn from(s: HostState) -> Self {
        match s {
            HostState::Ready => Self::Ready,
            HostState::Unreachable => Self::Unreachable,
            HostState::Timeout => Self::Timeout,
            HostState::Degraded => Self::Degraded,
        }
    }
}

/// One host's health, as last checked. Strings that come from the host are truncated and the
/// error is redacted (it never carries credentials).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderHostStatus {
    /// The host's name in the provider entry.
    pub host: String,
    /// `Ready` (reachable and usable), `Unreachable` (could not connect), `Timeout` (the host's
    /// own call hit its deadline) or `Degraded` (reachable, but something required is missing
    /// or low).
    pub state: ProviderHostState,
    /// Latency of the probe call alone (not the connection setup), in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<u64>,
    /// The host's own hostname (truncated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// libvirt version, `major.minor.micro`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub libvirt_version: Option<String>,
    /// Free pool space after the reserve, in GiB (rounded down).
    #[serde(
        rename = "poolFreeGiB",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub pool_free_gib: Option<u64>,
    /// Capabilities the host lacks (bridge, network, firmware, virt type...), named.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing_capabilities: Vec<String>,
    /// The last error (redacted, truncated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When this host was checked (RFC 3339).
    pub checked_at: String,
    /// Its maintenance (`maintenance:` in the provider config) and progress: `Cordoned`,
    /// `Draining (N left)` or `Drained`; absent for a host in service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<String>,
    /// An administrator's declaration that the host is dead (the
    /// `fence.egress-proxies.dev/HOST` annotation on this ProviderHealth) and what the
    /// operator did with it; absent when there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fenced: Option<ProviderHostFence>,
}

/// A host declared dead by an administrator, as the operator's latest check of the host's
/// entry saw the declaration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderHostFence {
    /// The annotation's value: why (truncated).
    pub reason: String,
    /// `Applied`: what the host's instances held was freed for other hosts of its segment;
    /// `Waiting`: not applied (yet): the latest check did not find the host dead, or the
    /// provider refused (see `message`); `Removing`: the host answered, the operator is
    /// removing the annotation.
    pub state: String,
    /// When the operator applied it (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_at: Option<String>,
    /// The declared egress addresses it freed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub freed: Vec<String>,
    /// Why it is not applied, when the provider refused (truncated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

const GIB: u64 = 1 << 30;

impl ProviderHostStatus {
    /// The status entry for a provider's [`HostReport`] checked at `checked_at` (RFC 3339):
    /// strings truncated, the error redacted again (defence in depth), bytes as whole GiB.
    pub fn from_report(r: &HostReport, checked_at: &str) -> Self {
        let bound = |s: &str| {
            egress_core::model::truncate(&egress_provider::error::redact(s), MAX_HOST_STRING_CHARS)
        };
        Self {
            host: bound(&r.host),
            state: r.state.into(),
            latency_ms: r
                .latency
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            hostname: r.hostname.as_deref().map(bound),
            libvirt_version: r.libvirt_version.as_deref().map(bound),
            pool_free_gib: r.pool_free_bytes.map(|b| b / GIB),
            missing_capabilities: r.missing.iter().map(|m| bound(m)).collect(),
            last_error: r.error.as_deref().map(bound),
            checked_at: checked_at.to_owned(),
            maintenance: None,
            fenced: None,
        }
    }
}

/// Every CRD: Proxy, ProviderHealth, ProxyPool.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![Proxy::crd(), ProviderHealth::crd(), ProxyPool::crd()]
}

/// Errors rendering the CRDs.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// A CRD did not serialize to YAML.
    #[error("cannot render the {name} CRD as YAML")]
    Yaml {
        /// The CRD's name.
        name: String,
        /// Why.
        #[source]
        source: serde_saphyr::SerializeError,
    },
}

/// The file name (under `deploy/crds/`) and YAML document of each CRD, Proxy first. The
/// output is deterministic: the same types always render the same bytes.
pub fn crds_yaml() -> Result<Vec<(String, String)>, CrdError> {
    crds()
        .into_iter()
        .map(|crd| {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let yaml = serde_saphyr::to_string(&crd).map_err(|source| CrdError::Yaml {
                name: name.clone(),
                source,
            })?;
            Ok((format!("{name}.yaml"), yaml))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )]

    use super::*;
    use egress_core::model::{ProxyManifest, ProxySettings, Resources};
    use kube::core::cel::{validate_cel, validate_cel_update};
    use serde_json::Value;

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
            egress: Default::default(),
        }
    }

    fn proxy(spec: ProxySpec) -> Proxy {
        Proxy::new("p1", spec.into())
    }

    /// The openAPIV3Schema of `crd`'s only version, as JSON.
    fn schema(crd: &CustomResourceDefinition) -> Value {
        let v = crd.spec.versions[0].schema.clone().unwrap();
        serde_json::to_value(v.open_api_v3_schema.unwrap()).unwrap()
    }

    #[test]
    fn changing_the_provider_of_a_proxy_is_refused_by_the_cel_rule() {
        // finding: M2
        let old = proxy(spec());
        let mut retyped = spec();
        retyped.provider = "work".into();
        let errs = validate_cel_update(&proxy(retyped), &old).unwrap_err();
        assert!(format!("{errs:?}").contains("immutable"), "{errs:?}");
        let mut resized = spec();
        resized.resources.vcpus = Some(2);
        validate_cel_update(&proxy(resized), &old).unwrap();
    }

    #[test]
    fn an_open_relay_and_a_malformed_cidr_are_refused_by_cel_rules() {
        validate_cel(&proxy(spec())).unwrap();
        let mut open = spec();
        open.proxy.allowed_client_cidrs.clear();
        let errs = validate_cel(&proxy(open.clone())).unwrap_err();
        assert!(format!("{errs:?}").contains("open relay"), "{errs:?}");
        open.proxy.credentials_ref = Some("proxy-users".into());
        validate_cel(&proxy(open)).unwrap();
        for bad in ["10.0.0.0/33", "10.0.0.0", "example.com/8"] {
            let mut s = spec();
            s.proxy.allowed_client_cidrs = vec!["192.168.0.0/16".into(), bad.into()];
            let errs = validate_cel(&proxy(s)).unwrap_err();
            assert!(format!("{errs:?}").contains("CIDR"), "{bad}: {errs:?}");
        }
        let mut v6 = spec();
        v6.proxy.allowed_client_cidrs = vec!["2001:db8::/32".into()];
        validate_cel(&proxy(v6)).unwrap();
    }

    #[test]
    fn a_pinned_egress_address_must_be_an_ip_one_per_family_by_cel_rules() {
        for ok in [
            &["203.0.113.7"][..],
            &["2001:db8::7"],
            &["203.0.113.7", "2001:db8::7"],
        ] {
            let mut s = spec();
            s.egress.address = ok.iter().map(|a| (*a).to_owned()).collect();
            validate_cel(&proxy(s)).unwrap();
        }
        for (bad, want) in [
            (&["203.0.113.0/24"][..], "IP address"),
            (&["egress.example"], "IP address"),
            (&["203.0.113.7", "203.0.113.8"], "one address per family"),
            (&["2001:db8::7", "2001:db8::8"], "one address per family"),
        ] {
            let mut s = spec();
            s.egress.address = bad.iter().map(|a| (*a).to_owned()).collect();
            let errs = validate_cel(&proxy(s)).unwrap_err();
            assert!(format!("{errs:?}").contains(want), "{bad:?}: {errs:?}");
        }
        let s = schema(&Proxy::crd());
        let a = &s["properties"]["spec"]["properties"]["egress"]["properties"]["address"];
        assert_eq!(a["maxItems"].as_u64(), Some(2), "{a}");
        let st = &s["properties"]["status"]["properties"]["egressAddress"];
        assert_eq!(st["type"], "array", "{st}");
    }

    #[test]
    fn the_schema_admits_only_a_secret_name_as_credentials_ref() {
        let s = schema(&Proxy::crd());
        let r = &s["properties"]["spec"]["properties"]["proxy"]["properties"]["credentialsRef"];
        assert_eq!(r["maxLength"].as_u64(), Some(253), "{r}");
        assert_eq!(r["minLength"].as_u64(), Some(1), "{r}");
        // A DNS subdomain: lowercase alphanumerics, '-' and '.', never '/' (no other
        // namespace, no path), anchored at both ends.
        let p = r["pattern"].as_str().unwrap();
        assert_eq!(
            p,
            r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
        );
        assert!(!p.contains('/'));
    }

    #[test]
    fn the_proxy_schema_bounds_ports_sizes_and_formats() {
        let s = schema(&Proxy::crd());
        let spec = &s["properties"]["spec"]["properties"];
        let port = &spec["proxy"]["properties"]["port"];
        assert_eq!(
            (port["minimum"].as_f64(), port["maximum"].as_f64()),
            (Some(1.0), Some(65535.0))
        );
        for (field, max) in [("provider", 32), ("host", 32), ("image", 2048)] {
            assert_eq!(spec[field]["maxLength"].as_u64(), Some(max), "{field}");
        }
        for size in ["diskGiB", "memoryMiB", "vcpus"] {
            let f = &spec["resources"]["properties"][size];
            assert_eq!(f["minimum"].as_f64(), Some(1.0), "{size}: {f}");
        }
        let cidrs = &spec["proxy"]["properties"]["allowedClientCidrs"];
        assert_eq!(cidrs["items"]["format"], "cidr");
        assert_eq!(cidrs["maxItems"], 256);
        // Conditions merge by type under server-side apply.
        let conds = &s["properties"]["status"]["properties"]["conditions"];
        assert_eq!(conds["x-kubernetes-list-type"], "map");
        assert_eq!(
            conds["x-kubernetes-list-map-keys"],
            serde_json::json!(["type"])
        );
        for name in ["provider", "image", "host"] {
            assert_eq!(spec[name]["minLength"], 1, "{name}");
        }
        assert_eq!(
            s["properties"]["spec"]["required"],
            serde_json::json!(["image", "provider"])
        );
    }

    #[test]
    fn the_proxy_crd_has_its_short_name_status_subresource_and_printer_columns() {
        let crd = Proxy::crd();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("proxies.egress-proxies.dev")
        );
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(crd.spec.names.short_names, Some(vec!["eproxy".to_owned()]));
        let v = &crd.spec.versions[0];
        assert_eq!(v.name, VERSION);
        assert!(v.subresources.as_ref().unwrap().status.is_some());
        let cols: Vec<&str> = v
            .additional_printer_columns
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(cols, ["Phase", "Host", "IP", "Egress", "Healthy", "Age"]);
        let ph = ProviderHealth::crd();
        assert_eq!(ph.spec.scope, "Cluster");
        assert!(
            ph.spec.versions[0]
                .subresources
                .as_ref()
                .unwrap()
                .status
                .is_some()
        );
    }

    #[test]
    fn the_generated_crd_yaml_parses_back_to_the_same_crds() {
        let docs = crds_yaml().unwrap();
        let names: Vec<&str> = docs.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "proxies.egress-proxies.dev.yaml",
                "providerhealths.egress-proxies.dev.yaml",
                "proxypools.egress-proxies.dev.yaml"
            ]
        );
        for ((_, yaml), crd) in docs.iter().zip(crds()) {
            let back: CustomResourceDefinition = serde_saphyr::from_str(yaml).unwrap();
            assert_eq!(back, crd);
        }
        assert_eq!(crds_yaml().unwrap(), docs, "rendering is deterministic");
    }

    #[test]
    fn a_standalone_manifest_is_also_a_valid_proxy_resource() {
        let y = "apiVersion: egress-proxies.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: p1\n  \
                 namespace: team-a\nspec:\n  provider: home\n  image: debian-12\n  resources:\n    \
                 diskGiB: 4\n  proxy:\n    port: 8080\n    allowedClientCidrs: [10.0.0.0/8]\n";
        let m: ProxyManifest = serde_saphyr::from_str(y).unwrap();
        let p: Proxy = serde_saphyr::from_str(y).unwrap();
        assert_eq!(p.spec.0, m.spec);
        assert_eq!(p.metadata.namespace.as_deref(), Some("team-a"));
        assert!(p.status.is_none());
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(json["spec"]["proxy"]["port"], 8080);
        assert_eq!(json["spec"]["resources"]["diskGiB"], 4);
        validate_cel(&p).unwrap();
    }

    #[test]
    fn host_health_truncates_remote_strings_and_redacts_errors() {
        // finding: L18, D5
        let r = HostReport {
            host: "h1".into(),
            state: HostState::Degraded,
            latency: Some(std::time::Duration::from_millis(12)),
            hostname: Some("x".repeat(10_000)),
            libvirt_version: Some("11.3.0".into()),
            virt_types: vec!["qemu".into()],
            uefi: true,
            pool_free_bytes: Some(5 * GIB + 7),
            missing: vec!["bridge br0".into()],
            error: Some("fetch https://user:secret@example.com/img failed".into()),
            addresses: Vec::new(),
        };
        let h = ProviderHostStatus::from_report(&r, "2026-01-01T00:00:00Z");
        assert_eq!(h.state, ProviderHostState::Degraded);
        assert_eq!(h.latency_ms, Some(12));
        assert_eq!(h.pool_free_gib, Some(5));
        assert!(h.hostname.unwrap().chars().count() <= MAX_HOST_STRING_CHARS);
        assert!(!h.last_error.unwrap().contains("secret"));
        assert_eq!(h.missing_capabilities, ["bridge br0"]);
    }
}
