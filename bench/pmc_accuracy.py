#!/usr/bin/env python3
"""Accuracy of the PMC estimator against the measured peak on CPU.

Ground truth is ``torch.profiler.profile(profile_memory=True)``'s allocation events over one steady-state step
(``gnnsched.worker.measure_step_peak_cpu``: graph, model and optimizer state resident, the second step profiled), not
a dispatch-mode tracker (under a dispatch mode autograd accumulates gradients out of place, which inflates training).

The grid: 4 architectures x train/infer x 8 synthetic graph sizes (peaks from under 1 MB to a few hundred MB), with
layers 2-10 and hidden 16-256 rotated across the sizes so every value meets every architecture, GAT heads 1/2/4;
plus the real Cora and CiteSeer graphs for each architecture and mode; plus every PyG model class and listed layer
stack (``spec.model.pyg`` / ``conv``) with common options, train and infer, on the graph of issue 30's table. A
case whose estimate exceeds ``--max-bytes`` has its hidden size halved until it fits (the printed row shows what
ran). Separately, two bound checks that are not
part of the error statistics: parallel inference (the estimate assumes all workers peak together, so it must be >=
the measured peak) and neighbour-sampled mini-batches (the estimate uses the largest batch the sampler can build).

Usage::

    python bench/pmc_accuracy.py                # full grid, prints every case and the summary
    python bench/pmc_accuracy.py --quick        # the slice tests/test_estimator.py runs in CI
    python bench/pmc_accuracy.py --json out.json
    python bench/pmc_accuracy.py --check-splice # spliced vs full traces over the grid at depths 6-16 (no profiler)
    python bench/pmc_accuracy.py --device cuda  # the CUDA caching-allocator model against a GPU (needs one)
    python bench/pmc_accuracy.py --models --max-bytes 8000000000  # PyG classes and layer stacks, issue 30's graph

``--device cuda`` runs each case on the GPU (graph, model on the device, ``--cuda-steps`` steps; parallel inference
as the worker serves it) in this process, emptying the allocator's cache and the cuBLAS workspaces between cases, and
compares the estimate's ``cuda_reserved_bytes`` with ``torch.cuda.max_memory_reserved()`` and
``cuda_allocated_bytes`` with ``torch.cuda.max_memory_allocated()`` (both since the case's first allocation; the CUDA
context is in neither). Without a GPU it prints that it skipped and measures nothing. It exits 1 when any case's
measured reserved memory exceeds the predicted reserved times the CUDA safety factor (the admission's margin); a
case that does not fit the GPU is reported and skipped. The estimate uses the catalogue entry of the GPU in hand.

A model deeper than ``gnnsched.estimator.SPLICE_DEPTH`` is estimated from a spliced trace; the grid's 6-, 8- and
10-layer cases measure it against the profiler, and ``--check-splice`` compares it with the full trace for every
grid case re-run at depths 6, 8, 10, 12 and 16 on cpu and cuda (peak, breakdown, CUDA-rounded peak, and the live
bytes after every run of allocations or frees).

Estimate times are reported as wall time and as the process CPU time of the estimate (the machine may be shared).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

ARCHS = ("gcn", "sage", "gin", "gat")
MODES = ("train", "infer")
SIZES = (  # nodes, edges, features, classes
    (500, 2_500, 16, 3),
    (1_000, 10_000, 32, 7),
    (2_000, 20_000, 64, 16),
    (5_000, 40_000, 64, 40),
    (10_000, 80_000, 128, 7),
    (20_000, 200_000, 64, 16),
    (40_000, 300_000, 128, 3),
    (60_000, 600_000, 100, 40),
)
LAYERS = (2, 4, 6, 8, 10)
HIDDEN = (16, 32, 64, 128, 256)
HEADS = (1, 2, 4)
DEFAULT_MAX_BYTES = 400 * 2**20
MiB = 2**20


@dataclass
class Case:
    arch: str
    mode: str
    layers: int
    hidden: int
    heads: int | None
    graph: dict[str, Any]
    parallelism: int = 1
    batching: dict[str, Any] | None = None
    kind: str = "grid"  # grid | real | models | parallel-bound | minibatch-bound
    named: dict[str, Any] | None = None  # a PyG class or layer stack ({"pyg"|"conv": ..., "options": ...})

    def spec_dict(self) -> dict[str, Any]:
        model: dict[str, Any] = {"arch": self.arch, "layers": self.layers, "hidden": self.hidden}
        if self.named is not None:
            model = {**self.named, "layers": self.layers, "hidden": self.hidden}
        if self.heads is not None:
            model["heads"] = self.heads
        spec: dict[str, Any] = {"mode": self.mode, "model": model, "graph": dict(self.graph)}
        if self.parallelism != 1:
            spec["parallelism"] = self.parallelism
        if self.batching is not None:
            spec["batching"] = dict(self.batching)
        return spec

    def label(self) -> str:
        g = self.graph
        graph = g["dataset"] if "dataset" in g else f"n={g['nodes']} e={g['edges']} f={g['features']} c={g['classes']}"
        heads = f" heads={self.heads}" if self.heads else ""
        if self.named is not None:
            options = ",".join(f"{k}={v}" for k, v in (self.named.get("options") or {}).items())[:40]
            return f"{self.arch} {self.mode:5} L={self.layers:<2} h={self.hidden:<3} {options} {graph}"
        extra = f" par={self.parallelism}" if self.parallelism != 1 else ""
        extra += " minibatch" if self.batching else ""
        return f"{self.arch:4} {self.mode:5} L={self.layers:<2} h={self.hidden:<3}{heads} {graph}{extra}"


@dataclass
class Result:
    case: str
    kind: str
    estimated: int
    measured: int
    rel_error: float
    estimate_wall_ms: float
    estimate_cpu_ms: float


def grid_cases() -> list[Case]:
    cases = []
    for a, arch in enumerate(ARCHS):
        for m, mode in enumerate(MODES):
            for i, (nodes, edges, features, classes) in enumerate(SIZES):
                cases.append(
                    Case(
                        arch=arch,
                        mode=mode,
                        layers=LAYERS[(i + a) % len(LAYERS)],
                        hidden=HIDDEN[(i + 2 * a + m) % len(HIDDEN)],
                        heads=HEADS[(i + m) % len(HEADS)] if arch == "gat" else None,
                        graph={"nodes": nodes, "edges": edges, "features": features, "classes": classes},
                    )
                )
    for dataset in ("cora", "citeseer"):
        for arch in ARCHS:
            for mode in MODES:
                cases.append(
                    Case(arch=arch, mode=mode, layers=2, hidden=64, heads=8 if arch == "gat" else None,
                         graph={"dataset": dataset}, kind="real")
                )
    return cases


ISSUE_GRAPH = {"nodes": 20_000, "edges": 200_000, "features": 128, "classes": 16}
"""The graph of issue 30's table (a user's own models declared as the nearest built-in arch)."""
PNA_OPTIONS = {"aggregators": ["mean", "min", "max", "std"], "scalers": ["identity", "amplification", "attenuation"]}
NAMED_MODELS: list[tuple[dict[str, Any], int, int]] = [  # (model, layers, hidden)
    ({"pyg": "GCN"}, 3, 256),
    ({"pyg": "GIN"}, 3, 256),
    ({"pyg": "GAT", "options": {"heads": 4}}, 2, 256),
    ({"pyg": "GraphSAGE"}, 3, 256),
    ({"pyg": "GCN", "options": {"norm": "batch_norm", "jk": "cat"}}, 3, 256),
    ({"conv": "TransformerConv", "options": {"heads": 4}}, 2, 256),
    ({"pyg": "GAT", "options": {"heads": 4, "v2": True}}, 2, 256),
    ({"pyg": "GraphSAGE", "options": {"aggr": "max"}}, 3, 256),
    ({"pyg": "PNA", "options": PNA_OPTIONS}, 3, 256),
    ({"pyg": "EdgeCNN"}, 3, 128),
    ({"conv": "GATv2Conv", "options": {"heads": 4}}, 3, 128),
    ({"conv": "GENConv", "options": {"aggr": "softmax", "learn_t": True}}, 3, 128),
    ({"conv": "ResGatedGraphConv"}, 3, 128),
    ({"conv": "GraphConv", "options": {"aggr": "max"}}, 3, 128),
    ({"conv": "SGConv", "options": {"K": 2}}, 3, 128),
]


def model_cases(graph: dict[str, Any] | None = None) -> list[Case]:
    """Every PyG model class and listed layer, train and infer (``spec.model.pyg`` / ``conv``)."""
    return [
        Case(str(named.get("pyg") or named.get("conv")), mode, layers, hidden, None, dict(graph or ISSUE_GRAPH),
             kind="models", named=named)
        for named, layers, hidden in NAMED_MODELS for mode in MODES
    ]


def bound_cases() -> list[Case]:
    small = {"nodes": 5_000, "edges": 50_000, "features": 64, "classes": 7}
    return [
        Case("sage", "infer", 3, 64, None, small, parallelism=4, kind="parallel-bound"),
        Case("gcn", "infer", 2, 128, None, small, parallelism=2, kind="parallel-bound"),
        Case("sage", "train", 2, 64, None, {"nodes": 20_000, "edges": 200_000, "features": 32, "classes": 5},
             batching={"mode": "minibatch", "batchSize": 512, "fanouts": [10, 5]}, kind="minibatch-bound"),
        Case("gat", "train", 2, 32, 2, {"nodes": 20_000, "edges": 200_000, "features": 32, "classes": 5},
             batching={"mode": "minibatch", "batchSize": 256, "fanouts": [5, 5]}, kind="minibatch-bound"),
    ]


def quick_cases() -> list[Case]:
    """The CI slice: every architecture and mode once, small graphs, including the in-place-accumulation cases
    (SAGE and GIN training at hidden 256) and one real dataset."""
    cases = []
    for arch in ARCHS:
        for mode in MODES:
            hidden = 256 if arch in ("sage", "gin") and mode == "train" else 32
            cases.append(
                Case(arch, mode, 3, hidden, 2 if arch == "gat" else None,
                     {"nodes": 800, "edges": 6_000, "features": 24, "classes": 5})
            )
    cases.append(Case("gcn", "train", 2, 16, None, {"dataset": "cora"}, kind="real"))
    return cases


def run_case(case: Case, max_bytes: int | None = DEFAULT_MAX_BYTES) -> Result:
    from gnnsched.estimator import estimate
    from gnnsched.spec import parse_spec
    from gnnsched.worker import measure_step_peak_cpu

    spec = parse_spec(case.spec_dict())
    est = estimate(spec)
    while max_bytes is not None and est.pmc_bytes > max_bytes and case.hidden > 16:
        case.hidden //= 2
        spec = parse_spec(case.spec_dict())
        est = estimate(spec)
    cpu0 = time.process_time()
    wall0 = time.perf_counter()
    est = estimate(spec)
    wall_ms = (time.perf_counter() - wall0) * 1000
    cpu_ms = (time.process_time() - cpu0) * 1000
    measured = measure_step_peak_cpu(spec)
    return Result(
        case=case.label(),
        kind=case.kind,
        estimated=est.pmc_bytes,
        measured=measured,
        rel_error=(est.pmc_bytes - measured) / measured,
        estimate_wall_ms=wall_ms,
        estimate_cpu_ms=cpu_ms,
    )


@dataclass
class CudaResult:
    case: str
    kind: str
    reserved_predicted: int
    reserved_measured: int
    reserved_rel_error: float
    allocated_predicted: int
    allocated_measured: int
    allocated_rel_error: float


def measure_cuda(spec: Any, steps: int) -> tuple[int, int]:
    """(``max_memory_reserved``, ``max_memory_allocated``) of ``steps`` steps of ``spec`` on the current GPU, from an
    empty allocator: the graph made as the worker makes it and copied to the device, the model built there."""
    import gc

    import torch

    from gnnsched.models import build_model, make_graph
    from gnnsched.portable.step import run_step
    from gnnsched.worker import _serve_parallel, _StepInputs

    gc.collect()
    torch.cuda.synchronize()
    clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear_workspaces is not None:
        clear_workspaces()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    if torch.cuda.memory_reserved() != 0:
        raise RuntimeError(f"{torch.cuda.memory_reserved()} bytes still reserved before the case")
    torch.manual_seed(0)
    graph = make_graph(spec, 0)
    model = build_model(spec, graph=graph, device="cuda")
    inputs = _StepInputs(spec, graph, "cuda", 0)
    workers = spec.parallelism if spec.mode == "infer" else 1
    if workers == 1:
        stream = inputs.stream()
        for _ in range(steps):
            run_step(model, next(stream), spec.mode)
    else:
        _serve_parallel(model, inputs, workers * steps, workers, None)
    torch.cuda.synchronize()
    out = int(torch.cuda.max_memory_reserved()), int(torch.cuda.max_memory_allocated())
    del model, inputs, graph
    return out


def run_case_cuda(
    case: Case, steps: int, max_bytes: int | None = DEFAULT_MAX_BYTES, gpu_model: str | None = None
) -> CudaResult:
    """One case on the GPU; ``gpu_model`` names the catalogue entry whose cuBLAS workspace the estimate uses (the
    GPU in hand: the workspace differs between generations, 32 MiB on Hopper against 8 MiB before)."""
    from gnnsched.estimator import estimate
    from gnnsched.spec import parse_spec

    spec = parse_spec(case.spec_dict())
    est = estimate(spec, device="cuda", gpu_model=gpu_model)
    while max_bytes is not None and est.pmc_bytes > max_bytes and case.hidden > 16:
        case.hidden //= 2
        spec = parse_spec(case.spec_dict())
        est = estimate(spec, device="cuda", gpu_model=gpu_model)
    assert est.cuda_reserved_bytes is not None and est.cuda_allocated_bytes is not None
    reserved, allocated = measure_cuda(spec, steps)
    return CudaResult(
        case=case.label(),
        kind=case.kind,
        reserved_predicted=est.cuda_reserved_bytes,
        reserved_measured=reserved,
        reserved_rel_error=(est.cuda_reserved_bytes - reserved) / reserved,
        allocated_predicted=est.cuda_allocated_bytes,
        allocated_measured=allocated,
        allocated_rel_error=(est.cuda_allocated_bytes - allocated) / allocated,
    )


def main_cuda(args: argparse.Namespace) -> int:
    """``--device cuda``: the allocator model against the GPU's own statistics (see the module docstring)."""
    import torch

    if not torch.cuda.is_available():
        print("SKIPPED --device cuda: no CUDA device (torch.cuda.is_available() is False); the caching-allocator "
              "model is unmeasured on this machine")
        return 0
    from gnnsched.gpu.catalogue import get_gpu_model, match_device_name

    name = torch.cuda.get_device_name()
    model = match_device_name(name, torch.cuda.get_device_properties(0).total_memory)
    if args.gpu_model_given:
        model = get_gpu_model(args.gpu_model)
    if model is None:
        # The H200 once ran this bench on the default entry's constants and every case came out under-predicted.
        print(f"error: {name!r} is not in the catalogue (gnnsched/gpu/catalogue.py); add it, or pass --gpu-model "
              f"NAME to estimate with that entry's constants knowingly", file=sys.stderr)
        return 2
    gpu_model = model.name
    print(f"device: {name} (catalogue: {gpu_model}{'' if not args.gpu_model_given else ', by --gpu-model'}), CUDA "
          f"{torch.version.cuda}, steps per case {args.cuda_steps}")
    cases = _selected(args)
    results = []
    too_big = []
    for case in cases:
        try:
            r = run_case_cuda(case, args.cuda_steps, args.max_bytes, gpu_model)
        except torch.OutOfMemoryError as exc:  # the case does not fit this GPU: reported, not measured
            too_big.append(case.label())
            print(f"{case.label():58} does not fit this GPU: {str(exc).splitlines()[0][:120]}", flush=True)
            torch.cuda.empty_cache()
            continue
        results.append(r)
        print(f"{r.case:58} reserved est={r.reserved_predicted:>11} meas={r.reserved_measured:>11} "
              f"err={r.reserved_rel_error * 100:+7.2f}%  allocated est={r.allocated_predicted:>11} "
              f"meas={r.allocated_measured:>11} err={r.allocated_rel_error * 100:+7.2f}%  [{r.kind}]", flush=True)
    res = [r.reserved_rel_error for r in results]
    alloc = [r.allocated_rel_error for r in results]
    from gnnsched.estimator import DEFAULT_SAFETY_FACTOR_CUDA

    # The admission covers the reserved part with the safety factor; a case outside that margin would exceed its MPS
    # limit even with the context right.
    outside = [r.case for r in results if r.reserved_predicted * DEFAULT_SAFETY_FACTOR_CUDA < r.reserved_measured]
    summary = {
        "device": torch.cuda.get_device_name(),
        "catalogue_model": gpu_model,
        "cases": len(results),
        "did_not_fit": too_big,
        "reserved_under_predicted": sum(1 for e in res if e < 0),
        "reserved_worst_under_mib": min(r.reserved_predicted - r.reserved_measured for r in results) / 2**20,
        "outside_safety_factor": outside,
        "reserved_median_abs_rel_error": statistics.median(abs(e) for e in res),
        "reserved_most_under": min(res),
        "reserved_most_over": max(res),
        "allocated_median_abs_rel_error": statistics.median(abs(e) for e in alloc),
        "allocated_most_under": min(alloc),
        "allocated_most_over": max(alloc),
    }
    print(json.dumps(summary, indent=2))
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as fh:
            json.dump({"results": [asdict(r) for r in results], "summary": summary}, fh, indent=2)
    return 1 if outside else 0


