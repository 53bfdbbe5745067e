"""The closed memory loop's shared rules: how an attempt ended, how much larger the next one reserves, and how
observed peaks calibrate the safety factor of new estimates.

The operator (which creates attempts and keeps the calibration object), the node side (the worker and the gate
keeper, which report how an attempt ended) and the simulator (which replays the loop to measure it) all run these
functions, so the behaviour the simulator reports is the behaviour the cluster has. Nothing here touches torch,
Kubernetes or NVML: it is plain arithmetic on bytes and ratios.

Why a loop at all: on a real GPU the estimate is open-loop. What an MPS limit counts is the CUDA caching allocator's
reserved memory plus the context, users run their own scripts, and most constants in ``gnnsched.gpu.catalogue`` are
unmeasured. A job that overruns its ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` fails alone (the limit protects its
neighbours); the loop turns that failure into a larger retry and into a correction of later estimates, instead of a
lost job.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gnnsched.attempts.fault_classes import MAX_FAULT_PEERS, Charge, fault_class
from gnnsched.errors import FieldError

if TYPE_CHECKING:
    from gnnsched.spec import GNNJobSpec

Outcome = Literal["succeeded", "memory-exceeded", "fault"]
"""How one attempt ended, as the worker's result line (or the node agent's attempt-result annotation, for a custom
container) reports it: ``memory-exceeded`` is a CUDA out-of-memory error inside the attempt's own limit (retry
larger); ``fault`` is a fatal GPU or MPS error (the fault-domain rules decide who is charged); anything else that
fails is an ordinary failure."""

ContainerKind = Literal["builtin", "custom"]
"""``builtin``: the pod runs ``gnnsched worker`` (the estimate is for exactly the code that runs); ``custom``: the
user's own image or command (the script may hold more than the declared model). Calibrated separately."""

MPS_CLIENT_TERMINATED = 810
"""``cudaErrorMpsClientTerminated``: the MPS server terminated this client because another client on the same GPU hit
a fatal fault. A process that dies with it is a victim, not the cause (NVIDIA MPS documentation, "Fault Tolerance")."""

CRITICAL_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 119, 120})
"""Xid events after which the GPU's MPS clients cannot be trusted to continue (NVIDIA's Xid catalogue: graphics engine
and MMU faults, double-bit ECC, row-remapping failure, NVLink errors, GPU fallen off the bus, GSP errors). Xid 43
("GPU stopped processing") is what a client sees when its own kernel faults, so it marks the suspect's GPU too."""

# PyTorch's and CUDA's out-of-memory texts, as they appear in a container's log or termination message:
# torch.OutOfMemoryError ("CUDA out of memory. Tried to allocate 20.00 MiB ..."), the CUDA runtime's
# cudaErrorMemoryAllocation ("CUDA error: out of memory"), cuBLAS's CUBLAS_STATUS_ALLOC_FAILED, cuDNN's
# CUDNN_STATUS_ALLOC_FAILED and NCCL's "Cuda failure 'out of memory'".
_OOM_PATTERNS = re.compile(
    r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|cudaErrorMemoryAllocation"
    r"|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED|Cuda failure 'out of memory'",
)
_FAULT_PATTERNS = re.compile(
    r"cudaErrorMpsClientTerminated|MPS client has been terminated|CUDA error: an illegal memory access"
    r"|cudaErrorIllegalAddress|CUDA error: unspecified launch failure|cudaErrorLaunchFailure"
    r"|CUDA error: uncorrectable ECC error|cudaErrorECCUncorrectable",
)
_MPS_TERMINATED = re.compile(r"cudaErrorMpsClientTerminated|MPS client has been terminated")
_TRIED_TO_ALLOCATE = re.compile(r"Tried to allocate ([0-9.]+) ([KMGT]i?B)")
_UNIT = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "KB": 2**10, "MB": 2**20, "GB": 2**30, "TB": 2**40}


def classify_log(text: str) -> Outcome | None:
    """The outcome a failed custom container's log tail or termination message shows, ``None`` when it shows neither
    an out-of-memory error nor a GPU fault. Out-of-memory wins when both appear (the fault is its consequence)."""
    if _OOM_PATTERNS.search(text):
        return "memory-exceeded"
    if _FAULT_PATTERNS.search(text):
        return "fault"
    return None


