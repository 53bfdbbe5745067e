"""Placement math shared by the scheduler extender and the simulator: filter, cost, fragmentation, score.

Why a core module: the extender (a component) runs these decisions in a cluster, and the simulator (core) must
measure exactly those decisions, but the core may not import a component. So the arithmetic lives here, as pure
functions over numpy arrays; the extender keeps only its own concerns (locking, reservations, user-facing reasons,
reading Kubernetes objects) and the simulator only its books.

**State layout.** A :class:`PlacementState` is a dict of arrays in GPU-slot-major layout ``(gpus, rows)`` (one row
per node, one slot per GPU of the node; ``(END_SLOTS, gpus, rows)`` for running jobs' ends), so the per-node
reductions of the hot path (min/any over a node's GPUs) run over contiguous rows of nodes, which numpy does an order
of magnitude faster than a reduction along a short last axis. ``new_state`` allocates it, ``clear_row``/``set_gpu``/
``set_host`` write one node's raw figures and ``derive`` computes the pod-independent per-GPU figures the hot path
starts from. Unused slots and rows are never usable (``capu = -1``, ``known = False``).

**Filter.** A node passes when its status is known, one of its GPUs is usable (healthy, fewer MPS clients than its
limit) with capacity (total − reserve) ≥ the pod's admit bytes — *ever* fits, not fits now: the node agent's gate
queues the pod until memory frees — and its unclaimed CPU and memory cover the pod's requests.

**Cost** of placing a pod (``b`` admit bytes, solo runtime ``R``) on GPU ``g``: predicted completion time relative
to the solo runtime, plus a fragmentation term::

    cost(g) = (wait(g) + R * slowdown(g)) / R  +  W_FRAG * dF(g) / capacity(g)
    score(node) = round(10 * min_over_candidates(cost) / min_g cost(g))        (0..10, best node = 10)

* ``wait(g)``: 0 when ``free(g) >= b + queued(g)``; otherwise the predicted end of the running job whose
  completion frees enough memory (running jobs sorted by predicted end, cumulative freed bytes); if even an
  empty GPU must first serve its queue, the last end plus the queue's predicted seconds.
* ``slowdown(g)``: the InSS-style interference model (``gnnsched.colocation.interference``) against the sum of the
  profiles of the jobs already running (or reserved) on the GPU; memory-bound next to memory-bound costs most.
  Times the *learned* factor of the pod's class beside the classes running there, where the node agent has learned
  one (``learned``: observed ÷ the model's prior, ``gnnsched.colocation.learned``; 1 until calibrated), so a class
  pair that proves slower than the model says costs what it was observed to cost.
  With interference-aware scoring off (the simulator's ``-interference`` policies) it is 1 everywhere.
* ``dF(g)``: FGD-style fragmentation (ATC'23): with ``S`` the sizes of the jobs the cluster runs
  (``SIZE_QUANTILES`` quantiles), ``F(f) = f * P(s > f)`` is the free memory a typical job cannot use;
  ``dF = F(free - b) - F(free)`` when the pod fits now (0 otherwise). Negative when the placement uses up a
  fragment no typical job fits in.
* Weights: completion time weight 1 (it is the objective), ``W_FRAG = 0.5``: a placement that leaves a whole
  GPU's worth of unusable fragment costs as much as half the job's runtime in extra waiting.

**Fault peers** (the apart rule, ``gnnsched.attempts.fault_classes.must_stay_apart``; docs/faults.md). A pod whose job
must stay apart from a client of a GPU (an undecided MPS fault's peers, either side's list) cannot run on that GPU while
that client does: the node agent's gate would keep it queued there. :func:`apart_blocked` finds those GPUs,
:func:`apart_filter` and :func:`apart_costs` / :func:`apart_ranked` turn them into the filter's and the score's
decision. A node none of whose GPUs that can hold the pod is free of its peers fails the filter only when another
candidate has such a GPU (a filtered node is one kube-scheduler never binds, and with none left the pod would be
unschedulable, though peers finish); when every candidate is blocked, they all pass and rank by their cost plus the wait
until the peers are predicted to leave. """

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

import numpy as np

from gnnsched.attempts.fault_classes import must_stay_apart
from gnnsched.trust.domain import may_share

#: Weight of the fragmentation term (see module docstring).
W_FRAG = 0.5
#: Running jobs per GPU tracked individually for the wait computation; later-ending ones are merged into the
#: last slot (their bytes are freed at the latest of their ends: a conservative wait).
END_SLOTS = 4
#: Quantiles of the cluster's job sizes used by the fragmentation term.
SIZE_QUANTILES = 8
#: Grid of the fragmentation term's lookup table (bytes).
FRAG_BIN = float(2**20)
#: Intensity classes the slowdown arrays are kept for (``none``: unknown class, the median profile).
PROFILE_KEYS = ("memory", "compute", "none")

PlacementState = dict[str, np.ndarray]

_G2_KEYS = ("cap", "used", "qbytes", "qsecs", "sum_sm", "sum_mem", "last_end", "free")


