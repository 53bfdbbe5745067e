"""A seeded cluster history for the retrain tests: finished GNNJobs whose observed runtime is a known multiple of the
shipped model's prediction, as history records and as the GNNJob objects the operator leaves behind."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from gnnsched.contract import GROUP, VERSION
from gnnsched.predictor.gnn import GNNRuntimePredictor
from gnnsched.predictor.history import HistoryRecord
from gnnsched.spec import parse_spec

GiB = 2**30
GPU_MODEL = "A100-40GB"
START = datetime(2026, 11, 1, tzinfo=timezone.utc)
ARCHS = ("gcn", "sage", "gin")


def spec_dict(index: int) -> dict[str, Any]:
    """Job ``index``'s spec: three archs on Cora, epochs varying so that the prior varies."""
    return {"mode": "train", "model": {"arch": ARCHS[index % 3], "layers": 2, "hidden": 64},
            "graph": {"dataset": "cora"}, "epochs": 1000 * (1 + index % 7)}


def shipped_seconds(spec: dict[str, Any], cpu: float = 2.0, memory: int = 4 * GiB) -> float:
    return GNNRuntimePredictor.load_default().predict(parse_spec(spec), GPU_MODEL, cpu, memory)


def records(first: int, count: int, factor: float) -> list[HistoryRecord]:
    """Jobs ``first`` .. ``first + count - 1``, job i finishing i minutes after ``START``, each observed at ``factor``
    × the shipped model's prediction."""
    out = []
    for i in range(first, first + count):
        spec = spec_dict(i)
        out.append(HistoryRecord.model_validate({
            "spec": spec, "requested": {"cpu": 4, "memory": 8 * GiB}, "scaled": {"cpu": 2, "memory": 4 * GiB},
            "gpu_model": GPU_MODEL, "predicted_runtime_seconds": shipped_seconds(spec),
            "observed_runtime_seconds": factor * shipped_seconds(spec),
            "finished_at": (START + timedelta(minutes=i)).strftime("%Y-%m-%dT%H:%M:%SZ")}))
    return out


def succeeded_job(record: HistoryRecord, name: str) -> dict[str, Any]:
    """The GNNJob object ``record`` is exported from (``operator/history.py`` reads exactly these fields)."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "GNNJob", "metadata": {"name": name},
        "spec": record.spec,
        "status": {"phase": "Succeeded", "observedRuntimeSeconds": record.observed_runtime_seconds,
                   "predictedRuntimeSeconds": record.predicted_runtime_seconds,
                   "finishedAt": record.finished_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                   "plan": {"requested_cpu": "4", "requested_memory": "8Gi", "scaled_cpu": "2",
                            "scaled_memory": "4Gi", "runtime_gpu_model": GPU_MODEL}},
    }
