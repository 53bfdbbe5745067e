"""Co-location slowdown of GNN jobs, fitted on GNN jobs measured on a GPU.

Why a new model
---------------
``gnnsched.colocation.interference``'s first fit came from Lucid's non-GNN jobs, and GNN jobs reached it only through
an assumed intensity mapping. The first GNN co-locations measured on a GPU (H200, ``bench/gpu/colocation.py --steps
20``, time-slicing, ``docs/measurements/h200-2026-11-28/colocation.txt``) were off in both directions by up to 0.7x: two
training jobs slowed each other 1.84x and 1.64x (predicted 1.15x, 1.24x), a training job beside an inference job only
1.05-1.22x (predicted 1.15-1.34x). What separates them is the *mode* as much as the roofline class, so the classes here
are ``<intensity>-<mode>``: ``memory-train`` (the bench's gcn-train), ``compute-train`` (gin-train), ``memory-infer``
(sage-infer).

Shape
-----
``slowdown(j | others) = 1 + s[class j] * sum over others of p[class o]``: each class has a *sensitivity* ``s`` (how
much of its step is exposed to a neighbour) and a *pressure* ``p`` (how much of the GPU it takes from one). It is the
``a_u * U`` term of the Lucid model's shape (``InterferenceModel.sensitivity``), so the extender's vectorised
per-GPU sums and the gate's share rule use it unchanged: a class's profile carries ``p`` as ``sm_util`` and ``s`` as
``JobProfile.sensitivity``. Fitted by least squares on ``log(slowdown - 1) = log s_j + log p_o`` over the pairs
(pressures normalised to a largest of 1). Six pairs, five free parameters: the fit has one residual degree of
freedom, and its held-out error is leave-one-out (each pair predicted by the fit on the other five).

A class that was not measured (``compute-infer``) and the classes the node agent and the extender know (the pod's
``gnnsched.io/intensity`` alone, ``memory``/``compute``, or none) use the geometric mean of the measured classes they
cover (``memory``: memory-train and memory-infer; none: every class). Per GPU model: only the H200 was measured; the
H100 (the same Hopper tables, docs/gpu-measurements.md) shares it, and every other model uses the H200's fit,
labelled ``transferred`` in :attr:`GNNFit.source`: an assumption until a GPU of that model runs the bench.
Not yet measured: MPS (as deployed; these are time-sliced contexts), triples.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from gnnsched.colocation.interference import JobProfile


class MeasuredSlowdown(BaseModel):
    """One measured row: ``job`` (its class) co-located with ``others`` ran ``slowdown`` x its solo seconds per step."""

    model_config = ConfigDict(frozen=True)

    job: str
    others: tuple[str, ...]
    slowdown: float = Field(gt=1.0)


H200_SOURCE = ("H200 2026-11-28, bench/gpu/colocation.py --steps 20, time-slicing "
               "(docs/measurements/h200-2026-11-28/colocation.txt)")

#: The six measured rows (gcn-train = memory-train, gin-train = compute-train, sage-infer = memory-infer, as the
#: bench's ``intensity_class`` and mode name them).
H200_TIME_SLICING: tuple[MeasuredSlowdown, ...] = (
    MeasuredSlowdown(job="memory-train", others=("compute-train",), slowdown=1.84),
    MeasuredSlowdown(job="compute-train", others=("memory-train",), slowdown=1.64),
    MeasuredSlowdown(job="memory-train", others=("memory-infer",), slowdown=1.07),
    MeasuredSlowdown(job="memory-infer", others=("memory-train",), slowdown=1.05),
    MeasuredSlowdown(job="compute-train", others=("memory-infer",), slowdown=1.13),
    MeasuredSlowdown(job="memory-infer", others=("compute-train",), slowdown=1.22),
)

MEASURED_CLASSES = ("memory-train", "compute-train", "memory-infer")


class ClassCoefficients(BaseModel):
    """A class's sensitivity ``s`` and pressure ``p`` (see the module docstring)."""

    model_config = ConfigDict(frozen=True)

    sensitivity: float = Field(ge=0.0)
    pressure: float = Field(ge=0.0, le=1.0)


