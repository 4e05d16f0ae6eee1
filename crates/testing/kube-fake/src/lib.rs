//! An in-process fake Kubernetes API server for tests: a tower `Service` behind
//! [`kube::Client`] that keeps objects in memory, so a real kube-runtime `Controller`, the
//! event `Recorder` and a Lease-based elector can run end to end without a cluster (kube 5 has
//! no in-memory API server; see kube-rs GitHub issue #1108).
//!
//! What it serves (URL shapes of the core `/api/v1` and the `/apis/GROUP/VERSION` groups,
//! namespaced and cluster-scoped, any resource without registration):
//! - get, list (with `labelSelector` equality/existence terms and `fieldSelector`
//!   `metadata.name` / `metadata.namespace` equality), watch (a streaming JSON-lines body of
//!   `ADDED` / `MODIFIED` / `DELETED` events replayed from `resourceVersion`, then a `BOOKMARK`
//!   when `allowWatchBookmarks=true`, then live; the stream ends after `timeoutSeconds` like a
//!   real server's; a `resourceVersion` older than the kept history — see
//!   [`FakeApiServer::set_watch_history_limit`] — gets one `ERROR` event with a 410 `Expired`
//!   Status);
//! - the scale subresource of CRDs that declare one (`scale.rs`); any other subresource than a
//!   declared `/status` or `/scale` answers 404;
//! - discovery, the OpenAPI v2/v3 documents of stored CRDs and server-side printing (`Table`
//!   with a CRD's printer columns) for clients such as kubectl (`discovery.rs`);
//! - apply conflicts worded and detailed as a real server's (`FieldManagerConflict` causes);
//! - create (409 `AlreadyExists`), replace (409 `Conflict` on a stale
//!   `metadata.resourceVersion`), delete (with `DeleteOptions.preconditions` `uid` and
//!   `resourceVersion`: 409 `Conflict` when one does not hold, nothing deleted);
//! - patches: JSON merge (RFC 7386), strategic merge (treated as a JSON merge: lists are
//!   replaced, never merged by key — enough for the objects our tests patch), JSON patch
//!   (RFC 6902, including `test`), and server-side apply;
//! - server-side apply, simplified: each (field manager, subresource) owns the leaf paths it
//!   applied (objects are recursed, lists are atomic); applying a leaf another manager owns
//!   with a different value is a 409 `Conflict` unless `force=true` (which takes ownership);
//!   leaves a manager applied before and omits now are removed when nobody else owns them;
//!   the applied config is then deep-merged. `metadata.managedFields` lists one entry per
//!   manager (no `fieldsV1`). Non-apply writes take no ownership. An apply that creates the
//!   object answers 201; a `metadata.resourceVersion` in the applied config is a
//!   precondition (409 `Conflict` when stale).
//! - the status subresource, for resources registered with
//!   [`FakeApiServer::enable_status_subresource`]: writes to `/status` change only `status`;
//!   writes to the main resource never change `status`; create drops `status`;
//! - server-owned metadata (`uid`, `resourceVersion`, `generation`, `creationTimestamp`,
//!   `deletionTimestamp`, `managedFields`) cannot be written by clients; `generation` starts at 1
//!   and increments whenever anything outside `metadata` and `status` changes;
//! - finalizers: deleting an object with finalizers only sets `deletionTimestamp`; the object
//!   is removed by the write that empties its finalizers.
//!
//! Guarantees: one global resourceVersion counter (like etcd's revision), strictly increasing
//! per write; every write is one history record, so a watch from any earlier version still in
//! the kept history (all of it unless limited) replays every change in order; a watcher whose
//! bounded queue fills is disconnected (its stream ends and the client re-watches from its
//! last version, as with a real server). No lock is held across an `.await`. Every request is
//! recorded for assertions ([`FakeApiServer::requests`]). Costs per request stay those of the
//! resource type and object concerned, not of everything stored: objects are ranged by type,
//! the history holds each write's event line (not its object), and the history and request
//! logs drop their oldest entries in O(1).
//!
//! One file: the store, routing and write semantics share one lock and one set of private
//! types (routes, stored objects, errors); what stands alone lives beside it (`discovery.rs`:
//! discovery, OpenAPI and printing; `scale.rs`: the scale subresource; `https.rs`: the HTTPS
//! front).

mod discovery;
mod gc;
pub mod https;
mod scale;
mod schema;

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

/// Queue of one watcher; a watcher that falls this far behind is disconnected.
// NB: a test's controller consumes events within microseconds; 1024 pending events means the
// consumer is gone or stuck, and a disconnect makes the client re-list, as a real server does.
pub const WATCH_QUEUE: usize = 1024;
/// Server-side watch timeout when the client sends none (the real API server's default range).
// NB: kube-runtime sends 290 s; this only applies to hand-made requests.
pub const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(290);
/// Requests kept for [`FakeApiServer::requests`]; older ones are dropped.
// NB: a test run makes hundreds of requests; 100 000 bounds memory at a few MiB.
pub const MAX_RECORDED_REQUESTS: usize = 100_000;

/// The response body type: whole JSON documents, or a watch stream.
pub type Body = UnsyncBoxBody<Bytes, Infallible>;

/// One request as the server saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRequest {
    /// HTTP method.
    pub method: String,
    /// Path without the query.
    pub path: String,
    /// Raw query string ("" when none).
    pub query: String,
    /// `Content-Type`, for patches.
    pub content_type: String,
    /// The status code answered.
    pub status: u16,
}

/// Where a resource type lives: `group` ("" for core) and `plural`.
type TypeKey = (String, String);
/// One object: type, namespace ("" when cluster-scoped), name.
type ObjKey = (String, String, String, String);

#[derive(Debug, Clone)]
struct Stored {
    object: Value,
    /// (manager, subresource) → owned leaf paths (JSON pointers).
    applied: BTreeMap<(String, String), BTreeSet<String>>,
    /// (manager, operation, subresource) of every writer with a field manager.
    managers: BTreeSet<(String, String, String)>,
}

/// One write as watches replay it: the watch event line as sent, and what watch filters
/// match on (the object's `metadata` name, namespace and labels, nothing else).
// NB: the line, not the object: a JSON tree is several times the size of its text, and the
// history holds every write (the Kubernetes benchmark at 20,000 Proxies grew the fake to
// ~2 GB holding whole objects).
#[derive(Debug, Clone)]
struct Record {
    rv: u64,
    group: String,
    plural: String,
    /// `{"metadata": {"name", "namespace", "labels"}}` of the object written.
    meta: Value,
    /// The watch event line (`{"type": ..., "object": ...}` and a newline).
    line: Bytes,
}

/// The part of `object` watch filters read (see [`Record`]).
fn filter_meta(object: &Value) -> Value {
    let mut m = Map::new();
    for k in ["name", "namespace", "labels"] {
        if let Some(v) = object.pointer(&format!("/metadata/{k}")) {
            m.insert(k.to_owned(), v.clone());
        }
    }
    json!({ "metadata": m })
}

struct Watcher {
    group: String,
    plural: String,
    namespace: Option<String>,
    selectors: Selectors,
    tx: mpsc::Sender<Bytes>,
}

#[derive(Default)]
struct State {
    rv: u64,
    uid_counter: u64,
    objects: BTreeMap<ObjKey, Stored>,
    history: VecDeque<Record>,
    watchers: Vec<Watcher>,
    status_sub: HashSet<TypeKey>,
    /// Most history records kept for watches (`None`: all); see
    /// [`FakeApiServer::set_watch_history_limit`].
    history_limit: Option<usize>,
    /// The resourceVersion of the newest record dropped from `history` (0: none dropped).
    compacted_rv: u64,
    requests: VecDeque<RecordedRequest>,
    /// Injected faults: (method, exact path) answered with a 500 instead of being served.
    failing: Vec<(String, String)>,
    /// Injected interleavings: before the first (method, exact path) request, these
    /// (method, path, JSON body) requests are served first (once).
    before: Vec<(String, String, Requests)>,
    /// The compiled schema of every served custom resource version, by (group, version,
    /// plural); rebuilt on every CRD write.
    types: BTreeMap<(String, String, String), Arc<schema::TypeSchema>>,
    /// Fields pruned from written objects (see [`FakeApiServer::dropped_fields`]).
    dropped: Vec<DroppedField>,
    /// The garbage collector's indexes and queue (`gc.rs`).
    gc: gc::Gc,
    /// The collector is held (see [`FakeApiServer::set_gc_paused`]).
    gc_paused: bool,
}

