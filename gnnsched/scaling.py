"""Adaptive resource scaling (seed 004, Algorithm 1) with the flaws a tree model exposes fixed.

Algorithm 1 shrinks every resource the task's model finds unimportant (permutation importance) by a factor α, and
accepts the first α whose predicted runtime differs from the unshrunk prediction by less than θ; α grows by Δα
until 1 (no change). Run literally on a tree model it goes wrong in three ways, fixed here:

1. Trees are flat outside their training data, so "runtime does not change" is often "the model does not know":
   a **floor** bounds every shrink — CPU ≥ 1 core, memory ≥ the job's host footprint
   (``gnnsched.host_footprint``, or a measured peak if the caller has one, whichever is larger).
2. Flat regions also let α run to its smallest value in one go; α starts at ``alpha0`` (the **step cap**: one
   scaling never removes more than ``1 − alpha0`` of a request).
3. An unconstrained tree can predict *faster* with fewer resources and the shrink then looks free; the models are
   monotone (−1) in CPU and memory, and θ bounds |ΔT|/T in both directions.

The result never exceeds the request (a job never gets more than it asked for) and never goes below the floor unless
the request itself is below it, in which case the request is returned unchanged. ``scale`` is pure: same inputs,
same output, no I/O except loading the default model when none is passed.
"""

from __future__ import annotations

import math
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from gnnsched.host_footprint import host_footprint
from gnnsched.spec import GNNJobSpec, SpecError

CPU_FLOOR_CORES = 1.0
DEFAULT_ALPHA0 = 0.5
DEFAULT_DELTA_ALPHA = 0.1
DEFAULT_IMPORTANCE_THRESHOLD = 0.05  # log units: shuffling the resource moves predictions by <≈5 %
DEFAULT_GPU_MODEL = "A100-80GB"
MiB = 2**20


class RuntimePredictor(Protocol):
    def predict(self, spec: GNNJobSpec, gpu_model: str, cpu: float, memory_bytes: float) -> float: ...

    def class_importance(self, spec: GNNJobSpec) -> dict[str, float]: ...


class Resources(BaseModel):
    """CPU in cores, memory in bytes."""

    model_config = ConfigDict(frozen=True)

    cpu: float = Field(gt=0)
    memory: int = Field(gt=0)


class ScaledResources(BaseModel):
    """What scaling decided and why."""

    model_config = ConfigDict(frozen=True)

    requested: Resources
    scaled: Resources
    floor: Resources
    predicted_runtime_before: float
    predicted_runtime_after: float
    alpha: float | None  # the accepted factor; None when nothing was scaled
    scaled_resources: tuple[str, ...]  # which resources were candidates for shrinking
    importance: dict[str, float]
    reason: str


def requested_from_spec(spec: GNNJobSpec) -> Resources:
    """The request written in the job's ``spec.resources``; both fields are needed to scale."""
    cpu = spec.resources.cpu_cores()
    memory = spec.resources.memory_bytes()
    if cpu is None:
        raise SpecError("spec.resources.cpu", "required for scaling (nothing to scale from)")
    if memory is None:
        raise SpecError("spec.resources.memory", "required for scaling (nothing to scale from)")
    return Resources(cpu=cpu, memory=memory)


def _ceil_milli(cores: float) -> float:
    return math.ceil(round(cores * 1000, 6)) / 1000.0


def _ceil_mib(n: float) -> int:
    return int(math.ceil(n / MiB)) * MiB


