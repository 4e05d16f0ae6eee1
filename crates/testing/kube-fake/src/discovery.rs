//! What clients other than kube-rs ask a real API server before they touch a resource:
//! discovery (`/version`, `/api`, `/api/v1`, `/apis`, `/apis/GROUP[/VERSION]`), the OpenAPI
//! documents (`/openapi/v2` as JSON or as the protobuf kubectl asks for, `/openapi/v3` and its
//! per-group-version documents), and server-side printing (`meta.k8s.io/v1` `Table`) with a
//! CustomResourceDefinition's `additionalPrinterColumns`.
//!
//! Guarantees:
//! - discovery lists the built-in resources in [`BUILTIN`] (the ones the operator and its tests
//!   use) and every served version of every stored CustomResourceDefinition, with its kind,
//!   scope, short names, categories and `/status` (when declared); the verbs listed are the
//!   ones the fake serves (no `deletecollection`);
//! - the OpenAPI documents hold one schema per served CRD version (its `openAPIV3Schema`, the
//!   `x-kubernetes-group-version-kind` extension added, named like a real server names it:
//!   `dev.egress-proxies.v1alpha1.Proxy` for group `egress-proxies.dev`), which is what
//!   `kubectl explain` and kubectl's client-side validation read; built-in types have none;
//! - a Table has a `Name` column then the CRD's printer columns (or `Created At` for anything
//!   without), each cell computed from the column's simple JSONPath (`.a.b`, `[N]`,
//!   `[?(@.key=="value")]`) as the real table convertor does: `date` cells as a relative age,
//!   `integer` / `number` / `boolean` as JSON values, missing values as `null`.
//!
//! One file because discovery, both OpenAPI documents and printing are views of the same
//! [`ResourceInfo`] table built from the stored CRDs; the OpenAPI v2 protobuf encoder is its
//! own submodule (`proto`).

use serde_json::{Value, json};

/// The Kubernetes version the fake claims in `/version` and the OpenAPI `info`.
// NB: the committed CRDs use CEL validation rules (x-kubernetes-validations, GA in 1.29); the
// fake claims a version that has everything the operator's manifests use.
pub const CLAIMED_VERSION: (&str, &str) = ("1", "30");

/// One built-in resource type listed in discovery.
struct Builtin {
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
    short: &'static [&'static str],
}

/// Built-in resources listed in discovery: the ones the operator, kubectl and the conformance
/// suite use. The store serves any resource; only these are advertised.
const BUILTIN: &[Builtin] = &[
    b(
        "",
        "v1",
        "namespaces",
        "namespace",
        "Namespace",
        false,
        &["ns"],
    ),
    b("", "v1", "events", "event", "Event", true, &["ev"]),
    b(
        "",
        "v1",
        "configmaps",
        "configmap",
        "ConfigMap",
        true,
        &["cm"],
    ),
    b("", "v1", "secrets", "secret", "Secret", true, &[]),
    b(
        "",
        "v1",
        "serviceaccounts",
        "serviceaccount",
        "ServiceAccount",
        true,
        &["sa"],
    ),
    b("", "v1", "services", "service", "Service", true, &["svc"]),
    b("", "v1", "pods", "pod", "Pod", true, &["po"]),
    b(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "customresourcedefinition",
        "CustomResourceDefinition",
        false,
        &["crd", "crds"],
    ),
    b(
        "coordination.k8s.io",
        "v1",
        "leases",
        "lease",
        "Lease",
        true,
        &[],
    ),
    b(
        "events.k8s.io",
        "v1",
        "events",
        "event",
        "Event",
        true,
        &["ev"],
    ),
    b(
        "discovery.k8s.io",
        "v1",
        "endpointslices",
        "endpointslice",
        "EndpointSlice",
        true,
        &[],
    ),
];

const fn b(
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
    short: &'static [&'static str],
) -> Builtin {
    Builtin {
        group,
        version,
        plural,
        singular,
        kind,
        namespaced,
        short,
    }
}

/// The verbs of a top-level resource, as the fake serves them.
const VERBS: &[&str] = &[
    "create", "delete", "get", "list", "patch", "update", "watch",
];

/// A resource type as discovery and printing see it.
#[derive(Debug, Clone)]
pub(crate) struct ResourceInfo {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub namespaced: bool,
    short: Vec<String>,
    categories: Vec<String>,
    status: bool,
    scale: bool,
    columns: Vec<Value>,
    schema: Option<Value>,
}

