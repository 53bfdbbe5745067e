"""Accuracy of the requests-only runtime model on openb, two ways, with both baselines.

Usage:  python bench/predictor_accuracy.py [--data CSV] [--folds 5]

1. Time-ordered split (the issue's criterion; same as ``gnnsched predictor evaluate --data CSV --json``): train on
   the earliest 80 % of finished pods, test on the latest 20 %.
2. Shuffled K-fold cross-validation (seeded): the figure most papers report, optimistic because folds mix periods.

Hyper-parameters are the ones the time-ordered CV inside the training rows picks (as ``train`` does), re-chosen per
fold. Nothing here reads ``shared/eval``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from gnnsched.simulator.cli import default_data_dir

DEFAULT = default_data_dir() / "traces" / "openb_pod_list_default.csv"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT)
    parser.add_argument("--folds", type=int, default=5)
    args = parser.parse_args()

    from gnnsched.predictor import metrics
    from gnnsched.predictor.evaluate import evaluate_time_split, median_baseline, random_forest_baseline
    from gnnsched.predictor.requests_model import RequestsRuntimeModel
    from gnnsched.traces import load_openb_pods

    pods = load_openb_pods(args.data)
    split = evaluate_time_split(pods, 0.8)
    keys = ("n", "mae", "wmape", "r2")
    print("time-ordered 80/20:", json.dumps({
        "xgboost": {k: split[k] for k in keys},
        **{name: {k: v[k] for k in keys} for name, v in split["baselines"].items()},
    }, indent=1))

    finished = pods.finished()
    order = np.random.default_rng(0).permutation(len(finished))
    folds = np.array_split(order, args.folds)
    y_all: list[np.ndarray] = []
    preds: dict[str, list[np.ndarray]] = {"xgboost": [], "random_forest": [], "median": []}
    for k in range(args.folds):
        test_idx = folds[k]
        train_idx = np.concatenate([folds[j] for j in range(args.folds) if j != k])
        train, test = finished.select(np.sort(train_idx)), finished.select(np.sort(test_idx))
        model = RequestsRuntimeModel.fit(train)
        y_all.append(test.runtime_seconds)
        preds["xgboost"].append(model.predict_table(test))
        preds["random_forest"].append(random_forest_baseline(train, test))
        preds["median"].append(median_baseline(train, test))
    y = np.concatenate(y_all)
    cv = {name: {k: metrics.report(y, np.concatenate(p))[k] for k in keys} for name, p in preds.items()}
    print(f"shuffled {args.folds}-fold CV (pooled):", json.dumps(cv, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
