//! What the API server does to the objects it stores, by type: for a custom resource, its CRD
//! version's structural schema (pruning, null pruning, defaulting: [`structural`]; value
//! validation: [`openapi`] and [`formats`]; `x-kubernetes-list-type` uniqueness: here; CEL
//! rules: [`rules`], [`cost`]); for every type, `metadata` ([`meta`]). Errors are the server's
//! ([`field`]).
//!
//! The pipeline of a write (apiextensions `customresource_handler.go`, `strategy.go`,
//! `status_strategy.go`, `validator.go`, Kubernetes 1.33):
//! 1. [`TypeSchema::decode`]: prune unknown fields (reported for `fieldValidation`), drop
//!    non-nullable nulls, drop unknown `metadata` fields, apply defaults;
//! 2. create / update: `kind` and `apiVersion` must be the type's; `metadata` checks; the schema
//!    checks of the whole object (updates: ratcheted); the scale subresource's replicas paths
//!    (non-negative, at most 2^31-1); list-type uniqueness (updates: only when the old object
//!    had none); then the CEL rules — unless an earlier error is `Required`, `Unsupported`,
//!    `Too long`, `Too many` or a type error, when one more error says some rules were not
//!    checked;
//! 3. status writes: the same with the schema checks of `status` only (paths under `status`).
//!
//! A CRD itself is checked when written ([`compile_crd`]): its rules must compile and stay within
//! the cost limits.

pub(crate) mod cost;
pub(crate) mod field;
pub(crate) mod formats;
pub(crate) mod meta;
pub(crate) mod openapi;
pub(crate) mod rules;
pub(crate) mod structural;

use serde_json::{Value, json};

use field::{Bad, FieldError, Kind};

/// Compiled regular expressions, by pattern (schemas and the checks here use a few dozen).
// NB: compiling a pattern costs far more than matching it; writes are checked against the same
// patterns over and over. Bounded: cleared when it holds this many.
const REGEX_CACHE_MAX: usize = 1024;

static REGEXES: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<String, std::sync::Arc<regex::Regex>>>,
> = std::sync::LazyLock::new(Default::default);

/// Whether `s` matches `pattern` (unanchored, as Go's `MatchString`); `Err` with the compile
/// error for an invalid pattern.
pub(crate) fn regex_match(pattern: &str, s: &str) -> Result<bool, String> {
    let mut cache = REGEXES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(r) = cache.get(pattern) {
        return Ok(r.is_match(s));
    }
    let r = regex::Regex::new(pattern).map_err(|e| e.to_string())?;
    let m = r.is_match(s);
    if cache.len() >= REGEX_CACHE_MAX {
        cache.clear();
    }
    cache.insert(pattern.to_owned(), std::sync::Arc::new(r));
    Ok(m)
}

/// Largest value of a scale subresource's replicas (`math.MaxInt32`).
const MAX_REPLICAS: i64 = 2_147_483_647;

/// One served version of a custom resource type, compiled from its CRD.
#[derive(Debug)]
pub(crate) struct TypeSchema {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub kind: String,
    pub namespaced: bool,
    /// `openAPIV3Schema` (a schema preserving everything when the CRD has none).
    pub schema: Value,
    pub cel: rules::CelTree,
    /// `specReplicasPath` and `statusReplicasPath` of a scale subresource.
    pub scale: Option<(String, String)>,
}