/// Every resource type the server advertises, built-ins first, then each served version of
/// each stored CRD.
pub(crate) fn resources(crds: &[Value]) -> Vec<ResourceInfo> {
    let mut out: Vec<ResourceInfo> = BUILTIN
        .iter()
        .map(|b| ResourceInfo {
            group: b.group.into(),
            version: b.version.into(),
            plural: b.plural.into(),
            singular: b.singular.into(),
            kind: b.kind.into(),
            namespaced: b.namespaced,
            short: b.short.iter().map(|s| (*s).to_owned()).collect(),
            categories: Vec::new(),
            status: false,
            scale: false,
            columns: Vec::new(),
            schema: None,
        })
        .collect();
    for crd in crds {
        let s = |p: &str| {
            crd.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        };
        let strs = |p: &str| -> Vec<String> {
            crd.pointer(p)
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default()
        };
        let (group, plural, kind) = (
            s("/spec/group"),
            s("/spec/names/plural"),
            s("/spec/names/kind"),
        );
        if group.is_empty() || plural.is_empty() || kind.is_empty() {
            continue;
        }
        let singular = match s("/spec/names/singular") {
            x if x.is_empty() => kind.to_lowercase(),
            x => x,
        };
        let versions = crd.pointer("/spec/versions").and_then(Value::as_array);
        for v in versions.into_iter().flatten() {
            if v.get("served").and_then(Value::as_bool) == Some(false) {
                continue;
            }
            let Some(name) = v.get("name").and_then(Value::as_str) else {
                continue;
            };
            out.push(ResourceInfo {
                group: group.clone(),
                version: name.to_owned(),
                plural: plural.clone(),
                singular: singular.clone(),
                kind: kind.clone(),
                namespaced: s("/spec/scope") != "Cluster",
                short: strs("/spec/names/shortNames"),
                categories: strs("/spec/names/categories"),
                status: v
                    .pointer("/subresources/status")
                    .is_some_and(Value::is_object),
                scale: v
                    .pointer("/subresources/scale")
                    .is_some_and(Value::is_object),
                columns: v
                    .get("additionalPrinterColumns")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default(),
                schema: v.pointer("/schema/openAPIV3Schema").cloned(),
            });
        }
    }
    out
}

/// The plural and scope of a built-in kind the fake advertises.
pub(crate) fn builtin(group: &str, kind: &str) -> Option<(String, bool)> {
    BUILTIN
        .iter()
        .find(|b| b.group == group && b.kind == kind)
        .map(|b| (b.plural.to_owned(), b.namespaced))
}

/// The advertised type of `group`/`version`/`plural`, if any.
pub(crate) fn find(
    crds: &[Value],
    group: &str,
    version: &str,
    plural: &str,
) -> Option<ResourceInfo> {
    resources(crds)
        .into_iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

fn group_version(group: &str, version: &str) -> String {
    if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    }
}

