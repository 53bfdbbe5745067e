"""The operator's pure parts (pod view, conditions, names, pod spec, history, GPUNode parsing) and its handlers fed
malformed or partial objects: none may raise; each either reports a condition or ignores what is not its own."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gnnsched.contract import ANN_ADMITTED_AT, ANN_GPU, ANN_JOB, ANN_OBSERVED_PEAK_BYTES, ANN_QOS_TARGET
from gnnsched.operator.gpu_pod_tools import GATE_LAUNCHER
from gnnsched.operator.history import record_from_job, records_from_jobs
from gnnsched.operator.planning import Plan, gpus_from_gpunode, memory_key
from gnnsched.operator.podspec import build_pod, config_map_name, container_command, pod_name
from gnnsched.operator.status import last_json_object, set_condition, view_pod
from gnnsched.spec import parse_spec

GATE = ["python", GATE_LAUNCHER]

SPEC = {"mode": "train", "model": {"arch": "gcn"}, "graph": {"dataset": "cora"}, "epochs": 10}


def pod(phase: str = "Pending", node: str | None = None, annotations: dict[str, str] | None = None,
        state: dict[str, Any] | None = None, conditions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "j-0", "annotations": annotations or {}},
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": phase, "conditions": conditions or [],
                   "containerStatuses": [{"name": "gnn", "state": state}] if state else []},
    }


@pytest.mark.parametrize(("obj", "phase"), [
    (pod(), "Estimated"),
    (pod(conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                      "message": "0/3 nodes: GPU memory"}]), "Unschedulable"),
    (pod(node="n1"), "Scheduled"),
    (pod("Running", "n1", state={"running": {"startedAt": "2026-01-01T00:00:00Z"}}), "Queued"),
    (pod("Running", "n1", {ANN_GPU: "GPU-1", ANN_ADMITTED_AT: "2026-01-01T00:00:01Z"}), "Running"),
    (pod("Succeeded", "n1"), "Succeeded"),
    (pod("Failed", "n1", state={"terminated": {"reason": "OOMKilled", "exitCode": 137}}), "Failed"),
])
def test_pod_phase_maps_to_job_phase(obj: dict[str, Any], phase: str) -> None:
    assert view_pod(obj).phase == phase


def test_failed_pod_keeps_container_reason_exit_code_and_message() -> None:
    view = view_pod(pod("Failed", "n1", state={"terminated": {"reason": "OOMKilled", "exitCode": 137,
                                                              "message": "Killed"}}))
    assert (view.failure_reason, view.exit_code, view.failure_message) == ("OOMKilled", 137, "Killed")
    # No container status at all (e.g. evicted): the pod's own reason, else "Error".
    evicted = {"status": {"phase": "Failed", "reason": "Evicted", "message": "node low on memory"}}
    assert view_pod(evicted).failure_reason == "Evicted"


def test_a_failed_install_of_the_gate_is_named_not_blamed_on_the_job() -> None:
    """The init container that copies gnnsched's gate and runner failed: the job's container never ran."""
    failed = {"status": {"phase": "Failed", "message": "init container install-gnnsched failed",
                         "initContainerStatuses": [{"name": "install-gnnsched", "state": {"terminated": {
                             "exitCode": 1, "reason": "Error", "message": "error: --install: No space left"}}}]}}
    view = view_pod(failed)
    assert view.failure_reason == "InstallFailed"
    assert view.failure_message == "init container install-gnnsched: Error: error: --install: No space left"


def test_observed_peak_comes_from_agent_annotation_first_then_worker_result_line() -> None:
    state = {"terminated": {"startedAt": "2026-01-01T00:00:00Z", "finishedAt": "2026-01-01T00:00:30Z",
                            "message": 'noise\n{"observed_peak_bytes": 1000, "seconds": 29.0}\n'}}
    assert view_pod(pod("Succeeded", "n1", state=state)).observed_peak_bytes == 1000
    annotated = pod("Succeeded", "n1", {ANN_OBSERVED_PEAK_BYTES: "2048"}, state=state)
    view = view_pod(annotated)
    assert view.observed_peak_bytes == 2048 and view.observed_runtime_seconds == 30.0
    assert last_json_object("x\n{broken\n") is None and last_json_object(None) is None
    assert view.prestart_fallback is None


def test_prestart_fallback_comes_from_the_worker_result_line() -> None:
    line = json.dumps({"outcome": "succeeded", "observed_peak_bytes": 5, "prestart_fallback": "  why  "})
    view = view_pod(pod("Succeeded", "n1", state={"terminated": {"message": line + "\n"}}))
    assert view.prestart_fallback == "why"
    blank = json.dumps({"observed_peak_bytes": 5, "prestart_fallback": ""})
    assert view_pod(pod("Succeeded", "n1", state={"terminated": {"message": blank}})).prestart_fallback is None


def test_condition_transition_time_moves_only_when_status_changes() -> None:
    first = set_condition([], "Schedulable", "True", "Bound", "a", "2026-01-01T00:00:00Z")
    same = set_condition(first, "Schedulable", "True", "Bound", "b", "2026-01-01T00:01:00Z")
    flipped = set_condition(same, "Schedulable", "False", "Unschedulable", "c", "2026-01-01T00:02:00Z")
    assert same[0]["lastTransitionTime"] == "2026-01-01T00:00:00Z" and same[0]["message"] == "b"
    assert flipped[0]["lastTransitionTime"] == "2026-01-01T00:02:00Z"
    assert len(flipped) == 1


def test_names_are_deterministic_and_valid_even_for_long_job_names() -> None:
    long = "j" * 253
    assert pod_name("gcn", 0) == "gcn-0" and config_map_name("gcn") == "gcn-spec"
    assert pod_name(long, 3) == pod_name(long, 3) and len(pod_name(long, 3)) <= 253
    assert pod_name(long, 3) != pod_name(long[:-1] + "k", 3)
    assert len(config_map_name(long)) <= 253


def _plan(**changes: Any) -> Plan:
    fields = dict(pmc_bytes=10, admit_bytes=20, predicted_runtime_seconds=1.5, runtime_source="analytic-prior",
                  runtime_gpu_model="A100-40GB", intensity="memory", scaled_cpu="2", scaled_memory="3Gi")
    return Plan(**{**fields, **changes})


def test_builtin_worker_starts_up_behind_the_gate_and_a_user_command_never_does() -> None:
    """``gnnsched gate --prestart`` only for the built-in worker, which reads its admission before using the GPU; a
    user's command may not, and would run with no GPU visible, so it keeps the plain gate."""
    spec = parse_spec(SPEC)
    assert container_command(spec, prestart=True)[:6] == [*GATE, "--prestart", "--", "gnnsched", "worker"]
    assert container_command(spec)[:5] == [*GATE, "--", "gnnsched", "worker"]  # off by default
    user = parse_spec({**SPEC, "command": ["python", "train.py"]})
    assert container_command(user, prestart=True) == [*GATE, "--", "python", "train.py"]


