//! The fake API server through a real `kube::Client`: CRUD with resourceVersions, the status
//! subresource and generations, finalizers, server-side apply with conflicts, and a
//! kube-runtime watcher seeing every change.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::runtime::watcher;
use kube_fake::FakeApiServer;
use serde_json::json;

fn widget_api(s: &FakeApiServer) -> Api<DynamicObject> {
    s.enable_status_subresource("example.dev", "widgets");
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.dev", "v1", "Widget"),
        "widgets",
    );
    Api::namespaced_with(s.client("default"), "default", &ar)
}

fn widget(name: &str, size: i64) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "example.dev/v1", "kind": "Widget",
        "metadata": {"name": name},
        "spec": {"size": size},
        "status": {"ignored": true},
    }))
    .unwrap()
}

#[tokio::test]
async fn objects_get_uids_versions_and_stale_replaces_conflict() {
    let s = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::default_namespaced(s.client("default"));
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("c".into());
    let created = api.create(&PostParams::default(), &cm).await.unwrap();
    assert!(created.metadata.uid.is_some());
    let rv1 = created.metadata.resource_version.clone().unwrap();
    let err = api.create(&PostParams::default(), &cm).await.unwrap_err();
    assert!(matches!(err, kube::Error::Api(e) if e.code == 409 && e.reason == "AlreadyExists"));

    let mut next = created.clone();
    next.data = Some([("k".to_string(), "v".to_string())].into());
    let replaced = api
        .replace("c", &PostParams::default(), &next)
        .await
        .unwrap();
    assert_ne!(replaced.metadata.resource_version.unwrap(), rv1);
    // `next` still carries the old version: a second replace is stale.
    let err = api
        .replace("c", &PostParams::default(), &next)
        .await
        .unwrap_err();
    assert!(matches!(err, kube::Error::Api(e) if e.code == 409 && e.reason == "Conflict"));
    api.delete("c", &DeleteParams::default()).await.unwrap();
    assert!(matches!(api.get("c").await, Err(kube::Error::Api(e)) if e.code == 404));
}

#[tokio::test]
async fn status_writes_touch_only_status_and_spec_changes_bump_the_generation() {
    let s = FakeApiServer::new();
    let api = widget_api(&s);
    let w = api
        .create(&PostParams::default(), &widget("w", 1))
        .await
        .unwrap();
    assert!(w.data.get("status").is_none(), "create drops status");
    assert_eq!(w.metadata.generation, Some(1));

    let pp = PatchParams::apply("ctl").force();
    let st = json!({"apiVersion": "example.dev/v1", "kind": "Widget",
                    "spec": {"size": 99}, "status": {"phase": "Running"}});
    let w = api
        .patch_status("w", &pp, &Patch::Apply(&st))
        .await
        .unwrap();
    assert_eq!(w.data["status"]["phase"], "Running");
    assert_eq!(
        w.data["spec"]["size"], 1,
        "a status write never touches spec"
    );
    assert_eq!(w.metadata.generation, Some(1));

    let spec = json!({"spec": {"size": 2}, "status": {"phase": "Hacked"}});
    let w = api
        .patch("w", &PatchParams::default(), &Patch::Merge(&spec))
        .await
        .unwrap();
    assert_eq!(w.data["spec"]["size"], 2);
    assert_eq!(
        w.data["status"]["phase"], "Running",
        "a spec write never touches status"
    );
    assert_eq!(w.metadata.generation, Some(2));
    let managers: Vec<_> = w
        .metadata
        .managed_fields
        .unwrap()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert_eq!(managers, ["ctl"]);
}

#[tokio::test]
async fn a_finalizer_holds_a_deleted_object_until_it_is_removed() {
    let s = FakeApiServer::new();
    let api = widget_api(&s);
    let mut w = widget("w", 1);
    w.metadata.finalizers = Some(vec!["example.dev/cleanup".into()]);
    api.create(&PostParams::default(), &w).await.unwrap();
    api.delete("w", &DeleteParams::default()).await.unwrap();
    let held = api.get("w").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    let rm = json!([{"op": "test", "path": "/metadata/finalizers/0", "value": "example.dev/cleanup"},
                    {"op": "remove", "path": "/metadata/finalizers/0"}]);
    let p: json_patch::Patch = serde_json::from_value(rm).unwrap();
    api.patch("w", &PatchParams::default(), &Patch::Json::<()>(p))
        .await
        .unwrap();
    assert!(matches!(api.get("w").await, Err(kube::Error::Api(e)) if e.code == 404));
}

#[tokio::test]
async fn apply_conflicts_with_another_manager_unless_forced_and_drops_omitted_fields() {
    let s = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::default_namespaced(s.client("default"));
    let a = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"},
                   "data": {"x": "1", "y": "1"}});
    api.patch("c", &PatchParams::apply("a"), &Patch::Apply(&a))
        .await
        .unwrap();
    let b = json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"x": "2"}});
    let err = api
        .patch("c", &PatchParams::apply("b"), &Patch::Apply(&b))
        .await
        .unwrap_err();
    assert!(matches!(err, kube::Error::Api(e) if e.code == 409));
    api.patch("c", &PatchParams::apply("b").force(), &Patch::Apply(&b))
        .await
        .unwrap();
    // `a` now omits y: it goes; x belongs to b now and stays.
    let a2 = json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {}});
    let c = api
        .patch("c", &PatchParams::apply("a"), &Patch::Apply(&a2))
        .await
        .unwrap();
    assert_eq!(c.data.unwrap(), [("x".to_string(), "2".to_string())].into());
}