def new_state(rows: int, gpus: int, old: PlacementState | None = None, old_rows: int = 0) -> PlacementState:
    """Arrays for ``rows`` nodes of up to ``gpus`` GPUs; the first ``old_rows`` rows of ``old`` are kept."""
    k = END_SLOTS
    g2 = (gpus, rows)
    a: PlacementState = {
        "cap": np.zeros(g2),
        "used": np.zeros(g2),
        "healthy": np.zeros(g2, dtype=bool),
        "valid": np.zeros(g2, dtype=bool),
        "clients": np.zeros(g2, dtype=np.int32),
        "max_clients": np.zeros(g2, dtype=np.int32),
        "qbytes": np.zeros(g2),
        "qsecs": np.zeros(g2),
        "sum_sm": np.zeros(g2),
        "sum_mem": np.zeros(g2),
        "ends": np.full((k, gpus, rows), np.inf),
        "freed": np.zeros((k, gpus, rows)),
        "last_end": np.zeros(g2),
        # derived per GPU, pod-independent (see derive): -inf / -1 where the GPU cannot take any pod
        "avail": np.full(g2, -np.inf),  # free - queued bytes
        "capu": np.full(g2, -1.0),  # capacity
        "free": np.zeros(g2),
        # score-only terms in float32: half the memory traffic of the hot path; feasibility stays float64
        "free32": np.zeros(g2, dtype=np.float32),
        "frag0": np.zeros(g2, dtype=np.float32),  # F(free)
        "fscale": np.zeros(g2, dtype=np.float32),  # W_FRAG / capacity
        **{f"slow_{p}": np.ones(g2, dtype=np.float32) for p in PROFILE_KEYS},
        # learned co-location factors (observed / prior) of each class beside the GPU's running classes (raw)
        **{f"learn_{p}": np.ones(g2) for p in PROFILE_KEYS},
        "known": np.zeros(rows, dtype=bool),
        "cpu_free": np.full(rows, np.inf),
        "mem_free": np.full(rows, np.inf),
    }
    if old is not None:
        n = min(old_rows, rows)
        for key, arr in a.items():
            src = old[key]
            if arr.ndim == 1:
                arr[:n] = src[:n]
            elif arr.ndim == 2:
                g = min(src.shape[0], gpus)
                arr[:g, :n] = src[:g, :n]
            else:
                g = min(src.shape[1], gpus)
                arr[:, :g, :n] = src[:, :g, :n]
    return a


def clear_row(a: PlacementState, r: int, known: bool) -> None:
    """Reset node row ``r`` to "no GPU" before its GPUs are written again."""
    for key in ("cap", "used", "qbytes", "qsecs", "sum_sm", "sum_mem", "last_end"):
        a[key][:, r] = 0
    a["freed"][:, :, r] = 0
    a["healthy"][:, r] = False
    a["valid"][:, r] = False
    a["clients"][:, r] = 0
    a["max_clients"][:, r] = 0
    a["ends"][:, :, r] = np.inf
    for key in _LEARN_KEYS:
        a[key][:, r] = 1.0
    a["known"][r] = known


def set_host(a: PlacementState, r: int, cpu_free: float, mem_free: float) -> None:
    """Unclaimed CPU (millicores) and memory (bytes) of node row ``r``; ``inf`` = not checked."""
    a["cpu_free"][r] = cpu_free
    a["mem_free"][r] = mem_free


def set_gpu(
    a: PlacementState, slot: int, r: int, *, capacity: float, used: float, healthy: bool, clients: int,
    max_clients: int, qbytes: float, qsecs: float, running: Sequence[tuple[float, float, float, float]],
    learned: Sequence[float] = (1.0, 1.0, 1.0),
) -> None:
    """One GPU's raw figures. ``running``: ``(predicted end, bytes, sm_util, mem_util)`` of each job running (or
    reserved to run now) on it; ``used``/``qbytes``/``qsecs``: committed bytes, queued bytes and queued predicted
    seconds; ``capacity``: total − reserve; ``learned``: the learned factor of each class of :data:`PROFILE_KEYS`
    beside the classes running there (:func:`learned_factors`)."""
    for key, factor in zip(_LEARN_KEYS, learned, strict=True):
        a[key][slot, r] = factor
    a["valid"][slot, r] = True
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
    # Built in lists and written once per array (the later-ending jobs all land in the last slot: the last write
    # there wins, as it did element by element).
    ends = [np.inf] * END_SLOTS
    freed = [0.0] * END_SLOTS
    cum = 0.0
    for k, job in enumerate(ordered):
        cum += job[1]
        kk = min(k, END_SLOTS - 1)
        ends[kk] = job[0]
        freed[kk] = cum
    a["ends"][:, slot, r] = ends
    a["freed"][:, slot, r] = freed
    a["last_end"][slot, r] = ordered[-1][0] if ordered else 0.0


