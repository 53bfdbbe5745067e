"""Property test of the gate's state machine: random arrivals, exits, cancellations, liars, GPU health flips and
agent restarts (books rebuilt from the clients that reconnect). In-process, so ≥ 10,000 events run in seconds.

Checked after every event, independently of the books' own tripwire: per GPU the bytes of the clients the *model*
believes run there stay ≤ total − reserve and ≤ max clients; the books agree with the model exactly (nothing lost,
nothing invented); no client is ever admitted twice; with backfill on (``bypass_limit`` > 0) the test counts itself,
from the policy's order before each decision, how many later clients started ahead of each waiting one, and checks
that the books keep the same count and that it never passes the limit (0: nobody is ever overtaken); an exclusive
client (``gnnsched.io/exclusive``) runs only
alone on its GPU, booked at the GPU's whole capacity whatever bytes it asked for. At the end every waiting client gets
admitted once the running ones exit (liveness).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gnnsched.node_agent.books import Books, GPUSlot, Rejected
from gnnsched.policies import Policy

UNIT = 2**30
TOTAL, RESERVE, MAX_CLIENTS = 80 * UNIT, 4 * UNIT, 5

arrive = st.tuples(st.just("arrive"), st.integers(1, 80), st.one_of(st.none(), st.floats(0, 1e4)))
# An exclusive arrival asks for any bytes, even more than a GPU's shareable capacity: it is booked at the whole GPU.
arrive_x = st.tuples(st.just("arrive-x"), st.integers(1, 120), st.one_of(st.none(), st.floats(0, 1e4)))
exit_ = st.tuples(st.just("exit"), st.integers(0, 10**6))
cancel = st.tuples(st.just("cancel"), st.integers(0, 10**6))
restart = st.tuples(st.just("restart"), st.integers(0, 2**16))
liar = st.tuples(st.just("liar"), st.integers(0, 10**6), st.integers(1, 200))
health = st.tuples(st.just("health"), st.integers(0, 1), st.booleans())
ops = st.lists(
    st.one_of(arrive, arrive, arrive, arrive_x, exit_, exit_, cancel, restart, liar, health), min_size=100,
    max_size=140
)


@dataclass
class Client:
    key: str
    bytes: int
    qt: float | None
    state: str = "waiting"  # waiting | running | done
    gpu_uuid: str | None = None
    admissions: int = 0
    bypassed: int = 0  # later clients (in the policy's order) admitted while this one waited, counted by the test
    exclusive: bool = False


def _gpus() -> list[GPUSlot]:
    return [GPUSlot(i, f"GPU-{i}", "Fake-GPU", TOTAL, RESERVE, MAX_CLIENTS) for i in range(2)]


def _snapshot(b: Books) -> tuple:
    return (
        sorted((k, e.bytes, e.gpu_index) for k, e in b.running.items()),
        sorted((k, e.bytes) for k, e in b.queued.items()),
    )


def _apply_decisions(books: Books, clients: dict[str, Client]) -> None:
    order = [e.key for e in books.queue_order()]
    admitted: set[str] = set()
    for d in books.decide():
        for e in d.entries:
            c = clients[e.key]
            assert c.state == "waiting", f"{c.key} admitted while {c.state}"
            c.state, c.gpu_uuid = "running", d.gpu.uuid
            c.admissions += 1
            assert c.admissions == 1, f"{c.key} admitted twice"
            admitted.add(e.key)
    for i, key in enumerate(order):
        if key in admitted:
            continue
        c = clients[key]
        c.bypassed += sum(1 for k in order[i + 1:] if k in admitted)
        assert c.bypassed <= books.bypass_limit, f"{key} overtaken {c.bypassed} times, limit {books.bypass_limit}"
        assert books.queued[key].bypassed == c.bypassed


def _check(books: Books, clients: dict[str, Client]) -> None:
    per_gpu: dict[str, list[int]] = {}
    for c in clients.values():
        if c.state == "running":
            per_gpu.setdefault(c.gpu_uuid or "", []).append(c.bytes)
    for uuid, sizes in per_gpu.items():
        assert sum(sizes) <= TOTAL - RESERVE, f"{uuid}: {sum(sizes)} > capacity"
        assert len(sizes) <= MAX_CLIENTS
    for c in clients.values():
        if c.state == "running" and c.exclusive:
            assert per_gpu[c.gpu_uuid or ""] == [TOTAL - RESERVE], f"exclusive {c.key} is not alone on {c.gpu_uuid}"
    assert set(books.running) == {k for k, c in clients.items() if c.state == "running"}
    assert set(books.queued) == {k for k, c in clients.items() if c.state == "waiting"}
    for k, e in books.running.items():
        assert books.gpus[e.gpu_index].uuid == clients[k].gpu_uuid and e.bytes == clients[k].bytes
    books.check()


def _pick(clients: dict[str, Client], state: str, i: int) -> Client | None:
    pool = [c for c in clients.values() if c.state == state]
    return pool[i % len(pool)] if pool else None


@settings(max_examples=110, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.sampled_from(list(Policy)), ops, st.sampled_from([0, 0, 1, 3]),
       st.sampled_from([(False, False), (True, False), (True, True)]))
def test_gate_books_invariant_under_random_events(policy: Policy, events: list[tuple], limit: int,
                                                  rules: tuple[bool, bool]) -> None:
    # rules: (spread, share_when_pays), the load-aware planning rules, which must keep the same invariants
    books = Books(_gpus(), policy, bypass_limit=limit, spread=rules[0], share_when_pays=rules[1])
    clients: dict[str, Client] = {}
    n = 0
    for ev in events:
        kind = ev[0]
        if kind == "arrive":
            n += 1
            c = Client(f"pod-{n}", ev[1] * UNIT, ev[2])
            clients[c.key] = c
            try:
                books.enqueue(c.key, pod_uid=c.key, bytes=c.bytes, qt_seconds=c.qt)
            except Rejected as exc:
                assert exc.reason == "exceeds-gpu" and c.bytes > TOTAL - RESERVE
                c.state = "done"
        elif kind == "arrive-x":
            n += 1
            c = Client(f"pod-{n}", TOTAL - RESERVE, ev[2], exclusive=True)
            clients[c.key] = c
            e = books.enqueue(c.key, pod_uid=c.key, bytes=ev[1] * UNIT, qt_seconds=c.qt, exclusive=True)
            assert e.bytes == TOTAL - RESERVE
        elif kind == "exit":
            c = _pick(clients, "running", ev[1])
            if c is not None:
                assert books.release(c.key) is not None
                c.state = "done"
        elif kind == "cancel":
            c = _pick(clients, "waiting", ev[1])
            if c is not None:
                assert books.cancel(c.key) is not None
                c.state = "done"
        elif kind == "health":
            books.set_health(ev[1], ev[2])
        elif kind == "liar":
            before = _snapshot(books)
            target = _pick(clients, "running", ev[1]) or _pick(clients, "waiting", ev[1])
            if target is not None:
                # Re-request or claim to be running under a live key: refused, books untouched.
                for attempt in (
                    partial(books.enqueue, target.key, pod_uid=target.key, bytes=ev[2] * UNIT),
                    partial(books.restore, target.key, pod_uid=target.key, bytes=ev[2] * UNIT, gpu_uuid="GPU-9"),
                ):
                    try:
                        attempt()
                        raise AssertionError("liar accepted")
                    except Rejected:
                        pass
                if target.state == "running":
                    try:
                        books.restore(target.key, pod_uid=target.key, bytes=target.bytes, gpu_uuid="GPU-0")
                        raise AssertionError("duplicate resume accepted")
                    except Rejected as exc:
                        assert exc.reason == "duplicate"
            for bad in (0, -5, True, 1.5):
                try:
                    books.enqueue(f"liar-{n}", pod_uid="x", bytes=bad)  # type: ignore[arg-type]
                    raise AssertionError("bad bytes accepted")
                except Rejected as exc:
                    assert exc.reason == "invalid-bytes"
            assert _snapshot(books) == before
        elif kind == "restart":
            # The agent dies. Some workloads exit while it is down; the rest reconnect (in any order) and resume;
            # waiting clients re-request. A fresh agent starts with all GPUs as the driver reports (healthy).
            seed = ev[1]
            health_before = {i: g.healthy for i, g in books.gpus.items()}
            books = Books(_gpus(), policy, bypass_limit=limit)
            for i, ok in health_before.items():
                books.set_health(i, ok)
            order = sorted(clients.values(), key=lambda c: hash((c.key, seed)))
            for c in order:
                if c.state == "running":
                    if hash((c.key, seed, "exit")) % 5 == 0:
                        c.state = "done"
                        continue
                    books.restore(c.key, pod_uid=c.key, bytes=c.bytes, gpu_uuid=c.gpu_uuid or "",
                                  exclusive=c.exclusive)
            for c in order:
                if c.state == "waiting":
                    books.enqueue(c.key, pod_uid=c.key, bytes=c.bytes, qt_seconds=c.qt, exclusive=c.exclusive)
                    c.bypassed = 0  # a new agent starts the counts afresh (they live in its memory only)
        _check(books, clients)
        _apply_decisions(books, clients)
        _check(books, clients)
    # Liveness: heal, then let everything drain; every client that waited runs exactly once.
    for i in books.gpus:
        books.set_health(i, True)
    _apply_decisions(books, clients)
    while any(c.state == "running" for c in clients.values()):
        c = _pick(clients, "running", 0)
        assert c is not None
        books.release(c.key)
        c.state = "done"
        _apply_decisions(books, clients)
        _check(books, clients)
    assert not books.queued and all(c.state == "done" for c in clients.values())
    assert all(c.admissions <= 1 for c in clients.values())


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(list(Policy)),
    st.integers(1, 4),
    st.lists(st.tuples(st.integers(1, 30), st.booleans()), min_size=5, max_size=50),
)
def test_backfill_bounds_how_often_a_big_job_is_overtaken(policy: Policy, limit: int, stream: list[tuple]) -> None:
    """One GPU, one big job blocked behind a running one, and a stream of small jobs arriving (and some exiting): the
    small ones may start ahead of it, but at most ``limit`` of them; then it blocks them until memory frees for it."""
    books = Books(_gpus()[:1], policy, bypass_limit=limit)
    clients: dict[str, Client] = {}

    def arrive(key: str, size: int, qt: float) -> Client:
        c = clients[key] = Client(key, size * UNIT, qt)
        books.enqueue(key, pod_uid=key, bytes=c.bytes, qt_seconds=qt)
        return c

    arrive("occupant", 50, 1.0)
    _apply_decisions(books, clients)
    big = arrive("big", 60, 2.0)  # first in FIFO and in QT order behind the occupant; last in LMCF order
    overtaken_max = 0
    for i, (size, leave) in enumerate(stream):
        arrive(f"small-{i}", size, 100.0 + i)
        if leave:
            c = _pick(clients, "running", i)
            if c is not None and c.key != "occupant":
                books.release(c.key)
                c.state = "done"
        _apply_decisions(books, clients)  # asserts the books' count == the test's own count <= limit
        _check(books, clients)
        overtaken_max = max(overtaken_max, big.bypassed)
        assert big.state == "waiting"  # the occupant still holds 50 of 76 GiB: the big job cannot fit
    if policy is Policy.LMCF:
        assert overtaken_max == 0  # nothing smaller is behind it in ascending-size order
    # The occupant exits; once the small ones still running drain, the big job starts.
    books.release("occupant")
    clients["occupant"].state = "done"
    _apply_decisions(books, clients)
    while big.state == "waiting":
        c = _pick(clients, "running", 0)
        assert c is not None, "the big job waits with nothing running"
        books.release(c.key)
        c.state = "done"
        _apply_decisions(books, clients)
    assert big.bypassed <= limit


def test_backfill_starts_small_jobs_past_a_blocked_one_then_stops_at_the_limit() -> None:
    books = Books(_gpus()[:1], Policy.BASE, bypass_limit=2)
    clients: dict[str, Client] = {}
    for key, size in (("occupant", 50), ("big", 60), ("s1", 5), ("s2", 5), ("s3", 5)):
        clients[key] = Client(key, size * UNIT, None)
        books.enqueue(key, pod_uid=key, bytes=size * UNIT)
    _apply_decisions(books, clients)
    assert [k for k, c in clients.items() if c.state == "running"] == ["occupant", "s1", "s2"]
    assert books.queued["big"].bypassed == 2 and clients["s3"].state == "waiting"
    # Strict prefix (limit 0): nothing passes the big job.
    strict = Books(_gpus()[:1], Policy.BASE, bypass_limit=0)
    for key, size in (("occupant", 50), ("big", 60), ("s1", 5)):
        strict.enqueue(key, pod_uid=key, bytes=size * UNIT)
    assert [e.key for d in strict.decide() for e in d.entries] == ["occupant"]


def test_exclusive_waits_for_an_empty_gpu_and_then_runs_alone() -> None:
    """An exclusive pod asking for more than a GPU's shareable capacity is queued, not refused; it starts only on an
    empty GPU, nothing joins it, and its GPU takes others again once it exits."""
    books = Books(_gpus(), Policy.BASE, bypass_limit=0)
    clients: dict[str, Client] = {}
    for key, size in (("a", 10), ("b", 10)):
        clients[key] = Client(key, size * UNIT, None)
        books.enqueue(key, pod_uid=key, bytes=size * UNIT)
    _apply_decisions(books, clients)  # a and b share GPU 0 (base fills the GPU with the most free bytes first)
    assert {clients["a"].gpu_uuid, clients["b"].gpu_uuid} == {"GPU-0"}
    x = clients["x"] = Client("x", TOTAL - RESERVE, None, exclusive=True)
    books.enqueue("x", pod_uid="x", bytes=85 * UNIT, exclusive=True)  # > capacity (76 GiB): still queued
    _apply_decisions(books, clients)
    assert x.state == "running" and x.gpu_uuid == "GPU-1"
    assert books.running["x"].bytes == TOTAL - RESERVE
    clients["c"] = Client("c", 1 * UNIT, None)
    books.enqueue("c", pod_uid="c", bytes=1 * UNIT)
    _apply_decisions(books, clients)
    assert clients["c"].gpu_uuid == "GPU-0"  # never beside x
    y = clients["y"] = Client("y", TOTAL - RESERVE, None, exclusive=True)
    books.enqueue("y", pod_uid="y", bytes=1 * UNIT, exclusive=True)
    _apply_decisions(books, clients)
    assert y.state == "waiting"  # GPU 0 is busy, GPU 1 is x's alone
    for key in ("a", "b", "c"):
        books.release(key)
        clients[key].state = "done"
    _apply_decisions(books, clients)
    assert y.state == "running" and y.gpu_uuid == "GPU-0"
    _check(books, clients)


def test_books_spread_reads_the_running_clients() -> None:
    """The agent's books hand the planner each GPU's running clients (intensity, predicted seconds left), so under
    spread a new pod goes to the idle GPU even when the busy one has more free bytes; without spread it goes by
    free bytes. With the share rule a long pod that would share a GPU busy for long waits while a GPU, too full for
    it now, is due to be idle in ~5 s."""
    def books(**kw: bool) -> Books:
        b = Books([GPUSlot(0, "GPU-0", "Fake-GPU", 80 * UNIT, 0, 5), GPUSlot(1, "GPU-1", "Fake-GPU", 40 * UNIT, 0, 5)],
                  Policy.SQTF, **kw)
        b.enqueue("first", pod_uid="first", bytes=10 * UNIT, qt_seconds=600.0, intensity="memory", now=0.0)
        assert [d.gpu.index for d in b.decide(now=0.0)] == [0]
        return b

    for spread, want in ((False, 0), (True, 1)):
        b = books(spread=spread)
        b.enqueue("second", pod_uid="second", bytes=10 * UNIT, qt_seconds=5.0, now=1.0)
        assert [d.gpu.index for d in b.decide(now=1.0)] == [want]
    b = books(spread=True, share_when_pays=True)
    b.enqueue("idle", pod_uid="idle", bytes=10 * UNIT, qt_seconds=50.0, intensity="memory", now=1.0)
    assert [d.gpu.index for d in b.decide(now=1.0)] == [1]
    b.enqueue("long", pod_uid="long", bytes=35 * UNIT, qt_seconds=100.0, intensity="memory", now=50.0)
    assert b.decide(now=50.0) == []  # GPU 0 busy for 554 s, GPU 1 (no room now) due in 5.4 s: waiting pays
    b.release("idle")
    assert [d.gpu.index for d in b.decide(now=56.0)] == [1]


def test_books_share_rule_keeps_an_inference_latency_target() -> None:
    """A pod's latency target (the operator's ``qos-target-seconds`` annotation, read by ``trusted_demand``) reaches
    the share rule: a short memory-bound pod that the cost comparison holds back (GPU 1 is due to be idle in 1 s)
    joins busy GPU 0 when only joining meets its target (10.8 s: 10 s x its predicted slowdown 1.059 = 10.59 s beside
    a memory-bound client under the GNN-measured model, against 1 s + 10 s waiting), and waits, as before, without
    one."""
    from gnnsched.contract import ANN_QOS_TARGET
    from gnnsched.node_agent.identity import PodInfo, gnnjob_owner_reference, pod_from_object, trusted_demand
    from gnnsched.trust.job_facts import STATUS_FIELD, FactsError, facts_status

    def demand(target: str | None) -> float | None:
        ann = {"gnnsched.io/admit-bytes": str(10 * UNIT)} | ({ANN_QOS_TARGET: target} if target else {})
        pod = {"metadata": {"name": "q", "namespace": "ns", "uid": "q", "annotations": ann,
                            "ownerReferences": [gnnjob_owner_reference("j", "ju")]}}
        try:
            job = {"metadata": {"name": "j", "namespace": "ns", "uid": "ju"},
                   "status": {STATUS_FIELD: facts_status(pod)}}
        except FactsError:
            return None  # the operator never writes a target it cannot read (the CRD's schema refuses it too)
        return trusted_demand(pod_from_object(pod, lambda ns, n: job), TOTAL).qos_seconds

    assert demand("10.8") == 10.8
    assert demand(None) is None and demand("soon") is None and demand("-1") is None and demand("inf") is None
    # the same target on a pod that no GNNJob's status names is not read
    assert trusted_demand(PodInfo("q", "ns", "q", annotations={ANN_QOS_TARGET: "11.8"}), TOTAL).qos_seconds is None
    for target, want in ((None, []), (demand("10.8"), [0])):
        # no start-up after admission, so the seconds above are the predicted ends (test_spread_counts_the_start_up...)
        b = Books([GPUSlot(0, "GPU-0", "Fake-GPU", 80 * UNIT, 0, 5), GPUSlot(1, "GPU-1", "Fake-GPU", 40 * UNIT, 0, 5)],
                  Policy.SQTF, share_when_pays=True, startup_seconds=0.0)
        b.enqueue("first", pod_uid="first", bytes=10 * UNIT, qt_seconds=100.0, intensity="memory", now=0.0)
        assert [d.gpu.index for d in b.decide(now=0.0)] == [0]
        # GPU 1 was idle: "second" goes there, and leaves no room on it for q
        b.enqueue("second", pod_uid="second", bytes=35 * UNIT, qt_seconds=11.0, intensity="compute", now=0.0)
        assert [d.gpu.index for d in b.decide(now=0.0)] == [1]
        b.enqueue("q", pod_uid="q", bytes=10 * UNIT, qt_seconds=10.0, intensity="memory", now=10.0,
                  qos_seconds=target)
        assert [d.gpu.index for d in b.decide(now=10.0)] == want


def test_spread_counts_the_start_up_a_client_has_left() -> None:
    """A client's GPU work starts after its process start-up, so its predicted end is its admission plus the
    start-up left (policies.startup_left: all of it behind the plain gate; behind gate --prestart what its wait at the
    gate did not cover) plus its predicted runtime. A pod admitted a moment ago with a 1 s prediction is not about to
    finish: the next pod goes to the GPU whose client has 3 s left, not to it; assuming no start-up sends it there."""
    from gnnsched.contract import ANN_PRESTART
    from gnnsched.node_agent.identity import PodInfo, trusted_demand
    from gnnsched.policies import STARTUP_SECONDS, startup_left

    assert startup_left(4.4, 0.0, 10.0, prestarted=False) == 4.4
    assert abs(startup_left(4.4, 8.0, 10.0, prestarted=True) - 2.4) < 1e-9  # 2 s of it ran at the gate
    assert startup_left(4.4, 0.0, 10.0, prestarted=True) == 0.0
    assert startup_left(4.4, None, 10.0, prestarted=True) == 4.4  # booked after a restart: when it queued is unknown
    ann = {"gnnsched.io/admit-bytes": str(10 * UNIT)}
    assert trusted_demand(PodInfo("q", "ns", "q", annotations=ann, owner_job="ns/j"), TOTAL).prestarted is False
    assert trusted_demand(PodInfo("q", "ns", "q", annotations=ann | {ANN_PRESTART: "true"}, owner_job="ns/j"),
                          TOTAL).prestarted is True

    def next_pod_goes_to(startup: float, prestarted: bool) -> int:
        # GPU 0: one 75-unit pod, admitted at 0 with 8 s predicted; GPU 1 (the only room for them): three short pods
        # admitted at 0.5 with 0.5 s predicted each, queued at 0.5 (plain gate) or long before (prestarted)
        b = Books([GPUSlot(0, "GPU-0", "Fake-GPU", 80 * UNIT, 0, 5), GPUSlot(1, "GPU-1", "Fake-GPU", 80 * UNIT, 0, 5)],
                  Policy.SQTF, spread=True, startup_seconds=startup)
        b.enqueue("long", pod_uid="long", bytes=75 * UNIT, qt_seconds=8.0, now=0.0)
        assert [d.gpu.index for d in b.decide(now=0.0)] == [0]
        for i in range(3):
            b.enqueue(f"short{i}", pod_uid=f"short{i}", bytes=10 * UNIT, qt_seconds=0.5,
                      now=-10.0 if prestarted else 0.5, prestarted=prestarted)
        assert {d.gpu.index for d in b.decide(now=0.5)} == {1}
        b.enqueue("next", pod_uid="next", bytes=5 * UNIT, qt_seconds=1.0, now=1.0)
        (decision,) = b.decide(now=1.0)
        return decision.gpu.index

    # with the start-up: GPU 0 has 4.4 + 8 - 1 = 11.4 s of work left, GPU 1 three times 4.4 + 0.5 - 0.5 = 13.2 s
    assert next_pod_goes_to(STARTUP_SECONDS, prestarted=False) == 0
    # without it the three short pods looked finished (0 s left each) while they were still starting
    assert next_pod_goes_to(0.0, prestarted=False) == 1
    # prestarted long before their admission: no start-up left, they are about to finish
    assert next_pod_goes_to(STARTUP_SECONDS, prestarted=True) == 1


def test_spread_rounds_keep_the_decisions_order_for_alternating_policies() -> None:
    """BMC and BQT alternate small and large (short and long), so the traversal of the tasks a spread round leaves is
    not the rest of the decision's order; the rounds used to re-traverse it, and a strict prefix (limit 0) overtook
    its head, or a backfill counted different bypasses than the gate's order says. Seeded random event sequences
    (arrivals of any size and prediction, exits, cancels, exclusive pods) under spread, checked after each decision
    with the same invariants as the hypothesis test above; about 1 in 6 sequences failed before the fix."""
    import random

    rng = random.Random(7)
    for _ in range(400):
        policy = rng.choice([Policy.BMC, Policy.BQT])
        limit = rng.choice([0, 1, 3])
        books = Books(_gpus(), policy, bypass_limit=limit, spread=True, share_when_pays=rng.random() < 0.5)
        clients: dict[str, Client] = {}
        n = 0
        for _step in range(rng.randint(5, 60)):
            k = rng.random()
            if k < 0.5:
                n += 1
                exclusive = k < 0.05
                c = Client(f"pod-{n}", TOTAL - RESERVE if exclusive else rng.randint(1, 80) * UNIT,
                           rng.choice([None, rng.uniform(0.1, 100)]), exclusive=exclusive)
                clients[c.key] = c
                try:
                    books.enqueue(c.key, pod_uid=c.key, bytes=UNIT if exclusive else c.bytes, qt_seconds=c.qt,
                                  exclusive=exclusive)
                except Rejected:
                    c.state = "done"
            elif k < 0.75:
                running = _pick(clients, "running", rng.randint(0, 99))
                if running is not None:
                    books.release(running.key)
                    running.state = "done"
            elif k < 0.8:
                waiting = _pick(clients, "waiting", rng.randint(0, 99))
                if waiting is not None:
                    books.cancel(waiting.key)
                    waiting.state = "done"
            _apply_decisions(books, clients)
            _check(books, clients)
