"""kubectl against the fake: what a user of the operator types.

Sources: kubectl reference (kubectl get, explain, apply --server-side, scale, wait, label,
api-resources); Extend the Kubernetes API with CustomResourceDefinitions › Additional printer
columns, › Subresources › Scale subresource, › (names: shortNames); API Concepts › Receiving
resources as Tables; Server-Side Apply › Conflicts.
"""

import json
import re

import pytest
import yaml
from kubernetes import client

from conftest import GROUP, VERSION, condition, proxy, repo_root

P = (GROUP, VERSION)
def columns_of(crd_file):
    """The printer column names of the first version of a committed CRD (priority 0)."""
    doc = yaml.safe_load((repo_root() / "deploy" / "crds" / crd_file).read_text())
    cols = doc["spec"]["versions"][0]["additionalPrinterColumns"]
    return [c["name"].upper() for c in cols if c.get("priority", 0) == 0]


def test_kubectl_applies_the_committed_crds_and_waits_for_them_to_be_established(kubectl):
    out = kubectl("apply", "-f", "deploy/crds/").stdout
    # kubectl apply: each CRD is created or configured (they exist already from the Python
    # fixture, so client-side apply patches them).
    assert "proxies.egress-proxies.dev" in out and "providerhealths.egress-proxies.dev" in out
    # kubectl wait --for=condition=Established (API reference › CustomResourceDefinitionCondition).
    out = kubectl("wait", "--for=condition=Established", "--timeout=20s",
                  "crd/proxies.egress-proxies.dev").stdout
    assert "condition met" in out


def test_kubectl_get_proxies_prints_the_crd_printer_columns(kubectl, co, ns):
    co.create_namespaced_custom_object(*P, ns, "proxies", proxy("shown"))
    co.patch_namespaced_custom_object_status(
        *P, ns, "proxies", "shown",
        {"status": {"phase": "Running", "host": "host-a", "ip": "10.9.8.7",
                    "conditions": [condition("Ready", "False"),
                                   condition("Healthy", "True")]}},
        _content_type="application/merge-patch+json")
    lines = kubectl("get", "proxies", "-n", ns).stdout.splitlines()
    # CRD task page › Additional printer columns: kubectl get shows NAME then each column
    # (server-side printing: API Concepts › Receiving resources as Tables), values from the
    # columns' JSONPaths, including a filter on the conditions list.
    assert lines[0].split() == ["NAME"] + columns_of("proxies.egress-proxies.dev.yaml")
    row = lines[1].split()
    assert row[:5] == ["shown", "Running", "host-a", "10.9.8.7", "True"]
    # A `date` column prints as an age.
    assert re.fullmatch(r"\d+[smhd]", row[5])


def test_kubectl_get_providerhealths_prints_integer_and_date_columns(kubectl, co):
    co.create_cluster_custom_object(*P, "providerhealths", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ProviderHealth",
        "metadata": {"name": "kubectl-ph"}, "spec": {"provider": "kubectl-ph"}})
    co.patch_cluster_custom_object_status(
        *P, "providerhealths", "kubectl-ph",
        {"status": {"hostCount": 3, "readyHosts": 2, "checkedAt": "2020-01-01T00:00:00Z",
                    "conditions": [condition("Ready", "True")]}},
        _content_type="application/merge-patch+json")
    lines = kubectl("get", "providerhealths", "kubectl-ph").stdout.splitlines()
    assert lines[0].split() == ["NAME"] + columns_of("providerhealths.egress-proxies.dev.yaml")
    row = lines[1].split()
    # CRD task page › Additional printer columns › Type: integer prints as a number, date as an
    # age (2020 is years ago: days).
    assert row[:4] == ["kubectl-ph", "True", "3", "2"]
    assert re.fullmatch(r"\d+d", row[4])


def test_kubectl_explain_proxy_spec_reads_as_plain_text(kubectl):
    out = kubectl("explain", "proxy.spec").stdout
    doc = yaml.safe_load(
        (repo_root() / "deploy" / "crds" / "proxies.egress-proxies.dev.yaml").read_text())
    spec = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    # kubectl explain: the kind, the field, its description and its fields with their types,
    # from the CRD's published OpenAPI schema — as text, not JSON or YAML.
    assert "Proxy" in out and "DESCRIPTION:" in out and "FIELDS:" in out
    assert " ".join(spec["description"].split()[:4]) in " ".join(out.split())
    assert re.search(r"^\s+image\s+<string>", out, re.M)
    assert not out.lstrip().startswith(("{", "apiVersion"))


