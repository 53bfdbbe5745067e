"""Robustness grid: gnnsched's default configuration against the baselines on workloads nobody tuned for.

For every cell of (offered load x arrivals x mix x graph size x cluster x seed) it generates a ``gen:`` workload
(:func:`gnnsched.simulator.workloads.generated`) and simulates it under

* gnnsched's default configuration, read from the chart (``charts/gnnsched/values.yaml``: ``node.agent.policy``,
  ``node.agent.bypassLimit``, ``queuePriority`` and ``scheduler.nodeResourcesScoring``), and
* the baselines that pay the same pod start-up: ``exclusive``, ``mps-naive`` and ``mps-base``; ``temporal``
  (PipeSwitch's pre-initialised workers: no start-up) runs beside them and is reported, not bounded.

It prints, per cell, the ratio of gnnsched's mean JCT and p99 JCT to the best baseline's (the lowest of the three
among those that completed the most jobs; ``mps-naive!1`` when that baseline got there OOM-killing a job, which it
retried: the cost of gnnsched's memory promise is then part of the ratio),
gnnsched's jobs lost and OOM kills, and temporal's mean ratio; then the cells where gnnsched gains the most and the
least. Exit status 1 when any cell is worse than ``--bound`` (1.02) in mean JCT, or gnnsched loses a job or has an OOM
kill in any cell; 0 otherwise.

    python bench/robustness.py [--quick] [--seeds 2] [--jobs 40] [--policy TEXT] [--also TEXT ...] [--json FILE]
                               [--runtime-error none|lognormal:SIGMA[:BIAS]|measured]

``--quick`` is the CI slice (a few cells, one seed, under a minute). ``--policy`` replaces the chart's default (to
compare candidate defaults on the same grid). ``--also`` runs more configurations in the same runs (same workloads,
same seed) and reports each one's mean-JCT ratio beside the default's, not bounded: e.g. ``--also
bmc+sjf2+bypass4+spread+prestart`` shows what the start-up behind the gate (``+prestart``) would change.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gnnsched.simulator.adapters import Integrations
from gnnsched.simulator.cli import default_data_dir, fits_on
from gnnsched.simulator.cluster import parse_cluster
from gnnsched.simulator.policyspec import parse_policies
from gnnsched.simulator.runner import run
from gnnsched.simulator.runtime_error import NO_RUNTIME_ERROR, RuntimeErrorDist, parse_runtime_error
from gnnsched.simulator.workloads import builtin_workload

LOADS = (0.3, 0.7, 1.0, 1.5)
ARRIVALS = ("burst", "poisson")
MIXES = ("train", "mixed", "infer")
SIZES = ("small", "medium", "large")
CLUSTERS = ("1x4xV100-32GB", "2x4xV100-32GB", "2x4xA100-80GB", "1x2xV100-32GB")
BASELINES = ("exclusive", "mps-naive", "mps-base")
REPORTED = ("temporal",)
#: the CI slice: one cell per cluster, spread over the loads, arrivals, mixes and sizes
QUICK = (
    (0.3, "burst", "mixed", "medium", "2x4xV100-32GB"),
    (1.5, "poisson", "train", "large", "1x2xV100-32GB"),
    (0.7, "poisson", "infer", "small", "1x4xV100-32GB"),
    (1.0, "burst", "mixed", "large", "2x4xA100-80GB"),
)
CHART_VALUES = Path(__file__).resolve().parents[1] / "charts" / "gnnsched" / "values.yaml"


#: What a running cluster always does and no chart value turns off: the operator's runtime calibration (``+rtcal``)
#: and the node agent's reading of the workers' step reports (``+progress``), docs/simulator.md *The runtime loop*.
CLUSTER_LOOPS = "+rtcal+progress"


def chart_default_policy(values: Path = CHART_VALUES, loops: bool = True) -> str:
    """The simulator policy that runs what the chart installs by default: the gate's grouping policy and backfill
    limit, ``+spread`` when ``node.agent.spread``, ``+pays`` when ``node.agent.shareWhenPays``, the operator's
    runtime-bucket PriorityClasses (``+sjfN``) when ``queuePriority.enabled``, ``+pack`` when kube-scheduler scores
    ``MostAllocated``, ``+prestart`` when the operator runs the built-in worker behind ``gnnsched gate
    --prestart`` (``operator.workerPrestart``), and the loops a cluster always runs (:data:`CLUSTER_LOOPS`; issue 37:
    the grid used to leave them out, so it did not simulate what a cluster runs). ``loops=False``: the open loop,
    for the benches that compare it with the closed one (``bench/runtime_loop.py``)."""
    doc = yaml.safe_load(values.read_text(encoding="utf-8"))
    agent = doc["node"]["agent"]
    text = str(agent["policy"])
    queue = doc.get("queuePriority") or {}
    if queue.get("enabled"):
        text += f"+sjf{int(queue.get('perDoubling', 2))}"
    text += f"+bypass{int(agent.get('bypassLimit', 4))}"
    if agent.get("spread"):
        text += "+spread"
    if agent.get("shareWhenPays"):
        text += "+pays"
    if str((doc.get("scheduler") or {}).get("nodeResourcesScoring", "")) == "MostAllocated":
        text += "+pack"
    if (doc.get("operator") or {}).get("workerPrestart", False):
        text += "+prestart"
    return text + CLUSTER_LOOPS if loops else text


@dataclass
class Cell:
    """One grid cell's outcome."""

    load: float
    arrival: str
    mix: str
    size: str
    cluster: str
    seed: int
    metrics: dict[str, dict[str, Any]]
    ours: str
    also: tuple[str, ...] = ()
    oracle: dict[str, dict[str, Any]] | None = None  # --runtime-error: the same cell with exact predictions

    @property
    def key(self) -> str:
        return f"{self.cluster} load={self.load:g} {self.arrival} {self.mix} {self.size} s{self.seed}"

    def best_baseline(self, metric: str) -> tuple[str, float]:
        """The lowest ``metric`` among the baselines that completed the most jobs: a mean over completed jobs is
        not comparable between runs that completed different sets (naive MPS that OOM-killed its largest jobs
        past their backoff limit averages over the small ones only)."""
        most = max(int(self.metrics[b]["completed"]) for b in BASELINES)
        vals = {b: self.metrics[b][metric] for b in BASELINES
                if self.metrics[b].get(metric) is not None and int(self.metrics[b]["completed"]) == most}
        name = min(vals, key=vals.__getitem__)
        return name, float(vals[name])

    def oracle_ratio(self, metric: str = "jct_mean_s") -> float:
        """--runtime-error: gnnsched's ``metric`` under the error over its own with exact predictions."""
        if self.oracle is None:
            return 1.0
        mine, exact = self.metrics[self.ours].get(metric), self.oracle[self.ours].get(metric)
        return float("inf") if mine is None or not exact else float(mine) / float(exact)

    def ratio(self, metric: str, policy: str | None = None) -> float:
        _, best = self.best_baseline(metric)
        mine = self.metrics[policy or self.ours].get(metric)
        return float("inf") if mine is None else float(mine) / best

    @property
    def lost(self) -> int:
        """Jobs that arrived and did not complete (failed, unschedulable or never finished: the runs have no
        horizon, so every job that can run does)."""
        m = self.metrics[self.ours]
        return int(m["arrived"]) - int(m["completed"])

    @property
    def oom(self) -> int:
        return int(self.metrics[self.ours].get("oom_kills", 0))


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def summary_table(cells: list[Cell], bound: float, also: tuple[str, ...] = ()) -> list[str]:
    """The grid in one table (the one docs/simulator.md shows): for all cells and each value of each dimension, the
    geometric mean of the mean-JCT and p99 ratios to the best baseline, the worst cell's mean ratio, how many cells
    are above ``bound``; with ``also``, each one's geometric mean, worst and count beside.

    Why a geometric mean: the ratios are relative, and halving one cell's JCT while doubling another's should
    average to 1."""
    groups: list[tuple[str, list[Cell]]] = [("all", cells)]
    for label, attr, values in (("cluster", "cluster", CLUSTERS), ("load", "load", LOADS),
                                ("arrival", "arrival", ARRIVALS), ("mix", "mix", MIXES), ("size", "size", SIZES)):
        for value in values:
            chosen = [c for c in cells if getattr(c, attr) == value]
            if chosen:
                groups.append((f"{label} {value:g}" if isinstance(value, float) else f"{label} {value}", chosen))
    head = "".join(f" | also{i}: geomean / worst / cells > {bound:g}" for i in range(1, len(also) + 1))
    lines = [f"| cells | n | mean-JCT ratio geomean | p99 ratio geomean | worst mean ratio | cells > {bound:g}{head} |",
             "|---|---|---|---|---|---" + "|---" * len(also) + "|"]
    for name, chosen in groups:
        means = [c.ratio("jct_mean_s") for c in chosen]
        extra = ""
        for a in also:
            theirs = [c.ratio("jct_mean_s", a) for c in chosen]
            extra += f" | {geomean(theirs):.3f} / {max(theirs):.3f} / {sum(r > bound for r in theirs)}"
        lines.append(f"| {name} | {len(chosen)} | {geomean(means):.3f} | "
                     f"{geomean([c.ratio('jct_p99_s') for c in chosen]):.3f} | {max(means):.3f} | "
                     f"{sum(m > bound for m in means)}{extra} |")
    return lines


