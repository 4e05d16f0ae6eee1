"""What the server does to a custom resource's content: validation against the CRD's schema and
its CEL rules, defaulting, pruning, and the 422 Status clients see.

Sources (kubernetes.io/docs): Extend the Kubernetes API with CustomResourceDefinitions (the CRD
task page) › Validation, › Validation rules (x-kubernetes-validations: messageExpression,
transition rules, resource use by validation functions), › Defaulting, › Field pruning;
API Concepts › Field validation (fieldValidation Strict / Warn); API Conventions › Response
Status Kind (details.causes); Common Expression Language in Kubernetes (the libraries).
Message wording: the API server's (apimachinery field errors, kube-openapi messages), which
kubectl prints as `The KIND "NAME" is invalid: FIELD: MESSAGE`.
"""

import copy
import json

import pytest
from kubernetes import client

from conftest import GROUP, VERSION, proxy, status_of

P = (GROUP, VERSION)


def refused(fn, *args, **kwargs):
    with pytest.raises(client.ApiException) as e:
        fn(*args, **kwargs)
    return e.value


def test_an_out_of_bounds_field_is_a_422_invalid_status_with_a_cause_per_field(co, ns):
    bad = proxy("bad-port")
    bad["spec"]["proxy"]["port"] = 70000
    e = refused(co.create_namespaced_custom_object, *P, ns, "proxies", bad)
    assert e.status == 422
    s = status_of(e)
    # API Conventions › Response Status Kind: kind Status, reason Invalid, details naming the
    # object and one cause per invalid field.
    assert s["kind"] == "Status" and s["status"] == "Failure" and s["reason"] == "Invalid"
    assert s["code"] == 422
    assert s["details"]["name"] == "bad-port" and s["details"]["kind"] == "Proxy"
    assert s["details"]["group"] == GROUP
    assert s["details"]["causes"] == [{
        "reason": "FieldValueInvalid", "field": "spec.proxy.port",
        "message": "Invalid value: 70000: spec.proxy.port in body should be less than or equal "
                   "to 65535"}]
    assert s["message"] == (
        'Proxy.egress-proxies.dev "bad-port" is invalid: spec.proxy.port: Invalid value: 70000: '
        "spec.proxy.port in body should be less than or equal to 65535")
    # Nothing was stored.
    assert refused(co.get_namespaced_custom_object, *P, ns, "proxies", "bad-port").status == 404


def test_several_invalid_fields_are_listed_in_brackets_with_their_reasons(co, ns):
    bad = proxy("many")
    bad["spec"]["proxy"]["protocol"] = "ftp"
    bad["spec"]["proxy"]["allowedClientCidrs"] = ["10.0.0.0/8"] * 257
    del bad["spec"]["image"]
    s = status_of(refused(co.create_namespaced_custom_object, *P, ns, "proxies", bad))
    causes = {c["field"]: (c["reason"], c["message"]) for c in s["details"]["causes"]}
    assert causes["spec.image"] == ("FieldValueRequired", "Required value")
    assert causes["spec.proxy.protocol"] == (
        "FieldValueNotSupported", 'Unsupported value: "ftp": supported values: "http", "socks5"')
    assert causes["spec.proxy.allowedClientCidrs"] == (
        "FieldValueTooMany", "Too many: 257: must have at most 256 items")
    # CRD task page › Validation rules: rules are not run when the object already failed the
    # schema in a way that makes them meaningless; the server says so in one more cause.
    assert causes["<nil>"] == (
        "FieldValueInvalid",
        'Invalid value: "null": some validation rules were not checked because the object was '
        "invalid; correct the existing errors to complete validation")
    assert s["message"].startswith('Proxy.egress-proxies.dev "many" is invalid: [')


