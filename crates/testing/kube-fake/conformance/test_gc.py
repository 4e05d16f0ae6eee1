"""Cascading deletion by owner references, as the garbage collector does it.

Sources (kubernetes.io/docs): Garbage Collection › Cascading deletion (foreground, background,
orphaned dependents); Owners and Dependents › Owner references in object specifications
(blockOwnerDeletion); Use Cascading Deletion (propagationPolicy, kubectl --cascade); API
reference › DeleteOptions, › ObjectMeta (deletionTimestamp, finalizers `foregroundDeletion`,
`orphan`).
"""

import time

import pytest
from kubernetes import client

from conftest import GROUP, VERSION, proxy

P = (GROUP, VERSION)
# Bound of each wait for the collector (it acts within milliseconds on the fake).
DEADLINE_S = 20


def pool(name):
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ProxyPool", "metadata": {"name": name},
            "spec": {"replicas": 2, "template": {"spec": {
                "provider": "local", "image": "debian-12",
                "proxy": {"allowedClientCidrs": ["10.0.0.0/8"]}}}}}


def owned(co, ns, owner, name, block=True, finalizers=None):
    body = proxy(name, finalizers=finalizers)
    body["metadata"]["ownerReferences"] = [{
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ProxyPool", "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": block}]
    return co.create_namespaced_custom_object(*P, ns, "proxies", body)


def get(co, ns, plural, name):
    try:
        return co.get_namespaced_custom_object(*P, ns, plural, name)
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


def wait(what, predicate):
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > DEADLINE_S:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def delete(co, ns, name, policy):
    body = client.V1DeleteOptions(propagation_policy=policy) if policy else None
    return co.delete_namespaced_custom_object(*P, ns, "proxypools", name, body=body)


def test_background_deletion_removes_the_owner_then_its_dependents(co, ns):
    owner = co.create_namespaced_custom_object(*P, ns, "proxypools", pool("bg"))
    owned(co, ns, owner, "bg-a")
    owned(co, ns, owner, "bg-b", block=False)
    # Garbage Collection › Background cascading deletion (the default): the owner goes at once,
    # the collector then deletes the dependents.
    delete(co, ns, "bg", None)
    assert get(co, ns, "proxypools", "bg") is None
    wait("the dependents to be collected",
         lambda: get(co, ns, "proxies", "bg-a") is None and get(co, ns, "proxies", "bg-b") is None)


def test_foreground_deletion_waits_for_blocking_dependents(co, ns):
    owner = co.create_namespaced_custom_object(*P, ns, "proxypools", pool("fg"))
    owned(co, ns, owner, "fg-held", finalizers=["example.com/hold"])
    owned(co, ns, owner, "fg-free", block=False)
    delete(co, ns, "fg", "Foreground")
    # Foreground cascading deletion: the owner is "deletion in progress" — deletionTimestamp
    # set, finalizer foregroundDeletion — until the dependents with blockOwnerDeletion are gone.
    got = get(co, ns, "proxypools", "fg")
    assert got["metadata"]["deletionTimestamp"]
    assert "foregroundDeletion" in got["metadata"]["finalizers"]
    wait("the non-blocking dependent to be deleted", lambda: get(co, ns, "proxies", "fg-free") is None)
    held = get(co, ns, "proxies", "fg-held")
    assert held["metadata"]["deletionTimestamp"], "the blocking dependent is being deleted"
    time.sleep(0.3)
    assert get(co, ns, "proxypools", "fg") is not None, "a blocking dependent holds the owner"
    # Its finalizer removed, the dependent goes, then the owner.
    co.patch_namespaced_custom_object(*P, ns, "proxies", "fg-held",
                                      {"metadata": {"finalizers": None}})
    wait("the owner to be deleted", lambda: get(co, ns, "proxypools", "fg") is None)
    assert get(co, ns, "proxies", "fg-held") is None


def test_orphan_deletion_keeps_the_dependents_without_the_reference(co, ns):
    owner = co.create_namespaced_custom_object(*P, ns, "proxypools", pool("or"))
    owned(co, ns, owner, "or-a")
    delete(co, ns, "or", "Orphan")
    # Orphaned dependents: the collector removes the owner reference, then the owner.
    wait("the owner to be deleted", lambda: get(co, ns, "proxypools", "or") is None)
    dep = get(co, ns, "proxies", "or-a")
    assert dep is not None
    assert not dep["metadata"].get("ownerReferences")


def test_a_dependent_with_another_live_owner_loses_only_the_dangling_reference(co, ns):
    a = co.create_namespaced_custom_object(*P, ns, "proxypools", pool("own-a"))
    b = co.create_namespaced_custom_object(*P, ns, "proxypools", pool("own-b"))
    body = proxy("shared")
    body["metadata"]["ownerReferences"] = [
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ProxyPool", "name": o["metadata"]["name"],
         "uid": o["metadata"]["uid"]} for o in (a, b)]
    co.create_namespaced_custom_object(*P, ns, "proxies", body)
    delete(co, ns, "own-a", None)
    # Owners and Dependents: an object with several owners is deleted when all are gone.
    wait("the dangling reference to be removed",
         lambda: [r["name"] for r in get(co, ns, "proxies", "shared")["metadata"]
                  .get("ownerReferences", [])] == ["own-b"])
    delete(co, ns, "own-b", None)
    wait("the last owner's dependent to be collected",
         lambda: get(co, ns, "proxies", "shared") is None)


def test_a_reference_to_an_owner_replaced_under_the_same_name_is_dangling(co, ns):
    first = co.create_namespaced_custom_object(*P, ns, "proxypools", pool("reborn"))
    delete(co, ns, "reborn", None)
    co.create_namespaced_custom_object(*P, ns, "proxypools", pool("reborn"))
    # The reference names the first pool's UID: that owner no longer exists.
    owned(co, ns, first, "stale-ref")
    wait("the dependent of a gone owner to be collected",
         lambda: get(co, ns, "proxies", "stale-ref") is None)


def test_kubectl_delete_cascade_orphan_keeps_the_dependents(kubectl, co, ns):
    owner = co.create_namespaced_custom_object(*P, ns, "proxypools", pool("k-or"))
    owned(co, ns, owner, "k-or-a")
    # Use Cascading Deletion › Delete owner objects and orphan dependents.
    kubectl("delete", "proxypool", "k-or", "-n", ns, "--cascade=orphan")
    wait("the owner to be deleted", lambda: get(co, ns, "proxypools", "k-or") is None)
    assert get(co, ns, "proxies", "k-or-a") is not None
