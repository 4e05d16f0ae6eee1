//! `metadata` as the API server checks it on every create and update of any type
//! (apimachinery `api/validation.ValidateObjectMetaAccessor` / `…Update`): the name (or
//! `generateName`) by the type's name rule, label keys and values, annotation keys and total
//! size, owner references (apiVersion with a version, kind, name, uid; at most one
//! controller), finalizer names (qualified names; `orphan` and `foregroundDeletion` not both);
//! and the fields of `ObjectMeta` a custom resource may carry (unknown ones are dropped and
//! reported, as the server's decoder does).

use serde_json::{Map, Value};

use super::field::FieldError;

/// `ObjectMeta`'s fields (Kubernetes 1.33): any other key under `metadata` is dropped.
const OBJECT_META: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];

/// Largest total size of annotation keys and values (`TotalAnnotationSizeLimitB`).
const ANNOTATIONS_MAX: usize = 256 * 1024;

/// How a type's names are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NameRule {
    /// DNS-1123 subdomain (custom resources, most built-ins).
    Subdomain,
    /// DNS-1123 label (namespaces).
    Label,
    /// DNS-1035 label (services).
    Label1035,
}

impl NameRule {
    /// The rule of a built-in type (custom resources: [`NameRule::Subdomain`]).
    pub(crate) fn of_builtin(group: &str, plural: &str) -> Self {
        match (group, plural) {
            ("", "namespaces") => Self::Label,
            ("", "services") => Self::Label1035,
            _ => Self::Subdomain,
        }
    }

    fn check(self, name: &str, prefix: bool) -> Vec<String> {
        // NB: a generateName prefix may end in '-': the server masks it before checking.
        let masked;
        let name = if prefix && name.ends_with('-') {
            masked = format!("{}a", &name[..name.len() - 1]);
            masked.as_str()
        } else {
            name
        };
        match self {
            Self::Subdomain => dns1123_subdomain(name),
            Self::Label => dns1123_label(name),
            Self::Label1035 => dns1035_label(name),
        }
    }
}

fn re(pattern: &str, s: &str) -> bool {
    super::regex_match(pattern, s).unwrap_or(false)
}

const LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const QNAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";

fn max_len(n: usize) -> String {
    format!("must be no more than {n} characters")
}

fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    let ex: Vec<String> = examples.iter().map(|e| format!("'{e}', ")).collect();
    format!(
        "{msg} (e.g. {}regex used for validation is '{fmt}')",
        ex.join(" or ")
    )
}

pub(crate) fn dns1123_subdomain(v: &str) -> Vec<String> {
    let fmt = format!("{LABEL_FMT}(\\.{LABEL_FMT})*");
    let mut errs = Vec::new();
    if v.len() > 253 {
        errs.push(max_len(253));
    }
    if !re(&format!("^{fmt}$"), v) {
        errs.push(regex_error(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, \
             '-' or '.', and must start and end with an alphanumeric character",
            &fmt,
            &["example.com"],
        ));
    }
    errs
}

fn dns1123_label(v: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if v.len() > 63 {
        errs.push(max_len(63));
    }
    if !re(&format!("^{LABEL_FMT}$"), v) {
        if dns1123_subdomain(v).is_empty() {
            errs.push("must not contain dots".into());
        } else {
            errs.push(regex_error(
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or \
                 '-', and must start and end with an alphanumeric character",
                LABEL_FMT,
                &["my-name", "123-abc"],
            ));
        }
    }
    errs
}

fn dns1035_label(v: &str) -> Vec<String> {
    let fmt = "[a-z]([-a-z0-9]*[a-z0-9])?";
    let mut errs = Vec::new();
    if v.len() > 63 {
        errs.push(max_len(63));
    }
    if !re(&format!("^{fmt}$"), v) {
        errs.push(regex_error(
            "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start \
             with an alphabetic character, and end with an alphanumeric character",
            fmt,
            &["my-name", "abc-123"],
        ));
    }
    errs
}

