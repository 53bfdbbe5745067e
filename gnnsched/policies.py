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
So admissions are always a prefix of the policy's order: nothing overtakes a task the policy puts first (no
starvation of large jobs), and a GPU with memory free admits its next group at the next decision (an arrival or an
exit) without waiting for its whole running group to finish.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum


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
    QT is twice it, so the order is the same; unknown runtimes sort last.
    """

    key: str
    bytes: int
    seq: int
    qt_seconds: float | None = None
    intensity: str | None = None


@dataclass(frozen=True, slots=True)
class GPUFree:
    """What one GPU can take right now: free bytes (capacity − committed) and free MPS client slots."""

    index: int
    free_bytes: int
    free_slots: int
    capacity_bytes: int


@dataclass(frozen=True, slots=True)
class Admission:
    """One group admitted onto one GPU by a decision."""

    gpu_index: int
    tasks: tuple[Task, ...]

    @property
    def bytes(self) -> int:
        return sum(t.bytes for t in self.tasks)


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
    order: Sequence[Task], start: int, bound: int, slots: int, threshold: float
) -> int:
    """Length of the group starting at ``order[start]``: the longest run that keeps all three end rules."""
    total = 0
    n = 0
    for t in order[start:]:
        if n >= slots:
            break
        if n > 0 and total > threshold:  # the paper's balancing rule, tested before adding (as published)
            break
        if total + t.bytes > bound:  # the safety rule the published SQTF/BQT code lacks
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
    policy: Policy | str, queue: Iterable[Task], gpus: Iterable[GPUFree]
) -> list[Admission]:
    """One gate decision: which queued tasks start now, on which GPU, as groups.

    The queue's traversal order is fixed for the decision; GPUs in order of most free bytes (then lowest index) each
    take at most one group: the first group of what remains, bounded by that GPU's free bytes and free slots (and
    SQTF/BQT's threshold). A GPU that cannot take the next task in order is skipped, never given a later one.
    Admissions are therefore a prefix of the policy's order, and no GPU's free bytes go negative. The next group on
    a GPU is formed at the next decision (an arrival or an exit), which is the papers' group iteration.
    """
    p = parse_policy(policy)
    items = list(queue)
    if not items:
        return []
    gpus = list(gpus)
    smallest = min(t.bytes for t in items)
    if not any(g.free_slots > 0 and g.free_bytes >= smallest for g in gpus):
        return []  # nothing fits anywhere: skip the sort (the common case with a long queue on full GPUs)
    order = traversal(p, items)
    remaining_bytes = sum(t.bytes for t in order)
    out: list[Admission] = []
    i = 0
    for g in sorted(gpus, key=lambda g: (-g.free_bytes, g.index)):
        if i >= len(order):
            break
        if g.free_slots <= 0 or g.free_bytes < order[i].bytes:
            continue
        threshold = group_threshold(p, remaining_bytes, g.capacity_bytes)
        n = _take_group(order, i, g.free_bytes, g.free_slots, threshold)
        group = tuple(order[i : i + n])
        remaining_bytes -= sum(t.bytes for t in group)
        out.append(Admission(gpu_index=g.index, tasks=group))
        i += n
    return out


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
            out.append(f"gpu {g.index}: committed {used} B > total {g.total_bytes} - reserve {g.reserve_bytes} = {cap} B")
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
