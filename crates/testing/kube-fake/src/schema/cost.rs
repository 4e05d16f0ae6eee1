//! The cost of CEL rules, by the model the API server uses (cel-go's `checker/cost.go` with the
//! Kubernetes library costs and size estimates of apiextensions `schema/cel/model`), so the
//! documented limits hold in the fake:
//! - when a CRD is written, each rule's **estimated** cost — its worst case given the schema's
//!   `maxItems` / `maxLength` / `maxProperties` (unbounded: as many as fit in a 3 MiB request)
//!   times how often it can run (the bounds of the lists and maps above it) — must stay within
//!   10,000,000, and all rules together within 100,000,000, else the CRD is refused with the
//!   server's `estimated rule cost exceeds budget by factor of …` / `… total for entire
//!   OpenAPIv3 schema` errors;
//! - when an object is validated, each rule's **runtime** cost — the same model over the
//!   object's actual sizes — is charged against the per-call limit and the object's budget
//!   (see [`super::rules`]).
//!
//! The model: identifiers and field selections cost 1, literals 0, list literals 10 and map
//! literals 30 plus their elements, a function call 1 plus its arguments (string functions
//! and comparisons a tenth of the strings' length, `matches` a quarter, the Kubernetes parsing
//! functions `ip`, `cidr`, `isIP`, `isCIDR`, `quantity`, `url`… a tenth of their argument),
//! `&&` / `||` both sides, `?:` the condition and the dearer branch, a comprehension (`all`,
//! `exists`, `map`, `filter`…) its range plus, for each element, its condition and step.
//! Approximation: the numbers follow cel-go's structure, not every one of its constants; the
//! runtime cost does not credit short-circuits (it is an upper bound of cel-go's).

use cel::common::ast::{EntryExpr, Expr, IdedExpr};
use serde_json::Value;

/// Per-expression estimated cost limit (`StaticEstimatedCostLimit`).
pub(crate) const STATIC_LIMIT: u64 = 10_000_000;
/// Estimated cost limit of all rules of a CRD version (`StaticEstimatedCRDCostLimit`).
pub(crate) const STATIC_CRD_LIMIT: u64 = 100_000_000;
/// Largest request the size estimates assume (`celconfig.MaxRequestSizeBytes`).
const MAX_REQUEST: u64 = 3 * 1024 * 1024;

/// What an expression's value is known to be: its schema and, at runtime, the value itself.
#[derive(Clone, Copy)]
struct Shape<'a> {
    schema: Option<&'a Value>,
    value: Option<&'a Value>,
}

const UNKNOWN: Shape<'static> = Shape {
    schema: None,
    value: None,
};

/// The smallest JSON a value of `schema` serializes to (for unbounded list estimates).
fn min_size(schema: Option<&Value>) -> u64 {
    match schema.and_then(|s| s.get("type")).and_then(Value::as_str) {
        Some("boolean") => 4,
        Some("integer" | "number") => 1,
        _ => 2,
    }
}

impl<'a> Shape<'a> {
    fn runtime(self) -> bool {
        self.value.is_some()
    }

    /// The length of a string or the element count of a list or map.
    fn size(self) -> u64 {
        if let Some(v) = self.value {
            return match v {
                Value::String(s) => s.chars().count() as u64,
                Value::Array(a) => a.len() as u64,
                Value::Object(m) => m.len() as u64,
                _ => 1,
            };
        }
        let Some(s) = self.schema else {
            return MAX_REQUEST;
        };
        let bound = |k: &str| {
            s.get(k)
                .and_then(|v| v.as_u64().or_else(|| v.as_f64().map(|f| f as u64)))
        };
        match s.get("type").and_then(Value::as_str) {
            Some("string") => bound("maxLength").unwrap_or(MAX_REQUEST - 2),
            Some("array") => {
                bound("maxItems").unwrap_or((MAX_REQUEST - 2) / (min_size(s.get("items")) + 1))
            }
            Some("object") => bound("maxProperties")
                .unwrap_or((MAX_REQUEST - 2) / (min_size(s.get("additionalProperties")) + 4)),
            _ => 1,
        }
    }

