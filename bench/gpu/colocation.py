#!/usr/bin/env python3
"""Measured slowdown of GNN jobs co-located on one GPU, against what ``gnnsched.colocation.interference`` predicts for
them.

Why: the scheduler's interference model is fitted on Lucid's non-GNN jobs and reaches GNN jobs only through an
assumed mapping (arithmetic-intensity class -> a median Lucid profile). This bench measures what the mapping only
assumes. Each job runs alone, then in every group of the chosen sizes, as real ``gnnsched worker --device cuda``
processes started together, under one sharing mode per run:

- ``mps``: the clients use the MPS control daemon whose pipe directory is ``$CUDA_MPS_PIPE_DIRECTORY`` (as deployed:
  ``bench/gpu/validate`` starts one and sets it); without a daemon listening there the mode is SKIP;
- ``time-slicing``: the clients are pointed at an empty pipe directory, so no daemon (not even a system one in
  ``/tmp/nvidia-mps``) serves them and the driver time-slices their contexts.

``--active-thread-percentage P`` (``mps`` only) gives every client ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=P``, as the
node agent sets it at admission, and keys its solo runs and rows as mode ``mps@P``: a class's seconds per step alone at
``mps@P`` over alone at ``mps`` is what a share of ``P`` % costs it, the measurement the gate would choose per-client
shares from (issue 37 item 4: each member's latency under its share within its QoS target); pairs at ``mps@50`` are
two clients split down the middle. Without the option the clients get no percentage (the daemon's default, 100).

A job's slowdown is its seconds per step co-located over its seconds per step alone in the same mode (both from the
worker's result line, start-up excluded); the prediction is ``InterferenceModel.slowdown`` of its intensity class
against its co-runners' classes. ``overlap`` is the part of a job's steps during which every co-runner was stepping
too (from when each result line arrived): a low overlap means the start-ups, not the steps, were co-located.

Budget: ``--budget`` seconds for the whole invocation. Unless ``--steps`` is given, the steps per worker are sized
from it (at least 20), once per JSON file: every later run, in either mode, has the same steps, so that a job's solo
and co-located seconds per step carry the same share of the first step's warm-up. Once a mode's solo runs are known,
a group run whose expected time (slowest start-up plus twice the longest solo step phase) no longer fits the budget
left is printed as SKIP, never started; a run that still overruns is killed at the budget's end. Every row is
printed when measured, and the JSON file is rewritten after every run, so a run cut short keeps what it measured.
Solo results are kept in the JSON per mode and reused: call it once with ``--sizes 2`` and once with ``--sizes 3``
and the triple reuses the pairs' solo runs.

Usage (a GPU node, gnnsched installed; ``bench/gpu/validate`` runs it for both modes)::

    python bench/gpu/colocation.py --mode time-slicing [--sizes 2,3] [--budget 120] [--steps N] [--json out.json]
    python bench/gpu/colocation.py --mode mps --active-thread-percentage 50 --sizes 2 [--json out.json]

Exit status: 0 when something was measured (skipped groups are listed), 5 with a ``SKIP:`` line when nothing could
be (no GPU, no MPS daemon for ``--mode mps``, no time), 1 when a worker failed.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

SKIP_EXIT = 5  # bench/gpu/validate reads this status as SKIP, with the reason from the last "SKIP:" line
MODES = ("mps", "time-slicing")

JOBS: dict[str, dict[str, Any]] = {
    # a memory-bound sparse job, a denser compute-heavier one and an inference job: the classes the model separates
    "gcn-train": {"mode": "train", "model": {"arch": "gcn", "layers": 2, "hidden": 128},
                  "graph": {"nodes": 500_000, "edges": 10_000_000, "features": 128, "classes": 16}},
    "gin-train": {"mode": "train", "model": {"arch": "gin", "layers": 3, "hidden": 512},
                  "graph": {"nodes": 200_000, "edges": 2_000_000, "features": 256, "classes": 16}},
    "sage-infer": {"mode": "infer", "model": {"pyg": "GraphSAGE", "layers": 3, "hidden": 256},
                   "graph": {"nodes": 1_000_000, "edges": 15_000_000, "features": 128, "classes": 16}},
}

# Sizing before anything is measured: the H200 run (20 steps per worker) took 15-25 s per run, most of it start-up.
STARTUP_GUESS_S = 15.0
STEP_GUESS_S = 0.05
MIN_STEPS, MAX_STEPS = 20, 2000
GROUP_MARGIN = 2.0  # a group's steps may take this many times their solo time (the slowdown plus noise)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=MODES, default="time-slicing", help="how the GPU is shared")
    parser.add_argument("--sizes", default="2,3", help="group sizes to run, comma-separated (2: pairs, 3: the triple)")
    parser.add_argument("--budget", type=float, default=600.0, help="seconds for this invocation, every run included")
    parser.add_argument("--steps", type=int, help="epochs (train) or requests (infer) per worker (default: sized "
                                                  "from the budget)")
    parser.add_argument("--json", dest="json_path", type=Path, help="rows, solo runs and summary (merged into an "
                                                                    "existing file's)")
    parser.add_argument("--active-thread-percentage", type=int, metavar="P",
                        help="mps only: every client's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (1-100); rows and solo runs "
                             "are keyed mps@P")
    args = parser.parse_args(argv)
    share = args.active_thread_percentage
    if share is not None and args.mode != "mps":
        parser.error("--active-thread-percentage: only with --mode mps (time-slicing has no per-client share)")
    if share is not None and not 1 <= share <= 100:
        parser.error(f"--active-thread-percentage: a percentage from 1 to 100, not {share}")
    args.key = args.mode if share is None else f"mps@{share}"
    try:
        args.sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    except ValueError:
        parser.error(f"--sizes: comma-separated integers, not {args.sizes!r}")
    if not args.sizes or any(s < 2 or s > len(JOBS) for s in args.sizes):
        parser.error(f"--sizes: group sizes from 2 to {len(JOBS)}")
    return args


def groups(sizes: list[int]) -> list[tuple[str, ...]]:
    """Every group of the given sizes, smaller groups first (pairs are cheaper and tell more per second)."""
    return [g for size in sorted(sizes) for g in itertools.combinations(JOBS, size)]


def mps_problem(env: dict[str, str]) -> str | None:
    """Why ``--mode mps`` cannot run here, or None: a client pointed at a pipe directory with no control daemon in it
    silently runs without MPS, which would be measured as MPS."""
    pipe = env.get("CUDA_MPS_PIPE_DIRECTORY")
    if not pipe:
        return "no MPS daemon: CUDA_MPS_PIPE_DIRECTORY is not set (bench/gpu/validate starts one and sets it)"
    if not Path(pipe, "control").exists():
        return f"no MPS control daemon listening in {pipe} (no 'control' socket there)"
    return None


def worker_env(mode: str, base: dict[str, str], empty_pipe: Path, share: int | None = None) -> dict[str, str]:
    """The workers' environment for a sharing mode. Time-slicing points the clients at an empty pipe directory, so
    that no MPS daemon (not even a system one at the default ``/tmp/nvidia-mps``) takes them. ``share``: every MPS
    client's active-thread percentage (none: the daemon's default)."""
    env = dict(base)
    for name in ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"):
        env.pop(name, None)  # as validate deploys them: every client may use the whole GPU
    if mode == "time-slicing":
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(empty_pipe)
    elif share is not None:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(share)
    return env


def worker_command(manifest: Path) -> list[str]:
    """A real worker, as the installed package runs it (its steps are in the manifest)."""
    return [sys.executable, "-m", "gnnsched.cli", "worker", str(manifest), "--device", "cuda", "--no-progress"]


def _manifest(name: str, body: dict[str, Any], steps: int, folder: Path) -> Path:
    spec = dict(body)
    spec["epochs" if spec["mode"] == "train" else "requests"] = steps
    path = folder / f"{name}-{steps}.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "gnnsched.io/v1alpha1", "kind": "GNNJob",
                                    "metadata": {"name": name}, "spec": spec}))
    return path


@dataclass
class Run:
    """One worker's outcome: seconds per step, start-up (wall time outside the steps), and when its steps ran."""

    job: str
    steps: int
    s_per_step: float
    startup_s: float
    step_start: float
    step_end: float


