"""The runtime loop's figure (issue 28's "the closed loop beats the open loop"), per seed, on one node x 4 V100-32GB.

For each workload and seed it runs the same jobs under ``--runtime-error`` (default ``lognormal:0.5``): the chart's
default policy as it was (the open loop: the prior's predictions, never corrected), the same with the runtime loop
(``+rtcal+progress``: the operator's per-class runtime factor and the workers' step reports,
:mod:`gnnsched.simulator.runtime_loop`), each loop alone, and, from the same run, the chart default with exact
predictions (the oracle). It prints each one's mean JCT and makespan and, per workload over the seeds:

* ``closed / oracle``: the closed loop's mean JCT over the oracle's (the target: at most 1.05);
* ``gap closed``: the share of the open loop's gap to the oracle that the closed loop closes,
  ``(open - closed) / (open - oracle)`` (the other target: at least 0.5), where the open loop has a gap at all;
* per seed, the closed loop's runtime samples, re-plans of waiting pods, and the range of the factors it learned
  (of the classes whose factor is not 1).

    python bench/runtime_loop.py [--workloads "gnnsched-mix-high;cognn-mix"] [--seeds 0,...,9]
        [--runtime-error lognormal:0.5] [--cluster 1x4xV100-32GB]

The figures do not depend on the machine's load (a discrete-event simulation).
"""

from __future__ import annotations

import argparse
import os
import sys
from statistics import mean

from gnnsched.simulator.adapters import Integrations
from gnnsched.simulator.cli import default_data_dir, fits_on
from gnnsched.simulator.cluster import parse_cluster
from gnnsched.simulator.policyspec import parse_policies
from gnnsched.simulator.runner import materialise, run
from gnnsched.simulator.runtime_error import parse_runtime_error
from gnnsched.simulator.workloads import resolve_workload

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from robustness import chart_default_policy  # noqa: E402  (bench/ is not a package)

LOOPS = ("", "+rtcal", "+progress", "+rtcal+progress")
"""The chart default, then with each part of the runtime loop, then with both (the closed loop)."""


def gap_closed(open_s: float, closed_s: float, oracle_s: float) -> float | None:
    """The share of the open loop's gap to the oracle that the closed loop closes; None when the open loop has no gap
    (it is at or below the oracle: nothing to close)."""
    gap = open_s - oracle_s
    return None if gap <= 0 else (open_s - closed_s) / gap


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="gnnsched-mix-high;cognn-mix", help="separated by ;")
    ap.add_argument("--seeds", default="0,1,2,3,4,5,6,7,8,9")
    ap.add_argument("--runtime-error", default="lognormal:0.5")
    ap.add_argument("--cluster", default="1x4xV100-32GB")
    args = ap.parse_args()
    ix = Integrations()
    data = default_data_dir()
    cl = parse_cluster(args.cluster, data)
    error = parse_runtime_error(args.runtime_error)
    base = chart_default_policy(loops=False)  # the open loop; LOOPS adds the loops one by one
    names = [base + loop for loop in LOOPS]
    policies = parse_policies(",".join(names))
    print(f"cluster {args.cluster}; runtime error {error.text()}; chart default {base}; closed loop "
          f"{base}+rtcal+progress")
    print(f"{'workload':18s} {'seed':>4s} {'oracle':>7s} {'open':>7s} {'+rtcal':>7s} {'+progr':>7s} {'closed':>7s} "
          f"{'open/or':>7s} {'cl/or':>6s} {'gap cl':>6s} {'samples':>7s} {'replans':>7s} {'factors':>9s}  "
          "makespan open/closed/oracle")
    verdicts = []
    for name in args.workloads.split(";"):
        rows = []
        for seed in (int(s) for s in args.seeds.split(",")):
            wl = resolve_workload(name, seed, data, fits=fits_on(cl, ix))
            jobs = materialise(wl, cl, ix, scaling=False)
            report = run(wl, cl, policies, seed, ix, jobs=jobs, runtime_error=error, record_timeline=False)
            figs = [report.policies[n] for n in names]
            oracle = report.runtime_error["oracle"][base]
            jct = [f["jct_mean_s"] for f in figs]
            orc = oracle["jct_mean_s"]
            closed = figs[-1]
            share = gap_closed(jct[0], jct[-1], orc)
            rows.append((jct[0], jct[-1], orc, *jct[1:3]))
            learned = report.results[names[-1]].extra.get("runtime_factors", {}).values()
            span = f"{min(learned):.2f}-{max(learned):.2f}" if learned else "-"
            print(f"{name[:18]:18s} {seed:4d} {orc:7.1f} " + " ".join(f"{v:7.1f}" for v in jct)
                  + f" {jct[0] / orc:7.3f} {jct[-1] / orc:6.3f} "
                  + (f"{share:6.2f}" if share is not None else f"{'-':>6s}")
                  + f" {closed.get('runtime_samples', 0):7d} {closed.get('runtime_replans', 0):7d} {span:>9s}"
                  + f"  {figs[0]['makespan_s']:.1f}/{closed['makespan_s']:.1f}/{oracle['makespan_s']:.1f}")
        open_m, closed_m, oracle_m, rtcal_m, progress_m = (mean(r[i] for r in rows) for i in range(5))
        share = gap_closed(open_m, closed_m, oracle_m)
        ok = closed_m <= 1.05 * oracle_m or (share is not None and share >= 0.5)
        verdicts.append(ok)
        print(f"{name[:18]:18s} mean over {len(rows)} seeds: oracle {oracle_m:.2f} s, open {open_m:.2f} s "
              f"(x{open_m / oracle_m:.3f}), +rtcal {rtcal_m:.2f} s, +progress {progress_m:.2f} s, closed "
              f"{closed_m:.2f} s (x{closed_m / oracle_m:.3f}); gap closed "
              + (f"{share:.2f}" if share is not None else "- (the open loop is at or below the oracle)")
              + f"; worst seed closed/oracle {max(r[1] / r[2] for r in rows):.3f}; "
              + ("MET" if ok else "NOT MET") + " (closed <= 1.05 x oracle, or gap closed >= 0.5)")
    print("all workloads: " + ("MET" if all(verdicts) else "NOT MET"))


if __name__ == "__main__":
    main()