def summarize(results: list[Result]) -> dict[str, Any]:
    errors = [r.rel_error for r in results if r.kind in ("grid", "real", "models")]
    bounds = [r for r in results if r.kind.endswith("-bound")]
    out: dict[str, Any] = {}
    if errors:
        out.update(
            cases=len(errors),
            median_abs_rel_error=statistics.median(abs(e) for e in errors),
            max_abs_rel_error=max(abs(e) for e in errors),
            most_under=min(errors),
            most_over=max(errors),
        )
    times = [r.estimate_wall_ms for r in results]
    cpu = [r.estimate_cpu_ms for r in results]
    out.update(
        estimate_wall_ms_median=statistics.median(times),
        estimate_wall_ms_max=max(times),
        estimate_cpu_ms_median=statistics.median(cpu),
        estimate_cpu_ms_max=max(cpu),
    )
    if bounds:
        out["bounds_hold"] = all(r.estimated >= r.measured for r in bounds)
        out["bound_ratios"] = {r.case: r.estimated / r.measured for r in bounds}
    return out


def time_large(layers: int = 10, hidden: int = 256) -> list[dict[str, Any]]:
    """Estimate time and host memory at 100 million edges (the estimator holds no real graph tensors)."""
    import resource

    from gnnsched.estimator import estimate
    from gnnsched.spec import parse_spec

    rows = []
    for arch in ARCHS:
        for mode in MODES:
            model: dict[str, Any] = {"arch": arch, "layers": layers, "hidden": hidden}
            if arch == "gat":
                model["heads"] = 4
            spec = parse_spec({"mode": mode, "model": model,
                               "graph": {"nodes": 10_000_000, "edges": 100_000_000, "features": 128, "classes": 40}})
            estimate(spec)
            cpu0, wall0 = time.process_time(), time.perf_counter()
            est = estimate(spec)
            rows.append({
                "case": f"{arch} {mode} L={layers} h={hidden} 100M edges",
                "pmc_gib": est.pmc_bytes / 2**30,
                "wall_ms": (time.perf_counter() - wall0) * 1000,
                "cpu_ms": (time.process_time() - cpu0) * 1000,
            })
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    for row in rows:
        row["process_max_rss_mib"] = rss / 2**20
    return rows


