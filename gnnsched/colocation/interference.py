"""Co-location interference model: how much slower a job runs when other jobs share its GPU.

Why this shape
--------------
InSS (seed ``001_*``) predicts a job's GPU run time under co-location as its solo time times
``1 + a_cache * sum(L2 util of co-runners) + a_dram * sum(DRAM util of co-runners)``, with per-model
coefficients ``a``. We have no per-model profiling of GNN jobs, so the per-model coefficients are made a
linear function of the job's *own* solo profile::

    slowdown(j | others) = 1 + (c0 + c1*u_j + c2*m_j) * U + (c3 + c4*u_j + c5*m_j) * M,   clipped to >= 1
    U = sum of co-runners' SM utilisation,  M = sum of co-runners' memory-bandwidth utilisation

(u, m in [0, 1]). The ``m_j * M`` term is what makes two memory-bound jobs hurt each other more than a
memory-bound and a compute-bound pair, which is the pairing rule the BMC/BQT policies rely on.

Data and fit
------------
Fitted on Lucid's 1,388 measured pairwise co-locations (``lucid_colocate_info.csv``): each row has two jobs'
normalised speeds under co-location and the *pair's* GPU and memory-bandwidth utilisation, but not the
jobs' solo profiles. So the fit has two stages, both plain least squares (numpy only):

1. Latent solo profiles per job configuration (model, dataset, batch size, AMP): a co-located job running at
   speed ``s`` issues ``s`` times its solo utilisation, so ``pair_util = s_a*u_a + s_b*u_b`` (rows where the
   pair saturates the GPU are left out of the SM fit) and ``pair_mem = s_a*m_a + s_b*m_b``; ridge towards 0.3.
2. The six coefficients on ``1/speed - 1`` (the slowdown), using both directions of every pair.

The fit error is cross-validated over rows (5 folds; latent profiles and coefficients refitted on the
training folds only; configurations unseen in training get the mean profile) and reported beside a constant
(mean speed) baseline. The coefficients are shipped below (``DEFAULT_COEFFICIENTS``); ``fit()`` reproduces
them from the CSV and ``tests/test_interference.py`` checks that it does.

GNN jobs are not in Lucid. They are mapped to a profile by their arithmetic-intensity class
(``gnnsched.io/intensity`` = ``memory`` | ``compute``): the class profile is the median latent profile of the
Lucid configurations on that side of the median memory/SM ratio. That mapping is an assumption, not a
measurement on GNN jobs; it is documented as such.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

Intensity = Literal["memory", "compute"]

#: Number of model coefficients (see module docstring).
N_COEF = 6


class JobProfile(BaseModel):
    """A job's solo GPU profile: SM utilisation and memory-bandwidth utilisation, both fractions in [0, 1]."""

    model_config = ConfigDict(frozen=True)

    sm_util: float = Field(ge=0.0, le=1.0)
    mem_util: float = Field(ge=0.0, le=1.0)
    sensitivity: float | None = Field(default=None, ge=0.0)
    """The GNN-measured model's (:mod:`gnnsched.colocation.measured`): how exposed the job is to its co-runners'
    summed ``sm_util`` (there: their pressure). None for the Lucid fit, whose sensitivity comes from ``coef``."""


class FitReport(BaseModel):
    """How well the model predicts held-out co-located speeds (speed = 1 / slowdown)."""

    model_config = ConfigDict(frozen=True)

    rows: int
    configurations: int
    folds: int
    cv_mae_speed: float
    cv_rmse_speed: float
    baseline_mae_speed: float
    train_mae_speed: float


class InterferenceCoefficients(BaseModel):
    """Everything the model needs at run time; ``DEFAULT_COEFFICIENTS`` is the shipped instance."""

    model_config = ConfigDict(frozen=True)

    coef: tuple[float, float, float, float, float, float]
    memory_profile: JobProfile
    compute_profile: JobProfile
    default_profile: JobProfile
    report: FitReport
    source: str = "lucid_colocate_info.csv"


class SlowdownModel(Protocol):
    """What the extender, the gate's share rule and the simulator call on an interference model."""

    def profile_for(self, intensity: str | None) -> JobProfile: ...

    def sensitivity(self, job: JobProfile) -> tuple[float, float]: ...

    def slowdown(self, job: JobProfile, others: Sequence[JobProfile]) -> float: ...

    def slowdown_many(self, job: JobProfile, sum_sm: np.ndarray, sum_mem: np.ndarray) -> np.ndarray: ...


