"""The extender in cluster mode against kmock (an in-memory Kubernetes API with watch streams over real HTTP):
the watcher fills the cache from Node, GPUNode and Pod objects, bind annotates the pod and creates the Binding,
a restarted extender rebuilds its reservation from the annotation, and an agent report ends it."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

kmock = pytest.importorskip("kmock")
from kubernetes import client  # noqa: E402
from test_extender_cache import make_pod  # noqa: E402

from gnnsched.contract import ANN_RESERVATION, GROUP, SCHEDULER_NAME, VERSION  # noqa: E402
from gnnsched.extender.server import ExtenderOptions, build_app  # noqa: E402
from gnnsched.extender.testing import LoopbackServer  # noqa: E402
from gnnsched.gpus import GiB  # noqa: E402


@pytest.fixture()
def api(tmp_path: Path) -> Iterator[tuple[str, Path, object]]:
    """kmock's Kubernetes emulator on loopback, in a thread with its own event loop, plus a kubeconfig for it."""
    ready = threading.Event()
    box: dict = {}

    async def main() -> None:
        async with kmock.KubernetesEmulator() as km, kmock.Server(km) as srv:
            box.update(url=str(srv.url).rstrip("/"), km=km)
            ready.set()
            while not box.get("stop"):
                await asyncio.sleep(0.05)
            # open watch streams never end by themselves: cancel their handlers so the server can shut down
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

    thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    thread.start()
    assert ready.wait(20)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
        "clusters": [{"name": "kmock", "cluster": {"server": box["url"]}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "u"}}],
    }))
    yield box["url"], kubeconfig, box["km"]
    box["stop"] = True
    thread.join(timeout=10)


def _gpunode(name: str, *, healthy: bool = True, running: list | None = None) -> dict:
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUNode", "metadata": {"name": name},
        "status": {
            "nodeName": name, "updatedAt": "2030-01-01T00:00:00Z", "mps": {"healthy": True},
            "gpus": [{"index": 0, "uuid": f"GPU-{name}", "model": "A100-80GB", "totalBytes": 80 * GiB,
                      "reserveBytes": GiB, "committedBytes": sum(j["bytes"] for j in running or []),
                      "healthy": healthy, "mpsHealthy": True, "maxClients": 48, "running": running or []}],
        },
    }


def _wait(cond: Callable[[], bool], what: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_watch_bind_restart_and_agent_report(api) -> None:
    url, kubeconfig, km = api
    cfg = client.Configuration()
    cfg.host = url
    core = client.CoreV1Api(client.ApiClient(cfg))
    custom = client.CustomObjectsApi(client.ApiClient(cfg))
    for n in ("n1", "n2"):
        node: Any = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": n},
                     "status": {"allocatable": {"cpu": "16", "memory": "64Gi"}}}
        core.create_node(node)
        custom.create_cluster_custom_object(GROUP, VERSION, "gpunodes", _gpunode(n))
    pod: Any = make_pod("p1", 30, intensity="memory", uid="u1")
    pod["spec"]["schedulerName"] = SCHEDULER_NAME
    pod["spec"]["containers"][0]["image"] = "x"
    core.create_namespaced_pod("ns", pod)
    args = {"Pod": pod, "NodeNames": ["n1", "n2"]}
    probe = {"Pod": make_pod("probe", 40, intensity="memory", uid="u-probe"), "NodeNames": ["n1", "n2"]}

    opts = ExtenderOptions(kubeconfig=str(kubeconfig))
    with LoopbackServer(build_app(opts)) as srv, httpx.Client(base_url=srv.url, timeout=10) as c:
        _wait(lambda: c.get("/readyz").status_code == 200, "initial sync")
        assert c.post("/filter", json=args).json()["NodeNames"] == ["n1", "n2"]
        bind = {"PodName": "p1", "PodNamespace": "ns", "PodUID": "u1", "Node": "n1"}
        assert c.post("/bind", json=bind).json() == {"Error": ""}
        stored = core.read_namespaced_pod("p1", "ns")
        ann = json.loads(stored.metadata.annotations[ANN_RESERVATION])
        assert ann["node"] == "n1" and ann["gpu"] == 0 and ann["bytes"] == 30 * GiB
        bindings = [obj for (res, ns, name), obj in km.objects.items() if res.plural == "bindings"]
        assert len(bindings) == 1 and bindings[0]["target"]["name"] == "n1"
        before = c.post("/prioritize", json=probe).json()
        assert before[0]["Score"] < before[1]["Score"]  # n1 already holds 30 GiB for p1
        # the watch delivers an agent's status change: n2's only GPU fails
        custom.patch_cluster_custom_object(GROUP, VERSION, "gpunodes", "n2", _gpunode("n2", healthy=False))
        _wait(lambda: "n2" in c.post("/filter", json=args).json()["FailedNodes"], "GPUNode watch event")
        custom.patch_cluster_custom_object(GROUP, VERSION, "gpunodes", "n2", _gpunode("n2"))
        _wait(lambda: c.post("/prioritize", json=probe).json() == before, "n2 healthy again")

    # restart: the reservation comes back from the pod annotation and the decisions are the same
    with LoopbackServer(build_app(opts)) as srv, httpx.Client(base_url=srv.url, timeout=10) as c:
        _wait(lambda: c.get("/readyz").status_code == 200, "initial sync after restart")
        cache = srv.app.state.service.cache
        assert [(r.uid, r.node, r.gpu, r.bytes) for r in cache.reservations()] == [("u1", "n1", 0, 30 * GiB)]
        assert c.post("/prioritize", json=probe).json() == before
        # the agent reports p1 running on n1: the reservation is replaced by the agent's own accounting
        running = [{"podUid": "u1", "namespace": "ns", "name": "p1", "bytes": 30 * GiB,
                    "predictedRemainingSeconds": 600, "intensity": "memory"}]
        custom.patch_cluster_custom_object(GROUP, VERSION, "gpunodes", "n1", _gpunode("n1", running=running))
        _wait(lambda: cache.reservations() == [], "agent report ending the reservation")
        assert cache.gpu_usage("n1")[0]["used"] == 30 * GiB
