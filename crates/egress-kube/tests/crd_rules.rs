//! Every rule of the committed CRDs (`deploy/crds`), generated from them: for each bound
//! (`maxLength`, `minLength`, `maxItems`, `minItems`, `minimum`, `maximum`, `enum`, `pattern`,
//! `format`, `required`) and each CEL rule (`x-kubernetes-validations`), an object that breaks
//! it is refused by the API server (the fake, with the committed CRDs installed, through a kube
//! client) with a 422 `Invalid` naming the field and the reason the Kubernetes API server gives,
//! and an object at the bound (or satisfying the rule) is accepted. A rule added to a CRD later
//! is found by the same walk: a bound gets its case from the schema alone; a CEL rule needs a
//! way to break and to satisfy it, in [`cel_cases`] — without one the test fails and says so.
//!
//! Expected wording (apimachinery `field.Error`, kube-openapi `validate` messages, apiextensions
//! `schema/cel`): `Too long: may not be more than N bytes`, `Too many: N: must have at most M
//! items`, `Invalid value: V: PATH in body should be greater than or equal to M`, `Unsupported
//! value: "x": supported values: "a", "b"`, `Invalid value: "x": PATH in body should match 'RE'`,
//! `Invalid value: "x": PATH in body must be of type FORMAT: "x"`, `Required value`, and for a
//! rule `Invalid value: "TYPE": MESSAGE`.
//!
//! Bases: the smallest object each schema admits (required fields, plus the fields the CRDs'
//! object-level rules need, see [`ALWAYS`]), with values for fields whose valid values are not
//! in the schema (addresses, CIDRs: [`hint`]).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::path::Path;

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube_fake::FakeApiServer;
use serde_json::{Map, Value, json};

const NS: &str = "default";

struct Crd {
    group: String,
    version: String,
    plural: String,
    kind: String,
    namespaced: bool,
    schema: Value,
}

fn crds() -> Vec<Crd> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/crds");
    let mut out = Vec::new();
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    paths.sort();
    for p in paths
        .into_iter()
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
    {
        let crd: Value = serde_saphyr::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        let s = |ptr: &str| crd.pointer(ptr).and_then(Value::as_str).unwrap().to_owned();
        for v in crd["spec"]["versions"].as_array().unwrap() {
            out.push(Crd {
                group: s("/spec/group"),
                version: v["name"].as_str().unwrap().to_owned(),
                plural: s("/spec/names/plural"),
                kind: s("/spec/names/kind"),
                namespaced: s("/spec/scope") == "Namespaced",
                schema: v["schema"]["openAPIV3Schema"].clone(),
            });
        }
    }
    assert!(
        out.len() >= 3,
        "deploy/crds holds the Proxy, ProxyPool and ProviderHealth CRDs"
    );
    out
}

/// A step of a path: a property or "an item of this list".
#[derive(Clone, Debug, PartialEq)]
enum Seg {
    Key(String),
    Item,
}

/// The path as hints match it: `spec.egress.address[]`.
fn pattern(segs: &[Seg]) -> String {
    let mut s = String::new();
    for seg in segs {
        match seg {
            Seg::Key(k) => {
                if !s.is_empty() {
                    s.push('.');
                }
                s.push_str(k);
            }
            Seg::Item => s.push_str("[]"),
        }
    }
    s
}

/// The path as the server prints it (items at index 0): `spec.egress.address[0]`.
fn printed(segs: &[Seg]) -> String {
    pattern(segs).replace("[]", "[0]")
}

/// Values for fields whose valid values the schema does not say (item `i` of a list distinct),
/// matched by the end of the path.
fn hint(path: &str, i: usize) -> Option<Value> {
    let ends = |s: &str| path == s || path.ends_with(&format!(".{s}"));
    let v = if ends("egress.address[]") {
        // One IPv4 and one IPv6 address: the address list's rules allow one per family.
        if i.is_multiple_of(2) {
            json!(format!("203.0.113.{}", i + 1))
        } else {
            json!(format!("2001:db8::{}", i + 1))
        }
    } else if ends("allowedClientCidrs[]") || ends("cidrs[]") {
        json!(format!("10.{}.{}.0/24", i / 256, i % 256))
    } else if ends("domains[]") {
        json!(format!("d{i}.example.com"))
    } else if ends("placement.hosts[]") {
        json!(format!("h{i}"))
    } else if ends("credentialsRef") {
        json!("proxy-creds")
    } else if ends("expectedEgress") {
        json!("203.0.113.7")
    } else if ends("provider") {
        json!("home")
    } else if ends("image") {
        json!("debian-12")
    } else if ends("lastTransitionTime") || ends("lastFailure") || ends("checkedAt") {
        json!("2020-01-01T00:00:00Z")
    } else {
        return None;
    };
    Some(v)
}