/// A field the server dropped from a written object because the type's schema does not
/// declare it (a real server drops it too, with a warning unless `fieldValidation=Strict`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DroppedField {
    /// The request's method.
    pub method: String,
    /// The object's path (`/apis/GROUP/VERSION/namespaces/NS/PLURAL/NAME`).
    pub object: String,
    /// The field (`spec.foo`, `metadata.bar`).
    pub field: String,
}

/// Requests to serve as another client's: (method, path, optional JSON body).
pub type Requests = Vec<(String, String, Option<Value>)>;

/// The fake server. Cloning shares the same store; [`FakeApiServer::client`] makes a
/// `kube::Client` over it.
#[derive(Clone, Default)]
pub struct FakeApiServer {
    state: Arc<Mutex<State>>,
    /// Wakes the garbage collector task (started by the first request).
    gc_wake: Arc<tokio::sync::Notify>,
    gc_started: Arc<std::sync::atomic::AtomicBool>,
}

impl std::fmt::Debug for FakeApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.lock();
        f.debug_struct("FakeApiServer")
            .field("resource_version", &st.rv)
            .field("objects", &st.objects.len())
            .finish_non_exhaustive()
    }
}

/// A parsed request path.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Route {
    group: String,
    version: String,
    plural: String,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

impl Route {
    fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

fn parse_route(path: &str) -> Option<Route> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => (String::new(), (*v).to_owned(), rest),
        ["apis", g, v, rest @ ..] => ((*g).to_owned(), (*v).to_owned(), rest),
        _ => return None,
    };
    let s = |x: &&str| (*x).to_owned();
    let (namespace, plural, tail) = match rest {
        ["namespaces", ns, plural, tail @ ..] => (Some(s(ns)), s(plural), tail),
        [plural, tail @ ..] => (None, s(plural), tail),
        [] => return None,
    };
    let (name, sub) = match tail {
        [] => (None, None),
        [name] => (Some(s(name)), None),
        [name, sub] => (Some(s(name)), Some(s(sub))),
        _ => return None,
    };
    Some(Route {
        group,
        version,
        plural,
        namespace,
        name,
        subresource: sub,
    })
}

/// One requirement of a label selector (equality-based or set-based, as kubectl and the
/// client libraries send them).
#[derive(Debug, Clone)]
enum LabelReq {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// Label and field selectors of a list or watch.
#[derive(Debug, Clone, Default)]
struct Selectors {
    labels: Vec<LabelReq>,
    /// (field path, value, equal?)
    fields: Vec<(String, String, bool)>,
}

/// Splits a selector at the commas that are not inside a `( … )` value set.
fn split_terms(sel: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0_i32, 0);
    for (i, c) in sel.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(sel[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(sel[start..].trim());
    out.into_iter().filter(|t| !t.is_empty()).collect()
}

fn parse_label_req(term: &str) -> LabelReq {
    let set = |rest: &str| -> Vec<String> {
        rest.trim()
            .trim_start_matches('(')
            .trim_end_matches(')')
            .split(',')
            .map(|v| v.trim().to_owned())
            .collect()
    };
    if let Some((k, rest)) = term.split_once(" notin ") {
        return LabelReq::NotIn(k.trim().into(), set(rest));
    }
    if let Some((k, rest)) = term.split_once(" in ") {
        return LabelReq::In(k.trim().into(), set(rest));
    }
    if let Some((k, v)) = term.split_once("!=") {
        return LabelReq::Ne(k.trim().into(), v.trim().into());
    }
    if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
        return LabelReq::Eq(k.trim().into(), v.trim().into());
    }
    match term.strip_prefix('!') {
        Some(k) => LabelReq::NotExists(k.trim().into()),
        None => LabelReq::Exists(term.trim().into()),
    }
}

impl Selectors {
    fn parse(q: &BTreeMap<String, String>) -> Self {
        let mut s = Self::default();
        if let Some(l) = q.get("labelSelector") {
            s.labels = split_terms(l).into_iter().map(parse_label_req).collect();
        }
        if let Some(f) = q.get("fieldSelector") {
            for term in f.split(',').map(str::trim).filter(|t| !t.is_empty()) {
                if let Some((k, v)) = term.split_once("!=") {
                    s.fields.push((k.trim().into(), v.trim().into(), false));
                } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('='))
                {
                    s.fields.push((k.trim().into(), v.trim().into(), true));
                }
            }
        }
        s
    }

    /// As documented for label selectors: `!=` and `notin` also match objects without the key.
    fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        let label_ok = self.labels.iter().all(|req| {
            let have = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
            match req {
                LabelReq::Eq(k, v) => have(k) == Some(v.as_str()),
                LabelReq::Ne(k, v) => have(k) != Some(v.as_str()),
                LabelReq::In(k, vs) => have(k).is_some_and(|h| vs.iter().any(|v| v == h)),
                LabelReq::NotIn(k, vs) => !have(k).is_some_and(|h| vs.iter().any(|v| v == h)),
                LabelReq::Exists(k) => have(k).is_some(),
                LabelReq::NotExists(k) => have(k).is_none(),
            }
        });
        let field_ok = self.fields.iter().all(|(k, v, eq)| {
            let ptr = format!("/{}", k.replace('.', "/"));
            (obj.pointer(&ptr).and_then(Value::as_str) == Some(v.as_str())) == *eq
        });
        label_ok && field_ok
    }
}

/// An API error as the server answers it.
struct ApiError {
    code: StatusCode,
    reason: &'static str,
    message: String,
    /// The Status `details` (`causes` of an apply conflict), when any.
    details: Option<Value>,
}

impl ApiError {
    fn new(code: StatusCode, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }
    fn not_found(r: &Route, name: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("{} \"{name}\" not found", r.plural),
        )
    }
    fn bad(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "BadRequest", message)
    }
    fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "Conflict", message)
    }
    /// The 422 `Invalid` of `errs` on the object `name` of `kind` in `group`.
    fn invalid(group: &str, kind: &str, name: &str, errs: &[schema::field::FieldError]) -> Self {
        let (message, details) = schema::field::invalid_status(group, kind, name, errs);
        let mut e = Self::new(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", message);
        e.details = Some(details);
        e
    }
}

fn full(code: StatusCode, v: &Value) -> Response<Body> {
    let bytes = serde_json::to_vec(v).unwrap_or_default();
    let mut resp = Response::new(Full::new(Bytes::from(bytes)).boxed_unsync());
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

fn error_response(e: &ApiError) -> Response<Body> {
    full(e.code, &status_body(e))
}

/// The `Status` object of an error, as a real server answers it.
fn status_body(e: &ApiError) -> Value {
    let mut v = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": e.message, "reason": e.reason, "code": e.code.as_u16(),
    });
    if let (Some(d), Some(o)) = (&e.details, v.as_object_mut()) {
        o.insert("details".into(), d.clone());
    }
    v
}

fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".into())
}

/// Metadata fields only the server writes.
const SERVER_META: &[&str] = &[
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "managedFields",
];

fn meta_mut(obj: &mut Value) -> Option<&mut Map<String, Value>> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj.as_object_mut()?
            .insert("metadata".into(), Value::Object(Map::new()));
    }
    obj.get_mut("metadata")?.as_object_mut()
}

/// Everything but `metadata` and `status`: what a generation tracks.
fn spec_part(obj: &Value) -> Value {
    let mut o = obj.as_object().cloned().unwrap_or_default();
    o.remove("metadata");
    o.remove("status");
    o.remove("apiVersion");
    o.remove("kind");
    Value::Object(o)
}

