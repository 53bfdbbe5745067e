"""Slot IDs and the preferred-allocation packer, as pure functions (property-tested)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnnsched.device_plugin.slots import (
    AllocationError,
    MPSHealth,
    build_slots,
    parse_slot_id,
    preferred_allocation,
    slot_id,
)
from gnnsched.gpu.backend import FakeGPUBackend, fake_uuid


def test_slot_ids_round_trip_and_fit_kubelet_limit():
    u = "GPU-fef8089b-4820-abfc-e83e-94318197576e"
    assert parse_slot_id(slot_id(u, 47)) == (u, 47)
    assert len(slot_id(u, 47)) <= 63
    for bad in ("GPU-x", "GPU-x-slot-", "-slot-3", "GPU-x-slot-a1"):
        with pytest.raises(ValueError):
            parse_slot_id(bad)
    with pytest.raises(ValueError):
        slot_id("G" * 60, 1)


def test_build_slots_health_combines_gpu_and_mps():
    b = FakeGPUBackend(2, 1024)
    b.set_healthy(0, False)
    slots = build_slots(b.devices(), 3, MPSHealth(True, per_gpu={fake_uuid(1): True}))
    assert [s.healthy for s in slots] == [False] * 3 + [True] * 3
    slots = build_slots(b.devices(), 3, MPSHealth(True, per_gpu={fake_uuid(1): False}))
    assert not any(s.healthy for s in slots)
    slots = build_slots(FakeGPUBackend(2, 1024).devices(), 2, MPSHealth(False, "down"))
    assert len(slots) == 4 and not any(s.healthy for s in slots)


@st.composite
def requests(draw):
    gpus = draw(st.integers(1, 6))
    per = draw(st.integers(1, 8))
    slots = {s.id: s for s in build_slots(FakeGPUBackend(gpus, 1024).devices(), per, MPSHealth(True))}
    ids = sorted(slots)
    available = draw(st.lists(st.sampled_from(ids), unique=True, max_size=len(ids)))
    rest = [i for i in ids if i not in available]
    must = draw(st.lists(st.sampled_from(rest or ids), unique=True, max_size=3)) if draw(st.booleans()) else []
    pool = set(available) | set(must)
    if not pool:
        available = ids[:1]
        pool = set(available)
    size = draw(st.integers(max(1, len(must)), len(pool)))
    return slots, available, must, size


@settings(max_examples=300, deadline=None)
@given(requests())
def test_preferred_allocation_properties(req):
    slots, available, must, size = req
    got = preferred_allocation(slots, available, must, size)
    assert len(got) == size == len(set(got))
    assert set(must) <= set(got) <= set(available) | set(must)
    need = size - len(must)
    free: dict[str, int] = {}
    for d in available:
        if d not in must:
            free.setdefault(slots[d].gpu_index, 0)
            free[slots[d].gpu_index] += 1
    extra_gpus = {slots[d].gpu_index for d in got if d not in must}
    fitting = [g for g, n in free.items() if n >= need]
    if need and fitting:
        assert len(extra_gpus) == 1  # packed on one GPU
        (g,) = extra_gpus
        must_gpus = {slots[d].gpu_index for d in must}
        if not (len(must_gpus) == 1 and must_gpus == {g}):
            assert free[g] == min(free[h] for h in fitting)  # best fit
    elif need:
        # no single GPU fits: as few GPUs as possible (the largest free counts first)
        counts = sorted(free.values(), reverse=True)
        k, acc = 0, 0
        while acc < need:
            acc += counts[k]
            k += 1
        assert len(extra_gpus) == k


def test_preferred_allocation_rejects_bad_requests():
    slots = {s.id: s for s in build_slots(FakeGPUBackend(1, 1024).devices(), 2, MPSHealth(True))}
    ids = sorted(slots)
    with pytest.raises(AllocationError) as ei:
        preferred_allocation(slots, ids + ["x"], [], 1)
    assert ei.value.unknown == ("x",)
    for avail, must, size in ((ids, [], 0), (ids, ids, 1), (ids, [], 3)):
        with pytest.raises(AllocationError):
            preferred_allocation(slots, avail, must, size)
