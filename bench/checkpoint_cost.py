"""What one checkpoint costs a job: the seconds ``gnnsched.portable.checkpoint.save`` takes (model, optimizer, step
and RNG state; write, fsync, rename) for the training jobs of the simulator's workloads, on this machine's disk.

The simulator's ``--checkpoint-write-seconds`` is a figure from here (docs/simulator.md, "Checkpoints"): the largest
save of the workloads' jobs, so every job is charged at least its own cost. It runs on the CPU: a GPU job's save
also copies each tensor to the host first (PCIe, GB/s), small beside the write for these models' megabytes.

    python bench/checkpoint_cost.py [--workloads "cognn-mix;gnnsched-mix-high;BURST"] [--seed 0] [--dir PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

import torch

from gnnsched.models import build_model, make_graph
from gnnsched.portable.checkpoint import path_in, save
from gnnsched.portable.step import run_step
from gnnsched.simulator.cli import default_data_dir
from gnnsched.simulator.workloads import resolve_workload
from gnnsched.spec import GraphSpec

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from closed_loop import BURST  # noqa: E402  (bench/ is not a package)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default=f"cognn-mix;gnnsched-mix-high;{BURST}")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", default=None, help="where to save (default: a temporary directory)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    data = default_data_dir()
    seen: dict[str, float] = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        for name in args.workloads.split(";"):
            wl = resolve_workload(name, args.seed, data)
            for t in wl.templates:
                spec = getattr(t, "spec", None)
                if spec is None or spec.mode != "train":
                    continue
                key = spec.model_dump_json(exclude={"epochs", "resources", "scaling"})
                if key in seen:
                    continue
                # the graph's dimensions set the model's first and last layers; a small graph with them
                dims = spec.graph.resolve()
                small = spec.model_copy(update={"graph": GraphSpec(nodes=64, edges=256, features=dims.features,
                                                                   classes=dims.classes)})
                graph = make_graph(small, 0, None)
                model = build_model(small, graph=graph)
                run_step(model, graph, "train")  # the optimizer's state exists after the first step
                optimizer = getattr(model, "optimizer", None)
                times = [save(directory, model, optimizer, 1) for _ in range(args.repeats)]
                size = os.path.getsize(path_in(directory))
                seen[key] = statistics.median(times)
                label = spec.model.model_class if hasattr(spec.model, "model_class") else "?"
                print(f"{short(name):18s} {label:24s} hidden {spec.model.hidden:5d} layers {spec.model.layers} "
                      f"{size / 2**20:8.2f} MiB  save {seen[key] * 1000:8.1f} ms", flush=True)
    print(f"largest save {max(seen.values()):.4f} s over {len(seen)} distinct models; torch {torch.__version__}")


def short(name: str) -> str:
    return name if len(name) <= 18 else "burst"


if __name__ == "__main__":
    main()
