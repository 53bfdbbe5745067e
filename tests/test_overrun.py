"""A workload reaches only what it was admitted to (issue 39, item 2): the real agent loop on stand-in GPUs whose
driver lists each process with its used memory (``FakeGPUBackend(usage_dir=...)``, as
``nvmlDeviceGetMPSComputeRunningProcesses`` does), and real workload processes that go through the real gate socket.
One drops its MPS limit and allocates past its admitted bytes; one uses memory on a GPU it was not admitted to; their
neighbour keeps to its bytes. The agent stops the two offenders alone (SIGKILL, their bookings released), says why on
their pods, and the neighbour runs on and finishes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from gate_helpers import GiB, add_pods, job_pod, write_pods

from gnnsched.contract import ANN_STOPPED
from gnnsched.gpu.backend import FakeGPUBackend, GPUProcess
from gnnsched.node_agent.agent import AgentOptions, NodeAgent
from gnnsched.node_agent.identity import FilePodLookup, PeerVerifier
from gnnsched.node_agent.observe import ProcessTable
from gnnsched.node_agent.overrun import DEFAULT_MARGIN_BYTES, Booked, find_overruns, margin_bytes
from gnnsched.node_agent.status import FileStatusSink

pytestmark = [pytest.mark.timeout(90)]

WORKLOAD = """\
import json, socket, sys
from gnnsched.gpu.fake_memory import write_usage
sock, req, usage_dir, where, nbytes, other_gpu = sys.argv[1:7]
s = socket.socket(socket.AF_UNIX)
s.connect(sock)
s.sendall(req.encode() + b"\\n")
f = s.makefile("rb")
while True:
    m = json.loads(f.readline())
    if m["status"] != "queued":
        break