def is_mps_victim_text(text: str) -> bool:
    """Whether a log says the process was terminated by the MPS server for another client's fault (error 810)."""
    return bool(_MPS_TERMINATED.search(text))


def failed_request_bytes(text: str) -> int | None:
    """The request PyTorch's out-of-memory message names ("Tried to allocate 20.00 MiB"), in bytes."""
    match = _TRIED_TO_ALLOCATE.search(text)
    if match is None:
        return None
    return int(float(match.group(1)) * _UNIT[match.group(2)])


class AttemptResult(BaseModel):
    """The JSON result line an attempt leaves in ``$GNNSCHED_RESULT_FILE`` (the termination message) and on stdout.

    Written by ``gnnsched worker`` for built-in jobs. For a custom container that failed without one, the node agent
    writes the outcome it classified as the pod annotation ``gnnsched.io/attempt-result`` (``source: gate``): the
    container's own gate keeper dies with its PID 1, so it cannot write the termination message.
    Keys are snake_case, as the worker's result line has always been; unknown keys are kept out."""

    model_config = ConfigDict(extra="ignore")

    outcome: Outcome = "succeeded"
    observed_peak_bytes: int | None = Field(default=None, ge=0)
    """The attempt's device-memory peak as the process itself measured it (reserved + context on a GPU)."""
    seconds: float | None = Field(default=None, ge=0)
    steps: int | None = Field(default=None, ge=0)
    limit_bytes: int | None = Field(default=None, ge=0)
    """The MPS memory limit the attempt ran under (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``), when it had one."""
    held_bytes: int | None = Field(default=None, ge=0)
    """For ``memory-exceeded``: what the process held when the request failed."""
    requested_bytes: int | None = Field(default=None, ge=0)
    """For ``memory-exceeded``: the request that failed."""
    source: Literal["worker", "gate"] = "worker"
    message: str | None = Field(default=None, max_length=1024)
    resumed_from_step: int | None = Field(default=None, ge=0)
    """A checkpointing job's attempt (``spec.checkpoint``): the step it resumed from (0: from the beginning)."""
    checkpoint_step: int | None = Field(default=None, ge=0)
    """The last step the attempt's checkpoint holds (absent when it saved none and resumed from none)."""
    lost_seconds: float | None = Field(default=None, ge=0)
    """Seconds of steps since the attempt's last save when it ended: the work a failed attempt lost."""
    checkpoint_saves: int | None = Field(default=None, ge=0)
    checkpoint_seconds: float | None = Field(default=None, ge=0)
    """Seconds the attempt's saves took in all (its steps waited for them)."""
    prestart_fallback: str | None = Field(default=None, max_length=1024)
    """Set when a prestarted worker (``gnnsched gate --prestart``) re-executed itself after its admission and this
    attempt ran as a plain admitted worker: why (``$GNNSCHED_PRESTART_FALLBACK``). Absent otherwise, so readers that
    predate it see the same line as before."""

    def needed_bytes(self) -> int | None:
        """What the attempt showed it needs at least: held + the failed request for an OOM, else its peak."""
        if self.outcome == "memory-exceeded" and self.held_bytes is not None:
            return self.held_bytes + (self.requested_bytes or 0)
        return self.observed_peak_bytes

    def line(self) -> str:
        return json.dumps(self.model_dump(mode="json", exclude_none=True), separators=(",", ":"))