/// The longest valid value of at most `n` characters for a hinted string field, when its rules
/// (a format, a CEL rule on its list) cap it below the schema's `maxLength`.
fn longest(path: &str, n: usize) -> Option<String> {
    let ends = |s: &str| path.ends_with(s);
    let candidates: &[&str] = if ends("address[]") {
        &["2001:0db8:0000:0000:0000:0000:0000:0007"]
    } else if ends("allowedClientCidrs[]") || ends("cidrs[]") {
        &["2001:0db8:0000:0000:0000:0000:0000:0000/128"]
    } else {
        return None;
    };
    candidates
        .iter()
        .find(|c| c.len() <= n)
        .map(|c| (*c).to_owned())
}

/// Properties filled even when not required, by the end of their path: what the CRDs' rules
/// need of a valid object (a proxy must not be an open relay; a pool gateway needs client
/// credentials).
const ALWAYS: &[(&str, &str)] = &[
    ("proxy", r#"{"allowedClientCidrs": ["10.0.0.0/8"]}"#),
    ("gateway.clientCredentials", r#"["gateway-clients"]"#),
];

/// Properties a CEL rule requires though the schema does not (by whole path): synthesized as
/// if required (a pool's `template.spec` is optional in the schema so that the rule asking for
/// it can show the shape to write).
const ALSO_REQUIRED: &[&str] = &["spec.template.spec"];

/// Fields a CEL rule forbids outright, by the end of their path: any value at their bounds is
/// refused with the rule's message, so their "at the bound" object must be refused by it.
fn forbidden_by_rule(segs: &[Seg]) -> Option<&'static str> {
    let p = pattern(segs);
    let under_template_host = p.starts_with("spec.template") && p.ends_with(".host");
    under_template_host.then_some("spec.template.spec.host must not be set")
}

fn ty(s: &Value) -> &str {
    s.get("type").and_then(Value::as_str).unwrap_or("")
}

fn num(s: &Value, k: &str) -> Option<f64> {
    s.get(k).and_then(Value::as_f64)
}

fn matches(re: &str, v: &str) -> bool {
    regex::Regex::new(re).unwrap().is_match(v)
}

/// A string the schema admits (enum, format, pattern and lengths), or `None`.
fn valid_string(s: &Value, path: &str, i: usize) -> String {
    if let Some(Value::String(h)) = hint(path, i).filter(|_| ty(s) == "string") {
        return h;
    }
    if let Some(e) = s.get("enum").and_then(Value::as_array) {
        return e[0].as_str().unwrap().to_owned();
    }
    let min = num(s, "minLength").unwrap_or(1.0).max(1.0) as usize;
    let mut candidates = vec![
        "a".repeat(min),
        format!("x{i}"),
        "50%".into(),
        "5".into(),
        "a.b".into(),
    ];
    if let Some(f) = s.get("format").and_then(Value::as_str) {
        candidates.insert(0, format_sample(f).to_owned());
    }
    let pat = s.get("pattern").and_then(Value::as_str);
    candidates
        .into_iter()
        .find(|c| pat.is_none_or(|p| matches(p, c)) && c.len() >= min)
        .unwrap_or_else(|| panic!("no valid string for {path}: add a hint"))
}

fn format_sample(f: &str) -> &'static str {
    match f {
        "cidr" => "10.0.0.0/8",
        "ipv4" => "203.0.113.7",
        "ipv6" => "2001:db8::7",
        "date-time" => "2020-01-01T00:00:00Z",
        "uuid" => "550e8400-e29b-41d4-a716-446655440000",
        "duration" => "1h",
        _ => "x",
    }
}

