"""A GPU the catalogue does not know, on the local cluster: its jobs run alone (``UnknownGPUModel``) while its node
has no measurement of it, and share, planned with the node's measured constants, once the agent has published them.

The node's fake GPU reports an NVML name no catalogue entry has (``fake:1x3Gixnvml:NVIDIA Z100``). The agent first
runs without ``--fake-gpu-constants``, so the board stays unmeasured (``measured`` absent in its GPUNode); then it is
restarted with the flag, its stand-in measurement goes through the same path a real probe's does, and the operator
plans the next jobs with those values."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from jobs import small_job  # noqa: E402
from kubeapi import GPUNODES  # noqa: E402
from local_cluster import ClusterOptions, LocalCluster, gnnjob_table  # noqa: E402

from gnnsched.contract import (  # noqa: E402
    ANN_ADMIT_BYTES,
    ANN_ADMITTED_AT,
    ANN_EXCLUSIVE,
    ANN_FINISHED_AT,
    ANN_GPU,
    GPUMeasurement,
)

pytestmark = pytest.mark.slow

BOARD = "NVIDIA Z100"
MiB = 2**20
CONSTANTS = "context=600Mi,cublas=32Mi,cublaslt=1Mi,cc=9.0"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    opts = ClusterOptions(nodes=1, gpus=f"fake:1x3Gixnvml:{BOARD}", reserve="256Mi", timeout=300,
                          keep=tmp_path_factory.mktemp("constants"))
    with LocalCluster(opts) as c:
        c.start()
        yield c
    assert c.pids() == []


def _gpu(cluster: LocalCluster) -> dict[str, Any]:
    assert cluster.api is not None
    [node] = [g for g in cluster.api.items(GPUNODES) if (g.get("status") or {}).get("gpus")]
    [gpu] = node["status"]["gpus"]
    return gpu


def _condition(job: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in (job.get("status") or {}).get("conditions") or [] if c["type"] == type_), None)


def _pod(cluster: LocalCluster, job: str) -> dict[str, Any]:
    [pod] = [p for p in cluster.pods() if p["metadata"]["name"].startswith(f"{job}-")]
    return pod


def _at(pod: dict[str, Any], key: str) -> datetime:
    return datetime.fromisoformat(pod["metadata"]["annotations"][key].replace("Z", "+00:00"))


def test_an_unknown_board_runs_its_jobs_alone_until_measured_then_they_share(cluster: LocalCluster) -> None:
    from gnnsched.estimator import estimate
    from gnnsched.gpu.measured import device_model
    from gnnsched.spec import GNNJobSpec

    gpu = _gpu(cluster)
    assert (gpu["model"], gpu["catalogued"], gpu.get("measured")) == (BOARD, False, None)

    # 1. Unmeasured: the job runs alone on the whole GPU, and its status says why.
    cluster.submit([small_job("alone", epochs=2)])
    [alone] = cluster.wait_jobs({"alone"})
    assert (alone.get("status") or {}).get("phase") == "Succeeded", gnnjob_table([alone])
    why = _condition(alone, "Exclusive")
    assert why is not None and why["reason"] == "UnknownGPUModel", alone["status"].get("conditions")
    assert BOARD in why["message"]
    pod = _pod(cluster, "alone")
    assert pod["metadata"]["annotations"].get(ANN_EXCLUSIVE) == "true"

    # 2. The node measures the board (the fake GPU's stand-in, through the same path as a real probe).
    agent = cluster.nodes[0].agent
    assert agent is not None
    agent.argv = [*agent.argv, "--fake-gpu-constants", CONSTANTS]
    cluster.restart(agent, sig=signal.SIGTERM)
    deadline = time.monotonic() + 60
    while _gpu(cluster).get("measured") is None:
        assert time.monotonic() < deadline, "the agent did not publish the board's measured constants"
        time.sleep(0.5)
    gpu = _gpu(cluster)
    measured = GPUMeasurement.model_validate(gpu["measured"])
    assert (measured.source, measured.context_bytes, measured.cublas_workspace_bytes) == ("fake", 600 * MiB, 32 * MiB)

    # 3. Measured: two jobs share the GPU, each admitted with the bytes the node's constants give.
    docs = [small_job("share-a", epochs=400), small_job("share-b", epochs=400)]
    cluster.submit(docs)
    jobs = cluster.wait_jobs({"share-a", "share-b"})
    assert all((j.get("status") or {}).get("phase") == "Succeeded" for j in jobs), gnnjob_table(jobs)
    model, reason = device_model(BOARD, int(gpu["totalBytes"]), measured)
    assert model is not None and reason is None
    a, b = _pod(cluster, "share-a"), _pod(cluster, "share-b")
    for doc, pod in zip(docs, (a, b), strict=True):
        notes = pod["metadata"]["annotations"]
        assert ANN_EXCLUSIVE not in notes
        expected = estimate(GNNJobSpec.model_validate(doc["spec"]), device="cuda", gpu_model=model).admit_bytes
        assert int(notes[ANN_ADMIT_BYTES]) == expected
    for job in jobs:
        shared = _condition(job, "Exclusive")
        assert shared is None or shared["status"] == "False", job["status"].get("conditions")
    # Side by side on the one GPU: each was admitted before the other finished.
    assert a["metadata"]["annotations"][ANN_GPU] == b["metadata"]["annotations"][ANN_GPU]
    assert _at(a, ANN_ADMITTED_AT) < _at(b, ANN_FINISHED_AT) and _at(b, ANN_ADMITTED_AT) < _at(a, ANN_FINISHED_AT)
    assert cluster.report(jobs)["violations"] == []