class FaultRecord(BaseModel):
    """What the node agent writes on a pod (annotation ``gnnsched.io/fault``) whose GPU had a fatal MPS fault."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    gpu: str = Field(min_length=1)
    role: Literal["victim", "suspect"]
    reason: str = Field(min_length=1, max_length=256)
    """``GPUFault`` (a hardware fault), ``Xid <n>``, ``MpsClientTerminated``, ``MpsServerFault`` or ``ClientFault``."""
    at: datetime
    xid: int | None = None
    fault_class: Literal["hardware", "application"] | None = None
    """``gnnsched.attempts.fault_classes.fault_class`` of the fault; a record without it (an older agent's) is
    classified from its Xid by :meth:`klass`."""
    peers: list[str] = Field(default_factory=list, max_length=MAX_FAULT_PEERS)
    """An undecided client's peers: the jobs (``<namespace>/<name>``) of the other clients of the same fault whose own
    error was fatal too, any of which may be the culprit (``gnnsched.attempts.fault_classes.undecided_peers``). The
    operator keeps its next attempt apart from them (``gnnsched.io/fault-peers``). Empty for every other record."""

    def klass(self) -> Literal["hardware", "application"]:
        return self.fault_class if self.fault_class is not None else fault_class(self.xid)

    def charge(self) -> Charge:
        """The record as the rule's :class:`~gnnsched.attempts.fault_classes.Charge` (what ``fault_step`` decides
        from)."""
        return Charge(self.role, self.reason, self.role == "suspect", self.klass())


# --------------------------------------------------------------------------------------------------- resize


class ResizePolicy(BaseModel):
    """How much larger the next attempt after a ``memory-exceeded`` reserves.

    The next reservation is the larger of what the attempt showed it needs times ``margin`` and the old reservation
    times ``growth``, capped at the largest GPU's capacity. Growth alone would converge slowly on a large miss;
    the observed need alone could retry at a size that misses again by a little (the failed request is only the
    first one that did not fit)."""

    model_config = ConfigDict(frozen=True)

    margin: float = Field(default=1.2, ge=1.0, le=4.0)
    growth: float = Field(default=1.5, gt=1.0, le=4.0)
    max_resizes: int = Field(default=3, ge=0, le=10)


DEFAULT_RESIZE = ResizePolicy()
MAX_RESIZES_LIMIT = 10
"""The largest ``spec.memory.maxResizes`` a GNNJob may ask for (the CRD's maximum says the same)."""


MEASURED_OVERPREDICTION = 1.29
"""The largest over-prediction of the CUDA estimate measured on a GPU: GCN training on CiteSeer, predicted 1.29x what
it reserved (docs/gpu-measurements.md, section 1). A job whose predicted need exceeds the largest GPU by no more than
this may still fit it, so the operator runs it alone on that GPU, its limit the whole GPU, instead of refusing it
(``operator/planning.py``: ``exclusive``, reason ``PredictedPeakAboveGPU``); if it really needs more, it overruns its
own limit with no neighbour to harm and fails with ``ExceedsLargestGPU`` (:func:`next_reservation` has nothing larger
to give). Beyond it the plan is ``PredictedPeakExceedsGPU`` at once."""


def next_reservation(old_bytes: int, needed_bytes: int | None, largest_gpu_bytes: int,
                     policy: ResizePolicy = DEFAULT_RESIZE) -> int | None:
    """The next attempt's admit bytes, or ``None`` when no GPU in the cluster can hold a larger attempt.

    ``largest_gpu_bytes`` is the capacity a job running alone may use on the largest GPU (total minus the agent's
    reserve). An attempt that already had all of it, or that needs more than all of it, cannot be helped by a resize:
    the job fails with ``ExceedsLargestGPU``."""
    if old_bytes < 0 or largest_gpu_bytes <= 0:
        raise ValueError("old_bytes must be >= 0 and largest_gpu_bytes > 0")
    if old_bytes >= largest_gpu_bytes or (needed_bytes is not None and needed_bytes > largest_gpu_bytes):
        return None
    return min(math.ceil(grown(old_bytes, needed_bytes, policy)), largest_gpu_bytes)


def grown(old: float, needed: float | None, policy: ResizePolicy = DEFAULT_RESIZE) -> float:
    """The resize rule itself, in any unit (bytes, or multiples of the prediction): the larger of ``old`` times
    ``growth`` and ``needed`` times ``margin``. :func:`next_reservation` applies it to an attempt's bytes, the attempt
    that overran; first attempts of other jobs of its class are sized by :func:`padded_quantile`."""
    wanted = old * policy.growth
    if needed is not None:
        wanted = max(wanted, needed * policy.margin)
    return wanted


# --------------------------------------------------------------------------------------------------- calibration


class CalibrationClass(BaseModel):
    """Jobs whose estimates err alike: the same GPU model, architecture, mode and kind of container."""

    model_config = ConfigDict(frozen=True)

    gpu_model: str = Field(min_length=1)
    arch: str = Field(min_length=1)
    mode: str = Field(min_length=1)
    container: ContainerKind = "builtin"

    def key(self) -> str:
        """``V100-32GB.gcn.train.builtin``: a valid ConfigMap/CR map key, readable in ``kubectl get -o yaml``."""
        return ".".join((self.gpu_model, self.arch, self.mode, self.container))

    def pool(self, other: CalibrationClass) -> bool:
        """Whether ``other`` is in this class's pool: the same GPU model, mode and container, any architecture."""
        return (other.gpu_model, other.mode, other.container) == (self.gpu_model, self.mode, self.container)

    def pool_key(self) -> str:
        """``V100-32GB.*.train.builtin``: how the pool is shown (never stored: the table keeps fine classes only)."""
        return ".".join((self.gpu_model, "*", self.mode, self.container))

    @classmethod
    def parse(cls, key: str) -> CalibrationClass:
        parts = key.rsplit(".", 3)
        if len(parts) != 4:
            raise ValueError(f"calibration class {key!r}: expected <gpu-model>.<arch>.<mode>.<builtin|custom>")
        gpu_model, arch, mode, container = parts
        if container not in ("builtin", "custom"):
            raise ValueError(f"calibration class {key!r}: container must be builtin or custom, not {container!r}")
        return cls(gpu_model=gpu_model, arch=arch, mode=mode, container=container)


class CalibrationPolicy(BaseModel):
    """How recorded ratios become a safety factor.

    ``quantile`` of the last ``window`` observed ÷ predicted ratios, once a class has ``min_samples``; never below
    ``floor`` (an estimate is never shrunk below the prediction itself) and never above ``cap`` (one runaway custom
    script must not make a whole class unschedulable: resizes handle outliers).

    A class with fewer than ``min_samples`` ratios borrows its *pool* with ``pooled`` (the default): every class on
    the same GPU model, mode and kind of container, whatever the architecture. Why: the errors the loop corrects
    are mostly the GPU's (unverified CUDA constants, the context, the caching allocator's segments) and the
    container's, which every architecture shares, while a fine class of a mixed queue gets its ``min_samples``
    only after most of its jobs have already started at the static factor (a queue of 20 jobs over 4
    architectures has about 5 per class: calibrated, if ever, for its last job). The class's own ratios take over
    as soon as it has ``min_samples``. Below ``min_samples`` in the pool too, the static factor stays."""

    model_config = ConfigDict(frozen=True)

    quantile: float = Field(default=0.95, gt=0.5, le=1.0)
    window: int = Field(default=50, ge=1, le=10_000)
    min_samples: int = Field(default=5, ge=1, le=10_000)
    floor: float = Field(default=1.0, ge=1.0)
    cap: float = Field(default=2.0, ge=1.0, le=10.0)
    static_factor: float = Field(default=1.09, ge=1.0)
    """The estimator's static CUDA safety factor (``gnnsched.estimator.DEFAULT_SAFETY_FACTOR_CUDA``)."""
    pooled: bool = True
    """A class with too few ratios uses its pool's (same GPU model, mode and container; any architecture)."""


DEFAULT_CALIBRATION = CalibrationPolicy()


class RuntimeCalibrationPolicy(CalibrationPolicy):
    """How observed ÷ predicted *runtime* ratios become a runtime factor: the memory loop's rule (window, pool,
    ``min_samples``, :func:`padded_quantile`) with bounds that suit a correction rather than a safety margin.

    Why the median, and a floor below 1: a runtime factor corrects the prediction in both directions (the prior's
    measured median is 0.82 for SAGE and 1.87 for GAT on CPU, issue 28), and a queue order wants the typical
    runtime, not a bound. With ``static_factor`` 1.0 a class with too few ratios keeps the prediction as it is, and
    :func:`padded_quantile`'s padding is a no-op. ``cap`` and ``floor`` keep one runaway attempt (a job that waited
    on a broken node, or one that failed at once) from moving a class by more than 10x either way."""

    quantile: float = Field(default=0.5, gt=0.0, le=1.0)
    floor: float = Field(default=0.1, gt=0.0, le=1.0)
    cap: float = Field(default=10.0, ge=1.0, le=100.0)
    static_factor: float = Field(default=1.0, gt=0.0)


DEFAULT_RUNTIME_CALIBRATION = RuntimeCalibrationPolicy()


def size_bucket(edges: int) -> int:
    """The runtime class's size: floor(log2(edges)), so jobs within a factor of two of each other's graph share a
    class (a step's time grows with the edges a layer aggregates over)."""
    return max(int(edges), 1).bit_length() - 1


def runtime_class(spec: GNNJobSpec, gpu_model: str, container: ContainerKind) -> CalibrationClass:
    """The runtime calibration class of a job predicted on ``gpu_model``: the memory class's key with the model
    class and the graph's size bucket in its ``arch`` part (``A100-40GB.gcn-e20.train.builtin``), so the same table,
    pool and quantile rule serve it (the pool is every model class and size on that GPU model, mode and container)."""
    try:
        size = f"e{size_bucket(spec.graph.resolve().edges)}"
    except (ValueError, TypeError, KeyError):  # a graph the spec cannot resolve has no size to bucket
        size = "e-"
    return CalibrationClass(gpu_model=gpu_model, arch=f"{spec.model.model_class}-{size}", mode=spec.mode,
                            container=container)


def high_quantile(values: Iterable[float], q: float) -> float:
    """Nearest-rank quantile, rounded up: the conservative choice for a safety factor (it is always an observed
    ratio, never an interpolation below one)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def censored_quantile(exact: Iterable[float], lower: Iterable[float], q: float) -> float | None:
    """The ``q`` quantile of ratios of which some are only known from below, or ``None`` when they do not say.

    ``exact`` are observed ratios of attempts that completed; ``lower`` are lower bounds, from attempts that
    exceeded their memory limit (the ratio is at least what they held when they failed: right-censored). The
    estimate is Kaplan-Meier's product-limit estimate of the distribution: a lower bound takes part in the risk set
    up to its value and then hands its mass to the larger exact ratios, so a lower bound below later exact ratios is
    resolved by them, while one above every exact ratio keeps its mass unplaced. The answer is the smallest exact
    ratio at which the estimated distribution reaches ``q`` (an observed ratio, like :func:`high_quantile`, which it
    equals when there are no lower bounds), ``None`` when the unplaced mass is more than ``1 - q``: the lower bounds
    say that the quantile lies above them, not where. At equal values a lower bound counts as above the exact ratio
    (the attempt held that much and wanted more)."""
    exact_sorted = sorted(exact)
    lows = sorted(lower)
    if not lows:
        return high_quantile(exact_sorted, q)  # raises on no values at all
    survival = 1.0
    i = 0
    j = 0  # lows[:j] are below the current exact value: out of the risk set
    n = len(exact_sorted) + len(lows)
    while i < len(exact_sorted):
        value = exact_sorted[i]
        events = 1
        while i + events < len(exact_sorted) and exact_sorted[i + events] == value:
            events += 1
        while j < len(lows) and lows[j] < value:
            j += 1
        at_risk = n - i - j  # exact ratios from i on, and lower bounds >= value
        survival *= 1.0 - events / at_risk
        i += events
        if 1.0 - survival >= q - 1e-9:
            return value
    return None


def padded_quantile(exact: list[float], lower: list[float], policy: CalibrationPolicy) -> tuple[float, bool, bool]:
    """The ``policy.quantile`` of the samples as a safety factor: ``(value, censored, padded)``.

    Where :func:`censored_quantile` places the quantile at an exact ratio below the largest one, that ratio. Where the
    samples say only that the quantile is *at least* some value X, X times ``policy.static_factor``:

    - ``censored``: lower bounds leave the quantile unknown, above them; X is the largest bound;
    - otherwise the quantile is the largest exact ratio: with fewer than about ``1 / (1 - q)`` exact ratios (20 for
      0.95) a nearest-rank quantile is the sample maximum, and the next attempt exceeds the maximum of ``n`` samples
      with probability about ``1 / (n + 1)``, far above ``1 - q``. X is that maximum.

    Why the static factor: X takes the place of the estimate (ratio 1.0) and gets the margin an estimate gets before
    any sample, so a class whose estimates prove exact keeps the static factor and one whose largest ratio is 1.25
    gets 1.375, until it has enough ratios for the quantile to stand below their maximum. Measured in
    docs/simulator.md (issue 15's figures): the bare maximum let the factor fall to the one ratio seen first, 16 of
    20 CoGNN jobs were resized at one seed; the resize rule's growth on the bounds cost up to 1.28x mean JCT."""
    quantile = censored_quantile(exact, lower, policy.quantile)
    if quantile is None:
        return max(lower) * policy.static_factor, True, True
    if exact and quantile >= max(exact):
        return quantile * policy.static_factor, False, True
    return quantile, False, False


class CalibrationFactor(BaseModel):
    factor: float
    samples: int
    """The class's own recent ratios (the pool's are counted in ``pool_samples``)."""
    calibrated: bool
    """False while neither the class nor its pool has ``min_samples`` ratios and the static factor applies."""
    source: Literal["class", "pool", "prior", "static"] = "static"
    """Whose ratios gave the factor: the class's own, its pool's (too few of its own), the cluster prior (a namespace
    with too few of its own: ``gnnsched.trust.tenant_calibration``), or none (static)."""
    pool_samples: int = 0
    """The pool's recent ratios (every class of the pool, this one included), when the pool was consulted."""
    lower_bounds: int = 0
    """How many of the samples used (the class's or the pool's) are memory-exceeded lower bounds."""
    censored: bool = False
    """True when the samples' lower bounds leave the quantile unknown (above them): the factor is the largest bound
    times the static factor (:func:`padded_quantile`)."""
    padded: bool = False
    """True when the samples say only that the quantile is at least some value (``censored``, or it is the largest
    exact ratio): the factor is that value times the static factor (:func:`padded_quantile`)."""


class CalibrationTable(BaseModel):
    """Recent observed ÷ predicted ratios per calibration class, newest last; the state the operator persists.

    ``ratios`` are exact: attempts that completed, whose observed peak is the peak. ``exceeded`` are lower bounds:
    attempts that failed with memory-exceeded, whose needed bytes (held + the failed request, or the observed peak,
    whichever is larger) only say that the true peak is at least that much. They are kept apart because a lower
    bound taken for an exact ratio biases the factor low: with every first attempt at the static 1.1 overrunning,
    the recorded ratios would all be about 1.1 and the quantile would stay at the factor that failed.

    A plain value: ``record`` returns a new table, so a caller that fails to persist it has not changed anything."""

    model_config = ConfigDict(frozen=True)

    ratios: dict[str, list[float]] = Field(default_factory=dict)
    exceeded: dict[str, list[float]] = Field(default_factory=dict)

    @field_validator("ratios", "exceeded")
    @classmethod
    def _valid(cls, value: dict[str, list[float]]) -> dict[str, list[float]]:
        for key, ratios in value.items():
            CalibrationClass.parse(key)
            for ratio in ratios:
                if not (math.isfinite(ratio) and ratio > 0):
                    raise ValueError(f"{key}: {ratio!r} is not a positive finite ratio")
        return value

    def classes(self) -> list[str]:
        """Every class key with a sample of either kind, sorted."""
        return sorted(set(self.ratios) | set(self.exceeded))

    def record(self, cls: CalibrationClass, ratio: float, policy: CalibrationPolicy = DEFAULT_CALIBRATION,
               exceeded: bool = False) -> CalibrationTable:
        """A new table with one more sample of ``cls``: an exact ratio, or with ``exceeded`` a memory-exceeded
        attempt's lower bound. Each kind keeps its newest ``policy.window``."""
        if not (math.isfinite(ratio) and ratio > 0):
            raise ValueError(f"ratio {ratio!r} is not a positive finite number")
        key = cls.key()
        held = self.exceeded if exceeded else self.ratios
        kept = [*held.get(key, []), round(ratio, 4)][-policy.window:]
        if exceeded:
            return CalibrationTable(ratios=self.ratios, exceeded={**self.exceeded, key: kept})
        return CalibrationTable(ratios={**self.ratios, key: kept}, exceeded=self.exceeded)

    def _samples(self, keys: Iterable[str], policy: CalibrationPolicy) -> tuple[list[float], list[float]]:
        exact = [r for key in keys for r in self.ratios.get(key, [])[-policy.window:]]
        lower = [r for key in keys for r in self.exceeded.get(key, [])[-policy.window:]]
        return exact, lower

    def factor(self, cls: CalibrationClass, policy: CalibrationPolicy = DEFAULT_CALIBRATION) -> CalibrationFactor:
        """The safety factor for a new attempt of ``cls``. The one rule the operator's planner and the simulator
        both apply.

        Samples: the class's own once it has ``min_samples`` (exact ratios and lower bounds together), else its
        pool's (``CalibrationPolicy.pooled``) once the pool has them, else none: the static factor. From the samples,
        :func:`censored_quantile`'s ``quantile``, through :func:`padded_quantile`: where the samples say only that
        the quantile is at least some value (lower bounds above every exact ratio, or too few exact ratios to place
        it below their largest), the factor is that value times the static factor. That holds below
        ``min_samples`` too for lower bounds (an overrun is evidence on its own; an exact ratio alone is not).
        Then ``floor`` and ``cap``."""
        own = [cls.key()]
        pool = [key for key in self.classes() if cls.pool(CalibrationClass.parse(key))] if policy.pooled else own
        own_exact, own_lower = self._samples(own, policy)
        samples = len(own_exact) + len(own_lower)
        if samples >= policy.min_samples:
            return self._from(own_exact, own_lower, "class", samples, 0, policy)
        pool_exact, pool_lower = self._samples(pool, policy)
        pool_samples = len(pool_exact) + len(pool_lower) if policy.pooled else 0
        if policy.pooled and pool_samples >= policy.min_samples:
            return self._from(pool_exact, pool_lower, "pool", samples, pool_samples, policy)
        # Too few samples for a quantile; lower bounds that no exact ratio resolves still raise the factor.
        exact, lower = (pool_exact, pool_lower) if policy.pooled else (own_exact, own_lower)
        if lower and censored_quantile(exact, lower, policy.quantile) is None:
            bound = self._bounded(max(lower) * policy.static_factor, policy)
            return CalibrationFactor(factor=max(bound, policy.static_factor), samples=samples, calibrated=True,
                                     source="pool" if policy.pooled else "class", pool_samples=pool_samples,
                                     lower_bounds=len(lower), censored=True, padded=True)
        return CalibrationFactor(factor=policy.static_factor, samples=samples, calibrated=False,
                                 pool_samples=pool_samples, lower_bounds=len(lower))

    def _from(self, exact: list[float], lower: list[float], source: Literal["class", "pool"], samples: int,
              pool_samples: int, policy: CalibrationPolicy) -> CalibrationFactor:
        value, censored, padded = padded_quantile(exact, lower, policy)
        return CalibrationFactor(factor=self._bounded(value, policy), samples=samples, calibrated=True,
                                 source=source, pool_samples=pool_samples, lower_bounds=len(lower),
                                 censored=censored, padded=padded)

    @staticmethod
    def _bounded(value: float, policy: CalibrationPolicy) -> float:
        return round(min(policy.cap, max(policy.floor, value)), 4)


def _holds_samples(value: Any) -> bool:
    """Whether ``value`` is a table: exact ratios, memory-exceeded lower bounds, or both (a class whose attempts all
    overran has only the latter)."""
    return isinstance(value, dict) and ("ratios" in value or "exceeded" in value)


def load_calibration_file(path: str | Path) -> CalibrationTable:
    """A calibration table from a JSON or YAML file: the table itself (``{"ratios": {...}, "exceeded": {...}}``), or
    a Kubernetes object holding it under ``status`` or ``data`` (what ``kubectl get -o yaml`` prints). Errors name the
    file."""
    where = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise FieldError("--calibration", f"cannot read {where}: {exc.strerror or exc}") from None
    try:
        doc: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise FieldError("--calibration", f"{where} is not JSON or YAML: {str(exc).splitlines()[0]}") from None
    if isinstance(doc, dict) and not _holds_samples(doc):
        for holder in ("status", "data"):
            inner = doc.get(holder)
            if _holds_samples(inner):
                doc = inner
                break
    if not isinstance(doc, dict) or not _holds_samples(doc):
        raise FieldError("--calibration", f"{where}: expected a mapping with a 'ratios' or 'exceeded' key")
    samples: dict[str, Any] = {}
    for name in ("ratios", "exceeded"):
        value = doc.get(name) or {}
        if isinstance(value, str):  # a ConfigMap's data values are strings
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise FieldError("--calibration", f"{where}: {name} is not JSON: {exc.msg}") from None
        samples[name] = value
    try:
        return CalibrationTable(**samples)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise FieldError("--calibration", f"{where}: {loc}: {first['msg']}") from None
