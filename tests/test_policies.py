"""Grouping policies: the papers' orders, the fixed SQTF/BQT bound, the online plan and the gate invariant."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnnsched.policies import (
    Client,
    GateInvariantError,
    GPUBooks,
    GPUFree,
    Policy,
    Task,
    check_gate_invariant,
    form_groups,
    group_threshold,
    invariant_violations,
    load_key,
    parse_policy,
    plan_admissions,
    plan_decision,
    remaining_seconds,
    share_pays,
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


def test_backfill_lets_small_tasks_past_a_blocked_head() -> None:
    ts = _tasks([(30, None), (60, None), (5, None), (10, None)])
    gpus = [GPUFree(0, 50, 48, 80), GPUFree(1, 40, 48, 80)]
    # limit 0 is the strict prefix (the test above); with backfill t2 and t3 start past t1 (60 B fits no GPU now).
    d = plan_decision("base", ts, gpus, bypass_limit=4)
    assert [(a.gpu_index, [t.key for t in a.tasks]) for a in d.admissions] == [(0, ["t0", "t2", "t3"])]
    assert d.bypassed == {"t1": 2}
    # t1 may be overtaken once more: only t2 passes it, then it blocks t3 as under the prefix rule.
    held = [Task("t0", 30, 0), Task("t1", 60, 1, bypassed=3), Task("t2", 5, 2), Task("t3", 10, 3)]
    d = plan_decision("base", held, gpus, bypass_limit=4)
    assert [[t.key for t in a.tasks] for a in d.admissions] == [["t0", "t2"]]
    assert d.bypassed == {"t1": 4}
    # At the limit nothing overtakes it any more.
    frozen = [Task("t1", 60, 1, bypassed=4), Task("t2", 5, 2), Task("t3", 10, 3)]
    assert plan_decision("base", frozen, gpus, bypass_limit=4).admissions == []
    assert plan_admissions("base", frozen, gpus, bypass_limit=4) == []


def test_backfill_counts_only_real_overtakes() -> None:
    # t1 (45 B) does not fit GPU 0 after t0 joined it, but starts on GPU 1 in the same decision: not overtaken.
    ts = _tasks([(30, None), (45, None), (5, None)])
    d = plan_decision("base", ts, [GPUFree(0, 50, 48, 80), GPUFree(1, 46, 48, 80)], bypass_limit=2)
    assert [(a.gpu_index, [t.key for t in a.tasks]) for a in d.admissions] == [(0, ["t0", "t2"]), (1, ["t1"])]
    assert d.bypassed == {}


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_bypass_limit_is_validated(bad) -> None:
    with pytest.raises(ValueError, match="bypass_limit: must be an integer >= 0"):
        plan_decision("base", _tasks([(1, None)]), [GPUFree(0, 10, 1, 10)], bypass_limit=bad)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 100), st.one_of(st.none(), st.floats(0, 1000)), st.integers(0, 6)),
             min_size=0, max_size=40),
    st.sampled_from(list(Policy)),
    st.lists(st.tuples(st.integers(0, 150), st.integers(0, 4)), min_size=1, max_size=4),
    st.integers(0, 5),
)
def test_backfill_plan_is_safe_and_bounded(spec, policy, gpu_spec, limit) -> None:
    ts = [Task(key=f"t{i}", bytes=b, seq=i, qt_seconds=q, bypassed=n) for i, (b, q, n) in enumerate(spec)]
    gpus = [GPUFree(i, fb, fs, 150) for i, (fb, fs) in enumerate(gpu_spec)]
    d = plan_decision(policy, ts, gpus, bypass_limit=limit)
    assert d.admissions == plan_admissions(policy, ts, gpus, bypass_limit=limit)
    admitted = [t for a in d.admissions for t in a.tasks]
    order = traversal(policy, ts)
    # The memory bound and the client cap, per GPU, exactly as without backfill; each task at most once.
    assert len({a.gpu_index for a in d.admissions}) == len(d.admissions)
    assert len({t.key for t in admitted}) == len(admitted)
    for a in d.admissions:
        g = gpus[a.gpu_index]
        assert a.bytes <= g.free_bytes and len(a.tasks) <= g.free_slots and a.tasks
        assert [t.key for t in a.tasks] == [t.key for t in order if t in a.tasks]  # a group keeps the order
    if limit == 0:
        assert admitted == order[: len(admitted)] and d.bypassed == {}
        return
    # The counts: every task left waiting is overtaken by exactly the admitted tasks behind it in the order, and no
    # count passes the limit (a task already at or past it is never overtaken).
    pos = {t.key: i for i, t in enumerate(order)}
    taken = {t.key for t in admitted}
    for t in order:
        if t.key in taken:
            assert t.key not in d.bypassed
            continue
        behind = sum(1 for k in taken if pos[k] > pos[t.key])
        assert d.bypassed.get(t.key, t.bypassed) == t.bypassed + behind
        if behind:
            assert t.bypassed + behind <= limit


def test_invariant_check() -> None:
    ok = GPUBooks(0, 80 * GiB, 2 * GiB, (40 * GiB, 38 * GiB), 48)
    check_gate_invariant([ok])
    over = GPUBooks(1, 80 * GiB, 2 * GiB, (40 * GiB, 39 * GiB), 48)
    crowd = GPUBooks(2, 80 * GiB, 0, (1,) * 3, 2)
    assert len(invariant_violations([ok, over, crowd])) == 2
    with pytest.raises(GateInvariantError, match="gpu 1: committed"):
        check_gate_invariant([over])


@settings(max_examples=200, deadline=None)
@given(
    size=st.integers(1, 40 * GiB),
    bypassed=st.integers(0, 6),
    gpus=st.lists(st.tuples(st.integers(0, 40 * GiB), st.integers(-1, 4), st.integers(0, 7)), min_size=0, max_size=8),
    limit=st.integers(0, 5),
)
def test_one_task_plan_is_the_general_plan(size: int, bypassed: int, gpus: list, limit: int) -> None:
    # plan_decision answers a one-task queue without sorting; it must equal what the prefix and backfill plans give
    from gnnsched import policies as pol

    task = Task(key="t", bytes=size, seq=3, qt_seconds=5.0, bypassed=bypassed)
    free = [GPUFree(index=i, free_bytes=b, free_slots=s, capacity_bytes=40 * GiB) for b, s, i in gpus]
    by_room = sorted(free, key=lambda g: (-g.free_bytes, g.index))  # the general plans take the GPUs in order
    for p in Policy:
        got = plan_decision(p, [task], free, limit)
        want = (pol._plan_backfill(p, [task], by_room, limit) if limit
                else pol.Plan(pol._plan_prefix(p, [task], by_room), {}))
        assert got == want


def test_spread_puts_a_burst_on_every_idle_gpu_first():
    """Without spread the GPU with most free bytes takes the whole group while the others idle; with it each GPU
    gets one task per round, in the policy's order, before any GPU gets a second."""
    ts = _tasks([(10, 5.0)] * 6)
    gpus = [GPUFree(i, 80, 48, 80) for i in range(4)]
    piled = plan_decision("bmc", ts, gpus).admissions
    assert [(a.gpu_index, len(a.tasks)) for a in piled] == [(0, 6)]
    spread = plan_decision("bmc", ts, gpus, spread=True).admissions
    assert sorted((a.gpu_index, len(a.tasks)) for a in spread) == [(0, 2), (1, 2), (2, 1), (3, 1)]
    assert sorted(t.key for a in spread for t in a.tasks) == sorted(t.key for t in ts)
    # the order still decides who goes first: FIFO under base, the first four tasks get a GPU to themselves
    firsts = {a.tasks[0].key for a in plan_decision("base", ts, gpus, spread=True).admissions}
    assert firsts == {"t0", "t1", "t2", "t3"}