def test_an_entrypoint_job_runs_the_copied_runner_behind_the_copied_gate_and_never_prestarts() -> None:
    """Nothing of gnnsched is looked up in the user's image: the gate and the step runner come from the volume the
    init container fills; the request carries what the worker would read from the manifest."""
    from gnnsched.entrypoint_probe import run_request
    from gnnsched.operator.gpu_pod_tools import RUN_LAUNCHER, TOOLS_DIR

    entry = {**SPEC, "image": "me/mine:1", "model": {"entrypoint": "my_gnn.model:build"},
             "graph": {"nodes": 100, "edges": 400, "features": 8, "classes": 3}, "args": ["--seed", "3"]}
    spec = parse_spec(entry)
    command = container_command(spec, worker_device="cpu", prestart=True)
    assert command[:3] == [*GATE, "--"] and command[3:5] == ["python", RUN_LAUNCHER]
    assert json.loads(command[command.index("--request") + 1]) == run_request(spec)
    assert command[-4:] == ["--device", "cpu", "--seed", "3"]
    pod = build_pod({"metadata": {"name": "e", "namespace": "team-b", "uid": "u1"}, "spec": entry}, spec, _plan(), 0,
                    "gnnsched:1", worker_prestart=True)
    assert "gnnsched.io/prestart" not in pod["metadata"]["annotations"]
    init = pod["spec"]["initContainers"][0]
    assert init["image"] == "gnnsched:1" and init["command"][-2:] == ["--install", TOOLS_DIR]
    assert pod["spec"]["containers"][0]["image"] == "me/mine:1"
    # a mini-batch entrypoint job too: the sampler is portable, its batching travels in the request
    mini = parse_spec({**entry, "batching": {"mode": "minibatch", "batchSize": 32, "fanouts": [5, 5]},
                       "model": {"entrypoint": "my_gnn.model:build", "layers": 2}})
    command = container_command(mini)
    assert command[3:5] == ["python", RUN_LAUNCHER]
    assert json.loads(command[command.index("--request") + 1])["batching"] == {"batchSize": 32, "fanouts": [5, 5]}


