"""Extender latency and throughput, end to end over HTTP on loopback.

Starts ``gnnsched extender --fake-cluster NxG`` as its own process (real uvicorn), then plays kube-scheduler:
for each pod a ``filter`` call with every node name (``nodeCacheCapable: true``) and a ``prioritize`` call with
the names that passed. Reports p50/p99 of filter+prioritize per pod and pods/s, for 1 and 8 concurrent clients
(one client process, a thread and keep-alive connection per concurrent client, as kube-scheduler's parallel
scheduling cycles would be),
plus the server's CPU seconds per pod (from /proc), which is the figure that bounds its throughput.

    python bench/extender_latency.py                       # 5000x8, 400 pods per client setting
    python bench/extender_latency.py --nodes 1000 --pods 200 --clients 1 4

The clients are Python and share the machine with the server: on a 2-core box the 8-client figure is a lower
bound (the clients' own JSON work competes with the server for the cores). ``uptime`` is printed beside it.
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orjson

GiB = 2**30


def _pods(n: int, seed: int) -> list[dict]:
    """Pods shaped like the operator's: annotations, one container with requests, downward-API env, volumes."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        gib = float(np.clip(rng.lognormal(np.log(8), 0.7), 0.5, 60))
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"gj-{seed}-{i}-worker",
                    "namespace": "team-a",
                    "uid": f"00000000-0000-4000-8000-{seed:04d}{i:08d}",
                    "labels": {"app.kubernetes.io/managed-by": "gnnsched", "gnnsched.io/job-name": f"gj-{i}"},
                    "annotations": {
                        "gnnsched.io/job": f"team-a/gj-{i}",
                        "gnnsched.io/gpu-memory": str(int(gib * GiB)),
                        "gnnsched.io/pmc-bytes": str(int(gib * GiB * 0.8)),
                        "gnnsched.io/predicted-runtime-seconds": f"{rng.uniform(60, 7200):.1f}",
                        "gnnsched.io/intensity": "memory" if rng.random() < 0.6 else "compute",
                    },
                    "ownerReferences": [
                        {
                            "apiVersion": "gnnsched.io/v1alpha1",
                            "kind": "GNNJob",
                            "name": f"gj-{i}",
                            "uid": "11111111-2222-3333-4444-555555555555",
                            "controller": True,
                        }
                    ],
                },
                "spec": {
                    "schedulerName": "gnnsched-scheduler",
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "worker",
                            "image": "ghcr.io/gnnsched/gnnsched:0.1.0",
                            "command": ["gnnsched", "gate", "--", "gnnsched", "worker", "/etc/gnnsched/job.yaml"],
                            "env": [
                                {"name": "GNNSCHED_POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                                {
                                    "name": "GNNSCHED_POD_NAME",
                                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                                },
                            ],
                            "resources": {
                                "requests": {"cpu": "2", "memory": "8Gi", "gnnsched.io/gpu-share": "1"},
                                "limits": {"gnnsched.io/gpu-share": "1"},
                            },
                            "volumeMounts": [{"name": "job", "mountPath": "/etc/gnnsched"}],
                        }
                    ],
                    "volumes": [{"name": "job", "configMap": {"name": f"gj-{i}"}}],
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                },
                "status": {"phase": "Pending"},
            }
        )
    return out


