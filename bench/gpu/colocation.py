#!/usr/bin/env python3
"""Measured slowdown of GNN jobs co-located on one GPU, against what ``gnnsched.interference`` predicts for them.

Why: the scheduler's interference model is fitted on Lucid's non-GNN jobs and reaches GNN jobs only through an
assumed mapping (arithmetic-intensity class -> a median Lucid profile). This bench measures what the mapping only
assumes. Each job runs alone, then in every pair and the triple, as real ``gnnsched worker --device cuda`` processes
started together (under MPS when the daemon's pipe directory is set in the environment, else time-sliced by the
driver: the output says which). A job's slowdown is its seconds per step co-located over its seconds per step alone;
the prediction is ``InterferenceModel.slowdown`` of its intensity class against its co-runners' classes.

Usage (a GPU node, repository root)::

    python bench/gpu/colocation.py [--steps 30] [--json out.json]

Prints one row per (group, job): measured and predicted slowdown, and the summary (median and worst absolute error,
and whether the model ranks the groups as measured). Exits 0 (a measurement, not a pass/fail check) unless a worker
fails; without a GPU it says so and exits 0 having measured nothing.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

JOBS: dict[str, dict[str, Any]] = {
    # a memory-bound sparse job, a denser compute-heavier one and an inference job: the classes the model separates
    "gcn-train": {"mode": "train", "model": {"arch": "gcn", "layers": 2, "hidden": 128},
                  "graph": {"nodes": 500_000, "edges": 10_000_000, "features": 128, "classes": 16}},
    "gin-train": {"mode": "train", "model": {"arch": "gin", "layers": 3, "hidden": 512},
                  "graph": {"nodes": 200_000, "edges": 2_000_000, "features": 256, "classes": 16}},
    "sage-infer": {"mode": "infer", "model": {"pyg": "GraphSAGE", "layers": 3, "hidden": 256},
                   "graph": {"nodes": 1_000_000, "edges": 15_000_000, "features": 128, "classes": 16}},
}


def _manifest(name: str, body: dict[str, Any], steps: int, folder: Path) -> Path:
    spec = dict(body)
    spec["epochs" if spec["mode"] == "train" else "requests"] = steps
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "gnnsched.io/v1alpha1", "kind": "GNNJob",
                                    "metadata": {"name": name}, "spec": spec}))
    return path


def _run_together(paths: list[Path]) -> list[float]:
    """Start the workers at once; each one's seconds per step from its result line (start-up excluded)."""
    procs = [subprocess.Popen([sys.executable, "-m", "gnnsched.cli", "worker", str(p), "--device", "cuda",
                               "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for p in paths]
    out = []
    for proc, path in zip(procs, paths, strict=True):
        stdout, stderr = proc.communicate(timeout=900)
        lines = [line for line in stdout.splitlines() if line.startswith("{")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"{path.stem}: worker exited {proc.returncode}: {stderr.strip()[-400:]}")
        result = json.loads(lines[-1])
        out.append(float(result["seconds"]) / max(1, int(result["steps"])))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="epochs (train) or requests (infer) per worker")
    parser.add_argument("--json", dest="json_path", help="also write the rows and the summary here")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("SKIPPED: no CUDA device; nothing measured")
        return 0
    from gnnsched.gpu.catalogue import DEFAULT_GPU_MODEL, match_device_name
    from gnnsched.interference import load_default
    from gnnsched.runtime_prior import intensity_class
    from gnnsched.spec import parse_spec

    name = torch.cuda.get_device_name()
    catalogue = match_device_name(name, torch.cuda.get_device_properties(0).total_memory)
    gpu_model = catalogue.name if catalogue is not None else DEFAULT_GPU_MODEL
    sharing = "MPS" if os.environ.get("CUDA_MPS_PIPE_DIRECTORY") else "time-slicing (no MPS pipe directory set)"
    print(f"device {name} ({gpu_model}), sharing: {sharing}, {args.steps} steps per worker")
    model = load_default()
    classes = {job: intensity_class(parse_spec(body), gpu_model) for job, body in JOBS.items()}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gnnsched-coloc-") as tmp:
        paths = {job: _manifest(job, body, args.steps, Path(tmp)) for job, body in JOBS.items()}
        solo = {job: _run_together([paths[job]])[0] for job in JOBS}
        groups = [g for size in (2, 3) for g in itertools.combinations(JOBS, size)]
        for group in groups:
            together = _run_together([paths[j] for j in group])
            for job, seconds in zip(group, together, strict=True):
                others = [model.profile_for(classes[o]) for o in group if o != job]
                predicted = model.slowdown(model.profile_for(classes[job]), others)
                rows.append({"group": "+".join(group), "job": job, "intensity": classes[job],
                             "solo_s_per_step": solo[job], "s_per_step": seconds,
                             "measured": seconds / solo[job], "predicted": predicted})
                print(f"{rows[-1]['group']:34} {job:11} ({classes[job]:7}) measured {rows[-1]['measured']:5.2f}x  "
                      f"predicted {predicted:5.2f}x", flush=True)
    errors = [abs(r["measured"] - r["predicted"]) for r in rows]
    by_group: dict[str, list[float]] = {}
    for r in rows:
        by_group.setdefault(r["group"], []).append(r["measured"])
    summary = {"device": name, "sharing": sharing, "rows": len(rows),
               "median_abs_error": statistics.median(errors), "worst_abs_error": max(errors),
               "measured_mean_slowdown_by_group": {g: statistics.mean(v) for g, v in by_group.items()}}
    print(json.dumps(summary, indent=2))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"rows": rows, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