def test_spread_keeps_the_memory_bound_and_the_backfill_counts():
    ts = _tasks([(70, 1.0), (30, 2.0), (30, 3.0), (30, 4.0)])
    gpus = [GPUFree(0, 60, 48, 80), GPUFree(1, 50, 48, 80)]
    d = plan_decision("base", ts, gpus, bypass_limit=4, spread=True)
    for a in d.admissions:
        assert a.bytes <= next(g.free_bytes for g in gpus if g.index == a.gpu_index)
    admitted = sorted(t.key for a in d.admissions for t in a.tasks)
    assert admitted == ["t1", "t2", "t3"]  # t0 fits neither GPU now; three later tasks overtook it
    assert d.bypassed == {"t0": 3}
    strict = plan_decision("base", ts, gpus, bypass_limit=0, spread=True)
    assert strict.admissions == [] and strict.bypassed == {}  # the strict prefix: nothing passes t0


def test_spread_on_one_usable_gpu_is_the_plain_plan():
    ts = _tasks([(10, 1.0), (20, 2.0), (30, 3.0)])
    gpus = [GPUFree(0, 80, 48, 80), GPUFree(1, 80, 0, 80)]
    assert plan_decision("lmcf", ts, gpus, spread=True) == plan_decision("lmcf", ts, gpus)