/// `IsQualifiedName`: `[prefix/]name`.
pub(crate) fn qualified_name(v: &str) -> Vec<String> {
    let qname_err = "must consist of alphanumeric characters, '-', '_' or '.', and must start and \
                     end with an alphanumeric character";
    let parts: Vec<&str> = v.split('/').collect();
    let mut errs = Vec::new();
    let name = match parts.as_slice() {
        [n] => *n,
        [prefix, n] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_owned());
            } else {
                errs.extend(
                    dns1123_subdomain(prefix)
                        .into_iter()
                        .map(|m| format!("prefix part {m}")),
                );
            }
            *n
        }
        _ => {
            return vec![format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. \
                 'example.com/MyName')",
                regex_error(qname_err, QNAME_FMT, &["MyName", "my.name", "123-abc"])
            )];
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".into());
    } else if name.len() > 63 {
        errs.push(format!("name part {}", max_len(63)));
    }
    if !re(&format!("^{QNAME_FMT}$"), name) {
        errs.push(format!(
            "name part {}",
            regex_error(qname_err, QNAME_FMT, &["MyName", "my.name", "123-abc"])
        ));
    }
    errs
}

fn label_value(v: &str) -> Vec<String> {
    let fmt = format!("({QNAME_FMT})?");
    let mut errs = Vec::new();
    if v.len() > 63 {
        errs.push(max_len(63));
    }
    if !re(&format!("^{fmt}$"), v) {
        errs.push(regex_error(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', \
             '_' or '.', and must start and end with an alphanumeric character",
            &fmt,
            &["MyValue", "my_value", "12345"],
        ));
    }
    errs
}

/// Drops the keys of `metadata` that `ObjectMeta` does not have; returns their paths
/// (`metadata.foo`), as the decoder reports unknown fields.
pub(crate) fn prune(obj: &mut Value) -> Vec<String> {
    let Some(Value::Object(m)) = obj.get_mut("metadata") else {
        return Vec::new();
    };
    let unknown: Vec<String> = m
        .keys()
        .filter(|k| !OBJECT_META.contains(&k.as_str()))
        .cloned()
        .collect();
    for k in &unknown {
        m.remove(k);
    }
    unknown
        .into_iter()
        .map(|k| format!("metadata.{k}"))
        .collect()
}

fn strings_of<'a>(m: &'a Map<String, Value>, k: &str) -> Vec<(&'a str, &'a str)> {
    m.get(k)
        .and_then(Value::as_object)
        .map(|o| {
            o.iter()
                .map(|(k, v)| (k.as_str(), v.as_str().unwrap_or("")))
                .collect()
        })
        .unwrap_or_default()
}

/// The errors of `metadata` on a create (`update`: false) or an update.
pub(crate) fn validate(
    obj: &Value,
    rule: NameRule,
    namespaced: bool,
    update: bool,
) -> Vec<FieldError> {
    let empty = Map::new();
    let m = obj
        .get("metadata")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let s = |k: &str| m.get(k).and_then(Value::as_str).unwrap_or("");
    let mut errs = Vec::new();
    if !update {
        if !s("generateName").is_empty() {
            for msg in rule.check(s("generateName"), true) {
                errs.push(FieldError::invalid(
                    "metadata.generateName",
                    Value::String(s("generateName").into()),
                    msg,
                ));
            }
        }
        if s("name").is_empty() {
            errs.push(FieldError::required(
                "metadata.name",
                "name or generateName is required",
            ));
        } else {
            for msg in rule.check(s("name"), false) {
                errs.push(FieldError::invalid(
                    "metadata.name",
                    Value::String(s("name").into()),
                    msg,
                ));
            }
        }
        if namespaced && s("namespace").is_empty() {
            errs.push(FieldError::required("metadata.namespace", ""));
        } else if !namespaced && !s("namespace").is_empty() {
            errs.push(FieldError::forbidden(
                "metadata.namespace",
                "not allowed on this type",
            ));
        }
    }
    for (k, v) in strings_of(m, "labels") {
        for msg in qualified_name(k) {
            errs.push(FieldError::invalid(
                "metadata.labels",
                Value::String(k.into()),
                msg,
            ));
        }
        for msg in label_value(v) {
            errs.push(FieldError::invalid(
                "metadata.labels",
                Value::String(v.into()),
                msg,
            ));
        }
    }
    let annotations = strings_of(m, "annotations");
    for (k, _) in &annotations {
        for msg in qualified_name(&k.to_lowercase()) {
            errs.push(FieldError::invalid(
                "metadata.annotations",
                Value::String((*k).into()),
                msg,
            ));
        }
    }
    if annotations
        .iter()
        .map(|(k, v)| k.len() + v.len())
        .sum::<usize>()
        > ANNOTATIONS_MAX
    {
        errs.push(FieldError::too_long(
            "metadata.annotations",
            ANNOTATIONS_MAX as i64,
        ));
    }
    errs.extend(owner_references(m));
    if !update {
        errs.extend(finalizers(m));
    }
    errs
}

