"""The memory loop's first half with real processes: a real ``gnnsched node-agent --gpus fake:... --fake-gpu-memory
enforce:1.3`` and ``gnnsched gate -- gnnsched worker JOB`` as a job's pod runs it. The agent hands the fake GPU's limit
enforcement to the admitted worker, which then fails with PyTorch's CUDA OOM once its device bytes (1.3x what the
CPU counts, so 1.3x its byte-exact estimate) pass the MPS limit the gate set: a ``memory-exceeded`` result line in
its termination file. The same job admitted 1.5x larger (the operator's default growth) succeeds."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from fake_mps import start_agent, stop_agent
from gate_helpers import gnnsched_command as _gnnsched
from gate_helpers import job_pod, run_gated_worker, write_pods

from gnnsched.closed_loop import AttemptResult
from gnnsched.estimator import estimate
from gnnsched.spec import load_job

pytestmark = [pytest.mark.timeout(240), pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="Linux pidfd")]

FAKES = Path(__file__).parent / "fakes"
JOB = """apiVersion: gnnsched.io/v1alpha1
kind: GNNJob
metadata: {name: j}
spec:
  mode: train
  model: {arch: gcn, layers: 2, hidden: 16}
  graph: {nodes: 2000, edges: 16000, features: 32, classes: 4}
  epochs: 2
"""


def test_worker_behind_the_gate_on_a_fake_gpu_reports_memory_exceeded_then_succeeds_larger(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    need = estimate(load_job(job).spec).pmc_bytes  # byte-exact on the CPU
    small, small_job = job_pod("small", need)
    large, large_job = job_pod("large", need * 3 // 2)
    pods_file = tmp_path / "pods.json"
    write_pods(pods_file, [small, large], [small_job, large_job])
    env = dict(os.environ, PATH=f"{FAKES}{os.pathsep}{os.environ['PATH']}")
    sock, pipe = tmp_path / "gate.sock", tmp_path / "mps"
    agent = start_agent(_gnnsched() + [
        "node-agent", "--gpus", "fake:1x80Gi", "--fake-gpu-memory", "enforce:1.3", "--node-name", "node-a",
        "--gate-socket", str(sock), "--pods-file", str(pods_file), "--status-file", str(tmp_path / "status.json"),
        "--state-dir", str(tmp_path / "state"), "--jobs-uid", str(os.getuid()), "--reserve-bytes", "1Gi",
        "--mps", "on", "--mps-pipe-dir", str(pipe), "--mps-log-dir", str(tmp_path / "mps-log"), "--peer-check",
        "off", "--recovery-grace", "0", "--metrics-port", "-1", "--log-level", "warning",
    ], env, tmp_path, sock, tmp_path / "agent.log", pipe)
    try:
        results = {}
        for pod in (small, large):
            run, result_file = run_gated_worker(tmp_path, env, sock, job, pod)
            results[pod["metadata"]["name"]] = (run.returncode,
                                                AttemptResult.model_validate_json(result_file.read_text()), run.stderr)
    finally:
        stop_agent(agent, pipe)
    code, small_result, stderr = results["small"]
    mib = 2**20
    assert code == 1 and small_result.outcome == "memory-exceeded", stderr
    assert small_result.limit_bytes == need // mib * mib  # the gate's MPS limit, rounded down to MiB
    assert small_result.held_bytes is not None and small_result.held_bytes <= small_result.limit_bytes
    assert small_result.limit_bytes < (small_result.needed_bytes() or 0)
    code, large_result, stderr = results["large"]
    assert code == 0 and large_result.outcome == "succeeded", stderr
    assert large_result.observed_peak_bytes == pytest.approx(1.3 * need, rel=0.01)
    assert json.loads(json.dumps(large_result.model_dump()))["limit_bytes"] == (need * 3 // 2) // mib * mib


def test_fake_gpu_memory_flag_needs_fake_gpus(tmp_path):
    run = subprocess.run(
        _gnnsched()
        + ["node-agent", "--gpus", "nvml", "--fake-gpu-memory", "enforce", "--gate-socket", str(tmp_path / "s")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 2
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--fake-gpu-memory" in lines[0], run.stderr
    run = subprocess.run(
        _gnnsched()
        + ["node-agent", "--gpus", "fake:1x8Gi", "--fake-gpu-memory", "always", "--gate-socket", str(tmp_path / "s")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 2 and "--fake-gpu-memory" in run.stderr and "enforce" in run.stderr
