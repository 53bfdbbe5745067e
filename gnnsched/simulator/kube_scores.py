"""kube-scheduler's node scoring, as the simulator plays it: the default score plugins that see CPU and memory, and
the sum it ranks nodes by once an extender has answered.

Why the simulator needs this: kube-scheduler does not bind where the extender scores highest; it binds where the
*sum* of every score plugin (each 0..100 × its weight) and every extender (0..10 × weight × 10) is highest. When the
extender rates several nodes alike -- all their GPUs fit the pod now, the usual case on a CPU-bound cluster --,
``NodeResourcesFit`` and ``NodeResourcesBalancedAllocation`` decide, and whether ``NodeResourcesFit`` spreads
(``LeastAllocated``, kube-scheduler's default and gnnsched's profile's) or packs (``MostAllocated``, a chart value,
see :mod:`gnnsched.scheduler_config`) decides whether a 40-core pod later finds a node with 40 cores free.

Formulas (kube-scheduler v1.26+, ``pkg/scheduler/framework/plugins/noderesources``), per resource ``r`` of the
strategy's list (CPU and memory, weight 1 each), ``req`` = the node's requested amount *including* the pod:

* ``LeastAllocated``: ``(cap - req) * 100 // cap``; ``MostAllocated``: ``min(req, cap) * 100 // cap``; the node's
  score is the weighted sum ``// `` the weight sum (integer arithmetic).
* ``BalancedAllocation``: with ``f_r = min(req / cap, 1)``, ``int((1 - std(f)) * 100)``; for two resources
  ``std = |f_cpu - f_mem| / 2``.
* Extender: ``score * weight * (MaxNodeScore / MaxExtenderPriority)`` = ``score * weight * 10``.

The other default score plugins (TaintToleration, NodeAffinity, InterPodAffinity, PodTopologySpread, ImageLocality,
VolumeBinding) give every node of a simulated cluster the same score -- no taints, affinities, spread constraints
that select GNNJob pods, or volumes -- so they do not change the ranking and are left out. kube-scheduler picks at
random among equal totals; the simulator takes the first in its candidate order, so runs are reproducible.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gnnsched.scheduler_config import LEAST_ALLOCATED, MOST_ALLOCATED, SCORING_STRATEGIES

MAX_NODE_SCORE = 100
MAX_EXTENDER_PRIORITY = 10


def _scored_amounts(strategy: str, cpu_req: Any, cpu_cap: Any, mem_req: Any, mem_cap: Any) -> tuple[Any, Any]:
    """The CPU and memory amounts NodeResourcesFit scores as a share of capacity: the requested ones
    (``MostAllocated``) or the unrequested ones (``LeastAllocated``). Arrays or Python integers alike."""
    if strategy == MOST_ALLOCATED:
        return cpu_req, mem_req
    if strategy == LEAST_ALLOCATED:
        return cpu_cap - cpu_req, mem_cap - mem_req
    raise ValueError(f"strategy: {strategy!r} must be one of {', '.join(SCORING_STRATEGIES)}")


def resource_fit(strategy: str, cpu_req: np.ndarray, cpu_cap: np.ndarray, mem_req: np.ndarray,
                 mem_cap: np.ndarray) -> np.ndarray:
    """NodeResourcesFit's score 0..100 per node (CPU and memory, weight 1 each). ``*_req`` include the pod and are at
    most ``*_cap`` (kube-scheduler scores only nodes its filter passed); ``0 < *_cap < 2^46``. Float arrays of whole
    numbers, for speed, yet kube-scheduler's integer arithmetic exactly: ``req * 100`` is exact below 2^53, and a
    quotient of whole numbers that is not whole lies at least ``1 / cap`` from the next integer, far more than
    float64's rounding at 100, so flooring the rounded quotient floors the exact one."""
    c, m = _scored_amounts(strategy, cpu_req, cpu_cap, mem_req, mem_cap)
    per = np.floor(c * MAX_NODE_SCORE / cpu_cap)
    per += np.floor(m * MAX_NODE_SCORE / mem_cap)
    return np.floor(per / 2, out=per)


def balanced_allocation(cpu_req: np.ndarray, cpu_cap: np.ndarray, mem_req: np.ndarray,
                        mem_cap: np.ndarray) -> np.ndarray:
    """NodeResourcesBalancedAllocation's score 0..100 per node: 100 when CPU and memory are equally allocated (the
    same preconditions as :func:`resource_fit`, so no fraction exceeds 1)."""
    d = cpu_req / cpu_cap
    d -= mem_req / mem_cap
    std = np.abs(d, out=d)
    std /= 2.0
    return np.trunc((1.0 - std) * MAX_NODE_SCORE)


def host_scores(strategy: str, cpu_free: np.ndarray, cpu_cap: np.ndarray, mem_free: np.ndarray,
                mem_cap: np.ndarray, pod_cpu: float, pod_mem: float) -> np.ndarray:
    """The two plugins' sum (0..200, floats of whole numbers) per candidate node, from the nodes' unrequested CPU
    (millicores) and memory (bytes) before the pod and their allocatable amounts; the pod fits every node."""
    cpu_req = cpu_cap - cpu_free
    cpu_req += pod_cpu
    mem_req = mem_cap - mem_free
    mem_req += pod_mem
    total = resource_fit(strategy, cpu_req, cpu_cap, mem_req, mem_cap)
    total += balanced_allocation(cpu_req, cpu_cap, mem_req, mem_cap)
    return total


def host_score(strategy: str, cpu_free: int, cpu_cap: int, mem_free: int, mem_cap: int, pod_cpu: int,
               pod_mem: int) -> float:
    """:func:`host_scores` of one node, in Python's integers as kube-scheduler computes it (the engine keeps each
    request class's per-node scores and re-scores only the few nodes whose books changed: a numpy call on two
    elements costs more than this)."""
    cpu_req, mem_req = cpu_cap - cpu_free + pod_cpu, mem_cap - mem_free + pod_mem
    c, m = _scored_amounts(strategy, cpu_req, cpu_cap, mem_req, mem_cap)
    fit = (c * MAX_NODE_SCORE // cpu_cap + m * MAX_NODE_SCORE // mem_cap) // 2
    balanced = int((1.0 - abs(cpu_req / cpu_cap - mem_req / mem_cap) / 2.0) * MAX_NODE_SCORE)
    return float(fit + balanced)


def extender_points(scores: np.ndarray | float, weight: int) -> np.ndarray | float:
    """An extender's 0..10 scores as kube-scheduler adds them to the plugins' sum."""
    return scores * (weight * (MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY))


__all__ = ["MAX_EXTENDER_PRIORITY", "MAX_NODE_SCORE", "balanced_allocation", "extender_points", "host_score",
           "host_scores", "resource_fit"]
