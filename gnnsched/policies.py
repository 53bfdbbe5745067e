"""Grouping policies for co-locating jobs on shared GPUs, and the memory-safety invariant they must keep.

Pure functions, no I/O and no clocks: the node agent's gate calls them on every decision, the simulator calls the same
ones offline, so what is simulated is what runs.

The five policies come from two papers (``shared/seeds``):

* CoGNN (training): **Base** — FIFO, greedily packs the queue in order into a group while it fits; **LMCF** —
  lowest-memory-consumption-first: the queue sorted by ascending PMC, traversed in that order; **BMC** —
  balanced memory consumption: the ascending queue is a deque popped alternately from the left (small) and the right
  (large) end (CoGNN Algorithm 1).
* GNNSched (inference): **SQTF** — shortest-QT-first: ascending QT (QT = 2 × solo runtime, so ascending predicted
  runtime), with a grouping threshold ``gTH = ceil(SP / ceil(SP / MA))`` that evens out group sizes (Algorithm 1);
  **BQT** — balanced QT: the ascending-QT deque popped alternately left/right, same threshold (Algorithm 2).

Every policy is therefore "a traversal order + a rule for where a group ends". A group ends when

1. adding the next task would make the group's bytes exceed the bound (the *safety* condition),
2. the group already has ``max_clients`` members (MPS client cap / CoGNN's number of workers), or
3. (SQTF, BQT) the group's bytes already exceed ``gTH`` (the paper's balancing rule).

The published SQTF/BQT pseudo-code only tests rule 3, *before* adding the task: with ``gPMC <= gTH`` it appends a task
of any size, so a group can reach ``gTH + PMC > MA`` and overflow the GPU. Here rule 1 is checked for every policy
before a task joins, so a group never exceeds its bound (``group_bytes <= bound`` always; a task larger than the bound
is never placed under that bound). CoGNN's BMC advances on ``gPMC >= MA``; we advance on ``>`` so a group may fill the
bound exactly, which is what the invariant ``committed <= total - reserve`` allows.

Online use (the gate): the queue's traversal order is computed once per decision; each GPU in turn (most free bytes
first) receives the first group of the *remaining* traversal, bounded by that GPU's free bytes and free client slots.
With ``bypass_limit=0`` (strict prefix) admissions are always a prefix of the policy's order: nothing overtakes a
task the policy puts first (no starvation of large jobs), and a GPU with memory free admits its next group at the next
decision (an arrival or an exit) without waiting for its whole running group to finish.

The price of the prefix rule is head-of-line blocking: a large task waiting for memory holds back every smaller task
behind it, although they would fit now. ``bypass_limit=N > 0`` is *bounded-bypass backfill*: a group may skip a task
that does not fit its GPU and take later tasks that do, but every queued task carries how many tasks behind it in the
order have started before it (``Task.bypassed``; the caller keeps the count between decisions, this module stays
pure), and once that count reaches ``N`` nothing may overtake it any more — it blocks exactly as under the prefix
rule until memory frees for it. So a task waits at most ``N`` overtakers longer than it would have under the prefix
rule: starvation stays bounded, and the memory bound is checked for every task that joins a group, as before.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import lru_cache, partial

from gnnsched.attempts.fault_classes import must_stay_apart
from gnnsched.colocation.interference import load_default
from gnnsched.progress import StepProgress, seconds_left
from gnnsched.trust.domain import may_join, mixed

#: The gate's backfill rule when none is given (``node-agent --bypass-limit``, the simulator without ``+bypassN``).
DEFAULT_BYPASS_LIMIT = 4


class Policy(str, Enum):
    """The grouping policies; values are the CLI spellings (``--policy``)."""

    BASE = "base"
    LMCF = "lmcf"
    BMC = "bmc"
    SQTF = "sqtf"
    BQT = "bqt"


@dataclass(frozen=True, slots=True)
class Task:
    """A queued job as the policies see it.

    ``seq`` is the arrival order (FIFO and every tie-break); ``qt_seconds`` the predicted (solo) runtime — GNNSched's
    QT is twice it, so the order is the same; unknown runtimes sort last. ``bypassed``: how many tasks later in the
    policy's order have been admitted while this one waited (see ``plan_decision``); the caller keeps it.
    ``qos_seconds``: an inference job's latency target, which the share rule (:func:`share_pays`) keeps.
    """

    key: str
    bytes: int
    seq: int
    qt_seconds: float | None = None
    intensity: str | None = None
    bypassed: int = 0  # tasks behind this one in the order that started before it (bounded-bypass backfill)
    qos_seconds: float | None = None  # inference: the latency target (GNNJob qosTargetSeconds); None = none
    job: str | None = None  # the job this attempt belongs to (the apart rule's identity)
    apart: frozenset[str] = frozenset()  # jobs it may not share a GPU with (its undecided fault's peers)
    domain: str | None = None  # its trust domain (gnnsched.trust.domain); None: shares with anyone


@dataclass(frozen=True, slots=True)
class Client:
    """A client running on a GPU, as the load-aware rules see it (``spread``'s GPU order, :func:`share_pays`):
    its intensity class (the interference model's profile) and its predicted remaining seconds
    (:func:`remaining_seconds`; 0 when it is due or has no prediction); and, for the apart rule
    (:func:`apart_allows`), its job and the jobs it may not share the GPU with."""

    intensity: str | None
    remaining_seconds: float
    job: str | None = None
    apart: frozenset[str] = frozenset()
    domain: str | None = None  # its trust domain (gnnsched.trust.domain)


@dataclass(frozen=True, slots=True)
class GPUFree:
    """What one GPU can take right now: free bytes (capacity − committed) and free MPS client slots. ``running``:
    the clients it runs now; only the load-aware rules read it (callers that use neither may leave it empty)."""

    index: int
    free_bytes: int
    free_slots: int
    capacity_bytes: int
    running: tuple[Client, ...] = ()

    @property
    def busy_seconds(self) -> float:
        """Predicted seconds until every client running here has ended (0: idle)."""
        return max([c.remaining_seconds for c in self.running], default=0.0)

    @property
    def work_left(self) -> float:
        """Predicted client-seconds still to run here: the sum of the running clients' predicted seconds left."""
        return sum(c.remaining_seconds for c in self.running)


@dataclass(frozen=True, slots=True)
class Admission:
    """One group admitted onto one GPU by a decision."""

    gpu_index: int
    tasks: tuple[Task, ...]

    @property
    def bytes(self) -> int:
        return sum(t.bytes for t in self.tasks)


@dataclass(frozen=True, slots=True)
class Plan:
    """One gate decision: the admitted groups, and the new ``bypassed`` count of every queued task that was
    overtaken by this decision (key → count; tasks not listed keep theirs). The caller stores the counts for the next
    decision."""

    admissions: list[Admission]
    bypassed: dict[str, int]


@dataclass(slots=True)
class Grouping:
    """Offline grouping of a whole queue (the papers' batch view): groups in submission order, plus the tasks that can
    never be placed under the bound (larger than it)."""

    groups: list[list[Task]] = field(default_factory=list)
    oversize: list[Task] = field(default_factory=list)


def parse_policy(name: str | Policy) -> Policy:
    """``"LMCF"`` → ``Policy.LMCF``; raises ``ValueError`` naming the allowed values."""
    if isinstance(name, Policy):
        return name
    try:
        return Policy(str(name).strip().lower())
    except ValueError:
        allowed = "|".join(p.value for p in Policy)
        raise ValueError(f"policy: {name!r} is not one of {allowed}") from None


def _qt_key(t: Task) -> tuple[float, int]:
    qt = t.qt_seconds
    return (math.inf if qt is None or math.isnan(qt) else qt, t.seq)


def _alternate(ascending: Sequence[Task]) -> list[Task]:
    """The pop sequence of the papers' deque: left, right, left, right, …"""
    out: list[Task] = []
    lo, hi = 0, len(ascending) - 1
    i = 0
    while lo <= hi:
        if i % 2 == 1:
            out.append(ascending[hi])
            hi -= 1
        else:
            out.append(ascending[lo])
            lo += 1
        i += 1
    return out


def traversal(policy: Policy | str, tasks: Iterable[Task]) -> list[Task]:
    """The order in which ``policy`` considers the queue (ties always broken by arrival)."""
    p = parse_policy(policy)
    items = list(tasks)
    if p is Policy.BASE:
        return sorted(items, key=lambda t: t.seq)
    if p is Policy.LMCF:
        return sorted(items, key=lambda t: (t.bytes, t.seq))
    if p is Policy.BMC:
        return _alternate(sorted(items, key=lambda t: (t.bytes, t.seq)))
    if p is Policy.SQTF:
        return sorted(items, key=_qt_key)
    return _alternate(sorted(items, key=_qt_key))  # BQT


def group_threshold(policy: Policy | str, total_bytes: int, bound_bytes: int) -> float:
    """GNNSched's ``gTH = ceil(SP / ceil(SP / MA))`` for SQTF/BQT; no soft threshold (∞) for the CoGNN policies."""
    p = parse_policy(policy)
    if p not in (Policy.SQTF, Policy.BQT) or bound_bytes <= 0 or total_bytes <= 0:
        return math.inf
    return math.ceil(total_bytes / math.ceil(total_bytes / bound_bytes))


def _take_group(
    order: Sequence[Task], start: int, bound: int, slots: int, threshold: float,
    allows: Callable[[Task, Sequence[Task]], bool] | None = None,
) -> int:
    """Length of the group starting at ``order[start]``: the longest run that keeps all three end rules (and the
    share rule ``allows(task, members so far)`` when given)."""
    total = 0
    n = 0
    for t in order[start:]:
        if n >= slots:
            break
        if n > 0 and total > threshold:  # the paper's balancing rule, tested before adding (as published)
            break
        if total + t.bytes > bound:  # the safety rule the published SQTF/BQT code lacks
            break
        if allows is not None and not allows(t, order[start:start + n]):
            break
        total += t.bytes
        n += 1
    return n


def form_groups(
    policy: Policy | str, tasks: Iterable[Task], bound_bytes: int, max_clients: int
) -> Grouping:
    """Split a whole queue into groups the papers' way (batch mode; used by the simulator and the tests).

    Every group has ``sum(bytes) <= bound_bytes`` and at most ``max_clients`` members; tasks larger than the bound are
    returned in ``oversize`` instead of being placed.
    """
    if max_clients < 1:
        raise ValueError(f"max_clients: must be >= 1, got {max_clients}")
    items = list(tasks)
    oversize = [t for t in items if t.bytes > bound_bytes]
    fits = [t for t in items if t.bytes <= bound_bytes]
    order = traversal(policy, fits)
    threshold = group_threshold(policy, sum(t.bytes for t in fits), bound_bytes)
    out = Grouping(oversize=sorted(oversize, key=lambda t: t.seq))
    i = 0
    while i < len(order):
        n = _take_group(order, i, bound_bytes, max_clients, threshold)
        if n == 0:  # cannot happen (every task fits alone), kept so a bad input can never loop forever
            raise AssertionError("empty group")
        out.groups.append(list(order[i : i + n]))
        i += n
    return out


def plan_admissions(
    policy: Policy | str, queue: Iterable[Task], gpus: Iterable[GPUFree], bypass_limit: int = 0
) -> list[Admission]:
    """One gate decision: which queued tasks start now, on which GPU, as groups.

    The queue's traversal order is fixed for the decision; GPUs in order of most free bytes (then lowest index) each
    take at most one group, bounded by that GPU's free bytes and free slots (and SQTF/BQT's threshold). With
    ``bypass_limit=0`` the group is the first group of what remains: a GPU that cannot take the next task in order is
    skipped, never given a later one, so admissions are a prefix of the policy's order. With ``bypass_limit > 0``
    a group may skip tasks that do not fit and take later ones, as long as no skipped task has been overtaken
    ``bypass_limit`` times (see ``plan_decision``, which also returns the new counts). No GPU's free bytes ever go
    negative. The next group on a GPU is formed at the next decision (an arrival or an exit), which is the papers'
    group iteration.
    """
    return plan_decision(policy, queue, gpus, bypass_limit).admissions


def plan_decision(
    policy: Policy | str, queue: Iterable[Task], gpus: Iterable[GPUFree], bypass_limit: int = 0, *,
    spread: bool = False, share_when_pays: bool = False, slowdown: SlowdownFn | None = None,
) -> Plan:
    """``plan_admissions`` plus the bypass counts the caller must keep for the next decision.

    ``spread`` (the gate's ``--spread``): on a node where more than one GPU has a free client slot, the decision is
    made in rounds of one task per GPU, the GPUs of each round least loaded first (soonest to be idle, then fewest
    running clients, then most free bytes: :func:`load_key`, which reads ``GPUFree.running``), with the policy's
    order, the same memory bound and backfill rule. So a task joins a busy GPU only when no GPU with room is idle,
    and a task joins a GPU that already received one in this decision only when every GPU with room got one first.
    Without it each GPU takes a whole group in turn, in order of most free bytes, and a burst on an idle node piles
    onto the first GPU while the others stay idle; a lone task went to the GPU with most free bytes even when it
    was busy and another was idle (both measured with ``bench/robustness.py``). A node with one usable GPU plans as
    without it.

    ``share_when_pays`` (the gate's ``--share-when-pays``): a task joins a GPU where clients run (or were admitted
    earlier in this decision) only when :func:`share_pays` predicts that finishes the work sooner than waiting for
    an idle GPU; otherwise it is treated as not fitting that GPU (it stays queued, the backfill rule counts the tasks
    that overtake it). It needs ``GPUFree.running``; tasks without a predicted runtime are admitted on memory alone.
    ``slowdown``: the slowdowns the share rule decides with (the cluster's learned ones,
    :meth:`gnnsched.colocation.learned.SlowdownBook.slowdown_fn`); None: the interference model's prior.

    Bounded-bypass backfill (``bypass_limit > 0``): each GPU scans what remains of the order; a task that does not
    fit the group's remaining room is skipped and stays queued, a later task that fits joins — overtaking every task
    skipped before it. A task may be overtaken only while its count (``Task.bypassed`` plus the overtakes so far in
    this decision) is below ``bypass_limit``; at the limit the scan stops there, as under the prefix rule. Counted per
    overtaking task, so the bound reads: at most ``bypass_limit`` tasks behind a task in the order start before it.
    """
    if isinstance(bypass_limit, bool) or not isinstance(bypass_limit, int) or bypass_limit < 0:
        raise ValueError(f"bypass_limit: must be an integer >= 0, got {bypass_limit!r}")
    p = parse_policy(policy)
    items = list(queue)
    if not items:
        return Plan([], {})
    gpus = list(gpus)
    apart = _any_apart(items, gpus)
    if spread and sum(1 for g in gpus if g.free_slots > 0) > 1:
        return _plan_spread(p, items, gpus, bypass_limit, share_when_pays, apart, slowdown)
    allows = _with_apart(_share_rule(p, items, gpus, slowdown) if share_when_pays else None, apart)
    return _plan_ordered(p, items, gpus, bypass_limit, ordered=False, allows=allows)


#: ``allows(task, gpu, members)``: may ``task`` join ``gpu`` beside ``members`` (this decision's group there so far)?
Allows = Callable[[Task, GPUFree, Sequence[Task]], bool]


def apart_allows(task: Task, gpu: GPUFree, members: Sequence[Task]) -> bool:
    """The apart rule (``gnnsched.attempts.fault_classes.must_stay_apart``): ``task`` may join ``gpu`` only when
    neither a client running there nor a member of this decision's group there is one of its undecided fault's peers. A
    task refused here is treated as one that does not fit the GPU: it stays queued (or goes to another GPU), and the
    backfill rule counts the tasks that overtake it. It needs ``GPUFree.running`` with the clients' jobs.

    The trust-domain rule (``gnnsched.trust.domain.may_join``) is checked here too, the same way: a task joins only
    a GPU whose clients and group members are all of its domain."""
    if not may_join(task.domain, [c.domain for c in gpu.running] + [m.domain for m in members]):
        return False
    for c in gpu.running:
        if must_stay_apart(task.job, task.apart, c.job, c.apart):
            return False
    return not any(must_stay_apart(task.job, task.apart, m.job, m.apart) for m in members)


def _any_apart(items: Sequence[Task], gpus: Sequence[GPUFree]) -> bool:
    """Whether the apart rule can refuse anything in this decision (a queued task or a running client has peers, or
    two of them are of trust domains that may not share)."""
    return (any(t.apart for t in items) or any(c.apart for g in gpus for c in g.running)
            or mixed([t.domain for t in items] + [c.domain for g in gpus for c in g.running]))


def _with_apart(allows: Allows | None, apart: bool) -> Allows | None:
    """``allows`` with the apart rule checked first (``apart``: the decision has peers to keep apart)."""
    if not apart:
        return allows
    if allows is None:
        return apart_allows
    inner = allows

    def both(t: Task, g: GPUFree, members: Sequence[Task]) -> bool:
        return apart_allows(t, g, members) and inner(t, g, members)

    return both


def _plan_ordered(p: Policy, items: list[Task], gpus: list[GPUFree], bypass_limit: int, *, ordered: bool,
                  allows: Allows | None, order: list[Task] | None = None) -> Plan:
    """One decision over ``gpus``, in the order given (``ordered``) or most free bytes first, with the share rule
    ``allows`` (None: memory alone). ``order``: ``items`` already in the policy's order (the spread rounds keep the
    decision's order, see :func:`_plan_rounds`); else :func:`traversal` of ``items``."""
    if len(items) == 1:
        # One queued task (the common decision on a busy node): every policy's order is that task, it joins the
        # first group it fits and no task is overtaken, so the plan is the task on the first GPU in the GPUs' order
        # (as given, or most free bytes, then lowest index) with a free slot and room for it -- what both plans
        # below compute, without their sort, threshold and bookkeeping.
        task = items[0]
        best = None
        for g in gpus:
            if g.free_slots > 0 and g.free_bytes >= task.bytes and (allows is None or allows(task, g, ())):
                if ordered:
                    best = g
                    break
                if (best is None or g.free_bytes > best.free_bytes
                        or (g.free_bytes == best.free_bytes and g.index < best.index)):
                    best = g
        return Plan([Admission(gpu_index=best.index, tasks=(task,))] if best is not None else [], {})
    smallest = min([t.bytes for t in items])
    if not any(g.free_slots > 0 and g.free_bytes >= smallest for g in gpus):
        return Plan([], {})  # nothing fits anywhere: skip the sort (the common case with a long queue on full GPUs)
    if order is None:
        order = traversal(p, items)
    in_order = gpus if ordered else sorted(gpus, key=lambda g: (-g.free_bytes, g.index))
    if bypass_limit == 0:
        return Plan(_plan_prefix(p, order, in_order, allows), {})
    return _plan_backfill(p, order, in_order, bypass_limit, allows)


def load_key(g: GPUFree) -> tuple[float, int, int, int]:
    """``spread``'s GPU order, least loaded first: the least work left (the sum of the running clients' predicted
    seconds left; 0 when idle or when every client is past its prediction), then fewest running clients, then most
    free bytes, then lowest index. Why the sum: under MPS the clients of a GPU share its SMs, so a newcomer is slowed
    by, and slows, every client it overlaps, for as long as each runs: the predicted client-seconds it overlaps are
    the sum, the least-work-left rule for servers that share their capacity. The earlier key, the soonest to be idle
    (the largest seconds left), ignored how many clients overlap: it kept sending short pods to a GPU that already ran
    ten short ones, because they all ended before the one long pod of the idle-looking GPU beside it (robustness grid,
    2x4 A100, load 1.5, Poisson, inference, seed 6: 1.061x the best baseline -> 1.025x; over 2,880 cells of seeds 0-9,
    5 cells above 1.02 -> 3, docs/simulator.md). Ordering by clients first left one cell of seeds 0-1 above 1.02."""
    return (g.work_left, len(g.running), -g.free_bytes, g.index)


def _plan_spread(p: Policy, items: list[Task], gpus: list[GPUFree], bypass_limit: int, share: bool,
                 apart: bool = False, slowdown: SlowdownFn | None = None) -> Plan:
    """``plan_decision(..., spread=True)``: rounds of one free slot per GPU, GPUs least loaded first
    (:func:`load_key`), the GPUs' free bytes, slots and running clients and the tasks' bypass counts carried from
    round to round (a task admitted in an earlier round counts as a client with its predicted runtime left); a GPU's
    admissions over the rounds are one group (one :class:`Admission` per GPU, tasks in the order they joined)."""
    if len(items) == 1:
        return _spread_one(p, items[0], gpus, share, apart, slowdown)
    return _plan_rounds(p, items, gpus, bypass_limit, share, apart, slowdown)


def _plan_rounds(p: Policy, items: list[Task], gpus: list[GPUFree], bypass_limit: int, share: bool,
                 apart: bool = False, slowdown: SlowdownFn | None = None) -> Plan:
    """``_plan_spread``'s rounds, for any queue (``_spread_one`` answers a queue of one task the same, faster).

    Every round takes the tasks left in the decision's order, the policy's traversal of the whole queue, not a
    traversal of what is left: BMC's and BQT's orders alternate small and large (short and long), so the traversal of
    a shorter queue is not the rest of the longer one's, and a later round put a task ahead of one that the decision's
    order (and the gate's bypass counts, ``Books.queue_order``) had behind it: a strict prefix overtook its head
    (found by a fuzzer of the gate's books: 3,000 random event sequences, every failure BMC or BQT under spread)."""
    full = traversal(p, items)
    by_key = {t.key: t for t in items}
    left = list(items)
    free = {g.index: g for g in gpus}
    groups: dict[int, list[Task]] = {}
    counts: dict[str, int] = {}
    while left:
        round_gpus = sorted((replace(g, free_slots=min(g.free_slots, 1)) for g in free.values()), key=load_key)
        allows = _with_apart(_share_rule(p, left, round_gpus, slowdown) if share else None, apart)
        keys = {t.key for t in left}
        plan = _plan_ordered(p, left, round_gpus, bypass_limit, ordered=True, allows=allows,
                             order=[by_key[t.key] for t in full if t.key in keys])
        if not plan.admissions:
            break
        plan = Plan(_longest_on_least_loaded(plan.admissions, round_gpus, allows), plan.bypassed)
        for key, count in plan.bypassed.items():
            counts[key] = count
            by_key[key] = replace(by_key[key], bypassed=count)
        taken: set[str] = set()
        for a in plan.admissions:
            g = free[a.gpu_index]
            free[a.gpu_index] = replace(g, free_bytes=g.free_bytes - a.bytes, free_slots=g.free_slots - len(a.tasks),
                                        running=g.running + tuple(_as_client(t) for t in a.tasks))
            groups.setdefault(a.gpu_index, []).extend(a.tasks)
            taken.update(t.key for t in a.tasks)
        left = [by_key[t.key] for t in left if t.key not in taken]
    admitted = {t.key for tasks in groups.values() for t in tasks}
    out = [Admission(gpu_index=i, tasks=tuple(tasks)) for i, tasks in groups.items()]
    return Plan(out, {k: c for k, c in counts.items() if k not in admitted})


def _spread_one(p: Policy, task: Task, gpus: list[GPUFree], share: bool, apart: bool = False,
                slowdown: SlowdownFn | None = None) -> Plan:
    """``_plan_spread`` for a queue of one task (the common decision on a busy node): the task goes to the least
    loaded GPU (:func:`load_key`) with a free slot, room for its bytes and, under ``share``, the share rule's
    consent; no task is overtaken. That is what the rounds compute for one task (their first round admits it there
    or nothing, and a one-task round is not re-paired), without copying every GPU for the round and sorting them
    all: the gate and the simulator make this decision once per arrival and per exit."""
    fits = [g for g in gpus if g.free_slots > 0 and g.free_bytes >= task.bytes
            and (not apart or apart_allows(task, g, ()))]
    if not fits:
        return Plan([], {})
    if not share:
        return Plan([Admission(gpu_index=min(fits, key=load_key).index, tasks=(task,))], {})
    # reads the GPUs' capacity and busy seconds: not the round's slot cap
    allows = _share_rule(p, [task], gpus, slowdown)
    for g in sorted(fits, key=load_key):
        if allows(task, g, ()):
            return Plan([Admission(gpu_index=g.index, tasks=(task,))], {})
    return Plan([], {})


def _longest_on_least_loaded(round_adm: list[Admission], round_gpus: list[GPUFree], allows: Allows | None
                             ) -> list[Admission]:
    """One spread round's tasks re-paired with its GPUs: the longest predicted task on the least loaded GPU, where
    it fits (and the share rule allows it). Why: the round takes its tasks in the policy's order (SQTF: shortest
    first), so without this the longest task of a round landed on the busiest GPU while the short ones took the idle
    GPUs, and co-location costs a task ``R * (s - 1)``, most for the longest (robustness grid, 2x4 A100 bursts).
    The round's set of tasks and GPUs is unchanged; the pairing falls back to the policy's when memory does not
    allow a full re-pairing."""
    if len(round_adm) < 2:
        return round_adm
    rank = {g.index: i for i, g in enumerate(round_gpus)}
    gpus = sorted((g for g in round_gpus if g.index in {a.gpu_index for a in round_adm}), key=lambda g: rank[g.index])
    tasks = sorted((t for a in round_adm for t in a.tasks), key=lambda t: (-_solo(t), t.seq))
    out: list[Admission] = []
    free = list(gpus)
    for t in tasks:
        g = next((g for g in free if g.free_bytes >= t.bytes and (allows is None or allows(t, g, ()))), None)
        if g is None:
            return round_adm
        free.remove(g)
        out.append(Admission(gpu_index=g.index, tasks=(t,)))
    return out


# --- sharing only when it pays ------------------------------------------------------------------------------------


STARTUP_SECONDS = 4.4
"""The process start-up the gate assumes a pod pays between its admission and its first GPU step when not prestarted:
the interpreter with torch and PyG imported, measured as ``python -c "import torch, torch_geometric"`` (the simulator's
``costs.STARTUP_S``, the same figure). ``node-agent --startup-seconds`` (chart ``node.agent.startupSeconds``) sets the
figure for an image that starts slower (a large graph to load)."""


def startup_left(startup_seconds: float, queued_at: float | None, admitted_at: float, prestarted: bool) -> float:
    """The start-up a client still has ahead of it when the gate admits it: all of ``startup_seconds`` behind the
    plain gate, which starts the workload at admission; behind ``gate --prestart`` (``prestarted``), only what its
    time at the gate since ``queued_at`` (when its container connected) did not cover.

    Why the gate needs it: a client's GPU work starts only after its start-up, so its predicted end is its admission
    plus its start-up left plus its predicted runtime. Without the start-up a pod admitted a moment ago with a short
    prediction looked as good as finished, and the spread rule sent the next short pods to its GPU, one after
    another, while that pod and they were all still starting (robustness grid, docs/simulator.md)."""
    if not prestarted or queued_at is None:
        return startup_seconds
    return max(0.0, startup_seconds - max(0.0, admitted_at - queued_at))


def predicted_end(qt_seconds: float | None, admitted_at: float | None) -> float | None:
    """When a running client is predicted to end: ``admitted_at`` (its admission, plus the start-up it had left then,
    :func:`startup_left`, where the caller knows it) plus its predicted solo runtime; None without a usable
    prediction. Fixed for the client's life, so a caller that decides often (the simulator) keeps it per
    client and derives :func:`remaining_seconds` from it at each decision instead of re-checking the prediction."""
    if qt_seconds is None or admitted_at is None or not qt_seconds >= 0 or math.isinf(qt_seconds):
        return None
    return admitted_at + qt_seconds


def remaining_seconds(qt_seconds: float | None, admitted_at: float | None, now: float,
                      progress: StepProgress | None = None) -> float:
    """A running client's seconds left: what the gate knows. From its reported ``progress`` once that measures its
    pace (:func:`gnnsched.progress.seconds_left`), else its predicted solo runtime from its admission, at least 0 (0
    also without a prediction). The simulator computes it the same way, not from its true work."""
    return seconds_left(predicted_end(qt_seconds, admitted_at), now, progress)


def _solo(t: Task) -> float:
    qt = t.qt_seconds
    return 0.0 if qt is None or not qt >= 0 or math.isinf(qt) else qt


def _as_client(t: Task) -> Client:
    return Client(t.intensity, _solo(t), t.job, t.apart, t.domain)


_CLASSES = ("memory", "compute")


def _counts(kinds: Iterable[str | None]) -> tuple[int, int, int]:
    n = [0, 0, 0]
    for k in kinds:
        n[_CLASSES.index(k) if k in _CLASSES else 2] += 1
    return (n[0], n[1], n[2])


@lru_cache(maxsize=4096)
def _slowdown(intensity: str | None, others: tuple[int, int, int]) -> float:
    """The interference model's slowdown of a client of class ``intensity`` beside ``others`` (counts of memory,
    compute and unknown-class co-runners): a pure function of its arguments, memoised."""
    model = load_default()
    profiles = [model.profile_for(k) for k, n in zip((*_CLASSES, None), others, strict=True) for _ in range(n)]
    return model.slowdown(model.profile_for(intensity), profiles)


#: ``(intensity, (memory, compute, unknown) co-runner counts) -> slowdown`` (gnnsched.colocation.learned.SlowdownFn)
SlowdownFn = Callable[[str | None, tuple[int, int, int]], float]


def share_pays(task: Task, clients: Sequence[Client], wait_seconds: float, slowdown: SlowdownFn | None = None
               ) -> bool:
    """Whether ``task`` joining a GPU where ``clients`` run is predicted to finish the work sooner than waiting
    ``wait_seconds`` for an idle GPU and running alone there.

    Why: the gate used to admit on memory alone, so a long job joined a busy GPU whenever its bytes fitted, and the
    group's slowdown (the interference model) could cost more than waiting for a GPU that frees soon: the
    robustness grid's large training bursts, where ``exclusive`` won. Joining slows the task by ``s`` (its
    slowdown beside the clients) only while they run: for ``D = min(T, R * s)`` seconds (``R`` its predicted solo
    runtime, ``T`` the longest client's seconds left), so it costs ``D * (1 - 1 / s)``, ``R * (s - 1)`` when the
    clients outlast it; and each client, for the seconds it overlaps the task, the share of its progress the
    task's arrival takes (``1 - s_before / s_after``). Waiting costs the task ``wait_seconds``. The rule once
    charged ``R * (s - 1)`` whatever the clients' seconds left, so a long task refused to join a GPU whose client
    ended in seconds: ``+pays`` had 24 of the grid's 2,880 cells above 1.02x the best baseline; with the overlap,
    2, the default's two (docs/simulator.md). Joining pays when its cost is no larger. For inference with a latency
    target (``Task.qos_seconds``) the target decides first: a join that would miss it while waiting would meet it
    is refused, a join that meets it where waiting would not is taken. A task without a predicted runtime, or a GPU
    with no clients, is decided on memory alone, as before. ``slowdown``: the learned slowdowns (issue 37; a class
    pair observed at 2x where the model says 1.2x stops joining once sharing no longer pays); None: the model's.
    """
    slow = _slowdown if slowdown is None else slowdown
    r = task.qt_seconds
    if not clients or r is None or not r > 0 or math.isinf(r):
        return True
    kinds = [c.intensity for c in clients]
    s = slow(task.intensity, _counts(kinds))
    busy = max(c.remaining_seconds for c in clients)
    finish = r + min(busy, r * s) * (1.0 - 1.0 / s)
    qos = task.qos_seconds
    if qos is not None and qos > 0:
        if finish > qos >= wait_seconds + r:
            return False
        if finish <= qos < wait_seconds + r:
            return True
    extra = finish - r
    for i, c in enumerate(clients):
        others = kinds[:i] + kinds[i + 1:]
        before = slow(c.intensity, _counts(others))
        after = slow(c.intensity, _counts([*others, task.intensity]))
        extra += min(c.remaining_seconds, finish) * (1.0 - before / after)
    return extra <= wait_seconds


def _share_rule(p: Policy, queue: Sequence[Task], gpus: Sequence[GPUFree], slowdown: SlowdownFn | None = None
                ) -> Allows:
    """The ``allows`` of one decision under ``share_when_pays``: :func:`share_pays` against the GPU's running
    clients plus this decision's group there. The wait for running alone is the queue's: the first of ``gpus``
    large enough for the task to become idle (0 when one is idle), plus the predicted solo seconds of the tasks
    ahead of it in the policy's order shared over those GPUs (they would wait for the same GPUs first). Without the
    queue's share a burst of short jobs on a busy node each saw the wait of the first and ran one after another."""
    ahead: dict[str, float] = {}
    total = 0.0
    for t in traversal(p, queue):
        ahead[t.key] = total
        total += _solo(t)

    def allows(t: Task, g: GPUFree, members: Sequence[Task]) -> bool:
        clients = g.running + tuple(_as_client(m) for m in members)
        if not clients:
            return True
        fit = [h.busy_seconds for h in gpus if h.capacity_bytes >= t.bytes]
        wait = min(fit, default=0.0) + ahead.get(t.key, 0.0) / max(1, len(fit))
        return share_pays(t, clients, wait, slowdown)

    return allows


def _allows_on(allows: Allows, g: GPUFree, t: Task, members: Sequence[Task]) -> bool:
    return allows(t, g, members)


def _plan_prefix(p: Policy, order: list[Task], gpus: list[GPUFree], allows: Allows | None = None) -> list[Admission]:
    """The strict-prefix rule: each GPU (in the order given) takes the first group of the remaining order or
    nothing."""
    remaining_bytes = sum(t.bytes for t in order)
    out: list[Admission] = []
    i = 0
    for g in gpus:
        if i >= len(order):
            break
        if g.free_slots <= 0 or g.free_bytes < order[i].bytes:
            continue
        threshold = group_threshold(p, remaining_bytes, g.capacity_bytes)
        n = _take_group(order, i, g.free_bytes, g.free_slots, threshold, None if allows is None else partial(
            _allows_on, allows, g))
        if n == 0:
            continue
        group = tuple(order[i : i + n])
        remaining_bytes -= sum(t.bytes for t in group)
        out.append(Admission(gpu_index=g.index, tasks=group))
        i += n
    return out


def _plan_backfill(p: Policy, order: list[Task], gpus: list[GPUFree], limit: int, allows: Allows | None = None
                   ) -> Plan:
    """Bounded-bypass backfill over ``order`` (see ``plan_decision``), the GPUs in the order given; a task the share
    rule ``allows`` refuses on a GPU is skipped there as one that does not fit.

    ``budget(j)``: how many more overtakers task ``j`` accepts in this decision (``limit - bypassed - spent[j]``, kept
    only for the tasks some scan skipped, so a long queue costs little beyond its sort). Within one GPU's scan every
    skipped task is overtaken by each later joiner, so the scan keeps ``low`` = min over the skipped of (budget at skip
    time
    + joiners at skip time); the tightest remaining budget is ``low - joiners`` and the scan stops when it reaches 0.
    A task skipped on one GPU may still join on another later in the same decision (then it was not overtaken at
    all: the final counts are recomputed from the admitted positions, so they never exceed what was budgeted).
    """
    n = len(order)
    taken = [False] * n
    spent: dict[int, int] = {}  # overtakes charged so far in this decision, per skipped position
    # suffix minimum of the sizes (taken tasks included: still a lower bound), so a scan stops as soon as nothing
    # further down the order can fit the room left, instead of walking the whole queue on every GPU
    floor: list[float] = [0.0] * n
    m = math.inf
    for j in range(n - 1, -1, -1):
        b = order[j].bytes
        if b < m:
            m = b
        floor[j] = m
    remaining_bytes = sum([t.bytes for t in order])
    balanced = p in (Policy.SQTF, Policy.BQT)  # the only policies with a soft threshold (group_threshold)
    out: list[Admission] = []
    first = 0
    for g in gpus:
        while first < n and taken[first]:
            first += 1
        if first >= n:
            break
        if g.free_slots <= 0 or g.free_bytes < floor[first]:
            continue
        threshold = group_threshold(p, remaining_bytes, g.capacity_bytes) if balanced else math.inf
        members: list[int] = []
        total = 0
        skipped: list[tuple[int, int]] = []
        low = math.inf
        for j in range(first, n):
            if taken[j]:
                continue
            if len(members) >= g.free_slots or (members and total > threshold):
                break
            if total + floor[j] > g.free_bytes:
                break  # no task from here on fits the room left
            t = order[j]
            if total + t.bytes > g.free_bytes or (  # the safety rule (or the share rule): t stays queued
                    allows is not None and not allows(t, g, [order[m] for m in members])):
                joined = len(members)
                skipped.append((j, joined))
                low = min(low, max(0, limit - t.bypassed - spent.get(j, 0)) + joined)
            else:
                members.append(j)
                total += t.bytes
            if low - len(members) <= 0:
                break  # a skipped task has been overtaken as often as allowed: nothing more may pass it
        for s, joined in skipped:
            spent[s] = spent.get(s, 0) + len(members) - joined
        if not members:
            continue
        for j in members:
            taken[j] = True
        group = tuple(order[j] for j in members)
        remaining_bytes -= total
        out.append(Admission(gpu_index=g.index, tasks=group))
    bypassed: dict[str, int] = {}
    if out:
        later = sum(len(a.tasks) for a in out)  # admitted tasks after position j in the order
        j = 0
        while later:  # only positions before the last admitted one can have been overtaken
            if taken[j]:
                later -= 1
            else:
                t = order[j]
                bypassed[t.key] = t.bypassed + later
            j += 1
    return Plan(out, bypassed)


# --- the gate invariant -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GPUBooks:
    """What a gate has committed on one GPU, for the invariant check."""

    index: int
    total_bytes: int
    reserve_bytes: int
    committed: tuple[int, ...]  # admit-bytes of every running client on this GPU
    max_clients: int


class GateInvariantError(AssertionError):
    """The books broke ``sum(admit-bytes) <= total - reserve`` or the client cap on some GPU."""


def invariant_violations(gpus: Iterable[GPUBooks]) -> list[str]:
    """Every way the books break the gate invariant (empty list: they hold). Human-readable, one line each."""
    out: list[str] = []
    for g in gpus:
        cap = g.total_bytes - g.reserve_bytes
        used = sum(g.committed)
        if any(b < 0 for b in g.committed):
            out.append(f"gpu {g.index}: negative admit-bytes in {list(g.committed)}")
        if used > cap:
            out.append(
                f"gpu {g.index}: committed {used} B > total {g.total_bytes} - reserve {g.reserve_bytes} = {cap} B"
            )
        if len(g.committed) > g.max_clients:
            out.append(f"gpu {g.index}: {len(g.committed)} clients > max {g.max_clients}")
    return out


def check_gate_invariant(gpus: Iterable[GPUBooks]) -> None:
    """Raise ``GateInvariantError`` listing every violation; return quietly when the books are safe."""
    bad = invariant_violations(gpus)
    if bad:
        raise GateInvariantError("; ".join(bad))


# --- the published SQTF/BQT, for comparison only ------------------------------------------------------------------
#
# GNNSched's Algorithms 1 and 2 as printed (seed 000, section 3.4): the group counter advances when the group's PMC
# *already* exceeds gTH, tested before a task is appended, so the task that crosses gTH still joins and a group can
# reach gTH + PMC > MA: nothing bounds it by the GPU. The paper's system also submits its groups one after another
# ("when the number of 'done' signals equals the group size, the scheduler iterates to the next group", section
# 3.5), so a GPU takes its next group only when the previous one has finished. The simulator runs these as the
# baselines ``sqtf-paper`` / ``bqt-paper`` so that gnnsched's policies are measured against the paper's own
# algorithm; gnnsched never uses them (they break the gate invariant by design).

PAPER_POLICIES = (Policy.SQTF, Policy.BQT)


def _take_group_paper(order: Sequence[Task], start: int, slots: int, threshold: float) -> int:
    """Length of the published algorithm's group starting at ``order[start]`` (no memory bound; MPS client cap)."""
    total = 0
    n = 0
    for t in order[start:]:
        if n >= slots:
            break
        if n > 0 and total > threshold:  # lines 6-9 / 10-13: advance when gPMC > gTH, before appending
            break
        total += t.bytes
        n += 1
    return n


def form_groups_paper(policy: Policy | str, tasks: Iterable[Task], bound_bytes: int,
                      max_clients: int | None = None) -> list[list[Task]]:
    """The published SQTF/BQT grouping of a whole batch (``MA`` = ``bound_bytes``); groups may exceed ``MA``."""
    p = parse_policy(policy)
    if p not in PAPER_POLICIES:
        raise ValueError(f"policy: the published algorithm exists for sqtf and bqt only, not {p.value}")
    order = traversal(p, tasks)
    threshold = group_threshold(p, sum(t.bytes for t in order), bound_bytes)
    slots = max_clients if max_clients is not None else len(order) or 1
    groups: list[list[Task]] = []
    i = 0
    while i < len(order):
        n = _take_group_paper(order, i, slots, threshold)
        groups.append(list(order[i : i + n]))
        i += n
    return groups


def plan_admissions_paper(
    policy: Policy | str, queue: Iterable[Task], gpus: Iterable[GPUFree], busy: Iterable[int] = ()
) -> list[Admission]:
    """One decision of the published system: every idle GPU (not in ``busy``) takes the next group of the
    published SQTF/BQT over the whole queue (``SP`` = the queue's bytes, ``MA`` = the GPU's capacity), with no
    memory bound; a busy GPU waits for its group to finish. Only the MPS client cap (``free_slots``) is kept."""
    p = parse_policy(policy)
    if p not in PAPER_POLICIES:
        raise ValueError(f"policy: the published algorithm exists for sqtf and bqt only, not {p.value}")
    order = traversal(p, queue)
    busy_set = set(busy)
    remaining = sum(t.bytes for t in order)
    out: list[Admission] = []
    i = 0
    for g in sorted(gpus, key=lambda g: (-g.free_bytes, g.index)):
        if i >= len(order):
            break
        if g.index in busy_set or g.free_slots <= 0:
            continue
        threshold = group_threshold(p, remaining, g.capacity_bytes)
        n = _take_group_paper(order, i, g.free_slots, threshold)
        group = tuple(order[i : i + n])
        remaining -= sum(t.bytes for t in group)
        out.append(Admission(gpu_index=g.index, tasks=group))
        i += n
    return out
