#!/usr/bin/env python3
"""Warm latency of ``gnnsched.estimator.estimate`` for the heaviest models, against the 150 ms bound of issue 2.

Cases (``--set archs``): every built-in architecture in train and infer at the accuracy grid's largest depth (10
layers) and the spec's largest (16), hidden 256, GAT with 4 heads, on a 5-million-node, 100-million-edge graph (the
graph's size costs nothing: the trace holds no data), plus the real Cora graph. ``--set models``: every PyG model
class (``spec.model.pyg``) and every layer the README lists (``spec.model.conv``) with their common options, 3 layers
of 256, train and infer, on a 1-million-node, 10-million-edge graph (issue 30's bound). ``--set all`` (default) runs
both. Each case is estimated once to warm up, then
``--repeat`` times; the row shows the median and the minimum of wall and process CPU time, beside the load average
at that moment (the machine may be shared: a load above the core count inflates wall time, CPU time less so).

The exit status is 1 when the worst case's median exceeds ``--limit-ms`` (150 by default), measured in process CPU
time by default (``--clock wall`` for wall time, right on a quiet machine).

``--baseline PATH`` times another copy of ``gnnsched/estimator.py`` (for example the previous commit's, from
``git show HEAD~1:gnnsched/estimator.py > /tmp/old.py``) in the same run, side by side, and checks that both give
the same ``pmc_bytes`` and ``admit_bytes``.

Usage::

    python bench/estimate_latency.py
    python bench/estimate_latency.py --baseline /tmp/old_estimator.py --repeat 7
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from typing import Any

ARCHS = ("gcn", "sage", "gin", "gat")
MODES = ("train", "infer")
BIG_GRAPH = {"nodes": 5_000_000, "edges": 100_000_000, "features": 128, "classes": 40}


MEDIUM_GRAPH = {"nodes": 1_000_000, "edges": 10_000_000, "features": 128, "classes": 40}
MODELS: list[dict[str, Any]] = [
    {"pyg": "GCN"},
    {"pyg": "GraphSAGE", "options": {"aggr": "max"}},
    {"pyg": "GIN", "options": {"jk": "cat", "norm": "batch_norm"}},
    {"pyg": "GAT", "options": {"heads": 4, "v2": True}},
    {"pyg": "PNA", "options": {"aggregators": ["mean", "min", "max", "std"],
                               "scalers": ["identity", "amplification", "attenuation"]}},
    {"pyg": "EdgeCNN"},
    {"conv": "TransformerConv", "options": {"heads": 4}},
    {"conv": "GATv2Conv", "options": {"heads": 4}},
    {"conv": "GENConv", "options": {"aggr": "softmax", "learn_t": True}},
    {"conv": "ResGatedGraphConv"},
    {"conv": "GraphConv"},
    {"conv": "SGConv", "options": {"K": 2}},
]


def model_cases() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for model in MODELS:
        name = model.get("pyg") or model.get("conv")
        for mode in MODES:
            body = {"mode": mode, "model": {**model, "layers": 3, "hidden": 256}, "graph": dict(MEDIUM_GRAPH)}
            out.append((f"{name} {mode} L=3 h=256 10M edges", body))
    return out


def cases(which: str = "all") -> list[tuple[str, dict[str, Any]]]:
    if which == "models":
        return model_cases()
    out = []
    for layers in (10, 16):
        for arch in ARCHS:
            for mode in MODES:
                model: dict[str, Any] = {"arch": arch, "layers": layers, "hidden": 256}
                if arch == "gat":
                    model["heads"] = 4
                out.append((f"{arch} {mode} L={layers} h=256 100M edges", {"mode": mode, "model": model,
                                                                           "graph": dict(BIG_GRAPH)}))
    out.append(("gcn train L=2 h=16 cora", {"mode": "train", "model": {"arch": "gcn", "layers": 2, "hidden": 16},
                                            "graph": {"dataset": "cora"}}))
    return out + model_cases() if which == "all" else out


def load_estimator(path: str) -> Any:
    """Import an estimator module from a file (a baseline copy); it uses the installed ``gnnsched`` package."""
    spec = importlib.util.spec_from_file_location("baseline_estimator", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["baseline_estimator"] = module
    spec.loader.exec_module(module)
    return module


def time_estimate(estimate: Any, spec: Any, repeat: int) -> dict[str, Any]:
    result = estimate(spec)  # warm-up: first-use costs (lazy imports, PyG templates) are not per estimate
    walls, cpus = [], []
    for _ in range(repeat):
        cpu0, wall0 = time.process_time(), time.perf_counter()
        result = estimate(spec)
        walls.append((time.perf_counter() - wall0) * 1000)
        cpus.append((time.process_time() - cpu0) * 1000)
    return {
        "wall_median": statistics.median(walls),
        "wall_min": min(walls),
        "cpu_median": statistics.median(cpus),
        "cpu_min": min(cpus),
        "pmc_bytes": result.pmc_bytes,
        "admit_bytes": result.admit_bytes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed estimates per case (after one warm-up)")
    parser.add_argument("--limit-ms", type=float, default=150.0, help="bound on the worst case's median")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu", help="which median the bound applies to")
    parser.add_argument("--baseline", help="another estimator.py to time side by side")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--set", dest="which", choices=("all", "archs", "models"), default="all",
                        help="built-in archs, PyG model classes and layers, or both")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from gnnsched.estimator import estimate
    from gnnsched.spec import parse_spec

    baseline = load_estimator(args.baseline).estimate if args.baseline else None
    print(f"torch {torch.__version__}, threads {args.threads}, cores {os.cpu_count()}, repeat {args.repeat}")
    header = f"{'case':40} {'wall med/min ms':>16} {'cpu med/min ms':>16}"
    if baseline:
        header += f" | {'baseline wall med':>17} {'cpu med':>8}  same"
    print(header + "   load(1m)")
    worst = 0.0
    same = True
    for label, body in cases(args.which):
        spec = parse_spec(body)
        row = time_estimate(estimate, spec, args.repeat)
        worst = max(worst, row[f"{args.clock}_median"])
        line = (f"{label:40} {row['wall_median']:7.1f}/{row['wall_min']:6.1f}   "
                f"{row['cpu_median']:7.1f}/{row['cpu_min']:6.1f}  ")
        if baseline:
            base = time_estimate(baseline, spec, args.repeat)
            agree = (base["pmc_bytes"], base["admit_bytes"]) == (row["pmc_bytes"], row["admit_bytes"])
            same = same and agree
            line += f" | {base['wall_median']:17.1f} {base['cpu_median']:8.1f}  {'yes' if agree else 'NO'}"
        print(f"{line}   {os.getloadavg()[0]:.2f}", flush=True)
    verdict = "ok" if worst <= args.limit_ms else "OVER"
    print(f"worst median ({args.clock}): {worst:.1f} ms, limit {args.limit_ms:.0f} ms: {verdict}; "
          f"load average {os.getloadavg()}")
    if baseline and not same:
        print("baseline and current estimates DIFFER")
    return 0 if worst <= args.limit_ms and same else 1


if __name__ == "__main__":
    sys.exit(main())
