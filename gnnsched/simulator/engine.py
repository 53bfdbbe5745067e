"""The discrete-event engine: arrivals, placement, node queues, co-location, completion, OOM and retries.

One :class:`Simulation` replays one workload on one cluster under one policy. Time advances from event to event
(arrivals, completions, retries, the horizon); all events at the same instant are applied before anyone schedules,
so a batch that arrives together is grouped together (the papers' queues arrive as batches).

A running job's progress is *work* in solo-seconds: it advances at ``1 / slowdown``, where the slowdown comes from
the interference model (co-location) and, for MPS with UVM, from paging (:mod:`gnnsched.simulator.costs`). When the
set of jobs on a GPU changes, only that GPU's jobs are re-rated and get fresh completion events; stale events are
recognised by a per-run token and dropped, so the cost of an event is O(jobs on one GPU), not O(cluster).

All decisions that gnnsched makes in a real cluster are delegated to :class:`gnnsched.simulator.adapters.Integrations`
(the estimator, the runtime prior, ``scale()``, the interference model, the extender's filter and score, the node
agent's grouping policy and the gate invariant); the engine only keeps the books.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from gnnsched import queue_order
from gnnsched.attempts.checkpointing import runtime_sample_share
from gnnsched.colocation.interference import load_default as load_interference
from gnnsched.gpu.catalogue import get_gpu_model
from gnnsched.progress import StepProgress
from gnnsched.simulator import kube_scores
from gnnsched.simulator.cluster import ClusterSpec, NodeSpec
from gnnsched.simulator.coloc_loop import ColocLoop
from gnnsched.simulator.costs import STARTUP_S, host_link, uvm_slowdown
from gnnsched.simulator.faults import APP_FAULT_XID, HW_FAULT_XID, QUARANTINE_S, HardwareFaultClock, LoopBooks
from gnnsched.simulator.model import JobOutcome, SimJob
from gnnsched.simulator.policyspec import PolicySpec
from gnnsched.simulator.runtime_loop import RuntimeLoop
from gnnsched.trust.domain import DEFAULT_TRUST_DOMAIN, DomainResolver, mixed

if TYPE_CHECKING:  # adapters imports this module's state classes at run time
    from gnnsched.simulator.adapters import Integrations

ARRIVE, FINISH, RETRY, STARTED = 0, 1, 2, 3
# the closed loop's events (gnnsched.simulator.faults): a hardware fault on a GPU, an attempt's first step passing its
# MPS memory limit, the end of a faulted GPU's quarantine (or repair), and a buggy job's own application fault
FAULT, MEM_EXCEEDED, QUARANTINE_END, APP_FAULT = 4, 5, 6, 7
# probation (gnnsched.attempts.probation): an attempt admitted alone passing its probation step (its GPU takes others)
PROBATION_END = 8
MPS_BASE_CLIENTS = 4
BACKOFF_S = 10.0
BACKOFF_MAX_S = 360.0
MAX_FAILED_PLACEMENTS = 64


class GpuState:
    """One GPU's books: what runs on it, what waits for it, its memory."""

    __slots__ = ("gid", "node", "index", "model", "total", "reserve", "running", "waiting", "used", "committed",
                 "sm_now", "mem_now", "bandwidth", "link", "max_clients", "free_view", "quarantine_until",
                 "fault_clock")

    def __init__(self, gid: int, node: NodeState, index: int, model: str, reserve: int) -> None:
        gm = get_gpu_model(model)
        self.gid = gid
        self.node = node
        self.index = index
        self.model = gm.name
        self.total = gm.memory_bytes
        self.reserve = reserve
        self.running: list[Run] = []
        self.waiting: list[SimJob] = []
        self.used = 0
        self.committed = 0
        self.sm_now = 0.0
        self.mem_now = 0
        self.bandwidth = gm.bandwidth_bytes_per_s
        self.link = host_link(gm.name)
        self.max_clients = gm.max_mps_clients
        self.free_view = None  # adapters: the last policies.GPUFree built for this GPU (immutable, reused)
        # the closed loop: after a fatal fault the GPU admits nothing until this time; its faults' Poisson clock
        self.quarantine_until = -1.0
        self.fault_clock: HardwareFaultClock | None = None

    @property
    def free_admit_bytes(self) -> int:
        """What the gate can still admit: total - reserve - committed."""
        return self.total - self.reserve - self.committed


class NodeState:
    __slots__ = ("idx", "spec", "name", "gpus", "cpu_free", "mem_free", "queue", "bound", "queue_sizes")

    def __init__(self, idx: int, spec: NodeSpec) -> None:
        self.idx = idx
        self.spec = spec
        self.name = spec.name
        self.gpus: list[GpuState] = []
        self.cpu_free = spec.cpu_milli
        self.mem_free = spec.memory_bytes
        self.queue: list[SimJob] = []
        self.bound = 0  # pods bound to the node and not finished (queued at the gate or running)
        self.queue_sizes: dict[int, int] = {}  # admit bytes -> queued jobs of that size (gnnsched: the gate queue)


class Run:
    """A job on a GPU: first its process start-up (host work: no GPU contention either way), then its GPU work."""

    __slots__ = ("job", "gpu", "remaining", "rate", "last", "token", "slowdown", "starting", "placement_entry",
                 "out", "sm_util", "intensity", "admit_bytes", "killed", "startup_s", "gate_client", "work",
                 "report", "solo_full", "truth_class", "held")

    def __init__(self, job: SimJob, gpu: GpuState, work: float, now: float, starting: bool,
                 out: JobOutcome) -> None:
        self.job = job
        self.out = out  # the job's outcome record (read at every re-rating)
        prof = job.profile(gpu.model)
        self.sm_util = prof.sm_util
        self.intensity = prof.intensity
        self.truth_class = prof.job_class if prof.job_class is not None else prof.intensity  # adapters._truth_class
        self.admit_bytes = prof.admit_bytes
        self.gpu = gpu
        self.remaining = work
        self.rate = 1.0
        self.last = now
        self.token = 0
        self.slowdown = 1.0
        self.starting = starting
        self.placement_entry: tuple | None = None  # adapters.PlacementView's (end, bytes, sm, mem) of this run
        self.killed = False  # the attempt ended before completing (fault, memory exceeded): its events are void
        self.startup_s = 0.0  # start-up this attempt still paid after its admission (Simulation._startup)
        # adapters.next_group: (intensity, predicted end) as the gate knows this client (policies.predicted_end)
        self.gate_client: tuple[str | None, float | None] | None = None
        self.work = work  # solo-seconds of GPU work in all (``remaining`` counts down from it)
        self.report: StepProgress | None = None  # +progress: the worker's last step report (Simulation.progress_of)
        self.solo_full = work  # solo-seconds of the whole job's steps (``work`` is less when it resumed)
        self.held = 0  # bytes it books beyond its own: the rest of its GPU while it is held alone on probation


@dataclass
class GroupRecord:
    """Memory of a GPU right after an admission: for the 'memory per group against capacity' plot."""

    t: float
    gpu: int
    jobs: int
    committed: int
    used: int
    capacity: int


