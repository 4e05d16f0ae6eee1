//! Every shape error of a YAML document, each with its field path: the fallback the config
//! and manifest loaders use when a typed parse fails.
//!
//! serde stops at the first error and serde-saphyr's message names a line and a column, not
//! the field (`line 3 column 16: invalid u64`). [`parse_collecting`] instead reads the text
//! into a loosely typed tree (scalars, lists, and mappings kept in file order), then deserializes the wanted type from
//! that tree through a deserializer that knows where it is, so an error carries its path
//! (`providers[0].defaults.diskGiB`). It records the error, sets the offending node aside
//! (removes it, or puts a neutral value of another type in its place when the field is
//! required), and tries again, until the type deserializes or nothing more can be set aside.
//! The caller then validates the value it got, dropping rule errors at or under a path that
//! already has a shape error (the neutral value would otherwise be reported a second time).
//!
//! One piece (about 730 lines before its tests, 590 of them code): the loose tree, the
//! path-aware deserializer over it and the walk that sets nodes aside share their private types
//! (the tree, the error that carries a path, the path segments); split, each part would expose
//! the others' internals.
//!
//! Guarantees: no I/O; nothing lost on bad input — a syntax error is returned as such, and
//! each shape error found is returned (at most [`MAX_SHAPE_ERRORS`]); the work is bounded
//! (each round removes or replaces one node, and all rounds together deserialize the tree
//! at most [`MAX_ATTEMPTS`] times); the value returned, when there is one, is only ever used
//! to find further errors: a caller never accepts a document that had a shape error.

use std::fmt;

use serde::de::{
    self, DeserializeOwned, DeserializeSeed, Deserializer, EnumAccess, IntoDeserializer, MapAccess,
    SeqAccess, VariantAccess, Visitor,
};

/// A YAML document as a loose tree: mappings keep their keys in file order, so errors come
/// in file order.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Null,
    Bool(bool),
    U64(u64),
    I64(i64),
    F64(f64),
    String(String),
    Array(Vec<Value>),
    Object(Vec<(String, Value)>),
}

impl Value {
    fn key_text(&self) -> String {
        match self {
            Self::Null => "null".into(),
            Self::Bool(b) => b.to_string(),
            Self::U64(n) => n.to_string(),
            Self::I64(n) => n.to_string(),
            Self::F64(n) => n.to_string(),
            Self::String(s) => s.clone(),
            Self::Array(_) | Self::Object(_) => "<complex key>".into(),
        }
    }
}

/// Removes `k` from a mapping, returning whether it was there.
fn remove_key(m: &mut Vec<(String, Value)>, k: &str) -> bool {
    let before = m.len();
    m.retain(|(x, _)| x != k);
    m.len() != before
}

/// Sets `k` in a mapping (replacing, or appending at the end).
fn set_key(m: &mut Vec<(String, Value)>, k: &str, v: Value) {
    match m.iter_mut().find(|(x, _)| x == k) {
        Some((_, slot)) => *slot = v,
        None => m.push((k.to_owned(), v)),
    }
}

impl<'de> de::Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TreeVisitor)
    }
}

struct TreeVisitor;

impl<'de> Visitor<'de> for TreeVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::U64(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(if v >= 0 {
            Value::U64(v.unsigned_abs())
        } else {
            Value::I64(v)
        })
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Value, E> {
        Ok(u64::try_from(v).map_or_else(|_| Value::String(v.to_string()), Value::U64))
    }
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Value, E> {
        Ok(i64::try_from(v).map_or_else(|_| Value::String(v.to_string()), Value::I64))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::F64(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out: Vec<(String, Value)> = Vec::new();
        while let Some((k, v)) = map.next_entry::<Value, Value>()? {
            set_key(&mut out, &k.key_text(), v);
        }
        Ok(Value::Object(out))
    }
}

/// Most shape errors reported for one document (the rest of a hopeless file adds nothing).
// NB: a wrong type per field of a large entry is a few dozen; 64 bounds the rounds, each a
// full deserialization of one document, at a few milliseconds in all.
pub const MAX_SHAPE_ERRORS: usize = 64;

/// Values tried, in order, in place of a required field or list item of the wrong type.
const PLACEHOLDERS: usize = 6;

fn placeholders() -> [Value; PLACEHOLDERS] {
    [
        Value::Null,
        Value::String(String::new()),
        Value::U64(0),
        Value::Bool(false),
        Value::Array(Vec::new()),
        Value::Object(Vec::new()),
    ]
}

/// One step of a field path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// A mapping key.
    Key(String),
    /// A list index.
    Index(usize),
}