/// The smallest value `s` admits at `path` (`i`: which item of a list).
fn synth(s: &Value, path: &str, i: usize) -> Value {
    // NB: a hint only stands for a string field (a field of the same name may be an object
    // elsewhere).
    if let Some(h) = hint(path, i).filter(|_| ty(s) == "string") {
        return h;
    }
    if s.get("x-kubernetes-int-or-string").is_some() {
        return json!(1);
    }
    match ty(s) {
        "object" => {
            let mut m = Map::new();
            let props = s.get("properties").and_then(Value::as_object);
            for k in s
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let k = k.as_str().unwrap();
                // An item's required fields take its index (items distinct where they must be).
                m.insert(k.into(), synth(&props.unwrap()[k], &join(path, k), i));
            }
            for (k, sub) in props.into_iter().flatten() {
                let p = join(path, k);
                if ALSO_REQUIRED.contains(&p.as_str()) && !m.contains_key(k) {
                    m.insert(k.clone(), synth(sub, &p, 0));
                }
            }
            for (suffix, v) in ALWAYS {
                for (k, _) in props.into_iter().flatten() {
                    let p = join(path, k);
                    if p == *suffix || p.ends_with(&format!(".{suffix}")) {
                        m.insert(k.clone(), serde_json::from_str(v).unwrap());
                    }
                }
            }
            Value::Object(m)
        }
        "array" => {
            let n = num(s, "minItems").unwrap_or(0.0) as usize;
            Value::Array(
                (0..n)
                    .map(|i| synth(&s["items"], &format!("{path}[]"), i))
                    .collect(),
            )
        }
        "string" => json!(valid_string(s, path, i)),
        // A gateway's listeners each take their own port (a rule wants each port once).
        "integer" if path.ends_with("gateway.listeners[].port") => {
            json!(num(s, "minimum").unwrap_or(0.0).max(0.0) as usize + i)
        }
        "integer" | "number" => json!(num(s, "minimum").unwrap_or(0.0).max(0.0) as i64),
        "boolean" => json!(false),
        _ => json!({}),
    }
}

fn join(path: &str, k: &str) -> String {
    if path.is_empty() {
        k.to_owned()
    } else {
        format!("{path}.{k}")
    }
}

/// The schema node at `segs` below `root`.
fn node<'a>(root: &'a Value, segs: &[Seg]) -> &'a Value {
    segs.iter().fold(root, |s, seg| match seg {
        Seg::Key(k) => &s["properties"][k.as_str()],
        Seg::Item => &s["items"],
    })
}

/// Sets the value at `segs` in `obj`, creating what is missing on the way (objects as the
/// schema's smallest, lists with one item: index 0).
fn place(obj: &mut Value, root: &Value, segs: &[Seg], v: Value) {
    let Some((last, parents)) = segs.split_last() else {
        *obj = v;
        return;
    };
    let mut cur = obj;
    for (n, seg) in parents.iter().enumerate() {
        let here = &segs[..=n];
        let s = node(root, here);
        cur = match seg {
            Seg::Key(k) => {
                let m = cur.as_object_mut().unwrap();
                m.entry(k.clone())
                    .or_insert_with(|| synth(s, &pattern(here), 0))
            }
            Seg::Item => {
                let a = cur.as_array_mut().unwrap();
                if a.is_empty() {
                    a.push(synth(s, &pattern(here), 0));
                }
                &mut a[0]
            }
        };
    }
    match last {
        Seg::Key(k) => {
            cur.as_object_mut().unwrap().insert(k.clone(), v);
        }
        Seg::Item => {
            let a = cur.as_array_mut().unwrap();
            if a.is_empty() {
                a.push(v);
            } else {
                a[0] = v;
            }
        }
    }
}

fn remove(obj: &mut Value, root: &Value, segs: &[Seg], key: &str) {
    // Make sure the object exists (with its required fields), then drop `key`.
    let mut here = obj.clone();
    if node_value(&here, segs).is_none() {
        place(
            &mut here,
            root,
            segs,
            synth(node(root, segs), &pattern(segs), 0),
        );
    }
    let mut target = node_value(&here, segs).unwrap().clone();
    target
        .as_object_mut()
        .unwrap_or_else(|| panic!("{}: not an object in {here}", pattern(segs)))
        .remove(key);
    place(&mut here, root, segs, target);
    *obj = here;
}

fn node_value<'a>(obj: &'a Value, segs: &[Seg]) -> Option<&'a Value> {
    segs.iter().try_fold(obj, |v, seg| match seg {
        Seg::Key(k) => v.get(k.as_str()),
        Seg::Item => v.get(0),
    })
}