def test_a_cel_rule_refuses_with_its_message_at_its_path(co, ns):
    # The committed CRD's rule on spec: a proxy must name its clients or require credentials.
    open_relay = proxy("open")
    open_relay["spec"]["proxy"]["allowedClientCidrs"] = []
    s = status_of(refused(co.create_namespaced_custom_object, *P, ns, "proxies", open_relay))
    assert s["details"]["causes"] == [{
        "reason": "FieldValueInvalid", "field": "spec",
        "message": 'Invalid value: "object": set proxy.allowedClientCidrs or '
                   "proxy.credentialsRef: a proxy open to everyone is an open relay"}]
    # A rule using the Kubernetes IP library (isIP, ip().family()).
    two_v4 = proxy("two-v4")
    two_v4["spec"]["egress"] = {"address": ["203.0.113.7", "203.0.113.8"]}
    s = status_of(refused(co.create_namespaced_custom_object, *P, ns, "proxies", two_v4))
    assert [c["field"] for c in s["details"]["causes"]] == ["spec.egress.address"]
    assert "at most one address per family" in s["details"]["causes"][0]["message"]
    ok = proxy("v4-v6")
    ok["spec"]["egress"] = {"address": ["203.0.113.7", "2001:db8::7"]}
    co.create_namespaced_custom_object(*P, ns, "proxies", ok)


def test_a_transition_rule_refuses_a_change_but_not_the_create(co, ns):
    # CRD task page › Transition rules: `self == oldSelf` runs on updates only.
    co.create_namespaced_custom_object(*P, ns, "proxies", proxy("moving"))
    e = refused(co.patch_namespaced_custom_object, *P, ns, "proxies", "moving",
                {"spec": {"provider": "elsewhere"}})
    assert e.status == 422
    assert status_of(e)["details"]["causes"] == [{
        "reason": "FieldValueInvalid", "field": "spec.provider",
        "message": 'Invalid value: "string": spec.provider is immutable: delete the Proxy and '
                   "create a new one"}]
    # Other spec changes go through.
    co.patch_namespaced_custom_object(*P, ns, "proxies", "moving", {"spec": {"image": "other"}})


def test_defaults_are_filled_in_on_create(co, ns):
    body = proxy("defaulted")
    body["spec"]["proxy"] = {"allowedClientCidrs": ["10.0.0.0/8"]}
    out = co.create_namespaced_custom_object(*P, ns, "proxies", body)
    # CRD task page › Defaulting: missing fields with a `default` get it, nested ones too.
    assert out["spec"]["proxy"]["port"] == 3128
    assert out["spec"]["proxy"]["protocol"] == "http"
    assert out["spec"]["resources"] == {}


def test_unknown_fields_are_pruned_with_a_warning_or_refused_when_strict(api, co, ns):
    body = proxy("pruned")
    body["spec"]["bogus"] = 1
    body["spec"]["proxy"]["alsoBogus"] = "x"
    # CRD task page › Field pruning: unknown fields are dropped; API Concepts › Field
    # validation: by default (Warn) the server answers with a warning per dropped field.
    out, code, headers = co.create_namespaced_custom_object_with_http_info(
        *P, ns, "proxies", copy.deepcopy(body))
    assert code == 201
    assert "bogus" not in out["spec"] and "alsoBogus" not in out["spec"]["proxy"]
    warnings = headers.getlist("Warning") if hasattr(headers, "getlist") else [headers["Warning"]]
    text = ",".join(warnings)
    assert 'unknown field \\"spec.bogus\\"' in text and 'unknown field \\"spec.proxy.alsoBogus\\"' in text
    # Strict: a 400 naming every unknown field, nothing stored.
    body["metadata"]["name"] = "strict"
    e = refused(co.create_namespaced_custom_object, *P, ns, "proxies", body,
                field_validation="Strict")
    assert e.status == 400
    assert status_of(e)["message"] == (
        'strict decoding error: unknown field "spec.bogus", unknown field "spec.proxy.alsoBogus"')
    assert refused(co.get_namespaced_custom_object, *P, ns, "proxies", "strict").status == 404