/// Renders a path as the loaders write it: `providers[0].hosts[1].address`.
pub fn render_path(path: &[Segment]) -> String {
    let mut s = String::new();
    for seg in path {
        match seg {
            Segment::Key(k) => {
                if !s.is_empty() {
                    s.push('.');
                }
                s.push_str(k);
            }
            Segment::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

/// One shape error: where, and what serde said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeError {
    /// The field path (`spec.resources.diskGiB`); empty for the document as a whole.
    pub path: String,
    /// What is wrong (serde's words, e.g. `invalid value: integer \`-1\`, expected u64`).
    pub message: String,
}

/// What [`parse_collecting`] found.
#[derive(Debug)]
pub struct Collected<T> {
    /// The value deserialized once every shape error was set aside (for finding rule errors
    /// only), or `None` when some error could not be set aside.
    pub value: Option<T>,
    /// The shape errors, in the order found; empty when the document deserialized as is.
    pub errors: Vec<ShapeError>,
}

impl<T> Collected<T> {
    /// Whether a rule error at `path` sits at or under a field that has a shape error (and
    /// should therefore not be reported again).
    pub fn covers(&self, path: &str) -> bool {
        self.errors.iter().any(|e| {
            !e.path.is_empty()
                && (path == e.path
                    || path
                        .strip_prefix(e.path.as_str())
                        .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('[')))
        })
    }
}

/// Parses `text` as YAML into a loose tree and collects every shape error of `T` with its
/// path (see the module documentation). `Err` carries serde-saphyr's message when the text
/// is not YAML at all (syntax error: its line and column are the useful part).
pub fn parse_collecting<T: DeserializeOwned>(text: &str) -> Result<Collected<T>, String> {
    let mut tree: Value = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
    let mut errors: Vec<ShapeError> = Vec::new();
    let mut value = None;
    // Each round sets one node aside; a node may take two rounds (removed for its type, then
    // given a neutral value when it is required).
    let mut rounds = 0;
    let mut budget = MAX_ATTEMPTS;
    while errors.len() < MAX_SHAPE_ERRORS && rounds < 2 * MAX_SHAPE_ERRORS {
        rounds += 1;
        let e = match attempt::<T>(&tree, &mut budget) {
            Ok(v) => {
                value = Some(v);
                break;
            }
            Err(e) => e,
        };
        let Some(fix) = set_aside::<T>(&mut tree, &e, &mut budget) else {
            let last = shape_error(&e);
            if !errors.iter().any(|x| x.path == last.path) {
                errors.push(last);
            }
            break;
        };
        if !errors.iter().any(|x| x.path == fix.path) {
            errors.push(ShapeError {
                path: fix.path,
                message: fix.message,
            });
        }
    }
    Ok(Collected { value, errors })
}

/// `line N column M` in a serde-saphyr message, if it names one.
pub fn location(msg: &str) -> Option<String> {
    let mut rest = msg;
    while let Some(i) = rest.find("line ") {
        let tail = rest.get(i + 5..)?;
        let line: String = tail.chars().take_while(char::is_ascii_digit).collect();
        let after = tail.get(line.len()..)?;
        if !line.is_empty()
            && let Some(c) = after.strip_prefix(" column ")
        {
            let col: String = c.chars().take_while(char::is_ascii_digit).collect();
            if !col.is_empty() {
                return Some(format!("line {line} column {col}"));
            }
        }
        rest = tail;
    }
    None
}

/// Most typed deserializations of the tree one [`parse_collecting`] makes (each round and
/// each neutral value tried is one).
// NB: a document with dozens of wrong fields needs a few hundred; each is one walk of the
// tree, milliseconds even for a config near MAX_CONFIG_BYTES, so the worst case stays in
// seconds whatever the input.
pub const MAX_ATTEMPTS: usize = 1024;

fn attempt<T: DeserializeOwned>(tree: &Value, budget: &mut usize) -> Result<T, DeError> {
    let Some(left) = budget.checked_sub(1) else {
        return Err(de::Error::custom(
            "too many errors in this document to look for more",
        ));
    };
    *budget = left;
    T::deserialize(PathDe {
        v: tree,
        path: Vec::new(),
    })
}

fn shape_error(e: &DeError) -> ShapeError {
    let mut path = e.path.clone().unwrap_or_default();
    if let Some(f) = quoted_after(&e.msg, "missing field `") {
        path.push(Segment::Key(f));
    }
    ShapeError {
        path: render_path(&path),
        message: e.msg.clone(),
    }
}

/// `X` in `...<prefix>X`...`.
fn quoted_after(msg: &str, prefix: &str) -> Option<String> {
    let rest = msg.split_once(prefix)?.1;
    Some(rest.split_once('`')?.0.to_owned())
}

struct Fix {
    path: String,
    message: String,
}

/// Removes or replaces the node `e` is about so the next round gets past it; `None` when
/// nothing can be done (an error about the document as a whole, or no neutral value helps).
fn set_aside<T: DeserializeOwned>(
    tree: &mut Value,
    e: &DeError,
    budget: &mut usize,
) -> Option<Fix> {
    let at = e.path.clone().unwrap_or_default();
    // An unknown key: drop it where it is.
    if let Some(k) = quoted_after(&e.msg, "unknown field `")
        && let Some(Value::Object(m)) = node_mut(tree, &at)
        && remove_key(m, &k)
    {
        let mut p = at;
        p.push(Segment::Key(k));
        return Some(Fix {
            path: render_path(&p),
            message: e.msg.clone(),
        });
    }
    // A required field is missing (or was removed for its type): try neutral values.
    if let Some(k) = quoted_after(&e.msg, "missing field `") {
        let mut p = at.clone();
        p.push(Segment::Key(k.clone()));
        let put = |t: &mut Value, v: Value| {
            if let Some(Value::Object(m)) = node_mut(t, &at) {
                set_key(m, &k, v);
            }
        };
        return fill::<T>(tree, &p, e, &put, FILL_DEPTH, budget).then(|| Fix {
            path: render_path(&p),
            message: e.msg.clone(),
        });
    }
    let (last, parent) = at.split_last()?;
    match last {
        Segment::Key(k) => {
            if let Some(Value::Object(m)) = node_mut(tree, parent) {
                remove_key(m, k);
            }
        }
        Segment::Index(i) => {
            let put = |t: &mut Value, v: Value| {
                if let Some(Value::Array(a)) = node_mut(t, parent)
                    && let Some(slot) = a.get_mut(*i)
                {
                    *slot = v;
                }
            };
            if !fill::<T>(tree, &at, e, &put, FILL_DEPTH, budget) {
                return None;
            }
        }
    }
    Some(Fix {
        path: render_path(&at),
        message: e.msg.clone(),
    })
}

/// Puts neutral values at `path` (through `put`) until deserialization gets past it; the
/// first value an error at `path` names as expected (an enum's first variant) is tried too.
fn fill<T: DeserializeOwned>(
    tree: &mut Value,
    path: &[Segment],
    e: &DeError,
    put: &dyn Fn(&mut Value, Value),
    depth: usize,
    budget: &mut usize,
) -> bool {
    let mut queue: Vec<Value> = placeholders().into();
    let mut hinted = false;
    let mut next = 0;
    while let Some(candidate) = queue.get(next).cloned() {
        next += 1;
        put(tree, candidate);
        match gets_past::<T>(tree, path, e, budget) {
            Ok(()) => return true,
            Err(Some(hint)) if !hinted => {
                hinted = true;
                queue.push(Value::String(hint));
            }
            Err(_) => {}
        }
    }
    fill_struct::<T>(tree, path, put, depth, budget)
}

/// Deepest mapping [`fill`] builds for a required field (`metadata: {name: ""}`).
const FILL_DEPTH: usize = 3;

/// Puts an empty mapping at `path` and fills its required fields one by one (recursively,
/// `depth` levels), so a missing required mapping does not end the walk.
fn fill_struct<T: DeserializeOwned>(
    tree: &mut Value,
    path: &[Segment],
    put: &dyn Fn(&mut Value, Value),
    depth: usize,
    budget: &mut usize,
) -> bool {
    let Some(depth) = depth.checked_sub(1) else {
        return false;
    };
    put(tree, Value::Object(Vec::new()));
    for _ in 0..MAX_SHAPE_ERRORS {
        let Err(e) = attempt::<T>(tree, budget) else {
            return true;
        };
        let ep = e.path.clone().unwrap_or_default();
        let under = ep.len() >= path.len() && ep.get(..path.len()) == Some(path);
        if !under {
            return true;
        }
        let Some(k) = quoted_after(&e.msg, "missing field `").filter(|_| ep == path) else {
            return false;
        };
        let mut p = path.to_vec();
        p.push(Segment::Key(k.clone()));
        let put_field = |t: &mut Value, v: Value| {
            if let Some(Value::Object(m)) = node_mut(t, path) {
                set_key(m, &k, v);
            }
        };
        if !fill::<T>(tree, &p, &e, &put_field, depth, budget) {
            return false;
        }
    }
    false
}

/// `Ok` when, with the tree as it is now, deserialization no longer fails at or under `path`
/// (it may fail elsewhere: that is the next round's error) nor with the same error again;
/// else the first value the error says it expected, when it names one at `path` itself.
fn gets_past<T: DeserializeOwned>(
    tree: &Value,
    path: &[Segment],
    before: &DeError,
    budget: &mut usize,
) -> Result<(), Option<String>> {
    let Err(e) = attempt::<T>(tree, budget) else {
        return Ok(());
    };
    let ep = e.path.clone().unwrap_or_default();
    let under = ep.len() >= path.len() && ep.get(..path.len()) == Some(path);
    let same = e.msg == before.msg && e.path == before.path;
    if !under && !same {
        return Ok(());
    }
    Err((ep == path)
        .then(|| quoted_after(&e.msg, "expected `"))
        .flatten())
}

fn node_mut<'a>(v: &'a mut Value, path: &[Segment]) -> Option<&'a mut Value> {
    let mut cur = v;
    for seg in path {
        cur = match (seg, cur) {
            (Segment::Key(k), Value::Object(m)) => &mut m.iter_mut().find(|(x, _)| x == k)?.1,
            (Segment::Index(i), Value::Array(a)) => a.get_mut(*i)?,
            _ => return None,
        };
    }
    Some(cur)
}

