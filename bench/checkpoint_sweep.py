"""Issue 38's "Done when" cells with checkpointing, per checkpoint interval: where the chart's default interval comes
from, and whether the restated fault targets hold.

The cells are issue 27's (``bench/closed_loop.py``): 3 workloads x 10 seeds x the 6 gnnsched policies, 1 x 4
V100-32GB, ``--estimate-error lognormal:0.2 --hw-fault-rate 1 --buggy-jobs 0.05``. For each interval (0: no
checkpoints) every job saves every that many seconds at ``--write-seconds`` a save (``bench/checkpoint_cost.py``
measures it) and resumes from its last save; gnnsched's default failure rules apply
(``gnnsched.attempts.failure_policy``: a job whose own fault comes at the same step twice fails at once).

Per interval it prints the innocent jobs lost and OOM kills (must be 0); the cells of gnnsched-mix-high and burst
above 1.2x their fault-free run; the cognn-mix cells above 1.1x ``bench/fault_what_if.py``'s "first fault" variant of
the same cell (a buggy job named and failed at its first fault, victims resume for free: the best any rule can do
without knowing buggy jobs in advance); and the worst of each. Ratios are over the jobs both runs completed, buggy
jobs left out (``fault_what_if.ratio_without``).

    python bench/checkpoint_sweep.py [--intervals 0,10,30,60,120] [--write-seconds 0.06] [--seeds 0,...,9]
        [--workloads "cognn-mix;gnnsched-mix-high;BURST"] [--without-probation]

``--without-probation``: the rule before probation (``gnnsched.attempts.probation``): an undecided fault's clients
are only kept apart from one another, never admitted alone on an idle GPU until they pass their fault's step.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from gnnsched.simulator.adapters import Integrations
from gnnsched.simulator.cli import default_data_dir, fits_on
from gnnsched.simulator.cluster import parse_cluster
from gnnsched.simulator.engine import Simulation
from gnnsched.simulator.faults import DEFAULT_REPAIR_S, buggy_points, parse_estimate_error, parse_faults
from gnnsched.simulator.policyspec import parse_policies
from gnnsched.simulator.runner import materialise, run
from gnnsched.simulator.workloads import resolve_workload

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from closed_loop import BURST, CLUSTER  # noqa: E402  (bench/ is not a package)
from fault_what_if import GNNSCHED, CulpritAtFirstFault, ratio_without  # noqa: E402

TARGET_FREE = 1.2
TARGET_FIRST = 1.1


class WithoutProbation(Simulation):
    """The system's rules without probation: what ``--without-probation`` measures."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.loop is not None:
            self.loop.probation_rule = False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--intervals", default="0,10,30,60,120", help="seconds between saves, comma-separated; 0: none")
    ap.add_argument("--write-seconds", type=float, default=0.06, help="one save's cost (bench/checkpoint_cost.py)")
    ap.add_argument("--workloads", default=f"cognn-mix;gnnsched-mix-high;{BURST}", help="separated by ;")
    ap.add_argument("--seeds", default="0,1,2,3,4,5,6,7,8,9")
    ap.add_argument("--without-probation", action="store_true", help="the rule before probation, for comparison")
    args = ap.parse_args()
    engine = WithoutProbation if args.without_probation else Simulation
    intervals = [float(x) for x in args.intervals.split(",")]
    ix = Integrations()
    data = default_data_dir()
    cl = parse_cluster(CLUSTER, data)
    noisy = parse_estimate_error("lognormal:0.2")
    plain_faults = parse_faults(1.0, DEFAULT_REPAIR_S, 0.05)
    policies = parse_policies(",".join(GNNSCHED))
    print(f"cluster {CLUSTER}; --estimate-error lognormal:0.2 --hw-fault-rate 1 --buggy-jobs 0.05; save "
          f"{args.write_seconds:g} s; ratio vs fault-free (mix-high, burst) or vs 'first fault' (cognn-mix)")
    print(f"{'workload':18s} {'seed':>4s} {'every':>6s} " + " ".join(f"{p[:10]:>10s}" for p in GNNSCHED)
          + "  lost oom failjob")
    over = dict.fromkeys(intervals, 0)
    cells = dict.fromkeys(intervals, 0)
    lost = dict.fromkeys(intervals, 0)
    worst: dict[float, dict[str, tuple[float, str]]] = {i: {} for i in intervals}
    for name in args.workloads.split(";"):
        short = name if len(name) <= 18 else "burst"
        cognn = name == "cognn-mix"
        for seed in (int(s) for s in args.seeds.split(",")):
            wl = resolve_workload(name, seed, data, fits=fits_on(cl, ix))
            jobs = materialise(wl, cl, ix, scaling=False)
            buggy = set(buggy_points(jobs, plain_faults.buggy_fraction, seed))
            base = run(wl, cl, policies, seed, ix, jobs=jobs, record_timeline=False)
            if cognn:
                base = run(wl, cl, policies, seed, ix, jobs=jobs, record_timeline=False, faults=plain_faults,
                           estimate_error=noisy, engine=CulpritAtFirstFault)
            for every in intervals:
                faults = parse_faults(1.0, DEFAULT_REPAIR_S, 0.05, every, args.write_seconds if every else 0.0)
                loop = run(wl, cl, policies, seed, ix, jobs=jobs, record_timeline=False, faults=faults,
                           estimate_error=noisy, engine=engine)
                ratios = [ratio_without(base.results[p.text], loop.results[p.text], buggy) for p in policies]
                target = TARGET_FIRST if cognn else TARGET_FREE
                n_lost = sum(loop.policies[p.text]["jobs_lost"] for p in policies)
                n_oom = sum(loop.policies[p.text]["oom_kills"] for p in policies)
                n_rule = sum(loop.policies[p.text].get("failed_by_rule", 0) for p in policies)
                lost[every] += n_lost + n_oom
                kind = "cognn" if cognn else "long"
                for p, r in zip(GNNSCHED, ratios, strict=True):
                    cells[every] += 1
                    over[every] += r > target
                    worst[every][kind] = max(worst[every].get(kind, (0.0, "")), (r, f"{short} seed {seed} {p}"))
                print(f"{short:18s} {seed:4d} {every:6g} " + " ".join(f"{r:10.3f}" for r in ratios)
                      + f"  {n_lost:4d} {n_oom:3d} {n_rule:7d}", flush=True)
    print()
    for every in intervals:
        w = worst[every]
        long_w = w.get("long", (float("nan"), "-"))
        cognn_w = w.get("cognn", (float("nan"), "-"))
        print(f"every {every:g} s: cells above target {over[every]} of {cells[every]}; innocent jobs lost + OOM "
              f"kills {lost[every]}; worst vs fault-free {long_w[0]:.3f} ({long_w[1]}); worst cognn-mix vs first "
              f"fault {cognn_w[0]:.3f} ({cognn_w[1]})")


if __name__ == "__main__":
    main()
