"""Benchmark of record: 100,000 GNN jobs on 1,000 GPU nodes through ``gnnsched simulate``'s engine, every policy
(target: <= 60 s wall per policy; exits 1 when any policy exceeds it).

Job costs come from the real estimator and runtime prior for 24 CoGNN-style training specs (costed once each and
reused), so the engine does exactly the work it does for a built-in workload; ``+scaling`` policies get the requests
``gnnsched.scaling.scale`` chooses for each spec (also computed once). Arrivals are Poisson at a rate that keeps the
cluster ~85 % busy under one-job-per-GPU. Prints one row per policy (wall time, the process's CPU time -- on a shared
machine the wall time also counts the other processes' turns --, the machine's 1-minute load average when it finished,
completed jobs, makespan, mean JCT, OOM kills) and the slowest policy. The verdict is on wall time.

    python bench/simulate_scale.py [--jobs 100000] [--nodes 1000] [--gpus 8] [--policies all|a,b,...] [--profile N]

``--policies all`` (the default) is every engine policy :mod:`gnnsched.simulator.policyspec` offers: each base
policy, the ``+uvm`` variants of the MPS baselines, each gnnsched policy ``-interference`` and ``+scaling``, and the
published SQTF/BQT (``-paper``, with and without ``+uvm``), and the chart's default configuration (``node.agent.policy``
with the gate rules the chart turns on, e.g. ``sqtf+sjf2+bypass4+spread``: the configuration of record)
(openb's placement-only ``best-fit``/``fgd`` run in their own replay, not in this engine). ``--profile N`` runs each
policy under cProfile and prints its N most expensive functions (cumulative time; wall times are then inflated).

The 24 specs' costs depend on whether the estimator finds the real graphs (``$GNNSCHED_DATA_DIR``, else
``../shared/data`` beside the checkout): compare runs made with the same data folder. ``build_workload`` is shared
with ``bench/simulate_identity.py``, which checks that an engine change leaves every per-job outcome unchanged.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from dataclasses import replace

from gnnsched.simulator import policyspec
from gnnsched.simulator.adapters import IntegrationMissing, Integrations
from gnnsched.simulator.cluster import ClusterSpec, uniform_cluster
from gnnsched.simulator.costs import STARTUP_S
from gnnsched.simulator.engine import Simulation
from gnnsched.simulator.metrics import summarise
from gnnsched.simulator.model import SimJob
from gnnsched.simulator.policyspec import parse_policies
from gnnsched.simulator.workloads import COGNN_DATASETS, _train_spec

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from robustness import chart_default_policy  # noqa: E402  (bench/ is not a package)

TARGET_S = 60.0


def all_policies() -> str:
    """Every policy the engine runs: each base, ``+uvm`` MPS variants, gnnsched ``-interference`` and ``+scaling``,
    the ``-paper`` variants."""
    engine_bases = [b for b in policyspec.ALL_BASES if b not in policyspec.PLACEMENT_ONLY]
    names = list(engine_bases)
    names += [f"{b}+uvm" for b in ("mps-naive", "mps-base") if b in engine_bases]
    names += [f"{b}-interference" for b in policyspec.GNNSCHED_POLICIES]
    paper = getattr(policyspec, "PAPER_VARIANTS", ())
    names += [f"{b}-paper" for b in paper] + [f"{b}-paper+uvm" for b in paper]
    names += [f"{b}+scaling" for b in policyspec.GNNSCHED_POLICIES]
    names += ["exclusive+scaling"]
    # the configuration of record: what the chart installs (gate rules +sjfN, +bypassN, +spread ...), read from it
    chart = chart_default_policy()
    if chart not in names:
        names.append(chart)
    return ",".join(names)


def build_workload(ix: Integrations, *, jobs: int, nodes: int, gpus: int, model: str, load: float, seed: int,
                   scaled: bool) -> tuple[list[SimJob], ClusterSpec, float, float, float]:
    """The benchmark's jobs and cluster: ``(jobs, cluster, seconds spent costing the specs, arrival rate, mean solo
    seconds)``. Shared with ``bench/simulate_identity.py`` so the identity check replays the same kind of workload."""
    rng = random.Random(seed)
    t0 = time.perf_counter()
    specs = [_train_spec(rng.choice(("gcn", "sage", "gin", "gat")), d, rng.randint(2, 8), 64, 200)
             for d in COGNN_DATASETS for _ in range(2)][:24]
    cpu_milli, memory_bytes = 2000, 8 << 30
    profiles = [ix.profile(s, model) for s in specs]
    scales = [ix.scale(s, cpu_milli, memory_bytes, model) for s in specs] if scaled else None
    cost_s = time.perf_counter() - t0
    cluster = uniform_cluster(nodes, gpus, model, cpu_milli=96_000 * gpus // 8, memory_bytes=(512 << 30) * gpus // 8)
    mean_solo = sum(p.solo_s + STARTUP_S for p in profiles) / len(profiles)
    rate = load * cluster.gpu_count / mean_solo
    t = 0.0
    out = []
    for i in range(jobs):
        t += rng.expovariate(rate)
        k = rng.randrange(len(specs))
        job = SimJob(id=i, name=f"j{i}", arrival=t, mode="train", cpu_milli=cpu_milli, memory_bytes=memory_bytes,
                     profiles={model: profiles[k]}, spec=specs[k])
        if scales is not None:
            c, m, f = scales[k]
            job = replace(job, scaled_cpu_milli=c, scaled_memory_bytes=m, scaled_solo_factor=f)
        out.append(job)
    return out, cluster, cost_s, rate, mean_solo


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--model", default="V100-32GB")
    ap.add_argument("--policies", default="all", help="'all' (default) or a comma-separated list")
    ap.add_argument("--load", type=float, default=0.85)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="run under cProfile and print the N most expensive functions per policy")
    args = ap.parse_args()
    try:
        specs_to_run = parse_policies(all_policies() if args.policies.strip() == "all" else args.policies)
    except policyspec.PolicyError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    ix = Integrations()
    try:
        jobs, cluster, cost_s, rate, mean_solo = build_workload(
            ix, jobs=args.jobs, nodes=args.nodes, gpus=args.gpus, model=args.model, load=args.load, seed=args.seed,
            scaled=any(p.scaling for p in specs_to_run))
    except IntegrationMissing as exc:
        print(f"integration missing: {exc}", file=sys.stderr)
        return 3
    print(f"{args.jobs} jobs, {args.nodes} nodes x {args.gpus} {args.model}; costing 24 specs took {cost_s:.1f} s; "
          f"arrival rate {rate:.2f}/s, mean solo {mean_solo:.1f} s; load average at start "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    print(f"{'policy':24s} {'wall s':>7s} {'cpu s':>7s} {'load1':>6s} {'completed':>9s} {'makespan s':>11s} "
          f"{'JCT mean s':>11s} {'OOM':>5s}  verdict", flush=True)
    rows: list[tuple[str, float]] = []
    for spec in specs_to_run:
        sim = Simulation(jobs, cluster, spec, ix, record_timeline=False)
        prof = None
        if args.profile:
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        start, cpu0 = time.perf_counter(), time.process_time()
        try:
            res = sim.run()
        except IntegrationMissing as exc:
            if prof is not None:
                prof.disable()
            print(f"{spec.text:24s} not run: {exc}", flush=True)
            rows.append((spec.text, float("inf")))
            continue
        wall = time.perf_counter() - start
        cpu = time.process_time() - cpu0
        if prof is not None:
            prof.disable()
        rows.append((spec.text, wall))
        m = summarise(res)
        verdict = "ok" if wall <= TARGET_S else "SLOW"
        print(f"{spec.text:24s} {wall:7.1f} {cpu:7.1f} {os.getloadavg()[0]:6.2f} {m['completed']:9d} "
              f"{m['makespan_s']:11.0f} {m['jct_mean_s']!s:>11s} {m['oom_kills']:5d}  {verdict}", flush=True)
        if prof is not None:
            import pstats

            pstats.Stats(prof, stream=sys.stdout).sort_stats("cumulative").print_stats(args.profile)
    slow = [name for name, wall in rows if wall > TARGET_S]
    name, worst = max(rows, key=lambda r: r[1]) if rows else ("-", 0.0)
    print(f"load average {tuple(round(x, 2) for x in os.getloadavg())}; slowest {name} {worst:.1f} s "
          f"(target <= {TARGET_S:.0f} s per policy); {'all within target' if not slow else 'over: ' + ', '.join(slow)}")
    return 0 if not slow else 1


if __name__ == "__main__":
    raise SystemExit(main())
