"""Shared set-up for the operator's tests and benchmark: an emulated cluster (kmock) and an in-process operator.

The operator under test is the real one: ``gnnsched.operator.main.make_operator`` with the same kubeconfig loading
as production (the kubeconfig points at the emulator's loopback URL), kopf's real watch loop and the real handlers.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import kmock
import yaml
from kube_emulator import StrictKubernetes, declare_resources

from gnnsched.closed_loop import AttemptResult
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


def ended(phase: str, message: str, reason: str = "Error", code: int = 1,
          finished_at: str = "2026-01-01T10:00:09Z") -> dict[str, Any]:
    return {"status": {"phase": phase, "containerStatuses": [{"name": "gnn", "state": {"terminated": {
        "exitCode": code, "reason": reason, "startedAt": "2026-01-01T10:00:00Z",
        "finishedAt": finished_at, "message": message}}}]}}


def own_fault_end(steps: int) -> dict[str, Any]:
    """An attempt that failed with its own fatal error at ``steps`` (its result line), as every client of an MPS
    fault does on the H100."""
    line = AttemptResult(outcome="fault", steps=steps, message="CUDA error: an illegal memory access").line()
    return ended("Failed", line + "\nCUDA error: an illegal memory access was encountered")


def ago(seconds: float) -> str:
    """An RFC 3339 time ``seconds`` before now (the operator's wait for the agent counts from the finish time)."""
    return (datetime.now(timezone.utc) - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def oom_line(limit: int, held: int, requested: int) -> str:
    return "Traceback ...\n" + AttemptResult(outcome="memory-exceeded", observed_peak_bytes=held, limit_bytes=limit,
                                             held_bytes=held, requested_bytes=requested).line() + "\n"



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
        url = str(server.url).rstrip("/")
        yield Cluster(k8s, url, write_kubeconfig(tmp_path / "kubeconfig", url))


STOP_SECONDS = 60.0
"""How long the operator may take to stop after its stop flag (it takes about one second: the pod watch's join)."""


@contextlib.asynccontextmanager
async def running_operator(cluster: Cluster, planner: Any = None, **config: Any) -> AsyncIterator[Any]:
    """The real operator on its own event loop in a thread, stopped gracefully and joined on exit.

    Why a loop of its own: kopf assumes it owns its loop, as it does in production (a process of its own). On stop it
    cancels every task created after it started (``kopf._core.reactor.running.run_tasks``), which here would be the
    emulator's connection handlers too, and it waits 5 s for them first; a kopf cancelled in the middle of that stop
    abandons its watcher, whose shielded clean-up (``Scheduler.close``) then waits forever once the test's own loop
    teardown has cancelled the scheduler's helper tasks (the teardown hang seen under CPU load). On its own loop kopf
    stops in about a second, and a stop that does not finish fails the test here, naming it, instead of hanging.
    """
    from gnnsched.operator.handlers import OperatorConfig
    from gnnsched.operator.main import make_operator, run_async

    settings = {"watch_client_timeout": 2.0, "resync_seconds": 2.0, "workers": 4, **config}
    op = make_operator(OperatorConfig(**settings), kubeconfig=str(cluster.kubeconfig))
    if planner is not None:
        op.planner = planner
    stop = threading.Event()
    ready = threading.Event()
    crashed: list[BaseException] = []

    def serve() -> None:
        try:
            asyncio.run(run_async(op, stop_flag=stop, ready_flag=ready))
        except BaseException as exc:  # reported in the test's task below
            crashed.append(exc)

    thread = threading.Thread(target=serve, name="operator-under-test", daemon=True)
    thread.start()
    body_failed = False
    try:
        if not await asyncio.to_thread(ready.wait, 30):
            raise AssertionError(f"the operator was not ready within 30 s: {crashed or 'no error'}")
        yield op
    except BaseException:
        body_failed = True
        raise
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, STOP_SECONDS)
        op.kube.close()
        if not body_failed:  # never mask the test's own failure
            if thread.is_alive():
                raise AssertionError(f"the operator did not stop within {STOP_SECONDS:.0f} s of its stop flag")
            if crashed:
                raise AssertionError(f"the operator ended with {crashed[0]!r}") from crashed[0]


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
