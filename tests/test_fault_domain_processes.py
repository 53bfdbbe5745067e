"""MPS's fault domain with real processes: a real ``gnnsched node-agent`` reading the driver through the real
``pynvml`` binding (against the stand-in ``libnvidia-ml.so.1`` in tests/fake_nvml, whose state file plays the GPU:
its per-process memory and an Xid event), the fake ``nvidia-cuda-mps-control`` on PATH, and three gated workloads
co-located on the node's one GPU, each a process behind ``gnnsched gate``.

The test plays kubelet: when a workload exits it writes the pod's container status (exit code, log tail as the
termination message, as ``FallbackToLogsOnError`` does). A fatal Xid on the GPU → the agent drains it; one client dies
with an error of its own, two with ``cudaErrorMpsClientTerminated``; the agent marks one suspect and two victims, and a
fourth pod is not admitted until the clients are gone *and* MPS answers its probe again.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from fake_mps import stop_agent
from gate_helpers import GiB, job_pod, write_pods
from gate_helpers import gnnsched_command as _gnnsched

from gnnsched.closed_loop import FaultRecord
from gnnsched.contract import (
    ANN_FAULT,
    ANN_OBSERVED_PEAK_BYTES,
    ENV_POD_NAME,
    ENV_POD_NAMESPACE,
    ENV_POD_UID,
)
from gnnsched.node_agent.identity import FilePodLookup

pytestmark = [pytest.mark.timeout(180), pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="Linux pidfd")]

FAKES = Path(__file__).parent / "fakes"
SOURCE = Path(__file__).parent / "fake_nvml" / "fake_nvml.c"
UUID = "GPU-11111111-2222-3333-4444-555555555555"
GPU_LINE = f"gpu {UUID} NVIDIA-A100-SXM4-80GB {80 * GiB} 0 -1 -1\n"

# Records that it started (its pid: the gate execs in place, so it is the pid the agent saw), waits for its go file,
# then ends the way its argv says: the error text on stderr (the log tail kubelet would keep) and the exit code.
WORKLOAD = r"""
import os, sys, time
out, key, code, text = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
with open(os.path.join(out, key + ".started"), "w") as f:
    f.write(f"{os.getpid()} {os.environ.get('CUDA_VISIBLE_DEVICES')}")
while not os.path.exists(os.path.join(out, key + ".go")):
    time.sleep(0.02)
sys.stderr.write(text + "\n")
sys.exit(code)
"""

ENDINGS = {
    "co0": (1, "RuntimeError: CUDA error: an illegal memory access was encountered"),
    "co1": (1, "RuntimeError: CUDA error: cudaErrorMpsClientTerminated: the MPS client has been terminated"),
    "co2": (1, "RuntimeError: CUDA error: cudaErrorMpsClientTerminated: the MPS client has been terminated"),
    "late": (0, ""),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _text(path: Path) -> str:
    """A file another process writes: empty until it exists (it may exist before its content is written)."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def _until(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def libdir(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.skip("gcc not available")
    d = tmp_path_factory.mktemp("nvml")
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", str(d / "libnvidia-ml.so.1"),
                    str(SOURCE)], check=True, capture_output=True, timeout=120)
    return d


