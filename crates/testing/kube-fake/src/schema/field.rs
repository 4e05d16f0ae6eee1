//! Field errors and the 422 `Invalid` Status built from them, worded byte for byte as the
//! Kubernetes API server words them (apimachinery `util/validation/field` `Error.Error()` and
//! `ErrorBody()`, `api/errors.NewInvalid`, `util/errors` aggregates): `PATH: TYPE: VALUE: DETAIL`
//! per error, `Kind.group "name" is invalid: E` for one error and `[E1, E2]` for several
//! (identical messages once), one `details.causes` entry per error with `reason` (the cause
//! type), `message` (the error without its path) and `field`.

use serde_json::{Value, json};

/// The type of a field error (apimachinery `field.ErrorType`; the string is the cause type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Required,
    Duplicate,
    Invalid,
    NotSupported,
    Forbidden,
    TooLong,
    TooMany,
    TypeInvalid,
}

impl Kind {
    /// The cause type (`details.causes[].reason`).
    pub(crate) fn cause(self) -> &'static str {
        match self {
            Self::Required => "FieldValueRequired",
            Self::Duplicate => "FieldValueDuplicate",
            Self::Invalid => "FieldValueInvalid",
            Self::NotSupported => "FieldValueNotSupported",
            Self::Forbidden => "FieldValueForbidden",
            Self::TooLong => "FieldValueTooLong",
            Self::TooMany => "FieldValueTooMany",
            Self::TypeInvalid => "FieldValueTypeInvalid",
        }
    }

    fn text(self) -> &'static str {
        match self {
            Self::Required => "Required value",
            Self::Duplicate => "Duplicate value",
            Self::Invalid | Self::TypeInvalid => "Invalid value",
            Self::NotSupported => "Unsupported value",
            Self::Forbidden => "Forbidden",
            Self::TooLong => "Too long",
            Self::TooMany => "Too many",
        }
    }

    /// Errors after which the server runs no CEL rule (apiextensions `hasBlockingErr`).
    pub(crate) fn blocks_cel(self) -> bool {
        matches!(
            self,
            Self::NotSupported | Self::Required | Self::TooLong | Self::TooMany | Self::TypeInvalid
        )
    }
}

/// What an error shows as its bad value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Bad {
    /// A JSON value, printed as Go prints the decoded value.
    Json(Value),
    /// Printed as a Go `int` (`TooMany`'s count).
    Count(i64),
    /// Not printed (`<value omitted>`).
    Omitted,
}

/// One field error.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FieldError {
    pub kind: Kind,
    /// The path as the server prints it (`spec.proxy.port`, `spec.x[0]`, `<nil>`).
    pub field: String,
    pub bad: Bad,
    pub detail: String,
}

impl FieldError {
    pub(crate) fn new(
        kind: Kind,
        field: impl Into<String>,
        bad: Bad,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            kind,
            field: field.into(),
            bad,
            detail: detail.into(),
        }
    }

    pub(crate) fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(Kind::Required, field, Bad::Omitted, detail)
    }

    pub(crate) fn invalid(field: impl Into<String>, bad: Value, detail: impl Into<String>) -> Self {
        Self::new(Kind::Invalid, field, Bad::Json(bad), detail)
    }

    pub(crate) fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(Kind::Forbidden, field, Bad::Omitted, detail)
    }

    /// `field.TooLong`: the value is never shown.
    pub(crate) fn too_long(field: impl Into<String>, max: i64) -> Self {
        let detail = if max >= 0 {
            format!("may not be more than {max} bytes")
        } else {
            "value is too long".to_owned()
        };
        Self::new(Kind::TooLong, field, Bad::Omitted, detail)
    }

    /// `field.TooMany`.
    pub(crate) fn too_many(field: impl Into<String>, actual: i64, max: i64) -> Self {
        let detail = if max >= 0 {
            format!("must have at most {max} items")
        } else {
            "has too many items".to_owned()
        };
        let bad = if actual >= 0 {
            Bad::Count(actual)
        } else {
            Bad::Omitted
        };
        Self::new(Kind::TooMany, field, bad, detail)
    }

    /// `field.NotSupported`: `supported values: "a", "b"`.
    pub(crate) fn not_supported(field: impl Into<String>, bad: Value, valid: &[String]) -> Self {
        let detail = if valid.is_empty() {
            String::new()
        } else {
            let quoted: Vec<String> = valid.iter().map(|v| go_quote(v)).collect();
            format!("supported values: {}", quoted.join(", "))
        };
        Self::new(Kind::NotSupported, field, Bad::Json(bad), detail)
    }

    /// The message without the path (`ErrorBody`), as a cause's `message`.
    pub(crate) fn body(&self) -> String {
        let mut s = match (&self.kind, &self.bad) {
            (Kind::Required | Kind::Forbidden | Kind::TooLong, _) | (_, Bad::Omitted) => {
                self.kind.text().to_owned()
            }
            (_, Bad::Count(n)) => format!("{}: {n}", self.kind.text()),
            (_, Bad::Json(v)) => format!("{}: {}", self.kind.text(), go_value(v, true)),
        };
        if !self.detail.is_empty() {
            s.push_str(": ");
            s.push_str(&self.detail);
        }
        s
    }

    /// `PATH: BODY`, as `Error()` prints it.
    pub(crate) fn message(&self) -> String {
        format!("{}: {}", self.field, self.body())
    }
}

/// A Go `%q` of a string: double quotes, Go escapes (close enough: JSON escapes, which agree
/// for everything but non-ASCII control characters).
pub(crate) fn go_quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("\"{s}\""))
}