/// The compiled versions of a CRD, or the errors that make its write a 422.
pub(crate) fn compile_crd(crd: &Value) -> Result<Vec<TypeSchema>, Vec<FieldError>> {
    let s = |p: &str| {
        crd.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    let (group, plural, kind) = (
        s("/spec/group"),
        s("/spec/names/plural"),
        s("/spec/names/kind"),
    );
    let namespaced = s("/spec/scope") != "Cluster";
    let mut out = Vec::new();
    let mut errs = Vec::new();
    let mut total: u64 = 0;
    let mut contributors: Vec<(String, u64)> = Vec::new();
    let versions = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for (i, v) in versions.iter().enumerate() {
        let base = format!("spec.versions[{i}].schema.openAPIV3Schema");
        let schema = v
            .pointer("/schema/openAPIV3Schema")
            .cloned()
            .unwrap_or_else(
                || json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
            );
        let (tree, mut e) = rules::CelTree::compile(&schema, &base);
        errs.append(&mut e);
        costs(
            &tree,
            &base,
            &mut Vec::new(),
            &mut errs,
            &mut total,
            &mut contributors,
        );
        let scale = v.pointer("/subresources/scale").map(|sc| {
            let p = |k: &str| sc.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
            (p("specReplicasPath"), p("statusReplicasPath"))
        });
        out.push(TypeSchema {
            group: group.clone(),
            version: v
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            plural: plural.clone(),
            kind: kind.clone(),
            namespaced,
            schema,
            cel: tree,
            scale,
        });
    }
    if total > cost::STATIC_CRD_LIMIT {
        for (path, _) in &contributors {
            errs.push(FieldError::forbidden(
                path.clone(),
                "contributed to estimated rule cost total exceeding cost limit for entire OpenAPIv3 schema",
            ));
        }
        errs.push(FieldError::forbidden(
            "spec.validation.openAPIV3Schema",
            cost::exceeded(
                "x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema",
                total,
                cost::STATIC_CRD_LIMIT,
            ),
        ));
    }
    if errs.is_empty() { Ok(out) } else { Err(errs) }
}

/// Checks each rule's estimated cost (times how often it can run) against the per-expression
/// limit and sums them for the per-CRD limit.
fn costs<'a>(
    t: &'a rules::CelTree,
    path: &str,
    ancestors: &mut Vec<&'a Value>,
    errs: &mut Vec<FieldError>,
    total: &mut u64,
    contributors: &mut Vec<(String, u64)>,
) {
    let times = cost::cardinality(ancestors);
    for (i, r) in t.rules.iter().enumerate() {
        let at = format!("{path}.x-kubernetes-validations[{i}].rule");
        let c = cost::estimate(&r.program, &t.schema).saturating_mul(times);
        if c > cost::STATIC_LIMIT {
            errs.push(FieldError::forbidden(
                at.clone(),
                cost::exceeded("estimated rule cost", c, cost::STATIC_LIMIT),
            ));
        }
        *total = total.saturating_add(c);
        contributors.push((at, c));
        if let Some((_, m)) = &r.message_expression {
            let mc = cost::estimate(m, &t.schema).saturating_mul(times);
            if mc > cost::STATIC_LIMIT {
                errs.push(FieldError::forbidden(
                    format!("{path}.x-kubernetes-validations[{i}].messageExpression"),
                    cost::exceeded("estimated messageExpression cost", mc, cost::STATIC_LIMIT),
                ));
            }
            *total = total.saturating_add(mc);
        }
    }
    for (k, c) in &t.properties {
        costs(
            c,
            &format!("{path}.properties[{k}]"),
            ancestors,
            errs,
            total,
            contributors,
        );
    }
    if let Some(c) = &t.additional {
        ancestors.push(&t.schema);
        costs(
            c,
            &format!("{path}.additionalProperties"),
            ancestors,
            errs,
            total,
            contributors,
        );
        ancestors.pop();
    }
    if let Some(c) = &t.items {
        ancestors.push(&t.schema);
        costs(
            c,
            &format!("{path}.items"),
            ancestors,
            errs,
            total,
            contributors,
        );
        ancestors.pop();
    }
    for (n, c) in t.all_of.iter().enumerate() {
        costs(
            c,
            &format!("{path}.allOf[{n}]"),
            ancestors,
            errs,
            total,
            contributors,
        );
    }
}

impl TypeSchema {
    /// Request decoding: prunes unknown fields (their paths returned, `metadata.x` included),
    /// drops non-nullable nulls, applies defaults.
    pub(crate) fn decode(&self, obj: &mut Value) -> Vec<String> {
        let mut dropped = meta::prune(obj);
        dropped.extend(structural::prune(obj, &self.schema));
        structural::prune_nulls(obj, Some(&self.schema));
        structural::default(obj, &self.schema);
        dropped.sort();
        dropped
    }

    fn type_meta(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
        if kind != self.kind {
            errs.push(FieldError::invalid(
                "kind",
                Value::String(kind.into()),
                format!("must be {}", self.kind),
            ));
        }
        let want = format!("{}/{}", self.group, self.version);
        let av = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        if av != want {
            errs.push(FieldError::invalid(
                "apiVersion",
                Value::String(av.into()),
                format!("must be {want}"),
            ));
        }
        errs
    }