class InterferenceModel:
    """Pure slowdown predictions from a fixed set of coefficients (no state changes after construction)."""

    def __init__(self, coefficients: InterferenceCoefficients) -> None:
        self.coefficients = coefficients
        self._c = np.asarray(coefficients.coef, dtype=np.float64)

    def profile_for(self, intensity: str | None) -> JobProfile:
        """Profile for an arithmetic-intensity class; unknown or missing class -> the median Lucid profile."""
        if intensity == "memory":
            return self.coefficients.memory_profile
        if intensity == "compute":
            return self.coefficients.compute_profile
        return self.coefficients.default_profile

    def sensitivity(self, job: JobProfile) -> tuple[float, float]:
        """``(a_u, a_m)`` such that ``slowdown = max(1, 1 + a_u*U + a_m*M)`` for co-runner sums U, M.

        Splitting it this way lets the extender evaluate every GPU in the cluster with two multiply-adds
        over arrays of per-GPU sums, instead of a Python loop over jobs.
        """
        c = self._c
        a_u = c[0] + c[1] * job.sm_util + c[2] * job.mem_util
        a_m = c[3] + c[4] * job.sm_util + c[5] * job.mem_util
        return float(a_u), float(a_m)

    def slowdown(self, job: JobProfile, others: Sequence[JobProfile]) -> float:
        """Predicted slowdown factor (>= 1) of ``job`` sharing a GPU with ``others``."""
        if not others:
            return 1.0
        u = sum(o.sm_util for o in others)
        m = sum(o.mem_util for o in others)
        a_u, a_m = self.sensitivity(job)
        return max(1.0, 1.0 + a_u * u + a_m * m)

    def slowdown_many(self, job: JobProfile, sum_sm: np.ndarray, sum_mem: np.ndarray) -> np.ndarray:
        """Vectorised :meth:`slowdown` for many GPUs given per-GPU sums of co-runner utilisations."""
        a_u, a_m = self.sensitivity(job)
        out = 1.0 + a_u * np.asarray(sum_sm, dtype=np.float64) + a_m * np.asarray(sum_mem, dtype=np.float64)
        return np.maximum(out, 1.0)


# ----------------------------------------------------------------------------------------------- fitting


class _Pairs:
    """The Lucid CSV as arrays: configuration index and speed of both jobs, pair utilisations."""

    def __init__(self, path: Path) -> None:
        with open(path, newline="") as fh:
            rows = list(csv.DictReader(fh))
        if not rows:
            raise ValueError(f"{path}: no rows")

        def key(r: dict[str, str], i: int) -> tuple[str, str, str, str]:
            return (r[f"model{i}"], r[f"dataset{i}"], r[f"batchsize{i}"], r[f"amp{i}"])

        self.configs = sorted({key(r, i) for r in rows for i in (1, 2)})
        index = {c: k for k, c in enumerate(self.configs)}
        self.a = np.array([index[key(r, 1)] for r in rows])
        self.b = np.array([index[key(r, 2)] for r in rows])
        self.sa = np.array([float(r["speed1"]) for r in rows])
        self.sb = np.array([float(r["speed2"]) for r in rows])
        self.util = np.array([float(r["gpu_util"]) for r in rows]) / 100.0
        self.mem = np.array([float(r["gmem_util"]) for r in rows]) / 100.0


_RIDGE = 1e-2  # pulls poorly-observed configurations towards _PRIOR
_PRIOR = 0.3
_SATURATED = 0.97  # pair SM utilisation at or above this says nothing about the sum of solo profiles


def _features(ua: np.ndarray, ma: np.ndarray, ub: np.ndarray, mb: np.ndarray) -> np.ndarray:
    return np.stack([ub, ua * ub, ma * ub, mb, ua * mb, ma * mb], axis=1)


