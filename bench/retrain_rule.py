"""The retrain rule (``gnnsched.predictor.retrain``) on synthetic histories of growing size: outcome, wall time and the
size of the model the CronJob would store in its ConfigMap (limit 1 MiB).

Synthetic, and said so: the seeded Cora jobs of ``tests/history_seed.py`` (three archs, epochs 1,000-7,000), each
observed at the shipped model's prediction × exp(N(BIAS, SIGMA)) with a fixed seed, finishing one minute apart. It
shows how much history the default residual (200 trees, depth 3) needs before it beats the shipped prior on the
newest held-out jobs under that noise, not how it does on a real cluster (no cluster history exists here).

    python bench/retrain_rule.py [--sizes 30,60,100,200,1000] [--bias 0.5] [--sigma 0.4] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from history_seed import records  # noqa: E402

from gnnsched.predictor.gnn import GNNRuntimePredictor  # noqa: E402
from gnnsched.predictor.retrain import RetrainPolicy, retrain  # noqa: E402
from gnnsched.predictor.store import model_text  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="30,60,100,200,1000", help="history sizes, comma-separated")
    parser.add_argument("--bias", type=float, default=0.5, help="mean of the log observed/predicted ratio")
    parser.add_argument("--sigma", type=float, default=0.4, help="its standard deviation")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    shipped = GNNRuntimePredictor.load_default()
    print(f"bias {args.bias}, sigma {args.sigma}, seed {args.seed}; default policy {RetrainPolicy()}")
    print(f"{'history':>8} {'outcome':>9} {'wall s':>7} {'model B':>9} {'cand WMAPE':>11} {'shipped WMAPE':>14}")
    for size in (int(s) for s in args.sizes.split(",")):
        rng = np.random.default_rng(args.seed)
        history = [r.model_copy(update={"observed_runtime_seconds":
                                        r.observed_runtime_seconds * float(np.exp(rng.normal(args.bias, args.sigma)))})
                   for r in records(0, size, 1.0)]
        start = time.perf_counter()
        outcome, model = retrain(history, shipped, datetime.now(timezone.utc), RetrainPolicy())
        wall = time.perf_counter() - start
        size_bytes = len(model_text(model).encode()) if model is not None else None
        print(f"{size:>8} {outcome.outcome:>9} {wall:>7.2f} {size_bytes if size_bytes else '-':>9} "
              f"{outcome.candidate_wmape if outcome.candidate_wmape is not None else float('nan'):>11.3f} "
              f"{outcome.current_wmape if outcome.current_wmape is not None else float('nan'):>14.3f}")


if __name__ == "__main__":
    main()
