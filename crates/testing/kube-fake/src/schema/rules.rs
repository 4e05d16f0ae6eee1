//! `x-kubernetes-validations` evaluated as the API server evaluates them (apiextensions
//! `schema/cel/validation.go`, Kubernetes 1.33), with the `cel` interpreter and the Kubernetes
//! CEL libraries of `kube-cel` (the kube-rs project's port of `k8s.io/apiserver/pkg/cel/library`
//! and cel-go's extensions: IP and CIDR, quantity, lists, strings, sets, regex, URLs, semver,
//! format). Hand-written here is only what the crates do not do the server's way: the walk, the
//! values, the messages and the cost budget.
//! - Rules are compiled when the CRD is stored ([`CelTree::compile`]); a rule or
//!   `messageExpression` that does not parse, a `fieldPath` that is not a simple path, or a rule
//!   whose estimated cost exceeds the per-expression limit (or all rules together the per-CRD
//!   limit, see [`super::cost`]) makes the CRD write a 422, worded as the server words it.
//! - `self` is the value at the rule's node (at the root: with `apiVersion`, `kind` and
//!   `metadata.name` / `generateName` only); object properties are reached by their escaped
//!   names (`__dash__`, `__dot__`, `__slash__`, `__underscores__`, `__{keyword}__`), maps with
//!   `additionalProperties` by their keys; `integer` is `int`, `number` is `double`,
//!   `format: date-time` / `duration` strings are timestamps / durations,
//!   `x-kubernetes-int-or-string` is an `int` or a `string`.
//! - Transition rules (using `oldSelf`) run only on updates and only where the old value can be
//!   correlated: object properties and `additionalProperties` (not in
//!   `x-kubernetes-map-type: atomic` maps), `x-kubernetes-list-type: map` items matched by their
//!   keys; never items of other lists. `optionalOldSelf: true` rules also run without an old
//!   value, `oldSelf` then `optional.none()` (else `optional.of(old)`).
//! - A rule that is false gives `Invalid value: "TYPE": MESSAGE` at its node's path (plus its
//!   `fieldPath`), or `Forbidden` / `Required` / `Duplicate` per `reason`; MESSAGE is the
//!   `messageExpression`'s result (trimmed; empty, multi-line, over 5 KiB or failing: the
//!   `message` instead), else `message`, else `failed rule: RULE`. An evaluation error is
//!   `ERROR evaluating rule: MESSAGE-OR-RULE` (the error text is the `cel` crate's, not
//!   cel-go's).
//! - Cost: each rule's runtime cost (see [`super::cost`]) above the per-call limit (1,000,000)
//!   stops validation with `call cost exceeds limit`, the sum over all rules of one object above
//!   the runtime budget (10,000,000) with `validation failed due to running out of cost budget`.
//!
//! - Ratcheting (on by default since 1.30): on an update, a rule without `oldSelf` that fails on
//!   a value equal to its correlated old value is not an error (the server sends a warning).
//!
//! Not modelled: type-checking rules at CRD creation (cel-go refuses `self.nosuchfield`; here it
//! fails when evaluated), `cel.bind`, `sortBy` and two-variable comprehensions (the `cel` crate
//! lacks them: such a rule fails to evaluate).

use std::collections::BTreeMap;
use std::sync::Arc;

use cel::objects::{Key, Map as CelMap, OptionalValue};
use cel::{Context, Program, Value as Cel};
use kube::core::cel::KubeCelExt;
use serde_json::Value;

use super::cost;
use super::field::{Bad, FieldError, Kind};

/// Per-call runtime cost limit (`celconfig.PerCallLimit`).
pub(crate) const PER_CALL_LIMIT: u64 = 1_000_000;
/// Runtime cost budget of all rules of one object (`celconfig.RuntimeCELCostBudget`).
pub(crate) const RUNTIME_BUDGET: u64 = 10_000_000;
/// Longest `messageExpression` result (`celconfig.MaxEvaluatedMessageExpressionSizeBytes`).
const MAX_MESSAGE: usize = 5 * 1024;

