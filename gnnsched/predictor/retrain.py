"""When the GNN runtime model retrains itself, on what, and when a retrained model replaces the one in use.

The chart's CronJob runs ``gnnsched predictor train --from-history FILE --model-configmap NS/NAME`` on a schedule
(docs/predictor.md, "Retraining in the cluster"). Each run applies one rule, here so that it is the same for the CLI
and its tests:

1. **Enough new jobs.** A job is *new* when it finished after the newest job the model in use has seen
   (``training.history_through``; the shipped model has seen none). Below ``min_new_jobs`` the run is ``skipped``:
   a handful of jobs cannot tell two models apart.
2. **Hold out the newest.** The newest ``holdout_fraction`` of the new jobs (at least ``min_holdout``) are held out.
   Neither model has seen them: the model in use finished training before they finished, and the candidate is
   trained on every older record. Held out by time, not at random, because what matters is how a model predicts the
   jobs that come next.
3. **Adopt only what is not worse.** Both models predict the held-out jobs; the candidate is ``adopted`` when its
   WMAPE is at most the model in use's, else ``rejected`` and the model in use stays. WMAPE (Σ|error| ÷ Σ runtime)
   is the error the project reports everywhere, and it weighs long jobs more, as queue order does.

The adopted model is the candidate as evaluated (trained without the held-out jobs), so the held-out error it carries
(``training.held_out``) is an honest one; the held-out jobs reach the next candidate's training set. Its
``history_through`` is the newest job this run looked at, so the next run counts only jobs that finished since.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from gnnsched.predictor import metrics
from gnnsched.predictor.gnn import MIN_HISTORY, GNNRuntimePredictor
from gnnsched.predictor.history import HistoryRecord


@dataclass(frozen=True)
class RetrainPolicy:
    """The rule's three numbers (chart: ``predictor.retrain.*``)."""

    min_new_jobs: int = 20
    holdout_fraction: float = 0.2
    min_holdout: int = 5

    def __post_init__(self) -> None:
        if self.min_holdout < 1:
            raise ValueError(f"min_holdout: {self.min_holdout} must be at least 1")
        if self.min_new_jobs < self.min_holdout:
            raise ValueError(f"min_new_jobs: {self.min_new_jobs} must be at least min_holdout ({self.min_holdout}): "
                             "the held-out jobs are new jobs")
        if not 0.0 < self.holdout_fraction < 1.0:
            raise ValueError(f"holdout_fraction: {self.holdout_fraction} must be between 0 and 1 (exclusive)")


class RetrainOutcome(BaseModel):
    """What one run decided and why, with the figures; stored beside the model (the ConfigMap's annotation
    ``gnnsched.io/last-retrain``) so the operator can export it as a metric."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    outcome: Literal["adopted", "rejected", "skipped"]
    at: datetime
    message: str
    history_rows: int = Field(ge=0)
    new_jobs: int = Field(ge=0)
    held_out_rows: int = Field(default=0, ge=0)
    candidate_wmape: float | None = None
    current_wmape: float | None = None


def history_through(model: GNNRuntimePredictor) -> datetime | None:
    """The finish time of the newest job ``model`` has seen (``None``: none, e.g. the shipped prior-only model)."""
    value = model.training.get("history_through")
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def held_out_wmape(model: GNNRuntimePredictor, records: list[HistoryRecord]) -> float:
    """WMAPE of ``model`` on ``records``, each predicted with the resources it ran with (``scaled``)."""
    observed = np.array([r.observed_runtime_seconds for r in records], dtype=float)
    predicted = np.array([model.predict(r.job_spec(), r.gpu_model, r.scaled.cpu, r.scaled.memory) for r in records])
    return metrics.wmape(observed, predicted)


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def retrain(records: list[HistoryRecord], current: GNNRuntimePredictor, now: datetime,
            policy: RetrainPolicy = RetrainPolicy(), params: dict[str, Any] | None = None,
            source: str = "") -> tuple[RetrainOutcome, GNNRuntimePredictor | None]:
    """Apply the module's rule to the cluster's history; returns the outcome and the model to store (the candidate
    when adopted, else ``None``)."""
    ordered = sorted(records, key=lambda r: r.finished_at)
    seen_until = history_through(current)
    new = [r for r in ordered if seen_until is None or r.finished_at > seen_until]
    base = {"at": now, "history_rows": len(ordered), "new_jobs": len(new)}
    if len(new) < policy.min_new_jobs:
        return RetrainOutcome(outcome="skipped", message=(
            f"{len(new)} jobs finished since the model in use was trained; retraining needs {policy.min_new_jobs}"),
            **base), None
    holdout = min(len(new), max(policy.min_holdout, math.ceil(policy.holdout_fraction * len(new))))
    train, test = ordered[:-holdout], ordered[-holdout:]
    if len(train) < MIN_HISTORY:
        return RetrainOutcome(outcome="skipped", message=(
            f"{len(train)} jobs left to train on after holding out the newest {holdout}; training needs "
            f"{MIN_HISTORY}"), held_out_rows=holdout, **base), None
    fitted = GNNRuntimePredictor.fit_history(train, params=params, source=source)
    observed = np.array([r.observed_runtime_seconds for r in test], dtype=float)
    predicted = np.array([fitted.predict(r.job_spec(), r.gpu_model, r.scaled.cpu, r.scaled.memory) for r in test])
    candidate_error = metrics.wmape(observed, predicted)
    current_error = held_out_wmape(current, test)
    figures = {"held_out_rows": holdout, "candidate_wmape": round(candidate_error, 6),
               "current_wmape": round(current_error, 6)}
    if candidate_error > current_error:
        return RetrainOutcome(outcome="rejected", message=(
            f"the candidate's held-out WMAPE {candidate_error:.4f} is worse than the model in use's "
            f"{current_error:.4f} on the newest {holdout} jobs; the model in use stays"), **figures, **base), None
    training = {**fitted.training, "trained_at": _iso(now), "history_through": _iso(ordered[-1].finished_at),
                "held_out": metrics.report(observed, predicted), "held_out_of_model_replaced": round(current_error, 6)}
    candidate = GNNRuntimePredictor(residual=fitted.residual, importance=fitted.importance, training=training)
    return RetrainOutcome(outcome="adopted", message=(
        f"adopted: held-out WMAPE {candidate_error:.4f} (the model in use had {current_error:.4f}) on the newest "
        f"{holdout} jobs; trained on {len(train)}"), **figures, **base), candidate