/// How Go prints a decoded JSON value in a field error: simple types with `%v` (strings `%q`
/// at the top), anything else with `%#v` (`[]interface {}{...}`, `map[string]interface {}{...}`
/// with sorted keys).
fn go_value(v: &Value, top: bool) -> String {
    match v {
        Value::Null => {
            if top {
                "\"null\"".to_owned()
            } else {
                "interface {}(nil)".to_owned()
            }
        }
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => go_number(n),
        Value::String(s) => go_quote(s),
        Value::Array(a) => {
            let items: Vec<String> = a.iter().map(|x| go_value(x, false)).collect();
            format!("[]interface {{}}{{{}}}", items.join(", "))
        }
        Value::Object(m) => {
            let items: Vec<String> = m
                .iter()
                .map(|(k, x)| format!("{}:{}", go_quote(k), go_value(x, false)))
                .collect();
            format!("map[string]interface {{}}{{{}}}", items.join(", "))
        }
    }
}

/// A JSON number as Go prints the decoded `int64` or `float64` with `%v`.
pub(crate) fn go_number(n: &serde_json::Number) -> String {
    if let Some(i) = n.as_i64() {
        return i.to_string();
    }
    if let Some(u) = n.as_u64() {
        // NB: beyond int64 the API server's JSON decoder yields a float64.
        return go_float(u as f64);
    }
    go_float(n.as_f64().unwrap_or(0.0))
}

/// Go's `%v` of a float64 (`%g` with the shortest digits): exponent form when the decimal
/// exponent is below -4 or at least 6 (`1e+06`), plain otherwise (`65535`, `1.5`).
pub(crate) fn go_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        };
    }
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if f != 0.0 && !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exp.unsigned_abs());
    }
    let s = format!("{f}");
    s.strip_suffix(".0").map_or(s.clone(), str::to_owned)
}

/// The message and `details` of a 422 `Invalid` for `errs` of the object `name` of
/// `kind.group` (`api/errors.NewInvalid`).
pub(crate) fn invalid_status(
    group: &str,
    kind: &str,
    name: &str,
    errs: &[FieldError],
) -> (String, Value) {
    let qualified = if group.is_empty() {
        kind.to_owned()
    } else {
        format!("{kind}.{group}")
    };
    let mut seen = std::collections::BTreeSet::new();
    let msgs: Vec<String> = errs
        .iter()
        .map(FieldError::message)
        .filter(|m| seen.insert(m.clone()))
        .collect();
    let message = match msgs.as_slice() {
        [] => format!("{qualified} {} is invalid", go_quote(name)),
        [one] => format!("{qualified} {} is invalid: {one}", go_quote(name)),
        many => format!(
            "{qualified} {} is invalid: [{}]",
            go_quote(name),
            many.join(", ")
        ),
    };
    let causes: Vec<Value> = errs
        .iter()
        .map(|e| json!({"reason": e.kind.cause(), "message": e.body(), "field": e.field}))
        .collect();
    let mut details = json!({"name": name, "kind": kind, "causes": causes});
    if !group.is_empty()
        && let Some(o) = details.as_object_mut()
    {
        o.insert("group".into(), Value::String(group.to_owned()));
    }
    (message, details)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn errors_print_as_the_api_server_prints_them() {
        let e = FieldError::invalid(
            "spec.proxy.port",
            json!(70000),
            "spec.proxy.port in body should be less than or equal to 65535",
        );
        assert_eq!(
            e.message(),
            "spec.proxy.port: Invalid value: 70000: spec.proxy.port in body should be less than \
             or equal to 65535"
        );
        assert_eq!(
            FieldError::required("spec", "").message(),
            "spec: Required value"
        );
        assert_eq!(
            FieldError::too_long("spec.x", 45).message(),
            "spec.x: Too long: may not be more than 45 bytes"
        );
        assert_eq!(
            FieldError::too_many("spec.x", 3, 2).message(),
            "spec.x: Too many: 3: must have at most 2 items"
        );
        assert_eq!(
            FieldError::not_supported("p", json!("ftp"), &["http".into(), "socks5".into()])
                .message(),
            "p: Unsupported value: \"ftp\": supported values: \"http\", \"socks5\""
        );
        assert_eq!(
            FieldError::new(
                Kind::Duplicate,
                "c[1]",
                Bad::Json(json!({"type": "Ready"})),
                ""
            )
            .message(),
            "c[1]: Duplicate value: map[string]interface {}{\"type\":\"Ready\"}"
        );
        assert_eq!(
            FieldError::invalid("<nil>", Value::Null, "x").message(),
            "<nil>: Invalid value: \"null\": x"
        );
    }

    #[test]
    fn floats_print_as_go_prints_them() {
        assert_eq!(go_float(65535.0), "65535");
        assert_eq!(go_float(1.5), "1.5");
        assert_eq!(go_float(123456.0), "123456");
        assert_eq!(go_float(1e6), "1e+06");
        assert_eq!(go_float(1.25e21), "1.25e+21");
        assert_eq!(go_float(1e-5), "1e-05");
    }

    #[test]
    fn several_errors_are_bracketed_and_identical_ones_shown_once() {
        let a = FieldError::required("spec.a", "");
        let b = FieldError::required("spec.b", "");
        let (m, d) = invalid_status("example.dev", "Widget", "w", &[a.clone(), b, a]);
        assert_eq!(
            m,
            "Widget.example.dev \"w\" is invalid: [spec.a: Required value, spec.b: Required value]"
        );
        assert_eq!(d["causes"].as_array().unwrap().len(), 3);
        assert_eq!(d["causes"][0]["reason"], "FieldValueRequired");
        assert_eq!(d["group"], "example.dev");
    }
}