def check_splice(depths: tuple[int, ...] = (6, 8, 10, 12, 16)) -> tuple[int, list[str]]:
    """Spliced against full traces for every grid and bound case at each depth; returns (comparisons, problems)."""
    from gnnsched.estimator import SPLICE_DEPTH, trace_step
    from gnnsched.spec import parse_spec

    problems: list[str] = []
    count = 0
    for case in grid_cases() + bound_cases():
        for layers in depths:
            batching = case.batching
            if batching is not None:
                fanouts = list(batching["fanouts"])
                batching = {**batching, "fanouts": (fanouts * layers)[:layers]}
            deep = replace(case, layers=layers, batching=batching)
            spec = parse_spec(deep.spec_dict())
            for device in ("cpu", "cuda"):
                count += 1
                spliced, breakdown_s, peak_s = trace_step(spec, device=device)
                full, breakdown_f, peak_f = trace_step(spec, device=device, splice=False)
                same = (
                    spliced.traced_layers == SPLICE_DEPTH
                    and (peak_s, breakdown_s) == (peak_f, breakdown_f)
                    and spliced.peak(rounding=512)[0] == full.peak(rounding=512)[0]
                    and spliced.run_totals() == full.run_totals()
                )
                if not same:
                    problems.append(f"{deep.label()} {device}: spliced={spliced.traced_layers} "
                                    f"peak {peak_s} vs {peak_f}")
                    print(f"SPLICE MISMATCH {problems[-1]}", flush=True)
    return count, problems


