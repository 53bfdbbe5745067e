"""The gate's backfill rule measured on the seeds' workloads: every gnnsched policy with the strict prefix rule
(``+bypass0``) and with bounded-bypass backfill (``+bypassN``), beside MPS everything-at-once (``mps-naive``, OOM kill
and restart) and the best non-gnnsched policy of the workload's own list.

Prints one row per (workload, policy): mean JCT, p99 JCT, OOM kills, completed jobs; then per limit the geometric mean
of gnnsched's best policy over ``mps-naive`` and over the strict prefix rule.

    python bench/backfill.py [--seed 0] [--limits 0,2,4,8,16,64] [--workloads gnnsched,cognn,resource-demand]
                             [--cluster C]
"""

from __future__ import annotations

import argparse
import math
import os
import time

from gnnsched.simulator.adapters import Integrations
from gnnsched.simulator.cli import default_data_dir, fits_on
from gnnsched.simulator.cluster import parse_cluster
from gnnsched.simulator.policyspec import parse_policies, parse_policy
from gnnsched.simulator.runner import run
from gnnsched.simulator.workloads import builtin_workload, default_cluster

GNNSCHED_QUEUES = [f"gnnsched-{q}-{load}" for q in ("gcn", "sage", "gin", "mix") for load in ("low", "high")]
COGNN_QUEUES = [f"cognn-{q}" for q in ("gcn", "sage", "gat", "gin", "mix")]


def _with(policy: str, n: int) -> str:
    """``lmcf@48`` + limit 4 → ``lmcf+bypass4@48`` (``@N`` must come last)."""
    base, at, cap = policy.partition("@")
    return f"{base}+bypass{n}{at}{cap}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limits", default="0,2,4,8,16,64")
    ap.add_argument("--workloads", default="gnnsched,cognn")
    ap.add_argument("--cluster", default=None,
                    help="run every workload on this cluster instead of its own (a sensitivity check, not the seeds)")
    args = ap.parse_args()
    limits = [int(x) for x in args.limits.split(",")]
    names = []
    if "gnnsched" in args.workloads:
        names += GNNSCHED_QUEUES
    if "cognn" in args.workloads:
        names += COGNN_QUEUES
    if "resource-demand" in args.workloads:
        names += ["resource-demand"]
    data = default_data_dir()
    ix = Integrations()
    started = time.perf_counter()
    ratios_naive: dict[int, list[float]] = {n: [] for n in limits}
    ratios_prefix: dict[int, list[float]] = {n: [] for n in limits}
    p99_prefix: dict[int, list[float]] = {n: [] for n in limits}
    oom_ours = 0
    per_policy: dict[int, list[tuple[str, float, float]]] = {n: [] for n in limits}  # (run, mean ratio, p99 ratio)
    print(f"seed {args.seed}; JCT mean / p99 in s; gnnsched policies as POLICY+bypassN (N=0: strict prefix)")
    for name in names:
        cl = parse_cluster(args.cluster or default_cluster(name), data)
        wl = builtin_workload(name, args.seed, data, fits=fits_on(cl, ix))
        ours = [p for p in wl.policies if parse_policy(p).is_ours]
        others = [p for p in wl.policies if not parse_policy(p).is_gnnsched]
        policies = others + [_with(p, n) for p in ours for n in limits]
        rep = run(wl, cl, parse_policies(",".join(policies)), args.seed, ix, record_timeline=False)
        m = rep.policies
        best_other = min(others, key=lambda p: m[p]["jct_mean_s"])
        naive = m.get("mps-naive", m[best_other])  # resource-demand runs no mps-naive: its best other instead
        print(
            f"{name}: mps-naive (or best other) {naive['jct_mean_s']:.1f} / {naive['jct_p99_s']:.1f} s, "
            f"{naive['oom_kills']} OOM, "
            f"{naive['completed']} done; best other {best_other} {m[best_other]['jct_mean_s']:.1f} s"
        )
        for p in ours:
            cells = []
            for n in limits:
                r = m[_with(p, n)]
                oom_ours += r["oom_kills"]
                cells.append(f"N={n}: {r['jct_mean_s']:.1f}/{r['jct_p99_s']:.1f} oom {r['oom_kills']} "
                             f"done {r['completed']}")
            print(f"    {p:5s} " + " | ".join(cells))
        for p in ours:
            r0 = m[_with(p, 0)] if 0 in limits else None
            for n in limits:
                if r0 is not None and n:
                    r = m[_with(p, n)]
                    per_policy[n].append((f"{name} {p}", r["jct_mean_s"] / r0["jct_mean_s"],
                                          r["jct_p99_s"] / r0["jct_p99_s"]))
        for n in limits:
            best = min(ours, key=lambda p: m[_with(p, n)]["jct_mean_s"])
            prefix_best = min(ours, key=lambda p: m[_with(p, 0)]["jct_mean_s"])
            r, r0 = m[_with(best, n)], m[_with(prefix_best, 0)]
            ratios_naive[n].append(r["jct_mean_s"] / naive["jct_mean_s"])
            ratios_prefix[n].append(r["jct_mean_s"] / r0["jct_mean_s"])
            p99_prefix[n].append(r["jct_p99_s"] / r0["jct_p99_s"])
        cmp = ", ".join(
            f"N={n} {min(m[_with(p, n)]['jct_mean_s'] for p in ours) / naive['jct_mean_s']:.4f}"
            for n in limits)
        print(f"    best gnnsched / mps-naive mean JCT: {cmp}")

    def gmean(xs: list[float]) -> float:
        return math.exp(sum(math.log(x) for x in xs) / len(xs))

    for n in limits:
        worse = sum(1 for x in ratios_naive[n] if x > 1.0005)
        print(f"N={n:3d}: best gnnsched / mps-naive mean JCT geomean {gmean(ratios_naive[n]):.4f} "
              f"(max {max(ratios_naive[n]):.4f}, worse on {worse} of {len(ratios_naive[n])}); vs strict prefix: "
              f"mean JCT {gmean(ratios_prefix[n]):.4f}, p99 {gmean(p99_prefix[n]):.4f} "
              f"(max p99 {max(p99_prefix[n]):.4f})")
    for n in limits:
        rows = per_policy[n]
        changed = [r for r in rows if abs(r[1] - 1) > 1e-9 or abs(r[2] - 1) > 1e-9]
        if not n or not rows:
            continue
        print(
            f"N={n:3d} against N=0, per policy: {len(changed)} of {len(rows)} (workload, policy) runs change; "
            f"mean JCT better in {sum(1 for r in changed if r[1] < 1 - 1e-9)}, worse in "
            f"{sum(1 for r in changed if r[1] > 1 + 1e-9)}; "
            f"p99 better in {sum(1 for r in changed if r[2] < 1 - 1e-9)}, "
            f"worse in {sum(1 for r in changed if r[2] > 1 + 1e-9)}"
        )
        for run_name, mean_r, p99_r in changed:
            print(f"    {run_name}: mean JCT {100 * (mean_r - 1):+.2f} %, p99 {100 * (p99_r - 1):+.2f} %")
    print(f"OOM kills over all gnnsched runs: {oom_ours}")
    print(f"total {time.perf_counter() - started:.0f} s, load average {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
