//! OpenAPI value validation of a custom resource against its CRD's schema, as the API server's
//! validator (kube-openapi `pkg/validation/validate`, the version Kubernetes 1.33 uses) checks
//! it, with its messages and its quirks:
//! - per schema node, in this order: `type` (with `nullable` and `x-kubernetes-int-or-string`),
//!   `anyOf`/`oneOf`/`allOf`/`not`, `maxLength` / `minLength` / `pattern` (the first failing
//!   one only; lengths count characters), `format`, `minimum` / `maximum` (`exclusive…`) /
//!   `multipleOf`, the items then `minItems` / `maxItems` / `uniqueItems`, `enum`, then
//!   `minProperties` / `maxProperties`, `additionalProperties: false`, the properties and
//!   `required`;
//! - a check applies only to the JSON kind it is about: `minimum` never refuses a string and
//!   `pattern` never refuses a number, so the branches of an `anyOf` without `type` accept every
//!   value of the other kind (the server does the same);
//! - only the formats Kubernetes supports are checked (`StripUnsupportedFormatsPostProcessor`:
//!   `int32`, `uint32`, `int64`… are ignored); see [`super::formats`];
//! - each failure becomes the field error `kubeOpenAPIResultToFieldErrors` makes of it
//!   (`Required value`, `Unsupported value`, `Too long`, `Too many`, `Invalid value` with the
//!   validator's sentence as detail);
//! - ratcheting (`CRDValidationRatcheting`, on by default since 1.30): on an update, the errors
//!   of a node whose value equals its correlated old value (object fields by name,
//!   `x-kubernetes-list-type: map` items by key) are dropped.
//!
//! Not modelled: `$ref`, `patternProperties`, `dependencies`, `additionalItems` (none is
//! allowed in a structural CRD schema), and which failing `anyOf`/`oneOf` branch's errors are
//! reported (kube-openapi picks the branch with the most passed checks; this picks the one with
//! the fewest errors).

use serde_json::{Map, Value};

use super::field::{Bad, FieldError, Kind, go_float, go_quote};
use super::formats;