def _latents(p: _Pairs, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n_cfg = len(p.configs)
    rows = np.arange(len(idx))
    x = np.zeros((len(idx), n_cfg))
    x[rows, p.a[idx]] += p.sa[idx]
    x[rows, p.b[idx]] += p.sb[idx]

    def ridge(xm: np.ndarray, y: np.ndarray) -> np.ndarray:
        xr = np.vstack([xm, math.sqrt(_RIDGE) * np.eye(n_cfg)])
        yr = np.concatenate([y, math.sqrt(_RIDGE) * np.full(n_cfg, _PRIOR)])
        return np.clip(np.linalg.lstsq(xr, yr, rcond=None)[0], 0.01, 1.0)

    unsat = p.util[idx] < _SATURATED
    u = ridge(x[unsat], p.util[idx][unsat])
    m = ridge(x, p.mem[idx])
    seen = np.zeros(n_cfg, dtype=bool)
    seen[p.a[idx]] = True
    seen[p.b[idx]] = True
    u = np.where(seen, u, u[seen].mean())
    m = np.where(seen, m, m[seen].mean())
    return u, m, seen


def _fit_coef(p: _Pairs, idx: np.ndarray, u: np.ndarray, m: np.ndarray) -> np.ndarray:
    a, b = p.a[idx], p.b[idx]
    x = np.vstack([_features(u[a], m[a], u[b], m[b]), _features(u[b], m[b], u[a], m[a])])
    y = np.concatenate([1.0 / p.sa[idx] - 1.0, 1.0 / p.sb[idx] - 1.0])
    return np.linalg.lstsq(x, y, rcond=None)[0]


def _predict_speeds(
    p: _Pairs, idx: np.ndarray, u: np.ndarray, m: np.ndarray, coef: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    a, b = p.a[idx], p.b[idx]
    sa = 1.0 / np.maximum(1.0, 1.0 + _features(u[a], m[a], u[b], m[b]) @ coef)
    sb = 1.0 / np.maximum(1.0, 1.0 + _features(u[b], m[b], u[a], m[a]) @ coef)
    return sa, sb


def fit(path: str | Path, folds: int = 5, seed: int = 0) -> InterferenceCoefficients:
    """Fit the model on a Lucid co-location CSV and cross-validate it (see module docstring)."""
    p = _Pairs(Path(path))
    n = len(p.sa)
    perm = np.random.default_rng(seed).permutation(n)
    abs_err: list[np.ndarray] = []
    sq_err: list[np.ndarray] = []
    base_err: list[np.ndarray] = []
    for test in np.array_split(perm, folds):
        train = np.setdiff1d(perm, test)
        u, m, _ = _latents(p, train)
        coef = _fit_coef(p, train, u, m)
        pa, pb = _predict_speeds(p, test, u, m, coef)
        err = np.concatenate([pa - p.sa[test], pb - p.sb[test]])
        abs_err.append(np.abs(err))
        sq_err.append(err**2)
        mean_speed = np.concatenate([p.sa[train], p.sb[train]]).mean()
        base_err.append(np.abs(np.concatenate([p.sa[test], p.sb[test]]) - mean_speed))

    everything = np.arange(n)
    u, m, _ = _latents(p, everything)
    coef = _fit_coef(p, everything, u, m)
    pa, pb = _predict_speeds(p, everything, u, m, coef)
    train_mae = float(np.mean(np.abs(np.concatenate([pa - p.sa, pb - p.sb]))))

    # Class profiles come from the busier half of the configurations (light jobs such as PPO say nothing
    # about which resource a GPU-heavy job saturates), split at their median memory/SM ratio.
    ratio = m / np.maximum(u, 1e-6)
    busy = u >= np.median(u)
    memory_side = busy & (ratio >= np.median(ratio[busy]))
    compute_side = busy & ~memory_side

    def prof(mask: np.ndarray) -> JobProfile:
        return JobProfile(sm_util=round(float(np.median(u[mask])), 4), mem_util=round(float(np.median(m[mask])), 4))

    report = FitReport(
        rows=n,
        configurations=len(p.configs),
        folds=folds,
        cv_mae_speed=round(float(np.mean(np.concatenate(abs_err))), 5),
        cv_rmse_speed=round(float(math.sqrt(np.mean(np.concatenate(sq_err)))), 5),
        baseline_mae_speed=round(float(np.mean(np.concatenate(base_err))), 5),
        train_mae_speed=round(train_mae, 5),
    )
    return InterferenceCoefficients(
        coef=tuple(round(float(c), 6) for c in coef),
        memory_profile=prof(memory_side),
        compute_profile=prof(compute_side),
        default_profile=prof(np.ones_like(memory_side)),
        report=report,
    )


# Output of ``fit("/work/shared/data/traces/lucid_colocate_info.csv")`` (folds=5, seed=0), pasted verbatim;
# regenerate with ``python -m gnnsched.colocation.interference PATH``.
DEFAULT_COEFFICIENTS = InterferenceCoefficients.model_validate(
    {
        "coef": (0.066044, 1.16642, -1.433636, -0.161827, -0.020472, 1.611556),
        "memory_profile": {"sm_util": 0.6125, "mem_util": 0.4775},
        "compute_profile": {"sm_util": 0.4176, "mem_util": 0.1785},
        "default_profile": {"sm_util": 0.2971, "mem_util": 0.131},
        "report": {
            "rows": 1388,
            "configurations": 56,
            "folds": 5,
            "cv_mae_speed": 0.06604,
            "cv_rmse_speed": 0.09576,
            "baseline_mae_speed": 0.09088,
            "train_mae_speed": 0.06558,
        },
    }
)


def load_lucid() -> InterferenceModel:
    """The first fit, on Lucid's non-GNN pairs (kept for comparison: ``bench/gpu/colocation.py`` prints both)."""
    return InterferenceModel(DEFAULT_COEFFICIENTS)


def load_default(gpu_model: str | None = None) -> SlowdownModel:
    """The model the scheduler uses: the fit on measured GNN co-locations (:mod:`gnnsched.colocation.measured`,
    issue 37), for ``gpu_model`` where it was measured, else the H200's fit (its ``source`` says ``transferred``).
    The Lucid fit mispredicted the six measured H200 GNN pairs by up to 0.7x; see :func:`load_lucid`."""
    from gnnsched.colocation.measured import GNNInterferenceModel, fit_for

    return GNNInterferenceModel(fit_for(gpu_model))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gnnsched.colocation.interference CSV``: refit and print the coefficients as JSON."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m gnnsched.colocation.interference LUCID_COLOCATE_CSV", file=sys.stderr)
        return 2
    try:
        result = fit(args[0])
    except (OSError, KeyError, ValueError) as exc:
        print(f"path: cannot fit from {args[0]}: {exc}", file=sys.stderr)
        return 2
    print(result.model_dump_json(indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
