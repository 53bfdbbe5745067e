"""Fit the runtime prior's rates to measured seconds per step, and score the fit on rows it did not see.

Why a separate module: ``bench/runtime_truth.py`` measures real workers and fits with these functions, the shipped
constants in ``gnnsched.runtime_prior`` (``CPU_RATES``) are what they gave, and ``tests/test_runtime_truth.py`` refits
the shipped table with the same functions and fails if the two drift apart. One fit, three readers.

The model is the prior's own: one worker step costs ``kernels * launch + bytes / bandwidth[family] + flops / peak +
sampled_edges / sampling_rate + gather_bytes / gather_rate`` (``gnnsched.runtime_prior.StepCost``, per worker step:
one epoch of a full-batch job, one batch of a mini-batch one, one request of an inference job). On the CPU every term
runs on the same cores, so the terms add. Each core count gets its own rates (one bandwidth per layer family),
fitted on the relative and then the log error (``fit_rates``), so a 2 ms step weighs as much as a 2 s one: the
scheduler compares jobs by ratio. WMAPE is the figure reported.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gnnsched.runtime_prior import FAMILIES, CpuRates

FEATURES = ("kernels", "bytes", "flops", "sampled_edges", "gather_bytes")
"""The per-worker-step counts each rate divides (``gnnsched.runtime_prior.step_counts``), in ``CpuRates`` order."""


NEGLIGIBLE_RATE = 1e20
"""A fitted rate above this (a term the log refinement drove towards 0 without reaching it) is reported as
infinite: at any count the table holds, it adds less than a nanosecond."""


def _design(rows: Sequence[Mapping[str, Any]]) -> np.ndarray:
    """One column per coefficient: kernels, bytes of each family (``FAMILIES`` order), FLOPs, sampled edges,
    gathered bytes."""
    out = np.zeros((len(rows), 4 + len(FAMILIES)), dtype=np.float64)
    for i, r in enumerate(rows):
        kernels, byts, flops, edges, gather = (float(v) for v in r["features"])
        out[i, 0] = kernels
        out[i, 1 + FAMILIES.index(str(r["family"]))] = byts
        out[i, 1 + len(FAMILIES):] = (flops, edges, gather)
    return out


def fit_rates(rows: Sequence[Mapping[str, Any]]) -> CpuRates:
    """Rates for rows of one core count, each with ``features`` (the five counts), ``family`` and
    ``seconds_per_step``.

    Two passes. Non-negative least squares on the relative error (each row divided by its measured time; columns
    scaled to unit mean, since the counts span ten orders of magnitude) picks which terms carry weight; then the
    weighted terms are refined on the log error, ``log(predicted / measured)``, which weighs a 2x over-prediction as
    much as a 2x under-prediction (the relative error caps under-prediction at -100 % and so favours it). A term left
    at 0 is reported as an infinite rate: it explained none of the measured time. A layer family with no rows gets
    the geometric mean of the other families' bandwidths."""
    from scipy.optimize import least_squares, nnls

    if not rows:
        raise ValueError("fit_rates: no rows")
    x = _design(rows)
    t = np.array([float(r["seconds_per_step"]) for r in rows], dtype=np.float64)
    if (t <= 0).any():
        raise ValueError("fit_rates: every row needs a positive seconds_per_step")
    a = x / t[:, None]
    scale = a.mean(axis=0)
    scale[scale == 0] = 1.0
    first, _ = nnls(a / scale, np.ones(len(rows)))
    live = first > 0
    xs = x[:, live] / scale[live]

    def log_error(theta: np.ndarray) -> np.ndarray:
        return np.asarray(np.log(xs @ np.exp(theta) / t))

    refined = least_squares(log_error, np.log(first[live]), method="lm", xtol=1e-12, ftol=1e-12)
    coef = np.zeros(x.shape[1])
    coef[live] = np.exp(refined.x) / scale[live]
    rate = [_sig(1 / c) if c > 0 and 1 / c < NEGLIGIBLE_RATE else math.inf for c in coef]
    seen = {f: rate[1 + i] for i, f in enumerate(FAMILIES) if any(r["family"] == f for r in rows)}
    # a family the rows lack moves bytes at the geometric mean of the others (a small grid may miss one)
    pooled = _sig(math.exp(float(np.mean([math.log(v) for v in seen.values()])))) if seen else math.inf
    return CpuRates(
        launch_seconds=_sig(float(coef[0])),
        bytes_per_s={f: seen.get(f, pooled) for f in FAMILIES},
        flops_per_s=rate[1 + len(FAMILIES)],
        sampled_edges_per_s=rate[2 + len(FAMILIES)],
        gather_bytes_per_s=rate[3 + len(FAMILIES)],
    )


