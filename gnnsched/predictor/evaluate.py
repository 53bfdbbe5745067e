"""Baselines and the time-ordered evaluation the issue asks for.

Baselines, fixed before looking at any test figure:

* ``random_forest``: scikit-learn RandomForestRegressor (300 trees, min 3 samples per leaf, seed 0) on the same
  features and the same log-runtime target, unconstrained — seed 004's comparison model.
* ``median``: the training median runtime of the pod's class (QoS × whole-GPU count × GPU-sharing or not), falling
  back to the global training median for a class never seen. What a scheduler without a model would use.

The split is by creation (submission) time: train on the earliest ``train_fraction`` of finished pods, test on the
rest, so no model ever sees the future it is scored on.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gnnsched.predictor import metrics
from gnnsched.predictor.requests_model import RequestsRuntimeModel, log_runtime, table_features
from gnnsched.traces import PodTable


def _classes(table: PodTable) -> list[tuple[str, int, bool]]:
    shared = (table.gpu_milli < 1000) & (table.num_gpu > 0)
    return [(q, int(g), bool(s)) for q, g, s in zip(table.qos, table.num_gpu, shared, strict=True)]


def median_baseline(train: PodTable, test: PodTable) -> np.ndarray:
    """Per-class training median runtime for each test pod."""
    groups: dict[tuple[str, int, bool], list[float]] = {}
    for key, runtime in zip(_classes(train), train.runtime_seconds, strict=True):
        groups.setdefault(key, []).append(runtime)
    medians = {key: float(np.median(v)) for key, v in groups.items()}
    overall = float(np.median(train.runtime_seconds))
    return np.array([medians.get(key, overall) for key in _classes(test)], dtype=float)


def random_forest_baseline(train: PodTable, test: PodTable) -> np.ndarray:
    from sklearn.ensemble import RandomForestRegressor  # heavy: only when evaluating

    forest = RandomForestRegressor(n_estimators=300, min_samples_leaf=3, random_state=0, n_jobs=1)
    forest.fit(table_features(train), log_runtime(train.runtime_seconds))
    return np.exp(forest.predict(table_features(test)))


def time_split(table: PodTable, train_fraction: float) -> tuple[PodTable, PodTable]:
    """Finished pods ordered by creation time, cut at ``train_fraction``."""
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"--train-fraction: {train_fraction} must be between 0 and 1 (exclusive)")
    finished = table.finished().time_ordered()
    cut = int(round(len(finished) * train_fraction))
    if cut < 20 or len(finished) - cut < 5:
        raise ValueError(f"too few finished pods ({len(finished)}) for a {train_fraction:.0%} time-ordered split")
    return finished.select(np.arange(cut)), finished.select(np.arange(cut, len(finished)))


def evaluate_model(model: RequestsRuntimeModel, train: PodTable, test: PodTable) -> dict[str, Any]:
    """Score ``model`` and both baselines (fit on ``train``) on the finished pods of ``test``."""
    test = test.finished()
    train = train.finished()
    if len(test) == 0:
        raise ValueError("no finished (Succeeded/Failed) pods to evaluate on")
    y = test.runtime_seconds
    result: dict[str, Any] = metrics.report(y, model.predict_table(test))
    result["baselines"] = {
        "random_forest": metrics.report(y, random_forest_baseline(train, test)),
        "median": metrics.report(y, median_baseline(train, test)),
    }
    return result


def evaluate_time_split(table: PodTable, train_fraction: float = 0.8,
                        params: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train XGBoost (parameters chosen by CV inside the training part) and the baselines on the earlier pods;
    score all three on the later pods. Also reports the permutation importance measured on the test pods."""
    train, test = time_split(table, train_fraction)
    model = RequestsRuntimeModel.fit(train, params=params)
    result = evaluate_model(model, train, test)
    from gnnsched.predictor.requests_model import FEATURES, permutation_importance

    x = table_features(test)
    result["importance"] = permutation_importance(
        model.ensemble.predict, x, log_runtime(test.runtime_seconds), FEATURES
    )
    result["split"] = {
        "train_rows": len(train), "test_rows": len(test), "train_fraction": train_fraction,
        "cut_creation_time": float(test.creation_time.min()),
    }
    result["params"] = model.params
    return result
