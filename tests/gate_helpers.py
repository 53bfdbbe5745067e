"""Shared helpers for the gate tests: a pods file the way the API server would show pods and GNNJobs."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from gnnsched.contract import (
    ANN_ADMIT_BYTES,
    ANN_GPU_MEMORY,
    ANN_PREDICTED_RUNTIME,
    ENV_POD_NAME,
    ENV_POD_NAMESPACE,
    ENV_POD_UID,
    ENV_RESULT_FILE,
)
from gnnsched.node_agent.identity import FilePodLookup, gnnjob_owner_reference
from gnnsched.trust.job_facts import STATUS_FIELD, facts_status

GiB = 2**30


def gnnsched_command() -> list[str]:
    """The ``gnnsched`` CLI of this interpreter's environment (its console script, else ``python -m``)."""
    exe = Path(sys.executable).parent / "gnnsched"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "gnnsched.cli"]


def run_gated_worker(tmp_path: Path, env: dict[str, str], sock: Path, job_file: Path,
                     pod: dict[str, Any]) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``gnnsched gate -- gnnsched worker JOB`` as ``pod``'s container would run it (its downward-API identity, its
    result file as the termination message); returns the finished process and the result file's path."""
    meta = pod["metadata"]
    result_file = tmp_path / f"{meta['name']}.result"
    wenv = dict(env, **{ENV_POD_UID: meta["uid"], ENV_POD_NAME: meta["name"], ENV_POD_NAMESPACE: meta["namespace"],
                        ENV_RESULT_FILE: str(result_file)})
    run = subprocess.run(gnnsched_command() + ["gate", "--socket", str(sock), "--"] + gnnsched_command()
                         + ["worker", str(job_file), "--no-progress"], env=wenv, cwd=tmp_path,
                         capture_output=True, text=True, timeout=180, check=False)
    return run, result_file


def pod_object(
    name: str,
    *,
    uid: str | None = None,
    namespace: str = "default",
    node: str = "node-a",
    admit_bytes: int | None = None,
    runtime: float | None = None,
    owner: tuple[str, str] | None = None,
    gpu_memory: str | None = None,
    phase: str = "Running",
) -> dict[str, Any]:
    ann: dict[str, str] = {}
    if admit_bytes is not None:
        ann[ANN_ADMIT_BYTES] = str(admit_bytes)
    if runtime is not None:
        ann[ANN_PREDICTED_RUNTIME] = str(runtime)
    if gpu_memory is not None:
        ann[ANN_GPU_MEMORY] = gpu_memory
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4()), "annotations": ann}
    if owner is not None:
        meta["ownerReferences"] = [gnnjob_owner_reference(owner[0], owner[1])]
    return {"metadata": meta, "spec": {"nodeName": node}, "status": {"phase": phase}}


def job_pod(name: str, admit_bytes: int, runtime: float | None = None, **kw: Any) -> tuple[dict, dict]:
    """A pod owned by a GNNJob (and that GNNJob), as the operator creates them: the job's ``status.podFacts`` names
    the pod with the facts on its annotations (``gnnsched.trust.job_facts``). Annotations added to the pod later by
    a test are the pod's own; call :func:`name_in_status` after such a change to have the job's status say it too."""
    job_uid = str(uuid.uuid4())
    job = {"metadata": {"name": f"job-{name}", "namespace": kw.get("namespace", "default"), "uid": job_uid}}
    pod = pod_object(name, admit_bytes=admit_bytes, runtime=runtime, owner=(f"job-{name}", job_uid), **kw)
    name_in_status(job, pod)
    return pod, job


def name_in_status(job: dict, pod: dict) -> dict:
    """Write ``pod`` and its annotations' facts into ``job``'s ``status.podFacts``, as the operator does."""
    job.setdefault("status", {})[STATUS_FIELD] = facts_status(pod)
    return job


def write_pods(path: Path, pods: list[dict], jobs: list[dict]) -> None:
    """Replace the pods file (only before an agent writes to it)."""
    path.write_text(json.dumps({"pods": pods, "gnnjobs": jobs}))


def add_pods(path: Path, pods: list[dict], jobs: list[dict]) -> None:
    """Add pods the way the API server would, safely while the agent annotates others (same lock)."""

    def change(data: dict) -> None:
        data["pods"].extend(pods)
        data["gnnjobs"].extend(jobs)

    FilePodLookup(path).mutate(change)
