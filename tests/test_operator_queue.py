"""The operator's queue PriorityClasses (gnnsched.queue_order) against an emulated API server (kmock).

The emulator is given the PriorityClass resource and the Priority admission plugin's rule (a pod naming a class that
does not exist is refused with 403; an existing class's value becomes ``spec.priority``), so the operator is tested
against what a real API server would do with its pods.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import kmock
import pytest
from operator_harness import Cluster, a100, ago, emulated_cluster, ended, manifest, oom_line, running_operator, wait_for
from operator_harness import own_fault_end as fault_ended_at

from gnnsched.closed_loop import AttemptResult
from gnnsched.contract import (
    ANN_ADMIT_BYTES,
    ANN_FAULT,
    ANN_FAULT_PEERS,
    ANN_GPU,
    ANN_PREDICTED_RUNTIME,
    ANN_PROBATION_STEP,
    GNNCALIBRATION_PLURAL,
    GROUP,
    VERSION,
)
from gnnsched.queue_order import QueueOrder

CLASSES = "/apis/scheduling.k8s.io/v1/priorityclasses"

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]
pytest.importorskip("gnnsched.estimator", reason="the PMC estimator is needed to plan a job")


def with_priority_admission(cluster: Cluster) -> dict[str, int]:
    """Serve scheduling.k8s.io/v1 PriorityClasses and enforce the Priority admission plugin on pod creation.
    Returns the name -> value map the admission rule reads (kept in step by the PriorityClass creates)."""
    cluster.k8s.resources["scheduling.k8s.io/v1/priorityclasses"] = kmock.ResourceInfo(
        kind="PriorityClass", singular="priorityclass", namespaced=False, shortnames={"pc"},
        verbs={"list", "get", "create", "delete"})
    known: dict[str, int] = {}

    async def admit(request: Any) -> None:
        if request.method != "POST" or request.resource is None or not isinstance(request.data, dict):
            return
        if request.resource.plural == "priorityclasses":
            known[request.data["metadata"]["name"]] = int(request.data["value"])
        elif request.resource.plural == "pods":
            spec = request.data.get("spec") or {}
            if "priority" in spec:
                raise kmock.KubernetesError(status=403, reason="Forbidden",
                                            message="the integer value of priority must not be provided in pod spec")
            name = spec.get("priorityClassName")
            if name is not None:
                if name not in known:
                    raise kmock.KubernetesError(status=403, reason="Forbidden",
                                                message=f"no PriorityClass with name {name} was found")
                spec["priority"] = known[name]

    cluster.k8s.before_write = admit
    return known


async def create_class(cluster: Cluster, name: str, value: int) -> None:
    status, data = await cluster.request("POST", CLASSES, json={
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
        "value": value, "preemptionPolicy": "Never", "globalDefault": False})
    assert status in (200, 201), data


async def queue_cluster(cluster: Cluster, order: QueueOrder, *extra: tuple[str, int]) -> None:
    """The emulated cluster the queue tests share: the Priority admission rule, the runtime buckets' classes (and
    ``extra`` ones) created, one A100 node."""
    with_priority_admission(cluster)
    for name, value in (*((c.name, c.value) for c in order.classes()), *extra):
        await create_class(cluster, name, value)
    await cluster.add_gpunode("node-a", [a100(0)])


async def pod_of(cluster: Cluster, job: str) -> dict[str, Any]:
    async def find() -> Any:
        return next((p for p in await cluster.pods() if p["metadata"]["name"] == f"{job}-0"), None)
    return await wait_for(find, 30, what=f"the pod of {job}")


async def job_status(cluster: Cluster, name: str, phase: str) -> dict[str, Any]:
    async def check() -> Any:
        job = await cluster.get_job(name)
        return job if job and (job.get("status") or {}).get("phase") == phase else None
    return (await wait_for(check, 30, what=f"{name} in phase {phase}"))["status"]


async def test_pods_get_the_class_of_their_predicted_runtime_and_a_user_class_wins(tmp_path: Path) -> None:
    order = QueueOrder()
    async with emulated_cluster(tmp_path) as cluster:
        await queue_cluster(cluster, order, ("batch-urgent", 50_000))
        async with running_operator(cluster, queue_priority=True):
            await cluster.create_job(manifest("short", epochs=20))
            await cluster.create_job(manifest("long", epochs=200_000))
            await cluster.create_job(manifest("mine", epochs=200_000, priorityClassName="batch-urgent"))
            short, long_, mine = [await pod_of(cluster, n) for n in ("short", "long", "mine")]

    runtimes = {}
    for name, pod in (("short", short), ("long", long_)):
        seconds = float(pod["metadata"]["annotations"][ANN_PREDICTED_RUNTIME])
        runtimes[name] = seconds
        expected = order.class_for(seconds)
        assert pod["spec"]["priorityClassName"] == expected.name
        assert pod["spec"]["priority"] == expected.value  # resolved by the (emulated) admission plugin
    assert runtimes["long"] > 2 * runtimes["short"]
    assert short["spec"]["priority"] > long_["spec"]["priority"]  # shorter predicted -> tried first
    assert mine["spec"]["priorityClassName"] == "batch-urgent" and mine["spec"]["priority"] == 50_000


async def pod_named(cluster: Cluster, name: str) -> dict[str, Any]:
    async def find() -> Any:
        return next((p for p in await cluster.pods() if p["metadata"]["name"] == name), None)
    return await wait_for(find, 40, what=f"pod {name}")


async def test_a_finished_jobs_runtime_moves_its_class_factor_and_the_next_jobs_class(tmp_path: Path) -> None:
    """Runtime in the closed loop (issue 28): a job that ran 4x its predicted runtime records ratio 4 in its runtime
    class (``status.runtimeRatios`` of the GNNCalibration), and the next job of that class is predicted 4x longer,
    says it is calibrated, and gets the PriorityClass of the longer runtime. A job of the class whose pod was
    already waiting for a node is re-planned at once: its pod's predicted runtime (what the gate's sqtf and the
    spread read) follows, its PriorityClass cannot (a pod's priority is immutable)."""
    from gnnsched.closed_loop import RuntimeCalibrationPolicy
    from gnnsched.operator.planning import Planner

    order = QueueOrder()
    planner = Planner(default_gpu_model="A100-40GB", runtime_policy=RuntimeCalibrationPolicy(min_samples=1))
    calibration = f"/apis/{GROUP}/{VERSION}/{GNNCALIBRATION_PLURAL}/default"
    async with emulated_cluster(tmp_path) as cluster:
        await queue_cluster(cluster, order)
        async with running_operator(cluster, planner=planner, queue_priority=True):
            await cluster.create_job(manifest("rt-a", epochs=200_000))
            first = await pod_of(cluster, "rt-a")
            await cluster.create_job(manifest("rt-w", epochs=200_000))  # same class; its pod waits for a node
            waiting = await pod_of(cluster, "rt-w")
            predicted = float(first["metadata"]["annotations"][ANN_PREDICTED_RUNTIME])
            observed = round(4 * predicted)
            end = datetime(2026, 1, 1, 10, tzinfo=timezone.utc) + timedelta(seconds=observed)  # ended() starts 10:00
            await cluster.patch_pod("rt-a-0", {"metadata": {"annotations": {ANN_GPU: "GPU-a100-0"}}})
            await cluster.patch_pod("rt-a-0", ended("Succeeded", json.dumps({"outcome": "succeeded"}), "Completed",
                                                    0, finished_at=end.strftime("%Y-%m-%dT%H:%M:%SZ")))
            done = await job_status(cluster, "rt-a", "Succeeded")

            async def recorded() -> Any:
                code, obj = await cluster.request("GET", calibration)
                return obj if code == 200 and (obj.get("status") or {}).get("runtimeRatios") else None
            stored = (await wait_for(recorded, 30, what="a runtime ratio in the GNNCalibration"))["status"]
            await cluster.create_job(manifest("rt-b", epochs=200_000))
            second = await pod_of(cluster, "rt-b")
            job = await cluster.get_job("rt-b")

            async def replanned() -> Any:
                pod = await pod_of(cluster, "rt-w")
                moved = pod["metadata"]["annotations"][ANN_PREDICTED_RUNTIME] != \
                    waiting["metadata"]["annotations"][ANN_PREDICTED_RUNTIME]
                return pod if moved else None
            waited = await wait_for(replanned, 30, what="the waiting pod's predicted runtime to follow the factor")
            waiting_job = await wait_for(lambda: _job_with_factor(cluster, "rt-w"), 30, what="rt-w's status")
            events = [e["message"] for e in await cluster.events()
                      if e.get("involvedObject", {}).get("name") == "rt-w" and e["reason"] == "Replanned"]
    assert done["observedRuntimeSeconds"] == observed
    ratio = round(observed / predicted, 4)
    key = "A100-40GB.gcn-e13.train.builtin"  # Cora: 10,556 edges, log2 bucket 13
    assert stored["runtimeRatios"] == {key: [ratio]}
    assert stored["runtimeFactors"][key]["factor"] == ratio and stored["runtimeFactors"][key]["calibrated"]
    assert key in stored["runtimeSummary"] and not stored.get("ratios")  # no peak reported: no memory sample
    again = float(second["metadata"]["annotations"][ANN_PREDICTED_RUNTIME])
    assert again == pytest.approx(predicted * ratio, rel=1e-3)
    assert job is not None and job["status"]["predictedRuntimeSeconds"] == again
    plan = job["status"]["plan"]
    assert plan["runtime_factor"] == ratio and f"calibrated x{ratio:g} ({key}" in plan["runtime_source"]
    assert first["spec"]["priorityClassName"] == order.class_for(predicted).name
    assert second["spec"]["priorityClassName"] == order.class_for(again).name != first["spec"]["priorityClassName"]
    assert second["spec"]["priority"] < first["spec"]["priority"]  # predicted longer: queued behind
    # the waiting pod: the new predicted runtime in its annotation and its job's status, its PriorityClass unchanged
    assert float(waiting["metadata"]["annotations"][ANN_PREDICTED_RUNTIME]) == predicted
    assert float(waited["metadata"]["annotations"][ANN_PREDICTED_RUNTIME]) == again
    assert waited["spec"]["priorityClassName"] == waiting["spec"]["priorityClassName"] == \
        first["spec"]["priorityClassName"]
    assert waiting_job["status"]["predictedRuntimeSeconds"] == again
    assert waiting_job["status"]["plan"]["runtime_factor"] == ratio
    assert events and "predicted runtime" in events[0] and "PriorityClass stays" in events[0], events


async def _job_with_factor(cluster: Any, name: str) -> Any:
    job = await cluster.get_job(name)
    return job if job and (job["status"].get("plan") or {}).get("runtime_factor") else None


async def test_a_resized_attempt_goes_ahead_and_a_charged_retry_keeps_its_class(tmp_path: Path) -> None:
    """The retry class (above every bucket) for the attempt a memory-exceeded pod's resize creates; the class of the
    job's runtime for a retry charged to backoffLimit (the user's failure); the reason kept in the status."""
    order = QueueOrder()
    async with emulated_cluster(tmp_path) as cluster:
        await queue_cluster(cluster, order, (order.retry_name, order.retry_value))
        async with running_operator(cluster, queue_priority=True, retry_priority=True):
            await cluster.create_job(manifest("oom"))
            await cluster.create_job(manifest("flaky", backoffLimit=1))
            first, flaky = await pod_named(cluster, "oom-0"), await pod_named(cluster, "flaky-0")
            limit = int(first["metadata"]["annotations"][ANN_ADMIT_BYTES])
            await cluster.patch_pod("oom-0", ended("Failed", oom_line(limit, limit - 2**20, limit)))
            await cluster.patch_pod("flaky-0", ended("Failed", "ValueError: bad input", finished_at=ago(120)))
            resized, retried = await pod_named(cluster, "oom-1"), await pod_named(cluster, "flaky-1")
            oom, again = await cluster.get_job("oom"), await cluster.get_job("flaky")
    assert resized["spec"]["priorityClassName"] == order.retry_name
    assert resized["spec"]["priority"] == order.retry_value > max(c.value for c in order.classes())
    assert first["spec"]["priorityClassName"] == order.class_for(
        float(first["metadata"]["annotations"][ANN_PREDICTED_RUNTIME])).name
    assert retried["spec"]["priorityClassName"] == flaky["spec"]["priorityClassName"] != order.retry_name
    assert oom is not None and oom["status"]["attemptReason"] == "Resized"
    assert again is not None and again["status"]["attemptReason"] == "Retrying"


async def test_a_missing_retry_class_keeps_the_jobs_class_and_says_so(tmp_path: Path) -> None:
    order = QueueOrder()
    async with emulated_cluster(tmp_path) as cluster:
        await queue_cluster(cluster, order)
        async with running_operator(cluster, queue_priority=True, retry_priority=True):
            await cluster.create_job(manifest("oom"))
            first = await pod_named(cluster, "oom-0")
            limit = int(first["metadata"]["annotations"][ANN_ADMIT_BYTES])
            await cluster.patch_pod("oom-0", ended("Failed", oom_line(limit, limit - 2**20, limit)))
            resized = await pod_named(cluster, "oom-1")

            async def warned() -> Any:
                return [e for e in await cluster.events() if e.get("reason") == "RetryPriorityClassMissing"]
            events = await wait_for(warned, 30, what="a RetryPriorityClassMissing event")
    assert resized["spec"]["priorityClassName"] == first["spec"]["priorityClassName"]
    assert order.retry_name in events[0]["message"] and "queuePriority.retryFirst=true" in events[0]["message"]


async def test_feature_off_sets_no_class(tmp_path: Path) -> None:
    async with emulated_cluster(tmp_path) as cluster:
        with_priority_admission(cluster)
        await cluster.add_gpunode("node-a", [a100(0)])
        async with running_operator(cluster):
            await cluster.create_job(manifest("plain"))
            pod = await pod_of(cluster, "plain")
    assert "priorityClassName" not in pod["spec"] and "priority" not in pod["spec"]


async def test_missing_queue_classes_cost_only_the_order_and_say_so(tmp_path: Path) -> None:
    async with emulated_cluster(tmp_path) as cluster:
        with_priority_admission(cluster)
        await cluster.add_gpunode("node-a", [a100(0)])
        async with running_operator(cluster, queue_priority=True):
            await cluster.create_job(manifest("fifo"))
            pod = await pod_of(cluster, "fifo")

            async def warned() -> Any:
                return [e for e in await cluster.events() if e.get("reason") == "QueuePriorityClassMissing"]
            events = await wait_for(warned, 30, what="a QueuePriorityClassMissing event")
    assert "priorityClassName" not in pod["spec"]
    assert events[0]["type"] == "Warning"
    assert "queuePriority.enabled=true" in events[0]["message"] and "gnnsched-runtime-" in events[0]["message"]


async def test_missing_user_class_holds_the_job_until_the_class_exists(tmp_path: Path) -> None:
    async with emulated_cluster(tmp_path) as cluster:
        with_priority_admission(cluster)
        await cluster.add_gpunode("node-a", [a100(0)])
        async with running_operator(cluster, queue_priority=True, resync_seconds=0.5):
            await cluster.create_job(manifest("waits", priorityClassName="team-a"))
            status = await job_status(cluster, "waits", "Unschedulable")
            await asyncio.sleep(1.0)
            assert not [p for p in await cluster.pods() if p["metadata"]["name"].startswith("waits-")]
            await create_class(cluster, "team-a", 7)
            pod = await pod_of(cluster, "waits")
    assert "spec.priorityClassName" in status["message"] and "team-a" in status["message"]
    assert status["message"].startswith("PriorityClassNotFound")
    assert pod["spec"]["priorityClassName"] == "team-a" and pod["spec"]["priority"] == 7


async def test_a_class_deleted_after_the_pod_exists_does_not_touch_the_job(tmp_path: Path) -> None:
    async with emulated_cluster(tmp_path) as cluster:
        with_priority_admission(cluster)
        await create_class(cluster, "team-b", 9)
        await cluster.add_gpunode("node-a", [a100(0)])
        async with running_operator(cluster, queue_priority=True):
            await cluster.create_job(manifest("kept", priorityClassName="team-b"))
            await pod_of(cluster, "kept")
            await job_status(cluster, "kept", "Estimated")
        status, data = await cluster.request("DELETE", f"{CLASSES}/team-b")
        assert status == 200, data
        async with running_operator(cluster, queue_priority=True, resync_seconds=0.5):  # resume: reconcile again
            await asyncio.sleep(2.5)
            job = await cluster.get_job("kept")
            events = [
                e for e in await cluster.events() if e.get("reason") in ("PriorityClassNotFound", "Unschedulable")
            ]
            pods = [p["metadata"]["name"] for p in await cluster.pods() if p["metadata"]["name"].startswith("kept-")]
    assert job["status"]["phase"] == "Estimated", job["status"]
    assert not events
    assert pods == ["kept-0"]


def _fault_record(role: str, peers: list[str] | None = None) -> str:
    return json.dumps({"gpu": "GPU-a100-0", "role": role, "reason": "MpsClientTerminated",
                       "at": "2026-01-01T10:00:08Z", **({"peers": peers} if peers else {})})


async def test_an_undecided_attempt_goes_on_probation_in_its_own_class_until_it_passes_its_step(
        tmp_path: Path) -> None:
    """gnnsched.attempts.probation: an undecided fault at step 37 puts the next attempt on probation (the pod's
    ``probation-step`` and the job's ``status.probationStep``, kept apart from its peers too) in the job's own
    runtime class, not the retry class; an attempt that then fails past step 37 (a neighbour's fault) clears it, and
    its requeue goes ahead in the retry class again; so does an attempt on probation that succeeds."""
    order = QueueOrder()
    async with emulated_cluster(tmp_path) as cluster:
        await queue_cluster(cluster, order, (order.retry_name, order.retry_value))
        async with running_operator(cluster, queue_priority=True, retry_priority=True):
            await cluster.create_job(manifest("gcn-cora"))
            first = await pod_named(cluster, "gcn-cora-0")
            await cluster.patch_pod("gcn-cora-0", {"metadata": {"annotations": {
                ANN_FAULT: _fault_record("victim", ["default/other"])}}})
            await cluster.patch_pod("gcn-cora-0", fault_ended_at(37))
            second = await pod_named(cluster, "gcn-cora-1")
            on_probation = await cluster.get_job("gcn-cora")
            await cluster.patch_pod("gcn-cora-1", {"metadata": {"annotations": {ANN_FAULT: _fault_record("victim")}}})
            await cluster.patch_pod("gcn-cora-1", ended("Failed", AttemptResult(
                outcome="fault", steps=52, message="cudaErrorMpsClientTerminated").line()
                + "\nCUDA error: cudaErrorMpsClientTerminated"))
            third = await pod_named(cluster, "gcn-cora-2")
            passed = await cluster.get_job("gcn-cora")
            # another job on probation whose next attempt succeeds: it ran every step, its probation ends
            await cluster.create_job(manifest("gat-cora"))
            await pod_named(cluster, "gat-cora-0")
            await cluster.patch_pod("gat-cora-0", {"metadata": {"annotations": {
                ANN_FAULT: _fault_record("victim", ["default/other"])}}})
            await cluster.patch_pod("gat-cora-0", fault_ended_at(5))
            await pod_named(cluster, "gat-cora-1")
            await cluster.patch_pod("gat-cora-1", {"metadata": {"annotations": {ANN_GPU: "GPU-a100-0"}}})
            await cluster.patch_pod("gat-cora-1", ended("Succeeded", json.dumps({"outcome": "succeeded"}),
                                                        "Completed", 0))
            done = await job_status(cluster, "gat-cora", "Succeeded")
    assert on_probation is not None and passed is not None
    ann = second["metadata"]["annotations"]
    assert ann[ANN_PROBATION_STEP] == "37" and ann[ANN_FAULT_PEERS] == "default/other"
    assert on_probation["status"]["probationStep"] == 37
    requeued = next(c for c in on_probation["status"]["conditions"] if c["type"] == "Requeued")
    assert "on probation until it passes step 37" in requeued["message"]
    assert on_probation["status"]["podFacts"]["probationStep"] == 37  # what the gate trusts
    assert second["spec"]["priorityClassName"] == first["spec"]["priorityClassName"] != order.retry_name
    assert ANN_PROBATION_STEP not in third["metadata"]["annotations"]
    assert not passed["status"].get("probationStep")
    assert third["spec"]["priorityClassName"] == order.retry_name
    assert "probationStep" not in done
