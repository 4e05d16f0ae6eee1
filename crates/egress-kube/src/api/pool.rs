//! The `ProxyPool` custom resource: a fleet of member Proxies made from one template (the
//! core's [`ProxyPoolSpec`] and [`ProxyPoolStatus`], so the YAML is the same as a standalone
//! manifest's).
//!
//! Guarantees:
//! - **Scale subresource**: `spec.replicas` / `status.replicas` / `status.selector`, so
//!   `kubectl scale` and a HorizontalPodAutoscaler work; a status subresource beside it.
//! - **The template is shaped like a Pod template** (`template.metadata`, `template.spec`);
//!   a template without `spec` is refused with a message showing the shape (a flat template's
//!   fields are unknown to the schema and pruned by the API server).
//! - **The template is checked as a pool's, not as a Proxy's**: the Proxy's open-relay rule is
//!   replaced on the pool by one that also accepts generated credentials (members made from
//!   such a template get `credentialsRef` to the pool's Secret, so each member still passes
//!   the Proxy rule), the Proxy's immutable-provider rule is dropped from the template (a
//!   changed template replaces the members), and the template may not pin a host nor combine
//!   generated credentials with a `credentialsRef`.

use egress_core::pool::{ProxyPoolSpec, ProxyPoolStatus};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The rules of a pool's spec, as CEL (message, rule).
const POOL_RULES: &[(&str, &str)] = &[
    (
        "spec.template takes the shape of a Kubernetes Pod template: template.metadata \
         (labels and annotations for the members) and template.spec (the member Proxy's spec: \
         provider, image, proxy...); move fields written directly under template into \
         template.spec. ProxyPool is v1alpha1: its shape may change between versions without \
         a compatibility promise",
        "has(self.template.spec)",
    ),
    (
        "set spec.credentials.generate, template.spec.proxy.allowedClientCidrs or \
         template.spec.proxy.credentialsRef: a proxy open to everyone is an open relay",
        "(has(self.credentials) && has(self.credentials.generate) && self.credentials.generate) \
         || (has(self.template.spec) && has(self.template.spec.proxy) && \
         ((has(self.template.spec.proxy.allowedClientCidrs) && \
         size(self.template.spec.proxy.allowedClientCidrs) > 0) || \
         has(self.template.spec.proxy.credentialsRef)))",
    ),
    (
        "spec.template.spec.host must not be set: the pool places its members (use \
         spec.placement.hosts)",
        "!has(self.template.spec) || !has(self.template.spec.host)",
    ),
    (
        "spec.credentials.generate conflicts with spec.template.spec.proxy.credentialsRef: the \
         pool either generates its credentials or uses yours",
        "!(has(self.credentials) && has(self.credentials.generate) && self.credentials.generate \
         && has(self.template.spec) && has(self.template.spec.proxy) && \
         has(self.template.spec.proxy.credentialsRef))",
    ),
    (
        "spec.gateway needs client credentials: list them in spec.gateway.clientCredentials, \
         or set spec.credentials.generate or spec.template.spec.proxy.credentialsRef",
        "!has(self.gateway) || (has(self.gateway.clientCredentials) && \
         size(self.gateway.clientCredentials) > 0) || (has(self.credentials) && \
         has(self.credentials.generate) && self.credentials.generate) || \
         (has(self.template.spec) && has(self.template.spec.proxy) && \
         has(self.template.spec.proxy.credentialsRef))",
    ),
];

/// What the pool asks for: the same fields as the `spec` of a standalone ProxyPool manifest.
// NB: a newtype because the CustomResource derive must sit on a type of this crate; it is the
// core's `ProxyPoolSpec`, unchanged on the wire (`#[serde(transparent)]`), with its schema
// adjusted by hand (`JsonSchema` below).
// NB: clippy reads the repeated `printcolumn(name = .., type_ = ..)` keys as duplicated
// attributes; they are one column each.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
#[kube(
    group = "egress-proxies.dev",
    version = "v1alpha1",
    kind = "ProxyPool",
    plural = "proxypools",
    namespaced,
    status = "ProxyPoolStatus",
    shortname = "eppool",
    category = "egress-proxies",
    derive = "PartialEq",
    doc = "A fleet of egress proxies: `replicas` member Proxies made from one template, spread over a provider entry's hosts, replaced when they age, break or their template changes, published behind one Service.",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(
        name = "Available",
        type_ = "integer",
        json_path = ".status.availableReplicas"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
pub struct ProxyPoolCrdSpec(pub ProxyPoolSpec);

impl std::ops::Deref for ProxyPoolCrdSpec {
    type Target = ProxyPoolSpec;
    fn deref(&self) -> &ProxyPoolSpec {
        &self.0
    }
}

impl From<ProxyPoolSpec> for ProxyPoolCrdSpec {
    fn from(s: ProxyPoolSpec) -> Self {
        Self(s)
    }
}

impl JsonSchema for ProxyPoolCrdSpec {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ProxyPoolSpec".into()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let mut v: Value = ProxyPoolSpec::json_schema(generator).into();
        adjust(&mut v);
        // NB: `adjust` keeps an object an object, so the conversion back cannot fail.
        schemars::Schema::try_from(v).unwrap_or_default()
    }
}