    fn field(self, k: &str) -> Shape<'a> {
        let schema = self.schema.and_then(|s| {
            s.get("properties")
                .and_then(|p| p.get(unescape(k)))
                .or_else(|| s.get("additionalProperties").filter(|a| a.is_object()))
        });
        Shape {
            schema,
            value: self.value.and_then(|v| v.get(unescape(k))),
        }
    }

    fn element(self) -> Shape<'a> {
        Shape {
            schema: self
                .schema
                .and_then(|s| s.get("items").or_else(|| s.get("additionalProperties"))),
            value: None,
        }
    }

    /// Runtime element shapes (one per element), or one estimated element shape.
    fn elements(self) -> Vec<Shape<'a>> {
        match self.value {
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| Shape {
                    schema: self.schema.and_then(|s| s.get("items")),
                    value: Some(v),
                })
                .collect(),
            Some(Value::Object(m)) => m
                .keys()
                .map(|_| Shape {
                    schema: None,
                    value: None,
                })
                .collect(),
            _ => vec![self.element()],
        }
    }
}

fn unescape(k: &str) -> String {
    k.replace("__dash__", "-")
        .replace("__dot__", ".")
        .replace("__slash__", "/")
        .replace("__underscores__", "__")
}

fn tenth(n: u64) -> u64 {
    n.div_ceil(10)
}

struct Scope<'a> {
    vars: Vec<(String, Shape<'a>)>,
}

impl<'a> Scope<'a> {
    fn get(&self, name: &str) -> Shape<'a> {
        self.vars
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map_or(UNKNOWN, |(_, s)| *s)
    }
}

/// (cost, shape of the result).
fn cost<'a>(e: &IdedExpr, scope: &mut Scope<'a>) -> (u64, Shape<'a>) {
    match &e.expr {
        Expr::Unspecified | Expr::Literal(_) => (0, UNKNOWN),
        Expr::Ident(name) => (1, scope.get(name)),
        Expr::Select(s) => {
            let (c, shape) = cost(&s.operand, scope);
            (c.saturating_add(1), shape.field(&s.field))
        }
        Expr::List(l) => {
            let sum = l
                .elements
                .iter()
                .map(|x| cost(x, scope).0)
                .fold(10u64, u64::saturating_add);
            (sum, UNKNOWN)
        }
        Expr::Map(m) => {
            let mut sum = 30u64;
            for entry in &m.entries {
                if let EntryExpr::MapEntry(me) = &entry.expr {
                    sum = sum
                        .saturating_add(cost(&me.key, scope).0)
                        .saturating_add(cost(&me.value, scope).0);
                }
            }
            (sum, UNKNOWN)
        }
        Expr::Struct(s) => {
            let mut sum = 40u64;
            for entry in &s.entries {
                if let EntryExpr::StructField(f) = &entry.expr {
                    sum = sum.saturating_add(cost(&f.value, scope).0);
                }
            }
            (sum, UNKNOWN)
        }
        Expr::Call(c) => call(&c.func_name, c.target.as_deref(), &c.args, scope),
        Expr::Comprehension(c) => {
            let (range_cost, range) = cost(&c.iter_range, scope);
            let (init_cost, _) = cost(&c.accu_init, scope);
            let mut total = range_cost.saturating_add(init_cost);
            // NB: one step is costed with the largest element (or the estimated one) and
            // multiplied by the element count: linear in the range, never its square for nested
            // comprehensions.
            let elements = range.elements();
            let n = if range.runtime() {
                elements.len() as u64
            } else {
                range.size()
            };
            if let Some(el) = elements
                .iter()
                .max_by_key(|e| if e.value.is_some() { e.size() } else { 0 })
            {
                scope.vars.push((c.iter_var.clone(), *el));
                scope.vars.push((c.accu_var.clone(), UNKNOWN));
                let step = cost(&c.loop_cond, scope)
                    .0
                    .saturating_add(cost(&c.loop_step, scope).0);
                scope.vars.truncate(scope.vars.len() - 2);
                total = total.saturating_add(step.saturating_mul(n));
            }
            scope.vars.push((c.accu_var.clone(), UNKNOWN));
            total = total.saturating_add(cost(&c.result, scope).0);
            scope.vars.pop();
            (total, UNKNOWN)
        }
    }
}

