"""Measured runtime ground truth: real worker steps on a seeded grid of GNNJobs, at 1 and 2 CPU cores, and the
runtime prior refit on part of it.

    python bench/runtime_truth.py                       # measure 72 jobs at 1 and 2 cores, refit, write the table
    python bench/runtime_truth.py --jobs 8 --out /tmp/t.json --target-seconds 0.3   # a quick look
    python bench/runtime_truth.py --refit               # refit the shipped table's rows without measuring

What it does, per job of the grid (``grid``: built-in archs, PyG model classes and conv layers; sizes from a few
thousand to 40,000 nodes and 600,000 edges; train and infer; full-batch and mini-batch):

1. builds the graph and the model once, with the worker's own functions (``gnnsched.models``, and the worker's
   step inputs and ``gnnsched.portable.step.run_step``, so a step is exactly what a job's pod runs);
2. for each core count, pins this process to that many cores (``sched_setaffinity``, what a cgroup's cpuset does)
   and sets torch's intra-op threads to match, runs two warm-up steps (the first creates the optimizer's state),
   then times steps until ``--target-seconds`` have passed (at least 3, at most 200) and records the median
   seconds per step (a median, because the machine is shared: one step disturbed by another process does not move
   it) with the 1-minute load average beside it; a mini-batch job's sampler is also timed alone
   (``host_seconds_per_step``): the host work that a GPU pod's step waits on, at each core count;
3. counts the prior's work of one worker step (``gnnsched.runtime_prior.worker_step_cost``).

Then ``gnnsched.runtime_fit.evaluate`` fits the prior's five rates per core count on two jobs in three and reports
the held-out WMAPE per model class, and the held-out ratios (measured ÷ predicted) that ``gnnsched simulate
--runtime-error measured`` draws from; ``cpu_sensitivity`` gives the measured 2→1-core slowdown that the simulator
uses as a scaled job's true slowdown. The table goes to ``gnnsched/data/runtime_truth.json`` with the command that
made it; ``gnnsched.runtime_prior.CPU_RATES`` must then be set to the printed rates (``tests/test_runtime_truth.py``
fails until they agree).

With ``--device cuda`` (on a GPU machine) the rows are timed on the GPU, after a synchronize, and each row also
carries the GPU prior's prediction for that GPU model (``--gpu-model``); those rows are reported against the GPU
prior and are not used in the CPU fit. Not yet run: no GPU has been lent since this bench was written.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT_OUT = ROOT / "gnnsched" / "data" / "runtime_truth.json"

ARCHS = ("gcn", "sage", "gin", "gat")
PYG_CLASSES = ("GCN", "GraphSAGE", "GIN", "GAT")
CONV_LAYERS = ("GraphConv", "SGConv", "GATv2Conv", "LEConv")


def _pick(rng: np.random.Generator, values: tuple[Any, ...] | list[Any]) -> Any:
    return values[int(rng.integers(len(values)))]


def grid(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` GNNJob specs (manifest form), drawn from a generator seeded by ``seed``: the same list on every
    machine, so a GPU's rows line up with the CPU's."""
    rng = np.random.default_rng([0x7EE7, seed])
    specs: list[dict[str, Any]] = []
    while len(specs) < n:
        kind = _pick(rng, ("arch",) * 6 + ("pyg",) * 3 + ("conv",) * 2)
        model: dict[str, Any] = {"layers": int(_pick(rng, (2, 2, 3))),
                                 "hidden": int(_pick(rng, (16, 32, 64, 128, 256))), "dropout": 0.5}
        if kind == "arch":
            model["arch"] = _pick(rng, ARCHS)
            if model["arch"] == "gat":
                model["heads"] = int(_pick(rng, (1, 2, 4)))
                model["hidden"] = min(model["hidden"], 64)
        elif kind == "pyg":
            model["pyg"] = _pick(rng, PYG_CLASSES)
            if model["pyg"] == "GAT":
                model["options"] = {"heads": int(_pick(rng, (1, 2, 4)))}
                model["hidden"] = min(model["hidden"], 64)
        else:
            model["conv"] = _pick(rng, CONV_LAYERS)
        if rng.random() < 0.2:
            graph: dict[str, Any] = {"dataset": _pick(rng, ("cora", "citeseer"))}
        else:
            nodes = int(round(math.exp(rng.uniform(math.log(2000), math.log(30000)))))
            degree = int(_pick(rng, (3, 8, 16, 32)))
            graph = {"nodes": nodes, "edges": min(nodes * degree, 300_000),
                     "features": int(_pick(rng, (16, 64, 128, 256, 512))), "classes": int(_pick(rng, (4, 10, 40)))}
        spec: dict[str, Any] = {"mode": _pick(rng, ("train", "train", "train", "infer", "infer")), "model": model,
                                "graph": graph}
        if spec["mode"] == "train":
            spec["epochs"] = 1
        else:
            spec["requests"] = 1
        if model.get("arch") in ("sage", "gat") and rng.random() < 0.6:
            fanouts = [int(_pick(rng, (5, 10, 15))) for _ in range(model["layers"])]
            spec["batching"] = {"mode": "minibatch", "batchSize": int(_pick(rng, (64, 256, 1024))),
                                "fanouts": fanouts}
        specs.append(spec)
    return specs


