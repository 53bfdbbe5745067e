"""gnnsched's pending-queue order (``+sjf``) and node packing (``+pack``: NodeResourcesFit ``MostAllocated`` instead
of the default ``LeastAllocated``) on the resource-demand workload, seed by seed, with the figures that explain them:
deployed / completed jobs, mean JCT, and the mean queueing time of the jobs that ask for 30 cores or more (the ones a
CPU-short cluster leaves waiting), against the paper's SRTF and FIFO on exclusive GPUs (kube-scheduler's default
profile; ``+pack`` there too). Ends with each policy's totals over the seeds, beside two bounds no policy can pass:
the jobs that arrived, and the jobs that could complete had each started on arrival and run alone at its fastest
(original or right-sized request: ``arrival + start-up + solo runtime <= horizon``). The "missed" column counts the
jobs of that bound a policy did not complete, and in brackets those among them that asked for 30 cores or more and
never started.

    python bench/queue_order.py [--seeds 0,1,2,3,4] [--policies lmcf+scaling,lmcf+scaling+sjf,...]

Each seed's workload is costed once and replayed under every policy (``gnnsched.simulator.runner``), exactly what
``gnnsched simulate --workload resource-demand --seed S --policies ...`` does; the default policy list is the one in
docs/simulator.md's table. Prints one row per (seed, policy) and the load average at the end (the machine is shared).
"""

from __future__ import annotations

import argparse
import os
import time

from gnnsched.simulator.adapters import Integrations
from gnnsched.simulator.cli import default_data_dir, fits_on
from gnnsched.simulator.cluster import parse_cluster
from gnnsched.simulator.costs import STARTUP_S
from gnnsched.simulator.engine import Simulation
from gnnsched.simulator.metrics import summarise
from gnnsched.simulator.model import SimJob
from gnnsched.simulator.policyspec import parse_policies
from gnnsched.simulator.runner import materialise
from gnnsched.simulator.workloads import default_cluster, resolve_workload

DEFAULT_POLICIES = ("lmcf+scaling+sjf+pack,lmcf+scaling+sjf,lmcf+scaling,srtf+scaling,srtf+scaling+pack,"
                    "exclusive+scaling,lmcf+sjf+pack,lmcf+sjf,srtf,srtf+pack,exclusive")
BIG_CPU_MILLI = 30_000


def completable(jobs: list[SimJob], horizon: float, gpu_model: str) -> set[int]:
    """The jobs that could finish by ``horizon`` with no queueing and no co-runner: their count bounds every policy's
    completions, so the distance to it says how much room a better order or placement has left."""
    return {j.id for j in jobs if j.arrival <= horizon
            and j.arrival + STARTUP_S + j.profile(gpu_model).solo_s * min(1.0, j.scaled_solo_factor) <= horizon}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--policies", default=DEFAULT_POLICIES)
    args = parser.parse_args()
    specs = parse_policies(args.policies)
    data = default_data_dir()
    cluster = parse_cluster(default_cluster("resource-demand"), data)
    ix = Integrations()
    print(f"{'seed':>4} {'policy':22s} {'arrived':>7} {'deployed':>8} {'done':>5} {'JCT mean s':>10} "
          f"{'queue s':>8} {'big-job queue s':>15} {'missed (big, unstarted)':>23}")
    started = time.perf_counter()
    totals: dict[str, list[float]] = {spec.text: [0, 0, 0] for spec in specs}  # arrived, deployed, completed
    bound_total = 0
    for seed in (int(s) for s in args.seeds.split(",")):
        workload = resolve_workload("resource-demand", seed, data, fits=fits_on(cluster, ix))
        jobs = materialise(workload, cluster, ix, scaling=any(p.scaling for p in specs))
        bound = completable(jobs, workload.horizon, cluster.nodes[0].gpu_model)
        bound_total += len(bound)
        print(f"{seed:>4} {'(completion bound)':22s} {len(jobs):>7} {'':>8} {len(bound):>5}")
        for spec in specs:
            sim = Simulation(jobs, cluster, spec, ix, horizon=workload.horizon, max_clients=workload.max_clients,
                             record_timeline=False)
            result = sim.run()
            m = summarise(result)
            horizon = workload.horizon or result.end_time
            big = [o for o in result.outcomes if o.cpu_milli >= BIG_CPU_MILLI]
            # queueing of the big jobs up to the horizon (a job never started waited the whole rest of the run)
            waits = [min(o.first_start if o.first_start is not None else horizon, horizon) - o.job.arrival for o in big]
            big_q = sum(waits) / len(waits) if waits else float("nan")
            missed = [o for o in result.outcomes if o.job.id in bound and o.status != "completed"]
            starved = sum(1 for o in missed if o.first_start is None and o.cpu_milli >= BIG_CPU_MILLI)
            print(f"{seed:>4} {spec.text:22s} {len(jobs):>7} {m['deployed']:>8} {m['completed']:>5} "
                  f"{m['jct_mean_s']:>10.0f} {m['queue_mean_s']:>8.0f} {big_q:>15.0f} "
                  f"{f'{len(missed)} ({starved})':>23}", flush=True)
            for i, v in enumerate((len(jobs), m["deployed"], m["completed"])):
                totals[spec.text][i] += v
    print(f"\n{'all seeds':>4} {'policy':22s} {'arrived':>7} {'deployed':>8} {'done':>5}")
    for name, (arrived, deployed, done) in totals.items():
        print(f"{'':>9} {name:22s} {arrived:>7} {deployed:>8} {done:>5}  ({bound_total - done} short of the bound)")
    print(f"{'':>9} {'(completion bound)':22s} {'':>7} {'':>8} {bound_total:>5}")
    print(f"# {time.perf_counter() - started:.0f} s wall, load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