    fn scale_checks(&self, obj: &Value, status_only: bool) -> Vec<FieldError> {
        let Some((spec_path, status_path)) = &self.scale else {
            return Vec::new();
        };
        let mut errs = Vec::new();
        let paths: Vec<&String> = if status_only {
            vec![status_path]
        } else {
            vec![spec_path, status_path]
        };
        for p in paths {
            let ptr = p.trim().replace('.', "/");
            let Some(v) = obj.pointer(&ptr) else {
                continue;
            };
            match v.as_i64() {
                Some(n) if n < 0 => errs.push(FieldError::invalid(
                    p.clone(),
                    json!(n),
                    "should be a non-negative integer",
                )),
                Some(n) if n > MAX_REPLICAS => errs.push(FieldError::invalid(
                    p.clone(),
                    json!(n),
                    format!("should be less than or equal to {MAX_REPLICAS}"),
                )),
                Some(_) => {}
                None => errs.push(FieldError::invalid(
                    p.clone(),
                    json!(0),
                    format!(
                        ".{} accessor error: {} is of the type {}, expected int64",
                        p.trim_start_matches('.'),
                        v,
                        go_type(v)
                    ),
                )),
            }
        }
        errs
    }

    /// The errors of a create.
    pub(crate) fn validate_create(&self, obj: &Value) -> Vec<FieldError> {
        let tm = self.type_meta(obj);
        if !tm.is_empty() {
            return tm;
        }
        let mut errs = meta::validate(obj, meta::NameRule::Subdomain, self.namespaced, false);
        errs.extend(openapi::validate(&self.schema, obj, None, None));
        errs.extend(self.scale_checks(obj, false));
        errs.extend(list_types(&self.schema, obj, ""));
        self.with_cel(errs, obj, None)
    }

    /// The errors of an update of the main resource.
    pub(crate) fn validate_update(&self, obj: &Value, old: &Value) -> Vec<FieldError> {
        let tm = self.type_meta(obj);
        if !tm.is_empty() {
            return tm;
        }
        let mut errs = meta::validate(obj, meta::NameRule::Subdomain, self.namespaced, true);
        errs.extend(openapi::validate(&self.schema, obj, Some(old), None));
        errs.extend(self.scale_checks(obj, false));
        if list_types(&self.schema, old, "").is_empty() {
            errs.extend(list_types(&self.schema, obj, ""));
        }
        self.with_cel(errs, obj, Some(old))
    }

    /// The errors of a write to `/status`.
    pub(crate) fn validate_status(&self, obj: &Value, old: &Value) -> Vec<FieldError> {
        let tm = self.type_meta(obj);
        if !tm.is_empty() {
            return tm;
        }
        let mut errs = meta::validate(obj, meta::NameRule::Subdomain, self.namespaced, true);
        if let (Some(status), Some(ss)) =
            (obj.get("status"), self.schema.pointer("/properties/status"))
        {
            errs.extend(openapi::validate(
                ss,
                status,
                old.get("status"),
                Some("status"),
            ));
        }
        errs.extend(self.scale_checks(obj, true));
        let new_lt = list_types(&self.schema, obj, "");
        if !new_lt.is_empty() && list_types(&self.schema, old, "").is_empty() {
            errs.extend(new_lt);
        }
        self.with_cel(errs, obj, Some(old))
    }

    fn with_cel(
        &self,
        mut errs: Vec<FieldError>,
        obj: &Value,
        old: Option<&Value>,
    ) -> Vec<FieldError> {
        if !self.cel.any {
            return errs;
        }
        if errs.iter().any(|e| e.kind.blocks_cel()) {
            errs.push(FieldError::invalid(
                "<nil>",
                Value::Null,
                "some validation rules were not checked because the object was invalid; correct \
                 the existing errors to complete validation",
            ));
            return errs;
        }
        let mut eval = rules::Eval::new();
        eval.run(&self.cel, obj, old, None);
        errs.extend(eval.errors);
        errs
    }
}

/// Go's name of a decoded JSON value's type (`unstructured` accessor errors).
fn go_type(v: &Value) -> &'static str {
    match v {
        Value::String(_) => "string",
        Value::Bool(_) => "bool",
        Value::Number(_) => "float64",
        Value::Array(_) => "[]interface {}",
        Value::Object(_) => "map[string]interface {}",
        Value::Null => "<nil>",
    }
}

