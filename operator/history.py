"""History export: one JSON line per finished GNNJob, for ``gnnsched predictor train --from-history``.

Why from the GNNJob objects: their status already holds what the predictor learns from (the spec as applied, the
requested and scaled resources, the predicted and the observed runtime and peak), so the export needs no database
and no extra writes. Only jobs whose pod finished (``Succeeded``, or ``Failed`` after running) with an observed
runtime are exported: a job that never ran tells the runtime model nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from gnnsched.spec import SpecError, parse_spec

HISTORY_FIELDS = (
    "job", "uid", "phase", "finishedAt", "spec", "gpuModel", "gpu", "node",
    "requestedCpu", "requestedMemory", "scaledCpu", "scaledMemory",
    "pmcBytes", "admitBytes", "observedPeakBytes",
    "predictedRuntimeSeconds", "runtimeSource", "observedRuntimeSeconds", "failureReason",
)


def record_from_job(job: Any, gpu_models: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The history record of one GNNJob object, or ``None`` if it has not finished or is malformed."""
    if not isinstance(job, dict):
        return None
    status = job.get("status") if isinstance(job.get("status"), dict) else {}
    meta = job.get("metadata") if isinstance(job.get("metadata"), dict) else {}
    if status.get("phase") not in ("Succeeded", "Failed") or status.get("observedRuntimeSeconds") is None:
        return None
    try:
        spec = parse_spec(job.get("spec"))
    except SpecError:
        return None
    plan = status.get("plan") if isinstance(status.get("plan"), dict) else {}
    failed = next((c for c in status.get("conditions") or [] if isinstance(c, dict) and c.get("type") == "Failed"
                   and c.get("status") == "True"), None)
    gpu = status.get("gpu")
    return {
        "job": f"{meta.get('namespace')}/{meta.get('name')}",
        "uid": meta.get("uid"),
        "phase": status.get("phase"),
        "finishedAt": status.get("finishedAt"),
        "spec": spec.model_dump(mode="json", by_alias=True, exclude_none=True),
        "gpuModel": (gpu_models or {}).get(str(gpu)) or plan.get("runtime_gpu_model"),
        "gpu": gpu,
        "node": status.get("node"),
        "requestedCpu": plan.get("requested_cpu"),
        "requestedMemory": plan.get("requested_memory"),
        "scaledCpu": plan.get("scaled_cpu"),
        "scaledMemory": plan.get("scaled_memory"),
        "pmcBytes": status.get("pmcBytes"),
        "admitBytes": status.get("admitBytes"),
        "observedPeakBytes": status.get("observedPeakBytes"),
        "predictedRuntimeSeconds": status.get("predictedRuntimeSeconds"),
        "runtimeSource": plan.get("runtime_source"),
        "observedRuntimeSeconds": status.get("observedRuntimeSeconds"),
        "failureReason": failed.get("reason") if failed else None,
    }


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
