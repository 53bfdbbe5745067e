"""Issue 37's light-load figure: 40-job bursts on 2 x 4 V100-32GB, where memory never binds, under the measured runtime
error, the chart default (loops included) against the best baseline, per seed.

Why: at light load co-location is a choice, not a necessity; gnnsched must never be slower than naive MPS (or
exclusive GPUs) there. Each workload is a ``gen:`` burst of 40 jobs (all at once, or in clumps), small or medium
graphs; each seed is one run under ``--runtime-error`` (default ``measured``), with the oracle (exact predictions, the
same true runtimes) from the same run. The best baseline is the lowest mean JCT of ``exclusive``, ``mps-naive`` and
``mps-base`` among those that completed the most jobs (``bench/robustness.py``'s rule).

    python bench/light_burst.py [--seeds 1,2,3,4,5] [--runtime-error measured] [--also POLICY] [--workloads "A;B"]
    python bench/light_burst.py --heavy        # heavy load: the default's mean JCT over exclusive's, OOM kills

Exit status 1 when any run is above ``--bound`` (1.02; with ``--heavy`` 0.5 of exclusive) or gnnsched loses a job
(with ``--heavy``: or has an OOM kill).
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
from gnnsched.simulator.runtime_error import parse_runtime_error
from gnnsched.simulator.workloads import resolve_workload

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from robustness import BASELINES, chart_default_policy  # noqa: E402  (bench/ is not a package)

CLUSTER = "2x4xV100-32GB"
WORKLOADS = (
    "gen:load=0.3,arrival=burst,mix=mixed,size=medium,jobs=40,burst=40,models=all",
    "gen:load=0.3,arrival=burst,mix=mixed,size=medium,jobs=40,burst=10",
    "gen:load=0.15,arrival=burst,mix=train,size=small,jobs=40,burst=10,models=pyg",
)
HEAVY = (
    "gen:load=1.5,arrival=burst,mix=mixed,size=medium,jobs=40,burst=40",
    "gen:load=1.5,arrival=poisson,mix=train,size=large,jobs=40",
)


def best(metrics: dict) -> tuple[str, float]:
    most = max(int(metrics[b]["completed"]) for b in BASELINES)
    name = min((b for b in BASELINES if int(metrics[b]["completed"]) == most),
               key=lambda b: float(metrics[b]["jct_mean_s"]))
    return name, float(metrics[name]["jct_mean_s"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="1,2,3,4,5")
    ap.add_argument("--runtime-error", default="measured")
    ap.add_argument("--workloads", default=None, help="separated by ; (default: the light bursts, or the heavy ones)")
    ap.add_argument("--heavy", action="store_true", help="heavy load: ratio to exclusive, bound 0.5, no OOM kill")
    ap.add_argument("--also", action="append", default=[], help="another policy to report beside (repeatable)")
    ap.add_argument("--bound", type=float, default=None, help="default 1.02 (0.5 with --heavy)")
    args = ap.parse_args(argv)
    bound = args.bound if args.bound is not None else (0.5 if args.heavy else 1.02)
    workloads = args.workloads or ";".join(HEAVY if args.heavy else WORKLOADS)
    ix = Integrations()
    cl = parse_cluster(CLUSTER)
    error = parse_runtime_error(args.runtime_error)
    ours = chart_default_policy()
    names = [ours, *args.also]
    specs = parse_policies(",".join((*names, *BASELINES)))
    print(f"cluster {CLUSTER}; runtime error {error.text()}; chart default {ours}")
    worst = 0.0
    lost = oom = 0
    for text in workloads.split(";"):
        print(f"== {text}")
        for seed in (int(s) for s in args.seeds.split(",")):
            wl = resolve_workload(text, seed, default_data_dir(), fits=fits_on(cl, ix))
            rep = run(wl, cl, specs, seed, ix, record_timeline=False, runtime_error=error)
            m = rep.policies
            name, value = ("exclusive", float(m["exclusive"]["jct_mean_s"])) if args.heavy else best(m)
            orc = rep.runtime_error.get("oracle") if rep.runtime_error else None
            line = f"seed {seed}: best baseline {name} {value:.1f} s (mps-naive {m['mps-naive']['jct_mean_s']:.1f}, " \
                   f"exclusive {m['exclusive']['jct_mean_s']:.1f})"
            for i, p in enumerate(names):
                ratio = float(m[p]["jct_mean_s"]) / value
                label = "default" if i == 0 else p
                line += f" | {label} {ratio:.3f}"
                if orc:
                    ref = float(orc["exclusive"]["jct_mean_s"]) if args.heavy else best(orc)[1]
                    line += f" (oracle {float(orc[p]['jct_mean_s']) / ref:.3f})"
                if i == 0:
                    worst = max(worst, ratio)
                    lost += int(m[p]["arrived"]) - int(m[p]["completed"])
                    oom += int(m[p].get("oom_kills", 0))
                    line += f" OOM {m[p].get('oom_kills', 0)} slowdown samples {m[p].get('slowdown_samples', 0)}"
            print(line, flush=True)
    what = "exclusive" if args.heavy else "best baseline"
    print(f"worst default / {what}: {worst:.3f} (bound {bound:g}); default jobs lost {lost}, OOM kills {oom}")
    return 1 if worst > bound or lost or (args.heavy and oom) else 0


if __name__ == "__main__":
    sys.exit(main())
