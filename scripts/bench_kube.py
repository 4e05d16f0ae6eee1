#!/usr/bin/env python3
"""Kubernetes-mode benchmark (used by `scripts/bench kube`): PROXIES Proxies across HOSTS
libvirt-fake hosts, from empty to Running, driven by the release `egress-proxies kubernetes`
binary against the fake API server as its own HTTPS process (`kube-fake-server`).

Per run, each in its own process: the fake API server (fresh store, generated CA, a token),
the fake hosts (`bench_standalone hosts`: unix sockets, published base, "DHCP"), and the
operator (KUBECONFIG from the fake's directory). The committed CRDs are applied and every
Proxy is created through the API before the operator starts; the run ends when a list of
the Proxies shows every one Running with an IP. Reported: wall time, the operator's peak RSS
(VmHWM of /proc/PID/status: its own, the fakes live elsewhere), its CPU, and SIGTERM-to-exit.
Every wait has a deadline.
"""
import argparse
import glob
import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time

import yaml

ENTRY, IMAGE, NETWORK, POOL = "bench", "tiny", "default", "images"
TOKEN = "bench-token"
NAMESPACE = "bench"
# Hang guards, not goals: the processes get ready in milliseconds; a run takes seconds.
READY_DEADLINE = 60
RUN_DEADLINE = 600
EXIT_DEADLINE = 90
HTTP_TIMEOUT = 30
POLL = 0.25


def read_line(proc, deadline):
    """The first stdout line of proc, within deadline seconds."""
    import selectors
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    if not sel.select(timeout=deadline):
        raise RuntimeError(f"{proc.args[0]}: no ready line within {deadline} s")
    return proc.stdout.readline().decode().strip()