fn has_finalizers(obj: &Value) -> bool {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty())
}

/// Leaf paths of an applied config (objects recursed, everything else a leaf).
fn leaves(v: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, c) in m {
                let esc = k.replace('~', "~0").replace('/', "~1");
                leaves(c, &format!("{prefix}/{esc}"), out);
            }
        }
        _ => {
            out.insert(prefix.to_owned());
        }
    }
}

/// Removes the value at a JSON pointer, and parents left empty.
fn remove_path(obj: &mut Value, ptr: &str) {
    let Some((parent, last)) = ptr.rsplit_once('/') else {
        return;
    };
    let key = last.replace("~1", "/").replace("~0", "~");
    if let Some(p) = obj.pointer_mut(parent).and_then(Value::as_object_mut) {
        p.remove(&key);
        if p.is_empty() && !parent.is_empty() {
            remove_path(obj, parent);
        }
    }
}

/// Deep merge for apply: objects merged key by key, anything else replaced.
fn deep_merge(into: &mut Value, from: &Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                match a.get_mut(k) {
                    Some(slot) if slot.is_object() && v.is_object() => deep_merge(slot, v),
                    _ => {
                        a.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (slot, v) => *slot = v.clone(),
    }
}

impl State {
    fn next_rv(&mut self) -> u64 {
        self.rv = self.rv.saturating_add(1);
        self.rv
    }

    fn record(&mut self, group: &str, plural: &str, kind: &'static str, object: Value) {
        let rec = Record {
            rv: self.rv,
            group: group.to_owned(),
            plural: plural.to_owned(),
            meta: filter_meta(&object),
            line: event_line(kind, &object),
        };
        self.watchers.retain(|w| {
            if !w.matches(&rec) {
                return !w.tx.is_closed();
            }
            // NB: a full queue disconnects the watcher (see WATCH_QUEUE).
            w.tx.try_send(rec.line.clone()).is_ok()
        });
        self.history.push_back(rec);
        let gc_key = (
            group.to_owned(),
            plural.to_owned(),
            str_at(&object, "/metadata/namespace"),
            str_at(&object, "/metadata/name"),
        );
        self.gc.observe(kind, gc_key, &object);
        if let Some(limit) = self.history_limit
            && self.history.len() > limit
        {
            let drop = self.history.len() - limit;
            if let Some(last) = self.history.get(drop - 1) {
                self.compacted_rv = last.rv;
            }
            self.history.drain(..drop);
        }
    }

    fn status_sub(&self, r: &Route) -> bool {
        self.status_sub
            .contains(&(r.group.clone(), r.plural.clone()))
    }

    /// The compiled schema of `r`'s type, when a stored CRD serves it.
    fn type_schema(&self, r: &Route) -> Option<Arc<schema::TypeSchema>> {
        self.types
            .get(&(r.group.clone(), r.version.clone(), r.plural.clone()))
            .cloned()
    }

    /// Recompiles the schemas of every stored CRD (after a CRD write) and enables the status
    /// subresource of every version that declares one.
    fn rebuild_types(&mut self) {
        let crds: Vec<Value> = of_type(&self.objects, CRD_GROUP, CRD_PLURAL)
            .map(|(_, s)| s.object.clone())
            .collect();
        let mut types = BTreeMap::new();
        for crd in &crds {
            let declares_status = crd
                .pointer("/spec/versions")
                .and_then(Value::as_array)
                .is_some_and(|vs| {
                    vs.iter().any(|v| {
                        v.pointer("/subresources/status")
                            .is_some_and(Value::is_object)
                    })
                });
            for t in schema::compile_crd(crd).unwrap_or_default() {
                if declares_status {
                    self.status_sub.insert((t.group.clone(), t.plural.clone()));
                }
                types.insert(
                    (t.group.clone(), t.version.clone(), t.plural.clone()),
                    Arc::new(t),
                );
            }
        }
        self.types = types;
    }

    /// Prunes and defaults a written custom resource (request decoding), records what was
    /// dropped, and answers `fieldValidation=Strict` with a 400 when something was; returns the
    /// `Warning` headers a real server sends otherwise.
    fn decode(
        &mut self,
        ts: Option<&schema::TypeSchema>,
        obj: &mut Value,
        method: &str,
        object_path: String,
        q: &BTreeMap<String, String>,
    ) -> Result<Vec<String>, ApiError> {
        let Some(ts) = ts else {
            return Ok(Vec::new());
        };
        let dropped = ts.decode(obj);
        if dropped.is_empty() {
            return Ok(Vec::new());
        }
        let unknown: Vec<String> = dropped
            .iter()
            .map(|f| format!("unknown field {}", schema::field::go_quote(f)))
            .collect();
        match q.get("fieldValidation").map(String::as_str) {
            Some("Strict") => Err(ApiError::bad(format!(
                "strict decoding error: {}",
                unknown.join(", ")
            ))),
            mode => {
                self.dropped.extend(dropped.iter().map(|f| DroppedField {
                    method: method.to_owned(),
                    object: object_path.clone(),
                    field: f.clone(),
                }));
                Ok(if mode == Some("Ignore") {
                    Vec::new()
                } else {
                    unknown
                })
            }
        }
    }
}

fn str_at(v: &Value, ptr: &str) -> String {
    v.pointer(ptr)
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned()
}

/// The garbage collector: woken after writes (and every second), it works through its queue in
/// batches, releasing the lock between them; it ends when the server is dropped.
async fn gc_task(state: std::sync::Weak<Mutex<State>>, wake: Arc<tokio::sync::Notify>) {
    // NB: the periodic tick only notices that the server is gone; work always comes with a
    // wake-up.
    const TICK: Duration = Duration::from_secs(1);
    loop {
        let _ = tokio::time::timeout(TICK, wake.notified()).await;
        let Some(state) = state.upgrade() else {
            return;
        };
        loop {
            let more = {
                let mut st = state.lock().unwrap_or_else(PoisonError::into_inner);
                if st.gc_paused {
                    break;
                }
                st.gc_steps(gc::BATCH)
            };
            if !more {
                break;
            }
            tokio::task::yield_now().await;
        }
    }
}

/// Adds a `Warning: 299 - "TEXT"` header per warning, as a real server sends them.
fn with_warnings(mut resp: Response<Body>, warnings: &[String]) -> Response<Body> {
    for w in warnings {
        let text = w.replace('\\', "\\\\").replace('"', "\\\"");
        if let Ok(v) = http::HeaderValue::from_str(&format!("299 - \"{text}\"")) {
            resp.headers_mut().append(http::header::WARNING, v);
        }
    }
    resp
}

/// The path of an object, as recorded for [`DroppedField`].
fn object_path(r: &Route, name: &str) -> String {
    let base = if r.group.is_empty() {
        format!("/api/{}", r.version)
    } else {
        format!("/apis/{}/{}", r.group, r.version)
    };
    match &r.namespace {
        Some(ns) => format!("{base}/namespaces/{ns}/{}/{name}", r.plural),
        None => format!("{base}/{}/{name}", r.plural),
    }
}

/// The kind named in a built-in object's errors (`Kind` from the body, or the plural).
fn kind_for_errors(obj: &Value, r: &Route) -> String {
    obj.get("kind")
        .and_then(Value::as_str)
        .filter(|k| !k.is_empty())
        .map_or_else(|| r.plural.clone(), str::to_owned)
}

impl Watcher {
    fn matches(&self, rec: &Record) -> bool {
        rec.group == self.group
            && rec.plural == self.plural
            && self.namespace.as_deref().is_none_or(|ns| {
                rec.meta
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    == Some(ns)
            })
            && self.selectors.matches(&rec.meta)
    }
}

/// The group and plural of CustomResourceDefinitions (discovery and printing read them).
const CRD_GROUP: &str = "apiextensions.k8s.io";
const CRD_PLURAL: &str = "customresourcedefinitions";

fn is_watch(q: &BTreeMap<String, String>) -> bool {
    q.get("watch").is_some_and(|w| w == "true" || w == "1")
}

fn header(h: &http::HeaderMap, name: http::header::HeaderName) -> String {
    h.get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

fn raw(content_type: &str, bytes: Vec<u8>) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from(bytes)).boxed_unsync());
    if let Ok(v) = http::HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    resp
}

fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut v = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

/// The stored objects of one resource type, in (namespace, name) order: a range of the map,
/// not a scan of every object (lists, watches and each write's CRD look-up use it, so their
/// cost is that of the type, not of every event and object stored).
fn of_type<'a>(
    objects: &'a BTreeMap<ObjKey, Stored>,
    group: &'a str,
    plural: &'a str,
) -> impl Iterator<Item = (&'a ObjKey, &'a Stored)> + 'a {
    let start = (
        group.to_owned(),
        plural.to_owned(),
        String::new(),
        String::new(),
    );
    objects
        .range(start..)
        .take_while(move |((g, p, _, _), _)| g == group && p == plural)
}

fn key(r: &Route, name: &str) -> ObjKey {
    (
        r.group.clone(),
        r.plural.clone(),
        r.namespace.clone().unwrap_or_default(),
        name.to_owned(),
    )
}

/// How a write changes an object.
enum Write {
    Replace(Value),
    MergePatch(Value),
    JsonPatch(json_patch::Patch),
    Apply {
        config: Value,
        manager: String,
        force: bool,
    },
}

impl FakeApiServer {
    /// An empty server.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A `kube::Client` whose requests this server answers; `default_namespace` is what
    /// `Api::default_namespaced` uses.
    pub fn client(&self, default_namespace: &str) -> kube::Client {
        kube::Client::new(self.clone(), default_namespace)
    }

    /// Gives the resource `plural` of `group` ("" for core) a status subresource.
    pub fn enable_status_subresource(&self, group: &str, plural: &str) {
        self.lock()
            .status_sub
            .insert((group.to_owned(), plural.to_owned()));
    }

    /// The stored object, if any (`namespace` "" for cluster-scoped ones).
    pub fn object(&self, group: &str, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        self.lock()
            .objects
            .get(&(group.into(), plural.into(), namespace.into(), name.into()))
            .map(|s| s.object.clone())
    }

    /// Every stored object of a resource type, in (namespace, name) order.
    pub fn objects(&self, group: &str, plural: &str) -> Vec<Value> {
        of_type(&self.lock().objects, group, plural)
            .map(|(_, s)| s.object.clone())
            .collect()
    }

    /// Stores a CustomResourceDefinition as a client's create would (checked like one: a CRD
    /// whose rules do not compile or exceed the cost limits is refused), so its resources are
    /// served with its schema, rules and subresources.
    pub fn install_crd(&self, crd: &Value) -> Result<(), String> {
        let route = parse_route("/apis/apiextensions.k8s.io/v1/customresourcedefinitions")
            .ok_or("bad CRD route")?;
        let body = Bytes::from(crd.to_string());
        match self.dispatch(
            &Method::POST,
            &route,
            &BTreeMap::new(),
            "application/json",
            &body,
        ) {
            Ok(_) => Ok(()),
            Err(e) => Err(e.message),
        }
    }