def _client(port: int, names: list[str], pods: list[dict], start: float, q: mp.Queue) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port)
    headers = {"Content-Type": "application/json"}
    bodies = [orjson.dumps({"Pod": p, "Nodes": None, "NodeNames": names}) for p in pods]
    while time.time() < start:
        time.sleep(0.001)
    lat = []
    passed_total = 0
    for pod, body in zip(pods, bodies, strict=True):
        t0 = time.perf_counter()
        conn.request("POST", "/filter", body, headers)
        r = conn.getresponse()
        f = orjson.loads(r.read())
        if r.status != 200 or f.get("Error"):
            raise SystemExit(f"filter failed: {r.status} {f.get('Error')}")
        passed = f["NodeNames"]
        passed_total += len(passed)
        conn.request("POST", "/prioritize", orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": passed}), headers)
        r = conn.getresponse()
        scores = r.read()
        # kube-scheduler decodes this in Go; a Python json decode of 5,000 objects would cost the client more than
        # the server spends, so the client only checks the reply's status and entry count
        if r.status != 200 or scores.count(b'"Host"') != len(passed):
            raise SystemExit(f"prioritize failed: {r.status}")
        lat.append(time.perf_counter() - t0)
    q.put((lat, passed_total / max(len(pods), 1)))


def _client_group(port: int, names: list[str], groups: list[list[dict]], start: float, q: mp.Queue) -> None:
    """One client process with a thread (and keep-alive connection) per concurrent client, like kube-scheduler:
    one process whose parallel scheduling cycles each hold a connection."""
    import queue as _queue
    import threading

    inner: _queue.Queue = _queue.Queue()

    class _Q:
        def put(self, item: object) -> None:
            inner.put(item)

    threads = [threading.Thread(target=_client, args=(port, names, pods, start, _Q())) for pods in groups]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results = [inner.get() for _ in threads]
    q.put(([x for r in results for x in r[0]], float(np.mean([r[1] for r in results]))))


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--model", default="A100-80GB")
    ap.add_argument("--pods", type=int, default=400, help="pods per client setting (split across clients)")
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--trust-domain", default="namespace",
                    help="the extender's --trust-domain; the fake cluster's pods run in another namespace than the "
                         "bench's, so under namespace every occupied GPU is another domain's (the rule's worst case)")
    args = ap.parse_args()

    port = _free_port()
    spec = f"{args.nodes}x{args.gpus}x{args.model}"
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gnnsched.cli", "extender", "--host", "127.0.0.1", "--port", str(port),
         "--fake-cluster", spec, "--log-level", "warning", "--trust-domain", args.trust_domain],
    )
    try:
        deadline = time.time() + 300
        while True:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", "/readyz")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                raise SystemExit("extender did not start")
            time.sleep(0.2)
        print(f"extender --fake-cluster {spec}: ready in {time.perf_counter() - t0:.1f} s (pid {proc.pid})")
        names = [f"node-{i}" for i in range(args.nodes)]
        print(f"uptime: {Path('/proc/loadavg').read_text().strip()}  (cores: {os.cpu_count()})")
        ctx = mp.get_context("fork")
        q: mp.Queue = ctx.Queue()
        # warm-up
        _client(port, names, _pods(args.warmup, 999), 0, q)
        q.get()
        for n_clients in args.clients:
            per = max(1, args.pods // n_clients)
            start = time.time() + 2.0
            groups = [_pods(per, k) for k in range(n_clients)]
            procs = [ctx.Process(target=_client_group, args=(port, names, groups, start, q))]
            for p in procs:
                p.start()
            while time.time() < start:
                time.sleep(0.001)
            cpu0 = _cpu_seconds(proc.pid)
            results = [q.get() for _ in procs]
            wall = time.time() - start
            server_cpu = _cpu_seconds(proc.pid) - cpu0
            for p in procs:
                p.join()
            lat = np.concatenate([np.asarray(r[0]) for r in results])
            # throughput from the slowest client's finish, server CPU from /proc over the run
            print(
                f"clients={n_clients}: pods={len(lat)}  filter+prioritize p50={np.percentile(lat, 50) * 1e3:.2f} ms  "
                f"p99={np.percentile(lat, 99) * 1e3:.2f} ms  max={lat.max() * 1e3:.2f} ms  "
                f"throughput={len(lat) / wall:.0f} pods/s  (mean nodes passing filter: "
                f"{np.mean([r[1] for r in results]):.0f}/{args.nodes}; server busy {server_cpu / wall:.0%} of a core, "
                f"{server_cpu / len(lat) * 1e3:.2f} ms CPU per pod)"
            )
        # server CPU per pod, measured on a sequential run so client time is excluded from the denominator
        cpu_before = _cpu_seconds(proc.pid)
        t1 = time.time()
        _client(port, names, _pods(200, 4242), 0, q)
        q.get()
        cpu = _cpu_seconds(proc.pid) - cpu_before
        print(
            f"server CPU per pod, one sequential client (filter+prioritize, 200 pods): {cpu / 200 * 1e3:.2f} ms  "
            f"(wall {time.time() - t1:.1f} s)"
        )
        c = http.client.HTTPConnection("127.0.0.1", port)
        c.request("GET", "/metrics")
        sums: dict[str, float] = {}
        for line in c.getresponse().read().decode().splitlines():
            if line.startswith("gnnsched_extender_request_seconds_"):
                key, value = line.rsplit(" ", 1)
                sums[key] = float(value)
        parts = []
        for verb in ("filter", "prioritize"):
            n = sums.get(f'gnnsched_extender_request_seconds_count{{verb="{verb}"}}', 0)
            total = sums.get(f'gnnsched_extender_request_seconds_sum{{verb="{verb}"}}', 0)
            if n:
                parts.append(f"{verb} {total / n * 1e3:.2f} ms")
        print("server handler time per request (mean, from /metrics, excludes HTTP): " + ", ".join(parts))
        print(f"uptime: {Path('/proc/loadavg').read_text().strip()}")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