/// A deserialization error and the path of the innermost node it arose at.
#[derive(Debug)]
struct DeError {
    msg: String,
    path: Option<Vec<Segment>>,
}

impl fmt::Display for DeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for DeError {}

impl de::Error for DeError {
    fn custom<M: fmt::Display>(msg: M) -> Self {
        Self {
            msg: msg.to_string(),
            path: None,
        }
    }
}

/// Marks an error that has no path yet with `path` (the innermost node wins).
fn at<T>(path: &[Segment], r: Result<T, DeError>) -> Result<T, DeError> {
    r.map_err(|mut e| {
        if e.path.is_none() {
            e.path = Some(path.to_vec());
        }
        e
    })
}

/// A deserializer over one node of the tree that knows the node's path.
struct PathDe<'a> {
    v: &'a Value,
    path: Vec<Segment>,
}

impl<'de, 'a> Deserializer<'de> for PathDe<'a> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let path = self.path;
        let r = match self.v {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(*b),
            Value::U64(n) => visitor.visit_u64(*n),
            Value::I64(n) => visitor.visit_i64(*n),
            Value::F64(n) => visitor.visit_f64(*n),
            Value::String(s) => visitor.visit_str(s),
            Value::Array(a) => visitor.visit_seq(Seq {
                items: a.iter(),
                index: 0,
                path: path.clone(),
            }),
            Value::Object(m) => visitor.visit_map(Entries {
                items: m.iter(),
                value: None,
                path: path.clone(),
            }),
        };
        at(&path, r)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match self.v {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        // YAML scalars are untyped: a plain `123` read where text is wanted is the text.
        match self.v {
            Value::U64(_) | Value::I64(_) | Value::F64(_) | Value::Bool(_) => {
                visitor.visit_string(self.v.key_text())
            }
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        let path = self.path;
        let r = match self.v {
            Value::String(s) => visitor.visit_enum(s.as_str().into_deserializer()),
            Value::Object(m) if m.len() == 1 => match m.first() {
                Some((k, v)) => {
                    let mut p = path.clone();
                    p.push(Segment::Key(k.clone()));
                    visitor.visit_enum(Variant {
                        name: k,
                        value: PathDe { v, path: p },
                    })
                }
                None => Err(de::Error::custom("an empty mapping is not a variant")),
            },
            other => Err(de::Error::invalid_type(unexpected(other), &"a variant")),
        };
        at(&path, r)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char bytes byte_buf unit
        unit_struct seq tuple tuple_struct map struct identifier ignored_any
    }
}