/// Functions whose cost is a tenth of their (first string) argument's length.
const PARSERS: &[&str] = &[
    "ip",
    "isIP",
    "cidr",
    "isCIDR",
    "quantity",
    "isQuantity",
    "url",
    "isURL",
    "semver",
    "isSemver",
    "contains",
    "startsWith",
    "endsWith",
    "lowerAscii",
    "upperAscii",
    "trim",
    "split",
    "replace",
    "indexOf",
    "lastIndexOf",
    "substring",
    "charAt",
    "find",
    "findAll",
];

fn call<'a>(
    name: &str,
    target: Option<&IdedExpr>,
    args: &[IdedExpr],
    scope: &mut Scope<'a>,
) -> (u64, Shape<'a>) {
    let mut shapes = Vec::new();
    let mut sum = 0u64;
    if let Some(t) = target {
        let (c, s) = cost(t, scope);
        sum = sum.saturating_add(c);
        shapes.push(s);
    }
    let mut arg_costs = Vec::new();
    for a in args {
        let (c, s) = cost(a, scope);
        arg_costs.push(c);
        shapes.push(s);
    }
    let first = shapes.first().copied().unwrap_or(UNKNOWN);
    match name {
        "_?_:_" => {
            let cond = arg_costs.first().copied().unwrap_or(0);
            let branch = arg_costs.iter().skip(1).copied().max().unwrap_or(0);
            (sum.saturating_add(cond).saturating_add(branch), UNKNOWN)
        }
        "_&&_" | "_||_" => (sum.saturating_add(arg_costs.iter().sum::<u64>()), UNKNOWN),
        "_[_]" => {
            let elem = first.element();
            let shape = match (first.value, args.get(1).map(|a| &a.expr)) {
                (Some(Value::Array(a)), _) => Shape {
                    schema: elem.schema,
                    value: a.first(),
                },
                _ => elem,
            };
            (
                sum.saturating_add(arg_costs.iter().sum::<u64>())
                    .saturating_add(1),
                shape,
            )
        }
        "_==_" | "_!=_" | "_<_" | "_<=_" | "_>_" | "_>=_" | "_+_" => {
            let sizes: Vec<u64> = shapes
                .iter()
                .filter(|s| s.schema.is_some() || s.value.is_some())
                .map(|s| s.size())
                .collect();
            let extra = if name == "_+_" {
                tenth(sizes.iter().sum())
            } else {
                tenth(sizes.iter().copied().min().unwrap_or(0))
            };
            (
                sum.saturating_add(arg_costs.iter().sum::<u64>())
                    .saturating_add(1)
                    .saturating_add(extra),
                UNKNOWN,
            )
        }
        "matches" => {
            let extra = first.size().div_ceil(4);
            (
                sum.saturating_add(arg_costs.iter().sum::<u64>())
                    .saturating_add(1)
                    .saturating_add(extra),
                UNKNOWN,
            )
        }
        n if PARSERS.contains(&n) => {
            let extra = tenth(first.size());
            (
                sum.saturating_add(arg_costs.iter().sum::<u64>())
                    .saturating_add(1)
                    .saturating_add(extra),
                UNKNOWN,
            )
        }
        _ => (
            sum.saturating_add(arg_costs.iter().sum::<u64>())
                .saturating_add(1),
            UNKNOWN,
        ),
    }
}

