"""From a validated GNNJob spec and the cluster's GPUs to a *plan*: PMC, admit bytes, runtime, intensity, resources.

Why a separate, Kubernetes-free module: the plan is the operator's whole judgement about a job, so it must be
testable without an API server, and every number in it must come from the core models (``gnnsched.estimator``,
``gnnsched.runtime_prior``, ``gnnsched.predictor.gnn``, ``gnnsched.scaling``), never from the operator itself.

"Can this job ever run here?" is decided against the GPUs the node agents report (``GPUNode.status.gpus``): the
job's admit bytes on a GPU of model M (PMC plus M's device overheads and the safety factor) must fit M's capacity
(total minus reserve). A job whose admit bytes fit no GPU but whose need fits a whole one runs alone on it; one whose
need exceeds the largest GPU by no more than the largest over-prediction measured
(``gnnsched.closed_loop.MEASURED_OVERPREDICTION``) is tried alone on it (the estimate may be high; an overrun fails
it with ``ExceedsLargestGPU``). Beyond that the plan fails with ``PredictedPeakExceedsGPU`` naming both numbers. When
no node has reported yet, nothing can be concluded and the job goes ahead (the extender keeps it pending until a GPU
with room appears).

Which constants a GPU is planned with (``ClusterGPU.constants``, ``gnnsched.gpu.measured.device_model``): its node's
measurement (``GPUStatus.measured``) first, else the catalogue's entry for its model; GPUs are grouped by model *and*
constants, so two nodes of one model with different measurements each get their need. A GPU that neither describes
(uncatalogued and unmeasured, or a measured allocator gnnsched cannot model) is never planned with another model's
numbers: a job that only such GPUs can hold runs alone on one (``UnknownGPUModel`` / ``AllocatorModelMismatch``,
reserving its whole capacity), and the extender keeps every shared pod off them, so while the cluster has described
GPUs the job shares on those.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections import OrderedDict
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from gnnsched.closed_loop import (
    DEFAULT_CALIBRATION,
    DEFAULT_RUNTIME_CALIBRATION,
    MEASURED_OVERPREDICTION,
    CalibrationClass,
    CalibrationPolicy,
    CalibrationTable,
    runtime_class,
)
from gnnsched.contract import PREDICTED_RUNTIME_RESOLUTION_S, GPUMeasurement
from gnnsched.entrypoint_probe import ProbeResult
from gnnsched.gpu.catalogue import GPUModel, find_gpu_model
from gnnsched.gpu.measured import (
    UNKNOWN_GPU_MODEL,
    constants_key,
    device_model,
    measurement_fingerprint,
    missing_constants,
)
from gnnsched.quantity import format_bytes, format_cpu
from gnnsched.spec import GNNJobSpec

log = logging.getLogger("gnnsched.operator.planning")

SHIPPED_MODEL = "shipped"
"""``Planner.predictor_id`` of the runtime model shipped in the package (a retrained one's is its content digest)."""


class PlanError(Exception):
    """The job cannot be planned; ``reason`` is the condition reason (CamelCase), ``message`` says why with numbers."""

    def __init__(self, reason: str, message: str, phase: str = "Failed") -> None:
        self.reason = reason
        self.message = message
        self.phase = phase
        super().__init__(f"{reason}: {message}")


class ClusterGPU(BaseModel):
    """One GPU as a node agent reported it (only what planning needs).

    ``catalogued`` and ``measured`` are the agent's ``GPUStatus`` fields: the GPU is planned with its node's
    measured constants when there are some, with the catalogue's otherwise, and with nobody's when neither knows it
    (``gnnsched.gpu.measured.device_model``)."""

    model_config = ConfigDict(frozen=True)

    node: str
    model: str
    capacity_bytes: int
    healthy: bool = True
    uuid: str = ""
    total_bytes: int = 0  # 0: not reported (capacity stands in)
    catalogued: bool = True
    measured: GPUMeasurement | None = None

    def constants(self) -> tuple[GPUModel | None, str | None]:
        """The model to plan this GPU with and, when there is none, why (``UnknownGPUModel``,
        ``AllocatorModelMismatch``): the node's measurement first, then the catalogue, never another model's."""
        return device_model(self.model, self.total_bytes or self.capacity_bytes, self.measured, self.node,
                            self.catalogued)


class ModelNeed(BaseModel):
    """What the estimate says the GPU will count for the job on one GPU model (no safety factor).

    ``constants`` is the fingerprint of the node measurement the need was planned with
    (``gnnsched.gpu.measured.measurement_fingerprint``), None for the catalogue's constants: two nodes of one model
    with different measurements get a need each. Optional, so plans stored before it still read."""

    model: str
    bytes: int = Field(ge=0)
    constants: str | None = Field(default=None, pattern=r"^[0-9a-f]{12}$")


class Plan(BaseModel):
    """Everything the operator decided for a job; written to the pod's annotations and the job's status."""

    pmc_bytes: int
    admit_bytes: int
    # The closed memory loop (gnnsched.closed_loop). Defaults keep plans stored before it readable.
    estimate_admit_bytes: int | None = None  # the estimate's own admit bytes (gpuMemory or a resize may replace them)
    # wholeGPU: no prediction (an entrypoint whose probe failed, without gpuMemory): alone on a whole GPU
    reservation_source: Literal["estimate", "calibrated", "gpuMemory", "resized", "wholeGPU"] = "estimate"
    safety_factor: float | None = None  # the factor admit_bytes was built with (None: gpuMemory)
    exclusive: bool = False  # run alone on a whole GPU (the gate admits it only into an empty GPU)
    exclusive_reason: str | None = None
    container: Literal["builtin", "custom"] = "builtin"
    needs: list[ModelNeed] = []  # per GPU model in the cluster; a list so a merge patch replaces it whole
    # Optional fields default to None: the plan round-trips through a JSON merge patch, which drops null keys.
    admit_gpu_model: str | None = None  # the GPU model whose overheads admit_bytes includes (None: the default)
    # the fingerprint of the node measurement admit_bytes was planned with (None: the catalogue's constants)
    admit_constants: str | None = None
    # an UnknownGPUModel / AllocatorModelMismatch plan: the node of the GPU without constants it runs alone on
    exclusive_node: str | None = None
    predicted_runtime_seconds: float | None = None  # None: no predictor could answer (runtime_source says why)
    runtime_source: str  # which predictor produced it, and the runtime factor when one applied
    # The calibrated runtime factor predicted_runtime_seconds includes (None: the predictor's own figure); an
    # attempt's observed ÷ predicted runtime ratio is taken against the prediction without it.
    runtime_factor: float | None = None
    # The runtime model that predicted it (Planner.predictor_id): a ratio is recorded only while that model is in use.
    runtime_model: str = "shipped"
    runtime_gpu_model: str
    intensity: Literal["memory", "compute"] | None = None
    requested_cpu: str | None = None
    requested_memory: str | None = None
    scaled_cpu: str | None = None
    scaled_memory: str | None = None
    scaling_note: str = ""


def memory_key(spec: GNNJobSpec) -> str:
    """The part of a spec the GPU-memory estimate depends on (not epochs, requests or resources; the image only
    for an entrypoint, whose code lives in it)."""
    fields = {"mode", "model", "graph", "batching", "parallelism", "optimizer"}
    if spec.model.entrypoint is not None:
        fields.add("image")
    relevant = spec.model_dump(mode="json", include=fields, by_alias=True)
    return json.dumps(relevant, sort_keys=True)


class EstimateCache:
    """A bounded, thread-safe memo of estimates owned by one Planner (kopf runs sync handlers in threads).

    Many jobs in a cluster share a model and a graph; tracing each again costs 25-140 ms of CPU for nothing.
    """

    def __init__(self, size: int = 512) -> None:
        self._size = size
        self._items: OrderedDict[tuple[str, str | None], Any] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get_or_compute(self, key: tuple[str, str | None], compute: Any) -> Any:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                self.hits += 1
                return self._items[key]
        value = compute()
        with self._lock:
            self.misses += 1
            self._items[key] = value
            while len(self._items) > self._size:
                self._items.popitem(last=False)
        return value


class Planner:
    """Runs the core models for one job. ``default_gpu_model`` is used for the runtime when no GPU has reported."""

    def __init__(self, default_gpu_model: str = "A100-40GB", estimate_device: Literal["cpu", "cuda"] = "cuda",
                 calibration_policy: CalibrationPolicy = DEFAULT_CALIBRATION,
                 runtime_policy: CalibrationPolicy = DEFAULT_RUNTIME_CALIBRATION) -> None:
        self.default_gpu_model = default_gpu_model
        self.calibration_policy = calibration_policy
        self.runtime_policy = runtime_policy
        self.estimate_device = estimate_device
        self.cache = EstimateCache()
        self._runtime_predictor: Any = None
        self._runtime_lock = threading.Lock()
        self.predictor_id = SHIPPED_MODEL  # the model in use: use_predictor's model_id

    # --- the core models (imported here: torch and xgboost must not load for `gnnsched --help`) ---

    def _estimate(self, spec: GNNJobSpec, gpu_model: Any, safety_factor: float | None = None,
                  probe: ProbeResult | None = None) -> Any:
        """The estimate on ``gpu_model`` with the estimator's static factor, or with ``safety_factor`` (1.0: what
        the GPU is predicted to count, the denominator of every observed ÷ predicted ratio). An entrypoint job's
        comes from its probe's trace (``probe``), or is its declared ``gpuMemory`` when no probe result exists."""
        from gnnsched.estimator import estimate

        if spec.model.entrypoint is not None:
            if probe is None:
                return _declared(spec)
            from gnnsched.entrypoint_probe import estimate_from_probe
            from gnnsched.gpu.catalogue import get_gpu_model

            gpu = gpu_model if gpu_model is not None else get_gpu_model(self.default_gpu_model)
            return estimate_from_probe(probe, gpu, safety_factor)
        model = gpu_model if gpu_model is not None else self.default_gpu_model
        # keyed on the constants, not the name: a node's measured model and the catalogue's entry of the same name
        # give different estimates
        resolved = model if isinstance(model, GPUModel) else find_gpu_model(str(model))
        name = constants_key(resolved) if resolved is not None else str(model)
        key = (memory_key(spec), name if safety_factor is None else f"{name}@{safety_factor:g}")
        return self.cache.get_or_compute(key, lambda: estimate(spec, device=self.estimate_device, gpu_model=model,
                                                               safety_factor=safety_factor))

    def _admit_on(self, spec: GNNJobSpec, model: Any, calibration: CalibrationTable | None,
                  container: Literal["builtin", "custom"],
                  probe: ProbeResult | None = None) -> tuple[int, int, int, float, bool]:
        """(admit bytes, predicted need, the estimate's static admit bytes, factor, calibrated) on one model.

        A class with enough recorded ratios uses its calibrated factor on the predicted need in place of the
        estimator's static factor; otherwise the estimate's own admit bytes stand."""
        static = self._estimate(spec, model, probe=probe)
        need = int(self._estimate(spec, model, safety_factor=1.0, probe=probe).admit_bytes)
        name = getattr(model, "name", None) or self.default_gpu_model
        if calibration is not None:
            cls = CalibrationClass(gpu_model=name, arch=spec.model.model_class, mode=spec.mode, container=container)
            result = calibration.factor(cls, self.calibration_policy)
            if result.calibrated:
                return math.ceil(need * result.factor), need, int(static.admit_bytes), result.factor, True
        return int(static.admit_bytes), need, int(static.admit_bytes), float(static.safety_factor), False

    def _predictor(self) -> Any:
        """The learned runtime model in use: the one ``use_predictor`` gave (the cluster's retrained model, reloaded
        from its ConfigMap), else the one shipped in the package, loaded once per Planner."""
        with self._runtime_lock:
            if self._runtime_predictor is None:
                from gnnsched.predictor.gnn import GNNRuntimePredictor

                self._runtime_predictor = GNNRuntimePredictor.load_default()
            return self._runtime_predictor

    def use_predictor(self, model: Any, model_id: str = SHIPPED_MODEL) -> None:
        """Plan with ``model`` from the next prediction on (``None``: the shipped one again); the swap is one
        reference under the lock, so a prediction uses either the old model or the new one, never a mix.
        ``model_id`` (the content digest of its ``model.json``) goes into each plan (``Plan.runtime_model``), so that
        runtime ratios are only ever taken against the model that predicted them."""
        with self._runtime_lock:
            self._runtime_predictor = model
            self.predictor_id = model_id if model is not None else SHIPPED_MODEL

    def _predict_runtime(self, spec: GNNJobSpec, gpu_model: Any, cpu: float, memory: int) -> tuple[float | None, str]:
        """The learned predictor when it loads and answers, else the analytic prior; the source is reported.

        A job runs without a runtime prediction (it only orders queues), so failure is reported, not fatal.
        """
        try:
            seconds = float(self._predictor().predict(spec, gpu_model.name, cpu, memory))
            if seconds > 0 and seconds == seconds:  # positive and not NaN
                return seconds, "gnn-predictor"
        except Exception:  # noqa: BLE001 - a predictor failure must not fail the job; the prior answers next
            log.warning("runtime predictor failed; using the analytic prior", exc_info=True)
        try:
            from gnnsched import runtime_prior

            return float(runtime_prior.solo_runtime_seconds(spec, gpu_model, cpu)), "analytic-prior"
        except Exception as exc:  # noqa: BLE001
            return None, f"unavailable ({type(exc).__name__}: {exc})"

    def _intensity(self, spec: GNNJobSpec, gpu_model: Any) -> Literal["memory", "compute"] | None:
        """Which side of the GPU's roofline ridge point the job falls on (a pairing hint for the extender)."""
        try:
            from gnnsched import runtime_prior

            value = runtime_prior.intensity_class(spec, gpu_model)
        except Exception:  # noqa: BLE001 - the class is a scheduling hint; without it the extender pairs blindly
            return None
        return value

    def _resources(self, spec: GNNJobSpec, runtime_gpu: Any) -> tuple[float, int, float, int, float | None, str]:
        """(requested cpu, requested memory, scaled cpu, scaled memory, runtime after scaling or None, note).

        A job that requests nothing gets the scaling floor as its request (1 core, its estimated host footprint),
        so it is never scheduled as BestEffort and OOM-killed on the host; the note says so.
        """
        from gnnsched.host_footprint import host_footprint
        from gnnsched.scaling import CPU_FLOOR_CORES, Resources, scale

        cpu = spec.resources.cpu_cores()
        memory = spec.resources.memory_bytes()
        note = ""
        if cpu is None or memory is None:
            cpu = cpu if cpu is not None else CPU_FLOOR_CORES
            memory = memory if memory is not None else host_footprint(spec, cpu).total_bytes
            note = "request completed from the host-footprint floor (spec.resources incomplete); "
        if not spec.scaling.enabled:
            return cpu, memory, cpu, memory, None, note + "scaling disabled by spec.scaling.enabled"
        try:
            result = scale(spec, Resources(cpu=cpu, memory=memory), predictor=self._predictor(),
                           gpu_model=runtime_gpu.name)
        except Exception as exc:  # noqa: BLE001 - scaling is an optimisation; keep the request and say why
            log.warning("scaling failed", exc_info=True)
            return cpu, memory, cpu, memory, None, note + f"scaling failed, request kept: {type(exc).__name__}: {exc}"
        return (cpu, memory, float(result.scaled.cpu), int(result.scaled.memory),
                float(result.predicted_runtime_after), note + str(result.reason))

    # --- the plan ---

    def plan(self, spec: GNNJobSpec, gpus: list[ClusterGPU], calibration: CalibrationTable | None = None,
             probe: ProbeResult | None = None, runtime_calibration: CalibrationTable | None = None) -> Plan:
        """Estimate, check against the cluster's GPUs, predict and scale. Raises ``PlanError`` with the reason.

        The reservation (admit bytes) is, in order: ``spec.resources.gpuMemory`` when set; else the estimate with the
        calibrated factor of the job's class when ``calibration`` has enough samples for it; else the estimate with
        the static factor. A job whose reservation fits no GPU but whose predicted need (PMC plus device overheads)
        fits a whole one runs alone (``exclusive``), reserving that GPU's capacity. Each GPU is weighed with its
        own constants (its node's measurement, else the catalogue's); a job that only GPUs without constants can
        hold runs alone on the largest of them (``UnknownGPUModel`` or ``AllocatorModelMismatch``).

        An entrypoint job's estimate is its probe's trace (``probe``). Without one (the probe failed) and without
        ``gpuMemory`` nothing predicts it: it runs alone on a whole GPU (``wholeGPU``).

        The predicted runtime is the predictor's times its runtime class's calibrated factor when
        ``runtime_calibration`` has enough samples for it (``runtime_factor``; ``runtime_source`` says so)."""

        container: Literal["builtin", "custom"] = "custom" if (spec.command or spec.image) else "builtin"
        override = spec.resources.gpu_memory_bytes()
        if spec.model.entrypoint is not None and probe is None and override is None:
            return self._whole_gpu_plan(spec, gpus, container, runtime_calibration)
        try:
            base_admit, base_need, base_static, base_factor, base_cal = self._admit_on(spec, None, calibration,
                                                                                      container, probe)
            base = self._estimate(spec, None, probe=probe)
        except MemoryError:
            raise PlanError("EstimationFailed", "the estimator ran out of host memory tracing this graph") from None
        except Exception as exc:  # noqa: BLE001 - any estimator failure becomes a condition, never a crash
            raise PlanError("EstimationFailed", f"the estimator failed: {type(exc).__name__}: {exc}") from None

        healthy = [g for g in gpus if g.healthy]
        rows: list[_Row] = []
        # GPUs no constants describe (uncatalogued and unmeasured, or a measured allocator gnnsched cannot model):
        # never planned with another model's numbers; a job that only they can hold runs alone on one
        unknown: list[tuple[ClusterGPU, str]] = []
        for gpu, model, reason in _distinct_largest_per_group(healthy):
            if model is None:
                unknown.append((gpu, reason or UNKNOWN_GPU_MODEL))
                continue
            try:
                admit, need, static, factor, calibrated = self._admit_on(spec, model, calibration, container, probe)
            except Exception as exc:  # noqa: BLE001
                raise PlanError("EstimationFailed", f"the estimator failed for {gpu.model}: {exc}") from None
            rows.append(_Row(gpu, admit, model, need, static, factor, calibrated,
                             measurement_fingerprint(gpu.measured)))
        if override is not None:
            rows = [r._replace(admit=override) for r in rows]
        fitting = [r for r in rows if r.admit <= r.gpu.capacity_bytes]
        exclusive: list[_Row] = []
        exclusive_reason = "ExceedsShareableCapacity"
        if not fitting and override is None:
            # Alone on a whole GPU the safety factor has no neighbour to protect: the GPU's capacity is the limit. A
            # need above every GPU is tried so too while an estimate can be that much too high.
            rules = (("ExceedsShareableCapacity", 1.0), ("PredictedPeakAboveGPU", MEASURED_OVERPREDICTION))
            for reason, bound in rules:
                exclusive = [r._replace(admit=r.gpu.capacity_bytes) for r in rows
                             if r.need <= r.gpu.capacity_bytes * bound]
                if exclusive:
                    exclusive_reason = reason
                    break
        alone_on: tuple[ClusterGPU, str] | None = None
        if not fitting and not exclusive and unknown:
            alone_on = self._alone_on_unknown(unknown, override if override is not None else int(base.pmc_bytes),
                                              override is not None, rows)
        largest = max(rows, key=lambda r: r.gpu.capacity_bytes) if rows else None
        if healthy and not fitting and not exclusive and alone_on is None:
            assert largest is not None  # _alone_on_unknown raises when only unknown GPUs exist
            gpu, admit = largest.gpu, largest.admit
            if override is not None:
                raise PlanError(
                    "GPUMemoryExceedsGPU",
                    f"spec.resources.gpuMemory {format_bytes(admit)} ({admit} bytes) exceeds the largest GPU in the "
                    f"cluster, {gpu.model} on node {gpu.node} with {format_bytes(gpu.capacity_bytes)} "
                    f"({gpu.capacity_bytes} bytes) usable", phase="Unschedulable")
            raise PlanError(
                "PredictedPeakExceedsGPU",
                f"predicted peak {format_bytes(largest.need)} ({largest.need} bytes: PMC {int(base.pmc_bytes)} "
                f"bytes plus device overheads; admit {admit} bytes with the safety factor) exceeds the largest GPU in "
                f"the cluster, {gpu.model} on node {gpu.node} with {format_bytes(gpu.capacity_bytes)} "
                f"({gpu.capacity_bytes} bytes) usable",
                phase="Unschedulable",
            )

        chosen = fitting or exclusive
        admit_constants: str | None = None
        exclusive_node: str | None = None
        if chosen:
            counts: dict[str, int] = {}
            for g in healthy:
                counts[g.model] = counts.get(g.model, 0) + 1
            top = max(chosen, key=lambda r: r.admit)
            admit_bytes, admit_model, admit_constants = top.admit, top.gpu.model, top.constants
            static_admit, factor, calibrated = top.static, top.factor, top.calibrated
            # the runtime model is a catalogue entry: an uncatalogued GPU's stand-in throughput is no prediction
            known = [(r.gpu, find_gpu_model(r.gpu.model)) for r in chosen]
            catalogued = [(g, m) for g, m in known if m is not None]
            runtime_gpu = max(catalogued, key=lambda gm: counts[gm[0].model])[1] if catalogued else None
        elif alone_on is not None:
            gpu, exclusive_reason = alone_on
            admit_bytes, admit_model, exclusive_node = gpu.capacity_bytes, gpu.model, gpu.node
            static_admit, factor, calibrated = base_static, base_factor, base_cal
            runtime_gpu = find_gpu_model(gpu.model)
        else:
            admit_bytes = base_admit if override is None else override
            admit_model = None
            static_admit, factor, calibrated = base_static, base_factor, base_cal
            runtime_gpu = None
        needs = [ModelNeed(model=r.gpu.model, bytes=r.need, constants=r.constants) for r in rows]
        if not needs and not unknown:
            needs = [ModelNeed(model=self.default_gpu_model, bytes=base_need)]
        alone = bool(exclusive) or alone_on is not None
        return self._finish(spec, runtime_gpu, runtime_calibration, pmc_bytes=int(base.pmc_bytes),
                            admit_bytes=admit_bytes,
                            estimate_admit_bytes=static_admit,
                            reservation_source="gpuMemory" if override is not None
                            else "calibrated" if calibrated else "estimate",
                            safety_factor=None if override is not None else factor, exclusive=alone,
                            exclusive_reason=exclusive_reason if alone else None, container=container,
                            needs=needs, admit_gpu_model=admit_model, admit_constants=admit_constants,
                            exclusive_node=exclusive_node)

    @staticmethod
    def _alone_on_unknown(unknown: list[tuple[ClusterGPU, str]], least: int, declared: bool,
                          rows: list[_Row]) -> tuple[ClusterGPU, str] | None:
        """The GPU without constants a job that no described GPU can hold runs alone on (the largest whose
        capacity holds ``least``: the declared ``gpuMemory``, or the PMC, the one part of the need that does not
        depend on the device constants), and its reason. None when none holds it and a described GPU at least as
        large exists (the caller's error names it, with the need in full); else the plan's Unschedulable error."""
        holding = [(g, why) for g, why in unknown if least <= g.capacity_bytes]
        if holding:
            return max(holding, key=lambda gw: gw[0].capacity_bytes)
        if rows:  # the described GPUs' error names the largest of them, with the need in full
            biggest = max(rows, key=lambda r: r.gpu.capacity_bytes).gpu
            if biggest.capacity_bytes >= max(g.capacity_bytes for g, _ in unknown):
                return None
        gpu = max((g for g, _ in unknown), key=lambda g: g.capacity_bytes)
        what = "spec.resources.gpuMemory" if declared else "the predicted PMC (before any device overhead)"
        raise PlanError(
            "GPUMemoryExceedsGPU" if declared else "PredictedPeakExceedsGPU",
            f"{what} {format_bytes(least)} ({least} bytes) exceeds the largest GPU in the cluster, {gpu.model} on "
            f"node {gpu.node} with {format_bytes(gpu.capacity_bytes)} ({gpu.capacity_bytes} bytes) usable",
            phase="Unschedulable")

    def _finish(self, spec: GNNJobSpec, runtime_gpu: Any, runtime_calibration: CalibrationTable | None,
                **memory: Any) -> Plan:
        """The plan from its memory decision (``memory``: Plan's memory fields) plus the runtime prediction (with
        the runtime class's calibrated factor from ``runtime_calibration``) and the scaled resources on
        ``runtime_gpu`` (None: the default GPU model)."""
        from gnnsched.gpu.catalogue import get_gpu_model

        if runtime_gpu is None:
            try:
                runtime_gpu = get_gpu_model(self.default_gpu_model)
            except KeyError:
                raise PlanError(
                    "InvalidConfiguration", f"unknown default GPU model {self.default_gpu_model!r}"
                ) from None
        # Read before the predictions: a swap in between (a reload lands mid-plan) tags one plan with the model that
        # was replaced, and costs at most that one runtime sample (it is skipped as another model's).
        model_id = self.predictor_id
        req_cpu, req_memory, cpu, memory_bytes, scaled_runtime, note = self._resources(spec, runtime_gpu)
        seconds: float | None
        if scaled_runtime is not None and scaled_runtime > 0:
            seconds, source = scaled_runtime, "gnn-predictor"
        else:
            seconds, source = self._predict_runtime(spec, runtime_gpu, cpu, memory_bytes)
        factor: float | None = None
        if seconds is not None and runtime_calibration is not None:
            cls = runtime_class(spec, runtime_gpu.name, memory["container"])
            result = runtime_calibration.factor(cls, self.runtime_policy)
            if result.calibrated:
                factor = result.factor
                seconds *= factor
                source += f", calibrated x{factor:g} ({cls.key()}, {result.source} samples)"
        return Plan(
            **memory,
            predicted_runtime_seconds=None if seconds is None else max(round(seconds, 3),
                                                                       PREDICTED_RUNTIME_RESOLUTION_S),
            runtime_source=source,
            runtime_factor=factor,
            runtime_model=model_id,
            runtime_gpu_model=runtime_gpu.name,
            intensity=self._intensity(spec, runtime_gpu),
            requested_cpu=spec.resources.cpu or format_cpu(req_cpu),
            requested_memory=spec.resources.memory or exact_bytes_quantity(req_memory),
            scaled_cpu=format_cpu(cpu),
            scaled_memory=exact_bytes_quantity(memory_bytes),
            scaling_note=note,
        )

    def _whole_gpu_plan(self, spec: GNNJobSpec, gpus: list[ClusterGPU], container: Literal["builtin", "custom"],
                        runtime_calibration: CalibrationTable | None = None) -> Plan:
        """Alone on a whole GPU, with no prediction: the reservation is the capacity of the largest healthy GPU (the
        gate admits an exclusive pod only into an empty GPU; the extender places it where that capacity exists).
        With no GPU reported yet, the default model's capacity stands until the pod is placed."""
        from gnnsched.gpu.catalogue import get_gpu_model

        healthy = [g for g in gpus if g.healthy]
        largest = max(healthy, key=lambda g: g.capacity_bytes) if healthy else None
        try:
            runtime_gpu = get_gpu_model(largest.model if largest is not None else self.default_gpu_model)
        except KeyError:
            runtime_gpu = None
        capacity = largest.capacity_bytes if largest is not None else \
            get_gpu_model(self.default_gpu_model).memory_bytes
        return self._finish(spec, runtime_gpu, runtime_calibration, pmc_bytes=0, admit_bytes=capacity,
                            estimate_admit_bytes=None,
                            reservation_source="wholeGPU", safety_factor=None, exclusive=True,
                            exclusive_reason="ProbeFailed", container=container, needs=[],
                            admit_gpu_model=largest.model if largest is not None else None)


class _Declared(BaseModel):
    """The estimate's fields for a job gnnsched must not trace here: an entrypoint's code runs only in its own
    image (never in the operator), so its reservation is ``spec.resources.gpuMemory`` (``extra_validation``
    requires it) and the prediction is that number."""

    pmc_bytes: int
    admit_bytes: int
    safety_factor: float = 1.0


def _declared(spec: GNNJobSpec) -> _Declared:
    declared = spec.resources.gpu_memory_bytes()
    if declared is None:
        raise PlanError("EstimationFailed", "spec.model.entrypoint needs spec.resources.gpuMemory: the operator never "
                        "runs a user's code to trace it")
    return _Declared(pmc_bytes=declared, admit_bytes=declared)


class _Row(NamedTuple):
    """One group of GPUs as the plan weighs it: its largest GPU, the job's admit bytes there, the model (with the
    constants) it was estimated on, the predicted need, the estimate's static admit bytes, the factor, whether it
    was calibrated, and the fingerprint of the node measurement (None: the catalogue's constants)."""

    gpu: ClusterGPU
    admit: int
    model: GPUModel
    need: int
    static: int
    factor: float
    calibrated: bool
    constants: str | None


def _distinct_largest_per_group(gpus: list[ClusterGPU]) -> list[tuple[ClusterGPU, GPUModel | None, str | None]]:
    """One GPU per group, with the model to plan it with (``ClusterGPU.constants``) or why there is none.

    A group is a model name with the constants its node gives it: the catalogue's (unmeasured), one measurement
    (by its fingerprint), or none (by the reason). Why not the name alone: two nodes of one model whose
    measurements differ need different bytes, and an H200 measured on one node says nothing about an unmeasured one.
    The representative is the GPU with the most usable memory (a job fits a group if it fits its best GPU)."""
    best: dict[tuple[str, str], ClusterGPU] = {}
    for gpu in gpus:  # keyed without building a model per GPU: a plan looks at every GPU of the cluster
        reason = missing_constants(gpu.model, gpu.measured, gpu.catalogued)
        key = (gpu.model, reason or measurement_fingerprint(gpu.measured) or "catalogue")
        if key not in best or gpu.capacity_bytes > best[key].capacity_bytes:
            best[key] = gpu
    return [(best[k], *best[k].constants()) for k in sorted(best)]


def exact_bytes_quantity(n: int) -> str:
    """A byte count as a Kubernetes quantity that parses back to exactly ``n`` (a request must not round down)."""
    for suffix, unit in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


def gpus_from_gpunode(obj: Any) -> list[ClusterGPU]:
    """The GPUs of one ``GPUNode`` object; a malformed status yields none (never raises)."""
    from pydantic import ValidationError

    from gnnsched.contract import GPUNodeStatus

    if not isinstance(obj, dict):
        return []
    status = obj.get("status")
    name = (obj.get("metadata") or {}).get("name") if isinstance(obj.get("metadata"), dict) else None
    if not isinstance(status, dict):
        return []
    try:
        parsed = GPUNodeStatus.model_validate({"nodeName": name or "", **status})
    except (ValidationError, TypeError, ValueError):
        return []
    node = parsed.node_name or str(name or "")
    return [
        ClusterGPU(node=node, model=g.model, capacity_bytes=g.capacity_bytes, healthy=g.healthy, uuid=g.uuid,
                   total_bytes=g.total_bytes, catalogued=g.catalogued, measured=g.measured)
        for g in parsed.gpus
    ]
