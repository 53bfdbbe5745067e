"""The closed loop through the whole system: a job whose GPU footprint the estimate misses fails its first attempt
on the MPS limit the gate set, and the operator retries it larger until it succeeds, without using ``backoffLimit``.

The fake GPUs enforce limits through the agents' ``--fake-gpu-memory enforce:FACTOR`` (the admitted worker counts
FACTOR x its live tensor bytes as device bytes and raises PyTorch's CUDA out-of-memory error past the limit). The
factor is chosen from the job's own byte-exact CPU peak so that its device bytes are 1.2x what the operator admits
it with: the first attempt must fail, a 1.5x resize must succeed.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from jobs import small_job  # noqa: E402
from local_cluster import ClusterOptions, LocalCluster, gnnjob_table  # noqa: E402

from gnnsched.contract import ANN_ADMIT_BYTES  # noqa: E402

pytestmark = pytest.mark.slow


def _factor(doc: dict) -> float:
    """FACTOR such that the worker's fake device bytes are 1.2x the admit bytes the operator will compute."""
    from gnnsched.estimator import estimate
    from gnnsched.gpu.catalogue import get_gpu_model
    from gnnsched.spec import GNNJobSpec

    spec = GNNJobSpec.model_validate(doc["spec"])
    cpu_peak = estimate(spec).pmc_bytes  # byte-exact on the CPU: what the worker's live tensors reach
    admit = estimate(spec, device="cuda", gpu_model=get_gpu_model("A100-40GB")).admit_bytes  # the operator's default
    return 1.2 * admit / cpu_peak


@pytest.fixture(scope="module")
def doc() -> dict:
    """A job whose CPU peak (~84 MiB) is large enough beside the fixed CUDA overheads in its admit bytes (~590 MiB)
    for a footprint factor within the fake's 1..10 to put it at 1.2x its admit bytes (factor ~8.4)."""
    job = small_job("misestimated", epochs=2, hidden=64)
    job["spec"]["graph"] = {"nodes": 15000, "edges": 75000, "features": 256, "classes": 4}
    return job


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, doc: dict) -> Iterator[LocalCluster]:
    opts = ClusterOptions(nodes=1, gpus="fake:1x2Gi", reserve="256Mi", timeout=300,
                          fake_gpu_memory=f"enforce:{_factor(doc):.3f}", keep=tmp_path_factory.mktemp("cl"))
    with LocalCluster(opts) as c:
        c.start()
        yield c
    assert c.pids() == []
    assert c.sockets() == []


def test_misestimated_job_is_resized_to_success(cluster: LocalCluster, doc: dict) -> None:
    cluster.submit([doc])
    jobs = cluster.wait_jobs({"misestimated"})
    st = jobs[0].get("status") or {}
    assert st.get("phase") == "Succeeded", gnnjob_table(jobs) + f"\n{st}"
    assert st.get("attempts") == 2, st
    pods = sorted((p for p in cluster.pods() if p["metadata"]["name"].startswith("misestimated-")),
                  key=lambda p: p["metadata"]["name"])
    assert [p["status"]["phase"] for p in pods] == ["Failed", "Succeeded"], [p["metadata"]["name"] for p in pods]
    first, second = (int(p["metadata"]["annotations"][ANN_ADMIT_BYTES]) for p in pods)
    assert second > first
    message = pods[0]["status"]["containerStatuses"][0]["state"]["terminated"].get("message", "")
    assert "memory-exceeded" in message, message
    assert cluster.report(jobs)["violations"] == []
