"""Fixtures of the kube-fake conformance suite.

The suite drives `kube-fake-server` (the fake Kubernetes API server as its own HTTPS process)
with clients we did not write: the official Kubernetes Python client and kubectl. Every
expectation is taken from the Kubernetes documentation (API Concepts, API Conventions, the API
reference, the Server-Side Apply, Finalizers, Labels and Selectors and CustomResourceDefinition
pages), cited beside each check, never from the fake's own behaviour.

Environment:
  KUBE_FAKE_SERVER  path of the kube-fake-server binary (required)
  KUBECTL           kubectl to run (default: Debian's kubernetes-client as .ci/setup-host
                    unpacks it, /opt/egress-proxies/kubernetes-client/usr/bin/kubectl)
  REPO_ROOT         the repository (default: four levels above this file)

Every wait has a deadline: the server's ready line (SERVER_READY_S), every HTTP request
(REQUEST_TIMEOUT, installed as the client's default below), every watch (server-side
timeoutSeconds plus the request timeout) and every kubectl run (KUBECTL_TIMEOUT_S). The
server process is terminated (then killed) when the session ends, on every path.
"""

import os
import pathlib
import secrets
import select
import subprocess
import time
import uuid

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client import rest

# NB: the server prints its ready line within milliseconds (key generation is the slow part);
# 30 s absorbs a loaded 2-core CI machine.
SERVER_READY_S = 30
# NB: (connect, read) for one request to an in-memory store on loopback: answers take
# milliseconds; a watch's read timeout must exceed its server-side timeoutSeconds (<= 5 here).
REQUEST_TIMEOUT = (5, 20)
# NB: kubectl start-up plus discovery on loopback takes well under a second.
KUBECTL_TIMEOUT_S = 60
# How many writes the server keeps for watches to replay (kube-fake-server --watch-history):
# small enough that the 410 test can outrun it with a few hundred writes.
WATCH_HISTORY = 200

GROUP = "egress-proxies.dev"
VERSION = "v1alpha1"

_request = rest.RESTClientObject.request


def _request_with_deadline(self, method, url, *args, _request_timeout=None, **kwargs):
    """Every request of the Python client gets a deadline (the client's default is none)."""
    return _request(
        self, method, url, *args, _request_timeout=_request_timeout or REQUEST_TIMEOUT, **kwargs
    )


rest.RESTClientObject.request = _request_with_deadline


def repo_root() -> pathlib.Path:
    env = os.environ.get("REPO_ROOT")
    if env:
        return pathlib.Path(env)
    return pathlib.Path(__file__).resolve().parents[4]


class Server:
    def __init__(self, proc, url, directory, token):
        self.proc = proc
        self.url = url
        self.dir = directory
        self.token = token
        self.kubeconfig = directory / "kubeconfig"


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    binary = os.environ.get("KUBE_FAKE_SERVER")
    if not binary:
        pytest.fail("KUBE_FAKE_SERVER must name the kube-fake-server binary")
    directory = tmp_path_factory.mktemp("kube-fake")
    token = secrets.token_hex(16)
    proc = subprocess.Popen(
        [binary, "--dir", str(directory), "--token", token,
         "--watch-history", str(WATCH_HISTORY)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + SERVER_READY_S
        ready, _, _ = select.select([proc.stdout], [], [], SERVER_READY_S)
        line = proc.stdout.readline() if ready else ""
        if not line.startswith("ready https://") or time.monotonic() > deadline:
            pytest.fail(f"kube-fake-server did not get ready: {line!r}")
        yield Server(proc, line.split()[1], directory, token)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="session")
def api(server):
    return config.new_client_from_config(config_file=str(server.kubeconfig))


@pytest.fixture(scope="session")
def crds(api):
    """The committed CRDs (deploy/crds), created through the API as `kubectl apply` would."""
    ext = client.ApiextensionsV1Api(api)
    created = []
    for path in sorted((repo_root() / "deploy" / "crds").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                created.append(ext.create_custom_resource_definition(body=doc))
    return created


@pytest.fixture
def ns(api):
    """A fresh namespace for one test (created first, as a real server requires)."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    client.CoreV1Api(api).create_namespace(body={"metadata": {"name": name}})
    return name


@pytest.fixture
def co(api, crds):
    return client.CustomObjectsApi(api)


def proxy(name, image="debian-12", labels=None, finalizers=None):
    """A Proxy manifest (the committed CRD's shape)."""
    meta = {"name": name}
    if labels:
        meta["labels"] = labels
    if finalizers:
        meta["finalizers"] = finalizers
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Proxy",
        "metadata": meta,
        "spec": {"provider": "local", "image": image,
                 "proxy": {"port": 3128, "protocol": "http",
                           "allowedClientCidrs": ["192.168.122.0/24"]}},
    }


def condition(type_, status):
    """A condition as the committed CRDs' schema requires one (every field but none extra)."""
    return {"type": type_, "status": status, "reason": "Test", "message": "set by a test",
            "lastTransitionTime": "2020-01-01T00:00:00Z", "observedGeneration": 1}


def status_of(exc):
    """The Status object of an ApiException's body."""
    import json

    return json.loads(exc.body)


DEFAULT_KUBECTL = "/opt/egress-proxies/kubernetes-client/usr/bin/kubectl"


@pytest.fixture(scope="session")
def kubectl(server, crds):
    binary = os.environ.get("KUBECTL", DEFAULT_KUBECTL)
    if not os.access(binary, os.X_OK):
        pytest.fail(f"no kubectl at {binary} (.ci/setup-host installs it)")

    def run(*args, check=True, stdin=None):
        proc = subprocess.run(
            [binary, "--kubeconfig", str(server.kubeconfig), *args],
            input=stdin, capture_output=True, text=True, timeout=KUBECTL_TIMEOUT_S,
            cwd=repo_root(), env={**os.environ, "HOME": str(server.dir)})
        if check and proc.returncode != 0:
            pytest.fail(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
        return proc

    return run