/// Answers a non-resource path (discovery, OpenAPI, version), or `None` when `path` is none of
/// them. `accept` picks the OpenAPI v2 encoding. The result is (content type, body).
pub(crate) fn non_resource(crds: &[Value], path: &str, accept: &str) -> Option<(String, Vec<u8>)> {
    let json_body = |v: Value| Some(("application/json".to_owned(), v.to_string().into_bytes()));
    let all = resources(crds);
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segs.as_slice() {
        ["version"] => json_body(json!({
            "major": CLAIMED_VERSION.0, "minor": CLAIMED_VERSION.1,
            "gitVersion": format!("v{}.{}.0", CLAIMED_VERSION.0, CLAIMED_VERSION.1),
            "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
            "buildDate": "2024-01-01T00:00:00Z", "goVersion": "go1.22.0", "compiler": "gc",
            "platform": "linux/amd64",
        })),
        ["api"] => json_body(json!({
            "kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [],
        })),
        ["api", "v1"] => json_body(resource_list(&all, "", "v1")),
        ["apis"] => json_body(json!({
            "kind": "APIGroupList", "apiVersion": "v1",
            "groups": groups(&all).iter().map(|(g, vs)| api_group(g, vs)).collect::<Vec<_>>(),
        })),
        ["apis", g] => groups(&all)
            .into_iter()
            .find(|(name, _)| name == g)
            .and_then(|(name, vs)| {
                let mut v = api_group(&name, &vs);
                if let Some(o) = v.as_object_mut() {
                    o.insert("kind".into(), json!("APIGroup"));
                    o.insert("apiVersion".into(), json!("v1"));
                }
                json_body(v)
            }),
        ["apis", g, v] if all.iter().any(|r| r.group == *g && r.version == *v) => {
            json_body(resource_list(&all, g, v))
        }
        ["openapi", "v2"] => {
            let doc = openapi_v2(&all);
            if accept.contains("protobuf") {
                Some((
                    "application/com.github.proto-openapi.spec.v2.v1.0+protobuf".to_owned(),
                    proto::document(&doc),
                ))
            } else {
                json_body(doc)
            }
        }
        ["openapi", "v3"] => {
            let mut paths = serde_json::Map::new();
            for (g, vs) in groups(&all)
                .into_iter()
                .chain([(String::new(), vec!["v1".to_owned()])])
            {
                for v in vs {
                    let p = if g.is_empty() {
                        format!("api/{v}")
                    } else {
                        format!("apis/{g}/{v}")
                    };
                    let hash = fnv(&openapi_v3(&all, &g, &v).to_string());
                    paths.insert(
                        p.clone(),
                        json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={hash:016X}")}),
                    );
                }
            }
            json_body(json!({"paths": paths}))
        }
        ["openapi", "v3", "api", v] => json_body(openapi_v3(&all, "", v)),
        ["openapi", "v3", "apis", g, v] if all.iter().any(|r| r.group == *g && r.version == *v) => {
            json_body(openapi_v3(&all, g, v))
        }
        _ => None,
    }
}

/// Groups (not the core one) and their versions, in first-seen order.
fn groups(all: &[ResourceInfo]) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for r in all.iter().filter(|r| !r.group.is_empty()) {
        match out.iter_mut().find(|(g, _)| *g == r.group) {
            Some((_, vs)) if !vs.contains(&r.version) => vs.push(r.version.clone()),
            Some(_) => {}
            None => out.push((r.group.clone(), vec![r.version.clone()])),
        }
    }
    out
}

fn api_group(name: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    json!({
        "name": name, "versions": vs,
        "preferredVersion": vs.first().cloned().unwrap_or(Value::Null),
    })
}

fn resource_list(all: &[ResourceInfo], group: &str, version: &str) -> Value {
    let mut resources = Vec::new();
    for r in all
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        let mut e = json!({
            "name": r.plural, "singularName": r.singular, "namespaced": r.namespaced,
            "kind": r.kind, "verbs": VERBS,
        });
        if let Some(o) = e.as_object_mut() {
            if !r.short.is_empty() {
                o.insert("shortNames".into(), json!(r.short));
            }
            if !r.categories.is_empty() {
                o.insert("categories".into(), json!(r.categories));
            }
        }
        resources.push(e);
        if r.status {
            resources.push(json!({
                "name": format!("{}/status", r.plural), "singularName": "",
                "namespaced": r.namespaced, "kind": r.kind, "verbs": ["get", "patch", "update"],
            }));
        }
        if r.scale {
            resources.push(json!({
                "name": format!("{}/scale", r.plural), "singularName": "",
                "namespaced": r.namespaced, "group": "autoscaling", "version": "v1",
                "kind": "Scale", "verbs": ["get", "patch", "update"],
            }));
        }
    }
    json!({
        "kind": "APIResourceList", "apiVersion": "v1",
        "groupVersion": group_version(group, version), "resources": resources,
    })
}

/// The definition name a real server gives a CRD's schema: the group reversed, then version
/// and kind (`egress-proxies.dev` → `dev.egress-proxies.v1alpha1.Proxy`).
fn definition_name(r: &ResourceInfo) -> String {
    let rev: Vec<&str> = r.group.split('.').rev().collect();
    format!("{}.{}.{}", rev.join("."), r.version, r.kind)
}

/// A CRD's schema as published: the GVK extension and the standard `apiVersion`, `kind` and
/// `metadata` fields added.
fn published_schema(r: &ResourceInfo) -> Option<Value> {
    let mut s = r.schema.clone()?;
    let o = s.as_object_mut()?;
    o.insert(
        "x-kubernetes-group-version-kind".into(),
        json!([{"group": r.group, "version": r.version, "kind": r.kind}]),
    );
    let props = o
        .entry("properties")
        .or_insert_with(|| json!({}))
        .as_object_mut()?;
    props.insert(
        "apiVersion".into(),
        json!({"type": "string", "description":
        "APIVersion defines the versioned schema of this representation of an object."}),
    );
    props.insert(
        "kind".into(),
        json!({"type": "string", "description":
        "Kind is a string value representing the REST resource this object represents."}),
    );
    props.insert(
        "metadata".into(),
        json!({"type": "object", "description":
        "Standard object's metadata."}),
    );
    Some(s)
}

