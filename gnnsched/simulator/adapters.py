"""The only place the simulator calls gnnsched's own decision functions.

What the simulator measures must be what runs in a cluster, so it never re-implements a decision:

======================  ===================================================  =====================================
simulator needs          core function                                        owner (branch)
======================  ===================================================  =====================================
peak memory, admit       ``gnnsched.estimator.estimate``                      estimator
solo runtime             ``gnnsched.runtime_prior.solo_runtime_seconds``      predictor
intensity class          ``gnnsched.runtime_prior.arithmetic_intensity``      predictor
right-sized requests     ``gnnsched.scaling.scale``                           predictor
co-location slowdown     ``gnnsched.interference``                            extender
node filter / score      ``gnnsched.placement`` (what the extender runs)     extender / placement
grouping, gate check     ``gnnsched.policies``                                nodeagent
======================  ===================================================  =====================================

Each is imported lazily; when one is not on this branch yet, the call raises :class:`IntegrationMissing` (a
``NotImplementedError``) naming the function and the branch, so a run fails loudly instead of silently simulating a
stand-in.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gnnsched.simulator.model import JobProfile, SimJob


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
        "interference": ("gnnsched.interference", "__name__", "extender"),
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
            model = _import("gnnsched.interference", "load_default", "extender")()
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
        from gnnsched.gpus import get_gpu_model

        gm = get_gpu_model(gpu_model)
        est = self._estimate(spec, gm)
        solo = _import("gnnsched.runtime_prior", "solo_runtime_seconds", "predictor")
        intensity_class = _import("gnnsched.runtime_prior", "intensity_class", "predictor")
        seconds = float(solo(spec, gm, cpu_cores))
        intensity = str(intensity_class(spec, gm))
        prof = self._interference().profile_for(intensity)
        out = JobProfile(
            admit_bytes=int(est.admit_bytes),
            peak_bytes=int(est.pmc_bytes) + int(est.device_overhead_bytes),
            solo_s=seconds,
            predicted_s=seconds,
            sm_util=float(prof.sm_util),
            mem_util=float(prof.mem_util),
            intensity=intensity,
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
        bytes, and the factor by which the job's solo runtime changes with the scaled CPU (the runtime prior's
        answer, which is the simulator's ground truth, not the predictor's)."""
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
        before = float(solo(spec, gpu_model, cpu_milli / 1000))
        after = float(solo(spec, gpu_model, cpu / 1000))
        return cpu, int(got.scaled.memory), (after / before if before > 0 else 1.0)

    def scaled_request(self, job: SimJob) -> tuple[int, int]:
        """The requests ``scale`` chose for ``job`` (computed once per workload, see ``runner.materialise``)."""
        if job.scaled_cpu_milli is None or job.scaled_memory_bytes is None:
            raise IntegrationMissing("gnnsched.scaling.scale", "predictor", f"job {job.name} was not scaled")
        return job.scaled_cpu_milli, job.scaled_memory_bytes

    # ------------------------------------------------------------------ co-location
    def slowdowns(self, sim: Any, gpu: Any, jobs: list[SimJob]) -> list[float]:
        """Slowdown (>= 1) of each of ``jobs`` running together on ``gpu``: ``gnnsched.interference``."""
        model = self._interference()
        profiles = [model.profile_for(j.profile(gpu.model).intensity) for j in jobs]
        return [model.slowdown(p, profiles[:i] + profiles[i + 1:]) for i, p in enumerate(profiles)]

    # ------------------------------------------------------------------ extender
    def place(self, sim: Any, job: SimJob, outcome: Any) -> Any:
        """Where the extender binds ``job``: a node, None (no node can take it now) or "never" (no node ever can).

        Plays kube-scheduler with the gnnsched extender: the scheduler's own NodeResourcesFit filter (CPU, memory)
        picks up to ``numFeasibleNodesToFind`` nodes round-robin; the extender's filter
        (:func:`gnnsched.placement.fit_mask` / ``node_filter``) keeps those with a GPU that can ever hold the admit
        bytes; its prioritize (:func:`~gnnsched.placement.cost_matrix`, ``best_gpu``, ``normalise_scores``) scores
        them 0..10 and the highest score wins (ties: the lower cost; kube-scheduler would pick among equal totals at
        random). Bind reserves the cheapest GPU of the node, as ``ClusterCache.reserve`` does: an *immediate*
        reservation when the bytes fit there now with no queue, a *queued* one otherwise, until the node agent
        reports the pod (here: its next admission pass). ``-interference`` policies score with slowdown 1.
        """
        view = sim.placement_view
        if view is None:
            view = sim.placement_view = PlacementView(sim, self._interference())
        return view.place(job, outcome)

    # ------------------------------------------------------------------ node agent
    def next_group(self, sim: Any, node: Any) -> list[tuple[SimJob, Any]]:
        """The node agent's decision: ``gnnsched.policies.plan_admissions`` over the node's queue and GPUs."""
        pol = self._policies()
        cap = sim.per_gpu_cap
        tasks = []
        by_key = {}
        for seq, job in enumerate(node.queue):
            prof = job.profile(node.gpus[0].model)
            key = str(job.id)
            by_key[key] = job
            tasks.append(pol.Task(key=key, bytes=prof.admit_bytes, seq=seq, qt_seconds=prof.predicted_s,
                                  intensity=prof.intensity))
        gpus = [
            pol.GPUFree(index=g.index, free_bytes=g.free_admit_bytes,
                        free_slots=(cap if cap is not None else g.max_clients) - len(g.running),
                        capacity_bytes=g.total - g.reserve)
            for g in node.gpus
        ]
        if sim.policy.paper:  # the published SQTF/BQT baseline: next group only on an idle GPU, no memory bound
            busy = [g.index for g in node.gpus if g.running]
            plan = pol.plan_admissions_paper(sim.base, tasks, gpus, busy)
        else:
            plan = pol.plan_admissions(sim.base, tasks, gpus)
        return [(by_key[t.key], node.gpus[a.gpu_index]) for a in plan for t in a.tasks]

    def check_gate(self, sim: Any, gpu: Any) -> None:
        """``gnnsched.policies.check_gate_invariant`` on ``gpu``'s books; raises ``GateInvariantError``. The
        ``-paper`` baselines have no gate (their groups may exceed the GPU by design), so nothing is checked."""
        if sim.policy.paper:
            return
        pol = self._policies()
        cap = sim.per_gpu_cap
        books = pol.GPUBooks(
            index=gpu.index, total_bytes=gpu.total, reserve_bytes=gpu.reserve,
            committed=tuple(r.job.profile(gpu.model).admit_bytes for r in gpu.running),
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

    def __init__(self, sim: Any, interference: Any) -> None:
        from gnnsched import placement as pl

        self.pl = pl
        self.sim = sim
        self.interference = interference
        self.aware = bool(sim.policy.interference)
        self.rows = len(sim.nodes)
        self.state = pl.new_state(self.rows, max(len(n.gpus) for n in sim.nodes))
        self.above = pl.size_table(())
        self.above_at = -float("inf")
        self.models = sorted({g.model for g in sim.gpus})
        self.model_rows = {m: np.array([bool(n.gpus) and n.gpus[0].model == m for n in sim.nodes]) for m in self.models}
        self.max_cap = {m: max(g.total - g.reserve for g in sim.gpus if g.model == m) for m in self.models}
        for node in sim.nodes:
            self.refresh(node)
        sim.changed_nodes.clear()
        sim.changed_gpus.clear()
        self.pl.derive(self.state, slice(0, self.rows), self.above, interference)

    def refresh(self, node: Any) -> None:
        """Re-write ``node``'s row from the simulator's books (``ClusterCache._refresh``'s inputs)."""
        self.pl.clear_row(self.state, node.idx, bool(node.gpus))
        self.refresh_host(node)
        for g in node.gpus:
            self.refresh_gpu(node, g.index)

    def refresh_host(self, node: Any) -> None:
        self.pl.set_host(self.state, node.idx, float(node.cpu_free), float(node.mem_free))

    def refresh_gpu(self, node: Any, index: int) -> None:
        """Re-write one GPU of ``node``: committed bytes, running jobs, and the reservations on it."""
        sim = self.sim
        g = node.gpus[index]
        running = []
        qbytes = qsecs = 0.0
        queued = extra_used = 0
        for job in node.queue:
            slot, immediate = sim.reservations.get(job.id, (0, False))
            if slot != index:
                continue
            prof = job.profile(g.model)
            queued += 1
            if immediate:
                at = sim.reserved_at.get(job.id, sim.now)
                running.append((at + prof.predicted_s, prof.admit_bytes, prof.sm_util, prof.mem_util))
                extra_used += prof.admit_bytes
            else:
                qbytes += prof.admit_bytes
                qsecs += prof.predicted_s
        for run in g.running:
            prof = run.job.profile(g.model)
            start = sim.outcomes[run.job.id].start or 0.0
            running.append((start + sim.startup_s + prof.predicted_s, prof.admit_bytes, prof.sm_util, prof.mem_util))
        cap_clients = sim.per_gpu_cap
        self.pl.set_gpu(
            self.state, index, node.idx, capacity=g.total - g.reserve, used=g.committed + extra_used, healthy=True,
            clients=len(g.running) + queued, max_clients=cap_clients if cap_clients is not None else g.max_clients,
            qbytes=qbytes, qsecs=qsecs, running=running,
        )

    def _sync(self) -> None:
        sim, pl = self.sim, self.pl
        for idx in sim.changed_nodes:
            self.refresh_host(sim.nodes[idx])
        sim.changed_nodes.clear()
        rows = set()
        for idx, index in sim.changed_gpus:
            self.refresh_gpu(sim.nodes[idx], index)
            rows.add(idx)
        sim.changed_gpus.clear()
        if sim.now - self.above_at >= self.SIZE_MIX_INTERVAL:
            sizes = [r.job.profile(g.model).admit_bytes for g in sim.gpus for r in g.running]
            sizes += [j.profile(n.gpus[0].model).admit_bytes for n in sim.gpu_nodes for j in n.queue]
            self.above = pl.size_table(sizes)
            self.above_at = sim.now
            pl.derive(self.state, slice(0, self.rows), self.above, self.interference)  # F(free): every row
            return
        for idx in rows:
            pl.derive(self.state, slice(idx, idx + 1), self.above, self.interference)

    def place(self, job: SimJob, out: Any) -> Any:
        pl, sim = self.pl, self.sim
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
        cost = good = None
        for m in self.models:  # one GPU model per node; admit bytes depend on the model (device overheads)
            prof = demand[m]
            g = pl.fit_mask(a, prof.admit_bytes)
            c = pl.cost_matrix(a, prof.admit_bytes, prof.predicted_s if prof.predicted_s > 0 else 1.0,
                               prof.intensity, sim.now, self.above, interference_aware=self.aware)
            if cost is None:
                cost, good = c, g
            else:
                rows = self.model_rows[m][None, :]
                cost, good = np.where(rows, c, cost), np.where(rows, g, good)
        # The extender's filter on the candidates kube-scheduler sends it (host resources already checked).
        passed = pl.node_filter(a, good, None, None)
        cands = cands[passed[cands]]
        if cands.size == 0:
            return None
        best = np.minimum.reduce(cost, axis=0)[cands]  # as ClusterCache.score: every row, then the candidates
        scores = pl.normalise_scores(best)
        pick = int(np.lexsort((best, -scores))[0])
        node = sim.nodes[int(cands[pick])]
        slot, _ = pl.best_gpu(cost, cands[pick:pick + 1])  # as ClusterCache.reserve: the node's cheapest GPU
        s = int(slot[0])
        gpu = node.gpus[s]
        need = demand[gpu.model].admit_bytes
        free = gpu.total - gpu.reserve - a["used"][s, node.idx]
        sim.reservations[job.id] = (gpu.index, bool(free >= need and a["qbytes"][s, node.idx] == 0))
        sim.reserved_at[job.id] = sim.now
        sim.changed_gpus.add((node.idx, gpu.index))
        return node