def _pin(cores: int) -> None:
    """Every thread of this process on the first ``cores`` CPUs of its original set, torch at as many threads.

    Every thread, as ``taskset -a`` does: ``sched_setaffinity(0)`` moves the calling thread only, and torch's
    intra-op workers created while it was pinned to one CPU would otherwise stay there, two threads sharing one core
    (measured: a 2-thread step 7x slower than a 1-thread one)."""
    import torch

    chosen = set(sorted(_ORIGINAL_CPUS)[:cores])
    torch.set_num_threads(cores)
    for task in Path("/proc/self/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), chosen)
        except (ProcessLookupError, PermissionError):  # a thread that ended meanwhile
            continue


_ORIGINAL_CPUS: set[int] = set(os.sched_getaffinity(0))


def _time_steps(step: Any, target_s: float, sync: Any) -> tuple[float, int, float]:
    """(median seconds per call of ``step``, calls timed, mean) after warm-up: two calls (the first creates the
    optimizer's state), one when a call takes over a second. At least 3 calls are timed (2 when one takes over a
    second), at most 200, until ``target_s`` has passed."""
    t0 = time.perf_counter()
    step()
    sync()
    if time.perf_counter() - t0 < 1.0:
        step()
        sync()
    times: list[float] = []
    budget_start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
        least = 2 if times[0] > 1.0 else 3
        if len(times) >= 200 or (len(times) >= least and time.perf_counter() - budget_start >= target_s):
            break
    return statistics.median(times), len(times), statistics.fmean(times)


def measure_job(job: int, manifest: dict[str, Any], cores: list[int], device: str, target_s: float,
                gpu_model: str | None) -> list[dict[str, Any]]:
    """One row per core count for job ``job``."""
    import torch

    from gnnsched.model_catalog import check_model
    from gnnsched.models import build_model, make_graph
    from gnnsched.portable.step import run_step
    from gnnsched.runtime_prior import cost_family, device_seconds_per_step, step_counts, worker_step_cost
    from gnnsched.spec import GNNJobSpec
    from gnnsched.worker import _StepInputs

    spec = GNNJobSpec.model_validate(manifest)
    check_model(spec)
    torch.manual_seed(job)
    graph = make_graph(spec, job, None)
    model = build_model(spec, graph=graph, device=device)
    cost = worker_step_cost(spec)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rows = []
    order = cores if job % 2 == 0 else list(reversed(cores))  # alternate, so drift does not favour one count
    for c in order:
        _pin(c)
        stream = _StepInputs(spec, graph, device, job).stream()
        load = os.getloadavg()[0]
        median, n, mean = _time_steps(lambda s=stream: run_step(model, next(s), spec.mode), target_s, sync)
        host: float | None = None
        if spec.batching.mode == "minibatch":  # the sampler alone: the host work a GPU pod's step waits on
            batches = _StepInputs(spec, graph, "cpu", job).stream()
            host = _time_steps(lambda b=batches: next(b), target_s / 2, lambda: None)[0]
        row: dict[str, Any] = {
            "job": job, "cores": c, "device": device, "model_class": spec.model.model_class,
            "family": cost_family(spec), "mode": spec.mode, "batching": spec.batching.mode, "spec": manifest,
            "features": [float(f"{v:.6g}") for v in step_counts(cost)], "seconds_per_step": round(median, 7),
            "mean_seconds_per_step": round(mean, 7), "steps_timed": n, "load1": round(load, 2),
        }
        if host is not None:
            row["host_seconds_per_step"] = round(host, 7)
        if device == "cuda" and gpu_model:
            row["gpu_model"] = gpu_model
            row["prior_seconds_per_step"] = device_seconds_per_step(spec, gpu_model, cost)
        rows.append(row)
    _pin(max(cores))
    return rows


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The fit, the held-out figures and the CPU sensitivity of the CPU rows (``gnnsched.runtime_fit``)."""
    from dataclasses import asdict

    from gnnsched.runtime_fit import FEATURES, cpu_sensitivity, evaluate, wmape

    cpu_rows = [r for r in rows if r["device"] == "cpu"]
    out: dict[str, Any] = {}
    if cpu_rows:
        ev = evaluate(cpu_rows)
        out["fit"] = {"heldout": "jobs with job % 3 == 2", "features": list(FEATURES),
                      "rates": {str(c): asdict(r) for c, r in ev.rates.items()}}
        out["wmape"] = {"train": ev.wmape_train, "heldout": ev.wmape_heldout, "by_model_class": ev.wmape_by_class}
        out["heldout_residuals"] = ev.heldout_residuals
        out["cpu_sensitivity"] = cpu_sensitivity(cpu_rows)
    gpu_rows = [r for r in rows if r["device"] == "cuda" and "prior_seconds_per_step" in r]
    if gpu_rows:
        by: dict[str, tuple[list[float], list[float]]] = {}
        for r in gpu_rows:
            ms, ps = by.setdefault(f"{r['gpu_model']}.{r['model_class'].lower()}", ([], []))
            ms.append(r["seconds_per_step"])
            ps.append(r["prior_seconds_per_step"])
        out["gpu_prior_wmape"] = {k: round(wmape(*v), 4) for k, v in sorted(by.items())}
    return out


def _machine(device: str) -> dict[str, Any]:
    import torch

    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info: dict[str, Any] = {"cpu": cpu, "cpus": len(_ORIGINAL_CPUS), "torch": torch.__version__,
                            "python": platform.python_version()}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def _print(doc: dict[str, Any]) -> None:
    print(f"rows: {len(doc['rows'])}; jobs: {len({r['job'] for r in doc['rows']})}")
    for cores, rates in doc.get("fit", {}).get("rates", {}).items():
        shown = [f"{k}={v:.4g}" for k, v in rates.items() if not isinstance(v, dict)]
        shown += [f"bytes_per_s[{f}]={v:.4g}" for f, v in rates["bytes_per_s"].items()]
        print(f"rates at {cores} core(s): " + ", ".join(shown))
    if "wmape" in doc:
        w = doc["wmape"]
        print(f"WMAPE train {w['train']:.3f}, held-out {w['heldout']:.3f}")
        print(f"{'model class':<22}{'train':>8}{'held-out':>10}{'median m/p held-out':>22}")
        for cls, figs in w["by_model_class"].items():
            res = doc["heldout_residuals"].get(cls, [])
            med = f"{statistics.median(res):.2f} (n={len(res)})" if res else "-"
            print(f"{cls:<22}{figs.get('train', float('nan')):>8.3f}{figs.get('heldout', float('nan')):>10.3f}"
                  f"{med:>22}")
    for key, s in doc.get("cpu_sensitivity", {}).items():
        print(f"1 core vs 2, {key}: x{s['ratio_1_to_2_cores']:.2f} (alpha {s['alpha']:.2f}, {s['jobs']} jobs)")
    for key, v in doc.get("gpu_prior_wmape", {}).items():
        print(f"GPU prior WMAPE {key}: {v:.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=72, help="jobs in the seeded grid (default 72)")
    parser.add_argument("--seed", type=int, default=0, help="the grid's seed (default 0)")
    parser.add_argument("--cores", default="1,2", help="core counts to time each job at (default 1,2)")
    parser.add_argument("--target-seconds", type=float, default=1.0,
                        help="time steps for at least this long per job and core count (default 1.0)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--gpu-model", default=None,
                        help="with --device cuda: the catalogue GPU model (e.g. H100-80GB)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"the table (default {DEFAULT_OUT})")
    parser.add_argument("--append", action="store_true", help="keep the table's rows of other devices")
    parser.add_argument("--refit", action="store_true", help="measure nothing: refit the table's rows and rewrite it")
    args = parser.parse_args(argv)
    try:
        cores = sorted({int(c) for c in args.cores.split(",") if c.strip()})
    except ValueError:
        parser.error(f"--cores {args.cores!r}: expected comma-separated integers, e.g. 1,2")
    if not cores or min(cores) < 1 or max(cores) > len(_ORIGINAL_CPUS):
        parser.error(f"--cores {args.cores!r}: each must be 1..{len(_ORIGINAL_CPUS)} (this process may use "
                     f"{len(_ORIGINAL_CPUS)} CPUs)")
    if args.device == "cuda" and not args.gpu_model:
        parser.error("--device cuda needs --gpu-model (the catalogue name the prior predicts for)")
    if args.refit:
        doc = json.loads(args.out.read_text())
        doc.update(summarise(doc["rows"]))
    else:
        rows: list[dict[str, Any]] = []
        if args.append and args.out.exists():
            rows = [r for r in json.loads(args.out.read_text())["rows"] if r["device"] != args.device]
        started = time.time()
        for job, manifest in enumerate(grid(args.jobs, args.seed)):
            got = measure_job(job, manifest, cores, args.device, args.target_seconds, args.gpu_model)
            rows.extend(got)
            print(f"job {job:3d} {got[0]['model_class']:<16}{got[0]['mode']:<6}{got[0]['batching']:<10}"
                  + "  ".join(f"{r['cores']}c {r['seconds_per_step'] * 1e3:9.2f} ms" for r in got)
                  + f"  load {got[0]['load1']}", flush=True)
        doc = {
            "schema": 1,
            "command": "python bench/runtime_truth.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "wall_seconds": round(time.time() - started, 1),
            "machine": _machine(args.device),
            "rows": rows,
            **summarise(rows),
        }
    args.out.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    _print(doc)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