fn openapi_v2(all: &[ResourceInfo]) -> Value {
    let mut defs = serde_json::Map::new();
    for r in all {
        if let Some(mut s) = published_schema(r) {
            to_v2(&mut s);
            defs.insert(definition_name(r), s);
        }
    }
    json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": format!("v{}.{}.0", CLAIMED_VERSION.0, CLAIMED_VERSION.1)},
        "paths": {}, "definitions": defs,
    })
}

/// OpenAPI v2 has no `nullable` and no `oneOf`/`anyOf`/`not`: a real server drops them (and a
/// nullable field's `type`) when it publishes a CRD schema as v2.
fn to_v2(s: &mut Value) {
    match s {
        Value::Object(o) => {
            if o.remove("nullable") == Some(Value::Bool(true)) {
                o.remove("type");
            }
            for k in ["oneOf", "anyOf", "not"] {
                o.remove(k);
            }
            for v in o.values_mut() {
                to_v2(v);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(to_v2),
        _ => {}
    }
}

/// The OpenAPI v3 document of one group-version: each CRD's schema under `components`, and
/// the resource's paths with a `get` operation naming its GVK (`kubectl explain` finds the
/// kind of a resource through them).
fn openapi_v3(all: &[ResourceInfo], group: &str, version: &str) -> Value {
    let mut schemas = serde_json::Map::new();
    let mut paths = serde_json::Map::new();
    for r in all
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        let Some(s) = published_schema(r) else {
            continue;
        };
        let name = definition_name(r);
        schemas.insert(name.clone(), s);
        let prefix = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let item = if r.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", r.plural)
        } else {
            format!("{prefix}/{}/{{name}}", r.plural)
        };
        paths.insert(item, json!({"get": {
            "description": format!("read the specified {}", r.kind),
            "x-kubernetes-action": "get",
            "x-kubernetes-group-version-kind": {"group": r.group, "version": r.version, "kind": r.kind},
            "responses": {"200": {"description": "OK", "content": {"application/json": {
                "schema": {"$ref": format!("#/components/schemas/{name}")}}}}},
        }}));
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": format!("v{}.{}.0", CLAIMED_VERSION.0, CLAIMED_VERSION.1)},
        "paths": paths, "components": {"schemas": schemas},
    })
}

/// FNV-1a, for the `hash` of the OpenAPI v3 paths (any stable digest does).
fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Does the `Accept` header ask for a `meta.k8s.io` Table?
pub(crate) fn wants_table(accept: &str) -> bool {
    accept.split(',').any(|part| {
        let params: Vec<&str> = part.split(';').map(str::trim).collect();
        params.contains(&"as=Table") && params.contains(&"g=meta.k8s.io")
    })
}

/// The Table a real server prints for `objects` of type `info` (or of an unknown type when
/// `None`): `include` is the `includeObject` query parameter (`None`, `Metadata` — the
/// default —, or `Object`).
pub(crate) fn table(
    info: Option<&ResourceInfo>,
    objects: &[Value],
    list_rv: Option<&str>,
    include: &str,
) -> Value {
    let name_col = json!({"name": "Name", "type": "string", "format": "name", "priority": 0,
        "description": "Name must be unique within a namespace."});
    let custom: Vec<Value> = info.map(|i| i.columns.clone()).unwrap_or_default();
    let mut defs = vec![name_col];
    if custom.is_empty() {
        defs.push(json!({"name": "Created At", "type": "date", "format": "", "priority": 0,
            "description": "CreationTimestamp is a timestamp representing the server time when this object was created."}));
    } else {
        for c in &custom {
            defs.push(json!({
                "name": c.get("name").cloned().unwrap_or(json!("")),
                "type": c.get("type").cloned().unwrap_or(json!("string")),
                "format": c.get("format").cloned().unwrap_or(json!("")),
                "description": c.get("description").cloned().unwrap_or(json!("")),
                "priority": c.get("priority").cloned().unwrap_or(json!(0)),
            }));
        }
    }
    // NB: the default `Created At` column holds the timestamp itself (RFC 3339), not an age.
    let paths: Vec<(String, String)> = if custom.is_empty() {
        vec![(".metadata.creationTimestamp".into(), "timestamp".into())]
    } else {
        custom
            .iter()
            .map(|c| {
                let s = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
                (s("jsonPath"), s("type"))
            })
            .collect()
    };
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let mut cells = vec![o.pointer("/metadata/name").cloned().unwrap_or(Value::Null)];
            for (p, ty) in &paths {
                cells.push(jsonpath_first(o, p).map_or(Value::Null, |v| cell(ty, &v)));
            }
            let mut row = json!({"cells": cells});
            let object = match include {
                "None" => None,
                "Object" => Some(o.clone()),
                _ => Some(
                    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                    "metadata": o.get("metadata").cloned().unwrap_or(json!({}))}),
                ),
            };
            if let (Some(obj), Some(r)) = (object, row.as_object_mut()) {
                r.insert("object".into(), obj);
            }
            row
        })
        .collect();
    let mut meta = serde_json::Map::new();
    if let Some(rv) = list_rv {
        meta.insert("resourceVersion".into(), json!(rv));
    }
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta,
           "columnDefinitions": defs, "rows": rows})
}

