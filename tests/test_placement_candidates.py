"""``placement.candidate_costs`` (the simulator's per-candidate cost) against ``cost_matrix`` (the extender's).

It must give ``cost_matrix(...)[:, cols]`` bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_placement_derive import _random_state

from gnnsched import placement as pl
from gnnsched.colocation.interference import load_default


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("aware", [True, False])
def test_candidate_costs_match_cost_matrix(seed: int, aware: bool) -> None:
    rng = np.random.default_rng(seed)
    interference = load_default()
    rows, gpus = 60, 8
    a = _random_state(rng, rows, gpus)
    above = pl.size_table(rng.uniform(1e8, 2e10, int(rng.integers(0, 300))))
    pl.derive_arrays(a, slice(0, rows), above, interference)
    compared = 0
    for trial in range(40):
        b = float(rng.choice([1e8, 2e9, 8e9, 1.5e10, 3e10, 5e10]))
        big_r = float(rng.uniform(0.5, 200))
        intensity = rng.choice(["memory", "compute", None])
        now = float(rng.uniform(0, 120))
        tab = above if trial % 5 else None
        full = pl.cost_matrix(a, b, big_r, intensity, now, tab, interference_aware=aware)
        fit = pl.fit_mask(a, b)
        lo = int(rng.integers(0, rows - 10))
        hi = int(rng.integers(lo + 1, rows + 1))
        wrapped = np.concatenate([np.arange(hi, rows), np.arange(0, lo)])
        for cols in (slice(lo, hi), np.arange(lo, hi), wrapped):
            if isinstance(cols, np.ndarray) and cols.size == 0:
                continue
            exact, good = pl.candidate_costs(a, cols, b, big_r, intensity, now, tab, interference_aware=aware)
            assert exact.dtype == full.dtype
            assert exact.tobytes() == np.ascontiguousarray(full[:, cols]).tobytes()
            assert np.array_equal(good, fit[:, cols])
            compared += int(np.isfinite(exact).sum())
    assert compared > 0


@pytest.mark.parametrize("aware", [True, False])
def test_fit_costs_are_the_exact_fit_now_costs_and_a_lower_bound_elsewhere(aware: bool) -> None:
    rng = np.random.default_rng(11)
    interference = load_default()
    rows = 50
    a = _random_state(rng, rows, 8)
    above = pl.size_table(rng.uniform(1e8, 2e10, 200))
    pl.derive_arrays(a, slice(0, rows), above, interference)
    cols = np.array([3, 1, 40, 41, 7, 22])
    for b in (1e8, 2e9, 8e9, 1.5e10, 3e10):
        for intensity in ("memory", "compute", None):
            exact, good = pl.candidate_costs(a, cols, b, 7.0, intensity, 30.0, above, interference_aware=aware)
            fit, low, good_f = pl.fit_costs(a, cols, b, intensity, above, interference_aware=aware)
            fits_now = a["avail"][:, cols] >= b
            assert np.array_equal(good_f, good)
            assert fit[good & fits_now].tobytes() == exact[good & fits_now].tobytes()
            assert np.isinf(fit[~(good & fits_now)]).all()
            waiting = good & ~fits_now
            assert (low[waiting] <= exact[waiting]).all()
            assert np.isinf(low[~waiting]).all()
