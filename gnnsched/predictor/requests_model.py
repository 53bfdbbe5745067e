"""The requests-only runtime model (seed 004's XGBoost of runtime from the resources a task is given), on openb.

Features are what a pod declares at submission: CPU cores, memory GiB, GPU share, whole GPUs, QoS class. The target
is log-runtime; the objective is absolute error (``boost.fit_l1``), so the model estimates a conditional *median* of
log-runtime, and exp(median of log) is the median of the runtime — the point that minimises the absolute error WMAPE
adds up. The
runtime distribution is heavy-tailed (4 s to 15 days), and a squared-error fit on log chases the tail's variance.

Monotone constraints (−1 on CPU, memory, GPU share and GPU count): more of a resource never predicts a longer run.
In the trace, bigger requests come from bigger jobs, so unconstrained trees learn "more CPU ⇒ longer", and adaptive
scaling would then *shorten* the predicted runtime by taking CPU away. The constraint removes that nonsense at a
small cost in fit. XGBoost's built-in absolute-error objective breaks the constraint when it refreshes leaves, hence
the custom objective in ``boost``.

Hyper-parameters are chosen by expanding-window, time-ordered cross-validation inside the training rows only.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gnnsched.predictor import metrics
from gnnsched.predictor.boost import fit_l1
from gnnsched.predictor.modelfile import read_model_file, read_packaged_model
from gnnsched.predictor.trees import TreeEnsemble
from gnnsched.traces import GIB, QOS_CLASSES, PodTable

FEATURES = ("cpu_cores", "memory_gib", "gpu_share", "num_gpu", "qos_rank")
MONOTONE = (-1, -1, -1, -1, 0)
RESOURCE_FEATURES = {"cpu": "cpu_cores", "memory": "memory_gib"}
QOS_RANK = {q: float(i) for i, q in enumerate(QOS_CLASSES)}
DEFAULT_MODEL_FILE = "requests_openb.json"
KIND = "gnnsched.requests-runtime/v1"

PARAM_GRID = {
    "max_depth": (2, 3, 4),
    "n_estimators": (100, 300),
    "learning_rate": (0.05,),
    "min_child_weight": (1.0, 5.0),
}
SEED = 0


def log_runtime(seconds: np.ndarray) -> np.ndarray:
    """The regression target: natural log of the runtime, floored at 1 s (zero-second pods exist in some traces)."""
    return np.log(np.maximum(np.asarray(seconds, float), 1.0))


def request_row(cpu_cores: float, memory_bytes: float, gpu_share: float, num_gpu: float, qos: str) -> list[float]:
    """One feature row in ``FEATURES`` order."""
    if qos not in QOS_RANK:
        raise ValueError(f"qos: {qos!r} is not one of {', '.join(QOS_CLASSES)}")
    return [float(cpu_cores), float(memory_bytes) / GIB, float(gpu_share), float(num_gpu), QOS_RANK[qos]]


def table_features(table: PodTable) -> np.ndarray:
    return np.column_stack([
        table.cpu_cores, table.memory_bytes / GIB, table.gpu_share, table.num_gpu,
        np.array([QOS_RANK[q] for q in table.qos], dtype=float),
    ])


def select_params(table: PodTable, folds: int = 4) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Pick hyper-parameters by expanding-window time-ordered CV on ``table`` (already the training rows only).

    Fold k trains on the first k/(folds+1) of the rows by creation time and validates on the next 1/(folds+1);
    the score is the mean validation WMAPE. Returns the best parameters and every candidate's score.
    """
    ordered = table.time_ordered()
    x, y = table_features(ordered), ordered.runtime_seconds
    n = len(y)
    scores: list[dict[str, Any]] = []
    for values in itertools.product(*PARAM_GRID.values()):
        params = dict(zip(PARAM_GRID, values, strict=True))
        fold_scores = []
        for k in range(1, folds + 1):
            a, b = n * k // (folds + 1), n * (k + 1) // (folds + 1)
            ensemble = fit_l1(x[:a], log_runtime(y[:a]), params, MONOTONE)
            fold_scores.append(metrics.wmape(y[a:b], np.exp(ensemble.predict(x[a:b]))))
        scores.append({"params": params, "cv_wmape": float(np.mean(fold_scores))})
    best = min(scores, key=lambda s: s["cv_wmape"])
    return dict(best["params"]), scores


