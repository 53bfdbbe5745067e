"""Accuracy measures for runtime predictions, as the seed (004) defines them, plus R².

MAE and WMAPE are on seconds (WMAPE = Σ|ŷ−y| / Σy, so long jobs weigh more, as they do for a scheduler). R² is on
log-seconds: runtimes span 4 s to 15 days, and on raw seconds R² is decided by a handful of the longest jobs.
``r2_seconds`` is reported beside it for completeness.
"""

from __future__ import annotations

import numpy as np


def mae(y: np.ndarray, p: np.ndarray) -> float:
    return float(np.mean(np.abs(np.asarray(p, float) - np.asarray(y, float))))


def wmape(y: np.ndarray, p: np.ndarray) -> float:
    y = np.asarray(y, float)
    return float(np.sum(np.abs(np.asarray(p, float) - y)) / np.sum(y))


def r2(y: np.ndarray, p: np.ndarray) -> float:
    y = np.asarray(y, float)
    p = np.asarray(p, float)
    total = float(np.sum((y - y.mean()) ** 2))
    return float(1.0 - np.sum((y - p) ** 2) / total) if total > 0 else float("nan")


def report(y_seconds: np.ndarray, p_seconds: np.ndarray) -> dict[str, float]:
    """``{n, mae, wmape, r2, r2_seconds}``; r2 on log-seconds (see module docstring)."""
    y = np.asarray(y_seconds, float)
    p = np.maximum(np.asarray(p_seconds, float), 1e-9)
    return {
        "n": int(len(y)),
        "mae": mae(y, p),
        "wmape": wmape(y, p),
        "r2": r2(np.log(y), np.log(p)),
        "r2_seconds": r2(y, p),
    }
