"""The only place the simulator calls gnnsched's own decision functions.

What the simulator measures must be what runs in a cluster, so it never re-implements a decision:

======================  ===================================================  =====================================
simulator needs          core function                                        owner (branch)
======================  ===================================================  =====================================
peak memory, admit       ``gnnsched.estimator.estimate``                      estimator
solo runtime             ``gnnsched.runtime_prior.solo_runtime_seconds``      predictor
intensity class          ``gnnsched.runtime_prior.arithmetic_intensity``      predictor
right-sized requests     ``gnnsched.scaling.scale``                           predictor
co-location slowdown     ``gnnsched.colocation.interference``                            extender
node filter / score      ``gnnsched.placement`` (what the extender runs)     extender / placement
grouping, gate check     ``gnnsched.policies``                                nodeagent
======================  ===================================================  =====================================

Each is imported lazily; when one is not on this branch yet, the call raises :class:`IntegrationMissing` (a
``NotImplementedError``) naming the function and the branch, so a run fails loudly instead of silently simulating a
stand-in.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gnnsched.attempts.probation import planned_tasks
from gnnsched.progress import seconds_left as progress_seconds_left
from gnnsched.scheduler_config import DEFAULT_WEIGHT
from gnnsched.simulator import kube_scores
from gnnsched.simulator.model import JobProfile, SimJob
from gnnsched.simulator.runtime_error import sampler_core_exponent


class IntegrationMissing(NotImplementedError):
    """A core function the simulator needs is not on this branch yet."""

    def __init__(self, what: str, owner: str, detail: str = "") -> None:
        msg = f"{what} is not available yet (owned by helper '{owner}')"
        super().__init__(f"{msg}: {detail}" if detail else msg)
        self.what = what
        self.owner = owner


def _import(module: str, attr: str, owner: str) -> Any:
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise IntegrationMissing(f"{module}.{attr}", owner, str(exc)) from None
    try:
        return getattr(mod, attr)
    except AttributeError:
        raise IntegrationMissing(f"{module}.{attr}", owner, f"{module} has no attribute {attr!r}") from None


def integration_status() -> dict[str, str]:
    """Which integrations import on this branch: name -> "ok" or the reason it does not."""
    wanted = {
        "estimator.estimate": ("gnnsched.estimator", "estimate", "estimator"),
        "runtime_prior.solo_runtime_seconds": ("gnnsched.runtime_prior", "solo_runtime_seconds", "predictor"),
        "runtime_prior.arithmetic_intensity": ("gnnsched.runtime_prior", "arithmetic_intensity", "predictor"),
        "scaling.scale": ("gnnsched.scaling", "scale", "predictor"),
        "interference": ("gnnsched.colocation.interference", "__name__", "extender"),
        "policies": ("gnnsched.policies", "__name__", "nodeagent"),
    }
    status = {}
    for name, (module, attr, owner) in wanted.items():
        try:
            _import(module, attr, owner)
            status[name] = "ok"
        except IntegrationMissing as exc:
            status[name] = str(exc)
    return status



def _truth_class(prof: JobProfile) -> str | None:
    """The interference class the engine runs a job's co-location with: its ``<intensity>-<mode>`` class where the
    adapters know the mode (GNN jobs), else its intensity (trace pods)."""
    return prof.job_class if prof.job_class is not None else prof.intensity


@dataclass
class Integrations:
    """Bound calls into the core for one simulation session.

    ``memo`` caches per-spec work (the estimator traces the real model, 25-140 ms) for this instance only; nothing is
    kept at module level.
    """

    memo: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ loaded lazily
    def _interference(self) -> Any:
        model = self.memo.get("interference")
        if model is None:
            model = _import("gnnsched.colocation.interference", "load_default", "extender")()
            self.memo["interference"] = model
        return model

    def _policies(self) -> Any:
        mod = self.memo.get("policies")
        if mod is None:
            _import("gnnsched.policies", "plan_admissions", "nodeagent")
            mod = importlib.import_module("gnnsched.policies")
            self.memo["policies"] = mod
        return mod

    # ------------------------------------------------------------------ job costs
    def profile(self, spec: Any, gpu_model: str, cpu_cores: float | None = None) -> JobProfile:
        """A GNN job's cost on ``gpu_model``: the estimator's PMC and admit bytes (device ``cuda``: the GPU model's
        context, workspace and allocator overheads included), the analytic runtime prior with ``cpu_cores``, its
        roofline intensity class, and the interference model's solo profile for that class."""
        key = ("profile", spec.model_dump_json(), gpu_model, cpu_cores)
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        from gnnsched.gpu.catalogue import get_gpu_model

        gm = get_gpu_model(gpu_model)
        est = self._estimate(spec, gm)
        solo = _import("gnnsched.runtime_prior", "solo_runtime_seconds", "predictor")
        intensity_class = _import("gnnsched.runtime_prior", "intensity_class", "predictor")
        seconds = float(solo(spec, gm, cpu_cores))
        intensity = str(intensity_class(spec, gm))
        job_class = _import("gnnsched.colocation.measured", "job_class", "extender")(intensity, spec.mode)
        prof = self._interference().profile_for(job_class)
        out = JobProfile(
            admit_bytes=int(est.admit_bytes),
            peak_bytes=int(est.pmc_bytes) + int(est.device_overhead_bytes),
            solo_s=seconds,
            predicted_s=seconds,
            sm_util=float(prof.sm_util),
            mem_util=float(prof.mem_util),
            intensity=intensity,
            job_class=job_class,
        )
        self.memo[key] = out
        return out

    def _estimate(self, spec: Any, gm: Any) -> Any:
        """``gnnsched.estimator.estimate`` once per (spec without its step count, GPU model): the peak of one step
        does not depend on how many steps there are."""
        shape = spec.model_dump(mode="json", exclude={"epochs", "requests", "qos_target_seconds", "resources",
                                                      "scaling", "backoff_limit"})
        key = ("estimate", repr(sorted(shape.items())), gm.name)
        hit = self.memo.get(key)
        if hit is None:
            estimate = _import("gnnsched.estimator", "estimate", "estimator")
            hit = estimate(spec, device="cuda", gpu_model=gm)
            self.memo[key] = hit
        return hit

    def scale(self, spec: Any, cpu_milli: int, memory_bytes: int, gpu_model: str) -> tuple[int, int, float]:
        """``gnnsched.scaling.scale`` (seed 004's Algorithm 1 with floors): the right-sized CPU millicores and memory
        bytes, and the factor by which the job's solo runtime changes with the scaled CPU: the runtime prior's
        device and host split with the host work slowing down as ``bench/runtime_truth.py`` measured the worker's
        sampler slow down (``sampler_core_exponent``), not as the prior that chose the scaling assumes."""
        scale = _import("gnnsched.scaling", "scale", "predictor")
        resources = _import("gnnsched.scaling", "Resources", "predictor")
        predictor = self.memo.get("predictor")
        if predictor is None:
            predictor = _import("gnnsched.predictor.gnn", "GNNRuntimePredictor", "predictor").load_default()
            self.memo["predictor"] = predictor
        got = scale(spec, resources(cpu=cpu_milli / 1000, memory=int(memory_bytes)), predictor=predictor,
                    gpu_model=gpu_model)
        cpu = int(round(got.scaled.cpu * 1000))
        solo = _import("gnnsched.runtime_prior", "solo_runtime_seconds", "predictor")
        exponent = self.memo.get("sampler_core_exponent")
        if exponent is None:
            exponent = self.memo["sampler_core_exponent"] = sampler_core_exponent()
        before = float(solo(spec, gpu_model, cpu_milli / 1000, core_exponent=exponent))
        after = float(solo(spec, gpu_model, cpu / 1000, core_exponent=exponent))
        return cpu, int(got.scaled.memory), (after / before if before > 0 else 1.0)

    def scaled_request(self, job: SimJob) -> tuple[int, int]:
        """The requests ``scale`` chose for ``job`` (computed once per workload, see ``runner.materialise``)."""
        if job.scaled_cpu_milli is None or job.scaled_memory_bytes is None:
            raise IntegrationMissing("gnnsched.scaling.scale", "predictor", f"job {job.name} was not scaled")
        return job.scaled_cpu_milli, job.scaled_memory_bytes

    # ------------------------------------------------------------------ co-location
    def slowdowns(self, sim: Any, gpu: Any, jobs: list[SimJob]) -> list[float]:
        """Slowdown (>= 1) of each of ``jobs`` running together on ``gpu``: ``gnnsched.colocation.interference``."""
        model = self._interference()
        key = tuple(_truth_class(j.profile(gpu.model)) for j in jobs)
        # A pure function of the ordered intensity classes: computed once per run (the cache lives on the
        # simulation, so nothing outlives it), the same floats in the same order as a fresh call.
        cache = sim.slowdown_cache
        hit = cache.get(key)
        if hit is None:
            profiles = [model.profile_for(k) for k in key]
            hit = cache[key] = [model.slowdown(p, profiles[:i] + profiles[i + 1:]) for i, p in enumerate(profiles)]
        return hit

    # ------------------------------------------------------------------ extender
    def place(self, sim: Any, job: SimJob, outcome: Any) -> Any:
        """Where the extender binds ``job``: a node, None (no node can take it now) or "never" (no node ever can).

        Plays kube-scheduler with the gnnsched extender: the scheduler's own NodeResourcesFit filter (CPU, memory)
        picks up to ``numFeasibleNodesToFind`` nodes round-robin; the extender's filter
        (:func:`gnnsched.placement.fit_mask` / ``node_filter``) keeps those with a GPU that can ever hold the admit
        bytes; its prioritize (:func:`~gnnsched.placement.cost_matrix`, ``best_gpu``, ``normalise_scores``) scores
        them 0..10, and kube-scheduler binds the node with the highest sum of that score × weight × 10 and its own
        CPU/memory plugins (:mod:`.kube_scores`, with the profile's NodeResourcesFit strategy; ties: the first in
        candidate order, where kube-scheduler picks one at random). Bind reserves the cheapest GPU of the node, as
        ``ClusterCache.reserve`` does: an *immediate*
        reservation when the bytes fit there now with no queue, a *queued* one otherwise, until the node agent
        reports the pod (here: its next admission pass). ``-interference`` policies score with slowdown 1.
        """
        view = sim.placement_view
        if view is None:
            view = sim.placement_view = PlacementView(sim, self._interference())
        return view.place(job, outcome)

    # ------------------------------------------------------------------ node agent
    def next_group(self, sim: Any, node: Any) -> list[tuple[SimJob, Any]]:
        """The node agent's decision: ``gnnsched.policies.plan_decision`` over the node's queue and GPUs, with the
        gate's backfill limit (``sim.bypass_limit``) and each queued job's bypass count (``sim.bypassed``), kept
        between decisions as the gate keeps them."""
        pol = self._policies()
        cap = sim.per_gpu_cap
        if not node.queue:
            return []
        paper = sim.policy.paper
        probation_here = False  # a queued attempt is on probation (gnnsched.attempts.probation)
        if not paper:
            # plan_admissions' own first test, before building its inputs: no GPU with a free slot has the bytes
            # of the smallest queued task (node.queue_sizes: the queue's sizes, kept by the engine) -> no admission
            # (the common case for a node whose GPUs are full). Each GPU's free bytes and slots are computed once,
            # for this test and for its GPUFree: GPUFree is immutable, so the last one built for the GPU is reused
            # while both are unchanged (most decisions look at GPUs whose books did not move).
            smallest = min(node.queue_sizes)
            gpus = []
            fits = False
            for g in node.gpus:
                free = g.total - g.reserve - g.committed
                slots = (cap if cap is not None else g.max_clients) - len(g.running)
                if g.quarantine_until > sim.now:  # draining after a fatal fault: the agent admits nothing there
                    slots = 0
                if slots > 0 and free >= smallest:
                    fits = True
                last = g.free_view
                if last is None or last.free_bytes != free or last.free_slots != slots:
                    last = g.free_view = pol.GPUFree(index=g.index, free_bytes=free, free_slots=slots,
                                                     capacity_bytes=g.total - g.reserve)
                gpus.append(last)
            if not fits:
                return []
            apart = sim.loop.apart if sim.loop is not None else None  # job id -> jobs kept apart from it
            domain_of = sim.job_domain if sim.domains_mixed else None  # the trust-domain rule reads clients too
            on_probation = sim.loop.probation if sim.loop is not None else {}
            probation_here = bool(on_probation) and any(j.id in on_probation for j in node.queue)
            if sim.policy.share or (sim.policy.spread and len(gpus) > 1) or apart or domain_of:
                # the load-aware rules read each GPU's running clients: intensity and predicted seconds left, from
                # what the gate knows (admission time and predicted solo runtime), not from the simulated truth.
                # Each run's predicted end is fixed for its life (policies.predicted_end): kept on the run, so a
                # decision only subtracts the clock (policies.seconds_left) for each client. With +progress the
                # client's last step report decides instead, once it measures its pace (gnnsched.progress).
                now = sim.now
                client, seconds_left, progress_of = pol.Client, pol.seconds_left, sim.progress_of
                with_clients = []
                for f, g in zip(gpus, node.gpus, strict=True):
                    if g.running:
                        running = []
                        for r in g.running:
                            c = r.gate_client
                            if c is None:
                                # its GPU work starts after the start-up it had left at admission: r.startup_s is
                                # policies.startup_left(sim.startup_s, its bind, its start, +prestart) by
                                # construction (Simulation._startup), the gate's assumption when both use the same
                                # start-up figure (the defaults do: policies.STARTUP_SECONDS = costs.STARTUP_S)
                                start = None if r.out.start is None else r.out.start + r.startup_s
                                c = r.gate_client = (r.intensity, pol.predicted_end(
                                    r.job.profile(g.model).predicted_s, start))
                            jid = r.job.id
                            running.append(client(c[0], seconds_left(c[1], now, progress_of(r)), str(jid),
                                                  apart.get(jid, frozenset()) if apart else frozenset(),
                                                  domain_of[jid] if domain_of else None))
                        f = pol.GPUFree(index=f.index, free_bytes=f.free_bytes, free_slots=f.free_slots,
                                        capacity_bytes=f.capacity_bytes, running=tuple(running))
                    with_clients.append(f)
                gpus = with_clients
        # A queued job's Task is built once per bind, with seq = the engine's bind counter instead of the position
        # in the queue: node.queue is in bind order, so the relative order (all the policies use seq for) is the
        # same and the plan is identical, without re-building every queued job's Task at every decision.
        # The node's list of Tasks is kept between decisions too (sim.queue_tasks: node idx -> (the node.queue list
        # it mirrors, its Tasks)): the engine only appends to node.queue (a bind) or replaces the list (an
        # admission), so while it is the same list object the kept Tasks are its prefix and only the jobs bound
        # since are added; the entry holds the list, so its identity cannot be reused. Dropped below when a bypass
        # count changes a queued Task.
        cache = sim.task_cache
        model = node.gpus[0].model
        queue = node.queue
        kept = sim.queue_tasks.get(node.idx)
        if kept is not None and kept[0] is queue and len(kept[1]) <= len(queue):
            tasks = kept[1]
            fresh = queue[len(tasks):] if len(tasks) < len(queue) else ()
        else:
            tasks = []
            fresh = queue
            sim.queue_tasks[node.idx] = (queue, tasks)
        append, get, bind_seq = tasks.append, cache.get, sim.bind_seq
        loop_apart = sim.loop.apart if sim.loop is not None else {}  # the apart rule's peers, fixed per attempt
        for job in fresh:
            jid = job.id
            hit = get(jid)
            if hit is None or hit[0].seq != bind_seq[jid]:
                prof = job.profile(model)
                hit = cache[jid] = (pol.Task(key=str(jid), bytes=prof.admit_bytes, seq=bind_seq[jid],
                                             qt_seconds=prof.predicted_s, intensity=prof.intensity,
                                             bypassed=sim.bypassed.get(jid, 0),
                                             qos_seconds=job.qos_target_s if job.mode == "infer" else None,
                                             job=str(jid), apart=loop_apart.get(jid, frozenset()),
                                             domain=sim.job_domain.get(jid) if sim.domains_mixed else None), job)
            append(hit[0])
        alone: set[str] = set()
        if not paper and probation_here:
            tasks, alone = self._probation_tasks(sim, node, tasks)
        if paper:  # the published SQTF/BQT baseline: next group only on an idle GPU, no memory bound
            gpus = [
                pol.GPUFree(index=g.index, free_bytes=g.free_admit_bytes,
                            free_slots=0 if g.quarantine_until > sim.now
                            else (cap if cap is not None else g.max_clients) - len(g.running),
                            capacity_bytes=g.total - g.reserve)
                for g in node.gpus
            ]
            busy = [g.index for g in node.gpus if g.running]
            plan = pol.plan_admissions_paper(sim.base, tasks, gpus, busy)
        else:
            policy = self.memo.get(("policy", sim.base))
            if policy is None:  # the enum, so plan_admissions does not parse the name at every call
                policy = self.memo[("policy", sim.base)] = pol.parse_policy(sim.base)
            learned = sim.coloc.slowdown_fn(model) if sim.coloc is not None and sim.policy.share else None
            decision = pol.plan_decision(policy, tasks, gpus, sim.bypass_limit, spread=sim.policy.spread,
                                         share_when_pays=sim.policy.share, slowdown=learned)
            plan = decision.admissions
            # The gate keeps each queued task's bypass count between decisions (node_agent.books.Entry.bypassed).
            if decision.bypassed:
                sim.queue_tasks.pop(node.idx, None)
            for key, count in decision.bypassed.items():
                jid = int(key)
                sim.bypassed[jid] = count
                task, job = cache[jid]
                # replace(task, bypassed=count), built directly (replace() re-reads the fields at every call)
                cache[jid] = (pol.Task(key=task.key, bytes=task.bytes, seq=task.seq, qt_seconds=task.qt_seconds,
                                       intensity=task.intensity, bypassed=count, qos_seconds=task.qos_seconds,
                                       job=task.job, apart=task.apart, domain=task.domain), job)
            if sim.bypassed:
                for a in plan:
                    for t in a.tasks:
                        sim.bypassed.pop(int(t.key), None)
        for a in plan:
            for t in a.tasks:
                if t.key in alone:  # admitted alone on probation: the engine books the whole GPU for it
                    sim.held_next[int(t.key)] = t.bytes
        return [(cache[int(t.key)][1], node.gpus[a.gpu_index]) for a in plan for t in a.tasks]

    def _probation_tasks(self, sim: Any, node: Any, tasks: list) -> tuple[list, set[str]]:
        """The gate's probation rule (``node_agent.books.Books._probation_tasks``, the same core
        ``gnnsched.attempts.probation.planned_tasks``). Returns the tasks and the keys planned alone."""
        idle = any(not g.running and g.quarantine_until <= sim.now for g in node.gpus)
        keys = {t.key for t in tasks if int(t.key) in sim.loop.probation}
        suspects = {k for k in keys if int(k) in sim.loop.probation_suspects}
        return planned_tasks(tasks, keys, idle, max(g.total - g.reserve for g in node.gpus), suspects)

    def check_gate(self, sim: Any, gpu: Any) -> None:
        """``gnnsched.policies.check_gate_invariant`` on ``gpu``'s books; raises ``GateInvariantError``. The
        ``-paper`` baselines have no gate (their groups may exceed the GPU by design), so nothing is checked."""
        if sim.policy.paper:
            return
        pol = self._policies()
        cap = sim.per_gpu_cap
        books = pol.GPUBooks(
            index=gpu.index, total_bytes=gpu.total, reserve_bytes=gpu.reserve,
            committed=tuple([r.admit_bytes + r.held for r in gpu.running]),
            max_clients=cap if cap is not None else gpu.max_clients,
        )
        pol.check_gate_invariant([books])


