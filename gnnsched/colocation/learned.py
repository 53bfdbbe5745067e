"""Co-location slowdowns learned while the cluster runs, with the measured model as the prior.

Why: the interference model (:mod:`gnnsched.colocation.measured`) was fitted on six pairs of one GPU, time-sliced;
a cluster runs other jobs, under MPS, on other GPUs. Progress reports already give each running pod's seconds per
step, and the node agent knows when a pod ran alone and when beside whom. The observed slowdown of a pod in a group
(:func:`observed_slowdown`: its step time there over its step time alone, or over its calibrated solo prediction when
it never ran alone) is recorded, as observed ÷ prior, in a calibration class per GPU model and class pair
(:func:`pair_class`), in the same :class:`~gnnsched.closed_loop.CalibrationTable` with the same robust quantile
(:func:`~gnnsched.closed_loop.padded_quantile` under :data:`SLOWDOWN_CALIBRATION`, the runtime loop's median rule) as
the operator's memory and runtime calibration. The learned slowdown of a class beside its co-runners is the prior
times the class pair's factor, never below 1 (:meth:`SlowdownBook.slowdown`). The gate's share rule reads it
through :meth:`SlowdownBook.slowdown_fn`; the simulator replays the learning with the same functions
(``gnnsched.simulator.coloc_loop``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from pydantic import BaseModel, ConfigDict, Field

from gnnsched.closed_loop import CalibrationClass, CalibrationTable, RuntimeCalibrationPolicy
from gnnsched.colocation.interference import SlowdownModel
from gnnsched.contract import MAX_LEARNED_SLOWDOWNS, LearnedSlowdown
from gnnsched.progress import StepProgress

#: The runtime loop's rule (median, window 50, factor within [0.1, 10]) without the pool: a class pair's slowdown is
#: its own (pooling every pair of a GPU model would let a cheap pair hide a costly one), taken once 3 samples agree.
SLOWDOWN_CALIBRATION = RuntimeCalibrationPolicy(pooled=False, min_samples=3)

MODE = "coloc"  # the CalibrationClass mode of slowdown classes: never pooled with a runtime or memory class

#: ``(intensity, (memory, compute, unknown) co-runner counts) -> slowdown``: how the gate's share rule asks.
SlowdownFn = Callable[[str | None, tuple[int, int, int]], float]

_CLASSES = ("memory", "compute")


def _name(cls: str | None) -> str:
    return cls if cls else "none"


def pair_class(gpu_model: str, cls: str | None, others: Iterable[str | None]) -> CalibrationClass:
    """The calibration class of ``cls`` running beside ``others`` on ``gpu_model``:
    ``V100-32GB.memory+compute.coloc.builtin`` (the co-runners sorted, so the order they arrived in does not split
    a class)."""
    mates = "+".join(sorted(_name(o) for o in others)) or "alone"
    return CalibrationClass(gpu_model=gpu_model, arch=f"{_name(cls)}@{mates}", mode=MODE, container="builtin")


def observed_slowdown(step_s_in_group: float, step_s_alone: float | None, predicted_step_s: float | None
                      ) -> float | None:
    """A pod's observed slowdown in a group: its seconds per step there over its seconds per step alone, where it
    has run alone; else over its calibrated solo prediction. None when neither is usable. Not clipped at 1: a
    ratio below 1 is a misprediction the median absorbs, not a speed-up to hide."""
    base = step_s_alone if step_s_alone is not None and step_s_alone > 0 else predicted_step_s
    if base is None or not base > 0 or not step_s_in_group > 0 or not math.isfinite(step_s_in_group):
        return None
    return step_s_in_group / base


class SlowdownBook(BaseModel):
    """The learned slowdowns of one cluster (or simulated run): observed ÷ prior per class pair. A plain value:
    ``record`` returns a new book."""

    model_config = ConfigDict(frozen=True)

    table: CalibrationTable = Field(default_factory=CalibrationTable)

    def record(self, gpu_model: str, cls: str | None, others: Iterable[str | None], observed: float, prior: float
               ) -> SlowdownBook:
        """One observation of ``cls`` beside ``others``: ``observed`` slowdown against the model's ``prior``."""
        if not (math.isfinite(observed) and observed > 0 and math.isfinite(prior) and prior > 0):
            raise ValueError(f"slowdown sample: observed {observed!r} and prior {prior!r} must be positive")
        cls_key = pair_class(gpu_model, cls, others)
        return SlowdownBook(table=self.table.record(cls_key, observed / prior, SLOWDOWN_CALIBRATION))

    def factor(self, gpu_model: str, cls: str | None, others: Iterable[str | None]) -> float:
        """The class pair's observed ÷ prior factor (1.0 until it has :data:`SLOWDOWN_CALIBRATION`'s samples)."""
        return self.table.factor(pair_class(gpu_model, cls, others), SLOWDOWN_CALIBRATION).factor

    def slowdown(self, gpu_model: str, cls: str | None, others: list[str | None], prior: float) -> float:
        """The learned slowdown: ``prior`` times the pair's factor, at least 1 (1 with no co-runner)."""
        if not others:
            return 1.0
        return max(1.0, prior * self.factor(gpu_model, cls, others))

    def entries(self, model: SlowdownModel) -> list[LearnedSlowdown]:
        """Every class pair the book has samples of, as the GPUNode status shows it: the learned slowdown, the
        model's prior and how many samples, the most observed first (at most ``MAX_LEARNED_SLOWDOWNS``)."""
        out = []
        for key in self.table.classes():
            c = CalibrationClass.parse(key)
            cls, _, mates = c.arch.partition("@")
            others = [None if m == "none" else m for m in mates.split("+")] if mates != "alone" else []
            if not others:
                continue  # a pace alone is a baseline, not a slowdown
            me = None if cls == "none" else cls
            prior = model.slowdown(model.profile_for(me), [model.profile_for(o) for o in others])
            fit = self.table.factor(c, SLOWDOWN_CALIBRATION)
            out.append(LearnedSlowdown(gpu_model=c.gpu_model, job_class=cls, beside=mates.split("+"),
                                       slowdown=round(self.slowdown(c.gpu_model, me, others, prior), 4),
                                       prior=round(prior, 4), samples=fit.samples, calibrated=fit.calibrated))
        out.sort(key=lambda e: -e.samples)
        return out[:MAX_LEARNED_SLOWDOWNS]

    def learned(self, model: SlowdownModel) -> dict[str, float]:
        """Every class pair's learned slowdown by calibration key, for the metrics."""
        return {pair_class(e.gpu_model, e.job_class, e.beside).key(): e.slowdown for e in self.entries(model)}

    def slowdown_fn(self, gpu_model: str, model: SlowdownModel) -> SlowdownFn:
        """What the share rule calls (:func:`gnnsched.policies.share_pays`'s ``slowdown``): the learned slowdown of
        an intensity class beside co-runner counts, on ``gpu_model``."""

        def fn(intensity: str | None, counts: tuple[int, int, int]) -> float:
            others = [k for k, n in zip((*_CLASSES, None), counts, strict=True) for _ in range(n)]
            prior = model.slowdown(model.profile_for(intensity), [model.profile_for(o) for o in others])
            return self.slowdown(gpu_model, intensity, others, prior)

        return fn


FactorBook = dict[str, dict[tuple[str, tuple[str, ...]], float]]
"""GPU model -> ``(class, sorted co-runner classes) -> learned factor`` (observed ÷ prior): what the extender scores
with (``gnnsched.placement.learned_factors``)."""


def factor_book(entries: Iterable[LearnedSlowdown]) -> FactorBook:
    """The calibrated entries of a ``GPUNode.status.learnedSlowdowns`` as factors the placement multiplies its prior
    slowdowns by: an uncalibrated entry (fewer samples than the rule acts on) says nothing yet, as at the gate."""
    book: FactorBook = {}
    for e in entries:
        if e.calibrated and e.prior > 0:
            book.setdefault(e.gpu_model, {})[(e.job_class, tuple(sorted(e.beside)))] = e.slowdown / e.prior
    return book


def interval_step_seconds(before: StepProgress | None, after: StepProgress) -> float | None:
    """Seconds per step between two progress reports of one pod (None when no step was done between them or the
    reports are not usable): the pace of that interval alone, so a pod whose group changed is measured per group."""
    if before is None or after.steps <= before.steps or after.seconds <= before.seconds:
        return None
    return (after.seconds - before.seconds) / (after.steps - before.steps)