    /// Installs every CRD manifest (`*.yaml`, one document each) in `dir` with
    /// [`FakeApiServer::install_crd`]; returns how many.
    pub fn install_crds_from_dir(&self, dir: &std::path::Path) -> Result<usize, String> {
        let mut paths: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
            .collect();
        paths.sort();
        for p in &paths {
            let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
            let crd: Value =
                serde_saphyr::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))?;
            self.install_crd(&crd)
                .map_err(|e| format!("{}: {e}", p.display()))?;
        }
        Ok(paths.len())
    }

    /// Every field the server dropped from a written custom resource because its CRD's schema
    /// does not declare it (pruning; a real server drops it too). Tests of a client assert this
    /// is empty: what a client writes and the server drops is lost.
    pub fn dropped_fields(&self) -> Vec<DroppedField> {
        self.lock().dropped.clone()
    }

    /// The current resourceVersion (the number of writes so far).
    pub fn resource_version(&self) -> u64 {
        self.lock().rv
    }

    /// Every request so far (up to [`MAX_RECORDED_REQUESTS`], oldest dropped first).
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.lock().requests.iter().cloned().collect()
    }

    /// Keeps only the newest `records` writes for watches to replay, as a real server's watch
    /// cache and etcd compaction do: a watch from a resourceVersion older than what is kept
    /// gets one `ERROR` event with a `410 Expired` Status. Unlimited by default.
    pub fn set_watch_history_limit(&self, records: usize) {
        let mut st = self.lock();
        st.history_limit = Some(records);
        if st.history.len() > records {
            let drop = st.history.len() - records;
            if let Some(last) = st.history.get(drop - 1) {
                st.compacted_rv = last.rv;
            }
            st.history.drain(..drop);
        }
    }

    /// Disconnects every open watch (their streams end; clients re-watch from their last
    /// version), as an API server restart would.
    pub fn disconnect_watches(&self) {
        self.lock().watchers.clear();
    }

    /// Fault injection: from now on, every `method` request (e.g. `"PATCH"`) to exactly `path`
    /// (e.g. `/api/v1/namespaces/default/services/web`) is answered with a 500
    /// `InternalError` and changes nothing, as a failing API server or webhook would.
    pub fn fail_requests(&self, method: &str, path: &str) {
        self.lock()
            .failing
            .push((method.to_owned(), path.to_owned()));
    }

    /// Interleaving injection: the next `method` request to exactly `path` is preceded by
    /// `first` (each a method, a path and an optional JSON body, served as if another client
    /// had sent them just before), once. Lets a test put another writer between a client's
    /// read and its write.
    pub fn before_request(&self, method: &str, path: &str, first: Requests) {
        self.lock()
            .before
            .push((method.to_owned(), path.to_owned(), first));
    }

    /// Starts the garbage collector task on first use (the server may be made outside a
    /// runtime; requests are served inside one), and wakes it when work is queued.
    fn wake_gc(&self) {
        use std::sync::atomic::Ordering;
        if !self.gc_started.swap(true, Ordering::SeqCst) {
            let state = Arc::downgrade(&self.state);
            let wake = self.gc_wake.clone();
            tokio::spawn(gc_task(state, wake));
        }
        if self.lock().gc.pending() {
            self.gc_wake.notify_one();
        }
    }

    /// Holds (`true`) or releases the garbage collector: while held, deletions still set
    /// finalizers and remove objects, but no dependent is collected. Lets a test choose who
    /// acts first, the collector or a client.
    pub fn set_gc_paused(&self, paused: bool) {
        self.lock().gc_paused = paused;
        if !paused {
            self.gc_wake.notify_one();
        }
    }

    /// Runs the garbage collector until it has nothing left to do (even while paused), at once.
    pub fn collect_garbage(&self) {
        while self.lock().gc_steps(gc::BATCH) {}
    }

    /// How many objects the garbage collector has deleted so far.
    pub fn gc_deleted(&self) -> u64 {
        self.lock().gc.deleted
    }

    async fn serve(self, req: Request<kube::client::Body>) -> Response<Body> {
        let (parts, body) = req.into_parts();
        let body = match body.collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => return error_response(&ApiError::bad(format!("unreadable body: {e}"))),
        };
        let content_type = parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let path = parts.uri.path().to_owned();
        let query_str = parts.uri.query().unwrap_or("").to_owned();
        let query: BTreeMap<String, String> = url::form_urlencoded::parse(query_str.as_bytes())
            .into_owned()
            .collect();
        let injected = self
            .lock()
            .failing
            .iter()
            .any(|(m, p)| *m == parts.method.as_str() && *p == path);
        let first = {
            let mut st = self.lock();
            let i = st
                .before
                .iter()
                .position(|(m, p, _)| *m == parts.method.as_str() && *p == path);
            i.map(|i| st.before.remove(i).2).unwrap_or_default()
        };
        for (m, p, b) in first {
            if let (Some(route), Ok(m)) = (parse_route(&p), Method::from_bytes(m.as_bytes())) {
                let bytes = b.map(|v| Bytes::from(v.to_string())).unwrap_or_default();
                let _ = self.dispatch(&m, &route, &BTreeMap::new(), "application/json", &bytes);
            }
        }
        let resp = match parse_route(&path) {
            _ if injected => Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                format!("injected failure for {} {path}", parts.method),
            )),
            None => {
                let accept = header(&parts.headers, http::header::ACCEPT);
                let crds = self.objects(CRD_GROUP, CRD_PLURAL);
                match discovery::non_resource(&crds, &path, &accept) {
                    Some((ct, bytes)) if parts.method == Method::GET => Ok(raw(&ct, bytes)),
                    _ => Err(ApiError::new(
                        StatusCode::NOT_FOUND,
                        "NotFound",
                        "the server could not find the requested resource",
                    )),
                }
            }
            Some(route)
                if parts.method == Method::GET
                    && route.subresource.is_none()
                    && !is_watch(&query)
                    && discovery::wants_table(&header(&parts.headers, http::header::ACCEPT)) =>
            {
                self.table(&route, &query)
            }
            Some(route) => self.dispatch(&parts.method, &route, &query, &content_type, &body),
        };
        let resp = resp.unwrap_or_else(|e| error_response(&e));
        self.wake_gc();
        let mut st = self.lock();
        if st.requests.len() >= MAX_RECORDED_REQUESTS {
            // NB: a VecDeque: dropping the oldest of 100,000 is O(1), not a shift of them all
            // under the server's one lock on every request.
            st.requests.pop_front();
        }
        st.requests.push_back(RecordedRequest {
            method: parts.method.to_string(),
            path,
            query: query_str,
            content_type,
            status: resp.status().as_u16(),
        });
        resp
    }

    fn dispatch(
        &self,
        method: &Method,
        r: &Route,
        q: &BTreeMap<String, String>,
        content_type: &str,
        body: &Bytes,
    ) -> Result<Response<Body>, ApiError> {
        let parse = || -> Result<Value, ApiError> {
            serde_json::from_slice(body).map_err(|e| ApiError::bad(format!("invalid JSON: {e}")))
        };
        if r.subresource.as_deref() == Some("scale")
            && let Some(name) = &r.name
            && let Some(paths) = self.scale_paths(r)
        {
            return self.scale(method, r, name, content_type, body, &paths);
        }
        match (method, &r.name) {
            (&Method::GET, None) if is_watch(q) => Ok(self.watch(r, q)),
            (&Method::GET, None) => Ok(self.list(r, q)),
            (&Method::GET, Some(name)) => {
                let st = self.lock();
                // As on a real server, a subresource is served only where it exists: `/status`
                // of a type with the status subresource; no other (no `/scale`).
                match r.subresource.as_deref() {
                    None => {}
                    Some("status") if st.status_sub(r) => {}
                    Some(_) => {
                        return Err(ApiError::new(
                            StatusCode::NOT_FOUND,
                            "NotFound",
                            "the server could not find the requested resource",
                        ));
                    }
                }
                st.objects
                    .get(&key(r, name))
                    .map(|s| full(StatusCode::OK, &s.object))
                    .ok_or_else(|| ApiError::not_found(r, name))
            }
            (&Method::POST, None) => self.create(r, q, parse()?),
            (&Method::PUT, Some(name)) => self.write(r, name, q, Write::Replace(parse()?)),
            (&Method::PATCH, Some(name)) => {
                let ct = content_type.split(';').next().unwrap_or("").trim();
                let w = match ct {
                    // A real server serves no strategic merge patch for custom resources (they
                    // carry no patch strategy): 415.
                    "application/strategic-merge-patch+json" if self.is_custom(r) => {
                        return Err(ApiError::new(
                            StatusCode::UNSUPPORTED_MEDIA_TYPE,
                            "UnsupportedMediaType",
                            "the body of the request was in an unknown format - accepted media \
                             types include: application/json-patch+json, \
                             application/merge-patch+json, application/apply-patch+yaml",
                        ));
                    }
                    "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
                        Write::MergePatch(parse()?)
                    }
                    "application/json-patch+json" => Write::JsonPatch(
                        serde_json::from_slice(body)
                            .map_err(|e| ApiError::bad(format!("invalid JSON patch: {e}")))?,
                    ),
                    "application/apply-patch+yaml" => {
                        let manager = q
                            .get("fieldManager")
                            .filter(|m| !m.is_empty())
                            .ok_or_else(|| {
                                ApiError::bad("fieldManager is required for apply patch")
                            })?
                            .clone();
                        Write::Apply {
                            config: parse()?,
                            manager,
                            force: q.get("force").is_some_and(|f| f == "true"),
                        }
                    }
                    other => {
                        return Err(ApiError::new(
                            StatusCode::UNSUPPORTED_MEDIA_TYPE,
                            "UnsupportedMediaType",
                            format!("unsupported patch type {other:?}"),
                        ));
                    }
                };
                self.write(r, name, q, w)
            }
            (&Method::DELETE, Some(name)) => {
                // DeleteOptions (optional body): `preconditions.uid` / `.resourceVersion`.
                let opts = if body.is_empty() {
                    Value::Null
                } else {
                    parse()?
                };
                self.delete(r, name, &opts)
            }
            _ => Err(ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                format!("{method} is not supported here"),
            )),
        }
    }

    /// A `meta.k8s.io/v1` Table of a get or a list (server-side printing, what kubectl asks
    /// for), with the CRD's printer columns.
    fn table(&self, r: &Route, q: &BTreeMap<String, String>) -> Result<Response<Body>, ApiError> {
        let crds = self.objects(CRD_GROUP, CRD_PLURAL);
        let info = discovery::find(&crds, &r.group, &r.version, &r.plural);
        let include = q.get("includeObject").map_or("Metadata", String::as_str);
        let (objects, rv) = match &r.name {
            Some(name) => {
                let st = self.lock();
                let o = st
                    .objects
                    .get(&key(r, name))
                    .map(|s| s.object.clone())
                    .ok_or_else(|| ApiError::not_found(r, name))?;
                (vec![o], None)
            }
            None => {
                let list = self.list_value(r, q);
                let items = list
                    .get("items")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let rv = list
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                (items, rv)
            }
        };
        Ok(full(
            StatusCode::OK,
            &discovery::table(info.as_ref(), &objects, rv.as_deref(), include),
        ))
    }

    /// Is `r` a custom resource (served because a stored CRD defines it)?
    fn is_custom(&self, r: &Route) -> bool {
        self.objects(CRD_GROUP, CRD_PLURAL).iter().any(|crd| {
            crd.pointer("/spec/group").and_then(Value::as_str) == Some(r.group.as_str())
                && crd.pointer("/spec/names/plural").and_then(Value::as_str)
                    == Some(r.plural.as_str())
        })
    }

    fn list(&self, r: &Route, q: &BTreeMap<String, String>) -> Response<Body> {
        full(StatusCode::OK, &self.list_value(r, q))
    }

    fn list_value(&self, r: &Route, q: &BTreeMap<String, String>) -> Value {
        let crds = self.objects(CRD_GROUP, CRD_PLURAL);
        let advertised = discovery::find(&crds, &r.group, &r.version, &r.plural);
        let sel = Selectors::parse(q);
        let st = self.lock();
        let items: Vec<Value> = of_type(&st.objects, &r.group, &r.plural)
            .filter(|((_, _, ns, _), s)| {
                r.namespace.as_ref().is_none_or(|n| n == ns) && sel.matches(&s.object)
            })
            .map(|(_, s)| s.object.clone())
            .collect();
        // The list kind is `{Kind}List` even when the list is empty, as on a real server.
        let kind = advertised
            .map(|a| a.kind)
            .or_else(|| {
                items
                    .first()
                    .and_then(|o| o.get("kind"))
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .map_or_else(|| "List".to_owned(), |k| format!("{k}List"));
        json!({
            "apiVersion": r.api_version(), "kind": kind,
            "metadata": {"resourceVersion": st.rv.to_string()},
            "items": items,
        })
    }

    fn watch(&self, r: &Route, q: &BTreeMap<String, String>) -> Response<Body> {
        let selectors = Selectors::parse(q);
        let from: Option<u64> = q
            .get("resourceVersion")
            .filter(|v| !v.is_empty() && *v != "0")
            .and_then(|v| v.parse().ok());
        let timeout = q
            .get("timeoutSeconds")
            .and_then(|t| t.parse().ok())
            .map_or(DEFAULT_WATCH_TIMEOUT, Duration::from_secs);
        let bookmarks = q
            .get("allowWatchBookmarks")
            .is_some_and(|b| b == "true" || b == "1");
        let crds = self.objects(CRD_GROUP, CRD_PLURAL);
        let kind = discovery::find(&crds, &r.group, &r.version, &r.plural).map(|i| i.kind);
        let (tx, rx) = mpsc::channel(WATCH_QUEUE);
        let (backlog, rv) = {
            let mut st = self.lock();
            if let Some(from) = from
                && from < st.compacted_rv
            {
                // As a real server: the watch itself is accepted, then its one event is an
                // ERROR carrying a 410 `Expired` Status, and the stream ends.
                let e = ApiError::new(
                    StatusCode::GONE,
                    "Expired",
                    format!(
                        "too old resource version: {from} ({})",
                        st.compacted_rv.saturating_add(1)
                    ),
                );
                drop(st);
                let line = event_line("ERROR", &status_body(&e));
                let mut resp = Response::new(Full::new(line).boxed_unsync());
                resp.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("application/json"),
                );
                return resp;
            }
            let w = Watcher {
                group: r.group.clone(),
                plural: r.plural.clone(),
                namespace: r.namespace.clone(),
                selectors,
                tx,
            };
            let backlog: Vec<Bytes> = match from {
                Some(from) => st
                    .history
                    .iter()
                    .filter(|rec| rec.rv > from && w.matches(rec))
                    .map(|rec| rec.line.clone())
                    .collect(),
                // No version: synthetic ADDED events for what exists now.
                None => of_type(&st.objects, &r.group, &r.plural)
                    .filter(|((_, _, ns, _), s)| {
                        r.namespace.as_ref().is_none_or(|n| n == ns)
                            && w.selectors.matches(&s.object)
                    })
                    .map(|(_, s)| event_line("ADDED", &s.object))
                    .collect(),
            };
            st.watchers.push(w);
            (backlog, st.rv)
        };
        // A bookmark only when the client asked for them (`allowWatchBookmarks`), as an object
        // of the watched kind carrying only `metadata.resourceVersion`.
        let mut bookmark_obj = json!({"apiVersion": r.api_version(),
            "metadata": {"resourceVersion": rv.to_string()}});
        if let (Some(k), Some(o)) = (kind, bookmark_obj.as_object_mut()) {
            o.insert("kind".into(), Value::String(k));
        }
        let bookmark = bookmarks.then(|| event_line("BOOKMARK", &bookmark_obj));
        let stream = futures_util::stream::iter(backlog)
            .chain(futures_util::stream::iter(bookmark))
            .chain(futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|b| (b, rx))
            }))
            .take_until(tokio::time::sleep(timeout))
            .map(|b| Ok::<_, Infallible>(http_body::Frame::data(b)));
        let mut resp = Response::new(StreamBody::new(stream).boxed_unsync());
        resp.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        resp
    }

    fn create(
        &self,
        r: &Route,
        q: &BTreeMap<String, String>,
        obj: Value,
    ) -> Result<Response<Body>, ApiError> {
        self.create_with(r, q, obj, None)
    }

    /// Creates `obj`; `seed` carries the field ownership of an apply that creates.
    fn create_with(
        &self,
        r: &Route,
        q: &BTreeMap<String, String>,
        mut obj: Value,
        seed: Option<Stored>,
    ) -> Result<Response<Body>, ApiError> {
        // A real server's responses always name the kind, even when the request body did not.
        let crds = self.objects(CRD_GROUP, CRD_PLURAL);
        if let Some(info) = discovery::find(&crds, &r.group, &r.version, &r.plural)
            && let Some(o) = obj.as_object_mut()
            && o.get("kind")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
        {
            o.insert("kind".into(), Value::String(info.kind));
        }
        let mut st = self.lock();
        let name = match obj.pointer("/metadata/name").and_then(Value::as_str) {
            Some(n) if !n.is_empty() => n.to_owned(),
            _ => match obj
                .pointer("/metadata/generateName")
                .and_then(Value::as_str)
            {
                Some(prefix) => format!("{prefix}{:05x}", st.rv.saturating_add(1)),
                None => return Err(ApiError::bad("metadata.name is required")),
            },
        };
        let k = key(r, &name);
        if st.objects.contains_key(&k) {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", r.plural),
            ));
        }
        // As the server decodes the body: pruned, null-pruned and defaulted by the schema.
        let ts = st.type_schema(r);
        let warnings = st.decode(ts.as_deref(), &mut obj, "POST", object_path(r, &name), q)?;
        if st.status_sub(r)
            && let Some(o) = obj.as_object_mut()
        {
            o.remove("status");
        }
        let is_crd = r.group == CRD_GROUP && r.plural == CRD_PLURAL;
        if is_crd {
            schema::compile_crd(&obj).map_err(|errs| {
                ApiError::invalid(CRD_GROUP, "CustomResourceDefinition", &name, &errs)
            })?;
            set_crd_status(&mut obj);
        }
        if let Some(o) = obj.as_object_mut() {
            o.insert("apiVersion".into(), Value::String(r.api_version()));
        }
        let manager = q.get("fieldManager").cloned();
        let meta = meta_mut(&mut obj).ok_or_else(|| ApiError::bad("object expected"))?;
        for f in SERVER_META {
            meta.remove(*f);
        }
        meta.insert("name".into(), Value::String(name.clone()));
        if let Some(ns) = &r.namespace {
            meta.insert("namespace".into(), Value::String(ns.clone()));
        }
        meta.insert("generation".into(), json!(1));
        let errs = match &ts {
            Some(ts) => ts.validate_create(&obj),
            None => schema::meta::validate(
                &obj,
                schema::meta::NameRule::of_builtin(&r.group, &r.plural),
                r.namespace.is_some(),
                false,
            ),
        };
        if !errs.is_empty() {
            let kind = ts
                .as_ref()
                .map_or_else(|| kind_for_errors(&obj, r), |t| t.kind.clone());
            return Err(ApiError::invalid(&r.group, &kind, &name, &errs));
        }
        st.uid_counter = st.uid_counter.saturating_add(1);
        let uid = format!("00000000-0000-4000-8000-{:012x}", st.uid_counter);
        let rv = st.next_rv();
        let meta = meta_mut(&mut obj).ok_or_else(|| ApiError::bad("object expected"))?;
        meta.insert("uid".into(), Value::String(uid));
        meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
        meta.insert("generation".into(), json!(1));
        meta.insert("creationTimestamp".into(), Value::String(now_rfc3339()));
        let seeded = seed.is_some();
        let (applied, managers) = seed.map(|s| (s.applied, s.managers)).unwrap_or_default();
        let mut stored = Stored {
            object: obj,
            applied,
            managers,
        };
        if let Some(m) = manager {
            stored.managers.insert((m, "Update".into(), String::new()));
        }
        if seeded || !stored.managers.is_empty() {
            set_managed_fields(&mut stored, &r.api_version());
        }
        let out = stored.object.clone();
        st.objects.insert(k, stored);
        st.record(&r.group, &r.plural, "ADDED", out.clone());
        if is_crd {
            st.rebuild_types();
        }
        Ok(with_warnings(full(StatusCode::CREATED, &out), &warnings))
    }

    fn write(
        &self,
        r: &Route,
        name: &str,
        q: &BTreeMap<String, String>,
        w: Write,
    ) -> Result<Response<Body>, ApiError> {
        let status_write = match r.subresource.as_deref() {
            None => false,
            Some("status") => true,
            Some(_) => {
                return Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    "the server could not find the requested resource",
                ));
            }
        };
        let mut st = self.lock();
        let status_sub = st.status_sub(r);
        if status_write && !status_sub {
            return Err(ApiError::not_found(r, &format!("{name}/status")));
        }
        let k = key(r, name);
        let old = match st.objects.get(&k) {
            Some(s) => s.clone(),
            None => match &w {
                // Apply creates what does not exist (not through /status).
                // As on a real server, it is one create: one ADDED event, generation 1, 201
                // Created, the applier owning what it applied.
                Write::Apply {
                    config,
                    manager,
                    force,
                } if !status_write => {
                    drop(st);
                    let mut cfg = config.clone();
                    restrict(&mut cfg, false, status_sub);
                    let mut seed = Stored {
                        object: json!({}),
                        applied: BTreeMap::new(),
                        managers: BTreeSet::new(),
                    };
                    let mut obj = apply(&mut seed, &json!({}), &cfg, manager, "", *force)?;
                    seed.managers
                        .insert((manager.clone(), "Apply".into(), String::new()));
                    if let Some(o) = obj.as_object_mut() {
                        o.insert(
                            "kind".into(),
                            config.get("kind").cloned().unwrap_or(Value::Null),
                        );
                    }
                    if let Some(m) = meta_mut(&mut obj) {
                        m.insert("name".into(), Value::String(name.to_owned()));
                    }
                    let mut created_q = q.clone();
                    created_q.remove("fieldManager");
                    return self.create_with(r, &created_q, obj, Some(seed));
                }
                _ => return Err(ApiError::not_found(r, name)),
            },
        };
        let old_obj = old.object.clone();
        let mut stored = old.clone();
        let (mut new, op) = match w {
            Write::Replace(v) => {
                let want_rv = v
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str);
                let have_rv = old_obj
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str);
                if want_rv.is_some_and(|w| !w.is_empty()) && want_rv != have_rv {
                    return Err(ApiError::conflict(format!(
                        "Operation cannot be fulfilled on {} \"{name}\": the object has been \
                         modified; please apply your changes to the latest version and try again",
                        r.plural
                    )));
                }
                (v, "Update")
            }
            Write::MergePatch(p) => {
                let mut v = old_obj.clone();
                json_patch::merge(&mut v, &p);
                check_patched_rv(&old_obj, &p, r, name)?;
                (v, "Update")
            }
            Write::JsonPatch(p) => {
                let mut v = old_obj.clone();
                json_patch::patch(&mut v, &p).map_err(|e| {
                    ApiError::new(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "Invalid",
                        format!("JSON patch failed: {e}"),
                    )
                })?;
                (v, "Update")
            }
            Write::Apply {
                config,
                manager,
                force,
            } => {
                let sub = if status_write { "status" } else { "" };
                // A resourceVersion in the applied config is a precondition, as on a real
                // server.
                let want_rv = config
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str);
                let have_rv = old_obj
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str);
                if want_rv.is_some_and(|w| !w.is_empty()) && want_rv != have_rv {
                    return Err(ApiError::conflict(format!(
                        "Operation cannot be fulfilled on {} \"{name}\": the object has been \
                         modified; please apply your changes to the latest version and try again",
                        r.plural
                    )));
                }
                let mut config = config;
                restrict(&mut config, status_write, status_sub);
                let v = apply(&mut stored, &old_obj, &config, &manager, sub, force)?;
                stored
                    .managers
                    .insert((manager, "Apply".into(), sub.to_owned()));
                (v, "Apply")
            }
        };
        if op == "Update"
            && let Some(m) = q.get("fieldManager")
        {
            let sub = if status_write { "status" } else { "" };
            stored
                .managers
                .insert((m.clone(), "Update".into(), sub.to_owned()));
        }
        // As the server decodes the body: pruned, null-pruned and defaulted by the schema.
        let ts = st.type_schema(r);
        let method = if matches!(op, "Apply") {
            "PATCH"
        } else {
            "PUT/PATCH"
        };
        let warnings = st.decode(ts.as_deref(), &mut new, method, object_path(r, name), q)?;
        // Status subresource rules.
        if status_sub {
            let old_status = old_obj.get("status").cloned();
            if status_write {
                let new_status = new.get("status").cloned();
                new = old_obj.clone();
                set_key(&mut new, "status", new_status);
            } else {
                set_key(&mut new, "status", old_status);
            }
        }
        // Server-owned metadata and identity stay as they were.
        let old_meta = old_obj.get("metadata").cloned().unwrap_or(json!({}));
        if let Some(o) = new.as_object_mut() {
            o.insert("apiVersion".into(), Value::String(r.api_version()));
            if let Some(k) = old_obj.get("kind") {
                o.insert("kind".into(), k.clone());
            }
        }
        let meta = meta_mut(&mut new).ok_or_else(|| ApiError::bad("object expected"))?;
        for f in SERVER_META.iter().chain(["name", "namespace"].iter()) {
            match old_meta.get(*f) {
                Some(v) => meta.insert((*f).to_owned(), v.clone()),
                None => meta.remove(*f),
            };
        }
        // Once deletion has started, finalizers can only be removed, never added.
        if old_obj.pointer("/metadata/deletionTimestamp").is_some() {
            let list = |o: &Value| -> Vec<Value> {
                o.pointer("/metadata/finalizers")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default()
            };
            let before = list(&old_obj);
            let added: Vec<Value> = list(&new)
                .into_iter()
                .filter(|f| !before.contains(f))
                .collect();
            if !added.is_empty() {
                return Err(ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Invalid",
                    format!(
                        "{} {name:?} is invalid: metadata.finalizers: Forbidden: no new \
                         finalizers can be added if the object is being deleted, found new \
                         finalizers {added:?}",
                        r.plural
                    ),
                ));
            }
        }
        let errs = match (&ts, status_write) {
            (Some(ts), false) => ts.validate_update(&new, &old_obj),
            (Some(ts), true) => ts.validate_status(&new, &old_obj),
            (None, _) => schema::meta::validate(
                &new,
                schema::meta::NameRule::of_builtin(&r.group, &r.plural),
                r.namespace.is_some(),
                true,
            ),
        };
        if !errs.is_empty() {
            let kind = ts
                .as_ref()
                .map_or_else(|| kind_for_errors(&new, r), |t| t.kind.clone());
            return Err(ApiError::invalid(&r.group, &kind, name, &errs));
        }
        let is_crd = r.group == CRD_GROUP && r.plural == CRD_PLURAL;
        if is_crd {
            schema::compile_crd(&new).map_err(|errs| {
                ApiError::invalid(CRD_GROUP, "CustomResourceDefinition", name, &errs)
            })?;
            set_crd_status(&mut new);
        }
        if new == old_obj {
            // A no-op write changes nothing (no new version, no event), as on a real server.
            st.objects.insert(k, stored);
            return Ok(with_warnings(full(StatusCode::OK, &old_obj), &warnings));
        }
        let generation = old_obj
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let rv = st.next_rv();
        let bump = spec_part(&new) != spec_part(&old_obj);
        if let Some(meta) = meta_mut(&mut new) {
            meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
            if bump {
                meta.insert("generation".into(), json!(generation.saturating_add(1)));
            }
        }
        stored.object = new;
        set_managed_fields(&mut stored, &r.api_version());
        let out = stored.object.clone();
        let deleting = out.pointer("/metadata/deletionTimestamp").is_some();
        if deleting && !has_finalizers(&out) {
            st.objects.remove(&k);
            st.record(&r.group, &r.plural, "DELETED", out.clone());
        } else {
            st.objects.insert(k, stored);
            st.record(&r.group, &r.plural, "MODIFIED", out.clone());
        }
        if is_crd {
            st.rebuild_types();
        }
        Ok(with_warnings(full(StatusCode::OK, &out), &warnings))
    }

    fn delete(&self, r: &Route, name: &str, opts: &Value) -> Result<Response<Body>, ApiError> {
        let mut st = self.lock();
        let k = key(r, name);
        let Some(stored) = st.objects.get(&k).cloned() else {
            return Err(ApiError::not_found(r, name));
        };
        // As a real API server: a precondition that does not hold is a 409 Conflict and
        // nothing is deleted.
        for (field, meta) in [("uid", "uid"), ("resourceVersion", "resourceVersion")] {
            if let Some(want) = opts
                .pointer(&format!("/preconditions/{field}"))
                .and_then(Value::as_str)
            {
                let have = stored
                    .object
                    .pointer(&format!("/metadata/{meta}"))
                    .and_then(Value::as_str)
                    .unwrap_or("");
                if want != have {
                    return Err(ApiError::conflict(format!(
                        "Operation cannot be fulfilled on {} {name:?}: Precondition failed: \
                         {field} in precondition: {want}, {field} in object meta: {have}",
                        r.plural
                    )));
                }
            }
        }
        let policy = gc::Policy::of(opts).map_err(|m| {
            let kind = kind_for_errors(&stored.object, r);
            let mut e = ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Invalid",
                format!("DeleteOptions.meta.k8s.io {name:?} is invalid: {m}"),
            );
            e.details = Some(json!({"name": name, "kind": kind}));
            e
        })?;
        if let Some(gone) = st.delete_with(&k, policy) {
            if r.group == CRD_GROUP && r.plural == CRD_PLURAL {
                st.rebuild_types();
            }
            return Ok(full(StatusCode::OK, &gone));
        }
        let out = st.objects.get(&k).map(|s| s.object.clone());
        Ok(full(StatusCode::ACCEPTED, &out.unwrap_or(Value::Null)))
    }
}