/// One generated case: how to break a rule and how to satisfy it.
struct Case {
    what: String,
    /// Where the rule is (status rules are written through `/status`).
    segs: Vec<Seg>,
    broken: Value,
    ok: Value,
    /// Transition rules: the object is first created as `ok`, then updated to `broken`.
    update: bool,
    /// The cause the server must give: (reason, field, message).
    cause: (String, String, String),
}

/// How to break and satisfy each CEL rule of the committed CRDs, by the start of its message
/// (or its rule): `(values at the rule's node or below, by path suffix; "" is the node)`.
#[allow(clippy::type_complexity)]
fn cel_cases() -> Vec<(
    &'static str,
    Vec<(&'static str, Value)>,
    Vec<(&'static str, Value)>,
    bool,
)> {
    vec![
        (
            "every egress.address entry must be an IP address",
            vec![("", json!(["not-an-ip"]))],
            vec![("", json!(["203.0.113.7"]))],
            false,
        ),
        (
            "egress.address takes at most one address per family",
            vec![("", json!(["203.0.113.7", "203.0.113.8"]))],
            vec![("", json!(["203.0.113.7", "2001:db8::7"]))],
            false,
        ),
        (
            "every allowedClientCidrs entry must be a CIDR",
            // NB: a CIDR Go's sloppy parser (the `format: cidr` check) takes and the CEL
            // `isCIDR` refuses: a leading zero.
            vec![("", json!(["010.0.0.0/8"]))],
            vec![("", json!(["10.0.0.0/8", "2001:db8::/32"]))],
            false,
        ),
        (
            "spec.provider is immutable",
            vec![("", json!("elsewhere"))],
            vec![("", json!("home"))],
            true,
        ),
        (
            "set proxy.allowedClientCidrs or proxy.credentialsRef",
            vec![("proxy", json!({"allowedClientCidrs": []}))],
            vec![("proxy", json!({"credentialsRef": "proxy-creds"}))],
            false,
        ),
        (
            "set spec.credentials.generate, template.spec.proxy.allowedClientCidrs or template.spec.proxy.credentialsRef",
            vec![("proxy", json!({"allowedClientCidrs": []}))],
            vec![
                ("proxy", json!({"allowedClientCidrs": []})),
                ("credentials", json!({"generate": true})),
            ],
            false,
        ),
        (
            "spec.template takes the shape of a Kubernetes Pod template",
            // A flat template: its fields are unknown to the schema and pruned, no spec left.
            vec![("template", json!({"metadata": {"labels": {"team": "a"}}}))],
            vec![(
                "template",
                json!({"metadata": {"labels": {"team": "a"}}, "spec": {
                    "provider": "home", "image": "debian-12",
                    "proxy": {"allowedClientCidrs": ["10.0.0.0/8"]}}}),
            )],
            false,
        ),
        (
            "spec.template.spec.host must not be set",
            vec![("template.spec.host", json!("h1"))],
            vec![("placement", json!({"hosts": ["h1"]}))],
            false,
        ),
        (
            "spec.credentials.generate conflicts with spec.template.spec.proxy.credentialsRef",
            vec![
                ("credentials", json!({"generate": true})),
                ("proxy.credentialsRef", json!("proxy-creds")),
            ],
            vec![
                ("credentials", json!({"generate": false})),
                ("proxy.credentialsRef", json!("proxy-creds")),
            ],
            false,
        ),
        (
            "spec.gateway needs client credentials",
            vec![("gateway", json!({"listeners": [{"port": 3128}]}))],
            vec![(
                "gateway",
                json!({"listeners": [{"port": 3128}], "clientCredentials": ["gateway-clients"]}),
            )],
            false,
        ),
        (
            "spec.gateway.listeners: each port once",
            vec![(
                "listeners",
                json!([{"port": 3128}, {"port": 3128, "protocol": "socks5"}]),
            )],
            vec![(
                "listeners",
                json!([{"port": 3128}, {"port": 1080, "protocol": "socks5"}]),
            )],
            false,
        ),
    ]
}

/// Every path (below `segs` in `root`) ending with `suffix` (`""`: `segs` itself).
fn find_suffix(root: &Value, segs: &[Seg], suffix: &str) -> Vec<Seg> {
    if suffix.is_empty() {
        return segs.to_vec();
    }
    let mut found = Vec::new();
    let mut stack = vec![segs.to_vec()];
    while let Some(p) = stack.pop() {
        let s = node(root, &p);
        let pat = pattern(&p);
        if pat.len() > pattern(segs).len()
            && (pat == suffix || pat.ends_with(&format!(".{suffix}")))
        {
            found.push(p.clone());
        }
        if let Some(props) = s.get("properties").and_then(Value::as_object) {
            for k in props.keys() {
                let mut c = p.clone();
                c.push(Seg::Key(k.clone()));
                stack.push(c);
            }
        }
    }
    found.sort_by_key(|p| p.len());
    assert!(
        !found.is_empty(),
        "no field ending in {suffix} below {}",
        pattern(segs)
    );
    found.swap_remove(0)
}

fn with_values(base: &Value, root: &Value, at: &[Seg], sets: &[(&str, Value)]) -> Value {
    let mut o = base.clone();
    for (suffix, v) in sets {
        place(&mut o, root, &find_suffix(root, at, suffix), v.clone());
    }
    o
}

/// The field path and the path the validator names in its sentence (relative to `status`
/// for status rules).
fn paths(segs: &[Seg]) -> (String, String) {
    let field = printed(segs);
    let sentence = field.strip_prefix("status.").unwrap_or(&field).to_owned();
    (field, sentence)
}

fn go_quote(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// Walks `s` (at `segs`) and adds a case per bound and rule.
fn walk(root: &Value, base: &Value, segs: Vec<Seg>, cases: &mut Vec<Case>) {
    let s = node(root, &segs);
    let path = pattern(&segs);
    let (field, sentence) = paths(&segs);
    let mut add = |what: &str, broken: Value, ok: Value, cause: (&str, String)| {
        let mut b = base.clone();
        place(&mut b, root, &segs, broken);
        let mut o = base.clone();
        place(&mut o, root, &segs, ok);
        cases.push(Case {
            what: format!("{path}: {what}"),
            segs: segs.clone(),
            broken: b,
            ok: o,
            update: false,
            cause: (cause.0.to_owned(), field.clone(), cause.1),
        });
    };
    let is_int = ty(s) == "integer" || s.get("x-kubernetes-int-or-string").is_some();
    if let Some(n) = num(s, "maxLength") {
        let n = n as usize;
        let at = longest(&path, n).unwrap_or_else(|| "a".repeat(n));
        add(
            "maxLength",
            json!("a".repeat(n + 1)),
            json!(at),
            (
                "FieldValueTooLong",
                format!("Too long: may not be more than {n} bytes"),
            ),
        );
    }
    if let Some(n) = num(s, "minLength").filter(|n| *n >= 1.0) {
        let n = n as usize;
        let short = "a".repeat(n - 1);
        let ok = valid_string(s, &path, 0);
        add(
            "minLength",
            json!(short),
            json!(ok),
            (
                "FieldValueInvalid",
                format!(
                    "Invalid value: {}: {sentence} in body should be at least {n} chars long",
                    go_quote(&short)
                ),
            ),
        );
    }
    if let Some(n) = num(s, "maxItems") {
        let n = n as usize;
        let items = |k: usize| {
            Value::Array(
                (0..k)
                    .map(|i| synth(&s["items"], &format!("{path}[]"), i))
                    .collect(),
            )
        };
        add(
            "maxItems",
            items(n + 1),
            items(n),
            (
                "FieldValueTooMany",
                format!("Too many: {}: must have at most {n} items", n + 1),
            ),
        );
    }
    if let Some(n) = num(s, "minItems").filter(|n| *n >= 1.0) {
        let n = n as usize;
        let items = |k: usize| {
            Value::Array(
                (0..k)
                    .map(|i| synth(&s["items"], &format!("{path}[]"), i))
                    .collect(),
            )
        };
        add(
            "minItems",
            items(n - 1),
            items(n),
            (
                "FieldValueInvalid",
                format!(
                    "Invalid value: {}: {sentence} in body should have at least {n} items",
                    n - 1
                ),
            ),
        );
    }
    if let Some(m) = num(s, "minimum") {
        assert!(
            is_int,
            "{path}: minimum on a non-integer: extend the generator"
        );
        let m = m as i64;
        add(
            "minimum",
            json!(m - 1),
            json!(m),
            (
                "FieldValueInvalid",
                format!(
                    "Invalid value: {}: {sentence} in body should be greater than or equal to {m}",
                    m - 1
                ),
            ),
        );
    }
    if let Some(m) = num(s, "maximum") {
        assert!(
            is_int,
            "{path}: maximum on a non-integer: extend the generator"
        );
        let m = m as i64;
        add(
            "maximum",
            json!(m + 1),
            json!(m),
            (
                "FieldValueInvalid",
                format!(
                    "Invalid value: {}: {sentence} in body should be less than or equal to {m}",
                    m + 1
                ),
            ),
        );
    }
    if let Some(e) = s.get("enum").and_then(Value::as_array) {
        let valid: Vec<String> = e.iter().map(|v| go_quote(v.as_str().unwrap())).collect();
        for v in e {
            add(
                &format!("enum {v}"),
                json!("NotOneOfThem"),
                v.clone(),
                (
                    "FieldValueNotSupported",
                    format!(
                        "Unsupported value: \"NotOneOfThem\": supported values: {}",
                        valid.join(", ")
                    ),
                ),
            );
        }
    }
    if let Some(p) = s.get("pattern").and_then(Value::as_str) {
        let bad = ["Not_A_Match!", "-", "!"]
            .into_iter()
            .find(|c| !matches(p, c))
            .unwrap();
        let ok = valid_string(s, &path, 0);
        add(
            "pattern",
            json!(bad),
            json!(ok),
            (
                "FieldValueInvalid",
                format!(
                    "Invalid value: {}: {sentence} in body should match '{p}'",
                    go_quote(bad)
                ),
            ),
        );
    }
    if let Some(f) = s
        .get("format")
        .and_then(Value::as_str)
        .filter(|f| ["cidr", "ipv4", "ipv6", "date-time", "uuid", "duration"].contains(f))
    {
        let bad = format!("not-a-{f}");
        add(
            &format!("format {f}"),
            json!(bad),
            json!(format_sample(f)),
            (
                "FieldValueTypeInvalid",
                format!(
                    "Invalid value: {}: {sentence} in body must be of type {f}: {}",
                    go_quote(&bad),
                    go_quote(&bad)
                ),
            ),
        );
    }
    for k in s
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let k = k.as_str().unwrap();
        let mut b = base.clone();
        remove(&mut b, root, &segs, k);
        let mut o = base.clone();
        if node_value(&o, &segs).is_none() {
            place(&mut o, root, &segs, synth(s, &path, 0));
        }
        let mut child = segs.clone();
        child.push(Seg::Key(k.to_owned()));
        cases.push(Case {
            what: format!("{path}: required {k}"),
            segs: segs.clone(),
            broken: b,
            ok: o,
            update: false,
            cause: (
                "FieldValueRequired".into(),
                printed(&child),
                "Required value".into(),
            ),
        });
    }
    for r in s
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let message = r
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("")
            .trim()
            .to_owned();
        let rule = r["rule"].as_str().unwrap().trim();
        let key = if message.is_empty() {
            rule.to_owned()
        } else {
            message.clone()
        };
        let all = cel_cases();
        let (_, brk, ok, update) = all
            .iter()
            .find(|(start, ..)| key.starts_with(start))
            .unwrap_or_else(|| {
                panic!("{path}: no case for the CEL rule {key:?}: add one to cel_cases()")
            });
        let shown = if message.is_empty() {
            format!("failed rule: {rule}")
        } else {
            message.clone()
        };
        cases.push(Case {
            what: format!("{path}: rule {key:?}"),
            segs: segs.clone(),
            broken: with_values(base, root, &segs, brk),
            ok: with_values(base, root, &segs, ok),
            update: *update,
            cause: (
                "FieldValueInvalid".into(),
                field.clone(),
                format!("Invalid value: {}: {shown}", go_quote(ty(s))),
            ),
        });
    }
    for key in ["anyOf", "allOf", "oneOf"] {
        assert!(
            s.get(key).is_none(),
            "{path}: {key} in a committed CRD: its branches' bounds do not apply to values of the \
             other kinds (a real server accepts them); extend the generator or use plain bounds"
        );
    }
    if let Some(props) = s.get("properties").and_then(Value::as_object) {
        for k in props.keys() {
            if segs.is_empty() && (k == "metadata" || k == "apiVersion" || k == "kind") {
                continue;
            }
            let mut c = segs.clone();
            c.push(Seg::Key(k.clone()));
            walk(root, base, c, cases);
        }
    }
    if s.get("items").is_some() {
        let mut c = segs.clone();
        c.push(Seg::Item);
        walk(root, base, c, cases);
    }
}

fn api(srv: &FakeApiServer, crd: &Crd) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&crd.group, &crd.version, &crd.kind),
        &crd.plural,
    );
    if crd.namespaced {
        Api::namespaced_with(srv.client(NS), NS, &ar)
    } else {
        Api::all_with(srv.client(NS), &ar)
    }
}