fn cell(ty: &str, v: &Value) -> Value {
    match (ty, v) {
        ("date", Value::String(s)) => json!(age(s)),
        ("timestamp", Value::String(s)) => json!(s),
        ("string", Value::String(s)) => json!(s),
        ("string", other) => json!(other.to_string()),
        ("integer", Value::Number(n)) => json!(n),
        ("number", Value::Number(n)) => json!(n),
        ("boolean", Value::Bool(b)) => json!(b),
        _ => Value::Null,
    }
}

/// A timestamp as a relative age the way kubectl prints one (`45s`, `12m`, `3h`, `5d`).
fn age(ts: &str) -> String {
    let Ok(t) = time::OffsetDateTime::parse(ts, &time::format_description::well_known::Rfc3339)
    else {
        return "<invalid>".into();
    };
    let secs = (time::OffsetDateTime::now_utc() - t).whole_seconds().max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 3 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// The first result of a printer column's simple JSONPath: `.field`, `[N]`, and the filter
/// `[?(@.key=="value")]` (the forms CRD printer columns use).
pub(crate) fn jsonpath_first(obj: &Value, path: &str) -> Option<Value> {
    let mut cur: Vec<Value> = vec![obj.clone()];
    let mut rest = path
        .trim()
        .trim_start_matches('{')
        .trim_end_matches('}')
        .trim_start_matches('$');
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            let (field, tail) = r.split_at(end);
            cur = cur.iter().filter_map(|v| v.get(field).cloned()).collect();
            rest = tail;
        } else if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']')?;
            // A filter's quoted value may not hold `]`; the printer columns here never do.
            let (inner, tail) = (&r[..end], &r[end + 1..]);
            if let Some(f) = inner.strip_prefix("?(@.").and_then(|f| f.strip_suffix(')')) {
                let (k, want) = f.split_once("==")?;
                let want = want.trim().trim_matches(|c| c == '"' || c == '\'');
                cur = cur
                    .iter()
                    .filter_map(Value::as_array)
                    .flatten()
                    .filter(|item| {
                        item.get(k.trim()).map(|v| match v {
                            Value::String(s) => s.as_str() == want,
                            other => serde_json::to_string(other).ok().as_deref() == Some(want),
                        }) == Some(true)
                    })
                    .cloned()
                    .collect();
            } else if inner == "*" {
                cur = cur
                    .iter()
                    .filter_map(Value::as_array)
                    .flatten()
                    .cloned()
                    .collect();
            } else {
                let i: usize = inner.trim().parse().ok()?;
                cur = cur.iter().filter_map(|v| v.get(i).cloned()).collect();
            }
            rest = tail;
        } else {
            return None;
        }
    }
    cur.into_iter().next()
}

/// A hand-written encoder for the few messages of gnostic's `openapi.v2` protobuf that a
/// schema document needs (kubectl before 1.27 fetches `/openapi/v2` only as protobuf).
mod proto {
    use serde_json::Value;

    fn varint(out: &mut Vec<u8>, mut v: u64) {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }

    fn bytes(out: &mut Vec<u8>, field: u32, b: &[u8]) {
        varint(out, (u64::from(field) << 3) | 2);
        varint(out, b.len() as u64);
        out.extend_from_slice(b);
    }

