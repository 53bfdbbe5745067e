"""The probe: one steady-state step of a user's entrypoint, traced in the user's own image, as a compact JSON result.

The operator runs it in a CPU-only pod from ``spec.image`` before any GPU pod of an entrypoint job, with this
package's directory copied into an ``emptyDir`` by an init container from gnnsched's image::

    python -m gnnsched_portable.probe --request '<json>' --result /dev/termination-log

Only torch, the user's package (and what it imports, torch-geometric typically) and this directory are imported. The
request carries everything gnnsched knows and the image does not: the entrypoint, the mode, the optimizer, the
graph's dimensions (what ``build(dims)`` receives), the shapes of the step's graph (the full graph, or the largest
mini-batch the sampler can produce, which the operator computes with ``gnnsched.models.minibatch_bound``), the
number of inference workers, and the (cuBLAS, cuBLASLt) workspace sizes of each GPU model in the cluster. The trace is
the estimator's own (``tracer.py``, on meta tensors, as the GPU sees the step: no CPU dtype-promotion copies), so the
result equals ``gnnsched.estimator.estimate(spec, device="cuda")`` for the same entrypoint; the operator adds each
GPU model's context, MPS client and allocator allowance (``gnnsched.estimator.device_overhead``).

The result must fit a container's termination message (4096 bytes, ``terminationMessagePath``): a few numbers per
GPU model. On failure the result is ``{"error": <the last lines of the error>}`` and the exit status 1, with ``"field":
"spec.model.entrypoint"`` when the spec itself is wrong (the entrypoint does not import, names no function, or the
function returns no module) rather than the trace impossible.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from .step import (
    EntrypointBuildFailed,
    EntrypointError,
    GraphDims,
    attach_optimizer,
    build_entrypoint_model,
    make_optimizer,
    run_step,
)
from .tracer import (
    _META,
    CudaOperatorPaths,
    Trace,
    UntraceableModel,
    _categorise,
    _LivenessMode,
    allocator_peak,
    gradient_records,
    prime_optimizer,
    refuse_untraceable,
    resident_inputs,
    resident_records,
    scale_for_workers,
)

RESULT_LIMIT = 4096
"""Bytes of a container's termination message the kubelet keeps (``TerminationMessagePath``, k8s.io/api core/v1)."""
ERROR_LINES = 12
"""Lines of the error (the end of its traceback) the result carries: what ``ProbeFailed`` shows the user."""
VERSION = 1


@dataclass
class DatalessGraph:
    """The step's graph as data-less tensors (what ``gnnsched.models.fake_graph_tensors`` gives the estimator)."""

    x: torch.Tensor
    edge_index: torch.Tensor
    y: torch.Tensor
    target: torch.Tensor


def trace_entrypoint(request: dict[str, Any]) -> dict[str, Any]:
    """Trace one steady-state step of the request's entrypoint; the result the operator reads (see the module)."""
    started = time.perf_counter()
    mode = request["mode"]
    dims = GraphDims(**request["dims"])
    step = request["step"]
    cpu = request.get("device", "cuda") == "cpu"
    tracker = _LivenessMode(self_loops=int(step.get("selfLoops", 0)), cpu=cpu)
    with tracker, (nullcontext() if cpu else CudaOperatorPaths()):
        with torch.device(_META):
            graph = DatalessGraph(
                x=torch.empty(step["nodes"], dims.num_features),
                edge_index=torch.empty(2, step["edges"], dtype=torch.long),
                y=torch.empty(step["nodes"], dtype=torch.long),
                target=torch.empty(step["labelled"], dtype=torch.long),
            )
            model = build_entrypoint_model(request["entrypoint"], dims)
            refuse_untraceable(model)
            if any(t.device != _META for t in (*model.parameters(), *model.buffers())):
                model.to(_META)  # weights made by a constructor that ignores the device context
            optimizer = None
            if mode == "train":
                opt = request["optimizer"]
                optimizer = make_optimizer(
                    model.parameters(), opt["name"], opt["learningRate"], opt["weightDecay"], opt.get("momentum")
                )
            attach_optimizer(model, optimizer)
        optimizer = prime_optimizer(model, mode)
        weights, state = resident_records(tracker, model, optimizer)
        window_start = len(tracker.events)
        tracker.phase = "forward"
        run_step(model, graph, mode)
        tracker.finish()
        grads = gradient_records(tracker, model)
        trace = Trace(records=tracker.records, events=list(tracker.events), window_start=window_start)
        peak, at = trace.peak()
        breakdown = _categorise(trace, at, weights, state, grads)
        del graph, model, optimizer
    workers = int(request.get("workers", 1))
    peak, breakdown = scale_for_workers(trace, peak, breakdown, workers)
    allocators = []
    for cublas, cublaslt in request.get("workspaces", []):
        result = allocator_peak(trace, workers, int(cublas), int(cublaslt))
        allocators.append([int(cublas), int(cublaslt), result.reserved_bytes, result.allocated_bytes])
    return {
        "v": VERSION,
        "pmc": int(peak),
        "breakdown": {k: int(v) for k, v in breakdown.items()},
        "resident": resident_inputs(trace),
        "allocator": allocators,
        "seconds": round(time.perf_counter() - started, 3),
        # The image's own torch and CUDA: the cuBLAS workspace a GPU gives a job depends on the torch it runs
        # (gnnsched.gpu.catalogue.workspace_rule), and an entrypoint job runs its image's torch, not gnnsched's.
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


def error_result(exc: BaseException) -> dict[str, Any]:
    """The failure the operator shows in ``ProbeFailed``: the frames of the user's code (not torch's, not the
    probe's: those say where, in the user's terms) and the exception, at most ``ERROR_LINES`` lines and within the
    size limit."""
    inside = (os.path.dirname(torch.__file__), os.path.dirname(os.path.abspath(__file__)))
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(inside)]
    lines = [f"{f.filename}:{f.lineno} in {f.name}: {(f.line or '').strip()}" for f in frames]
    wrong_spec = isinstance(exc, EntrypointError) and not isinstance(exc, EntrypointBuildFailed)
    lines = [*lines[-(ERROR_LINES - 1):], str(exc) if wrong_spec else f"{type(exc).__name__}: {exc}"]
    text = "\n".join(lines)
    budget = RESULT_LIMIT - 96
    if len(text.encode()) > budget:
        text = text.encode()[-budget:].decode(errors="ignore")
    result: dict[str, Any] = {"v": VERSION, "error": text}
    if wrong_spec:  # the same wherever it runs (no import, no such function, no module returned): the spec is wrong
        result["field"] = "spec.model.entrypoint"
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="probe", description=__doc__.splitlines()[0])
    parser.add_argument("--request", required=True, help="the request as JSON (see the module's docstring)")
    parser.add_argument("--result", default="-", help="where to write the result JSON ('-': stdout)")
    args = parser.parse_args(argv)
    status = 0
    try:
        result = trace_entrypoint(json.loads(args.request))
    except (Exception, UntraceableModel) as exc:  # the user's code: any failure is reported, never lost
        traceback.print_exc()
        result, status = error_result(exc), 1
    text = json.dumps(result, separators=(",", ":"), sort_keys=True)
    if len(text.encode()) > RESULT_LIMIT:
        result, status = {"v": VERSION, "error": f"probe result of {len(text)} bytes exceeds {RESULT_LIMIT}"}, 1
        text = json.dumps(result)
    if args.result == "-":
        print(text)
    else:
        with open(args.result, "w", encoding="utf-8") as out:
            out.write(text)
        print(text)
    return status


if __name__ == "__main__":
    sys.exit(main())