/// The pool's rules in place of the Proxy's (see the module doc).
fn adjust(spec: &mut Value) {
    if let Some(member) = spec
        .pointer_mut("/properties/template/properties/spec")
        .and_then(Value::as_object_mut)
    {
        member.remove("x-kubernetes-validations");
        member.insert(
            "description".into(),
            json!(
                "The spec of every member Proxy: provider, image, resources and proxy settings. \
                 `host` and `egress` must not be set: the pool places its members and their \
                 addresses come from their hosts. Changing it replaces the members through the \
                 update budget."
            ),
        );
    }
    // NB: `template.spec` is not `required` in the schema: a flat template (its fields
    // pruned as unknown) then meets the rule whose message shows the shape to write, rather
    // than a bare "Required value"; the operator refuses a template without it all the same.
    if let Some(template) = spec
        .pointer_mut("/properties/template")
        .and_then(Value::as_object_mut)
    {
        template.remove("required");
    }
    if let Some(provider) = spec
        .pointer_mut("/properties/template/properties/spec/properties/provider")
        .and_then(Value::as_object_mut)
    {
        provider.remove("x-kubernetes-validations");
        provider.insert(
            "description".into(),
            json!("The provider entry (its `name` in the provider config)."),
        );
    }
    if let Some(o) = spec.as_object_mut() {
        o.insert(
            "x-kubernetes-validations".into(),
            Value::Array(
                POOL_RULES
                    .iter()
                    .map(|(message, rule)| json!({"rule": rule, "message": message}))
                    .collect(),
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use super::*;
    use egress_core::model::{ProxySettings, ProxySpec};
    use egress_core::pool::spec::CredentialsPolicy;
    use kube::CustomResourceExt;
    use kube::core::cel::{validate_cel, validate_cel_update};

    fn spec(cidrs: &[&str], generate: bool, credentials_ref: Option<&str>) -> ProxyPoolSpec {
        let y = "replicas: 2\ntemplate:\n  spec:\n    provider: home\n    image: debian-12\n";
        let mut s: ProxyPoolSpec = serde_saphyr::from_str(y).unwrap();
        s.template.spec.proxy = ProxySettings {
            allowed_client_cidrs: cidrs.iter().map(|c| (*c).to_owned()).collect(),
            credentials_ref: credentials_ref.map(str::to_owned),
            ..ProxySettings::default()
        };
        s.credentials = CredentialsPolicy { generate };
        s
    }

    fn pool(s: ProxyPoolSpec) -> ProxyPool {
        ProxyPool::new("web", s.into())
    }

    #[test]
    fn the_pool_crd_has_scale_and_status_subresources_and_printer_columns() {
        let crd = ProxyPool::crd();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("proxypools.egress-proxies.dev")
        );
        assert_eq!(crd.spec.scope, "Namespaced");
        let v = &crd.spec.versions[0];
        let sub = v.subresources.as_ref().unwrap();
        assert!(sub.status.is_some());
        let scale = sub.scale.as_ref().unwrap();
        assert_eq!(scale.spec_replicas_path, ".spec.replicas");
        assert_eq!(scale.status_replicas_path, ".status.replicas");
        assert_eq!(
            scale.label_selector_path.as_deref(),
            Some(".status.selector")
        );
        let cols: Vec<&str> = v
            .additional_printer_columns
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(cols, ["Replicas", "Ready", "Available", "Age"]);
        // Users read the fields with `kubectl explain`.
        let s =
            serde_json::to_value(v.schema.clone().unwrap().open_api_v3_schema.unwrap()).unwrap();
        let props = &s["properties"]["spec"]["properties"];
        for f in [
            "replicas",
            "template",
            "placement",
            "rotation",
            "update",
            "credentials",
        ] {
            assert!(
                props[f]["description"]
                    .as_str()
                    .is_some_and(|d| d.len() > 20),
                "{f}: {}",
                props[f]
            );
        }
        assert!(
            s["properties"]["status"]["properties"]["members"]["items"]["properties"]["egressIp"]
                .is_object()
        );
    }

    #[test]
    fn a_template_with_generated_credentials_needs_no_cidrs_but_an_open_relay_is_refused() {
        // Generated credentials: the members get a credentialsRef, so no CIDR is needed.
        validate_cel(&pool(spec(&[], true, None))).unwrap();
        validate_cel(&pool(spec(&["10.0.0.0/8"], false, None))).unwrap();
        validate_cel(&pool(spec(&[], false, Some("users")))).unwrap();
        let errs = validate_cel(&pool(spec(&[], false, None))).unwrap_err();
        assert!(format!("{errs:?}").contains("open relay"), "{errs:?}");
        let errs = validate_cel(&pool(spec(&[], true, Some("users")))).unwrap_err();
        assert!(format!("{errs:?}").contains("conflicts"), "{errs:?}");
        let mut pinned = spec(&["10.0.0.0/8"], false, None);
        pinned.template.spec.host = Some("h1".into());
        let errs = validate_cel(&pool(pinned)).unwrap_err();
        assert!(
            format!("{errs:?}").contains("template.spec.host"),
            "{errs:?}"
        );
        // A member made from the generating template passes the Proxy's own rule.
        let member = egress_core::pool::member::member_spec(
            &spec(&[], true, None).template.spec,
            "h1",
            &[],
            Some("web-credentials"),
        );
        validate_cel(&crate::api::Proxy::new("web-bcdfgh", member.into())).unwrap();
        // A replacement keeping its predecessor's address pins it: the Proxy's rule allows it.
        let member = egress_core::pool::member::member_spec(
            &spec(&[], true, None).template.spec,
            "h1",
            &["192.0.2.7".parse().unwrap()],
            Some("web-credentials"),
        );
        validate_cel(&crate::api::Proxy::new("web-bcdfgh", member.into())).unwrap();
    }

    #[test]
    fn a_gateway_needs_client_credentials_and_each_port_once() {
        let with = |g: &str, generate: bool| {
            let mut s = spec(&["10.0.0.0/8"], generate, None);
            s.gateway = Some(serde_saphyr::from_str(g).unwrap());
            pool(s)
        };
        validate_cel(&with("listeners: [{port: 3128}]\n", true)).unwrap();
        validate_cel(&with(
            "listeners: [{port: 3128}]\nclientCredentials: [alice]\n",
            false,
        ))
        .unwrap();
        let errs = validate_cel(&with("listeners: [{port: 3128}]\n", false)).unwrap_err();
        assert!(
            format!("{errs:?}").contains("needs client credentials"),
            "{errs:?}"
        );
        let errs = validate_cel(&with(
            "listeners: [{port: 3128}, {port: 3128, protocol: socks5}]\n",
            true,
        ))
        .unwrap_err();
        assert!(format!("{errs:?}").contains("each port once"), "{errs:?}");
        let crd = serde_json::to_value(ProxyPool::crd()).unwrap();
        let g = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
            ["gateway"];
        assert_eq!(g["properties"]["listeners"]["maxItems"], 4, "{g}");
        assert_eq!(
            g["properties"]["failover"]["properties"]["attempts"]["maximum"], 10.0,
            "{g}"
        );
    }

    #[test]
    fn a_template_without_spec_is_refused_with_the_pod_template_shape() {
        // What the API server leaves of a template written flat (its fields are unknown to
        // the schema and pruned): the rule names the shape to write.
        let flat = json!({"replicas": 2, "template": {}});
        let errs =
            kube::core::cel::validate_cel_schema::<ProxyPoolCrdSpec>(&flat, None).unwrap_err();
        let text = format!("{errs:?}");
        for needle in [
            "template.metadata",
            "template.spec",
            "v1alpha1",
            "compatibility",
        ] {
            assert!(text.contains(needle), "{needle}: {text}");
        }
        // The Kubernetes shape with metadata passes.
        let ok = json!({"replicas": 2, "template": {
            "metadata": {"labels": {"team": "a"}},
            "spec": {"provider": "home", "image": "debian-12",
                     "proxy": {"allowedClientCidrs": ["10.0.0.0/8"]}}}});
        kube::core::cel::validate_cel_schema::<ProxyPoolCrdSpec>(&ok, None).unwrap();
    }

    #[test]
    fn the_template_provider_may_change_unlike_a_proxys() {
        let old = pool(spec(&["10.0.0.0/8"], false, None));
        let mut moved = spec(&["10.0.0.0/8"], false, None);
        moved.template.spec.provider = "work".into();
        validate_cel_update(&pool(moved), &old).unwrap();
        let _ = ProxySpec::clone(&old.spec.template.spec);
    }
}