def scale(
    spec: GNNJobSpec,
    requested: Resources | None = None,
    *,
    predictor: RuntimePredictor | None = None,
    gpu_model: str = DEFAULT_GPU_MODEL,
    theta: float | None = None,
    alpha0: float = DEFAULT_ALPHA0,
    delta_alpha: float = DEFAULT_DELTA_ALPHA,
    importance_threshold: float = DEFAULT_IMPORTANCE_THRESHOLD,
    measured_host_bytes: int | None = None,
) -> ScaledResources:
    """Algorithm 1 for one GNNJob. ``theta`` defaults to ``spec.scaling.theta``; see the module docstring."""
    if not 0.0 < alpha0 < 1.0:
        raise ValueError(f"alpha0: {alpha0} must be between 0 and 1 (exclusive)")
    if not 0.0 < delta_alpha < 1.0:
        raise ValueError(f"delta_alpha: {delta_alpha} must be between 0 and 1 (exclusive)")
    if predictor is None:
        from gnnsched.predictor.gnn import GNNRuntimePredictor

        predictor = GNNRuntimePredictor.load_default()
    requested = requested or requested_from_spec(spec)
    theta = spec.scaling.theta if theta is None else theta
    if theta <= 0:
        raise ValueError(f"theta: {theta} must be positive")

    def floor_at(cpu: float) -> Resources:
        estimated = host_footprint(spec, cpu).total_bytes
        return Resources(cpu=CPU_FLOOR_CORES, memory=max(estimated, measured_host_bytes or 0, 1))

    before = predictor.predict(spec, gpu_model, requested.cpu, requested.memory)
    importance = predictor.class_importance(spec)
    shrinkable = tuple(r for r in ("cpu", "memory") if importance.get(r, 0.0) < importance_threshold)

    def unchanged(reason: str) -> ScaledResources:
        return ScaledResources(
            requested=requested, scaled=requested, floor=floor_at(requested.cpu), predicted_runtime_before=before,
            predicted_runtime_after=before, alpha=None, scaled_resources=shrinkable, importance=importance,
            reason=reason,
        )

    if not spec.scaling.enabled:
        return unchanged("scaling disabled in spec.scaling.enabled")
    if not shrinkable:
        return unchanged("every resource is important to the predicted runtime")
    steps = int(math.ceil(round((1.0 - alpha0) / delta_alpha, 9)))
    for k in range(steps):
        alpha = round(alpha0 + k * delta_alpha, 9)
        if alpha >= 1.0:
            break
        cpu = requested.cpu
        if "cpu" in shrinkable:
            cpu = min(requested.cpu, max(CPU_FLOOR_CORES, _ceil_milli(alpha * requested.cpu)))
        floor = floor_at(cpu)
        memory = requested.memory
        if "memory" in shrinkable:
            memory = min(requested.memory, max(floor.memory, _ceil_mib(alpha * requested.memory)))
        if cpu == requested.cpu and memory == requested.memory:
            continue  # already at the floor: nothing to try at this α
        after = predictor.predict(spec, gpu_model, cpu, memory)
        if abs(after - before) / before < theta:
            return ScaledResources(
                requested=requested, scaled=Resources(cpu=cpu, memory=memory), floor=floor,
                predicted_runtime_before=before, predicted_runtime_after=after, alpha=alpha,
                scaled_resources=shrinkable, importance=importance,
                reason=f"shrunk by α={alpha:g} within θ={theta:g}",
            )
    return unchanged(f"no α in [{alpha0:g}, 1) keeps the predicted runtime within θ={theta:g}, or already at floor")


# --- Algorithm 2: one scheduling round ------------------------------------------------------------------------------


class ServerState(BaseModel):
    """Free CPU cores and memory bytes of one server at the start of a round."""

    model_config = ConfigDict(frozen=True)

    name: str
    cpu_free: float = Field(ge=0)
    memory_free: int = Field(ge=0)


class RoundResult(BaseModel):
    """Where each job went (or that it waits), with what it was given, and the servers' state afterwards."""

    model_config = ConfigDict(frozen=True)

    placements: dict[str, str]  # job name -> server name
    pending: tuple[str, ...]
    given: dict[str, Resources]  # job name -> resources reserved (scaled or as requested)
    decisions: dict[str, ScaledResources]
    servers: tuple[ServerState, ...]


def schedule_round(
    jobs: list[tuple[str, GNNJobSpec, Resources]],
    servers: list[ServerState],
    *,
    predictor: RuntimePredictor | None = None,
    gpu_model: str = DEFAULT_GPU_MODEL,
    adaptive: bool = True,
) -> RoundResult:
    """Seed 004's Algorithm 2 for one round, FIFO: jobs in the given order; each is scaled by Algorithm 1
    (``scale``; skipped when ``adaptive`` is False), then placed on the server with the least free resources that
    still holds it (servers sorted ascending by free memory, then free CPU, to limit fragmentation); a job no server
    holds waits for the next round. Pure: the input lists are not modified; ties keep the input order."""
    if predictor is None and adaptive:
        from gnnsched.predictor.gnn import GNNRuntimePredictor

        predictor = GNNRuntimePredictor.load_default()
    free = {s.name: [s.cpu_free, s.memory_free] for s in servers}
    order = [s.name for s in servers]
    placements: dict[str, str] = {}
    given: dict[str, Resources] = {}
    decisions: dict[str, ScaledResources] = {}
    pending: list[str] = []
    for name, spec, requested in jobs:
        want = requested
        if adaptive:
            decision = scale(spec, requested, predictor=predictor, gpu_model=gpu_model)
            decisions[name] = decision
            want = decision.scaled
        candidates = sorted(order, key=lambda s: (free[s][1], free[s][0], order.index(s)))
        target = next((s for s in candidates if free[s][0] >= want.cpu - 1e-9 and free[s][1] >= want.memory), None)
        if target is None:
            pending.append(name)
            continue
        free[target][0] -= want.cpu
        free[target][1] -= want.memory
        placements[name] = target
        given[name] = want
    return RoundResult(
        placements=placements, pending=tuple(pending), given=given, decisions=decisions,
        servers=tuple(ServerState(name=s, cpu_free=max(free[s][0], 0.0), memory_free=free[s][1]) for s in order),
    )