fn unexpected(v: &Value) -> de::Unexpected<'_> {
    match v {
        Value::Null => de::Unexpected::Unit,
        Value::Bool(b) => de::Unexpected::Bool(*b),
        Value::U64(n) => de::Unexpected::Unsigned(*n),
        Value::I64(n) => de::Unexpected::Signed(*n),
        Value::F64(n) => de::Unexpected::Float(*n),
        Value::String(s) => de::Unexpected::Str(s),
        Value::Array(_) => de::Unexpected::Seq,
        Value::Object(_) => de::Unexpected::Map,
    }
}

struct Seq<'a> {
    items: std::slice::Iter<'a, Value>,
    index: usize,
    path: Vec<Segment>,
}

impl<'de, 'a> SeqAccess<'de> for Seq<'a> {
    type Error = DeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, DeError> {
        let Some(v) = self.items.next() else {
            return Ok(None);
        };
        let mut p = self.path.clone();
        p.push(Segment::Index(self.index));
        self.index += 1;
        let r = seed.deserialize(PathDe { v, path: p.clone() });
        at(&p, r).map(Some)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.items.len())
    }
}

struct Entries<'a> {
    items: std::slice::Iter<'a, (String, Value)>,
    value: Option<(&'a String, &'a Value)>,
    path: Vec<Segment>,
}

