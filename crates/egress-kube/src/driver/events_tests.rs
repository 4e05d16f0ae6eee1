#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use kube_fake::FakeApiServer;

use super::*;

fn regarding(name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("egress-proxies.dev/v1alpha1".into()),
        kind: Some("Proxy".into()),
        name: Some(name.into()),
        namespace: Some("ns1".into()),
        uid: Some(format!("uid-{name}")),
        ..ObjectReference::default()
    }
}

fn event(reason: &str, note: &str) -> Event {
    Event {
        type_: EventType::Warning,
        reason: reason.into(),
        note: Some(note.into()),
        action: reason.into(),
        secondary: None,
    }
}

fn recorder(api: &FakeApiServer) -> Recorder {
    Recorder::new(api.client("ns1"), "egress-proxies".into(), "pod-a".into())
}

#[tokio::test]
async fn a_first_event_is_created_as_kube_runtime_writes_it_and_a_repeat_becomes_its_series() {
    let api = FakeApiServer::new();
    let r = recorder(&api);
    r.publish(&event("ProviderError", "first"), &regarding("p1"))
        .await
        .unwrap();
    let evs = api.objects("events.k8s.io", "events");
    assert_eq!(evs.len(), 1);
    let e = &evs[0];
    assert_eq!(e["type"], "Warning");
    assert_eq!(e["reason"], "ProviderError");
    assert_eq!(e["action"], "ProviderError");
    assert_eq!(e["note"], "first");
    assert_eq!(e["reportingController"], "egress-proxies");
    assert_eq!(e["reportingInstance"], "pod-a");
    assert_eq!(e["regarding"]["name"], "p1");
    assert_eq!(e["regarding"]["uid"], "uid-p1");
    assert_eq!(e["metadata"]["namespace"], "ns1");
    assert!(e["metadata"]["name"].as_str().unwrap().starts_with("p1."));
    assert!(e.get("series").is_none_or(serde_json::Value::is_null));

    for _ in 0..2 {
        r.publish(&event("ProviderError", "again"), &regarding("p1"))
            .await
            .unwrap();
    }
    let evs = api.objects("events.k8s.io", "events");
    assert_eq!(evs.len(), 1, "repeats extend the first Event");
    assert_eq!(evs[0]["series"]["count"], 3);
    assert!(evs[0]["series"]["lastObservedTime"].is_string());
    assert_eq!(evs[0]["note"], "first", "a series keeps the first note");

    // Another reason, or another object: a new Event each.
    r.publish(&event("Other", "x"), &regarding("p1"))
        .await
        .unwrap();
    r.publish(&event("ProviderError", "x"), &regarding("p2"))
        .await
        .unwrap();
    assert_eq!(api.objects("events.k8s.io", "events").len(), 3);
    assert_eq!(r.remembered(), 3);
}

#[tokio::test]
async fn a_repeat_of_an_event_gone_from_the_server_creates_a_new_one() {
    let api = FakeApiServer::new();
    let r = recorder(&api);
    r.publish(&event("ProviderError", "first"), &regarding("p1"))
        .await
        .unwrap();
    let name = api.objects("events.k8s.io", "events")[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let events: Api<K8sEvent> = Api::namespaced(api.client("ns1"), "ns1");
    events.delete(&name, &Default::default()).await.unwrap();
    r.publish(&event("ProviderError", "again"), &regarding("p1"))
        .await
        .unwrap();
    let evs = api.objects("events.k8s.io", "events");
    assert_eq!(evs.len(), 1);
    assert_eq!(evs[0]["note"], "again");
    assert_ne!(evs[0]["metadata"]["name"], name);
}

fn key(i: usize) -> Key {
    Key {
        regarding: format!("ns/p{i}/u{i}").into(),
        warning: false,
        reason: "R".into(),
        action: "A".into(),
    }
}

fn written(last: Timestamp) -> Written {
    Written {
        namespace: "ns".into(),
        name: "n".into(),
        count: 1,
        last,
    }
}

#[test]
fn the_cache_forgets_entries_after_the_ttl_unless_they_repeated() {
    let t0 = Timestamp::now();
    let mut c = Cache::default();
    c.record(key(1), written(t0));
    c.record(key(2), written(t0));
    // Key 1 repeats 5 minutes in.
    let t5 = t0 + SignedDuration::from_mins(5);
    c.record(key(1), written(t5));
    c.expire(t0 + SERIES_TTL);
    assert!(
        c.repeat_of(&key(1)).is_some(),
        "repeated within the TTL: kept"
    );
    assert!(c.repeat_of(&key(2)).is_none(), "TTL old: forgotten");
    assert_eq!(c.order.len(), 1, "each key queued once");
    c.expire(t5 + SERIES_TTL);
    assert!(c.by_key.is_empty());
    assert!(c.order.is_empty());
}

#[test]
fn the_cache_never_holds_more_than_its_bound_and_forgets_the_oldest_first() {
    let t0 = Timestamp::now();
    let mut c = Cache::default();
    for i in 0..MAX_SERIES + 100 {
        c.record(key(i), written(t0 + SignedDuration::from_millis(i as i64)));
        c.expire(t0);
        assert!(c.by_key.len() <= MAX_SERIES);
    }
    assert!(c.repeat_of(&key(0)).is_none(), "the oldest went first");
    assert!(c.repeat_of(&key(MAX_SERIES + 99)).is_some());
    assert!(c.order.len() <= MAX_SERIES);
}

#[test]
fn a_count_continues_the_series() {
    let t0 = Timestamp::now();
    let mut c = Cache::default();
    c.record(key(1), written(t0));
    assert_eq!(c.repeat_of(&key(1)).unwrap().2, 2);
    let mut w = written(t0);
    w.count = 7;
    c.record(key(1), w);
    assert_eq!(c.repeat_of(&key(1)).unwrap().2, 8);
}
