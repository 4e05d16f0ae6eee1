//! Tenant-safe publishing against the fake API server (kube-fake, which keeps server-side
//! apply field ownership, `managedFields` and delete preconditions as a real API server
//! does): a group name is chosen by whoever may create a Proxy, so the publisher must never
//! write or delete a Service or EndpointSlice it did not create, never take a field over from
//! another field manager, and one failing group must not stop the others.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeMap;
use std::time::Duration;

use egress_kube::driver::publish::{
    Group, Publisher, REASON_FIELD_CONFLICT, REASON_NAME_CLASH, SyncReport,
};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube_fake::FakeApiServer;
use serde_json::{Value, json};

const NS: &str = "default";
const MANAGER: &str = "egress-proxies";
/// Deadline of each publisher call (the fake answers in microseconds).
const DEADLINE: Duration = Duration::from_secs(10);

fn group(name: &str, ips: &[&str]) -> Group {
    Group {
        namespace: NS.into(),
        name: name.into(),
        port: 3128,
        endpoints: ips.iter().map(|i| i.parse().unwrap()).collect(),
        members: ips.len().max(1),
    }
}

fn want(groups: &[Group]) -> BTreeMap<(String, String), Group> {
    groups
        .iter()
        .map(|g| ((g.namespace.clone(), g.name.clone()), g.clone()))
        .collect()
}

fn publisher(api: &FakeApiServer) -> Publisher {
    Publisher::new(api.client(NS), None, MANAGER, DEADLINE)
}

fn service(api: &FakeApiServer, name: &str) -> Option<Value> {
    api.object("", "services", NS, name)
}

fn slice(api: &FakeApiServer, name: &str) -> Option<Value> {
    api.object("discovery.k8s.io", "endpointslices", NS, name)
}

/// A Service a cluster admin created (`kubectl create`, no field manager of ours).
async fn foreign_service(api: &FakeApiServer, name: &str, labels: Value) -> Value {
    let s: Service = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"clusterIP": "10.96.0.1", "ports": [{"name": "https", "port": 443, "targetPort": 6443}]},
    }))
    .unwrap();
    Api::<Service>::namespaced(api.client(NS), NS)
        .create(&PostParams::default(), &s)
        .await
        .unwrap();
    service(api, name).unwrap()
}

fn refused(r: &SyncReport, name: &str) -> Option<(&'static str, String)> {
    r.refused
        .get(&(NS.to_owned(), name.to_owned()))
        .map(|x| (x.reason, x.message.clone()))
}

#[tokio::test]
async fn a_group_named_like_an_unowned_service_is_refused_and_that_service_is_untouched() {
    let api = FakeApiServer::new();
    let before = foreign_service(&api, "kubernetes", json!({"component": "apiserver"})).await;
    let mut p = publisher(&api);
    let r = p
        .sync(&want(&[
            group("kubernetes", &["10.1.0.1"]),
            group("web", &["10.1.0.2"]),
        ]))
        .await;
    let (reason, msg) = refused(&r, "kubernetes").expect("the clash is refused");
    assert_eq!(reason, REASON_NAME_CLASH);
    assert!(msg.contains("Service default/kubernetes"), "{msg}");
    assert!(r.newly_refused.contains(&(NS.into(), "kubernetes".into())));
    assert!(
        r.ok(),
        "a refusal is a decision, not a failure: {:?}",
        r.failures
    );
    assert_eq!(service(&api, "kubernetes").unwrap(), before, "untouched");
    assert!(
        slice(&api, "kubernetes-ipv4").is_none(),
        "nothing of the group"
    );
    assert!(
        service(&api, "web").is_some(),
        "the other group is published"
    );
    // Refused again on the next pass, announced once.
    let r = p.sync(&want(&[group("kubernetes", &["10.1.0.3"])])).await;
    assert!(refused(&r, "kubernetes").is_some());
    assert!(r.newly_refused.is_empty());
    // The group gone: the admin's Service is not ours to delete; ours is.
    let r = p.sync(&want(&[])).await;
    assert!(r.ok(), "{:?}", r.failures);
    assert_eq!(service(&api, "kubernetes").unwrap(), before);
    assert!(service(&api, "web").is_none());
}

#[tokio::test]
async fn copying_our_labels_onto_a_service_does_not_make_it_ours() {
    // Someone who may create Services labels theirs as ours: still not written, not deleted
    // (no entry of our field manager in its managedFields).
    let api = FakeApiServer::new();
    let labels = json!({"app.kubernetes.io/managed-by": "egress-proxies",
                        "egress-proxies.dev/group": "db"});
    let before = foreign_service(&api, "db", labels).await;
    let mut p = publisher(&api);
    let r = p.sync(&want(&[group("db", &["10.1.0.1"])])).await;
    assert_eq!(refused(&r, "db").unwrap().0, REASON_NAME_CLASH);
    // A new term's first pass lists objects labelled as ours: this one is not deleted.
    let mut next_term = publisher(&api);
    let r = next_term.sync(&want(&[])).await;
    assert!(r.ok(), "{:?}", r.failures);
    assert_eq!(service(&api, "db").unwrap(), before);
}

