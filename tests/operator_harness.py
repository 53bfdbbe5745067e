"""Shared set-up for the operator's tests and benchmark: an emulated cluster (kmock) and an in-process operator.

The operator under test is the real one: ``gnnsched.operator.main.make_operator`` with the same kubeconfig loading
as production (the kubeconfig points at the emulator's loopback URL), kopf's real watch loop and the real handlers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import kmock
import yaml
from kube_emulator import StrictKubernetes, declare_resources

from gnnsched.contract import GROUP, VERSION

JOBS = f"/apis/{GROUP}/{VERSION}/namespaces/{{ns}}/gnnjobs"
GPUNODES = f"/apis/{GROUP}/{VERSION}/gpunodes"
PODS = "/api/v1/namespaces/{ns}/pods"
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "gcn-train-cora.yaml"
GiB = 2**30


def manifest(name: str = "gcn-cora", **spec_changes: Any) -> dict[str, Any]:
    """The example GNNJob under another name, with top-level spec fields replaced."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["name"] = name
    doc["spec"].update(spec_changes)
    return doc


def a100(index: int = 0) -> dict[str, Any]:
    """A healthy, idle A100-40GB as a GPUNode status lists it."""
    return {"index": index, "uuid": f"GPU-a100-{index}", "model": "A100-40GB", "totalBytes": 40 * GiB,
            "reserveBytes": GiB, "committedBytes": 0, "usedBytes": 0, "healthy": True, "mpsHealthy": True,
            "maxClients": 48, "running": [], "queued": []}


def write_kubeconfig(path: Path, url: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": url}}],
        "users": [{"name": "tester", "user": {"token": "test-token"}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "tester",
                                                      "namespace": "default"}}],
        "current-context": "emulator",
    }))
    return path


class Cluster:
    """The emulator plus small async helpers that talk to it over HTTP (as any client would)."""

    def __init__(self, k8s: StrictKubernetes, url: str, kubeconfig: Path) -> None:
        self.k8s = k8s
        self.url = url
        self.kubeconfig = kubeconfig

    async def request(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        async with self.k8s.request(method, path, **kwargs) as resp:
            try:
                data = await resp.json(content_type=None)
            except ValueError:
                data = None
            return resp.status, data

    async def create_job(self, manifest: dict[str, Any], ns: str = "default") -> dict[str, Any]:
        status, data = await self.request("POST", JOBS.format(ns=ns), json=manifest)
        assert status in (200, 201), data
        return data

    async def get_job(self, name: str, ns: str = "default") -> dict[str, Any] | None:
        status, data = await self.request("GET", f"{JOBS.format(ns=ns)}/{name}")
        return data if status == 200 else None

    async def delete_job(self, name: str, ns: str = "default") -> int:
        status, _ = await self.request("DELETE", f"{JOBS.format(ns=ns)}/{name}")
        return status

    async def pods(self, ns: str = "default") -> list[dict[str, Any]]:
        status, data = await self.request("GET", PODS.format(ns=ns))
        return list(data.get("items") or []) if status == 200 else []

    async def patch_pod(self, name: str, patch: dict[str, Any], ns: str = "default", status_sub: bool = False) -> None:
        path = f"{PODS.format(ns=ns)}/{name}" + ("/status" if status_sub else "")
        code, data = await self.request("PATCH", path, json=patch,
                                        headers={"Content-Type": "application/merge-patch+json"})
        assert code == 200, data

    async def add_gpunode(self, node: str, gpus: list[dict[str, Any]]) -> None:
        status, data = await self.request("POST", GPUNODES, json={
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUNode",
            "metadata": {"name": node}, "spec": {"nodeName": node},
            "status": {"nodeName": node, "gpus": gpus, "mps": {"healthy": True}},
        })
        assert status in (200, 201), data

    async def events(self, ns: str = "default") -> list[dict[str, Any]]:
        status, data = await self.request("GET", f"/api/v1/namespaces/{ns}/events")
        return list(data.get("items") or []) if status == 200 else []


@contextlib.asynccontextmanager
async def emulated_cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with StrictKubernetes() as k8s, kmock.Server(k8s) as server:
        declare_resources(k8s)
        k8s.objects["v1/namespaces", None, "default"] = {
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default", "uid": "ns-default"}}
        url = str(server.url).rstrip("/")
        yield Cluster(k8s, url, write_kubeconfig(tmp_path / "kubeconfig", url))


@contextlib.asynccontextmanager
async def running_operator(cluster: Cluster, planner: Any = None, **config: Any) -> AsyncIterator[Any]:
    """The real operator in this event loop (kopf's threads run the sync handlers), stopped on exit."""
    from gnnsched.operator.handlers import OperatorConfig
    from gnnsched.operator.main import make_operator, run_async

    settings = {"watch_client_timeout": 2.0, "resync_seconds": 2.0, "workers": 4, **config}
    op = make_operator(OperatorConfig(**settings), kubeconfig=str(cluster.kubeconfig))
    if planner is not None:
        op.planner = planner
    stop = asyncio.Event()
    ready = asyncio.Event()
    task = asyncio.create_task(run_async(op, stop_flag=stop, ready_flag=ready))
    try:
        await asyncio.wait_for(ready.wait(), 30)
        yield op
    finally:
        stop.set()
        # kopf's graceful stop waits for open watch streams to end (seconds); the tests are done with it by now.
        done, _ = await asyncio.wait({task}, timeout=1.0)
        if not done:
            task.cancel()
            await asyncio.wait({task}, timeout=10.0)
        op.kube.close()


async def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.1,
                   what: str = "condition") -> Any:
    """Poll an async predicate until it returns something truthy; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = await predicate()
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last value: {last!r}")