@dataclass
class _Proc:
    job: str
    proc: subprocess.Popen[str]
    started: float
    lines: list[str] = field(default_factory=list)
    result_at: float | None = None


def _kill(proc: subprocess.Popen[str]) -> None:
    """The worker and anything it started (its own session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def run_together(jobs: list[tuple[str, Path, int]], env: dict[str, str], timeout: float) -> list[Run]:
    """Start the workers at once and wait at most ``timeout`` seconds for all of them; each one's seconds per step
    from its result line. Raises TimeoutError (every worker killed) or RuntimeError (a worker failed)."""
    procs: list[_Proc] = []
    for job, manifest, _ in jobs:
        p = subprocess.Popen(worker_command(manifest), env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
        procs.append(_Proc(job, p, time.monotonic()))

    def read(item: _Proc) -> None:
        assert item.proc.stdout is not None
        for line in item.proc.stdout:
            item.lines.append(line)
            if line.startswith("{") and item.result_at is None:
                item.result_at = time.monotonic()

    readers = [threading.Thread(target=read, args=(item,), daemon=True) for item in procs]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + timeout
    try:
        for item in procs:
            try:
                item.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise TimeoutError(f"workers still running after {timeout:.0f} s: "
                                   f"{', '.join(i.job for i in procs if i.proc.poll() is None)}") from None
    finally:
        for item in procs:
            _kill(item.proc)
        for reader in readers:
            reader.join(5)
    runs = []
    for item, (_, _, steps) in zip(procs, jobs, strict=True):
        results = [line for line in item.lines if line.startswith("{")]
        if item.proc.returncode != 0 or not results or item.result_at is None:
            tail = "".join(item.lines)[-600:].strip()
            raise RuntimeError(f"{item.job}: worker exited {item.proc.returncode}: {tail}")
        result = json.loads(results[-1])
        seconds = float(result["seconds"])
        done = int(result.get("steps") or steps)
        runs.append(Run(item.job, done, seconds / max(1, done), item.result_at - item.started - seconds,
                        item.result_at - seconds, item.result_at))
    return runs


def overlap(run: Run, others: list[Run]) -> float:
    """The part of ``run``'s step phase during which every co-runner was stepping too (0..1)."""
    length = run.step_end - run.step_start
    if length <= 0:
        return 0.0
    start = max([run.step_start] + [o.step_start for o in others])
    end = min([run.step_end] + [o.step_end for o in others])
    return max(0.0, end - start) / length