class Api:
    def __init__(self, url, ca):
        host, port = url.removeprefix("https://").rsplit(":", 1)
        ctx = ssl.create_default_context(cafile=ca)
        self.conn = http.client.HTTPSConnection(host, int(port), context=ctx, timeout=HTTP_TIMEOUT)

    def call(self, method, path, body=None):
        headers = {"Authorization": f"Bearer {TOKEN}", "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        self.conn.request(method, path, body=data, headers=headers)
        r = self.conn.getresponse()
        payload = r.read()
        if r.status >= 300:
            raise RuntimeError(f"{method} {path}: {r.status} {payload[:300]!r}")
        return json.loads(payload)


def vm_hwm_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM")


def cpu_secs(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def metrics_running(listen):
    """The operator's own count of Running Proxies (`/metrics`), 0 when not answered."""
    try:
        conn = http.client.HTTPConnection(listen, timeout=HTTP_TIMEOUT)
        conn.request("GET", "/metrics")
        body = conn.getresponse().read().decode()
        conn.close()
    except OSError:
        return 0
    for line in body.splitlines():
        if line.startswith('egress_proxies_proxies{phase="Running"} '):
            return int(float(line.split()[-1]))
    return 0


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def one_run(a, root):
    work = tempfile.mkdtemp(prefix="epbench-kube-")
    procs = []
    try:
        api_dir = os.path.join(work, "api")
        # A real API server keeps a bounded window of changes for watches to resume from
        # (its watch cache, etcd compaction); keeping every write made the fake ~2 GB at
        # 20,000 Proxies. A watcher older than the window gets 410 and re-lists.
        fake = subprocess.Popen([a.fake_server, "--dir", api_dir, "--token", TOKEN,
                                 "--watch-history", str(a.watch_history)],
                                stdout=subprocess.PIPE)
        procs.append(fake)
        line = read_line(fake, READY_DEADLINE)
        if not line.startswith("ready "):
            raise RuntimeError(f"kube-fake-server said {line!r}")
        url = line.split(" ", 1)[1]
        sockets = os.path.join(work, "sockets")
        os.mkdir(sockets)
        echo_addr = None
        if a.health_interval:
            echo = subprocess.Popen([a.bin, "echo", "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL)
            procs.append(echo)
            echo_addr = read_line(echo, READY_DEADLINE).removeprefix("listening on ")
        hosts = subprocess.Popen([a.hosts_bin, "hosts", "--hosts", str(a.hosts), "--dir", sockets]
                                 + (["--proxy-port", "3128"] if a.health_interval else []),
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        procs.append(hosts)
        if read_line(hosts, READY_DEADLINE) != "ready":
            raise RuntimeError("the hosts process did not get ready")

        api = Api(url, os.path.join(api_dir, "ca.crt"))
        for path in sorted(glob.glob(os.path.join(root, "deploy/crds/*.yaml"))):
            for doc in yaml.safe_load_all(open(path)):
                if doc:
                    api.call("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", doc)
        base = f"/apis/egress-proxies.dev/v1alpha1/namespaces/{NAMESPACE}/proxies"
        for n in range(a.proxies):
            api.call("POST", base, {
                "apiVersion": "egress-proxies.dev/v1alpha1", "kind": "Proxy",
                "metadata": {"name": f"p{n:05}", "namespace": NAMESPACE,
                             "labels": {"egress-proxies.dev/group": f"g{n % 10}"}},
                "spec": {"provider": ENTRY, "image": IMAGE,
                         "proxy": {"allowedClientCidrs": ["10.0.0.0/8"]}}})

        cfg = [f"providers:\n  - name: {ENTRY}\n    type: libvirt\n    hosts:\n"]
        for i in range(a.hosts):
            cfg.append(f"      - name: h{i}\n        address: local\n        socket: {sockets}/h{i}.sock\n"
                       f"        pool: {POOL}\n        network: {NETWORK}\n        virtType: qemu\n"
                       f"        poolReserveGiB: 1\n")
        cfg.append(f"    images:\n      {IMAGE}:\n        url: https://images.invalid/tiny.qcow2\n"
                   f"        sha256: {'ab' * 32}\n        format: qcow2\n    timeouts:\n      dial: 3\n"
                   f"    defaults:\n      diskGiB: 4\n      memoryMiB: 256\n      vcpus: 1\n")
        cfg_path = os.path.join(work, "providers.yaml")
        open(cfg_path, "w").write("".join(cfg))

        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("KUBERNETES_", "POD_", "EGRESS_PROXIES_"))}
        env.update(KUBECONFIG=os.path.join(api_dir, "kubeconfig"), NO_COLOR="1")
        log = open(os.path.join(work, "operator.log"), "w")
        listen = f"127.0.0.1:{free_port()}"
        t0 = time.monotonic()
        op = subprocess.Popen([a.bin, "kubernetes", "--config", cfg_path, "--listen", listen,
                               "--lease-namespace", NAMESPACE, "--identity", "bench-op"]
                              + (["--health-target", f"http://{echo_addr}/",
                                  "--health-interval", f"{a.health_interval}s"] if a.health_interval else []),
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, env=env)
        procs.append(op)
        while True:
            if time.monotonic() - t0 > RUN_DEADLINE:
                tail = open(log.name).read().splitlines()[-30:]
                raise RuntimeError(f"not all Running within {RUN_DEADLINE} s:\n" + "\n".join(tail))
            if op.poll() is not None:
                raise RuntimeError(f"the operator exited early ({op.returncode})")
            # NB: a list of every Proxy is ~2 KB per Proxy to serialize under the fake's lock
            # and to parse here: listed every 0.25 s at 20,000 it was a large share of the
            # machine. So lists start once the operator's own count (cheap, but up to one
            # publishing interval late) passes half the fleet, and are spaced to take at most
            # a third of the time; the list stays the measure. Below 5,000 Proxies the lists
            # are cheap and the gate's lag (a publishing interval, 5 s) would be most of a run.
            if a.proxies >= 5000 and metrics_running(listen) < a.proxies // 2:
                time.sleep(POLL)
                continue
            t_list = time.monotonic()
            items = api.call("GET", base)["items"]
            running = sum(1 for p in items
                          if (p.get("status") or {}).get("phase") == "Running"
                          and (p.get("status") or {}).get("ip"))
            if running == a.proxies:
                wall = time.monotonic() - t0
                break
            time.sleep(max(POLL, 2 * (time.monotonic() - t_list)))
        if a.health_interval:
            while True:
                if time.monotonic() - t0 > RUN_DEADLINE:
                    raise RuntimeError("not all healthy in time")
                items = api.call("GET", base)["items"]
                healthy = sum(1 for p in items
                              if ((p.get("status") or {}).get("health") or {}).get("healthy") is True)
                if healthy == a.proxies:
                    break
                time.sleep(1)
            to_healthy = time.monotonic() - t0
            hwm = vm_hwm_kib(op.pid)
            rss = []
            t2 = time.monotonic()
            while time.monotonic() - t2 < a.steady:
                time.sleep(1)
                for line in open(f"/proc/{op.pid}/status"):
                    if line.startswith("VmRSS:"):
                        rss.append(int(line.split()[1]))
            items = api.call("GET", base)["items"]
            healthy_end = sum(1 for p in items
                              if ((p.get("status") or {}).get("health") or {}).get("healthy") is True)
            print(f"health ON: {to_healthy:.2f} s to {healthy}/{a.proxies} Running and Healthy; "
                  f"peak RSS (VmHWM) there {hwm / 1024:.1f} MiB; steady VmRSS over {len(rss)} samples: "
                  f"min {min(rss) / 1024:.1f} MiB, max {max(rss) / 1024:.1f} MiB, last {rss[-1] / 1024:.1f} MiB; "
                  f"VmHWM at the end {vm_hwm_kib(op.pid) / 1024:.1f} MiB; Healthy at the end {healthy_end}/{a.proxies}",
                  flush=True)
        hwm = vm_hwm_kib(op.pid)
        cpu = cpu_secs(op.pid)
        # Steady state: a host check round (every 30 s), publishing passes and the watches go
        # on; the peak over this period is what a memory limit must cover.
        time.sleep(a.settle)
        if op.poll() is not None:
            raise RuntimeError(f"the operator exited while settling ({op.returncode})")
        hwm_settled = vm_hwm_kib(op.pid)
        t1 = time.monotonic()
        op.send_signal(signal.SIGTERM)
        rc = op.wait(timeout=EXIT_DEADLINE)
        stop = time.monotonic() - t1
        if rc != 0:
            raise RuntimeError(f"the operator exited {rc} on SIGTERM")
        return wall, hwm, cpu, stop, hwm_settled
    finally:
        for p in procs:
            if p.poll() is None:
                if p.stdin:
                    p.stdin.close()
                p.terminate()
                try:
                    p.wait(timeout=EXIT_DEADLINE)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        subprocess.run(["rm", "-rf", work], check=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--fake-server", required=True)
    ap.add_argument("--hosts-bin", required=True)
    ap.add_argument("--hosts", type=int, default=10)
    ap.add_argument("--proxies", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--watch-history", type=int, default=50000,
                    help="writes the fake API server keeps for watches to resume from")
    ap.add_argument("--health-interval", type=int, default=0,
                    help="health checks ON, probes every N s (run inside the bench's network namespace)")
    ap.add_argument("--steady", type=int, default=60, help="seconds of steady-state RSS sampling")
    ap.add_argument("--settle", type=int, default=40,
                    help="seconds to keep the operator running after all are Running")
    a = ap.parse_args()
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    print(f"== kubernetes: {a.proxies} Proxies across {a.hosts} fake hosts, empty to Running, "
          f"fake API server over HTTPS in its own process ({a.runs} runs)", flush=True)
    res = []
    for r in range(1, a.runs + 1):
        wall, hwm, cpu, stop, settled = one_run(a, root)
        res.append((wall, hwm, cpu, stop, settled))
        print(f"run {r}: {wall:.2f} s to {a.proxies} Running; operator peak RSS (VmHWM) "
              f"{hwm / 1024:.1f} MiB at Running, {settled / 1024:.1f} MiB after {a.settle} s more; "
              f"operator CPU {cpu:.2f} s; SIGTERM to exit {stop:.2f} s", flush=True)
    w = [x[0] for x in res]
    m = [x[4] / 1024 for x in res]
    c = [x[2] for x in res]
    print(summary(a.proxies, a.hosts, w, m, c))


# Every size with goals (docs/benchmarks.md, "Kubernetes mode" and "Scaling"): (proxies,
# hosts) -> (seconds to all Running or None, peak RSS in MiB). Other sizes have none.
GOALS = {(1000, 10): (None, 48), (10000, 100): (60, 160)}


def summary(proxies, hosts, w, m, c):
    """The last line of a size's runs: each figure's range with this size's own goal beside it
    (how far the worst run is from it), or the sizes that have goals when this one has none."""
    goal = GOALS.get((proxies, hosts))
    if goal is None:
        sized = ", ".join(f"{p}/{h}" for p, h in GOALS)
        return (f"wall {min(w):.2f}–{max(w):.2f} s; peak RSS {min(m):.1f}–{max(m):.1f} MiB; "
                f"operator CPU {min(c):.2f}–{max(c):.2f} s "
                f"(no goal set for {proxies}/{hosts}; sizes with goals: {sized})")
    wall_goal, rss_goal = goal
    wall = f"wall {min(w):.2f}–{max(w):.2f} s"
    if wall_goal is not None:
        wall += f" (goal ≤ {wall_goal} s: {max(w) / wall_goal:.2f}× at worst)"
    return (f"{wall}; peak RSS {min(m):.1f}–{max(m):.1f} MiB "
            f"(goal ≤ {rss_goal} MiB for {proxies}/{hosts}: {max(m) / rss_goal:.2f}× at worst); "
            f"operator CPU {min(c):.2f}–{max(c):.2f} s")


if __name__ == "__main__":
    try:
        main()
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
