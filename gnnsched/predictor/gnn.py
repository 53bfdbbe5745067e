"""GNNJob runtime model: the analytic prior × an XGBoost correction learnt from the cluster's finished GNNJobs.

Why this shape: requests-only features explain little of a runtime (R² ≈ 0.15-0.26 on openb); a GNN job's spec says
far more — layers, widths, graph size, epochs, the GPU — and the analytic prior (``gnnsched.runtime_prior``) turns it
into a physically sensible number on day one. What the prior gets wrong (kernel efficiency, framework overhead, a
GPU model's real bandwidth) is a multiplicative factor that varies smoothly with the spec, so the residual
``log(observed) − log(prior)`` is a good XGBoost target, and a few dozen finished jobs already correct it. Until the
cluster has history, the shipped default model is the prior alone (``residual`` is None) — said so in its metadata.

CPU and memory enter with monotone −1 constraints in the residual, and the prior is non-increasing in cores, so the
product never predicts a longer run for more resources.

Permutation importance is stored per job class (mode × batching): seed 004 keeps one model per task type and asks it
which resources matter; a full-batch job and a mini-batch job differ exactly there (only samplers use many cores).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gnnsched.gpu.catalogue import GPUModel, get_gpu_model
from gnnsched.predictor.modelfile import read_model_file, read_packaged_model
from gnnsched.predictor.trees import TreeEnsemble
from gnnsched.runtime_prior import arithmetic_intensity, cost_family, solo_runtime_seconds, step_cost
from gnnsched.spec import GNNJobSpec

GNN_FEATURES = (
    "log_prior_seconds", "arch_gcn", "arch_sage", "arch_gin", "arch_gat", "layers", "log_hidden", "log_nodes",
    "log_edges", "log_features", "train", "minibatch", "log_intensity", "log_gpu_bandwidth", "cpu_cores", "memory_gib",
)
GNN_MONOTONE = tuple(-1 if name in ("cpu_cores", "memory_gib") else 0 for name in GNN_FEATURES)
RESOURCE_FEATURES = {"cpu": "cpu_cores", "memory": "memory_gib"}
DEFAULT_MODEL_FILE = "gnn_default.json"
KIND = "gnnsched.gnn-runtime/v1"
MIN_HISTORY = 10
GiB = 2**30


def job_class(spec: GNNJobSpec) -> str:
    """The task type seed 004 keys its models by: ``train-full``, ``train-minibatch``, ``infer-full``, ..."""
    return f"{spec.mode}-{spec.batching.mode}"


def _gpu(gpu_model: GPUModel | str) -> GPUModel:
    return gpu_model if isinstance(gpu_model, GPUModel) else get_gpu_model(gpu_model)


def gnn_features(spec: GNNJobSpec, gpu_model: GPUModel | str, cpu_cores: float, memory_bytes: float) -> list[float]:
    """One feature row in ``GNN_FEATURES`` order."""
    gpu = _gpu(gpu_model)
    g = spec.graph.resolve()
    cost = step_cost(spec)
    prior = solo_runtime_seconds(spec, gpu, cpu_cores, cost)
    arch = cost_family(spec)  # the built-in archs as themselves, other models as the layer cost they resemble
    return [
        math.log(max(prior, 1e-9)),
        float(arch == "gcn"), float(arch == "sage"), float(arch == "gin"), float(arch == "gat"),
        float(spec.model.layers), math.log(spec.model.hidden), math.log(g.nodes), math.log1p(g.edges),
        math.log(g.features), float(spec.mode == "train"), float(spec.batching.mode == "minibatch"),
        math.log(max(arithmetic_intensity(spec, cost), 1e-9)), math.log(gpu.bandwidth_bytes_per_s),
        float(cpu_cores), float(memory_bytes) / GiB,
    ]


@dataclass(frozen=True)
class GNNRuntimePredictor:
    """``predict = prior × exp(residual)``; ``residual`` None means the prior alone (no history yet)."""

    residual: TreeEnsemble | None
    importance: dict[str, dict[str, float]]  # job class -> feature -> PIMP (log units)
    training: dict[str, Any] = field(default_factory=dict)

    def predict(self, spec: GNNJobSpec, gpu_model: GPUModel | str, cpu: float, memory_bytes: float) -> float:
        """Predicted solo runtime in seconds with ``cpu`` cores and ``memory_bytes`` of host memory."""
        if cpu <= 0:
            raise ValueError(f"cpu: {cpu} must be positive")
        if memory_bytes <= 0:
            raise ValueError(f"memory: {memory_bytes} must be positive")
        row = gnn_features(spec, gpu_model, cpu, memory_bytes)
        log_prior = row[0]
        correction = self.residual.predict_row(row) if self.residual is not None else 0.0
        return math.exp(log_prior + correction)

    def class_importance(self, spec: GNNJobSpec) -> dict[str, float]:
        """Importance of the scalable resources (``cpu``, ``memory``) for the job's class; 0 when unmeasured."""
        per_feature = self.importance.get(job_class(spec), {})
        return {res: float(per_feature.get(feat, 0.0)) for res, feat in RESOURCE_FEATURES.items()}

    # --- training from history --------------------------------------------------------------------------------

    @staticmethod
    def fit_history(records: list[Any], params: dict[str, Any] | None = None, source: str = "") -> GNNRuntimePredictor:
        """Fit the residual on ``HistoryRecord``s (features from the *scaled* resources the job actually ran with)."""
        if len(records) < MIN_HISTORY:
            raise ValueError(f"history has {len(records)} records; need at least {MIN_HISTORY} finished GNNJobs")
        specs = [r.job_spec() for r in records]
        x = np.array(
            [gnn_features(s, r.gpu_model, r.scaled.cpu, r.scaled.memory) for s, r in zip(specs, records, strict=True)]
        )
        y = np.log(np.array([r.observed_runtime_seconds for r in records])) - x[:, 0]
        params = params or {"n_estimators": 200, "max_depth": 3, "learning_rate": 0.05, "min_child_weight": 1.0}
        from gnnsched.predictor.boost import fit_l1

        residual = fit_l1(x, y, params, GNN_MONOTONE)
        predict_log = lambda m: m[:, 0] + residual.predict(m)  # noqa: E731
        from gnnsched.predictor.requests_model import permutation_importance

        importance = {}
        classes = sorted({job_class(s) for s in specs})
        for cls in classes:
            rows = np.array([job_class(s) == cls for s in specs])
            if rows.sum() >= 2:
                importance[cls] = permutation_importance(predict_log, x[rows], x[rows, 0] + y[rows], GNN_FEATURES)
        observed = np.exp(x[:, 0] + y)
        from gnnsched.predictor import metrics

        training = {
            "data": source, "rows": len(records), "params": params,
            "in_sample": metrics.report(observed, np.exp(predict_log(x))),
            "prior_only": metrics.report(observed, np.exp(x[:, 0])),
            "importance_on": "history rows (in-sample), per job class",
        }
        return GNNRuntimePredictor(residual=residual, importance=importance, training=training)

    @staticmethod
    def prior_only(probe: list[tuple[GNNJobSpec, str, float, float]]) -> GNNRuntimePredictor:
        """The no-history model; its per-class importance is measured on ``probe`` (spec, gpu, cpu, memory) rows
        against its own predictions — how much shuffling a feature moves the output (model reliance)."""
        from gnnsched.predictor.requests_model import permutation_importance

        base = GNNRuntimePredictor(residual=None, importance={})
        importance = {}
        for cls in sorted({job_class(p[0]) for p in probe}):
            rows = [p for p in probe if job_class(p[0]) == cls]
            # Shuffle resource columns only, then re-evaluate the prior with the shuffled resources.
            x = np.array([[i, cpu, mem] for i, (_, _, cpu, mem) in enumerate(rows)], dtype=float)
            y_log = np.log([base.predict(s, g, c, m) for s, g, c, m in rows])

            def predict_log(matrix: np.ndarray, rows: list = rows) -> np.ndarray:
                return np.log([base.predict(rows[int(i)][0], rows[int(i)][1], c, m) for i, c, m in matrix])

            pim = permutation_importance(predict_log, x, y_log, ("row", "cpu_cores", "memory_gib"))
            importance[cls] = {k: v for k, v in pim.items() if k != "row"}
        training = {"data": "none: prior only (no cluster history yet)", "rows": 0, "probe_rows": len(probe),
                    "importance_on": "probe grid of catalogue jobs (model reliance, resources only)"}
        return GNNRuntimePredictor(residual=None, importance=importance, training=training)

    # --- persistence ------------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": KIND, "features": list(GNN_FEATURES), "monotone": list(GNN_MONOTONE),
            "target": "log(observed seconds) - log(prior seconds)", "importance": self.importance,
            "training": self.training, "residual": None if self.residual is None else self.residual.to_dict(),
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(
            json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True) + "\n", encoding="utf-8"
        )

    @staticmethod
    def from_dict(data: Any, origin: str = "model") -> GNNRuntimePredictor:
        if not isinstance(data, dict) or data.get("kind") != KIND:
            raise ValueError(f"{origin}: not a GNN runtime model (kind must be {KIND!r})")
        if tuple(data.get("features", ())) != GNN_FEATURES:
            raise ValueError(f"{origin}: features differ from this version's {list(GNN_FEATURES)}")
        residual = None
        if data.get("residual") is not None:
            try:
                residual = TreeEnsemble.from_dict(data["residual"])
            except ValueError as exc:
                raise ValueError(f"{origin}: residual: {exc}") from None
        importance = {str(c): {str(k): float(v) for k, v in d.items()} for c, d in data.get("importance", {}).items()}
        return GNNRuntimePredictor(residual=residual, importance=importance, training=dict(data.get("training", {})))

    @staticmethod
    def load(path: str | Path) -> GNNRuntimePredictor:
        return GNNRuntimePredictor.from_dict(read_model_file(path), str(path))

    @staticmethod
    def load_default() -> GNNRuntimePredictor:
        """The model shipped in the package (prior only until the cluster retrains it from history)."""
        return GNNRuntimePredictor.from_dict(read_packaged_model(DEFAULT_MODEL_FILE), DEFAULT_MODEL_FILE)