/// A CRD's status as a real server reports it once the CRD is served: its names accepted, the
/// `NamesAccepted` and `Established` conditions true, the storage version stored.
fn set_crd_status(crd: &mut Value) {
    let names = crd.pointer("/spec/names").cloned().unwrap_or(json!({}));
    let stored: Vec<Value> = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .filter_map(|v| v.get("name").cloned())
        .collect();
    let since = crd
        .pointer("/status/conditions/0/lastTransitionTime")
        .cloned()
        .unwrap_or_else(|| Value::String(now_rfc3339()));
    set_key(
        crd,
        "status",
        Some(json!({
            "acceptedNames": names,
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
                 "message": "no conflicts found", "lastTransitionTime": since},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                 "message": "the initial names have been accepted", "lastTransitionTime": since},
            ],
            "storedVersions": stored,
        })),
    );
}

fn set_key(obj: &mut Value, k: &str, v: Option<Value>) {
    if let Some(o) = obj.as_object_mut() {
        match v {
            Some(v) => o.insert(k.to_owned(), v),
            None => o.remove(k),
        };
    }
}

/// A merge patch that names a resourceVersion must name the current one.
fn check_patched_rv(old: &Value, patch: &Value, r: &Route, name: &str) -> Result<(), ApiError> {
    let want = patch
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str);
    let have = old
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str);
    match want {
        Some(w) if Some(w) != have => Err(ApiError::conflict(format!(
            "Operation cannot be fulfilled on {} \"{name}\": the object has been modified",
            r.plural
        ))),
        _ => Ok(()),
    }
}

