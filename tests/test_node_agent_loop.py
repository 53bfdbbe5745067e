"""The closed loop's node side, in-process: the agent with fake GPUs, a pods file standing in for the API server
(the test writes container statuses the way kubelet reports them) and the real gate socket.

- observation: per-process memory attributed to gated pods (process tree, cgroup), the observed-peak annotation raised
  while the pod runs and never lowered (an agent restart must not undo a larger recorded value);
- custom containers: a failed container without a result line of its own gets an ``attempt-result`` annotation;
- the MPS fault domain: a fatal fault drains the GPU until its clients are gone and MPS answers; victims and the
  suspect are annotated; the drain survives an agent restart.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest
from fake_mps import kill_fake_mps
from gate_helpers import GiB, add_pods, job_pod, write_pods

from gnnsched.closed_loop import AttemptResult, FaultRecord
from gnnsched.contract import ANN_ATTEMPT_RESULT, ANN_FAULT, ANN_OBSERVED_PEAK_BYTES, RETURN_TO_SERVICE_DIR_NAME
from gnnsched.gpu.backend import FakeGPUBackend, GPUProcess
from gnnsched.node_agent.agent import AgentOptions, NodeAgent
from gnnsched.node_agent.identity import ContainerEnd, FilePodLookup, PeerVerifier
from gnnsched.node_agent.mps import MPSConfig, MPSManager
from gnnsched.node_agent.observe import (
    Client,
    ProcessTable,
    attribute,
    gate_attempt_result,
)
from gnnsched.node_agent.quarantine import ENDS_WAIT_S, XID_GRACE_S, ClientEnd, Quarantine
from gnnsched.node_agent.status import FileStatusSink
from gnnsched.node_status_file import read_status_file, status_file_path

FAKES = Path(__file__).parent / "fakes"
pytestmark = [pytest.mark.timeout(60)]

UID = "0b5c1f1e-4b2a-4c1e-9d9f-0123456789ab"


# --- pure parts -------------------------------------------------------------------------------------------------


def test_attribution_by_process_tree_then_cgroup() -> None:
    cgroups = {300: f"0::/kubepods/burstable/pod{UID}/abc\n", 400: "0::/system.slice/other\n"}
    parents = {201: 200, 202: 201}
    table = ProcessTable(read_cgroup=lambda pid: cgroups.get(pid, "0::/\n"), read_ppid=lambda pid: parents.get(pid, 1))
    procs = {0: [GPUProcess(200, 5 * GiB, "mps"), GPUProcess(202, 1 * GiB, "mps"), GPUProcess(300, 2 * GiB, "mps"),
                 GPUProcess(400, 7 * GiB, "mps"), GPUProcess(500, None, "mps")]}
    clients = [Client("a", "11111111-2222-3333-4444-555555555555", 0, 200), Client(UID, UID, 0, None)]
    usage = attribute(procs, clients, table)
    # a: its gated process and a grandchild; the cgroup pod: a process found by its cgroup; 400 and 500: nobody's
    assert usage == {"a": 6 * GiB, UID: 2 * GiB}


def test_gate_attempt_result_for_a_custom_container() -> None:
    oom = ContainerEnd("main", 1, "Traceback ...\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                                   "2.00 GiB. GPU 0 has a total capacity of 79.15 GiB")
    r = gate_attempt_result(oom, 18 * GiB, 20 * GiB)
    assert r is not None and r.outcome == "memory-exceeded" and r.source == "gate"
    assert r.requested_bytes == 2 * GiB and r.held_bytes == 18 * GiB and r.limit_bytes == 20 * GiB
    silent = ContainerEnd("main", 137, "")
    at_limit = gate_attempt_result(silent, 19 * GiB + GiB // 2, 20 * GiB)  # 97.5 % of the limit when it died
    assert at_limit is not None and at_limit.outcome == "memory-exceeded" and at_limit.requested_bytes is None
    assert gate_attempt_result(silent, 10 * GiB, 20 * GiB) is None  # an ordinary failure
    assert gate_attempt_result(ContainerEnd("main", 0, ""), 20 * GiB, 20 * GiB) is None  # it succeeded
    worker_line = AttemptResult(outcome="memory-exceeded", held_bytes=1, limit_bytes=2).line()
    assert gate_attempt_result(ContainerEnd("main", 1, worker_line), 20 * GiB, 20 * GiB) is None  # reported itself
    fault = gate_attempt_result(ContainerEnd("main", 1, "CUDA error: an illegal memory access"), None, 20 * GiB)
    assert fault is not None and fault.outcome == "fault"


def _ends(q: Quarantine, uuid: str, ends: dict[str, ClientEnd]) -> list[tuple[str, str]]:
    for key, end in ends.items():
        q.client_ended(uuid, key, end)
    return sorted((a.key, r.role) for a, r in q.decide_roles(uuid))


def test_roles_one_suspect_when_it_can_be_told_apart() -> None:
    victim = ClientEnd(1, "RuntimeError: CUDA error: cudaErrorMpsClientTerminated")
    own = ClientEnd(1, "RuntimeError: CUDA error: an illegal memory access was encountered")
    clients = [("a", "ns", "a"), ("b", "ns", "b"), ("c", "ns", "c")]
    q = Quarantine()
    q.trigger("GPU-0", "Xid", 0.0, clients, xid=43)
    q.client_ended("GPU-0", "a", victim)
    assert q.decide_roles("GPU-0") == []  # b and c have not ended yet
    assert _ends(q, "GPU-0", {"b": own, "c": victim}) == [("a", "victim"), ("b", "suspect"), ("c", "victim")]
    assert q.decide_roles("GPU-0") == []  # decided once
    # Two clients with errors of their own: they cannot be told apart, so nobody is charged.
    q2 = Quarantine()
    q2.trigger("GPU-0", "Xid", 0.0, clients, xid=79)
    assert _ends(q2, "GPU-0", {"a": own, "b": own, "c": victim}) == [("a", "victim"), ("b", "victim"), ("c", "victim")]
    # A client that finished cleanly before the fault is not annotated; one whose end was never seen is a victim.
    q3 = Quarantine()
    q3.trigger("GPU-0", "MpsClientTerminated", 0.0, clients)
    assert _ends(q3, "GPU-0", {"a": ClientEnd(0, ""), "b": victim, "c": ClientEnd(None, None)}) == [
        ("b", "victim"), ("c", "victim")]
    assert not q3.may_release("GPU-0", clients_on_gpu=1, mps_answers=True)
    assert not q3.may_release("GPU-0", clients_on_gpu=0, mps_answers=False)
    assert q3.may_release("GPU-0", clients_on_gpu=0, mps_answers=True)


def test_an_xid_after_the_810_that_started_the_drain_is_named_in_the_records() -> None:
    victim = ClientEnd(1, "RuntimeError: CUDA error: cudaErrorMpsClientTerminated")
    q = Quarantine()
    assert q.trigger("GPU-0", "MpsClientTerminated", 0.0, [("a", "ns", "a")]) is not None
    assert q.trigger("GPU-0", "Xid", 0.1, [("b", "ns", "b")], xid=31) is None  # the same fault
    assert q.drains["GPU-0"].label() == "Xid 31"
    q.client_ended("GPU-0", "a", victim)
    q.client_ended("GPU-0", "b", victim)
    assert [(a.key, r.role, r.xid) for a, r in q.decide_roles("GPU-0")] == [("a", "victim", 31), ("b", "victim", 31)]


# --- the agent --------------------------------------------------------------------------------------------------


class Node:
    """One agent on one fake 80 GiB GPU (so co-location is certain), fake MPS daemon on PATH."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.pods = tmp / "pods.json"
        self.backend = FakeGPUBackend(1, 80 * GiB, name="NVIDIA A100-SXM4-80GB")
        self.agent: NodeAgent | None = None
        self.mps: MPSManager | None = None
        self.status_task: asyncio.Task | None = None

    async def start(self, cgroups: dict[int, str] | None = None) -> NodeAgent:
        self.backend = FakeGPUBackend(1, 80 * GiB, name="NVIDIA A100-SXM4-80GB")  # a restarted agent opens it anew
        self.mps = MPSManager(MPSConfig(pipe_directory=self.tmp / "mps", log_directory=self.tmp / "mps-log",
                                        devices=[0], start_timeout=5))
        opts = AgentOptions(node_name="node-a", gate_socket=self.tmp / "gate.sock", policy="base",
                            reserve_bytes=2 * GiB, max_clients_per_gpu=8, pipe_directory=str(self.tmp / "mps"),
                            recovery_grace=0, status_interval=0.2, sample_interval=3600, metrics_port=None,
                            reconcile_interval=0, end_wait=5.0, event_log=self.tmp / "events.jsonl",
                            state_dir=str(self.tmp / "state"))
        table = ProcessTable(read_cgroup=lambda pid: (cgroups or {}).get(pid, "0::/\n"), read_ppid=lambda pid: 1)
        self.agent = NodeAgent(opts, self.backend, FilePodLookup(self.pods), FileStatusSink(self.tmp / "status.json"),
                               PeerVerifier(enabled=False), mps=self.mps, processes=table)
        await self.agent.start()
        self.status_task = asyncio.create_task(self.agent._status_loop())
        return self.agent

    async def stop(self) -> None:
        if self.status_task is not None:
            self.status_task.cancel()
            self.status_task = None
        if self.agent is not None:
            await self.agent.close()
            self.agent = None

    def annotations(self, name: str) -> dict[str, str]:
        for p in json.loads(self.pods.read_text())["pods"]:
            if p["metadata"]["name"] == name:
                return p["metadata"].get("annotations", {})
        raise KeyError(name)

    def terminate(self, name: str, exit_code: int, message: str) -> None:
        """What kubelet reports once the container ended (phase, containerStatuses[].state.terminated)."""

        def change(data: dict) -> None:
            for p in data["pods"]:
                if p["metadata"]["name"] == name:
                    p["status"] = {"phase": "Failed" if exit_code else "Succeeded", "containerStatuses": [
                        {"name": "main", "state": {"terminated": {"exitCode": exit_code, "message": message}}}]}

        FilePodLookup(self.pods).mutate(change)