# --- load-aware spread and the share rule ---------------------------------------------------------------------


def _busy(index: int, free: int, *remaining: float, kind: str | None = "memory") -> GPUFree:
    return GPUFree(index, free, 48, 80, running=tuple(Client(kind, r) for r in remaining))


def test_spread_sends_a_lone_task_to_the_idle_gpu_not_the_one_with_most_free_bytes():
    """A lone task used to go to the GPU with most free bytes even when it was busy and another GPU was idle (the
    robustness grid's 2x4 Poisson cells); under spread the GPUs are taken least loaded first."""
    t = _tasks([(10, 5.0)])
    gpus = [_busy(0, 70, 30.0), GPUFree(1, 60, 48, 80)]
    assert plan_decision("sqtf", t, gpus).admissions[0].gpu_index == 0  # without spread: most free bytes
    assert plan_decision("sqtf", t, gpus, spread=True).admissions[0].gpu_index == 1
    # the soonest idle first, then fewest clients, then most free bytes
    gpus = [_busy(0, 70, 30.0, 1.0), _busy(1, 60, 20.0), _busy(2, 75, 40.0), _busy(3, 75, 30.0), _busy(4, 60, 30.0)]
    assert [g.index for g in sorted(gpus, key=load_key)] == [1, 3, 4, 0, 2]
    assert plan_decision("sqtf", t, gpus, spread=True).admissions[0].gpu_index == 1
    # the least work left, not the soonest idle: ten short clients (15 client-seconds, all done in 1.5 s) load a GPU
    # more than one client with 6 s left
    gpus = [_busy(0, 70, *([1.5] * 10)), _busy(1, 70, 6.0)]
    assert [g.index for g in sorted(gpus, key=load_key)] == [1, 0]
    assert plan_decision("sqtf", t, gpus, spread=True).admissions[0].gpu_index == 1
    # the memory bound still decides first: the least loaded GPU without room is passed over
    gpus = [_busy(0, 70, 30.0, 1.0), _busy(1, 5, 20.0)]
    assert plan_decision("sqtf", t, gpus, spread=True).admissions[0].gpu_index == 0


def test_spread_round_puts_the_longest_task_on_the_least_loaded_gpu():
    """SQTF takes the shortest first; without the re-pairing the round's longest task got the busiest GPU."""
    ts = _tasks([(10, 1.0), (10, 2.0), (10, 50.0)])
    gpus = [GPUFree(0, 80, 48, 80), GPUFree(1, 80, 48, 80), _busy(2, 80, 40.0)]
    adm = {a.tasks[0].key: a.gpu_index for a in plan_decision("sqtf", ts, gpus, spread=True).admissions}
    assert adm["t2"] in (0, 1) and adm["t0"] == 2  # the 50 s task runs alone, the 1 s one beside the busy client
    # where memory does not allow the re-pairing, the policy's pairing stands (and the bound holds)
    gpus = [GPUFree(0, 80, 48, 80), GPUFree(1, 80, 48, 80), _busy(2, 10, 40.0)]
    ts = _tasks([(10, 1.0), (10, 2.0), (60, 50.0)])
    for a in plan_decision("sqtf", ts, gpus, spread=True).admissions:
        assert a.bytes <= next(g.free_bytes for g in gpus if g.index == a.gpu_index)


def test_share_pays_compares_the_groups_slowdown_with_the_wait():
    long_job = Task(key="j", bytes=10, seq=0, qt_seconds=100.0, intensity="memory")
    beside = (Client("memory", 100.0),)
    # two memory-bound jobs (the GNN-measured model, gnnsched.colocation.measured) slow each other by about 6 %:
    # 100 s of work costs ~5.9 s for the task and ~5.6 s for the running client, so waiting 10 s for an idle GPU is
    # better and waiting 200 s is not
    assert not share_pays(long_job, beside, wait_seconds=10.0)
    assert share_pays(long_job, beside, wait_seconds=200.0)
    assert share_pays(long_job, (), wait_seconds=0.0)  # an idle GPU: memory alone decides
    unknown = Task(key="u", bytes=10, seq=0, qt_seconds=None)
    assert share_pays(unknown, beside, wait_seconds=0.0)  # no prediction: memory alone decides, as before
    # a compute-bound pair hurts more than a memory-bound pair (the H200's two training jobs: 1.84x and 1.64x)
    compute = Task(key="c", bytes=10, seq=0, qt_seconds=100.0, intensity="compute")
    assert not share_pays(compute, (Client("compute", 100.0),), wait_seconds=30.0)
    assert share_pays(long_job, beside, wait_seconds=30.0)


