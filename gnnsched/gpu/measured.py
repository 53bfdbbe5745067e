"""The device constants a plan uses for one GPU: the node's own measurement when it has one, else the catalogue's.

Why: the catalogue's constants are written once per architecture, and most were never measured; a node knows its own
GPU, driver and torch. So the operator plans a GPU with what its node measured (``GPUStatus.measured``), falls back to
the catalogue entry of a known model, and for a model the catalogue does not know has nothing until the node
measures: :func:`device_model` then answers ``None`` with the reason, and the job runs alone (``UnknownGPUModel``),
never on another model's constants.
"""

from __future__ import annotations

import hashlib
import json

from gnnsched.contract import GPUMeasurement
from gnnsched.gpu.catalogue import DEFAULT_GPU_MODEL, GPUModel, architecture_of, find_gpu_model, get_gpu_model

UNKNOWN_GPU_MODEL = "UnknownGPUModel"
"""The reason (and condition reason) for a GPU that neither the catalogue nor its node's measurement describes."""
ALLOCATOR_MISMATCH = "AllocatorModelMismatch"
"""The reason for a GPU whose node measured an allocator that does not behave as ``gnnsched.cuda_allocator``
models it (expandable segments, a rounding setting): reserved memory cannot be predicted there."""


def _compute_capability(text: str | None) -> tuple[int, int] | None:
    try:
        major, minor = (int(p) for p in (text or "").split(".", 1))
    except ValueError:
        return None
    return major, minor


def apply_measurement(base: GPUModel, measured: GPUMeasurement, node: str | None = None) -> GPUModel:
    """``base`` with the device constants its node measured (provenance says where and when)."""
    where = (f"measured: node {node}, " if node else "measured: ") + (
        f"{measured.source}, driver {measured.driver_version or '?'}, torch {measured.torch_version or '?'}, "
        f"at {measured.active_thread_percentage or 100} % active threads, {measured.measured_at.isoformat()}")
    return base.model_copy(update={
        "context_bytes": measured.context_bytes,
        "cublas_workspace_bytes": measured.cublas_workspace_bytes,
        "cublaslt_workspace_bytes": measured.cublaslt_workspace_bytes,
        "provenance": dict.fromkeys(("context", "cublas_workspace", "cublaslt_workspace"), where),
    })


def device_model(
    name: str, total_bytes: int, measured: GPUMeasurement | None, node: str | None = None,
) -> tuple[GPUModel | None, str | None]:
    """The model to plan a GPU with, and why there is none: ``(model, None)`` or ``(None, reason)``.

    * A measured GPU whose allocator matches the model: the catalogue entry (or, for an uncatalogued name, an entry
      built from NVML's name and total memory, its architecture from the measured compute capability) with the
      measured constants.
    * A measured GPU whose allocator does not: ``(None, ALLOCATOR_MISMATCH)``.
    * An unmeasured, catalogued GPU: its catalogue entry.
    * An unmeasured, uncatalogued GPU: ``(None, UNKNOWN_GPU_MODEL)``.
    """
    known = find_gpu_model(name)
    if measured is not None and not measured.allocator_matches_model:
        return None, ALLOCATOR_MISMATCH
    if measured is None:
        return (known, None) if known is not None else (None, UNKNOWN_GPU_MODEL)
    if known is None:
        # Throughput figures are unknown for an uncatalogued board: the default model's stand in for the runtime prior
        # only (the planner never takes its runtime model from an uncatalogued GPU); memory is the node's own figure.
        stand_in = get_gpu_model(DEFAULT_GPU_MODEL)
        cc = _compute_capability(measured.compute_capability)
        arch = architecture_of(cc) if cc is not None else None
        known = stand_in.model_copy(update={
            "name": name, "memory_bytes": max(1, total_bytes), "aliases": (), "nvml_names": (name,),
            "compute_capability": cc or stand_in.compute_capability,
            "architecture": arch.name if arch is not None else "unknown",
            "source": "not in the catalogue: NVML's name and total memory, constants measured by its node",
        })
    return apply_measurement(known, measured, node), None


def missing_constants(name: str, measured: GPUMeasurement | None, catalogued: bool = True,
                      known: bool | None = None) -> str | None:
    """Why a GPU has no device constants to plan a shared job with (``UNKNOWN_GPU_MODEL``, ``ALLOCATOR_MISMATCH``),
    or None when it has them. The same rule as :func:`device_model`, without building a model, for the extender's
    per-GPU filter and ``gnnsched doctor``. ``catalogued`` is what the node agent published
    (``GPUStatus.catalogued``): a name this process's catalogue knows but the agent's did not is still taken as
    unknown until the node measures it, so a component a version ahead never shares a GPU the agent cannot vouch
    for. ``known``: whether this process's catalogue knows ``name``, for a caller that memoises the lookup (the
    extender, per GPUNode update); None looks it up."""
    if measured is not None:
        return None if measured.allocator_matches_model else ALLOCATOR_MISMATCH
    if known is None:
        known = find_gpu_model(name) is not None
    return None if catalogued and known else UNKNOWN_GPU_MODEL


def constants_key(model: GPUModel) -> str:
    """What an estimate on ``model`` depends on, as a string: every field but the descriptive ones (provenance,
    source, names). Why: an estimate cache keyed by the model's name alone would hand a node's measured model the
    estimate made with the catalogue's constants (or the reverse); two nodes that measured the same values share
    one entry (their provenance differs, their estimate does not)."""
    fields = model.model_dump(mode="json", exclude={"provenance", "source", "aliases", "nvml_names", "assumed"})
    return json.dumps(fields, sort_keys=True, separators=(",", ":"))


def measurement_fingerprint(measured: GPUMeasurement | None) -> str | None:
    """A short, stable name for a node's measured constants (None: not measured): how a plan's per-model need
    tells two nodes of one model with different measurements apart (``ModelNeed.constants``)."""
    if measured is None:
        return None
    text = f"{measured.context_bytes}:{measured.cublas_workspace_bytes}:{measured.cublaslt_workspace_bytes}"
    return hashlib.sha256(text.encode()).hexdigest()[:12]
