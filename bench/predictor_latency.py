"""Latency of one runtime prediction after the model is loaded (the extender calls it per candidate node).

Usage:  python bench/predictor_latency.py [--n 5000]

Prints microseconds per call (median of 5 rounds) for: the shipped requests-only model on real openb request rows,
the shipped GNN model (prior only), a GNN model with a residual retrained from a generated history (300 trees), and
one full ``scale()`` decision. Exits 1 if any prediction exceeds the 1 ms budget. The machine load is printed beside
the figures, since a shared machine makes them pessimistic.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import datetime, timezone

from gnnsched.simulator.cli import default_data_dir

BUDGET_US = 1000.0
TRACE = default_data_dir() / "traces" / "openb_pod_list_default.csv"


def per_call_us(fn, args_list, rounds: int = 5) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for args in args_list:
            fn(*args)
        times.append((time.perf_counter() - start) / len(args_list) * 1e6)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5000)
    args = parser.parse_args()

    from gnnsched.predictor.gnn import GNNRuntimePredictor
    from gnnsched.predictor.history import HistoryRecord
    from gnnsched.predictor.requests_model import RequestsRuntimeModel
    from gnnsched.runtime_prior import solo_runtime_seconds
    from gnnsched.scaling import scale
    from gnnsched.spec import parse_spec
    from gnnsched.traces import load_openb_pods

    results: dict[str, float] = {}

    start = time.perf_counter()
    requests_model = RequestsRuntimeModel.load_default()
    load_ms = (time.perf_counter() - start) * 1e3
    pods = load_openb_pods(TRACE) if TRACE.is_file() else None
    if pods is not None:
        rows = [(float(pods.cpu_cores[i]), float(pods.memory_bytes[i]), float(pods.gpu_share[i]),
                 float(pods.num_gpu[i]), pods.qos[i]) for i in range(len(pods))]
    else:
        rows = [(4.0 + i % 16, (8 + i % 64) * 2**30, 1.0, 1.0, "LS") for i in range(1000)]
    rows = (rows * (args.n // len(rows) + 1))[: args.n]
    results[f"requests model ({len(requests_model.ensemble.trees)} trees), openb rows"] = per_call_us(
        requests_model.predict_seconds, rows)

    specs = []
    for i, dataset in enumerate(["cora", "pubmed", "ogbn-arxiv", "reddit", "ogbn-products"]):
        for arch in ("gcn", "sage", "gin", "gat"):
            d = {"mode": "train", "model": {"arch": arch, "layers": 2 + i % 3, "hidden": 128},
                 "graph": {"dataset": dataset}, "epochs": 50, "resources": {"cpu": "8", "memory": "64Gi"}}
            if arch == "gat":
                d["model"]["heads"] = 4
            specs.append(parse_spec(d))
    calls = [
        (specs[i % len(specs)], "A100-80GB", 1.0 + i % 16, float((8 + i % 64) * 2**30)) for i in range(args.n // 5)
    ]
    prior_only = GNNRuntimePredictor.load_default()
    results["GNN model, prior only"] = per_call_us(prior_only.predict, calls)

    history = []
    for i in range(200):
        spec = specs[i % len(specs)]
        cpu = 1.0 + i % 16
        history.append(HistoryRecord(
            spec=spec.model_dump(by_alias=True, exclude_none=True), requested={"cpu": 16, "memory": "64Gi"},
            scaled={"cpu": cpu, "memory": "32Gi"}, gpu_model="A100-80GB",
            observed_runtime_seconds=(1.5 + (i % 7) / 10) * solo_runtime_seconds(spec, "A100-80GB", cpu),
            finished_at=datetime.now(timezone.utc),
        ))
    trained = GNNRuntimePredictor.fit_history(
        history, params={"n_estimators": 300, "max_depth": 4, "learning_rate": 0.05, "min_child_weight": 1.0})
    results["GNN model, prior x residual (300 trees, depth 4)"] = per_call_us(trained.predict, calls)
    scale_calls = [(spec,) for spec in specs]
    results["scale() decision, default model (up to 5 predictions)"] = per_call_us(
        lambda spec: scale(spec, predictor=prior_only), scale_calls * 10)

    print(f"requests model load: {load_ms:.1f} ms")
    for name, us in results.items():
        print(f"{name}: {us:.1f} us per call")
    print(f"load average (1/5/15 min): {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    slow = {k: v for k, v in results.items() if not k.startswith("scale") and v > BUDGET_US}
    if slow:
        print(f"over the {BUDGET_US:.0f} us budget: {', '.join(slow)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
