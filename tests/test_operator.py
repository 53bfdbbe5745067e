"""The GNNJob operator end to end: kopf's real watch loop and handlers against an emulated API server (kmock).

Each test starts an emulated cluster and the real operator in-process (``operator_harness``); pods are driven
through their life by patching them the way the scheduler (``spec.nodeName``), the kubelet (``status``) and the node
agent (``gnnsched.io/*`` annotations) would.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from operator_harness import EXAMPLE, Cluster, GiB, a100, emulated_cluster, manifest, running_operator, wait_for

from gnnsched.contract import (
    ANN_ADMIT_BYTES,
    ANN_ADMITTED_AT,
    ANN_GPU,
    ANN_GROUP,
    ANN_JOB,
    ANN_PMC_BYTES,
    ANN_PREDICTED_RUNTIME,
    ENV_CPU_REQUEST,
    ENV_POD_NAME,
    ENV_POD_NAMESPACE,
    ENV_POD_UID,
    ENV_RESULT_FILE,
    GPU_SHARE_RESOURCE,
    SCHEDULER_NAME,
)
from gnnsched.operator.gpu_pod_tools import GATE_LAUNCHER

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]
pytest.importorskip("gnnsched.estimator", reason="the PMC estimator (helper 'estimator') is not merged yet")


async def job_in_phase(cluster: Cluster, name: str, *phases: str) -> Any:
    async def check() -> Any:
        job = await cluster.get_job(name)
        return job if job and (job.get("status") or {}).get("phase") in phases else None
    return await wait_for(check, 30, what=f"{name} in phase {phases}")


async def own_pods(cluster: Cluster, prefix: str) -> list[dict[str, Any]]:
    return [p for p in await cluster.pods() if p["metadata"]["name"].startswith(prefix + "-")]


async def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The operator's /metrics over HTTP, parsed as Prometheus parses it: {(sample name, labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def condition(job: dict[str, Any], type_: str) -> dict[str, Any]:
    found = [c for c in job["status"].get("conditions", []) if c["type"] == type_]
    assert found, f"no {type_} condition in {job['status'].get('conditions')}"
    return found[0]


async def test_create_makes_one_gated_pod_and_status_has_the_pmc(tmp_path: Path) -> None:
    from gnnsched.estimator import estimate
    from gnnsched.spec import parse_spec

    async with emulated_cluster(tmp_path) as cluster:
        await cluster.add_gpunode("node-a", [a100(0), a100(1)])
        async with running_operator(cluster):
            created = await cluster.create_job(manifest())
            pods = await wait_for(lambda: own_pods(cluster, "gcn-cora"), 30, what="the job's pod")
            job = await job_in_phase(cluster, "gcn-cora", "Estimated")
            await asyncio.sleep(0.5)  # a second pod would have appeared by now
            assert [p["metadata"]["name"] for p in await own_pods(cluster, "gcn-cora")] == ["gcn-cora-0"]

    pod = pods[0]
    meta, spec = pod["metadata"], pod["spec"]
    container = spec["containers"][0]
    expected = estimate(parse_spec(created["spec"]), device="cuda", gpu_model="A100-40GB")
    status = job["status"]
    # The status tells the truth: the estimator's numbers for the GPU model the cluster has.
    assert status["pmcBytes"] == expected.pmc_bytes > 0
    assert status["admitBytes"] == expected.admit_bytes
    assert status["attempts"] == 1 and status["podName"] == "gcn-cora-0"
    # The status (which a tenant cannot write) names the pod with the facts its annotations repeat: the extender and
    # the node agent read them there (gnnsched.trust.job_facts), and they resolve for this pod only.
    from gnnsched.trust.job_facts import resolve
    assert status["podFacts"]["pod"] == "gcn-cora-0" and status["podFacts"]["admitBytes"] == expected.admit_bytes
    trusted = resolve(pods[0], job)
    assert trusted is not None and trusted.admit_bytes == expected.admit_bytes and trusted.job == "default/gcn-cora"
    assert resolve(dict(pods[0], metadata={**pods[0]["metadata"], "name": "gcn-cora-9"}), job) is None
    assert status["requestedResources"] == {"cpu": "4", "memory": "8Gi"}
    assert condition(job, "Estimated")["reason"] == "PMCEstimated"
    assert str(expected.pmc_bytes) in condition(job, "Estimated")["message"]
    # The pod: owned, deterministic, gated, scheduled by gnnsched, annotated for the extender and the agent.
    assert meta["ownerReferences"] == [{"apiVersion": "gnnsched.io/v1alpha1", "kind": "GNNJob", "name": "gcn-cora",
                                        "uid": created["metadata"]["uid"], "controller": True,
                                        "blockOwnerDeletion": True}]
    assert spec["schedulerName"] == SCHEDULER_NAME
    assert spec["restartPolicy"] == "Never"
    assert meta["annotations"][ANN_JOB] == "default/gcn-cora"
    assert int(meta["annotations"][ANN_ADMIT_BYTES]) == expected.admit_bytes
    assert int(meta["annotations"][ANN_PMC_BYTES]) == expected.pmc_bytes
    if status.get("predictedRuntimeSeconds") is not None:
        assert float(meta["annotations"][ANN_PREDICTED_RUNTIME]) == pytest.approx(status["predictedRuntimeSeconds"])
    requests = container["resources"]["requests"]
    assert requests[GPU_SHARE_RESOURCE] == "1" and container["resources"]["limits"][GPU_SHARE_RESOURCE] == "1"
    assert requests.get("cpu") == status["scaledResources"]["cpu"]
    assert requests.get("memory") == status["scaledResources"]["memory"]
    assert container["command"][:5] == ["python", GATE_LAUNCHER, "--", "gnnsched", "worker"]  # no --prestart by default
    assert container["command"][5:] == ["/etc/gnnsched/job.yaml", "--device", "cuda", "--no-progress"]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"] if "fieldRef" in
           e.get("valueFrom", {})}
    assert env == {ENV_POD_UID: "metadata.uid", ENV_POD_NAME: "metadata.name", ENV_POD_NAMESPACE: "metadata.namespace"}
    # The worker sizes its thread pool by the CPU request: whole CPUs, rounded up, through the downward API.
    assert {"name": ENV_CPU_REQUEST, "valueFrom": {"resourceFieldRef": {
        "containerName": container["name"], "resource": "requests.cpu", "divisor": "1"}}} in container["env"]
    assert {"name": ENV_RESULT_FILE, "value": container["terminationMessagePath"]} in container["env"]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    # the gate comes from gnnsched's image through an init container, never from the job image's PATH
    assert spec["volumes"] == [{"name": "job-spec", "configMap": {"name": "gcn-cora-spec"}},
                               {"name": "gnnsched-tools", "emptyDir": {"sizeLimit": "64Mi"}}]
    assert [c["name"] for c in spec["initContainers"]] == ["install-gnnsched"]
    assert {"name": "gnnsched-tools", "mountPath": "/gnnsched-tools", "readOnly": True} in container["volumeMounts"]


@pytest.mark.parametrize("fallback", [None, "start-up tried to initialise CUDA before admission: torch.cuda.init"])
async def test_pod_lifecycle_reaches_succeeded_with_times_and_observed_peak(tmp_path: Path,
                                                                           fallback: str | None) -> None:
    """``fallback``: the worker's result line says it re-executed itself after admission (``prestart_fallback``):
    the job succeeds as any other, and its Complete condition and Succeeded event say so."""
    async with emulated_cluster(tmp_path) as cluster:
        await cluster.add_gpunode("node-a", [a100(0)])
        async with running_operator(cluster, metrics_port=0) as op:
            await cluster.create_job(manifest())
            await wait_for(lambda: own_pods(cluster, "gcn-cora"), 30, what="pod")
            await cluster.patch_pod("gcn-cora-0", {"spec": {"nodeName": "node-a"}})  # the scheduler binds it
            job = await job_in_phase(cluster, "gcn-cora", "Scheduled")
            assert job["status"]["node"] == "node-a"
            await cluster.patch_pod("gcn-cora-0", {"status": {"phase": "Running", "containerStatuses": [
                {"name": "gnn", "state": {"running": {"startedAt": "2026-01-01T10:00:00Z"}}}]}})
            await job_in_phase(cluster, "gcn-cora", "Queued")  # the container waits at the gate
            await cluster.patch_pod("gcn-cora-0", {"metadata": {"annotations": {
                ANN_GPU: "GPU-a100-0", ANN_GROUP: "g-7", ANN_ADMITTED_AT: "2026-01-01T10:00:05Z"}}})
            job = await job_in_phase(cluster, "gcn-cora", "Running")
            assert (job["status"]["gpu"], job["status"]["group"]) == ("GPU-a100-0", "g-7")
            result: dict[str, Any] = {"observed_peak_bytes": 31_337_000, "seconds": 59.5, "steps": 200}
            if fallback:
                result["prestart_fallback"] = fallback
            await cluster.patch_pod("gcn-cora-0", {"status": {"phase": "Succeeded", "containerStatuses": [
                {"name": "gnn", "state": {"terminated": {
                    "exitCode": 0, "reason": "Completed", "startedAt": "2026-01-01T10:00:00Z",
                    "finishedAt": "2026-01-01T10:01:05Z", "message": "epoch 200\n" + json.dumps(result) + "\n"}}}]}})
            job = await job_in_phase(cluster, "gcn-cora", "Succeeded")
            events = await cluster.events()
            metrics = await scrape(op.metrics_port)
            out = tmp_path / "history.jsonl"
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-P", "-m", "gnnsched.cli", "operator", "export-history", "--out", str(out),
                "--kubeconfig", str(cluster.kubeconfig), stderr=asyncio.subprocess.PIPE)
            _, stderr = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode == 0, stderr.decode()

    status = job["status"]
    assert status["admittedAt"] == "2026-01-01T10:00:05Z"
    assert status["startedAt"] == "2026-01-01T10:00:00Z"
    assert status["finishedAt"] == "2026-01-01T10:01:05Z"
    assert status["observedPeakBytes"] == 31_337_000
    assert status["observedRuntimeSeconds"] == 60.0  # from admission (10:00:05), not container start (queueing)
    assert condition(job, "Complete")["status"] == "True"
    assert condition(job, "Admitted")["message"].startswith("admitted on GPU GPU-a100-0")
    succeeded = [e["message"] for e in events if e.get("involvedObject", {}).get("name") == "gcn-cora"
                 and e["reason"] == "Succeeded"]
    for message in (condition(job, "Complete")["message"], *succeeded):
        assert ("prestart fallback" in message) == bool(fallback), message
        if fallback:
            assert fallback in message and "start-up paid twice" in message
    reasons = [e["reason"] for e in events if e.get("involvedObject", {}).get("name") == "gcn-cora"]
    for phase in ("Estimated", "PodCreated", "Scheduled", "Queued", "Running", "Succeeded"):
        assert phase in reasons, reasons
    from gnnsched.predictor.history import load_history

    [record] = load_history(out)  # the predictor's own reader accepts the export
    assert record.gpu_model == "A100-40GB" and record.node == "node-a"
    assert record.observed_peak_bytes == 31_337_000 and record.observed_runtime_seconds == 60.0
    assert record.pmc_bytes == status["pmcBytes"]
    assert (record.requested.cpu, record.requested.memory) == (4.0, 8 * GiB)
    assert record.scaled.cpu <= 4.0 and record.scaled.memory <= 8 * GiB
    assert record.predicted_runtime_seconds == status.get("predictedRuntimeSeconds")
    assert record.spec["model"]["arch"] == "gcn"
    # what an SRE sees: the job counted once, in its final phase; one pod; one plan; the runtime prediction's ratio
    jobs = {dict(labels)["phase"]: v for (name, labels), v in metrics.items() if name == "gnnsched_operator_jobs"}
    assert jobs["Succeeded"] == 1 and sum(jobs.values()) == 1, jobs
    for phase in ("Estimated", "Scheduled", "Queued", "Running", "Succeeded"):
        assert metrics[("gnnsched_operator_phase_transitions_total", (("phase", phase),))] == 1, phase
    assert metrics[("gnnsched_operator_pods_created_total", ())] == 1
    # an SRE counts the workers whose prestart fell back (the guard missed a path into CUDA on this cluster's GPUs)
    assert metrics[("gnnsched_operator_prestart_fallbacks_total", ())] == (1 if fallback else 0)
    assert status.get("prestartFallback") == fallback
    assert metrics[("gnnsched_operator_plan_seconds_count", ())] == 1
    assert 0 < metrics[("gnnsched_operator_plan_seconds_sum", ())] < 60
    ratio = 60.0 / status["predictedRuntimeSeconds"]
    assert metrics[("gnnsched_operator_runtime_prediction_ratio_count", ())] == 1
    assert metrics[("gnnsched_operator_runtime_prediction_ratio_sum", ())] == pytest.approx(ratio)
    assert metrics[("gnnsched_operator_peak_prediction_ratio_sum", ())] == pytest.approx(
        31_337_000 / status["pmcBytes"])


async def test_spec_edit_after_the_pod_exists_is_reported_not_silently_ignored(tmp_path: Path) -> None:
    async with emulated_cluster(tmp_path) as cluster, running_operator(cluster):
        await cluster.create_job(manifest())
        await wait_for(lambda: own_pods(cluster, "gcn-cora"), 30, what="pod")
        await job_in_phase(cluster, "gcn-cora", "Estimated")
        code, _ = await cluster.request(
            "PATCH", "/apis/gnnsched.io/v1alpha1/namespaces/default/gnnjobs/gcn-cora",
            json={"spec": {"epochs": 999}}, headers={"Content-Type": "application/merge-patch+json"})
        assert code == 200

        async def reported() -> Any:
            job = await cluster.get_job("gcn-cora")
            return job if any(c["type"] == "SpecApplied" for c in job["status"].get("conditions", [])) else None
        job = await wait_for(reported, 30, what="the SpecApplied condition")
        pods = await own_pods(cluster, "gcn-cora")
    cond = condition(job, "SpecApplied")
    assert (cond["status"], cond["reason"]) == ("False", "SpecChangedAfterStart")
    assert "generation 2" in cond["message"] and job["status"]["observedGeneration"] == 1
    assert [p["metadata"]["name"] for p in pods] == ["gcn-cora-0"]


async def test_delete_removes_pods_and_config_map(tmp_path: Path) -> None:
    async with emulated_cluster(tmp_path) as cluster, running_operator(cluster):
        await cluster.create_job(manifest())
        await wait_for(lambda: own_pods(cluster, "gcn-cora"), 30, what="pod")
        code, _ = await cluster.request("GET", "/api/v1/namespaces/default/configmaps/gcn-cora-spec")
        assert code == 200
        assert await cluster.delete_job("gcn-cora") == 200

        async def gone() -> bool:
            return await cluster.get_job("gcn-cora") is None and not await own_pods(cluster, "gcn-cora")
        await wait_for(gone, 30, what="job and pods gone")
        code, _ = await cluster.request("GET", "/api/v1/namespaces/default/configmaps/gcn-cora-spec")
        assert code == 404


async def test_bad_specs_surface_as_conditions_naming_the_field(tmp_path: Path) -> None:
    async with emulated_cluster(tmp_path) as cluster, running_operator(cluster) as op:
        # The emulator has no schema: these reach the operator as a misconfigured API server would let them.
        await cluster.create_job(manifest("no-heads", model={"arch": "gat", "layers": 2, "hidden": 8}))
        await cluster.create_job({**manifest("not-a-mapping"), "spec": "train please"})
        await cluster.create_job(manifest("empty-command", command=[]))
        bad_heads = await job_in_phase(cluster, "no-heads", "Failed")
        not_mapping = await job_in_phase(cluster, "not-a-mapping", "Failed")
        empty_command = await job_in_phase(cluster, "empty-command", "Failed")
        await asyncio.sleep(0.5)
        assert await cluster.pods() == []
        events = await cluster.events()
    cond = condition(bad_heads, "Validated")
    assert (cond["status"], cond["reason"]) == ("False", "InvalidSpec")
    assert cond["message"].startswith("spec.model.heads: required when arch is gat")
    assert condition(not_mapping, "Validated")["message"].startswith("spec: must be a mapping")
    assert condition(empty_command, "Validated")["message"].startswith("spec.command: must not be empty")
    assert any(e["reason"] == "Failed" and e["type"] == "Warning" for e in events)
    assert op.metrics.registry.get_sample_value("gnnsched_operator_job_failures_total", {"reason": "InvalidSpec"}) == 3
    assert op.metrics.registry.get_sample_value("gnnsched_operator_jobs", {"phase": "Failed"}) == 3


async def test_peak_larger_than_every_gpu_is_unschedulable_naming_both_numbers(tmp_path: Path) -> None:
    small = {**a100(0), "uuid": "GPU-t4-0", "model": "T4", "totalBytes": 15 * GiB, "reserveBytes": GiB}
    huge = manifest("huge", graph={"nodes": 200_000_000, "edges": 2_000_000_000, "features": 512, "classes": 10})
    async with emulated_cluster(tmp_path) as cluster:
        await cluster.add_gpunode("node-t4", [small])
        async with running_operator(cluster):
            await cluster.create_job(huge)
            job = await job_in_phase(cluster, "huge", "Unschedulable")
            await asyncio.sleep(0.5)
            assert await cluster.pods() == []
            # A node with a big enough GPU joins: the resync re-plans and the job gets its pod.
            await cluster.add_gpunode("node-big", [{**a100(0), "uuid": "GPU-big", "model": "A100-80GB",
                                                   "totalBytes": 2**44, "reserveBytes": GiB}])
            await wait_for(lambda: own_pods(cluster, "huge"), 30, what="the pod once a big GPU joined")
            later = await job_in_phase(cluster, "huge", "Estimated")
    cond = condition(job, "Schedulable")
    assert (cond["status"], cond["reason"]) == ("False", "PredictedPeakExceedsGPU")
    assert "T4" in cond["message"] and str(14 * GiB) in cond["message"]
    admit = int(cond["message"].split("(")[1].split(" bytes")[0])
    assert admit > 14 * GiB
    assert later["status"]["admitBytes"] > 14 * GiB
    assert not any(c["reason"] == "PredictedPeakExceedsGPU" for c in later["status"]["conditions"])


async def test_failed_pod_is_retried_per_backoff_limit_then_fails_with_container_reason(tmp_path: Path) -> None:
    def terminated(reason: str, code: int) -> dict[str, Any]:
        return {"status": {"phase": "Failed", "containerStatuses": [{"name": "gnn", "state": {"terminated": {
            "exitCode": code, "reason": reason, "startedAt": "2026-01-01T10:00:00Z",
            "finishedAt": "2026-01-01T10:00:09Z", "message": "CUDA out of memory" if code == 137 else "boom"}}}]}}

    async with emulated_cluster(tmp_path) as cluster, running_operator(cluster):
        await cluster.create_job(manifest(backoffLimit=1))
        await wait_for(lambda: own_pods(cluster, "gcn-cora"), 30, what="first pod")
        await cluster.patch_pod("gcn-cora-0", terminated("OOMKilled", 137))

        async def second() -> Any:
            return [p for p in await own_pods(cluster, "gcn-cora") if p["metadata"]["name"] == "gcn-cora-1"]
        await wait_for(second, 30, what="the retry pod")
        job = await cluster.get_job("gcn-cora")
        assert job["status"]["attempts"] == 2 and job["status"]["phase"] == "Estimated"
        retry = condition(job, "Retrying")
        assert retry["reason"] == "OOMKilled" and "exit code 137" in retry["message"]
        await cluster.patch_pod("gcn-cora-1", terminated("Error", 1))
        job = await job_in_phase(cluster, "gcn-cora", "Failed")
        await asyncio.sleep(0.5)
        names = sorted(p["metadata"]["name"] for p in await own_pods(cluster, "gcn-cora"))
    assert names == ["gcn-cora-0", "gcn-cora-1"]
    failed = condition(job, "Failed")
    assert failed["reason"] == "Error" and "exit code 1" in failed["message"] and "backoffLimit 1" in failed["message"]


@pytest.mark.timeout(240)  # a real operator process: its start-up (kopf, the kubernetes client) waits for CPU in CI
async def test_operator_killed_between_create_and_pod_creation_makes_exactly_one_pod(tmp_path: Path) -> None:
    """SIGKILL a real ``gnnsched operator`` process while two pod-create requests are in flight, then restart.

    Job ``lost-request``: its create is held before the API server applies it, then dropped (the pod never exists).
    Job ``lost-response``: its pod is created but the response is held until the operator is dead (the classic
    "did my create happen?"). After a restart each job must have exactly one pod, owned by it.
    """
    import kmock

    async with emulated_cluster(tmp_path) as cluster:
        held = {"lost-request": asyncio.Event(), "lost-response": asyncio.Event()}
        release = asyncio.Event()

        def pod_create_of(request: Any) -> str | None:
            if request.method == "POST" and request.resource is not None and request.resource.plural == "pods":
                name = str((request.data or {}).get("metadata", {}).get("name", ""))
                return name.rsplit("-", 1)[0] if name.endswith("-0") else None
            return None

        async def before(request: Any) -> None:
            if pod_create_of(request) == "lost-request" and not held["lost-request"].is_set():
                held["lost-request"].set()
                await release.wait()
                raise kmock.KubernetesError(status=503, reason="ServiceUnavailable", message="dropped")

        async def after(request: Any) -> None:
            if pod_create_of(request) == "lost-response" and not held["lost-response"].is_set():
                held["lost-response"].set()
                await release.wait()

        cluster.k8s.before_write, cluster.k8s.after_write = before, after
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            health_port = probe.getsockname()[1]
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-P", "-m", "gnnsched.cli", "operator", "--all-namespaces", "--kubeconfig",
            str(cluster.kubeconfig), "--watch-timeout", "2", "--log-level", "warning",
            "--health-port", str(health_port),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        try:
            await cluster.create_job(manifest("lost-request"))
            await cluster.create_job(manifest("lost-response"))
            try:
                await asyncio.wait_for(asyncio.gather(*(e.wait() for e in held.values())), 120)
            except asyncio.TimeoutError:
                proc.kill()
                _, err = await proc.communicate()
                raise AssertionError(f"the operator never tried to create both pods: {err.decode()[-2000:]}") from None
            for name in held:  # the plan is persisted before the pod is created
                assert (await cluster.get_job(name))["status"]["podName"] == f"{name}-0"
            async with (  # the liveness probe the chart configures
                aiohttp.ClientSession() as session,
                session.get(f"http://127.0.0.1:{health_port}/healthz") as resp,
            ):
                assert resp.status == 200
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        release.set()
        await asyncio.sleep(0.2)
        assert len(await own_pods(cluster, "lost-request")) == 0
        assert len(await own_pods(cluster, "lost-response")) == 1
        cluster.k8s.before_write = cluster.k8s.after_write = None
        async with running_operator(cluster):
            await wait_for(lambda: own_pods(cluster, "lost-request"), 30, what="the dropped pod after restart")
            jobs = [await job_in_phase(cluster, name, "Estimated") for name in held]
            await asyncio.sleep(1.0)
            pods = {name: await own_pods(cluster, name) for name in held}
    for job in jobs:
        name = job["metadata"]["name"]
        assert [p["metadata"]["name"] for p in pods[name]] == [f"{name}-0"]
        assert pods[name][0]["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
        assert job["status"]["attempts"] == 1


async def test_kubectl_apply_and_get_gj(tmp_path: Path) -> None:
    """The real kubectl against the emulator: apply an example, see the printer columns filled by the operator."""
    import shutil

    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    async with emulated_cluster(tmp_path) as cluster, running_operator(cluster):
        async def run(*args: str) -> str:
            proc = await asyncio.create_subprocess_exec(
                kubectl, "--kubeconfig", str(cluster.kubeconfig), *args,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode == 0, f"kubectl {' '.join(args)}: {err.decode()}"
            return out.decode()

        applied = await run("apply", "--validate=false", "-f", str(EXAMPLE))
        assert "gnnjob.gnnsched.io/gcn-cora created" in applied
        job = await job_in_phase(cluster, "gcn-cora", "Estimated")
        table = await run("get", "gj")
        phase = await run("get", "gnnjob", "gcn-cora", "-o", "jsonpath={.status.phase}")
    header, row = table.splitlines()[:2]
    assert header.split()[:6] == ["NAME", "PHASE", "MODEL", "MODE", "PMC", "NODE"]
    assert row.split()[:4] == ["gcn-cora", "Estimated", "gcn", "train"]
    assert job["status"]["pmc"] in row and job["status"]["pmc"].endswith(("KiB", "MiB", "GiB"))
    assert phase == "Estimated"