_TABLE_ROW = re.compile(r"(?P<case>.*?)\s+reserved est=\s*(?P<rp>\d+) meas=\s*(?P<rm>\d+).*?"
                        r"allocated est=\s*(?P<ap>\d+) meas=\s*(?P<am>\d+)")


def measured_table(path: str | os.PathLike[str]) -> dict[str, tuple[int, int]]:
    """``{case label: (reserved, allocated)}`` measured by a past ``--device cuda`` run: its ``--json`` output, or
    its printed table (the rows ``<case> reserved est=.. meas=.. .. allocated est=.. meas=..``)."""
    text = Path(path).read_text(encoding="utf-8")
    if str(path).endswith(".json"):
        return {r["case"].strip(): (int(r["reserved_measured"]), int(r["allocated_measured"]))
                for r in json.loads(text)["results"]}
    rows = (_TABLE_ROW.match(line) for line in text.splitlines())
    return {m["case"].strip(): (int(m["rm"]), int(m["am"])) for m in rows if m}


def case_for_label(label: str) -> Case:
    """The bench case a printed label names, with the hidden size the run used (a case too big for ``--max-bytes``
    ran with its hidden size halved, and its label says so). ``KeyError`` when no case matches."""
    for case in grid_cases() + quick_cases() + model_cases() + bound_cases():
        hidden = case.hidden
        while True:
            candidate = replace(case, hidden=hidden)
            if candidate.label().strip() == label.strip():
                return candidate
            if hidden <= 16:
                break
            hidden //= 2
    raise KeyError(f"no bench case is labelled {label!r}")


