"""Benchmark: 100,000 GNN jobs on 1,000 GPU nodes through ``gnnsched simulate``'s engine (target: <= 60 s per policy).

Job costs come from the real estimator and runtime prior for 24 CoGNN-style training specs (costed once each and
reused), so the engine does exactly the work it does for a built-in workload. Arrivals are Poisson at a rate that
keeps the cluster ~85 % busy under one-job-per-GPU. Prints wall time per policy and the machine's load average.

    python bench/simulate_scale.py [--jobs 100000] [--nodes 1000] [--gpus 8] [--policies exclusive,mps-base,lmcf]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

from gnnsched.simulator.adapters import IntegrationMissing, Integrations
from gnnsched.simulator.cluster import uniform_cluster
from gnnsched.simulator.costs import STARTUP_S
from gnnsched.simulator.engine import Simulation
from gnnsched.simulator.metrics import summarise
from gnnsched.simulator.model import SimJob
from gnnsched.simulator.policyspec import parse_policies
from gnnsched.simulator.workloads import COGNN_DATASETS, _train_spec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--model", default="V100-32GB")
    ap.add_argument("--policies", default="exclusive,mps-base,lmcf")
    ap.add_argument("--load", type=float, default=0.85)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    ix = Integrations()
    rng = random.Random(args.seed)
    t0 = time.perf_counter()
    specs = [_train_spec(rng.choice(("gcn", "sage", "gin", "gat")), d, rng.randint(2, 8), 64, 200)
             for d in COGNN_DATASETS for _ in range(2)][:24]
    try:
        profiles = [ix.profile(s, args.model) for s in specs]
    except IntegrationMissing as exc:
        print(f"integration missing: {exc}", file=sys.stderr)
        return 3
    cost_s = time.perf_counter() - t0
    cluster = uniform_cluster(args.nodes, args.gpus, args.model, cpu_milli=96_000 * args.gpus // 8,
                              memory_bytes=(512 << 30) * args.gpus // 8)
    mean_solo = sum(p.solo_s + STARTUP_S for p in profiles) / len(profiles)
    rate = args.load * cluster.gpu_count / mean_solo
    t = 0.0
    jobs = []
    for i in range(args.jobs):
        t += rng.expovariate(rate)
        k = rng.randrange(len(specs))
        jobs.append(SimJob(id=i, name=f"j{i}", arrival=t, mode="train", cpu_milli=2000, memory_bytes=8 << 30,
                           profiles={args.model: profiles[k]}, spec=specs[k]))
    print(f"{args.jobs} jobs, {args.nodes} nodes x {args.gpus} {args.model}; costing 24 specs took {cost_s:.1f} s; "
          f"arrival rate {rate:.2f}/s, mean solo {mean_solo:.1f} s")
    worst = 0.0
    for spec in parse_policies(args.policies):
        start = time.perf_counter()
        try:
            res = Simulation(jobs, cluster, spec, ix, record_timeline=False).run()
        except IntegrationMissing as exc:
            print(f"{spec.text:14s} not run: {exc}")
            continue
        wall = time.perf_counter() - start
        worst = max(worst, wall)
        m = summarise(res)
        print(f"{spec.text:14s} wall {wall:6.1f} s  completed {m['completed']}  makespan {m['makespan_s']:.0f} s  "
              f"JCT mean {m['jct_mean_s']} s  OOM {m['oom_kills']}")
    print(f"load average {os.getloadavg()}; slowest policy {worst:.1f} s (target <= 60 s)")
    return 0 if worst <= 60 else 1


if __name__ == "__main__":
    raise SystemExit(main())