class GNNFit(BaseModel):
    """A fitted GNN co-location model for one GPU model: per-class coefficients, where they come from and how well
    they predict pairs they were not fitted on."""

    model_config = ConfigDict(frozen=True)

    classes: dict[str, ClassCoefficients]
    source: str
    rows: int
    loo_errors: tuple[float, ...]
    """Leave-one-out relative error of each row's slowdown, (predicted - measured) / measured, in row order."""
    train_errors: tuple[float, ...]

    @property
    def loo_mean_abs(self) -> float:
        return float(np.mean(np.abs(self.loo_errors))) if self.loo_errors else float("nan")


def _design(rows: Sequence[MeasuredSlowdown], classes: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    n = len(classes)
    x = np.zeros((len(rows), 2 * n))
    y = np.zeros(len(rows))
    for i, r in enumerate(rows):
        if len(r.others) != 1:
            raise ValueError(f"row {i}: the pair fit takes pairs only, got {len(r.others)} co-runners")
        x[i, classes.index(r.job)] = 1.0
        x[i, n + classes.index(r.others[0])] = 1.0
        y[i] = math.log(r.slowdown - 1.0)
    return x, y


def _solve(rows: Sequence[MeasuredSlowdown], classes: Sequence[str]) -> dict[str, ClassCoefficients]:
    x, y = _design(rows, classes)
    # minimum-norm least squares: the split between s and p is fixed below by normalising the pressures
    theta = np.linalg.lstsq(x, y, rcond=None)[0]
    n = len(classes)
    log_s, log_p = theta[:n], theta[n:]
    shift = float(np.max(log_p))
    return {c: ClassCoefficients(sensitivity=round(float(math.exp(log_s[k] + shift)), 6),
                                 pressure=round(float(math.exp(log_p[k] - shift)), 6))
            for k, c in enumerate(classes)}


def _predict(coef: dict[str, ClassCoefficients], row: MeasuredSlowdown) -> float:
    return 1.0 + coef[row.job].sensitivity * sum(coef[o].pressure for o in row.others)


def fit_pairs(rows: Sequence[MeasuredSlowdown], source: str) -> GNNFit:
    """Fit the class coefficients on measured pairs and report each row's leave-one-out error."""
    classes = sorted({r.job for r in rows} | {o for r in rows for o in r.others})
    coef = _solve(rows, classes)
    loo = []
    for i, row in enumerate(rows):
        rest = [r for k, r in enumerate(rows) if k != i]
        # the held-out row's sensitivity needs its job measured as a job, its co-runners' pressure as co-runners
        jobs_seen = {r.job for r in rest}
        mates_seen = {o for r in rest for o in r.others}
        if row.job not in jobs_seen or any(o not in mates_seen for o in row.others):
            raise ValueError(f"row {i}: leaving it out leaves a class unmeasured; add rows")
        held = _solve(rest, classes)
        loo.append(round((_predict(held, row) - row.slowdown) / row.slowdown, 4))
    train = [round((_predict(coef, r) - r.slowdown) / r.slowdown, 4) for r in rows]
    return GNNFit(classes=coef, source=source, rows=len(rows), loo_errors=tuple(loo), train_errors=tuple(train))


def job_class(intensity: str | None, mode: str | None) -> str | None:
    """The model's class of a job: ``<intensity>-<mode>`` when both are known, else the intensity alone (what the
    node agent and the extender read from the pod), else None."""
    if intensity not in ("memory", "compute"):
        return None
    if mode in ("train", "infer"):
        return f"{intensity}-{mode}"
    return intensity


def covered(cls: str | None, fitted: Sequence[str]) -> list[str]:
    """The fitted classes a class stands for: itself when fitted; ``memory`` -> every fitted ``memory-*``;
    an unmeasured ``<intensity>-<mode>`` -> the fitted classes of its mode (an inference job's exposure is its
    mode's more than its roofline's, as the measured pairs show), else of its intensity; None -> all."""
    if cls is None:
        return list(fitted)
    if cls in fitted:
        return [cls]
    if "-" in cls:
        intensity, mode = cls.split("-", 1)
        same_mode = [c for c in fitted if c.endswith("-" + mode)]
        return same_mode or [c for c in fitted if c.startswith(intensity + "-")] or list(fitted)
    return [c for c in fitted if c.startswith(cls + "-")] or list(fitted)


def class_coefficients(fit: GNNFit, cls: str | None) -> ClassCoefficients:
    """``fit``'s coefficients of ``cls``; for a class it did not measure, the geometric mean of those it covers."""
    got = fit.classes.get(cls) if cls is not None else None
    if got is not None:
        return got
    members = [fit.classes[c] for c in covered(cls, sorted(fit.classes))]
    s = math.exp(sum(math.log(max(m.sensitivity, 1e-9)) for m in members) / len(members))
    p = math.exp(sum(math.log(max(m.pressure, 1e-9)) for m in members) / len(members))
    return ClassCoefficients(sensitivity=round(s, 6), pressure=round(min(1.0, p), 6))


H200_FIT = fit_pairs(H200_TIME_SLICING, H200_SOURCE)
"""The fit on the six H200 pairs (computed at import: six rows, microseconds)."""

#: GPU models with their own measurements; any other model uses the H200 fit (``source`` says ``transferred``).
MEASURED_FITS: dict[str, GNNFit] = {"H200": H200_FIT, "H100-80GB": H200_FIT}


def fit_for(gpu_model: str | None) -> GNNFit:
    """The fit for ``gpu_model``: its own where measured, else the H200's, marked as transferred."""
    if gpu_model in MEASURED_FITS:
        return MEASURED_FITS[gpu_model]
    return H200_FIT.model_copy(update={"source": f"transferred from {H200_FIT.source}"})


class GNNInterferenceModel:
    """:class:`gnnsched.colocation.interference.InterferenceModel`'s interface over a :class:`GNNFit`: what the
    extender, the gate's share rule and the simulator call (``profile_for``, ``sensitivity``, ``slowdown``,
    ``slowdown_many``).

    A class's profile carries its pressure as ``sm_util`` (the sum the extender keeps per GPU) and its sensitivity in
    ``JobProfile.sensitivity``. ``slowdown`` never exceeds ``1 + len(others)``: time-slicing gives every context at
    least its turn, so n jobs together are at most n times slower (the pair fit's product ``s * p`` of an unmeasured
    pair, such as two compute-bound training jobs, can exceed that; the bound is physics, not a fit)."""

    def __init__(self, fit: GNNFit) -> None:
        self.fit = fit
        self.source = fit.source

    def profile_for(self, intensity: str | None) -> JobProfile:
        """The profile of a class: ``<intensity>-<mode>``, or the intensity alone, or None (see :func:`covered`)."""
        c = class_coefficients(self.fit, intensity)
        return JobProfile(sm_util=c.pressure, mem_util=0.0, sensitivity=c.sensitivity)

    def sensitivity(self, job: JobProfile) -> tuple[float, float]:
        return (job.sensitivity if job.sensitivity is not None else 0.0), 0.0

    def slowdown(self, job: JobProfile, others: Sequence[JobProfile]) -> float:
        if not others:
            return 1.0
        s, _ = self.sensitivity(job)
        return min(1.0 + len(others), max(1.0, 1.0 + s * sum(o.sm_util for o in others)))

    def slowdown_many(self, job: JobProfile, sum_sm: np.ndarray, sum_mem: np.ndarray) -> np.ndarray:
        """Vectorised over GPUs from the co-runners' summed pressure (uncapped: the count is not in the sums; only
        the extender's ranking reads it)."""
        s, _ = self.sensitivity(job)
        return np.maximum(1.0 + s * np.asarray(sum_sm, dtype=np.float64), 1.0)