def test_user_command_is_wrapped_by_the_gate_and_unknown_runtime_leaves_no_annotation() -> None:
    spec = parse_spec({**SPEC, "image": "me/mine:1", "command": ["python", "train.py"], "args": ["--fast"]})
    assert container_command(spec) == [*GATE, "--", "python", "train.py", "--fast"]
    job = {"metadata": {"name": "j", "namespace": "ns", "uid": "u-1"}, "spec": SPEC}
    body = build_pod(job, spec, _plan(predicted_runtime_seconds=None), 0, "default/image:1")
    assert body["spec"]["containers"][0]["image"] == "me/mine:1"
    assert "gnnsched.io/predicted-runtime-seconds" not in body["metadata"]["annotations"]
    assert body["metadata"]["annotations"][ANN_JOB] == "ns/j"


def test_inference_pod_carries_its_latency_target_for_the_gate() -> None:
    """The gate's share rule keeps an inference job's ``qosTargetSeconds``: the operator passes it on the pod (the
    simulator passes the same target); a training pod, or an inference pod without a target, carries none."""
    job = {"metadata": {"name": "j", "namespace": "ns", "uid": "u-1"}, "spec": SPEC}
    infer = parse_spec({"mode": "infer", "model": {"arch": "gcn"}, "graph": {"dataset": "cora"}, "requests": 100,
                        "qosTargetSeconds": 2.5})
    assert build_pod(job, infer, _plan(), 0, "default/image:1")["metadata"]["annotations"][ANN_QOS_TARGET] == "2.5"
    untargeted = parse_spec({"mode": "infer", "model": {"arch": "gcn"}, "graph": {"dataset": "cora"}, "requests": 1})
    for spec in (parse_spec(SPEC), untargeted):
        assert ANN_QOS_TARGET not in build_pod(job, spec, _plan(), 0, "default/image:1")["metadata"]["annotations"]


def test_prestarted_worker_pods_say_so_for_the_gate() -> None:
    """``gnnsched.io/prestart: "true"`` exactly where the command runs behind ``gate --prestart``: the built-in
    worker with ``worker_prestart``, never a user's command (the gate's spread rule reads it for the start-up)."""
    from gnnsched.contract import ANN_PRESTART

    job = {"metadata": {"name": "j", "namespace": "ns", "uid": "u-1"}, "spec": SPEC}
    custom = parse_spec({**SPEC, "image": "mine:1", "command": ["python", "train.py"]})
    for spec, prestart, want in ((parse_spec(SPEC), True, True), (parse_spec(SPEC), False, False),
                                 (custom, True, False)):
        pod = build_pod(job, spec, _plan(), 0, "default/image:1", worker_prestart=prestart)
        assert (pod["metadata"]["annotations"].get(ANN_PRESTART) == "true") == want
        assert ("--prestart" in pod["spec"]["containers"][0]["command"]) == want


def test_plan_survives_a_merge_patch_round_trip_that_drops_nulls() -> None:
    plan = _plan(predicted_runtime_seconds=None, intensity=None, scaled_cpu=None)
    stored = {k: v for k, v in plan.model_dump(mode="json").items() if v is not None}
    assert Plan.model_validate(stored) == plan