def permutation_importance(
    predict_log: Any, x: np.ndarray, y_log: np.ndarray, names: tuple[str, ...], repeats: int = 5, seed: int = SEED,
) -> dict[str, float]:
    """Seed 004's PIMP: how much the mean absolute error of log-runtime grows when one feature's column is shuffled.

    The value is in log units (0.1 ≈ the predictions move ~10 % further from the truth). Deterministic for a seed.
    """
    rng = np.random.default_rng(seed)
    base = float(np.mean(np.abs(predict_log(x) - y_log)))
    out = {}
    for j, name in enumerate(names):
        losses = []
        for _ in range(repeats):
            shuffled = x.copy()
            shuffled[:, j] = rng.permutation(shuffled[:, j])
            losses.append(float(np.mean(np.abs(predict_log(shuffled) - y_log))))
        out[name] = float(np.mean(losses) - base)
    return out


@dataclass(frozen=True)
class RequestsRuntimeModel:
    """A trained requests-only runtime model: the tree ensemble plus what it was trained on and how well it did."""

    ensemble: TreeEnsemble
    params: dict[str, Any]
    importance: dict[str, float]
    training: dict[str, Any] = field(default_factory=dict)

    # --- prediction ---------------------------------------------------------------------------------------------

    def predict_seconds(self, cpu_cores: float, memory_bytes: float, gpu_share: float = 1.0, num_gpu: float = 1.0,
                        qos: str = "LS") -> float:
        """Predicted runtime (median) in seconds for one pod's requests."""
        return math.exp(self.ensemble.predict_row(request_row(cpu_cores, memory_bytes, gpu_share, num_gpu, qos)))

    def predict_table(self, table: PodTable) -> np.ndarray:
        return np.exp(self.ensemble.predict(table_features(table)))

    # --- training -----------------------------------------------------------------------------------------------

    @staticmethod
    def fit(
        table: PodTable, params: dict[str, Any] | None = None, sources: tuple[str, ...] = ()
    ) -> RequestsRuntimeModel:
        """Train on the *finished* pods of ``table``; choose parameters by time-ordered CV unless given."""
        finished = table.finished().time_ordered()
        if len(finished) < 20:
            raise ValueError(f"need at least 20 finished pods to train, got {len(finished)}")
        cv_scores: list[dict[str, Any]] = []
        if params is None:
            params, cv_scores = select_params(finished)
        x, y_log = table_features(finished), log_runtime(finished.runtime_seconds)
        ensemble = fit_l1(x, y_log, params, MONOTONE)
        importance = permutation_importance(ensemble.predict, x, y_log, FEATURES)
        training = {
            "data": list(sources) or sorted(set(finished.source)),
            "rows": len(finished),
            "creation_time_range": [float(finished.creation_time.min()), float(finished.creation_time.max())],
            "in_sample": metrics.report(finished.runtime_seconds, np.exp(ensemble.predict(x))),
            "importance_on": "training rows (in-sample permutation importance)",
            "cv": cv_scores,
        }
        return RequestsRuntimeModel(ensemble=ensemble, params=dict(params), importance=importance, training=training)

    # --- persistence --------------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": KIND, "features": list(FEATURES), "monotone": list(MONOTONE), "target": "log(runtime seconds)",
            "params": self.params, "importance": self.importance, "training": self.training,
            "ensemble": self.ensemble.to_dict(),
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(
            json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True) + "\n", encoding="utf-8"
        )

    @staticmethod
    def from_dict(data: Any, origin: str = "model") -> RequestsRuntimeModel:
        if not isinstance(data, dict) or data.get("kind") != KIND:
            raise ValueError(f"{origin}: not a requests-runtime model (kind must be {KIND!r})")
        if tuple(data.get("features", ())) != FEATURES:
            raise ValueError(f"{origin}: features {data.get('features')} differ from {list(FEATURES)}")
        try:
            ensemble = TreeEnsemble.from_dict(data["ensemble"])
        except (KeyError, ValueError) as exc:
            raise ValueError(f"{origin}: ensemble: {exc}") from None
        return RequestsRuntimeModel(ensemble=ensemble, params=dict(data.get("params", {})),
                                    importance={k: float(v) for k, v in data.get("importance", {}).items()},
                                    training=dict(data.get("training", {})))

    @staticmethod
    def load(path: str | Path) -> RequestsRuntimeModel:
        return RequestsRuntimeModel.from_dict(read_model_file(path), str(path))

    @staticmethod
    def load_default() -> RequestsRuntimeModel:
        """The model shipped in the package (trained on openb by the command in the README)."""
        return RequestsRuntimeModel.from_dict(read_packaged_model(DEFAULT_MODEL_FILE), DEFAULT_MODEL_FILE)
