"""The cluster's calibration object: observed ÷ predicted peak ratios per calibration class, kept in a
``GNNCalibration``.

Why a custom resource and not a ConfigMap: a ConfigMap's ``data`` holds strings only, so the ratios would be a JSON
string nobody can read in ``kubectl get``, no schema would check what an SRE edits by hand, and the factors could not
be printer columns. ``GNNCalibration`` (cluster-scoped, ``crds/gnncalibration.yaml``) has a structural schema for the
ratio lists, and ``kubectl get gnncalibrations`` shows the classes, the samples and each class's factor. One object,
named ``default``; the operator creates it on the first finished attempt.

Why it survives restarts: it lives in the API server, and the operator derives everything from it (no in-memory
copy is authoritative). Each ratio is recorded with its pod's uid in ``status.recorded`` (the last
``RECORDED_KEEP``), so an operator that restarts between recording a ratio and updating the job does not count the
attempt twice. Writes are merge patches conditional on ``metadata.resourceVersion`` (409 -> read again and retry),
so two recorders never lose each other's samples.

Reset: delete the object (``kubectl delete gnncalibration default``; every class falls back to the static factor
until it or its pool has ``min_samples`` again), or drop one class with a merge patch setting
``status.ratios.<class>`` and ``status.exceeded.<class>`` (its memory-exceeded lower bounds) to null.
The factors and the summary are recomputed from the ratios on every read, so a hand edit cannot leave them stale.

Per namespace (issue 39): every sample is also kept in ``status.namespaces.<namespace>`` (``ratios``, ``exceeded``,
``runtimeRatios``), and a job is planned with its own namespace's table and a bounded cluster prior
(:mod:`gnnsched.trust.tenant_calibration`): no namespace moves another's factor by more than 5 %. The top-level maps
stay the whole cluster's record (what ``kubectl get`` summarises); planning reads them no more. Reset a namespace
with a merge patch setting ``status.namespaces.<namespace>`` to null.

Runtime (issue 28): ``status.runtimeRatios`` holds observed ÷ predicted *runtime* ratios per runtime class
(``gnnsched.closed_loop.runtime_class``: GPU model, model class and size bucket, mode, container), kept and read by
the same table and quantile rule under ``RuntimeCalibrationPolicy`` (the median); ``status.runtimeFactors`` and
``status.runtimeSummary`` are derived from them as ``factors`` and ``summary`` are from ``ratios``. Reset a runtime
class with a merge patch setting ``status.runtimeRatios.<class>`` to null.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gnnsched.closed_loop import (
    DEFAULT_CALIBRATION,
    DEFAULT_RUNTIME_CALIBRATION,
    CalibrationClass,
    CalibrationPolicy,
    CalibrationTable,
)
from gnnsched.contract import API_VERSION, GNNCALIBRATION_KIND, GNNCALIBRATION_NAME
from gnnsched.trust.tenant_calibration import tenant_table

from .kube import Kube, KubeError
from .metrics import OperatorMetrics
from .planning import SHIPPED_MODEL
from .status import now_rfc3339

log = logging.getLogger("gnnsched.operator.calibration")

RECORDED_KEEP = 1000
"""How many recorded attempt keys the object remembers for de-duplication (far more than can be in flight)."""
WRITE_TRIES = 5
RUNTIME_REPLAN_TOLERANCE = 0.05
"""A runtime factor's move that re-plans the waiting pods at once. Why a tolerance, where memory has none: a median
moves with nearly every sample once a class is calibrated, and each re-plan lists the operator's pods; a move
under 5 % changes no PriorityClass bucket (a factor sqrt(2) each) and barely the gate's order, and the resync timer
brings each waiting pod up to the exact factor anyway."""


def _planning_factors(table: CalibrationTable, keys: list[str],
                      policy: CalibrationPolicy) -> dict[str, tuple[float, bool]]:
    """The factor (and whether it is calibrated) that planning would use for each class in ``keys`` and for an unseen
    architecture in each of their pools (a class without samples borrows its pool's factor)."""
    out: dict[str, tuple[float, bool]] = {}
    for key in keys:
        cls = CalibrationClass.parse(key)
        for c in (cls, cls.model_copy(update={"arch": "*"})):
            result = table.factor(c, policy)
            out[c.key()] = (result.factor, result.calibrated)
    return out


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _replacing(stored: Any, new: dict[str, Any]) -> dict[str, Any]:
    """``new`` as a merge patch of the map ``stored``: its keys that ``new`` lacks set to null (removed)."""
    gone = {key: None for key in stored} if isinstance(stored, dict) else {}
    return {**gone, **new}


def _moved(old: dict[str, tuple[float, bool]], new: dict[str, tuple[float, bool]], tolerance: float) -> bool:
    """Whether any class became (un)calibrated or its factor moved by more than ``tolerance`` (relative)."""
    for key, (factor, calibrated) in new.items():
        before = old.get(key)
        if before is None or before[1] != calibrated or abs(factor - before[0]) > tolerance * before[0]:
            return True
    return False


def derived_fields(table: CalibrationTable, policy: CalibrationPolicy = DEFAULT_CALIBRATION) -> dict[str, Any]:
    """``factors``, ``classes``, ``calibratedClasses`` and ``summary``: what ``kubectl get`` shows, from the ratios."""
    factors: dict[str, Any] = {}
    parts: list[str] = []
    for key in table.classes():
        result = table.factor(CalibrationClass.parse(key), policy)
        factors[key] = {"factor": result.factor, "samples": result.samples, "calibrated": result.calibrated,
                        "source": result.source, "lowerBounds": result.lower_bounds, "censored": result.censored,
                        "padded": result.padded}
        note = {"class": "", "pool": f" (pool, {result.samples} own samples)",
                "prior": f" (cluster prior, {result.samples} own samples)",
                "static": f" (static, {result.samples} samples)"}[result.source]
        if result.censored:
            note += " (above a lower bound)"
        elif result.padded:
            note += " (above the largest sample)"
        parts.append(f"{key}={result.factor:g}{note}")
    return {
        "factors": factors,
        "classes": len(factors),
        "calibratedClasses": sum(1 for f in factors.values() if f["calibrated"]),
        "summary": "; ".join(parts) if parts else "no samples",
    }


class CalibrationSample(BaseModel):
    """One ratio to record (``CalibrationStore.record_all``)."""

    model_config = ConfigDict(frozen=True)

    cls: CalibrationClass
    ratio: float = Field(gt=0)
    attempt_key: str
    exceeded: bool = False
    runtime: bool = False
    model: str = SHIPPED_MODEL  # a runtime sample: the runtime model that predicted it (Plan.runtime_model)
    namespace: str | None = None  # the job's namespace: its own table (None: the cluster's record only)


class CalibrationStore:
    """Reads and extends the cluster's calibration table through the API; thread-safe (kopf's handler threads)."""

    def __init__(self, kube: Kube, metrics: OperatorMetrics,
                 policy: Callable[[], CalibrationPolicy] = lambda: DEFAULT_CALIBRATION,
                 name: str = GNNCALIBRATION_NAME,
                 runtime_policy: Callable[[], CalibrationPolicy] = lambda: DEFAULT_RUNTIME_CALIBRATION,
                 runtime_model: Callable[[], str] = lambda: SHIPPED_MODEL) -> None:
        self.kube = kube
        self.metrics = metrics
        self._policy = policy  # read at each use: the planner that applies the factors owns the policy
        self._runtime_policy = runtime_policy
        self._runtime_model = runtime_model  # the runtime model in use (Planner.predictor_id)
        self._published_runtime: set[str] = set()  # runtime classes with a gauge now
        self._lock_published = threading.Lock()
        self.name = name
        self._lock = threading.Lock()

    def _parse(self, obj: dict[str, Any] | None) -> tuple[CalibrationTable, CalibrationTable, list[str]]:
        """(memory table, runtime table, recorded attempt keys)."""
        status = obj.get("status") if isinstance(obj, dict) else None
        if not isinstance(status, dict):
            return CalibrationTable(), CalibrationTable(), []
        ratios, exceeded, runtime = ({k: v for k, v in (status.get(name) or {}).items() if v is not None}
                                     if isinstance(status.get(name), dict) else {}
                                     for name in ("ratios", "exceeded", "runtimeRatios"))
        if (status.get("runtimeModel") or SHIPPED_MODEL) != self._runtime_model():
            runtime = {}  # measured against another runtime model: they would correct what the model in use fixed
        try:
            table = CalibrationTable(ratios=ratios, exceeded=exceeded)
            runtime_table = CalibrationTable(ratios=runtime)
        except ValidationError as exc:
            # A hand edit that broke the object must not stop jobs: the static factor applies until it is fixed.
            log.warning("GNNCalibration %s is malformed (%s); using the static factor", self.name,
                        exc.errors()[0].get("msg"))
            return CalibrationTable(), CalibrationTable(), []
        recorded = [str(k) for k in status.get("recorded") or [] if isinstance(k, str)]
        return table, runtime_table, recorded

    def _namespaces(self, obj: dict[str, Any] | None) -> dict[str, tuple[CalibrationTable, CalibrationTable]]:
        """Each namespace's own (memory, runtime) tables from ``status.namespaces``; a malformed one is left out
        (its jobs get the cluster prior or the static factor until it is fixed or reset)."""
        status = obj.get("status") if isinstance(obj, dict) else None
        raw = status.get("namespaces") if isinstance(status, dict) else None
        same_model = isinstance(status, dict) and (status.get("runtimeModel") or SHIPPED_MODEL) == self._runtime_model()
        out: dict[str, tuple[CalibrationTable, CalibrationTable]] = {}
        for ns, entry in (raw.items() if isinstance(raw, dict) else ()):
            if not isinstance(entry, dict):
                continue
            ratios, exceeded, runtime = ({k: v for k, v in (entry.get(name) or {}).items() if v is not None}
                                         if isinstance(entry.get(name), dict) else {}
                                         for name in ("ratios", "exceeded", "runtimeRatios"))
            try:
                out[str(ns)] = (CalibrationTable(ratios=ratios, exceeded=exceeded),
                                CalibrationTable(ratios=runtime if same_model else {}))
            except ValidationError as exc:
                log.warning("GNNCalibration %s: namespace %s is malformed (%s); left out", self.name, ns,
                            exc.errors()[0].get("msg"))
        return out

    @property
    def policy(self) -> CalibrationPolicy:
        return self._policy()

    @property
    def runtime_policy(self) -> CalibrationPolicy:
        return self._runtime_policy()

    def _publish(self, table: CalibrationTable, runtime: CalibrationTable) -> None:
        for key in table.classes():
            self.metrics.calibration_factor.labels(key).set(
                table.factor(CalibrationClass.parse(key), self.policy).factor
            )
        factors = {key: runtime.factor(CalibrationClass.parse(key), self.runtime_policy).factor
                   for key in runtime.classes()}
        with self._lock_published:
            if set(factors) != self._published_runtime:
                self.metrics.runtime_factor.clear()  # classes of a runtime model no longer in use go away
                self._published_runtime = set(factors)
            for key, factor in factors.items():
                self.metrics.runtime_factor.labels(key).set(factor)

    def table(self) -> CalibrationTable:
        """The current memory table (empty when the object does not exist or cannot be read as one)."""
        return self.tables()[0]

    def tables(self, namespace: str | None = None) -> tuple[CalibrationTable, CalibrationTable]:
        """The current memory and runtime tables, from one read: with ``namespace``, the ones a job of that namespace
        is planned with (its own samples and the bounded cluster prior, ``gnnsched.trust.tenant_calibration``);
        without, the whole cluster's record."""
        obj = self.kube.read_calibration(self.name)
        table, runtime, _ = self._parse(obj)
        self._publish(table, runtime)
        if namespace is None:
            return table, runtime
        spaces = self._namespaces(obj)
        return (tenant_table({ns: t[0] for ns, t in spaces.items()}, namespace),
                tenant_table({ns: t[1] for ns, t in spaces.items()}, namespace))

    def record(self, cls: CalibrationClass, ratio: float, attempt_key: str, exceeded: bool = False,
               runtime: bool = False) -> bool:
        """Add one finished attempt's ratio (``record_all`` with one sample); whether its kind's factors changed."""
        return bool(self.record_all([CalibrationSample(cls=cls, ratio=ratio, attempt_key=attempt_key,
                                                       exceeded=exceeded, runtime=runtime)]))

    def record_all(self, samples: list[CalibrationSample]) -> set[str]:
        """Add a finished attempt's ratios in one conditional write: its peak (``exceeded``: a memory-exceeded
        attempt's lower bound, kept apart in ``status.exceeded``) and its runtime (``runtime``: an observed ÷
        predicted runtime ratio of a runtime class, in ``status.runtimeRatios``, its ``attempt_key`` distinct from
        the memory sample's). Why one write: each write of the object is a read, a patch and, under contention, a
        409 and another round, so a succeeded job with a peak and a runtime costs one round, not two.

        Returns the kinds (``"memory"``, ``"runtime"``) of which some class's factor changed; a sample recorded
        before (a restart re-ran it) is skipped. Why the caller needs it: a change re-plans every pod still waiting
        for a node, which lists the operator's pods; a sample that moves no factor (most of them, once a class is
        calibrated) must not cost a list per finished job.

        Raises ``KubeError`` when the API server keeps refusing (the caller retries on its next sync)."""
        if not samples:
            return set()
        with self._lock:
            for _ in range(WRITE_TRIES):
                obj = self.kube.read_calibration(self.name)
                old_memory, old_times, recorded = self._parse(obj)
                old_spaces = self._namespaces(obj)
                model = self._runtime_model()
                # a runtime ratio taken against a model no longer in use is dropped (it was predicted by another)
                fresh = [s for s in samples if s.attempt_key not in recorded and (not s.runtime or s.model == model)]
                if not fresh:
                    return set()
                memory, times = old_memory, old_times
                spaces = dict(old_spaces)
                for sample in fresh:
                    ns = sample.namespace
                    own_memory, own_times = spaces.get(ns, (CalibrationTable(), CalibrationTable())) \
                        if ns is not None else (CalibrationTable(), CalibrationTable())
                    if sample.runtime:
                        times = times.record(sample.cls, sample.ratio, self.runtime_policy)
                        own_times = own_times.record(sample.cls, sample.ratio, self.runtime_policy)
                    else:
                        memory = memory.record(sample.cls, sample.ratio, self.policy, exceeded=sample.exceeded)
                        own_memory = own_memory.record(sample.cls, sample.ratio, self.policy,
                                                       exceeded=sample.exceeded)
                    if ns is not None:
                        spaces[ns] = (own_memory, own_times)
                recorded = [*recorded, *(s.attempt_key for s in fresh)][-RECORDED_KEEP:]
                derived_times = derived_fields(times, self.runtime_policy)
                raw_status = obj.get("status") if isinstance(obj, dict) else None
                stored: dict[str, Any] = raw_status if isinstance(raw_status, dict) else {}
                status = {"ratios": memory.ratios, "exceeded": memory.exceeded, "recorded": recorded,
                          "updatedAt": now_rfc3339(), **derived_fields(memory, self.policy),
                          # a merge patch keeps keys it does not name: a class of another model's ratios is nulled
                          "runtimeRatios": _replacing(stored.get("runtimeRatios"), times.ratios),
                          "runtimeFactors": _replacing(stored.get("runtimeFactors"), derived_times["factors"]),
                          "runtimeSummary": derived_times["summary"], "runtimeModel": model}
                if spaces:
                    status["namespaces"] = {ns: {"ratios": m.ratios, "exceeded": m.exceeded,
                                                 "runtimeRatios": _replacing(
                                                     _dict(_dict(_dict(stored.get("namespaces")).get(ns))
                                                           .get("runtimeRatios")), t.ratios)}
                                            for ns, (m, t) in spaces.items() if ns in {s.namespace for s in fresh}}
                try:
                    if obj is None:
                        self.kube.create_calibration({
                            "apiVersion": API_VERSION, "kind": GNNCALIBRATION_KIND,
                            "metadata": {"name": self.name}, "status": status,
                        })
                    else:
                        version = (obj.get("metadata") or {}).get("resourceVersion")
                        patch: dict[str, Any] = {"status": status}
                        if version:
                            patch["metadata"] = {"resourceVersion": version}
                        self.kube.patch_calibration(self.name, patch)
                except KubeError as exc:
                    if exc.status == 409:
                        continue  # someone wrote in between (or created it first): read again
                    raise
                self._publish(memory, times)
                for sample in fresh:
                    if not sample.runtime:
                        self.metrics.calibration_samples.labels(sample.cls.key()).inc()
                changed = set()
                views = [(old_memory, memory, old_times, times)] + [
                    (tenant_table({n: t[0] for n, t in old_spaces.items()}, ns),
                     tenant_table({n: t[0] for n, t in spaces.items()}, ns),
                     tenant_table({n: t[1] for n, t in old_spaces.items()}, ns),
                     tenant_table({n: t[1] for n, t in spaces.items()}, ns)) for ns in spaces]
                for old_m, new_m, old_t, new_t in views:  # the cluster's, and each namespace's as it plans
                    for kind, old, new, policy, tolerance in (
                            ("memory", old_m, new_m, self.policy, 0.0),
                            ("runtime", old_t, new_t, self.runtime_policy, RUNTIME_REPLAN_TOLERANCE)):
                        keys = memory.classes() if kind == "memory" else times.classes()
                        if _moved(_planning_factors(old, keys, policy), _planning_factors(new, keys, policy),
                                  tolerance):
                            changed.add(kind)
                return changed
        raise KubeError(409, f"GNNCalibration {self.name}: still conflicting after {WRITE_TRIES} tries")