def test_memory_key_ignores_what_does_not_change_gpu_memory() -> None:
    a = parse_spec({**SPEC, "epochs": 10, "resources": {"cpu": "2"}})
    b = parse_spec({**SPEC, "epochs": 500, "image": "x/y:1"})
    c = parse_spec({**SPEC, "model": {"arch": "gcn", "hidden": 128}})
    assert memory_key(a) == memory_key(b) != memory_key(c)
    sgd = parse_spec({**SPEC, "optimizer": {"name": "sgd"}})  # each optimizer holds different state
    assert memory_key(sgd) != memory_key(a)
    mine = {**SPEC, "model": {"entrypoint": "mypkg.models:build"}}
    # an entrypoint's code lives in its image: another image is another model
    assert memory_key(parse_spec({**mine, "image": "x/y:1"})) != memory_key(parse_spec({**mine, "image": "x/y:2"}))


def test_gpunode_status_is_read_and_malformed_ones_yield_nothing() -> None:
    good = {"metadata": {"name": "n1"}, "status": {"nodeName": "n1", "gpus": [
        {"index": 0, "uuid": "G0", "model": "T4", "totalBytes": 100, "reserveBytes": 10}]}}
    [gpu] = gpus_from_gpunode(good)
    assert (gpu.node, gpu.model, gpu.capacity_bytes) == ("n1", "T4", 90)
    bad: Any
    for bad in (None, [], {"status": "x"}, {"status": {"gpus": "x"}}, {"status": {"gpus": [{"index": -1}]}}):
        assert gpus_from_gpunode(bad) == []


def test_history_records_only_succeeded_jobs_in_the_predictors_format() -> None:
    from gnnsched.predictor.history import HistoryRecord

    finished: dict[str, Any] = {"metadata": {"name": "a", "namespace": "ns", "uid": "u"}, "spec": SPEC, "status": {
        "phase": "Succeeded", "observedRuntimeSeconds": 12.0, "pmcBytes": 5, "observedPeakBytes": 6, "gpu": "G0",
        "finishedAt": "2026-01-01T00:00:12Z", "node": "n1",
        "plan": {"runtime_gpu_model": "A100-40GB", "requested_cpu": "4", "requested_memory": "8Gi",
                 "scaled_cpu": "2", "scaled_memory": "6Gi"}}}
    running = {**finished, "status": {**finished["status"], "phase": "Running"}}
    failed = {**finished, "status": {**finished["status"], "phase": "Failed"}}
    records = records_from_jobs([finished, running, failed, None, {"spec": "x"}], {"G0": "T4"})
    assert len(records) == 1
    record = HistoryRecord.model_validate(records[0])
    assert (record.gpu_model, record.requested.cpu, record.scaled.cpu, record.scaled.memory) == ("T4", 4, 2, 6 * 2**30)
    assert json.loads(json.dumps(records[0])) == records[0]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
pod_like = st.fixed_dictionaries({}, optional={
    "metadata": st.dictionaries(st.sampled_from(["name", "annotations", "labels"]), json_values, max_size=3),
    "spec": st.dictionaries(st.sampled_from(["nodeName", "containers"]), json_values, max_size=2),
    "status": st.dictionaries(st.sampled_from(["phase", "conditions", "containerStatuses", "reason"]), json_values,
                              max_size=4),
})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obj=st.one_of(json_values, pod_like))
def test_pure_readers_never_raise_on_arbitrary_objects(obj: Any) -> None:
    view_pod(obj)
    gpus_from_gpunode(obj)
    record_from_job(obj)
    last_json_object(obj if isinstance(obj, str) else json.dumps(obj, default=str))