def against(path: str, gpu_model: str) -> tuple[list[CudaResult], dict[str, Any]]:
    """Re-estimate, on this machine's CPU, every case a past GPU run measured (``measured_table``) with the current
    estimator and ``gpu_model``'s constants: how a change of the estimator moves it against real GPU figures without
    a GPU. Returns the per-case comparison and its summary."""
    from gnnsched.estimator import estimate
    from gnnsched.spec import parse_spec

    results = []
    for label, (reserved, allocated) in measured_table(path).items():
        case = case_for_label(label)
        est = estimate(parse_spec(case.spec_dict()), device="cuda", gpu_model=gpu_model)
        assert est.cuda_reserved_bytes is not None and est.cuda_allocated_bytes is not None
        results.append(CudaResult(
            case=label, kind=case.kind,
            reserved_predicted=est.cuda_reserved_bytes, reserved_measured=reserved,
            reserved_rel_error=(est.cuda_reserved_bytes - reserved) / reserved,
            allocated_predicted=est.cuda_allocated_bytes, allocated_measured=allocated,
            allocated_rel_error=(est.cuda_allocated_bytes - allocated) / allocated,
        ))
    res = [r.reserved_rel_error for r in results]
    alloc = [r.allocated_rel_error for r in results]
    under = [r for r in results if r.reserved_predicted < r.reserved_measured]
    summary = {
        "table": str(path), "gpu_model": gpu_model, "cases": len(results),
        "reserved_median_abs_rel_error": statistics.median(abs(e) for e in res),
        "reserved_under_predicted": [f"{r.case} ({(r.reserved_predicted - r.reserved_measured) / MiB:+.0f} MiB)"
                                     for r in under],
        "reserved_most_over": max(res), "allocated_median_abs_rel_error": statistics.median(abs(e) for e in alloc),
        "allocated_under_predicted": sum(1 for e in alloc if e < 0), "allocated_most_over": max(alloc),
    }
    return results, summary


