"""kopf handlers: GNNJob create/resume/delete, pod events and a periodic resync, all idempotent.

Control flow (every step safe to repeat, so a kill at any point followed by a restart converges to one pod):

1. GNNJob created or operator resumed -> ``reconcile_job``: validate (``parse_spec`` plus what the schema cannot say),
   plan (PMC, admit bytes, runtime, scaled resources; reused from ``status.plan`` for the same generation), write the
   plan into the status *before* creating anything, then ensure the ConfigMap and the pod of the current attempt:
   deterministic names make a 409 mean "already created by me or a previous me", which is adopted after checking the
   owner uid, never retried blindly.
2. Pod events (label ``app.kubernetes.io/managed-by=gnnsched``, selected by the API server: ``podwatch.py``) ->
   ``sync_pod``: derive phase, node, GPU, group, times, observed peak and failure reason from the pod
   (``status.view_pod``); a failed pod is retried with the next attempt's pod while ``attempts <= backoffLimit``;
   else the job fails with the container's reason.
3. A timer re-runs the same sync for non-terminal jobs, so a missed event or a transient API error only delays.
4. GNNJob deleted -> its pods and ConfigMap are deleted (the finalizer holds the job until then; in a real cluster
   owner references would also let the garbage collector do it).

Status is written by this module through the API (merge patch of the status subresource), not through kopf's patch,
so that the plan is persisted before the pod exists and the pod handler never races with a delayed kopf patch.
Every handler catches everything: transient API failures become ``kopf.TemporaryError`` (retried by kopf), anything
else becomes a condition on the job. No malformed or partial object can make a handler raise.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any, Literal, cast

from pydantic import BaseModel, Field, model_validator

from gnnsched import __version__
from gnnsched.attempts.checkpointing import ran_share, runtime_sample_share
from gnnsched.attempts.failure_policy import describe
from gnnsched.attempts.fault_classes import counted_class, fault_step
from gnnsched.closed_loop import (
    MEASURED_OVERPREDICTION,
    AttemptResult,
    CalibrationClass,
    CalibrationTable,
    runtime_class,
)
from gnnsched.contract import (
    ANN_ADMIT_BYTES,
    ANN_EXCLUSIVE,
    ANN_GPU,
    ANN_JOB,
    ANN_PREDICTED_RUNTIME,
    API_VERSION,
    GNNJOB_KIND,
    GNNJOB_PLURAL,
    GROUP,
    LABEL_JOB_NAME,
    LABEL_MANAGED_BY,
    MANAGED_BY_VALUE,
    QUEUE_CLASS_PREFIX,
    QUEUE_PRIORITY_BASE,
    SCHEDULER_NAME,
    VERSION,
)
from gnnsched.entrypoint_probe import ProbeRecord, ProbeResult, cache_key, probe_request
from gnnsched.gpu.measured import ALLOCATOR_MISMATCH, UNKNOWN_GPU_MODEL, measurement_fingerprint
from gnnsched.quantity import format_bytes
from gnnsched.queue_order import DEFAULT_PER_DOUBLING, QueueOrder
from gnnsched.spec import GNNJobSpec, SpecError, parse_spec
from gnnsched.trust.job_facts import STATUS_FIELD as STATUS_FACTS
from gnnsched.trust.job_facts import facts_patch, facts_status, with_annotations

from . import attempt_rules, checkpoint
from .admission import (
    REFUSED,
    PodCreateRefused,
    create_backoff_seconds,
    job_field,
    never_admissible,
    refusal_message,
    refusal_reason,
    rejected_fields,
)
from .calibration import CalibrationSample, CalibrationStore
from .checkpoint import CheckpointSettings
from .kube import Kube, KubeError
from .metrics import OperatorMetrics
from .planning import ClusterGPU, Plan, PlanError, Planner, gpus_from_gpunode
from .podspec import (
    LABEL_ATTEMPT,
    JobPodSettings,
    build_config_map,
    build_pod,
    config_map_name,
    job_label,
    pod_name,
)
from .probe import (
    ANN_PROBE_KEY,
    INVALID_ENTRYPOINT,
    ProbeCache,
    ProbeSettings,
    build_probe_pod,
    is_probe_pod,
    read_probe_pod,
)
from .resize import (
    AGENT_VERDICT_SECONDS,
    AttemptFacts,
    attempt_facts,
    decide,
    settle_without_verdict,
    verdict_wait_seconds,
)
from .status import TERMINAL, PodView, measured_peak, measured_runtime, now_rfc3339, set_condition, view_pod

log = logging.getLogger("gnnsched.operator")

DEFAULT_IMAGE = f"ghcr.io/gnnsched/gnnsched:{__version__}"


RETRY_FIRST_REASONS = ("Resized", "Requeued")
"""``status.attemptReason`` values whose attempt goes in the retry class: the system's misjudgement or a neighbour's
fault made it, not the job (``Retrying``, charged to ``backoffLimit``, keeps the job's class)."""


class OperatorConfig(BaseModel):
    """Run-time settings of one operator process (flags of ``gnnsched operator``)."""

    namespaces: list[str] = Field(default_factory=list)  # empty: all namespaces
    image: str = DEFAULT_IMAGE
    default_gpu_model: str = "A100-40GB"
    workers: int = Field(default=8, ge=1, le=256)  # threads for sync handlers (estimation is CPU work)
    resync_seconds: float = Field(default=30.0, gt=0)
    watch_client_timeout: float | None = None  # seconds; short in tests so the first event is not delayed
    finalizer: str = "gnnsched.io/cleanup"
    scheduler_name: str = SCHEDULER_NAME  # the kube-scheduler profile that calls the gnnsched extender
    # Device of the built-in worker: cuda on GPU nodes, cpu where the agents' GPUs are fake (no CUDA behind them).
    worker_device: Literal["cuda", "cpu"] = "cuda"
    # The built-in worker does its CPU start-up while it waits at the gate (gnnsched gate --prestart).
    # On an H100, importing torch_geometric while CUDA_VISIBLE_DEVICES is empty initialised the CUDA
    # driver with no device, so every prestarted CUDA worker failed after admission (docs/gpu-measurements.md). The
    # worker now guards that phase (gnnsched.gpu.cuda_guard) and falls back to a plain start where the guard misses a
    # path (gnnsched.gate_handoff.reexec_admitted). Off in the CLI, on in the chart (operator.workerPrestart).
    worker_prestart: bool = False
    health_port: int | None = None  # serve kopf's liveness probe at http://0.0.0.0:PORT/healthz
    metrics_port: int | None = None  # serve Prometheus metrics at http://0.0.0.0:PORT/metrics (0: any free port)
    # Shortest-predicted-first queue order (gnnsched.queue_order): give each pod the PriorityClass of its predicted
    # runtime's bucket. The classes must exist (the chart creates them with queuePriority.enabled).
    queue_priority: bool = False
    # Retries first (gnnsched.queue_order): a resized attempt or a requeued fault victim gets the class
    # ``<prefix>retry``, above the band, so it goes ahead of pods that have not run (the chart's
    # queuePriority.retryFirst creates it).
    retry_priority: bool = False
    queue_priority_base: int = QUEUE_PRIORITY_BASE
    queue_priority_prefix: str = QUEUE_CLASS_PREFIX
    queue_priority_per_doubling: int = DEFAULT_PER_DOUBLING
    # UID, RuntimeClass, tolerations and nodeSelector of every job pod (chart values jobs.*; podspec.JobPodSettings).
    pods: JobPodSettings = Field(default_factory=JobPodSettings)
    # Bounds of an entrypoint job's CPU-only probe pod (operator/probe.py; chart values operator.probe.*).
    probe: ProbeSettings = Field(default_factory=ProbeSettings)
    # The ConfigMap ("NAMESPACE/NAME") the retrain CronJob keeps the runtime model in (gnnsched.predictor.store), read
    # every predictor_reload_seconds and swapped in without a restart (operator/predictor_model.py); None: the shipped
    # model only.
    predictor_model_configmap: str | None = Field(default=None, pattern=r"^[a-z0-9][-a-z0-9]*/[a-z0-9][-.a-z0-9]*$")
    predictor_reload_seconds: float = Field(default=60.0, gt=0)
    # spec.checkpoint's volume and interval (operator/checkpoint.py; chart values checkpoint.*).
    checkpoint: CheckpointSettings = Field(default_factory=CheckpointSettings)

    @model_validator(mode="after")
    def _queue_order_valid(self) -> OperatorConfig:
        self.queue_order()  # QueueOrderError (a ValueError) names the field
        return self

    def queue_order(self) -> QueueOrder:
        return QueueOrder(base=self.queue_priority_base, prefix=self.queue_priority_prefix,
                          per_doubling=self.queue_priority_per_doubling)


class JobRef(BaseModel):
    namespace: str
    name: str
    uid: str
    generation: int | None = None


def _dict(value: Any) -> dict[str, Any]:
    """A plain dict (kopf passes read-only mapping views); anything that is not a mapping becomes empty."""
    if isinstance(value, dict):
        return value
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return {}


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _job_ref(body: dict[str, Any]) -> JobRef:
    meta = _dict(body.get("metadata"))
    missing = [k for k in ("namespace", "name", "uid") if not isinstance(meta.get(k), str) or not meta.get(k)]
    if missing:
        raise SpecError(f"metadata.{missing[0]}", "missing from the object (a partial object cannot be run)")
    gen = meta.get("generation")
    return JobRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"],
                  generation=gen if isinstance(gen, int) else None)


def _event_target(body: dict[str, Any]) -> dict[str, Any]:
    meta = _dict(body.get("metadata"))
    return {
        "apiVersion": API_VERSION,
        "kind": GNNJOB_KIND,
        "metadata": {k: meta.get(k) for k in ("name", "namespace", "uid") if meta.get(k)},
    }


def _plan_fields(plan: Plan) -> dict[str, Any]:
    """The status fields (CRD schema) that come from the plan, plus the whole plan for reuse after a restart."""
    return {
        "pmcBytes": plan.pmc_bytes,
        "pmc": format_bytes(plan.pmc_bytes),
        "admitBytes": plan.admit_bytes,
        "predictedRuntimeSeconds": plan.predicted_runtime_seconds,
        "requestedResources": {"cpu": plan.requested_cpu, "memory": plan.requested_memory},
        "scaledResources": {"cpu": plan.scaled_cpu, "memory": plan.scaled_memory},
        "estimateAdmitBytes": plan.estimate_admit_bytes,
        "reservationSource": plan.reservation_source,
        "safetyFactor": plan.safety_factor,
        "exclusive": plan.exclusive,
        "predictedPeakBytes": _need(plan, None),
        "plan": plan.model_dump(mode="json"),
    }


