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
    name: str, total_bytes: int, measured: GPUMeasurement | None, node: str | None = None, catalogued: bool = True,
) -> tuple[GPUModel | None, str | None]:
    """The model to plan a GPU with, and why there is none: ``(model, None)`` or ``(None, reason)``.

    ``(None, reason)`` where :func:`missing_constants` gives one (the one rule, shared with the extender and
    ``gnnsched doctor``). Otherwise a measured GPU gets the catalogue entry (or, for an uncatalogued name, an entry
    built from NVML's name and total memory, its architecture from the measured compute capability) with the measured
    constants, and an unmeasured one its catalogue entry. ``catalogued`` is the agent's ``GPUStatus.catalogued``.
    """
    known = find_gpu_model(name)
    reason = missing_constants(name, measured, catalogued)
    if reason is not None:
        return None, reason
    if measured is None:
        assert known is not None  # missing_constants: an unmeasured GPU has constants only from the catalogue
        return known, None
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


def missing_constants(name: str, measured: GPUMeasurement | None, catalogued: bool = True) -> str | None:
    """Why a GPU has no device constants to plan a shared job with (``UNKNOWN_GPU_MODEL``, ``ALLOCATOR_MISMATCH``),
    or None when it has them: the rule :func:`device_model`, the extender's per-GPU filter and ``gnnsched doctor``
    share. ``catalogued`` is what the node agent published (``GPUStatus.catalogued``): a name this process's
    catalogue knows but the agent's did not is still taken as unknown until the node measures it, so a component a
    version ahead never shares a GPU the agent cannot vouch for."""
    if measured is not None:
        return None if measured.allocator_matches_model else ALLOCATOR_MISMATCH
    return None if catalogued and find_gpu_model(name) is not None else UNKNOWN_GPU_MODEL


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