@pytest.fixture
def node(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{FAKES}{os.pathsep}{os.environ['PATH']}")
    write_pods(tmp_path / "pods.json", [], [])
    n = Node(tmp_path)
    yield n
    kill_fake_mps(tmp_path / "mps")


async def _request(agent: NodeAgent, pod: dict) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    r, w = await asyncio.open_unix_connection(str(agent.opts.gate_socket))
    m = pod["metadata"]
    w.write(json.dumps({"op": "admit", "podUid": m["uid"], "podName": m["name"],
                        "podNamespace": m["namespace"]}).encode() + b"\n")
    await w.drain()
    return r, w


async def _reply(r: asyncio.StreamReader, skip_queued: bool = True) -> dict:
    while True:
        msg = json.loads(await asyncio.wait_for(r.readline(), 5))
        if not (skip_queued and msg["status"] == "queued"):
            return msg


def _running(agent: NodeAgent) -> dict:
    assert agent.gate is not None
    return agent.gate.books.running


async def _until(cond, timeout: float = 8.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if cond():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


@pytest.mark.asyncio
async def test_observed_peak_is_raised_while_running_and_never_lowered_by_a_restart(node: Node) -> None:
    pod, job = job_pod("obs", 20 * GiB)
    pod["metadata"]["annotations"][ANN_OBSERVED_PEAK_BYTES] = str(12 * GiB)  # recorded by an earlier agent
    add_pods(node.pods, [pod], [job])
    # One of the pod's processes is found through its cgroup only (a process the gated one did not start).
    agent = await node.start(cgroups={4242: f"0::/kubepods/pod{pod['metadata']['uid']}/c1\n"})
    try:
        r, w = await _request(agent, pod)
        assert (await _reply(r))["status"] == "admitted"
        node.backend.add_process(0, os.getpid(), 6 * GiB)
        node.backend.add_process(0, 4242, 3 * GiB)
        await agent._sample()
        assert node.annotations("obs")[ANN_OBSERVED_PEAK_BYTES] == str(12 * GiB)  # 9 GiB now: not lowered
        node.backend.add_process(0, 4242, 9 * GiB)
        await agent._sample()
        assert node.annotations("obs")[ANN_OBSERVED_PEAK_BYTES] == str(15 * GiB)
        node.backend.add_process(0, 4242, 1 * GiB)
        await agent._sample()
        assert node.annotations("obs")[ANN_OBSERVED_PEAK_BYTES] == str(15 * GiB)
        w.close()
        node.backend.remove_process(0, os.getpid())
        node.backend.remove_process(0, 4242)
        node.terminate("obs", 0, "")
        await _until(lambda: not _running(agent))
    finally:
        await node.stop()


@pytest.mark.asyncio
async def test_a_custom_container_that_died_at_its_limit_gets_a_memory_exceeded_result(node: Node) -> None:
    pod, job = job_pod("custom", 20 * GiB)
    add_pods(node.pods, [pod], [job])
    agent = await node.start()
    try:
        r, w = await _request(agent, pod)
        assert (await _reply(r))["status"] == "admitted"
        node.backend.add_process(0, os.getpid(), 19 * GiB + GiB // 2)
        await agent._sample()
        w.close()
        node.backend.remove_process(0, os.getpid())
        node.terminate("custom", 1, "Segmentation fault (core dumped)")  # nothing in the log says out of memory
        await _until(lambda: ANN_ATTEMPT_RESULT in node.annotations("custom"))
        result = AttemptResult.model_validate_json(node.annotations("custom")[ANN_ATTEMPT_RESULT])
        assert result.outcome == "memory-exceeded" and result.source == "gate"
        assert result.held_bytes == result.observed_peak_bytes == 19 * GiB + GiB // 2
        assert result.limit_bytes == 20 * GiB
        assert agent.metrics.registry.get_sample_value("gnnsched_gate_attempt_outcomes_total",
                                                       {"outcome": "memory-exceeded"}) == 1
    finally:
        await node.stop()


@pytest.mark.asyncio
async def test_a_fatal_fault_drains_the_gpu_marks_victims_and_the_suspect_and_survives_a_restart(node: Node) -> None:
    pods = [job_pod(f"co{i}", 10 * GiB) for i in range(3)]
    late, late_job = job_pod("late", 5 * GiB)
    add_pods(node.pods, [p for p, _ in pods] + [late], [j for _, j in pods] + [late_job])
    agent = await node.start()
    conns = []
    for p, _ in pods:
        r, w = await _request(agent, p)
        assert (await _reply(r))["status"] == "admitted"
        conns.append(w)
    agent.on_health_event(node.backend.inject_xid(0, 43, "GPU stopped processing"))
    assert agent.quarantine.draining(node.backend.devices()[0].uuid)
    assert agent.metrics.registry.get_sample_value("gnnsched_gpu_faults_total", {"gpu": "0", "reason": "Xid"}) == 1
    r_late, w_late = await _request(agent, late)
    assert (await _reply(r_late, skip_queued=False))["status"] == "queued"  # nothing is admitted there
    await _until(lambda: read_status_file(status_file_path(node.tmp / "state")).gpus[0].draining)
    status = read_status_file(status_file_path(node.tmp / "state")).gpus[0]
    assert status.draining_reason == "Xid" and status.draining_xid == 43 and not status.mps_healthy

    # The agent restarts mid-quarantine: the GPU stays draining (status file), the clients are adopted.
    await _until(lambda: all("gnnsched.io/gpu" in node.annotations(f"co{i}") for i in range(3)))
    w_late.close()
    await node.stop()
    agent = await node.start()
    assert agent.quarantine.draining(node.backend.devices()[0].uuid)
    assert set(agent.quarantine.drains[node.backend.devices()[0].uuid].affected) == {p["metadata"]["uid"] for p, _ in
                                                                                     pods}
    r_late, w_late = await _request(agent, late)
    assert (await _reply(r_late, skip_queued=False))["status"] == "queued"

    try:
        # The clients die (their keepers' connections to the old agent are already gone); kubelet reports how.
        for w in conns:
            w.close()
        node.terminate("co0", 1, "RuntimeError: CUDA error: an illegal memory access was encountered")
        node.terminate("co1", 1, "RuntimeError: CUDA error: cudaErrorMpsClientTerminated")
        node.terminate("co2", 1, "RuntimeError: CUDA error: cudaErrorMpsClientTerminated")
        await agent.gate.reconcile()  # type: ignore[union-attr]  # the pods are finished: the books let them go
        await _until(lambda: all(ANN_FAULT in node.annotations(f"co{i}") for i in range(3)))
        roles = {f"co{i}": FaultRecord.model_validate_json(node.annotations(f"co{i}")[ANN_FAULT]) for i in range(3)}
        assert roles["co0"].role == "suspect" and roles["co0"].reason == "ClientFault"
        assert roles["co1"].role == roles["co2"].role == "victim"
        assert roles["co1"].reason == "MpsClientTerminated" and roles["co0"].xid == 43
        assert agent.metrics.registry.get_sample_value("gnnsched_fault_pods_total", {"role": "victim"}) == 2

        # Clients gone, but the MPS daemon does not answer: still draining.
        (node.tmp / "mps" / "fail-commands").touch()
        await agent._sample()
        assert agent.quarantine.drains and not _running(agent)
        (node.tmp / "mps" / "fail-commands").unlink()
        await agent._sample()
        assert not agent.quarantine.drains
        assert agent.metrics.registry.get_sample_value("gnnsched_gpu_faults_by_class_total",
                                                       {"class": "application"}) == 1  # Xid 43
        assert node.backend.devices()[0].healthy  # an application Xid leaves the GPU in service
        msg = await _reply(r_late)
        assert msg["status"] == "admitted" and msg["gpuIndex"] == 0
        w_late.close()
        events = [json.loads(line)["event"] for line in (node.tmp / "events.jsonl").read_text().splitlines()]
        assert "fault" in events and "fault-role" in events and "drained" in events
    finally:
        await node.stop()


@pytest.mark.asyncio
async def test_a_hardware_xid_takes_the_gpu_out_with_its_xid_and_since_when(node: Node) -> None:
    """Xid 79 on an idle GPU: the drain ends at once (no client), but the GPU stays unhealthy (until an admin acts):
    the status shows the Xid and since when, ``gnnsched_gpu_unhealthy`` names it, the fault counts as hardware."""
    agent = await node.start()
    try:
        uuid = node.backend.devices()[0].uuid
        labels = {"gpu": "0", "uuid": uuid}
        await agent._sample()
        assert agent.metrics.registry.get_sample_value("gnnsched_gpu_unhealthy", {**labels, "xid": ""}) == 0
        before = time.time()
        agent.on_health_event(node.backend.inject_xid(0, 79, "GPU has fallen off the bus"))
        await agent._sample()
        assert not agent.quarantine.drains  # no client to wait for
        assert agent.metrics.registry.get_sample_value("gnnsched_gpu_faults_by_class_total",
                                                       {"class": "hardware"}) == 1
        assert agent.metrics.registry.get_sample_value("gnnsched_gpu_unhealthy", {**labels, "xid": "79"}) == 1
        assert agent.metrics.registry.get_sample_value("gnnsched_gpu_unhealthy", {**labels, "xid": ""}) is None
        assert not agent.gate.books.gpus[0].healthy  # type: ignore[union-attr]

        def out_and_drained() -> bool:  # a publish from before the drain ended shows it still draining
            gpu = read_status_file(status_file_path(node.tmp / "state")).gpus[0]
            return not gpu.healthy and not gpu.draining

        await _until(out_and_drained)
        status = read_status_file(status_file_path(node.tmp / "state"))
        gpu = status.gpus[0]
        assert (gpu.unhealthy_xid, gpu.unhealthy_reason) == (79, "Xid 79: GPU has fallen off the bus")
        assert gpu.unhealthy_since is not None and before <= gpu.unhealthy_since.timestamp() <= time.time()
        assert status.unhealthy_gpus == 1 and not gpu.draining
    finally:
        await node.stop()


@pytest.mark.asyncio
async def test_a_hardware_xid_keeps_the_gpu_out_across_restarts_until_an_admin_returns_it(node: Node) -> None:
    """NVML's Xid mark lives in the process that saw it, so a restarted agent's driver view says the GPU is healthy.
    The agent keeps it out from its status file (same Xid, same since), restart after restart, until an admin
    creates ``<state dir>/return-to-service/<uuid>``: the next agent returns it and consumes the request."""
    agent = await node.start()
    uuid = node.backend.devices()[0].uuid
    state = node.tmp / "state"
    try:
        agent.on_health_event(node.backend.inject_xid(0, 79, "GPU has fallen off the bus"))
        await agent._sample()
        await _until(lambda: not read_status_file(status_file_path(state)).gpus[0].healthy)
        since = read_status_file(status_file_path(state)).gpus[0].unhealthy_since
    finally:
        await node.stop()
    for _ in range(2):  # restart after restart: the fresh backend sees a healthy GPU, the agent keeps it out
        agent = await node.start()
        try:
            assert node.backend.devices()[0].healthy
            assert not agent.gate.books.gpus[0].healthy  # type: ignore[union-attr]  # out before the first sample
            await agent._sample()
            assert not agent.gate.books.gpus[0].healthy  # type: ignore[union-attr]
            await agent._publish()
            gpu = read_status_file(status_file_path(state)).gpus[0]
            assert (gpu.healthy, gpu.unhealthy_xid, gpu.unhealthy_since) == (False, 79, since)
            assert gpu.unhealthy_reason == "Xid 79: GPU has fallen off the bus"
            assert agent.metrics.registry.get_sample_value(
                "gnnsched_gpu_unhealthy", {"gpu": "0", "uuid": uuid, "xid": "79"}) == 1
        finally:
            await node.stop()
    request = state / RETURN_TO_SERVICE_DIR_NAME / uuid
    request.parent.mkdir()
    request.touch()
    made = request.stat().st_mtime
    agent = await node.start()
    try:
        assert agent.gate.books.gpus[0].healthy  # type: ignore[union-attr]
        await agent._publish()
        gpu = read_status_file(status_file_path(state)).gpus[0]
        assert gpu.healthy and gpu.unhealthy_xid is None
        assert not request.exists()  # consumed: a later Xid takes the GPU out again
        assert gpu.returned_to_service_at is not None and abs(gpu.returned_to_service_at.timestamp() - made) < 1e-3
    finally:
        await node.stop()
    agent = await node.start()  # the next restart keeps the GPU in service, and when it was returned (for the plugin)
    try:
        await agent._publish()
        gpu = read_status_file(status_file_path(state)).gpus[0]
        assert gpu.healthy and gpu.returned_to_service_at is not None
        assert abs(gpu.returned_to_service_at.timestamp() - made) < 1e-3
    finally:
        await node.stop()


async def _lone_client_then_xid(node: Node, name: str, xid: int) -> FaultRecord:
    """A lone client ends with its own fatal error, then (0.5 s later) the driver's Xid reaches the agent: the record
    the agent writes once both are in."""
    pod, job = job_pod(name, 10 * GiB)
    add_pods(node.pods, [pod], [job])
    agent = await node.start()
    try:
        uuid = node.backend.devices()[0].uuid
        r, w = await _request(agent, pod)
        assert (await _reply(r))["status"] == "admitted"
        w.close()
        node.terminate(name, 1, "RuntimeError: CUDA error: an illegal memory access was encountered")
        await _until(lambda: agent.quarantine.draining(uuid))
        await asyncio.sleep(0.5)
        assert ANN_FAULT not in node.annotations(name)  # waiting for the Xid
        agent.on_health_event(node.backend.inject_xid(0, xid, "late"))
        await _until(lambda: ANN_FAULT in node.annotations(name))
        await agent._sample()  # the drain ends (no client left): the next start finds nothing draining
        assert not agent.quarantine.drains
        await agent._publish()
        return FaultRecord.model_validate_json(node.annotations(name)[ANN_FAULT])
    finally:
        await node.stop()


@pytest.mark.asyncio
async def test_the_roles_wait_for_an_xid_that_arrives_after_the_clients_error(node: Node) -> None:
    """A lone client ends with its own fatal error before the driver's Xid reaches the agent (two paths, either
    order). The roles wait for the Xid (``XID_GRACE_S``), so the record names it: Xid 13, an application fault whose
    lone client is the suspect; the same client under a hardware Xid that came late is a victim, not charged."""
    for xid, role in ((13, "suspect"), (79, "victim")):
        record = await _lone_client_then_xid(node, f"lone{xid}", xid)
        assert (record.role, record.xid) == (role, xid), record
    # no Xid at all: after the grace the roles are decided without one
    q = Quarantine()
    q.trigger("GPU-0", "ClientFault", 100.0, [("a", "ns", "a")])
    q.client_ended("GPU-0", "a", ClientEnd(1, "CUDA error: an illegal memory access was encountered"))
    assert q.decide_roles("GPU-0", now=100.0 + XID_GRACE_S - 0.1) == []
    assert not q.may_release("GPU-0", 0, True, now=100.0 + XID_GRACE_S - 0.1)
    (record,) = [r for _, r in q.decide_roles("GPU-0", now=100.0 + XID_GRACE_S)]
    assert record.role == "suspect" and record.xid is None


def test_a_drain_waits_for_its_clients_ends_before_it_ends() -> None:
    """The GPU's clients are gone and MPS answers, but one client's pod has not said how it ended: the drain holds
    (its role is decided with this drain; released first, the end came after, started a second fault with no client
    and the culprit's record was never written, seen in tests/e2e/test_checkpoint_e2e.py under load). Bounded by
    ``ENDS_WAIT_S``."""
    q = Quarantine()
    q.trigger("GPU-0", "Xid", 100.0, [("a", "ns", "a")], xid=13)
    q.client_gone("GPU-0", "a")
    assert not q.may_release("GPU-0", 0, True, now=101.0)  # gone, its end unknown
    assert q.may_release("GPU-0", 0, True, now=100.0 + ENDS_WAIT_S)  # never known: the bound
    q.client_ended("GPU-0", "a", ClientEnd(1, "CUDA error: an illegal memory access was encountered"))
    (record,) = [r for _, r in q.decide_roles("GPU-0", now=101.5)]
    assert record.role == "suspect" and q.may_release("GPU-0", 0, True, now=101.5)


@pytest.mark.asyncio
async def test_a_client_dying_with_810_starts_the_drain_without_an_xid(node: Node) -> None:
    """No Xid from the driver: the first sign is a client that MPS terminated (810). The GPU drains at once, the
    client still running there is affected, and when it dies with an error of its own it is the suspect."""
    pods = [job_pod(f"m{i}", 10 * GiB) for i in range(2)]
    late, late_job = job_pod("late2", 5 * GiB)
    add_pods(node.pods, [p for p, _ in pods] + [late], [j for _, j in pods] + [late_job])
    agent = await node.start()
    try:
        conns = []
        for p, _ in pods:
            r, w = await _request(agent, p)
            assert (await _reply(r))["status"] == "admitted"
            conns.append(w)
        uuid = node.backend.devices()[0].uuid
        conns[0].close()
        node.terminate("m0", 1, "RuntimeError: CUDA error: cudaErrorMpsClientTerminated")
        await _until(lambda: agent.quarantine.draining(uuid))
        drain = agent.quarantine.drains[uuid]
        assert drain.reason == "MpsClientTerminated" and set(drain.affected) == {p["metadata"]["uid"] for p, _ in pods}
        r_late, w_late = await _request(agent, late)
        assert (await _reply(r_late, skip_queued=False))["status"] == "queued"
        assert not any(ANN_FAULT in node.annotations(f"m{i}") for i in range(2))  # m1 has not ended yet
        conns[1].close()
        node.terminate("m1", 1, "CUDA error: unspecified launch failure")
        await _until(lambda: all(ANN_FAULT in node.annotations(f"m{i}") for i in range(2)))
        roles = {f"m{i}": FaultRecord.model_validate_json(node.annotations(f"m{i}")[ANN_FAULT]).role for i in range(2)}
        assert roles == {"m0": "victim", "m1": "suspect"}
        await agent._sample()
        assert (await _reply(r_late))["status"] == "admitted"
        w_late.close()
    finally:
        await node.stop()


@pytest.mark.asyncio
async def test_learned_slowdowns_are_published_and_survive_a_restart(node: Node) -> None:
    """What progress taught about co-location (issue 37) is in the GPUNode status, and a restarted agent starts
    from it instead of from the prior; a state file that does not parse is left aside, not fatal."""
    agent = await node.start()
    try:
        assert agent.gate is not None
        book = agent.gate.books.slowdowns
        for _ in range(3):
            book = book.record("A100-80GB", "compute", ["memory"], observed=2.0, prior=1.25)
        agent.gate.books.slowdowns = book
        await agent._publish()
        status = json.loads((node.tmp / "status.json").read_text())["status"]
        (entry,) = status["learnedSlowdowns"]
        assert (entry["jobClass"], entry["beside"], entry["samples"]) == ("compute", ["memory"], 3), entry
        await node.stop()
        agent = await node.start()
        assert agent.gate is not None
        assert agent.gate.books.slowdowns.factor("A100-80GB", "compute", ["memory"]) == pytest.approx(1.6)
        await node.stop()
        (node.tmp / "state" / "colocation-slowdowns.json").write_text("{not json")
        agent = await node.start()
        assert agent.gate is not None and agent.gate.books.slowdowns.table.classes() == []
    finally:
        await node.stop()
