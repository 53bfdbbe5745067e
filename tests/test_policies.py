"""Grouping policies: the papers' orders, the fixed SQTF/BQT bound, the online plan and the gate invariant."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnnsched.policies import (
    GateInvariantError,
    GPUBooks,
    GPUFree,
    Policy,
    Task,
    check_gate_invariant,
    form_groups,
    group_threshold,
    invariant_violations,
    parse_policy,
    plan_admissions,
    traversal,
)

GiB = 2**30


def _tasks(spec: list[tuple[int, float | None]]) -> list[Task]:
    return [Task(key=f"t{i}", bytes=b, seq=i, qt_seconds=q) for i, (b, q) in enumerate(spec)]


def _published_sqtf(tasks_ascending: list[Task], ma: int) -> list[list[Task]]:
    """GNNSched Algorithm 1 transcribed literally (threshold checked before adding, no safety check)."""
    sp = sum(t.bytes for t in tasks_ascending)
    gth = math.ceil(sp / math.ceil(sp / ma))
    groups: list[list[Task]] = []
    gpmc, gcounter = ma, -1
    for t in tasks_ascending:
        if gpmc > gth:
            groups.append([])
            gpmc, gcounter = 0, gcounter + 1
        groups[gcounter].append(t)
        gpmc += t.bytes
    return groups


def _published_bmc(tasks_ascending: list[Task], n_worker: int, ma: int) -> list[list[Task]]:
    """CoGNN Algorithm 1 transcribed literally."""
    deque = list(tasks_ascending)
    groups: list[list[Task]] = []
    gpmc, gcounter, ecounter = 0, -1, n_worker
    for i in range(len(deque)):
        task = deque.pop() if i % 2 == 1 else deque.pop(0)
        gpmc += task.bytes
        if gpmc >= ma or ecounter == n_worker:
            groups.append([])
            gpmc, ecounter = task.bytes, 0
            gcounter += 1
        groups[gcounter].append(task)
        ecounter += 1
    return groups


def test_traversal_orders() -> None:
    ts = _tasks([(5, 3.0), (1, 9.0), (3, None), (2, 1.0), (4, 2.0)])
    keys = lambda p: [t.key for t in traversal(p, ts)]  # noqa: E731
    assert keys("base") == ["t0", "t1", "t2", "t3", "t4"]
    assert keys("lmcf") == ["t1", "t3", "t2", "t4", "t0"]  # bytes 1,2,3,4,5
    assert keys("bmc") == ["t1", "t0", "t3", "t4", "t2"]  # 1,5,2,4,3
    assert keys("sqtf") == ["t3", "t4", "t0", "t1", "t2"]  # qt 1,2,3,9,unknown-last
    assert keys("bqt") == ["t3", "t2", "t4", "t1", "t0"]


def test_parse_policy_names_the_field() -> None:
    assert parse_policy("LMCF") is Policy.LMCF
    with pytest.raises(ValueError, match="policy: 'fifo' is not one of base"):
        parse_policy("fifo")


def test_published_sqtf_overflows_and_ours_does_not() -> None:
    # MA = 10; SP = 17 → gTH = ceil(17 / 2) = 9. Published: group 1 = 2+3+4 = 9 (not > 9), then +8 = 17 > MA.
    ts = _tasks([(2, 1.0), (3, 2.0), (4, 3.0), (8, 4.0)])
    published = _published_sqtf(traversal("sqtf", ts), ma=10)
    assert [sum(t.bytes for t in g) for g in published] == [17], "the published pseudo-code overflows here"
    ours = form_groups("sqtf", ts, bound_bytes=10, max_clients=48)
    assert [[t.key for t in g] for g in ours.groups] == [["t0", "t1", "t2"], ["t3"]]
    assert all(sum(t.bytes for t in g) <= 10 for g in ours.groups)


def test_bqt_fixed_bound() -> None:
    ts = _tasks([(6, 1.0), (6, 2.0), (6, 3.0), (6, 4.0)])
    groups = form_groups("bqt", ts, bound_bytes=10, max_clients=48).groups
    assert all(sum(t.bytes for t in g) <= 10 for g in groups)
    assert [t.key for g in groups for t in g] == ["t0", "t3", "t1", "t2"]


def test_bmc_matches_cognn_algorithm_when_no_group_fills_exactly() -> None:
    ts = _tasks([(b, None) for b in (3, 7, 2, 11, 5, 13, 1, 8)])
    asc = sorted(ts, key=lambda t: (t.bytes, t.seq))
    for workers in (2, 3):
        ref = _published_bmc(asc, workers, ma=21)
        ours = form_groups("bmc", ts, bound_bytes=21, max_clients=workers).groups
        assert [[t.key for t in g] for g in ours] == [[t.key for t in g] for g in ref]


def test_oversize_tasks_are_set_aside() -> None:
    ts = _tasks([(5, None), (50, None), (6, None)])
    g = form_groups("base", ts, bound_bytes=20, max_clients=4)
    assert [t.key for t in g.oversize] == ["t1"]
    assert [[t.key for t in grp] for grp in g.groups] == [["t0", "t2"]]
    with pytest.raises(ValueError, match="max_clients"):
        form_groups("base", ts, bound_bytes=20, max_clients=0)


def test_group_threshold() -> None:
    assert group_threshold("sqtf", 19, 10) == 10
    assert group_threshold("bqt", 25, 10) == 9  # ceil(25 / ceil(2.5)) = ceil(8.33)
    assert group_threshold("lmcf", 25, 10) == math.inf


def test_plan_base_is_fifo_with_head_of_line_blocking() -> None:
    ts = _tasks([(30, None), (60, None), (5, None)])
    gpus = [GPUFree(0, 50, 48, 80), GPUFree(1, 40, 48, 80)]
    plan = plan_admissions("base", ts, gpus)
    # t0 on the GPU with most free; t1 (60) fits nowhere → t2 must wait behind it.
    assert [(a.gpu_index, [t.key for t in a.tasks]) for a in plan] == [(0, ["t0"])]
    plan = plan_admissions("lmcf", ts, gpus)
    assert [(a.gpu_index, [t.key for t in a.tasks]) for a in plan] == [(0, ["t2", "t0"])]


def test_plan_respects_slots() -> None:
    ts = _tasks([(1, None)] * 5)
    plan = plan_admissions("base", ts, [GPUFree(0, 80, 2, 80), GPUFree(1, 80, 0, 80)])
    assert [(a.gpu_index, len(a.tasks)) for a in plan] == [(0, 2)]


task_lists = st.lists(
    st.tuples(st.integers(1, 100), st.one_of(st.none(), st.floats(0, 1000))), min_size=0, max_size=40
)


@settings(max_examples=300, deadline=None)
@given(task_lists, st.sampled_from(list(Policy)), st.integers(1, 120), st.integers(1, 6))
def test_form_groups_never_exceeds_bound(spec, policy, bound, clients) -> None:
    ts = _tasks(spec)
    g = form_groups(policy, ts, bound, clients)
    for grp in g.groups:
        assert sum(t.bytes for t in grp) <= bound
        assert 1 <= len(grp) <= clients
    flat = [t for grp in g.groups for t in grp]
    assert flat == traversal(policy, [t for t in ts if t.bytes <= bound])
    assert sorted(t.key for t in flat + g.oversize) == sorted(t.key for t in ts)


@settings(max_examples=300, deadline=None)
@given(
    task_lists,
    st.sampled_from(list(Policy)),
    st.lists(st.tuples(st.integers(0, 150), st.integers(0, 4)), min_size=1, max_size=4),
)
def test_plan_is_a_safe_prefix(spec, policy, gpu_spec) -> None:
    ts = _tasks(spec)
    gpus = [GPUFree(i, fb, fs, 150) for i, (fb, fs) in enumerate(gpu_spec)]
    plan = plan_admissions(policy, ts, gpus)
    admitted = [t for a in plan for t in a.tasks]
    assert admitted == traversal(policy, ts)[: len(admitted)]
    assert len({a.gpu_index for a in plan}) == len(plan)
    for a in plan:
        g = gpus[a.gpu_index]
        assert a.bytes <= g.free_bytes and len(a.tasks) <= g.free_slots and a.tasks


def test_invariant_check() -> None:
    ok = GPUBooks(0, 80 * GiB, 2 * GiB, (40 * GiB, 38 * GiB), 48)
    check_gate_invariant([ok])
    over = GPUBooks(1, 80 * GiB, 2 * GiB, (40 * GiB, 39 * GiB), 48)
    crowd = GPUBooks(2, 80 * GiB, 0, (1,) * 3, 2)
    assert len(invariant_violations([ok, over, crowd])) == 2
    with pytest.raises(GateInvariantError, match="gpu 1: committed"):
        check_gate_invariant([over])