class PlacementView:
    """The extender's cache as the simulator sees it: the same :mod:`gnnsched.placement` arrays, one row per node
    (``node.idx``), refreshed for the nodes and GPUs the engine marks in ``sim.changed_nodes`` / ``sim.changed_gpus``.

    What each row holds mirrors ``extender/cache.py``'s ``_refresh`` fed by a node agent that reports instantly:
    committed admit bytes and the running jobs (predicted end = start + start-up + predicted seconds, intensity
    profile) as the agent reports them, plus the simulator's own record of the extender's reservations
    (``sim.reservations``: job id -> (GPU index, immediate)) for pods the agent has not admitted yet.
    """

    #: Seconds between refreshes of the fragmentation term's job-size mix (the extender's maintenance loop).
    SIZE_MIX_INTERVAL = 1.0
    #: Changed GPUs up to which _sync derives GPU by GPU (scalar path) rather than once over their rows' arrays.
    CELL_BY_CELL = 32
    #: How far above the cheapest candidate's cost a candidate can be and still win kube-scheduler's sum: the
    #: cheapest scores 10 (``pl.normalise_scores``), and the CPU/memory plugins add at most 200 points, so a winner
    #: scores at least ``s = ceil(10 - 200 / (weight * 10))``, which needs a cost <= lowest * 10 / (s - 0.5)
    #: (a small margin on top for rounding).
    _MIN_SCORE = math.ceil(kube_scores.MAX_EXTENDER_PRIORITY - 2 * kube_scores.MAX_NODE_SCORE
                           / (DEFAULT_WEIGHT * kube_scores.MAX_NODE_SCORE / kube_scores.MAX_EXTENDER_PRIORITY))
    REACH = 10.0 / (_MIN_SCORE - 0.5) * 1.001 if _MIN_SCORE >= 1 else math.inf

    def __init__(self, sim: Any, interference: Any) -> None:
        from gnnsched import placement as pl

        self.pl = pl
        self.sim = sim
        self.interference = interference
        self.aware = bool(sim.policy.interference)
        # the learned co-location factors reach the simulated extender as they reach the real one: through the
        # agents' GPUNode status (+progress learns them); every GPU is re-written when a calibrated factor moves
        # (_sync)
        self.learning = self.aware and sim.coloc is not None
        self.samples_seen = 0
        self.factors_seen: dict = {}
        self.rows = len(sim.nodes)
        self.state = pl.new_state(self.rows, max(len(n.gpus) for n in sim.nodes))
        self.above = pl.size_table(())
        self.above_at = -float("inf")
        self.sens = pl.sensitivities(interference)  # the model is immutable: its per-class sensitivities, once
        self.models = sorted({g.model for g in sim.gpus})
        self.model_rows = {m: np.array([bool(n.gpus) and n.gpus[0].model == m for n in sim.nodes]) for m in self.models}
        self.max_cap = {m: max(g.total - g.reserve for g in sim.gpus if g.model == m) for m in self.models}
        # Per (bytes, intensity) class of pods: each row's cheapest fit-now GPU and the lower bound of its waiting
        # GPUs (see _cheapest), valid while the row's version and the size-table epoch are the ones recorded.
        self.row_ver = np.zeros(self.rows, dtype=np.int64)
        self.epoch = 0
        self.fit_cache: dict[tuple, dict[str, Any]] = {}
        # per GPU (gid): the inputs of its last set_gpu / set_gpu_derived (refresh_gpu skips rewriting the same)
        self.written: list[tuple | None] = [None] * len(sim.gpus)
        # every row's status is known (a["known"] is written once, below, and never changes in a run)
        for node in sim.nodes:
            self.refresh(node)
        sim.changed_nodes.clear()
        sim.changed_gpus.clear()
        self.pl.derive(self.state, slice(0, self.rows), self.above, interference)
        self.all_known = bool(self.state["known"].all())

    def refresh(self, node: Any) -> None:
        """Re-write ``node``'s row from the simulator's books (``ClusterCache._refresh``'s inputs)."""
        self.pl.clear_row(self.state, node.idx, bool(node.gpus))
        self.refresh_host(node)
        for g in node.gpus:
            self.refresh_gpu(node, g.index)

    def refresh_host(self, node: Any) -> None:
        self.pl.set_host(self.state, node.idx, float(node.cpu_free), float(node.mem_free))

    def refresh_gpu(self, node: Any, index: int, derive: bool = False) -> bool:
        """Re-write one GPU of ``node``: committed bytes, running jobs, and the reservations on it. ``derive``: also
        its derived figures with the current size table (``pl.set_gpu_derived``: what ``pl.derive_cells`` on that
        GPU would then compute), unless the GPU's raw figures are the ones last written (a third of the GPUs the
        engine marks changed are, e.g. a reservation made and admitted between two placements): the stored raw
        and derived figures are then already what the write would store, since every change of the size table
        re-derives every row. Returns whether anything was written."""
        sim = self.sim
        g = node.gpus[index]
        running = []
        qbytes = qsecs = 0.0
        queued = extra_used = 0
        # The node's queued jobs reserved on this GPU, in queue order (sim.reserved_on mirrors node.queue per GPU,
        # so this is O(reservations on the GPU), not O(queue)).
        # +progress with interference-aware scoring: the learned factors of the classes beside the GPU's clients, as
        # the extender reads them from the agent's GPUNode status (ClusterCache._refresh); none learned on this GPU
        # model yet (the common case): nothing to look up
        book = sim.coloc.factors().get(g.model) if self.learning else None
        classes = [r.intensity for r in g.running] if book else None
        for job in sim.reserved_on.get((node.idx, index), {}).values():
            immediate = sim.reservations[job.id][1]
            prof = job.profile(g.model)
            queued += 1
            if immediate:
                at = sim.reserved_at.get(job.id, sim.now)
                running.append((at + prof.predicted_s, prof.admit_bytes, prof.sm_util, prof.mem_util))
                extra_used += prof.admit_bytes
                if classes is not None:
                    classes.append(prof.intensity)
            else:
                qbytes += prof.admit_bytes
                qsecs += prof.predicted_s
        for run in g.running:
            running.append(self._run_entry(run, g))
        cap_clients = sim.per_gpu_cap
        capacity, used, clients = g.total - g.reserve, g.committed + extra_used, len(g.running) + queued
        max_clients = cap_clients if cap_clients is not None else g.max_clients
        healthy = g.quarantine_until <= sim.now  # a faulted GPU is unhealthy in its GPUNode while it drains or is out
        learned = (1.0, 1.0, 1.0) if book is None or classes is None else self.pl.learned_factors(book, classes)
        inputs = (capacity, used, clients, max_clients, qbytes, qsecs, running, healthy, learned)
        if derive:
            if self.written[g.gid] == inputs:
                return False
            self.written[g.gid] = inputs
            self.pl.set_gpu_derived(
                self.state, index, node.idx, capacity=capacity, used=used, healthy=healthy, clients=clients,
                max_clients=max_clients, qbytes=qbytes, qsecs=qsecs, running=running, above=self.above,
                sens=self.sens, learned=learned,
            )
            return True
        self.written[g.gid] = inputs
        self.pl.set_gpu(
            self.state, index, node.idx, capacity=capacity, used=used, healthy=healthy, clients=clients,
            max_clients=max_clients, qbytes=qbytes, qsecs=qsecs, running=running, learned=learned,
        )
        return True

    def _sync(self) -> None:
        sim, pl = self.sim, self.pl
        if self.learning and sim.coloc.samples != self.samples_seen:
            self.samples_seen = sim.coloc.samples
            factors = sim.coloc.factors()
            if factors != self.factors_seen:  # a calibrated factor moved: every GPU's may have
                self.factors_seen = factors
                sim.changed_gpus.update((g.node.idx, g.index) for g in sim.gpus)
        for idx in sim.changed_nodes:
            self.refresh_host(sim.nodes[idx])
        sim.changed_nodes.clear()
        changed = sim.changed_gpus
        if sim.now - self.above_at >= self.SIZE_MIX_INTERVAL:
            # The admit bytes of every job running or queued at a gate, as the engine counts them (a multiset:
            # size_table's quantiles do not depend on the order, so this equals listing every job).
            counts = sim.size_counts
            sizes = np.repeat(np.fromiter(counts.keys(), dtype=np.float64, count=len(counts)),
                              np.fromiter(counts.values(), dtype=np.int64, count=len(counts)))
            above = pl.size_table(sizes)
            self.above_at = sim.now
            if not np.array_equal(above, self.above):
                self.above = above
                for idx, index in changed:
                    self.refresh_gpu(sim.nodes[idx], index)
                changed.clear()
                pl.derive(self.state, slice(0, self.rows), self.above, self.interference)  # F(free): every row
                self.epoch += 1
                return
            # The same table as before: every derived figure and cached fit cost stands; the changed GPUs are
            # refreshed below as between two refreshes of the mix.
        if len(changed) <= self.CELL_BY_CELL:
            # The common case: a few GPUs changed. A GPU's derived figures depend on its own raw figures alone, so
            # each is written and derived in one pass (what set_gpu for every changed GPU, then derive_cells on
            # them, stores).
            if changed:
                # a row whose GPUs were all rewritten with the figures they held keeps its version: the class
                # summaries cached for it (see _cheapest) still hold
                nodes = sim.nodes
                rows = {idx for idx, index in changed if self.refresh_gpu(nodes[idx], index, derive=True)}
                row_ver = self.row_ver
                for r in rows:
                    row_ver[r] += 1
                changed.clear()
            return
        for idx, index in changed:
            self.refresh_gpu(sim.nodes[idx], index)
        changed_rows = sorted({r for r, _ in changed})
        changed.clear()
        self.row_ver[changed_rows] += 1
        pl.derive(self.state, np.fromiter(changed_rows, dtype=np.int64, count=len(changed_rows)), self.above,
                  self.interference)

    #: (bytes, intensity) classes kept in fit_cache (the oldest is dropped beyond this).
    FIT_CACHE_CLASSES = 64

    def _run_entry(self, run: Any, g: Any) -> tuple:
        """A running job as the agent reports it to the extender: ``(predicted end, admit bytes, sm, mem)``."""
        sim = self.sim
        entry = run.placement_entry  # fixed for the run's life (its start, its profile): computed once
        if entry is None:
            prof = run.job.profile(g.model)
            start = sim.outcomes[run.job.id].start or 0.0
            entry = run.placement_entry = (start + run.startup_s + prof.predicted_s, prof.admit_bytes + run.held,
                                           prof.sm_util, prof.mem_util)
        report = sim.progress_of(run) if sim.rt is not None else None
        if report is not None and report.usable():
            # +progress: the agent publishes the seconds left its last report measures (gnnsched.progress), so
            # the GPUNode the extender reads moves with it (as often as the GPU's books change here)
            entry = (sim.now + progress_seconds_left(entry[0], sim.now, report), *entry[1:])
        return entry

    def _apart_blocked(self, job: SimJob, cands: np.ndarray) -> dict[tuple[int, int], float]:
        """The apart rule on the candidates, as ``ClusterCache._blocked`` applies it: ``(slot, candidate position)``
        of every GPU the job may not join now (``pl.apart_blocked``), with when its last peer is predicted to leave.
        A GPU's clients are its running jobs (their predicted end as the agent reports it) and the extender's
        reservations there (reserved at + predicted seconds), each with the peers its attempt is kept apart from
        (``sim.loop.apart``). Empty at once when nothing keeps this job apart (the simulator's common case)."""
        sim = self.sim
        apart = sim.loop.apart if sim.loop is not None else None
        domains = sim.job_domain if sim.domains_mixed else None  # the trust-domain rule (ClusterCache._blocked)
        if not apart and not domains:
            return {}
        apart = apart or {}
        me, mine = str(job.id), apart.get(job.id, frozenset())
        if not domains and not mine and not any(me in peers for peers in apart.values()):
            return {}
        pl = self.pl
        none: frozenset[str] = frozenset()
        domain = domains[job.id] if domains else None
        dom: Mapping[int, str | None] = domains or {}

        def gpus() -> Any:
            for col, row in enumerate(cands.tolist()):
                node = sim.nodes[row]
                for slot, g in enumerate(node.gpus):
                    occ = [pl.Occupant(str(r.job.id), apart.get(r.job.id, none), self._run_entry(r, g)[0],
                                       dom.get(r.job.id)) for r in g.running]
                    for jid, j in sim.reserved_on.get((node.idx, g.index), {}).items():
                        occ.append(pl.Occupant(str(jid), apart.get(jid, none),
                                               sim.reserved_at.get(jid, sim.now) + j.profile(g.model).predicted_s,
                                               dom.get(jid)))
                    if occ:
                        yield (slot, col), occ

        return pl.apart_blocked(me, mine, gpus(), domain)

    def _apart_passed(self, passed: np.ndarray, good: np.ndarray, blocked: dict[tuple[int, int], float],
                      cols: slice | np.ndarray) -> np.ndarray:
        """The extender's filter under the apart rule, as ``ClusterCache.filter`` applies it (``pl.apart_filter``):
        ``passed`` per candidate, ``good`` the GPUs that can ever hold the job, ``blocked`` from
        :meth:`_apart_blocked`."""
        clear_good = good.copy()
        slots, bcols = zip(*blocked, strict=True)
        clear_good[list(slots), list(bcols)] = False
        keep, _ = self.pl.apart_filter(passed, self.state["known"][cols] & np.logical_or.reduce(clear_good, axis=0))
        return keep

    def _cheapest(self, cands: np.ndarray, cols: slice | np.ndarray, demand: dict, out: Any) -> tuple | None:
        """kube-scheduler's pick among the candidates (single GPU model): ``(candidate position, GPU slot)``, ``()``
        when no candidate passes the extender's filter, None when the exact ranking is needed (a cost <= 0 or NaN).

        The same pick as ranking every candidate's exact cost (:meth:`_totals` of ``pl.normalise_scores`` of each
        row's cheapest GPU), with less work: a GPU's cost where the pod fits now does not depend on the clock or the
        pod's runtime, so per (bytes, intensity) class each row's cheapest fit-now GPU (``pl.fit_costs``: exact
        cost, first slot on ties) and the lowest lower bound of its waiting GPUs are kept until the row's derived
        figures change (``row_ver``) or the size table does (``epoch``). Exact columns (``pl.candidate_costs``) are
        computed only where a waiting GPU can matter: (1) with ``T`` the lowest fit-now cost, candidates whose bound
        is ``<= T`` (they may hold the lowest cost, which sets every score); (2) candidates whose bound, were it
        their cost, would raise their score enough for their total to reach the winner's; (3) the winner, when its
        bound does not exceed its fit-now cost (its cheapest GPU may be a waiting one). Every other candidate's score
        is that of its exact fit-now cost, and its total stays below the winner's."""
        pl, a, sim = self.pl, self.state, self.sim
        m = self.models[0]
        prof = demand[m]
        b = prof.admit_bytes
        ikey = pl.intensity_key(prof.intensity) if self.aware else None
        key = (b, ikey)
        e = self.fit_cache.get(key)
        if e is None:
            if len(self.fit_cache) >= self.FIT_CACHE_CLASSES:
                self.fit_cache.pop(next(iter(self.fit_cache)))
            e = self.fit_cache[key] = {"epoch": self.epoch, "ver": np.full(self.rows, -1, dtype=np.int64),
                                       "fit": np.full(self.rows, np.inf, dtype=a["free32"].dtype),
                                       "slot": np.zeros(self.rows, dtype=np.int64),
                                       "low": np.full(self.rows, np.nan, dtype=a["free32"].dtype),
                                       "pass": np.zeros(self.rows, dtype=bool)}
        if e["epoch"] != self.epoch:
            e["ver"].fill(-1)
            e["epoch"] = self.epoch
        ver = e["ver"]
        stale = (ver[cols] != self.row_ver[cols]).nonzero()[0]  # np.flatnonzero of a 1-D array, minus its wrappers
        if stale.size:
            # Kept per row with the extender's filter already applied (a["known"] is fixed once the view is built):
            # "pass" = known and a GPU that can ever hold the pod; "fit" = the cheapest fit-now cost where the row
            # passes, inf elsewhere; "low" = the waiting GPUs' lower bound where it passes, NaN elsewhere (so no
            # comparison selects a row that does not pass).
            rows = cands.take(stale)
            fit, slot, low, good = pl.fit_summary(a, rows, b, prof.intensity, self.above,
                                                  interference_aware=self.aware)
            if self.all_known:  # a row without a usable GPU has no fit-now cost: fit is inf there already
                passed_r = good
                e["fit"][rows] = fit
            else:
                passed_r = good & a["known"][rows]
                e["fit"][rows] = np.where(passed_r, fit, np.float32(np.inf))
            e["slot"][rows] = slot
            e["low"][rows] = np.where(passed_r, low, np.float32(np.nan))
            e["pass"][rows] = passed_r
            ver[rows] = self.row_ver[rows]
        best = e["fit"][cols]  # a copy (cols: a slice gives a view) is made below only where it is written
        first = int(best.argmin())  # the first minimum: its value is best.min() (NaN included), and the pick below
        t = best[first]  # the lowest fit-now cost among the passing candidates (the others hold inf)
        if t == np.inf and not e["pass"][cols].any():  # no candidate passes (their fit is inf then)
            return ()
        if t != t:
            return None
        low = e["low"][cols]
        runtime = prof.predicted_s if prof.predicted_s > 0 else 1.0
        exact: list[tuple[np.ndarray, np.ndarray]] = []  # (candidate positions, their exact cost columns)

        def tighten(pos: np.ndarray, limit: np.ndarray | float) -> np.ndarray:
            # A tighter bound before exact columns: a waiting GPU's cost is float32(slowdown + wait / R) (see
            # pl.candidate_costs), at least float32(low + pl.wait_bound / R) by monotonic rounding; keeps the
            # positions whose tighter bound is still <= limit.
            bound_t = low.take(pos).astype(np.float64) + pl.wait_bound(a, cands.take(pos), b, sim.now) / runtime
            return pos[bound_t.astype(np.float32) <= limit]

        def make_exact(pos: np.ndarray) -> np.ndarray:
            cost_x, _ = pl.candidate_costs(a, cands.take(pos), b, runtime, prof.intensity, sim.now, self.above,
                                           interference_aware=self.aware)
            exact.append((pos, cost_x))
            out_best = np.array(best)
            out_best[pos] = np.minimum.reduce(cost_x, axis=0)
            return out_best

        # Round 1: the lowest best cost, exactly (candidates whose waiting GPUs' bound is <= t may beat t).
        round1 = (low <= t).nonzero()[0]  # passing candidates only (NaN elsewhere)
        if round1.size:
            round1 = tighten(round1, t)
        if round1.size:
            best = make_exact(round1)
            lowest = best.min()
        else:
            lowest = t
        if not lowest > 0:
            return None
        if lowest == np.inf:  # every passing candidate scores 0: the CPU/memory plugins alone decide
            passing = e["pass"][cols].nonzero()[0]
            col = int(passing[int(np.argmax(sim.host_points(cands.take(passing), out)))])
        else:
            scores = pl.normalise_scores(best)
            total = self._totals(cands, scores, out)
            col = int(np.argmax(total))
            # Round 2: a candidate whose waiting GPUs were left at their lower bound could score more, at most what
            # the bound would score; only a candidate whose total could then reach the winner's needs exact costs.
            reach = low <= lowest * self.REACH
            if reach.any():
                bound = total - kube_scores.extender_points(scores, DEFAULT_WEIGHT)
                bound += kube_scores.extender_points(np.rint(10.0 * lowest / low), DEFAULT_WEIGHT)
                could = reach & (bound >= total[col]) & (bound > total)
                if round1.size:
                    could[round1] = False
                more = could.nonzero()[0]
                if more.size:
                    # With the tighter bound, the candidate must still reach a score s whose total meets the winner's
                    # (s >= 6: its host points are <= 200), which needs a cost <= 10 * lowest / (s - 0.5).
                    host = total.take(more) - kube_scores.extender_points(scores.take(more), DEFAULT_WEIGHT)
                    need = np.ceil((total[col] - host) / kube_scores.extender_points(1, DEFAULT_WEIGHT))
                    more = tighten(more, (10.0 * lowest / (need - 0.5) * 1.001).astype(np.float32))
                if more.size:
                    best = make_exact(more)
                    col = int(np.argmax(self._totals(cands, pl.normalise_scores(best), out)))
        for pos, cost_x in exact:
            at = int(np.searchsorted(pos, col))
            if at < pos.size and pos[at] == col:
                return col, int(np.argmin(cost_x[:, at]))
        if low[col] <= best[col]:  # a waiting GPU may be cheaper than (or tie) the fit-now one: the exact column
            make_exact(np.array([col]))
            return col, int(np.argmin(exact[-1][1][:, 0]))
        return col, int(e["slot"][int(cands[col])])

    def _costs(self, cands: np.ndarray, cols: slice | np.ndarray, demand: dict) -> tuple[np.ndarray, np.ndarray]:
        """Cost and fit mask ``(gpus, len(cands))`` of the candidate rows (``cols``: the same rows, as a slice when
        they are contiguous), each row with the demand of its own GPU model."""
        pl, a, sim = self.pl, self.state, self.sim

        def one(m: str, c: slice | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            prof = demand[m]
            return pl.candidate_costs(a, c, prof.admit_bytes, prof.predicted_s if prof.predicted_s > 0 else 1.0,
                                      prof.intensity, sim.now, self.above, interference_aware=self.aware)

        if len(self.models) == 1:
            return one(self.models[0], cols)
        # one GPU model per node; admit bytes depend on the model (device overheads). Rows of no model (no GPU)
        # cannot take the pod.
        cost = np.full((a["capu"].shape[0], cands.size), np.inf, dtype=a["free32"].dtype)
        good = np.zeros(cost.shape, dtype=bool)
        for m in self.models:
            sel = self.model_rows[m][cands]
            if sel.any():
                c, g = one(m, cands[sel])
                cost[:, sel] = c
                good[:, sel] = g
        return cost, good

    def place(self, job: SimJob, out: Any) -> Any:
        sim = self.sim
        demand = {m: job.profile(m) for m in self.models}
        if all(demand[m].admit_bytes > self.max_cap[m] for m in self.models):
            big = max(self.max_cap.values())
            out.reason = (f"PredictedPeakExceedsGPU: admit {min(p.admit_bytes for p in demand.values())} B; the "
                          f"largest GPU in the cluster has {big} B after reserve")
            return "never"
        if out.cpu_milli > sim.max_node_cpu or out.memory_bytes > sim.max_node_mem:
            out.reason = "requests exceed every node's CPU or memory"
            return "never"
        # kube-scheduler's own filter (NodeResourcesFit) and its numFeasibleNodesToFind cut, round-robin.
        cands = sim.host_candidates(out)
        if cands.size == 0:
            return None
        self._sync()
        a = self.state
        # The extender computes its cost matrix over every row and reads the candidates' columns; computing only the
        # candidates' columns gives the same numbers (pl.candidate_costs is cost_matrix element for element), and a
        # round-robin window that does not wrap is a slice (views instead of gathers).
        lo, hi = int(cands[0]), int(cands[-1])
        cols = slice(lo, hi + 1) if hi - lo == cands.size - 1 else cands
        blocked = self._apart_blocked(job, cands)
        got = self._cheapest(cands, cols, demand, out) if len(self.models) == 1 and not blocked else None
        if got is not None:
            if got == ():
                return None
            col, s = got
            node = sim.nodes[int(cands[col])]
            return self._reserve(job, demand, node, s)
        # every candidate's exact cost: kube-scheduler's sum ranks them all, not only the cheapest
        cost, good = self._costs(cands, cols, demand)
        # The extender's filter on the candidates kube-scheduler sends it (host resources already checked): as
        # pl.node_filter, on the candidates' rows.
        passed = a["known"][cols] & np.logical_or.reduce(good, axis=0)
        if blocked:
            passed = self._apart_passed(passed, good, blocked, cols)
        keep = np.flatnonzero(passed)
        if keep.size == 0:
            return None
        if blocked:
            runtime = np.array([demand[sim.nodes[int(r)].gpus[0].model].predicted_s if sim.nodes[int(r)].gpus
                                else 1.0 for r in cands.tolist()])
            runtime[runtime <= 0] = 1.0  # as _costs
            cost = self.pl.apart_ranked(*self.pl.apart_costs(cost[:, keep], {
                (slot, int(np.searchsorted(keep, c))): leave for (slot, c), leave in blocked.items()
                if passed[c]}, runtime[keep], sim.now))
            best = np.minimum.reduce(cost, axis=0)
            pick = int(np.argmax(self._totals(cands.take(keep), self.pl.normalise_scores(best), out)))
            node = sim.nodes[int(cands[int(keep[pick])])]
            return self._reserve(job, demand, node, int(np.argmin(cost[:, pick])))
        best = np.minimum.reduce(cost, axis=0).take(keep)  # as ClusterCache.score: per row, then the candidates
        col = int(keep[int(np.argmax(self._totals(cands.take(keep), self.pl.normalise_scores(best), out)))])
        node = sim.nodes[int(cands[col])]
        # as ClusterCache.reserve (pl.best_gpu on the node's row): the node's cheapest GPU, the first on ties
        s = int(np.argmin(cost[:, col]))
        return self._reserve(job, demand, node, s)

    def _totals(self, rows: np.ndarray, scores: np.ndarray, out: Any) -> np.ndarray:
        """kube-scheduler's total per node of ``rows`` (node rows it sent the extender, with the extender's 0..10
        ``scores``, 0 where its filter failed): the extender's score × weight × 10 plus the CPU/memory score plugins
        (:mod:`.kube_scores`). It binds the highest, one at random on ties (here the first). A node the filter failed
        totals at most 200 and loses to any node that scored 10 (500 or more)."""
        total = self.sim.host_points(rows, out)
        total += kube_scores.extender_points(scores, DEFAULT_WEIGHT)
        return total

    def _reserve(self, job: SimJob, demand: dict, node: Any, s: int) -> Any:
        """Bind's reservation of GPU slot ``s`` of ``node`` (``ClusterCache.reserve``)."""
        sim, a = self.sim, self.state
        gpu = node.gpus[s]
        need = demand[gpu.model].admit_bytes
        free = gpu.total - gpu.reserve - a["used"][s, node.idx]
        immediate = bool(free >= need and a["qbytes"][s, node.idx] == 0)
        sim.reservations[job.id] = (gpu.index, immediate)
        sim.reserved_at[job.id] = sim.now
        sim.reserved_on.setdefault((node.idx, gpu.index), {})[job.id] = job
        if immediate:
            sim.immediate_on.setdefault(node.idx, {})[job.id] = gpu.index
        sim.changed_gpus.add((node.idx, gpu.index))
        return node

