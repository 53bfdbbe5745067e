"""A workload reaches only what it was admitted to, through the whole system (issue 39, item 2).

Two GNNJobs share the local cluster's one fake GPU. The agents run with ``--fake-gpu-memory enforce:10`` (each
admitted worker counts 10x its CPU tensor bytes as device bytes and fails on its MPS limit past it) and
``--fake-gpu-usage`` (each worker records its device peak where the fake GPU lists it per process, as NVML does).
``greedy``'s own command removes its MPS limit from its environment (``env -u CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``), so
nothing on the client side stops it from holding about 2.2 GiB against its ~0.8 GiB admission. The node agent sees it
in the driver's per-process view and kills it alone; its job fails with the reason ``GPUMemoryOverrun``. ``honest``
keeps its limit and succeeds beside it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from jobs import small_job  # noqa: E402
from local_cluster import ClusterOptions, LocalCluster, gnnjob_table  # noqa: E402

from gnnsched.contract import ANN_STOPPED  # noqa: E402

pytestmark = pytest.mark.slow


def _greedy() -> dict:
    """Its CPU peak (~226 MiB) times the fake's factor 10 is ~2.2 GiB, well past its admit bytes (~0.8 GiB with the
    CUDA overheads) plus the agent's margin (512 MiB)."""
    job = small_job("greedy", epochs=200, hidden=64)
    job["spec"]["graph"] = {"nodes": 30000, "edges": 150000, "features": 512, "classes": 4}
    job["spec"]["resources"] = {"cpu": "1", "memory": "2Gi"}
    job["spec"]["command"] = ["env", "-u", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "gnnsched", "worker",
                              "/etc/gnnsched/job.yaml", "--device", "cpu", "--no-progress"]
    return job


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    opts = ClusterOptions(nodes=1, gpus="fake:1x16Gi", reserve="1Gi", timeout=300, fake_gpu_memory="enforce:10",
                          fake_gpu_usage=True, keep=tmp_path_factory.mktemp("cl"))
    with LocalCluster(opts) as c:
        c.start()
        yield c
    assert c.pids() == []
    assert c.sockets() == []


def test_a_job_over_its_admitted_memory_is_stopped_alone(cluster: LocalCluster) -> None:
    cluster.submit([_greedy(), small_job("honest", epochs=20)])
    jobs = {j["metadata"]["name"]: j for j in cluster.wait_jobs({"greedy", "honest"})}
    table = gnnjob_table(list(jobs.values()))
    greedy, honest = (jobs[n].get("status") or {} for n in ("greedy", "honest"))
    assert honest.get("phase") == "Succeeded", table + f"\n{honest}"
    assert greedy.get("phase") == "Failed", table + f"\n{greedy}"
    failed = next(c for c in greedy.get("conditions") or [] if c.get("type") == "Failed")
    assert failed["reason"] == "GPUMemoryOverrun", failed
    assert "admitted with" in failed["message"], failed
    pods = {p["metadata"]["name"]: p for p in cluster.pods()}
    greedy_pod = next(p for n, p in pods.items() if n.startswith("greedy-"))
    honest_pod = next(p for n, p in pods.items() if n.startswith("honest-"))
    stopped = json.loads(greedy_pod["metadata"]["annotations"][ANN_STOPPED])
    assert stopped["reason"] == "GPUMemoryOverrun" and stopped["usedBytes"] > stopped["allowedBytes"]
    assert ANN_STOPPED not in (honest_pod["metadata"].get("annotations") or {})