def _need(plan: Plan, gpu_model: str | None, constants: str | None = None) -> int | None:
    """The plan's predicted need (PMC plus device overheads, no safety factor) on ``gpu_model`` with the node
    measurement ``constants`` (its fingerprint; None: the catalogue's), or on the plan's own model. A model planned
    under several measurements answers with the need of the one asked for, else its catalogue need, else its
    largest."""
    exact = {(n.model, n.constants): n.bytes for n in plan.needs}
    own = (plan.admit_gpu_model, plan.admit_constants)
    for key in ((gpu_model, constants), (gpu_model, None), own, (plan.admit_gpu_model, None),
                (plan.runtime_gpu_model, None)):
        if key[0] is not None and key in exact:
            return exact[key]
    for name in (gpu_model, plan.admit_gpu_model, plan.runtime_gpu_model):
        same = [n.bytes for n in plan.needs if n.model == name]
        if name is not None and same:
            return max(same)
    return plan.needs[0].bytes if plan.needs else None


def _class_reason(attempt_reason: str | None, status: dict[str, Any]) -> str | None:
    """The attempt reason its PriorityClass is chosen by: a requeued attempt on probation is not put in the retry
    class (``gnnsched.attempts.probation``: ahead of the queue it would take the idle GPUs first)."""
    on_probation = attempt_rules.probation_of(status) is not None
    return "Probation" if attempt_reason in RETRY_FIRST_REASONS and on_probation else attempt_reason


def _count(status: dict[str, Any], key: str) -> int:
    value = status.get(key)
    return value if isinstance(value, int) and value >= 0 else 0


