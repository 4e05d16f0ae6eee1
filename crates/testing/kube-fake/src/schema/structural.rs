//! What the API server does to a custom resource's JSON before validating it, in its order
//! (apiextensions `unstructuredSchemaCoercer.apply`, then the `unstructuredDefaulter`):
//! 1. **pruning** (`schema/pruning`): a field the structural schema does not declare is
//!    dropped, unless `x-kubernetes-preserve-unknown-fields: true` holds at that level (its
//!    declared properties are still pruned inside); `apiVersion`, `kind` and `metadata` are kept
//!    at the root and in `x-kubernetes-embedded-resource` objects; the dropped fields' paths are
//!    returned (`spec.foo`, `spec.list[0].bar`, sorted), as `fieldValidation` reports them;
//! 2. **null pruning** (`PruneNonNullableNullsWithoutDefaults`): a `null` where the schema is not
//!    `nullable` and has no `default` is dropped;
//! 3. **defaulting** (`schema/defaulting.Default`): a missing property with a `default`, or a
//!    `null` one that is not `nullable`, gets the default (pruned by the schema first, as the
//!    server prunes defaults when it loads the CRD), then defaulting recurses into it; list items
//!    and `additionalProperties` values that are non-nullable `null`s get their schema's default.
//!
//! Only the structural parts of a node are followed: `properties`, `additionalProperties` and
//! `items` (never `anyOf`/`allOf`/…), as the structural schema the server derives holds them.

use serde_json::{Map, Value};

fn flag(s: &Value, k: &str) -> bool {
    s.get(k).and_then(Value::as_bool) == Some(true)
}

fn props(s: &Value) -> Option<&Map<String, Value>> {
    s.get("properties").and_then(Value::as_object)
}

fn additional(s: &Value) -> Option<&Value> {
    s.get("additionalProperties").filter(|a| a.is_object())
}

const META_FIELDS: &[&str] = &["apiVersion", "kind", "metadata"];

/// Prunes `obj` (a whole object: the root is an embedded resource) by `schema`; returns the
/// paths of the fields dropped, sorted.
pub(crate) fn prune(obj: &mut Value, schema: &Value) -> Vec<String> {
    let mut out = Vec::new();
    prune_at(obj, Some(schema), "", true, &mut out);
    out.sort();
    out
}

/// Prunes a value below the root (a default, a status) without reporting.
pub(crate) fn prune_quiet(v: &mut Value, schema: &Value) {
    let mut out = Vec::new();
    prune_at(v, Some(schema), "", false, &mut out);
}

fn join(path: &str, k: &str) -> String {
    if path.is_empty() {
        k.to_owned()
    } else {
        format!("{path}.{k}")
    }
}

fn prune_at(x: &mut Value, s: Option<&Value>, path: &str, root: bool, out: &mut Vec<String>) {
    if let Some(s) = s
        && flag(s, "x-kubernetes-preserve-unknown-fields")
    {
        skip_prune(x, s, path, root, out);
        return;
    }
    match x {
        Value::Object(m) => {
            let Some(s) = s else {
                for k in m.keys() {
                    out.push(join(path, k));
                }
                m.clear();
                return;
            };
            let embedded = root || flag(s, "x-kubernetes-embedded-resource");
            let keys: Vec<String> = m.keys().cloned().collect();
            for k in keys {
                if embedded && META_FIELDS.contains(&k.as_str()) {
                    continue;
                }
                let child = props(s).and_then(|p| p.get(&k)).or_else(|| additional(s));
                match (child, m.get_mut(&k)) {
                    (Some(cs), Some(v)) => prune_at(v, Some(cs), &join(path, &k), false, out),
                    _ => {
                        // NB: at the root, apiVersion/kind/metadata were kept above; elsewhere
                        // they are unknown fields like any other.
                        out.push(join(path, &k));
                        m.remove(&k);
                    }
                }
            }
        }
        Value::Array(items) => {
            let item_schema = s.and_then(|s| s.get("items"));
            for (i, v) in items.iter_mut().enumerate() {
                prune_at(v, item_schema, &format!("{path}[{i}]"), false, out);
            }
        }
        _ => {}
    }
}