/// One compiled rule.
pub(crate) struct Rule {
    pub rule: String,
    pub program: Program,
    pub message: Option<String>,
    pub message_expression: Option<(String, Program)>,
    pub reason: Option<String>,
    pub field_path: Option<String>,
    pub optional_old_self: bool,
    pub uses_old_self: bool,
}

impl std::fmt::Debug for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rule")
            .field("rule", &self.rule)
            .finish_non_exhaustive()
    }
}

/// The rules of a schema, shaped as the schema.
#[derive(Debug, Default)]
pub(crate) struct CelTree {
    /// The node's schema (for types and value conversion).
    pub schema: Value,
    pub rules: Vec<Rule>,
    pub properties: BTreeMap<String, CelTree>,
    pub additional: Option<Box<CelTree>>,
    pub items: Option<Box<CelTree>>,
    pub all_of: Vec<CelTree>,
    /// Whether any rule is at or below this node.
    pub any: bool,
}

/// The schema `type` as the server names it in errors (`""` for int-or-string).
fn type_name(s: &Value) -> String {
    s.get("type")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned()
}

impl CelTree {
    /// Compiles every rule of `schema`; the errors are the CRD's (paths under `base`, e.g.
    /// `spec.validation.openAPIV3Schema`, worded as the server's CRD validation).
    pub(crate) fn compile(schema: &Value, base: &str) -> (Self, Vec<FieldError>) {
        let mut errs = Vec::new();
        let tree = Self::node(schema, base, &mut errs);
        (tree, errs)
    }

    fn node(schema: &Value, path: &str, errs: &mut Vec<FieldError>) -> Self {
        let mut t = Self {
            schema: schema.clone(),
            ..Self::default()
        };
        let rules = schema
            .get("x-kubernetes-validations")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for (i, r) in rules.iter().enumerate() {
            let at = format!("{path}.x-kubernetes-validations[{i}]");
            if let Some(rule) = compile_rule(r, &at, errs) {
                t.rules.push(rule);
            }
        }
        if let Some(p) = schema.get("properties").and_then(Value::as_object) {
            for (k, s) in p {
                t.properties.insert(
                    k.clone(),
                    Self::node(s, &format!("{path}.properties[{k}]"), errs),
                );
            }
        }
        if let Some(a) = schema.get("additionalProperties").filter(|a| a.is_object()) {
            t.additional = Some(Box::new(Self::node(
                a,
                &format!("{path}.additionalProperties"),
                errs,
            )));
        }
        if let Some(i) = schema.get("items").filter(|i| i.is_object()) {
            t.items = Some(Box::new(Self::node(i, &format!("{path}.items"), errs)));
        }
        if let Some(all) = schema.get("allOf").and_then(Value::as_array) {
            for (n, s) in all.iter().enumerate() {
                t.all_of
                    .push(Self::node(s, &format!("{path}.allOf[{n}]"), errs));
            }
        }
        t.any = !t.rules.is_empty()
            || t.properties.values().any(|c| c.any)
            || t.additional.as_ref().is_some_and(|c| c.any)
            || t.items.as_ref().is_some_and(|c| c.any)
            || t.all_of.iter().any(|c| c.any);
        t
    }
}

fn compile_rule(r: &Value, at: &str, errs: &mut Vec<FieldError>) -> Option<Rule> {
    let s = |k: &str| r.get(k).and_then(Value::as_str).map(str::to_owned);
    let Some(rule) = s("rule").filter(|x| !x.trim().is_empty()) else {
        errs.push(FieldError::required(format!("{at}.rule"), ""));
        return None;
    };
    let program = match Program::compile(&rule) {
        Ok(p) => p,
        Err(e) => {
            errs.push(FieldError::invalid(
                format!("{at}.rule"),
                Value::String(rule.clone()),
                format!("compilation failed: {e}"),
            ));
            return None;
        }
    };
    let message_expression = match s("messageExpression") {
        None => None,
        Some(m) => match Program::compile(&m) {
            Ok(p) => Some((m, p)),
            Err(e) => {
                errs.push(FieldError::invalid(
                    format!("{at}.messageExpression"),
                    Value::String(m.clone()),
                    format!("messageExpression compilation failed: {e}"),
                ));
                return None;
            }
        },
    };
    let field_path = s("fieldPath");
    if let Some(fp) = &field_path
        && !valid_field_path(fp)
    {
        errs.push(FieldError::invalid(
            format!("{at}.fieldPath"),
            Value::String(fp.clone()),
            "fieldPath must be a valid path",
        ));
        return None;
    }
    let uses_old_self = program.references().has_variable("oldSelf");
    Some(Rule {
        rule,
        program,
        message: s("message").filter(|m| !m.is_empty()),
        message_expression,
        reason: s("reason"),
        field_path,
        optional_old_self: r.get("optionalOldSelf").and_then(Value::as_bool) == Some(true),
        uses_old_self,
    })
}

