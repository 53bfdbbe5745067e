"""What gnnsched asks of the probe (``gnnsched.portable.probe``) and what it makes of the answer.

The probe traces a user's entrypoint in the user's image, where gnnsched is not installed, so everything it needs of
the spec is put into one request here, and its result (a termination message of at most 4096 bytes) is read back
into an ``Estimate`` with the GPU model's constants through the estimator's own functions (``device_overhead``,
``admit_bytes``): the numbers equal ``gnnsched.estimator.estimate(spec, device="cuda", gpu_model=...)``, which
``tests/test_probe.py`` checks.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gnnsched.gpu.catalogue import GPUModel, gpu_models
from gnnsched.spec import GNNJobSpec

PORTABLE_NAME = "gnnsched_portable"
"""The probe package's name in the pod: the init container copies ``gnnsched/portable`` to ``<volume>/<this>`` (a
name no installed package has, so a user's image that does contain gnnsched cannot shadow it)."""
LAUNCHER = f"{PORTABLE_NAME}/launch.py"
"""The probe's script, relative to the volume (``gnnsched/portable/launch.py`` says why a script and not ``-m``)."""


class ProbeError(Exception):
    """The probe did not give a usable result: its error lines, or why its output could not be read. ``field``: the
    spec field that is wrong when the probe says so (``spec.model.entrypoint``), else None."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class ProbeResult(BaseModel):
    """The probe's answer (the wire type of its termination message)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    v: int
    pmc: int = Field(ge=0)
    breakdown: dict[str, int]
    resident: int = Field(ge=0)
    allocator: list[tuple[int, int, int, int]]  # (cuBLAS workspace, cuBLASLt workspace, reserved peak, allocated peak)
    seconds: float = 0.0
    torch: str | None = Field(default=None, max_length=64)
    """The image's ``torch.__version__`` (None: a probe from before it was reported)."""
    cuda: str | None = Field(default=None, max_length=32)
    """The image's ``torch.version.cuda`` (None on a CPU-only torch)."""

    def workspaces(self, gpu: GPUModel) -> tuple[int, int]:
        """The (cuBLAS, cuBLASLt) workspaces this job takes on ``gpu``: the cuBLAS one by the rule for the image's
        own torch (``workspace_rule``; a torch before 2.3 takes 8 MiB even on Hopper), else ``gpu``'s."""
        from gnnsched.gpu.catalogue import workspace_rule

        cublas = gpu.cublas_workspace_bytes if self.torch is None else workspace_rule(gpu.compute_capability,
                                                                                       self.torch)
        return cublas, gpu.cublaslt_workspace_bytes

    def allocator_peak(self, gpu: GPUModel) -> tuple[int, int]:
        """(reserved, allocated) peaks for the job's workspaces on ``gpu`` (``workspaces``): the replay of exactly
        those sizes, else of the smallest pair at least as large (a node may measure a size no catalogue entry has, and
        the request asked for the catalogue's pairs only: the next larger pair is the closest stand-in, reported as
        such by nothing but this docstring, since the probe's trace is gone), else ``ProbeError``."""
        cublas, cublaslt = self.workspaces(gpu)
        covering = sorted((c, lt, r, a) for c, lt, r, a in self.allocator if c >= cublas and lt >= cublaslt)
        for c, lt, reserved, allocated in covering:
            if (c, lt) == (cublas, cublaslt):
                return reserved, allocated
        if covering:
            return covering[0][2], covering[0][3]
        raise ProbeError(f"the probe has no allocator replay for {gpu.name}'s workspaces ({cublas} and {cublaslt} "
                         f"bytes)")


def workspace_pairs(gpus: Iterable[GPUModel]) -> list[tuple[int, int]]:
    """The distinct (cuBLAS, cuBLASLt) workspace sizes of the GPU models: one allocator replay each."""
    return sorted({(g.cublas_workspace_bytes, g.cublaslt_workspace_bytes) for g in gpus})


def probe_request(spec: GNNJobSpec, gpus: Iterable[GPUModel] | None = None) -> dict[str, Any]:
    """The request for an entrypoint spec: the graph's dimensions, the step's graph shapes as the GPU run sees them
    (a mini-batch job's largest batch), the optimizer and the workspace sizes of ``gpus`` (default: every model of
    the catalogue, a handful of distinct pairs, so one probe serves any GPU the job may land on, and the request,
    hence the cache key, does not change when GPUs join or leave the cluster)."""
    gpus = gpu_models() if gpus is None else gpus
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


def runs_portable(spec: GNNJobSpec) -> bool:
    """Whether the job's GPU pod runs the portable step runner (``gnnsched/portable/runner.py``) in the user's image,
    where gnnsched need not be installed: an entrypoint job without a command of its own."""
    return spec.model.entrypoint is not None and not spec.command


