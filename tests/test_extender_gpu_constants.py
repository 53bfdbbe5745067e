"""The extender's exclusive-only rule over real HTTP (uvicorn on loopback, kube-scheduler's JSON): a GPU without
device constants (not catalogued and not measured, or a measured allocator gnnsched cannot model) takes only pods
that run alone; a shared pod is filtered off it with a reason that says so, and bound elsewhere."""

from __future__ import annotations

from datetime import datetime, timezone

import httpx
import numpy as np
from test_extender_cache import NOW, gpu, make_pod, status

from gnnsched.colocation.interference import load_default
from gnnsched.contract import ANN_EXCLUSIVE, GPUMeasurement, GPUStatus
from gnnsched.extender import create_app
from gnnsched.extender.binder import FakeBinder
from gnnsched.extender.cache import R_NO_CONSTANTS, ClusterCache
from gnnsched.extender.pods import parse_pod
from gnnsched.extender.testing import LoopbackServer
from gnnsched.gpu.catalogue import GiB, MiB


def unknown_gpu(index: int = 0, *, measured: GPUMeasurement | None = None) -> GPUStatus:
    """A GPU as an agent publishes one its catalogue does not know: NVML's raw name, ``catalogued: false``."""
    return GPUStatus(index=index, uuid=f"GPU-x9-{index}", model="NVIDIA X9000", total_bytes=96 * GiB,
                     reserve_bytes=GiB, catalogued=False, measured=measured)


def measurement(*, allocator_matches: bool = True) -> GPUMeasurement:
    return GPUMeasurement(source="fake", measured_at=datetime.fromtimestamp(NOW, tz=timezone.utc),
                          context_bytes=700 * MiB, cublas_workspace_bytes=32 * MiB, cublaslt_workspace_bytes=MiB,
                          allocator_matches_model=allocator_matches, compute_capability="9.0")


def _app(*statuses: object) -> tuple[object, ClusterCache]:
    cache = ClusterCache(load_default(), clock=lambda: NOW)
    for st in statuses:
        cache.upsert_gpunode(st, now=NOW)  # type: ignore[arg-type]
    return create_app(cache, FakeBinder()), cache


def test_a_shared_pod_is_filtered_off_an_uncatalogued_unmeasured_gpu_and_binds_on_a_described_one() -> None:
    app, cache = _app(status("x9", unknown_gpu(0)), status("a100", gpu(0)))
    shared = make_pod("shared", 8)
    alone = make_pod("alone", 8, annotations={ANN_EXCLUSIVE: "true"})
    with LoopbackServer(app) as srv, httpx.Client(base_url=srv.url, timeout=10) as c:
        f = c.post("/filter", json={"Pod": shared, "NodeNames": ["x9", "a100"]}).json()
        assert f["Error"] == "" and f["NodeNames"] == ["a100"], f
        reason = f["FailedNodes"]["x9"]
        assert "NVIDIA X9000" in reason and "UnknownGPUModel" in reason and "measured constants" in reason, reason
        scores = {s["Host"]: s["Score"] for s in c.post("/prioritize", json={"Pod": shared,
                                                                              "NodeNames": ["x9", "a100"]}).json()}
        assert scores["x9"] == 0 and scores["a100"] == 10, scores
        # kube-scheduler binds on a node the filter passed; the bind picks a GPU there, never the unknown one
        b = c.post("/bind", json={"PodName": "shared", "PodNamespace": shared["metadata"]["namespace"],
                                  "PodUID": shared["metadata"]["uid"], "Node": "x9"}).json()
        assert b["Error"] and "UnknownGPUModel" in b["Error"], b
        # a pod that runs alone may take it: that is how an unknown GPU's jobs run until it is measured
        f = c.post("/filter", json={"Pod": alone, "NodeNames": ["x9"]}).json()
        assert f["NodeNames"] == ["x9"], f


def test_only_unknown_gpus_leave_a_shared_pod_pending_with_the_reason_not_unresolvable() -> None:
    app, _ = _app(status("x9", unknown_gpu(0), unknown_gpu(1)))
    with LoopbackServer(app) as srv, httpx.Client(base_url=srv.url, timeout=10) as c:
        f = c.post("/filter", json={"Pod": make_pod("shared", 8), "NodeNames": ["x9"]}).json()
    assert f["NodeNames"] == [] and "x9" in f["FailedNodes"] and not f["FailedAndUnresolvableNodes"], f
    assert "takes only pods that run alone" in f["FailedNodes"]["x9"], f


def test_a_measurement_opens_the_gpu_to_shared_pods_and_an_allocator_mismatch_keeps_it_closed() -> None:
    cache = ClusterCache(load_default(), clock=lambda: NOW)
    demand = parse_pod(make_pod("shared", 8))
    cache.upsert_gpunode(status("x9", unknown_gpu(0)), now=NOW)
    rows = cache.index_of(["x9"])
    out = cache.filter(demand, rows)
    assert not out.passed[0] and out.reasons[0][0] == R_NO_CONSTANTS
    cache.upsert_gpunode(status("x9", unknown_gpu(0, measured=measurement())), now=NOW)
    assert cache.filter(demand, rows).passed[0]
    assert np.isfinite(cache.costs(demand, rows)[1][0])
    cache.upsert_gpunode(status("x9", unknown_gpu(0, measured=measurement(allocator_matches=False))), now=NOW)
    out = cache.filter(demand, rows)
    assert not out.passed[0] and "AllocatorModelMismatch" in out.reasons[0][1]
    # a catalogued GPU the agent published as catalogued is shareable unmeasured (the catalogue's constants)
    cache.upsert_gpunode(status("x9", gpu(0, "H200")), now=NOW)
    assert cache.filter(demand, rows).passed[0]
