"""Operator throughput: N GNNJobs created at once against the emulated API server; time until every job has a pod.

Runs the real operator (``gnnsched operator`` in its own process: kopf watch loop, handlers, real
estimator/predictor/scaling) against the kmock emulator used by the tests, waits for a warm-up job's pod (start-up
is not throughput), creates N jobs concurrently, and reports:

* the time from the first create until every job has its pod, and the per-job latency percentiles;
* pods per job (must be exactly one each) and pod-create requests seen by the API server (409s included);
* the phases the jobs ended in;
* the load average, because the machine may be shared.

Usage::

    .venv/bin/python bench/operator_throughput.py [--jobs 200] [--distinct 60] [--workers 8] [--deadline 60]

Exit status 0 when every job got exactly one pod within ``--deadline`` seconds, else 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

ARCHS = ("gcn", "sage", "gin", "gat")
DATASETS = ("cora", "citeseer", "pubmed")
HIDDEN = (16, 32, 64, 128, 256)


def job_manifest(i: int, distinct: int) -> dict[str, Any]:
    """Job ``i``; its model/graph (what the GPU-memory estimate depends on) is variant ``i % distinct``."""
    variant = i % distinct  # jobs sharing a variant share one trace (the operator's estimate cache)
    arch = ARCHS[variant % len(ARCHS)]
    dataset = DATASETS[(variant // len(ARCHS)) % len(DATASETS)]
    hidden = HIDDEN[(variant // (len(ARCHS) * len(DATASETS))) % len(HIDDEN)]
    layers = 2 + (variant // (len(ARCHS) * len(DATASETS) * len(HIDDEN))) % 3
    model: dict[str, Any] = {"arch": arch, "layers": layers, "hidden": hidden}
    if arch == "gat":
        model["heads"] = 4
    return {
        "apiVersion": "gnnsched.io/v1alpha1",
        "kind": "GNNJob",
        "metadata": {"name": f"bench-{i:04d}"},
        "spec": {"mode": "train", "model": model, "graph": {"dataset": dataset}, "epochs": 50 + i,
                 "resources": {"cpu": "4", "memory": "8Gi"}},
    }


async def run(args: argparse.Namespace) -> int:
    from operator_harness import emulated_cluster, wait_for

    pod_creates = 0

    async def count(request: Any) -> None:
        nonlocal pod_creates
        if request.method == "POST" and request.resource is not None and request.resource.plural == "pods":
            pod_creates += 1

    with tempfile.TemporaryDirectory() as tmp:
        async with emulated_cluster(Path(tmp)) as cluster:
            cluster.k8s.before_write = count
            await cluster.add_gpunode("node-a", [{
                "index": 0, "uuid": "GPU-0", "model": "A100-40GB", "totalBytes": 40 * 2**30,
                "reserveBytes": 2**30}])
            # The operator is its own process, as in a cluster: it must not share a GIL with the API server.
            log_path = Path(tmp) / "operator.log"
            log_file = log_path.open("wb")
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-P",
                "-m",
                "gnnsched.cli",
                "operator",
                "--all-namespaces",
                "--kubeconfig",
                str(cluster.kubeconfig),
                "--workers",
                str(args.workers),
                "--watch-timeout",
                str(args.watch_timeout),
                "--resync-seconds",
                "300",
                "--log-level",
                "warning",
                "--metrics-port",
                "0",
                stdout=asyncio.subprocess.DEVNULL,
                stderr=log_file,
            )
            try:
                # Warm-up: one job, so that start-up (imports, first trace) is not counted as throughput.
                warm_start = time.monotonic()
                await cluster.create_job(job_manifest(-1, 1) | {"metadata": {"name": "warm-up"}})
                await wait_for(cluster.pods, 120, interval=0.2, what="the warm-up job's pod")
                warm = time.monotonic() - warm_start
                print(f"warm-up done in {warm:.1f} s; creating {args.jobs} jobs", flush=True)
                pod_creates = 0
                manifests = [job_manifest(i, args.distinct) for i in range(args.jobs)]
                load_before = os.getloadavg()
                start = time.monotonic()
                await asyncio.gather(*(cluster.create_job(m) for m in manifests))
                created = time.monotonic() - start
                first_seen: dict[str, float] = {}
                deadline = start + args.deadline
                while time.monotonic() < deadline and len(first_seen) < args.jobs:
                    now = time.monotonic()
                    for pod in await cluster.pods():
                        job = pod["metadata"].get("labels", {}).get("gnnsched.io/job-name")
                        if job and job.startswith("bench-") and job not in first_seen:
                            first_seen[job] = now - start
                    await asyncio.sleep(0.2)
                elapsed = time.monotonic() - start
                await asyncio.sleep(2.0)  # let any duplicate creation show up before counting
                pods = [p for p in await cluster.pods() if p["metadata"]["name"].startswith("bench-")]
                phases = [((await cluster.get_job(m["metadata"]["name"])) or {}).get("status", {}).get("phase")
                          for m in manifests]
                load_after = os.getloadavg()
            finally:
                proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), 30)
                except asyncio.TimeoutError:
                    proc.kill()
                    await proc.wait()
                log_file.close()
                err = log_path.read_bytes()

    per_job: dict[str, int] = {}
    for pod in pods:
        job = pod["metadata"].get("labels", {}).get("gnnsched.io/job-name", "?")
        per_job[job] = per_job.get(job, 0) + 1
    latencies = sorted(first_seen.values())
    all_done = len(first_seen) == args.jobs
    exactly_one = all_done and len(per_job) == args.jobs and all(n == 1 for n in per_job.values())
    print(f"operator start-up to the warm-up job's pod: {warm:.2f} s (imports and the first trace; not counted)")
    variants = len({json.dumps([m["spec"]["model"], m["spec"]["graph"]], sort_keys=True) for m in manifests})
    print(f"jobs: {args.jobs} created concurrently in {created:.2f} s ({variants} distinct model/graph variants)")
    print(f"jobs with a pod: {len(first_seen)}/{args.jobs}; last pod after {max(latencies or [0]):.2f} s "
          f"(deadline {args.deadline:.0f} s, polled every 0.2 s; loop ended after {elapsed:.2f} s)")
    if latencies:
        print(f"time from start to pod per job: p50 {statistics.median(latencies):.2f} s, "
              f"p95 {latencies[int(0.95 * (len(latencies) - 1))]:.2f} s, max {latencies[-1]:.2f} s")
    print(f"pods: {len(pods)} for {len(per_job)} jobs; exactly one each: {exactly_one}; "
          f"pod-create requests: {pod_creates}; operator workers: {args.workers}")
    counts: dict[str, int] = {}
    for phase in phases:
        counts[str(phase)] = counts.get(str(phase), 0) + 1
    print(f"job phases at the end: {counts}")
    print(f"load average before/after: {load_before[0]:.2f} / {load_after[0]:.2f} (cores: {os.cpu_count()})")
    errors = [line for line in err.decode(errors="replace").splitlines() if "Traceback" in line or "ERROR" in line]
    if errors:
        print(f"operator stderr had {len(errors)} error lines, first: {errors[0][:200]}")
    ok = exactly_one and max(latencies or [float("inf")]) <= args.deadline
    print("RESULT:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--distinct", type=int, default=20, help="distinct model/graph variants among the jobs")
    parser.add_argument("--workers", type=int, default=8, help="operator handler threads")
    parser.add_argument("--deadline", type=float, default=60.0)
    parser.add_argument("--watch-timeout", type=float, default=2.0,
                        help="kopf watch client timeout (kmock needs a short one; see DESIGN.md)")
    args = parser.parse_args()
    if args.jobs < 1 or args.distinct < 1:
        parser.error("--jobs and --distinct must be positive")
    raise SystemExit(asyncio.run(run(args)))


if __name__ == "__main__":
    main()