def test_kubectl_server_side_apply_of_the_example_manifest_conflicts_and_forces(kubectl, api):
    out = kubectl("apply", "--server-side", "-f", "examples/proxies/web-egress.yaml").stdout
    # kubectl apply --server-side (Server-Side Apply › (kubectl)): the object is applied with
    # field manager "kubectl".
    assert "serverside-applied" in out
    # NB: read with the Python client: kubectl since 1.21 hides managedFields.
    got = client.CustomObjectsApi(api).get_namespaced_custom_object(
        *P, "default", "proxies", "web-egress")
    managers = {(m["manager"], m["operation"]) for m in got["metadata"]["managedFields"]}
    assert ("kubectl", "Apply") in managers
    manifest = yaml.safe_load((repo_root() / "examples/proxies/web-egress.yaml").read_text())
    manifest["spec"]["image"] = "changed-by-someone-else"
    changed = json.dumps(manifest)
    conflict = kubectl("apply", "--server-side", "--field-manager=other", "-f", "-",
                       stdin=changed, check=False)
    # Server-Side Apply › Conflicts: another manager changing an owned field fails, naming the
    # owner; kubectl prints the server's message.
    assert conflict.returncode != 0
    assert "Apply failed with 1 conflict" in conflict.stderr and "kubectl" in conflict.stderr
    # ... and --force-conflicts makes the new manager the owner with its value.
    kubectl("apply", "--server-side", "--field-manager=other", "--force-conflicts", "-f", "-",
            stdin=changed)
    got = json.loads(kubectl("get", "proxy", "web-egress", "-n", "default", "-o", "json").stdout)
    assert got["spec"]["image"] == "changed-by-someone-else"


def test_kubectl_scale_of_a_proxy_fails_because_the_crd_declares_no_scale_subresource(
        kubectl, co, ns):
    co.create_namespaced_custom_object(*P, ns, "proxies", proxy("noscale"))
    proc = kubectl("scale", "proxy", "noscale", "-n", ns, "--replicas=2", check=False)
    # CRD task page › Subresources › Scale subresource: only a CRD that declares it serves
    # /scale; the Proxy CRD does not, so the server answers 404 and kubectl fails.
    assert proc.returncode != 0
    assert "NotFound" in proc.stderr or "could not find the requested resource" in proc.stderr


def test_kubectl_scale_of_a_proxypool_writes_its_replicas_through_the_scale_subresource(
        kubectl, co, ns):
    pool = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ProxyPool",
            "metadata": {"name": "fleet"},
            "spec": {"replicas": 2,
                     "template": {"spec": {"provider": "home", "image": "debian-12",
                                           "proxy": {"allowedClientCidrs": ["10.0.0.0/8"]}}}}}
    co.create_namespaced_custom_object(*P, ns, "proxypools", pool)
    co.patch_namespaced_custom_object_status(
        *P, ns, "proxypools", "fleet",
        {"status": {"replicas": 2, "readyReplicas": 1, "availableReplicas": 1,
                    "selector": "egress-proxies.dev/pool=fleet"}},
        _content_type="application/merge-patch+json")
    # kubectl scale (CRD task page › Scale subresource): the committed ProxyPool CRD declares
    # one, so kubectl writes spec.replicas through /scale.
    out = kubectl("scale", "proxypool", "fleet", "-n", ns, "--replicas=5").stdout
    assert "scaled" in out
    got = co.get_namespaced_custom_object(*P, ns, "proxypools", "fleet")
    assert got["spec"]["replicas"] == 5 and got["metadata"]["generation"] == 2
    sc = co.get_namespaced_custom_object_scale(*P, ns, "proxypools", "fleet")
    assert sc["status"] == {"replicas": 2, "selector": "egress-proxies.dev/pool=fleet"}
    # kubectl get by short name prints the CRD's printer columns.
    lines = kubectl("get", "eppool", "-n", ns).stdout.splitlines()
    assert lines[0].split() == ["NAME"] + columns_of("proxypools.egress-proxies.dev.yaml")
    assert lines[1].split()[:4] == ["fleet", "5", "1", "1"]


def test_kubectl_finds_proxies_by_short_name_and_category_and_filters_by_label(kubectl, co, ns):
    co.create_namespaced_custom_object(*P, ns, "proxies", proxy("lab"))
    kubectl("label", "proxy", "lab", "-n", ns, "team=net")
    co.create_namespaced_custom_object(*P, ns, "proxies", proxy("other"))
    # CRD task page › (names): shortNames and categories let kubectl find the resource
    # (kubectl api-resources lists them).
    res = kubectl("api-resources", f"--api-group={GROUP}").stdout
    assert re.search(r"^proxies\s+eproxy\s", res, re.M)
    out = kubectl("get", "eproxy", "-n", ns, "-l", "team=net", "-o", "name").stdout
    # kubectl get -l (Labels and Selectors › API): only the labelled Proxy.
    assert out.split() == ["proxy.egress-proxies.dev/lab"]
    # kubectl get CATEGORY: every resource of the category (the cluster-scoped
    # ProviderHealths too).
    out = kubectl("get", "egress-proxies", "-n", ns, "-o", "name").stdout.split()
    assert sorted(o for o in out if o.startswith("proxy.")) == [
        "proxy.egress-proxies.dev/lab", "proxy.egress-proxies.dev/other"]


def test_kubectl_delete_removes_a_proxy(kubectl, co, ns):
    co.create_namespaced_custom_object(*P, ns, "proxies", proxy("del"))
    out = kubectl("delete", "proxy", "del", "-n", ns).stdout
    assert "deleted" in out
    proc = kubectl("get", "proxy", "del", "-n", ns, check=False)
    # kubectl get of a deleted object: NotFound (API Conventions › HTTP Status codes, 404).
    assert proc.returncode != 0 and "NotFound" in proc.stderr
