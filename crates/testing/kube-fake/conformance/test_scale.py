"""The scale subresource, on a CRD that declares it (widgets.crd.yaml; of the committed CRDs
only ProxyPool declares one — see test_kubectl.py; the Proxy's /scale is a 404, see
test_objects.py).

Source: Extend the Kubernetes API with CustomResourceDefinitions › Advanced topics ›
Subresources › Scale subresource (specReplicasPath, statusReplicasPath, labelSelectorPath; the
autoscaling/v1 Scale object); API Conventions › Concurrency Control and Consistency; kubectl
scale reference.
"""

import pathlib

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException


W = ("conformance.example.com", "v1")
MERGE = "application/merge-patch+json"


@pytest.fixture(scope="module")
def widgets(api):
    doc = yaml.safe_load((pathlib.Path(__file__).parent / "widgets.crd.yaml").read_text())
    client.ApiextensionsV1Api(api).create_custom_resource_definition(body=doc)
    return client.CustomObjectsApi(api)


def widget(name, replicas):
    return {"apiVersion": "conformance.example.com/v1", "kind": "Widget",
            "metadata": {"name": name}, "spec": {"replicas": replicas, "color": "blue"}}


def test_a_declared_scale_subresource_is_discoverable_and_reads_the_object(api, widgets, ns):
    res = {r.name: r for r in widgets.get_api_resources(*W).resources}
    # CRD task page › Scale subresource: /scale is exposed, serving autoscaling/v1 Scale.
    assert (res["widgets/scale"].kind, res["widgets/scale"].group,
            res["widgets/scale"].version) == ("Scale", "autoscaling", "v1")
    widgets.create_namespaced_custom_object(*W, ns, "widgets", widget("w1", 2))
    sc = widgets.get_namespaced_custom_object_scale(*W, ns, "widgets", "w1")
    # spec.replicas from specReplicasPath; with nothing at statusReplicasPath the status
    # replicas default to 0, with nothing at labelSelectorPath the selector to "".
    assert (sc["kind"], sc["apiVersion"]) == ("Scale", "autoscaling/v1")
    assert sc["spec"]["replicas"] == 2
    assert sc["status"]["replicas"] == 0 and sc["status"].get("selector", "") == ""
    widgets.patch_namespaced_custom_object_status(
        *W, ns, "widgets", "w1", {"status": {"replicas": 1, "selector": "app=w1"}},
        _content_type=MERGE)
    sc = widgets.get_namespaced_custom_object_scale(*W, ns, "widgets", "w1")
    assert sc["status"] == {"replicas": 1, "selector": "app=w1"}


def test_patching_scale_writes_only_the_replicas_of_the_object(widgets, ns):
    before = widgets.create_namespaced_custom_object(*W, ns, "widgets", widget("w2", 1))
    sc = widgets.patch_namespaced_custom_object_scale(
        *W, ns, "widgets", "w2", {"spec": {"replicas": 4}}, _content_type=MERGE)
    assert sc["spec"]["replicas"] == 4
    obj = widgets.get_namespaced_custom_object(*W, ns, "widgets", "w2")
    # CRD task page › Scale subresource: the Scale's spec.replicas is written to
    # specReplicasPath; nothing else changes; it is a spec change (generation increments).
    assert obj["spec"] == {"replicas": 4, "color": "blue"}
    assert obj["metadata"]["generation"] == before["metadata"]["generation"] + 1


def test_a_scale_replace_with_a_stale_resource_version_is_409(widgets, ns):
    widgets.create_namespaced_custom_object(*W, ns, "widgets", widget("w3", 1))
    stale = widgets.get_namespaced_custom_object_scale(*W, ns, "widgets", "w3")
    widgets.patch_namespaced_custom_object(*W, ns, "widgets", "w3", {"spec": {"color": "red"}},
                                           _content_type=MERGE)
    stale["spec"]["replicas"] = 9
    with pytest.raises(ApiException) as e:
        widgets.replace_namespaced_custom_object_scale(*W, ns, "widgets", "w3", stale)
    # API Conventions › Concurrency Control and Consistency: 409 on a stale resourceVersion.
    assert e.value.status == 409
    assert widgets.get_namespaced_custom_object(*W, ns, "widgets", "w3")["spec"]["replicas"] == 1


def test_kubectl_scale_sets_the_replicas_through_the_scale_subresource(kubectl, widgets, ns):
    widgets.create_namespaced_custom_object(*W, ns, "widgets", widget("w4", 1))
    out = kubectl("scale", "widgets.conformance.example.com", "w4", "-n", ns,
                  "--replicas=3").stdout
    # kubectl scale: sets the replicas of a resource with a scale subresource.
    assert "scaled" in out
    assert widgets.get_namespaced_custom_object(*W, ns, "widgets", "w4")["spec"]["replicas"] == 3