def test_share_pays_keeps_an_inference_latency_target():
    beside = (Client("compute", 100.0),)
    # beside a compute-bound job joining takes ~14.3 s against a 12 s target; waiting 1 s then 10 s alone meets it:
    # refused
    infer = Task(key="i", bytes=10, seq=0, qt_seconds=10.0, intensity="memory", qos_seconds=12.0)
    assert not share_pays(infer, beside, wait_seconds=1.0)
    # a 15 s target is met by joining and not by waiting 6 s: joined, although the plain rule would wait
    loose = Task(key="i", bytes=10, seq=0, qt_seconds=10.0, intensity="memory", qos_seconds=15.0)
    assert share_pays(loose, beside, wait_seconds=6.0)
    assert not share_pays(Task(key="i", bytes=10, seq=0, qt_seconds=10.0, intensity="memory"), beside, 6.0)


def test_share_when_pays_holds_a_long_task_and_lets_a_short_one_pass():
    """The gate's rule: a long task that would share a GPU busy for long stays queued while another GPU, full now,
    frees soon (joining would slow it and its neighbour for all its ~106 s, ~12 s lost, against 8 s of waiting); a
    short task behind it may still join (backfill counts the overtake), and without the rule both join on memory
    alone."""
    ts = [Task(key="long", bytes=10, seq=0, qt_seconds=100.0, intensity="memory"),
          Task(key="short", bytes=10, seq=1, qt_seconds=1.0, intensity="memory")]
    gpus = [_busy(0, 60, 500.0), _busy(1, 5, 8.0)]
    plain = plan_decision("base", ts, gpus, bypass_limit=4, spread=True)
    assert sorted(t.key for a in plain.admissions for t in a.tasks) == ["long", "short"]
    held = plan_decision("base", ts, gpus, bypass_limit=4, spread=True, share_when_pays=True)
    assert [t.key for a in held.admissions for t in a.tasks] == ["short"]
    assert held.bypassed == {"long": 1}
    # the strict prefix: the held task blocks the one behind it
    strict = plan_decision("base", ts, gpus, bypass_limit=0, spread=True, share_when_pays=True)
    assert strict.admissions == []
    # an idle GPU takes the long task at once
    idle = plan_decision("base", ts, [*gpus, GPUFree(2, 60, 48, 80)], bypass_limit=4, share_when_pays=True)
    assert {t.key: a.gpu_index for a in idle.admissions for t in a.tasks}["long"] == 2
    # a neighbour that ends in 5 s slows the long task for those 5 s only, not for its whole run: joining costs
    # well under a second against 5 s of waiting, so it joins (the rule once charged R * (s - 1) and held it)
    soon = plan_decision("base", ts, [_busy(0, 60, 5.0), _busy(1, 60, 8.0)], bypass_limit=4, spread=True,
                         share_when_pays=True)
    assert sorted(t.key for a in soon.admissions for t in a.tasks) == ["long", "short"]


def test_remaining_seconds_is_what_the_gate_knows():
    assert remaining_seconds(10.0, 100.0, 104.0) == 6.0
    assert remaining_seconds(10.0, 100.0, 120.0) == 0.0  # overdue: due now
    assert remaining_seconds(None, 100.0, 104.0) == 0.0
    assert remaining_seconds(10.0, None, 104.0) == 0.0


@settings(max_examples=300, deadline=None)
@given(
    size=st.integers(1, 40 * GiB),
    qt=st.one_of(st.none(), st.floats(0.0, 500.0)),
    intensity=st.sampled_from(["memory", "compute", None]),
    gpus=st.lists(st.tuples(st.integers(0, 40 * GiB), st.integers(0, 4),
                            st.lists(st.tuples(st.sampled_from(["memory", "compute", None]), st.floats(0.0, 300.0)),
                                     max_size=3)), min_size=2, max_size=8),
    limit=st.integers(0, 5),
)
def test_spread_one_task_is_the_rounds_answer(size: int, qt: float | None, intensity: str | None, gpus: list,
                                               limit: int) -> None:
    # a one-task queue under spread is answered without the rounds (no per-round GPU copies, no sort of every GPU):
    # it must be exactly what the rounds give, with and without the share rule
    from gnnsched import policies as pol

    task = Task(key="t", bytes=size, seq=0, qt_seconds=qt, intensity=intensity)
    free = [GPUFree(index=i, free_bytes=b, free_slots=s, capacity_bytes=40 * GiB,
                    running=tuple(Client(k, r) for k, r in run)) for i, (b, s, run) in enumerate(gpus)]
    for p in Policy:
        for share in (False, True):
            want = pol._plan_rounds(p, [task], free, limit, share)
            assert pol._spread_one(p, task, free, share) == want
            if sum(1 for g in free if g.free_slots > 0) > 1:
                assert plan_decision(p, [task], free, limit, spread=True, share_when_pays=share) == want