fn owner_references(m: &Map<String, Value>) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut controller: Option<String> = None;
    let refs = m
        .get("ownerReferences")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for r in &refs {
        let s = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("");
        let version = s("apiVersion").rsplit('/').next().unwrap_or("");
        let checks = [
            (
                "apiVersion",
                version.is_empty(),
                "version must not be empty",
            ),
            ("kind", s("kind").is_empty(), "kind must not be empty"),
            ("name", s("name").is_empty(), "name must not be empty"),
            ("uid", s("uid").is_empty(), "uid must not be empty"),
        ];
        for (f, bad, msg) in checks {
            if bad {
                errs.push(FieldError::invalid(
                    format!("metadata.ownerReferences.{f}"),
                    Value::String(s(f).into()),
                    msg,
                ));
            }
        }
        if r.get("controller").and_then(Value::as_bool) == Some(true) {
            let this = format!("{}/{}", s("kind"), s("name"));
            match &controller {
                Some(first) => errs.push(FieldError::invalid(
                    "metadata.ownerReferences",
                    Value::Array(refs.clone()),
                    format!(
                        "Only one reference can have Controller set to true. Found \"true\" in \
                         references for {first} and {this}"
                    ),
                )),
                None => controller = Some(this),
            }
        }
    }
    errs
}

fn finalizers(m: &Map<String, Value>) -> Vec<FieldError> {
    let list: Vec<&str> = m
        .get("finalizers")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut errs = Vec::new();
    for f in &list {
        for msg in qualified_name(f) {
            errs.push(FieldError::invalid(
                "metadata.finalizers",
                Value::String((*f).into()),
                msg,
            ));
        }
    }
    if list.contains(&"orphan") && list.contains(&"foregroundDeletion") {
        errs.push(FieldError::invalid(
            "metadata.finalizers",
            Value::Array(list.iter().map(|f| Value::String((*f).into())).collect()),
            "finalizer orphan and foregroundDeletion cannot be both set",
        ));
    }
    errs
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use serde_json::json;

    #[test]
    fn names_and_labels_are_checked_as_the_server_checks_them() {
        let o = json!({"metadata": {"name": "Bad_Name", "namespace": "d",
                      "labels": {"ok": "x".repeat(64)}}});
        let msgs: Vec<String> = validate(&o, NameRule::Subdomain, true, false)
            .iter()
            .map(FieldError::message)
            .collect();
        assert_eq!(msgs.len(), 2, "{msgs:?}");
        assert!(msgs[0].starts_with(
            "metadata.name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain must"
        ));
        assert!(msgs[0].ends_with("(e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"), "{}", msgs[0]);
        assert!(
            msgs[1].contains("must be no more than 63 characters"),
            "{}",
            msgs[1]
        );
        let ok = json!({"metadata": {"name": "pool-abc12", "namespace": "d",
                       "labels": {"egress-proxies.dev/pool": "web"}}});
        assert!(validate(&ok, NameRule::Subdomain, true, false).is_empty());
    }

    #[test]
    fn a_second_controller_reference_is_refused() {
        let r = |n: &str| json!({"apiVersion": "a/v1", "kind": "K", "name": n, "uid": "u", "controller": true});
        let o = json!({"metadata": {"name": "x", "ownerReferences": [r("a"), r("b")]}});
        let e = validate(&o, NameRule::Subdomain, false, false);
        assert_eq!(e.len(), 1);
        assert!(e[0].message().contains("Only one reference can have Controller set to true. Found \"true\" in references for K/a and K/b"));
    }

    #[test]
    fn unknown_metadata_fields_are_dropped() {
        let mut o = json!({"metadata": {"name": "x", "bogus": 1}});
        assert_eq!(prune(&mut o), vec!["metadata.bogus"]);
        assert_eq!(o, json!({"metadata": {"name": "x"}}));
    }
}