fn with_self<'a>(
    program: &cel::Program,
    schema: &'a Value,
    v: Option<&'a Value>,
    old: Option<&'a Value>,
) -> u64 {
    let shape = Shape {
        schema: Some(schema),
        value: v,
    };
    let old_shape = Shape {
        schema: Some(schema),
        value: old.or(v),
    };
    let mut scope = Scope {
        vars: vec![("self".into(), shape), ("oldSelf".into(), old_shape)],
    };
    cost(program.expression(), &mut scope).0
}

/// The estimated (worst-case) cost of one evaluation of `program` at a node of `schema`.
pub(crate) fn estimate(program: &cel::Program, schema: &Value) -> u64 {
    with_self(program, schema, None, None)
}

/// The cost of evaluating `program` on the value `v` (and `old`) of a node of `schema`.
pub(crate) fn runtime(
    program: &cel::Program,
    schema: &Value,
    v: &Value,
    old: Option<&Value>,
) -> u64 {
    with_self(program, schema, Some(v), old)
}

/// How many times a rule at a node below these ancestors can run: the product of the bounds
/// of the lists and maps on the way (`items` / `additionalProperties` steps).
pub(crate) fn cardinality(ancestors: &[&Value]) -> u64 {
    ancestors.iter().fold(1u64, |acc, s| {
        acc.saturating_mul(
            Shape {
                schema: Some(s),
                value: None,
            }
            .size(),
        )
    })
}

/// The server's wording of an exceeded limit (`getCostErrorMessage`).
pub(crate) fn exceeded(what: &str, cost: u64, limit: u64) -> String {
    let factor = cost as f64 / limit as f64;
    // NB: Go's `%f` (six decimals) below 1.5, `%.1f` up to 100.
    let f = if factor > 100.0 {
        "more than 100x".to_owned()
    } else if factor < 1.5 {
        format!("{factor:.6}x")
    } else {
        format!("{factor:.1}x")
    };
    format!(
        "{what} exceeds budget by factor of {f} (try simplifying the rule, or adding maxItems, \
         maxProperties, and maxLength where arrays, maps, and strings are declared)"
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn est(rule: &str, schema: Value) -> u64 {
        estimate(&cel::Program::compile(rule).unwrap(), &schema)
    }

    #[test]
    fn bounds_shrink_the_estimate_and_nesting_multiplies_it() {
        let bounded =
            json!({"type": "array", "maxItems": 10, "items": {"type": "string", "maxLength": 10}});
        let unbounded = json!({"type": "array", "items": {"type": "string"}});
        let one = est("self.all(x, x.startsWith('a'))", bounded.clone());
        assert!(one < 100, "{one}");
        let nested = est("self.all(x, self.all(y, x == y))", unbounded.clone());
        assert!(nested > STATIC_LIMIT, "{nested}");
        assert!(est("self.all(x, self.all(y, x == y))", bounded) < 10_000);
        assert!(est("size(self) > 0", unbounded) < 10);
    }

    #[test]
    fn runtime_cost_follows_the_actual_sizes() {
        let s = json!({"type": "array", "items": {"type": "string"}});
        let p = cel::Program::compile("self.all(x, self.all(y, x == y))").unwrap();
        let small = runtime(&p, &s, &json!(["a", "b"]), None);
        let many: Vec<Value> = (0..2000).map(|i| json!(i.to_string())).collect();
        let big = runtime(&p, &s, &Value::Array(many), None);
        assert!(small < 100, "{small}");
        assert!(big > 1_000_000, "{big}");
    }

    #[test]
    fn the_exceeded_message_is_the_servers() {
        assert!(
            exceeded("estimated rule cost", 2_000_000_000, STATIC_LIMIT)
                .contains("by factor of more than 100x (try")
        );
        assert!(
            exceeded("estimated rule cost", 25_000_000, STATIC_LIMIT).contains("by factor of 2.5x")
        );
    }
}