#[tokio::test]
async fn an_endpoint_slice_name_taken_by_another_object_refuses_the_whole_group() {
    let api = FakeApiServer::new();
    let foreign = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "web-ipv4", "namespace": NS}, "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.9.9.9"]}]});
    Api::<k8s_openapi::api::discovery::v1::EndpointSlice>::namespaced(api.client(NS), NS)
        .create(
            &PostParams::default(),
            &serde_json::from_value(foreign).unwrap(),
        )
        .await
        .unwrap();
    let before = slice(&api, "web-ipv4").unwrap();
    let r = publisher(&api)
        .sync(&want(&[group("web", &["10.1.0.1"])]))
        .await;
    let (reason, msg) = refused(&r, "web").unwrap();
    assert_eq!(reason, REASON_NAME_CLASH);
    assert!(msg.contains("EndpointSlice default/web-ipv4"), "{msg}");
    assert!(
        service(&api, "web").is_none(),
        "nothing of the group is written"
    );
    assert_eq!(slice(&api, "web-ipv4").unwrap(), before);
}

#[tokio::test]
async fn a_field_another_manager_took_over_is_not_taken_back_by_a_forced_apply() {
    let api = FakeApiServer::new();
    let mut p = publisher(&api);
    assert!(p.sync(&want(&[group("web", &["10.1.0.1"])])).await.ok());
    // Another manager takes the Service's port over (a forced apply of its own).
    let intruder = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": NS},
        "spec": {"ports": [{"name": "proxy", "port": 9999, "targetPort": 3128, "protocol": "TCP"}]}});
    Api::<Service>::namespaced(api.client(NS), NS)
        .patch(
            "web",
            &PatchParams::apply("someone-else").force(),
            &Patch::Apply(&intruder),
        )
        .await
        .unwrap();
    // The group changes (a new member): the publisher applies again, without force.
    let r = p
        .sync(&want(&[group("web", &["10.1.0.1", "10.1.0.2"])]))
        .await;
    let (reason, msg) = refused(&r, "web").expect("the conflict is refused, not forced");
    assert_eq!(reason, REASON_FIELD_CONFLICT);
    assert!(msg.contains("Service default/web"), "{msg}");
    let svc = service(&api, "web").unwrap();
    assert_eq!(
        svc["spec"]["ports"][0]["port"], 9999,
        "the other manager's value stays"
    );
    let patches: Vec<_> = api
        .requests()
        .into_iter()
        .filter(|q| q.method == "PATCH" && q.query.contains("fieldManager=egress-proxies"))
        .collect();
    assert!(!patches.is_empty());
    assert!(
        patches.iter().all(|q| !q.query.contains("force=true")),
        "never forced: {patches:?}"
    );
}

#[tokio::test]
async fn a_failing_group_does_not_stop_the_others_and_is_reported() {
    let api = FakeApiServer::new();
    // Groups are applied in name order: the failing one comes first.
    api.fail_requests("PATCH", "/api/v1/namespaces/default/services/aaa");
    let mut p = publisher(&api);
    let r = p
        .sync(&want(&[
            group("aaa", &["10.1.0.1"]),
            group("zzz", &["10.1.0.2"]),
        ]))
        .await;
    assert!(!r.ok());
    assert!(
        r.failures.iter().any(|f| f.contains("aaa")),
        "{:?}",
        r.failures
    );
    assert!(
        service(&api, "zzz").is_some(),
        "the other group is published"
    );
    assert!(slice(&api, "zzz-ipv4").is_some());
    assert!(service(&api, "aaa").is_none());
}

#[tokio::test]
async fn a_stale_object_replaced_by_someone_else_under_the_same_name_is_not_deleted() {
    let api = FakeApiServer::new();
    let mut p = publisher(&api);
    assert!(p.sync(&want(&[group("web", &["10.1.0.1"])])).await.ok());
    // Someone deletes our Service and creates their own under the same name.
    Api::<Service>::namespaced(api.client(NS), NS)
        .delete("web", &Default::default())
        .await
        .unwrap();
    let theirs = foreign_service(&api, "web", json!({"team": "a"})).await;
    // The group empties: the delete carries our UID, which is not theirs.
    let r = p.sync(&want(&[])).await;
    assert!(r.ok(), "{:?}", r.failures);
    assert_eq!(service(&api, "web").unwrap(), theirs, "their Service stays");
    let deletes: Vec<_> = api
        .requests()
        .into_iter()
        .filter(|q| q.method == "DELETE" && q.path.ends_with("/services/web"))
        .collect();
    assert_eq!(deletes.last().map(|q| q.status), Some(409), "{deletes:?}");
}

