"""MPS's fault domain through the whole system: a fatal fault on a shared GPU terminates every job on it, the node
agent drains the GPU and marks them victims, the operator requeues them, and every job still ends ``Succeeded``.

The fault is injected at the hardware boundary only: the agent runs with ``--fake-gpu-faults DIR`` and the harness
writes an Xid into ``DIR/<GPU UUID>`` (``gnnsched.fake_gpu_faults``). From there everything is the components' own
doing: the agent's fake backend reports the Xid as the driver would, each gated worker on that GPU fails its next
step with CUDA's ``cudaErrorMpsClientTerminated`` text (its attempt result says ``fault``), the kubelet stand-in
writes the termination message, the agent classifies the ends and annotates the pods, the operator reads the
annotation and creates the next attempt, the scheduler stand-in and the extender place it again.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from jobs import small_job  # noqa: E402
from local_cluster import ClusterOptions, LocalCluster, gnnjob_table  # noqa: E402

from gnnsched.closed_loop import FaultRecord  # noqa: E402
from gnnsched.contract import ANN_FAULT, ANN_GPU  # noqa: E402

pytestmark = pytest.mark.slow
XID = 31  # a GPU memory page fault: fatal to every MPS client on the GPU, but the GPU itself stays in service


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # Two 1.5 GiB GPUs with 256 MiB reserved: two small jobs (~490 MiB admit each) share a GPU.
    opts = ClusterOptions(nodes=1, gpus="fake:2x1536Mi", reserve="256Mi", policy="lmcf", timeout=360,
                          fake_gpu_faults=True, keep=tmp_path_factory.mktemp("fault"))
    with LocalCluster(opts) as c:
        c.start()
        yield c
    assert c.pids() == []
    assert c.sockets() == []


def _running_by_gpu(c: LocalCluster, prefix: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for p in c.pods():
        gpu = (p["metadata"].get("annotations") or {}).get(ANN_GPU)
        if p["metadata"]["name"].startswith(prefix) and gpu and (p.get("status") or {}).get("phase") == "Running":
            out.setdefault(gpu, []).append(p["metadata"]["name"])
    return out


def test_a_faults_victims_are_requeued_and_succeed(cluster: LocalCluster) -> None:
    docs = [small_job(f"fault-{i}", epochs=4000) for i in range(4)]
    names = {d["metadata"]["name"] for d in docs}
    hit: dict[str, Any] = {}

    def tick(c: LocalCluster) -> None:
        if hit:
            return
        for gpu, pods in _running_by_gpu(c, "fault-").items():
            if len(pods) >= 2:
                hit.update(gpu=gpu, pods=sorted(pods))
                c.inject_fault("node-1", gpu, XID)
                return

    cluster.submit(docs)
    jobs = cluster.wait_jobs(names, tick=tick)
    assert hit, "no GPU ever ran two of the jobs at once"
    timeline = "\n".join(e["text"] for e in cluster.timeline)
    phases = {j["metadata"]["name"]: (j.get("status") or {}).get("phase") for j in jobs}
    assert phases == dict.fromkeys(names, "Succeeded"), gnnjob_table(jobs)

    pods = {p["metadata"]["name"]: p for p in cluster.pods() if p["metadata"]["name"].startswith("fault-")}
    victims = hit["pods"]
    for name in victims:
        pod = pods[name]
        record = FaultRecord.model_validate_json(pod["metadata"]["annotations"][ANN_FAULT])
        # the driver's Xid is named whichever reached the agent first, the Xid or a victim's error 810
        assert (record.role, record.gpu, record.xid) == ("victim", hit["gpu"], XID), (name, record)
        assert pod["status"]["phase"] == "Failed", (name, pod["status"])
        message = pod["status"]["containerStatuses"][0]["state"]["terminated"].get("message", "")
        assert '"outcome":"fault"' in message and "cudaErrorMpsClientTerminated" in message, message
    victim_jobs = {n.rsplit("-", 1)[0] for n in victims}
    for j in jobs:
        name, st = j["metadata"]["name"], j["status"]
        # a victim's job ran again (attempt 2, a new pod that succeeded); the others ran once
        assert st["attempts"] == (2 if name in victim_jobs else 1), (name, st, hit, timeline)
        if name in victim_jobs:
            assert pods[f"{name}-1"]["status"]["phase"] == "Succeeded"
    # the agent drained the GPU on the fault and gave it back once its clients were gone
    events = [json.loads(line) for line in cluster.nodes[0].event_log.read_text().splitlines()]
    kinds = [(e["event"], e.get("uuid")) for e in events if e["event"] in ("fault", "drained")]
    assert ("fault", hit["gpu"]) in kinds and ("drained", hit["gpu"]) in kinds, kinds
    assert kinds.index(("fault", hit["gpu"])) < kinds.index(("drained", hit["gpu"]))
    roles = sorted(e["key"] for e in events if e["event"] == "fault-role" and e.get("role") == "victim")
    assert len(roles) == len(victims), roles
    assert cluster.report(jobs)["violations"] == []