def run_cell(ix: Integrations, load: float, arrival: str, mix: str, size: str, cluster: str, seed: int, jobs: int,
             ours: str, also: tuple[str, ...] = (), runtime_error: RuntimeErrorDist = NO_RUNTIME_ERROR) -> Cell:
    cl = parse_cluster(cluster)
    text = f"gen:load={load:g},arrival={arrival},mix={mix},size={size},jobs={jobs}"
    wl = builtin_workload(text, seed, default_data_dir(), fits=fits_on(cl, ix))
    specs = parse_policies(",".join((ours, *also, *BASELINES, *REPORTED)))
    report = run(wl, cl, specs, seed, ix, record_timeline=False, runtime_error=runtime_error)
    oracle = report.runtime_error.get("oracle") if report.runtime_error else None
    return Cell(load, arrival, mix, size, cluster, seed, report.policies, ours, also, oracle)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the CI slice: 4 cells, 1 seed, 24 jobs each")
    ap.add_argument("--seeds", type=int, default=2, help="seeds per cell (full grid)")
    ap.add_argument("--first-seed", type=int, default=0, help="full grid: seeds first-seed .. first-seed + seeds - 1 "
                    "(to split a long grid into runs)")
    ap.add_argument("--jobs", type=int, default=None, help="jobs per cell (default 40; 24 with --quick)")
    ap.add_argument("--mix", action="append", choices=MIXES, default=None,
                    help="full grid: only these mixes (repeatable; default all)")
    ap.add_argument("--cluster", action="append", choices=CLUSTERS, default=None,
                    help="full grid: only these clusters (repeatable; default all)")
    ap.add_argument("--policy", default=None, help="gnnsched configuration to test (default: the chart's)")
    ap.add_argument("--also", action="append", default=[], metavar="POLICY",
                    help="another configuration to run in the same runs and report beside (repeatable)")
    ap.add_argument("--bound", type=float, default=1.02, help="largest mean-JCT ratio to the best baseline allowed")
    ap.add_argument("--json", type=Path, default=None, help="write every cell's metrics here")
    ap.add_argument("--runtime-error", default="none", help="none, lognormal:SIGMA[:BIAS] or measured: every "
                    "policy sees the prior's runtime, the engine runs the true one (ratios are under the error; "
                    "the column 'vs orac' is gnnsched's mean JCT over its own with exact predictions)")
    args = ap.parse_args(argv)
    runtime_error = parse_runtime_error(args.runtime_error)
    ours = args.policy or chart_default_policy()
    also = tuple(args.also)
    parse_policies(",".join((ours, *also)))
    jobs = args.jobs or (24 if args.quick else 40)
    if args.quick:
        grid = [(*c, 0) for c in QUICK]
    else:
        grid = [(ld, a, m, s, c, seed) for c, ld, a, m, s, seed in
                itertools.product(args.cluster or CLUSTERS, LOADS, ARRIVALS, args.mix or MIXES, SIZES,
                                  range(args.first_seed, args.first_seed + args.seeds))]
    ix = Integrations()
    started = time.perf_counter()
    print(f"gnnsched default configuration: {ours} (chart {CHART_VALUES.name}); baselines {', '.join(BASELINES)}; "
          f"{len(grid)} cells x {jobs} jobs; runtime error {runtime_error.text()}")
    for i, name in enumerate(also, 1):
        print(f"  also{i}: {name}")
    head = "".join(f" {'also' + str(i):>6s}" for i in range(1, len(also) + 1))
    print(f"{'cell':56s} {'best base':>12s} {'mean':>6s} {'p99':>6s} {'lost':>4s} {'oom':>4s} {'temporal':>8s}"
          f"{head} {'vs orac':>7s}")
    cells: list[Cell] = []
    for load, arrival, mix, size, cluster, seed in grid:
        cell = run_cell(ix, load, arrival, mix, size, cluster, seed, jobs, ours, also, runtime_error)
        cells.append(cell)
        best, _ = cell.best_baseline("jct_mean_s")
        killed = int(cell.metrics[best].get("oom_kills", 0))
        best_text = f"{best}!{killed}" if killed else best  # the best baseline got there OOM-killing jobs
        flag = " <-- worse" if cell.ratio("jct_mean_s") > args.bound else ""
        print(f"{cell.key:56s} {best_text:>12s} {cell.ratio('jct_mean_s'):6.3f} {cell.ratio('jct_p99_s'):6.3f} "
              f"{cell.lost:4d} {cell.oom:4d} {cell.ratio('jct_mean_s', 'temporal'):8.3f}"
              + "".join(f" {cell.ratio('jct_mean_s', name):6.3f}" for name in also)
              + f" {cell.oracle_ratio():7.3f}" + flag, flush=True)
    elapsed = time.perf_counter() - started
    means = sorted(cells, key=lambda c: c.ratio("jct_mean_s"))
    worse = [c for c in cells if c.ratio("jct_mean_s") > args.bound]
    lost = sum(c.lost for c in cells)
    oom = sum(c.oom for c in cells)
    print(f"\n{len(cells)} cells in {elapsed:.1f} s; mean-JCT ratio to the best baseline: "
          f"min {means[0].ratio('jct_mean_s'):.3f} ({means[0].key}), "
          f"max {means[-1].ratio('jct_mean_s'):.3f} ({means[-1].key})")
    p99 = sorted(c.ratio("jct_p99_s") for c in cells)
    print(f"p99 ratio: min {p99[0]:.3f}, max {p99[-1]:.3f}; cells worse than {args.bound}: {len(worse)}; "
          f"gnnsched jobs lost {lost}, OOM kills {oom}")
    print("most gained (lowest mean-JCT ratio): " + "; ".join(f"{c.key} {c.ratio('jct_mean_s'):.3f}"
                                                              for c in means[:3]))
    print("least gained (highest mean-JCT ratio): " + "; ".join(f"{c.key} {c.ratio('jct_mean_s'):.3f}"
                                                                for c in means[::-1][:3]))
    if runtime_error.active:
        orac = sorted(c.oracle_ratio() for c in cells)
        print(f"runtime error {runtime_error.text()}: gnnsched's mean JCT over its own with exact predictions: "
              f"geomean {geomean(orac):.3f}, min {orac[0]:.3f}, max {orac[-1]:.3f}")
    print()
    print("\n".join(summary_table(cells, args.bound, also)))
    for i, name in enumerate(also, 1):
        ratios = sorted(c.ratio("jct_mean_s", name) for c in cells)
        gain = sorted(c.ratio("jct_mean_s", name) / c.ratio("jct_mean_s") for c in cells)
        a_lost = sum(int(c.metrics[name]["arrived"]) - int(c.metrics[name]["completed"]) for c in cells)
        a_oom = sum(int(c.metrics[name].get("oom_kills", 0)) for c in cells)
        print(f"also{i} {name}: mean-JCT ratio to the best baseline min {ratios[0]:.3f}, max {ratios[-1]:.3f}, "
              f"cells worse than {args.bound}: {sum(r > args.bound for r in ratios)}; its mean JCT / the default's: "
              f"min {gain[0]:.3f}, median {gain[len(gain) // 2]:.3f}, max {gain[-1]:.3f}; "
              f"jobs lost {a_lost}, OOM kills {a_oom}")
    if args.json is not None:
        args.json.write_text(json.dumps([{"cell": c.key, "load": c.load, "arrival": c.arrival, "mix": c.mix,
                                          "size": c.size, "cluster": c.cluster, "seed": c.seed, "policy": ours,
                                          "ratio_mean": c.ratio("jct_mean_s"), "ratio_p99": c.ratio("jct_p99_s"),
                                          "also": {name: c.ratio("jct_mean_s", name) for name in also},
                                          "lost": c.lost, "metrics": c.metrics,
                                          "runtime_error": runtime_error.text(), "oracle_metrics": c.oracle}
                                         for c in cells], indent=1))
    return 1 if worse or lost or oom else 0


if __name__ == "__main__":
    sys.exit(main())
