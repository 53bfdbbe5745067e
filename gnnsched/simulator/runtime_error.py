"""Runtime errors in the simulator: the schedulers see a predicted runtime, the engine runs the true one.

Without this module every simulated job's ``JobProfile`` carries ``solo_s == predicted_s``: the runtime prior's figure
is both what the gate, ``sqtf``, the spread rule, the priority classes and QoS admission believe and what the engine
runs, so every gain the simulator reports assumes an oracle. ``gnnsched simulate --runtime-error DIST`` separates the
two, as ``--estimate-error`` does for memory:

* ``none``: the oracle (the figures the simulator always gave).
* ``lognormal:SIGMA[:BIAS]``: a job's true runtime is its predicted runtime times ``BIAS * exp(N(0, SIGMA))``, one
  draw per job (in id order) from a stream seeded by the run's ``--seed``, the same draw on every GPU model and for
  every policy of the run.
* ``measured``: the multiplier is drawn, per arch, from the held-out residuals (measured ÷ predicted seconds per step)
  of the measured runtime table ``gnnsched/data/runtime_truth.json``. Only rows the prior's refit did not see belong
  there, so the error is the one a deployed prior would make. The table is measured by ``bench/runtime_truth.py`` on
  CPU workers (no GPU has been lent to measure GPU rows): its residuals are those of the prior's CPU rates, fitted on
  the other jobs of the grid, used as the stand-in for the prior's error on a GPU.

The predicted runtime stays the prior's (what a real cluster has before the job runs); the true runtime moves. The
oracle of the same run is the same true runtimes, predicted exactly: :func:`as_oracle`. Arrival times, QoS targets
and epoch counts were fixed from the prior before the error is applied, so both runs replay the same arrivals.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any

import numpy as np

from gnnsched.errors import FieldError
from gnnsched.simulator.faults import lognormal_parameters
from gnnsched.simulator.model import SimJob

RUNTIME_STREAM = 0x15E7
"""The runtime error's generator stream, apart from the memory error's and the faults', so turning one on does not
change another's draws."""

TRUTH_TABLE = "runtime_truth.json"
"""The measured table in ``gnnsched/data/``: its ``heldout_residuals`` map an arch to measured ÷ predicted ratios."""



@dataclass(frozen=True)
class RuntimeErrorDist:
    """``--runtime-error``: ``none``, ``lognormal`` with ``sigma`` and ``bias``, or ``measured`` with the held-out
    residuals per arch (``residuals``: arch -> ratios; ``"*"``: every arch's, for an arch the table lacks)."""

    kind: str = "none"
    sigma: float = 0.0
    bias: float = 1.0
    residuals: tuple[tuple[str, tuple[float, ...]], ...] = ()

    @property
    def active(self) -> bool:
        return self.kind != "none"

    def text(self) -> str:
        if self.kind == "lognormal":
            return f"lognormal:{self.sigma:g}:{self.bias:g}"
        return self.kind


NO_RUNTIME_ERROR = RuntimeErrorDist()


def parse_runtime_error(text: str, table: dict[str, Any] | None = None) -> RuntimeErrorDist:
    """``none`` | ``lognormal:SIGMA[:BIAS]`` | ``measured``; anything else is a :class:`FieldError` naming
    ``--runtime-error``. ``table``: the measured table (default: the shipped one), for ``measured``."""
    raw = text.strip().lower()
    if raw in ("", "none"):
        return NO_RUNTIME_ERROR
    if raw == "measured":
        return measured_error(table if table is not None else load_truth_table())
    sigma, bias = lognormal_parameters(text, "--runtime-error", "none, measured or lognormal:SIGMA[:BIAS]")
    return RuntimeErrorDist(kind="lognormal", sigma=sigma, bias=bias)


