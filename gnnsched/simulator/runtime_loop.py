"""The runtime loop in the simulator: what the cluster learns about runtimes while it runs, replayed.

``--runtime-error`` gives the schedulers the prior's predictions while the engine runs the truth; without this module
nothing ever corrects them, so the simulator measured an *open* loop that the cluster no longer runs. Two policy
suffixes (:mod:`gnnsched.simulator.policyspec`) turn on what the operator and the node agent do:

* ``+rtcal``, the operator's runtime calibration (issue 28 item 3): when an attempt of a GNN job completes, its
  observed runtime ÷ its bare prediction is recorded in its class (:func:`gnnsched.closed_loop.runtime_class`) of a
  :class:`~gnnsched.closed_loop.CalibrationTable`, and every new attempt's predicted runtime is the prediction times
  the class's factor (``CalibrationTable.factor`` under :data:`~gnnsched.closed_loop.DEFAULT_RUNTIME_CALIBRATION`):
  the operator's own functions, not a copy. When a factor changes, the pods still waiting for the scheduler are
  re-planned (their predicted-runtime annotation; a pod's priority class is immutable and keeps its bucket), as
  :meth:`gnnsched.simulator.engine.Simulation._replan_runtime` does.
* ``+progress``, the worker's step reports (item 4): a running job's seconds left, wherever the gate and the
  extender read them, are :func:`gnnsched.progress.seconds_left` of its last report, which the worker sends at most
  every :data:`~gnnsched.progress.REPORT_INTERVAL_S`. Its observed runtime then counts from its first step (the
  agent's ``started-at``, set from the first report), not from its admission.

The observed runtime is what the operator sees: wall time on the GPU, neighbours' slowdown included, so a class's
factor learns the typical shared-mode runtime, as in the cluster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from gnnsched.closed_loop import (
    DEFAULT_RUNTIME_CALIBRATION,
    CalibrationClass,
    CalibrationTable,
    RuntimeCalibrationPolicy,
    runtime_class,
)
from gnnsched.progress import REPORT_INTERVAL_S, StepProgress
from gnnsched.simulator.model import SimJob


@dataclass
class RuntimeLoop:
    """One run's runtime books: the calibration table, each job's bare predictions and class, and the figures."""

    calibrate: bool
    progress: bool
    policy: RuntimeCalibrationPolicy = DEFAULT_RUNTIME_CALIBRATION
    report_interval_s: float = REPORT_INTERVAL_S
    table: CalibrationTable = field(default_factory=CalibrationTable)
    bare: dict[int, dict[str, float]] = field(default_factory=dict)  # job id -> GPU model -> the prior's prediction
    classes: dict[tuple[int, str], CalibrationClass | None] = field(default_factory=dict)
    factors: dict[str, float] = field(default_factory=dict)  # class key -> factor under the current table
    changed: bool = False  # a factor moved since the last re-plan of the waiting pods
    samples: int = 0
    replans: int = 0

    def _class(self, job: SimJob, model: str) -> CalibrationClass | None:
        """The job's runtime class on ``model``; None for a trace pod (no spec: the operator plans GNNJobs only)."""
        key = (job.id, model)
        if key not in self.classes:
            self.classes[key] = None if job.spec is None else runtime_class(job.spec, model, "builtin")
        return self.classes[key]

    def factor(self, job: SimJob, model: str) -> float:
        """The class's runtime factor now (1.0 while uncalibrated, for a trace pod, and without ``+rtcal``)."""
        cls = self._class(job, model) if self.calibrate else None
        return 1.0 if cls is None else self.factor_of(cls.key())

    def attempt(self, job: SimJob) -> SimJob:
        """The job's next attempt as the operator plans it now: every GPU model's predicted runtime is the bare
        prediction times its class's factor. The truth (``solo_s``) is untouched."""
        bare = self.bare.setdefault(job.id, {m: p.predicted_s for m, p in job.profiles.items()})
        if not self.calibrate:
            return job
        profiles = {}
        for model, prof in job.profiles.items():
            predicted = bare[model] * self.factor(job, model)
            profiles[model] = prof if predicted == prof.predicted_s else replace(prof, predicted_s=predicted)
        return replace(job, profiles=profiles)

    def completed(self, job: SimJob, model: str, observed_s: float, scale: float = 1.0) -> None:
        """A completed attempt ran ``observed_s`` on ``model``: record observed ÷ bare prediction (``scale``: the
        scaled job's runtime factor, as the operator predicts the scaled job) in its class. Marks ``changed`` when a
        factor moved."""
        if not self.calibrate:
            return
        cls = self._class(job, model)
        bare = self.bare.get(job.id, {}).get(model)
        if cls is None or bare is None or not bare > 0 or not observed_s > 0 or not math.isfinite(observed_s):
            return
        self.table = self.table.record(cls, observed_s / (bare * scale), self.policy)
        self.samples += 1
        before = self.factors
        self.factors = {}
        # every class asked for so far (each waiting attempt's among them): did its factor, or its pool's, move?
        if any(self.factor_of(key) != value for key, value in before.items()):
            self.changed = True

    def factor_of(self, key: str) -> float:
        """The factor of a class key under the current table (cached until the next record)."""
        value = self.factors.get(key)
        if value is None:
            value = self.factors[key] = self.table.factor(CalibrationClass.parse(key), self.policy).factor
        return value

    def report(self, last: StepProgress | None, steps: int, total: int, seconds: float, now: float
               ) -> StepProgress | None:
        """The progress the agent holds at ``now`` for a job whose worker has done ``steps`` of ``total`` in
        ``seconds`` of step time: a fresh report when the last one is older than the report interval, else the last
        one (the worker reports at a bounded rate). None before the first step or without ``+progress``."""
        if not self.progress or total <= 0 or seconds <= 0:
            return last
        if last is not None and now - last.at < self.report_interval_s:
            return last
        return StepProgress(steps=max(0, min(steps, total)), total=total, seconds=seconds, at=now)

    def summary(self) -> dict:
        """The loop's figures for the run's ``extra`` (``metrics.summarise`` reports the counts; the factors, per
        calibrated class, stay in ``RunResult.extra``)."""
        calibrated = {key: self.factor_of(key) for key in sorted(self.table.ratios)}
        return {"runtime_samples": self.samples, "runtime_replans": self.replans,
                "runtime_factors": {k: v for k, v in calibrated.items() if v != 1.0},
                "runtime_ratios": {k: list(v) for k, v in sorted(self.table.ratios.items())}}
