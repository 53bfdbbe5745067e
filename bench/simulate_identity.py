"""Identity check for engine speed-ups: a hash of every per-job outcome (and the run's integrals, timeline and group
records) of ``Simulation`` runs, plus the JSON ``gnnsched simulate`` writes for a few built-in workloads.

Why: the simulator's speed work must not change a single decision. Run it before a change with ``--save FILE``
and after it with ``--check FILE``; it prints one line per run and exits 1 when any hash differs.

    python bench/simulate_identity.py [--save F | --check F] [--quick] [--no-cli]

Job costs depend on ``$GNNSCHED_DATA_DIR`` (the estimator reads real graphs when it finds them), so it is recorded
and compared too: save and check with the same value. Runs (the same workload generator as ``bench/simulate_scale.py``):

* every engine policy (and the gate rules' variants, ``GATE_RULES``) on 5,000 jobs / 100 nodes x 8 V100 at load
  0.85 and on 4,000 jobs / 40 nodes at load 1.3
  (a saturated cluster: long pending queues, failed placements, retries);
* the slow policies of the scale benchmark on 20,000 jobs / 1,000 nodes (skipped with ``--quick``);
* ``gnnsched simulate --json`` on ``cognn-mix``, ``gnnsched-mix-high`` and ``resource-demand`` (``--no-cli``: not).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from simulate_scale import all_policies, build_workload  # noqa: E402

from gnnsched.simulator.adapters import Integrations  # noqa: E402
from gnnsched.simulator.engine import Simulation  # noqa: E402
from gnnsched.simulator.policyspec import parse_policies  # noqa: E402

SLOW = ("base,lmcf-interference,base-interference,bmc-interference,sqtf-interference,bqt-interference,bqt+scaling,"
        "sqtf+sjf2+bypass4+spread")
#: the gate rules' other paths (share rule, prestart, strict prefix, another grouping policy), beside ``all_policies()``
GATE_RULES = "sqtf+spread+pays,bmc+sjf2+bypass4+spread+prestart,lmcf+bypass0+spread,bqt+sjf+spread+scaling"
CLI_WORKLOADS = ("cognn-mix", "gnnsched-mix-high", "resource-demand")


def outcome_hash(res) -> str:
    """sha256 over every outcome field (floats by repr: bit-exact), the integrals, timeline and group records."""
    h = hashlib.sha256()
    for o in res.outcomes:
        h.update(repr((o.job.id, o.status, o.first_start, o.start, o.finish, o.node, o.gpu, o.oom_kills, o.attempts,
                       o.ran, o.slowdown_max, o.cpu_milli, o.memory_bytes, o.reason)).encode())
    h.update(repr((res.end_time, res.gpu_mem_area, res.sm_area, res.cpu_alloc_area, res.mem_alloc_area,
                   res.idle_gpu_waiting_area, res.waiting_time, res.gate_checks)).encode())
    h.update(repr(res.timeline).encode())
    h.update(repr([(g.t, g.gpu, g.jobs, g.committed, g.used, g.capacity) for g in res.groups]).encode())
    return h.hexdigest()[:16]


def engine_runs(quick: bool) -> dict[str, str]:
    ix = Integrations()
    every = all_policies() + "," + GATE_RULES
    configs = [("5k/100n/0.85", 5000, 100, 0.85, every), ("4k/40n/1.3", 4000, 40, 1.3, every)]
    if not quick:
        configs.append(("20k/1000n/0.85", 20000, 1000, 0.85, SLOW))
    out: dict[str, str] = {}
    for label, n_jobs, nodes, load, policies in configs:
        specs = parse_policies(policies)
        jobs, cluster, _, _, _ = build_workload(ix, jobs=n_jobs, nodes=nodes, gpus=8, model="V100-32GB", load=load,
                                                seed=0, scaled=True)
        for spec in specs:
            t0 = time.process_time()
            res = Simulation(jobs, cluster, spec, ix, record_timeline=True).run()
            key = f"{label} {spec.text}"
            out[key] = outcome_hash(res)
            print(f"{key:40s} {out[key]}  ({time.process_time() - t0:.1f} s cpu)", flush=True)
    return out


def cli_runs() -> dict[str, str]:
    out: dict[str, str] = {}
    exe = Path(sys.executable).with_name("gnnsched")
    with tempfile.TemporaryDirectory() as tmp:
        for w in CLI_WORKLOADS:
            path = Path(tmp) / f"{w}.json"
            t0 = time.perf_counter()
            subprocess.run([str(exe), "simulate", "--workload", w, "--json", str(path), "--no-progress"],
                           check=True, stdout=subprocess.DEVNULL, env=dict(os.environ))
            doc = json.loads(path.read_text())
            key = f"cli {w}"
            out[key] = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]
            print(f"{key:40s} {out[key]}  ({time.perf_counter() - t0:.1f} s wall)", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--save", type=Path)
    ap.add_argument("--check", type=Path)
    ap.add_argument("--quick", action="store_true", help="skip the 20,000-job runs")
    ap.add_argument("--no-cli", action="store_true", help="skip gnnsched simulate --json")
    args = ap.parse_args()
    # the estimator reads real graphs from the data folder when it finds one: job costs (so every hash) depend on it
    got = {"_env GNNSCHED_DATA_DIR": os.environ.get("GNNSCHED_DATA_DIR", "")}
    got.update(engine_runs(args.quick))
    if not args.no_cli:
        got.update(cli_runs())
    if args.save:
        args.save.write_text(json.dumps(got, indent=1, sort_keys=True))
        print(f"saved {len(got)} hashes to {args.save}")
    if args.check:
        want = json.loads(args.check.read_text())
        common = sorted(set(want) & set(got))
        diff = [k for k in common if want[k] != got[k]]
        print(f"compared {len(common)} runs with {args.check}: "
              + ("all identical" if not diff else f"{len(diff)} DIFFER: " + ", ".join(diff)))
        return 1 if diff else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
