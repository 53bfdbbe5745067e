"""Per-job trace of one closed-loop cell: where a policy's mean JCT with errors and faults goes, job by job.

Runs one workload, seed and policy on one node x 4 V100-32GB twice, without errors and with
``--estimate-error lognormal:0.2 --hw-fault-rate 1 --buggy-jobs 0.05`` (the cell of issue 27's JCT-ratio figure),
and prints per job its
true-peak multiplier, its start and finish in both runs and how many attempts it took, then the makespans, the wasted
GPU-seconds and the mean-JCT ratio.

It showed where the JCT ratio went before retries went first (docs/simulator.md, issue 15's figures): each retry
queued behind every job still waiting; the operator's retry PriorityClass, which the engine models, fixed that.

    python bench/closed_loop_trace.py [--workload cognn-mix] [--seed 0] [--policy base]
"""

from __future__ import annotations

import argparse

from gnnsched.simulator.adapters import Integrations
from gnnsched.simulator.cli import default_data_dir, fits_on
from gnnsched.simulator.cluster import parse_cluster
from gnnsched.simulator.faults import parse_estimate_error, parse_faults, true_multipliers
from gnnsched.simulator.policyspec import parse_policies
from gnnsched.simulator.runner import materialise, run
from gnnsched.simulator.workloads import resolve_workload

CLUSTER = "1x4xV100-32GB"
ERRORS = "lognormal:0.2"
FAULTS = parse_faults(1.0, buggy=0.05)




def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="cognn-mix")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policy", default="base")
    args = ap.parse_args()
    ix = Integrations()
    data = default_data_dir()
    cl = parse_cluster(CLUSTER, data)
    error = parse_estimate_error(ERRORS)
    wl = resolve_workload(args.workload, args.seed, data, fits=fits_on(cl, ix))
    jobs = materialise(wl, cl, ix, scaling=False)
    policies = parse_policies(args.policy)
    plain = run(wl, cl, policies, args.seed, ix, jobs=jobs)
    loop = run(wl, cl, policies, args.seed, ix, jobs=jobs, estimate_error=error, faults=FAULTS)
    name = next(iter(plain.results))
    before, after = plain.results[name], loop.results[name]
    multipliers = true_multipliers(jobs, error, args.seed)

    def span(start: float | None, finish: float | None) -> str:
        nan = float("nan")
        return f"{start if start is not None else nan:6.1f}-{finish if finish is not None else nan:6.1f}"

    print(f"{args.workload} seed {args.seed} {name} on {CLUSTER}; errors {ERRORS}, "
          f"--hw-fault-rate {FAULTS.hw_rate:g} --buggy-jobs {FAULTS.buggy_fraction:g}")
    print(f"{'job':28s} {'true':>5s} {'no errors: run':>15s} {'JCT':>6s}   {'errors: first':>13s} {'last run':>15s} "
          f"{'JCT':>6s} {'att':>3s}")
    for a, b in zip(before.outcomes, after.outcomes, strict=True):
        first = b.first_start if b.first_start is not None else float("nan")
        print(f"{a.job.name:28s} {multipliers[a.job.id]:5.2f} {span(a.first_start, a.finish)} {a.jct or 0:6.1f}   "
              f"{first:13.1f} {span(b.start, b.finish)} {b.jct or 0:6.1f} {b.attempts:3d}")
    mean_before = plain.policies[name]["jct_mean_s"]
    mean_after = loop.policies[name]["jct_mean_s"]
    print(f"makespan {before.end_time:.1f} -> {after.end_time:.1f} s; wasted GPU-seconds "
          f"{loop.policies[name].get('wasted_gpu_seconds', 0.0):.1f}; mean JCT {mean_before:.1f} -> {mean_after:.1f} s "
          f"({mean_after / mean_before:.2f}x)")


if __name__ == "__main__":
    main()
