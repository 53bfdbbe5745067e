"""GNNJob manifests for the e2e tests: the four ``examples/`` made tiny, and small jobs that queue at the gate.

The examples keep what makes each one distinct (architecture, depth, mode, mini-batching, parallel inference,
scaling on/off) and get a graph, epochs and requests small enough that a worker finishes in seconds on one core of a
shared two-core machine: the full examples take minutes to tens of minutes each on CPU (measured: GIN one epoch
20 s, SAGE mini-batch one epoch over 5 min), which is the point on a GPU, not in CI.
"""

from __future__ import annotations

import copy
import random
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent.parent
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
ENTRYPOINT_EXAMPLE = REPO / "examples" / "custom-entrypoint" / "gnnjob.yaml"
TINY_GRAPH = {"nodes": 2000, "edges": 10000, "features": 32, "classes": 4}


def tiny_example(path: Path) -> dict[str, Any]:
    """The example at ``path`` with a tiny graph, one or two epochs, a handful of requests."""
    doc = yaml.safe_load(path.read_text())
    spec = doc["spec"]
    graph = spec.get("graph") or {}
    if "dataset" in graph or graph.get("nodes", 0) > TINY_GRAPH["nodes"]:
        spec["graph"] = dict(TINY_GRAPH)
    minibatch = (spec.get("batching") or {}).get("mode") == "minibatch"
    if spec.get("mode") == "train":
        spec["epochs"] = 1 if minibatch else 2
    else:
        spec["requests"] = 2
    if minibatch:
        spec["batching"]["batchSize"] = 1024
    spec.setdefault("resources", {})
    spec["resources"].update({"cpu": "1", "memory": "2Gi"})
    return doc


def tiny_entrypoint_example() -> dict[str, Any]:
    """The user's own model (``examples/custom-entrypoint``) made tiny, with no declared ``gpuMemory``: its
    reservation must come from its probe pod."""
    doc = tiny_example(ENTRYPOINT_EXAMPLE)
    doc["spec"]["resources"].pop("gpuMemory", None)
    return doc


def small_job(name: str, epochs: int = 3, hidden: int = 16) -> dict[str, Any]:
    """A GCN small enough to start at once; its admit bytes (mostly the CUDA overheads) make a few fill a GPU."""
    return {"apiVersion": "gnnsched.io/v1alpha1", "kind": "GNNJob", "metadata": {"name": name},
            "spec": {"mode": "train", "model": {"arch": "gcn", "layers": 2, "hidden": hidden},
                     "graph": {"nodes": 1000, "edges": 5000, "features": 16, "classes": 4}, "epochs": epochs,
                     "resources": {"cpu": "1", "memory": "1Gi"}}}


def too_big_job(name: str) -> dict[str, Any]:
    """A job whose predicted peak exceeds every GPU of the local cluster (a huge graph, traced in milliseconds)."""
    doc = small_job(name)
    doc["spec"]["graph"] = {"nodes": 50_000_000, "edges": 400_000_000, "features": 512, "classes": 16}
    doc["spec"]["model"]["hidden"] = 512
    return doc


def renamed(doc: dict[str, Any], name: str) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    out["metadata"]["name"] = name
    return out


def generated_small_jobs(seed: int, count: int, prefix: str = "gen") -> list[dict[str, Any]]:
    """``count`` random small GNNJobs (reproducible from ``seed``): every architecture, training and inference,
    full-batch and neighbour-sampled mini-batches, parallel inference, scaling on and off, graphs of a few hundred to
    two thousand nodes. Each stays far below a 1.25 GiB GPU so several of them queue at a gate."""
    rng = random.Random(seed)
    docs = []
    for i in range(count):
        arch = rng.choice(["gcn", "sage", "gin", "gat"])
        nodes = rng.randint(300, 2000)
        model: dict[str, Any] = {"arch": arch, "layers": rng.randint(1, 3), "hidden": rng.choice([8, 16, 32])}
        if arch == "gat":
            model["heads"] = rng.randint(1, 3)
        if rng.random() < 0.3:
            model["dropout"] = 0.2
        spec: dict[str, Any] = {
            "model": model,
            "graph": {"nodes": nodes, "edges": nodes * rng.randint(2, 8), "features": rng.choice([8, 16, 32]),
                      "classes": rng.randint(2, 6)},
            "resources": {"cpu": "1", "memory": "1Gi"},
        }
        if rng.random() < 0.4:
            spec["mode"] = "infer"
            spec["requests"] = rng.randint(1, 6)
            spec["parallelism"] = rng.randint(1, 3)
        else:
            spec["mode"] = "train"
            spec["epochs"] = rng.randint(1, 4)
        if arch in ("sage", "gat") and rng.random() < 0.5:
            spec["batching"] = {"mode": "minibatch", "batchSize": rng.choice([64, 128, 256]),
                                "fanouts": [rng.randint(2, 6) for _ in range(model["layers"])]}
            if spec["mode"] == "train":
                spec["epochs"] = 1
        if rng.random() < 0.3:
            spec["scaling"] = {"enabled": False}
        docs.append({"apiVersion": "gnnsched.io/v1alpha1", "kind": "GNNJob",
                     "metadata": {"name": f"{prefix}-{seed}-{i}-{arch}-{spec['mode']}"}, "spec": spec})
    return docs
