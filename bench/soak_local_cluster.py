"""A soak of the whole system: many GNNJobs in several namespaces through the local cluster (every real component,
fake GPUs), the shape of issue 38's held-out check (80 jobs, three namespaces).

Why: the component tests each run a few jobs; a crowd finds what a few do not (a name used in two namespaces, a
queue that never drains, a namespace that does not exist yet, a job's pods mixed up with another's). The jobs are
the repository's examples made tiny (``tests/e2e/jobs.py``: GCN, GAT parallel inference, GIN, PNA, SAGE mini-batch,
a transformer stack), the user's own model from an image without gnnsched (``examples/custom-entrypoint``), and small
GCNs, some checkpointing; each namespace gets the same names, so every name is used in every namespace. Namespaces
other than ``default`` do not exist beforehand (the harness creates them, as an admin would).

It prints one line per namespace (succeeded / total, attempts beyond the first), the largest committed fraction of
any GPU and the gate's violations (the committed bytes above a GPU's capacity: must be none), and the wall time.
Exit status 1 unless every job succeeded with no violation.

    python bench/soak_local_cluster.py [--jobs 80] [--namespaces default,team-a,team-b] [--nodes 2]
        [--gpus fake:2x16Gi] [--policy lmcf] [--timeout 1800] [--keep DIR]
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "e2e"))
from jobs import EXAMPLES, small_job, tiny_entrypoint_example, tiny_example  # noqa: E402
from local_cluster import ClusterOptions, LocalCluster, example_images, gnnjob_table  # noqa: E402


def manifests(total: int, namespaces: list[str]) -> list[dict[str, Any]]:
    """``total`` GNNJobs spread round-robin over ``namespaces``, the same names in each (see the module docstring)."""
    kinds: list[dict[str, Any]] = [tiny_example(p) for p in EXAMPLES] + [tiny_entrypoint_example()]
    per_ns = -(-total // len(namespaces))
    names: list[dict[str, Any]] = []
    for i in range(per_ns):
        if i < len(kinds):
            doc = copy.deepcopy(kinds[i])
            doc["metadata"] = {"name": f"{doc['metadata']['name']}-{i}"}
        else:
            doc = small_job(f"small-{i}", epochs=20 + 10 * (i % 5), hidden=16 * (1 + i % 3))
            if i % 4 == 0:
                doc["spec"]["checkpoint"] = {"everySeconds": 2}
        names.append(doc)
    out = []
    for i in range(total):
        doc = copy.deepcopy(names[i // len(namespaces)])
        doc["metadata"]["namespace"] = namespaces[i % len(namespaces)]
        out.append(doc)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=80)
    ap.add_argument("--namespaces", default="default,team-a,team-b")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--gpus", default="fake:2x16Gi")
    ap.add_argument("--policy", default="lmcf")
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--keep", type=Path, help="keep the cluster's logs under this directory")
    args = ap.parse_args()
    namespaces = [n for n in args.namespaces.split(",") if n]
    docs = manifests(args.jobs, namespaces)
    images = example_images()
    opts = ClusterOptions(nodes=args.nodes, gpus=args.gpus, policy=args.policy, timeout=args.timeout,
                          keep=args.keep, images=images, bare_images=frozenset(images), quiet=True)
    start = time.monotonic()
    with LocalCluster(opts) as cluster:
        cluster.start()
        cluster.submit(docs)
        keys = {f"{d['metadata']['namespace']}/{d['metadata']['name']}" for d in docs}
        jobs = cluster.wait_jobs(keys)
        result = cluster.report(jobs)
    wall = time.monotonic() - start
    done: Counter[str] = Counter()
    seen: Counter[str] = Counter()
    retries: Counter[str] = Counter()
    for row in result["jobs"]:
        seen[row["namespace"]] += 1
        done[row["namespace"]] += row["phase"] == "Succeeded"
        retries[row["namespace"]] += max(0, (row["attempts"] or 1) - 1)
    print(f"{args.jobs} jobs in {len(namespaces)} namespaces on {args.nodes} node(s) x {args.gpus}, policy "
          f"{args.policy}: {wall:.0f} s")
    for ns in namespaces:
        expected = sum(1 for d in docs if d["metadata"]["namespace"] == ns)
        print(f"  {ns:12s} succeeded {done[ns]:3d} of {expected:3d} (seen {seen[ns]}), attempts beyond the first "
              f"{retries[ns]}")
    print(f"max committed fraction {result['max_committed_fraction']:.3f}; violations {len(result['violations'])}")
    ok = sum(done.values()) == len(docs) and not result["violations"]
    if not ok:
        print(gnnjob_table(jobs))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
