"""MPS's fault domain through the whole system: a fatal fault on a shared GPU terminates every job on it, the node
agent drains the GPU and marks them victims, the operator requeues them, and every job still ends ``Succeeded``.

The fault is injected at the hardware boundary only: the agent runs with ``--fake-gpu-faults DIR`` and the harness
writes an Xid into ``DIR/<GPU UUID>`` (``gnnsched.gpu.fake_faults``). From there everything is the components' own
doing: the agent's fake backend reports the Xid as the driver would, each gated worker on that GPU fails its next
step with CUDA's ``cudaErrorMpsClientTerminated`` text (its attempt result says ``fault``), the kubelet stand-in
writes the termination message, the agent classifies the ends and annotates the pods, the operator reads the
annotation and creates the next attempt, the scheduler stand-in and the extender place it again.
"""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from jobs import small_job  # noqa: E402
from kubeapi import GPUNODES  # noqa: E402
from local_cluster import ClusterOptions, LocalCluster, gnnjob_table  # noqa: E402

from gnnsched.attempts.fault_classes import parse_fault_peers  # noqa: E402
from gnnsched.closed_loop import FaultRecord  # noqa: E402
from gnnsched.contract import ANN_FAULT, ANN_FAULT_PEERS, ANN_GPU, GPU_SHARE_RESOURCE  # noqa: E402

