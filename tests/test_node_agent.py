"""The agent wired together in-process (fake GPUs, fake MPS daemon on PATH, pods file, status file), and its CLI."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from fake_mps import kill_fake_mps
from gate_helpers import GiB, add_pods, job_pod, write_pods

from gnnsched.contract import ANN_OBSERVED_PEAK_BYTES, GPUNodeStatus
from gnnsched.gpu.backend import FakeGPUBackend
from gnnsched.node_agent.agent import AgentOptions, NodeAgent
from gnnsched.node_agent.identity import FilePodLookup, PeerVerifier
from gnnsched.node_agent.mps import MPSConfig, MPSManager
from gnnsched.node_agent.status import FileStatusSink
from gnnsched.node_status_file import read_status_file, status_file_path
from gnnsched.policies import STARTUP_SECONDS

FAKES = Path(__file__).parent / "fakes"
pytestmark = [pytest.mark.timeout(60)]


@dataclass
class Harness:
    a: NodeAgent
    tmp: Path
    fake: FakeGPUBackend
    pods: Path


@pytest_asyncio.fixture
async def agent(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{FAKES}{os.pathsep}{os.environ['PATH']}")
    pods = tmp_path / "pods.json"
    write_pods(pods, [], [])
    backend = FakeGPUBackend(2, 80 * GiB, name="NVIDIA A100-SXM4-80GB")
    mps = MPSManager(MPSConfig(pipe_directory=tmp_path / "mps", log_directory=tmp_path / "mps-log", devices=[0, 1],
                               compute_mode="exclusive", start_timeout=5))
    opts = AgentOptions(node_name="node-a", gate_socket=tmp_path / "gate.sock", policy="bmc",
                        reserve_fraction=0.05, max_clients_per_gpu=3, pipe_directory=str(tmp_path / "mps"),
                        recovery_grace=0, status_interval=0.3, sample_interval=3600, metrics_port=0,
                        metrics_addr="127.0.0.1", reconcile_interval=0, state_dir=str(tmp_path / "state"))
    a = NodeAgent(opts, backend, FilePodLookup(pods), FileStatusSink(tmp_path / "status.json"),
                  PeerVerifier(enabled=False), mps=mps)
    await a.start()
    status_task = asyncio.create_task(a._status_loop())
    yield Harness(a, tmp_path, backend, pods)
    status_task.cancel()
    await a.close()
    mps.stop()
    kill_fake_mps(tmp_path / "mps")


async def _admit(a: NodeAgent, pod: dict) -> tuple[dict, asyncio.StreamWriter]:
    r, w = await asyncio.open_unix_connection(str(a.opts.gate_socket))
    m = pod["metadata"]
    w.write(
        json.dumps({"op": "admit", "podUid": m["uid"], "podName": m["name"], "podNamespace": m["namespace"]}).encode()
        + b"\n"
    )
    while True:
        msg = json.loads(await asyncio.wait_for(r.readline(), 5))
        if msg["status"] != "queued":
            return msg, w


async def _until(cond, timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


def _status(h: Harness) -> GPUNodeStatus:
    return GPUNodeStatus.model_validate(json.loads((h.tmp / "status.json").read_text())["status"])


def _metrics(a: NodeAgent) -> str:
    assert a.metrics_server is not None
    port = a.metrics_server.server_port
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


@pytest.mark.asyncio
async def test_status_metrics_health_and_observed_peak(agent: Harness) -> None:
    h, node = agent, agent.a
    s = _status(h)
    assert s.node_name == "node-a" and s.mps.healthy and len(s.gpus) == 2
    assert read_status_file(status_file_path(h.tmp / "state")) == s  # the device plugin's copy ...
    assert not status_file_path(h.tmp / "mps").exists()  # ... not in the pipe directory every client can write
    g0 = s.gpus[0]
    assert g0.model == "A100-80GB" and g0.total_bytes == 80 * GiB and g0.reserve_bytes == 4 * GiB
    assert g0.max_clients == 3 and g0.committed_bytes == 0

    pods = [job_pod(f"p{i}", 20 * GiB, runtime=100) for i in range(3)]
    add_pods(h.pods, [p for p, _ in pods], [j for _, j in pods])
    msg, w0 = await _admit(node, pods[0][0])
    assert msg["status"] == "admitted" and msg["gpuIndex"] == 0
    # GPU 1 fails: nothing new lands there, and the status says so.
    h.fake.set_healthy(1, False, "xid 79")
    await node._sample()
    msg, w1 = await _admit(node, pods[1][0])
    assert msg["gpuIndex"] == 0
    await asyncio.sleep(0.7)
    s = _status(h)
    assert not s.gpus[1].healthy and s.gpus[0].committed_bytes == 40 * GiB
    assert [j.name for j in s.gpus[0].running] == ["p0", "p1"]
    # the gate's own seconds left (Books.seconds_left): the predicted 100 s from when its GPU work is predicted to
    # start, after the start-up the gate assumes (policies.STARTUP_SECONDS)
    assert all(0 < (j.predicted_remaining_seconds or 0) <= 100 + STARTUP_SECONDS for j in s.gpus[0].running)

    # Observed peak: the driver attributes memory to the client's pid (our pid: the in-process client).
    h.fake.add_process(0, os.getpid(), 17 * GiB)
    await node._sample()
    assert node.gate is not None and set(node.gate.pids.values()) == {os.getpid()}, node.gate.pids
    text = _metrics(node)
    assert 'gnnsched_gpu_memory_committed_bytes{gpu="0"' in text
    assert "gnnsched_gate_queue_length 0.0" in text and "gnnsched_mps_daemon_up 1.0" in text
    assert 'gnnsched_job_observed_peak_bytes{namespace="default",pod="p0"} 1.8253611008e+10' in text
    assert 'gnnsched_gpu_healthy{gpu="1"' in text
    assert node.metrics_server is not None
    port = node.metrics_server.server_port
    assert urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).read() == b"ok\n"
    assert urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5).read() == b"ready\n"
    # The observed peak is on the pod while it runs (written by the sampler, never lowered).
    ann = json.loads(h.pods.read_text())["pods"][0]["metadata"]["annotations"]
    assert ann[ANN_OBSERVED_PEAK_BYTES] == str(17 * GiB)
    w0.close()
    await _until(lambda: node.gate is not None and len(node.gate.books.running) == 1)
    text = _metrics(node)
    assert "gnnsched_job_prediction_error_ratio_count 1.0" in text
    assert "gnnsched_job_prediction_error_ratio_bucket{le=\"0.9\"} 1.0" in text  # 17/20 = 0.85
    w1.close()


@pytest.mark.asyncio
async def test_mps_down_blocks_admission_until_restarted(agent: Harness) -> None:
    h, node = agent, agent.a
    pod, job = job_pod("m", 10 * GiB)
    add_pods(h.pods, [pod], [job])
    assert node.mps is not None
    (h.tmp / "mps" / "fail-start").touch()
    os.kill(int((h.tmp / "mps" / "fake-mps.pid").read_text()), signal.SIGKILL)
    await asyncio.to_thread(node.mps.check)
    assert not node.mps.healthy
    await node._sample()
    r, w = await asyncio.open_unix_connection(str(node.opts.gate_socket))
    m = pod["metadata"]
    w.write(
        json.dumps({"op": "admit", "podUid": m["uid"], "podName": m["name"], "podNamespace": m["namespace"]}).encode()
        + b"\n"
    )
    assert json.loads(await asyncio.wait_for(r.readline(), 5))["status"] == "queued"
    (h.tmp / "mps" / "fail-start").unlink()
    await asyncio.to_thread(node.mps.check)
    assert node.mps.healthy and node.mps.restarts >= 1
    await node._sample()
    assert json.loads(await asyncio.wait_for(r.readline(), 5))["status"] == "admitted"
    assert "gnnsched_mps_daemon_restarts" in _metrics(node)
    w.close()


def _cli(*args: str, env: dict | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "gnnsched"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "gnnsched.cli"]
    return subprocess.run(cmd + list(args), capture_output=True, text=True, env=env, timeout=timeout, cwd="/")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["node-agent", "--policy", "fifo"], "--policy: 'fifo' is not one of base|lmcf|bmc|sqtf|bqt"),
        (["node-agent", "--reserve-bytes", "lots"], "--reserve-bytes:"),
        (["node-agent", "--reserve-fraction", "1.5"], "--reserve-fraction: must be in [0, 1)"),
        (["node-agent", "--max-clients-per-gpu", "49"], "--max-clients-per-gpu: must be in 1..48"),
        (["node-agent", "--bypass-limit", "-1"], "--bypass-limit: must be >= 0"),
        (["node-agent", "--active-thread-percentage", "0"], "--active-thread-percentage"),
        (["node-agent", "--gpus", "fake:two"], "--gpus"),
    ],
)
def test_cli_bad_flags(args: list[str], needle: str) -> None:
    cp = _cli(*args)
    assert cp.returncode == 2, cp.stderr
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], cp.stderr


def test_cli_help_documents_the_backfill_flag() -> None:
    cp = _cli("node-agent", "--help", env=dict(os.environ, COLUMNS="200", TERM="dumb", NO_COLOR="1"))
    assert cp.returncode == 0, cp.stderr
    text = " ".join(cp.stdout.split())
    assert "--bypass-limit" in text and "strict prefix" in text


def test_cli_nvml_unavailable_is_one_line(tmp_path) -> None:
    cp = _cli("node-agent", "--gpus", "nvml", "--pods-file", str(tmp_path / "p"), "--status-file", str(tmp_path / "s"))
    if cp.returncode == 0:  # pragma: no cover - a machine with a driver
        pytest.skip("NVML is available here")
    assert cp.returncode == 1
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == 1 and "NVML" in lines[0] and "fake:" in lines[0]


def test_gate_client_errors(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GNNSCHED_")}
    cp = _cli("gate", "--", "true", env=env)
    assert (
        cp.returncode == 2
        and cp.stderr.strip() == "error: GNNSCHED_POD_UID: not set (the pod's downward API must provide it)"
    )
    env.update(GNNSCHED_POD_UID="u", GNNSCHED_POD_NAME="n", GNNSCHED_POD_NAMESPACE="d")
    cp = _cli("gate", "--", env=env)
    assert cp.returncode == 2 and "COMMAND: missing" in cp.stderr
    cp = _cli("gate", "--socket", str(tmp_path / "none.sock"), "--wait-seconds", "0.3", "--", "true", env=env)
    assert cp.returncode == 4 and "no node agent at" in cp.stderr


@pytest.mark.asyncio
async def test_live_memory_check(agent: Harness) -> None:
    """Second check: a GPU the books call empty but the driver reports nearly full admits nothing until it frees."""
    h, node = agent, agent.a
    pod, job = job_pod("live", 30 * GiB)
    add_pods(h.pods, [pod], [job])
    for i in (0, 1):
        h.fake.set_used_bytes(i, 60 * GiB)  # someone outside the gate holds 60 of 80 GiB on both GPUs
    await node._sample()
    r, w = await asyncio.open_unix_connection(str(node.opts.gate_socket))
    m = pod["metadata"]
    w.write(
        json.dumps({"op": "admit", "podUid": m["uid"], "podName": m["name"], "podNamespace": m["namespace"]}).encode()
        + b"\n"
    )
    assert json.loads(await asyncio.wait_for(r.readline(), 5))["status"] == "queued"
    h.fake.set_used_bytes(1, 10 * GiB)
    await node._sample()  # memory came back on GPU 1: the sampler triggers a decision
    msg = json.loads(await asyncio.wait_for(r.readline(), 5))
    assert msg["status"] == "admitted" and msg["gpuIndex"] == 1
    w.close()