@given(qt=st.one_of(st.none(), st.floats(allow_nan=True)), at=st.one_of(st.none(), st.floats(-1e6, 1e6)),
       now=st.floats(-1e6, 1e6))
def test_predicted_end_gives_the_seconds_left(qt: float | None, at: float | None, now: float) -> None:
    # the simulator keeps each client's predicted end and subtracts the clock at each decision: bit for bit the
    # admission time plus the prediction minus the clock, at least 0, and 0 without a usable prediction
    from gnnsched.policies import predicted_end, seconds_left

    usable = qt is not None and at is not None and qt >= 0 and not math.isinf(qt)
    want = max(0.0, at + qt - now) if usable else 0.0  # type: ignore[operator]
    assert seconds_left(predicted_end(qt, at), now) == want
    assert remaining_seconds(qt, at, now) == want


# --- the apart rule (an undecided fault's peers) -------------------------------------------------------------------


@pytest.mark.parametrize("policy", list(Policy))
@pytest.mark.parametrize("spread", [False, True])
@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("limit", [0, 4])
def test_peers_never_share_a_gpu_on_any_planning_path(policy: Policy, spread: bool, share: bool, limit: int) -> None:
    """Three peers of one undecided fault queued beside an unrelated task, on two idle GPUs and one that runs a
    fourth peer: no GPU gets two peers (queued with queued, or queued with running), and a peer refused everywhere
    stays queued. Every path the gate can take (prefix, backfill, spread rounds, share rule) applies it."""
    peers = {f"ns/p{i}" for i in range(4)}
    tasks = [Task(key=f"p{i}", bytes=GiB, seq=i, qt_seconds=60.0, job=f"ns/p{i}", apart=frozenset(peers - {f"ns/p{i}"}))
             for i in range(3)] + [Task(key="x", bytes=GiB, seq=3, qt_seconds=60.0, job="ns/x")]
    running = (Client(None, 30.0, "ns/p3", frozenset(peers - {"ns/p3"})),)
    gpus = [GPUFree(0, 10 * GiB, 4, 16 * GiB), GPUFree(1, 10 * GiB, 4, 16 * GiB),
            GPUFree(2, 10 * GiB, 4, 16 * GiB, running)]
    plan = plan_decision(policy, tasks, gpus, limit, spread=spread, share_when_pays=share)
    on: dict[int, list[str]] = {g.index: [c.job or "" for c in g.running] for g in gpus}
    for a in plan.admissions:
        on[a.gpu_index] += [t.job or "" for t in a.tasks]
    for jobs in on.values():
        assert len([j for j in jobs if j in peers]) <= 1, on
    admitted = [t.key for a in plan.admissions for t in a.tasks]
    assert len([k for k in admitted if k.startswith("p")]) == 2  # two idle GPUs: two of the three peers start


@pytest.mark.parametrize("spread", [False, True])
def test_a_lone_peer_waits_for_its_peers_gpu_rather_than_join_it(spread: bool) -> None:
    task = Task(key="a", bytes=GiB, seq=0, qt_seconds=10.0, job="ns/a", apart=frozenset({"ns/b"}))
    busy = GPUFree(0, 10 * GiB, 4, 16 * GiB, (Client(None, 30.0, "ns/b"),))
    assert plan_decision("lmcf", [task], [busy], 0, spread=spread).admissions == []
    # the peer's own list alone keeps them apart too (symmetric)
    plain = Task(key="b", bytes=GiB, seq=0, job="ns/b")
    holder = GPUFree(0, 10 * GiB, 4, 16 * GiB, (Client(None, 30.0, "ns/a", frozenset({"ns/b"})),))
    assert plan_decision("lmcf", [plain], [holder], 0, spread=spread).admissions == []
    idle = GPUFree(1, 10 * GiB, 4, 16 * GiB)
    assert [a.gpu_index for a in plan_decision("lmcf", [task], [busy, idle], 0, spread=spread).admissions] == [1]
