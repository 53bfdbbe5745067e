"""The placement hot path's fast forms compute exactly what the plain array forms compute.

``derive`` on one row takes a Python-scalar path and ``frag`` clamps before an int32 cast; both exist for speed
only (the simulator calls them once per placement), so these tests pin them bit for bit to the array forms on
random states: unhealthy GPUs, full client slots, unknown rows, over-committed GPUs, empty slots.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gnnsched import placement as pl
from gnnsched.colocation.interference import load_default


def _reference_frag(free: np.ndarray, above: np.ndarray) -> np.ndarray:
    """``frag`` as first written: int64 cast, clamp after the cast."""
    f = np.maximum(free, np.float32(0.0))
    idx = (f * np.float32(1.0 / pl.FRAG_BIN)).astype(np.int64)
    np.minimum(idx, len(above) - 1, out=idx)
    out = above[idx]
    out *= f
    return out


def _random_state(rng: np.random.Generator, rows: int, gpus: int) -> pl.PlacementState:
    a = pl.new_state(rows, gpus)
    for r in range(rows):
        known = rng.random() > 0.1
        pl.clear_row(a, r, known)
        pl.set_host(a, r, float(rng.uniform(0, 96_000)), float(rng.uniform(0, 5e11)))
        for s in range(int(rng.integers(0, gpus + 1))):
            cap = float(rng.choice([16e9, 32e9, 40e9, 0.5]))
            running = [(float(rng.uniform(0, 100)), float(rng.uniform(1e8, 1.2e10)), float(rng.uniform(0, 1)),
                        float(rng.uniform(0, 1))) for _ in range(int(rng.integers(0, 7)))]
            used = sum(j[1] for j in running) * float(rng.choice([1.0, 1.5, 0.0]))
            max_clients = int(rng.integers(1, 49))
            pl.set_gpu(a, s, r, capacity=cap, used=used, healthy=bool(rng.random() > 0.15),
                       clients=int(rng.integers(0, max_clients + 1)), max_clients=max_clients,
                       qbytes=float(rng.choice([0.0, rng.uniform(0, 3e10)])), qsecs=float(rng.uniform(0, 50)),
                       running=running,  # learned co-location factors: none, or one per class
                       learned=tuple(float(rng.choice([1.0, rng.uniform(0.5, 2.5)])) for _ in pl.PROFILE_KEYS))
    return a


DERIVED = ("free", "avail", "capu", "free32", "frag0", "fscale", *(f"slow_{k}" for k in pl.PROFILE_KEYS))


@pytest.mark.parametrize("seed", range(6))
def test_derive_one_row_matches_the_array_path_bit_for_bit(seed: int) -> None:
    rng = np.random.default_rng(seed)
    interference = load_default()
    a = _random_state(rng, 40, 8)
    b = {k: v.copy() for k, v in a.items()}
    sizes = rng.uniform(1e8, 2e10, int(rng.integers(0, 300)))
    above = pl.size_table(sizes)
    pl.derive_arrays(a, slice(0, 40), above, interference)
    for r in range(40):
        pl.derive(b, slice(r, r + 1), above, interference)  # the scalar path
    for key in DERIVED:
        assert a[key].dtype == b[key].dtype
        assert a[key].tobytes() == b[key].tobytes(), key


def test_derive_index_array_matches_slices() -> None:
    rng = np.random.default_rng(7)
    interference = load_default()
    a = _random_state(rng, 30, 4)
    b = {k: v.copy() for k, v in a.items()}
    above = pl.size_table(rng.uniform(1e8, 2e10, 50))
    rows = np.array([2, 5, 6, 17, 29])
    pl.derive_arrays(a, slice(0, 30), above, interference)
    pl.derive_arrays(b, slice(0, 30), above, interference)
    for r in rows:  # disturb, then re-derive only the disturbed rows through an index array
        b["used"][:, r] += 1e9
        a["used"][:, r] += 1e9
        pl.derive(a, slice(int(r), int(r) + 1), above, interference)
    pl.derive(b, rows, above, interference)
    for key in DERIVED:
        assert a[key].tobytes() == b[key].tobytes(), key


@pytest.mark.parametrize("seed", range(4))
def test_frag_matches_the_int64_form(seed: int) -> None:
    rng = np.random.default_rng(seed)
    above = pl.size_table(rng.uniform(1e8, 3e10, 200))
    free = np.concatenate([rng.uniform(-4e10, 9e10, 5002), [0.0, -0.0, 1.0, pl.FRAG_BIN, 3e10, 1e15]])
    for arr in (free.astype(np.float32), free.astype(np.float32).reshape(-1, 8)):
        assert _reference_frag(arr, above).tobytes() == pl.frag(arr, above).tobytes()
    empty = pl.size_table(())
    free32 = free.astype(np.float32)
    assert _reference_frag(free32, empty).tobytes() == pl.frag(free32, empty).tobytes()


@pytest.mark.parametrize("seed", range(4))
def test_derive_cells_matches_the_array_path_bit_for_bit(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    interference = load_default()
    a = _random_state(rng, 25, 8)
    b = {k: v.copy() for k, v in a.items()}
    above = pl.size_table(rng.uniform(1e8, 2e10, 120))
    pl.derive_arrays(a, slice(0, 25), above, interference)
    pl.derive_cells(b, [(s, r) for r in range(25) for s in range(8)], above, interference)
    for key in DERIVED:
        assert a[key].tobytes() == b[key].tobytes(), key
    # change a few GPUs' raw figures; re-deriving only those GPUs equals re-deriving everything
    cells = [(int(rng.integers(0, 8)), int(rng.integers(0, 25))) for _ in range(10)]
    for s, r in cells:
        for arr in (a, b):
            arr["used"][s, r] = 7e9
            arr["clients"][s, r] = 3
            arr["sum_mem"][s, r] = 0.9
    pl.derive_arrays(a, slice(0, 25), above, interference)
    pl.derive_cells(b, cells, above, interference)
    for key in DERIVED:
        assert a[key].tobytes() == b[key].tobytes(), key


def _reference_set_gpu(a: pl.PlacementState, slot: int, r: int, *, capacity: float, used: float, healthy: bool,
                       clients: int, max_clients: int, qbytes: float, qsecs: float, running: list) -> None:
    """``set_gpu`` as first written: element-by-element writes of the end slots."""
    a["valid"][slot, r] = True
    a["ends"][:, slot, r] = np.inf
    a["freed"][:, slot, r] = 0.0
    a["cap"][slot, r] = capacity
    a["used"][slot, r] = used
    a["healthy"][slot, r] = healthy
    a["clients"][slot, r] = clients
    a["max_clients"][slot, r] = max_clients
    a["qbytes"][slot, r] = qbytes
    a["qsecs"][slot, r] = qsecs
    a["sum_sm"][slot, r] = sum(j[2] for j in running)
    a["sum_mem"][slot, r] = sum(j[3] for j in running)
    ordered = sorted(running, key=lambda j: j[0])
    cum = 0.0
    for k, job in enumerate(ordered):
        cum += job[1]
        kk = min(k, pl.END_SLOTS - 1)
        a["ends"][kk, slot, r] = job[0]
        a["freed"][kk, slot, r] = cum
    a["last_end"][slot, r] = ordered[-1][0] if ordered else 0.0


def test_set_gpu_matches_element_by_element_writes() -> None:
    rng = np.random.default_rng(11)
    a = pl.new_state(6, 4)
    b = pl.new_state(6, 4)
    for _ in range(200):
        slot, r = int(rng.integers(0, 4)), int(rng.integers(0, 6))
        running = [(float(rng.choice([rng.uniform(0, 50), 7.0])), float(rng.uniform(1e8, 9e9)),
                    float(rng.uniform(0, 1)), float(rng.uniform(0, 1))) for _ in range(int(rng.integers(0, 9)))]
        kw: dict[str, Any] = dict(capacity=32e9, used=float(rng.uniform(0, 3e10)), healthy=bool(rng.random() > 0.2),
                  clients=int(rng.integers(0, 9)), max_clients=48, qbytes=float(rng.uniform(0, 1e10)),
                  qsecs=float(rng.uniform(0, 30)), running=running)
        pl.set_gpu(a, slot, r, **kw)
        _reference_set_gpu(b, slot, r, **kw)
        for key in a:
            assert a[key].tobytes() == b[key].tobytes(), key