    fn string(out: &mut Vec<u8>, field: u32, s: &str) {
        if !s.is_empty() {
            bytes(out, field, s.as_bytes());
        }
    }

    /// `openapi.v2.Document` with `swagger`, `info`, empty `paths` and `definitions`.
    pub(super) fn document(doc: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        string(
            &mut out,
            1,
            doc.get("swagger").and_then(Value::as_str).unwrap_or("2.0"),
        );
        let mut info = Vec::new();
        let s = |p: &str| doc.pointer(p).and_then(Value::as_str).unwrap_or("");
        string(&mut info, 1, s("/info/title"));
        string(&mut info, 2, s("/info/version"));
        bytes(&mut out, 2, &info);
        bytes(&mut out, 8, &[]);
        let mut defs = Vec::new();
        for (name, schema) in doc
            .get("definitions")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            bytes(&mut defs, 1, &named_schema(name, schema));
        }
        bytes(&mut out, 9, &defs);
        out
    }

    fn named_schema(name: &str, s: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        string(&mut out, 1, name);
        bytes(&mut out, 2, &schema(s));
        out
    }

    /// `openapi.v2.Schema`: `$ref`, format, description, required, additionalProperties,
    /// type, items, allOf, properties and `x-` extensions (as YAML, which JSON text is).
    fn schema(s: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        let text = |k: &str| s.get(k).and_then(Value::as_str).unwrap_or("");
        string(&mut out, 1, text("$ref"));
        string(&mut out, 2, text("format"));
        string(&mut out, 4, text("description"));
        for r in s
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(r) = r.as_str() {
                string(&mut out, 19, r);
            }
        }
        match s.get("additionalProperties") {
            Some(Value::Bool(b)) => {
                let mut item = Vec::new();
                varint(&mut item, 2 << 3);
                varint(&mut item, u64::from(*b));
                bytes(&mut out, 21, &item);
            }
            Some(ap @ Value::Object(_)) => {
                let mut item = Vec::new();
                bytes(&mut item, 1, &schema(ap));
                bytes(&mut out, 21, &item);
            }
            _ => {}
        }
        if let Some(t) = s.get("type").and_then(Value::as_str) {
            let mut ty = Vec::new();
            string(&mut ty, 1, t);
            bytes(&mut out, 22, &ty);
        }
        if let Some(items) = s.get("items").filter(|i| i.is_object()) {
            let mut it = Vec::new();
            bytes(&mut it, 1, &schema(items));
            bytes(&mut out, 23, &it);
        }
        for a in s
            .get("allOf")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            bytes(&mut out, 24, &schema(a));
        }
        if let Some(props) = s.get("properties").and_then(Value::as_object) {
            let mut p = Vec::new();
            for (k, v) in props {
                bytes(&mut p, 1, &named_schema(k, v));
            }
            bytes(&mut out, 25, &p);
        }
        if let Some(o) = s.as_object() {
            for (k, v) in o.iter().filter(|(k, _)| k.starts_with("x-")) {
                let mut any = Vec::new();
                string(&mut any, 2, &v.to_string());
                let mut named = Vec::new();
                string(&mut named, 1, k);
                bytes(&mut named, 2, &any);
                bytes(&mut out, 31, &named);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printer_column_paths_with_filters_and_indexes_find_the_first_match() {
        let o = json!({"status": {"conditions": [
            {"type": "Ready", "status": "False"}, {"type": "Healthy", "status": "True"}]}});
        assert_eq!(
            jsonpath_first(&o, ".status.conditions[?(@.type==\"Healthy\")].status"),
            Some(json!("True"))
        );
        assert_eq!(
            jsonpath_first(&o, ".status.conditions[0].type"),
            Some(json!("Ready"))
        );
        assert_eq!(jsonpath_first(&o, ".status.missing"), None);
    }

    #[test]
    fn a_group_is_reversed_in_the_schema_definition_name() {
        let crd = json!({"spec": {"group": "egress-proxies.dev", "scope": "Namespaced",
            "names": {"plural": "proxies", "kind": "Proxy"},
            "versions": [{"name": "v1alpha1", "served": true, "schema": {"openAPIV3Schema": {"type": "object"}}}]}});
        let r = find(&[crd], "egress-proxies.dev", "v1alpha1", "proxies").unwrap();
        assert_eq!(definition_name(&r), "dev.egress-proxies.v1alpha1.Proxy");
    }
}