#[tokio::test]
async fn a_service_replaced_between_the_ownership_read_and_the_apply_is_not_written() {
    let api = FakeApiServer::new();
    let mut p = publisher(&api);
    assert!(p.sync(&want(&[group("web", &["10.1.0.1"])])).await.ok());
    // Between the publisher's read (ours) and its apply, someone deletes our Service and
    // creates theirs under the same name.
    let svc_path = "/api/v1/namespaces/default/services/web";
    let theirs = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": NS, "labels": {"team": "a"}},
        "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}});
    api.before_request(
        "PATCH",
        svc_path,
        vec![
            ("DELETE".into(), svc_path.into(), None),
            (
                "POST".into(),
                "/api/v1/namespaces/default/services".into(),
                Some(theirs),
            ),
        ],
    );
    let r = p
        .sync(&want(&[group("web", &["10.1.0.1", "10.1.0.2"])]))
        .await;
    let (reason, msg) = refused(&r, "web").expect("the stale apply is refused");
    assert_eq!(reason, REASON_FIELD_CONFLICT);
    assert!(msg.contains("changed since it was read"), "{msg}");
    let svc = service(&api, "web").unwrap();
    assert_eq!(
        svc["metadata"]["labels"],
        json!({"team": "a"}),
        "theirs, untouched"
    );
    assert_eq!(svc["spec"]["ports"][0]["port"], 80);
}

#[tokio::test]
async fn an_endpoint_slice_changed_between_the_ownership_read_and_the_apply_is_not_written() {
    let api = FakeApiServer::new();
    let mut p = publisher(&api);
    assert!(p.sync(&want(&[group("web", &["10.1.0.1"])])).await.ok());
    let slice_path = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/web-ipv4";
    // 1. Between the publisher's read of our slice (ours) and its apply, another writer
    // changes it (`kubectl edit`: a replace of the whole object, which the fake records as
    // taking no field of ours, so only the resourceVersion read tells the apply that the
    // slice is not the one that was checked).
    let mut edited = slice(&api, "web-ipv4").unwrap();
    edited["metadata"]["labels"]["edited-by"] = json!("someone-else");
    edited["endpoints"] = json!([{"addresses": ["10.9.9.9"]}]);
    api.before_request(
        "PATCH",
        slice_path,
        vec![("PUT".into(), slice_path.into(), Some(edited))],
    );
    let r = p
        .sync(&want(&[group("web", &["10.1.0.1", "10.1.0.2"])]))
        .await;
    let (reason, msg) = refused(&r, "web").expect("the stale slice apply is refused");
    assert_eq!(reason, REASON_FIELD_CONFLICT);
    assert!(
        msg.contains("EndpointSlice default/web-ipv4") && msg.contains("changed since it was read"),
        "{msg}"
    );
    let s = slice(&api, "web-ipv4").unwrap();
    assert_eq!(
        s["endpoints"],
        json!([{"addresses": ["10.9.9.9"]}]),
        "the other writer's change stays"
    );
    assert_eq!(s["metadata"]["labels"]["edited-by"], "someone-else");
    // 2. Between the read and the apply, our slice is deleted and another one created under
    // its name: it is not taken over (no owner reference to our Service, no labels of ours).
    let theirs = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "web-ipv4", "namespace": NS, "labels": {"team": "a"}},
        "addressType": "IPv4", "endpoints": [{"addresses": ["10.8.8.8"]}]});
    api.before_request(
        "PATCH",
        slice_path,
        vec![
            ("DELETE".into(), slice_path.into(), None),
            (
                "POST".into(),
                "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices".into(),
                Some(theirs),
            ),
        ],
    );
    let r = p
        .sync(&want(&[group("web", &["10.1.0.1", "10.1.0.3"])]))
        .await;
    let (reason, msg) = refused(&r, "web").expect("the apply over a replaced slice is refused");
    assert_eq!(reason, REASON_FIELD_CONFLICT, "{msg}");
    let s = slice(&api, "web-ipv4").unwrap();
    assert_eq!(
        s["metadata"]["labels"],
        json!({"team": "a"}),
        "theirs, untouched"
    );
    assert!(s["metadata"].get("ownerReferences").is_none(), "{s}");
    assert_eq!(s["endpoints"], json!([{"addresses": ["10.8.8.8"]}]));
}
