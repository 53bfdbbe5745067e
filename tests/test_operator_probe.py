"""An entrypoint job against the emulated API server: a CPU-only, ``restricted`` probe pod first, its result recorded
in the status and cached, then the GPU pod with the probe's admit bytes; a failing probe gives ``ProbeFailed`` and a
whole-GPU run (or the declared ``gpuMemory``); a re-submission skips the probe.

The probe's result is real: the test runs the probe pod's own command (``build_probe_pod``'s argv) on the copy the
init container would install, with the example user package importable from the working directory only, and puts
its output into the pod's termination message as the kubelet does.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from crd_schema import ROOT
from operator_harness import a100, emulated_cluster, manifest, running_operator
from pod_security import restricted_violations
from test_operator import condition, job_in_phase, own_pods, wait_for

from gnnsched.contract import ANN_ADMIT_BYTES, ANN_EXCLUSIVE
from gnnsched.entrypoint_probe import estimate_from_probe, install_probe, parse_probe_result
from gnnsched.errors import FieldError
from gnnsched.gpu.catalogue import get_gpu_model
from gnnsched.operator.probe import (
    INSTALL_CONTAINER,
    PROBE_CONTAINER,
    PROBE_DIR,
    probe_settings,
    read_probe_pod,
)
from gnnsched.spec import parse_spec

EXAMPLE = ROOT / "examples" / "custom-entrypoint"
IMAGE = "registry.example/team/my-gnn@sha256:" + "ab" * 32
GRAPH = {"nodes": 2000, "edges": 16000, "features": 32, "classes": 5}
GiB = 2**30


def entrypoint_job(name: str, entrypoint: str = "my_gnn.model:build", image: str = IMAGE,
                   **changes: Any) -> dict[str, Any]:
    return manifest(name, model={"entrypoint": entrypoint}, image=image, graph=GRAPH, **changes)


def run_probe_container(pod: dict[str, Any], tmp_path: Path) -> tuple[int, str]:
    """The probe pod's two containers, run here: install into a directory standing for the emptyDir, then the probe
    container's argv with that directory in place of the mount, from the user's package directory (its image's
    working directory). Returns (exit code, termination message)."""
    volume = tmp_path / "volume"
    volume.mkdir(exist_ok=True)
    install_probe(volume)
    container = pod["spec"]["containers"][0]
    result = tmp_path / "termination-log"
    argv = [a.replace(PROBE_DIR, str(volume)).replace("/dev/termination-log", str(result))
            for a in container["command"]]
    assert argv[0] == "python"
    run = subprocess.run([sys.executable, *argv[1:]], cwd=EXAMPLE, capture_output=True, text=True, timeout=300)
    return run.returncode, result.read_text()


def terminated(phase: str, code: int, message: str, reason: str = "Completed") -> dict[str, Any]:
    return {"status": {"phase": phase, "containerStatuses": [{
        "name": PROBE_CONTAINER, "image": IMAGE, "imageID": IMAGE, "ready": False, "restartCount": 0,
        "state": {"terminated": {"exitCode": code, "reason": reason, "message": message,
                                 "startedAt": "2026-01-01T10:00:00Z", "finishedAt": "2026-01-01T10:00:09Z"}}}]}}


async def probe_pod(cluster: Any, job: str) -> dict[str, Any]:
    async def found() -> Any:
        return next((p for p in await own_pods(cluster, job) if p["metadata"]["name"] == f"{job}-probe"), None)
    return await wait_for(found, 90, what=f"{job}'s probe pod")


async def gpu_pod(cluster: Any, job: str) -> dict[str, Any]:
    async def found() -> Any:
        return next((p for p in await own_pods(cluster, job) if p["metadata"]["name"] == f"{job}-0"), None)
    return await wait_for(found, 90, what=f"{job}'s GPU pod")


@pytest.mark.asyncio
@pytest.mark.timeout(240)
async def test_probe_pod_then_gpu_pod_with_its_admit_bytes_and_a_resubmission_hits_the_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gnnsched.estimator import estimate

    async with emulated_cluster(tmp_path) as cluster:
        await cluster.add_gpunode("node-a", [a100(0)])
        async with running_operator(cluster, image="ghcr.io/gnnsched/gnnsched:test") as op:
            created = await cluster.create_job(entrypoint_job("mine"))
            probe = await probe_pod(cluster, "mine")
            waiting = await cluster.get_job("mine")
            assert waiting["status"]["phase"] == "Pending"
            assert condition(waiting, "Probed")["status"] == "Unknown"
            assert [p["metadata"]["name"] for p in await own_pods(cluster, "mine")] == ["mine-probe"]

            code, message = run_probe_container(probe, tmp_path)
            assert code == 0, message
            await cluster.patch_pod("mine-probe", terminated("Succeeded", 0, message), status_sub=True)
            pod = await gpu_pod(cluster, "mine")
            job = await job_in_phase(cluster, "mine", "Estimated")

            await cluster.create_job(entrypoint_job("again"))
            second = await gpu_pod(cluster, "again")
            again_job = await job_in_phase(cluster, "again", "Estimated")
            assert not [p for p in await own_pods(cluster, "again") if p["metadata"]["name"] == "again-probe"]
            hits = op.metrics.probes.labels("Cached")._value.get()

    # the pod: CPU only, restricted, bounded, in the job's namespace, the probe installed by gnnsched's image
    spec = probe["spec"]
    assert restricted_violations(probe) == []
    assert probe["metadata"]["namespace"] == "default"
    assert spec["activeDeadlineSeconds"] == 600 and spec["restartPolicy"] == "Never"
    assert "runtimeClassName" not in spec and spec["automountServiceAccountToken"] is False
    assert spec["initContainers"][0]["name"] == INSTALL_CONTAINER
    assert spec["initContainers"][0]["image"] == "ghcr.io/gnnsched/gnnsched:test"
    main = spec["containers"][0]
    assert main["image"] == IMAGE
    assert main["resources"]["requests"] == main["resources"]["limits"] == {"cpu": "1", "memory": "2Gi"}
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in main["env"]
    assert all("gpu" not in r for c in (*spec["initContainers"], main) for r in c["resources"]["limits"])

    # the GPU pod reserves what the probe's trace gives on the cluster's GPU model, which is the estimator's number
    result = parse_probe_result(message)
    a100_40 = get_gpu_model("A100-40GB")
    expected = estimate_from_probe(result, a100_40)
    monkeypatch.syspath_prepend(str(EXAMPLE))
    assert expected.admit_bytes == estimate(parse_spec(created["spec"]), device="cuda",
                                            gpu_model=a100_40).admit_bytes
    assert int(pod["metadata"]["annotations"][ANN_ADMIT_BYTES]) == expected.admit_bytes
    assert pod["spec"]["containers"][0]["image"] == IMAGE
    assert job["status"]["probe"]["state"] == "Succeeded" and job["status"]["probe"]["result"]["pmc"] == result.pmc
    assert job["status"]["pmcBytes"] == result.pmc
    assert job["status"]["modelClass"] == parse_spec(created["spec"]).model.model_class  # kubectl's Model column
    assert job["status"]["modelClass"].startswith("entrypoint-")
    assert condition(job, "Probed")["reason"] == "ProbeSucceeded"
    # the re-submission: no probe pod, the same reservation, and it says where the result came from
    assert int(second["metadata"]["annotations"][ANN_ADMIT_BYTES]) == expected.admit_bytes
    assert condition(again_job, "Probed")["reason"] == "ProbeCached"
    assert again_job["status"]["probe"]["source"] == "cache"
    assert hits == 1


@pytest.mark.asyncio
@pytest.mark.timeout(240)
async def test_an_entrypoint_that_does_not_import_fails_the_job_naming_the_field(tmp_path: Path) -> None:
    """Not a failure to trace but a wrong spec: Validated=False, no GPU pod, and a re-submission fails at once."""
    async with emulated_cluster(tmp_path) as cluster:
        await cluster.add_gpunode("node-a", [a100(0)])
        async with running_operator(cluster):
            await cluster.create_job(entrypoint_job("typo", "my_gnn.modle:build"))
            probe = await probe_pod(cluster, "typo")
            code, message = run_probe_container(probe, tmp_path)
            assert code == 1
            await cluster.patch_pod("typo-probe", terminated("Failed", 1, message, reason="Error"), status_sub=True)
            failed = await job_in_phase(cluster, "typo", "Failed")
            await cluster.create_job(entrypoint_job("typo-again", "my_gnn.modle:build"))
            again = await job_in_phase(cluster, "typo-again", "Failed")
            await asyncio.sleep(0.5)
            names = sorted(p["metadata"]["name"] for p in await cluster.pods())
    assert names == ["typo-probe"]  # no GPU pod, and no second probe
    for job in (failed, again):
        validated = condition(job, "Validated")
        assert validated["status"] == "False" and validated["reason"] == "InvalidSpec"
        assert validated["message"].startswith("spec.model.entrypoint: cannot import 'my_gnn.modle'"), validated
    assert condition(again, "Probed")["reason"] == "InvalidEntrypoint"


@pytest.mark.asyncio
@pytest.mark.timeout(240)
async def test_a_failing_probe_gives_probe_failed_and_a_whole_gpu_or_the_declared_memory(tmp_path: Path) -> None:
    broken = "broken_gnn:build"
    error = json.dumps({"v": 1, "error": "/opt/user/broken_gnn.py:7 in forward: top = int(edge_index.max().item())\n"
                                         "NotImplementedError: Cannot copy out of meta tensor; no data!"})
    async with emulated_cluster(tmp_path) as cluster:
        await cluster.add_gpunode("node-a", [a100(0)])
        async with running_operator(cluster):
            await cluster.create_job(entrypoint_job("picky", broken))
            await cluster.create_job(entrypoint_job("declared", broken, image=IMAGE.replace("my-gnn", "other"),
                                                    resources={"gpuMemory": "6Gi"}))
            for name in ("picky", "declared"):
                await probe_pod(cluster, name)
                await cluster.patch_pod(f"{name}-probe", terminated("Failed", 1, error, reason="Error"),
                                        status_sub=True)
            whole, declared = await gpu_pod(cluster, "picky"), await gpu_pod(cluster, "declared")
            picky_job = await job_in_phase(cluster, "picky", "Estimated")
            declared_job = await job_in_phase(cluster, "declared", "Estimated")
    failed = condition(picky_job, "ProbeFailed")
    assert failed["status"] == "True" and failed["reason"] == "ProbeError"
    assert failed["message"].splitlines()[-1] == "NotImplementedError: Cannot copy out of meta tensor; no data!"
    assert whole["metadata"]["annotations"][ANN_EXCLUSIVE] == "true"
    assert int(whole["metadata"]["annotations"][ANN_ADMIT_BYTES]) == 40 * GiB - GiB  # the A100's capacity
    assert picky_job["status"]["reservationSource"] == "wholeGPU"
    assert "runs alone on a whole GPU" in condition(picky_job, "Estimated")["message"]
    assert condition(declared_job, "ProbeFailed")["reason"] == "ProbeError"
    assert int(declared["metadata"]["annotations"][ANN_ADMIT_BYTES]) == 6 * GiB
    assert ANN_EXCLUSIVE not in declared["metadata"]["annotations"]


def _pod(phase: str, container: dict[str, Any] | None = None, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "j-probe"},
            "status": {"phase": phase, **status, "containerStatuses": [container] if container else []}}


def test_what_a_probe_pod_says_when_it_did_not_finish_its_trace() -> None:
    killed = _pod("Failed", {"name": PROBE_CONTAINER, "state": {"terminated": {"exitCode": 137,
                                                                                "reason": "OOMKilled"}}})
    late = _pod("Failed", reason="DeadlineExceeded", message="Pod was active on the node longer than ...")
    install = _pod("Failed", initContainerStatuses=[{"name": INSTALL_CONTAINER, "state": {"terminated": {
        "exitCode": 1, "reason": "Error", "message": "PermissionError: /gnnsched-probe"}}}])
    crashed = _pod("Failed", {"name": PROBE_CONTAINER, "state": {"terminated": {
        "exitCode": 139, "reason": "Error", "message": "Segmentation fault (core dumped)"}}})
    said = {name: read_probe_pod(pod, "k") for name, pod in
            (("killed", killed), ("late", late), ("install", install), ("crashed", crashed))}
    assert {n: r.reason for n, r in said.items()} == {"killed": "OOMKilled", "late": "DeadlineExceeded",
                                                      "install": "InstallFailed", "crashed": "ProbeError"}
    assert not any(r.cacheable for r in said.values())  # none of these is the user's code failing the same way
    assert "--probe-memory" in str(said["killed"].error)
    assert "Segmentation fault" in str(said["crashed"].error)
    assert read_probe_pod(_pod("Running"), "k").state == "Running"


def test_probe_flags_are_checked_naming_the_flag() -> None:
    assert probe_settings("500m", "1Gi", 120).memory == "1Gi"
    for args, flag in ((("x", "1Gi", 120), "--probe-cpu"), (("1", "0", 120), "--probe-memory"),
                       (("1", "1Gi", 5), "--probe-deadline")):
        with pytest.raises(FieldError) as caught:
            probe_settings(*args)
        assert caught.value.field == flag
