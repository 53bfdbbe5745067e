"""The gate server over a real unix socket (in-process asyncio clients): identity, trust, bad input, vanishing clients.

Every test ends by checking the books: whatever a client did, the committed bytes equal the sum over live admitted
connections and the invariant holds.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest
import pytest_asyncio
from gate_helpers import GiB, add_pods, gnnsched_command, job_pod, name_in_status, pod_object

from gnnsched.contract import (
    ANN_ADMITTED_AT,
    ANN_EXCLUSIVE,
    ANN_FAULT_PEERS,
    ANN_FINISHED_AT,
    ANN_GPU,
    ANN_GROUP,
    ANN_PROBATION_STEP,
    ANN_QOS_TARGET,
    ANN_STARTED_AT,
    ENV_POD_NAME,
    ENV_POD_NAMESPACE,
    ENV_POD_UID,
    MPSStatus,
)
from gnnsched.node_agent.books import Books, GPUSlot
from gnnsched.node_agent.gate import GateConfig, GateServer, parse_rfc3339
from gnnsched.node_agent.identity import FilePodLookup, PeerVerifier, pod_uids_in_cgroup
from gnnsched.node_agent.metrics import AgentMetrics
from gnnsched.node_agent.protocol import MAX_LINE
from gnnsched.node_agent.status import build_status
from gnnsched.progress import StepProgress

pytestmark = [pytest.mark.timeout(30)]


def _gpus() -> list[GPUSlot]:
    return [GPUSlot(i, f"GPU-fake-{i}", "Fake-GPU", 80 * GiB, 2 * GiB, 4) for i in range(2)]


class Harness:
    def __init__(self, tmp: Path, verifier: PeerVerifier | None = None, policy: str = "base",
                 spread: bool = False) -> None:
        self.tmp = tmp
        self.pods_file = tmp / "pods.json"
        self.sock = tmp / "gate.sock"
        self.metrics = AgentMetrics()
        self.books = Books(_gpus(), policy, spread=spread)
        self.server = GateServer(
            self.books, GateConfig(node_name="node-a", pipe_directory="/run/mps", recovery_grace=0,
                                   reconcile_seconds=0),
            pods=FilePodLookup(self.pods_file), verifier=verifier or PeerVerifier(enabled=False),
            metrics=self.metrics, event_log=tmp / "events.jsonl",
        )

    def add(self, pod: dict, job: dict | None = None) -> dict:
        add_pods(self.pods_file, [pod], [job] if job else [])
        return pod

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_unix_connection(str(self.sock))

    async def request(self, pod: dict, op: str = "admit", **extra) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        r, w = await self.connect()
        m = pod["metadata"]
        msg = {"op": op, "podUid": m["uid"], "podName": m["name"], "podNamespace": m["namespace"], **extra}
        w.write(json.dumps(msg).encode() + b"\n")
        await w.drain()
        return r, w

    async def reply(self, r: asyncio.StreamReader, want: str | None = None) -> dict:
        while True:
            line = await asyncio.wait_for(r.readline(), 5)
            assert line, "connection closed without a reply"
            msg = json.loads(line)
            if want is None or msg["status"] == want or msg["status"] == "rejected":
                return msg

    def rejections(self, reason: str) -> float:
        return self.metrics.registry.get_sample_value("gnnsched_gate_rejections_total", {"reason": reason}) or 0.0

    async def settle(self, cond, timeout: float = 5.0) -> None:
        for _ in range(int(timeout / 0.01)):
            if cond():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("condition not reached")


@pytest_asyncio.fixture
async def gate(tmp_path):
    h = Harness(tmp_path)
    await h.server.start(h.sock)
    yield h
    await h.server.close()
    h.books.check()


@pytest.mark.asyncio
async def test_admit_reply_and_release(gate: Harness) -> None:
    pod, job = job_pod("a", 10 * GiB, runtime=30)
    gate.add(pod, job)
    r, w = await gate.request(pod)
    msg = await gate.reply(r, "admitted")
    assert msg["gpuUuid"] == "GPU-fake-0" and msg["bytes"] == 10 * GiB
    assert msg["memLimit"] == "0=10240M" and msg["activeThreadPercentage"] == 100
    assert msg["pipeDirectory"] == "/run/mps" and msg["group"] == "g1"
    assert gate.books.committed_bytes(0) == 10 * GiB
    await gate.settle(lambda: json.loads(gate.pods_file.read_text())["pods"][0]["metadata"]["annotations"].get(ANN_GPU))
    ann = json.loads(gate.pods_file.read_text())["pods"][0]["metadata"]["annotations"]
    assert ann[ANN_GPU] == "GPU-fake-0" and ann[ANN_GROUP] == "g1" and ANN_ADMITTED_AT in ann
    w.close()  # the process exited
    await gate.settle(lambda: not gate.books.running)
    await gate.settle(
        lambda: ANN_FINISHED_AT in json.loads(gate.pods_file.read_text())["pods"][0]["metadata"]["annotations"]
    )


@pytest.mark.asyncio
async def test_latency_target_reaches_the_books(gate: Harness) -> None:
    """An inference pod's ``qos-target-seconds`` (written by the operator) is booked with its request, where the
    share rule reads it (``Entry.task().qos_seconds``); a pod without one books none."""
    with_target, job = job_pod("q", 10 * GiB, runtime=3)
    with_target["metadata"]["annotations"][ANN_QOS_TARGET] = "2.5"
    name_in_status(job, with_target)  # the operator writes the target into the job's status with the pod
    plain, plain_job = job_pod("p", 10 * GiB, runtime=3)
    conns = []
    for pod, j in ((with_target, job), (plain, plain_job)):
        gate.add(pod, j)
        conns.append(await gate.request(pod))
        await gate.reply(conns[-1][0], "admitted")
    booked = {e.name: e.task().qos_seconds for e in gate.books.running.values()}
    assert booked == {"q": 2.5, "p": None}
    for _, w in conns:
        w.close()
    await gate.settle(lambda: not gate.books.running)


@pytest.mark.asyncio
async def test_queue_then_admit_on_exit(gate: Harness) -> None:
    pods = [gate.add(*job_pod(f"p{i}", 70 * GiB)) for i in range(3)]
    conns, first = [], []
    for p in pods:  # one at a time: arrival order is then the request order
        conns.append(await gate.request(p))
        first.append(await gate.reply(conns[-1][0]))
    assert [m["status"] for m in first] == ["admitted", "admitted", "queued"]
    assert {first[0]["gpuUuid"], first[1]["gpuUuid"]} == {"GPU-fake-0", "GPU-fake-1"}
    conns[0][1].close()
    msg = await gate.reply(conns[2][0], "admitted")
    assert msg["gpuUuid"] == first[0]["gpuUuid"]
    assert gate.metrics.registry.get_sample_value("gnnsched_gate_admissions_total") == 3


@pytest.mark.asyncio
async def test_unknown_and_lying_pods_change_nothing(gate: Harness) -> None:
    real, job = job_pod("real", 5 * GiB)
    gate.add(real, job)
    ghost = pod_object("ghost", admit_bytes=1)
    r, _ = await gate.request(ghost)
    assert (await gate.reply(r))["reason"] == "unknown-pod"
    liar = json.loads(json.dumps(real))
    liar["metadata"]["uid"] = "11111111-2222-3333-4444-555555555555"
    r, _ = await gate.request(liar)
    assert (await gate.reply(r))["reason"] == "pod-uid-mismatch"
    other_node = gate.add(*job_pod("elsewhere", GiB, node="node-b"))
    r, _ = await gate.request(other_node)
    assert (await gate.reply(r))["reason"] == "wrong-node"
    done = gate.add(*job_pod("done", GiB, phase="Succeeded"))
    r, _ = await gate.request(done)
    assert (await gate.reply(r))["reason"] == "pod-finished"
    assert not gate.books.running and not gate.books.queued


@pytest.mark.asyncio
async def test_admit_bytes_only_trusted_from_gnnjob_owner(gate: Harness) -> None:
    # A pod that writes its own admit-bytes (no GNNJob owner) gets no credit: booked at its gpu-memory declaration.
    forged = gate.add(pod_object("forged", admit_bytes=1, gpu_memory="20Gi"))
    r, _w1 = await gate.request(forged)
    assert (await gate.reply(r, "admitted"))["bytes"] == 20 * GiB
    # Owner reference to a GNNJob that does not exist (or has another uid): not trusted either → whole GPU.
    fake_owner = gate.add(pod_object("fake-owner", admit_bytes=1, owner=("job-x", "uid-x")))
    r, _w2 = await gate.request(fake_owner)
    assert (await gate.reply(r, "admitted"))["bytes"] == 78 * GiB
    # A pod of a real GNNJob is booked at what the job's status says, whatever its own annotation claims.
    owned, job = job_pod("owned", 3 * GiB)
    owned["metadata"]["annotations"]["gnnsched.io/admit-bytes"] = "lots"
    gate.add(owned, job)
    r, _w3 = await gate.request(owned)
    assert (await gate.reply(r, "admitted"))["bytes"] == 3 * GiB
    assert sorted(e.bytes for e in gate.books.running.values()) == [3 * GiB, 20 * GiB, 78 * GiB]


@pytest.mark.asyncio
async def test_malformed_requests(gate: Harness) -> None:
    cases = [
        (b"not json\n", "request"),
        (b'{"op": "admit"}\n', "podUid"),
        (b'{"op": "steal", "podUid": "x", "podName": "x", "podNamespace": "x"}\n', "op"),
        (b'{"op": "admit", "podUid": "../../etc", "podName": "x", "podNamespace": "x"}\n', "podUid"),
        (b'{"op": "admit", "podUid": "u", "podName": "x", "podNamespace": "x", "bytes": 1}\n', "bytes"),
        (b'[1, 2]\n', "request"),
        (b"x" * (MAX_LINE + 10) + b"\n", "longer than"),
    ]
    for raw, needle in cases:
        r, w = await gate.connect()
        w.write(raw)
        await w.drain()
        msg = await gate.reply(r)
        assert msg["status"] == "rejected" and msg["reason"] == "malformed", raw[:40]
        assert needle in msg["message"], (raw[:40], msg)
        w.close()
    # A client that connects and says nothing, or half a line, then vanishes.
    r, w = await gate.connect()
    w.write(b'{"op": "adm')
    w.close()
    assert gate.rejections("malformed") == len(cases)
    assert not gate.books.queued and not gate.books.running


@pytest.mark.asyncio
async def test_vanished_clients(gate: Harness) -> None:
    big = [gate.add(*job_pod(f"big{i}", 60 * GiB)) for i in range(2)]
    holders = [await gate.request(p) for p in big]
    for r, _ in holders:
        assert (await gate.reply(r))["status"] == "admitted"
    waiting = gate.add(*job_pod("waiting", 30 * GiB))
    r, w = await gate.request(waiting)
    assert (await gate.reply(r))["status"] == "queued"
    w.transport.abort()  # killed while queued
    await gate.settle(lambda: not gate.books.queued)
    assert gate.books.committed_bytes(0) + gate.books.committed_bytes(1) == 120 * GiB
    holders[0][1].transport.abort()  # killed while running
    await gate.settle(lambda: len(gate.books.running) == 1)
    # Duplicate request from a pod that is already running is refused without touching its booking.
    r, _ = await gate.request(big[1])
    assert (await gate.reply(r))["reason"] == "duplicate"
    assert len(gate.books.running) == 1


@pytest.mark.asyncio
async def test_exceeds_gpu(gate: Harness) -> None:
    huge = gate.add(*job_pod("huge", 79 * GiB))  # capacity is 80 - 2 reserve
    r, _ = await gate.request(huge)
    msg = await gate.reply(r)
    assert msg["reason"] == "exceeds-gpu"
    assert gate.rejections("exceeds-gpu") == 1


@pytest.mark.asyncio
async def test_exclusive_pod_runs_alone_with_the_whole_gpu_as_its_limit(gate: Harness) -> None:
    # 85 GiB of admit bytes exceed the shareable 78 GiB, but the pod is marked exclusive: queued, not refused.
    pod, job = job_pod("alone", 85 * GiB)
    pod["metadata"]["annotations"][ANN_EXCLUSIVE] = "true"
    gate.add(pod, name_in_status(job, pod))
    small, sjob = job_pod("small", 1 * GiB)
    gate.add(small, sjob)
    r1, _w1 = await gate.request(small)
    first = await gate.reply(r1, "admitted")
    r2, w2 = await gate.request(pod)
    msg = await gate.reply(r2, "admitted")
    assert msg["gpuUuid"] != first["gpuUuid"]  # only an empty GPU
    assert msg["bytes"] == 78 * GiB and msg["memLimit"] == f"0={78 * 1024}M"
    # Nothing is admitted beside it: the next pod goes to the small one's GPU.
    other, ojob = job_pod("other", 2 * GiB)
    gate.add(other, ojob)
    r3, _w3 = await gate.request(other)
    assert (await gate.reply(r3, "admitted"))["gpuUuid"] == first["gpuUuid"]
    w2.close()
    await gate.settle(lambda: len(gate.books.running) == 2)
    bad = pod_object("bad-x", gpu_memory="1Gi")  # a plain pod's own exclusive annotation is read, and checked
    bad["metadata"]["annotations"][ANN_EXCLUSIVE] = "yes"
    gate.add(bad)
    r4, _ = await gate.request(bad)
    reply = await gate.reply(r4)
    assert reply["reason"] == "bad-annotation" and "exclusive='yes'" in reply["message"]


@pytest.mark.asyncio
async def test_fault_peers_are_admitted_on_different_gpus_or_wait(gate: Harness) -> None:
    """Three requeued attempts of one undecided fault (each annotated with the others' jobs by the operator) on two
    GPUs: the first two go to different GPUs, the third waits until a peer's GPU empties, although its bytes fit.
    An unowned pod's annotation is not trusted (it could only hold others back)."""
    names = ("pa", "pb", "pc")
    pods = []
    for name in names:
        pod, job = job_pod(name, GiB)
        others = ",".join(f"default/job-{o}" for o in names if o != name)
        pod["metadata"]["annotations"][ANN_FAULT_PEERS] = others
        gate.add(pod, name_in_status(job, pod))
        pods.append(pod)
    r1, w1 = await gate.request(pods[0])
    first = await gate.reply(r1, "admitted")
    r2, _w2 = await gate.request(pods[1])
    second = await gate.reply(r2, "admitted")
    assert first["gpuUuid"] != second["gpuUuid"]
    # the GPUNode status the extender reads lists each running peer's peers (the extender keeps the same rule)
    published = build_status("node-a", gate.books, [], MPSStatus(), gate.server._wall())
    assert {j.name: j.fault_peers for g in published.gpus for j in g.running} == {
        "pa": ["default/job-pb", "default/job-pc"], "pb": ["default/job-pa", "default/job-pc"]}
    r3, _w3 = await gate.request(pods[2])
    await gate.settle(lambda: len(gate.books.queued) == 1)
    await asyncio.sleep(0.2)
    assert len(gate.books.queued) == 1  # still waiting: both GPUs run one of its peers
    w1.close()  # the first peer exits: its GPU is free of peers
    third = await gate.reply(r3, "admitted")
    assert third["gpuUuid"] == first["gpuUuid"]
    stranger = pod_object("stranger", gpu_memory="1Gi")
    stranger["metadata"]["annotations"][ANN_FAULT_PEERS] = "default/job-pb,default/job-pc"  # trusted: it would wait
    gate.add(stranger)
    r4, _w4 = await gate.request(stranger)
    assert (await gate.reply(r4, "admitted"))["status"] == "admitted"


@pytest.mark.asyncio
async def test_a_probation_attempt_holds_an_idle_gpu_until_it_passes_its_step(gate: Harness) -> None:
    """gnnsched.attempts.probation, end to end at the gate: an attempt on probation at step 40 is admitted alone on an
    idle GPU and books all of it (the GPUNode status says so), under its own bytes as its MPS limit; a pod that would
    fit beside it goes to the other GPU, and one more waits; the probation attempt's report of step 40 changes
    nothing, step 41 releases the GPU and the waiting pod joins it. When no GPU is idle, a probation attempt is
    admitted with its own bytes where it fits (it shares, as before probation)."""
    probe, job = job_pod("probe", 4 * GiB, runtime=100)
    probe["metadata"]["annotations"][ANN_PROBATION_STEP] = "40"
    gate.add(probe, name_in_status(job, probe))
    rp, wp = await gate.request(probe)
    admitted = await gate.reply(rp, "admitted")
    key = probe["metadata"]["uid"]
    entry = gate.books.running[key]
    assert entry.held and entry.bytes == 4 * GiB
    assert admitted["memLimit"] == "0=4096M" and int(admitted["bytes"]) == 4 * GiB  # its own bytes are its limit
    assert gate.books.committed_bytes(admitted["gpuIndex"]) == 78 * GiB  # the whole GPU is booked
    status = build_status("node-a", gate.books, [], MPSStatus(), gate.server._wall())
    assert {j.name: j.bytes for g in status.gpus for j in g.running} == {"probe": 78 * GiB}
    others = []
    for name in ("b", "c"):
        p = gate.add(*job_pod(name, 2 * GiB, runtime=100))
        others.append((p, *await gate.request(p)))
    first = await gate.reply(others[0][1], "admitted")
    assert first["gpuIndex"] != admitted["gpuIndex"]
    wp.write(json.dumps({"op": "progress", "steps": 40, "total": 100, "seconds": 8.0}).encode() + b"\n")
    await wp.drain()
    await gate.settle(lambda: entry.progress is not None)
    await asyncio.sleep(0.1)
    assert entry.held and len(gate.books.queued) == 0  # c joined b's GPU: it fits there; the probe's GPU is held
    c_gpu = gate.books.running[others[1][0]["metadata"]["uid"]].gpu_index
    assert c_gpu == first["gpuIndex"]
    d = gate.add(*job_pod("d", 75 * GiB, runtime=100))  # fits only an emptied GPU: the probe's, once released
    rd, _wd = await gate.request(d)
    await gate.settle(lambda: len(gate.books.queued) == 1)
    await asyncio.sleep(2.6)  # the gate keeps at most one report per half interval
    wp.write(json.dumps({"op": "progress", "steps": 41, "total": 100, "seconds": 8.2}).encode() + b"\n")
    await wp.drain()
    await gate.settle(lambda: not entry.held)
    assert "probation-passed" in (gate.tmp / "events.jsonl").read_text()
    probation = {e: gate.metrics.registry.get_sample_value("gnnsched_gate_probation_total", {"event": e})
                 for e in ("alone", "passed")}
    assert probation == {"alone": 1.0, "passed": 1.0}
    assert gate.books.committed_bytes(admitted["gpuIndex"]) == 4 * GiB
    await asyncio.sleep(0.1)
    assert len(gate.books.queued) == 1  # 75 GiB still does not fit beside the probe's 4 GiB on 78 GiB: it waits
    for _, _, w in others:
        w.close()
    await gate.settle(lambda: len(gate.books.running) == 2)  # d took the GPU b and c left
    assert (await gate.reply(rd, "admitted"))["gpuIndex"] == first["gpuIndex"]
    # no GPU idle now (the probe on one, d on the other): a second probation attempt shares with its own bytes
    late, ljob = job_pod("late", 2 * GiB, runtime=100)
    late["metadata"]["annotations"][ANN_PROBATION_STEP] = "3"
    gate.add(late, name_in_status(ljob, late))
    rl, _wl = await gate.request(late)
    shared = await gate.reply(rl, "admitted")
    assert shared["gpuIndex"] == admitted["gpuIndex"] and not gate.books.running[late["metadata"]["uid"]].held
    assert gate.metrics.registry.get_sample_value("gnnsched_gate_probation_total", {"event": "shared"}) == 1.0
    wp.close()


def _sealed_server(h: Harness, books: Books, grace: float, key: bytes) -> GateServer:
    """A gate over ``h``'s pods with a fixed node seal key: an agent and its successor after a restart."""
    return GateServer(
        books, GateConfig(node_name="node-a", pipe_directory="/run/mps", recovery_grace=grace, reconcile_seconds=0,
                          seal_key=key),
        pods=FilePodLookup(h.pods_file), verifier=PeerVerifier(enabled=False), metrics=h.metrics,
        event_log=h.tmp / "events.jsonl",
    )


@pytest.mark.asyncio
async def test_an_agent_restart_keeps_a_probation_hold_until_the_step_is_passed(tmp_path) -> None:
    """The hold survives an agent restart: the successor adopts the probation pod from its sealed annotations with
    its own bytes, then, at the end of the recovery grace, books its GPU whole again (it runs alone there), so a pod
    that would fit beside it goes to the other GPU; its first report past the step releases the GPU."""
    key = b"s" * 32
    h = Harness(tmp_path)
    h.server = _sealed_server(h, h.books, 0.0, key)
    await h.server.start(h.sock)
    probe, job = job_pod("probe", 4 * GiB, runtime=100)
    probe["metadata"]["annotations"][ANN_PROBATION_STEP] = "40"
    h.add(probe, name_in_status(job, probe))
    rp, wp = await h.request(probe)
    first = await h.reply(rp, "admitted")
    await h.settle(lambda: json.loads(h.pods_file.read_text())["pods"][0]["metadata"]["annotations"].get(ANN_GPU))
    # The agent dies: nothing is released or annotated; the successor has new books and the same node seal key.
    h.server._annotations = None
    wp.close()
    books = Books(_gpus(), "base")
    successor = _sealed_server(h, books, 0.3, key)
    h.sock = tmp_path / "gate2.sock"
    await successor.start(h.sock)
    try:
        entry = books.running[probe["metadata"]["uid"]]
        assert entry.probation == 40 and not entry.held  # adopted with its own bytes during the grace
        await h.settle(lambda: entry.held)
        assert books.committed_bytes(first["gpuIndex"]) == 78 * GiB
        assert "probation-rehold" in (tmp_path / "events.jsonl").read_text()
        other = h.add(*job_pod("other", 2 * GiB, runtime=100))
        r2, w2 = await h.request(other)
        assert (await h.reply(r2, "admitted"))["gpuIndex"] != first["gpuIndex"]
        assert books.report_progress(entry, StepProgress(steps=41, total=100, seconds=9.0, at=0.0))
        assert not entry.held and books.committed_bytes(first["gpuIndex"]) == 4 * GiB
        w2.close()
    finally:
        await successor.close()
        await h.server.close()


def test_a_probation_client_restored_beside_another_is_not_reheld() -> None:
    """:meth:`Books.rehold_probation` holds only a probation client alone on a GPU of the largest size: one that
    shared its GPU before the restart keeps its own bytes, and so does one alone on a smaller GPU (the whole-GPU
    booking is the largest GPU's bytes)."""
    gpus = [GPUSlot(0, "GPU-a", "Fake-GPU", 80 * GiB, 2 * GiB, 4),
            GPUSlot(1, "GPU-b", "Fake-GPU", 40 * GiB, 2 * GiB, 4)]
    books = Books(gpus, "base")
    books.restore("p", pod_uid="p", bytes=4 * GiB, gpu_uuid="GPU-a", probation=7)
    books.restore("n", pod_uid="n", bytes=4 * GiB, gpu_uuid="GPU-a")
    books.restore("small", pod_uid="small", bytes=4 * GiB, gpu_uuid="GPU-b", probation=7)
    assert books.rehold_probation() == []
    assert books.committed_bytes(0) == 8 * GiB and books.committed_bytes(1) == 4 * GiB
    books.release("n")
    assert [e.key for e in books.rehold_probation()] == ["p"]
    assert books.committed_bytes(0) == 78 * GiB


def test_a_suspects_probation_waits_for_a_gpu_of_its_own_within_the_bypass_bound() -> None:
    """gnnsched.attempts.probation: with no GPU idle, an undecided probation attempt shares where it fits, while a
    suspect's (its own fault, certain) waits though it fits as well: a deterministic bug would kill its new
    neighbours at the same step. The bounded bypass bounds the wait: once ``bypass_limit`` later pods have overtaken
    it, the queue stops behind it, a GPU drains, and it is admitted alone there, holding the whole GPU."""
    gpus = [GPUSlot(i, f"GPU-{i}", "Fake-GPU", 40 * GiB, 2 * GiB, 4) for i in (0, 1)]
    books = Books(gpus, "base", bypass_limit=2)
    for key in ("r0", "r1"):
        books.enqueue(key, pod_uid=key, bytes=30 * GiB)
    books.decide()
    assert {e.gpu_index for e in books.running.values()} == {0, 1}  # no GPU idle now
    books.enqueue("undecided", pod_uid="undecided", bytes=4 * GiB, probation=9)
    books.enqueue("suspect", pod_uid="suspect", bytes=4 * GiB, probation=12, probation_suspect=True)
    admitted = {e.key for d in books.decide() for e in d.entries}
    assert admitted == {"undecided"} and not books.running["undecided"].held  # it shares, with its own bytes
    assert list(books.queued) == ["suspect"]  # it fits beside them too, but waits
    for key in ("n0", "n1", "n2"):  # later pods overtake it, up to the bypass limit
        books.enqueue(key, pod_uid=key, bytes=4 * GiB)
    admitted = {e.key for d in books.decide() for e in d.entries}
    assert admitted == {"n0", "n1"} and set(books.queued) == {"suspect", "n2"}  # the queue stops behind it
    gpu0 = {e.key for e in books.running.values() if e.gpu_index == 0}
    for key in sorted(gpu0):
        assert "suspect" in books.queued
        books.release(key)
        books.decide()
    entry = books.running["suspect"]  # the first GPU to empty is its own
    assert entry.held and books.committed_bytes(entry.gpu_index) == 38 * GiB
    assert books.clients(entry.gpu_index) == 1


def test_a_suspects_probation_is_read_from_the_jobs_status_only() -> None:
    """The ``probation-suspect`` flag reaches the gate's demand from the GNNJob's ``status.podFacts`` (the operator
    writes both from the same annotations); on a pod no status names, or without a probation step, it is not read."""
    from gnnsched.contract import ANN_PROBATION_SUSPECT
    from gnnsched.node_agent.identity import PodInfo, pod_from_object, trusted_demand

    pod, job = job_pod("s", 4 * GiB)
    pod["metadata"]["annotations"].update({ANN_PROBATION_STEP: "12", ANN_PROBATION_SUSPECT: "true"})
    name_in_status(job, pod)
    assert job["status"]["podFacts"]["probationSuspect"] is True
    demand = trusted_demand(pod_from_object(pod, lambda ns, n: job), 78 * GiB)
    assert demand.probation == 12 and demand.probation_suspect
    del pod["metadata"]["annotations"][ANN_PROBATION_STEP]  # a suspect flag without a step says nothing
    name_in_status(job, pod)
    assert not trusted_demand(pod_from_object(pod, lambda ns, n: job), 78 * GiB).probation_suspect
    plain = PodInfo("p", "default", "p", annotations={ANN_PROBATION_STEP: "12", ANN_PROBATION_SUSPECT: "true"})
    assert not trusted_demand(plain, 78 * GiB).probation_suspect


@pytest.mark.asyncio
async def test_resume_checks_the_pod(gate: Harness) -> None:
    """A resume is checked before anything is booked: its bytes, its GPU, and that this agent admitted it (a pod it
    never admitted is refused, whatever GPU it names; tests/test_gate_security.py has the re-attach after a
    restart)."""
    pod, job = job_pod("r", 8 * GiB)
    gate.add(pod, job)
    r, _ = await gate.request(pod, op="resume", gpuUuid="GPU-fake-1", bytes=1)  # lies about its bytes
    assert (await gate.reply(r))["reason"] == "resume-mismatch"
    r, _ = await gate.request(pod, op="resume", gpuUuid="GPU-nope", bytes=8 * GiB)
    assert (await gate.reply(r))["reason"] == "unknown-gpu"
    r, _ = await gate.request(pod, op="resume", gpuUuid="GPU-fake-1", bytes=8 * GiB)
    assert (await gate.reply(r))["reason"] == "not-admitted-here"
    assert not gate.books.running


def test_cgroup_parsing() -> None:
    v1 = "12:memory:/kubepods/burstable/pod0b5c1f1e-4b2a-4c1e-9d9f-0123456789ab/3f2e\n"
    v2 = (
        "0::/kubepods.slice/kubepods-besteffort.slice/"
        "kubepods-besteffort-pod0b5c1f1e_4b2a_4c1e_9d9f_0123456789ab.slice/cri-containerd-1.scope\n"
    )
    assert pod_uids_in_cgroup(v1) == {"0b5c1f1e-4b2a-4c1e-9d9f-0123456789ab"}
    assert pod_uids_in_cgroup(v2) == {"0b5c1f1e-4b2a-4c1e-9d9f-0123456789ab"}
    assert pod_uids_in_cgroup("0::/user.slice/user-1000.slice\n") == set()


@pytest.mark.skipif(not hasattr(__import__("socket"), "SO_PEERCRED"), reason="SO_PEERCRED is Linux-only")
@pytest.mark.asyncio
async def test_peer_cgroup_check(tmp_path) -> None:
    """With the check on, the kernel-reported pid's cgroup must name the claimed pod: this test process's real
    cgroup names no pod (a liar); an injected cgroup for our pid names the pod (the honest case)."""
    pod, job = job_pod("p", GiB)
    uid = pod["metadata"]["uid"]
    seen: list[int] = []

    def fake_cgroup(pid: int) -> str:
        seen.append(pid)
        return f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/cri-containerd-x.scope\n"

    for verifier, want in ((PeerVerifier(enabled=True), "rejected"), (PeerVerifier(True, fake_cgroup), "admitted")):
        (tmp_path / want).mkdir()
        h = Harness(tmp_path / want, verifier)
        h.add(pod, job)
        await h.server.start(h.sock)
        try:
            r, w = await h.request(pod)
            msg = await h.reply(r)
            assert msg["status"] == want, msg
            if want == "rejected":
                assert msg["reason"] == "pod-uid-mismatch" and f"pid {os.getpid()}" in msg["message"]
                assert not h.books.queued and not h.books.running
            w.close()
        finally:
            await h.server.close()
    assert set(seen) == {os.getpid()}  # the kernel's pid (read at accept for the connection cap, and to verify)


@pytest.mark.asyncio
async def test_pod_gone_releases_and_closes(gate: Harness) -> None:
    """The agent releases on the pod going away even if the client's connection never ends."""
    pods = [gate.add(*job_pod(f"g{i}", 50 * GiB)) for i in range(3)]
    conns = []
    for p in pods:
        conns.append(await gate.request(p))
        await gate.reply(conns[-1][0])
    assert len(gate.books.running) == 2 and len(gate.books.queued) == 1

    def drop(data: dict) -> None:
        data["pods"] = [p for p in data["pods"] if p["metadata"]["name"] != "g0"]

    FilePodLookup(gate.pods_file).mutate(drop)
    await gate.server.reconcile()
    assert (await asyncio.wait_for(conns[0][0].read(), 5)) == b""  # the gate hung up on the vanished pod
    msg = await gate.reply(conns[2][0], "admitted")  # its memory went to the waiting one
    assert msg["status"] == "admitted"
    assert sorted(e.name for e in gate.books.running.values()) == ["g1", "g2"]


def _annotations(h: Harness, name: str) -> dict[str, str]:
    pods = json.loads(h.pods_file.read_text())["pods"]
    return next(p for p in pods if p["metadata"]["name"] == name)["metadata"]["annotations"]


@pytest.mark.asyncio
async def test_progress_reports_become_the_seconds_left_that_spread_and_the_status_use(tmp_path) -> None:
    """Over the gate connection: a running pod's step reports replace its prediction once they measure its pace, in
    the spread rule's GPU order and in the published status; a bad report is dropped and loses nothing."""
    h = Harness(tmp_path, spread=True)
    await h.server.start(h.sock)
    try:
        a = h.add(*job_pod("a", 10 * GiB, runtime=60))  # predicted 60 s ...
        b = h.add(*job_pod("b", 10 * GiB, runtime=200))
        ra, wa = await h.request(a)
        assert (await h.reply(ra, "admitted"))["gpuIndex"] == 0
        rb, wb = await h.request(b)
        assert (await h.reply(rb, "admitted"))["gpuIndex"] == 1  # spread: the idle GPU
        key_a = a["metadata"]["uid"]
        entry = h.books.running[key_a]

        # Without reports GPU 0 has the least work left (a's 60 s against b's 200 s): a newcomer joins a.
        c = h.add(*job_pod("c", 10 * GiB, runtime=30))
        rc, wc = await h.request(c)
        assert (await h.reply(rc, "admitted"))["gpuIndex"] == 0
        wc.close()
        await h.settle(lambda: c["metadata"]["uid"] not in h.books.running)

        # A report that does not add up is dropped, named, and the booking stays.
        wa.write(json.dumps({"op": "progress", "steps": 5, "total": 3, "seconds": 1.0}).encode() + b"\n")
        await wa.drain()
        await h.settle(lambda: "progress-rejected" in (tmp_path / "events.jsonl").read_text())
        assert "exceeds total" in (tmp_path / "events.jsonl").read_text()
        assert entry.progress is None and key_a in h.books.running

        # ... but a really needs 3 s per step: 3 of 100 steps in 9 s, 291 s left.
        wa.write(json.dumps({"op": "progress", "steps": 3, "total": 100, "seconds": 9.0}).encode() + b"\n")
        await wa.drain()
        await h.settle(lambda: entry.progress is not None)
        assert entry.progress is not None
        now = h.server._wall()
        assert h.books.seconds_left(entry, now) == pytest.approx(291.0 - (now - entry.progress.at))
        # the status the extender reads says the same (b, unreported, keeps its prediction)
        status = build_status("node-a", h.books, [], MPSStatus(), now)
        published = {j.name: j.predicted_remaining_seconds for g in status.gpus for j in g.running}
        assert published["a"] == pytest.approx(h.books.seconds_left(entry, now))
        assert published["b"] == pytest.approx(h.books.seconds_left(h.books.running[b["metadata"]["uid"]], now))
        assert 190 < (published["b"] or 0) <= 204.4
        # the pod's started-at is when its first step began (the operator's observed runtime counts from it)
        await h.settle(lambda: ANN_STARTED_AT in _annotations(h, "a"))
        started = parse_rfc3339(_annotations(h, "a")[ANN_STARTED_AT])
        assert started == pytest.approx(entry.progress.at - 9.0, abs=0.002)

        # Now GPU 1 (b: about 200 s left) has less work left than GPU 0 (a: about 291 s): the next pod goes there.
        d = h.add(*job_pod("d", 10 * GiB, runtime=30))
        rd, wd = await h.request(d)
        assert (await h.reply(rd, "admitted"))["gpuIndex"] == 1
        for w in (wa, wb, wd):
            w.close()
        await h.settle(lambda: not h.books.running)
    finally:
        await h.server.close()
    h.books.check()


CUSTOM_WORKLOAD = r"""
import json, os, sys, time
fd = int(os.environ["GNNSCHED_PROGRESS_FD"])
os.write(fd, b"not json\n")
os.write(fd, json.dumps({"op": "admit", "steps": 4, "total": 40, "seconds": 2.0, "podUid": "x"}).encode() + b"\n")
open(sys.argv[1], "w").write("reported")
while not os.path.exists(sys.argv[2]):
    time.sleep(0.02)
"""


def _gated(h: Harness, pod: dict, *cmd: str) -> list[str]:
    return [*gnnsched_command(), "gate", "--socket", str(h.sock), "--", *cmd]


def _pod_env(pod: dict) -> dict[str, str]:
    m = pod["metadata"]
    return dict(os.environ, **{ENV_POD_UID: m["uid"], ENV_POD_NAME: m["name"], ENV_POD_NAMESPACE: m["namespace"]})


@pytest.mark.asyncio
async def test_the_gate_client_forwards_a_workloads_progress_and_only_its_numbers(gate: Harness) -> None:
    """``gnnsched gate -- CMD`` as a real process: the workload writes on ``$GNNSCHED_PROGRESS_FD``, the keeper
    forwards its newest valid line on the gate connection, re-written as a ``progress`` request (another op or field
    the workload put in it never reaches the agent)."""
    pod = gate.add(*job_pod("w", 10 * GiB, runtime=600))
    reported, go = gate.tmp / "reported", gate.tmp / "go"
    proc = await asyncio.create_subprocess_exec(
        *_gated(gate, pod, sys.executable, "-S", "-c", CUSTOM_WORKLOAD, str(reported), str(go)),
        env=_pod_env(pod), stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        key = pod["metadata"]["uid"]
        await gate.settle(lambda: key in gate.books.running and gate.books.running[key].progress is not None, 20)
        report = gate.books.running[key].progress
        assert report is not None and (report.steps, report.total, report.seconds) == (4, 40, 2.0)
        # 0.5 s per step measured, 36 steps left: about 18 s, not the predicted 600
        assert gate.books.seconds_left(gate.books.running[key], report.at) == pytest.approx(18.0)
        assert "progress-rejected" not in (gate.tmp / "events.jsonl").read_text()
    finally:
        go.write_text("")
        _, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0, err.decode()
    await gate.settle(lambda: not gate.books.running)


@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_the_built_in_worker_reports_its_steps_through_the_gate(gate: Harness) -> None:
    """``gnnsched gate -- gnnsched worker JOB``: the real worker's step reports reach the agent, whose first one sets
    the pod's started-at between its admission and its end."""
    pod = gate.add(*job_pod("real", 1 * GiB, runtime=5))
    job = gate.tmp / "job.yaml"
    job.write_text(WORKER_JOB)
    proc = await asyncio.create_subprocess_exec(
        *_gated(gate, pod, *gnnsched_command(), "worker", str(job), "--no-progress"),
        env=_pod_env(pod), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 150)
    assert proc.returncode == 0, err.decode()
    assert json.loads(out.decode().splitlines()[-1])["steps"] == 30
    await gate.settle(lambda: ANN_FINISHED_AT in _annotations(gate, "real"))
    ann = _annotations(gate, "real")
    admitted, started, finished = (parse_rfc3339(ann[k]) for k in (ANN_ADMITTED_AT, ANN_STARTED_AT, ANN_FINISHED_AT))
    assert admitted is not None and started is not None and finished is not None
    assert admitted - 0.002 <= started <= finished  # the steps began after the admission (and the imports)


WORKER_JOB = """apiVersion: gnnsched.io/v1alpha1
kind: GNNJob
metadata: {name: real}
spec:
  mode: train
  model: {arch: gcn, layers: 2, hidden: 16}
  graph: {nodes: 500, edges: 4000, features: 16, classes: 4}
  epochs: 30
"""


@pytest.mark.asyncio
async def test_a_forged_runtime_does_not_jump_the_sqtf_queue(tmp_path) -> None:
    """Issue 39, finding 3: a plain pod in another namespace that writes ``predicted-runtime-seconds: "0.001"`` (and
    a forged GNNJob ownerReference) on itself was admitted under ``sqtf`` ahead of an earlier GNNJob pod. Its
    annotations are no facts: only a GNNJob's status names a pod's runtime, so the GNNJob pod is admitted first."""
    h = Harness(tmp_path, policy="sqtf")
    await h.server.start(h.sock)
    try:
        blockers = [h.add(*job_pod(f"full{i}", 70 * GiB, runtime=50)) for i in range(2)]
        holders = [await h.request(p) for p in blockers]
        for r, _ in holders:
            await h.reply(r, "admitted")
        earlier = h.add(*job_pod("earlier", 40 * GiB, runtime=100))
        r_earlier, _w1 = await h.request(earlier)
        assert (await h.reply(r_earlier))["status"] == "queued"
        forger = pod_object("forger", namespace="tenant-b", gpu_memory="40Gi", runtime=0.001,
                            owner=("job-earlier", "a-uid-it-read"))
        forger["metadata"]["annotations"]["gnnsched.io/admit-bytes"] = str(GiB)
        h.add(forger)
        r_forger, _w2 = await h.request(forger)
        assert (await h.reply(r_forger))["status"] == "queued"
        booked = {e.name: (e.qt_seconds, e.bytes) for e in h.books.queued.values()}
        assert booked == {"earlier": (100.0, 40 * GiB), "forger": (None, 40 * GiB)}
        holders[0][1].close()  # one GPU frees: room for one of the two (2 x 40 GiB > 78 GiB)
        assert (await h.reply(r_earlier, "admitted"))["status"] == "admitted"
        assert [e.name for e in h.books.queued.values()] == ["forger"]
    finally:
        await h.server.close()


class _Unavailable(Exception):
    """What the kubernetes client raises for an API server answer, with its HTTP status."""

    def __init__(self, status: int) -> None:
        super().__init__(f"({status}) the API server answered {status}")
        self.status = status


class _FlakyPods(FilePodLookup):
    """The pods file, behind an API server that fails the first writes of a pod: ``failures[name]`` are the
    statuses its annotate calls fail with, in turn (None: a timeout, no status)."""

    def __init__(self, path: Path, failures: dict[str, list[int | None]]) -> None:
        super().__init__(path)
        self.failures = {name: list(statuses) for name, statuses in failures.items()}
        self.calls: list[str] = []

    def annotate(self, namespace: str, name: str, annotations: dict[str, str | None]) -> None:
        self.calls.append(name)
        if self.failures.get(name):
            status = self.failures[name].pop(0)
            raise _Unavailable(status) if status is not None else TimeoutError("read timed out")
        super().annotate(namespace, name, annotations)


@pytest.mark.asyncio
async def test_a_verdict_survives_api_server_hiccups_and_keeps_its_order(tmp_path, monkeypatch) -> None:
    """A fault record or attempt result the operator waits for must not be lost to one timeout or 503: the writer
    tries the same annotation again before the next one (order kept), and drops at once only what the API server
    refused as such (404: the pod is gone), counting both."""
    monkeypatch.setattr("gnnsched.node_agent.gate.ANNOTATION_RETRY_DELAYS", (0.01, 0.01, 0.01))
    h = Harness(tmp_path)
    h.add(pod_object("victim", gpu_memory="1Gi"))
    h.server.pods = flaky = _FlakyPods(h.pods_file, {"victim": [None, 503], "gone": [404]})
    await h.server.start(h.sock)
    try:
        h.server.annotate_pod("default", "victim", {"gnnsched.io/fault": "first"})  # timeout, 503, then lands
        h.server.annotate_pod("default", "gone", {"gnnsched.io/fault": "x"})  # 404: not retried
        h.server.annotate_pod("default", "victim", {"gnnsched.io/attempt-result": "second"})
        await h.settle(lambda: "gnnsched.io/attempt-result" in _annotations(h, "victim"))
        assert _annotations(h, "victim")["gnnsched.io/fault"] == "first"
        assert flaky.calls == ["victim", "victim", "victim", "gone", "victim"]

        def count(outcome: str) -> float:
            return h.metrics.registry.get_sample_value("gnnsched_gate_annotation_failures_total",
                                                       {"outcome": outcome}) or 0.0
        assert (count("retried"), count("dropped")) == (2.0, 1.0)
    finally:
        await h.server.close()


@pytest.mark.asyncio
async def test_an_annotation_still_failing_after_the_retries_is_dropped(tmp_path, monkeypatch) -> None:
    """The API server down for longer than the retries: the write is dropped (the gate goes on), and the next one
    is tried afresh."""
    monkeypatch.setattr("gnnsched.node_agent.gate.ANNOTATION_RETRY_DELAYS", (0.01,))
    h = Harness(tmp_path)
    h.add(pod_object("p", gpu_memory="1Gi"))
    h.server.pods = flaky = _FlakyPods(h.pods_file, {"p": [500, 500]})
    await h.server.start(h.sock)
    try:
        h.server.annotate_pod("default", "p", {"gnnsched.io/fault": "lost"})
        h.server.annotate_pod("default", "p", {"gnnsched.io/attempt-result": "kept"})
        await h.settle(lambda: "gnnsched.io/attempt-result" in _annotations(h, "p"))
        assert "gnnsched.io/fault" not in _annotations(h, "p") and len(flaky.calls) == 3
    finally:
        await h.server.close()
