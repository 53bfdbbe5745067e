"""Issue 37's QoS figure: the GNNSched paper's headline (at most 8 % QoS violations at high load, MPS-Base under 20 %,
a ratio of 0.4) on each of its queues, the chart default against MPS-Base in the same run.

Each queue ``gnnsched-{gcn,sage,gin,mix}-high`` on its own cluster, one seed, with and without ``--runtime-error``
(default ``measured``; under it a job's QoS target is 2 x its *true* solo time plus start-up, as the paper set it,
``runtime_error.with_true_runtimes``). Prints each queue's absolute violation rates and their ratio.

    python bench/qos_headline.py [--seed 0] [--runtime-error measured] [--also POLICY]

Exit status 1 when any ratio is above ``--bound`` (0.4).
"""

from __future__ import annotations

import argparse
import os
import sys

from gnnsched.simulator.adapters import Integrations
from gnnsched.simulator.cli import default_data_dir, fits_on
from gnnsched.simulator.cluster import parse_cluster
from gnnsched.simulator.policyspec import parse_policies
from gnnsched.simulator.runner import run
from gnnsched.simulator.runtime_error import NO_RUNTIME_ERROR, parse_runtime_error
from gnnsched.simulator.workloads import resolve_workload

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from robustness import chart_default_policy  # noqa: E402  (bench/ is not a package)

QUEUES = ("gcn", "sage", "gin", "mix")
BASELINE = "mps-base"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runtime-error", default="measured")
    ap.add_argument("--also", action="append", default=[])
    ap.add_argument("--bound", type=float, default=0.4)
    args = ap.parse_args(argv)
    ix = Integrations()
    data = default_data_dir()
    ours = chart_default_policy()
    names = [ours, *args.also]
    specs = parse_policies(",".join((*names, BASELINE)))
    worst = 0.0
    print(f"chart default {ours}; baseline {BASELINE}; seed {args.seed}")
    for error in (NO_RUNTIME_ERROR, parse_runtime_error(args.runtime_error)):
        for q in QUEUES:
            name = f"gnnsched-{q}-high"
            probe = resolve_workload(name, args.seed, data)
            cl = parse_cluster(probe.cluster, data)
            wl = resolve_workload(name, args.seed, data, fits=fits_on(cl, ix))
            rep = run(wl, cl, specs, args.seed, ix, record_timeline=False, runtime_error=error)
            m = rep.policies
            base = m[BASELINE]["qos_violation_rate"] or 0.0
            line = f"{error.text():9s} {name:18s} {BASELINE} {base:6.1%}"
            for i, p in enumerate(names):
                mine = m[p]["qos_violation_rate"] or 0.0
                ratio = mine / base if base > 0 else (0.0 if mine == 0 else float("inf"))
                line += f" | {'default' if i == 0 else p} {mine:6.1%} ratio {ratio:.2f}"
                if i == 0:
                    worst = max(worst, ratio)
            print(line, flush=True)
    print(f"worst ratio default / {BASELINE}: {worst:.2f} (paper: 8 % / 20 % = 0.4)")
    return 1 if worst > args.bound else 0


if __name__ == "__main__":
    sys.exit(main())
