"""The job contract of issue 38 through the whole system: a checkpointing job keeps its work across a hardware Xid,
and a job whose own fault comes at the same step twice fails at once.

As in ``test_fault_e2e.py``, faults enter only at the hardware boundary (the fake GPU's fault directory, through the
agents' ``--fake-gpu-faults``). Everything else is the components' own doing: the operator creates the job's claim
and mounts it, the kubelet stand-in backs the claim with a directory every node shares, the worker saves there and
resumes from it, the agent classifies the fault, the operator requeues or fails the job by the failure rules.
"""

from __future__ import annotations

import os
import shutil
import subprocess
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
HW_XID = 79


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    opts = ClusterOptions(nodes=1, gpus="fake:2x2Gi", reserve="256Mi", policy="lmcf", timeout=360,
                          fake_gpu_faults=True, keep=tmp_path_factory.mktemp("ckpt"))
    with LocalCluster(opts) as c:
        c.start()
        yield c
    assert c.pids() == []


def _inject_after_checkpoint(name: str, hit: dict[str, Any]) -> Any:
    """A ``wait_jobs`` tick: once the job's first checkpoint is on its claim and its pod runs on a GPU, Xid 79 there."""
    def tick(c: LocalCluster) -> None:
        if hit or not (c.dir / "claims" / "default" / f"{name}-checkpoint" / "checkpoint.pt").exists():
            return
        for p in c.pods():
            gpu = (p["metadata"].get("annotations") or {}).get(ANN_GPU)
            if p["metadata"]["name"] == f"{name}-0" and gpu and (p.get("status") or {}).get("phase") == "Running":
                hit.update(gpu=gpu, pod=p["metadata"]["name"])
                c.inject_fault("node-1", gpu, HW_XID)
                return
    return tick


def test_a_checkpointing_job_resumes_after_a_hardware_xid(cluster: LocalCluster) -> None:
    doc = small_job("ckpt-0", epochs=3000)
    doc["spec"]["checkpoint"] = {"everySeconds": 1}
    hit: dict[str, Any] = {}
    cluster.submit([doc])
    (job,) = cluster.wait_jobs({"ckpt-0"}, tick=_inject_after_checkpoint("ckpt-0", hit))
    st = job["status"]
    assert hit, "the job never saved a checkpoint while running on a GPU"
    assert st["phase"] == "Succeeded", gnnjob_table([job])
    requeued = next(c for c in st["conditions"] if c["type"] == "Requeued")
    # uncharged. The reason is GPUFault when the pod's end reaches the agent within the Xid's drain; on a loaded
    # machine its container status can come after that drain ended, and the agent then records the end as a second
    # fault without an Xid whose victim it is (CoLocatedFault): uncharged all the same
    assert requeued["reason"] in ("GPUFault", "CoLocatedFault") and not st.get("retriesUsed"), st
    assert st["attempts"] == 2 and st["gpu"] != hit["gpu"], st
    # the second attempt resumed from its checkpoint, not from step 0; the first one's record says what it lost
    assert st["resumedFromStep"] > 0, st
    first, second = st["checkpointAttempts"]
    assert first["attempt"] == 1 and first["resumedFromStep"] == 0 and first["checkpointStep"] > 0, st
    assert first["lostSeconds"] >= 0 and second["resumedFromStep"] == st["resumedFromStep"], st
    assert second["resumedFromStep"] >= first["checkpointStep"], st
    pod = next(p for p in cluster.pods() if p["metadata"]["name"] == "ckpt-0-0")
    assert FaultRecord.model_validate_json(pod["metadata"]["annotations"][ANN_FAULT]).role == "victim"
    claim = cluster.api.get("/api/v1/namespaces/default/persistentvolumeclaims/ckpt-0-checkpoint")  # type: ignore
    assert claim["metadata"]["ownerReferences"][0]["name"] == "ckpt-0", claim
    row = next(r for r in cluster.report([job])["jobs"] if r["name"] == "ckpt-0")
    assert row["resumed_from_step"] == st["resumedFromStep"] > 0, row


