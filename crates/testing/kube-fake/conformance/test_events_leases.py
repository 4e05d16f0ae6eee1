"""Events (events.k8s.io/v1 and core v1) and Leases (coordination.k8s.io/v1), through the
official client's typed APIs (so every response is decoded into the published models).

Sources: API reference › Event (events.k8s.io/v1), › Event (core/v1), › Lease
(coordination.k8s.io/v1); Leases (kubernetes.io/docs/concepts/architecture/leases/); API
Conventions › Concurrency Control and Consistency; API Concepts › Collections.
"""

import datetime

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException


def test_an_events_v1_event_round_trips_through_the_typed_client(api, ns):
    ev = client.EventsV1Api(api)
    when = datetime.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=datetime.timezone.utc)
    body = client.EventsV1Event(
        metadata=client.V1ObjectMeta(generate_name="proxy-"),
        event_time=when, reporting_controller="egress-proxies.dev/operator",
        reporting_instance="operator-0", action="Reconcile", reason="Provisioned",
        type="Normal", note="VM created",
        regarding=client.V1ObjectReference(api_version="egress-proxies.dev/v1alpha1",
                                           kind="Proxy", name="p", namespace=ns))
    created = ev.create_namespaced_event(ns, body)
    # API reference › ObjectMeta.generateName: the server picks a unique name with that prefix.
    assert created.metadata.name.startswith("proxy-") and created.metadata.name != "proxy-"
    # API reference › Event (events.k8s.io/v1): eventTime is a MicroTime (microseconds kept).
    assert created.event_time == when
    listed = ev.list_namespaced_event(ns)
    # API Concepts › Collections: an EventList of the namespace's events.
    assert listed.kind == "EventList"
    assert [e.reason for e in listed.items] == ["Provisioned"]
    assert listed.items[0].regarding.kind == "Proxy"


def test_a_core_v1_event_round_trips_and_lists_by_field(api, ns):
    core = client.CoreV1Api(api)
    core.create_namespaced_event(ns, client.CoreV1Event(
        metadata=client.V1ObjectMeta(name="e1"), reason="Started", message="m", type="Normal",
        involved_object=client.V1ObjectReference(kind="Proxy", name="p", namespace=ns),
        count=1))
    got = core.read_namespaced_event("e1", ns)
    # API reference › Event (core/v1): involvedObject, reason, message, count kept.
    assert (got.reason, got.involved_object.name, got.count) == ("Started", "p", 1)
    assert got.kind == "Event" and got.api_version == "v1"


def test_a_lease_is_taken_renewed_and_a_stale_renewal_is_a_conflict(api, ns):
    co = client.CoordinationV1Api(api)
    t0 = datetime.datetime(2026, 1, 2, 3, 4, 5, 654321, tzinfo=datetime.timezone.utc)
    lease = co.create_namespaced_lease(ns, client.V1Lease(
        metadata=client.V1ObjectMeta(name="leader"),
        spec=client.V1LeaseSpec(holder_identity="a", lease_duration_seconds=15,
                                acquire_time=t0, renew_time=t0, lease_transitions=0)))
    # API reference › Lease: responses name kind and apiVersion; renewTime is a MicroTime.
    assert (lease.kind, lease.api_version) == ("Lease", "coordination.k8s.io/v1")
    assert lease.spec.renew_time == t0 and lease.spec.holder_identity == "a"
    stale_rv = lease.metadata.resource_version
    lease.spec.renew_time = t0 + datetime.timedelta(seconds=2)
    renewed = co.replace_namespaced_lease("leader", ns, lease)
    assert renewed.metadata.resource_version != stale_rv
    # Leases (leader election): a candidate takes the Lease by an update carrying the
    # resourceVersion it read; API Conventions › Concurrency Control and Consistency: with a
    # stale one it fails with 409 Conflict, so two candidates cannot both win.
    lease.spec.holder_identity = "b"
    lease.metadata.resource_version = stale_rv
    with pytest.raises(ApiException) as e:
        co.replace_namespaced_lease("leader", ns, lease)
    assert e.value.status == 409
    assert co.read_namespaced_lease("leader", ns).spec.holder_identity == "a"
    listed = co.list_namespaced_lease(ns)
    assert listed.kind == "LeaseList" and [i.metadata.name for i in listed.items] == ["leader"]
