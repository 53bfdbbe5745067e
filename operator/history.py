"""History export: one JSON line per succeeded GNNJob, for ``gnnsched predictor train --from-history``.

The line format is the predictor's (``gnnsched.predictor.history.HistoryRecord``); every record is validated
against it before it is written, so the export can never produce a file the trainer rejects.

Why from the GNNJob objects: their status already holds what the predictor learns from (the spec as applied, the
requested and scaled resources, the predicted and the observed runtime and peak), so the export needs no database
and no extra writes. Only succeeded jobs with an observed runtime are exported: a failed or unfinished run says
nothing about how long the job takes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def record_from_job(job: Any, gpu_models: dict[str, str] | None = None) -> dict[str, Any] | None:
    """One ``gnnsched.predictor.history.HistoryRecord`` (as a JSON-ready dict) for a succeeded GNNJob, else ``None``.

    ``gpu_model`` is the model of the GPU the agent admitted the pod on (looked up by uuid in ``gpu_models``), else
    the model the runtime was predicted for. ``scaled`` is what the pod requested; the predictor learns from it.
    Records that the predictor's own schema would reject (e.g. a non-positive runtime) are left out, not written.
    """
    from pydantic import ValidationError

    from gnnsched.predictor.history import HistoryRecord

    if not isinstance(job, dict):
        return None
    raw_status = job.get("status")
    status: dict[str, Any] = raw_status if isinstance(raw_status, dict) else {}
    if status.get("phase") != "Succeeded" or not status.get("observedRuntimeSeconds"):
        return None
    raw_plan = status.get("plan")
    plan: dict[str, Any] = raw_plan if isinstance(raw_plan, dict) else {}
    requested = {"cpu": plan.get("requested_cpu"), "memory": plan.get("requested_memory")}
    scaled = {"cpu": plan.get("scaled_cpu"), "memory": plan.get("scaled_memory")}
    gpu = status.get("gpu")
    candidate = {
        "spec": job.get("spec"),
        "requested": requested,
        "scaled": scaled,
        "gpu_model": (gpu_models or {}).get(str(gpu)) or plan.get("runtime_gpu_model"),
        "predicted_runtime_seconds": status.get("predictedRuntimeSeconds"),
        "observed_runtime_seconds": status.get("observedRuntimeSeconds"),
        "pmc_bytes": status.get("pmcBytes"),
        "observed_peak_bytes": status.get("observedPeakBytes"),
        "node": status.get("node"),
        "finished_at": status.get("finishedAt"),
    }
    try:
        return HistoryRecord.model_validate(candidate).model_dump(mode="json")
    except (ValidationError, TypeError, ValueError):
        return None


def gpu_models_by_uuid(gpunodes: Iterable[Any]) -> dict[str, str]:
    """GPU uuid -> catalogue model name, from the node agents' GPUNode statuses (malformed entries skipped)."""
    result: dict[str, str] = {}
    for node in gpunodes:
        status = node.get("status") if isinstance(node, dict) else None
        for gpu in (status or {}).get("gpus") or [] if isinstance(status, dict) else []:
            if isinstance(gpu, dict) and isinstance(gpu.get("uuid"), str) and isinstance(gpu.get("model"), str):
                result[gpu["uuid"]] = gpu["model"]
    return result


def records_from_jobs(jobs: Iterable[Any], gpu_models: dict[str, str] | None = None) -> list[dict[str, Any]]:
    return [r for r in (record_from_job(j, gpu_models) for j in jobs) if r is not None]


def write_jsonl(records: Iterable[dict[str, Any]], path: Path, append: bool = False) -> int:
    """Write (or append) records as JSON lines; returns how many were written."""
    count = 0
    with path.open("a" if append else "w", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record, sort_keys=True) + "\n")
            count += 1
    return count
