"""The whole memory loop with real processes, through the operator: the real operator (kopf, emulated API server)
plans a job and creates its pod; a real ``gnnsched node-agent`` on a fake GPU that enforces the MPS limit on 1.3x the
bytes the CPU counts, and ``gnnsched gate -- gnnsched worker``, run that pod as the kubelet would; the worker's
result file becomes the pod's termination message. A job whose real footprint is 1.3x its estimate ends ``Succeeded``
after exactly one resize.

The operator plans with ``estimate_device="cpu"`` (byte-exact here, safety factor 1.02) because the fake GPU scales
what the CPU counts: so the first reservation is really too small by about 1.3 / 1.02, as a misestimate on a GPU.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from fake_mps import stop_agent
from gate_helpers import gnnsched_command as _gnnsched
from gate_helpers import run_gated_worker, write_pods
from operator_harness import Cluster, GiB, emulated_cluster, running_operator, wait_for

from gnnsched.closed_loop import AttemptResult
from gnnsched.contract import (
    ANN_ADMIT_BYTES,
)
from gnnsched.node_agent.identity import FilePodLookup

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(300),
              pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="Linux pidfd")]

FAKES = Path(__file__).parent / "fakes"
SPEC = {"mode": "train", "model": {"arch": "gcn", "layers": 2, "hidden": 16},
        "graph": {"nodes": 2000, "edges": 16000, "features": 32, "classes": 4}, "epochs": 2}


async def _naming(cluster: Any, pod_name: str) -> Any:
    """The GNNJob ``j`` once its status names ``pod_name`` (the agent reads the attempt's facts there)."""
    job = await cluster.get_job("j")
    facts = ((job or {}).get("status") or {}).get("podFacts") or {}
    return job if facts.get("pod") == pod_name else None


async def _pod(cluster: Cluster, name: str) -> dict[str, Any]:
    async def find() -> Any:
        return next((p for p in await cluster.pods() if p["metadata"]["name"] == name), None)
    return await wait_for(find, 60, what=f"pod {name}")


def _run_attempt(tmp_path: Path, env: dict[str, str], sock: Path, job_file: Path, pod: dict[str, Any]) -> str:
    """``gnnsched gate -- gnnsched worker`` as the pod's container; the result file is the termination message."""
    run, result_file = run_gated_worker(tmp_path, env, sock, job_file, pod)
    assert result_file.exists(), run.stderr[-2000:]
    return result_file.read_text()


def _start_agent(tmp_path: Path, env: dict[str, str], sock: Path, pipe: Path, pods_file: Path,
                 log: Any) -> subprocess.Popen[bytes]:
    """The node agent on one fake 80 GiB GPU whose MPS limit is enforced on 1.3x the bytes the CPU counts."""
    return subprocess.Popen(_gnnsched() + [
        "node-agent", "--gpus", "fake:1x80Gi", "--fake-gpu-memory", "enforce:1.3", "--node-name", "node-a",
        "--gate-socket", str(sock), "--pods-file", str(pods_file), "--status-file", str(tmp_path / "status.json"),
        "--state-dir", str(tmp_path / "state"), "--jobs-uid", str(os.getuid()), "--reserve-bytes", "1Gi",
        "--mps", "on", "--mps-pipe-dir", str(pipe), "--mps-log-dir", str(tmp_path / "mps-log"), "--peer-check",
        "off", "--recovery-grace", "0", "--metrics-port", "-1", "--log-level", "warning",
    ], env=env, cwd=tmp_path, stderr=log)


def _terminated(message: str) -> dict[str, Any]:
    result = AttemptResult.model_validate_json(message.strip().splitlines()[-1])
    ok = result.outcome == "succeeded"
    return {"status": {"phase": "Succeeded" if ok else "Failed", "containerStatuses": [{"name": "gnn", "state": {
        "terminated": {"exitCode": 0 if ok else 1, "reason": "Completed" if ok else "Error",
                       "startedAt": "2026-01-01T10:00:00Z", "finishedAt": "2026-01-01T10:00:09Z",
                       "message": message}}}]}}


async def test_a_job_at_1_3x_its_estimate_succeeds_after_exactly_one_resize(tmp_path: Path) -> None:
    from gnnsched.operator.planning import Planner

    manifest = {"apiVersion": "gnnsched.io/v1alpha1", "kind": "GNNJob", "metadata": {"name": "j"}, "spec": SPEC}
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(manifest))
    env = dict(os.environ, PATH=f"{FAKES}{os.pathsep}{os.environ['PATH']}")
    sock, pipe, pods_file = tmp_path / "gate.sock", tmp_path / "mps", tmp_path / "pods.json"
    gpu = {"index": 0, "uuid": "GPU-fake-0", "model": "A100-80GB", "totalBytes": 80 * GiB, "reserveBytes": GiB,
           "healthy": True, "mpsHealthy": True, "maxClients": 48, "running": [], "queued": []}
    async with emulated_cluster(tmp_path) as cluster:
        await cluster.add_gpunode("node-a", [gpu])
        async with running_operator(cluster, planner=Planner(default_gpu_model="A100-80GB", estimate_device="cpu")):
            await cluster.create_job(manifest)
            first = await _pod(cluster, "j-0")
            job = await wait_for(lambda: _naming(cluster, "j-0"), 30, what="the job's status naming j-0")
            bound = {**first, "spec": {**first["spec"], "nodeName": "node-a"}}  # as the scheduler binds it
            write_pods(pods_file, [bound], [job])
            with (tmp_path / "agent.log").open("w") as agent_log:
                agent = _start_agent(tmp_path, env, sock, pipe, pods_file, agent_log)
                try:
                    async def listening() -> bool:
                        assert agent.poll() is None, (tmp_path / "agent.log").read_text()
                        return sock.exists()
                    await wait_for(listening, 30, what="the agent's gate socket")
                    first_message = await asyncio.to_thread(_run_attempt, tmp_path, env, sock, job_file, bound)
                    await cluster.patch_pod("j-0", _terminated(first_message))
                    second = await _pod(cluster, "j-1")
                    bound2 = {**second, "spec": {**second["spec"], "nodeName": "node-a"}}
                    job2 = await wait_for(lambda: _naming(cluster, "j-1"), 30, what="the job's status naming j-1")

                    def next_attempt(data: dict[str, Any]) -> None:  # the API server's current job and pods
                        data["pods"].append(bound2)
                        data["gnnjobs"] = [job2]
                    FilePodLookup(pods_file).mutate(next_attempt)
                    second_message = await asyncio.to_thread(_run_attempt, tmp_path, env, sock, job_file, bound2)
                    await cluster.patch_pod("j-1", _terminated(second_message))

                    async def finished() -> Any:
                        got = await cluster.get_job("j")
                        return got if got and got.get("status", {}).get("phase") in ("Succeeded", "Failed") else None
                    done = await wait_for(finished, 60, what="the job to finish")
                    names = sorted(p["metadata"]["name"] for p in await cluster.pods())
                finally:
                    stop_agent(agent, pipe)
    first_result = AttemptResult.model_validate_json(first_message.strip().splitlines()[-1])
    second_result = AttemptResult.model_validate_json(second_message.strip().splitlines()[-1])
    assert first_result.outcome == "memory-exceeded", first_message
    assert second_result.outcome == "succeeded", second_message
    status = done["status"]
    assert status["phase"] == "Succeeded" and status["resizes"] == 1 and status["attempts"] == 2, status
    assert names == ["j-0", "j-1"]
    assert int(second["metadata"]["annotations"][ANN_ADMIT_BYTES]) > int(
        first["metadata"]["annotations"][ANN_ADMIT_BYTES]
    )
    # the observed peak is the fake GPU's 1.3x of the CPU-exact estimate
    assert status["observedPeakRatio"] == pytest.approx(1.3, rel=0.02), json.dumps(status)