def run_request(spec: GNNJobSpec, seed: int = 0) -> dict[str, Any]:
    """The portable step runner's request (``gnnsched/portable/runner.py``, ``RunRequest``): what the worker would
    read from the manifest, as JSON the runner reads with the standard library. The graph is the synthetic one of the
    spec's dimensions, as the worker builds in an image without the dataset's files."""
    if not runs_portable(spec):
        raise ValueError("run_request: only an entrypoint job without spec.command runs the portable runner")
    dims = spec.graph.resolve()
    request: dict[str, Any] = {
        "entrypoint": spec.model.entrypoint,
        "mode": spec.mode,
        "graph": {"nodes": dims.nodes, "edges": dims.edges, "features": dims.features, "classes": dims.classes},
        "steps": spec.steps,
        "parallelism": spec.parallelism if spec.mode == "infer" else 1,
        "seed": seed,
    }
    if spec.batching.mode == "minibatch":
        request["batching"] = {"batchSize": int(spec.batching.batch_size or dims.nodes), "fanouts": spec.fanouts}
    if spec.mode == "train":
        opt = spec.training_optimizer
        request["optimizer"] = {"name": opt.name, "learningRate": opt.learning_rate, "weightDecay": opt.weight_decay,
                                "momentum": opt.momentum}
    return request


def parse_probe_result(text: str) -> ProbeResult:
    """The probe's termination message as a ``ProbeResult``; ``ProbeError`` with the probe's own error lines, or
    with why the message is not a result."""
    try:
        raw = json.loads(text)
    except ValueError:
        raise ProbeError(f"the probe's message is not JSON: {text[-400:]!r}") from None
    if isinstance(raw, dict) and "error" in raw:
        field = raw.get("field")
        raise ProbeError(str(raw["error"]), field=field if isinstance(field, str) else None)
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


def cache_key(image: str, request: dict[str, Any]) -> str:
    """The key of a probe's result: the image and everything the probe was asked (entrypoint, mode, dimensions, step
    shapes, optimizer, workers, workspaces). An image pinned by digest (``name@sha256:...``) is keyed by the digest
    alone, so a re-tag of the same content still hits; a tag is keyed as written (the operator cannot resolve a tag
    without the registry; ``docs/custom-models.md`` says to pin digests when tags are re-pushed)."""
    _, at, digest = image.partition("@")
    identity = digest if at and digest.startswith("sha256:") else image
    text = json.dumps({"image": identity, "request": request}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class ProbeRecord(BaseModel):
    """One probe, as ``status.probe`` of the job and the operator's cache hold it.

    ``state``: ``Running`` until the probe pod ends, then ``Succeeded`` (``result`` set) or ``Failed`` (``error``:
    the last lines of its error, or what stopped it). ``cacheable``: a failure of the user's code on data-less
    tensors is the same next time and is kept; a pod killed by its deadline or its memory limit (or deleted) is not,
    so a re-submission probes again."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    key: str
    pod: str
    state: Literal["Running", "Succeeded", "Failed"]
    result: ProbeResult | None = None
    error: str | None = None
    reason: str | None = None  # ProbeError, InvalidEntrypoint, DeadlineExceeded, OOMKilled, PodDeleted, ...
    image_id: str | None = Field(default=None, alias="imageID")  # the digest the kubelet ran
    source: Literal["pod", "cache"] = "pod"
    cacheable: bool = True

    def status(self) -> dict[str, Any]:
        """The JSON of ``status.probe`` (camelCase, no nulls: it round-trips through a merge patch)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def install_probe(dest: Path) -> Path:
    """Copy the portable package to ``dest/gnnsched_portable`` (what the probe pod's init container runs); returns
    the launcher's path. Bytecode caches are left out: the user's Python may be another version."""
    target = dest / PORTABLE_NAME
    if target.exists():
        shutil.rmtree(target)
    source = Path(__file__).resolve().parent / "portable"
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest / LAUNCHER


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gnnsched.entrypoint_probe",
        description="Copy gnnsched's torch-only probe into DEST (the probe pod's init container; "
                    "docs/custom-models.md).")
    parser.add_argument("--install", metavar="DEST", required=True, type=Path,
                        help="a directory shared with the probe container (an emptyDir)")
    args = parser.parse_args(argv)
    try:
        launcher = install_probe(args.install)
    except OSError as exc:
        print(f"error: --install {args.install}: {exc}", file=sys.stderr)
        return 1
    print(f"installed the probe: python {launcher} --request JSON --result PATH")
    return 0


if __name__ == "__main__":
    sys.exit(main())