@dataclass
class RunResult:
    """Everything one run produced; :mod:`gnnsched.simulator.metrics` turns it into numbers."""

    policy: str
    outcomes: list[JobOutcome]
    end_time: float
    horizon: float | None
    gpu_count: int
    gpu_mem_area: float
    gpu_mem_capacity: float
    sm_area: float
    cpu_alloc_area: float
    mem_alloc_area: float
    cpu_capacity: float
    mem_capacity: float
    idle_gpu_waiting_area: float
    waiting_time: float
    timeline: list[tuple[float, float, float, int, int]] = field(default_factory=list)
    groups: list[GroupRecord] = field(default_factory=list)
    gate_checks: int = 0
    extra: dict = field(default_factory=dict)


def feasible_nodes_to_find(n: int) -> int:
    """kube-scheduler's ``numFeasibleNodesToFind`` with the adaptive ``percentageOfNodesToScore``."""
    if n < 100:
        return n
    pct = max(5, 50 - n // 125)
    return max(100, n * pct // 100)


class Simulation:
    """One workload, one cluster, one policy."""

    def __init__(self, jobs: list[SimJob], cluster: ClusterSpec, policy: PolicySpec, integrations: Integrations,
                 *, horizon: float | None = None, max_clients: int | None = None, reserve_bytes: int = 0,
                 startup_s: float = STARTUP_S, record_timeline: bool = True,
                 progress: Callable[[int, int], None] | None = None, loop: LoopBooks | None = None,
                 trust_domain: str = DEFAULT_TRUST_DOMAIN,
                 namespace_labels: Mapping[str, Mapping[str, str]] | None = None) -> None:
        self.jobs = sorted(jobs, key=lambda j: (j.arrival, j.id))
        # The trust-domain rule (gnnsched.trust.domain), as the node agent and the extender apply it: each job's
        # domain from its namespace (and, under label:<key>, ``namespace_labels``); ``domains_mixed``: the run has
        # jobs of domains that may not share, so the gate's and the extender's views read every client's domain.
        labels = namespace_labels or {}
        resolver = DomainResolver(trust_domain, labels.get)
        self.job_domain: dict[int, str | None] = {j.id: resolver.of(j.namespace) for j in self.jobs}
        self.domains_mixed = mixed(self.job_domain.values())
        self.policy = policy
        self.base = policy.base
        # the policy's flags the per-event code tests (a frozen PolicySpec: fixed for the run; is_gnnsched is a
        # property, computed once here instead of at every event)
        self.is_gnnsched = policy.is_gnnsched
        self.uvm = policy.uvm
        self.ix = integrations
        self.horizon = horizon
        self.startup_s = startup_s
        self.record_timeline = record_timeline
        self.progress = progress
        self.nodes: list[NodeState] = []
        self.gpus: list[GpuState] = []
        for i, spec in enumerate(cluster.nodes):
            node = NodeState(i, spec)
            for g in range(spec.gpus):
                gpu = GpuState(len(self.gpus), node, g, spec.gpu_model, reserve_bytes)
                node.gpus.append(gpu)
                self.gpus.append(gpu)
            self.nodes.append(node)
        self.gpu_nodes = [n for n in self.nodes if n.gpus]
        self.max_node_cpu = max(n.spec.cpu_milli for n in self.gpu_nodes) if self.gpu_nodes else 0
        self.max_node_mem = max(n.spec.memory_bytes for n in self.gpu_nodes) if self.gpu_nodes else 0
        if not self.gpu_nodes:
            raise ValueError("cluster: no node has a GPU")
        cap = policy.max_clients or max_clients
        self.per_gpu_cap: int | None
        if self.base in ("exclusive", "srtf", "drf", "temporal"):
            self.per_gpu_cap = 1
        elif self.base == "mps-base":
            self.per_gpu_cap = policy.max_clients or MPS_BASE_CLIENTS
        else:
            self.per_gpu_cap = cap  # None: the GPU model's MPS client limit
        self.outcomes = {j.id: JobOutcome(job=j) for j in self.jobs}
        self.now = 0.0
        self.heap: list[tuple] = []
        self.seq = 0
        self.pending: dict[int, SimJob] = {}  # insertion-ordered: arrival / retry order
        # gnnsched: jobs whose waiting attempt was created because of the system's own misjudgement (a resize) or a
        # neighbour's fault (a victim); they go ahead of every other pending pod, as the operator's retry
        # PriorityClass puts them (``queue_order.RETRY``), in the order they were requeued
        self.ahead: dict[int, None] = {}
        self.pending_dirty = False
        self.queue_buckets: dict[int, int] = {}  # +sjf: job id -> runtime bucket (fixed for the job's life)
        self.queue_order = queue_order.QueueOrder(per_doubling=policy.sjf) if policy.sjf else None
        self.dirty_nodes: set[int] = set()
        self.rr = 0
        self.resolved = 0
        # integrals
        self.last_t = 0.0
        self.mem_now = 0.0
        self.sm_now = 0.0
        self.cpu_alloc_now = 0.0
        self.memh_alloc_now = 0.0
        self.idle_gpus = len(self.gpus)
        self.waiting = 0
        self.mem_area = self.sm_area = self.cpu_area = self.memh_area = 0.0
        self.idle_wait_area = self.wait_time = 0.0
        self.timeline: list[tuple[float, float, float, int, int]] = []
        self.groups: list[GroupRecord] = []
        self.running_count = 0
        self.gate_checks = 0
        self.mem_capacity = float(sum(g.total for g in self.gpus))
        # per-node arrays for vectorised feasibility (GPU-less nodes never qualify: slots stay 0)
        self.cpu_arr = np.array([n.cpu_free for n in self.nodes], dtype=np.float64)
        self.mem_arr = np.array([n.mem_free for n in self.nodes], dtype=np.float64)
        self.cpu_cap_arr = np.array([max(n.spec.cpu_milli, 1) for n in self.nodes], dtype=np.float64)
        self.mem_cap_arr = np.array([max(n.spec.memory_bytes, 1) for n in self.nodes], dtype=np.float64)
        # NodeResourcesFit's strategy in the profile that schedules this policy's pods (kube_scores.host_scores)
        self.scoring = policy.scoring_strategy
        self.slots_arr = np.zeros(len(self.nodes), dtype=np.int64)
        for node in self.gpu_nodes:
            self._refresh_slots(node)
        self.has_gpu_arr = np.array([bool(n.gpus) for n in self.nodes])
        # host_candidates: per (CPU, memory) request, which nodes pass NodeResourcesFit and how many, brought up to
        # date from the log of nodes whose host books changed (host_log, appended by _bind/_unbind) instead of
        # comparing every node's books at every placement.
        self.host_log: list[int] = []
        self.host_fit: dict[tuple, list] = {}
        self.host_score: dict[tuple, list] = {}  # host_points: per (CPU, memory) request, [scores, log position]
        self.node_index = np.arange(len(self.nodes))
        self.nodes_to_find = feasible_nodes_to_find(len(self.nodes))  # the cluster's size is fixed for the run
        # gnnsched placement (see adapters.PlacementView): nodes whose books changed since the view last looked,
        # and the extender's reservations (job id -> (GPU index, immediate), bind time) until the agent admits.
        self.placement_view = None
        self.changed_nodes: set[int] = set()  # host (CPU/memory) books changed
        self.changed_gpus: set[tuple[int, int]] = set()  # (node idx, GPU index) books changed
        self.reservations: dict[int, tuple[int, bool]] = {}
        # adapters.slowdowns: ordered intensity classes of a GPU's running jobs -> their slowdowns (this run only)
        self.slowdown_cache: dict[tuple, list[float]] = {}
        # adapters.next_group: bind counter per queued job (the queue's order) and each job's policy Task
        self.binds = 0
        self.bind_seq: dict[int, int] = {}
        # +prestart: job id -> when its pod was bound to its node (its container, and its CPU start-up, began)
        self.bound_at: dict[int, float] = {}
        # probation (gnnsched.attempts.probation): the attempts the gate's last decision admitted alone on probation
        # (job id -> the bytes it booked for each)
        self.held_next: dict[int, int] = {}
        self.task_cache: dict[int, tuple] = {}
        self.queue_tasks: dict[int, tuple] = {}  # adapters.next_group: node idx -> (node.queue, its Tasks)
        # the gate's backfill rule (policies.plan_decision) and each queued job's bypass count, kept between decisions
        self.bypass_limit = policy.effective_bypass_limit
        self.bypassed: dict[int, int] = {}
        self.size_counts: dict[int, int] = {}
        self.reserved_at: dict[int, float] = {}
        # Indexes of the reservations (kept by adapters.place and _start): per (node idx, GPU index) the reserved
        # jobs in queue order, and per node the jobs whose reservation is still immediate.
        self.reserved_on: dict[tuple[int, int], dict[int, SimJob]] = {}
        self.immediate_on: dict[int, dict[int, int]] = {}
        self.cpu_capacity = float(sum(n.spec.cpu_milli for n in self.nodes))
        self.memh_capacity = float(sum(n.spec.memory_bytes for n in self.nodes))
        # The closed loop (estimate errors, faults; gnnsched.simulator.faults): None when the run has neither, and
        # then nothing below differs from the open-loop engine.
        self.loop = loop
        self.loop_ours = loop is not None and loop.gnnsched
        self.wasted_s = 0.0  # GPU-seconds held by attempts that did not complete (each co-located attempt its own)
        if loop is not None and loop.fault_model.hw_rate > 0:
            for gs in self.gpus:
                gs.fault_clock = HardwareFaultClock(loop.fault_model.hw_rate, loop.seed, gs.gid)
        # The runtime loop (+rtcal, +progress; gnnsched.simulator.runtime_loop): None without either, and then the
        # predictions the schedulers see are the workload's, never corrected.
        self.rt = RuntimeLoop(calibrate=policy.runtime_calibration, progress=policy.progress) \
            if policy.runtime_loop else None
        # The co-location loop (issue 37; gnnsched.simulator.coloc_loop): slowdowns learned from progress reports.
        self.coloc = ColocLoop(load_interference()) if policy.progress and policy.is_ours else None

    # ------------------------------------------------------------------ events
    def _push(self, t: float, kind: int, payload: Any, token: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, payload, token))

    def _advance(self, t: float) -> None:
        dt = t - self.last_t
        if dt > 0:
            self.mem_area += self.mem_now * dt
            self.sm_area += self.sm_now * dt
            self.cpu_area += self.cpu_alloc_now * dt
            self.memh_area += self.memh_alloc_now * dt
            if self.waiting > 0:
                self.idle_wait_area += self.idle_gpus * dt
                self.wait_time += dt
            self.last_t = t

    def run(self) -> RunResult:
        self.heap = [(j.arrival, i, ARRIVE, j, 0) for i, j in enumerate(self.jobs)]
        heapq.heapify(self.heap)
        self.seq = len(self.heap)
        for gs in self.gpus:
            if gs.fault_clock is not None:
                self._push(gs.fault_clock.next_after(0.0), FAULT, gs)
        total = len(self.jobs)
        tick = max(1, total // 200)
        # self.heap is only ever pushed to and popped from (never re-bound) during the run: held in a local, with
        # the other per-event lookups, since this loop runs once per event (a third or more of them stale)
        heap = self.heap
        heappop = heapq.heappop
        horizon = self.horizon
        record_timeline = self.record_timeline
        progress = self.progress
        while heap:
            top = heap[0]
            if top[2] == FINISH and top[3].token != top[4]:
                # a completion planned before the job's rate changed (it was re-planned then): it must not move the
                # clock, or a run would end at its last stale event and its utilisation be averaged over that time
                heappop(heap)
                continue
            if top[2] > FINISH and top[2] != RETRY and self._void(top):
                heappop(heap)  # the same for the closed loop's void events
                continue
            t = top[0]
            if horizon is not None and t > horizon:
                break
            self._advance(t)
            self.now = t
            while heap and heap[0][0] == t:
                _, _, kind, payload, token = heappop(heap)
                if kind == FINISH:
                    if payload.token == token:
                        self._finish(payload)
                elif kind == ARRIVE:
                    self._arrive(payload)
                elif kind == STARTED:
                    if payload.killed:
                        continue
                    payload.starting = False
                    payload.last = t
                    self._rerate(payload.gpu)
                elif kind == RETRY:
                    self._requeue(payload)
                elif kind == FAULT:
                    self._hw_fault(payload)
                elif kind == APP_FAULT:
                    if not payload.killed:
                        self._app_fault(payload)
                elif kind == MEM_EXCEEDED:
                    if not payload.killed:
                        self._memory_exceeded(payload)
                elif kind == PROBATION_END:
                    if not payload.killed:
                        self._end_probation(payload)
                else:  # QUARANTINE_END: the drained (or repaired) GPU is healthy again
                    self.changed_gpus.add((payload.node.idx, payload.index))
                    self.dirty_nodes.add(payload.node.idx)
                    self.pending_dirty = True  # the extender may place pending pods on it again
            if (self.pending_dirty and self.pending) or self.dirty_nodes:  # else _schedule has nothing to do
                self._schedule()
            if record_timeline:
                self._sample()
            if progress is not None and self.resolved % tick == 0:
                progress(self.resolved, total)
        end = self.horizon if self.horizon is not None else self.now
        self._advance(end)
        for run in [r for g in self.gpus for r in g.running if not r.starting]:
            run.remaining -= run.rate * (end - run.last)
        if self.progress is not None:
            self.progress(total, total)
        return RunResult(
            policy=self.policy.text, outcomes=[self.outcomes[j.id] for j in self.jobs], end_time=end,
            horizon=self.horizon, gpu_count=len(self.gpus), gpu_mem_area=self.mem_area,
            gpu_mem_capacity=self.mem_capacity, sm_area=self.sm_area, cpu_alloc_area=self.cpu_area,
            mem_alloc_area=self.memh_area, cpu_capacity=self.cpu_capacity, mem_capacity=self.memh_capacity,
            idle_gpu_waiting_area=self.idle_wait_area, waiting_time=self.wait_time, timeline=self.timeline,
            groups=self.groups, gate_checks=self.gate_checks, extra=self._loop_figures(end),
        )

    def _sample(self) -> None:
        tl = self.timeline
        point = (self.now, self.mem_now / self.mem_capacity, self.sm_now / len(self.gpus), self.running_count,
                 self.waiting)
        if tl and tl[-1][0] == self.now:
            tl[-1] = point
        else:
            tl.append(point)

    # ------------------------------------------------------------------ lifecycle
    def _arrive(self, job: SimJob) -> None:
        out = self.outcomes[job.id]
        cpu, mem = job.cpu_milli, job.memory_bytes
        if self.policy.scaling:
            cpu, mem = self.ix.scaled_request(job)
        out.cpu_milli, out.memory_bytes = cpu, mem
        out.status = "pending"
        job = self._plan(job)
        self.pending[job.id] = job
        self.pending_dirty = True
        self.waiting += 1

    def _plan(self, job: SimJob) -> SimJob:
        """A new attempt of ``job`` as the operator plans it now: its reservation (the memory loop's books) and its
        predicted runtime (the runtime loop's factor)."""
        if self.loop is not None:
            job = self.loop.attempt(job)
        if self.rt is not None:
            job = self.rt.attempt(job)
        return job

    def _requeue(self, job: SimJob) -> None:
        out = self.outcomes[job.id]
        out.status = "pending"
        self.pending[job.id] = job
        self.pending_dirty = True
        self.waiting += 1

    def _resolve(self, job: SimJob) -> None:
        self.resolved += 1

    def _schedule(self) -> None:
        if self.pending_dirty and self.pending:
            self.pending_dirty = False
            failures = 0
            done: list[int] = []
            for job in self._order(self.pending):
                if failures >= MAX_FAILED_PLACEMENTS or not self._room():
                    break
                verdict = self._place(job)
                if verdict is None:
                    failures += 1
                    continue
                done.append(job.id)
                if verdict == "never":
                    out = self.outcomes[job.id]
                    out.status = "unschedulable"
                    out.reason = out.reason or "fits on no GPU of the cluster"
                    self.waiting -= 1
                    self._resolve(job)
            for jid in done:
                del self.pending[jid]
                self.ahead.pop(jid, None)
        if self.dirty_nodes:
            dirty = sorted(self.dirty_nodes)
            self.dirty_nodes.clear()
            for idx in dirty:
                self._admit(self.nodes[idx])

    def _room(self) -> bool:
        """Cheap global test before trying placements: can any node take a pod at all?"""
        if self.is_gnnsched:
            return True
        return bool(self.slots_arr.any())

    def _order(self, jobs: dict[int, SimJob]) -> Iterable[SimJob]:
        if self.ahead:
            rest = self._base_order(jobs)
            return itertools.chain((jobs[j] for j in self.ahead if j in jobs),
                                   (job for job in rest if job.id not in self.ahead))
        return self._base_order(jobs)

    def _base_order(self, jobs: dict[int, SimJob]) -> Iterable[SimJob]:
        if self.policy.sjf:  # kube-scheduler's PrioritySort over the queue classes: priority, then enqueue order
            return sorted(jobs.values(), key=self._queue_bucket)  # stable: FIFO within a bucket
        if self.base == "srtf":
            return sorted(jobs.values(), key=lambda j: (self._predicted(j), j.arrival, j.id))
        if self.base == "drf":
            return sorted(jobs.values(), key=lambda j: (self._dominant_share(j), j.arrival, j.id))
        return iter(jobs.values())  # FIFO: arrival / retry order (consumed lazily, deleted after the loop)

    def _queue_bucket(self, job: SimJob) -> int:
        """The runtime bucket of the PriorityClass the operator gives ``job``'s pod (lower bucket = higher priority):
        of the runtime it annotates, which with scaling is the runtime predicted at the scaled requests."""
        k = self.queue_buckets.get(job.id)
        if k is None:
            seconds = self._predicted(job) * (job.scaled_solo_factor if self.policy.scaling else 1.0)
            assert self.queue_order is not None  # buckets are asked for only under an SJF policy
            k = self.queue_buckets[job.id] = self.queue_order.bucket(seconds)
        return k

    def _predicted(self, job: SimJob) -> float:
        return job.profile(self.gpu_nodes[0].gpus[0].model).predicted_s

    def _dominant_share(self, job: SimJob) -> float:
        out = self.outcomes[job.id]
        gpu_share = job.num_gpus * job.gpu_milli / 1000 / max(len(self.gpus), 1)
        return max(out.cpu_milli / self.cpu_capacity, out.memory_bytes / self.memh_capacity, gpu_share)

    # ------------------------------------------------------------------ placement
    def _gpu_ok(self, g: GpuState) -> bool:
        """Can a baseline bind one more pod to ``g`` (device-plugin slots: whole GPU, MPS replicas, time slices)?"""
        if self.base == "temporal":
            return len(g.waiting) + len(g.running) < g.max_clients
        limit = self.per_gpu_cap if self.per_gpu_cap is not None else g.max_clients
        return len(g.running) + len(g.waiting) < limit

    def _refresh_slots(self, node: NodeState) -> None:
        if not self.is_gnnsched:
            self.slots_arr[node.idx] = sum(1 for g in node.gpus if self._gpu_ok(g))

    def _candidates_arr(self, out: JobOutcome) -> np.ndarray:
        """Feasible node indices, taken round-robin from where the last search stopped, as kube-scheduler does."""
        ok = (self.cpu_arr >= out.cpu_milli) & (self.mem_arr >= out.memory_bytes) & (self.slots_arr > 0)
        return self._round_robin(np.flatnonzero(ok))

    def host_candidates(self, out: JobOutcome) -> np.ndarray:
        """kube-scheduler's own filter for gnnsched pods (NodeResourcesFit: CPU and memory on a GPU node), cut to
        ``numFeasibleNodesToFind`` round-robin; the extender filters and scores these."""
        cpu, mem = out.cpu_milli, out.memory_bytes
        log = self.host_log
        e = self.host_fit.get((cpu, mem))
        if e is None or len(log) - e[2] > len(self.nodes) // 8:
            ok = (self.cpu_arr >= cpu) & (self.mem_arr >= mem) & self.has_gpu_arr
            e = self.host_fit[(cpu, mem)] = [ok, int(np.count_nonzero(ok)), len(log), None]
        elif e[2] < len(log):
            ok, n = e[0], e[1]
            cpu_arr, mem_arr, has_gpu = self.cpu_arr, self.mem_arr, self.has_gpu_arr
            for idx in set(log[e[2]:]):
                now = cpu_arr.item(idx) >= cpu and mem_arr.item(idx) >= mem and has_gpu.item(idx)
                if now != ok.item(idx):
                    ok[idx] = now
                    n += 1 if now else -1
                    e[3] = None
            e[1], e[2] = n, len(log)
        if e[1] == len(self.nodes):
            return self._round_robin(self.node_index)  # every node passes: flatnonzero would give 0..n-1
        if e[3] is None:  # the passing nodes' indices, kept until a node's verdict flips
            e[3] = e[0].nonzero()[0]
        return self._round_robin(e[3])

    def host_points(self, cands: np.ndarray, out: JobOutcome) -> np.ndarray:
        """kube-scheduler's CPU/memory score plugins' sum for the pod of ``out`` on each candidate node (a new
        array). Kept per (CPU, memory) request for every node and brought up to date from ``host_log`` as
        ``host_candidates`` keeps its filter; a node the pod does not fit holds a meaningless score, never read
        (it is never a candidate)."""
        cpu, mem = out.cpu_milli, out.memory_bytes
        log = self.host_log
        e = self.host_score.get((cpu, mem))
        if e is None or len(log) - e[1] > len(self.nodes) // 8:
            e = self.host_score[(cpu, mem)] = [
                kube_scores.host_scores(self.scoring, self.cpu_arr, self.cpu_cap_arr, self.mem_arr, self.mem_cap_arr,
                                        cpu, mem), len(log)]
        elif e[1] < len(log):
            scores, strategy = e[0], self.scoring
            cpu_cap, mem_cap = self.cpu_cap_arr, self.mem_cap_arr
            for idx in set(log[e[1]:]):
                node = self.nodes[idx]
                scores[idx] = kube_scores.host_score(strategy, node.cpu_free, int(cpu_cap.item(idx)), node.mem_free,
                                                     int(mem_cap.item(idx)), cpu, mem)
            e[1] = len(log)
        return e[0][cands]

    def _round_robin(self, idx: np.ndarray) -> np.ndarray:
        if idx.size == 0:
            return idx
        want = self.nodes_to_find
        if idx.size == len(self.nodes):  # every node feasible: the window is rr, rr+1, ... (mod n) directly
            n = idx.size
            end = self.rr + min(want, n)
            rolled = idx[self.rr:end] if end <= n else np.concatenate([idx[self.rr:], idx[:end - n]])
            self.rr = (int(rolled[-1]) + 1) % n
            return rolled
        start = int(idx.searchsorted(self.rr))
        # the first ``want`` of idx rotated to start at ``start``: a slice when they do not wrap around
        rest = idx.size - start
        if rest >= want:
            rolled = idx[start:start + want]
        else:
            rolled = np.concatenate([idx[start:], idx[:min(start, want - rest)]])
        self.rr = (int(rolled[-1]) + 1) % len(self.nodes)
        return rolled

    def _place(self, job: SimJob) -> NodeState | Literal["never"] | None:
        """Bind ``job`` to a node (and for baselines a GPU). None: not now; "never": on no node ever."""
        out = self.outcomes[job.id]
        if self.is_gnnsched:
            return self._place_gnnsched(job, out)
        if out.cpu_milli > self.max_node_cpu or out.memory_bytes > self.max_node_mem:
            out.reason = "requests exceed every node's CPU or memory"
            return "never"
        cands = self._candidates_arr(out)
        if cands.size == 0:
            return None
        # kube-scheduler's score (no extender: NodeResourcesFit + BalancedAllocation; the first best on ties); on
        # the node, the GPU with the fewest pods attached.
        node = self.nodes[int(cands[int(np.argmax(self.host_points(cands, out)))])]
        gpu = min((g for g in node.gpus if self._gpu_ok(g)), key=lambda g: (len(g.running) + len(g.waiting), g.index))
        self._bind(job, out, node)
        gpu.waiting.append(job)
        self._refresh_slots(node)
        return node

    def _bind(self, job: SimJob, out: JobOutcome, node: NodeState) -> None:
        node.cpu_free -= out.cpu_milli
        node.mem_free -= out.memory_bytes
        self.cpu_arr[node.idx] = node.cpu_free
        self.mem_arr[node.idx] = node.mem_free
        self.host_log.append(node.idx)
        node.bound += 1
        self.cpu_alloc_now += out.cpu_milli
        self.memh_alloc_now += out.memory_bytes
        out.status = "queued"
        out.node = node.name
        self.dirty_nodes.add(node.idx)
        self.changed_nodes.add(node.idx)

    def _unbind(self, out: JobOutcome, node: NodeState) -> None:
        node.cpu_free += out.cpu_milli
        node.mem_free += out.memory_bytes
        self.cpu_arr[node.idx] = node.cpu_free
        self.mem_arr[node.idx] = node.mem_free
        self.host_log.append(node.idx)
        node.bound -= 1
        self.changed_nodes.add(node.idx)
        self.cpu_alloc_now -= out.cpu_milli
        self.memh_alloc_now -= out.memory_bytes

    def _place_gnnsched(self, job: SimJob, out: JobOutcome) -> NodeState | Literal["never"] | None:
        decision = self.ix.place(self, job, out)
        if decision is None:
            return None
        if decision == "never":
            return "never"
        node = decision
        self._bind(job, out, node)
        node.queue.append(job)
        self.binds += 1
        self.bind_seq[job.id] = self.binds
        if self.policy.prestart and job.spec is not None and not job.spec.command:
            self.bound_at[job.id] = self.now  # the built-in worker starts up at once (a user's command cannot)
        size = job.profile(node.gpus[0].model).admit_bytes
        self._count_size(size, 1)
        node.queue_sizes[size] = node.queue_sizes.get(size, 0) + 1
        return node

    def _count_size(self, admit_bytes: int, delta: int) -> None:
        """Keep ``size_counts``: admit bytes -> number of gnnsched jobs queued at a gate or running with that size
        (the fragmentation term's job-size mix, see ``adapters.PlacementView._sync``)."""
        n = self.size_counts.get(admit_bytes, 0) + delta
        if n:
            self.size_counts[admit_bytes] = n
        else:
            del self.size_counts[admit_bytes]

    # ------------------------------------------------------------------ admission
    def _admit(self, node: NodeState) -> None:
        if self.is_gnnsched:
            if not node.queue:
                return
            admissions = self.ix.next_group(self, node)
            # The agent now reports the jobs it did not admit as queued: their reservations stop being immediate.
            for jid, slot in self.immediate_on.pop(node.idx, {}).items():  # every one is still in node.queue
                self.reservations[jid] = (slot, False)
                self.changed_gpus.add((node.idx, slot))
            if not admissions:
                return
            chosen = {id(j) for j, _ in admissions}
            node.queue = [j for j in node.queue if id(j) not in chosen]
            touched: dict[int, GpuState] = {}
            for job, gpu in admissions:
                self._start(job, gpu, rerate=False)
                touched[gpu.gid] = gpu
            for gpu in touched.values():
                self.ix.check_gate(self, gpu)
                self.gate_checks += 1
                self._rerate(gpu)
                self._record_group(gpu)
            return
        cap = self.per_gpu_cap
        for gpu in node.gpus:
            if not gpu.waiting or gpu.quarantine_until > self.now:
                continue
            limit = cap if cap is not None else gpu.max_clients
            started = False
            while gpu.waiting and len(gpu.running) < limit:
                job = gpu.waiting.pop(0)
                started = self._start(job, gpu, rerate=False) or started
            if started or gpu.running:
                self._rerate(gpu)
            if started:
                self._record_group(gpu)
        self._refresh_slots(node)

    def _record_group(self, gpu: GpuState) -> None:
        if len(self.groups) < 20000:
            self.groups.append(GroupRecord(self.now, gpu.gid, len(gpu.running), gpu.committed, gpu.used,
                                           gpu.total))

    def _startup(self, job: SimJob) -> float:
        """Start-up a process pays after its admission, before its first step: none under temporal sharing
        (pre-initialised workers); with ``+prestart`` only what is left of it, because the worker did its CPU-side
        start-up (imports, graph, model) from the moment its pod was bound, while it waited at the gate."""
        if self.base == "temporal":
            return 0.0
        bound = self.bound_at.pop(job.id, None)
        if bound is None:
            return self.startup_s
        return max(0.0, self.startup_s - (self.now - bound))

    def _start(self, job: SimJob, gpu: GpuState, rerate: bool = True) -> bool:
        """Start ``job`` on ``gpu``. Returns False when it was OOM-killed on the spot."""
        out = self.outcomes[job.id]
        prof = job.profile(gpu.model)
        out.attempts += 1
        self.waiting -= 1
        if out.first_start is None:
            out.first_start = self.now
        out.start = self.now
        out.gpu = gpu.index
        if self.is_gnnsched:  # the job leaves its node's gate queue (admitted, or OOM-killed on the spot)
            sizes = gpu.node.queue_sizes
            n = sizes[prof.admit_bytes] - 1
            if n:
                sizes[prof.admit_bytes] = n
            else:
                del sizes[prof.admit_bytes]
        res = self.reservations.pop(job.id, None)
        if res is not None:
            self.changed_gpus.add((gpu.node.idx, res[0]))
            del self.reserved_on[(gpu.node.idx, res[0])][job.id]
            pending_immediate = self.immediate_on.get(gpu.node.idx)
            if pending_immediate:
                pending_immediate.pop(job.id, None)
        self.reserved_at.pop(job.id, None)
        self.changed_gpus.add((gpu.node.idx, gpu.index))
        startup = self._startup(job)
        if (not self.uvm) and gpu.used + prof.peak_bytes > gpu.total:
            # The allocation that does not fit fails: CUDA out of memory, the process exits. It gets that far only
            # after its start-up (imports, CUDA context, loading the graph), so a kill costs the start-up plus the
            # restart back-off before the next attempt.
            out.oom_kills += 1
            self.wasted_s += startup
            if self.is_gnnsched:
                self._count_size(prof.admit_bytes, -1)
            self._unbind(out, gpu.node)
            self.dirty_nodes.add(gpu.node.idx)
            if out.attempts > job.backoff_limit:
                out.status = "failed"
                out.reason = "OOMKilled"
                out.finish = self.now + startup
                self._resolve(job)
            else:
                out.status = "backoff"
                delay = startup + min(BACKOFF_MAX_S, BACKOFF_S * 2 ** (out.attempts - 1))
                self._push(self.now + delay, RETRY, job)
            return False
        out.status = "running"
        out.ran = True
        solo = prof.solo_s * (job.scaled_solo_factor if self.policy.scaling else 1.0)
        ckpt = self.loop is not None and self.loop.fault_model.checkpointing and self.loop_ours
        run = Run(job, gpu, self.loop.attempt_work(job.id, solo) if ckpt else solo,  # type: ignore[union-attr]
                  self.now, starting=startup > 0, out=out)
        run.solo_full = solo
        run.startup_s = startup
        if startup > 0:
            self._push(self.now + startup, STARTED, run)
        if not gpu.running:
            self.idle_gpus -= 1
        if self.loop is not None and job.id in self.loop.buggy:
            # its own application fault, at the same point of every attempt's run (after its start-up)
            after = self._until_point(job, self.loop.buggy[job.id], prof.solo_s, ckpt)
            self._push(self.now + startup + after, APP_FAULT, run)
        held = self.held_next.pop(job.id, None)
        if held is not None and self.loop is not None:
            # admitted alone on probation: it books the rest of the GPU too until its steps pass its probation step
            # (one step more: the agent sees a report past it); its own bytes stay its limit
            run.held = max(0, held - prof.admit_bytes)
            gpu.committed += run.held
            self.loop.probation_alone += 1
            after = self._until_point(job, self.loop.probation[job.id][1], prof.solo_s, ckpt)
            steps = max(1, job.spec.steps) if job.spec is not None else 1000
            self._push(self.now + startup + after + prof.solo_s / steps, PROBATION_END, run)
        if self.loop_ours and self.loop is not None and self.loop.exceeds(job, gpu.model):
            # its first step reaches the true peak, past its MPS limit: CUDA out of memory in its own process
            first = prof.solo_s / max(1, job.spec.steps) if job.spec is not None else 0.0
            self._push(self.now + startup + first, MEM_EXCEEDED, run)
        gpu.running.append(run)
        gpu.used += prof.peak_bytes
        if self.is_gnnsched:
            gpu.committed += prof.admit_bytes
        self.running_count += 1
        if rerate:
            self._rerate(gpu)
        return True

    def _until_point(self, job: SimJob, point: float, solo_s: float, ckpt: bool) -> float:
        """Seconds of an attempt's GPU work (after its start-up) until it reaches ``point`` of its job's steps: from
        its checkpoint (``LoopBooks.fault_after``) or from step 0."""
        return self.loop.fault_after(job.id, point, solo_s) if ckpt and self.loop is not None else point * solo_s

    def _finish(self, run: Run) -> None:
        gpu = run.gpu
        job = run.job
        out = self.outcomes[job.id]
        if self.coloc is not None:
            self.coloc.ended(run, self.now)
        self._take_off_gpu(run)
        if self.loop is not None:
            self.loop.completed(job, gpu.model)
            self._replan_pending()
        if self.rt is not None:
            # what the operator observes: from the agent's started-at (the first step, with progress reports) else
            # from the admission, to the end; neighbours' slowdown included
            began = (out.start or 0.0) + (run.startup_s if self.rt.progress else 0.0)
            # an attempt that resumed from a checkpoint ran only what its checkpoint did not hold: the operator's
            # sample rule (gnnsched.attempts.checkpointing.runtime_sample_share)
            overhead = self.loop.overhead() if self.loop is not None else 1.0
            share = runtime_sample_share(run.work / (run.solo_full * overhead) if run.solo_full > 0 else None)
            if share is not None:
                self.rt.completed(job, gpu.model, self.now - began,
                                  (job.scaled_solo_factor if self.policy.scaling else 1.0) * share)
            self._replan_runtime()
        out.status = "completed"
        out.finish = self.now
        self._unbind(out, gpu.node)
        self._resolve(job)
        self._rerate(gpu)
        self._refresh_slots(gpu.node)
        self.dirty_nodes.add(gpu.node.idx)
        self.pending_dirty = True

    def _take_off_gpu(self, run: Run) -> None:
        """The GPU's side of a run ending, completed or not: its bytes, its client slot, idle accounting."""
        gpu = run.gpu
        prof = run.job.profile(gpu.model)
        gpu.running.remove(run)
        self.changed_gpus.add((gpu.node.idx, gpu.index))
        gpu.used -= prof.peak_bytes
        if self.is_gnnsched:
            gpu.committed -= prof.admit_bytes + run.held
            run.held = 0  # its probation's end, if still to come, frees nothing more
            self._count_size(prof.admit_bytes, -1)
        if not gpu.running:
            self.idle_gpus += 1
        self.running_count -= 1

    # ------------------------------------------------------------------ the closed loop
    def _void(self, event: tuple) -> bool:
        """An event that would change nothing: a start-up end, memory-exceeded or application fault of an attempt
        already ended; a hardware fault or a quarantine's end once every job is resolved. A hardware fault is void
        too when nothing else can happen any more (no other event, no GPU out of the pool): the jobs left can never
        run, and a fault process that went on would never let the run end."""
        kind, payload = event[2], event[3]
        if kind in (STARTED, MEM_EXCEEDED, APP_FAULT, PROBATION_END):
            return payload.killed
        if kind not in (FAULT, QUARANTINE_END):
            return False
        if self.resolved >= len(self.jobs):
            return True
        return kind == FAULT and not self.running_count \
            and all(g.quarantine_until <= self.now for g in self.gpus) \
            and all(e[2] in (FAULT, QUARANTINE_END) for e in self.heap)

    def _end_probation(self, run: Run) -> None:
        """``run``, held alone on probation, passed its probation step without a fault of its own: it is not its
        undecided fault's culprit (a culprit's fault is deterministic), so it books only its own bytes now and its GPU
        takes others (the gate's ``Books.report_progress``)."""
        loop = self.loop
        assert loop is not None  # probation exists only in a closed-loop run
        loop.probation.pop(run.job.id, None)
        loop.probation_suspects.discard(run.job.id)
        if not run.held:
            return
        loop.probation_passed += 1
        gpu = run.gpu
        gpu.committed -= run.held
        run.held = 0
        run.placement_entry = None
        self.changed_gpus.add((gpu.node.idx, gpu.index))
        self.dirty_nodes.add(gpu.node.idx)
        self.pending_dirty = True

    def reached_point(self, run: Run) -> float:
        """The share of its job's steps ``run`` has done now, those its checkpoint held included: the step its
        worker's result line reports when it fails."""
        loop = self.loop
        ours = loop is not None and self.loop_ours
        kept = loop.kept.get(run.job.id, 0.0) if ours else 0.0  # type: ignore[union-attr]
        if run.starting or run.solo_full <= 0:
            return kept
        done = run.work - max(0.0, run.remaining - run.rate * (self.now - run.last))
        if ours:
            done = loop.stepped(run.job.id, done)  # type: ignore[union-attr]
        return min(1.0, kept + done / run.solo_full)

    def _end_attempt(self, run: Run) -> None:
        """Take a failed attempt off its GPU (as ``_finish`` does, without completing the job): its events become
        void, its GPU time so far is wasted, its node's books are freed. The caller re-rates the GPU."""
        gpu, job = run.gpu, run.job
        out = self.outcomes[job.id]
        if self.loop is not None and self.loop_ours and self.loop.fault_model.checkpointing and not run.starting:
            left = run.remaining - run.rate * (self.now - run.last)  # ``remaining`` is brought up to date lazily
            began = (out.start if out.start is not None else self.now) + run.startup_s
            self.loop.attempt_ended(job.id, run.solo_full, run.work - max(0.0, left), self.now - began)
        run.killed = True
        run.token += 1
        self._take_off_gpu(run)
        self.wasted_s += self.now - (out.start if out.start is not None else self.now)
        self._unbind(out, gpu.node)
        self._refresh_slots(gpu.node)
        self.dirty_nodes.add(gpu.node.idx)
        self.pending_dirty = True

    def _replan_pending(self) -> None:
        """The calibration table changed: every attempt still waiting for the scheduler (not bound to a node) gets
        the admit bytes the operator would plan for it now (``LoopBooks.attempt``: a resized attempt keeps its
        reservation), as the operator patches the ``admit-bytes`` annotation of its unbound pods. Its place in the
        queue is kept."""
        loop = self.loop
        if loop is None or not loop.changed:
            return
        for jid, waiting in self.pending.items():
            new = loop.replanned(waiting, self.outcomes[jid].job)
            if new is not None:
                self.pending[jid] = self.rt.attempt(new) if self.rt is not None else new
                self.pending_dirty = True
        loop.changed.clear()

    def _replan_runtime(self) -> None:
        """A runtime factor moved: every attempt still waiting for the scheduler gets the predicted runtime the
        operator would plan for it now (its annotation; its priority class, immutable, keeps its bucket)."""
        rt = self.rt
        if rt is None or not rt.changed:
            return
        rt.changed = False
        rt.replans += 1
        for jid, waiting in self.pending.items():
            new = rt.attempt(waiting)
            if any(new.profiles[m].predicted_s != p.predicted_s for m, p in waiting.profiles.items()):
                self.pending[jid] = new
                self.pending_dirty = True

    def progress_of(self, run: Run) -> StepProgress | None:
        """``+progress``: the step report the agent holds for ``run`` now (None before its first step, for a trace
        pod, or without ``+progress``). Its steps are the true share of its work done, so its pace includes the
        slowdown it has had; a report is renewed at most every ``RuntimeLoop.report_interval_s``."""
        rt = self.rt
        if rt is None or not rt.progress or run.starting or run.job.spec is None:
            return None
        now = self.now
        remaining = run.remaining - run.rate * (now - run.last)
        total = run.job.spec.steps
        done = int(total * (1.0 - max(0.0, remaining) / run.work)) if run.work > 0 else total
        began = (run.out.start or 0.0) + run.startup_s
        run.report = rt.report(run.report, done, total, now - began, now)
        return run.report

    def _give_up(self, job: SimJob, reason: str) -> None:
        out = self.outcomes[job.id]
        out.status = "failed"
        out.reason = reason
        out.finish = self.now
        if self.loop is not None:
            self.loop.apart.pop(job.id, None)
        self._resolve(job)

    def _next_attempt(self, job: SimJob, ahead: bool) -> None:
        """gnnsched: the operator creates the job's next attempt at once (no back-off: not a charged failure);
        ``ahead``: in the retry PriorityClass, before every pod that has not run yet."""
        assert self.loop is not None  # attempts exist only in a closed-loop run
        if ahead:
            self.ahead[job.id] = None
        self._requeue(self._plan(self.outcomes[job.id].job))

    def _charge(self, job: SimJob, reason: str) -> None:
        """Kubernetes (baselines): a failed pod is charged to the job's backoffLimit and retried after kubelet's
        back-off while attempts remain."""
        out = self.outcomes[job.id]
        if out.attempts > job.backoff_limit:
            self._give_up(job, reason)
            return
        out.status = "backoff"
        self._push(self.now + min(BACKOFF_MAX_S, BACKOFF_S * 2 ** (out.attempts - 1)), RETRY, job)

    def _memory_exceeded(self, run: Run) -> None:
        """gnnsched: the attempt hit CUDA out of memory inside its own MPS limit (its neighbours are safe); the next
        attempt reserves ``closed_loop.next_reservation``, or the job is lost."""
        gpu, job = run.gpu, run.job
        self._end_attempt(run)
        self._rerate(gpu)
        loop = self.loop
        assert loop is not None  # an attempt exceeds its reservation only in a closed-loop run
        resized = loop.resized(job, gpu.model)
        self._replan_pending()
        if resized:
            self._next_attempt(job, ahead=True)
        elif loop.resizes.get(job.id, 0) >= loop.resize.max_resizes:
            self._give_up(job, f"MemoryExceeded: {loop.resize.max_resizes} resizes used")
        else:
            self._give_up(job, "ExceedsLargestGPU")

    def _hw_fault(self, gpu: GpuState) -> None:
        """A hardware fault on ``gpu`` (busy or idle): every client dies and is charged nothing
        (``fault_classes.fault_charges``); the GPU is unhealthy for ``--hw-repair-seconds``. Baselines: Kubernetes
        charges each failed pod to its job's backoffLimit; the device plugin keeps the GPU out all the same."""
        loop, clock = self.loop, gpu.fault_clock
        assert loop is not None and clock is not None  # hardware faults are scheduled only with a fault clock
        loop.hw_faults += 1
        repaired = self.now + loop.fault_model.hw_repair_s
        loop.hw_out.append((self.now, repaired))
        self._push(clock.next_after(repaired), FAULT, gpu)  # the next one, on the repaired GPU
        self._kill_group(gpu, HW_FAULT_XID, None, repaired)

    def _app_fault(self, run: Run) -> None:
        """A buggy job's own application fault: under MPS every client of its GPU dies (one fault domain); the GPU
        stays healthy and drains for ``QUARANTINE_S``. Who is charged is the core rule's suspect rule."""
        assert self.loop is not None  # buggy jobs exist only in a closed-loop run
        self.loop.app_faults += 1
        self._kill_group(run.gpu, APP_FAULT_XID, run.job.id, self.now + QUARANTINE_S)

    def _kill_group(self, gpu: GpuState, xid: int, culprit: int | None, until: float) -> None:
        loop = self.loop
        assert loop is not None
        # the step each client reached, as its result line reports it (a buggy job's is its fault's, every attempt)
        points = {r.job.id: loop.buggy[r.job.id] if r.job.id == culprit else self.reached_point(r)
                  for r in gpu.running}
        runs = self._end_group(gpu, culprit, until)
        charges = loop.fault_charges(xid, [r.job for r in runs], culprit)
        peers = loop.fault_peers([r.job for r in runs], charges)
        for run in runs:
            job, charge = run.job, charges[run.job.id]
            if not self.loop_ours:
                self._charge(job, "GPUFault" if charge.fault_class == "hardware" else "Error")
                continue
            point = points[job.id]
            at_step = int(point * (job.spec.steps if job.spec is not None else 1000))
            step, verdict = loop.judged_step(job, charge, peers[job.id], at_step, point)
            if verdict.action == "FailJob":  # gnnsched.attempts.failure_policy: the job fails now
                loop.failed_by_rule += 1
                self._give_up(job, f"{verdict.reason}: {verdict.rule} FailJob")
                continue
            if step.requeue:
                # requeued, its backoffLimit untouched; ahead of the queue (the retry PriorityClass) unless it is on
                # probation (the operator creates such an attempt in its own class: gnnsched.attempts.probation)
                self._next_attempt(job, ahead=job.id not in loop.probation)
                continue
            charged = loop.charged[job.id] = loop.charged.get(job.id, 0) + 1
            if charged > job.backoff_limit:  # the suspect (ClientFault), or a victim past MAX_REQUEUES (RequeueLimit)
                self._give_up(job, f"{step.reason}: charged, backoffLimit used")
            else:
                self._next_attempt(job, ahead=False)  # charged, and back in its usual place

    def _end_group(self, gpu: GpuState, culprit: int | None, until: float) -> list[Run]:
        """A fault's end of every attempt on ``gpu``, counted, and the GPU out of the pool until ``until`` (its drain or
        repair); returns the attempts, for :meth:`_kill_group` to charge. ``culprit``: the buggy job whose fault it is
        (not counted a victim)."""
        loop = self.loop
        assert loop is not None
        runs = list(gpu.running)
        loop.faults += 1
        loop.fault_log.append((self.now, gpu.gid))
        loop.fault_victims += sum(1 for r in runs if r.job.id != culprit)
        for run in runs:
            self._end_attempt(run)
        self._rerate(gpu)
        if until > gpu.quarantine_until:
            gpu.quarantine_until = until
            self._push(until, QUARANTINE_END, gpu)
            self.changed_gpus.add((gpu.node.idx, gpu.index))  # unhealthy in its GPUNode: the extender skips it
        return runs

    def _loop_figures(self, end: float) -> dict:
        """The closed loop's figures for :func:`gnnsched.simulator.metrics.summarise`."""
        loop = self.loop
        figures: dict = loop.summary() if loop is not None else {
            "memory_exceeded": 0, "resize_retries": 0, "fault_victims": 0, "faults": 0}
        figures["wasted_gpu_seconds"] = self.wasted_s
        out_s = sum(min(end, repaired) - t for t, repaired in loop.hw_out if t < end) if loop is not None else 0.0
        figures["hw_out_share"] = out_s / (len(self.gpus) * end) if end > 0 else 0.0
        if self.rt is not None:
            figures.update(self.rt.summary())
        if self.coloc is not None:
            figures.update(self.coloc.summary())
        cap: dict[str, int] = {}
        for g in self.gpus:
            cap[g.model] = max(cap.get(g.model, 0), g.total - g.reserve)
        lost = buggy_failed = 0
        buggy = loop.buggy if loop is not None else {}
        for o in self.outcomes.values():
            if o.job.arrival > end or o.status not in ("failed", "unschedulable"):
                continue
            job = o.job
            if job.id in buggy:
                buggy_failed += 1
                continue
            fits = any((loop.true_peak(job, m) if loop is not None else job.profile(m).peak_bytes) <= c
                       for m, c in cap.items() if m in job.profiles)
            lost += fits
        figures["jobs_lost"] = lost
        figures["buggy_jobs_failed"] = buggy_failed
        return figures

    # ------------------------------------------------------------------ rates
    def _rerate(self, gpu: GpuState) -> None:
        now = self.now
        runs = []  # the runs past their start-up, each brought up to now (one pass)
        for r in gpu.running:
            if not r.starting:
                if r.last != now:
                    r.remaining -= r.rate * (now - r.last)
                    r.last = now
                runs.append(r)
        if len(runs) == 1:
            slow = [1.0]
        elif runs:
            # ix.slowdowns keeps its answers in slowdown_cache by the runs' ordered intensity classes: looked up here
            # first, so a re-rating on a known mix costs one dict lookup
            cached = self.slowdown_cache.get(tuple([r.truth_class for r in runs]))
            slow = cached if cached is not None else self.ix.slowdowns(self, gpu, [r.job for r in runs])
        else:
            slow = []
        if self.coloc is not None and runs:
            self.coloc.rerated(runs, slow, gpu.model, now)
        if self.uvm and gpu.used > gpu.total:
            factor = uvm_slowdown(gpu.used, gpu.total, gpu.bandwidth, gpu.link)
            slow = [s * factor for s in slow]
        sm = 0.0
        heap = self.heap
        push = heapq.heappush
        seq = self.seq
        for r, s in zip(runs, slow, strict=True):
            rate = r.rate = 1.0 / s
            r.slowdown = s
            token = r.token = r.token + 1
            sm += r.sm_util / s
            out = r.out
            if s > out.slowdown_max:
                out.slowdown_max = s
            rem = r.remaining
            seq += 1
            push(heap, (now + (0.0 if rem < 0.0 else rem) / rate, seq, FINISH, r, token))  # max(rem, 0.0)
        self.seq = seq
        sm = min(sm, 1.0)
        mem = min(gpu.used, gpu.total)
        self.sm_now += sm - gpu.sm_now
        self.mem_now += mem - gpu.mem_now
        gpu.sm_now = sm
        gpu.mem_now = mem