/// `x-kubernetes-list-type: set` / `map` uniqueness (apiextensions `schema/listtype`): each
/// repeated item (or map key) is a `Duplicate value` at its index.
pub(crate) fn list_types(schema: &Value, v: &Value, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    match v {
        Value::Object(m) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let extra = schema.get("additionalProperties").filter(|a| a.is_object());
            for (k, x) in m {
                if let Some(s) = props.and_then(|p| p.get(k)).or(extra) {
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    errs.extend(list_types(s, x, &p));
                }
            }
        }
        Value::Array(items) => {
            let idx = |i: usize| format!("{path}[{i}]");
            match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
                Some("set") => {
                    for i in repeated(items.to_vec()) {
                        if let Some(x) = items.get(i) {
                            errs.push(FieldError::new(
                                Kind::Duplicate,
                                idx(i),
                                Bad::Json(x.clone()),
                                "",
                            ));
                        }
                    }
                }
                Some("map") => {
                    let keys: Vec<String> = schema
                        .get("x-kubernetes-list-map-keys")
                        .and_then(Value::as_array)
                        .map(|a| {
                            a.iter()
                                .filter_map(Value::as_str)
                                .map(str::to_owned)
                                .collect()
                        })
                        .unwrap_or_default();
                    if let Some((i, x)) = items
                        .iter()
                        .enumerate()
                        .find(|(_, x)| !x.is_object() && !x.is_null())
                    {
                        errs.push(FieldError::invalid(
                            idx(i),
                            x.clone(),
                            "must be an object for an array of list-type map",
                        ));
                    } else {
                        let key_of = |x: &Value| -> Value {
                            let mut k = serde_json::Map::new();
                            for f in &keys {
                                if let Some(v) = x.get(f) {
                                    k.insert(f.clone(), v.clone());
                                }
                            }
                            Value::Object(k)
                        };
                        let ks: Vec<Value> = items.iter().map(key_of).collect();
                        for i in repeated(ks.clone()) {
                            if let Some(k) = ks.get(i) {
                                errs.push(FieldError::new(
                                    Kind::Duplicate,
                                    idx(i),
                                    Bad::Json(k.clone()),
                                    "",
                                ));
                            }
                        }
                    }
                }
                _ => {}
            }
            if let Some(is) = schema.get("items") {
                for (i, x) in items.iter().enumerate() {
                    errs.extend(list_types(is, x, &idx(i)));
                }
            }
        }
        _ => {}
    }
    errs
}

/// Indices of the second occurrence of each repeated value (`validateListSet`).
fn repeated(values: Vec<Value>) -> Vec<usize> {
    let mut seen: Vec<(Value, usize)> = Vec::new();
    let mut out = Vec::new();
    for (i, v) in values.into_iter().enumerate() {
        match seen.iter_mut().find(|(s, _)| *s == v) {
            Some((_, n)) => {
                *n += 1;
                if *n == 2 {
                    out.push(i);
                }
            }
            None => seen.push((v, 1)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    #[test]
    fn a_repeated_map_list_key_is_a_duplicate_at_its_index() {
        let s = json!({"type": "object", "properties": {"conditions": {"type": "array",
            "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"],
            "items": {"type": "object"}}}});
        let e = list_types(
            &s,
            &json!({"conditions": [{"type": "A"}, {"type": "B"}, {"type": "A"}]}),
            "",
        );
        assert_eq!(e.len(), 1);
        assert_eq!(
            e[0].message(),
            "conditions[2]: Duplicate value: map[string]interface {}{\"type\":\"A\"}"
        );
    }

    #[test]
    fn an_expensive_rule_makes_the_crd_invalid() {
        let crd = json!({"spec": {"group": "g", "names": {"plural": "ws", "kind": "W"}, "scope": "Namespaced",
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                "type": "object", "properties": {"spec": {"type": "object", "properties": {
                    "l": {"type": "array", "items": {"type": "string"},
                          "x-kubernetes-validations": [{"rule": "self.all(x, self.all(y, x == y))"}]}}}}}}}]}});
        let errs = compile_crd(&crd).unwrap_err();
        assert!(
            errs[0].message().starts_with(
                "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[l].x-kubernetes-validations[0].rule: \
                 Forbidden: estimated rule cost exceeds budget by factor of more than 100x"
            ),
            "{}",
            errs[0].message()
        );
    }
}