def test_status_writes_are_validated_against_the_status_schema(co, ns):
    co.create_namespaced_custom_object(*P, ns, "proxies", proxy("st-valid"))
    e = refused(co.patch_namespaced_custom_object_status, *P, ns, "proxies", "st-valid",
                {"status": {"phase": "Sideways"}})
    causes = status_of(e)["details"]["causes"]
    assert causes[0] == {
        "reason": "FieldValueNotSupported", "field": "status.phase",
        "message": 'Unsupported value: "Sideways": supported values: "Pending", "Provisioning", '
                   '"Running", "Paused", "Failed", "Terminating"'}


def test_a_crd_whose_rule_is_too_expensive_is_refused(api):
    # CRD task page › Resource use by validation functions: a rule whose estimated cost
    # exceeds the per-expression limit is refused when the CRD is written.
    ext = client.ApiextensionsV1Api(api)
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "costlies.conformance.example.com"},
        "spec": {"group": "conformance.example.com", "scope": "Namespaced",
                 "names": {"kind": "Costly", "plural": "costlies"},
                 "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                     "openAPIV3Schema": {"type": "object", "properties": {"spec": {
                         "type": "object", "properties": {"list": {
                             "type": "array", "items": {"type": "string"},
                             "x-kubernetes-validations": [
                                 {"rule": "self.all(x, self.all(y, x == y))"}]}}}}}}}]}}
    e = refused(ext.create_custom_resource_definition, crd)
    assert e.status == 422
    s = status_of(e)
    assert s["details"]["causes"][0]["field"] == (
        "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[list]"
        ".x-kubernetes-validations[0].rule")
    assert s["details"]["causes"][0]["message"].startswith(
        "Forbidden: estimated rule cost exceeds budget by factor of more than 100x (try "
        "simplifying the rule, or adding maxItems, maxProperties, and maxLength")
    # With bounds, the same rule is cheap enough.
    items = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    items["properties"]["list"]["maxItems"] = 10
    items["properties"]["list"]["items"]["maxLength"] = 10
    ext.create_custom_resource_definition(crd)


def test_kubectl_apply_of_an_invalid_object_prints_the_servers_causes(kubectl, ns):
    manifest = json.dumps(proxy("kubectl-bad") | {"metadata": {"name": "kubectl-bad",
                                                                "namespace": ns}})
    bad = json.loads(manifest)
    bad["spec"]["proxy"]["port"] = 70000
    out = kubectl("apply", "-f", "-", stdin=json.dumps(bad), check=False)
    assert out.returncode != 0
    # kubectl's own wording of a 422 with causes (cmdutil.CheckErr): the kind and name from
    # details, then FIELD: MESSAGE from each cause.
    assert ('The Proxy "kubectl-bad" is invalid: spec.proxy.port: Invalid value: 70000: '
            "spec.proxy.port in body should be less than or equal to 65535") in out.stderr
    relay = json.loads(manifest)
    relay["spec"]["proxy"]["allowedClientCidrs"] = []
    out = kubectl("apply", "-f", "-", stdin=json.dumps(relay), check=False)
    assert out.returncode != 0
    assert ('The Proxy "kubectl-bad" is invalid: spec: Invalid value: "object": set '
            "proxy.allowedClientCidrs or proxy.credentialsRef: a proxy open to everyone is an "
            "open relay") in out.stderr
    two = json.loads(manifest)
    two["spec"]["proxy"]["protocol"] = "ftp"
    two["spec"]["proxy"]["port"] = 0
    out = kubectl("apply", "-f", "-", stdin=json.dumps(two), check=False)
    assert out.returncode != 0
    # Several causes: one line each, as `* FIELD: MESSAGE`.
    assert 'The Proxy "kubectl-bad" is invalid: \n' in out.stderr
    assert ("* spec.proxy.port: Invalid value: 0: spec.proxy.port in body should be greater "
            "than or equal to 1") in out.stderr
    assert ('* spec.proxy.protocol: Unsupported value: "ftp": supported values: "http", '
            '"socks5"') in out.stderr