assert m["status"] == "admitted", m
# "own": on the admitted GPU; "other": on the GPU it was not given. Its MPS limit (m["memLimit"]) is ignored: the
# stand-in driver reports what the process holds, whatever limit it kept.
write_usage(usage_dir, m["gpuUuid"] if where == "own" else other_gpu, int(nbytes))
sys.stdout.write(m["gpuUuid"] + "\\n")
sys.stdout.flush()
sys.stdin.readline()  # runs until the test lets it finish
"""


def test_the_margin_is_the_larger_of_its_floor_and_its_fraction() -> None:
    assert margin_bytes(GiB) == DEFAULT_MARGIN_BYTES
    assert margin_bytes(40 * GiB) == 2 * GiB  # 5 %
    table = ProcessTable(read_cgroup=lambda pid: "0::/\n", read_ppid=lambda pid: 1)
    booked = [Booked("a", "uid-a", "ns", "a", 0, 20 * GiB, 100), Booked("b", "uid-b", "ns", "b", 1, 20 * GiB, 200)]
    limit = 20 * GiB + margin_bytes(20 * GiB)
    assert find_overruns({0: [GPUProcess(100, limit, "mps")], 1: [GPUProcess(200, None, "mps")]}, booked, table) == []
    over = find_overruns({0: [GPUProcess(100, limit + 1, "mps")]}, booked, table)
    assert [(o.pod_uid, o.reason, o.pids) for o in over] == [("uid-a", "GPUMemoryOverrun", (100,))]
    wrong = find_overruns({0: [GPUProcess(200, 1, "mps")]}, booked, table)
    assert [(o.pod_uid, o.reason, o.gpus) for o in wrong] == [("uid-b", "WrongGPU", (0,))]


@pytest.mark.asyncio
async def test_an_overrunning_client_is_stopped_alone_and_its_neighbour_finishes(tmp_path: Path) -> None:
    usage = tmp_path / "usage"
    usage.mkdir()
    pods_file = tmp_path / "pods.json"
    write_pods(pods_file, [], [])
    neighbour, j1 = job_pod("neighbour", 20 * GiB)
    greedy, j2 = job_pod("greedy", 20 * GiB)
    wanderer, j3 = job_pod("wanderer", 8 * GiB)
    add_pods(pods_file, [neighbour, greedy, wanderer], [j1, j2, j3])
    backend = FakeGPUBackend(2, 80 * GiB, name="NVIDIA A100-SXM4-80GB", usage_dir=usage)
    uuids = [d.uuid for d in backend.devices()]
    opts = AgentOptions(node_name="node-a", gate_socket=tmp_path / "gate.sock", policy="base", reserve_bytes=2 * GiB,
                        recovery_grace=0, status_interval=0.2, sample_interval=3600, metrics_port=None,
                        reconcile_interval=0, end_wait=1.0, event_log=tmp_path / "events.jsonl",
                        state_dir=str(tmp_path / "state"), measure_constants=False, live_memory_check=False)
    agent = NodeAgent(opts, backend, FilePodLookup(pods_file), FileStatusSink(tmp_path / "status.json"),
                      PeerVerifier(enabled=False))
    await agent.start()
    procs: dict[str, asyncio.subprocess.Process] = {}
    gpus: dict[str, str] = {}
    try:
        plan = {"neighbour": (neighbour, "own", 18 * GiB), "greedy": (greedy, "own", 30 * GiB),
                "wanderer": (wanderer, "other", GiB)}
        for name, (pod, where, nbytes) in plan.items():
            m = pod["metadata"]
            req = json.dumps({"op": "admit", "podUid": m["uid"], "podName": m["name"], "podNamespace": m["namespace"]})
            p = await asyncio.create_subprocess_exec(
                sys.executable, "-c", WORKLOAD, str(opts.gate_socket), req, str(usage), where, str(nbytes), "?",
                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            procs[name] = p
            assert p.stdout is not None
            gpus[name] = (await asyncio.wait_for(p.stdout.readline(), 30)).decode().strip()
        # the wanderer was told where to go only after its admission: move its usage to the GPU it was not given
        other = next(u for u in uuids if u != gpus["wanderer"])
        (usage / str(procs["wanderer"].pid)).write_text(f"{other} {GiB}\n")
        assert agent.gate is not None
        assert len(agent.gate.books.running) == 3
        await agent._sample()
        codes = {}
        for name in ("greedy", "wanderer"):
            codes[name] = await asyncio.wait_for(procs[name].wait(), 10)
        assert codes == {"greedy": -9, "wanderer": -9}  # SIGKILL, from the agent
        assert procs["neighbour"].returncode is None  # untouched
        for _ in range(200):
            if len(agent.gate.books.running) == 1:
                break
            await asyncio.sleep(0.02)
        assert [e.name for e in agent.gate.books.running.values()] == ["neighbour"]
        for _ in range(200):
            pods = {p["metadata"]["name"]: p["metadata"].get("annotations", {})
                    for p in json.loads(pods_file.read_text())["pods"]}
            if ANN_STOPPED in pods["greedy"] and ANN_STOPPED in pods["wanderer"]:
                break
            await asyncio.sleep(0.02)
        stopped = json.loads(pods["greedy"][ANN_STOPPED])
        assert stopped["reason"] == "GPUMemoryOverrun" and stopped["usedBytes"] == 30 * GiB
        assert stopped["admittedBytes"] == 20 * GiB and stopped["allowedBytes"] == 21 * GiB
        assert json.loads(pods["wanderer"][ANN_STOPPED])["reason"] == "WrongGPU"
        assert ANN_STOPPED not in pods["neighbour"]
        sample = agent.metrics.registry.get_sample_value
        assert sample("gnnsched_gate_stopped_clients_total", {"reason": "GPUMemoryOverrun"}) == 1
        assert sample("gnnsched_gate_stopped_clients_total", {"reason": "WrongGPU"}) == 1
        await agent._sample()  # a second sample stops nobody else and counts nothing twice
        assert sample("gnnsched_gate_stopped_clients_total", {"reason": "GPUMemoryOverrun"}) == 1
        assert procs["neighbour"].returncode is None
        # the neighbour finishes on its own
        assert procs["neighbour"].stdin is not None
        procs["neighbour"].stdin.write(b"done\n")
        await procs["neighbour"].stdin.drain()
        assert await asyncio.wait_for(procs["neighbour"].wait(), 10) == 0
        for _ in range(200):
            if not agent.gate.books.running:
                break
            await asyncio.sleep(0.02)
        assert not agent.gate.books.running
    finally:
        for p in procs.values():
            if p.returncode is None:
                p.kill()
                await p.wait()
        await agent.close()


def test_the_stop_reaches_the_job_as_its_failure_reason_and_is_not_a_resize() -> None:
    """The operator's side: a failed pod the agent stopped fails with the stop's reason, is not waited on for an
    attempt result, and is not read as memory-exceeded (which would grow the next attempt's reservation)."""
    from gnnsched.closed_loop import AttemptResult
    from gnnsched.contract import ANN_ADMITTED_AT, ANN_ATTEMPT_RESULT, ANN_GPU, JOB_CONTAINER_NAME
    from gnnsched.operator.resize import attempt_facts
    from gnnsched.operator.status import view_pod

    stop = Booked("k", "u", "ns", "greedy", 0, 20 * GiB, 100)
    [o] = find_overruns({0: [GPUProcess(100, 30 * GiB, "mps")]}, [stop],
                        ProcessTable(read_cgroup=lambda pid: "0::/\n", read_ppid=lambda pid: 1))
    result = AttemptResult(outcome="memory-exceeded", observed_peak_bytes=30 * GiB, limit_bytes=20 * GiB,
                           source="gate").line()
    pod = {"metadata": {"name": "greedy", "annotations": {ANN_STOPPED: o.annotation(), ANN_GPU: "GPU-0",
                                                          ANN_ADMITTED_AT: "2026-01-01T00:00:00Z",
                                                          ANN_ATTEMPT_RESULT: result}},
           "spec": {"nodeName": "node-a"},
           "status": {"phase": "Failed", "containerStatuses": [{"name": JOB_CONTAINER_NAME, "state": {
               "terminated": {"exitCode": 137, "reason": "Error", "finishedAt": "2026-01-01T00:01:00Z"}}}]}}
    view = view_pod(pod)
    assert view.failure_reason == "GPUMemoryOverrun" and "over the 21474836480 bytes" in (view.failure_message or "")
    facts = attempt_facts(pod)
    assert facts.awaits is None and facts.outcome is None and facts.result is None


JOB = """apiVersion: gnnsched.io/v1alpha1
kind: GNNJob
metadata: {name: j}
spec:
  mode: train
  model: {arch: gcn, layers: 2, hidden: 64}
  graph: {nodes: 15000, edges: 75000, features: 256, classes: 4}
  epochs: EPOCHS
"""


@pytest.mark.timeout(300)
@pytest.mark.skipif(not hasattr(__import__("os"), "pidfd_open"), reason="Linux pidfd")
def test_real_agent_stops_a_worker_that_dropped_its_mps_limit_and_its_neighbour_succeeds(tmp_path: Path) -> None:
    """The same with the real ``gnnsched node-agent`` (``--fake-gpu-memory enforce:10 --fake-gpu-usage``) and real
    ``gnnsched gate -- gnnsched worker`` processes: each worker counts 10x its CPU tensor bytes as device bytes and
    records its peak where the fake GPU lists it per process. The neighbour is admitted with enough for that and
    keeps its MPS limit; the greedy one is admitted with its CPU peak, removes its limit from its own environment
    (``env -u CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``) and so is not stopped by it: the agent kills it."""
    import os

    from fake_mps import start_agent, stop_agent
    from gate_helpers import gnnsched_command

    from gnnsched.closed_loop import AttemptResult
    from gnnsched.contract import ENV_POD_NAME, ENV_POD_NAMESPACE, ENV_POD_UID, ENV_RESULT_FILE
    from gnnsched.estimator import estimate
    from gnnsched.spec import load_job

    short, long_ = tmp_path / "short.yaml", tmp_path / "long.yaml"
    short.write_text(JOB.replace("EPOCHS", "2"))
    long_.write_text(JOB.replace("EPOCHS", "500"))
    cpu_peak = estimate(load_job(short).spec).pmc_bytes
    assert 10 * cpu_peak > cpu_peak + margin_bytes(cpu_peak)  # the greedy one's device bytes pass admitted + margin
    neighbour, j1 = job_pod("neighbour", 11 * cpu_peak)
    greedy, j2 = job_pod("greedy", cpu_peak)
    pods_file = tmp_path / "pods.json"
    write_pods(pods_file, [neighbour, greedy], [j1, j2])
    usage = tmp_path / "usage"
    usage.mkdir()
    sock = tmp_path / "gate.sock"
    env = dict(os.environ)
    agent = start_agent(gnnsched_command() + [
        "node-agent", "--gpus", "fake:1x80Gi", "--fake-gpu-memory", "enforce:10", "--fake-gpu-usage", str(usage),
        "--node-name", "node-a", "--gate-socket", str(sock), "--pods-file", str(pods_file),
        "--status-file", str(tmp_path / "status.json"), "--state-dir", str(tmp_path / "state"),
        "--jobs-uid", str(os.getuid()), "--mps", "off", "--peer-check", "off", "--recovery-grace", "0",
        "--metrics-port", "-1", "--event-log", str(tmp_path / "events.jsonl"), "--no-measure-gpu-constants",
        "--log-level", "warning",
    ], env, tmp_path, sock, tmp_path / "agent.log", tmp_path / "mps")
    runs = {}
    try:
        for pod, job_file, drop in ((greedy, long_, True), (neighbour, short, False)):
            meta = pod["metadata"]
            wenv = dict(env, **{ENV_POD_UID: meta["uid"], ENV_POD_NAME: meta["name"],
                                ENV_POD_NAMESPACE: meta["namespace"],
                                ENV_RESULT_FILE: str(tmp_path / f"{meta['name']}.result")})
            workload = (["env", "-u", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] if drop else []) + gnnsched_command() + [
                "worker", str(job_file), "--no-progress"]
            runs[meta["name"]] = subprocess.Popen(
                gnnsched_command() + ["gate", "--socket", str(sock), "--"] + workload, env=wenv, cwd=tmp_path,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        codes = {name: p.wait(timeout=240) for name, p in runs.items()}
    finally:
        for p in runs.values():
            if p.poll() is None:
                p.kill()
        stop_agent(agent, tmp_path / "mps")
    log = (tmp_path / "agent.log").read_text()
    assert codes["greedy"] == -9, (codes, log, runs["greedy"].stderr.read() if runs["greedy"].stderr else "")
    assert codes["neighbour"] == 0, (codes, log)
    result = AttemptResult.model_validate_json((tmp_path / "neighbour.result").read_text())
    assert result.outcome == "succeeded"
    ann = {p["metadata"]["name"]: p["metadata"].get("annotations", {})
           for p in json.loads(pods_file.read_text())["pods"]}
    stopped = json.loads(ann["greedy"][ANN_STOPPED])
    assert stopped["reason"] == "GPUMemoryOverrun" and stopped["admittedBytes"] == cpu_peak
    assert stopped["usedBytes"] > stopped["allowedBytes"]
    assert ANN_STOPPED not in ann["neighbour"]
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["pod"] for e in events if e["event"] == "stopped"] == [greedy["metadata"]["uid"]]