def test_fatal_fault_two_victims_one_suspect_nothing_admitted_until_clients_gone_and_mps_answers(libdir, tmp_path):
    state = tmp_path / "nvml-state"
    state.write_text(GPU_LINE)
    pods_file = tmp_path / "pods.json"
    pods = {name: job_pod(name, 10 * GiB) for name in ("co0", "co1", "co2", "late")}
    write_pods(pods_file, [p for p, _ in pods.values()], [j for _, j in pods.values()])
    env = dict(os.environ, PATH=f"{FAKES}{os.pathsep}{os.environ['PATH']}", GNNSCHED_FAKE_NVML_STATE=str(state))
    env["LD_LIBRARY_PATH"] = f"{libdir}:{env['LD_LIBRARY_PATH']}" if env.get("LD_LIBRARY_PATH") else str(libdir)
    sock, port, pipe = tmp_path / "gate.sock", _free_port(), tmp_path / "mps"
    events = tmp_path / "events.jsonl"
    logs = []  # stderr files of the processes started here, closed at the end
    logs.append((tmp_path / "agent.log").open("w"))
    agent = subprocess.Popen(
        _gnnsched()
        + [
            "node-agent",
            "--gpus",
            "nvml",
            "--node-name",
            "node-a",
            "--gate-socket",
            str(sock),
            "--pods-file",
            str(pods_file),
            "--status-file",
            str(tmp_path / "status.json"),
            "--state-dir",
            str(tmp_path / "state"),
            "--event-log",
            str(events),
            "--jobs-uid",
            str(os.getuid()),
            "--reserve-bytes",
            "2Gi",
            "--mps",
            "on",
            "--mps-pipe-dir",
            str(pipe),
            "--mps-log-dir",
            str(tmp_path / "mps-log"),
            "--peer-check",
            "off",
            "--recovery-grace",
            "0",
            "--status-interval",
            "0.3",
            "--metrics-port",
            str(port),
            "--metrics-addr",
            "127.0.0.1",
            "--log-level",
            "warning",
        ],
        env=env,
        cwd=tmp_path,
        stderr=logs[0],
    )
    workloads: dict[str, subprocess.Popen] = {}

    def launch(name: str) -> subprocess.Popen:
        m = pods[name][0]["metadata"]
        code, text = ENDINGS[name]
        wenv = dict(env, **{ENV_POD_UID: m["uid"], ENV_POD_NAME: m["name"], ENV_POD_NAMESPACE: m["namespace"]})
        cmd = _gnnsched() + ["gate", "--socket", str(sock), "--", sys.executable, "-S", "-c", WORKLOAD,
                             str(tmp_path), name, str(code), text]
        logs.append((tmp_path / f"{name}.err").open("w"))
        p = subprocess.Popen(cmd, env=wenv, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=logs[-1])
        workloads[name] = p
        return p

    def annotations(name: str) -> dict[str, str]:
        data = json.loads(pods_file.read_text())
        return next(p for p in data["pods"] if p["metadata"]["name"] == name)["metadata"].get("annotations", {})

    def kubelet_reports(name: str) -> None:
        code = workloads[name].returncode
        log_tail = (tmp_path / f"{name}.err").read_text()[-2048:]

        def change(data: dict) -> None:
            for p in data["pods"]:
                if p["metadata"]["name"] == name:
                    p["status"] = {"phase": "Failed" if code else "Succeeded", "containerStatuses": [
                        {"name": "main", "state": {"terminated": {"exitCode": code, "message": log_tail}}}]}

        FilePodLookup(pods_file).mutate(change)

    def metric(name: str, labels: str = "") -> float | None:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        for line in text.splitlines():
            if line.startswith(name + labels + " ") or (not labels and line.startswith(name + " ")):
                return float(line.rsplit(" ", 1)[1])
        return None

    try:
        _until(sock.exists, 30, "the agent's socket")
        for name in ("co0", "co1", "co2"):
            launch(name)
        _until(lambda: all((tmp_path / f"{n}.started").exists() for n in ("co0", "co1", "co2")), 30, "admission")
        pids = {n: int((tmp_path / f"{n}.started").read_text().split()[0]) for n in ("co0", "co1", "co2")}
        assert {(tmp_path / f"{n}.started").read_text().split()[1] for n in pids} == {UUID}  # co-located

        # The driver sees the three MPS clients (2, 3 and 4 GiB), then a fatal Xid on the GPU.
        procs = "".join(f"proc 0 {pid} {(2 + i) * GiB} mps\n" for i, pid in enumerate(pids.values()))
        state.write_text(GPU_LINE + procs)
        _until(lambda: annotations("co2").get(ANN_OBSERVED_PEAK_BYTES) == str(4 * GiB), 30, "the observed peak")
        state.write_text(GPU_LINE + procs + "xid 0 43\n")
        _until(lambda: json.loads((tmp_path / "status.json").read_text())["status"]["gpus"][0].get("draining"), 30,
               "the GPU to drain")
        status = json.loads((tmp_path / "status.json").read_text())["status"]["gpus"][0]
        assert status["drainingReason"] == "Xid" and status["drainingXid"] == 43 and status["mpsHealthy"] is False
        assert metric("gnnsched_gpu_faults_total", '{gpu="0",reason="Xid"}') == 1.0

        launch("late")  # 10 GiB would fit beside the others, and MPS is up: only the drain keeps it out
        _until(lambda: "queued" in (tmp_path / "late.err").read_text(), 30, "the late pod to queue")
        time.sleep(2.5)  # more than one sample of the agent
        assert not (tmp_path / "late.started").exists()
        (pipe / "fail-commands").touch()  # from now on MPS does not answer its probe

        # The clients die: one with an error of its own, two terminated by MPS (810). kubelet reports each.
        for name in ("co0", "co1", "co2"):
            (tmp_path / f"{name}.go").touch()
        for name in ("co0", "co1", "co2"):
            workloads[name].wait(30)
            assert workloads[name].returncode == 1
            kubelet_reports(name)
        state.write_text(GPU_LINE)  # the driver no longer lists them
        _until(lambda: all(ANN_FAULT in annotations(n) for n in ("co0", "co1", "co2")), 60, "the fault records")
        records = {n: FaultRecord.model_validate_json(annotations(n)[ANN_FAULT]) for n in ("co0", "co1", "co2")}
        assert records["co0"].role == "suspect" and records["co0"].reason == "ClientFault"
        assert records["co1"].role == records["co2"].role == "victim"
        assert {r.gpu for r in records.values()} == {UUID} and {r.xid for r in records.values()} == {43}

        # Clients gone, MPS still not answering: nothing is admitted (several samples of the agent pass).
        time.sleep(6)
        assert not (tmp_path / "late.started").exists()
        assert workloads["late"].poll() is None
        assert json.loads((tmp_path / "status.json").read_text())["status"]["gpus"][0].get("draining")

        (pipe / "fail-commands").unlink()  # MPS answers again: the drain ends and the waiting pod starts
        _until(lambda: len(_text(tmp_path / "late.started").split()) > 1, 60, "the late pod's admission")
        assert (tmp_path / "late.started").read_text().split()[1] == UUID
        kinds = [json.loads(line)["event"] for line in events.read_text().splitlines()]
        assert kinds.count("fault") == 1 and kinds.count("fault-role") == 3 and "drained" in kinds
        assert kinds.index("drained") > max(i for i, k in enumerate(kinds) if k == "fault-role")
        assert metric("gnnsched_fault_pods_total", '{role="suspect"}') == 1.0
        assert metric("gnnsched_fault_pods_total", '{role="victim"}') == 2.0
        (tmp_path / "late.go").touch()
        workloads["late"].wait(30)
    finally:
        for p in workloads.values():
            if p.poll() is None:
                p.kill()
        stop_agent(agent, pipe)
        for handle in logs:
            handle.close()
