"""The extender's picture of the cluster: every GPU as rows of numpy arrays, plus its own reservations.

Why arrays: kube-scheduler asks about thousands of nodes per pod, and a Python loop over 40,000 GPUs costs tens of
milliseconds. The source of truth is kept per node in small Python objects (what the node agent reported in its
``GPUNode`` status, the ``Node``'s allocatable CPU and memory, the pods known to be bound there, and the
reservations this extender made); every change to a node re-derives that node's row of the arrays, so a request
only does vectorised arithmetic over the rows of its candidate nodes.

Reservations: when the extender binds a pod it records the pod's bytes on one GPU (``immediate`` when they fit in
that GPU's free memory now, otherwise ``queued`` behind the GPU's gate queue). All checks and the reservation are
taken under one lock, so two concurrent binds can never both count the same free bytes. A reservation ends when
the node agent reports the pod (the agent's own accounting takes over), when the pod ends, or after a TTL. It is
written to the pod as the ``gnnsched.io/reservation`` annotation and rebuilt from the pods after a restart, in
the order of their ``at`` times, which replays the original decisions.

The placement math — the filter's fit test, the per-GPU cost (wait + runtime x interference slowdown +
``W_FRAG`` x fragmentation change), the fragmentation term and the 0..10 score normalisation — lives in the core
module :mod:`gnnsched.placement` (its docstring has the formula and the weights), so that the simulator runs the
very same functions. This module keeps the extender's own concerns: the per-node objects, locking, reservations,
user-facing reasons.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from itertools import repeat
from typing import Any

import numpy as np

from gnnsched import placement as pl
from gnnsched.colocation.interference import JobProfile, SlowdownModel
from gnnsched.colocation.learned import FactorBook, factor_book
from gnnsched.contract import ANN_INTENSITY, ANN_PREDICTED_RUNTIME, ANN_RESERVATION, GPUNodeStatus
from gnnsched.gpu.measured import ALLOCATOR_MISMATCH, missing_constants
from gnnsched.placement import W_FRAG
from gnnsched.quantity import format_bytes, parse_bytes, parse_quantity
from gnnsched.trust.domain import DomainResolver
from gnnsched.trust.job_facts import STATUS_FIELD as STATUS_FACTS
from gnnsched.trust.job_facts import owner_name, trusted_view

from .pods import DEFAULT_RUNTIME_SECONDS, PodDemand, PodError, parse_pod, pod_apart, pod_resources

#: Reservations not reported by the node agent within this many seconds are dropped.
DEFAULT_RESERVATION_TTL = 300.0
#: How far in the future a recorded reservation's ``at`` may lie and still count (clocks of extender replicas differ).
RESERVATION_CLOCK_SKEW = 5.0

# Reason codes, also the ``reason`` label of the nodes-filtered-out metric.
R_UNKNOWN = "unknown_node"
R_NO_GPU = "no_gpu"
R_UNHEALTHY = "unhealthy"
R_GPU_MEMORY = "gpu_memory"
R_CLIENTS = "mps_clients"
R_CPU = "cpu"
R_MEMORY = "memory"
R_FAULT_PEERS = "fault_peers"
R_TRUST_DOMAIN = "trust_domain"

#: ``ClusterCache._dom`` of a GPU whose clients are of several trust domains (only under ``cluster``, or after the
#: setting changed): blocked for every pod of a domain (``pl.domain_blocked``).
MIXED_DOMAINS = -2
R_NO_CONSTANTS = "gpu_constants"


@dataclass(slots=True)
class _Job:
    uid: str
    bytes: int
    end: float  # absolute predicted end (running) — for queued jobs unused
    seconds: float  # predicted (remaining) seconds
    profile: JobProfile
    job: str | None = None  # its GNNJob, as the agent reports it (the apart rule's identity)
    apart: frozenset[str] = frozenset()  # the jobs it may not share a GPU with, as the agent's gate holds them
    domain: str | None = None  # its trust domain (gnnsched.trust.domain), from the namespace the agent reports
    intensity: str | None = None  # its class as the agent reports it (the learned slowdowns' key)


@dataclass(slots=True)
class _GPU:
    index: int
    uuid: str
    model: str
    total: int
    reserve: int
    committed: int
    healthy: bool
    mps_healthy: bool
    max_clients: int
    running: list[_Job] = field(default_factory=list)
    queued: list[_Job] = field(default_factory=list)
    # why the GPU has no device constants (UnknownGPUModel, AllocatorModelMismatch): it takes exclusive pods only
    no_constants: str | None = None

    @property
    def capacity(self) -> int:
        return max(0, self.total - self.reserve)


@dataclass(slots=True)
class _Node:
    name: str
    row: int
    gpus: list[_GPU] = field(default_factory=list)
    has_status: bool = False
    node_mps_healthy: bool = True
    cpu_alloc: int | None = None  # millicores, None = unknown (not checked)
    mem_alloc: int | None = None
    pods: dict[str, tuple[int, int]] = field(default_factory=dict)  # uid -> (cpu millis, memory bytes)
    reported: set[str] = field(default_factory=set)  # pod uids the agent lists (running or queued)
    # per GPU slot, its clients as the apart rule sees them (running pods and this extender's reservations there);
    # only slots with a client that has a job or peers
    occupants: dict[int, list[pl.Occupant]] = field(default_factory=dict)
    jobs: set[str] = field(default_factory=set)  # the jobs among ``occupants`` (the cache's job -> nodes index)
    # the co-location slowdowns its agent learned (GPUNode status learnedSlowdowns, calibrated ones), by GPU model
    learned: FactorBook = field(default_factory=dict)


@dataclass(slots=True)
class Reservation:
    """Capacity this extender promised a pod it bound, until the node agent reports the pod."""

    uid: str
    namespace: str
    name: str
    node: str
    gpu: int
    bytes: int
    at: float
    runtime: float
    intensity: str | None
    immediate: bool
    cpu_millis: int = 0
    memory_bytes: int = 0
    job: str | None = None  # the apart rule's identity and peers (``PodDemand.job`` / ``apart``)
    apart: frozenset[str] = frozenset()

    def annotation(self) -> str:
        """The ``gnnsched.io/reservation`` annotation value (contract: node, gpu, bytes, at)."""
        at = datetime.fromtimestamp(self.at, tz=timezone.utc).isoformat(timespec="microseconds")
        return json.dumps({"node": self.node, "gpu": self.gpu, "bytes": self.bytes, "at": at}, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class FilterOutcome:
    passed: np.ndarray  # bool per candidate (same order as the request)
    reasons: dict[int, tuple[str, str]]  # candidate position -> (reason code, message)
    unresolvable: bool  # the pod fits on no GPU in the whole cluster


class BindError(Exception):
    """A bind the cache refuses (node unknown or cannot hold the pod); the message is for the user."""


class ClusterCache:
    """Thread-safe cluster state for the extender. All public methods take the lock."""

    def __init__(
        self,
        interference: SlowdownModel,
        *,
        reservation_ttl: float = DEFAULT_RESERVATION_TTL,
        clock: Callable[[], float] = time.time,
        domains: DomainResolver | None = None,
    ) -> None:
        self.interference = interference
        # Whose pods may share a GPU (extender --trust-domain, gnnsched.trust.domain): a GPU with a client or a
        # reservation of another domain is blocked for a pod as a fault peer's is (see _blocked).
        self.domains = domains if domains is not None else DomainResolver()
        self.reservation_ttl = reservation_ttl
        self.clock = clock
        self.lock = threading.RLock()
        self._nodes: dict[str, _Node] = {}
        self._names: list[str] = []
        self._row: dict[str, int] = {}
        self._reservations: dict[str, Reservation] = {}
        self._by_node: dict[str, set[str]] = {}
        self._pod_node: dict[str, str] = {}  # uid -> node the pod is bound to
        self._gmax = 1
        self._cap_rows = 0
        self._alloc(64, 1)
        self._above = pl.size_table(())  # P(size > f) on a 1 MiB grid of f (see gnnsched.placement.frag)
        self._sizes_dirty = True
        self.version = 0  # bumped on every change; lets callers cache derived data
        self._max_cap: tuple[int, float] = (-1, 0.0)
        # The apart rule's index (docs/faults.md): job -> nodes where a client of it runs or is reserved, and the
        # nodes with a client that has peers of its own. Only pods with peers, or whose job someone lists, look.
        self._job_nodes: dict[str, set[str]] = {}
        self._apart_nodes: set[str] = set()
        # The trust-domain rule (docs/extender.md): per GPU the one domain of its clients and reservations (an id of
        # _domain_ids; -1: none, MIXED_DOMAINS: several) and when the last of them is predicted to leave, as
        # (gpus, rows) arrays beside the placement arrays, so a pod's blocked GPUs are two array comparisons.
        self._domain_ids: dict[str, int] = {}
        # The exclusive-only rule (docs/extender.md): GPUs without device constants, as a (gpus, rows) mask beside
        # the placement arrays, and the nodes that have one (empty on a described cluster: the rule then costs
        # nothing).
        self._no_constants_nodes: set[str] = set()
        # GNNJobs (namespace, name) -> the parts that say which pod they trust (gnnsched.trust.job_facts)
        self._gnnjobs: dict[tuple[str, str], dict[str, Any]] = {}

    # ------------------------------------------------------------------ GNNJobs: where a pod's facts come from

    def upsert_gnnjob(self, job: dict, *, deleted: bool = False) -> None:
        """Remember a GNNJob's uid and ``status.podFacts`` (the watch keeps them current), or forget it."""
        meta = job.get("metadata") or {}
        key = (str(meta.get("namespace") or "default"), str(meta.get("name") or ""))
        with self.lock:
            if deleted:
                self._gnnjobs.pop(key, None)
                return
            facts = (job.get("status") or {}).get(STATUS_FACTS) if isinstance(job.get("status"), dict) else None
            self._gnnjobs[key] = {"metadata": {"name": key[1], "namespace": key[0], "uid": meta.get("uid")},
                                  "status": {STATUS_FACTS: facts} if isinstance(facts, dict) else {}}

    def gnnjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            return self._gnnjobs.get((namespace, name))

    def trusted(self, pod: dict, job: dict[str, Any] | None = None) -> tuple[dict, bool]:
        """``pod`` as the extender may read it (``gnnsched.trust.job_facts.trusted_view``): its facts from its
        GNNJob's status (``job``, else the one the watch last saw), or none; and whether it was trusted."""
        meta = pod.get("metadata") if isinstance(pod, dict) else None
        if not isinstance(meta, dict):
            return pod, False
        owner = owner_name(pod)
        if job is None and owner is not None:
            job = self.gnnjob(str(meta.get("namespace") or "default"), owner)
        view, facts = trusted_view(pod, job)
        return view, facts is not None

    # ------------------------------------------------------------------ arrays

    def _alloc(self, rows: int, gpus: int) -> None:
        """(Re)allocate the arrays (layout: :func:`gnnsched.placement.new_state`) for ``rows`` nodes of up to
        ``gpus`` GPUs, keeping existing rows."""
        self._a = pl.new_state(rows, gpus, getattr(self, "_a", None), self._cap_rows)
        shared_off = np.zeros((gpus, rows), dtype=bool)
        old = getattr(self, "_shared_off", None)
        if old is not None:
            g, n = min(old.shape[0], gpus), min(old.shape[1], rows)
            shared_off[:g, :n] = old[:g, :n]
        self._shared_off = shared_off
        dom = np.full((gpus, rows), -1, dtype=np.int32)
        dom_end = np.zeros((gpus, rows))
        old_dom, old_end = getattr(self, "_dom", None), getattr(self, "_dom_end", None)
        if old_dom is not None and old_end is not None:
            g, n = min(old_dom.shape[0], gpus), min(old_dom.shape[1], rows)
            dom[:g, :n] = old_dom[:g, :n]
            dom_end[:g, :n] = old_end[:g, :n]
        self._dom, self._dom_end = dom, dom_end
        self._cap_rows = rows
        self._gmax = gpus

    def reserve_rows(self, rows: int, gpus: int = 1) -> None:
        """Pre-size the arrays (bulk loads): the hot path computes over every allocated row."""
        with self.lock:
            if rows > self._cap_rows or gpus > self._gmax:
                self._alloc(max(rows, self._cap_rows), max(gpus, self._gmax))

    def _node(self, name: str) -> _Node:
        node = self._nodes.get(name)
        if node is None:
            row = len(self._names)
            if row >= self._cap_rows:
                self._alloc(max(64, self._cap_rows + self._cap_rows // 4), self._gmax)
            node = _Node(name=name, row=row)
            self._nodes[name] = node
            self._names.append(name)
            self._row[name] = row
        return node

    def _refresh(self, node: _Node) -> None:
        """Re-derive ``node``'s row of the arrays from its objects and its reservations."""
        if len(node.gpus) > self._gmax:
            self._alloc(self._cap_rows, len(node.gpus))
        a = self._a
        r = node.row
        pl.clear_row(a, r, node.has_status)
        reservations = [self._reservations[u] for u in sorted(self._by_node.get(node.name, ()))]
        cpu_used = sum(c for c, _ in node.pods.values())
        mem_used = sum(m for _, m in node.pods.values())
        for res in reservations:
            if res.uid not in node.pods:
                cpu_used += res.cpu_millis
                mem_used += res.memory_bytes
        pl.set_host(a, r, np.inf if node.cpu_alloc is None else node.cpu_alloc - cpu_used,
                    np.inf if node.mem_alloc is None else node.mem_alloc - mem_used)
        occupants: dict[int, list[pl.Occupant]] = {}
        self._shared_off[:, r] = False
        self._dom[:, r] = -1
        for slot, gpu in enumerate(node.gpus):
            self._shared_off[slot, r] = gpu.no_constants is not None
        if self._shared_off[:, r].any():
            self._no_constants_nodes.add(node.name)
        else:
            self._no_constants_nodes.discard(node.name)
        for slot, gpu in enumerate(node.gpus):
            running = [(j.end, j.bytes, j.profile.sm_util, j.profile.mem_util) for j in gpu.running]
            classes = [j.intensity for j in gpu.running]
            occ = [pl.Occupant(j.job, j.apart, j.end) for j in gpu.running if j.job is not None or j.apart]
            # the trust-domain rule's figures of this GPU (see _domain_cells)
            doms = {j.domain for j in gpu.running if j.domain is not None}
            dom_end = max([j.end for j in gpu.running if j.domain is not None], default=0.0)
            used = gpu.committed
            qbytes = sum(j.bytes for j in gpu.queued)
            qsecs = sum(j.seconds for j in gpu.queued)
            clients = len(gpu.running) + len(gpu.queued)
            for res in reservations:
                if res.gpu != gpu.index:
                    continue
                clients += 1
                if res.job is not None or res.apart:
                    occ.append(pl.Occupant(res.job, res.apart, res.at + res.runtime))
                res_domain = self.domains.of(res.namespace)
                if res_domain is not None:
                    doms.add(res_domain)
                    dom_end = max(dom_end, res.at + res.runtime)
                if res.immediate:
                    profile = self.interference.profile_for(res.intensity)
                    used += res.bytes
                    running.append((res.at + res.runtime, res.bytes, profile.sm_util, profile.mem_util))
                    classes.append(res.intensity)
                else:
                    qbytes += res.bytes
                    qsecs += res.runtime
            pl.set_gpu(
                a, slot, r, capacity=gpu.capacity, used=used,
                healthy=gpu.healthy and gpu.mps_healthy and node.node_mps_healthy, clients=clients,
                max_clients=gpu.max_clients, qbytes=qbytes, qsecs=qsecs, running=running,
                learned=pl.learned_factors(node.learned.get(gpu.model, {}), classes),
            )
            if occ:
                occupants[slot] = occ
            self._dom[slot, r] = (-1 if not doms else self._domain_id(doms.pop()) if len(doms) == 1
                                  else MIXED_DOMAINS)
            self._dom_end[slot, r] = dom_end
        self._index_occupants(node, occupants)
        self._derive(slice(r, r + 1))
        self.version += 1

    def _index_occupants(self, node: _Node, occupants: dict[int, list[pl.Occupant]]) -> None:
        """Keep the apart rule's index in step with ``node``'s clients."""
        jobs = {o.job for occ in occupants.values() for o in occ if o.job is not None}
        for job in node.jobs - jobs:
            names = self._job_nodes.get(job)
            if names is not None:
                names.discard(node.name)
                if not names:
                    del self._job_nodes[job]
        for job in jobs - node.jobs:
            self._job_nodes.setdefault(job, set()).add(node.name)
        node.jobs = jobs
        node.occupants = occupants
        if any(o.apart for occ in occupants.values() for o in occ):
            self._apart_nodes.add(node.name)
        else:
            self._apart_nodes.discard(node.name)

    def _blocked(self, demand: PodDemand) -> dict[tuple[int, int], float]:
        """``(slot, row)`` of every GPU the pod may not join now under the apart rule (``pl.apart_blocked``), with
        when its last peer is predicted to leave. Empty at once for a pod nobody is kept apart from (most pods)."""
        names: set[str] = set()
        for job in demand.apart:
            names |= self._job_nodes.get(job, set())
        if demand.job is not None:
            names |= self._apart_nodes
        if not names:
            return {}
        cells = ((
            (slot, node.row), occ) for node in map(self._nodes.__getitem__, sorted(names))
            for slot, occ in node.occupants.items()
        )
        return pl.apart_blocked(demand.job, demand.apart, cells)

    def _domain_id(self, domain: str) -> int:
        got = self._domain_ids.get(domain)
        if got is None:
            got = self._domain_ids[domain] = len(self._domain_ids)
        return got

    def _domain_cells(self, demand: PodDemand) -> tuple[np.ndarray, np.ndarray] | None:
        """The trust-domain rule (``gnnsched.trust.domain``; ``pl.domain_blocked``): ``(mask, leave)`` over every
        ``(gpus, rows)`` cell, the GPUs holding a client or reservation of a domain the pod may not share with and
        when those are predicted to leave; None when no GPU is blocked (one domain on the cluster, or ``cluster``).
        Caller holds the lock."""
        domain = self.domains.of(demand.namespace)
        if domain is None or not self._domain_ids or (len(self._domain_ids) == 1 and domain in self._domain_ids):
            return None
        mask = pl.domain_blocked(self._dom, self._domain_ids.get(domain, -1))
        if not mask.any():
            return None
        return mask, self._dom_end

    def _derive(self, rows: slice) -> None:
        """Pod-independent per-GPU figures the hot path starts from, for the node rows ``rows``."""
        pl.derive(self._a, rows, self._above, self.interference)

    # ------------------------------------------------------------------ updates from the cluster

    def upsert_gpunode(self, status: GPUNodeStatus, now: float | None = None) -> None:
        """Apply a node agent's ``GPUNode`` status; drops reservations of the pods it now reports."""
        now = self.clock() if now is None else now
        updated = status.updated_at.timestamp() if status.updated_at is not None else now
        with self.lock:
            node = self._node(status.node_name)
            node.has_status = True
            node.node_mps_healthy = status.mps.healthy
            gpus = []
            reported: set[str] = set()
            for g in status.gpus:
                gpu = _GPU(
                    index=g.index, uuid=g.uuid, model=g.model, total=g.total_bytes, reserve=g.reserve_bytes,
                    committed=g.committed_bytes, healthy=g.healthy, mps_healthy=g.mps_healthy,
                    max_clients=g.max_clients, no_constants=missing_constants(g.model, g.measured, g.catalogued),
                )
                for j in g.running:
                    secs = j.predicted_remaining_seconds or 0.0
                    prof = self.interference.profile_for(j.intensity)
                    gpu.running.append(_Job(j.pod_uid, j.bytes, updated + secs, secs, prof, j.job,
                                            frozenset(j.fault_peers), self.domains.of(j.namespace), j.intensity))
                    reported.add(j.pod_uid)
                for j in g.queued:
                    secs = j.predicted_remaining_seconds or 0.0
                    prof = self.interference.profile_for(j.intensity)
                    gpu.queued.append(_Job(j.pod_uid, j.bytes, math.inf, secs, prof))
                    reported.add(j.pod_uid)
                gpus.append(gpu)
            node.gpus = sorted(gpus, key=lambda x: x.index)
            node.reported = reported
            node.learned = factor_book(status.learned_slowdowns)
            for uid in list(self._by_node.get(node.name, ())):
                if uid in reported:
                    self._drop(uid, refresh=False)
            self._sizes_dirty = True
            self._refresh(node)

    def remove_gpunode(self, name: str) -> None:
        with self.lock:
            node = self._nodes.get(name)
            if node is not None:
                node.has_status = False
                node.gpus = []
                node.reported = set()
                self._sizes_dirty = True
                self._refresh(node)

    def upsert_node(self, name: str, cpu_alloc_millis: int | None, mem_alloc_bytes: int | None) -> None:
        """Apply a ``Node``'s allocatable CPU and memory."""
        with self.lock:
            node = self._node(name)
            node.cpu_alloc = cpu_alloc_millis
            node.mem_alloc = mem_alloc_bytes
            self._refresh(node)

    def upsert_pod(self, pod: dict, *, deleted: bool = False) -> None:
        """Track a pod: its requests on its node, and its reservation annotation (rebuild after restart), read
        through :meth:`trusted` (its runtime, intensity and fault peers only as its GNNJob's status states them)."""
        pod = self.trusted(pod)[0]
        meta = pod.get("metadata") or {}
        uid = meta.get("uid")
        if not uid:
            return
        spec = pod.get("spec") or {}
        phase = (pod.get("status") or {}).get("phase")
        node_name = spec.get("nodeName")
        finished = deleted or phase in ("Succeeded", "Failed") or meta.get("deletionTimestamp") is not None
        with self.lock:
            touched: set[str] = set()
            old = self._pod_node.get(uid)
            if old is not None and (finished or old != node_name):
                self._nodes[old].pods.pop(uid, None)
                del self._pod_node[uid]
                touched.add(old)
            if finished:
                if uid in self._reservations:
                    touched.add(self._reservations[uid].node)
                    self._drop(uid, refresh=False)
            else:
                if node_name:
                    try:
                        req = pod_resources(pod)
                    except PodError:
                        req = (0, 0)
                    n = self._node(node_name)
                    n.pods[uid] = req
                    self._pod_node[uid] = node_name
                    touched.add(node_name)
                ann = (meta.get("annotations") or {}).get(ANN_RESERVATION)
                if ann and uid not in self._reservations:
                    res = reservation_from_pod(pod, self.interference)
                    if res is not None and not self._is_reported(res) \
                            and reservation_counts(res, node_name, self.clock(), self.reservation_ttl):
                        self._add_reservation(res, replay=True)
                        touched.add(res.node)
            for name in touched:
                if name in self._nodes:
                    self._refresh(self._nodes[name])

    def rebuild(self, pods: Iterable[dict]) -> int:
        """Rebuild reservations from pods (initial list after a restart), replaying them in ``at`` order."""
        pods = list(pods)
        with_res = []
        for pod in pods:
            res = reservation_from_pod(self.trusted(pod)[0], self.interference)
            if res is None:
                self.upsert_pod(pod)
            else:
                with_res.append((res.at, res.uid, pod))
        for _, _, pod in sorted(with_res, key=lambda t: (t[0], t[1])):
            self.upsert_pod(pod)
        with self.lock:
            return len(self._reservations)

    # ------------------------------------------------------------------ reservations

    def _is_reported(self, res: Reservation) -> bool:
        node = self._nodes.get(res.node)
        return node is not None and res.uid in node.reported

    def _expired(self, res: Reservation, now: float) -> bool:
        return now - res.at > self.reservation_ttl

    def _add_reservation(self, res: Reservation, *, replay: bool) -> None:
        if replay:
            # Re-decide immediate vs queued on the current state, as the original bind did.
            node = self._nodes.get(res.node)
            if node is not None and node.has_status:
                r, slots = node.row, {g.index: s for s, g in enumerate(node.gpus)}
                s = slots.get(res.gpu)
                if s is not None:
                    free = self._a["cap"][s, r] - self._a["used"][s, r]
                    res.immediate = bool(free >= res.bytes and self._a["qbytes"][s, r] == 0)
        self._reservations[res.uid] = res
        self._by_node.setdefault(res.node, set()).add(res.uid)

    def _drop(self, uid: str, *, refresh: bool = True) -> Reservation | None:
        res = self._reservations.pop(uid, None)
        if res is not None:
            uids = self._by_node.get(res.node)
            if uids is not None:
                uids.discard(uid)
            if refresh and res.node in self._nodes:
                self._refresh(self._nodes[res.node])
        return res

    def release(self, uid: str) -> None:
        """Forget a reservation (the Binding failed)."""
        with self.lock:
            self._drop(uid)

    def expire(self, now: float | None = None) -> int:
        """Drop reservations older than the TTL; returns how many were dropped."""
        now = self.clock() if now is None else now
        with self.lock:
            old = [u for u, r in self._reservations.items() if self._expired(r, now)]
            for uid in old:
                self._drop(uid)
            return len(old)

    def reservations(self) -> list[Reservation]:
        with self.lock:
            return sorted(self._reservations.values(), key=lambda r: (r.at, r.uid))

    def reservation_counts(self) -> tuple[int, int]:
        with self.lock:
            imm = sum(1 for r in self._reservations.values() if r.immediate)
            return imm, len(self._reservations) - imm

    # ------------------------------------------------------------------ queries

    @property
    def node_count(self) -> int:
        return len(self._names)

    def index_of(self, names: list[str]) -> np.ndarray:
        """Row of each name (-1 for names the cache does not know). ``TypeError`` if a name is unhashable."""
        return np.fromiter(map(self._row.get, names, repeat(-1)), dtype=np.int64, count=len(names))

    def name_of(self, row: int) -> str:
        return self._names[row]

    def refresh_size_mix(self, force: bool = False) -> bool:
        """Recompute the job-size mix of the fragmentation term from the jobs the agents report.

        Called at start-up and by the maintenance loop (not per request: at 5,000 agents the mix would be
        dirty at every call). Returns whether it changed anything.
        """
        with self.lock:
            if not (self._sizes_dirty or force):
                return False
            sizes = [j.bytes for n in self._nodes.values() for g in n.gpus for j in (*g.running, *g.queued)]
            self._above = pl.size_table(sizes)
            self._sizes_dirty = False
            self._derive(slice(0, len(self._names)))
            self.version += 1
            return True

    def max_capacity(self) -> float:
        """Largest capacity after reserve over every GPU the cluster has (healthy or not); cached per version."""
        with self.lock:
            return self._max_capacity()

    def _max_capacity(self) -> float:
        if self._max_cap[0] != self.version:
            a = self._a
            caps = np.where(a["valid"], a["cap"], 0)
            self._max_cap = (self.version, float(caps.max()) if caps.size else 0.0)
        return self._max_cap[1]

    def _views(self) -> dict[str, np.ndarray]:
        """All allocated rows (contiguous; unused rows are never usable: capu = -1, known = False)."""
        return self._a

    def filter(
        self,
        demand: PodDemand,
        rows: np.ndarray,
        cpu_free_override: np.ndarray | None = None,
        mem_free_override: np.ndarray | None = None,
    ) -> FilterOutcome:
        """Which candidate rows can ever hold the pod, and a user-actionable reason for each that cannot.

        Evaluated over every node's contiguous rows (cheaper than gathering the candidates' rows first), then
        picked out for the candidates. Under the apart rule (``pl.apart_filter``) a node whose every GPU that can
        hold the pod runs one of its fault peers fails too, but only while another candidate passes clear of them.
        """
        if cpu_free_override is not None and mem_free_override is None:
            raise ValueError("cpu_free_override and mem_free_override go together")
        with self.lock:
            a = self._views()
            b = float(demand.gpu_bytes)
            good = pl.fit_mask(a, b)
            fits_any = good
            if self._no_constants_nodes and not demand.exclusive:
                good = good & ~self._shared_off  # the exclusive-only rule: no shared pod on a GPU without constants
            known_row = rows >= 0
            r = np.where(known_row, rows, 0)

            def passing(gpus_ok: np.ndarray) -> np.ndarray:
                if cpu_free_override is None:
                    node_ok = pl.node_filter(a, gpus_ok, demand.cpu_millis, demand.memory_bytes)
                else:
                    node_ok = pl.node_filter(a, gpus_ok, None, None)
                out = known_row & node_ok[r] if len(node_ok) else np.zeros(len(rows), dtype=bool)
                if cpu_free_override is not None and mem_free_override is not None:
                    out &= (cpu_free_override >= demand.cpu_millis) & (mem_free_override >= demand.memory_bytes)
                return out

            ok = passing(good)
            failed = np.flatnonzero(~ok)
            cluster_max = self._max_capacity()
            unresolvable = cluster_max < b
            reasons = self._reasons(demand, rows, failed, good, cpu_free_override, mem_free_override, cluster_max,
                                    fits_any)
            blocked = self._blocked(demand) if ok.any() else {}
            domain_cells = self._domain_cells(demand) if ok.any() else None
            if blocked or domain_cells is not None:
                clear_good = good.copy()
                if blocked:
                    slots, brows = zip(*blocked, strict=True)
                    clear_good[list(slots), list(brows)] = False
                if domain_cells is not None:
                    clear_good &= ~domain_cells[0]  # the trust-domain rule, as the apart rule's blocked GPUs
                ok, refused = pl.apart_filter(ok, passing(clear_good))
                if refused.any():
                    whom = (f"one of its fault peers ({', '.join(sorted(demand.apart))})" if demand.apart
                            else f"a job whose fault peers list {demand.job}")
                    peers = (R_FAULT_PEERS, f"every GPU here that can hold the pod runs {whom}: after an undecided "
                             "MPS fault they must not share a GPU, and another node has one clear of them")
                    other = (R_TRUST_DOMAIN, "every GPU here that can hold the pod runs pods of another trust domain "
                             f"than its own ({self.domains.of(demand.namespace)}; --trust-domain "
                             f"{self.domains.setting}): MPS clients of one GPU are not isolated from each other, "
                             "and another node has a GPU clear of them")
                    apart_rows = {row for _, row in blocked}
                    for i in np.flatnonzero(refused).tolist():
                        reasons[i] = peers if int(rows[i]) in apart_rows else other
            return FilterOutcome(passed=ok, reasons=reasons, unresolvable=unresolvable)

    def _reasons(
        self, d: PodDemand, rows: np.ndarray, failed: np.ndarray, good: np.ndarray,
        cpu_override: np.ndarray | None, mem_override: np.ndarray | None, cluster_max: float,
        fits_any: np.ndarray | None = None,
    ) -> dict[int, tuple[str, str]]:
        """A reason per failed candidate. Classified with array operations over the failed nodes and formatted
        once per distinct message: a pod that fits nowhere fails on all 5,000 nodes at once."""
        if not failed.size:
            return {}
        a = self._a
        need = format_bytes(d.gpu_bytes)
        fr = rows[failed]
        unknown = fr < 0
        frc = np.where(unknown, 0, fr)
        has_status = a["known"][frc] & ~unknown
        valid = a["valid"][:, frc]
        healthy = a["healthy"][:, frc] & valid
        # per failed node, as Python lists: the loop below indexes them once per node
        n_valid: list[int] = valid.sum(axis=0).tolist()
        any_healthy: list[bool] = np.asarray(healthy.any(axis=0)).tolist()
        any_fits: list[bool] = np.asarray((healthy & (a["cap"][:, frc] >= d.gpu_bytes)).any(axis=0)).tolist()
        any_good: list[bool] = np.asarray(good[:, frc].any(axis=0)).tolist()
        # a node whose GPUs could take the pod but for the exclusive-only rule (all of them lack constants)
        only_unknown: list[bool] = (
            np.asarray((fits_any[:, frc] & ~good[:, frc]).any(axis=0) & ~good[:, frc].any(axis=0)).tolist()
            if fits_any is not None and fits_any is not good else [False] * len(frc))
        largest = np.where(healthy, a["cap"][:, frc], -1.0).max(axis=0).tolist()
        cpu_free = (a["cpu_free"][frc] if cpu_override is None else cpu_override[failed]).tolist()
        mem_free = (a["mem_free"][frc] if mem_override is None else mem_override[failed]).tolist()
        memo: dict[tuple, tuple[str, str]] = {}

        # Each message is formatted once per distinct argument tuple: say(make, *args) calls make(*args) only on a
        # miss. The makers take what varies per node as arguments, so nothing reads a loop variable later.
        def say(make: Callable[..., tuple[str, str]], *args: Any) -> tuple[str, str]:
            key = (make, *args)
            hit = memo.get(key)
            if hit is None:
                hit = memo[key] = make(*args)
            return hit

        def unknown_node() -> tuple[str, str]:
            return R_UNKNOWN, (
                "node is not in the gnnsched cache (no GPUNode status: is the gnnsched node agent running there?)"
            )

        def no_status() -> tuple[str, str]:
            return R_UNKNOWN, "node has no GPUNode status (is the gnnsched node agent running there?)"

        def no_gpu() -> tuple[str, str]:
            return R_NO_GPU, "node agent reports no GPUs on this node"

        def too_big() -> tuple[str, str]:
            return R_GPU_MEMORY, (
                f"job needs {need} on one GPU; the largest GPU in the cluster has {format_bytes(cluster_max)} "
                "after reserve (no node can ever run it: lower the batch size, use mini-batching or a larger GPU)"
            )

        def mps_down(nv: int) -> tuple[str, str]:
            return R_UNHEALTHY, f"MPS daemon unhealthy on this node ({nv} GPUs unusable)"

        def all_sick(nv: int) -> tuple[str, str]:
            return R_UNHEALTHY, f"none of the node's {nv} GPUs is healthy with a healthy MPS server"

        def gpu_small(label: str, big: float) -> tuple[str, str]:
            return R_GPU_MEMORY, (
                f"largest healthy GPU ({label}) has {format_bytes(big)} after reserve; job needs {need}"
            )

        def no_constants(label: str, why: str) -> tuple[str, str]:
            what = ("its node measured a CUDA allocator gnnsched cannot model" if why == ALLOCATOR_MISMATCH
                    else "it is not in gnnsched's catalogue and its node has not measured its device constants")
            return R_NO_CONSTANTS, (
                f"every GPU here that can hold {need} ({label}) takes only pods that run alone: {what} "
                f"({why}); a shared pod goes there once the node publishes measured constants"
            )

        def clients_full() -> tuple[str, str]:
            return R_CLIENTS, f"every GPU that can hold {need} already has its maximum number of MPS clients"

        def cpu_short(c: float) -> tuple[str, str]:
            return R_CPU, f"node has {max(c, 0) / 1000:g} CPU unclaimed; pod requests {d.cpu_millis / 1000:g}"

        def memory_short(m: float) -> tuple[str, str]:
            return R_MEMORY, (
                f"node has {format_bytes(max(m, 0))} memory unclaimed; pod requests {format_bytes(d.memory_bytes)}"
            )

        if cluster_max < d.gpu_bytes and has_status.all():  # fits nowhere: one message for every node
            return dict.fromkeys(failed.tolist(), too_big())
        out: dict[int, tuple[str, str]] = {}
        for k, (i, unk, status) in enumerate(zip(failed.tolist(), unknown.tolist(), has_status.tolist(), strict=True)):
            if unk:
                out[i] = say(unknown_node)
            elif not status:
                out[i] = say(no_status)
            elif not n_valid[k]:
                out[i] = say(no_gpu)
            elif cluster_max < d.gpu_bytes:
                out[i] = say(too_big)
            elif not any_healthy[k]:
                node = self._nodes[self._names[int(fr[k])]]
                out[i] = say(mps_down if not node.node_mps_healthy else all_sick, n_valid[k])
            elif not any_fits[k]:
                node = self._nodes[self._names[int(fr[k])]]
                out[i] = say(gpu_small, ", ".join(sorted({g.model for g in node.gpus})), largest[k])
            elif only_unknown[k]:
                node = self._nodes[self._names[int(fr[k])]]
                dark = [g for g in node.gpus if g.no_constants is not None]
                out[i] = say(no_constants, ", ".join(sorted({g.model for g in dark})),
                             dark[0].no_constants if dark else "")
            elif not any_good[k]:
                out[i] = say(clients_full)
            elif cpu_free[k] < d.cpu_millis:
                out[i] = say(cpu_short, cpu_free[k])
            else:
                out[i] = say(memory_short, mem_free[k])
        return out

    def _cost_matrix(self, demand: PodDemand, now: float) -> np.ndarray:
        """Cost of placing the pod on every GPU slot of every allocated row, ``(gpus, rows)``; ``inf`` where
        the GPU cannot take it. Caller holds the lock."""
        if self._sizes_dirty and len(self._above) <= 1:
            self.refresh_size_mix()  # first use only; afterwards the maintenance loop refreshes it
        big_r = demand.runtime_seconds if demand.runtime_seconds > 0 else DEFAULT_RUNTIME_SECONDS
        cost = pl.cost_matrix(self._a, demand.gpu_bytes, big_r, demand.intensity, now, self._above)
        if self._no_constants_nodes and not demand.exclusive:
            cost[self._shared_off] = np.inf  # the exclusive-only rule, as in ``filter``
        return cost

    def costs(self, demand: PodDemand, rows: np.ndarray, now: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Per candidate row: the best GPU slot and its cost (``inf`` when no GPU of the node can take the pod).

        See :mod:`gnnsched.placement` for the formula. Evaluated over all rows at once (contiguous arrays, no
        gathers) from the pod-independent arrays ``_derive`` keeps; the wait term only where a GPU must wait.
        """
        now = self.clock() if now is None else now
        with self.lock:
            cost = self._cost_matrix(demand, now)
            apart = self._apart_costs(demand, cost, rows, now)
        if apart is not None:
            return pl.best_gpu(apart, np.arange(len(rows)))
        return pl.best_gpu(cost, rows)

    def _apart_costs(self, demand: PodDemand, cost: np.ndarray, rows: np.ndarray, now: float) -> np.ndarray | None:
        """The candidates' cost columns ``(gpus, len(rows))`` under the apart rule (``pl.apart_costs``,
        ``pl.apart_ranked``) and the trust-domain rule (``pl.blocked_costs``: the same ranking, over arrays); None
        when neither blocks a GPU for this pod. Caller holds the lock."""
        blocked = self._blocked(demand)
        domain_cells = self._domain_cells(demand)
        if not blocked and domain_cells is None:
            return None
        known_row = rows >= 0
        r = np.where(known_row, rows, 0)
        sub = cost[:, r]
        sub[:, ~known_row] = np.inf
        big_r = demand.runtime_seconds if demand.runtime_seconds > 0 else DEFAULT_RUNTIME_SECONDS
        if domain_cells is None:
            cols: dict[int, list[int]] = {}
            for i, row in enumerate(rows.tolist()):
                cols.setdefault(row, []).append(i)
            cells = {(slot, i): leave for (slot, row), leave in blocked.items() for i in cols.get(row, ())}
            return pl.apart_ranked(*pl.apart_costs(sub, cells, big_r, now))
        mask = domain_cells[0][:, r]
        mask[:, ~known_row] = False
        leave = np.where(mask, domain_cells[1][:, r], -np.inf)
        if blocked:  # a fault peer's GPU too: blocked until the later of the two leaves
            where = {row: np.flatnonzero(r == row) for row in {row for _, row in blocked}}
            for (slot, row), when in blocked.items():
                idx = where[row][known_row[where[row]]]
                mask[slot, idx] = True
                leave[slot, idx] = np.maximum(leave[slot, idx], when)
        return pl.apart_ranked(*pl.blocked_costs(sub, mask, leave, big_r, now))

    def score(self, demand: PodDemand, rows: np.ndarray, now: float | None = None) -> np.ndarray:
        """0..10 per candidate row; the best candidate gets 10, a node twice as costly 5, unusable nodes 0. Under the
        apart rule a node whose GPUs all run the pod's fault peers scores 0 while another candidate is clear."""
        now = self.clock() if now is None else now
        with self.lock:
            cost = self._cost_matrix(demand, now)
            apart = self._apart_costs(demand, cost, rows, now)
            best_all = np.minimum.reduce(cost, axis=0) if apart is None else None
        if len(rows) == 0:
            return np.zeros(0, dtype=np.int64)
        if apart is not None:
            return pl.normalise_scores(np.minimum.reduce(apart, axis=0))
        assert best_all is not None
        best = best_all[rows]
        best[rows < 0] = np.inf
        return pl.normalise_scores(best)

    # ------------------------------------------------------------------ bind

    def reserve(self, demand: PodDemand, node_name: str, now: float | None = None) -> Reservation:
        """Choose the GPU on ``node_name`` and reserve it for the pod, atomically with the capacity check.

        Raises ``BindError`` when the node is unknown or can no longer hold the pod.
        """
        now = self.clock() if now is None else now
        with self.lock:
            node = self._nodes.get(node_name)
            if node is None or not node.has_status:
                raise BindError(f"node {node_name} is not in the gnnsched cache (no GPUNode status)")
            previous = self._drop(demand.uid) if demand.uid in self._reservations else None
            rows = np.array([node.row])
            outcome = self.filter(demand, rows)
            if not outcome.passed[0]:
                if previous is not None:
                    self._add_reservation(previous, replay=False)
                    self._refresh(node)
                _, msg = outcome.reasons[0]
                raise BindError(f"node {node_name} cannot take pod {demand.key}: {msg}")
            slot, _ = self.costs(demand, rows, now)
            s = int(slot[0])
            a = self._a
            free = a["cap"][s, node.row] - a["used"][s, node.row]
            immediate = bool(free >= demand.gpu_bytes and a["qbytes"][s, node.row] == 0)
            res = Reservation(
                uid=demand.uid, namespace=demand.namespace, name=demand.name, node=node_name,
                gpu=node.gpus[s].index, bytes=demand.gpu_bytes, at=now, runtime=demand.runtime_seconds,
                intensity=demand.intensity, immediate=immediate, cpu_millis=demand.cpu_millis,
                memory_bytes=demand.memory_bytes, job=demand.job, apart=demand.apart,
            )
            self._add_reservation(res, replay=False)
            self._refresh(node)
            return res

    def gpu_usage(self, node_name: str) -> list[dict[str, float]]:
        """Per GPU of a node: capacity, bytes in use (agent + immediate reservations), queued bytes, clients."""
        with self.lock:
            node = self._nodes[node_name]
            a, r = self._a, node.row
            return [
                {
                    "index": g.index, "capacity": float(a["cap"][s, r]), "used": float(a["used"][s, r]),
                    "queued": float(a["qbytes"][s, r]), "clients": int(a["clients"][s, r]),
                }
                for s, g in enumerate(node.gpus)
            ]


def reservation_counts(res: Reservation, node_name: str | None, now: float, ttl: float) -> bool:
    """Whether a reservation read back from a pod's ``gnnsched.io/reservation`` annotation counts against its GPU.

    The rule (issue 39, finding 3): it counts only for a pod whose ``spec.nodeName`` is the reservation's node, and
    only while its ``at`` is past and unexpired: ``at <= now + RESERVATION_CLOCK_SKEW`` and ``now - at <= ttl``.

    Why: the annotation is on the pod, and whoever can create or patch a pod can write it. The extender writes it
    when it binds the pod, so an honest one names the node the pod is bound to and a time before now; once its TTL
    is past the node agent's own report has taken over (or the pod never arrived). A hand-written one on a pod that
    is never bound, with an ``at`` in the future, used to count for ever (``now - at`` never exceeded the TTL) and
    dropped a node's score for everyone; one with an ``at`` far ahead would count until that time. Neither does now:
    an unbound pod, a pod bound elsewhere, and a future ``at`` (beyond the clock skew allowed between extender
    replicas) each make it count for nothing. The extender's own reservations, made at bind, are kept in memory and
    do not go through this rule."""
    return node_name == res.node and res.at <= now + RESERVATION_CLOCK_SKEW and now - res.at <= ttl


def reservation_from_pod(pod: dict, interference: SlowdownModel | None = None) -> Reservation | None:
    """The reservation recorded on a pod's ``gnnsched.io/reservation`` annotation, or None if absent/invalid."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    raw = annotations.get(ANN_RESERVATION)
    if not raw or not meta.get("uid"):
        return None
    try:
        data = json.loads(raw)
        node = str(data["node"])
        gpu = int(data["gpu"])
        nbytes = int(data["bytes"])
        at = datetime.fromisoformat(str(data["at"]).replace("Z", "+00:00")).timestamp()
    except (ValueError, KeyError, TypeError):
        return None
    if nbytes <= 0 or gpu < 0:
        return None
    try:
        runtime = float(annotations.get(ANN_PREDICTED_RUNTIME, DEFAULT_RUNTIME_SECONDS))
        if not math.isfinite(runtime) or runtime <= 0:
            runtime = DEFAULT_RUNTIME_SECONDS
    except (TypeError, ValueError):
        runtime = DEFAULT_RUNTIME_SECONDS
    intensity = annotations.get(ANN_INTENSITY)
    if intensity not in ("memory", "compute"):
        intensity = None
    try:
        cpu, mem = pod_resources(pod)
    except PodError:
        cpu, mem = 0, 0
    namespace, name = meta.get("namespace") or "default", meta.get("name") or ""
    job, apart = pod_apart(meta, namespace, name)
    return Reservation(
        uid=meta["uid"], namespace=namespace, name=name, node=node,
        gpu=gpu, bytes=nbytes, at=at, runtime=runtime, intensity=intensity, immediate=True, cpu_millis=cpu,
        memory_bytes=mem, job=job, apart=apart,
    )


def node_allocatable(node: dict) -> tuple[int | None, int | None]:
    """A ``v1.Node``'s allocatable CPU (millicores) and memory (bytes); None where absent or unreadable."""
    alloc = ((node.get("status") or {}).get("allocatable")) or {}
    cpu = mem = None
    try:
        if "cpu" in alloc:
            cpu = int(math.floor(parse_quantity(alloc["cpu"]) * 1000))
    except (ValueError, ArithmeticError):
        cpu = None
    try:
        if "memory" in alloc:
            mem = parse_bytes(alloc["memory"])
    except (ValueError, ArithmeticError):
        mem = None
    return cpu, mem


__all__ = [
    "BindError",
    "ClusterCache",
    "FilterOutcome",
    "PodDemand",
    "Reservation",
    "W_FRAG",
    "node_allocatable",
    "parse_pod",
    "reservation_counts",
    "reservation_from_pod",
]
