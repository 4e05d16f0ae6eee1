"""Server-side apply: field managers, ownership, conflicts and force, through the official
Python client.

Sources: Server-Side Apply (kubernetes.io/docs/reference/using-api/server-side-apply/),
sections cited beside each check; API reference › PatchOptions (fieldManager, force).
"""

import json

import pytest
from kubernetes.client.exceptions import ApiException

from conftest import GROUP, VERSION, proxy, status_of

P = (GROUP, VERSION)
APPLY = "application/apply-patch+yaml"


def apply(co, ns, name, body, manager, force=None, status=False):
    kw = {"field_manager": manager, "_content_type": APPLY}
    if force is not None:
        kw["force"] = force
    fn = co.patch_namespaced_custom_object_status if status else co.patch_namespaced_custom_object
    return fn(*P, ns, "proxies", name, body, **kw)


def managers(obj):
    return {(m["manager"], m["operation"], m.get("subresource", ""))
            for m in obj["metadata"].get("managedFields", [])}


def test_an_apply_that_creates_answers_201_and_records_its_manager(co, ns):
    # NB: raw response: the client's generated code decodes only a 200 body of a patch.
    resp = co.patch_namespaced_custom_object(
        *P, ns, "proxies", "a1", proxy("a1"), field_manager="alice", _content_type=APPLY,
        _preload_content=False)
    out = json.loads(resp.data)
    # Server-Side Apply (intro): an apply creates the object when it does not exist (a create:
    # 201, generation 1).
    assert resp.status == 201
    assert out["metadata"]["generation"] == 1
    # Server-Side Apply › Field management: managedFields records each manager and the
    # operation (Apply) that set its fields.
    assert ("alice", "Apply", "") in managers(out)


def test_applying_a_field_another_manager_owns_with_another_value_is_a_409_conflict(co, ns):
    apply(co, ns, "c1", proxy("c1", image="debian-12"), "alice")
    with pytest.raises(ApiException) as e:
        apply(co, ns, "c1", proxy("c1", image="debian-13"), "bob")
    # Server-Side Apply › Conflicts: a conflict is a special status error (409 Conflict)
    # naming the conflicting manager and field; nothing is changed.
    assert e.value.status == 409
    st = status_of(e.value)
    assert st["reason"] == "Conflict" and st["code"] == 409
    assert st["message"].startswith('Apply failed with 1 conflict: conflict with "alice"')
    assert ".spec.image" in st["message"]
    causes = st["details"]["causes"]
    assert {"reason": "FieldManagerConflict", "field": ".spec.image"}.items() <= causes[0].items()
    got = co.get_namespaced_custom_object(*P, ns, "proxies", "c1")
    assert got["spec"]["image"] == "debian-12"


def test_force_overwrites_and_moves_ownership_to_the_forcing_manager(co, ns):
    apply(co, ns, "f1", proxy("f1", image="debian-12"), "alice")
    out = apply(co, ns, "f1", proxy("f1", image="debian-13"), "bob", force=True)
    # Server-Side Apply › Conflicts › "Overwrite value, become sole manager": with force the
    # value changes and the field is removed from the other managers.
    assert out["spec"]["image"] == "debian-13"
    with pytest.raises(ApiException) as e:
        apply(co, ns, "f1", proxy("f1", image="debian-12"), "alice")
    assert e.value.status == 409


def test_applying_the_same_value_shares_ownership_and_a_field_stays_while_anyone_owns_it(co, ns):
    base = proxy("s1", labels={"shared": "yes"})
    apply(co, ns, "s1", base, "alice")
    # Server-Side Apply › Conflicts: applying the same value is no conflict; both managers then
    # own the field (shared ownership).
    apply(co, ns, "s1", {"apiVersion": base["apiVersion"], "kind": "Proxy",
                         "metadata": {"name": "s1", "labels": {"shared": "yes"}}}, "bob")
    without = proxy("s1")
    out = apply(co, ns, "s1", without, "alice")
    # Server-Side Apply › Field management / Merge strategy: a field a manager stops applying
    # is removed only when no other manager owns it.
    assert out["metadata"]["labels"] == {"shared": "yes"}
    out = apply(co, ns, "s1", {"apiVersion": base["apiVersion"], "kind": "Proxy",
                               "metadata": {"name": "s1"}}, "bob")
    assert "shared" not in out["metadata"].get("labels", {})


def test_an_update_by_another_client_is_no_conflict_for_it_but_is_for_the_next_apply(co, ns):
    apply(co, ns, "u1", proxy("u1", image="debian-12"), "alice")
    # Server-Side Apply › Apply and Update: non-apply writes (update/patch) never conflict;
    # they take ownership of the fields they change ...
    out = co.patch_namespaced_custom_object(
        *P, ns, "proxies", "u1", {"spec": {"image": "debian-13"}},
        field_manager="kubectl-edit", _content_type="application/merge-patch+json")
    assert out["spec"]["image"] == "debian-13"
    assert ("kubectl-edit", "Update", "") in managers(out)


def test_an_apply_to_status_changes_only_status_and_is_recorded_for_the_status_subresource(
        co, ns):
    apply(co, ns, "st1", proxy("st1"), "alice")
    out = apply(co, ns, "st1", {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy",
                                "metadata": {"name": "st1"}, "status": {"phase": "Running"},
                                "spec": {"image": "ignored"}}, "operator", status=True)
    # CRD task page › Status subresource: /status ignores everything but status; Server-Side
    # Apply › Field management: managedFields entries name the subresource they apply to.
    assert out["status"]["phase"] == "Running" and out["spec"]["image"] == "debian-12"
    assert ("operator", "Apply", "status") in managers(out)


def test_a_resource_version_in_an_applied_config_is_a_precondition(co, ns):
    apply(co, ns, "rv1", proxy("rv1"), "alice")
    first = co.get_namespaced_custom_object(*P, ns, "proxies", "rv1")
    apply(co, ns, "rv1", proxy("rv1", image="debian-13"), "alice")
    stale = proxy("rv1", image="debian-14")
    stale["metadata"]["resourceVersion"] = first["metadata"]["resourceVersion"]
    with pytest.raises(ApiException) as e:
        apply(co, ns, "rv1", stale, "alice")
    # Server-Side Apply › Using Server-Side Apply in a controller (and API Conventions ›
    # Concurrency Control and Consistency): a resourceVersion in the applied object is an
    # optimistic-lock precondition, 409 when stale.
    assert e.value.status == 409