fn object(crd: &Crd, name: &str, body: &Value) -> DynamicObject {
    let mut o = body.clone();
    o["apiVersion"] = json!(format!("{}/{}", crd.group, crd.version));
    o["kind"] = json!(crd.kind);
    o["metadata"] = json!({"name": name});
    serde_json::from_value(o).unwrap()
}

/// Writes `body` as object `name`: created, or (status cases) created from the base and its
/// status replaced through `/status`; transition cases update an object created as `first`.
async fn write(
    api: &Api<DynamicObject>,
    crd: &Crd,
    name: &str,
    base: &Value,
    body: &Value,
    status: bool,
    first: Option<&Value>,
) -> Result<(), kube::Error> {
    let pp = PostParams::default();
    if status {
        api.create(&pp, &object(crd, name, base)).await?;
        let mut cur = api.get(name).await?;
        cur.data["status"] = body["status"].clone();
        api.replace_status(name, &pp, &cur).await?;
        return Ok(());
    }
    if let Some(first) = first {
        api.create(&pp, &object(crd, name, first)).await?;
        let mut cur = api.get(name).await?;
        cur.data = object(crd, name, body).data;
        api.replace(name, &pp, &cur).await?;
        return Ok(());
    }
    api.create(&pp, &object(crd, name, body)).await?;
    Ok(())
}