/// A `fieldPath` the server accepts: `.a.b`, `.a['b']`, `.list[0]`-free simple paths.
fn valid_field_path(fp: &str) -> bool {
    super::regex_match(r"^(\.[A-Za-z_][A-Za-z0-9_]*|\['[^']*'\])+$", fp).unwrap_or(false)
}

/// `.a['b'].c` → `a.b.c` (the server's normalized child path).
fn normalize_field_path(fp: &str) -> String {
    let mut out = String::new();
    for part in fp.split(['.', '[']).filter(|p| !p.is_empty()) {
        let part = part.trim_end_matches(']').trim_matches('\'');
        if !out.is_empty() {
            out.push('.');
        }
        out.push_str(part);
    }
    out
}

const CEL_RESERVED: &[&str] = &[
    "true",
    "false",
    "null",
    "in",
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
];

/// The CEL name of a property (`None`: not accessible from CEL).
pub(crate) fn escape(name: &str) -> Option<String> {
    if CEL_RESERVED.contains(&name) {
        return Some(format!("__{name}__"));
    }
    let ok_start = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || "_.-/".contains(c));
    if !ok_start
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-/".contains(c))
    {
        return None;
    }
    Some(
        name.replace("__", "__underscores__")
            .replace('.', "__dot__")
            .replace('-', "__dash__")
            .replace('/', "__slash__"),
    )
}

