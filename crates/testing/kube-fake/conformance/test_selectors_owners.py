"""Label and field selectors on lists, and owner references.

Sources: Labels and Selectors › Label selectors (equality-based and set-based requirements),
› API › LIST and WATCH filtering (kubernetes.io/docs/concepts/overview/working-with-objects/
labels/); Field Selectors (…/working-with-objects/field-selectors/); Owners and Dependents
(…/working-with-objects/owners-dependents/); API reference › OwnerReference.
"""

import pytest

from conftest import GROUP, VERSION, proxy

P = (GROUP, VERSION)


@pytest.fixture
def labelled(co, ns):
    for name, labels in [("prod-a", {"env": "prod", "tier": "web"}),
                         ("dev-a", {"env": "dev", "tier": "web"}),
                         ("qa-a", {"env": "qa"}),
                         ("bare", None)]:
        co.create_namespaced_custom_object(*P, ns, "proxies", proxy(name, labels=labels))
    return ns


def names(co, ns, **kw):
    items = co.list_namespaced_custom_object(*P, ns, "proxies", **kw)["items"]
    return sorted(i["metadata"]["name"] for i in items)


def test_equality_based_label_selectors(co, labelled):
    ns = labelled
    # Labels and Selectors › Equality-based requirement: `=` and `==` select equal values ...
    assert names(co, ns, label_selector="env=prod") == ["prod-a"]
    assert names(co, ns, label_selector="env==prod") == ["prod-a"]
    # ... `!=` selects a different value and also resources without the key.
    assert names(co, ns, label_selector="env!=prod") == ["bare", "dev-a", "qa-a"]
    # Comma-separated requirements are ANDed.
    assert names(co, ns, label_selector="tier=web,env!=prod") == ["dev-a"]


def test_set_based_label_selectors(co, labelled):
    ns = labelled
    # Labels and Selectors › Set-based requirement: `in`, `notin` (which also selects resources
    # without the key), key existence and `!key`.
    assert names(co, ns, label_selector="env in (prod, dev)") == ["dev-a", "prod-a"]
    assert names(co, ns, label_selector="env notin (prod,dev)") == ["bare", "qa-a"]
    assert names(co, ns, label_selector="tier") == ["dev-a", "prod-a"]
    assert names(co, ns, label_selector="!tier") == ["bare", "qa-a"]
    # Mixed with equality-based requirements (ANDed).
    assert names(co, ns, label_selector="env in (prod,dev),tier=web,env!=dev") == ["prod-a"]


def test_field_selectors_on_metadata_name(co, labelled):
    ns = labelled
    # Field Selectors: every resource type supports metadata.name and metadata.namespace,
    # with `=`, `==` and `!=`.
    assert names(co, ns, field_selector="metadata.name=qa-a") == ["qa-a"]
    assert names(co, ns, field_selector="metadata.name!=qa-a") == ["bare", "dev-a", "prod-a"]
    assert names(co, ns, field_selector=f"metadata.namespace={ns}") == [
        "bare", "dev-a", "prod-a", "qa-a"]


def test_owner_references_are_kept_as_written(co, ns):
    owner = co.create_namespaced_custom_object(*P, ns, "proxies", proxy("owner"))
    dep = proxy("dependent")
    ref = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy", "name": "owner",
           "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
    dep["metadata"]["ownerReferences"] = [ref]
    co.create_namespaced_custom_object(*P, ns, "proxies", dep)
    got = co.get_namespaced_custom_object(*P, ns, "proxies", "dependent")
    # Owners and Dependents: a dependent names its owner in metadata.ownerReferences (name,
    # uid, controller, blockOwnerDeletion — API reference › OwnerReference); the server keeps
    # them as written. (Garbage collection of dependents is not checked: the fake has none.)
    assert got["metadata"]["ownerReferences"] == [ref]
