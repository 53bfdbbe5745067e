"""The MPS fault domain through the operator with real processes: the real ``gnnsched node-agent`` on a fake NVML GPU
(tests/fake_nvml), three co-located GNNJobs whose pods the real operator created in the emulated API server, each
running behind ``gnnsched gate``, and a fatal Xid on their GPU.

The test plays kubelet and the agent's API writes: when a workload exits it reports the container status both to the
agent (the pods file) and to the emulated API server, *before* the agent's fault records exist, then relays the
records the agent wrote. So it also checks that the operator waits for a record that lands after the failure instead
of charging the victims. Expected: the two clients terminated with 810 are requeued (``Requeued``/``CoLocatedFault``,
new attempts, ``backoffLimit`` untouched), the suspect is charged (its job fails with ``backoffLimit`` 0), and a pod
that arrives meanwhile is not admitted on that GPU until its clients are gone and MPS answers again.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from fake_mps import stop_agent
from gate_helpers import GiB, job_pod, write_pods
from gate_helpers import gnnsched_command as _gnnsched
from operator_harness import Cluster, emulated_cluster, running_operator, wait_for

from gnnsched.closed_loop import FaultRecord
from gnnsched.contract import (
    ANN_ADMIT_BYTES,
    ANN_FAULT,
    ENV_POD_NAME,
    ENV_POD_NAMESPACE,
    ENV_POD_UID,
    JOB_CONTAINER_NAME,
)
from gnnsched.node_agent.identity import FilePodLookup

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(240),
              pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="Linux pidfd")]
pytest.importorskip("gnnsched.estimator")

FAKES = Path(__file__).parent / "fakes"
SOURCE = Path(__file__).parent / "fake_nvml" / "fake_nvml.c"
UUID = "GPU-11111111-2222-3333-4444-555555555555"
GPU_LINE = f"gpu {UUID} NVIDIA-A100-SXM4-80GB {80 * GiB} 0 -1 -1\n"
SPEC = {"mode": "train", "model": {"arch": "gcn", "layers": 2, "hidden": 16},
        "graph": {"nodes": 2000, "edges": 16000, "features": 32, "classes": 4}, "epochs": 2}

# Records its start (pid, GPU), waits for its go file, then ends as its argv says (error text on stderr, exit code).
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
MPS_810 = "RuntimeError: CUDA error: cudaErrorMpsClientTerminated: the MPS client has been terminated"
ENDINGS = {
    "co0": (1, "RuntimeError: CUDA error: an illegal memory access was encountered"),
    "co1": (1, MPS_810),
    "co2": (1, MPS_810),
    "late": (0, ""),
}
JOBS = ("co0", "co1", "co2")


def _until(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def libdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc not available")
    d = tmp_path_factory.mktemp("nvml")
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", str(d / "libnvidia-ml.so.1"),
                    str(SOURCE)], check=True, capture_output=True, timeout=120)
    return d


async def _pod(cluster: Cluster, name: str) -> dict[str, Any]:
    async def find() -> Any:
        return next((p for p in await cluster.pods() if p["metadata"]["name"] == name), None)
    return await wait_for(find, 60, what=f"pod {name}")


def _agent(tmp_path: Path, env: dict[str, str], pods_file: Path, log: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(_gnnsched() + [
        "node-agent", "--gpus", "nvml", "--node-name", "node-a", "--gate-socket", str(tmp_path / "gate.sock"),
        "--pods-file", str(pods_file), "--status-file", str(tmp_path / "status.json"), "--state-dir",
        str(tmp_path / "state"), "--jobs-uid", str(os.getuid()), "--reserve-bytes", "2Gi", "--mps", "on",
        "--mps-pipe-dir", str(tmp_path / "mps"), "--mps-log-dir", str(tmp_path / "mps-log"), "--peer-check", "off",
        "--recovery-grace", "0", "--status-interval", "0.3", "--metrics-port", "-1", "--log-level", "warning",
    ], env=env, cwd=tmp_path, stderr=log)


async def test_fault_through_the_operator_requeues_two_victims_and_charges_the_suspect(libdir: Path,
                                                                                      tmp_path: Path) -> None:
    from gnnsched.operator.planning import Planner

    state, pods_file, sock, pipe = tmp_path / "nvml-state", tmp_path / "pods.json", tmp_path / "gate.sock", \
        tmp_path / "mps"
    state.write_text(GPU_LINE)
    env = dict(os.environ, PATH=f"{FAKES}{os.pathsep}{os.environ['PATH']}", GNNSCHED_FAKE_NVML_STATE=str(state))
    env["LD_LIBRARY_PATH"] = f"{libdir}:{env['LD_LIBRARY_PATH']}" if env.get("LD_LIBRARY_PATH") else str(libdir)
    gpu = {"index": 0, "uuid": UUID, "model": "A100-80GB", "totalBytes": 80 * GiB, "reserveBytes": 2 * GiB,
           "healthy": True, "mpsHealthy": True, "maxClients": 48, "running": [], "queued": []}
    workloads: dict[str, subprocess.Popen[bytes]] = {}
    logs: list[Any] = []
    metas: dict[str, dict[str, Any]] = {}

    def launch(name: str, meta: dict[str, Any]) -> None:
        code, text = ENDINGS[name]
        wenv = dict(env, **{ENV_POD_UID: meta["uid"], ENV_POD_NAME: meta["name"],
                            ENV_POD_NAMESPACE: meta["namespace"]})
        logs.append((tmp_path / f"{name}.err").open("w"))
        workloads[name] = subprocess.Popen(
            _gnnsched() + ["gate", "--socket", str(sock), "--", sys.executable, "-S", "-c", WORKLOAD,
                           str(tmp_path), name, str(code), text],
            env=wenv, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=logs[-1])

    def agent_annotations(pod_name: str) -> dict[str, str]:
        data = json.loads(pods_file.read_text())
        return next(p for p in data["pods"] if p["metadata"]["name"] == pod_name)["metadata"].get("annotations", {})

    def terminated(name: str) -> dict[str, Any]:
        code = workloads[name].returncode
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {"phase": "Failed" if code else "Succeeded", "containerStatuses": [
            {"name": JOB_CONTAINER_NAME, "state": {"terminated": {
                "exitCode": code, "reason": "Error" if code else "Completed", "finishedAt": now,
                "message": (tmp_path / f"{name}.err").read_text()[-2048:]}}}]}

    def kubelet_to_agent(pod_name: str, status: dict[str, Any]) -> None:
        def change(data: dict[str, Any]) -> None:
            for p in data["pods"]:
                if p["metadata"]["name"] == pod_name:
                    p["status"] = status
        FilePodLookup(pods_file).mutate(change)

    async with emulated_cluster(tmp_path) as cluster:
        await cluster.add_gpunode("node-a", [gpu])
        async with running_operator(cluster, planner=Planner(default_gpu_model="A100-80GB", estimate_device="cpu")):
            for name in JOBS:  # backoffLimit 0: a charged attempt fails its job
                await cluster.create_job({"apiVersion": "gnnsched.io/v1alpha1", "kind": "GNNJob",
                                          "metadata": {"name": name}, "spec": SPEC})
            jobs = []
            for name in JOBS:
                async def job_exists(job_name: str = name) -> Any:
                    return await cluster.get_job(job_name)
                jobs.append(await wait_for(job_exists, 30, what=f"job {name}"))
            bound = []
            for name in JOBS:
                pod = await _pod(cluster, f"{name}-0")
                metas[name] = pod["metadata"]
                bound.append({**pod, "spec": {**pod["spec"], "nodeName": "node-a"}})  # as the scheduler binds it
            jobs = []  # as they are once the operator named each pod in its status (the agent reads its facts there)
            for name in JOBS:
                async def named(job_name: str = name) -> Any:
                    job = await cluster.get_job(job_name)
                    return job if ((job or {}).get("status") or {}).get("podFacts") else None
                jobs.append(await wait_for(named, 30, what=f"job {name}'s podFacts"))
            late_pod, late_job = job_pod("late", 10 * GiB)
            write_pods(pods_file, [*bound, late_pod], [*jobs, late_job])
            logs.append((tmp_path / "agent.log").open("w"))
            agent = _agent(tmp_path, env, pods_file, logs[-1])
            try:
                await asyncio.to_thread(_until, sock.exists, 30, "the agent's socket")
                for name in JOBS:
                    launch(name, metas[name])
                await asyncio.to_thread(_until, lambda: all((tmp_path / f"{n}.started").exists() for n in JOBS),
                                        30, "admission")
                pids = {n: int((tmp_path / f"{n}.started").read_text().split()[0]) for n in JOBS}
                assert {(tmp_path / f"{n}.started").read_text().split()[1] for n in JOBS} == {UUID}  # co-located
                # Each client holds part of what its pod was admitted with (the operator's plan for this tiny graph
                # is a few MiB): a client the driver sees over admitted + margin is stopped by the agent
                # (node_agent/overrun.py) before the fault, and would end as a victim of that stop, not of the Xid.
                admitted = {n: int(metas[n]["annotations"][ANN_ADMIT_BYTES]) for n in JOBS}
                procs = "".join(f"proc 0 {pids[n]} {admitted[n] * (2 + i) // 5} mps\n" for i, n in enumerate(JOBS))
                state.write_text(GPU_LINE + procs + "xid 0 43\n")  # three MPS clients, then a fatal Xid

                def draining() -> bool:
                    return bool(json.loads((tmp_path / "status.json").read_text())["status"]["gpus"][0]
                                .get("draining")) if (tmp_path / "status.json").exists() else False
                await asyncio.to_thread(_until, draining, 30, "the GPU to drain")
                launch("late", late_pod["metadata"])  # fits beside the others: only the drain keeps it out
                await asyncio.to_thread(_until, lambda: "queued" in (tmp_path / "late.err").read_text(), 30,
                                        "the late pod to queue")
                (pipe / "fail-commands").touch()  # from now on MPS does not answer its probe

                for name in JOBS:  # the clients die; kubelet reports each to the agent and the API server
                    (tmp_path / f"{name}.go").touch()
                for name in JOBS:
                    await asyncio.to_thread(workloads[name].wait, 30)
                    status = terminated(name)
                    kubelet_to_agent(f"{name}-0", status)
                    await cluster.patch_pod(f"{name}-0", {"status": status})
                state.write_text(GPU_LINE)  # the driver no longer lists them
                await asyncio.sleep(2.5)  # the operator sees the failures before any fault record
                early = {name: await cluster.get_job(name) for name in JOBS}
                await asyncio.to_thread(
                    _until, lambda: all(ANN_FAULT in agent_annotations(f"{n}-0") for n in JOBS), 60,
                    "the fault records")
                records = {n: agent_annotations(f"{n}-0")[ANN_FAULT] for n in JOBS}
                for name in JOBS:  # the agent's annotation reaches the API server
                    await cluster.patch_pod(f"{name}-0", {"metadata": {"annotations": {ANN_FAULT: records[name]}}})
                for name in ("co1", "co2"):
                    await _pod(cluster, f"{name}-1")

                async def suspect_failed() -> Any:
                    job = await cluster.get_job("co0")
                    return job if job and job["status"].get("phase") == "Failed" else None
                suspect = await wait_for(suspect_failed, 60, what="the suspect's job charged")
                victims = {name: await cluster.get_job(name) for name in ("co1", "co2")}
                names = sorted(p["metadata"]["name"] for p in await cluster.pods())

                # clients gone, MPS not answering: still nothing admitted on that GPU
                await asyncio.sleep(3)
                late_before = (tmp_path / "late.started").exists()
                (pipe / "fail-commands").unlink()  # MPS answers again: the drain ends, the waiting pod starts
                await asyncio.to_thread(_until, lambda: (tmp_path / "late.started").exists(), 60, "late admission")
                (tmp_path / "late.go").touch()
                await asyncio.to_thread(workloads["late"].wait, 30)
            finally:
                for p in workloads.values():
                    if p.poll() is None:
                        p.kill()
                stop_agent(agent, pipe)
                for handle in logs:
                    handle.close()
    roles = {n: FaultRecord.model_validate_json(records[n]).role for n in JOBS}
    assert roles == {"co0": "suspect", "co1": "victim", "co2": "victim"}
    for name, job in early.items():  # nothing decided while the records were missing
        assert job is not None and job["status"].get("phase") != "Failed" and not job["status"].get("requeues"), name
    for name, job in victims.items():
        assert job is not None, name
        status = job["status"]
        requeued = next(c for c in status["conditions"] if c["type"] == "Requeued")
        assert requeued["reason"] == "CoLocatedFault" and UUID in requeued["message"], name
        assert status["requeues"] == 1 and status.get("retriesUsed") is None and status["phase"] != "Failed", name
    assert suspect["status"]["suspected"] == 1 and not suspect["status"].get("requeues")
    assert names == ["co0-0", "co1-0", "co1-1", "co2-0", "co2-1"]
    assert not late_before