def _sig(value: float, digits: int = 4) -> float:
    """``value`` to ``digits`` significant digits: the shipped constants are written this way."""
    if value == 0 or not math.isfinite(value):
        return value
    return float(f"{value:.{digits - 1}e}")


def predict(rates: CpuRates, row: Mapping[str, Any]) -> float:
    """Predicted seconds of one worker step of a table row (its five counts and its family) with ``rates``."""
    kernels, byts, flops, edges, gather = (float(c) for c in row["features"])
    return rates.seconds((kernels, byts, flops, edges, gather), str(row["family"]))


def wmape(measured: Iterable[float], predicted: Iterable[float]) -> float:
    """Weighted mean absolute percentage error: sum |p - m| / sum m."""
    m = np.asarray(list(measured), dtype=np.float64)
    p = np.asarray(list(predicted), dtype=np.float64)
    return float(np.abs(p - m).sum() / m.sum()) if m.sum() > 0 else math.nan


def is_heldout(job_id: int, every: int = 3) -> bool:
    """Rows of every ``every``-th job (by the grid's seeded id) are held out of the fit; a job's rows at each core
    count stay on one side, so no held-out job was seen at another core count."""
    return job_id % every == every - 1


@dataclass(frozen=True)
class Evaluation:
    """The fit's figures: per core count the rates, per model class the held-out ratios and WMAPE."""

    rates: dict[int, CpuRates]
    heldout_residuals: dict[str, list[float]]  # model class -> measured / predicted, held-out rows
    wmape_by_class: dict[str, dict[str, float]]  # model class -> {"train": ..., "heldout": ...}
    wmape_heldout: float
    wmape_train: float


def evaluate(rows: Sequence[Mapping[str, Any]]) -> Evaluation:
    """Fit on the training rows of each core count and score every row with its core count's rates."""
    by_cores: dict[int, list[Mapping[str, Any]]] = {}
    for r in rows:
        by_cores.setdefault(int(r["cores"]), []).append(r)
    rates = {c: fit_rates([r for r in rs if not is_heldout(int(r["job"]))]) for c, rs in sorted(by_cores.items())}
    residuals: dict[str, list[float]] = {}
    pairs: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    for r in rows:
        side = "heldout" if is_heldout(int(r["job"])) else "train"
        cls = str(r["model_class"]).lower()
        p = predict(rates[int(r["cores"])], r)
        m = float(r["seconds_per_step"])
        for key in ((cls, side), ("*", side)):
            ms, ps = pairs.setdefault(key, ([], []))
            ms.append(m)
            ps.append(p)
        if side == "heldout":
            residuals.setdefault(cls, []).append(round(m / p, 4))
    by_class: dict[str, dict[str, float]] = {}
    for (cls, side), (ms, ps) in sorted(pairs.items()):
        if cls != "*":
            by_class.setdefault(cls, {})[side] = round(wmape(ms, ps), 4)
    overall = {side: wmape(*pairs.get(("*", side), ([], []))) for side in ("train", "heldout")}
    return Evaluation(rates=rates, heldout_residuals=dict(sorted(residuals.items())), wmape_by_class=by_class,
                      wmape_heldout=round(overall["heldout"], 4), wmape_train=round(overall["train"], 4))


SAMPLER = "sampler"
"""``cpu_sensitivity``'s key for the mini-batch sampler timed alone (``host_seconds_per_step``)."""


def cpu_sensitivity(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Measured slowdown from 2 cores to 1: the median of each job's ``t(1 core) / t(2 cores)``, its exponent
    ``alpha = log2(ratio)`` (time ~ cores^-alpha; the prior's host model assumes alpha 1), and how many jobs.

    Keys: ``<batching>.<mode>`` for whole steps on the CPU, and ``sampler`` for the mini-batch sampler alone, the
    host work that a GPU pod's step waits on. The simulator takes a scaled job's true slowdown from ``sampler``, not
    from the prior that chose the scaling."""
    times: dict[tuple[str, int], dict[int, float]] = {}
    for r in rows:
        job, cores = int(r["job"]), int(r["cores"])
        times.setdefault((f"{r['batching']}.{r['mode']}", job), {})[cores] = float(r["seconds_per_step"])
        if r.get("host_seconds_per_step") is not None:
            times.setdefault((SAMPLER, job), {})[cores] = float(r["host_seconds_per_step"])
    ratios: dict[str, list[float]] = {}
    for (group, _job), t in times.items():
        if 1 in t and 2 in t and t[2] > 0:
            ratios.setdefault(group, []).append(t[1] / t[2])
    out: dict[str, dict[str, float]] = {}
    for key, rs in sorted(ratios.items()):
        med = float(np.median(rs))
        out[key] = {"ratio_1_to_2_cores": round(med, 4), "alpha": round(math.log2(med), 4) if med > 0 else 0.0,
                    "jobs": len(rs)}
    return out