class Operator:
    """The handlers with their dependencies (API client, planner, settings); no module-level state."""

    def __init__(self, config: OperatorConfig, kube: Kube, planner: Planner,
                 metrics: OperatorMetrics | None = None) -> None:
        self.config = config
        self.kube = kube
        self.planner = planner
        self.metrics = metrics or OperatorMetrics()
        self.calibration = CalibrationStore(kube, self.metrics, lambda: self.planner.calibration_policy,
                                            runtime_policy=lambda: self.planner.runtime_policy,
                                            runtime_model=lambda: self.planner.predictor_id)
        self.metrics_port: int | None = None  # the bound port once ``main.run_async`` serves the metrics
        self.pod_watcher: Any = None  # the running podwatch.PodWatcher once ``main.run_async`` started it
        self.predictor_reloader: Any = None  # predictor_model.PredictorModelReloader with --predictor-model-configmap
        self._job_locks: dict[str, threading.Lock] = {}
        self._job_locks_guard = threading.Lock()
        # job uid -> uid of its attempt's pod that a resync found gone, awaiting that pod's DELETED event (_resync)
        self._pod_gone: dict[str, str] = {}
        self.probes = ProbeCache()

    # ------------------------------------------------------------------ events and status writes

    def _event(self, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        import kopf

        try:
            try:
                target = kopf.Body(cast(kopf.RawBody, _event_target(body)))
                kopf.event(target, type=type_, reason=reason, message=message[:1000])
            except LookupError:  # outside kopf's per-object context (the pod watch's threads): post it directly
                self.kube.post_event(_event_target(body), type_, reason, message[:1000])
        except Exception:  # noqa: BLE001 - an event is informative; failing to post must not fail the handler
            log.warning("could not post event %s for %s", reason, _dict(body.get("metadata")).get("name"))

    def _write(self, body: dict[str, Any], old: dict[str, Any], new: dict[str, Any], message: str = "",
               reason: str | None = None) -> None:
        """Patch the status fields that changed; post an event when the phase changes (``reason``: why a job
        became Failed or Unschedulable, for the metrics)."""
        ref = _job_ref(body)
        changed = {k: v for k, v in new.items() if old.get(k) != v}
        if not changed:
            return
        if self.kube.patch_job_status(ref.namespace, ref.name, changed) is None:
            return  # the job is gone
        old_phase, new_phase = old.get("phase"), new.get("phase")
        if new_phase and self.metrics.job_moved(ref.uid, new_phase, reason) and new_phase == "Succeeded":
            self.metrics.job_succeeded({**old, **changed})
        if new_phase and new_phase != old_phase:
            warning = new_phase in ("Failed", "Unschedulable")
            self._event(body, "Warning" if warning else "Normal", str(new_phase),
                        message or f"phase {old_phase or 'none'} -> {new_phase}")
        old.update(changed)

    def _fail(self, body: dict[str, Any], status: dict[str, Any], phase: str, ctype: str, reason: str,
              message: str) -> None:
        new = dict(status)
        new["phase"] = phase
        new["message"] = f"{reason}: {message}"
        new["conditions"] = set_condition(status.get("conditions"), ctype, "False", reason, message, now_rfc3339(),
                                          _dict(body.get("metadata")).get("generation"))
        if phase in TERMINAL and not status.get("finishedAt"):
            new["finishedAt"] = now_rfc3339()
        try:
            self._write(body, status, new, message=f"{reason}: {message}", reason=reason)
        except SpecError:
            log.warning("cannot report %s on a partial object: %s", reason, message)

    # ------------------------------------------------------------------ handlers (kopf entry points)

    def on_job(self, body: Any, logger: logging.Logger | logging.LoggerAdapter[Any] | None = None, **_: Any) -> None:
        """Create/resume: plan and ensure the pod. Transient API errors are retried by kopf; others are reported."""
        import kopf

        body = _dict(body)
        status = _dict(body.get("status"))
        self._seen(body, status)
        try:
            with self._job_lock(body, wait=True):
                current = self._current(body, status)
                if current is not None:
                    self.reconcile_job(*current)
        except PodCreateRefused as exc:
            self.metrics.api_errors.labels("job", "true").inc()
            raise kopf.TemporaryError(str(exc), delay=create_backoff_seconds(int(_.get("retry") or 0))) from None
        except KubeError as exc:
            self.metrics.api_errors.labels("job", str(exc.transient).lower()).inc()
            if exc.transient:
                raise kopf.TemporaryError(f"API server: {exc}", delay=3) from None
            self._fail_safely(body, status, "Failed", "Ready", "APIError", str(exc))
        except kopf.TemporaryError:
            raise
        except Exception as exc:  # noqa: BLE001 - a bug must surface on the job, not kill the handler loop
            log.exception("reconciling %s failed", _dict(body.get("metadata")).get("name"))
            self._fail_safely(body, status, "Failed", "Ready", "InternalError", f"{type(exc).__name__}: {exc}")

    def on_pod_event(self, body: Any, event: Any = None, **_: Any) -> None:
        """A gnnsched pod changed (or was listed at start-up): bring its job's status up to date."""
        body = _dict(body)
        event_type = _dict(event).get("type") if event is not None else None
        try:
            self.sync_pod(body, deleted=event_type == "DELETED")
        except KubeError as exc:
            self.metrics.api_errors.labels("pod", str(exc.transient).lower()).inc()
            log.warning("pod %s: %s (the resync timer will retry)", _dict(body.get("metadata")).get("name"), exc)
        except Exception:  # noqa: BLE001
            log.exception("pod %s: sync failed", _dict(body.get("metadata")).get("name"))

    def on_resync(self, body: Any, **_: Any) -> None:
        """Timer: re-derive a non-terminal job's status from its current pod (level-triggered safety net)."""
        import kopf

        body = _dict(body)
        status = _dict(body.get("status"))
        self._seen(body, status)
        if status.get("phase") in TERMINAL or _dict(body.get("metadata")).get("deletionTimestamp"):
            return
        try:
            with self._job_lock(body, wait=False) as mine:
                if mine:
                    self._resync(body, status)
        except PodCreateRefused as exc:
            log.info("resync of %s: %s", _dict(body.get("metadata")).get("name"), exc)  # the condition says it
        except KubeError as exc:
            self.metrics.api_errors.labels("resync", str(exc.transient).lower()).inc()
            if exc.transient:
                raise kopf.TemporaryError(f"API server: {exc}", delay=5) from None
            log.warning("resync of %s: %s", _dict(body.get("metadata")).get("name"), exc)
        except Exception:  # noqa: BLE001
            log.exception("resync of %s failed", _dict(body.get("metadata")).get("name"))

    @contextlib.contextmanager
    def _job_lock(self, body: dict[str, Any], wait: bool) -> Iterator[bool]:
        """One reconcile of a job at a time. The resync timer can fire while the create handler is still planning
        (the first trace takes seconds) from a body without a status yet; it then skips (``False``) instead of
        planning the job a second time. The create handler waits for a running resync."""
        uid = str(_dict(body.get("metadata")).get("uid") or "")
        with self._job_locks_guard:
            lock = self._job_locks.setdefault(uid, threading.Lock())
        got = lock.acquire(blocking=wait)
        try:
            yield got
        finally:
            if got:
                lock.release()

    def _current(self, body: dict[str, Any], status: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The job as stored now when ``body`` shows no pod yet (kopf's body may predate another handler's status
        write: planning from it would plan the job twice); None when the job is gone or finished."""
        if status.get("podName") is not None:
            return body, status
        try:
            ref = _job_ref(body)
        except SpecError:
            return body, status  # a partial object: reconcile_job reports it
        return self._stored(ref)

    def _stored(self, ref: JobRef) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The job and its status as the API server has them now; None when it is gone, re-created under its name
        (another uid) or finished."""
        fresh = self.kube.read_job(ref.namespace, ref.name)
        if fresh is None or _dict(fresh.get("metadata")).get("uid") != ref.uid:
            return None
        fresh_status = _dict(fresh.get("status"))
        if fresh_status.get("phase") in TERMINAL:
            return None
        return fresh, fresh_status

    def _resync(self, body: dict[str, Any], status: dict[str, Any]) -> None:
        ref = _job_ref(body)
        current = self._current(body, status)
        if current is None:
            return
        body, status = current
        if status.get("podName") is None:
            self.reconcile_job(body, status)  # not planned yet, or Unschedulable: GPUs may have joined since
            return
        pod = self.kube.read_pod(ref.namespace, str(status["podName"]))
        if pod is not None:
            self._pod_gone.pop(ref.uid, None)
            self._apply_pod(body, status, pod, deleted=False)
            return
        self._resync_without_pod(ref, status)

    def _resync_without_pod(self, ref: JobRef, status: dict[str, Any]) -> None:
        """A resync that finds the attempt's pod gone. Two cases: the pod was never created (the operator stopped
        between the status write and the create) or it was deleted (an eviction, ``kubectl delete``). A deleted pod's
        end is the pod watch's to record, from its DELETED event, which carries its final conditions
        (``DisruptionTarget``: a requeue that is not charged). The timer's body can predate that: it re-created the
        pod under the same attempt from a stale status and overwrote the requeue (a drained job ran on without a
        ``Requeued`` condition, tests/e2e/test_checkpoint_e2e.py under load). So the job is read again; a pod whose
        uid the status recorded is left to its event for one resync interval, and only a pod still gone at the next
        resync (its event lost) is re-created, as before."""
        stored = self._stored(ref)
        if stored is None:
            return
        fresh, fresh_status = stored
        if (fresh_status.get("podName"), fresh_status.get("attempts")) != (status.get("podName"),
                                                                            status.get("attempts")):
            return  # the job moved on (the pod event recorded the end): the next resync reads the new attempt
        facts = _dict(fresh_status.get(STATUS_FACTS))
        created = facts.get("podUid") if facts.get("pod") == fresh_status.get("podName") else None
        if isinstance(created, str) and self._pod_gone.get(ref.uid) != created:
            self._pod_gone[ref.uid] = created
            log.info("resync of %s/%s: pod %s (uid %s) is gone; its DELETED event records how it ended",
                     ref.namespace, ref.name, fresh_status.get("podName"), created)
            return
        self._pod_gone.pop(ref.uid, None)
        self.reconcile_job(fresh, fresh_status)

    def on_spec_update(self, body: Any, **_: Any) -> None:
        """A spec edit after the pod exists is not applied (pods are immutable); say so instead of ignoring it."""
        body = _dict(body)
        status = _dict(body.get("status"))
        if not status.get("podName"):
            return  # nothing created yet: the create/resync path plans with the new spec
        generation = _dict(body.get("metadata")).get("generation")
        new = dict(status)
        new["conditions"] = set_condition(
            status.get("conditions"), "SpecApplied", "False", "SpecChangedAfterStart",
            f"spec generation {generation} is not applied: the job keeps running as planned for generation "
            f"{status.get('observedGeneration')}; delete and re-create the GNNJob to run the new spec",
            now_rfc3339(), generation if isinstance(generation, int) else None)
        try:
            self._write(body, status, new)
            self._event(body, "Warning", "SpecChangedAfterStart", new["conditions"][-1]["message"])
        except Exception:  # noqa: BLE001
            log.exception("could not report a spec change on %s", _dict(body.get("metadata")).get("name"))

    def on_delete(self, body: Any, **_: Any) -> None:
        """Delete the job's pods and ConfigMap; transient failures keep the finalizer and are retried."""
        import kopf

        body = _dict(body)
        meta = _dict(body.get("metadata"))
        namespace, name = meta.get("namespace"), meta.get("name")
        if not isinstance(namespace, str) or not isinstance(name, str):
            return
        try:
            self.cleanup(namespace, name, _dict(body.get("status")))
        except KubeError as exc:
            self.metrics.api_errors.labels("delete", str(exc.transient).lower()).inc()
            if exc.transient:
                raise kopf.TemporaryError(f"cleanup: {exc}", delay=3) from None
            log.warning("cleanup of %s/%s: %s", namespace, name, exc)
        if isinstance(meta.get("uid"), str):
            self.metrics.job_gone(meta["uid"])
            self._pod_gone.pop(meta["uid"], None)

    def _seen(self, body: dict[str, Any], status: dict[str, Any]) -> None:
        """Count a job in its stored phase (jobs found at start-up are counted, not only the ones changed since)."""
        uid = _dict(body.get("metadata")).get("uid")
        if isinstance(uid, str):
            self.metrics.job_seen(uid, status.get("phase") or "Pending")

    def _fail_safely(self, body: dict[str, Any], status: dict[str, Any], phase: str, ctype: str, reason: str,
                     message: str) -> None:
        try:
            self._fail(body, status, phase, ctype, reason, message)
        except Exception:  # noqa: BLE001 - even the error report failed (API down): log, never raise
            log.exception("could not report %s on %s", reason, _dict(body.get("metadata")).get("name"))

    # ------------------------------------------------------------------ the logic

    def cluster_gpus(self) -> list[ClusterGPU]:
        gpus: list[ClusterGPU] = []
        for obj in self.kube.list_gpunodes():
            gpus.extend(gpus_from_gpunode(obj))
        return gpus

    def reconcile_job(self, body: dict[str, Any], status: dict[str, Any]) -> None:
        meta = _dict(body.get("metadata"))
        if meta.get("deletionTimestamp") or status.get("phase") in TERMINAL:
            return
        generation = meta.get("generation") if isinstance(meta.get("generation"), int) else None
        try:
            ref = _job_ref(body)
            spec = parse_spec(body.get("spec"))
            extra_validation(ref, spec)
            self.config.pods.node_selector_for(spec)  # a job's nodeSelector must not contradict the operator's
        except SpecError as exc:
            self._fail(body, status, "Failed", "Validated", "InvalidSpec", str(exc))
            return
        now = now_rfc3339()
        conditions = set_condition(status.get("conditions"), "Validated", "True", "SpecValid",
                                   "the spec passed validation", now, generation)

        # Once a pod was planned for this attempt, the plan stays the one it was built from (pods are immutable;
        # a later spec edit is reported by on_spec_update, not half-applied here).
        plan = self._stored_plan(status, generation, any_generation=bool(status.get("podName")))
        if plan is None and spec.model.entrypoint is not None:
            probed = self._probe(ref, body, spec, status, conditions, generation)
            if probed is None:
                return  # the probe pod runs; its end (pod event or resync) continues here
            conditions = list(status.get("conditions") or [])
        if plan is None:
            try:
                table, runtime = self._calibration_tables(ref.namespace) or (None, None)
                with self.metrics.plan_seconds.time():
                    plan = self.planner.plan(spec, self.cluster_gpus(), table, probe=_probe_result(status),
                                             runtime_calibration=runtime)
            except PlanError as exc:
                new = dict(status, conditions=conditions)
                self._fail(body, new, exc.phase, "Schedulable" if exc.phase == "Unschedulable" else "Estimated",
                           exc.reason, exc.message)
                return
        conditions = set_condition(
            conditions, "Estimated", "True", "PMCEstimated",
            f"no prediction (the probe failed: see ProbeFailed): the job runs alone on a whole GPU, reserving "
            f"{format_bytes(plan.admit_bytes)} ({plan.admit_bytes} bytes); predicted runtime "
            f"{_seconds(plan.predicted_runtime_seconds)} on {plan.runtime_gpu_model} ({plan.runtime_source})"
            if plan.reservation_source == "wholeGPU" else
            f"predicted peak {format_bytes(plan.pmc_bytes)} ({plan.pmc_bytes} bytes); admit "
            f"{format_bytes(plan.admit_bytes)} ({plan.admit_bytes} bytes) on one GPU; predicted runtime "
            f"{_seconds(plan.predicted_runtime_seconds)} on {plan.runtime_gpu_model} ({plan.runtime_source})"
            + (f"; scaling: {plan.scaling_note}" if plan.scaling_note else ""),
            now, generation,
        )
        conditions = [c for c in conditions if not (c.get("type") == "Schedulable" and c.get("status") == "False"
                                                    and c.get("reason") == "PredictedPeakExceedsGPU")]
        attempt = max(int(status.get("attempts") or 1) - 1, 0) if isinstance(status.get("attempts"), int) else 0
        name = pod_name(ref.name, attempt)
        new = dict(status)
        new.update(_plan_fields(plan))
        new.update(conditions=conditions, attempts=attempt + 1, podName=name, modelClass=spec.model.model_class)
        if not status.get("podName"):
            new["observedGeneration"] = generation
        if new.get("phase") in (None, "Pending", "Unschedulable"):
            new["phase"] = "Estimated"
            new["message"] = None
        try:
            reason = status.get("attemptReason")
            priority_class = self.priority_class(body, spec, plan, ref.namespace, name,
                                                 _class_reason(reason if isinstance(reason, str) else None, status))
        except PlanError as exc:
            self._fail(body, dict(status, conditions=conditions), exc.phase, "Schedulable", exc.reason, exc.message)
            return
        if plan.exclusive and not any(c.get("type") == "Exclusive" for c in new.get("conditions") or []):
            new["conditions"] = set_condition(
                new.get("conditions"), "Exclusive", "True", str(plan.exclusive_reason or "Exclusive"),
                _exclusive_message(plan), now, generation)
            self._event(body, "Normal", "Exclusive", new["conditions"][-1]["message"])
        self._write(body, status, new, message=_estimated_message(plan))

        self._ensure(ref, body, build_config_map(body), kind="ConfigMap")
        peers = status.get("faultPeers")
        pod = self._create_pod(ref, body, status, build_pod(body, spec, plan, attempt, self.config.image,
                                                            self.config.scheduler_name, priority_class,
                                                            settings=self.config.pods,
                                                            worker_device=self.config.worker_device,
                                                            worker_prestart=self.config.worker_prestart,
                                                            fault_peers=[p for p in peers if isinstance(p, str)]
                                                            if isinstance(peers, list) else (),
                                                            probation_step=attempt_rules.probation_of(status),
                                                            probation_suspect=attempt_rules.probation_suspect_of(
                                                                status)))
        if pod is not None:
            self._apply_pod(body, status, pod, deleted=False)

    def _probe(self, ref: JobRef, body: dict[str, Any], spec: GNNJobSpec, status: dict[str, Any],
               conditions: list[dict[str, Any]], generation: int | None) -> ProbeRecord | None:
        """An entrypoint job's probe (``operator/probe.py``): the finished one in the status or the cache, else its
        pod, created or adopted. Returns the finished record (written to ``status.probe`` with its conditions), or
        None while the probe pod runs."""
        assert spec.image is not None  # extra_validation
        request = probe_request(spec)
        key = cache_key(spec.image, request)
        stored = _stored_probe(status)
        if stored is not None and stored.key == key and stored.state != "Running":
            return stored
        cached = self.probes.get(ref.namespace, key)
        if cached is not None:
            record = cached.model_copy(update={"source": "cache"})
            self._record_probe(body, status, conditions, record, generation)
            return None if record.reason == INVALID_ENTRYPOINT else record
        obj = build_probe_pod(body, spec, request, key, self.config.image, self.config.pods, self.config.probe,
                              self.config.scheduler_name)
        name = str(obj["metadata"]["name"])
        if stored is None or stored.key != key or stored.pod != name:
            # the status says what is running before the pod exists (as the plan precedes a job's pod)
            running = ProbeRecord(key=key, pod=name, state="Running")
            new = dict(status, probe=running.status(), phase=status.get("phase") or "Pending",
                       modelClass=spec.model.model_class)
            new["conditions"] = set_condition(
                conditions, "Probed", "Unknown", "ProbeRunning",
                f"tracing spec.model.entrypoint in pod {name} (image {spec.image}, no GPU) before any GPU pod",
                now_rfc3339(), generation)
            new["message"] = f"probing the entrypoint in pod {name}"
            self._write(body, status, new)
            conditions = list(status.get("conditions") or [])
        pod = self._create_pod(ref, body, status, obj)
        if pod is None:
            return None  # never admissible: the job failed with PodSpecInvalid
        if _dict(_dict(pod.get("metadata")).get("annotations")).get(ANN_PROBE_KEY) != key:
            # a probe of an earlier spec of this job (edited before its pod existed): replaced, never reused
            self.kube.delete_pod(ref.namespace, name)
            return None
        record = read_probe_pod(pod, key)
        if record.state != "Running":
            self._record_probe(body, status, conditions, record, generation, request)
            return None if record.reason == INVALID_ENTRYPOINT else record
        return None

    def _record_probe(self, body: dict[str, Any], status: dict[str, Any], conditions: list[dict[str, Any]],
                      record: ProbeRecord, generation: int | None, request: dict[str, Any] | None = None) -> None:
        """Write a finished probe into the status (``probe``, conditions ``Probed`` and ``ProbeFailed``), post its
        event, count it and cache it. An entrypoint the probe could not even load (``InvalidEntrypoint``) is a wrong
        spec, as for any other field: the job fails with ``Validated=False`` and gets no GPU pod."""
        now = now_rfc3339()
        new = dict(status, probe=record.status())
        self.metrics.probes.labels(record.state if record.source == "pod" else "Cached").inc()
        if record.source == "pod":
            self.probes.put(_job_ref(body).namespace, record, request)
        if record.reason == INVALID_ENTRYPOINT:
            new["conditions"] = set_condition(conditions, "Probed", "False", INVALID_ENTRYPOINT,
                                              f"the probe of pod {record.pod} could not load the entrypoint", now,
                                              generation)
            self._write(body, status, new)  # ``status`` follows both writes: a caller going on sees the failure
            self._fail(body, status, "Failed", "Validated", "InvalidSpec", f"spec.model.entrypoint: {record.error}")
            return
        if record.state == "Succeeded" and record.result is not None:
            where = "the cache (same image, entrypoint and spec)" if record.source == "cache" else \
                f"pod {record.pod}" + (f" ({record.image_id})" if record.image_id else "")
            message = (f"traced by {where}: PMC {format_bytes(record.result.pmc)} ({record.result.pmc} bytes) in "
                       f"{record.result.seconds:.1f} s")
            reason = "ProbeCached" if record.source == "cache" else "ProbeSucceeded"
            new["conditions"] = set_condition(conditions, "Probed", "True", reason, message, now, generation)
            self._event(body, "Normal", reason, message)
        else:
            why = str(record.reason or "ProbeError")
            error = str(record.error or "the probe failed")
            plan = ("it runs at spec.resources.gpuMemory" if _dict(_dict(body.get("spec")).get("resources"))
                    .get("gpuMemory") else "it runs alone on a whole GPU (set spec.resources.gpuMemory to share one)")
            new["conditions"] = set_condition(conditions, "Probed", "False", why,
                                              f"the probe of pod {record.pod} failed: {plan}", now, generation)
            new["conditions"] = set_condition(new["conditions"], "ProbeFailed", "True", why, error, now, generation)
            self._event(body, "Warning", "ProbeFailed", f"{why}: {error}")
        self._write(body, status, new)

    def _apply_probe(self, job: dict[str, Any], status: dict[str, Any], pod: dict[str, Any], deleted: bool) -> None:
        """A probe pod changed: once it ends, record its result and go on to plan the job and create its pod."""
        stored = _stored_probe(status)
        name = _dict(pod.get("metadata")).get("name")
        if stored is None or stored.state != "Running" or stored.pod != name:
            return
        record = read_probe_pod(pod, stored.key)
        if deleted and record.state == "Running":
            record = ProbeRecord(key=stored.key, pod=stored.pod, state="Failed", reason="PodDeleted",
                                 error="the probe pod was deleted before it finished", cacheable=False)
        if record.state == "Running":
            return
        with self._job_lock(job, wait=True):
            ref = _job_ref(job)
            fresh = self.kube.read_job(ref.namespace, ref.name)
            if fresh is None or _dict(fresh.get("metadata")).get("uid") != ref.uid:
                return
            fresh_status = _dict(fresh.get("status"))
            if fresh_status.get("phase") in TERMINAL or _stored_probe(fresh_status) != stored:
                return  # finished meanwhile, or a resync recorded it first
            generation = _dict(fresh.get("metadata")).get("generation")
            try:
                request: dict[str, Any] | None = probe_request(parse_spec(fresh.get("spec")))
            except (SpecError, ValueError):
                request = None  # cached under the image as named only
            self._record_probe(fresh, fresh_status, list(fresh_status.get("conditions") or []), record,
                               generation if isinstance(generation, int) else None, request)
            self.reconcile_job(fresh, fresh_status)

    def _create_pod(self, ref: JobRef, body: dict[str, Any], status: dict[str, Any],
                    obj: dict[str, Any]) -> dict[str, Any] | None:
        """Create (or adopt) the attempt's pod; a refusal by admission is shown and retried (``admission.py``).

        Returns the pod, or None when the job failed because the pod can never be admitted. Raises
        ``PodCreateRefused`` (transient: kopf retries the create handler with back-off) after writing the
        ``PodCreated=False`` condition and a ``FailedCreate`` Warning event."""
        name = obj["metadata"]["name"]
        generation = _dict(body.get("metadata")).get("generation")
        if not is_probe_pod(obj):
            self._write_facts(body, status, facts_status(obj))  # before the pod exists: see gnnsched.trust.job_facts
        try:
            obj = self._with_checkpoint(ref, body, obj)
            pod = self._ensure(ref, body, obj, kind="Pod")
        except KubeError as exc:
            if exc.status not in REFUSED:
                raise
            if never_admissible(exc):
                field = job_field(rejected_fields(exc)[0])
                self._fail(body, status, "Failed", "PodCreated", "PodSpecInvalid",
                           f"{field}: the API server refused pod {name}: {exc.message}")
                return None
            message = refusal_message(exc, name)
            new = dict(status)
            new["conditions"] = set_condition(status.get("conditions"), "PodCreated", "False", refusal_reason(exc),
                                              message, now_rfc3339(), generation if isinstance(generation, int)
                                              else None)
            new["message"] = message
            self._write(body, status, new)
            self._event(body, "Warning", "FailedCreate", message)
            raise PodCreateRefused(exc.status, message, exc.details) from None
        previous = next((c for c in status.get("conditions") or [] if isinstance(c, dict)
                         and c.get("type") == "PodCreated"), None)
        if previous is not None and previous.get("status") == "False":
            new = dict(status)
            new["conditions"] = set_condition(status.get("conditions"), "PodCreated", "True", "Created",
                                              f"pod {name} was admitted", now_rfc3339(),
                                              generation if isinstance(generation, int) else None)
            new["message"] = None
            self._write(body, status, new)
        uid = _dict(pod.get("metadata")).get("uid")
        if not is_probe_pod(obj) and isinstance(uid, str) and uid:
            self._write_facts(body, status, {**facts_status(obj), "podUid": uid})
        return pod

    def _write_facts(self, body: dict[str, Any], status: dict[str, Any], facts: dict[str, Any]) -> None:
        """Record the attempt's pod and the facts it was planned with in ``status.podFacts``, the one place the
        extender and the node agent read them from (a tenant cannot write a status subresource)."""
        if status.get(STATUS_FACTS) != facts:
            self._write(body, status, dict(status, **{STATUS_FACTS: facts_patch(status.get(STATUS_FACTS), facts)}))
            status[STATUS_FACTS] = facts

    def _count_checkpoint(self, record: dict[str, Any], new: dict[str, Any]) -> None:
        """Fold a finished attempt's checkpoint figures into the status patch ``new`` and the metrics."""
        if not record:
            return
        new.update(record)
        entry = record["checkpointAttempts"][-1]
        self.metrics.checkpoint_resumed_steps.inc(entry.get("resumedFromStep", 0))
        self.metrics.checkpoint_lost_seconds.inc(entry.get("lostSeconds", 0.0))

    def _with_checkpoint(self, ref: JobRef, body: dict[str, Any], pod: dict[str, Any]) -> dict[str, Any]:
        """A checkpointing job's pod (``spec.checkpoint``): its volume mounted, the claim the operator owns created
        first (``operator/checkpoint.py``); any other pod (a probe pod among them: it runs no steps) unchanged."""
        if is_probe_pod(pod):
            return pod
        try:
            spec = parse_spec(body.get("spec"))
        except SpecError:
            return pod
        if spec.checkpoint is None:
            return pod
        pvc = checkpoint.claim(body, spec.checkpoint, self.config.checkpoint)
        if pvc is not None:
            self._ensure(ref, body, pvc, kind="PersistentVolumeClaim")
        return checkpoint.mount(pod, ref.name, spec, self.config.checkpoint)

    def priority_class(self, body: dict[str, Any], spec: GNNJobSpec, plan: Plan, namespace: str,
                       pod: str, attempt_reason: str | None = None) -> str | None:
        """The PriorityClass of the job's pods: ``spec.priorityClassName`` when set (it must exist: the API server
        would reject the pod), else with ``retry_priority`` the retry class for an attempt that a resize or a
        victim's requeue created (``attempt_reason``, kept in ``status.attemptReason`` so a restarted operator
        creates the same pod), else with ``queue_priority`` the class of the predicted runtime's bucket, else none.

        A missing user class raises ``PlanError`` (phase Unschedulable: the resync timer retries, so creating the
        class later starts the job). A missing queue class only costs the ordering: the pod is created without a
        class (FIFO, as with the feature off) and a Warning event says how to fix it. Both only matter while the
        attempt's pod does not exist yet: a resumed job whose pod was created (with a class since deleted) keeps it,
        so a reconcile of an existing pod reads nothing but the pod and never repeats a warning.
        """
        existing = self.kube.read_pod(namespace, pod)
        if existing is not None:
            return (existing.get("spec") or {}).get("priorityClassName")
        if spec.priority_class_name is not None:
            if self.kube.read_priority_class(spec.priority_class_name) is None:
                raise PlanError("PriorityClassNotFound",
                                f"spec.priorityClassName: PriorityClass {spec.priority_class_name!r} does not exist; "
                                "create it (kubectl get priorityclasses lists them) or remove the field",
                                phase="Unschedulable")
            return spec.priority_class_name
        if self.config.retry_priority and attempt_reason in RETRY_FIRST_REASONS:
            retry = self.config.queue_order().retry_name
            if self.kube.read_priority_class(retry) is not None:
                return retry
            self._event(body, "Warning", "RetryPriorityClassMissing",
                        f"PriorityClass {retry} does not exist: this {attempt_reason.lower()} attempt waits behind "
                        "the pods created since its job; install the chart with queuePriority.retryFirst=true, or "
                        "run the operator without --retry-priority")
        if not self.config.queue_priority:
            return None
        seconds = plan.predicted_runtime_seconds
        if seconds is None:
            self._event(body, "Warning", "NoQueuePriority",
                        f"no runtime prediction ({plan.runtime_source}): the pod gets no queue PriorityClass and "
                        "waits in arrival order")
            return None
        cls = self.config.queue_order().class_for(seconds)
        if self.kube.read_priority_class(cls.name) is None:
            self._event(body, "Warning", "QueuePriorityClassMissing",
                        f"PriorityClass {cls.name} (predicted runtime {seconds:.0f} s) does not exist: the pod waits "
                        "in arrival order; install the chart with queuePriority.enabled=true, or run the operator "
                        "without --queue-priority")
            return None
        return cls.name

    def _stored_plan(self, status: dict[str, Any], generation: int | None, any_generation: bool = False) -> Plan | None:
        stored = status.get("plan")
        if not isinstance(stored, dict) or (not any_generation and status.get("observedGeneration") != generation):
            return None
        try:
            return Plan.model_validate(stored)
        except ValueError:
            return None

    def _ensure(self, ref: JobRef, body: dict[str, Any], obj: dict[str, Any], kind: str) -> dict[str, Any]:
        """Create ``obj``; on 409 adopt the existing one if this job owns it, else report the conflict."""
        name = obj["metadata"]["name"]
        create, read = {"Pod": (self.kube.create_pod, self.kube.read_pod),
                        "PersistentVolumeClaim": (self.kube.create_pvc, self.kube.read_pvc)}.get(
            kind, (self.kube.create_config_map, self.kube.read_config_map))
        try:
            created = create(ref.namespace, obj)
            if kind == "Pod":
                self.metrics.pods_created.inc()
                annotations = _dict(_dict(obj.get("metadata")).get("annotations"))
                if annotations.get(ANN_EXCLUSIVE) == "true":
                    plan = _dict(_dict(body.get("status")).get("plan"))
                    self.metrics.exclusive.labels(str(plan.get("exclusive_reason") or "Exclusive")).inc()
                self._event(body, "Normal", "PodCreated", f"created pod {name}")
            return created
        except KubeError as exc:
            if exc.status != 409:
                raise
        existing = read(ref.namespace, name)
        if existing is None:  # deleted between our create and read: the next event or resync creates it again
            raise KubeError(503, f"{kind} {name} vanished after a conflict; will retry")
        owners = _dict(existing.get("metadata")).get("ownerReferences") or []
        if not any(isinstance(o, dict) and o.get("uid") == ref.uid for o in owners):
            raise KubeError(409, f"{kind} {ref.namespace}/{name} exists and is not owned by this GNNJob "
                                 f"(uid {ref.uid}); delete it or rename the job")
        return existing

    def sync_pod(self, pod: dict[str, Any], deleted: bool) -> None:
        meta = _dict(pod.get("metadata"))
        annotations = _dict(meta.get("annotations"))
        job_key = annotations.get(ANN_JOB)
        if not isinstance(job_key, str) or "/" not in job_key:
            return  # not ours (or a malformed annotation): nothing to report to
        namespace, name = job_key.split("/", 1)
        job = self.kube.read_job(namespace, name)
        if job is None or _dict(job.get("metadata")).get("deletionTimestamp"):
            return
        owners = meta.get("ownerReferences") or []
        job_uid = _dict(job.get("metadata")).get("uid")
        if not any(isinstance(o, dict) and o.get("uid") == job_uid for o in owners):
            return  # a pod of an earlier job with the same name
        if is_probe_pod(pod):
            self._apply_probe(job, _dict(job.get("status")), pod, deleted=deleted)
            return
        self._apply_pod(job, _dict(job.get("status")), pod, deleted=deleted)

    def _apply_pod(self, job: dict[str, Any], status: dict[str, Any], pod: dict[str, Any], deleted: bool) -> None:
        """Fold one pod's facts into the job status; retry or fail on a failed pod."""
        if status.get("phase") in TERMINAL:
            return
        pod_meta = _dict(pod.get("metadata"))
        try:
            attempt = int(_dict(pod_meta.get("labels")).get(LABEL_ATTEMPT, "0"))
        except ValueError:
            return
        current = int(status["attempts"]) - 1 if isinstance(status.get("attempts"), int) else 0
        if attempt != current:
            return  # an older attempt's pod (or one ahead of a stale status: the job handler catches up)
        facts = _dict(status.get(STATUS_FACTS))
        if (facts.get("pod") == pod_meta.get("name") and isinstance(facts.get("podUid"), str)
                and isinstance(pod_meta.get("uid"), str) and facts["podUid"] != pod_meta["uid"]):
            return  # an earlier pod of this name, which a resync re-created after its DELETED event was lost
        view = view_pod(pod)
        if deleted and view.phase not in TERMINAL:
            view.phase = "Failed"
            view.failure_reason = "PodDeleted"
            view.failure_message = "the pod was deleted before it finished"
        new = dict(status)
        new.update(podName=view.name or status.get("podName"))
        for key, value in (("node", view.node), ("gpu", view.gpu), ("group", view.group),
                           ("admittedAt", view.admitted_at), ("startedAt", view.started_at),
                           ("finishedAt", view.finished_at), ("observedPeakBytes", view.observed_peak_bytes),
                           ("observedRuntimeSeconds", view.observed_runtime_seconds)):
            if value is not None:
                new[key] = value
        now = now_rfc3339()
        generation = _dict(job.get("metadata")).get("generation")
        message = ""
        plan = self._stored_plan(status, None, any_generation=True)
        if plan is not None and not deleted and waiting_for_a_node(pod):
            try:
                plan = self._replan_waiting(job, new, pod, plan)
            except KubeError as exc:  # the pod's own facts still go into the status; the resync re-plans
                log.warning("re-plan of pod %s: %s", view.name, exc)
        if plan is not None and view.observed_peak_bytes is not None:
            need = _need(plan, plan.admit_gpu_model)
            if need:
                new["predictedPeakBytes"] = need
                new["observedPeakRatio"] = round(view.observed_peak_bytes / need, 4)
        if view.phase == "Failed":
            self._pod_failed(job, status, new, view, attempt, now, pod)
            return
        new["phase"] = view.phase
        if view.phase == "Unschedulable":
            new["conditions"] = set_condition(new.get("conditions"), "Schedulable", "False", "Unschedulable",
                                              view.unschedulable_message or "", now, generation)
            new["message"] = view.unschedulable_message
            message = f"pod {view.name}: {view.unschedulable_message}"
        elif view.node is not None:
            new["conditions"] = set_condition(new.get("conditions"), "Schedulable", "True", "Bound",
                                              f"pod {view.name} bound to node {view.node}", now, generation)
            new["message"] = None
            message = f"pod {view.name} on node {view.node}" + (f", GPU {view.gpu}" if view.gpu else "")
        if view.phase in ("Running", "Succeeded") and (view.admitted_at or view.gpu):
            new["conditions"] = set_condition(new.get("conditions"), "Admitted", "True", "AdmittedByGate",
                                              f"admitted on GPU {view.gpu or '?'} (group {view.group or '?'})",
                                              now, generation)
        if view.phase == "Succeeded":
            peak = view.observed_peak_bytes
            detail = f"observed peak {format_bytes(peak)} ({peak} bytes)" if peak is not None else \
                "the worker reported no peak"
            if view.prestart_fallback:
                detail += (f"; prestart fallback (start-up paid twice, the worker re-executed after admission): "
                           f"{view.prestart_fallback}")
                new["prestartFallback"] = view.prestart_fallback
            new["conditions"] = set_condition(new.get("conditions"), "Complete", "True", "Succeeded",
                                              f"pod {view.name} succeeded; {detail}", now, generation)
            result = attempt_facts(pod).result  # its result line: steps, checkpoint, resumed-from step
            self._count_checkpoint(checkpoint.attempt_record(status, attempt, result), new)
            new.setdefault("finishedAt", now)
            if attempt_rules.probation_of(status) is not None:
                new["probationStep"] = None  # merge patch: it ran every step, so it passed its probation's
                new["probationSuspect"] = None
            message = f"pod {view.name} succeeded; {detail}"
            if plan is not None:  # its peak and its runtime, in one write of the calibration object
                # measured by the node agent (NVML) and the kubelet, never what the container says about itself
                peak, seconds = measured_peak(pod), measured_runtime(pod)
                self._record([
                    self._peak_sample(job, pod, plan, peak, attempt) if peak is not None else None,
                    self._runtime_sample(job, pod, plan, seconds, attempt, result) if seconds is not None else None,
                ])
        self._write(job, status, new, message=message)

    def _pod_failed(self, job: dict[str, Any], status: dict[str, Any], new: dict[str, Any], view: PodView,
                    attempt: int, now: str, pod: dict[str, Any] | None = None) -> None:
        """A failed attempt: requeue a fault victim, resize a memory-exceeded attempt, else charge it to
        ``backoffLimit`` (``operator/resize.py`` has the rules). The next attempt's reservation, counters and pod
        name go into one status patch before its pod is created, so a restart resumes exactly there.

        While the node agent's verdict on the pod may still come (``verdict_wait_seconds``), nothing is decided: the
        status says what it waits for, and the pod event that carries the verdict, or the resync timer after the
        bound, brings the pod here again."""
        facts = attempt_facts(pod) if pod is not None else AttemptFacts()
        wait = verdict_wait_seconds(facts, datetime.now(timezone.utc))
        if wait > 0 and facts.finished_at is not None:
            what = "fault record" if facts.awaits == "fault" else "attempt result"
            deadline = (facts.finished_at + timedelta(seconds=AGENT_VERDICT_SECONDS)).astimezone(timezone.utc)
            new["message"] = (f"pod {view.name} failed; waiting for the node agent's {what} "
                              f"(until {deadline.strftime('%Y-%m-%dT%H:%M:%SZ')} at the latest)")
            self._write(job, status, new, message=new["message"])
            return
        if facts.awaits is not None:
            facts = settle_without_verdict(facts)
        generation = _dict(job.get("metadata")).get("generation")
        try:
            spec: GNNJobSpec | None = parse_spec(job.get("spec"))
        except SpecError:
            spec = None
        limit = spec.backoff_limit if spec is not None else 0
        exit_part = f" (exit code {view.exit_code})" if view.exit_code is not None else ""
        detail = f"pod {view.name} failed: {view.failure_reason}{exit_part}" + (
            f": {view.failure_message}" if view.failure_message else "")
        self._event(job, "Warning", "PodFailed", detail)
        if facts.fault is not None or facts.outcome == "fault":
            self.metrics.faults.labels(counted_class(facts.fault.xid if facts.fault else None)).inc()
        # A retry runs what the job was planned as (a later spec edit is not applied to a running job).
        plan = self._stored_plan(status, None, any_generation=True)
        priority_class = _dict(_dict(pod).get("spec")).get("priorityClassName")
        priority_class = priority_class if isinstance(priority_class, str) and priority_class else None
        if plan is not None and facts.outcome == "memory-exceeded":
            seen = max(facts.observed_peak_bytes or 0, facts.needed_bytes or 0)
            if seen:
                self._record([self._peak_sample(job, pod or {}, plan, seen, attempt, exceeded=True)])
        self._count_checkpoint(checkpoint.attempt_record(status, attempt, facts.result), new)
        if spec is not None and plan is not None:
            largest = max((g.capacity_bytes for g in self.cluster_gpus() if g.healthy), default=None)
            decision = decide(facts, admit_bytes=plan.admit_bytes, resizes=_count(status, "resizes"),
                              max_resizes=spec.memory.max_resizes, requeues=_count(status, "requeues"),
                              largest_gpu_bytes=largest)
            # spec.failurePolicy (gnnsched.attempts.failure_policy, the simulator's rule too): the job's rules, then
            # gnnsched's defaults, on the attempt's exit code and fault classes; a resize is not a failure it judges
            failed = attempt_rules.failed_attempt(facts, view.exit_code, status, pod)
            rule = attempt_rules.verdict(spec, failed, status) if decision.kind in ("requeue", "charge") else None
            if rule is not None:
                self.metrics.failure_rules.labels(rule.action, rule.rule.split("[")[0]).inc()
            if rule is not None and rule.action == "FailJob":
                new.update(attempt_rules.fault_step_update(status, failed))
                if facts.fault is not None and facts.fault.role == "suspect":
                    new["suspected"] = _count(status, "suspected") + 1
                self._finish_failed(job, new, view, now, rule.reason, f"{detail}; {describe(rule, failed)}")
                return
            if rule is not None and rule.action == "Ignore" and decision.kind == "charge":
                message = f"{detail}; {describe(rule, failed)}; requeued without using backoffLimit"
                self._next_attempt(job, status, new, spec, plan, attempt, now, ("Requeued", rule.reason, message),
                                   {"requeues": _count(status, "requeues") + 1,
                                    **attempt_rules.fault_step_update(status, failed),
                                    **attempt_rules.probation_update(status, failed, False)}, priority_class)
                self.metrics.requeues.labels(rule.reason).inc()
                return
            if decision.kind == "requeue" and rule is not None and rule.action == "Count":
                decision = decision.model_copy(update={"kind": "charge", "suspect": False})
            if decision.kind == "requeue":
                message = f"{detail}; {decision.message}; requeued without using backoffLimit"
                requeue_extra: dict[str, Any] = {"requeues": _count(status, "requeues") + 1,
                                                 **attempt_rules.fault_step_update(status, failed)}
                assert facts.fault is not None  # decide() requeues only a victim of a recorded fault
                step = fault_step(facts.fault.charge(), facts.outcome == "fault" and not facts.victim_of_810,
                                  _count(status, "undecidedFaults"), _count(status, "suspected"),
                                  _count(status, "requeues"), peers=facts.fault.peers)
                if step.apart:
                    # its peers in an undecided fault: the next attempt shares no GPU with them while it runs
                    # (gnnsched.attempts.fault_classes.undecided_peers), so the culprit's next fault names it alone
                    requeue_extra["faultPeers"] = sorted(step.apart)
                # ... and, where a GPU is idle, runs alone there until it passes the step it faulted at
                # (gnnsched.attempts.probation): the culprit's next fault is then its own, alone
                requeue_extra.update(attempt_rules.probation_update(status, failed, bool(step.apart), step.alone))
                on_probation = attempt_rules.probation_of({**status, **requeue_extra})
                if on_probation is not None and "probationStep" in requeue_extra:
                    message += (f"; on probation until it passes step {on_probation}: the next attempt runs alone "
                                "while a GPU is idle")
                if step.undecided != _count(status, "undecidedFaults"):
                    # Its own error was a fatal fault, not 810: on drivers where every client of an MPS fault sees
                    # the same error (an H100 with driver 580 gives all of them 700) the suspect cannot be told
                    # apart, so a job that faults by itself would be requeued as a victim each time, killing its
                    # neighbours. Alone on a GPU, its next fault is its own and is charged.
                    requeue_extra["undecidedFaults"] = step.undecided
                    if step.alone and not plan.exclusive:
                        plan = plan.model_copy(update={"exclusive": True, "exclusive_reason": step.alone_reason})
                        requeue_extra.update(exclusive=True, plan=plan.model_dump(mode="json"))
                        new["conditions"] = set_condition(
                            new.get("conditions"), "Exclusive", "True", str(step.alone_reason),
                            f"failed with its own fatal GPU error in {step.undecided} MPS faults whose cause could "
                            "not be told apart: later attempts run alone on a GPU", now, generation)
                        self._event(job, "Warning", "Exclusive", new["conditions"][-1]["message"])
                self._next_attempt(job, status, new, spec, plan, attempt, now,
                                   ("Requeued", step.reason, message), requeue_extra, priority_class)
                self.metrics.requeues.labels(step.reason).inc()
                return
            if decision.kind == "resize":
                assert decision.new_admit_bytes is not None
                old, grown = plan.admit_bytes, decision.new_admit_bytes
                resized = plan.model_copy(update={"admit_bytes": grown, "reservation_source": "resized"})
                message = (f"attempt {attempt + 1} ran out of GPU memory ({facts.detail}); reservation "
                           f"{format_bytes(old)} ({old} bytes) -> {format_bytes(grown)} ({grown} bytes), resize "
                           f"{_count(status, 'resizes') + 1} of {spec.memory.max_resizes}")
                self._next_attempt(
                    job,
                    status,
                    new,
                    spec,
                    resized,
                    attempt,
                    now,
                    ("Resized", "MemoryExceeded", message),
                    {
                        "resizes": _count(status, "resizes") + 1,
                        "admitBytes": grown,
                        "reservationSource": "resized",
                        "plan": resized.model_dump(mode="json"),
                    },
                    priority_class,
                )
                self.metrics.resizes.inc()
                return
            if decision.kind in ("exceeds-largest", "resizes-exhausted"):
                reason = "ExceedsLargestGPU" if decision.kind == "exceeds-largest" else "MemoryExceeded"
                self._finish_failed(job, new, view, now, reason, f"{detail}; {decision.message}")
                return
            suspected = _count(status, "suspected")
            alone_reason: str | None = None
            if decision.suspect and facts.fault is not None:
                step = fault_step(facts.fault.charge(), True, _count(status, "undecidedFaults"), suspected)
                suspected, alone_reason = step.suspected, step.alone_reason
            extra: dict[str, Any] = {"suspected": suspected} if decision.suspect else {}
            extra.update(attempt_rules.fault_step_update(status, failed))
            # a suspect retried runs alone until it passes its fault's step, waiting for a GPU of its own
            # (gnnsched.attempts.probation): a deterministic bug would kill its new neighbours at that step
            extra.update(attempt_rules.probation_update(status, failed, decision.suspect and facts.fault is not None,
                                                        alone_reason is not None or plan.exclusive,
                                                        suspect=decision.suspect))
            if decision.suspect:
                self._event(job, "Warning", "FaultSuspect",
                            f"pod {view.name} is the suspect of a fatal MPS fault on GPU "
                            f"{facts.fault.gpu if facts.fault else '?'}; charged to backoffLimit "
                            f"(suspected {suspected} time(s))"
                            + (f"; on probation until it passes step {extra['probationStep']}: the next attempt "
                               "runs alone, waiting for a GPU of its own" if extra.get("probationStep") is not None
                               else ""))
            used = _count(status, "retriesUsed")
            if used < limit:
                if alone_reason is not None and not plan.exclusive:
                    plan = plan.model_copy(update={"exclusive": True, "exclusive_reason": alone_reason})
                    extra.update(exclusive=True, plan=plan.model_dump(mode="json"))
                    new["conditions"] = set_condition(
                        new.get("conditions"), "Exclusive", "True", alone_reason,
                        f"suspected {suspected} times of a fatal MPS fault: later attempts run alone on a GPU",
                        now, generation)
                    self._event(job, "Warning", "Exclusive", new["conditions"][-1]["message"])
                self._next_attempt(job, status, new, spec, plan, attempt, now,
                                   ("Retrying", str(view.failure_reason), f"{detail}; retry {used + 1} of {limit}"),
                                   {"retriesUsed": used + 1, **extra}, priority_class)
                self.metrics.retries.labels(str(view.failure_reason or "Error")).inc()
                return
            new.update(extra)
        tail = f"; no retries left (backoffLimit {limit})" if limit else ""
        self._finish_failed(job, new, view, now, str(view.failure_reason or "Error"), detail + tail)

    def _finish_failed(self, job: dict[str, Any], new: dict[str, Any], view: PodView, now: str, reason: str,
                       message: str) -> None:
        status = _dict(job.get("status"))
        generation = _dict(job.get("metadata")).get("generation")
        new["phase"] = "Failed"
        new["finishedAt"] = view.finished_at or now
        new["conditions"] = set_condition(new.get("conditions"), "Failed", "True", reason, message, now, generation)
        new["message"] = message if reason == str(view.failure_reason or "Error") else f"{reason}: {message}"
        self._write(job, status, new, message=new["message"], reason=reason)

    def _next_attempt(self, job: dict[str, Any], status: dict[str, Any], new: dict[str, Any], spec: GNNJobSpec,
                      plan: Plan, attempt: int, now: str, condition: tuple[str, str, str],
                      updates: dict[str, Any], priority_class: str | None = None) -> None:
        """Write the next attempt (name, counters, reservation, why it exists) into the status, then create its pod:
        a resize or a victim's requeue in the retry class (``priority_class``), any other retry in the class the
        failed attempt had (the job keeps its place in the queue order)."""
        generation = _dict(job.get("metadata")).get("generation")
        ref = _job_ref(job)
        next_attempt = attempt + 1
        ctype, reason, message = condition
        new.update(phase="Estimated", attempts=next_attempt + 1, podName=pod_name(ref.name, next_attempt),
                   attemptReason=ctype, message=f"{ctype.lower()} after attempt {attempt + 1}: {reason}", **updates)
        if "faultPeers" not in updates and status.get("faultPeers"):
            new["faultPeers"] = None  # merge patch: the peers kept the last attempt apart, not this one
        if ctype in RETRY_FIRST_REASONS and spec.priority_class_name is None:
            class_reason = _class_reason(ctype, {**status, **updates})
            priority_class = self.priority_class(job, spec, plan, ref.namespace, pod_name(ref.name, next_attempt),
                                                 class_reason) or (priority_class if class_reason == ctype else None)
        for key in ("node", "gpu", "group", "admittedAt", "startedAt", "finishedAt", "observedRuntimeSeconds"):
            new.pop(key, None)
            if key in status:
                new[key] = None  # merge patch: null removes the previous attempt's placement
        new["conditions"] = set_condition(new.get("conditions"), ctype, "True", reason, message, now, generation)
        self._write(job, status, new, message=message)
        self._event(job, "Warning" if ctype == "Resized" else "Normal", ctype, message)
        self._event(job, "Normal", "Retrying" if ctype == "Retrying" else "NextAttempt",
                    f"creating pod {pod_name(ref.name, next_attempt)}")
        job_now = dict(job, status={**status})
        pod = self._create_pod(ref, job_now, status, build_pod(job, spec, plan, next_attempt, self.config.image,
                                                               self.config.scheduler_name, priority_class,
                                                               settings=self.config.pods,
                                                               worker_device=self.config.worker_device,
                                                               worker_prestart=self.config.worker_prestart,
                                                               fault_peers=updates.get("faultPeers") or (),
                                                               probation_step=attempt_rules.probation_of(
                                                                   {**status, **updates}),
                                                               probation_suspect=attempt_rules.probation_suspect_of(
                                                                   {**status, **updates})))
        if pod is not None:
            self._apply_pod(job, status, pod, deleted=False)

    def _calibration_tables(self, namespace: str) -> tuple[CalibrationTable, CalibrationTable] | None:
        """The memory and runtime calibration tables a job of ``namespace`` is planned with (its own samples and the
        bounded cluster prior); ``None`` (static factors) when they cannot be read for a lasting reason."""
        try:
            return self.calibration.tables(namespace)
        except KubeError as exc:
            if exc.transient:
                raise
            log.warning("cannot read the GNNCalibration object (%s); new estimates use the static factor", exc)
            return None

    def _peak_sample(self, job: dict[str, Any], pod: dict[str, Any], plan: Plan, observed: int, attempt: int,
                     exceeded: bool = False) -> CalibrationSample | None:
        """One finished attempt's observed ÷ predicted peak for the cluster's calibration object; with ``exceeded``
        (a memory-exceeded attempt) as a lower bound (``CalibrationTable``'s docstring says why apart).

        Only attempts whose reservation came from the estimate count (a ``gpuMemory`` job's estimate is still the
        prediction, so it counts too); the class is the GPU the attempt ran on. ``None``: nothing to record."""
        ran_on = self._attempt_gpu(pod)
        model = (ran_on.model if ran_on is not None else None) or plan.admit_gpu_model or plan.runtime_gpu_model
        need = _need(plan, model, measurement_fingerprint(ran_on.measured) if ran_on is not None else None)
        if not need or observed <= 0:
            return None
        try:
            spec = parse_spec(job.get("spec"))
        except SpecError:
            return None
        cls = CalibrationClass(gpu_model=model, arch=spec.model.model_class, mode=spec.mode, container=plan.container)
        uid = _dict(job.get("metadata")).get("uid")
        return CalibrationSample(cls=cls, ratio=observed / need, attempt_key=f"{uid}/{attempt}", exceeded=exceeded,
                                 namespace=_job_ref(job).namespace)

    def _attempt_gpu_model(self, pod: dict[str, Any]) -> str | None:
        """The model of the GPU the node agent says the pod ran on, ``None`` when unknown."""
        gpu = self._attempt_gpu(pod)
        return gpu.model if gpu is not None else None

    def _attempt_gpu(self, pod: dict[str, Any]) -> ClusterGPU | None:
        """The GPU (model and its node's measurement) the node agent says the pod ran on, ``None`` when unknown."""
        gpu_uuid = _dict(_dict(pod.get("metadata")).get("annotations")).get(ANN_GPU)
        if not isinstance(gpu_uuid, str) or not gpu_uuid:
            return None
        try:
            return next((g for g in self.cluster_gpus() if g.uuid == gpu_uuid), None)
        except KubeError:
            return None

    def _runtime_sample(self, job: dict[str, Any], pod: dict[str, Any], plan: Plan, observed: float,
                        attempt: int, result: AttemptResult | None = None) -> CalibrationSample | None:
        """A succeeded attempt's observed ÷ predicted runtime in its runtime class (``closed_loop.runtime_class``),
        against the predictor's figure without any runtime factor the plan applied. ``None`` when the attempt ran
        on another GPU model than the prediction was for (the ratio would mix the two GPUs' speeds into one class).
        New plans use the factor at once; pods still waiting for a node get the new predicted runtime through
        ``_replan_waiting`` (their PriorityClass stays: a pod's priority is immutable). An attempt that resumed from
        a checkpoint is compared with the share of the prediction its steps were (``runtime_sample_share``), and a
        short resumed tail gives no sample."""
        predicted = plan.predicted_runtime_seconds
        ran_on = self._attempt_gpu_model(pod)
        if not predicted or observed <= 0 or (ran_on is not None and ran_on != plan.runtime_gpu_model):
            return None
        share = runtime_sample_share(ran_share(result.resumed_from_step, result.steps) if result else 1.0)
        if share is None:
            return None
        try:
            spec = parse_spec(job.get("spec"))
        except SpecError:
            return None
        cls = runtime_class(spec, plan.runtime_gpu_model, plan.container)
        uid = _dict(job.get("metadata")).get("uid")
        return CalibrationSample(cls=cls, ratio=observed / (share * predicted / (plan.runtime_factor or 1.0)),
                                 attempt_key=f"{uid}/{attempt}/runtime", runtime=True, model=plan.runtime_model,
                                 namespace=_job_ref(job).namespace)

    def _record(self, samples: list[CalibrationSample | None]) -> None:
        """Record an attempt's samples in one write; a factor that moved re-plans the pods still waiting for a node.
        A failure to record is logged, never fatal: one lost sample only slows calibration, and the attempt keys
        make a repeated record a no-op."""
        wanted = [s for s in samples if s is not None]
        if not wanted:
            return
        try:
            changed = self.calibration.record_all(wanted)
        except KubeError as exc:
            log.warning("could not record calibration samples for %s: %s",
                        ", ".join(s.cls.key() for s in wanted), exc)
            return
        if changed:
            self._replan_waiting_pods()

    def _replan_waiting_pods(self) -> None:
        """The calibration changed: bring every gnnsched pod that still waits for a node up to the new factor now
        (``_replan_waiting`` through ``sync_pod``), not at the next resync. Why at once: the samples that change a
        factor are the first overruns of a class, and the pods created with it, queued behind them, would otherwise
        start at the size that just failed (measured in docs/simulator.md, issue 15's calibration figures). Errors
        are logged: the resync timer re-runs the same check."""
        try:
            pods = self.kube.list_pods_page(None, f"{LABEL_MANAGED_BY}={MANAGED_BY_VALUE}").get("items") or []
        except KubeError as exc:
            log.warning("re-plan of waiting pods: cannot list pods (%s); the resync timer retries", exc)
            return
        for pod in pods:
            if isinstance(pod, dict) and waiting_for_a_node(pod):
                try:
                    self.sync_pod(pod, deleted=False)
                except KubeError as exc:
                    log.warning("re-plan of pod %s: %s", _dict(pod.get("metadata")).get("name"), exc)

    def _replan_waiting(self, job: dict[str, Any], new: dict[str, Any], pod: dict[str, Any], plan: Plan) -> Plan:
        """A pod that no node has taken yet reserves, and is ordered by, what the operator would plan for the job now.

        Only the calibration can change it (the spec and the cluster's GPU models are what the plan was made from):
        a sample recorded since the pod was created that moved the memory factor of the plan's class (its
        ``admit-bytes``) or the runtime factor of its runtime class (its ``predicted-runtime-seconds``, which the
        extender's spread and the gate's ``sqtf`` order read). The annotations are patched on the condition that
        the pod is still the version that was read unbound (JSON patch ``test`` on its resourceVersion), so a pod
        the scheduler binds meanwhile keeps the figures the extender placed it by; the extender reads them on each
        scheduling attempt, and the gate on the node reads them when the container arrives, so both see the new
        ones. The plan in the status follows, so a later resize grows from the bytes the attempt ran with and the
        next runtime sample is taken against the bare prediction. A reservation that is not the estimate's
        (``gpuMemory``, a resize, a whole GPU) is the user's or the loop's own and is kept. The pod's PriorityClass
        (kube-scheduler's queue order) cannot follow: a pod's priority is immutable. Returns the plan now in force."""
        tables = self._calibration_tables(_job_ref(job).namespace)
        alone = plan.exclusive and plan.exclusive_reason in (UNKNOWN_GPU_MODEL, ALLOCATOR_MISMATCH)
        if tables is None and not alone:
            return plan
        try:
            spec = parse_spec(job.get("spec"))
        except SpecError:
            return plan
        if alone:
            return self._replan_alone(job, new, pod, plan, spec, *(tables or (None, None)))
        assert tables is not None
        table, runtime = tables
        # The cheap tests first (no estimate, no runtime prediction): the factors of the plan's own classes now.
        memory_moved = False
        if plan.reservation_source in ("estimate", "calibrated") and not plan.exclusive:
            model = plan.admit_gpu_model or plan.runtime_gpu_model
            now = table.factor(CalibrationClass(gpu_model=model, arch=spec.model.model_class, mode=spec.mode,
                                                container=plan.container), self.planner.calibration_policy)
            memory_moved = ("calibrated" if now.calibrated else "estimate") != plan.reservation_source \
                or (now.calibrated and now.factor != plan.safety_factor)
        runtime_moved = False
        if plan.predicted_runtime_seconds is not None:
            now_rt = runtime.factor(runtime_class(spec, plan.runtime_gpu_model, plan.container),
                                    self.planner.runtime_policy)
            runtime_moved = (now_rt.factor if now_rt.calibrated else None) != plan.runtime_factor
        if not memory_moved and not runtime_moved:
            return plan
        try:
            fresh = self.planner.plan(spec, self.cluster_gpus(), table, probe=_probe_result(new),
                                      runtime_calibration=runtime)
        except PlanError:
            return plan
        update: dict[str, Any] = {}
        annotations: dict[str, str] = {}
        changes: list[str] = []
        if memory_moved and not fresh.exclusive and fresh.reservation_source in ("estimate", "calibrated") \
                and fresh.admit_bytes != plan.admit_bytes:
            update.update(admit_bytes=fresh.admit_bytes, estimate_admit_bytes=fresh.estimate_admit_bytes,
                          safety_factor=fresh.safety_factor, reservation_source=fresh.reservation_source,
                          admit_gpu_model=fresh.admit_gpu_model)
            annotations[ANN_ADMIT_BYTES] = str(fresh.admit_bytes)
            changes.append(f"admit bytes {format_bytes(plan.admit_bytes)} -> {format_bytes(fresh.admit_bytes)} "
                           f"({plan.admit_bytes} -> {fresh.admit_bytes} bytes; safety factor {plan.safety_factor} -> "
                           f"{fresh.safety_factor}, from the calibration)")
        if runtime_moved and fresh.predicted_runtime_seconds is not None \
                and fresh.predicted_runtime_seconds != plan.predicted_runtime_seconds:
            update.update(predicted_runtime_seconds=fresh.predicted_runtime_seconds,
                          runtime_factor=fresh.runtime_factor, runtime_source=fresh.runtime_source)
            annotations[ANN_PREDICTED_RUNTIME] = f"{fresh.predicted_runtime_seconds:.3f}"
            changes.append(f"predicted runtime {_seconds(plan.predicted_runtime_seconds)} -> "
                           f"{_seconds(fresh.predicted_runtime_seconds)} ({fresh.runtime_source}; its "
                           f"PriorityClass stays, a pod's priority is immutable)")
        if not annotations:
            return plan
        meta = _dict(pod.get("metadata"))
        name = str(meta.get("name") or "")
        version = meta.get("resourceVersion")
        if not name or not isinstance(version, str):
            return plan
        updated = plan.model_copy(update=update)
        current = _dict(meta.get("annotations"))
        if all(current.get(key) == value for key, value in annotations.items()):
            new.update(_plan_fields(updated))  # the pod was patched; the status had not caught up yet
            self._follow_facts(new, annotations)
            return updated
        if not self._patch_waiting_pod(job, name, version, current, dict(annotations)):
            return plan
        new.update(_plan_fields(updated))
        self._follow_facts(new, annotations)
        self._event(job, "Normal", "Replanned", f"pod {name} waits for a node: " + "; ".join(changes))
        return updated

    @staticmethod
    def _follow_facts(new: dict[str, Any], annotations: dict[str, str] | dict[str, str | None]) -> None:
        """The status facts follow a waiting pod's re-planned annotations (written with the rest of ``new``)."""
        facts = with_annotations(new.get(STATUS_FACTS), annotations)
        if facts is not None:
            new[STATUS_FACTS] = facts

    def _patch_waiting_pod(self, job: dict[str, Any], name: str, version: str, current: dict[str, Any],
                           wanted: dict[str, str | None]) -> bool:
        """Set (None: remove) a waiting pod's annotations in one JSON patch guarded by its ``resourceVersion``, so a
        pod bound or changed meanwhile keeps what it was placed by. False when the guard failed or the pod is gone
        (its next event decides again); True otherwise, counting a re-plan when anything changed."""
        ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/resourceVersion", "value": version}]
        for key, value in wanted.items():
            path = "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")
            if value is None and key in current:
                ops.append({"op": "remove", "path": path})
            elif value is not None and current.get(key) != value:
                ops.append({"op": "replace" if key in current else "add", "path": path, "value": value})
        if len(ops) == 1:
            return True
        try:
            self.kube.patch_pod(_job_ref(job).namespace, name, ops)
        except KubeError as exc:
            if exc.status in (404, 409, 422):
                return False
            raise
        self.metrics.replans.inc()
        return True

    def _replan_alone(self, job: dict[str, Any], new: dict[str, Any], pod: dict[str, Any], plan: Plan,
                      spec: GNNJobSpec, table: CalibrationTable | None, runtime: CalibrationTable | None) -> Plan:
        """A pod that runs alone only because no GPU had device constants (``UnknownGPUModel``,
        ``AllocatorModelMismatch``) and that no node has taken yet is planned again from the GPUNodes as they are now:
        once a node publishes its measurement (or a described GPU joins), the pod's ``admit-bytes`` become the
        estimate's and its ``exclusive`` annotation goes, so it shares. Patched on the pod's resourceVersion as
        ``_replan_waiting`` does (a pod bound meanwhile keeps what it was placed by; its next attempt plans anew);
        its ``Exclusive`` condition says why it changed. Runs on every event and resync of the waiting pod (the
        operator does not watch GPUNodes: one list per re-plan, at the resync interval)."""
        try:
            fresh = self.planner.plan(spec, self.cluster_gpus(), table, probe=_probe_result(new),
                                      runtime_calibration=runtime)
        except PlanError:
            return plan
        if fresh.exclusive and fresh.exclusive_reason in (UNKNOWN_GPU_MODEL, ALLOCATOR_MISMATCH):
            return plan
        meta = _dict(pod.get("metadata"))
        name = str(meta.get("name") or "")
        version = meta.get("resourceVersion")
        if not name or not isinstance(version, str):
            return plan
        current = _dict(meta.get("annotations"))
        wanted: dict[str, str | None] = {ANN_ADMIT_BYTES: str(fresh.admit_bytes),
                                         ANN_EXCLUSIVE: "true" if fresh.exclusive else None}
        if fresh.predicted_runtime_seconds is not None:
            wanted[ANN_PREDICTED_RUNTIME] = f"{fresh.predicted_runtime_seconds:.3f}"
        if not self._patch_waiting_pod(job, name, version, current, wanted):
            return plan
        generation = _dict(job.get("metadata")).get("generation")
        message = (f"pod {name} waits for a node and a GPU now has device constants: admit "
                   f"{format_bytes(plan.admit_bytes)} -> {format_bytes(fresh.admit_bytes)} ({plan.admit_bytes} -> "
                   f"{fresh.admit_bytes} bytes), " + ("it shares a GPU" if not fresh.exclusive
                                                      else f"alone for {fresh.exclusive_reason}"))
        new.update(_plan_fields(fresh))
        self._follow_facts(new, wanted)
        new["conditions"] = set_condition(
            new.get("conditions"), "Exclusive", "True" if fresh.exclusive else "False",
            str(fresh.exclusive_reason) if fresh.exclusive else "DeviceConstantsKnown",
            _exclusive_message(fresh) if fresh.exclusive else message, now_rfc3339(),
            generation if isinstance(generation, int) else None)
        self._event(job, "Normal", "Replanned", message)
        return fresh

    def cleanup(self, namespace: str, name: str, status: dict[str, Any]) -> list[str]:
        """Delete every pod of the job (by label and by deterministic name) and its ConfigMap; returns pod names."""
        names = {str(p.get("metadata", {}).get("name")) for p in
                 self.kube.list_pods(namespace, f"{LABEL_MANAGED_BY}={MANAGED_BY_VALUE},"
                                                f"{LABEL_JOB_NAME}={job_label(name)}")
                 if isinstance(p.get("metadata"), dict)}
        raw_attempts = status.get("attempts")
        attempts = raw_attempts if isinstance(raw_attempts, int) else 1
        names |= {pod_name(name, a) for a in range(max(attempts, 1))}
        deleted = [pod for pod in sorted(names) if self.kube.delete_pod(namespace, pod)]
        self.kube.delete_config_map(namespace, config_map_name(name))
        return deleted


def _stored_probe(status: dict[str, Any]) -> ProbeRecord | None:
    """``status.probe`` as a record; None when absent or unreadable (the probe then runs again)."""
    raw = status.get("probe")
    if not isinstance(raw, dict):
        return None
    try:
        return ProbeRecord.model_validate(raw)
    except ValueError:
        return None


def _probe_result(status: dict[str, Any]) -> ProbeResult | None:
    record = _stored_probe(status)
    return record.result if record is not None and record.state == "Succeeded" else None


def waiting_for_a_node(pod: dict[str, Any]) -> bool:
    """A pod the scheduler has not bound yet and that is not going away: its reservation can still change."""
    meta, spec, status = (_dict(pod.get(k)) for k in ("metadata", "spec", "status"))
    return not spec.get("nodeName") and not meta.get("deletionTimestamp") and status.get("phase") in (None, "Pending")


def extra_validation(ref: JobRef, spec: GNNJobSpec) -> None:
    """Rules the CRD schema cannot express (or that depend on the operator's own naming)."""
    if spec.command is not None and not spec.command:
        raise SpecError("spec.command", "must not be empty (omit it to run the gnnsched worker)")
    if spec.command is not None and any(not part for part in spec.command):
        raise SpecError("spec.command", "contains an empty string")
    if len(ref.name) > 253:
        raise SpecError("metadata.name", f"is {len(ref.name)} characters; at most 253")
    if spec.model.entrypoint is not None and spec.image is None:
        raise SpecError("spec.image", "required with spec.model.entrypoint: the image that holds your package "
                        "(gnnsched's own image does not)")
    if spec.model.pyg is not None or spec.model.conv is not None:
        # which PyG classes and options exist depends on the installed PyG, which the CRD cannot know
        from gnnsched.model_catalog import check_model

        check_model(spec)


def _exclusive_message(plan: Plan) -> str:
    """Why a job runs alone on a whole GPU, for its ``Exclusive`` condition and event."""
    alone = f"the job runs alone, reserving {format_bytes(plan.admit_bytes)}"
    where = f"GPU model {plan.admit_gpu_model!r} on node {plan.exclusive_node}"
    if plan.exclusive_reason == UNKNOWN_GPU_MODEL:
        return (f"{where} is not in gnnsched's GPU catalogue and its node has not measured its device constants, "
                f"and no GPU with known constants can hold the job: {alone}, the whole GPU (it is never planned with "
                "another model's constants); it will share once the node publishes measured constants "
                "(GPUNode status.gpus[].measured, written by the node agent)")
    if plan.exclusive_reason == ALLOCATOR_MISMATCH:
        return (f"{where}: its node measured a CUDA caching allocator that does not behave as gnnsched models it "
                f"(e.g. PYTORCH_CUDA_ALLOC_CONF with expandable segments), so reserved memory cannot be predicted "
                f"there, and no other GPU can hold the job: {alone}, the whole GPU; it will share once the node "
                "publishes measured constants whose allocator matches the model")
    if plan.exclusive_reason == "PredictedPeakAboveGPU":
        need = max((n.bytes for n in plan.needs), default=plan.admit_bytes)
        return (f"predicted need {format_bytes(need)} exceeds every GPU, by less than the largest over-prediction "
                f"measured ({MEASURED_OVERPREDICTION:g}x): {alone}, the whole GPU; if it needs more it fails with "
                "ExceedsLargestGPU (set spec.resources.gpuMemory to decide yourself)")
    return (f"reservation {format_bytes(plan.estimate_admit_bytes or plan.admit_bytes)} exceeds what any GPU can "
            f"share, but the predicted need fits a whole GPU: {alone}")


def _estimated_message(plan: Plan) -> str:
    return (f"PMC {format_bytes(plan.pmc_bytes)}, admit {format_bytes(plan.admit_bytes)}, predicted runtime "
            f"{_seconds(plan.predicted_runtime_seconds)} ({plan.runtime_source}), requests cpu={plan.scaled_cpu} "
            f"memory={plan.scaled_memory}")


def _seconds(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.1f} s"


def build_registry(op: Operator) -> Any:
    """A kopf registry holding ``op``'s handlers (a fresh registry: no reliance on kopf's global default)."""
    import kopf

    registry = kopf.OperatorRegistry()
    config = op.config

    @kopf.on.startup(registry=registry)
    def _configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = config.finalizer
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kopf.gnnsched.io")
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix="kopf.gnnsched.io", key="last-handled-configuration")
        settings.execution.max_workers = config.workers
        settings.posting.level = logging.INFO
        settings.peering.standalone = True
        if config.watch_client_timeout is not None:
            settings.watching.client_timeout = config.watch_client_timeout
            settings.watching.server_timeout = config.watch_client_timeout

    @kopf.on.login(registry=registry)
    def _login(**_: Any) -> Any:
        from .kube import connection_info

        return connection_info(op.kube.configuration)

    jobs: dict[str, Any] = dict(group=GROUP, version=VERSION, plural=GNNJOB_PLURAL, registry=registry)
    kopf.on.create(**jobs, id="reconcile-create")(op.on_job)
    kopf.on.resume(**jobs, id="reconcile-resume")(op.on_job)
    kopf.on.delete(**jobs, id="cleanup")(op.on_delete)
    kopf.on.update(**jobs, id="spec-update", field="spec")(op.on_spec_update)
    kopf.timer(**jobs, id="resync", interval=config.resync_seconds, idle=config.resync_seconds,
               when=lambda status, **_: _dict(status).get("phase") not in TERMINAL)(op.on_resync)
    # Pod events do not come through kopf: main.run_async runs podwatch.PodWatcher, which asks the API server for
    # this operator's pods only (labelSelector); kopf would receive every pod of the cluster and filter here.
    return registry
