"""Where gnnsched's gap to naive MPS (no UVM: OOM kills) on the GNNSched high-load queues comes from.

``mps-naive`` is not one of the paper's policies, but it is the one policy of the run whose mean JCT beats
gnnsched's on those queues. Two suspects, measured side by side on the same jobs:

1. the gate's safety margin: gnnsched is re-run with the gate reserving the bare predicted peak (PMC plus device
   overhead) instead of the estimator's ``admit_bytes``; in the simulator the peak is exact, so this is the margin's
   whole price;
2. the job set: ``mps-naive``'s mean covers only the jobs it completed; the second figure is every policy's mean JCT
   over the jobs all of them completed, and the jobs ``mps-naive`` failed are listed with gnnsched's JCT for them.

    python bench/mps_naive_gap.py [--seed 0] [--queues gcn,sage,gin]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from typing import Any

from gnnsched.simulator.adapters import Integrations
from gnnsched.simulator.cli import default_data_dir, fits_on
from gnnsched.simulator.cluster import parse_cluster
from gnnsched.simulator.model import JobProfile
from gnnsched.simulator.policyspec import parse_policies
from gnnsched.simulator.runner import run
from gnnsched.simulator.workloads import builtin_workload, default_cluster

OURS = ("sqtf", "bqt", "lmcf", "bmc")


class BarePeakGate(Integrations):
    """The gate reserves what the job really peaks at: no safety margin (safe here only because the simulated peak is
    the prediction itself)."""

    def profile(self, spec: Any, gpu_model: str, cpu_cores: float | None = None) -> JobProfile:
        prof = super().profile(spec, gpu_model, cpu_cores)
        return dataclasses.replace(prof, admit_bytes=prof.peak_bytes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--queues", default="gcn,sage,gin")
    args = parser.parse_args()
    data = default_data_dir()
    policies = parse_policies(",".join(("mps-naive",) + OURS))
    started = time.perf_counter()
    for queue in args.queues.split(","):
        name = f"gnnsched-{queue}-high"
        cluster = parse_cluster(default_cluster(name), data)
        workload = builtin_workload(name, args.seed, data, fits=fits_on(cluster, Integrations()))
        reports = {label: run(workload, cluster, policies, args.seed, ix, record_timeline=False)
                   for label, ix in (("admit bytes", Integrations()), ("bare peak", BarePeakGate()))}
        for label, rep in reports.items():
            m = rep.policies
            print(f"{name} gate reserves {label:11s} mean JCT s: "
                  + "  ".join(f"{p} {m[p]['jct_mean_s']:.1f}" for p in ("mps-naive",) + OURS)
                  + f"  (mps-naive: {m['mps-naive']['oom_kills']} OOM kills, {m['mps-naive']['completed']} completed;"
                    f" gnnsched OOM kills {sum(m[p]['oom_kills'] for p in OURS)})")
        rep = reports["admit bytes"]
        done = {p: {o.job.id: o.jct for o in res.outcomes if o.status == "completed"} for p, res in rep.results.items()}
        common = set.intersection(*(set(v) for v in done.values()))
        print(f"{name} over the {len(common)} jobs every policy completed, mean JCT s: "
              + "  ".join(f"{p} {sum(done[p][i] for i in common) / len(common):.2f}" for p in done))
        dropped = [o for o in rep.results["mps-naive"].outcomes if o.status != "completed"]
        for o in dropped:
            theirs = [next(x.jct for x in rep.results[p].outcomes if x.job.id == o.job.id) for p in OURS]
            print(f"    mps-naive {o.status} {o.job.name} after {o.oom_kills} OOM kills; gnnsched's JCT for it "
                  f"{min(theirs):.1f}-{max(theirs):.1f} s")
    print(f"# {time.perf_counter() - started:.0f} s wall, load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
