"""XGBoost fitted for the absolute error of log-runtime with monotone constraints that actually hold.

Why a custom objective: XGBoost's built-in ``reg:absoluteerror`` grows each tree under the monotone constraints and
then *refreshes* every leaf to the median of its residuals, which ignores them — on openb it predicted 4 % longer
runs for twice the memory (caught by ``tests/test_predictor.py``). Here the gradient is ``sign(pred − y)`` and the
hessian 1, so a leaf is ``−η·Σsign/(n+λ)``: a step towards the leaf's median that XGBoost's constraint machinery
bounds like any other leaf. Boosting starts from the training median of the target (the L1 optimum of a constant).
The ensemble is then converted to ``TreeEnsemble`` and passed through ``TreeEnsemble.monotone`` as a check that can
only clip, never loosen.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gnnsched.predictor.trees import TreeEnsemble

SEED = 0


def _l1_objective(y_true: np.ndarray, y_pred: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.sign(y_pred - y_true), np.ones_like(y_pred)


def fit_l1(x: np.ndarray, y: np.ndarray, params: dict[str, Any], monotone: Sequence[int]) -> TreeEnsemble:
    """Fit and convert. ``params``: max_depth, n_estimators, learning_rate, min_child_weight (and any other
    XGBRegressor parameter); subsample 0.8, one thread and a fixed seed make it reproducible."""
    import xgboost as xgb  # heavy: only when training

    model = xgb.XGBRegressor(
        **params, objective=_l1_objective, base_score=float(np.median(y)), subsample=0.8, tree_method="hist",
        monotone_constraints=tuple(monotone), random_state=SEED, n_jobs=1,
    )
    model.fit(np.asarray(x, dtype=float), np.asarray(y, dtype=float))
    return TreeEnsemble.from_booster(model.get_booster()).monotone(monotone)
