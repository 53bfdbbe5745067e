"""Fast paths the simulator's engine uses compute exactly what the straightforward forms compute.

``set_gpu_derived`` writes one GPU's raw figures and derives them in one pass (the simulator calls it for every GPU
whose books changed); it must store, bit for bit, what ``set_gpu`` followed by ``derive_cells`` on that GPU stores,
on random GPUs: unhealthy, full client slots, unknown rows, over-committed, no running job, more running jobs than
end slots, NaN-free and odd capacities.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_placement_derive import DERIVED, _random_state

from gnnsched import placement as pl
from gnnsched.colocation.interference import load_default

RAW = ("valid", "cap", "used", "healthy", "clients", "max_clients", "qbytes", "qsecs", "sum_sm", "sum_mem", "ends",
       "freed", "last_end")


def _random_gpu(rng: np.random.Generator) -> dict:
    running = [(float(rng.uniform(0, 100)), float(rng.uniform(1e8, 1.2e10)), float(rng.uniform(0, 1)),
                float(rng.uniform(0, 1))) for _ in range(int(rng.integers(0, 8)))]
    max_clients = int(rng.integers(1, 49))
    return dict(capacity=int(rng.choice([16e9, 32e9, 40e9, 0]) - rng.integers(0, 2**20)),
                used=int(sum(j[1] for j in running) * float(rng.choice([1.0, 1.5, 0.0]))),
                healthy=bool(rng.random() > 0.15), clients=int(rng.integers(0, max_clients + 1)),
                max_clients=max_clients, qbytes=float(rng.choice([0.0, rng.uniform(0, 3e10)])),
                qsecs=float(rng.uniform(0, 50)), running=running,
                learned=tuple(float(rng.choice([1.0, rng.uniform(0.5, 2.5)])) for _ in pl.PROFILE_KEYS))


@pytest.mark.parametrize("seed", range(4))
def test_set_gpu_derived_matches_set_gpu_then_derive_cells(seed: int) -> None:
    rng = np.random.default_rng(seed)
    interference = load_default()
    a = _random_state(rng, 20, 8)
    above = pl.size_table(rng.uniform(1e8, 2e10, int(rng.integers(0, 300))))
    pl.derive_arrays(a, slice(0, 20), above, interference)
    b = {k: v.copy() for k, v in a.items()}
    sens = pl.sensitivities(interference)
    for _ in range(200):
        slot, r = int(rng.integers(0, 8)), int(rng.integers(0, 20))
        gpu = _random_gpu(rng)
        pl.set_gpu(a, slot, r, **gpu)
        pl.derive_cells(a, [(slot, r)], above, interference)
        pl.set_gpu_derived(b, slot, r, **gpu, above=above, sens=sens)
    for key in RAW + DERIVED:
        assert a[key].dtype == b[key].dtype
        assert a[key].tobytes() == b[key].tobytes(), key


def test_sensitivities_are_the_models() -> None:
    interference = load_default()
    assert pl.sensitivities(interference) == [interference.sensitivity(interference.profile_for(k))
                                              for k in pl.PROFILE_KEYS]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("aware", [True, False])
def test_fit_summary_is_the_reduced_fit_costs(seed: int, aware: bool) -> None:
    rng = np.random.default_rng(100 + seed)
    interference = load_default()
    a = _random_state(rng, 60, 8)
    above = pl.size_table(rng.uniform(1e8, 2e10, int(rng.integers(0, 300)))) if seed else pl.size_table(())
    pl.derive_arrays(a, slice(0, 60), above, interference)
    before = {k: v.copy() for k, v in a.items()}
    for _ in range(10):
        rows = np.sort(rng.choice(60, int(rng.integers(1, 60)), replace=False))
        b = float(rng.choice([1e8, 5e9, 1.5e10, 3.9e10]))
        intensity = str(rng.choice(["memory", "compute", "none"]))
        fit, low, good = pl.fit_costs(a, rows, b, intensity, above, interference_aware=aware)
        got = pl.fit_summary(a, rows, b, intensity, above, interference_aware=aware)
        want = (np.minimum.reduce(fit, axis=0), fit.argmin(axis=0), np.minimum.reduce(low, axis=0),
                np.logical_or.reduce(good, axis=0))
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype
            assert g.tobytes() == w.tobytes()
    for key, arr in a.items():  # the state is only read
        assert arr.tobytes() == before[key].tobytes(), key


@pytest.mark.parametrize("seed", range(4))
def test_wait_bound_never_exceeds_the_wait_of_a_waiting_gpu(seed: int) -> None:
    # _cheapest (simulator) drops a candidate whose bound already exceeds the best fit-now cost: the bound must be
    # <= wait_seconds on every GPU of the row where the pod waits, and inf only on rows where none waits
    rng = np.random.default_rng(300 + seed)
    a = _random_state(rng, 60, 8)
    pl.derive_arrays(a, slice(0, 60), pl.size_table(rng.uniform(1e8, 2e10, 50)), load_default())
    gpus, rows = a["capu"].shape
    for _ in range(20):
        b = float(rng.choice([1e8, 5e9, 1.5e10, 3.9e10]))
        now = float(rng.uniform(0, 120))
        sel = np.sort(rng.choice(60, int(rng.integers(1, 60)), replace=False))
        bound = pl.wait_bound(a, sel, b, now)
        waiting = (a["capu"] >= b) & ~(a["avail"] >= b)
        for i, r in enumerate(sel):
            flat = np.array([s * rows + r for s in range(gpus) if waiting[s, r]], dtype=np.intp)
            if flat.size == 0:
                assert bound[i] == np.inf
                continue
            assert bound[i] <= wait_seconds_min(a, flat, b, now)


def wait_seconds_min(a: pl.PlacementState, flat: np.ndarray, b: float, now: float) -> float:
    return float(pl.wait_seconds(a, flat, b, now).min())
