"""The papers' headline ratios beside the simulator's, averaged the way each paper averaged them.

* CoGNN (seed 002): mean JCT of Default over CoGNN-LMCF, averaged over the GCN/SAGE/GAT/GIN/Mix queues (paper 9.9x).
* GNNSched (seed 000): mean-JCT reduction of GNNSched against Default, MPS-Base and MPS-Aggr, averaged over the four
  queues and both loads (paper -60.6 %, -26.8 % and -62.7 %), and against the published SQTF/BQT (``-paper``). GNNSched
  is taken as the better of SQTF and BQT per queue (the paper
  reports them within 0.6 % of each other).
* Resource-demand (seed 004): deployed tasks and completion rate with adaptive scaling against without, FIFO, at
  70 jobs/h for 12 h (paper +25.3 % and +15.2 %).

Also prints, per workload, gnnsched's best policy against the best other policy of the same run.

    python bench/simulate_papers.py [--seed 0] [--quick] [--runtime-error DIST]     (--quick: Mix queues only)

``--runtime-error`` (``none``, ``lognormal:SIGMA[:BIAS]``, ``measured``): the policies see the prior's runtimes and the
engine runs the true ones (:mod:`gnnsched.simulator.runtime_error`); each headline is printed under the error and,
from the same run, with exact predictions (``oracle``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from gnnsched.simulator.adapters import Integrations
from gnnsched.simulator.cli import default_data_dir, fits_on
from gnnsched.simulator.cluster import parse_cluster
from gnnsched.simulator.policyspec import parse_policies
from gnnsched.simulator.runner import Report, run
from gnnsched.simulator.runtime_error import NO_RUNTIME_ERROR, RuntimeErrorDist, parse_runtime_error
from gnnsched.simulator.workloads import builtin_workload, default_cluster


def _run(name: str, seed: int, ix: Integrations, data: Path, policies: str | None = None, cluster: str | None = None,
         runtime_error: RuntimeErrorDist = NO_RUNTIME_ERROR) -> Report:
    cl = parse_cluster(cluster or default_cluster(name), data)
    wl = builtin_workload(name, seed, data, fits=fits_on(cl, ix))
    specs = parse_policies(policies or ",".join(wl.policies))
    return run(wl, cl, specs, seed, ix, record_timeline=False, runtime_error=runtime_error)


def _views(rep: Report) -> list[tuple[str, dict]]:
    """The run's figures under the runtime error, then (with one) the same run's with exact predictions."""
    out: list[tuple[str, dict]] = [("", rep.policies)]
    if rep.runtime_error:
        out.append(("oracle", rep.runtime_error["oracle"]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runtime-error", default="none", help="none, lognormal:SIGMA[:BIAS] or measured")
    args = ap.parse_args()
    rterr = parse_runtime_error(args.runtime_error)
    print(f"runtime error: {rterr.text()}")
    data = default_data_dir()
    ix = Integrations()
    started = time.perf_counter()
    best_lines = []

    queues = ("mix",) if args.quick else ("gcn", "sage", "gat", "gin", "mix")
    ratios: dict[str, list[float]] = {}
    ratios48: dict[str, list[float]] = {}
    for q in queues:
        rep = _run(f"cognn-{q}", args.seed, ix, data, runtime_error=rterr)
        for label, v in _views(rep):
            ratios.setdefault(label, []).append(v["exclusive"]["jct_mean_s"] / v["lmcf"]["jct_mean_s"])
            ratios48.setdefault(label, []).append(v["exclusive"]["jct_mean_s"] / v["lmcf@48"]["jct_mean_s"])
        m = rep.policies
        best_lines += [f"cognn-{q}: " + _best(rep)]
        print(
            f"cognn-{q:5s} JCT exclusive {m['exclusive']['jct_mean_s']:.1f} s  temporal "
            f"{m['temporal']['jct_mean_s']:.1f} s  mps-naive+uvm {m['mps-naive+uvm']['jct_mean_s']:.1f} s  "
            f"lmcf {m['lmcf']['jct_mean_s']:.1f} s  lmcf@48 {m['lmcf@48']['jct_mean_s']:.1f} s  (OOM mps-naive "
            f"{m['mps-naive']['oom_kills']}, "
            f"gnnsched {sum(m[p]['oom_kills'] for p in ('base', 'lmcf', 'bmc'))})"
        )
    for label in ratios:
        print(f"CoGNN{' (' + label + ')' if label else ''}: Default / LMCF mean JCT: paper 9.9x, simulated "
              f"{statistics.mean(ratios[label]):.2f}x (per queue {', '.join(f'{r:.2f}' for r in ratios[label])}); "
              f"without the 2-worker cap (lmcf@48) {statistics.mean(ratios48[label]):.2f}x")

    gq = ("mix",) if args.quick else ("gcn", "sage", "gin", "mix")
    gains: dict[str, dict[str, list[float]]] = {}
    for q in gq:
        for load in ("low", "high"):
            rep = _run(f"gnnsched-{q}-{load}", args.seed, ix, data, runtime_error=rterr)
            for label, v in _views(rep):
                mine = min(v["sqtf"]["jct_mean_s"], v["bqt"]["jct_mean_s"])
                theirs = min(v["sqtf-paper+uvm"]["jct_mean_s"], v["bqt-paper+uvm"]["jct_mean_s"])
                g = gains.setdefault(label, {"default": [], "base": [], "aggr": [], "paper": []})
                for key, other in (("default", v["exclusive"]["jct_mean_s"]),
                                   ("base", v["mps-base+uvm"]["jct_mean_s"]),
                                   ("aggr", v["mps-naive+uvm"]["jct_mean_s"]), ("paper", theirs)):
                    g[key].append(100 * (mine - other) / other)
            m = rep.policies
            ours = min(m["sqtf"]["jct_mean_s"], m["bqt"]["jct_mean_s"])
            best_lines += [f"gnnsched-{q}-{load}: " + _best(rep)]
            paper = min(m["sqtf-paper+uvm"]["jct_mean_s"], m["bqt-paper+uvm"]["jct_mean_s"])
            over = {p: sum(1 for g in rep.results[p].groups if g.used > g.capacity)
                    for p in ("mps-naive+uvm", "mps-base+uvm", "sqtf-paper+uvm", "bqt-paper+uvm", "sqtf", "bqt")}
            print(f"gnnsched-{q}-{load:4s} JCT exclusive {m['exclusive']['jct_mean_s']:.1f} s  mps-naive+uvm "
                  f"{m['mps-naive+uvm']['jct_mean_s']:.1f} s  mps-base+uvm {m['mps-base+uvm']['jct_mean_s']:.1f} s  "
                  f"paper SQTF/BQT {paper:.1f} s  mps-naive (OOM) {m['mps-naive']['jct_mean_s']:.1f} s "
                  f"({m['mps-naive']['oom_kills']} OOM kills)  gnnsched {ours:.1f} s; oversubscribed admissions "
                  + ", ".join(f"{p} {n}" for p, n in over.items()))
            print(
                f"    QoS violations: exclusive "
                f"{m['exclusive']['qos_violation_rate']:.0%}, mps-base {m['mps-base+uvm']['qos_violation_rate']:.0%}, "
                f"gnnsched {min(m['sqtf']['qos_violation_rate'], m['bqt']['qos_violation_rate']):.0%}; "
                "OOM kills: "
                f"gnnsched {m['sqtf']['oom_kills'] + m['bqt']['oom_kills']}, mps-naive {m['mps-naive']['oom_kills']}"
            )
    for label, g in gains.items():
        print(f"GNNSched{' (' + label + ')' if label else ''}: JCT vs Default: paper -60.6 %, simulated "
              f"{statistics.mean(g['default']):+.1f} %; vs MPS-Base: paper -26.8 %, simulated "
              f"{statistics.mean(g['base']):+.1f} %; vs MPS-Aggr: paper -62.7 %, simulated "
              f"{statistics.mean(g['aggr']):+.1f} %; vs the published SQTF/BQT (best of the two, +uvm): "
              f"{statistics.mean(g['paper']):+.1f} %")

    rep = _run("resource-demand", args.seed, ix, data,
               policies="lmcf,lmcf+scaling,lmcf-interference+scaling,exclusive,exclusive+scaling,srtf,srtf+scaling,"
                        "drf,drf+scaling", runtime_error=rterr)
    m = rep.policies
    jobs = rep.results["lmcf+scaling"].outcomes
    cut = 1 - sum(o.cpu_milli for o in jobs) / sum(o.job.cpu_milli for o in jobs)
    before = sum(o.job.cpu_milli for o in jobs) / len(jobs) / 1000
    after = sum(o.cpu_milli for o in jobs) / len(jobs) / 1000
    print(f"resource-demand: scale() cut the mean CPU request from {before:.1f} to {after:.1f} cores "
          f"({-100 * cut:.1f} %; paper -28.5 %)")
    for (label, v), base in ((lv, b) for lv in _views(rep) for b in ("lmcf", "exclusive", "srtf", "drf")):
        a, b = v[base], v[f"{base}+scaling"]
        tag = f" ({label})" if label else ""
        print(f"resource-demand{tag} {base:9s}: deployed {a['deployed']} -> {b['deployed']} "
              f"({100 * (b['deployed'] - a['deployed']) / a['deployed']:+.1f} %), completion rate "
              f"{a['completion_rate']:.3f} -> {b['completion_rate']:.3f} "
              f"({100 * (b['completion_rate'] - a['completion_rate']) / a['completion_rate']:+.1f} %), "
              f"queue {a['queue_mean_s']:.0f} s, GPU busy while jobs wait {a['unallocated_gpus']}")
    print(
        "resource-demand: paper +25.3 % deployed, +15.2 % completion (FIFO +- scaling; here lmcf = FIFO on shared GPUs)"
    )
    best_lines += ["resource-demand: " + _best(rep)]
    print("\n".join(best_lines))
    print(f"total {time.perf_counter() - started:.0f} s, load average {os.getloadavg()}")
    return 0


def _best(rep) -> str:
    out = [f"vs {'the paper' if ref.get('against') == 'paper' else 'best other'}: {ref['compare']} {ref['metric']} "
           f"ratio {ref['simulated']} ({ref['verdict']}{'; ' + ref['note'] if ref.get('note') else ''})"
           for ref in rep.reference if ref["paper_value"] is None]
    return "; ".join(out) if out else "no gnnsched policy in this run"


if __name__ == "__main__":
    raise SystemExit(main())