#[tokio::test]
async fn every_bound_and_rule_of_the_committed_crds_refuses_what_breaks_it_and_admits_its_bound() {
    let srv = FakeApiServer::new();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/crds");
    srv.install_crds_from_dir(&dir).unwrap();
    let mut total = 0;
    let mut failures = Vec::new();
    for crd in crds() {
        let root = &crd.schema;
        let base = synth(root, "", 0);
        let mut cases = Vec::new();
        walk(root, &base, Vec::new(), &mut cases);
        let api = api(&srv, &crd);
        for (i, c) in cases.iter().enumerate() {
            total += 1;
            let status = c.segs.first() == Some(&Seg::Key("status".into()));
            let (broken, ok) = (c.broken.clone(), c.ok.clone());
            let name = format!("{}-r{i}", crd.plural);
            let first = c.update.then_some(&c.ok);
            match write(&api, &crd, &name, &base, &broken, status, first).await {
                Err(kube::Error::Api(s)) if s.code == 422 => {
                    let (reason, field, message) = &c.cause;
                    let causes = s
                        .details
                        .as_ref()
                        .map(|d| d.causes.clone())
                        .unwrap_or_default();
                    let hit = causes
                        .iter()
                        .any(|x| &x.reason == reason && &x.field == field && &x.message == message);
                    let text = format!("{field}: {message}");
                    let prefix = format!("{}.{} \"{name}\" is invalid: ", crd.kind, crd.group);
                    if !hit || !s.message.starts_with(&prefix) || !s.message.contains(&text) {
                        failures.push(format!(
                            "{}: want cause {reason} {field:?} {message:?}, got {}: {causes:?}",
                            c.what, s.message
                        ));
                    }
                }
                other => failures.push(format!(
                    "{}: breaking it was not refused with 422: {other:?}",
                    c.what
                )),
            }
            let name = format!("{}-a{i}", crd.plural);
            let result = write(
                &api,
                &crd,
                &name,
                &base,
                &ok,
                status,
                c.update.then_some(&c.ok),
            )
            .await;
            match (result, forbidden_by_rule(&c.segs)) {
                (Ok(()), None) => {}
                (Err(kube::Error::Api(s)), Some(rule))
                    if s.code == 422 && s.message.contains(rule) => {}
                (Ok(()), Some(rule)) => {
                    failures.push(format!("{}: admitted although {rule:?}", c.what))
                }
                (Err(e), _) => failures.push(format!(
                    "{}: the object at the bound was refused: {e}",
                    c.what
                )),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {total} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // Every committed CRD has rules: a walk that found none is broken, not passing.
    assert!(total > 100, "only {total} cases generated");
    assert!(
        srv.dropped_fields().is_empty(),
        "{:?}",
        srv.dropped_fields()
    );
}