def _drain_after_checkpoint(name: str, hit: dict[str, Any]) -> Any:
    """A ``wait_jobs`` tick: once the job's first checkpoint is on its claim and its pod runs, an admin drains the
    pod's node with the real ``kubectl drain`` (cordon, then an Eviction per pod: ``POST pods/NAME/eviction``, which
    kubectl sends only where discovery lists ``pods/eviction``), then uncordons it (this cluster has one node)."""
    def tick(c: LocalCluster) -> None:
        if hit or not (c.dir / "claims" / "default" / f"{name}-checkpoint" / "checkpoint.pt").exists():
            return
        for p in c.pods():
            if p["metadata"]["name"] == f"{name}-0" and (p.get("status") or {}).get("phase") == "Running":
                node = p["spec"]["nodeName"]
                env = {**os.environ, "KUBECONFIG": str(c.kubeconfig)}
                drain = subprocess.run(["kubectl", "drain", node, "--ignore-daemonsets", "--delete-emptydir-data",
                                        "--timeout=90s"], capture_output=True, text=True, timeout=120, env=env)
                hit.update(pod=f"{name}-0", drain=drain.stdout + drain.stderr, code=drain.returncode)
                subprocess.run(["kubectl", "uncordon", node], capture_output=True, timeout=60, env=env, check=True)
                return
    return tick


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed (.ci/run does)")
def test_a_drained_job_is_requeued_uncharged_and_resumes(cluster: LocalCluster) -> None:
    """``kubectl drain`` evicts the pod: the API server marks it ``DisruptionTarget`` and deletes it gracefully, the
    worker saves at its SIGTERM, and gnnsched's default failure rule requeues it without using ``backoffLimit``
    (the Job would count it unless its podFailurePolicy ignored the condition); the next attempt resumes."""
    doc = small_job("drained-0", epochs=3000)
    doc["spec"]["checkpoint"] = {"everySeconds": 1}
    doc["spec"]["backoffLimit"] = 0
    hit: dict[str, Any] = {}
    cluster.submit([doc])
    (job,) = cluster.wait_jobs({"drained-0"}, tick=_drain_after_checkpoint("drained-0", hit))
    st = job["status"]
    assert hit, "the job never saved a checkpoint while running"
    assert hit["code"] == 0 and "evicting pod default/drained-0-0" in hit["drain"], hit  # evicted, not deleted
    assert st["phase"] == "Succeeded", gnnjob_table([job])
    requeued = next(c for c in st["conditions"] if c["type"] == "Requeued")
    assert requeued["reason"] == "Disrupted" and "pod condition DisruptionTarget" in requeued["message"], requeued
    assert not st.get("retriesUsed"), st
    assert st["attempts"] == 2 and st["requeues"] == 1 and st["resumedFromStep"] > 0, st


@pytest.fixture(scope="module")
def buggy_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # every job's worker makes its own GPU fail at step 40 (gnnsched.gpu.fake_faults: GNNSCHED_FAKE_FAULT_AT_STEP)
    opts = ClusterOptions(nodes=1, gpus="fake:1x2Gi", reserve="256Mi", policy="lmcf", timeout=360,
                          fake_gpu_faults=True, keep=tmp_path_factory.mktemp("buggy"),
                          extra_env={"GNNSCHED_FAKE_FAULT_AT_STEP": "40:13"})
    with LocalCluster(opts) as c:
        c.start()
        yield c
    assert c.pids() == []


def test_b_a_job_whose_own_fault_comes_at_the_same_step_twice_fails_at_once(buggy_cluster: LocalCluster) -> None:
    doc = small_job("culprit-0", epochs=400)
    doc["spec"]["backoffLimit"] = 5
    buggy_cluster.submit([doc])
    (job,) = buggy_cluster.wait_jobs({"culprit-0"})
    st = job["status"]
    assert st["phase"] == "Failed", gnnjob_table([job])
    failed = next(c for c in st["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "RepeatedFault" and "step 40" in failed["message"], failed
    # its first fault, alone, was its own and was charged (Count); the second, alone at the same step, failed the job
    # while its backoffLimit (5) still had 4 retries left
    assert st["retriesUsed"] == 1 and 5 - st["retriesUsed"] > 2 and st["attempts"] == 2, st
    assert st["faultSteps"] == [40, 40], st
    for name in ("culprit-0-0", "culprit-0-1"):
        pod = next(p for p in buggy_cluster.pods() if p["metadata"]["name"] == name)
        record = FaultRecord.model_validate_json(pod["metadata"]["annotations"][ANN_FAULT])
        # each fault its own: the attempt before, which ended seconds earlier, is no client of the next fault (the
        # agent drops a drained fault's clients from the recently exited ones it adds to a later fault)
        assert (record.role, record.klass()) == ("suspect", "application"), (name, record)