@pytest.mark.asyncio
async def test_handlers_never_raise_on_malformed_or_partial_objects(tmp_path: Path) -> None:
    """Each handler entry point, fed junk, returns normally (a reportable job gets a condition)."""
    from operator_harness import emulated_cluster

    from gnnsched.kubeclient import load_client_configuration
    from gnnsched.operator.handlers import Operator, OperatorConfig
    from gnnsched.operator.kube import Kube
    from gnnsched.operator.planning import Planner

    async with emulated_cluster(tmp_path) as cluster:
        partial = {"apiVersion": "gnnsched.io/v1alpha1", "kind": "GNNJob",
                   "metadata": {"name": "partial", "namespace": "default"}, "spec": {"mode": "train"}}
        created = await cluster.create_job(partial)
        kube = Kube(load_client_configuration(str(cluster.kubeconfig)))
        op = Operator(OperatorConfig(), kube, Planner())
        junk: list[Any] = [None, {}, [], "x", {"metadata": None}, {"metadata": {"name": 3}}, {"spec": None},
                           {"metadata": {"name": "ghost", "namespace": "default", "uid": "u"}, "spec": SPEC},
                           {"metadata": {"annotations": {ANN_JOB: "no-slash"}}},
                           {"metadata": {"annotations": {ANN_JOB: "default/partial"}, "labels": {"x": None}}},
                           {"metadata": {"annotations": {ANN_JOB: "default/missing"}}, "status": {"phase": 7}}]

        def feed() -> None:
            for obj in junk:
                op.on_job(obj)
                op.on_pod_event(obj, event={"type": "MODIFIED"})
                op.on_resync(obj)
                op.on_delete(obj)
            op.on_job(created)

        await asyncio.to_thread(feed)
        job = await cluster.get_job("partial")
        kube.close()
    status = job["status"]
    assert status["phase"] == "Failed"
    [cond] = [c for c in status["conditions"] if c["type"] == "Validated"]
    assert cond["reason"] == "InvalidSpec" and cond["message"].startswith("spec.model: required")


def test_cli_rejects_contradictory_flags_and_bad_kubeconfig_with_one_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gnnsched.cli import app

    runner = CliRunner()
    both = runner.invoke(app, ["operator", "--namespace", "a", "--all-namespaces"])
    assert both.exit_code == 2
    assert both.output.strip().splitlines() == ["error: --namespace and --all-namespaces are mutually exclusive"]
    missing = runner.invoke(app, ["operator", "export-history", "--out", str(tmp_path / "h.jsonl"),
                                  "--kubeconfig", str(tmp_path / "absent")])
    assert missing.exit_code == 2 and missing.output.startswith("error: --kubeconfig:")
    assert len(missing.output.strip().splitlines()) == 1


def test_a_sub_millisecond_runtime_prediction_stays_positive() -> None:
    """The extender takes only a positive predicted runtime; a tiny job's prediction rounded to 0.000 made its pod
    unschedulable ("'0.000' must be a positive number of seconds"). The plan keeps at least the 1 ms resolution."""
    from gnnsched.contract import PREDICTED_RUNTIME_RESOLUTION_S
    from gnnsched.operator.planning import Planner
    from gnnsched.spec import parse_spec

    class Tiny(Planner):
        def _predict_runtime(self, spec: Any, gpu_model: Any, cpu: float, memory: int) -> tuple[float | None, str]:
            return 0.00004, "test"

    spec = parse_spec({"mode": "infer", "model": {"arch": "gcn", "layers": 1, "hidden": 8}, "requests": 1,
                       "graph": {"nodes": 100, "edges": 300, "features": 4, "classes": 2}})
    plan = Tiny().plan(spec, [])
    assert plan.predicted_runtime_seconds == PREDICTED_RUNTIME_RESOLUTION_S > 0


def test_a_calibrated_runtime_class_scales_the_prediction_and_says_so() -> None:
    """The planner multiplies the predictor's runtime by its runtime class's factor once the class has min_samples
    (``closed_loop.runtime_class``), records the factor so the next sample is taken against the bare prediction,
    and leaves other classes as they were."""
    from gnnsched.closed_loop import DEFAULT_RUNTIME_CALIBRATION, CalibrationTable, runtime_class
    from gnnsched.operator.planning import Planner
    from gnnsched.spec import parse_spec

    class Fixed(Planner):
        def _predict_runtime(self, spec: Any, gpu_model: Any, cpu: float, memory: int) -> tuple[float | None, str]:
            return 100.0, "test"

    spec = parse_spec({"mode": "infer", "model": {"arch": "gcn", "layers": 1, "hidden": 8}, "requests": 1,
                       "graph": {"nodes": 100, "edges": 300, "features": 4, "classes": 2},
                       "scaling": {"enabled": False}})
    planner = Fixed(default_gpu_model="A100-40GB")
    table = CalibrationTable()
    cls = runtime_class(spec, "A100-40GB", "builtin")
    for ratio in (3.0, 2.5, 3.5, 3.0, 2.9):
        table = table.record(cls, ratio, DEFAULT_RUNTIME_CALIBRATION)
    bare = planner.plan(spec, [])
    calibrated = planner.plan(spec, [], runtime_calibration=table)
    assert bare.predicted_runtime_seconds == 100.0 and bare.runtime_factor is None and bare.runtime_source == "test"
    assert calibrated.predicted_runtime_seconds == 300.0 and calibrated.runtime_factor == 3.0
    assert calibrated.runtime_source == "test, calibrated x3 (A100-40GB.gcn-e8.infer.builtin, class samples)"
    other = parse_spec({**spec.model_dump(mode="json", by_alias=True, exclude_none=True), "mode": "train",
                        "requests": None})
    assert planner.plan(other, [], runtime_calibration=table).predicted_runtime_seconds == 100.0