def size_steps(budget: float, runs_left: int, fixed: int | None) -> int:
    """Steps per worker: ``--steps``, else what lets every run left fit the budget by the guesses above, at least the
    H200 run's 20. Chosen once per JSON file and kept for every later run and mode: a job's solo and co-located runs
    must have the same steps, or the first step's warm-up weighs differently in the two and biases the slowdown."""
    if fixed is not None:
        return fixed
    per_run = budget / max(1, runs_left)
    return min(MAX_STEPS, max(MIN_STEPS, int((per_run - STARTUP_GUESS_S) / (GROUP_MARGIN * STEP_GUESS_S))))


def expected_seconds(jobs: tuple[str, ...], solo: dict[str, dict[str, float]]) -> float:
    """What a group run should take: the slowest start-up plus the longest solo step phase times the margin."""
    return max(solo[j]["startup_s"] for j in jobs) + GROUP_MARGIN * max(
        solo[j]["steps"] * solo[j]["s_per_step"] for j in jobs)


def _gpu() -> tuple[str, int] | str:
    """GPU 0's name and memory from NVML (the parent never touches CUDA: it must not be a client itself), or why
    there is none."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            name = pynvml.nvmlDeviceGetName(handle)
            total = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # noqa: BLE001 - no library, no driver or no device: all mean no GPU here
        return f"{type(exc).__name__}: {exc}"
    return (name.decode() if isinstance(name, bytes) else str(name)), total


def _load(path: Path | None) -> dict[str, Any]:
    if path is not None and path.is_file():
        try:
            data = json.loads(path.read_text())
            if isinstance(data, dict):
                return data
        except ValueError:
            pass
    return {}


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode in dict.fromkeys(r["mode"] for r in rows):  # mps, time-slicing and any mps@P, in the order measured
        mine = [r for r in rows if r["mode"] == mode]
        errors = [abs(r["measured"][j] - r["predicted"][j]) for r in mine for j in r["jobs"]]
        if errors:
            out[mode] = {"groups": len(mine), "median_abs_error": statistics.median(errors),
                         "worst_abs_error": max(errors),
                         "measured_mean_slowdown_by_group": {
                             "+".join(r["jobs"]): statistics.mean(r["measured"].values()) for r in mine}}
    return out


def share_costs(solo_by_mode: dict[str, dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Per ``mps@P`` key, each job's seconds per step alone at ``P`` % over alone under plain ``mps``: what running at
    that share costs it (1.0: the job never used more of the GPU). Jobs without both solo runs are left out."""
    plain = solo_by_mode.get("mps", {})
    return {key: {job: run["s_per_step"] / plain[job]["s_per_step"] for job, run in runs.items()
                  if job in plain and plain[job]["s_per_step"] > 0}
            for key, runs in solo_by_mode.items() if key.startswith("mps@")}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    deadline = started + args.budget
    gpu = _gpu()
    if isinstance(gpu, str):
        print(f"SKIP: no GPU ({gpu}); nothing measured", flush=True)
        return SKIP_EXIT
    if args.mode == "mps" and (problem := mps_problem(dict(os.environ))):
        print(f"SKIP: {problem}", flush=True)
        return SKIP_EXIT
    name, total = gpu
    from gnnsched.colocation.interference import load_default
    from gnnsched.colocation.measured import job_class
    from gnnsched.gpu.catalogue import DEFAULT_GPU_MODEL, match_device_name
    from gnnsched.runtime_prior import intensity_class
    from gnnsched.spec import parse_spec

    catalogue = match_device_name(name, total)
    gpu_model = catalogue.name if catalogue is not None else DEFAULT_GPU_MODEL
    model = load_default(gpu_model)
    # the model's classes: <intensity>-<mode> (gnnsched.colocation.measured; issue 37)
    classes = {job: job_class(intensity_class(parse_spec(body), gpu_model), str(body["mode"]))
               for job, body in JOBS.items()}
    data = _load(args.json_path)
    if args.steps is not None and data.get("steps") not in (None, args.steps):
        data["solo"] = {}  # measured with other steps: not comparable with this run's
    data.update(device=name, gpu_model=gpu_model)
    rows: list[dict[str, Any]] = [r for r in data.get("rows", []) if isinstance(r, dict) and "mode" in r]
    skipped: list[dict[str, Any]] = list(data.get("skipped", []))
    solo_by_mode: dict[str, dict[str, dict[str, float]]] = data.setdefault("solo", {})
    solo = solo_by_mode.setdefault(args.key, {})
    todo = groups(args.sizes)

    def save() -> None:
        data.update(rows=rows, skipped=skipped, summary=_summary(rows), share_cost=share_costs(solo_by_mode))
        if args.json_path is not None:
            args.json_path.write_text(json.dumps(data, indent=2))

    def skip(what: str, why: str) -> None:
        skipped.append({"mode": args.key, "what": what, "reason": why})
        print(f"[{args.key}] SKIP {what}: {why}", flush=True)
        save()

    print(f"device {name} ({gpu_model}), sharing: {args.key}, groups: {', '.join('+'.join(g) for g in todo)}, "
          f"budget {args.budget:.0f} s", flush=True)
    measured = 0
    missing: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gnnsched-coloc-") as tmp:
        folder = Path(tmp)
        empty_pipe = folder / "no-mps"
        empty_pipe.mkdir()
        env = worker_env(args.mode, dict(os.environ), empty_pipe, args.active_thread_percentage)
        missing = [job for job in JOBS if job not in solo]
        if "steps" not in data or args.steps is not None:
            data["steps"] = size_steps(deadline - time.monotonic(), len(missing) + len(todo), args.steps)
        steps = int(data["steps"])
        print(f"[{args.key}] {steps} steps per worker", flush=True)
        for job in missing:
            left = deadline - time.monotonic()
            if left < STARTUP_GUESS_S:
                skip(f"solo {job}", f"{left:.0f} s left of the budget")
                continue
            try:
                run = run_together([(job, _manifest(job, JOBS[job], steps, folder), steps)], env, left)[0]
            except TimeoutError as exc:
                skip(f"solo {job}", f"out of budget: {exc}")
                break
            except RuntimeError as exc:
                print(f"[{args.key}] FAIL solo {exc}", flush=True)
                save()
                return 1
            solo[job] = {"s_per_step": run.s_per_step, "startup_s": run.startup_s, "steps": run.steps}
            cost = share_costs(solo_by_mode).get(args.key, {}).get(job)
            print(f"[{args.key}] solo {job:11} {run.steps:5} steps  {run.s_per_step * 1000:8.2f} ms/step  "
                  f"start-up {run.startup_s:5.1f} s" + (f"  {cost:5.2f}x its time under mps" if cost else ""),
                  flush=True)
            save()
        for group in todo:
            what = "+".join(group)
            if any(job not in solo for job in group):
                skip(what, "a member's solo run is missing")
                continue
            left = deadline - time.monotonic()
            need = expected_seconds(group, solo)
            if need > left:
                skip(what, f"needs about {need:.0f} s, {left:.0f} s left of the budget")
                continue
            try:
                runs = run_together([(j, _manifest(j, JOBS[j], steps, folder), steps) for j in group], env,
                                    min(left, 3 * need))
            except TimeoutError as exc:
                skip(what, f"timed out: {exc}")
                continue
            except RuntimeError as exc:
                print(f"[{args.key}] FAIL {what}: {exc}", flush=True)
                save()
                return 1
            row: dict[str, Any] = {"mode": args.key, "jobs": list(group), "steps": {}, "s_per_step": {},
                                   "solo_s_per_step": {}, "measured": {}, "predicted": {}, "overlap": {},
                                   "intensity": {j: classes[j] for j in group}}
            for run in runs:
                others = [r for r in runs if r is not run]
                predicted = model.slowdown(model.profile_for(classes[run.job]),
                                           [model.profile_for(classes[o.job]) for o in others])
                row["steps"][run.job] = run.steps
                row["s_per_step"][run.job] = run.s_per_step
                row["solo_s_per_step"][run.job] = solo[run.job]["s_per_step"]
                row["measured"][run.job] = run.s_per_step / solo[run.job]["s_per_step"]
                row["predicted"][run.job] = predicted
                row["overlap"][run.job] = round(overlap(run, others), 3)
            rows.append(row)
            measured += 1
            for job in group:
                print(f"[{args.key}] {what:34} {job:11} ({classes[job]:13}) measured {row['measured'][job]:5.2f}x  "
                      f"predicted {row['predicted'][job]:5.2f}x  overlap {row['overlap'][job]:4.2f}", flush=True)
            save()
    save()
    print(json.dumps({"mode": args.key, "measured_groups": measured, "skipped": len(skipped),
                      "summary": data["summary"].get(args.key),
                      "share_cost": data["share_cost"].get(args.key)}), flush=True)
    if measured == 0 and not any(job in missing and job in solo for job in JOBS):
        reason = skipped[-1]["reason"] if skipped else "no group to run"
        print(f"SKIP: nothing measured under {args.key} within {args.budget:.0f} s ({reason})", flush=True)
        return SKIP_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