/// Keeps only what an apply to this endpoint may set: `status` through `/status`; everything
/// but `status` through the main resource when a status subresource exists.
fn restrict(config: &mut Value, status_write: bool, status_sub: bool) {
    let Some(o) = config.as_object_mut() else {
        return;
    };
    o.remove("apiVersion");
    o.remove("kind");
    if let Some(Value::Object(m)) = o.get_mut("metadata") {
        m.remove("name");
        m.remove("namespace");
        for f in SERVER_META {
            m.remove(*f);
        }
        if m.is_empty() {
            o.remove("metadata");
        }
    }
    if status_write {
        o.retain(|k, _| k == "status");
    } else if status_sub {
        o.remove("status");
    }
}

/// Server-side apply of `config` by `manager` on `sub` (see the module docs).
fn apply(
    stored: &mut Stored,
    old: &Value,
    config: &Value,
    manager: &str,
    sub: &str,
    force: bool,
) -> Result<Value, ApiError> {
    let mut paths = BTreeSet::new();
    leaves(config, "", &mut paths);
    paths.remove("");
    let me = (manager.to_owned(), sub.to_owned());
    // (manager, field path in `.a.b` form) of every conflicting leaf.
    let mut conflicts: Vec<(String, String)> = Vec::new();
    for (owner, owned) in &stored.applied {
        if *owner == me {
            continue;
        }
        for p in paths.intersection(owned) {
            if old.pointer(p) != config.pointer(p) {
                let field = p.replace('/', ".").replace("~1", "/").replace("~0", "~");
                conflicts.push((owner.0.clone(), field));
            }
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(apply_conflict(&conflicts));
    }
    if force {
        for (owner, owned) in stored.applied.iter_mut() {
            if *owner != me {
                owned.retain(|p| !paths.contains(p));
            }
        }
    }
    let mut new = old.clone();
    let before = stored.applied.get(&me).cloned().unwrap_or_default();
    for p in before.difference(&paths) {
        let others = stored
            .applied
            .iter()
            .any(|(o, owned)| *o != me && owned.contains(p));
        if !others {
            remove_path(&mut new, p);
        }
    }
    deep_merge(&mut new, config);
    stored.applied.insert(me, paths);
    Ok(new)
}

/// The 409 of an apply that would change fields other managers own, worded and detailed as a
/// real server words it: `Apply failed with 1 conflict: conflict with "mgr": .spec.x`, one
/// `FieldManagerConflict` cause per field.
fn apply_conflict(conflicts: &[(String, String)]) -> ApiError {
    let n = conflicts.len();
    let plural = if n == 1 { "" } else { "s" };
    let mut by_manager: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (m, f) in conflicts {
        by_manager.entry(m).or_default().push(f);
    }
    let parts: Vec<String> = by_manager
        .iter()
        .map(|(m, fields)| match fields.as_slice() {
            [one] => format!("conflict with {m:?}: {one}"),
            many => format!(
                "conflicts with {m:?}:\n{}",
                many.iter()
                    .map(|f| format!("- {f}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            ),
        })
        .collect();
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|(m, f)| {
            json!({"reason": "FieldManagerConflict", "message": format!("conflict with {m:?}"),
                   "field": f})
        })
        .collect();
    let mut e = ApiError::conflict(format!(
        "Apply failed with {n} conflict{plural}: {}",
        parts.join("\n")
    ));
    e.details = Some(json!({"causes": causes}));
    e
}

fn set_managed_fields(stored: &mut Stored, api_version: &str) {
    let entries: Vec<Value> = stored
        .managers
        .iter()
        .map(|(m, op, sub)| {
            let mut e = json!({"manager": m, "operation": op, "apiVersion": api_version});
            if !sub.is_empty()
                && let Some(o) = e.as_object_mut()
            {
                o.insert("subresource".into(), Value::String(sub.clone()));
            }
            e
        })
        .collect();
    if let Some(meta) = meta_mut(&mut stored.object) {
        if entries.is_empty() {
            meta.remove("managedFields");
        } else {
            meta.insert("managedFields".into(), Value::Array(entries));
        }
    }
}

impl tower_service::Service<Request<kube::client::Body>> for FakeApiServer {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<kube::client::Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.serve(req).await) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_of_core_group_namespaced_and_cluster_scoped_resources_parse() {
        let r = parse_route("/api/v1/namespaces/ns1/secrets/s").unwrap();
        assert_eq!(
            (
                r.group.as_str(),
                r.plural.as_str(),
                r.namespace.as_deref(),
                r.name.as_deref()
            ),
            ("", "secrets", Some("ns1"), Some("s"))
        );
        let r =
            parse_route("/apis/egress-proxies.dev/v1alpha1/namespaces/a/proxies/p/status").unwrap();
        assert_eq!(r.subresource.as_deref(), Some("status"));
        let r = parse_route("/apis/egress-proxies.dev/v1alpha1/providerhealths/home").unwrap();
        assert_eq!((r.namespace, r.name.as_deref()), (None, Some("home")));
        assert!(parse_route("/version").is_none());
    }
}