def size_table(sizes: Iterable[float]) -> np.ndarray:
    """``above[i] = P(s > i MiB)`` over ``SIZE_QUANTILES`` quantiles of the job sizes ``sizes`` (the lookup table
    of :func:`frag`); ``[0]`` when there are no jobs (the fragmentation term is then off, see :func:`cost_matrix`)."""
    arr = np.asarray(sizes if isinstance(sizes, np.ndarray) else list(sizes), dtype=np.float64)
    if not arr.size:
        return np.zeros(1, dtype=np.float32)
    qs = (np.arange(SIZE_QUANTILES) + 0.5) / SIZE_QUANTILES
    quantiles = np.sort(np.quantile(arr, qs))
    grid = np.arange(int(quantiles.max() // FRAG_BIN) + 2) * FRAG_BIN
    return (grid[:, None] < quantiles[None, :]).mean(axis=1).astype(np.float32)


_ZERO32 = np.float32(0.0)
_ONE32 = np.float32(1.0)
_INF32 = np.float32(np.inf)
_INV_BIN32 = np.float32(1.0 / FRAG_BIN)


def _frag_owned(free: np.ndarray, above: np.ndarray) -> np.ndarray:
    """:func:`frag` of a float32 temporary the caller owns and no longer needs (it is overwritten with
    ``max(free, 0)``): the same operations on the same values, minus one allocation and with the scalars made once
    (numpy's per-call overhead is most of the hot path's cost on a few hundred GPUs); ``take`` is the fancy index
    ``above[i]`` for in-range indices."""
    f = np.maximum(free, _ZERO32, out=free)
    scaled = f * _INV_BIN32
    np.minimum(scaled, np.float32(len(above) - 1), out=scaled)
    out = above.take(scaled.astype(np.int32))
    out *= f
    return out


def frag(free: np.ndarray, above: np.ndarray) -> np.ndarray:
    """``F(f) = f * P(s > f)``: free bytes a job drawn from the size mix cannot use.

    ``above[i] = P(s > i MiB)`` (a table built with the size mix): one multiply, one cast and one lookup per GPU
    instead of a comparison per size quantile. ``f`` is rounded down to whole MiB for the lookup only.

    The index is clamped to the table while still a float (``len(above) - 1`` is exact in float32) and then cast to
    int32: the same indices as casting to int64 first and clamping after, at half the memory traffic of the cast,
    the clamp and the gather (the lookup is the hot path's most expensive step)."""
    f = np.maximum(free, np.float32(0.0))
    scaled = f * np.float32(1.0 / FRAG_BIN)
    np.minimum(scaled, np.float32(len(above) - 1), out=scaled)
    out = above[scaled.astype(np.int32)]
    out *= f
    return out


def derive(a: PlacementState, rows: slice | np.ndarray, above: np.ndarray, interference: Any) -> None:
    """Pod-independent per-GPU figures for the node rows ``rows`` (a slice or an index array): usable capacity, free
    and available bytes, ``F(free)`` and the interference slowdown a job of each intensity class would suffer there.

    One row (the common case: a cache refreshes the node that just changed) goes through :func:`_derive_row`, which
    computes the same numbers with Python scalars instead of ~35 numpy calls on arrays of a node's few GPUs."""
    if isinstance(rows, slice) and rows.step in (None, 1) and rows.start is not None and rows.stop is not None \
            and rows.stop - rows.start == 1 and 0 <= rows.start < len(a["known"]):
        _derive_row(a, rows.start, above, interference)
        return
    derive_arrays(a, rows, above, interference)


def derive_arrays(a: PlacementState, rows: slice | np.ndarray, above: np.ndarray, interference: Any) -> None:
    """:func:`derive` over arrays (any number of rows)."""
    usable = a["healthy"][:, rows] & (a["clients"][:, rows] < a["max_clients"][:, rows]) & a["known"][rows]
    free = np.maximum(a["cap"][:, rows] - a["used"][:, rows], 0.0)
    a["free"][:, rows] = free
    a["avail"][:, rows] = np.where(usable, free - a["qbytes"][:, rows], -np.inf)
    a["capu"][:, rows] = np.where(usable, a["cap"][:, rows], -1.0)
    a["free32"][:, rows] = free
    a["frag0"][:, rows] = frag(a["free32"][:, rows], above)
    a["fscale"][:, rows] = W_FRAG / np.maximum(a["cap"][:, rows], 1.0)
    for key in PROFILE_KEYS:
        a_u, a_m = interference.sensitivity(interference.profile_for(key))
        slow = 1.0 + np.maximum(a_u * a["sum_sm"][:, rows] + a_m * a["sum_mem"][:, rows], 0.0)
        a[f"slow_{key}"][:, rows] = slow * a[f"learn_{key}"][:, rows]


def _derive_row(a: PlacementState, r: int, above: np.ndarray, interference: Any) -> None:
    """:func:`derive_arrays` for the single row ``r``, operation for operation in Python scalars: doubles where the
    array path computes in float64, ``np.float32`` scalars where it computes in float32 (``F(free)``), and the same
    casts on assignment, so every stored figure is bit-for-bit the one the array path stores
    (``tests/test_placement_derive.py`` checks it on random states). Comparisons are written so NaN takes the branch
    ``np.maximum``/``np.minimum`` take (they propagate NaN)."""
    col = (slice(None), r)
    known = bool(a["known"][r])
    cap = a["cap"][col].tolist()
    used = a["used"][col].tolist()
    qbytes = a["qbytes"][col].tolist()
    healthy = a["healthy"][col].tolist()
    clients = a["clients"][col].tolist()
    max_clients = a["max_clients"][col].tolist()
    sum_sm = a["sum_sm"][col].tolist()
    sum_mem = a["sum_mem"][col].tolist()
    learn = [a[key][col].tolist() for key in _LEARN_KEYS]
    f32 = np.float32
    zero32 = f32(0.0)
    scale = f32(1.0 / FRAG_BIN)
    top = f32(len(above) - 1)
    sens = [interference.sensitivity(interference.profile_for(key)) for key in PROFILE_KEYS]
    n = len(cap)
    free_l = [0.0] * n
    avail_l = [0.0] * n
    capu_l = [0.0] * n
    frag_l = [zero32] * n
    fscale_l = [0.0] * n
    slow_l = [[0.0] * n for _ in PROFILE_KEYS]
    for i in range(n):
        c = cap[i]
        d = c - used[i]
        free = 0.0 if d < 0.0 else d  # np.maximum(d, 0.0)
        free_l[i] = free
        if healthy[i] and clients[i] < max_clients[i] and known:
            avail_l[i] = free - qbytes[i]
            capu_l[i] = c
        else:
            avail_l[i] = -np.inf
            capu_l[i] = -1.0
        f = f32(free)  # the float32 copy frag() reads
        if f < zero32:
            f = zero32
        idx = f * scale
        if idx > top:
            idx = top
        frag_l[i] = above[int(idx)] * f
        fscale_l[i] = W_FRAG / (1.0 if c < 1.0 else c)
        s_u, s_m = sum_sm[i], sum_mem[i]
        for k, (a_u, a_m) in enumerate(sens):
            v = a_u * s_u + a_m * s_m
            slow_l[k][i] = (1.0 + (0.0 if v < 0.0 else v)) * learn[k][i]
    a["free"][col] = free_l
    a["avail"][col] = avail_l
    a["capu"][col] = capu_l
    a["free32"][col] = free_l
    a["frag0"][col] = frag_l
    a["fscale"][col] = fscale_l
    for k, key in enumerate(PROFILE_KEYS):
        a[f"slow_{key}"][col] = slow_l[k]


def derive_cells(a: PlacementState, cells: Iterable[tuple[int, int]], above: np.ndarray, interference: Any) -> None:
    """:func:`derive` for individual GPUs ``(slot, row)`` (the derived figures of a GPU depend on its own raw figures,
    its row's ``known`` flag, ``above`` and the interference model only): when one GPU of a node changed, re-deriving
    that GPU alone gives the figures re-deriving its whole row would. The same scalar arithmetic as
    :func:`_derive_row`, element by element; tested bit for bit against :func:`derive_arrays`."""
    f32 = np.float32
    zero32 = f32(0.0)
    scale = f32(1.0 / FRAG_BIN)
    top = f32(len(above) - 1)
    sens = [interference.sensitivity(interference.profile_for(key)) for key in PROFILE_KEYS]
    slow_arrays = [a[f"slow_{key}"] for key in PROFILE_KEYS]
    learn_arrays = [a[key] for key in _LEARN_KEYS]
    cap_a, used_a, qbytes_a = a["cap"], a["used"], a["qbytes"]
    healthy_a, clients_a, max_clients_a, known_a = a["healthy"], a["clients"], a["max_clients"], a["known"]
    sum_sm_a, sum_mem_a = a["sum_sm"], a["sum_mem"]
    free_a, avail_a, capu_a, free32_a, frag0_a, fscale_a = (a["free"], a["avail"], a["capu"], a["free32"], a["frag0"],
                                                            a["fscale"])
    for s, r in cells:
        c = cap_a.item(s, r)
        d = c - used_a.item(s, r)
        free = 0.0 if d < 0.0 else d  # np.maximum(d, 0.0)
        free_a[s, r] = free
        if healthy_a.item(s, r) and clients_a.item(s, r) < max_clients_a.item(s, r) and known_a.item(r):
            avail_a[s, r] = free - qbytes_a.item(s, r)
            capu_a[s, r] = c
        else:
            avail_a[s, r] = -np.inf
            capu_a[s, r] = -1.0
        f = f32(free)
        free32_a[s, r] = f
        if f < zero32:
            f = zero32
        idx = f * scale
        if idx > top:
            idx = top
        frag0_a[s, r] = above[int(idx)] * f
        fscale_a[s, r] = W_FRAG / (1.0 if c < 1.0 else c)
        s_u, s_m = sum_sm_a.item(s, r), sum_mem_a.item(s, r)
        for (a_u, a_m), arr, learn in zip(sens, slow_arrays, learn_arrays, strict=True):
            v = a_u * s_u + a_m * s_m
            arr[s, r] = (1.0 + (0.0 if v < 0.0 else v)) * learn.item(s, r)


def sensitivities(interference: Any) -> list[tuple[float, float]]:
    """``(a_u, a_m)`` of each class of :data:`PROFILE_KEYS`: what :func:`derive_cells` computes at every call, for a
    caller that derives often with one interference model (the model is immutable) to compute once."""
    return [interference.sensitivity(interference.profile_for(key)) for key in PROFILE_KEYS]


_SLOW_KEYS = tuple("slow_" + key for key in PROFILE_KEYS)
_LEARN_KEYS = tuple("learn_" + key for key in PROFILE_KEYS)


def learned_factors(book: Mapping[tuple[str, tuple[str, ...]], float], running: Iterable[str | None]
                    ) -> tuple[float, float, float]:
    """The learned factor (observed ÷ prior) of each class of :data:`PROFILE_KEYS` beside the classes ``running`` on
    a GPU, from ``book``: ``(class, sorted co-runner classes) -> factor`` of the GPU's model, as the node agent's
    ``GPUNode.status.learnedSlowdowns`` publishes them (calibrated entries only); 1.0 where it has none, and on an
    idle GPU (nothing to be slowed by)."""
    mates = tuple(sorted(intensity_key(c) for c in running))
    if not mates or not book:
        return (1.0, 1.0, 1.0)
    return tuple(book.get((key, mates), 1.0) for key in PROFILE_KEYS)  # type: ignore[return-value]


def set_gpu_derived(
    a: PlacementState, slot: int, r: int, *, capacity: float, used: float, healthy: bool, clients: int,
    max_clients: int, qbytes: float, qsecs: float, running: Sequence[tuple[float, float, float, float]],
    above: np.ndarray, sens: Sequence[tuple[float, float]], learned: Sequence[float] = (1.0, 1.0, 1.0),
) -> None:
    """:func:`set_gpu` followed by :func:`derive_cells` on that one GPU, in one pass: the derived figures come from
    the raw figures as Python values instead of being written and read back. ``sens``: :func:`sensitivities` of the
    interference model. The same arithmetic as :func:`derive_cells` on the values :func:`set_gpu` stores (float64
    raw figures are the Python floats themselves, ``clients``/``max_clients`` small ints), so every stored figure is
    bit for bit what the two calls store (``tests/test_placement_fastpaths.py``)."""
    cap = float(capacity)
    used_f = float(used)
    qb = float(qbytes)
    # one pass for both sums, in the order of ``running`` as sum() adds them (from the int 0)
    sum_sm: float = 0  # an int 0 until the first job, as sum() starts
    sum_mem: float = 0
    for job in running:
        sum_sm += job[2]
        sum_mem += job[3]
    sum_sm = float(sum_sm)
    sum_mem = float(sum_mem)
    clients_a, max_clients_a = a["clients"], a["max_clients"]
    a["valid"][slot, r] = True
    a["cap"][slot, r] = cap
    a["used"][slot, r] = used_f
    a["healthy"][slot, r] = healthy
    clients_a[slot, r] = clients
    max_clients_a[slot, r] = max_clients
    a["qbytes"][slot, r] = qb
    a["qsecs"][slot, r] = qsecs
    a["sum_sm"][slot, r] = sum_sm
    a["sum_mem"][slot, r] = sum_mem
    for key, factor in zip(_LEARN_KEYS, learned, strict=True):
        a[key][slot, r] = factor
    ends_a, freed_a = a["ends"], a["freed"]
    if running:
        ordered = sorted(running, key=lambda j: j[0]) if len(running) > 1 else running
        ends = [np.inf] * END_SLOTS
        freed = [0.0] * END_SLOTS
        cum = 0.0
        top_k = END_SLOTS - 1
        for k, job in enumerate(ordered):
            cum += job[1]
            kk = k if k < top_k else top_k
            ends[kk] = job[0]
            freed[kk] = cum
        last_end = ordered[-1][0]
        for k in range(END_SLOTS):
            ends_a[k, slot, r] = ends[k]
            freed_a[k, slot, r] = freed[k]
    else:
        last_end = 0.0
        for k in range(END_SLOTS):
            ends_a[k, slot, r] = np.inf
            freed_a[k, slot, r] = 0.0
    a["last_end"][slot, r] = last_end
    # derived: derive_cells' arithmetic on the stored values (clients/max_clients as the int32 array holds them)
    d = cap - used_f
    free = 0.0 if d < 0.0 else d
    a["free"][slot, r] = free
    if healthy and clients_a.item(slot, r) < max_clients_a.item(slot, r) and a["known"].item(r):
        a["avail"][slot, r] = free - qb
        a["capu"][slot, r] = cap
    else:
        a["avail"][slot, r] = -np.inf
        a["capu"][slot, r] = -1.0
    # F(free) in float32 as derive_cells computes it, with Python floats holding float32 values: f * 2**-20 is
    # exact in both, the product of two float32 values is exact in a double, and the store into the float32 array
    # rounds it to nearest as a float32 multiply does.
    free32 = a["free32"]
    free32[slot, r] = free
    f = free32.item(slot, r)
    if f < 0.0:
        f = 0.0
    idx = f * (1.0 / FRAG_BIN)
    top = float(len(above) - 1)
    if idx > top:
        idx = top
    a["frag0"][slot, r] = above.item(int(idx)) * f
    a["fscale"][slot, r] = W_FRAG / (1.0 if cap < 1.0 else cap)
    for (a_u, a_m), key, learn_key in zip(sens, _SLOW_KEYS, _LEARN_KEYS, strict=True):
        v = a_u * sum_sm + a_m * sum_mem
        a[key][slot, r] = (1.0 + (0.0 if v < 0.0 else v)) * a[learn_key].item(slot, r)


def fit_mask(a: PlacementState, gpu_bytes: float) -> np.ndarray:
    """Per GPU ``(gpus, rows)``: usable and large enough to ever hold ``gpu_bytes``."""
    return a["capu"] >= gpu_bytes


def node_filter(
    a: PlacementState, good: np.ndarray, cpu_millis: float | None, memory_bytes: float | None
) -> np.ndarray:
    """Per node row: the filter decision (known, a GPU in ``good``, and — unless ``cpu_millis`` is None, when the
    caller checks host resources itself — enough unclaimed CPU and memory)."""
    ok = a["known"] & np.logical_or.reduce(good, axis=0)
    if cpu_millis is not None:
        ok &= (a["cpu_free"] >= cpu_millis) & (a["mem_free"] >= memory_bytes)
    return ok


def intensity_key(intensity: str | None) -> str:
    return intensity if intensity in ("memory", "compute") else "none"


def cost_matrix(
    a: PlacementState, gpu_bytes: float, runtime_seconds: float, intensity: str | None, now: float,
    above: np.ndarray | None, *, interference_aware: bool = True,
) -> np.ndarray:
    """Cost of placing the pod on every GPU slot of every row, ``(gpus, rows)``; ``inf`` where the GPU cannot
    take it. ``above``: the size table (:func:`size_table`), None or empty mix = no fragmentation term.
    See the module docstring for the formula."""
    b = float(gpu_bytes)
    big_r = runtime_seconds
    good = a["capu"] >= b
    fits_now = a["avail"] >= b
    # (wait + R * slowdown) / R; the wait is added below
    cost = a[f"slow_{intensity_key(intensity)}"].copy() if interference_aware else np.ones_like(a["free32"])
    flat_wait = np.flatnonzero(good & ~fits_now)
    if flat_wait.size:
        cost.ravel()[flat_wait] += wait_seconds(a, flat_wait, b, now) / big_r
    if above is not None and len(above) > 1:
        d_frag = frag(a["free32"] - np.float32(b), above)
        d_frag -= a["frag0"]
        d_frag *= fits_now
        d_frag *= a["fscale"]
        cost += d_frag
    np.copyto(cost, np.inf, where=~good)
    return cost


def wait_seconds(a: PlacementState, flat_wait: np.ndarray, b: float, now: float) -> np.ndarray:
    """The wait term (seconds) of a pod of ``b`` bytes on the GPUs ``flat_wait`` (flat indices into the
    ``(gpus, rows)`` layout, GPUs where the pod does not fit now): see the module docstring. Element by element, so
    computing it for a subset of GPUs gives each of them the value computing it for all would."""
    # k = the first end slot whose cumulative freed bytes make room, any_k = there is one. Computed slot by slot
    # with 1-D takes (the same sums and comparisons, element for element, as gathering ``[:, flat_wait]`` and
    # reducing along the slot axis with logical_or.reduce / argmax, which numpy runs several times slower on
    # these short-axis arrays); where no slot makes room k stays 0, as argmax gives.
    k_slots = a["ends"].shape[0]
    n_wait = flat_wait.size
    need_w = a["qbytes"].ravel().take(flat_wait) + b
    free_w = a["free"].ravel().take(flat_wait)
    freed = a["freed"].reshape(k_slots, -1)
    k = np.zeros(n_wait, dtype=np.intp)
    any_k = np.zeros(n_wait, dtype=bool)
    for slot in range(k_slots - 1, -1, -1):
        enough = (freed[slot].take(flat_wait) + free_w) >= need_w
        k[enough] = slot
        any_k |= enough
    ends = a["ends"].reshape(k_slots, -1)
    end_k = ends.ravel().take(k * ends.shape[1] + flat_wait)
    later = np.maximum(a["last_end"].ravel().take(flat_wait) - now, 0.0) + a["qsecs"].ravel().take(flat_wait)
    return np.where(any_k, np.maximum(end_k - now, 0.0), later)


def wait_bound(a: PlacementState, rows: np.ndarray, gpu_bytes: float, now: float) -> np.ndarray:
    """Per row of ``rows`` (an index array): a lower bound (seconds) of the wait term (:func:`wait_seconds`) of a pod
    of ``gpu_bytes`` on each GPU of the row where it would wait (usable, ever fits, does not fit now); ``inf`` where
    no GPU waits.

    Why: the bound needs no pod-specific scan of the end slots, so a caller can rule out rows whose cheapest
    waiting GPU cannot beat a known cost before computing their exact wait terms. It is ``max(E - now, 0)`` with
    ``E`` the row's least ``min(ends[0], last_end)`` over its waiting GPUs: a GPU's wait is either
    ``max(end_k - now, 0)`` with ``end_k >= ends[0]`` (end slots ascend), or ``max(last_end - now, 0) + queued
    seconds`` (never below ``max(last_end - now, 0)``), and float subtraction and ``max`` are monotonic, so the bound
    never exceeds the wait :func:`wait_seconds` computes."""
    b = float(gpu_bytes)
    waiting = (a["capu"].take(rows, axis=1) >= b) & ~(a["avail"].take(rows, axis=1) >= b)
    end = np.minimum(a["ends"][0].take(rows, axis=1), a["last_end"].take(rows, axis=1))
    least = np.minimum.reduce(np.where(waiting, end, np.inf), axis=0)
    return np.maximum(least - now, 0.0)


def _row_terms(
    a: PlacementState, cols: slice | np.ndarray, b: float, intensity: str | None, above: np.ndarray | None,
    interference_aware: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """For the rows ``cols``: ``(good, fits_now, slowdown, d_frag)``, the terms :func:`candidate_costs` and
    :func:`fit_costs` share. ``slowdown`` is a fresh C-ordered array the caller may write (a gather along the last
    axis may come out in Fortran order, and the wait term is written through ``ravel()``, which must be a view);
    ``d_frag`` (0 where the pod does not fit now) is ``None`` without a size table. Index arrays are gathered with
    ``take`` (a fresh C-ordered array, several times cheaper than ``[:, cols]`` on a few dozen rows)."""
    if isinstance(cols, slice):
        def rows_of(key: str) -> np.ndarray:
            return a[key][:, cols]
    else:
        def rows_of(key: str) -> np.ndarray:
            return a[key].take(cols, axis=1)
    good = rows_of("capu") >= b
    fits_now = rows_of("avail") >= b
    if interference_aware:
        cost = rows_of(f"slow_{intensity_key(intensity)}")
        if isinstance(cols, slice):
            cost = np.array(cost, order="C")
    else:
        cost = np.ones(good.shape, dtype=a["free32"].dtype)
    d_frag = None
    if above is not None and len(above) > 1:
        shifted = rows_of("free32") - np.float32(b)
        d_frag = _frag_owned(shifted, above)
        d_frag -= rows_of("frag0")
        d_frag *= fits_now
        d_frag *= rows_of("fscale")
    return good, fits_now, cost, d_frag


def candidate_costs(
    a: PlacementState, cols: slice | np.ndarray, gpu_bytes: float, runtime_seconds: float, intensity: str | None,
    now: float, above: np.ndarray | None, *, interference_aware: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """``cost_matrix(...)[:, cols]`` and ``fit_mask(a, gpu_bytes)[:, cols]``, computed for the node rows ``cols``
    only (a slice or an index array): the scheduler sends the extender a few hundred of a cluster's nodes, so the
    GPUs of the others need no cost. Every element is computed with the operations :func:`cost_matrix` applies to it
    (the fragmentation term is added after the wait term, as there; on a GPU that waits it is 0)."""
    b = float(gpu_bytes)
    big_r = runtime_seconds
    good, fits_now, cost, d_frag = _row_terms(a, cols, b, intensity, above, interference_aware)
    sub = np.flatnonzero(good & ~fits_now)
    if sub.size:
        n_cols = good.shape[1]
        slot_i, col_i = np.divmod(sub, n_cols)
        rows_i = col_i + (cols.start or 0) if isinstance(cols, slice) else np.asarray(cols).take(col_i)
        flat = slot_i * a["capu"].shape[1] + rows_i
        cost.ravel()[sub] += wait_seconds(a, flat, b, now) / big_r
    if d_frag is not None:
        cost += d_frag
    np.copyto(cost, np.inf, where=~good)
    return cost, good


def fit_costs(
    a: PlacementState, cols: slice | np.ndarray, gpu_bytes: float, intensity: str | None, above: np.ndarray | None,
    *, interference_aware: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The parts of :func:`candidate_costs` that depend on neither the clock nor the pod's runtime, for the rows
    ``cols``: ``(fit, low, good)``, each ``(gpus, len(cols))``. ``fit``: the exact cost of every GPU the pod fits on
    now (the wait term is 0 there), ``inf`` elsewhere; ``low``: on every GPU where it would wait, the lower bound of
    its cost (the slowdown: the cost before the wait term, see :func:`candidate_costs`), ``inf`` elsewhere; ``good``:
    :func:`fit_mask`. A cache can keep these per (bytes, intensity) until the row's derived figures change."""
    good, fits_now, cost, d_frag = _row_terms(a, cols, float(gpu_bytes), intensity, above, interference_aware)
    low = np.where(good & ~fits_now, cost, np.float32(np.inf))
    if d_frag is not None:
        cost += d_frag
    np.copyto(cost, np.inf, where=~(good & fits_now))
    return cost, low, good


def fit_summary(
    a: PlacementState, rows: np.ndarray, gpu_bytes: float, intensity: str | None, above: np.ndarray | None,
    *, interference_aware: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per row of ``rows`` (an index array), what a cache of :func:`fit_costs` keeps: ``(fit, slot, low, good)`` =
    ``fit.min(axis=0)``, ``fit.argmin(axis=0)``, ``low.min(axis=0)`` and ``good.any(axis=0)`` of
    ``fit_costs(a, rows, ...)``, with fewer array operations: the fragmentation term is added without first being
    zeroed where the pod waits (``fit`` keeps only the GPUs it fits on now, where that factor is 1; ``low`` is taken
    before the term is added). Tested against :func:`fit_costs` (``tests/test_placement_fastpaths.py``)."""
    b = float(gpu_bytes)
    # gathers by take (several times cheaper than ``[:, rows]`` on a few dozen rows), the temporaries reused in place
    good = a["capu"].take(rows, axis=1) >= b
    fit_cells = a["avail"].take(rows, axis=1) >= b
    fit_cells &= good
    waits = good ^ fit_cells  # good & ~fits_now
    frag_above = above if above is not None and len(above) > 1 else None
    cost: np.ndarray | None
    if interference_aware:
        cost = a[f"slow_{intensity_key(intensity)}"].take(rows, axis=1)  # a fresh array (written below)
        low = np.where(waits, cost, _INF32)
    else:  # slowdown 1 everywhere
        cost = None if frag_above is not None else np.ones(good.shape, dtype=a["free32"].dtype)
        low = np.where(waits, _ONE32, _INF32)
    if frag_above is not None:
        shifted = a["free32"].take(rows, axis=1)
        shifted -= np.float32(b)
        d_frag = _frag_owned(shifted, frag_above)
        d_frag -= a["frag0"].take(rows, axis=1)
        d_frag *= a["fscale"].take(rows, axis=1)
        if cost is None:
            d_frag += _ONE32  # 1 + d_frag (float32 addition commutes)
            cost = d_frag
        else:
            cost += d_frag
    assert cost is not None  # set above: by the interference branch, the plain branch or the fragmentation term
    fit = np.where(fit_cells, cost, _INF32)
    return (np.minimum.reduce(fit, axis=0), fit.argmin(axis=0), np.minimum.reduce(low, axis=0),
            np.logical_or.reduce(good, axis=0))


def best_gpu(cost: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``rows`` (``-1`` = unknown node): the cheapest GPU slot and its cost (``inf`` if none)."""
    known_row = rows >= 0
    r = np.where(known_row, rows, 0)
    sub = cost[:, r]
    slot = sub.argmin(axis=0) if len(r) else np.zeros(0, dtype=np.int64)
    best = np.minimum.reduce(sub, axis=0) if len(r) else np.zeros(0)
    return slot, np.where(known_row, best, np.inf)


def normalise_scores(best: np.ndarray) -> np.ndarray:
    """0..10 per candidate from its best cost: the cheapest candidate gets 10, one twice as costly 5, a candidate
    with no usable GPU (``inf``) 0 — kube-scheduler's extender score range (``MaxExtenderPriority = 10``)."""
    if len(best) == 0:
        return np.zeros(0, dtype=np.int64)
    lo = best.min()
    if lo > 0 and lo != np.inf:  # no NaN (it would make lo NaN), no cost <= 0: 10 * lo / best is in [0, 10] already
        return np.rint(10.0 * lo / best).astype(np.int64)
    finite = np.isfinite(best)
    if not finite.any():
        return np.zeros(len(best), dtype=np.int64)
    lo = best[finite].min()
    with np.errstate(divide="ignore"):
        scores = np.rint(10.0 * lo / best)  # inf -> 0
    return np.clip(scores, 0, 10).astype(np.int64)


class Occupant(NamedTuple):
    """A client of a GPU as the apart rule sees it: its job (``<namespace>/<name>``, None when no GNNJob owns the
    pod), the jobs it must stay apart from, when it is predicted to leave (seconds since the epoch), and its trust
    domain (``gnnsched.trust.domain``; None: shares with anyone)."""

    job: str | None
    apart: frozenset[str]
    end: float
    domain: str | None = None


_Cell = TypeVar("_Cell", bound=Hashable)


def apart_blocked(job: str | None, apart: frozenset[str],
                  gpus: Iterable[tuple[_Cell, Iterable[Occupant]]], domain: str | None = None) -> dict[_Cell, float]:
    """Which of ``gpus`` (each a key and its clients) the pod (``job`` and its ``apart`` peers, of trust domain
    ``domain``) may not join now: a client there must stay apart from it
    (:func:`~gnnsched.attempts.fault_classes.must_stay_apart`, both directions) or is of a trust domain it may not share
    with (:func:`~gnnsched.trust.domain.may_share`). Each with the predicted time its last such client leaves
    (``inf`` when one never says)."""
    out: dict[_Cell, float] = {}
    for key, clients in gpus:
        ends = [c.end for c in clients
                if not may_share(domain, c.domain) or must_stay_apart(job, apart, c.job, c.apart)]
        if ends:
            out[key] = max(ends)
    return out


def apart_filter(passed: np.ndarray, clear: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The filter under the apart rule, per candidate: ``passed`` (the ordinary filter) and ``clear`` (it passes with
    the GPUs :func:`apart_blocked` finds taken out). Returns the candidates that pass and those refused for the rule
    alone. Blocked candidates are refused only when one that passes is clear: kube-scheduler never binds a filtered
    node, and a pod whose every candidate is filtered stays unschedulable until the next attempt, though peers
    finish and a node whose peers will leave is better than none."""
    keep = passed & clear
    if keep.any():
        return keep, passed & ~clear
    return passed, np.zeros_like(passed)


def apart_costs(cost: np.ndarray, blocked: Mapping[tuple[int, int], float], runtime_seconds: float | np.ndarray,
                now: float) -> tuple[np.ndarray, np.ndarray]:
    """``cost`` (``(gpus, columns)``, :func:`cost_matrix`'s values) under the apart rule; ``blocked`` maps
    ``(slot, column)`` to the predicted time the GPU's last peer leaves; ``runtime_seconds``: the pod's ``R``, one
    for all columns or one per column (the simulator's nodes of different GPU models). Returns ``clear`` (blocked
    GPUs ``inf``) and ``waiting`` (a blocked GPU's cost plus the wait for its peers, ``(leave - now) / R``, in the
    cost's units)."""
    clear = cost.copy()
    waiting = cost.copy()
    per_column = np.ndim(runtime_seconds) > 0
    for (slot, col), leave in blocked.items():
        clear[slot, col] = np.inf
        big_r = float(runtime_seconds[col]) if per_column else float(runtime_seconds)  # type: ignore[index]
        waiting[slot, col] += max(0.0, leave - now) / big_r
    return clear, waiting


def domain_blocked(domains: np.ndarray, mine: int) -> np.ndarray:
    """The trust-domain rule (``gnnsched.trust.domain``) over arrays: ``domains`` holds per GPU the id of the one
    domain of its clients (``-1``: none; any other negative value: clients of several domains), ``mine`` the pod's
    domain id (``-1`` when no GPU holds it). True where the pod may not join: a GPU with a client of another domain.
    A cache keeps ``domains`` beside the placement arrays, so a pod's blocked GPUs cost two comparisons instead of a
    walk over every client (:func:`apart_blocked`'s ``domain`` is the same rule, one client at a time)."""
    return (domains != -1) & (domains != mine)


def blocked_costs(cost: np.ndarray, blocked: np.ndarray, leave: np.ndarray, runtime_seconds: float,
                  now: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`apart_costs` with the blocked GPUs as a mask: ``blocked`` (``cost``'s shape) and ``leave`` (when each
    blocked GPU's last client the pod may not join is predicted to leave). Returns ``clear`` (blocked GPUs ``inf``)
    and ``waiting`` (a blocked GPU's cost plus ``max(leave - now, 0) / R``)."""
    clear = np.where(blocked, np.inf, cost)
    wait = np.where(blocked, np.maximum(leave - now, 0.0) / float(runtime_seconds), 0.0)
    return clear, cost + wait


def apart_ranked(clear: np.ndarray, waiting: np.ndarray) -> np.ndarray:
    """The costs the score and the bind rank candidates (columns) by: ``clear`` when a GPU of some candidate can take
    the pod clear of its peers (a blocked node then scores 0, as one that cannot hold the pod), else ``waiting``
    (every candidate blocked: the one whose peers leave soonest, at the lowest cost, wins)."""
    return clear if np.isfinite(clear).any() else waiting


__all__ = [
    "END_SLOTS", "FRAG_BIN", "PROFILE_KEYS", "SIZE_QUANTILES", "W_FRAG", "Occupant", "PlacementState",
    "apart_blocked", "apart_costs", "apart_filter", "apart_ranked", "best_gpu", "blocked_costs", "clear_row",
    "domain_blocked",
    "candidate_costs", "cost_matrix", "derive", "derive_arrays", "derive_cells", "fit_costs", "fit_mask",
    "fit_summary", "frag",
    "intensity_key", "learned_factors", "new_state",
    "node_filter", "normalise_scores",
    "sensitivities", "set_gpu", "set_gpu_derived", "set_host", "size_table", "wait_bound", "wait_seconds",
]
