"""What the default trust domain costs in packing: ``sharing.trustDomain: namespace`` against ``cluster``.

Under ``namespace`` (the default since issue 39) pods of different namespaces never share a GPU
(:mod:`gnnsched.trust.domain`); under ``cluster`` any pods do (the behaviour before). This bench simulates the same
jobs under both, with the jobs spread over 1, 2, 4 and 8 namespaces (round-robin by arrival, or drawn at random with
``--draw``), under the chart's default gnnsched configuration (read from the chart as ``bench/robustness.py`` does),
and prints per cell and namespace count the ratios namespace ÷ cluster of the mean JCT, the makespan, the GPU memory
utilisation and the SM utilisation, plus the jobs each run completed. One namespace is the control: both settings
then make the same decisions, so its ratios are exactly 1.

    nice -n 10 python bench/trust_domains.py [--jobs 32] [--seeds 0,1] [--namespaces 1,2,4,8] [--draw]
                                            [--cell LOAD,ARRIVAL,MIX,SIZE,CLUSTER ...] [--json FILE]

Each cell's jobs are generated and costed once (``gen:`` workloads, :func:`gnnsched.simulator.workloads.generated`)
and only their namespaces change between runs, so the ratios measure the rule alone.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from gnnsched.simulator.adapters import Integrations
from gnnsched.simulator.cli import default_data_dir, fits_on
from gnnsched.simulator.cluster import parse_cluster
from gnnsched.simulator.model import SimJob
from gnnsched.simulator.policyspec import parse_policies
from gnnsched.simulator.runner import materialise, run
from gnnsched.simulator.workloads import builtin_workload

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from robustness import chart_default_policy  # noqa: E402  (bench/ is not a package)

#: Cells (load, arrivals, mix, graph size, cluster): a loaded node and a lightly loaded pair of nodes, where sharing
#: matters most and least.
CELLS = (
    (1.0, "poisson", "mixed", "medium", "1x4xV100-32GB"),
    (1.5, "burst", "train", "small", "1x4xV100-32GB"),
    (0.7, "poisson", "mixed", "small", "2x4xA100-80GB"),
)
METRICS = (("jct_mean_s", "mean JCT"), ("makespan_s", "makespan"), ("gpu_mem_util", "GPU mem util"),
           ("sm_util", "SM util"))


def with_namespaces(jobs: list[SimJob], count: int, draw: bool, seed: int) -> list[SimJob]:
    """``jobs`` spread over ``count`` namespaces ``team-0`` .. : round-robin in arrival order, or drawn uniformly
    (``draw``, seeded)."""
    rng = random.Random(seed)
    ordered = sorted(jobs, key=lambda j: (j.arrival, j.id))
    out = []
    for i, j in enumerate(ordered):
        k = rng.randrange(count) if draw else i % count
        out.append(replace(j, namespace=f"team-{k}"))
    return out


def parse_cell(text: str) -> tuple[float, str, str, str, str]:
    parts = text.split(",")
    if len(parts) != 5:
        raise argparse.ArgumentTypeError(f"--cell: {text!r} is not LOAD,ARRIVAL,MIX,SIZE,CLUSTER")
    try:
        load = float(parts[0])
    except ValueError:
        raise argparse.ArgumentTypeError(f"--cell: load {parts[0]!r} is not a number") from None
    return load, parts[1], parts[2], parts[3], parts[4]


def ratio(a: Any, b: Any) -> float:
    if a is None or b is None or not b:
        return math.nan
    return float(a) / float(b)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=32, help="jobs per cell (default 32)")
    ap.add_argument("--seeds", default="0,1", help="comma-separated seeds (default 0,1)")
    ap.add_argument("--namespaces", default="1,2,4,8", help="namespace counts (default 1,2,4,8)")
    ap.add_argument("--draw", action="store_true", help="draw each job's namespace at random instead of round-robin")
    ap.add_argument("--cell", action="append", type=parse_cell, default=None,
                    help="LOAD,ARRIVAL,MIX,SIZE,CLUSTER (repeatable; default the three built-in cells)")
    ap.add_argument("--policy", default=None, help="gnnsched configuration (default: the chart's)")
    ap.add_argument("--json", type=Path, default=None, help="write every run's metrics here")
    args = ap.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        counts = [int(s) for s in args.namespaces.split(",") if s.strip()]
    except ValueError as exc:
        ap.error(f"--seeds/--namespaces: {exc}")
    if not seeds or not counts or min(counts) < 1:
        ap.error("--seeds and --namespaces need at least one value; namespace counts are >= 1")
    policy = args.policy or chart_default_policy()
    spec = parse_policies(policy)
    ix = Integrations()
    rows: list[dict[str, Any]] = []
    print(f"policy {policy}; {args.jobs} jobs per cell; namespaces "
          f"{'drawn at random' if args.draw else 'round-robin'}; ratios namespace / cluster")
    head = " | ".join(name for _, name in METRICS)
    print(f"| cell | seed | namespaces | {head} | completed (ns / cluster) |")
    print("|---|---|---|" + "---|" * len(METRICS) + "---|")
    for load, arrival, mix, size, cluster in args.cell or CELLS:
        cl = parse_cluster(cluster)
        for seed in seeds:
            text = f"gen:load={load:g},arrival={arrival},mix={mix},size={size},jobs={args.jobs}"
            wl = builtin_workload(text, seed, default_data_dir(), fits=fits_on(cl, ix))
            jobs = materialise(wl, cl, ix, scaling=any(p.scaling for p in spec))
            for count in counts:
                spread = with_namespaces(jobs, count, args.draw, seed)
                got = {}
                for trust in ("namespace", "cluster"):
                    report = run(wl, cl, spec, seed, ix, record_timeline=False, jobs=spread, trust_domain=trust)
                    got[trust] = report.policies[spec[0].text]
                ns, cl_m = got["namespace"], got["cluster"]
                cells = " | ".join(f"{ratio(ns.get(k), cl_m.get(k)):.3f}" for k, _ in METRICS)
                key = f"{cluster} load={load:g} {arrival} {mix} {size}"
                print(f"| {key} | {seed} | {count} | {cells} | {ns['completed']} / {cl_m['completed']} |", flush=True)
                rows.append({"cell": key, "seed": seed, "namespaces": count, "namespace": ns, "cluster": cl_m})
    print()
    print("| namespaces | " + " | ".join(f"{name} geomean" for _, name in METRICS) + " |")
    print("|---|" + "---|" * len(METRICS))
    for count in counts:
        chosen = [r for r in rows if r["namespaces"] == count]
        means = []
        for k, _ in METRICS:
            vals = [ratio(r["namespace"].get(k), r["cluster"].get(k)) for r in chosen]
            vals = [v for v in vals if v > 0 and math.isfinite(v)]
            means.append(math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else math.nan)
        print(f"| {count} | " + " | ".join(f"{m:.3f}" for m in means) + " |")
    if args.json is not None:
        args.json.write_text(json.dumps({"policy": policy, "draw": args.draw, "rows": rows}, indent=1))
    lost = [r for r in rows if r["namespace"]["completed"] < r["cluster"]["completed"]]
    if lost:
        print(f"{len(lost)} runs completed fewer jobs under namespace than under cluster")
    return 0


if __name__ == "__main__":
    sys.exit(main())
