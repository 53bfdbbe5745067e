"""Device constants in the operator's plans, end to end against the emulated API server (kmock) and the real
operator: a GPUNode's measured constants change the admit bytes of a GNNJob's pod; a GPU that is neither catalogued
nor measured makes the job run alone with ``UnknownGPUModel``; once its node publishes a measurement, a new job
shares it and the waiting pod of the earlier one is re-planned to share."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from operator_harness import GPUNODES, Cluster, GiB, emulated_cluster, manifest, running_operator, wait_for

from gnnsched.contract import ANN_ADMIT_BYTES, ANN_EXCLUSIVE, GPUMeasurement
from gnnsched.gpu.catalogue import MiB

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(180)]
pytest.importorskip("gnnsched.estimator")

MEASURED = GPUMeasurement(source="fake", measured_at=datetime(2026, 12, 1, tzinfo=timezone.utc),
                          context_bytes=1500 * MiB, cublas_workspace_bytes=32 * MiB, cublaslt_workspace_bytes=MiB,
                          compute_capability="9.0", torch_version="2.13.0")


def h200(measured: GPUMeasurement | None = None) -> dict[str, Any]:
    gpu = {"index": 0, "uuid": "GPU-h200-0", "model": "H200", "totalBytes": 141 * GiB, "reserveBytes": GiB,
           "healthy": True, "mpsHealthy": True, "maxClients": 48, "running": [], "queued": []}
    return {**gpu, "measured": measured.wire()} if measured is not None else gpu


def x9000(measured: GPUMeasurement | None = None) -> dict[str, Any]:
    """A GPU the agent's catalogue does not know: NVML's name, ``catalogued: false``."""
    gpu = {**h200(measured), "uuid": "GPU-x9-0", "model": "NVIDIA X9000", "totalBytes": 96 * GiB,
           "catalogued": False}
    return gpu


async def set_gpus(cluster: Cluster, node: str, gpus: list[dict[str, Any]]) -> None:
    """The node agent rewrites its GPUNode status (a merge patch replaces the list whole)."""
    code, data = await cluster.request("PATCH", f"{GPUNODES}/{node}", json={"status": {"gpus": gpus}},
                                       headers={"Content-Type": "application/merge-patch+json"})
    assert code == 200, data


async def pod_of(cluster: Cluster, name: str) -> dict[str, Any]:
    async def find() -> Any:
        return next((p for p in await cluster.pods() if p["metadata"]["name"] == f"{name}-0"), None)
    return await wait_for(find, 60, what=f"the pod of {name}")


async def job_of(cluster: Cluster, name: str) -> dict[str, Any]:
    async def planned() -> Any:
        job = await cluster.get_job(name)
        return job if job and (job.get("status") or {}).get("plan") else None
    return await wait_for(planned, 60, what=f"{name} planned")


def condition(job: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in job["status"].get("conditions") or [] if c["type"] == type_), None)


async def test_a_measured_gpunode_changes_the_admit_bytes_of_the_pods_for_its_gpu(tmp_path: Path) -> None:
    from gnnsched.estimator import estimate
    from gnnsched.gpu.measured import device_model
    from gnnsched.spec import parse_spec

    async with emulated_cluster(tmp_path) as cluster:
        await cluster.add_gpunode("node-h", [h200()])
        async with running_operator(cluster):
            await cluster.create_job(manifest("before"))
            before = await pod_of(cluster, "before")
            await set_gpus(cluster, "node-h", [h200(MEASURED)])
            created = await cluster.create_job(manifest("after"))
            after = await pod_of(cluster, "after")
            job = await job_of(cluster, "after")
    spec = parse_spec(created["spec"])
    model, _ = device_model("H200", 141 * GiB, MEASURED, "node-h")
    catalogue = estimate(spec, device="cuda", gpu_model="H200")
    on_node = estimate(spec, device="cuda", gpu_model=model)
    assert int(before["metadata"]["annotations"][ANN_ADMIT_BYTES]) == catalogue.admit_bytes
    assert int(after["metadata"]["annotations"][ANN_ADMIT_BYTES]) == on_node.admit_bytes > catalogue.admit_bytes
    assert ANN_EXCLUSIVE not in after["metadata"]["annotations"]
    assert job["status"]["plan"]["admit_constants"] is not None


async def test_an_unknown_gpu_runs_the_job_alone_until_its_node_measures_it(tmp_path: Path) -> None:
    async with emulated_cluster(tmp_path) as cluster:
        await cluster.add_gpunode("node-x", [x9000()])
        async with running_operator(cluster):
            await cluster.create_job(manifest("first"))
            first_pod = await pod_of(cluster, "first")
            first = await job_of(cluster, "first")
            await set_gpus(cluster, "node-x", [x9000(MEASURED)])
            await cluster.create_job(manifest("second"))
            second_pod = await pod_of(cluster, "second")

            # the first job's pod still waits for a node: the resync re-plans it to share
            async def shared_now() -> Any:
                pod = next(p for p in await cluster.pods() if p["metadata"]["name"] == "first-0")
                job = await cluster.get_job("first")
                ok = ANN_EXCLUSIVE not in pod["metadata"]["annotations"] and job and not job["status"]["exclusive"]
                return (pod, job) if ok else None
            replanned_pod, replanned = await wait_for(shared_now, 60, what="the waiting pod re-planned to share")

    annotations = first_pod["metadata"]["annotations"]
    assert annotations[ANN_EXCLUSIVE] == "true" and int(annotations[ANN_ADMIT_BYTES]) == 95 * GiB
    exclusive = condition(first, "Exclusive")
    assert exclusive is not None and exclusive["reason"] == "UnknownGPUModel", first["status"]["conditions"]
    assert "'NVIDIA X9000' on node node-x" in exclusive["message"]
    assert "share once the node publishes measured constants" in exclusive["message"]
    assert first["status"]["exclusive"] is True

    assert ANN_EXCLUSIVE not in second_pod["metadata"]["annotations"]
    assert int(second_pod["metadata"]["annotations"][ANN_ADMIT_BYTES]) < 10 * GiB

    assert int(replanned_pod["metadata"]["annotations"][ANN_ADMIT_BYTES]) == \
        int(second_pod["metadata"]["annotations"][ANN_ADMIT_BYTES])
    after = condition(replanned, "Exclusive")
    assert after is not None and (after["status"], after["reason"]) == ("False", "DeviceConstantsKnown")
