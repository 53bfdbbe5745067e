"""What gnnsched asks of the probe (``gnnsched.portable.probe``) and what it makes of the answer.

The probe traces a user's entrypoint in the user's image, where gnnsched is not installed, so everything it needs of
the spec is put into one request here, and its result (a termination message of at most 4096 bytes) is read back
into an ``Estimate`` with the GPU model's constants through the estimator's own functions (``device_overhead``,
``admit_bytes``): the numbers equal ``gnnsched.estimator.estimate(spec, device="cuda", gpu_model=...)``, which
``tests/test_probe.py`` checks.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gnnsched.gpus import GPUModel
from gnnsched.spec import GNNJobSpec

PROBE_MODULE = "gnnsched_portable.probe"
"""The probe's module in the pod: the init container copies ``gnnsched/portable`` to ``<volume>/gnnsched_portable``
(a name no installed package has, so a user's image that does contain gnnsched cannot shadow it)."""


class ProbeError(Exception):
    """The probe did not give a usable result: its error lines, or why its output could not be read."""


class ProbeResult(BaseModel):
    """The probe's answer (the wire type of its termination message)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    v: int
    pmc: int = Field(ge=0)
    breakdown: dict[str, int]
    resident: int = Field(ge=0)
    allocator: list[tuple[int, int, int, int]]  # (cuBLAS workspace, cuBLASLt workspace, reserved peak, allocated peak)
    seconds: float = 0.0

    def allocator_peak(self, gpu: GPUModel) -> tuple[int, int]:
        """(reserved, allocated) peaks for ``gpu``'s workspace sizes; ``ProbeError`` when the probe was not asked."""
        for cublas, cublaslt, reserved, allocated in self.allocator:
            if (cublas, cublaslt) == (gpu.cublas_workspace_bytes, gpu.cublaslt_workspace_bytes):
                return reserved, allocated
        raise ProbeError(f"the probe has no allocator replay for {gpu.name}'s workspaces")


def workspace_pairs(gpus: Iterable[GPUModel]) -> list[tuple[int, int]]:
    """The distinct (cuBLAS, cuBLASLt) workspace sizes of the GPU models: one allocator replay each."""
    return sorted({(g.cublas_workspace_bytes, g.cublaslt_workspace_bytes) for g in gpus})


def probe_request(spec: GNNJobSpec, gpus: Iterable[GPUModel]) -> dict[str, Any]:
    """The request for an entrypoint spec: the graph's dimensions, the step's graph shapes as the GPU run sees them
    (a mini-batch job's largest batch), the optimizer and the workspace sizes of ``gpus``."""
    from gnnsched.models import graph_layout, minibatch_bound

    if spec.model.entrypoint is None:
        raise ValueError("probe_request: only an entrypoint spec is probed")
    layout = graph_layout(spec)
    step = layout
    if spec.batching.mode == "minibatch":
        step = minibatch_bound(layout, int(spec.batching.batch_size or layout.nodes), spec.fanouts)
    request: dict[str, Any] = {
        "entrypoint": spec.model.entrypoint,
        "mode": spec.mode,
        "device": "cuda",
        "dims": {"num_nodes": layout.nodes, "num_edges": layout.edges, "num_features": layout.features,
                 "num_classes": layout.classes},
        "step": {"nodes": step.nodes, "edges": step.edges, "labelled": step.labelled, "selfLoops": step.self_loops},
        "workers": spec.parallelism if spec.mode == "infer" else 1,
        "workspaces": [list(pair) for pair in workspace_pairs(gpus)],
    }
    if spec.mode == "train":
        opt = spec.training_optimizer
        request["optimizer"] = {"name": opt.name, "learningRate": opt.learning_rate,
                                "weightDecay": opt.weight_decay, "momentum": opt.momentum}
    return request


def parse_probe_result(text: str) -> ProbeResult:
    """The probe's termination message as a ``ProbeResult``; ``ProbeError`` with the probe's own error lines, or
    with why the message is not a result."""
    try:
        raw = json.loads(text)
    except ValueError:
        raise ProbeError(f"the probe's message is not JSON: {text[-400:]!r}") from None
    if isinstance(raw, dict) and "error" in raw:
        raise ProbeError(str(raw["error"]))
    try:
        return ProbeResult.model_validate(raw)
    except ValidationError as exc:
        raise ProbeError(f"the probe's message is not a result: {exc.errors()[0]['msg']}") from None


def estimate_from_probe(result: ProbeResult, gpu: GPUModel, safety_factor: float | None = None) -> Any:
    """The ``Estimate`` of the probed job on ``gpu``: the estimator's device terms applied to the probe's trace."""
    from gnnsched.estimator import DEFAULT_SAFETY_FACTOR_CUDA, Estimate, admit_bytes, device_overhead

    reserved, allocated = result.allocator_peak(gpu)
    overhead = device_overhead(gpu, result.pmc, reserved)
    factor = DEFAULT_SAFETY_FACTOR_CUDA if safety_factor is None else safety_factor
    return Estimate(
        pmc_bytes=result.pmc,
        breakdown=dict(result.breakdown),
        device_overhead_bytes=overhead,
        safety_factor=factor,
        admit_bytes=admit_bytes(result.pmc, overhead, factor),
        seconds=result.seconds,
        cuda_reserved_bytes=reserved,
        cuda_allocated_bytes=allocated,
    )