pytestmark = pytest.mark.slow
XID = 31  # a GPU memory page fault: fatal to every MPS client on the GPU, but the GPU itself stays in service
HW_XID = 79  # the GPU fell off the bus: a hardware fault, the GPU leaves service and no job is charged


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # Two 2 GiB GPUs with 256 MiB reserved: up to three small jobs (~490 MiB admit each) share a GPU.
    opts = ClusterOptions(nodes=1, gpus="fake:2x2Gi", reserve="256Mi", policy="lmcf", timeout=360,
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


def _inject_once(prefix: str, clients: int, xid: int, hit: dict[str, Any]) -> Any:
    """A ``wait_jobs`` tick: the first time a GPU runs ``clients`` of the jobs named ``prefix*``, Xid ``xid`` on it
    (``hit`` gets the GPU and those pods)."""
    def tick(c: LocalCluster) -> None:
        if hit:
            return
        for gpu, pods in _running_by_gpu(c, prefix).items():
            if len(pods) >= clients:
                hit.update(gpu=gpu, pods=sorted(pods))
                c.inject_fault("node-1", gpu, xid)
                return
    return tick


# Long enough that every job of a test is still running when the fault is injected, which happens within a poll
# (0.2 s) of the co-location it waits for: jobs submitted together are admitted within about a second, and each worker
# takes seconds to start. 4000 epochs (75 s co-located under load 7) made the file take 330 s; every check below
# depends on who was co-located, not on how long the jobs run.
EPOCHS = 600


def test_a_faults_victims_are_requeued_and_succeed(cluster: LocalCluster) -> None:
    docs = [small_job(f"fault-{i}", epochs=EPOCHS) for i in range(3)]  # arrivals alternate GPUs: one gets two
    names = {d["metadata"]["name"] for d in docs}
    hit: dict[str, Any] = {}
    cluster.submit(docs)
    jobs = cluster.wait_jobs(names, tick=_inject_once("fault-", 2, XID, hit))
    assert hit, "no GPU ever ran two of the jobs at once"
    timeline = "\n".join(e["text"] for e in cluster.timeline)
    phases = {j["metadata"]["name"]: (j.get("status") or {}).get("phase") for j in jobs}
    assert phases == dict.fromkeys(names, "Succeeded"), gnnjob_table(jobs)

    pods = {p["metadata"]["name"]: p for p in cluster.pods() if p["metadata"]["name"].startswith("fault-")}
    victims = hit["pods"]
    for name in victims:
        pod = pods[name]
        record = FaultRecord.model_validate_json(pod["metadata"]["annotations"][ANN_FAULT])
        # An application Xid gives every client its own error 700 (as on the H100): several cannot be told apart,
        # so none is the suspect and all are requeued uncharged (undecided).
        assert (record.role, record.gpu, record.xid) == ("victim", hit["gpu"], XID), (name, record)
        assert record.klass() == "application" and not record.charge().charged, record
        assert pod["status"]["phase"] == "Failed", (name, pod["status"])
        message = pod["status"]["containerStatuses"][0]["state"]["terminated"].get("message", "")
        assert '"outcome":"fault"' in message and "illegal memory access" in message, message
    victim_jobs = {n.rsplit("-", 1)[0] for n in victims}
    for j in jobs:
        name, st = j["metadata"]["name"], j["status"]
        # a victim's job ran again (attempt 2, a new pod that succeeded); the others ran once
        assert st["attempts"] == (2 if name in victim_jobs else 1), (name, st, hit, timeline)
        if name in victim_jobs:
            assert pods[f"{name}-1"]["status"]["phase"] == "Succeeded"
    _assert_kept_apart(pods, victim_jobs, jobs)
    # the agent drained the GPU on the fault and gave it back once its clients were gone
    events = [json.loads(line) for line in cluster.nodes[0].event_log.read_text().splitlines()]
    kinds = [(e["event"], e.get("uuid")) for e in events if e["event"] in ("fault", "drained")]
    assert ("fault", hit["gpu"]) in kinds and ("drained", hit["gpu"]) in kinds, kinds
    assert kinds.index(("fault", hit["gpu"])) < kinds.index(("drained", hit["gpu"]))
    roles = sorted(e["key"] for e in events if e["event"] == "fault-role" and e.get("role") == "victim")
    assert len(roles) == len(victims), roles
    assert cluster.report(jobs)["violations"] == []


def _assert_kept_apart(pods: dict[str, Any], victim_jobs: set[str], jobs: list[dict[str, Any]]) -> None:
    """The undecided victims are each other's fault peers (docs/faults.md, "Undecided clients are kept apart"): the
    operator put the other victims' jobs in each next attempt's ``gnnsched.io/fault-peers``, and the gate never ran
    two of those attempts on one GPU at once (on one GPU, one started only after the other finished)."""
    ns = {j["metadata"]["name"]: j["metadata"].get("namespace", "default") for j in jobs}
    attempts = {name: pods[f"{name}-1"] for name in victim_jobs}
    for name, pod in attempts.items():
        peers = parse_fault_peers(pod["metadata"]["annotations"].get(ANN_FAULT_PEERS))
        assert peers == {f"{ns[o]}/{o}" for o in victim_jobs if o != name}, (name, pod["metadata"]["annotations"])

    def span(pod: dict[str, Any]) -> tuple[str, str]:
        done = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        return done["startedAt"], done["finishedAt"]  # RFC 3339 in UTC, seconds: ordered as strings

    for a, b in itertools.combinations(sorted(attempts), 2):
        pa, pb = attempts[a], attempts[b]
        if pa["metadata"]["annotations"][ANN_GPU] != pb["metadata"]["annotations"][ANN_GPU]:
            continue
        (sa, fa), (sb, fb) = span(pa), span(pb)
        assert fa <= sb or fb <= sa, (a, span(pa), b, span(pb))


def _gpu_status(c: LocalCluster, uuid: str) -> dict[str, Any]:
    return next(g for g in c.api.items(GPUNODES)[0]["status"]["gpus"] if g["uuid"] == uuid)  # type: ignore[union-attr]


def test_b_a_hardware_xid_requeues_its_group_uncharged_and_takes_the_gpu_out(cluster: LocalCluster) -> None:
    """Xid 79 under a group of three: all three requeued with reason GPUFault, backoffLimit untouched, the GPU
    unhealthy for the agent, kubelet (the device plugin's slots) and the extender, all three Succeeded on the other
    GPU."""
    docs = [small_job(f"hw-{i}", epochs=EPOCHS) for i in range(5)]  # arrivals alternate GPUs: one gets three
    names = {d["metadata"]["name"] for d in docs}
    hit: dict[str, Any] = {}
    cluster.submit(docs)
    jobs = cluster.wait_jobs(names, tick=_inject_once("hw-", 3, HW_XID, hit))
    assert hit, "no GPU ever ran three of the jobs at once"
    assert {(j.get("status") or {}).get("phase") for j in jobs} == {"Succeeded"}, gnnjob_table(jobs)
    pods = {p["metadata"]["name"]: p for p in cluster.pods() if p["metadata"]["name"].startswith("hw-")}
    victim_jobs = {n.rsplit("-", 1)[0] for n in hit["pods"]}
    for name in hit["pods"]:
        record = FaultRecord.model_validate_json(pods[name]["metadata"]["annotations"][ANN_FAULT])
        assert (record.role, record.reason, record.xid, record.klass()) == ("victim", "GPUFault", HW_XID, "hardware")
    for j in jobs:
        st = j["status"]
        if j["metadata"]["name"] not in victim_jobs:
            continue
        requeued = next(c for c in st["conditions"] if c["type"] == "Requeued")
        assert requeued["reason"] == "GPUFault" and not st.get("retriesUsed"), st  # backoffLimit untouched
        assert st["attempts"] == 2 and st["gpu"] != hit["gpu"], st
    # The GPU stays out: the agent's status, kubelet's healthy slots (the device plugin's ListAndWatch) and the
    # extender's filter all leave it out; the other GPU still takes pods.
    status = _gpu_status(cluster, hit["gpu"])
    assert status["healthy"] is False, status
    kubelet = cluster.nodes[0].kubelet
    slots = kubelet.device_health(GPU_SHARE_RESOURCE)
    assert {h for sid, h in slots.items() if sid.startswith(hit["gpu"])} == {"Unhealthy"}, slots
    assert {h for sid, h in slots.items() if not sid.startswith(hit["gpu"])} == {"Healthy"}, slots
    assert cluster.report(jobs)["violations"] == []


def test_c_an_application_xid_on_a_lone_client_is_charged(cluster: LocalCluster) -> None:
    """Xid 13 on a GPU where one job runs alone: its own error, so it is the suspect, charged to backoffLimit
    (0 here): the job fails with the reason. The hardware fault above left one GPU; this one stays healthy."""
    doc = small_job("app-0", epochs=EPOCHS)
    hit: dict[str, Any] = {}
    cluster.submit([doc])
    (job,) = cluster.wait_jobs({"app-0"}, tick=_inject_once("app-", 1, 13, hit))
    st = job["status"]
    assert hit and st["phase"] == "Failed", gnnjob_table([job])
    pod = next(p for p in cluster.pods() if p["metadata"]["name"] == "app-0-0")
    record = FaultRecord.model_validate_json(pod["metadata"]["annotations"][ANN_FAULT])
    # the roles wait for the Xid (node_agent.quarantine.XID_GRACE_S), whichever reached the agent first
    assert (record.role, record.reason, record.xid, record.klass()) == ("suspect", "ClientFault", 13, "application")
    failed = next(c for c in st["conditions"] if c["type"] == "Failed")
    assert "illegal memory access" in failed["message"] and st.get("suspected") == 1, st
    assert _gpu_status(cluster, hit["gpu"])["healthy"] is True
