"""The extender in cluster mode against the emulated API server (kmock with the binding subresource of
``tests/kube_emulator.py``, watch streams over real HTTP): the watcher fills the cache from Node, GPUNode and Pod
objects, bind is one Binding whose annotation the API server copies onto the pod, a retried bind is idempotent, a
restarted extender rebuilds its reservation from the annotation, and an agent report ends it."""

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
from kube_emulator import StrictKubernetes  # noqa: E402
from kubernetes import client  # noqa: E402
from test_extender_cache import make_pod  # noqa: E402

from gnnsched.contract import ANN_RESERVATION, GROUP, SCHEDULER_NAME, VERSION  # noqa: E402
from gnnsched.extender.server import ExtenderOptions, build_app  # noqa: E402
from gnnsched.extender.testing import LoopbackServer  # noqa: E402
from gnnsched.gpu.catalogue import GiB  # noqa: E402


def _raw_pod(core: Any, name: str, namespace: str) -> bytes:
    """The pod as the API server stored it (the raw JSON, not the client's model of it)."""
    return core.read_namespaced_pod(name, namespace, _preload_content=False).data

class _Hooks:
    """What the emulator does around each write: record it, and optionally delay it or lose its answer."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, str | None, str | None]] = []
        self.delay = 0.0
        self.lose_binding_answers = 0

    async def before(self, request: object) -> None:
        res = getattr(request, "resource", None)
        self.writes.append((getattr(res, "plural", ""), getattr(request, "subresource", None),
                            getattr(request, "name", None)))
        if self.delay and getattr(request, "subresource", None) == "binding":
            await asyncio.sleep(self.delay)

    async def after(self, request: object) -> None:
        if self.lose_binding_answers and getattr(request, "subresource", None) == "binding":
            self.lose_binding_answers -= 1
            raise RuntimeError("answer lost after the write was applied")


@pytest.fixture()
def api(tmp_path: Path) -> Iterator[tuple[str, Path, object, _Hooks]]:
    """The emulated API server on loopback, in a thread with its own event loop, plus a kubeconfig for it."""
    ready = threading.Event()
    box: dict = {}
    hooks = _Hooks()

    async def main() -> None:
        async with StrictKubernetes(before_write=hooks.before, after_write=hooks.after) as km, \
                kmock.Server(km) as srv:
            # the GNNJob CRD, as the chart installs it: the extender lists and watches GNNJobs (their pods' facts)
            km.resources[f"{GROUP}/{VERSION}/gnnjobs"] = kmock.ResourceInfo(
                kind="GNNJob", singular="gnnjob", namespaced=True, verbs={"list", "watch", "get", "create", "patch"})
            box.update(url=str(srv.url).rstrip("/"), km=km, hooks=hooks)
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
    yield box["url"], kubeconfig, box["km"], hooks
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


def _clients(url: str) -> tuple[client.CoreV1Api, client.CustomObjectsApi]:
    cfg = client.Configuration()
    cfg.host = url
    return client.CoreV1Api(client.ApiClient(cfg)), client.CustomObjectsApi(client.ApiClient(cfg))


def _two_nodes_and_a_pod(core: client.CoreV1Api, custom: client.CustomObjectsApi) -> dict:
    """Nodes n1 and n2 with one idle A100-80GB each, and pod ns/p1 (30 GiB) as the API server stored it."""
    for n in ("n1", "n2"):
        node: Any = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": n},
                     "status": {"allocatable": {"cpu": "16", "memory": "64Gi"}}}
        core.create_node(node)
        custom.create_cluster_custom_object(GROUP, VERSION, "gpunodes", _gpunode(n))
    pod: Any = make_pod("p1", 30, intensity="memory")
    pod["metadata"].pop("uid", None)
    pod["spec"]["schedulerName"] = SCHEDULER_NAME
    pod["spec"]["containers"][0]["image"] = "x"
    core.create_namespaced_pod("ns", pod)
    return json.loads(_raw_pod(core, "p1", "ns"))


def test_watch_bind_restart_and_agent_report(api) -> None:
    url, kubeconfig, km, _ = api
    core, custom = _clients(url)
    pod = _two_nodes_and_a_pod(core, custom)
    u1 = pod["metadata"]["uid"]
    args = {"Pod": pod, "NodeNames": ["n1", "n2"]}
    probe = {"Pod": make_pod("probe", 40, intensity="memory", uid="u-probe"), "NodeNames": ["n1", "n2"]}

    opts = ExtenderOptions(kubeconfig=str(kubeconfig))
    with LoopbackServer(build_app(opts)) as srv, httpx.Client(base_url=srv.url, timeout=10) as c:
        _wait(lambda: c.get("/readyz").status_code == 200, "initial sync")
        assert c.post("/filter", json=args).json()["NodeNames"] == ["n1", "n2"]
        bind = {"PodName": "p1", "PodNamespace": "ns", "PodUID": u1, "Node": "n1"}
        assert c.post("/bind", json=bind).json() == {"Error": ""}
        stored = core.read_namespaced_pod("p1", "ns")
        ann = json.loads(stored.metadata.annotations[ANN_RESERVATION])
        assert ann["node"] == "n1" and ann["gpu"] == 0 and ann["bytes"] == 30 * GiB
        assert stored.spec.node_name == "n1"
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
        assert [(r.uid, r.node, r.gpu, r.bytes) for r in cache.reservations()] == [(u1, "n1", 0, 30 * GiB)]
        assert c.post("/prioritize", json=probe).json() == before
        # the agent reports p1 running on n1: the reservation is replaced by the agent's own accounting
        running = [{"podUid": u1, "namespace": "ns", "name": "p1", "bytes": 30 * GiB,
                    "predictedRemainingSeconds": 600, "intensity": "memory"}]
        custom.patch_cluster_custom_object(GROUP, VERSION, "gpunodes", "n1", _gpunode("n1", running=running))
        _wait(lambda: cache.reservations() == [], "agent report ending the reservation")
        assert cache.gpu_usage("n1")[0]["used"] == 30 * GiB


def test_bind_is_one_call_carrying_the_annotation_and_a_retry_is_idempotent(api) -> None:
    """One write per bind (the Binding; no separate pod patch); the API server puts the annotation on the pod; a
    retry after a lost answer succeeds and keeps the pod's reservation; binding elsewhere afterwards fails; a slow API
    is cut off at --bind-timeout, well inside the scheduler's httpTimeout."""
    url, kubeconfig, km, hooks = api
    core, custom = _clients(url)
    pod = _two_nodes_and_a_pod(core, custom)
    uid = pod["metadata"]["uid"]
    opts = ExtenderOptions(kubeconfig=str(kubeconfig), bind_timeout=1.0)
    with LoopbackServer(build_app(opts)) as srv, httpx.Client(base_url=srv.url, timeout=10) as c:
        _wait(lambda: c.get("/readyz").status_code == 200, "initial sync")
        cache = srv.app.state.service.cache
        assert c.post("/filter", json={"Pod": pod, "NodeNames": ["n1", "n2"]}).json()["NodeNames"] == ["n1", "n2"]
        bind = {"PodName": "p1", "PodNamespace": "ns", "PodUID": uid, "Node": "n1"}

        # the first attempt is applied, but its answer is lost: the extender reports the failure and lets go
        hooks.writes.clear()
        hooks.lose_binding_answers = 1
        assert c.post("/bind", json=bind).json()["Error"]
        assert hooks.writes == [("pods", "binding", "p1")]  # one call: no annotate-then-bind pair
        stored = json.loads(_raw_pod(core, "p1", "ns"))
        assert stored["spec"]["nodeName"] == "n1"
        first = json.loads(stored["metadata"]["annotations"][ANN_RESERVATION])
        assert first["node"] == "n1" and first["bytes"] == 30 * GiB
        assert [c["type"] for c in stored["status"]["conditions"]] == ["PodScheduled"]

        # kube-scheduler retries the bind: the pod is already on n1, so this is success, and the cache holds the
        # reservation the pod carries (the first attempt's), exactly once
        hooks.writes.clear()
        assert c.post("/bind", json=bind).json() == {"Error": ""}
        assert hooks.writes == [("pods", "binding", "p1")]
        (res,) = cache.reservations()
        assert (res.uid, res.node, res.gpu, res.bytes) == (uid, "n1", first["gpu"], 30 * GiB)
        again = json.loads(_raw_pod(core, "p1", "ns"))
        assert again["metadata"]["annotations"][ANN_RESERVATION] == stored["metadata"]["annotations"][ANN_RESERVATION]

        # a bind of the same pod to another node is a real conflict, and leaves no reservation on that node behind
        reply = c.post("/bind", json={**bind, "Node": "n2"}).json()["Error"]
        assert "409" in reply and "n1" in reply
        assert [(r.uid, r.node) for r in cache.reservations()] == [(uid, "n1")]

        # a recreated pod of the same name (another uid) is never bound by a stale request: the uid precondition
        core.delete_namespaced_pod("p1", "ns")
        _wait(lambda: cache.reservations() == [], "deleted pod's reservation dropped")
        fresh: Any = make_pod("p1", 30, intensity="memory")
        fresh["metadata"].pop("uid", None)
        fresh["spec"]["containers"][0]["image"] = "x"
        core.create_namespaced_pod("ns", fresh)
        stale = c.post("/bind", json=bind).json()["Error"]
        assert stale and "n1" not in json.loads(_raw_pod(core, "p1", "ns")
                                               ).get("spec", {}).get("nodeName", "")
        assert cache.reservations() == []

        # a slow API server: the answer comes at --bind-timeout (1 s), not after the scheduler gave up (5 s)
        fresh_uid = json.loads(_raw_pod(core, "p1", "ns"))["metadata"]["uid"]
        hooks.delay = 3.0
        t0 = time.monotonic()
        slow = c.post("/bind", json={**bind, "PodUID": fresh_uid}).json()["Error"]
        took = time.monotonic() - t0
        hooks.delay = 0.0
        assert slow and took < 2.5, (slow, took)
        assert cache.reservations() == []