def probe_grid() -> list[tuple[GNNJobSpec, str, float, float]]:
    """A deterministic grid of catalogue jobs × resources for the prior-only model's importance.

    Datasets: every catalogue graph; archs: all four (GAT with 4 heads); modes: train and infer; mini-batch
    (batch 1024, fanouts 10 per layer) for sage and gat. Resources: CPU 1-16 cores, memory 1-4× the host footprint.
    """
    from gnnsched.datasets import dataset_names
    from gnnsched.host_footprint import host_footprint
    from gnnsched.spec import parse_spec

    rows = []
    i = 0
    for dataset in dataset_names():
        for arch in ("gcn", "sage", "gin", "gat"):
            for mode in ("train", "infer"):
                for batching in ("full", "minibatch"):
                    if batching == "minibatch" and arch not in ("sage", "gat"):
                        continue
                    spec_dict: dict[str, Any] = {"mode": mode, "model": {"arch": arch, "layers": 2, "hidden": 128},
                                                 "graph": {"dataset": dataset}}
                    if arch == "gat":
                        spec_dict["model"]["heads"] = 4
                    if mode == "train":
                        spec_dict["epochs"] = 10
                    if batching == "minibatch":
                        spec_dict["batching"] = {"mode": "minibatch", "batchSize": 1024}
                    spec = parse_spec(spec_dict)
                    for cpu in (1.0, 2.0, 4.0, 8.0, 16.0):
                        floor = host_footprint(spec, cpu).total_bytes
                        mem = floor * (1.0, 2.0, 4.0)[i % 3]
                        i += 1
                        rows.append((spec, "A100-80GB", cpu, float(mem)))
    return rows