impl<'de, 'a> MapAccess<'de> for Entries<'a> {
    type Error = DeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        let Some((k, v)) = self.items.next() else {
            return Ok(None);
        };
        self.value = Some((k, v));
        // An unknown key is reported at the mapping (set_aside finds the key by name).
        let r = seed.deserialize(k.as_str().into_deserializer());
        at(&self.path, r).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        let Some((k, v)) = self.value.take() else {
            return Err(de::Error::custom("a value was asked for before its key"));
        };
        let mut p = self.path.clone();
        p.push(Segment::Key(k.clone()));
        let r = seed.deserialize(PathDe { v, path: p.clone() });
        at(&p, r)
    }
}

struct Variant<'a> {
    name: &'a str,
    value: PathDe<'a>,
}

impl<'de, 'a> EnumAccess<'de> for Variant<'a> {
    type Error = DeError;
    type Variant = PathDe<'a>;

    fn variant_seed<V: DeserializeSeed<'de>>(
        self,
        seed: V,
    ) -> Result<(V::Value, Self::Variant), DeError> {
        let name: de::value::StrDeserializer<'_, DeError> = self.name.into_deserializer();
        Ok((seed.deserialize(name)?, self.value))
    }
}

impl<'de, 'a> VariantAccess<'de> for PathDe<'a> {
    type Error = DeError;

    fn unit_variant(self) -> Result<(), DeError> {
        <() as de::Deserialize>::deserialize(self)
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, DeError> {
        seed.deserialize(self)
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_any(visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        self.deserialize_any(visitor)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing, dead_code)]
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Doc {
        name: String,
        #[serde(default)]
        items: Vec<Item>,
        #[serde(default)]
        limits: Limits,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Item {
        size: u32,
        kind: Kind,
    }

    #[derive(Debug, Deserialize)]
    #[serde(rename_all = "lowercase")]
    enum Kind {
        Small,
        Large,
    }

    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Limits {
        #[serde(rename = "diskGiB")]
        disk_gib: Option<u64>,
    }

    fn paths(c: &Collected<Doc>) -> Vec<&str> {
        c.errors.iter().map(|e| e.path.as_str()).collect()
    }

    #[test]
    fn every_shape_error_comes_with_its_path_in_file_order() {
        let y = "name: [a]\nitems:\n  - size: -1\n    kind: small\n  - size: 2\n    kind: huge\n    \
                 extra: 1\nlimits: {diskGiB: -1}\n";
        let c = parse_collecting::<Doc>(y).unwrap();
        assert_eq!(
            paths(&c),
            [
                "name",
                "items[0].size",
                "items[1].kind",
                "items[1].extra",
                "limits.diskGiB"
            ],
            "{c:?}"
        );
        assert!(c.errors[4].message.contains("-1"), "{c:?}");
        // Everything could be set aside: the rest is there for the rule checks.
        assert!(c.value.is_some());
        assert!(c.covers("items[1].kind") && c.covers("limits.diskGiB"));
        assert!(!c.covers("items[1].kinds") && !c.covers("items"));
    }

    #[test]
    fn a_missing_field_is_named_and_a_syntax_error_is_returned_as_such() {
        let c = parse_collecting::<Doc>("items: []\n").unwrap();
        assert_eq!(paths(&c), ["name"]);
        assert!(c.errors[0].message.contains("missing field"), "{c:?}");
        assert!(parse_collecting::<Doc>("name: [unclosed\n").is_err());
    }

    #[test]
    fn a_valid_document_has_no_errors_and_numbers_read_as_text_where_text_is_wanted() {
        let c = parse_collecting::<Doc>("name: 123\nitems: [{size: 1, kind: large}]\n").unwrap();
        assert!(c.errors.is_empty(), "{c:?}");
        assert_eq!(c.value.unwrap().name, "123");
    }

    #[test]
    fn a_hopeless_document_stops_at_the_bound() {
        let mut y = String::from("name: n\nitems:\n");
        for _ in 0..(MAX_SHAPE_ERRORS * 3) {
            y.push_str("  - {size: x, kind: small}\n");
        }
        let c = parse_collecting::<Doc>(&y).unwrap();
        assert_eq!(c.errors.len(), MAX_SHAPE_ERRORS);
    }
}