def load_truth_table() -> dict[str, Any]:
    """The shipped measured table; a missing or unreadable one is a :class:`FieldError` naming ``--runtime-error``
    (``measured`` cannot draw from nothing, and silently falling back to the oracle would hide it)."""
    try:
        text = resources.files("gnnsched.data").joinpath(TRUTH_TABLE).read_text()
    except (FileNotFoundError, OSError) as exc:
        raise FieldError("--runtime-error", f"measured: gnnsched/data/{TRUTH_TABLE} is missing ({exc}): rebuild it "
                                            "with bench/runtime_truth.py, or use lognormal:SIGMA[:BIAS]") from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise FieldError("--runtime-error", f"measured: gnnsched/data/{TRUTH_TABLE} is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise FieldError("--runtime-error", f"measured: gnnsched/data/{TRUTH_TABLE} must be a JSON object")
    return doc


def measured_error(table: dict[str, Any]) -> RuntimeErrorDist:
    """The ``measured`` distribution from a table's ``heldout_residuals`` (arch -> list of measured ÷ predicted)."""
    raw = table.get("heldout_residuals")
    if not isinstance(raw, dict) or not raw:
        raise FieldError("--runtime-error", "measured: the table has no heldout_residuals (arch -> ratios)")
    per_arch: dict[str, tuple[float, ...]] = {}
    for arch, ratios in sorted(raw.items()):
        if not isinstance(ratios, list) or not ratios:
            raise FieldError("--runtime-error", f"measured: heldout_residuals[{arch!r}] must be a non-empty list")
        values = tuple(float(r) for r in ratios)
        if not all(math.isfinite(v) and v > 0 for v in values):
            raise FieldError("--runtime-error", f"measured: heldout_residuals[{arch!r}] must be positive numbers")
        per_arch[str(arch).lower()] = values
    per_arch["*"] = tuple(v for arch in sorted(per_arch) for v in per_arch[arch])
    return RuntimeErrorDist(kind="measured", residuals=tuple(sorted(per_arch.items())))


def sampler_core_exponent(table: dict[str, Any] | None = None) -> float:
    """The measured exponent of the mini-batch sampler's time against its cores (time ~ cores^-alpha), from the
    table's ``cpu_sensitivity.sampler``: the simulator's ground truth for how a scaled job's host work slows down,
    measured, where the scaler's prior assumes 1. ``FieldError`` (naming the table) if the table lacks it."""
    doc = table if table is not None else load_truth_table()
    try:
        alpha = float(doc["cpu_sensitivity"]["sampler"]["alpha"])
    except (KeyError, TypeError, ValueError):
        raise FieldError(f"gnnsched/data/{TRUTH_TABLE}", "cpu_sensitivity.sampler.alpha is missing: rebuild the "
                                                         "table with bench/runtime_truth.py") from None
    if not math.isfinite(alpha) or alpha < 0:
        raise FieldError(f"gnnsched/data/{TRUTH_TABLE}", f"cpu_sensitivity.sampler.alpha {alpha} must be >= 0")
    return alpha


def _arch(job: SimJob) -> str:
    """The job's model class (``ModelSpec.model_class``: the arch, or ``pyg-<Class>`` and the like) for the
    measured residuals; "*" for trace pods. A class the table lacks draws from every arch's pool."""
    model = getattr(job.spec, "model", None)
    name = getattr(model, "model_class", None)
    return str(name).lower() if name else "*"


def runtime_multipliers(jobs: list[SimJob], error: RuntimeErrorDist, seed: int) -> dict[int, float]:
    """Each job's true runtime ÷ predicted runtime: one draw per job in id order from the run's seeded stream."""
    if not error.active:
        return {j.id: 1.0 for j in jobs}
    rng = np.random.default_rng([RUNTIME_STREAM, seed])
    ordered = sorted(jobs, key=lambda j: j.id)
    if error.kind == "lognormal":
        draws = rng.normal(0.0, error.sigma, size=len(ordered)) if error.sigma > 0 else np.zeros(len(ordered))
        return {j.id: float(error.bias * math.exp(d)) for j, d in zip(ordered, draws, strict=True)}
    pools = dict(error.residuals)
    out: dict[int, float] = {}
    for j in ordered:
        pool = pools.get(_arch(j)) or pools["*"]
        out[j.id] = float(pool[int(rng.integers(len(pool)))])
    return out


def with_true_runtimes(jobs: list[SimJob], multipliers: dict[int, float], qos_ref: str | None = None,
                       startup_s: float = 0.0) -> list[SimJob]:
    """``jobs`` whose true runtime (``solo_s``, on every GPU model) is the prediction times the job's multiplier; the
    prediction (``predicted_s``) is left as the prior made it.

    ``qos_ref``: the GPU model the workload's QoS targets were set on (``materialise``'s reference model, with
    ``startup_s``): a job's target is rescaled from its predicted solo time to its *true* one, ``QT = factor x (true
    solo + start-up)``, as the GNNSched paper set it from the measured solo latency (issue 37). Without it a job
    whose truth was 2.5x its prediction missed its target even alone."""
    out = []
    for j in jobs:
        m = multipliers.get(j.id, 1.0)
        if m == 1.0:
            out.append(j)
            continue
        profiles = {g: replace(p, solo_s=p.predicted_s * m) for g, p in j.profiles.items()}
        qos = j.qos_target_s
        if qos is not None and qos_ref in j.profiles:
            before = j.profiles[qos_ref].predicted_s + startup_s
            qos = qos * (profiles[qos_ref].solo_s + startup_s) / before if before > 0 else qos
        out.append(replace(j, profiles=profiles, qos_target_s=qos))
    return out


def as_oracle(jobs: list[SimJob]) -> list[SimJob]:
    """``jobs`` predicted exactly: every profile's ``predicted_s`` is its true ``solo_s``."""
    return [replace(j, profiles={g: replace(p, predicted_s=p.solo_s) for g, p in j.profiles.items()}) for j in jobs]


ORACLE_METRICS = ("jct_mean_s", "makespan_s", "jct_p99_s", "qos_violation_rate")


def oracle_gap(under_error: dict[str, dict[str, Any]], oracle: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per policy: each headline metric under the error, the oracle's, and their ratio (None where either is
    missing or the oracle's is 0)."""
    out: dict[str, dict[str, Any]] = {}
    for policy, figures in under_error.items():
        ref = oracle.get(policy, {})
        row: dict[str, Any] = {}
        for metric in ORACLE_METRICS:
            a: Any = figures.get(metric)
            b: Any = ref.get(metric)
            row[metric] = a
            row[f"oracle_{metric}"] = b
            both = isinstance(a, int | float) and isinstance(b, int | float) and b
            row[f"{metric}_ratio"] = a / b if both else None
        out[policy] = row
    return out