@pytest.mark.asyncio
async def test_a_resync_from_a_stale_body_leaves_a_deleted_pods_end_to_its_event(tmp_path: Path) -> None:
    """An evicted pod's end is the pod watch's to record (its DELETED event carries ``DisruptionTarget``: an uncharged
    requeue). A resync that finds the pod gone, from a timer body taken before the eviction, used to re-create the
    pod under the same attempt and overwrite the requeue. Now it leaves a pod whose uid the status recorded to its
    event; a stale body of an attempt since requeued changes nothing; a pod still gone at the next resync (its event
    lost) is re-created, and its earlier incarnation's late event is ignored."""
    from operator_harness import a100, emulated_cluster, manifest

    from gnnsched.kubeclient import load_client_configuration
    from gnnsched.operator.handlers import Operator, OperatorConfig
    from gnnsched.operator.kube import Kube
    from gnnsched.operator.planning import Planner

    async with emulated_cluster(tmp_path) as cluster:
        await cluster.add_gpunode("node-a", [a100()])
        created = await cluster.create_job(manifest("evicted"))
        kube = Kube(load_client_configuration(str(cluster.kubeconfig)))
        op = Operator(OperatorConfig(), kube, Planner())
        await asyncio.to_thread(op.on_job, created)
        stale = await cluster.get_job("evicted")
        assert stale is not None and stale["status"]["attempts"] == 1
        (pod,) = await cluster.pods()
        first_uid = pod["metadata"]["uid"]
        assert stale["status"]["podFacts"]["podUid"] == first_uid
        # the eviction: DisruptionTarget on the pod, then its deletion
        await cluster.patch_pod(pod["metadata"]["name"], {"status": {"conditions": [
            {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}]}}, status_sub=True)
        (final,) = await cluster.pods()
        code, _ = await cluster.request("DELETE", f"/api/v1/namespaces/default/pods/{pod['metadata']['name']}")
        assert code == 200
        await asyncio.to_thread(op.on_resync, stale)
        assert await cluster.pods() == []  # not re-created: the DELETED event says how it ended
        await asyncio.to_thread(op.on_pod_event, final, {"type": "DELETED"})
        job = await cluster.get_job("evicted")
        assert job is not None and job["status"]["attempts"] == 2 and not job["status"].get("retriesUsed")
        requeued = next(c for c in job["status"]["conditions"] if c["type"] == "Requeued")
        assert requeued["reason"] == "Disrupted", requeued
        second = job["status"]["podName"]
        assert [p["metadata"]["name"] for p in await cluster.pods()] == [second]
        await asyncio.to_thread(op.on_resync, stale)  # the stale body's attempt was requeued: nothing to do
        assert [p["metadata"]["name"] for p in await cluster.pods()] == [second]
        assert (await cluster.get_job("evicted"))["status"]["attempts"] == 2  # type: ignore[index]
        # a pod whose DELETED event is lost: left one resync interval, then re-created under its attempt
        (gone,) = await cluster.pods()
        await cluster.request("DELETE", f"/api/v1/namespaces/default/pods/{second}")
        await asyncio.to_thread(op.on_resync, job)
        assert await cluster.pods() == []
        await asyncio.to_thread(op.on_resync, job)
        (again,) = await cluster.pods()
        assert again["metadata"]["name"] == second and again["metadata"]["uid"] != gone["metadata"]["uid"]
        await asyncio.to_thread(op.on_pod_event, gone, {"type": "DELETED"})  # its late event: an earlier pod
        after = await cluster.get_job("evicted")
        assert after is not None and after["status"]["attempts"] == 2 and after["status"]["phase"] != "Failed"
        kube.close()