/// One kube-openapi validation failure (its `Validation` or composite error).
#[derive(Debug, Clone)]
struct OErr {
    code: Code,
    /// The path the validator names (`spec.x`, `.spec` for a required root field).
    name: String,
    /// The offending value as the validator holds it (`None`: Go nil).
    value: Option<Value>,
    /// The bound (`maxLength`, `maxItems`, `maxProperties`).
    valid: i64,
    /// `enum` values.
    values: Vec<Value>,
    message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Code {
    InvalidType,
    Required,
    TooLong,
    Enum,
    MaxItems,
    TooManyProperties,
    /// Everything reported as `Invalid value` with the sentence as detail.
    Other,
    /// Composite errors (`anyOf`, `oneOf`, `allOf`, `not`): reported on the parent path.
    Composite,
}

fn err(code: Code, name: &str, value: Option<Value>, message: String) -> OErr {
    OErr {
        code,
        name: name.to_owned(),
        value,
        valid: -1,
        values: Vec::new(),
        message,
    }
}

/// Validates `data` against `schema`; the field errors are under `prefix` (`None` for the
/// whole object, `Some("status")` for a status update).
pub(crate) fn validate(
    schema: &Value,
    data: &Value,
    old: Option<&Value>,
    prefix: Option<&str>,
) -> Vec<FieldError> {
    let mut out = Vec::new();
    node(schema, data, old, "", &mut out);
    out.into_iter().map(|e| to_field_error(e, prefix)).collect()
}

fn to_field_error(e: OErr, prefix: Option<&str>) -> FieldError {
    let child = e.name.trim_start_matches('.');
    let path = match (prefix, e.code) {
        (p, Code::Composite) => p.unwrap_or("<nil>").to_owned(),
        (None, _) if e.name.is_empty() || e.name == "." => "<nil>".to_owned(),
        (None, _) => child.to_owned(),
        (Some(p), _) if e.name.is_empty() || e.name == "." => p.to_owned(),
        (Some(p), _) => format!("{p}.{child}"),
    };
    let value_or_empty = || e.value.clone().unwrap_or(Value::String(String::new()));
    match e.code {
        Code::Required => FieldError::required(path, ""),
        Code::Enum => {
            let valid: Vec<String> = e
                .values
                .iter()
                .map(|v| match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect();
            FieldError::not_supported(path, e.value.unwrap_or(Value::Null), &valid)
        }
        Code::TooLong => FieldError::too_long(path, e.valid),
        Code::MaxItems | Code::TooManyProperties => {
            let actual = e.value.as_ref().and_then(Value::as_i64).unwrap_or(-1);
            FieldError::too_many(path, actual, e.valid)
        }
        Code::InvalidType => FieldError::new(
            Kind::TypeInvalid,
            path,
            Bad::Json(value_or_empty()),
            e.message,
        ),
        Code::Other | Code::Composite => FieldError::invalid(path, value_or_empty(), e.message),
    }
}

/// The JSON kind of a value as kube-openapi names it.
fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::String(_) => "string",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn types_of(schema: &Value) -> Vec<&str> {
    if schema
        .get("x-kubernetes-int-or-string")
        .and_then(Value::as_bool)
        == Some(true)
    {
        return vec!["integer", "string"];
    }
    schema
        .get("type")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .into_iter()
        .collect()
}

fn child_name(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

fn is_float_int(v: &Value) -> bool {
    v.as_f64()
        .is_some_and(|f| f.fract() == 0.0 && f.is_finite())
}

/// Validates one node; `old` is the correlated old value on updates: errors of a node whose
/// value did not change are dropped (CRD validation ratcheting, on by default since 1.30).
fn node(schema: &Value, data: &Value, old: Option<&Value>, path: &str, out: &mut Vec<OErr>) {
    if !schema.is_object() {
        return;
    }
    let mut mine = Vec::new();
    node_checks(schema, data, old, path, &mut mine);
    if !mine.is_empty() && old == Some(data) {
        return;
    }
    out.extend(mine);
}

fn node_checks(schema: &Value, data: &Value, old: Option<&Value>, path: &str, out: &mut Vec<OErr>) {
    if data.is_null() {
        type_check(schema, data, path, out);
        enum_check(schema, data, path, out);
        return;
    }
    type_check(schema, data, path, out);
    combinators(schema, data, old, path, out);
    if let Value::String(s) = data {
        string_checks(schema, s, path, out);
        if let Some(f) = formats::supported(schema)
            && !formats::valid(f, s)
        {
            out.push(err(
                Code::InvalidType,
                path,
                Some(data.clone()),
                format!("{path} in body must be of type {f}: {}", go_quote(s)),
            ));
        }
    }
    if data.is_number() {
        number_checks(schema, data, path, out);
    }
    if let Value::Array(items) = data {
        array_checks(schema, items, old, path, out);
    }
    enum_check(schema, data, path, out);
    if let Value::Object(m) = data {
        object_checks(schema, m, old, path, out);
    }
}

fn type_check(schema: &Value, data: &Value, path: &str, out: &mut Vec<OErr>) {
    let types = types_of(schema);
    let format = formats::supported(schema);
    if types.is_empty() && format.is_none() {
        return;
    }
    let joined = types.join(",");
    let fail = |what: &str| {
        err(
            Code::InvalidType,
            path,
            Some(Value::String(what.to_owned())),
            format!(
                "{path} in body must be of type {joined}: {}",
                go_quote(what)
            ),
        )
    };
    if data.is_null() {
        let nullable = schema.get("nullable").and_then(Value::as_bool) == Some(true);
        if !types.is_empty() && !types.contains(&"null") && !nullable {
            out.push(fail("null"));
        }
        return;
    }
    let kind = kind_of(data);
    let numeric = types.contains(&"number") || types.contains(&"integer");
    if !numeric && format.is_some() && (data.is_string() || data.is_array()) {
        // NB: kube-openapi skips the type check of a string or array when a format is set.
        return;
    }
    let float_int = kind == "number" && is_float_int(data) && types.contains(&"integer");
    let int_float = kind == "integer" && types.contains(&"number");
    if !(types.contains(&kind) || float_int || int_float) {
        out.push(fail(kind));
    }
}

fn combinators(schema: &Value, data: &Value, old: Option<&Value>, path: &str, out: &mut Vec<OErr>) {
    let branches = |k: &str| -> Vec<Vec<OErr>> {
        schema
            .get(k)
            .and_then(Value::as_array)
            .map(|bs| {
                bs.iter()
                    .map(|b| {
                        let mut e = Vec::new();
                        node(b, data, old, path, &mut e);
                        e
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let fewest = |rs: &[Vec<OErr>]| {
        rs.iter()
            .filter(|r| !r.is_empty())
            .min_by_key(|r| r.len())
            .cloned()
    };
    let composite = |msg: String| err(Code::Composite, path, None, msg);
    let any = branches("anyOf");
    if !any.is_empty() && !any.iter().any(Vec::is_empty) {
        out.push(composite(format!(
            "{} must validate at least one schema (anyOf)",
            go_quote(path)
        )));
        out.extend(fewest(&any).unwrap_or_default());
    }
    let one = branches("oneOf");
    if !one.is_empty() {
        let valid = one.iter().filter(|r| r.is_empty()).count();
        if valid != 1 {
            let extra = if valid == 0 {
                "Found none valid".to_owned()
            } else {
                format!("Found {valid} valid alternatives")
            };
            out.push(composite(format!(
                "{} must validate one and only one schema (oneOf). {extra}",
                go_quote(path)
            )));
            if valid == 0 {
                out.extend(fewest(&one).unwrap_or_default());
            }
        }
    }
    let all = branches("allOf");
    if !all.is_empty() {
        let valid = all.iter().filter(|r| r.is_empty()).count();
        for r in &all {
            out.extend(r.iter().cloned());
        }
        if valid != all.len() {
            let extra = if valid == 0 { ". None validated" } else { "" };
            out.push(composite(format!(
                "{} must validate all the schemas (allOf){extra}",
                go_quote(path)
            )));
        }
    }
    if let Some(not) = schema.get("not") {
        let mut e = Vec::new();
        node(not, data, None, path, &mut e);
        if e.is_empty() {
            out.push(composite(format!(
                "{} must not validate the schema (not)",
                go_quote(path)
            )));
        }
    }
}

fn int_of(schema: &Value, k: &str) -> Option<i64> {
    schema
        .get(k)
        .and_then(|v| v.as_i64().or_else(|| v.as_f64().map(|f| f as i64)))
}

fn string_checks(schema: &Value, s: &str, path: &str, out: &mut Vec<OErr>) {
    let len = i64::try_from(s.chars().count()).unwrap_or(i64::MAX);
    let data = Some(Value::String(s.to_owned()));
    if let Some(max) = int_of(schema, "maxLength")
        && len > max
    {
        let mut e = err(
            Code::TooLong,
            path,
            data,
            format!("{path} in body should be at most {max} chars long"),
        );
        e.valid = max;
        out.push(e);
        return;
    }
    if let Some(min) = int_of(schema, "minLength")
        && len < min
    {
        out.push(err(
            Code::Other,
            path,
            data,
            format!("{path} in body should be at least {min} chars long"),
        ));
        return;
    }
    if let Some(p) = schema.get("pattern").and_then(Value::as_str) {
        let ok = match super::regex_match(p, s) {
            Ok(m) => m,
            Err(e) => {
                out.push(err(
                    Code::Other,
                    path,
                    data,
                    format!("{path} in body should match '{p}, but pattern is invalid: {e}'"),
                ));
                return;
            }
        };
        if !ok {
            out.push(err(
                Code::Other,
                path,
                data,
                format!("{path} in body should match '{p}'"),
            ));
        }
    }
}

/// `%v` of a bound as the validator prints it: an integer bound against integer data, the
/// float otherwise.
fn bound_text(bound: f64, data_is_int: bool) -> String {
    if data_is_int {
        (bound as i64).to_string()
    } else {
        go_float(bound)
    }
}

fn number_checks(schema: &Value, data: &Value, path: &str, out: &mut Vec<OErr>) {
    let is_int = data.is_i64() || data.is_u64();
    let x = data.as_f64().unwrap_or(0.0);
    let flag = |k: &str| schema.get(k).and_then(Value::as_bool) == Some(true);
    if let Some(m) = schema.get("multipleOf").and_then(Value::as_f64)
        && m > 0.0
        && (x / m).fract() != 0.0
    {
        out.push(err(
            Code::Other,
            path,
            Some(data.clone()),
            format!(
                "{path} in body should be a multiple of {}",
                bound_text(m, is_int)
            ),
        ));
    }
    if let Some(min) = schema.get("minimum").and_then(Value::as_f64) {
        let excl = flag("exclusiveMinimum");
        let (lo, bound) = if is_int { (x, min.trunc()) } else { (x, min) };
        if (!excl && lo < bound) || (excl && lo <= bound) {
            let op = if excl {
                "greater than"
            } else {
                "greater than or equal to"
            };
            out.push(err(
                Code::Other,
                path,
                Some(data.clone()),
                format!("{path} in body should be {op} {}", bound_text(min, is_int)),
            ));
        }
    }
    if let Some(max) = schema.get("maximum").and_then(Value::as_f64) {
        let excl = flag("exclusiveMaximum");
        let (hi, bound) = if is_int { (x, max.trunc()) } else { (x, max) };
        if (!excl && hi > bound) || (excl && hi >= bound) {
            let op = if excl {
                "less than"
            } else {
                "less than or equal to"
            };
            out.push(err(
                Code::Other,
                path,
                Some(data.clone()),
                format!("{path} in body should be {op} {}", bound_text(max, is_int)),
            ));
        }
    }
}

fn array_checks(
    schema: &Value,
    items: &[Value],
    old: Option<&Value>,
    path: &str,
    out: &mut Vec<OErr>,
) {
    if let Some(item_schema) = schema.get("items").filter(|s| s.is_object()) {
        for (i, item) in items.iter().enumerate() {
            let o = correlate_item(schema, item, old);
            node(item_schema, item, o, &format!("{path}[{i}]"), out);
        }
    }
    let size = i64::try_from(items.len()).unwrap_or(i64::MAX);
    if let Some(min) = int_of(schema, "minItems")
        && size < min
    {
        out.push(err(
            Code::Other,
            path,
            Some(Value::from(size)),
            format!("{path} in body should have at least {min} items"),
        ));
    }
    if let Some(max) = int_of(schema, "maxItems")
        && size > max
    {
        let mut e = err(
            Code::MaxItems,
            path,
            Some(Value::from(size)),
            format!("{path} in body should have at most {max} items"),
        );
        e.valid = max;
        out.push(e);
    }
    if schema.get("uniqueItems").and_then(Value::as_bool) == Some(true) {
        let dup = items
            .iter()
            .enumerate()
            .any(|(i, a)| items.iter().skip(i + 1).any(|b| a == b));
        if dup {
            out.push(err(
                Code::Other,
                path,
                None,
                format!("{path} in body shouldn't contain duplicates"),
            ));
        }
    }
}

/// JSON equality as the enum check sees it (a decoded integer equals the same float).
fn enum_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

fn enum_check(schema: &Value, data: &Value, path: &str, out: &mut Vec<OErr>) {
    let Some(values) = schema
        .get("enum")
        .and_then(Value::as_array)
        .filter(|v| !v.is_empty())
    else {
        return;
    };
    // NB: kube-openapi never matches a null value against an enum, even one listing null.
    if !data.is_null() && values.iter().any(|v| enum_equal(data, v)) {
        return;
    }
    let mut e = err(
        Code::Enum,
        path,
        if data.is_null() {
            None
        } else {
            Some(data.clone())
        },
        format!("{path} in body should be one of {}", go_list(values)),
    );
    e.values = values.clone();
    out.push(e);
}

/// Go's `%v` of a `[]interface{}` of enum values.
fn go_list(values: &[Value]) -> String {
    let items: Vec<String> = values
        .iter()
        .map(|v| match v {
            Value::String(s) => s.clone(),
            Value::Number(n) => super::field::go_number(n),
            other => other.to_string(),
        })
        .collect();
    format!("[{}]", items.join(" "))
}

/// The old item of an `x-kubernetes-list-type: map` list with the same keys (other lists'
/// items are not correlated, so never ratcheted).
fn correlate_item<'a>(schema: &Value, item: &Value, old: Option<&'a Value>) -> Option<&'a Value> {
    if schema.get("x-kubernetes-list-type").and_then(Value::as_str) != Some("map") {
        return None;
    }
    let keys: Vec<&str> = schema
        .get("x-kubernetes-list-map-keys")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    old?.as_array()?
        .iter()
        .find(|o| keys.iter().all(|k| o.get(*k) == item.get(*k)))
}

fn object_checks(
    schema: &Value,
    m: &Map<String, Value>,
    old: Option<&Value>,
    path: &str,
    out: &mut Vec<OErr>,
) {
    let n = i64::try_from(m.len()).unwrap_or(i64::MAX);
    if let Some(min) = int_of(schema, "minProperties")
        && n < min
    {
        out.push(err(
            Code::Other,
            path,
            Some(Value::from(n)),
            format!("{path} in body should have at least {min} properties"),
        ));
    }
    if let Some(max) = int_of(schema, "maxProperties")
        && n > max
    {
        let mut e = err(
            Code::TooManyProperties,
            path,
            Some(Value::from(n)),
            format!("{path} in body should have at most {max} properties"),
        );
        e.valid = max;
        out.push(e);
    }
    let props = schema.get("properties").and_then(Value::as_object);
    let known = |k: &str| props.is_some_and(|p| p.contains_key(k));
    match schema.get("additionalProperties") {
        Some(Value::Bool(false)) => {
            for k in m.keys().filter(|k| !known(k)) {
                out.push(err(
                    Code::Other,
                    path,
                    Some(Value::String(k.clone())),
                    format!("{path}.{k} in body is a forbidden property"),
                ));
            }
        }
        Some(extra @ Value::Object(_)) => {
            for (k, v) in m.iter().filter(|(k, _)| !known(k)) {
                node(
                    extra,
                    v,
                    old.and_then(|o| o.get(k)),
                    &format!("{path}.{k}"),
                    out,
                );
            }
        }
        _ => {}
    }
    if let Some(props) = props {
        for (k, s) in props {
            if let Some(v) = m.get(k) {
                node(s, v, old.and_then(|o| o.get(k)), &child_name(path, k), out);
            }
        }
    }
    for k in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if !m.contains_key(k) {
            out.push(err(
                Code::Required,
                &format!("{path}.{k}"),
                None,
                format!("{path}.{k} in body is required"),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use serde_json::json;

    fn msgs(schema: Value, data: Value) -> Vec<String> {
        validate(&schema, &data, None, None)
            .iter()
            .map(FieldError::message)
            .collect()
    }

    #[test]
    fn bounds_types_and_enums_are_worded_as_the_server_words_them() {
        let s = json!({"type": "object", "required": ["spec"], "properties": {"spec": {
        "type": "object", "required": ["image"], "properties": {
            "port": {"type": "integer", "minimum": 1.0, "maximum": 65535.0},
            "image": {"type": "string", "minLength": 1},
            "mode": {"type": "string", "enum": ["http", "socks5"]},
            "tags": {"type": "array", "maxItems": 2, "items": {"type": "string", "maxLength": 3}},
            "ref": {"type": "string", "pattern": "^[a-z]+$"},
        }}}});
        assert_eq!(msgs(s.clone(), json!({})), vec!["spec: Required value"]);
        assert_eq!(
            msgs(
                s.clone(),
                json!({"spec": {"image": "", "port": 70000, "mode": "ftp", "tags": ["a", "b", "long"], "ref": "A"}})
            ),
            vec![
                "spec.image: Invalid value: \"\": spec.image in body should be at least 1 chars long",
                "spec.mode: Unsupported value: \"ftp\": supported values: \"http\", \"socks5\"",
                "spec.port: Invalid value: 70000: spec.port in body should be less than or equal to 65535",
                "spec.ref: Invalid value: \"A\": spec.ref in body should match '^[a-z]+$'",
                "spec.tags[2]: Too long: may not be more than 3 bytes",
                "spec.tags: Too many: 3: must have at most 2 items",
            ]
        );
        assert_eq!(
            msgs(s.clone(), json!({"spec": {"image": "x", "port": "80"}})),
            vec![
                "spec.port: Invalid value: \"string\": spec.port in body must be of type integer: \"string\""
            ]
        );
        assert_eq!(
            msgs(s, json!({"spec": {"image": null}})),
            vec![
                "spec.image: Invalid value: \"null\": spec.image in body must be of type string: \"null\""
            ]
        );
    }

    #[test]
    fn an_any_of_without_types_accepts_every_value_of_the_other_kind() {
        let s = json!({"x-kubernetes-int-or-string": true,
                       "anyOf": [{"minimum": 0.0}, {"pattern": "^(100|[1-9]?[0-9])%$"}]});
        assert!(validate(&s, &json!(-1), None, None).is_empty());
        assert!(validate(&s, &json!("abc"), None, None).is_empty());
        assert_eq!(
            msgs(s, json!(true)),
            vec![
                "<nil>: Invalid value: \"boolean\":  in body must be of type integer,string: \"boolean\""
            ]
        );
    }

    #[test]
    fn an_integral_float_is_an_integer_and_null_passes_when_nullable() {
        let s = json!({"type": "integer", "nullable": true, "minimum": 1.0});
        assert!(validate(&s, &json!(3.0), None, None).is_empty());
        assert!(validate(&s, &Value::Null, None, None).is_empty());
        assert_eq!(validate(&s, &json!(0), None, None).len(), 1);
    }

    #[test]
    fn unchanged_invalid_values_are_ratcheted_on_updates() {
        let s = json!({"type": "object", "properties": {
            "a": {"type": "integer", "maximum": 5.0}, "b": {"type": "integer", "maximum": 5.0}}});
        let old = json!({"a": 9, "b": 1});
        assert!(validate(&s, &json!({"a": 9, "b": 2}), Some(&old), None).is_empty());
        assert_eq!(
            validate(&s, &json!({"a": 9, "b": 7}), Some(&old), None).len(),
            1
        );
        assert_eq!(validate(&s, &json!({"a": 9, "b": 2}), None, None).len(), 1);
    }

    #[test]
    fn status_errors_are_under_the_status_path() {
        let s = json!({"type": "object", "properties": {"replicas": {"type": "integer", "minimum": 0.0}}});
        let e = validate(&s, &json!({"replicas": -1}), None, Some("status"));
        assert_eq!(
            e[0].message(),
            "status.replicas: Invalid value: -1: replicas in body should be greater than or equal to 0"
        );
    }
}