fn skip_prune(x: &mut Value, s: &Value, path: &str, root: bool, out: &mut Vec<String>) {
    match x {
        Value::Object(m) => {
            let embedded = root || flag(s, "x-kubernetes-embedded-resource");
            for (k, v) in m.iter_mut() {
                if embedded && META_FIELDS.contains(&k.as_str()) {
                    continue;
                }
                if let Some(cs) = props(s).and_then(|p| p.get(k)).or_else(|| additional(s)) {
                    prune_at(v, Some(cs), &join(path, k), false, out);
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = s.get("items") {
                for (i, v) in items.iter_mut().enumerate() {
                    skip_prune(v, is, &format!("{path}[{i}]"), false, out);
                }
            }
        }
        _ => {}
    }
}

fn nullable(s: &Value) -> bool {
    flag(s, "nullable")
}

/// Drops `null`s the schema neither allows (`nullable`) nor defaults.
pub(crate) fn prune_nulls(x: &mut Value, s: Option<&Value>) {
    match x {
        Value::Object(m) => {
            let keys: Vec<String> = m.keys().cloned().collect();
            for k in keys {
                let cs = s.and_then(|s| props(s).and_then(|p| p.get(&k)).or_else(|| additional(s)));
                let drop = m.get(&k).is_some_and(Value::is_null)
                    && cs.is_some_and(|cs| !nullable(cs) && cs.get("default").is_none());
                if drop {
                    m.remove(&k);
                } else if let Some(v) = m.get_mut(&k) {
                    prune_nulls(v, cs);
                }
            }
        }
        Value::Array(items) => {
            let is = s.and_then(|s| s.get("items"));
            for v in items {
                prune_nulls(v, is);
            }
        }
        _ => {}
    }
}

fn pruned_default(s: &Value) -> Option<Value> {
    let mut d = s.get("default")?.clone();
    prune_quiet(&mut d, s);
    Some(d)
}

/// Applies the schema's defaults to `x` (see the module docs).
pub(crate) fn default(x: &mut Value, s: &Value) {
    match x {
        Value::Object(m) => {
            if let Some(p) = props(s) {
                for (k, ps) in p {
                    let missing = match m.get(k) {
                        None => true,
                        Some(v) => v.is_null() && !nullable(ps),
                    };
                    if missing && let Some(d) = pruned_default(ps) {
                        m.insert(k.clone(), d);
                    }
                }
            }
            let keys: Vec<String> = m.keys().cloned().collect();
            for k in keys {
                if let Some(ps) = props(s).and_then(|p| p.get(&k)) {
                    if let Some(v) = m.get_mut(&k) {
                        default(v, ps);
                    }
                } else if let Some(a) = additional(s)
                    && let Some(v) = m.get_mut(&k)
                {
                    if v.is_null()
                        && !nullable(a)
                        && let Some(d) = pruned_default(a)
                    {
                        *v = d;
                    }
                    default(v, a);
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = s.get("items") {
                for v in items.iter_mut() {
                    if v.is_null()
                        && !nullable(is)
                        && let Some(d) = pruned_default(is)
                    {
                        *v = d;
                    }
                    default(v, is);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "replicas": {"type": "integer", "default": 1},
            "proxy": {"type": "object", "default": {"port": 3128, "junk": 1}, "properties": {
                "port": {"type": "integer", "default": 3128},
                "protocol": {"type": "string", "default": "http"},
            }},
            "host": {"type": "string", "nullable": true},
            "image": {"type": "string"},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                     "properties": {"typed": {"type": "object", "properties": {"a": {"type": "string"}}}}},
            "list": {"type": "array", "items": {"type": "object", "properties": {"a": {"type": "string"}}}},
        }}}})
    }

    #[test]
    fn unknown_fields_are_pruned_except_root_metadata_and_preserved_levels() {
        let mut o = json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "n"},
            "spec": {"image": "i", "bogus": 1, "free": {"anything": 1, "typed": {"a": "x", "b": 2}},
                     "list": [{"a": "x", "c": 3}]},
            "top": true});
        let dropped = prune(&mut o, &schema());
        assert_eq!(
            dropped,
            vec!["spec.bogus", "spec.free.typed.b", "spec.list[0].c", "top"]
        );
        assert_eq!(o["spec"]["free"]["anything"], 1);
        assert_eq!(o["metadata"]["name"], "n");
    }

    #[test]
    fn defaults_fill_missing_and_non_nullable_null_fields_and_recurse() {
        let s = schema();
        let mut o = json!({"spec": {"image": "i", "host": null}});
        prune_nulls(&mut o, Some(&s));
        default(&mut o, &s);
        assert_eq!(
            o,
            json!({"spec": {"image": "i", "host": null, "replicas": 1,
                            "proxy": {"port": 3128, "protocol": "http"}}})
        );
        let mut o = json!({"spec": {"image": null, "replicas": null}});
        prune_nulls(&mut o, Some(&s));
        default(&mut o, &s);
        assert_eq!(
            o["spec"].get("image"),
            None,
            "a null without default is dropped"
        );
        assert_eq!(
            o["spec"]["replicas"], 1,
            "a non-nullable null with a default is defaulted"
        );
    }
}