def main_against(table: str, gpu_model: str) -> int:
    """``--against``: print the re-estimated cases and the summary; exit 1 when any case is under-predicted."""
    rows, summary = against(table, gpu_model)
    for row in rows:
        print(f"{row.case:58} reserved err={row.reserved_rel_error * 100:+7.2f}% "
              f"({(row.reserved_predicted - row.reserved_measured) / MiB:+6.0f} MiB)  "
              f"allocated err={row.allocated_rel_error * 100:+7.3f}%", flush=True)
    print(json.dumps(summary, indent=2))
    return 1 if summary["reserved_under_predicted"] or summary["allocated_under_predicted"] else 0


def _selected(args: argparse.Namespace) -> list[Case]:
    if args.models:
        return model_cases()
    if args.quick:
        return quick_cases()
    return grid_cases() + model_cases() + ([] if args.no_bounds else bound_cases())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="run only the CI slice")
    parser.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES, help="largest estimated peak to run")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1 is kind to a shared box)")
    parser.add_argument("--no-bounds", action="store_true", help="skip the parallel and mini-batch bound checks")
    parser.add_argument("--no-large", action="store_true", help="skip the 100M-edge timing")
    parser.add_argument("--json", dest="json_path", help="also write every result and the summary here")
    parser.add_argument("--check-splice", action="store_true", help="only compare spliced and full traces")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: compare the caching-allocator model with the GPU's reserved/allocated peaks")
    parser.add_argument("--cuda-steps", type=int, default=3, help="steps per case with --device cuda")
    parser.add_argument("--against", metavar="TABLE",
                        help="re-estimate on the CPU the cases a past --device cuda run measured (its --json or its "
                             "printed table, e.g. docs/measurements/h200-2026-11-28/pmc_accuracy_hopper_constants.txt)")
    parser.add_argument("--gpu-model", default=None,
                        help="with --against: the catalogue or NVML name of the GPU the table was measured on (default "
                             "H100-80GB); with --device cuda: the entry to estimate with instead of the GPU's own")
    parser.add_argument("--models", action="store_true",
                        help="only the PyG model classes and layer stacks (issue 30's graph), not the arch grid")
    args = parser.parse_args(argv)
    args.gpu_model_given = args.gpu_model is not None
    args.gpu_model = args.gpu_model or "H100-80GB"

    import torch

    torch.set_num_threads(args.threads)
    from gnnsched.models import pyg_backends

    print(f"torch {torch.__version__}, threads {args.threads}, PyG extensions: {pyg_backends()}")
    print(f"load average: {os.getloadavg()}")
    if args.device == "cuda":
        return main_cuda(args)
    if args.against:
        return main_against(args.against, args.gpu_model)
    if args.check_splice:
        count, problems = check_splice()
        print(f"splice check: {count} spliced traces compared with full traces, {len(problems)} differ")
        return 1 if problems else 0
    cases = _selected(args)
    results = []
    for case in cases:
        r = run_case(case, args.max_bytes)
        results.append(r)
        print(
            f"{r.case:58} est={r.estimated:>11} meas={r.measured:>11} err={r.rel_error * 100:+8.4f}% "
            f"est_time={r.estimate_wall_ms:6.1f}ms wall {r.estimate_cpu_ms:6.1f}ms cpu  [{r.kind}]",
            flush=True,
        )
    summary = summarize(results)
    large = [] if (args.quick or args.no_large) else time_large()
    for row in large:
        print(f"{row['case']:40} pmc={row['pmc_gib']:9.1f} GiB  estimate {row['wall_ms']:6.1f} ms wall "
              f"{row['cpu_ms']:6.1f} ms cpu  (process max RSS {row['process_max_rss_mib']:.0f} MiB)")
    print(f"load average: {os.getloadavg()}")
    print(json.dumps(summary, indent=2))
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as fh:
            json.dump({"results": [asdict(r) for r in results], "summary": summary, "large": large}, fh, indent=2)
    ok = summary.get("max_abs_rel_error", 0) <= 0.01 and summary.get("most_under", 0) >= -0.005
    return 0 if ok and summary.get("bounds_hold", True) else 1


if __name__ == "__main__":
    sys.exit(main())
