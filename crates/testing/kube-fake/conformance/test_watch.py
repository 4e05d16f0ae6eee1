"""Watches: resuming from a resourceVersion, the initial state, bookmarks, selectors, and
410 Gone for a resourceVersion older than the history the server keeps.

Sources: API Concepts › Efficient detection of changes, › Semantics for watch, › Watch
bookmarks (kubernetes.io/docs/reference/using-api/api-concepts/); API reference › WatchEvent
(meta/v1); Labels and Selectors › API › LIST and WATCH filtering.
"""

import json

import pytest
from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from conftest import GROUP, VERSION, WATCH_HISTORY, proxy

P = (GROUP, VERSION)
# NB: server-side watch timeout: the server ends the stream after it, so every raw read below
# is bounded even if an expected event never comes.
WATCH_S = 2


def raw_watch(co, ns, **params):
    """The decoded events of one watch, read until the server's timeout ends it."""
    resp = co.list_namespaced_custom_object(
        *P, ns, "proxies", watch=True, timeout_seconds=WATCH_S, _preload_content=False,
        **params)
    try:
        return [json.loads(line) for line in resp.data.decode().splitlines() if line.strip()]
    finally:
        resp.release_conn()


def rv(obj):
    return obj["metadata"]["resourceVersion"]


def test_a_watch_from_a_list_resource_version_sees_exactly_the_later_changes_in_order(co, ns):
    co.create_namespaced_custom_object(*P, ns, "proxies", proxy("before"))
    listed = co.list_namespaced_custom_object(*P, ns, "proxies")
    co.create_namespaced_custom_object(*P, ns, "proxies", proxy("w1"))
    co.patch_namespaced_custom_object(*P, ns, "proxies", "w1", {"spec": {"image": "x"}},
                                      _content_type="application/merge-patch+json")
    co.delete_namespaced_custom_object(*P, ns, "proxies", "w1")
    events = [e for e in raw_watch(co, ns, resource_version=rv(listed)) if e["type"] != "BOOKMARK"]
    # API Concepts › Efficient detection of changes: a watch from a list's resourceVersion
    # receives every change after it (ADDED, MODIFIED, DELETED), in order, and nothing from
    # before it.
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "w1"), ("MODIFIED", "w1"), ("DELETED", "w1")]
    assert events[1]["object"]["spec"]["image"] == "x"


def test_a_watch_resumed_from_an_event_resource_version_replays_only_what_followed(co, ns):
    listed = co.list_namespaced_custom_object(*P, ns, "proxies")
    for n in ("r1", "r2", "r3"):
        co.create_namespaced_custom_object(*P, ns, "proxies", proxy(n))
    first = [e for e in raw_watch(co, ns, resource_version=rv(listed)) if e["type"] == "ADDED"]
    resume_at = rv(first[0]["object"])
    again = [e for e in raw_watch(co, ns, resource_version=resume_at) if e["type"] == "ADDED"]
    # API Concepts › Semantics for watch (resourceVersion set: "Start at Exact"): a client
    # that lost its watch resumes from the last resourceVersion it saw without missing or
    # repeating a change.
    assert [e["object"]["metadata"]["name"] for e in again] == ["r2", "r3"]


def test_a_watch_without_a_resource_version_starts_with_synthetic_added_events(co, ns):
    co.create_namespaced_custom_object(*P, ns, "proxies", proxy("e1"))
    co.create_namespaced_custom_object(*P, ns, "proxies", proxy("e2"))
    events = [e for e in raw_watch(co, ns) if e["type"] != "BOOKMARK"]
    # API Concepts › Semantics for watch (resourceVersion unset: "Get State and Start at Most
    # Recent"): synthetic ADDED events for every existing object first.
    assert sorted((e["type"], e["object"]["metadata"]["name"]) for e in events) == [
        ("ADDED", "e1"), ("ADDED", "e2")]


def test_bookmarks_come_only_when_asked_for_and_carry_only_a_resource_version(co, ns):
    listed = co.list_namespaced_custom_object(*P, ns, "proxies")
    co.create_namespaced_custom_object(*P, ns, "proxies", proxy("b1"))
    plain = raw_watch(co, ns, resource_version=rv(listed))
    # API Concepts › Watch bookmarks: bookmarks are sent only to a watch that set
    # allowWatchBookmarks=true ...
    assert [e["type"] for e in plain] == ["ADDED"]
    asked = raw_watch(co, ns, resource_version=rv(listed), allow_watch_bookmarks=True)
    marks = [e for e in asked if e["type"] == "BOOKMARK"]
    # ... (the server may send them at any time, so none is required) and a bookmark is an
    # object of the watched kind holding only metadata.resourceVersion.
    for m in marks:
        assert m["object"]["kind"] == "Proxy"
        assert list(m["object"]["metadata"]) == ["resourceVersion"]


def test_a_watch_with_a_label_selector_sees_only_matching_objects(co, ns):
    listed = co.list_namespaced_custom_object(*P, ns, "proxies")
    co.create_namespaced_custom_object(*P, ns, "proxies", proxy("l1", labels={"team": "a"}))
    co.create_namespaced_custom_object(*P, ns, "proxies", proxy("l2", labels={"team": "b"}))
    events = [e for e in raw_watch(co, ns, resource_version=rv(listed), label_selector="team=a")
              if e["type"] != "BOOKMARK"]
    # Labels and Selectors › API › LIST and WATCH filtering.
    assert [e["object"]["metadata"]["name"] for e in events] == ["l1"]


def test_a_watch_from_a_compacted_resource_version_gets_410_expired(co, ns):
    start = co.list_namespaced_custom_object(*P, ns, "proxies")
    co.create_namespaced_custom_object(*P, ns, "proxies", proxy("churn"))
    # More writes than the server keeps for watches (kube-fake-server --watch-history).
    for i in range(WATCH_HISTORY + 10):
        co.patch_namespaced_custom_object(*P, ns, "proxies", "churn",
                                          {"metadata": {"labels": {"i": str(i)}}},
                                          _content_type="application/merge-patch+json")
    events = raw_watch(co, ns, resource_version=rv(start))
    # API Concepts › Efficient detection of changes: when the requested historical version is
    # not available, the watch fails with 410 Gone; API reference › WatchEvent: the event type
    # is ERROR and its object a Status (reason Expired, code 410).
    assert len(events) == 1 and events[0]["type"] == "ERROR"
    st = events[0]["object"]
    assert (st["kind"], st["code"], st["reason"]) == ("Status", 410, "Expired")
    # The official client's watch helper surfaces it as an ApiException with status 410 (its
    # documented contract: "you have to recover yourself").
    w = watch.Watch()
    with pytest.raises(ApiException) as e:
        for _ in w.stream(co.list_namespaced_custom_object, *P, ns, "proxies",
                          resource_version=rv(start), timeout_seconds=WATCH_S):
            pass
    assert e.value.status == 410
    # Recovery as documented: a fresh list, and a watch from its resourceVersion works.
    fresh = co.list_namespaced_custom_object(*P, ns, "proxies")
    assert raw_watch(co, ns, resource_version=rv(fresh)) == []