/// A JSON value as a CEL value under `schema`.
pub(crate) fn to_cel(v: &Value, schema: Option<&Value>) -> Cel {
    let s = schema.filter(|s| s.is_object());
    let ty = s
        .and_then(|s| s.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let format = s
        .and_then(|s| s.get("format"))
        .and_then(Value::as_str)
        .unwrap_or("");
    match v {
        Value::Null => Cel::Null,
        Value::Bool(b) => Cel::Bool(*b),
        Value::Number(n) => {
            if ty == "number" {
                Cel::Float(n.as_f64().unwrap_or(0.0))
            } else if let Some(i) = n.as_i64() {
                Cel::Int(i)
            } else if let Some(u) = n.as_u64() {
                Cel::UInt(u)
            } else {
                Cel::Float(n.as_f64().unwrap_or(0.0))
            }
        }
        Value::String(x) => {
            if format == "date-time"
                && let Ok(t) = chrono::DateTime::parse_from_rfc3339(x)
            {
                return Cel::Timestamp(t);
            }
            if format == "duration"
                && let Some(d) = parse_duration(x)
            {
                return Cel::Duration(d);
            }
            Cel::String(Arc::new(x.clone()))
        }
        Value::Array(a) => {
            let is = s.and_then(|s| s.get("items"));
            Cel::List(Arc::new(a.iter().map(|x| to_cel(x, is)).collect()))
        }
        Value::Object(m) => {
            let props = s
                .and_then(|s| s.get("properties"))
                .and_then(Value::as_object);
            let extra = s
                .and_then(|s| s.get("additionalProperties"))
                .filter(|a| a.is_object());
            let mut out: std::collections::HashMap<Key, Cel> = std::collections::HashMap::new();
            for (k, x) in m {
                let (name, child) = match (props.and_then(|p| p.get(k)), extra) {
                    (Some(ps), _) => (escape(k), Some(ps)),
                    (None, Some(a)) => (Some(k.clone()), Some(a)),
                    // NB: preserved unknown fields are reached by their names as they are.
                    (None, None) => (Some(k.clone()), None),
                };
                if let Some(name) = name {
                    out.insert(Key::String(Arc::new(name)), to_cel(x, child));
                }
            }
            Cel::Map(CelMap { map: Arc::new(out) })
        }
    }
}

/// Go's `time.ParseDuration` for the common forms (`1h30m`, `10s`, `1.5h`).
fn parse_duration(s: &str) -> Option<chrono::Duration> {
    let re = regex::Regex::new(r"([0-9]*\.?[0-9]+)(ns|us|µs|ms|s|m|h)").ok()?;
    let (neg, body) = match s.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if body.is_empty() || !re.replace_all(body, "").is_empty() {
        return None;
    }
    let mut nanos = 0f64;
    for c in re.captures_iter(body) {
        let n: f64 = c.get(1)?.as_str().parse().ok()?;
        let unit = match c.get(2)?.as_str() {
            "ns" => 1.0,
            "us" | "µs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            _ => 3600e9,
        };
        nanos += n * unit;
    }
    let d = chrono::Duration::nanoseconds(nanos as i64);
    Some(if neg { -d } else { d })
}

/// The root `self`: the object with `apiVersion`, `kind` and `metadata` holding only `name`
/// and `generateName` (what rules at the root may read).
fn root_value(obj: &Value, schema: &Value) -> Cel {
    let mut o = obj.clone();
    if let Some(m) = o.as_object_mut() {
        let meta: serde_json::Map<String, Value> = m
            .get("metadata")
            .and_then(Value::as_object)
            .map(|md| {
                md.iter()
                    .filter(|(k, _)| *k == "name" || *k == "generateName")
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default();
        m.insert("metadata".into(), Value::Object(meta));
    }
    let mut s = schema.clone();
    if let Some(p) = s.as_object_mut().map(|o| {
        o.entry("properties")
            .or_insert_with(|| Value::Object(Default::default()))
    }) && let Some(p) = p.as_object_mut()
    {
        p.entry("apiVersion")
            .or_insert_with(|| serde_json::json!({"type": "string"}));
        p.entry("kind")
            .or_insert_with(|| serde_json::json!({"type": "string"}));
        p.entry("metadata").or_insert_with(|| {
            serde_json::json!({"type": "object", "properties": {
                "name": {"type": "string"}, "generateName": {"type": "string"}}})
        });
    }
    to_cel(&o, Some(&s))
}

thread_local! {
    /// The Kubernetes CEL libraries, registered once per thread (a few hundred functions:
    /// registering them per write would cost more than most rules).
    static BASE: Context<'static> = base_context();
}

fn base_context() -> Context<'static> {
    let mut ctx = Context::default().with_all();
    // NB: Kubernetes' `isCIDR` parses with Go's `netip.ParsePrefix`, which refuses an IPv4
    // octet with a leading zero (`010.0.0.0/8`); kube-cel's parser takes it. Refused here as
    // the server refuses it.
    ctx.add_function("isCIDR", |s: Arc<String>| -> bool { is_cidr_strict(&s) });
    ctx
}

/// The evaluation of one object's rules.
pub(crate) struct Eval {
    /// Runtime cost left.
    pub budget: u64,
    /// Stopped by a cost limit: no further rule runs.
    pub stopped: bool,
    pub errors: Vec<FieldError>,
}

impl Eval {
    pub(crate) fn new() -> Self {
        Self {
            budget: RUNTIME_BUDGET,
            stopped: false,
            errors: Vec::new(),
        }
    }

    /// Runs the rules of `tree` for `obj` (the whole object; `old` on updates), errors under
    /// `prefix` (`None`: the object's root; `Some("status")` for a status write's own schema).
    pub(crate) fn run(
        &mut self,
        tree: &CelTree,
        obj: &Value,
        old: Option<&Value>,
        prefix: Option<&str>,
    ) {
        BASE.with(|ctx| self.walk(ctx, tree, obj, old, prefix.unwrap_or(""), prefix.is_none()));
    }

    fn walk(
        &mut self,
        ctx: &Context<'_>,
        t: &CelTree,
        v: &Value,
        old: Option<&Value>,
        path: &str,
        root: bool,
    ) {
        if self.stopped || !t.any || v.is_null() {
            return;
        }
        let old = old.filter(|o| !o.is_null());
        if !t.rules.is_empty() {
            self.rules(ctx, t, v, old, path, root);
            if self.stopped {
                return;
            }
        }
        for a in &t.all_of {
            self.walk(ctx, a, v, old, path, false);
        }
        match v {
            Value::Object(m) => {
                let correlatable = t
                    .schema
                    .get("x-kubernetes-map-type")
                    .and_then(Value::as_str)
                    != Some("atomic");
                for (k, x) in m {
                    let child = t.properties.get(k).or(t.additional.as_deref());
                    if let Some(c) = child {
                        let o = if correlatable {
                            old.and_then(|o| o.get(k))
                        } else {
                            None
                        };
                        self.walk(ctx, c, x, o, &child_path(path, k), false);
                    }
                }
            }
            Value::Array(items) => {
                if let Some(it) = &t.items {
                    let keys = map_keys(&t.schema);
                    for (i, x) in items.iter().enumerate() {
                        let o = keys.as_ref().and_then(|ks| correlate(ks, x, old));
                        self.walk(ctx, it, x, o, &format!("{path}[{i}]"), false);
                    }
                }
            }
            _ => {}
        }
    }

    fn rules(
        &mut self,
        ctx: &Context<'_>,
        t: &CelTree,
        v: &Value,
        old: Option<&Value>,
        path: &str,
        root: bool,
    ) {
        let self_val = if root {
            root_value(v, &t.schema)
        } else {
            to_cel(v, Some(&t.schema))
        };
        let old_val = old.map(|o| {
            if root {
                root_value(o, &t.schema)
            } else {
                to_cel(o, Some(&t.schema))
            }
        });
        let ty = type_name(&t.schema);
        let at = if path.is_empty() {
            "<nil>".to_owned()
        } else {
            path.to_owned()
        };
        for rule in &t.rules {
            if rule.uses_old_self && old_val.is_none() && !rule.optional_old_self {
                continue;
            }
            let mut scope = ctx.new_inner_scope();
            scope.add_variable_from_value("self", self_val.clone());
            if rule.optional_old_self {
                let o = match &old_val {
                    Some(o) => OptionalValue::of(o.clone()),
                    None => OptionalValue::none(),
                };
                scope.add_variable_from_value("oldSelf", Cel::Opaque(Arc::new(o)));
            } else if let Some(o) = &old_val {
                scope.add_variable_from_value("oldSelf", o.clone());
            }
            let spent = cost::runtime(&rule.program, &t.schema, v, old);
            if spent > PER_CALL_LIMIT {
                self.errors.push(FieldError::invalid(
                    &at,
                    Value::String(ty.clone()),
                    format!(
                        "'operation cancelled: actual cost limit exceeded': no further validation \
                         rules will be run due to call cost exceeds limit for rule: {}",
                        rule_error_string(rule)
                    ),
                ));
                self.stopped = true;
                return;
            }
            if spent > self.budget {
                self.errors.push(FieldError::invalid(
                    &at,
                    Value::String(ty.clone()),
                    "validation failed due to running out of cost budget, no further validation \
                     rules will be run",
                ));
                self.stopped = true;
                return;
            }
            self.budget -= spent;
            let result = rule.program.execute(&scope);
            let target = match &rule.field_path {
                Some(fp) => child_path(path, &normalize_field_path(fp)),
                None => at.clone(),
            };
            match result {
                Ok(Cel::Bool(true)) => {}
                // Ratcheting: a non-transition rule failing on a value that did not change is
                // only a warning on a real server (dropped here).
                Ok(Cel::Bool(false)) if !rule.uses_old_self && old == Some(v) => {}
                Ok(Cel::Bool(false)) => {
                    let (message, spent) = message(rule, &scope, &t.schema, v, old);
                    self.budget = self.budget.saturating_sub(spent);
                    self.errors
                        .push(for_reason(&target, &ty, message, rule.reason.as_deref()));
                }
                Ok(other) => self.errors.push(FieldError::invalid(
                    &at,
                    Value::String(ty.clone()),
                    format!(
                        "'no such overload: {other:?}': call arguments did not match a supported \
                         operator, function or macro signature for rule: {}",
                        rule_error_string(rule)
                    ),
                )),
                Err(e) => self.errors.push(FieldError::invalid(
                    &at,
                    Value::String(ty.clone()),
                    format!("{e} evaluating rule: {}", rule_error_string(rule)),
                )),
            }
        }
    }
}

/// The message of a failed rule, and the cost its `messageExpression` took.
fn message(
    rule: &Rule,
    scope: &Context<'_>,
    schema: &Value,
    v: &Value,
    old: Option<&Value>,
) -> (String, u64) {
    let fallback = || match &rule.message {
        Some(m) => m.trim().to_owned(),
        None => format!("failed rule: {}", rule_error_string(rule)),
    };
    let Some((_, program)) = &rule.message_expression else {
        return (fallback(), 0);
    };
    let spent = cost::runtime(program, schema, v, old);
    let text = match program.execute(scope) {
        Ok(Cel::String(s)) => {
            let m = s.trim();
            if m.is_empty() || m.len() > MAX_MESSAGE || m.contains(['\n', '\r']) {
                fallback()
            } else {
                m.to_owned()
            }
        }
        _ => fallback(),
    };
    (text, spent)
}

/// `isCIDR` as Kubernetes' IP library: `netip.ParsePrefix` (no IPv4 leading zeros, no zone),
/// IPv4-mapped IPv6 refused.
fn is_cidr_strict(s: &str) -> bool {
    let Some((addr, bits)) = s.split_once('/') else {
        return false;
    };
    if bits.is_empty()
        || !bits.bytes().all(|b| b.is_ascii_digit())
        || (bits.len() > 1 && bits.starts_with('0'))
    {
        return false;
    }
    let Ok(n) = bits.parse::<u8>() else {
        return false;
    };
    match addr.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => {
            n <= 32 && addr.split('.').all(|o| o == "0" || !o.starts_with('0'))
        }
        Ok(std::net::IpAddr::V6(v6)) => {
            n <= 128 && v6.to_ipv4_mapped().is_none() && !addr.contains('.')
        }
        Err(_) => false,
    }
}

fn child_path(path: &str, k: &str) -> String {
    if path.is_empty() {
        k.to_owned()
    } else {
        format!("{path}.{k}")
    }
}

fn rule_error_string(r: &Rule) -> String {
    match &r.message {
        Some(m) => m.trim().to_owned(),
        None => r.rule.trim().to_owned(),
    }
}

fn for_reason(path: &str, ty: &str, detail: String, reason: Option<&str>) -> FieldError {
    match reason {
        Some("FieldValueForbidden") => FieldError::forbidden(path, detail),
        Some("FieldValueRequired") => FieldError::required(path, detail),
        Some("FieldValueDuplicate") => FieldError::new(
            Kind::Duplicate,
            path,
            Bad::Json(Value::String(ty.to_owned())),
            "",
        ),
        _ => FieldError::invalid(path, Value::String(ty.to_owned()), detail),
    }
}

/// The keys of an `x-kubernetes-list-type: map` list.
fn map_keys(schema: &Value) -> Option<Vec<String>> {
    if schema.get("x-kubernetes-list-type").and_then(Value::as_str) != Some("map") {
        return None;
    }
    Some(
        schema
            .get("x-kubernetes-list-map-keys")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default(),
    )
}

/// The old item with the same map keys as `item`.
fn correlate<'a>(keys: &[String], item: &Value, old: Option<&'a Value>) -> Option<&'a Value> {
    old?.as_array()?
        .iter()
        .find(|o| keys.iter().all(|k| o.get(k) == item.get(k)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use serde_json::json;

    fn run(schema: Value, obj: Value, old: Option<Value>) -> Vec<String> {
        let (tree, errs) = CelTree::compile(&schema, "s");
        assert!(errs.is_empty(), "{errs:?}");
        let mut e = Eval::new();
        e.run(&tree, &obj, old.as_ref(), None);
        e.errors.iter().map(FieldError::message).collect()
    }

    fn spec(rules: Value, props: Value) -> Value {
        json!({"type": "object", "properties": {"spec": {
            "type": "object", "x-kubernetes-validations": rules, "properties": props}}})
    }

    #[test]
    fn a_false_rule_reports_its_message_at_its_path_with_the_schema_type() {
        let s = spec(
            json!([{"rule": "self.a > 1", "message": "a must be above 1"}]),
            json!({"a": {"type": "integer"}}),
        );
        assert_eq!(
            run(s.clone(), json!({"spec": {"a": 1}}), None),
            vec!["spec: Invalid value: \"object\": a must be above 1"]
        );
        assert!(run(s, json!({"spec": {"a": 2}}), None).is_empty());
    }

    #[test]
    fn message_expression_reason_and_field_path_are_honoured() {
        let s = spec(
            json!([{"rule": "self.a > 1", "messageExpression": "'a is ' + string(self.a)",
                    "reason": "FieldValueForbidden", "fieldPath": ".a"},
                   {"rule": "self.a > 5"},
                   {"rule": "self.a > 5", "messageExpression": "''", "message": "fallback"}]),
            json!({"a": {"type": "integer"}}),
        );
        assert_eq!(
            run(s, json!({"spec": {"a": 1}}), None),
            vec![
                "spec.a: Forbidden: a is 1",
                "spec: Invalid value: \"object\": failed rule: self.a > 5",
                "spec: Invalid value: \"object\": fallback",
            ]
        );
    }

    #[test]
    fn transition_rules_run_on_updates_only() {
        let s = json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "p": {"type": "string", "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "immutable"}]}}}}});
        assert!(run(s.clone(), json!({"spec": {"p": "a"}}), None).is_empty());
        assert_eq!(
            run(
                s.clone(),
                json!({"spec": {"p": "b"}}),
                Some(json!({"spec": {"p": "a"}}))
            ),
            vec!["spec.p: Invalid value: \"string\": immutable"]
        );
        assert!(
            run(
                s,
                json!({"spec": {"p": "a"}}),
                Some(json!({"spec": {"p": "a"}}))
            )
            .is_empty()
        );
    }

    #[test]
    fn kubernetes_library_functions_are_available() {
        let s = json!({"type": "object", "properties": {"l": {"type": "array", "maxItems": 4,
            "items": {"type": "string", "maxLength": 64},
            "x-kubernetes-validations": [
                {"rule": "self.all(c, isCIDR(c))", "message": "cidr"},
                {"rule": "size(self) < 2 || ip(cidr(self[0]).ip().string()).family() == 4", "message": "family"}]}}});
        assert!(
            run(
                s.clone(),
                json!({"l": ["10.0.0.0/8", "2001:db8::/32"]}),
                None
            )
            .is_empty()
        );
        assert_eq!(
            run(s, json!({"l": ["nope"]}), None),
            vec!["l: Invalid value: \"array\": cidr"]
        );
    }

    #[test]
    fn is_cidr_refuses_what_go_netip_refuses() {
        assert!(is_cidr_strict("10.0.0.0/8"));
        assert!(is_cidr_strict("2001:db8::/32"));
        assert!(!is_cidr_strict("010.0.0.0/8"));
        assert!(!is_cidr_strict("::ffff:10.0.0.0/104"));
        assert!(!is_cidr_strict("10.0.0.0/33"));
        assert!(!is_cidr_strict("10.0.0.0"));
        let s = json!({"type": "array", "x-kubernetes-validations": [{"rule": "self.all(c, isCIDR(c))", "message": "m"}]});
        assert_eq!(
            run(s, json!(["010.0.0.0/8"]), None),
            vec!["<nil>: Invalid value: \"array\": m"]
        );
    }

    #[test]
    fn escaped_property_names_reach_their_fields() {
        assert_eq!(escape("foo-bar").as_deref(), Some("foo__dash__bar"));
        assert_eq!(escape("namespace").as_deref(), Some("__namespace__"));
        assert_eq!(escape("if").as_deref(), Some("__if__"));
        assert_eq!(escape("a__b").as_deref(), Some("a__underscores__b"));
        assert_eq!(escape("1x"), None);
    }
}