#[tokio::test]
async fn a_watcher_sees_adds_modifications_and_deletes_in_order() {
    let s = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::default_namespaced(s.client("default"));
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("before".into());
    api.create(&PostParams::default(), &cm).await.unwrap();
    let mut stream = watcher(api.clone(), watcher::Config::default()).boxed();
    let mut seen = Vec::new();
    let writer = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        cm.metadata.name = Some("after".into());
        api.create(&PostParams::default(), &cm).await.unwrap();
        api.delete("before", &DeleteParams::default())
            .await
            .unwrap();
    };
    let reader = async {
        while let Some(ev) = stream.next().await {
            let line = match ev.unwrap() {
                watcher::Event::InitApply(o) => format!("init {}", o.metadata.name.unwrap()),
                watcher::Event::Apply(o) => format!("apply {}", o.metadata.name.unwrap()),
                watcher::Event::Delete(o) => format!("delete {}", o.metadata.name.unwrap()),
                watcher::Event::Init | watcher::Event::InitDone => continue,
            };
            seen.push(line);
            if seen.len() == 3 {
                break;
            }
        }
    };
    tokio::time::timeout(
        Duration::from_secs(10),
        futures_util::future::join(writer, reader),
    )
    .await
    .unwrap();
    assert_eq!(seen, ["init before", "apply after", "delete before"]);
}

/// The body of a watch `path` (from a resourceVersion, so it replays history), read until
/// `lines` events arrived.
async fn replayed(s: &FakeApiServer, path: &str, lines: usize) -> Vec<serde_json::Value> {
    let client = s.client("default");
    let req = http::Request::get(path).body(Vec::new()).unwrap();
    let mut stream = client
        .request_events::<serde_json::Value>(req)
        .await
        .unwrap()
        .boxed();
    let mut out = Vec::new();
    while out.len() < lines {
        let ev = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        out.push(serde_json::to_value(ev).unwrap());
    }
    out
}

#[tokio::test]
async fn a_watch_from_an_old_version_replays_exactly_the_matching_writes_in_order() {
    let s = FakeApiServer::new();
    // A first write, so that the watches below start from a real version (0 means "now").
    let other: Api<ConfigMap> = Api::namespaced(s.client("c"), "c");
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("first".into());
    other.create(&PostParams::default(), &cm).await.unwrap();
    let start = s.resource_version();
    for (ns, name, team) in [
        ("a", "m1", "x"),
        ("b", "m2", "x"),
        ("a", "m3", "y"),
        ("a", "m4", "x"),
    ] {
        let api: Api<ConfigMap> = Api::namespaced(s.client(ns), ns);
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        cm.metadata.labels = Some([("team".to_owned(), team.to_owned())].into());
        cm.data = Some([("k".to_owned(), format!("v-{name}"))].into());
        api.create(&PostParams::default(), &cm).await.unwrap();
    }
    let api: Api<ConfigMap> = Api::namespaced(s.client("a"), "a");
    api.patch(
        "m1",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "changed"}})),
    )
    .await
    .unwrap();
    api.delete("m3", &DeleteParams::default()).await.unwrap();

    // Namespace a, team=x: m1 added, m4 added, m1 modified (m2 is in b, m3 is team y).
    let evs = replayed(
        &s,
        &format!("/api/v1/namespaces/a/configmaps?watch=true&resourceVersion={start}&labelSelector=team%3Dx"),
        3,
    )
    .await;
    let got: Vec<(String, String, String)> = evs
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap().to_owned(),
                e["object"]["metadata"]["name"].as_str().unwrap().to_owned(),
                e["object"]["data"]["k"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let want = [
        ("ADDED", "m1", "v-m1"),
        ("ADDED", "m4", "v-m4"),
        ("MODIFIED", "m1", "changed"),
    ]
    .map(|(a, b, c)| (a.to_owned(), b.to_owned(), c.to_owned()));
    assert_eq!(got, want, "whole objects as written, in order, filtered");

    // Every namespace, by name: m3's add and its delete.
    let evs = replayed(
        &s,
        &format!(
            "/api/v1/configmaps?watch=true&resourceVersion={start}&fieldSelector=metadata.name%3Dm3"
        ),
        2,
    )
    .await;
    assert_eq!(evs[0]["type"], "ADDED");
    assert_eq!(evs[1]["type"], "DELETED");
    assert_eq!(evs[1]["object"]["metadata"]["namespace"], "a");

    // A history limited to the newest 2 writes: an older version is Expired, a recent one
    // replays what is kept.
    s.set_watch_history_limit(2);
    let evs = replayed(
        &s,
        &format!("/api/v1/namespaces/a/configmaps?watch=true&resourceVersion={start}"),
        1,
    )
    .await;
    assert_eq!(evs[0]["type"], "ERROR");
    assert_eq!(evs[0]["object"]["code"], 410);
    let rv = s.resource_version();
    let evs = replayed(
        &s,
        &format!(
            "/api/v1/namespaces/a/configmaps?watch=true&resourceVersion={}",
            rv - 2
        ),
        2,
    )
    .await;
    assert_eq!(evs[0]["type"], "MODIFIED");
    assert_eq!(evs[1]["type"], "DELETED");
}
